/*
 * poller.h on poll(2), with a self-pipe for wakes: the portable fallback, and
 * a second backend for Linux CI to run the contract against.
 *
 * poll has no kernel-side set, so the watches live here, in an array under
 * a mutex: fd, interest, udata, and a sequence number that every watch
 * renews. wait copies the array into its own pollfd array (slot 0: the
 * pipe), polls without the lock, then under the lock reports and removes
 * each entry whose sequence number is still the one it polled. Removal is
 * what makes a watch one-shot; an entry unwatched or re-watched while poll
 * ran is left alone (poll is level-triggered: a re-watched fd that is still
 * ready shows up in the next poll).
 *
 * Invariants (under the lock): an fd appears at most once in the array;
 * `polling` is true while the waiter is inside poll() with a copy, and
 * `nudged` while a byte is on its way to that poll. A watch or unwatch made
 * while polling writes that byte (once per poll), and the waiter, finding the
 * pipe readable but no wake pending, polls again with the new set instead of
 * returning. A nudge that lands after the poll only costs the next wait one
 * more look.
 *
 * The pipe also carries wakes, under the wake flag of poller.h. The waiter
 * drains the pipe before it takes the flag.
 *
 * A poll in progress holds a reference on each file it polls: an fd
 * unwatched and then closed while a wait polls it stays open in the kernel
 * until the waiter, nudged, polls again (its other end sees the close a
 * moment late). epoll and kqueue hold no such reference.
 *
 * Costs: watch and unwatch search the array, a wait copies it: O(watches).
 * Fine for a fallback; not for 100,000 parked sockets.
 */
#include "poller.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "atomics.h"

struct entry {
    int fd;
    unsigned events; /* ATAP__POLL_READ / _WRITE */
    void *udata;
    uint64_t seq;
};

struct atap_poller {
    pthread_mutex_t lock;
    struct entry *ents;       /* armed watches (lock) */
    size_t n, cap;            /* (lock) */
    uint64_t seq;             /* the last sequence number handed out (lock) */
    bool polling;             /* the waiter is in poll() (lock) */
    bool nudged;              /* a byte is on its way to that poll (lock) */
    int rfd, wfd;             /* the self-pipe, both ends non-blocking */
    _Atomic uint32_t pending; /* a wake is pending (poller.h) */
    struct pollfd *pfds;      /* the waiter's copy; [0] is the pipe */
    uint64_t *seqs;           /* the sequence number each pfds[i] was copied with */
    size_t pcap;
};

/* One byte into the pipe. EAGAIN: the pipe is full, so it is readable. */
static int poke(int fd)
{
    const char c = 0;
    ssize_t r;

    do {
        r = write(fd, &c, 1);
    } while (r < 0 && errno == EINTR);
    return r < 0 && errno != EAGAIN ? -errno : 0;
}

static void drain(int fd)
{
    char buf[64];
    ssize_t r;

    do {
        r = read(fd, buf, sizeof buf);
    } while (r > 0 || (r < 0 && errno == EINTR));
}

static void nudge_locked(struct atap_poller *p)
{
    if (p->polling && !p->nudged) {
        p->nudged = true;
        (void)poke(p->wfd);
    }
}

static long find_fd(const struct atap_poller *p, int fd)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->ents[i].fd == fd)
            return (long)i;
    return -1;
}

static long find_seq(const struct atap_poller *p, uint64_t seq)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->ents[i].seq == seq)
            return (long)i;
    return -1;
}

static void remove_at(struct atap_poller *p, size_t i) { p->ents[i] = p->ents[--p->n]; }

/* Room for one more entry. */
static int grow_locked(struct atap_poller *p)
{
    size_t cap = p->cap ? p->cap * 2 : 16;
    struct entry *e;

    if (p->n < p->cap)
        return 0;
    if (cap > SIZE_MAX / sizeof *e)
        return -ENOMEM;
    e = realloc(p->ents, cap * sizeof *e);
    if (e == NULL)
        return -ENOMEM;
    p->ents = e;
    p->cap = cap;
    return 0;
}

/* Room for n pollfds in the waiter's copy. */
static int reserve(struct atap_poller *p, size_t n)
{
    struct pollfd *pf;
    uint64_t *sq;

    if (n <= p->pcap)
        return 0;
    if (n > SIZE_MAX / sizeof *pf || n > SIZE_MAX / sizeof *sq)
        return -ENOMEM;
    pf = realloc(p->pfds, n * sizeof *pf);
    if (pf == NULL)
        return -ENOMEM;
    p->pfds = pf;
    sq = realloc(p->seqs, n * sizeof *sq);
    if (sq == NULL)
        return -ENOMEM;
    p->seqs = sq;
    p->pcap = n;
    return 0;
}

/* Copies the watches into the waiter's pollfd array. The count, or -ENOMEM. */
static long snapshot(struct atap_poller *p)
{
    long n;

    pthread_mutex_lock(&p->lock);
    if (reserve(p, p->n + 1) < 0) {
        pthread_mutex_unlock(&p->lock);
        return -ENOMEM;
    }
    p->pfds[0] = (struct pollfd){.fd = p->rfd, .events = POLLIN};
    for (size_t i = 0; i < p->n; i++) {
        p->pfds[i + 1] =
            (struct pollfd){.fd = p->ents[i].fd, .events = atap__poll_interest(p->ents[i].events)};
        p->seqs[i + 1] = p->ents[i].seq;
    }
    p->polling = true;
    p->nudged = false;
    n = (long)p->n + 1;
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* After poll: reports (and disarms) up to max entries that were ready and are
 * still armed as polled. nfds 0: poll failed, only the flags are reset. */
static int collect(struct atap_poller *p, long nfds, struct atap_poller_event *events, int max)
{
    int out = 0;
    long j;

    pthread_mutex_lock(&p->lock);
    p->polling = false;
    p->nudged = false;
    for (long i = 1; i < nfds && out < max; i++) {
        if (p->pfds[i].revents == 0 || (j = find_seq(p, p->seqs[i])) < 0)
            continue;
        events[out++] = (struct atap_poller_event){.udata = p->ents[j].udata,
                                                   .events = atap__poll_report(p->pfds[i].revents),
                                                   .kind = ATAP__WATCH_FD};
        remove_at(p, (size_t)j);
    }
    pthread_mutex_unlock(&p->lock);
    return out;
}

static int once(struct atap_poller *p, struct atap_poller_event *events, int max, uint64_t ns,
                bool *woke)
{
    /* ns is at most ATAP__POLLER_SLICE_NS here: the ms fit an int. */
    int ms = ns == ATAP__FOREVER ? -1 : (int)((ns + 999999u) / 1000000u);
    long nfds = snapshot(p);
    int rc, err, n;

    if (nfds < 0)
        return (int)nfds;
    rc = poll(p->pfds, (nfds_t)nfds, ms);
    err = errno;
    if (rc > 0 && p->pfds[0].revents != 0) {
        drain(p->rfd);
        *woke = atap__poller_wake_take(&p->pending);
    }
    n = collect(p, rc > 0 ? nfds : 0, events, max);
    return rc < 0 ? -err : n;
}

static int open_pipe(struct atap_poller *p)
{
    int fds[2];

#if defined(__APPLE__) /* no pipe2 */
    if (pipe(fds) < 0)
        return -errno;
    p->rfd = fds[0];
    p->wfd = fds[1];
    for (int i = 0; i < 2; i++)
        if (fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0 ||
            fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK) < 0)
            return -errno;
#else
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0)
        return -errno;
    p->rfd = fds[0];
    p->wfd = fds[1];
#endif
    return 0;
}

int atap__poller_open(struct atap_poller **out)
{
    struct atap_poller *p;
    int rc;

    if (out == NULL)
        return -EINVAL;
    *out = NULL;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return -ENOMEM;
    rc = -pthread_mutex_init(&p->lock, NULL);
    if (rc < 0) {
        free(p);
        return rc;
    }
    p->rfd = p->wfd = -1;
    atomic_init(&p->pending, 0u);
    rc = open_pipe(p);
    if (rc < 0) {
        atap__poller_close(p);
        return rc;
    }
    *out = p;
    return 0;
}

void atap__poller_close(struct atap_poller *p)
{
    if (p == NULL)
        return;
    if (p->rfd >= 0)
        close(p->rfd);
    if (p->wfd >= 0)
        close(p->wfd);
    pthread_mutex_destroy(&p->lock);
    free(p->ents);
    free(p->pfds);
    free(p->seqs);
    free(p);
}

static int check_fd(const struct atap_poller *p, int fd)
{
    if (p == NULL)
        return -EINVAL;
    if (fd < 0)
        return -EBADF;
    if (fd == p->rfd || fd == p->wfd)
        return -EINVAL;
    return 0;
}

int atap__poller_watch(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    int rc = check_fd(p, fd);
    long i;

    if (rc < 0)
        return rc;
    if (events == 0 || (events & ~(ATAP__POLL_READ | ATAP__POLL_WRITE)))
        return -EINVAL;
    /* poll would only say POLLNVAL later: refuse a closed fd now. */
    if (fcntl(fd, F_GETFD) < 0)
        return -errno;
    pthread_mutex_lock(&p->lock);
    i = find_fd(p, fd);
    if (i < 0 && (rc = grow_locked(p)) == 0) {
        i = (long)p->n++;
        p->ents[i].fd = fd;
    }
    if (rc == 0) {
        p->ents[i].events = events;
        p->ents[i].udata = udata;
        p->ents[i].seq = ++p->seq;
        nudge_locked(p);
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* poll(2) has no edge: the caller keeps one-shot watches here (poller.h). */
int atap__poller_watch_kept(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    int rc = check_fd(p, fd);

    (void)events, (void)udata;
    return rc < 0 ? rc : -ENOTSUP;
}

int atap__poller_unwatch(struct atap_poller *p, int fd)
{
    int rc = check_fd(p, fd);
    long i;

    if (rc < 0)
        return rc;
    pthread_mutex_lock(&p->lock);
    i = find_fd(p, fd);
    if (i >= 0) {
        remove_at(p, (size_t)i);
        nudge_locked(p);
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}

int atap__poller_wait(struct atap_poller *p, struct atap_poller_event *events, int max,
                      uint64_t timeout_ns)
{
    return atap__poller_loop(p, events, max, timeout_ns, once);
}

int atap__poller_wake(struct atap_poller *p)
{
    int saved = errno, rc;

    if (p == NULL)
        return -EINVAL;
    if (!atap__poller_wake_claim(&p->pending))
        return 0;
    rc = poke(p->wfd);
    if (rc < 0)
        st_release(&p->pending, 0u);
    errno = saved;
    return rc;
}

const char *atap__poller_name(void) { return "poll"; }

/* No path watches here (on Linux park.c watches paths with inotify). */
int atap__poller_watch_path(struct atap_poller *p, int fd, void *udata)
{
    (void)p, (void)fd, (void)udata;
    return -ENOTSUP;
}

int atap__poller_unwatch_path(struct atap_poller *p, int fd)
{
    (void)p, (void)fd;
    return -ENOTSUP;
}

unsigned atap__poller_kinds(void) { return 1u << ATAP__WATCH_FD; }

int atap__poller_fds(struct atap_poller *p, int *fds, int max)
{
    int n = 0;

    if (p == NULL || fds == NULL || max < 0)
        return -EINVAL;
    if (n < max)
        fds[n++] = p->rfd;
    if (n < max)
        fds[n++] = p->wfd;
    return n;
}

/*
 * poller.h on Linux: epoll, and an eventfd for wakes.
 *
 * A watch is an EPOLLONESHOT entry whose data.ptr is the caller's udata. The
 * kernel disarms an entry as it reports it (the entry stays in the set with
 * an empty mask, HUP and ERR included, until it is watched again or
 * unwatched), so a hung-up fd is reported once. Re-arming one that fired is
 * EPOLL_CTL_MOD, falling back to ADD for an fd not in the set yet. A READ
 * watch asks for EPOLLRDHUP too: the peer's half-close is HUP (poller.h).
 *
 * The eventfd is a level-triggered entry tagged with the address of
 * wake_tag, which no caller can hold, so it never collides with a udata.
 * The waiter reads it to zero, then takes the wake flag (poller.h).
 *
 * Timeouts: epoll_pwait2 (Linux 5.11) takes a timespec. Without it (old
 * glibc and no syscall number, ENOSYS from an old kernel, EPERM from a
 * seccomp filter that does not know it), epoll_wait takes whole milliseconds,
 * rounded up. -DATAP_NO_EPOLL_PWAIT2 forces the fallback (to test it).
 */
#include "poller.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"

#if defined(ATAP_NO_EPOLL_PWAIT2)
#define PWAIT2 0
#elif defined(__GLIBC__)
#if __GLIBC_PREREQ(2, 35)
#define PWAIT2 1 /* glibc's wrapper */
#endif
#endif
#if !defined(PWAIT2) && defined(SYS_epoll_pwait2) && UINTPTR_MAX > 0xffffffffu
#define PWAIT2 2 /* raw syscall: on 64-bit, struct timespec is the kernel's */
#endif
#ifndef PWAIT2
#define PWAIT2 0
#endif

struct atap_poller {
    int epfd;
    int efd;                                    /* eventfd: wakes */
    _Atomic uint32_t pending;                   /* a wake is pending (poller.h) */
    struct epoll_event buf[ATAP__POLLER_BATCH]; /* the waiter's */
};

static char wake_tag;
static _Atomic int no_pwait2; /* epoll_pwait2 said ENOSYS/EPERM once */

static int pwait2(struct atap_poller *p, int max, const struct timespec *ts)
{
#if PWAIT2 == 1
    return epoll_pwait2(p->epfd, p->buf, max, ts, NULL);
#elif PWAIT2 == 2
    return (int)syscall(SYS_epoll_pwait2, p->epfd, p->buf, max, ts, NULL, 0);
#else
    (void)p;
    (void)max;
    (void)ts;
    errno = ENOSYS;
    return -1;
#endif
}

/* One epoll wait of at most ns (FOREVER: none). Events in p->buf. */
static int kernel_wait(struct atap_poller *p, int max, uint64_t ns)
{
    struct timespec ts, *tsp = NULL;
    int n, ms = -1;

    if (ns != ATAP__FOREVER) {
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        tsp = &ts;
    }
    if (!ld_relaxed(&no_pwait2)) {
        n = pwait2(p, max, tsp);
        if (n >= 0)
            return n;
        if (errno != ENOSYS && errno != EPERM)
            return -errno;
        st_relaxed(&no_pwait2, 1);
    }
    /* ns is at most ATAP__POLLER_SLICE_NS here: the ms fit an int. */
    if (ns != ATAP__FOREVER)
        ms = (int)((ns + 999999u) / 1000000u);
    n = epoll_wait(p->epfd, p->buf, max, ms);
    return n < 0 ? -errno : n;
}

static unsigned from_epoll(uint32_t e)
{
    unsigned r = 0;

    if (e & EPOLLIN)
        r |= ATAP__POLL_READ;
    if (e & EPOLLOUT)
        r |= ATAP__POLL_WRITE;
    if (e & (EPOLLHUP | EPOLLRDHUP))
        r |= ATAP__POLL_HUP;
    if (e & EPOLLERR)
        r |= ATAP__POLL_ERR;
    return r;
}

static void drain(int fd)
{
    uint64_t v;

    /* EAGAIN: already zero. */
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {
    }
}

static int once(struct atap_poller *p, struct atap_poller_event *events, int max, uint64_t ns,
                bool *woke)
{
    int n = kernel_wait(p, max, ns), out = 0;

    for (int i = 0; i < n; i++) {
        const struct epoll_event *e = &p->buf[i];

        if (e->data.ptr == &wake_tag) {
            drain(p->efd);
            *woke = atap__poller_wake_take(&p->pending);
            continue;
        }
        events[out++] = (struct atap_poller_event){
            .udata = e->data.ptr, .events = from_epoll(e->events), .kind = ATAP__WATCH_FD};
    }
    return n < 0 ? n : out;
}

static int open_fds(struct atap_poller *p)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &wake_tag};

    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0)
        return -errno;
    p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->efd < 0)
        return -errno;
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->efd, &ev) < 0)
        return -errno;
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
    p->epfd = p->efd = -1;
    atomic_init(&p->pending, 0u);
    rc = open_fds(p);
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
    if (p->efd >= 0)
        close(p->efd);
    if (p->epfd >= 0)
        close(p->epfd);
    free(p);
}

/* Argument checks shared by watch and unwatch. */
static int check_fd(const struct atap_poller *p, int fd)
{
    if (p == NULL)
        return -EINVAL;
    if (fd < 0)
        return -EBADF;
    if (fd == p->epfd || fd == p->efd)
        return -EINVAL;
    return 0;
}

/* One watch of fd for events, EPOLLONESHOT or EPOLLET (kept). */
static int arm(struct atap_poller *p, int fd, unsigned events, void *udata, uint32_t mode)
{
    struct epoll_event ev = {.events = mode, .data.ptr = udata};
    int rc = check_fd(p, fd);

    if (rc < 0)
        return rc;
    if (events == 0 || (events & ~(ATAP__POLL_READ | ATAP__POLL_WRITE)))
        return -EINVAL;
    if (events & ATAP__POLL_READ)
        ev.events |= EPOLLIN | EPOLLRDHUP; /* the peer's half-close: HUP */
    if (events & ATAP__POLL_WRITE)
        ev.events |= EPOLLOUT;
    /* Re-arming a watch that fired is the common case: MOD first. A MOD
     * looks at the fd afresh, so a kept watch re-armed reports what is
     * ready now (the contract's "arming reports once what is ready"). */
    if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev) == 0)
        return 0;
    if (errno != ENOENT)
        return -errno;
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) == 0)
        return 0;
    /* Another thread added fd in between: replace its watch. */
    if (errno == EEXIST && epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev) == 0)
        return 0;
    return -errno;
}

int atap__poller_watch(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    return arm(p, fd, events, udata, EPOLLONESHOT);
}

int atap__poller_watch_kept(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    return arm(p, fd, events, udata, EPOLLET);
}

int atap__poller_unwatch(struct atap_poller *p, int fd)
{
    struct epoll_event ev = {0}; /* kernels before 2.6.9 want one even for DEL */
    int rc = check_fd(p, fd);

    if (rc < 0)
        return rc;
    if (epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, &ev) == 0 || errno == ENOENT)
        return 0;
    return -errno;
}

int atap__poller_wait(struct atap_poller *p, struct atap_poller_event *events, int max,
                      uint64_t timeout_ns)
{
    return atap__poller_loop(p, events, max, timeout_ns, once);
}

int atap__poller_wake(struct atap_poller *p)
{
    const uint64_t one = 1;
    int saved = errno, rc = 0;
    ssize_t r;

    if (p == NULL)
        return -EINVAL;
    if (!atap__poller_wake_claim(&p->pending))
        return 0;
    do {
        r = write(p->efd, &one, sizeof one);
    } while (r < 0 && errno == EINTR);
    /* EAGAIN: the counter is full, so the eventfd is readable anyway. */
    if (r < 0 && errno != EAGAIN) {
        rc = -errno;
        st_release(&p->pending, 0u);
    }
    errno = saved;
    return rc;
}

const char *atap__poller_name(void) { return "epoll"; }

/* Paths are watched with inotify by park.c on Linux: an ordinary fd watch. */
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
        fds[n++] = p->epfd;
    if (n < max)
        fds[n++] = p->efd;
    return n;
}

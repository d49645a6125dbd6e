/*
 * poller.h on macOS and FreeBSD: kqueue, and an EVFILT_USER event for wakes.
 *
 * A watch is one EV_ONESHOT knote per direction (EVFILT_READ, EVFILT_WRITE)
 * carrying the caller's udata. The kernel deletes a one-shot knote as it
 * reports it, so a hung-up fd (EV_EOF) is reported once per arming. watch()
 * sends every change in one kevent() call: EV_DELETE for both directions,
 * then EV_ADD for each direction asked, so a re-watch replaces the interest
 * and the udata with fresh knotes. (EV_ADD on a knote that exists would
 * update it on macOS and FreeBSD, but libkqueue on Linux refuses such a
 * change to a socket's read knote without saying so, leaving the old udata
 * in place.) Every change carries EV_RECEIPT, so each gets its own result
 * in the event list, in the order of the changes, and none is cut short by
 * another's error; a delete that finds nothing (ENOENT: never armed, or
 * already fired) is no error. Results are matched to changes by position,
 * since FreeBSD overwrites a receipt's flags with EV_ERROR alone. As
 * poller.h says, with READ|WRITE the direction that did not fire stays
 * armed.
 *
 * The two directions are two knotes, so the kernel reports them as two
 * events; epoll and poll report one fd's readiness as one. once() merges
 * the READ and WRITE events of one fd that a kernel wait returns together
 * into one event, so a caller asking for both hears of both, as on the
 * other backends. Only what one kevent() call returned is merged: a pair
 * split by the caller's `max` comes as two events, the second one in the
 * next wait, and a watch made while another thread waits may wake that
 * wait between its two filters (park_fd.c looks for the other direction
 * itself then).
 *
 * Path changes: one EVFILT_VNODE knote on the open file itself, EV_DISPATCH
 * and EV_CLEAR, asking for every change this contract reports (the caller
 * picks what it wanted out of the bits). Its ident is the fd, like the
 * READ / WRITE knotes', but a filter of its own, so the two watches on one
 * fd are independent. EV_DISPATCH makes it one-shot as poller.h asks: the
 * kernel disables the knote as it reports it, and the next watch enables it
 * again (EV_ADD | EV_ENABLE); unwatch deletes it. Not EV_ONESHOT: libkqueue
 * on Linux turns that into an inotify IN_ONESHOT watch that any close of
 * the file spends without reporting anything, leaving the watch deaf.
 *
 * Wakes: one EVFILT_USER knote (ident 0, EV_CLEAR) added at open. wake()
 * triggers it (NOTE_TRIGGER); retrieving it resets it (EV_CLEAR), which is
 * the drain before the waiter takes the wake flag (poller.h). User-event
 * idents are a namespace of their own, so ident 0 collides with no fd.
 *
 * Timeouts: kevent takes a timespec, so nanoseconds pass through unrounded;
 * the kernel rounds up to its own clock (FreeBSD's sbintime, XNU's
 * absolute-time deadline plus leeway), never down. Timers are the manager's
 * (timer.c): no EVFILT_TIMER here, so no NOTE_NSECONDS either.
 *
 * Close-on-exec: kqueuex(KQUEUE_CLOEXEC) on FreeBSD 14+, kqueue1(O_CLOEXEC)
 * on NetBSD, else kqueue() then FD_CLOEXEC. The gap before the fcntl leaks
 * nothing into a child's exec: a kqueue is not inherited across fork().
 */
#include "poller.h"

#include <sys/types.h> /* before sys/event.h, for older BSDs */

#include <sys/event.h>
#include <sys/time.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"

#define WAKE_IDENT 0
/* A revoke (revoke(2), a terminal hung up) is a file gone; a kqueue without
 * revoke (libkqueue on Linux) simply never reports one. */
#if defined(NOTE_REVOKE)
#define NOTE_GONE (NOTE_DELETE | NOTE_RENAME | NOTE_REVOKE)
#else
#define NOTE_GONE (NOTE_DELETE | NOTE_RENAME)
#endif
#define VNODE_NOTES (NOTE_WRITE | NOTE_EXTEND | NOTE_ATTRIB | NOTE_LINK | NOTE_GONE)

struct atap_poller {
    int kq;
    _Atomic uint32_t pending;              /* a wake is pending (poller.h) */
    struct kevent buf[ATAP__POLLER_BATCH]; /* the waiter's */
};

static const struct timespec zero_ts = {0, 0};

static int open_kq(void)
{
    int kq;

#if defined(KQUEUE_CLOEXEC)
    kq = kqueuex(KQUEUE_CLOEXEC);
#elif defined(__NetBSD__)
    kq = kqueue1(O_CLOEXEC);
#else
    kq = kqueue();
    if (kq >= 0 && fcntl(kq, F_SETFD, FD_CLOEXEC) < 0) {
        int err = errno;

        close(kq);
        errno = err;
        return -1;
    }
#endif
    return kq;
}

/* kevent() with a changelist and no wait; EINTR retried (the man page: all
 * changes were applied, and applying them again changes nothing). */
static int apply(struct atap_poller *p, const struct kevent *ch, int nch, struct kevent *res,
                 int nres)
{
    int n;

    do {
        n = kevent(p->kq, ch, nch, res, nres, &zero_ts);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

/* Deletes both filters, then adds those for `events`, EV_ONESHOT or
 * EV_CLEAR (kept: an added filter looks at the fd afresh, so a kept watch
 * armed again reports what is ready now). 0 or -errno. */
static int arm(struct atap_poller *p, int fd, unsigned events, void *udata, unsigned short mode)
{
    const unsigned short add = EV_ADD | mode | EV_RECEIPT, del = EV_DELETE | EV_RECEIPT;
    struct kevent ch[4], res[4];
    int nch = 0, n, rc = 0;

    EV_SET(&ch[nch++], (uintptr_t)fd, EVFILT_READ, del, 0, 0, NULL);
    EV_SET(&ch[nch++], (uintptr_t)fd, EVFILT_WRITE, del, 0, 0, NULL);
    if (events & ATAP__POLL_READ)
        EV_SET(&ch[nch++], (uintptr_t)fd, EVFILT_READ, add, 0, 0, udata);
    if (events & ATAP__POLL_WRITE)
        EV_SET(&ch[nch++], (uintptr_t)fd, EVFILT_WRITE, add, 0, 0, udata);
    n = apply(p, ch, nch, res, nch);
    if (n < 0)
        return n;
    for (int i = 0; i < n && i < nch; i++) {
        if (!(res[i].flags & EV_ERROR) || res[i].data == 0)
            continue;
        if ((ch[i].flags & EV_DELETE) && res[i].data == ENOENT)
            continue; /* nothing to delete */
        if (rc == 0)
            rc = -(int)res[i].data;
    }
    return rc;
}

static unsigned from_vnode(unsigned notes)
{
    return ((notes & (NOTE_WRITE | NOTE_EXTEND)) ? ATAP__PATH_WRITE : 0) |
           ((notes & (NOTE_ATTRIB | NOTE_LINK)) ? ATAP__PATH_ATTRIB : 0) |
           ((notes & NOTE_GONE) ? ATAP__PATH_GONE : 0);
}

static unsigned from_kevent(const struct kevent *e)
{
    unsigned r;

    if (e->flags & EV_ERROR)
        return ATAP__POLL_ERR;
    if (e->filter == EVFILT_VNODE)
        return from_vnode(e->fflags);
    r = e->filter == EVFILT_WRITE ? ATAP__POLL_WRITE : ATAP__POLL_READ;
    if (e->flags & EV_EOF) {
        r |= ATAP__POLL_HUP;
        if (e->fflags != 0) /* sockets: the pending error */
            r |= ATAP__POLL_ERR;
    }
    return r;
}

static int once(struct atap_poller *p, struct atap_poller_event *events, int max, uint64_t ns,
                bool *woke)
{
    struct timespec ts, *tsp = NULL;
    uintptr_t fd_of[ATAP__POLLER_BATCH]; /* events[i]'s fd, for the merge */
    int n, out = 0;

    if (ns != ATAP__FOREVER) {
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        tsp = &ts;
    }
    n = kevent(p->kq, NULL, 0, p->buf, max, tsp);
    if (n < 0)
        return -errno;
    for (int i = 0; i < n; i++) {
        const struct kevent *e = &p->buf[i];
        int j = 0;

        if (e->filter == EVFILT_USER) {
            *woke = atap__poller_wake_take(&p->pending);
            continue;
        }
        if (e->filter == EVFILT_READ || e->filter == EVFILT_WRITE) {
            /* The fd's other direction, if reported: one event (the top). */
            while (j < out && (events[j].kind != ATAP__WATCH_FD || fd_of[j] != e->ident))
                j++;
            if (j < out) {
                events[j].events |= from_kevent(e);
                continue;
            }
        }
        fd_of[out] = e->ident;
        events[out++] = (struct atap_poller_event){
            .udata = (void *)e->udata,
            .events = from_kevent(e),
            .kind = e->filter == EVFILT_VNODE ? ATAP__WATCH_PATH : ATAP__WATCH_FD};
    }
    return out;
}

int atap__poller_open(struct atap_poller **out)
{
    struct atap_poller *p;
    struct kevent ev;
    int rc;

    if (out == NULL)
        return -EINVAL;
    *out = NULL;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return -ENOMEM;
    atomic_init(&p->pending, 0u);
    p->kq = open_kq();
    if (p->kq < 0) {
        rc = -errno;
        free(p);
        return rc;
    }
    EV_SET(&ev, WAKE_IDENT, EVFILT_USER, EV_ADD | EV_CLEAR, NOTE_FFNOP, 0, NULL);
    rc = apply(p, &ev, 1, NULL, 0);
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
    if (p->kq >= 0)
        close(p->kq);
    free(p);
}

static int check_fd(const struct atap_poller *p, int fd)
{
    if (p == NULL)
        return -EINVAL;
    if (fd < 0)
        return -EBADF;
    if (fd == p->kq)
        return -EINVAL;
    return 0;
}

static int watch(struct atap_poller *p, int fd, unsigned events, void *udata, unsigned short mode)
{
    int rc = check_fd(p, fd);

    if (rc < 0)
        return rc;
    if (events == 0 || (events & ~(ATAP__POLL_READ | ATAP__POLL_WRITE)))
        return -EINVAL;
    rc = arm(p, fd, events, udata, mode);
    if (rc < 0)
        (void)arm(p, fd, 0, NULL, 0); /* no half watch: one filter may have been added */
    return rc;
}

int atap__poller_watch(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    return watch(p, fd, events, udata, EV_ONESHOT);
}

int atap__poller_watch_kept(struct atap_poller *p, int fd, unsigned events, void *udata)
{
    return watch(p, fd, events, udata, EV_CLEAR);
}

int atap__poller_unwatch(struct atap_poller *p, int fd)
{
    int rc = check_fd(p, fd);

    return rc < 0 ? rc : arm(p, fd, 0, NULL, 0);
}

/* One EVFILT_VNODE change (add or delete) with a receipt. 0 or -errno. */
static int vnode(struct atap_poller *p, int fd, unsigned short flags, void *udata)
{
    struct kevent ch, res;
    int n, rc = check_fd(p, fd);

    if (rc < 0)
        return rc;
    EV_SET(&ch, (uintptr_t)fd, EVFILT_VNODE, flags | EV_RECEIPT, VNODE_NOTES, 0, udata);
    if ((n = apply(p, &ch, 1, &res, 1)) < 0)
        return n;
    if (n == 1 && (res.flags & EV_ERROR) && res.data != 0 &&
        !((flags & EV_DELETE) && res.data == ENOENT)) /* nothing to delete */
        return -(int)res.data;
    return 0;
}

int atap__poller_watch_path(struct atap_poller *p, int fd, void *udata)
{
    return vnode(p, fd, EV_ADD | EV_ENABLE | EV_DISPATCH | EV_CLEAR, udata);
}

int atap__poller_unwatch_path(struct atap_poller *p, int fd)
{
    return vnode(p, fd, EV_DELETE, NULL);
}

unsigned atap__poller_kinds(void) { return 1u << ATAP__WATCH_FD | 1u << ATAP__WATCH_PATH; }

int atap__poller_wait(struct atap_poller *p, struct atap_poller_event *events, int max,
                      uint64_t timeout_ns)
{
    return atap__poller_loop(p, events, max, timeout_ns, once);
}

int atap__poller_wake(struct atap_poller *p)
{
    struct kevent ev;
    int saved = errno, rc;

    if (p == NULL)
        return -EINVAL;
    if (!atap__poller_wake_claim(&p->pending))
        return 0;
    EV_SET(&ev, WAKE_IDENT, EVFILT_USER, 0, NOTE_TRIGGER, 0, NULL);
    rc = apply(p, &ev, 1, NULL, 0);
    if (rc < 0)
        st_release(&p->pending, 0u);
    else
        rc = 0;
    errno = saved;
    return rc;
}

const char *atap__poller_name(void) { return "kqueue"; }

int atap__poller_fds(struct atap_poller *p, int *fds, int max)
{
    if (p == NULL || fds == NULL || max < 0)
        return -EINVAL;
    if (max == 0)
        return 0;
    fds[0] = p->kq;
    return 1;
}

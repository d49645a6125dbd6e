/*
 * The event backend: where the manager sleeps, and where idle workers wait
 * for parked fds (the hub's io, hub.h). It waits until a watched fd is
 * ready, a wake arrives, or a timeout runs out. It keeps no timers: the
 * manager owns time (timer.c) and passes the gap to its earliest timer as
 * the timeout. Exactly one backend is compiled (CMake ATAP_POLLER):
 * poller_epoll.c (Linux: epoll + eventfd), poller_kqueue.c (macOS, FreeBSD:
 * kqueue + EVFILT_USER), poller_poll.c (portable poll(2) + a self-pipe, so
 * Linux CI can run this contract a second time).
 *
 * The contract, the same on every backend (tests/test_poller.c checks it):
 *
 * Watches are keyed by fd: a poller holds at most one watch per fd, and
 * watching an fd again replaces its interest and udata. Several parked tasks
 * on one fd are the caller's to multiplex: it keeps a record per fd (its
 * waiters and the union of their interests), passes the record as udata, and
 * after every event for the fd watches it again with the interest still
 * wanted. That one rule gives the same result on every backend.
 *
 * Watches are one-shot (all but kept ones, atap__poller_watch_kept below):
 * an event disarms what it reports, and nothing more is reported for that
 * fd until it is watched again. So a parked task is resumed
 * once, and a hung-up or failed fd (HUP/ERR are reported whatever was asked,
 * and persist) is reported once per arming: it can never spin the loop.
 * With READ|WRITE on one fd, epoll and poll disarm the fd as a whole when
 * either fires; kqueue arms two independent filters, so the direction that
 * did not fire stays armed. The re-watch rule above covers both. Both
 * directions ready at once come as one event with both bits, on every
 * backend (kqueue's two reports are merged when one kernel wait returns
 * them together; poller_kqueue.c).
 *
 * The reported bits are what the kernel said: READ/WRITE for the directions
 * that are ready, HUP for a hang-up, ERR for an error condition. A READ
 * watch also asks for the peer's half-close (a stream socket's peer closed
 * or shut down its writing side: epoll's EPOLLRDHUP, poll's POLLRDHUP where
 * the C library has it, kqueue's EV_EOF on EVFILT_READ), reported as HUP
 * with READ; a full hang-up (epoll's EPOLLHUP, poll's POLLHUP, a pipe's
 * other end closed, kqueue's EV_EOF on EVFILT_WRITE) is HUP whatever was
 * asked. HUP and ERR may come with or without READ/WRITE depending on the
 * backend and the kind of fd (a pipe whose writer closed: HUP alone on
 * epoll and poll, READ|HUP on kqueue); treat them as "ready for every
 * direction you asked for" (the next read returns 0 or the error).
 *
 * A wake makes the wait in progress, or else the next one, return. It is
 * consumed inside wait and reported as no event: wait returns 0 (or the
 * events that were ready beside it). Wakes coalesce: any number of wakes
 * before a wait make it return once, and a wait returns 0 before its timeout
 * only for a wake that no earlier wait has consumed. Waking costs a
 * system call only when no wake is already pending (an atomic flag, cleared
 * by the waiter after it drained the kernel object, so a wake that loses the
 * race still finds the waiter returning, never a sleeping one).
 *
 * Timeouts are in nanoseconds (ATAP__POLLER_FOREVER: none; 0: just look) and
 * are never cut short: a wait that returns 0 without a wake has slept at
 * least timeout_ns by CLOCK_MONOTONIC. The kernel's granularity is rounded up
 * (epoll_wait and poll take milliseconds; epoll_pwait2 and kevent take a
 * timespec), and a kernel wait that returns early (EINTR, a clamp on very
 * long timeouts, rounding) is resumed for the time left. EINTR is never
 * returned.
 *
 * Threads: open and close on one thread, with no other call in flight on
 * that poller. wait on one thread at a time (the manager; on the hub's io,
 * whoever holds its seat). watch, unwatch and wake from any thread, also
 * while another thread waits: the change applies to the wait in progress.
 * wake is async-signal-safe on epoll and poll (an atomic exchange and
 * write(2), errno preserved); on kqueue it is a kevent(2) call, a plain
 * system call with no user-space lock. A report
 * already on its way when another thread unwatches may still be returned
 * once: whatever udata points to must outlive the next wait (table slots,
 * with their generations, do). The poller does not order the caller's memory
 * between watch and the wait that reports it (TSan cannot see through
 * epoll_pwait2 either): publish what udata points to with the caller's own
 * atomics or locks. A poller does not survive fork().
 *
 * Errors are -errno: -EINVAL for a NULL poller or buffer, a bad count, bad
 * event bits, or one of the poller's own fds; -EBADF for a negative or
 * closed fd; whatever the kernel says otherwise. Regular files: epoll
 * refuses them (-EPERM), macOS's kqueue refuses WRITE on them (-EINVAL),
 * otherwise they are ready at once, but for kqueue's READ, ready only while
 * the file's offset is short of its end; file I/O belongs to the blocking
 * threads anyway. FreeBSD's kqueue refuses a WRITE watch on a pipe whose reader is
 * already gone (-EPIPE): that hang-up comes back from watch, not from wait.
 * Unwatch before close(): epoll and kqueue drop a closed fd's watch
 * silently, poll reports it once as ERR.
 *
 * Other kinds of watch have calls of their own, are one-shot like fd
 * watches, and are reported through the same wait with `kind` set and
 * kind-specific bits in `events`; atap__poller_kinds() says which a backend
 * has. Path changes (ATAP__WATCH_PATH) exist on kqueue (EVFILT_VNODE on the
 * open file itself); on Linux sources.c watches paths with an inotify fd of
 * its own, an ordinary fd watch, so epoll and poll do not offer them.
 * Signals go through a self-pipe (sources.c) on every backend. Room is left
 * for child exits (ATAP__WATCH_PROC: pidfd, EVFILT_PROC).
 */
#ifndef ATAP_POLLER_H
#define ATAP_POLLER_H

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"
#include "wait.h"

/* Bits of atap__poller_watch's `events` (READ, WRITE) and of a reported
 * event (all four). */
#define ATAP__POLL_READ 0x1u
#define ATAP__POLL_WRITE 0x2u
#define ATAP__POLL_HUP 0x4u /* reported only */
#define ATAP__POLL_ERR 0x8u /* reported only */

#define ATAP__POLLER_FOREVER ATAP__FOREVER /* UINT64_MAX: no timeout */
#define ATAP__POLLER_BATCH 64              /* most events one wait returns */
/* Longest single kernel sleep: longer timeouts are slept in slices of this,
 * so no backend has to fit a huge timeout into a 32-bit time_t or int ms. */
#define ATAP__POLLER_SLICE_NS (86400ull * 1000000000u)

/* What a watch is on. The kinds a backend lacks are reserved so the event
 * layout and the kind numbers never move. */
enum atap__watch_kind {
    ATAP__WATCH_FD = 0,     /* an fd, READ and/or WRITE */
    ATAP__WATCH_SIGNAL = 1, /* reserved: a signal number */
    ATAP__WATCH_PATH = 2,   /* changes to an open file or directory (kqueue) */
    ATAP__WATCH_PROC = 3,   /* reserved: a child process's exit */
};

/* Bits of a reported ATAP__WATCH_PATH event: what changed. A directory's
 * entries changing is reported as WRITE (the kernel cannot tell the poller
 * more); the caller, who knows it watches a directory, reads it so. */
#define ATAP__PATH_WRITE 0x10u  /* content written or extended */
#define ATAP__PATH_ATTRIB 0x20u /* metadata: mode, times, link count */
#define ATAP__PATH_GONE 0x80u   /* deleted, renamed or revoked */

struct atap_poller_event {
    void *udata;     /* as given to the watch */
    unsigned events; /* ATAP__POLL_* bits that were ready */
    unsigned kind;   /* enum atap__watch_kind */
};

struct atap_poller;

/* Creates a poller (every fd close-on-exec). 0 and *out set, or -errno. */
int atap__poller_open(struct atap_poller **out);

/* Closes its fds and frees it. NULL is ignored. */
void atap__poller_close(struct atap_poller *p);

/* Arms a one-shot watch on fd for events (ATAP__POLL_READ and/or
 * ATAP__POLL_WRITE), replacing any watch already on fd. 0 or -errno. */
int atap__poller_watch(struct atap_poller *p, int fd, unsigned events, void *udata);

/* Arms a kept watch on fd for events (READ and/or WRITE), replacing any
 * watch on fd, as atap__poller_watch does (and either call, or unwatch,
 * replaces or removes a kept one). Kept: not one-shot but edge-triggered.
 * It stays armed after a report and reports again each time fd becomes
 * ready anew for a direction it watches (bytes arrive, room frees up, a
 * hang-up), never for a readiness that merely lasts: the caller remembers
 * what it was told. Arming it, first or again, reports once what fd is
 * ready for at that moment. 0 or -errno as atap__poller_watch; -ENOTSUP on
 * poll, which has no edges (the caller keeps one-shot watches there). */
int atap__poller_watch_kept(struct atap_poller *p, int fd, unsigned events, void *udata);

/* Removes the watch on fd, armed or already fired. 0 also when fd had none.
 * The fd must still be open (-EBADF from epoll and kqueue otherwise). */
int atap__poller_unwatch(struct atap_poller *p, int fd);

/* Arms a one-shot watch for changes to the file or directory open as fd
 * (reported as ATAP__WATCH_PATH with ATAP__PATH_* bits), replacing any path
 * watch already on fd; independent of fd's READ / WRITE watch. 0 or -errno;
 * -ENOTSUP on a backend without ATAP__WATCH_PATH. */
int atap__poller_watch_path(struct atap_poller *p, int fd, void *udata);

/* Removes fd's path watch, armed or already fired. 0 also when it had none;
 * -ENOTSUP as above. */
int atap__poller_unwatch_path(struct atap_poller *p, int fd);

/* The watch kinds this backend has: 1u << ATAP__WATCH_FD, and so on. */
unsigned atap__poller_kinds(void);

/* Waits up to timeout_ns for events; fills at most max of them (and at most
 * ATAP__POLLER_BATCH). Returns how many (> 0), 0 on timeout or wake, or
 * -errno. Events left over are reported by the next wait. */
int atap__poller_wait(struct atap_poller *p, struct atap_poller_event *events, int max,
                      uint64_t timeout_ns);

/* Makes the wait in progress, or the next one, return. 0 or -errno. */
int atap__poller_wake(struct atap_poller *p);

/* "epoll", "kqueue" or "poll". */
const char *atap__poller_name(void);

/* The fds the poller owns (at most max). How many, or -EINVAL. For tests,
 * and for a fork's child, which closes the parent's without using them. */
int atap__poller_fds(struct atap_poller *p, int *fds, int max);

/* poll(2)'s bits for a READ / WRITE interest, and back: for poller_poll.c
 * and for the one-off looks outside a poller (kwait.c, park_fd.c). With READ,
 * the peer's half-close is asked for too (POLLRDHUP, where the C library
 * has it), and reported as HUP, as epoll's EPOLLRDHUP and kqueue's EV_EOF
 * are. POLLNVAL (not an open fd) is reported as ERR. */
#if defined(POLLRDHUP)
#define ATAP__POLLRDHUP POLLRDHUP
#else
#define ATAP__POLLRDHUP 0
#endif

static inline short atap__poll_interest(unsigned events)
{
    return (short)(((events & ATAP__POLL_READ) ? POLLIN | ATAP__POLLRDHUP : 0) |
                   ((events & ATAP__POLL_WRITE) ? POLLOUT : 0));
}

static inline unsigned atap__poll_report(short revents)
{
    return ((revents & POLLIN) ? ATAP__POLL_READ : 0u) |
           ((revents & POLLOUT) ? ATAP__POLL_WRITE : 0u) |
           ((revents & (POLLHUP | ATAP__POLLRDHUP)) ? ATAP__POLL_HUP : 0u) |
           ((revents & (POLLERR | POLLNVAL)) ? ATAP__POLL_ERR : 0u);
}

/* ---- for the backend files only ----------------------------------------- */

/* One kernel wait of at most timeout_ns (FOREVER: none; otherwise at most
 * ATAP__POLLER_SLICE_NS), rounded up to the kernel's unit. Returns the events
 * stored (at most max, at most ATAP__POLLER_BATCH), or -errno (-EINTR
 * included), and sets *woke when it consumed a wake. */
typedef int atap__poller_once_fn(struct atap_poller *p, struct atap_poller_event *events, int max,
                                 uint64_t timeout_ns, bool *woke);

/* atap__poller_wait on top of a backend's `once`: checks the arguments,
 * resumes a wait cut short (EINTR, clamped, nothing to report) for the time
 * left by CLOCK_MONOTONIC, and returns only for events, a wake, an error or
 * the deadline. */
static inline int atap__poller_loop(struct atap_poller *p, struct atap_poller_event *events,
                                    int max, uint64_t timeout_ns, atap__poller_once_fn *once)
{
    uint64_t deadline = ATAP__FOREVER, left = timeout_ns, now;
    bool woke;
    int n;

    if (p == NULL || events == NULL || max <= 0)
        return -EINVAL;
    if (max > ATAP__POLLER_BATCH)
        max = ATAP__POLLER_BATCH;
    if (timeout_ns != 0 && timeout_ns != ATAP__FOREVER)
        deadline = atap__deadline(atap__now_ns(), timeout_ns);
    for (;;) {
        woke = false;
        if (left != ATAP__FOREVER && left > ATAP__POLLER_SLICE_NS)
            left = ATAP__POLLER_SLICE_NS;
        n = once(p, events, max, left, &woke);
        if (n > 0 || woke || (n < 0 && n != -EINTR))
            return n;
        if (timeout_ns == 0)
            return 0;
        if (deadline != ATAP__FOREVER) {
            now = atap__now_ns();
            if (now >= deadline)
                return 0;
            left = deadline - now;
        }
    }
}

/* The wake flag's two halves, shared by the backends. wake: only the caller
 * that moves the flag 0 -> 1 pokes the kernel. The waiter, after draining the
 * kernel object, moves it back to 0: a wake whose exchange came before that
 * found the flag at 1 and did not poke, but this wait is returning anyway,
 * and the acq_rel pair makes everything the waker wrote before its wake
 * visible to the waiter. A poke that lands after the drain only makes the
 * next wait look once more (it returns only if the flag says a wake came). */
static inline bool atap__poller_wake_claim(_Atomic uint32_t *pending)
{
    return xchg_acqrel(pending, 1u) == 0u;
}

static inline bool atap__poller_wake_take(_Atomic uint32_t *pending)
{
    return xchg_acqrel(pending, 0u) != 0u;
}

#endif

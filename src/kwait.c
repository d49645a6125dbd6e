/*
 * Kernel waits a cancel interrupts: atap_sleep, atap_sleep_relaxed and
 * atap_wait_fd hold the calling thread, but a cancel or a run timeout of the
 * task it runs cuts them short.
 *
 * Each pool thread has its own poller (`kq`, made on first use and kept with
 * the thread's record; a fork's child closes the records' fds, pool_life.c).
 * A thread waiting for its task stores the task's key
 * (gen << 32 | index) in `kwait`, then looks at the task's state, then
 * sleeps on kq; a canceller (or a run timeout) moves the state on, then
 * scans the records for that key and wakes their kq (atap__park_interrupt,
 * atap__pool_interrupt). Both sides are seq_cst (the canceller with a fence
 * after its CAS), so either the waiter sees the stop or the canceller sees
 * the key; a wake is never lost. A wake left over in kq from an earlier task
 * only makes a later wait look at its own task's state once more and sleep
 * again. Outside a task the waits are plain ones. A thread that cannot have
 * a poller (no fd to be had: RLIMIT_NOFILE) waits in slices instead, looking
 * at its task's state between them (sliced_wait).
 */
#include <errno.h>
#include <poll.h>
#include <time.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "park.h"
#include "poller.h"
#include "pool.h"
#include "slot.h"
#include "wait.h"

#define SPIN_NS 500000u   /* atap_sleep spins the last 500 us */
#define SLICE_NS 5000000u /* with no poller: how often a wait looks for a stop */
#define EVENT_BITS (ATAP_READABLE | ATAP_WRITABLE)

/* Outside a task (or without a poller): a wait nothing interrupts. */
int atap__plain_wait(uint64_t deadline, bool precise, int fd, unsigned events)
{
    for (;;) {
        uint64_t now = atap__now_ns(), left;

        if (fd >= 0) { /* looks once even when the time is up (a timeout of 0) */
            struct pollfd pfd = {.fd = fd, .events = atap__poll_interest(events)};
            int ms = now >= deadline             ? 0
                     : deadline == ATAP__FOREVER ? -1
                     : (deadline - now) / 1000000u >= INT32_MAX
                         ? INT32_MAX
                         : (int)((deadline - now + 999999u) / 1000000u);
            int n = poll(&pfd, 1, ms);

            if (n < 0 && errno != EINTR)
                return -errno;
            if (n > 0) {
                if (pfd.revents & POLLNVAL)
                    return -EBADF;
                return (int)atap__poll_report(pfd.revents);
            }
            if (n == 0 && now >= deadline)
                return ATAP_ENOTREADY;
            continue;
        }
        if (now >= deadline)
            return 0;
        left = deadline - now;
        if (precise && left <= SPIN_NS) {
            while (atap__now_ns() < deadline)
                cpu_relax();
            return 0;
        }
        left -= precise ? SPIN_NS : 0;
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        nanosleep(&ts, NULL); /* EINTR: the loop looks again */
    }
}

/* The running task was stopped: why. */
static int stopped(const struct atap_ctx *ctx)
{
    uint32_t w = ld_seqcst(&ctx->slot->word);

    if (word_gen(w) != ctx->gen)
        return 0;
    switch (word_state(w)) {
    case ST_CANCELLED:
        return ATAP_ECANCELLED;
    case ST_TIMED_OUT:
        return ATAP_ETIMEDOUT;
    default:
        return 0;
    }
}

static struct atap_poller *thread_kq(struct worker *w)
{
    struct atap_poller *kq = ld_acquire(&w->kq);

    if (!kq && atap__poller_open(&kq) == 0)
        st_release(&w->kq, kq); /* only this thread makes it */
    return kq;
}

/* A task's wait on a thread with no poller of its own (no fd could be had
 * for it): plain waits of SLICE_NS at most, looking for a stop between
 * them, so a cancel or a run timeout still ends it, a slice late at most. */
static int sliced_wait(const struct atap_ctx *ctx, uint64_t deadline, bool precise, int fd,
                       unsigned events)
{
    for (;;) {
        uint64_t now = atap__now_ns(), until;
        int rc = stopped(ctx);

        if (rc != 0)
            return rc;
        until = now < deadline && deadline - now > SLICE_NS ? now + SLICE_NS : deadline;
        rc = atap__plain_wait(until, precise && until == deadline, fd, events);
        if (until == deadline || (fd >= 0 ? rc != ATAP_ENOTREADY : rc != 0))
            return rc;
    }
}

/* What n events of the one fd a thread's poller watches say, together (the
 * fd's READ and WRITE may come as two events; see kernel_wait). */
static unsigned fd_events(const struct atap_poller_event *ev, int n)
{
    unsigned got = 0;

    for (int i = 0; i < n; i++)
        got |= ev[i].events;
    return got;
}

static int kernel_wait(uint64_t deadline, bool precise, int fd, unsigned events)
{
    struct worker *w = atap__self;
    struct atap_ctx *ctx = w ? w->cur : NULL;
    /* Room for a wake left over in kq (the top comment), which must not
     * crowd out the fd's event on a look with no time left, and for the
     * fd's READ and WRITE as two events (kqueue's two filters; its poller
     * merges them, and ORing them here costs nothing). */
    struct atap_poller_event ev[3];
    struct atap_poller *kq;
    int rc = 0;

    if (!ctx || !ctx->slot)
        return atap__plain_wait(deadline, precise, fd, events);
    if (!(kq = thread_kq(w)))
        return sliced_wait(ctx, deadline, precise, fd, events);
    /* seq_cst, then the state: against the canceller's CAS and fence. */
    st_seqcst(&w->kwait, (uint64_t)ctx->gen << 32 | ctx->index);
    if (fd >= 0 && (rc = atap__poller_watch(kq, fd, events, kq)) < 0) {
        st_release(&w->kwait, 0);
        /* A file the kernel's poller does not take (a regular file, always
         * ready): epoll says EPERM, macOS's kqueue EINVAL for a WRITE watch.
         * poll(2) says what it is ready for, as outside a task. */
        return rc == -EPERM || rc == -EINVAL ? atap__plain_wait(0, false, fd, events) : rc;
    }
    for (;;) {
        uint64_t now, left;
        int n;

        if ((rc = stopped(ctx)) != 0)
            break;
        if ((now = atap__now_ns()) >= deadline) {
            if (fd >= 0) { /* one look before giving up (a timeout of 0) */
                n = atap__poller_wait(kq, ev, 3, 0);
                rc = n > 0 ? (int)fd_events(ev, n) : n < 0 ? n : ATAP_ENOTREADY;
            }
            break; /* a sleep: rc is 0 */
        }
        left = deadline - now;
        if (precise && left <= SPIN_NS) {
            while (atap__now_ns() < deadline && (rc = stopped(ctx)) == 0)
                cpu_relax();
            break;
        }
        n = atap__poller_wait(
            kq, ev, 3, deadline == ATAP__FOREVER ? ATAP__FOREVER : left - (precise ? SPIN_NS : 0));
        if (n > 0) {
            rc = (int)fd_events(ev, n);
            break;
        }
        if (n < 0) {
            rc = n;
            break;
        }
        /* a timeout, or a wake (maybe one left from an earlier task) */
    }
    if (fd >= 0)
        atap__poller_unwatch(kq, fd);
    st_release(&w->kwait, 0);
    return rc;
}

int atap_sleep(uint64_t ns) { return kernel_wait(atap__deadline_in(ns), true, -1, 0); }

int atap_sleep_relaxed(uint64_t ns) { return kernel_wait(atap__deadline_in(ns), false, -1, 0); }

int atap_wait_fd(int fd, unsigned events, uint64_t timeout_ns)
{
    if (!events || (events & ~EVENT_BITS))
        return ATAP_EINVAL;
    if (fd < 0)
        return -EBADF;
    return kernel_wait(atap__deadline_in(timeout_ns), false, fd, events);
}

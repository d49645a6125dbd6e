/*
 * The pool's side of the hub's io poller (hub.h: the poller of parked fds
 * and its seat, which one thread at a time holds to wait on io).
 *
 * An idle worker that takes the seat sleeps on io rather than on its park
 * word, waiting for the readiness of every parked fd at once; what it
 * reads it hands out itself (park_fd.c, through the conf's io_event), off
 * the idle list first, so the tasks it resumes are queued to it and run on
 * the thread that read their readiness, with no hop through the manager
 * and no wake of another thread; they run in the order the poller
 * reported them (io_hand_out), the fd ready longest first. A waker finds it by in_io: the waker
 * (atap__pool_unpark) stores the word then reads in_io, the worker stores
 * in_io then reads the word, all seq_cst, so either the worker sees the
 * word or the waker wakes io. A worker that finds the seat taken marks it
 * wanted and sleeps on its word; the holder, giving it back, wakes one
 * (atap__pool_notify), so that no worker sleeps idle while nobody reads
 * io. A report is handed out whatever the word says, a stop included: its
 * one-shot watch is spent and nobody else would hear of it (a reaped
 * worker moves what it queued so to the shared queue, pool.c).
 *
 * While no worker is idle, nobody waits on io: a busy worker looks (no
 * wait) every IO_EVERY_RUNS runs once nobody has for IO_GAP_NS, and the
 * manager's tick does the same (manager.c), which is what hears io while
 * every worker is inside one long run. The same look fires the deadline
 * parks that are due if the manager has not yet (the conf's due): with
 * every CPU busy running workers, the manager's wake can wait milliseconds
 * for one.
 */
#include "pool.h"

#include "atomics.h"
#include "hub.h"
#include "pool_int.h"

#define IO_BATCH 32
#define IO_GAP_NS 200000u /* a busy worker looks if nobody has for this long */

/* Hands out what a look at io read, on this thread, so that the fd the
 * poller reported first (the one that has waited longest: epoll and
 * kqueue report in the order fds became ready) is served first, which
 * keeps the tail of the waits short. What a worker resumes goes to its own
 * queues, which it runs newest first (the LIFO slot, then the ring's
 * bottom), so a worker hands out from the last report to the first; the
 * manager's go to the shared queue in the order read, and a worker runs a
 * batch it takes from there in that order (pool.c's from_shared). Then,
 * if an idle worker wanted the seat while it was held, wakes one to take
 * it. */
static void io_hand_out(const struct atap_poller_event *ev, int n, bool wanted,
                        void (*hand)(void *udata, unsigned events, unsigned kind))
{
    /* Each report names a record its hand-out reads first (an fd's), cold
     * when thousands are watched: all fetched at once, they arrive
     * together rather than one miss after another. A hint only. */
    for (int i = 0; i < n; i++)
        __builtin_prefetch(ev[i].udata);
    if (atap__self)
        for (int i = n - 1; i >= 0; i--)
            hand(ev[i].udata, ev[i].events, ev[i].kind);
    else
        for (int i = 0; i < n; i++)
            hand(ev[i].udata, ev[i].events, ev[i].kind);
    if (wanted)
        atap__pool_notify();
}

void atap__pool_io_look(uint64_t gap_ns, void (*hand)(void *udata, unsigned events, unsigned kind))
{
    struct atap_poller_event ev[IO_BATCH];
    struct atap_poller *io = atap__hub_io();
    uint64_t now;
    int n;

    if (!io || !hand)
        return;
    now = atap__now_ns();
    if (now - ld_relaxed(&atap__hub.io_looked) < gap_ns || !atap__hub_io_take())
        return;
    n = atap__poller_wait(io, ev, IO_BATCH, 0);
    io_hand_out(ev, n > 0 ? n : 0, atap__hub_io_give(now), hand);
}

void atap__pool_busy_io(struct worker *w)
{
    w->io_runs = 0;
    if (atap__pool.due) /* the timers too, while the manager waits for a CPU */
        atap__pool.due();
    atap__pool_io_look(IO_GAP_NS, atap__pool.io_event);
}

int atap__pool_idle_io(struct worker *w, uint64_t timeout_ns)
{
    struct atap_poller_event ev[IO_BATCH];
    struct atap_poller *io;
    uint64_t from;
    bool wanted;
    int n = 0;

    if (w->blocking || !atap__pool.io_event || !(io = atap__hub_io()))
        return IO_NONE;
    while (!atap__hub_io_take())
        if (atap__hub_io_want())
            return IO_NONE;
    /* Against atap__pool_unpark (both seq_cst): in_io before the word, so
     * either this look sees the waker's word or the waker sees in_io and
     * wakes io (a wake before the wait makes it return). */
    st_seqcst(&w->in_io, true);
    from = timeout_ns == ATAP__FOREVER ? 0 : atap__now_ns();
    if (ld_seqcst(&w->park) == PARK_IDLE)
        n = atap__poller_wait(io, ev, IO_BATCH, timeout_ns);
    /* Relaxed: a waker that still reads true only wakes io for nothing;
     * this worker reads its word again before it sleeps anywhere. */
    st_relaxed(&w->in_io, false);
    wanted = atap__hub_io_give(atap__now_ns());
    /* Off the list before the hand-out queues anything: what it resumes
     * is this worker's to run, as a worker's own spawns are. */
    if (n > 0)
        atap__pool_leave_idle(w);
    io_hand_out(ev, n > 0 ? n : 0, wanted, atap__pool.io_event);
    if (n == 0 && from && atap__now_ns() - from >= timeout_ns)
        return IO_TIMEOUT;
    return n > 0 ? IO_READ : n < 0 ? IO_NONE : IO_WOKEN;
}

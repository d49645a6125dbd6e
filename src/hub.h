/*
 * The hub: the runtime's one timer structure and one poller, and whether a
 * manager is there to drive them (hub.c). The features arm timers in it
 * and watch fds on it (schedule.c, rate.c, park.c, park_fd.c,
 * park_wheel.c, sources.c); the manager (manager.c, above the features)
 * opens it, drives it, closes it, and moves its state through a life. Kept
 * below the features, so that they need nothing of the manager's.
 *
 * The poller is opened by a start and closed by the last shutdown, once
 * no thread of the runtime is left (atap__hub_close; a fork's child
 * forgets it: manager.c). A wake may still come from a thread outside the
 * runtime (a canceller, a settle) at any moment: atap__hub_wake and
 * atap__hub_wake_io count it in around its look at the poller, and the
 * close takes the poller away before it waits for that count to be 0, so
 * a wake pokes a live object or finds none. So is `io`, a second poller
 * that holds the watches of parked fds alone (park_fd.c), and which the
 * pool's idle workers wait on rather than the manager, so that a socket's
 * readiness runs its task on the thread that read it, with no hop through
 * the manager (the seat, below). `closed` is set (seq_cst) once
 * no manager will fire another timer: an arm racing it looks at it after
 * its own seq_cst push, so either the close's take-all or the arm's own
 * disarm gets the record (schedule.c).
 */
#ifndef ATAP_HUB_H
#define ATAP_HUB_H

#include <stdbool.h>

#include "atomics.h"
#include "poller.h"
#include "timer.h"

/* The manager's life, as hub.state has it. */
#define HUB_STOPPED 0    /* no runtime, or stopped: the timer structure let go */
#define HUB_RUNNING 1    /* a manager lives */
#define HUB_RESTARTING 2 /* between two lives */
#define HUB_GONE 3       /* the supervisor gave up: no timer fires again */

struct atap__hub {
    _Atomic(struct atap_poller *) poller;
    _Atomic(struct atap_poller *) io; /* parked fds' watches (the seat, below) */
    _Atomic uint32_t io_seat;         /* IO_SEAT_*: who waits on io */
    _Atomic uint64_t io_looked;       /* when a seat's holder last looked at io:
                                         relaxed, a hint (a stale read makes a look
                                         early or late, never wrong) */
    struct atap_timers timers;
    _Atomic int state;
    _Atomic bool closed; /* takes no more timers (stopping, or gone) */
};

extern struct atap__hub atap__hub;

/* Makes the manager look at its timers now (any thread; none once the
 * hub is closed). */
void atap__hub_wake(void);
/* Wakes the thread waiting on io (any thread; none once closed). */
void atap__hub_wake_io(void);
/* The last shutdown, no thread of the runtime left: both pollers are
 * closed, once no wake is under way; the next start opens new ones. */
void atap__hub_close(void);
/* In a fork's child: the hub as before the first start, with no wake
 * counted (a parent's thread may have been in one). The caller has closed
 * the parent's pollers' fds. */
void atap__hub_forget(void);

/* The runtime's timer structure (the manager drives it). */
static inline struct atap_timers *atap__hub_timers(void) { return &atap__hub.timers; }

/* The poller parked tasks' fds and the sources are watched on. */
static inline struct atap_poller *atap__hub_poller(void) { return ld_acquire(&atap__hub.poller); }

/*
 * The seat: io is waited on by one thread at a time (the poller's rule),
 * the one that took the seat: an idle worker, blocking until a report or
 * a wake (the pool's, which wakes it as it would from its park word); a
 * busy worker between runs, or the manager at its tick, just looking, so
 * that reports are read while every worker runs (pool_io.c). The seat is a
 * word: FREE, HELD, or WANTED (held, and another thread that wanted it
 * is idle without it). Whoever gives it back and finds WANTED wakes an
 * idle worker (atap__pool_notify), which takes the seat if still free:
 * so an idle worker that could not wait on io, because another thread
 * was reading it, is not left asleep while nobody reads it any more.
 */
#define IO_SEAT_FREE 0u
#define IO_SEAT_HELD 1u
#define IO_SEAT_WANTED 2u

static inline struct atap_poller *atap__hub_io(void) { return ld_acquire(&atap__hub.io); }

/* Takes the seat if it is free: the caller may wait on io. Acquire: what
 * the last holder did before giving it back is seen. */
static inline bool atap__hub_io_take(void)
{
    uint32_t free_ = IO_SEAT_FREE;

    return ld_relaxed(&atap__hub.io_seat) == IO_SEAT_FREE &&
           cas_acquire(&atap__hub.io_seat, &free_, IO_SEAT_HELD);
}

/* The seat was taken: marks it wanted, before the caller sleeps without
 * it. False if it was given back meanwhile (the caller tries again). The
 * giver's exchange and this CAS are RMWs of one word: one of the two sees
 * the other. Release, with the giver's acquire: a giver that finds WANTED
 * sees the caller on the idle list, so its wake finds somebody. */
static inline bool atap__hub_io_want(void)
{
    uint32_t held = IO_SEAT_HELD;

    return cas_release(&atap__hub.io_seat, &held, IO_SEAT_WANTED) || held == IO_SEAT_WANTED;
}

/* Gives the seat back. True if a thread wanted it meanwhile: the caller
 * then wakes an idle worker. Release: pairs with the next take; acquire:
 * with a want. */
static inline bool atap__hub_io_give(uint64_t now)
{
    st_relaxed(&atap__hub.io_looked, now);
    return xchg_acqrel(&atap__hub.io_seat, IO_SEAT_FREE) == IO_SEAT_WANTED;
}

/* Whether an armed timer will be fired: false once a shutdown or the
 * supervisor giving up closed the structure (seq_cst, above). */
static inline bool atap__hub_accepting(void) { return !ld_seqcst(&atap__hub.closed); }

static inline bool atap__hub_gone(void) /* the supervisor gave up */
{
    return ld_acquire(&atap__hub.state) == HUB_GONE;
}

static inline bool atap__hub_stopped(void) /* stopped, its timer structure gone */
{
    return ld_acquire(&atap__hub.state) == HUB_STOPPED;
}

#endif

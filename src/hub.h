/*
 * The hub: the runtime's one timer structure and one poller, and whether a
 * manager is there to drive them (hub.c). The features arm timers in it
 * and watch fds on it (schedule.c, rate.c, park.c, park_fd.c,
 * park_wheel.c, sources.c); the manager (manager.c, above the features)
 * opens it, drives it, closes it, and moves its state through a life. Kept
 * below the features, so that they need nothing of the manager's.
 *
 * The poller is opened by the first start and kept for the process's life
 * (but by a fork's child, which forgets it: manager.c), so a wake from any
 * thread at any moment pokes a live object. `closed` is set (seq_cst) once
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
    struct atap_timers timers;
    _Atomic int state;
    _Atomic bool closed; /* takes no more timers (stopping, or gone) */
};

extern struct atap__hub atap__hub;

/* Makes the manager look at its timers now (any thread). */
void atap__hub_wake(void);

/* The runtime's timer structure (the manager drives it). */
static inline struct atap_timers *atap__hub_timers(void)
{
    return &atap__hub.timers;
}

/* The poller parked tasks' fds and the sources are watched on. */
static inline struct atap_poller *atap__hub_poller(void)
{
    return ld_acquire(&atap__hub.poller);
}

/* Whether an armed timer will be fired: false once a shutdown or the
 * supervisor giving up closed the structure (seq_cst, above). */
static inline bool atap__hub_accepting(void)
{
    return !ld_seqcst(&atap__hub.closed);
}

static inline bool atap__hub_gone(void) /* the supervisor gave up */
{
    return ld_acquire(&atap__hub.state) == HUB_GONE;
}

static inline bool atap__hub_stopped(void) /* stopped, its timer structure gone */
{
    return ld_acquire(&atap__hub.state) == HUB_STOPPED;
}

#endif

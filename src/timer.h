/*
 * The manager's timers: one user-space structure for every wait the manager
 * owns (start delays, repeat gaps, at-rate periods, run timeouts, park
 * deadlines), never one kernel object per timer. timer.c holds the protocol
 * and its invariants.
 *
 * A timer is an intrusive record (struct atap_timer) that its owner embeds;
 * the structure allocates nothing, so a million timers cost a million
 * records (56 bytes each) and one fixed wheel (65 KiB).
 *
 * Who calls what:
 *   any thread    atap__timer_arm, atap__timer_disarm, atap__timer_forget
 *   manager only  atap__timers_run, _pending, _take_all, _destroy,
 *                 atap__timer_held: the one thread that owns the structure
 *                 (handing it to another thread needs a happens-before, such
 *                 as a thread join).
 * Arms of one record must not overlap each other: its owner serialises them
 * (in libatap, whoever wins the slot's state transition arms). A disarm may
 * race with anything.
 *
 * Lifetime: the structure may point at a record from its first arm until
 * the manager has let go of it: a fired record is let go before its
 * callback runs; a disarmed one when the manager next meets it (its old
 * deadline, a cascade, or the inbox); any record at take_all or destroy.
 * libatap's records live in table slots, which are never unmapped (a fork's
 * child forgets the structure before its new table), so this
 * always holds there; anyone else checks atap__timer_held() on the manager
 * thread before freeing a record.
 */
#ifndef ATAP_TIMER_H
#define ATAP_TIMER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

/* The wheel. A tick is 2^16 ns (65.5 us). The ring has a slot per tick for
 * the next 2048 ticks (134 ms): a timer due that soon is filed there once
 * and never cascades. Anything later waits in 8 levels of 64 slots (level l
 * slots span 64^l ticks: 65 us, 4 ms, 268 ms, 17 s, 18 min, 19 h, 51 days,
 * 9 years), which are cascaded TIMER_LEAD ticks (67 ms) before they are
 * due, a bounded chunk per run, so no cascade ever holds up a fire. */
#define TIMER_TICK_SHIFT 16
#define TIMER_RING_BITS 11
#define TIMER_RING (1u << TIMER_RING_BITS)
#define TIMER_LEAD (TIMER_RING / 2)
#define TIMER_LEVEL_BITS 6
#define TIMER_LEVELS 8

/* Manager-owned doubly linked list node; next == NULL: on no list. */
struct atap_tlink {
    struct atap_tlink *next, *prev;
};

struct atap_timer {
    _Atomic uint32_t state;             /* seq << 2 | QUEUED | ARMED (timer.c) */
    uint32_t eseq;                      /* manager: the arming its entry stands for */
    _Atomic uint64_t deadline;          /* written by arm only, while not armed */
    uint64_t when;                      /* manager: the deadline its entry is filed by */
    struct atap_timer *qnext;           /* inbox link, owned by the inbox while QUEUED */
    struct atap_tlink link;             /* manager: wheel slot or near list */
    void (*fire)(struct atap_timer *t); /* set by init; runs on the manager */
};

struct atap_timers {
    /* Shared: every arm pushes on inbox and reads next_wake. */
    _Atomic(struct atap_timer *) inbox; /* Treiber stack, newest first */
    _Atomic uint64_t next_wake;         /* what the manager sleeps until; 0: awake */
    char pad0[48];
    /* Manager only. */
    uint64_t cur;              /* tick: near holds ticks <= cur, the ring (cur, cur + RING) */
    uint64_t lead;             /* tick: the levels hold ticks > lead, filed against it */
    size_t held;               /* records on near, the ring, the levels, pending */
    struct atap_tlink near;    /* sorted by deadline */
    struct atap_tlink pending; /* a level slot being cascaded, a chunk a run */
    uint64_t ring_bits[TIMER_RING / 64]; /* a set bit may name an emptied slot */
    uint64_t level_bits[TIMER_LEVELS];
    uint64_t ring_min[TIMER_RING]; /* lower bound of a ring slot's deadlines */
    uint32_t ring_n[TIMER_RING];   /* records filed there since it was empty */
    struct atap_tlink ring[TIMER_RING];
    struct atap_tlink level[TIMER_LEVELS][1u << TIMER_LEVEL_BITS];
};

/* Makes t an idle record that calls fire(t) on the manager when it fires.
 * Only while no structure holds t. A zeroed record with fire set is idle too. */
void atap__timer_init(struct atap_timer *t, void (*fire)(struct atap_timer *t));

/* The deadline of t's latest arming (a snapshot). */
static inline uint64_t atap__timer_deadline(struct atap_timer *t)
{
    return ld_relaxed(&t->deadline);
}

/* Whether t's latest arming is still owed a fire or a disarm (a snapshot). */
static inline bool atap__timer_armed(struct atap_timer *t)
{
    return (ld_acquire(&t->state) & 1u) != 0;
}

void atap__timers_init(struct atap_timers *ts, uint64_t now_ns);

/* Manager only, with no arm running. Lets go of every record (inbox, wheel,
 * near list) without firing, disarming or freeing any: an armed record stays
 * armed, held by nobody, and may be armed again into any structure. */
void atap__timers_destroy(struct atap_timers *ts);

/* Any thread. Arms t to fire at deadline_ns (CLOCK_MONOTONIC ns, the clock
 * run() is given); an armed t is re-armed (its earlier arming will not fire,
 * unless it already has). Takes no lock: one CAS on t, one on the inbox.
 * Returns true when the caller must wake the manager: deadline_ns is earlier
 * than the deadline the manager published it sleeps until (the call lowers
 * that, so of several arms only the ones that lower it wake). */
bool atap__timer_arm(struct atap_timers *ts, struct atap_timer *t, uint64_t deadline_ns);

/* Any thread. True: t was armed and now will not fire. False: it was not
 * armed (fired, or its fire is under way; never armed; already disarmed;
 * taken by take_all). Exactly one of {fire, disarm} wins an arming. */
bool atap__timer_disarm(struct atap_timers *ts, struct atap_timer *t);

/* Manager only. Takes in what was armed, fires the timers whose deadline is
 * <= now_ns (t->fire(t) on this thread, in deadline order; a budget of them
 * a run, timer.c's FIRE_BUDGET, the rest at the next), and returns the
 * deadline to sleep until: UINT64_MAX when nothing is pending; a value <=
 * now_ns means run again at once. Publishes it for arm()'s wake test. A fire
 * callback may arm and disarm any record, but not call run or take_all. */
uint64_t atap__timers_run(struct atap_timers *ts, uint64_t now_ns);

/* Manager only. Records on the wheel after the last run or take_all: armed
 * ones, and disarmed ones the manager has not met yet. */
size_t atap__timers_pending(struct atap_timers *ts);

/* Manager only. Whether the structure may still point at t. */
bool atap__timer_held(struct atap_timer *t);

/* Any thread, for a record whose owner is going and that is not armed:
 * asks the manager to let go of it at its next run (through the inbox),
 * rather than when it would meet it (a disarmed deadline an hour out is
 * met an hour later). Nothing if it is armed or already in the inbox. */
void atap__timer_forget(struct atap_timers *ts, struct atap_timer *t);

/* Manager only (the restart path). Takes in the inbox, then empties the
 * structure, handing each still-armed record to each(t, arg) exactly once.
 * Each is claimed as a fire claims it: a racing disarm either wins (the
 * record is not handed back) or returns false. A record armed while this
 * runs stays in the inbox for the next run. */
void atap__timers_take_all(struct atap_timers *ts, void (*each)(struct atap_timer *, void *),
                           void *arg);

/* Between two managers' lives (no manager runs; arms and disarms may):
 * rebuilds the structure from the records themselves. Lets go of everything
 * filed, then calls find(visit, cookie, arg), which must call
 * visit(t, cookie) once for every record that may be armed (found from the
 * task table, not from the structure); each whose latest arming the
 * structure had taken in is filed again for it. The inbox stays as it is.
 * Returns how many records were filed again. */
typedef void atap__timer_visit(struct atap_timer *t, void *cookie);
typedef void atap__timer_find(atap__timer_visit *visit, void *cookie, void *arg);
size_t atap__timers_rebuild(struct atap_timers *ts, atap__timer_find *find, void *arg);

#endif

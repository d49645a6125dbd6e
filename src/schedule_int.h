/*
 * What schedule.c shares with rate.c (at-rate series), and no one else: a
 * task's schedule, and the few steps each file takes in the other's.
 */
#ifndef ATAP_SCHEDULE_INT_H
#define ATAP_SCHEDULE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"
#include "side.h"
#include "slot.h"
#include "timer.h"

struct gate;

/* A scheduled task's schedule, on its side record (schedule.c's top comment). */
#define OUT_WRITER 0x80000000u /* out_lock: the publisher holds it (schedule_read.c) */

struct sched {
    struct atap_timer start; /* delay or gap: queues the next run */
    struct atap_timer limit; /* the running run's timeout */
    uint32_t index;          /* the slot (its generation is read from it) */
    uint8_t kind;
    bool blocking;
    _Atomic bool finished;        /* the series ran out: no run follows */
    _Atomic uint32_t out_lock;    /* readers | OUT_WRITER */
    _Atomic uint32_t running_gen; /* the generation the limit timer is for */
    bool out_live;                /* an output is in the slot, not taken (runner) */
    bool out_kept;                /* READY moved back to PENDING by a give */
    bool limit_armed;             /* the runner armed `limit` for this run */
    uint64_t limit_at;            /* ... for this moment */
    uint64_t after, every, timeout, for_ns, deadline; /* deadline: UINT64_MAX none */
    uint32_t runs, done;
    void *scratch;               /* a repeat's run writes here (out_size bytes) */
    uint64_t next_start;         /* at-rate: the period the next fire is for */
    struct sched *grave_next;    /* on the graveyard, once its slot is gone */
    _Atomic unsigned arming;     /* arms under way (atap__sched_arm): not to be freed yet */
    uint32_t parent, parent_gen; /* an at-rate run: its series (index + 1), or 0 */
    struct gate *gate;           /* a task that waits for gives; else NULL */
    uint64_t pubs;               /* outputs published (under out_lock) */
    void *input;                 /* an at-rate run of a waiting series: its value */
    size_t input_size;
    _Atomic uint32_t inflight; /* at-rate: runs under way | RUN_OWED (rate.c) */
    /* At a rate, the runs under way, for a stop to reach (rate.c's top
     * comment): a series' list and its lock; a run's links in it. */
    atap_spin runs_lock;
    bool runs_stopped;      /* series, under runs_lock: link no more */
    struct sched *run_list; /* series: the first run linked */
    struct sched *run_prev, *run_next;
    uint32_t run_gen; /* run: its slot's generation */
    bool linked;      /* run: on its series' list (its own thread's) */
    bool stop_seen;   /* run, under runs_lock: a stop took it */
};

/* inflight's top bit: the series' RUN was dropped while runs were under
 * way, and the last of them drops it (rate.c). */
#define RUN_OWED 0x80000000u

static inline struct sched *sched_of(struct atap_slot *s)
{
    return (struct sched *)ld_relaxed(&slot_side(s)->ext);
}

/* schedule.c. Arms t (start or limit); false when the manager no longer
 * takes timers and the disarm won: a start's RUN was written off. */
bool atap__sched_arm(struct sched *c, struct atap_timer *t, uint64_t deadline);
/* schedule.c. Ends the series with its last output standing (its gate
 * may wait or start again instead); the caller's RUN goes. */
void atap__sched_finish(struct atap_slot *s, struct sched *c, uint32_t gen);
/* schedule.c. The deadline came before the first run: ran out unrun. */
void atap__sched_ran_out_unrun(struct atap_slot *s, struct sched *c, uint32_t gen);
/* schedule_read.c. The run timeout of a scheduled task (an at-rate run takes
 * its series'). */
uint64_t atap__sched_timeout(struct atap_slot *s);
/* schedule_read.c. The publisher's side of out_lock (writes the slot's output). */
void atap__sched_out_write_lock(struct sched *c);
void atap__sched_out_write_unlock(struct sched *c);

/* rate.c. The manager's fire of a series' start timer: one run, and the
 * next period armed (the fire holds the series' RUN). */
void atap__rate_tick(struct sched *c);
/* rate.c. A run, published PENDING, joins its series' list: false if the
 * series was stopped (the run must not start). */
bool atap__rate_link(struct sched *c, uint32_t gen);
/* rate.c. The series pc, at its end state: every run of it stops, and none
 * linked later starts. Idempotent; takes runs_lock, so call it with no lock
 * held. */
void atap__rate_stop_runs(struct sched *pc);
/* rate.c. A run returned rc: its output goes to the series, or it ends it. */
void atap__rate_run_done(struct atap_slot *s, struct sched *c, uint32_t gen, int rc);
/* rate.c. A run is over: off its series' list, its slot goes, and the last
 * run done after RUN_OWED drops the series' RUN. */
void atap__rate_run_gone(struct atap_slot *s, struct sched *c, uint32_t gen);
/* rate.c. A run's series' slot. */
struct atap_slot *atap__rate_series_slot(struct sched *c);

#endif

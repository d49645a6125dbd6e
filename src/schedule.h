/*
 * Tasks that use time: start delays, run timeouts and repeats (schedule.c),
 * and at-rate series (rate.c).
 * A plain one-shot has no schedule (slot->ext is NULL) and never comes here.
 */
#ifndef ATAP_SCHEDULE_H
#define ATAP_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "atap.h"
#include "slot.h"
#include "timer.h"

struct atap_timer;
struct worker;

/* What the executor calls (extras.h): the entries named there. */
struct atap__extras_time;
extern const struct atap__extras_time atap__sched_extras;

/* 0, ATAP_EINVAL for a combination that makes no sense, -ENOTSUP. */
int atap__sched_check(const atap_spawn_opts *o);
struct gate;

/* Gives a freshly filled slot its schedule (s->ext); gate: a task that
 * waits for gives (the schedule owns the gate from here). 0 or -ENOMEM
 * (the gate is then still the caller's). */
int atap__sched_attach(struct atap_slot *s, uint32_t index, const atap_spawn_opts *o,
                       struct gate *gate);
/* A give started something (gate.c; the gate was idle and hands over
 * the RUN reference): a run, or a series, after the start delay if any. */
void atap__sched_kick(struct atap_slot *s, uint32_t index, uint32_t gen);
/* The gate of a task that waits for gives, or NULL (also for no schedule). */
struct gate *atap__sched_gate(struct atap_slot *s);
/* Inside a run: the value it was handed (NULL if it waits for nothing). */
const void *atap__sched_input(struct atap_slot *s, size_t *size);
/* The number of the output readable now (read under the read lock). */
uint64_t atap__sched_pubs(struct atap_slot *s);
/* Under the gate's lock: a give started a run or a series of a waiting
 * task, or owed one more run: READY or TAKEN goes back to PENDING, so a
 * join waits for what it started. */
void atap__sched_restarting(struct atap_slot *s, uint32_t gen);
/* No run follows (a waiting task let go): atap_finished turns true. */
void atap__sched_mark_finished(struct atap_slot *s);
/* The task's RUN reference (generation gen) is about to go for good: its
 * gate takes no more gives. True when it must stay for now: an at-rate
 * series with runs under way keeps it until the last of them is done
 * (rate.c), and the caller leaves it alone. */
bool atap__sched_ending(struct atap_slot *s, uint32_t gen);
/* The task is about to read FAILED (not through a run of its own): an
 * at-rate series fixes its code first (rate.c). */
void atap__sched_failing(struct atap_slot *s);
/* The task is an at-rate series (its runs overlap, in slots of their own). */
bool atap__sched_at_rate(struct atap_slot *s);
/* The slot is published PENDING with its RUN reference: queue it, or arm
 * its start delay. */
void atap__sched_start(struct atap_slot *s, uint32_t index, uint32_t gen, bool blocking);

/* exec_run's half for a scheduled task. claim: takes a run (false: there is
 * nothing to run and the RUN reference has been dealt with); output: where
 * the run writes; done: publishes and queues or arms the next run, or ends
 * the series. */
bool atap__sched_claim(struct atap_slot *s, uint32_t *gen);
void *atap__sched_output(struct atap_slot *s);
void atap__sched_done(struct atap_slot *s, uint32_t gen, int rc);

/* An at-rate run's series (its handle's index and generation): false for
 * any other scheduled task. */
bool atap__sched_series(struct atap_slot *s, uint32_t *index, uint32_t *gen);

/* A cancel that won: stops a pending delay or gap. */
void atap__sched_cancelled(struct atap_slot *s, uint32_t index, uint32_t gen);
/* atap_cancel's rule for a scheduled task: whether state may still be
 * cancelled (a repeat between runs, not finished, may). */
bool atap__sched_cancellable(struct atap_slot *s, uint32_t state);
/* Whether the task will not run again. */
bool atap__sched_finished(struct atap_slot *s, uint32_t state);
/* A series (a repeat, or a task that waits for gives) that ran out: its
 * taken output reads ATAP_EFINISHED, not ATAP_ETAKEN. */
bool atap__sched_ran_out(struct atap_slot *s);

/* Reading a repeat's output: the output is rewritten by every run, so a
 * reader holds it against the publisher. */
void atap__sched_read_lock(struct atap_slot *s);
void atap__sched_read_unlock(struct atap_slot *s);

/* Manager only, after each pass over the timers: queues the runs it fired. */
void atap__sched_flush(void);

/* Lets go of the schedule when the slot goes (freed by the manager, once
 * its timer structure no longer holds the records). */
void atap__sched_destroy(struct atap_slot *s);
/* Manager only (or with no manager running and the structure emptied, with
 * all): frees the schedules let go of that nothing holds any more. */
void atap__sched_reap(bool all);
void atap__sched_forget(void); /* in a fork's child only (runtime.c) */

/* The manager's timers are being let go of (shutdown, or the manager gone
 * for good): each task they would have started again ends FAILED. For
 * atap__timers_take_all. */
void atap__sched_write_off(struct atap_timer *t, void *arg);
/* Supervisor, between two managers' lives: visits every schedule's timer
 * records, found from the task table. */
void atap__sched_find_timers(atap__timer_visit *visit, void *cookie);

#endif

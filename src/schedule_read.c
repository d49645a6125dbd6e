/*
 * A scheduled task as its readers and its cancellers see it (schedule.c
 * has the rest): the lock over a series' output, and the questions asked
 * of a task that may run again (may it still be cancelled, is it
 * finished, did it run out).
 *
 * The output lock (`out_lock`, a spin reader-writer word): readers count
 * up while no writer holds it, the publisher (schedule.c's publish, rate.c)
 * takes OUT_WRITER once the readers are out. Either side waiting pauses,
 * then yields, since the publisher also delivers the output to forwards
 * under it. A one-shot with no gate publishes once, before its readers can
 * see READY, and takes no lock. The acquire on taking either side and the
 * release on letting go order a reader's copy against the next publish.
 */
#include "schedule.h"

#include "atomics.h"
#include "dataflow.h"
#include "executor.h"
#include "hub.h"
#include "schedule_int.h"
#include "slot.h"
#include "timer.h"

/* No run follows and, at a rate, none is under way: the output stands. */
static bool series_over(struct sched *c)
{
    return ld_acquire(&c->finished) &&
           (c->kind != ATAP_AT_RATE || (ld_acquire(&c->inflight) & ~RUN_OWED) == 0);
}

/* The publisher's side of out_lock: waits out the readers, keeps new ones
 * off. Acquire: the last reader's copy is done before we overwrite. */
void atap__sched_out_write_lock(struct sched *c)
{
    uint32_t unlocked = 0;
    unsigned spins = 0;

    while (!casw_acquire(&c->out_lock, &unlocked, OUT_WRITER)) {
        unlocked = 0;
        spin_pause(&spins);
    }
}

/* Release: the new output is whole before a reader can get in. */
void atap__sched_out_write_unlock(struct sched *c) { st_release(&c->out_lock, 0); }

/* ---- cancelling, reading ------------------------------------------------- */

uint64_t atap__sched_timeout(struct atap_slot *s) { return sched_of(s)->timeout; }

bool atap__sched_cancellable(struct atap_slot *s, uint32_t state)
{
    struct sched *c = sched_of(s);

    if (state == ST_PENDING || state == ST_RUNNING)
        return true;
    /* A series between runs, or at a rate with a run still out. */
    return (c->kind != ATAP_ONCE || c->gate) && (state == ST_READY || state == ST_TAKEN) &&
           !series_over(c);
}

void atap__sched_cancelled(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct sched *c = sched_of(s);

    if (c->kind == ATAP_AT_RATE)
        atap__rate_stop_runs(c); /* before RUN can go: the caller's hold keeps c */
    /* A pending delay or gap: whoever wins fire-or-disarm owns RUN. */
    if (atap__timer_disarm(atap__hub_timers(), &c->start))
        atap__exec_release_run(s, index, gen);
    else if (c->gate) /* waiting for a give: its gate holds RUN */
        atap__gate_cancelled(s, index, gen);
}

bool atap__sched_finished(struct atap_slot *s, uint32_t state)
{
    struct sched *c = sched_of(s);

    if (state == ST_CANCELLED || state == ST_TIMED_OUT || state == ST_FAILED)
        return true;
    return state_terminal(state) && ((c->kind == ATAP_ONCE && !c->gate) || series_over(c));
}

bool atap__sched_ran_out(struct atap_slot *s)
{
    struct sched *c = sched_of(s);

    return (c->kind != ATAP_ONCE || c->gate) && series_over(c);
}

void atap__sched_read_lock(struct atap_slot *s)
{
    struct sched *c = sched_of(s);
    uint32_t cur = ld_relaxed(&c->out_lock);
    unsigned spins = 0;

    if (c->kind == ATAP_ONCE && !c->gate)
        return;
    for (;;) {
        if (!(cur & OUT_WRITER) && casw_acquire(&c->out_lock, &cur, cur + 1))
            return;
        spin_pause(&spins); /* a writer may be delivering forwards */
        cur = ld_relaxed(&c->out_lock);
    }
}

void atap__sched_read_unlock(struct atap_slot *s)
{
    struct sched *c = sched_of(s);

    if (c->kind != ATAP_ONCE || c->gate)
        sub_release(&c->out_lock, 1);
}

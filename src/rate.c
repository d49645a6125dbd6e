/*
 * Tasks at a rate (ATAP_AT_RATE): a series and its runs. schedule.c owns
 * the series' schedule, its timers, its claims and its readers; this file
 * owns what is the series' alone: its tick (a run started each period), a
 * run's link to its series, the count and the list of the runs under way,
 * their stop, and a run's end (its output published as the series' own,
 * or the series ended by its failure or timeout, with its fail code).
 *
 * An at-rate series starts each run in a slot of its own (no handle), and
 * runs overlap. The series' RUN reference outlives its runs: `inflight`
 * counts the runs started and not yet done, and RUN_OWED is set by whoever
 * drops the series' RUN (atap__sched_ending, from atap__exec_release_run).
 * If runs are under way that drop waits, and the last run to end makes it
 * (atap__rate_run_gone, from the run's end or from a claim that finds it
 * ended). Both sides are RMWs on the one word, so exactly one of them sees
 * the other: the dropper a count of 0, or the last run RUN_OWED | 1. Until
 * then the series' slot, its forwards and its output stay for the runs to
 * publish to, its handles count only handles, and it is not finished for
 * readers (series_over, schedule.c); a run that fails meanwhile leaves the
 * output standing.
 *
 * Whatever stops an at-rate series (a cancel, a run that fails or passes
 * its timeout, a write-off at shutdown or when the manager is gone) stops
 * each of its runs, wherever it is: a queued run never starts, a running
 * one reads atap_cancelled and its kernel wait is cut short, a parked one
 * is taken down. The series keeps its runs on a list under runs_lock: a run
 * is linked once published PENDING and before it is queued
 * (atap__sched_start), and atap__rate_run_gone unlinks it before its slot
 * goes. A stopper moves the series to its end state first; then, under the
 * lock, it sets runs_stopped and takes a hold on each run no stop took yet
 * (stop_seen), and cancels them after the lock as atap_cancel would (a park
 * taken down may end its run on the spot, and the run's end takes the
 * lock: hence the holds, and the batches). A run linked before a stopper's
 * pass is on the list it walks; one linked after finds runs_stopped and
 * ends unqueued: the lock orders the two. atap_cancel returns after its
 * pass, so no queued run starts after it returned. Lock order: runs_lock
 * is taken with nothing else held and nothing is taken under it.
 *
 * runs_lock guards the series' run_list and runs_stopped, and each linked
 * run's run_gen, run_prev, run_next and stop_seen. A run's `linked` is its
 * own: set as it is linked, read at its end, which the queue orders after.
 */
#include "schedule.h"

#include <errno.h>
#include <string.h>

#include "atomics.h"
#include "dataflow.h"
#include "executor.h"
#include "hub.h"
#include "pool.h"
#include "schedule_int.h"
#include "table.h"
#include "timer.h"
#include "wait.h"

/* ---- at a rate ------------------------------------------------------------ */

/* An at-rate run's series: its slot, and its schedule. */
struct atap_slot *atap__rate_series_slot(struct sched *c) { return atap__table_at(c->parent - 1); }

static struct sched *series_of(struct sched *c) { return sched_of(atap__rate_series_slot(c)); }

/* An at-rate series' fail code is written once, by whichever comes first:
 * a run that failed (atap__rate_run_done, its own code) or another path to
 * FAILED (atap__sched_failing, EFAILED's); each before the CAS that
 * publishes FAILED (a release), so every reader, reading after it, reads
 * the one code. Relaxed: the publishing CAS orders it; runs race only each
 * other. */
static void series_fail_code(struct atap_slot *p, uint8_t code)
{
    cas_plain_relaxed(&p->fail_code, &(uint8_t){0}, code);
}

void atap__sched_failing(struct atap_slot *s)
{
    if (sched_of(s)->kind == ATAP_AT_RATE)
        series_fail_code(s, (uint8_t)fail_code_of(ATAP_EFAILED));
}

/* An at-rate series is about to queue one more run (its RUN held). */
static void run_started(struct atap_slot *p)
{
    /* Relaxed: the caller holds the series' RUN, and whoever drops it gets
     * it from us through an ordered hand-off (a timer, a gate, this thread). */
    add_relaxed(&sched_of(p)->inflight, 1);
}

/* A run belongs to its series p. 0 or -ENOMEM (a waiting series' run
 * copies its value). */
static int set_parent(struct atap_slot *s, struct atap_slot *p, uint32_t parent_index,
                      uint32_t parent_gen);

/* Starts one run of the series p (its RUN held): a slot of its own with
 * no handle, publishing into p, with p's function, argument, output and
 * timeout. The series keeps its RUN until the run is done. 0 or -ENOMEM. */
static int spawn_run(struct atap_slot *p, uint32_t pindex, uint32_t pgen)
{
    atap_spawn_opts o = {.out_size = p->out_size,
                         .out_free = slot_out_free(p),
                         .priority = p->priority,
                         .blocking = (p->flags & SF_BLOCKING) != 0,
                         .timeout_ns = atap__sched_timeout(p)};
    struct slot_cache *cache = atap__self ? &atap__self->cache : atap__table_outside_cache();
    uint32_t index, gen;
    struct atap_slot *s;
    int rc;

    if ((rc = atap__table_alloc(cache, &index, &gen)) != 0)
        return rc;
    s = atap__table_at(index);
    if ((rc = atap__exec_fill(s, p->fn, p->arg, &o)) != 0 ||
        (rc = atap__sched_attach(s, index, &o, NULL)) != 0 ||
        (rc = set_parent(s, p, pindex, pgen)) != 0) {
        if (slot_sched(s))
            atap__sched_destroy(s);
        atap__exec_unfill(s);
        st_relaxed(&s->word, make_word(gen, ST_FREE));
        atap__table_free(cache, index, gen);
        return rc;
    }
    run_started(p);
    st_relaxed(&s->refs, refs_of(gen) | REFS_RUN); /* no handle */
    st_release(&s->word, make_word(gen, ST_PENDING));
    atap__sched_start(s, index, gen, o.blocking);
    return 0;
}

/* The series is still going: not ended, not finished. */
static bool rate_live(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    uint32_t cur = ld_acquire(&s->word), st = word_state(cur);

    return word_gen(cur) == gen && (st == ST_PENDING || st == ST_READY || st == ST_TAKEN) &&
           !ld_acquire(&c->finished);
}

/* The manager's fire for an at-rate series (it holds the series' RUN):
 * start one run, then arm the next period, skipping periods already gone
 * (missed while the manager was down, say) rather than making them up. */
void atap__rate_tick(struct sched *c)
{
    struct atap_slot *s = atap__table_at(c->index);
    uint32_t gen = word_gen(ld_acquire(&s->word));
    uint64_t now = atap__now_ns(), next;

    if (!rate_live(s, c, gen)) { /* cancelled or ended by a run */
        atap__exec_release_run(s, c->index, gen);
        return;
    }
    if (c->done == 0 && c->for_ns)
        c->deadline = atap__deadline(now, c->for_ns);
    if (now > c->deadline) { /* the first period too (a late fire) */
        if (c->done == 0)
            atap__sched_ran_out_unrun(s, c, gen);
        else
            atap__sched_finish(s, c, gen);
        return;
    }
    c->done++;
    if (spawn_run(s, c->index, gen) != 0) {
        atap__exec_end(s, c->index, gen, ST_FAILED);
        return;
    }
    if (c->runs && c->done >= c->runs) {
        atap__sched_finish(s, c, gen);
        return;
    }
    /* Saturating: a period past the clock's end is never (ATAP__FOREVER). */
    next = atap__deadline(c->next_start, c->every);
    if (next <= now) {
        uint64_t skip = (now - next) / c->every + 1;

        next =
            skip > ATAP__FOREVER / c->every ? ATAP__FOREVER : atap__deadline(next, skip * c->every);
    }
    c->next_start = next;
    if (next > c->deadline)
        atap__sched_finish(s, c, gen);
    else
        atap__sched_arm(c, &c->start, next);
}

static int set_parent(struct atap_slot *s, struct atap_slot *p, uint32_t parent_index,
                      uint32_t parent_gen)
{
    struct sched *c = sched_of(s), *pc = sched_of(p);

    /* A waiting series: this run keeps a copy of the newest value, since
     * the runs overlap and a give may replace it meanwhile. */
    if (pc->gate && (c->input = atap__gate_snapshot(pc->gate, &c->input_size)) == NULL)
        return -ENOMEM;
    c->parent = parent_index + 1;
    c->parent_gen = parent_gen;
    return 0;
}

/* Run c, published PENDING and not yet queued, joins its series' list:
 * false if the series was stopped (the run must not start). */
bool atap__rate_link(struct sched *c, uint32_t gen)
{
    struct sched *pc = series_of(c);
    bool stopped;

    spin_lock(&pc->runs_lock);
    if (!(stopped = pc->runs_stopped)) {
        c->run_gen = gen;
        c->run_prev = NULL;
        c->run_next = pc->run_list;
        if (pc->run_list)
            pc->run_list->run_prev = c;
        pc->run_list = c;
        c->linked = true; /* read by atap__rate_run_gone, which the queue orders after */
    }
    spin_unlock(&pc->runs_lock);
    return !stopped;
}

/* The series pc has been moved to its end state: every run of it under way
 * is cancelled, and none linked later starts (top comment). Idempotent. */
#define STOP_BATCH 16
void atap__rate_stop_runs(struct sched *pc)
{
    struct atap_slot *slot[STOP_BATCH];
    uint32_t index[STOP_BATCH], gen[STOP_BATCH];
    unsigned n;

    do {
        n = 0;
        spin_lock(&pc->runs_lock);
        pc->runs_stopped = true;
        for (struct sched *r = pc->run_list; r && n < STOP_BATCH; r = r->run_next) {
            if (r->stop_seen)
                continue;
            r->stop_seen = true;
            /* Linked, so its RUN is not dropped yet: the hold lands. */
            slot[n] = atap__table_at(r->index);
            if (atap__exec_try_hold(slot[n], r->run_gen)) {
                index[n] = r->index;
                gen[n++] = r->run_gen;
            }
        }
        spin_unlock(&pc->runs_lock);
        for (unsigned k = 0; k < n; k++) {
            atap__exec_cancel(slot[k], index[k], gen[k]);
            atap__exec_release_listener(slot[k], index[k], gen[k]);
        }
    } while (n == STOP_BATCH);
}

bool atap__sched_series(struct atap_slot *s, uint32_t *index, uint32_t *gen)
{
    struct sched *c = sched_of(s);

    if (!c->parent)
        return false;
    *index = c->parent - 1;
    *gen = c->parent_gen;
    return true;
}

/* Ends the series from one of its runs (a failure or a timeout): the
 * pending period is disarmed, and whoever wins that owns the series' RUN. */
static void rate_end(struct atap_slot *p, struct sched *pc, uint32_t pgen, uint32_t to)
{
    uint32_t cur = ld_acquire(&p->word), st;
    /* The series already ran out (its RUN went, or waits for its runs): a
     * run under way that fails or times out leaves an output that stands,
     * and ends only a series that has none. */
    bool ran_out = ld_acquire(&pc->finished);

    do {
        st = word_state(cur);
        if (word_gen(cur) != pgen ||
            (st != ST_PENDING && (ran_out || (st != ST_READY && st != ST_TAKEN))))
            return;
    } while (!casw_acqrel(&p->word, &cur, make_word(pgen, to)));
    if (cur & ST_LISTENED)
        atap__exec_wake(p, cur);
    atap__rate_stop_runs(pc);
    if (atap__timer_disarm(atap__hub_timers(), &pc->start))
        atap__exec_release_run(p, pc->index, pgen);
    else if (pc->gate) /* back to waiting for a give: its gate holds RUN */
        atap__gate_cancelled(p, pc->index, pgen);
}

/* A run's output becomes the series' output, unless the series ended.
 * *copied: the bytes are the series' now, even if the state moved on
 * before they could be published (a cancel, another run's end, a give's
 * restart): the series lets go of them, never the run. */
static bool rate_publish(struct atap_slot *p, struct sched *pc, uint32_t pgen, void *out,
                         bool *copied)
{
    struct kicks after;
    uint32_t cur, st;
    bool ok;

    atap__kicks_init(&after);
    atap__sched_out_write_lock(pc);
    cur = ld_acquire(&p->word);
    st = word_state(cur);
    ok = word_gen(cur) == pgen && (st == ST_PENDING || st == ST_READY || st == ST_TAKEN);
    if (ok && p->out_size) {
        /* Replaced before anyone took it: READY, or kept through a restart
         * (PENDING again after a give); a take cleared filled. */
        if (p->filled && slot_out_free(p))
            slot_out_free(p)(slot_out(p));
        memcpy(slot_out(p), out, p->out_size);
        p->filled = 1;
        *copied = true;
    }
    if (ok)
        pc->pubs++;
    if (ok && (ok = atap__exec_stop(p, pgen, st, ST_READY)))
        atap__flow_publish(p, pc->pubs, &after);
    atap__sched_out_write_unlock(pc);
    atap__flow_kicks_run(&after);
    return ok;
}

/* An at-rate run is over: its slot goes, and the last run done after the
 * series' RUN was dropped drops it now (top comment). Past the RMW the
 * series may be freed: nothing of it is read after. */
void atap__rate_run_gone(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    uint32_t pindex = c->parent - 1, pgen = c->parent_gen;
    struct atap_slot *p = atap__table_at(pindex);
    struct sched *pc = sched_of(p);

    if (c->linked) {
        spin_lock(&pc->runs_lock);
        if (c->run_prev)
            c->run_prev->run_next = c->run_next;
        else
            pc->run_list = c->run_next;
        if (c->run_next)
            c->run_next->run_prev = c->run_prev;
        spin_unlock(&pc->runs_lock);
        c->linked = false;
    }
    atap__exec_release_run(s, c->index, gen); /* no handle: this frees s and c */
    if (sub_acqrel(&pc->inflight, 1) == (RUN_OWED | 1))
        atap__exec_release_run(p, pindex, pgen);
}

void atap__rate_run_done(struct atap_slot *s, struct sched *c, uint32_t gen, int rc)
{
    struct atap_slot *p = atap__table_at(c->parent - 1);
    struct sched *pc = sched_of(p);
    uint32_t cur = ld_acquire(&s->word);
    bool copied = false;

    if (word_state(cur) == ST_CANCELLED) { /* its series stopped (atap__rate_stop_runs) */
        if (rc == 0)
            s->filled = 1;                        /* nobody will read it: dropped at free */
    } else if (word_state(cur) == ST_TIMED_OUT) { /* the first run past its limit */
        if (rc == 0)
            s->filled = 1; /* dropped at free */
        rate_end(p, pc, c->parent_gen, ST_TIMED_OUT);
    } else if (rc != 0) {
        atap__exec_stop(s, gen, ST_RUNNING, ST_FAILED);
        /* The series reads its first failed run's code (a plain failure's
         * as EFAILED's), fixed before rate_end publishes FAILED. */
        series_fail_code(p, s->fail_code ? s->fail_code : (uint8_t)fail_code_of(ATAP_EFAILED));
        rate_end(p, pc, c->parent_gen, ST_FAILED);
    } else if (rate_publish(p, pc, c->parent_gen, slot_out(s), &copied) || copied) {
        atap__exec_stop(s, gen, ST_RUNNING, ST_TAKEN); /* the series has it now */
    } else {
        s->filled = 1; /* nobody will read it: dropped at free */
        atap__exec_stop(s, gen, ST_RUNNING, ST_READY);
    }
    atap__rate_run_gone(s, c, gen);
}

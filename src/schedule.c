/*
 * Tasks that use time: a start delay (after_ns), a limit on each run
 * (timeout_ns), and repeats (ATAP_REPEAT: back to back, or every_ns from one
 * run's end to the next start, bounded by runs, for_ns or until_ns).
 *
 * A scheduled task has a `struct sched` on its side record (side.h) with two timer records
 * on the manager's structure: `start` (a delay or a gap; its fire queues the
 * next run) and `limit` (the run timeout; its fire ends the task TIMED_OUT).
 *
 * Who holds the RUN reference (slot.h): exactly one of the queue entry, the
 * armed `start` timer, or the thread running the task. It passes along that
 * chain and is dropped by whoever ends the series: the runner (runs used up,
 * deadline passed, failure, cancel or timeout seen at the end of a run),
 * the popper of a cancelled queued entry (executor), the canceller that
 * disarms a pending `start` (atap__sched_cancelled: exactly one of fire and
 * disarm wins), or the write-off of a timer the manager lets go of.
 *
 * States of a repeat: PENDING until the first run, RUNNING during a run,
 * READY or TAKEN between runs (the last output readable), and one of
 * CANCELLED, TIMED_OUT, FAILED at an end that is not the series running
 * out. Claiming a run is a CAS from PENDING, READY or TAKEN to RUNNING, and
 * only a scheduled task's queue entry ever does it from READY or TAKEN.
 * `finished` is set before the RUN reference is dropped and never cleared.
 *
 * Deadlines bind every run, the first included: no claim and no at-rate
 * fire starts a run past `deadline`. A series whose first run could not
 * start by then (until_ns passed at spawn or at a give, a start delay
 * that ends past it, a queue wait that took it past) ran out unrun: it is
 * marked finished, then PENDING -> TAKEN (a series that ran out with
 * nothing to read: ATAP_EFINISHED to readers), at spawn when the delay
 * already says so (starts_too_late), else where the run would start.
 *
 * A repeat's run writes into `scratch`; publishing copies it to the slot's
 * output under `out_lock` (schedule_read.c: readers count up, the
 * publisher holds WRITER; either side waiting pauses, then yields, since
 * the publisher also delivers the output to forwards under it), so a join
 * or take never reads a half-written output, and a take that moved an
 * output out is never overwritten by the copy it saw (it checks READY and
 * moves to TAKEN under the read lock). A run stopped meanwhile (cancelled,
 * timed out) publishes nothing, and its scratch output goes to out_free
 * at once: every output is taken or let go of, exactly once.
 *
 * When the manager stops taking timers (shutdown, or its supervisor gave
 * up), an arm that lands afterwards is disarmed again by its caller, and
 * whoever wins that disarm writes the task off: no task waits on a timer
 * nobody will fire.
 *
 * A task that waits for gives (gate.c) always has a schedule, with its
 * gate in `gate`. Its output is rewritten by each run like a repeat's, so it
 * publishes the same way. Between runs or series its gate holds the RUN
 * reference; a give that starts something hands it to atap__sched_kick, and
 * where a repeat would end its series (atap__sched_finish) the gate decides
 * whether the task waits again, starts again, or ends.
 *
 * An at-rate series (rate.c) starts each run in a slot of its own, and its
 * RUN reference outlives its runs: whoever drops it (atap__sched_ending)
 * leaves it to the last run under way, if any (RUN_OWED). Whatever stops
 * the series stops each of its runs. rate.c says how.
 */
#include "schedule.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atomics.h"
#include "dataflow.h"
#include "executor.h"
#include "extras.h"
#include "faults.h"
#include "hub.h"
#include "park.h"
#include "pool.h"
#include "schedule_int.h"
#include "side.h"
#include "table.h"
#include "timer.h"
#include "trace.h"
#include "wait.h"

/* Each run rewrites the output, so runs write to scratch and publish. */
static bool rewrites(const struct sched *c) { return c->kind == ATAP_REPEAT || c->gate != NULL; }

static struct sched *start_owner(struct atap_timer *t)
{
    return (struct sched *)((char *)t - offsetof(struct sched, start));
}

static struct sched *limit_owner(struct atap_timer *t)
{
    return (struct sched *)((char *)t - offsetof(struct sched, limit));
}

/* ---- checking and attaching -------------------------------------------- */

int atap__sched_check(const atap_spawn_opts *o)
{
    bool repeats = o->kind == ATAP_REPEAT || o->kind == ATAP_AT_RATE;

    if (o->kind != ATAP_ONCE && !repeats)
        return ATAP_EINVAL;
    if (!repeats && (o->every_ns || o->runs || o->for_ns || o->until_ns))
        return ATAP_EINVAL;
    if (o->for_ns && o->until_ns)
        return ATAP_EINVAL;
    if (o->kind == ATAP_AT_RATE)
        return o->every_ns == 0 ? ATAP_EINVAL : 0;
    return 0;
}

static void fire_start(struct atap_timer *t);
static void fire_limit(struct atap_timer *t);

int atap__sched_attach(struct atap_slot *s, uint32_t index, const atap_spawn_opts *o,
                       struct gate *gate)
{
    struct sched *c = calloc(1, sizeof *c);
    struct side *side;

    if (!c)
        return -ENOMEM;
    c->gate = gate;
    c->kind = (uint8_t)o->kind;
    if (rewrites(c) && o->out_size && !(c->scratch = malloc(o->out_size))) {
        free(c);
        return -ENOMEM;
    }
    atap__timer_init(&c->start, fire_start);
    atap__timer_init(&c->limit, fire_limit);
    c->index = index;
    c->kind = (uint8_t)o->kind;
    c->blocking = o->blocking;
    c->after = o->after_ns;
    c->every = o->every_ns;
    c->timeout = o->timeout_ns;
    c->for_ns = o->for_ns;
    c->deadline = o->until_ns ? o->until_ns : UINT64_MAX;
    c->runs = o->runs;
    if (!(side = atap__side_of(s))) {
        free(c->scratch);
        free(c);
        return -ENOMEM;
    }
    /* Release: the schedule is whole before the rebuild can find it. */
    st_release(&side->ext, c);
    s->flags |= SF_SCHED; /* the slot is not published yet */
    if (gate)
        atap__gate_bind(gate, index);
    return 0;
}

/*
 * Freeing. A disarmed timer record may still be linked in the manager's
 * structure until the manager meets it, so a schedule whose slot is gone
 * goes to the graveyard (a Treiber stack), and the manager frees it once
 * the structure no longer holds either record and no arm is under way on
 * it (atap__sched_reap). When no manager will run again (the structure was
 * emptied by take_all), one that nothing holds is freed at once.
 */
static _Atomic(struct sched *) graveyard;
static struct sched *mourning; /* manager only: still held at the last look */

/* Something may still reach c: the timer structure holds one of its
 * records, or an arm is under way (acquire: pairs with arm's release). */
static bool held(struct sched *c)
{
    return atap__timer_held(&c->start) || atap__timer_held(&c->limit) ||
           ld_acquire(&c->arming) != 0;
}

static void sched_free(struct sched *c)
{
    free(c->scratch);
    free(c->input);
    free(c);
}

void atap__sched_destroy(struct atap_slot *s)
{
    struct sched *c = sched_of(s);
    struct sched *head = ld_relaxed(&graveyard);

    st_relaxed(&slot_side(s)->ext, NULL); /* freed with the slot, unseen by the rebuild (held) */
    if (c->gate) {                        /* nothing but the slot reaches the gate */
        atap__gate_destroy(c->gate);
        c->gate = NULL;
    }
    /* No manager will run again: the structure was emptied when it gave up
     * (the supervisor published that with GONE), and only an arm that came
     * after can still sit in its inbox, until shutdown lets go of it. Or
     * the runtime stopped (a handle released after shutdown, or a task the
     * drain ended): the structure is gone, only an arm under way counts. */
    if ((atap__hub_gone() && !held(c)) || (atap__hub_stopped() && ld_acquire(&c->arming) == 0)) {
        sched_free(c);
        return;
    }
    /* Records left filed for a disarmed deadline (a cancelled delay, a run
     * that beat its timeout) are let go of at the manager's next run, not
     * at that deadline: the reaper frees c then. */
    if (atap__hub_accepting()) {
        atap__timer_forget(atap__hub_timers(), &c->start);
        atap__timer_forget(atap__hub_timers(), &c->limit);
    }
    do
        c->grave_next = head;
    while (!casw_release(&graveyard, &head, c));
}

void atap__sched_reap(bool all)
{
    struct sched *c = xchg_acquire(&graveyard, NULL), *next;

    while (mourning) { /* last look's leftovers first */
        next = mourning->grave_next;
        mourning->grave_next = c;
        c = mourning;
        mourning = next;
    }
    for (; c; c = next) {
        next = c->grave_next;
        if (!all && held(c)) {
            c->grave_next = mourning;
            mourning = c;
            continue;
        }
        /* The structure is gone (all), but an arm may still be finishing:
         * its slot is freed, so no new one can start, and arm never waits. */
        while (ld_acquire(&c->arming) != 0)
            sched_yield();
        sched_free(c);
    }
}

/* ---- timers ------------------------------------------------------------- */

/* Every schedule's two records, found from the task table, for the
 * supervisor's rebuild of the timer structure (atap__timers_rebuild). While
 * we look, no side record is freed (atap__exec_sides_keep: one read with
 * seq_cst stays allocated), and a schedule found on one stays allocated:
 * only the reaper frees one (the manager, which is not running, or the
 * supervisor, which is calling this), and a slot let go of meanwhile sends
 * its schedule to the graveyard. Visiting a record that is not armed costs
 * nothing. */
void atap__sched_find_timers(atap__timer_visit *visit, void *cookie)
{
    size_t span = atap__table_span();

    atap__exec_sides_keep();
    for (size_t i = 0; i < span; i++) {
        struct atap_slot *s = atap__table_slot((uint32_t)i);
        struct side *side = s ? ld_seqcst(&s->side) : NULL;
        /* Acquire: the schedule attach published whole. */
        struct sched *c = side ? ld_acquire(&side->ext) : NULL;

        if (c) {
            visit(&c->start, cookie);
            visit(&c->limit, cookie);
        }
    }
    atap__exec_sides_let_go();
}

/* Ends a task whose next run will never come: FAILED unless it already
 * ended otherwise, then its RUN reference goes. */
static void write_off(struct sched *c)
{
    struct atap_slot *s = atap__table_at(c->index);
    uint32_t gen = word_gen(ld_acquire(&s->word));

    atap__exec_end(s, c->index, gen, ST_FAILED);
}

/* An injected pause (faults.h), taken by the next arm of a start record. */
static void fault_pause(void)
{
    unsigned ms = FAULT_ARM_PAUSE_MS();

    if (ms) {
        struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000};

        nanosleep(&d, NULL);
    }
}

/* Arms t; if the manager no longer takes timers and the disarm wins, the
 * caller's RUN reference is written off instead (start) or simply unneeded
 * (limit). Returns whether t stays armed. */
bool atap__sched_arm(struct sched *c, struct atap_timer *t, uint64_t deadline)
{
    struct atap_timers *ts = atap__hub_timers();

    /* An arm of `start` hands the caller's RUN to the timer: from then on a
     * manager closing for good may take the record, write the task off and
     * let its last handle free the schedule while we still look at the
     * record below. Counted in `arming` first (the arm's release CAS
     * carries the count to whoever frees), so the free waits for us. */
    add_relaxed(&c->arming, 1);
    if (atap__timer_arm(ts, t, deadline))
        atap__hub_wake();
    if (t == &c->start)
        fault_pause();
    /* seq_cst handshake with the manager's close: it marks itself closed,
     * then takes every record; we armed, then look. One of us sees the
     * other, and take_all and disarm decide between them who owns it. */
    fence_seqcst();
    if (atap__hub_accepting() || !atap__timer_disarm(ts, t)) {
        /* Release: our last look at c comes before a free that sees 0. */
        sub_release(&c->arming, 1);
        return true;
    }
    /* The disarm won: RUN is ours again, and c with it until write_off. */
    sub_release(&c->arming, 1);
    if (t == &c->start)
        write_off(c);
    return false;
}

/* Runs the manager's fires queue up here and go to the pool in one batch
 * after the pass (atap__sched_flush): one CAS and one wake check for a
 * burst of due timers instead of one each. Manager thread only. */
#define FIRED_BATCH 256
static uint32_t fired[FIRED_BATCH];
static unsigned nfired;

void atap__sched_flush(void)
{
    atap__pool_submit_batch(fired, nfired);
    nfired = 0;
}

static void fire_start(struct atap_timer *t)
{
    struct sched *c = start_owner(t);

    if (c->kind == ATAP_AT_RATE) {
        atap__rate_tick(c);
    } else if (c->blocking) {
        atap__pool_submit_as(c->index + 1, atap__table_at(c->index)->priority, true, true);
    } else {
        if (nfired == FIRED_BATCH)
            atap__sched_flush();
        fired[nfired++] = c->index + 1;
    }
}

static void fire_limit(struct atap_timer *t)
{
    struct sched *c = limit_owner(t);
    struct atap_slot *s = atap__table_at(c->index);
    uint32_t gen = ld_acquire(&c->running_gen);

    /* Only the run it was armed for, and only if still running: RUNNING ->
     * TIMED_OUT, and readers see it at once. The run ends unseen; a kernel
     * wait or a park it is in is cut short. */
    if (atap__exec_stop(s, gen, ST_RUNNING, ST_TIMED_OUT) && atap__exec_try_hold(s, gen)) {
        /* Held: the run may end and free the slot the moment it is stopped. */
        atap__park_interrupt(s, c->index, gen);
        atap__exec_release_listener(s, c->index, gen);
    }
}

void atap__sched_write_off(struct atap_timer *t, void *arg)
{
    (void)arg;
    if (t->fire == fire_start)
        write_off(start_owner(t));
    /* A limit timer's run is under way: its runner ends it. */
}

static bool starts_too_late(struct atap_slot *s, struct sched *c, uint32_t gen);

void atap__sched_start(struct atap_slot *s, uint32_t index, uint32_t gen, bool blocking)
{
    struct sched *c = sched_of(s);

    if (c->parent && !atap__rate_link(c, gen)) { /* an at-rate run of a stopped series */
        atap__exec_stop(s, gen, ST_PENDING, ST_CANCELLED);
        atap__rate_run_gone(s, c, gen);
        return;
    }
    if (c->gate)
        return; /* its first give starts it (atap__sched_kick) */
    if (starts_too_late(s, c, gen))
        return;                    /* settled at spawn: nothing will ever run */
    if (c->kind == ATAP_AT_RATE) { /* the series itself never runs: its timer
                                      starts a fresh run every period */
        c->next_start = atap__deadline_in(c->after);
        atap__sched_arm(c, &c->start, c->next_start);
    } else if (c->after) {
        atap__sched_arm(c, &c->start, atap__deadline_in(c->after));
    } else {
        atap__pool_submit(index + 1, s->priority, blocking);
    }
}

void atap__sched_kick(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct sched *c = sched_of(s);
    bool outside;

    /* A start is admitted as a spawn is: from a pool thread always (a busy
     * one keeps a shutdown's drain from ending, so its run is part of the
     * work drained), from any other thread only while the runtime runs (a
     * shutdown waits for it to be queued). Refused, or with the pool gone
     * (a shutdown's last let-go), nothing starts. A delay or period armed
     * on a closed manager is written off. */
    if (atap__pool_stopped() || !atap__spawn_enter(&outside)) {
        atap__exec_end(s, index, gen, ST_FAILED);
        return;
    }
    TEST_HOOK(ATAP__TEST_KICK);
    /* The gate was idle: nothing else touches the series' counters now
     * (its lock ordered the last run's writes before ours). */
    c->done = 0;
    c->deadline = c->for_ns ? UINT64_MAX : c->deadline;
    if (starts_too_late(s, c, gen)) {
        /* Nothing of this series will run, nor of any later one. */
    } else if (c->kind == ATAP_AT_RATE) {
        c->next_start = atap__deadline_in(c->after);
        atap__sched_arm(c, &c->start, c->next_start);
    } else if (c->after) {
        atap__sched_arm(c, &c->start, atap__deadline_in(c->after));
    } else {
        atap__pool_submit(index + 1, s->priority, c->blocking);
    }
    atap__spawn_exit(outside);
}

/* ---- a run -------------------------------------------------------------- */

static bool may_claim(struct sched *c, uint32_t state)
{
    if (state == ST_PENDING)
        return true;
    return rewrites(c) && (state == ST_READY || state == ST_TAKEN) && !ld_acquire(&c->finished);
}

/* Ends the series with its last output standing: no run follows. A task
 * that waits for gives asks its gate first: it may wait, or start again. */
void atap__sched_finish(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    if (c->gate && atap__gate_after(s, c->index, gen))
        return;
    st_release(&c->finished, true);
    atap__exec_release_run(s, c->index, gen);
}

/* The deadline came before the series' first run (until_ns passed, or a
 * start delay or a queue wait took it past): no run starts, and the series
 * ran out with nothing of its own to read: TAKEN, which a reader of a
 * series that ran out reads as ATAP_EFINISHED (atap__sched_ran_out), or
 * READY again when a give's restart kept the last series' output. Only an
 * absolute deadline (until_ns) gets here (for_ns counts from the first
 * run), so no later series could run either: a waiting task's gate takes
 * no more gives. Marked finished before the state moves, so no reader sees
 * TAKEN without it. The caller holds RUN, and the state is PENDING unless
 * a cancel came first (then it stays so). */
void atap__sched_ran_out_unrun(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    bool kept = c->out_kept;

    c->out_kept = false;
    if (c->gate)
        atap__gate_end(c->gate);
    st_release(&c->finished, true);
    atap__exec_stop(s, gen, ST_PENDING, kept ? ST_READY : ST_TAKEN);
    atap__sched_finish(s, c, gen);
}

/* A series whose first run could only start past its deadline, given the
 * start delay still to wait: true when it was ended so (atap__sched_ran_out_unrun). */
static bool starts_too_late(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    if (c->deadline == UINT64_MAX || atap__deadline_in(c->after) <= c->deadline)
        return false;
    atap__sched_ran_out_unrun(s, c, gen);
    return true;
}

bool atap__sched_claim(struct atap_slot *s, uint32_t *gen_out)
{
    struct sched *c = sched_of(s);
    uint32_t cur = ld_acquire(&s->word), gen = word_gen(cur);
    /* The clock only for what needs it: a deadline, a limit. */
    uint64_t now = c->deadline != UINT64_MAX || c->for_ns || c->timeout ? atap__now_ns() : 0;

    /* A run that would start past the deadline never starts, the first
     * one included (it waited in the queue past it). */
    if (now > c->deadline && may_claim(c, word_state(cur))) {
        if (c->done == 0)
            atap__sched_ran_out_unrun(s, c, gen);
        else
            atap__sched_finish(s, c, gen);
        return false;
    }
    /* An at-rate run of a series stopped meanwhile never starts. A stop
     * that comes after this look reaches the run through its list. */
    if (c->parent && state_stopped(word_state(ld_acquire(&atap__rate_series_slot(c)->word))))
        atap__exec_stop(s, gen, ST_PENDING, ST_CANCELLED);
    do {
        if (!may_claim(c, word_state(cur))) { /* ended while queued */
            if (c->parent)
                atap__rate_run_gone(s, c, gen); /* an at-rate run: its series counts it */
            else
                atap__exec_release_run(s, c->index, gen);
            return false;
        }
    } while (!casw_acqrel(&s->word, &cur, (cur & ~ST_MASK) | ST_RUNNING));
    c->out_live = word_state(cur) == ST_READY || c->out_kept;
    c->out_kept = false;
    if (c->gate)
        atap__gate_claim(c->gate); /* the newest value becomes this run's */
    if (c->done == 0 && c->for_ns)
        c->deadline = atap__deadline(now, c->for_ns);
    c->limit_armed = false;
    if (c->timeout) {
        st_release(&c->running_gen, gen);
        c->limit_at = atap__deadline(now, c->timeout);
        c->limit_armed = atap__sched_arm(c, &c->limit, c->limit_at);
    }
    *gen_out = gen;
    return true;
}

void *atap__sched_output(struct atap_slot *s)
{
    struct sched *c = sched_of(s);

    return rewrites(c) ? c->scratch : slot_out(s);
}

const void *atap__sched_input(struct atap_slot *s, size_t *size)
{
    struct sched *c = sched_of(s);

    if (c->parent) {
        *size = c->input_size;
        return c->input;
    }
    return c->gate ? atap__gate_current(c->gate, size) : NULL;
}

struct gate *atap__sched_gate(struct atap_slot *s)
{
    return slot_sched(s) ? sched_of(s)->gate : NULL;
}

uint64_t atap__sched_pubs(struct atap_slot *s)
{
    struct sched *c = sched_of(s);

    return rewrites(c) || c->kind == ATAP_AT_RATE ? c->pubs : 1;
}

void atap__sched_restarting(struct atap_slot *s, uint32_t gen)
{
    struct sched *c = sched_of(s);
    uint32_t cur = ld_acquire(&s->word), st;

    /* Under the gate's lock, which just went BUSY or OWED: no run claims
     * before the kick that follows the lock, and a run under way writes
     * out_kept only under the lock too (atap__gate_publish). */
    do {
        st = word_state(cur);
        if (word_gen(cur) != gen || (st != ST_READY && st != ST_TAKEN))
            return;
    } while (!casw_acqrel(&s->word, &cur, (cur & ~ST_MASK) | ST_PENDING));
    c->out_kept = st == ST_READY; /* still the slot's to let go of */
}

void atap__sched_mark_finished(struct atap_slot *s) { st_release(&sched_of(s)->finished, true); }

bool atap__sched_ending(struct atap_slot *s, uint32_t gen)
{
    struct sched *c = sched_of(s);

    if (c->gate)
        atap__gate_end(c->gate);
    if (c->kind != ATAP_AT_RATE)
        return false;
    /* Ended otherwise than by running out (a write-off at shutdown, or with
     * the manager gone): its runs under way stop too. Before RUN_OWED is
     * set, while our RUN keeps c. */
    if ((ld_acquire(&c->inflight) & ~RUN_OWED) != 0 &&
        state_stopped(word_state(ld_acquire(&s->word))))
        atap__rate_stop_runs(c);
    /* Acq_rel: a run that finished before this saw no RUN_OWED and left
     * the drop to us; what it wrote to the series comes before our free. */
    if (or_acqrel(&c->inflight, RUN_OWED) & ~RUN_OWED)
        return true;
    /* RUN goes now. A waiting series let go of (gate.c) with nothing
     * published since its give reads FAILED, as a let-go task does: known
     * only now, once no run under way can still publish. */
    if (c->gate)
        atap__exec_stop(s, gen, ST_PENDING, ST_FAILED);
    return false;
}

bool atap__sched_at_rate(struct atap_slot *s) { return sched_of(s)->kind == ATAP_AT_RATE; }

/* A repeat's new output replaces the one standing, under the write lock,
 * and only while the run still counts (RUNNING): then READY. Otherwise
 * (cancelled or timed out during the run) the output stays in scratch,
 * and nothing else will ever read or let go of it: it goes to out_free
 * here, after the lock (every output is taken or let go of, once). */
static bool publish(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    struct kicks after;
    uint32_t cur;
    bool ok, dropped;

    atap__kicks_init(&after);
    atap__sched_out_write_lock(c);
    cur = ld_acquire(&s->word);
    if ((ok = word_gen(cur) == gen && word_state(cur) == ST_RUNNING) && s->out_size) {
        if (c->out_live && slot_out_free(s))
            slot_out_free(s)(slot_out(s)); /* replaced before anyone took it */
        memcpy(slot_out(s), c->scratch, s->out_size);
        s->filled = 1;
    }
    /* Not copied: the scratch output is nobody's but ours. (Copied, it is
     * the slot's: filled, let go of at free if no publish follows.) */
    dropped = !ok && s->out_size && slot_out_free(s);
    if (ok)
        c->pubs++; /* counted before readable: see atap__flow_publish */
    if (ok && (ok = c->gate ? atap__gate_publish(s, gen, &c->out_kept)
                            : atap__exec_stop(s, gen, ST_RUNNING, ST_READY)))
        atap__flow_publish(s, c->pubs, &after); /* still under the lock: this output */
    atap__sched_out_write_unlock(c);
    if (dropped)
        slot_out_free(s)(c->scratch);
    atap__flow_kicks_run(&after); /* what it started, after the lock */
    return ok;
}

/* After a repeat's run published: the next run, or the end of the series. */
static void next_run(struct atap_slot *s, struct sched *c, uint32_t gen)
{
    uint64_t now;

    c->done++;
    if (c->kind == ATAP_ONCE) { /* a waiting task's run: its gate decides */
        atap__sched_finish(s, c, gen);
        return;
    }
    now = atap__now_ns();
    if (!atap__hub_accepting()) { /* shutting down, or no manager left */
        atap__exec_end(s, c->index, gen, ST_FAILED);
        return;
    }
    if ((c->runs && c->done >= c->runs) || now > c->deadline) {
        atap__sched_finish(s, c, gen);
        return;
    }
    if (c->every == 0) {
        atap__pool_submit(c->index + 1, s->priority, c->blocking);
        return;
    }
    if (atap__deadline(now, c->every) > c->deadline) {
        atap__sched_finish(s, c, gen);
        return;
    }
    atap__sched_arm(c, &c->start, atap__deadline(now, c->every));
}

void atap__sched_done(struct atap_slot *s, uint32_t gen, int rc)
{
    struct sched *c = sched_of(s);

    /* A limit that could not be disarmed fired, or is firing, for this run:
     * the run is over time whatever it returned. Or the timers closed (no
     * manager will run again) and took it unfired: then the clock says
     * whether the run went past its limit (timers never fire early). */
    if (c->limit_armed && !atap__timer_disarm(atap__hub_timers(), &c->limit) &&
        atap__now_ns() >= c->limit_at)
        atap__exec_stop(s, gen, ST_RUNNING, ST_TIMED_OUT);
    if (c->parent) {
        atap__rate_run_done(s, c, gen, rc);
        return;
    }
    if (rc != 0) {
        atap__exec_end(s, c->index, gen, ST_FAILED);
        return;
    }
    if (!rewrites(c)) {
        s->filled = 1;
        atap__exec_stop(s, gen, ST_RUNNING, ST_READY);
        atap__sched_finish(s, c, gen);
        return;
    }
    if (!publish(s, c, gen)) { /* cancelled or timed out during the run */
        atap__sched_finish(s, c, gen);
        return;
    }
    next_run(s, c, gen);
}

/* In a fork's child (its one thread; runtime.c): the schedules are the
 * parent's tasks'; let go unfreed, back to the state before the first start. */
void atap__sched_forget(void)
{
    st_relaxed(&graveyard, NULL);
    mourning = NULL;
    nfired = 0;
}

const struct atap__extras_time atap__sched_extras = {
    .check = atap__sched_check,
    .attach = atap__sched_attach,
    .start = atap__sched_start,
    .claim = atap__sched_claim,
    .output = atap__sched_output,
    .done = atap__sched_done,
    .ending = atap__sched_ending,
    .failing = atap__sched_failing,
    .cancellable = atap__sched_cancellable,
    .cancelled = atap__sched_cancelled,
    .finished = atap__sched_finished,
    .ran_out = atap__sched_ran_out,
    .read_lock = atap__sched_read_lock,
    .read_unlock = atap__sched_read_unlock,
    .series = atap__sched_series,
    .destroy = atap__sched_destroy,
    .gate = atap__sched_gate,
    .kick = atap__sched_kick,
    .restarting = atap__sched_restarting,
    .mark_finished = atap__sched_mark_finished,
    .input = atap__sched_input,
    .pubs = atap__sched_pubs,
    .at_rate = atap__sched_at_rate,
};

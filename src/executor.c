/*
 * Tasks: run, settle, cancel, release, free (spawning them: spawn.c,
 * which fills a slot, stores PENDING with release, then queues it; reading
 * them: read.c).
 *
 * A task's life is told by its slot's `word` (gen | WAITERS | state) and
 * `refs` (gen | RUN | handles | holds); see slot.h. The rules:
 *
 *  - Claiming: a worker runs a task only by winning PENDING -> RUNNING.
 *    Each task sits in exactly one queue place at a time, and that entry
 *    carries the RUN reference: whoever dequeues it runs it or, if it was
 *    cancelled meanwhile, drops RUN at once. A task runs at most once.
 *  - Settling: RUNNING -> READY / FAILED by CAS. A cancel that got there
 *    first (RUNNING -> CANCELLED) wins, and the run's output is dropped.
 *    An output that landed is never touched by a cancel.
 *  - Waking: a listener sets WAITERS before it sleeps on the word; whoever
 *    moves the state on and sees WAITERS in the old word wakes them all.
 *    The kernel compares the word before sleeping, so no wake is lost.
 *  - Freeing: whoever takes refs to (gen, no RUN, no handle, no hold) frees. It
 *    stores (gen, FREE) into word, destroys the task's data and gives the
 *    slot back to the table, which hands it out next with gen + 1. Nobody
 *    else can be reading the slot then: every reader holds a listener.
 *    (Using a handle on one thread while releasing that same handle on
 *    another is the caller's race, as with free().)
 *  - Every handle operation first checks its generation against the word
 *    (or refs), and that a handle is left, so a stale handle reads
 *    ATAP_ENOTASK.
 */
#include "executor.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "extras.h"
#include "handle.h"
#include "pool.h"
#include "side.h"
#include "slot.h"
#include "table.h"
#include "trace.h"
#include "wait.h"

/* ---- the features (extras.h) ------------------------------------------- */

struct atap__extras atap__extras;

void atap__exec_set_extras(const struct atap__extras *x) { atap__extras = *x; }

/* ---- the side record (side.h) ------------------------------------------ */

struct side *atap__side_of(struct atap_slot *s)
{
    struct side *rx = ld_acquire(&s->side), *fresh;

    if (rx)
        return rx;
    if (!(fresh = calloc(1, sizeof *fresh)))
        return NULL;
    /* Release: the record is whole before anyone can find it. */
    if (cas_acqrel(&s->side, &rx, fresh))
        return fresh;
    free(fresh);
    return rx;
}

/*
 * Freeing a side record against the rebuild of the timers, which reads
 * side records from any slot at any moment (schedule.c's
 * atap__sched_find_timers). The freer takes the record off its slot, then
 * reads `keeping`; the rebuild sets `keeping`, then reads slots' records:
 * both seq_cst, so of a record the rebuild reads, the freer sees it
 * keeping and defers the free, pushing the record on `deferred` (a Treiber
 * stack, pushes only and whole takes). Whoever finds `keeping` clear after
 * a push, or the rebuild when it lets go, frees what is there.
 */
static _Atomic unsigned keeping;
static struct side *_Atomic deferred;

static void sides_free_deferred(void)
{
    struct side *x = xchg_acquire(&deferred, NULL), *next;

    for (; x; x = next) {
        next = x->deferred;
        free(x);
    }
}

void atap__side_free(struct atap_slot *s)
{
    struct side *rx = ld_relaxed(&s->side), *head;

    st_seqcst(&s->side, NULL);
    if (likely(!ld_seqcst(&keeping))) {
        free(rx);
        return;
    }
    head = ld_relaxed(&deferred);
    do
        rx->deferred = head;
    while (!casw_release(&deferred, &head, rx));
    if (!ld_seqcst(&keeping)) /* let go since: its drain may have missed ours */
        sides_free_deferred();
}

void atap__exec_sides_keep(void) { st_seqcst(&keeping, 1); }

void atap__exec_sides_let_go(void)
{
    st_seqcst(&keeping, 0);
    sides_free_deferred();
}

/* In a fork's child: no rebuild is under way (its supervisor is not
 * there); what one deferred is the parent's, left unfreed. */
void atap__exec_sides_forget(void)
{
    st_relaxed(&keeping, 0);
    st_relaxed(&deferred, NULL);
}

/* The slot is being freed: no forward and no park is left on it. */
static void side_destroy(struct atap_slot *s)
{
    atap__extras.park->destroy(ld_relaxed(&ld_relaxed(&s->side)->park));
    atap__side_free(s);
}

/* ---- freeing ---------------------------------------------------------- */

/* A free slot's park tail reads "not parked": an inline output over
 * PARK_TAIL bytes may have filled its claim word. */
static inline void tail_reset(struct atap_slot *s)
{
    if (!(s->flags & SF_OUT_HEAP) && s->out_size > PARK_TAIL)
        st_relaxed(&s->out.park.claim, 0);
}

static __attribute__((noinline)) void destroy(struct atap_slot *s, uint32_t last_state)
{
    struct side *side = ld_relaxed(&s->side);

    if (s->filled && last_state != ST_TAKEN && side && side->out_free)
        side->out_free(slot_out(s));
    if ((s->flags & SF_OUT_HEAP) && s->out.heap) /* NULL: it never ran (spawn.c) */
        atap__exec_out_free(s->out.heap, s->out_size);
    tail_reset(s);
    if (side && !(s->flags & SF_OUT_WIDE) && side->arg_free) /* wide: side.h */
        side->arg_free(s->arg);
    if (unlikely(slot_sched(s)))
        atap__extras.time->destroy(s);
    if (unlikely(side != NULL))
        side_destroy(s);
    s->fn = NULL;
    s->arg = NULL;
    s->flags = 0;
    s->filled = 0;
    s->fail_code = 0;
    s->out_size = 0;
}

/* Nothing to call or give back: no side record (no destructor, no
 * schedule, no forward, no park record), no heap output. */
static inline bool bare(const struct atap_slot *s)
{
    return !(s->flags & SF_OUT_HEAP) && !ld_relaxed(&s->side);
}

static inline __attribute__((always_inline)) void free_slot(struct worker *w, struct atap_slot *s,
                                                            uint32_t index, uint32_t gen)
{
    /* Release: a stale reader that sees FREE sees nothing of what follows;
     * the destroy below happens after every listener let go (acq_rel on
     * refs brought their writes here). */
    uint32_t state = word_state(ld_relaxed(&s->word));

    st_release(&s->word, make_word(gen, ST_FREE));
    if (likely(bare(s))) { /* destroy's resets, of what a bare task set */
        tail_reset(s);
        s->fn = NULL;
        s->arg = NULL;
        s->flags = 0;
        s->filled = 0;
        s->fail_code = 0;
        s->out_size = 0;
    } else {
        destroy(s, state);
    }
    st_relaxed(&s->refs, refs_of(gen));
    atap__table_free(w ? &w->cache : atap__table_outside_cache(), index, gen);
}

/* free_slot for the release paths, out of line: most releases free
 * nothing, and keep a small frame. */
static __attribute__((noinline)) void free_released(struct atap_slot *s, uint32_t index,
                                                    uint32_t gen)
{
    free_slot(atap__self, s, index, gen);
}

static inline void release_listener(struct atap_slot *s, uint32_t index, uint32_t gen,
                                    uint64_t one);

/* Drops the RUN reference (idempotent per generation). */
void atap__exec_release_run(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    uint64_t r = ld_relaxed(&s->refs), next;

    /* The caller owns RUN, so the slot is this task's: a waiting task
     * takes no more gives from here (its gate would hand RUN out again). */
    if (unlikely(slot_sched(s)) && refs_gen(r) == gen && (r & REFS_RUN) &&
        atap__extras.time->ending(s, gen))
        return; /* an at-rate series' runs under way: the last one drops it */
    do {
        if (refs_gen(r) != gen || !(r & REFS_RUN))
            return;
        /* With forwards (RX), a hold of our own keeps the slot while they
         * close: their own listeners may all go meanwhile. */
        next = (r & ~REFS_RUN) + ((r & REFS_RX) ? REFS_HOLD : 0);
        /* acq_rel: the run's writes (output, flags) reach whoever frees;
         * a registrar's rx reaches us with its RX. */
    } while (!casw_acqrel(&s->refs, &r, next));
    if (unlikely(r & REFS_RX)) {
        atap__extras.flow->close(s);
        release_listener(s, index, gen, REFS_HOLD);
    } else if ((r & REFS_COUNT_MASK) == 0) {
        free_released(s, index, gen);
    }
}

/* The last listener of a task that waits for gives is going while the
 * task still holds RUN: nothing can give to it after this. Read with an
 * RMW, so the count is the latest: only a holder adds listeners, and the
 * caller (one of kind `one`) is the only holder when it reads just its own. */
static __attribute__((noinline, cold)) uint64_t maybe_orphan(struct atap_slot *s, uint32_t index,
                                                             uint32_t gen, uint64_t one)
{
    uint64_t r = add_acqrel(&s->refs, 0);

    if (refs_gen(r) == gen && (r & (REFS_RUN | REFS_COUNT_MASK)) == (REFS_RUN | one))
        atap__extras.flow->orphan(s, index, gen);
    return r;
}

/* Lets go of one listener of kind `one` (REFS_HANDLE or REFS_HOLD): none
 * of that kind left (a stale handle, a handle released twice) is a no-op,
 * so a handle can never drop the runtime's holds. */
static inline void release_listener(struct atap_slot *s, uint32_t index, uint32_t gen, uint64_t one)
{
    const uint64_t mask = one == REFS_HANDLE ? REFS_HANDLES_MASK : REFS_HOLDS_MASK;
    const uint64_t last = REFS_GATED | REFS_RUN | one;
    uint64_t r = ld_relaxed(&s->refs), orphaned = 0;

    TEST_HOOK(ATAP__TEST_RELEASE_READ);
    for (;;) {
        if (refs_gen(r) != gen || (r & mask) == 0)
            return;
        /* Looked at on every try: a release racing ours may have just left
         * ours the last listener. Done once the look itself (an RMW, so the
         * latest count) found ours the last: a hold taken meanwhile (a
         * waker's, brief) sends us round again, and the holder's own
         * release looks in turn. */
        if (unlikely((r & (REFS_GATED | REFS_RUN | REFS_COUNT_MASK)) == last) && r != orphaned) {
            r = maybe_orphan(s, index, gen, one);
            if ((r & (REFS_GATED | REFS_RUN | REFS_COUNT_MASK)) == last)
                orphaned = r;
            continue;
        }
        if (casw_acqrel(&s->refs, &r, r - one))
            break;
    }
    if (((r - one) & (REFS_RUN | REFS_COUNT_MASK)) == 0)
        free_released(s, index, gen);
}

void atap__exec_release_listener(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    release_listener(s, index, gen, REFS_HOLD);
}

void atap_release(atap_task t)
{
    uint32_t gen;
    struct atap_slot *s = lookup(t, &gen);

    if (s)
        release_listener(s, (uint32_t)t.id, gen, REFS_HANDLE);
}

/* One more hold on a live task (it cannot be going: the caller holds a
 * listener of its own, or RUN). */
void atap__exec_hold(struct atap_slot *s) { add_relaxed(&s->refs, REFS_HOLD); }

bool atap__exec_try_hold(struct atap_slot *s, uint32_t gen)
{
    uint64_t r = ld_relaxed(&s->refs);

    do {
        /* RUN, or a listener: the slot is this task's and stays so. */
        if (refs_gen(r) != gen || !(r & (REFS_RUN | REFS_COUNT_MASK)) ||
            (r & REFS_HOLDS_MASK) == REFS_HOLDS_MASK)
            return false;
    } while (!casw_acqrel(&s->refs, &r, r + REFS_HOLD));
    return true;
}

struct atap_slot *atap__exec_live(atap_task t, uint32_t *index, uint32_t *gen)
{
    uint32_t cur;
    struct atap_slot *s = lookup(t, gen);

    *index = (uint32_t)t.id;
    return s && handle_live(s, *gen, &cur) ? s : NULL;
}

int atap_dup(atap_task t, atap_task *copy)
{
    uint32_t gen;
    struct atap_slot *s;
    uint64_t r;

    if (!copy)
        return ATAP_EINVAL;
    *copy = ATAP_NO_TASK;
    if (!(s = lookup(t, &gen)))
        return ATAP_ENOTASK;
    r = ld_relaxed(&s->refs);
    do {
        if (refs_gen(r) != gen || (r & REFS_HANDLES_MASK) == 0)
            return ATAP_ENOTASK;
        if ((r & REFS_HANDLES_MASK) == REFS_HANDLES_MASK)
            return ATAP_EINVAL; /* 2^20 - 1 handles: refuse, never wrap */
    } while (!casw_acqrel(&s->refs, &r, r + REFS_HANDLE));
    *copy = t;
    return 0;
}

/* ---- running ---------------------------------------------------------- */

_Atomic uint32_t atap__first_waiters;
_Atomic uint32_t atap__exec_settle_seq;

/* join_first's wake-up, off the settle's path: one load (acquire, of
 * atap__first_waiters) when no join_first waits. */
static __attribute__((noinline, cold)) void settled_for_first(void)
{
    add_relaxed(&atap__exec_settle_seq, 1);
    atap__word_wake(&atap__exec_settle_seq, true);
    /* After the count moved: a stack listed before it sees the move in
     * its still() (join.c), one listed after is found here. */
    atap__pool_wake_key(&atap__exec_settle_seq);
}

void atap__exec_wake(struct atap_slot *s, uint32_t old)
{
    if (old & ST_WAITERS)
        atap__word_wake(&s->word, true);
    /* The RMW that read `old` read a waiter's still() (pool_aside.c), and
     * so its listing: the count is seen. */
    if (old & ST_ASIDE)
        atap__pool_wake_listed(s);
    if (unlikely(ld_acquire(&atap__first_waiters) != 0))
        settled_for_first();
}

/* A task with a schedule is about to read FAILED: the feature hears first. */
static __attribute__((noinline, cold)) void failing(struct atap_slot *s)
{
    atap__extras.time->failing(s);
}

static inline __attribute__((always_inline)) bool stop(struct atap_slot *s, uint32_t gen,
                                                       uint32_t from, uint32_t to)
{
    uint32_t cur = ld_relaxed(&s->word);

    if (unlikely(to == ST_FAILED && slot_sched(s)))
        failing(s);
    do {
        if (word_gen(cur) != gen || word_state(cur) != from)
            return false;
        /* Release: an output is written before READY can be read. */
    } while (!casw_acqrel(&s->word, &cur, make_word(gen, to)));
    /* Traced before anyone is woken: a waiter that reads TIMED_OUT finds
     * it in the trace, as a cancel's. */
    if (to == ST_TIMED_OUT)
        ATAP_TRACE(TR_TIMEOUT, ATAP_TRACE_ID(atap__table_index_of(s), gen), NULL, 0);
    if (cur & ST_LISTENED)
        atap__exec_wake(s, cur);
    return true;
}

bool atap__exec_stop(struct atap_slot *s, uint32_t gen, uint32_t from, uint32_t to)
{
    return stop(s, gen, from, to);
}

/* RUNNING -> READY or FAILED, unless a cancel got there first. */
static inline __attribute__((always_inline)) void settle(struct atap_slot *s, uint32_t gen, bool ok)
{
    stop(s, gen, ST_RUNNING, ok ? ST_READY : ST_FAILED);
}

void atap__exec_end(struct atap_slot *s, uint32_t index, uint32_t gen, uint32_t to)
{
    uint32_t cur = ld_relaxed(&s->word);

    if (unlikely(to == ST_FAILED && slot_sched(s)))
        failing(s);
    do {
        if (word_gen(cur) != gen || word_state(cur) == ST_FREE || word_state(cur) == ST_CANCELLED ||
            word_state(cur) == ST_TIMED_OUT || word_state(cur) == ST_FAILED)
            break; /* already ended otherwise */
        if (casw_acqrel(&s->word, &cur, make_word(gen, to))) {
            if (cur & ST_LISTENED)
                atap__exec_wake(s, cur);
            break;
        }
    } while (1);
    atap__exec_release_run(s, index, gen);
}

/*
 * A task spawned on the quick path (spawn.c) with an output over the
 * slot's bytes gets its block here, at its first run, from the running
 * thread (which is where most such tasks are also joined and freed, so the
 * block is the one just given back): a task waiting in a queue holds no
 * block. Only the runner writes the pointer, before the function writes
 * through it; the run's end publishes both with the output. None to be
 * had: the run fails, -ENOMEM (read as that: slot.h's fail_code_of).
 */
static __attribute__((noinline)) bool out_late(struct atap_slot *s)
{
    return (s->out.heap = atap__exec_out_alloc(s->out_size)) != NULL;
}

static inline bool out_missing(struct atap_slot *s)
{
    return unlikely((s->flags & SF_OUT_HEAP) && !s->out.heap) && !out_late(s);
}

/*
 * A task whose every handle is gone (spawned, then released at once) can be
 * neither cancelled, read, waited on nor given a new handle: dup needs a
 * listener, and a count never comes back from 0 but for one party: a waker
 * (atap__park_wake) holds a task it found registered, RUN or not, to reach
 * its park record. Its runner is otherwise the only party left, so it runs
 * with no claim, no settle and no reference CAS, and its slot goes straight
 * back; a task with a side record (where a park lives) ends through the
 * reference CAS instead, so a waker's hold keeps the slot until it lets go.
 * A task with none has nothing a waker reads that its freeing frees: a
 * late hold lands on a slot whose generation has moved on, and its release
 * is ignored. (A thread dying in it goes through fail_held, whose CASes
 * still hold.)
 */
static void run_unobserved(struct worker *w, struct atap_slot *s, uint32_t ref, uint32_t gen)
{
    struct atap_ctx ctx = {.slot = s, .index = ref - 1, .gen = gen, .arg = s->arg};
    struct atap_ctx *outer = w->cur;
    int rc;

    if (out_missing(s)) /* nobody to tell: it ends as a failed run ends */
        goto ended;
    atap__pool_frame_push(w, ref);
    if (FAULT_WORKER_DIES(w->blocking))
        atap__pool_die(w); /* an injected death, holding this task */
    w->cur = &ctx;
    ATAP_TRACE(TR_RUN_BEGIN, ATAP_TRACE_ID(ref - 1, gen), s->fn, 0);
    rc = s->fn(&ctx, ctx.arg, slot_out(s));
    ATAP_TRACE(TR_RUN_END, ATAP_TRACE_ID(ref - 1, gen), NULL, rc);
    w->cur = outer;
    atap__pool_frame_pop(w);
    st_relaxed(&w->completed, ld_relaxed(&w->completed) + 1); /* one writer */
    if (unlikely(rc == ATAP_PARKED && ctx.park_kind)) {
        /* A park has claimants of its own: RUNNING from here, so that its
         * resumed run is told apart from a first one. */
        st_release(&s->word, make_word(gen, ST_RUNNING));
        atap__extras.park->arm(s, &ctx);
        return;
    }
    if (rc == 0)
        s->filled = 1; /* nobody can take it: out_free at free */
ended:
    if (unlikely(ld_relaxed(&s->side) != NULL)) {
        atap__exec_release_run(s, ref - 1, gen);
        return;
    }
    free_slot(w, s, ref - 1, gen);
}

/* What follows a run: publish or fail, and the run's RUN reference goes
 * (or a repeat goes round again). Also ends a parked run taken down. */
static inline __attribute__((always_inline)) void finish_run(struct atap_slot *s, uint32_t index,
                                                             uint32_t gen, int rc)
{
    /* Before FAILED is published (release): a reader who sees it sees this. */
    if (unlikely(rc < 0))
        s->fail_code = (uint8_t)fail_code_of(rc);
    if (unlikely(slot_sched(s))) {
        atap__extras.time->done(s, gen, rc);
        return;
    }
    if (rc == 0)
        s->filled = 1;
    settle(s, gen, rc == 0);
    atap__exec_release_run(s, index, gen);
}

void atap__exec_finish_run(struct atap_slot *s, uint32_t index, uint32_t gen, int rc)
{
    finish_run(s, index, gen, rc);
}

static void run_observed(struct worker *w, struct atap_slot *s, uint32_t ref, uint32_t cur);
static void run_claimed(struct worker *w, struct atap_slot *s, uint32_t ref, struct atap_ctx *ctx);

void atap__exec_run(struct worker *w, uint32_t ref)
{
    struct atap_slot *s = atap__table_at(ref - 1);
    uint32_t cur = ld_acquire(&s->word), gen = word_gen(cur);
    /* Acquire: a last release seen here happened before the run. With no
     * listener left nobody can move the state any more, so the state read
     * after the count is final (one read before it could predate a cancel
     * made just before the last release). */
    uint64_t r = ld_acquire(&s->refs);

    if (likely(!slot_sched(s)) && word_state(cur) == ST_PENDING &&
        (r & (REFS_RUN | REFS_RX | REFS_COUNT_MASK)) == REFS_RUN && refs_gen(r) == gen &&
        ld_acquire(&s->word) == cur)
        run_unobserved(w, s, ref, gen);
    else
        run_observed(w, s, ref, cur);
}

/* A task someone may still cancel, read or wait on, a repeat's run, or one
 * back from a park. cur: its word as exec_run read it. */
static void run_observed(struct worker *w, struct atap_slot *s, uint32_t ref, uint32_t cur)
{
    uint32_t gen = word_gen(cur);
    struct atap_ctx ctx = {.slot = s, .index = ref - 1, .gen = gen};
    if (unlikely(word_state(cur) != ST_PENDING) && atap__extras.park->resume(s, &ctx)) {
        ATAP_TRACE(TR_RESUME, ATAP_TRACE_ID(ctx.index, ctx.gen), NULL, ctx.resumed);
        /* A wide output lies over the arg: its park kept it (park.c). */
        ctx.arg = unlikely(s->flags & SF_OUT_WIDE) ? slot_side(s)->arg : s->arg;
        /* Back from a park: still RUNNING, unless stopped since. A runtime
         * task woken to act runs anyway, seeing atap_cancelled(), so that
         * it can hand the wake on (a channel's value, or room, is not left
         * with the next waiter asleep). */
        if (word_state(ld_acquire(&s->word)) != ST_RUNNING) {
            if (ctx.woke)
                s->fn(&ctx, ctx.arg, slot_sched(s) ? atap__extras.time->output(s) : slot_out(s));
            atap__exec_finish_run(s, ref - 1, gen, ATAP_EFAILED);
            return;
        }
    } else if (unlikely(slot_sched(s))) {
        if (!atap__extras.time->claim(s, &gen))
            return;
        ctx.gen = gen;
        ctx.arg = s->arg;
    } else {
        do {
            if (word_state(cur) != ST_PENDING) { /* cancelled while queued */
                atap__exec_release_run(s, ref - 1, gen);
                return;
            }
        } while (!casw_acqrel(&s->word, &cur, (cur & ~ST_MASK) | ST_RUNNING));
        ctx.arg = s->arg; /* its first run: a wide output has not begun */
    }
    run_claimed(w, s, ref, &ctx);
}

/* Runs a claimed task (its RUN is ours) on this thread, and what follows. */
static void run_claimed(struct worker *w, struct atap_slot *s, uint32_t ref, struct atap_ctx *ctx)
{
    struct atap_ctx *outer;
    int rc;

    if (out_missing(s)) {
        finish_run(s, ref - 1, ctx->gen, -ENOMEM);
        return;
    }
    atap__pool_frame_push(w, ref);
    if (FAULT_WORKER_DIES(w->blocking))
        atap__pool_die(w); /* an injected death, holding this task */
    outer = w->cur;
    w->cur = ctx;
    /* A task that waits for gives: a give (or a receive's round) started
     * this run, and the trace draws its arrow in. */
    ATAP_TRACE(TR_RUN_BEGIN, ATAP_TRACE_ID(ctx->index, ctx->gen), s->fn,
               (ld_relaxed(&s->refs) & REFS_GATED) != 0);
    rc = s->fn(ctx, ctx->arg, slot_sched(s) ? atap__extras.time->output(s) : slot_out(s));
    ATAP_TRACE(TR_RUN_END, ATAP_TRACE_ID(ctx->index, ctx->gen), NULL, rc);
    w->cur = outer;
    atap__pool_frame_pop(w);
    st_relaxed(&w->completed, ld_relaxed(&w->completed) + 1); /* one writer */
    if (unlikely(rc == ATAP_PARKED) && ctx->park_kind) {
        atap__extras.park->arm(s, ctx); /* RUN goes with the park */
        return;
    }
    finish_run(s, ref - 1, ctx->gen, rc);
}

void atap__exec_fail_held(uint32_t ref)
{
    struct atap_slot *s = atap__table_at(ref - 1);
    uint32_t gen = word_gen(ld_relaxed(&s->word));

    /* Ends as a run that failed ends: a series ends with its run, and an
     * at-rate run tells its series (which keeps its RUN for it). On the
     * dying thread itself, so the run's own writes are ours to read. */
    atap__exec_finish_run(s, ref - 1, gen, ATAP_EFAILED);
}

/* ---- cancelling ------------------------------------------------------- */

int atap__exec_cancel(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    uint32_t cur = ld_acquire(&s->word);

    do {
        if (!word_is(cur, gen))
            return ATAP_ENOTASK;
        if (slot_sched(s) ? !atap__extras.time->cancellable(s, word_state(cur))
                          : word_state(cur) != ST_PENDING && word_state(cur) != ST_RUNNING)
            return 0; /* settled: an output that landed is left alone */
    } while (!casw_acqrel(&s->word, &cur, make_word(gen, ST_CANCELLED)));
    ATAP_TRACE(TR_CANCEL, ATAP_TRACE_ID(index, gen), NULL, 0);
    if (cur & ST_LISTENED)
        atap__exec_wake(s, cur);
    /* In a kernel wait or a park, maybe; or a delayed start waiting in its
     * slot (spawn.c). */
    if (word_state(cur) == ST_RUNNING || (word_state(cur) == ST_PENDING && (s->flags & SF_DELAYED)))
        atap__extras.park->interrupt(s, index, gen);
    if (unlikely(slot_sched(s)))
        atap__extras.time->cancelled(s, index, gen);
    return 0;
}

int atap_cancel(atap_task t)
{
    uint32_t gen, cur;
    struct atap_slot *s = lookup(t, &gen);

    if (!s || !handle_live(s, gen, &cur))
        return ATAP_ENOTASK;
    return atap__exec_cancel(s, (uint32_t)t.id, gen);
}

bool atap_cancelled(atap_ctx *ctx)
{
    uint32_t w;

    if (!ctx || !ctx->slot)
        return false;
    w = ld_acquire(&ctx->slot->word);
    return word_gen(w) == ctx->gen &&
           (word_state(w) == ST_CANCELLED || word_state(w) == ST_TIMED_OUT);
}

struct atap_slot *atap__exec_ctx_slot(atap_ctx *ctx) { return ctx ? ctx->slot : NULL; }

bool atap__exec_inside(const struct worker *w, uint32_t ref)
{
    uint32_t index, gen;

    if (atap__pool_inside(w, ref))
        return true;
    /* An at-rate run is inside its series too: the series settles only
     * once its runs are done. */
    for (unsigned i = 0; w && i < w->depth; i++) {
        struct atap_slot *s = atap__table_at(w->held[i] - 1);

        if (slot_sched(s) && atap__extras.time->series(s, &index, &gen) && index + 1 == ref)
            return true;
    }
    return false;
}

atap_task atap_self(atap_ctx *ctx)
{
    uint32_t index, gen;

    if (!ctx || !ctx->slot)
        return ATAP_NO_TASK;
    /* An at-rate run has no handle of its own: it names its series. */
    if (unlikely(slot_sched(ctx->slot)) && atap__extras.time->series(ctx->slot, &index, &gen))
        return make_task(index, gen);
    return make_task(ctx->index, ctx->gen);
}

uint64_t atap_now(void) { return atap__now_ns(); }

const struct atap__pool_ops atap__exec_pool_ops = {
    .run = atap__exec_run,
    .fail_held = atap__exec_fail_held,
};

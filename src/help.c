/*
 * What a wait inside a task may run (the rule at the top of atap.h; read.c
 * and join.c wait, this file picks the work).
 *
 * A thread waiting for task A runs on its own stack only work A needs, so
 * that nothing run on top of a waiting frame can wait for what that frame
 * does after its wait:
 *   - A itself while it is queued: from this worker's own LIFO slot or
 *     ring bottom (take_awaited), or claimed aside wherever else it sits
 *     (the executor's claim aside, atap__pool_ops.claim);
 *   - work spawned while A runs (leapfrogging: leapfrog, find_run): every
 *     run a worker takes from a queue publishes itself in its record
 *     (pub[], a mark in its ring) and, when its slot's link is free, a hint
 *     there; all but a waiter's own awaited task taken from its own queues,
 *     which nobody else waits for (so a deep chain of a thread's own joins
 *     publishes nothing, and what it steals at any depth is found);
 *   - while A's run is held up by a wait of its own, the same for what that
 *     wait is for (needed_next), a few hops deep.
 * Nesting is bounded by the stack (stack_room) and the record's held[]
 * (held_room), not by a count. With nothing it may run, the waiter blocks
 * and the pool lends its core (pool_grow.c, atap__pool_blocked).
 */
#include <stdlib.h>
#include <string.h>

#include "atomics.h"
#include "pool.h"
#include "pool_int.h"
#include "slot.h"
#include "table.h"

/* The awaited task, if it sits in w's LIFO slot or at the bottom of w's
 * ring: where a task that spawned it and now joins it left it. Taken from
 * there, the entry and its RUN are ours, as any dequeue's are. */
static uint32_t take_awaited(struct worker *w, uint32_t awaited)
{
    uint32_t x;

    if (ld_relaxed(&w->lifo) == awaited &&
        atomic_compare_exchange_strong_explicit(&w->lifo, &awaited, 0, memory_order_acq_rel,
                                                memory_order_relaxed))
        return awaited;
    /* A look at the bottom entry first (the owner's to read): a pop and
     * a push back cost a fence when it is not the one. */
    if (ring_bottom_entry(&w->ring) != awaited || (x = ring_pop(&w->ring)) == 0)
        return 0;
    if (x == awaited)
        return x;
    atap__pool_push_ring(w, x); /* not it: back where it was */
    return 0;
}

/* The link hint a published run leaves in its slot: LINK_HINT | k << 11
 * | worker index + 1, k its place in pub[]. Only a hint: whatever it reads
 * is checked against pub[]. LINK_HINT (slot.h) tells it from a queue link:
 * a popper of the shared queue may still walk through a slot popped under
 * it, and stops at a hint rather than follow it (its CAS fails then
 * anyway). */
#define HINT_WORKER_BITS 11
_Static_assert(POOL_MAX_THREADS < (1u << HINT_WORKER_BITS), "a worker index fits the hint");
_Static_assert(PUB_DEPTH < (1u << (31 - HINT_WORKER_BITS)), "a place fits the hint");

struct found {
    struct worker *v; /* the worker the task runs on, published at pub[d] */
    uint32_t d;
    uint64_t tag;
};

bool atap__pool_publish(struct worker *w, struct atap_slot *s, bool hint)
{
    unsigned d = w->npub;
    uint32_t x;

    if (w->blocking || d >= PUB_DEPTH)
        return false;
    /* What sits in the LIFO slot was spawned before this run: into the
     * ring below the mark, so that everything at or above the mark was
     * spawned while this run is on the stack. */
    if (ld_relaxed(&w->lifo) != 0 &&
        (x = atomic_exchange_explicit(&w->lifo, 0, memory_order_acq_rel)) != 0)
        atap__pool_push_ring(w, x);
    st_relaxed(&w->pubmark[d], ld_relaxed(&w->ring.bottom));
    /* Release: who reads this depth reads the unpublishing of the run that
     * held pub[d] before (frame_pop), so that the tag read after it tells
     * whether the depth is the tag's (needed_next). */
    st_release(&w->pubdepth[d], w->depth - 1);
    /* Release: a leapfrogger that reads the tag reads this mark or a later
     * one (and a later one changes the tag before it is used). */
    st_release(&w->pub[d], (uint64_t)++w->fseq << 32 | w->held[w->depth - 1]);
    w->npub = d + 1;
    if (hint)
        st_relaxed(&s->link, LINK_HINT | d << HINT_WORKER_BITS | (w->index + 1));
    return true;
}

/* A run of ref published on a worker other than w: found through its
 * slot's hint, else by looking through every worker's pub[] (a run claimed
 * aside leaves no hint), up to the first unpublished place. Only a place
 * to look: the caller checks the tag again after taking anything. */
static bool find_run(struct worker *w, struct atap_slot *s, uint32_t ref, struct found *at)
{
    uint32_t hint = ld_relaxed(&s->link), vi = hint & ((1u << HINT_WORKER_BITS) - 1);
    uint32_t d = (hint & ~LINK_HINT) >> HINT_WORKER_BITS, n = atap__pool_records();
    uint64_t tag;

    if ((hint & LINK_HINT) && vi != 0 && vi <= n && d < PUB_DEPTH &&
        atap__pool_record(vi - 1) != w &&
        (uint32_t)(tag = ld_acquire(&atap__pool_record(vi - 1)->pub[d])) == ref) {
        *at = (struct found){.v = atap__pool_record(vi - 1), .d = d, .tag = tag};
        return true;
    }
    for (unsigned i = 0; i < n; i++) {
        struct worker *v = atap__pool_record(i);

        if (v == w || !atap__pool_live(v))
            continue;
        for (d = 0; d < PUB_DEPTH && (tag = ld_acquire(&v->pub[d])) != 0; d++)
            if ((uint32_t)tag == ref) {
                *at = (struct found){.v = v, .d = d, .tag = tag};
                return true;
            }
    }
    return false;
}

/* Room in held[] for one more run; false with no memory for it. */
static bool held_room(struct worker *w)
{
    unsigned cap = w->held_cap * 2;
    uint32_t *grown;

    if (w->depth < w->held_cap)
        return true;
    if (!(grown = malloc(cap * sizeof *grown)))
        return false;
    memcpy(grown, w->held, w->depth * sizeof *grown);
    if (w->held != w->held_inline)
        free(w->held);
    w->held = grown;
    w->held_cap = cap;
    return true;
}

/*
 * The oldest entry of r at or above mark, or 0. Only the oldest entry can
 * be taken, and entries below the mark may sit above it in age: a batch
 * moved in from another ring or the shared queue (pool.c: steal_from,
 * from_shared), the LIFO slot's task pushed as the run was published, or
 * entries a wait of the run's popped down to. While they do, nothing
 * above the mark can be reached. The waiter may not run them (nothing
 * says the awaited task needs them), so, when there is something above
 * the mark to reach, it moves up to CLEAR_MAX of them to the shared
 * queue, where any worker's loop finds them, as leapfrog does with an
 * entry found not its own, and looks above the mark again.
 */
#define CLEAR_MAX 16

static uint32_t steal_above(struct ring *r, int64_t mark)
{
    uint32_t moved[CLEAR_MAX], x, y;
    unsigned n = 0, lost = 0;

    for (;;) {
        if ((x = ring_steal_from(r, mark)) == UINT32_MAX) { /* lost a race: again */
            x = 0;
            if (++lost > CLEAR_MAX)
                break;
            continue;
        }
        /* bottom: a hint that something lies above the mark (the steals
         * below order themselves). */
        if (x != 0 || n == CLEAR_MAX || ld_acquire(&r->bottom) <= mark)
            break;
        /* The top lies below the mark (or the ring has emptied). */
        if ((y = ring_steal_between(r, INT64_MIN, mark)) == 0)
            break;
        if (y == UINT32_MAX) {
            if (++lost > CLEAR_MAX)
                break;
            continue;
        }
        moved[n++] = y;
    }
    if (n)
        atap__pool_submit_batch(moved, n);
    return x;
}

/*
 * Leapfrogging: the awaited task runs on worker v, published at pub[d]
 * (its slot's link says where, or v's pub[] does: find_run). Entries of v's
 * ring at or above that run's mark were spawned while it was on v's stack:
 * by it, or by runs above it, which are work it needs in turn; so was what
 * v's LIFO slot holds. One is taken from the ring's top (the oldest, the
 * largest piece) with one CAS, as a thief takes one (older entries below
 * the mark moved out of the way first: steal_above), else the LIFO slot's
 * by exchange, and kept only if
 * v's pub[d] still holds the same tag afterwards: then the run was on v's
 * stack all along, so the entry was spawned during it. The order that makes
 * the second look enough: v unpublishes (pool.h, frame_pop) before it
 * pushes anything later, and every push is a release store of bottom; the
 * steal read bottom with acquire past the entry's index, so it saw the
 * push of that entry or a later store, and with it the unpublishing that
 * came first. An entry taken and then found not ours goes to the shared
 * queue: into our own ring it would look spawned by our waiting run.
 */

static uint32_t leapfrog(struct worker *w, struct atap_slot *s, uint32_t ref, struct found *at)
{
    struct worker *v;
    uint64_t tag;
    uint32_t d, x;

    at->v = NULL;
    if (!find_run(w, s, ref, at))
        return 0;
    v = at->v;
    d = at->d;
    tag = at->tag;
    /* The ring's oldest at or above the mark, else the LIFO slot: it holds
     * nothing from before the run either (atap__pool_publish emptied it),
     * and the same second look covers it (filling it is a release store;
     * taking it, an exchange). */
    if ((x = steal_above(&v->ring, ld_relaxed(&v->pubmark[d]))) == 0)
        x = ld_relaxed(&v->lifo) ? atomic_exchange_explicit(&v->lifo, 0, memory_order_acq_rel)
                                 : 0;
    if (x == 0)
        return 0;
    if (ld_acquire(&v->pub[d]) != tag) {
        atap__pool_submit_batch(&x, 1);
        return 0;
    }
    return x;
}

/*
 * The task the run found at `at` needs in turn: what the innermost wait on
 * that worker's stack waits for, if that wait is the run's own or one
 * above it (at its depth or deeper: the run cannot return before it). The
 * wait and the run's depth are read between two looks at the run's tag:
 * the run was on the stack all along, so the wait began during it (a wait
 * that ended put the record back to a lower one first, and a later one,
 * read with acquire, would show the run gone), and the depth is the run's
 * (a later run's, read with acquire, would show this one unpublished). A
 * listener is taken on the task found, so that its slot stays its own
 * while it is looked at. 0 if none.
 */
static uint64_t needed_next(const struct found *at, struct atap_slot **next)
{
    struct worker *v = at->v;
    uint64_t task = ld_acquire(&v->awaiting);
    uint32_t depth = ld_relaxed(&v->awaiting_at), run_depth = ld_acquire(&v->pubdepth[at->d]);

    if (task == 0 || depth <= run_depth || ld_acquire(&v->pub[at->d]) != at->tag)
        return 0;
    *next = atap__table_at((uint32_t)task - 1);
    return atap__pool.ops->try_hold(*next, (uint32_t)(task >> 32)) ? task : 0;
}

/* Room on this thread's stack for one more run. */
static inline bool stack_room(const struct worker *w)
{
    return (uintptr_t)__builtin_frame_address(0) > w->stack_floor;
}

/* Room on this thread for one more nested run: stack, depth, held[]. */
static inline bool nest_room(struct worker *w)
{
    return stack_room(w) && w->depth <= HELP_LIMIT() && held_room(w);
}

uint32_t atap__pool_help_own(struct worker *w, uint32_t ref)
{
    return !w->blocking && nest_room(w) ? take_awaited(w, ref) : 0;
}

void atap__pool_offer_own(struct worker *w)
{
    /* Relaxed looks at w's own queues (only thieves take from them
     * meanwhile, which needs no wake); notify orders its own check. */
    if (ld_relaxed(&w->lifo) != 0 || ring_len(&w->ring) > 0)
        atap__pool_notify();
}

/*
 * What a wait may run. A thread waiting for task A runs, on top of its
 * waiting frame, only work A needs: A itself while it is queued (taken
 * from this worker's own queues, or claimed aside wherever it sits:
 * executor.c), work spawned while A runs (leapfrogging), and, while A's
 * run is held up by a wait of its own, the same for what that wait is for
 * (needed_next), a few hops deep. Never other work: a frame run on
 * top of a waiting one cannot return before it, so if it waited for
 * something the lower frame does after its wait, neither would end, a
 * deadlock the program did not contain. Work A needs cannot wait for what
 * the waiting frame does later, unless the program waits in a circle
 * already (A would wait for it too). The one exception is a task spawned
 * during A that A never joins and that waits for the waiter's later work;
 * a program that makes one should not wait for A inside a task.
 * With nothing safe to run, the waiter blocks, and the pool lends its core
 * (atap__pool_blocked). Nesting is bounded by the stack, not by a count:
 * no run starts nested below the thread's stack floor (its stack less a
 * reserve for the run itself), so a deep chain of joins fills one stack,
 * then blocks, and the next part of the chain runs on a lent worker's.
 */
#define CHASE_HOPS 4 /* waits followed from the awaited task (needed_next) */

uint32_t atap__pool_help_pick(struct worker *w, struct atap_slot *s, uint32_t ref, uint32_t gen,
                              enum help_how *how, struct worker **runner)
{
    struct atap_slot *held = NULL;
    uint32_t x = 0, held_ref = 0, held_gen = 0;
    struct found at = {.v = NULL};
    uint64_t next;

    *how = HELP_OWN;
    if (runner)
        *runner = NULL;
    if (!nest_room(w))
        return 0;
    if (!w->blocking && (x = take_awaited(w, ref)) != 0)
        return x;
    *how = HELP_TAKEN;
    /* The awaited task, then, while it runs blocked in a wait of its own,
     * what that wait is for, and so on. */
    for (unsigned hop = 0; hop < CHASE_HOPS; hop++) {
        if (atap__pool.ops->claim(s, ref, gen)) {
            *how = HELP_CLAIMED;
            x = ref;
            break;
        }
        if ((x = leapfrog(w, s, ref, &at)) != 0)
            break;
        if (at.v && runner)
            *runner = at.v;
        if (!at.v || (next = needed_next(&at, &s)) == 0)
            break;
        if (held)
            atap__pool.ops->release_hold(held, held_ref - 1, held_gen);
        held = s;
        ref = held_ref = (uint32_t)next;
        gen = held_gen = (uint32_t)(next >> 32);
    }
    /* A claimed task holds a listener of its own (its queue entry's). */
    if (held)
        atap__pool.ops->release_hold(held, held_ref - 1, held_gen);
    return x;
}

void atap__pool_help_run(struct worker *w, uint32_t x, enum help_how how)
{
    if (how == HELP_CLAIMED)
        atap__pool.ops->run_claimed(w, x);
    else
        atap__pool.ops->run(w, x, how == HELP_TAKEN);
}


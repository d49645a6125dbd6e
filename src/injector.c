/*
 * The shared queue.
 *
 * Each band is two stacks linked through the slots' `link` field, each
 * word holding a count in its top half and a task reference (0: empty) in
 * its bottom half:
 *   incoming  a Treiber stack pushers CAS onto (newest first); the count:
 *             entries ever pushed. No tag: pushes only add, and the one
 *             consumer takes the whole stack at once (the count stays), so
 *             no node is ever popped from it singly;
 *   ready     oldest first, popped by CAS; the count: entries ever popped,
 *             also the tag against ABA. A head that left and came back
 *             went through a pop in between, which raised the count, so it
 *             is never mistaken for the one read, and a batch walked from
 *             an unchanged head is still intact: nobody can unlink a node
 *             without changing the head.
 * When ready runs dry, one popper at a time (`flipping`) takes all of
 * incoming, reverses it into oldest-first order, keeps a batch for itself
 * and installs the rest as ready, counting its batch as popped. Only a
 * flipper adds to ready, and only while it is empty, so FIFO holds inside
 * a band.
 *
 * A band's length is pushed - popped (mod 2^32: a band never holds 2^32
 * entries, there are fewer slots): read popped first, then pushed, and no
 * count goes backwards, so the difference is never negative. No counter is
 * written but the two words the queue's own CASes write anyway: a pusher
 * touches no line a popper's look reads but incoming itself.
 *
 * Ordering: pushers publish the slot with a (seq_cst) CAS on incoming; the
 * flipper's acquire CAS sees it, and its release store on ready passes it
 * on to every popper's acquire load.
 *
 * Bands are served highest first; a band with work that has been passed over
 * INJ_AGE times by one popper is served next by that popper (aging: under a
 * flood of high-priority work a low band still gets a share).
 */
#include "injector.h"

#include "atomics.h"
#include "table.h"

/* A word's count raised by n, its reference cleared. */
static inline uint64_t count_up(uint64_t word, unsigned n) { return ((word >> 32) + n) << 32; }

static inline _Atomic uint32_t *link_of(uint32_t ref) { return &atap__table_at(ref - 1)->link; }

void atap__inj_push(struct injector *q, const uint32_t *refs, unsigned n, int band)
{
    struct inj_band *b = &q->band[band];
    uint64_t head;

    if (n == 0)
        return;
    /* Newest first: refs[n-1] -> ... -> refs[0] -> old head. */
    for (unsigned i = n - 1; i > 0; i--)
        st_relaxed(link_of(refs[i]), refs[i - 1]);
    head = ld_relaxed(&b->incoming);
    do
        st_relaxed(link_of(refs[0]), (uint32_t)head);
    /* seq_cst, not just release: a queuer may let this RMW stand for the
     * parking protocol's fence before its wake check (pool.c notify_look). */
    while (!casw_seqcst(&b->incoming, &head, count_up(head, n) | refs[n - 1]));
}

/*
 * Walking a chain is a string of dependent loads, each on a slot last
 * written long ago (a deep queue is colder than any cache). A thread that
 * spawns in a burst takes slots in index order, so the node a few steps on
 * is most likely `ahead` indices away: fetch it early. Only a hint: a wrong
 * guess costs one wasted line, and an index with no memory behind it is
 * skipped (atap__table_slot reads NULL).
 */
#define WALK_AHEAD 8

static inline void prefetch_ref(uint32_t ref, int ahead)
{
    uint32_t guess = ref + (uint32_t)ahead;
    struct atap_slot *s = guess != 0 ? atap__table_slot(guess - 1) : NULL;

    /* For writing: the walk relinks, the run claims. The run reads the
     * slot's first line (fn, arg, the output area's start). */
    if (s)
        __builtin_prefetch(s, 1);
}

/* Pops up to max from ready by one CAS; 0 when ready is empty. */
static unsigned pop_ready(struct inj_band *b, uint32_t *out, unsigned max)
{
    uint64_t head = ld_acquire(&b->ready);

    while ((uint32_t)head != 0) {
        uint32_t ref = (uint32_t)head;
        unsigned n = 0;

        while (ref != 0 && n < max) {
            out[n++] = ref;
            prefetch_ref(ref, WALK_AHEAD); /* ready runs oldest (lowest) first */
            /* A stale read here is caught by the CAS: the head changed. */
            ref = ld_relaxed(link_of(ref));
        }
        if (casw_acqrel(&b->ready, &head, count_up(head, n) | ref))
            return n;
    }
    return 0;
}

/* Moves incoming into ready, keeping up to max for the caller. */
static unsigned flip(struct inj_band *b, uint32_t *out, unsigned max)
{
    uint32_t ref, prev = 0, next;
    uint64_t head, in;
    unsigned n = 0;

    if ((uint32_t)ld_relaxed(&b->incoming) == 0)
        return 0;
    if (flag_set_acquire(&b->flipping))
        return 0; /* someone else is flipping: look elsewhere, don't wait */
    /* A flip that finished since our look may have refilled ready. Only a
     * flag holder adds to ready, so once seen empty here it stays empty
     * (pops of an empty stack write nothing) until we install the rest. */
    if ((uint32_t)ld_acquire(&b->ready) != 0) {
        flag_clear_release(&b->flipping);
        return pop_ready(b, out, max);
    }
    /* Takes the stack, keeping the count. Acquire: the pushers' slots.
     * Release too: a drain that sees incoming emptied here sees what this
     * thread did before it (pool_life.c quiescent). */
    in = ld_relaxed(&b->incoming);
    while (!casw_acqrel(&b->incoming, &in, in & ~(uint64_t)UINT32_MAX))
        ;
    ref = (uint32_t)in;
    while (ref != 0) {                  /* reverse: oldest first */
        prefetch_ref(ref, -WALK_AHEAD); /* incoming runs newest first */
        next = ld_relaxed(link_of(ref));
        st_relaxed(link_of(ref), prev);
        prev = ref;
        ref = next;
    }
    for (ref = prev; ref != 0 && n < max; ref = ld_relaxed(link_of(ref)))
        out[n++] = ref;
    /* The rest as ready, the batch kept counted as popped. ready is empty
     * (checked above, under the flag) and only pops, which write nothing
     * to an empty stack, may touch it: nobody writes it but this store.
     * Release: the slots, and the links just written, to every popper. */
    head = ld_relaxed(&b->ready);
    st_release(&b->ready, count_up(head, n) | ref);
    flag_clear_release(&b->flipping);
    return n;
}

static bool band_has_work(struct inj_band *b)
{
    return (uint32_t)ld_relaxed(&b->ready) != 0 || (uint32_t)ld_relaxed(&b->incoming) != 0;
}

static unsigned pop_band(struct injector *q, int band, uint32_t *out, unsigned max)
{
    unsigned n = pop_ready(&q->band[band], out, max);

    return n ? n : flip(&q->band[band], out, max);
}

unsigned atap__inj_pop(struct injector *q, struct inj_cursor *c, uint32_t *out, unsigned max)
{
    int order[INJ_BANDS], k = 0;
    unsigned n = 0;

    /* The common look of a busy worker: two relaxed loads a band, on
     * lines written only when the band changes. A push they miss is not
     * lost: a worker parks only after the parking protocol's own look at
     * every band (pool.c), and the pusher's wake check follows its push. */
    if (atap__inj_empty(q))
        return 0;

    /* A starved band first, lowest first; then highest to lowest. */
    for (int b = 0; b < INJ_BANDS; b++)
        if (c->passed[b] >= INJ_AGE)
            order[k++] = b;
    for (int b = INJ_BANDS - 1; b >= 0; b--)
        if (c->passed[b] < INJ_AGE)
            order[k++] = b;
    for (int i = 0; i < INJ_BANDS && n == 0; i++) {
        n = pop_band(q, order[i], out, max);
        if (n == 0)
            continue;
        c->passed[order[i]] = 0;
        for (int b = 0; b < INJ_BANDS; b++)
            if (b != order[i] && band_has_work(&q->band[b]))
                c->passed[b]++;
    }
    return n;
}

bool atap__inj_empty(struct injector *q)
{
    for (int b = 0; b < INJ_BANDS; b++)
        if (band_has_work(&q->band[b]))
            return false;
    return true;
}

size_t atap__inj_len(struct injector *q)
{
    size_t len = 0;

    for (int i = 0; i < INJ_BANDS; i++) {
        /* Acquire: popped is read before pushed (see the top). */
        uint32_t popped = (uint32_t)(ld_acquire(&q->band[i].ready) >> 32);

        len += (uint32_t)((uint32_t)(ld_relaxed(&q->band[i].incoming) >> 32) - popped);
    }
    return len;
}

/*
 * A worker's ring: a fixed Chase-Lev deque of 4,096 task indices, with the
 * C11 orderings of Lê, Pop, Cohen and Zappa Nardelli, "Correct and
 * Efficient Work-Stealing for Weak Memory Models" (PPoPP 2013).
 *
 * The owner pushes and pops at `bottom`; thieves take from `top` by CAS.
 * Invariants: top <= bottom + 1 at all times; entries in [top, bottom) are
 * owned by the ring; an entry leaves it through exactly one winner (the
 * owner's plain pop, or a CAS on top: a thief's for one entry, the owner's
 * for the last entry or for a batch of the oldest). The ring never grows: a
 * full ring makes the caller move half of it to the shared queue.
 *
 * One change from the paper: every store to `bottom` is a release store
 * (the paper uses a release fence before the push's relaxed store and relaxed
 * stores in take). On x86 and ARMv8 that costs nothing, and it lets a thief's
 * acquire load of `bottom` carry the happens-before edge to the task's slot
 * fields without relying on fences, which ThreadSanitizer does not model.
 */
#ifndef ATAP_DEQUE_H
#define ATAP_DEQUE_H

#include <stdint.h>

#include "atomics.h"

/* Room for the siblings a deep descent leaves behind: each level of a
 * tree of joins leaves one (or seven) waiting while the first child's
 * subtree runs on top, and one that overflows to the shared queue is no
 * longer where its parent's join looks (help.c), so that join sets a deep
 * stack aside (bench/README.md, "tree"). 16 KiB a thread, touched as used. */
#define RING_SIZE 4096
#define RING_MASK (RING_SIZE - 1)

struct ring {
    _Atomic int64_t top;
    char pad0[56];
    _Atomic int64_t bottom;
    char pad1[56];
    _Atomic uint32_t buf[RING_SIZE];
};

static inline int64_t ring_len(struct ring *r)
{
    int64_t n = ld_relaxed(&r->bottom) - ld_relaxed(&r->top);
    return n > 0 ? n : 0;
}

/* Owner only. Returns 0 when full. */
static inline int ring_push(struct ring *r, uint32_t x)
{
    int64_t b = ld_relaxed(&r->bottom), t = ld_acquire(&r->top);

    if (b - t >= RING_SIZE)
        return 0;
    st_relaxed(&r->buf[b & RING_MASK], x);
    st_release(&r->bottom, b + 1); /* publishes the entry and the slot behind it */
    return 1;
}

/* Owner only: the newest entry, or 0 when empty. A hint: the next pop
 * takes it unless a thief takes it first (it is the last), so a caller
 * that wants it pops and looks at what the pop returned. */
static inline uint32_t ring_bottom_entry(struct ring *r)
{
    int64_t b = ld_relaxed(&r->bottom);

    return b > ld_relaxed(&r->top) ? ld_relaxed(&r->buf[(b - 1) & RING_MASK]) : 0;
}

/* Owner only. Returns the entry (never 0), or 0 when empty. */
/* Owner: how deep x lies in the ring, looking at the max newest entries:
 * 1 for the bottom (newest) entry, 0 if not seen. Only a look: a thief
 * may take it meanwhile, so the pops that follow check what they get. */
static inline unsigned ring_find(struct ring *r, uint32_t x, unsigned max)
{
    int64_t b = ld_relaxed(&r->bottom), t = ld_relaxed(&r->top);

    for (unsigned d = 1; d <= max && b - (int64_t)d >= t; d++)
        if (ld_relaxed(&r->buf[(b - (int64_t)d) & RING_MASK]) == x)
            return d;
    return 0;
}

/* Owner: takes the entry `depth` from the bottom (1: the newest) and
 * keeps the newer ones above it, in their order, at one fence where
 * popping down to it and pushing back would cost one a pop. As ring_pop
 * with bottom lowered by depth: past the fence, with top below the new
 * bottom, [nb, b) is the owner's alone (a thief stops below nb); with top
 * at it, the entry is the last one and a CAS on top decides; above it,
 * thieves took it. Returns the entry, or 0 when a thief took it. */
static inline uint32_t ring_take_at(struct ring *r, unsigned depth)
{
    int64_t b = ld_relaxed(&r->bottom), nb = b - (int64_t)depth, t;
    uint32_t x;

    if (depth == 0)
        return 0;
    st_release(&r->bottom, nb);
    fence_seqcst(); /* bottom's store before top's load, as in ring_pop */
    t = ld_relaxed(&r->top);
    if (t < nb) {
        x = ld_relaxed(&r->buf[nb & RING_MASK]);
        for (int64_t i = nb + 1; i < b; i++)
            st_relaxed(&r->buf[(i - 1) & RING_MASK], ld_relaxed(&r->buf[i & RING_MASK]));
        st_release(&r->bottom, b - 1); /* publishes the entries moved down */
        return x;
    }
    x = 0;
    if (t == nb) {
        x = ld_relaxed(&r->buf[nb & RING_MASK]);
        if (!cas_seqcst(&r->top, &t, t + 1))
            x = 0;
    }
    st_release(&r->bottom, b); /* the newer entries stay where they are */
    return x;
}

static inline uint32_t ring_pop(struct ring *r)
{
    int64_t b = ld_relaxed(&r->bottom) - 1, t;
    uint32_t x;

    st_release(&r->bottom, b);
    /* seq_cst fence: the store of bottom is ordered before the load of top,
     * and pairs with the fence in ring_steal (Dekker). Without it owner and
     * thief could both take the last entry. */
    fence_seqcst();
    t = ld_relaxed(&r->top);
    if (t > b) {
        st_release(&r->bottom, b + 1);
        return 0;
    }
    x = ld_relaxed(&r->buf[b & RING_MASK]);
    if (t == b) {
        /* The last entry: race the thieves for it by CAS on top. */
        if (!cas_seqcst(&r->top, &t, t + 1))
            x = 0;
        st_release(&r->bottom, b + 1);
    }
    return x;
}

/* Owner only: takes up to max of the oldest entries into out with one CAS
 * on top, as a thief takes one. The owner neither pushes nor pops
 * meanwhile, so the entries read before the CAS are still the ring's if it
 * succeeds. Returns how many; 0 when empty, or when a thief moved top first
 * (the caller looks again). */
static inline unsigned ring_take_oldest(struct ring *r, uint32_t *out, unsigned max)
{
    int64_t t = ld_acquire(&r->top), b = ld_relaxed(&r->bottom);
    unsigned n;

    if (t >= b)
        return 0;
    n = b - t < (int64_t)max ? (unsigned)(b - t) : max;
    for (unsigned i = 0; i < n; i++)
        out[i] = ld_relaxed(&r->buf[(t + i) & RING_MASK]);
    if (!cas_seqcst(&r->top, &t, t + n))
        return 0;
    return n;
}

/* Any thread. Returns the oldest entry if its index lies in [from, to),
 * 0 when there is none, or UINT32_MAX to retry (lost a race). Indices only
 * grow, so a bottom read earlier parts what was pushed before it from what
 * came after. */
static inline uint32_t ring_steal_between(struct ring *r, int64_t from, int64_t to)
{
    int64_t t = ld_acquire(&r->top), b;
    uint32_t x;

    if (t < from || t >= to)
        return 0;
    fence_seqcst(); /* pairs with the fence in ring_pop */
    b = ld_acquire(&r->bottom);
    if (t >= b)
        return 0;
    x = ld_relaxed(&r->buf[t & RING_MASK]);
    if (!cas_seqcst(&r->top, &t, t + 1))
        return UINT32_MAX;
    return x;
}

/* Any thread: the oldest entry, if its index is `from` or above. */
static inline uint32_t ring_steal_from(struct ring *r, int64_t from)
{
    return ring_steal_between(r, from, INT64_MAX);
}

/* Any thread: the oldest entry there is. */
static inline uint32_t ring_steal(struct ring *r)
{
    return ring_steal_between(r, INT64_MIN, INT64_MAX);
}

#endif

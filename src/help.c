/*
 * What a wait inside a task may run on top of its waiting frame (the rule
 * at the top of atap.h; read.c and join.c wait, pool_aside.c sets a stack
 * aside when nothing may run here).
 *
 * A thread waiting for task A runs, on the waiting frame's stack, only A,
 * and only when it finds A in its own queues (its LIFO slot, or its ring's
 * newest entries: where a task that spawned A and now joins it left it,
 * under the siblings spawned after A) and the stack has room. A frame run on top of a waiting one
 * cannot return before it; A cannot wait for what the waiting frame does after its wait unless the
 * program waits in a circle already. Anything else, work A spawned included, runs on another stack
 * (pool_aside.c), so that nothing can be stuck under a frame it waits for.
 */
#include <stdlib.h>
#include <string.h>

#include "atomics.h"
#include "faults.h"
#include "pool.h"
#include "pool_int.h"

/* How deep in its own ring a waiter digs for the task it waits for: the
 * entries above it (newer) stay, in their order (ring_take_at). */
#define DIG_MAX 32

uint32_t atap__pool_take_own(struct worker *w, uint32_t ref)
{
    uint32_t x;
    unsigned depth;

    if (w->blocking)
        return 0;
    /* Taken from there, the entry and its RUN are ours, as any
     * dequeue's are. */
    if (ld_relaxed(&w->lifo) == ref && cas_acqrel(&w->lifo, &ref, 0))
        return ref;
    /* A look first (the owner's to read), then the entry taken from under
     * the newer ones: a task joined in the order spawned sits under its
     * younger siblings. */
    /* Only thieves move the ring between the look and the take, and they
     * take from the top: what is taken is ref, or nothing. */
    if ((depth = ring_find(&w->ring, ref, DIG_MAX)) == 0 ||
        (x = ring_take_at(&w->ring, depth)) == 0)
        return 0;
    return x;
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

/* Room on the running stack (above its floor: its low end less a reserve
 * for the run itself) and in held[]. Past it, a run nests on a fresh
 * stack instead (pool_aside.c: the first task of the stack taken). */
bool atap__pool_run_past_room(struct worker *w, uint32_t x)
{
    if (!held_room(w)) { /* no memory to record it: back to the queues */
        atap__pool_push_ring(w, x);
        return false;
    }
    atap__pool.ops->run(w, x);
    return true;
}

bool atap__pool_room(struct worker *w)
{
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);

    if (here < w->stack_low) /* how deep the stack went: pool_aside.c trims */
        w->stack_low = here;
    return here > w->stack_floor && w->depth <= HELP_LIMIT() && held_room(w);
}

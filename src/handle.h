/*
 * A handle's slot, for the files that act on handles (executor.c, read.c).
 * A handle is index | gen << 32; it names its task while the slot's word
 * and refs carry that generation and a handle is left (slot.h).
 */
#ifndef ATAP_HANDLE_H
#define ATAP_HANDLE_H

#include <stdbool.h>
#include <stdint.h>

#include "atap.h"
#include "atomics.h"
#include "slot.h"
#include "table.h"

/* The slot a handle names, with its generation in *gen; NULL for a
 * generation no slot ever has or an index no block is mapped for. */
static inline struct atap_slot *lookup(atap_task t, uint32_t *gen)
{
    uint32_t g = (uint32_t)(t.id >> 32);

    if (g == 0 || g > GEN_MAX)
        return NULL;
    *gen = g;
    return atap__table_slot((uint32_t)t.id);
}

/* The word is the task of generation gen's, and the slot is in use. */
static inline bool word_is(uint32_t w, uint32_t gen)
{
    return word_gen(w) == gen && word_state(w) != ST_FREE;
}

/* A handle names its task while the generation matches and a handle is
 * left: once the last handle is released, every copy reads ATAP_ENOTASK even
 * while the run, or any of the runtime's holds, still keeps the slot.
 * Acquire on both: what the task's last transition published (an output, a
 * failure code) is seen. */
static inline bool handle_live(struct atap_slot *s, uint32_t gen, uint32_t *cur)
{
    uint64_t r;

    *cur = ld_acquire(&s->word);
    if (!word_is(*cur, gen))
        return false;
    r = ld_acquire(&s->refs);
    return refs_gen(r) == gen && (r & REFS_HANDLES_MASK) != 0;
}

#endif

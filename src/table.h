/*
 * The slot table: every task in the process, addressed by index.
 * See table.c for the layout and the free list's invariants.
 */
#ifndef ATAP_TABLE_H
#define ATAP_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"
#include "slot.h"

#define TABLE_FIRST_LOG2 8u /* the first block holds 256 slots */
#define TABLE_BLOCKS 23u
#define TABLE_MAX_INDEX ((UINT32_C(256) << TABLE_BLOCKS) - 256u) /* exclusive */

/*
 * A thread's own stash of free slots, so a worker that frees and spawns
 * touches no shared line: one writer (the owning thread), read by stats.
 * Slots in a stash are free but off the shared list; a full stash gives half
 * back in one CAS. Large enough for a deep recursion of joins to go down and
 * back up again without the shared list (each pop there is a CAS and,
 * often, a miss on a slot another thread freed): a tree of joins spent 4 %
 * of its time in atap__table_alloc_shared with 64.
 */
#define SLOT_CACHE 1024

struct slot_cache {
    /* Allocations and frees through this stash, only ever counted up (a
     * stash handed to a later thread goes on counting where it was). */
    _Atomic uint64_t allocs, frees;
    bool registered;
    uint32_t n;
    uint32_t idx[SLOT_CACHE];
};

/* The calling thread's stash when it is not one of the pool's threads, or
 * NULL when every outside stash is taken. The first call hands one out
 * (table.c); later calls read it from the thread's own variable. */
extern _Thread_local struct slot_cache *atap__table_outside_mine;
struct slot_cache *atap__table_outside_first(void);

static inline struct slot_cache *atap__table_outside_cache(void)
{
    struct slot_cache *c = atap__table_outside_mine;

    return c ? c : atap__table_outside_first();
}

/* The calling outside thread's seat at the door (spawn.c), which goes with
 * its stash (NULL with no stash); whether no seat is marked (acquire: what
 * a spawn did before it cleared its seat is seen). */
extern _Thread_local _Atomic unsigned *atap__table_outside_seat_mine;

static inline _Atomic unsigned *atap__table_outside_seat(void)
{
    _Atomic unsigned *seat = atap__table_outside_seat_mine;

    if (seat || !atap__table_outside_first())
        return seat;
    return atap__table_outside_seat_mine;
}

bool atap__table_outside_seats_empty(void);

/* Makes a stash count in atap__table_live (once per stash, never undone). */
void atap__table_register_cache(struct slot_cache *c);

/* The blocks, for the inline lookup below; table.c owns them. */
extern _Alignas(64) _Atomic(struct atap_slot *) atap__table_blocks[TABLE_BLOCKS];

/* Block b holds indices [256 * (2^b - 1), 256 * (2^(b+1) - 1)). */
static inline unsigned atap__table_block_of(uint32_t index, uint32_t *offset)
{
    uint32_t s = index + (1u << TABLE_FIRST_LOG2);
    unsigned b = (unsigned)(31 - __builtin_clz(s)) - TABLE_FIRST_LOG2;

    *offset = s - ((1u << TABLE_FIRST_LOG2) << b);
    return b;
}

/* The slot at index, or NULL when no memory is behind it (never issued).
 * Acquire pairs with the release CAS that installs a block: a block seen is
 * a block fully mapped. */
static inline struct atap_slot *atap__table_slot(uint32_t index)
{
    uint32_t off;
    struct atap_slot *base;

    if (index >= TABLE_MAX_INDEX)
        return NULL;
    base = ld_acquire(&atap__table_blocks[atap__table_block_of(index, &off)]);
    return base ? base + off : NULL;
}

/* The slot of an index known to be issued (queued, allocated or freed):
 * its block is mapped, so no check. */
static inline struct atap_slot *atap__table_at(uint32_t index)
{
    uint32_t off;
    unsigned b = atap__table_block_of(index, &off);

    return ld_acquire(&atap__table_blocks[b]) + off;
}

/* Every thread's stash back on the shared free list (a test's, with no
 * runtime running: runtime.c's atap__test_flush_caches). */
void atap__table_flush_caches(void);

/* The index of s, a slot of the table: a walk of the blocks, for the
 * trace and other paths off the hot ones. */
uint32_t atap__table_index_of(const struct atap_slot *s);

/* A trim never lowers the span below this (about 2 MiB of slots); a stash may
 * always keep slots below it. */
#define TRIM_KEEP 16384u

/* The shared paths of the two below (table.c). */
int atap__table_alloc_shared(struct slot_cache *cache, uint32_t *index, uint32_t *gen);
void atap__table_free_shared(struct slot_cache *cache, uint32_t index, uint32_t gen);

/* Counts one allocation or free in a stash: one writer, so a plain
 * read-modify-write. Release, and acquire in atap__table_live: whoever sees
 * a task counted out also sees everything its run did before it was freed,
 * and the allocation counted before it. */
static inline void atap__table_count(_Atomic uint64_t *counter)
{
    st_release(counter, ld_relaxed(counter) + 1);
}

/* Takes the newest slot of a (non-NULL) stash, if it has one. A stashed
 * slot was used before: its word holds its last generation, below GEN_MAX,
 * and *gen gets the next. False when there is none to take this way. */
static inline bool atap__table_take_stashed(struct slot_cache *cache, uint32_t *index,
                                            uint32_t *gen)
{
    uint32_t i, g;

    if (cache->n == 0)
        return false;
    i = cache->idx[cache->n - 1];
    g = word_gen(ld_relaxed(&atap__table_at(i)->word));
    if (g == 0)
        return false;
    cache->n--;
    *index = i;
    *gen = g + 1;
    atap__table_count(&cache->allocs);
    return true;
}

/* A free slot's index, with *gen the generation to give it; -ENOMEM.
 * cache: the calling thread's stash, or NULL. The stash is looked at here;
 * the rest is table.c's. */
static inline int atap__table_alloc(struct slot_cache *cache, uint32_t *index, uint32_t *gen)
{
    if (cache && atap__table_take_stashed(cache, index, gen))
        return 0;
    return atap__table_alloc_shared(cache, index, gen);
}

/* Gives a slot whose task is gone back (or retires it at GEN_MAX). A low
 * slot goes into a stash with room here; the rest is table.c's. */
static inline void atap__table_free(struct slot_cache *cache, uint32_t index, uint32_t gen)
{
    if (cache && index < TRIM_KEEP && gen < GEN_MAX && cache->n < SLOT_CACHE) {
        atap__table_count(&cache->frees);
        cache->idx[cache->n++] = index;
        return;
    }
    atap__table_free_shared(cache, index, gen);
}

size_t atap__table_live(void);
size_t atap__table_span(void);
size_t atap__table_peak(void);
int atap__table_trim(size_t *released);

/* In a fork's child only (its one thread; runtime.c): a new, empty table
 * whose generations start above every one the parent handed out. */
void atap__table_forget(void);

#endif

/*
 * Hooks for libatap's own test suite. Not part of the public API: they are
 * internal (atap__ prefix), hidden in the shared library, and only the
 * static library the tests link against exposes them.
 *
 * A handle's id is (generation << 32) | slot index. Generations start at 1
 * and go up by one each time a slot is reused; ATAP__GEN_MAX is the last one
 * a slot may carry before it is retired.
 */
#ifndef ATAP_TESTING_H
#define ATAP_TESTING_H

#include <stdint.h>
#include "atap.h"

#define ATAP__GEN_MAX ((1u << 27) - 1u)

static inline uint32_t atap__task_index(atap_task t) { return (uint32_t)t.id; }
static inline uint32_t atap__task_gen(atap_task t) { return (uint32_t)(t.id >> 32); }

/* Sets the generation a free slot will hand out next (its next reuse gets
 * gen + 1). Returns 0, or ATAP_EINVAL if the slot is not free or gen is out
 * of range. Single-threaded tests only. */
int atap__test_set_slot_gen(uint32_t index, uint32_t gen);

/* Moves every thread's stash of free slots back to the shared free list,
 * so the next spawns from any thread can reuse them. Only while no runtime
 * runs (every thread that owns a stash is gone): ATAP_EBUSY otherwise. */
int atap__test_flush_caches(void);

/* Calls hook (NULL: none) after each thread's stash a live count reads, on
 * the reading thread, so a test can allocate and free between two reads.
 * -ENOTSUP in a build without ATAP_FAULT_INJECTION. */
int atap__test_on_live_scan(void (*hook)(void));

#endif

/*
 * The shared queue: unbounded, allocation-free (linked through the slots'
 * `link`), FIFO inside a band. See injector.c. Four priority ranges, each
 * two bands: its first runs, and above them its resumed runs (a park's
 * deadline or event, a delayed start: work whose time has come, which
 * should not wait behind a burst of spawns). Entries are task references:
 * slot index + 1.
 */
#ifndef ATAP_INJECTOR_H
#define ATAP_INJECTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INJ_BANDS 8
#define INJ_AGE 64 /* pops a non-empty band may be passed over before it is served */

/* Both words count what went through them (mod 2^32, in their top half):
 * incoming the entries pushed, ready the entries popped (by pops, and by
 * flippers for the batch they keep), so a band's length is the difference,
 * with no counter of its own for pushers and poppers to fight over. */
struct inj_band {
    _Atomic uint64_t incoming; /* pushed << 32 | Treiber stack, newest first */
    char pad0[56];
    _Atomic uint64_t ready; /* popped << 32 | first, oldest first */
    atomic_flag flipping;
    char pad1[52];
};

struct injector {
    struct inj_band band[INJ_BANDS];
};

/* What a popper remembers between pops, so no band starves. */
struct inj_cursor {
    unsigned passed[INJ_BANDS];
};

/* priority: -128..127; due: a resumed run (one band above the range's
 * first runs, below the next range's). */
static inline int atap__inj_band(int priority, bool due)
{
    return ((priority + 128) >> 6) * 2 + (int)due;
}

/* Queues refs[0..n) (oldest first) in one band with one CAS. */
void atap__inj_push(struct injector *q, const uint32_t *refs, unsigned n, int band);

/* Takes up to max of the oldest entries of one band (the highest with work,
 * or one passed over INJ_AGE times); returns how many, oldest first. */
unsigned atap__inj_pop(struct injector *q, struct inj_cursor *c, uint32_t *out, unsigned max);

bool atap__inj_empty(struct injector *q);
size_t atap__inj_len(struct injector *q);

#endif

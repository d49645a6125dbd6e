/*
 * Waiting on a 32-bit word: futex on Linux, __ulock on macOS, _umtx_op on
 * FreeBSD. wait returns when the word no longer holds `expected`, when woken,
 * or at the timeout; callers always re-read the word, so spurious returns
 * are harmless. A wake between the caller's read and its wait is not lost:
 * the kernel compares the word under its own lock before sleeping.
 */
#ifndef ATAP_WAIT_H
#define ATAP_WAIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define ATAP__FOREVER UINT64_MAX

/* Returns false on timeout, true otherwise (woken, changed, interrupted).
 * A long timeout may be cut to what the kernel call takes (71 minutes on
 * macOS) and so time out early: callers with a deadline look at it again. */
bool atap__word_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
void atap__word_wake(_Atomic uint32_t *word, bool all);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t atap__now_ns(void);

/* now + ns, saturating at ATAP__FOREVER. */
static inline uint64_t atap__deadline(uint64_t now, uint64_t ns)
{
    return ns >= ATAP__FOREVER - now ? ATAP__FOREVER : now + ns;
}

/* ns from now, saturating; ATAP__FOREVER reads no clock (a park or wait
 * with no timeout, the common case, is asked for on every request). */
static inline uint64_t atap__deadline_in(uint64_t ns)
{
    return ns == ATAP__FOREVER ? ATAP__FOREVER : atap__deadline(atap__now_ns(), ns);
}

#endif

/*
 * join_first's wake-up (join.c), for whoever settles a task (executor.c)
 * and for a fork's child (gate.c resets the count).
 */
#ifndef ATAP_JOIN_H
#define ATAP_JOIN_H

#include <stdint.h>

#include "atomics.h"

/* join_first callers asleep now, counted before they look (join.c). */
extern _Atomic uint32_t atap__first_waiters;
void atap__join_notify(void);

/* A task's state moved on with WAITERS set: a join_first asleep on the
 * settle count looks again. One relaxed load when none waits. Sequenced
 * after the state CAS, which saw WAITERS: the join_first that set it had
 * counted itself first, so this load sees it. */
static inline void atap__join_settled(void)
{
    if (unlikely(ld_acquire(&atap__first_waiters) != 0))
        atap__join_notify();
}

#endif

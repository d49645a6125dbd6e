/*
 * Fault injection (ATAP_FAULT_INJECTION builds only): owed faults are
 * counters; a check costs one relaxed load while nothing is owed. Without
 * the option every check is a constant false and compiles away.
 */
#ifndef ATAP_FAULTS_H
#define ATAP_FAULTS_H

#include <stdbool.h>
#include <stdlib.h>

#include "atomics.h"
#include "testing.h"

#include <limits.h>

#define HELP_DEPTH UINT_MAX /* tasks run nested by waits: no limit but the stack */

#ifdef ATAP_FAULT_INJECTION
#include "atap/inject.h" /* the atap_inject_* calls the owed faults come from */

extern _Atomic unsigned atap__owed_worker_deaths, atap__owed_blocking_deaths;
extern _Atomic unsigned atap__owed_spawn_refusals, atap__help_limit, atap__owed_arm_pause_ms;
extern _Atomic unsigned atap__owed_watch_failures;
extern _Atomic unsigned atap__owed_alloc_failures;

/* Takes one owed fault, if any. */
static inline bool atap__fault_take(_Atomic unsigned *owed)
{
    unsigned n = ld_relaxed(owed);

    while (n > 0)
        if (casw_relaxed(owed, &n, n - 1))
            return true;
    return false;
}

#define FAULT_WORKER_DIES(blocking)                                                                \
    atap__fault_take((blocking) ? &atap__owed_blocking_deaths : &atap__owed_worker_deaths)
#define FAULT_SPAWN_REFUSED() atap__fault_take(&atap__owed_spawn_refusals)
/* A watch renewed for parks already waiting fails: a source's after a
 * report (sources.c), an fd's after a report, a park leaving, a manager
 * restart or a tick's retry (park_fd.c). */
#define FAULT_WATCH_FAILS() atap__fault_take(&atap__owed_watch_failures)
/* Read under the pool lock before an idle thread sleeps: the injecting call
 * adds, then takes the lock to wake the idle, so one of the two sees it. */
#define FAULT_DEATH_OWED(blocking)                                                                 \
    (ld_relaxed((blocking) ? &atap__owed_blocking_deaths : &atap__owed_worker_deaths) > 0)
#define HELP_LIMIT() ld_relaxed(&atap__help_limit)
/* Takes an owed pause, if any: its length in ms, else 0. */
#define FAULT_ARM_PAUSE_MS()                                                                       \
    (ld_relaxed(&atap__owed_arm_pause_ms) ? xchg_relaxed(&atap__owed_arm_pause_ms, 0) : 0u)
/* The test hooks (testing.h), each called where its point says. */
extern void (*_Atomic atap__test_hooks[ATAP__TEST_POINTS])(void);
#define TEST_HOOK(point)                                                                           \
    do {                                                                                           \
        void (*hook_)(void) = ld_relaxed(&atap__test_hooks[point]);                                \
        if (unlikely(hook_ != NULL))                                                               \
            hook_();                                                                               \
    } while (0)
/* An allocation at an instrumented site: the ATAP__TEST_ALLOC hook runs
 * first (where the site stands, locks and all), then an owed failure, if
 * any, makes it NULL as malloc out of memory would. */
static inline void *atap__fault_malloc(size_t n)
{
    TEST_HOOK(ATAP__TEST_ALLOC);
    return atap__fault_take(&atap__owed_alloc_failures) ? NULL : malloc(n);
}
#define FAULT_MALLOC(n) atap__fault_malloc(n)
#else
#define FAULT_WORKER_DIES(blocking) ((void)(blocking), false)
#define FAULT_SPAWN_REFUSED() false
#define FAULT_WATCH_FAILS() false
#define FAULT_DEATH_OWED(blocking) ((void)(blocking), false)
#define HELP_LIMIT() HELP_DEPTH
#define FAULT_ARM_PAUSE_MS() 0u
#define TEST_HOOK(point) ((void)0)
#define FAULT_MALLOC(n) malloc(n)
#endif

#endif

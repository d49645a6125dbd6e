/*
 * The atap_inject_* calls: they only set counters that the pool's checks
 * (faults.h) consume. A thread that takes an owed death leaves through
 * pthread_exit, the same path as a task that kills its thread, so the
 * recovery tested is the real one (atap_inject_thread_deaths, which also
 * wakes idle threads, is pool_recover.c's). Also the hooks testing.h
 * declares for the table's own tests.
 */
#include "faults.h"

#include <errno.h>

#include "atap.h"
#include "testing.h"

#ifdef ATAP_FAULT_INJECTION
_Atomic unsigned atap__owed_worker_deaths, atap__owed_blocking_deaths;
_Atomic unsigned atap__owed_spawn_refusals, atap__help_limit = HELP_DEPTH;
_Atomic unsigned atap__owed_arm_pause_ms;
_Atomic unsigned atap__owed_watch_failures;
_Atomic unsigned atap__owed_alloc_failures;

void atap_inject_spawn_refusals(unsigned n) { st_relaxed(&atap__owed_spawn_refusals, n); }

void atap_inject_help_depth(unsigned depth) { st_relaxed(&atap__help_limit, depth); }

void atap_inject_arm_pause(unsigned ms) { st_relaxed(&atap__owed_arm_pause_ms, ms); }

void atap_inject_watch_failures(unsigned n) { st_relaxed(&atap__owed_watch_failures, n); }

void atap_inject_alloc_failures(unsigned n) { st_relaxed(&atap__owed_alloc_failures, n); }

void (*_Atomic atap__test_hooks[ATAP__TEST_POINTS])(void);

int atap__test_on(int point, void (*hook)(void))
{
    if (point < 0 || point >= ATAP__TEST_POINTS)
        return ATAP_EINVAL;
    st_relaxed(&atap__test_hooks[point], hook);
    return 0;
}
#else
int atap__test_on(int point, void (*hook)(void))
{
    (void)point, (void)hook;
    return -ENOTSUP;
}
#endif

/*
 * libatap's fault injection (not installed; see below).
 */
#ifndef ATAP_INJECT_H
#define ATAP_INJECT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Fault injection, for libatap's own tests and for a program that vendors
 * libatap to test itself against its faults: the calls are in a build with
 * -DATAP_FAULT_INJECTION=ON (and always in the tests' own copy,
 * atap_testing). This header is not installed. Each check costs the runtime
 * one relaxed load while nothing is owed.
 *   atap_inject_manager_faults: the manager falls apart the next n times
 *     it comes back from its wait (at the latest its next 10 ms tick), at
 *     the worst moment: before it hands out what the wait reported. The
 *     call does not wake it, so an event that wakes it first is one it dies
 *     holding. Up to 5 in a row it is restarted (after 10 ms x the
 *     count); past that its supervisor gives up, atap_status says so, and
 *     runs the pool's tick itself (the pool grows, hands work over and
 *     reaps as before; timers and parks are written off: ATAP_EFAILED).
 *   atap_inject_thread_deaths: the next `workers` workers and `blocking`
 *     blocking threads to pass a check die, idle, holding a task, or part way
 *     through helping, as if the task had called pthread_exit.
 *   atap_inject_spawn_refusals: the next n thread starts fail as if the
 *     kernel refused them (0 clears what is still owed).
 *   atap_inject_help_depth: a wait inside a task runs at most this many
 *     tasks nested on its thread's stack (0: none); the default is no
 *     limit but the stack's room (UINT_MAX).
 *   atap_inject_arm_pause: the next repeat or delayed task to hand its run
 *     to a timer stops for ms milliseconds right after (0 clears it), so a
 *     test can make the manager go while that hand-over is under way.
 *   atap_inject_watch_failures: the next n times a signal or path source
 *     is watched again after a report, or a parked fd is watched again for
 *     the parks still waiting on it (after a report, a park leaving, a
 *     manager restart, or a manager tick trying again a watch that
 *     failed), the watch fails as if the kernel had no memory (-ENOMEM; 0
 *     clears what is still owed). A park's own first watch of an fd never
 *     fails so.
 *   atap_inject_alloc_failures: the next n allocations at the sites that
 *     have a fallback for no memory fail as if memory had run out (0 clears
 *     what is still owed): a receive_all round's next buffer, the values
 *     a channel's last receiver drops.
 */
ATAP_EXPORT void atap_inject_manager_faults(unsigned n);
ATAP_EXPORT void atap_inject_thread_deaths(unsigned workers, unsigned blocking);
ATAP_EXPORT void atap_inject_spawn_refusals(unsigned n);
ATAP_EXPORT void atap_inject_help_depth(unsigned depth);
ATAP_EXPORT void atap_inject_arm_pause(unsigned ms);
ATAP_EXPORT void atap_inject_watch_failures(unsigned n);
ATAP_EXPORT void atap_inject_alloc_failures(unsigned n);

#ifdef __cplusplus
}
#endif

#endif /* ATAP_INJECT_H */

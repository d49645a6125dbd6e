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

#include <stdbool.h>
#include <stdint.h>
#include "atap.h"

#define ATAP__GEN_MAX ((1u << 27) - 1u)

static inline uint32_t atap__task_index(atap_task t) { return (uint32_t)t.id; }
static inline uint32_t atap__task_gen(atap_task t) { return (uint32_t)(t.id >> 32); }

/* Sets the generation a free slot will hand out next (its next reuse gets
 * gen + 1). Returns 0, or ATAP_EINVAL if the slot is not free or gen is out
 * of range. Single-threaded tests only. */
int atap__test_set_slot_gen(uint32_t index, uint32_t gen);

/* Makes spawns from outside the pool mark themselves at the door with the
 * process-wide barrier (on: the default where the system has one) or with
 * the seq_cst count every system has (off) (spawn.c). Only while no runtime
 * runs and no other thread spawns: ATAP_EBUSY otherwise. Returns 1 when the
 * barrier is in use, 0 when not. */
int atap__test_door_barrier(bool on);

/* Moves every thread's stash of free slots back to the shared free list,
 * so the next spawns from any thread can reuse them. Only while no runtime
 * runs (every thread that owns a stash is gone): ATAP_EBUSY otherwise. */
int atap__test_flush_caches(void);

/* Points where a test may run code of its own, on the thread passing by:
 *   ATAP__TEST_LIVE_SCAN     after each thread's stash a live count reads
 *                            (table.c), to allocate and free between reads;
 *   ATAP__TEST_RELEASE_READ  in atap_release, between its first read of the
 *                            reference word and its CAS (executor.c);
 *   ATAP__TEST_PARK_ARMING   a park record just marked ARMING, before it is
 *                            registered and armed (park.c);
 *   ATAP__TEST_MANAGER_JOINED  a shutdown that has joined the supervisor,
 *                            before it takes the timers back (manager.c);
 *   ATAP__TEST_SOURCE_READ   the manager about to read a signal or path
 *                            source's queue (sources.c);
 *   ATAP__TEST_PARK_TIMED    a park record's timer just armed, the park
 *                            still ARMING (park.c);
 *   ATAP__TEST_PARK_FIRE     a park record's timer fired, its claim word
 *                            and deadline read, before it claims (park.c);
 *   ATAP__TEST_KICK          a waiting task's start admitted, before it is
 *                            queued or armed (schedule.c);
 *   ATAP__TEST_ADMITTED      a spawn from outside the pool admitted at the
 *                            door, before it queues anything (spawn.c);
 *   ATAP__TEST_ALLOC         an allocation at a site atap_inject_alloc_failures
 *                            reaches, before it is made (faults.h);
 *   ATAP__TEST_WAKE_LIVE     a wake that found its task queued or running,
 *                            before it counts itself (park.c);
 *   ATAP__TEST_STOP_WAKE     a stop that claimed a park for a wake, before it
 *                            looks for a wake pending (park.c);
 *   ATAP__TEST_HUB_WAKE      a wake of the hub's poller, still counted in
 *                            (hub.c);
 *   ATAP__TEST_MANAGER_AWAKE the manager back from its wait, before it
 *                            takes the wheel's seat (manager.c);
 *   ATAP__TEST_WHEEL_HELP    a busy worker that has taken the wheel's seat,
 *                            before it runs the wheel (park_wheel.c);
 *   ATAP__TEST_TAIL_ARM      a deadline park in the slot about to be armed,
 *                            before its claim word reads ARMED (park_wheel.c);
 *   ATAP__TEST_SEARCHING     a worker spinning as a searcher, before each of
 *                            its looks for work (pool.c). */
enum {
    ATAP__TEST_LIVE_SCAN,
    ATAP__TEST_RELEASE_READ,
    ATAP__TEST_PARK_ARMING,
    ATAP__TEST_MANAGER_JOINED,
    ATAP__TEST_SOURCE_READ,
    ATAP__TEST_PARK_TIMED,
    ATAP__TEST_PARK_FIRE,
    ATAP__TEST_KICK,
    ATAP__TEST_ALLOC,
    ATAP__TEST_WAKE_LIVE,
    ATAP__TEST_STOP_WAKE,
    ATAP__TEST_HUB_WAKE,
    ATAP__TEST_MANAGER_AWAKE,
    ATAP__TEST_WHEEL_HELP,
    ATAP__TEST_TAIL_ARM,
    ATAP__TEST_ADMITTED,
    ATAP__TEST_SEARCHING,
    ATAP__TEST_POINTS
};

/* The CPUs this process may run on (cpus.c): the pool's default base
 * count of workers, and what its target and blocking cap are counted in.
 * atap__cgroup_cpus reads a cgroup v2 quota from a listing and a mount of
 * the test's own making (cpus.h). */
unsigned atap__cpus(void);
unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount);
/* The cgroup v1 quota, from a listing and a mountinfo of the test's own
 * making (cpus.h). */
unsigned atap__cgroup_v1_cpus(const char *self_cgroup, const char *mountinfo);
/* The threads the cgroup's pids.max leaves, read likewise (cpus.h). */
unsigned atap__cgroup_pids_room(const char *self_cgroup, const char *mount);

/* Sets the hook at point (NULL: none). ATAP_EINVAL for an unknown point,
 * -ENOTSUP in a build without ATAP_FAULT_INJECTION. */
int atap__test_on(int point, void (*hook)(void));

/* Sets how long a manager must live for its supervisor to start counting
 * quick deaths over (5 s by default; past 5 quick deaths in a row it gives
 * up); returns the old value. 0: every death counts as the first, so a test
 * may kill the manager any number of times. Fault injection builds only. */
uint64_t atap__test_restart_window(uint64_t ns);

/* true: process tasks spawned from now on take no pidfd, as on a kernel
 * without pidfd_open, and look for their child's exit every 10 ms
 * (tasks/process.c). Linux only; a no-op elsewhere. */
void atap__test_proc_no_pidfd(bool on);

/* true: socket sendfile tasks run from now on read and send through a
 * buffer, as where the platform has no sendfile (tasks/net.c). */
void atap__test_net_no_sendfile(bool on);

/* true: every trace event recorded from now on is dropped and counted, as
 * when the trace's buffers are full (trace.c). Fault injection builds only;
 * a no-op elsewhere. */
void atap__test_trace_drop(bool on);

#endif

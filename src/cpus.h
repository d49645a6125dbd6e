/*
 * The CPUs this process may run on (cpus.c): affinity and cgroup quota,
 * not the machine's core count; and the threads the kernel would still let
 * it start.
 */
#ifndef ATAP_CPUS_H
#define ATAP_CPUS_H

#include <stdbool.h>
#include <stddef.h>

/* The CPUs this process may run on now; at least 1. */
unsigned atap__cpus(void);

/* The cgroup v2 CPU quota, in whole CPUs rounded up, of the cgroup that
 * self_cgroup (a /proc/self/cgroup listing) names under mount (where
 * cgroup2 is mounted), the smallest of it and the cgroups above it; 0 when
 * none sets one. Its own function so that tests can hand it a tree of
 * their own (testing.h). */
unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount);

/* The cgroup v1 CPU quota (cpu.cfs_quota_us / cpu.cfs_period_us), in whole
 * CPUs rounded up, of the cgroup that self_cgroup lists for the cpu
 * controller, under that controller's mount as the mountinfo listing (a
 * /proc/self/mountinfo) gives it, the smallest of it and the cgroups above
 * it up to the mount; 0 when none sets one. For tests, as above. */
unsigned atap__cgroup_v1_cpus(const char *self_cgroup, const char *mountinfo);

/* The threads the kernel would let this process start now, on top of those
 * it runs, each reserving per_thread bytes of address space (its stack and
 * guard): the fewest that RLIMIT_NPROC, the cgroup's pids.max and
 * RLIMIT_AS leave (cpus.c's top says how each is counted); UINT_MAX when
 * none limits. */
unsigned atap__thread_room(size_t per_thread);

/* What cgroup v2 pids.max less pids.current leaves in the cgroup that
 * self_cgroup names under mount, the fewest of it and the cgroups above
 * it; UINT_MAX when none sets a limit. For tests, as atap__cgroup_cpus. */
unsigned atap__cgroup_pids_room(const char *self_cgroup, const char *mount);

#endif

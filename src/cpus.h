/*
 * The CPUs this process may run on (cpus.c): affinity and cgroup quota,
 * not the machine's core count.
 */
#ifndef ATAP_CPUS_H
#define ATAP_CPUS_H

#include <stdbool.h>

/* The CPUs this process may run on now; at least 1. */
unsigned atap__cpus(void);

/* The cgroup v2 CPU quota, in whole CPUs rounded up, of the cgroup that
 * self_cgroup (a /proc/self/cgroup listing) names under mount (where
 * cgroup2 is mounted), the smallest of it and the cgroups above it; 0 when
 * none sets one. Its own function so that tests can hand it a tree of
 * their own (testing.h). */
unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount);

#endif

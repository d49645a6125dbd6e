/*
 * The CPUs this process may run on: what the pool sizes itself by (its
 * default worker count, its target, the cap on blocking threads).
 *
 * Not the machine's core count. On Linux, the smaller of:
 *   - the affinity mask (sched_getaffinity): `taskset -c 0`, a cpuset, a
 *     container pinned to some cores;
 *   - the cgroup v2 CPU quota (cpu.max, "quota period" or "max ...") of the
 *     process's cgroup and of every cgroup above it, each rounded up to
 *     whole CPUs (1.5 CPUs counts 2); the smallest holds.
 * cgroup v1's cpu.cfs_quota_us is not read. Elsewhere the online CPUs
 * (sysconf). Never 0. Read at each start of the runtime (atap_init), never
 * on a hot path: a few small files and one system call.
 */
#include "cpus.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif

static unsigned online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    return n > 0 ? (n < (long)UINT_MAX ? (unsigned)n : UINT_MAX) : 1;
}

#if defined(__linux__)

/* CPUs in the affinity mask, 0 if it cannot be read. The mask is sized up
 * until the kernel's fits (EINVAL below its size), to 64 Ki CPUs. */
static unsigned affinity_cpus(void)
{
    for (size_t ncpu = 1024; ncpu <= 65536; ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC(ncpu);
        size_t size = CPU_ALLOC_SIZE(ncpu);
        int n = 0;

        if (!set)
            return 0;
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(0, size, set) == 0)
            n = CPU_COUNT_S(size, set);
        else
            n = -1;
        CPU_FREE(set);
        if (n >= 0)
            return (unsigned)n;
    }
    return 0;
}

/* One cpu.max file: its quota in whole CPUs (rounded up), 0 for none
 * ("max"), no file, or a line that does not parse. */
static unsigned quota_at(const char *dir)
{
    char path[PATH_MAX], line[64];
    unsigned long long quota, period;
    FILE *f;
    int got;

    if (snprintf(path, sizeof path, "%s/cpu.max", dir) >= (int)sizeof path)
        return 0;
    if (!(f = fopen(path, "re")))
        return 0;
    got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!got || sscanf(line, "%llu %llu", &quota, &period) != 2 || period == 0 || quota == 0)
        return 0; /* "max 100000" reads as no quota */
    quota = quota / period + (quota % period != 0);
    return quota < UINT_MAX ? (unsigned)quota : UINT_MAX;
}

/* The cgroup v2 path in a /proc/self/cgroup listing ("0::/path"), into
 * path; false if there is none. */
static bool v2_path(const char *self_cgroup, char *path, size_t size)
{
    char line[PATH_MAX + 64];
    bool found = false;
    FILE *f = fopen(self_cgroup, "re");

    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f)) {
        size_t len = strlen(line);

        if (strncmp(line, "0::", 3) != 0 || len - 3 >= size)
            continue;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        memcpy(path, line + 3, len - 2);
        found = true;
    }
    fclose(f);
    return found;
}

unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount)
{
    char rel[PATH_MAX], dir[PATH_MAX];
    unsigned best = 0, q;
    size_t base;

    /* A path outside this cgroup namespace's view ("/../..") or none: the
     * mount's own cpu.max, which is the namespace root's. */
    if (!v2_path(self_cgroup, rel, sizeof rel) || rel[0] != '/' || strstr(rel, "/..") ||
        snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") == 0 ? "" : rel) >=
            (int)sizeof dir)
        return quota_at(mount);
    /* From the process's cgroup up to the mount: the smallest quota holds. */
    base = strlen(mount);
    for (;;) {
        if ((q = quota_at(dir)) != 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base || !slash || (size_t)(slash - dir) < base)
            break;
        *slash = '\0';
    }
    return best;
}

unsigned atap__cpus(void)
{
    unsigned n = affinity_cpus(), q = atap__cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");

    if (n == 0)
        n = online_cpus();
    if (q != 0 && q < n)
        n = q;
    return n > 0 ? n : 1;
}

#else

unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount)
{
    (void)self_cgroup, (void)mount;
    return 0;
}

unsigned atap__cpus(void) { return online_cpus(); }

#endif

/*
 * The CPUs this process may run on: what the pool sizes itself by (its
 * default worker count, its target, the cap on blocking threads); and the
 * threads the kernel would still let it start, which bound its ceiling.
 *
 * Not the machine's core count. On Linux, the smaller of:
 *   - the affinity mask (sched_getaffinity): `taskset -c 0`, a cpuset, a
 *     container pinned to some cores;
 *   - the cgroup v2 CPU quota (cpu.max, "quota period" or "max ...") of the
 *     process's cgroup and of every cgroup above it, each rounded up to
 *     whole CPUs (1.5 CPUs counts 2); the smallest holds;
 *   - where v2 sets none (no unified hierarchy, or its cpu controller is
 *     not there), the cgroup v1 quota: cpu.cfs_quota_us over
 *     cpu.cfs_period_us of the process's cgroup under the v1 cpu
 *     controller's mount (found in /proc/self/mountinfo) and of every one
 *     above it up to that mount, rounded up likewise ("-1": none), as
 *     Rust's std and the JVM read it.
 * Elsewhere the online CPUs (sysconf). Never 0. Read at each start of the
 * runtime (atap_init), never on a hot path: a few small files and one
 * system call.
 *
 * Threads (atap__thread_room): the fewest of what each limit leaves, for
 * threads on top of those running now:
 *   - RLIMIT_NPROC less the process's own threads (Linux counts threads;
 *     the user's other processes count too but are not seen: a refused
 *     start tells the pool the rest, pool_grow.c);
 *   - the cgroup v2 pids.max of the process's cgroup and of every one
 *     above it, less its pids.current;
 *   - RLIMIT_AS less the address space in use, divided by what a thread
 *     reserves (its stack and guard page).
 * Read at a start and when the pool would grow past its ceiling, never on a
 * hot path.
 */
#include "cpus.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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

/* The first line of file `name` in dir, into line; false if none. */
static bool first_line(const char *dir, const char *name, char *line, int size)
{
    char path[PATH_MAX];
    FILE *f;
    bool got;

    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return false;
    if (!(f = fopen(path, "re")))
        return false;
    got = fgets(line, size, f) != NULL;
    fclose(f);
    return got;
}

/* A CFS quota over its period in whole CPUs, rounded up (period > 0). */
static unsigned whole_cpus(unsigned long long quota, unsigned long long period)
{
    quota = quota / period + (quota % period != 0);
    return quota < UINT_MAX ? (unsigned)quota : UINT_MAX;
}

/* One cpu.max file: its quota in whole CPUs (rounded up), 0 for none
 * ("max"), no file, or a line that does not parse. */
static unsigned quota_at(const char *dir)
{
    char line[64];
    unsigned long long quota, period;

    if (!first_line(dir, "cpu.max", line, sizeof line) ||
        sscanf(line, "%llu %llu", &quota, &period) != 2 || period == 0 || quota == 0)
        return 0; /* "max 100000" reads as no quota */
    return whole_cpus(quota, period);
}

/* One cgroup's pids.max less its pids.current, plus 1 (0 is kept for
 * none: "max", no file, or a line that does not parse). */
static unsigned pids_at(const char *dir)
{
    char line[64];
    unsigned long long max, cur = 0;

    if (!first_line(dir, "pids.max", line, sizeof line) || sscanf(line, "%llu", &max) != 1)
        return 0; /* "max" reads as no limit */
    if (first_line(dir, "pids.current", line, sizeof line) && sscanf(line, "%llu", &cur) != 1)
        cur = 0;
    max = max > cur ? max - cur : 0;
    return max < UINT_MAX - 1 ? (unsigned)max + 1 : UINT_MAX;
}

/* Whether the comma-separated list (ending at a ':', a blank or the end)
 * holds the word `cpu` alone (not cpuacct, not cpuset). */
static bool lists_cpu(const char *list)
{
    for (const char *p = list; *p && *p != ':' && *p != ' ' && *p != '\n';) {
        size_t n = strcspn(p, ",: \n");

        if (n == 3 && strncmp(p, "cpu", 3) == 0)
            return true;
        p += n;
        if (*p == ',')
            p++;
    }
    return false;
}

/* The path of this process's cgroup in a /proc/self/cgroup listing
 * ("ID:CONTROLLERS:PATH" lines), into path: of cgroup v2 ("0::/path"), or
 * of the v1 hierarchy with the cpu controller ("4:cpu,cpuacct:/path");
 * false if there is none. */
static bool listed_path(const char *self_cgroup, bool v1, char *path, size_t size)
{
    char line[PATH_MAX + 64];
    bool found = false;
    FILE *f = fopen(self_cgroup, "re");

    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f)) {
        char *list = strchr(line, ':'), *rel = list ? strchr(list + 1, ':') : NULL;
        size_t len;

        if (!rel || (v1 ? !lists_cpu(list + 1) : strncmp(line, "0::", 3) != 0))
            continue;
        rel++;
        len = strcspn(rel, "\n");
        if (len >= size)
            continue;
        memcpy(path, rel, len);
        path[len] = '\0';
        found = true;
    }
    fclose(f);
    return found;
}

/* The smallest nonzero value `at` reads in the cgroup `rel` (a path from
 * its hierarchy's root, as /proc/self/cgroup lists it; NULL: none) under
 * mount and in every cgroup above it; 0 when none has one. */
static unsigned smallest_up(const char *rel, const char *mount, unsigned (*at)(const char *dir))
{
    char dir[PATH_MAX];
    unsigned best = 0, q;
    size_t base;

    /* A path outside this cgroup namespace's view ("/../..") or none: the
     * mount's own file, which is the namespace root's. */
    if (!rel || rel[0] != '/' || strstr(rel, "/..") ||
        snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") == 0 ? "" : rel) >=
            (int)sizeof dir)
        return at(mount);
    /* From the process's cgroup up to the mount: the smallest holds. */
    base = strlen(mount);
    for (;;) {
        if ((q = at(dir)) != 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base || !slash || (size_t)(slash - dir) < base)
            break;
        *slash = '\0';
    }
    return best;
}

/* smallest_up over the cgroup v2 that self_cgroup names. */
static unsigned smallest_v2(const char *self_cgroup, const char *mount,
                            unsigned (*at)(const char *dir))
{
    char rel[PATH_MAX];

    return smallest_up(listed_path(self_cgroup, false, rel, sizeof rel) ? rel : NULL, mount, at);
}

unsigned atap__cgroup_cpus(const char *self_cgroup, const char *mount)
{
    return smallest_v2(self_cgroup, mount, quota_at);
}

unsigned atap__cgroup_pids_room(const char *self_cgroup, const char *mount)
{
    unsigned room = smallest_v2(self_cgroup, mount, pids_at);

    return room == 0 ? UINT_MAX : room - 1;
}

/* ---- cgroup v1 ------------------------------------------------------------ */

/* One cpu.cfs_quota_us over cpu.cfs_period_us: whole CPUs rounded up, 0
 * for none ("-1"), no file, or a line that does not parse. */
static unsigned quota_v1_at(const char *dir)
{
    char line[64];
    long long quota;
    unsigned long long period;

    if (!first_line(dir, "cpu.cfs_quota_us", line, sizeof line) ||
        sscanf(line, "%lld", &quota) != 1 || quota <= 0 ||
        !first_line(dir, "cpu.cfs_period_us", line, sizeof line) ||
        sscanf(line, "%llu", &period) != 1 || period == 0)
        return 0;
    return whole_cpus((unsigned long long)quota, period);
}

/* A mountinfo field in place: its octal escapes (\040 for a blank) undone. */
static void unescape(char *field)
{
    char *to = field;

    for (const char *p = field; *p; to++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *to = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 4;
        } else {
            *to = *p++;
        }
    }
    *to = '\0';
}

/* The root and mount point of the cgroup v1 hierarchy that has the cpu
 * controller, from a /proc/self/mountinfo listing: "ID PARENT MAJ:MIN ROOT
 * MOUNT OPTIONS [OPTIONAL...] - cgroup SOURCE SUPER_OPTIONS". */
static bool v1_mount(const char *mountinfo, char *root, char *mount, size_t size)
{
    char line[2 * PATH_MAX + 256];
    bool found = false;
    FILE *f = fopen(mountinfo, "re");

    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f)) {
        char *save = NULL, *field[5], *dash = strstr(line, " - "), *type, *super;
        int n = 0;

        if (!dash)
            continue;
        *dash = '\0';
        type = strtok_r(dash + 3, " \n", &save);
        (void)strtok_r(NULL, " \n", &save); /* the source */
        super = strtok_r(NULL, " \n", &save);
        if (!type || strcmp(type, "cgroup") != 0 || !super || !lists_cpu(super))
            continue;
        save = NULL;
        for (char *t = strtok_r(line, " ", &save); t && n < 5; t = strtok_r(NULL, " ", &save))
            field[n++] = t;
        if (n < 5 || strlen(field[3]) >= size || strlen(field[4]) >= size)
            continue;
        unescape(field[3]);
        unescape(field[4]);
        memcpy(root, field[3], strlen(field[3]) + 1);
        memcpy(mount, field[4], strlen(field[4]) + 1);
        found = true;
    }
    fclose(f);
    return found;
}

unsigned atap__cgroup_v1_cpus(const char *self_cgroup, const char *mountinfo)
{
    char rel[PATH_MAX], root[PATH_MAX], mount[PATH_MAX];
    size_t n;

    if (!v1_mount(mountinfo, root, mount, sizeof mount))
        return 0;
    if (!listed_path(self_cgroup, true, rel, sizeof rel))
        return smallest_up(NULL, mount, quota_v1_at);
    /* The mount shows the hierarchy from `root` down (a container sees its
     * own cgroup as the mount's top): the path is taken from there. A path
     * outside it: the mount's own files. */
    n = strcmp(root, "/") == 0 ? 0 : strlen(root);
    if (n && (strncmp(rel, root, n) != 0 || (rel[n] != '/' && rel[n] != '\0')))
        return smallest_up(NULL, mount, quota_v1_at);
    return smallest_up(rel[n] ? rel + n : "/", mount, quota_v1_at);
}

/* Field `field` of a "Name:  value" line of /proc/self/status; 0 if none. */
static unsigned long long self_status(const char *field)
{
    char line[256];
    size_t len = strlen(field);
    unsigned long long v = 0;
    FILE *f = fopen("/proc/self/status", "re");

    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            if (sscanf(line + len + 1, "%llu", &v) != 1)
                v = 0;
            break;
        }
    fclose(f);
    return v;
}

static unsigned long long own_threads(void) { return self_status("Threads"); }

static unsigned long long address_space_used(void) { return self_status("VmSize") * 1024u; }

unsigned atap__cpus(void)
{
    unsigned n = affinity_cpus(), q = atap__cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");

    if (q == 0)
        q = atap__cgroup_v1_cpus("/proc/self/cgroup", "/proc/self/mountinfo");
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

unsigned atap__cgroup_pids_room(const char *self_cgroup, const char *mount)
{
    (void)self_cgroup, (void)mount;
    return UINT_MAX;
}

unsigned atap__cgroup_v1_cpus(const char *self_cgroup, const char *mountinfo)
{
    (void)self_cgroup, (void)mountinfo;
    return 0;
}

unsigned atap__cpus(void) { return online_cpus(); }

/* Not counted here: RLIMIT_NPROC keeps 256 for the program's own threads,
 * and the address space in use is not known (RLIMIT_AS is left to a
 * refused start). */
static unsigned long long own_threads(void) { return 256; }

static unsigned long long address_space_used(void) { return 0; }

#endif

static unsigned long long at_most_ull(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}

unsigned atap__thread_room(size_t per_thread)
{
    unsigned long long room = UINT_MAX, own, used;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        own = own_threads();
        room = at_most_ull(room, rl.rlim_cur > own ? rl.rlim_cur - own : 0);
    }
    if (per_thread > 0 && getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (used = address_space_used()) != 0)
        room = at_most_ull(room, rl.rlim_cur > used ? (rl.rlim_cur - used) / per_thread : 0);
    room = at_most_ull(room, atap__cgroup_pids_room("/proc/self/cgroup", "/sys/fs/cgroup"));
    return (unsigned)room;
}

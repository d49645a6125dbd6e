/*
 * How many threads the runtime starts: atap_config's workers and
 * blocking_threads, the ATAP_WORKERS / ATAP_BLOCKING_THREADS environment
 * overrides (the config wins), what is refused, and the default, which
 * follows the CPUs the process may run on (affinity, cgroup v2 quota, or
 * v1 where v2 sets none).
 *
 * Each test starts and stops the runtime itself and leaves the environment
 * as it found it (main clears both variables first, so a caller's own
 * setting does not leak in). The affinity test runs this binary again in a
 * child pinned to one CPU (--affinity-child).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include "test_util.h"
#include "testing.h" /* atap__cpus, atap__cgroup_cpus, atap__cgroup_v1_cpus */

static int ensure_stopped(void **state)
{
    (void)state;
    unsetenv("ATAP_WORKERS");
    unsetenv("ATAP_BLOCKING_THREADS");
    atomic_store(&g_release_all, 1);
    int rc = atap_shutdown();
    atomic_store(&g_release_all, 0);
    return rc == 0 && !atap_initialised() ? 0 : -1;
}

/* Waits until the pool has `want` workers (its floor is started at init,
 * threads may still be coming up), then a little more: it must not grow
 * past it with nothing to do. */
static size_t workers_settle(size_t want)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < want && now_ns() < end)
        sleep_us(500);
    sleep_ms(30);
    return pool_stats().workers;
}

static int init_workers(unsigned workers, unsigned blocking)
{
    atap_config cfg = {.size = sizeof cfg, .workers = workers, .blocking_threads = blocking};
    return atap_init(&cfg);
}

/* ---- blocking tasks held until let go: how many run at once ------------ */

static atomic_int b_now, b_most, b_go;

static int task_held_blocking(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    int n = atomic_fetch_add(&b_now, 1) + 1;
    int most = atomic_load(&b_most);
    while (n > most && !atomic_compare_exchange_weak(&b_most, &most, n))
        ;
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (!atomic_load(&b_go) && !released_all() && now_ns() < end)
        sleep_us(200);
    atomic_fetch_sub(&b_now, 1);
    return 0;
}

/* Spawns k blocking tasks that hold their threads until let go; returns
 * the most that ran at once while they were held. */
static int most_blocking_at_once(int k)
{
    enum { K_MAX = 16 };
    atap_task ts[K_MAX];

    assert_true(k <= K_MAX);
    atomic_store(&b_now, 0);
    atomic_store(&b_most, 0);
    atomic_store(&b_go, 0);
    for (int i = 0; i < k; i++)
        assert_int_equal(
            atap_spawn(&ts[i], task_held_blocking, NULL, &(atap_spawn_opts){.blocking = true}), 0);
    /* Give every thread the pool may start the time to start. */
    sleep_ms(300);
    int most = atomic_load(&b_most);
    atomic_store(&b_go, 1);
    for (int i = 0; i < k; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    return most;
}

/* ---- the config -------------------------------------------------------- */

static void test_config_workers_honoured(void **state)
{
    (void)state;
    static const unsigned counts[] = {1, 3, 6};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        assert_int_equal(init_workers(counts[i], 0), 0);
        assert_int_equal(workers_settle(counts[i]), counts[i]);
        struct atap_pool_stats st = pool_stats();
        assert_int_equal(st.peak_workers, counts[i]);
        assert_true(st.ceiling >= counts[i]);
        atap_task t = spawn8(task_value, (void *)(uintptr_t)(40 + i));
        assert_true(join8(t) == 40 + i);
        atap_release(t);
        assert_int_equal(atap_shutdown(), 0);
    }
}

static void test_config_default_follows_cpus(void **state)
{
    (void)state;
    unsigned cpus = atap__cpus();
    assert_true(cpus >= 1);
    /* never more than the machine has online */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(online < 1 || cpus <= (unsigned long)online);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(workers_settle(cpus), cpus);
    assert_int_equal(atap_shutdown(), 0);
}

static void test_config_blocking_threads_honoured(void **state)
{
    (void)state;
    assert_int_equal(init_workers(0, 2), 0);
    assert_int_equal(most_blocking_at_once(6), 2);
    assert_true(pool_stats().blocking_threads <= 2);
    assert_int_equal(atap_shutdown(), 0);

    assert_int_equal(init_workers(0, 1), 0);
    assert_int_equal(most_blocking_at_once(4), 1);
    assert_int_equal(atap_shutdown(), 0);
}

/* A caller built against an older atap.h passes a smaller size: the fields
 * past it read as 0, whatever the bytes beyond say. */
static void test_config_older_size_leaves_new_fields_default(void **state)
{
    (void)state;
    atap_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = offsetof(atap_config, workers);
    cfg.workers = 5;             /* beyond the old size: not looked at */
    cfg.blocking_threads = 9999; /* would be refused if it were */
    assert_int_equal(atap_init(&cfg), 0);
    assert_int_equal(workers_settle(cores()), cores());
    assert_int_equal(atap_shutdown(), 0);
}

static void test_config_invalid_counts_einval(void **state)
{
    (void)state;
    static const unsigned bad[] = {ATAP_THREADS_MAX + 1, 100000, UINT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(init_workers(bad[i], 0), ATAP_EINVAL);
        assert_false(atap_initialised());
        assert_int_equal(init_workers(0, bad[i]), ATAP_EINVAL);
        assert_false(atap_initialised());
    }
    /* nothing was counted: one good init and one shutdown stop it */
    assert_int_equal(init_workers(2, 2), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

/* ---- the environment --------------------------------------------------- */

static void test_config_env_workers_honoured(void **state)
{
    (void)state;
    assert_int_equal(setenv("ATAP_WORKERS", "3", 1), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(workers_settle(3), 3);
    assert_int_equal(atap_shutdown(), 0);

    /* a config that leaves workers at 0 still takes it */
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers_per_core = 1}),
                     0);
    assert_int_equal(workers_settle(3), 3);
    assert_int_equal(atap_shutdown(), 0);

    /* "0" and "" say nothing: the default */
    assert_int_equal(setenv("ATAP_WORKERS", "0", 1), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(workers_settle(cores()), cores());
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(setenv("ATAP_WORKERS", "", 1), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(workers_settle(cores()), cores());
    assert_int_equal(atap_shutdown(), 0);
    unsetenv("ATAP_WORKERS");
}

static void test_config_env_blocking_threads_honoured(void **state)
{
    (void)state;
    assert_int_equal(setenv("ATAP_BLOCKING_THREADS", "1", 1), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(most_blocking_at_once(4), 1);
    assert_int_equal(atap_shutdown(), 0);
    unsetenv("ATAP_BLOCKING_THREADS");
}

/* The config wins; the environment is read only for a field left at 0,
 * so a malformed variable the config overrides is not looked at. */
static void test_config_wins_over_env(void **state)
{
    (void)state;
    assert_int_equal(setenv("ATAP_WORKERS", "4", 1), 0);
    assert_int_equal(setenv("ATAP_BLOCKING_THREADS", "3", 1), 0);
    assert_int_equal(init_workers(2, 1), 0);
    assert_int_equal(workers_settle(2), 2);
    assert_int_equal(most_blocking_at_once(4), 1);
    assert_int_equal(atap_shutdown(), 0);

    /* one field from each */
    assert_int_equal(init_workers(2, 0), 0);
    assert_int_equal(workers_settle(2), 2);
    assert_int_equal(most_blocking_at_once(5), 3);
    assert_int_equal(atap_shutdown(), 0);

    assert_int_equal(setenv("ATAP_WORKERS", "lots", 1), 0);
    assert_int_equal(setenv("ATAP_BLOCKING_THREADS", "-1", 1), 0);
    assert_int_equal(init_workers(2, 2), 0);
    assert_int_equal(workers_settle(2), 2);
    assert_int_equal(atap_shutdown(), 0);
    unsetenv("ATAP_WORKERS");
    unsetenv("ATAP_BLOCKING_THREADS");
}

static void test_config_env_invalid_einval(void **state)
{
    (void)state;
    static const char *const bad[] = {"-1",
                                      "-0",
                                      "+2",
                                      "abc",
                                      "3x",
                                      " 3",
                                      "3 ",
                                      "0x10",
                                      "1025",
                                      "4.0",
                                      "99999999999999999999999"};
    static const char *const names[] = {"ATAP_WORKERS", "ATAP_BLOCKING_THREADS"};
    for (size_t n = 0; n < 2; n++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            assert_int_equal(setenv(names[n], bad[i], 1), 0);
            int rc = atap_init(NULL);
            if (rc != ATAP_EINVAL)
                fail_msg("%s=\"%s\": atap_init returned %d, not ATAP_EINVAL", names[n], bad[i], rc);
            assert_false(atap_initialised());
            atap_task t;
            assert_int_equal(atap_spawn(&t, task_value, NULL, NULL), ATAP_ENOTINIT);
        }
        /* the largest is taken (for blocking threads, which start on demand) */
        if (n == 1) {
            assert_int_equal(setenv(names[n], "1024", 1), 0);
            assert_int_equal(atap_init(NULL), 0);
            assert_int_equal(atap_shutdown(), 0);
        }
        unsetenv(names[n]);
    }
    /* with the variables gone, it starts */
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_shutdown(), 0);
}

/* The environment is read by the init that starts the runtime, not by a
 * later one that only counts a user. */
static void test_config_env_read_once_at_start(void **state)
{
    (void)state;
    assert_int_equal(setenv("ATAP_WORKERS", "2", 1), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(setenv("ATAP_WORKERS", "bad", 1), 0);
    assert_int_equal(atap_init(NULL), 0); /* running: counted, env not read */
    assert_int_equal(workers_settle(2), 2);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
    assert_int_equal(atap_init(NULL), ATAP_EINVAL); /* a fresh start reads it */
    unsetenv("ATAP_WORKERS");
}

/* ---- the CPUs the process may run on ----------------------------------- */

#if defined(__linux__)
/* The child: pinned to one CPU by its parent before exec. */
static int affinity_child(void)
{
    struct atap_pool_stats st;
    atap_task t;
    uint64_t v = 0;

    if (atap__cpus() != 1)
        return 10;
    if (atap_init(NULL) != 0)
        return 11;
    uint64_t end = now_ns() + ATAP_SEC(10);
    do {
        sleep_ms(20);
        atap_pool_stats(&st);
    } while (st.workers < 1 && now_ns() < end);
    if (st.workers != 1 || st.peak_workers != 1)
        return 12;
    if (atap_spawn(&t, task_value, (void *)(uintptr_t)5, &(atap_spawn_opts){.out_size = 8}) != 0 ||
        atap_join(t, &v, sizeof v) != 0 || v != 5)
        return 13;
    atap_release(t);
    return atap_shutdown() == 0 ? 0 : 14;
}

static void test_config_affinity_one_cpu_one_worker(void **state)
{
    (void)state;
    cpu_set_t mine;
    int first = -1, status = 0;

    CPU_ZERO(&mine);
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &mine))
            first = c;
    assert_true(first >= 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            _exit(20);
        execl("/proc/self/exe", "test_config", "--affinity-child", (char *)NULL);
        _exit(21);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("the child pinned to CPU %d exited %d", first, WEXITSTATUS(status));
}
#endif

#if defined(__linux__)
/* A cgroup tree of the test's own making for atap__cgroup_cpus. */
static char cg_root[64];

static void put_file(const char *rel, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", cg_root, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void make_dir(const char *rel)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", cg_root, rel);
    assert_int_equal(mkdir(path, 0700), 0);
}

static unsigned cg_cpus(void)
{
    char list[128], mount[128];
    snprintf(list, sizeof list, "%s/self_cgroup", cg_root);
    snprintf(mount, sizeof mount, "%s/fs", cg_root);
    return atap__cgroup_cpus(list, mount);
}

static void test_config_cgroup_quota(void **state)
{
    (void)state;
    snprintf(cg_root, sizeof cg_root, "/tmp/atap_cg_%ld", (long)getpid());
    assert_int_equal(mkdir(cg_root, 0700), 0);
    make_dir("fs");
    make_dir("fs/app");
    make_dir("fs/app/svc");

    /* no listing at all: the mount's own file, here none */
    assert_int_equal(cg_cpus(), 0);
    put_file("self_cgroup", "12:cpu,cpuacct:/x\n0::/app/svc\n");
    assert_int_equal(cg_cpus(), 0); /* no cpu.max anywhere */
    put_file("fs/app/svc/cpu.max", "max 100000\n");
    assert_int_equal(cg_cpus(), 0); /* "max": no quota */
    put_file("fs/app/svc/cpu.max", "150000 100000\n");
    assert_int_equal(cg_cpus(), 2); /* 1.5 CPUs, rounded up */
    put_file("fs/app/svc/cpu.max", "200000 100000\n");
    assert_int_equal(cg_cpus(), 2);
    put_file("fs/app/svc/cpu.max", "10000 100000\n");
    assert_int_equal(cg_cpus(), 1); /* a tenth of a CPU is one */
    /* a parent's smaller quota holds */
    put_file("fs/app/svc/cpu.max", "400000 100000\n");
    put_file("fs/app/cpu.max", "300000 100000\n");
    assert_int_equal(cg_cpus(), 3);
    put_file("fs/cpu.max", "100000 100000\n");
    assert_int_equal(cg_cpus(), 1);
    /* nonsense is no quota */
    put_file("fs/cpu.max", "garbage\n");
    put_file("fs/app/cpu.max", "0 100000\n");
    put_file("fs/app/svc/cpu.max", "100000 0\n");
    assert_int_equal(cg_cpus(), 0);
    /* the namespace's root ("0::/"), and a path outside the namespace's view:
     * the mount's own file */
    put_file("fs/cpu.max", "250000 100000\n");
    put_file("self_cgroup", "0::/\n");
    assert_int_equal(cg_cpus(), 3);
    put_file("self_cgroup", "0::/../../elsewhere\n");
    assert_int_equal(cg_cpus(), 3);
    /* cgroup v1 only: no v2 line, the mount's own file */
    put_file("self_cgroup", "4:cpu:/app\n");
    assert_int_equal(cg_cpus(), 3);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cg_root);
    assert_int_equal(system(cmd), 0);
}
static unsigned cg_v1_cpus(void)
{
    char list[128], info[128];
    snprintf(list, sizeof list, "%s/self_cgroup", cg_root);
    snprintf(info, sizeof info, "%s/mountinfo", cg_root);
    return atap__cgroup_v1_cpus(list, info);
}

/* A mountinfo with the root file system, a v1 memory hierarchy, and the
 * hierarchy with `super` options mounted at cg_root/dir (escaped as the
 * kernel writes it) showing `root` of its tree. */
static void put_mountinfo(const char *root, const char *dir, const char *super)
{
    char text[1024];
    snprintf(text, sizeof text,
             "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
             "30 22 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
             "31 22 0:27 %s %s/%s rw,nosuid,nodev shared:10 - cgroup cgroup %s\n",
             root, cg_root, dir, super);
    put_file("mountinfo", text);
}

static void put_quota(const char *dir, const char *quota, const char *period)
{
    char rel[128];
    snprintf(rel, sizeof rel, "%s/cpu.cfs_quota_us", dir);
    put_file(rel, quota);
    snprintf(rel, sizeof rel, "%s/cpu.cfs_period_us", dir);
    put_file(rel, period);
}

/* cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us under the cpu
 * controller's mount, found in mountinfo, the smallest from the process's
 * cgroup up to that mount. */
static void test_config_cgroup_v1_quota(void **state)
{
    char cmd[128];

    (void)state;
    snprintf(cg_root, sizeof cg_root, "/tmp/atap_cg1_%ld", (long)getpid());
    assert_int_equal(mkdir(cg_root, 0700), 0);
    make_dir("v1");
    make_dir("v1/app");
    make_dir("v1/app/svc");
    make_dir("v1/svc");
    make_dir("v1 sp");

    /* no mountinfo, or no hierarchy with the cpu controller */
    put_file("self_cgroup", "4:cpu,cpuacct:/app/svc\n2:memory:/app\n0::/\n");
    assert_int_equal(cg_v1_cpus(), 0);
    put_mountinfo("/", "v1", "rw,cpuacct");
    put_quota("v1/app/svc", "150000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 0); /* cpuacct is not cpu */
    put_mountinfo("/", "v1", "rw,cpuset");
    assert_int_equal(cg_v1_cpus(), 0);
    put_mountinfo("/", "v1", "rw,cpu,cpuacct");
    assert_int_equal(cg_v1_cpus(), 2); /* 1.5 CPUs, rounded up */
    put_quota("v1/app/svc", "-1\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 0); /* -1: no quota */
    /* a parent's smaller quota holds; the mount's own file counts too */
    put_quota("v1/app/svc", "400000\n", "100000\n");
    put_quota("v1/app", "250000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 3);
    put_quota("v1", "100000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 1);
    /* nonsense is no quota */
    put_quota("v1", "garbage\n", "100000\n");
    put_quota("v1/app", "100000\n", "0\n");
    put_quota("v1/app/svc", "0\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 0);
    /* the controller listed second in /proc/self/cgroup */
    put_quota("v1/app/svc", "200000\n", "100000\n");
    put_file("self_cgroup", "3:cpuacct,cpu:/app/svc\n");
    assert_int_equal(cg_v1_cpus(), 2);
    /* a container: the mount shows /app of the tree, so /app/svc is svc */
    put_mountinfo("/app", "v1", "rw,cpu,cpuacct");
    put_quota("v1/svc", "300000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 3);
    /* a cgroup outside the mount's root: the mount's own files */
    put_file("self_cgroup", "3:cpu:/other/x\n");
    put_quota("v1", "500000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 5);
    /* "/app" is not a prefix of "/apple" */
    put_file("self_cgroup", "3:cpu:/apple\n");
    assert_int_equal(cg_v1_cpus(), 5);
    /* no cpu line: the mount's own files */
    put_file("self_cgroup", "2:memory:/app\n");
    assert_int_equal(cg_v1_cpus(), 5);
    /* a mount point with a blank, which mountinfo writes as \040 */
    put_mountinfo("/", "v1\\040sp", "rw,cpu");
    put_file("self_cgroup", "3:cpu:/\n");
    put_quota("v1 sp", "70000\n", "100000\n");
    assert_int_equal(cg_v1_cpus(), 1);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cg_root);
    assert_int_equal(system(cmd), 0);
}

static unsigned cg_pids(void)
{
    char list[128], mount[128];
    snprintf(list, sizeof list, "%s/self_cgroup", cg_root);
    snprintf(mount, sizeof mount, "%s/fs", cg_root);
    return atap__cgroup_pids_room(list, mount);
}

/* The threads pids.max leaves (less pids.current), the fewest over the
 * cgroup and those above it; none set: no limit. */
static void test_config_cgroup_pids(void **state)
{
    char cmd[128];

    (void)state;
    snprintf(cg_root, sizeof cg_root, "/tmp/atap_cgp_%ld", (long)getpid());
    assert_int_equal(mkdir(cg_root, 0700), 0);
    make_dir("fs");
    make_dir("fs/app");
    make_dir("fs/app/svc");
    put_file("self_cgroup", "0::/app/svc\n");
    assert_int_equal(cg_pids(), UINT_MAX); /* no pids.max anywhere */
    put_file("fs/app/svc/pids.max", "max\n");
    assert_int_equal(cg_pids(), UINT_MAX);
    put_file("fs/app/svc/pids.max", "100\n");
    put_file("fs/app/svc/pids.current", "30\n");
    assert_int_equal(cg_pids(), 70);
    /* a parent with less room left holds */
    put_file("fs/app/pids.max", "500\n");
    put_file("fs/app/pids.current", "480\n");
    assert_int_equal(cg_pids(), 20);
    /* full, or past full: no room */
    put_file("fs/app/pids.current", "500\n");
    assert_int_equal(cg_pids(), 0);
    put_file("fs/app/pids.current", "510\n");
    assert_int_equal(cg_pids(), 0);
    /* a pids.current that does not parse counts none */
    put_file("fs/app/pids.max", "max\n");
    put_file("fs/app/svc/pids.current", "garbage\n");
    assert_int_equal(cg_pids(), 100);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cg_root);
    assert_int_equal(system(cmd), 0);
}
#endif

int main(int argc, char **argv)
{
#if defined(__linux__)
    if (argc > 1 && strcmp(argv[1], "--affinity-child") == 0)
        return affinity_child();
#else
    (void)argc, (void)argv;
#endif
    unsetenv("ATAP_WORKERS");
    unsetenv("ATAP_BLOCKING_THREADS");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_config_workers_honoured, ensure_stopped),
        cmocka_unit_test_teardown(test_config_default_follows_cpus, ensure_stopped),
        cmocka_unit_test_teardown(test_config_blocking_threads_honoured, ensure_stopped),
        cmocka_unit_test_teardown(test_config_older_size_leaves_new_fields_default, ensure_stopped),
        cmocka_unit_test_teardown(test_config_invalid_counts_einval, ensure_stopped),
        cmocka_unit_test_teardown(test_config_env_workers_honoured, ensure_stopped),
        cmocka_unit_test_teardown(test_config_env_blocking_threads_honoured, ensure_stopped),
        cmocka_unit_test_teardown(test_config_wins_over_env, ensure_stopped),
        cmocka_unit_test_teardown(test_config_env_invalid_einval, ensure_stopped),
        cmocka_unit_test_teardown(test_config_env_read_once_at_start, ensure_stopped),
#if defined(__linux__)
        cmocka_unit_test_teardown(test_config_affinity_one_cpu_one_worker, ensure_stopped),
        cmocka_unit_test(test_config_cgroup_quota),
        cmocka_unit_test(test_config_cgroup_v1_quota),
        cmocka_unit_test(test_config_cgroup_pids),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

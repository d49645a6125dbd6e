/*
 * Injected faults (ATAP_FAULT_INJECTION builds): threads dying idle, holding
 * a task, part way through helping; thread starts refused; shallow helping.
 * The pool must strand nothing and keep running.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>

#include "test_util.h"

static int setup(void **state) { return setup_runtime(state); }

static int teardown(void **state)
{
    atap_inject_help_depth(64);
    atap_inject_spawn_refusals(0);
    return teardown_runtime(state);
}

static uint64_t deaths(void) { return pool_stats().deaths; }

static bool wait_deaths(uint64_t want, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    while (deaths() < want && now_ns() < end)
        sleep_us(500);
    return deaths() >= want;
}

static int spin_a_little(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    static _Atomic unsigned sink;
    unsigned x = 0;
    for (unsigned i = 0; i < 2000; i++)
        x += i * i;
    atomic_fetch_add_explicit(&sink, x, memory_order_relaxed); /* keeps the loop */
    uint64_t v = (uint64_t)(uintptr_t)arg;
    memcpy(out, &v, sizeof v);
    return 0;
}

/* Workers die holding tasks: those read ATAP_EFAILED, the rest their
 * outputs, nothing waits forever, and the pool is whole again after. */
static void test_faults_workers_die_holding_tasks(void **state)
{
    (void)state;
    size_t n = scaled(20000, 4000), failed = 0;
    uint64_t d0 = deaths();
    atap_task *ts = calloc(n, sizeof *ts);

    assert_non_null(ts);
    for (size_t i = 0; i < n; i++) {
        if (i == n / 4)
            atap_inject_thread_deaths(3, 0);
        assert_int_equal(atap_spawn(&ts[i], spin_a_little, (void *)(uintptr_t)i,
                                    &(atap_spawn_opts){.out_size = 8}),
                         0);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        int rc = atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(60));
        if (rc == ATAP_EFAILED)
            failed++;
        else if (rc != 0 || v != i)
            fail_msg("task %zu: rc %d (%s), value %llu", i, rc, atap_strerror(rc),
                     (unsigned long long)v);
        atap_release(ts[i]);
    }
    free(ts);
    assert_true(wait_deaths(d0 + 3, ATAP_SEC(20)));
    assert_true(failed <= 3);
    assert_true(wait_live_back(ATAP_SEC(20)));
    struct atap_pool_stats st = pool_stats();
    assert_true(st.workers >= (size_t)cores());
    /* and it still runs work */
    atap_task t = spawn8(spin_a_little, (void *)(uintptr_t)5);
    assert_true(join8(t) == 5);
    atap_release(t);
}

/* An idle worker dies: it is replaced, and work still runs. */
static void test_faults_worker_dies_idle(void **state)
{
    (void)state;
    uint64_t d0 = deaths();

    atap_inject_thread_deaths(1, 0);
    assert_true(wait_deaths(d0 + 1, ATAP_SEC(20)));
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < (size_t)cores() && now_ns() < end)
        sleep_us(500);
    assert_true(pool_stats().workers >= (size_t)cores());
    atap_task t = spawn8(spin_a_little, (void *)(uintptr_t)9);
    assert_true(join8(t) == 9);
    atap_release(t);
}

static int nap(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    usleep(2000);
    return 0;
}

/* A blocking thread dies: every blocking task still settles. */
static void test_faults_blocking_thread_dies(void **state)
{
    (void)state;
    uint64_t d0 = deaths();
    atap_task t[6];
    int failed = 0;

    atap_inject_thread_deaths(0, 1);
    for (int i = 0; i < 6; i++)
        assert_int_equal(atap_spawn(&t[i], nap, NULL, &(atap_spawn_opts){.blocking = true}), 0);
    for (int i = 0; i < 6; i++) {
        int rc = atap_join_for(t[i], NULL, 0, ATAP_SEC(30));
        assert_true(rc == 0 || rc == ATAP_EFAILED);
        failed += rc == ATAP_EFAILED;
        atap_release(t[i]);
    }
    assert_true(wait_deaths(d0 + 1, ATAP_SEC(20)));
    assert_true(failed <= 1);
}

/* fib with a task per call: workers dying part way through helping leave
 * the tasks they were inside FAILED and strand nothing. */
static int task_fib(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t n = (uint64_t)(uintptr_t)arg, a = 0, b = 0;
    if (n < 2) {
        memcpy(out, &n, sizeof n);
        return 0;
    }
    atap_task t;
    if (atap_spawn(&t, task_fib, (void *)(uintptr_t)(n - 1), &(atap_spawn_opts){.out_size = 8}))
        return -1;
    int rc = task_fib(ctx, (void *)(uintptr_t)(n - 2), &b);
    int jrc = atap_join(t, &a, sizeof a);
    atap_release(t);
    if (rc || jrc)
        return -1;
    a += b;
    memcpy(out, &a, sizeof a);
    return 0;
}

static void test_faults_worker_dies_mid_help(void **state)
{
    (void)state;
    uint64_t d0 = deaths(), v = 0;
    atap_task t = spawn8(task_fib, (void *)(uintptr_t)22);

    sleep_us(2000);
    atap_inject_thread_deaths(2, 0);
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(60));
    assert_true((rc == 0 && v == 17711) || rc == ATAP_EFAILED);
    atap_release(t);
    assert_true(wait_deaths(d0 + 2, ATAP_SEC(20)));
    /* A dead thread's frames never release the handles they held (C has no
     * unwinding destructors): at most one child handle per frame it was
     * inside, 65 frames a thread, stays behind. Everything else is freed. */
    assert_true(wait_live_at_most(g_live_base + 2 * 65, ATAP_SEC(30)));
    /* and helping still works afterwards */
    t = spawn8(task_fib, (void *)(uintptr_t)18);
    assert_true(join8(t) == 2584);
    atap_release(t);
}

/* A replacement the kernel refuses: the remaining workers carry on, and a
 * spawn into a pool with no worker left starts one. */
static void test_faults_spawn_refused(void **state)
{
    (void)state;
    unsigned ncores = cores();
    uint64_t d0 = deaths();

    atap_inject_spawn_refusals(ncores);
    atap_inject_thread_deaths(ncores, 0); /* every worker dies, none replaced */
    assert_true(wait_deaths(d0 + ncores, ATAP_SEC(20)));
    atap_task t = spawn8(spin_a_little, (void *)(uintptr_t)3);
    assert_int_equal(atap_join_for(t, NULL, 0, 0) == ATAP_EINVAL, 1); /* size check first */
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(30)), 0);
    assert_true(v == 3);
    atap_release(t);
    assert_true(pool_stats().workers >= 1);
}

/* Every worker dies with its replacement refused; then work reaches the
 * shared queue other than by a spawn from outside: a delayed task, which
 * the manager queues. It runs, and the pool gets back to its floor. */
static void test_faults_no_worker_left_delayed_task(void **state)
{
    (void)state;
    unsigned ncores = cores();
    size_t floor = pool_stats().workers;
    uint64_t d0 = deaths();

    atap_inject_spawn_refusals(ncores);
    atap_inject_thread_deaths(ncores, 0);
    assert_true(wait_deaths(d0 + ncores, ATAP_SEC(20)));
    atap_inject_spawn_refusals(0); /* the kernel starts threads again */
    atap_task t;
    assert_int_equal(atap_spawn(&t, spin_a_little, (void *)(uintptr_t)5,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_MS(5)}),
                     0);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(30)), 0);
    assert_true(v == 5);
    atap_release(t);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (pool_stats().workers < floor && now_ns() < end)
        sleep_us(1000);
    assert_true(pool_stats().workers >= floor);
}

/* The start of the blocking thread a blocking task needs is refused: it is
 * started later (the manager's tick), and the task runs. */
static void test_faults_blocking_start_refused(void **state)
{
    (void)state;
    atap_task t;

    assert_int_equal(pool_stats().blocking_threads, 0); /* a fresh runtime: none yet */
    atap_inject_spawn_refusals(1);
    assert_int_equal(atap_spawn(&t, spin_a_little, (void *)(uintptr_t)9,
                                &(atap_spawn_opts){.out_size = 8, .blocking = true}),
                     0);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(30)), 0);
    assert_true(v == 9);
    atap_release(t);
}

/* An init whose first thread start is refused fails cleanly, and the next
 * init works. */
static void test_faults_init_refused(void **state)
{
    (void)state;
    assert_int_equal(atap_shutdown(), 0);
    atap_inject_spawn_refusals(1);
    int rc = atap_init(NULL);
    assert_int_equal(rc, -EAGAIN);
    assert_false(atap_initialised());
    assert_int_equal(atap_init(NULL), 0); /* teardown shuts it down */
}

static int task_deep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t n = (uint64_t)(uintptr_t)arg, below = 0;
    if (n > 0) {
        atap_task t;
        if (atap_spawn(&t, task_deep, (void *)(uintptr_t)(n - 1),
                       &(atap_spawn_opts){.out_size = 8}))
            return -1;
        int rc = atap_join(t, &below, sizeof below);
        atap_release(t);
        if (rc)
            return -1;
    }
    below++;
    memcpy(out, &below, sizeof below);
    return 0;
}

/* Deep recursion at help depths 16, 4, 1 and 0: past the depth a stack
 * may hold, the chain goes on on fresh stacks of the same workers (the
 * ones under set aside), never on more workers. */
static void test_faults_help_depths(void **state)
{
    (void)state;
    static const unsigned depths[] = {16, 4, 1, 0};
    uint64_t levels = 40;

    for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
        uint64_t v = 0;
        assert_int_equal(atap_shutdown(), 0); /* a fresh pool: peaks start over */
        assert_int_equal(atap_init(NULL), 0);
        size_t workers = pool_stats().workers;
        atap_inject_help_depth(depths[k]);
        atap_task t = spawn8(task_deep, (void *)(uintptr_t)levels);
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(60)), 0);
        assert_true(v == levels + 1);
        atap_release(t);
        /* every level is a live frame at the deepest point, and a stack
         * holds at most depth + 1 of them: all but the last stack aside */
        size_t need = (size_t)((levels + 1 + depths[k]) / (depths[k] + 1));
        struct atap_pool_stats st = pool_stats();
        if (st.peak_aside + 1 < need)
            fail_msg("help depth %u: peak %zu stacks aside, need %zu", depths[k], st.peak_aside,
                     need - 1);
        if (st.peak_workers != workers)
            fail_msg("help depth %u: %zu workers grew to %zu", depths[k], workers, st.peak_workers);
    }
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_faults_workers_die_holding_tasks),
        T(test_faults_worker_dies_idle),
        T(test_faults_blocking_thread_dies),
        T(test_faults_worker_dies_mid_help),
        T(test_faults_spawn_refused),
        T(test_faults_no_worker_left_delayed_task),
        T(test_faults_blocking_start_refused),
        T(test_faults_init_refused),
        T(test_faults_help_depths),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * The manager and its supervisor: restarts, giving up (the pool carries on),
 * and the pool policy it applies on its tick (rebalancing, growth, reaping,
 * idle CPU).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <sys/resource.h>

#include "manager.h" /* atap__manager_restarts: restarts are seen, not guessed */
#include "test_util.h"

static int value(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = (uint64_t)(uintptr_t)arg;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_manager_alive_after_init(void **state)
{
    (void)state;
    struct atap_status st = status_now();
    assert_true(st.initialised);
    assert_true(st.manager_alive);
    assert_true(st.healthy);
}

/* A few faults: the supervisor restarts the manager each time. */
static void test_manager_restarts(void **state)
{
    (void)state;
    atap_inject_manager_faults(3);
    /* 3 restarts take 10 + 20 + 30 ms of backoff at least */
    sleep_us(100000);
    assert_true(wait_manager(true, ATAP_SEC(10)));
    assert_true(status_now().healthy);
    atap_task t = spawn8(value, (void *)(uintptr_t)4);
    assert_true(join8(t) == 4);
    atap_release(t);
}

/* Past the restart limit the supervisor gives up; the pool keeps working,
 * and a new init brings a manager back. */
static void test_manager_gives_up(void **state)
{
    (void)state;
    atap_inject_manager_faults(16);
    assert_true(wait_manager_gone(ATAP_SEC(30))); /* 10+20+...+50 ms of backoff, then gone */
    struct atap_status st = status_now();
    assert_false(st.manager_alive);
    assert_false(st.healthy);
    assert_true(st.initialised);
    size_t n = scaled(2000, 500);
    for (size_t i = 0; i < n; i++) {
        atap_task t = spawn8(value, (void *)(uintptr_t)i);
        assert_true(join8(t) == i);
        atap_release(t);
    }
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_true(wait_manager(true, ATAP_SEC(5)));
}

/* A task fills its LIFO slot, then waits for the child without joining:
 * only another worker can run the child, and nothing woke one when the slot
 * was filled. The manager's tick hands it over. */
static atomic_int g_child_ran;

static int child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_store(&g_child_ran, 1);
    return 0;
}

static int parent_spins(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap_task t;
    CHECK(atap_spawn(&t, child, NULL, NULL) == 0);
    atap_release(t);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (!atomic_load(&g_child_ran) && now_ns() < end && !atomic_load(&g_release_all))
        sched_yield();
    CHECK(atomic_load(&g_child_ran));
    return 0;
}

static void lifo_handed_over(void)
{
    atomic_store(&g_child_ran, 0);
    atap_task t;
    assert_int_equal(atap_spawn(&t, parent_spins, NULL, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(30)), 0);
    atap_release(t);
    assert_no_failures();
}

static void test_manager_rebalances_lifo(void **state)
{
    (void)state;
    lifo_handed_over();
}

/* Tasks that hold their workers: the pool grows past the floor until all
 * of them run, then reaps back to the floor once idle. */
static atomic_int g_started, g_open;

static int hold(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&g_started, 1);
    while (!atomic_load(&g_open) && !atomic_load(&g_release_all))
        sleep_us(200);
    return 0;
}

static void grows_and_reaps(void)
{
    int n = (int)(2 * cores() + 1); /* more than the floor, within the target */
    atap_task *ts = calloc((size_t)n, sizeof *ts);

    assert_non_null(ts);
    atomic_store(&g_started, 0);
    atomic_store(&g_open, 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], hold, NULL, NULL), 0);
    assert_true(wait_atomic_at_least(&g_started, n, ATAP_SEC(20)));
    assert_true(pool_stats().workers >= (size_t)n);
    atomic_store(&g_open, 1);
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    free(ts);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (pool_stats().workers > cores() && now_ns() < end)
        sleep_us(20000);
    assert_int_equal(pool_stats().workers, cores());
}

static void test_manager_grows_and_reaps(void **state)
{
    (void)state;
    grows_and_reaps();
}

/* With the manager gone for good its tick goes on without it: a task left
 * in a LIFO slot is still handed over, the pool still grows past stuck
 * workers and reaps back to the floor. */
static void test_manager_gone_keeps_the_pool_going(void **state)
{
    (void)state;
    atap_inject_manager_faults(16);
    assert_true(wait_manager_gone(ATAP_SEC(30))); /* the backoffs, then it stays gone */
    assert_false(status_now().manager_alive);
    unsigned restarts = atap__manager_restarts();
    lifo_handed_over();
    grows_and_reaps();
    /* all along with no manager: none came back, so the tick was the supervisor's */
    assert_false(status_now().manager_alive);
    assert_int_equal(atap__manager_restarts(), restarts);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* After a burst the runtime goes quiet: under 5 % of one core. */
static void test_manager_idle_cpu(void **state)
{
    (void)state;
    for (int i = 0; i < 10000; i++) {
        atap_task t;
        assert_int_equal(atap_spawn(&t, child, NULL, NULL), 0);
        atap_release(t);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
    sleep_us(700000); /* past the reap of anything above the floor */
    double c0 = cpu_seconds();
    uint64_t t0 = now_ns();
    sleep_us(1000000);
    double used = (cpu_seconds() - c0) / ((now_ns() - t0) / 1e9);
    print_message("idle CPU: %.2f %% of one core\n", used * 100);
    assert_true(used < 0.05);
}

/* 100,000 timers pending minutes away cost the idle process next to
 * nothing: under 5 % of one core (about 0.1 % measured). */
static void test_manager_idle_cpu_with_timers_pending(void **state)
{
    (void)state;
    size_t n = scaled(100000, 20000);
    atap_task *ts = calloc(n, sizeof *ts);

    assert_non_null(ts);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], child, NULL,
                                    &(atap_spawn_opts){.after_ns = ATAP_SEC(300) + i * 1000}),
                         0);
    sleep_us(700000); /* the manager files them; the pool goes idle */
    double c0 = cpu_seconds();
    uint64_t t0 = now_ns();
    sleep_us(1000000);
    double used = (cpu_seconds() - c0) / ((now_ns() - t0) / 1e9);
    print_message("idle CPU with %zu timers pending: %.2f %% of one core\n", n, used * 100);
    assert_true(used < 0.05);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_cancel(ts[i]), 0);
        atap_release(ts[i]);
    }
    free(ts);
    assert_true(wait_live_back(ATAP_SEC(30)));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_manager_alive_after_init), T(test_manager_restarts),
        T(test_manager_gives_up),         T(test_manager_rebalances_lifo),
        T(test_manager_grows_and_reaps),  T(test_manager_gone_keeps_the_pool_going),
        T(test_manager_idle_cpu),         T(test_manager_idle_cpu_with_timers_pending),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

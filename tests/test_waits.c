/*
 * Waits inside tasks: a join, wait or join_first inside a task never makes
 * a deadlock the program does not contain (help.c, and the rule at the top
 * of atap.h).
 *
 * Each shape below hung or failed every time when a waiting worker ran any
 * queued task on top of its waiting frame: a frame helped on top cannot
 * return before it, so whatever it waits for that the lower frame makes
 * later never came. Inner waits are bounded (INNER) so that a regression
 * fails the test instead of hanging the suite; the outer ones are shorter.
 * Then: deep chains of nested joins, which run on as many stacks as they
 * need (a bounded pool), and the error a waiter gets when every thread the
 * pool may have is waiting.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#define INNER ATAP_SEC(30) /* a wait inside a task: past this, the shape hung */
#define OUTER ATAP_SEC(20) /* the test's own wait, shorter: it fails first */

static atomic_int g_done;
static atomic_int g_rcs[128];

static int task_nothing(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return 0;
}

/* Spawns a task that does nothing, to start after ms milliseconds. */
static atap_task spawn_later(unsigned ms)
{
    atap_task t;
    CHECK(atap_spawn(&t, task_nothing, NULL, &(atap_spawn_opts){.after_ns = ATAP_MS(ms)}) == 0);
    return t;
}

/* Joins the handle in arg (its own listener), records the code, lets go. */
static int task_join_arg(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task *t = arg;
    int rc = atap_join_for(*t, NULL, 0, INNER);
    atap_release(*t);
    free(t);
    atomic_fetch_add(&g_done, 1);
    return rc;
}

static atap_task *handle_copy(atap_task t)
{
    atap_task *c = malloc(sizeof *c);
    CHECK(c && atap_dup(t, c) == 0);
    return c;
}

/* ---- shape 1: joins only, no cycle ------------------------------------- */

/* T1 spawns X (blocking; X joins T1), C (C joins X) and D (5 ms later),
 * then waits for D. Nothing waits in a circle: D comes, T1 ends, X ends,
 * C ends. Run C on top of T1's wait and C waits for X, X for T1, T1 for C. */
static int task_t1_shape1(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atap_task x, c, d;
    CHECK(atap_spawn(&x, task_join_arg, handle_copy(atap_self(ctx)),
                     &(atap_spawn_opts){.blocking = true}) == 0);
    CHECK(atap_spawn(&c, task_join_arg, handle_copy(x), NULL) == 0);
    d = spawn_later(5);
    int rc = atap_join_for(d, NULL, 0, INNER);
    atap_release(d);
    atap_release(c);
    atap_release(x);
    return rc;
}

static void test_waits_join_no_cycle_no_deadlock(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++) {
        atomic_store(&g_done, 0);
        atap_task t1;
        assert_int_equal(atap_spawn(&t1, task_t1_shape1, NULL, NULL), 0);
        assert_int_equal(atap_join_for(t1, NULL, 0, OUTER), 0);
        atap_release(t1);
        assert_true(wait_atomic_at_least(&g_done, 2, OUTER));
    }
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- shape 2: a value sent after the wait ------------------------------ */

static atap_chan *g_chan;

/* C: receives the next value of g_chan (a receive task, joined). */
static int task_receiver(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atap_task r;
    int rc = atap_chan_spawn_recv(&r, g_chan, &(atap_spawn_opts){.out_size = sizeof(uint64_t)});
    if (rc == 0) {
        rc = atap_join_for(r, out, sizeof(uint64_t), INNER);
        atap_release(r);
    }
    return rc;
}

/* T1 spawns C, waits for D (5 ms later), then sends what C receives, then
 * joins C. Run C on top of T1's wait and the value never comes. */
static int task_t1_shape2(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atap_task c, d;
    uint64_t v = 0x5eed, got = 0;
    CHECK(atap_spawn(&c, task_receiver, NULL, &(atap_spawn_opts){.out_size = sizeof got}) == 0);
    d = spawn_later(5);
    int rc = atap_join_for(d, NULL, 0, INNER);
    atap_release(d);
    CHECK(rc == 0);
    CHECK(atap_chan_send(g_chan, &v) == 0);
    rc = atap_join_for(c, &got, sizeof got, INNER);
    atap_release(c);
    memcpy(out, &got, sizeof got);
    return rc;
}

static void test_waits_value_sent_after_the_wait(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(atap_chan_open(&g_chan, sizeof(uint64_t), 0, NULL), 0);
        atap_task t1;
        uint64_t got = 0;
        assert_int_equal(atap_spawn(&t1, task_t1_shape2, NULL,
                                    &(atap_spawn_opts){.out_size = sizeof got}),
                         0);
        assert_int_equal(atap_join_for(t1, &got, sizeof got, OUTER), 0);
        assert_true(got == 0x5eed);
        atap_release(t1);
        atap_chan_close_sender(g_chan);
        atap_chan_close_receiver(g_chan);
    }
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- shape 3: a child joins its spawner -------------------------------- */

/* P spawns C (C joins P) and waits for D (2 ms later). P's frame is not
 * below C's on any stack, so C's join waits and reads 0 (EINVAL is only for
 * a task joining its own handle). As task_join_arg, recording the code in
 * g_rcs[index]. */
static int task_join_record(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task *t = arg;
    int index = (int)t[1].id;
    int rc = atap_join_for(t[0], NULL, 0, INNER);
    atap_release(t[0]);
    free(t);
    atomic_store(&g_rcs[index], rc == 0 ? 1 : rc);
    atomic_fetch_add(&g_done, 1);
    return 0;
}

static int task_parent_record(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    atap_task *pair = malloc(2 * sizeof *pair), c, d;
    CHECK(pair && atap_dup(atap_self(ctx), &pair[0]) == 0);
    pair[1].id = (uint64_t)(uintptr_t)arg;
    CHECK(atap_spawn(&c, task_join_record, pair, NULL) == 0);
    d = spawn_later(2);
    CHECK(atap_join_for(d, NULL, 0, INNER) == 0);
    atap_release(d);
    atap_release(c);
    return 0;
}

static void test_waits_child_joins_its_spawner(void **state)
{
    (void)state;
    enum { TRIES = 100 };
    atomic_store(&g_done, 0);
    for (int i = 0; i < TRIES; i++) {
        atomic_store(&g_rcs[i], 0);
        atap_task p;
        assert_int_equal(atap_spawn(&p, task_parent_record, (void *)(uintptr_t)i, NULL), 0);
        assert_int_equal(atap_join_for(p, NULL, 0, OUTER), 0);
        atap_release(p);
    }
    assert_true(wait_atomic_at_least(&g_done, TRIES, OUTER));
    for (int i = 0; i < TRIES; i++)
        if (atomic_load(&g_rcs[i]) != 1)
            fail_msg("try %d: the child's join on its spawner read %d", i, atomic_load(&g_rcs[i]));
    assert_no_failures();
}

/* ---- shape 4: blocking threads at their cap ---------------------------- */

static atomic_int g_arrived;
static int g_parents;

/* A blocking task that, once every parent holds a blocking thread, spawns
 * a blocking child and joins it. With every blocking thread in such a
 * join, the children can only run if a waiter runs its own (it is still
 * queued). */
static int task_blocking_parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task c;
    atomic_int *ran = arg;
    atomic_fetch_add(&g_arrived, 1);
    for (uint64_t end = now_ns() + ATAP_SEC(10); atomic_load(&g_arrived) < g_parents;)
        if (now_ns() > end || released_all())
            break;
        else
            sleep_us(100);
    CHECK(atap_spawn(&c, task_count, ran, &(atap_spawn_opts){.blocking = true}) == 0);
    int rc = atap_join_for(c, NULL, 0, INNER);
    atap_release(c);
    return rc;
}

static void test_waits_blocking_threads_at_their_cap(void **state)
{
    (void)state;
    /* The default cap: 8 blocking threads a core, each a waiting parent. */
    size_t n = (size_t)cores() * 8;
    atomic_store(&g_arrived, 0);
    g_parents = (int)n;
    atap_task *ts = calloc(n, sizeof *ts);
    atomic_int ran;
    atomic_init(&ran, 0);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], task_blocking_parent, &ran,
                                    &(atap_spawn_opts){.blocking = true}),
                         0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_join_for(ts[i], NULL, 0, OUTER), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(atomic_load(&ran), (int)n);
    free(ts);
    assert_no_failures();
}

/* ---- join_first runs no member on top of itself ------------------------ */

/* T1 waits for the first of {A, B}; B ends 5 ms on; then T1 sends what A
 * receives. A run on top of T1's join_first would wait for that value. */
static int task_t1_first(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap_task set[2];
    size_t winner = 9;
    uint64_t v = 7, got = 0;
    CHECK(atap_spawn(&set[0], task_receiver, NULL, &(atap_spawn_opts){.out_size = 8}) == 0);
    set[1] = spawn_later(5);
    int rc = atap_join_first(set, 2, ATAP_PASS_BACK, INNER, &winner);
    CHECK(rc == 0 && winner == 1);
    CHECK(atap_chan_send(g_chan, &v) == 0);
    CHECK(atap_join_for(set[0], &got, sizeof got, INNER) == 0 && got == 7);
    atap_release(set[0]);
    atap_release(set[1]);
    return rc;
}

static void test_waits_join_first_runs_no_member_on_top(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(atap_chan_open(&g_chan, sizeof(uint64_t), 0, NULL), 0);
        atap_task t1;
        assert_int_equal(atap_spawn(&t1, task_t1_first, NULL, NULL), 0);
        assert_int_equal(atap_join_for(t1, NULL, 0, OUTER), 0);
        atap_release(t1);
        atap_chan_close_sender(g_chan);
        atap_chan_close_receiver(g_chan);
    }
    assert_no_failures();
}

/* ---- deep chains of nested joins --------------------------------------- */

/* Spawns one child with levels - 1 and joins it; returns how many levels
 * ran below it, itself included. A failed join's code goes up the chain. */
static int task_deep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t levels = (uint64_t)(uintptr_t)arg, below = 0;
    if (levels > 0) {
        atap_task child;
        int rc = atap_spawn(&child, task_deep, (void *)(uintptr_t)(levels - 1),
                            &(atap_spawn_opts){.out_size = sizeof below});
        if (rc != 0)
            return rc;
        rc = atap_join(child, &below, sizeof below);
        atap_release(child);
        if (rc != 0)
            return rc;
    }
    below++;
    memcpy(out, &below, sizeof below);
    return 0;
}

static int join_chain(uint64_t levels, uint64_t *v, uint64_t timeout_ns)
{
    atap_task t;
    int rc = atap_spawn(&t, task_deep, (void *)(uintptr_t)levels,
                        &(atap_spawn_opts){.out_size = sizeof *v});
    if (rc != 0)
        return rc;
    rc = atap_join_for(t, v, sizeof *v, timeout_ns);
    if (rc != ATAP_ENOTREADY)
        atap_release(t);
    return rc;
}

/* 10,000 nested joins: each level runs its child on its own stack while
 * there is room, so a few workers' stacks hold the chain. */
static void test_waits_chain_of_10000_joins_bounded_pool(void **state)
{
    (void)state;
    uint64_t v = 0, levels = 10000;
    assert_int_equal(join_chain(levels, &v, ATAP_SEC(60)), 0);
    assert_true(v == levels + 1);
    struct atap_pool_stats st = pool_stats();
    if (st.peak_workers > 4 * (size_t)cores() + 16)
        fail_msg("10,000 nested joins took %zu workers (at most %u)", st.peak_workers,
                 4 * cores() + 16);
}

/* 100,000 nested joins end within a minute: with the result, or with
 * ATAP_ELIMIT gone up the chain when the pool ran out of threads. (The
 * minute stretches on a loaded machine and under TSan: test_slack.) */
static void test_waits_chain_of_100000_joins_ends(void **state)
{
    (void)state;
    uint64_t v = 0, levels = 100000, start = now_ns(), budget = ATAP_SEC(60) * test_slack();
    int rc = join_chain(levels, &v, budget);
    if (rc == 0)
        assert_true(v == levels + 1);
    else if (rc != ATAP_ELIMIT)
        fail_msg("100,000 nested joins: %s (%d) after %.1f s", atap_strerror(rc), rc,
                 (double)(now_ns() - start) / 1e9);
    assert_true(now_ns() - start < budget);
    struct atap_pool_stats st = pool_stats();
    assert_true(st.peak_workers <= st.ceiling);
}

#ifdef ATAP_FAULT_INJECTION
static int setup_small_stacks(void **state)
{
    (void)state;
    atomic_store(&g_release_all, 0);
    atap_config c = {.size = sizeof c, .worker_stack = 256 * 1024};
    return atap_init(&c) == 0 ? 0 : -1;
}

/* Every worker waiting, none may be added: a waiter whose task is still
 * queued gets ATAP_ELIMIT, which goes up the chain; the pool counts the
 * stall, and the rest of the chain still runs once the waiters are gone. */
static void test_waits_ceiling_reached_is_an_error(void **state)
{
    (void)state;
    uint64_t v = 0;
    atap_inject_spawn_refusals(1000000);
    /* Far more levels than two 256 KiB stacks hold, in any build. */
    int rc = join_chain(5000, &v, ATAP_SEC(60));
    struct atap_pool_stats st = pool_stats();
    atap_inject_spawn_refusals(0);
    assert_int_equal(rc, ATAP_ELIMIT);
    assert_true(st.stalls >= 1);
    assert_true(wait_live_back(ATAP_SEC(60)));
}
#endif

/* A waiting worker lends its core: with every worker waiting on a task
 * that waits for something outside, the queued work still runs. */
static int task_wait_for_flag(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atomic_int *flag = arg;
    while (!atomic_load(flag) && !released_all())
        sleep_us(200);
    return 0;
}

static int task_wait_on_blocker(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task b;
    CHECK(atap_spawn(&b, task_wait_for_flag, arg, &(atap_spawn_opts){.blocking = true}) == 0);
    int rc = atap_join_for(b, NULL, 0, INNER);
    atap_release(b);
    return rc;
}

static void test_waits_waiting_workers_lend_their_cores(void **state)
{
    (void)state;
    size_t n = (size_t)cores() * 2;
    atomic_int flag, ran;
    atomic_init(&flag, 0);
    atomic_init(&ran, 0);
    atap_task *ws = calloc(n, sizeof *ws), later;
    assert_non_null(ws);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ws[i], task_wait_on_blocker, &flag, NULL), 0);
    sleep_ms(20);
    assert_int_equal(atap_spawn(&later, task_count, &ran, NULL), 0);
    assert_int_equal(atap_join_for(later, NULL, 0, OUTER), 0);
    assert_int_equal(atomic_load(&ran), 1);
    atomic_store(&flag, 1);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_join_for(ws[i], NULL, 0, OUTER), 0);
        atap_release(ws[i]);
    }
    atap_release(later);
    free(ws);
    assert_no_failures();
}

/* ---- growth answers workers off the CPU, not slow ones ------------------ */

typedef struct hog {
    atomic_int started;
    uint64_t until;
    bool sleep; /* in the kernel (off the CPU), or spinning on it */
} hog;

static int task_hog(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    hog *h = arg;
    atomic_fetch_add(&h->started, 1);
    while (now_ns() < h->until && !released_all())
        if (h->sleep)
            sleep_us(1000);
        else
            for (volatile int k = 0; k < 1000; k++)
                ;
    return 0;
}

/* Every worker inside a task for a while, one more task queued behind
 * them: returns when that task ran, or 0 if it never did before the hogs
 * ended; *peak: the pool's peak workers then. */
static uint64_t queued_behind_hogs(bool sleep, uint64_t for_ns, size_t *peak)
{
    size_t n = pool_stats().workers;
    hog h = {.until = now_ns() + for_ns, .sleep = sleep};
    atap_task *ts = calloc(n, sizeof *ts), late;
    atomic_int ran;
    uint64_t at = 0;

    atomic_init(&h.started, 0);
    atomic_init(&ran, 0);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], task_hog, &h, NULL), 0);
    assert_true(wait_atomic_at_least(&h.started, (int)n, ATAP_SEC(10)));
    assert_int_equal(atap_spawn(&late, task_count, &ran, NULL), 0);
    while (now_ns() < h.until && !atomic_load(&ran))
        sleep_us(500);
    if (atomic_load(&ran) && now_ns() < h.until)
        at = now_ns();
    *peak = pool_stats().peak_workers;
    assert_int_equal(atap_join_for(late, NULL, 0, ATAP_SEC(30)), 0);
    atap_release(late);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_join_for(ts[i], NULL, 0, ATAP_SEC(30)), 0);
        atap_release(ts[i]);
    }
    free(ts);
    return at;
}

/* Workers busy on the CPU (or waiting for one on a loaded machine) are not
 * stuck: the pool does not grow for them, however long they run. */
static void test_waits_busy_workers_get_no_growth(void **state)
{
    (void)state;
    size_t before = pool_stats().workers, peak = 0;
    (void)queued_behind_hogs(false, ATAP_MS(400), &peak);
    if (peak > before)
        fail_msg("workers spinning on the CPU grew the pool from %zu to %zu", before, peak);
}

/* Workers asleep in the kernel inside their tasks are stuck: the pool
 * grows, and the task queued behind them runs before they wake. */
static void test_waits_sleeping_workers_get_growth(void **state)
{
    (void)state;
    size_t before = pool_stats().workers, peak = 0;
    uint64_t at = queued_behind_hogs(true, ATAP_SEC(3), &peak);
    if (at == 0)
        fail_msg("a task queued behind %zu workers asleep in their tasks waited for them "
                 "(peak %zu workers)", before, peak);
}

/* ---- a run taken deep in a stack can be leapfrogged into ---------------- */

/* A waiter leapfrogs into the run it waits for wherever that run sits on
 * the other worker's stack: here 200 runs deep (a chain of the other
 * worker's own joins), where it once went unpublished, so that the waiter
 * slept while that worker ran the run's children one by one. */
#define DEEP_LEVELS 200
#define DEEP_KIDS 24

static struct {
    atap_task r;             /* the run waited for, spawned by P */
    atomic_int r_ready;      /* r is set */
    atomic_int r_started;    /* r runs */
    atomic_int on_p_thread;  /* r's children run on P's thread */
    pthread_t p_thread;
} g_deep;

static int task_deep_kid(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t until = now_ns() + ATAP_MS(2);
    if (pthread_equal(pthread_self(), g_deep.p_thread))
        atomic_fetch_add(&g_deep.on_p_thread, 1);
    while (now_ns() < until) /* on the CPU: the other worker must not sleep meanwhile */
        ;
    return 0;
}

/* R: spawns its children and joins them, one after the other. */
static int task_deep_r(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap_task k[DEEP_KIDS];
    atomic_store(&g_deep.r_started, 1);
    for (int i = 0; i < DEEP_KIDS; i++)
        CHECK(atap_spawn(&k[i], task_deep_kid, NULL, NULL) == 0);
    for (int i = 0; i < DEEP_KIDS; i++) {
        CHECK(atap_join_for(k[i], NULL, 0, INNER) == 0);
        atap_release(k[i]);
    }
    return 0;
}

/* P: spawns R and lets the other worker take it (no join yet, or P would
 * run R itself), then waits for it. */
static int task_deep_p(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t end = now_ns() + INNER;
    g_deep.p_thread = pthread_self();
    CHECK(atap_spawn(&g_deep.r, task_deep_r, NULL, NULL) == 0);
    atomic_store(&g_deep.r_ready, 1);
    while (!atomic_load(&g_deep.r_started) && now_ns() < end && !released_all())
        ;
    return atap_join_for(g_deep.r, NULL, 0, INNER);
}

/* A chain of own joins DEEP_LEVELS deep on one worker; at its bottom, a
 * wait for R, which P left queued on the other: claimed aside, it runs
 * there, under the whole chain. */
static int task_deep_level(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uintptr_t level = (uintptr_t)arg;
    atap_task t;
    if (level < DEEP_LEVELS) {
        CHECK(atap_spawn(&t, task_deep_level, (void *)(level + 1), NULL) == 0);
        int rc = atap_join_for(t, NULL, 0, INNER);
        atap_release(t);
        return rc;
    }
    uint64_t end = now_ns() + INNER;
    while (!atomic_load(&g_deep.r_ready) && now_ns() < end && !released_all())
        ;
    return atap_join_for(g_deep.r, NULL, 0, INNER);
}

static void test_waits_leapfrog_into_a_run_deep_in_a_stack(void **state)
{
    (void)state;
    atap_task p, d;

    if (pool_stats().workers < 2)
        skip();
    atomic_store(&g_deep.r_ready, 0);
    atomic_store(&g_deep.r_started, 0);
    atomic_store(&g_deep.on_p_thread, 0);
    assert_int_equal(atap_spawn(&p, task_deep_p, NULL, NULL), 0);
    assert_true(wait_atomic_at_least(&g_deep.r_ready, 1, OUTER));
    assert_int_equal(atap_spawn(&d, task_deep_level, (void *)(uintptr_t)0, NULL), 0);
    assert_int_equal(atap_join_for(d, NULL, 0, OUTER), 0);
    assert_int_equal(atap_join_for(p, NULL, 0, OUTER), 0);
    atap_release(d);
    atap_release(p);
    atap_release(g_deep.r);
    if (atomic_load(&g_deep.on_p_thread) == 0)
        fail_msg("P waited for R, run %d levels deep on the other worker, and ran none of "
                 "its %d children", DEEP_LEVELS, DEEP_KIDS);
    assert_no_failures();
}

/* ---- a tree of joins runs on the workers it has ------------------------- */

/* A node of an unbalanced tree: a little work, then two children spawned
 * and joined, or none (a leaf), as a hash of its state says. Its output:
 * the nodes in its subtree. */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static int task_tree_node(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t s = (uint64_t)(uintptr_t)arg, nodes = 1, sub;
    atap_task kid[2];

    for (int k = 0; k < 16; k++)
        s = mix(s);
    /* Two children with odds a little under one half: subtrees of a few
     * thousand nodes, some deep. */
    if ((s >> 11) % 1000 < 495) {
        for (int i = 0; i < 2; i++)
            CHECK(atap_spawn(&kid[i], task_tree_node, (void *)(uintptr_t)mix(s + (uint64_t)i + 1),
                             &(atap_spawn_opts){.out_size = sizeof sub}) == 0);
        for (int i = 0; i < 2; i++) {
            CHECK(atap_join(kid[i], &sub, sizeof sub) == 0);
            atap_release(kid[i]);
            nodes += sub;
        }
    }
    memcpy(out, &nodes, sizeof nodes);
    return 0;
}

/* Every node of a tree joins its children: a worker that waits with
 * nothing it may run is blocked for a moment, often while the other is
 * too, each waiting for a run the other has just ended; the pool must not
 * add workers for that (the peers run such a tree on one thread a core). */
static void test_waits_tree_of_joins_adds_no_worker(void **state)
{
    (void)state;
    size_t before = pool_stats().workers, peak;
    uint64_t total = 0, nodes, end = now_ns() + ATAP_MS(1500);
    atap_task roots[64];
    size_t n = 0;

    /* Many roots, spawned from outside, so that every worker gets some. */
    while (now_ns() < end) {
        for (n = 0; n < 64; n++)
            assert_int_equal(atap_spawn(&roots[n], task_tree_node, (void *)(uintptr_t)(total + n),
                                        &(atap_spawn_opts){.out_size = sizeof nodes}),
                             0);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(atap_join_for(roots[i], &nodes, sizeof nodes, OUTER), 0);
            atap_release(roots[i]);
            total += nodes;
        }
    }
    /* A worker is added when every worker has been asleep in a wait for a
     * millisecond (the tick: for two ticks). A tree of joins never leaves
     * them so on a machine that runs them; one that stalls threads that
     * long (TSan, a loaded host: test_slack() above 1) may, once. */
    peak = pool_stats().peak_workers;
    if (peak > before + (test_slack() > 1 ? 1 : 0))
        fail_msg("a tree of joins (%llu nodes) grew the pool from %zu to %zu workers",
                 (unsigned long long)total, before, peak);
    assert_no_failures();
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_waits_join_no_cycle_no_deadlock),
        T(test_waits_value_sent_after_the_wait),
        T(test_waits_child_joins_its_spawner),
        T(test_waits_blocking_threads_at_their_cap),
        T(test_waits_join_first_runs_no_member_on_top),
        T(test_waits_waiting_workers_lend_their_cores),
        T(test_waits_chain_of_10000_joins_bounded_pool),
        T(test_waits_chain_of_100000_joins_ends),
        T(test_waits_busy_workers_get_no_growth),
        T(test_waits_tree_of_joins_adds_no_worker),
        T(test_waits_leapfrog_into_a_run_deep_in_a_stack),
        T(test_waits_sleeping_workers_get_growth),
#ifdef ATAP_FAULT_INJECTION
        cmocka_unit_test_setup_teardown(test_waits_ceiling_reached_is_an_error,
                                        setup_small_stacks, teardown_runtime),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

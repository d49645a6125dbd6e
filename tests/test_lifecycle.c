/*
 * Runtime lifecycle: init, shutdown, re-init, status. Each test starts and
 * stops the runtime itself; the teardown only makes sure it is stopped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "test_util.h"
#include "testing.h" /* atap__test_on */

static int ensure_stopped(void **state)
{
    (void)state;
    atomic_store(&g_release_all, 1);
    int rc = atap_shutdown();
    atomic_store(&g_release_all, 0);
    g_live_base = pool_stats().live;
    return rc == 0 ? 0 : -1;
}

/* Runs first: nothing in this process has called atap_init yet. */
static void test_lifecycle_spawn_before_init(void **state)
{
    (void)state;
    assert_false(atap_initialised());
    atap_task t = {.id = 0x1234};
    assert_int_equal(atap_spawn(&t, task_value, NULL, &(atap_spawn_opts){.out_size = 8}),
                     ATAP_ENOTINIT);
    assert_true(t.id == ATAP_NO_TASK.id);

    /* also with NULL opts */
    t.id = 99;
    assert_int_equal(atap_spawn(&t, task_value, NULL, NULL), ATAP_ENOTINIT);
    assert_true(t.id == 0);
}

static void test_lifecycle_shutdown_before_init_is_safe(void **state)
{
    (void)state;
    assert_false(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

/* A second init while running counts a second user: 0, the running
 * config stands, and it takes a shutdown each before the runtime stops. */
static void test_lifecycle_init_twice(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    assert_true(atap_initialised());
    unsigned ncores = cores();
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < ncores && now_ns() < end)
        sleep_us(500);
    struct atap_pool_stats before = pool_stats();

    atap_config cfg = {.size = sizeof cfg,
                       .workers_per_core = 1,
                       .blocking_per_core = 1,
                       .worker_stack = 1u << 20,
                       .workers = ncores + 3};
    assert_int_equal(atap_init(&cfg), 0);
    assert_int_equal(atap_init(NULL), 0);
    /* a bad config is refused and counts no user, running or not */
    atap_config bad = {.size = sizeof bad, .worker_stack = 1};
    assert_int_equal(atap_init(&bad), ATAP_EINVAL);

    assert_true(atap_initialised());
    struct atap_pool_stats after = pool_stats();
    assert_true(after.workers >= before.workers);
    assert_true(after.workers < ncores + 3); /* the running config stands */
    assert_true(after.peak_workers == before.peak_workers);

    /* the runtime still works */
    atap_task t = spawn8(task_value, (void *)(uintptr_t)77);
    assert_true(join8(t) == 77);
    atap_release(t);
    /* three users: the first two shutdowns only let one go each */
    assert_int_equal(atap_shutdown(), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_true(atap_initialised());
    t = spawn8(task_value, (void *)(uintptr_t)78);
    assert_true(join8(t) == 78);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
    assert_int_equal(atap_shutdown(), 0); /* none left: nothing to do */
    assert_false(atap_initialised());
}

static void test_lifecycle_init_small_stack_einval(void **state)
{
    (void)state;
    static const size_t bad[] = {1, 4096, 16 * 1024 - 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        atap_config cfg = {.size = sizeof cfg, .worker_stack = bad[i]};
        assert_int_equal(atap_init(&cfg), ATAP_EINVAL);
        assert_false(atap_initialised());
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_value, NULL, NULL), ATAP_ENOTINIT);
    }
    /* a sane explicit config works */
    atap_config ok = {.size = sizeof ok, .workers_per_core = 1, .worker_stack = 1u << 20};
    assert_int_equal(atap_init(&ok), 0);
    assert_true(atap_initialised());
    atap_task t = spawn8(task_value, (void *)(uintptr_t)5);
    assert_true(join8(t) == 5);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
}

/* A config from a "newer" caller: larger than atap_config. Unknown bytes
 * set → EINVAL; unknown bytes all zero → accepted. size 0 → current. */
static void test_lifecycle_init_config_size(void **state)
{
    (void)state;
    struct {
        atap_config cfg;
        unsigned char extra[32];
    } big;
    memset(&big, 0, sizeof big);
    big.cfg.size = sizeof big;
    big.extra[7] = 1;
    assert_int_equal(atap_init(&big.cfg), ATAP_EINVAL);
    assert_false(atap_initialised());

    big.extra[7] = 0;
    assert_int_equal(atap_init(&big.cfg), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);

    atap_config zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(atap_init(&zero), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
}

static void test_lifecycle_workers_started_and_stopped(void **state)
{
    (void)state;
    long ncores = (long)cores();
    assert_int_equal(atap_init(NULL), 0);
    /* the floor: one worker per CPU it may run on (threads may still be starting) */
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < (size_t)ncores && now_ns() < end)
        sleep_us(500);
    struct atap_pool_stats s = pool_stats();
    assert_true(s.workers >= (size_t)ncores);
    assert_true(s.peak_workers >= s.workers);
    assert_int_equal(atap_shutdown(), 0);
    s = pool_stats();
    assert_int_equal(s.workers, 0);
    assert_int_equal(s.busy, 0);
    assert_int_equal(s.blocking_threads, 0);
    assert_true(s.peak_workers >= (size_t)ncores);
}

static int slow_count(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    /* a little work so the queue is still full when shutdown starts */
    volatile unsigned x = 0;
    for (unsigned i = 0; i < 200; i++)
        x += i;
    (void)x;
    atomic_fetch_add_explicit((atomic_int *)arg, 1, memory_order_acq_rel);
    return 0;
}

static void test_lifecycle_shutdown_drains(void **state)
{
    (void)state;
    enum { N = 10000 };
    static atap_task ts[N];
    atomic_int counter;
    atomic_init(&counter, 0);
    uint64_t completed0 = pool_stats().completed;
    for (int round = 0; round < 5; round++) {
        atomic_store(&counter, 0);
        assert_int_equal(atap_init(NULL), 0);
        for (int i = 0; i < N; i++)
            assert_int_equal(atap_spawn(&ts[i], slow_count, &counter, NULL), 0);
        assert_int_equal(atap_shutdown(), 0);
        int ran = atomic_load(&counter);
        if (ran != N)
            fail_msg("round %d: atap_shutdown returned 0 with %d of %d queued tasks run", round,
                     ran, N);
        if (round < 4)
            for (int i = 0; i < N; i++)
                atap_release(ts[i]);
    }
    assert_false(atap_initialised());
    /* every thread is joined, so every run has been counted, and the count
     * outlives the threads that made it */
    assert_true(pool_stats().completed >= completed0 + 5 * N);
    /* every handle reads a settled, successful task after shutdown */
    for (int i = 0; i < N; i++) {
        assert_true(atap_finished(ts[i]));
        assert_int_equal(atap_state_of(ts[i]), ATAP_READY);
        assert_int_equal(atap_try_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A chain that crosses between the workers and the blocking threads while
 * shutdown drains: a worker task spawns a blocking task, which spawns a
 * worker task and joins it, then starts the next link. Shutdown waits for
 * the whole chain: nothing queued is left behind, no join waits forever. */
struct chain {
    atomic_int left, links, bad;
};

static int chain_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t v = 7;
    memcpy(out, &v, sizeof v);
    return 0;
}

static int chain_worker(atap_ctx *ctx, void *arg, void *out);

static int chain_blocking(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    struct chain *c = arg;
    atap_task k;
    uint64_t v = 0;

    if (atap_spawn(&k, chain_child, NULL, &(atap_spawn_opts){.out_size = 8}) != 0 ||
        atap_join(k, &v, sizeof v) != 0 || v != 7)
        atomic_fetch_add(&c->bad, 1);
    atap_release(k);
    atomic_fetch_add(&c->links, 1);
    if (atomic_fetch_sub(&c->left, 1) > 1) {
        if (atap_spawn(&k, chain_worker, c, NULL) != 0)
            atomic_fetch_add(&c->bad, 1);
        atap_release(k);
    }
    return 0;
}

static int chain_worker(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task t;

    if (atap_spawn(&t, chain_blocking, arg, &(atap_spawn_opts){.blocking = true}) != 0)
        atomic_fetch_add(&((struct chain *)arg)->bad, 1);
    atap_release(t);
    return 0;
}

static void test_lifecycle_shutdown_drains_across_blocking(void **state)
{
    (void)state;
    static struct chain c;
    enum { LINKS = 200 };

    for (int round = 0; round < 3; round++) {
        atomic_store(&c.left, LINKS);
        atomic_store(&c.links, 0);
        atomic_store(&c.bad, 0);
        assert_int_equal(atap_init(NULL), 0);
        atap_task t;
        assert_int_equal(atap_spawn(&t, chain_worker, &c, NULL), 0);
        atap_release(t);
        assert_int_equal(atap_shutdown(), 0);
        assert_int_equal(atomic_load(&c.bad), 0);
        if (atomic_load(&c.links) != LINKS)
            fail_msg("round %d: shutdown returned after %d of %d links", round,
                     atomic_load(&c.links), LINKS);
    }
}

static void test_lifecycle_shutdown_twice(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

static void test_lifecycle_spawn_after_shutdown(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_shutdown(), 0);
    atap_task t = {.id = 42};
    assert_int_equal(atap_spawn(&t, task_value, NULL, &(atap_spawn_opts){.out_size = 8}),
                     ATAP_ENOTINIT);
    assert_true(t.id == 0);
}

static void test_lifecycle_reinit_old_handles_read(void **state)
{
    (void)state;
    enum { N = 64 };
    atap_task ts[N];
    assert_int_equal(atap_init(NULL), 0);
    for (int i = 0; i < N; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(1000 + i));
    assert_int_equal(atap_shutdown(), 0);

    /* readable while stopped */
    for (int i = 0; i < N / 2; i++) {
        uint64_t v = 0;
        assert_int_equal(atap_join(ts[i], &v, sizeof v), 0);
        assert_true(v == (uint64_t)(1000 + i));
    }

    assert_int_equal(atap_init(NULL), 0);
    assert_true(atap_initialised());
    /* new work runs and old handles still read their own outputs */
    atap_task u = spawn8(task_value, (void *)(uintptr_t)5555);
    for (int i = 0; i < N; i++) {
        uint64_t v = 0;
        assert_int_equal(atap_join(ts[i], &v, sizeof v), 0);
        assert_true(v == (uint64_t)(1000 + i));
        assert_int_equal(atap_state_of(ts[i]), ATAP_READY);
    }
    assert_true(join8(u) == 5555);
    for (int i = 0; i < N; i++) {
        uint64_t v = 0;
        assert_int_equal(atap_take(ts[i], &v, sizeof v), 0);
        assert_true(v == (uint64_t)(1000 + i));
        atap_release(ts[i]);
    }
    atap_release(u);
    assert_int_equal(atap_shutdown(), 0);
}

static int task_calls_shutdown(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    int rc = atap_shutdown();
    memcpy(out, &rc, sizeof rc);
    return 0;
}

static void test_lifecycle_shutdown_inside_task_einval(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    for (int blocking = 0; blocking < 2; blocking++) {
        atap_task t;
        assert_int_equal(
            atap_spawn(&t, task_calls_shutdown, NULL,
                       &(atap_spawn_opts){.out_size = sizeof(int), .blocking = blocking != 0}),
            0);
        int rc = 1;
        assert_int_equal(atap_join(t, &rc, sizeof rc), 0);
        assert_int_equal(rc, ATAP_EINVAL);
        atap_release(t);
        assert_true(atap_initialised());
    }
    /* the runtime still works */
    atap_task u = spawn8(task_value, (void *)(uintptr_t)9);
    assert_true(join8(u) == 9);
    atap_release(u);
    assert_int_equal(atap_shutdown(), 0);
}

/* A task that calls atap_init while a shutdown waits for it: refused,
 * since waiting out that shutdown would wait for the task itself. */
static atomic_int init_in_task_rc = 1;

static int task_init_during_shutdown(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (atap_initialised() && now_ns() < end)
        sleep_us(1000);
    atomic_store(&init_in_task_rc, atap_init(NULL));
    return 0;
}

static void test_lifecycle_init_inside_task_during_shutdown_einval(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    atomic_store(&init_in_task_rc, 1);
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_init_during_shutdown, NULL, NULL), 0);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atomic_load(&init_in_task_rc), ATAP_EINVAL);
    assert_false(atap_initialised());
}

/* An arg_free the shutdown runs on its own thread (a delay written off)
 * that calls atap_shutdown or atap_init: refused, not a wait for itself. */
static atomic_int reenter_shutdown_rc = 1, reenter_init_rc = 1;

static void arg_free_reenters(void *arg)
{
    (void)arg;
    atomic_store(&reenter_shutdown_rc, atap_shutdown());
    atomic_store(&reenter_init_rc, atap_init(NULL));
}

static void test_lifecycle_callback_inside_shutdown_einval(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    atomic_store(&reenter_shutdown_rc, 1);
    atomic_store(&reenter_init_rc, 1);
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)1,
                                &(atap_spawn_opts){.out_size = 8,
                                                   .after_ns = ATAP_SEC(60),
                                                   .arg_free = arg_free_reenters}),
                     0);
    atap_release(t); /* the write-off at shutdown is its last step: arg_free then */
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atomic_load(&reenter_shutdown_rc), ATAP_EINVAL);
    assert_int_equal(atomic_load(&reenter_init_rc), ATAP_EINVAL);
    assert_false(atap_initialised());
}

/* A task running in a shutdown's drain gives to a waiting task: the give
 * is taken and its run is part of the drain, as a spawn from a task would
 * be. It used to end the waiting task FAILED, its standing output lost. */
static int task_double_input(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t n = 0;
    const uint64_t *in = atap_input(ctx, &n);
    uint64_t v = in && n == 8 ? *in * 2 : 0;
    memcpy(out, &v, sizeof v);
    return 0;
}

static atap_task drain_target;
static atomic_int drain_give_rc = 1;

static int task_give_in_drain(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t end = now_ns() + ATAP_SEC(20), v = 5;
    while (atap_initialised() && now_ns() < end)
        sleep_us(1000);
    atomic_store(&drain_give_rc, atap_give(drain_target, &v, sizeof v));
    return 0;
}

static void test_lifecycle_give_during_drain_runs(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    uint64_t v = 1;
    assert_int_equal(atap_spawn_waiting(&drain_target, task_double_input, NULL, 8,
                                        &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_int_equal(atap_give(drain_target, &v, sizeof v), 0);
    assert_true(join8(drain_target) == 2);
    atomic_store(&drain_give_rc, 1);
    atap_task g;
    assert_int_equal(atap_spawn(&g, task_give_in_drain, NULL, NULL), 0);
    atap_release(g);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atomic_load(&drain_give_rc), 0);
    v = 0;
    assert_int_equal(atap_join(drain_target, &v, sizeof v), 0);
    assert_true(v == 10);
    atap_release(drain_target);
}

/* A task running in a shutdown's drain spawns a child (into its worker's
 * LIFO slot, which wakes nobody: the manager's tick hands such work on,
 * and the manager is stopped by then) and waits for it: by join_first
 * (which now helps), or by spinning on a flag the child sets (the drain
 * now hands the slot to an idle peer itself). Both used to hang the
 * shutdown. */
static atomic_int lifo_child_ran, lifo_parent_rc = 1;

static int task_set_flag(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_store(&lifo_child_ran, 1);
    return 0;
}

static int task_lifo_in_drain(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (atap_initialised() && now_ns() < end)
        sleep_us(1000);
    sleep_ms(50); /* the other workers have parked */
    atap_task x;
    if (atap_spawn(&x, task_set_flag, NULL, NULL) != 0)
        return 1;
    int rc = 0;
    if (arg == NULL) {
        size_t winner = 9;
        rc = atap_join_first(&x, 1, ATAP_PASS_BACK, ATAP_SEC(30), &winner);
    } else {
        end = now_ns() + ATAP_SEC(30);
        while (!atomic_load(&lifo_child_ran) && now_ns() < end)
            sleep_us(200); /* not a join: nothing here runs x */
        rc = atomic_load(&lifo_child_ran) ? 0 : ATAP_ENOTREADY;
    }
    atap_release(x);
    atomic_store(&lifo_parent_rc, rc);
    return 0;
}

static void test_lifecycle_lifo_task_in_drain_runs(void **state)
{
    (void)state;
    for (int spin = 0; spin < 2; spin++) {
        assert_int_equal(atap_init(NULL), 0);
        atomic_store(&lifo_child_ran, 0);
        atomic_store(&lifo_parent_rc, 1);
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_lifo_in_drain, spin ? (void *)1 : NULL, NULL), 0);
        atap_release(t);
        uint64_t t0 = now_ns();
        assert_int_equal(atap_shutdown(), 0);
        assert_int_equal(atomic_load(&lifo_parent_rc), 0);
        assert_int_equal(atomic_load(&lifo_child_ran), 1);
        assert_true(now_ns() - t0 < ATAP_SEC(20)); /* not the 30 s give-up */
    }
}

/* A thread outside the pool forwards a standing output to a waiting task
 * just as a shutdown begins (a hook holds the start between its admission
 * and its queueing): the shutdown waits for the start, and the drain runs
 * it. Checked only against the pool's state, the start was queued after
 * the drain had ended, and the task stayed PENDING for good. */
static atap_task fwd_src, fwd_dst;
static atomic_int fwd_in_kick, fwd_rc = 1;
static _Thread_local bool on_forward_thread;

static void hold_outside_kick(void)
{
    int zero = 0;
    if (on_forward_thread && atomic_compare_exchange_strong(&fwd_in_kick, &zero, 1))
        sleep_ms(200);
}

static void *forward_thread(void *arg)
{
    (void)arg;
    on_forward_thread = true;
    atomic_store(&fwd_rc, atap_forward(fwd_src, fwd_dst));
    return NULL;
}

static void test_lifecycle_outside_start_during_shutdown(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    fwd_src = spawn8(task_value, (void *)(uintptr_t)7);
    assert_true(join8(fwd_src) == 7);
    assert_int_equal(
        atap_spawn_waiting(&fwd_dst, task_double_input, NULL, 8, &(atap_spawn_opts){.out_size = 8}),
        0);
    atomic_store(&fwd_in_kick, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_KICK, hold_outside_kick), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, forward_thread, NULL), 0);
    assert_true(wait_atomic_at_least(&fwd_in_kick, 1, ATAP_SEC(10)));
    assert_int_equal(atap_shutdown(), 0);
    pthread_join(th, NULL);
    assert_int_equal(atap__test_on(ATAP__TEST_KICK, NULL), 0);
    assert_int_equal(atomic_load(&fwd_rc), 0);
    uint64_t v = 0;
    int rc = atap_join_for(fwd_dst, &v, sizeof v, ATAP_SEC(2));
    if (rc != 0 || v != 14)
        fail_msg("the forwarded task read %d (%s), value %llu", rc, atap_strerror(rc),
                 (unsigned long long)v);
    atap_release(fwd_src);
    atap_release(fwd_dst);
}

static void test_lifecycle_initialised_reflects_state(void **state)
{
    (void)state;
    assert_false(atap_initialised());
    assert_int_equal(atap_init(NULL), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
    assert_int_equal(atap_init(NULL), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

static void test_lifecycle_status(void **state)
{
    (void)state;
    assert_int_equal(atap_status(NULL), ATAP_EINVAL);
    assert_int_equal(atap_pool_stats(NULL), ATAP_EINVAL);

    struct atap_status st;
    memset(&st, 0xff, sizeof st);
    assert_int_equal(atap_status(&st), 0);
    assert_false(st.initialised);
    assert_false(st.shutting_down);
    assert_false(st.healthy);

    assert_int_equal(atap_init(NULL), 0);
    memset(&st, 0, sizeof st);
    assert_int_equal(atap_status(&st), 0);
    assert_true(st.initialised);
    assert_false(st.shutting_down);
    /* give the workers a moment to come up before asking for health */
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (!st.healthy && now_ns() < end) {
        sleep_us(500);
        assert_int_equal(atap_status(&st), 0);
    }
    assert_true(st.healthy);

    assert_int_equal(atap_shutdown(), 0);
    memset(&st, 0xff, sizeof st);
    assert_int_equal(atap_status(&st), 0);
    assert_false(st.initialised);
    assert_false(st.shutting_down);
    assert_false(st.healthy);
}

static void test_lifecycle_strerror_and_version(void **state)
{
    (void)state;
    static const int codes[] = {0,
                                ATAP_ENOTINIT,
                                ATAP_EALREADY,
                                ATAP_ENOTREADY,
                                ATAP_ETAKEN,
                                ATAP_EFINISHED,
                                ATAP_ECANCELLED,
                                ATAP_ETIMEDOUT,
                                ATAP_EFAILED,
                                ATAP_ENOTASK,
                                ATAP_EINVAL,
                                ATAP_EBUSY,
                                ATAP_ECLOSED,
                                ATAP_ETOOLONG};
    const char *unknown = atap_strerror(-99999);
    assert_non_null(unknown);
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *s = atap_strerror(codes[i]);
        assert_non_null(s);
        assert_true(s[0] != '\0');
        if (codes[i] != 0)
            assert_string_not_equal(s, unknown);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, atap_strerror(codes[j]));
    }
    assert_non_null(atap_strerror(-ENOMEM));
    assert_string_not_equal(atap_strerror(-ENOMEM), unknown);
    assert_non_null(atap_strerror(12345));
    assert_non_null(atap_strerror(-2147483647 - 1));

    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ATAP_VERSION_MAJOR, ATAP_VERSION_MINOR,
             ATAP_VERSION_PATCH);
    assert_string_equal(atap_version_string(), want);
}

typedef struct shutdown_race {
    test_barrier *barrier;
    atomic_int *counter;
    int rc;
    int counter_after;
    bool initialised_after;
} shutdown_race;

static void *shutdown_thread(void *p)
{
    shutdown_race *r = p;
    barrier_wait(r->barrier);
    r->rc = atap_shutdown();
    r->counter_after = atomic_load_explicit(r->counter, memory_order_acquire);
    r->initialised_after = atap_initialised();
    return NULL;
}

static void test_lifecycle_concurrent_shutdown(void **state)
{
    (void)state;
    enum { N = 4000 };
    static atap_task ts[N];
    for (int round = 0; round < 5; round++) {
        atomic_int counter;
        atomic_init(&counter, 0);
        test_barrier barrier;
        barrier_init(&barrier, 2);
        assert_int_equal(atap_init(NULL), 0);
        for (int i = 0; i < N; i++)
            assert_int_equal(atap_spawn(&ts[i], slow_count, &counter, NULL), 0);

        shutdown_race r[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            r[i] = (shutdown_race){.barrier = &barrier, .counter = &counter};
            assert_int_equal(pthread_create(&th[i], NULL, shutdown_thread, &r[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_join(th[i], NULL), 0);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(r[i].rc, 0);
            /* neither returns before the drain is done */
            if (r[i].counter_after != N)
                fail_msg("round %d: a concurrent atap_shutdown returned 0 with %d of %d "
                         "queued tasks run (the other caller saw %d; %d by now)",
                         round, r[i].counter_after, N, r[1 - i].counter_after,
                         atomic_load(&counter));
            assert_false(r[i].initialised_after);
        }
        for (int i = 0; i < N; i++)
            atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Outside threads spawning in a loop while the main thread shuts down:
 * every spawn that returned 0 was let in before the door shut, and the
 * shutdown waits for it, so its task has run by the time atap_shutdown
 * returns; the spawns after it fail with ATAP_ENOTINIT. A spawn that read
 * the door open and was not waited for would queue after the drain: its
 * task would run late or never, and the counts would differ. Half the
 * rounds hold each admitted spawn 2 ms before it queues
 * (ATAP__TEST_ADMITTED), so the shutdown comes while some are let in and
 * not yet queued. Both ways to mark a spawn in flight are tried: seats and
 * the process-wide barrier (where the system has one), and the count. */
static void hold_admitted(void) { sleep_ms(2); }

struct door_race {
    atomic_int *ran;
    atomic_int admitted;
    atomic_int refused;
    atomic_bool started;
};

static void *door_spawner(void *p)
{
    struct door_race *r = p;

    for (;;) {
        int rc = atap_spawn_detached(slow_count, r->ran, NULL);

        atomic_store(&r->started, true);
        if (rc == ATAP_ENOTINIT) {
            atomic_fetch_add(&r->refused, 1);
            return NULL;
        }
        if (rc != 0)
            return NULL;
        atomic_fetch_add(&r->admitted, 1);
    }
}

static void test_lifecycle_outside_spawns_racing_shutdown(void **state)
{
    (void)state;
    enum { THREADS = 3, ROUNDS = 20 };

    for (int round = 0; round < ROUNDS; round++) {
        atomic_int ran;
        struct door_race r[THREADS];
        pthread_t th[THREADS];
        int admitted = 0;

        atomic_init(&ran, 0);
        int barrier = atap__test_door_barrier(round % 4 < 2);
        assert_true(barrier == 0 || barrier == 1);
        if (round % 4 >= 2)
            assert_int_equal(barrier, 0);
        assert_int_equal(atap_init(NULL), 0);
        assert_int_equal(atap__test_on(ATAP__TEST_ADMITTED, round % 2 ? hold_admitted : NULL), 0);
        for (int i = 0; i < THREADS; i++) {
            r[i] = (struct door_race){.ran = &ran};
            assert_int_equal(pthread_create(&th[i], NULL, door_spawner, &r[i]), 0);
        }
        for (int i = 0; i < THREADS; i++)
            while (!atomic_load(&r[i].started))
                sched_yield();
        sleep_ms((unsigned)(round % 4) + (unsigned)(round % 2) * 3);
        assert_int_equal(atap_shutdown(), 0);
        int after = atomic_load(&ran);
        for (int i = 0; i < THREADS; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            assert_int_equal(atomic_load(&r[i].refused), 1);
            admitted += atomic_load(&r[i].admitted);
        }
        if (after != admitted)
            fail_msg("round %d: %d spawns let in, %d of their tasks run when atap_shutdown "
                     "returned (%d by now)",
                     round, admitted, after, atomic_load(&ran));
        assert_true(admitted > 0);
    }
    assert_int_equal(atap__test_on(ATAP__TEST_ADMITTED, NULL), 0);
    atap__test_door_barrier(true);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* init racing init: one starts the runtime, the other waits the start out
 * and counts a second user; both return 0, and it takes two shutdowns. */
typedef struct init_race {
    test_barrier *barrier;
    int rc;
} init_race;

static void *init_thread(void *p)
{
    init_race *r = p;
    barrier_wait(r->barrier);
    r->rc = atap_init(NULL);
    return NULL;
}

static void test_lifecycle_concurrent_init(void **state)
{
    (void)state;
    for (int round = 0; round < 10; round++) {
        test_barrier barrier;
        barrier_init(&barrier, 2);
        init_race r[2] = {{.barrier = &barrier}, {.barrier = &barrier}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&th[i], NULL, init_thread, &r[i]), 0);
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(r[0].rc, 0);
        assert_int_equal(r[1].rc, 0);
        assert_true(atap_initialised());
        atap_task t = spawn8(task_value, (void *)(uintptr_t)round);
        assert_true(join8(t) == (uint64_t)round);
        atap_release(t);
        assert_int_equal(atap_shutdown(), 0);
        assert_true(atap_initialised());
        assert_int_equal(atap_shutdown(), 0);
        assert_false(atap_initialised());
    }
}

static int add_one(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t v;
    memcpy(&v, atap_input(ctx, NULL), sizeof v);
    v++;
    memcpy(out, &v, sizeof v);
    return 0;
}

static _Atomic int g_in_frees;

static void count_in_free(void *in)
{
    (void)in;
    atomic_fetch_add(&g_in_frees, 1);
}

/* Tasks left waiting for a give would wait forever once the pool is gone:
 * shutdown lets them go. One never given anything reads ATAP_EFAILED (a
 * join returns, it does not hang); one that ran keeps its last output and
 * is finished. Gives after it are refused, and their values still go. */
static void test_lifecycle_shutdown_lets_waiting_tasks_go(void **state)
{
    (void)state;
    atap_task never, ran;
    uint64_t v = 41, out = 0;

    assert_int_equal(atap_init(NULL), 0);
    atomic_store(&g_in_frees, 0);
    atap_spawn_opts o = {.out_size = 8, .in_free = count_in_free};
    assert_int_equal(atap_spawn_waiting(&never, add_one, NULL, 8, &o), 0);
    assert_int_equal(atap_spawn_waiting(&ran, add_one, NULL, 8, &o), 0);
    assert_int_equal(atap_give(ran, &v, 8), 0);
    assert_int_equal(atap_join(ran, &out, 8), 0);
    assert_true(out == 42);
    assert_false(atap_finished(never));
    assert_false(atap_finished(ran));

    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_state_of(never), ATAP_FAILED);
    assert_int_equal(atap_join(never, &out, 8), ATAP_EFAILED);
    assert_true(atap_finished(never));
    assert_true(atap_finished(ran));
    out = 0;
    assert_int_equal(atap_join(ran, &out, 8), 0);
    assert_true(out == 42);
    v = 7;
    int rc = atap_give(ran, &v, 8);
    assert_true(rc == ATAP_ENOTINIT || rc == ATAP_EFINISHED);
    assert_int_equal(atomic_load(&g_in_frees), 1); /* the refused 7 */
    atap_release(never);
    atap_release(ran);
    assert_int_equal(atomic_load(&g_in_frees), 2); /* and 41, with its task */
}

static void test_lifecycle_many_restarts(void **state)
{
    (void)state;
    size_t rounds = scaled(20, 3);
    for (size_t r = 0; r < rounds; r++) {
        assert_int_equal(atap_init(NULL), 0);
        atomic_int counter;
        atomic_init(&counter, 0);
        atap_task ts[100];
        for (int i = 0; i < 100; i++)
            assert_int_equal(atap_spawn(&ts[i], task_count, &counter, NULL), 0);
        assert_int_equal(atap_shutdown(), 0);
        assert_int_equal(atomic_load(&counter), 100);
        for (int i = 0; i < 100; i++)
            atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- every fd libatap opens is close-on-exec ---------------------------- */

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#define FD_MAX_SEEN 1024

/* The process's open fds and what each names (readlink of /proc/self/fd/N):
 * false when there is no /proc/self/fd to read. */
typedef struct fd_set_seen {
    int n;
    int fd[FD_MAX_SEEN];
    char what[FD_MAX_SEEN][64];
} fd_set_seen;

static bool fds_list(fd_set_seen *out)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    out->n = 0;
    if (!d)
        return false;
    while ((e = readdir(d)) != NULL && out->n < FD_MAX_SEEN) {
        char path[64];
        int fd = atoi(e->d_name);
        ssize_t len;

        if (e->d_name[0] == '.' || fd == dirfd(d))
            continue;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        len = readlink(path, out->what[out->n], sizeof out->what[0] - 1);
        out->what[out->n][len > 0 ? len : 0] = '\0';
        out->fd[out->n++] = fd;
    }
    closedir(d);
    return true;
}

static bool fds_has(const fd_set_seen *s, int fd, const char *what)
{
    for (int i = 0; i < s->n; i++)
        if (s->fd[i] == fd && strcmp(s->what[i], what) == 0)
            return true;
    return false;
}

/* The helper mode of this binary (argv[1] "--list-fds"), run by the test
 * through exec: prints "fd what" for each fd it was born with. */
static int list_fds_main(void)
{
    static fd_set_seen s;

    if (!fds_list(&s))
        return 2;
    for (int i = 0; i < s.n; i++)
        printf("%d %s\n", s.fd[i], s.what[i]);
    return 0;
}

static atomic_int fdx_done;
static int fdx_dir = -1, fdx_pipe[2] = {-1, -1};

/* Parks (or waits in the kernel) on everything that makes libatap open an
 * fd: a kernel sleep (its thread's event queue), a deadline, an fd, a
 * signal (the signal pipe), a path (inotify). */
static int fdx_task(atap_ctx *ctx, void *arg, void *out)
{
    int what = (int)(intptr_t)arg, rc = 0;

    (void)out;
    if (atap_resumed(ctx)) {
        atomic_fetch_add(&fdx_done, 1);
        return 0;
    }
    switch (what) {
    case 0:
        atap_sleep_relaxed(ATAP_MS(5)); /* all of it in the kernel */
        atomic_fetch_add(&fdx_done, 1);
        return 0;
    case 1:
        rc = atap_park_until(ctx, atap_now() + ATAP_MS(5));
        break;
    case 2:
        rc = atap_park_fd(ctx, fdx_pipe[0], ATAP_READABLE, ATAP_MS(5));
        break;
    case 3:
        rc = atap_park_signal(ctx, SIGUSR2, ATAP_MS(5));
        break;
    default:
        rc = atap_park_path(ctx, fdx_dir, ATAP_PATH_ENTRIES, ATAP_MS(5));
        break;
    }
    if (rc != 0) { /* -ENOTSUP: a backend without it */
        atomic_fetch_add(&fdx_done, 1);
        return 0;
    }
    return ATAP_PARKED;
}

static const char *fdx_self;

static void test_lifecycle_fds_close_on_exec(void **state)
{
    (void)state;
    static fd_set_seen before, during, child;
    char tmpl[] = "/tmp/atap-cloexec-XXXXXX";
    atap_task t[6];
    atap_chan *ch = NULL;
    int outp[2], status = 0;

    assert_non_null(mkdtemp(tmpl));
    fdx_dir = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fdx_dir >= 0);
    assert_int_equal(pipe2(fdx_pipe, O_CLOEXEC), 0);
    assert_int_equal(pipe2(outp, O_CLOEXEC), 0);
    if (!fds_list(&before))
        skip(); /* no /proc/self/fd */
    assert_int_equal(atap_init(NULL), 0);
    atomic_store(&fdx_done, 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(atap_spawn(&t[i], fdx_task, (void *)(intptr_t)i, NULL), 0);
    assert_int_equal(
        atap_spawn(&t[5], fdx_task, (void *)(intptr_t)0, &(atap_spawn_opts){.blocking = true}), 0);
    assert_int_equal(atap_chan_open(&ch, sizeof(uint64_t), 1, NULL), 0);
    uint64_t v = 7;
    atap_task r;
    assert_int_equal(atap_chan_spawn_recv(&r, ch, NULL), 0);
    assert_int_equal(atap_chan_send(ch, &v), 0);
    assert_int_equal(atap_take(r, &v, sizeof v), 0);
    atap_release(r);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(atap_join(t[i], NULL, 0), 0);
        atap_release(t[i]);
    }
    assert_int_equal(atomic_load(&fdx_done), 6);
    assert_true(fds_list(&during));

    /* The runtime's fds: open now, not before it started. */
    int runtime = 0;
    for (int i = 0; i < during.n; i++)
        if (!fds_has(&before, during.fd[i], during.what[i]))
            runtime++;
    print_message("%d fds opened by the runtime\n", runtime);
    assert_true(runtime >= 3); /* the manager's poller and wake, a thread's queue, ... */

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(outp[1], 1) < 0)
            _exit(126);
        execl(fdx_self, fdx_self, "--list-fds", (char *)NULL);
        _exit(127);
    }
    close(outp[1]);
    FILE *f = fdopen(outp[0], "r");
    assert_non_null(f);
    child.n = 0;
    while (child.n < FD_MAX_SEEN &&
           fscanf(f, "%d %63s", &child.fd[child.n], child.what[child.n]) == 2)
        child.n++;
    fclose(f);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(child.n >= 3); /* stdin, stdout, stderr at least */

    int leaked = 0;
    for (int i = 0; i < during.n; i++) {
        if (fds_has(&before, during.fd[i], during.what[i]))
            continue;
        if (fds_has(&child, during.fd[i], during.what[i])) {
            print_message("fd %d (%s) survives exec\n", during.fd[i], during.what[i]);
            leaked++;
        }
    }
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    assert_int_equal(atap_shutdown(), 0);
    close(fdx_dir);
    close(fdx_pipe[0]);
    close(fdx_pipe[1]);
    rmdir(tmpl);
    assert_int_equal(leaked, 0);
}

/* The fds of one run of the runtime that used every kind of wait: kernel
 * sleeps on several threads at once, a deadline, an fd, a signal and a path
 * parked. 0, or the check that failed. */
static int fdc_one_run(void)
{
    enum { N = 16 };
    atap_task t[N];

    if (atap_init(NULL) != 0)
        return 2;
    atomic_store(&fdx_done, 0);
    for (int i = 0; i < N; i++)
        if (atap_spawn(&t[i], fdx_task, (void *)(intptr_t)(i < 8 ? 0 : i % 5),
                       &(atap_spawn_opts){.blocking = i == 0}) != 0)
            return 3;
    for (int i = 0; i < N; i++) {
        if (atap_join(t[i], NULL, 0) != 0)
            return 4;
        atap_release(t[i]);
    }
    if (atomic_load(&fdx_done) != N)
        return 5;
    return atap_shutdown() == 0 ? 0 : 6;
}

/* The fds of `after` that `before` lacks, less those an emulated kqueue
 * keeps for the process from its first kqueue on (test_util.h: one epoll,
 * one eventfd), printed when `say`. */
static int fds_left(const fd_set_seen *before, const fd_set_seen *after, int run, bool say)
{
    int left = 0, epolls = 0, eventfds = 0;

    for (int i = 0; i < after->n; i++) {
        const char *what = after->what[i];

        if (fds_has(before, after->fd[i], what))
            continue;
        if (poller_emulated() && strcmp(what, "anon_inode:[eventpoll]") == 0 && epolls++ == 0)
            continue;
        if (poller_emulated() && strcmp(what, "anon_inode:[eventfd]") == 0 && eventfds++ == 0)
            continue;
        if (say)
            fprintf(stderr, "run %d: fd %d (%s) stays open\n", run, after->fd[i], what);
        left++;
    }
    return left;
}

/* In a fork's child, which starts with none of libatap's fds open: a run
 * of the runtime leaves none behind, nor does a second one (what the first
 * closed opens again). */
static int fdc_child(void)
{
    static fd_set_seen before, after;
    int rc;

    poller_settle();
    if (!fds_list(&before))
        return 7;
    for (int run = 0; run < 2; run++) {
        if ((rc = fdc_one_run()) != 0)
            return rc;
        poller_settle();
        if (!fds_list(&after))
            return 7;
        if (fds_left(&before, &after, run, true) != 0 || after.n < before.n)
            return 10 + run;
    }
    if (poller_emulated() && after.n > before.n)
        printf("emulated kqueue: %d fd(s) of its own left open\n", after.n - before.n);
    fflush(stdout);
    (void)atap_signal_release(SIGUSR2);
    return 0;
}

static void test_lifecycle_last_shutdown_closes_fds(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/atap-fdclose-XXXXXX";
    fd_set_seen *probe = malloc(sizeof *probe);
    pid_t pid;

    assert_non_null(probe);
    if (!fds_list(probe)) {
        free(probe);
        skip(); /* no /proc/self/fd */
    }
    free(probe);
    assert_non_null(mkdtemp(tmpl));
    fdx_dir = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fdx_dir >= 0);
    assert_int_equal(pipe2(fdx_pipe, O_CLOEXEC), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fdc_child());
    child_passed(pid);
    close(fdx_dir);
    close(fdx_pipe[0]);
    close(fdx_pipe[1]);
    fdx_dir = fdx_pipe[0] = fdx_pipe[1] = -1;
    rmdir(tmpl);
}

/* ---- fork(): the child starts fresh, the parent goes on ------------------ */

#define FORK_GATED 3000

static atomic_int fk_gate, fk_spin_stop, fk_spinning, fk_repeats;
static int fk_pipe[2] = {-1, -1};
static atap_task fk_gated[FORK_GATED];

/* Queued behind the gate: the first few hold every worker, the rest wait. */
static int fk_gated_task(atap_ctx *ctx, void *arg, void *out)
{
    struct timespec tick = {0, 100000};

    (void)ctx;
    while (!atomic_load(&fk_gate) && !atomic_load(&g_release_all)) /* teardown: let go */
        nanosleep(&tick, NULL);
    *(int *)out = (int)(intptr_t)arg * 2;
    return 0;
}

static int fk_spin_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atomic_store(&fk_spinning, 1);
    while (!atomic_load(&fk_spin_stop) && !atomic_load(&g_release_all))
        sched_yield();
    *(int *)out = 7;
    return 0;
}

static int fk_park_fd_task(atap_ctx *ctx, void *arg, void *out)
{
    char b;

    (void)arg;
    if (!atap_resumed(ctx))
        return atap_park_fd(ctx, fk_pipe[0], ATAP_READABLE, ATAP_FOREVER) == 0 ? ATAP_PARKED : -1;
    if (read(fk_pipe[0], &b, 1) != 1)
        return -1;
    *(int *)out = b;
    return 0;
}

static int fk_park_until_task(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t deadline = *(const uint64_t *)arg;

    if (!atap_resumed(ctx))
        return atap_park_until(ctx, deadline) == 0 ? ATAP_PARKED : -1;
    *(int *)out = atap_now() >= deadline ? 11 : -11;
    return 0;
}

static int fk_repeat_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    *(int *)out = atomic_fetch_add(&fk_repeats, 1) + 1;
    return 0;
}

static int fk_square(atap_ctx *ctx, void *arg, void *out)
{
    int x = *(const int *)arg;

    (void)ctx;
    *(int *)out = x * x;
    return 0;
}

/* The child's side: no cmocka here (its state is the parent's copy); each
 * failed step exits with its own status. A join of a parent's handle must
 * come back at once; a hang is caught by the parent's timeout. */
/* busy: the parent forked while its runtime's threads were at work (a
 * waker held mid-wake, the manager and workers running). */
static int fork_child_checks(const atap_task *old, size_t nold, bool busy)
{
    atap_task t;
    int x = 9, out = 0;

    if (atap_initialised())
        return 10;
    for (size_t i = 0; i < nold; i++)
        if (atap_join(old[i], &out, sizeof out) != ATAP_ENOTASK ||
            atap_state_of(old[i]) == ATAP_PENDING || atap_cancel(old[i]) != ATAP_ENOTASK)
            return 11;
    if (atap_shutdown() != 0)
        return 12;
    if (atap_spawn(&t, fk_square, &x, &(atap_spawn_opts){.out_size = sizeof(int)}) != ATAP_ENOTINIT)
        return 13;
#if defined(TEST_ASAN)
    /* clang 14's ASan takes no lock of its allocator around fork: a parent
     * thread inside malloc or free at the fork leaves the child's copy of
     * an allocator lock held, and the child's first new thread blocks in
     * ASan's own thread start for ever (seen 1 run in ~90 with the parent's
     * threads at work: every child thread in
     * SizeClassAllocator64::GetFromAllocator). So with the parent busy the
     * ASan child stops here; the plain build runs the whole child. */
    if (busy) {
        print_message("ASan: the child's atap_init is not run (its allocator may be locked)\n");
        return 0;
    }
#else
    (void)busy;
#endif
#if defined(TEST_TSAN)
    /* TSan does not support starting threads in the child of a
     * multithreaded fork: it dies with "starting new threads after
     * multi-threaded fork is not supported" unless die_after_fork=0, which
     * it reads only when the process starts, and what it would report in
     * such a child is not to be trusted. So under TSan the child stops
     * here, before its atap_init; the plain and ASan builds go on. */
    print_message(
        "TSan: the child's atap_init is not run (no threads after a multithreaded fork)\n");
    return 0;
#endif
    if (atap_init(NULL) != 0)
        return 14;
    if (!atap_initialised())
        return 15;
    if (atap_spawn(&t, fk_square, &x, &(atap_spawn_opts){.out_size = sizeof(int)}) != 0)
        return 16;
    if (atap_join(t, &out, sizeof out) != 0 || out != 81)
        return 17;
    atap_release(t);
    for (size_t i = 0; i < nold; i++) /* a new table: still none of the parent's */
        if (atap_join(old[i], &out, sizeof out) != ATAP_ENOTASK)
            return 18;
    if (atap_shutdown() != 0)
        return 19;
    if (atap_initialised())
        return 20;
    return 0;
}

/* Waits for pid at most timeout_ms; kills it if it is still running.
 * Returns its wait status, or -1 if it had to be killed. */
static int wait_child(pid_t pid, unsigned timeout_ms)
{
    struct timespec ms = {0, 1000000};
    int status = 0;

    for (unsigned i = 0; i < timeout_ms; i++) {
        pid_t got = waitpid(pid, &status, WNOHANG);

        if (got == pid)
            return status;
        nanosleep(&ms, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void test_lifecycle_fork_child_starts_fresh(void **state)
{
    (void)state;
    uint64_t until = 0;
    atap_task spin, pfd, puntil, rep, delayed, old[5];
    int out = 0, status;
    const atap_spawn_opts o = {.out_size = sizeof(int)},
                          hi = {.out_size = sizeof(int), .priority = 127};

    atomic_store(&fk_gate, 0);
    atomic_store(&fk_spin_stop, 0);
    atomic_store(&fk_spinning, 0);
    atomic_store(&fk_repeats, 0);
    assert_int_equal(pipe2(fk_pipe, O_CLOEXEC), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_spawn(&spin, fk_spin_task, NULL, &hi), 0);
    assert_int_equal(atap_spawn(&pfd, fk_park_fd_task, NULL, &hi), 0);
    until = atap_now() + ATAP_MS(300);
    assert_int_equal(atap_spawn(&puntil, fk_park_until_task, &until, &hi), 0);
    assert_int_equal(atap_spawn(&rep, fk_repeat_task, NULL,
                                &(atap_spawn_opts){.out_size = sizeof(int),
                                                   .priority = 127,
                                                   .kind = ATAP_REPEAT,
                                                   .every_ns = ATAP_MS(1)}),
                     0);
    assert_int_equal(
        atap_spawn(&delayed, fk_square, &(int){5},
                   &(atap_spawn_opts){.out_size = sizeof(int), .after_ns = ATAP_MS(200)}),
        0);
    /* The spinning task holds a worker, the parks are armed, the repeat
     * has run (at top priority, before the gated tasks take every worker;
     * it may then wait queued behind them until the gate opens). */
    for (int i = 0; i < 5000 && atomic_load(&fk_repeats) < 2; i++)
        usleep(1000);
    assert_true(atomic_load(&fk_repeats) >= 2);
    for (int i = 0; i < FORK_GATED; i++)
        assert_int_equal(atap_spawn(&fk_gated[i], fk_gated_task, (void *)(intptr_t)i, &o), 0);
    assert_false(atap_finished(pfd));
    old[0] = fk_gated[FORK_GATED - 1], old[1] = spin, old[2] = pfd, old[3] = puntil, old[4] = rep;

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_checks(old, 5, false));
    status = wait_child(pid, 30000);
    print_message("child: %s %d\n", status == -1 ? "killed (hung)" : "exit", WEXITSTATUS(status));
    assert_int_not_equal(status, -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    /* The parent: everything still runs. */
    int seen = atomic_load(&fk_repeats);
    atomic_store(&fk_gate, 1);
    for (int i = 0; i < FORK_GATED; i++) {
        assert_int_equal(atap_join(fk_gated[i], &out, sizeof out), 0);
        assert_int_equal(out, i * 2);
        atap_release(fk_gated[i]);
    }
    for (int i = 0; i < 5000 && !atomic_load(&fk_spinning); i++)
        usleep(1000);
    atomic_store(&fk_spin_stop, 1);
    assert_int_equal(atap_join(spin, &out, sizeof out), 0);
    assert_int_equal(out, 7);
    assert_int_equal(write(fk_pipe[1], "x", 1), 1);
    assert_int_equal(atap_join(pfd, &out, sizeof out), 0);
    assert_int_equal(out, 'x');
    assert_int_equal(atap_join(puntil, &out, sizeof out), 0);
    assert_int_equal(out, 11);
    assert_int_equal(atap_join(delayed, &out, sizeof out), 0);
    assert_int_equal(out, 25);
    for (int i = 0; i < 5000 && atomic_load(&fk_repeats) < seen + 3; i++)
        usleep(1000);
    assert_true(atomic_load(&fk_repeats) >= seen + 3); /* the repeat goes on */
    assert_int_equal(atap_cancel(rep), 0);
    atap_release(spin), atap_release(pfd), atap_release(puntil), atap_release(rep);
    atap_release(delayed);
    assert_int_equal(atap_shutdown(), 0);
    close(fk_pipe[0]);
    close(fk_pipe[1]);
}

/* Forked with the runtime stopped (but started once, so its poller is
 * open): the child starts its own and stops it; so does the parent after. */
static void test_lifecycle_fork_after_shutdown_child_starts(void **state)
{
    (void)state;
    atap_task t;
    int x = 4, out = 0, status;

    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_spawn(&t, fk_square, &x, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
    assert_int_equal(atap_shutdown(), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_checks(&t, 1, false));
    status = wait_child(pid, 30000);
    assert_int_not_equal(status, -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's handle still reads its output. */
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    assert_int_equal(out, 16);
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_spawn(&t, fk_square, &x, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    assert_int_equal(out, 16);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
}

/* A fork while a thread of the parent is in the middle of a wake of the
 * hub's poller (counted in, not yet out): the count must not come along,
 * or the child's last shutdown waits for that wake for ever. The hook
 * holds the waker inside its wake until the main thread (outside the
 * runtime) has forked. */
enum { FW_IDLE, FW_HELD, FW_FORKED };
static atomic_int fw_state;

static void fw_hold_waker(void)
{
    int idle = FW_IDLE;

    if (!atomic_compare_exchange_strong(&fw_state, &idle, FW_HELD))
        return; /* one waker held; any other passes */
    for (int i = 0; i < 30000 && atomic_load(&fw_state) != FW_FORKED; i++)
        usleep(1000);
}

static int fw_park_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    if (atap_resumed(ctx)) {
        *(int *)out = 3;
        return 0;
    }
    atap_park_until(ctx, atap_now() + ATAP_MS(1)); /* an arm wakes the manager */
    return ATAP_PARKED;
}

static void test_lifecycle_fork_during_a_wake_child_stops(void **state)
{
    (void)state;
    atap_task t;
    int out = 0, status;

    atomic_store(&fw_state, FW_IDLE);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_HUB_WAKE, fw_hold_waker), 0);
    assert_int_equal(
        atap_spawn(&t, fw_park_task, NULL, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
    for (int i = 0; i < 10000 && atomic_load(&fw_state) != FW_HELD; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&fw_state), FW_HELD);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_checks(NULL, 0, true));
    atomic_store(&fw_state, FW_FORKED);
    status = wait_child(pid, 30000);
    print_message("child: %s %d\n", status == -1 ? "killed (hung)" : "exit", WEXITSTATUS(status));
    assert_int_not_equal(status, -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_HUB_WAKE, NULL), 0);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    assert_int_equal(out, 3);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0);
}

int main(int argc, char **argv)
{
    /* The close-on-exec test execs this binary to list what it inherited. */
    if (argc > 1 && strcmp(argv[1], "--list-fds") == 0)
        return list_fds_main();
    fdx_self = "/proc/self/exe";
    const struct CMUnitTest tests[] = {
        /* must stay first: it needs a process that never ran atap_init */
        cmocka_unit_test_teardown(test_lifecycle_spawn_before_init, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_before_init_is_safe, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_init_twice, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_init_small_stack_einval, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_init_config_size, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_workers_started_and_stopped, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_drains, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_drains_across_blocking, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_twice, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_spawn_after_shutdown, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_reinit_old_handles_read, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_inside_task_einval, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_init_inside_task_during_shutdown_einval,
                                  ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_callback_inside_shutdown_einval, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_give_during_drain_runs, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_lifo_task_in_drain_runs, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_outside_start_during_shutdown, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_initialised_reflects_state, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_status, ensure_stopped),
        cmocka_unit_test(test_lifecycle_strerror_and_version),
        cmocka_unit_test_teardown(test_lifecycle_concurrent_shutdown, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_outside_spawns_racing_shutdown, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_concurrent_init, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_many_restarts, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_shutdown_lets_waiting_tasks_go, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_fds_close_on_exec, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_last_shutdown_closes_fds, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_fork_child_starts_fresh, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_fork_after_shutdown_child_starts, ensure_stopped),
        cmocka_unit_test_teardown(test_lifecycle_fork_during_a_wake_child_stops, ensure_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

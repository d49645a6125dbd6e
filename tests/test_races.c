/*
 * Races, each run many times: cancel against completion, many joiners, dup
 * and release from many threads, spawns from outside threads, take against
 * take, join against take, release against the run.
 *
 * Off the test thread nothing asserts: threads CHECK() and the test asserts
 * no failures after joining them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#define SENTINEL 0xdeadbeefcafef00dull

static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size)
{
    pthread_t th[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&th[i], NULL, fn, (char *)args + (size_t)i * arg_size), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static void spin_for(unsigned iters)
{
    volatile unsigned x = 0;
    for (unsigned i = 0; i < iters; i++)
        x += i;
    (void)x;
}

/* ---- cancel racing completion ---------------------------------------- */

static atomic_int g_out_frees;
static atomic_int g_arg_frees;

static void count_out_free(void *out)
{
    (void)out;
    atomic_fetch_add(&g_out_frees, 1);
}

static void count_arg_free(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_arg_frees, 1);
}

/* arg: i. Works a little (more for some i), then writes mix(i). */
static int task_mixed(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t i = (uint64_t)(uintptr_t)arg;
    spin_for((unsigned)(i % 8) * 200u);
    uint64_t v = mix(i);
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_races_cancel_vs_completion(void **state)
{
    (void)state;
    size_t n = scaled(1000, 1000);
    atomic_store(&g_out_frees, 0);
    atomic_store(&g_arg_frees, 0);
    atap_spawn_opts o = {.out_size = 8, .out_free = count_out_free, .arg_free = count_arg_free};
    size_t ready = 0, cancelled = 0;
    for (size_t i = 0; i < n; i++) {
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_mixed, (void *)(uintptr_t)i, &o), 0);
        spin_for((unsigned)(i % 5) * 300u); /* move the cancel around the run */
        assert_int_equal(atap_cancel(t), 0);
        uint64_t v = SENTINEL;
        int rc = atap_join(t, &v, sizeof v);
        atap_state st = atap_state_of(t);
        if (rc == 0) {
            assert_true(v == mix(i));
            assert_int_equal(st, ATAP_READY);
            ready++;
        } else {
            assert_int_equal(rc, ATAP_ECANCELLED);
            assert_true(v == SENTINEL);
            assert_int_equal(st, ATAP_CANCELLED);
            cancelled++;
        }
        /* and it stays that way */
        assert_int_equal(atap_join(t, &v, sizeof v), rc);
        atap_release(t);
    }
    print_message("cancel vs completion: %zu ready, %zu cancelled\n", ready, cancelled);
    assert_true(wait_live_back(ATAP_SEC(30)));
    assert_true(wait_atomic_at_least(&g_arg_frees, (int)n, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&g_arg_frees), (int)n);
    int frees = atomic_load(&g_out_frees);
    /* every READY output nobody took is freed once; a dropped output may
     * or may not have been written, never more than once per task */
    assert_true(frees >= (int)ready);
    assert_true(frees <= (int)n);
}

/* the same race with the cancel on another thread */
typedef struct cancel_arg {
    test_barrier *barrier;
    atap_task task;
    unsigned delay;
} cancel_arg;

static void *cancel_thread(void *p)
{
    cancel_arg *a = p;
    barrier_wait(a->barrier);
    spin_for(a->delay);
    CHECK(atap_cancel(a->task) == 0);
    return NULL;
}

static void test_races_cancel_from_thread_vs_join(void **state)
{
    (void)state;
    size_t n = scaled(300, 100);
    for (size_t i = 0; i < n; i++) {
        test_barrier barrier;
        barrier_init(&barrier, 2);
        cancel_arg a = {.barrier = &barrier, .delay = (unsigned)(i % 7) * 250u};
        a.task = spawn8(task_mixed, (void *)(uintptr_t)i);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, cancel_thread, &a), 0);
        barrier_wait(&barrier);
        uint64_t v = SENTINEL;
        int rc = atap_join(a.task, &v, sizeof v);
        assert_int_equal(pthread_join(th, NULL), 0);
        /* the final state agrees with what the join saw */
        atap_state st = atap_state_of(a.task);
        if (rc == 0) {
            assert_true(v == mix(i));
            assert_int_equal(st, ATAP_READY);
        } else {
            assert_int_equal(rc, ATAP_ECANCELLED);
            assert_int_equal(st, ATAP_CANCELLED);
        }
        atap_release(a.task);
    }
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(30)));
}

/* ---- many joiners ------------------------------------------------------ */

typedef struct joiner_arg {
    test_barrier *barrier;
    atap_task task;
    uint64_t want;
    int how;
} joiner_arg;

static void *joiner_thread(void *p)
{
    joiner_arg *a = p;
    barrier_wait(a->barrier);
    uint64_t v = SENTINEL;
    int rc;
    switch (a->how % 3) {
    case 0:
        rc = atap_join(a->task, &v, sizeof v);
        break;
    case 1:
        rc = atap_join_for(a->task, &v, sizeof v, ATAP_SEC(60));
        break;
    default:
        while ((rc = atap_try_join(a->task, &v, sizeof v)) == ATAP_ENOTREADY)
            sched_yield();
        break;
    }
    CHECK(rc == 0);
    CHECK(v == a->want);
    atap_state st = ATAP_PENDING;
    CHECK(atap_wait(a->task, &st) == 0);
    CHECK(st == ATAP_READY);
    return NULL;
}

static void test_races_many_joiners(void **state)
{
    (void)state;
    enum { J = 8 };
    size_t rounds = scaled(50, 10);
    for (size_t r = 0; r < rounds; r++) {
        test_barrier barrier;
        barrier_init(&barrier, J + 1);
        gate *g = gate_new(mix(r));
        atap_task t = spawn8(task_gated, g);
        joiner_arg args[J];
        for (int j = 0; j < J; j++)
            args[j] = (joiner_arg){.barrier = &barrier, .task = t, .want = mix(r), .how = j};
        pthread_t th[J];
        for (int j = 0; j < J; j++)
            assert_int_equal(pthread_create(&th[j], NULL, joiner_thread, &args[j]), 0);
        barrier_wait(&barrier);
        if (r % 2)
            sleep_us(500); /* let the joiners get to their wait */
        atomic_store(&g->open, 1);
        for (int j = 0; j < J; j++)
            assert_int_equal(pthread_join(th[j], NULL), 0);
        assert_true(join8(t) == mix(r));
        atap_release(t);
    }
    assert_no_failures();
}

/* ---- dup and release from many threads -------------------------------- */

typedef struct dup_arg {
    test_barrier *barrier;
    atap_task task;
    uint64_t want;
    size_t iters;
} dup_arg;

static void *dup_thread(void *p)
{
    dup_arg *a = p;
    barrier_wait(a->barrier);
    for (size_t i = 0; i < a->iters; i++) {
        atap_task d = ATAP_NO_TASK;
        int rc = atap_dup(a->task, &d);
        CHECK(rc == 0);
        CHECK(d.id == a->task.id);
        if (i % 1024 == 0) {
            uint64_t v = 0;
            CHECK(atap_join(d, &v, sizeof v) == 0);
            CHECK(v == a->want);
        }
        /* a dup of a dup, released first */
        if (i % 7 == 0) {
            atap_task dd;
            CHECK(atap_dup(d, &dd) == 0);
            atap_release(dd);
        }
        atap_release(d);
    }
    return NULL;
}

static void test_races_dup_release(void **state)
{
    (void)state;
    enum { TH = 8 };
    size_t iters = scaled(10000, 500);
    for (int settled = 0; settled < 2; settled++) {
        test_barrier barrier;
        barrier_init(&barrier, TH + 1);
        gate *g = gate_new(0xd0d0 + (uint64_t)settled);
        atap_task t = spawn8(task_gated, g);
        if (settled) {
            atomic_store(&g->open, 1);
            assert_true(join8(t) == g->value);
        }
        dup_arg args[TH];
        for (int i = 0; i < TH; i++)
            args[i] = (dup_arg){.barrier = &barrier, .task = t, .want = g->value, .iters = iters};
        pthread_t th[TH];
        for (int i = 0; i < TH; i++)
            assert_int_equal(pthread_create(&th[i], NULL, dup_thread, &args[i]), 0);
        barrier_wait(&barrier);
        if (!settled) {
            sleep_ms(2); /* some dups before the output lands, some after */
            atomic_store(&g->open, 1);
        }
        for (int i = 0; i < TH; i++)
            assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_no_failures();
        /* the original listener is still there */
        assert_true(join8(t) == g->value);
        assert_int_equal(atap_state_of(t), ATAP_READY);
        assert_int_equal(pool_stats().live, g_live_base + 1);
        atap_release(t);
        uint64_t v = SENTINEL;
        assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ENOTASK);
        assert_true(wait_live_back(ATAP_SEC(20)));
    }
}

/* ---- spawns from outside threads ------------------------------------- */

typedef struct spawner_arg {
    test_barrier *barrier;
    uint64_t thread;
    size_t n;
    atap_task *handles;
} spawner_arg;

static int task_f(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = mix((uint64_t)(uintptr_t)arg) ^ 0x5a5a5a5a5a5a5a5aull;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void *spawner_thread(void *p)
{
    spawner_arg *a = p;
    barrier_wait(a->barrier);
    for (size_t i = 0; i < a->n; i++) {
        uintptr_t key = (uintptr_t)(a->thread << 32 | i);
        int rc = atap_spawn(&a->handles[i], task_f, (void *)key,
                            &(atap_spawn_opts){.out_size = 8, .priority = (int)(i % 3) - 1});
        CHECK(rc == 0);
        if (rc != 0)
            a->handles[i] = ATAP_NO_TASK;
    }
    for (size_t i = 0; i < a->n; i++) {
        uint64_t key = a->thread << 32 | i;
        uint64_t v = 0;
        CHECK(atap_join(a->handles[i], &v, sizeof v) == 0);
        CHECK(v == (mix(key) ^ 0x5a5a5a5a5a5a5a5aull));
        atap_release(a->handles[i]);
    }
    return NULL;
}

static void test_races_spawn_from_threads(void **state)
{
    (void)state;
    enum { TH = 4 };
    size_t n = scaled(10000, 1000);
    test_barrier barrier;
    barrier_init(&barrier, TH);
    spawner_arg args[TH];
    for (int i = 0; i < TH; i++) {
        args[i] = (spawner_arg){.barrier = &barrier, .thread = (uint64_t)i + 1, .n = n};
        args[i].handles = calloc(n, sizeof(atap_task));
        assert_non_null(args[i].handles);
    }
    run_threads(TH, spawner_thread, args, sizeof args[0]);
    assert_no_failures();
    for (int i = 0; i < TH; i++)
        free(args[i].handles);
    assert_true(wait_live_back(ATAP_SEC(30)));
}

/* ---- take racing take, join racing take -------------------------------- */

#define BIG 256

static int task_big(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    uint64_t *o = out;
    for (size_t i = 0; i < BIG / 8; i++)
        o[i] = mix(seed * 64 + i);
    return 0;
}

static bool big_ok(const uint64_t *buf, uint64_t seed)
{
    for (size_t i = 0; i < BIG / 8; i++)
        if (buf[i] != mix(seed * 64 + i))
            return false;
    return true;
}

typedef struct reader_arg {
    test_barrier *barrier;
    atap_task task;
    uint64_t seed;
    bool take;
    int rc; /* a taker's result */
} reader_arg;

static void *reader_thread(void *p)
{
    reader_arg *a = p;
    uint64_t buf[BIG / 8];
    barrier_wait(a->barrier);
    if (a->take) {
        memset(buf, 0, sizeof buf);
        a->rc = atap_take(a->task, buf, sizeof buf);
        CHECK(a->rc == 0 || a->rc == ATAP_ETAKEN);
        if (a->rc == 0)
            CHECK(big_ok(buf, a->seed));
        return NULL;
    }
    /* a joiner reads until the output is gone; once gone it stays gone */
    bool gone = false;
    for (int k = 0; k < 50; k++) {
        memset(buf, 0, sizeof buf);
        int rc = atap_join(a->task, buf, sizeof buf);
        CHECK(rc == 0 || rc == ATAP_ETAKEN);
        if (rc == 0) {
            CHECK(!gone);
            CHECK(big_ok(buf, a->seed));
        } else {
            gone = true;
        }
    }
    return NULL;
}

static void race_readers(int joiners, int takers, size_t rounds)
{
    int total = joiners + takers;
    for (size_t r = 0; r < rounds; r++) {
        test_barrier barrier;
        barrier_init(&barrier, total);
        atap_task t;
        assert_int_equal(
            atap_spawn(&t, task_big, (void *)(uintptr_t)r, &(atap_spawn_opts){.out_size = BIG}), 0);
        if (r % 2) /* half the rounds race on a settled output */
            assert_int_equal(atap_wait(t, NULL), 0);
        reader_arg args[16];
        for (int i = 0; i < total; i++)
            args[i] = (reader_arg){.barrier = &barrier, .task = t, .seed = r, .take = i >= joiners};
        run_threads(total, reader_thread, args, sizeof args[0]);
        int winners = 0;
        for (int i = joiners; i < total; i++) {
            if (args[i].rc == 0)
                winners++;
            else
                assert_int_equal(args[i].rc, ATAP_ETAKEN);
        }
        assert_int_equal(winners, 1);
        assert_int_equal(atap_state_of(t), ATAP_TAKEN);
        uint64_t buf[BIG / 8];
        assert_int_equal(atap_try_take(t, buf, sizeof buf), ATAP_ETAKEN);
        atap_release(t);
    }
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static void test_races_take_vs_take(void **state)
{
    (void)state;
    race_readers(0, 8, scaled(100, 20));
}

static void test_races_join_vs_take(void **state)
{
    (void)state;
    race_readers(4, 4, scaled(100, 20));
}

/* ---- cancels racing each other ----------------------------------------- */

typedef struct canceller_arg {
    test_barrier *barrier;
    atap_task task;
} canceller_arg;

static void *canceller_thread(void *p)
{
    canceller_arg *a = p;
    barrier_wait(a->barrier);
    CHECK(atap_cancel(a->task) == 0);
    uint64_t v = SENTINEL;
    int rc = atap_join(a->task, &v, sizeof v);
    CHECK(rc == 0 || rc == ATAP_ECANCELLED);
    return NULL;
}

static void test_races_concurrent_cancels(void **state)
{
    (void)state;
    enum { TH = 8 };
    size_t rounds = scaled(50, 10);
    for (size_t r = 0; r < rounds; r++) {
        test_barrier barrier;
        barrier_init(&barrier, TH);
        atap_task t = spawn8(task_mixed, (void *)(uintptr_t)r);
        canceller_arg args[TH];
        for (int i = 0; i < TH; i++)
            args[i] = (canceller_arg){.barrier = &barrier, .task = t};
        run_threads(TH, canceller_thread, args, sizeof args[0]);
        atap_state st = atap_state_of(t);
        assert_true(st == ATAP_READY || st == ATAP_CANCELLED);
        uint64_t v = SENTINEL;
        int rc = atap_join(t, &v, sizeof v);
        if (st == ATAP_READY) {
            assert_int_equal(rc, 0);
            assert_true(v == mix(r));
        } else {
            assert_int_equal(rc, ATAP_ECANCELLED);
        }
        atap_release(t);
    }
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* ---- release racing the run ------------------------------------------------ */

static void test_races_release_vs_run(void **state)
{
    (void)state;
    size_t n = scaled(5000, 1000);
    atomic_store(&g_out_frees, 0);
    atomic_store(&g_arg_frees, 0);
    atap_spawn_opts o = {.out_size = 8, .out_free = count_out_free, .arg_free = count_arg_free};
    for (size_t i = 0; i < n; i++) {
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_mixed, (void *)(uintptr_t)i, &o), 0);
        if (i % 3 == 0)
            spin_for((unsigned)(i % 11) * 100u);
        atap_release(t); /* not a cancel: every task still runs */
    }
    assert_true(wait_live_back(ATAP_SEC(30)));
    assert_true(wait_atomic_at_least(&g_arg_frees, (int)n, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&g_out_frees, (int)n, ATAP_SEC(10)));
    sleep_ms(2);
    /* each output nobody took freed exactly once, each arg exactly once */
    assert_int_equal(atomic_load(&g_arg_frees), (int)n);
    assert_int_equal(atomic_load(&g_out_frees), (int)n);
}

/* ---- releases of dups racing the run's end, from other threads ---------- */

typedef struct release_arg {
    test_barrier *barrier;
    atap_task task;
} release_arg;

static void *release_thread(void *p)
{
    release_arg *a = p;
    barrier_wait(a->barrier);
    atap_release(a->task);
    return NULL;
}

static void test_races_last_release_from_threads(void **state)
{
    (void)state;
    enum { TH = 4 };
    size_t rounds = scaled(200, 50);
    atomic_store(&g_out_frees, 0);
    atomic_store(&g_arg_frees, 0);
    atap_spawn_opts o = {.out_size = 8, .out_free = count_out_free, .arg_free = count_arg_free};
    for (size_t r = 0; r < rounds; r++) {
        test_barrier barrier;
        barrier_init(&barrier, TH);
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_mixed, (void *)(uintptr_t)r, &o), 0);
        release_arg args[TH];
        args[0] = (release_arg){.barrier = &barrier, .task = t};
        for (int i = 1; i < TH; i++) {
            args[i].barrier = &barrier;
            assert_int_equal(atap_dup(t, &args[i].task), 0);
        }
        run_threads(TH, release_thread, args, sizeof args[0]);
        assert_int_equal(atap_try_join(t, NULL, 0), ATAP_ENOTASK);
    }
    assert_true(wait_live_back(ATAP_SEC(30)));
    assert_true(wait_atomic_at_least(&g_arg_frees, (int)rounds, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&g_out_frees, (int)rounds, ATAP_SEC(10)));
    sleep_ms(2);
    assert_int_equal(atomic_load(&g_arg_frees), (int)rounds);
    assert_int_equal(atomic_load(&g_out_frees), (int)rounds);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_races_cancel_vs_completion), T(test_races_cancel_from_thread_vs_join),
        T(test_races_many_joiners),         T(test_races_dup_release),
        T(test_races_spawn_from_threads),   T(test_races_take_vs_take),
        T(test_races_join_vs_take),         T(test_races_concurrent_cancels),
        T(test_races_release_vs_run),       T(test_races_last_release_from_threads),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * The slot table: handles, generations, stale and never-issued handles,
 * outputs of every size, destructors, trim and the stats it reports, and
 * the threads' stashes (their counts, a thread's stash after it exits).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "table.h"
#include "test_util.h"
#include "testing.h"

/* ---- helpers ------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every reader on a handle that names no task reads ATAP_ENOTASK and leaves
 * the caller's buffer alone. The calls that cannot block go first, so a
 * handle that wrongly still names a running task fails here instead of
 * waiting on it. Test thread only. */
static void assert_no_task(atap_task t)
{
    uint64_t v = 0xdeadbeefcafef00dull;
    assert_int_equal(atap_state_of(t), ATAP_FAILED);
    assert_true(atap_finished(t));
    assert_int_equal(atap_try_join(t, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_try_join(t, NULL, 0), ATAP_ENOTASK);
    atap_task copy = {.id = 77};
    assert_int_equal(atap_dup(t, &copy), ATAP_ENOTASK);
    assert_true(copy.id == ATAP_NO_TASK.id);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_MS(1)), ATAP_ENOTASK);
    assert_int_equal(atap_take_for(t, &v, sizeof v, ATAP_MS(1)), ATAP_ENOTASK);
    assert_int_equal(atap_cancel(t), ATAP_ENOTASK);
    /* the blocking ones */
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_take(t, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_join(t, NULL, 0), ATAP_ENOTASK);
    atap_state st = ATAP_READY;
    assert_int_equal(atap_wait(t, &st), ATAP_ENOTASK);
    assert_int_equal(atap_wait(t, NULL), ATAP_ENOTASK);
    assert_true(v == 0xdeadbeefcafef00dull);
}

/* ---- handles ------------------------------------------------------------ */

static void test_table_handles_distinct(void **state)
{
    (void)state;
    size_t n = scaled(4000, 100);
    atap_task *ts = calloc(n, sizeof *ts);
    uint64_t *ids = calloc(n, sizeof *ids);
    assert_non_null(ts);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++) {
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(i * 3 + 1));
        ids[i] = ts[i].id;
        assert_true(atap__task_gen(ts[i]) >= 1);
        assert_true(atap__task_gen(ts[i]) <= ATAP__GEN_MAX);
    }
    qsort(ids, n, sizeof *ids, cmp_u64);
    for (size_t i = 1; i < n; i++)
        assert_true(ids[i] != ids[i - 1]);
    /* and the live slot indexes too: two live tasks never share a slot */
    for (size_t i = 0; i < n; i++)
        ids[i] = atap__task_index(ts[i]);
    qsort(ids, n, sizeof *ids, cmp_u64);
    for (size_t i = 1; i < n; i++)
        assert_true(ids[i] != ids[i - 1]);
    for (size_t i = 0; i < n; i++) {
        assert_true(join8(ts[i]) == i * 3 + 1);
        atap_release(ts[i]);
    }
    free(ts);
    free(ids);
}

static void test_table_released_handle_enotask(void **state)
{
    (void)state;
    /* released after it settled */
    atap_task t = spawn8(task_value, (void *)(uintptr_t)11);
    assert_true(join8(t) == 11);
    atap_release(t);
    assert_no_task(t);
    atap_release(t); /* a second release of a dead handle is ignored */
    assert_no_task(t);

    /* released while still running: the run is not cancelled, but the
     * handle reads nothing from then on */
    gate *g = gate_new(12);
    atap_task r = spawn8(task_gated, g);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(20)));
    atap_release(r);
    assert_no_task(r);
    atomic_store(&g->open, 1);
    assert_true(wait_atomic_at_least(&g->ran, 1, ATAP_SEC(20)));
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_no_task(r);

    /* released while still queued behind the pool: it still runs once */
    blockers *bl = blockers_start();
    gate *q = gate_new(13);
    atomic_store(&q->open, 1);
    atap_task p = spawn8(task_gated, q);
    atap_release(p);
    assert_no_task(p);
    blockers_stop(bl);
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_int_equal(atomic_load(&q->ran), 1);
}

static void test_table_never_issued_enotask(void **state)
{
    (void)state;
    static const uint64_t ids[] = {
        0,
        0x7fffffff00001234ull,
        0xffffffffffffffffull,
        0x00000001fffffff0ull,
        0x0000000100000000ull | 0x00ffffffu,
        (uint64_t)ATAP__GEN_MAX << 32 | 5u,
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        atap_task t = {.id = ids[i]};
        assert_no_task(t);
        atap_release(t); /* ignored */
    }
    assert_no_task(ATAP_NO_TASK);
    atap_release(ATAP_NO_TASK);

    /* forged handles on a live slot (right index, wrong generation) read
     * nothing, and releasing them does not drop the real listener */
    gate *g = gate_new(4242);
    atap_task live = spawn8(task_gated, g);
    uint32_t idx = atap__task_index(live);
    uint32_t gen = atap__task_gen(live);
    uint64_t forged[3];
    size_t nf = 0;
    forged[nf++] = (uint64_t)(gen + 1u) << 32 | idx;
    forged[nf++] = (uint64_t)idx; /* generation 0 is never issued */
    if (gen > 1)
        forged[nf++] = (uint64_t)(gen - 1u) << 32 | idx;
    for (size_t i = 0; i < nf; i++) {
        atap_task f = {.id = forged[i]};
        assert_no_task(f); /* includes cancel: must not reach the live task */
        atap_release(f);
        atap_release(f);
    }
    assert_int_not_equal(atap_state_of(live), ATAP_CANCELLED);
    atomic_store(&g->open, 1);
    assert_true(join8(live) == 4242);
    assert_int_equal(atap_state_of(live), ATAP_READY);
    atap_release(live);
    assert_no_task(live);
}

/* An old handle whose slot index has been handed to a new task reads
 * ATAP_ENOTASK and never the new task's state or output. Every released
 * handle is kept as a stale one for its index, so whichever index comes back
 * (a slot freed by a worker may sit in that worker's stash for a while) is
 * checked while the new task is still pending. */
static void test_table_reused_slot_stale(void **state)
{
    (void)state;
    size_t cycles = scaled(1000, 100);
    size_t cap = pool_stats().slots + cycles + 4096;
    uint64_t *stale = calloc(cap, sizeof *stale);
    assert_non_null(stale);

    atap_task first = spawn8(task_value, (void *)(uintptr_t)111);
    assert_true(join8(first) == 111);
    assert_true(atap__task_index(first) < cap);
    stale[atap__task_index(first)] = first.id;
    atap_release(first);

    size_t reused = 0;
    for (size_t i = 0; i < cycles; i++) {
        gate *g = gate_new(5000 + i);
        atap_task u = spawn8(task_gated, g);
        uint32_t idx = atap__task_index(u);
        assert_true(idx < cap);
        atap_task old = {.id = stale[idx]};
        if (old.id != 0) {
            reused++;
            assert_true(u.id != old.id);
            assert_true(atap__task_gen(u) != atap__task_gen(old));
            /* u is still pending or running: the stale handle must not wait
             * for it, read it, cancel it or drop its listener */
            assert_no_task(old);
            atap_release(old);
            assert_false(atap_finished(u));
            assert_int_not_equal(atap_state_of(u), ATAP_CANCELLED);
        }
        atomic_store(&g->open, 1);
        assert_true(join8(u) == 5000 + i);
        assert_int_equal(atap_state_of(u), ATAP_READY);
        if (old.id != 0)
            assert_no_task(old);
        atap_release(u);
        stale[idx] = u.id;
    }
    print_message("%zu of %zu spawns reused a slot whose old handle was checked\n", reused, cycles);
    assert_true(reused > 0);
    free(stale);
}

/* Waits until a released slot is free again (its last run may still be
 * winding down on a worker), then sets its next generation. */
static void set_gen_when_free(uint32_t idx, uint32_t gen)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    int rc;
    while ((rc = atap__test_set_slot_gen(idx, gen)) != 0 && now_ns() < end)
        sleep_us(200);
    assert_int_equal(rc, 0);
}

static void test_table_generation_retired(void **state)
{
    (void)state;
    atap_task t = spawn8(task_value, (void *)(uintptr_t)1);
    assert_true(join8(t) == 1);
    uint32_t idx = atap__task_index(t);

    /* the hook refuses a live slot and an out-of-range generation */
    assert_int_equal(atap__test_set_slot_gen(idx, 5), ATAP_EINVAL);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atap__test_set_slot_gen(idx, ATAP__GEN_MAX + 1u), ATAP_EINVAL);
    set_gen_when_free(idx, ATAP__GEN_MAX - 1u);
    /* the slot may sit in a worker's stash of free slots: with the runtime
     * stopped, put every stash back on the shared list the main thread
     * allocates from */
    assert_int_equal(atap__test_flush_caches(), ATAP_EBUSY);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap__test_flush_caches(), 0);
    assert_int_equal(atap_init(NULL), 0);

    /* spawn until the index comes back (a LIFO free list gives it soon;
     * every free slot is handed out before the table grows) */
    size_t cap = pool_stats().slots + 64, n = 0;
    atap_task *held = calloc(cap, sizeof *held);
    assert_non_null(held);
    atap_task u = ATAP_NO_TASK;
    while (n < cap) {
        atap_task x = spawn8(task_value, (void *)(uintptr_t)(100 + n));
        if (atap__task_index(x) == idx) {
            u = x;
            break;
        }
        held[n++] = x;
    }
    assert_true(u.id != 0);
    assert_int_equal(atap__task_gen(u), ATAP__GEN_MAX);
    assert_true(join8(u) == 100 + n);
    assert_no_task(t);
    atap_release(u);
    assert_no_task(u);
    for (size_t i = 0; i < n; i++) {
        assert_true(join8(held[i]) == 100 + i);
        atap_release(held[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));

    /* the slot is retired: single spawn/release cycles never get it back */
    size_t cycles = scaled(1000, 200);
    for (size_t i = 0; i < cycles; i++) {
        atap_task x = spawn8(task_value, (void *)(uintptr_t)i);
        assert_int_not_equal(atap__task_index(x), idx);
        assert_true(join8(x) == i);
        atap_release(x);
    }
    /* nor does draining the whole free list: with every stash flushed back
     * to it, hold more tasks than the table has slots, so every free slot is
     * handed out once */
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap__test_flush_caches(), 0);
    assert_int_equal(atap_init(NULL), 0);
    size_t want = pool_stats().slots + 64;
    atap_task *many = calloc(want, sizeof *many);
    assert_non_null(many);
    for (size_t i = 0; i < want; i++) {
        many[i] = spawn8(task_value, (void *)(uintptr_t)i);
        assert_int_not_equal(atap__task_index(many[i]), idx);
    }
    for (size_t i = 0; i < want; i++) {
        assert_true(join8(many[i]) == i);
        atap_release(many[i]);
    }
    /* and the retired generation still reads nothing */
    assert_no_task(u);
    free(many);
    free(held);
}

/* ---- outputs -------------------------------------------------------------- */

static uint8_t pattern_byte(size_t size, size_t i)
{
    return (uint8_t)(i * 31u + size * 7u + (i >> 8));
}

static int task_pattern(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    size_t size = (size_t)(uintptr_t)arg;
    uint8_t *o = out;
    for (size_t i = 0; i < size; i++)
        o[i] = pattern_byte(size, i);
    return 0;
}

static bool pattern_ok(const uint8_t *buf, size_t size)
{
    for (size_t i = 0; i < size; i++)
        if (buf[i] != pattern_byte(size, i))
            return false;
    return true;
}

static void test_table_output_sizes(void **state)
{
    (void)state;
    static const size_t sizes[] = {
        1,   3,   7,   8,   9,   15,   16,   17,   24,   31,    32,
        33,  47,  48,  63,  64,  65,   100,  127,  128,  129,   200,
        255, 256, 257, 511, 512, 1000, 4095, 4096, 4097, 65536, (size_t)1 << 20};
    size_t n = sizeof sizes / sizeof sizes[0];
    atap_task ts[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], task_pattern, (void *)(uintptr_t)sizes[i],
                                    &(atap_spawn_opts){.out_size = sizes[i]}),
                         0);
    for (size_t i = 0; i < n; i++) {
        size_t sz = sizes[i];
        uint8_t *buf = malloc(sz + 16);
        assert_non_null(buf);
        memset(buf, 0xee, sz + 16);
        assert_int_equal(atap_join(ts[i], buf, sz), 0);
        assert_true(pattern_ok(buf, sz));
        for (size_t k = 0; k < 16; k++) /* nothing written past the size */
            assert_int_equal(buf[sz + k], 0xee);
        memset(buf, 0, sz);
        assert_int_equal(atap_join(ts[i], buf, sz), 0); /* it stays */
        assert_true(pattern_ok(buf, sz));
        memset(buf, 0, sz);
        assert_int_equal(atap_take(ts[i], buf, sz), 0);
        assert_true(pattern_ok(buf, sz));
        assert_int_equal(atap_join(ts[i], buf, sz), ATAP_ETAKEN);
        free(buf);
        atap_release(ts[i]);
    }
}

static void test_table_large_outputs(void **state)
{
    (void)state;
    static const size_t sizes[] = {4096, (size_t)1 << 20};
    for (size_t k = 0; k < 2; k++) {
        size_t sz = sizes[k];
        enum { N = 8 };
        atap_task ts[N];
        for (int i = 0; i < N; i++)
            assert_int_equal(atap_spawn(&ts[i], task_pattern, (void *)(uintptr_t)sz,
                                        &(atap_spawn_opts){.out_size = sz}),
                             0);
        uint8_t *buf = malloc(sz);
        assert_non_null(buf);
        for (int i = 0; i < N; i++) {
            memset(buf, 0, sz);
            assert_int_equal(atap_join(ts[i], buf, sz), 0);
            assert_true(pattern_ok(buf, sz));
            atap_release(ts[i]);
        }
        free(buf);
    }
}

static atomic_int g_zero_out_null;

static int task_zero_out(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    if (out == NULL)
        atomic_fetch_add(&g_zero_out_null, 1);
    return 0;
}

static void test_table_zero_size_output(void **state)
{
    (void)state;
    atomic_store(&g_zero_out_null, 0);
    atap_task a, b;
    assert_int_equal(atap_spawn(&a, task_zero_out, NULL, &(atap_spawn_opts){.out_size = 0}), 0);
    assert_int_equal(atap_spawn(&b, task_zero_out, NULL, NULL), 0);
    assert_int_equal(atap_join(a, NULL, 0), 0);
    assert_int_equal(atap_join(b, NULL, 0), 0);
    assert_int_equal(atomic_load(&g_zero_out_null), 2); /* out is NULL for size 0 */
    assert_int_equal(atap_try_join(a, NULL, 0), 0);
    assert_int_equal(atap_join_for(a, NULL, 0, ATAP_MS(10)), 0);
    uint64_t buf = 0x1111;
    assert_int_equal(atap_join(a, &buf, 0), 0); /* a buffer with size 0 is fine */
    assert_true(buf == 0x1111);
    assert_int_equal(atap_join(a, &buf, sizeof buf), ATAP_EINVAL);
    assert_true(buf == 0x1111);
    assert_int_equal(atap_state_of(a), ATAP_READY);
    assert_int_equal(atap_take(b, NULL, 0), 0);
    atap_release(a);
    atap_release(b);
}

/* ---- destructors ------------------------------------------------------- */

static atomic_int g_out_free_calls;
static atomic_uint_fast64_t g_out_free_seen;
static atomic_int g_arg_free_calls;
static atomic_int g_arg_free_bad;
static atomic_int g_fn_ran;

static void reset_destructor_counts(void)
{
    atomic_store(&g_out_free_calls, 0);
    atomic_store(&g_out_free_seen, 0);
    atomic_store(&g_arg_free_calls, 0);
    atomic_store(&g_arg_free_bad, 0);
    atomic_store(&g_fn_ran, 0);
}

static void count_out_free(void *out)
{
    uint64_t v;
    memcpy(&v, out, sizeof v);
    atomic_store(&g_out_free_seen, v);
    atomic_fetch_add(&g_out_free_calls, 1);
}

#define ARG_MAGIC ((uintptr_t)0xa11ce)

static void count_arg_free(void *arg)
{
    if ((uintptr_t)arg != ARG_MAGIC)
        atomic_fetch_add(&g_arg_free_bad, 1);
    atomic_fetch_add(&g_arg_free_calls, 1);
}

static int task_destructed(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    atomic_fetch_add(&g_fn_ran, 1);
    uint64_t v = 0x5eed;
    memcpy(out, &v, sizeof v);
    return 0;
}

static const atap_spawn_opts destructed_opts = {
    .out_size = sizeof(uint64_t),
    .out_free = count_out_free,
    .arg_free = count_arg_free,
};

/* Lets anything asynchronous settle: every task gone from the table. */
static void settle(void)
{
    assert_true(wait_live_back(ATAP_SEC(20)));
    /* a few more tasks through the pool, for good measure */
    for (int i = 0; i < 8; i++) {
        atap_task x = spawn8(task_value, (void *)(uintptr_t)i);
        assert_true(join8(x) == (uint64_t)i);
        atap_release(x);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static void test_table_out_free_untaken_once(void **state)
{
    (void)state;
    reset_destructor_counts();
    atap_task t, d;
    assert_int_equal(atap_spawn(&t, task_destructed, (void *)ARG_MAGIC, &destructed_opts), 0);
    uint64_t v = 0;
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    assert_true(v == 0x5eed);
    assert_int_equal(atap_dup(t, &d), 0);
    atap_release(t);
    /* one listener left: nothing freed yet */
    assert_int_equal(atomic_load(&g_out_free_calls), 0);
    assert_int_equal(atomic_load(&g_arg_free_calls), 0);
    assert_int_equal(atap_join(d, &v, sizeof v), 0);
    atap_release(d);
    assert_true(wait_atomic_at_least(&g_out_free_calls, 1, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&g_arg_free_calls, 1, ATAP_SEC(10)));
    settle();
    assert_int_equal(atomic_load(&g_out_free_calls), 1);
    assert_true(atomic_load(&g_out_free_seen) == 0x5eed);
    assert_int_equal(atomic_load(&g_arg_free_calls), 1);
    assert_int_equal(atomic_load(&g_arg_free_bad), 0);
    assert_int_equal(atomic_load(&g_fn_ran), 1);
}

static void test_table_out_free_never_when_taken(void **state)
{
    (void)state;
    reset_destructor_counts();
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_destructed, (void *)ARG_MAGIC, &destructed_opts), 0);
    uint64_t v = 0;
    assert_int_equal(atap_take(t, &v, sizeof v), 0);
    assert_true(v == 0x5eed);
    atap_release(t);
    assert_true(wait_atomic_at_least(&g_arg_free_calls, 1, ATAP_SEC(10)));
    settle();
    assert_int_equal(atomic_load(&g_out_free_calls), 0);
    assert_int_equal(atomic_load(&g_arg_free_calls), 1);
    assert_int_equal(atomic_load(&g_arg_free_bad), 0);
}

static atomic_int g_any_arg_free_calls;

static void count_any_arg_free(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_any_arg_free_calls, 1);
}

static void test_table_arg_free_released_while_running(void **state)
{
    (void)state;
    atomic_store(&g_any_arg_free_calls, 0);
    /* released while it runs: arg_free waits for the run to end (the task
     * still uses its arg) */
    gate *g = gate_new(3);
    atap_task t;
    atap_spawn_opts o = {.out_size = 8, .arg_free = count_any_arg_free};
    assert_int_equal(atap_spawn(&t, task_gated, g, &o), 0);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(20)));
    atap_release(t);
    sleep_ms(5); /* a window for a premature arg_free */
    assert_int_equal(atomic_load(&g_any_arg_free_calls), 0);
    assert_int_equal(atomic_load(&g->ran), 0);
    atomic_store(&g->open, 1);
    assert_true(wait_atomic_at_least(&g_any_arg_free_calls, 1, ATAP_SEC(10)));
    settle();
    assert_int_equal(atomic_load(&g_any_arg_free_calls), 1);
    assert_int_equal(atomic_load(&g->ran), 1);
}

static void test_table_arg_free_cancelled_before_run(void **state)
{
    (void)state;
    reset_destructor_counts();
    blockers *bl = blockers_start();
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_destructed, (void *)ARG_MAGIC, &destructed_opts), 0);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
    uint64_t v = 0;
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ECANCELLED);
    atap_release(t);
    blockers_stop(bl);
    assert_true(wait_atomic_at_least(&g_arg_free_calls, 1, ATAP_SEC(10)));
    settle();
    assert_int_equal(atomic_load(&g_fn_ran), 0);
    assert_int_equal(atomic_load(&g_arg_free_calls), 1);
    assert_int_equal(atomic_load(&g_arg_free_bad), 0);
    /* no output was ever written, so there is none to free */
    assert_int_equal(atomic_load(&g_out_free_calls), 0);
}

static void test_table_arg_free_not_on_failed_spawn(void **state)
{
    (void)state;
    reset_destructor_counts();
    atap_task t = {.id = 5};
    atap_spawn_opts o = destructed_opts;
    o.priority = 1000;
    assert_int_equal(atap_spawn(&t, task_destructed, (void *)ARG_MAGIC, &o), ATAP_EINVAL);
    assert_true(t.id == 0);
    assert_int_equal(atap_spawn(&t, NULL, (void *)ARG_MAGIC, &destructed_opts), ATAP_EINVAL);
    assert_true(t.id == 0);
    settle();
    assert_int_equal(atomic_load(&g_arg_free_calls), 0);
    assert_int_equal(atomic_load(&g_fn_ran), 0);
}

/* ---- stats and trim ---------------------------------------------------- */

static void test_table_live_counts(void **state)
{
    (void)state;
    assert_true(wait_live_back(ATAP_SEC(20)));
    struct atap_pool_stats s0 = pool_stats();
    assert_int_equal(s0.live, g_live_base);
    enum { N = 100 };
    gate *g = gate_new(8);
    atap_task ts[N];
    for (int i = 0; i < N; i++)
        ts[i] = spawn8(task_gated, g);
    struct atap_pool_stats s1 = pool_stats();
    assert_int_equal(s1.live, g_live_base + N);
    assert_true(s1.slots >= N);
    assert_true(s1.peak_slots >= s1.slots);
    /* released but not finished: they still hold their slots */
    for (int i = 0; i < N / 2; i++)
        atap_release(ts[i]);
    assert_int_equal(pool_stats().live, g_live_base + N);
    atomic_store(&g->open, 1);
    for (int i = N / 2; i < N; i++) {
        assert_true(join8(ts[i]) == 8);
    }
    assert_true(wait_live_at_most(g_live_base + N / 2, ATAP_SEC(20)));
    assert_int_equal(pool_stats().live, g_live_base + N / 2);
    for (int i = N / 2; i < N; i++)
        atap_release(ts[i]);
    assert_true(wait_live_back(ATAP_SEC(20)));
    struct atap_pool_stats s2 = pool_stats();
    assert_int_equal(s2.live, g_live_base);
    assert_true(s2.peak_slots >= s1.peak_slots);
    /* completed is counted a moment after a run's slot can be freed, so it
     * may trail live: it gets there, though */
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().completed < s0.completed + N && now_ns() < end)
        sleep_us(200);
    assert_true(pool_stats().completed >= s0.completed + N);
}

static void test_table_trim(void **state)
{
    (void)state;
    size_t n = env_size("ATAP_TEST_TRIM_N", 200000);
    enum { KEEP = 16 };
    atap_task *ts = calloc(n, sizeof *ts);
    assert_non_null(ts);
    assert_true(wait_live_back(ATAP_SEC(20)));
    for (size_t i = 0; i < n; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)i);
    struct atap_pool_stats s0 = pool_stats();
    assert_int_equal(s0.live, g_live_base + n);
    assert_true(s0.slots >= n);
    assert_true(s0.peak_slots >= n);
    /* keep the first few: low slots, which trim must leave readable */
    for (size_t i = 0; i < n; i++) {
        if (i < KEEP) {
            assert_true(join8(ts[i]) == i);
            continue;
        }
        atap_release(ts[i]);
    }
    assert_true(wait_live_at_most(g_live_base + KEEP, ATAP_SEC(120)));
    struct atap_pool_stats s1 = pool_stats();
    assert_int_equal(s1.live, g_live_base + KEEP);

    long page = sysconf(_SC_PAGESIZE);
    size_t released = 0;
    int first = atap_trim(&released);
    struct atap_pool_stats s2;
    if (first == ATAP_EBUSY) {
        /* The pool's own trim (every ~5 s while every worker idles) got
         * there first, or is running now: the top goes all the same, once
         * that trim is through (a stalled machine may hold it up a while). */
        uint64_t end = now_ns() + ATAP_SEC(10) * test_slack();
        while ((s2 = pool_stats()).slots >= s0.slots && now_ns() < end)
            sleep_ms(10);
        assert_true(s2.slots < s0.slots);
    } else {
        assert_int_equal(first, 0);
        assert_true(released > 0);
        assert_true(released % (size_t)page == 0);
        s2 = pool_stats();
        assert_true(s2.slots < s1.slots);
    }
    assert_true(s2.slots >= 100);
    assert_true(s2.slots >= s2.live);
    assert_true(s2.peak_slots >= s1.peak_slots); /* never falls */

    /* trim again until nothing is left worth giving back; it then says so,
     * and keeps saying so */
    int rc = 0;
    size_t prev_slots = s2.slots;
    int trims = 0;
    for (int i = 0; i < 64 && rc == 0; i++) {
        released = 0;
        rc = atap_trim(&released);
        if (rc == 0) {
            trims++;
            assert_true(released > 0);
            struct atap_pool_stats s = pool_stats();
            assert_true(s.slots < prev_slots);
            assert_true(s.peak_slots >= s1.peak_slots);
            prev_slots = s.slots;
        }
    }
    assert_int_equal(rc, ATAP_EBUSY);
    print_message("trim: %zu slots -> %zu after the first trim -> %zu when EBUSY (%d more trims)\n",
                  s1.slots, s2.slots, prev_slots, trims);
    assert_int_equal(atap_trim(NULL), ATAP_EBUSY);
    assert_int_equal(atap_trim(&released), ATAP_EBUSY);
    struct atap_pool_stats s3 = pool_stats();
    assert_true(s3.peak_slots >= s1.peak_slots);
    assert_true(s3.slots >= 100);

    /* the kept tasks still read their outputs */
    for (size_t i = 0; i < KEEP; i++) {
        assert_true(join8(ts[i]) == i);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));

    /* the table grows again and everything reads right */
    size_t m = scaled(20000, 1000);
    if (m > n)
        m = n;
    for (size_t i = 0; i < m; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(i * 7));
    for (size_t i = 0; i < m; i++) {
        assert_true(join8(ts[i]) == i * 7);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_true(pool_stats().peak_slots >= s1.peak_slots);
    free(ts);
}

/* The same, made certain: the table's top slot is freed by the worker that
 * ran it (its task was released while still running). That slot being free
 * must not stop a trim from giving back the free run below it. */
static void test_table_trim_top_freed_by_worker(void **state)
{
    (void)state;
    assert_true(wait_live_back(ATAP_SEC(20)));
    /* more than the free list holds, so the last spawns grow the table */
    size_t n = pool_stats().slots + scaled(50000, 20000);
    atap_task *ts = calloc(n, sizeof *ts);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)i);
    gate *g = gate_new(99);
    atap_task top = spawn8(task_gated, g);
    struct atap_pool_stats s0 = pool_stats();
    assert_int_equal(atap__task_index(top), s0.slots - 1);
    for (size_t i = 0; i < n; i++)
        atap_release(ts[i]);
    free(ts);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(20)));
    atap_release(top); /* the worker drops the last reference */
    atomic_store(&g->open, 1);
    assert_true(wait_live_back(ATAP_SEC(60)));
    assert_int_equal(atomic_load(&g->ran), 1);

    size_t released = 0;
    int rc = atap_trim(&released);
    if (rc != 0)
        fail_msg("atap_trim: %s with %zu of %zu slots free (top slot freed by a worker)",
                 atap_strerror(rc), s0.slots - pool_stats().live, s0.slots);
    assert_true(released > 0);
    assert_true(pool_stats().slots < s0.slots);
    for (int i = 0; i < 64 && atap_trim(NULL) == 0; i++) {
    }
    assert_int_equal(atap_trim(NULL), ATAP_EBUSY);
}

/* Two stashes of the test's own, registered in this order (so a live count
 * reads x before y), and a hook that runs between the reads: a slot taken
 * through x and given back through y, as a task spawned on one thread and
 * released last on another is. */
static struct slot_cache scan_x, scan_y;
static pthread_t scan_thread;
static int scan_hooks;

static void take_on_x_free_on_y(void)
{
    uint32_t index, gen;

    if (!pthread_equal(pthread_self(), scan_thread))
        return;
    scan_hooks++;
    if (atap__table_alloc(&scan_x, &index, &gen) == 0)
        atap__table_free(&scan_y, index, gen);
}

/* A live count never reads fewer tasks than live, whatever is allocated
 * and freed through other stashes while it reads (read allocations first,
 * one short for each hook between x and y). No runtime: nothing else moves
 * the counts meanwhile. */
static void test_table_live_never_short(void **state)
{
    uint32_t held, held_gen;

    (void)state;
    scan_thread = pthread_self();
    atap__table_register_cache(&scan_x);
    atap__table_register_cache(&scan_y);
    assert_int_equal(atap__table_alloc(&scan_x, &held, &held_gen), 0);
    size_t before = atap__table_live();
    assert_true(before >= 1);
    assert_int_equal(atap__test_on(ATAP__TEST_LIVE_SCAN, take_on_x_free_on_y), 0);
    size_t during = atap__table_live();
    assert_int_equal(atap__test_on(ATAP__TEST_LIVE_SCAN, NULL), 0);
    assert_true(scan_hooks >= 2);
    if (during < before)
        fail_msg("live read %zu with %zu tasks live", during, before);
    assert_int_equal(atap__table_live(), before);
    atap__table_free(&scan_x, held, held_gen);
    assert_int_equal(atap__table_live(), before - 1);
    assert_int_equal(atap__test_flush_caches(), 0);
}

/* A thread's stash after its exit. A destructor of a key made after the
 * thread's first spawn runs after the table's own has handed the stash on,
 * and spawns and releases while another thread, the next to take a stash,
 * does the same. The two never share a stash (one writer each), and each
 * gets its own slots and outputs. */
struct late {
    pthread_key_t key;
    atomic_int handed_on, next_has_one, stop, bad, rounds[2];
    struct slot_cache *next_stash, *late_stash; /* each thread's, once it has one */
};

static struct late *late_g;

static int echo_arg(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    memcpy(out, &arg, sizeof arg);
    return 0;
}

static void late_churn(struct late *l, uintptr_t tag)
{
    atap_spawn_opts o = {.out_size = sizeof(void *)};

    for (uintptr_t i = 1; !atomic_load(&l->stop); i++) {
        void *want = (void *)(tag << 40 | i), *out = NULL;
        atap_task t;

        if (atap_spawn(&t, echo_arg, want, &o) != 0 ||
            atap_join_for(t, &out, sizeof out, ATAP_SEC(10)) != 0 || out != want)
            atomic_fetch_add(&l->bad, 1);
        atap_release(t);
        atomic_fetch_add(&l->rounds[tag - 1], 1);
    }
}

static void late_destructor(void *v)
{
    (void)v;
    atomic_store(&late_g->handed_on, 1);
    while (!atomic_load(&late_g->next_has_one))
        sleep_us(50);
    late_g->late_stash = atap__table_outside_cache();
    late_churn(late_g, 1);
}

static void *late_first(void *arg)
{
    struct late *l = arg;
    atap_task t;

    if (atap_spawn(&t, echo_arg, NULL, &(atap_spawn_opts){.out_size = sizeof(void *)}) != 0)
        atomic_fetch_add(&l->bad, 1);
    atap_release(t); /* this thread has a stash now */
    if (pthread_key_create(&l->key, late_destructor) != 0 || pthread_setspecific(l->key, l) != 0)
        atomic_fetch_add(&l->bad, 1000);
    return NULL;
}

static void *late_next(void *arg)
{
    struct late *l = arg;

    while (!atomic_load(&l->handed_on))
        sleep_us(50);
    l->next_stash = atap__table_outside_cache(); /* the stash just handed on */
    atomic_store(&l->next_has_one, 1);
    late_churn(l, 2);
    return NULL;
}

static void test_table_stash_after_thread_exit(void **state)
{
    static struct late l;
    pthread_t first, next;

    (void)state;
    memset(&l, 0, sizeof l);
    late_g = &l;
    assert_int_equal(pthread_create(&first, NULL, late_first, &l), 0);
    assert_int_equal(pthread_create(&next, NULL, late_next, &l), 0);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while ((atomic_load(&l.rounds[0]) < 2000 || atomic_load(&l.rounds[1]) < 2000) && now_ns() < end)
        sleep_us(1000);
    atomic_store(&l.stop, 1);
    assert_int_equal(pthread_join(first, NULL), 0);
    assert_int_equal(pthread_join(next, NULL), 0);
    pthread_key_delete(l.key);
    assert_non_null(l.next_stash);
    assert_true(l.late_stash != l.next_stash); /* one owner each */
    assert_int_equal(atomic_load(&l.bad), 0);
    assert_true(atomic_load(&l.rounds[0]) >= 2000 && atomic_load(&l.rounds[1]) >= 2000);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_table_handles_distinct),
        T(test_table_released_handle_enotask),
        T(test_table_never_issued_enotask),
        T(test_table_reused_slot_stale),
        T(test_table_generation_retired),
        T(test_table_output_sizes),
        T(test_table_large_outputs),
        T(test_table_zero_size_output),
        T(test_table_out_free_untaken_once),
        T(test_table_out_free_never_when_taken),
        T(test_table_arg_free_released_while_running),
        T(test_table_arg_free_cancelled_before_run),
        T(test_table_arg_free_not_on_failed_spawn),
        T(test_table_live_counts),
        T(test_table_trim),
        T(test_table_trim_top_freed_by_worker),
        T(test_table_stash_after_thread_exit),
        cmocka_unit_test(test_table_live_never_short),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

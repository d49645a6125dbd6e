/*
 * The million-live memory test: 1,000,000 settled tasks with an 8-byte
 * output, all held by their handles, cost under 96 MiB of resident memory:
 * a slot is 64 bytes, and nothing else is allocated for such a task (the
 * bound leaves room for the table's growth and the stashes; bench/'s
 * live_memory measures the figure).
 *
 * ATAP_TEST_MILLION overrides the count (the bound scales with it, with a
 * 64 MiB floor for small counts). The bound holds under ASan (measured: the
 * table's own pages, ~65 bytes a task; ASan shadows malloc, not the mmap'd
 * table). Under TSan it does not: TSan's shadow for every word the table
 * touches lands in RSS too (measured ~1.1 KiB a task), so there the growth
 * is reported but not asserted; the test still runs.
 *
 * And tasks waiting in a queue hold no output block (their output's memory
 * comes at their first run), and delayed starts no schedule.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <malloc.h>

#include "test_util.h"

#if defined(TEST_TSAN) || defined(TEST_MSAN)
#define MEMORY_BOUND_CHECKED 0
#else
#define MEMORY_BOUND_CHECKED 1
#endif

static size_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long size = 0, resident = 0;
    int got = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    assert_int_equal(got, 2);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void test_memory_million_live(void **state)
{
    (void)state;
    size_t n = env_size("ATAP_TEST_MILLION", 1000000);
    size_t bound = (size_t)((double)(96u << 20) * (double)n / 1e6);
    if (bound < (64u << 20))
        bound = 64u << 20;

    /* the handles are the caller's memory, not the runtime's: touch them
     * before the first reading */
    atap_task *ts = malloc(n * sizeof *ts);
    assert_non_null(ts);
    memset(ts, 0xff, n * sizeof *ts);
    assert_true(wait_live_back(ATAP_SEC(20)));
    size_t before = resident_bytes();
    uint64_t t0 = now_ns();

    for (size_t i = 0; i < n; i++) {
        int rc = atap_spawn(&ts[i], task_value, (void *)(uintptr_t)i,
                            &(atap_spawn_opts){.out_size = sizeof(uint64_t)});
        if (rc != 0)
            fail_msg("spawn %zu of %zu: %s", i, n, atap_strerror(rc));
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        int rc = atap_join(ts[i], &v, sizeof v);
        if (rc != 0 || v != i)
            fail_msg("join %zu: rc %d value %llu", i, rc, (unsigned long long)v);
    }
    uint64_t t1 = now_ns();
    size_t after = resident_bytes();
    struct atap_pool_stats s = pool_stats();
    assert_int_equal(s.live, g_live_base + n);
    assert_true(s.slots >= n);
    assert_true(s.peak_slots >= n);

    size_t growth = after > before ? after - before : 0;
    print_message("%zu live tasks: resident +%zu bytes (%.1f bytes/task), bound %zu%s; "
                  "spawn+join %.2f s\n",
                  n, growth, (double)growth / (double)n, bound,
                  MEMORY_BOUND_CHECKED ? "" : " (not checked under TSan)", (double)(t1 - t0) / 1e9);
#if MEMORY_BOUND_CHECKED
    assert_true(growth < bound);
#endif

    /* every handle still reads its own output */
    for (size_t i = 0; i < n; i += 997) {
        uint64_t v = 0;
        assert_int_equal(atap_try_join(ts[i], &v, sizeof v), 0);
        assert_true(v == i);
    }
    for (size_t i = 0; i < n; i++)
        atap_release(ts[i]);
    assert_true(wait_live_back(ATAP_SEC(120)));
    assert_int_equal(pool_stats().live, g_live_base);
    free(ts);
}

/* Tasks waiting in a queue hold no output block: 20,000 spawned with a
 * 48-byte output (over the slot's 16 inline bytes) while every worker is
 * held add under 8 bytes each to the allocator's count (a block would be
 * 64), and each then runs and reads its own 48 bytes. */
enum { QUEUED = 20000, OUT48 = 48 };

/* arg = size << 24 | i: fills the size-byte output with i's low byte. */
static void *fill_arg(size_t size, uintptr_t i) { return (void *)((uintptr_t)size << 24 | i); }

static int task_fills(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    memset(out, (int)((uintptr_t)arg & 0xff), (uintptr_t)arg >> 24);
    return 0;
}

/* Joins and releases ts[0..n), each having filled its size bytes. */
static void read_back(atap_task *ts, uintptr_t n, size_t size)
{
    for (uintptr_t i = 0; i < n; i++) {
        unsigned char out[64], want[64];
        assert_true(size <= sizeof out);
        memset(want, (int)(i & 0xff), size);
        assert_int_equal(atap_join(ts[i], out, size), 0);
        assert_memory_equal(out, want, size);
        atap_release(ts[i]);
    }
}

static void test_memory_queued_outputs_hold_no_block(void **state)
{
    (void)state;
    if (mallinfo2().uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    atap_task *ts = malloc(QUEUED * sizeof *ts);
    assert_non_null(ts);
    blockers *b = blockers_start();
    size_t before = mallinfo2().uordblks;
    for (uintptr_t i = 0; i < QUEUED; i++)
        assert_int_equal(atap_spawn(&ts[i], task_fills, fill_arg(OUT48, i),
                                    &(atap_spawn_opts){.out_size = OUT48}),
                         0);
    size_t after = mallinfo2().uordblks;
    blockers_stop(b);
    read_back(ts, QUEUED, OUT48);
    free(ts);
    print_message("%d queued tasks with %d-byte outputs: allocator +%zd bytes\n", QUEUED, OUT48,
                  (ssize_t)(after - before));
    assert_true(after < before + (size_t)QUEUED * 8);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* A three-word output stays in its slot, over the arg's field (slot.h):
 * 20,000 tasks whose 24-byte outputs stand unread add under 8 bytes each
 * to the allocator's count (a block of its own would be 32), and each
 * reads its own 24 bytes back. */
enum { OUT24 = 24 };

static void test_memory_three_word_outputs_stay_in_the_slot(void **state)
{
    (void)state;
    if (mallinfo2().uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    atap_task *ts = malloc(QUEUED * sizeof *ts);
    assert_non_null(ts);
    size_t before = mallinfo2().uordblks;
    for (uintptr_t i = 0; i < QUEUED; i++)
        assert_int_equal(atap_spawn(&ts[i], task_fills, fill_arg(OUT24, i),
                                    &(atap_spawn_opts){.out_size = OUT24}),
                         0);
    for (uintptr_t i = 0; i < QUEUED; i++)
        assert_int_equal(atap_wait(ts[i], NULL), 0);
    size_t after = mallinfo2().uordblks;
    read_back(ts, QUEUED, OUT24);
    free(ts);
    print_message("%d settled tasks with %d-byte outputs: allocator +%zd bytes\n", QUEUED, OUT24,
                  (ssize_t)(after - before));
    assert_true(after < before + (size_t)QUEUED * 8);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* Delayed starts wait in their slots: 20,000 tasks spawned with a 60 s
 * after_ns and no output add under 8 bytes each to the allocator's count (a
 * schedule of their own would be hundreds), and cancelled they read
 * ATAP_ECANCELLED, never run, and their slots go at once, not at their
 * deadline. 2,000 more with 20-40 ms delays each run once, never early. */
enum { DELAYED = 20000, DELAYED_RUN = 2000 };

struct delayed_run {
    atomic_int runs, early;
    uint64_t due[DELAYED_RUN];
};

static int task_counts_run(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

static struct delayed_run *g_delayed;

static int task_notes_start(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uintptr_t i = (uintptr_t)arg;
    if (now_ns() < g_delayed->due[i])
        atomic_fetch_add(&g_delayed->early, 1);
    atomic_fetch_add(&g_delayed->runs, 1);
    return 0;
}

/* DELAYED_RUN tasks (ts has room) with 20-40 ms delays and arg_free (may
 * be NULL): each runs once, never early. */
static void run_delayed(atap_task *ts, void (*arg_free)(void *))
{
    g_delayed = calloc(1, sizeof *g_delayed);
    assert_non_null(g_delayed);
    for (uintptr_t i = 0; i < DELAYED_RUN; i++) {
        uint64_t delay = ATAP_MS(20) + i % 21 * ATAP_MS(1);
        g_delayed->due[i] = now_ns() + delay;
        assert_int_equal(atap_spawn(&ts[i], task_notes_start, (void *)i,
                                    &(atap_spawn_opts){.after_ns = delay, .arg_free = arg_free}),
                         0);
    }
    for (int i = 0; i < DELAYED_RUN; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(atomic_load(&g_delayed->runs), DELAYED_RUN);
    assert_int_equal(atomic_load(&g_delayed->early), 0);
    free(g_delayed);
}

static void test_memory_delays_wait_in_their_slots(void **state)
{
    (void)state;
    if (mallinfo2().uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    atomic_int runs = 0;
    atap_task *ts = malloc(DELAYED * sizeof *ts);
    assert_non_null(ts);
    size_t before = mallinfo2().uordblks;
    for (int i = 0; i < DELAYED; i++)
        assert_int_equal(atap_spawn(&ts[i], task_counts_run, &runs,
                                    &(atap_spawn_opts){.after_ns = ATAP_SEC(60)}),
                         0);
    size_t after = mallinfo2().uordblks;
    assert_int_equal(atap_state_of(ts[0]), ATAP_PENDING);
    for (int i = 0; i < DELAYED; i++)
        assert_int_equal(atap_cancel(ts[i]), 0);
    for (int i = 0; i < DELAYED; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), ATAP_ECANCELLED);
        atap_release(ts[i]);
    }
    print_message("%d delayed starts: allocator +%zd bytes\n", DELAYED, (ssize_t)(after - before));
    assert_true(after < before + (size_t)DELAYED * 8);
    assert_true(wait_live_back(ATAP_SEC(10))); /* not at their deadline, 60 s out */
    assert_int_equal(atomic_load(&runs), 0);

    run_delayed(ts, NULL);
    free(ts);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A delayed start with destructors waits in its slot too: 20,000 spawned
 * with a 60 s after_ns, an 8-byte output, arg_free and out_free add under
 * 128 bytes each to the allocator's count (the side record that keeps the
 * destructors; a schedule of their own would be 384 more), and cancelled,
 * each arg_free runs once and no out_free (no output was made). 2,000 more
 * with 20-40 ms delays each run once, never early, then let their arg go. */
static atomic_int g_delay_arg_frees, g_delay_out_frees;

static void delay_arg_free(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_delay_arg_frees, 1);
}

static void delay_out_free(void *out)
{
    (void)out;
    atomic_fetch_add(&g_delay_out_frees, 1);
}

static void test_memory_delays_with_destructors_wait_in_their_slots(void **state)
{
    (void)state;
    bool counted = mallinfo2().uordblks != 0; /* none kept by a sanitizer's allocator */
    atomic_int runs = 0;
    atap_task *ts = malloc(DELAYED * sizeof *ts);
    assert_non_null(ts);
    atomic_store(&g_delay_arg_frees, 0);
    atomic_store(&g_delay_out_frees, 0);
    atap_spawn_opts o = {.after_ns = ATAP_SEC(60),
                         .out_size = 8,
                         .arg_free = delay_arg_free,
                         .out_free = delay_out_free};
    size_t before = mallinfo2().uordblks;
    for (int i = 0; i < DELAYED; i++)
        assert_int_equal(atap_spawn(&ts[i], task_counts_run, &runs, &o), 0);
    size_t after = mallinfo2().uordblks;
    assert_int_equal(atap_state_of(ts[0]), ATAP_PENDING);
    for (int i = 0; i < DELAYED; i++)
        assert_int_equal(atap_cancel(ts[i]), 0);
    for (int i = 0; i < DELAYED; i++) {
        uint64_t v;
        assert_int_equal(atap_join(ts[i], &v, sizeof v), ATAP_ECANCELLED);
        atap_release(ts[i]);
    }
    print_message("%d delayed starts with destructors: allocator +%zd bytes\n", DELAYED,
                  (ssize_t)(after - before));
    assert_true(!counted || after < before + (size_t)DELAYED * 128);
    assert_true(wait_live_back(ATAP_SEC(10))); /* not at their deadline, 60 s out */
    assert_int_equal(atomic_load(&runs), 0);
    assert_int_equal(atomic_load(&g_delay_arg_frees), DELAYED);
    assert_int_equal(atomic_load(&g_delay_out_frees), 0);

    atomic_store(&g_delay_arg_frees, 0);
    run_delayed(ts, delay_arg_free);
    free(ts);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&g_delay_arg_frees), DELAYED_RUN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_memory_million_live, setup_runtime, teardown_runtime),
        cmocka_unit_test_setup_teardown(test_memory_queued_outputs_hold_no_block, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_memory_three_word_outputs_stay_in_the_slot,
                                        setup_runtime, teardown_runtime),
        cmocka_unit_test_setup_teardown(test_memory_delays_with_destructors_wait_in_their_slots,
                                        setup_runtime, teardown_runtime),
        cmocka_unit_test_setup_teardown(test_memory_delays_wait_in_their_slots, setup_runtime,
                                        teardown_runtime),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

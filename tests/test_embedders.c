/*
 * Several users of libatap in one process (two libraries and the
 * application, say): atap_init and atap_shutdown nest. Each successful
 * init is one user, each shutdown lets one go, and the runtime stops at the
 * last. A user's spawns never meet a runtime another user stopped, in any
 * order of starts and stops, with tasks running throughout, and from
 * threads that start and stop at once, over and over.
 *
 * Each test leaves the runtime stopped with no users; the teardown shuts
 * down as often as needed if one failed half way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "test_util.h"

static int ensure_stopped(void **state)
{
    (void)state;
    atomic_store(&g_release_all, 1);
    for (int i = 0; i < 64 && atap_initialised(); i++)
        if (atap_shutdown() != 0)
            break;
    atomic_store(&g_release_all, 0);
    return atap_initialised() ? -1 : 0;
}

/* ---- tasks ----------------------------------------------------------------- */

/* Sleeps arg microseconds in the kernel (a wait a cancel would end), then
 * publishes arg. */
static int task_nap(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t us = (uint64_t)(uintptr_t)arg;
    atap_sleep_relaxed(ATAP_US(us));
    memcpy(out, &us, sizeof us);
    return 0;
}

/* Spawns a child from inside the pool and joins it: arg + 1. */
static int task_parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atap_task c;
    uint64_t v = 0;

    if (atap_spawn(&c, task_value, arg, &(atap_spawn_opts){.out_size = 8}) != 0)
        return ATAP_EFAILED;
    int rc = atap_join(c, &v, sizeof v);
    atap_release(c);
    if (rc != 0)
        return rc;
    v++;
    memcpy(out, &v, sizeof v);
    return 0;
}

/* Parks once for a millisecond, then publishes arg. */
static int task_park_once(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t v = (uint64_t)(uintptr_t)arg;

    if (!atap_resumed(ctx)) {
        if (atap_park_until(ctx, atap_now() + ATAP_MS(1)) != 0)
            return ATAP_EFAILED;
        return ATAP_PARKED;
    }
    memcpy(out, &v, sizeof v);
    return 0;
}

/* One round of a user's work: tasks of every kind, each joined and checked.
 * Returns the number of things that went wrong. */
static int user_round(unsigned seed)
{
    enum { K = 6 };
    atap_task ts[K];
    uint64_t want[K];
    int bad = 0;

    for (int i = 0; i < K; i++) {
        uint64_t x = (uint64_t)(seed * 16u + (unsigned)i);
        atap_spawn_opts o = {.out_size = 8};
        atap_fn *fn = task_value;
        int rc;

        want[i] = x;
        switch (i) {
        case 1:
            fn = task_parent;
            want[i] = x + 1;
            break;
        case 2:
            o.blocking = true;
            break;
        case 3:
            fn = task_park_once;
            break;
        case 4:
            o.after_ns = ATAP_US(200);
            break;
        case 5:
            fn = task_nap;
            x = want[i] = 50 + seed % 200;
            break;
        default:
            break;
        }
        if ((rc = atap_spawn(&ts[i], fn, (void *)(uintptr_t)x, &o)) != 0) {
            bad++;
            ts[i] = ATAP_NO_TASK;
        }
    }
    for (int i = 0; i < K; i++) {
        uint64_t v = 0;
        if (ts[i].id == 0)
            continue;
        if (atap_join(ts[i], &v, sizeof v) != 0 || v != want[i])
            bad++;
        atap_release(ts[i]);
    }
    return bad;
}

/* ---- every order of two users' starts and stops ---------------------------- */

/* Events: 'A' / 'B' init, 'a' / 'b' shutdown. Each user spawns a task that
 * runs for 20 ms right after its init, and joins it after its shutdown (a
 * handle outlives a stop). While a user holds its count, its spawns work,
 * whatever the other did. */
static void run_order(const char *order)
{
    atap_task t[2] = {ATAP_NO_TASK, ATAP_NO_TASK};
    bool held[2] = {false, false};

    for (const char *e = order; *e; e++) {
        int u = (*e == 'A' || *e == 'a') ? 0 : 1;
        bool init = *e == 'A' || *e == 'B';

        if (init) {
            assert_int_equal(atap_init(NULL), 0);
            held[u] = true;
            assert_int_equal(atap_spawn(&t[u], task_nap, (void *)(uintptr_t)20000,
                                        &(atap_spawn_opts){.out_size = 8}),
                             0);
        } else {
            /* the other user's work still runs */
            if (held[1 - u]) {
                atap_task q = spawn8(task_value, (void *)(uintptr_t)(7 + u));
                assert_true(join8(q) == (uint64_t)(7 + u));
                atap_release(q);
            }
            assert_int_equal(atap_shutdown(), 0);
            held[u] = false;
            uint64_t v = 0;
            assert_int_equal(atap_join(t[u], &v, sizeof v), 0);
            assert_true(v == 20000);
            atap_release(t[u]);
        }
        if (atap_initialised() != (held[0] || held[1]))
            fail_msg("order %s, after '%c': initialised %d with users A %d B %d", order, *e,
                     atap_initialised(), held[0], held[1]);
        if (held[0] || held[1]) {
            atap_task q = spawn8(task_value, (void *)(uintptr_t)3);
            assert_true(join8(q) == 3);
            atap_release(q);
        }
    }
}

static void test_embedders_every_order(void **state)
{
    (void)state;
    static const char *const orders[] = {"AaBb", "ABab", "ABba", "BAab", "BAba", "BbAa"};
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++)
        run_order(orders[i]);
    assert_false(atap_initialised());
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- users on threads of their own, starting and stopping at once ---------- */

typedef struct user {
    unsigned id, rounds;
    test_barrier *start;
    atomic_int bad, inits, shutdowns;
    atomic_int found_stopped; /* inits that came while no runtime ran */
} user;

static void *user_main(void *p)
{
    user *u = p;
    unsigned seed = u->id * 7919u + 1;

    barrier_wait(u->start);
    for (unsigned r = 0; r < u->rounds; r++) {
        if (!atap_initialised())
            atomic_fetch_add(&u->found_stopped, 1);
        int rc = atap_init(NULL);
        if (rc != 0) {
            atomic_fetch_add(&u->bad, 1);
            continue;
        }
        atomic_fetch_add(&u->inits, 1);
        /* The runtime runs while this user holds it, whatever the others do. */
        if (!atap_initialised())
            atomic_fetch_add(&u->bad, 1);
        atomic_fetch_add(&u->bad, user_round(seed + r));
        seed = seed * 1103515245u + 12345u;
        if (seed >> 29 == 0)
            sleep_us(seed >> 20 & 0x3ff); /* now and then, hold it a while */
        if (atap_shutdown() != 0)
            atomic_fetch_add(&u->bad, 1);
        else
            atomic_fetch_add(&u->shutdowns, 1);
        if (seed >> 31)
            sleep_us(seed >> 21 & 0x1ff); /* half the time, stay away a while */
    }
    return NULL;
}

/* A long-lived user: a repeat series runs on for the whole test, and work
 * spawned now and then runs, while the others come and go. */
static atomic_int lived_runs;

static int task_tick(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&lived_runs, 1);
    return 0;
}

static void run_users(unsigned n, unsigned rounds, bool with_long_lived)
{
    enum { N_MAX = 4 };
    user us[N_MAX];
    pthread_t th[N_MAX];
    test_barrier start;
    atap_task series = ATAP_NO_TASK;

    assert_true(n <= N_MAX);
    if (with_long_lived) {
        assert_int_equal(atap_init(NULL), 0);
        atomic_store(&lived_runs, 0);
        assert_int_equal(
            atap_spawn(&series, task_tick, NULL,
                       &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_US(500)}),
            0);
    }
    barrier_init(&start, (int)n);
    for (unsigned i = 0; i < n; i++) {
        us[i] = (user){.id = i, .rounds = rounds, .start = &start};
        assert_int_equal(pthread_create(&th[i], NULL, user_main, &us[i]), 0);
    }
    int checks = 0;
    if (with_long_lived) {
        /* Meanwhile: the series goes on, and this user's spawns all work. */
        for (bool done = false; !done; checks++) {
            int before = atomic_load(&lived_runs);
            atap_task q = spawn8(task_value, (void *)(uintptr_t)checks);
            assert_true(join8(q) == (uint64_t)checks);
            atap_release(q);
            assert_true(atap_initialised());
            assert_int_equal(atap_state_of(series) == ATAP_FAILED, 0);
            sleep_ms(5);
            uint64_t end = now_ns() + ATAP_SEC(10);
            while (atomic_load(&lived_runs) == before && now_ns() < end)
                sleep_us(200);
            assert_true(atomic_load(&lived_runs) > before);
            done = true;
            for (unsigned i = 0; i < n; i++)
                if (atomic_load(&us[i].inits) + atomic_load(&us[i].bad) < (int)rounds)
                    done = false;
        }
    }
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    int stopped = 0;
    for (unsigned i = 0; i < n; i++)
        stopped += atomic_load(&us[i].found_stopped);
    print_message("%u users x %u rounds: %d inits came while no runtime ran\n", n, rounds, stopped);
    for (unsigned i = 0; i < n; i++) {
        if (atomic_load(&us[i].bad) != 0)
            fail_msg("user %u: %d things went wrong", i, atomic_load(&us[i].bad));
        assert_int_equal(atomic_load(&us[i].inits), (int)rounds);
        assert_int_equal(atomic_load(&us[i].shutdowns), (int)rounds);
    }
    if (with_long_lived) {
        assert_true(atap_initialised());
        assert_int_equal(atap_cancel(series), 0);
        atap_release(series);
        assert_int_equal(atap_shutdown(), 0);
    }
    assert_false(atap_initialised());
    assert_true(wait_live_back(ATAP_SEC(10)));
}

static void test_embedders_two_users_concurrently(void **state)
{
    (void)state;
    run_users(2, (unsigned)scaled(200, 20), false);
}

static void test_embedders_four_users_concurrently(void **state)
{
    (void)state;
    run_users(4, (unsigned)scaled(100, 10), false);
}

static void test_embedders_users_beside_a_long_lived_one(void **state)
{
    (void)state;
    run_users(2, (unsigned)scaled(100, 10), true);
}

/* ---- inside a task, and the config of a later init ------------------------- */

static int task_init_then_shutdown(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    int rc[2];
    rc[0] = atap_init(NULL); /* a user of its own */
    rc[1] = atap_shutdown(); /* lets it go: not the last, so no wait */
    memcpy(out, rc, sizeof rc);
    return 0;
}

static int task_init_only(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    int rc = atap_init(NULL);
    memcpy(out, &rc, sizeof rc);
    return 0;
}

static void test_embedders_inside_a_task(void **state)
{
    (void)state;
    atap_task t;
    int rc[2] = {1, 1};

    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(
        atap_spawn(&t, task_init_then_shutdown, NULL, &(atap_spawn_opts){.out_size = sizeof rc}),
        0);
    assert_int_equal(atap_join(t, rc, sizeof rc), 0);
    atap_release(t);
    assert_int_equal(rc[0], 0);
    assert_int_equal(rc[1], 0);
    assert_true(atap_initialised());

    /* A task's init counts like any: the outside user's shutdown then leaves
     * it running, and a second one lets the task's user go. */
    assert_int_equal(
        atap_spawn(&t, task_init_only, NULL, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
    assert_int_equal(atap_join(t, rc, sizeof(int)), 0);
    atap_release(t);
    assert_int_equal(rc[0], 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_true(atap_initialised());
    atap_task q = spawn8(task_value, (void *)(uintptr_t)11);
    assert_true(join8(q) == 11);
    atap_release(q);
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

/* A later init with another config: counted, the running config stands;
 * an invalid one is refused and counted nowhere. */
static void test_embedders_later_config_keeps_running_one(void **state)
{
    (void)state;
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 5}), 0);
    assert_int_equal(
        atap_init(&(atap_config){.size = sizeof(atap_config), .workers = ATAP_THREADS_MAX + 1}),
        ATAP_EINVAL);
    sleep_ms(30);
    assert_int_equal(pool_stats().workers, 2);
    assert_int_equal(atap_shutdown(), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

/* ---- fork: the child's count starts at none ------------------------------- */

static int fork_child_checks(void)
{
    if (atap_initialised())
        return 1;
    if (atap_shutdown() != 0 || atap_initialised()) /* none to let go */
        return 2;
#if defined(TEST_TSAN)
    /* TSan cannot start threads after a multithreaded fork: the rest is
     * checked by the plain and ASan builds. */
    return 0;
#else
    atap_task t;
    uint64_t v = 0;
    if (atap_init(NULL) != 0 || !atap_initialised())
        return 3;
    if (atap_spawn(&t, task_value, (void *)(uintptr_t)9, &(atap_spawn_opts){.out_size = 8}) != 0 ||
        atap_join(t, &v, sizeof v) != 0 || v != 9)
        return 4;
    atap_release(t);
    /* one user: the parent's two are not the child's */
    if (atap_shutdown() != 0 || atap_initialised())
        return 5;
    return 0;
#endif
}

static void test_embedders_fork_child_has_no_users(void **state)
{
    (void)state;
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_init(NULL), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_checks());
    child_passed(pid);
    /* the parent still has its two users */
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_true(atap_initialised());
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_embedders_every_order, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_two_users_concurrently, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_four_users_concurrently, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_users_beside_a_long_lived_one, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_inside_a_task, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_later_config_keeps_running_one, ensure_stopped),
        cmocka_unit_test_teardown(test_embedders_fork_child_has_no_users, ensure_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

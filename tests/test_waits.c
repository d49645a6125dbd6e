/*
 * Waits inside tasks: a join, take, wait or join_first inside a task never
 * makes a deadlock the program does not contain (the rule at the top of
 * atap.h), and never starts a worker.
 *
 * The promises these tests hold the runtime to: a wait inside a task that
 * cannot go on sets its task's whole stack aside, and the worker goes on
 * with any work on a fresh stack; the stack resumes on the same thread once
 * the awaited task settles. So a program of waits, whatever its shape, runs
 * on exactly the pool's `workers` threads (atap_pool_stats' peak_workers
 * stays at workers): only blocking tasks and a task stuck in a call of its
 * own (a sleep in the kernel, not an atap wait) grow the pool. No wait
 * gives up with ATAP_ELIMIT.
 *
 * The first shapes below hung or failed every time when a waiting worker
 * ran any queued task on top of its waiting frame: a frame run on top
 * cannot return before it, so whatever it waits for that the lower frame
 * makes later never came. Inner waits are bounded (INNER, or limit() for
 * the newer tests) so that a regression fails the test instead of hanging
 * the suite; the outer ones are shorter. Then: gives and wakes from an
 * awaited task, blocking tasks joining scheduled children, deep chains (of
 * joins, of join_first) on the workers the pool has and in little memory a
 * level, many waits for sleeps at little CPU, a waiting worker running
 * other work, thread-locals across a wait, fork with waits under way, and
 * trees of joins.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "test_util.h"

#define INNER ATAP_SEC(30) /* a wait inside a task: past this, the shape hung */
#define OUTER ATAP_SEC(20) /* the test's own wait, shorter: it fails first */

/* The newer tests' bounds, stretched on a slow machine: a wait inside a
 * task gives up after limit(), the test's own after a little less, so a
 * shape that hangs fails in about limit() and leaves the suite well within
 * its CTest timeout. */
static uint64_t limit(void) { return ATAP_SEC(10) * test_slack(); }

static uint64_t outer_limit(void) { return ATAP_SEC(8) * test_slack(); }
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
        assert_int_equal(
            atap_spawn(&t1, task_t1_shape2, NULL, &(atap_spawn_opts){.out_size = sizeof got}), 0);
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
 * join, the children can only run on the waiters' threads (a waiter
 * sets its stack aside and runs what is queued). */
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
        assert_int_equal(
            atap_spawn(&ts[i], task_blocking_parent, &ran, &(atap_spawn_opts){.blocking = true}),
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

/* ---- helpers of the newer tests ----------------------------------------- */

/* Runtimes of a given shape. Two workers: tests that need a waiter and a
 * worker running what it waits for, and no third thread to run the rest. */
static int setup_two_workers(void **state)
{
    (void)state;
    return setup_runtime_with(&(atap_config){.size = sizeof(atap_config), .workers = 2});
}

/* One worker: what a task spawns stays in its thread's own queue. */
static int setup_one_worker(void **state)
{
    (void)state;
    return setup_runtime_with(&(atap_config){.size = sizeof(atap_config), .workers = 1});
}

/* One blocking thread at most. */
static int setup_one_blocking_thread(void **state)
{
    (void)state;
    return setup_runtime_with(&(atap_config){.size = sizeof(atap_config), .blocking_threads = 1});
}

/* No wait starts a worker: the most workers the pool has had is what it
 * had when the test began (every test starts its own runtime). */
static void assert_no_worker_added(size_t base, const char *what)
{
    struct atap_pool_stats st = pool_stats();
    if (st.peak_workers != base)
        fail_msg("%s: the pool went from %zu to %zu workers", what, base, st.peak_workers);
}

/* Spins on the CPU for ns (a task that keeps its worker busy, not asleep). */
static void spin_ns(uint64_t ns)
{
    uint64_t until = now_ns() + ns;
    while (now_ns() < until && !released_all())
        ;
}

/* A waiting task's run: writes the 8-byte value it was given. */
static int task_echo(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t n = 0;
    const void *in = atap_input(ctx, &n);
    if (!in || n != sizeof(uint64_t))
        return -1;
    memcpy(out, in, sizeof(uint64_t));
    return 0;
}

/* A task waiting for one give of 8 bytes, which it then outputs. */
static atap_task spawn_echo(void)
{
    atap_task t;
    CHECK(atap_spawn_waiting(&t, task_echo, NULL, sizeof(uint64_t),
                             &(atap_spawn_opts){.out_size = sizeof(uint64_t), .gives = 1}) == 0);
    return t;
}

/* Resident pages of the process (/proc/self/statm), or -1 where there is
 * no such file. */
static long resident_pages(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident;
}

/* ---- a give or wake from the awaited task to an older task --------------- */

/* W joins A, which runs on the other worker. While A runs it gives a value
 * to T, a waiting task older than both (or wakes T, parked for a wake),
 * then runs on for 2 ms. T, once started, waits for W: for W itself, or
 * for U, a waiting task W gives to after its join. Run T on top of W's
 * waiting frame and T's join of W reads ATAP_EINVAL (a task lower on the
 * same stack), or T's wait for U never ends (W gives only once T is off
 * its stack). With W's stack set aside, T runs anywhere and just waits. */
enum { GV_GIVE = 0, GV_WAKE = 1 };   /* how A starts T */
enum { GV_FOR_W = 0, GV_FOR_U = 2 }; /* what T waits for */

static struct {
    int mode;           /* GV_GIVE or GV_WAKE, | GV_FOR_W or GV_FOR_U */
    atap_task t, u;     /* T and U, the test thread's handles */
    atap_task w;        /* W's own listener for T (W dups it; T releases) */
    atap_waker t_waker; /* GV_WAKE: T's waker, set before t_parked */
    atomic_int t_parked;
    atomic_int a_started;
    atomic_int t_rc;      /* what T's wait returned, + 1000 once set */
    atomic_int w_give_rc; /* what W's give to U returned, + 1000 once set */
} g_gv;

#define GV_VALUE 0x600dull

static int task_gv_t(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t v = 0;
    int rc;
    if ((g_gv.mode & GV_WAKE) && !atap_resumed(ctx)) {
        g_gv.t_waker = atap_waker_of(ctx);
        if (atap_park_wake(ctx, limit()) != 0)
            return -1;
        atomic_store(&g_gv.t_parked, 1);
        return ATAP_PARKED;
    }
    if ((g_gv.mode & GV_WAKE) && atap_resume_reason(ctx) != ATAP_RESUME_READY) {
        atomic_store(&g_gv.t_rc, 1000 + ATAP_ENOTREADY); /* no wake came */
        return -1;
    }
    if (g_gv.mode & GV_FOR_U) {
        rc = atap_join_for(g_gv.u, &v, sizeof v, limit());
        if (rc == 0 && v != GV_VALUE)
            rc = ATAP_EFAILED;
    } else {
        rc = atap_join_for(g_gv.w, NULL, 0, limit());
    }
    atap_release(g_gv.w);
    atomic_store(&g_gv.t_rc, 1000 + rc);
    memcpy(out, &v, sizeof v);
    return 0;
}

static int task_gv_a(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t v = 1;
    atomic_store(&g_gv.a_started, 1);
    spin_ns(ATAP_MS(1)); /* W gets into its join */
    if (g_gv.mode & GV_WAKE)
        CHECK(atap_wake(g_gv.t_waker));
    else
        CHECK(atap_give(g_gv.t, &v, sizeof v) == 0);
    spin_ns(ATAP_MS(2)); /* and keeps running while T is queued */
    return 0;
}

static int task_gv_w(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atap_task a;
    uint64_t v = GV_VALUE, end;
    CHECK(atap_dup(atap_self(ctx), &g_gv.w) == 0);
    CHECK(atap_spawn(&a, task_gv_a, NULL, NULL) == 0);
    /* Let the other worker take A, so that W waits for a run elsewhere
     * (a join of a queued A would run it here). */
    for (end = now_ns() + ATAP_MS(200); !atomic_load(&g_gv.a_started) && now_ns() < end;)
        ;
    int rc = atap_join_for(a, NULL, 0, limit());
    atap_release(a);
    if (g_gv.mode & GV_FOR_U)
        atomic_store(&g_gv.w_give_rc, 1000 + atap_give(g_gv.u, &v, sizeof v));
    return rc;
}

static void give_to_an_older_waiter(int mode, int rounds)
{
    uint64_t v = 0;
    g_gv.mode = mode;
    for (int i = 0; i < rounds; i++) {
        atap_task w;
        atomic_store(&g_gv.t_parked, 0);
        atomic_store(&g_gv.a_started, 0);
        atomic_store(&g_gv.t_rc, 0);
        atomic_store(&g_gv.w_give_rc, 0);
        g_gv.u = ATAP_NO_TASK;
        if (mode & GV_FOR_U)
            g_gv.u = spawn_echo();
        if (mode & GV_WAKE) {
            assert_int_equal(
                atap_spawn(&g_gv.t, task_gv_t, NULL, &(atap_spawn_opts){.out_size = sizeof v}), 0);
            assert_true(wait_atomic_at_least(&g_gv.t_parked, 1, outer_limit()));
        } else {
            assert_int_equal(
                atap_spawn_waiting(&g_gv.t, task_gv_t, NULL, sizeof v,
                                   &(atap_spawn_opts){.out_size = sizeof v, .gives = 1}),
                0);
        }
        assert_int_equal(atap_spawn(&w, task_gv_w, NULL, NULL), 0);
        int w_rc = atap_join_for(w, NULL, 0, outer_limit());
        int t_rc = atap_join_for(g_gv.t, &v, sizeof v, outer_limit());
        int t_wait = atomic_load(&g_gv.t_rc) - 1000;
        if (w_rc != 0 || t_rc != 0 || t_wait != 0)
            fail_msg("round %d (%s, T waits for %s): the test's join of W read %s, T's wait "
                     "read %s, the test's join of T read %s",
                     i, mode & GV_WAKE ? "wake" : "give", mode & GV_FOR_U ? "U" : "W",
                     atap_strerror(w_rc),
                     t_wait == -1000 ? "nothing (T never ran)" : atap_strerror(t_wait),
                     atap_strerror(t_rc));
        if (mode & GV_FOR_U) {
            assert_int_equal(atomic_load(&g_gv.w_give_rc) - 1000, 0);
            assert_true(v == GV_VALUE);
            atap_release(g_gv.u);
        }
        atap_release(w);
        atap_release(g_gv.t);
    }
    assert_no_failures();
    assert_no_worker_added(2, "gives from awaited tasks");
}

static void test_waits_give_from_the_awaited_task_to_a_task_joining_the_waiter(void **state)
{
    (void)state;
    give_to_an_older_waiter(GV_GIVE | GV_FOR_W, 50);
}

static void test_waits_give_from_the_awaited_task_to_a_task_waiting_for_the_waiter(void **state)
{
    (void)state;
    give_to_an_older_waiter(GV_GIVE | GV_FOR_U, 50);
}

static void test_waits_wake_from_the_awaited_task_to_a_task_joining_the_waiter(void **state)
{
    (void)state;
    give_to_an_older_waiter(GV_WAKE | GV_FOR_W, 50);
}

static void test_waits_wake_from_the_awaited_task_to_a_task_waiting_for_the_waiter(void **state)
{
    (void)state;
    give_to_an_older_waiter(GV_WAKE | GV_FOR_U, 50);
}

/* ---- blocking tasks joining scheduled blocking children ----------------- */

/* As shape 4, but the child is one the pool cannot simply claim while it
 * is queued: it has a run timeout, a start delay, or is a repeat of two
 * runs. Every blocking thread holds a parent waiting for such a child, so
 * the children run only if the waiting parents' threads run them. */
enum { SCHED_TIMEOUT, SCHED_AFTER, SCHED_REPEAT };

static atomic_int g_sched_arrived, g_sched_ran;
static int g_sched_parents, g_sched_how;

static int task_sched_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t n = (uint64_t)atomic_fetch_add(&g_sched_ran, 1) + 1;
    memcpy(out, &n, sizeof n);
    return 0;
}

static int task_sched_parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap_spawn_opts o = {.out_size = sizeof(uint64_t), .blocking = true};
    atap_task c;
    uint64_t v = 0;
    int rc;

    atomic_fetch_add(&g_sched_arrived, 1);
    for (uint64_t end = now_ns() + ATAP_SEC(5); atomic_load(&g_sched_arrived) < g_sched_parents;)
        if (now_ns() > end || released_all())
            break;
        else
            sleep_us(100);
    if (g_sched_how == SCHED_TIMEOUT)
        o.timeout_ns = ATAP_SEC(60);
    else if (g_sched_how == SCHED_AFTER)
        o.after_ns = ATAP_MS(5);
    else
        o.kind = ATAP_REPEAT, o.runs = 2;
    CHECK(atap_spawn(&c, task_sched_child, NULL, &o) == 0);
    /* A repeat: the join reads the first run's output (or the second's,
     * if it came first); the series' second run may need this very
     * thread, once the parent has returned (the test waits for it). A
     * poll of the series' end here would hold the thread: not a wait. */
    rc = atap_join_for(c, &v, sizeof v, limit());
    atap_release(c);
    return rc;
}

static void blocking_parents_join_scheduled_children(size_t k, int how)
{
    static const char *const names[] = {"a run timeout", "a start delay", "a repeat of two runs"};
    atap_task *ts = calloc(k, sizeof *ts);
    int want = (int)k * (how == SCHED_REPEAT ? 2 : 1);
    assert_non_null(ts);
    atomic_store(&g_sched_arrived, 0);
    atomic_store(&g_sched_ran, 0);
    g_sched_parents = (int)k;
    g_sched_how = how;
    for (size_t i = 0; i < k; i++)
        assert_int_equal(
            atap_spawn(&ts[i], task_sched_parent, NULL, &(atap_spawn_opts){.blocking = true}), 0);
    for (size_t i = 0; i < k; i++) {
        int rc = atap_join_for(ts[i], NULL, 0, outer_limit());
        if (rc != 0)
            fail_msg("%zu blocking parent(s) joining a blocking child with %s: parent %zu read "
                     "%s (%d children ran)",
                     k, names[how], i, atap_strerror(rc), atomic_load(&g_sched_ran));
        atap_release(ts[i]);
    }
    assert_true(wait_atomic_at_least(&g_sched_ran, want, outer_limit()));
    assert_int_equal(atomic_load(&g_sched_ran), want);
    free(ts);
    assert_no_failures();
}

/* One blocking thread, one parent; and the default cap (8 blocking threads
 * a CPU: 16 on two CPUs), a parent on each. */
static void test_waits_blocking_task_joins_child_with_timeout_one_thread(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children(1, SCHED_TIMEOUT);
}

static void test_waits_blocking_task_joins_delayed_child_one_thread(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children(1, SCHED_AFTER);
}

static void test_waits_blocking_task_joins_repeat_child_one_thread(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children(1, SCHED_REPEAT);
}

static void test_waits_blocking_tasks_join_children_with_timeout_at_the_cap(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children((size_t)cores() * 8, SCHED_TIMEOUT);
}

static void test_waits_blocking_tasks_join_delayed_children_at_the_cap(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children((size_t)cores() * 8, SCHED_AFTER);
}

static void test_waits_blocking_tasks_join_repeat_children_at_the_cap(void **state)
{
    (void)state;
    blocking_parents_join_scheduled_children((size_t)cores() * 8, SCHED_REPEAT);
}

/* ---- deep chains of nested joins --------------------------------------- */

/* Resident pages at the bottom of the chain, read there (0: not asked). */
static atomic_long g_bottom_resident;
static atomic_int g_sample_bottom;

/* Spawns one child with levels - 1 and joins it; returns how many levels
 * ran below it, itself included. A failed join's code goes up the chain.
 * The bottom level reads the process's resident pages when asked: every
 * level above it is waiting then. */
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
        rc = atap_join_for(child, &below, sizeof below, INNER);
        atap_release(child);
        if (rc != 0)
            return rc;
    } else if (atomic_load(&g_sample_bottom)) {
        atomic_store(&g_bottom_resident, resident_pages());
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

/* 10,000 nested joins, on the workers the pool has. */
static void test_waits_chain_of_10000_joins_bounded_pool(void **state)
{
    (void)state;
    size_t base = pool_stats().workers;
    uint64_t v = 0, levels = 10000;
    assert_int_equal(join_chain(levels, &v, ATAP_SEC(60)), 0);
    assert_true(v == levels + 1);
    assert_no_worker_added(base, "10,000 nested joins");
}

/* 100,000 nested joins: the result (no ATAP_ELIMIT, whatever the depth),
 * on the workers the pool has, in at most 1 KiB resident a level (the
 * resident pages read at the bottom, where every level is waiting, against
 * those before; the sanitizers make every frame larger, and TSan keeps a
 * shadow of each stack byte, so their builds get 4 and 16 KiB). A minute at most, stretched on a
 * slow machine. */
#if defined(TEST_TSAN)
#define LEVEL_BYTES 16384 /* and TSan's shadow of every stack byte is resident too */
#elif defined(TEST_ASAN)
#define LEVEL_BYTES 4096
#else
#define LEVEL_BYTES 1024
#endif
static void test_waits_chain_of_100000_joins_in_little_memory(void **state)
{
    (void)state;
    size_t base = pool_stats().workers;
    uint64_t v = 0, levels = 100000, start = now_ns(), budget = ATAP_SEC(60) * test_slack();
    long before = resident_pages(), page = sysconf(_SC_PAGESIZE);

    atomic_store(&g_bottom_resident, 0);
    atomic_store(&g_sample_bottom, 1);
    int rc = join_chain(levels, &v, budget);
    atomic_store(&g_sample_bottom, 0);
    if (rc != 0)
        fail_msg("100,000 nested joins: %s (%d) after %.1f s", atap_strerror(rc), rc,
                 (double)(now_ns() - start) / 1e9);
    assert_true(v == levels + 1);
    long bottom = atomic_load(&g_bottom_resident);
    double per_level = (double)(bottom - before) * (double)page / (double)levels;
    if (before > 0 && bottom > 0)
        print_message("100,000 nested joins: %.2f s, %.0f bytes resident a level, peak %zu "
                      "workers\n",
                      (double)(now_ns() - start) / 1e9, per_level, pool_stats().peak_workers);
    assert_no_worker_added(base, "100,000 nested joins");
    if (before > 0 && bottom > 0 && per_level > LEVEL_BYTES)
        fail_msg("100,000 nested joins held %.0f bytes resident a level (at most %d)", per_level,
                 LEVEL_BYTES);
}

/* A stack set aside holds what its wait needs, not what the runs nested
 * on it once used. On one worker a task runs a chain of 3,000 nested joins
 * on its own stack (about a megabyte of it), then, back at its top, waits
 * for a sleep, a park: its stack is set aside. While it waits (the least
 * of what is read then), the process holds under 512 KiB more than before
 * the chain (the chain's 3,001 slots are 188 KiB of it): the pages below
 * the wait were given back as it was set aside (1.5 MiB more before they
 * were). (The sanitizers' frames and shadow make the chain's pages a poor
 * measure: reported there, not asserted.) */
static atomic_int g_chain_done;

static int task_chain_then_sleep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t below = 0;
    atap_task t;
    int rc = atap_spawn(&t, task_deep, (void *)(uintptr_t)3000,
                        &(atap_spawn_opts){.out_size = sizeof below});
    if (rc != 0)
        return rc;
    rc = atap_join(t, &below, sizeof below);
    atap_release(t);
    if (rc != 0 || below != 3001)
        return ATAP_EFAILED;
    atomic_store(&g_chain_done, 1);
    if ((rc = atap_spawn_sleep(&t, ATAP_MS(300), false, NULL)) != 0)
        return rc;
    rc = atap_join(t, &below, sizeof below); /* the time slept */
    atap_release(t);
    return rc;
}

static void test_waits_stack_set_aside_gives_back_what_nested_runs_used(void **state)
{
    (void)state;
    long page = sysconf(_SC_PAGESIZE), before, during = -1;
    atap_task t;

    atomic_store(&g_chain_done, 0);
    before = resident_pages();
    assert_int_equal(atap_spawn(&t, task_chain_then_sleep, NULL, NULL), 0);
    /* The least resident while it is set aside: the count of stacks set
     * aside rises just before the stack gives its pages back, so a look
     * right after the rise may come first. */
    for (uint64_t end = now_ns() + ATAP_SEC(20); now_ns() < end; sleep_us(500)) {
        if (!atomic_load(&g_chain_done) || pool_stats().aside < 1) {
            if (during >= 0)
                break; /* resumed */
            continue;
        }
        long r = resident_pages();
        during = during < 0 || r < during ? r : during;
    }
    assert_int_equal(atap_join(t, NULL, 0), 0);
    atap_release(t);
    assert_true(during >= 0); /* it was set aside, with the chain done */
    if (before <= 0)
        skip(); /* no /proc/self/statm */
    long grown = (during - before) * page;
    print_message("3,000 nested joins, then a wait set aside: %ld KiB more resident\n",
                  grown / 1024);
#if !defined(TEST_ASAN) && !defined(TEST_TSAN)
    if (grown > 512 * 1024)
        fail_msg("a stack set aside kept %ld KiB the nested runs had used", grown / 1024);
#endif
}

/* ---- chains of join_first ------------------------------------------------ */

/* Each level spawns the next and waits for the first of {child}, or of
 * {child, g_never} where g_never is a waiting task nobody gives to (it
 * settles only when the test cancels it). A wait on two runs nothing on
 * top of itself: each level must set its stack aside for the next to run.
 * Output: the levels, this one included. */
static atap_task g_never;
static size_t g_first_n; /* 1 or 2 members */

static int task_first_level(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t levels = (uint64_t)(uintptr_t)arg, below = 0;
    if (levels > 0) {
        atap_task set[2];
        size_t winner = 9;
        int rc = atap_spawn(&set[0], task_first_level, (void *)(uintptr_t)(levels - 1),
                            &(atap_spawn_opts){.out_size = sizeof below});
        if (rc != 0)
            return rc;
        set[1] = g_never;
        rc = atap_join_first(set, g_first_n, ATAP_PASS_BACK, limit(), &winner);
        if (rc == 0 && winner != 0)
            rc = ATAP_EFAILED;
        if (rc == 0)
            rc = atap_try_join(set[0], &below, sizeof below);
        atap_release(set[0]);
        if (rc != 0)
            return rc;
    }
    below++;
    memcpy(out, &below, sizeof below);
    return 0;
}

static void join_first_chain(size_t n, uint64_t levels)
{
    size_t base = pool_stats().workers;
    uint64_t v = 0;
    atap_task root;
    g_first_n = n;
    assert_int_equal(atap_spawn_waiting(&g_never, task_echo, NULL, sizeof(uint64_t),
                                        &(atap_spawn_opts){.out_size = sizeof(uint64_t)}),
                     0);
    assert_int_equal(atap_spawn(&root, task_first_level, (void *)(uintptr_t)levels,
                                &(atap_spawn_opts){.out_size = sizeof v}),
                     0);
    int rc = atap_join_for(root, &v, sizeof v, limit() + ATAP_SEC(2));
    assert_int_equal(atap_cancel(g_never), 0); /* lets a stuck chain go */
    atap_release(g_never);
    if (rc != 0)
        fail_msg("a chain of %llu join_first on %zu member(s) read %s", (unsigned long long)levels,
                 n, atap_strerror(rc));
    assert_true(v == levels + 1);
    atap_release(root);
    assert_no_worker_added(base, "a chain of join_first");
}

static void test_waits_chain_of_join_first_on_one(void **state)
{
    (void)state;
    join_first_chain(1, 2000);
}

static void test_waits_chain_of_join_first_on_two(void **state)
{
    (void)state;
    join_first_chain(2, 2000);
}

/* ---- waiting workers keep working ---------------------------------------- */

/* A waiting worker does not hold its thread, nor lend its core: it sets its
 * stack aside and keeps working. With every worker's task waiting on a
 * blocking task that waits for something outside, the queued work still
 * runs, and no worker is added for it. */
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
    size_t base = pool_stats().workers;
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
    assert_no_worker_added(base, "workers waiting on blocking tasks");
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
                 "(peak %zu workers)",
                 before, peak);
}

/* ---- the issue's example: h1 waits for what the task gives after h0 ------ */

/* The task spawns h0 (2 ms on the CPU) and h1, which waits for V, a waiting
 * task the parent gives to only after its join of h0 returns; then it
 * joins h0, gives, joins h1. Run h1 on top of the join of h0 and the value
 * never comes. arg: 0 spawns h0 first, 1 h1 first. */
static int task_h0(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    spin_ns(ATAP_MS(2));
    return 0;
}

static int task_h1(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atap_task *v = arg;
    int rc = atap_join_for(*v, out, sizeof(uint64_t), limit());
    atap_release(*v);
    free(v);
    return rc;
}

static int task_issue(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uint64_t val = 0x1551e, got = 0;
    atap_task v = spawn_echo(), h[2];
    int h1_first = (int)(uintptr_t)arg, rc;

    for (int k = 0; k < 2; k++) {
        if ((k == 0) != (h1_first != 0))
            CHECK(atap_spawn(&h[0], task_h0, NULL, NULL) == 0);
        else
            CHECK(atap_spawn(&h[1], task_h1, handle_copy(v),
                             &(atap_spawn_opts){.out_size = sizeof got}) == 0);
    }
    rc = atap_join_for(h[0], NULL, 0, limit());
    CHECK(atap_give(v, &val, sizeof val) == 0);
    if (rc == 0)
        rc = atap_join_for(h[1], &got, sizeof got, limit());
    if (rc == 0 && got != val)
        rc = ATAP_EFAILED;
    atap_release(h[0]);
    atap_release(h[1]);
    atap_release(v);
    return rc;
}

static void test_waits_sibling_waits_for_a_give_after_the_join(void **state)
{
    (void)state;
    enum { N = 200 };
    size_t base = pool_stats().workers;
    atap_task ts[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(atap_spawn(&ts[i], task_issue, (void *)(uintptr_t)(i & 1), NULL), 0);
    for (int i = 0; i < N; i++) {
        int rc = atap_join_for(ts[i], NULL, 0, outer_limit());
        if (rc != 0)
            fail_msg("task %d (h%d spawned first): %s", i, i & 1, atap_strerror(rc));
        atap_release(ts[i]);
    }
    assert_no_failures();
    assert_no_worker_added(base, "tasks joining h0 while h1 waits for a give");
}

/* ---- many waits for sleeps: 10 ms, on the workers there are ------------ */

/* Spawns a 10 ms sleep (parked on a timer) and waits for it: a join, a
 * take, or a join_first on it alone, as arg says. */
static int task_wait_sleep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task s;
    uint64_t slept = 0;
    size_t winner = 9;
    int rc = atap_spawn_sleep(&s, ATAP_MS(10), false, NULL);
    if (rc != 0)
        return rc;
    switch ((uintptr_t)arg % 3) {
    case 0:
        rc = atap_join_for(s, &slept, sizeof slept, limit());
        break;
    case 1:
        rc = atap_take_for(s, &slept, sizeof slept, limit());
        break;
    default:
        rc = atap_join_first(&s, 1, ATAP_PASS_BACK, limit(), &winner);
        if (rc == 0)
            rc = atap_try_join(s, &slept, sizeof slept);
    }
    atap_release(s);
    if (rc == 0 && slept < ATAP_MS(10))
        rc = ATAP_EFAILED;
    return rc;
}

/* 1,000 tasks each waiting for a sleep of 10 ms: every wait sets its stack
 * aside, so they all sleep at once, and the whole takes about 10 ms, on
 * the workers the pool has, at next to no CPU (no waiter spins). */
static void test_waits_a_thousand_waits_for_sleeps(void **state)
{
    (void)state;
    enum { N = 1000 };
    size_t base = pool_stats().workers;
    static atap_task ts[N];
    uint64_t cpu0 = process_cpu_ns(), t0 = now_ns(), took, cpu;
    for (int i = 0; i < N; i++)
        assert_int_equal(atap_spawn(&ts[i], task_wait_sleep, (void *)(uintptr_t)i, NULL), 0);
    for (int i = 0; i < N; i++) {
        int rc = atap_join_for(ts[i], NULL, 0, outer_limit());
        if (rc != 0)
            fail_msg("task %d: %s", i, atap_strerror(rc));
        atap_release(ts[i]);
    }
    took = now_ns() - t0;
    cpu = process_cpu_ns() - cpu0;
    print_message("1,000 waits for 10 ms sleeps: %.1f ms, %.1f ms of CPU, peak %zu workers\n",
                  (double)took / 1e6, (double)cpu / 1e6, pool_stats().peak_workers);
    assert_no_worker_added(base, "1,000 waits for sleeps");
    if (took >= ATAP_SEC(2) * test_slack())
        fail_msg("1,000 waits for 10 ms sleeps took %.1f ms", (double)took / 1e6);
    if (cpu >= ATAP_MS(200) * test_slack())
        fail_msg("1,000 waits for 10 ms sleeps took %.1f ms of CPU", (double)cpu / 1e6);
}

/* ---- a worker waiting for a run elsewhere runs other work meanwhile ------ */

/* Two workers. P (on one) waits for R, which runs 200 joins deep on the
 * other: a chain of that worker's own joins, at whose bottom a join of R,
 * still queued, runs it there. R keeps its worker on the CPU until the
 * test's other tasks have all run (or a bound). Those tasks are unrelated
 * to R: P's worker must run them while P waits, having set P's stack
 * aside. A waiter that ran only work R needs, and otherwise slept, would
 * leave them queued until R gives up. */
#define DEEP_LEVELS 200
#define OTHER_TASKS 20

static struct {
    atap_task r;            /* the run waited for, spawned by P */
    atomic_int r_ready;     /* r is set */
    atomic_int r_started;   /* r runs */
    atomic_int p_waiting;   /* P is inside its join of R */
    atomic_int others_ran;  /* the unrelated tasks that ran */
    atomic_int on_p_thread; /* ... on P's thread while P waited */
    pthread_t p_thread;
} g_pr;

static int task_other(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    if (pthread_equal(pthread_self(), g_pr.p_thread) && atomic_load(&g_pr.p_waiting))
        atomic_fetch_add(&g_pr.on_p_thread, 1);
    spin_ns(ATAP_MS(1));
    atomic_fetch_add(&g_pr.others_ran, 1);
    return 0;
}

static int task_pr_r(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t end = now_ns() + ATAP_SEC(5) * test_slack();
    atomic_store(&g_pr.r_started, 1);
    while (atomic_load(&g_pr.others_ran) < OTHER_TASKS && now_ns() < end && !released_all())
        ;
    return 0;
}

/* P: spawns R and lets the other worker take it (no join yet, or P would
 * run R itself), then waits for it. */
static int task_pr_p(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t end = now_ns() + INNER;
    g_pr.p_thread = pthread_self();
    CHECK(atap_spawn(&g_pr.r, task_pr_r, NULL, NULL) == 0);
    atomic_store(&g_pr.r_ready, 1);
    while (!atomic_load(&g_pr.r_started) && now_ns() < end && !released_all())
        ;
    atomic_store(&g_pr.p_waiting, 1);
    int rc = atap_join_for(g_pr.r, NULL, 0, INNER);
    atomic_store(&g_pr.p_waiting, 0);
    CHECK(pthread_equal(pthread_self(), g_pr.p_thread));
    return rc;
}

/* The other worker's chain of own joins, R's join at its bottom. */
static int task_pr_level(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uintptr_t level = (uintptr_t)arg;
    atap_task t;
    if (level < DEEP_LEVELS) {
        CHECK(atap_spawn(&t, task_pr_level, (void *)(level + 1), NULL) == 0);
        int rc = atap_join_for(t, NULL, 0, INNER);
        atap_release(t);
        return rc;
    }
    uint64_t end = now_ns() + INNER;
    while (!atomic_load(&g_pr.r_ready) && now_ns() < end && !released_all())
        ;
    return atap_join_for(g_pr.r, NULL, 0, INNER);
}

static void test_waits_waiting_worker_runs_other_work(void **state)
{
    (void)state;
    atap_task p, d, others[OTHER_TASKS];

    atomic_store(&g_pr.r_ready, 0);
    atomic_store(&g_pr.r_started, 0);
    atomic_store(&g_pr.p_waiting, 0);
    atomic_store(&g_pr.others_ran, 0);
    atomic_store(&g_pr.on_p_thread, 0);
    assert_int_equal(atap_spawn(&p, task_pr_p, NULL, NULL), 0);
    assert_true(wait_atomic_at_least(&g_pr.r_ready, 1, OUTER));
    assert_int_equal(atap_spawn(&d, task_pr_level, (void *)(uintptr_t)0, NULL), 0);
    assert_true(wait_atomic_at_least(&g_pr.p_waiting, 1, OUTER));
    for (int i = 0; i < OTHER_TASKS; i++)
        assert_int_equal(atap_spawn(&others[i], task_other, NULL, NULL), 0);
    assert_int_equal(atap_join_for(d, NULL, 0, OUTER), 0);
    assert_int_equal(atap_join_for(p, NULL, 0, OUTER), 0);
    for (int i = 0; i < OTHER_TASKS; i++) {
        assert_int_equal(atap_join_for(others[i], NULL, 0, OUTER), 0);
        atap_release(others[i]);
    }
    atap_release(d);
    atap_release(p);
    atap_release(g_pr.r);
    if (atomic_load(&g_pr.on_p_thread) != OTHER_TASKS)
        fail_msg("P waited for R, run %d levels deep on the other worker, and its worker ran "
                 "%d of the %d other tasks meanwhile",
                 DEEP_LEVELS, atomic_load(&g_pr.on_p_thread), OTHER_TASKS);
    assert_no_failures();
    assert_no_worker_added(2, "a worker waiting for a run deep on another");
}

/* ---- a wait returns on its own thread, with its thread-locals ----------- */

/* Every task marks its thread in a thread-local: the same value for every
 * task on one thread, another on each thread. A task that waits (its stack
 * set aside while the worker runs others, which mark the same thread) must
 * come back on the thread it left, with that thread's thread-locals: the
 * mark reads the thread's own, and pthread_self() and the variable's
 * address are what they were. Half the tasks wait for a child on the CPU
 * for 2 ms, which another worker may have taken; the other half for a
 * 2 ms sleep, which holds no thread, so that their waits cannot go on. */
static _Thread_local uintptr_t tl_mark;

static uintptr_t thread_mark(void) { return (uintptr_t)pthread_self() ^ (uintptr_t)0x5eed5eedu; }

__attribute__((noinline)) static uintptr_t *tl_mark_address(void) { return &tl_mark; }

static atomic_int g_tl_elsewhere; /* children that ran on another thread */

typedef struct tl_child {
    atomic_int started;
    pthread_t parent;
} tl_child;

static int task_tl_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    tl_child *c = arg;
    tl_mark = thread_mark();
    if (!pthread_equal(pthread_self(), c->parent))
        atomic_fetch_add(&g_tl_elsewhere, 1);
    atomic_store(&c->started, 1);
    spin_ns(ATAP_MS(2));
    return 0;
}

static int task_tl_parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atap_task t;
    int rc;
    tl_mark = thread_mark();
    pthread_t self = pthread_self();
    uintptr_t *where = tl_mark_address();
    if ((uintptr_t)arg & 1) {
        tl_child *c = malloc(sizeof *c);
        if (!c)
            return -1;
        atomic_init(&c->started, 0);
        c->parent = self;
        CHECK(atap_spawn(&t, task_tl_child, c, &(atap_spawn_opts){.arg_free = free}) == 0);
        /* Give another worker a moment to take the child, so that this
         * join waits for a run elsewhere rather than running it. */
        for (uint64_t end = now_ns() + ATAP_MS(1); !atomic_load(&c->started) && now_ns() < end;)
            ;
        rc = atap_join_for(t, NULL, 0, limit());
    } else {
        uint64_t slept = 0;
        CHECK(atap_spawn_sleep(&t, ATAP_MS(2), false, NULL) == 0);
        rc = atap_join_for(t, &slept, sizeof slept, limit());
    }
    atap_release(t);
    CHECK(pthread_equal(self, pthread_self()));
    CHECK(tl_mark_address() == where);
    CHECK(tl_mark == thread_mark());
    return rc;
}

static void test_waits_wait_returns_on_its_thread_with_its_thread_locals(void **state)
{
    (void)state;
    enum { N = 256, ROUNDS = 4 };
    static atap_task ts[N];
    atomic_store(&g_tl_elsewhere, 0);
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++)
            assert_int_equal(atap_spawn(&ts[i], task_tl_parent, (void *)(uintptr_t)i, NULL), 0);
        for (int i = 0; i < N; i++) {
            assert_int_equal(atap_join_for(ts[i], NULL, 0, outer_limit()), 0);
            atap_release(ts[i]);
        }
        assert_no_failures();
    }
    print_message("%d of %d spinning children ran on another thread than their parent's\n",
                  atomic_load(&g_tl_elsewhere), ROUNDS * N / 2);
}

/* ---- fork while tasks wait ---------------------------------------------- */

/* Tasks waiting (their stacks set aside) for values given only after the
 * main thread has forked. The child starts from nothing: no runtime, none
 * of the parent's tasks; it can start its own, spawn, join and stop it.
 * The parent's waits then still end, with their values. */
static atomic_int g_fork_waiting;

static int task_fork_waiter(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atap_task *v = arg;
    atomic_fetch_add(&g_fork_waiting, 1);
    int rc = atap_join_for(*v, out, sizeof(uint64_t), limit());
    atap_release(*v);
    free(v);
    return rc;
}

/* The child's side: no cmocka (its state is the parent's copy); each
 * failed step exits with its own status. */
static int fork_child_checks(atap_task parents)
{
    uint64_t v = 0;
    if (atap_initialised())
        return 10;
    if (atap_join(parents, &v, sizeof v) != ATAP_ENOTASK)
        return 11;
    if (atap_shutdown() != 0 || atap_initialised())
        return 12;
#if defined(TEST_TSAN)
    /* TSan cannot start threads in the child of a multithreaded fork (see
     * test_lifecycle.c): the plain and ASan builds check the rest. */
    return 0;
#else
    atap_task t;
    if (atap_init(NULL) != 0 || !atap_initialised())
        return 13;
    if (atap_spawn(&t, task_value, (void *)(uintptr_t)9, &(atap_spawn_opts){.out_size = 8}) != 0)
        return 14;
    if (atap_join(t, &v, sizeof v) != 0 || v != 9)
        return 15;
    atap_release(t);
    if (atap_shutdown() != 0 || atap_initialised())
        return 16;
    return 0;
#endif
}

static void test_waits_fork_while_tasks_wait(void **state)
{
    (void)state;
    size_t n = pool_stats().workers * 4;
    atap_task *vs = calloc(n, sizeof *vs), *ws = calloc(n, sizeof *ws);
    assert_true(vs && ws);
    atomic_store(&g_fork_waiting, 0);
    for (size_t i = 0; i < n; i++) {
        vs[i] = spawn_echo();
        assert_int_equal(atap_spawn(&ws[i], task_fork_waiter, handle_copy(vs[i]),
                                    &(atap_spawn_opts){.out_size = sizeof(uint64_t)}),
                         0);
    }
    /* Waits hold no worker: every waiter starts. */
    assert_true(wait_atomic_at_least(&g_fork_waiting, (int)n, outer_limit()));
    sleep_ms(10);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_checks(ws[0]));
    child_passed(pid);

    /* The parent's waits go on. */
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 100 + i;
        assert_int_equal(atap_give(vs[i], &v, sizeof v), 0);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        assert_int_equal(atap_join_for(ws[i], &v, sizeof v, outer_limit()), 0);
        assert_true(v == 100 + i);
        atap_release(ws[i]);
        atap_release(vs[i]);
    }
    free(vs);
    free(ws);
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

/* After the roots' joins return, with their handles still held: nothing
 * is queued (no entry is left behind for a task that already ran), and the
 * only tasks holding slots are the roots: every node below them was joined
 * and let go by its parent. A node's slot may be let go just after its
 * output was published, when its run ends on its worker, so the live count
 * may come back a little late, but it must come back exactly. */
static void assert_only_roots_left(size_t roots, const char *what)
{
    struct atap_pool_stats st = pool_stats();
    size_t queued = st.queued;
    uint64_t end = now_ns() + ATAP_MS(200) * test_slack();
    while (st.live != g_live_base + roots && now_ns() < end) {
        sleep_us(100);
        st = pool_stats();
    }
    if (queued != 0 || st.live != g_live_base + roots)
        fail_msg("%s: %zu tasks queued after the roots' joins, %zu live a moment later "
                 "(want 0 and %zu)",
                 what, queued, st.live, g_live_base + roots);
}

/* Every node of a tree joins its children: a worker that waits sets the
 * node's stack aside and runs the others; the tree runs on the workers
 * the pool has, one a core, with none added, however long it waits. */
static void test_waits_tree_of_joins_adds_no_worker(void **state)
{
    (void)state;
    size_t base = pool_stats().workers;
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
            total += nodes;
        }
        assert_only_roots_left(n, "trees of joins");
        for (size_t i = 0; i < n; i++)
            atap_release(roots[i]);
    }
    assert_no_failures();
    print_message("trees of joins: %llu nodes\n", (unsigned long long)total);
    assert_no_worker_added(base, "trees of joins");
}

/* A wide tree: 8 children a node, WIDE_DEPTH levels below the root, each
 * node spawning them all, then joining them in spawn order. */
#define WIDE_KIDS 8
#define WIDE_DEPTH 5

static int task_wide_node(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uintptr_t depth = (uintptr_t)arg;
    uint64_t nodes = 1, sub = 0;
    atap_task kid[WIDE_KIDS];
    if (depth > 0) {
        for (int i = 0; i < WIDE_KIDS; i++)
            CHECK(atap_spawn(&kid[i], task_wide_node, (void *)(depth - 1),
                             &(atap_spawn_opts){.out_size = sizeof sub}) == 0);
        for (int i = 0; i < WIDE_KIDS; i++) {
            CHECK(atap_join_for(kid[i], &sub, sizeof sub, INNER) == 0);
            atap_release(kid[i]);
            nodes += sub;
        }
    }
    memcpy(out, &nodes, sizeof nodes);
    return 0;
}

static void test_waits_wide_tree_of_joins_adds_no_worker(void **state)
{
    (void)state;
    enum { ROOTS = 4 };
    size_t base = pool_stats().workers;
    uint64_t want = 0, level = 1, nodes;
    atap_task roots[ROOTS];

    for (int d = 0; d <= WIDE_DEPTH; d++, level *= WIDE_KIDS)
        want += level;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < ROOTS; i++)
            assert_int_equal(atap_spawn(&roots[i], task_wide_node, (void *)(uintptr_t)WIDE_DEPTH,
                                        &(atap_spawn_opts){.out_size = sizeof nodes}),
                             0);
        for (int i = 0; i < ROOTS; i++) {
            nodes = 0;
            assert_int_equal(atap_join_for(roots[i], &nodes, sizeof nodes, OUTER), 0);
            assert_true(nodes == want);
        }
        assert_only_roots_left(ROOTS, "wide trees of joins");
        for (int i = 0; i < ROOTS; i++)
            atap_release(roots[i]);
    }
    assert_no_failures();
    assert_no_worker_added(base, "wide trees of joins");
}

/* ---- the pool's count of stacks set aside --------------------------------- */

/* n tasks each waiting for a value nobody has given yet: each has set its
 * stack aside (aside == n, and its peak at least that; the pool holds at
 * least those stacks). Once the values are given and the waits are over,
 * none is aside. */
static atomic_int g_aside_waiting;

static int task_aside_waiter(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atap_task *v = arg;
    atomic_fetch_add(&g_aside_waiting, 1);
    int rc = atap_join_for(*v, out, sizeof(uint64_t), limit());
    atap_release(*v);
    free(v);
    return rc;
}

static void test_waits_aside_stats_count_the_stacks_set_aside(void **state)
{
    (void)state;
    size_t base = pool_stats().workers, n = base * 8;
    atap_task *vs = calloc(n, sizeof *vs), *ws = calloc(n, sizeof *ws);
    struct atap_pool_stats st;
    assert_true(vs && ws);
    atomic_store(&g_aside_waiting, 0);
    for (size_t i = 0; i < n; i++) {
        vs[i] = spawn_echo();
        assert_int_equal(atap_spawn(&ws[i], task_aside_waiter, handle_copy(vs[i]),
                                    &(atap_spawn_opts){.out_size = sizeof(uint64_t)}),
                         0);
    }
    assert_true(wait_atomic_at_least(&g_aside_waiting, (int)n, outer_limit()));
    /* A waiter counts itself before its join sets the stack aside. */
    for (uint64_t end = now_ns() + outer_limit(); pool_stats().aside < n && now_ns() < end;)
        sleep_us(200);
    st = pool_stats();
    if (st.aside != n || st.peak_aside < n || st.stacks < n)
        fail_msg("%zu tasks waiting: aside %zu, peak_aside %zu, stacks %zu", n, st.aside,
                 st.peak_aside, st.stacks);
    for (size_t i = 0; i < n; i++) {
        uint64_t v = i;
        assert_int_equal(atap_give(vs[i], &v, sizeof v), 0);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = ~0ull;
        assert_int_equal(atap_join_for(ws[i], &v, sizeof v, outer_limit()), 0);
        assert_true(v == i);
        atap_release(ws[i]);
        atap_release(vs[i]);
    }
    st = pool_stats();
    if (st.aside != 0 || st.peak_aside < n)
        fail_msg("the waits are over: aside %zu, peak_aside %zu", st.aside, st.peak_aside);
    free(vs);
    free(ws);
    assert_no_failures();
    assert_no_worker_added(base, "tasks waiting for gives");
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
#define T2(f) cmocka_unit_test_setup_teardown(f, setup_two_workers, teardown_runtime)
#define T1B(f) cmocka_unit_test_setup_teardown(f, setup_one_blocking_thread, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_waits_join_no_cycle_no_deadlock),
        T(test_waits_value_sent_after_the_wait),
        T(test_waits_child_joins_its_spawner),
        T(test_waits_blocking_threads_at_their_cap),
        T(test_waits_join_first_runs_no_member_on_top),
        T(test_waits_waiting_workers_lend_their_cores),
        T(test_waits_chain_of_10000_joins_bounded_pool),
        T(test_waits_chain_of_100000_joins_in_little_memory),
        cmocka_unit_test_setup_teardown(test_waits_stack_set_aside_gives_back_what_nested_runs_used,
                                        setup_one_worker, teardown_runtime),
        T(test_waits_busy_workers_get_no_growth),
        T(test_waits_tree_of_joins_adds_no_worker),
        T(test_waits_wide_tree_of_joins_adds_no_worker),
        T2(test_waits_waiting_worker_runs_other_work),
        T(test_waits_sleeping_workers_get_growth),
        T2(test_waits_give_from_the_awaited_task_to_a_task_joining_the_waiter),
        T2(test_waits_give_from_the_awaited_task_to_a_task_waiting_for_the_waiter),
        T2(test_waits_wake_from_the_awaited_task_to_a_task_joining_the_waiter),
        T2(test_waits_wake_from_the_awaited_task_to_a_task_waiting_for_the_waiter),
        T1B(test_waits_blocking_task_joins_child_with_timeout_one_thread),
        T1B(test_waits_blocking_task_joins_delayed_child_one_thread),
        T1B(test_waits_blocking_task_joins_repeat_child_one_thread),
        T(test_waits_blocking_tasks_join_children_with_timeout_at_the_cap),
        T(test_waits_blocking_tasks_join_delayed_children_at_the_cap),
        T(test_waits_blocking_tasks_join_repeat_children_at_the_cap),
        T(test_waits_chain_of_join_first_on_one),
        T(test_waits_chain_of_join_first_on_two),
        T(test_waits_sibling_waits_for_a_give_after_the_join),
        T(test_waits_a_thousand_waits_for_sleeps),
        T2(test_waits_wait_returns_on_its_thread_with_its_thread_locals),
        T(test_waits_fork_while_tasks_wait),
        T(test_waits_aside_stats_count_the_stacks_set_aside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Being told that a task is over without waiting: atap_on_settle (a
 * callback on a pool thread) and atap_settle_fd (a descriptor a foreign
 * event loop watches). Each way a task can end calls back exactly once,
 * with its final state; an fd is readable exactly from then on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>

#include "test_util.h"

/* ---- what a callback saw ------------------------------------------------- */

enum { READ_NONE, READ_JOIN, READ_TAKE };

/* One registration's record. Static storage, as the gates': a test that
 * fails half way must not leave a callback writing into a dead frame. */
typedef struct seen {
    atomic_int calls;
    atomic_int state;
    atomic_int on_test_thread;
    atomic_int read_rc;
    atomic_int run_over; /* the task's run had returned when called */
    _Atomic uint64_t value;
    int read;             /* READ_*: what the callback does with the task */
    atomic_int *returned; /* the task's "my run returned" flag, if any */
} seen;

#define SEEN_RING 512
static seen g_seen[SEEN_RING];
static size_t g_seen_next;
static pthread_t g_test_thread;

static seen *seen_new(int read)
{
    seen *s = &g_seen[g_seen_next++ % SEEN_RING];

    atomic_store(&s->calls, 0);
    atomic_store(&s->state, 0);
    atomic_store(&s->on_test_thread, 0);
    atomic_store(&s->read_rc, 1);
    atomic_store(&s->run_over, 0);
    atomic_store(&s->value, 0);
    s->read = read;
    s->returned = NULL;
    g_test_thread = pthread_self();
    return s;
}

static void on_settle(atap_task t, atap_state state, void *arg)
{
    seen *s = arg;
    uint64_t v = 0;

    if (pthread_equal(pthread_self(), g_test_thread))
        atomic_store(&s->on_test_thread, 1);
    if (s->returned)
        atomic_store(&s->run_over, atomic_load(s->returned));
    if (s->read == READ_JOIN)
        atomic_store(&s->read_rc, atap_join(t, &v, sizeof v));
    else if (s->read == READ_TAKE)
        atomic_store(&s->read_rc, atap_take(t, &v, sizeof v));
    atomic_store(&s->value, v);
    atomic_store(&s->state, (int)state);
    atomic_fetch_add_explicit(&s->calls, 1, memory_order_acq_rel); /* last: the test reads after */
}

/* Waits for exactly one call, then checks no second one follows. */
static void called_once_at(seen *s, atap_state want, int line)
{
    if (!wait_atomic_at_least(&s->calls, 1, ATAP_SEC(10) * test_slack()))
        fail_msg("line %d: the callback was not called", line);
    sleep_us(20000);
    if (atomic_load(&s->calls) != 1)
        fail_msg("line %d: the callback was called %d times", line, atomic_load(&s->calls));
    if (atomic_load(&s->state) != (int)want)
        fail_msg("line %d: state %d, wanted %d", line, atomic_load(&s->state), (int)want);
}
#define CALLED_ONCE(s, want) called_once_at((s), (want), __LINE__)

static void waited_to_live_back_at(int line)
{
    if (!wait_live_back(ATAP_SEC(10) * test_slack()))
        fail_msg("line %d: %zu tasks still live after 10 s, %zu when the test began", line,
                 pool_stats().live, g_live_base);
}

static void on(atap_task t, seen *s) { assert_int_equal(atap_on_settle(t, on_settle, s), 0); }

/* Runs until cancelled (or the teardown), then says it returned. */
static int task_until_cancelled(atap_ctx *ctx, void *arg, void *out)
{
    atomic_int *returned = arg;

    (void)out;
    while (!atap_cancelled(ctx) && !released_all())
        sleep_us(200);
    sleep_us(20000); /* a callback called at the cancel would come now */
    atomic_store(returned, 1);
    return 0;
}

/* Counts its runs. out 8. */
static int task_runs(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t n = (uint64_t)atomic_fetch_add((atomic_int *)arg, 1) + 1;

    (void)ctx;
    memcpy(out, &n, sizeof n);
    return 0;
}

/* ---- ways to end --------------------------------------------------------- */

static void test_settle_ready_on_a_pool_thread(void **state)
{
    (void)state;
    gate *g = gate_new(42);
    seen *s = seen_new(READ_JOIN);
    atap_task t = spawn8(task_gated, g);

    on(t, s);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(10)));
    sleep_us(20000);
    assert_int_equal(atomic_load(&s->calls), 0); /* not before it settles */
    atomic_store(&g->open, 1);
    CALLED_ONCE(s, ATAP_READY);
    assert_int_equal(atomic_load(&s->on_test_thread), 0);
    assert_int_equal(atomic_load(&s->read_rc), 0); /* the handle is still ours */
    assert_int_equal(atomic_load(&s->value), 42);
    assert_int_equal(join8(t), 42); /* a join in the callback leaves it */
    atap_release(t);
    waited_to_live_back_at(__LINE__);
}

static void test_settle_callback_takes_the_output(void **state)
{
    (void)state;
    seen *s = seen_new(READ_TAKE);
    gate *g = gate_new(7);
    atap_task t = spawn8(task_gated, g);
    uint64_t v;

    on(t, s);
    atomic_store(&g->open, 1);
    CALLED_ONCE(s, ATAP_READY); /* its state when it was over */
    assert_int_equal(atomic_load(&s->read_rc), 0);
    assert_int_equal(atomic_load(&s->value), 7);
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ETAKEN);
    assert_int_equal(atap_state_of(t), ATAP_TAKEN);
    atap_release(t);
}

static void test_settle_failed(void **state)
{
    (void)state;
    seen *s = seen_new(READ_JOIN);
    atap_task t = spawn8(task_fail, NULL);

    on(t, s);
    CALLED_ONCE(s, ATAP_FAILED);
    assert_int_equal(atomic_load(&s->read_rc), ATAP_EFAILED);
    atap_release(t);
}

static void test_settle_cancelled_pending(void **state)
{
    (void)state;
    seen *s = seen_new(READ_NONE);
    atap_task t;

    assert_int_equal(atap_spawn(&t, task_value, (void *)1,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(30)}),
                     0);
    on(t, s);
    sleep_us(20000);
    assert_int_equal(atomic_load(&s->calls), 0);
    assert_int_equal(atap_cancel(t), 0);
    CALLED_ONCE(s, ATAP_CANCELLED);
    atap_release(t);
    waited_to_live_back_at(__LINE__);
}

/* A running task cancelled: called once its run has returned, not at the
 * cancel. */
static void test_settle_cancelled_running(void **state)
{
    (void)state;
    static atomic_int returned;
    seen *s = seen_new(READ_JOIN);
    atap_task t;

    atomic_store(&returned, 0);
    s->returned = &returned;
    assert_int_equal(
        atap_spawn(&t, task_until_cancelled, &returned, &(atap_spawn_opts){.out_size = 8}), 0);
    on(t, s);
    while (atap_state_of(t) != ATAP_RUNNING)
        sleep_us(100);
    assert_int_equal(atap_cancel(t), 0);
    CALLED_ONCE(s, ATAP_CANCELLED);
    assert_int_equal(atomic_load(&s->run_over), 1);
    assert_int_equal(atomic_load(&s->read_rc), ATAP_ECANCELLED);
    atap_release(t);
}

static void test_settle_timed_out(void **state)
{
    (void)state;
    static atomic_int returned;
    seen *s = seen_new(READ_NONE);
    atap_task t;

    atomic_store(&returned, 0);
    s->returned = &returned;
    assert_int_equal(atap_spawn(&t, task_until_cancelled, &returned,
                                &(atap_spawn_opts){.timeout_ns = ATAP_MS(20)}),
                     0);
    on(t, s);
    CALLED_ONCE(s, ATAP_TIMED_OUT);
    assert_int_equal(atomic_load(&s->run_over), 1);
    atap_release(t);
}

/* A repeat: once, when its series ran out, not after each run. */
static void test_settle_repeat_end(void **state)
{
    (void)state;
    static atomic_int runs;
    seen *s = seen_new(READ_JOIN);
    atap_task t;

    atomic_store(&runs, 0);
    assert_int_equal(
        atap_spawn(&t, task_runs, &runs,
                   &(atap_spawn_opts){
                       .out_size = 8, .kind = ATAP_REPEAT, .every_ns = ATAP_MS(5), .runs = 4}),
        0);
    on(t, s);
    CALLED_ONCE(s, ATAP_READY);
    assert_int_equal(atomic_load(&runs), 4);
    assert_int_equal(atomic_load(&s->value), 4); /* the last run's output */
    atap_release(t);
}

/* A repeat without a limit ends only with its cancel. */
static void test_settle_repeat_cancelled(void **state)
{
    (void)state;
    static atomic_int runs;
    seen *s = seen_new(READ_NONE);
    atap_task t;

    atomic_store(&runs, 0);
    assert_int_equal(
        atap_spawn(&t, task_runs, &runs,
                   &(atap_spawn_opts){.out_size = 8, .kind = ATAP_REPEAT, .every_ns = ATAP_MS(1)}),
        0);
    on(t, s);
    assert_true(wait_atomic_at_least(&runs, 3, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&s->calls), 0);
    assert_int_equal(atap_cancel(t), 0);
    CALLED_ONCE(s, ATAP_CANCELLED);
    atap_release(t);
}

/* A waiting task is over once it takes no more gives: here, when its last
 * handle goes. */
static void test_settle_waiting_task_let_go(void **state)
{
    (void)state;
    seen *s = seen_new(READ_NONE);
    atap_task t;
    uint64_t v;

    assert_int_equal(
        atap_spawn_waiting(&t, task_value, (void *)5, 0, &(atap_spawn_opts){.out_size = 8}), 0);
    on(t, s);
    assert_int_equal(atap_give(t, NULL, 0), 0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    sleep_us(20000);
    assert_int_equal(atomic_load(&s->calls), 0); /* it could still be given more */
    atap_release(t);
    CALLED_ONCE(s, ATAP_READY);
}

static void test_settle_already_settled(void **state)
{
    (void)state;
    seen *s = seen_new(READ_JOIN);
    atap_task t = spawn8(task_value, (void *)9);

    assert_int_equal(join8(t), 9);
    on(t, s);
    CALLED_ONCE(s, ATAP_READY);
    assert_int_equal(atomic_load(&s->on_test_thread), 0); /* a pool thread still */
    assert_int_equal(atomic_load(&s->value), 9);
    atap_release(t);
}

/* Releasing every handle before the task is over still calls back; the
 * handle then reads ATAP_ENOTASK. */
static void test_settle_released_before_settling(void **state)
{
    (void)state;
    gate *g = gate_new(3);
    seen *s = seen_new(READ_JOIN);
    atap_task t = spawn8(task_gated, g);

    on(t, s);
    atap_release(t);
    atomic_store(&g->open, 1);
    CALLED_ONCE(s, ATAP_READY);
    assert_int_equal(atomic_load(&s->read_rc), ATAP_ENOTASK);
    waited_to_live_back_at(__LINE__); /* the registration kept nothing */
}

static void test_settle_many_on_one_task(void **state)
{
    (void)state;
    enum { N = 200 };
    static seen *ss[N];
    gate *g = gate_new(11);
    atap_task t = spawn8(task_gated, g);

    for (int i = 0; i < N; i++) {
        ss[i] = seen_new(i % 2 ? READ_JOIN : READ_NONE);
        on(t, ss[i]);
    }
    atomic_store(&g->open, 1);
    for (int i = 0; i < N; i++)
        CALLED_ONCE(ss[i], ATAP_READY);
    for (int i = 1; i < N; i += 2)
        assert_int_equal(atomic_load(&ss[i]->value), 11);
    atap_release(t);
    waited_to_live_back_at(__LINE__);
}

static void test_settle_bad_arguments(void **state)
{
    (void)state;
    atap_task t = spawn8(task_value, (void *)1), copy = t;
    int fd = 5;

    assert_int_equal(atap_on_settle(t, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_settle_fd(t, NULL), ATAP_EINVAL);
    assert_int_equal(atap_on_settle(ATAP_NO_TASK, on_settle, seen_new(READ_NONE)), ATAP_ENOTASK);
    assert_int_equal(atap_settle_fd(ATAP_NO_TASK, &fd), ATAP_ENOTASK);
    assert_int_equal(fd, -1);
    join8(t);
    atap_release(t);
    assert_int_equal(atap_on_settle(copy, on_settle, seen_new(READ_NONE)), ATAP_ENOTASK);
    assert_int_equal(atap_settle_fd(copy, &fd), ATAP_ENOTASK);
    assert_int_equal(fd, -1);
}

/* ---- the fd ---------------------------------------------------------------- */

static int fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);

    return rc > 0 && (p.revents & POLLIN);
}

static void test_settle_fd_readable_once_settled(void **state)
{
    (void)state;
    gate *g = gate_new(8);
    atap_task t = spawn8(task_gated, g);
    int fd = -1, fl;
    unsigned char buf[8];

    assert_int_equal(atap_settle_fd(t, &fd), 0);
    assert_true(fd >= 0);
    assert_true((fl = fcntl(fd, F_GETFD)) >= 0 && (fl & FD_CLOEXEC));
    assert_true((fl = fcntl(fd, F_GETFL)) >= 0 && (fl & O_NONBLOCK));
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(10)));
    assert_false(readable(fd, 0));
    assert_false(readable(fd, 20));
    atomic_store(&g->open, 1);
    assert_true(readable(fd, 10000));
    /* Over by then: a join does not wait. */
    assert_int_equal(atap_try_join(t, buf, 8), 0);
    assert_true(readable(fd, 0)); /* and stays so */
    assert_true(readable(fd, 0));
    assert_true(read(fd, buf, sizeof buf) > 0);
    assert_false(readable(fd, 20)); /* written once */
    close(fd);
    atap_release(t);
}

static void test_settle_fd_already_settled_and_failed(void **state)
{
    (void)state;
    atap_task ok = spawn8(task_value, (void *)1), bad = spawn8(task_fail, NULL);
    int fa = -1, fb = -1;

    join8(ok);
    /* Settled: readable at once, or as soon as its run let go of it. */
    assert_int_equal(atap_settle_fd(ok, &fa), 0);
    assert_true(readable(fa, 10000));
    assert_int_equal(atap_settle_fd(bad, &fb), 0);
    assert_true(readable(fb, 10000));
    assert_int_equal(atap_state_of(bad), ATAP_FAILED);
    close(fa);
    close(fb);
    atap_release(ok);
    atap_release(bad);
}

/* Many fds on one task, some closed before it settles: no fd of the
 * runtime's is left behind. */
static void test_settle_fd_many_and_closed_early(void **state)
{
    (void)state;
    enum { N = 64 };
    int fds[N], before = fds_open();
    gate *g = gate_new(1);
    atap_task t = spawn8(task_gated, g);

    for (int i = 0; i < N; i++)
        assert_int_equal(atap_settle_fd(t, &fds[i]), 0);
    for (int i = 0; i < N; i += 2)
        close(fds[i]);
    atomic_store(&g->open, 1);
    for (int i = 1; i < N; i += 2) {
        assert_true(readable(fds[i], 10000));
        close(fds[i]);
    }
    atap_release(t);
    waited_to_live_back_at(__LINE__);
    for (uint64_t end = now_ns() + ATAP_SEC(10); before >= 0 && fds_open() > before;) {
        if (now_ns() > end)
            fail_msg("%d fds open, %d before", fds_open(), before);
        sleep_us(1000);
    }
}

/* ---- shutdown -------------------------------------------------------------- */

/* Callbacks of tasks the shutdown ends have run by the time it returns. */
static void test_settle_shutdown_calls_back(void **state)
{
    (void)state;
    seen *delayed = seen_new(READ_NONE), *running = seen_new(READ_NONE);
    atap_task d, r;
    int fd = -1;

    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_spawn(&d, task_value, (void *)1,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(60)}),
                     0);
    assert_int_equal(atap_spawn(&r, task_gated, gate_new(2), &(atap_spawn_opts){.out_size = 8}), 0);
    assert_int_equal(atap_on_settle(d, on_settle, delayed), 0);
    assert_int_equal(atap_settle_fd(d, &fd), 0);
    assert_int_equal(atap_on_settle(r, on_settle, running), 0);
    atap_release(d);
    atap_release(r);
    atomic_store(&g_release_all, 1); /* the gated task ends as the pool drains */
    assert_int_equal(atap_shutdown(), 0);
    atomic_store(&g_release_all, 0);
    assert_int_equal(atomic_load(&delayed->calls), 1);
    assert_int_equal(atomic_load(&delayed->state), ATAP_FAILED); /* a delay written off */
    assert_int_equal(atomic_load(&running->calls), 1);
    assert_int_equal(atomic_load(&running->state), ATAP_READY);
    assert_true(readable(fd, 0));
    close(fd);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_settle_ready_on_a_pool_thread),
        T(test_settle_callback_takes_the_output),
        T(test_settle_failed),
        T(test_settle_cancelled_pending),
        T(test_settle_cancelled_running),
        T(test_settle_timed_out),
        T(test_settle_repeat_end),
        T(test_settle_repeat_cancelled),
        T(test_settle_waiting_task_let_go),
        T(test_settle_already_settled),
        T(test_settle_released_before_settling),
        T(test_settle_many_on_one_task),
        T(test_settle_bad_arguments),
        T(test_settle_fd_readable_once_settled),
        T(test_settle_fd_already_settled_and_failed),
        T(test_settle_fd_many_and_closed_early),
        cmocka_unit_test(test_settle_shutdown_calls_back),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

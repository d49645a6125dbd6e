/*
 * Looking at the runtime from outside: atap_stats_format's one line, and
 * atap_state_of telling a task that holds no thread (parked, or waiting
 * for a give: ATAP_WAITING) from one queued (PENDING) or on a thread
 * (RUNNING).
 *
 * States are polled for: a task reaches a state some time after the call
 * that leads there, so each wait is bounded (seconds) and never a sleep of
 * a guessed length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "test_util.h"

/* Polls atap_state_of(t) until it reads want; the last state read. */
static atap_state state_becomes(atap_task t, atap_state want)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    atap_state st;

    while ((st = atap_state_of(t)) != want && now_ns() < end)
        sleep_us(200);
    return st;
}

#define assert_state_becomes(t, want)                                                              \
    do {                                                                                           \
        atap_state got_ = state_becomes((t), (want));                                              \
        if (got_ != (want))                                                                        \
            fail_msg("state %d, not %d (%s)", (int)got_, (int)(want), #want);                      \
    } while (0)

/* ---- atap_stats_format ----------------------------------------------------- */

static const char *const field_names[] = {
    "workers", "busy",       "blocking_threads", "blocking_busy", "queued",    "live",
    "slots",   "peak_slots", "peak_workers",     "deaths",        "completed", "aside",
    "ceiling", "peak_aside", "stacks",           "fired",         "fired_1ms", "fired_10ms"};

static void test_observe_stats_format_given_stats(void **state)
{
    (void)state;
    struct atap_pool_stats st = {.workers = 4,
                                 .busy = 1,
                                 .blocking_threads = 2,
                                 .blocking_busy = 0,
                                 .queued = 17,
                                 .live = 3,
                                 .slots = 64,
                                 .peak_slots = 128,
                                 .peak_workers = 6,
                                 .deaths = 1,
                                 .completed = 123456789012ull,
                                 .aside = 2,
                                 .ceiling = 1024,
                                 .peak_aside = 5,
                                 .stacks = 7,
                                 .fired = 40,
                                 .fired_1ms = 3,
                                 .fired_10ms = 1};
    const char *want = "workers=4 busy=1 blocking_threads=2 blocking_busy=0 queued=17 live=3 "
                       "slots=64 peak_slots=128 peak_workers=6 deaths=1 completed=123456789012 "
                       "aside=2 ceiling=1024 peak_aside=5 stacks=7 fired=40 fired_1ms=3 "
                       "fired_10ms=1";
    char buf[512];

    memset(buf, 'x', sizeof buf);
    int n = atap_stats_format(buf, sizeof buf, &st);
    assert_int_equal(n, (int)strlen(want));
    assert_string_equal(buf, want);

    /* like snprintf: the length it would have, and a cut line ends in NUL */
    assert_int_equal(atap_stats_format(NULL, 0, &st), n);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(atap_stats_format(buf, 10, &st), n);
    assert_int_equal(strlen(buf), 9);
    assert_memory_equal(buf, want, 9);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(atap_stats_format(buf, 1, &st), n);
    assert_int_equal(buf[0], '\0');
    assert_int_equal(buf[1], 'x');
    assert_int_equal(atap_stats_format(buf, (size_t)n, &st), n); /* one short: cut */
    assert_int_equal(strlen(buf), (size_t)n - 1);
    assert_int_equal(atap_stats_format(buf, (size_t)n + 1, &st), n); /* fits */
    assert_string_equal(buf, want);

    assert_int_equal(atap_stats_format(NULL, 5, &st), ATAP_EINVAL);
}

/* NULL stats: a snapshot now, with every field named in order; works with
 * or without a runtime. */
static void check_line_now(void)
{
    char buf[512];
    int n = atap_stats_format(buf, sizeof buf, NULL);

    assert_true(n > 0 && n < (int)sizeof buf);
    assert_int_equal(strlen(buf), (size_t)n);
    assert_null(strchr(buf, '\n'));
    const char *at = buf;
    for (size_t i = 0; i < sizeof field_names / sizeof field_names[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s%s=", i ? " " : "", field_names[i]);
        const char *hit = strstr(at, key);
        if (!hit || (i == 0 && hit != buf))
            fail_msg("\"%s\" not where expected in \"%s\"", key, buf);
        at = hit + strlen(key);
        assert_true(*at >= '0' && *at <= '9');
    }
}

static void test_observe_stats_format_now(void **state)
{
    (void)state;
    check_line_now(); /* stopped */
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < 2 && now_ns() < end)
        sleep_us(500);
    check_line_now();
    char buf[512];
    atap_stats_format(buf, sizeof buf, NULL);
    assert_non_null(strstr(buf, "workers=2 "));
    assert_int_equal(atap_shutdown(), 0);
}

/* ---- ATAP_WAITING ---------------------------------------------------------- */

/* Parks until a deadline far away (arg: its output size's worth is
 * written when it resumes), so that only a cancel ends it. */
static int task_park_long(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    if (atap_resumed(ctx))
        return 0;
    if (atap_park_until(ctx, atap_now() + ATAP_SEC(60)) != 0)
        return ATAP_EFAILED;
    return ATAP_PARKED;
}

/* Parks on the read end of a pipe (arg: the fd) until it is readable. */
static int task_park_fd(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    int fd = (int)(intptr_t)arg;
    char c;

    if (atap_resumed(ctx) && read(fd, &c, 1) == 1)
        return 0;
    if (atap_park_fd(ctx, fd, ATAP_READABLE, ATAP_FOREVER) != 0)
        return ATAP_EFAILED;
    return ATAP_PARKED;
}

/* Sleeps in the kernel (its thread held) until let go. */
static atomic_int let_go;

static int task_kernel_sleep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    while (!atomic_load(&let_go) && !released_all())
        if (atap_sleep_relaxed(ATAP_MS(1)) != 0)
            return ATAP_ECANCELLED;
    return 0;
}

static int task_input_plus_one(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t v = 0;
    size_t n = 0;
    const void *in = atap_input(ctx, &n);
    if (in && n == sizeof v)
        memcpy(&v, in, sizeof v);
    v++;
    if (out)
        memcpy(out, &v, sizeof v);
    return 0;
}

/* A parked task reads WAITING, not RUNNING, whether its park lives in the
 * slot (small output) or in a park record (a large one); a cancel still
 * ends it. */
static void test_observe_parked_until_reads_waiting(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 8, 24, 64, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        atap_task t;
        assert_int_equal(
            atap_spawn(&t, task_park_long, NULL, &(atap_spawn_opts){.out_size = sizes[i]}), 0);
        assert_state_becomes(t, ATAP_WAITING);
        assert_false(atap_finished(t));
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
        atap_state st = ATAP_PENDING;
        assert_int_equal(atap_wait(t, &st), 0);
        assert_int_equal(st, ATAP_CANCELLED);
        atap_release(t);
    }
}

static void test_observe_parked_fd_reads_waiting(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 64};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int fds[2];
        atap_task t;
        assert_int_equal(pipe(fds), 0);
        assert_int_equal(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
        assert_int_equal(atap_spawn(&t, task_park_fd, (void *)(intptr_t)fds[0],
                                    &(atap_spawn_opts){.out_size = sizes[i]}),
                         0);
        assert_state_becomes(t, ATAP_WAITING);
        assert_int_equal(write(fds[1], "x", 1), 1);
        assert_int_equal(atap_wait(t, NULL), 0);
        assert_int_equal(atap_state_of(t), ATAP_READY);
        atap_release(t);
        close(fds[0]);
        close(fds[1]);
    }
}

/* The built-in tasks that park: a sleep, a channel's receive. */
static void test_observe_builtin_parks_read_waiting(void **state)
{
    (void)state;
    atap_task s, r;
    atap_chan *ch;
    uint64_t v = 41, got = 0;

    assert_int_equal(atap_spawn_sleep(&s, ATAP_SEC(60), false, NULL), 0);
    assert_state_becomes(s, ATAP_WAITING);
    assert_int_equal(atap_cancel(s), 0);
    assert_int_equal(atap_state_of(s), ATAP_CANCELLED);
    atap_release(s);

    assert_int_equal(atap_chan_open(&ch, sizeof v, 0, NULL), 0);
    assert_int_equal(atap_chan_spawn_recv(&r, ch, NULL), 0);
    assert_state_becomes(r, ATAP_WAITING);
    assert_int_equal(atap_chan_send(ch, &v), 0);
    assert_int_equal(atap_join(r, &got, sizeof got), 0);
    assert_true(got == 41);
    assert_int_equal(atap_state_of(r), ATAP_READY);
    atap_release(r);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
}

/* A kernel wait holds its thread: RUNNING, not WAITING. */
static void test_observe_kernel_wait_reads_running(void **state)
{
    (void)state;
    atap_task t;

    atomic_store(&let_go, 0);
    assert_int_equal(atap_spawn(&t, task_kernel_sleep, NULL, NULL), 0);
    assert_state_becomes(t, ATAP_RUNNING);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(atap_state_of(t), ATAP_RUNNING);
        sleep_us(500);
    }
    atomic_store(&let_go, 1);
    assert_int_equal(atap_wait(t, NULL), 0);
    assert_int_equal(atap_state_of(t), ATAP_READY);
    atap_release(t);
}

/* A delayed task is queued for its time: PENDING, not WAITING. */
static void test_observe_delayed_reads_pending(void **state)
{
    (void)state;
    atap_task t;

    assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)3,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(60)}),
                     0);
    sleep_ms(5);
    assert_int_equal(atap_state_of(t), ATAP_PENDING);
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);
}

/* A task waiting for a give: WAITING until given; after its run, its
 * output stands (READY), as before; a series given again waits again. */
static void test_observe_waiting_for_give(void **state)
{
    (void)state;
    atap_task t;
    uint64_t in = 9, out = 0;

    assert_int_equal(atap_spawn_waiting(&t, task_input_plus_one, NULL, sizeof in,
                                        &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_state_becomes(t, ATAP_WAITING);
    sleep_ms(5);
    assert_int_equal(atap_state_of(t), ATAP_WAITING); /* nothing runs it */
    assert_false(atap_finished(t));
    assert_int_equal(atap_try_join(t, &out, sizeof out), ATAP_ENOTREADY);
    assert_int_equal(atap_give(t, &in, sizeof in), 0);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    assert_true(out == 10);
    assert_int_equal(atap_state_of(t), ATAP_READY);
    atap_release(t);

    /* a waiting repeat series (two runs a give) */
    assert_int_equal(
        atap_spawn_waiting(&t, task_input_plus_one, NULL, sizeof in,
                           &(atap_spawn_opts){.out_size = 8, .kind = ATAP_REPEAT, .runs = 2}),
        0);
    assert_state_becomes(t, ATAP_WAITING);
    assert_int_equal(atap_give(t, &in, sizeof in), 0);
    assert_state_becomes(t, ATAP_READY);
    atap_release(t);
}

/* A receiver waits for its members' outputs: WAITING until they come. */
static void test_observe_receiver_reads_waiting(void **state)
{
    (void)state;
    atap_task m, r;
    uint64_t in = 4, out = 0;

    assert_int_equal(atap_spawn_waiting(&m, task_input_plus_one, NULL, sizeof in,
                                        &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_int_equal(
        atap_receive_all(&r, task_input_plus_one, NULL, &m, 1, &(atap_spawn_opts){.out_size = 8}),
        0);
    assert_state_becomes(m, ATAP_WAITING);
    assert_state_becomes(r, ATAP_WAITING);
    assert_int_equal(atap_give(m, &in, sizeof in), 0);
    assert_int_equal(atap_join(r, &out, sizeof out), 0);
    assert_true(out == 6);
    assert_int_equal(atap_state_of(r), ATAP_READY);
    atap_release(r);
    atap_release(m);
}

/* Stale handles and the empty handle still read FAILED. */
static void test_observe_no_task_reads_failed(void **state)
{
    (void)state;
    atap_task t = spawn8(task_value, (void *)(uintptr_t)1);
    assert_true(join8(t) == 1);
    atap_release(t);
    assert_int_equal(atap_state_of(t), ATAP_FAILED);
    assert_int_equal(atap_state_of(ATAP_NO_TASK), ATAP_FAILED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_observe_stats_format_given_stats),
        cmocka_unit_test_teardown(test_observe_stats_format_now, teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_parked_until_reads_waiting, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_parked_fd_reads_waiting, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_builtin_parks_read_waiting, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_kernel_wait_reads_running, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_delayed_reads_pending, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_waiting_for_give, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_receiver_reads_waiting, setup_runtime,
                                        teardown_runtime),
        cmocka_unit_test_setup_teardown(test_observe_no_task_reads_failed, setup_runtime,
                                        teardown_runtime),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * One-shot tasks: join / take and their timed and non-blocking forms, bad
 * input, failure, cancel, dup, self, block, blocking tasks, priorities,
 * helping (fib) and thread death.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <limits.h>

#include "test_util.h"

#define SENTINEL 0xdeadbeefcafef00dull

/* ---- join and take ------------------------------------------------------ */

static void test_tasks_join_returns_output(void **state)
{
    (void)state;
    enum { N = 256 };
    atap_task ts[N];
    for (int i = 0; i < N; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(i * 1000003u + 17));
    for (int i = N - 1; i >= 0; i--) {
        assert_true(join8(ts[i]) == (uint64_t)(i * 1000003u + 17));
        /* joins copy: the output stays for the next reader */
        assert_true(join8(ts[i]) == (uint64_t)(i * 1000003u + 17));
        assert_int_equal(atap_state_of(ts[i]), ATAP_READY);
        assert_true(atap_finished(ts[i]));
        atap_release(ts[i]);
    }
}

static void test_tasks_join_for_deadline(void **state)
{
    (void)state;
    gate *g = gate_new(31);
    atap_task t = spawn8(task_gated, g);
    uint64_t v = SENTINEL;
    static const uint64_t waits[] = {ATAP_MS(1), ATAP_MS(20), ATAP_MS(60)};
    for (size_t i = 0; i < 3; i++) {
        uint64_t t0 = now_ns();
        assert_int_equal(atap_join_for(t, &v, sizeof v, waits[i]), ATAP_ENOTREADY);
        uint64_t el = now_ns() - t0;
        assert_true(el + ATAP_MS(1) >= waits[i]); /* it did wait */
        assert_true(el < ATAP_SEC(5));
        t0 = now_ns();
        assert_int_equal(atap_take_for(t, &v, sizeof v, waits[i]), ATAP_ENOTREADY);
        el = now_ns() - t0;
        assert_true(el + ATAP_MS(1) >= waits[i]);
        assert_true(el < ATAP_SEC(5));
    }
    /* a zero timeout is a try */
    uint64_t t0 = now_ns();
    assert_int_equal(atap_join_for(t, &v, sizeof v, 0), ATAP_ENOTREADY);
    assert_int_equal(atap_take_for(t, &v, sizeof v, 0), ATAP_ENOTREADY);
    assert_true(now_ns() - t0 < ATAP_SEC(1));
    assert_true(v == SENTINEL);
    assert_false(atap_finished(t));

    /* giving up left the output: a take still gets it */
    atomic_store(&g->open, 1);
    assert_int_equal(atap_take(t, &v, sizeof v), 0);
    assert_true(v == 31);
    atap_release(t);
}

static int task_slow_value(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    sleep_ms(50);
    uint64_t v = (uint64_t)(uintptr_t)arg;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_tasks_join_for_returns_on_settle(void **state)
{
    (void)state;
    for (int take = 0; take < 2; take++) {
        atap_task t = spawn8(task_slow_value, (void *)(uintptr_t)(900 + take));
        uint64_t v = 0;
        uint64_t t0 = now_ns();
        if (take)
            assert_int_equal(atap_take_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
        else
            assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
        uint64_t el = now_ns() - t0;
        assert_true(v == (uint64_t)(900 + take));
        assert_true(el < ATAP_SEC(5));
        atap_release(t);
    }
    /* a huge timeout must not overflow into "already past" */
    atap_task t = spawn8(task_slow_value, (void *)(uintptr_t)7);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, UINT64_MAX), 0);
    assert_true(v == 7);
    atap_release(t);
}

static int task_sleep10(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    sleep_ms(10);
    return 0;
}

/* Waits 20 ms for the task in arg, with 300 slow tasks of its own queued:
 * out gets the code and the time the wait took. */
static int task_join_for_busy(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    enum { N = 300 };
    atap_task *b = arg, kids[N];
    uint64_t v, res[2];
    for (int i = 0; i < N; i++)
        if (atap_spawn(&kids[i], task_sleep10, NULL, NULL) != 0)
            return 1;
    uint64_t t0 = now_ns();
    res[0] = (uint64_t)(int64_t)atap_join_for(*b, &v, sizeof v, ATAP_MS(20));
    res[1] = now_ns() - t0;
    for (int i = 0; i < N; i++)
        atap_release(kids[i]);
    memcpy(out, res, sizeof res);
    return 0;
}

/* A timed join inside a task helps with queued work while it waits, but
 * not past its deadline: it used to run every queued task first. */
static void test_tasks_join_for_inside_task_keeps_deadline(void **state)
{
    (void)state;
    static atap_task b;
    gate *g = gate_new(5);
    b = spawn8(task_gated, g); /* holds a worker until the gate opens */
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(20)));
    atap_task p;
    uint64_t res[2];
    assert_int_equal(
        atap_spawn(&p, task_join_for_busy, &b, &(atap_spawn_opts){.out_size = sizeof res}), 0);
    assert_int_equal(atap_join(p, res, sizeof res), 0);
    assert_int_equal((int)(int64_t)res[0], ATAP_ENOTREADY);
    assert_true(res[1] + ATAP_MS(1) >= ATAP_MS(20)); /* it did wait */
    assert_true(res[1] < ATAP_MS(500));              /* not the 3 s of queued work */
    atap_release(p);
    atomic_store(&g->open, 1);
    assert_true(join8(b) == 5);
    atap_release(b);
}

static void test_tasks_try_join_running(void **state)
{
    (void)state;
    gate *g = gate_new(55);
    atap_task t = spawn8(task_gated, g);
    uint64_t v = SENTINEL;
    assert_int_equal(atap_try_join(t, &v, sizeof v), ATAP_ENOTREADY);
    assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_ENOTREADY);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(20)));
    assert_int_equal(atap_state_of(t), ATAP_RUNNING);
    assert_false(atap_finished(t));
    assert_int_equal(atap_try_join(t, &v, sizeof v), ATAP_ENOTREADY);
    assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_ENOTREADY);
    assert_true(v == SENTINEL);
    atomic_store(&g->open, 1);
    assert_true(join8(t) == 55);
    assert_int_equal(atap_try_join(t, &v, sizeof v), 0);
    assert_true(v == 55);
    v = 0;
    assert_int_equal(atap_try_take(t, &v, sizeof v), 0);
    assert_true(v == 55);
    assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_ETAKEN);
    atap_release(t);
}

static void test_tasks_take_moves_once(void **state)
{
    (void)state;
    for (int how = 0; how < 3; how++) {
        atap_task t = spawn8(task_value, (void *)(uintptr_t)(4321 + how));
        uint64_t v = 0;
        if (how == 0) {
            assert_int_equal(atap_take(t, &v, sizeof v), 0);
        } else if (how == 1) {
            assert_int_equal(atap_take_for(t, &v, sizeof v, ATAP_SEC(20)), 0);
        } else {
            assert_int_equal(atap_wait(t, NULL), 0);
            assert_int_equal(atap_try_take(t, &v, sizeof v), 0);
        }
        assert_true(v == (uint64_t)(4321 + how));
        v = SENTINEL;
        assert_int_equal(atap_take(t, &v, sizeof v), ATAP_ETAKEN);
        assert_int_equal(atap_take_for(t, &v, sizeof v, ATAP_MS(5)), ATAP_ETAKEN);
        assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_ETAKEN);
        assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ETAKEN);
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_MS(5)), ATAP_ETAKEN);
        assert_int_equal(atap_try_join(t, &v, sizeof v), ATAP_ETAKEN);
        assert_true(v == SENTINEL);
        assert_int_equal(atap_state_of(t), ATAP_TAKEN);
        assert_true(atap_finished(t));
        atap_state st = ATAP_PENDING;
        assert_int_equal(atap_wait(t, &st), 0);
        assert_true(st == ATAP_TAKEN || st == ATAP_READY);
        /* a dup sees the same: taken */
        atap_task d;
        assert_int_equal(atap_dup(t, &d), 0);
        assert_int_equal(atap_join(d, &v, sizeof v), ATAP_ETAKEN);
        atap_release(d);
        /* cancel after a take changes nothing */
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_state_of(t), ATAP_TAKEN);
        atap_release(t);
    }
}

/* every reader with a size that is not out_size: EINVAL, buffer untouched,
 * output not consumed */
static void check_wrong_sizes(atap_task t)
{
    uint64_t buf[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    static const size_t bad[] = {1, 4, 7, 9, 16, 32};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t sz = bad[i];
        assert_int_equal(atap_join(t, buf, sz), ATAP_EINVAL);
        assert_int_equal(atap_join_for(t, buf, sz, ATAP_MS(1)), ATAP_EINVAL);
        assert_int_equal(atap_try_join(t, buf, sz), ATAP_EINVAL);
        assert_int_equal(atap_take(t, buf, sz), ATAP_EINVAL);
        assert_int_equal(atap_take_for(t, buf, sz, ATAP_MS(1)), ATAP_EINVAL);
        assert_int_equal(atap_try_take(t, buf, sz), ATAP_EINVAL);
    }
    assert_int_equal(atap_join(t, NULL, 0), ATAP_EINVAL);
    assert_int_equal(atap_take(t, buf, 0), ATAP_EINVAL);
    /* NULL out with the right, nonzero size */
    assert_int_equal(atap_join(t, NULL, 8), ATAP_EINVAL);
    assert_int_equal(atap_join_for(t, NULL, 8, ATAP_MS(1)), ATAP_EINVAL);
    assert_int_equal(atap_try_join(t, NULL, 8), ATAP_EINVAL);
    assert_int_equal(atap_take(t, NULL, 8), ATAP_EINVAL);
    assert_int_equal(atap_take_for(t, NULL, 8, ATAP_MS(1)), ATAP_EINVAL);
    assert_int_equal(atap_try_take(t, NULL, 8), ATAP_EINVAL);
    for (int i = 0; i < 4; i++)
        assert_true(buf[i] == SENTINEL);
}

static void test_tasks_wrong_size_einval(void **state)
{
    (void)state;
    /* settled */
    atap_task t = spawn8(task_value, (void *)(uintptr_t)99);
    assert_true(join8(t) == 99);
    check_wrong_sizes(t);
    uint64_t v = 0;
    assert_int_equal(atap_take(t, &v, sizeof v), 0); /* not consumed */
    assert_true(v == 99);
    atap_release(t);

    /* still pending: the size is known at spawn, so no waiting first */
    gate *g = gate_new(98);
    atap_task p = spawn8(task_gated, g);
    uint64_t t0 = now_ns();
    uint64_t buf[2] = {SENTINEL, SENTINEL};
    assert_int_equal(atap_join_for(p, buf, 16, ATAP_SEC(10)), ATAP_EINVAL);
    assert_int_equal(atap_take_for(p, buf, 4, ATAP_SEC(10)), ATAP_EINVAL);
    assert_int_equal(atap_join_for(p, NULL, 8, ATAP_SEC(10)), ATAP_EINVAL);
    assert_true(now_ns() - t0 < ATAP_SEC(5));
    assert_true(buf[0] == SENTINEL && buf[1] == SENTINEL);
    atomic_store(&g->open, 1);
    assert_true(join8(p) == 98);
    atap_release(p);
}

static void test_tasks_spawn_bad_args(void **state)
{
    (void)state;
    atap_spawn_opts o = {.out_size = 8};
    assert_int_equal(atap_spawn(NULL, task_value, NULL, &o), ATAP_EINVAL);
    assert_int_equal(atap_spawn(NULL, task_value, NULL, NULL), ATAP_EINVAL);
    atap_task t = {.id = 1234};
    assert_int_equal(atap_spawn(&t, NULL, NULL, &o), ATAP_EINVAL);
    assert_true(t.id == 0);
    t.id = 1234;
    assert_int_equal(atap_spawn(&t, NULL, NULL, NULL), ATAP_EINVAL);
    assert_true(t.id == 0);

    static const int bad_prio[] = {128, -129, 1000, -1000, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof bad_prio / sizeof bad_prio[0]; i++) {
        t.id = 1234;
        o.priority = bad_prio[i];
        assert_int_equal(atap_spawn(&t, task_value, NULL, &o), ATAP_EINVAL);
        assert_true(t.id == 0);
    }
    static const int good_prio[] = {ATAP_PRIORITY_MIN, -65, -64, -1, 0, 1, 63, 64,
                                    ATAP_PRIORITY_MAX};
    for (size_t i = 0; i < sizeof good_prio / sizeof good_prio[0]; i++) {
        o.priority = good_prio[i];
        assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)i, &o), 0);
        assert_true(join8(t) == i);
        atap_release(t);
    }
    /* nothing leaked into the table */
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static void test_tasks_spawn_huge_out_size(void **state)
{
    (void)state;
    static const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, (size_t)1 << 33, (size_t)1 << 32,
                                  ((size_t)1 << 32) + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        atap_task t = {.id = 1234};
        int rc = atap_spawn(&t, task_value, NULL, &(atap_spawn_opts){.out_size = huge[i]});
        assert_int_equal(rc, ATAP_EINVAL);
        assert_true(t.id == 0);
    }
    /* the runtime is fine after */
    atap_task t = spawn8(task_value, (void *)(uintptr_t)3);
    assert_true(join8(t) == 3);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* ---- failure and wait -------------------------------------------------- */

static int task_fail_with(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = 1;
    memcpy(out, &v, sizeof v); /* written, but never published */
    return (int)(intptr_t)arg;
}

static void test_tasks_nonzero_return_fails(void **state)
{
    (void)state;
    static const int rets[] = {-1, 2, 42, -10008, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof rets / sizeof rets[0]; i++) {
        atap_task t = spawn8(task_fail_with, (void *)(intptr_t)rets[i]);
        uint64_t v = SENTINEL;
        assert_int_equal(atap_join(t, &v, sizeof v), ATAP_EFAILED);
        assert_int_equal(atap_try_join(t, &v, sizeof v), ATAP_EFAILED);
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_MS(1)), ATAP_EFAILED);
        assert_int_equal(atap_take(t, &v, sizeof v), ATAP_EFAILED);
        assert_int_equal(atap_try_take(t, &v, sizeof v), ATAP_EFAILED);
        assert_true(v == SENTINEL);
        assert_int_equal(atap_state_of(t), ATAP_FAILED);
        assert_true(atap_finished(t));
        atap_state st = ATAP_READY;
        assert_int_equal(atap_wait(t, &st), 0);
        assert_int_equal(st, ATAP_FAILED);
        /* cancel after failure leaves it failed */
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_state_of(t), ATAP_FAILED);
        assert_int_equal(atap_join(t, &v, sizeof v), ATAP_EFAILED);
        atap_release(t);
    }
    /* NULL opts: no output */
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_fail, NULL, NULL), 0);
    assert_int_equal(atap_join(t, NULL, 0), ATAP_EFAILED);
    atap_release(t);
}

/* A run that fails with an ATAP_E* code or -ENOMEM hands that code to its
 * readers, but for ATAP_ENOTREADY, which a reader could only take for "not settled
 * yet" (a join would wait for a run that never comes): that one reads
 * ATAP_EFAILED. */
static void test_tasks_fail_code_reaches_readers(void **state)
{
    (void)state;
    static const int rets[] = {ATAP_ECLOSED, ATAP_ENOTREADY, ATAP_ETIMEDOUT, -ENOMEM};
    static const int want[] = {ATAP_ECLOSED, ATAP_EFAILED, ATAP_ETIMEDOUT, -ENOMEM};
    for (size_t i = 0; i < sizeof rets / sizeof rets[0]; i++) {
        atap_task t = spawn8(task_fail_with, (void *)(intptr_t)rets[i]);
        uint64_t v = SENTINEL;
        atap_state st = ATAP_READY;
        assert_int_equal(atap_wait(t, &st), 0);
        assert_int_equal(st, ATAP_FAILED);
        assert_int_equal(atap_try_join(t, &v, sizeof v), want[i]);
        assert_int_equal(atap_try_take(t, &v, sizeof v), want[i]);
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), want[i]);
        assert_int_equal(atap_join(t, &v, sizeof v), want[i]);
        assert_int_equal(atap_take(t, &v, sizeof v), want[i]);
        assert_true(v == SENTINEL);
        atap_release(t);
    }
}

static void test_tasks_wait_gives_state(void **state)
{
    (void)state;
    atap_task ok = spawn8(task_slow_value, (void *)(uintptr_t)1);
    atap_state st = ATAP_FAILED;
    assert_int_equal(atap_wait(ok, &st), 0);
    assert_int_equal(st, ATAP_READY);
    assert_true(atap_finished(ok));
    assert_int_equal(atap_wait(ok, NULL), 0);
    assert_true(join8(ok) == 1); /* wait did not read it */

    atap_task bad = spawn8(task_fail_with, (void *)(intptr_t)-3);
    assert_int_equal(atap_wait(bad, &st), 0);
    assert_int_equal(st, ATAP_FAILED);

    gate *g = gate_new(0);
    atap_task c = spawn8(task_gated, g);
    assert_int_equal(atap_cancel(c), 0);
    atomic_store(&g->open, 1);
    assert_int_equal(atap_wait(c, &st), 0);
    assert_int_equal(st, ATAP_CANCELLED);

    atap_release(ok);
    atap_release(bad);
    atap_release(c);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* ---- cancel ------------------------------------------------------------- */

static atomic_int g_target_ran;

static int task_target(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    atomic_fetch_add(&g_target_ran, 1);
    uint64_t v = 1;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_tasks_cancel_queued_never_runs(void **state)
{
    (void)state;
    atomic_store(&g_target_ran, 0);
    blockers *bl = blockers_start();
    enum { N = 16 };
    atap_task ts[N];
    for (int i = 0; i < N; i++) {
        ts[i] = spawn8(task_target, NULL);
        assert_int_equal(atap_cancel(ts[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        /* listeners read CANCELLED at once, while the pool is still busy */
        uint64_t v = SENTINEL;
        assert_int_equal(atap_state_of(ts[i]), ATAP_CANCELLED);
        assert_true(atap_finished(ts[i]));
        assert_int_equal(atap_join(ts[i], &v, sizeof v), ATAP_ECANCELLED);
        assert_int_equal(atap_try_join(ts[i], &v, sizeof v), ATAP_ECANCELLED);
        assert_int_equal(atap_take(ts[i], &v, sizeof v), ATAP_ECANCELLED);
        assert_true(v == SENTINEL);
        atap_state st = ATAP_READY;
        assert_int_equal(atap_wait(ts[i], &st), 0);
        assert_int_equal(st, ATAP_CANCELLED);
        assert_int_equal(atap_cancel(ts[i]), 0); /* again: nothing left to do */
    }
    blockers_stop(bl);
    /* the pool runs past where they were queued */
    atap_task after = spawn8(task_value, (void *)(uintptr_t)6);
    assert_true(join8(after) == 6);
    atap_release(after);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_state_of(ts[i]), ATAP_CANCELLED);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_int_equal(atomic_load(&g_target_ran), 0);
}

typedef struct spin_cancel {
    atomic_int started;
    atomic_int saw_cancel;
    atomic_int ended;
} spin_cancel;

static int task_spin_until_cancelled(atap_ctx *ctx, void *arg, void *out)
{
    spin_cancel *s = arg;
    atomic_store(&s->started, 1);
    while (!atap_cancelled(ctx) && !released_all())
        sleep_us(100);
    if (atap_cancelled(ctx))
        atomic_store(&s->saw_cancel, 1);
    uint64_t v = 777;
    memcpy(out, &v, sizeof v);
    atomic_store(&s->ended, 1);
    return 0;
}

static void test_tasks_cancel_running_drops_output(void **state)
{
    (void)state;
    static spin_cancel s; /* static: the task may outlive a failed test */
    atomic_store(&s.started, 0);
    atomic_store(&s.saw_cancel, 0);
    atomic_store(&s.ended, 0);
    atap_task t = spawn8(task_spin_until_cancelled, &s);
    atap_task d;
    assert_int_equal(atap_dup(t, &d), 0);
    assert_true(wait_atomic_at_least(&s.started, 1, ATAP_SEC(20)));
    assert_int_equal(atap_state_of(t), ATAP_RUNNING);
    assert_int_equal(atap_cancel(t), 0);
    uint64_t v = SENTINEL;
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ECANCELLED);
    assert_true(wait_atomic_at_least(&s.ended, 1, ATAP_SEC(20)));
    assert_int_equal(atomic_load(&s.saw_cancel), 1);
    /* the run returned 0 with an output, but it was dropped */
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ECANCELLED);
    assert_int_equal(atap_take(t, &v, sizeof v), ATAP_ECANCELLED);
    assert_int_equal(atap_join(d, &v, sizeof v), ATAP_ECANCELLED);
    assert_true(v == SENTINEL);
    assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
    assert_int_equal(atap_state_of(d), ATAP_CANCELLED);
    atap_state st = ATAP_READY;
    assert_int_equal(atap_wait(d, &st), 0);
    assert_int_equal(st, ATAP_CANCELLED);
    atap_release(t);
    atap_release(d);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static void test_tasks_cancel_after_ready_keeps_output(void **state)
{
    (void)state;
    atap_task t = spawn8(task_value, (void *)(uintptr_t)1357);
    assert_true(join8(t) == 1357);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_state_of(t), ATAP_READY);
    assert_true(join8(t) == 1357);
    atap_state st = ATAP_PENDING;
    assert_int_equal(atap_wait(t, &st), 0);
    assert_int_equal(st, ATAP_READY);
    uint64_t v = 0;
    assert_int_equal(atap_take(t, &v, sizeof v), 0);
    assert_true(v == 1357);
    atap_release(t);
}

static int task_check_cancelled_false(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t v = atap_cancelled(ctx) ? 1 : 0;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_tasks_cancelled_flag(void **state)
{
    (void)state;
    assert_false(atap_cancelled(NULL));
    atap_task t = spawn8(task_check_cancelled_false, NULL);
    assert_true(join8(t) == 0);
    atap_release(t);
}

/* ---- handles ------------------------------------------------------------ */

static void test_tasks_dup_listener(void **state)
{
    (void)state;
    gate *g = gate_new(2468);
    atap_task t = spawn8(task_gated, g);
    atap_task d1, d2;
    assert_int_equal(atap_dup(t, NULL), ATAP_EINVAL);
    assert_int_equal(atap_dup(t, &d1), 0);
    assert_int_equal(atap_dup(d1, &d2), 0);
    /* all name the same task */
    assert_true(d1.id == t.id);
    assert_true(d2.id == t.id);
    atap_release(t);
    atomic_store(&g->open, 1);
    assert_true(join8(d1) == 2468);
    atap_release(d1);
    assert_true(join8(d2) == 2468);
    uint64_t v = 0;
    assert_int_equal(atap_take(d2, &v, sizeof v), 0);
    assert_true(v == 2468);
    atap_release(d2);
    assert_int_equal(atap_join(d2, &v, sizeof v), ATAP_ENOTASK);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* Outputs over the slot's 16 bytes and up to 64 live in blocks a worker
 * keeps and hands out again: children spawned inside a task, each output
 * written whole, read back whole by a join or a take, released in every
 * order, many rounds over the same blocks; and the same sizes from outside
 * the pool. A block handed out while still in use would show as another
 * child's bytes. */
#define OB_SIZES 5
static const size_t ob_sizes[OB_SIZES] = {17, 24, 40, 48, 64};

static int task_ob_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uintptr_t v = (uintptr_t)arg;
    size_t n = ob_sizes[v % OB_SIZES];

    for (size_t i = 0; i < n; i++)
        ((unsigned char *)out)[i] = (unsigned char)(v * 31u + i);
    return 0;
}

static bool ob_check(const unsigned char *b, uintptr_t v)
{
    for (size_t i = 0; i < ob_sizes[v % OB_SIZES]; i++)
        if (b[i] != (unsigned char)(v * 31u + i))
            return false;
    return true;
}

static int task_ob_parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atomic_int *bad = arg;
    enum { KIDS = 300 };
    atap_task k[KIDS];
    unsigned char buf[64];

    for (int round = 0; round < 20; round++) {
        for (uintptr_t i = 0; i < KIDS; i++) {
            uintptr_t v = (uintptr_t)round * KIDS + i;
            if (atap_spawn(&k[i], task_ob_child, (void *)v,
                           &(atap_spawn_opts){.out_size = ob_sizes[v % OB_SIZES]}) != 0) {
                atomic_fetch_add(bad, 1);
                k[i] = ATAP_NO_TASK;
            }
        }
        for (int j = 0; j < KIDS; j++) {
            int i = round % 2 ? KIDS - 1 - j : j; /* both orders */
            uintptr_t v = (uintptr_t)round * KIDS + (uintptr_t)i;
            size_t n = ob_sizes[v % OB_SIZES];
            int rc = (i % 3 == 0) ? atap_take(k[i], buf, n) : atap_join(k[i], buf, n);
            if (rc != 0 || !ob_check(buf, v))
                atomic_fetch_add(bad, 1);
            atap_release(k[i]);
        }
    }
    return 0;
}

static void test_tasks_output_blocks(void **state)
{
    (void)state;
    atomic_int bad = 0;
    atap_task p[2];
    unsigned char buf[64];

    for (int i = 0; i < 2; i++)
        assert_int_equal(atap_spawn(&p[i], task_ob_parent, &bad, NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(atap_join(p[i], NULL, 0), 0);
        atap_release(p[i]);
    }
    assert_int_equal(atomic_load(&bad), 0);
    for (uintptr_t v = 0; v < 50; v++) { /* from outside the pool */
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_ob_child, (void *)v,
                                    &(atap_spawn_opts){.out_size = ob_sizes[v % OB_SIZES]}),
                         0);
        assert_int_equal(atap_join(t, buf, ob_sizes[v % OB_SIZES]), 0);
        assert_true(ob_check(buf, v));
        atap_release(t);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* An output over the slot's bytes gets its memory when its task first
 * runs (a queued task holds none: test_memory). None to be had then: the
 * spawn had said 0, so the task fails and its readers get -ENOMEM, nothing
 * runs, nothing leaks; the next one gets its block. From outside the pool
 * and from a task, with an output over the pool's kept blocks (so the
 * block is a malloc, where the owed failure lands). */
enum { BIG_OUT = 200 };

static int task_big_out(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atomic_fetch_add((atomic_int *)arg, 1);
    memset(out, 0x5a, BIG_OUT);
    return 0;
}

/* From a task: its child's join's code (the child spawned with a failure
 * owed), into out. */
static int task_spawns_big_out(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atap_task t;
    unsigned char buf[BIG_OUT];
    int rc;

    atap_inject_alloc_failures(1);
    rc = atap_spawn(&t, task_big_out, arg, &(atap_spawn_opts){.out_size = BIG_OUT});
    if (rc == 0) {
        rc = atap_join(t, buf, sizeof buf);
        atap_release(t);
    }
    atap_inject_alloc_failures(0);
    memcpy(out, &rc, sizeof rc);
    return 0;
}

static void test_tasks_output_memory_refused_at_first_run(void **state)
{
    (void)state;
    atomic_int runs = 0;
    unsigned char buf[BIG_OUT];
    atap_task t;
    int rc = 1;

    atap_inject_alloc_failures(1);
    assert_int_equal(atap_spawn(&t, task_big_out, &runs, &(atap_spawn_opts){.out_size = BIG_OUT}),
                     0);
    memset(buf, 0, sizeof buf);
    assert_int_equal(atap_join(t, buf, sizeof buf), -ENOMEM);
    assert_int_equal(atap_take(t, buf, sizeof buf), -ENOMEM);
    assert_int_equal(atap_state_of(t), ATAP_FAILED);
    assert_true(buf[0] == 0 && buf[BIG_OUT - 1] == 0);
    atap_release(t);
    atap_inject_alloc_failures(0);
    assert_int_equal(atomic_load(&runs), 0);

    assert_int_equal(
        atap_spawn(&t, task_spawns_big_out, &runs, &(atap_spawn_opts){.out_size = sizeof rc}), 0);
    assert_int_equal(atap_join(t, &rc, sizeof rc), 0);
    assert_int_equal(rc, -ENOMEM);
    atap_release(t);
    assert_int_equal(atomic_load(&runs), 0);

    /* the next one runs and reads its whole output */
    assert_int_equal(atap_spawn(&t, task_big_out, &runs, &(atap_spawn_opts){.out_size = BIG_OUT}),
                     0);
    assert_int_equal(atap_join(t, buf, sizeof buf), 0);
    assert_true(buf[0] == 0x5a && buf[BIG_OUT - 1] == 0x5a);
    atap_release(t);
    assert_int_equal(atomic_load(&runs), 1);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* A task takes 2^20 - 1 handles; the next dup is refused with EINVAL (never
 * a wrap into the count beside it), and a handle released twice drops
 * nothing of the runtime's: the task still runs and reads its output. */
static void test_tasks_dup_limit(void **state)
{
    (void)state;
    enum { MAX_HANDLES = (1 << 20) - 1 };
    gate *g = gate_new(97);
    atap_task t = spawn8(task_gated, g), copy;

    for (int i = 1; i < MAX_HANDLES; i++)
        if (atap_dup(t, &copy) != 0)
            fail_msg("dup %d of %d refused", i, MAX_HANDLES - 1);
    assert_int_equal(atap_dup(t, &copy), ATAP_EINVAL);
    assert_true(copy.id == ATAP_NO_TASK.id);
    for (int i = 1; i < MAX_HANDLES; i++)
        atap_release(t);
    assert_int_equal(atap_dup(t, &copy), 0); /* room again */
    atap_release(copy);
    atomic_store(&g->open, 1);
    assert_true(join8(t) == 97);
    atap_release(t);
    atap_release(t); /* a second release of the last handle: ignored */
    assert_int_equal(atap_try_join(t, NULL, 0), ATAP_ENOTASK);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static int task_self(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t id = atap_self(ctx).id;
    memcpy(out, &id, sizeof id);
    return 0;
}

static void test_tasks_self_is_handle(void **state)
{
    (void)state;
    assert_true(atap_self(NULL).id == ATAP_NO_TASK.id);
    for (int i = 0; i < 32; i++) {
        atap_task t = spawn8(task_self, NULL);
        assert_true(join8(t) == t.id);
        atap_release(t);
    }
    atap_task b;
    assert_int_equal(
        atap_spawn(&b, task_self, NULL, &(atap_spawn_opts){.out_size = 8, .blocking = true}), 0);
    assert_true(join8(b) == b.id);
    atap_release(b);
}

/* Joins, waits on and takes its own handle: each must refuse, not hang. */
static int task_join_self(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    uint64_t v = 0;
    atap_state st;
    int rc = atap_join(atap_self(ctx), &v, sizeof v);
    CHECK(rc == ATAP_EINVAL);
    CHECK(atap_join_for(atap_self(ctx), &v, sizeof v, ATAP_MS(10)) == ATAP_EINVAL);
    CHECK(atap_take(atap_self(ctx), &v, sizeof v) == ATAP_EINVAL);
    CHECK(atap_wait(atap_self(ctx), &st) == ATAP_EINVAL);
    v = 7;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_tasks_join_self_einval(void **state)
{
    (void)state;
    atap_task t = spawn8(task_join_self, NULL);
    assert_true(join8(t) == 7);
    atap_release(t);
    atap_task b;
    assert_int_equal(
        atap_spawn(&b, task_join_self, NULL, &(atap_spawn_opts){.out_size = 8, .blocking = true}),
        0);
    assert_true(join8(b) == 7);
    atap_release(b);
    assert_no_failures();
}

/* Each level spawns the next and joins it: past the help depth a worker
 * can only wait, so the pool must bring in more workers rather than stall. */
static int task_deep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t n = (uint64_t)(uintptr_t)arg, below = 0;
    if (n > 0) {
        atap_task t;
        if (atap_spawn(&t, task_deep, (void *)(uintptr_t)(n - 1),
                       &(atap_spawn_opts){.out_size = sizeof below}) != 0)
            return -1;
        int rc = atap_join(t, &below, sizeof below);
        atap_release(t);
        if (rc != 0)
            return -1;
    }
    below++;
    memcpy(out, &below, sizeof below);
    return 0;
}

static void test_tasks_deep_recursion_runs_on_one_stack(void **state)
{
    (void)state;
    uint64_t levels = 1000, v = 0;
    atap_task t = spawn8(task_deep, (void *)(uintptr_t)levels);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(60)), 0);
    assert_true(v == levels + 1);
    atap_release(t);
    struct atap_pool_stats st = pool_stats();
    /* Each level runs its child, still queued, on its own stack: the
     * 1001 frames fit on one worker's, and the pool needs no more. (Longer
     * chains: test_waits.c.) */
    if (st.peak_workers > cores() + 1)
        fail_msg("1,000 nested joins took %zu workers", st.peak_workers);
}

/* ---- block ------------------------------------------------------------- */

typedef struct block_out {
    pthread_t thread;
    uint64_t self;
    int cancelled;
} block_out;

static int task_where(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    block_out o = {
        .thread = pthread_self(), .self = atap_self(ctx).id, .cancelled = atap_cancelled(ctx)};
    memcpy(out, &o, sizeof o);
    return 0;
}

static void check_block_here(void)
{
    block_out o;
    memset(&o, 0, sizeof o);
    o.self = SENTINEL;
    assert_int_equal(atap_block(task_where, NULL, &o, sizeof o), 0);
    assert_true(pthread_equal(o.thread, pthread_self()));
    assert_true(o.self == ATAP_NO_TASK.id);
    assert_int_equal(o.cancelled, 0);

    assert_int_equal(atap_block(task_fail, NULL, NULL, 0), ATAP_EFAILED);
    assert_int_equal(atap_block(task_fail_with, (void *)(intptr_t)5, &o, 8), ATAP_EFAILED);
    assert_int_equal(atap_block(NULL, NULL, NULL, 0), ATAP_EINVAL);
    assert_int_equal(atap_block(task_where, NULL, NULL, sizeof o), ATAP_EINVAL);
    atomic_int c;
    atomic_init(&c, 0);
    assert_int_equal(atap_block(task_count, &c, NULL, 0), 0);
    assert_int_equal(atomic_load(&c), 1);
}

static void test_tasks_block_without_runtime(void **state)
{
    (void)state;
    assert_false(atap_initialised());
    check_block_here();
    assert_false(atap_initialised());
}

static void test_tasks_block_with_runtime(void **state)
{
    (void)state;
    check_block_here();
}

static int task_blocks_inside(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    block_out o;
    memset(&o, 0, sizeof o);
    int rc = atap_block(task_where, NULL, &o, sizeof o);
    uint64_t r = (rc == 0 && pthread_equal(o.thread, pthread_self()) && o.self == 0) ? 1 : 0;
    memcpy(out, &r, sizeof r);
    return 0;
}

static void test_tasks_block_inside_task(void **state)
{
    (void)state;
    atap_task t = spawn8(task_blocks_inside, NULL);
    assert_true(join8(t) == 1);
    atap_release(t);
}

/* ---- blocking tasks ---------------------------------------------------- */

static int task_blocking_where(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    gate *g = arg;
    if (g != NULL) {
        atomic_fetch_add(&g->started, 1);
        while (!atomic_load(&g->open) && !released_all())
            sleep_us(100);
    }
    pthread_t th = pthread_self();
    memcpy(out, &th, sizeof th);
    return 0;
}

static void test_tasks_blocking_not_on_worker(void **state)
{
    (void)state;
    blockers *bl = blockers_start(); /* every worker spins: only a blocking thread can run it */
    atap_task t;
    assert_int_equal(
        atap_spawn(&t, task_blocking_where, NULL,
                   &(atap_spawn_opts){.out_size = sizeof(pthread_t), .blocking = true}),
        0);
    pthread_t th;
    assert_int_equal(atap_join_for(t, &th, sizeof th, ATAP_SEC(30)), 0);
    atap_release(t);
    assert_false(blockers_has_thread(bl, th));
    assert_false(pthread_equal(th, pthread_self()));

    /* several at once, all parked in their run at the same time: each on a
     * thread of its own, none of them a worker */
    enum { K = 4 };
    gate *g = gate_new(0);
    atap_task ts[K];
    for (int i = 0; i < K; i++)
        assert_int_equal(
            atap_spawn(&ts[i], task_blocking_where, g,
                       &(atap_spawn_opts){.out_size = sizeof(pthread_t), .blocking = true}),
            0);
    assert_true(wait_atomic_at_least(&g->started, K, ATAP_SEC(30)));
    struct atap_pool_stats s = pool_stats();
    assert_true(s.blocking_threads >= K);
    assert_true(s.blocking_busy >= K);
    atomic_store(&g->open, 1);
    pthread_t ths[K];
    for (int i = 0; i < K; i++) {
        assert_int_equal(atap_join_for(ts[i], &ths[i], sizeof ths[i], ATAP_SEC(30)), 0);
        assert_false(blockers_has_thread(bl, ths[i]));
        for (int j = 0; j < i; j++)
            assert_false(pthread_equal(ths[i], ths[j]));
        atap_release(ts[i]);
    }
    blockers_stop(bl);
}

/* Blocking tasks that wait for one another each need a thread of their own:
 * k of them waiting at once must all start, however many blocking threads
 * were idle when they were spawned (up to cores x blocking_per_core). */
static void test_tasks_blocking_run_concurrently(void **state)
{
    (void)state;
    size_t rounds = scaled(24, 6);
    for (size_t r = 0; r < rounds; r++) {
        int k = 2 + (int)(r % 6);
        gate *g = gate_new(r);
        atap_task ts[8];
        for (int i = 0; i < k; i++)
            assert_int_equal(
                atap_spawn(&ts[i], task_blocking_where, g,
                           &(atap_spawn_opts){.out_size = sizeof(pthread_t), .blocking = true}),
                0);
        if (!wait_atomic_at_least(&g->started, k, ATAP_SEC(10))) {
            struct atap_pool_stats st = pool_stats();
            fail_msg("round %zu: only %d of %d blocking tasks started in 10 s "
                     "(blocking_threads %zu, blocking_busy %zu, queued %zu)",
                     r, atomic_load(&g->started), k, st.blocking_threads, st.blocking_busy,
                     st.queued);
        }
        atomic_store(&g->open, 1);
        for (int i = 0; i < k; i++) {
            pthread_t th;
            assert_int_equal(atap_join_for(ts[i], &th, sizeof th, ATAP_SEC(30)), 0);
            atap_release(ts[i]);
        }
    }
}

/* ---- priorities ----------------------------------------------------------- */

typedef struct prio_log {
    atomic_int next;
    atomic_int first_prio;
    atomic_int rank[3]; /* sum of start ranks per band */
} prio_log;

typedef struct prio_arg {
    prio_log *log;
    int band; /* 0: -100, 1: 0, 2: 100 */
} prio_arg;

static int task_prio(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    prio_arg *a = arg;
    int r = atomic_fetch_add(&a->log->next, 1);
    if (r == 0)
        atomic_store(&a->log->first_prio, a->band);
    atomic_fetch_add(&a->log->rank[a->band], r);
    return 0;
}

static void test_tasks_priorities(void **state)
{
    (void)state;
    enum { K = 6 };
    static const int prios[3] = {-100, 0, 100};
    static prio_log log; /* static: the tasks may outlive a failed test */
    static prio_arg args[3];
    atomic_store(&log.next, 0);
    atomic_store(&log.first_prio, -1);
    for (int i = 0; i < 3; i++)
        atomic_store(&log.rank[i], 0);
    for (int i = 0; i < 3; i++)
        args[i] = (prio_arg){.log = &log, .band = i};

    blockers *bl = blockers_start();
    atap_task ts[3 * K];
    int n = 0;
    /* lowest first, so FIFO order alone would get it wrong */
    for (int band = 0; band < 3; band++)
        for (int k = 0; k < K; k++)
            assert_int_equal(atap_spawn(&ts[n++], task_prio, &args[band],
                                        &(atap_spawn_opts){.priority = prios[band]}),
                             0);
    /* One worker comes free first and picks from the shared queue alone:
     * the highest band must come out first. (With several freed at once,
     * one may skip a band another is busy reordering, so that order is
     * only checked on average below.) */
    blockers_release_one(bl);
    assert_true(wait_atomic_at_least(&log.next, 1, ATAP_SEC(20)));
    blockers_stop(bl);
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(atomic_load(&log.next), 3 * K);
    assert_int_equal(atomic_load(&log.first_prio), 2);
    /* on average the high band started before the low band */
    assert_true(atomic_load(&log.rank[2]) < atomic_load(&log.rank[0]));
}

/* ---- helping: fib with a task per call ------------------------------- */

static int task_fib(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t n = (uint64_t)(uintptr_t)arg;
    if (n < 2) {
        memcpy(out, &n, sizeof n);
        return 0;
    }
    atap_task t;
    int rc = atap_spawn(&t, task_fib, (void *)(uintptr_t)(n - 1),
                        &(atap_spawn_opts){.out_size = sizeof(uint64_t)});
    if (rc != 0) {
        CHECK(rc == 0);
        return -1;
    }
    uint64_t b = 0, a = 0;
    rc = task_fib(ctx, (void *)(uintptr_t)(n - 2), &b);
    int jrc = atap_join(t, &a, sizeof a);
    atap_release(t);
    if (rc != 0 || jrc != 0) {
        CHECK(jrc == 0);
        return -1;
    }
    uint64_t r = a + b;
    memcpy(out, &r, sizeof r);
    return 0;
}

static void test_tasks_fib_helping(void **state)
{
    (void)state;
    size_t n = env_size("ATAP_TEST_FIB", 30);
    uint64_t want = 0, next = 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = want + next;
        want = next;
        next = s;
    }
    uint64_t t0 = now_ns();
    atap_task t = spawn8(task_fib, (void *)(uintptr_t)n);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(240)), 0);
    print_message("fib(%zu) = %llu in %.3f s\n", n, (unsigned long long)v,
                  (double)(now_ns() - t0) / 1e9);
    assert_true(v == want);
    if (n == 30)
        assert_true(v == 832040);
    atap_release(t);
    assert_no_failures();
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* ---- thread death ---------------------------------------------------------- */

static int task_exits_thread(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    (void)out;
    pthread_exit(NULL);
    return 0;
}

static void test_tasks_pthread_exit(void **state)
{
    (void)state;
    long ncores = (long)cores();
    struct atap_pool_stats s0 = pool_stats();
    enum { N = 1000 };
    atap_task dying = spawn8(task_exits_thread, NULL);
    static atap_task ts[N];
    for (int i = 0; i < N; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(i + 1));
    uint64_t v = SENTINEL;
    assert_int_equal(atap_join_for(dying, &v, sizeof v, ATAP_SEC(30)), ATAP_EFAILED);
    assert_true(v == SENTINEL);
    assert_int_equal(atap_state_of(dying), ATAP_FAILED);
    for (int i = 0; i < N; i++) {
        uint64_t x = 0;
        assert_int_equal(atap_join_for(ts[i], &x, sizeof x, ATAP_SEC(30)), 0);
        assert_true(x == (uint64_t)(i + 1));
        atap_release(ts[i]);
    }
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().deaths < s0.deaths + 1 && now_ns() < end)
        sleep_us(500);
    assert_true(pool_stats().deaths == s0.deaths + 1);
    /* the worker was replaced: the floor is back */
    end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < (size_t)ncores && now_ns() < end)
        sleep_us(500);
    assert_true(pool_stats().workers >= (size_t)ncores);
    atap_release(dying);

    /* a few deaths in a row, with work queued behind each */
    for (int round = 0; round < 3; round++) {
        atap_task d = spawn8(task_exits_thread, NULL);
        for (int i = 0; i < 100; i++)
            ts[i] = spawn8(task_value, (void *)(uintptr_t)(i * 2));
        assert_int_equal(atap_join_for(d, &v, sizeof v, ATAP_SEC(30)), ATAP_EFAILED);
        for (int i = 0; i < 100; i++) {
            uint64_t x = 0;
            assert_int_equal(atap_join_for(ts[i], &x, sizeof x, ATAP_SEC(30)), 0);
            assert_true(x == (uint64_t)(i * 2));
            atap_release(ts[i]);
        }
        atap_release(d);
    }
    end = now_ns() + ATAP_SEC(10);
    while (pool_stats().deaths < s0.deaths + 4 && now_ns() < end)
        sleep_us(500);
    assert_true(pool_stats().deaths == s0.deaths + 4);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* A thread-local destructor on a dying worker that takes its time and then
 * spawns, while a second death starts a replacement in the first one's
 * record: the replacement used to join the first thread under the pool's
 * lock, and the destructor's spawn waited for that lock (a deadlock of the
 * whole pool). */
static pthread_key_t slow_dtor_key;
static pthread_once_t slow_dtor_once = PTHREAD_ONCE_INIT;
static atomic_int slow_dtor_spawned, slow_dtor_ran;

static void slow_dtor(void *v)
{
    (void)v;
    sleep_ms(200);
    atap_task t;
    if (atap_spawn(&t, task_count, &slow_dtor_ran, NULL) == 0) {
        atap_release(t);
        atomic_store(&slow_dtor_spawned, 1);
    }
}

static void make_slow_dtor_key(void) { (void)pthread_key_create(&slow_dtor_key, slow_dtor); }

static int task_exits_with_key(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    pthread_setspecific(slow_dtor_key, (void *)1);
    pthread_exit(NULL);
}

static int task_exits_later(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    sleep_ms(50);
    pthread_exit(NULL);
}

static void test_tasks_pthread_exit_slow_destructor(void **state)
{
    (void)state;
    pthread_once(&slow_dtor_once, make_slow_dtor_key);
    atomic_store(&slow_dtor_spawned, 0);
    atomic_store(&slow_dtor_ran, 0);
    atap_task a, b;
    assert_int_equal(atap_spawn(&a, task_exits_with_key, NULL, NULL), 0);
    sleep_ms(10);
    assert_int_equal(atap_spawn(&b, task_exits_later, NULL, NULL), 0);
    assert_int_equal(atap_join_for(a, NULL, 0, ATAP_SEC(30)), ATAP_EFAILED);
    assert_int_equal(atap_join_for(b, NULL, 0, ATAP_SEC(30)), ATAP_EFAILED);
    assert_true(wait_atomic_at_least(&slow_dtor_spawned, 1, ATAP_SEC(20)));
    assert_true(wait_atomic_at_least(&slow_dtor_ran, 1, ATAP_SEC(20)));
    atap_task c = spawn8(task_value, (void *)(uintptr_t)9);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(c, &v, sizeof v, ATAP_SEC(20)), 0);
    assert_true(v == 9);
    atap_release(a);
    atap_release(b);
    atap_release(c);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

static void test_tasks_pthread_exit_blocking(void **state)
{
    (void)state;
    struct atap_pool_stats s0 = pool_stats();
    atap_task d;
    assert_int_equal(atap_spawn(&d, task_exits_thread, NULL,
                                &(atap_spawn_opts){.out_size = 8, .blocking = true}),
                     0);
    uint64_t v = SENTINEL;
    assert_int_equal(atap_join_for(d, &v, sizeof v, ATAP_SEC(30)), ATAP_EFAILED);
    atap_release(d);
    /* blocking work still runs afterwards */
    for (int i = 0; i < 8; i++) {
        atap_task t;
        assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)i,
                                    &(atap_spawn_opts){.out_size = 8, .blocking = true}),
                         0);
        uint64_t x = SENTINEL;
        assert_int_equal(atap_join_for(t, &x, sizeof x, ATAP_SEC(30)), 0);
        assert_true(x == (uint64_t)i);
        atap_release(t);
    }
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().deaths < s0.deaths + 1 && now_ns() < end)
        sleep_us(500);
    assert_true(pool_stats().deaths == s0.deaths + 1);
}

/* ---- a task runs exactly once --------------------------------------------- */

static void test_tasks_run_exactly_once(void **state)
{
    (void)state;
    size_t n = scaled(10000, 500);
    atomic_int *counts = calloc(n, sizeof *counts);
    atap_task *ts = calloc(n, sizeof *ts);
    assert_non_null(counts);
    assert_non_null(ts);
    for (size_t i = 0; i < n; i++) {
        atomic_init(&counts[i], 0);
        assert_int_equal(atap_spawn(&ts[i], task_count, &counts[i], NULL), 0);
    }
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atap_join(ts[i], NULL, 0), 0);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&counts[i]), 1);
    free(counts);
    free(ts);
}

/* ---- detached spawns ----------------------------------------------------- */

/* Detached tasks run exactly once, from outside the pool, from tasks and
 * from a blocking task, and leave nothing behind: with no handle, the
 * table is back to where it was once they have run. */
static int task_spawn_detached_children(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atomic_int *counts = arg;
    int rc = 0;
    for (int i = 0; i < 300; i++)
        if (atap_spawn_detached(task_count, &counts[i], NULL) != 0)
            rc = -1;
    return rc;
}

static bool wait_counts_at_least_one(atomic_int *counts, size_t n, uint64_t timeout_ns)
{
    for (size_t i = 0; i < n; i++)
        if (!wait_atomic_at_least(&counts[i], 1, timeout_ns))
            return false;
    return true;
}

static void test_tasks_detached_run_once_and_let_go(void **state)
{
    (void)state;
    size_t n = scaled(10000, 500);
    enum { P = 8, C = 300 };
    atomic_int *counts = calloc(n + P * C, sizeof *counts);
    atap_task parents[P];
    assert_non_null(counts);
    for (size_t i = 0; i < n + P * C; i++)
        atomic_init(&counts[i], 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn_detached(task_count, &counts[i], NULL), 0);
    for (int p = 0; p < P; p++) /* the last one from a blocking thread */
        assert_int_equal(atap_spawn(&parents[p], task_spawn_detached_children,
                                    &counts[n + (size_t)p * C],
                                    &(atap_spawn_opts){.blocking = p == P - 1}),
                         0);
    for (int p = 0; p < P; p++) {
        assert_int_equal(atap_join(parents[p], NULL, 0), 0);
        atap_release(parents[p]);
    }
    assert_true(wait_counts_at_least_one(counts, n + P * C, ATAP_SEC(20)));
    assert_true(wait_live_back(ATAP_SEC(20)));
    for (size_t i = 0; i < n + P * C; i++)
        assert_int_equal(atomic_load(&counts[i]), 1);
    free(counts);
}

/* A detached task's destructors and output: each output a run makes goes
 * to out_free (with the bytes the run wrote), and arg_free runs once, for
 * one run and for a repeat of three; options about time take the long way
 * and still keep no handle. */
enum { DET_OUT = 48, DET_N = 1000 };
static atomic_int det_runs, det_out_frees, det_out_bad, det_arg_frees;

static int task_detached_out(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atomic_fetch_add(&det_runs, 1);
    memset(out, 0x5a, DET_OUT);
    return 0;
}

static void det_out_free(void *out)
{
    unsigned char want[DET_OUT];
    memset(want, 0x5a, DET_OUT);
    if (memcmp(out, want, DET_OUT) != 0)
        atomic_fetch_add(&det_out_bad, 1);
    atomic_fetch_add(&det_out_frees, 1);
}

static void det_arg_free(void *arg)
{
    (void)arg;
    atomic_fetch_add(&det_arg_frees, 1);
}

static void test_tasks_detached_destructors_and_outputs(void **state)
{
    (void)state;
    atap_spawn_opts once = {
        .out_size = DET_OUT, .out_free = det_out_free, .arg_free = det_arg_free};
    atap_spawn_opts plain48 = {.out_size = DET_OUT};
    atap_spawn_opts three = once;
    three.kind = ATAP_REPEAT;
    three.runs = 3;
    atomic_store(&det_runs, 0);
    atomic_store(&det_out_frees, 0);
    atomic_store(&det_out_bad, 0);
    atomic_store(&det_arg_frees, 0);
    for (int i = 0; i < DET_N; i++)
        assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &once), 0);
    for (int i = 0; i < DET_N; i++)
        assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &three), 0);
    for (int i = 0; i < DET_N; i++) /* the output alone, from its block at the first run */
        assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &plain48), 0);
    assert_true(wait_atomic_at_least(&det_arg_frees, 2 * DET_N, ATAP_SEC(20)));
    assert_true(wait_atomic_at_least(&det_runs, 5 * DET_N, ATAP_SEC(20)));
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_int_equal(atomic_load(&det_runs), 5 * DET_N);
    assert_int_equal(atomic_load(&det_out_frees), 4 * DET_N);
    assert_int_equal(atomic_load(&det_out_bad), 0);
    assert_int_equal(atomic_load(&det_arg_frees), 2 * DET_N);
}

/* Refused spawns: the codes atap_spawn gives for the same fn and opts,
 * arg left the caller's (arg_free not called), nothing in the table. */
static void test_tasks_detached_bad_args(void **state)
{
    (void)state;
    atomic_store(&det_arg_frees, 0);
    atap_spawn_opts o = {.arg_free = det_arg_free};
    assert_int_equal(atap_spawn_detached(NULL, NULL, &o), ATAP_EINVAL);
    assert_int_equal(atap_spawn_detached(NULL, NULL, NULL), ATAP_EINVAL);
    o.priority = 128;
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    o.priority = 0;
    o.out_size = (size_t)1 << 32;
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    o.out_size = 0;
    o.gives = 2; /* gives belong to atap_spawn_waiting */
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    o.gives = 0;
    o.runs = 3; /* runs on a one-shot */
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    o.runs = 0;
    o.kind = ATAP_AT_RATE; /* at a rate of every 0 ns */
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    o.kind = ATAP_ONCE;
    o.size = 1; /* a layout this library does not know */
    assert_int_equal(atap_spawn_detached(task_detached_out, NULL, &o), ATAP_EINVAL);
    assert_int_equal(atomic_load(&det_arg_frees), 0);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* No runtime: ATAP_ENOTINIT, nothing run. A shutdown runs detached tasks
 * still queued, as it runs any queued work. */
static int task_sleep_ms(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    sleep_ms((unsigned)(uintptr_t)arg);
    return 0;
}

static void test_tasks_detached_without_runtime_and_at_shutdown(void **state)
{
    (void)state;
    static atomic_int c;
    atomic_init(&c, 0);
    assert_int_equal(atap_spawn_detached(task_count, &c, NULL), ATAP_ENOTINIT);
    assert_int_equal(atomic_load(&c), 0);

    atap_config one = {.size = sizeof one, .workers = 1};
    assert_int_equal(atap_init(&one), 0);
    atap_task sleeper;
    assert_int_equal(atap_spawn(&sleeper, task_sleep_ms, (void *)(uintptr_t)50, NULL), 0);
    for (int i = 0; i < 200; i++)
        assert_int_equal(atap_spawn_detached(task_count, &c, NULL), 0);
    atap_release(sleeper);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atomic_load(&c), 200);
    assert_int_equal(atap_spawn_detached(task_count, &c, NULL), ATAP_ENOTINIT);
    assert_int_equal(atomic_load(&c), 200);
}

/* Spawned from inside tasks: children land on the worker's own queue and
 * still all run once, and joins from tasks on tasks work. */
static int task_spawn_children(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atomic_int *counts = arg;
    enum { C = 300 };
    atap_task kids[C];
    int ok = 1;
    for (int i = 0; i < C; i++)
        if (atap_spawn(&kids[i], task_count, &counts[i], NULL) != 0) {
            ok = 0;
            kids[i] = ATAP_NO_TASK;
        }
    for (int i = 0; i < C; i++) {
        if (atap_join(kids[i], NULL, 0) != 0)
            ok = 0;
        atap_release(kids[i]);
    }
    uint64_t v = (uint64_t)ok;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_tasks_spawn_from_task(void **state)
{
    (void)state;
    enum { P = 8, C = 300 };
    static atomic_int counts[P][C];
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++)
            atomic_init(&counts[p][c], 0);
    atap_task ts[P];
    for (int p = 0; p < P; p++)
        ts[p] = spawn8(task_spawn_children, counts[p]);
    for (int p = 0; p < P; p++) {
        assert_true(join8(ts[p]) == 1);
        atap_release(ts[p]);
    }
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++)
            assert_int_equal(atomic_load(&counts[p][c]), 1);
    assert_true(wait_live_back(ATAP_SEC(20)));
}

/* arg = size << 8 | byte: fills the size-byte output with byte. */
static int task_fill(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    memset(out, (int)((uintptr_t)arg & 0xff), (size_t)((uintptr_t)arg >> 8));
    return 0;
}

static atomic_int freed_args, freed_outs;
static void count_arg_free(void *p)
{
    (void)p;
    atomic_fetch_add(&freed_args, 1);
}
static void count_out_free(void *p)
{
    (void)p;
    atomic_fetch_add(&freed_outs, 1);
}

/* Spawns from inside a task take their own path when the options are
 * plain: every option it does not take must still be checked as from
 * outside. The output: the number of checks that went wrong. */
static int task_spawns_with_options(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t bad = 0;
    atap_task t = {.id = 1234};
    unsigned char buf[49], want[49];

    /* refused, *task cleared, nothing left behind */
    static const atap_spawn_opts refused[] = {
        {.priority = 128}, {.priority = -129},          {.out_size = (size_t)1 << 32},
        {.gives = 1},      {.in_free = count_arg_free}, {.kind = (atap_kind)99},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        t.id = 1234;
        bad += atap_spawn(&t, task_value, NULL, &refused[i]) != ATAP_EINVAL || t.id != 0;
    }
    t.id = 1234;
    bad += atap_spawn(&t, NULL, NULL, NULL) != ATAP_EINVAL || t.id != 0;
    bad += atap_spawn(NULL, task_value, NULL, NULL) != ATAP_EINVAL;

    /* taken: the edge priorities, an output that just fits the slot and one
     * that does not, destructors, and a blocking task */
    static const atap_spawn_opts taken[] = {
        {.out_size = 48, .priority = ATAP_PRIORITY_MIN},
        {.out_size = 49, .priority = ATAP_PRIORITY_MAX},
        {.out_size = 48, .arg_free = count_arg_free, .out_free = count_out_free},
        {.out_size = 49, .arg_free = count_arg_free, .out_free = count_out_free},
        {.out_size = 48, .blocking = true},
    };
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        size_t n = taken[i].out_size;
        if (atap_spawn(&t, task_fill, (void *)(uintptr_t)(n << 8 | (0x40 + i)), &taken[i]) != 0) {
            bad++;
            continue;
        }
        memset(want, (int)(0x40 + i), sizeof want);
        bad += atap_join(t, buf, n) != 0 || memcmp(buf, want, n) != 0;
        bad += atap_join(t, buf, n == 48 ? 49 : 48) != ATAP_EINVAL;
        atap_release(t);
    }
    memcpy(out, &bad, sizeof bad);
    return 0;
}

static void test_tasks_spawn_from_task_checks_options(void **state)
{
    (void)state;
    atomic_store(&freed_args, 0);
    atomic_store(&freed_outs, 0);
    for (int round = 0; round < 50; round++) {
        atap_task t = spawn8(task_spawns_with_options, NULL);
        assert_int_equal(join8(t), 0);
        atap_release(t);
    }
    assert_true(wait_live_back(ATAP_SEC(20)));
    /* two tasks a round with each destructor, each called once */
    assert_int_equal(atomic_load(&freed_args), 100);
    assert_int_equal(atomic_load(&freed_outs), 100);
}

/* ---- every pointer handed to user code is aligned for any type --------- */

/* Misaligned pointers seen, by where they come from: a slot's inline
 * output area (outputs up to 16 bytes: a once task's or an at-rate run's
 * `out`, and every out_free of such an output), and everything else (a
 * series' `out`, heap outputs, atap_input, in_free). Aligned means: for
 * any type of that size, i.e. to the largest power of two dividing the
 * size, up to alignof(max_align_t) (a type's alignment divides its size). */
static atomic_int al_slot_bad, al_other_bad, al_seen, al_out_frees, al_in_frees;

#define AL_INLINE_MAX 16 /* slot.h: INLINE_OUT */
#define AL_BIG 72
#define AL_IN 24 /* the inputs' size */

static _Atomic size_t al_size; /* the outputs' size in this round */

static bool al_aligned(const void *p, size_t size)
{
    size_t a = size & -size;

    if (a == 0 || a > _Alignof(max_align_t))
        a = _Alignof(max_align_t);
    atomic_fetch_add(&al_seen, 1);
    return ((uintptr_t)p % a) == 0;
}

static bool al_ok(const void *p) { return al_aligned(p, atomic_load(&al_size)); }

typedef struct al_arg {
    size_t out_size;
    bool out_in_slot; /* the run writes straight into its slot's output */
} al_arg;

static int al_run(atap_ctx *ctx, void *arg, void *out)
{
    al_arg *a = arg;
    size_t n = 0;
    const void *in = atap_input(ctx, &n);

    if (!al_ok(out))
        atomic_fetch_add(a->out_in_slot ? &al_slot_bad : &al_other_bad, 1);
    if (in && !al_aligned(in, n))
        atomic_fetch_add(&al_other_bad, 1);
    memset(out, 0x5a, a->out_size);
    return 0;
}

static void al_out_free_small(void *p)
{
    atomic_fetch_add(&al_out_frees, 1);
    if (!al_ok(p))
        atomic_fetch_add(&al_slot_bad, 1);
}

static void al_out_free_big(void *p)
{
    atomic_fetch_add(&al_out_frees, 1);
    if (!al_ok(p))
        atomic_fetch_add(&al_other_bad, 1);
}

static void al_in_free(void *p)
{
    atomic_fetch_add(&al_in_frees, 1);
    if (!al_aligned(p, AL_IN))
        atomic_fetch_add(&al_other_bad, 1);
}

static void test_tasks_pointers_aligned(void **state)
{
    (void)state;
    static const size_t sizes[] = {8, 16, 24, 32, 40, 48, 64, AL_BIG};
    unsigned char in[AL_IN] = {1};

    atomic_store(&al_slot_bad, 0);
    atomic_store(&al_other_bad, 0);
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        size_t size = sizes[z];
        bool inl = size <= AL_INLINE_MAX;
        atomic_store(&al_size, size);
        void (*of)(void *) = inl ? al_out_free_small : al_out_free_big;
        al_arg direct = {size, inl}, series = {size, false};
        atap_task t[12], m[2];
        int n = 0;

        /* Several of each, so that slots at both kinds of address are met. */
        for (int k = 0; k < 3; k++) {
            assert_int_equal(atap_spawn(&t[n++], al_run, &direct,
                                        &(atap_spawn_opts){.out_size = size, .out_free = of}),
                             0);
            assert_int_equal(atap_spawn(&t[n++], al_run, &direct,
                                        &(atap_spawn_opts){.out_size = size,
                                                           .out_free = of,
                                                           .timeout_ns = ATAP_SEC(60)}),
                             0);
        }
        assert_int_equal(
            atap_spawn(&t[n++], al_run, &series,
                       &(atap_spawn_opts){
                           .out_size = size, .out_free = of, .kind = ATAP_REPEAT, .runs = 3}),
            0);
        assert_int_equal(atap_spawn(&t[n++], al_run, &direct,
                                    &(atap_spawn_opts){.out_size = size,
                                                       .out_free = of,
                                                       .kind = ATAP_AT_RATE,
                                                       .every_ns = ATAP_MS(5),
                                                       .runs = 3}),
                         0);
        assert_int_equal(atap_spawn_waiting(&t[n], al_run, &series, sizeof in,
                                            &(atap_spawn_opts){.out_size = size,
                                                               .out_free = of,
                                                               .in_free = al_in_free,
                                                               .gives = 1}),
                         0);
        assert_int_equal(atap_give(t[n++], in, sizeof in), 0);
        assert_int_equal(atap_spawn_waiting(&t[n], al_run, &series, sizeof in,
                                            &(atap_spawn_opts){.out_size = size,
                                                               .out_free = of,
                                                               .in_free = al_in_free,
                                                               .kind = ATAP_REPEAT,
                                                               .runs = 2,
                                                               .gives = 1}),
                         0);
        assert_int_equal(atap_give(t[n++], in, sizeof in), 0);
        /* receivers: their inputs are the members' outputs, copied */
        for (int k = 0; k < 2; k++)
            assert_int_equal(atap_spawn(&m[k], al_run, &direct,
                                        &(atap_spawn_opts){.out_size = size, .out_free = of}),
                             0);
        assert_int_equal(atap_receive_all(&t[n++], al_run, &series, m, 2,
                                          &(atap_spawn_opts){.out_size = size, .out_free = of}),
                         0);
        assert_int_equal(atap_receive_any(&t[n++], al_run, &series, m, 2,
                                          &(atap_spawn_opts){.out_size = size, .out_free = of}),
                         0);
        for (int i = 0; i < n; i++) {
            if (!wait_finished(t[i], ATAP_SEC(20)))
                fail_msg("size %zu: task %d of %d never finished (state %d)", size, i, n,
                         (int)atap_state_of(t[i]));
            atap_release(t[i]);
        }
        for (int k = 0; k < 2; k++)
            atap_release(m[k]);
        assert_true(wait_live_back(ATAP_SEC(20)));
    }
    print_message("%d pointers looked at, %d outputs to out_free, %d values to in_free\n",
                  atomic_load(&al_seen), atomic_load(&al_out_frees), atomic_load(&al_in_frees));
    assert_true(atomic_load(&al_in_frees) > 0);
    assert_int_equal(atomic_load(&al_other_bad), 0);
    assert_int_equal(atomic_load(&al_slot_bad), 0);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_block_without_runtime),
        cmocka_unit_test(test_tasks_detached_without_runtime_and_at_shutdown),
        T(test_tasks_detached_run_once_and_let_go),
        T(test_tasks_detached_destructors_and_outputs),
        T(test_tasks_detached_bad_args),
        T(test_tasks_join_returns_output),
        T(test_tasks_join_for_deadline),
        T(test_tasks_join_for_returns_on_settle),
        T(test_tasks_join_for_inside_task_keeps_deadline),
        T(test_tasks_try_join_running),
        T(test_tasks_take_moves_once),
        T(test_tasks_wrong_size_einval),
        T(test_tasks_spawn_bad_args),
        T(test_tasks_spawn_huge_out_size),
        T(test_tasks_output_blocks),
        T(test_tasks_output_memory_refused_at_first_run),
        T(test_tasks_nonzero_return_fails),
        T(test_tasks_fail_code_reaches_readers),
        T(test_tasks_wait_gives_state),
        T(test_tasks_cancel_queued_never_runs),
        T(test_tasks_cancel_running_drops_output),
        T(test_tasks_cancel_after_ready_keeps_output),
        T(test_tasks_cancelled_flag),
        T(test_tasks_dup_listener),
        T(test_tasks_dup_limit),
        T(test_tasks_self_is_handle),
        T(test_tasks_join_self_einval),
        T(test_tasks_block_with_runtime),
        T(test_tasks_block_inside_task),
        T(test_tasks_blocking_not_on_worker),
        T(test_tasks_blocking_run_concurrently),
        T(test_tasks_priorities),
        T(test_tasks_fib_helping),
        T(test_tasks_deep_recursion_runs_on_one_stack),
        T(test_tasks_pthread_exit),
        T(test_tasks_pthread_exit_blocking),
        T(test_tasks_pthread_exit_slow_destructor),
        T(test_tasks_run_exactly_once),
        T(test_tasks_spawn_from_task),
        T(test_tasks_spawn_from_task_checks_options),
        T(test_tasks_pointers_aligned),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Tasks that use time: start delays, run timeouts, repeats with a gap, run
 * counts and deadlines, and what happens to them at shutdown and when the
 * manager is gone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <malloc.h>

#include "manager.h" /* atap__manager_restarts, atap__manager_refiled */
#include "test_util.h"
#include "testing.h" /* atap__test_on */

#define MAX_RUNS 256

/* What a task saw: when each run started and ended. */
typedef struct log {
    atomic_int runs;
    atomic_uint_fast64_t start[MAX_RUNS], end[MAX_RUNS];
    atomic_int out_frees;
    uint64_t hold_ns; /* each run takes this long */
} log;

static log *log_new(uint64_t hold_ns)
{
    log *l = calloc(1, sizeof *l);
    assert_non_null(l);
    l->hold_ns = hold_ns;
    return l;
}

/* Records the run, holds for hold_ns (or until cancelled or timed out),
 * outputs the run's number (1, 2, ...). */
static int logged(atap_ctx *ctx, void *arg, void *out)
{
    log *l = arg;
    int i = atomic_fetch_add(&l->runs, 1);
    uint64_t t0 = now_ns();

    if (i < MAX_RUNS)
        atomic_store(&l->start[i], t0);
    while (now_ns() - t0 < l->hold_ns && !atap_cancelled(ctx))
        sleep_us(200);
    if (i < MAX_RUNS)
        atomic_store(&l->end[i], now_ns());
    uint64_t v = (uint64_t)i + 1;
    memcpy(out, &v, sizeof v);
    return 0;
}

static atap_task spawn_logged(log *l, atap_spawn_opts o)
{
    atap_task t;
    o.out_size = 8;
    assert_int_equal(atap_spawn(&t, logged, l, &o), 0);
    return t;
}

/* ---- after -------------------------------------------------------------- */

static void test_schedule_after_never_early(void **state)
{
    (void)state;
    log *l = log_new(0);
    uint64_t t0 = now_ns();
    atap_task t = spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_MS(50)});
    assert_true(atap_state_of(t) == ATAP_PENDING);
    assert_true(join8(t) == 1);
    assert_true(atomic_load(&l->start[0]) >= t0 + ATAP_MS(50));
    assert_true(atap_finished(t));
    atap_release(t);
    free(l);
}

/* A delay spanning manager restarts runs late, never early, and runs. */
static void test_schedule_after_survives_manager_restart(void **state)
{
    (void)state;
    log *l = log_new(0);
    uint64_t t0 = now_ns();
    atap_task t = spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_MS(80)});
    sleep_us(10000);
    atap_inject_manager_faults(2);
    assert_int_equal(atap_join_for(t, &(uint64_t){0}, 8, ATAP_SEC(10)), 0);
    assert_true(atomic_load(&l->start[0]) >= t0 + ATAP_MS(80));
    atap_release(t);
    free(l);
}

static void test_schedule_after_cancelled_before_start(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_task t = spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_MS(200)});
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    atap_release(t);
    /* the slot goes at once, not when the delay would have ended */
    assert_true(wait_live_back(ATAP_MS(100)));
    sleep_us(250000);
    assert_int_equal(atomic_load(&l->runs), 0);
    free(l);
}

/* ---- timeout ------------------------------------------------------------ */

static atomic_int g_out_frees;
static void count_free(void *out)
{
    (void)out;
    atomic_fetch_add(&g_out_frees, 1);
}

static void test_schedule_timeout_ends_the_run(void **state)
{
    (void)state;
    log *l = log_new(ATAP_SEC(5));
    uint64_t t0 = now_ns();
    atomic_store(&g_out_frees, 0);
    atap_task t =
        spawn_logged(l, (atap_spawn_opts){.timeout_ns = ATAP_MS(50), .out_free = count_free});
    uint64_t v = 0;
    assert_int_equal(atap_join(t, &v, 8), ATAP_ETIMEDOUT);
    uint64_t took = now_ns() - t0;
    assert_true(took >= ATAP_MS(50));
    assert_true(took < ATAP_SEC(4)); /* not the whole 5 s run */
    assert_true(atap_state_of(t) == ATAP_TIMED_OUT);
    assert_true(atap_finished(t));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&g_out_frees), 1); /* the dropped output */
    free(l);
}

/* Time spent waiting to start does not count. */
static void test_schedule_timeout_excludes_the_wait(void **state)
{
    (void)state;
    log *l = log_new(ATAP_MS(5));
    atap_task t =
        spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_MS(300), .timeout_ns = ATAP_MS(200)});
    assert_true(join8(t) == 1);
    atap_release(t);
    free(l);
}

/* 48 runs with timeouts of 40 + i ms, the manager falling apart 3 times
 * around 38 ms: every one still times out. */
static void test_schedule_timeout_survives_manager_restart(void **state)
{
    (void)state;
    enum { N = 48 };
    log *l = log_new(ATAP_SEC(3));
    atap_task t[N];
    for (int i = 0; i < N; i++)
        t[i] = spawn_logged(l, (atap_spawn_opts){.timeout_ns = ATAP_MS(40 + i), .blocking = true});
    sleep_us(38000);
    atap_inject_manager_faults(3);
    for (int i = 0; i < N; i++) {
        uint64_t v;
        int rc = atap_join_for(t[i], &v, 8, ATAP_SEC(30));
        if (rc != ATAP_ETIMEDOUT)
            fail_msg("task %d: %s", i, atap_strerror(rc));
        atap_release(t[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    free(l);
}

/* Every wait comes back after a restart, rebuilt from the task table: the
 * new manager's structure holds what the table's schedules show armed
 * (atap__manager_refiled counts them), and only that. 100 delays 2 s and
 * more away (the even ones wait in their slots, on the park wheel, which
 * is the runtime's and needs no rebuild; the odd ones, with an output past
 * the slot's tail, in schedules), 16 repeats with 40 ms gaps and 12 run
 * timeouts 1 s and more away are all armed when two faults strike; each
 * delay then runs once and never early, each gap is at least 40 ms, each
 * run times out, never early. */
static void test_schedule_restart_rebuilds_waits(void **state)
{
    (void)state;
    enum { ND = 100, NR = 16, NT = 12 }; /* NT: within the blocking threads of one core */
    log *ld[ND], *lr[NR], *lt = log_new(ATAP_SEC(5));
    atap_task d[ND], r[NR], t[NT];
    uint64_t t0 = now_ns(), v;

    for (int i = 0; i < ND; i++) {
        atap_spawn_opts o = {.after_ns = ATAP_SEC(2) + (uint64_t)i * ATAP_MS(2),
                             .out_size = i % 2 ? 16 : 8};
        ld[i] = log_new(0);
        assert_int_equal(atap_spawn(&d[i], logged, ld[i], &o), 0);
    }
    for (int i = 0; i < NR; i++) {
        lr[i] = log_new(ATAP_MS(1));
        r[i] = spawn_logged(
            lr[i], (atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_MS(40), .runs = 6});
    }
    for (int i = 0; i < NT; i++)
        t[i] =
            spawn_logged(lt, (atap_spawn_opts){.timeout_ns = ATAP_SEC(1) + (uint64_t)i * ATAP_MS(3),
                                               .blocking = true});
    /* Every timeout is armed once its run has started. */
    assert_true(wait_atomic_at_least(&lt->runs, NT, ATAP_SEC(10)));
    sleep_us(50000); /* and taken in by the manager (one still in its inbox is not refiled) */
    unsigned restarts0 = atap__manager_restarts();
    atap_inject_manager_faults(2);
    assert_true(wait_restarts(restarts0 + 2, ATAP_SEC(10)));
    assert_int_equal(atap__manager_restarts(), restarts0 + 2);
    if (now_ns() >= t0 + ATAP_SEC(1)) { /* a stalled machine: the figures below mean little */
        print_message("the restarts came %llu ms after the spawns\n",
                      (unsigned long long)((now_ns() - t0) / 1000000));
        skip();
    }
    size_t refiled = atap__manager_refiled();
    if (refiled < ND / 2 + NT)
        fail_msg("the rebuild filed %zu records, wanted the %d scheduled delays and %d timeouts "
                 "at least",
                 refiled, ND / 2, NT);
    for (int i = 0; i < ND; i++) {
        uint64_t v2[2];
        assert_int_equal(atap_join_for(d[i], v2, i % 2 ? 16 : 8, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&ld[i]->runs), 1);
        assert_true(atomic_load(&ld[i]->start[0]) >= t0 + ATAP_SEC(2) + (uint64_t)i * ATAP_MS(2));
        atap_release(d[i]);
    }
    for (int i = 0; i < NT; i++) {
        assert_int_equal(atap_join_for(t[i], &v, 8, ATAP_SEC(10)), ATAP_ETIMEDOUT);
        atap_release(t[i]);
    }
    for (int i = 0; i < NR; i++) {
        assert_true(wait_finished(r[i], ATAP_SEC(10)));
        assert_int_equal(atomic_load(&lr[i]->runs), 6);
        for (int k = 0; k + 1 < 6; k++)
            assert_true(atomic_load(&lr[i]->start[k + 1]) >=
                        atomic_load(&lr[i]->end[k]) + ATAP_MS(40));
        atap_release(r[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&lt->runs), NT);
    for (int i = 0; i < ND; i++)
        free(ld[i]);
    for (int i = 0; i < NR; i++)
        free(lr[i]);
    free(lt);
}

/* ---- repeats ------------------------------------------------------------ */

static void test_schedule_repeat_runs(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_task t = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 5});
    assert_true(wait_finished(t, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&l->runs), 5);
    assert_true(join8(t) == 5); /* the last output stays */
    uint64_t v = 0;
    assert_int_equal(atap_take(t, &v, 8), 0);
    assert_true(v == 5);
    assert_int_equal(atap_join(t, &v, 8), ATAP_EFINISHED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    free(l);
}

/* Runs never overlap, and the gap runs from one end to the next start. */
static void test_schedule_repeat_gap(void **state)
{
    (void)state;
    log *l = log_new(ATAP_MS(5));
    atap_task t =
        spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 4, .every_ns = ATAP_MS(20)});
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (!atap_finished(t) && now_ns() < end)
        sleep_us(500);
    assert_int_equal(atomic_load(&l->runs), 4);
    for (int i = 1; i < 4; i++)
        assert_true(atomic_load(&l->start[i]) >= atomic_load(&l->end[i - 1]) + ATAP_MS(20));
    atap_release(t);
    free(l);
}

/* A 150 ms gap bounded to 200 ms runs at 0 and 150 ms, then stops (the
 * original's 750 ms in 1 s, with room for a loaded machine); no run ever
 * starts past the deadline. */
static void test_schedule_deadline_stops_the_series(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        log *l = log_new(0);
        atap_spawn_opts o = {.kind = ATAP_REPEAT, .every_ns = ATAP_MS(150)};
        uint64_t t0 = now_ns();
        if (k == 0)
            o.for_ns = ATAP_MS(200);
        else
            o.until_ns = atap_now() + ATAP_MS(200);
        atap_task t = spawn_logged(l, o);
        assert_true(wait_finished(t, ATAP_SEC(10)));
        /* Two runs fit (0 and about 150 ms), a third would start past the
         * deadline. A stalled machine may push the second past it too. */
        int runs = atomic_load(&l->runs);
        assert_true(runs == 1 || runs == 2);
        assert_true(join8(t) == (uint64_t)runs);
        for (int i = 0; i < runs; i++) /* until: from t0; for: from the first start */
            assert_true(atomic_load(&l->start[i]) <=
                        (k == 0 ? atomic_load(&l->start[0]) : t0) + ATAP_MS(200));
        atap_release(t);
        free(l);
    }
}

/* Deadlines bind the first run too: a series whose deadline has passed at
 * spawn, or whose start delay ends past it, never runs. Its handle settles
 * at spawn as a series that ran out with nothing readable: ATAP_TAKEN, a
 * join reads ATAP_EFINISHED, atap_finished is true. */
static void test_schedule_deadline_binds_the_first_run(void **state)
{
    (void)state;
    struct {
        atap_kind kind;
        uint64_t every, after;
        int64_t until_from_now; /* until_ns = now + this (negative: passed) */
    } cases[] = {
        {ATAP_REPEAT, 0, 0, -(int64_t)ATAP_MS(1)},
        {ATAP_REPEAT, ATAP_MS(10), 0, -(int64_t)ATAP_MS(1)},
        {ATAP_AT_RATE, ATAP_MS(10), 0, -(int64_t)ATAP_MS(1)},
        {ATAP_REPEAT, 0, ATAP_MS(150), (int64_t)ATAP_MS(30)},
        {ATAP_REPEAT, ATAP_MS(10), ATAP_MS(150), (int64_t)ATAP_MS(30)},
        {ATAP_AT_RATE, ATAP_MS(10), ATAP_MS(150), (int64_t)ATAP_MS(30)},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        log *l = log_new(0);
        uint64_t v = 0;
        atap_state st;
        atap_task t = spawn_logged(
            l, (atap_spawn_opts){
                   .kind = cases[k].kind,
                   .every_ns = cases[k].every,
                   .after_ns = cases[k].after,
                   .until_ns = (uint64_t)((int64_t)atap_now() + cases[k].until_from_now),
               });
        /* Settled at spawn: nothing can ever start. */
        if (!atap_finished(t))
            fail_msg("case %zu: not finished at spawn", k);
        assert_int_equal(atap_try_join(t, &v, 8), ATAP_EFINISHED);
        assert_int_equal(atap_join(t, &v, 8), ATAP_EFINISHED);
        assert_int_equal(atap_take(t, &v, 8), ATAP_EFINISHED);
        assert_int_equal(atap_wait(t, &st), 0);
        assert_int_equal(st, ATAP_TAKEN);
        assert_int_equal(atap_state_of(t), ATAP_TAKEN);
        assert_int_equal(atap_cancel(t), 0); /* nothing left to cancel */
        assert_int_equal(atap_join(t, &v, 8), ATAP_EFINISHED);
        sleep_ms(200); /* past the start delay: still nothing runs */
        if (atomic_load(&l->runs) != 0)
            fail_msg("case %zu: %d runs past the deadline", k, atomic_load(&l->runs));
        atap_release(t);
        free(l);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A waiting series given a value past its until_ns: nothing of it runs,
 * and since no series could ever start again, it takes no more gives. A
 * series that ran before keeps its last output readable. */
static void test_schedule_deadline_binds_a_waiting_series(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        log *l = log_new(0);
        atap_task t;
        uint64_t v = 0;
        uint64_t until = atap_now() + (k == 0 ? 0 : ATAP_MS(200));
        assert_int_equal(atap_spawn_waiting(&t, logged, l, 0,
                                            &(atap_spawn_opts){.out_size = 8,
                                                               .kind = ATAP_REPEAT,
                                                               .every_ns = ATAP_MS(20),
                                                               .until_ns = until}),
                         0);
        if (k == 1) { /* one series in time: runs (unless a loaded machine
                         kept its first run past the deadline too), ends */
            assert_int_equal(atap_give(t, NULL, 0), 0);
            while (atap_now() <= until + ATAP_MS(300)) /* its last run is over */
                sleep_ms(10);
            while (atap_state_of(t) == ATAP_RUNNING)
                sleep_ms(10);
        }
        int runs = atomic_load(&l->runs);
        int rc = atap_give(t, NULL, 0);
        assert_true(rc == 0 || rc == ATAP_EFINISHED);
        assert_true(wait_finished(t, ATAP_SEC(10)));
        assert_int_equal(atap_give(t, NULL, 0), ATAP_EFINISHED);
        rc = atap_join(t, &v, 8);
        if (runs == 0) {
            assert_int_equal(rc, ATAP_EFINISHED);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(v, (uint64_t)runs); /* the last run's output */
        }
        sleep_ms(50);
        assert_int_equal(atomic_load(&l->runs), runs);
        for (int i = 0; i < runs && i < MAX_RUNS; i++) /* 100 ms: claim to fn's clock */
            assert_true(atomic_load(&l->start[i]) <= until + ATAP_MS(100));
        atap_release(t);
        free(l);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A first run still queued at its deadline (no delay, a deadline 20 ms
 * away, every worker busy until 300 ms past it): claimed past the deadline, it
 * never starts, and the series settles as one that ran out. */
static void test_schedule_deadline_binds_a_queued_first_run(void **state)
{
    (void)state;
    /* One worker a core: the pool's target is what it starts with, so it
     * grows no worker while the blockers hold them all. */
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers_per_core = 1}),
                     0);
    blockers *b = blockers_start(); /* every worker held */
    log *l = log_new(0);
    uint64_t v;
    uint64_t until = atap_now() + ATAP_MS(20);
    atap_task t = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .until_ns = until});
    while (atap_now() <= until + ATAP_MS(300))
        sleep_ms(5);
    blockers_stop(b);
    int rc = atap_join(t, &v, 8);
    assert_true(wait_finished(t, ATAP_SEC(10)));
    /* The pool may have grown a worker that ran it in time; any run that
     * started did so by the deadline, and none means nothing readable. */
    int runs = atomic_load(&l->runs);
    for (int i = 0; i < runs && i < MAX_RUNS; i++) /* 100 ms: claim to fn's clock */
        if (atomic_load(&l->start[i]) > until + ATAP_MS(100))
            fail_msg("run %d started %llu ns past the deadline", i,
                     (unsigned long long)(atomic_load(&l->start[i]) - until));
    assert_int_equal(rc, runs ? 0 : ATAP_EFINISHED);
    atap_release(t);
    free(l);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Count and deadline: whichever comes first ends it. */
static void test_schedule_count_or_deadline(void **state)
{
    (void)state;
    log *a = log_new(0), *b = log_new(0);
    atap_task ta = spawn_logged(
        a, (atap_spawn_opts){
               .kind = ATAP_REPEAT, .runs = 3, .every_ns = ATAP_MS(5), .for_ns = ATAP_SEC(5)});
    atap_task tb = spawn_logged(
        b, (atap_spawn_opts){
               .kind = ATAP_REPEAT, .runs = 100, .every_ns = ATAP_MS(20), .for_ns = ATAP_MS(50)});
    uint64_t end = now_ns() + ATAP_SEC(10);
    while ((!atap_finished(ta) || !atap_finished(tb)) && now_ns() < end)
        sleep_us(1000);
    assert_int_equal(atomic_load(&a->runs), 3);
    /* 50 ms hold 3 starts 20 ms apart (fewer on a stalled machine). */
    assert_true(atomic_load(&b->runs) >= 1 && atomic_load(&b->runs) <= 3);
    atap_release(ta);
    atap_release(tb);
    free(a);
    free(b);
}

/* Cancel ends a back-to-back series: no run after it, readers see it. */
static void test_schedule_repeat_cancel(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_task t = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT});
    assert_true(wait_atomic_at_least(&l->runs, 100, ATAP_SEC(10)));
    assert_false(atap_finished(t));
    assert_int_equal(atap_cancel(t), 0);
    uint64_t v;
    assert_int_equal(atap_join(t, &v, 8), ATAP_ECANCELLED);
    assert_true(atap_finished(t));
    sleep_us(20000);
    int runs = atomic_load(&l->runs);
    sleep_us(50000);
    assert_int_equal(atomic_load(&l->runs), runs);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    free(l);
}

/* Joins during a series read increasing run numbers; a take is replaced by
 * the next run. */
static void test_schedule_repeat_reads_latest(void **state)
{
    (void)state;
    log *l = log_new(ATAP_MS(1));
    atap_task t =
        spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 30, .every_ns = ATAP_MS(1)});
    uint64_t last = 0, v;
    while (!atap_finished(t)) {
        int rc = atap_join(t, &v, 8);
        if (rc == 0) {
            assert_true(v >= last);
            last = v;
        } else {
            assert_int_equal(rc, ATAP_ETAKEN);
        }
        if (v % 7 == 0)
            atap_try_take(t, &v, 8);
    }
    assert_true(last <= 30);
    atap_release(t);
    free(l);
}

/* ---- option checks -------------------------------------------------------- */

static int noop(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return 0;
}

static void test_schedule_bad_combinations(void **state)
{
    (void)state;
    atap_task t;
    const atap_spawn_opts bad[] = {
        {.every_ns = 5}, /* a gap without a repeat */
        {.runs = 3},     /* runs on a one-shot */
        {.for_ns = 5},   /* a deadline on a one-shot */
        {.until_ns = 5},
        {.kind = ATAP_REPEAT, .for_ns = 5, .until_ns = 5}, /* two deadlines */
        {.kind = ATAP_AT_RATE},                            /* a rate of nothing */
        {.kind = (atap_kind)7},                            /* no such kind */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(atap_spawn(&t, noop, NULL, &bad[i]), ATAP_EINVAL);
        assert_true(t.id == ATAP_NO_TASK.id);
    }
}

/* ---- at a rate -------------------------------------------------------------- */

typedef struct flight {
    atomic_int started, in_flight, most;
    uint64_t hold_ns;
    atomic_uint_fast64_t at[64]; /* when run i started */
} flight;

static int flown(atap_ctx *ctx, void *arg, void *out)
{
    flight *f = arg;
    int n = atomic_fetch_add(&f->started, 1) + 1;
    if (n <= 64)
        atomic_store(&f->at[n - 1], now_ns());
    int now = atomic_fetch_add(&f->in_flight, 1) + 1, most = atomic_load(&f->most);
    while (now > most && !atomic_compare_exchange_weak(&f->most, &most, now))
        ;
    uint64_t t0 = now_ns();
    while (now_ns() - t0 < f->hold_ns && !atap_cancelled(ctx))
        sleep_us(500);
    atomic_fetch_sub(&f->in_flight, 1);
    uint64_t v = (uint64_t)n;
    memcpy(out, &v, sizeof v);
    return 0;
}

/* A 200 ms run on a 50 ms period: runs overlap (four in flight at once
 * where there are threads for them), start to start. */
static void test_schedule_at_rate_overlaps(void **state)
{
    (void)state;
    flight f = {.hold_ns = ATAP_MS(200)};
    atap_task t;
    assert_int_equal(atap_spawn(&t, flown, &f,
                                &(atap_spawn_opts){.out_size = 8,
                                                   .kind = ATAP_AT_RATE,
                                                   .every_ns = ATAP_MS(50),
                                                   .runs = 8,
                                                   .blocking = true}),
                     0);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (!(atap_finished(t) && atomic_load(&f.in_flight) == 0) && now_ns() < end)
        sleep_us(1000);
    assert_true(atap_finished(t));
    assert_int_equal(atomic_load(&f.started), 8);
    assert_true(atomic_load(&f.most) >= 3);
    uint64_t v = 0;
    assert_int_equal(atap_join(t, &v, 8), 0);
    assert_true(v >= 1 && v <= 8);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Periods missed while the manager restarts are skipped, not made up: no
 * more runs start than periods have passed. */
static void test_schedule_at_rate_skips_missed_periods(void **state)
{
    (void)state;
    flight f = {.hold_ns = 0};
    atap_task t;
    uint64_t t0 = now_ns();
    assert_int_equal(atap_spawn(&t, flown, &f,
                                &(atap_spawn_opts){
                                    .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(20)}),
                     0);
    sleep_us(50000);
    atap_inject_manager_faults(3); /* down for 10 + 20 + 30 ms of backoff at least */
    sleep_us(250000);
    assert_true(wait_atomic_at_least(&f.started, 2, ATAP_SEC(10))); /* a loaded machine */
    assert_int_equal(atap_cancel(t), 0);
    uint64_t periods = (now_ns() - t0) / ATAP_MS(20) + 1;
    int started = atomic_load(&f.started);
    if ((uint64_t)started > periods)
        fail_msg("%d runs started in %llu periods", started, (unsigned long long)periods);
    /* Made-up periods would also start back to back once the manager is
     * back; but so do runs a loaded machine's workers start late, so only
     * the count, which no lateness can raise, is asserted. */
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Cancel stops new runs; a run past its timeout ends the series. */
static void test_schedule_at_rate_cancel_and_timeout(void **state)
{
    (void)state;
    flight f = {.hold_ns = 0};
    atap_task t;
    assert_int_equal(
        atap_spawn(&t, flown, &f,
                   &(atap_spawn_opts){.out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(5)}),
        0);
    assert_true(wait_atomic_at_least(&f.started, 3, ATAP_SEC(10)));
    assert_int_equal(atap_cancel(t), 0);
    sleep_us(30000);
    int n = atomic_load(&f.started);
    sleep_us(50000);
    assert_int_equal(atomic_load(&f.started), n);
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    atap_release(t);

    flight g = {.hold_ns = ATAP_SEC(5)};
    assert_int_equal(atap_spawn(&t, flown, &g,
                                &(atap_spawn_opts){.out_size = 8,
                                                   .kind = ATAP_AT_RATE,
                                                   .every_ns = ATAP_MS(100),
                                                   .timeout_ns = ATAP_MS(30),
                                                   .blocking = true}),
                     0);
    assert_int_equal(atap_join_for(t, &(uint64_t){0}, 8, ATAP_SEC(10)), ATAP_ETIMEDOUT);
    assert_true(atap_finished(t));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Released while a run is under way, an at-rate series' handle reads as
 * any released handle does (no task), though the series stays for its run
 * to publish to: the run's hold used to count as a listener, so the
 * released handle still read, could be dup'ed, and a second release freed
 * the series under its run. */
static void test_schedule_at_rate_released_during_run(void **state)
{
    (void)state;
    flight f = {.hold_ns = ATAP_MS(200)};
    atap_task t, d;
    uint64_t v;
    assert_int_equal(
        atap_spawn(&t, flown, &f,
                   &(atap_spawn_opts){
                       .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(20), .runs = 1}),
        0);
    assert_true(wait_atomic_at_least(&f.started, 1, ATAP_SEC(10)));
    atap_release(t);
    if (atomic_load(&f.in_flight) != 1)
        skip(); /* the run is over already (a loaded machine): nothing to see */
    assert_int_equal(atap_state_of(t), ATAP_FAILED); /* no task */
    assert_true(atap_finished(t));
    assert_int_equal(atap_join(t, &v, 8), ATAP_ENOTASK);
    assert_int_equal(atap_cancel(t), ATAP_ENOTASK);
    assert_int_equal(atap_dup(t, &d), ATAP_ENOTASK);
    atap_release(t);                           /* a handle with no task: ignored */
    assert_true(wait_live_back(ATAP_SEC(10))); /* the run ended, the series went */
    assert_int_equal(atomic_load(&f.in_flight), 0);
}

/* A period so long that the next start is past the clock's end: one run,
 * then none (the sum used to wrap and start the runs back to back). */
static void test_schedule_at_rate_huge_period_runs_once(void **state)
{
    (void)state;
    flight f = {.hold_ns = 0};
    atap_task t;
    assert_int_equal(atap_spawn(&t, flown, &f,
                                &(atap_spawn_opts){.out_size = 8,
                                                   .kind = ATAP_AT_RATE,
                                                   .every_ns = UINT64_MAX - 5,
                                                   .runs = 50}),
                     0);
    assert_true(wait_atomic_at_least(&f.started, 1, ATAP_SEC(10)));
    sleep_us(300000);
    assert_int_equal(atomic_load(&f.started), 1);
    assert_false(atap_finished(t));
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Two overlapping runs: the first outputs 5 at once, the second fails a
 * while after the series ran out of runs. The series is not finished while
 * that run is out, and its failure leaves the output that stands. */
static atomic_int late_n, late_done;

static int first_ok_then_late_fail(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    if (atomic_fetch_add(&late_n, 1) == 0) {
        uint64_t v = 5;
        memcpy(out, &v, sizeof v);
        return 0;
    }
    sleep_ms(150);
    atomic_store(&late_done, 1);
    return 1;
}

static void test_schedule_at_rate_ran_out_keeps_output(void **state)
{
    (void)state;
    atap_task t;
    uint64_t v = 0;
    atomic_store(&late_n, 0);
    atomic_store(&late_done, 0);
    assert_int_equal(
        atap_spawn(&t, first_ok_then_late_fail, NULL,
                   &(atap_spawn_opts){
                       .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(2), .runs = 2}),
        0);
    assert_true(wait_atomic_at_least(&late_n, 2, ATAP_SEC(10)));
    assert_int_equal(atap_join_for(t, &v, 8, ATAP_SEC(10)), 0); /* the first output */
    assert_true(v == 5);
    bool fin = atap_finished(t);
    if (!atomic_load(&late_done))
        assert_false(fin); /* a run is still out */
    assert_true(wait_atomic_at_least(&late_done, 1, ATAP_SEC(10)));
    assert_true(wait_finished(t, ATAP_SEC(10)));
    sleep_ms(20); /* the failed run's end is done with the series */
    v = 0;
    assert_int_equal(atap_join(t, &v, 8), 0); /* its failure left the output */
    assert_true(v == 5);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Overlapping runs failing with different codes: every reader reads the
 * first one, before and after the other fails. */
static atomic_int codes_n;

static int fail_plain_then_closed(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    if (atomic_fetch_add(&codes_n, 1) == 0) {
        sleep_ms(10);
        return 1;
    }
    sleep_ms(100);
    return ATAP_ECLOSED;
}

static void test_schedule_at_rate_fail_code_stays(void **state)
{
    (void)state;
    atap_task t;
    uint64_t v;
    atomic_store(&codes_n, 0);
    assert_int_equal(
        atap_spawn(&t, fail_plain_then_closed, NULL,
                   &(atap_spawn_opts){
                       .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(2), .runs = 2}),
        0);
    int first = atap_join_for(t, &v, 8, ATAP_SEC(10));
    if (first != ATAP_EFAILED && first != ATAP_ECLOSED)
        fail_msg("the first join read %d (%s)", first, atap_strerror(first));
    sleep_ms(250); /* the other run failed too */
    assert_int_equal(atap_join(t, &v, 8), first);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A run's output copied into its at-rate series while a cancel ends the
 * series (the old output's out_free is slow, so the cancel lands between
 * the copy and the publish): the series owns the copy and lets go of it
 * once. The run used to let go of it as well (two out_frees). */
static atomic_int pub_runs, pub_in_free, pub_freed[8];

static void pub_out_free(void *out)
{
    uint64_t id;
    memcpy(&id, out, sizeof id);
    if (id == 0) {
        atomic_store(&pub_in_free, 1);
        sleep_ms(200);
    }
    if (id < 8)
        atomic_fetch_add(&pub_freed[id], 1);
}

static int pub_run(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t id = (uint64_t)atomic_fetch_add(&pub_runs, 1);
    memcpy(out, &id, sizeof id);
    return 0;
}

static void test_schedule_at_rate_publish_cancelled_frees_once(void **state)
{
    (void)state;
    atap_task t;
    atomic_store(&pub_runs, 0);
    atomic_store(&pub_in_free, 0);
    for (int i = 0; i < 8; i++)
        atomic_store(&pub_freed[i], 0);
    assert_int_equal(atap_spawn(&t, pub_run, NULL,
                                &(atap_spawn_opts){.out_size = 8,
                                                   .out_free = pub_out_free,
                                                   .kind = ATAP_AT_RATE,
                                                   .every_ns = ATAP_MS(100),
                                                   .runs = 3}),
                     0);
    /* run 1 publishes: it lets go of run 0's output first, slowly */
    assert_true(wait_atomic_at_least(&pub_in_free, 1, ATAP_SEC(10)));
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    int runs = atomic_load(&pub_runs);
    assert_true(runs >= 2 && runs <= 8);
    for (int i = 0; i < runs; i++)
        if (atomic_load(&pub_freed[i]) != 1)
            fail_msg("output %d let go of %d times", i, atomic_load(&pub_freed[i]));
}

/* An at-rate series written off at shutdown (FAILED, its next period
 * never to come) while a run is out that then fails with a code of its
 * own: readers read EFAILED before that run ends and after it alike. */
static atomic_int wo_started;
static int wo_join_rc = 1;
static atap_task wo_task;

static int slow_then_closed(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&wo_started, 1);
    sleep_ms(300);
    return ATAP_ECLOSED;
}

static void *wo_joiner(void *arg)
{
    (void)arg;
    uint64_t v;
    wo_join_rc = atap_join(wo_task, &v, 8);
    return NULL;
}

static void test_schedule_at_rate_written_off_code_stays(void **state)
{
    (void)state;
    uint64_t v;
    pthread_t th;
    atomic_store(&wo_started, 0);
    assert_int_equal(atap_spawn(&wo_task, slow_then_closed, NULL,
                                &(atap_spawn_opts){
                                    .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_SEC(10)}),
                     0);
    assert_true(wait_atomic_at_least(&wo_started, 1, ATAP_SEC(10)));
    assert_int_equal(pthread_create(&th, NULL, wo_joiner, NULL), 0);
    sleep_ms(20);
    assert_int_equal(atap_shutdown(), 0); /* the period is written off; the run ends in the drain */
    pthread_join(th, NULL);
    int after = atap_join(wo_task, &v, 8);
    if (wo_join_rc != ATAP_EFAILED || after != ATAP_EFAILED)
        fail_msg("read %d (%s) while the run was out, %d (%s) after", wo_join_rc,
                 atap_strerror(wo_join_rc), after, atap_strerror(after));
    atap_release(wo_task);
    assert_int_equal(atap_init(NULL), 0);
}

static int fail_closed(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return ATAP_ECLOSED;
}

/* A series ended by a run that failed with an ATAP_E* code reads that
 * code, at a rate as with a gap. */
static void test_schedule_series_keeps_fail_code(void **state)
{
    (void)state;
    static const atap_kind kinds[] = {ATAP_REPEAT, ATAP_AT_RATE};
    for (int i = 0; i < 2; i++) {
        atap_task t;
        uint64_t v;
        assert_int_equal(
            atap_spawn(&t, fail_closed, NULL,
                       &(atap_spawn_opts){
                           .out_size = 8, .kind = kinds[i], .every_ns = ATAP_MS(5), .runs = 3}),
            0);
        assert_int_equal(atap_join_for(t, &v, 8, ATAP_SEC(10)), ATAP_ECLOSED);
        assert_int_equal(atap_state_of(t), ATAP_FAILED);
        atap_release(t);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- what stops an at-rate series stops its runs ------------------------ */

/* An at-rate run that sleeps (a kernel wait) or spins for hold_ns, and
 * notes what it saw: whether it started after `stopped_at` (when the stop
 * returned) without seeing atap_cancelled, what its sleep returned. */
typedef struct rate {
    atomic_int started, ended, unstopped_late, sleep_ok, saw_cancel;
    atomic_int self_mismatch, self_cancel_rc, self_join_rc;
    _Atomic uint64_t stopped_at; /* UINT64_MAX until the stop returned */
    _Atomic uint64_t self_id;    /* atap_self's, as the first run saw it */
    uint64_t hold_ns;
    bool spin;          /* spin on the CPU (hold the worker) instead of sleeping */
    int cancel_self_at; /* this run (1, 2, ...) cancels the series itself */
    int fd;             /* rate_parks: parks on this fd */
} rate;

static void rate_init(rate *r, uint64_t hold_ns, bool spin)
{
    memset(r, 0, sizeof *r);
    atomic_store(&r->stopped_at, UINT64_MAX);
    r->hold_ns = hold_ns;
    r->spin = spin;
    atomic_store(&r->self_cancel_rc, 1);
    atomic_store(&r->self_join_rc, 1);
}

static int rate_run(atap_ctx *ctx, void *arg, void *out)
{
    rate *r = arg;
    int i = atomic_fetch_add(&r->started, 1) + 1;
    uint64_t t0 = now_ns();
    bool cancelled_at_start = atap_cancelled(ctx);
    atap_task self = atap_self(ctx);

    uint64_t first = 0;
    if (!atomic_compare_exchange_strong(&r->self_id, &first, self.id) && first != self.id)
        atomic_fetch_add(&r->self_mismatch, 1);
    if (i == 1) /* its own series could only settle once this returns */
        atomic_store(&r->self_join_rc, atap_join_for(self, &(uint64_t){0}, 8, ATAP_SEC(2)));
    if (i == r->cancel_self_at) {
        atomic_store(&r->self_cancel_rc, atap_cancel(self));
        atomic_store(&r->stopped_at, now_ns());
    }
    if (r->spin) {
        while (now_ns() - t0 < r->hold_ns && !atomic_load(&g_release_all))
            ;
    } else if (atap_sleep(r->hold_ns) == 0) {
        atomic_fetch_add(&r->sleep_ok, 1);
    }
    if (atap_cancelled(ctx))
        atomic_fetch_add(&r->saw_cancel, 1);
    /* Read last: by now the stop that came before t0, if any, is noted. */
    if (t0 > atomic_load(&r->stopped_at) && !cancelled_at_start)
        atomic_fetch_add(&r->unstopped_late, 1);
    memcpy(out, &(uint64_t){(uint64_t)i}, 8);
    atomic_fetch_add(&r->ended, 1);
    return 0;
}

static atap_task rate_spawn(rate *r, atap_spawn_opts o)
{
    o.kind = ATAP_AT_RATE;
    o.out_size = 8;
    atap_task t;
    assert_int_equal(atap_spawn(&t, rate_run, r, &o), 0);
    return t;
}

/* Every run's atap_self named the series t. */
static void rate_check_self(rate *r, atap_task t)
{
    assert_int_equal(atomic_load(&r->self_mismatch), 0);
    assert_true(atomic_load(&r->self_id) == t.id);
}

/* Every run has ended, and stays so (no run starts late). */
static bool rate_all_ended(rate *r, uint64_t timeout_ns)
{
    uint64_t until = now_ns() + timeout_ns;

    for (;;) {
        int s = atomic_load(&r->started);
        if (s == atomic_load(&r->ended)) {
            sleep_ms(50);
            if (s == atomic_load(&r->started) && s == atomic_load(&r->ended))
                return true;
        }
        if (now_ns() > until)
            return false;
        sleep_ms(2);
    }
}

/* A cancel reaches the runs under way: their kernel waits end at once with
 * ATAP_ECANCELLED and they read atap_cancelled (each run was a slot of its
 * own, which a cancel of the series never reached: a 30 s sleep ran out). */
static void test_schedule_at_rate_cancel_reaches_runs(void **state)
{
    (void)state;
    rate r;
    rate_init(&r, ATAP_SEC(30), false);
    atap_task t = rate_spawn(&r, (atap_spawn_opts){.every_ns = ATAP_MS(5)});
    assert_true(wait_atomic_at_least(&r.started, 3, ATAP_SEC(10)));
    uint64_t t0 = now_ns();
    assert_int_equal(atap_cancel(t), 0);
    atomic_store(&r.stopped_at, now_ns());
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    assert_true(rate_all_ended(&r, ATAP_SEC(10)));
    assert_true(now_ns() - t0 < ATAP_SEC(10)); /* not the 30 s of a sleep */
    assert_int_equal(atomic_load(&r.sleep_ok), 0);
    assert_int_equal(atomic_load(&r.saw_cancel), atomic_load(&r.started));
    assert_int_equal(atomic_load(&r.unstopped_late), 0);
    rate_check_self(&r, t);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* With the pool full (runs of 150 ms every 5 ms), the queued runs never
 * start once the cancel has returned: 12-13 of them used to, up to 230 ms
 * later. A run that starts after it reads atap_cancelled at once. */
static void test_schedule_at_rate_cancel_stops_queued_runs(void **state)
{
    (void)state;
    rate r;
    rate_init(&r, ATAP_MS(150), true);
    atap_task t = rate_spawn(&r, (atap_spawn_opts){.every_ns = ATAP_MS(5)});
    assert_true(wait_atomic_at_least(&r.started, 4, ATAP_SEC(10)));
    sleep_ms(100); /* the queue fills */
    assert_int_equal(atap_cancel(t), 0);
    atomic_store(&r.stopped_at, now_ns());
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    assert_true(rate_all_ended(&r, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&r.unstopped_late), 0);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* atap_self inside a run names the series: a run can end its own series,
 * and a run's join on it is a task waiting for itself (ATAP_EINVAL), not a
 * hang. */
static void test_schedule_at_rate_self_names_the_series(void **state)
{
    (void)state;
    rate r;
    rate_init(&r, ATAP_MS(1), false);
    r.cancel_self_at = 3;
    atap_task t = rate_spawn(&r, (atap_spawn_opts){.every_ns = ATAP_MS(10)});
    assert_true(wait_atomic_at_least(&r.started, 3, ATAP_SEC(20)));
    assert_true(rate_all_ended(&r, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&r.self_cancel_rc), 0);
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    assert_int_equal(atomic_load(&r.self_join_rc), ATAP_EINVAL);
    rate_check_self(&r, t);
    assert_true(atomic_load(&r.started) >= 3);
    assert_int_equal(atomic_load(&r.unstopped_late), 0);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A run past its timeout ends the series TIMED_OUT, and that stops every
 * other run under way too. */
static void test_schedule_at_rate_timeout_stops_every_run(void **state)
{
    (void)state;
    rate r;
    rate_init(&r, ATAP_SEC(30), false);
    atap_task t =
        rate_spawn(&r, (atap_spawn_opts){.every_ns = ATAP_MS(10), .timeout_ns = ATAP_MS(300)});
    uint64_t t0 = now_ns();
    assert_int_equal(atap_join_for(t, &(uint64_t){0}, 8, ATAP_SEC(20)), ATAP_ETIMEDOUT);
    atomic_store(&r.stopped_at, now_ns());
    assert_true(rate_all_ended(&r, ATAP_SEC(10)));
    assert_true(now_ns() - t0 < ATAP_SEC(20));
    assert_int_equal(atomic_load(&r.sleep_ok), 0);
    /* Every run was stopped: about 30 start before the first times out (on
     * a stalled machine maybe only that one). The join may read TIMED_OUT
     * a moment before the stop reaches a run claimed just then: so no
     * assertion on when a run began, unlike after atap_cancel, which
     * returns once its runs are reached. */
    assert_int_equal(atomic_load(&r.saw_cancel), atomic_load(&r.started));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A run parked on an fd is taken down by a cancel of its series: a cancel
 * and a release leave nothing live (two slots used to stay until shutdown). */
static int rate_parks(atap_ctx *ctx, void *arg, void *out)
{
    rate *r = arg;
    (void)out;
    if (!atap_resumed(ctx))
        atomic_fetch_add(&r->started, 1);
    int rc = atap_park_fd(ctx, r->fd, ATAP_READABLE, ATAP_FOREVER);
    if (rc != 0) {
        atomic_fetch_add(&r->self_mismatch, 1);
        atomic_fetch_add(&r->ended, 1);
        return rc;
    }
    return ATAP_PARKED;
}

static void test_schedule_at_rate_cancel_takes_down_parked_runs(void **state)
{
    (void)state;
    rate r;
    int fds[2];
    atap_task t;
    rate_init(&r, 0, false);
    assert_int_equal(pipe(fds), 0);
    r.fd = fds[0];
    size_t before = pool_stats().live;
    assert_int_equal(
        atap_spawn(&t, rate_parks, &r,
                   &(atap_spawn_opts){
                       .out_size = 8, .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(10), .runs = 2}),
        0);
    assert_true(wait_atomic_at_least(&r.started, 2, ATAP_SEC(10)));
    assert_true(pool_stats().live >= before + 3); /* the series and its two runs */
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&r.self_mismatch), 0);
    close(fds[0]);
    close(fds[1]);
}

/* A shutdown writes an at-rate series off, and that stops its runs: their
 * kernel waits end, and the shutdown does not wait out a 30 s sleep. */
static void test_schedule_at_rate_shutdown_stops_runs(void **state)
{
    (void)state;
    rate r;
    rate_init(&r, ATAP_SEC(30), false);
    atap_task t = rate_spawn(&r, (atap_spawn_opts){.every_ns = ATAP_MS(10)});
    assert_true(wait_atomic_at_least(&r.started, 2, ATAP_SEC(10)));
    uint64_t t0 = now_ns();
    assert_int_equal(atap_shutdown(), 0);
    assert_true(now_ns() - t0 < ATAP_SEC(20));
    assert_int_equal(atomic_load(&r.started), atomic_load(&r.ended));
    assert_int_equal(atomic_load(&r.sleep_ok), 0);
    assert_int_equal(atap_join(t, &(uint64_t){0}, 8), ATAP_EFAILED);
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* A one-shot task with a delay or a timeout is still a one-shot: its
 * output taken, later readers read ATAP_ETAKEN (ATAP_EFINISHED is for a
 * series that ran out). */
static void test_schedule_one_shot_taken_reads_taken(void **state)
{
    (void)state;
    static const atap_spawn_opts opts[] = {
        {.out_size = 8, .after_ns = ATAP_MS(1)},
        {.out_size = 8, .timeout_ns = ATAP_SEC(10)},
    };
    for (int i = 0; i < 2; i++) {
        log *l = log_new(0);
        atap_task t = spawn_logged(l, opts[i]);
        uint64_t v = 0;
        assert_int_equal(atap_take(t, &v, 8), 0);
        assert_true(v == 1);
        assert_int_equal(atap_take(t, &v, 8), ATAP_ETAKEN);
        assert_int_equal(atap_join(t, &v, 8), ATAP_ETAKEN);
        assert_true(atap_finished(t));
        atap_release(t);
        free(l);
    }
}

/* ---- endings -------------------------------------------------------------- */

/* A delay still pending at shutdown reads FAILED, and its handle still
 * reads after the shutdown. */
static void test_schedule_shutdown_writes_off_delays(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_task t = spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_SEC(60)});
    atap_task r = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_SEC(60)});
    assert_true(wait_atomic_at_least(&l->runs, 1, ATAP_SEC(10))); /* r ran once */
    assert_int_equal(atap_shutdown(), 0);
    uint64_t v;
    assert_int_equal(atap_join(t, &v, 8), ATAP_EFAILED);
    assert_int_equal(atap_join(r, &v, 8), ATAP_EFAILED);
    atap_release(t);
    atap_release(r);
    assert_int_equal(atap_init(NULL), 0);
    free(l);
}

/* The manager gone for good: repeats between runs settle FAILED, and the
 * pool still runs plain tasks. */
static void test_schedule_manager_gone_fails_repeats(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_task r = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_MS(30)});
    assert_true(wait_atomic_at_least(&l->runs, 2, ATAP_SEC(10)));
    atap_inject_manager_faults(16);
    uint64_t v;
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (atap_state_of(r) != ATAP_FAILED && now_ns() < end)
        sleep_us(1000);
    assert_true(atap_state_of(r) == ATAP_FAILED);
    assert_true(atap_finished(r));
    atap_release(r);
    /* a delayed spawn now fails at once rather than waiting forever */
    atap_task d = spawn_logged(l, (atap_spawn_opts){.after_ns = ATAP_MS(10)});
    assert_int_equal(atap_join_for(d, &v, 8, ATAP_SEC(5)), ATAP_EFAILED);
    atap_release(d);
    atap_task p;
    assert_int_equal(atap_spawn(&p, noop, NULL, NULL), 0);
    assert_int_equal(atap_join(p, NULL, 0), 0);
    atap_release(p);
    free(l);
}

/* A repeat's run hands its RUN to the gap's timer and is still looking at
 * the timer's record when the manager goes for good: the close takes the
 * record, writes the task off, and the last handle goes (the schedule
 * freed, unless the arm under way keeps it). Under ASan or TSan a schedule
 * freed then is a use after free when the arm looks again. */
static void test_schedule_manager_gone_during_arm(void **state)
{
    (void)state;
    log *l = log_new(0);
    atap_inject_arm_pause(2000); /* the first run's arm of its 60 s gap */
    atap_task r = spawn_logged(l, (atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_SEC(60)});
    assert_true(wait_atomic_at_least(&l->runs, 1, ATAP_SEC(10)));
    atap_inject_manager_faults(16);
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (atap_state_of(r) != ATAP_FAILED && now_ns() < end)
        sleep_us(1000);
    assert_true(atap_state_of(r) == ATAP_FAILED); /* written off by the close */
    assert_false(status_now().manager_alive);
    atap_release(r);   /* while the arm still sleeps: its schedule must stay */
    sleep_us(2500000); /* the arm wakes and looks at its record again */
    assert_int_equal(atomic_load(&l->runs), 1);
    free(l);
}

/* A repeat's output that was taken is the taker's: whatever ends the series
 * after (a cancel, a failing run), out_free never sees it. */
static void *_Atomic freed_outs[8];
static atomic_int nfreed_outs, plain_runs, fail_after_first;

static void note_out_free(void *out)
{
    void *p;
    int i = atomic_fetch_add(&nfreed_outs, 1);

    memcpy(&p, out, sizeof p);
    if (i < 8)
        atomic_store(&freed_outs[i], p);
    free(p);
}

static int fresh_block(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    atomic_int *runs = arg;
    void *p;

    if (atomic_fetch_add(runs, 1) >= 1 && arg == (void *)&fail_after_first)
        return -1; /* the second run fails */
    p = malloc(16);
    memcpy(out, &p, sizeof p);
    return 0;
}

static void test_schedule_taken_output_not_freed(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        atomic_int *runs = variant ? &fail_after_first : &plain_runs;
        atap_task t;
        void *got = NULL;

        atomic_store(runs, 0);
        atomic_store(&nfreed_outs, 0);
        assert_int_equal(
            atap_spawn(&t, fresh_block, runs,
                       &(atap_spawn_opts){.out_size = sizeof(void *),
                                          .out_free = note_out_free,
                                          .kind = ATAP_REPEAT,
                                          .every_ns = variant ? ATAP_MS(200) : ATAP_SEC(60)}),
            0);
        assert_int_equal(atap_take(t, &got, sizeof got), 0);
        assert_non_null(got);
        if (variant == 0) {
            assert_int_equal(atap_cancel(t), 0); /* TAKEN -> CANCELLED */
        } else {
            atap_state st;
            assert_int_equal(atap_wait(t, &st), 0); /* the second run fails */
        }
        atap_release(t);
        assert_true(wait_live_back(ATAP_SEC(10)));
        for (int i = 0; i < atomic_load(&nfreed_outs) && i < 8; i++)
            if (atomic_load(&freed_outs[i]) == got)
                fail_msg("variant %d: out_free called on the output atap_take moved out", variant);
        free(got);
    }
}

/* A run with a long limit still under way at shutdown (the manager stops
 * first and takes its limit timer unfired) ends with its output, not
 * ATAP_TIMED_OUT. */
static int slow_42(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t v = 42;
    sleep_us(300000);
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_schedule_limit_under_way_at_shutdown(void **state)
{
    (void)state;
    atap_task t;
    uint64_t v = 0;

    assert_int_equal(atap_spawn(&t, slow_42, NULL,
                                &(atap_spawn_opts){.out_size = 8, .timeout_ns = ATAP_SEC(30)}),
                     0);
    sleep_us(50000); /* running */
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    assert_true(v == 42);
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0);
}

/* Runs with a timeout that end while a shutdown stops the manager (the
 * hook holds it between joining the supervisor and taking the timers
 * back): their schedules must wait for that take, not be freed under it
 * (a use after free the sanitizer stages see). */
static atomic_int limits_started;

static int sleep_60ms(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&limits_started, 1);
    sleep_ms(60);
    return 0;
}

static void hold_150ms(void) { sleep_ms(150); }

static void test_schedule_limits_end_while_manager_stops(void **state)
{
    (void)state;
    enum { N = 8 };
    atomic_store(&limits_started, 0);
    for (int i = 0; i < N; i++) {
        atap_task t;
        assert_int_equal(
            atap_spawn(&t, sleep_60ms, NULL,
                       &(atap_spawn_opts){.timeout_ns = ATAP_SEC(30), .blocking = true}),
            0);
        atap_release(t);
    }
    assert_true(wait_atomic_at_least(&limits_started, N, ATAP_SEC(10)));
    sleep_us(5000); /* their limits filed */
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_JOINED, hold_150ms), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_JOINED, NULL), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* Repeats whose handles are released after shutdown give back their
 * schedules at once (with their scratch outputs), not at the next start:
 * seen in the allocator's count of bytes in use (glibc; skipped where the
 * allocator does not keep one, as under the sanitizers). */
static int fill_big(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    memset(out, 0x5a, 1 << 16);
    return 0;
}

static void test_schedule_released_after_shutdown_frees(void **state)
{
    (void)state;
    enum { N = 32, SIZE = 1 << 16 };
    static unsigned char buf[SIZE];
    atap_task ts[N];

    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_spawn(&ts[i], fill_big, NULL,
                                    &(atap_spawn_opts){.out_size = SIZE,
                                                       .kind = ATAP_REPEAT,
                                                       .every_ns = ATAP_SEC(60)}),
                         0);
        assert_int_equal(atap_join(ts[i], buf, SIZE), 0); /* ran once */
    }
    assert_int_equal(atap_shutdown(), 0);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < N; i++)
        atap_release(ts[i]);
    struct mallinfo2 after = mallinfo2();
    assert_int_equal(atap_init(NULL), 0);
    if (before.uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    /* each held a heap output and a scratch of SIZE: both must go */
    if (before.uordblks < after.uordblks + (size_t)N * SIZE * 2)
        fail_msg("%zu bytes given back by releasing %d repeats after shutdown, want %zu",
                 before.uordblks - after.uordblks, N, (size_t)N * SIZE * 2);
}

/* Repeats cancelled between runs an hour apart, their handles released:
 * the disarmed gap records go at the manager's next pass, and the
 * schedules (each with a 64 KiB scratch) with them, not an hour later. */
static void test_schedule_cancelled_far_gap_freed_soon(void **state)
{
    (void)state;
    enum { N = 32, SIZE = 1 << 16 };
    static unsigned char buf[SIZE];
    atap_task ts[N];

    if (mallinfo2().uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_spawn(&ts[i], fill_big, NULL,
                                    &(atap_spawn_opts){.out_size = SIZE,
                                                       .kind = ATAP_REPEAT,
                                                       .every_ns = ATAP_SEC(3600)}),
                         0);
        assert_int_equal(atap_join(ts[i], buf, SIZE), 0); /* ran once: the gap is armed */
    }
    sleep_us(50000); /* the manager has filed the gaps */
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_cancel(ts[i]), 0);
        atap_release(ts[i]);
    }
    /* each held a heap output and a scratch of SIZE: both must go */
    uint64_t end = now_ns() + ATAP_SEC(5);
    size_t given = 0;
    do {
        struct mallinfo2 now = mallinfo2();
        given = before.uordblks > now.uordblks ? before.uordblks - now.uordblks : 0;
        if (given >= (size_t)N * SIZE * 2)
            break;
        sleep_us(10000);
    } while (now_ns() < end);
    if (given < (size_t)N * SIZE * 2)
        fail_msg("%zu bytes given back within 5 s of releasing %d cancelled repeats, want %zu",
                 given, N, (size_t)N * SIZE * 2);
}

/* ---- every output reaches its reader or its out_free, exactly once ---- */

/* An output owns heap memory (so LeakSanitizer sees one that is dropped)
 * and carries a number of its own; each is let go of exactly once: moved
 * out by a take, or passed to out_free. */
#define ACC_IDS 4096
typedef struct acc_out {
    uint64_t id;
    void *mem;
} acc_out;

static atomic_int acc_made, acc_taken, acc_freed, acc_next;
static atomic_int acc_seen[ACC_IDS]; /* times each output was let go of */

typedef struct acc_task {
    atomic_int started, active; /* runs begun; runs under way */
    int slow_from;              /* runs from this one on are slow */
    uint64_t slow_ns;           /* a slow run holds this long, or until stopped */
} acc_task;

static void acc_let_go(acc_out *o, atomic_int *counter)
{
    atomic_fetch_add(counter, 1);
    if (o->id < ACC_IDS)
        atomic_fetch_add(&acc_seen[o->id], 1);
    free(o->mem);
}

static void acc_out_free(void *out) { acc_let_go(out, &acc_freed); }

static int acc_run(atap_ctx *ctx, void *arg, void *out)
{
    acc_task *a = arg;
    int i = atomic_fetch_add(&a->started, 1);

    atomic_fetch_add(&a->active, 1);
    if (i >= a->slow_from) {
        uint64_t t0 = now_ns();
        while (now_ns() - t0 < a->slow_ns && !atap_cancelled(ctx))
            sleep_us(500);
    }
    acc_out o = {.id = (uint64_t)atomic_fetch_add(&acc_next, 1), .mem = malloc(32)};
    assert_non_null(o.mem);
    memcpy(out, &o, sizeof o);
    atomic_fetch_add(&acc_made, 1);
    atomic_fetch_sub(&a->active, 1);
    return 0;
}

static void acc_take(atap_task t, uint64_t timeout_ns)
{
    acc_out o;

    if (atap_take_for(t, &o, sizeof o, timeout_ns) == 0)
        acc_let_go(&o, &acc_taken);
}

enum { ACC_ONCE, ACC_REPEAT, ACC_AT_RATE, ACC_WAIT_ONCE, ACC_WAIT_REPEAT, ACC_KINDS };
enum { ACC_CANCEL, ACC_TIMEOUT, ACC_RUNS, ACC_RELEASE, ACC_SHUTDOWN, ACC_STOPS };
static const char *const acc_kind_name[] = {"once", "repeat", "at-rate", "waiting once",
                                            "waiting repeat"};
static const char *const acc_stop_name[] = {"cancel mid-run", "timeout mid-run", "runs limit",
                                            "release mid-run", "shutdown mid-run"};

static bool acc_scenario(int kind, int stop)
{
    bool waiting = kind == ACC_WAIT_ONCE || kind == ACC_WAIT_REPEAT;
    bool series = kind == ACC_REPEAT || kind == ACC_AT_RATE || kind == ACC_WAIT_REPEAT;
    acc_task *a = calloc(1, sizeof *a);
    atap_spawn_opts o = {.out_size = sizeof(acc_out), .out_free = acc_out_free};
    atap_task t;

    assert_non_null(a);
    a->slow_from = stop == ACC_RUNS ? 1 << 30 : series ? 3 : 0;
    a->slow_ns = stop == ACC_RELEASE || stop == ACC_SHUTDOWN ? ATAP_MS(300) : ATAP_SEC(3);
    o.kind = kind == ACC_AT_RATE ? ATAP_AT_RATE : series ? ATAP_REPEAT : ATAP_ONCE;
    o.every_ns = kind == ACC_AT_RATE ? ATAP_MS(10) : series ? ATAP_MS(2) : 0;
    if (stop == ACC_TIMEOUT)
        o.timeout_ns = ATAP_MS(150);
    if (series && stop == ACC_RUNS)
        o.runs = 3;
    if (series && stop == ACC_RELEASE) /* the slow run is the last */
        o.runs = (uint32_t)a->slow_from + 1;
    if (waiting && stop == ACC_RUNS) /* then it takes no more gives */
        o.gives = kind == ACC_WAIT_ONCE ? 2 : 1;
    if (waiting) {
        assert_int_equal(atap_spawn_waiting(&t, acc_run, a, 0, &o), 0);
        assert_int_equal(atap_give(t, NULL, 0), 0);
        if (kind == ACC_WAIT_ONCE && stop == ACC_RUNS) {
            assert_true(wait_atomic_at_least(&a->started, 1, ATAP_SEC(10)));
            assert_int_equal(atap_give(t, NULL, 0), 0);
        }
    } else {
        assert_int_equal(atap_spawn(&t, acc_run, a, &o), 0);
    }
    if (series && a->slow_from > 1) { /* one taken between runs */
        assert_true(wait_atomic_at_least(&a->started, 1, ATAP_SEC(10)));
        acc_take(t, ATAP_SEC(2));
    }
    if (stop != ACC_RUNS && stop != ACC_TIMEOUT) /* a slow run under way */
        assert_true(wait_atomic_at_least(&a->started, a->slow_from + 1, ATAP_SEC(10)));
    switch (stop) {
    case ACC_CANCEL:
        assert_int_equal(atap_cancel(t), 0);
        break;
    case ACC_TIMEOUT:
    case ACC_RUNS:
        assert_true(wait_finished(t, ATAP_SEC(20)));
        acc_take(t, 0);
        break;
    case ACC_SHUTDOWN:
        assert_int_equal(atap_shutdown(), 0);
        acc_take(t, 0);
        atap_release(t);
        assert_int_equal(atap_init(NULL), 0);
        break;
    default:
        break;
    }
    if (stop != ACC_SHUTDOWN)
        atap_release(t);
    if (!wait_live_back(ATAP_SEC(20)))
        fail_msg("%s, %s: the task never went (%zu live)", acc_kind_name[kind], acc_stop_name[stop],
                 pool_stats().live);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (atomic_load(&a->active) != 0 && now_ns() < end)
        sleep_us(500);
    int made = atomic_load(&acc_made), taken = atomic_load(&acc_taken),
        freed = atomic_load(&acc_freed);
    free(a);
    if (made == taken + freed)
        return true;
    print_message("%s, %s: %d outputs made, %d taken, %d passed to out_free\n", acc_kind_name[kind],
                  acc_stop_name[stop], made, taken, freed);
    return false;
}

/* For every kind of task and every way it stops, each output a run made
 * (a run that returned 0) is taken or passed to out_free, exactly once. */
static void test_schedule_every_output_accounted(void **state)
{
    (void)state;
    int wrong = 0;
    for (int kind = 0; kind < ACC_KINDS; kind++) {
        for (int stop = 0; stop < ACC_STOPS; stop++) {
            atomic_store(&acc_made, 0);
            atomic_store(&acc_taken, 0);
            atomic_store(&acc_freed, 0);
            wrong += !acc_scenario(kind, stop);
        }
    }
    if (wrong)
        fail_msg("%d of %d combinations lose or repeat an output", wrong, ACC_KINDS * ACC_STOPS);
    int n = atomic_load(&acc_next);
    assert_true(n < ACC_IDS);
    for (int i = 0; i < n; i++)
        if (atomic_load(&acc_seen[i]) != 1)
            fail_msg("output %d let go of %d times", i, atomic_load(&acc_seen[i]));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_schedule_after_never_early),
        T(test_schedule_after_survives_manager_restart),
        T(test_schedule_restart_rebuilds_waits),
        T(test_schedule_after_cancelled_before_start),
        T(test_schedule_timeout_ends_the_run),
        T(test_schedule_timeout_excludes_the_wait),
        T(test_schedule_timeout_survives_manager_restart),
        T(test_schedule_repeat_runs),
        T(test_schedule_repeat_gap),
        T(test_schedule_deadline_stops_the_series),
        T(test_schedule_deadline_binds_the_first_run),
        T(test_schedule_deadline_binds_a_queued_first_run),
        T(test_schedule_deadline_binds_a_waiting_series),
        T(test_schedule_count_or_deadline),
        T(test_schedule_repeat_cancel),
        T(test_schedule_repeat_reads_latest),
        T(test_schedule_bad_combinations),
        T(test_schedule_at_rate_overlaps),
        T(test_schedule_at_rate_skips_missed_periods),
        T(test_schedule_at_rate_cancel_and_timeout),
        T(test_schedule_at_rate_huge_period_runs_once),
        T(test_schedule_at_rate_released_during_run),
        T(test_schedule_series_keeps_fail_code),
        T(test_schedule_at_rate_ran_out_keeps_output),
        T(test_schedule_at_rate_fail_code_stays),
        T(test_schedule_at_rate_publish_cancelled_frees_once),
        T(test_schedule_at_rate_written_off_code_stays),
        T(test_schedule_at_rate_cancel_reaches_runs),
        T(test_schedule_at_rate_cancel_stops_queued_runs),
        T(test_schedule_at_rate_self_names_the_series),
        T(test_schedule_at_rate_timeout_stops_every_run),
        T(test_schedule_at_rate_cancel_takes_down_parked_runs),
        T(test_schedule_at_rate_shutdown_stops_runs),
        T(test_schedule_one_shot_taken_reads_taken),
        T(test_schedule_shutdown_writes_off_delays),
        T(test_schedule_manager_gone_fails_repeats),
        T(test_schedule_manager_gone_during_arm),
        T(test_schedule_taken_output_not_freed),
        T(test_schedule_limit_under_way_at_shutdown),
        T(test_schedule_limits_end_while_manager_stops),
        T(test_schedule_released_after_shutdown_frees),
        T(test_schedule_cancelled_far_gap_freed_soon),
        T(test_schedule_every_output_accounted),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * The manager's timer structure (src/timer.h), on its own: no runtime runs.
 * Most cases drive atap__timers_run with a fake clock from the test thread,
 * which is then the manager; the race cases add real threads.
 *
 * Every fire checks that it is on time: deadline <= the now given to this
 * run, and deadline > the now of the run before (it fires at the first run
 * that could fire it). Fires happen on the test thread (the manager), so
 * those checks assert directly, except in the threaded cases, which CHECK().
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"
#include "timer.h"

#define MS UINT64_C(1000000)
#define SEC (1000 * MS)
#define MIN (60 * SEC)
#define HOUR (60 * MIN)
#define DAY (24 * HOUR)
/* Not aligned to any tick or level: exercises carries through every level. */
#define T0 ((UINT64_C(1) << 40) - 12345678u)

struct rec {
    struct atap_timer t;
    uint64_t deadline;
    atomic_int fired;
    uint64_t fired_at;
};

/* The fake clock, and the fires seen (test thread only). */
static uint64_t g_now, g_prev;
static uint64_t *g_order;
static size_t g_nfired, g_order_cap;
static bool g_check_first; /* also check deadline > the previous run's now */

static struct rec *rec_of_timer(struct atap_timer *t)
{
    return (struct rec *)((char *)t - offsetof(struct rec, t));
}

static void on_fire(struct atap_timer *t)
{
    struct rec *r = rec_of_timer(t);
    CHECK(r->deadline <= g_now);
    if (g_check_first)
        CHECK(r->deadline > g_prev);
    r->fired_at = g_now;
    if (atomic_fetch_add_explicit(&r->fired, 1, memory_order_relaxed) != 0)
        CHECK(!"fired twice");
    if (g_nfired < g_order_cap)
        g_order[g_nfired] = r->deadline;
    g_nfired++;
}

static void clock_reset(uint64_t start, bool check_first)
{
    g_now = g_prev = start;
    g_nfired = 0;
    g_check_first = check_first;
}

static uint64_t run_at(struct atap_timers *ts, uint64_t now)
{
    g_prev = g_now;
    g_now = now;
    return atap__timers_run(ts, now);
}

static struct rec *recs_new(size_t n)
{
    struct rec *r = calloc(n, sizeof *r);
    assert_non_null(r);
    for (size_t i = 0; i < n; i++)
        atap__timer_init(&r[i].t, on_fire);
    return r;
}

static struct atap_timers *timers_new(uint64_t now)
{
    struct atap_timers *ts = malloc(sizeof *ts);
    assert_non_null(ts);
    atap__timers_init(ts, now);
    return ts;
}

static void timers_free(struct atap_timers *ts)
{
    atap__timers_destroy(ts);
    free(ts);
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

static void arm(struct atap_timers *ts, struct rec *r, uint64_t deadline)
{
    r->deadline = deadline;
    (void)atap__timer_arm(ts, &r->t, deadline);
}

/* Earliest deadline among records still armed. */
static uint64_t min_armed(struct rec *r, size_t n)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (atap__timer_armed(&r[i].t) && r[i].deadline < m)
            m = r[i].deadline;
    return m;
}

/* Runs at each returned deadline until nothing is pending; returns the
 * number of runs. Every fire then lands exactly on its deadline. */
static size_t run_exact(struct atap_timers *ts, size_t max_runs)
{
    size_t runs = 0;
    uint64_t next = run_at(ts, g_now);

    while (next != UINT64_MAX && runs < max_runs) {
        assert_true(next >= g_now);
        next = run_at(ts, next);
        runs++;
    }
    assert_true(next == UINT64_MAX);
    return runs;
}

/* ---- order, never early, exact wakes -------------------------------------- */

static void test_timer_fires_in_deadline_order(void **state)
{
    (void)state;
    size_t n = 2000;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);
    uint64_t order[2000], seed = 1;

    clock_reset(T0, false);
    g_order = order;
    g_order_cap = n;
    for (size_t i = 0; i < n; i++) /* 1 ns .. 10 s, half within 100 us */
        arm(ts, &r[i],
            i % 2 ? T0 + 1 + rng_next(&seed) % (10 * SEC)
                  : T0 + 5 * SEC + rng_next(&seed) % 100000);
    run_at(ts, T0);
    assert_int_equal(g_nfired, 0);
    assert_int_equal(atap__timers_pending(ts), n);
    /* One run catches up on all of them... */
    assert_true(run_at(ts, T0 + 11 * SEC) == UINT64_MAX);
    assert_int_equal(g_nfired, n);
    for (size_t i = 1; i < n; i++)
        assert_true(order[i - 1] <= order[i]);
    /* ...and many small steps keep the order too. */
    clock_reset(T0 + 11 * SEC, true);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&r[i].fired, 0);
        arm(ts, &r[i], g_now + 1 + rng_next(&seed) % (10 * SEC));
    }
    while (g_nfired < n)
        run_at(ts, g_now + 1 + rng_next(&seed) % (50 * MS));
    for (size_t i = 1; i < n; i++)
        assert_true(order[i - 1] <= order[i]);
    assert_no_failures();
    g_order = NULL;
    g_order_cap = 0;
    timers_free(ts);
    free(r);
}

/* Deadlines from microseconds to days away, a clock that jumps by random
 * amounts from 1 ns to hours: every fire is on time, and the deadline run
 * returns is never later than the earliest one still armed. */
static void test_timer_never_early(void **state)
{
    (void)state;
    size_t n = 3000, runs = 0;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);
    uint64_t seed = 7;

    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++) { /* log-uniform: 2^10 .. 2^47 ns ahead */
        unsigned bits = 10 + (unsigned)(rng_next(&seed) % 38);
        arm(ts, &r[i], T0 + (rng_next(&seed) & ((UINT64_C(1) << bits) - 1)) + 1);
    }
    for (uint64_t next = 0; g_nfired < n; runs++) {
        unsigned bits = (unsigned)(rng_next(&seed) % 44);
        next = run_at(ts, g_now + 1 + (rng_next(&seed) & ((UINT64_C(1) << bits) - 1)));
        assert_true(next <= min_armed(r, n));
    }
    assert_no_failures();
    assert_true(run_at(ts, g_now + 1) == UINT64_MAX);
    assert_int_equal(atap__timers_pending(ts), 0);
    timers_free(ts);
    free(r);
}

/* Sleeping until each returned deadline, every timer fires exactly at its
 * deadline, and the wakes that fire nothing (cascades) stay few. */
static void test_timer_wakes_exactly(void **state)
{
    (void)state;
    size_t n = 3000, runs;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);
    uint64_t seed = 99;

    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++) {
        unsigned bits = 10 + (unsigned)(rng_next(&seed) % 30); /* up to ~18 min */
        arm(ts, &r[i], T0 + 1 + (rng_next(&seed) & ((UINT64_C(1) << bits) - 1)));
    }
    runs = run_exact(ts, 100 * n);
    assert_no_failures();
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&r[i].fired), 1);
        assert_true(r[i].fired_at == r[i].deadline);
    }
    assert_true(runs <= 3 * n);
    timers_free(ts);
    free(r);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Minutes, hours, days and years away, and every level boundary +- 1 ns:
 * they cascade down and fire on time, never early. */
static void far_deadlines(uint64_t *d, size_t *n)
{
    static const uint64_t away[] = {MIN,      5 * MIN,  HOUR,       3 * HOUR,
                                    DAY,      2 * DAY,  40 * DAY,   365 * DAY,
                                    17 * SEC, 268 * MS, 4 * MS + 1, 100 * 365 * DAY};
    size_t k = 0;

    for (size_t i = 0; i < sizeof away / sizeof away[0]; i++)
        d[k++] = T0 + away[i];
    for (unsigned bit = 17; bit < 63; bit++) { /* every power-of-two boundary */
        uint64_t b = ((T0 >> bit) + 1) << bit;
        d[k++] = b - 1;
        d[k++] = b;
        d[k++] = b + 1;
    }
    *n = k;
    qsort(d, k, sizeof *d, cmp_u64);
}

static void test_timer_far_timers_cascade(void **state)
{
    (void)state;
    uint64_t d[256];
    size_t n;
    struct rec *r = recs_new(256);
    struct atap_timers *ts = timers_new(T0);

    far_deadlines(d, &n);
    /* Exact: each fires at its deadline. */
    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++)
        arm(ts, &r[i], d[i]);
    run_exact(ts, 100000);
    assert_no_failures();
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&r[i].fired), 1);
        assert_true(r[i].fired_at == d[i]);
    }
    timers_free(ts);
    /* Coarse: one run just before each deadline (must not fire it), the
     * runs hours to years apart; the next probe fires it, late but never
     * early. */
    ts = timers_new(T0);
    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&r[i].fired, 0);
        arm(ts, &r[i], d[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i] - 1 > g_now)
            run_at(ts, d[i] - 1);
        assert_int_equal(atomic_load(&r[i].fired), 0);
    }
    assert_true(run_at(ts, d[n - 1]) == UINT64_MAX);
    assert_int_equal(g_nfired, n);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* ---- disarm ---------------------------------------------------------------- */

static void test_timer_disarm_before_fire(void **state)
{
    (void)state;
    struct rec *r = recs_new(3);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    arm(ts, &r[0], T0 + SEC);     /* disarmed in the inbox */
    arm(ts, &r[1], T0 + 2 * SEC); /* disarmed on the wheel */
    arm(ts, &r[2], T0 + 3 * SEC); /* fires */
    assert_true(atap__timer_disarm(ts, &r[0].t));
    assert_false(atap__timer_disarm(ts, &r[0].t));
    run_at(ts, T0);
    assert_false(atap__timer_held(&r[0].t));
    assert_int_equal(atap__timers_pending(ts), 2);
    assert_true(atap__timer_disarm(ts, &r[1].t));
    assert_false(atap__timer_armed(&r[1].t));
    assert_true(atap__timer_held(&r[1].t)); /* until the manager meets it */
    assert_true(run_at(ts, T0 + 10 * SEC) == UINT64_MAX);
    assert_int_equal(atomic_load(&r[0].fired), 0);
    assert_int_equal(atomic_load(&r[1].fired), 0);
    assert_int_equal(atomic_load(&r[2].fired), 1);
    assert_false(atap__timer_held(&r[1].t));
    assert_int_equal(atap__timers_pending(ts), 0);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

static void test_timer_disarm_after_fire_returns_false(void **state)
{
    (void)state;
    struct rec *r = recs_new(1);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    assert_false(atap__timer_disarm(ts, &r[0].t)); /* never armed */
    arm(ts, &r[0], T0 + MS);
    run_at(ts, T0 + MS);
    assert_int_equal(atomic_load(&r[0].fired), 1);
    assert_false(atap__timer_held(&r[0].t));
    assert_false(atap__timer_disarm(ts, &r[0].t));
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* Fire against disarm from another thread: exactly one wins, every round. */
struct race {
    struct atap_timer t;
    atomic_int round; /* the round the disarmer may start */
    atomic_int done;  /* the last round it finished */
    atomic_int fired;
    atomic_int disarmed;
    atomic_int stop;
    unsigned delay;
    struct atap_timers *ts;
};

static void race_fire(struct atap_timer *t)
{
    struct race *x = (struct race *)((char *)t - offsetof(struct race, t));
    atomic_fetch_add_explicit(&x->fired, 1, memory_order_relaxed);
}

static void spin(unsigned n)
{
    for (volatile unsigned i = 0; i < n; i++) {
    }
}

static void *race_disarmer(void *arg)
{
    struct race *x = arg;
    for (int r = 1;; r++) {
        while (atomic_load_explicit(&x->round, memory_order_acquire) < r)
            if (atomic_load_explicit(&x->stop, memory_order_acquire))
                return NULL;
        spin((unsigned)r * 7u % 64u);
        if (atap__timer_disarm(x->ts, &x->t))
            atomic_fetch_add_explicit(&x->disarmed, 1, memory_order_relaxed);
        atomic_store_explicit(&x->done, r, memory_order_release);
    }
}

static void test_timer_fire_disarm_race(void **state)
{
    (void)state;
    static struct race x;
    struct atap_timers *ts = timers_new(T0);
    pthread_t th;
    int rounds = 10000;

    memset(&x, 0, sizeof x);
    atap__timer_init(&x.t, race_fire);
    x.ts = ts;
    assert_int_equal(pthread_create(&th, NULL, race_disarmer, &x), 0);
    for (int r = 1; r <= rounds; r++) {
        uint64_t now = T0 + (uint64_t)r * MS;
        int before = atomic_load(&x.fired) + atomic_load(&x.disarmed);
        (void)atap__timer_arm(ts, &x.t, now);
        if (r % 2)
            atap__timers_run(ts, now - 1); /* on the wheel before the race */
        atomic_store_explicit(&x.round, r, memory_order_release);
        spin((unsigned)r * 13u % 64u);
        atap__timers_run(ts, now);
        while (atomic_load_explicit(&x.done, memory_order_acquire) < r)
            sched_yield();
        assert_int_equal(atomic_load(&x.fired) + atomic_load(&x.disarmed), before + 1);
        assert_false(atap__timer_armed(&x.t));
    }
    atomic_store(&x.stop, 1);
    pthread_join(th, NULL);
    print_message("fired %d, disarmed %d\n", atomic_load(&x.fired), atomic_load(&x.disarmed));
    assert_true(atap__timers_run(ts, T0 + HOUR) == UINT64_MAX);
    timers_free(ts);
}

/* ---- re-arm ------------------------------------------------------------------- */

static void test_timer_rearm_disarmed(void **state)
{
    (void)state;
    struct rec *r = recs_new(4);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    /* On the wheel, re-armed earlier. */
    arm(ts, &r[0], T0 + 10 * SEC);
    /* On the wheel, re-armed later: its old entry comes due first. */
    arm(ts, &r[1], T0 + 5 * SEC);
    run_at(ts, T0);
    assert_true(atap__timer_disarm(ts, &r[0].t));
    assert_true(atap__timer_disarm(ts, &r[1].t));
    arm(ts, &r[0], T0 + 3 * SEC);
    arm(ts, &r[1], T0 + 12 * SEC);
    /* Still in the inbox, re-armed twice. */
    arm(ts, &r[2], T0 + 4 * SEC);
    assert_true(atap__timer_disarm(ts, &r[2].t));
    arm(ts, &r[2], T0 + 8 * SEC);
    /* Armed, re-armed without a disarm: supersedes. */
    arm(ts, &r[3], T0 + 2 * SEC);
    run_at(ts, T0 + 1);
    arm(ts, &r[3], T0 + 7 * SEC);
    for (uint64_t t = T0 + 500 * MS; t <= T0 + 20 * SEC; t += 500 * MS)
        run_at(ts, t);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&r[i].fired), 1);
        assert_true(r[i].fired_at >= r[i].deadline && r[i].fired_at < r[i].deadline + 500 * MS);
    }
    assert_int_equal(atap__timers_pending(ts), 0);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* An entry already moved to the near list (due within a tick or two) when
 * its record is disarmed and re-armed later, or re-armed over it: the old
 * entry must not fire the new arming. */
static void test_timer_stale_entry_never_fires(void **state)
{
    (void)state;
    struct rec *r = recs_new(2);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    arm(ts, &r[0], T0 + MS);
    arm(ts, &r[1], T0 + MS);
    run_at(ts, T0 + MS - 100000); /* both preloaded into near */
    assert_true(atap__timer_disarm(ts, &r[0].t));
    arm(ts, &r[0], T0 + SEC);
    arm(ts, &r[1], T0 + 2 * SEC); /* no disarm: supersedes */
    run_at(ts, T0 + MS);
    run_at(ts, T0 + 500 * MS);
    assert_int_equal(atomic_load(&r[0].fired), 0);
    assert_int_equal(atomic_load(&r[1].fired), 0);
    run_at(ts, T0 + 3 * SEC);
    assert_int_equal(atomic_load(&r[0].fired), 1);
    assert_int_equal(atomic_load(&r[1].fired), 1);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* The same from a fire callback, while the run is firing its due batch:
 * the first record to fire re-arms the two due right after it. */
static struct atap_timers *g_stale_ts;
static struct rec *g_stale;

static void stale_fire(struct atap_timer *t)
{
    on_fire(t);
    CHECK(atap__timer_disarm(g_stale_ts, &g_stale[1].t));
    arm(g_stale_ts, &g_stale[1], T0 + SEC);
    arm(g_stale_ts, &g_stale[2], T0 + 2 * SEC); /* no disarm: supersedes */
}

static void test_timer_stale_entry_in_batch_never_fires(void **state)
{
    (void)state;
    struct rec *r = recs_new(3);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    g_stale_ts = ts;
    g_stale = r;
    atap__timer_init(&r[0].t, stale_fire);
    arm(ts, &r[0], T0 + MS);
    arm(ts, &r[1], T0 + MS + 1);
    arm(ts, &r[2], T0 + MS + 2);
    run_at(ts, T0 + MS + 2); /* all three due in one run */
    assert_int_equal(atomic_load(&r[0].fired), 1);
    assert_int_equal(atomic_load(&r[1].fired), 0);
    assert_int_equal(atomic_load(&r[2].fired), 0);
    run_at(ts, T0 + 3 * SEC);
    assert_int_equal(atomic_load(&r[1].fired), 1);
    assert_int_equal(atomic_load(&r[2].fired), 1);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* A fire callback re-arms its own record: a period, on exact wakes. */
static int g_periodic_left;
static struct atap_timers *g_periodic_ts;

static void periodic_fire2(struct atap_timer *t)
{
    struct rec *r = rec_of_timer(t);
    on_fire(t);
    atomic_store(&r->fired, 0);
    if (--g_periodic_left > 0)
        arm(g_periodic_ts, r, r->deadline + 3 * MS);
}

static void test_timer_rearm_fired(void **state)
{
    (void)state;
    struct rec *r = recs_new(2);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    /* From outside, after it fired. */
    arm(ts, &r[0], T0 + MS);
    run_at(ts, T0 + 2 * MS);
    assert_int_equal(atomic_load(&r[0].fired), 1);
    atomic_store(&r[0].fired, 0); /* on_fire counts once per arming */
    arm(ts, &r[0], T0 + 5 * MS);
    run_at(ts, T0 + 4 * MS);
    assert_int_equal(atomic_load(&r[0].fired), 0);
    run_at(ts, T0 + 5 * MS);
    assert_int_equal(atomic_load(&r[0].fired), 1);
    /* From its own callback, five times, 3 ms apart. */
    g_periodic_ts = ts;
    g_periodic_left = 5;
    atap__timer_init(&r[1].t, periodic_fire2);
    g_nfired = 0;
    arm(ts, &r[1], g_now + 3 * MS);
    run_exact(ts, 1000);
    assert_int_equal(g_nfired, 5);
    assert_int_equal(g_periodic_left, 0);
    assert_true(r[1].fired_at == r[1].deadline);
    assert_true(r[1].deadline == T0 + 5 * MS + 15 * MS);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* ---- threads ------------------------------------------------------------------- */

struct armer {
    struct atap_timers *ts;
    struct rec *r;
    size_t n;
    uint64_t seed;
    bool disarm_some;
    unsigned char *disarmed;
    test_barrier *start;
};

static void count_fire(struct atap_timer *t)
{
    struct rec *r = rec_of_timer(t);
    atomic_fetch_add_explicit(&r->fired, 1, memory_order_relaxed);
}

static void *armer_main(void *arg)
{
    struct armer *a = arg;
    barrier_wait(a->start);
    for (size_t i = 0; i < a->n; i++) {
        /* deadline: 0 .. 100 ms of fake time ahead of T0 */
        a->r[i].deadline = T0 + rng_next(&a->seed) % (100 * MS);
        (void)atap__timer_arm(a->ts, &a->r[i].t, a->r[i].deadline);
        if (a->disarm_some && i >= 3 && i % 3 == 0)
            a->disarmed[i - 3] = atap__timer_disarm(a->ts, &a->r[i - 3].t);
    }
    return NULL;
}

static void test_timer_arms_from_many_threads(void **state)
{
    (void)state;
    enum { THREADS = 8 };
    size_t per = 10000, n = THREADS * per;
    struct rec *r = calloc(n, sizeof *r);
    unsigned char *disarmed = calloc(n, 1);
    struct atap_timers *ts = timers_new(T0);
    struct armer a[THREADS];
    pthread_t th[THREADS];
    test_barrier start;
    uint64_t now = T0;
    size_t fired = 0, lost = 0;

    assert_non_null(r);
    assert_non_null(disarmed);
    for (size_t i = 0; i < n; i++)
        atap__timer_init(&r[i].t, count_fire);
    barrier_init(&start, THREADS + 1);
    for (int i = 0; i < THREADS; i++) {
        a[i] = (struct armer){.ts = ts,
                              .r = r + i * per,
                              .n = per,
                              .seed = 1000u + (uint64_t)i,
                              .disarm_some = i % 2 == 1,
                              .disarmed = disarmed + i * per,
                              .start = &start};
        assert_int_equal(pthread_create(&th[i], NULL, armer_main, &a[i]), 0);
    }
    barrier_wait(&start);
    /* The manager runs meanwhile, its clock creeping through the range. */
    for (int k = 0; k < 2000; k++, now += 20000)
        atap__timers_run(ts, now);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    /* A run fires a budget at most, and then asks to run again at once. */
    uint64_t next;
    for (int k = 0; (next = atap__timers_run(ts, T0 + SEC)) != UINT64_MAX && k < 1000; k++)
        assert_true(next <= T0 + SEC);
    assert_true(next == UINT64_MAX);
    for (size_t i = 0; i < n; i++) {
        int f = atomic_load(&r[i].fired);
        assert_true(f == (disarmed[i] ? 0 : 1));
        fired += (size_t)f;
        lost += disarmed[i];
    }
    print_message("%zu fired, %zu disarmed\n", fired, lost);
    assert_int_equal(fired + lost, n);
    assert_int_equal(atap__timers_pending(ts), 0);
    timers_free(ts);
    free(disarmed);
    free(r);
}

/* A real manager that sleeps until its next deadline and is woken only
 * when an arm says so: no arm's wake may be lost. One armer waits for its
 * timer before arming the next (often while the manager is still in the
 * run that fired it), so a lost wake strands it: nothing else wakes the
 * manager. */
struct wake_test {
    struct atap_timers *ts;
    atomic_uint wakes; /* a sticky wake, like an eventfd */
    atomic_int stop;
    atomic_int stranded;
};

static void *sleepy_manager(void *arg)
{
    struct wake_test *w = arg;
    while (!atomic_load_explicit(&w->stop, memory_order_acquire)) {
        unsigned seen = atomic_load_explicit(&w->wakes, memory_order_acquire);
        uint64_t next = atap__timers_run(w->ts, now_ns());
        while (atomic_load_explicit(&w->wakes, memory_order_acquire) == seen && now_ns() < next &&
               !atomic_load_explicit(&w->stop, memory_order_acquire))
            sleep_us(20);
    }
    return NULL;
}

struct waiter {
    struct wake_test *w;
    struct rec r;
    size_t rounds;
};

static void *wake_armer(void *arg)
{
    struct waiter *x = arg;
    for (size_t i = 0; i < x->rounds; i++) {
        uint64_t d = now_ns() + (uint64_t)(i % 5) * 50000; /* 0 .. 200 us */
        if (atap__timer_arm(x->w->ts, &x->r.t, d))
            atomic_fetch_add_explicit(&x->w->wakes, 1, memory_order_release);
        uint64_t give_up = now_ns() + 2 * SEC;
        while (atomic_load_explicit(&x->r.fired, memory_order_acquire) <= (int)i) {
            if (now_ns() > give_up) {
                atomic_fetch_add(&x->w->stranded, 1);
                return NULL;
            }
            sched_yield();
        }
    }
    return NULL;
}

static void test_timer_no_lost_wake(void **state)
{
    (void)state;
    static struct wake_test w;
    static struct waiter x[1];
    pthread_t mgr, th[1];

    memset(&w, 0, sizeof w);
    w.ts = timers_new(now_ns());
    assert_int_equal(pthread_create(&mgr, NULL, sleepy_manager, &w), 0);
    for (int i = 0; i < 1; i++) {
        memset(&x[i], 0, sizeof x[i]);
        x[i].w = &w;
        x[i].rounds = scaled(3000, 100);
        atap__timer_init(&x[i].r.t, count_fire);
        assert_int_equal(pthread_create(&th[i], NULL, wake_armer, &x[i]), 0);
    }
    for (int i = 0; i < 1; i++)
        pthread_join(th[i], NULL);
    atomic_store(&w.stop, 1);
    pthread_join(mgr, NULL);
    assert_int_equal(atomic_load(&w.stranded), 0);
    for (int i = 0; i < 1; i++)
        assert_int_equal(atomic_load(&x[i].r.fired), (int)x[i].rounds);
    timers_free(w.ts);
}

/* ---- the wake hint, the next deadline ----------------------------------------- */

static struct atap_timers *g_hint_ts;
static struct rec *g_hint_extra;
static bool g_hint_result;

static void hint_fire(struct atap_timer *t)
{
    on_fire(t);
    /* The manager is awake: an arm, however early, need not wake it. */
    g_hint_result = atap__timer_arm(g_hint_ts, &g_hint_extra->t, g_hint_extra->deadline);
}

static void test_timer_wake_hint(void **state)
{
    (void)state;
    struct rec *r = recs_new(8);
    struct atap_timers *ts = timers_new(T0);
    uint64_t next;

    clock_reset(T0, true);
    r[0].deadline = T0 + 100 * MS; /* nothing published yet: UINT64_MAX */
    assert_true(atap__timer_arm(ts, &r[0].t, r[0].deadline));
    r[1].deadline = T0 + 200 * MS; /* later than the 100 ms it lowered it to */
    assert_false(atap__timer_arm(ts, &r[1].t, r[1].deadline));
    next = run_at(ts, T0);
    assert_true(next > T0 && next <= T0 + 100 * MS);
    r[2].deadline = next - 1;
    assert_true(atap__timer_arm(ts, &r[2].t, r[2].deadline));
    r[3].deadline = next + 1;
    assert_false(atap__timer_arm(ts, &r[3].t, r[3].deadline));
    /* Within one level-0 span, run returns the exact earliest deadline. */
    r[4].deadline = T0 + 1234567;
    assert_true(atap__timer_arm(ts, &r[4].t, r[4].deadline));
    assert_true(run_at(ts, T0 + 1) == r[4].deadline);
    r[5].deadline = r[4].deadline + 1;
    assert_false(atap__timer_arm(ts, &r[5].t, r[5].deadline));
    /* Armed by a fire callback while the manager runs: no wake, and the
     * run that returns has taken it into account. */
    g_hint_ts = ts;
    g_hint_extra = &r[6];
    atap__timer_init(&r[7].t, hint_fire);
    arm(ts, &r[7], T0 + 2 * MS);
    r[6].deadline = r[7].deadline + 10;
    g_hint_result = true;
    next = run_at(ts, r[7].deadline);
    assert_false(g_hint_result);
    assert_true(next == r[6].deadline);
    assert_true(run_at(ts, T0 + DAY) == UINT64_MAX);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* ---- take_all, destroy, a million ------------------------------------------------ */

static void take_each(struct atap_timer *t, void *arg)
{
    struct rec *r = rec_of_timer(t);
    (void)arg;
    CHECK(!atap__timer_armed(t));
    if (atomic_fetch_add_explicit(&r->fired, 1, memory_order_relaxed) != 0)
        CHECK(!"handed back twice");
}

static void test_timer_take_all(void **state)
{
    (void)state;
    size_t n = 3000, handed = 0, expect = 0;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0), *ts2;
    uint64_t seed = 5;

    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++) {
        unsigned bits = 10 + (unsigned)(rng_next(&seed) % 36);
        arm(ts, &r[i], T0 + 1 + (rng_next(&seed) & ((UINT64_C(1) << bits) - 1)));
        if (i == n / 2)
            run_at(ts, T0); /* half on the wheel, half in the inbox */
    }
    for (size_t i = 0; i < n; i += 7)
        assert_true(atap__timer_disarm(ts, &r[i].t));
    atap__timers_take_all(ts, take_each, NULL);
    assert_int_equal(atap__timers_pending(ts), 0);
    for (size_t i = 0; i < n; i++) {
        int f = atomic_load(&r[i].fired);
        assert_int_equal(f, i % 7 == 0 ? 0 : 1);
        handed += (size_t)f;
        expect += i % 7 != 0;
        assert_false(atap__timer_held(&r[i].t));
        assert_false(atap__timer_disarm(ts, &r[i].t));
    }
    assert_int_equal(handed, expect);
    assert_no_failures();
    assert_true(run_at(ts, T0 + 1000 * DAY) == UINT64_MAX);
    /* Handed-back records move to another structure and fire there once. */
    ts2 = timers_new(T0);
    clock_reset(T0, false);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&r[i].fired, 0);
        atap__timer_init(&r[i].t, on_fire);
        arm(ts2, &r[i], r[i].deadline);
    }
    run_at(ts2, T0 + 1000 * DAY);
    assert_int_equal(g_nfired, n);
    assert_no_failures();
    timers_free(ts2);
    timers_free(ts);
    free(r);
}

static void test_timer_destroy_lets_go(void **state)
{
    (void)state;
    size_t n = 100;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++) {
        arm(ts, &r[i], T0 + (i + 1) * SEC);
        if (i == n / 2)
            run_at(ts, T0);
    }
    timers_free(ts);
    for (size_t i = 0; i < n; i++) {
        assert_false(atap__timer_held(&r[i].t));
        assert_true(atap__timer_armed(&r[i].t)); /* left alone */
    }
    ts = timers_new(T0);
    for (size_t i = 0; i < n; i++)
        arm(ts, &r[i], r[i].deadline);
    run_at(ts, T0 + HOUR);
    assert_int_equal(g_nfired, n);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

/* A burst due at once is fired over several runs, each firing a bounded
 * number and asking to run again at once (a time already past), in
 * deadline order across them, each record once. */
static void test_timer_burst_fired_over_runs(void **state)
{
    (void)state;
    size_t n = 100000, runs = 0, most = 0, before;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);
    uint64_t seed = 11, next, now = T0 + MIN;

    g_order = calloc(n, sizeof *g_order);
    g_order_cap = n;
    assert_non_null(g_order);
    clock_reset(T0, false);
    for (size_t i = 0; i < n; i++)
        arm(ts, &r[i], T0 + 1 + rng_next(&seed) % (30 * SEC));
    do {
        before = g_nfired;
        next = run_at(ts, now);
        most = g_nfired - before > most ? g_nfired - before : most;
        runs++;
        if (next != UINT64_MAX)
            assert_true(next <= now); /* more is due: at once */
    } while (next != UINT64_MAX && runs < 1000);
    assert_true(next == UINT64_MAX);
    assert_int_equal(g_nfired, n);
    assert_true(runs > 1);     /* it took several runs */
    assert_true(most < n / 2); /* none fired the whole burst */
    for (size_t i = 1; i < n; i++)
        assert_true(g_order[i - 1] <= g_order[i]);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&r[i].fired), 1);
    assert_no_failures();
    free(g_order);
    g_order = NULL;
    g_order_cap = 0;
    timers_free(ts);
    free(r);
}

/* A disarmed record filed far out is let go of at the next run once its
 * owner asks (atap__timer_forget), not when the wheel meets it. */
static void test_timer_forget_lets_go_at_next_run(void **state)
{
    (void)state;
    struct rec *r = recs_new(3);
    struct atap_timers *ts = timers_new(T0);

    clock_reset(T0, true);
    arm(ts, &r[0], T0 + HOUR);
    arm(ts, &r[1], T0 + DAY);
    run_at(ts, T0); /* filed */
    assert_true(atap__timer_disarm(ts, &r[0].t));
    assert_true(atap__timer_disarm(ts, &r[1].t));
    run_at(ts, T0 + MS);
    assert_true(atap__timer_held(&r[0].t)); /* still filed for its old deadline */
    atap__timer_forget(ts, &r[0].t);
    atap__timer_forget(ts, &r[2].t); /* never armed: nothing to do */
    assert_false(atap__timer_held(&r[2].t));
    run_at(ts, T0 + 2 * MS);
    assert_false(atap__timer_held(&r[0].t));
    assert_true(atap__timer_held(&r[1].t)); /* not asked: met at its deadline */
    /* an armed record is not the caller's to drop */
    arm(ts, &r[0], T0 + SEC);
    atap__timer_forget(ts, &r[0].t);
    run_at(ts, T0 + 2 * SEC);
    assert_int_equal(atomic_load(&r[0].fired), 1);
    assert_no_failures();
    timers_free(ts);
    free(r);
}

static void test_timer_million_pending(void **state)
{
    (void)state;
    size_t n = env_size("ATAP_TIMER_TEST_N", 1000000), fired = 0;
    struct rec *r = recs_new(n);
    struct atap_timers *ts = timers_new(T0);
    uint64_t seed = 3, next;

    clock_reset(T0, true);
    for (size_t i = 0; i < n; i++)
        arm(ts, &r[i], T0 + SEC + rng_next(&seed) % (10 * MIN));
    next = run_at(ts, T0);
    assert_int_equal(atap__timers_pending(ts), n);
    assert_true(next <= T0 + SEC); /* T0 + 12 ms crosses 2^40: a cascade is under way */
    for (size_t i = 0; i < n; i += 2)
        assert_true(atap__timer_disarm(ts, &r[i].t));
    for (uint64_t t = T0; t < T0 + 11 * MIN; t += 7 * SEC)
        run_at(ts, t);
    assert_true(run_at(ts, T0 + 11 * MIN) == UINT64_MAX);
    assert_no_failures();
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&r[i].fired), i % 2);
        fired += (size_t)atomic_load(&r[i].fired);
    }
    assert_int_equal(fired, n / 2);
    assert_int_equal(atap__timers_pending(ts), 0);
    timers_free(ts);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timer_fires_in_deadline_order),
        cmocka_unit_test(test_timer_never_early),
        cmocka_unit_test(test_timer_wakes_exactly),
        cmocka_unit_test(test_timer_far_timers_cascade),
        cmocka_unit_test(test_timer_disarm_before_fire),
        cmocka_unit_test(test_timer_disarm_after_fire_returns_false),
        cmocka_unit_test(test_timer_fire_disarm_race),
        cmocka_unit_test(test_timer_rearm_disarmed),
        cmocka_unit_test(test_timer_rearm_fired),
        cmocka_unit_test(test_timer_stale_entry_never_fires),
        cmocka_unit_test(test_timer_stale_entry_in_batch_never_fires),
        cmocka_unit_test(test_timer_arms_from_many_threads),
        cmocka_unit_test(test_timer_no_lost_wake),
        cmocka_unit_test(test_timer_wake_hint),
        cmocka_unit_test(test_timer_take_all),
        cmocka_unit_test(test_timer_destroy_lets_go),
        cmocka_unit_test(test_timer_burst_fired_over_runs),
        cmocka_unit_test(test_timer_forget_lets_go_at_next_run),
        cmocka_unit_test(test_timer_million_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

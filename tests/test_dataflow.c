/*
 * Values between tasks: waiting tasks fed by atap_give, receivers
 * (atap_receive_all / atap_receive_any), atap_forward, atap_join_first and
 * atap_join_all; what they cost (slots, in_free) and how they race.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"
#include "testing.h"

/* ---- helpers ------------------------------------------------------------- */

/* Joins t (8 bytes) until it reads want, for up to timeout_ns. A join that
 * reads an older value is retried; one that ends in an error stops it. */
static void join_until_at(atap_task t, uint64_t want, uint64_t timeout_ns, int line)
{
    uint64_t end = now_ns() + timeout_ns, v = 0;
    int rc;
    for (;;) {
        v = 0;
        rc = atap_join_for(t, &v, sizeof v, ATAP_MS(200));
        if (rc == 0 && v == want)
            return;
        if ((rc != 0 && rc != ATAP_ENOTREADY) || now_ns() > end)
            break;
        if (rc == 0)
            sleep_us(200);
    }
    fail_msg("line %d: join read rc %d (%s), value %llu; wanted value %llu", line, rc,
             atap_strerror(rc), (unsigned long long)v, (unsigned long long)want);
}
#define JOIN_UNTIL(t, want) join_until_at((t), (want), ATAP_SEC(10), __LINE__)

/* Waits for an atomic to reach want, then checks it stays exactly want for
 * a little while (extra runs would come at once; a loaded machine can only
 * make this pass, never fail, when nothing extra happens). */
static void settle_exact_at(atomic_int *a, int want, int line)
{
    if (!wait_atomic_at_least(a, want, ATAP_SEC(10)))
        fail_msg("line %d: counter reached %d, wanted %d", line, atomic_load(a), want);
    sleep_us(50000);
    if (atomic_load(a) != want)
        fail_msg("line %d: counter is %d, wanted exactly %d", line, atomic_load(a), want);
}
#define SETTLE_EXACT(a, want) settle_exact_at((a), (want), __LINE__)

static void waited_to_live_back_at(int line)
{
    if (!wait_live_back(ATAP_SEC(10)))
        fail_msg("line %d: %zu tasks still live after 10 s, %zu when the test began", line,
                 pool_stats().live, g_live_base);
}
#define waited_to_live_back() waited_to_live_back_at(__LINE__)

/* ---- counted destructors ------------------------------------------------- */

static atomic_int g_in_frees;
static atomic_int g_arg_frees;

/* A given value that owns memory: in_free frees it, so ASan reports a value
 * never freed (leak) or freed twice. 16 bytes; the first 8 are the number. */
typedef struct boxed {
    uint64_t v;
    uint64_t *heap;
} boxed;

static boxed box(uint64_t v)
{
    boxed b = {v, malloc(sizeof(uint64_t))};
    CHECK(b.heap != NULL);
    if (b.heap != NULL)
        *b.heap = v;
    return b;
}

static void boxed_free(void *in)
{
    boxed b;
    memcpy(&b, in, sizeof b);
    CHECK(b.heap != NULL && *b.heap == b.v);
    free(b.heap);
    atomic_fetch_add(&g_in_frees, 1);
}

static int give_box(atap_task t, uint64_t v)
{
    boxed b = box(v);
    return atap_give(t, &b, sizeof b);
}

static void count_arg_free(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_arg_frees, 1);
}

static void reset_counts(void)
{
    atomic_store(&g_in_frees, 0);
    atomic_store(&g_arg_frees, 0);
}

/* ---- a waiting task that records what it was handed --------------------- */

#define MAX_SEEN 64

typedef struct probe {
    atomic_int runs;                      /* runs started */
    atomic_int done;                      /* runs ended */
    atomic_int hold;                      /* while set, the first run waits */
    atomic_int fail;                      /* set: runs fail */
    atomic_int bad_size;                  /* runs handed the wrong size */
    atomic_uint_fast64_t sum;             /* of the inputs' first 8 bytes */
    atomic_uint_fast64_t seen[MAX_SEEN];  /* input of run i */
    atomic_uint_fast64_t start[MAX_SEEN]; /* when run i started */
    size_t in_size;                       /* the size each run expects */
    uint64_t mul, add;                    /* output = input * mul + add */
} probe;

/* Static, like the gates: a test that fails part way leaves tasks that may
 * still touch their probe. */
#define PROBE_RING 64
static probe g_probes[PROBE_RING];
static size_t g_probe_next;

static probe *probe_new(size_t in_size, uint64_t mul, uint64_t add)
{
    probe *p = &g_probes[g_probe_next++ % PROBE_RING];
    atomic_store(&p->runs, 0);
    atomic_store(&p->done, 0);
    atomic_store(&p->hold, 0);
    atomic_store(&p->fail, 0);
    atomic_store(&p->bad_size, 0);
    atomic_store(&p->sum, 0);
    for (int i = 0; i < MAX_SEEN; i++) {
        atomic_store(&p->seen[i], 0);
        atomic_store(&p->start[i], 0);
    }
    p->in_size = in_size;
    p->mul = mul;
    p->add = add;
    return p;
}

static int probe_run(atap_ctx *ctx, void *arg, void *out)
{
    probe *p = arg;
    uint64_t t0 = now_ns();
    int i = atomic_fetch_add(&p->runs, 1);
    size_t size = 12345;
    const void *in = atap_input(ctx, &size);
    if (size != p->in_size || (size > 0 && in == NULL))
        atomic_fetch_add(&p->bad_size, 1);
    uint64_t v = 0;
    if (in != NULL && size >= sizeof v)
        memcpy(&v, in, sizeof v);
    if (i < MAX_SEEN) {
        atomic_store(&p->start[i], t0);
        atomic_store(&p->seen[i], v);
    }
    atomic_fetch_add(&p->sum, v);
    if (i == 0) {
        uint64_t end = now_ns() + ATAP_SEC(10);
        while (atomic_load(&p->hold) && !atap_cancelled(ctx) && !released_all() && now_ns() < end)
            sleep_us(100);
    }
    uint64_t o = v * p->mul + p->add;
    if (out != NULL)
        memcpy(out, &o, sizeof o);
    atomic_fetch_add(&p->done, 1);
    return atomic_load(&p->fail) ? -1 : 0;
}

static atap_task spawn_probe(probe *p, atap_spawn_opts o)
{
    atap_task t = ATAP_NO_TASK;
    if (o.out_size == 0)
        o.out_size = 8;
    assert_int_equal(atap_spawn_waiting(&t, probe_run, p, p->in_size, &o), 0);
    assert_true(t.id != 0);
    return t;
}

/* A receiver that checks it was handed n 8-byte outputs and writes their
 * sum. */
typedef struct summer {
    size_t n;
    atomic_int runs;
    atomic_int bad_size;
} summer;

#define SUMMER_RING 32
static summer g_summers[SUMMER_RING];
static size_t g_summer_next;

static summer *summer_new(size_t n)
{
    summer *s = &g_summers[g_summer_next++ % SUMMER_RING];
    s->n = n;
    atomic_store(&s->runs, 0);
    atomic_store(&s->bad_size, 0);
    return s;
}

static int sum_run(atap_ctx *ctx, void *arg, void *out)
{
    summer *s = arg;
    atomic_fetch_add(&s->runs, 1);
    size_t size = 12345;
    const unsigned char *in = atap_input(ctx, &size);
    uint64_t sum = 0;
    if (size != s->n * 8 || in == NULL) {
        atomic_fetch_add(&s->bad_size, 1);
    } else {
        for (size_t i = 0; i < s->n; i++) {
            uint64_t x;
            memcpy(&x, in + i * 8, sizeof x);
            sum += x;
        }
    }
    memcpy(out, &sum, sizeof sum);
    return 0;
}

/* Like task_gated, but also stops when cancelled, and after 10 s at most,
 * so join_first's losers can be cancelled. Writes g->value (out 8). */
static int task_sleeper(atap_ctx *ctx, void *arg, void *out)
{
    gate *g = arg;
    atomic_fetch_add(&g->started, 1);
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (!atomic_load(&g->open) && !atap_cancelled(ctx) && !released_all() && now_ns() < end)
        sleep_us(500);
    atomic_fetch_add(&g->ran, 1);
    memcpy(out, &g->value, sizeof g->value);
    return 0;
}

/* ======================================================================== */
/* Waiting tasks and atap_give                                              */
/* ======================================================================== */

/* A waiting one-shot doubles what it is given; each give is one more run. */
static void test_dataflow_give_runs_the_task(void **state)
{
    (void)state;
    probe *p = probe_new(8, 2, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){0});
    uint64_t v = 0, in;

    /* nothing runs at spawn */
    assert_int_equal(atap_join_for(t, &v, 8, ATAP_MS(50)), ATAP_ENOTREADY);
    assert_int_equal(atomic_load(&p->runs), 0);
    assert_false(atap_finished(t));

    in = 21;
    assert_int_equal(atap_give(t, &in, sizeof in), 0);
    assert_int_equal(atap_join_for(t, &v, 8, ATAP_SEC(10)), 0);
    assert_true(v == 42);

    /* a second give, after the first run, is a second run */
    in = 50;
    assert_int_equal(atap_give(t, &in, sizeof in), 0);
    JOIN_UNTIL(t, 100);
    SETTLE_EXACT(&p->done, 2);
    assert_int_equal(atomic_load(&p->runs), 2);
    assert_true(atomic_load(&p->seen[0]) == 21);
    assert_true(atomic_load(&p->seen[1]) == 50);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    assert_false(atap_finished(t)); /* no gives limit: it still waits */

    /* bad gives change nothing */
    uint64_t wide[2] = {60, 61};
    assert_int_equal(atap_give(t, wide, 4), ATAP_EINVAL);
    assert_int_equal(atap_give(t, wide, 16), ATAP_EINVAL);
    assert_int_equal(atap_give(t, wide, 0), ATAP_EINVAL);
    assert_int_equal(atap_give(t, NULL, 8), ATAP_EINVAL);
    sleep_us(30000);
    assert_int_equal(atomic_load(&p->runs), 2);
    assert_true(join8(t) == 100);

    /* a plain task does not wait for gives */
    atap_task plain = spawn8(task_value, (void *)(uintptr_t)3);
    assert_int_equal(atap_give(plain, &in, sizeof in), ATAP_EINVAL);
    assert_true(join8(plain) == 3);
    assert_int_equal(atap_give(plain, &in, sizeof in), ATAP_EINVAL);
    atap_release(plain);

    /* no task */
    assert_int_equal(atap_give(ATAP_NO_TASK, &in, sizeof in), ATAP_ENOTASK);
    atap_release(t);
    waited_to_live_back();
    assert_int_equal(atap_give(t, &in, sizeof in), ATAP_ENOTASK); /* stale handle */
}

static int zero_input_run(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    size_t size = 12345;
    (void)atap_input(ctx, &size);
    CHECK(size == 0);
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

static int plain_input_run(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    (void)out;
    size_t size = 12345;
    CHECK(atap_input(ctx, &size) == NULL);
    CHECK(size == 0);
    CHECK(atap_input(ctx, NULL) == NULL);
    return 0;
}

/* in_size 0 works (a give of nothing is a trigger); atap_input is NULL for
 * a plain task and outside a task; the spawn checks its arguments. */
static void test_dataflow_zero_size_input_and_spawn_checks(void **state)
{
    (void)state;
    static atomic_int runs;
    atomic_store(&runs, 0);
    atap_task t;
    assert_int_equal(atap_spawn_waiting(&t, zero_input_run, &runs, 0, NULL), 0);
    assert_int_equal(atap_give(t, NULL, 0), 0);
    assert_true(wait_atomic_at_least(&runs, 1, ATAP_SEC(10)));
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), 0);
    assert_int_equal(atap_give(t, NULL, 0), 0);
    SETTLE_EXACT(&runs, 2);
    uint64_t x = 1;
    assert_int_equal(atap_give(t, &x, 8), ATAP_EINVAL);
    atap_release(t);

    atap_task plain;
    assert_int_equal(atap_spawn(&plain, plain_input_run, NULL, NULL), 0);
    assert_int_equal(atap_join(plain, NULL, 0), 0);
    atap_release(plain);
    size_t size = 12345;
    assert_null(atap_input(NULL, &size));
    assert_true(size == 0);

    assert_int_equal(atap_spawn_waiting(NULL, zero_input_run, &runs, 8, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_waiting(&t, NULL, &runs, 8, NULL), ATAP_EINVAL);
    assert_true(t.id == 0);
    assert_int_equal(
        atap_spawn_waiting(&t, zero_input_run, &runs, 8, &(atap_spawn_opts){.runs = 3}),
        ATAP_EINVAL);
    assert_int_equal(
        atap_spawn_waiting(&t, zero_input_run, &runs, 8, &(atap_spawn_opts){.priority = 1000}),
        ATAP_EINVAL);
    if (SIZE_MAX > UINT32_MAX) {
        size_t huge = (size_t)UINT32_MAX + 1u;
        assert_int_equal(atap_spawn_waiting(&t, zero_input_run, &runs, huge, NULL), ATAP_EINVAL);
        assert_true(t.id == 0);
    }
    assert_int_equal(atomic_load(&runs), 2);
    waited_to_live_back();
    assert_no_failures();
}

/* opts.gives bounds the gives that start something; after that every give
 * is refused, and in_free sees every value exactly once. */
static void test_dataflow_gives_limit(void **state)
{
    (void)state;
    reset_counts();
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.gives = 2, .in_free = boxed_free});
    assert_int_equal(give_box(t, 11), 0);
    JOIN_UNTIL(t, 11);
    assert_false(atap_finished(t));
    assert_int_equal(give_box(t, 12), 0);
    JOIN_UNTIL(t, 12);
    assert_true(wait_finished(t, ATAP_SEC(10)));
    assert_int_equal(give_box(t, 13), ATAP_EFINISHED);
    assert_int_equal(give_box(t, 14), ATAP_EFINISHED);
    assert_true(join8(t) == 12); /* the last output stays */
    SETTLE_EXACT(&p->runs, 2);
    /* the refused ones were freed at once */
    assert_true(atomic_load(&g_in_frees) >= 2);
    atap_release(t);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, 4, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, 4);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    assert_no_failures();
}

/* A give during a run owes one more run; gives don't queue: of three given
 * during the run, only the newest is run. */
static void test_dataflow_give_during_run_owes_one_run(void **state)
{
    (void)state;
    reset_counts();
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atomic_store(&p->hold, 1);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free});
    assert_int_equal(give_box(t, 1), 0);
    assert_true(wait_atomic_at_least(&p->runs, 1, ATAP_SEC(10)));
    assert_int_equal(give_box(t, 2), 0);
    assert_int_equal(give_box(t, 3), 0);
    assert_int_equal(give_box(t, 4), 0);
    sleep_us(20000);
    assert_int_equal(atomic_load(&p->runs), 1); /* still inside the first */
    atomic_store(&p->hold, 0);
    JOIN_UNTIL(t, 4);
    SETTLE_EXACT(&p->done, 2);
    assert_int_equal(atomic_load(&p->runs), 2);
    assert_true(atomic_load(&p->seen[0]) == 1);
    assert_true(atomic_load(&p->seen[1]) == 4);
    /* values 2 and 3 were replaced without running: no longer needed */
    assert_true(wait_atomic_at_least(&g_in_frees, 2, ATAP_SEC(10)));
    atap_release(t);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, 4, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, 4);
    assert_no_failures();
}

/* A join right after a give reads the run that give started, never the
 * run before it: not while that run is still under way (the give owes one
 * more; the run under way publishes to PENDING), nor in the moment between
 * its publish and the gate's turn (the give moves READY back). One thread
 * giving and joining, then four at once, each on tasks of its own. */
static int task_times_ten(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t size = 0;
    const uint64_t *in = atap_input(ctx, &size);
    uint64_t r = in && size == sizeof *in ? *in * 10 : 0;
    memcpy(out, &r, sizeof r);
    return 0;
}

static void *give_then_join(void *arg)
{
    size_t steps = *(size_t *)arg;

    for (size_t step = 0; step < steps; step++) {
        atap_task t;
        atap_spawn_opts o = {.out_size = 8, .gives = 3};
        CHECK(atap_spawn_waiting(&t, task_times_ten, NULL, sizeof(uint64_t), &o) == 0);
        for (uint64_t v = 1; v <= 3; v++) {
            uint64_t out = 0;
            CHECK(atap_give(t, &v, sizeof v) == 0);
            CHECK(atap_join_for(t, &out, sizeof out, ATAP_SEC(10)) == 0);
            if (out != v * 10) {
                CHECK(out == v * 10);
                break;
            }
        }
        atap_release(t);
    }
    return NULL;
}

static void test_dataflow_join_after_give_reads_its_run(void **state)
{
    (void)state;
    size_t steps = scaled(5000, 500);
    pthread_t th[4];

    give_then_join(&steps);
    steps /= 4;
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, give_then_join, &steps), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    waited_to_live_back();
    assert_no_failures();
}

/* Gives that arrive before the run they started has begun (here: during
 * its start delay) only change the value it will read: one run, with the
 * newest value, not a second run of a value already run. */
static void test_dataflow_gives_before_the_run_starts_coalesce(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.after_ns = ATAP_MS(100)});
    for (uint64_t in = 1; in <= 3; in++)
        assert_int_equal(atap_give(t, &in, 8), 0);
    JOIN_UNTIL(t, 3);
    assert_true(wait_atomic_at_least(&p->done, 1, ATAP_SEC(10)));
    sleep_us(300000); /* room for a second run after its own delay */
    int runs = atomic_load(&p->runs);
    atap_release(t);
    waited_to_live_back();
    if (runs != 1)
        fail_msg("three gives before the run started: %d runs, seeing %llu then %llu "
                 "(wanted one run, of value 3)",
                 runs, (unsigned long long)atomic_load(&p->seen[0]),
                 (unsigned long long)atomic_load(&p->seen[1]));
    assert_true(atomic_load(&p->seen[0]) == 3);
}

/* A task that ended refuses gives with how it ended. */
static void test_dataflow_give_after_end(void **state)
{
    (void)state;
    reset_counts();
    uint64_t v;

    /* cancelled before anything was given */
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atap_task c = spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free});
    assert_int_equal(atap_cancel(c), 0);
    assert_int_equal(give_box(c, 1), ATAP_ECANCELLED);
    assert_int_equal(atap_join(c, &v, 8), ATAP_ECANCELLED);
    assert_true(atap_finished(c));
    assert_int_equal(atomic_load(&p->runs), 0);

    /* a run that fails */
    probe *f = probe_new(sizeof(boxed), 1, 0);
    atomic_store(&f->fail, 1);
    atap_task ft = spawn_probe(f, (atap_spawn_opts){.in_free = boxed_free});
    assert_int_equal(give_box(ft, 2), 0);
    atap_state st = ATAP_PENDING;
    assert_int_equal(atap_wait(ft, &st), 0);
    assert_int_equal(st, ATAP_FAILED);
    assert_int_equal(give_box(ft, 3), ATAP_EFAILED);
    assert_int_equal(atap_join(ft, &v, 8), ATAP_EFAILED);
    assert_true(atap_finished(ft));
    SETTLE_EXACT(&f->runs, 1);

    /* a run past its timeout */
    probe *o = probe_new(sizeof(boxed), 1, 0);
    atomic_store(&o->hold, 1);
    atap_task ot =
        spawn_probe(o, (atap_spawn_opts){.in_free = boxed_free, .timeout_ns = ATAP_MS(30)});
    assert_int_equal(give_box(ot, 4), 0);
    assert_int_equal(atap_join_for(ot, &v, 8, ATAP_SEC(10)), ATAP_ETIMEDOUT);
    atomic_store(&o->hold, 0);
    assert_int_equal(give_box(ot, 5), ATAP_ETIMEDOUT);
    assert_true(atap_finished(ot));

    /* cancelled after a run */
    probe *a = probe_new(sizeof(boxed), 1, 0);
    atap_task at = spawn_probe(a, (atap_spawn_opts){.in_free = boxed_free});
    assert_int_equal(give_box(at, 6), 0);
    JOIN_UNTIL(at, 6);
    /* a waiting task between runs has not finished: a cancel ends it, as it
     * ends a repeat between runs */
    assert_false(atap_finished(at));
    assert_int_equal(atap_cancel(at), 0);
    int rc = give_box(at, 7);
    if (rc != ATAP_ECANCELLED)
        fail_msg("give after cancelling a waiting task between runs: %d (%s)", rc,
                 atap_strerror(rc));
    assert_true(atap_finished(at));
    SETTLE_EXACT(&a->runs, 1);

    atap_release(c);
    atap_release(ft);
    atap_release(ot);
    atap_release(at);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, 7, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, 7);
    assert_no_failures();
}

/* After a shutdown nothing can run a give: it is refused, and the value
 * still goes to in_free, once. */
static void test_dataflow_give_after_shutdown(void **state)
{
    (void)state;
    reset_counts();
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free});
    assert_int_equal(give_box(t, 5), 0);
    JOIN_UNTIL(t, 5);
    assert_int_equal(atap_shutdown(), 0);
    int rc = give_box(t, 6);
    if (rc == 0)
        fail_msg("a give after shutdown was taken");
    sleep_us(20000);
    assert_int_equal(atomic_load(&p->runs), 1);
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, 2, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, 2);
    assert_no_failures();
}

/* ---- letting go ---------------------------------------------------------- */

/* A waiting task lives while any handle that could give to it is left, and
 * is let go (its slot and arg freed) when the last one goes. */
static void test_dataflow_let_go_when_no_giver_is_left(void **state)
{
    (void)state;
    reset_counts();
    probe *p = probe_new(8, 1, 0);
    size_t base = g_live_base;
    atap_task t = spawn_probe(p, (atap_spawn_opts){.arg_free = count_arg_free});
    atap_task d;
    assert_int_equal(atap_dup(t, &d), 0);
    atap_release(t);
    sleep_us(30000);
    assert_int_equal(atomic_load(&g_arg_frees), 0);
    assert_true(pool_stats().live >= base + 1);
    assert_false(atap_finished(d));
    assert_true(atap_state_of(d) != ATAP_FAILED);
    atap_release(d);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_arg_frees, 1, ATAP_SEC(10)));
    SETTLE_EXACT(&g_arg_frees, 1);
    assert_int_equal(atomic_load(&p->runs), 0);
}

/* The last two handles of a waiting task released at once: one release
 * reads the count (2), and before it acts the other goes (2 -> 1), so the
 * first finds itself the last only on its second try. It must let the task
 * go then (no slot left behind), as it would have on its first. A test hook
 * holds the first release between its read and its CAS. */
static _Thread_local bool held_release;
static atomic_int holding, other_gone;

static void hold_until_other_gone(void)
{
    if (!held_release)
        return; /* anyone else's release passes straight through */
    held_release = false;
    atomic_store(&holding, 1);
    while (!atomic_load(&other_gone))
        sleep_us(100);
}

static void *release_held(void *arg)
{
    held_release = true;
    atap_release(*(atap_task *)arg);
    return NULL;
}

static void test_dataflow_let_go_last_handles_together(void **state)
{
    (void)state;
    enum { ROUNDS = 20 };
    atomic_int runs = 0;

    reset_counts();
    assert_int_equal(atap__test_on(ATAP__TEST_RELEASE_READ, hold_until_other_gone), 0);
    for (int i = 0; i < ROUNDS; i++) {
        atap_task h[2];
        pthread_t th;

        assert_int_equal(atap_spawn_waiting(&h[0], zero_input_run, &runs, 8,
                                            &(atap_spawn_opts){.arg_free = count_arg_free}),
                         0);
        assert_int_equal(atap_dup(h[0], &h[1]), 0);
        atomic_store(&holding, 0);
        atomic_store(&other_gone, 0);
        assert_int_equal(pthread_create(&th, NULL, release_held, &h[0]), 0);
        assert_true(wait_atomic_at_least(&holding, 1, ATAP_SEC(20)));
        atap_release(h[1]);
        atomic_store(&other_gone, 1);
        assert_int_equal(pthread_join(th, NULL), 0);
    }
    assert_int_equal(atap__test_on(ATAP__TEST_RELEASE_READ, NULL), 0);
    waited_to_live_back();
    SETTLE_EXACT(&g_arg_frees, ROUNDS);
    assert_int_equal(atomic_load(&runs), 0); /* never given anything */
}

/* An at-rate waiting series that ran out and is given again starts over;
 * the output its last run left (READY, taken by nobody) is replaced by the
 * next run's and let go then: every output made is let go exactly once. */
static atomic_int rate_made, rate_freed;

static void free_block(void *out)
{
    void *p;

    memcpy(&p, out, sizeof p);
    free(p);
    atomic_fetch_add(&rate_freed, 1);
}

static int make_block(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    void *p = malloc(8);

    memcpy(out, &p, sizeof p);
    atomic_fetch_add(&rate_made, 1);
    return 0;
}

static void test_dataflow_at_rate_restart_lets_go_of_kept_output(void **state)
{
    (void)state;
    enum { GIVES = 4 };
    atap_task t;
    int v = 1;

    atomic_store(&rate_made, 0);
    atomic_store(&rate_freed, 0);
    assert_int_equal(atap_spawn_waiting(&t, make_block, NULL, sizeof v,
                                        &(atap_spawn_opts){.out_size = sizeof(void *),
                                                           .out_free = free_block,
                                                           .kind = ATAP_AT_RATE,
                                                           .every_ns = ATAP_MS(10),
                                                           .runs = 1}),
                     0);
    for (int i = 1; i <= GIVES; i++) {
        assert_int_equal(atap_give(t, &v, sizeof v), 0);
        /* the series' one run made its output; then it stands, READY */
        assert_true(wait_atomic_at_least(&rate_made, i, ATAP_SEC(10)));
        uint64_t end = now_ns() + ATAP_SEC(10);
        while (atap_state_of(t) != ATAP_READY && now_ns() < end)
            sleep_us(1000);
        assert_int_equal(atap_state_of(t), ATAP_READY);
        sleep_us(20000); /* the series winds down: the next give starts it over */
    }
    SETTLE_EXACT(&rate_freed, GIVES - 1); /* all but the standing one */
    atap_release(t);
    waited_to_live_back();
    SETTLE_EXACT(&rate_freed, GIVES);
    assert_int_equal(atomic_load(&rate_made), GIVES);
}

/* A forward into a task counts as a giver: with its handle released, the
 * target still receives the source's output, and goes after that. */
static void test_dataflow_let_go_forward_keeps_target(void **state)
{
    (void)state;
    reset_counts();
    gate *g = gate_new(77);
    atap_task s = spawn8(task_gated, g);
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.arg_free = count_arg_free});
    assert_int_equal(atap_forward(s, t), 0);
    atap_release(t);
    sleep_us(30000);
    assert_int_equal(atomic_load(&g_arg_frees), 0);
    assert_int_equal(atomic_load(&p->runs), 0);
    atomic_store(&g->open, 1);
    assert_true(join8(s) == 77);
    assert_true(wait_atomic_at_least(&p->done, 1, ATAP_SEC(10)));
    assert_true(atomic_load(&p->seen[0]) == 77);
    atap_release(s);
    /* the source can publish no more: nothing can give to the target */
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_arg_frees, 1, ATAP_SEC(10)));
    SETTLE_EXACT(&g_arg_frees, 1);
    assert_int_equal(atomic_load(&p->runs), 1);
}

/* What a stale copy of a released handle reads: ATAP_ENOTASK from every
 * call, and no call through it reaches the task (asserted by the caller). */
static void assert_names_no_task(atap_task stale)
{
    atap_task copy;
    uint64_t v;

    assert_int_equal(atap_cancel(stale), ATAP_ENOTASK);
    assert_int_equal(atap_dup(stale, &copy), ATAP_ENOTASK);
    assert_int_equal(atap_try_join(stale, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_join_for(stale, &v, sizeof v, ATAP_MS(1)), ATAP_ENOTASK);
    assert_int_equal(atap_give(stale, &v, sizeof v), ATAP_ENOTASK);
    assert_int_equal(atap_state_of(stale), ATAP_FAILED);
}

/* A task fed by a forward and by a receive_all outlives its last handle
 * (its feeders may still give to it), but the handle does not: once the
 * last one is released, every copy names no task, as atap.h says, even
 * while the task waits on. The cancel tried through a copy must not reach
 * it: it still runs on the value fed to it. */
static void test_dataflow_fed_task_handle_goes_with_last_release(void **state)
{
    (void)state;
    reset_counts();
    gate *g = gate_new(41);
    atap_task s = spawn8(task_gated, g);
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.arg_free = count_arg_free});
    atap_task stale = t, r, stale_r;
    summer sums = {.n = 1};

    assert_int_equal(atap_forward(s, t), 0);
    assert_int_equal(atap_receive_all(&r, sum_run, &sums, &s, 1, &(atap_spawn_opts){.out_size = 8}),
                     0);
    stale_r = r;
    atap_release(t);
    atap_release(r);
    assert_names_no_task(stale);
    assert_names_no_task(stale_r);
    atomic_store(&g->open, 1);
    assert_true(join8(s) == 41);
    assert_true(wait_atomic_at_least(&p->done, 1, ATAP_SEC(10)));
    assert_true(atomic_load(&p->seen[0]) == 41); /* ran, not cancelled */
    assert_true(wait_atomic_at_least(&sums.runs, 1, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&sums.bad_size), 0);
    atap_release(s);
    waited_to_live_back();
    SETTLE_EXACT(&g_arg_frees, 1);
}

/* A waiting task let go without ever being given anything reads
 * ATAP_EFAILED: seen through a receiver over it, which can then never run
 * and finishes. */
static void test_dataflow_let_go_never_given_fails(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atap_task w = spawn_probe(p, (atap_spawn_opts){0});
    summer *s = summer_new(1);
    atap_task r;
    assert_int_equal(atap_receive_all(&r, sum_run, s, &w, 1, &(atap_spawn_opts){.out_size = 8}), 0);
    sleep_us(20000);
    assert_false(atap_finished(r));
    atap_release(w);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    uint64_t v;
    assert_int_equal(atap_join(r, &v, 8), ATAP_EFAILED);
    assert_int_equal(atomic_load(&s->runs), 0);
    assert_int_equal(atomic_load(&p->runs), 0);
    atap_release(r);
    waited_to_live_back();
}

/* ---- series and delays --------------------------------------------------- */

/* A waiting repeat: each give starts a whole series of `runs`; a give
 * during a series starts nothing, but later runs of it see the new value. */
static void test_dataflow_repeat_series_per_give(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atomic_store(&p->hold, 1);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 3});
    uint64_t in = 1;
    sleep_us(20000);
    assert_int_equal(atomic_load(&p->runs), 0); /* nothing at spawn */
    assert_int_equal(atap_give(t, &in, 8), 0);
    assert_true(wait_atomic_at_least(&p->runs, 1, ATAP_SEC(10)));
    in = 2;
    assert_int_equal(atap_give(t, &in, 8), 0); /* during the series */
    atomic_store(&p->hold, 0);
    SETTLE_EXACT(&p->done, 3);
    assert_int_equal(atomic_load(&p->runs), 3);
    JOIN_UNTIL(t, 2);
    assert_true(atomic_load(&p->seen[0]) == 1);
    assert_true(atomic_load(&p->seen[1]) == 2);
    assert_true(atomic_load(&p->seen[2]) == 2);
    /* the series ends just after its last run's output lands: leave room
     * for that before the next give, or it would count as during it */
    sleep_us(200000);
    assert_int_equal(atomic_load(&p->runs), 3);
    assert_false(atap_finished(t));

    /* after the series, a give starts a fresh one of 3 */
    in = 7;
    assert_int_equal(atap_give(t, &in, 8), 0);
    SETTLE_EXACT(&p->done, 6);
    assert_int_equal(atomic_load(&p->runs), 6);
    for (int i = 3; i < 6; i++)
        assert_true(atomic_load(&p->seen[i]) == 7);
    JOIN_UNTIL(t, 7);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    atap_release(t);
    waited_to_live_back();
}

/* A waiting repeat with gives = 1 finishes after its one series. */
static void test_dataflow_repeat_gives_limit(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 2, .gives = 1});
    uint64_t in = 9;
    assert_int_equal(atap_give(t, &in, 8), 0);
    assert_true(wait_finished(t, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&p->runs), 2);
    assert_true(join8(t) == 9);
    assert_int_equal(atap_give(t, &in, 8), ATAP_EFINISHED);
    SETTLE_EXACT(&p->runs, 2);
    atap_release(t);
    waited_to_live_back();
}

/* A waiting at-rate task: a give starts a series of `runs` runs, each
 * handed the value (its own copy); in_free sees each value once. */
static void test_dataflow_at_rate_series_per_give(void **state)
{
    (void)state;
    reset_counts();
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atap_task t = spawn_probe(
        p, (atap_spawn_opts){
               .kind = ATAP_AT_RATE, .every_ns = ATAP_MS(5), .runs = 3, .in_free = boxed_free});
    assert_int_equal(give_box(t, 4), 0);
    SETTLE_EXACT(&p->done, 3);
    for (int i = 0; i < 3; i++)
        assert_true(atomic_load(&p->seen[i]) == 4);
    JOIN_UNTIL(t, 4);
    sleep_us(50000);
    assert_int_equal(atomic_load(&p->runs), 3);
    assert_int_equal(give_box(t, 8), 0);
    SETTLE_EXACT(&p->done, 6);
    for (int i = 3; i < 6; i++)
        assert_true(atomic_load(&p->seen[i]) == 8);
    JOIN_UNTIL(t, 8);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    atap_release(t);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, 2, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, 2);
    assert_no_failures();
}

/* after_ns is waited out after each give: a run never starts early. */
static void test_dataflow_after_each_give(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.after_ns = ATAP_MS(60)});
    for (uint64_t k = 1; k <= 2; k++) {
        uint64_t t0 = now_ns();
        assert_int_equal(atap_give(t, &k, 8), 0);
        JOIN_UNTIL(t, k);
        uint64_t started = atomic_load(&p->start[k - 1]);
        if (started < t0 + ATAP_MS(60))
            fail_msg("run %llu started %llu us after its give, before the 60 ms delay",
                     (unsigned long long)k, (unsigned long long)((started - t0) / 1000));
    }
    SETTLE_EXACT(&p->runs, 2);
    atap_release(t);
    waited_to_live_back();
}

/* ======================================================================== */
/* Receivers                                                                 */
/* ======================================================================== */

static void receive_all_sum(size_t n, bool join_first_members)
{
    atap_task *m = calloc(n, sizeof *m);
    assert_non_null(m);
    for (size_t i = 0; i < n; i++)
        m[i] = spawn8(task_value, (void *)(uintptr_t)i);
    if (join_first_members)
        for (size_t i = 0; i < n; i++)
            assert_true(join8(m[i]) == i);
    summer *s = summer_new(n);
    atap_task r;
    assert_int_equal(atap_receive_all(&r, sum_run, s, m, n, &(atap_spawn_opts){.out_size = 8}), 0);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(r, &v, 8, ATAP_SEC(10)), 0);
    if (v != (uint64_t)n * (n - 1) / 2)
        fail_msg("n %zu: sum %llu, wanted %llu", n, (unsigned long long)v,
                 (unsigned long long)((uint64_t)n * (n - 1) / 2));
    /* one-shot members can publish nothing more: it finishes */
    assert_true(wait_finished(r, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&s->runs), 1);
    assert_int_equal(atomic_load(&s->bad_size), 0);
    assert_true(join8(r) == (uint64_t)n * (n - 1) / 2);
    for (size_t i = 0; i < n; i++)
        atap_release(m[i]);
    atap_release(r);
    free(m);
    waited_to_live_back();
}

static void test_dataflow_receive_all_sums(void **state)
{
    (void)state;
    receive_all_sum(1, false);
    receive_all_sum(12, true); /* every output already there */
    receive_all_sum(12, false);
    receive_all_sum(10000, false);
}

/* Sets nest: a receiver over two receivers. */
static void test_dataflow_receive_all_nested(void **state)
{
    (void)state;
    atap_task m[4];
    for (int i = 0; i < 4; i++)
        m[i] = spawn8(task_value, (void *)(uintptr_t)(i + 1));
    atap_task inner[2], outer;
    summer *s0 = summer_new(2), *s1 = summer_new(2), *s2 = summer_new(2);
    atap_spawn_opts o = {.out_size = 8};
    assert_int_equal(atap_receive_all(&inner[0], sum_run, s0, &m[0], 2, &o), 0);
    assert_int_equal(atap_receive_all(&inner[1], sum_run, s1, &m[2], 2, &o), 0);
    assert_int_equal(atap_receive_all(&outer, sum_run, s2, inner, 2, &o), 0);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(outer, &v, 8, ATAP_SEC(10)), 0);
    assert_true(v == 10);
    assert_true(join8(inner[0]) == 3);
    assert_true(join8(inner[1]) == 7);
    assert_true(wait_finished(inner[0], ATAP_SEC(10)));
    assert_true(wait_finished(inner[1], ATAP_SEC(10)));
    assert_true(wait_finished(outer, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&s2->runs), 1);
    for (int i = 0; i < 4; i++)
        atap_release(m[i]);
    atap_release(inner[0]);
    atap_release(inner[1]);
    atap_release(outer);
    waited_to_live_back();
}

/* Each run waits for all members again: a member's old output does not
 * count twice. Members are waiting tasks fed by gives. */
static void test_dataflow_receive_all_waits_for_all_again(void **state)
{
    (void)state;
    probe *pa = probe_new(8, 1, 0), *pb = probe_new(8, 1, 0);
    atap_task m[2] = {spawn_probe(pa, (atap_spawn_opts){0}), spawn_probe(pb, (atap_spawn_opts){0})};
    summer *s = summer_new(2);
    atap_task r;
    assert_int_equal(atap_receive_all(&r, sum_run, s, m, 2, &(atap_spawn_opts){.out_size = 8}), 0);
    uint64_t in = 1;
    assert_int_equal(atap_give(m[0], &in, 8), 0);
    JOIN_UNTIL(m[0], 1);
    sleep_us(30000);
    assert_int_equal(atomic_load(&s->runs), 0); /* b has nothing yet */
    in = 2;
    assert_int_equal(atap_give(m[1], &in, 8), 0);
    JOIN_UNTIL(r, 3);
    SETTLE_EXACT(&s->runs, 1);

    in = 10;
    assert_int_equal(atap_give(m[0], &in, 8), 0);
    JOIN_UNTIL(m[0], 10);
    sleep_us(50000);
    assert_int_equal(atomic_load(&s->runs), 1); /* b's 2 was used already */
    in = 20;
    assert_int_equal(atap_give(m[1], &in, 8), 0);
    JOIN_UNTIL(r, 30);
    SETTLE_EXACT(&s->runs, 2);
    assert_false(atap_finished(r)); /* both members can still be given */

    /* members let go: they can publish nothing more, so it finishes */
    atap_release(m[0]);
    atap_release(m[1]);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    assert_true(join8(r) == 30);
    assert_int_equal(atomic_load(&s->bad_size), 0);
    atap_release(r);
    waited_to_live_back();
}

/* A member that ends without publishing: the receiver never runs, reads
 * ATAP_EFAILED and is finished. */
static void test_dataflow_receive_all_member_fails(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        atap_task m[3];
        m[0] = spawn8(task_value, (void *)(uintptr_t)1);
        gate *g = gate_new(2);
        m[2] = spawn8(task_gated, g);
        if (k == 0) {
            m[1] = spawn8(task_fail, NULL);
        } else {
            assert_int_equal(
                atap_spawn(&m[1], task_value, (void *)(uintptr_t)5,
                           &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(30)}),
                0);
            if (k == 1)
                assert_int_equal(atap_cancel(m[1]), 0); /* before the receiver */
        }
        summer *s = summer_new(3);
        atap_task r;
        assert_int_equal(atap_receive_all(&r, sum_run, s, m, 3, &(atap_spawn_opts){.out_size = 8}),
                         0);
        if (k == 2)
            assert_int_equal(atap_cancel(m[1]), 0); /* after it */
        if (!wait_finished(r, ATAP_SEC(10)))
            fail_msg("case %d: the receiver did not finish", k);
        uint64_t v;
        int rc = atap_join(r, &v, 8);
        if (rc != ATAP_EFAILED)
            fail_msg("case %d: join read %d (%s), wanted ATAP_EFAILED", k, rc, atap_strerror(rc));
        atomic_store(&g->open, 1);
        assert_true(join8(m[2]) == 2);
        sleep_us(20000);
        assert_int_equal(atomic_load(&s->runs), 0);
        for (int i = 0; i < 3; i++)
            atap_release(m[i]);
        atap_release(r);
    }
    waited_to_live_back();
}

/* ---- no memory, and what runs where (ATAP__TEST_ALLOC) ------------------- */

static atomic_int allocs;

static void count_alloc(void) { atomic_fetch_add(&allocs, 1); }

/* A round made whole when no buffer can be had for the next one waits,
 * whole: the next delivery tries again, and the round it completes (with
 * the newest bytes) is the one the receiver runs on. */
/* receive_all of one waiting member m, given 5 with the next round's
 * buffer refused: the round is left whole, the receiver r not run. */
static summer *round_left_whole(atap_task *m, atap_task *r)
{
    summer *s = summer_new(1);
    uint64_t in = 5;

    *m = spawn_probe(probe_new(8, 1, 0), (atap_spawn_opts){0});
    assert_int_equal(atap_receive_all(r, sum_run, s, m, 1, &(atap_spawn_opts){.out_size = 8}), 0);
    atomic_store(&allocs, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_ALLOC, count_alloc), 0);
    atap_inject_alloc_failures(1);
    assert_int_equal(atap_give(*m, &in, 8), 0);
    JOIN_UNTIL(*m, 5);
    assert_true(wait_atomic_at_least(&allocs, 1, ATAP_SEC(10))); /* the round's buffer: refused */
    sleep_us(30000);
    assert_int_equal(atomic_load(&s->runs), 0);
    return s;
}

static void test_dataflow_receive_all_no_memory_next_delivery_retries(void **state)
{
    (void)state;
    atap_task m, r;
    summer *s = round_left_whole(&m, &r);
    uint64_t in = 7;

    assert_int_equal(atap_give(m, &in, 8), 0);
    JOIN_UNTIL(r, 7);
    SETTLE_EXACT(&s->runs, 1);
    assert_int_equal(atomic_load(&s->bad_size), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_ALLOC, NULL), 0);
    atap_inject_alloc_failures(0);
    atap_release(m);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    atap_release(r);
    waited_to_live_back();
}

/* A round left whole for want of memory is not left for good when no
 * delivery comes after it: the close of a member that filled its place
 * makes it the last round, which needs no buffer, and it goes. And a round
 * made whole after a member closed is the last from the start: it asks for
 * no buffer at all (two one-shots that ended before the receiver). */
static void test_dataflow_receive_all_no_memory_member_closes(void **state)
{
    (void)state;
    atap_task m, r;
    summer *s = round_left_whole(&m, &r);
    uint64_t v;

    atap_release(m); /* nobody can give to it now: it ends, and its place closes */
    JOIN_UNTIL(r, 5);
    SETTLE_EXACT(&s->runs, 1);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    atap_release(r);

    atap_task ms[2];
    ms[0] = spawn8(task_value, (void *)(uintptr_t)1);
    ms[1] = spawn8(task_value, (void *)(uintptr_t)2);
    assert_true(join8(ms[0]) == 1 && join8(ms[1]) == 2);
    /* Their runs wholly over too (a join returns at READY, a moment before
     * the worker lets the run go): each member then closes its place as it
     * is registered, before the next one's output makes the round whole. */
    uint64_t until = now_ns() + ATAP_SEC(10);
    while (pool_stats().busy != 0 && now_ns() < until)
        sleep_us(1000);
    summer *s2 = summer_new(2);
    atomic_store(&allocs, 0);
    atap_inject_alloc_failures(1);
    assert_int_equal(atap_receive_all(&r, sum_run, s2, ms, 2, &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_int_equal(atap_join_for(r, &v, 8, ATAP_SEC(10)), 0);
    assert_true(v == 3);
    assert_int_equal(atomic_load(&allocs), 0); /* the last round asked for nothing */
    atap_inject_alloc_failures(0);
    assert_int_equal(atap__test_on(ATAP__TEST_ALLOC, NULL), 0);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    atap_release(r);
    atap_release(ms[0]);
    atap_release(ms[1]);
    waited_to_live_back();
}

/* A receive_all round made whole with no spare buffer allocates the next
 * round's with the gate's spin lock let go: at that allocation a cancel of
 * the receiver, which takes the lock, goes through (and the round, which
 * then finds the gate DONE, starts nothing). The malloc used to be made
 * under the lock, and everyone on the gate spun through it. */
static atap_task *lock_target;
static atomic_int lock_armed, lock_free;
static side_call lock_call;

static void cancel_lock_target(void *arg)
{
    (void)arg;
    CHECK(atap_cancel(*lock_target) == 0);
}

static void cancel_at_alloc(void)
{
    side_call_once(&lock_armed, &lock_call, cancel_lock_target, &lock_free);
}

static void test_dataflow_receive_all_round_buffer_off_the_gate_lock(void **state)
{
    (void)state;
    atap_task m = spawn8(task_value, (void *)(uintptr_t)3), r = ATAP_NO_TASK;
    summer *s = summer_new(1);
    uint64_t v;

    assert_true(join8(m) == 3); /* readable: the registration delivers it, here */
    lock_target = &r;
    atomic_store(&lock_free, 0);
    atomic_store(&lock_armed, 1);
    assert_int_equal(atap__test_on(ATAP__TEST_ALLOC, cancel_at_alloc), 0);
    assert_int_equal(atap_receive_all(&r, sum_run, s, &m, 1, &(atap_spawn_opts){.out_size = 8}), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_ALLOC, NULL), 0);
    side_call_join(&lock_call);
    assert_no_failures();
    assert_int_equal(atomic_load(&lock_armed), 0); /* the round's buffer was allocated */
    assert_true(atomic_load(&lock_free));
    assert_true(wait_finished(r, ATAP_SEC(10)));
    assert_int_equal(atap_join(r, &v, 8), ATAP_ECANCELLED);
    assert_int_equal(atomic_load(&s->runs), 0);
    atap_release(m);
    atap_release(r);
    waited_to_live_back();
}

/* A delivery that starts many targets kicks each after the source's locks
 * are let go: at the first kick a forward from the source, which takes its
 * forward list's mutex, goes through. The kick list used to hold 8 and
 * grow by realloc, and with no memory for that it kicked right away, under
 * that mutex; it is chained through the targets' gates now, and 12 targets
 * go past those 8. */
static atap_task lock_source, lock_fed;

static void forward_lock_source(void *arg)
{
    (void)arg;
    CHECK(atap_forward(lock_source, lock_fed) == 0);
}

static void forward_at_kick(void)
{
    side_call_once(&lock_armed, &lock_call, forward_lock_source, &lock_free);
}

static void test_dataflow_kicks_without_memory_after_the_locks(void **state)
{
    (void)state;
    enum { N = 12 }; /* past the 8 the old kick list held without growing */
    probe *p = probe_new(8, 1, 0);
    gate *g = gate_new(42);
    atap_task to[N];

    lock_source = spawn8(task_gated, g); /* a one-shot: closing its list delivers */
    for (int i = 0; i < N; i++) {
        to[i] = spawn_probe(p, (atap_spawn_opts){0});
        assert_int_equal(atap_forward(lock_source, to[i]), 0);
    }
    lock_fed = spawn_probe(p, (atap_spawn_opts){0});
    atomic_store(&lock_free, 0);
    atomic_store(&lock_armed, 1);
    assert_int_equal(atap__test_on(ATAP__TEST_KICK, forward_at_kick), 0);
    atomic_store(&g->open, 1);
    for (int i = 0; i < N; i++)
        JOIN_UNTIL(to[i], 42);
    JOIN_UNTIL(lock_fed, 42);
    assert_int_equal(atap__test_on(ATAP__TEST_KICK, NULL), 0);
    side_call_join(&lock_call);
    assert_no_failures();
    assert_int_equal(atomic_load(&lock_armed), 0);
    assert_true(atomic_load(&lock_free));
    SETTLE_EXACT(&p->done, N + 1);
    atap_release(lock_source);
    for (int i = 0; i < N; i++)
        atap_release(to[i]);
    atap_release(lock_fed);
    waited_to_live_back();
}

/* A delivery that displaces a given value still pending in its target
 * (gives don't queue: the newest wins) calls that value's in_free with
 * none of the source's locks held: from there, a join of the source
 * returns. It used to run under the source's output and list locks, and
 * a join of the source waited on the very publish it was called from. */
static atap_task drop_source;
static atomic_int drop_armed, drop_frees, drop_checks, drop_ok, drop_done;
static side_call drop_calls[16];

static void join_drop_source(void *arg)
{
    uint64_t v;
    (void)arg;
    (void)atap_try_join(drop_source, &v, sizeof v);
}

/* Each call while armed: does a join of the source return, from another
 * thread, within 2 s? (Joined by the test, not here: under the old code
 * the source's lock was held here.) */
static void in_free_joining_source(void *in)
{
    uint64_t v;

    memcpy(&v, in, sizeof v);
    atomic_fetch_add(&drop_frees, 1);
    if (atomic_load(&drop_armed)) {
        CHECK(v == 2); /* only the displaced values go while armed */
        int i = atomic_fetch_add(&drop_checks, 1);
        if (i < 16 && side_call_returns(&drop_calls[i], join_drop_source, NULL, ATAP_SEC(2)))
            atomic_fetch_add(&drop_ok, 1);
        atomic_fetch_add(&drop_done, 1);
    }
}

static void test_dataflow_displaced_value_freed_after_the_locks(void **state)
{
    (void)state;
    enum { N = 10 }; /* past the 8 a kick list keeps in place */
    probe *ps = probe_new(8, 1, 0), *pt[N];
    atap_task t[N];
    uint64_t v1 = 1, v2 = 2, v3 = 3;

    drop_source = spawn_probe(ps, (atap_spawn_opts){0});
    atomic_store(&drop_frees, 0);
    atomic_store(&drop_checks, 0);
    atomic_store(&drop_ok, 0);
    atomic_store(&drop_done, 0);
    for (int i = 0; i < N; i++) {
        pt[i] = probe_new(8, 1, 0);
        /* blocking: ten runs held at once, past what the workers grow to */
        t[i] = spawn_probe(pt[i],
                           (atap_spawn_opts){.in_free = in_free_joining_source, .blocking = true});
        assert_int_equal(atap_forward(drop_source, t[i]), 0);
        atomic_store(&pt[i]->hold, 1);
        assert_int_equal(atap_give(t[i], &v1, 8), 0); /* its first run: held */
        assert_true(wait_atomic_at_least(&pt[i]->runs, 1, ATAP_SEC(10)));
        assert_int_equal(atap_give(t[i], &v2, 8), 0); /* pending behind it */
    }
    atomic_store(&drop_armed, 1);
    assert_int_equal(atap_give(drop_source, &v3, 8), 0); /* publishes 3: each v2 goes */
    assert_true(wait_atomic_at_least(&drop_done, N, ATAP_SEC(60)));
    atomic_store(&drop_armed, 0);
    for (int i = 0; i < N; i++)
        side_call_join(&drop_calls[i]);
    assert_int_equal(atomic_load(&drop_ok), N); /* every join returned */
    for (int i = 0; i < N; i++) {
        atomic_store(&pt[i]->hold, 0);
        JOIN_UNTIL(t[i], 3); /* the next run had the delivered 3, not the 2 */
    }
    assert_no_failures();
    atap_release(drop_source);
    for (int i = 0; i < N; i++)
        atap_release(t[i]);
    waited_to_live_back();
    assert_int_equal(atomic_load(&drop_frees), 2 * N); /* v1 and v2, once each */
}

/* A waiting task stopped while a run is under way (a cancel, its timeout)
 * or whose at-rate run fails after the series went back to waiting has
 * ended: its forwards close at once, with its handle still held, and a
 * receiver fed by it alone reads ATAP_EFAILED. They used to stay open
 * until the task's last handle went. */
static atomic_int stop_started;

static int task_until_cancelled(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    atomic_store(&stop_started, 1);
    while (!atap_cancelled(ctx))
        sleep_us(1000);
    sleep_us(20000); /* returns a while after the stop */
    memset(out, 0, 8);
    return 0;
}

static int task_fail_late(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    sleep_us(50000);
    return 1;
}

static void test_dataflow_waiting_task_stopped_mid_run_closes(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        atap_spawn_opts o = {.out_size = 8};
        atap_fn *fn = task_until_cancelled;
        if (k == 1)
            o.timeout_ns = ATAP_MS(20);
        if (k == 2) {
            fn = task_fail_late;
            o.kind = ATAP_AT_RATE;
            o.every_ns = ATAP_MS(10);
            o.runs = 1;
        }
        atomic_store(&stop_started, 0);
        atap_task a, r;
        uint64_t v = 7;
        assert_int_equal(atap_spawn_waiting(&a, fn, NULL, sizeof v, &o), 0);
        assert_int_equal(atap_receive_any(&r, probe_run, probe_new(8, 1, 0), &a, 1,
                                          &(atap_spawn_opts){.out_size = 8}),
                         0);
        assert_int_equal(atap_give(a, &v, sizeof v), 0);
        if (k == 0) {
            assert_true(wait_atomic_at_least(&stop_started, 1, ATAP_SEC(10)));
            assert_int_equal(atap_cancel(a), 0);
        }
        int rc = atap_join_for(r, &v, 8, ATAP_SEC(3));
        if (rc != ATAP_EFAILED)
            fail_msg("case %d: the receiver read %d (%s), wanted ATAP_EFAILED", k, rc,
                     atap_strerror(rc));
        assert_true(atap_finished(a));
        atap_release(a);
        atap_release(r);
    }
    waited_to_live_back();
}

/* An at-rate series' runs overlap, and the series' end (its run count
 * reached) comes as its last run starts: forwards out of it stay open until
 * the runs under way have published, so a receiver gets every output. They
 * closed at the series' end, and the last outputs were lost. */
static atomic_int rate_count;

static int task_rate_count(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    sleep_us(20000); /* still running when the series ends */
    uint64_t v = (uint64_t)atomic_fetch_add(&rate_count, 1) + 1;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_dataflow_at_rate_forwards_every_run(void **state)
{
    (void)state;
    static const unsigned runs[] = {1, 3};
    for (int k = 0; k < 2; k++) {
        atomic_store(&rate_count, 0);
        probe *p = probe_new(8, 1, 0);
        atap_task src, r;
        assert_int_equal(atap_spawn(&src, task_rate_count, NULL,
                                    &(atap_spawn_opts){.out_size = 8,
                                                       .kind = ATAP_AT_RATE,
                                                       .every_ns = ATAP_MS(5),
                                                       .runs = runs[k]}),
                         0);
        assert_int_equal(
            atap_receive_any(&r, probe_run, p, &src, 1, &(atap_spawn_opts){.out_size = 8}), 0);
        assert_true(wait_finished(r, ATAP_SEC(10)));
        uint64_t v = 0, last = join8(src);
        int rc = atap_join(r, &v, 8);
        /* its last run was for the series' last output (outputs that come
         * while it runs may be coalesced: the newest wins; overlapping runs
         * may publish out of their order) */
        if (rc != 0 || v != last || atomic_load(&p->runs) < 1)
            fail_msg("runs=%u: the receiver read %d (%s), value %llu, the series %llu, after %d "
                     "runs",
                     runs[k], rc, atap_strerror(rc), (unsigned long long)v,
                     (unsigned long long)last, atomic_load(&p->runs));
        assert_int_equal(atomic_load(&rate_count), (int)runs[k]);
        atap_release(src);
        atap_release(r);
    }
    waited_to_live_back();
}

/* A long chain of forwards S -> T0 -> ... -> Tn, every T's handle gone:
 * letting go of S lets go of each in turn. Each let-go used to run the next
 * one inside it, one stack frame set per link, and 60,000 links ran the
 * thread out of stack (a segfault). */
static int task_pass_on(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t n = 0;
    const void *in = atap_input(ctx, &n);
    if (in && n == 8)
        memcpy(out, in, 8);
    return 0;
}

/* A waiting at-rate series whose last handle goes while its run is still
 * out (the series ran out of runs and waits for a give again): the run's
 * output still reaches the receiver it forwards to. */
static atomic_int slow42_started;

static int task_slow42(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atomic_store(&slow42_started, 1);
    sleep_ms(300);
    uint64_t v = 42;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void test_dataflow_at_rate_let_go_keeps_run_under_way(void **state)
{
    (void)state;
    atap_task a, r;
    uint64_t v = 7;
    atomic_store(&slow42_started, 0);
    assert_int_equal(atap_spawn_waiting(&a, task_slow42, NULL, 8,
                                        &(atap_spawn_opts){.out_size = 8,
                                                           .kind = ATAP_AT_RATE,
                                                           .every_ns = ATAP_MS(1),
                                                           .runs = 1}),
                     0);
    probe *p = probe_new(8, 1, 0);
    assert_int_equal(atap_receive_any(&r, probe_run, p, &a, 1, &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_int_equal(atap_give(a, &v, 8), 0);
    assert_true(wait_atomic_at_least(&slow42_started, 1, ATAP_SEC(10)));
    sleep_ms(50);    /* the series ran out of runs: its gate waits, the run is out */
    atap_release(a); /* its last handle: let go */
    v = 0;
    assert_true(wait_finished(r, ATAP_SEC(10)));
    assert_int_equal(atap_join(r, &v, 8), 0);
    assert_true(v == 42);
    atap_release(r);
    waited_to_live_back();
}

static void test_dataflow_long_forward_chain_lets_go(void **state)
{
    (void)state;
    const int n = (int)scaled(60000, 60000);
    atap_task src, prev, t;
    assert_int_equal(
        atap_spawn_waiting(&src, task_pass_on, NULL, 8, &(atap_spawn_opts){.out_size = 8}), 0);
    prev = src;
    for (int i = 0; i < n; i++) {
        assert_int_equal(
            atap_spawn_waiting(&t, task_pass_on, NULL, 8, &(atap_spawn_opts){.out_size = 8}), 0);
        assert_int_equal(atap_forward(prev, t), 0);
        if (i > 0)
            atap_release(prev);
        prev = t;
    }
    atap_release(prev);
    atap_release(src); /* the source's last handle: it is let go, then the chain */
    assert_true(wait_live_back(ATAP_SEC(60)));
}

/* receive_any: every member's output is a run of its own; it finishes when
 * no member can publish again. */
static void test_dataflow_receive_any(void **state)
{
    (void)state;
    gate *g[3] = {gate_new(5), gate_new(7), gate_new(11)};
    atap_task m[3];
    for (int i = 0; i < 3; i++)
        m[i] = spawn8(task_gated, g[i]);
    probe *p = probe_new(8, 1, 0);
    atap_task r;
    assert_int_equal(atap_receive_any(&r, probe_run, p, m, 3, &(atap_spawn_opts){.out_size = 8}),
                     0);
    sleep_us(20000);
    assert_int_equal(atomic_load(&p->runs), 0);
    uint64_t want[3] = {5, 7, 11};
    for (int i = 0; i < 3; i++) {
        assert_false(atap_finished(r));
        atomic_store(&g[i]->open, 1);
        JOIN_UNTIL(r, want[i]);
        SETTLE_EXACT(&p->done, i + 1);
    }
    assert_true(wait_finished(r, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&p->runs), 3);
    assert_true(atomic_load(&p->sum) == 23);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    assert_true(join8(r) == 11);
    for (int i = 0; i < 3; i++)
        atap_release(m[i]);
    atap_release(r);

    /* outputs already there: at least one run, the newest wins, done */
    for (int i = 0; i < 3; i++) {
        m[i] = spawn8(task_value, (void *)(uintptr_t)(100 + i));
        assert_true(join8(m[i]) == (uint64_t)(100 + i));
    }
    p = probe_new(8, 1, 0);
    assert_int_equal(atap_receive_any(&r, probe_run, p, m, 3, &(atap_spawn_opts){.out_size = 8}),
                     0);
    assert_true(wait_finished(r, ATAP_SEC(10)));
    int runs = atomic_load(&p->runs);
    assert_true(runs >= 1 && runs <= 3);
    uint64_t v = join8(r);
    assert_true(v >= 100 && v <= 102);
    for (int i = 0; i < 3; i++)
        atap_release(m[i]);
    atap_release(r);
    waited_to_live_back();
}

/* Argument checks on receivers, and a receiver cannot be given to. */
static void test_dataflow_receiver_bad_arguments(void **state)
{
    (void)state;
    atap_task m[3];
    m[0] = spawn8(task_value, (void *)(uintptr_t)1);
    m[1] = spawn8(task_value, (void *)(uintptr_t)2);
    assert_int_equal(
        atap_spawn(&m[2], task_value, (void *)(uintptr_t)3, &(atap_spawn_opts){.out_size = 4}), 0);
    (void)join8(m[0]);
    (void)join8(m[1]);
    assert_int_equal(atap_join(m[2], &(uint32_t){0}, 4), 0);
    summer *s = summer_new(2);
    atap_spawn_opts o = {.out_size = 8};
    atap_task r = {12345};
    size_t live = pool_stats().live;

    assert_int_equal(atap_receive_all(&r, sum_run, s, m, 0, &o), ATAP_EINVAL);
    assert_true(r.id == 0);
    assert_int_equal(atap_receive_any(&r, sum_run, s, m, 0, &o), ATAP_EINVAL);
    assert_int_equal(atap_receive_all(&r, sum_run, s, NULL, 2, &o), ATAP_EINVAL);
    assert_int_equal(atap_receive_any(&r, sum_run, s, NULL, 2, &o), ATAP_EINVAL);
    assert_int_equal(atap_receive_all(&r, sum_run, s, m, 2,
                                      &(atap_spawn_opts){.out_size = 8, .in_free = boxed_free}),
                     ATAP_EINVAL);
    assert_int_equal(atap_receive_any(&r, sum_run, s, m, 2,
                                      &(atap_spawn_opts){.out_size = 8, .in_free = boxed_free}),
                     ATAP_EINVAL);
    assert_int_equal(atap_receive_all(&r, NULL, s, m, 2, &o), ATAP_EINVAL);
    assert_int_equal(atap_receive_all(NULL, sum_run, s, m, 2, &o), ATAP_EINVAL);
    /* any: sizes must agree (8, 8, 4) */
    assert_int_equal(atap_receive_any(&r, sum_run, s, m, 3, &o), ATAP_EINVAL);
    assert_true(r.id == 0);

    /* a member that names no task: nothing spawned */
    atap_task gone = spawn8(task_value, (void *)(uintptr_t)9);
    (void)join8(gone);
    atap_release(gone);
    atap_task bad[2] = {m[0], ATAP_NO_TASK};
    assert_int_equal(atap_receive_all(&r, sum_run, s, bad, 2, &o), ATAP_ENOTASK);
    assert_true(r.id == 0);
    assert_int_equal(atap_receive_any(&r, sum_run, s, bad, 2, &o), ATAP_ENOTASK);
    bad[1] = gone;
    assert_int_equal(atap_receive_all(&r, sum_run, s, bad, 2, &o), ATAP_ENOTASK);
    assert_int_equal(atap_receive_any(&r, sum_run, s, bad, 2, &o), ATAP_ENOTASK);
    assert_true(wait_live_at_most(live, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&s->runs), 0);

    /* a receiver is fed by its members only */
    s = summer_new(2);
    assert_int_equal(atap_receive_all(&r, sum_run, s, m, 2, &o), 0);
    uint64_t in[2] = {1, 2};
    assert_int_equal(atap_give(r, in, sizeof in), ATAP_EINVAL);
    assert_true(join8(r) == 3);
    assert_int_equal(atap_forward(m[0], r), ATAP_EINVAL);
    atap_task ra;
    probe *p = probe_new(8, 1, 0);
    assert_int_equal(atap_receive_any(&ra, probe_run, p, m, 2, &o), 0);
    assert_int_equal(atap_give(ra, in, 8), ATAP_EINVAL);
    assert_int_equal(atap_forward(m[0], ra), ATAP_EINVAL);
    assert_true(wait_finished(ra, ATAP_SEC(10)));
    for (int i = 0; i < 3; i++)
        atap_release(m[i]);
    atap_release(r);
    atap_release(ra);
    waited_to_live_back();
}

/* ======================================================================== */
/* atap_forward                                                              */
/* ======================================================================== */

static int task_counter(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = (uint64_t)atomic_fetch_add((atomic_int *)arg, 1) + 1;
    sleep_us(1000);
    memcpy(out, &v, sizeof v);
    return 0;
}

/* Every run of a repeat is forwarded; the target ends on the last value. */
static void test_dataflow_forward_repeat_source(void **state)
{
    (void)state;
    static atomic_int count;
    atomic_store(&count, 0);
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){0});
    atap_task s;
    assert_int_equal(atap_spawn(&s, task_counter, &count,
                                &(atap_spawn_opts){.out_size = 8, .kind = ATAP_REPEAT, .runs = 5}),
                     0);
    assert_int_equal(atap_forward(s, t), 0);
    assert_true(wait_finished(s, ATAP_SEC(10)));
    JOIN_UNTIL(t, 5);
    int runs = atomic_load(&p->done);
    char seen[256] = "";
    for (int i = 0; i < runs && i < MAX_SEEN; i++)
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), " %llu",
                 (unsigned long long)atomic_load(&p->seen[i]));
    /* seen in order, none twice, ending on 5 */
    bool ordered = runs >= 1 && runs <= 5 && atomic_load(&p->seen[runs - 1]) == 5;
    for (int i = 1; i < runs && i < MAX_SEEN; i++)
        ordered = ordered && atomic_load(&p->seen[i]) > atomic_load(&p->seen[i - 1]);
    sleep_us(50000);
    int later = atomic_load(&p->runs);
    bool still_waiting = !atap_finished(t); /* our handle can still give */
    atap_release(s);
    atap_release(t);
    waited_to_live_back();
    if (!ordered)
        fail_msg("the target's %d runs saw:%s (wanted increasing values, ending on 5)", runs, seen);
    assert_int_equal(later, runs);
    assert_int_equal(atomic_load(&p->bad_size), 0);
    assert_true(still_waiting);
}

/* Many sources into one target, and a chain a -> b -> c whose middle
 * link's handle is released before anything flows. */
static void test_dataflow_forward_many_to_one_and_chain(void **state)
{
    (void)state;
    gate *g[3] = {gate_new(5), gate_new(7), gate_new(11)};
    atap_task src[3];
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){0});
    for (int i = 0; i < 3; i++) {
        src[i] = spawn8(task_gated, g[i]);
        assert_int_equal(atap_forward(src[i], t), 0);
    }
    uint64_t want[3] = {5, 7, 11};
    for (int i = 0; i < 3; i++) {
        atomic_store(&g[i]->open, 1);
        JOIN_UNTIL(t, want[i]);
        SETTLE_EXACT(&p->done, i + 1);
    }
    assert_true(atomic_load(&p->sum) == 23);
    for (int i = 0; i < 3; i++)
        atap_release(src[i]);
    atap_release(t);
    waited_to_live_back();

    /* the chain */
    gate *ga = gate_new(10);
    atap_task a = spawn8(task_gated, ga);
    probe *pb = probe_new(8, 1, 1), *pc = probe_new(8, 1, 1);
    atap_task b = spawn_probe(pb, (atap_spawn_opts){0});
    atap_task c = spawn_probe(pc, (atap_spawn_opts){0});
    assert_int_equal(atap_forward(a, b), 0);
    assert_int_equal(atap_forward(b, c), 0);
    atap_release(b); /* the forward from a keeps it */
    atomic_store(&ga->open, 1);
    JOIN_UNTIL(c, 12);
    SETTLE_EXACT(&pb->done, 1);
    SETTLE_EXACT(&pc->done, 1);
    assert_true(atomic_load(&pc->seen[0]) == 11);
    atap_release(a);
    atap_release(c);
    waited_to_live_back();
}

/* An output already there is handed over at once; bad pairs are refused. */
static void test_dataflow_forward_ready_output_and_bad_arguments(void **state)
{
    (void)state;
    atap_task s = spawn8(task_value, (void *)(uintptr_t)33);
    assert_true(join8(s) == 33);
    probe *p = probe_new(8, 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){0});
    assert_int_equal(atap_forward(s, t), 0);
    JOIN_UNTIL(t, 33);
    SETTLE_EXACT(&p->runs, 1);

    /* sizes */
    probe *p4 = probe_new(4, 1, 0);
    atap_task t4 = spawn_probe(p4, (atap_spawn_opts){0});
    assert_int_equal(atap_forward(s, t4), ATAP_EINVAL);
    /* not a waiting task */
    atap_task plain = spawn8(task_value, (void *)(uintptr_t)1);
    assert_int_equal(atap_forward(s, plain), ATAP_EINVAL);
    /* no task on either side */
    assert_int_equal(atap_forward(ATAP_NO_TASK, t), ATAP_ENOTASK);
    assert_int_equal(atap_forward(s, ATAP_NO_TASK), ATAP_ENOTASK);
    /* a target that takes no more gives */
    probe *pf = probe_new(8, 1, 0);
    atap_task tf = spawn_probe(pf, (atap_spawn_opts){.gives = 1});
    uint64_t in = 1;
    assert_int_equal(atap_give(tf, &in, 8), 0);
    assert_true(wait_finished(tf, ATAP_SEC(10)));
    assert_int_equal(atap_forward(s, tf), ATAP_EFINISHED);
    probe *pcn = probe_new(8, 1, 0);
    atap_task tc = spawn_probe(pcn, (atap_spawn_opts){0});
    assert_int_equal(atap_cancel(tc), 0);
    assert_int_equal(atap_forward(s, tc), ATAP_ECANCELLED);
    sleep_us(30000);
    assert_int_equal(atomic_load(&p4->runs), 0);
    assert_int_equal(atomic_load(&pf->runs), 1);
    assert_int_equal(atomic_load(&pcn->runs), 0);
    assert_int_equal(atomic_load(&p->runs), 1);
    atap_release(s);
    atap_release(t);
    atap_release(t4);
    atap_release(plain);
    atap_release(tf);
    atap_release(tc);
    waited_to_live_back();
}

/* A target whose gives are used up refuses a forward as it refuses a give,
 * even while its last run is still under way. */
static void test_dataflow_forward_into_spent_target(void **state)
{
    (void)state;
    probe *p = probe_new(8, 1, 0);
    atomic_store(&p->hold, 1);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.gives = 1});
    uint64_t in = 1;
    assert_int_equal(atap_give(t, &in, 8), 0);
    assert_true(wait_atomic_at_least(&p->runs, 1, ATAP_SEC(10)));
    assert_int_equal(atap_give(t, &in, 8), ATAP_EFINISHED); /* the last run is under way */
    atap_task s = spawn8(task_value, (void *)(uintptr_t)2);
    assert_true(join8(s) == 2);
    int rc = atap_forward(s, t);
    atomic_store(&p->hold, 0);
    if (rc != ATAP_EFINISHED)
        fail_msg("forward into a task whose gives are used up (last run under way): %d (%s), "
                 "wanted ATAP_EFINISHED as atap_give returns",
                 rc, atap_strerror(rc));
    assert_true(wait_finished(t, ATAP_SEC(10)));
    assert_int_equal(atap_forward(s, t), ATAP_EFINISHED);
    SETTLE_EXACT(&p->runs, 1);
    atap_release(s);
    atap_release(t);
    waited_to_live_back();
}

/* ======================================================================== */
/* atap_join_first                                                           */
/* ======================================================================== */

static bool running_or_pending(atap_task t)
{
    atap_state st = atap_state_of(t);
    return st == ATAP_PENDING || st == ATAP_RUNNING;
}

/* The first to settle wins; PASS_BACK leaves every handle as it was. */
static void test_dataflow_join_first_pass_back(void **state)
{
    (void)state;
    gate *g1 = gate_new(1), *g2 = gate_new(2);
    atap_task ts[3] = {spawn8(task_sleeper, g1), spawn8(task_sleeper, g2),
                       spawn8(task_value, (void *)(uintptr_t)7)};
    atap_task copy[3];
    memcpy(copy, ts, sizeof ts);
    size_t w = 99;
    assert_int_equal(atap_join_first(ts, 3, ATAP_PASS_BACK, ATAP_SEC(10), &w), 0);
    assert_int_equal(w, 2);
    assert_memory_equal(ts, copy, sizeof ts);
    assert_true(join8(ts[2]) == 7);
    assert_true(running_or_pending(ts[0]));
    assert_true(running_or_pending(ts[1]));
    atomic_store(&g1->open, 1);
    atomic_store(&g2->open, 1);
    assert_true(join8(ts[0]) == 1);
    assert_true(join8(ts[1]) == 2);
    for (int i = 0; i < 3; i++)
        atap_release(ts[i]);
    waited_to_live_back();
}

/* ATAP_CANCEL cancels the losers and releases their handles. */
static void test_dataflow_join_first_cancel_policy(void **state)
{
    (void)state;
    gate *g1 = gate_new(1), *g2 = gate_new(2);
    atap_task ts[3] = {spawn8(task_sleeper, g1), spawn8(task_value, (void *)(uintptr_t)7),
                       spawn8(task_sleeper, g2)};
    atap_task d0, d2;
    assert_int_equal(atap_dup(ts[0], &d0), 0);
    assert_int_equal(atap_dup(ts[2], &d2), 0);
    size_t w = 99;
    assert_int_equal(atap_join_first(ts, 3, ATAP_CANCEL, ATAP_SEC(10), &w), 0);
    assert_int_equal(w, 1);
    assert_true(join8(ts[1]) == 7);
    atap_state st = ATAP_PENDING;
    assert_int_equal(atap_wait(d0, &st), 0);
    assert_int_equal(st, ATAP_CANCELLED);
    assert_int_equal(atap_wait(d2, &st), 0);
    assert_int_equal(st, ATAP_CANCELLED);
    uint64_t v;
    assert_int_equal(atap_join(d0, &v, 8), ATAP_ECANCELLED);
    atap_release(d0);
    atap_release(d2);
    atap_release(ts[1]);
    /* only the dups were ours to release: the slots go only if join_first
     * released the originals */
    waited_to_live_back();
}

/* ATAP_RELEASE releases the losers without cancelling them. */
static void test_dataflow_join_first_release_policy(void **state)
{
    (void)state;
    gate *g1 = gate_new(1), *g2 = gate_new(2);
    atap_task ts[3] = {spawn8(task_sleeper, g1), spawn8(task_sleeper, g2),
                       spawn8(task_value, (void *)(uintptr_t)7)};
    atap_task d0, d1;
    assert_int_equal(atap_dup(ts[0], &d0), 0);
    assert_int_equal(atap_dup(ts[1], &d1), 0);
    size_t w = 99;
    assert_int_equal(atap_join_first(ts, 3, ATAP_RELEASE, ATAP_SEC(10), &w), 0);
    assert_int_equal(w, 2);
    assert_true(join8(ts[2]) == 7);
    assert_true(running_or_pending(d0));
    assert_true(running_or_pending(d1));
    atomic_store(&g1->open, 1);
    atomic_store(&g2->open, 1);
    assert_true(join8(d0) == 1);
    assert_true(join8(d1) == 2);
    atap_release(d0);
    atap_release(d1);
    atap_release(ts[2]);
    waited_to_live_back();
}

/* A task already settled wins at once, lowest index first; so does a
 * handle with no task. */
static void test_dataflow_join_first_settled_wins_at_once(void **state)
{
    (void)state;
    gate *g = gate_new(1);
    atap_task s = spawn8(task_sleeper, g);
    atap_task done1 = spawn8(task_value, (void *)(uintptr_t)1);
    atap_task done2 = spawn8(task_value, (void *)(uintptr_t)2);
    (void)join8(done1);
    (void)join8(done2);
    size_t w = 99;

    atap_task a[2] = {s, done1};
    assert_int_equal(atap_join_first(a, 2, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    atap_task b[3] = {s, done2, done1};
    assert_int_equal(atap_join_first(b, 3, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    atap_task c[2] = {s, ATAP_NO_TASK};
    assert_int_equal(atap_join_first(c, 2, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    atap_task d[3] = {s, ATAP_NO_TASK, done1};
    assert_int_equal(atap_join_first(d, 3, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    /* a failed task and a cancelled one settle too */
    atap_task f = spawn8(task_fail, NULL);
    atap_task e[2] = {s, f};
    assert_int_equal(atap_join_first(e, 2, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    atap_task cn;
    assert_int_equal(atap_spawn(&cn, task_value, NULL,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(30)}),
                     0);
    assert_int_equal(atap_cancel(cn), 0);
    atap_task h[2] = {s, cn};
    assert_int_equal(atap_join_first(h, 2, ATAP_PASS_BACK, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    assert_true(running_or_pending(s));

    /* NO_TASK winning with ATAP_CANCEL still deals with the loser */
    atap_task sd;
    assert_int_equal(atap_dup(s, &sd), 0);
    atap_task k[2] = {s, ATAP_NO_TASK};
    assert_int_equal(atap_join_first(k, 2, ATAP_CANCEL, ATAP_SEC(5), &w), 0);
    assert_int_equal(w, 1);
    atap_state st;
    assert_int_equal(atap_wait(sd, &st), 0);
    assert_int_equal(st, ATAP_CANCELLED);
    atap_release(sd);
    atap_release(done1);
    atap_release(done2);
    atap_release(f);
    atap_release(cn);
    waited_to_live_back();
}

/* A join_first waiting in another thread, for test_dataflow_join_first_hears_after_let_go. */
typedef struct first_call {
    atap_task t;
    int rc;
    uint64_t returned;
} first_call;

static void *join_first_main(void *p)
{
    first_call *c = p;
    size_t w = 99;
    c->rc = atap_join_first(&c->t, 1, ATAP_PASS_BACK, ATAP_SEC(20), &w);
    c->returned = now_ns();
    return NULL;
}

/* A waiting task let go (its last handle released, nothing given) while a
 * join_first waits must not leave that join_first deaf to the settle it
 * waits for: the let-go used to zero join.c's count of waiters, so the
 * settle bumped nothing and the wait slept on (found by fuzz_api). */
static void test_dataflow_join_first_hears_after_let_go(void **state)
{
    (void)state;
    gate *g = gate_new(5);
    first_call c = {.t = spawn8(task_gated, g)};
    pthread_t th;

    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(10)));
    assert_int_equal(pthread_create(&th, NULL, join_first_main, &c), 0);
    sleep_ms(50); /* join_first counted and asleep */
    for (int i = 0; i < 4; i++) {
        atap_task wt;
        assert_int_equal(
            atap_spawn_waiting(&wt, task_value, NULL, 8, &(atap_spawn_opts){.out_size = 8}), 0);
        atap_release(wt); /* nothing can give to it: let go */
    }
    sleep_ms(20);
    uint64_t opened = now_ns();
    atomic_store(&g->open, 1);
    pthread_join(th, NULL);
    assert_int_equal(c.rc, 0);
    assert_true(c.returned - opened < ATAP_SEC(5));
    assert_int_equal(join8(c.t), 5);
    atap_release(c.t);
    waited_to_live_back();
}

/* A timeout touches no handle; bad arguments are refused. */
static void test_dataflow_join_first_timeout_and_bad_arguments(void **state)
{
    (void)state;
    gate *g1 = gate_new(1), *g2 = gate_new(2);
    atap_task ts[2] = {spawn8(task_sleeper, g1), spawn8(task_sleeper, g2)};
    size_t w = 99;
    for (int policy = ATAP_PASS_BACK; policy <= ATAP_RELEASE; policy++) {
        uint64_t t0 = now_ns();
        assert_int_equal(atap_join_first(ts, 2, (atap_join_policy)policy, ATAP_MS(30), &w),
                         ATAP_ENOTREADY);
        assert_true(now_ns() - t0 >= ATAP_MS(29));
        assert_int_equal(atap_join_first(ts, 2, (atap_join_policy)policy, 0, &w), ATAP_ENOTREADY);
        /* not cancelled, not released (a released handle reads FAILED) */
        assert_true(running_or_pending(ts[0]));
        assert_true(running_or_pending(ts[1]));
    }
    assert_int_equal(atap_join_first(ts, 0, ATAP_PASS_BACK, ATAP_MS(10), &w), ATAP_EINVAL);
    assert_int_equal(atap_join_first(NULL, 2, ATAP_PASS_BACK, ATAP_MS(10), &w), ATAP_EINVAL);
    assert_int_equal(atap_join_first(ts, 2, ATAP_PASS_BACK, ATAP_MS(10), NULL), ATAP_EINVAL);
    assert_int_equal(atap_join_first(ts, 2, (atap_join_policy)7, ATAP_MS(10), &w), ATAP_EINVAL);
    assert_true(running_or_pending(ts[0]));
    assert_true(running_or_pending(ts[1]));
    atomic_store(&g1->open, 1);
    atomic_store(&g2->open, 1);
    assert_true(join8(ts[0]) == 1);
    assert_true(join8(ts[1]) == 2);
    atap_release(ts[0]);
    atap_release(ts[1]);
    waited_to_live_back();
}

/* join_first inside a task on nothing but itself could never return. */
static int task_first_on_self(atap_ctx *ctx, void *arg, void *out)
{
    atap_task me[2] = {atap_self(ctx), atap_self(ctx)}, mix[2];
    size_t w = 99;
    int rc[3];
    rc[0] = atap_join_first(me, 1, ATAP_PASS_BACK, ATAP_MS(200), &w);
    rc[1] = atap_join_first(me, 2, ATAP_PASS_BACK, ATAP_MS(200), &w);
    /* with a settled task beside it, that one wins */
    mix[0] = me[0];
    mix[1] = *(atap_task *)arg;
    rc[2] = atap_join_first(mix, 2, ATAP_PASS_BACK, ATAP_FOREVER, &w) == 0 && w == 1;
    memcpy(out, rc, sizeof rc);
    return 0;
}

static void test_dataflow_join_first_on_itself_einval(void **state)
{
    (void)state;
    static atap_task done;
    done = spawn8(task_value, (void *)(uintptr_t)3);
    assert_true(join8(done) == 3);
    atap_task t;
    int rc[3];
    assert_int_equal(
        atap_spawn(&t, task_first_on_self, &done, &(atap_spawn_opts){.out_size = sizeof rc}), 0);
    assert_int_equal(atap_join(t, rc, sizeof rc), 0);
    assert_int_equal(rc[0], ATAP_EINVAL);
    assert_int_equal(rc[1], ATAP_EINVAL);
    assert_int_equal(rc[2], 1);
    atap_release(t);
    atap_release(done);
}

/* A task that settles while join_first sets up its wait is still found. */
static void test_dataflow_join_first_settles_during_setup(void **state)
{
    (void)state;
    gate *g = gate_new(1);
    atap_task slow = spawn8(task_gated, g); /* no deadline of its own */
    size_t rounds = scaled(1000, 200);
    for (size_t i = 0; i < rounds; i++) {
        atap_task quick = spawn8(task_value, (void *)(uintptr_t)i);
        atap_task set[2];
        size_t at = i % 2;
        set[at] = quick;
        set[1 - at] = slow;
        size_t w = 99;
        int rc = atap_join_first(set, 2, ATAP_PASS_BACK, ATAP_SEC(10), &w);
        if (rc != 0 || w != at)
            fail_msg("round %zu: rc %d (%s), winner %zu, wanted %zu", i, rc, atap_strerror(rc), w,
                     at);
        assert_true(join8(quick) == i);
        atap_release(quick);
    }
    assert_true(running_or_pending(slow));
    atomic_store(&g->open, 1);
    assert_true(join8(slow) == 1);
    atap_release(slow);
    waited_to_live_back();
}

#define JF_THREADS 8
typedef struct jf_arg {
    test_barrier *barrier;
    size_t rounds;
    int id;
    atomic_int *done;
} jf_arg;

static void *join_first_thread(void *pa)
{
    jf_arg *a = pa;
    barrier_wait(a->barrier);
    for (size_t i = 0; i < a->rounds; i++) {
        atap_task ts[3];
        uint64_t want[3];
        bool ok = true;
        for (int j = 0; j < 3; j++) {
            want[j] = ((uint64_t)a->id << 32) | (i * 3 + (size_t)j);
            if (atap_spawn(&ts[j], task_value, (void *)(uintptr_t)want[j],
                           &(atap_spawn_opts){.out_size = 8}) != 0) {
                CHECK(!"spawn failed");
                ok = false;
            }
        }
        if (!ok)
            return NULL;
        atap_join_policy policy = (atap_join_policy)(i % 3);
        size_t w = 99;
        int rc = atap_join_first(ts, 3, policy, ATAP_SEC(30), &w);
        CHECK(rc == 0);
        CHECK(w < 3);
        if (rc != 0 || w >= 3) {
            for (int j = 0; j < 3; j++)
                atap_release(ts[j]);
            continue;
        }
        uint64_t v = 0;
        CHECK(atap_try_join(ts[w], &v, 8) == 0); /* the winner has settled */
        CHECK(v == want[w]);
        if (policy == ATAP_PASS_BACK) {
            for (int j = 0; j < 3; j++) {
                CHECK(atap_join(ts[j], &v, 8) == 0 && v == want[j]);
                atap_release(ts[j]);
            }
        } else {
            atap_release(ts[w]);
        }
        atomic_fetch_add(a->done, 1);
    }
    return NULL;
}

/* join_first from many threads at once, over tasks that finish fast. */
static void test_dataflow_join_first_threads(void **state)
{
    (void)state;
    static atomic_int done;
    atomic_store(&done, 0);
    test_barrier barrier;
    barrier_init(&barrier, JF_THREADS);
    jf_arg args[JF_THREADS];
    pthread_t th[JF_THREADS];
    size_t rounds = scaled(200, 50);
    for (int i = 0; i < JF_THREADS; i++) {
        args[i] = (jf_arg){.barrier = &barrier, .rounds = rounds, .id = i, .done = &done};
        assert_int_equal(pthread_create(&th[i], NULL, join_first_thread, &args[i]), 0);
    }
    for (int i = 0; i < JF_THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_no_failures();
    assert_int_equal(atomic_load(&done), (int)(rounds * JF_THREADS));
    waited_to_live_back();
}

/* ======================================================================== */
/* atap_join_all                                                             */
/* ======================================================================== */

static void test_dataflow_join_all(void **state)
{
    (void)state;
    enum { N = 16 };
    atap_task ts[N];
    uint64_t out[N];
    int rcs[N];
    for (int i = 0; i < N; i++)
        ts[i] = spawn8(task_value, (void *)(uintptr_t)(i * 3 + 1));
    memset(out, 0, sizeof out);
    for (int i = 0; i < N; i++)
        rcs[i] = 12345;
    assert_int_equal(atap_join_all(ts, N, out, 8, rcs), 0);
    for (int i = 0; i < N; i++) {
        assert_true(out[i] == (uint64_t)(i * 3 + 1));
        assert_int_equal(rcs[i], 0);
    }
    memset(out, 0, sizeof out);
    assert_int_equal(atap_join_all(ts, N, out, 8, NULL), 0);
    assert_true(out[N - 1] == (uint64_t)((N - 1) * 3 + 1));

    /* a wrong size fails every join */
    assert_int_equal(atap_join_all(ts, N, out, 4, rcs), ATAP_EINVAL);
    for (int i = 0; i < N; i++)
        assert_int_equal(rcs[i], ATAP_EINVAL);
    assert_int_equal(atap_join_all(NULL, N, out, 8, rcs), ATAP_EINVAL);
    assert_int_equal(atap_join_all(ts, N, NULL, 8, rcs), ATAP_EINVAL);

    /* one cancelled at 3, one failed at 9: the first failure is returned */
    atap_release(ts[3]);
    atap_release(ts[9]);
    assert_int_equal(atap_spawn(&ts[3], task_value, NULL,
                                &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_SEC(30)}),
                     0);
    assert_int_equal(atap_cancel(ts[3]), 0);
    ts[9] = spawn8(task_fail, NULL);
    memset(out, 0, sizeof out);
    assert_int_equal(atap_join_all(ts, N, out, 8, rcs), ATAP_ECANCELLED);
    for (int i = 0; i < N; i++) {
        if (i == 3) {
            assert_int_equal(rcs[i], ATAP_ECANCELLED);
        } else if (i == 9) {
            assert_int_equal(rcs[i], ATAP_EFAILED);
        } else {
            assert_int_equal(rcs[i], 0);
            assert_true(out[i] == (uint64_t)(i * 3 + 1));
        }
    }
    assert_int_equal(atap_join_all(ts, N, out, 8, NULL), ATAP_ECANCELLED);
    /* the failure first by index: swap them round */
    atap_task tmp = ts[3];
    ts[3] = ts[9];
    ts[9] = tmp;
    assert_int_equal(atap_join_all(ts, N, out, 8, rcs), ATAP_EFAILED);
    assert_int_equal(rcs[3], ATAP_EFAILED);
    assert_int_equal(rcs[9], ATAP_ECANCELLED);
    /* a handle with no task */
    atap_task keep = ts[5];
    ts[5] = ATAP_NO_TASK;
    assert_int_equal(atap_join_all(ts, 8, out, 8, rcs), ATAP_EFAILED);
    assert_int_equal(rcs[5], ATAP_ENOTASK);
    ts[5] = keep;
    for (int i = 0; i < N; i++)
        atap_release(ts[i]);
    waited_to_live_back();
}

/* ======================================================================== */
/* Resources                                                                 */
/* ======================================================================== */

/* 50,000 gives to one task, then a cancel: every value is freed once, and
 * the task goes. */
static void test_dataflow_many_gives_then_cancel(void **state)
{
    (void)state;
    reset_counts();
    enum { N = 50000 };
    probe *p = probe_new(sizeof(boxed), 1, 0);
    atap_task t = spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free});
    int refused = 0;
    for (int i = 0; i < N; i++) {
        int rc = give_box(t, (uint64_t)i + 1);
        if (rc != 0) {
            refused++;
            if (refused < 5)
                print_error("give %d: %s\n", i, atap_strerror(rc));
        }
    }
    assert_int_equal(refused, 0);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(give_box(t, 0), ATAP_ECANCELLED);
    atap_release(t);
    waited_to_live_back();
    assert_true(wait_atomic_at_least(&g_in_frees, N + 1, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, N + 1);
    /* No run need have happened: gives before the first run starts only
     * replace its value, and the cancel may drop it while queued. */
    assert_int_equal(atomic_load(&p->bad_size), 0);
    assert_no_failures();
}

/* 10,000 receivers over one source, released before and after it
 * publishes: every slot comes back. */
static void test_dataflow_many_receivers_one_source(void **state)
{
    (void)state;
    enum { N = 10000 };
    atap_task *r = calloc(N, sizeof *r);
    assert_non_null(r);
    summer *s = summer_new(1);
    for (int round = 0; round < 2; round++) {
        gate *g = gate_new(5);
        atap_task src = spawn8(task_gated, g);
        for (int i = 0; i < N; i++)
            assert_int_equal(
                atap_receive_all(&r[i], sum_run, s, &src, 1, &(atap_spawn_opts){.out_size = 8}), 0);
        if (round == 0) {
            /* released while the source has not published */
            for (int i = 0; i < N; i++)
                atap_release(r[i]);
            atomic_store(&g->open, 1);
            assert_true(join8(src) == 5);
        } else {
            atomic_store(&g->open, 1);
            assert_true(join8(src) == 5);
            for (int i = 0; i < N; i++) {
                uint64_t v = 0;
                int rc = atap_join_for(r[i], &v, 8, ATAP_SEC(10));
                if (rc != 0 || v != 5)
                    fail_msg("receiver %d: rc %d (%s), value %llu", i, rc, atap_strerror(rc),
                             (unsigned long long)v);
            }
            for (int i = 0; i < N; i++)
                atap_release(r[i]);
        }
        atap_release(src);
        if (!wait_live_back(ATAP_SEC(10)))
            fail_msg("round %d: %zu tasks live, %zu at the start", round, pool_stats().live,
                     g_live_base);
    }
    assert_true(atomic_load(&s->runs) <= 2 * N);
    assert_true(atomic_load(&s->runs) >= N); /* the second round's all ran */
    assert_int_equal(atomic_load(&s->bad_size), 0);
    free(r);
}

/* ======================================================================== */
/* Races                                                                     */
/* ======================================================================== */

#define GIVERS 8
typedef struct giver_arg {
    test_barrier *barrier;
    atap_task task;
    size_t gives;
    atomic_int *ok, *finished;
} giver_arg;

static void *giver_thread(void *pa)
{
    giver_arg *a = pa;
    barrier_wait(a->barrier);
    for (size_t i = 0; i < a->gives; i++) {
        int rc = give_box(a->task, i + 1);
        if (rc == 0)
            atomic_fetch_add(a->ok, 1);
        else if (rc == ATAP_EFINISHED)
            atomic_fetch_add(a->finished, 1);
        else
            CHECK(!"a give returned neither 0 nor ATAP_EFINISHED");
    }
    return NULL;
}

/* Gives from 8 threads into one task, without and with a gives limit. */
static void test_dataflow_race_gives_from_threads(void **state)
{
    (void)state;
    size_t per = scaled(200, 50);
    for (int limited = 0; limited < 2; limited++) {
        reset_counts();
        static atomic_int ok, finished;
        atomic_store(&ok, 0);
        atomic_store(&finished, 0);
        probe *p = probe_new(sizeof(boxed), 1, 0);
        atap_task t =
            spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free, .gives = limited ? 20 : 0});
        test_barrier barrier;
        barrier_init(&barrier, GIVERS);
        giver_arg args[GIVERS];
        pthread_t th[GIVERS];
        for (int i = 0; i < GIVERS; i++) {
            args[i] =
                (giver_arg){.barrier = &barrier, .gives = per, .ok = &ok, .finished = &finished};
            assert_int_equal(atap_dup(t, &args[i].task), 0);
            assert_int_equal(pthread_create(&th[i], NULL, giver_thread, &args[i]), 0);
        }
        for (int i = 0; i < GIVERS; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            atap_release(args[i].task);
        }
        assert_no_failures();
        int total = (int)(per * GIVERS);
        assert_int_equal(atomic_load(&ok) + atomic_load(&finished), total);
        if (!limited)
            assert_int_equal(atomic_load(&ok), total);
        else
            assert_true(atomic_load(&ok) >= 20);
        /* the last give that was taken runs: wait for it */
        assert_true(wait_atomic_at_least(&p->done, 1, ATAP_SEC(10)));
        if (atomic_load(&finished) > 0)
            assert_true(wait_finished(t, ATAP_SEC(10)));
        else
            assert_int_equal(atap_join_for(t, &(uint64_t){0}, 8, ATAP_SEC(10)), 0);
        int runs = atomic_load(&p->runs);
        assert_true(runs >= 1 && runs <= atomic_load(&ok)); /* a run per taken give at most */
        atap_release(t);
        waited_to_live_back();
        assert_true(wait_atomic_at_least(&g_in_frees, total, ATAP_SEC(10)));
        SETTLE_EXACT(&g_in_frees, total);
        assert_int_equal(atomic_load(&p->bad_size), 0);
        assert_no_failures();
    }
}

typedef struct cancel_race {
    test_barrier barrier;
    atomic_uint_fast64_t task;
    atomic_int rc;
    atomic_int stop;
    size_t rounds;
} cancel_race;

static void *race_giver(void *pa)
{
    cancel_race *c = pa;
    for (size_t i = 0; i < c->rounds; i++) {
        barrier_wait(&c->barrier);
        atap_task t = {atomic_load(&c->task)};
        if (i % 2 == 0) /* odd rounds: the cancel waits instead */
            for (unsigned k = 0; k < (unsigned)(i % 5) * 20u; k++)
                sched_yield();
        atomic_store(&c->rc, give_box(t, i + 1));
        barrier_wait(&c->barrier);
    }
    return NULL;
}

/* A cancel racing a give: the give is taken or refused as cancelled, and
 * in_free sees every value once. */
static void test_dataflow_race_cancel_and_give(void **state)
{
    (void)state;
    reset_counts();
    static cancel_race c;
    c.rounds = scaled(200, 50);
    barrier_init(&c.barrier, 2);
    atomic_store(&c.rc, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, race_giver, &c), 0);
    int taken = 0;
    for (size_t i = 0; i < c.rounds; i++) {
        probe *p = probe_new(sizeof(boxed), 1, 0);
        atap_task t = spawn_probe(p, (atap_spawn_opts){.in_free = boxed_free});
        atomic_store(&c.task, t.id);
        barrier_wait(&c.barrier);
        if (i % 2 == 1)
            for (unsigned k = 0; k < (unsigned)(i % 5) * 20u; k++)
                sched_yield();
        assert_int_equal(atap_cancel(t), 0);
        barrier_wait(&c.barrier);
        int rc = atomic_load(&c.rc);
        if (rc != 0 && rc != ATAP_ECANCELLED)
            fail_msg("round %zu: the give returned %d (%s)", i, rc, atap_strerror(rc));
        taken += rc == 0;
        assert_int_equal(give_box(t, 0), ATAP_ECANCELLED);
        atap_state st;
        assert_int_equal(atap_wait(t, &st), 0);
        assert_true(st == ATAP_CANCELLED || st == ATAP_READY);
        atap_release(t);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    print_message("cancel vs give: %d of %zu gives taken\n", taken, c.rounds);
    waited_to_live_back();
    int want = (int)(2 * c.rounds);
    assert_true(wait_atomic_at_least(&g_in_frees, want, ATAP_SEC(10)));
    SETTLE_EXACT(&g_in_frees, want);
    assert_no_failures();
}

/* A forward set up while its source publishes hands the value over exactly
 * once. */
static int count_input_run(atap_ctx *ctx, void *arg, void *out)
{
    size_t size = 0;
    const void *in = atap_input(ctx, &size);
    CHECK(in != NULL && size == 8);
    if (in != NULL && size == 8)
        memcpy(out, in, 8);
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

static void test_dataflow_race_forward_while_publishing(void **state)
{
    (void)state;
    size_t rounds = scaled(200, 50);
    atomic_int *runs = calloc(rounds, sizeof *runs);
    atap_task *src = calloc(rounds, sizeof *src), *dst = calloc(rounds, sizeof *dst);
    assert_non_null(runs);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < rounds; i++) {
        atomic_init(&runs[i], 0);
        assert_int_equal(atap_spawn_waiting(&dst[i], count_input_run, &runs[i], 8,
                                            &(atap_spawn_opts){.out_size = 8}),
                         0);
        src[i] = spawn8(task_value, (void *)(uintptr_t)(i + 1));
        int rc = atap_forward(src[i], dst[i]);
        if (rc != 0)
            fail_msg("round %zu: forward returned %d (%s)", i, rc, atap_strerror(rc));
    }
    for (size_t i = 0; i < rounds; i++) {
        if (!wait_atomic_at_least(&runs[i], 1, ATAP_SEC(10)))
            fail_msg("round %zu: the target never ran", i);
        JOIN_UNTIL(dst[i], i + 1);
    }
    sleep_us(50000);
    for (size_t i = 0; i < rounds; i++)
        if (atomic_load(&runs[i]) != 1)
            fail_msg("round %zu: the target ran %d times", i, atomic_load(&runs[i]));
    for (size_t i = 0; i < rounds; i++) {
        atap_release(src[i]);
        atap_release(dst[i]);
    }
    waited_to_live_back();
    assert_no_failures();
    free(runs);
    free(src);
    free(dst);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_dataflow_give_runs_the_task),
        T(test_dataflow_zero_size_input_and_spawn_checks),
        T(test_dataflow_gives_limit),
        T(test_dataflow_give_during_run_owes_one_run),
        T(test_dataflow_join_after_give_reads_its_run),
        T(test_dataflow_gives_before_the_run_starts_coalesce),
        T(test_dataflow_give_after_end),
        T(test_dataflow_give_after_shutdown),
        T(test_dataflow_let_go_when_no_giver_is_left),
        T(test_dataflow_let_go_last_handles_together),
        T(test_dataflow_at_rate_restart_lets_go_of_kept_output),
        T(test_dataflow_let_go_forward_keeps_target),
        T(test_dataflow_fed_task_handle_goes_with_last_release),
        T(test_dataflow_let_go_never_given_fails),
        T(test_dataflow_repeat_series_per_give),
        T(test_dataflow_repeat_gives_limit),
        T(test_dataflow_at_rate_series_per_give),
        T(test_dataflow_after_each_give),
        T(test_dataflow_receive_all_sums),
        T(test_dataflow_receive_all_nested),
        T(test_dataflow_receive_all_waits_for_all_again),
        T(test_dataflow_receive_all_member_fails),
        T(test_dataflow_receive_all_no_memory_next_delivery_retries),
        T(test_dataflow_receive_all_no_memory_member_closes),
        T(test_dataflow_receive_all_round_buffer_off_the_gate_lock),
        T(test_dataflow_kicks_without_memory_after_the_locks),
        T(test_dataflow_displaced_value_freed_after_the_locks),
        T(test_dataflow_waiting_task_stopped_mid_run_closes),
        T(test_dataflow_at_rate_forwards_every_run),
        T(test_dataflow_long_forward_chain_lets_go),
        T(test_dataflow_at_rate_let_go_keeps_run_under_way),
        T(test_dataflow_receive_any),
        T(test_dataflow_receiver_bad_arguments),
        T(test_dataflow_forward_repeat_source),
        T(test_dataflow_forward_many_to_one_and_chain),
        T(test_dataflow_forward_ready_output_and_bad_arguments),
        T(test_dataflow_forward_into_spent_target),
        T(test_dataflow_join_first_pass_back),
        T(test_dataflow_join_first_cancel_policy),
        T(test_dataflow_join_first_release_policy),
        T(test_dataflow_join_first_settled_wins_at_once),
        T(test_dataflow_join_first_hears_after_let_go),
        T(test_dataflow_join_first_timeout_and_bad_arguments),
        T(test_dataflow_join_first_on_itself_einval),
        T(test_dataflow_join_first_settles_during_setup),
        T(test_dataflow_join_first_threads),
        T(test_dataflow_join_all),
        T(test_dataflow_many_gives_then_cancel),
        T(test_dataflow_many_receivers_one_source),
        T(test_dataflow_race_gives_from_threads),
        T(test_dataflow_race_cancel_and_give),
        T(test_dataflow_race_forward_while_publishing),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

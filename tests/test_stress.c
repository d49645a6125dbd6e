/*
 * Stress: every kind of work at once, from several outside threads, while
 * the manager is killed now and then (the port of the crate's stress.rs,
 * whose "whole job is to be unfair"). Every result is checked exactly: no
 * crossed outputs, nothing early (delays, parks, sleeps, gaps), nothing
 * stalls (every join is a _for with a generous limit, and a stall names the
 * kind of work). Then the runtime goes idle, trims, takes a burst, shuts
 * down and starts again.
 *
 * ATAP_STRESS_SECS (default 4, fractions allowed) sets how long the drivers
 * run; ATAP_STRESS_SEED (default below) seeds their generators. The seed
 * decides each driver's sequence of kinds and parameters, not how the
 * threads interleave.
 *
 * Manager faults: a burst is two faults 300 ms apart. The supervisor gives
 * up past 5 consecutive failures of managers that lived under 5 s, so the
 * first two bursts (at 0.8 s and 2.5 s, or earlier for a short run) make 4
 * in a row at most, and any later burst comes 6.3 s after the one before
 * (the manager between them has lived over 5 s, which resets the count).
 *
 * Thread deaths: besides the manager, a worker now and then (and a blocking
 * thread once) is made to die (atap_inject_thread_deaths), at one of the
 * pool's checks: idle, just before running a task, or part way through
 * helping inside a join. A task its thread dies holding reads ATAP_EFAILED
 * (atap.h), and so does every task that thread was inside. So while deaths
 * are injected (g_deaths_on), a driver accepts ATAP_EFAILED where a task
 * could have been on a dying thread, and only if the pool's death count
 * moved during that step (died()); then it skips the checks that needed
 * the run, counts it, and still releases everything. Any other wrong
 * result fails as before. A dying thread's frames release nothing (C has
 * no destructors), so the one kind whose tasks hold handles across a join
 * (fib) releases its children from a pthread cleanup handler, which the
 * pthread_exit the pool's death takes does run.
 *
 * Calls with no timed variant (atap_join_all, atap_block) run under a
 * watchdog: one stuck over 10 s is reported as STALLED with its kind, and
 * the program exits (it could never return).
 *
 * What a task touches lives in its arg: a value, or a heap item freed by
 * arg_free once the task is gone (so a run that is still finishing after a
 * cancel or a timeout settled its handle never touches freed memory). Every
 * field a task and a driver share is an atomic.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/resource.h>
#include <unistd.h>

#include "manager.h" /* atap__manager_restarts: restarts are seen, not guessed */
#include "table.h"   /* the live slots' states, when some are left over */
#include "test_util.h"

typedef _Atomic uint64_t atomic_u64;

/* ---- settings ------------------------------------------------------------ */

#define N_DRIVERS 4
#define STALL_NS ATAP_SEC(10) /* every join's limit */
#define DEFAULT_SEED 0x5EED0A7A9ull
#define DEFAULT_SECS 4.0

static uint64_t g_seed;
static uint64_t g_run_ns;

static void read_settings(void)
{
    const char *s = getenv("ATAP_STRESS_SECS");
    double secs = DEFAULT_SECS;
    if (s != NULL && *s != '\0') {
        double v = strtod(s, NULL);
        if (v > 0)
            secs = v;
    }
    g_run_ns = (uint64_t)(secs * 1e9);
    g_seed = DEFAULT_SEED;
    s = getenv("ATAP_STRESS_SEED");
    if (s != NULL && *s != '\0')
        g_seed = strtoull(s, NULL, 0);
}

/* ---- a small generator per thread (xorshift64*) ------------------------- */

static uint64_t mix64(uint64_t x) /* splitmix64's finaliser */
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi)
{
    return lo + rng_next(s) % (hi - lo + 1);
}

/* ---- the kinds of work --------------------------------------------------- */

enum kind {
    K_PLAIN,      /* spawn, output 8..64 bytes from a tag; join/take/dup */
    K_AFTER,      /* a start delay: never early */
    K_REPEAT,     /* ATAP_REPEAT, 3 runs 1 ms apart */
    K_TIMEOUT,    /* a run past its timeout reads ATAP_ETIMEDOUT */
    K_CANCEL,     /* a long sleep cancelled reads ATAP_ECANCELLED */
    K_PARK_UNTIL, /* parks until a deadline: never early */
    K_PARK_FD,    /* parks on a fresh pipe, with or without a timeout */
    K_SLEEP_TASK, /* atap_spawn_sleep: never short */
    K_FIB,        /* nested fork-join inside tasks */
    K_GIVE,       /* atap_spawn_waiting + atap_give */
    K_CHAN,       /* a channel: every value received exactly once */
    K_FORWARD,    /* atap_forward from a one-shot or a short repeat */
    K_RECV_ALL,   /* atap_receive_all: the members' outputs in set order */
    K_RECV_ANY,   /* atap_receive_any: each output one run (sequenced) */
    K_JOIN_FIRST, /* atap_join_first with each policy */
    K_JOIN_ALL,   /* atap_join_all */
    K_AT_RATE,    /* ATAP_AT_RATE, 3-4 runs 1-2 ms apart */
    K_BLOCK,      /* atap_block on the driver thread, with parks */
    K_PRIO,       /* a batch at random priorities, some blocking */
    K_COUNT
};

static const char *const kind_name[K_COUNT] = {
    "plain",      "after",    "repeat",  "timeout", "cancel",   "park_until",  "park_fd",
    "sleep_task", "fib",      "give",    "channel", "forward",  "receive_all", "receive_any",
    "join_first", "join_all", "at_rate", "block",   "priority",
};

typedef struct driver {
    int id;
    uint64_t rng;
    uint64_t deadline;
    uint64_t step;
    enum kind kind; /* the step's kind, for failure messages */
    unsigned long done[K_COUNT];
    /* what the run saw, printed at the end */
    unsigned long dup_reads, takes, late_sleeps, cancel_caught_sleeping;
    unsigned long fd_ready, fd_deadline, fd_spurious, chan_sent_direct, chan_sent_task;
    /* thread deaths: the pool's count when the step began; whether the step
     * read ATAP_EFAILED from one; steps so, per kind */
    uint64_t deaths0;
    bool step_died;
    unsigned long died[K_COUNT];
    int elem_frees_slack; /* channel values a death may have left to elem_free */
    /* the new kinds */
    unsigned long fwd_outputs, fwd_runs, rall_bytes, rany_seq_outputs, rany_burst_outputs,
        rany_burst_runs, jf_policy[3], jf_losers_cancelled, jf_losers_ready, jf_losers_seen,
        jall_direct, jall_prewaited, rate_runs, block_variant[4], prio_tasks;
    /* the watchdog's view of a call with no timeout (0: none under way) */
    atomic_u64 wd_since;
    atomic_int wd_kind;
    atomic_u64 wd_step;
    atomic_int now_kind; /* the step's kind, for the reaper's aim */
    pthread_t th;
} driver;

/* Set while thread deaths are being injected (the first test only). */
static atomic_int g_deaths_on;
/* fib frames a dying thread unwound through, releasing their children. */
static atomic_int g_fib_unwound;

/* Per driver, cumulative: in_free calls of given values, and elem_free calls
 * of channel values (the values name their driver). */
static atomic_int g_in_frees[N_DRIVERS];
static atomic_int g_elem_frees[N_DRIVERS];

/* ---- failures from driver threads --------------------------------------- */

static atomic_int g_printed;

/* Records a failure (through test_util's record_failure, as CHECK does),
 * naming the kind, the driver, the step and the seed. Any thread. */
__attribute__((format(printf, 4, 5))) static void drv_fail(const driver *d, const char *file,
                                                           int line, const char *fmt, ...)
{
    char what[256], msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "kind %s (driver %d, step %" PRIu64 ", seed %" PRIu64 "): %s",
             kind_name[d->kind], d->id, d->step, g_seed, what);
    record_failure(file, line, msg);
    if (atomic_fetch_add(&g_printed, 1) < 20)
        fprintf(stderr, "[stress] %s:%d: %s\n", file, line, msg);
}

/* CHECK() that names the kind of work. */
#define DCHECK(d, cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            drv_fail((d), __FILE__, __LINE__, "CHECK(%s) failed", #cond);                          \
    } while (0)

/* A call that must return `want`: names the code it read. A stall (a join
 * running out of its 10 s) reads ATAP_ENOTREADY and says so. */
#define DEXPECT(d, call, want)                                                                     \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != (want))                                                                         \
            drv_fail((d), __FILE__, __LINE__, "%s returned %d (%s), wanted %d (%s)%s", #call, rc_, \
                     atap_strerror(rc_), (int)(want), atap_strerror(want),                         \
                     rc_ == ATAP_ENOTREADY ? ": STALLED" : "");                                    \
    } while (0)

/* Polls cond for up to STALL_NS and stores whether it held in ok (a bool);
 * a failure named `what` if it never did. */
#define DWAIT(d, ok, cond, what)                                                                   \
    do {                                                                                           \
        uint64_t end_ = now_ns() + STALL_NS;                                                       \
        while (!((ok) = (cond)) && now_ns() < end_)                                                \
            sleep_us(200);                                                                         \
        if (!(ok))                                                                                 \
            drv_fail((d), __FILE__, __LINE__, "STALLED: %s never came within 10 s", (what));       \
    } while (0)

/* ---- thread deaths -------------------------------------------------------- */

static uint64_t pool_deaths(void) { return pool_stats().deaths; }

/*
 * True when rc is ATAP_EFAILED that a thread death explains: deaths are
 * being injected, and the pool counted one since this step began (a death
 * is counted once its replacement is live, a moment after its tasks read
 * ATAP_EFAILED: waited for, up to 5 s). The step then counts as hit.
 */
static bool died(driver *d, int rc)
{
    if (rc != ATAP_EFAILED || !atomic_load(&g_deaths_on))
        return false;
    uint64_t end = now_ns() + ATAP_SEC(5);
    while (pool_deaths() <= d->deaths0) {
        if (now_ns() > end)
            return false;
        sleep_us(200);
    }
    d->step_died = true;
    return true;
}

/* rc must be `want`; ATAP_EFAILED that died() explains returns true (the
 * caller skips what needed the run); anything else is a failure named as
 * DEXPECT names it, and returns false. */
static bool expect_or_died(driver *d, const char *file, int line, const char *call, int rc,
                           int want)
{
    if (rc == want)
        return false;
    if (died(d, rc))
        return true;
    drv_fail(d, file, line, "%s returned %d (%s), wanted %d (%s)%s", call, rc, atap_strerror(rc),
             want, atap_strerror(want), rc == ATAP_ENOTREADY ? ": STALLED" : "");
    return false;
}

#define DEXPECT_D(d, call, want) expect_or_died((d), __FILE__, __LINE__, #call, (call), (want))

/* A call with no timed variant: the watchdog reports it if it takes over
 * STALL_NS. */
static void unbounded_enter(driver *d)
{
    atomic_store(&d->wd_kind, (int)d->kind);
    atomic_store(&d->wd_step, d->step);
    atomic_store(&d->wd_since, now_ns());
}

static void unbounded_leave(driver *d) { atomic_store(&d->wd_since, 0); }

/* ---- K_PLAIN: an output of 8..64 bytes computed from a tag --------------- */

static size_t tag_len(uint64_t tag) { return 8 + (size_t)(mix64(tag) % 57); }

static void tag_fill(unsigned char *out, size_t len, uint64_t tag)
{
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(mix64(tag + i / 8) >> (8 * (i % 8)));
}

static int task_pattern(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t tag = (uint64_t)(uintptr_t)arg;
    tag_fill(out, tag_len(tag), tag);
    return 0;
}

/* got holds tag's len-byte pattern (len <= 64). */
static bool tag_matches(const unsigned char *got, size_t len, uint64_t tag)
{
    unsigned char want[64];
    tag_fill(want, len, tag);
    return memcmp(got, want, len) == 0;
}

static bool pattern_ok(const unsigned char *got, uint64_t tag)
{
    return tag_matches(got, tag_len(tag), tag);
}

static void do_plain(driver *d, uint64_t tag)
{
    size_t len = tag_len(tag);
    atap_spawn_opts o = {.out_size = len,
                         .priority = (int)rng_range(&d->rng, 0, 255) - 128,
                         .blocking = rng_range(&d->rng, 0, 7) == 0};
    atap_task t, c = ATAP_NO_TASK;
    unsigned char a[64], b[64];
    int mode = (int)rng_range(&d->rng, 0, 3);

    if (atap_spawn(&t, task_pattern, (void *)(uintptr_t)tag, &o) != 0) {
        DCHECK(d, !"spawn");
        return;
    }
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    switch (mode) {
    case 0: /* join twice: the output stays */
        if (DEXPECT_D(d, atap_join_for(t, a, len, STALL_NS), 0))
            break;
        DEXPECT(d, atap_try_join(t, b, len), 0);
        DCHECK(d, pattern_ok(a, tag));
        DCHECK(d, pattern_ok(b, tag));
        break;
    case 1: /* take: moved out, later readers read ATAP_ETAKEN */
        if (DEXPECT_D(d, atap_take_for(t, a, len, STALL_NS), 0))
            break;
        DCHECK(d, pattern_ok(a, tag));
        DEXPECT(d, atap_join_for(t, b, len, STALL_NS), ATAP_ETAKEN);
        d->takes++;
        break;
    case 2: /* a dup: both read the same bytes */
        DEXPECT(d, atap_dup(t, &c), 0);
        if (DEXPECT_D(d, atap_join_for(c, b, len, STALL_NS), 0))
            break;
        DEXPECT(d, atap_join_for(t, a, len, STALL_NS), 0);
        DCHECK(d, pattern_ok(a, tag));
        DCHECK(d, pattern_ok(b, tag));
        d->dup_reads++;
        break;
    default: /* a dup takes; the original then reads ATAP_ETAKEN */
        DEXPECT(d, atap_dup(t, &c), 0);
        if (DEXPECT_D(d, atap_take_for(c, b, len, STALL_NS), 0))
            break;
        DCHECK(d, pattern_ok(b, tag));
        DEXPECT(d, atap_join_for(t, a, len, STALL_NS), ATAP_ETAKEN);
        d->dup_reads++;
        d->takes++;
        break;
    }
    atap_release(c);
    atap_release(t);
}

/* ---- K_AFTER: the run starts no earlier than spawn + after --------------- */

static int task_start_time(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v[2] = {(uint64_t)(uintptr_t)arg, atap_now()};
    memcpy(out, v, sizeof v);
    return 0;
}

static void do_after(driver *d, uint64_t tag)
{
    uint64_t after = rng_range(&d->rng, ATAP_US(200), ATAP_MS(5));
    atap_spawn_opts o = {
        .out_size = 16, .after_ns = after, .priority = (int)rng_range(&d->rng, 0, 255) - 128};
    uint64_t v[2] = {0, 0};
    atap_task t;
    uint64_t t0 = atap_now();

    if (atap_spawn(&t, task_start_time, (void *)(uintptr_t)tag, &o) != 0) {
        DCHECK(d, !"spawn");
        return;
    }
    if (!DEXPECT_D(d, atap_join_for(t, v, sizeof v, STALL_NS), 0)) {
        DCHECK(d, v[0] == (uint64_t)(uintptr_t)tag);
        if (v[1] < t0 + after)
            drv_fail(d, __FILE__, __LINE__, "started %" PRIu64 " ns early (after %" PRIu64 " ns)",
                     t0 + after - v[1], after);
    }
    atap_release(t);
}

/* ---- K_REPEAT: 3 runs, every 1 ms, never closer ------------------------- */

#define REPEAT_RUNS 3

typedef struct repeat_item {
    atomic_int runs;
    atomic_u64 start[REPEAT_RUNS + 1], end[REPEAT_RUNS + 1];
} repeat_item;

static int task_repeat(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    repeat_item *r = arg;
    int i = atomic_fetch_add(&r->runs, 1);
    if (i <= REPEAT_RUNS)
        atomic_store(&r->start[i], atap_now());
    uint64_t v = (uint64_t)i + 1;
    memcpy(out, &v, sizeof v);
    if (i <= REPEAT_RUNS)
        atomic_store(&r->end[i], atap_now());
    return 0;
}

static void do_repeat(driver *d)
{
    repeat_item *r = calloc(1, sizeof *r);
    atap_spawn_opts o = {.out_size = 8,
                         .kind = ATAP_REPEAT,
                         .runs = REPEAT_RUNS,
                         .every_ns = ATAP_MS(1),
                         .arg_free = free};
    atap_task t;
    uint64_t v = 0;

    if (r == NULL || atap_spawn(&t, task_repeat, r, &o) != 0) {
        DCHECK(d, !"spawn");
        free(r);
        return;
    }
    bool ok;
    DWAIT(d, ok, atap_finished(t), "atap_finished of the repeat");
    if (ok && !DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0)) {
        DCHECK(d, v == REPEAT_RUNS);
        DCHECK(d, atomic_load(&r->runs) == REPEAT_RUNS);
        for (int i = 0; i + 1 < REPEAT_RUNS; i++) {
            uint64_t e = atomic_load(&r->end[i]), s = atomic_load(&r->start[i + 1]);
            if (s < e + ATAP_MS(1))
                drv_fail(d, __FILE__, __LINE__,
                         "run %d started %" PRIu64 " ns after run %d ended (gap 1 ms)", i + 2,
                         s - e, i + 1);
        }
    }
    atap_release(t);
}

/* ---- K_TIMEOUT: a run past its timeout reads ATAP_ETIMEDOUT -------------- */

typedef struct timeout_item {
    atomic_int started;
    atomic_int rc;
    atomic_int done;
    atomic_int late; /* 50 ms sleeps that ended before the timeout fired */
    atomic_u64 end;
} timeout_item;

static int task_sleeps_past_timeout(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    timeout_item *it = arg;
    int rc = 0;
    atomic_store(&it->started, 1);
    /* One 50 ms sleep is the point; more only if the timeout comes that
     * late (a manager restart spanning it), so the run never ends first. */
    for (int i = 0; i < 200 && rc == 0; i++) {
        rc = atap_sleep(ATAP_MS(50));
        if (rc == 0)
            atomic_fetch_add(&it->late, 1);
    }
    atomic_store(&it->end, atap_now());
    atomic_store(&it->rc, rc);
    atomic_store(&it->done, 1);
    memset(out, 0xAB, 8); /* to be dropped */
    return 0;
}

static void do_timeout(driver *d)
{
    timeout_item *it = calloc(1, sizeof *it);
    uint64_t limit = rng_range(&d->rng, ATAP_MS(2), ATAP_MS(5));
    atap_spawn_opts o = {.out_size = 8, .timeout_ns = limit, .arg_free = free};
    atap_task t;
    uint64_t v = 0;

    uint64_t t0 = atap_now(); /* the run starts later, and its limit counts from there */
    if (it == NULL || atap_spawn(&t, task_sleeps_past_timeout, it, &o) != 0) {
        DCHECK(d, !"spawn");
        free(it);
        return;
    }
    if (DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), ATAP_ETIMEDOUT)) {
        atap_release(t);
        return;
    }
    uint64_t joined = atap_now();
    if (joined < t0 + limit)
        drv_fail(d, __FILE__, __LINE__,
                 "read ATAP_ETIMEDOUT %" PRIu64 " ns before a %" PRIu64 " us limit could pass",
                 t0 + limit - joined, limit / 1000u);
    DCHECK(d, atap_state_of(t) == ATAP_TIMED_OUT);
    DCHECK(d, atap_finished(t));
    /* A thread that died holding the run before its function began (its
     * limit passed first) never runs it: then `started` stays 0 and a death
     * was counted. */
    bool ok, lost = false;
    DWAIT(d, ok,
          atomic_load(&it->done) != 0 ||
              (lost = atomic_load(&g_deaths_on) && atomic_load(&it->started) == 0 &&
                      atap_now() > joined + ATAP_MS(500) && pool_deaths() > d->deaths0),
          "the end of the timed-out run's sleep");
    if (lost)
        d->step_died = true;
    if (ok && !lost) {
        int rc = atomic_load(&it->rc);
        uint64_t end = atomic_load(&it->end);
        if (rc != ATAP_ETIMEDOUT)
            drv_fail(d, __FILE__, __LINE__, "atap_sleep in the run read %d (%s)", rc,
                     atap_strerror(rc));
        if (end < t0 + limit)
            drv_fail(d, __FILE__, __LINE__,
                     "the sleep was interrupted %" PRIu64 " ns before the limit could pass",
                     t0 + limit - end);
        d->late_sleeps += (unsigned long)atomic_load(&it->late);
    }
    atap_release(t);
}

/* ---- K_CANCEL: a 10 s sleep cancelled after 0..2 ms ---------------------- */

typedef struct cancel_item {
    atomic_int state; /* 0 not started, 1 sleeping, 2 done */
    atomic_int rc;
    atomic_u64 end;
} cancel_item;

static int task_long_sleep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    cancel_item *it = arg;
    atomic_store(&it->state, 1);
    int rc = atap_sleep(ATAP_SEC(10));
    atomic_store(&it->end, atap_now());
    atomic_store(&it->rc, rc);
    atomic_store(&it->state, 2);
    return 0;
}

static void do_cancel(driver *d)
{
    cancel_item *it = calloc(1, sizeof *it);
    atap_spawn_opts o = {.arg_free = free, .blocking = rng_range(&d->rng, 0, 3) == 0};
    atap_task t;

    if (it == NULL || atap_spawn(&t, task_long_sleep, it, &o) != 0) {
        DCHECK(d, !"spawn");
        free(it);
        return;
    }
    sleep_us((unsigned)rng_range(&d->rng, 0, 2000));
    uint64_t tc = atap_now();
    DEXPECT(d, atap_cancel(t), 0);
    if (DEXPECT_D(d, atap_join_for(t, NULL, 0, STALL_NS), ATAP_ECANCELLED)) {
        atap_release(t); /* it ended on a dying thread before the cancel */
        return;
    }
    uint64_t took = atap_now() - tc;
    if (took > ATAP_SEC(2))
        drv_fail(d, __FILE__, __LINE__,
                 "the join read ATAP_ECANCELLED %" PRIu64 " ms after the cancel", took / 1000000u);
    DCHECK(d, atap_state_of(t) == ATAP_CANCELLED);
    /* A run that was sleeping is interrupted at once. */
    bool ok;
    DWAIT(d, ok, atomic_load(&it->state) != 1, "the cancelled task's sleep to end");
    if (ok && atomic_load(&it->state) == 2) {
        int rc = atomic_load(&it->rc);
        uint64_t end = atomic_load(&it->end);
        if (rc != ATAP_ECANCELLED)
            drv_fail(d, __FILE__, __LINE__, "atap_sleep read %d (%s) after a cancel", rc,
                     atap_strerror(rc));
        if (end > tc && end - tc > ATAP_SEC(2))
            drv_fail(d, __FILE__, __LINE__, "the sleep ended %" PRIu64 " ms after the cancel",
                     (end - tc) / 1000000u);
        d->cancel_caught_sleeping++;
    }
    atap_release(t);
}

/* ---- K_PARK_UNTIL: resumed at or after the deadline ---------------------- */

typedef struct until_item {
    uint64_t delay;
    atomic_int runs;
    atomic_int reason;
    atomic_int events;
    atomic_u64 deadline;
    atomic_u64 resumed_at;
} until_item;

static int task_park_until(atap_ctx *ctx, void *arg, void *out)
{
    until_item *u = arg;
    int run = atomic_fetch_add(&u->runs, 1);

    if (!atap_resumed(ctx)) {
        CHECK(run == 0);
        uint64_t dl = atap_now() + u->delay;
        atomic_store(&u->deadline, dl);
        CHECK(atap_park_until(ctx, dl) == 0);
        return ATAP_PARKED;
    }
    atomic_store(&u->resumed_at, atap_now());
    atomic_store(&u->reason, atap_resume_reason(ctx));
    atomic_store(&u->events, (int)atap_resume_events(ctx));
    uint64_t v = (uint64_t)run;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void do_park_until(driver *d)
{
    until_item *u = calloc(1, sizeof *u);
    atap_spawn_opts o = {.out_size = 8, .arg_free = free};
    atap_task t;
    uint64_t v = 0;

    if (u == NULL) {
        DCHECK(d, !"calloc");
        return;
    }
    u->delay = rng_range(&d->rng, ATAP_US(500), ATAP_MS(5));
    if (atap_spawn(&t, task_park_until, u, &o) != 0) {
        DCHECK(d, !"spawn");
        free(u);
        return;
    }
    if (DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0)) {
        atap_release(t);
        return;
    }
    if (v == 1) {
        uint64_t dl = atomic_load(&u->deadline), at = atomic_load(&u->resumed_at);
        DCHECK(d, atomic_load(&u->runs) == 2);
        DCHECK(d, atomic_load(&u->reason) == ATAP_RESUME_DEADLINE);
        DCHECK(d, atomic_load(&u->events) == 0);
        if (at < dl)
            drv_fail(d, __FILE__, __LINE__, "resumed %" PRIu64 " ns before its deadline", dl - at);
    } else {
        drv_fail(d, __FILE__, __LINE__, "the resumed run was run %" PRIu64 " (wanted 1)", v);
    }
    atap_release(t);
}

/* ---- K_PARK_FD: a fresh pipe, a byte after 0..2 ms ----------------------- */

typedef struct fd_item {
    int fd;
    uint64_t timeout;
    atomic_int runs;
    atomic_int reason;
    atomic_int events;
    atomic_int got;      /* the byte was read */
    atomic_int spurious; /* READY, but the read said EAGAIN */
    atomic_int bad;      /* a park call failed */
    atomic_u64 parked_at;
    atomic_u64 resumed_at;
} fd_item;

static int task_park_fd(atap_ctx *ctx, void *arg, void *out)
{
    fd_item *f = arg;
    atomic_fetch_add(&f->runs, 1);

    if (atap_resumed(ctx)) {
        int reason = atap_resume_reason(ctx);
        atomic_store(&f->resumed_at, atap_now());
        atomic_store(&f->reason, reason);
        atomic_store(&f->events, (int)atap_resume_events(ctx));
        if (reason == ATAP_RESUME_READY) {
            char c;
            ssize_t n = read(f->fd, &c, 1);
            if (n == 1) {
                atomic_store(&f->got, 1);
                memset(out, 1, 8);
                return 0;
            }
            atomic_fetch_add(&f->spurious, 1); /* a hint: look again */
        } else {
            memset(out, 2, 8);
            return 0;
        }
    }
    atomic_store(&f->parked_at, atap_now());
    if (atap_park_fd(ctx, f->fd, ATAP_READABLE, f->timeout) != 0) {
        atomic_store(&f->bad, 1);
        return -1;
    }
    return ATAP_PARKED;
}

static bool open_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        return false;
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) != 0 ||
            fcntl(fds[i], F_SETFD, FD_CLOEXEC) != 0) {
            close(fds[0]);
            close(fds[1]);
            return false;
        }
    }
    return true;
}

static void do_park_fd(driver *d)
{
    int p[2];
    fd_item *f;
    atap_task t;
    uint64_t v = 0;

    if (!open_pipe(p)) {
        DCHECK(d, !"pipe");
        return;
    }
    if ((f = calloc(1, sizeof *f)) == NULL) {
        DCHECK(d, !"calloc");
        close(p[0]);
        close(p[1]);
        return;
    }
    f->fd = p[0];
    f->timeout =
        rng_range(&d->rng, 0, 1) ? ATAP_FOREVER : rng_range(&d->rng, ATAP_MS(1), ATAP_MS(5));
    if (atap_spawn(&t, task_park_fd, f, &(atap_spawn_opts){.out_size = 8, .arg_free = free}) != 0) {
        DCHECK(d, !"spawn");
        free(f);
        close(p[0]);
        close(p[1]);
        return;
    }
    sleep_us((unsigned)rng_range(&d->rng, 0, 2000));
    DCHECK(d, write(p[1], "x", 1) == 1);
    if (DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0)) {
        atap_release(t);
        close(p[0]); /* the task has settled: it parks on the pipe no more */
        close(p[1]);
        return;
    }
    int reason = atomic_load(&f->reason), events = atomic_load(&f->events);
    DCHECK(d, atomic_load(&f->bad) == 0);
    if (reason == ATAP_RESUME_READY) {
        DCHECK(d, (events & ATAP_READABLE) != 0);
        DCHECK(d, atomic_load(&f->got) == 1);
        d->fd_ready++;
    } else if (reason == ATAP_RESUME_DEADLINE && f->timeout != ATAP_FOREVER) {
        uint64_t at = atomic_load(&f->resumed_at), parked = atomic_load(&f->parked_at);
        DCHECK(d, events == 0);
        if (at < parked + f->timeout)
            drv_fail(d, __FILE__, __LINE__,
                     "a %" PRIu64 " us fd timeout resumed %" PRIu64 " ns early", f->timeout / 1000u,
                     parked + f->timeout - at);
        d->fd_deadline++;
    } else {
        drv_fail(d, __FILE__, __LINE__, "resumed with reason %d, events 0x%x (timeout %s)", reason,
                 (unsigned)events, f->timeout == ATAP_FOREVER ? "forever" : "given");
    }
    d->fd_spurious += (unsigned long)atomic_load(&f->spurious);
    atap_release(t);
    close(p[0]); /* only now: the task is joined */
    close(p[1]);
}

/* ---- K_SLEEP_TASK: never shorter than asked ------------------------------ */

static void do_sleep_task(driver *d)
{
    uint64_t ns = rng_range(&d->rng, ATAP_US(100), ATAP_MS(5)), slept = 0;
    bool precise = rng_range(&d->rng, 0, 1) != 0;
    atap_task t;
    uint64_t t0 = atap_now();

    if (atap_spawn_sleep(&t, ns, precise, NULL) != 0) {
        DCHECK(d, !"spawn_sleep");
        return;
    }
    if (DEXPECT_D(d, atap_join_for(t, &slept, sizeof slept, STALL_NS), 0)) {
        atap_release(t);
        return;
    }
    uint64_t el = atap_now() - t0;
    if (slept < ns)
        drv_fail(d, __FILE__, __LINE__, "slept %" PRIu64 " ns of %" PRIu64 " (%s)", slept, ns,
                 precise ? "precise" : "relaxed");
    if (el < ns)
        drv_fail(d, __FILE__, __LINE__, "joined %" PRIu64 " ns into a %" PRIu64 " ns sleep", el,
                 ns);
    atap_release(t);
}

/* ---- K_FIB: fork-join inside tasks -------------------------------------- */

static uint64_t fib_plain(unsigned n) { return n < 2 ? n : fib_plain(n - 1) + fib_plain(n - 2); }

/*
 * A fib frame holds its two children's handles across its joins. When its
 * thread dies part way through one (helping ran a task there that the
 * injected death caught), pthread_exit unwinds the frame: the cleanup
 * handler then releases what the frame still held, so no handle is left
 * behind. The handler runs after a longjmp back into fib_guarded (glibc's
 * C cleanup is setjmp-based), so what it reads lives in the caller's frame,
 * not fib_guarded's own (whose changed locals a longjmp leaves
 * indeterminate: gcc -O1 was seen to drop the handler's reads of a local
 * frame altogether), and fib_guarded is never inlined into its caller.
 */
typedef struct fib_frame {
    volatile uint64_t held[2];
} fib_frame;

static void fib_unwound(void *arg)
{
    fib_frame *f = arg;
    for (int i = 0; i < 2; i++) {
        uint64_t id = f->held[i];
        f->held[i] = 0;
        if (id != 0)
            atap_release((atap_task){id});
    }
    atomic_fetch_add(&g_fib_unwound, 1);
}

/* Joins child i and lets it go: 0 with its output; -1 when it read
 * ATAP_EFAILED while deaths are injected (this run then fails too, and the
 * driver checks a death explains it); anything else is a failure. */
static int fib_join(fib_frame *f, int i, uint64_t *v)
{
    atap_task t = {f->held[i]};
    int rc = atap_join_for(t, v, sizeof *v, STALL_NS);
    f->held[i] = 0;
    atap_release(t);
    if (rc == ATAP_EFAILED && atomic_load(&g_deaths_on))
        return -1;
    CHECK(rc == 0);
    return rc == 0 ? 0 : -1;
}

static int task_fib(atap_ctx *ctx, void *arg, void *out);

static int fib_body(unsigned n, fib_frame *f, uint64_t *r)
{
    atap_spawn_opts o = {.out_size = 8};
    atap_task a, b;
    uint64_t x = 0, y = 0;
    int ra = atap_spawn(&a, task_fib, (void *)(uintptr_t)(n - 1), &o);
    if (ra == 0)
        f->held[0] = a.id;
    int rb = atap_spawn(&b, task_fib, (void *)(uintptr_t)(n - 2), &o);
    if (rb == 0)
        f->held[1] = b.id;
    CHECK(ra == 0);
    CHECK(rb == 0);
    int ja = ra == 0 ? fib_join(f, 0, &x) : -1;
    int jb = rb == 0 ? fib_join(f, 1, &y) : -1;
    *r = x + y;
    return ja == 0 && jb == 0 ? 0 : -1;
}

__attribute__((noinline)) static int fib_guarded(unsigned n, fib_frame *f, uint64_t *r)
{
    volatile int rc = -1;
    pthread_cleanup_push(fib_unwound, f);
    rc = fib_body(n, f, r);
    pthread_cleanup_pop(0);
    return rc;
}

static int task_fib(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    unsigned n = (unsigned)(uintptr_t)arg;
    uint64_t r = n;
    fib_frame f = {{0, 0}};
    int rc = n >= 2 ? fib_guarded(n, &f, &r) : 0;
    memcpy(out, &r, sizeof r);
    return rc;
}

static void do_fib(driver *d)
{
    unsigned n = (unsigned)rng_range(&d->rng, 8, 12);
    atap_task t;
    uint64_t v = 0;

    if (atap_spawn(&t, task_fib, (void *)(uintptr_t)n, &(atap_spawn_opts){.out_size = 8}) != 0) {
        DCHECK(d, !"spawn");
        return;
    }
    if (!DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0) && v != fib_plain(n))
        drv_fail(d, __FILE__, __LINE__, "fib(%u) = %" PRIu64 ", wanted %" PRIu64, n, v,
                 fib_plain(n));
    atap_release(t);
}

/* ---- K_GIVE: values given to a waiting task ------------------------------ */

typedef struct give_val {
    uint64_t v;
    uint64_t driver;
} give_val;

static void give_in_free(void *in)
{
    give_val g;
    memcpy(&g, in, sizeof g);
    CHECK(g.driver < N_DRIVERS);
    if (g.driver < N_DRIVERS)
        atomic_fetch_add(&g_in_frees[g.driver], 1);
}

static uint64_t give_result(uint64_t tag, uint64_t v) { return mix64(tag ^ v); }

static int task_given(atap_ctx *ctx, void *arg, void *out)
{
    size_t size = 0;
    const give_val *in = atap_input(ctx, &size);
    uint64_t r = 0;

    CHECK(in != NULL && size == sizeof(give_val));
    if (in != NULL && size == sizeof(give_val)) {
        give_val g;
        memcpy(&g, in, sizeof g);
        r = give_result((uint64_t)(uintptr_t)arg, g.v);
    }
    memcpy(out, &r, sizeof r);
    return 0;
}

static void do_give(driver *d, uint64_t tag, int *in_frees_owed)
{
    unsigned k = (unsigned)rng_range(&d->rng, 2, 4);
    atap_spawn_opts o = {.out_size = 8, .gives = k, .in_free = give_in_free};
    atap_task t;
    uint64_t out = 0;
    bool dead = false;

    if (atap_spawn_waiting(&t, task_given, (void *)(uintptr_t)tag, sizeof(give_val), &o) != 0) {
        DCHECK(d, !"spawn_waiting");
        return;
    }
    DEXPECT(d, atap_try_join(t, &out, sizeof out), ATAP_ENOTREADY); /* nothing runs at spawn */
    for (unsigned i = 0; i < k; i++) {
        give_val g = {rng_next(&d->rng), (uint64_t)d->id};
        int rc = atap_give(t, &g, sizeof g);
        DEXPECT(d, rc, 0);
        if (rc == 0 || (rc != ATAP_EINVAL && rc != ATAP_ENOTASK && rc != -ENOMEM))
            (*in_frees_owed)++;
        if (rc != 0)
            break;
        out = 0;
        if (DEXPECT_D(d, atap_join_for(t, &out, sizeof out, STALL_NS), 0)) {
            dead = true; /* the run died with its thread: the task ended so */
            break;
        }
        if (out != give_result(tag, g.v))
            drv_fail(d, __FILE__, __LINE__,
                     "give %u of %u: the task made %" PRIx64 ", wanted %" PRIx64, i + 1, k, out,
                     give_result(tag, g.v));
    }
    bool ok;
    DWAIT(d, ok, atap_finished(t), "atap_finished after the last give");
    if (ok) {
        give_val g = {1, (uint64_t)d->id};
        /* refused either way; in_free still sees it */
        DEXPECT(d, atap_give(t, &g, sizeof g), dead ? ATAP_EFAILED : ATAP_EFINISHED);
        (*in_frees_owed)++;
    }
    atap_release(t);
}

/* ---- K_CHAN: n values, n + 1 receive tasks ------------------------------- */

#define CHAN_MAX 6

static void chan_elem_free(void *value)
{
    uint64_t v;
    memcpy(&v, value, sizeof v);
    uint64_t drv = v >> 56;
    CHECK(drv < N_DRIVERS);
    if (drv < N_DRIVERS)
        atomic_fetch_add(&g_elem_frees[drv], 1);
}

static void do_chan(driver *d, int *elem_frees_owed)
{
    size_t cap = rng_range(&d->rng, 0, 1) ? 0 : (size_t)rng_range(&d->rng, 1, 3);
    int n = (int)rng_range(&d->rng, 2, CHAN_MAX);
    atap_task recv[CHAN_MAX + 1], send[CHAN_MAX];
    int n_recv = 0, n_send = 0, dead = 0;
    uint64_t base = ((uint64_t)d->id << 56) | ((d->step & 0xFFFFFFFFFFull) << 8);
    atap_chan *ch = NULL;

    if (atap_chan_open(&ch, sizeof(uint64_t), cap, chan_elem_free) != 0) {
        DCHECK(d, !"chan_open");
        return;
    }
    for (int i = 0; i <= n; i++) {
        if (atap_chan_spawn_recv(&recv[n_recv], ch, NULL) == 0)
            n_recv++;
        else
            DCHECK(d, !"chan_spawn_recv");
    }
    for (int i = 0; i < n; i++) {
        uint64_t v = base | (uint64_t)i;
        int rc = rng_range(&d->rng, 0, 1) ? atap_chan_send(ch, &v) : ATAP_ENOTREADY;
        if (rc == 0) {
            d->chan_sent_direct++;
            continue;
        }
        DCHECK(d, rc == ATAP_ENOTREADY);
        if (atap_chan_spawn_send(&send[n_send], ch, &v, NULL) == 0) {
            n_send++;
            d->chan_sent_task++;
        } else {
            DCHECK(d, !"chan_spawn_send");
        }
    }
    atap_chan_close_sender(ch);   /* the receivers drain, then the last reads ATAP_ECLOSED */
    atap_chan_close_receiver(ch); /* the receive tasks are receivers while they live */
    /* A send task is a sender while it lives, so until its handle goes:
     * joined and released first, or the spare receiver would wait on. */
    for (int i = 0; i < n_send; i++) {
        if (DEXPECT_D(d, atap_join_for(send[i], NULL, 0, STALL_NS), 0))
            dead++; /* its value was never sent */
        atap_release(send[i]);
    }

    int seen[CHAN_MAX] = {0}, closed = 0;
    for (int i = 0; i < n_recv; i++) {
        uint64_t v = 0;
        bool take = rng_range(&d->rng, 0, 1) != 0;
        int rc = take ? atap_take_for(recv[i], &v, sizeof v, STALL_NS)
                      : atap_join_for(recv[i], &v, sizeof v, STALL_NS);
        if (rc == 0) {
            uint64_t idx = v & 0xFF;
            if ((v & ~(uint64_t)0xFF) != base || idx >= (uint64_t)n)
                drv_fail(d, __FILE__, __LINE__, "received %" PRIx64 ", not one of this step's", v);
            else
                seen[idx]++;
            if (!take)
                (*elem_frees_owed)++; /* joined, not taken: elem_free with the handle */
        } else if (rc == ATAP_ECLOSED) {
            closed++;
        } else if (died(d, rc)) {
            dead++; /* whatever it was handed, nobody receives */
        } else {
            drv_fail(d, __FILE__, __LINE__, "receive task %d read %d (%s)%s", i, rc,
                     atap_strerror(rc), rc == ATAP_ENOTREADY ? ": STALLED" : "");
        }
    }
    if (n_recv == n + 1 && dead == 0)
        DCHECK(d, closed == 1);
    int unseen = 0;
    for (int i = 0; i < n; i++) {
        if (seen[i] == 0 && dead > 0) {
            unseen++; /* lost with a dying thread's task: dropped, so maybe elem_free */
            continue;
        }
        if (seen[i] != 1)
            drv_fail(d, __FILE__, __LINE__, "value %d of %d received %d times (capacity %zu)", i, n,
                     seen[i], cap);
    }
    d->elem_frees_slack += unseen;
    for (int i = 0; i < n_recv; i++)
        atap_release(recv[i]);
}

/* ---- shared by the new kinds ---------------------------------------------- */

static int rand_priority(driver *d)
{
    switch (rng_range(&d->rng, 0, 7)) {
    case 0:
        return ATAP_PRIORITY_MIN;
    case 1:
        return ATAP_PRIORITY_MAX;
    default:
        return (int)rng_range(&d->rng, 0, 255) - 128;
    }
}

/* A random order of 0..n-1. */
static void shuffle(driver *d, size_t *order, size_t n)
{
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_range(&d->rng, 0, i - 1), x = order[i - 1];
        order[i - 1] = order[j];
        order[j] = x;
    }
}

/* ---- K_FORWARD: a one-shot, or a repeat of 2-3 runs, forwarded ------------ */

#define FWD_SEEN 8

typedef struct fwd_src {
    uint64_t base;   /* output of run i (1-based): base | i */
    atomic_int runs; /* runs begun: a run that begins publishes */
} fwd_src;

static int task_fwd_src(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    fwd_src *s = arg;
    uint64_t v = s->base | (uint64_t)(atomic_fetch_add(&s->runs, 1) + 1);
    memcpy(out, &v, sizeof v);
    return 0;
}

typedef struct fwd_dst {
    atomic_int runs;
    atomic_int bad; /* runs handed no input, or the wrong size */
    atomic_u64 seen[FWD_SEEN];
} fwd_dst;

static uint64_t fwd_result(uint64_t v) { return mix64(v ^ 0xF0F0F0F0F0ull); }

static int task_fwd_dst(atap_ctx *ctx, void *arg, void *out)
{
    fwd_dst *t = arg;
    size_t size = 0;
    const void *in = atap_input(ctx, &size);
    uint64_t v = 0;
    if (in == NULL || size != sizeof v)
        atomic_fetch_add(&t->bad, 1);
    else
        memcpy(&v, in, sizeof v);
    int i = atomic_fetch_add(&t->runs, 1);
    if (i < FWD_SEEN)
        atomic_store(&t->seen[i], v);
    uint64_t r = fwd_result(v);
    memcpy(out, &r, sizeof r);
    return 0;
}

/*
 * The target is a waiting one-shot: each output forwarded starts a run, or
 * owes one while a run is under way, and gives don't queue (the newest
 * wins). So it sees the source's outputs in order, none twice, ending on the
 * last; a one-shot source's single output exactly once.
 */
static void do_forward(driver *d, uint64_t tag)
{
    bool repeat = rng_range(&d->rng, 0, 1) != 0;
    uint32_t k = repeat ? (uint32_t)rng_range(&d->rng, 2, 3) : 1;
    fwd_src *si = calloc(1, sizeof *si);
    fwd_dst *ti = calloc(1, sizeof *ti);
    atap_spawn_opts so = {.out_size = 8,
                          .arg_free = free,
                          .priority = rand_priority(d),
                          .blocking = rng_range(&d->rng, 0, 7) == 0};
    atap_task src, dst;

    if (repeat) {
        so.kind = ATAP_REPEAT;
        so.runs = k;
        so.every_ns = rng_range(&d->rng, 0, 1) ? 0 : rng_range(&d->rng, ATAP_US(100), ATAP_US(500));
    }
    if (si == NULL || ti == NULL) {
        DCHECK(d, !"calloc");
        free(si);
        free(ti);
        return;
    }
    si->base = mix64(tag) & ~(uint64_t)0xFF;
    if (atap_spawn_waiting(&dst, task_fwd_dst, ti, 8,
                           &(atap_spawn_opts){.out_size = 8, .arg_free = free}) != 0) {
        DCHECK(d, !"spawn_waiting");
        free(si);
        free(ti);
        return;
    }
    if (atap_spawn(&src, task_fwd_src, si, &so) != 0) {
        DCHECK(d, !"spawn");
        free(si);
        atap_release(dst); /* never given anything: let go, ti freed */
        return;
    }
    bool ok;
    if (rng_range(&d->rng, 0, 2) == 0) /* an output there already is handed over at once */
        DWAIT(d, ok, atap_finished(src), "the forward's source to finish (before the forward)");
    DEXPECT(d, atap_forward(src, dst), 0);

    /* the source's end: its last output, or a run that died with its thread */
    uint64_t v = 0;
    uint32_t published = k;
    DWAIT(d, ok, atap_finished(src), "the forward's source to finish");
    if (DEXPECT_D(d, atap_join_for(src, &v, sizeof v, STALL_NS), 0)) {
        published = (uint32_t)atomic_load(&si->runs); /* deaths come before a run begins */
    } else {
        if (v != (si->base | k))
            drv_fail(d, __FILE__, __LINE__, "the source's last output %" PRIx64 ", wanted %" PRIx64,
                     v, si->base | k);
        DCHECK(d, atomic_load(&si->runs) == (int)k);
    }
    if (published == 0) { /* nothing was published: nothing forwarded */
        DCHECK(d, atomic_load(&ti->runs) == 0);
        atap_release(src);
        atap_release(dst);
        return;
    }

    /* the target ends on the last output */
    uint64_t want = fwd_result(si->base | published), end = now_ns() + STALL_NS;
    bool got = false;
    for (;;) {
        uint64_t now = now_ns(), left = end > now ? end - now : 0;
        v = 0;
        int rc = atap_join_for(dst, &v, sizeof v, left);
        if (rc == 0 && v == want) {
            got = true;
            break;
        }
        if (rc == 0) {
            bool known = false;
            for (uint32_t i = 1; i <= published; i++)
                known = known || v == fwd_result(si->base | i);
            if (!known) {
                drv_fail(d, __FILE__, __LINE__,
                         "the target made %" PRIx64 ", from no output of its source", v);
                break;
            }
        } else if (rc != ATAP_ENOTREADY) {
            if (!died(d, rc))
                drv_fail(d, __FILE__, __LINE__, "the target read %d (%s)", rc, atap_strerror(rc));
            break;
        }
        if (now_ns() >= end) {
            drv_fail(d, __FILE__, __LINE__,
                     "STALLED: the target never saw output %u of %u "
                     "within 10 s (it ran %d times)",
                     published, k, atomic_load(&ti->runs));
            break;
        }
        sleep_us(200);
    }
    if (got) {
        int runs = atomic_load(&ti->runs);
        DCHECK(d, atomic_load(&ti->bad) == 0);
        if (runs < 1 || runs > (int)published || (!repeat && runs != 1)) {
            drv_fail(d, __FILE__, __LINE__, "the target ran %d times for %u outputs", runs,
                     published);
        } else {
            uint64_t prev = 0;
            for (int i = 0; i < runs; i++) {
                uint64_t s = atomic_load(&ti->seen[i]), idx = s & 0xFF;
                if ((s & ~(uint64_t)0xFF) != si->base || idx < 1 || idx > published ||
                    idx <= prev || (i == runs - 1 && idx != published))
                    drv_fail(d, __FILE__, __LINE__,
                             "target run %d of %d saw %" PRIx64 " (wanted outputs of %" PRIx64
                             " in order, none twice, ending on %u)",
                             i + 1, runs, s, si->base, published);
                prev = idx;
            }
        }
        d->fwd_outputs += published;
        d->fwd_runs += (unsigned long)runs;
    }
    atap_release(src);
    atap_release(dst);
}

/* ---- K_RECV_ALL: 2-5 members of 8-64 bytes, gathered in set order --------- */

#define RALL_MAX 5

typedef struct rall_item {
    size_t total;
    atomic_int runs;
    atomic_int bad;
} rall_item;

/* Hands back what it was handed. */
static int task_rall(atap_ctx *ctx, void *arg, void *out)
{
    rall_item *it = arg;
    size_t size = 0;
    const void *in = atap_input(ctx, &size);
    atomic_fetch_add(&it->runs, 1);
    if (in == NULL || size != it->total) {
        atomic_fetch_add(&it->bad, 1);
        memset(out, 0, it->total);
    } else {
        memcpy(out, in, size);
    }
    return 0;
}

static void do_recv_all(driver *d, uint64_t tag)
{
    size_t n = (size_t)rng_range(&d->rng, 2, RALL_MAX), total = 0;
    atap_task m[RALL_MAX], r;
    uint64_t mt[RALL_MAX];
    unsigned char want[RALL_MAX * 64], got[RALL_MAX * 64], one[64];
    bool member_dead = false;

    for (size_t i = 0; i < n; i++) {
        mt[i] = tag ^ ((uint64_t)(i + 1) << 52);
        size_t len = tag_len(mt[i]);
        tag_fill(want + total, len, mt[i]);
        total += len;
        atap_spawn_opts o = {.out_size = len,
                             .priority = rand_priority(d),
                             .blocking = rng_range(&d->rng, 0, 7) == 0};
        if (atap_spawn(&m[i], task_pattern, (void *)(uintptr_t)mt[i], &o) != 0) {
            DCHECK(d, !"spawn");
            for (size_t j = 0; j < i; j++)
                atap_release(m[j]);
            return;
        }
    }
    /* some outputs there already: they count */
    for (size_t i = 0; i < n; i++)
        if (rng_range(&d->rng, 0, 3) == 0) {
            if (DEXPECT_D(d, atap_join_for(m[i], one, tag_len(mt[i]), STALL_NS), 0))
                member_dead = true;
            else
                DCHECK(d, pattern_ok(one, mt[i]));
        }
    rall_item *it = calloc(1, sizeof *it);
    int rc = -ENOMEM;
    if (it != NULL) {
        it->total = total;
        rc = atap_receive_all(&r, task_rall, it, m, n,
                              &(atap_spawn_opts){.out_size = total, .arg_free = free});
    }
    if (rc != 0) {
        DEXPECT(d, rc, 0);
        free(it);
        for (size_t i = 0; i < n; i++)
            atap_release(m[i]);
        return;
    }
    memset(got, 0, sizeof got);
    rc = atap_join_for(r, got, total, STALL_NS);
    bool dead = DEXPECT_D(d, rc, 0);
    if (rc == 0 && memcmp(got, want, total) != 0)
        drv_fail(d, __FILE__, __LINE__, "the %zu members' %zu bytes came crossed or out of order",
                 n, total);
    bool ok;
    DWAIT(d, ok, atap_finished(r), "atap_finished of the receiver (one-shot members)");
    if (ok) {
        /* one run when every member published; none when one died first, or
         * the receiver's own run did (a death comes before a run begins) */
        int runs = atomic_load(&it->runs);
        if (runs != (rc == 0 ? 1 : 0) && (rc == 0 || dead))
            drv_fail(d, __FILE__, __LINE__, "the receiver ran %d times (read %s)", runs,
                     atap_strerror(rc));
        DCHECK(d, atomic_load(&it->bad) == 0);
    }
    /* the members stay the caller's, their outputs untouched */
    for (size_t i = 0; i < n; i++) {
        int mrc = atap_join_for(m[i], one, tag_len(mt[i]), STALL_NS);
        if (DEXPECT_D(d, mrc, 0))
            member_dead = true;
        else if (mrc == 0)
            DCHECK(d, pattern_ok(one, mt[i]));
    }
    if (rc == 0 && member_dead)
        drv_fail(d, __FILE__, __LINE__, "the receiver ran though a member read ATAP_EFAILED");
    if (rc == 0)
        d->rall_bytes += total;
    atap_release(r);
    for (size_t i = 0; i < n; i++)
        atap_release(m[i]);
}

/* ---- K_RECV_ANY: 2-5 members, each output a run of its own ---------------- */

#define RANY_MAX 5

typedef struct rany_item {
    atomic_int runs;
    atomic_int done;
    atomic_int bad;
    atomic_u64 seen[RANY_MAX + 3];
} rany_item;

static int task_rany(atap_ctx *ctx, void *arg, void *out)
{
    rany_item *it = arg;
    size_t size = 0;
    const void *in = atap_input(ctx, &size);
    int i = atomic_fetch_add(&it->runs, 1);
    uint64_t v = 0;
    if (in == NULL || size != sizeof v)
        atomic_fetch_add(&it->bad, 1);
    else
        memcpy(&v, in, sizeof v);
    if (i < RANY_MAX + 3)
        atomic_store(&it->seen[i], v);
    memcpy(out, &v, sizeof v);
    atomic_fetch_add(&it->done, 1);
    return 0;
}

/* A member fed by one give: its output is mix64 of the value. */
static int task_rany_member(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t size = 0;
    const void *in = atap_input(ctx, &size);
    uint64_t v = 0;
    CHECK(in != NULL && size == sizeof v);
    if (in != NULL && size == sizeof v)
        memcpy(&v, in, sizeof v);
    v = mix64(v);
    memcpy(out, &v, sizeof v);
    return 0;
}

/*
 * Two ways. Sequenced: the members wait for a give each, and each is given
 * its value only once the receiver has run for the one before, so every
 * output is its own run: the receiver runs exactly once per member, in the
 * order given, and then finishes. A burst: plain members all at once, where
 * outputs don't queue (the newest wins): 1..n runs, no output seen twice,
 * each one a member's, the last run's the one read.
 */
static void do_recv_any(driver *d, uint64_t tag)
{
    size_t n = (size_t)rng_range(&d->rng, 2, RANY_MAX), order[RANY_MAX];
    bool seq = rng_range(&d->rng, 0, 1) != 0;
    uint64_t base = mix64(tag) & ~(uint64_t)0xFF, outv[RANY_MAX];
    atap_task m[RANY_MAX], r;
    rany_item *it = calloc(1, sizeof *it);

    if (it == NULL) {
        DCHECK(d, !"calloc");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        outv[i] = mix64(base | i);
        int rc =
            seq ? atap_spawn_waiting(
                      &m[i], task_rany_member, NULL, 8,
                      &(atap_spawn_opts){.out_size = 8, .gives = 1, .priority = rand_priority(d)})
                : atap_spawn(&m[i], task_value, (void *)(uintptr_t)outv[i],
                             &(atap_spawn_opts){.out_size = 8,
                                                .priority = rand_priority(d),
                                                .blocking = rng_range(&d->rng, 0, 7) == 0});
        if (rc != 0) {
            DCHECK(d, !"spawn");
            for (size_t j = 0; j < i; j++)
                atap_release(m[j]);
            free(it);
            return;
        }
    }
    if (atap_receive_any(&r, task_rany, it, m, n,
                         &(atap_spawn_opts){.out_size = 8, .arg_free = free}) != 0) {
        DCHECK(d, !"receive_any");
        free(it);
        for (size_t i = 0; i < n; i++)
            atap_release(m[i]);
        return;
    }
    bool ok, r_dead = false;
    uint64_t v = 0;
    if (seq) {
        uint64_t expect[RANY_MAX];
        int live = 0;
        shuffle(d, order, n);
        for (size_t k = 0; k < n && !r_dead; k++) {
            size_t i = order[k];
            uint64_t in = base | i;
            DEXPECT(d, atap_give(m[i], &in, sizeof in), 0);
            uint64_t end = now_ns() + STALL_NS;
            for (;;) {
                if (atomic_load(&it->done) >= live + 1) {
                    expect[live++] = outv[i];
                    break;
                }
                if (atap_state_of(m[i]) == ATAP_FAILED) { /* the member's run died */
                    uint64_t mv;
                    DEXPECT_D(d, atap_join_for(m[i], &mv, sizeof mv, STALL_NS), 0);
                    break;
                }
                if (atap_state_of(r) == ATAP_FAILED) { /* the receiver's run died */
                    DEXPECT_D(d, atap_join_for(r, &v, sizeof v, STALL_NS), 0);
                    r_dead = true;
                    break;
                }
                if (now_ns() > end) {
                    drv_fail(d, __FILE__, __LINE__,
                             "STALLED: member %zu's output (%zu of %zu) "
                             "never ran the receiver within 10 s",
                             i, k + 1, n);
                    r_dead = true;
                    break;
                }
                sleep_us(100);
            }
        }
        if (!r_dead) {
            DWAIT(d, ok, atap_finished(r), "atap_finished of the receiver after every member");
            int rc = atap_join_for(r, &v, sizeof v, STALL_NS);
            if (live == 0) { /* every member died: nothing ever ran it */
                DEXPECT(d, rc, ATAP_EFAILED);
            } else if (!DEXPECT_D(d, rc, 0)) {
                if (v != expect[live - 1])
                    drv_fail(d, __FILE__, __LINE__,
                             "read %" PRIx64 ", the last member's was %" PRIx64, v,
                             expect[live - 1]);
                int runs = atomic_load(&it->runs);
                if (runs != live)
                    drv_fail(d, __FILE__, __LINE__,
                             "the receiver ran %d times for %d outputs, "
                             "each given after the last run",
                             runs, live);
                for (int j = 0; j < live && j < runs; j++)
                    if (atomic_load(&it->seen[j]) != expect[j])
                        drv_fail(d, __FILE__, __LINE__, "run %d saw %" PRIx64 ", wanted %" PRIx64,
                                 j + 1, (uint64_t)atomic_load(&it->seen[j]), expect[j]);
            }
            d->rany_seq_outputs += (unsigned long)live;
        }
    } else {
        DWAIT(d, ok, atap_finished(r), "atap_finished of the receiver (one-shot members)");
        int rc = atap_join_for(r, &v, sizeof v, STALL_NS);
        if (!DEXPECT_D(d, rc, 0) && rc == 0) {
            DWAIT(d, ok, atomic_load(&it->done) == atomic_load(&it->runs),
                  "the receiver's last run to end");
            int runs = atomic_load(&it->runs);
            if (runs < 1 || runs > (int)n) {
                drv_fail(d, __FILE__, __LINE__, "the receiver ran %d times for %zu outputs", runs,
                         n);
            } else {
                int count[RANY_MAX] = {0};
                for (int j = 0; j < runs; j++) {
                    uint64_t s = atomic_load(&it->seen[j]);
                    size_t i = 0;
                    while (i < n && outv[i] != s)
                        i++;
                    if (i == n || ++count[i] > 1)
                        drv_fail(d, __FILE__, __LINE__, "run %d saw %" PRIx64 ": %s", j + 1, s,
                                 i == n ? "no member's output" : "an output seen twice");
                }
                if (v != atomic_load(&it->seen[runs - 1]))
                    drv_fail(d, __FILE__, __LINE__, "read %" PRIx64 ", not the last run's", v);
            }
            d->rany_burst_outputs += n;
            d->rany_burst_runs += (unsigned long)(runs > 0 ? runs : 0);
        }
        for (size_t i = 0; i < n; i++) {
            uint64_t mv = 0;
            if (!DEXPECT_D(d, atap_join_for(m[i], &mv, sizeof mv, STALL_NS), 0))
                DCHECK(d, mv == outv[i]);
        }
    }
    DCHECK(d, atomic_load(&it->bad) == 0);
    atap_release(r);
    for (size_t i = 0; i < n; i++)
        atap_release(m[i]);
}

/* ---- K_JOIN_FIRST: 2-4 tasks sleeping 0-3 ms, each policy ----------------- */

#define JF_MAX 4

static int task_jf(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t a = (uint64_t)(uintptr_t)arg;
    (void)atap_sleep(ATAP_MS(a & 3)); /* a cancel cuts it short: the output is dropped */
    uint64_t v = mix64(a);
    memcpy(out, &v, sizeof v);
    return 0;
}

static void do_join_first(driver *d, uint64_t tag)
{
    size_t n = (size_t)rng_range(&d->rng, 2, JF_MAX), ms[JF_MAX], w = 99;
    atap_join_policy policy = (atap_join_policy)rng_range(&d->rng, 0, 2);
    atap_task ts[JF_MAX], copy[JF_MAX], dup[JF_MAX];
    uint64_t arg[JF_MAX];

    shuffle(d, ms, 4); /* different sleeps */
    for (size_t i = 0; i < n; i++) {
        arg[i] = (tag & ~(uint64_t)0xFF) | (i << 4) | ms[i];
        dup[i] = ATAP_NO_TASK;
        if (atap_spawn(&ts[i], task_jf, (void *)(uintptr_t)arg[i],
                       &(atap_spawn_opts){.out_size = 8,
                                          .priority = rand_priority(d),
                                          .blocking = rng_range(&d->rng, 0, 5) == 0}) != 0) {
            DCHECK(d, !"spawn");
            for (size_t j = 0; j < i; j++)
                atap_release(ts[j]);
            return;
        }
    }
    /* a listener of our own on some, to see how the losers end */
    if (policy != ATAP_PASS_BACK)
        for (size_t i = 0; i < n; i++)
            if (rng_range(&d->rng, 0, 1))
                DEXPECT(d, atap_dup(ts[i], &dup[i]), 0);
    memcpy(copy, ts, sizeof copy);
    int rc = atap_join_first(ts, n, policy, STALL_NS, &w);
    if (rc != 0 || w >= n) {
        DEXPECT(d, rc, 0); /* ATAP_ENOTREADY: STALLED */
        if (rc == 0)
            drv_fail(d, __FILE__, __LINE__, "winner %zu of %zu", w, n);
        if (rc != 0) /* a timeout touches no handle */
            for (size_t i = 0; i < n; i++)
                atap_release(copy[i]);
        for (size_t i = 0; i < n; i++)
            atap_release(dup[i]);
        return;
    }
    d->jf_policy[policy]++;
    /* the winner has settled, and stays ours in its place */
    uint64_t v = 0;
    DCHECK(d, ts[w].id == copy[w].id);
    DCHECK(d, atap_finished(copy[w]));
    rc = atap_try_join(copy[w], &v, sizeof v);
    if (!DEXPECT_D(d, rc, 0) && rc == 0 && v != mix64(arg[w]))
        drv_fail(d, __FILE__, __LINE__, "winner %zu made %" PRIx64 ", wanted %" PRIx64, w, v,
                 mix64(arg[w]));
    if (policy == ATAP_PASS_BACK) { /* every handle as it was, every one still ours */
        DCHECK(d, memcmp(ts, copy, sizeof(atap_task) * n) == 0);
        for (size_t i = 0; i < n; i++) {
            v = 0;
            if (!DEXPECT_D(d, atap_join_for(copy[i], &v, sizeof v, STALL_NS), 0) &&
                v != mix64(arg[i]))
                drv_fail(d, __FILE__, __LINE__, "task %zu made %" PRIx64, i, v);
            atap_release(copy[i]);
        }
    } else { /* the losers' handles were released by the call: only ours remain */
        for (size_t i = 0; i < n; i++) {
            if (i == w || dup[i].id == 0)
                continue;
            v = 0;
            rc = atap_join_for(dup[i], &v, sizeof v, STALL_NS);
            d->jf_losers_seen++;
            if (rc == ATAP_ECANCELLED && policy == ATAP_CANCEL) {
                d->jf_losers_cancelled++;
            } else if (rc == 0) { /* RELEASE; or settled before CANCEL came to it */
                d->jf_losers_ready++;
                if (v != mix64(arg[i]))
                    drv_fail(d, __FILE__, __LINE__, "loser %zu made %" PRIx64, i, v);
            } else {
                DEXPECT_D(d, rc, policy == ATAP_CANCEL ? ATAP_ECANCELLED : 0);
            }
        }
        atap_release(copy[w]);
    }
    for (size_t i = 0; i < n; i++)
        atap_release(dup[i]);
}

/* ---- K_JOIN_ALL: 2-5 tasks, every output --------------------------------- */

#define JALL_MAX 5

static size_t jall_len(uint64_t tag) { return 8 * (1 + (size_t)(tag & 3)); }

static int task_jall(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t tag = (uint64_t)(uintptr_t)arg;
    tag_fill(out, jall_len(tag), tag);
    return 0;
}

static bool jall_ok(const unsigned char *got, uint64_t tag)
{
    return tag_matches(got, jall_len(tag), tag);
}

static void do_join_all(driver *d, uint64_t tag)
{
    size_t n = (size_t)rng_range(&d->rng, 2, JALL_MAX);
    uint64_t base = (tag & ~(uint64_t)0xFF) | rng_range(&d->rng, 0, 3), tags[JALL_MAX];
    size_t len = jall_len(base);
    atap_task ts[JALL_MAX];
    unsigned char out[JALL_MAX * 32], one[32];
    int rcs[JALL_MAX], pre[JALL_MAX];
    bool prewait = rng_range(&d->rng, 0, 1) != 0, with_rcs = rng_range(&d->rng, 0, 3) != 0;

    for (size_t i = 0; i < n; i++) {
        tags[i] = base + ((uint64_t)i << 2); /* the low 2 bits, the length, stay */
        if (atap_spawn(&ts[i], task_jall, (void *)(uintptr_t)tags[i],
                       &(atap_spawn_opts){.out_size = len,
                                          .priority = rand_priority(d),
                                          .blocking = rng_range(&d->rng, 0, 7) == 0}) != 0) {
            DCHECK(d, !"spawn");
            for (size_t j = 0; j < i; j++)
                atap_release(ts[j]);
            return;
        }
        pre[i] = 1; /* not read before */
    }
    if (prewait) { /* each settled first, each under its own 10 s limit */
        for (size_t i = 0; i < n; i++) {
            pre[i] = atap_join_for(ts[i], one, len, STALL_NS);
            if (!DEXPECT_D(d, pre[i], 0))
                DCHECK(d, pre[i] != 0 || jall_ok(one, tags[i]));
        }
        d->jall_prewaited++;
    } else {
        d->jall_direct++;
    }
    memset(out, 0, sizeof out);
    for (size_t i = 0; i < n; i++)
        rcs[i] = 12345;
    unbounded_enter(d);
    int rc = atap_join_all(ts, n, out, len, with_rcs ? rcs : NULL);
    unbounded_leave(d);
    if (with_rcs) {
        int first = 0;
        for (size_t i = 0; i < n; i++) {
            if (rcs[i] == 0) {
                if (!jall_ok(out + i * len, tags[i]))
                    drv_fail(d, __FILE__, __LINE__, "output %zu of %zu (%zu bytes) is wrong", i, n,
                             len);
            } else if (!died(d, rcs[i])) {
                drv_fail(d, __FILE__, __LINE__, "rcs[%zu] = %d (%s)", i, rcs[i],
                         atap_strerror(rcs[i]));
            }
            if (pre[i] != 1 && pre[i] != rcs[i])
                drv_fail(d, __FILE__, __LINE__, "task %zu read %d, then %d", i, pre[i], rcs[i]);
            if (first == 0)
                first = rcs[i];
        }
        if (rc != first)
            drv_fail(d, __FILE__, __LINE__, "atap_join_all returned %d, the first failure was %d",
                     rc, first);
    } else if (!DEXPECT_D(d, rc, 0)) {
        for (size_t i = 0; i < n; i++)
            if (!jall_ok(out + i * len, tags[i]))
                drv_fail(d, __FILE__, __LINE__, "output %zu of %zu (%zu bytes) is wrong", i, n,
                         len);
    }
    for (size_t i = 0; i < n; i++)
        atap_release(ts[i]);
}

/* ---- K_AT_RATE: 3-4 runs, every 1-2 ms ------------------------------------ */

#define RATE_MAX 4

typedef struct rate_item {
    atomic_int runs;
    atomic_int ended;
    atomic_u64 start[RATE_MAX + 3];
} rate_item;

static int task_rate(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    rate_item *r = arg;
    int i = atomic_fetch_add(&r->runs, 1);
    uint64_t now = atap_now();
    if (i < RATE_MAX + 3)
        atomic_store(&r->start[i], now);
    uint64_t v = (uint64_t)i + 1;
    memcpy(out, &v, sizeof v);
    atomic_fetch_add(&r->ended, 1);
    return 0;
}

/*
 * With no deadline the series is over once its runs are used up: exactly
 * `runs` runs (a period the manager missed is skipped, not counted). The
 * k-th run to begin (0-based) began after k + 1 periods had come, so never
 * before spawn + k * every.
 */
static void do_at_rate(driver *d)
{
    uint64_t every = rng_range(&d->rng, ATAP_MS(1), ATAP_MS(2));
    uint32_t runs = (uint32_t)rng_range(&d->rng, 3, RATE_MAX);
    rate_item *it = calloc(1, sizeof *it);
    atap_spawn_opts o = {.out_size = 8,
                         .kind = ATAP_AT_RATE,
                         .every_ns = every,
                         .runs = runs,
                         .arg_free = free,
                         .priority = rand_priority(d)};
    atap_task t;
    uint64_t v = 0;

    uint64_t t0 = atap_now();
    if (it == NULL || atap_spawn(&t, task_rate, it, &o) != 0) {
        DCHECK(d, !"spawn");
        free(it);
        return;
    }
    bool ok;
    DWAIT(d, ok, atap_finished(t), "atap_finished of the at-rate series");
    if (!ok || DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0)) {
        atap_release(t);
        return;
    }
    DCHECK(d, v >= 1 && v <= runs);
    /* the last run may still be under way: a run that died ends the series */
    DWAIT(d, ok, atomic_load(&it->ended) >= (int)runs || atap_state_of(t) == ATAP_FAILED,
          "every run of the at-rate series to end");
    if (ok && atomic_load(&it->ended) < (int)runs) {
        DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0);
        atap_release(t);
        return;
    }
    if (ok) {
        int n = atomic_load(&it->runs);
        if (n != (int)runs)
            drv_fail(d, __FILE__, __LINE__, "%d runs of %u", n, runs);
        for (int k = 0; k < n && k < (int)runs; k++) {
            uint64_t s = atomic_load(&it->start[k]);
            if (s < t0 + (uint64_t)k * every)
                drv_fail(d, __FILE__, __LINE__,
                         "run %d began %" PRIu64 " us into a series of "
                         "period %" PRIu64 " us: early",
                         k + 1, (s - t0) / 1000u, every / 1000u);
        }
        v = 0;
        if (!DEXPECT_D(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0))
            DCHECK(d, v >= 1 && v <= runs);
        d->rate_runs += (unsigned long)n;
    }
    atap_release(t);
}

/* ---- K_BLOCK: atap_block on the driver thread ----------------------------- */

typedef struct block_item { /* the driver's own: atap_block runs on its thread */
    int variant;            /* 0 plain, 1 park_until, 2 park_fd, 3 fails */
    int fd;
    uint64_t tag, delay, deadline, resumed_at;
    pthread_t thread;
    int runs, reason, bad, got, spurious, fail_with;
    unsigned events;
} block_item;

static int block_fn(atap_ctx *ctx, void *arg, void *out)
{
    block_item *b = arg;
    int run = b->runs++;

    if (ctx == NULL || !pthread_equal(pthread_self(), b->thread) || atap_self(ctx).id != 0 ||
        atap_resumed(ctx) != (run > 0))
        b->bad++;
    switch (b->variant) {
    case 1:
        if (run == 0) {
            b->deadline = atap_now() + b->delay;
            if (atap_park_until(ctx, b->deadline) != 0) {
                b->bad++;
                return -1;
            }
            return ATAP_PARKED;
        }
        b->resumed_at = atap_now();
        b->reason = atap_resume_reason(ctx);
        break;
    case 2:
        if (run > 0) {
            char c;
            b->reason = atap_resume_reason(ctx);
            b->events = atap_resume_events(ctx);
            if (read(b->fd, &c, 1) == 1) {
                b->got = 1;
                break;
            }
            b->spurious++; /* a hint: look again */
        }
        if (atap_park_fd(ctx, b->fd, ATAP_READABLE, ATAP_FOREVER) != 0) {
            b->bad++;
            return -1;
        }
        return ATAP_PARKED;
    case 3:
        return b->fail_with; /* any nonzero: ATAP_EFAILED */
    default:
        break;
    }
    tag_fill(out, tag_len(b->tag), b->tag);
    return 0;
}

static void do_block(driver *d, uint64_t tag)
{
    block_item b;
    unsigned char out[64];
    int p[2] = {-1, -1};

    memset(&b, 0, sizeof b);
    b.variant = (int)rng_range(&d->rng, 0, 3);
    b.tag = tag;
    b.thread = pthread_self();
    b.delay = rng_range(&d->rng, ATAP_US(100), ATAP_MS(2));
    b.fail_with = rng_range(&d->rng, 0, 1) ? -1 : ATAP_ECANCELLED;
    if (b.variant == 2) {
        if (!open_pipe(p)) {
            DCHECK(d, !"pipe");
            return;
        }
        b.fd = p[0];
        DCHECK(d, write(p[1], "x", 1) == 1); /* readable at once, or a moment later */
    }
    memset(out, 0, sizeof out);
    unbounded_enter(d);
    int rc = atap_block(block_fn, &b, out, tag_len(tag));
    unbounded_leave(d);
    d->block_variant[b.variant]++;
    DCHECK(d, b.bad == 0);
    switch (b.variant) {
    case 0:
        DEXPECT(d, rc, 0);
        DCHECK(d, b.runs == 1);
        break;
    case 1:
        DEXPECT(d, rc, 0);
        DCHECK(d, b.runs == 2);
        DCHECK(d, b.reason == ATAP_RESUME_DEADLINE);
        if (b.resumed_at < b.deadline)
            drv_fail(d, __FILE__, __LINE__,
                     "atap_block resumed %" PRIu64 " ns before the "
                     "deadline",
                     b.deadline - b.resumed_at);
        break;
    case 2:
        DEXPECT(d, rc, 0);
        DCHECK(d, b.got == 1);
        DCHECK(d, b.runs == 2 + b.spurious);
        DCHECK(d, b.reason == ATAP_RESUME_READY);
        DCHECK(d, (b.events & ATAP_READABLE) != 0);
        break;
    default:
        DEXPECT(d, rc, ATAP_EFAILED);
        DCHECK(d, b.runs == 1);
        break;
    }
    if (b.variant != 3 && rc == 0 && !pattern_ok(out, tag))
        drv_fail(d, __FILE__, __LINE__, "atap_block (variant %d) wrote the wrong bytes", b.variant);
    if (p[0] >= 0) {
        close(p[0]);
        close(p[1]);
    }
}

/* ---- K_PRIO: a batch at random priorities, some on blocking threads ------- */

#define PRIO_BATCH 12

static void do_prio(driver *d, uint64_t tag)
{
    size_t n = (size_t)rng_range(&d->rng, 3, PRIO_BATCH), order[PRIO_BATCH];
    atap_task ts[PRIO_BATCH];
    uint64_t want[PRIO_BATCH];

    if (rng_range(&d->rng, 0, 3) == 0) { /* one step outside the range is refused */
        atap_task bad = {12345};
        int pr = rng_range(&d->rng, 0, 1) ? ATAP_PRIORITY_MAX + 1 : ATAP_PRIORITY_MIN - 1;
        DEXPECT(
            d,
            atap_spawn(&bad, task_value, NULL, &(atap_spawn_opts){.out_size = 8, .priority = pr}),
            ATAP_EINVAL);
        DCHECK(d, bad.id == 0);
    }
    for (size_t i = 0; i < n; i++) {
        want[i] = mix64(tag + i);
        if (atap_spawn(&ts[i], task_value, (void *)(uintptr_t)want[i],
                       &(atap_spawn_opts){.out_size = 8,
                                          .priority = rand_priority(d),
                                          .blocking = rng_range(&d->rng, 0, 3) == 0}) != 0) {
            DCHECK(d, !"spawn");
            for (size_t j = 0; j < i; j++)
                atap_release(ts[j]);
            return;
        }
    }
    shuffle(d, order, n);
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        uint64_t v = 0;
        int rc = rng_range(&d->rng, 0, 1) ? atap_take_for(ts[i], &v, sizeof v, STALL_NS)
                                          : atap_join_for(ts[i], &v, sizeof v, STALL_NS);
        if (!DEXPECT_D(d, rc, 0) && v != want[i])
            drv_fail(d, __FILE__, __LINE__, "task %zu of %zu made %" PRIx64 ", wanted %" PRIx64, i,
                     n, v, want[i]);
        atap_release(ts[i]);
    }
    d->prio_tasks += n;
}

/* ---- the drivers ---------------------------------------------------------- */

static void *driver_main(void *arg)
{
    driver *d = arg;
    int in_frees_owed = 0, elem_frees_owed = 0;

    for (d->step = 0; d->step < K_COUNT || now_ns() < d->deadline; d->step++) {
        /* every kind in the first K_COUNT steps, then at random */
        d->kind = d->step < K_COUNT ? (enum kind)((d->step + (uint64_t)d->id) % K_COUNT)
                                    : (enum kind)rng_range(&d->rng, 0, K_COUNT - 1);
        uint64_t tag = ((uint64_t)(d->id + 1) << 56) | ((d->step & 0xFFFFFFFFFFull) << 16) |
                       (rng_next(&d->rng) & 0xFFFF);
        d->deaths0 = pool_deaths();
        d->step_died = false;
        atomic_store(&d->now_kind, (int)d->kind);
        switch (d->kind) {
        case K_PLAIN:
            do_plain(d, tag);
            break;
        case K_AFTER:
            do_after(d, tag);
            break;
        case K_REPEAT:
            do_repeat(d);
            break;
        case K_TIMEOUT:
            do_timeout(d);
            break;
        case K_CANCEL:
            do_cancel(d);
            break;
        case K_PARK_UNTIL:
            do_park_until(d);
            break;
        case K_PARK_FD:
            do_park_fd(d);
            break;
        case K_SLEEP_TASK:
            do_sleep_task(d);
            break;
        case K_FIB:
            do_fib(d);
            break;
        case K_GIVE:
            do_give(d, tag, &in_frees_owed);
            break;
        case K_CHAN:
            do_chan(d, &elem_frees_owed);
            break;
        case K_FORWARD:
            do_forward(d, tag);
            break;
        case K_RECV_ALL:
            do_recv_all(d, tag);
            break;
        case K_RECV_ANY:
            do_recv_any(d, tag);
            break;
        case K_JOIN_FIRST:
            do_join_first(d, tag);
            break;
        case K_JOIN_ALL:
            do_join_all(d, tag);
            break;
        case K_AT_RATE:
            do_at_rate(d);
            break;
        case K_BLOCK:
            do_block(d, tag);
            break;
        case K_PRIO:
            do_prio(d, tag);
            break;
        default:
            break;
        }
        d->done[d->kind]++;
        if (d->step_died)
            d->died[d->kind]++;
    }
    /* Every given value reaches in_free exactly once, every received value
     * nobody took reaches elem_free exactly once, once the tasks are gone. */
    bool ok;
    d->kind = K_GIVE;
    DWAIT(d, ok, atomic_load(&g_in_frees[d->id]) >= in_frees_owed, "in_free of every given value");
    d->kind = K_CHAN;
    DWAIT(d, ok, atomic_load(&g_elem_frees[d->id]) >= elem_frees_owed,
          "elem_free of every joined channel value");
    sleep_us(20000);
    d->kind = K_GIVE;
    if (atomic_load(&g_in_frees[d->id]) != in_frees_owed)
        drv_fail(d, __FILE__, __LINE__, "in_free ran %d times for %d values",
                 atomic_load(&g_in_frees[d->id]), in_frees_owed);
    d->kind = K_CHAN;
    /* values a dying thread's task was handed: each dropped at most once */
    int ef = atomic_load(&g_elem_frees[d->id]);
    if (ef < elem_frees_owed || ef > elem_frees_owed + d->elem_frees_slack)
        drv_fail(d, __FILE__, __LINE__,
                 "elem_free ran %d times for %d values (+ %d lost to "
                 "thread deaths)",
                 ef, elem_frees_owed, d->elem_frees_slack);
    return NULL;
}

static driver g_drivers[N_DRIVERS];

/* ---- the watchdog over calls with no timeout ------------------------------ */

static atomic_int g_watch_stop;

/* A driver stuck over STALL_NS in atap_join_all or atap_block can never be
 * joined: the stall is reported with its kind, and the program ends. */
static void *watchdog_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_watch_stop)) {
        uint64_t now = now_ns();
        for (int i = 0; i < N_DRIVERS; i++) {
            driver *d = &g_drivers[i];
            uint64_t since = atomic_load(&d->wd_since);
            if (since != 0 && now > since + STALL_NS) {
                fprintf(stderr,
                        "[stress] STALLED: kind %s (driver %d, step %" PRIu64 ", seed %" PRIu64
                        "): a call with no timeout has not returned in 10 s\n",
                        kind_name[atomic_load(&d->wd_kind)], i, (uint64_t)atomic_load(&d->wd_step),
                        g_seed);
                fflush(stderr);
                _exit(1);
            }
        }
        sleep_us(20000);
    }
    return NULL;
}

/* Test thread only: runs the drivers for run_ns and joins them. */
static void run_drivers(uint64_t run_ns, uint64_t seed)
{
    uint64_t deadline = now_ns() + run_ns;
    pthread_t watchdog;

    for (int i = 0; i < N_DRIVERS; i++) {
        driver *d = &g_drivers[i];
        memset(d, 0, sizeof *d);
        d->id = i;
        d->rng = mix64(seed + (uint64_t)i) | 1; /* xorshift must not start at 0 */
        d->deadline = deadline;
        atomic_init(&d->wd_since, 0);
        atomic_init(&d->wd_kind, 0);
        atomic_init(&d->wd_step, 0);
        atomic_init(&d->now_kind, -1);
        atomic_store(&g_in_frees[i], 0);
        atomic_store(&g_elem_frees[i], 0);
    }
    atomic_store(&g_watch_stop, 0);
    assert_int_equal(pthread_create(&watchdog, NULL, watchdog_main, NULL), 0);
    for (int i = 0; i < N_DRIVERS; i++)
        assert_int_equal(pthread_create(&g_drivers[i].th, NULL, driver_main, &g_drivers[i]), 0);
    for (int i = 0; i < N_DRIVERS; i++)
        assert_int_equal(pthread_join(g_drivers[i].th, NULL), 0);
    atomic_store(&g_watch_stop, 1);
    assert_int_equal(pthread_join(watchdog, NULL), 0);
}

static void print_drivers(uint64_t took_ns)
{
    unsigned long per[K_COUNT] = {0}, steps = 0;
    driver sum;
    memset(&sum, 0, sizeof sum);
    for (int i = 0; i < N_DRIVERS; i++) {
        const driver *d = &g_drivers[i];
        for (int k = 0; k < K_COUNT; k++) {
            per[k] += d->done[k];
            steps += d->done[k];
        }
        sum.dup_reads += d->dup_reads;
        sum.takes += d->takes;
        sum.late_sleeps += d->late_sleeps;
        sum.cancel_caught_sleeping += d->cancel_caught_sleeping;
        sum.fd_ready += d->fd_ready;
        sum.fd_deadline += d->fd_deadline;
        sum.fd_spurious += d->fd_spurious;
        sum.chan_sent_direct += d->chan_sent_direct;
        sum.chan_sent_task += d->chan_sent_task;
        for (int k = 0; k < K_COUNT; k++)
            sum.died[k] += d->died[k];
        sum.fwd_outputs += d->fwd_outputs;
        sum.fwd_runs += d->fwd_runs;
        sum.rall_bytes += d->rall_bytes;
        sum.rany_seq_outputs += d->rany_seq_outputs;
        sum.rany_burst_outputs += d->rany_burst_outputs;
        sum.rany_burst_runs += d->rany_burst_runs;
        for (int k = 0; k < 3; k++)
            sum.jf_policy[k] += d->jf_policy[k];
        sum.jf_losers_seen += d->jf_losers_seen;
        sum.jf_losers_cancelled += d->jf_losers_cancelled;
        sum.jf_losers_ready += d->jf_losers_ready;
        sum.jall_direct += d->jall_direct;
        sum.jall_prewaited += d->jall_prewaited;
        sum.rate_runs += d->rate_runs;
        for (int k = 0; k < 4; k++)
            sum.block_variant[k] += d->block_variant[k];
        sum.prio_tasks += d->prio_tasks;
    }
    print_message("stress: %lu steps in %.2f s:", steps, (double)took_ns / 1e9);
    for (int k = 0; k < K_COUNT; k++)
        print_message(" %s %lu", kind_name[k], per[k]);
    print_message("\nstress: %lu dup reads, %lu takes; %lu timed-out runs slept past 50 ms; "
                  "%lu cancels caught sleeping; park_fd %lu ready, %lu deadline, %lu spurious; "
                  "channel %lu sent directly, %lu by task\n",
                  sum.dup_reads, sum.takes, sum.late_sleeps, sum.cancel_caught_sleeping,
                  sum.fd_ready, sum.fd_deadline, sum.fd_spurious, sum.chan_sent_direct,
                  sum.chan_sent_task);
    print_message("stress: forward %lu outputs -> %lu target runs; receive_all %lu bytes; "
                  "receive_any sequenced %lu outputs = runs, burst %lu outputs -> %lu runs; "
                  "join_first pass_back %lu cancel %lu release %lu (losers watched %lu: %lu "
                  "cancelled, %lu ready); join_all %lu direct, %lu prewaited; at_rate %lu runs; "
                  "block plain %lu park_until %lu park_fd %lu fails %lu; priority %lu tasks\n",
                  sum.fwd_outputs, sum.fwd_runs, sum.rall_bytes, sum.rany_seq_outputs,
                  sum.rany_burst_outputs, sum.rany_burst_runs, sum.jf_policy[0], sum.jf_policy[1],
                  sum.jf_policy[2], sum.jf_losers_seen, sum.jf_losers_cancelled,
                  sum.jf_losers_ready, sum.jall_direct, sum.jall_prewaited, sum.rate_runs,
                  sum.block_variant[0], sum.block_variant[1], sum.block_variant[2],
                  sum.block_variant[3], sum.prio_tasks);
    unsigned long n_died = 0;
    for (int k = 0; k < K_COUNT; k++)
        n_died += sum.died[k];
    if (n_died > 0) {
        print_message("stress: %lu steps read ATAP_EFAILED from a thread death:", n_died);
        for (int k = 0; k < K_COUNT; k++)
            if (sum.died[k] > 0)
                print_message(" %s %lu", kind_name[k], sum.died[k]);
        print_message("\n");
    }
    for (int k = 0; k < K_COUNT; k++)
        if (per[k] == 0)
            fail_msg("kind %s never ran", kind_name[k]);
}

/* ---- the killer ---------------------------------------------------------- */

typedef struct killer {
    uint64_t start, run_ns;
    int injected; /* read by the test thread after the join */
    pthread_t th;
} killer;

static void sleep_until(uint64_t t)
{
    uint64_t now;
    while ((now = now_ns()) < t) {
        uint64_t left = t - now;
        sleep_us(left > ATAP_MS(50) ? 50000u : (unsigned)(left / 1000u) + 1);
    }
}

/* One fault; waits (up to 10 s) until the supervisor has restarted. */
static void kill_manager_once(killer *k)
{
    unsigned before = atap__manager_restarts();
    atap_inject_manager_faults(1);
    k->injected++;
    if (!wait_restarts(before + 1, STALL_NS)) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "fault %d: the manager did not die and restart within 10 s "
                 "(seed %" PRIu64 ")",
                 k->injected, g_seed);
        record_failure(__FILE__, __LINE__, msg);
    }
}

static void *killer_main(void *arg)
{
    killer *k = arg;
    /* Two bursts within the first 6 s: 4 faults in a row at most. */
    uint64_t first = k->run_ns / 5 < ATAP_MS(800) ? k->run_ns / 5 : ATAP_MS(800);
    uint64_t second = k->run_ns * 5 / 8 < ATAP_MS(2500) ? k->run_ns * 5 / 8 : ATAP_MS(2500);
    uint64_t at = first;

    for (int burst = 0;; burst++) {
        sleep_until(k->start + at);
        kill_manager_once(k);
        sleep_us(300000);
        kill_manager_once(k);
        at = burst == 0 ? second : at + ATAP_MS(6300);
        if (burst >= 1 && at + ATAP_MS(300) >= k->run_ns)
            break;
    }
    return NULL;
}

/* ---- the reaper: thread deaths -------------------------------------------- */

typedef struct reaper {
    uint64_t start, run_ns;
    int workers, blocking;  /* deaths injected (read by the test thread after the join) */
    int poked, poke_failed; /* tasks of its own that gave an owed death a thread */
    int aimed;              /* deaths injected while every thread of the kind was busy */
    pthread_t th;
} reaper;

/* Owes `workers` worker and `blocking` blocking-thread deaths and waits
 * (up to 10 s) until the pool has counted them. A death waits for a thread
 * to pass a check: idle ones are woken for it, but with no blocking thread
 * alive a blocking death waits for one, so after 100 ms the reaper spawns a
 * task of the kind to take it (which may read ATAP_EFAILED, as documented). */
static void reap(reaper *r, unsigned workers, unsigned blocking)
{
    /* Idle threads take an owed death first (they are woken for it), and a
     * busy worker checks again before its next task only after a check as
     * idle, unless it helps inside a join. So aim for a moment when every
     * thread of the kind is inside a task, for a worker while a driver runs
     * fib (nested joins): the next to pass a check then likely dies holding
     * a task. Up to 300 ms, then anyway. */
    uint64_t aim_end = now_ns() + ATAP_MS(300);
    for (;;) {
        struct atap_pool_stats st = pool_stats();
        bool fib = false;
        for (int i = 0; i < N_DRIVERS; i++)
            fib = fib || atomic_load(&g_drivers[i].now_kind) == K_FIB;
        bool all_busy = blocking
                            ? st.blocking_threads > 0 && st.blocking_busy >= st.blocking_threads
                            : fib && st.workers > 0 && st.busy >= st.workers;
        if (all_busy) {
            r->aimed++;
            break;
        }
        if (now_ns() > aim_end)
            break;
        sleep_us(50);
    }
    uint64_t before = pool_deaths(), want = before + workers + blocking;
    uint64_t end = now_ns() + STALL_NS, poke_at = now_ns() + ATAP_MS(100);

    atap_inject_thread_deaths(workers, blocking);
    r->workers += (int)workers;
    r->blocking += (int)blocking;
    while (pool_deaths() < want) {
        if (now_ns() > end) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "STALLED: %u worker and %u blocking-thread deaths owed, "
                     "%" PRIu64 " counted within 10 s (seed %" PRIu64 ")",
                     workers, blocking, pool_deaths() - before, g_seed);
            record_failure(__FILE__, __LINE__, msg);
            return;
        }
        if (now_ns() >= poke_at) {
            atap_task t;
            uint64_t v = 0;
            r->poked++;
            if (atap_spawn(&t, task_value, (void *)(uintptr_t)77,
                           &(atap_spawn_opts){.out_size = 8, .blocking = blocking > 0}) != 0) {
                CHECK(!"spawn of a poke");
            } else {
                int rc = atap_join_for(t, &v, sizeof v, STALL_NS);
                if (rc == ATAP_EFAILED)
                    r->poke_failed++;
                else
                    CHECK(rc == 0 && v == 77);
                atap_release(t);
            }
            poke_at = now_ns() + ATAP_MS(100);
        }
        sleep_us(500);
    }
}

/* A worker at 30 %, a blocking thread at 50 %, a worker at 70 % of the
 * run, and on runs of 6 s or more one more worker at 85 %. */
static void *reaper_main(void *arg)
{
    reaper *r = arg;
    static const double at[] = {0.30, 0.50, 0.70, 0.85};

    atomic_store(&g_deaths_on, 1);
    for (int i = 0; i < 4; i++) {
        if (i == 3 && r->run_ns < ATAP_SEC(6))
            break;
        sleep_until(r->start + (uint64_t)(at[i] * (double)r->run_ns));
        reap(r, i == 1 ? 0 : 1, i == 1 ? 1 : 0);
    }
    return NULL;
}

/* For a failure report: the slots still in use, by state, with their
 * function, listeners and flags (at most 20 listed). */
static void print_leftovers(void)
{
    size_t span = atap__table_span(), shown = 0, by_state[16] = {0};

    for (size_t i = 0; i < span; i++) {
        struct atap_slot *s = atap__table_slot((uint32_t)i);
        uint32_t w = s ? atomic_load(&s->word) : 0;
        uint64_t r = s ? atomic_load(&s->refs) : 0;

        if (!s || word_state(w) == ST_FREE)
            continue;
        by_state[word_state(w)]++;
        if (shown++ < 20)
            print_message("stress: left over: slot %zu state %u refs %#llx fn %p side %p\n", i,
                          word_state(w), (unsigned long long)r, (void *)(uintptr_t)s->fn,
                          (void *)atomic_load(&s->side));
    }
    for (unsigned st = 0; st < 16; st++)
        if (by_state[st])
            print_message("stress: %zu slots in state %u\n", by_state[st], st);
}

/* ---- the cases ------------------------------------------------------------ */

static void test_stress_everything_at_once(void **state)
{
    (void)state;
    killer k = {.start = now_ns(), .run_ns = g_run_ns};
    reaper r = {.start = k.start, .run_ns = g_run_ns};
    unsigned restarts0 = atap__manager_restarts();
    uint64_t deaths0 = pool_deaths();
    int unwound0 = atomic_load(&g_fib_unwound);

    print_message("stress: seed %" PRIu64 " (ATAP_STRESS_SEED), %.1f s (ATAP_STRESS_SECS), "
                  "%d drivers\n",
                  g_seed, (double)g_run_ns / 1e9, N_DRIVERS);
    assert_int_equal(pthread_create(&k.th, NULL, killer_main, &k), 0);
    assert_int_equal(pthread_create(&r.th, NULL, reaper_main, &r), 0);
    run_drivers(g_run_ns, g_seed);
    uint64_t took = now_ns() - k.start;
    assert_int_equal(pthread_join(k.th, NULL), 0);
    assert_int_equal(pthread_join(r.th, NULL), 0);
    atomic_store(&g_deaths_on, 0); /* from here ATAP_EFAILED is a failure again */
    print_drivers(took);

    /* every death counted, and the pool whole again */
    uint64_t deaths = pool_deaths() - deaths0;
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < cores() && now_ns() < end)
        sleep_us(1000);
    struct atap_pool_stats ps = pool_stats();
    print_message("stress: %d thread deaths injected (%d workers, %d blocking; %d with every "
                  "thread busy), %" PRIu64 " counted; %d pokes (%d read ATAP_EFAILED); %d fib "
                  "frames unwound; workers %zu (%u cores, peak %zu)\n",
                  r.workers + r.blocking, r.workers, r.blocking, r.aimed, deaths, r.poked,
                  r.poke_failed, atomic_load(&g_fib_unwound) - unwound0, ps.workers, cores(),
                  ps.peak_workers);
    assert_true(r.workers >= 2 && r.blocking == 1);
    assert_true(deaths == (uint64_t)(r.workers + r.blocking));
    if (ps.workers < cores())
        fail_msg("%zu workers 10 s after the last death, fewer than the %u cores", ps.workers,
                 cores());

    assert_true(wait_manager(true, ATAP_SEC(10)));
    unsigned restarts = atap__manager_restarts() - restarts0;
    print_message("stress: %d manager faults injected, %u restarts\n", k.injected, restarts);
    assert_true(restarts >= 2);
    assert_int_equal(restarts, (unsigned)k.injected);
    struct atap_status st = status_now();
    assert_true(st.initialised);
    assert_true(st.manager_alive);
    assert_true(st.healthy);
    if (!wait_live_back(ATAP_SEC(20))) {
        print_leftovers();
        fail_msg("%zu tasks still live 20 s after the drivers stopped (%zu at the start)",
                 pool_stats().live, g_live_base);
    }
    assert_no_failures();
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int task_burst(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = mix64((uint64_t)(uintptr_t)arg);
    memcpy(out, &v, sizeof v);
    return 0;
}

#define BURST 20000

static void test_stress_then_idle_trim_burst_restart(void **state)
{
    (void)state;
    uint64_t work_ns = g_run_ns / 4 < ATAP_SEC(1) ? g_run_ns / 4 : ATAP_SEC(1);
    uint64_t t0 = now_ns();

    /* some of every kind of work, no faults */
    run_drivers(work_ns, g_seed ^ 0xA5A5A5A5ull);
    print_drivers(now_ns() - t0);
    assert_no_failures();

    /* idle */
    assert_true(wait_live_back(ATAP_SEC(20)));
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().busy != 0 && now_ns() < end)
        sleep_us(1000);
    sleep_us(300000);
    double c0 = cpu_seconds();
    uint64_t w0 = now_ns();
    sleep_us(300000);
    double used = (cpu_seconds() - c0) / ((double)(now_ns() - w0) / 1e9);
    print_message("stress: idle CPU %.2f %% of one core\n", used * 100);
    assert_true(used < 0.20);

    /* trim */
    size_t released = 0;
    int rc = atap_trim(&released);
    print_message("stress: trim after idle: %s, %zu bytes\n", atap_strerror(rc), released);
    assert_true(rc == 0 || rc == ATAP_EBUSY);

    /* a burst */
    atap_task *ts = calloc(BURST, sizeof *ts);
    assert_non_null(ts);
    t0 = now_ns();
    for (size_t i = 0; i < BURST; i++)
        assert_int_equal(atap_spawn(&ts[i], task_burst, (void *)(uintptr_t)(i * 7919u + 1),
                                    &(atap_spawn_opts){.out_size = 8}),
                         0);
    for (size_t i = 0; i < BURST; i++) {
        uint64_t v = 0;
        rc = atap_join_for(ts[i], &v, sizeof v, STALL_NS);
        if (rc != 0)
            fail_msg("burst task %zu of %d read %d (%s)", i, BURST, rc, atap_strerror(rc));
        if (v != mix64((uint64_t)(uintptr_t)(i * 7919u + 1)))
            fail_msg("burst task %zu: a crossed output", i);
        atap_release(ts[i]);
    }
    free(ts);
    print_message("stress: burst of %d in %.2f s\n", BURST, (double)(now_ns() - t0) / 1e9);
    assert_true(wait_live_back(ATAP_SEC(20)));
    released = 0;
    rc = atap_trim(&released);
    print_message("stress: trim after the burst: %s, %zu bytes\n", atap_strerror(rc), released);
    assert_true(rc == 0 || rc == ATAP_EBUSY);
    atap_task t = spawn8(task_value, (void *)(uintptr_t)77);
    assert_true(join8(t) == 77);
    atap_release(t);

    /* shutdown and restart */
    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
    assert_int_equal(
        atap_spawn(&t, task_value, (void *)(uintptr_t)1, &(atap_spawn_opts){.out_size = 8}),
        ATAP_ENOTINIT);
    assert_int_equal(atap_init(NULL), 0);
    assert_true(wait_manager(true, ATAP_SEC(10)));
    assert_true(status_now().healthy);
    t = spawn8(task_value, (void *)(uintptr_t)42);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, STALL_NS), 0);
    assert_true(v == 42);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(20)));
    assert_no_failures();
}

int main(void)
{
    read_settings();
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_stress_everything_at_once),
        T(test_stress_then_idle_trim_burst_restart),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

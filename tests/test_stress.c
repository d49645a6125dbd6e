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
#include "test_util.h"

typedef _Atomic uint64_t atomic_u64;

/* ---- settings ------------------------------------------------------------ */

#define N_DRIVERS 4
#define STALL_NS ATAP_SEC(10)         /* every join's limit */
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
    K_PLAIN,       /* spawn, output 8..64 bytes from a tag; join/take/dup */
    K_AFTER,       /* a start delay: never early */
    K_REPEAT,      /* ATAP_REPEAT, 3 runs 1 ms apart */
    K_TIMEOUT,     /* a run past its timeout reads ATAP_ETIMEDOUT */
    K_CANCEL,      /* a long sleep cancelled reads ATAP_ECANCELLED */
    K_PARK_UNTIL,  /* parks until a deadline: never early */
    K_PARK_FD,     /* parks on a fresh pipe, with or without a timeout */
    K_SLEEP_TASK,  /* atap_spawn_sleep: never short */
    K_FIB,         /* nested fork-join inside tasks */
    K_GIVE,        /* atap_spawn_waiting + atap_give */
    K_CHAN,        /* a channel: every value received exactly once */
    K_COUNT
};

static const char *const kind_name[K_COUNT] = {
    "plain", "after", "repeat", "timeout", "cancel", "park_until",
    "park_fd", "sleep_task", "fib", "give", "channel",
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
    pthread_t th;
} driver;

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
            drv_fail((d), __FILE__, __LINE__, "%s returned %d (%s), wanted %d (%s)%s", #call, rc_,  \
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
            drv_fail((d), __FILE__, __LINE__, "STALLED: %s never came within 10 s", (what));      \
    } while (0)

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

static bool pattern_ok(const unsigned char *got, uint64_t tag)
{
    unsigned char want[64];
    size_t len = tag_len(tag);
    tag_fill(want, len, tag);
    return memcmp(got, want, len) == 0;
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
        DEXPECT(d, atap_join_for(t, a, len, STALL_NS), 0);
        DEXPECT(d, atap_try_join(t, b, len), 0);
        DCHECK(d, pattern_ok(a, tag));
        DCHECK(d, pattern_ok(b, tag));
        break;
    case 1: /* take: moved out, later readers read ATAP_ETAKEN */
        DEXPECT(d, atap_take_for(t, a, len, STALL_NS), 0);
        DCHECK(d, pattern_ok(a, tag));
        DEXPECT(d, atap_join_for(t, b, len, STALL_NS), ATAP_ETAKEN);
        d->takes++;
        break;
    case 2: /* a dup: both read the same bytes */
        DEXPECT(d, atap_dup(t, &c), 0);
        DEXPECT(d, atap_join_for(c, b, len, STALL_NS), 0);
        DEXPECT(d, atap_join_for(t, a, len, STALL_NS), 0);
        DCHECK(d, pattern_ok(a, tag));
        DCHECK(d, pattern_ok(b, tag));
        d->dup_reads++;
        break;
    default: /* a dup takes; the original then reads ATAP_ETAKEN */
        DEXPECT(d, atap_dup(t, &c), 0);
        DEXPECT(d, atap_take_for(c, b, len, STALL_NS), 0);
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
    atap_spawn_opts o = {.out_size = 16, .after_ns = after,
                         .priority = (int)rng_range(&d->rng, 0, 255) - 128};
    uint64_t v[2] = {0, 0};
    atap_task t;
    uint64_t t0 = atap_now();

    if (atap_spawn(&t, task_start_time, (void *)(uintptr_t)tag, &o) != 0) {
        DCHECK(d, !"spawn");
        return;
    }
    DEXPECT(d, atap_join_for(t, v, sizeof v, STALL_NS), 0);
    DCHECK(d, v[0] == (uint64_t)(uintptr_t)tag);
    if (v[1] < t0 + after)
        drv_fail(d, __FILE__, __LINE__, "started %" PRIu64 " ns early (after %" PRIu64 " ns)",
                 t0 + after - v[1], after);
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
    atap_spawn_opts o = {.out_size = 8, .kind = ATAP_REPEAT, .runs = REPEAT_RUNS,
                         .every_ns = ATAP_MS(1), .arg_free = free};
    atap_task t;
    uint64_t v = 0;

    if (r == NULL || atap_spawn(&t, task_repeat, r, &o) != 0) {
        DCHECK(d, !"spawn");
        free(r);
        return;
    }
    bool ok;
    DWAIT(d, ok, atap_finished(t), "atap_finished of the repeat");
    if (ok) {
        DEXPECT(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0);
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
    DEXPECT(d, atap_join_for(t, &v, sizeof v, STALL_NS), ATAP_ETIMEDOUT);
    uint64_t joined = atap_now();
    if (joined < t0 + limit)
        drv_fail(d, __FILE__, __LINE__, "read ATAP_ETIMEDOUT %" PRIu64 " ns before a %" PRIu64
                 " us limit could pass", t0 + limit - joined, limit / 1000u);
    DCHECK(d, atap_state_of(t) == ATAP_TIMED_OUT);
    DCHECK(d, atap_finished(t));
    bool ok;
    DWAIT(d, ok, atomic_load(&it->done) != 0, "the end of the timed-out run's sleep");
    if (ok) {
        int rc = atomic_load(&it->rc);
        uint64_t end = atomic_load(&it->end);
        if (rc != ATAP_ETIMEDOUT)
            drv_fail(d, __FILE__, __LINE__, "atap_sleep in the run read %d (%s)", rc,
                     atap_strerror(rc));
        if (end < t0 + limit)
            drv_fail(d, __FILE__, __LINE__, "the sleep was interrupted %" PRIu64
                     " ns before the limit could pass", t0 + limit - end);
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
    DEXPECT(d, atap_join_for(t, NULL, 0, STALL_NS), ATAP_ECANCELLED);
    uint64_t took = atap_now() - tc;
    if (took > ATAP_SEC(2))
        drv_fail(d, __FILE__, __LINE__, "the join read ATAP_ECANCELLED %" PRIu64 " ms after the cancel",
                 took / 1000000u);
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
    DEXPECT(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0);
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
    f->timeout = rng_range(&d->rng, 0, 1) ? ATAP_FOREVER
                                          : rng_range(&d->rng, ATAP_MS(1), ATAP_MS(5));
    if (atap_spawn(&t, task_park_fd, f, &(atap_spawn_opts){.out_size = 8, .arg_free = free}) != 0) {
        DCHECK(d, !"spawn");
        free(f);
        close(p[0]);
        close(p[1]);
        return;
    }
    sleep_us((unsigned)rng_range(&d->rng, 0, 2000));
    DCHECK(d, write(p[1], "x", 1) == 1);
    DEXPECT(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0);
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
                     "a %" PRIu64 " us fd timeout resumed %" PRIu64 " ns early",
                     f->timeout / 1000u, parked + f->timeout - at);
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
    DEXPECT(d, atap_join_for(t, &slept, sizeof slept, STALL_NS), 0);
    uint64_t el = atap_now() - t0;
    if (slept < ns)
        drv_fail(d, __FILE__, __LINE__, "slept %" PRIu64 " ns of %" PRIu64 " (%s)", slept, ns,
                 precise ? "precise" : "relaxed");
    if (el < ns)
        drv_fail(d, __FILE__, __LINE__, "joined %" PRIu64 " ns into a %" PRIu64 " ns sleep", el, ns);
    atap_release(t);
}

/* ---- K_FIB: fork-join inside tasks -------------------------------------- */

static uint64_t fib_plain(unsigned n) { return n < 2 ? n : fib_plain(n - 1) + fib_plain(n - 2); }

static int task_fib(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    unsigned n = (unsigned)(uintptr_t)arg;
    uint64_t r = n;

    if (n >= 2) {
        atap_spawn_opts o = {.out_size = 8};
        atap_task a, b;
        uint64_t x = 0, y = 0;
        int ra = atap_spawn(&a, task_fib, (void *)(uintptr_t)(n - 1), &o);
        int rb = atap_spawn(&b, task_fib, (void *)(uintptr_t)(n - 2), &o);
        CHECK(ra == 0);
        CHECK(rb == 0);
        if (ra == 0) {
            CHECK(atap_join_for(a, &x, sizeof x, STALL_NS) == 0);
            atap_release(a);
        }
        if (rb == 0) {
            CHECK(atap_join_for(b, &y, sizeof y, STALL_NS) == 0);
            atap_release(b);
        }
        r = x + y;
    }
    memcpy(out, &r, sizeof r);
    return 0;
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
    DEXPECT(d, atap_join_for(t, &v, sizeof v, STALL_NS), 0);
    if (v != fib_plain(n))
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
        DEXPECT(d, atap_join_for(t, &out, sizeof out, STALL_NS), 0);
        if (out != give_result(tag, g.v))
            drv_fail(d, __FILE__, __LINE__, "give %u of %u: the task made %" PRIx64
                     ", wanted %" PRIx64, i + 1, k, out, give_result(tag, g.v));
    }
    bool ok;
    DWAIT(d, ok, atap_finished(t), "atap_finished after the last give");
    if (ok) {
        give_val g = {1, (uint64_t)d->id};
        DEXPECT(d, atap_give(t, &g, sizeof g), ATAP_EFINISHED); /* in_free still sees it */
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
    int n_recv = 0, n_send = 0;
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
        DEXPECT(d, atap_join_for(send[i], NULL, 0, STALL_NS), 0);
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
                drv_fail(d, __FILE__, __LINE__, "received %" PRIx64 ", not one of this step's",
                         v);
            else
                seen[idx]++;
            if (!take)
                (*elem_frees_owed)++; /* joined, not taken: elem_free with the handle */
        } else if (rc == ATAP_ECLOSED) {
            closed++;
        } else {
            drv_fail(d, __FILE__, __LINE__, "receive task %d read %d (%s)%s", i, rc,
                     atap_strerror(rc), rc == ATAP_ENOTREADY ? ": STALLED" : "");
        }
    }
    if (n_recv == n + 1)
        DCHECK(d, closed == 1);
    for (int i = 0; i < n; i++)
        if (seen[i] != 1)
            drv_fail(d, __FILE__, __LINE__, "value %d of %d received %d times (capacity %zu)", i,
                     n, seen[i], cap);
    for (int i = 0; i < n_recv; i++)
        atap_release(recv[i]);
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
        switch (d->kind) {
        case K_PLAIN: do_plain(d, tag); break;
        case K_AFTER: do_after(d, tag); break;
        case K_REPEAT: do_repeat(d); break;
        case K_TIMEOUT: do_timeout(d); break;
        case K_CANCEL: do_cancel(d); break;
        case K_PARK_UNTIL: do_park_until(d); break;
        case K_PARK_FD: do_park_fd(d); break;
        case K_SLEEP_TASK: do_sleep_task(d); break;
        case K_FIB: do_fib(d); break;
        case K_GIVE: do_give(d, tag, &in_frees_owed); break;
        case K_CHAN: do_chan(d, &elem_frees_owed); break;
        default: break;
        }
        d->done[d->kind]++;
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
    if (atomic_load(&g_elem_frees[d->id]) != elem_frees_owed)
        drv_fail(d, __FILE__, __LINE__, "elem_free ran %d times for %d values",
                 atomic_load(&g_elem_frees[d->id]), elem_frees_owed);
    return NULL;
}

static driver g_drivers[N_DRIVERS];

/* Test thread only: runs the drivers for run_ns and joins them. */
static void run_drivers(uint64_t run_ns, uint64_t seed)
{
    uint64_t deadline = now_ns() + run_ns;

    for (int i = 0; i < N_DRIVERS; i++) {
        driver *d = &g_drivers[i];
        memset(d, 0, sizeof *d);
        d->id = i;
        d->rng = mix64(seed + (uint64_t)i) | 1; /* xorshift must not start at 0 */
        d->deadline = deadline;
        atomic_store(&g_in_frees[i], 0);
        atomic_store(&g_elem_frees[i], 0);
    }
    for (int i = 0; i < N_DRIVERS; i++)
        assert_int_equal(pthread_create(&g_drivers[i].th, NULL, driver_main, &g_drivers[i]), 0);
    for (int i = 0; i < N_DRIVERS; i++)
        assert_int_equal(pthread_join(g_drivers[i].th, NULL), 0);
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
        snprintf(msg, sizeof msg, "fault %d: the manager did not die and restart within 10 s "
                 "(seed %" PRIu64 ")", k->injected, g_seed);
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

/* ---- the cases ------------------------------------------------------------ */

static void test_stress_everything_at_once(void **state)
{
    (void)state;
    killer k = {.start = now_ns(), .run_ns = g_run_ns};
    unsigned restarts0 = atap__manager_restarts();

    print_message("stress: seed %" PRIu64 " (ATAP_STRESS_SEED), %.1f s (ATAP_STRESS_SECS), "
                  "%d drivers\n",
                  g_seed, (double)g_run_ns / 1e9, N_DRIVERS);
    assert_int_equal(pthread_create(&k.th, NULL, killer_main, &k), 0);
    run_drivers(g_run_ns, g_seed);
    uint64_t took = now_ns() - k.start;
    assert_int_equal(pthread_join(k.th, NULL), 0);
    print_drivers(took);

    assert_true(wait_manager(true, ATAP_SEC(10)));
    unsigned restarts = atap__manager_restarts() - restarts0;
    print_message("stress: %d manager faults injected, %u restarts\n", k.injected, restarts);
    assert_true(restarts >= 2);
    assert_int_equal(restarts, (unsigned)k.injected);
    struct atap_status st = status_now();
    assert_true(st.initialised);
    assert_true(st.manager_alive);
    assert_true(st.healthy);
    if (!wait_live_back(ATAP_SEC(20)))
        fail_msg("%zu tasks still live 20 s after the drivers stopped (%zu at the start)",
                 pool_stats().live, g_live_base);
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
    assert_int_equal(atap_spawn(&t, task_value, (void *)(uintptr_t)1,
                                &(atap_spawn_opts){.out_size = 8}),
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

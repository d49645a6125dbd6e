/*
 * soak: everything at once for as long as asked, every output checked.
 *
 *   soak MINUTES          (a fraction is allowed: 0.3 is 18 s)
 *
 * Threads of its own, all running together:
 *   drivers   spawn, read and end tasks of every kind (see enum kind):
 *             one-shots read by join / take / join_for / try_join / dup /
 *             join_first / wait, start delays, run timeouts, cancels,
 *             repeats, at-rate series, waiting tasks fed by gives,
 *             receive_all / receive_any, channel send and receive tasks,
 *             parks on pipes and on deadlines, sleep tasks, and trees of
 *             tasks that spawn children and join them (nested joins);
 *   server    an echo server on 127.0.0.1: a listener task parked on the
 *             listening socket, one parked task per connection;
 *   clients   threads that connect, send payloads of checked bytes, read
 *             every byte back and leave;
 *   killer    the manager falls apart every 3 s (atap_inject_manager_faults,
 *             restart window 0 so its supervisor never gives up);
 *   reaper    a worker dies every 5 s, every third time a blocking thread
 *             too (atap_inject_thread_deaths);
 *   watchdog  fails the run when no operation has completed for 10 s.
 *
 * Checks. Every output carries its task's tag, a value and a checksum over
 * both: a tag that is not the one asked for is a crossed output (another
 * task's), a checksum that does not hold is a torn one; both count as
 * crossed. Every delay, gap, park deadline, sleep and run timeout is
 * measured against CLOCK_MONOTONIC and counted early if it came early.
 * Every return code is the one expected; ATAP_EFAILED is accepted only
 * where atap.h allows it here: a task whose thread died (the pool's death
 * count moved during that operation), then counted in died_ok. Every
 * wait is bounded (10 s): one that runs out is a stall.
 *
 * Every minute and at the end the load pauses at a checkpoint: the drivers
 * and clients stop between operations and the pool is let go quiet (no
 * task but the listener, extra threads reaped), then one line is printed:
 * operations, outputs checked, crossed, early, stalls, other failures,
 * live tasks, RSS and open fds, with manager kills and thread deaths. At
 * the end: RSS of the last checkpoint within 10 % + 16 MiB of the second
 * minute's (the first's on a run shorter than 2 minutes), fds equal, live
 * tasks no more than then; every in_free and elem_free owed has run.
 * Exit status 0 only if everything held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "atap.h"
#include "atap/inject.h" /* atap_inject_*: the tests link atap_testing, which has them */
#include "manager.h"     /* atap__manager_restarts */
#include "pool.h"        /* atap__pool_records: the workers' records, each may keep a poller */
#include "testing.h"     /* atap__test_restart_window */

#define N_DRIVERS 3
#define N_CLIENTS 2
#define STALL_NS ATAP_SEC(10)
#define KILL_EVERY_NS ATAP_SEC(3)
#define REAP_EVERY_NS ATAP_SEC(5)
#define QUIET_WAIT_NS ATAP_SEC(8)
#define RSS_SLACK_KIB (16u * 1024u)
#define BASE_WORKERS 2
#define BLOCKING_THREADS 4

typedef _Atomic uint64_t atomic_u64;

/* ---- counters -------------------------------------------------------------- */

static atomic_u64 g_ops;      /* operations done (driver steps, client exchanges) */
static atomic_u64 g_checked;  /* outputs (and echoed payloads) checked */
static atomic_u64 g_crossed;  /* another task's output, or a torn one */
static atomic_u64 g_early;    /* a delay, gap, deadline, sleep or timeout came early */
static atomic_u64 g_stalls;   /* a bounded wait ran out */
static atomic_u64 g_failures; /* any other wrong result */
static atomic_u64 g_died_ok;  /* ATAP_EFAILED accepted: the task's thread died */
static atomic_u64 g_kills;    /* manager faults injected */
static atomic_u64 g_deaths;   /* thread deaths injected */
static atomic_u64 g_gives_owed, g_in_frees;   /* in_free calls owed and made */
static atomic_u64 g_elems_owed, g_elem_frees; /* elem_free calls owed and made */
static atomic_u64 g_elems_made;               /* values handed to send tasks */
static atomic_int g_printed;                  /* failure messages printed */

static atomic_int g_stop;        /* the run is over */
static atomic_int g_server_stop; /* the clients are gone: the listener may go */
static atomic_int g_pause;       /* a checkpoint wants the load paused */
static atomic_int g_paused;      /* threads paused at a checkpoint */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Counts a wrong result in *counter and prints the first 50. */
static void fail(atomic_u64 *counter, const char *fmt, ...)
{
    atomic_fetch_add(counter, 1);
    if (atomic_fetch_add(&g_printed, 1) >= 50)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "soak: FAILED: %s\n", msg);
}

static struct atap_pool_stats pool_stats(void)
{
    struct atap_pool_stats st;
    memset(&st, 0, sizeof st);
    atap_pool_stats(&st);
    return st;
}

static uint64_t pool_deaths(void) { return pool_stats().deaths; }

/* ---- a small generator per thread --------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t rnd(uint64_t *s)
{
    *s = mix64(*s);
    return *s;
}

static uint64_t rnd_in(uint64_t *s, uint64_t lo, uint64_t hi)
{
    return lo + rnd(s) % (hi - lo + 1);
}

/* ---- checked outputs ------------------------------------------------------------- */

typedef struct out3 {
    uint64_t tag, val, sum;
} out3;

static uint64_t out_sum(uint64_t tag, uint64_t val)
{
    return mix64(tag * 0x100000001B3ull ^ val) ^ 0xC0FFEEull;
}

static out3 out_make(uint64_t tag, uint64_t val) { return (out3){tag, val, out_sum(tag, val)}; }

/* True when o is task `tag`'s, whole; counts it checked, or crossed. */
static bool out_ok(const out3 *o, uint64_t tag, const char *kind)
{
    atomic_fetch_add(&g_checked, 1);
    if (o->sum != out_sum(o->tag, o->val)) {
        fail(&g_crossed, "%s: torn output (tag %#" PRIx64 ", wanted %#" PRIx64 ")", kind, o->tag,
             tag);
        return false;
    }
    if (o->tag != tag) {
        fail(&g_crossed, "%s: crossed output: tag %#" PRIx64 ", wanted %#" PRIx64, kind, o->tag,
             tag);
        return false;
    }
    return true;
}

static void early(const char *what, uint64_t got, uint64_t want)
{
    fail(&g_early, "%s came %" PRIu64 " ns early", what, want - got);
}

/* ---- a driver's step and what a death explains -------------------------------- */

typedef struct driver {
    int id;
    uint64_t rng, seq, deaths0;
    pthread_t th;
} driver;

static uint64_t new_tag(driver *d) { return ((uint64_t)(d->id + 1) << 56) | (++d->seq << 8); }

/*
 * ATAP_EFAILED is what a task reads when its thread died (atap.h, atap_spawn),
 * and a task that joined it fails in turn. Accepted only when the pool's
 * death count moved since this operation began (counted once the replacement
 * is live, so waited for up to 5 s).
 */
static bool died_since(uint64_t deaths0, int rc)
{
    if (rc != ATAP_EFAILED)
        return false;
    uint64_t end = now_ns() + ATAP_SEC(5);
    while (pool_deaths() <= deaths0) {
        if (now_ns() > end)
            return false;
        sleep_ns(ATAP_US(200));
    }
    atomic_fetch_add(&g_died_ok, 1);
    return true;
}

/* rc must be want. Returns 0 when it is, 1 when a death explains it (the
 * caller skips what needed the run), -1 (counted) otherwise. */
static int expect(driver *d, const char *kind, const char *call, int rc, int want)
{
    if (rc == want)
        return 0;
    if (died_since(d->deaths0, rc))
        return 1;
    if (rc == ATAP_ENOTREADY && want != ATAP_ENOTREADY)
        fail(&g_stalls, "%s: %s: STALLED (nothing within 10 s)", kind, call);
    else
        fail(&g_failures, "%s: %s returned %d (%s), wanted %d (%s)", kind, call, rc,
             atap_strerror(rc), want, atap_strerror(want));
    return -1;
}

#define EXPECT(d, kind, call, want) expect((d), (kind), #call, (call), (want))

/* ---- K_ONCE: one-shots, read every way ------------------------------------------ */

static int task_out3(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t tag = (uint64_t)(uintptr_t)arg;
    out3 o = out_make(tag, mix64(tag));
    memcpy(out, &o, sizeof o);
    return 0;
}

static void do_once(driver *d)
{
    uint64_t tag = new_tag(d);
    atap_task t, c;
    out3 o;
    memset(&o, 0, sizeof o);
    atap_spawn_opts opts = {.out_size = sizeof(out3),
                            .blocking = rnd_in(&d->rng, 0, 5) == 0,
                            .priority = (int)rnd_in(&d->rng, 0, 255) - 128};
    int rc = atap_spawn(&t, task_out3, (void *)(uintptr_t)tag, &opts);
    if (rc != 0) {
        fail(&g_failures, "once: spawn: %s", atap_strerror(rc));
        return;
    }
    int how = (int)rnd_in(&d->rng, 0, 6), r = 0;
    switch (how) {
    case 0:
        r = EXPECT(d, "once", atap_join_for(t, &o, sizeof o, STALL_NS), 0);
        break;
    case 1:
        r = EXPECT(d, "once", atap_take_for(t, &o, sizeof o, STALL_NS), 0);
        if (r == 0) {
            out3 again;
            EXPECT(d, "once", atap_try_join(t, &again, sizeof again), ATAP_ETAKEN);
        }
        break;
    case 2: {
        uint64_t end = now_ns() + STALL_NS;
        while ((rc = atap_try_join(t, &o, sizeof o)) == ATAP_ENOTREADY && now_ns() < end)
            sleep_ns(ATAP_US(50));
        r = expect(d, "once", "atap_try_join (looped)", rc, 0);
        break;
    }
    case 3:
        if (atap_dup(t, &c) != 0) {
            fail(&g_failures, "once: dup");
            r = -1;
            break;
        }
        atap_release(t);
        t = c;
        r = EXPECT(d, "once", atap_join_for(t, &o, sizeof o, STALL_NS), 0);
        break;
    case 4: {
        size_t winner = 9;
        r = EXPECT(d, "once", atap_join_first(&t, 1, ATAP_PASS_BACK, STALL_NS, &winner), 0);
        if (r == 0 && winner != 0)
            fail(&g_failures, "once: join_first winner %zu", winner);
        if (r == 0)
            r = EXPECT(d, "once", atap_try_join(t, &o, sizeof o), 0);
        break;
    }
    case 5: {
        atap_state st = 0;
        uint64_t end = now_ns() + STALL_NS;
        while (!atap_finished(t) && now_ns() < end)
            sleep_ns(ATAP_US(50));
        r = EXPECT(d, "once", atap_wait(t, &st), 0);
        if (r == 0)
            r = EXPECT(d, "once", atap_try_take(t, &o, sizeof o), 0);
        break;
    }
    default:
        r = EXPECT(d, "once", atap_take_for(t, &o, sizeof o, STALL_NS), 0);
        break;
    }
    if (r == 0)
        out_ok(&o, tag, "once");
    atap_release(t);
}

/* ---- K_AFTER: a start delay, never early ---------------------------------------- */

static int task_start_time(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    out3 o = out_make((uint64_t)(uintptr_t)arg, now_ns());
    memcpy(out, &o, sizeof o);
    return 0;
}

static void do_after(driver *d)
{
    uint64_t tag = new_tag(d), after = rnd_in(&d->rng, ATAP_US(100), ATAP_MS(8));
    atap_task t;
    out3 o;
    uint64_t t0 = now_ns();
    if (atap_spawn(&t, task_start_time, (void *)(uintptr_t)tag,
                   &(atap_spawn_opts){.out_size = sizeof(out3), .after_ns = after}) != 0) {
        fail(&g_failures, "after: spawn");
        return;
    }
    if (EXPECT(d, "after", atap_join_for(t, &o, sizeof o, STALL_NS), 0) == 0 &&
        out_ok(&o, tag, "after") && o.val < t0 + after)
        early("a start delay", o.val, t0 + after);
    atap_release(t);
}

/* ---- K_TIMEOUT: a run past its timeout; K_CANCEL: a cancel --------------------- */

static int task_long_sleep(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    uint64_t ns = (uint64_t)(uintptr_t)arg;
    int rc = atap_sleep(ns);
    return rc == 0 ? -1 : rc; /* a sleep that ran its course: the cancel or timeout never came */
}

static void do_timeout(driver *d)
{
    uint64_t limit = rnd_in(&d->rng, ATAP_MS(1), ATAP_MS(5));
    atap_task t;
    out3 o;
    uint64_t t0 = now_ns();
    if (atap_spawn(&t, task_long_sleep, (void *)(uintptr_t)ATAP_SEC(20),
                   &(atap_spawn_opts){.out_size = sizeof(out3),
                                      .timeout_ns = limit,
                                      .blocking = rnd_in(&d->rng, 0, 3) == 0}) != 0) {
        fail(&g_failures, "timeout: spawn");
        return;
    }
    int r = EXPECT(d, "timeout", atap_join_for(t, &o, sizeof o, STALL_NS), ATAP_ETIMEDOUT);
    uint64_t t1 = now_ns();
    if (r == 0) {
        atomic_fetch_add(&g_checked, 1);
        if (t1 < t0 + limit)
            early("a run timeout", t1, t0 + limit);
    }
    atap_release(t);
}

static void do_cancel(driver *d)
{
    atap_task t;
    out3 o;
    uint64_t after = rnd_in(&d->rng, 0, 2) == 0 ? ATAP_MS(2) : 0;
    if (atap_spawn(&t, task_long_sleep, (void *)(uintptr_t)ATAP_SEC(20),
                   &(atap_spawn_opts){.out_size = sizeof(out3),
                                      .after_ns = after,
                                      .blocking = rnd_in(&d->rng, 0, 3) == 0}) != 0) {
        fail(&g_failures, "cancel: spawn");
        return;
    }
    sleep_ns(rnd_in(&d->rng, 0, ATAP_MS(3)));
    if (atap_cancel(t) != 0)
        fail(&g_failures, "cancel: atap_cancel");
    if (EXPECT(d, "cancel", atap_join_for(t, &o, sizeof o, STALL_NS), ATAP_ECANCELLED) == 0)
        atomic_fetch_add(&g_checked, 1);
    atap_release(t);
}

/* ---- K_REPEAT: gaps never short; K_RATE: an at-rate series ----------------------- */

typedef struct series {
    uint64_t tag, every;
    atomic_u64 runs, last_end;
} series;

static int task_repeat(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    series *s = arg;
    uint64_t start = now_ns(), end = atomic_load(&s->last_end);
    if (end != 0 && start < end + s->every)
        early("a repeat's gap", start, end + s->every);
    uint64_t n = atomic_fetch_add(&s->runs, 1) + 1;
    out3 o = out_make(s->tag, n);
    memcpy(out, &o, sizeof o);
    atomic_store(&s->last_end, now_ns());
    return 0;
}

static int task_rate(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    series *s = arg;
    uint64_t n = atomic_fetch_add(&s->runs, 1) + 1;
    out3 o = out_make(s->tag, n);
    memcpy(out, &o, sizeof o);
    return 0;
}

/* Waits (bounded) until the series is over; false on a stall (counted). */
static bool wait_finished(atap_task t, const char *kind)
{
    uint64_t end = now_ns() + STALL_NS;
    while (!atap_finished(t)) {
        if (now_ns() > end) {
            fail(&g_stalls, "%s: STALLED: not finished within 10 s", kind);
            return false;
        }
        sleep_ns(ATAP_US(200));
    }
    return true;
}

static void do_series(driver *d, bool rate)
{
    const char *kind = rate ? "at-rate" : "repeat";
    series *s = calloc(1, sizeof *s);
    if (s == NULL)
        return;
    uint32_t runs = (uint32_t)rnd_in(&d->rng, 2, 4);
    s->tag = new_tag(d);
    s->every =
        rate ? rnd_in(&d->rng, ATAP_MS(1), ATAP_MS(3)) : rnd_in(&d->rng, ATAP_US(200), ATAP_MS(2));
    atap_task t;
    out3 o;
    if (atap_spawn(&t, rate ? task_rate : task_repeat, s,
                   &(atap_spawn_opts){.out_size = sizeof(out3),
                                      .kind = rate ? ATAP_AT_RATE : ATAP_REPEAT,
                                      .every_ns = s->every,
                                      .runs = runs,
                                      .arg_free = free}) != 0) {
        fail(&g_failures, "%s: spawn", kind);
        free(s);
        return;
    }
    if (!wait_finished(t, kind)) {
        atap_cancel(t);
        atap_release(t);
        return;
    }
    if (expect(d, kind, "atap_join_for", atap_join_for(t, &o, sizeof o, STALL_NS), 0) == 0 &&
        out_ok(&o, s->tag, kind)) {
        uint64_t n = atomic_load(&s->runs);
        if (rate ? (o.val < 1 || o.val > runs || n > runs) : (o.val != runs || n != runs))
            fail(&g_failures, "%s: output of run %" PRIu64 ", %" PRIu64 " runs, %u asked", kind,
                 o.val, n, runs);
    }
    atap_release(t);
}

/* ---- K_GIVE: a waiting task fed by gives ------------------------------------------ */

static void count_in_free(void *in)
{
    (void)in;
    atomic_fetch_add(&g_in_frees, 1);
}

static int task_given(atap_ctx *ctx, void *arg, void *out)
{
    size_t n = 0;
    const void *in = atap_input(ctx, &n);
    uint64_t v = 0;
    if (in == NULL || n != sizeof v)
        return -1;
    memcpy(&v, in, sizeof v);
    uint64_t tag = (uint64_t)(uintptr_t)arg;
    out3 o = out_make(tag, mix64(tag ^ v));
    memcpy(out, &o, sizeof o);
    return 0;
}

static void do_give(driver *d)
{
    uint64_t tag = new_tag(d);
    unsigned gives = (unsigned)rnd_in(&d->rng, 1, 3);
    atap_task t;
    out3 o;
    if (atap_spawn_waiting(&t, task_given, (void *)(uintptr_t)tag, sizeof(uint64_t),
                           &(atap_spawn_opts){.out_size = sizeof(out3),
                                              .gives = gives,
                                              .in_free = count_in_free,
                                              .blocking = rnd_in(&d->rng, 0, 3) == 0}) != 0) {
        fail(&g_failures, "give: spawn_waiting");
        return;
    }
    for (unsigned i = 0; i <= gives; i++) {
        uint64_t v = rnd(&d->rng);
        int rc = atap_give(t, &v, sizeof v);
        if (rc != ATAP_EINVAL && rc != ATAP_ENOTASK && rc != -ENOMEM)
            atomic_fetch_add(&g_gives_owed, 1);
        if (expect(d, "give", "atap_give", rc, i < gives ? 0 : ATAP_EFINISHED) != 0)
            break;
        if (i == gives)
            break;
        if (EXPECT(d, "give", atap_join_for(t, &o, sizeof o, STALL_NS), 0) != 0)
            break;
        if (out_ok(&o, tag, "give") && o.val != mix64(tag ^ v))
            fail(&g_crossed, "give: an output from another give's value");
    }
    atap_release(t);
}

/* ---- K_RALL / K_RANY: receive_all and receive_any ---------------------------------- */

static int task_rall(atap_ctx *ctx, void *arg, void *out)
{
    size_t n = 0;
    const unsigned char *in = atap_input(ctx, &n);
    if (in == NULL || n % sizeof(out3) != 0)
        return -1;
    uint64_t acc = (uint64_t)(uintptr_t)arg;
    for (size_t i = 0; i < n / sizeof(out3); i++) {
        out3 m;
        memcpy(&m, in + i * sizeof m, sizeof m);
        if (m.sum != out_sum(m.tag, m.val))
            return -1;
        acc = mix64(acc ^ m.tag);
    }
    out3 o = out_make((uint64_t)(uintptr_t)arg, acc);
    memcpy(out, &o, sizeof o);
    return 0;
}

static int task_rany(atap_ctx *ctx, void *arg, void *out)
{
    size_t n = 0;
    const void *in = atap_input(ctx, &n);
    out3 m;
    if (in == NULL || n != sizeof m)
        return -1;
    memcpy(&m, in, sizeof m);
    if (m.sum != out_sum(m.tag, m.val))
        return -1;
    out3 o = out_make((uint64_t)(uintptr_t)arg, m.tag);
    memcpy(out, &o, sizeof o);
    return 0;
}

static void do_receive(driver *d, bool all)
{
    const char *kind = all ? "receive_all" : "receive_any";
    size_t n = (size_t)rnd_in(&d->rng, 2, 4), made = 0;
    atap_task m[4], r;
    uint64_t mt[4], tag = new_tag(d);
    out3 o;
    for (; made < n; made++) {
        mt[made] = new_tag(d);
        if (atap_spawn(&m[made], rnd_in(&d->rng, 0, 1) ? task_out3 : task_start_time,
                       (void *)(uintptr_t)mt[made],
                       &(atap_spawn_opts){.out_size = sizeof(out3),
                                          .after_ns = rnd_in(&d->rng, 0, 1) ? 0 : ATAP_US(300)}) !=
            0)
            break;
    }
    if (made < n) {
        fail(&g_failures, "%s: spawn of a member", kind);
        goto out;
    }
    int rc = all ? atap_receive_all(&r, task_rall, (void *)(uintptr_t)tag, m, n,
                                    &(atap_spawn_opts){.out_size = sizeof(out3)})
                 : atap_receive_any(&r, task_rany, (void *)(uintptr_t)tag, m, n,
                                    &(atap_spawn_opts){.out_size = sizeof(out3)});
    if (rc != 0) {
        fail(&g_failures, "%s: %s", kind, atap_strerror(rc));
        goto out;
    }
    rc = atap_join_for(r, &o, sizeof o, STALL_NS);
    if (rc == ATAP_EFINISHED) /* a member that died never filled its place */
        rc = ATAP_EFAILED;
    if (expect(d, kind, "atap_join_for", rc, 0) == 0 && out_ok(&o, tag, kind)) {
        bool good;
        if (all) {
            uint64_t acc = tag;
            for (size_t i = 0; i < n; i++)
                acc = mix64(acc ^ mt[i]);
            good = o.val == acc;
        } else {
            good = false;
            for (size_t i = 0; i < n; i++)
                good = good || o.val == mt[i];
        }
        if (!good)
            fail(&g_crossed, "%s: an output from members not its own", kind);
    }
    if (!all) /* let it see every member out, so it finishes */
        wait_finished(r, kind);
    atap_release(r);
out:
    for (size_t i = 0; i < made; i++) {
        if (all || rnd_in(&d->rng, 0, 1)) {
            out3 mo;
            if (EXPECT(d, kind, atap_join_for(m[i], &mo, sizeof mo, STALL_NS), 0) == 0)
                out_ok(&mo, mt[i], kind);
        }
        atap_release(m[i]);
    }
}

/* ---- K_CHAN: channel send and receive tasks ----------------------------------------- */

static void count_elem_free(void *v)
{
    (void)v;
    atomic_fetch_add(&g_elem_frees, 1);
}

static void do_chan(driver *d)
{
    enum { MAXN = 6 };
    size_t n = (size_t)rnd_in(&d->rng, 1, MAXN), cap = (size_t)rnd_in(&d->rng, 0, 3);
    atap_chan *ch;
    atap_task snd[MAXN], rcv[MAXN];
    uint64_t tags[MAXN];
    bool got[MAXN] = {false};
    size_t ns = 0, nr = 0;

    if (atap_chan_open(&ch, sizeof(out3), cap, count_elem_free) != 0) {
        fail(&g_failures, "chan: open");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        tags[i] = new_tag(d);
        out3 v = out_make(tags[i], i);
        if (atap_chan_spawn_send(&snd[ns], ch, &v, NULL) == 0) {
            ns++;
            atomic_fetch_add(&g_elems_made, 1);
        }
        if (atap_chan_spawn_recv(&rcv[nr], ch, &(atap_spawn_opts){.out_size = sizeof(out3)}) == 0)
            nr++;
    }
    if (ns != n || nr != n)
        fail(&g_failures, "chan: spawn of %zu sends, %zu receives, wanted %zu", ns, nr, n);
    atap_chan_close_sender(ch);
    bool hit = false;
    for (size_t i = 0; i < ns; i++) {
        int rc = atap_join_for(snd[i], NULL, 0, STALL_NS);
        if (rc == ATAP_EFAILED && died_since(d->deaths0, rc)) {
            hit = true;
            atomic_fetch_add(&g_elems_owed, 1); /* a copy never sent: elem_free at release */
        } else if (expect(d, "chan", "atap_join_for (send)", rc, 0) != 0) {
            hit = true;
        }
    }
    for (size_t i = 0; i < nr; i++) {
        out3 o;
        int rc = atap_take_for(rcv[i], &o, sizeof o, hit ? ATAP_MS(200) : STALL_NS);
        if (rc == 0) {
            size_t k = 0;
            atomic_fetch_add(&g_checked, 1);
            if (o.sum != out_sum(o.tag, o.val) || o.val >= n || tags[o.val] != o.tag) {
                fail(&g_crossed, "chan: a value no send of this channel sent");
                continue;
            }
            k = (size_t)o.val;
            if (got[k])
                fail(&g_failures, "chan: value %zu received twice", k);
            got[k] = true;
        } else if (hit &&
                   (rc == ATAP_ENOTREADY || rc == ATAP_ECLOSED || died_since(d->deaths0, rc))) {
            atap_cancel(rcv[i]);
        } else if (!hit && died_since(d->deaths0, rc)) {
            hit = true; /* a receive whose thread died may have taken its value with it */
        } else {
            expect(d, "chan", "atap_join_for (receive)", rc, 0);
        }
    }
    if (!hit)
        for (size_t i = 0; i < n; i++)
            if (!got[i])
                fail(&g_failures, "chan: value %zu lost", i);
    for (size_t i = 0; i < ns; i++)
        atap_release(snd[i]);
    for (size_t i = 0; i < nr; i++)
        atap_release(rcv[i]);
    atap_chan_close_receiver(ch);
}

/* ---- K_PARK_FD: a park on a pipe; K_PARK_UNTIL: a park on a deadline ------------- */

typedef struct park_item {
    uint64_t tag;
    int fd;
    uint64_t timeout;
    atomic_u64 parked_at, deadline;
    atomic_int bad;
} park_item;

static int task_park_fd(atap_ctx *ctx, void *arg, void *out)
{
    park_item *p = arg;
    if (atap_resumed(ctx)) {
        uint64_t now = now_ns();
        if (atap_resume_reason(ctx) == ATAP_RESUME_READY) {
            char c;
            if (read(p->fd, &c, 1) == 1) {
                out3 o = out_make(p->tag, 1);
                memcpy(out, &o, sizeof o);
                return 0;
            } /* spurious: a hint, park again */
        } else {
            if (p->timeout == ATAP_FOREVER || now < atomic_load(&p->parked_at) + p->timeout)
                atomic_store(&p->bad, 1);
            out3 o = out_make(p->tag, 2);
            memcpy(out, &o, sizeof o);
            return 0;
        }
    }
    atomic_store(&p->parked_at, now_ns());
    if (atap_park_fd(ctx, p->fd, ATAP_READABLE, p->timeout) != 0)
        return -1;
    return ATAP_PARKED;
}

static void do_park_fd(driver *d)
{
    int fds[2];
    park_item *p = calloc(1, sizeof *p);
    if (p == NULL)
        return;
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        fail(&g_failures, "park_fd: pipe: %s", strerror(errno));
        free(p);
        return;
    }
    p->tag = new_tag(d);
    p->fd = fds[0];
    p->timeout = rnd_in(&d->rng, 0, 1) ? ATAP_FOREVER : rnd_in(&d->rng, ATAP_MS(1), ATAP_MS(4));
    atap_task t;
    out3 o;
    if (atap_spawn(&t, task_park_fd, p,
                   &(atap_spawn_opts){.out_size = sizeof(out3), .arg_free = free}) != 0) {
        fail(&g_failures, "park_fd: spawn");
        free(p);
        close(fds[0]);
        close(fds[1]);
        return;
    }
    sleep_ns(rnd_in(&d->rng, 0, ATAP_MS(3)));
    if (write(fds[1], "x", 1) != 1)
        fail(&g_failures, "park_fd: write");
    if (EXPECT(d, "park_fd", atap_join_for(t, &o, sizeof o, STALL_NS), 0) == 0 &&
        out_ok(&o, p->tag, "park_fd")) {
        if (o.val == 2 && atomic_load(&p->bad))
            fail(&g_early, "park_fd: a deadline resume before its timeout");
    }
    atap_release(t); /* p may be gone from here */
    close(fds[0]);
    close(fds[1]);
}

static int task_park_until(atap_ctx *ctx, void *arg, void *out)
{
    park_item *p = arg;
    if (atap_resumed(ctx)) {
        out3 o = out_make(p->tag, now_ns());
        memcpy(out, &o, sizeof o);
        return 0;
    }
    uint64_t at = now_ns() + p->timeout;
    atomic_store(&p->deadline, at);
    return atap_park_until(ctx, at) == 0 ? ATAP_PARKED : -1;
}

static void do_park_until(driver *d)
{
    park_item *p = calloc(1, sizeof *p);
    if (p == NULL)
        return;
    p->tag = new_tag(d);
    p->timeout = rnd_in(&d->rng, ATAP_US(100), ATAP_MS(5));
    atap_task t;
    out3 o;
    if (atap_spawn(&t, task_park_until, p, &(atap_spawn_opts){.out_size = sizeof(out3)}) != 0) {
        fail(&g_failures, "park_until: spawn");
        free(p);
        return;
    }
    if (EXPECT(d, "park_until", atap_join_for(t, &o, sizeof o, STALL_NS), 0) == 0 &&
        out_ok(&o, p->tag, "park_until") && o.val < atomic_load(&p->deadline))
        early("a park deadline", o.val, atomic_load(&p->deadline));
    atap_release(t); /* settled and released: no run touches p any more */
    free(p);
}

/* ---- K_SLEEP: the sleep task ----------------------------------------------------------- */

static void do_sleep_task(driver *d)
{
    uint64_t ns = rnd_in(&d->rng, ATAP_US(100), ATAP_MS(5)), slept = 0;
    atap_task t;
    uint64_t t0 = now_ns();
    if (atap_spawn_sleep(&t, ns, rnd_in(&d->rng, 0, 1) != 0, NULL) != 0) {
        fail(&g_failures, "sleep: spawn");
        return;
    }
    if (EXPECT(d, "sleep", atap_join_for(t, &slept, sizeof slept, STALL_NS), 0) == 0) {
        uint64_t t1 = now_ns();
        atomic_fetch_add(&g_checked, 1);
        if (slept < ns)
            early("a sleep task's reported sleep", slept, ns);
        else if (t1 < t0 + ns)
            early("a sleep task", t1, t0 + ns);
    }
    atap_release(t);
}

/* ---- K_TREE: tasks that spawn children and join them --------------------------------- */

typedef struct tree_node {
    uint64_t tag;
    unsigned depth;
} tree_node;

static uint64_t tree_val(uint64_t tag, unsigned depth)
{
    if (depth == 0)
        return mix64(tag);
    return mix64(tree_val(tag * 2 + 1, depth - 1) ^ (tree_val(tag * 2 + 2, depth - 1) << 1) ^ tag);
}

/* The children a running node holds. A thread that dies inside it leaves
 * through pthread_exit, which runs this cleanup: the handles go back. */
typedef struct tree_frame {
    atap_task kid[2];
} tree_frame;

static void tree_unwind(void *arg)
{
    tree_frame *f = arg;
    for (int i = 0; i < 2; i++)
        atap_release(f->kid[i]);
}

static int task_tree(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    const tree_node *n = arg;
    if (n->depth == 0) {
        out3 o = out_make(n->tag, mix64(n->tag));
        memcpy(out, &o, sizeof o);
        return 0;
    }
    tree_frame f = {{ATAP_NO_TASK, ATAP_NO_TASK}};
    int rc = 0;
    uint64_t v[2] = {0, 0};
    pthread_cleanup_push(tree_unwind, &f);
    for (int i = 0; i < 2 && rc == 0; i++) {
        tree_node *c = malloc(sizeof *c);
        if (c == NULL) {
            rc = -1;
            break;
        }
        c->tag = n->tag * 2 + 1 + (uint64_t)i;
        c->depth = n->depth - 1;
        if (atap_spawn(&f.kid[i], task_tree, c,
                       &(atap_spawn_opts){.out_size = sizeof(out3), .arg_free = free}) != 0) {
            free(c);
            rc = -1;
        }
    }
    for (int i = 0; i < 2 && rc == 0; i++) {
        out3 o;
        uint64_t want = n->tag * 2 + 1 + (uint64_t)i;
        rc = atap_join_for(f.kid[i], &o, sizeof o, STALL_NS);
        if (rc == ATAP_ENOTREADY)
            fail(&g_stalls, "tree: STALLED: a child not settled within 10 s");
        if (rc == 0 && (o.sum != out_sum(o.tag, o.val) || o.tag != want)) {
            fail(&g_crossed, "tree: a child's output is not its own");
            rc = -1;
        }
        v[i] = o.val;
    }
    pthread_cleanup_pop(1);
    if (rc != 0)
        return rc == ATAP_ENOTREADY ? -1 : rc;
    out3 o = out_make(n->tag, mix64(v[0] ^ (v[1] << 1) ^ n->tag));
    memcpy(out, &o, sizeof o);
    return 0;
}

static void do_tree(driver *d)
{
    tree_node *n = malloc(sizeof *n);
    if (n == NULL)
        return;
    n->tag = new_tag(d) >> 8; /* room for the children's tags below */
    n->depth = (unsigned)rnd_in(&d->rng, 1, 4);
    uint64_t tag = n->tag, want = tree_val(n->tag, n->depth);
    atap_task t;
    out3 o;
    if (atap_spawn(&t, task_tree, n,
                   &(atap_spawn_opts){.out_size = sizeof(out3), .arg_free = free}) != 0) {
        fail(&g_failures, "tree: spawn");
        free(n);
        return;
    }
    if (EXPECT(d, "tree", atap_join_for(t, &o, sizeof o, STALL_NS), 0) == 0 &&
        out_ok(&o, tag, "tree") && o.val != want)
        fail(&g_crossed, "tree: a value from other children");
    atap_release(t);
}

/* ---- the drivers ------------------------------------------------------------------------ */

enum kind {
    K_ONCE,
    K_AFTER,
    K_TIMEOUT,
    K_CANCEL,
    K_REPEAT,
    K_RATE,
    K_GIVE,
    K_RALL,
    K_RANY,
    K_CHAN,
    K_PARK_FD,
    K_PARK_UNTIL,
    K_SLEEP,
    K_TREE,
    K_COUNT
};

/* Between operations: stay put while a checkpoint wants the load paused. */
static void pause_point(void)
{
    if (!atomic_load(&g_pause))
        return;
    atomic_fetch_add(&g_paused, 1);
    while (atomic_load(&g_pause) && !atomic_load(&g_stop))
        sleep_ns(ATAP_MS(1));
    atomic_fetch_sub(&g_paused, 1);
}

static void *driver_main(void *arg)
{
    driver *d = arg;
    while (!atomic_load(&g_stop)) {
        pause_point();
        d->deaths0 = pool_deaths();
        switch ((enum kind)rnd_in(&d->rng, 0, K_COUNT - 1)) {
        case K_ONCE:
            do_once(d);
            break;
        case K_AFTER:
            do_after(d);
            break;
        case K_TIMEOUT:
            do_timeout(d);
            break;
        case K_CANCEL:
            do_cancel(d);
            break;
        case K_REPEAT:
            do_series(d, false);
            break;
        case K_RATE:
            do_series(d, true);
            break;
        case K_GIVE:
            do_give(d);
            break;
        case K_RALL:
            do_receive(d, true);
            break;
        case K_RANY:
            do_receive(d, false);
            break;
        case K_CHAN:
            do_chan(d);
            break;
        case K_PARK_FD:
            do_park_fd(d);
            break;
        case K_PARK_UNTIL:
            do_park_until(d);
            break;
        case K_SLEEP:
            do_sleep_task(d);
            break;
        default:
            do_tree(d);
            break;
        }
        atomic_fetch_add(&g_ops, 1);
    }
    return NULL;
}

/* ---- the echo server: a parked listener, a parked task per connection ----------------- */

static int g_listen_fd = -1;
static int g_port;

typedef struct conn {
    int fd;
    size_t off, len; /* bytes of buf still to write back */
    unsigned char buf[4096];
} conn;

static void conn_free(void *arg)
{
    conn *c = arg;
    close(c->fd);
    free(c);
}

static int park_or_fail(atap_ctx *ctx, int fd, unsigned events, uint64_t timeout)
{
    return atap_park_fd(ctx, fd, events, timeout) == 0 ? ATAP_PARKED : -1;
}

static int task_conn(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    conn *c = arg;
    for (int round = 0; round < 64; round++) {
        while (c->off < c->len) {
            ssize_t w = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return park_or_fail(ctx, c->fd, ATAP_WRITABLE, ATAP_FOREVER);
                return 0; /* the client went */
            }
            c->off += (size_t)w;
        }
        ssize_t r = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (r == 0)
            return 0;
        if (r < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK
                       ? park_or_fail(ctx, c->fd, ATAP_READABLE, ATAP_FOREVER)
                       : 0;
        c->off = 0;
        c->len = (size_t)r;
    }
    return atap_park_until(ctx, 0) == 0 ? ATAP_PARKED : -1; /* let others run, then go on */
}

static int task_listener(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    (void)out;
    for (;;) {
        int fd = accept4(g_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return park_or_fail(ctx, g_listen_fd, ATAP_READABLE, ATAP_FOREVER);
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            fail(&g_failures, "server: accept: %s", strerror(errno));
            return park_or_fail(ctx, g_listen_fd, ATAP_READABLE, ATAP_MS(100));
        }
        conn *c = calloc(1, sizeof *c);
        atap_task t;
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        int rc = atap_spawn(&t, task_conn, c, &(atap_spawn_opts){.arg_free = conn_free});
        if (rc != 0) {
            fail(&g_failures, "server: spawn of a connection: %s", atap_strerror(rc));
            conn_free(c);
            continue;
        }
        atap_release(t);
    }
}

static int open_listener(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 256) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("soak: listening socket");
        return -1;
    }
    g_listen_fd = fd;
    g_port = ntohs(a.sin_port);
    return 0;
}

/* The server thread: keeps a listener task parked; one its thread died
 * under reads ATAP_EFAILED and is started again. */
static atomic_u64 g_listener_restarts;
static pthread_t g_server_th;

static void *server_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_server_stop)) {
        atap_task t;
        uint64_t deaths0 = pool_deaths();
        int rc = atap_spawn(&t, task_listener, NULL, NULL);
        if (rc != 0) {
            fail(&g_failures, "server: spawn of the listener: %s", atap_strerror(rc));
            sleep_ns(ATAP_MS(100));
            continue;
        }
        while (!atomic_load(&g_server_stop) &&
               (rc = atap_join_for(t, NULL, 0, ATAP_MS(100))) == ATAP_ENOTREADY) {
        }
        if (atomic_load(&g_server_stop)) {
            atap_cancel(t);
            atap_join_for(t, NULL, 0, STALL_NS);
        } else if (!died_since(deaths0, rc)) {
            fail(&g_failures, "server: the listener ended: %s", atap_strerror(rc));
        } else {
            atomic_fetch_add(&g_listener_restarts, 1);
        }
        atap_release(t);
    }
    return NULL;
}

/* ---- the clients ------------------------------------------------------------------------ */

typedef struct client {
    int id;
    uint64_t rng, seq;
    pthread_t th;
} client;

static unsigned char payload_byte(uint64_t tag, size_t i)
{
    return (unsigned char)(mix64(tag + i / 8) >> (8 * (i % 8)));
}

/* Sends everything; false on a broken connection. */
static bool send_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* One connection: a few payloads, each a header (tag, length) then bytes of
 * the tag's pattern, every byte read back and compared. Returns 0, 1 for a
 * connection that broke (a death may explain it), -1 for a failure. */
static int client_exchange(client *c, uint64_t deaths0)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)g_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {10, 0};
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fail(&g_failures, "client: connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    int result = 0;
    unsigned msgs = (unsigned)rnd_in(&c->rng, 1, 6);
    static _Thread_local unsigned char out[16 + 16384], in[16 + 16384];
    for (unsigned m = 0; m < msgs && result == 0; m++) {
        uint64_t tag = ((uint64_t)(c->id + 1) << 56) | ++c->seq;
        size_t len = (size_t)rnd_in(&c->rng, 1, 16384);
        memcpy(out, &tag, 8);
        uint64_t l64 = len;
        memcpy(out + 8, &l64, 8);
        for (size_t i = 0; i < len; i++)
            out[16 + i] = payload_byte(tag, i);
        if (!send_all(fd, out, 16 + len)) {
            result = 1;
            break;
        }
        size_t got = 0;
        while (got < 16 + len) {
            ssize_t r = recv(fd, in + got, 16 + len - got, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                fail(&g_stalls, "client: STALLED: no echo within 10 s (%zu of %zu bytes)", got,
                     16 + len);
                result = -1;
                break;
            }
            if (r <= 0) {
                result = 1;
                break;
            }
            got += (size_t)r;
        }
        if (result != 0)
            break;
        atomic_fetch_add(&g_checked, 1);
        if (memcmp(in, out, 16 + len) != 0) {
            uint64_t t2;
            memcpy(&t2, in, 8);
            fail(&g_crossed,
                 "client: echo of %zu bytes differs (tag %#" PRIx64 ", sent %#" PRIx64 ")", len, t2,
                 tag);
            result = -1;
        }
    }
    close(fd);
    if (result == 1) {
        if (died_since(deaths0, ATAP_EFAILED))
            return 1;
        fail(&g_failures, "client: the server broke the connection with no thread death");
        return -1;
    }
    return result;
}

static void *client_main(void *arg)
{
    client *c = arg;
    while (!atomic_load(&g_stop)) {
        pause_point();
        client_exchange(c, pool_deaths());
        atomic_fetch_add(&g_ops, 1);
    }
    return NULL;
}

/* ---- the killer and the reaper ------------------------------------------------------------ */

/* Sleeps up to ns, in steps, while the run goes on and is not paused. */
static void nap(uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    while (!atomic_load(&g_stop) && now_ns() < end) {
        pause_point();
        sleep_ns(ATAP_MS(20));
    }
}

static void *killer_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        nap(KILL_EVERY_NS);
        if (atomic_load(&g_stop))
            break;
        unsigned before = atap__manager_restarts();
        atap_inject_manager_faults(1);
        atomic_fetch_add(&g_kills, 1);
        uint64_t end = now_ns() + STALL_NS;
        while (atap__manager_restarts() <= before) {
            if (now_ns() > end) {
                fail(&g_stalls, "killer: STALLED: the manager did not die and restart within 10 s");
                break;
            }
            sleep_ns(ATAP_MS(1));
        }
    }
    return NULL;
}

static int task_poke(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    (void)out;
    return 0;
}

static void *reaper_main(void *arg)
{
    (void)arg;
    for (unsigned round = 1; !atomic_load(&g_stop); round++) {
        nap(REAP_EVERY_NS);
        if (atomic_load(&g_stop))
            break;
        unsigned blocking = round % 3 == 0;
        /* An idle thread takes an owed death first. Aim, up to 300 ms, for a
         * moment when every thread of the kind is inside a task, so that a
         * death may land holding one (its task then reads ATAP_EFAILED). */
        uint64_t aim_end = now_ns() + ATAP_MS(300);
        while (now_ns() < aim_end) {
            struct atap_pool_stats st = pool_stats();
            if (blocking ? st.blocking_threads > 0 && st.blocking_busy >= st.blocking_threads
                         : st.workers > 0 && st.busy >= st.workers)
                break;
            sleep_ns(ATAP_US(50));
        }
        uint64_t before = pool_deaths(), want = before + 1 + blocking;
        uint64_t end = now_ns() + STALL_NS, poke = now_ns() + ATAP_MS(100);
        atap_inject_thread_deaths(1, blocking);
        atomic_fetch_add(&g_deaths, 1 + blocking);
        while (pool_deaths() < want) {
            if (now_ns() > end) {
                fail(&g_stalls, "reaper: STALLED: %u deaths owed, %" PRIu64 " counted within 10 s",
                     1 + blocking, pool_deaths() - before);
                break;
            }
            if (now_ns() > poke) { /* give an owed death a thread to take it */
                atap_task t;
                if (atap_spawn(&t, task_poke, NULL,
                               &(atap_spawn_opts){.blocking = blocking != 0}) == 0) {
                    atap_join_for(t, NULL, 0, STALL_NS);
                    atap_release(t);
                }
                poke = now_ns() + ATAP_MS(100);
            }
            sleep_ns(ATAP_MS(1));
        }
    }
    return NULL;
}

/* ---- the watchdog ---------------------------------------------------------------------------- */

static void report(const char *label, long rss_kib, long fds, long anon, size_t live);

static void *watchdog_main(void *arg)
{
    (void)arg;
    uint64_t last = atomic_load(&g_ops), moved = now_ns();
    while (!atomic_load(&g_stop)) {
        sleep_ns(ATAP_MS(200));
        uint64_t ops = atomic_load(&g_ops);
        if (ops != last || atomic_load(&g_pause)) {
            last = ops;
            moved = now_ns();
        } else if (now_ns() - moved > STALL_NS) {
            atomic_fetch_add(&g_stalls, 1);
            char line[512];
            atap_stats_format(line, sizeof line, NULL);
            fprintf(stderr, "soak: STALLED: no operation completed for 10 s; pool: %s\n", line);
            report("stalled", -1, -1, -1, pool_stats().live);
            fflush(NULL);
            _exit(2); /* what is stuck would never let a clean exit through */
        }
    }
    return NULL;
}

/* ---- measuring
 * ----------------------------------------------------------------------------------- */

static long rss_kib(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Open fds: all of them, and in *anon those that are the kernel's own
 * objects (epoll, eventfd: the pollers, two fds each, one for the manager
 * and one for each pool thread's record that made a kernel wait; a record
 * keeps its poller for the next thread on it, so their count follows the
 * most threads there have been, not those alive now). */
static long open_fds(long *anon)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    long n = 0;
    *anon = 0;
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        char path[300], to[64];
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        n++;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, to, sizeof to - 1);
        if (len > 0 && (size_t)len >= strlen("anon_inode:") && memcmp(to, "anon_inode:", 11) == 0)
            (*anon)++;
    }
    closedir(d);
    return n;
}

static uint64_t g_start;
static double g_minutes;

static void report(const char *label, long rss, long fds, long anon, size_t live)
{
    struct atap_pool_stats st = pool_stats();
    printf("soak: %s %.1f min: ops=%" PRIu64 " checked=%" PRIu64 " crossed=%" PRIu64
           " early=%" PRIu64 " stalls=%" PRIu64 " failures=%" PRIu64
           " live=%zu rss_kib=%ld fds=%ld (pollers %ld)"
           " kills=%" PRIu64 " deaths=%" PRIu64 " died_ok=%" PRIu64 " workers=%zu records=%u\n",
           label, (double)(now_ns() - g_start) / 60e9, atomic_load(&g_ops), atomic_load(&g_checked),
           atomic_load(&g_crossed), atomic_load(&g_early), atomic_load(&g_stalls),
           atomic_load(&g_failures), live, rss, fds, anon, atomic_load(&g_kills),
           atomic_load(&g_deaths), atomic_load(&g_died_ok), st.workers, atap__pool_records());
    fflush(stdout);
}

typedef struct checkpoint {
    long rss, fds, anon;
    size_t records; /* the pool's thread records, each of which may keep a poller */
    size_t live;
    bool quiet;
} checkpoint;

/* Pauses the load, lets the pool go quiet, measures, prints, resumes. */
static checkpoint take_checkpoint(const char *label, unsigned base_workers, int threads)
{
    checkpoint c = {0};
    atomic_store(&g_pause, 1);
    uint64_t end = now_ns() + 2 * STALL_NS;
    while (atomic_load(&g_paused) < threads && !atomic_load(&g_stop)) {
        if (now_ns() > end) {
            fail(&g_stalls, "checkpoint: STALLED: %d of %d threads paused within 20 s",
                 atomic_load(&g_paused), threads);
            break;
        }
        sleep_ns(ATAP_MS(1));
    }
    /* Quiet: only the listener left, no extra thread (each pool thread may
     * hold fds of its own for its kernel waits), the values all freed. */
    end = now_ns() + QUIET_WAIT_NS;
    for (;;) {
        struct atap_pool_stats st = pool_stats();
        c.quiet = st.live <= 1 && st.busy == 0 && st.blocking_threads == 0 &&
                  st.workers <= base_workers &&
                  atomic_load(&g_in_frees) == atomic_load(&g_gives_owed) &&
                  atomic_load(&g_elem_frees) >= atomic_load(&g_elems_owed);
        if (c.quiet || now_ns() > end)
            break;
        sleep_ns(ATAP_MS(10));
    }
    c.rss = rss_kib();
    c.fds = open_fds(&c.anon);
    struct atap_pool_stats st = pool_stats();
    c.live = st.live;
    /* The workers' records as the pool counts them; the blocking threads'
     * (not exposed) at most their cap and two more: a dying thread's
     * replacement may be started from the dying thread, which cannot hand
     * over its own record. */
    c.records = atap__pool_records() + BLOCKING_THREADS + 2;
    report(label, c.rss, c.fds, c.anon, c.live);
    if (!c.quiet) {
        char line[512];
        atap_stats_format(line, sizeof line, NULL);
        printf("soak: %s: not quiet within %u s: %s in_frees=%" PRIu64 "/%" PRIu64
               " elem_frees=%" PRIu64 "/%" PRIu64 "\n",
               label, (unsigned)(QUIET_WAIT_NS / 1000000000u), line, atomic_load(&g_in_frees),
               atomic_load(&g_gives_owed), atomic_load(&g_elem_frees), atomic_load(&g_elems_owed));
    }
    atomic_store(&g_pause, 0);
    return c;
}

int main(int argc, char **argv)
{
    g_minutes = argc > 1 ? strtod(argv[1], NULL) : 0;
    if (argc != 2 || !(g_minutes > 0)) {
        fprintf(stderr, "usage: soak MINUTES   (fractions allowed)\n");
        return 2;
    }
    const char *s = getenv("SOAK_SEED");
    uint64_t seed = s != NULL && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
    const unsigned base_workers = BASE_WORKERS;
    int rc = atap_init(&(atap_config){.size = sizeof(atap_config),
                                      .workers = base_workers,
                                      .blocking_threads = BLOCKING_THREADS});
    if (rc != 0) {
        fprintf(stderr, "soak: atap_init: %s\n", atap_strerror(rc));
        return 1;
    }
    atap__test_restart_window(0); /* the supervisor restarts the manager every time */
    if (open_listener() != 0)
        return 1;
    printf("soak: %.2f minutes, seed %" PRIu64 ", %d drivers, %d clients, echo server on port %d\n",
           g_minutes, seed, N_DRIVERS, N_CLIENTS, g_port);
    fflush(stdout);

    g_start = now_ns();
    static driver drivers[N_DRIVERS];
    static client clients[N_CLIENTS];
    pthread_t killer, reaper, watchdog;
    pthread_create(&g_server_th, NULL, server_main, NULL);
    for (int i = 0; i < N_DRIVERS; i++) {
        drivers[i].id = i;
        drivers[i].rng = mix64(seed + (uint64_t)i);
        pthread_create(&drivers[i].th, NULL, driver_main, &drivers[i]);
    }
    for (int i = 0; i < N_CLIENTS; i++) {
        clients[i].id = 100 + i;
        clients[i].rng = mix64(seed ^ (0xC1u + (uint64_t)i));
        pthread_create(&clients[i].th, NULL, client_main, &clients[i]);
    }
    pthread_create(&killer, NULL, killer_main, NULL);
    pthread_create(&reaper, NULL, reaper_main, NULL);
    pthread_create(&watchdog, NULL, watchdog_main, NULL);
    const int paused_threads = N_DRIVERS + N_CLIENTS + 2;

    uint64_t end = g_start + (uint64_t)(g_minutes * 60e9);
    checkpoint first = {0}, second = {0}, last = {0};
    int n = 0;
    for (unsigned minute = 1;; minute++) {
        uint64_t at = g_start + (uint64_t)minute * ATAP_SEC(60);
        bool final = at >= end;
        if (final)
            at = end;
        while (now_ns() < at)
            sleep_ns(ATAP_MS(100));
        char label[32];
        snprintf(label, sizeof label, final ? "end" : "minute %u", minute);
        last = take_checkpoint(label, base_workers, paused_threads);
        if (++n == 1)
            first = last;
        else if (n == 2)
            second = last;
        if (final)
            break;
    }

    atomic_store(&g_stop, 1);
    for (int i = 0; i < N_DRIVERS; i++)
        pthread_join(drivers[i].th, NULL);
    for (int i = 0; i < N_CLIENTS; i++)
        pthread_join(clients[i].th, NULL);
    atomic_store(&g_server_stop, 1); /* only now: a client may be mid-exchange until it stops */
    pthread_join(killer, NULL);
    pthread_join(reaper, NULL);
    pthread_join(g_server_th, NULL);
    pthread_join(watchdog, NULL);

    /* Flat after warm-up: against the 2nd minute (the 1st on a short run). */
    checkpoint base = n >= 3 ? second : first;
    bool flat = true;
    long rss_limit = base.rss + base.rss / 10 + (long)RSS_SLACK_KIB;
    if (last.rss > rss_limit) {
        printf("soak: RSS grew: %ld KiB, limit %ld KiB (baseline %ld)\n", last.rss, rss_limit,
               base.rss);
        flat = false;
    }
    /* Every fd but the pollers exactly as at the baseline; the pollers as
     * many fds each as at the baseline (two on epoll; a kqueue emulated in
     * user space, libkqueue, keeps more), for the manager and the thread
     * records at most. */
    long per_poller = (base.anon + (long)base.records) / ((long)base.records + 1);
    if (per_poller < 2)
        per_poller = 2;
    if (last.fds - last.anon != base.fds - base.anon ||
        last.anon > per_poller * ((long)last.records + 1)) {
        printf("soak: open fds moved: %ld (%ld pollers, %zu thread records), baseline %ld (%ld "
               "pollers)\n",
               last.fds, last.anon, last.records, base.fds, base.anon);
        flat = false;
    }
    if (last.live > base.live || last.live > 1) {
        printf("soak: live tasks grew: %zu, baseline %zu\n", last.live, base.live);
        flat = false;
    }
    if (atomic_load(&g_in_frees) != atomic_load(&g_gives_owed) ||
        atomic_load(&g_elem_frees) < atomic_load(&g_elems_owed) ||
        atomic_load(&g_elem_frees) > atomic_load(&g_elems_made)) {
        printf("soak: in_free %" PRIu64 " of %" PRIu64 ", elem_free %" PRIu64
               " of at least %" PRIu64 "\n",
               atomic_load(&g_in_frees), atomic_load(&g_gives_owed), atomic_load(&g_elem_frees),
               atomic_load(&g_elems_owed));
        flat = false;
    }
    uint64_t listener_restarts = atomic_load(&g_listener_restarts);
    alarm(60); /* a shutdown that never returns ends the run (SIGALRM), failed */
    rc = atap_shutdown();
    alarm(0);
    close(g_listen_fd);
    bool ok = flat && rc == 0 && atomic_load(&g_crossed) == 0 && atomic_load(&g_early) == 0 &&
              atomic_load(&g_stalls) == 0 && atomic_load(&g_failures) == 0;
    printf(
        "soak: %s: crossed=%" PRIu64 " early=%" PRIu64 " stalls=%" PRIu64 " failures=%" PRIu64
        " in all; baseline rss_kib=%ld fds=%ld (pollers %ld) live=%zu; listener restarted %" PRIu64
        " times; shutdown %s\n",
        ok ? "PASSED" : "FAILED", atomic_load(&g_crossed), atomic_load(&g_early),
        atomic_load(&g_stalls), atomic_load(&g_failures), base.rss, base.fds, base.anon, base.live,
        listener_restarts, atap_strerror(rc));
    return ok ? 0 : 1;
}

/*
 * timer_bench: the manager's timer structure (src/timer.c) on its own.
 *
 *   cost      TIMER_BENCH_N timers (default 1,000,000) at random deadlines
 *             1 s .. 10 min ahead, TIMER_BENCH_ROUNDS rounds (default 5),
 *             medians in ns per timer:
 *               arm_ns            arming (the inbox grows to N)
 *               absorb_ns         the manager's share of an arm: drain + file
 *               arm_pending_ns    re-arming each, N pending on the wheel
 *               reabsorb_ns       the manager's share of that: unlink + file
 *               disarm_ns         disarming each, N pending, in arming order
 *               disarm_random_ns  the same in random order (cache misses)
 *               drop_ns           the manager meeting the disarmed records
 *   lateness  TIMER_BENCH_LATE_N timers (default 100,000) due 1..100 ms
 *             after a start point (the peers' LCG), all armed before it, fired
 *             by a manager thread that sleeps with clock_nanosleep until the
 *             deadline run() returns: lateness (fire time - deadline) p50,
 *             p99, max, the share fired more than 1 ms late (as
 *             atap_bench timers reports it, end to end and fired), wall time from the start point
 * to the last fire, runs of the manager and its CPU use, and how late its sleeps returned (the OS's
 * share of the lateness), each the median of TIMER_BENCH_LATE_ROUNDS rounds (default 5); min is the
 * least of all rounds (never negative: never early). idle      TIMER_BENCH_LATE_N timers 5..10 min
 * away, the manager looping for TIMER_BENCH_IDLE_MS (default 2000): its CPU use in %.
 *
 * Output: one key=value line per figure.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "timer.h"

#define MS UINT64_C(1000000)
#define SEC (1000 * MS)
#define HUGE ((size_t)2 << 20)

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static size_t env_size(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long long v;

    if (s == NULL || *s == '\0')
        return dflt;
    v = strtoull(s, &end, 10);
    return end == s || v == 0 ? dflt : (size_t)v;
}

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- cost ------------------------------------------------------------------ */

static void no_fire(struct atap_timer *t) { (void)t; }

enum { ARM, ABSORB, ARM_PENDING, REABSORB, DISARM_RANDOM, DISARM, DROP, NFIG };
static const char *const fig_name[NFIG] = {"arm_ns",      "absorb_ns",        "arm_pending_ns",
                                           "reabsorb_ns", "disarm_random_ns", "disarm_ns",
                                           "drop_ns"};

struct cost {
    struct atap_timers *ts;
    struct atap_timer *t;
    uint64_t *deadline;
    uint32_t *perm;
    size_t n;
};

static double per(uint64_t start, size_t n) { return (double)(now_ns() - start) / (double)n; }

static void arm_all(struct cost *c, double *fig)
{
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < c->n; i++)
        (void)atap__timer_arm(c->ts, &c->t[i], c->deadline[i]);
    if (fig)
        *fig = per(t0, c->n);
}

static void run_timed(struct cost *c, uint64_t at, double *fig)
{
    uint64_t t0 = now_ns();
    (void)atap__timers_run(c->ts, at);
    if (fig)
        *fig = per(t0, c->n);
}

static void disarm_all(struct cost *c, const uint32_t *order, double *fig)
{
    uint64_t t0 = now_ns();
    size_t missed = 0;
    for (size_t i = 0; i < c->n; i++)
        missed += !atap__timer_disarm(c->ts, &c->t[order ? order[i] : i]);
    *fig = per(t0, c->n);
    if (missed)
        fprintf(stderr, "timer_bench: %zu disarms found nothing armed\n", missed);
}

static void cost_round(struct cost *c, uint64_t *seed, double *fig)
{
    uint64_t start = now_ns();

    atap__timers_init(c->ts, start);
    for (size_t i = 0; i < c->n; i++) {
        uint32_t j = (uint32_t)(rng(seed) % (i + 1)); /* Fisher-Yates, inside out */
        c->deadline[i] = start + SEC + rng(seed) % (599 * SEC);
        c->perm[i] = c->perm[j];
        c->perm[j] = (uint32_t)i;
    }
    arm_all(c, &fig[ARM]);
    run_timed(c, start, &fig[ABSORB]);
    arm_all(c, &fig[ARM_PENDING]);
    run_timed(c, start, &fig[REABSORB]);
    disarm_all(c, c->perm, &fig[DISARM_RANDOM]);
    arm_all(c, NULL);
    run_timed(c, start, NULL);
    disarm_all(c, NULL, &fig[DISARM]);
    run_timed(c, start + 11 * 60 * SEC, &fig[DROP]);
    if (atap__timers_pending(c->ts) != 0)
        fprintf(stderr, "timer_bench: %zu left pending\n", atap__timers_pending(c->ts));
    atap__timers_destroy(c->ts);
}

static int bench_cost(size_t n, size_t rounds)
{
    struct cost c = {malloc(sizeof *c.ts), calloc(n, sizeof *c.t), malloc(n * sizeof *c.deadline),
                     malloc(n * sizeof *c.perm), n};
    double *fig = calloc(rounds * NFIG, sizeof *fig), *col = calloc(rounds, sizeof *col);
    uint64_t seed = 12345;

    if (!c.ts || !c.t || !c.deadline || !c.perm || !fig || !col) {
        fprintf(stderr, "timer_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        atap__timer_init(&c.t[i], no_fire);
    for (size_t r = 0; r < rounds; r++)
        cost_round(&c, &seed, fig + r * NFIG);
    for (int f = 0; f < NFIG; f++) {
        for (size_t r = 0; r < rounds; r++)
            col[r] = fig[r * NFIG + (size_t)f];
        printf("%s=%.1f\n", fig_name[f], median(col, rounds));
    }
    free(col);
    free(fig);
    free(c.perm);
    free(c.deadline);
    free(c.t);
    free(c.ts);
    return 0;
}

/* ---- lateness and idle ------------------------------------------------------- */

/* 64 bytes, allocated 64-aligned: a record and its deadline in one line,
 * as a record embedded in a task slot's extension data would be. */
struct late_timer {
    struct atap_timer t;
    uint64_t deadline;
};
_Static_assert(sizeof(struct late_timer) == 64, "a late_timer is one cache line");

struct manager {
    struct atap_timers ts;
    size_t target;  /* stop once this many fired... */
    uint64_t until; /* ...or at this time */
    size_t fired, runs;
    uint64_t cpu_ns;         /* the manager thread's CPU time */
    int64_t oversleep[4096]; /* how late each sleep returned: the OS's share */
    size_t sleeps;
};

static struct manager g_mgr; /* the fire callback runs on its thread */
static struct late_timer *g_late_base;
static int64_t *g_late; /* lateness of g_late_base[i] */

static void late_fire(struct atap_timer *t)
{
    struct late_timer *x = (struct late_timer *)((char *)t - offsetof(struct late_timer, t));
    g_late[x - g_late_base] = (int64_t)(now_ns() - x->deadline);
    g_mgr.fired++;
}

static void sleep_until(uint64_t when)
{
    struct timespec ts = {.tv_sec = (time_t)(when / SEC), .tv_nsec = (long)(when % SEC)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* The manager loop: run, sleep until the deadline it returns. (The real one
 * sleeps in the poller, which an arm that returns true wakes; here
 * everything is armed before the loop starts, so nothing needs to.) */
static void *manager_main(void *arg)
{
    struct manager *m = arg;

    for (;;) {
        uint64_t next = atap__timers_run(&m->ts, now_ns());
        m->runs++;
        if (m->fired >= m->target || now_ns() >= m->until)
            break;
        next = next < m->until ? next : m->until;
        sleep_until(next);
        if (m->sleeps < sizeof m->oversleep / sizeof m->oversleep[0])
            m->oversleep[m->sleeps++] = (int64_t)(now_ns() - next);
    }
    m->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

static int manager_run(void)
{
    pthread_t th;

    if (pthread_create(&th, NULL, manager_main, &g_mgr) != 0)
        return -1;
    return pthread_join(th, NULL);
}

/* The records on huge pages where the kernel allows, as libatap's slot
 * table maps its big blocks (100,000 records span 6 MiB: 4 KiB pages would
 * add a TLB miss to most touches). */
static struct late_timer *late_timers(size_t n)
{
    size_t bytes = (n * sizeof(struct late_timer) + HUGE - 1) / HUGE * HUGE;
    void *p = NULL;
    int64_t *late = calloc(n, sizeof *late);

    if (late == NULL || posix_memalign(&p, HUGE, bytes) != 0) {
        free(late);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    memset(p, 0, bytes);
    memset(late, 0xff, n * sizeof *late); /* fault it in now, not in the fires */
    g_late_base = p;
    g_late = late;
    return p;
}

enum { L_P50, L_P99, L_MAX, L_MIN, L_OVER, L_WALL, L_RUNS, L_CPU, L_WAKE50, L_WAKE99, NLATE };
static const char *const late_name[NLATE] = {
    "lateness_p50_us",           "lateness_p99_us",          "lateness_max_us", "lateness_min_us",
    "lateness_over_1ms_pct",     "lateness_wall_ms",         "lateness_runs",   "lateness_cpu_pct",
    "lateness_oversleep_p50_us", "lateness_oversleep_p99_us"};

static void late_figures(int64_t *late, size_t n, uint64_t wall, double *fig)
{
    qsort(late, n, sizeof *late, cmp_i64);
    fig[L_P50] = (double)late[n / 2] / 1e3;
    fig[L_P99] = (double)late[n * 99 / 100] / 1e3;
    fig[L_MAX] = (double)late[n - 1] / 1e3;
    fig[L_MIN] = (double)late[0] / 1e3;
    /* As atap_bench's timers workload reports it (fired_over_1ms_pct: the
     * manager's share there), so the two read side by side. */
    fig[L_OVER] = 0;
    for (size_t i = 0; i < n; i++)
        fig[L_OVER] += late[i] > 1000000;
    fig[L_OVER] = 100.0 * fig[L_OVER] / (double)n;
    fig[L_WALL] = (double)wall / 1e6;
    fig[L_RUNS] = (double)g_mgr.runs;
    fig[L_CPU] = 100.0 * (double)g_mgr.cpu_ns / (double)wall;
    fig[L_WAKE50] = fig[L_WAKE99] = 0;
    if (g_mgr.sleeps > 0) {
        qsort(g_mgr.oversleep, g_mgr.sleeps, sizeof(int64_t), cmp_i64);
        fig[L_WAKE50] = (double)g_mgr.oversleep[g_mgr.sleeps / 2] / 1e3;
        fig[L_WAKE99] = (double)g_mgr.oversleep[g_mgr.sleeps * 99 / 100] / 1e3;
    }
}

static int late_round(size_t n, double *fig)
{
    struct late_timer *x = late_timers(n);
    uint64_t seed = 12345, start;

    if (!x)
        return 1;
    memset(&g_mgr, 0, sizeof g_mgr);
    start = now_ns();
    atap__timers_init(&g_mgr.ts, start);
    start += 20 * MS; /* arming 100,000 takes a few ms: start after it */
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i].deadline = start + (1 + (seed >> 33) % 100) * MS; /* as the peers' LCG */
        atap__timer_init(&x[i].t, late_fire);
        (void)atap__timer_arm(&g_mgr.ts, &x[i].t, x[i].deadline);
    }
    g_mgr.target = n;
    g_mgr.until = UINT64_MAX;
    if (now_ns() > start)
        fprintf(stderr, "timer_bench: arming took past the start point\n");
    if (manager_run() != 0 || g_mgr.fired != n)
        fprintf(stderr, "timer_bench: %zu of %zu fired\n", g_mgr.fired, n);
    late_figures(g_late, n, now_ns() - start, fig);
    atap__timers_destroy(&g_mgr.ts);
    free(g_late);
    free(x);
    return 0;
}

/* Medians over the rounds; min is the least of all. */
static int bench_lateness(size_t n, size_t rounds)
{
    double *fig = calloc(rounds * NLATE, sizeof *fig), *col = calloc(rounds, sizeof *col);
    double least = 0;

    if (!fig || !col || n == 0)
        return 1;
    for (size_t r = 0; r < rounds; r++)
        if (late_round(n, fig + r * NLATE) != 0)
            return 1;
    printf("lateness_n=%zu\nlateness_rounds=%zu\n", n, rounds);
    for (int f = 0; f < NLATE; f++) {
        for (size_t r = 0; r < rounds; r++)
            col[r] = fig[r * NLATE + (size_t)f];
        if (f == L_MIN) {
            least = col[0];
            for (size_t r = 1; r < rounds; r++)
                least = col[r] < least ? col[r] : least;
            printf("%s=%.1f\n", late_name[f], least);
        } else {
            printf("%s=%.1f\n", late_name[f], median(col, rounds));
        }
    }
    printf("lateness_never_early=%s\n", least >= 0 ? "yes" : "NO");
    free(col);
    free(fig);
    return 0;
}

static int bench_idle(size_t n, uint64_t ms)
{
    struct late_timer *x = late_timers(n);
    uint64_t seed = 777, start;

    if (!x)
        return 1;
    start = now_ns();
    memset(&g_mgr, 0, sizeof g_mgr);
    atap__timers_init(&g_mgr.ts, start);
    for (size_t i = 0; i < n; i++) {
        x[i].deadline = start + 300 * SEC + rng(&seed) % (300 * SEC);
        atap__timer_init(&x[i].t, late_fire);
        (void)atap__timer_arm(&g_mgr.ts, &x[i].t, x[i].deadline);
    }
    g_mgr.target = n;
    g_mgr.until = now_ns() + ms * MS;
    if (manager_run() != 0)
        return 1;
    printf("idle_pending=%zu\n", atap__timers_pending(&g_mgr.ts));
    printf("idle_runs=%zu\n", g_mgr.runs);
    printf("idle_cpu_pct=%.3f\n", 100.0 * (double)g_mgr.cpu_ns / (double)(ms * MS));
    atap__timers_destroy(&g_mgr.ts);
    free(g_late);
    free(x);
    return 0;
}

int main(void)
{
    size_t n = env_size("TIMER_BENCH_N", 1000000);
    size_t rounds = env_size("TIMER_BENCH_ROUNDS", 5);
    size_t late_n = env_size("TIMER_BENCH_LATE_N", 100000);
    size_t late_rounds = env_size("TIMER_BENCH_LATE_ROUNDS", 5);
    size_t idle_ms = env_size("TIMER_BENCH_IDLE_MS", 2000);

    printf("n=%zu\nrounds=%zu\n", n, rounds);
    if (bench_cost(n, rounds) != 0)
        return 1;
    if (bench_lateness(late_n, late_rounds) != 0)
        return 1;
    return bench_idle(late_n, idle_ms);
}

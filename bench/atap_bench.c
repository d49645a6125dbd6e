/* libatap on the comparison workloads of ../shared/bench-peers, written the
 * way the peer programs there are, and printing their one-line format
 * (common.h) with peer=atap.
 *
 * Usage: atap_bench <workload> [n]
 *   spawn_many   the main thread spawns n tasks (one relaxed atomic increment
 *                each), keeping the handles, then joins and releases them in
 *                order (as the tokio peer awaits its Vec<JoinHandle>)
 *   spawn_local  one task spawns n children, then joins and releases them
 *                (joining inside a task helps: the worker runs its children)
 *   fib          fib(n): each call with n >= 2 spawns fib(n-1) as a task,
 *                computes fib(n-2) inline, joins; no cutoff
 *   tree, wide_tree  the peers' unbalanced trees (common.h, README.md
 *                there; one code, the shape from common.h's tree_shape: a
 *                non-root node has 2 children or none in tree, 8 or none in
 *                wide_tree): a task per node, which does its work (32 rounds
 *                of splitmix64), spawns a task per child, joins and releases
 *                them, and outputs its subtree's {nodes, depth, checksum};
 *                the root, spawned by the main thread, has n children. A
 *                node joins its children in spawn order (as the peers do),
 *                or last-spawned first with TREE_JOIN=last_first.
 *                ns_per_op = seconds / nodes; extras nodes= depth=
 *                checksum= (as the peers'), join=spawn_order|last_first,
 *                peak_live= (the most live tasks, atap_pool_stats' live
 *                sampled every 1 ms during the run), peak_slots= and
 *                peak_workers= (the pool's peaks, read after the run)
 *   fan          (libatap only, not in the peers) one task spawns n children
 *                (default 5,000), each FAN_WORK rounds of splitmix64 (about
 *                20 us), then joins and releases them in spawn order.
 *                ns_per_op = seconds / n; extras workers= (the pool's
 *                workers after the warm-up: ATAP_WORKERS, or one per CPU)
 *                and checksum=. Run with ATAP_WORKERS=1 and 2 to compare
 *   chain        task i spawns task i+1 with no handle (atap_spawn_detached,
 *                as the peers keep none); task n signals the main thread
 *   live_memory  n tasks with an 8-byte output, all joined (settled) and still
 *                held by their handles; resident bytes per task
 *   timers       n tasks, each of which parks (atap_park_until) in its first
 *                run for 1..100 ms (the harness's LCG) from then; lateness
 *                = when its resumed run starts - (when it asked for the
 *                sleep + its delay), as the peers' workload defines it (a
 *                tokio task takes its deadline at its first poll); the last
 *                one signals the main thread. Extras: the same for the
 *                timers due after the last spawn (after_spawn_), the wait
 *                from the spawn to the first run (first_wait_), the share
 *                more than 1 ms late (over_1ms_pct), and the share the
 *                manager fired more than 1 ms late (fired_over_1ms_pct,
 *                from atap_pool_stats: the timers' part of the lateness,
 *                the rest being the hand-over to a worker).
 *                ATAP_BENCH_TIMERS_FROM_SPAWN=1 (from=spawn): the deadline
 *                counts from the spawn instead, the harness's measure
 *                before 2026-12-05 and stricter than the peers' (a late
 *                first run eats into the delay); it adds
 *                first_run_over_1ms_pct, the share whose first run began
 *                more than 1 ms past that deadline, late whatever the
 *                timers do. ATAP_BENCH_TIMERS_AFTER=1: each task is spawned
 *                with its delay as a delayed start (atap_spawn_opts.after_ns,
 *                libuv's shape: no run before the deadline, the sleep asked
 *                for at the spawn) instead of parking, and its one run notes
 *                how late it began
 *   ping_pong    two waiting tasks A and B (atap_spawn_waiting, ATAP_ONCE, an
 *                8-byte value) pass a token with atap_give: A given k gives
 *                k + 1 to B, B gives it straight back; A given n ends it (n
 *                round trips, 2n gives). The main thread gives A its first
 *                token and waits for the signal
 *   idle_memory  n tasks, each parked at once on a timer 2 s out: its first
 *                run calls atap_park_until(now + 2 s) and returns
 *                ATAP_PARKED; resumed, it finishes, or parks 2 s more if the
 *                main thread is still spawning (as the tokio peer re-arms), so
 *                all n are parked together. Handles are released at spawn (uv
 *                and tokio keep none either); the last task to finish signals
 *                the main thread. bytes_per_task = (peak RSS - RSS before the
 *                first spawn) / n; park_s = time to spawn all n, and
 *                ns_per_op = park_s / n, as the peers print it
 *   cancel_latency (libatap only, not in the peers) n rounds (default 1,000):
 *                a task enters atap_sleep(10 s); 1-2 ms later the main thread
 *                stamps the time and calls atap_cancel; the task stamps the
 *                time its atap_sleep returned ATAP_ECANCELLED. Latency = the
 *                second stamp - the first; ns_per_op is the p50, and the
 *                extras cancel_p50_us= cancel_p99_us= cancel_max_us=
 *                cancel_min_us=
 *   handover     (the machine's, not a runtime's; not in run.sh) n round
 *                trips of one cache line between two plain threads, each
 *                waiting for the other's store before its own: ns_per_op is
 *                one hand-over, half a round trip, what a line written on
 *                one core takes to be read on another (bench/README.md)
 *   wake_latency (the machine's, not a runtime's; not in run.sh) n wakes
 *                (default 20,000) of a thread asleep on a condition
 *                variable, WAKE_GAP_US apart, so that its CPU goes idle
 *                between them: the main thread stamps the time and signals,
 *                the thread stamps when it runs. The main thread then spins
 *                until it sees that stamp, as a waker that goes on working
 *                does (a spawning thread, a manager firing a tick);
 *                ATAP_BENCH_WAKER=sleep: it sleeps until told instead.
 *                ns_per_op is the median wake-to-run; extras wake_p99_us=
 *                wake_max_us=, over_1ms= (how many took over 1 ms),
 *                over_1ms_per_s= (per second of the run) and waker=: what
 *                any runtime's sleeping thread (a parked worker, a timer
 *                thread) may wait to run once woken
 *
 * Timing runs from the first spawn to "all done" seen by the main thread;
 * atap_init and a warm-up task are outside it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, sysconf, setenv in common.h and here */
#endif
#include "common.h"

#include <atap.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>

/* The tasks' counter, alone on its cache line. The spawning loops read N
 * after every call into the runtime; a counter beside N would make each
 * task's increment wait for the line to come back from the spawning
 * thread: a cost of where the linker put two variables, not of the
 * runtime. oneTBB's peer, the one the spawn goals name, has them on
 * separate lines; the C peers share one (bench/README.md, spawn_many). */
static struct {
    _Alignas(64) atomic_long n;
} counter;
static long N;

/* Any failing libatap call ends the benchmark with a message. */
static void must(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s: %s (%d)\n", what, atap_strerror(rc), rc);
        exit(1);
    }
}

/* The options are built once, as a program spawning in a loop would: an
 * atap_spawn_opts is 112 bytes, and zeroing one per spawn (gcc emits a
 * `rep stos`) costs more than some of the spawns measured here. */
static const atap_spawn_opts opts_none, opts_word = {.out_size = sizeof(long)};

static atap_task spawn(atap_fn *fn, void *arg, size_t out_size)
{
    atap_task t;
    check(out_size == 0 || out_size == sizeof(long), "spawn: an output size with no options");
    must(atap_spawn(&t, fn, arg, out_size ? &opts_word : &opts_none), "atap_spawn");
    return t;
}

static void join_release(atap_task t, void *out, size_t size)
{
    must(atap_join(t, out, size), "atap_join");
    atap_release(t);
}

/* Handles kept by spawn_many, spawn_local and live_memory: allocated and
 * touched before the timing starts. */
static atap_task *handles_alloc(long n)
{
    atap_task *h = malloc((size_t)n * sizeof *h);
    check(h != NULL, "malloc handles");
    /* Not 0: gcc turns malloc + memset(0) into calloc, which touches nothing. */
    memset(h, 0xff, (size_t)n * sizeof *h);
    return h;
}

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---------------- tasks ---------------- */

static int noop(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return 0;
}

static int inc(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add_explicit(&counter.n, 1, memory_order_relaxed);
    return 0;
}

/* fan: a child's work, FAN_WORK rounds of splitmix64 from its index (about
 * 20 us here), XOR-ed into fan_sum. A fixed count, not a clock: every run
 * does the same work. */
#define FAN_WORK 5000
static _Atomic uint64_t fan_sum;

static int fan_child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    uint64_t x = (uint64_t)(uintptr_t)arg;
    for (int r = 0; r < FAN_WORK; r++)
        x = splitmix64(x);
    atomic_fetch_xor_explicit(&fan_sum, x, memory_order_relaxed);
    return 0;
}

/* spawn_local and fan: the parent spawns N children of fn (child i's arg:
 * i) into h, then joins and releases them in spawn order. */
struct parent_arg {
    atap_fn *fn;
    atap_task *h;
};

static int parent(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    const struct parent_arg *p = arg;
    for (long i = 0; i < N; i++)
        p->h[i] = spawn(p->fn, (void *)(intptr_t)i, 0);
    for (long i = 0; i < N; i++)
        join_release(p->h[i], NULL, 0);
    return 0;
}

static int fib_task(atap_ctx *ctx, void *arg, void *out);

static long fib(long n)
{
    if (n < 2)
        return n;
    atap_task h = spawn(fib_task, (void *)(intptr_t)(n - 1), sizeof(long));
    long b = fib(n - 2);
    long a;
    join_release(h, &a, sizeof a);
    return a + b;
}

static int fib_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    long r = fib((long)(intptr_t)arg);
    memcpy(out, &r, sizeof r);
    return 0;
}

/* tree, wide_tree: a node's state and depth, its task's arg. A child's lives
 * in its parent's frame (or, for the root's n, its array) until it is
 * joined. */
struct tree_node {
    uint64_t s;
    long depth;
};
static const atap_spawn_opts opts_tree = {.out_size = sizeof(tree_result)};

/* The run's shape (common.h's tree_shape: fan-out m, probability q) and
 * whether a node joins its children last-spawned first (TREE_JOIN), both
 * set by main before the root is spawned. */
static int tree_m;
static double tree_q;
static bool tree_last_first;

static int tree_task(atap_ctx *ctx, void *arg, void *out);

/* node's work, then its k children spawned (kid[i], h[i]), joined in the
 * run's order, added. */
static tree_result tree_sub(const struct tree_node *node, long k, struct tree_node *kid,
                            atap_task *h)
{
    tree_result r = {1, node->depth, tree_work(node->s)};
    for (long i = 0; i < k; i++) {
        kid[i] = (struct tree_node){tree_child(node->s, i), node->depth + 1};
        must(atap_spawn(&h[i], tree_task, &kid[i], &opts_tree), "atap_spawn");
    }
    for (long i = 0; i < k; i++) {
        long j = tree_last_first ? k - 1 - i : i;
        tree_result c;
        join_release(h[j], &c, sizeof c);
        tree_add(&r, c);
    }
    return r;
}

/* A non-root node: m children or none. The arrays are as long as the
 * node's children (the omp peer's way), so tree's frames stay the size of
 * its 2 (a VLA may not be empty: a leaf's has 1). */
static int tree_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    const struct tree_node *node = arg;
    int k = tree_kids_of(node->s, tree_m, tree_q);
    struct tree_node kid[k > 0 ? k : 1];
    atap_task h[k > 0 ? k : 1];
    tree_result r = tree_sub(node, k, kid, h);
    memcpy(out, &r, sizeof r);
    return 0;
}

/* The root: the same with N children. */
static int tree_root_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    struct tree_node root = {tree_root(), 0}, *kid = malloc((size_t)N * sizeof *kid);
    atap_task *h = malloc((size_t)N * sizeof *h);
    check(kid && h, "malloc tree children");
    tree_result r = tree_sub(&root, N, kid, h);
    free(kid);
    free(h);
    memcpy(out, &r, sizeof r);
    return 0;
}

/* TREE_JOIN: unset, empty or "spawn_order" (the peers' order), or
 * "last_first"; anything else ends the bench, so a typo is seen. */
static bool tree_join_last_first(void)
{
    const char *e = getenv("TREE_JOIN");
    if (!e || !*e || !strcmp(e, "spawn_order"))
        return false;
    check(!strcmp(e, "last_first"), "TREE_JOIN is spawn_order or last_first");
    return true;
}

/* tree, wide_tree: the most live tasks (atap_pool_stats' live) while the
 * tree runs, sampled every 1 ms by a thread of its own: the pool keeps no
 * peak of that count (peak_slots is the table's span, free slots in it
 * included), so this is a lower bound of the peak, and peak_slots an upper
 * one. The thread starts before the timing and is stopped after it (its
 * start, and the wait for its last nap, are not the tree's). */
static atomic_bool live_stop;
static size_t live_peak;

static void *live_sampler(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&live_stop, memory_order_acquire)) {
        struct atap_pool_stats st;
        must(atap_pool_stats(&st), "atap_pool_stats");
        if (st.live > live_peak)
            live_peak = st.live;
        nap_us(1000);
    }
    return NULL;
}

static pthread_t live_sampler_start(void)
{
    pthread_t t;
    check(pthread_create(&t, NULL, live_sampler, NULL) == 0, "pthread_create sampler");
    return t;
}

/* Stops the sampler; returns the peak it saw. */
static size_t live_sampler_stop(pthread_t t)
{
    atomic_store_explicit(&live_stop, true, memory_order_release);
    pthread_join(t, NULL);
    return live_peak;
}

/* The tree of the run's shape, from the main thread: its extras, after the
 * peers' nodes= depth= checksum=, start with join=. */
static tree_result tree_run(char *extra, size_t len)
{
    tree_result r;
    atap_task t;
    must(atap_spawn(&t, tree_root_task, NULL, &opts_tree), "atap_spawn");
    join_release(t, &r, sizeof r);
    tree_fields(r, extra, len);
    snprintf(extra + strlen(extra), len - strlen(extra), " join=%s",
             tree_last_first ? "last_first" : "spawn_order");
    return r;
}

/* chain and timers: the last task signals the main thread through a condvar. */
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static int done;

static void signal_done(void)
{
    pthread_mutex_lock(&done_mu);
    done = 1;
    pthread_cond_signal(&done_cv);
    pthread_mutex_unlock(&done_mu);
}

static int hop(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    long i = (long)(intptr_t)arg;
    if (i < N) {
        must(atap_spawn_detached(hop, (void *)(intptr_t)(i + 1), NULL), "atap_spawn_detached");
    } else {
        signal_done();
    }
    return 0;
}

static void wait_done(void)
{
    pthread_mutex_lock(&done_mu);
    while (!done)
        pthread_cond_wait(&done_cv, &done_mu);
    pthread_mutex_unlock(&done_mu);
}

/* timers: each task knows when it was spawned (asked), when its first run
 * began (first: its spawn for a delayed start), and for how long it
 * sleeps. Its sleep is asked for at `first` (the workload's definition),
 * or at `asked` under ATAP_BENCH_TIMERS_FROM_SPAWN. */
static uint64_t *t_asked, *t_first, *t_delay;
static int64_t *t_late;
static bool t_from_spawn;
static atomic_long t_woke;

static uint64_t timer_due(long i) { return (t_from_spawn ? t_asked[i] : t_first[i]) + t_delay[i]; }

/* Like the peers' tasks (a tokio task awaiting sleep): the task starts at
 * once and parks on its deadline, holding no thread; its resumed run notes
 * how late it woke. */
static int woke(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    long i = (long)(intptr_t)arg;
    if (!atap_resumed(ctx)) {
        t_first[i] = now_ns();
        atap_park_until(ctx, timer_due(i));
        return ATAP_PARKED;
    }
    t_late[i] = (int64_t)(now_ns() - timer_due(i));
    if (atomic_fetch_add_explicit(&t_woke, 1, memory_order_acq_rel) + 1 == N)
        signal_done();
    return 0;
}

/* ATAP_BENCH_TIMERS_DUMP=file: a line a task, in ns from the workload's
 * start: its spawn, its delay, its first run and its lateness; for a
 * histogram of lateness by time (bench/README.md, timers). */
static void timers_dump(uint64_t t0)
{
    const char *path = getenv("ATAP_BENCH_TIMERS_DUMP");
    FILE *f;

    if (!path)
        return;
    check((f = fopen(path, "w")) != NULL, "ATAP_BENCH_TIMERS_DUMP opens");
    for (long i = 0; i < N; i++)
        fprintf(f, "%llu %llu %llu %lld\n", (unsigned long long)(t_asked[i] - t0),
                (unsigned long long)t_delay[i], (unsigned long long)(t_first[i] - t0),
                (long long)t_late[i]);
    check(fclose(f) == 0, "ATAP_BENCH_TIMERS_DUMP written");
}

/* timers under ATAP_BENCH_TIMERS_AFTER: the task's one run is its delayed
 * start. */
static int started(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    long i = (long)(intptr_t)arg;
    t_late[i] = (int64_t)(now_ns() - timer_due(i));
    if (atomic_fetch_add_explicit(&t_woke, 1, memory_order_acq_rel) + 1 == N)
        signal_done();
    return 0;
}

/* ping_pong: both sides' arg is this struct, which holds both handles (the
 * main thread's own: atap_spawn_waiting fills them in before the first give,
 * and main releases them once neither side can be inside a give on them). */
struct ping_pong {
    atap_task a, b;
    uint64_t expect; /* A's next token: touched only by A's runs, which never overlap */
    atomic_int left; /* 2: A has seen token n, B's last give has returned */
};

static void pp_one_done(struct ping_pong *pp)
{
    if (atomic_fetch_sub_explicit(&pp->left, 1, memory_order_acq_rel) == 1)
        signal_done();
}

static int ping(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct ping_pong *pp = arg;
    uint64_t v;
    memcpy(&v, atap_input(ctx, NULL), sizeof v);
    check(v == pp->expect++, "ping_pong token");
    if (v == (uint64_t)N) {
        pp_one_done(pp);
    } else {
        v++;
        must(atap_give(pp->b, &v, sizeof v), "atap_give to B");
    }
    return 0;
}

static int pong(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct ping_pong *pp = arg;
    uint64_t v;
    memcpy(&v, atap_input(ctx, NULL), sizeof v);
    must(atap_give(pp->a, &v, sizeof v), "atap_give to A");
    /* A may run and see n before this give has returned: main may release
     * pp->a only once this last give is out of it. */
    if (v == (uint64_t)N)
        pp_one_done(pp);
    return 0;
}

/* fd_memory: park on a pipe until a byte can be read (fd_timed_memory:
 * with a deadline a minute away as well). */
#define FD_PIPES 400
static atomic_long fd_left, fd_runs;
static uint64_t fd_timeout = ATAP_FOREVER;

static int fd_parked(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    int fd = (int)(intptr_t)arg;
    char c;
    if (!atap_resumed(ctx))
        atomic_fetch_add_explicit(&fd_runs, 1, memory_order_relaxed);
    if (read(fd, &c, 1) != 1) {
        atap_park_fd(ctx, fd, ATAP_READABLE, fd_timeout);
        return ATAP_PARKED;
    }
    if (atomic_fetch_sub_explicit(&fd_left, 1, memory_order_acq_rel) == 1)
        signal_done();
    return 0;
}

/* idle_memory: park 2 s on a timer; once resumed, finish (or park again
 * while the main thread is still spawning). No arg: nothing but the task's
 * slot and its park record is held while parked. */
static atomic_bool all_spawned;
static atomic_long idle_left;

static int idle(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    if (!atap_resumed(ctx) || !atomic_load_explicit(&all_spawned, memory_order_acquire)) {
        must(atap_park_until(ctx, atap_now() + ATAP_SEC(2)), "atap_park_until");
        return ATAP_PARKED;
    }
    if (atomic_fetch_sub_explicit(&idle_left, 1, memory_order_acq_rel) == 1)
        signal_done();
    return 0;
}

/* cancel_latency: one round's task. `entered` tells the main thread it is
 * about to sleep; `woke` is when atap_sleep came back cancelled. */
static atomic_int cl_entered;
static _Atomic uint64_t cl_woke;

static int sleep10(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_store(&cl_entered, 1);
    int rc = atap_sleep(ATAP_SEC(10));
    uint64_t t = now_ns();
    check(rc == ATAP_ECANCELLED, "atap_sleep returned ATAP_ECANCELLED");
    atomic_store(&cl_woke, t);
    signal_done();
    return 0;
}

/* handover: the line, and the other thread's side of the round trips. */
static _Alignas(64) _Atomic long ho_line;

static void *ho_other(void *arg)
{
    (void)arg;
    for (long i = 1; i <= N; i++) {
        while (atomic_load_explicit(&ho_line, memory_order_acquire) != 2 * i - 1)
            ;
        atomic_store_explicit(&ho_line, 2 * i, memory_order_release);
    }
    return NULL;
}

static void handover(void)
{
    pthread_t th;
    uint64_t t0;

    check(pthread_create(&th, NULL, ho_other, NULL) == 0, "pthread_create");
    t0 = now_ns();
    for (long i = 1; i <= N; i++) {
        atomic_store_explicit(&ho_line, 2 * i - 1, memory_order_release);
        while (atomic_load_explicit(&ho_line, memory_order_acquire) != 2 * i)
            ;
    }
    uint64_t ns = now_ns() - t0;
    pthread_join(th, NULL);
    report("atap", "handover", N, ns, ns / (2.0 * N), "");
}

/* wake_latency: the sleeper's side. `asked` is set and cleared under the
 * lock; the time it ran goes back through `ran` (0: not yet). */
#define WAKE_GAP_US 100
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond, done; /* done: the stamp is in, for a sleeping waker */
    bool asked, stop;
    _Atomic uint64_t ran;
} wl = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, 0};

static void *wl_sleeper(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&wl.lock);
    for (;;) {
        while (!wl.asked && !wl.stop)
            pthread_cond_wait(&wl.cond, &wl.lock);
        if (wl.stop)
            break;
        wl.asked = false;
        atomic_store_explicit(&wl.ran, now_ns(), memory_order_release);
        pthread_cond_signal(&wl.done);
    }
    pthread_mutex_unlock(&wl.lock);
    return NULL;
}

static void wake_latency(void)
{
    int64_t *d = malloc((size_t)N * sizeof *d);
    struct timespec gap = {0, WAKE_GAP_US * 1000};
    const char *waker = getenv("ATAP_BENCH_WAKER");
    bool sleeps = waker && !strcmp(waker, "sleep");
    long over = 0;
    pthread_t th;
    uint64_t t0, t;
    char extra[160];

    check(d != NULL, "malloc");
    check(pthread_create(&th, NULL, wl_sleeper, NULL) == 0, "pthread_create");
    t0 = now_ns();
    for (long i = 0; i < N; i++) {
        nanosleep(&gap, NULL); /* the sleeper's CPU goes idle meanwhile */
        pthread_mutex_lock(&wl.lock);
        t = now_ns();
        wl.asked = true;
        pthread_cond_signal(&wl.cond);
        if (sleeps)
            while (atomic_load_explicit(&wl.ran, memory_order_relaxed) == 0)
                pthread_cond_wait(&wl.done, &wl.lock);
        pthread_mutex_unlock(&wl.lock);
        uint64_t ran;
        while ((ran = atomic_load_explicit(&wl.ran, memory_order_acquire)) == 0)
            ;
        atomic_store_explicit(&wl.ran, 0, memory_order_relaxed);
        d[i] = (int64_t)(ran - t);
        over += d[i] > 1000000;
    }
    uint64_t ns = now_ns() - t0;
    pthread_mutex_lock(&wl.lock);
    wl.stop = true;
    pthread_cond_signal(&wl.cond);
    pthread_mutex_unlock(&wl.lock);
    pthread_join(th, NULL);
    qsort(d, (size_t)N, sizeof *d, cmp_i64);
    snprintf(extra, sizeof extra,
             " wake_p99_us=%.1f wake_max_us=%.1f over_1ms=%ld over_1ms_per_s=%.1f gap_us=%d"
             " waker=%s",
             d[N * 99 / 100] / 1e3, d[N - 1] / 1e3, over, over / (ns / 1e9), WAKE_GAP_US,
             sleeps ? "sleep" : "spin");
    report("atap", "wake_latency", N, ns, (double)d[N / 2], extra);
    free(d);
}

/* live_memory: an 8-byte output (the task's index). */
static int put8(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = (uint64_t)(uintptr_t)arg;
    memcpy(out, &v, sizeof v);
    return 0;
}

int main(int argc, char **argv)
{
    const char *w = argc > 1 ? argv[1] : "spawn_many";
    N = argc > 2                                                   ? atol(argv[2])
        : !strcmp(w, "cancel_latency")                             ? 1000
        : !strcmp(w, "fd_memory") || !strcmp(w, "fd_timed_memory") ? 100000
        : !strcmp(w, "fan")                                        ? 5000
        : !strcmp(w, "wake_latency")                               ? 20000
                                                                   : default_n(w);
    const char *peer = "atap";
    check(N > 0, "n > 0");
    bool is_tree = tree_shape(w, &tree_m, &tree_q);
    if (is_tree)
        tree_last_first = tree_join_last_first();
    if (!strcmp(w, "handover")) {
        handover();
        return 0;
    }
    if (!strcmp(w, "wake_latency")) {
        wake_latency();
        return 0;
    }

    must(atap_init(NULL), "atap_init");
    atap_task warm = spawn(noop, NULL, 0); /* warm-up: workers running */
    join_release(warm, NULL, 0);

    atap_task *h = NULL;
    if (!strcmp(w, "spawn_many") || !strcmp(w, "spawn_local") || !strcmp(w, "live_memory") ||
        !strcmp(w, "fan"))
        h = handles_alloc(N);
    struct atap_pool_stats st;
    must(atap_pool_stats(&st), "atap_pool_stats");
    size_t workers = st.workers; /* the pool's own, after the warm-up: fan's workers= */
    long rss0 = cur_rss_kb();    /* after the handle array: not counted per task */

    pthread_t sampler;
    if (is_tree)
        sampler = live_sampler_start();
    uint64_t t0 = now_ns();
    double ops = (double)N, per_op = 0; /* per_op: set when ns_per_op is not ns / ops */
    char extra[384] = "";
    if (!strcmp(w, "spawn_many")) {
        for (long i = 0; i < N; i++)
            h[i] = spawn(inc, NULL, 0);
        for (long i = 0; i < N; i++)
            join_release(h[i], NULL, 0);
        check(atomic_load(&counter.n) == N, "count");
    } else if (!strcmp(w, "spawn_local")) {
        struct parent_arg p = {inc, h};
        join_release(spawn(parent, &p, 0), NULL, 0);
        check(atomic_load(&counter.n) == N, "count");
    } else if (!strcmp(w, "fan")) {
        struct parent_arg p = {fan_child, h};
        join_release(spawn(parent, &p, 0), NULL, 0);
        snprintf(extra, sizeof extra, " workers=%zu checksum=%016llx", workers,
                 (unsigned long long)atomic_load(&fan_sum));
    } else if (!strcmp(w, "fib")) {
        long r;
        join_release(spawn(fib_task, (void *)(intptr_t)N, sizeof r), &r, sizeof r);
        if (N == 30)
            check(r == 832040, "fib(30) == 832040");
        ops = (double)fib_spawned_tasks((int)N);
        snprintf(extra, sizeof extra, " result=%ld tasks=%.0f", r, ops);
    } else if (is_tree) {
        ops = (double)tree_run(extra, sizeof extra).nodes;
    } else if (!strcmp(w, "timers")) {
        uint64_t seed = BENCH_LCG_SEED, created;
        struct atap_pool_stats st0, st1;
        long over_1ms = 0;
        must(atap_pool_stats(&st0), "atap_pool_stats");
        t_asked = calloc((size_t)N, sizeof *t_asked);
        t_first = calloc((size_t)N, sizeof *t_first);
        t_delay = calloc((size_t)N, sizeof *t_delay);
        t_late = calloc((size_t)N, sizeof *t_late);
        check(t_asked && t_first && t_delay && t_late, "timer arrays");
        bool delayed = getenv("ATAP_BENCH_TIMERS_AFTER") != NULL;
        t_from_spawn = getenv("ATAP_BENCH_TIMERS_FROM_SPAWN") != NULL;
        /* No handle, as the peers keep none (a tokio task's JoinHandle
         * dropped): the last run signals the main thread. */
        for (long i = 0; i < N; i++) {
            atap_spawn_opts o = {.after_ns = 0};
            t_delay[i] = (uint64_t)lcg_delay_ms(&seed) * 1000000u;
            o.after_ns = delayed ? t_delay[i] : 0;
            t_asked[i] = t_first[i] = now_ns(); /* a parker's first: its first run's */
            must(atap_spawn_detached(delayed ? started : woke, (void *)(intptr_t)i,
                                     delayed ? &o : NULL),
                 "atap_spawn_detached");
        }
        created = now_ns();
        wait_done();
        must(atap_pool_stats(&st1), "atap_pool_stats");
        /* The timers due once every task was spawned: the hand-over without
         * the spawning thread taking a core from the pool (on 2 cores,
         * three busy threads). And the wait from the spawn to the first run
         * (the queue of first runs while the main thread creates them):
         * from the spawn, runs whose first run began more than 1 ms past
         * their deadline were late whatever the timers did. */
        int64_t *after = calloc((size_t)N, sizeof *after);
        int64_t *first_wait = calloc((size_t)N, sizeof *first_wait);
        long nafter = 0, first_late = 0;
        check(after != NULL && first_wait != NULL, "lateness arrays");
        for (long i = 0; i < N; i++) {
            over_1ms += t_late[i] > 1000000;
            first_wait[i] = (int64_t)(t_first[i] - t_asked[i]);
            first_late += t_first[i] > timer_due(i) + 1000000;
            if (timer_due(i) >= created)
                after[nafter++] = t_late[i];
        }
        timers_dump(t0);
        lateness_fields(t_late, N, extra, sizeof extra);
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " create_s=%.3f",
                 (created - t0) / 1e9);
        if (nafter > 0) {
            qsort(after, (size_t)nafter, sizeof *after, cmp_i64);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     " after_spawn_n=%ld after_spawn_p50_us=%.1f after_spawn_p99_us=%.1f", nafter,
                     after[nafter / 2] / 1e3, after[nafter * 99 / 100] / 1e3);
        }
        free(after);
        qsort(first_wait, (size_t)N, sizeof *first_wait, cmp_i64);
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 " first_wait_p50_us=%.1f first_wait_p99_us=%.1f", first_wait[N / 2] / 1e3,
                 first_wait[N * 99 / 100] / 1e3);
        free(first_wait);
        if (t_from_spawn)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     " first_run_over_1ms_pct=%.2f", 100.0 * first_late / N);
        /* The split: how many ran more than 1 ms late (end to end), and how
         * many the manager fired more than 1 ms late (the timers' share; the
         * rest is the hand-over: queued, then taken by a worker). */
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 " over_1ms_pct=%.2f fired=%llu fired_over_1ms_pct=%.2f start=%s from=%s",
                 100.0 * over_1ms / N, (unsigned long long)(st1.fired - st0.fired),
                 st1.fired > st0.fired ? 100.0 * (double)(st1.fired_1ms - st0.fired_1ms) /
                                             (double)(st1.fired - st0.fired)
                                       : 0.0,
                 delayed ? "after" : "park", delayed || t_from_spawn ? "spawn" : "first_run");
    } else if (!strcmp(w, "chain")) {
        must(atap_spawn_detached(hop, (void *)(intptr_t)0, NULL), "atap_spawn_detached");
        wait_done();
    } else if (!strcmp(w, "ping_pong")) {
        /* Both sides exist (and pp holds both handles) before anything is
         * given; ATAP_ONCE with no gives limit: one run per token. */
        static struct ping_pong pp = {.left = 2};
        atap_spawn_opts side = {.kind = ATAP_ONCE};
        uint64_t first = 0;
        must(atap_spawn_waiting(&pp.a, ping, &pp, sizeof first, &side), "atap_spawn_waiting A");
        must(atap_spawn_waiting(&pp.b, pong, &pp, sizeof first, &side), "atap_spawn_waiting B");
        must(atap_give(pp.a, &first, sizeof first), "atap_give first token");
        wait_done();
        check(pp.expect == (uint64_t)N + 1, "ping_pong round trips");
        atap_release(pp.a); /* no handle can give to them now: both are let go */
        atap_release(pp.b);
    } else if (!strcmp(w, "idle_memory")) {
        atomic_store(&idle_left, N);
        for (long i = 0; i < N; i++)
            atap_release(spawn(idle, NULL, 0));
        atomic_store_explicit(&all_spawned, true, memory_order_release);
        uint64_t parked = now_ns();
        wait_done();
        per_op = (double)(parked - t0) / N;
        snprintf(extra, sizeof extra, " bytes_per_task=%.0f park_s=%.3f rss_before_kb=%ld",
                 (peak_rss_kb() - rss0) * 1024.0 / N, (parked - t0) / 1e9, rss0);
    } else if (!strcmp(w, "fd_memory") || !strcmp(w, "fd_timed_memory")) {
        /* ours: n tasks parked on the read ends of FD_PIPES pipes (no
         * deadline, or one a minute away), n / FD_PIPES on each, then one
         * byte each; the figure is what a park on an fd costs beyond the fd
         * itself */
        static int pipes[FD_PIPES][2];
        if (!strcmp(w, "fd_timed_memory"))
            fd_timeout = ATAP_SEC(60);
        for (int k = 0; k < FD_PIPES; k++)
            check(pipe(pipes[k]) == 0 && fcntl(pipes[k][0], F_SETFL, O_NONBLOCK) == 0, "pipe");
        rss0 = cur_rss_kb();
        t0 = now_ns();
        fd_left = N;
        for (long i = 0; i < N; i++)
            atap_release(spawn(fd_parked, (void *)(intptr_t)pipes[i % FD_PIPES][0], 0));
        uint64_t parked = now_ns();
        while (atomic_load(&fd_runs) < N)
            usleep(1000); /* every one has looked */
        usleep(20000);    /* and parked */
        long rss_parked = cur_rss_kb();
        for (long i = 0; i < N; i++) {
            char one = 1;
            check(write(pipes[i % FD_PIPES][1], &one, 1) == 1, "write");
        }
        wait_done();
        per_op = (double)(parked - t0) / N;
        snprintf(extra, sizeof extra, " bytes_per_task=%.0f park_s=%.3f rss_before_kb=%ld",
                 (rss_parked - rss0) * 1024.0 / N, (parked - t0) / 1e9, rss0);
        for (int k = 0; k < FD_PIPES; k++) {
            close(pipes[k][0]);
            close(pipes[k][1]);
        }
    } else if (!strcmp(w, "cancel_latency")) {
        int64_t *lat = calloc((size_t)N, sizeof *lat);
        check(lat != NULL, "latency array");
        for (long i = 0; i < N; i++) {
            atomic_store(&cl_entered, 0);
            atomic_store(&cl_woke, 0);
            done = 0; /* only the task signals, once it has stamped cl_woke */
            atap_task t = spawn(sleep10, NULL, 0);
            while (!atomic_load(&cl_entered))
                nap_us(50);
            nap_us(1000 + i % 1000); /* 1-2 ms: well inside the sleep */
            check(atap_state_of(t) == ATAP_RUNNING, "the task is running when cancelled");
            uint64_t asked = now_ns();
            must(atap_cancel(t), "atap_cancel");
            wait_done();
            lat[i] = (int64_t)(atomic_load(&cl_woke) - asked);
            check(atap_join(t, NULL, 0) == ATAP_ECANCELLED, "join reads ATAP_ECANCELLED");
            atap_release(t);
        }
        qsort(lat, (size_t)N, sizeof *lat, cmp_i64);
        per_op = (double)lat[N * 50 / 100];
        snprintf(extra, sizeof extra,
                 " cancel_p50_us=%.1f cancel_p99_us=%.1f cancel_max_us=%.1f cancel_min_us=%.1f",
                 lat[N * 50 / 100] / 1e3, lat[N * 99 / 100] / 1e3, lat[N - 1] / 1e3, lat[0] / 1e3);
        free(lat);
    } else if (!strcmp(w, "live_memory")) {
        for (long i = 0; i < N; i++)
            h[i] = spawn(put8, (void *)(uintptr_t)i, sizeof(uint64_t));
        for (long i = 0; i < N; i++) {
            uint64_t v;
            must(atap_join(h[i], &v, sizeof v), "atap_join");
            check(v == (uint64_t)i, "live_memory output");
        }
        long rss1 = cur_rss_kb(); /* all n settled, all n handles held */
        snprintf(extra, sizeof extra, " bytes_per_task=%.0f rss_before_kb=%ld",
                 (rss1 - rss0) * 1024.0 / N, rss0);
    } else {
        fprintf(stderr, "unknown workload %s\n", w);
        return 2;
    }
    uint64_t ns = now_ns() - t0;
    size_t peak_live = is_tree ? live_sampler_stop(sampler) : 0;

    /* threads= reports the workers that actually ran (this bench starts the
     * default pool, one worker per CPU the process may run on; it does not
     * pass BENCH_THREADS on as atap_config.workers). */
    must(atap_pool_stats(&st), "atap_pool_stats");
    if ((int)st.peak_workers != bench_threads()) {
        char t[32];
        snprintf(t, sizeof t, "%zu", st.peak_workers);
        setenv("BENCH_THREADS", t, 1);
    }
    if (is_tree)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 " peak_live=%zu peak_slots=%zu peak_workers=%zu peak_aside=%zu stacks=%zu",
                 peak_live, st.peak_slots, st.peak_workers, st.peak_aside, st.stacks);
    report(peer, w, N, ns, per_op ? per_op : ns / ops, extra);

    if (h && !strcmp(w, "live_memory"))
        for (long i = 0; i < N; i++)
            atap_release(h[i]);
    free(h);
    must(atap_shutdown(), "atap_shutdown");
    return 0;
}

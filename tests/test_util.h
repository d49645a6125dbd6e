/*
 * Shared helpers for libatap's cmocka tests. Header-only: every function is
 * static inline so a test file that does not use one gets no warning.
 *
 * Rules the helpers follow:
 *   - cmocka asserts long-jump into the test's frame, so they may only run on
 *     the test's own thread. Code on other threads (tasks, helper pthreads)
 *     records a failure with CHECK(), and the test asserts none happened with
 *     assert_no_failures() after joining those threads.
 *   - Everything shared across threads is an atomic (TSan must see no race in
 *     the tests themselves).
 *   - Every spinning task also watches g_release_all, which the common teardown
 *     sets, so a test that fails half way never leaves shutdown waiting forever.
 *
 * ATAP_TEST_SCALE (a positive number, default 1) scales the heavy loop counts.
 */
#ifndef ATAP_TEST_UTIL_H
#define ATAP_TEST_UTIL_H

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "atap.h"
#include "atap/inject.h" /* atap_inject_*: the tests link atap_testing, which has them */
#include "testing.h"     /* atap__cpus */

/* ---- which sanitizer, if any, this file is built with ---------------- */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#if __has_feature(memory_sanitizer)
#define TEST_MSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TEST_ASAN)
#define TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(TEST_TSAN)
#define TEST_TSAN 1
#endif

/* ---- the event backend: a kernel's, or an emulated kqueue ------------ */

/* Whether the kqueue backend runs on a user-space kqueue (libkqueue on
 * Linux: CMake defines ATAP_POLLER_EMULATED). Where that emulator does
 * what no kernel's kqueue does, the test concerned checks what it does
 * instead, says so with a line of output, and checks libatap's promise
 * itself on every other backend:
 *   - it reads a socket's pending error (SO_ERROR, which Linux clears as
 *     it reads) to put it in the event, so a failed connect finds none
 *     left and reads -ECONNABORTED (test_net_tcp_errors);
 *   - it watches a file through the path /proc gives its fd, so a file
 *     with no name left cannot be watched (test_limits_fds_parks);
 *   - from its first kqueue on it keeps fds of its own for the process
 *     (an epoll and an eventfd: test_lifecycle_last_shutdown_closes_fds),
 *     and it closes a kqueue's fds on its own thread shortly after
 *     close() returns (poller_settle, below, waits for that before the
 *     tests that count fds count them);
 *   - a kqueue() refused its monitoring thread leaves its signal thread
 *     running for good (test_limits_threads_kernel_refuses). */
#if defined(ATAP_POLLER_EMULATED)
static inline bool poller_emulated(void) { return true; }
/* libkqueue's call for tests: returns once its thread has closed the fds
 * of every kqueue closed so far. Weak: a libkqueue without it leaves it
 * out, and poller_settle does nothing there. */
extern void libkqueue_drain_pending_close(void) __attribute__((weak));
#else
static inline bool poller_emulated(void) { return false; }
#endif

/* Before counting fds: an emulated kqueue closes a kqueue's fds on a
 * thread of its own, after close() has returned; this waits for those
 * closes. Nothing to wait for elsewhere. */
static inline void poller_settle(void)
{
#if defined(ATAP_POLLER_EMULATED)
    if (libkqueue_drain_pending_close)
        libkqueue_drain_pending_close();
#endif
}

/* ---- failures seen off the test thread ------------------------------- */

__attribute__((unused)) static atomic_int g_failures;
__attribute__((unused)) static atomic_int g_failure_written;
__attribute__((unused)) static char g_failure_msg[512];

static inline void record_failure(const char *file, int line, const char *what)
{
    atomic_fetch_add_explicit(&g_failures, 1, memory_order_acq_rel);
    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&g_failure_written, &expected, 1,
                                                memory_order_acq_rel, memory_order_acquire)) {
        snprintf(g_failure_msg, sizeof g_failure_msg, "%s:%d: %s", file, line, what);
        atomic_store_explicit(&g_failure_written, 2, memory_order_release);
    }
}

/* For use on any thread: records instead of aborting. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            record_failure(__FILE__, __LINE__, "CHECK(" #cond ") failed");                         \
    } while (0)

/* On the test thread, after the threads that may CHECK() have been joined
 * (or otherwise synchronised with). */
#define assert_no_failures()                                                                       \
    do {                                                                                           \
        int n_ = atomic_load_explicit(&g_failures, memory_order_acquire);                          \
        if (n_ != 0) {                                                                             \
            if (atomic_load_explicit(&g_failure_written, memory_order_acquire) == 2)               \
                print_error("%d failure(s) off the test thread; first: %s\n", n_, g_failure_msg);  \
            atomic_store(&g_failures, 0);                                                          \
            atomic_store(&g_failure_written, 0);                                                   \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- time -------------------------------------------------------------- */

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static inline void sleep_ms(unsigned ms) { sleep_us(ms * 1000u); }

/* The CPU time of the whole process so far (every thread), in ns. */
static inline uint64_t process_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- sizes ------------------------------------------------------------- */

static inline double test_scale(void)
{
    const char *s = getenv("ATAP_TEST_SCALE");
    if (s == NULL || *s == '\0')
        return 1.0;
    double v = strtod(s, NULL);
    return v > 0 ? v : 1.0;
}

/* n times ATAP_TEST_SCALE, at least min_n. */
static inline size_t scaled(size_t n, size_t min_n)
{
    double v = (double)n * test_scale();
    size_t r = v < 1.0 ? 1 : (size_t)v;
    return r < min_n ? min_n : r;
}

static inline size_t env_size(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return dflt;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    return (end == s || v == 0) ? dflt : (size_t)v;
}

/* ---- room for a slow machine ------------------------------------------ */

/* How many times a bound on lateness (never a promise: "never early" and
 * exact counts stay as they are) may stretch: ATAP_TEST_SLACK (CTest passes
 * it; tests/run_suite.sh raises it under ATAP_LOAD), times 4 under TSan,
 * whose runs are that much slower. */
static inline uint64_t test_slack(void)
{
    uint64_t slack = env_size("ATAP_TEST_SLACK", 1);
#if defined(TEST_TSAN)
    slack *= 4;
#endif
    return slack;
}

/* ---- the runtime ------------------------------------------------------- */

/* Set by the common teardown: every spinning task in the tests stops. */
__attribute__((unused)) static atomic_int g_release_all;

static inline bool released_all(void)
{
    return atomic_load_explicit(&g_release_all, memory_order_acquire) != 0;
}

/* Tasks alive when the test began: normally 0, more only when an earlier
 * test failed half way and left handles unreleased. Leak checks compare with
 * it so one failure does not fail every test after it. */
__attribute__((unused)) static size_t g_live_base;

static inline struct atap_pool_stats pool_stats(void);

/* A runtime of config c (NULL: the defaults), for a setup function. */
static inline int setup_runtime_with(const atap_config *c)
{
    atomic_store(&g_release_all, 0);
    int rc = atap_init(c);
    g_live_base = pool_stats().live;
    return rc == 0 ? 0 : -1;
}

static inline int setup_runtime(void **state)
{
    (void)state;
    return setup_runtime_with(NULL);
}

static inline int teardown_runtime(void **state)
{
    (void)state;
    atomic_store(&g_release_all, 1);
    int rc = atap_shutdown();
    atomic_store(&g_release_all, 0);
    return rc == 0 ? 0 : -1;
}

static inline struct atap_pool_stats pool_stats(void)
{
    struct atap_pool_stats s;
    memset(&s, 0, sizeof s);
    (void)atap_pool_stats(&s);
    return s;
}

/* Polls stats.live until it is <= target; true if it got there in time. */
static inline bool wait_live_at_most(size_t target, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    for (;;) {
        if (pool_stats().live <= target)
            return true;
        if (now_ns() > end)
            return false;
        sleep_us(200);
    }
}

/* Polls until stats.live is back to what it was when the test began. */
static inline bool wait_live_back(uint64_t timeout_ns)
{
    return wait_live_at_most(g_live_base, timeout_ns);
}

/* Polls an atomic until it reaches at least want; true if it got there. */
static inline bool wait_atomic_at_least(atomic_int *a, int want, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    while (atomic_load_explicit(a, memory_order_acquire) < want) {
        if (now_ns() > end)
            return false;
        sched_yield();
        sleep_us(50);
    }
    return true;
}

/* ---- common task functions -------------------------------------------- */

/* Writes the uint64_t carried in arg. out_size 8. */
static inline int task_value(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    uint64_t v = (uint64_t)(uintptr_t)arg;
    memcpy(out, &v, sizeof v);
    return 0;
}

/* Increments the atomic_int at arg. Any out_size (writes nothing). */
static inline int task_count(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    atomic_fetch_add_explicit((atomic_int *)arg, 1, memory_order_acq_rel);
    return 0;
}

/* Fails its run (not with 1: that is ATAP_PARKED). */
static inline int task_fail(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    (void)out;
    return -1;
}

/* A gate a task waits on: it counts itself in `started`, spins until `open`
 * (or the teardown), counts itself in `ran`, then writes `value` (out 8). */
typedef struct gate {
    atomic_int open;
    atomic_int started;
    atomic_int ran;
    uint64_t value;
} gate;

/* Gates live in static storage, not on a test's stack: a test that fails
 * part way leaves its tasks running until the teardown lets them go, and
 * they must not then touch a dead stack frame. A ring of them is handed out
 * in turn (test thread only); the teardown ends every gated task, so no
 * more than GATE_RING are ever in use at once within one test. */
#define GATE_RING 256
__attribute__((unused)) static gate g_gates[GATE_RING];
__attribute__((unused)) static size_t g_gate_next;

static inline gate *gate_new(uint64_t value)
{
    gate *g = &g_gates[g_gate_next++ % GATE_RING];
    atomic_store(&g->open, 0);
    atomic_store(&g->started, 0);
    atomic_store(&g->ran, 0);
    g->value = value;
    return g;
}

static inline int task_gated(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    gate *g = arg;
    atomic_fetch_add_explicit(&g->started, 1, memory_order_acq_rel);
    while (!atomic_load_explicit(&g->open, memory_order_acquire) && !released_all())
        sleep_us(100);
    atomic_fetch_add_explicit(&g->ran, 1, memory_order_acq_rel);
    memcpy(out, &g->value, sizeof g->value);
    return 0;
}

/* Spawns with an 8-byte output; asserts success. Test thread only. */
static inline atap_task spawn8(atap_fn *fn, void *arg)
{
    atap_task t = ATAP_NO_TASK;
    int rc = atap_spawn(&t, fn, arg, &(atap_spawn_opts){.out_size = sizeof(uint64_t)});
    assert_int_equal(rc, 0);
    assert_true(t.id != 0);
    return t;
}

/* Joins an 8-byte output; asserts success and returns it. Test thread only. */
static inline uint64_t join8(atap_task t)
{
    uint64_t v = 0;
    assert_int_equal(atap_join(t, &v, sizeof v), 0);
    return v;
}

/* ---- filling the pool -------------------------------------------------- */

/*
 * Occupies every worker with a spinning task so that what is spawned next
 * stays queued. Records the pthread ids of the workers that ran them.
 */
#define MAX_BLOCKERS 512

typedef struct blockers {
    atomic_int release;
    atomic_int tickets; /* each lets one blocker finish early */
    atomic_int claimed;
    atomic_int started;
    size_t n;
    atap_task tasks[MAX_BLOCKERS];
    pthread_t threads[MAX_BLOCKERS];
} blockers;

static inline int task_blocker(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)out;
    blockers *b = arg;
    int i = atomic_fetch_add_explicit(&b->claimed, 1, memory_order_acq_rel);
    if (i < MAX_BLOCKERS)
        b->threads[i] = pthread_self();
    atomic_fetch_add_explicit(&b->started, 1, memory_order_release);
    while (!atomic_load_explicit(&b->release, memory_order_acquire) && !released_all()) {
        int t = atomic_load_explicit(&b->tickets, memory_order_acquire);
        if (t > 0 && atomic_compare_exchange_strong_explicit(
                         &b->tickets, &t, t - 1, memory_order_acq_rel, memory_order_acquire))
            break;
        sleep_us(100);
    }
    return 0;
}

/* Test thread only. Returns with every worker alive running a blocker. The
 * blockers are static for the same reason the gates are. */
__attribute__((unused)) static blockers g_blockers;

static inline blockers *blockers_start(void)
{
    blockers *b = &g_blockers;
    memset(b, 0, sizeof *b);
    atomic_init(&b->release, 0);
    atomic_init(&b->tickets, 0);
    atomic_init(&b->claimed, 0);
    atomic_init(&b->started, 0);
    for (int round = 0; round < 16; round++) {
        size_t workers = pool_stats().workers;
        assert_true(workers > 0);
        if (workers <= b->n)
            return b;
        assert_true(workers <= MAX_BLOCKERS);
        while (b->n < workers) {
            int rc = atap_spawn(&b->tasks[b->n], task_blocker, b, NULL);
            assert_int_equal(rc, 0);
            b->n++;
        }
        assert_true(wait_atomic_at_least(&b->started, (int)b->n, ATAP_SEC(20)));
    }
    fail_msg("the pool kept growing while every worker was blocked");
    return b;
}

static inline bool blockers_has_thread(blockers *b, pthread_t th)
{
    int n = atomic_load_explicit(&b->started, memory_order_acquire);
    for (int i = 0; i < n && i < MAX_BLOCKERS; i++)
        if (pthread_equal(b->threads[i], th))
            return true;
    return false;
}

/* Lets exactly one blocker finish, so exactly one worker comes free. */
static inline void blockers_release_one(blockers *b)
{
    atomic_fetch_add_explicit(&b->tickets, 1, memory_order_acq_rel);
}

/* Test thread only: lets the blockers finish, joins and releases them. */
static inline void blockers_stop(blockers *b)
{
    atomic_store_explicit(&b->release, 1, memory_order_release);
    for (size_t i = 0; i < b->n; i++) {
        assert_int_equal(atap_join(b->tasks[i], NULL, 0), 0);
        atap_release(b->tasks[i]);
    }
    b->n = 0;
}

/* ---- the manager and the pool ------------------------------------------ */

static inline struct atap_status status_now(void)
{
    struct atap_status st;
    assert_int_equal(atap_status(&st), 0);
    return st;
}

/* Waits until the manager is (or is not) alive; false on timeout. */
static inline bool wait_manager(bool alive, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    struct atap_status st;

    do {
        atap_status(&st);
        if (st.manager_alive == alive)
            return true;
        sleep_us(1000);
    } while (now_ns() < end);
    return false;
}

/* Waits up to 30 s for a fork's child and asserts it exited with 0; a
 * nonzero status names the check the child failed. A child still running
 * then is killed. */
static inline void child_passed(pid_t pid)
{
    uint64_t end = now_ns() + ATAP_SEC(30);
    int status = 0;
    pid_t got;

    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && now_ns() < end)
        sleep_ms(1);
    if (got != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the fork's child did not finish in 30 s");
    }
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("the fork's child failed check %d", WEXITSTATUS(status));
}

#ifdef ATAP_MANAGER_H
/* Waits until the supervisor has given up on the manager for good (not just
 * a manager down between restarts); false on timeout. */
static inline bool wait_manager_gone(uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    while (!atap__hub_gone()) {
        if (now_ns() > end)
            return false;
        sleep_us(1000);
    }
    return true;
}
#endif

/* Polls atap_finished until it is true; true if it got there in time. */
static inline bool wait_finished(atap_task t, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    while (!atap_finished(t)) {
        if (now_ns() > end)
            return false;
        sleep_us(200);
    }
    return true;
}

#ifdef ATAP_MANAGER_H /* tests that include the manager's internal header */
/* Polls until the supervisor has restarted the manager `want` times in all
 * (atap__manager_restarts); false if that did not happen in time. */
static inline bool wait_restarts(unsigned want, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    while (atap__manager_restarts() < want && now_ns() < end)
        sleep_us(500);
    return atap__manager_restarts() >= want;
}
#endif

/* The CPUs this process may run on (affinity, cgroup quota): the pool's
 * floor of workers with the default config and no ATAP_WORKERS. */
static inline unsigned cores(void) { return atap__cpus(); }

/* ---- a reusable barrier (pthread_barrier is not everywhere) ------------- */

typedef struct test_barrier {
    atomic_int arrived;
    atomic_int round;
    int parties;
} test_barrier;

static inline void barrier_init(test_barrier *b, int parties)
{
    atomic_init(&b->arrived, 0);
    atomic_init(&b->round, 0);
    b->parties = parties;
}

static inline void barrier_wait(test_barrier *b)
{
    int round = atomic_load_explicit(&b->round, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == b->parties) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->round, 1, memory_order_acq_rel);
        return;
    }
    while (atomic_load_explicit(&b->round, memory_order_acquire) == round)
        sched_yield();
}

/* ---- does a call go through from where this thread stands? ------------ */

/*
 * For a callback or hook that runs inside the library (on any thread):
 * side_call_returns runs fn(arg) on a thread of its own and waits up to
 * timeout_ns for it to return. True if it did, so nothing fn needs (a lock
 * of the library's, say) is held where the caller stands. Either way
 * side_call_join must follow once the caller has moved on: a call that
 * could not finish goes on when what it waited for is let go.
 */
typedef struct side_call {
    pthread_t th;
    void (*fn)(void *);
    void *arg;
    atomic_int done;
    bool started;
} side_call;

static inline void *side_call_main(void *p)
{
    side_call *c = p;
    c->fn(c->arg);
    atomic_store_explicit(&c->done, 1, memory_order_release);
    return NULL;
}

static inline bool side_call_returns(side_call *c, void (*fn)(void *), void *arg,
                                     uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    c->fn = fn;
    c->arg = arg;
    atomic_store(&c->done, 0);
    if (!(c->started = pthread_create(&c->th, NULL, side_call_main, c) == 0))
        return false;
    while (!atomic_load_explicit(&c->done, memory_order_acquire)) {
        if (now_ns() > end)
            return false;
        sleep_us(100);
    }
    return true;
}

/* For a hook: the first call while *armed runs side_call_returns (up to
 * 2 s) and stores its answer in *returned; later calls do nothing. */
static inline void side_call_once(atomic_int *armed, side_call *c, void (*fn)(void *),
                                  atomic_int *returned)
{
    if (atomic_exchange(armed, 0))
        atomic_store(returned, side_call_returns(c, fn, NULL, ATAP_SEC(2)));
}

static inline void side_call_join(side_call *c)
{
    if (c->started)
        pthread_join(c->th, NULL);
    c->started = false;
}

/* ATAP_TEST_FILTER=pattern runs only the tests whose names match (cmocka's
 * filter: '*' and '?' wildcards), in any file that includes cmocka.h first. */
#ifdef cmocka_unit_test
__attribute__((constructor)) static void test_filter_from_env(void)
{
    const char *f = getenv("ATAP_TEST_FILTER");

    if (f && *f)
        cmocka_set_test_filter(f);
}
#endif

#endif

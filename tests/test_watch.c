/*
 * Parks on a signal (atap_park_signal) and on changes to a file or a
 * directory (atap_park_path): what resumes them, with which reason and
 * events, several parks on one source, timeouts, cancels, bad arguments,
 * and a source whose watch cannot be renewed (atap_inject_watch_failures).
 *
 * A park is armed after its run returns ATAP_PARKED, on the worker, before
 * the worker counts itself idle: the tests raise a signal or change a file
 * only once the task has counted its park and no worker is busy (see
 * wait_parked), so "one raise resumes it" is exact. Only SIGUSR1 and
 * SIGUSR2 are used, and only once libatap catches them (from the first park
 * on; before that their default action would end the process). Files live
 * in a fresh directory under /tmp per test, removed by the teardown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "faults.h"  /* atap__owed_watch_failures */
#include "manager.h" /* atap__manager_restarts */
#include "poller.h"  /* atap__poller_name: which kernel watches paths */
#include "test_util.h"
#include "testing.h" /* atap__test_on */

/* ---- setup: a runtime and a temp directory ------------------------------- */

static char g_dir[64];

static int setup_watch(void **state)
{
    strcpy(g_dir, "/tmp/atap_watch_XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        g_dir[0] = '\0';
        return -1;
    }
    return setup_runtime(state);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown_watch(void **state)
{
    atap_inject_watch_failures(0);
    int rc = teardown_runtime(state);
    if (g_dir[0] != '\0')
        nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_dir[0] = '\0';
    return rc;
}

/* A path in the test's directory (a rotating static buffer). */
static const char *in_dir(const char *name)
{
    static char bufs[8][128];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
    return b;
}

/* Creates (or truncates) a file with a little content. */
static void make_file(const char *path)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abc", 3), 3);
    assert_int_equal(close(fd), 0);
}

static int open_ro(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    return fd;
}

/* Appends a byte through a descriptor of its own. */
static void append_byte(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    assert_int_equal(close(fd), 0);
}

/* ---- helpers --------------------------------------------------------------- */

/* Paths are watched by kqueue's EVFILT_VNODE (macOS, the BSDs, Linux with
 * libkqueue), not by inotify: what the two kernels report differs (atap.h,
 * atap_park_path), and the tests that lean on inotify say so. */
static bool paths_by_kqueue(void) { return strcmp(atap__poller_name(), "kqueue") == 0; }

#define SKIP_BECAUSE(why)                                                                          \
    do {                                                                                           \
        print_message("skipped: %s\n", why);                                                       \
        skip();                                                                                    \
    } while (0)

/* Polls until *parks reaches want, then until no worker is inside a task and
 * nothing is queued (three polls in a row): the park counted inside the run
 * has been armed, since a worker stays busy until its run's park is. */
static bool wait_parked(atomic_int *parks, int want, uint64_t timeout_ns)
{
    if (!wait_atomic_at_least(parks, want, timeout_ns))
        return false;
    uint64_t end = now_ns() + timeout_ns;
    int calm = 0;
    for (;;) {
        struct atap_pool_stats s = pool_stats();
        if (s.busy == 0 && s.blocking_busy == 0 && s.queued == 0) {
            if (++calm >= 3)
                return true;
        } else {
            calm = 0;
        }
        if (now_ns() > end)
            return false;
        sleep_us(300);
    }
}

/* True once libatap's handler is installed for signo (raising it is then
 * safe: its default action no longer applies). */
static bool caught(int signo)
{
    struct sigaction sa;
    if (sigaction(signo, NULL, &sa) != 0)
        return false;
    return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

static void raise_signal(int signo)
{
    assert_true(caught(signo));
    assert_int_equal(kill(getpid(), signo), 0);
}

/* Polls until the counter is exactly `want` for a little while. */
static void stays_at_at(atomic_int *a, int want, unsigned ms, int line)
{
    uint64_t end = now_ns() + (uint64_t)ms * 1000000u;
    while (now_ns() < end) {
        if (atomic_load(a) != want)
            fail_msg("line %d: counter moved to %d, wanted it to stay %d", line, atomic_load(a),
                     want);
        sleep_us(1000);
    }
}
#define STAYS_AT(a, want, ms) stays_at_at((a), (want), (ms), __LINE__)

static void waited_to_live_back_at(int line)
{
    if (!wait_live_back(ATAP_SEC(20)))
        fail_msg("line %d: %zu tasks still live after 20 s, %zu when the test began", line,
                 pool_stats().live, g_live_base);
}
#define waited_to_live_back() waited_to_live_back_at(__LINE__)

/* ---- the parking task -------------------------------------------------------- */

enum { ON_SIGNAL = 1, ON_PATH = 2 };

/*
 * Parks `rounds` times (on a signal, or on fd's changes), each time with
 * `timeout`; records each resume; after the last writes the number of
 * resumes (out 8). A park call that fails ends the run with its code.
 */
struct parker {
    int on;
    int signo;        /* ON_SIGNAL */
    int fd;           /* ON_PATH */
    unsigned changes; /* ON_PATH */
    uint64_t timeout;
    int rounds;
    atomic_int runs;
    atomic_int parks;
    atomic_int resumes;
    atomic_int reason;        /* the last resume's */
    atomic_int events;        /* the last resume's */
    atomic_int reasons_ready; /* resumes by the event */
    atomic_int reasons_deadline;
    atomic_int park_rc;
    _Atomic uint64_t parked_at, resumed_at;
};

#define N_PARKERS 16
static struct parker g_parkers[N_PARKERS];

static struct parker *parker_init(int i, int on, int key, unsigned changes, uint64_t timeout,
                                  int rounds)
{
    struct parker *p = &g_parkers[i];
    p->on = on;
    p->signo = on == ON_SIGNAL ? key : 0;
    p->fd = on == ON_PATH ? key : -1;
    p->changes = changes;
    p->timeout = timeout;
    p->rounds = rounds;
    atomic_store(&p->runs, 0);
    atomic_store(&p->parks, 0);
    atomic_store(&p->resumes, 0);
    atomic_store(&p->reason, 0);
    atomic_store(&p->events, -1);
    atomic_store(&p->reasons_ready, 0);
    atomic_store(&p->reasons_deadline, 0);
    atomic_store(&p->park_rc, 0);
    atomic_store(&p->parked_at, 0);
    atomic_store(&p->resumed_at, 0);
    return p;
}

static int task_parker(atap_ctx *ctx, void *arg, void *out)
{
    struct parker *p = arg;

    atomic_fetch_add(&p->runs, 1);
    if (atap_resumed(ctx)) {
        int reason = atap_resume_reason(ctx);
        atomic_store(&p->resumed_at, atap_now());
        atomic_store(&p->reason, reason);
        atomic_store(&p->events, (int)atap_resume_events(ctx));
        atomic_fetch_add(reason == ATAP_RESUME_READY ? &p->reasons_ready : &p->reasons_deadline, 1);
        int n = atomic_fetch_add(&p->resumes, 1) + 1;
        if (n >= p->rounds) {
            uint64_t v = (uint64_t)n;
            memcpy(out, &v, sizeof v);
            return 0;
        }
    }
    int rc = p->on == ON_SIGNAL ? atap_park_signal(ctx, p->signo, p->timeout)
                                : atap_park_path(ctx, p->fd, p->changes, p->timeout);
    atomic_store(&p->park_rc, rc);
    if (rc != 0)
        return rc;
    atomic_store(&p->parked_at, atap_now());
    atomic_fetch_add(&p->parks, 1);
    return ATAP_PARKED;
}

static atap_task spawn_parker(struct parker *p) { return spawn8(task_parker, p); }

/* Joins within 20 s; asserts success; returns the resumes it wrote. */
static uint64_t join_parker_at(atap_task t, int line)
{
    uint64_t v = 0;
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(20));
    if (rc != 0)
        fail_msg("line %d: the parked task joined %d (%s)", line, rc, atap_strerror(rc));
    return v;
}
#define join_parker(t) join_parker_at((t), __LINE__)

static void expect_resumes_at(struct parker *p, int want, int line)
{
    if (!wait_atomic_at_least(&p->resumes, want, ATAP_SEC(20)))
        fail_msg("line %d: %d resume(s) after 20 s, wanted %d (parks %d)", line,
                 atomic_load(&p->resumes), want, atomic_load(&p->parks));
}
#define expect_resumes(p, want) expect_resumes_at((p), (want), __LINE__)

/* Makes sure libatap catches both signals before anything raises one: a
 * short park on each (its timeout resumes it), joined. The join also orders
 * the creation of libatap's signal pipe (by a worker, at the first park)
 * before this thread's raises, which TSan cannot see through the kernel. */
static void catch_signals(void)
{
    if (caught(SIGUSR1) && caught(SIGUSR2))
        return;
    struct parker *a = parker_init(N_PARKERS - 1, ON_SIGNAL, SIGUSR1, 0, ATAP_MS(1), 1);
    struct parker *b = parker_init(N_PARKERS - 2, ON_SIGNAL, SIGUSR2, 0, ATAP_MS(1), 1);
    atap_task ta = spawn_parker(a), tb = spawn_parker(b);
    join_parker(ta);
    join_parker(tb);
    atap_release(ta);
    atap_release(tb);
    assert_true(caught(SIGUSR1));
    assert_true(caught(SIGUSR2));
}

/* ---- signals ------------------------------------------------------------------- */

static void test_watch_signal_resumes_each_round(void **state)
{
    (void)state;
    enum { ROUNDS = 3 };
    catch_signals();
    struct parker *p = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, ROUNDS);
    atap_task t = spawn_parker(p);

    for (int r = 0; r < ROUNDS; r++) {
        assert_true(wait_parked(&p->parks, r + 1, ATAP_SEC(20)));
        assert_int_equal(atomic_load(&p->resumes), r);
        assert_false(atap_finished(t));
        raise_signal(SIGUSR1); /* once */
        expect_resumes(p, r + 1);
        assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
        assert_int_equal(atomic_load(&p->events), 0); /* a signal reports no events */
    }
    assert_int_equal(join_parker(t), ROUNDS);
    assert_int_equal(atomic_load(&p->runs), ROUNDS + 1);
    assert_int_equal(atomic_load(&p->parks), ROUNDS);
    assert_int_equal(atomic_load(&p->reasons_ready), ROUNDS);
    atap_release(t);

    /* the same through pthread_kill of this (the main) thread */
    p = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_true(caught(SIGUSR1));
    assert_int_equal(pthread_kill(pthread_self(), SIGUSR1), 0);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    atap_release(t);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_signal_many_parked_one_raise(void **state)
{
    (void)state;
    enum { N = 8 };
    atap_task ts[N];
    catch_signals();

    /* one parked on SIGUSR1 the whole time: SIGUSR2 leaves it alone */
    struct parker *other = parker_init(N, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, 1);
    atap_task to = spawn_parker(other);
    for (int i = 0; i < N; i++)
        ts[i] = spawn_parker(parker_init(i, ON_SIGNAL, SIGUSR2, 0, ATAP_FOREVER, 1));
    assert_true(wait_parked(&other->parks, 1, ATAP_SEC(20)));
    for (int i = 0; i < N; i++)
        assert_true(wait_parked(&g_parkers[i].parks, 1, ATAP_SEC(20)));
    struct atap_pool_stats s = pool_stats();
    assert_int_equal(s.busy, 0); /* parked: no thread held */
    assert_true(s.live >= g_live_base + N + 1);

    raise_signal(SIGUSR2); /* once, for all of them */
    for (int i = 0; i < N; i++) {
        assert_int_equal(join_parker(ts[i]), 1);
        assert_int_equal(atomic_load(&g_parkers[i].reason), ATAP_RESUME_READY);
        atap_release(ts[i]);
    }
    STAYS_AT(&other->resumes, 0, 100);
    assert_false(atap_finished(to));

    /* a cancel takes the signal park down; the signal then wakes no one */
    assert_int_equal(atap_cancel(to), 0);
    uint64_t v;
    assert_int_equal(atap_join_for(to, &v, sizeof v, ATAP_SEC(20)), ATAP_ECANCELLED);
    atap_release(to);
    waited_to_live_back();
    raise_signal(SIGUSR1);
    STAYS_AT(&other->runs, 1, 100);

    /* and a new park on it still works */
    struct parker *p = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, 1);
    atap_task t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    raise_signal(SIGUSR1);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    atap_release(t);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_signal_timeout(void **state)
{
    (void)state;
    catch_signals();
    struct parker *p = parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_MS(50), 1);
    atap_task t = spawn_parker(p);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_DEADLINE);
    assert_int_equal(atomic_load(&p->events), 0);
    assert_true(atomic_load(&p->resumed_at) - atomic_load(&p->parked_at) >= ATAP_MS(50));
    atap_release(t);

    /* a timeout the signal beats: READY, well before it */
    p = parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_SEC(60), 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    raise_signal(SIGUSR2);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    atap_release(t);

    /* rounds alternating: a deadline, then a signal, on one task */
    p = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_MS(30), 2);
    t = spawn_parker(p);
    expect_resumes(p, 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_DEADLINE);
    assert_int_equal(join_parker(t), 2);
    assert_int_equal(atomic_load(&p->reasons_deadline), 2);
    atap_release(t);
    waited_to_live_back();
    assert_no_failures();
}

/* A signal that comes while nothing is parked on it is dropped: a park
 * made later is not resumed by it. Also across a runtime restart. */
static void test_watch_signal_unparked_is_dropped(void **state)
{
    (void)state;
    catch_signals();
    raise_signal(SIGUSR2); /* nobody parked: dropped */
    sleep_ms(200);
    struct parker *p = parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_MS(200), 1);
    atap_task t = spawn_parker(p);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_DEADLINE);
    atap_release(t);
    waited_to_live_back();

    /* raised while no runtime runs, then a park in the next runtime */
    assert_int_equal(atap_shutdown(), 0);
    raise_signal(SIGUSR2);
    sleep_ms(50);
    assert_int_equal(atap_init(NULL), 0);
    p = parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_MS(200), 1);
    t = spawn_parker(p);
    assert_int_equal(join_parker(t), 1);
    int reason = atomic_load(&p->reason);
    atap_release(t);
    if (reason != ATAP_RESUME_DEADLINE)
        fail_msg("a park made after a restart was resumed (reason %d) by a signal raised "
                 "before it, while no runtime ran",
                 reason);
    waited_to_live_back();
    assert_no_failures();
}

static struct {
    atomic_int runs;
    atomic_int block_rc;
} g_bad;

static int task_bad_signal_calls(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atomic_fetch_add(&g_bad.runs, 1);
    if (atap_resumed(ctx))
        return 0;
    /* Faults among them: a handler that returns from one re-runs it. */
    const int bad[] = {0,       -1,     SIGKILL, SIGSTOP, NSIG,    NSIG + 5, 100000,
                       SIGSEGV, SIGBUS, SIGFPE,  SIGILL,  SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(atap_park_signal(ctx, bad[i], ATAP_FOREVER) == ATAP_EINVAL);
#ifdef SIGRTMIN
    /* The ones the C library keeps for itself (glibc: 32 and 33). */
    for (int sig = 32; sig < SIGRTMIN; sig++)
        CHECK(atap_park_signal(ctx, sig, ATAP_FOREVER) == ATAP_EINVAL);
#endif
    CHECK(atap_park_signal(ctx, SIGUSR1, ATAP_MS(5)) == 0);
    CHECK(atap_park_signal(ctx, SIGUSR1, ATAP_MS(5)) == ATAP_EINVAL); /* a second one */
    CHECK(atap_park_until(ctx, atap_now()) == ATAP_EINVAL);
    return ATAP_PARKED;
}

static int block_park_signal(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atomic_store(&g_bad.block_rc, atap_park_signal(ctx, SIGUSR1, ATAP_MS(1)));
    return 0;
}

static void test_watch_signal_bad_arguments(void **state)
{
    (void)state;
    assert_int_equal(atap_park_signal(NULL, SIGUSR1, ATAP_FOREVER), ATAP_EINVAL);
    assert_int_equal(atap_park_signal(NULL, SIGKILL, ATAP_FOREVER), ATAP_EINVAL);
    atomic_store(&g_bad.runs, 0);
    atap_task t = ATAP_NO_TASK;
    assert_int_equal(atap_spawn(&t, task_bad_signal_calls, NULL, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(20)), 0);
    assert_int_equal(atomic_load(&g_bad.runs), 2); /* parked once, resumed once */
    atap_release(t);

    /* inside atap_block: refused (its handler needs the manager) */
    atomic_store(&g_bad.block_rc, 0);
    assert_int_equal(atap_block(block_park_signal, NULL, NULL, 0), 0);
    assert_int_equal(atomic_load(&g_bad.block_rc), ATAP_EINVAL);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- counted signals: atap_signal_count, atap_park_signal_since ------------------ */

struct since_arg {
    uint64_t seen, timeout;
    atomic_int runs, parks, reason;
};

static int task_park_since(atap_ctx *ctx, void *arg, void *out)
{
    struct since_arg *a = arg;

    (void)out;
    if (atomic_fetch_add(&a->runs, 1) > 0) {
        atomic_store(&a->reason, atap_resume_reason(ctx));
        return 0;
    }
    CHECK(atap_park_signal_since(ctx, SIGUSR2, a->seen, a->timeout) == 0);
    atomic_fetch_add(&a->parks, 1);
    return ATAP_PARKED;
}

/* A delivery that came before the park (nobody parked: atap_park_signal
 * would drop it) resumes a park since the count seen before it, at once. */
static void test_watch_signal_since_keeps_early_delivery(void **state)
{
    static struct since_arg a = {.timeout = ATAP_SEC(60)};
    uint64_t c0, c1;
    atap_task t;

    (void)state;
    assert_int_equal(atap_signal_count(SIGUSR2, &c0), 0); /* caught from here on */
    assert_true(caught(SIGUSR2));
    assert_int_equal(raise(SIGUSR2), 0); /* this thread's: counted before raise returns */
    assert_int_equal(atap_signal_count(SIGUSR2, &c1), 0);
    assert_true(c1 == c0 + 1);
    a.seen = c0;
    assert_int_equal(atap_spawn(&t, task_park_since, &a, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(20)), 0);
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_READY);
    atap_release(t);
    waited_to_live_back();
    assert_no_failures();
}

/* With the count as it is, a park since it waits: for its timeout, or for
 * the next delivery. */
static void test_watch_signal_since_waits_for_the_next(void **state)
{
    static struct since_arg a = {.timeout = ATAP_MS(50)}, b = {.timeout = ATAP_SEC(60)};
    uint64_t t0;
    atap_task t;

    (void)state;
    assert_int_equal(atap_signal_count(SIGUSR2, &a.seen), 0);
    t0 = atap_now();
    assert_int_equal(atap_spawn(&t, task_park_since, &a, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(20)), 0);
    assert_true(atap_now() - t0 >= ATAP_MS(50));
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_DEADLINE);
    atap_release(t);

    assert_int_equal(atap_signal_count(SIGUSR2, &b.seen), 0);
    assert_int_equal(atap_spawn(&t, task_park_since, &b, NULL), 0);
    assert_true(wait_parked(&b.parks, 1, ATAP_SEC(20)));
    assert_int_equal(atomic_load(&b.runs), 1);
    raise_signal(SIGUSR2);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(20)), 0);
    assert_int_equal(atomic_load(&b.reason), ATAP_RESUME_READY);
    atap_release(t);
    waited_to_live_back();
    assert_no_failures();
}

static int block_park_since(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    return atap_park_signal_since(ctx, SIGUSR2, 0, ATAP_MS(1)) == ATAP_EINVAL ? 0 : ATAP_EFAILED;
}

static void test_watch_signal_count_bad_arguments(void **state)
{
    uint64_t c = 7;

    (void)state;
    assert_int_equal(atap_signal_count(SIGUSR2, NULL), ATAP_EINVAL);
    assert_int_equal(atap_signal_count(SIGKILL, &c), ATAP_EINVAL);
    assert_int_equal(atap_signal_count(SIGSEGV, &c), ATAP_EINVAL);
    assert_int_equal(atap_signal_count(0, &c), ATAP_EINVAL);
    assert_int_equal(atap_signal_count(NSIG, &c), ATAP_EINVAL);
    assert_int_equal(c, 7); /* untouched on an error */
    assert_int_equal(atap_park_signal_since(NULL, SIGUSR2, 0, ATAP_FOREVER), ATAP_EINVAL);
    assert_int_equal(atap_park_signal_since(NULL, SIGKILL, 0, ATAP_FOREVER), ATAP_EINVAL);
    assert_int_equal(atap_block(block_park_since, NULL, NULL, 0), 0);
    assert_no_failures();
}

/* ---- path changes ------------------------------------------------------------------ */

/* Too many changes at once overflow inotify's queue: the changes past the
 * overflow are lost, and every path park resumes (it used to wait for its
 * timeout, or for ever). The manager is held (a test hook) while the queue
 * fills, then the watched file is written. */
static atomic_int ovf_held;

static void hold_source_read(void)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&ovf_held, &expected, 1)) {
        sleep_ms(1500);
        atomic_store(&ovf_held, 2);
    }
}

static void test_watch_path_queue_overflow(void **state)
{
    (void)state;
    unsigned long most = 0;
    if (paths_by_kqueue())
        SKIP_BECAUSE("inotify's queue overflowing; kqueue keeps no queue of changes to fill");
    FILE *q = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
    if (!q || fscanf(q, "%lu", &most) != 1 || most > 200000) {
        if (q)
            fclose(q);
        skip(); /* not a kernel queue this test can fill */
    }
    fclose(q);
    const char *dir = in_dir("ovf");
    assert_int_equal(mkdir(dir, 0755), 0);
    const char *x = in_dir("ovf_x");
    make_file(x);
    int dfd = open_ro(dir), xfd = open_ro(x);
    struct parker *c = parker_init(0, ON_PATH, dfd, ATAP_PATH_ENTRIES, ATAP_SEC(30), 1);
    struct parker *a = parker_init(1, ON_PATH, xfd, ATAP_PATH_WRITE, ATAP_SEC(10), 1);
    struct parker *g = parker_init(2, ON_PATH, xfd, ATAP_PATH_GONE, ATAP_SEC(10), 1);
    atap_task tc = spawn_parker(c), ta = spawn_parker(a), tg = spawn_parker(g);
    assert_true(wait_parked(&c->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&g->parks, 1, ATAP_SEC(20)));

    atomic_store(&ovf_held, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_SOURCE_READ, hold_source_read), 0);
    char name[160];
    snprintf(name, sizeof name, "%s/f", dir);
    int fd = open(name, O_CREAT | O_WRONLY | O_CLOEXEC, 0644); /* wakes the manager */
    assert_true(fd >= 0);
    close(fd);
    assert_true(wait_atomic_at_least(&ovf_held, 1, ATAP_SEC(20)));
    uint64_t t0 = now_ns();
    for (unsigned long i = 0; i < most / 2 + 1000 && atomic_load(&ovf_held) == 1; i++) {
        assert_int_equal(unlink(name), 0);
        fd = open(name, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        close(fd);
    }
    bool filled = atomic_load(&ovf_held) == 1;
    append_byte(x); /* lost past the overflow */
    assert_true(wait_atomic_at_least(&ovf_held, 2, ATAP_SEC(20)));
    assert_int_equal(atap__test_on(ATAP__TEST_SOURCE_READ, NULL), 0);
    if (filled) { /* the queue filled while the manager was held */
        expect_resumes(a, 1);
        assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&a->resumed_at) - t0 < ATAP_SEC(8)); /* not its timeout */
        /* one that waits for GONE alone resumes too, told nothing is gone */
        expect_resumes(g, 1);
        assert_int_equal(atomic_load(&g->reason), ATAP_RESUME_READY);
        assert_false((unsigned)atomic_load(&g->events) & ATAP_PATH_GONE);
    } else {
        print_message("the queue did not fill: nothing checked\n");
    }
    join_parker(ta);
    join_parker(tc);
    join_parker(tg);
    atap_release(ta);
    atap_release(tc);
    atap_release(tg);
    close(dfd);
    close(xfd);
    waited_to_live_back();
}

static void test_watch_path_write(void **state)
{
    (void)state;
    const char *f = in_dir("w");
    make_file(f);
    int fd = open_ro(f);
    /* Written through a descriptor kept open: a write and its close are
     * two changes (the close of a written file counts as a write too), and
     * the close could resume the next round's park. */
    int wfd = open(f, O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(wfd >= 0);
    struct parker *p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 3);
    atap_task t = spawn_parker(p);

    for (int r = 0; r < 3; r++) {
        assert_true(wait_parked(&p->parks, r + 1, ATAP_SEC(20)));
        assert_int_equal(atomic_load(&p->resumes), r);
        assert_int_equal(write(wfd, "y", 1), 1); /* once */
        expect_resumes(p, r + 1);
        assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
        unsigned ev = (unsigned)atomic_load(&p->events);
        if (!(ev & ATAP_PATH_WRITE) || (ev & ATAP_PATH_GONE))
            fail_msg("round %d: resumed with events 0x%x, wanted ATAP_PATH_WRITE", r, ev);
    }
    assert_int_equal(join_parker(t), 3);
    atap_release(t);
    assert_int_equal(close(wfd), 0);
    waited_to_live_back();

    /* the close of a written file alone is a write change (inotify's
     * IN_CLOSE_WRITE; kqueue reports no close) */
    if (!paths_by_kqueue()) {
        wfd = open(f, O_WRONLY | O_APPEND | O_CLOEXEC);
        assert_true(wfd >= 0);
        assert_int_equal(write(wfd, "z", 1), 1);
        p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
        t = spawn_parker(p);
        assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
        assert_int_equal(close(wfd), 0);
        assert_int_equal(join_parker(t), 1);
        assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_WRITE);
        atap_release(t);
    } else {
        print_message("kqueue: a written file's close is no change; not checked\n");
    }

    /* a truncate through another name for it is a write too */
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(truncate(f, 1), 0);
    assert_int_equal(join_parker(t), 1);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_WRITE);
    atap_release(t);
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_attrib(void **state)
{
    (void)state;
    const char *f = in_dir("a");
    make_file(f);
    int fd = open_ro(f);
    struct parker *p = parker_init(0, ON_PATH, fd, ATAP_PATH_ATTRIB, ATAP_FOREVER, 1);
    atap_task t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));

    /* a write is not what it asked for */
    append_byte(f);
    STAYS_AT(&p->resumes, 0, 150);
    assert_int_equal(atomic_load(&p->runs), 1);

    assert_int_equal(chmod(f, 0600), 0);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    unsigned ev = (unsigned)atomic_load(&p->events);
    if (!(ev & ATAP_PATH_ATTRIB))
        fail_msg("resumed with events 0x%x, wanted ATAP_PATH_ATTRIB", ev);
    atap_release(t);

    /* asking for both: either change resumes it */
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_ATTRIB | ATAP_PATH_WRITE, ATAP_FOREVER, 2);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(fchmod(fd, 0640), 0);
    expect_resumes(p, 1);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_ATTRIB);
    assert_true(wait_parked(&p->parks, 2, ATAP_SEC(20)));
    append_byte(f);
    assert_int_equal(join_parker(t), 2);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_WRITE);
    atap_release(t);
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_directory_entries(void **state)
{
    (void)state;
    const char *d = in_dir("d");
    assert_int_equal(mkdir(d, 0755), 0);
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dfd >= 0);
    struct parker *p = parker_init(0, ON_PATH, dfd, ATAP_PATH_ENTRIES, ATAP_FOREVER, 3);
    atap_task t = spawn_parker(p);
    char name[160];

    /* created */
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    snprintf(name, sizeof name, "%s/new", d);
    make_file(name);
    expect_resumes(p, 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_ENTRIES);
    /* renamed */
    assert_true(wait_parked(&p->parks, 2, ATAP_SEC(20)));
    char name2[160];
    snprintf(name2, sizeof name2, "%s/renamed", d);
    assert_int_equal(rename(name, name2), 0);
    expect_resumes(p, 2);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_ENTRIES);
    /* removed */
    assert_true(wait_parked(&p->parks, 3, ATAP_SEC(20)));
    assert_int_equal(unlink(name2), 0);
    assert_int_equal(join_parker(t), 3);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_ENTRIES);
    assert_int_equal(atomic_load(&p->reasons_ready), 3);
    atap_release(t);
    close(dfd);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_gone(void **state)
{
    (void)state;

    /* unlinked: gone once the last name and the last open descriptor are */
    const char *f = in_dir("g");
    make_file(f);
    int fd = open_ro(f);
    struct parker *p = parker_init(0, ON_PATH, fd, ATAP_PATH_GONE, ATAP_FOREVER, 1);
    atap_task t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(unlink(f), 0);
    if (wait_atomic_at_least(&p->resumes, 1, ATAP_MS(300)))
        print_message("unlink alone resumed it (fd still open)\n");
    else
        print_message("unlink with the fd still open did not resume it; closing the fd\n");
    close(fd);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    unsigned ev = (unsigned)atomic_load(&p->events);
    if (!(ev & ATAP_PATH_GONE))
        fail_msg("resumed with events 0x%x, wanted ATAP_PATH_GONE", ev);
    atap_release(t);

    /* asked for writes only: gone is always asked */
    f = in_dir("g2");
    make_file(f);
    fd = open_ro(f);
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(unlink(f), 0);
    close(fd);
    assert_int_equal(join_parker(t), 1);
    ev = (unsigned)atomic_load(&p->events);
    if (!(ev & ATAP_PATH_GONE))
        fail_msg("resumed with events 0x%x, wanted ATAP_PATH_GONE", ev);
    atap_release(t);

    /* moved away: gone at once, the descriptor still open */
    f = in_dir("m");
    make_file(f);
    fd = open_ro(f);
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_GONE, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(rename(f, in_dir("m2")), 0);
    assert_int_equal(join_parker(t), 1);
    ev = (unsigned)atomic_load(&p->events);
    if (!(ev & ATAP_PATH_GONE))
        fail_msg("resumed with events 0x%x, wanted ATAP_PATH_GONE", ev);
    atap_release(t);
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_timeout(void **state)
{
    (void)state;
    const char *f = in_dir("t");
    make_file(f);
    int fd = open_ro(f);
    struct parker *p =
        parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB, ATAP_MS(80), 1);
    atap_task t = spawn_parker(p);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_DEADLINE);
    assert_int_equal(atomic_load(&p->events), 0);
    assert_true(atomic_load(&p->resumed_at) - atomic_load(&p->parked_at) >= ATAP_MS(80));
    atap_release(t);

    /* a read is no change: still the deadline */
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE | ATAP_PATH_ATTRIB, ATAP_MS(150), 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    char buf[4];
    assert_true(pread(fd, buf, sizeof buf, 0) > 0);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_DEADLINE);
    atap_release(t);

    /* after the timeout the file's watch still works */
    p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_SEC(60), 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    append_byte(f);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    atap_release(t);
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_many_parks_one_file(void **state)
{
    (void)state;
    enum { N = 6 };
    const char *f = in_dir("many");
    make_file(f);
    int fd1 = open_ro(f), fd2 = open_ro(f);
    atap_task ts[N];

    /* half through one descriptor, half through another of the same file */
    for (int i = 0; i < N; i++)
        ts[i] = spawn_parker(
            parker_init(i, ON_PATH, i % 2 ? fd2 : fd1, ATAP_PATH_WRITE, ATAP_FOREVER, 1));
    /* and one asking for another change */
    struct parker *attr = parker_init(N, ON_PATH, fd1, ATAP_PATH_ATTRIB, ATAP_FOREVER, 1);
    atap_task ta = spawn_parker(attr);
    for (int i = 0; i < N; i++)
        assert_true(wait_parked(&g_parkers[i].parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&attr->parks, 1, ATAP_SEC(20)));

    append_byte(f); /* once */
    for (int i = 0; i < N; i++) {
        assert_int_equal(join_parker(ts[i]), 1);
        assert_int_equal(atomic_load(&g_parkers[i].reason), ATAP_RESUME_READY);
        assert_true((unsigned)atomic_load(&g_parkers[i].events) & ATAP_PATH_WRITE);
        atap_release(ts[i]);
    }
    STAYS_AT(&attr->resumes, 0, 100);
    assert_int_equal(chmod(f, 0600), 0);
    assert_int_equal(join_parker(ta), 1);
    assert_true((unsigned)atomic_load(&attr->events) & ATAP_PATH_ATTRIB);
    atap_release(ta);

    /* parks on two files at once: a change to one resumes only its own */
    const char *g = in_dir("other");
    make_file(g);
    int fd3 = open_ro(g);
    struct parker *pf = parker_init(0, ON_PATH, fd1, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    struct parker *pg = parker_init(1, ON_PATH, fd3, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    atap_task tf = spawn_parker(pf), tg = spawn_parker(pg);
    assert_true(wait_parked(&pf->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&pg->parks, 1, ATAP_SEC(20)));
    append_byte(g);
    assert_int_equal(join_parker(tg), 1);
    STAYS_AT(&pf->resumes, 0, 100);
    append_byte(f);
    assert_int_equal(join_parker(tf), 1);
    atap_release(tf);
    atap_release(tg);
    close(fd1);
    close(fd2);
    close(fd3);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_cancel(void **state)
{
    (void)state;
    const char *f = in_dir("c");
    make_file(f);
    int fd = open_ro(f);

    /* the only park on the file, cancelled */
    struct parker *p = parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    atap_task t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(t), 0);
    uint64_t v;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(20)), ATAP_ECANCELLED);
    assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
    atap_release(t);
    waited_to_live_back();
    append_byte(f); /* wakes nothing */
    STAYS_AT(&p->runs, 1, 100);

    /* a later park on the same file still works */
    p = parker_init(1, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
    append_byte(f);
    assert_int_equal(join_parker(t), 1);
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    atap_release(t);

    /* two parks, one cancelled: the other still resumes */
    struct parker *a = parker_init(2, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    struct parker *b = parker_init(3, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    atap_task ta = spawn_parker(a), tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(ta), 0);
    assert_int_equal(atap_join_for(ta, &v, sizeof v, ATAP_SEC(20)), ATAP_ECANCELLED);
    append_byte(f);
    assert_int_equal(join_parker(tb), 1);
    assert_int_equal(atomic_load(&a->runs), 1);
    atap_release(ta);
    atap_release(tb);

    /* repeatedly: cancel, park again, change */
    for (int i = 0; i < 10; i++) {
        p = parker_init(4, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
        t = spawn_parker(p);
        assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(20)), ATAP_ECANCELLED);
        atap_release(t);
        p = parker_init(5, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
        t = spawn_parker(p);
        assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
        append_byte(f);
        assert_int_equal(join_parker(t), 1);
        atap_release(t);
    }
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- a source whose watch cannot be renewed ------------------------------------ */

/* Injects n failures of the next source re-watches, once what an earlier
 * test left in the sources has been read (an inotify watch removed queues a
 * report of its own, which could take the fault). */
static void inject_watch_failures(unsigned n)
{
    sleep_ms(50);
    atap_inject_watch_failures(n);
}

/* Fewer than owed_before faults are owed now (within 10 s): the report
 * that resumed the first park spent one, and the source was deaf. */
static void fault_taken_at(unsigned owed_before, int line)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (atomic_load(&atap__owed_watch_failures) >= owed_before) {
        if (now_ns() > end)
            fail_msg("line %d: %u faults still owed, wanted fewer than %u", line,
                     atomic_load(&atap__owed_watch_failures), owed_before);
        sleep_ms(1);
    }
}
#define fault_taken(owed_before) fault_taken_at((owed_before), __LINE__)

/* A signal source whose watch fails once after a report (the kernel out of
 * memory) still resumes a task already parked on another signal, which has
 * no timeout: the manager reads the deaf source at its next tick. It used
 * to stay parked until some later park watched the pipe again. */
static void test_watch_signal_rewatch_fails(void **state)
{
    (void)state;
    catch_signals();
    struct parker *a = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, 1);
    struct parker *b = parker_init(1, ON_SIGNAL, SIGUSR2, 0, ATAP_FOREVER, 1);
    atap_task ta = spawn_parker(a), tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));

    inject_watch_failures(1);
    raise_signal(SIGUSR1); /* resumes a; the pipe's watch is not renewed */
    assert_int_equal(join_parker(ta), 1);
    assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
    fault_taken(1);
    uint64_t raised = now_ns();
    raise_signal(SIGUSR2); /* nothing parks meanwhile to watch the pipe again */
    assert_int_equal(join_parker(tb), 1);
    assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
    assert_int_equal(atomic_load(&b->events), 0);
    assert_true(now_ns() - raised < ATAP_SEC(5)); /* a tick or so, not a timeout */
    atap_release(ta);
    atap_release(tb);

    /* Failing at every try: each tick still reads the pipe (and tries
     * again), so every signal reaches its parks. */
    a = parker_init(0, ON_SIGNAL, SIGUSR1, 0, ATAP_FOREVER, 1);
    b = parker_init(1, ON_SIGNAL, SIGUSR2, 0, ATAP_SEC(60), 1);
    ta = spawn_parker(a);
    tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));
    inject_watch_failures(1000000);
    raise_signal(SIGUSR1);
    assert_int_equal(join_parker(ta), 1);
    fault_taken(1000000);
    raise_signal(SIGUSR2);
    assert_int_equal(join_parker(tb), 1);
    assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
    fault_taken(1000000 - 2); /* the ticks go on trying */
    atap_inject_watch_failures(0);
    atap_release(ta);
    atap_release(tb);

    /* and the source is heard as ever */
    a = parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_FOREVER, 1);
    ta = spawn_parker(a);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    raise_signal(SIGUSR2);
    assert_int_equal(join_parker(ta), 1);
    assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
    atap_release(ta);
    waited_to_live_back();
    assert_no_failures();
}

/* kqueue: each file has a watch of its own, renewed after a report only
 * for the parks still on that file. A renewal that fails is changes lost
 * for them (atap.h): they resume at once, told the file may have been
 * written, changed and had its entries changed (never GONE), while another
 * file's parks are not touched. */
static void path_rewatch_fails_kqueue(void)
{
    const char *fa = in_dir("ra"), *fb = in_dir("rb");
    make_file(fa);
    make_file(fb);
    int afd = open_ro(fa), bfd = open_ro(fb);
    struct parker *a = parker_init(0, ON_PATH, afd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    struct parker *a2 = parker_init(1, ON_PATH, afd, ATAP_PATH_ATTRIB, ATAP_FOREVER, 1);
    struct parker *b = parker_init(2, ON_PATH, bfd, ATAP_PATH_WRITE, ATAP_SEC(60), 1);
    atap_task ta = spawn_parker(a), ta2 = spawn_parker(a2), tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&a2->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));

    inject_watch_failures(1);
    append_byte(fa); /* resumes a; fa's watch is not renewed for a2 */
    assert_int_equal(join_parker(ta), 1);
    assert_true((unsigned)atomic_load(&a->events) & ATAP_PATH_WRITE);
    fault_taken(1);
    assert_int_equal(join_parker(ta2), 1); /* changes lost: resumed at once */
    assert_int_equal(atomic_load(&a2->reason), ATAP_RESUME_READY);
    unsigned ev = (unsigned)atomic_load(&a2->events);
    assert_true(ev & ATAP_PATH_ATTRIB);
    assert_false(ev & ATAP_PATH_GONE);
    assert_int_equal(atomic_load(&b->resumes), 0); /* fb's own watch holds */
    uint64_t changed = now_ns();
    append_byte(fb);
    assert_int_equal(join_parker(tb), 1);
    assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
    assert_true((unsigned)atomic_load(&b->events) & ATAP_PATH_WRITE);
    assert_true(now_ns() - changed < ATAP_SEC(5));
    atap_release(ta);
    atap_release(ta2);
    atap_release(tb);

    /* and heard as ever: the next park watches the file anew */
    a = parker_init(0, ON_PATH, afd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    ta = spawn_parker(a);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    append_byte(fa);
    assert_int_equal(join_parker(ta), 1);
    assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
    atap_release(ta);
    close(afd);
    close(bfd);
    waited_to_live_back();
    assert_no_failures();
}

/* The same for the inotify source: a change to one file resumes its park,
 * the watch is not renewed, and a change to another file must still resume
 * the park waiting on that one (a long timeout, not met). kqueue has no
 * source shared by every file: path_rewatch_fails_kqueue checks what it
 * promises instead. */
static void test_watch_path_rewatch_fails(void **state)
{
    (void)state;
    if (paths_by_kqueue()) {
        path_rewatch_fails_kqueue();
        return;
    }
    const char *fa = in_dir("ra"), *fb = in_dir("rb");
    make_file(fa);
    make_file(fb);
    int afd = open_ro(fa), bfd = open_ro(fb);
    struct parker *a = parker_init(0, ON_PATH, afd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    struct parker *b = parker_init(1, ON_PATH, bfd, ATAP_PATH_WRITE, ATAP_SEC(60), 1);
    atap_task ta = spawn_parker(a), tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));

    inject_watch_failures(1);
    append_byte(fa); /* resumes a; inotify's watch is not renewed */
    assert_int_equal(join_parker(ta), 1);
    assert_true((unsigned)atomic_load(&a->events) & ATAP_PATH_WRITE);
    fault_taken(1);
    uint64_t changed = now_ns();
    append_byte(fb);
    assert_int_equal(join_parker(tb), 1);
    assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
    assert_true((unsigned)atomic_load(&b->events) & ATAP_PATH_WRITE);
    assert_true(now_ns() - changed < ATAP_SEC(5));
    atap_release(ta);
    atap_release(tb);

    /* Failing at every try: the ticks read inotify's queue meanwhile. */
    a = parker_init(0, ON_PATH, afd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    b = parker_init(1, ON_PATH, bfd, ATAP_PATH_ATTRIB, ATAP_FOREVER, 1);
    ta = spawn_parker(a);
    tb = spawn_parker(b);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    assert_true(wait_parked(&b->parks, 1, ATAP_SEC(20)));
    inject_watch_failures(1000000);
    append_byte(fa);
    assert_int_equal(join_parker(ta), 1);
    fault_taken(1000000);
    assert_int_equal(chmod(fb, 0600), 0);
    assert_int_equal(join_parker(tb), 1);
    assert_true((unsigned)atomic_load(&b->events) & ATAP_PATH_ATTRIB);
    fault_taken(1000000 - 2); /* the ticks go on trying */
    atap_inject_watch_failures(0);
    atap_release(ta);
    atap_release(tb);

    /* and heard as ever once the watch holds */
    a = parker_init(0, ON_PATH, afd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    ta = spawn_parker(a);
    assert_true(wait_parked(&a->parks, 1, ATAP_SEC(20)));
    append_byte(fa);
    assert_int_equal(join_parker(ta), 1);
    assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
    atap_release(ta);
    close(afd);
    close(bfd);
    waited_to_live_back();
    assert_no_failures();
}

static struct {
    int fd;
    atomic_int runs;
    atomic_int block_rc;
} g_badp;

static int task_bad_path_calls(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atomic_fetch_add(&g_badp.runs, 1);
    if (atap_resumed(ctx))
        return 0;
    int fd = g_badp.fd;
    CHECK(atap_park_path(ctx, -1, ATAP_PATH_WRITE, ATAP_FOREVER) == ATAP_EINVAL);
    CHECK(atap_park_path(ctx, fd, 0, ATAP_FOREVER) == ATAP_EINVAL);
    CHECK(atap_park_path(ctx, fd, ATAP_READABLE, ATAP_FOREVER) == ATAP_EINVAL);
    CHECK(atap_park_path(ctx, fd, ATAP_PATH_WRITE | 0x100u, ATAP_FOREVER) == ATAP_EINVAL);
    CHECK(atap_park_path(ctx, fd, ATAP_PATH_WRITE, ATAP_MS(5)) == 0);
    CHECK(atap_park_path(ctx, fd, ATAP_PATH_WRITE, ATAP_MS(5)) == ATAP_EINVAL); /* second */
    CHECK(atap_park_signal(ctx, SIGUSR1, ATAP_MS(5)) == ATAP_EINVAL);
    return ATAP_PARKED;
}

static int block_park_path(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    atomic_store(&g_badp.block_rc, atap_park_path(ctx, g_badp.fd, ATAP_PATH_WRITE, ATAP_MS(1)));
    return 0;
}

/* A manager that dies holding a signal's or a path's report (the injected
 * fault comes after its wait returns and before it hands out what it got;
 * the injection does not wake it, so the raise or the write is what wakes
 * it) loses nothing: before the next life the sources are read and watched
 * again. Two rounds of each, four faults in one supervisor's life (five in
 * a row is its limit). */
static void test_watch_restart_rearms(void **state)
{
    (void)state;
    catch_signals();
    const char *f = in_dir("r");
    make_file(f);
    int fd = open_ro(f);
    int wfd = open(f, O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(wfd >= 0);

    for (int r = 0; r < 4; r++) {
        bool sig = r % 2 == 0;
        struct parker *p = sig ? parker_init(0, ON_SIGNAL, SIGUSR2, 0, ATAP_FOREVER, 1)
                               : parker_init(0, ON_PATH, fd, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
        atap_task t = spawn_parker(p);
        assert_true(wait_parked(&p->parks, 1, ATAP_SEC(20)));
        unsigned restarts0 = atap__manager_restarts();
        atap_inject_manager_faults(1);
        if (sig)
            raise_signal(SIGUSR2);
        else
            assert_int_equal(write(wfd, "y", 1), 1);
        assert_int_equal(join_parker(t), 1);
        assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
        if (!sig)
            assert_true((unsigned)atomic_load(&p->events) & ATAP_PATH_WRITE);
        assert_true(wait_restarts(restarts0 + 1, ATAP_SEC(10)));
        assert_int_equal(atap__manager_restarts(), restarts0 + 1);
        assert_true(wait_manager(true, ATAP_SEC(10)));
        atap_release(t);
    }
    assert_int_equal(close(wfd), 0);
    assert_int_equal(close(fd), 0);
    waited_to_live_back();
    assert_no_failures();
}

static void test_watch_path_bad_arguments(void **state)
{
    (void)state;
    const char *f = in_dir("b");
    make_file(f);
    int fd = open_ro(f);
    g_badp.fd = fd;

    assert_int_equal(atap_park_path(NULL, fd, ATAP_PATH_WRITE, ATAP_FOREVER), ATAP_EINVAL);
    atomic_store(&g_badp.runs, 0);
    atap_task t = ATAP_NO_TASK;
    assert_int_equal(atap_spawn(&t, task_bad_path_calls, NULL, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(20)), 0);
    assert_int_equal(atomic_load(&g_badp.runs), 2);
    atap_release(t);

    atomic_store(&g_badp.block_rc, 0);
    assert_int_equal(atap_block(block_park_path, NULL, NULL, 0), 0);
    assert_int_equal(atomic_load(&g_badp.block_rc), ATAP_EINVAL);

    /* a descriptor that names nothing: the park cannot be armed; the task
     * is resumed at once (never left parked), its events saying so */
    int dead = open_ro(f);
    close(dead);
    struct parker *p = parker_init(0, ON_PATH, dead, ATAP_PATH_WRITE, ATAP_FOREVER, 1);
    t = spawn_parker(p);
    assert_int_equal(join_parker(t), 1);
    print_message("park on a closed fd: reason %d, events 0x%x\n", atomic_load(&p->reason),
                  (unsigned)atomic_load(&p->events));
    assert_int_equal(atomic_load(&p->reason), ATAP_RESUME_READY);
    assert_true((unsigned)atomic_load(&p->events) & ATAP_ERROR);
    atap_release(t);
    close(fd);
    waited_to_live_back();
    assert_no_failures();
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_watch, teardown_watch)
    const struct CMUnitTest tests[] = {
        T(test_watch_signal_resumes_each_round),
        T(test_watch_signal_many_parked_one_raise),
        T(test_watch_signal_timeout),
        T(test_watch_signal_unparked_is_dropped),
        T(test_watch_signal_bad_arguments),
        T(test_watch_signal_since_keeps_early_delivery),
        T(test_watch_signal_since_waits_for_the_next),
        T(test_watch_signal_count_bad_arguments),
        T(test_watch_path_write),
        T(test_watch_path_queue_overflow),
        T(test_watch_path_attrib),
        T(test_watch_path_directory_entries),
        T(test_watch_path_gone),
        T(test_watch_path_timeout),
        T(test_watch_path_many_parks_one_file),
        T(test_watch_path_cancel),
        T(test_watch_path_bad_arguments),
        T(test_watch_restart_rearms),
        T(test_watch_signal_rewatch_fails),
        T(test_watch_path_rewatch_fails),
    };
#undef T
    const char *only = getenv("ATAP_TEST_FILTER"); /* e.g. "*signal*" */
    if (only != NULL && *only != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

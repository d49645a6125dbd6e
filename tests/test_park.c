/*
 * Waiting inside a task: kernel waits that a cancel or a run timeout
 * interrupts (atap_sleep, atap_sleep_relaxed, atap_wait_fd), parks on an fd
 * or a deadline that give the thread back (atap_park_fd, atap_park_until,
 * ATAP_PARKED, atap_resumed ...), atap_block running a function that parks,
 * the sleep task (atap_spawn_sleep), and a kind of park of the tests' own
 * (a word, as a futex: src/park_test_word.c).
 *
 * Time: lower bounds ("never early") are exact; upper bounds are generous
 * (seconds), the CI machine being a loaded 2-core VM.
 *
 * Everything a task reads lives in static storage (a test that fails half
 * way leaves tasks behind until the teardown), and everything shared across
 * threads is an atomic.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "faults.h"  /* atap__owed_watch_failures */
#include "manager.h" /* atap__manager_restarts: restarts are seen, not guessed */
#include "park.h"    /* atap__park_wheel_due */
#include "poller.h"  /* atap__poller_name */
#include "test_util.h"
#include "testing.h" /* atap__test_on */

/* ---- helpers ------------------------------------------------------------ */

typedef _Atomic uint64_t atomic_u64;

static void make_pipe(int fds[2])
{
    assert_int_equal(pipe(fds), 0);
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        assert_true(fl >= 0);
        assert_int_equal(fcntl(fds[i], F_SETFL, fl | O_NONBLOCK), 0);
        assert_int_equal(fcntl(fds[i], F_SETFD, FD_CLOEXEC), 0);
    }
}

static void close_pipe(int fds[2])
{
    close(fds[0]);
    close(fds[1]);
    fds[0] = fds[1] = -1;
}

/* Any thread. */
static bool put_byte(int wfd) { return write(wfd, "x", 1) == 1; }

static void wait_workers_started(void)
{
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (pool_stats().workers < cores() && now_ns() < end)
        sleep_us(500);
}

/* Polls until pool stats show no worker inside a task. */
static bool wait_not_busy(uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    for (;;) {
        if (pool_stats().busy == 0)
            return true;
        if (now_ns() > end)
            return false;
        sleep_us(200);
    }
}

static atap_task spawn0(atap_fn *fn, void *arg)
{
    atap_task t = ATAP_NO_TASK;
    assert_int_equal(atap_spawn(&t, fn, arg, NULL), 0);
    return t;
}

/* ---- 1. atap_sleep sleeps at least the time asked ----------------------- */

struct sleep_arg {
    uint64_t ns;
    bool relaxed;
};

static int task_sleep_measure(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    const struct sleep_arg *a = arg;
    uint64_t t0 = atap_now();
    int rc = a->relaxed ? atap_sleep_relaxed(a->ns) : atap_sleep(a->ns);
    uint64_t el = atap_now() - t0;

    CHECK(rc == 0);
    memcpy(out, &el, sizeof el);
    return 0;
}

#define N_SLEEP_CASES 10
static struct sleep_arg g_sleep_args[N_SLEEP_CASES] = {
    {0, false},           {0, true},           {ATAP_US(300), false}, {ATAP_US(300), true},
    {ATAP_MS(1), false},  {ATAP_MS(1), true},  {ATAP_MS(7), false},   {ATAP_MS(7), true},
    {ATAP_MS(25), false}, {ATAP_MS(25), true},
};

static void test_park_sleep_never_short(void **state)
{
    (void)state;
    atap_task ts[N_SLEEP_CASES];

    /* one at a time, so a loaded pool does not blur what is measured */
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N_SLEEP_CASES; i++) {
            ts[i] = spawn8(task_sleep_measure, &g_sleep_args[i]);
            uint64_t el = join8(ts[i]);
            if (el < g_sleep_args[i].ns)
                fail_msg("%s sleep of %llu ns took %llu ns",
                         g_sleep_args[i].relaxed ? "relaxed" : "precise",
                         (unsigned long long)g_sleep_args[i].ns, (unsigned long long)el);
            atap_release(ts[i]);
        }
    }
    /* and all at once */
    for (int i = 0; i < N_SLEEP_CASES; i++)
        ts[i] = spawn8(task_sleep_measure, &g_sleep_args[i]);
    for (int i = 0; i < N_SLEEP_CASES; i++) {
        assert_true(join8(ts[i]) >= g_sleep_args[i].ns);
        atap_release(ts[i]);
    }

    /* outside a task (the test thread): a plain sleep, returning 0 */
    for (int i = 0; i < N_SLEEP_CASES; i++) {
        uint64_t t0 = atap_now();
        int rc = g_sleep_args[i].relaxed ? atap_sleep_relaxed(g_sleep_args[i].ns)
                                         : atap_sleep(g_sleep_args[i].ns);
        uint64_t el = atap_now() - t0;
        assert_int_equal(rc, 0);
        assert_true(el >= g_sleep_args[i].ns);
    }
    assert_no_failures();
}

/* ---- 2. a cancel or a run timeout interrupts a kernel wait -------------- */

enum { KW_SLEEP, KW_SLEEP_RELAXED, KW_WAIT_FD, KW_SLEEP_AFTER_CANCEL };

struct kwait {
    int kind;
    int fd;
    atomic_int started;
    atomic_int done;
    atomic_int rc;
    atomic_u64 ended; /* atap_now() when the wait returned */
};

static struct kwait g_kw;

static int task_kernel_wait(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct kwait *k = arg;
    int rc = 1;

    atomic_store(&k->started, 1);
    switch (k->kind) {
    case KW_SLEEP:
        rc = atap_sleep(ATAP_SEC(30));
        break;
    case KW_SLEEP_RELAXED:
        rc = atap_sleep_relaxed(ATAP_SEC(30));
        break;
    case KW_WAIT_FD:
        rc = atap_wait_fd(k->fd, ATAP_READABLE, ATAP_FOREVER);
        break;
    case KW_SLEEP_AFTER_CANCEL:
        /* the cancel came before the wait: it still returns at once */
        while (!atap_cancelled(ctx) && !released_all())
            sleep_us(100);
        rc = atap_sleep(ATAP_SEC(30));
        break;
    }
    atomic_store(&k->ended, atap_now());
    atomic_store(&k->rc, rc);
    atomic_store(&k->done, 1);
    return 0;
}

static const char *kw_name(int kind)
{
    switch (kind) {
    case KW_SLEEP:
        return "atap_sleep";
    case KW_SLEEP_RELAXED:
        return "atap_sleep_relaxed";
    case KW_WAIT_FD:
        return "atap_wait_fd";
    default:
        return "atap_sleep after the cancel";
    }
}

/* cancel: atap_cancel from the test thread; else a run timeout of 50 ms. */
static void kernel_wait_interrupted(int kind, bool cancel, int fd)
{
    struct kwait *k = &g_kw;
    atap_task t;
    atap_spawn_opts o = {.timeout_ns = cancel ? 0 : ATAP_MS(50)};

    k->kind = kind;
    k->fd = fd;
    atomic_store(&k->started, 0);
    atomic_store(&k->done, 0);
    atomic_store(&k->rc, 1);
    atomic_store(&k->ended, 0);
    uint64_t spawned = atap_now();
    assert_int_equal(atap_spawn(&t, task_kernel_wait, k, &o), 0);
    assert_true(wait_atomic_at_least(&k->started, 1, ATAP_SEC(10)));
    if (cancel) {
        if (kind != KW_SLEEP_AFTER_CANCEL)
            sleep_ms(20); /* well inside the wait */
        assert_int_equal(atap_cancel(t), 0);
    }
    /* the function itself comes back within 5 s, not 30 */
    if (!wait_atomic_at_least(&k->done, 1, ATAP_SEC(5)))
        fail_msg("%s (%s) did not return within 5 s", kw_name(kind),
                 cancel ? "cancel" : "run timeout");
    int rc = atomic_load(&k->rc);
    if (rc != (cancel ? ATAP_ECANCELLED : ATAP_ETIMEDOUT))
        fail_msg("%s (%s) returned %d (%s)", kw_name(kind), cancel ? "cancel" : "run timeout", rc,
                 atap_strerror(rc));
    /* The run timeout is never early. It counts from the run's claim, which
     * the test cannot see: between the spawn and the task's first line (a
     * loaded machine can preempt the worker there for milliseconds), so the
     * bound that always holds is from the spawn. */
    if (!cancel)
        assert_true(atomic_load(&k->ended) - spawned >= ATAP_MS(50));
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(5)),
                     cancel ? ATAP_ECANCELLED : ATAP_ETIMEDOUT);
    assert_int_equal(atap_state_of(t), cancel ? ATAP_CANCELLED : ATAP_TIMED_OUT);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

static void test_park_kernel_wait_interrupted(void **state)
{
    (void)state;
    int p[2];

    make_pipe(p);
    for (int kind = KW_SLEEP; kind <= KW_WAIT_FD; kind++) {
        kernel_wait_interrupted(kind, true, p[0]);
        kernel_wait_interrupted(kind, false, p[0]);
    }
    kernel_wait_interrupted(KW_SLEEP_AFTER_CANCEL, true, p[0]);
    close_pipe(p);
    assert_no_failures();
}

/* ---- 3. a leftover wake never cancels the next task --------------------- */

struct wake_round {
    atomic_int sleepers_started;
    atomic_int sleepers_done;
    atomic_int shorts_done;
    atomic_int shorts_cancelled; /* a short task that read ECANCELLED */
    atomic_int shorts_bad;       /* other nonzero, or woke early */
};

static struct wake_round g_wr;

static int task_short_sleeper(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    uint64_t t0 = atap_now();
    int rc = atap_sleep_relaxed(ATAP_MS(1));
    uint64_t el = atap_now() - t0;

    if (rc == ATAP_ECANCELLED)
        atomic_fetch_add(&g_wr.shorts_cancelled, 1);
    else if (rc != 0 || el < ATAP_MS(1))
        atomic_fetch_add(&g_wr.shorts_bad, 1);
    atomic_fetch_add(&g_wr.shorts_done, 1);
    return 0;
}

/* Sleeps 30 s; once cancelled it spawns a short sleeper, which most likely
 * runs next on this very thread (the worker's LIFO slot). */
static int task_cancelled_sleeper(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atap_task t;

    atomic_fetch_add(&g_wr.sleepers_started, 1);
    int rc = atap_sleep(ATAP_SEC(30));
    CHECK(rc == ATAP_ECANCELLED);
    CHECK(atap_spawn(&t, task_short_sleeper, NULL, NULL) == 0);
    atap_release(t);
    atomic_fetch_add(&g_wr.sleepers_done, 1);
    return 0;
}

static void test_park_leftover_wake_never_cancels(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50);
    struct wake_round *w = &g_wr;

    atomic_store(&w->sleepers_started, 0);
    atomic_store(&w->sleepers_done, 0);
    atomic_store(&w->shorts_done, 0);
    atomic_store(&w->shorts_cancelled, 0);
    atomic_store(&w->shorts_bad, 0);
    for (int i = 0; i < rounds; i++) {
        atap_task s[2], shorts[2];

        for (int j = 0; j < 2; j++)
            s[j] = spawn0(task_cancelled_sleeper, NULL);
        assert_true(wait_atomic_at_least(&w->sleepers_started, 2 * (i + 1), ATAP_SEC(10)));
        if (i % 3 == 1)
            sleep_us(200); /* sometimes well inside the wait, sometimes on its way in */
        for (int j = 0; j < 2; j++)
            assert_int_equal(atap_cancel(s[j]), 0);
        /* and short sleepers right behind the cancels, from here */
        for (int j = 0; j < 2; j++)
            shorts[j] = spawn0(task_short_sleeper, NULL);
        for (int j = 0; j < 2; j++) {
            assert_int_equal(atap_join_for(s[j], NULL, 0, ATAP_SEC(5)), ATAP_ECANCELLED);
            atap_release(s[j]);
            assert_int_equal(atap_join_for(shorts[j], NULL, 0, ATAP_SEC(10)), 0);
            atap_release(shorts[j]);
        }
        assert_true(wait_atomic_at_least(&w->sleepers_done, 2 * (i + 1), ATAP_SEC(5)));
    }
    assert_true(wait_atomic_at_least(&w->shorts_done, 4 * rounds, ATAP_SEC(20)));
    assert_int_equal(atomic_load(&w->shorts_cancelled), 0);
    assert_int_equal(atomic_load(&w->shorts_bad), 0);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* ---- 4. atap_wait_fd's results ------------------------------------------ */

struct wfd_arg {
    int data_rfd;   /* has a byte */
    int silent_rfd; /* nobody writes */
    int silent_wfd; /* its write end: writable */
    int late_rfd;   /* a byte comes 30 ms after `armed` */
    int hup_rfd;    /* its write end is closed */
    int file_fd;    /* a regular file with a byte to read: ready both ways */
    atomic_int armed;
};

static struct wfd_arg g_wfd;

/* Runs the checks on whatever thread calls it (CHECK, not assert). */
static void wait_fd_cases(struct wfd_arg *a, bool late)
{
    int rc = atap_wait_fd(a->data_rfd, ATAP_READABLE, ATAP_SEC(10));
    CHECK(rc > 0 && (rc & ATAP_READABLE));
    rc = atap_wait_fd(a->data_rfd, ATAP_READABLE, 0); /* a timeout of 0 looks once */
    CHECK(rc > 0 && (rc & ATAP_READABLE));

    /* a regular file with data ahead of its offset is ready both ways,
     * inside a task as outside, on every backend (epoll refuses such files:
     * that used to come back as -EPERM in a task; kqueue calls a file
     * readable only short of its end, so the file is not empty) */
    rc = atap_wait_fd(a->file_fd, ATAP_READABLE | ATAP_WRITABLE, ATAP_SEC(10));
    CHECK(rc > 0 && (rc & ATAP_READABLE) && (rc & ATAP_WRITABLE));

    uint64_t t0 = atap_now();
    rc = atap_wait_fd(a->silent_rfd, ATAP_READABLE, ATAP_MS(20));
    CHECK(rc == ATAP_ENOTREADY);
    CHECK(atap_now() - t0 >= ATAP_MS(20));
    CHECK(atap_wait_fd(a->silent_rfd, ATAP_READABLE, 0) == ATAP_ENOTREADY);

    rc = atap_wait_fd(a->silent_wfd, ATAP_WRITABLE, ATAP_SEC(10));
    CHECK(rc > 0 && (rc & ATAP_WRITABLE));
    rc = atap_wait_fd(a->silent_wfd, ATAP_READABLE | ATAP_WRITABLE, ATAP_SEC(10));
    CHECK(rc > 0 && (rc & ATAP_WRITABLE));

    rc = atap_wait_fd(a->hup_rfd, ATAP_READABLE, ATAP_SEC(10));
    CHECK(rc > 0 && (rc & (ATAP_READABLE | ATAP_HANGUP)));

    CHECK(atap_wait_fd(a->data_rfd, 0, ATAP_SEC(1)) == ATAP_EINVAL);
    CHECK(atap_wait_fd(a->data_rfd, ATAP_HANGUP, ATAP_SEC(1)) == ATAP_EINVAL);
    CHECK(atap_wait_fd(a->data_rfd, ATAP_ERROR, ATAP_SEC(1)) == ATAP_EINVAL);
    CHECK(atap_wait_fd(a->data_rfd, ATAP_READABLE | 0x100u, ATAP_SEC(1)) == ATAP_EINVAL);
    CHECK(atap_wait_fd(-1, ATAP_READABLE, ATAP_SEC(1)) == -EBADF);
    CHECK(atap_wait_fd(-1, ATAP_WRITABLE, 0) == -EBADF);

    if (late) {
        t0 = atap_now();
        atomic_store(&a->armed, 1);
        rc = atap_wait_fd(a->late_rfd, ATAP_READABLE, ATAP_FOREVER);
        CHECK(rc > 0 && (rc & ATAP_READABLE));
        CHECK(atap_now() - t0 >= ATAP_MS(25));
    }
}

static int task_wait_fd_cases(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    wait_fd_cases(arg, true);
    return 0;
}

/* A wake left in a worker's own poller (a cancel that reached an
 * atap_sleep in its last, spinning half millisecond) must not hide a ready
 * fd from a later wait with no time to wait: it used to read ENOTREADY. */
static int leftover_pipe[2];
static atomic_int lw_started, lw_ready;
static pthread_t lw_thread;
static atap_task lw_b;

static int task_sleep_until_cancelled(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    lw_thread = pthread_self();
    atomic_store(&lw_started, 1);
    while (atap_sleep(300000) == 0) /* < 500 us: it spins, the poller is not read */
        ;
    return 0;
}

static int task_wait_after_leftover(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    atap_task b;
    int r[2] = {0, 0};
    if (atap_spawn(&b, task_sleep_until_cancelled, NULL, NULL) != 0 || atap_dup(b, &lw_b) != 0)
        return 1;
    atomic_store(&lw_ready, 1);
    (void)atap_join(b, NULL, 0); /* helps: runs b on this thread if nobody took it */
    atap_release(b);
    r[0] = pthread_equal(lw_thread, pthread_self());
    r[1] = atap_wait_fd(leftover_pipe[0], ATAP_READABLE, 0);
    memcpy(out, r, sizeof r);
    return 0;
}

static void test_park_wait_fd_zero_after_leftover_wake(void **state)
{
    (void)state;
    int same = 0, bad = 0;
    make_pipe(leftover_pipe);
    assert_true(put_byte(leftover_pipe[1]));
    for (int i = 0; i < 40; i++) {
        atap_task a;
        int r[2];
        atomic_store(&lw_started, 0);
        atomic_store(&lw_ready, 0);
        assert_int_equal(atap_spawn(&a, task_wait_after_leftover, NULL,
                                    &(atap_spawn_opts){.out_size = sizeof r}),
                         0);
        assert_true(wait_atomic_at_least(&lw_ready, 1, ATAP_SEC(10)));
        assert_true(wait_atomic_at_least(&lw_started, 1, ATAP_SEC(10)));
        sleep_ms(2);
        assert_int_equal(atap_cancel(lw_b), 0);
        atap_release(lw_b);
        assert_int_equal(atap_join(a, r, sizeof r), 0);
        atap_release(a);
        same += r[0] != 0;
        bad += r[0] != 0 && r[1] <= 0;
    }
    print_message("%d of 40 on the thread the wake was left on\n", same);
    assert_int_equal(bad, 0);
    close_pipe(leftover_pipe);
}

/* A timer fire left from an earlier park of a record (it won against that
 * park's disarm: the park was claimed by its fd while still ARMING) must
 * not claim the task's next park: it read the old deadline, and used to end
 * the next park DEADLINE long before its own timeout. Two test hooks widen
 * the windows: the first park stays ARMING a while after its timer is
 * armed, and the fire pauses between its reads and its claim. */
struct stale_fire {
    int p1[2], p2[2];
    atomic_int parks, reason2;
    atomic_u64 parked2_at, resumed2_at;
};
static struct stale_fire g_sf;
static atomic_int sf_hold_arm, sf_hold_fire;

static void sf_arm_hook(void)
{
    int one = 1;
    if (atomic_compare_exchange_strong(&sf_hold_arm, &one, 0))
        sleep_ms(30); /* ARMING still: the fd's event claims it meanwhile */
}

static void sf_fire_hook(void)
{
    int one = 1;
    if (atomic_compare_exchange_strong(&sf_hold_fire, &one, 0))
        sleep_ms(60); /* meanwhile the task resumes and parks again */
}

static int task_stale_fire(atap_ctx *ctx, void *arg, void *out)
{
    struct stale_fire *f = arg;
    (void)out; /* 40 bytes: the park takes a record, not the slot's tail */
    int n = atomic_fetch_add(&f->parks, 1);
    char c;
    if (n == 0) { /* park 1: 3 ms, on a pipe that is ready */
        CHECK(atap_park_fd(ctx, f->p1[0], ATAP_READABLE, ATAP_MS(3)) == 0);
        return ATAP_PARKED;
    }
    if (n == 1) { /* park 2: 5 s, on an empty pipe written at 300 ms */
        CHECK(read(f->p1[0], &c, 1) == 1 || atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE);
        atomic_store(&f->parked2_at, now_ns());
        CHECK(atap_park_fd(ctx, f->p2[0], ATAP_READABLE, ATAP_SEC(5)) == 0);
        return ATAP_PARKED;
    }
    atomic_store(&f->resumed2_at, now_ns());
    atomic_store(&f->reason2, atap_resume_reason(ctx));
    return 0;
}

static void test_park_stale_fire_never_claims_next_park(void **state)
{
    (void)state;
    struct stale_fire *f = &g_sf;
    make_pipe(f->p1);
    make_pipe(f->p2);
    atomic_store(&f->parks, 0);
    atomic_store(&f->reason2, 0);
    atomic_store(&f->parked2_at, 0);
    assert_true(put_byte(f->p1[1])); /* ready before the park */
    atomic_store(&sf_hold_arm, 1);
    atomic_store(&sf_hold_fire, 1);
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_TIMED, sf_arm_hook), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_FIRE, sf_fire_hook), 0);
    atap_task t;
    assert_int_equal(atap_spawn(&t, task_stale_fire, f, &(atap_spawn_opts){.out_size = 40}), 0);
    assert_true(wait_atomic_at_least(&f->parks, 2, ATAP_SEC(10)));
    uint64_t end = now_ns() + ATAP_SEC(10);
    while (atomic_load(&f->parked2_at) == 0 && now_ns() < end)
        sleep_us(100);
    sleep_ms(300);
    assert_true(put_byte(f->p2[1]));
    unsigned char out[40];
    assert_int_equal(atap_join_for(t, out, sizeof out, ATAP_SEC(20)), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_TIMED, NULL), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_FIRE, NULL), 0);
    int reason = atomic_load(&f->reason2);
    uint64_t after = atomic_load(&f->resumed2_at) - atomic_load(&f->parked2_at);
    if (reason != ATAP_RESUME_READY)
        fail_msg("park 2 (5 s) resumed by %d after %llu ms", reason,
                 (unsigned long long)(after / 1000000));
    atap_release(t);
    close_pipe(f->p1);
    close_pipe(f->p2);
    assert_no_failures();
}

/* Writes a byte delay_ms after *armed reaches at_least (at once if NULL). */
struct late_writer {
    atomic_int *armed;
    int at_least;
    int wfd;
    unsigned delay_ms;
};

static void *late_writer_main(void *arg)
{
    struct late_writer *lw = arg;
    uint64_t end = now_ns() + ATAP_SEC(20);

    if (lw->armed)
        while (atomic_load(lw->armed) < lw->at_least && now_ns() < end)
            sleep_us(100);
    sleep_ms(lw->delay_ms);
    CHECK(put_byte(lw->wfd));
    return NULL;
}

static void test_park_wait_fd_results(void **state)
{
    (void)state;
    int data[2], silent[2], late[2], hup[2];
    struct wfd_arg *a = &g_wfd;

    make_pipe(data);
    make_pipe(silent);
    make_pipe(late);
    make_pipe(hup);
    assert_true(put_byte(data[1]));
    close(hup[1]);
    a->data_rfd = data[0];
    a->silent_rfd = silent[0];
    a->silent_wfd = silent[1];
    a->late_rfd = late[0];
    a->hup_rfd = hup[0];
    FILE *file = tmpfile();
    assert_non_null(file);
    a->file_fd = fileno(file);
    assert_true(put_byte(a->file_fd));
    assert_int_equal(lseek(a->file_fd, 0, SEEK_SET), 0);
    atomic_store(&a->armed, 0);

    /* inside a task */
    pthread_t th;
    static struct late_writer lw;
    lw = (struct late_writer){.armed = &a->armed, .at_least = 1, .wfd = late[1], .delay_ms = 30};
    assert_int_equal(pthread_create(&th, NULL, late_writer_main, &lw), 0);
    atap_task t = spawn0(task_wait_fd_cases, a);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(30)), 0);
    atap_release(t);
    pthread_join(th, NULL);
    assert_no_failures();

    /* and on the test thread (a plain poll) */
    char c;
    assert_int_equal(read(late[0], &c, 1), 1);
    atomic_store(&a->armed, 0);
    assert_int_equal(pthread_create(&th, NULL, late_writer_main, &lw), 0);
    wait_fd_cases(a, true);
    pthread_join(th, NULL);
    assert_no_failures();

    close_pipe(data);
    close_pipe(silent);
    close_pipe(late);
    close(hup[0]);
    fclose(file);
}

/* ---- 5. park_until: resumed at its deadline, never early --------------- */

struct until_arg {
    uint64_t delay;
    atomic_int runs;
    atomic_u64 deadline;
};

#define N_UNTIL 6
static struct until_arg g_until[N_UNTIL];

static int task_park_until(atap_ctx *ctx, void *arg, void *out)
{
    struct until_arg *u = arg;
    int run = atomic_fetch_add(&u->runs, 1);

    if (!atap_resumed(ctx)) {
        CHECK(run == 0);
        CHECK(atap_resume_reason(ctx) == 0);
        CHECK(atap_resume_events(ctx) == 0);
        uint64_t d = atap_now() + u->delay;
        atomic_store(&u->deadline, d);
        CHECK(atap_park_until(ctx, d) == 0);
        return ATAP_PARKED;
    }
    uint64_t now = atap_now(), d = atomic_load(&u->deadline);
    CHECK(run == 1);
    CHECK(atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE);
    CHECK(atap_resume_events(ctx) == 0);
    CHECK(atap_self(ctx).id != 0);
    uint64_t late = now >= d ? now - d : UINT64_MAX; /* UINT64_MAX: early */
    memcpy(out, &late, sizeof late);
    return 0;
}

static void test_park_until_deadline(void **state)
{
    (void)state;
    static const uint64_t delays[N_UNTIL] = {ATAP_MS(50), ATAP_MS(50),  ATAP_MS(1),
                                             ATAP_MS(10), ATAP_MS(120), 0};
    atap_task ts[N_UNTIL];
    uint64_t t0[N_UNTIL];

    for (int i = 0; i < N_UNTIL; i++) {
        g_until[i].delay = delays[i];
        atomic_store(&g_until[i].runs, 0);
        atomic_store(&g_until[i].deadline, 0);
        t0[i] = atap_now();
        ts[i] = spawn8(task_park_until, &g_until[i]);
    }
    for (int i = 0; i < N_UNTIL; i++) {
        uint64_t late = 0;
        assert_int_equal(atap_join_for(ts[i], &late, sizeof late, ATAP_SEC(10)), 0);
        uint64_t joined = atap_now();
        if (late == UINT64_MAX)
            fail_msg("park_until(+%llu ns) resumed before its deadline",
                     (unsigned long long)delays[i]);
        assert_true(joined - t0[i] >= delays[i]);
        assert_int_equal(atomic_load(&g_until[i].runs), 2);
        print_message("park_until +%llu ms: resumed %llu us late\n",
                      (unsigned long long)(delays[i] / 1000000u),
                      (unsigned long long)(late / 1000u));
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* The pool's stats count the parks their deadline ended (fired), whether
 * the park is kept in the slot or in a park record (an output too large to
 * leave the slot's tail free), and none a cancel ended; the late counts are
 * a part of them. */
static int task_park_then_out(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    if (atap_resumed(ctx))
        return atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE ? 0 : 1;
    atap_park_until(ctx, atap_now() + *(const uint64_t *)arg);
    return ATAP_PARKED;
}

static void test_park_fired_counted(void **state)
{
    (void)state;
    static const uint64_t ms2 = ATAP_MS(2), ms5 = ATAP_MS(5), far = ATAP_SEC(30);
    const size_t outs[] = {0, 0, 8, 64}; /* in the slot's tail, in a park record */
    const uint64_t *delays[] = {&ms2, &ms5, &ms2, &ms5};
    struct atap_pool_stats before = pool_stats(), after;
    atap_task ts[4], never;
    unsigned char buf[64];

    for (int i = 0; i < 4; i++)
        assert_int_equal(atap_spawn(&ts[i], task_park_then_out, (void *)delays[i],
                                    &(atap_spawn_opts){.out_size = outs[i]}),
                         0);
    assert_int_equal(
        atap_spawn(&never, task_park_then_out, (void *)&far, &(atap_spawn_opts){.out_size = 8}), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atap_join_for(ts[i], outs[i] ? buf : NULL, outs[i], ATAP_SEC(10)), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(atap_cancel(never), 0);
    assert_int_equal(atap_join_for(never, buf, 8, ATAP_SEC(10)), ATAP_ECANCELLED);
    atap_release(never);
    after = pool_stats();
    assert_int_equal(after.fired - before.fired, 4);
    assert_true(after.fired_1ms - before.fired_1ms <= 4);
    assert_true(after.fired_10ms - before.fired_10ms <= after.fired_1ms - before.fired_1ms);
}

/* An output of 17 to 24 bytes from a plain spawn lies over the slot's arg
 * (slot.h): each run of such a task must still get its arg. Each task
 * writes its whole output, then parks: on a deadline and for a wake (in a
 * park record), on a pipe with no deadline (in the slot's tail, its fd and
 * claim on the side record), joined or detached; its next run checks its
 * arg, and its output comes out whole. One parked on a pipe never written
 * is cancelled: no run after, nothing left. */
enum { WIDE_MAGIC = 0x77696465 };

struct wide_parker {
    uint32_t magic;
    int kind; /* 0: until, 1: fd, 2: wake (its timeout) */
    int fd;
    atomic_int runs, done;
};

typedef struct wide_out {
    uint64_t magic, kind, self;
} wide_out;

static int task_park_wide(atap_ctx *ctx, void *arg, void *out)
{
    struct wide_parker *w = arg;
    wide_out o;

    CHECK(w != NULL && w->magic == WIDE_MAGIC); /* not the output's bytes */
    atomic_fetch_add(&w->runs, 1);
    if (!atap_resumed(ctx)) {
        memset(out, 0xa5, sizeof o); /* over every byte its slot lends */
        if (w->kind == 0)
            CHECK(atap_park_until(ctx, atap_now() + ATAP_MS(2)) == 0);
        else if (w->kind == 1)
            CHECK(atap_park_fd(ctx, w->fd, ATAP_READABLE, ATAP_FOREVER) == 0);
        else
            CHECK(atap_park_wake(ctx, ATAP_MS(3)) == 0);
        return ATAP_PARKED;
    }
    o = (wide_out){w->magic, (uint64_t)w->kind, (uint64_t)(uintptr_t)w};
    memcpy(out, &o, sizeof o);
    atomic_fetch_add(&w->done, 1);
    return 0;
}

static void test_park_wide_output_keeps_arg(void **state)
{
    (void)state;
    enum { N = 9, DETACHED = 3 };
    static struct wide_parker w[N + DETACHED + 1];
    int fds[2];
    atap_task t[N], stuck;
    wide_out o;

    assert_int_equal(pipe(fds), 0);
    for (int i = 0; i < N + DETACHED + 1; i++) {
        w[i].magic = WIDE_MAGIC;
        w[i].kind = i == N + DETACHED ? 1 : i % 3;
        w[i].fd = i == N + DETACHED ? fds[1] : fds[0]; /* the write end: never readable */
        atomic_store(&w[i].runs, 0);
        atomic_store(&w[i].done, 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(atap_spawn(&t[i], task_park_wide, &w[i],
                                    &(atap_spawn_opts){.out_size = sizeof(wide_out)}),
                         0);
    for (int i = N; i < N + DETACHED; i++)
        assert_int_equal(atap_spawn_detached(task_park_wide, &w[i],
                                             &(atap_spawn_opts){.out_size = sizeof(wide_out)}),
                         0);
    assert_int_equal(atap_spawn(&stuck, task_park_wide, &w[N + DETACHED],
                                &(atap_spawn_opts){.out_size = sizeof(wide_out)}),
                     0);
    /* Every one parked (the fd parkers on a pipe still empty), then the
     * pipe readable. */
    for (int i = 0; i < N + DETACHED + 1; i++)
        assert_true(wait_atomic_at_least(&w[i].runs, 1, ATAP_SEC(10)));
    assert_int_equal(write(fds[1], "x", 1), 1);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_join_for(t[i], &o, sizeof o, ATAP_SEC(10)), 0);
        assert_int_equal(o.magic, WIDE_MAGIC);
        assert_int_equal(o.kind, (uint64_t)w[i].kind);
        assert_true(o.self == (uint64_t)(uintptr_t)&w[i]);
        assert_int_equal(atomic_load(&w[i].runs), 2);
        atap_release(t[i]);
    }
    for (int i = N; i < N + DETACHED; i++)
        assert_true(wait_atomic_at_least(&w[i].done, 1, ATAP_SEC(10)));
    assert_int_equal(atap_cancel(stuck), 0);
    assert_int_equal(atap_join_for(stuck, &o, sizeof o, ATAP_SEC(10)), ATAP_ECANCELLED);
    atap_release(stuck);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&w[N + DETACHED].runs), 1);
    for (int i = N; i < N + DETACHED; i++)
        assert_int_equal(atomic_load(&w[i].runs), 2);
    close(fds[0]);
    close(fds[1]);
    assert_no_failures();
}

/* The manager held at its next wake (ATAP__TEST_MANAGER_AWAKE) while
 * workers run short tasks: a deadline park it filed before is fired at
 * its deadline by a worker between runs (park_wheel.c's seat), not left
 * until the manager gets a CPU again. */
static atomic_int g_hold_manager, g_manager_held, g_due_ran;

static void hold_manager(void)
{
    if (!atomic_load(&g_hold_manager))
        return;
    atomic_store(&g_manager_held, 1);
    while (atomic_load(&g_hold_manager))
        sleep_ms(1);
    atomic_store(&g_manager_held, 0);
}

static int task_park_then_mark(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    if (atap_resumed(ctx)) {
        atomic_store(&g_due_ran, 1);
        return atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE ? 0 : 1;
    }
    atap_park_until(ctx, atap_now() + *(const uint64_t *)arg);
    return ATAP_PARKED;
}

static int task_short(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    (void)out;
    return 0;
}

/* A park of delay filed on the wheel (its due time published), then the
 * manager held at its next wake, before the deadline: returns the due time
 * (the wheel's, a tick's end, in atap_now's clock). */
static uint64_t park_then_hold_manager(atap_task *sleeper, const uint64_t *delay, uint64_t give_up)
{
    uint64_t due;

    atomic_store(&g_due_ran, 0);
    assert_int_equal(atap_spawn(sleeper, task_park_then_mark, (void *)delay, NULL), 0);
    while ((due = atap__park_wheel_due()) == UINT64_MAX && atap_now() < give_up)
        sleep_ms(1);
    assert_true(due != UINT64_MAX);
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, hold_manager), 0);
    atomic_store(&g_hold_manager, 1);
    while (!atomic_load(&g_manager_held) && atap_now() < give_up)
        sleep_ms(1); /* its next wake: at most its 10 ms tick */
    assert_true(atomic_load(&g_manager_held));
    assert_false(atomic_load(&g_due_ran)); /* held before the deadline */
    return due;
}

/* The manager let go: it was still held, and the park ran meanwhile. */
static void let_manager_go_after_the_park(atap_task sleeper)
{
    int held = atomic_load(&g_manager_held); /* nobody lets it go but us */

    atomic_store(&g_hold_manager, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, NULL), 0);
    assert_true(held);
    assert_true(atomic_load(&g_due_ran));
    assert_int_equal(atap_join_for(sleeper, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    atap_release(sleeper);
}

static void test_park_due_fired_by_a_busy_worker(void **state)
{
    (void)state;
    const uint64_t delay = ATAP_MS(300) * test_slack(); /* the hold comes first */
    uint64_t give_up = atap_now() + ATAP_SEC(10) * test_slack();
    atap_task sleeper, shorts[64];

    (void)park_then_hold_manager(&sleeper, &delay, give_up);
    /* Short runs until the park ends (each worker looks every few dozen). */
    while (!atomic_load(&g_due_ran) && atap_now() < give_up) {
        for (int i = 0; i < 64; i++)
            assert_int_equal(atap_spawn(&shorts[i], task_short, NULL, NULL), 0);
        for (int i = 0; i < 64; i++) {
            assert_int_equal(atap_join(shorts[i], NULL, 0), 0);
            atap_release(shorts[i]);
        }
    }
    let_manager_go_after_the_park(sleeper);
}

/* An idle worker whose next due time is near stays awake for it and fires
 * it itself (pool.c's spin_for_timers): with the manager held at its next
 * wake and no task running, a park still ends at its deadline, once a
 * worker that ran something just before it went idle. Before, such a
 * worker parked, and the park waited for the manager. */
static void test_park_due_fired_by_an_idle_worker(void **state)
{
    (void)state;
    const uint64_t delay = ATAP_MS(300) * test_slack(); /* the hold comes first */
    uint64_t give_up = atap_now() + ATAP_SEC(10) * test_slack(), due, now;
    atap_task sleeper, nudge;

    due = park_then_hold_manager(&sleeper, &delay, give_up);
    /* One short task just before the due time: its worker then goes idle
     * with the due time near. */
    while ((now = atap_now()) + ATAP_US(150) < due)
        sleep_us(due - now - ATAP_US(150) > ATAP_MS(1) ? 1000 : 50);
    assert_int_equal(atap_spawn(&nudge, task_short, NULL, NULL), 0);
    assert_int_equal(atap_join(nudge, NULL, 0), 0);
    atap_release(nudge);
    while (!atomic_load(&g_due_ran) && atap_now() < give_up)
        sleep_ms(1);
    let_manager_go_after_the_park(sleeper);
}

/* While a busy worker holds the wheel's seat, the manager does not spin
 * waiting for it (the due time the worker took it for has passed; the
 * worker wakes the manager when it gives the seat back): a worker held
 * with the seat for 300 ms, the process uses a small part of that in CPU,
 * not the whole core a manager polling with no timeout would. */
static atomic_int g_hold_wheel, g_wheel_held;

static void hold_wheel(void)
{
    int one = 1;

    if (!atomic_compare_exchange_strong(&g_hold_wheel, &one, 2))
        return; /* the first helper only */
    atomic_store(&g_wheel_held, 1);
    while (atomic_load(&g_hold_wheel))
        sleep_ms(1);
}

static void test_park_manager_idle_while_a_worker_holds_the_wheel(void **state)
{
    (void)state;
    const uint64_t delay = ATAP_MS(30);
    uint64_t give_up, cpu;
    atap_task sleeper, shorts[64];

    atomic_store(&g_due_ran, 0);
    atomic_store(&g_wheel_held, 0);
    atomic_store(&g_hold_wheel, 1);
    assert_int_equal(atap__test_on(ATAP__TEST_WHEEL_HELP, hold_wheel), 0);
    give_up = atap_now() + ATAP_SEC(10) * test_slack();
    assert_int_equal(atap_spawn(&sleeper, task_park_then_mark, (void *)&delay, NULL), 0);
    /* Short runs until a worker, looking between them, takes the seat for
     * the park once it is due (the manager may fire it first: then the
     * next park is the worker's). */
    while (!atomic_load(&g_wheel_held) && atap_now() < give_up) {
        if (atomic_load(&g_due_ran)) {
            assert_int_equal(atap_join(sleeper, NULL, 0), 0);
            atap_release(sleeper);
            atomic_store(&g_due_ran, 0);
            assert_int_equal(atap_spawn(&sleeper, task_park_then_mark, (void *)&delay, NULL), 0);
        }
        for (int i = 0; i < 64; i++)
            assert_int_equal(atap_spawn(&shorts[i], task_short, NULL, NULL), 0);
        for (int i = 0; i < 64; i++) {
            assert_int_equal(atap_join(shorts[i], NULL, 0), 0);
            atap_release(shorts[i]);
        }
    }
    assert_true(atomic_load(&g_wheel_held));
    cpu = process_cpu_ns();
    sleep_ms(300);
    cpu = process_cpu_ns() - cpu;
    atomic_store(&g_hold_wheel, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_WHEEL_HELP, NULL), 0);
    print_message("CPU while a worker held the wheel 300 ms: %.1f ms\n", cpu / 1e6);
    assert_true(cpu < ATAP_MS(100));
    assert_int_equal(atap_join_for(sleeper, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    assert_true(atomic_load(&g_due_ran));
    atap_release(sleeper);
}

/* Arms due after the manager's next look wake nobody (park_wheel.c's
 * look_at): the manager files them at that look. 200 bursts of 50 parks
 * due seconds out, a burst every half millisecond: before, the first arm of
 * each burst found the inbox empty and woke the manager (a wake a burst,
 * 200 or more); now it wakes at its own times (its 10 ms tick and what is
 * due), so about one a tick. And the woken parks still run on time. */
static atomic_long g_manager_wakes;

static void count_manager_wake(void) { atomic_fetch_add(&g_manager_wakes, 1); }

static void test_park_far_arms_leave_the_manager_asleep(void **state)
{
    (void)state;
    enum { BURSTS = 200, EACH = 50 };
    static atap_task far[BURSTS * EACH];
    const uint64_t delay = ATAP_SEC(30), soon_delay = ATAP_MS(20);
    uint64_t t0, elapsed_ms;
    long wakes;
    atap_task soon;

    atomic_store(&g_manager_wakes, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, count_manager_wake), 0);
    t0 = now_ns();
    for (int b = 0; b < BURSTS; b++) {
        for (int i = 0; i < EACH; i++)
            assert_int_equal(
                atap_spawn(&far[b * EACH + i], task_park_then_mark, (void *)&delay, NULL), 0);
        sleep_us(500);
    }
    sleep_ms(20); /* the last burst parked */
    wakes = atomic_load(&g_manager_wakes);
    elapsed_ms = (now_ns() - t0) / 1000000u;
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, NULL), 0);
    print_message("manager wakes over %d bursts of far parks in %llu ms: %ld\n", BURSTS,
                  (unsigned long long)elapsed_ms, wakes);
    /* Its tick is 10 ms: a wake each 5 ms of the window, and some room. */
    assert_true(wakes <= 20 + (long)(elapsed_ms / 5));
    /* A near park among them is still fired at its time: it woke the
     * manager, its deadline before the manager's next look. */
    atomic_store(&g_due_ran, 0);
    t0 = now_ns();
    assert_int_equal(atap_spawn(&soon, task_park_then_mark, (void *)&soon_delay, NULL), 0);
    assert_int_equal(atap_join_for(soon, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    assert_true(now_ns() - t0 >= soon_delay);
    assert_true(atomic_load(&g_due_ran));
    atap_release(soon);
    for (int i = 0; i < BURSTS * EACH; i++) {
        assert_int_equal(atap_cancel(far[i]), 0);
        assert_int_equal(atap_join_for(far[i], NULL, 0, ATAP_SEC(10) * test_slack()),
                         ATAP_ECANCELLED);
        atap_release(far[i]);
    }
}

/* A park whose deadline the manager's clock has passed (a run that came
 * late) needs no wheel: its parker queues the next run itself, counted as
 * fired by its deadline, and nobody wakes the manager for it
 * (park_wheel.c). Through the wheel each such arm was due before the
 * manager's next look and woke it. */
enum { PAST_PARKS = 2000 };
static atomic_int g_past_runs;

static int task_park_past(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    if (atap_resumed(ctx) && atap_resume_reason(ctx) != ATAP_RESUME_DEADLINE)
        return 1;
    if (atomic_fetch_add(&g_past_runs, 1) + 1 >= PAST_PARKS)
        return 0;
    /* Long past: the deadline is before any reading of the manager's. */
    CHECK(atap_park_until(ctx, 1) == 0);
    return ATAP_PARKED;
}

static void test_park_past_deadline_wakes_nobody(void **state)
{
    (void)state;
    struct atap_pool_stats st0, st1;
    uint64_t t0, elapsed_ms;
    atap_task t;
    long wakes;

    sleep_ms(20); /* the manager has read its clock (it has run the wheel) */
    atomic_store(&g_past_runs, 0);
    assert_int_equal(atap_pool_stats(&st0), 0);
    atomic_store(&g_manager_wakes, 0);
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, count_manager_wake), 0);
    t0 = now_ns();
    assert_int_equal(atap_spawn(&t, task_park_past, NULL, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    wakes = atomic_load(&g_manager_wakes);
    elapsed_ms = (now_ns() - t0) / 1000000u;
    assert_int_equal(atap__test_on(ATAP__TEST_MANAGER_AWAKE, NULL), 0);
    atap_release(t);
    assert_int_equal(atap_pool_stats(&st1), 0);
    print_message("manager wakes over %d parks past their deadline in %llu ms: %ld\n", PAST_PARKS,
                  (unsigned long long)elapsed_ms, wakes);
    assert_int_equal(atomic_load(&g_past_runs), PAST_PARKS);
    assert_true(st1.fired - st0.fired >= PAST_PARKS - 1);
    /* Its tick is 10 ms: a wake each 5 ms of the window, and some room. */
    assert_true(wakes <= 20 + (long)(elapsed_ms / 5));
}

/* ---- 6. park_fd ----------------------------------------------------------- */

struct fd_parker {
    int fd;
    unsigned want; /* ATAP_READABLE unless a test says otherwise */
    uint64_t timeout;
    atomic_int first;
    atomic_int resumed;
    atomic_int reason;
    atomic_int events;
    atomic_u64 parked_at;
};

#define N_FD_PARKERS 3
static struct fd_parker g_fdp[N_FD_PARKERS + 1];

static int task_park_fd_once(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct fd_parker *p = arg;

    if (!atap_resumed(ctx)) {
        CHECK(atap_resume_reason(ctx) == 0);
        atomic_store(&p->parked_at, atap_now());
        CHECK(atap_park_fd(ctx, p->fd, p->want, p->timeout) == 0);
        atomic_fetch_add(&p->first, 1);
        return ATAP_PARKED;
    }
    atomic_store(&p->reason, atap_resume_reason(ctx));
    atomic_store(&p->events, (int)atap_resume_events(ctx));
    atomic_fetch_add(&p->resumed, 1);
    uint64_t el = atap_now() - atomic_load(&p->parked_at);
    memcpy(out, &el, sizeof el);
    return 0;
}

static void fd_parker_init(struct fd_parker *p, int fd, uint64_t timeout)
{
    p->fd = fd;
    p->want = ATAP_READABLE;
    p->timeout = timeout;
    atomic_store(&p->first, 0);
    atomic_store(&p->resumed, 0);
    atomic_store(&p->reason, 0);
    atomic_store(&p->events, 0);
    atomic_store(&p->parked_at, 0);
}

static void test_park_fd_many_on_one_pipe(void **state)
{
    (void)state;
    int p[2];
    atap_task ts[N_FD_PARKERS];

    make_pipe(p);
    for (int i = 0; i < N_FD_PARKERS; i++) {
        fd_parker_init(&g_fdp[i], p[0], ATAP_FOREVER);
        ts[i] = spawn8(task_park_fd_once, &g_fdp[i]);
    }
    for (int i = 0; i < N_FD_PARKERS; i++)
        assert_true(wait_atomic_at_least(&g_fdp[i].first, 1, ATAP_SEC(10)));
    sleep_ms(100);
    for (int i = 0; i < N_FD_PARKERS; i++) {
        assert_int_equal(atomic_load(&g_fdp[i].resumed), 0);
        assert_int_equal(atap_try_join(ts[i], NULL, 8), ATAP_EINVAL); /* NULL out */
        uint64_t v;
        assert_int_equal(atap_try_join(ts[i], &v, sizeof v), ATAP_ENOTREADY);
        assert_false(atap_finished(ts[i]));
    }
    assert_true(put_byte(p[1]));
    for (int i = 0; i < N_FD_PARKERS; i++) {
        uint64_t v;
        assert_int_equal(atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&g_fdp[i].resumed), 1);
        assert_int_equal(atomic_load(&g_fdp[i].reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&g_fdp[i].events) & ATAP_READABLE);
        assert_true(v >= ATAP_MS(100)); /* it waited for the byte */
        atap_release(ts[i]);
    }
    assert_int_equal(atomic_load(&g_fdp[0].first), 1); /* one first run each */
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

static void test_park_fd_timeout(void **state)
{
    (void)state;
    int p[2];
    struct fd_parker *f = &g_fdp[N_FD_PARKERS];

    make_pipe(p);
    fd_parker_init(f, p[0], ATAP_MS(50));
    atap_task t = spawn8(task_park_fd_once, f);
    uint64_t el = 0;
    assert_int_equal(atap_join_for(t, &el, sizeof el, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&f->resumed), 1);
    assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_DEADLINE);
    assert_int_equal(atomic_load(&f->events), 0); /* nothing reported for a deadline */
    assert_true(el >= ATAP_MS(50));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

/* A park on an fd that is ready already: resumed at once, READY, with the
 * events reported (the byte is never read, so every round's fd is ready). */
static void test_park_fd_ready_at_once(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50), no_events = 0;
    struct fd_parker *f = &g_fdp[0];
    int p[2];

    make_pipe(p);
    assert_true(put_byte(p[1]));
    for (int i = 0; i < rounds; i++) {
        fd_parker_init(f, p[0], i % 2 ? ATAP_SEC(60) : ATAP_FOREVER);
        atap_task t = spawn8(task_park_fd_once, f);
        uint64_t v;
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&f->resumed), 1);
        assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
        if (!(atomic_load(&f->events) & ATAP_READABLE))
            no_events++;
        atap_release(t);
    }
    if (no_events)
        fail_msg("%d of %d parks on a readable pipe resumed READY without ATAP_READABLE "
                 "in atap_resume_events",
                 no_events, rounds);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

/* A park claimed before it goes on the wheel (a cancel that came before
 * its ARMED store, which the runner then finds and claims for: the
 * ATAP__TEST_TAIL_ARM hook cancels there) is due now, however far its
 * deadline: its push wakes the manager, which ends the run and lets the
 * slot go (an arm due later leaves it asleep: park_wheel.c's look_at). The
 * join reads ECANCELLED at the cancel; the run's end is when arg_free is
 * called. Round after round, each would otherwise wait for the manager's
 * next wake, its 10 ms tick. */
static atap_task g_arming; /* the task's, before g_arming_set */
static atomic_int g_arming_set;
static atomic_u64 g_arg_freed_at;

static void cancel_the_arming(void)
{
    if (atomic_exchange(&g_arming_set, 0))
        (void)atap_cancel(g_arming);
}

static void note_arg_freed(void *arg)
{
    (void)arg;
    atomic_store(&g_arg_freed_at, now_ns());
}

static int task_park_far_cancelled_arming(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    if (atap_resumed(ctx))
        return 1; /* never: the cancel ends the run */
    g_arming = atap_self(ctx);
    atomic_store(&g_arming_set, 1);
    atap_park_until(ctx, atap_now() + ATAP_SEC(60));
    return ATAP_PARKED;
}

static void test_park_claimed_before_arm_ends_at_once(void **state)
{
    (void)state;
    enum { ROUNDS = 41 };
    const atap_spawn_opts o = {.arg_free = note_arg_freed};
    uint64_t took[ROUNDS];

    assert_int_equal(atap__test_on(ATAP__TEST_TAIL_ARM, cancel_the_arming), 0);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t t0 = now_ns(), give_up = t0 + ATAP_SEC(10) * test_slack();
        atap_task t;

        atomic_store(&g_arg_freed_at, 0);
        assert_int_equal(atap_spawn(&t, task_park_far_cancelled_arming, NULL, &o), 0);
        assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_ECANCELLED);
        atap_release(t);
        while (atomic_load(&g_arg_freed_at) == 0 && now_ns() < give_up)
            sleep_us(20);
        assert_true(atomic_load(&g_arg_freed_at) != 0);
        took[i] = atomic_load(&g_arg_freed_at) - t0;
    }
    assert_int_equal(atap__test_on(ATAP__TEST_TAIL_ARM, NULL), 0);
    for (int i = 1; i < ROUNDS; i++) /* sorted, for the median */
        for (int j = i; j > 0 && took[j - 1] > took[j]; j--) {
            uint64_t x = took[j];
            took[j] = took[j - 1];
            took[j - 1] = x;
        }
    print_message("a park cancelled as it arms, spawn to its end: median %.2f ms, max %.2f ms\n",
                  took[ROUNDS / 2] / 1e6, took[ROUNDS - 1] / 1e6);
    /* Waiting for the manager's tick: about 10 ms each. Woken: well under
     * a millisecond, with room for a loaded machine. */
    assert_true(took[ROUNDS / 2] < ATAP_MS(5));
}

/* A park for both ways on a socket ready both ways resumes with both (kqueue
 * reports the two directions as two events: they used to resume it with
 * one of them). Timed and untimed: parks in the slot and on the wheel. */
static void test_park_fd_both_ways(void **state)
{
    (void)state;
    int rounds = (int)scaled(100, 20), sv[2];
    struct fd_parker *f = &g_fdp[0];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_true(put_byte(sv[1])); /* sv[0]: readable, and writable */
    for (int i = 0; i < rounds; i++) {
        fd_parker_init(f, sv[0], i % 2 ? ATAP_SEC(60) : ATAP_FOREVER);
        f->want = ATAP_READABLE | ATAP_WRITABLE;
        atap_task t = spawn8(task_park_fd_once, f);
        uint64_t v;
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
        assert_int_equal(atomic_load(&f->events) & (ATAP_READABLE | ATAP_WRITABLE),
                         ATAP_READABLE | ATAP_WRITABLE);
        atap_release(t);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(sv);
    assert_no_failures();
}

/* ---- 6b. the peer hangs up ------------------------------------------------
 *
 * A stream socket's peer that closes, or shuts down its writing side, is
 * ATAP_HANGUP for a wait on ATAP_READABLE, with ATAP_READABLE (a read
 * returns 0): epoll's EPOLLRDHUP, poll's POLLRDHUP, kqueue's EV_EOF. A TCP
 * peer's close used to read as ATAP_READABLE alone. */

/* A connected TCP pair on the loopback. */
static void tcp_pair(int sv[2])
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    sv[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(sv[0] >= 0);
    assert_int_equal(connect(sv[0], (struct sockaddr *)&a, sizeof a), 0);
    sv[1] = accept(l, NULL, NULL);
    assert_true(sv[1] >= 0);
    close(l);
}

enum { HUP_UNIX_SHUT, HUP_UNIX_CLOSE, HUP_TCP_SHUT, HUP_TCP_CLOSE, HUP_CASES };
static const char *const hup_case_name[HUP_CASES] = {"AF_UNIX, shutdown(SHUT_WR)", "AF_UNIX, close",
                                                     "TCP, shutdown(SHUT_WR)", "TCP, close"};

static void hup_pair(int c, int sv[2])
{
    if (c == HUP_TCP_SHUT || c == HUP_TCP_CLOSE)
        tcp_pair(sv);
    else
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* The peer (sv[1]) hangs up in the way case c says. */
static void hup_peer(int c, int sv[2])
{
    if (c == HUP_UNIX_SHUT || c == HUP_TCP_SHUT) {
        assert_int_equal(shutdown(sv[1], SHUT_WR), 0);
    } else {
        close(sv[1]);
        sv[1] = -1;
    }
}

static void check_hup(int c, const char *how, unsigned got)
{
    if (!(got & ATAP_HANGUP) || !(got & ATAP_READABLE))
        fail_msg("%s, %s: reported 0x%x, wanted ATAP_HANGUP | ATAP_READABLE", hup_case_name[c], how,
                 got);
}

static void test_park_fd_peer_hangup(void **state)
{
    (void)state;
    struct fd_parker *f = &g_fdp[0];

    for (int c = 0; c < HUP_CASES; c++) {
        for (int timed = 0; timed < 2; timed++) {
            int sv[2];
            uint64_t v;

            hup_pair(c, sv);
            fd_parker_init(f, sv[0], timed ? ATAP_SEC(60) : ATAP_FOREVER);
            atap_task t = spawn8(task_park_fd_once, f);
            assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
            sleep_ms(20); /* parked, nothing to read */
            assert_int_equal(atomic_load(&f->resumed), 0);
            hup_peer(c, sv);
            assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
            assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
            check_hup(c, timed ? "a timed park" : "a park", (unsigned)atomic_load(&f->events));
            atap_release(t);
            close_pipe(sv);
        }
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

struct hup_wait {
    int fd;
    atomic_int started;
};

static int task_wait_fd_read(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    struct hup_wait *h = arg;
    int rc;

    atomic_store(&h->started, 1);
    rc = atap_wait_fd(h->fd, ATAP_READABLE, ATAP_SEC(10));
    memcpy(out, &rc, sizeof rc);
    return 0;
}

/* The same for atap_wait_fd: in a task (the thread's own poller), the
 * hang-up coming during the wait and already there; outside a task
 * (poll(2)). */
static void test_park_wait_fd_peer_hangup(void **state)
{
    (void)state;
    static struct hup_wait h;

    for (int c = 0; c < HUP_CASES; c++) {
        int sv[2], rc;
        atap_task t;

        hup_pair(c, sv);
        h.fd = sv[0];
        atomic_store(&h.started, 0);
        assert_int_equal(
            atap_spawn(&t, task_wait_fd_read, &h, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
        assert_true(wait_atomic_at_least(&h.started, 1, ATAP_SEC(10)));
        sleep_ms(20);
        hup_peer(c, sv);
        assert_int_equal(atap_join_for(t, &rc, sizeof rc, ATAP_SEC(10)), 0);
        atap_release(t);
        assert_true(rc > 0);
        check_hup(c, "atap_wait_fd in a task", (unsigned)rc);

        assert_int_equal(
            atap_spawn(&t, task_wait_fd_read, &h, &(atap_spawn_opts){.out_size = sizeof(int)}), 0);
        assert_int_equal(atap_join_for(t, &rc, sizeof rc, ATAP_SEC(10)), 0);
        atap_release(t);
        assert_true(rc > 0);
        check_hup(c, "atap_wait_fd in a task, after the hang-up", (unsigned)rc);

        rc = atap_wait_fd(sv[0], ATAP_READABLE, ATAP_SEC(10));
        assert_true(rc > 0);
        check_hup(c, "atap_wait_fd outside a task", (unsigned)rc);
        close_pipe(sv);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

static size_t resident_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* A park on a closed fd, however large its number, resumes at once with
 * ATAP_ERROR, and costs no table that size (it used to grow the fd table
 * to the fd's number: 400 MB here). */
static void test_park_fd_closed_huge_fd(void **state)
{
    (void)state;
    const int fd = 50 * 1000 * 1000;
    struct fd_parker *f = &g_fdp[0];
    size_t before = resident_now();

    assert_int_equal(fcntl(fd, F_GETFD), -1); /* not open */
    for (int timed = 0; timed < 2; timed++) {
        fd_parker_init(f, fd, timed ? ATAP_SEC(60) : ATAP_FOREVER);
        atap_task t = spawn8(task_park_fd_once, f);
        uint64_t v;
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&f->resumed), 1);
        assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&f->events) & ATAP_ERROR);
        atap_release(t);
    }
    if (before && resident_now() > before + ((size_t)64 << 20))
        fail_msg("resident memory grew by %zu MB", (resident_now() - before) >> 20);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* One byte per resume, parking again until it has counted `want`. */
struct reader {
    int fd;
    int want;
    atomic_int first;
    atomic_int reads;
    atomic_int resumes;
    atomic_int empty;       /* resumed READY with nothing to read */
    atomic_int no_readable; /* resumed READY without ATAP_READABLE reported */
    atomic_int odd_events;  /* the events of the last such resume */
};

static struct reader g_reader;

static int task_park_reader(atap_ctx *ctx, void *arg, void *out)
{
    struct reader *r = arg;

    if (atap_resumed(ctx)) {
        char c;
        atomic_fetch_add(&r->resumes, 1);
        CHECK(atap_resume_reason(ctx) == ATAP_RESUME_READY);
        unsigned ev = atap_resume_events(ctx);
        if (!(ev & ATAP_READABLE)) {
            atomic_fetch_add(&r->no_readable, 1);
            atomic_store(&r->odd_events, (int)ev);
        }
        ssize_t n = read(r->fd, &c, 1);
        if (n == 1) {
            if (atomic_fetch_add(&r->reads, 1) + 1 == r->want) {
                uint64_t v = (uint64_t)r->want;
                memcpy(out, &v, sizeof v);
                return 0;
            }
        } else {
            atomic_fetch_add(&r->empty, 1);
        }
    } else {
        atomic_fetch_add(&r->first, 1);
    }
    CHECK(atap_park_fd(ctx, r->fd, ATAP_READABLE, ATAP_FOREVER) == 0);
    return ATAP_PARKED;
}

static void test_park_fd_repeatedly(void **state)
{
    (void)state;
    int p[2];
    struct reader *r = &g_reader;

    make_pipe(p);
    r->fd = p[0];
    r->want = 100;
    atomic_store(&r->first, 0);
    atomic_store(&r->reads, 0);
    atomic_store(&r->resumes, 0);
    atomic_store(&r->empty, 0);
    atomic_store(&r->no_readable, 0);
    atomic_store(&r->odd_events, 0);
    atap_task t = spawn8(task_park_reader, r);
    assert_true(wait_atomic_at_least(&r->first, 1, ATAP_SEC(10)));
    for (int i = 0; i < r->want; i++) {
        assert_true(put_byte(p[1]));
        if (i % 10 == 0) /* sometimes it catches up and parks on an empty pipe */
            sleep_us(2000);
        else if (i % 3 == 0)
            sleep_us(100);
    }
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(20)), 0);
    assert_int_equal(v, 100);
    assert_int_equal(atomic_load(&r->reads), 100);
    assert_int_equal(atomic_load(&r->first), 1);
    print_message("100 bytes: %d resumes, %d with nothing to read\n", atomic_load(&r->resumes),
                  atomic_load(&r->empty));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
    if (atomic_load(&r->no_readable))
        fail_msg("%d of %d resumes (reason READY) did not report ATAP_READABLE; the last "
                 "reported 0x%x",
                 atomic_load(&r->no_readable), atomic_load(&r->resumes),
                 (unsigned)atomic_load(&r->odd_events));
    /* A resume with nothing to read is tolerated (the task parks again):
     * an event the manager fetched before a re-park may come in late. */
    assert_true(atomic_load(&r->empty) <= 10);
}

/* ---- 7. parked tasks hold no thread --------------------------------------- */

struct mass {
    int fd;
    uint64_t deadline;
    atomic_int first;
    atomic_int resumed_fd;
    atomic_int resumed_timer;
    atomic_int early;
    atomic_int wrong;
};

static struct mass g_mass;

static int task_mass_park(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct mass *m = &g_mass;
    bool timer = ((uintptr_t)arg & 1) != 0;

    if (!atap_resumed(ctx)) {
        int rc = timer ? atap_park_until(ctx, m->deadline)
                       : atap_park_fd(ctx, m->fd, ATAP_READABLE, ATAP_FOREVER);
        CHECK(rc == 0);
        atomic_fetch_add(&m->first, 1);
        return ATAP_PARKED;
    }
    if (timer) {
        if (atap_now() < m->deadline)
            atomic_fetch_add(&m->early, 1);
        if (atap_resume_reason(ctx) != ATAP_RESUME_DEADLINE)
            atomic_fetch_add(&m->wrong, 1);
        atomic_fetch_add(&m->resumed_timer, 1);
    } else {
        if (atap_resume_reason(ctx) != ATAP_RESUME_READY ||
            !(atap_resume_events(ctx) & ATAP_READABLE))
            atomic_fetch_add(&m->wrong, 1);
        atomic_fetch_add(&m->resumed_fd, 1);
    }
    return 0;
}

static void test_park_holds_no_thread(void **state)
{
    (void)state;
    size_t n = scaled(10000, 2000);
    atap_task *ts = calloc(n, sizeof *ts);
    struct mass *m = &g_mass;
    int p[2];

    assert_non_null(ts);
    make_pipe(p);
    wait_workers_started();
    struct atap_pool_stats before = pool_stats();
    m->fd = p[0];
    m->deadline = atap_now() + ATAP_SEC(2);
    atomic_store(&m->first, 0);
    atomic_store(&m->resumed_fd, 0);
    atomic_store(&m->resumed_timer, 0);
    atomic_store(&m->early, 0);
    atomic_store(&m->wrong, 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atap_spawn(&ts[i], task_mass_park, (void *)(uintptr_t)i, NULL), 0);
    assert_true(wait_atomic_at_least(&m->first, (int)n, ATAP_SEC(30)));
    if (atap_now() + ATAP_MS(300) < m->deadline) {
        /* every one has parked, none has resumed yet */
        assert_true(wait_not_busy(m->deadline - atap_now() - ATAP_MS(200)));
        struct atap_pool_stats during = pool_stats();
        print_message("%zu parked: workers %zu -> %zu (peak %zu -> %zu), busy %zu, live %zu\n", n,
                      before.workers, during.workers, before.peak_workers, during.peak_workers,
                      during.busy, during.live);
        assert_true(during.peak_workers == before.peak_workers ||
                    during.workers <= before.workers + 1);
        assert_true(during.live >= g_live_base + n);
        assert_int_equal(atomic_load(&m->resumed_timer), 0);
    } else {
        print_message("spawning %zu took too long to look at the pool before the deadline\n", n);
    }
    /* a fresh plain task still runs */
    atap_task t = spawn8(task_value, (void *)(uintptr_t)31);
    uint64_t v = 0;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(v, 31);
    atap_release(t);
    assert_int_equal(atomic_load(&m->resumed_fd), 0);

    /* release them: the byte for half, the deadline for the rest */
    assert_true(put_byte(p[1]));
    for (size_t i = 0; i < n; i++) {
        int rc = atap_join_for(ts[i], NULL, 0, ATAP_SEC(30));
        if (rc != 0)
            fail_msg("parked task %zu (%s) joined %d (%s)", i, (i & 1) ? "timer" : "pipe", rc,
                     atap_strerror(rc));
        atap_release(ts[i]);
    }
    assert_true(atap_now() >= m->deadline);
    assert_int_equal(atomic_load(&m->resumed_fd), (int)(n - n / 2));
    assert_int_equal(atomic_load(&m->resumed_timer), (int)(n / 2));
    assert_int_equal(atomic_load(&m->early), 0);
    assert_int_equal(atomic_load(&m->wrong), 0);
    free(ts);
    assert_true(wait_live_back(ATAP_SEC(20)));
    close_pipe(p);
    assert_no_failures();
}

/* ---- 8. a cancel frees a parked task --------------------------------------- */

/* Parks on an fd with a deadline keep themselves in the slot: on the fd's
 * list and on the park wheel at once. Many on one pipe, with and without a
 * deadline and with deadlines in one wheel bucket, all resume READY on one
 * byte (an fd's event takes each out of the middle of its bucket); the
 * deadline resumes those nothing wakes; a cancel reads at once, is never
 * resumed by the fd, and gives the slot back within a round of the wheel. */
#define N_SLOT_FD 600
static void test_park_fd_deadline_in_slot(void **state)
{
    (void)state;
    struct fd_parker *fp = calloc(N_SLOT_FD, sizeof *fp);
    atap_task *ts = calloc(N_SLOT_FD, sizeof *ts);
    int p[2], q[2];
    uint64_t v;

    assert_non_null(fp);
    assert_non_null(ts);
    /* 1. on one pipe: a third with no deadline, a third a minute away (one
     * deadline: one bucket), a third at staggered deadlines */
    make_pipe(p);
    uint64_t minute = ATAP_SEC(60);
    for (int i = 0; i < N_SLOT_FD; i++) {
        fd_parker_init(&fp[i], p[0],
                       i % 3 == 0   ? ATAP_FOREVER
                       : i % 3 == 1 ? minute
                                    : minute + (uint64_t)i * ATAP_MS(7));
        ts[i] = spawn8(task_park_fd_once, &fp[i]);
    }
    for (int i = 0; i < N_SLOT_FD; i++)
        assert_true(wait_atomic_at_least(&fp[i].first, 1, ATAP_SEC(10)));
    sleep_ms(20); /* armed */
    assert_true(put_byte(p[1]));
    for (int i = 0; i < N_SLOT_FD; i++) {
        int rc = atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(10));
        if (rc != 0)
            fail_msg("parker %d: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(atomic_load(&fp[i].resumed), 1);
        assert_int_equal(atomic_load(&fp[i].reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&fp[i].events) & ATAP_READABLE);
        assert_true(v < ATAP_SEC(30));
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(5)));
    close_pipe(p);

    /* 2. nothing comes: each deadline resumes its task, never early */
    make_pipe(q);
    for (int i = 0; i < 200; i++) {
        fd_parker_init(&fp[i], q[0], ATAP_MS(20) + (uint64_t)(i % 10) * ATAP_MS(3));
        ts[i] = spawn8(task_park_fd_once, &fp[i]);
    }
    for (int i = 0; i < 200; i++) {
        assert_int_equal(atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(atomic_load(&fp[i].reason), ATAP_RESUME_DEADLINE);
        assert_int_equal(atomic_load(&fp[i].events), 0);
        assert_true(v >= fp[i].timeout);
        atap_release(ts[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(5)));

    /* 3. cancels: read at once; the fd resumes none of them; the slots come
     * back at once (the manager visits their buckets), not in a minute */
    for (int i = 0; i < 100; i++) {
        fd_parker_init(&fp[i], q[0], minute);
        ts[i] = spawn8(task_park_fd_once, &fp[i]);
    }
    for (int i = 0; i < 100; i++)
        assert_true(wait_atomic_at_least(&fp[i].first, 1, ATAP_SEC(10)));
    sleep_ms(20);
    uint64_t t_cancel = now_ns();
    for (int i = 0; i < 100; i++) {
        assert_int_equal(atap_cancel(ts[i]), 0);
        assert_int_equal(atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(1)), ATAP_ECANCELLED);
        atap_release(ts[i]);
    }
    assert_true(put_byte(q[1]));
    sleep_ms(50);
    for (int i = 0; i < 100; i++)
        assert_int_equal(atomic_load(&fp[i].resumed), 0);
    assert_true(wait_live_back(ATAP_SEC(2))); /* not a 4.3 s round of the wheel */
    assert_true(now_ns() - t_cancel < ATAP_SEC(30));
    close_pipe(q);
    free(fp);
    free(ts);
    assert_no_failures();
}

static int g_lay_wfd = -1;

static void lay_wait_parked(atap_task t)
{
    uint64_t end = now_ns() + ATAP_SEC(10) * test_slack();

    while (atap_state_of(t) != ATAP_WAITING && now_ns() < end)
        sleep_us(200);
    assert_int_equal(atap_state_of(t), ATAP_WAITING);
}

/* A park keeps itself in what a task's output leaves of the slot's output
 * area, or on a record when it does not fit: for every output size (none,
 * inline up to the area's 16 bytes, on the heap) and every kind (a
 * deadline, an fd, an fd with a deadline; each ending by its fd or its
 * deadline), what the first run wrote into its output is still there when
 * the resumed run reads it, and the resume says why. Then the edges of a
 * deadline kept as a 32-bit tick: one 30 hours out (past the tail's
 * horizon: on a record) waits and is cancelled; one long past resumes at
 * once; and a timed fd park on an fd above 4,095 (kept off the claim word). */
enum { LAY_UNTIL, LAY_FD, LAY_FD_TIMED };

struct lay {
    int kind, fd;
    size_t size;
    uint64_t timeout;
    atomic_int reason, bad;
};

static void lay_pattern(unsigned char *b, size_t n, size_t salt)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(0xa5u ^ (i * 7u + salt));
}

static int task_lay(atap_ctx *ctx, void *arg, void *out)
{
    struct lay *l = arg;
    unsigned char want[128];

    lay_pattern(want, l->size, l->size);
    if (!atap_resumed(ctx)) {
        if (l->size)
            memcpy(out, want, l->size);
        int rc = l->kind == LAY_UNTIL ? atap_park_until(ctx, atap_now() + l->timeout)
                                      : atap_park_fd(ctx, l->fd, ATAP_READABLE,
                                                     l->kind == LAY_FD ? ATAP_FOREVER : l->timeout);
        if (rc != 0)
            atomic_store(&l->bad, 1);
        return ATAP_PARKED;
    }
    atomic_store(&l->reason, atap_resume_reason(ctx));
    if (l->size && memcmp(out, want, l->size) != 0)
        atomic_store(&l->bad, 2); /* the park wrote over the output */
    return 0;
}

static void lay_run(struct lay *l, int kind, int fd, size_t size, uint64_t timeout, bool write_fd,
                    int want_reason)
{
    unsigned char got[128], want[128];
    atap_task t;

    l->kind = kind, l->fd = fd, l->size = size, l->timeout = timeout;
    atomic_store(&l->reason, 0);
    atomic_store(&l->bad, 0);
    assert_int_equal(atap_spawn(&t, task_lay, l, &(atap_spawn_opts){.out_size = size}), 0);
    if (write_fd) {
        lay_wait_parked(t);
        assert_true(put_byte(g_lay_wfd));
    }
    int rc = atap_join_for(t, size ? got : NULL, size, ATAP_SEC(20));
    if (rc != 0)
        fail_msg("kind %d size %zu: %s", kind, size, atap_strerror(rc));
    if (atomic_load(&l->bad))
        fail_msg("kind %d size %zu: bad %d", kind, size, atomic_load(&l->bad));
    assert_int_equal(atomic_load(&l->reason), want_reason);
    lay_pattern(want, size, size);
    assert_memory_equal(got, want, size);
    atap_release(t);
}

static void test_park_in_what_the_output_leaves(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 1, 4, 8, 9, 12, 13, 16, 17, 24, 100};
    struct lay l;
    int p[2];
    char c;

    make_pipe(p);
    g_lay_wfd = p[1];
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        size_t n = sizes[z];
        lay_run(&l, LAY_UNTIL, -1, n, ATAP_MS(2), false, ATAP_RESUME_DEADLINE);
        lay_run(&l, LAY_FD, p[0], n, 0, true, ATAP_RESUME_READY);
        assert_int_equal(read(p[0], &c, 1), 1);
        lay_run(&l, LAY_FD_TIMED, p[0], n, ATAP_SEC(60), true, ATAP_RESUME_READY);
        assert_int_equal(read(p[0], &c, 1), 1);
        lay_run(&l, LAY_FD_TIMED, p[0], n, ATAP_MS(2), false, ATAP_RESUME_DEADLINE);
    }

    /* A deadline long past: due at once. */
    lay_run(&l, LAY_UNTIL, -1, 0, 0, false, ATAP_RESUME_DEADLINE);

    /* 30 hours out: past the tail's horizon, on a record; it waits, and a
     * cancel ends it. */
    for (size_t z = 0; z < 2; z++) {
        atap_task t;
        l.kind = z ? LAY_FD_TIMED : LAY_UNTIL, l.fd = p[0], l.size = 0;
        l.timeout = 30 * 3600 * ATAP_SEC(1);
        atomic_store(&l.bad, 0);
        assert_int_equal(atap_spawn(&t, task_lay, &l, NULL), 0);
        lay_wait_parked(t);
        sleep_ms(20);
        assert_false(atap_finished(t));
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_ECANCELLED);
        assert_int_equal(atomic_load(&l.bad), 0);
        atap_release(t);
    }

    /* A timed fd park on an fd above 4,095, when the limit allows one. */
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 5000 && rl.rlim_max >= 5000) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = 5000;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
        rl.rlim_cur = was;
    }
    if (dup2(p[0], 4990) == 4990) {
        lay_run(&l, LAY_FD_TIMED, 4990, 8, ATAP_SEC(60), true, ATAP_RESUME_READY);
        assert_int_equal(read(p[0], &c, 1), 1);
        lay_run(&l, LAY_FD_TIMED, 4990, 0, ATAP_MS(2), false, ATAP_RESUME_DEADLINE);
        close(4990);
    } else {
        print_message("no fd 4990 here (RLIMIT_NOFILE %llu): the high-fd case not run\n",
                      (unsigned long long)rl.rlim_max);
    }
    close_pipe(p);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* Readiness is heard while every worker is inside a long run: no worker is
 * idle to wait on io, none finishes a run to look at it between runs, and
 * the manager's tick reads it. The parked task is a blocking one, so that
 * it can run while the workers are still busy. */
static atomic_int g_hog_stop, g_hogs_in;

static int task_hog(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&g_hogs_in, 1);
    while (!atomic_load(&g_hog_stop))
        ; /* on the CPU all along: the pool adds no worker for it */
    return 0;
}

static void test_park_fd_heard_while_every_worker_runs(void **state)
{
    (void)state;
    struct fd_parker *f = &g_fdp[0];
    atap_task parker, hogs[64];
    int p[2], n;
    uint64_t v;

    wait_workers_started();
    n = (int)pool_stats().workers;
    assert_true(n > 0 && n <= 64);
    make_pipe(p);
    fd_parker_init(f, p[0], ATAP_FOREVER);
    assert_int_equal(atap_spawn(&parker, task_park_fd_once, f,
                                &(atap_spawn_opts){.out_size = 8, .blocking = true}),
                     0);
    assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
    atomic_store(&g_hog_stop, 0);
    atomic_store(&g_hogs_in, 0);
    for (int i = 0; i < n; i++)
        hogs[i] = spawn0(task_hog, NULL);
    assert_true(wait_atomic_at_least(&g_hogs_in, n, ATAP_SEC(10)));
    assert_true(put_byte(p[1]));
    /* Resumed while the hogs still run: the byte was heard without them. */
    bool heard = wait_atomic_at_least(&f->resumed, 1, ATAP_SEC(5) * test_slack());
    atomic_store(&g_hog_stop, 1);
    assert_true(heard);
    assert_int_equal(atap_join_for(parker, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_join_for(hogs[i], NULL, 0, ATAP_SEC(10)), 0);
        atap_release(hogs[i]);
    }
    atap_release(parker);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

/* One worker; N tasks parked on N pipes; while the worker runs a gate task,
 * a byte goes to each pipe, in the reverse of the order the tasks parked.
 * When the gate ends the worker reads io (or, had nobody read it for a
 * tick, the manager did) and finds them all ready at once: the task whose
 * fd became ready first runs first. A worker runs its own queue newest
 * first, so it hands out a batch of reports from the last to the first;
 * the manager's go to the shared queue in the order read, and a worker
 * taking a batch from it runs the batch's oldest first. (The poll backend
 * reports in the order of its array, not of readiness: skipped there.) */
#define N_ORDERED 8
static atomic_int g_order_next;
static struct order_reader {
    int fd;
    atomic_int parked;
    atomic_int ran_as; /* 1 + its place in the order the resumed runs ran */
} g_ordered[N_ORDERED];

static int task_read_in_order(atap_ctx *ctx, void *arg, void *out)
{
    struct order_reader *r = arg;

    (void)out;
    if (!atap_resumed(ctx)) {
        CHECK(atap_park_fd(ctx, r->fd, ATAP_READABLE, ATAP_FOREVER) == 0);
        atomic_store(&r->parked, 1);
        return ATAP_PARKED;
    }
    atomic_store(&r->ran_as, 1 + atomic_fetch_add(&g_order_next, 1));
    return 0;
}

static void test_park_fd_first_ready_runs_first(void **state)
{
    (void)state;
    int p[N_ORDERED][2];
    atap_task ts[N_ORDERED], opener;
    gate *g = gate_new(0);

    if (strcmp(atap__poller_name(), "poll") == 0) {
        print_message("skipped: the poll backend reports in its array's order\n");
        return;
    }
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}), 0);
    atomic_store(&g_order_next, 0);
    for (int i = 0; i < N_ORDERED; i++) {
        make_pipe(p[i]);
        g_ordered[i].fd = p[i][0];
        atomic_store(&g_ordered[i].parked, 0);
        atomic_store(&g_ordered[i].ran_as, 0);
        ts[i] = spawn0(task_read_in_order, &g_ordered[i]);
        assert_true(wait_atomic_at_least(&g_ordered[i].parked, 1, ATAP_SEC(10)));
    }
    /* The one worker stays in the gate while the bytes go out. */
    opener = spawn8(task_gated, g);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(10)));
    for (int i = N_ORDERED - 1; i >= 0; i--)
        assert_true(put_byte(p[i][1]));
    atomic_store(&g->open, 1);
    for (int i = 0; i < N_ORDERED; i++) {
        assert_int_equal(atap_join_for(ts[i], NULL, 0, ATAP_SEC(10)), 0);
        atap_release(ts[i]);
    }
    assert_int_equal(join8(opener), 0);
    atap_release(opener);
    /* The last task to park had its byte first. Without the order kept it
     * ran last of the batch. */
    assert_int_equal(atomic_load(&g_ordered[N_ORDERED - 1].ran_as), 1);
    for (int i = 0; i < N_ORDERED; i++) {
        assert_true(atomic_load(&g_ordered[i].ran_as) >= 1);
        close_pipe(p[i]);
    }
    assert_no_failures();
}

static void test_park_cancel_frees(void **state)
{
    (void)state;
    int p[2];
    struct fd_parker *f = &g_fdp[0];

    make_pipe(p);
    fd_parker_init(f, p[0], ATAP_FOREVER);
    atap_task t = spawn8(task_park_fd_once, f);
    assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
    sleep_ms(20); /* armed by now */
    assert_int_equal(atap_cancel(t), 0);
    uint64_t v;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_ECANCELLED);
    assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(5)));
    /* the fd no longer wakes it */
    assert_true(put_byte(p[1]));
    sleep_ms(50);
    assert_int_equal(atomic_load(&f->resumed), 0);

    /* the same with a park on a deadline: read as cancelled at once, never
     * resumed, and its slot back at once, long before the deadline */
    struct until_arg *u = &g_until[0];
    u->delay = ATAP_SEC(30);
    atomic_store(&u->runs, 0);
    t = spawn8(task_park_until, u);
    assert_true(wait_atomic_at_least(&u->runs, 1, ATAP_SEC(10)));
    sleep_ms(20);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_ECANCELLED);
    assert_int_equal(atap_state_of(t), ATAP_CANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(2))); /* not a 4.3 s round of the wheel */
    assert_true(atap_now() < atomic_load(&u->deadline));
    assert_int_equal(atomic_load(&u->runs), 1);
    close_pipe(p);
    assert_no_failures();
}

/* ---- 9. a manager restart keeps parked tasks -------------------------------- */

#define N_RESTART 16
static struct fd_parker g_rs_fd[N_RESTART];

struct rs_until {
    uint64_t deadline;
    atomic_int runs;
    atomic_int reason;
    atomic_u64 resumed_at;
};
static struct rs_until g_rs_until[N_RESTART];

static int task_park_fixed_until(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct rs_until *u = arg;

    atomic_fetch_add(&u->runs, 1);
    if (!atap_resumed(ctx)) {
        CHECK(atap_park_until(ctx, u->deadline) == 0);
        return ATAP_PARKED;
    }
    atomic_store(&u->resumed_at, atap_now());
    atomic_store(&u->reason, atap_resume_reason(ctx));
    return 0;
}

/* Deadline parks spread over more than a round of the park wheel (4.3 s)
 * and most of its buckets, so the search for the next bucket in use skips
 * empty stretches of every length and wraps: each resumes by its
 * deadline, never before it, and none is missed. */
#define N_SPREAD 400
static struct rs_until g_spread[N_SPREAD];

static void test_park_deadlines_spread_over_the_wheel(void **state)
{
    (void)state;
    atap_task t[N_SPREAD];
    uint64_t base = atap_now();
    unsigned seed = 12345;

    for (int i = 0; i < N_SPREAD; i++) {
        seed = seed * 1103515245u + 12345u;
        /* clusters and gaps: a tenth within 2 ms of each other, the rest
         * anywhere in 5.5 s */
        uint64_t off = i % 10 == 0 ? ATAP_MS(700) + (seed >> 8) % ATAP_MS(2)
                                   : (uint64_t)(seed >> 4) % ATAP_MS(5500);
        g_spread[i].deadline = base + off;
        atomic_store(&g_spread[i].runs, 0);
        atomic_store(&g_spread[i].reason, 0);
        atomic_store(&g_spread[i].resumed_at, 0);
        t[i] = spawn0(task_park_fixed_until, &g_spread[i]);
    }
    for (int i = 0; i < N_SPREAD; i++) {
        uint64_t wait = g_spread[i].deadline > atap_now() ? g_spread[i].deadline - atap_now() : 0;
        int rc = atap_join_for(t[i], NULL, 0, wait + ATAP_SEC(10));
        if (rc != 0)
            fail_msg("park %d (deadline +%.3f s): joined %d (%s)", i,
                     (double)(g_spread[i].deadline - base) / 1e9, rc, atap_strerror(rc));
        assert_int_equal(atomic_load(&g_spread[i].runs), 2);
        assert_int_equal(atomic_load(&g_spread[i].reason), ATAP_RESUME_DEADLINE);
        assert_true(atomic_load(&g_spread[i].resumed_at) >= g_spread[i].deadline);
        atap_release(t[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

static void test_park_survives_manager_restart(void **state)
{
    (void)state;
    int p[2];
    atap_task tf[N_RESTART], tu[N_RESTART];

    make_pipe(p);
    unsigned restarts0 = atap__manager_restarts();
    uint64_t deadline = atap_now() + ATAP_MS(300);
    for (int i = 0; i < N_RESTART; i++) {
        fd_parker_init(&g_rs_fd[i], p[0], ATAP_FOREVER);
        tf[i] = spawn8(task_park_fd_once, &g_rs_fd[i]);
        g_rs_until[i].deadline = deadline + (uint64_t)i * ATAP_MS(1);
        atomic_store(&g_rs_until[i].runs, 0);
        atomic_store(&g_rs_until[i].reason, 0);
        atomic_store(&g_rs_until[i].resumed_at, 0);
        tu[i] = spawn0(task_park_fixed_until, &g_rs_until[i]);
    }
    for (int i = 0; i < N_RESTART; i++) {
        assert_true(wait_atomic_at_least(&g_rs_fd[i].first, 1, ATAP_SEC(10)));
        assert_true(wait_atomic_at_least(&g_rs_until[i].runs, 1, ATAP_SEC(10)));
    }
    sleep_ms(10); /* all armed */

    atap_inject_manager_faults(2);
    /* 2 restarts: 10 + 20 ms of backoff at least */
    assert_true(wait_restarts(restarts0 + 2, ATAP_SEC(10)));
    assert_true(wait_manager(true, ATAP_SEC(10)));
    assert_true(status_now().healthy);
    for (int i = 0; i < N_RESTART; i++)
        assert_int_equal(atomic_load(&g_rs_fd[i].resumed), 0);

    assert_true(put_byte(p[1]));
    for (int i = 0; i < N_RESTART; i++) {
        uint64_t v;
        int rc = atap_join_for(tf[i], &v, sizeof v, ATAP_SEC(10));
        if (rc != 0)
            fail_msg("fd-parked task %d after a restart: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(atomic_load(&g_rs_fd[i].reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&g_rs_fd[i].events) & ATAP_READABLE);
        rc = atap_join_for(tu[i], NULL, 0, ATAP_SEC(10));
        if (rc != 0)
            fail_msg("deadline-parked task %d after a restart: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(atomic_load(&g_rs_until[i].runs), 2);
        assert_int_equal(atomic_load(&g_rs_until[i].reason), ATAP_RESUME_DEADLINE);
        assert_true(atomic_load(&g_rs_until[i].resumed_at) >= g_rs_until[i].deadline);
        atap_release(tf[i]);
        atap_release(tu[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

/* A manager that dies holding an fd's event (it comes back from its wait
 * with the event and falls apart before handing it out: the injected fault's
 * moment) loses nothing: the restart watches every parked fd again and the
 * kernel reports it afresh. The fault is owed before the byte is written
 * and the injection does not wake the manager, so the wait the byte ends is
 * the one it dies after. Four faults per runtime life (five in a row is the
 * supervisor's limit); half the parks with no deadline, half with one a
 * minute away (all in the slot's tail: an 8-byte output leaves it free). */
static void test_park_restart_rearms_fds(void **state)
{
    (void)state;
    struct fd_parker *f = &g_fdp[0];

    for (int life = 0; life < 3; life++) {
        for (int round = 0; round < 4; round++) {
            int p[2];
            uint64_t v;

            make_pipe(p);
            fd_parker_init(f, p[0], round % 2 ? ATAP_SEC(60) : ATAP_FOREVER);
            atap_task t = spawn8(task_park_fd_once, f);
            assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
            sleep_ms(2); /* armed */
            unsigned restarts0 = atap__manager_restarts();
            atap_inject_manager_faults(1);
            assert_true(put_byte(p[1]));
            int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(10));
            if (rc != 0)
                fail_msg("life %d round %d: the parked task joined %d (%s), %u restarts", life,
                         round, rc, atap_strerror(rc), atap__manager_restarts() - restarts0);
            assert_int_equal(atomic_load(&f->resumed), 1);
            assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
            assert_true(atomic_load(&f->events) & ATAP_READABLE);
            assert_true(wait_restarts(restarts0 + 1, ATAP_SEC(10)));
            assert_int_equal(atap__manager_restarts(), restarts0 + 1);
            assert_true(wait_manager(true, ATAP_SEC(10)));
            atap_release(t);
            close_pipe(p);
        }
        assert_int_equal(atap_shutdown(), 0); /* a new supervisor: its count starts at 0 */
        assert_int_equal(atap_init(NULL), 0);
    }
    assert_no_failures();
}

/* ---- 10. the manager giving up writes parked tasks off ----------------------- */

static int task_sleep_5ms(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    uint64_t t0 = atap_now();
    int rc = atap_sleep_relaxed(ATAP_MS(5));
    uint64_t el = atap_now() - t0;
    CHECK(rc == 0);
    memcpy(out, &el, sizeof el);
    return 0;
}

static void test_park_manager_gone_writes_off(void **state)
{
    (void)state;
    int p[2];
    atap_task ts[N_RESTART];

    make_pipe(p);
    for (int i = 0; i < N_RESTART; i++) {
        fd_parker_init(&g_rs_fd[i], p[0], i % 2 ? ATAP_SEC(120) : ATAP_FOREVER);
        ts[i] = spawn8(task_park_fd_once, &g_rs_fd[i]);
    }
    for (int i = 0; i < N_RESTART; i++)
        assert_true(wait_atomic_at_least(&g_rs_fd[i].first, 1, ATAP_SEC(10)));
    sleep_ms(10);

    atap_inject_manager_faults(16);
    assert_true(wait_manager_gone(ATAP_SEC(30)));
    /* past the restart limit: every parked task reads EFAILED */
    for (int i = 0; i < N_RESTART; i++) {
        uint64_t v;
        int rc = atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(10));
        if (rc != ATAP_EFAILED)
            fail_msg("parked task %d when the manager gave up: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(atap_state_of(ts[i]), ATAP_FAILED);
        assert_int_equal(atomic_load(&g_rs_fd[i].resumed), 0);
    }
    struct atap_status st = status_now();
    assert_false(st.manager_alive);
    assert_false(st.healthy);
    assert_true(st.initialised);
    for (int i = 0; i < N_RESTART; i++)
        atap_release(ts[i]);

    /* a park from now on fails at once */
    struct fd_parker *f = &g_fdp[0];
    fd_parker_init(f, p[0], ATAP_FOREVER);
    atap_task t = spawn8(task_park_fd_once, f);
    uint64_t v;
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    atap_release(t);
    struct until_arg *u = &g_until[0];
    u->delay = ATAP_SEC(60);
    atomic_store(&u->runs, 0);
    t = spawn8(task_park_until, u);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atomic_load(&u->runs), 1);
    atap_release(t);
    /* Long enough that it must park, however late its run starts. */
    assert_int_equal(atap_spawn_sleep(&t, ATAP_SEC(60), false, NULL), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    atap_release(t);

    /* plain tasks and kernel waits still work */
    for (int i = 0; i < 100; i++) {
        t = spawn8(task_value, (void *)(uintptr_t)i);
        assert_true(join8(t) == (uint64_t)i);
        atap_release(t);
    }
    t = spawn8(task_sleep_5ms, NULL);
    assert_true(join8(t) >= ATAP_MS(5));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));

    /* a new runtime parks again */
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_true(wait_manager(true, ATAP_SEC(5)));
    u->delay = ATAP_MS(20);
    atomic_store(&u->runs, 0);
    t = spawn8(task_park_until, u);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_true(v != UINT64_MAX);
    atap_release(t);
    fd_parker_init(f, p[0], ATAP_FOREVER); /* the pipe is still empty */
    t = spawn8(task_park_fd_once, f);
    assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
    assert_true(put_byte(p[1]));
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&f->reason), ATAP_RESUME_READY);
    atap_release(t);
    close_pipe(p);
    assert_no_failures();
}

/* ---- 11. shutdown writes parked tasks off ----------------------------------- */

struct shutdown_call {
    atomic_int done;
    atomic_int rc;
};

static struct shutdown_call g_sd;

static void *shutdown_main(void *arg)
{
    struct shutdown_call *c = arg;
    atomic_store(&c->rc, atap_shutdown());
    atomic_store(&c->done, 1);
    return NULL;
}

static void test_park_shutdown_writes_off(void **state)
{
    (void)state;
    int p[2];
    struct fd_parker *f = &g_fdp[0], *g = &g_fdp[1];
    struct until_arg *u = &g_until[0];

    make_pipe(p);
    fd_parker_init(f, p[0], ATAP_FOREVER);
    fd_parker_init(g, p[0], ATAP_SEC(120));
    u->delay = ATAP_SEC(120);
    atomic_store(&u->runs, 0);
    atap_task tf = spawn8(task_park_fd_once, f);
    atap_task tg = spawn8(task_park_fd_once, g);
    atap_task tu = spawn8(task_park_until, u);
    assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&g->first, 1, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&u->runs, 1, ATAP_SEC(10)));
    sleep_ms(10);

    /* on a thread of its own, so a shutdown that waits for the parked tasks
     * fails the test instead of hanging it */
    pthread_t th;
    atomic_store(&g_sd.done, 0);
    atomic_store(&g_sd.rc, 1);
    assert_int_equal(pthread_create(&th, NULL, shutdown_main, &g_sd), 0);
    if (!wait_atomic_at_least(&g_sd.done, 1, ATAP_SEC(20)))
        fail_msg("atap_shutdown did not return within 20 s with tasks parked");
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&g_sd.rc), 0);
    assert_false(atap_initialised());

    uint64_t v;
    assert_int_equal(atap_join_for(tf, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atap_join_for(tg, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atap_join_for(tu, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atap_state_of(tf), ATAP_FAILED);
    assert_int_equal(atomic_load(&f->resumed), 0);
    assert_int_equal(atomic_load(&g->resumed), 0);
    assert_int_equal(atomic_load(&u->runs), 1);
    atap_release(tf);
    atap_release(tg);
    atap_release(tu);
    assert_true(wait_live_back(ATAP_SEC(5)));

    /* and a new runtime parks again on the same pipe */
    assert_int_equal(atap_init(NULL), 0);
    fd_parker_init(f, p[0], ATAP_FOREVER);
    tf = spawn8(task_park_fd_once, f);
    assert_true(wait_atomic_at_least(&f->first, 1, ATAP_SEC(10)));
    assert_true(put_byte(p[1]));
    assert_int_equal(atap_join_for(tf, &v, sizeof v, ATAP_SEC(10)), 0);
    atap_release(tf);
    close_pipe(p);
    assert_no_failures();
}

/* ---- 12. atap_block with parks; bad park calls ------------------------------- */

struct blk {
    int fd;
    pthread_t thread;
    atomic_int stage;
    uint64_t deadline;
    uint64_t fd_parked_at;
};

static struct blk g_blk;

static int block_parks(atap_ctx *ctx, void *arg, void *out)
{
    struct blk *b = arg;
    int stage = atomic_fetch_add(&b->stage, 1);

    CHECK(pthread_equal(pthread_self(), b->thread));
    CHECK(atap_self(ctx).id == 0);
    switch (stage) {
    case 0:
        CHECK(!atap_resumed(ctx));
        CHECK(atap_resume_reason(ctx) == 0);
        b->deadline = atap_now() + ATAP_MS(20);
        CHECK(atap_park_until(ctx, b->deadline) == 0);
        /* a second park call in one run */
        CHECK(atap_park_fd(ctx, b->fd, ATAP_READABLE, ATAP_FOREVER) == ATAP_EINVAL);
        CHECK(atap_park_until(ctx, 0) == ATAP_EINVAL);
        return ATAP_PARKED;
    case 1:
        CHECK(atap_resumed(ctx));
        CHECK(atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE);
        CHECK(atap_now() >= b->deadline);
        b->fd_parked_at = atap_now();
        CHECK(atap_park_fd(ctx, b->fd, ATAP_READABLE, ATAP_FOREVER) == 0);
        return ATAP_PARKED;
    case 2: {
        char c;
        CHECK(atap_resumed(ctx));
        CHECK(atap_resume_reason(ctx) == ATAP_RESUME_READY);
        CHECK(atap_resume_events(ctx) & ATAP_READABLE);
        CHECK(atap_now() - b->fd_parked_at >= ATAP_MS(25));
        CHECK(read(b->fd, &c, 1) == 1);
        /* and a park on the silent pipe with a timeout */
        b->deadline = atap_now() + ATAP_MS(15);
        CHECK(atap_park_fd(ctx, b->fd, ATAP_READABLE, ATAP_MS(15)) == 0);
        return ATAP_PARKED;
    }
    case 3: {
        CHECK(atap_resumed(ctx));
        CHECK(atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE);
        CHECK(atap_now() >= b->deadline);
        uint64_t v = 4242;
        memcpy(out, &v, sizeof v);
        return 0;
    }
    default:
        CHECK(!"ran too often");
        return -1;
    }
}

static int parked_without_park(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    atomic_fetch_add((atomic_int *)arg, 1);
    return ATAP_PARKED;
}

static void test_park_block(void **state)
{
    (void)state;
    int p[2];
    struct blk *b = &g_blk;
    pthread_t th;

    make_pipe(p);
    b->fd = p[0];
    b->thread = pthread_self();
    atomic_store(&b->stage, 0);
    /* the byte comes 30 ms after the second run began (it asks for the fd) */
    static struct late_writer lw;
    lw = (struct late_writer){.armed = &b->stage, .at_least = 2, .wfd = p[1], .delay_ms = 30};
    assert_int_equal(pthread_create(&th, NULL, late_writer_main, &lw), 0);
    uint64_t v = 0;
    assert_int_equal(atap_block(block_parks, b, &v, sizeof v), 0);
    pthread_join(th, NULL);
    assert_int_equal(v, 4242);
    assert_int_equal(atomic_load(&b->stage), 4);
    assert_no_failures();

    /* the same without a runtime */
    assert_int_equal(atap_shutdown(), 0);
    atomic_store(&b->stage, 0);
    assert_int_equal(pthread_create(&th, NULL, late_writer_main, &lw), 0);
    v = 0;
    assert_int_equal(atap_block(block_parks, b, &v, sizeof v), 0);
    pthread_join(th, NULL);
    assert_int_equal(v, 4242);
    assert_int_equal(atomic_load(&b->stage), 4);
    assert_no_failures();
    assert_int_equal(atap_init(NULL), 0);

    /* ATAP_PARKED without a park call fails the run */
    static atomic_int runs;
    atomic_store(&runs, 0);
    assert_int_equal(atap_block(parked_without_park, &runs, NULL, 0), ATAP_EFAILED);
    assert_int_equal(atomic_load(&runs), 1);
    atap_task t = spawn0(parked_without_park, &runs);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_EFAILED);
    assert_int_equal(atap_state_of(t), ATAP_FAILED);
    atap_release(t);
    assert_int_equal(atomic_load(&runs), 2);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
}

/* Bad park calls, from a spawned task. */
struct bad_args {
    int fd;
    atomic_int runs;
    uint64_t deadline;
};

static struct bad_args g_bad;

static int task_bad_park_calls(atap_ctx *ctx, void *arg, void *out)
{
    (void)out;
    struct bad_args *a = arg;

    if (atomic_fetch_add(&a->runs, 1) == 0) {
        CHECK(atap_park_fd(ctx, -1, ATAP_READABLE, ATAP_FOREVER) == ATAP_EINVAL);
        CHECK(atap_park_fd(ctx, a->fd, 0, ATAP_FOREVER) == ATAP_EINVAL);
        CHECK(atap_park_fd(ctx, a->fd, ATAP_HANGUP, ATAP_FOREVER) == ATAP_EINVAL);
        CHECK(atap_park_fd(ctx, a->fd, ATAP_READABLE | 0x40u, ATAP_FOREVER) == ATAP_EINVAL);
        a->deadline = atap_now() + ATAP_MS(10);
        CHECK(atap_park_until(ctx, a->deadline) == 0);
        /* a second park call in one run */
        CHECK(atap_park_until(ctx, atap_now() + ATAP_SEC(60)) == ATAP_EINVAL);
        CHECK(atap_park_fd(ctx, a->fd, ATAP_READABLE, ATAP_FOREVER) == ATAP_EINVAL);
        return ATAP_PARKED;
    }
    /* resumed by the first call, the deadline */
    CHECK(atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE);
    CHECK(atap_now() >= a->deadline);
    return 0;
}

static void test_park_bad_calls(void **state)
{
    (void)state;
    int p[2];

    make_pipe(p);
    /* no task: NULL ctx */
    assert_int_equal(atap_park_until(NULL, atap_now() + ATAP_MS(1)), ATAP_EINVAL);
    assert_int_equal(atap_park_fd(NULL, p[0], ATAP_READABLE, ATAP_FOREVER), ATAP_EINVAL);
    assert_false(atap_resumed(NULL));
    assert_int_equal(atap_resume_reason(NULL), 0);
    assert_int_equal(atap_resume_events(NULL), 0);

    g_bad.fd = p[0];
    atomic_store(&g_bad.runs, 0);
    atap_task t = spawn0(task_bad_park_calls, &g_bad);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&g_bad.runs), 2);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    close_pipe(p);
    assert_no_failures();
}

/* ---- 12b. wakers: parks of the program's own making ---------------------------- */

struct waker_arg {
    _Atomic uint64_t waker; /* the task's waker, handed out after its park call */
    atomic_int runs, reason[4];
    atomic_int go;        /* main woke it (and, hand_on, cancelled it) while it ran */
    atomic_int cancelled; /* hand_on: the last run saw atap_cancelled() */
    uint64_t timeout;
    int mode;
};

enum { WK_PARK, WK_SELF, WK_WHILE_RUNNING, WK_TIMEOUT, WK_HAND_ON };

static int task_waker(atap_ctx *ctx, void *arg, void *out)
{
    struct waker_arg *a = arg;
    int run = atomic_fetch_add(&a->runs, 1);

    (void)out;
    CHECK(run < 4);
    atomic_store(&a->reason[run], atap_resume_reason(ctx));
    if (a->mode == WK_WHILE_RUNNING && run == 1) {
        /* Woken by main while it runs, parked for nothing: the next wake
         * park resumes at once, nothing lost. */
        atomic_store(&a->waker, atap_waker_of(ctx).id);
        while (!atomic_load(&a->go))
            sleep_us(200);
    } else if (run > 0) {
        atomic_store(&a->cancelled, atap_cancelled(ctx));
        return 0;
    }
    CHECK(atap_park_wake(ctx, a->mode == WK_TIMEOUT ? a->timeout : ATAP_FOREVER) == 0);
    CHECK(atap_park_wake(ctx, ATAP_FOREVER) == ATAP_EINVAL); /* one park a run */
    if (run == 0)
        atomic_store(&a->waker, atap_waker_of(ctx).id);
    if (a->mode == WK_SELF)
        CHECK(atap_wake(atap_waker_of(ctx))); /* before the park is armed */
    if (a->mode == WK_HAND_ON)                /* main wakes it, then cancels it, before it parks */
        while (!atomic_load(&a->go))
            sleep_us(200);
    return ATAP_PARKED;
}

static atap_waker published_waker(struct waker_arg *a)
{
    uint64_t end = now_ns() + ATAP_SEC(10) * test_slack();

    while (atomic_load(&a->waker) == 0 && now_ns() < end)
        sleep_us(200);
    return (atap_waker){atomic_load(&a->waker)};
}

/* Spawns task_waker and waits until it is parked for a wake: its waker. */
static atap_waker spawn_waiting(struct waker_arg *a, atap_task *t)
{
    uint64_t end;
    atap_waker w;

    assert_int_equal(atap_spawn(t, task_waker, a, NULL), 0);
    w = published_waker(a);
    assert_true(w.id != 0);
    end = now_ns() + ATAP_SEC(10) * test_slack();
    while (atap_state_of(*t) != ATAP_WAITING && now_ns() < end)
        sleep_us(200);
    assert_int_equal(atap_state_of(*t), ATAP_WAITING);
    return w;
}

static void test_park_wake(void **state)
{
    static struct waker_arg a;
    atap_waker w;
    atap_task t;

    (void)state;
    w = spawn_waiting(&a, &t);
    assert_true(atap_waker_live(w));
    assert_int_equal(atomic_load(&a.runs), 1); /* parked: nothing resumes it */
    assert_true(atap_wake(w));
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_int_equal(atomic_load(&a.reason[0]), 0);
    assert_int_equal(atomic_load(&a.reason[1]), ATAP_RESUME_READY);
    /* Ended: a waker holds nothing and wakes nothing. */
    assert_false(atap_waker_live(w));
    assert_false(atap_wake(w));
    atap_release(t);
    assert_false(atap_wake(w));
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* A wake between the park call and the task's return (its own, here) is
 * not lost: the park resumes at once. */
static void test_park_wake_before_armed(void **state)
{
    static struct waker_arg a = {.mode = WK_SELF};
    atap_task t;

    (void)state;
    assert_int_equal(atap_spawn(&t, task_waker, &a, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), 0);
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_int_equal(atomic_load(&a.reason[1]), ATAP_RESUME_READY);
    atap_release(t);
    assert_no_failures();
}

/* Woken while it runs (between two parks): its next wake park resumes at
 * once, and no handle is needed for any of it (released at once). */
static void test_park_wake_while_running(void **state)
{
    static struct waker_arg a = {.mode = WK_WHILE_RUNNING};
    atap_waker w;
    atap_task t;

    (void)state;
    assert_int_equal(atap_spawn(&t, task_waker, &a, NULL), 0);
    w = published_waker(&a);
    assert_true(w.id != 0);
    atap_release(t);
    /* Its first park: woken; then, running, woken again, then it parks. */
    while (atomic_load(&a.runs) < 2) {
        atap_wake(w);
        sleep_us(500);
    }
    assert_true(atap_wake(w)); /* running: the wake waits for its next park */
    atomic_store(&a.go, 1);
    assert_true(wait_atomic_at_least(&a.runs, 3, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&a.reason[2]), ATAP_RESUME_READY);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&a.runs), 3);
    assert_false(atap_wake(w));
    assert_no_failures();
}

/* Nobody wakes it: the timeout resumes it, never early. */
static void test_park_wake_timeout(void **state)
{
    static struct waker_arg a = {.mode = WK_TIMEOUT, .timeout = ATAP_MS(20)};
    uint64_t t0 = atap_now();
    atap_task t;

    (void)state;
    assert_int_equal(atap_spawn(&t, task_waker, &a, NULL), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), 0);
    assert_true(atap_now() - t0 >= ATAP_MS(20));
    assert_int_equal(atomic_load(&a.reason[1]), ATAP_RESUME_DEADLINE);
    atap_release(t);
    assert_no_failures();
}

/* Cancelled while parked for a wake: down at once, and its waker wakes
 * nothing from then on. */
static void test_park_wake_cancel(void **state)
{
    static struct waker_arg a;
    atap_waker w;
    atap_task t;

    (void)state;
    w = spawn_waiting(&a, &t);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_ECANCELLED);
    assert_false(atap_waker_live(w));
    assert_false(atap_wake(w));
    assert_int_equal(atomic_load(&a.runs), 1);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* Woken, then stopped before its park is armed: the wake is not lost, the
 * task runs once more seeing atap_cancelled(), to hand on what it meant. */
static void test_park_wake_then_cancel_hands_on(void **state)
{
    static struct waker_arg a = {.mode = WK_HAND_ON};
    atap_waker w;
    atap_task t;

    (void)state;
    assert_int_equal(atap_spawn(&t, task_waker, &a, NULL), 0);
    w = published_waker(&a);
    assert_true(w.id != 0);
    assert_true(atap_wake(w)); /* running, its park asked for, not armed */
    assert_int_equal(atap_cancel(t), 0);
    atomic_store(&a.go, 1);
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_ECANCELLED);
    assert_true(wait_atomic_at_least(&a.runs, 2, ATAP_SEC(10)));
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_true(atomic_load(&a.cancelled));
    assert_false(atap_wake(w));
    assert_no_failures();
}

/* A wake racing a cancel of a task parked for it: one outcome, agreed by
 * both sides. A wake that returned true is seen by the task (a run resumed
 * READY, atap_cancelled() or not); one that returned false is not (the
 * task's only run was its first). Batches of tasks parked at once, each
 * woken by a helper thread while the test thread cancels it, the two sides
 * lined up task by task and moved against each other a little. In every
 * other batch each side goes only once the other is there (both on a CPU),
 * and the side that mostly won the last such batch waits a little longer
 * in the next; in the rest the cancel goes as soon as the wake is due, so
 * the wake comes just after it. Both outcomes, and the moment between a
 * stop's claim and its end, come often on any build and any load. */
enum { WVC_BATCH = 128 };

struct wvc_task {
    atomic_int runs, reason;
};

static struct wvc {
    struct wvc_task task[WVC_BATCH];
    atap_waker waker[WVC_BATCH];
    atomic_int woke[WVC_BATCH]; /* what atap_wake returned, + 1 */
    atomic_int parked, gone;
    atomic_int turn; /* the task both sides are at, + 1; -1: done */
    atomic_int ack;  /* the helper is there too */
    atomic_int done; /* the helper's wake of that task returned, + 1 */
    atomic_int lead; /* spins: > 0 the cancel waits them, < 0 the wake */
} g_wvc;

static int task_wvc(atap_ctx *ctx, void *arg, void *out)
{
    struct wvc_task *t = arg;
    size_t i = (size_t)(t - g_wvc.task);

    (void)out;
    if (atomic_fetch_add(&t->runs, 1) > 0) {
        atomic_store(&t->reason, atap_resume_reason(ctx));
        return 0;
    }
    g_wvc.waker[i] = atap_waker_of(ctx);
    CHECK(atap_park_wake(ctx, ATAP_FOREVER) == 0);
    atomic_fetch_add(&g_wvc.parked, 1);
    return ATAP_PARKED;
}

static void wvc_gone(void *arg)
{
    (void)arg;
    atomic_fetch_add(&g_wvc.gone, 1);
}

/* Spins until *a reads want or -1. A yield on a loaded machine gives the
 * CPU away for a while, so only a long wait (the other side is off its
 * CPU) yields, now and then. */
static int wvc_wait(atomic_int *a, int want)
{
    int v;

    for (unsigned n = 1; (v = atomic_load(a)) != want && v != -1; n++)
        if (n % 4096 == 0)
            sched_yield();
    return v;
}

static void wvc_spin(unsigned n)
{
    for (volatile unsigned k = 0; k < n; k++) {
    }
}

static void *wvc_waker_thread(void *arg)
{
    (void)arg;
    for (int i = 1;; i++) {
        int lead;

        if (wvc_wait(&g_wvc.turn, i) == -1)
            return NULL;
        lead = atomic_load(&g_wvc.lead);
        atomic_store(&g_wvc.ack, i);
        wvc_spin((lead < 0 ? (unsigned)-lead : 0) + (unsigned)(i * 7 % 13) * 20u);
        atomic_store(&g_wvc.woke[(i - 1) % WVC_BATCH],
                     atap_wake(g_wvc.waker[(i - 1) % WVC_BATCH]) + 1);
        atomic_store(&g_wvc.done, i);
    }
}

/* A resumed run does not wait behind a burst of first runs. One worker is
 * held busy while 2,000 tasks are spawned from outside the pool and then a
 * parked task is woken from outside; once the worker is free, the woken
 * task runs before the burst (the shared queue serves a priority's resumed
 * runs before its first runs), not after all of it. */
#define BURST 2000
static atomic_int g_burst_ran, g_woken_at, g_holding;
static atomic_bool g_hold;
static _Atomic uint64_t g_burst_waker;

static int task_burst(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&g_burst_ran, 1);
    return 0;
}

static int task_hold(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_store(&g_holding, 1);
    while (atomic_load(&g_hold))
        sleep_us(100);
    return 0;
}

static int task_woken_before_burst(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg, (void)out;
    if (atap_resumed(ctx)) {
        atomic_store(&g_woken_at, atomic_load(&g_burst_ran));
        return 0;
    }
    CHECK(atap_park_wake(ctx, ATAP_FOREVER) == 0);
    atomic_store(&g_burst_waker, atap_waker_of(ctx).id);
    return ATAP_PARKED;
}

static void test_park_resumed_before_first_runs(void **state)
{
    atap_task woken, hold, burst[BURST];
    uint64_t end;

    (void)state;
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}), 0);
    atomic_store(&g_burst_ran, 0);
    atomic_store(&g_woken_at, -1);
    atomic_store(&g_holding, 0);
    atomic_store(&g_burst_waker, 0);
    woken = spawn0(task_woken_before_burst, NULL);
    end = now_ns() + ATAP_SEC(10) * test_slack();
    while ((atomic_load(&g_burst_waker) == 0 || atap_state_of(woken) != ATAP_WAITING) &&
           now_ns() < end)
        sleep_us(200);
    assert_int_equal(atap_state_of(woken), ATAP_WAITING);
    atomic_store(&g_hold, true);
    hold = spawn0(task_hold, NULL);
    while (!atomic_load(&g_holding) && now_ns() < end)
        sleep_us(100);
    assert_int_equal(atomic_load(&g_holding), 1);
    for (int i = 0; i < BURST; i++)
        burst[i] = spawn0(task_burst, NULL);
    assert_true(atap_wake((atap_waker){atomic_load(&g_burst_waker)}));
    atomic_store(&g_hold, false);
    assert_int_equal(atap_join_for(woken, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    for (int i = 0; i < BURST; i++) {
        assert_int_equal(atap_join_for(burst[i], NULL, 0, ATAP_SEC(10) * test_slack()), 0);
        atap_release(burst[i]);
    }
    assert_int_equal(atap_join_for(hold, NULL, 0, ATAP_SEC(10) * test_slack()), 0);
    /* At most the one batch a worker takes from the queue at once. */
    assert_in_range(atomic_load(&g_woken_at), 0, 16);
    atap_release(woken);
    atap_release(hold);
    assert_no_failures();
}

static void test_park_wake_vs_cancel_agree(void **state)
{
    size_t batches = scaled(200, 40), woke = 0, said_no = 0;
    atap_spawn_opts o = {.arg_free = wvc_gone};
    struct wvc *g = &g_wvc;
    atap_task t[WVC_BATCH];
    pthread_t th;
    int turn = 0, lead = 0;

    (void)state;
    atomic_store(&g->turn, 0);
    atomic_store(&g->ack, 0);
    atomic_store(&g->done, 0);
    atomic_store(&g->lead, 0);
    assert_int_equal(pthread_create(&th, NULL, wvc_waker_thread, NULL), 0);
    for (size_t b = 0; b < batches; b++) {
        atomic_store(&g->parked, 0);
        atomic_store(&g->gone, 0);
        for (int i = 0; i < WVC_BATCH; i++) {
            atomic_store(&g->task[i].runs, 0);
            atomic_store(&g->task[i].reason, 0);
            assert_int_equal(atap_spawn(&t[i], task_wvc, &g->task[i], &o), 0);
        }
        assert_true(wait_atomic_at_least(&g->parked, WVC_BATCH, ATAP_SEC(10) * test_slack()));
        for (int i = 0; i < WVC_BATCH; i++) {
            uint64_t end = now_ns() + ATAP_SEC(10) * test_slack();
            while (atap_state_of(t[i]) != ATAP_WAITING && now_ns() < end)
                sched_yield();
            assert_int_equal(atap_state_of(t[i]), ATAP_WAITING);
        }
        for (int i = 0; i < WVC_BATCH; i++) {
            atomic_store(&g->turn, ++turn);
            if (b % 2 == 0)
                wvc_wait(&g->ack, turn);
            wvc_spin((lead > 0 ? (unsigned)lead : 0) + (unsigned)(turn * 5 % 11) * 20u);
            assert_int_equal(atap_cancel(t[i]), 0);
            wvc_wait(&g->done, turn);
        }
        for (int i = 0; i < WVC_BATCH; i++)
            atap_release(t[i]);
        assert_true(wait_atomic_at_least(&g->gone, WVC_BATCH, ATAP_SEC(10) * test_slack()));
        int batch_woke = 0;
        for (int i = 0; i < WVC_BATCH; i++) {
            bool said = atomic_load(&g->woke[i]) == 2;
            int runs = atomic_load(&g->task[i].runs);

            if (said != (runs == 2) ||
                (runs == 2 && atomic_load(&g->task[i].reason) != ATAP_RESUME_READY))
                fail_msg("batch %zu task %d: atap_wake said %d, the task ran %d times", b, i, said,
                         runs);
            woke += said;
            said_no += !said;
            batch_woke += said;
        }
        if (batch_woke < WVC_BATCH / 4 && lead < 2000)
            lead += 50;
        else if (batch_woke > WVC_BATCH * 3 / 4 && lead > -2000)
            lead -= 50;
        atomic_store(&g->lead, lead);
    }
    atomic_store(&g->turn, -1);
    assert_int_equal(pthread_join(th, NULL), 0);
    print_message("wake vs cancel: %zu woken, %zu not (lead %d)\n", woke, said_no, lead);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* The same race made to happen every time (two test hooks): the wake finds
 * its task parked and live, the cancel then claims the park for its stop,
 * and the wake counts itself and looks at the claim before the stop's
 * completion looks for a wake pending. The wake then says it woke nothing
 * and the task does not run again. */
static struct {
    atomic_int armed;   /* the hooks act once each */
    atomic_int looked;  /* the wake found its task live */
    atomic_int claimed; /* the stop claimed the park */
    atomic_int woke;    /* what atap_wake returned, + 1 */
    atap_waker w;
} g_wis;

static void wis_wait(atomic_int *a)
{
    uint64_t end = now_ns() + ATAP_SEC(5) * test_slack();

    while (!atomic_load(a) && now_ns() < end)
        sleep_us(100);
}

static void wis_wake_live(void)
{
    if (!(atomic_fetch_and(&g_wis.armed, ~1) & 1))
        return;
    atomic_store(&g_wis.looked, 1);
    wis_wait(&g_wis.claimed); /* the stop claims the park meanwhile */
}

static void wis_stop_wake(void)
{
    if (!(atomic_fetch_and(&g_wis.armed, ~2) & 2))
        return;
    atomic_store(&g_wis.claimed, 1);
    wis_wait(&g_wis.woke); /* the wake has counted itself and returned */
}

static void *wis_waker_thread(void *arg)
{
    (void)arg;
    atomic_store(&g_wis.woke, atap_wake(g_wis.w) + 1);
    return NULL;
}

static void test_park_wake_inside_a_stop(void **state)
{
    static struct waker_arg a;
    pthread_t th;
    atap_task t;

    (void)state;
    memset(&a, 0, sizeof a);
    g_wis.w = spawn_waiting(&a, &t);
    atomic_store(&g_wis.looked, 0);
    atomic_store(&g_wis.claimed, 0);
    atomic_store(&g_wis.woke, 0);
    atomic_store(&g_wis.armed, 3);
    assert_int_equal(atap__test_on(ATAP__TEST_WAKE_LIVE, wis_wake_live), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_STOP_WAKE, wis_stop_wake), 0);
    assert_int_equal(pthread_create(&th, NULL, wis_waker_thread, NULL), 0);
    wis_wait(&g_wis.looked);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    atap__test_on(ATAP__TEST_WAKE_LIVE, NULL);
    atap__test_on(ATAP__TEST_STOP_WAKE, NULL);
    assert_int_equal(atomic_load(&g_wis.armed), 0); /* both hooks were passed */
    assert_int_equal(atap_join_for(t, NULL, 0, ATAP_SEC(10)), ATAP_ECANCELLED);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_int_equal(atomic_load(&g_wis.woke), 1); /* false: it woke nothing */
    assert_int_equal(atomic_load(&a.runs), 1);     /* and the task agrees */
    assert_no_failures();
}

static int block_park_wake(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    (void)out;
    CHECK(atap_waker_of(ctx).id == 0);
    return atap_park_wake(ctx, ATAP_FOREVER) == ATAP_EINVAL ? 0 : ATAP_EFAILED;
}

static void test_park_wake_bad_calls(void **state)
{
    (void)state;
    assert_int_equal(atap_park_wake(NULL, ATAP_FOREVER), ATAP_EINVAL);
    assert_int_equal(atap_waker_of(NULL).id, 0);
    assert_false(atap_wake((atap_waker){0}));
    assert_false(atap_waker_live((atap_waker){0}));
    /* Made up: an index no block is mapped for, a generation never given. */
    assert_false(atap_wake((atap_waker){UINT64_C(5) << 32 | 0xfffffff0u}));
    assert_false(atap_waker_live((atap_waker){UINT64_C(5) << 32 | 0xfffffff0u}));
    assert_false(atap_wake((atap_waker){UINT64_C(0xffffffff) << 32}));
    /* Inside atap_block no waker names the caller. */
    assert_int_equal(atap_block(block_park_wake, NULL, NULL, 0), 0);
    assert_no_failures();
}

/* ---- 13. the sleep task ------------------------------------------------------ */

static void test_park_sleep_task(void **state)
{
    (void)state;
    atap_task t;
    uint64_t v;

    for (int precise = 0; precise < 2; precise++) {
        for (int round = 0; round < 3; round++) {
            uint64_t t0 = atap_now();
            assert_int_equal(atap_spawn_sleep(&t, ATAP_MS(30), precise, NULL), 0);
            v = 0;
            assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
            uint64_t el = atap_now() - t0;
            if (v < ATAP_MS(30) || el < ATAP_MS(30))
                fail_msg("%s sleep task of 30 ms: output %llu ns, joined after %llu ns",
                         precise ? "precise" : "relaxed", (unsigned long long)v,
                         (unsigned long long)el);
            if (round == 0)
                print_message("%s sleep task of 30 ms: slept %llu us\n",
                              precise ? "precise" : "relaxed", (unsigned long long)(v / 1000u));
            atap_release(t);
        }
    }
    /* opts with out_size 8 or 0; after_ns counts in the sleep */
    uint64_t t0 = atap_now();
    assert_int_equal(atap_spawn_sleep(&t, ATAP_MS(20), true,
                                      &(atap_spawn_opts){.out_size = 8, .after_ns = ATAP_MS(40)}),
                     0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_true(v >= ATAP_MS(40));
    assert_true(atap_now() - t0 >= ATAP_MS(40));
    atap_release(t);
    assert_int_equal(atap_spawn_sleep(&t, ATAP_MS(5), false, &(atap_spawn_opts){.out_size = 0}), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_true(v >= ATAP_MS(5));
    atap_release(t);
    /* 0 ns */
    assert_int_equal(atap_spawn_sleep(&t, 0, true, NULL), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    atap_release(t);

    /* many at once, 1..100 ms */
    size_t n = scaled(1000, 200);
    uint64_t worst = 0;
    atap_task *ts = calloc(n, sizeof *ts);
    uint64_t *start = calloc(n, sizeof *start);
    assert_non_null(ts);
    assert_non_null(start);
    for (size_t i = 0; i < n; i++) {
        start[i] = atap_now();
        assert_int_equal(atap_spawn_sleep(&ts[i], ATAP_MS(1 + i % 100), i % 2 == 0, NULL), 0);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t ns = ATAP_MS(1 + i % 100);
        v = 0;
        int rc = atap_join_for(ts[i], &v, sizeof v, ATAP_SEC(30));
        if (rc == 0 && v - ns > worst)
            worst = v - ns;
        if (rc != 0 || v < ns || atap_now() - start[i] < ns)
            fail_msg("sleep task %zu of %llu ns: rc %d, output %llu", i, (unsigned long long)ns, rc,
                     (unsigned long long)v);
        atap_release(ts[i]);
    }
    print_message("%zu sleep tasks of 1..100 ms: the latest woke %llu us late\n", n,
                  (unsigned long long)(worst / 1000u));
    free(ts);
    free(start);

    /* cancelled before it ends */
    assert_int_equal(atap_spawn_sleep(&t, ATAP_SEC(30), false, NULL), 0);
    sleep_ms(10);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_ECANCELLED);
    atap_release(t);
    assert_int_equal(atap_spawn_sleep(&t, ATAP_SEC(30), true, NULL), 0);
    sleep_ms(10);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_ECANCELLED);
    atap_release(t);
    /* a run timeout ends a sleep task parked on its timer */
    assert_int_equal(
        atap_spawn_sleep(&t, ATAP_SEC(30), false, &(atap_spawn_opts){.timeout_ns = ATAP_MS(50)}),
        0);
    assert_true(wait_finished(t, ATAP_SEC(5)));
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_ETIMEDOUT);
    assert_int_equal(atap_state_of(t), ATAP_TIMED_OUT);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));

    /* bad opts */
    t.id = 77;
    assert_int_equal(atap_spawn_sleep(&t, ATAP_MS(1), false, &(atap_spawn_opts){.out_size = 4}),
                     ATAP_EINVAL);
    assert_true(t.id == 0);
    t.id = 77;
    assert_int_equal(atap_spawn_sleep(&t, ATAP_MS(1), true,
                                      &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = 1000}),
                     ATAP_EINVAL);
    assert_true(t.id == 0);
    assert_int_equal(atap_spawn_sleep(NULL, ATAP_MS(1), true, NULL), ATAP_EINVAL);
    assert_true(wait_live_back(ATAP_SEC(10)));
}

/* ---- 14. races (for TSan) ------------------------------------------------------ */

struct race {
    atomic_int fd;
    _Atomic uint64_t timeout;
    _Atomic uint64_t deadline; /* park_until instead of the fd when nonzero */
    atomic_int first;
    atomic_int resumes;
    atomic_int reason;
};

static struct race g_race;

static int task_race(atap_ctx *ctx, void *arg, void *out)
{
    struct race *r = arg;

    if (!atap_resumed(ctx)) {
        uint64_t d = atomic_load(&r->deadline);
        int rc =
            d ? atap_park_until(ctx, d)
              : atap_park_fd(ctx, atomic_load(&r->fd), ATAP_READABLE, atomic_load(&r->timeout));
        CHECK(rc == 0);
        atomic_store(&r->first, 1);
        return ATAP_PARKED;
    }
    atomic_fetch_add(&r->resumes, 1);
    atomic_store(&r->reason, atap_resume_reason(ctx));
    uint64_t v = 7;
    memcpy(out, &v, sizeof v);
    return 0;
}

static void race_init(struct race *r, int fd, uint64_t timeout, uint64_t deadline)
{
    atomic_store(&r->fd, fd);
    atomic_store(&r->timeout, timeout);
    atomic_store(&r->deadline, deadline);
    atomic_store(&r->first, 0);
    atomic_store(&r->resumes, 0);
    atomic_store(&r->reason, 0);
}

struct racer {
    test_barrier *bar;
    int wfd;
};

static void *racer_write(void *arg)
{
    struct racer *rc = arg;
    barrier_wait(rc->bar);
    CHECK(put_byte(rc->wfd));
    return NULL;
}

/* Cancels t at the moment another thread writes a byte to wfd. */
static void cancel_while_writing(atap_task t, int wfd)
{
    test_barrier bar;
    struct racer rr = {&bar, wfd};
    pthread_t th;

    barrier_init(&bar, 2);
    assert_int_equal(pthread_create(&th, NULL, racer_write, &rr), 0);
    barrier_wait(&bar);
    assert_int_equal(atap_cancel(t), 0);
    pthread_join(th, NULL);
}

/* The round's task settled READY (it ran, resumed exactly once)
 * or CANCELLED (at most one resumed run), and its slot goes. */
static void race_settle(atap_task t, struct race *r, bool may_cancel, int *ready, int *cancelled)
{
    uint64_t v = 0;
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(10));
    atap_state st = atap_state_of(t);

    if (rc == 0) {
        assert_int_equal(st, ATAP_READY);
        assert_int_equal(v, 7);
        (*ready)++;
    } else if (rc == ATAP_ECANCELLED && may_cancel) {
        assert_int_equal(st, ATAP_CANCELLED);
        (*cancelled)++;
    } else {
        fail_msg("a racing task joined %d (%s), state %d", rc, atap_strerror(rc), (int)st);
    }
    atap_release(t);
    if (!wait_live_back(ATAP_SEC(10))) /* never hangs, never leaks */
        fail_msg("a racing task joined %d (%s) but its slot was still held 10 s after its "
                 "handle was released (first run %s, %d resumed runs)",
                 rc, atap_strerror(rc), atomic_load(&r->first) ? "parked" : "not seen",
                 atomic_load(&r->resumes));
    int resumes = atomic_load(&r->resumes);
    if (rc == 0)
        assert_int_equal(resumes, 1);
    else
        assert_true(resumes <= 1);
}

static void test_park_race_cancel_vs_fd(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50), ready = 0, cancelled = 0;
    struct race *r = &g_race;

    for (int i = 0; i < rounds; i++) {
        int p[2];

        make_pipe(p);
        race_init(r, p[0], ATAP_FOREVER, 0);
        atap_task t = spawn8(task_race, r);
        assert_true(wait_atomic_at_least(&r->first, 1, ATAP_SEC(10)));
        if (i % 2)
            sleep_us(100);
        cancel_while_writing(t, p[1]);
        race_settle(t, r, true, &ready, &cancelled);
        if (atomic_load(&r->resumes) == 1)
            assert_int_equal(atomic_load(&r->reason), ATAP_RESUME_READY);
        close_pipe(p);
    }
    print_message("cancel vs fd: %d ready, %d cancelled\n", ready, cancelled);
    assert_no_failures();
}

static void test_park_race_cancel_vs_park(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50), ready = 0, cancelled = 0;
    struct race *r = &g_race;

    for (int i = 0; i < rounds; i++) {
        int p[2];
        bool data = i % 3 == 1, timer = i % 3 == 2;

        make_pipe(p);
        if (data)
            assert_true(put_byte(p[1]));
        /* a short deadline: its slot may be kept until then */
        race_init(r, p[0], ATAP_FOREVER, timer ? atap_now() + ATAP_MS(50) : 0);
        atap_task t = spawn8(task_race, r);
        if (i % 4 == 3) {
            sched_yield(); /* sometimes a little later: inside the first run */
        } else if (i % 4 == 2) {
            /* right as the first run returns ATAP_PARKED: against the arming */
            uint64_t end = now_ns() + ATAP_SEC(10);
            while (!atomic_load(&r->first) && now_ns() < end)
                ;
        }
        assert_int_equal(atap_cancel(t), 0);
        int before = cancelled;
        race_settle(t, r, true, &ready, &cancelled);
        if (!data && !timer && cancelled == before)
            fail_msg("a task parked on a silent pipe ended READY");
        close_pipe(p);
    }
    print_message("cancel vs park: %d ready, %d cancelled\n", ready, cancelled);
    assert_no_failures();
}

static void test_park_race_deadline_vs_fd(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50), ready = 0, deadline = 0, dummy = 0;
    struct race *r = &g_race;

    for (int i = 0; i < rounds; i++) {
        int p[2];

        make_pipe(p);
        race_init(r, p[0], ATAP_US(500 + (i % 4) * 250), 0);
        atap_task t = spawn8(task_race, r);
        assert_true(wait_atomic_at_least(&r->first, 1, ATAP_SEC(10)));
        sleep_us((unsigned)(i % 7) * 200);
        assert_true(put_byte(p[1]));
        race_settle(t, r, false, &dummy, &dummy);
        int reason = atomic_load(&r->reason);
        assert_true(reason == ATAP_RESUME_READY || reason == ATAP_RESUME_DEADLINE);
        if (reason == ATAP_RESUME_READY)
            ready++;
        else
            deadline++;
        close_pipe(p);
    }
    print_message("deadline vs fd: %d by the fd, %d by the deadline\n", ready, deadline);
    assert_no_failures();
}

/* A park on an fd with a deadline (in the slot: on the fd's list and the
 * wheel at once) raced three ways: the fd's byte from another thread, the
 * deadline, and a cancel, sometimes against the arming itself. Exactly one
 * wins: READY after one resume (by the fd or the deadline), or CANCELLED
 * with at most one; never a hang, never a slot kept. */
static void test_park_race_cancel_fd_deadline(void **state)
{
    (void)state;
    int rounds = (int)scaled(300, 60), ready = 0, cancelled = 0, by_fd = 0, by_deadline = 0;
    struct race *r = &g_race;

    for (int i = 0; i < rounds; i++) {
        int p[2];

        make_pipe(p);
        race_init(r, p[0], ATAP_US(300 + (i % 5) * 250), 0);
        atap_task t = spawn8(task_race, r);
        if (i % 4 == 2) { /* right as the first run returns ATAP_PARKED */
            uint64_t end = now_ns() + ATAP_SEC(10);
            while (!atomic_load(&r->first) && now_ns() < end)
                ;
        } else {
            assert_true(wait_atomic_at_least(&r->first, 1, ATAP_SEC(10)));
            sleep_us((unsigned)(i % 7) * 150);
        }
        cancel_while_writing(t, p[1]);
        race_settle(t, r, true, &ready, &cancelled);
        if (atomic_load(&r->resumes) == 1) {
            int reason = atomic_load(&r->reason);
            assert_true(reason == ATAP_RESUME_READY || reason == ATAP_RESUME_DEADLINE);
            *(reason == ATAP_RESUME_READY ? &by_fd : &by_deadline) += 1;
        }
        close_pipe(p);
    }
    print_message("cancel vs fd vs deadline: %d ready, %d cancelled; resumed %d by the fd, %d by "
                  "the deadline\n",
                  ready, cancelled, by_fd, by_deadline);
    assert_no_failures();
}

static void test_park_race_cancel_vs_deadline(void **state)
{
    (void)state;
    int rounds = (int)scaled(200, 50), ready = 0, cancelled = 0;
    struct race *r = &g_race;

    for (int i = 0; i < rounds; i++) {
        race_init(r, -1, 0, atap_now() + ATAP_US(300 + (i % 5) * 200));
        atap_task t = spawn8(task_race, r);
        assert_true(wait_atomic_at_least(&r->first, 1, ATAP_SEC(10)));
        sleep_us((unsigned)(i % 6) * 150);
        assert_int_equal(atap_cancel(t), 0);
        race_settle(t, r, true, &ready, &cancelled);
    }
    print_message("cancel vs deadline: %d ready, %d cancelled\n", ready, cancelled);
    assert_no_failures();
}

/* A cancel racing parks past their deadline, which the parker ends itself
 * (park_wheel.c): each task parks on a past deadline again and again, and
 * a cancel lands at any point of that. Every join says done (after every
 * run) or cancelled, no task runs past its count, and none is left. */
enum { PAST_RACE_RUNS = 100, PAST_RACE_ROUNDS = 400 };
static atomic_int g_past_race_runs[PAST_RACE_ROUNDS];

static int task_park_past_loop(atap_ctx *ctx, void *arg, void *out)
{
    atomic_int *runs = arg;

    (void)out;
    if (atomic_fetch_add(runs, 1) + 1 >= PAST_RACE_RUNS)
        return 0;
    CHECK(atap_park_until(ctx, 1) == 0);
    return ATAP_PARKED;
}

static void test_park_race_cancel_vs_past_deadline(void **state)
{
    (void)state;
    int rounds = (int)scaled(PAST_RACE_ROUNDS, 100), done = 0, cancelled = 0;
    struct atap_pool_stats st0, st;
    uint64_t end;

    sleep_ms(20); /* the manager has read its clock: the parks take the shortcut */
    assert_int_equal(atap_pool_stats(&st0), 0);
    for (int i = 0; i < rounds; i++) {
        uint64_t until;
        atap_task t;
        int rc;

        atomic_store(&g_past_race_runs[i], 0);
        assert_int_equal(atap_spawn(&t, task_park_past_loop, &g_past_race_runs[i], NULL), 0);
        until = now_ns() + (uint64_t)(i % 8) * 5000u; /* 0 to 35 us into its parks */
        while (now_ns() < until)
            ;
        assert_int_equal(atap_cancel(t), 0);
        rc = atap_join_for(t, NULL, 0, ATAP_SEC(10) * test_slack());
        if (rc == 0) {
            done++;
            assert_int_equal(atomic_load(&g_past_race_runs[i]), PAST_RACE_RUNS);
        } else if (rc == ATAP_ECANCELLED)
            cancelled++;
        else
            fail_msg("round %d: join returned %d", i, rc);
        atap_release(t);
    }
    /* Every task gone, none left parked or queued. */
    end = now_ns() + ATAP_SEC(10) * test_slack();
    for (;;) {
        assert_int_equal(atap_pool_stats(&st), 0);
        if (st.live <= st0.live || now_ns() >= end)
            break;
        sleep_ms(1);
    }
    assert_true(st.live <= st0.live);
    for (int i = 0; i < rounds; i++)
        assert_true(atomic_load(&g_past_race_runs[i]) <= PAST_RACE_RUNS);
    print_message("cancel vs parks past their deadline: %d done, %d cancelled\n", done, cancelled);
    assert_true(cancelled > 0);
    assert_no_failures();
}

/* ---- an fd whose watch cannot be renewed ------------------------------------ */

/* Two tasks parked on one end of a socket pair whose send buffer is full:
 * A for READABLE, B for WRITABLE. A byte from the peer resumes A, and the
 * fd's watch for B is then renewed, which the test makes fail
 * (atap_inject_watch_failures). Draining the peer makes the fd writable:
 * B must resume. */
struct ev_parker {
    int fd;
    unsigned events;
    uint64_t timeout;
    size_t out_size;
    atomic_int first;
    atomic_int resumed;
    atomic_int reason;
    atomic_int got;
};

static struct ev_parker g_evp[3];

/* out_size 8 or 40 (40: the park takes a record, not the slot's tail). */
static int task_park_fd_events(atap_ctx *ctx, void *arg, void *out)
{
    struct ev_parker *p = arg;

    if (!atap_resumed(ctx)) {
        CHECK(atap_park_fd(ctx, p->fd, p->events, p->timeout) == 0);
        atomic_fetch_add(&p->first, 1);
        return ATAP_PARKED;
    }
    atomic_store(&p->reason, atap_resume_reason(ctx));
    atomic_store(&p->got, (int)atap_resume_events(ctx));
    atomic_fetch_add(&p->resumed, 1);
    memset(out, 0, sizeof(uint64_t));
    return 0;
}

static atap_task spawn_ev_parker(struct ev_parker *p, int fd, unsigned events, uint64_t timeout,
                                 bool record)
{
    atap_task t = ATAP_NO_TASK;

    p->fd = fd;
    p->events = events;
    p->timeout = timeout;
    p->out_size = record ? 40 : sizeof(uint64_t);
    atomic_store(&p->first, 0);
    atomic_store(&p->resumed, 0);
    atomic_store(&p->reason, 0);
    atomic_store(&p->got, 0);
    assert_int_equal(
        atap_spawn(&t, task_park_fd_events, p, &(atap_spawn_opts){.out_size = p->out_size}), 0);
    return t;
}

/* A socket pair, both ends non-blocking, with sv[0]'s send buffer full:
 * sv[0] is neither readable nor writable. */
static void full_socketpair(int sv[2])
{
    static char junk[4096];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    while (write(sv[0], junk, sizeof junk) > 0)
        ;
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Reads everything sv[1] holds: sv[0] is writable again. */
static void drain(int fd)
{
    char buf[4096];

    while (read(fd, buf, sizeof buf) > 0)
        ;
}

static int teardown_rewatch(void **state)
{
    atap_inject_watch_failures(0);
    return teardown_runtime(state);
}

/* Joins p's task t within 5 s (the tick that renews the watch comes every
 * 10 ms). */
static void join_within_5s(atap_task t, const struct ev_parker *p, const char *who, int variant)
{
    unsigned char v[40];
    int rc = atap_join_for(t, v, p->out_size, ATAP_SEC(5));

    if (rc != 0)
        fail_msg("variant %d: %s joined %d (%s): its fd's failed watch was never renewed", variant,
                 who, rc, atap_strerror(rc));
}

/* A (READABLE) and B (WRITABLE, no timeout) parked on one fd; the byte
 * that resumes A spends its report, and the watch renewed for B fails once
 * (-ENOMEM). B used to wait for ever (nothing watched the fd again until
 * some other park on it came or went); now the fd is deaf until the
 * manager's next tick watches it again, and B resumes when the fd becomes
 * writable. Variants: each task in the slot's tail or in a park record,
 * and B also with a deadline (then on the wheel too), never met. */
static void test_park_fd_rewatch_fails(void **state)
{
    (void)state;

    for (int variant = 0; variant < 6; variant++) {
        struct ev_parker *a = &g_evp[0], *b = &g_evp[1];
        bool a_record = variant & 1, b_record = variant == 1 || variant == 2 || variant == 5;
        uint64_t b_timeout = variant >= 4 ? ATAP_SEC(60) : ATAP_FOREVER;
        int sv[2];

        full_socketpair(sv);
        atap_task ta = spawn_ev_parker(a, sv[0], ATAP_READABLE, ATAP_FOREVER, a_record);
        atap_task tb = spawn_ev_parker(b, sv[0], ATAP_WRITABLE, b_timeout, b_record);
        assert_true(wait_atomic_at_least(&a->first, 1, ATAP_SEC(10)));
        assert_true(wait_atomic_at_least(&b->first, 1, ATAP_SEC(10)));
        assert_true(wait_not_busy(ATAP_SEC(10))); /* both armed */

        atap_inject_watch_failures(1);
        assert_int_equal(write(sv[1], "x", 1), 1); /* resumes A; B's watch is not renewed */
        join_within_5s(ta, a, "A", variant);
        assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&a->got) & ATAP_READABLE);
        assert_int_equal(atomic_load(&atap__owed_watch_failures), 0); /* it failed */
        assert_int_equal(atomic_load(&b->resumed), 0);

        sleep_ms(variant % 3 * 15); /* before the tick, or after */
        uint64_t drained = now_ns();
        drain(sv[1]);
        join_within_5s(tb, b, "B", variant);
        assert_int_equal(atomic_load(&b->resumed), 1);
        assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&b->got) & ATAP_WRITABLE);
        assert_true(now_ns() - drained < ATAP_SEC(2)); /* a tick or so, not a timeout */
        atap_release(ta);
        atap_release(tb);
        close(sv[0]);
        close(sv[1]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* Waits (10 s at most) for fewer than `than` faults to be owed. */
static void owed_below(unsigned than)
{
    uint64_t end = now_ns() + ATAP_SEC(10);

    while (atomic_load(&atap__owed_watch_failures) >= than) {
        if (now_ns() > end)
            fail_msg("%u watch faults still owed, wanted fewer than %u",
                     atomic_load(&atap__owed_watch_failures), than);
        sleep_ms(1);
    }
}

/* The same with every watch renewal failing: each tick tries again and
 * fails, and looks at the fd itself meanwhile, so B still resumes when the
 * fd becomes writable; a third park, C, cancelled while the fd is deaf,
 * ends cancelled. Once B has gone, nobody waits on the fd and the ticks
 * stop trying (no faults spent); with the faults cleared the fd is heard
 * as ever. */
static void test_park_fd_rewatch_always_fails(void **state)
{
    (void)state;

    for (int variant = 0; variant < 2; variant++) {
        struct ev_parker *a = &g_evp[0], *b = &g_evp[1], *c = &g_evp[2];
        const unsigned many = 1000000;
        int sv[2];
        unsigned char v[40];

        full_socketpair(sv);
        atap_task ta = spawn_ev_parker(a, sv[0], ATAP_READABLE, ATAP_FOREVER, variant);
        atap_task tb = spawn_ev_parker(b, sv[0], ATAP_WRITABLE, ATAP_FOREVER, variant);
        atap_task tc = spawn_ev_parker(c, sv[0], ATAP_WRITABLE, ATAP_FOREVER, !variant);
        assert_true(wait_atomic_at_least(&a->first, 1, ATAP_SEC(10)));
        assert_true(wait_atomic_at_least(&b->first, 1, ATAP_SEC(10)));
        assert_true(wait_atomic_at_least(&c->first, 1, ATAP_SEC(10)));
        assert_true(wait_not_busy(ATAP_SEC(10)));

        atap_inject_watch_failures(many);
        assert_int_equal(write(sv[1], "x", 1), 1);
        join_within_5s(ta, a, "A", variant);
        assert_int_equal(atomic_load(&a->reason), ATAP_RESUME_READY);
        owed_below(many);                     /* A's report renewed nothing */
        sleep_ms(30);                         /* a few ticks that try and fail */
        assert_int_equal(atap_cancel(tc), 0); /* a park leaving the deaf fd */
        assert_int_equal(atap_join_for(tc, v, c->out_size, ATAP_SEC(5)), ATAP_ECANCELLED);
        assert_int_equal(atomic_load(&c->resumed), 0);
        assert_int_equal(atomic_load(&b->resumed), 0);

        uint64_t drained = now_ns();
        drain(sv[1]);
        join_within_5s(tb, b, "B", variant);
        assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
        assert_true(atomic_load(&b->got) & ATAP_WRITABLE);
        assert_true(now_ns() - drained < ATAP_SEC(2));
        owed_below(many - 2); /* more than A's report and C's leaving: the ticks tried */

        /* nobody waits: the fd is not deaf now, and no tick spends a fault */
        unsigned owed = atomic_load(&atap__owed_watch_failures);
        sleep_ms(60);
        assert_int_equal(atomic_load(&atap__owed_watch_failures), owed);
        atap_inject_watch_failures(0);
        atap_release(ta);
        atap_release(tb);
        atap_release(tc);

        /* and heard as ever */
        close(sv[0]);
        close(sv[1]);
        full_socketpair(sv);
        tb = spawn_ev_parker(b, sv[0], ATAP_WRITABLE, ATAP_FOREVER, variant);
        assert_true(wait_atomic_at_least(&b->first, 1, ATAP_SEC(10)));
        assert_true(wait_not_busy(ATAP_SEC(10)));
        drain(sv[1]);
        join_within_5s(tb, b, "B again", variant);
        assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
        atap_release(tb);
        close(sv[0]);
        close(sv[1]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* A and B parked on one fd as above, A resumed, every watch renewal
 * failing: the fd is deaf. */
static void park_deaf_pair(int sv[2], atap_task *ta, atap_task *tb, bool record)
{
    struct ev_parker *a = &g_evp[0], *b = &g_evp[1];

    full_socketpair(sv);
    *ta = spawn_ev_parker(a, sv[0], ATAP_READABLE, ATAP_FOREVER, record);
    *tb = spawn_ev_parker(b, sv[0], ATAP_WRITABLE, ATAP_FOREVER, record);
    assert_true(wait_atomic_at_least(&a->first, 1, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&b->first, 1, ATAP_SEC(10)));
    assert_true(wait_not_busy(ATAP_SEC(10)));
    atap_inject_watch_failures(1000000);
    assert_int_equal(write(sv[1], "x", 1), 1);
    join_within_5s(*ta, a, "A", record);
    owed_below(1000000);
}

/* A deaf fd across a manager restart: the restart's own watch of it fails
 * too, and the next manager's ticks keep at it, so B resumes (it used to
 * wait for ever). Across a shutdown: B is written off like any park, and
 * the next runtime's ticks try nothing for the old fd (no fault spent). */
static void test_park_fd_deaf_restart_shutdown(void **state)
{
    (void)state;
    struct ev_parker *b = &g_evp[1];
    unsigned char v[40];
    atap_task ta, tb;
    int sv[2];

    park_deaf_pair(sv, &ta, &tb, false);
    unsigned restarts0 = atap__manager_restarts();
    atap_inject_manager_faults(1); /* taken when its next wait returns */
    assert_true(wait_restarts(restarts0 + 1, ATAP_SEC(10)));
    assert_true(wait_manager(true, ATAP_SEC(10)));
    sleep_ms(30);
    drain(sv[1]);
    join_within_5s(tb, b, "B after a restart", 0);
    assert_int_equal(atomic_load(&b->reason), ATAP_RESUME_READY);
    assert_true(atomic_load(&b->got) & ATAP_WRITABLE);
    atap_inject_watch_failures(0);
    atap_release(ta);
    atap_release(tb);
    close(sv[0]);
    close(sv[1]);

    park_deaf_pair(sv, &ta, &tb, true);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_join_for(tb, v, b->out_size, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atomic_load(&b->resumed), 0);
    atap_release(ta);
    atap_release(tb);
    assert_int_equal(atap_init(NULL), 0);
    unsigned owed = atomic_load(&atap__owed_watch_failures);
    drain(sv[1]);
    sleep_ms(60);
    assert_int_equal(atomic_load(&atap__owed_watch_failures), owed);
    atap_inject_watch_failures(0);
    close(sv[0]);
    close(sv[1]);
    assert_no_failures();
}

/* ---- a kind of park of the tests' own: a word, as a futex ------------------- */

/* src/README.md's recipe for a new kind of park, followed in test builds:
 * src/park_test_word.c and its line in src/park_kinds.h. A task parks
 * while a word of ours holds the value it expects; another thread stores a
 * new value and wakes the word. Its runs resume READY after the wake (or
 * at once when the word changed before the park was armed), DEADLINE at
 * the timeout, and a cancel, a manager's restart and a shutdown find it as
 * any park. */

/* The kind's two calls (src/park_test_word.c): declared here, as the kind
 * is its file and its line of the list, and nothing else. */
int atap__test_park_word(atap_ctx *ctx, _Atomic uint32_t *word, uint32_t expect,
                         uint64_t timeout_ns);
int atap__test_word_wake(_Atomic uint32_t *word);

struct word_parker {
    _Atomic uint32_t *word;
    uint32_t expect;
    uint64_t timeout;
    atomic_int runs, reason, rc;
    _Atomic uint32_t seen; /* the word as its last run read it */
};

static _Atomic uint32_t g_word, g_other;

/* Parks once on a->word (while it holds a->expect); its second run reads
 * why it resumed and the word, and returns it as its output. */
static int task_park_word(atap_ctx *ctx, void *arg, void *out)
{
    struct word_parker *a = arg;
    int run = atomic_fetch_add(&a->runs, 1);

    if (run > 0) {
        atomic_store(&a->reason, atap_resume_reason(ctx));
        atomic_store(&a->seen, atomic_load(a->word));
        *(uint64_t *)out = atomic_load(a->word);
        return 0;
    }
    atomic_store(&a->rc, atap__test_park_word(ctx, a->word, a->expect, a->timeout));
    CHECK(atap__test_park_word(ctx, a->word, a->expect, a->timeout) == ATAP_EINVAL); /* one a run */
    return ATAP_PARKED;
}

static void parker_init(struct word_parker *a, _Atomic uint32_t *word, uint32_t expect,
                        uint64_t timeout)
{
    a->word = word;
    a->expect = expect;
    a->timeout = timeout;
    atomic_store(&a->runs, 0);
    atomic_store(&a->reason, 0);
    atomic_store(&a->rc, 1);
    atomic_store(&a->seen, 0);
}

/* Spawns task_park_word and waits until it is parked. */
static atap_task spawn_parked(struct word_parker *a)
{
    uint64_t end = now_ns() + ATAP_SEC(10) * test_slack();
    atap_task t;

    t = spawn8(task_park_word, a);
    while (atap_state_of(t) != ATAP_WAITING && now_ns() < end)
        sleep_us(200);
    assert_int_equal(atap_state_of(t), ATAP_WAITING);
    assert_int_equal(atomic_load(&a->rc), 0);
    return t;
}

/* Parked until the word changes and is woken: READY, and its run reads the
 * new value. */
static void test_park_word_wake(void **state)
{
    static struct word_parker a;
    uint64_t v = 0;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 7);
    parker_init(&a, &g_word, 7, ATAP_FOREVER);
    t = spawn_parked(&a);
    sleep_ms(20);
    assert_int_equal(atomic_load(&a.runs), 1);           /* nothing resumes it but a wake */
    assert_int_equal(atap__test_word_wake(&g_other), 0); /* another word wakes nothing */
    assert_int_equal(atomic_load(&a.runs), 1);
    atomic_store(&g_word, 8);
    assert_int_equal(atap__test_word_wake(&g_word), 1);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(v, 8);
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_READY);
    assert_int_equal(atap__test_word_wake(&g_word), 0); /* nobody left on it */
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* The word holds another value already when the park is armed: it resumes
 * at once (its join claims it), no wake needed. */
static void test_park_word_changed_already(void **state)
{
    static struct word_parker a;
    uint64_t v = 0;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 3);
    parker_init(&a, &g_word, 2, ATAP_FOREVER);
    t = spawn8(task_park_word, &a);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(v, 3);
    assert_int_equal(atomic_load(&a.runs), 2);
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_READY);
    atap_release(t);
    assert_no_failures();
}

/* Nobody wakes it: its deadline does, never early. */
static void test_park_word_deadline(void **state)
{
    static struct word_parker a;
    uint64_t t0 = atap_now();
    uint64_t v = 1;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 0);
    parker_init(&a, &g_word, 0, ATAP_MS(20));
    t = spawn8(task_park_word, &a);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_true(atap_now() - t0 >= ATAP_MS(20));
    assert_int_equal(v, 0);
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_DEADLINE);
    assert_int_equal(atap__test_word_wake(&g_word), 0); /* off the word's list */
    atap_release(t);
    assert_no_failures();
}

/* Cancelled while parked: down at once, off the word's list, and a wake
 * then finds nobody. */
static void test_park_word_cancel(void **state)
{
    static struct word_parker a;
    uint64_t v;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 0);
    parker_init(&a, &g_word, 0, ATAP_SEC(60));
    t = spawn_parked(&a);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), ATAP_ECANCELLED);
    assert_int_equal(atomic_load(&a.runs), 1);
    atomic_store(&g_word, 1);
    assert_int_equal(atap__test_word_wake(&g_word), 0);
    assert_int_equal(atomic_load(&a.runs), 1);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* Many parks on one word: one wake resumes them all, once each. */
#define N_MANY 16
static void test_park_word_many(void **state)
{
    static struct word_parker a[N_MANY];
    atap_task t[N_MANY];
    uint64_t v;

    (void)state;
    atomic_store(&g_word, 0);
    for (int i = 0; i < N_MANY; i++) {
        parker_init(&a[i], &g_word, 0, ATAP_FOREVER);
        t[i] = spawn_parked(&a[i]);
    }
    atomic_store(&g_word, 1);
    assert_int_equal(atap__test_word_wake(&g_word), N_MANY);
    for (int i = 0; i < N_MANY; i++) {
        assert_int_equal(atap_join_for(t[i], &v, sizeof v, ATAP_SEC(10)), 0);
        assert_int_equal(v, 1);
        assert_int_equal(atomic_load(&a[i].runs), 2);
        assert_int_equal(atomic_load(&a[i].reason), ATAP_RESUME_READY);
        atap_release(t[i]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* A manager's restart walks the kinds' table for their kernel state (this
 * kind keeps none): the park stays parked, and the wake still finds it. */
static void test_park_word_survives_manager_restart(void **state)
{
    static struct word_parker a;
    unsigned restarts0 = atap__manager_restarts();
    uint64_t v = 0;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 0);
    parker_init(&a, &g_word, 0, ATAP_FOREVER);
    t = spawn_parked(&a);
    atap_inject_manager_faults(1);
    assert_true(wait_restarts(restarts0 + 1, ATAP_SEC(10)));
    assert_true(wait_manager(true, ATAP_SEC(10)));
    assert_int_equal(atomic_load(&a.runs), 1);
    atomic_store(&g_word, 5);
    assert_int_equal(atap__test_word_wake(&g_word), 1);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(10)), 0);
    assert_int_equal(v, 5);
    assert_int_equal(atomic_load(&a.reason), ATAP_RESUME_READY);
    atap_release(t);
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

/* A shutdown writes the park off (ATAP_EFAILED) without a wake; the word's
 * list is empty after it. */
static void test_park_word_shutdown_writes_off(void **state)
{
    static struct word_parker a;
    uint64_t v;
    atap_task t;

    (void)state;
    atomic_store(&g_word, 0);
    parker_init(&a, &g_word, 0, ATAP_FOREVER);
    t = spawn_parked(&a);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(5)), ATAP_EFAILED);
    assert_int_equal(atomic_load(&a.runs), 1);
    assert_int_equal(atap__test_word_wake(&g_word), 0);
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0); /* for the teardown */
    assert_no_failures();
}

/* What the call refuses: no run to park (NULL ctx), no word. */
static void test_park_word_bad_calls(void **state)
{
    (void)state;
    assert_int_equal(atap__test_park_word(NULL, &g_word, 0, ATAP_FOREVER), ATAP_EINVAL);
    assert_int_equal(atap__test_word_wake(NULL), 0);
    assert_no_failures();
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_park_sleep_never_short),
        T(test_park_kernel_wait_interrupted),
        T(test_park_leftover_wake_never_cancels),
        T(test_park_wait_fd_results),
        T(test_park_until_deadline),
        T(test_park_fired_counted),
        T(test_park_wide_output_keeps_arg),
        T(test_park_due_fired_by_a_busy_worker),
        T(test_park_due_fired_by_an_idle_worker),
        T(test_park_manager_idle_while_a_worker_holds_the_wheel),
        T(test_park_far_arms_leave_the_manager_asleep),
        T(test_park_past_deadline_wakes_nobody),
        T(test_park_claimed_before_arm_ends_at_once),
        T(test_park_resumed_before_first_runs),
        T(test_park_fd_many_on_one_pipe),
        T(test_park_fd_timeout),
        T(test_park_fd_ready_at_once),
        T(test_park_fd_both_ways),
        T(test_park_fd_peer_hangup),
        T(test_park_wait_fd_peer_hangup),
        T(test_park_fd_closed_huge_fd),
        T(test_park_wait_fd_zero_after_leftover_wake),
        T(test_park_stale_fire_never_claims_next_park),
        T(test_park_fd_repeatedly),
        T(test_park_holds_no_thread),
        T(test_park_fd_deadline_in_slot),
        T(test_park_in_what_the_output_leaves),
        T(test_park_fd_heard_while_every_worker_runs),
        T(test_park_fd_first_ready_runs_first),
        T(test_park_cancel_frees),
        T(test_park_deadlines_spread_over_the_wheel),
        T(test_park_survives_manager_restart),
        T(test_park_restart_rearms_fds),
        T(test_park_manager_gone_writes_off),
        T(test_park_shutdown_writes_off),
        T(test_park_block),
        T(test_park_bad_calls),
        T(test_park_wake),
        T(test_park_wake_before_armed),
        T(test_park_wake_while_running),
        T(test_park_wake_timeout),
        T(test_park_wake_cancel),
        T(test_park_wake_then_cancel_hands_on),
        T(test_park_wake_vs_cancel_agree),
        T(test_park_wake_inside_a_stop),
        T(test_park_wake_bad_calls),
        T(test_park_sleep_task),
        T(test_park_race_cancel_vs_fd),
        T(test_park_race_cancel_vs_park),
        T(test_park_race_deadline_vs_fd),
        T(test_park_race_cancel_vs_deadline),
        T(test_park_race_cancel_vs_past_deadline),
        T(test_park_race_cancel_fd_deadline),
        T(test_park_word_wake),
        T(test_park_word_changed_already),
        T(test_park_word_deadline),
        T(test_park_word_cancel),
        T(test_park_word_many),
        T(test_park_word_survives_manager_restart),
        T(test_park_word_shutdown_writes_off),
        T(test_park_word_bad_calls),
        cmocka_unit_test_setup_teardown(test_park_fd_rewatch_fails, setup_runtime,
                                        teardown_rewatch),
        cmocka_unit_test_setup_teardown(test_park_fd_rewatch_always_fails, setup_runtime,
                                        teardown_rewatch),
        cmocka_unit_test_setup_teardown(test_park_fd_deaf_restart_shutdown, setup_runtime,
                                        teardown_rewatch),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

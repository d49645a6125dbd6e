/*
 * Kept fds (atap_fd_keep, atap_fd_unkeep): parks on an fd watched once,
 * edge-triggered, for as long as it is kept. What is promised: a park
 * after EAGAIN resumes once the fd becomes ready, also when it became
 * ready between the EAGAIN and the park; a hang-up resumes every later
 * park; WRITE is heard as READ is; a manager's death and a shutdown lose
 * nothing; an fd unkept, closed and its number reused is an ordinary fd
 * again; and a park on a kept fd makes no watch call (counted through the
 * watch faults, which only a watch call spends). On the poll backend a
 * keep leaves the fd one-shot: every test but the last holds there too.
 *
 * Time: no test asserts how soon, only that it comes (seconds of room).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "faults.h"  /* atap__owed_watch_failures */
#include "manager.h" /* atap__manager_restarts */
#include "poller.h"  /* atap__poller_name */
#include "test_util.h"

static bool kept_for_real(void) { return strcmp(atap__poller_name(), "poll") != 0; }

static void make_pipe(int fds[2])
{
    assert_int_equal(pipe(fds), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK), 0);
        assert_int_equal(fcntl(fds[i], F_SETFD, FD_CLOEXEC), 0);
    }
}

/* A pipe whose reading end is kept. */
static void kept_pipe(int fds[2])
{
    make_pipe(fds);
    assert_int_equal(atap_fd_keep(fds[0]), 0);
}

/* Unkeeps the reading end, then closes both (the order atap.h asks). */
static void unkeep_close(int fds[2])
{
    assert_int_equal(atap_fd_unkeep(fds[0]), 0);
    close(fds[0]);
    close(fds[1]);
}

/* ---- a task that reads a kept fd to EAGAIN, then parks -------------------- */

struct drainer {
    int fd;
    int want;             /* bytes to read before it ends */
    atomic_int got;       /* bytes read */
    atomic_int parks;     /* parks made */
    atomic_int resumes;   /* runs resumed by the fd */
    atomic_int odd;       /* resumes not READY with READABLE or HANGUP */
    atomic_int hold;      /* set: after EAGAIN, wait for it to clear before parking */
    atomic_int at_eagain; /* it saw EAGAIN and waits on hold */
};

static struct drainer g_dr;

static void drainer_init(struct drainer *d, int fd, int want)
{
    d->fd = fd;
    d->want = want;
    atomic_store(&d->got, 0);
    atomic_store(&d->parks, 0);
    atomic_store(&d->resumes, 0);
    atomic_store(&d->odd, 0);
    atomic_store(&d->hold, 0);
    atomic_store(&d->at_eagain, 0);
}

static int task_drainer(atap_ctx *ctx, void *arg, void *out)
{
    struct drainer *d = arg;
    char buf[256];
    ssize_t n;

    if (atap_resumed(ctx)) {
        atomic_fetch_add(&d->resumes, 1);
        if (atap_resume_reason(ctx) != ATAP_RESUME_READY ||
            !(atap_resume_events(ctx) & (ATAP_READABLE | ATAP_HANGUP)))
            atomic_fetch_add(&d->odd, 1);
    }
    for (;;) {
        if ((n = read(d->fd, buf, sizeof buf)) > 0) {
            if (atomic_fetch_add(&d->got, (int)n) + (int)n >= d->want) {
                memset(out, 0, 8);
                return 0;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
        break;
    }
    if (atomic_load(&d->hold)) {
        atomic_store(&d->at_eagain, 1);
        while (atomic_load(&d->hold))
            sleep_us(100);
        atomic_store(&d->at_eagain, 0);
    }
    CHECK(atap_park_fd(ctx, d->fd, ATAP_READABLE, ATAP_FOREVER) == 0);
    atomic_fetch_add(&d->parks, 1);
    return ATAP_PARKED;
}

static void join_drainer(atap_task t, struct drainer *d, const char *what)
{
    uint64_t v;
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(20));

    if (rc != 0)
        fail_msg("%s: the reader joined %d (%s) with %d of %d bytes read, %d parks", what, rc,
                 atap_strerror(rc), atomic_load(&d->got), d->want, atomic_load(&d->parks));
    assert_int_equal(atomic_load(&d->got), d->want);
    assert_int_equal(atomic_load(&d->odd), 0);
    atap_release(t);
}

static void wait_parked(struct drainer *d, int parks)
{
    assert_true(wait_atomic_at_least(&d->parks, parks, ATAP_SEC(10)));
    sleep_ms(5); /* armed: the park is made once the run has returned */
}

/* ---- the calls ------------------------------------------------------------ */

static void test_kept_bad_calls(void **state)
{
    (void)state;
    int p[2], file;
    char path[] = "/tmp/atap-kept-XXXXXX";

    assert_int_equal(atap_fd_keep(-1), ATAP_EINVAL);
    assert_int_equal(atap_fd_unkeep(-1), ATAP_EINVAL);
    make_pipe(p);
    close(p[1]);
    close(p[0]);
    assert_int_equal(atap_fd_keep(p[0]), -EBADF); /* not open */
    assert_int_equal(atap_fd_unkeep(p[0]), 0);    /* not kept: nothing to do */
    assert_true((file = mkstemp(path)) >= 0);
    unlink(path);
    int rc = atap_fd_keep(file); /* epoll refuses a regular file; kqueue, poll take it */
    if (strcmp(atap__poller_name(), "epoll") == 0)
        assert_int_equal(rc, -EPERM);
    else
        assert_int_equal(rc, 0);
    assert_int_equal(atap_fd_unkeep(file), 0);
    close(file);

    kept_pipe(p);
    assert_int_equal(atap_fd_keep(p[0]), 0); /* again: armed afresh */
    assert_int_equal(atap_fd_unkeep(p[0]), 0);
    assert_int_equal(atap_fd_unkeep(p[0]), 0);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_fd_keep(p[0]), ATAP_ENOTINIT);
    assert_int_equal(atap_fd_unkeep(p[0]), 0);
    assert_int_equal(atap_init(NULL), 0);
    close(p[0]);
    close(p[1]);
}

/* ---- the edge ------------------------------------------------------------- */

/* Bytes written at every moment: while the reader is parked, and between
 * its EAGAIN and its park (held there until the manager has surely heard
 * of the byte, with nobody parked: the report's READ must wait for the
 * park, or the park would wait for ever for an edge already gone). */
#define EDGE_ROUNDS 20

static void test_kept_edge_between_eagain_and_park(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2];

    kept_pipe(p);
    drainer_init(d, p[0], 2 * EDGE_ROUNDS);
    atap_task t = spawn8(task_drainer, d);
    wait_parked(d, 1);
    for (int i = 0; i < EDGE_ROUNDS; i++) {
        atomic_store(&d->hold, 1);
        assert_int_equal(write(p[1], "a", 1), 1); /* resumes it; it stops at EAGAIN */
        assert_true(wait_atomic_at_least(&d->at_eagain, 1, ATAP_SEC(10)));
        assert_int_equal(write(p[1], "b", 1), 1); /* nobody parked */
        sleep_ms(i % 4 == 0 ? 0 : 20);            /* heard by the manager, mostly */
        atomic_store(&d->hold, 0);
        assert_true(wait_atomic_at_least(&d->got, 2 * (i + 1), ATAP_SEC(10)));
        if (i + 1 < EDGE_ROUNDS) /* two parks a round: one told at once, one that waits */
            wait_parked(d, 1 + 2 * (i + 1));
    }
    join_drainer(t, d, "edge");
    unkeep_close(p);
    assert_no_failures();
}

/* Bursts at random moments through a kept fd, with several bytes at once
 * and a reader that falls behind: every byte read, no resume lost. */
static void test_kept_bursts(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2], sent = 0;
    unsigned seed = 7;

    kept_pipe(p);
    drainer_init(d, p[0], 5000);
    atap_task t = spawn8(task_drainer, d);
    while (sent < d->want) {
        char buf[64];
        int n = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 40;

        n = n > d->want - sent ? d->want - sent : n;
        memset(buf, 'x', sizeof buf);
        assert_int_equal(write(p[1], buf, (size_t)n), n);
        sent += n;
        if (seed % 7 == 0)
            sleep_us(seed % 500);
    }
    join_drainer(t, d, "bursts");
    print_message("5000 bytes: %d parks, %d resumes\n", atomic_load(&d->parks),
                  atomic_load(&d->resumes));
    unkeep_close(p);
    assert_no_failures();
}

/* ---- hang-ups and writes ---------------------------------------------------- */

struct one_park {
    int fd;
    unsigned want;
    atomic_int first;
    atomic_int resumed;
    atomic_uint got;
};

static struct one_park g_op[2];

static int task_one_park(atap_ctx *ctx, void *arg, void *out)
{
    struct one_park *o = arg;

    memset(out, 0, 8);
    if (!atap_resumed(ctx)) {
        CHECK(atap_park_fd(ctx, o->fd, o->want, ATAP_FOREVER) == 0);
        atomic_store(&o->first, 1);
        return ATAP_PARKED;
    }
    CHECK(atap_resume_reason(ctx) == ATAP_RESUME_READY);
    atomic_store(&o->got, atap_resume_events(ctx));
    atomic_store(&o->resumed, 1);
    return 0;
}

static atap_task spawn_one_park(struct one_park *o, int fd, unsigned want)
{
    o->fd = fd;
    o->want = want;
    atomic_store(&o->first, 0);
    atomic_store(&o->resumed, 0);
    atomic_store(&o->got, 0);
    return spawn8(task_one_park, o);
}

static void join_one(atap_task t, struct one_park *o, const char *what)
{
    uint64_t v;
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(20));

    if (rc != 0)
        fail_msg("%s: joined %d (%s)", what, rc, atap_strerror(rc));
    assert_int_equal(atomic_load(&o->resumed), 1);
    atap_release(t);
}

/* A peer's close is reported once by the kernel, and told to every park
 * from then on: two parks before it, one after. */
static void test_kept_hangup_stays(void **state)
{
    (void)state;
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(atap_fd_keep(sv[0]), 0);
    atap_task a = spawn_one_park(&g_op[0], sv[0], ATAP_READABLE);
    atap_task b = spawn_one_park(&g_op[1], sv[0], ATAP_READABLE);
    assert_true(wait_atomic_at_least(&g_op[0].first, 1, ATAP_SEC(10)));
    assert_true(wait_atomic_at_least(&g_op[1].first, 1, ATAP_SEC(10)));
    sleep_ms(5);
    close(sv[1]);
    join_one(a, &g_op[0], "first");
    join_one(b, &g_op[1], "second");
    assert_true(atomic_load(&g_op[0].got) & ATAP_HANGUP);
    assert_true(atomic_load(&g_op[1].got) & ATAP_HANGUP);
    for (int i = 0; i < 3; i++) { /* after it, one at a time */
        atap_task c = spawn_one_park(&g_op[0], sv[0], ATAP_READABLE);
        join_one(c, &g_op[0], "later");
        assert_true(atomic_load(&g_op[0].got) & (ATAP_HANGUP | ATAP_READABLE));
    }
    assert_int_equal(atap_fd_unkeep(sv[0]), 0);
    close(sv[0]);
    assert_no_failures();
}

/* A task that writes one byte, parking for WRITE while the socket is full
 * (a resume may be spurious: it tries again and parks again). */
struct writer {
    int fd;
    atomic_int parks;
    _Atomic uint64_t wrote_at;
};

static struct writer g_wr;

static int task_writer(atap_ctx *ctx, void *arg, void *out)
{
    struct writer *w = arg;

    memset(out, 0, 8);
    if (atap_resumed(ctx))
        CHECK(atap_resume_reason(ctx) == ATAP_RESUME_READY);
    for (;;) {
        if (write(w->fd, "y", 1) == 1) {
            atomic_store(&w->wrote_at, now_ns());
            return 0;
        }
        if (errno != EINTR)
            break;
    }
    CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
    CHECK(atap_park_fd(ctx, w->fd, ATAP_WRITABLE, ATAP_FOREVER) == 0);
    atomic_fetch_add(&w->parks, 1);
    return ATAP_PARKED;
}

/* WRITE, which the kept watch does not ask for at first: a socket filled
 * to EAGAIN, a writer parked, then room made: it writes, and not before.
 * And READ on the same fd still heard afterwards. */
static void test_kept_write_direction(void **state)
{
    (void)state;
    static char junk[4096];
    char buf[4096];
    struct writer *w = &g_wr;
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(atap_fd_keep(sv[0]), 0);
    for (int round = 0; round < 3; round++) {
        while (write(sv[0], junk, sizeof junk) > 0)
            ;
        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        w->fd = sv[0];
        atomic_store(&w->parks, 0);
        atomic_store(&w->wrote_at, 0);
        atap_task t = spawn8(task_writer, w);
        assert_true(wait_atomic_at_least(&w->parks, 1, ATAP_SEC(10)));
        sleep_ms(20);
        assert_int_equal(atomic_load(&w->wrote_at), 0); /* still full */
        uint64_t drained = now_ns();
        while (read(sv[1], buf, sizeof buf) > 0)
            ;
        uint64_t v;
        assert_int_equal(atap_join_for(t, &v, sizeof v, ATAP_SEC(20)), 0);
        assert_true(atomic_load(&w->wrote_at) >= drained);
        atap_release(t);

        atap_task r = spawn_one_park(&g_op[1], sv[0], ATAP_READABLE);
        assert_true(wait_atomic_at_least(&g_op[1].first, 1, ATAP_SEC(10)));
        sleep_ms(5);
        assert_int_equal(write(sv[1], "x", 1), 1);
        join_one(r, &g_op[1], "read");
        assert_true(atomic_load(&g_op[1].got) & ATAP_READABLE);
        assert_int_equal(read(sv[0], buf, sizeof buf), 1);
        while (read(sv[1], buf, sizeof buf) > 0) /* the writer's byte */
            ;
    }
    assert_int_equal(atap_fd_unkeep(sv[0]), 0);
    close(sv[0]);
    close(sv[1]);
    assert_no_failures();
}

/* ---- numbers reused ----------------------------------------------------------- */

/* An fd unkept and closed, its number then given to another pipe: a plain
 * park on the new one is heard (its watch is one-shot again). And one
 * closed while kept (against the rule), its number reused and kept again:
 * the keep arms the new file's watch afresh. */
static void test_kept_number_reused(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2], q[2];

    kept_pipe(p);
    assert_int_equal(atap_fd_unkeep(p[0]), 0);
    make_pipe(q);
    assert_int_equal(dup2(q[0], p[0]), p[0]); /* p[0]'s number, q's file */
    close(q[0]);
    drainer_init(d, p[0], 3);
    atap_task t = spawn8(task_drainer, d);
    wait_parked(d, 1);
    assert_int_equal(write(q[1], "abc", 3), 3);
    join_drainer(t, d, "unkept, reused");
    close(q[1]);

    assert_int_equal(atap_fd_keep(p[0]), 0);
    make_pipe(q);
    assert_int_equal(dup2(q[0], p[0]), p[0]); /* closed while kept: the rule broken */
    close(q[0]);
    assert_int_equal(atap_fd_keep(p[0]), 0); /* the new file kept */
    drainer_init(d, p[0], 3);
    t = spawn8(task_drainer, d);
    wait_parked(d, 1);
    assert_int_equal(write(q[1], "abc", 3), 3);
    join_drainer(t, d, "kept again, reused");
    assert_int_equal(atap_fd_unkeep(p[0]), 0);
    close(p[0]);
    close(p[1]);
    close(q[1]);
    assert_no_failures();
}

/* ---- managers and runtimes ------------------------------------------------------ */

/* A manager that dies holding a kept fd's report loses nothing: with the
 * reader parked (the report was its resume), and with the reader between
 * EAGAIN and its park (the report was for nobody yet). The restart renews
 * the kept watch, which reports the fd afresh. */
static void test_kept_restart_renews(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2];

    kept_pipe(p);
    drainer_init(d, p[0], 8);
    atap_task t = spawn8(task_drainer, d);
    for (int i = 0; i < 4; i++) { /* two bytes and two parks a round */
        unsigned restarts0 = atap__manager_restarts();
        bool parked = i % 2 == 0;

        wait_parked(d, 1 + 2 * i);
        if (!parked) {
            atomic_store(&d->hold, 1);
            assert_int_equal(write(p[1], "h", 1), 1);
            assert_true(wait_atomic_at_least(&d->at_eagain, 1, ATAP_SEC(10)));
        }
        atap_inject_manager_faults(1);
        assert_int_equal(write(p[1], "r", 1), 1);
        assert_true(wait_restarts(restarts0 + 1, ATAP_SEC(10)));
        assert_true(wait_manager(true, ATAP_SEC(10)));
        atomic_store(&d->hold, 0);
        assert_true(wait_atomic_at_least(&d->got, parked ? 2 * i + 1 : 2 * i + 2, ATAP_SEC(10)));
        if (parked) {
            wait_parked(d, 2 + 2 * i);
            assert_int_equal(write(p[1], "s", 1), 1);
            assert_true(wait_atomic_at_least(&d->got, 2 * i + 2, ATAP_SEC(10)));
        }
    }
    join_drainer(t, d, "restarts");
    unkeep_close(p);
    assert_no_failures();
}

/* A keep outlives a shutdown: after the next atap_init a park on the fd is
 * heard without keeping it again. */
static void test_kept_across_shutdown(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2];

    kept_pipe(p);
    for (int life = 0; life < 3; life++) {
        drainer_init(d, p[0], life ? 3 : 2); /* 'z' too, after the first */
        atap_task t = spawn8(task_drainer, d);
        wait_parked(d, 1);
        assert_int_equal(write(p[1], "ab", 2), 2);
        join_drainer(t, d, "life");
        assert_int_equal(atap_shutdown(), 0);
        assert_int_equal(write(p[1], "z", 1), 1); /* while no runtime runs */
        assert_int_equal(atap_init(NULL), 0);
    }
    unkeep_close(p);
    assert_no_failures();
}

/* ---- what a keep saves ------------------------------------------------------------ */

/* Parks on a kept fd make no watch call. Beside the reader, a second task
 * waits on the same fd for what never comes (WRITE on a pipe's read end),
 * so each report of a one-shot fd re-watches it for that one: a watch
 * fault owed is spent at the first report. Kept, the fault stays owed
 * through 50 parks and resumes (only a watch call spends one). */
static void test_kept_parks_make_no_watch_call(void **state)
{
    (void)state;
    struct drainer *d = &g_dr;
    int p[2];

    if (!kept_for_real()) {
        print_message("skipped: the poll backend has no kept watch\n");
        return;
    }
    for (int keep = 1; keep >= 0; keep--) {
        make_pipe(p);
        if (keep)
            assert_int_equal(atap_fd_keep(p[0]), 0);
        atap_task other = spawn_one_park(&g_op[0], p[0], ATAP_WRITABLE);
        assert_true(wait_atomic_at_least(&g_op[0].first, 1, ATAP_SEC(10)));
        drainer_init(d, p[0], 50);
        atap_task t = spawn8(task_drainer, d);
        wait_parked(d, 1);
        atap_inject_watch_failures(1);
        for (int i = 0; i < 50; i++) {
            assert_int_equal(write(p[1], "x", 1), 1);
            assert_true(wait_atomic_at_least(&d->got, i + 1, ATAP_SEC(10)));
            if (i % 10 == 0)
                sleep_ms(2);
        }
        join_drainer(t, d, keep ? "kept" : "not kept");
        unsigned owed = atomic_load(&atap__owed_watch_failures);
        atap_inject_watch_failures(0);
        print_message("%s: %d parks, %u watch faults of 1 left\n", keep ? "kept" : "not kept",
                      atomic_load(&d->parks), owed);
        assert_int_equal(owed, keep ? 1u : 0u);
        assert_int_equal(atomic_load(&g_op[0].resumed), 0);
        atap_cancel(other);
        uint64_t v;
        assert_int_equal(atap_join_for(other, &v, sizeof v, ATAP_SEC(10)), ATAP_ECANCELLED);
        atap_release(other);
        assert_int_equal(atap_fd_unkeep(p[0]), 0);
        close(p[0]);
        close(p[1]);
    }
    assert_true(wait_live_back(ATAP_SEC(10)));
    assert_no_failures();
}

static int teardown_kept(void **state)
{
    atap_inject_watch_failures(0);
    return teardown_runtime(state);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_kept)
    const struct CMUnitTest tests[] = {
        T(test_kept_bad_calls),
        T(test_kept_edge_between_eagain_and_park),
        T(test_kept_bursts),
        T(test_kept_hangup_stays),
        T(test_kept_write_direction),
        T(test_kept_number_reused),
        T(test_kept_restart_renews),
        T(test_kept_across_shutdown),
        T(test_kept_parks_make_no_watch_call),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

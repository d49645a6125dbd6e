/*
 * The event backend's contract (src/poller.h), run against whichever backend
 * this build compiled (ATAP_POLLER=epoll|kqueue|poll): readiness with the
 * right udata, one-shot watches, unwatch, timeouts that are never early,
 * wakes from threads and signal handlers that coalesce and are never lost,
 * EINTR, HUP/ERR reported once, close-on-exec fds, bad input, and path
 * watches where the backend has them.
 *
 * Each test gets a fresh poller from the setup. Helper threads CHECK() and
 * the test asserts no failures after joining them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>

#include "poller.h"
#include "test_util.h"

#define EVMAX 16

/* udata values: addresses nothing else hands out. */
static char g_tag[64];
#define TAG(i) ((void *)&g_tag[(i)])

static int setup_poller(void **state)
{
    struct atap_poller *p = NULL;

    if (atap__poller_open(&p) != 0)
        return -1;
    *state = p;
    return 0;
}

static int teardown_poller(void **state)
{
    atap__poller_close(*state);
    *state = NULL;
    return 0;
}

static void make_pipe(int fds[2]) { assert_int_equal(pipe(fds), 0); }

static void put_byte(int fd)
{
    char c = 'x';
    assert_int_equal(write(fd, &c, 1), 1);
}

static void close_pair(int fds[2])
{
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    fds[0] = fds[1] = -1;
}

/* Waits for one event with a generous limit; asserts exactly one came. */
static struct atap_poller_event wait_one(struct atap_poller *p)
{
    struct atap_poller_event ev[EVMAX];

    memset(ev, 0, sizeof ev);
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(2)), 1);
    assert_int_equal(ev[0].kind, ATAP__WATCH_FD);
    return ev[0];
}

/* Counts the events reported during window_ns; ORs their bits into *bits. */
static int count_events(struct atap_poller *p, uint64_t window_ns, unsigned *bits)
{
    struct atap_poller_event ev[EVMAX];
    uint64_t end = now_ns() + window_ns, now;
    int total = 0, n;

    while ((now = now_ns()) < end) {
        n = atap__poller_wait(p, ev, EVMAX, end - now);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++)
            *bits |= ev[i].events;
        total += n;
    }
    return total;
}

/* Asserts nothing is reported for window_ns, and that the wait took it all. */
static void assert_quiet(struct atap_poller *p, uint64_t window_ns)
{
    struct atap_poller_event ev[EVMAX];
    uint64_t t0 = now_ns();

    assert_int_equal(atap__poller_wait(p, ev, EVMAX, window_ns), 0);
    assert_true(now_ns() - t0 >= window_ns);
}

/* ---- helper threads ------------------------------------------------------ */

struct helper {
    struct atap_poller *p;
    int fd;  /* to watch or unwatch */
    int wfd; /* to write to */
    unsigned delay_ms;
    int rounds;
    pthread_t target;
    atomic_int seq;
    atomic_int ack;
};

static pthread_t start(void *(*fn)(void *), struct helper *h)
{
    pthread_t th;

    assert_int_equal(pthread_create(&th, NULL, fn, h), 0);
    return th;
}

static void finish(pthread_t th)
{
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_no_failures();
}

static void *wake_later(void *arg)
{
    struct helper *h = arg;

    sleep_ms(h->delay_ms);
    CHECK(atap__poller_wake(h->p) == 0);
    return NULL;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_poller_name(void **state)
{
    const char *name = atap__poller_name();

    (void)state;
    assert_non_null(name);
    assert_true(strcmp(name, "epoll") == 0 || strcmp(name, "kqueue") == 0 ||
                strcmp(name, "poll") == 0);
    print_message("[ backend  ] %s\n", name);
}

static void test_poller_readable_reports_udata(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event ev[EVMAX], e;
    int fds[2];

    make_pipe(fds);
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(1)), 0);
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, 0), 0);
    put_byte(fds[1]);
    e = wait_one(p);
    assert_ptr_equal(e.udata, TAG(1));
    assert_true(e.events & ATAP__POLL_READ);
    assert_false(e.events & ATAP__POLL_WRITE);
    close_pair(fds);
}

/* The data stays unread, so the fd stays readable: only re-watching reports
 * it again, once per watch. */
static void test_poller_one_shot(void **state)
{
    struct atap_poller *p = *state;
    int fds[2];

    make_pipe(fds);
    put_byte(fds[1]);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(round)), 0);
        assert_ptr_equal(wait_one(p).udata, TAG(round));
        assert_quiet(p, ATAP_MS(30));
    }
    close_pair(fds);
}

/* A kept watch reports edges: once when armed if something is ready, then
 * once per new readiness (a byte written), never for data merely left
 * unread; armed again, it reports what is ready then; a one-shot watch or
 * an unwatch replaces it. poll has none (-ENOTSUP). */
static void test_poller_kept_edges(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event e;
    int fds[2];

    make_pipe(fds);
    if (strcmp(atap__poller_name(), "poll") == 0) {
        assert_int_equal(atap__poller_watch_kept(p, fds[0], ATAP__POLL_READ, TAG(1)), -ENOTSUP);
        close_pair(fds);
        return;
    }
    assert_int_equal(atap__poller_watch_kept(p, fds[0], ATAP__POLL_READ, TAG(1)), 0);
    assert_quiet(p, ATAP_MS(20)); /* nothing ready */
    for (int round = 0; round < 3; round++) {
        put_byte(fds[1]); /* left unread */
        e = wait_one(p);
        assert_ptr_equal(e.udata, TAG(1));
        assert_true(e.events & ATAP__POLL_READ);
        assert_quiet(p, ATAP_MS(20)); /* still readable: no new edge */
    }
    assert_int_equal(atap__poller_watch_kept(p, fds[0], ATAP__POLL_READ, TAG(2)), 0);
    e = wait_one(p); /* armed again: what is ready now */
    assert_ptr_equal(e.udata, TAG(2));
    assert_true(e.events & ATAP__POLL_READ);
    assert_quiet(p, ATAP_MS(20));
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(3)), 0);
    assert_ptr_equal(wait_one(p).udata, TAG(3)); /* one-shot now */
    put_byte(fds[1]);
    assert_quiet(p, ATAP_MS(20));
    assert_int_equal(atap__poller_watch_kept(p, fds[0], ATAP__POLL_READ, TAG(4)), 0);
    assert_ptr_equal(wait_one(p).udata, TAG(4));
    assert_int_equal(atap__poller_unwatch(p, fds[0]), 0);
    put_byte(fds[1]);
    assert_quiet(p, ATAP_MS(20));
    close_pair(fds);
}

static void test_poller_writable(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event e;
    int fds[2];

    make_pipe(fds);
    assert_int_equal(atap__poller_watch(p, fds[1], ATAP__POLL_WRITE, TAG(2)), 0);
    e = wait_one(p);
    assert_ptr_equal(e.udata, TAG(2));
    assert_true(e.events & ATAP__POLL_WRITE);
    assert_false(e.events & ATAP__POLL_READ);
    assert_quiet(p, ATAP_MS(20));
    close_pair(fds);
}

static void test_poller_unwatch_stops_reports(void **state)
{
    struct atap_poller *p = *state;
    int fds[2], other[2];

    make_pipe(fds);
    make_pipe(other);
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(3)), 0);
    assert_int_equal(atap__poller_unwatch(p, fds[0]), 0);
    put_byte(fds[1]);
    assert_quiet(p, ATAP_MS(20));
    /* unwatching again, or an fd never watched, is not an error */
    assert_int_equal(atap__poller_unwatch(p, fds[0]), 0);
    assert_int_equal(atap__poller_unwatch(p, other[0]), 0);
    /* watched again it reports; unwatching a watch that fired is fine too */
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(4)), 0);
    assert_ptr_equal(wait_one(p).udata, TAG(4));
    assert_int_equal(atap__poller_unwatch(p, fds[0]), 0);
    assert_quiet(p, ATAP_MS(10));
    close_pair(fds);
    close_pair(other);
}

/* A second watch on the same fd replaces the first: its interest and its
 * udata. (After an event the caller re-watches with what it still wants.) */
static void test_poller_rewatch_replaces(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event e;
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(atap__poller_watch(p, sv[0], ATAP__POLL_READ | ATAP__POLL_WRITE, TAG(5)), 0);
    e = wait_one(p);
    assert_ptr_equal(e.udata, TAG(5));
    assert_true(e.events & ATAP__POLL_WRITE);
    assert_false(e.events & ATAP__POLL_READ);

    assert_int_equal(atap__poller_watch(p, sv[0], ATAP__POLL_READ, TAG(6)), 0);
    assert_quiet(p, ATAP_MS(20)); /* writable, but WRITE is no longer asked */
    put_byte(sv[1]);
    e = wait_one(p);
    assert_ptr_equal(e.udata, TAG(6));
    assert_true(e.events & ATAP__POLL_READ);
    assert_quiet(p, ATAP_MS(20));
    close_pair(sv);
}

/* An fd ready both ways, watched for both, is one event with both bits on
 * every backend (kqueue's two filters are merged). */
static void test_poller_both_ways_one_event(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event e;
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    put_byte(sv[1]); /* sv[0]: readable, and writable */
    assert_int_equal(atap__poller_watch(p, sv[0], ATAP__POLL_READ | ATAP__POLL_WRITE, TAG(13)), 0);
    e = wait_one(p);
    assert_ptr_equal(e.udata, TAG(13));
    assert_int_equal(e.events & (ATAP__POLL_READ | ATAP__POLL_WRITE),
                     ATAP__POLL_READ | ATAP__POLL_WRITE);
    assert_int_equal(atap__poller_unwatch(p, sv[0]), 0);
    assert_quiet(p, ATAP_MS(20));
    close_pair(sv);
}

static void test_poller_timeout_never_early(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event ev[EVMAX];
    /* whole, fractional and sub-millisecond timeouts: rounding must go up */
    static const uint64_t waits[] = {
        ATAP_MS(20), 1, ATAP_US(999), ATAP_US(1001), ATAP_US(1500), ATAP_US(2300), ATAP_MS(3) + 1};
    uint64_t t0, took;

    for (size_t i = 0; i < sizeof waits / sizeof waits[0]; i++) {
        t0 = now_ns();
        assert_int_equal(atap__poller_wait(p, ev, EVMAX, waits[i]), 0);
        took = now_ns() - t0;
        if (took < waits[i])
            fail_msg("a %llu ns wait returned after %llu ns", (unsigned long long)waits[i],
                     (unsigned long long)took);
        assert_true(took < waits[i] + ATAP_SEC(1));
    }
    t0 = now_ns();
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, 0), 0);
    assert_true(now_ns() - t0 < ATAP_MS(500));
}

static void test_poller_wake_from_thread(void **state)
{
    struct helper h = {.p = *state, .delay_ms = 20};
    struct atap_poller_event ev[EVMAX];
    uint64_t t0 = now_ns(), took;
    pthread_t th = start(wake_later, &h);

    assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP__POLLER_FOREVER), 0);
    took = now_ns() - t0;
    finish(th);
    assert_true(took >= ATAP_MS(15));
    assert_true(took < ATAP_SEC(2));
    assert_quiet(h.p, ATAP_MS(20)); /* the wake was consumed */
}

/* Many wakes before a wait: it returns once, and later waits sleep. A wake
 * beside a ready fd is consumed by the wait that reports the fd. */
static void test_poller_wakes_coalesce(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event ev[EVMAX];
    uint64_t t0;
    int fds[2];

    for (int i = 0; i < 1000; i++)
        assert_int_equal(atap__poller_wake(p), 0);
    t0 = now_ns();
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(5)), 0);
    assert_true(now_ns() - t0 < ATAP_SEC(1));
    assert_quiet(p, ATAP_MS(20));
    assert_quiet(p, ATAP_MS(5));

    /* still works after coalescing */
    assert_int_equal(atap__poller_wake(p), 0);
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(5)), 0);

    make_pipe(fds);
    put_byte(fds[1]);
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(7)), 0);
    assert_int_equal(atap__poller_wake(p), 0);
    assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(2)), 1);
    assert_ptr_equal(ev[0].udata, TAG(7));
    assert_quiet(p, ATAP_MS(20));
    close_pair(fds);
}

static void *wake_storm(void *arg)
{
    struct helper *h = arg;

    for (int i = 0; i < h->rounds; i++)
        CHECK(atap__poller_wake(h->p) == 0);
    atomic_fetch_add(&h->seq, 1);
    return NULL;
}

/* Four threads wake as fast as they can while the test thread waits in a
 * loop (at least once: on a loaded machine the storm may be over before
 * this thread looks). Once they are done at most one return is left owed,
 * then quiet. */
static void test_poller_wake_storm_then_quiet(void **state)
{
    struct helper h = {.p = *state, .rounds = (int)scaled(20000, 1000)};
    struct atap_poller_event ev[EVMAX];
    pthread_t th[4];

    atomic_init(&h.seq, 0);
    for (int i = 0; i < 4; i++)
        th[i] = start(wake_storm, &h);
    do
        assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP_MS(100)), 0);
    while (atomic_load(&h.seq) < 4);
    for (int i = 0; i < 4; i++)
        finish(th[i]);
    (void)atap__poller_wait(h.p, ev, EVMAX, 0); /* the last wake, if still owed */
    assert_quiet(h.p, ATAP_MS(20));
}

static void *ping(void *arg)
{
    struct helper *h = arg;

    for (int i = 1; i <= h->rounds; i++) {
        while (atomic_load_explicit(&h->ack, memory_order_acquire) != i - 1)
            sched_yield();
        atomic_store_explicit(&h->seq, i, memory_order_release);
        CHECK(atap__poller_wake(h->p) == 0);
    }
    return NULL;
}

/* Ping-pong: each round the helper publishes a number and wakes; the test
 * thread waits until it sees it. A lost wake would stall a round for 2 s. */
static void test_poller_wake_never_lost(void **state)
{
    struct helper h = {.p = *state, .rounds = (int)scaled(3000, 200)};
    struct atap_poller_event ev[EVMAX];
    pthread_t th;
    uint64_t t0;

    atomic_init(&h.seq, 0);
    atomic_init(&h.ack, 0);
    th = start(ping, &h);
    for (int i = 1; i <= h.rounds; i++) {
        while (atomic_load_explicit(&h.seq, memory_order_acquire) < i) {
            t0 = now_ns();
            assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP_SEC(2)), 0);
            if (now_ns() - t0 >= ATAP_SEC(2))
                fail_msg("round %d: the wake was lost", i);
        }
        atomic_store_explicit(&h.ack, i, memory_order_release);
    }
    finish(th);
}

static void test_poller_hup_reported_once(void **state)
{
    struct atap_poller *p = *state;
    unsigned bits = 0;
    int fds[2];

    make_pipe(fds);
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(8)), 0);
    close(fds[1]);
    fds[1] = -1;
    assert_int_equal(count_events(p, ATAP_MS(50), &bits), 1);
    assert_true(bits & ATAP__POLL_HUP);
    /* the hang-up is permanent: each new watch reports it once more */
    bits = 0;
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_READ, TAG(8)), 0);
    assert_int_equal(count_events(p, ATAP_MS(50), &bits), 1);
    assert_true(bits & ATAP__POLL_HUP);
    close_pair(fds);
}

/* A stream socket's peer that shuts down its writing side (a half-close,
 * what a TCP peer's close is too) is HUP with READ for a READ watch:
 * EPOLLRDHUP, POLLRDHUP, EV_EOF. Once per arming, like any hang-up. */
static void test_poller_peer_half_close(void **state)
{
    struct atap_poller *p = *state;
    unsigned bits = 0;
    int sv[2];

    if (strcmp(atap__poller_name(), "poll") == 0 && ATAP__POLLRDHUP == 0)
        skip(); /* poll(2) without POLLRDHUP cannot tell a half-close from data */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(atap__poller_watch(p, sv[0], ATAP__POLL_READ, TAG(14)), 0);
    assert_quiet(p, ATAP_MS(10));
    assert_int_equal(shutdown(sv[1], SHUT_WR), 0);
    assert_int_equal(count_events(p, ATAP_MS(50), &bits), 1);
    assert_true(bits & ATAP__POLL_HUP);
    assert_true(bits & ATAP__POLL_READ);
    bits = 0;
    assert_int_equal(atap__poller_watch(p, sv[0], ATAP__POLL_READ, TAG(14)), 0);
    assert_int_equal(count_events(p, ATAP_MS(50), &bits), 1);
    assert_true(bits & ATAP__POLL_HUP);
    close_pair(sv);
}

/* The reader goes away under a writer waiting for room: reported once, as an
 * error (epoll, poll) or EOF (kqueue). (The pipe is filled first, so the
 * watch is armed before the hang-up on every kernel.) */
static void test_poller_err_reported_once(void **state)
{
    struct atap_poller *p = *state;
    char chunk[4096] = {0};
    unsigned bits = 0;
    int fds[2];

    make_pipe(fds);
    assert_int_equal(fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK), 0);
    while (write(fds[1], chunk, sizeof chunk) > 0) {
    }
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(atap__poller_watch(p, fds[1], ATAP__POLL_WRITE, TAG(9)), 0);
    assert_quiet(p, ATAP_MS(10));
    close(fds[0]);
    fds[0] = -1;
    assert_int_equal(count_events(p, ATAP_MS(50), &bits), 1);
    assert_true(bits & (ATAP__POLL_ERR | ATAP__POLL_HUP));
    close_pair(fds);
}

static void *watch_later(void *arg)
{
    struct helper *h = arg;

    sleep_ms(h->delay_ms);
    CHECK(atap__poller_watch(h->p, h->fd, ATAP__POLL_READ, TAG(10)) == 0);
    return NULL;
}

/* A watch made by another thread applies to the wait in progress. */
static void test_poller_watch_while_waiting(void **state)
{
    struct helper h = {.p = *state, .delay_ms = 20};
    struct atap_poller_event ev[EVMAX];
    uint64_t t0 = now_ns();
    pthread_t th;
    int fds[2];

    make_pipe(fds);
    put_byte(fds[1]);
    h.fd = fds[0];
    th = start(watch_later, &h);
    assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP_SEC(5)), 1);
    assert_true(now_ns() - t0 < ATAP_SEC(2));
    finish(th);
    assert_ptr_equal(ev[0].udata, TAG(10));
    close_pair(fds);
}

static void *unwatch_then_write(void *arg)
{
    struct helper *h = arg;
    char c = 'x';

    sleep_ms(h->delay_ms);
    CHECK(atap__poller_unwatch(h->p, h->fd) == 0);
    CHECK(write(h->wfd, &c, 1) == 1);
    return NULL;
}

/* An unwatch by another thread also applies to the wait in progress. */
static void test_poller_unwatch_while_waiting(void **state)
{
    struct helper h = {.p = *state, .delay_ms = 10};
    pthread_t th;
    int fds[2];

    make_pipe(fds);
    h.fd = fds[0];
    h.wfd = fds[1];
    assert_int_equal(atap__poller_watch(h.p, fds[0], ATAP__POLL_READ, TAG(11)), 0);
    th = start(unwatch_then_write, &h);
    assert_quiet(h.p, ATAP_MS(100));
    finish(th);
    close_pair(fds);
}

/* More ready fds than one wait may return: each is reported exactly once,
 * over several waits. */
static void test_poller_many_fds_batched(void **state)
{
    enum { N = 40 };
    struct atap_poller *p = *state;
    struct atap_poller_event ev[7];
    int fds[N][2], seen[N] = {0}, total = 0, n;

    for (int i = 0; i < N; i++) {
        make_pipe(fds[i]);
        put_byte(fds[i][1]);
        assert_int_equal(atap__poller_watch(p, fds[i][0], ATAP__POLL_READ, TAG(i)), 0);
    }
    while (total < N) {
        n = atap__poller_wait(p, ev, 7, ATAP_SEC(2));
        assert_true(n > 0 && n <= 7);
        for (int k = 0; k < n; k++) {
            ptrdiff_t i = (char *)ev[k].udata - g_tag;
            assert_true(i >= 0 && i < N);
            assert_int_equal(seen[i]++, 0);
        }
        total += n;
    }
    assert_quiet(p, ATAP_MS(20));
    for (int i = 0; i < N; i++)
        close_pair(fds[i]);
}

static volatile sig_atomic_t g_signals;
static struct atap_poller *volatile g_sig_poller;

static void on_signal(int sig)
{
    (void)sig;
    g_signals++;
    if (g_sig_poller != NULL)
        (void)atap__poller_wake(g_sig_poller);
}

static void *signal_later(void *arg)
{
    struct helper *h = arg;

    for (int i = 0; i < h->rounds; i++) {
        sleep_ms(h->delay_ms);
        CHECK(pthread_kill(h->target, SIGUSR1) == 0);
    }
    return NULL;
}

static void catch_sigusr1(struct sigaction *old)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: the kernel wait sees EINTR */
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, old), 0);
}

/* Signals interrupt the kernel wait; the wait goes on for the time left and
 * neither returns early nor reports EINTR. */
static void test_poller_eintr_resumed(void **state)
{
    struct helper h = {.p = *state, .delay_ms = 15, .rounds = 3, .target = pthread_self()};
    struct atap_poller_event ev[EVMAX];
    struct sigaction old;
    uint64_t t0;
    pthread_t th;

    g_sig_poller = NULL;
    g_signals = 0;
    catch_sigusr1(&old);
    t0 = now_ns();
    th = start(signal_later, &h);
    assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP_MS(100)), 0);
    assert_true(now_ns() - t0 >= ATAP_MS(100));
    finish(th);
    assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
}

/* wake is async-signal-safe: a handler may call it. */
static void test_poller_wake_from_signal_handler(void **state)
{
    struct helper h = {.p = *state, .delay_ms = 20, .rounds = 1, .target = pthread_self()};
    struct atap_poller_event ev[EVMAX];
    struct sigaction old;
    uint64_t t0;
    pthread_t th;

    g_sig_poller = h.p;
    g_signals = 0;
    catch_sigusr1(&old);
    t0 = now_ns();
    th = start(signal_later, &h);
    assert_int_equal(atap__poller_wait(h.p, ev, EVMAX, ATAP_SEC(5)), 0);
    assert_true(now_ns() - t0 < ATAP_SEC(2));
    finish(th);
    assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
    g_sig_poller = NULL;
    assert_true(g_signals >= 1);
}

static void test_poller_fds_cloexec(void **state)
{
    struct atap_poller *p = *state;
    int fds[8], n = atap__poller_fds(p, fds, 8);

    assert_true(n >= 1 && n <= 8);
    for (int i = 0; i < n; i++) {
        int flags = fcntl(fds[i], F_GETFD);
        assert_true(flags >= 0);
        assert_true(flags & FD_CLOEXEC);
    }
    assert_int_equal(atap__poller_fds(p, fds, 0), 0);
    assert_int_equal(atap__poller_fds(NULL, fds, 8), -EINVAL);
    assert_int_equal(atap__poller_fds(p, NULL, 8), -EINVAL);
}

static void test_poller_bad_input(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event ev[EVMAX];
    int fds[2], own[8], closed, n;

    make_pipe(fds);
    assert_int_equal(atap__poller_open(NULL), -EINVAL);
    atap__poller_close(NULL);
    assert_int_equal(atap__poller_watch(NULL, fds[0], ATAP__POLL_READ, NULL), -EINVAL);
    assert_int_equal(atap__poller_watch(p, -1, ATAP__POLL_READ, NULL), -EBADF);
    assert_int_equal(atap__poller_watch(p, fds[0], 0, NULL), -EINVAL);
    assert_int_equal(atap__poller_watch(p, fds[0], ATAP__POLL_HUP, NULL), -EINVAL);
    assert_int_equal(atap__poller_watch(p, fds[0], 0x100u, NULL), -EINVAL);
    assert_int_equal(atap__poller_unwatch(NULL, fds[0]), -EINVAL);
    assert_int_equal(atap__poller_unwatch(p, -1), -EBADF);
    assert_int_equal(atap__poller_wait(NULL, ev, EVMAX, 0), -EINVAL);
    assert_int_equal(atap__poller_wait(p, NULL, EVMAX, 0), -EINVAL);
    assert_int_equal(atap__poller_wait(p, ev, 0, 0), -EINVAL);
    assert_int_equal(atap__poller_wait(p, ev, -1, 0), -EINVAL);
    assert_int_equal(atap__poller_wake(NULL), -EINVAL);

    /* a closed fd */
    closed = dup(fds[0]);
    assert_true(closed >= 0);
    close(closed);
    assert_int_equal(atap__poller_watch(p, closed, ATAP__POLL_READ, NULL), -EBADF);
    /* the poller's own fds */
    n = atap__poller_fds(p, own, 8);
    for (int i = 0; i < n; i++)
        assert_int_equal(atap__poller_watch(p, own[i], ATAP__POLL_READ, NULL), -EINVAL);

    /* none of it disturbed the poller */
    assert_quiet(p, ATAP_MS(5));
    assert_int_equal(atap__poller_watch(p, fds[1], ATAP__POLL_WRITE, TAG(12)), 0);
    assert_ptr_equal(wait_one(p).udata, TAG(12));
    close_pair(fds);
}

/* Path watches (kqueue: EVFILT_VNODE): a write to a watched file is
 * reported once, as ATAP__WATCH_PATH with WRITE, independent of the fd's
 * READ / WRITE watch; unwatched, nothing more. A backend without them says
 * -ENOTSUP and reports nothing. */
static void test_poller_path_watch(void **state)
{
    struct atap_poller *p = *state;
    struct atap_poller_event ev[EVMAX];
    char path[] = "/tmp/atap_poller_XXXXXX";
    int fd = mkstemp(path), wfd;

    assert_true(fd >= 0);
    wfd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    assert_true(wfd >= 0);
    if (!(atap__poller_kinds() & 1u << ATAP__WATCH_PATH)) {
        assert_int_equal(atap__poller_watch_path(p, fd, TAG(20)), -ENOTSUP);
        assert_int_equal(atap__poller_unwatch_path(p, fd), -ENOTSUP);
        assert_int_equal(write(wfd, "x", 1), 1);
        assert_quiet(p, ATAP_MS(20));
        print_message("[ paths    ] not a watch of this backend\n");
    } else {
        assert_int_equal(atap__poller_watch_path(p, -1, TAG(20)), -EBADF);
        assert_int_equal(atap__poller_unwatch_path(p, fd), 0); /* none yet: fine */
        assert_int_equal(atap__poller_watch_path(p, fd, TAG(20)), 0);
        assert_int_equal(atap__poller_wait(p, ev, EVMAX, 0), 0);
        assert_int_equal(write(wfd, "x", 1), 1);
        assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(2)), 1);
        assert_int_equal(ev[0].kind, ATAP__WATCH_PATH);
        assert_ptr_equal(ev[0].udata, TAG(20));
        assert_true(ev[0].events & ATAP__PATH_WRITE);
        assert_int_equal(write(wfd, "y", 1), 1); /* one-shot: spent */
        assert_quiet(p, ATAP_MS(20));
        assert_int_equal(atap__poller_watch_path(p, fd, TAG(21)), 0);
        assert_int_equal(atap__poller_unwatch_path(p, fd), 0);
        assert_int_equal(write(wfd, "z", 1), 1);
        assert_quiet(p, ATAP_MS(20));
        assert_int_equal(atap__poller_watch_path(p, fd, TAG(22)), 0);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(atap__poller_wait(p, ev, EVMAX, ATAP_SEC(2)), 1);
        assert_true(ev[0].events & ATAP__PATH_GONE);
    }
    unlink(path);
    close(wfd);
    close(fd);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup_poller, teardown_poller)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_poller_name),
        T(test_poller_readable_reports_udata),
        T(test_poller_one_shot),
        T(test_poller_kept_edges),
        T(test_poller_writable),
        T(test_poller_unwatch_stops_reports),
        T(test_poller_rewatch_replaces),
        T(test_poller_both_ways_one_event),
        T(test_poller_timeout_never_early),
        T(test_poller_wake_from_thread),
        T(test_poller_wakes_coalesce),
        T(test_poller_wake_storm_then_quiet),
        T(test_poller_wake_never_lost),
        T(test_poller_hup_reported_once),
        T(test_poller_peer_half_close),
        T(test_poller_err_reported_once),
        T(test_poller_watch_while_waiting),
        T(test_poller_unwatch_while_waiting),
        T(test_poller_many_fds_batched),
        T(test_poller_eintr_resumed),
        T(test_poller_wake_from_signal_handler),
        T(test_poller_fds_cloexec),
        T(test_poller_bad_input),
        T(test_poller_path_watch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Sockets (src/tasks/net.c, net_sock.c): TCP, UDP and Unix operations as tasks, on
 * loopback and in a temp dir. Every error code the header promises, a
 * cancel at each stage (connecting to a listener whose backlog is full, a
 * send to a reader that does not read, a recv from a silent peer),
 * timeouts, delimited reads that lose nothing, 100 MB through a socket
 * pair checked by a hash, and many connections at once, each parked.
 *
 * Exact things are asserted exactly (codes, counts, bytes); lateness only
 * generously (the machine is shared and loaded). A test that cannot set up
 * what it needs here (a kernel that answers a full backlog, too few fds)
 * says so and skips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "test_util.h"

#define SLOW ATAP_SEC(20) /* "it did not hang": generous on a loaded machine */

/* ---- helpers ------------------------------------------------------------- */

/* Spawns the prepared io, joins it (SLOW at most) and releases it. Returns
 * atap_net_join's code. */
static int run_task(atap_net_io *io, atap_net_out *out, const atap_spawn_opts *opts)
{
    atap_task t;
    int rc = atap_net_spawn(&t, io, opts);

    if (rc != 0)
        return rc;
    rc = atap_join_for(t, out, sizeof *out, SLOW);
    assert_int_not_equal(rc, ATAP_ENOTREADY);
    atap_net_release(t, io);
    return rc != 0 ? rc : out->rc;
}

/* A spawned TCP connect nobody listened for: -ECONNREFUSED. An emulated
 * kqueue (test_util.h) reads the refusal out of the socket to put it in
 * its event, and the connect finds none left: -ECONNABORTED there. */
static void assert_refused(int rc)
{
    if (poller_emulated() && rc == -ECONNABORTED)
        print_message("emulated kqueue: it read the refusal itself, -ECONNABORTED\n");
    else
        assert_int_equal(rc, -ECONNREFUSED);
}

static int tcp_connect(const char *name, int *fd)
{
    atap_net_io io;
    atap_net_out out;
    int rc;

    assert_int_equal(atap_net_prep_connect(&io, name), 0);
    if ((rc = run_task(&io, &out, NULL)) == 0)
        *fd = out.fd;
    else
        assert_int_equal(out.fd, -1);
    return rc;
}

static int tcp_accept(int lfd)
{
    atap_net_io io;
    atap_net_out out;

    assert_int_equal(atap_net_prep_accept(&io, lfd, NULL, NULL), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    return out.fd;
}

/* A connected TCP pair on loopback: c the client's end, s the server's. */
static void tcp_pair(int *c, int *s)
{
    int lfd, port;
    char name[64];

    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 16), 0);
    assert_true((port = atap_net_local_port(lfd)) > 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    assert_int_equal(tcp_connect(name, c), 0);
    *s = tcp_accept(lfd);
    close(lfd);
}

static void send_all(int fd, const void *buf, size_t len)
{
    atap_net_io io;
    atap_net_out out;

    assert_int_equal(atap_net_prep_send(&io, fd, buf, len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, (int64_t)len);
}

static void send_to_all(int fd, const void *buf, size_t len, const struct sockaddr_storage *to,
                        socklen_t to_len)
{
    atap_net_io io;
    atap_net_out out;

    assert_int_equal(atap_net_prep_send_to(&io, fd, buf, len, (const struct sockaddr *)to, to_len),
                     0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, (int64_t)len);
}

/* Waits until t is parked (ATAP_WAITING); false if it never got there. */
static bool wait_parked(atap_task t)
{
    uint64_t end = now_ns() + SLOW;

    for (unsigned spins = 0; atap_state_of(t) != ATAP_WAITING; spins++) {
        if (now_ns() > end)
            return false;
        if (spins < 100)
            sched_yield();
        else
            sleep_us(200);
    }
    return true;
}

static int count_fds(void)
{
    DIR *d;
    int n = 0;

    poller_settle();
    d = opendir("/proc/self/fd");

    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211u;
    return h;
}

static char g_dir[64];

static const char *temp_path(const char *leaf)
{
    static char path[128];
    if (!g_dir[0]) {
        strcpy(g_dir, "/tmp/atap_net_XXXXXX");
        assert_non_null(mkdtemp(g_dir));
    }
    snprintf(path, sizeof path, "%s/%s", g_dir, leaf);
    return path;
}

/* ---- TCP ----------------------------------------------------------------- */

static void test_net_tcp_exchange(void **state)
{
    (void)state;
    int lfd, c, s, port;
    char name[64], text[64];
    struct sockaddr_storage peer;
    socklen_t peer_len = sizeof peer;
    atap_net_io io;
    atap_net_out out;
    unsigned char buf[16];

    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
    port = atap_net_local_port(lfd);
    assert_true(port > 0 && port < 65536);
    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    assert_int_equal(tcp_connect(name, &c), 0);

    assert_int_equal(atap_net_prep_accept(&io, lfd, (struct sockaddr *)&peer, &peer_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    s = out.fd;
    assert_true(s >= 0);
    assert_int_equal(peer.ss_family, AF_INET);
    assert_int_equal(peer_len, sizeof(struct sockaddr_in));
    assert_true(atap_net_addr_format((struct sockaddr *)&peer, peer_len, text, sizeof text) > 0);
    assert_int_equal(strncmp(text, "127.0.0.1:", 10), 0);
    /* The peer's port is the client's own. */
    {
        struct sockaddr_in own;
        socklen_t own_len = sizeof own;
        assert_int_equal(getsockname(c, (struct sockaddr *)&own, &own_len), 0);
        assert_int_equal(atoi(text + 10), ntohs(own.sin_port));
    }
    /* Both ends close-on-exec and non-blocking. */
    assert_true(fcntl(c, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(s, F_GETFL) & O_NONBLOCK);
    assert_true(fcntl(s, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(lfd, F_GETFD) & FD_CLOEXEC);

    assert_int_equal(atap_net_set_nodelay(c, true), 0);
    assert_int_equal(atap_net_set_keepalive(c, true, 30), 0);
    assert_int_equal(atap_net_set_keepalive(s, false, 0), 0);

    send_all(c, "hello world", 11);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 11), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 11);
    assert_memory_equal(buf, "hello world", 11);

    /* recv: up to n, what has arrived. */
    send_all(s, "abc", 3);
    assert_int_equal(atap_net_prep_recv(&io, c, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_true(out.n >= 1 && out.n <= 3);
    size_t first = (size_t)out.n;

    /* Half-close: the other side reads end of stream, this side can still
     * receive. */
    assert_int_equal(atap_net_shutdown_write(c), 0);
    assert_int_equal(atap_net_prep_recv(&io, s, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 0);
    send_all(s, "xyz", 3);
    close(s);
    /* recv_exact past the end: ATAP_ECLOSED with the bytes that came. */
    assert_int_equal(atap_net_prep_recv_exact(&io, c, buf, 8), 0);
    assert_int_equal(run_task(&io, &out, NULL), ATAP_ECLOSED);
    assert_int_equal(out.n, (int64_t)(6 - first));
    assert_int_equal(io.done, 6 - first);
    assert_memory_equal(buf + (3 - first), "xyz", 3);
    close(c);
    close(lfd);
}

/* A connect whose error someone else read first (SO_ERROR clears it as
 * it reads; an emulated kqueue reads it to report it): the socket is
 * over, with no error and no peer. The connect ends, -ECONNABORTED, where
 * it would otherwise find the connect "still under way" and park on a
 * socket that is always ready, for ever. */
struct lost_err {
    atap_net_io io;
    char name[64];
    atomic_int resumes;
};

static int lost_err_task(atap_ctx *ctx, void *arg, void *out)
{
    struct lost_err *l = arg;
    atap_net_out r;
    int rc;

    if (atap_resumed(ctx) && l->io.pending >= 0) {
        int err = 0;
        socklen_t len = sizeof err;

        atomic_fetch_add(&l->resumes, 1);
        CHECK(getsockopt(l->io.pending, SOL_SOCKET, SO_ERROR, &err, &len) == 0);
    }
    if ((rc = atap_net_step(ctx, &l->io, &r)) != 0)
        return rc;
    memcpy(out, &r, sizeof r);
    return 0;
}

static void lost_err_free(void *arg) { atap_net_abandon(&((struct lost_err *)arg)->io); }

static void test_net_connect_error_read_elsewhere(void **state)
{
    (void)state;
    static struct lost_err l; /* outlives a failed test's task */
    int lfd;
    atap_task t;
    atap_net_out out;

    memset(&l, 0, sizeof l);
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
    snprintf(l.name, sizeof l.name, "127.0.0.1:%d", atap_net_local_port(lfd));
    close(lfd); /* nobody listens: refused */
    assert_int_equal(atap_net_prep_connect(&l.io, l.name), 0);
    assert_int_equal(atap_spawn(&t, lost_err_task, &l,
                                &(atap_spawn_opts){.out_size = sizeof out,
                                                   .timeout_ns = ATAP_SEC(5) * test_slack(),
                                                   .arg_free = lost_err_free}),
                     0);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    atap_release(t);
    assert_int_equal(out.fd, -1);
    if (atomic_load(&l.resumes) == 0) { /* the kernel refused it at once */
        assert_int_equal(out.rc, -ECONNREFUSED);
        print_message("connect refused at once: no error to read elsewhere\n");
        return;
    }
    assert_int_equal(out.rc, -ECONNABORTED);
    assert_no_failures();
}

static void test_net_tcp_errors(void **state)
{
    (void)state;
    int lfd, lfd2, port, c;
    char name[64];
    atap_net_io io;
    atap_net_out out;

    /* A port nobody listens on: refused. */
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
    port = atap_net_local_port(lfd);
    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    /* Taken: EADDRINUSE. */
    assert_int_equal(atap_net_listen(&lfd2, name, 0), -EADDRINUSE);
    close(lfd);
    assert_refused(tcp_connect(name, &c));
    /* The same on the calling thread. */
    assert_int_equal(atap_net_prep_connect(&io, name), 0);
    assert_int_equal(atap_net_run(&io, &out), -ECONNREFUSED);
    assert_int_equal(out.rc, -ECONNREFUSED);
    assert_int_equal(out.fd, -1);

    /* An unknown name: -ENXIO (looked up on a blocking thread). */
    {
        int rc = tcp_connect("no-such-host.invalid:80", &c);
        if (rc == -EAGAIN)
            print_message("no resolver here: the lookup failed for now (-EAGAIN)\n");
        else
            assert_int_equal(rc, -ENXIO);
    }
    /* A name that is looked up: localhost. */
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
    snprintf(name, sizeof name, "localhost:%d", atap_net_local_port(lfd));
    {
        int rc = tcp_connect(name, &c);
        if (rc == 0) {
            close(c);
            close(tcp_accept(lfd));
        } else { /* localhost may resolve to ::1 first and only */
            assert_refused(rc);
        }
    }
    close(lfd);
    /* A port that is no number or service: ATAP_EINVAL. */
    assert_int_equal(tcp_connect("127.0.0.1:no-such-service-x", &c), ATAP_EINVAL);
    /* Malformed names. */
    assert_int_equal(atap_net_prep_connect(&io, "127.0.0.1"), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect(&io, "[::1"), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect(&io, NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_listen(&lfd, "localhost:0", 0), ATAP_EINVAL);
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:70000", 0), ATAP_EINVAL);
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:", 0), ATAP_EINVAL);
    /* IPv6 loopback, where there is one. */
    if (atap_net_listen(&lfd, "[::1]:0", 0) == 0) {
        char text[64];
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        snprintf(name, sizeof name, "[::1]:%d", atap_net_local_port(lfd));
        assert_int_equal(tcp_connect(name, &c), 0);
        assert_int_equal(getsockname(lfd, (struct sockaddr *)&ss, &len), 0);
        atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text);
        assert_string_equal(text, name);
        close(c);
        close(tcp_accept(lfd));
        close(lfd);
    }
    /* Bad spawns: nothing runs. */
    {
        atap_task t;
        atap_net_io blank = {0};
        assert_int_equal(atap_net_spawn(&t, &blank, NULL), ATAP_EINVAL);
        assert_int_equal(atap_net_spawn(&t, NULL, NULL), ATAP_EINVAL);
        assert_int_equal(atap_net_prep_recv(&io, 0, NULL, 4), ATAP_EINVAL);
        assert_int_equal(atap_net_prep_recv(&io, 0, &c, sizeof c), 0);
        assert_int_equal(atap_net_spawn(&t, &io, &(atap_spawn_opts){.out_size = 4}), ATAP_EINVAL);
        assert_int_equal(atap_net_spawn(&t, &io, &(atap_spawn_opts){.arg_free = free}),
                         ATAP_EINVAL);
        assert_int_equal(atap_net_spawn(&t, &io, &(atap_spawn_opts){.kind = ATAP_REPEAT}),
                         ATAP_EINVAL);
        assert_int_equal(t.id, 0);
        assert_int_equal(atap_net_run(&blank, NULL), ATAP_EINVAL);
    }
}

/* ---- delimited reads ----------------------------------------------------- */

static void test_net_recv_until_keeps_what_it_read(void **state)
{
    (void)state;
    int fds[2];
    unsigned char store[32];
    atap_net_reader r;
    atap_net_io io;
    atap_net_out out;
    size_t len;
    const char *p;

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_reader_init(&r, fds[1], store, sizeof store), 0);
    /* Two lines in one write, the second split over two. */
    send_all(fds[0], "GET /\r\n\r\nGET /x", 15);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\r\n\r\n", 4, 32), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 9);
    p = atap_net_reader_data(&r, &len);
    assert_int_equal(len, 15);
    assert_memory_equal(p, "GET /\r\n\r\n", 9);
    atap_net_reader_consume(&r, (size_t)out.n);
    {
        atap_task t;
        assert_int_equal(atap_net_prep_recv_until(&io, &r, "\r\n\r\n", 4, 32), 0);
        assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
        assert_true(wait_parked(t));
        send_all(fds[0], "\r\n", 2);
        sleep_ms(5);
        send_all(fds[0], "\r\n", 2);
        assert_int_equal(atap_net_join(t, &out), 0);
        atap_net_release(t, &io);
    }
    assert_int_equal(out.n, 10);
    p = atap_net_reader_data(&r, &len);
    assert_int_equal(len, 10);
    assert_memory_equal(p, "GET /x\r\n\r\n", 10);
    atap_net_reader_consume(&r, 10);

    /* No delimiter within the limit: ATAP_ETOOLONG, and all of it kept. */
    send_all(fds[0], "0123456789abcdefXYZ", 19);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 16), 0);
    assert_int_equal(run_task(&io, &out, NULL), ATAP_ETOOLONG);
    p = atap_net_reader_data(&r, &len);
    assert_true(len >= 16);
    assert_memory_equal(p, "0123456789abcdef", 16);
    /* A larger limit finds the line once it comes. */
    send_all(fds[0], "\nrest", 5);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 32), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 20);
    atap_net_reader_consume(&r, 20);

    /* The peer closes first: ATAP_ECLOSED, what came stays. */
    close(fds[0]);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 32), 0);
    assert_int_equal(run_task(&io, &out, NULL), ATAP_ECLOSED);
    p = atap_net_reader_data(&r, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(p, "rest", 4);

    /* Bad limits. */
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 33), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "\r\n", 2, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recv_until(&io, &r, "", 0, 8), ATAP_EINVAL);
    close(fds[1]);
}

/* Filler that starts the delimiter "\r\n\r\n" again and again and never
 * ends it: every search meets its first byte, and its first three. Its
 * last byte is no part of the delimiter, so one put after it is the
 * first whole one. */
static void near_misses(char *buf, size_t n)
{
    static const char pat[] = "ab\r\n\rc";

    for (size_t i = 0; i < n; i++)
        buf[i] = pat[i % (sizeof pat - 1)];
    if (n > 0)
        buf[n - 1] = 'z';
}

/* One recv_until of "\r\n\r\n" within limit on r; found, it must end
 * want bytes in, and is consumed. Returns the task's result. */
static int find_blank_line(atap_net_reader *r, size_t limit, size_t want)
{
    atap_net_io io;
    atap_net_out out;
    int rc;

    assert_int_equal(atap_net_prep_recv_until(&io, r, "\r\n\r\n", 4, limit), 0);
    rc = run_task(&io, &out, NULL);
    if (rc == 0) {
        assert_int_equal(out.n, want);
        atap_net_reader_consume(r, want);
    }
    return rc;
}

/* The delimiter is found wherever it lies among near misses: in a short
 * buffer and a long one (the search differs, net.c's SHORT_SEARCH), ending
 * right at the limit (one byte short of it: too long), and split over two
 * reads, the search going on from where it stopped. */
static void test_net_recv_until_finds_every_delimiter(void **state)
{
    (void)state;
    static const size_t at[] = {0, 1, 5, 100, 507, 508, 509, 511, 512, 600, 1500, 2044};
    static unsigned char store[2048];
    static char msg[2048];
    int fds[2];
    atap_net_reader r;
    atap_net_io io;
    atap_net_out out;
    size_t len;

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_reader_init(&r, fds[1], store, sizeof store), 0);
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        size_t k = at[i];

        near_misses(msg, k);
        memcpy(msg + k, "\r\n\r\n", 4);
        /* All in one piece. */
        send_all(fds[0], msg, k + 4);
        assert_int_equal(find_blank_line(&r, sizeof store, k + 4), 0);
        /* Ending right at the limit, then with the limit a byte short. */
        send_all(fds[0], msg, k + 4);
        assert_int_equal(find_blank_line(&r, k + 4, k + 4), 0);
        if (k > 0) {
            send_all(fds[0], msg, k + 4);
            assert_int_equal(find_blank_line(&r, k + 3, k + 4), ATAP_ETOOLONG);
            assert_int_equal(find_blank_line(&r, sizeof store, k + 4), 0);
        }
        /* Split inside the delimiter: the first part is searched, then the
         * search goes on over the rest as it comes. */
        {
            atap_task t;
            size_t first = k + 2;

            send_all(fds[0], msg, first);
            assert_int_equal(atap_net_prep_recv_until(&io, &r, "\r\n\r\n", 4, sizeof store), 0);
            assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
            assert_true(wait_parked(t));
            send_all(fds[0], msg + first, 2);
            assert_int_equal(atap_net_join(t, &out), 0);
            atap_net_release(t, &io);
        }
        assert_int_equal(out.n, k + 4);
        assert_memory_equal(atap_net_reader_data(&r, &len), msg, k + 4);
        assert_int_equal(len, k + 4);
        atap_net_reader_consume(&r, k + 4);
    }
    close(fds[0]);
    close(fds[1]);
}

/* A recv that came back short leaves the reader waiting for readability
 * before its next recv: bytes already there by then (the next request of a
 * client that did not wait for the answer) resume it at once, and bytes
 * that come later wake it. */
static void test_net_recv_until_after_a_short_read(void **state)
{
    (void)state;
    int fds[2];
    unsigned char store[64];
    atap_net_reader r;
    atap_net_io io;
    atap_net_out out;
    uint64_t t0;

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_reader_init(&r, fds[1], store, sizeof store), 0);
    for (int round = 0; round < 3; round++) {
        send_all(fds[0], "one\n", 4);
        assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 64), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(out.n, 4);
        atap_net_reader_consume(&r, 4);
        /* Short read above; the next line is there before the next read. */
        send_all(fds[0], "two\n", 4);
        t0 = atap_now();
        assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 64), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(out.n, 4);
        assert_memory_equal(atap_net_reader_data(&r, NULL), "two\n", 4);
        atap_net_reader_consume(&r, 4);
        assert_true(atap_now() - t0 < 5000000000ull); /* no hang; generous for a loaded machine */
        /* And a line that comes only while the read waits. */
        {
            atap_task t;
            assert_int_equal(atap_net_prep_recv_until(&io, &r, "\n", 1, 64), 0);
            assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
            assert_true(wait_parked(t));
            send_all(fds[0], "three\n", 6);
            assert_int_equal(atap_net_join(t, &out), 0);
            atap_net_release(t, &io);
        }
        assert_int_equal(out.n, 6);
        atap_net_reader_consume(&r, 6);
    }
    close(fds[0]);
    close(fds[1]);
}

/* ---- cancels and timeouts ------------------------------------------------ */

/* A listener whose backlog is full, and a connect to it that hangs (the
 * kernel drops its SYN); false if this kernel answers it anyway. The
 * connected clients go to held[] (*n_held). */
static bool hanging_connect(int *lfd, atap_task *t, atap_net_io *io, int *held, int *n_held,
                            const atap_spawn_opts *opts)
{
    char name[64];

    assert_int_equal(atap_net_listen(lfd, "127.0.0.1:0", 1), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(*lfd));
    *n_held = 0;
    for (int i = 0; i < 16; i++) {
        atap_net_out out;
        int rc;
        assert_int_equal(atap_net_prep_connect(io, name), 0);
        assert_int_equal(atap_net_spawn(t, io, opts), 0);
        rc = atap_join_for(*t, &out, sizeof out, ATAP_MS(300));
        if (rc == ATAP_ENOTREADY || rc == ATAP_ETIMEDOUT)
            return true; /* still connecting (or timed out trying): caller's */
        assert_int_equal(rc, 0);
        assert_int_equal(out.rc, 0);
        held[(*n_held)++] = out.fd;
        atap_net_release(*t, io);
    }
    return false;
}

static void test_net_cancel_connect(void **state)
{
    (void)state;
    int lfd, held[16], n_held, fds_before = count_fds();
    atap_task t;
    atap_net_io io;
    atap_net_out out;
    uint64_t t0;

    if (!hanging_connect(&lfd, &t, &io, held, &n_held, NULL)) {
        for (int i = 0; i < n_held; i++)
            close(held[i]);
        close(lfd);
        skip(); /* no way here to make a connect hang */
    }
    assert_true(wait_parked(t));
    t0 = now_ns();
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
    assert_true(now_ns() - t0 < SLOW);
    atap_net_release(t, &io);
    assert_true(wait_live_back(SLOW));
    /* The socket that was connecting is closed. */
    for (int i = 0; i < n_held; i++)
        close(held[i]);
    close(lfd);
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before);

    /* A connect timeout: ATAP_ETIMEDOUT, no earlier than asked. */
    fds_before = count_fds();
    if (hanging_connect(&lfd, &t, &io, held, &n_held,
                        &(atap_spawn_opts){.timeout_ns = ATAP_MS(400)})) {
        t0 = now_ns();
        assert_int_equal(atap_net_join(t, &out), ATAP_ETIMEDOUT);
        atap_net_release(t, &io);
        assert_true(wait_live_back(SLOW));
    }
    for (int i = 0; i < n_held; i++)
        close(held[i]);
    close(lfd);
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before);
}

static void test_net_cancel_mid_send(void **state)
{
    (void)state;
    enum { LEN = 64 << 20 };
    int fds[2];
    unsigned char *buf = malloc(LEN), chunk[65536];
    atap_task t;
    atap_net_io io;
    atap_net_out out;
    size_t got = 0;
    uint64_t h_sent, h_got = 1469598103934665603u;

    assert_non_null(buf);
    for (size_t i = 0; i < LEN; i++)
        buf[i] = (unsigned char)(i * 7 + (i >> 16));
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_prep_send(&io, fds[0], buf, LEN), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t)); /* the reader does not read: it parks */
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
    atap_net_release(t, &io);
    assert_true(io.done > 0 && io.done < LEN);
    /* Exactly io.done bytes went, and they are the buffer's first. */
    h_sent = fnv1a(1469598103934665603u, buf, io.done);
    close(fds[0]);
    for (;;) {
        ssize_t n = read(fds[1], chunk, sizeof chunk);
        if (n == 0)
            break;
        /* Drained before the end shows: a poll(2) in progress on another
         * thread (the poll backend's) held fds[0] open a moment longer. */
        if (n < 0 && errno == EAGAIN) {
            assert_int_equal(poll(&(struct pollfd){.fd = fds[1], .events = POLLIN}, 1, 10000), 1);
            continue;
        }
        assert_true(n > 0);
        h_got = fnv1a(h_got, chunk, (size_t)n);
        got += (size_t)n;
    }
    assert_int_equal(got, io.done);
    assert_true(h_got == h_sent);
    close(fds[1]);
    free(buf);
}

static void test_net_cancel_and_timeout_mid_recv(void **state)
{
    (void)state;
    int c, s;
    unsigned char buf[8];
    atap_task t;
    atap_net_io io;
    atap_net_out out;
    uint64_t t0;

    tcp_pair(&c, &s);
    /* A silent peer: the recv parks, the cancel comes down at once. */
    assert_int_equal(atap_net_prep_recv(&io, s, buf, sizeof buf), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t));
    t0 = now_ns();
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
    assert_true(now_ns() - t0 < SLOW);
    atap_net_release(t, &io);

    /* recv_exact with half its bytes, then a timeout. */
    send_all(c, "abcd", 4);
    t0 = now_ns();
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 8), 0);
    assert_int_equal(run_task(&io, &out, &(atap_spawn_opts){.timeout_ns = ATAP_MS(100)}),
                     ATAP_ETIMEDOUT);
    assert_true(now_ns() - t0 >= ATAP_MS(100));
    assert_int_equal(io.done, 4);
    assert_memory_equal(buf, "abcd", 4);

    /* Accept with nobody connecting: a timeout. */
    {
        int lfd;
        assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
        assert_int_equal(atap_net_prep_accept(&io, lfd, NULL, NULL), 0);
        assert_int_equal(run_task(&io, &out, &(atap_spawn_opts){.timeout_ns = ATAP_MS(50)}),
                         ATAP_ETIMEDOUT);
        close(lfd);
    }
    /* The connection still works after all that. */
    send_all(c, "efgh", 4);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 4), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "efgh", 4);
    /* A peer gone: a send fails with -EPIPE or -ECONNRESET, no SIGPIPE. */
    close(c);
    {
        static unsigned char big[1 << 20];
        int rc;
        assert_int_equal(atap_net_prep_send(&io, s, big, sizeof big), 0);
        rc = run_task(&io, &out, NULL);
        assert_true(rc == -EPIPE || rc == -ECONNRESET);
        assert_int_equal(out.n, (int64_t)io.done);
    }
    close(s);
    assert_true(wait_live_back(SLOW));
}

/* ---- bulk and many ------------------------------------------------------- */

static void test_net_pair_100mb_hash(void **state)
{
    (void)state;
    size_t len = env_size("ATAP_NET_BULK_MB", 100) << 20;
    unsigned char *src = malloc(len), *buf = malloc(65536);
    uint64_t h_src, h_got = 1469598103934665603u, x = 88172645463325252u;
    int fds[2];
    atap_task sender;
    atap_net_io send_io, io;
    atap_net_out out;
    size_t got = 0;

    assert_non_null(src);
    assert_non_null(buf);
    for (size_t i = 0; i + 8 <= len; i += 8) { /* xorshift */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(src + i, &x, 8);
    }
    h_src = fnv1a(1469598103934665603u, src, len);
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_prep_send(&send_io, fds[0], src, len), 0);
    assert_int_equal(atap_net_spawn(&sender, &send_io, NULL), 0);
    /* One io and one buffer for every receive. */
    while (got < len) {
        assert_int_equal(atap_net_prep_recv(&io, fds[1], buf, 65536), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_true(out.n > 0);
        h_got = fnv1a(h_got, buf, (size_t)out.n);
        got += (size_t)out.n;
    }
    assert_int_equal(atap_net_join(sender, &out), 0);
    assert_int_equal(out.n, (int64_t)len);
    atap_net_release(sender, &send_io);
    assert_int_equal(got, len);
    assert_true(h_got == h_src);
    close(fds[0]);
    close(fds[1]);
    free(src);
    free(buf);
}

struct conn {
    int c, s;
    atap_net_io cio, sio;
    atap_task ct, st;
    unsigned char cbuf[8], sbuf[8];
};

/* n connections at once: n connects, n accepts, n parked recvs (one a
 * connection), then each client sends 8 bytes, each server end echoes
 * them, each client reads them back. */
static void many_connections(int n)
{
    struct conn *k = calloc((size_t)n, sizeof *k);
    unsigned char *seen = calloc((size_t)n, 1);
    int lfd, port;
    char name[64];
    atap_net_out out;
    uint64_t t0 = now_ns();

    assert_non_null(k);
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 4096), 0);
    port = atap_net_local_port(lfd);
    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    for (int i = 0; i < n; i += 256) { /* in waves the backlog holds */
        int m = n - i < 256 ? n - i : 256;
        for (int j = i; j < i + m; j++) {
            assert_int_equal(atap_net_prep_connect(&k[j].cio, name), 0);
            assert_int_equal(atap_net_spawn(&k[j].ct, &k[j].cio, NULL), 0);
        }
        for (int j = i; j < i + m; j++) {
            assert_int_equal(atap_net_prep_accept(&k[j].sio, lfd, NULL, NULL), 0);
            assert_int_equal(run_task(&k[j].sio, &out, NULL), 0);
            k[j].s = out.fd;
        }
        for (int j = i; j < i + m; j++) {
            assert_int_equal(atap_net_join(k[j].ct, &out), 0);
            atap_net_release(k[j].ct, &k[j].cio);
            k[j].c = out.fd;
        }
    }
    /* Every server end parks in a recv. */
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_net_prep_recv_exact(&k[i].sio, k[i].s, k[i].sbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].st, &k[i].sio, NULL), 0);
    }
    for (int i = 0; i < n; i++)
        assert_true(wait_parked(k[i].st));
    for (int i = 0; i < n; i++) {
        memcpy(k[i].cbuf, &i, sizeof i);
        memcpy(k[i].cbuf + 4, "ping", 4);
        assert_int_equal(atap_net_prep_send(&k[i].cio, k[i].c, k[i].cbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].ct, &k[i].cio, NULL), 0);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_net_join(k[i].ct, &out), 0);
        atap_net_release(k[i].ct, &k[i].cio);
        assert_int_equal(atap_net_join(k[i].st, &out), 0);
        atap_net_release(k[i].st, &k[i].sio);
        /* Accepts come in any order: each client's number once, somewhere. */
        int v;
        memcpy(&v, k[i].sbuf, sizeof v);
        assert_true(v >= 0 && v < n);
        assert_memory_equal(k[i].sbuf + 4, "ping", 4);
        assert_int_equal(seen[v]++, 0);
        assert_int_equal(atap_net_prep_send(&k[i].sio, k[i].s, k[i].sbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].st, &k[i].sio, NULL), 0);
        memset(k[i].cbuf, 0, 8);
        assert_int_equal(atap_net_prep_recv_exact(&k[i].cio, k[i].c, k[i].cbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].ct, &k[i].cio, NULL), 0);
    }
    for (int i = 0; i < n; i++) {
        int v;
        assert_int_equal(atap_net_join(k[i].st, &out), 0);
        assert_int_equal(atap_net_join(k[i].ct, &out), 0);
        atap_net_release(k[i].st, &k[i].sio);
        atap_net_release(k[i].ct, &k[i].cio);
        memcpy(&v, k[i].cbuf, sizeof v);
        assert_int_equal(v, i); /* its own number back: the echo came on its connection */
        close(k[i].c);
        close(k[i].s);
    }
    close(lfd);
    free(k);
    free(seen);
    print_message("%d connections: %.2f s\n", n, (double)(now_ns() - t0) / 1e9);
    assert_true(wait_live_back(SLOW));
}

/* The clients of the forked test: plain blocking system calls only (the
 * child of a threaded process), on fds preallocated by the parent. Each
 * connects, waits for the parent's go (a byte on go_fd), sends its number
 * and "ping", and reads the same 8 bytes back. Exits 0 when all did. */
static void child_clients(const struct sockaddr_in *addr, int n, int go_fd, int *fds)
{
    char go;

    for (int i = 0; i < n; i++) {
        if ((fds[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
            connect(fds[i], (const struct sockaddr *)addr, sizeof *addr) != 0)
            _exit(2);
    }
    if (read(go_fd, &go, 1) != 1)
        _exit(3);
    for (int i = 0; i < n; i++) {
        unsigned char b[8];
        memcpy(b, &i, 4);
        memcpy(b + 4, "ping", 4);
        if (write(fds[i], b, 8) != 8)
            _exit(4);
    }
    for (int i = 0; i < n; i++) {
        unsigned char b[8];
        int v;
        for (size_t got = 0; got < 8;) {
            ssize_t r = read(fds[i], b + got, 8 - got);
            if (r <= 0)
                _exit(5);
            got += (size_t)r;
        }
        memcpy(&v, b, 4);
        if (v != i || memcmp(b + 4, "ping", 4) != 0)
            _exit(6);
    }
    _exit(0);
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1, rss = -1;

    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* n connections whose clients are a child process, so that this process
 * holds one fd a connection: each server end a recv parked at once. */
static void many_connections_forked(int n)
{
    struct conn *k = calloc((size_t)n, sizeof *k);
    int *child_fds = calloc((size_t)n, sizeof(int));
    unsigned char *seen = calloc((size_t)n, 1);
    int lfd, go[2], status;
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    atap_net_out out;
    pid_t pid;
    long rss0, rss1;
    uint64_t t0 = now_ns();

    assert_non_null(k);
    assert_non_null(child_fds);
    assert_non_null(seen);
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 4096), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&addr, &alen), 0);
    assert_int_equal(pipe(go), 0);
    if ((pid = fork()) == 0) {
        close(go[1]);
        child_clients(&addr, n, go[0], child_fds);
    }
    assert_true(pid > 0);
    close(go[0]);
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_net_prep_accept(&k[i].sio, lfd, NULL, NULL), 0);
        assert_int_equal(run_task(&k[i].sio, &out, NULL), 0);
        k[i].s = out.fd;
    }
    rss0 = rss_kb();
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_net_prep_recv_exact(&k[i].sio, k[i].s, k[i].sbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].st, &k[i].sio, NULL), 0);
    }
    for (int i = 0; i < n; i++)
        assert_true(wait_parked(k[i].st));
    rss1 = rss_kb();
    if (rss0 > 0 && rss1 > 0)
        print_message("%d parked recvs: %ld KB more resident, %ld bytes each "
                      "(the io, %zu bytes, is the caller's and counted apart)\n",
                      n, rss1 - rss0, (rss1 - rss0) * 1024 / n, sizeof(atap_net_io));
    assert_int_equal(write(go[1], "g", 1), 1);
    for (int i = 0; i < n; i++) {
        int v;
        assert_int_equal(atap_net_join(k[i].st, &out), 0);
        atap_net_release(k[i].st, &k[i].sio);
        memcpy(&v, k[i].sbuf, sizeof v);
        assert_true(v >= 0 && v < n);
        assert_int_equal(seen[v]++, 0);
        assert_int_equal(atap_net_prep_send(&k[i].sio, k[i].s, k[i].sbuf, 8), 0);
        assert_int_equal(atap_net_spawn(&k[i].st, &k[i].sio, NULL), 0);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(atap_net_join(k[i].st, &out), 0);
        atap_net_release(k[i].st, &k[i].sio);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    for (int i = 0; i < n; i++)
        close(k[i].s);
    close(go[1]);
    close(lfd);
    free(k);
    free(child_fds);
    free(seen);
    print_message("%d connections (clients in a child): %.2f s\n", n,
                  (double)(now_ns() - t0) / 1e9);
    assert_true(wait_live_back(SLOW));
}

static void test_net_many_connections(void **state)
{
    (void)state;
    struct rlimit rl;
    int want = (int)env_size("ATAP_NET_CONNS", 10000);
    rlim_t need = (rlim_t)want + 256;

    many_connections((int)scaled(1000, 1));
    /* 10,000 at once, one fd each in this process (the clients are a
     * child's): raise the soft limit as far as the hard one allows. */
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < need && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need)) {
        rl.rlim_cur = need;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < need) {
        print_message("%d connections skipped: RLIMIT_NOFILE %llu (hard %llu) is below %llu\n",
                      want, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                      (unsigned long long)need);
        return;
    }
    many_connections_forked(want);
}

/* ---- UDP ----------------------------------------------------------------- */

static void test_net_udp(void **state)
{
    (void)state;
    int a, b;
    char name[64], text[64];
    struct sockaddr_storage to, from;
    socklen_t to_len, from_len = sizeof from;
    unsigned char buf[16];
    atap_net_io io;
    atap_net_out out;
    atap_task t;

    assert_int_equal(atap_net_udp_bind(&a, "127.0.0.1:0"), 0);
    assert_int_equal(atap_net_udp_bind(&b, "127.0.0.1:0"), 0);
    assert_true(fcntl(a, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(a, F_GETFL) & O_NONBLOCK);
    /* recv_from parks until a datagram comes. */
    assert_int_equal(
        atap_net_prep_recv_from(&io, b, buf, sizeof buf, (struct sockaddr *)&from, &from_len), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t));
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(b));
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&to, &to_len, name), 0);
    {
        atap_net_io sio;
        assert_int_equal(
            atap_net_prep_send_to(&sio, a, "datagram", 8, (struct sockaddr *)&to, to_len), 0);
        assert_int_equal(run_task(&sio, &out, NULL), 0);
        assert_int_equal(out.n, 8);
    }
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &io);
    assert_int_equal(out.n, 8);
    assert_memory_equal(buf, "datagram", 8);
    atap_net_addr_format((struct sockaddr *)&from, from_len, text, sizeof text);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(a));
    assert_string_equal(text, name);

    /* Connected: send / recv without addresses. */
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(b));
    assert_int_equal(atap_net_dgram_connect(a, name), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(a));
    assert_int_equal(atap_net_dgram_connect(b, name), 0);
    send_all(a, "one", 3);
    send_all(a, "two!", 4);
    assert_int_equal(atap_net_prep_recv(&io, b, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 3); /* one datagram at a time */
    assert_int_equal(atap_net_prep_recv(&io, b, buf, 2), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 2); /* cut to the room */
    assert_memory_equal(buf, "tw", 2);

    /* A parked recv_from, cancelled. */
    assert_int_equal(atap_net_prep_recv_from(&io, b, buf, sizeof buf, NULL, NULL), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t));
    atap_cancel(t);
    assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
    atap_net_release(t, &io);
    close(a);
    close(b);
}

/* ---- socket options ------------------------------------------------------ */

static int get_int_opt(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof v;

    assert_int_equal(getsockopt(fd, level, name, &v, &len), 0);
    return v;
}

/* Which of two listeners has a connection waiting: 0 or 1. */
static int which_ready(int a, int b)
{
    struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};

    assert_int_equal(poll(p, 2, 20000), 1);
    return (p[1].revents & POLLIN) ? 1 : 0;
}

static void test_net_socket_options(void **state)
{
    (void)state;
    const atap_net_opts rp = {.flags = ATAP_NET_REUSEPORT};
    int a, b, c, s, u, dflt, fds_before = count_fds();
    char name[64];
    unsigned char buf[8];
    struct sockaddr_storage to;
    socklen_t to_len;
    atap_net_io io;
    atap_net_out out;

    /* Two TCP listeners on one port, both with SO_REUSEPORT; without it on
     * the second, its bind is refused. Each connection goes to one. */
    assert_int_equal(atap_net_listen_opts(&a, "127.0.0.1:0", 0, &rp), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(a));
    assert_int_equal(atap_net_listen(&b, name, 0), -EADDRINUSE);
    assert_int_equal(atap_net_listen_opts(&b, name, 0, NULL), -EADDRINUSE);
    assert_int_equal(atap_net_listen_opts(&b, name, 0, &rp), 0);
    assert_int_equal(get_int_opt(a, SOL_SOCKET, SO_REUSEPORT), 1);
    assert_int_equal(get_int_opt(a, SOL_SOCKET, SO_REUSEADDR), 1); /* a listener's anyway */
    assert_int_equal(tcp_connect(name, &c), 0);
    s = tcp_accept(which_ready(a, b) ? b : a);
    send_all(c, "rp", 2);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 2), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "rp", 2);
    /* Buffer sizes on an accepted socket of the caller's. */
    dflt = get_int_opt(s, SOL_SOCKET, SO_SNDBUF);
    assert_int_equal(atap_net_set_opts(s, &(atap_net_opts){.send_buffer = 4096}), 0);
    assert_true(get_int_opt(s, SOL_SOCKET, SO_SNDBUF) >= 4096);
    assert_true(get_int_opt(s, SOL_SOCKET, SO_SNDBUF) < dflt);
    close(c);
    close(s);
    close(a);
    close(b);

    /* UDP: every option, read back from the socket. */
    assert_int_equal(atap_net_udp_bind(&u, "127.0.0.1:0"), 0);
    dflt = get_int_opt(u, SOL_SOCKET, SO_RCVBUF);
    assert_int_equal(get_int_opt(u, SOL_SOCKET, SO_REUSEADDR), 0);
    assert_int_equal(get_int_opt(u, SOL_SOCKET, SO_BROADCAST), 0);
    close(u);
    assert_int_equal(
        atap_net_udp_bind_opts(&u, "127.0.0.1:0",
                               &(atap_net_opts){
                                   .flags = ATAP_NET_REUSEADDR | ATAP_NET_REUSEPORT |
                                            ATAP_NET_BROADCAST | ATAP_NET_MULTICAST_NO_LOOP,
                                   .send_buffer = 65536,
                                   .recv_buffer = 8192,
                                   .multicast_ttl = 7,
                               }),
        0);
    assert_int_equal(get_int_opt(u, SOL_SOCKET, SO_REUSEADDR), 1);
    assert_int_equal(get_int_opt(u, SOL_SOCKET, SO_REUSEPORT), 1);
    assert_int_equal(get_int_opt(u, SOL_SOCKET, SO_BROADCAST), 1);
    assert_true(get_int_opt(u, SOL_SOCKET, SO_SNDBUF) >= 65536);
    assert_true(get_int_opt(u, SOL_SOCKET, SO_RCVBUF) >= 8192);
    assert_true(get_int_opt(u, SOL_SOCKET, SO_RCVBUF) < dflt);
    assert_int_equal(get_int_opt(u, IPPROTO_IP, IP_MULTICAST_TTL), 7);
    assert_int_equal(get_int_opt(u, IPPROTO_IP, IP_MULTICAST_LOOP), 0);
    /* A second UDP socket on the port, with SO_REUSEPORT too. */
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(u));
    assert_int_equal(atap_net_udp_bind(&b, name), -EADDRINUSE);
    assert_int_equal(atap_net_udp_bind_opts(&b, name, &rp), 0);
    close(b);
    close(u);

    /* Broadcast: refused without SO_BROADCAST, sent and received with it. */
    assert_int_equal(atap_net_udp_bind(&b, "0.0.0.0:0"), 0);
    snprintf(name, sizeof name, "127.255.255.255:%d", atap_net_local_port(b));
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&to, &to_len, name), 0);
    assert_int_equal(atap_net_udp_bind(&u, "127.0.0.1:0"), 0);
    assert_int_equal(atap_net_prep_send_to(&io, u, "bc", 2, (struct sockaddr *)&to, to_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), -EACCES);
    assert_int_equal(atap_net_set_opts(u, &(atap_net_opts){.flags = ATAP_NET_BROADCAST}), 0);
    assert_int_equal(atap_net_prep_send_to(&io, u, "bc", 2, (struct sockaddr *)&to, to_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(atap_net_prep_recv(&io, b, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, &(atap_spawn_opts){.timeout_ns = SLOW}), 0);
    assert_int_equal(out.n, 2);
    assert_memory_equal(buf, "bc", 2);
    close(u);
    close(b);

    /* What makes no sense is refused before any socket is made; what the
     * socket's family has not fails, and leaves no socket open. */
    assert_int_equal(
        atap_net_listen_opts(&a, "127.0.0.1:0", 0,
                             &(atap_net_opts){.flags = ATAP_NET_V6ONLY | ATAP_NET_DUAL_STACK}),
        ATAP_EINVAL);
    assert_int_equal(atap_net_listen_opts(&a, "127.0.0.1:0", 0, &(atap_net_opts){.flags = 0x8000u}),
                     ATAP_EINVAL);
    assert_int_equal(
        atap_net_udp_bind_opts(&a, "127.0.0.1:0", &(atap_net_opts){.multicast_ttl = 256}),
        ATAP_EINVAL);
    assert_int_equal(atap_net_udp_bind_opts(&a, "127.0.0.1:0", &(atap_net_opts){.recv_buffer = -1}),
                     ATAP_EINVAL);
    assert_int_equal(
        atap_net_listen_opts(&a, "127.0.0.1:0", 0, &(atap_net_opts){.local = "127.0.0.1:0"}),
        ATAP_EINVAL);
    assert_int_equal(
        atap_net_listen_opts(&a, "127.0.0.1:0", 0, &(atap_net_opts){.flags = ATAP_NET_V6ONLY}),
        -ENOPROTOOPT);
    assert_int_equal(atap_net_set_opts(0x7fff, &(atap_net_opts){.flags = ATAP_NET_BROADCAST}),
                     -EBADF);
    assert_int_equal(atap_net_set_opts(0, NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_set_opts(0, &(atap_net_opts){.local = "127.0.0.1:0"}), ATAP_EINVAL);
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before);
}

/* IPv6: V6ONLY keeps IPv4 out of "[::]", DUAL_STACK lets it in. Skipped
 * where the host has no IPv6. */
static void test_net_ipv6_only_and_dual_stack(void **state)
{
    (void)state;
    int l, c, rc;
    char name[64], text[80];
    struct sockaddr_storage peer;
    socklen_t peer_len = sizeof peer;
    atap_net_io io;
    atap_net_out out;

    rc = atap_net_listen_opts(&l, "[::]:0", 0, &(atap_net_opts){.flags = ATAP_NET_V6ONLY});
    if (rc == -EAFNOSUPPORT || rc == -EADDRNOTAVAIL) {
        print_message("no IPv6 here: skipped\n");
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(get_int_opt(l, IPPROTO_IPV6, IPV6_V6ONLY), 1);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(l));
    assert_refused(tcp_connect(name, &c));
    snprintf(name, sizeof name, "[::1]:%d", atap_net_local_port(l));
    assert_int_equal(tcp_connect(name, &c), 0);
    close(c);
    close(tcp_accept(l));
    close(l);

    assert_int_equal(
        atap_net_listen_opts(&l, "[::]:0", 0, &(atap_net_opts){.flags = ATAP_NET_DUAL_STACK}), 0);
    assert_int_equal(get_int_opt(l, IPPROTO_IPV6, IPV6_V6ONLY), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(l));
    assert_int_equal(tcp_connect(name, &c), 0);
    assert_int_equal(atap_net_prep_accept(&io, l, (struct sockaddr *)&peer, &peer_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    atap_net_addr_format((struct sockaddr *)&peer, peer_len, text, sizeof text);
    assert_true(strncmp(text, "[::ffff:127.0.0.1]:", 19) == 0);
    close(out.fd);
    close(c);
    close(l);
}

/* A connect bound to a local address first: the peer sees that address
 * and port. 127.0.0.2 is this host's on Linux (all of 127/8 is). */
static void test_net_connect_local_address(void **state)
{
    (void)state;
    int l, c, p, port;
    char name[64], local[64], text[80], want[80];
    struct sockaddr_storage peer;
    socklen_t peer_len = sizeof peer;
    atap_net_io io;
    atap_net_out out;
    atap_net_opts o = {.local = local};
    atap_task t;

    assert_int_equal(atap_net_listen(&l, "127.0.0.1:0", 0), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(l));
    /* A free port: bound, read, closed. */
    assert_int_equal(atap_net_listen(&p, "127.0.0.2:0", 0), 0);
    port = atap_net_local_port(p);
    close(p);
    snprintf(local, sizeof local, "127.0.0.2:%d", port);
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &o), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    local[0] = 'x'; /* spawned: the options and their local were copied */
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &io);
    local[0] = '1';
    c = out.fd;
    assert_int_equal(atap_net_prep_accept(&io, l, (struct sockaddr *)&peer, &peer_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    atap_net_addr_format((struct sockaddr *)&peer, peer_len, text, sizeof text);
    assert_string_equal(text, local);
    close(out.fd);
    /* The same local address and port again while c holds it: refused. */
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &o), 0);
    assert_int_equal(run_task(&io, &out, NULL), -EADDRINUSE);
    close(c);
    /* Port 0 (any) on the calling thread, which reads the options where
     * they are; and options on the socket as well. */
    strcpy(local, "127.0.0.2:0");
    o.send_buffer = 16384;
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &o), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    c = out.fd;
    assert_true(get_int_opt(c, SOL_SOCKET, SO_SNDBUF) >= 16384);
    peer_len = sizeof peer;
    assert_int_equal(getsockname(c, (struct sockaddr *)&peer, &peer_len), 0);
    atap_net_addr_format((struct sockaddr *)&peer, peer_len, text, sizeof text);
    snprintf(want, sizeof want, "127.0.0.2:%d", atap_net_local_port(c));
    assert_string_equal(text, want);
    close(c);
    close(tcp_accept(l));
    /* A local of another family than the peer's: that address is skipped. */
    strcpy(local, "[::1]:0");
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &o), 0);
    assert_int_equal(run_task(&io, &out, NULL), -EAFNOSUPPORT);
    /* A local that is not numeric, or options that make no sense. */
    strcpy(local, "localhost:0");
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &o), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect_opts(&io, name, &(atap_net_opts){.flags = 0x8000u}),
                     ATAP_EINVAL);
    assert_int_equal(atap_net_prep_connect_opts(&io, name, NULL), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    close(out.fd);
    close(tcp_accept(l));
    close(l);
}

/* Multicast: a member receives what is sent to its group, a socket that
 * left does not, and MULTICAST_NO_LOOP keeps a sender's datagrams off this
 * host. The delivery is skipped where the host has no route for
 * multicast (a send then fails with -ENETUNREACH). */
static void test_net_multicast(void **state)
{
    (void)state;
    int r, snd, rc;
    char name[64];
    unsigned char buf[8];
    struct sockaddr_storage to;
    socklen_t to_len;
    atap_net_io io;
    atap_net_out out;
    const atap_spawn_opts briefly = {.timeout_ns = ATAP_MS(200)};

    assert_int_equal(atap_net_udp_bind(&r, "0.0.0.0:0"), 0);
    assert_int_equal(atap_net_multicast_join(r, "239.255.42.7", NULL), 0);
    assert_int_equal(atap_net_multicast_join(r, "239.255.42.7", NULL), -EADDRINUSE);
    assert_int_equal(atap_net_multicast_join(r, "10.0.0.1", NULL), -EINVAL);
    assert_int_equal(atap_net_multicast_join(r, "239.255.42.8", "no-such-if0"), -ENODEV);
    assert_int_equal(atap_net_multicast_join(r, "239.255.42", NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_multicast_join(r, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(
        atap_net_udp_bind_opts(&snd, "0.0.0.0:0", &(atap_net_opts){.multicast_ttl = 1}), 0);
    snprintf(name, sizeof name, "239.255.42.7:%d", atap_net_local_port(r));
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&to, &to_len, name), 0);
    assert_int_equal(atap_net_prep_send_to(&io, snd, "mc", 2, (struct sockaddr *)&to, to_len), 0);
    rc = run_task(&io, &out, NULL);
    if (rc == -ENETUNREACH || rc == -ENODEV) {
        print_message("no route for multicast here: delivery not checked\n");
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(atap_net_prep_recv(&io, r, buf, sizeof buf), 0);
        assert_int_equal(run_task(&io, &out, &(atap_spawn_opts){.timeout_ns = SLOW}), 0);
        assert_int_equal(out.n, 2);
        assert_memory_equal(buf, "mc", 2);
        /* Not looped back to this host: nothing comes. */
        assert_int_equal(
            atap_net_set_opts(snd, &(atap_net_opts){.flags = ATAP_NET_MULTICAST_NO_LOOP}), 0);
        assert_int_equal(atap_net_prep_send_to(&io, snd, "nl", 2, (struct sockaddr *)&to, to_len),
                         0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(atap_net_prep_recv(&io, r, buf, sizeof buf), 0);
        assert_int_equal(run_task(&io, &out, &briefly), ATAP_ETIMEDOUT);
        close(snd);
        assert_int_equal(atap_net_udp_bind(&snd, "0.0.0.0:0"), 0);
    }
    assert_int_equal(atap_net_multicast_leave(r, "239.255.42.7", NULL), 0);
    assert_int_equal(atap_net_multicast_leave(r, "239.255.42.7", NULL), -EADDRNOTAVAIL);
    if (rc == 0) { /* left: a send to the group no longer reaches it */
        assert_int_equal(atap_net_prep_send_to(&io, snd, "lf", 2, (struct sockaddr *)&to, to_len),
                         0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(atap_net_prep_recv(&io, r, buf, sizeof buf), 0);
        assert_int_equal(run_task(&io, &out, &briefly), ATAP_ETIMEDOUT);
    }
    close(snd);
    close(r);
}

/* ---- gathered sends, messages ------------------------------------------- */

/* Reads fd to its end (the peer closed), hashing what came; the count. */
static size_t drain_hash(int fd, uint64_t *h)
{
    unsigned char chunk[65536];
    size_t got = 0;

    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0)
            return got;
        if (n < 0 && errno == EAGAIN) {
            assert_int_equal(poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 20000), 1);
            continue;
        }
        assert_true(n > 0);
        *h = fnv1a(*h, chunk, (size_t)n);
        got += (size_t)n;
    }
}

/* A gathered send sends every buffer in order: one datagram on a datagram
 * socket; on a stream, through a small send buffer, all of many buffers of
 * every size (empty ones too) after partial writes that end mid-buffer,
 * the array left as it was. A pipe is written with writev. */
static void test_net_sendv(void **state)
{
    (void)state;
    enum { N = 1024, SRC = 6 << 20 };
    unsigned char *src = malloc(SRC), buf[32];
    struct iovec *iov = calloc(N + 1, sizeof *iov), *copy = calloc(N + 1, sizeof *iov);
    uint64_t h_want = 1469598103934665603u, h_got = 1469598103934665603u, x = 88172645463325252u;
    size_t total = 0, at = 0;
    int fds[2], p[2];
    atap_net_io io;
    atap_net_out out;
    atap_task t;

    assert_non_null(src);
    assert_non_null(iov);
    assert_non_null(copy);
    /* Three pieces, one stream. */
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    iov[0] = (struct iovec){.iov_base = "hello", .iov_len = 5};
    iov[1] = (struct iovec){.iov_base = ", ", .iov_len = 2};
    iov[2] = (struct iovec){.iov_base = "world", .iov_len = 5};
    assert_int_equal(atap_net_prep_sendv(&io, fds[0], iov, 3), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 12);
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[1], buf, 12), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "hello, world", 12);
    close(fds[0]);
    close(fds[1]);
    /* One datagram. */
    assert_int_equal(atap_net_pair(fds, SOCK_DGRAM), 0);
    assert_int_equal(atap_net_prep_sendv(&io, fds[0], iov, 3), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(atap_net_prep_recv(&io, fds[1], buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 12);
    assert_memory_equal(buf, "hello, world", 12);
    close(fds[0]);
    close(fds[1]);
    /* A pipe. */
    assert_int_equal(pipe(p), 0);
    assert_int_equal(atap_net_prep_sendv(&io, p[1], iov, 3), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(read(p[0], buf, sizeof buf), 12);
    assert_memory_equal(buf, "hello, world", 12);
    close(p[0]);
    close(p[1]);

    /* The most buffers, of sizes 0 to 12 KiB, through a 4 KiB send buffer. */
    for (size_t i = 0; i + 8 <= SRC; i += 8) { /* xorshift */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(src + i, &x, 8);
    }
    for (int i = 0; i < N; i++) {
        size_t len = i % 7 == 3 ? 0 : (size_t)(x = x * 6364136223846793005u + 1) >> 51;
        if (at + len > SRC)
            len = SRC - at;
        iov[i] = (struct iovec){.iov_base = src + at, .iov_len = len};
        at += len + 1; /* a byte skipped between buffers: order shows */
        if (at > SRC)
            at = SRC;
        total += len;
        h_want = fnv1a(h_want, iov[i].iov_base, len);
    }
    memcpy(copy, iov, N * sizeof *iov);
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_set_opts(fds[0], &(atap_net_opts){.send_buffer = 4096}), 0);
    assert_int_equal(atap_net_prep_sendv(&io, fds[0], iov, N), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    {
        atap_net_io rio;
        atap_net_out rout;
        unsigned char *rb = malloc(65536);
        size_t got = 0;
        assert_non_null(rb);
        while (got < total) {
            assert_int_equal(atap_net_prep_recv(&rio, fds[1], rb, 1000 + got % 3000), 0);
            assert_int_equal(run_task(&rio, &rout, NULL), 0);
            assert_true(rout.n > 0);
            h_got = fnv1a(h_got, rb, (size_t)rout.n);
            got += (size_t)rout.n;
        }
        free(rb);
        assert_int_equal(got, total);
    }
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &io);
    assert_int_equal(out.n, (int64_t)total);
    assert_true(h_got == h_want);
    assert_memory_equal(copy, iov, N * sizeof *iov); /* read, never written */

    /* Cancelled while the reader does not read: io->done bytes went, the
     * first of the gather's. */
    assert_int_equal(atap_net_prep_sendv(&io, fds[0], iov, N), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t));
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
    atap_net_release(t, &io);
    assert_true(io.done > 0 && io.done < total);
    close(fds[0]);
    h_want = 1469598103934665603u;
    for (int i = 0, left = (int)io.done; left > 0; i++) {
        size_t len = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
        h_want = fnv1a(h_want, iov[i].iov_base, len);
        left -= (int)len;
    }
    h_got = 1469598103934665603u;
    assert_int_equal(drain_hash(fds[1], &h_got), io.done);
    assert_true(h_got == h_want);
    close(fds[1]);

    /* What is refused. */
    assert_int_equal(atap_net_prep_sendv(&io, 0, iov, N + 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendv(&io, 0, iov, -1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendv(&io, 0, NULL, 1), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendv(NULL, 0, iov, 1), ATAP_EINVAL);
    iov[0].iov_len = SIZE_MAX / 2;
    iov[1].iov_len = SIZE_MAX / 2;
    assert_int_equal(atap_net_prep_sendv(&io, 0, iov, 2), ATAP_EINVAL); /* past SSIZE_MAX */
    free(src);
    free(iov);
    free(copy);
}

/* fds passed over a Unix socket: the one received reads what is written
 * through the one sent (a pipe's two ends), is close-on-exec, and fds with
 * no room are dropped (closed), flagged, never leaked. */
static void test_net_pass_fds(void **state)
{
    (void)state;
    int fds[2], p[2], q[2], got[4] = {-1, -1, -1, -1}, fds_before;
    unsigned char buf[8];
    struct iovec iov = {.iov_base = "F", .iov_len = 1}, riov = {.iov_base = buf, .iov_len = 8};
    atap_net_msg msg = {.iov = &iov, .iovcnt = 1, .nfds = 1, .fds = p};
    atap_net_msg rmsg = {.iov = &riov, .iovcnt = 1, .nfds = 4, .fds = got};
    atap_net_io io, rio;
    atap_net_out out;
    atap_task t;
    char text[16];

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(pipe(p), 0);
    assert_int_equal(pipe(q), 0);
    fds_before = count_fds();
    /* The receive first, parked: the fd comes with the byte. */
    assert_int_equal(atap_net_prep_recvmsg(&rio, fds[1], &rmsg), 0);
    assert_int_equal(rmsg.nfds, 0); /* zeroed by the prep: nothing came yet */
    assert_int_equal(atap_net_spawn(&t, &rio, NULL), 0);
    assert_true(wait_parked(t));
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), 0); /* p[0], the read end */
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 1);
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &rio);
    assert_int_equal(out.n, 1);
    assert_int_equal(buf[0], 'F');
    assert_int_equal(rmsg.nfds, 1);
    assert_int_equal(rmsg.flags, 0);
    assert_true(got[0] >= 0 && got[0] != p[0]);
    assert_true(fcntl(got[0], F_GETFD) & FD_CLOEXEC);
    assert_int_equal(write(p[1], "through", 7), 7); /* into the pipe's write end */
    assert_int_equal(read(got[0], text, sizeof text), 7);
    assert_memory_equal(text, "through", 7);
    close(got[0]);

    /* Three sent, room for one: one comes, two are closed. On the calling
     * thread this time, with two bytes. */
    {
        int three[3] = {p[1], q[0], q[1]};
        iov = (struct iovec){.iov_base = "GH", .iov_len = 2};
        msg = (atap_net_msg){.iov = &iov, .iovcnt = 1, .nfds = 3, .fds = three};
        assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), 0);
        assert_int_equal(atap_net_run(&io, &out), 0);
    }
    rmsg = (atap_net_msg){.iov = &riov, .iovcnt = 1, .nfds = 1, .fds = got};
    assert_int_equal(atap_net_prep_recvmsg(&rio, fds[1], &rmsg), 0);
    assert_int_equal(run_task(&rio, &out, NULL), 0);
    assert_int_equal(out.n, 2);
    assert_int_equal(rmsg.nfds, 1);
    assert_int_equal(rmsg.flags, ATAP_NET_FDS_TRUNC);
    assert_true(fcntl(got[0], F_GETFD) & FD_CLOEXEC);
    /* got[0] is p[1], the write end: what goes through it reads from p[0]. */
    assert_int_equal(write(got[0], "w", 1), 1);
    assert_int_equal(read(p[0], text, 1), 1);
    assert_int_equal(text[0], 'w');
    close(got[0]);
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before); /* the two with no room: closed */

    /* No room for any: the fd is dropped, the byte read. */
    msg = (atap_net_msg){.iov = &iov, .iovcnt = 1, .nfds = 1, .fds = p};
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    rmsg = (atap_net_msg){.iov = &riov, .iovcnt = 1};
    assert_int_equal(atap_net_prep_recvmsg(&rio, fds[1], &rmsg), 0);
    assert_int_equal(run_task(&rio, &out, NULL), 0);
    assert_int_equal(out.n, 2);
    assert_int_equal(rmsg.nfds, 0);
    assert_int_equal(rmsg.flags, ATAP_NET_FDS_TRUNC);
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before);

    /* A closed fd, and fds over a socket that cannot carry them. */
    {
        int bad = 0x7ffe, tcp_c, tcp_s;
        msg = (atap_net_msg){.iov = &iov, .iovcnt = 1, .nfds = 1, .fds = &bad};
        assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), 0);
        assert_int_equal(run_task(&io, &out, NULL), -EBADF);
        tcp_pair(&tcp_c, &tcp_s);
        msg.fds = p;
        assert_int_equal(atap_net_prep_sendmsg(&io, tcp_c, &msg), 0);
        assert_int_equal(run_task(&io, &out, NULL), -EOPNOTSUPP);
        close(tcp_c);
        close(tcp_s);
    }
    /* What is refused. */
    msg = (atap_net_msg){.iov = &iov, .iovcnt = 1, .nfds = ATAP_NET_FDS_MAX + 1, .fds = p};
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), ATAP_EINVAL);
    msg = (atap_net_msg){.iov = &iov, .iovcnt = 1, .nfds = 1};
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), ATAP_EINVAL);
    msg = (atap_net_msg){.nfds = 1, .fds = p}; /* no byte to carry it */
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], &msg), ATAP_EINVAL);
    rmsg = (atap_net_msg){.iov = &riov, .iovcnt = 1, .nfds = -1, .fds = got};
    assert_int_equal(atap_net_prep_recvmsg(&rio, fds[1], &rmsg), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_recvmsg(&rio, fds[1], NULL), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendmsg(&io, fds[0], NULL), ATAP_EINVAL);
    close(p[0]);
    close(p[1]);
    close(q[0]);
    close(q[1]);
    close(fds[0]);
    close(fds[1]);
}

/* A datagram cut to the room says so (ATAP_NET_TRUNC); one that fits, even
 * exactly, does not. Scattered over two buffers, with its sender. */
static void test_net_recvmsg_truncated(void **state)
{
    (void)state;
    int a, b;
    unsigned char head[4], tail[6], big[200];
    struct iovec riov[2] = {{.iov_base = head, .iov_len = 4}, {.iov_base = tail, .iov_len = 6}};
    struct iovec siov[2];
    struct sockaddr_storage from, to;
    socklen_t to_len;
    char name[64], text[64];
    atap_net_msg rmsg, smsg;
    atap_net_io io;
    atap_net_out out;

    memset(big, 'z', sizeof big);
    assert_int_equal(atap_net_udp_bind(&a, "127.0.0.1:0"), 0);
    assert_int_equal(atap_net_udp_bind(&b, "127.0.0.1:0"), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(b));
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&to, &to_len, name), 0);
    /* Sent by message too: two buffers, one datagram, to an address. */
    siov[0] = (struct iovec){.iov_base = "0123", .iov_len = 4};
    siov[1] = (struct iovec){.iov_base = "456789ABCDEF", .iov_len = 12};
    smsg =
        (atap_net_msg){.iov = siov, .iovcnt = 2, .addr = (struct sockaddr *)&to, .addrlen = to_len};
    assert_int_equal(atap_net_prep_sendmsg(&io, a, &smsg), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 16);
    rmsg = (atap_net_msg){.iov = riov,
                          .iovcnt = 2,
                          .addr = (struct sockaddr *)&from,
                          .addrlen = sizeof from,
                          .flags = 77};
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(rmsg.flags, 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 10);
    assert_int_equal(rmsg.flags, ATAP_NET_TRUNC);
    assert_memory_equal(head, "0123", 4);
    assert_memory_equal(tail, "456789", 6);
    atap_net_addr_format((struct sockaddr *)&from, rmsg.addrlen, text, sizeof text);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(a));
    assert_string_equal(text, name);
    /* Exactly the room: not cut. */
    send_to_all(a, "abcdefghij", 10, &to, to_len);
    rmsg = (atap_net_msg){.iov = riov, .iovcnt = 2};
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 10);
    assert_int_equal(rmsg.flags, 0);
    /* Short: not cut either. */
    send_to_all(a, "xyz", 3, &to, to_len);
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 3);
    assert_int_equal(rmsg.flags, 0);
    assert_memory_equal(head, "xyz", 3);
    /* Much longer, into one buffer, stepped on the calling thread. */
    send_to_all(a, big, sizeof big, &to, to_len);
    rmsg = (atap_net_msg){.iov = riov, .iovcnt = 1};
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    assert_int_equal(out.n, 4);
    assert_int_equal(rmsg.flags, ATAP_NET_TRUNC);
    /* An empty datagram fits any room; a room of 0 asks for nothing. */
    send_to_all(a, "", 0, &to, to_len);
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(rmsg.flags, 0);
    rmsg = (atap_net_msg){.iov = NULL, .iovcnt = 0};
    assert_int_equal(atap_net_prep_recvmsg(&io, b, &rmsg), 0);
    assert_int_equal(run_task(&io, &out, &(atap_spawn_opts){.timeout_ns = ATAP_SEC(5)}), 0);
    assert_int_equal(out.n, 0);
    close(a);
    close(b);
}

/* ---- files to sockets ---------------------------------------------------- */

/* A temp file of len bytes (xorshift), open for reading, and its bytes. */
static int temp_file(const char *leaf, size_t len, unsigned char **bytes)
{
    unsigned char *b = malloc(len ? len : 1);
    uint64_t x = 88172645463325252u;
    int fd;

    assert_non_null(b);
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (unsigned char)(x >> 24);
    }
    fd = open(temp_path(leaf), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, len), (ssize_t)len);
    assert_int_equal(lseek(fd, 17, SEEK_SET), 17); /* its position: never used, never moved */
    unlink(temp_path(leaf));
    *bytes = b;
    return fd;
}

/* Sends file[offset, offset + count) to `to` as a task while this thread
 * reads `from` until want bytes came; checks them against bytes. */
static void sendfile_through(int to, int from, int file, const unsigned char *bytes, int64_t offset,
                             size_t count, size_t want)
{
    atap_net_io io, rio;
    atap_net_out out, rout;
    unsigned char *rb = malloc(65536);
    uint64_t h_want, h_got = 1469598103934665603u;
    size_t got = 0;
    atap_task t;

    assert_non_null(rb);
    h_want = fnv1a(1469598103934665603u, bytes + offset, want);
    assert_int_equal(atap_net_prep_sendfile(&io, to, file, offset, count), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    while (got < want) {
        assert_int_equal(atap_net_prep_recv(&rio, from, rb, 65536), 0);
        assert_int_equal(run_task(&rio, &rout, NULL), 0);
        assert_true(rout.n > 0);
        h_got = fnv1a(h_got, rb, (size_t)rout.n);
        got += (size_t)rout.n;
    }
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &io);
    assert_int_equal(out.n, (int64_t)want);
    assert_int_equal(got, want);
    assert_true(h_got == h_want);
    assert_int_equal(lseek(file, 0, SEEK_CUR), 17);
    free(rb);
}

/* A file sent whole and in parts, by sendfile and by the buffer that
 * stands in for it, to a Unix stream and over TCP: the bytes that come
 * are the file's. */
static void test_net_sendfile(void **state)
{
    (void)state;
    enum { SIZE = (3 << 20) + 123 };
    unsigned char *bytes, buf[16];
    int file = temp_file("sendfile", SIZE, &bytes), fds[2], c, s, p[2];
    atap_net_io io;
    atap_net_out out;

    for (int copy = 0; copy < 2; copy++) {
        atap__test_net_no_sendfile(copy == 1);
        assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
        assert_int_equal(atap_net_set_opts(fds[0], &(atap_net_opts){.send_buffer = 16384}), 0);
        sendfile_through(fds[0], fds[1], file, bytes, 0, 0, SIZE);         /* whole */
        sendfile_through(fds[0], fds[1], file, bytes, 1000, 5000, 5000);   /* a part */
        sendfile_through(fds[0], fds[1], file, bytes, SIZE - 10, 100, 10); /* past the end */
        /* At the end, or past it: nothing to send. */
        assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, SIZE, 0), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(out.n, 0);
        assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, SIZE + 5, 10), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(out.n, 0);
        /* On the calling thread. */
        assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, 5, 7), 0);
        assert_int_equal(atap_net_run(&io, &out), 0);
        assert_int_equal(out.n, 7);
        assert_int_equal(read(fds[1], buf, sizeof buf), 7);
        assert_memory_equal(buf, bytes + 5, 7);
        close(fds[0]);
        close(fds[1]);
        tcp_pair(&c, &s);
        sendfile_through(c, s, file, bytes, 0, 0, SIZE);
        /* The peer gone: an error, and no SIGPIPE (it would end this test). */
        close(s);
        assert_int_equal(atap_net_prep_sendfile(&io, c, file, 0, 0), 0);
        {
            int rc = run_task(&io, &out, NULL);
            assert_true(rc == -EPIPE || rc == -ECONNRESET);
        }
        close(c);
    }
    atap__test_net_no_sendfile(false);
    /* A file that cannot be read at an offset. */
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], "pipe", 4), 4);
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_prep_sendfile(&io, fds[0], p[0], 0, 4), 0);
    assert_int_equal(run_task(&io, &out, NULL), -ESPIPE);
    /* What is refused. */
    assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, -1, 4), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, INT64_MAX, 4), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_sendfile(NULL, fds[0], file, 0, 4), ATAP_EINVAL);
    close(fds[0]);
    close(fds[1]);
    close(p[0]);
    close(p[1]);
    close(file);
    free(bytes);
}

/* A sendfile to a reader that does not read parks; a cancel ends it at
 * once, and exactly io->done bytes went, the file's first. By sendfile
 * and by the buffer. */
static void test_net_sendfile_cancel(void **state)
{
    (void)state;
    enum { SIZE = 16 << 20 };
    unsigned char *bytes;
    int file = temp_file("sendfile-cancel", SIZE, &bytes), fds[2];
    uint64_t h_want, h_got;
    atap_net_io io;
    atap_net_out out;
    atap_task t;

    for (int copy = 0; copy < 2; copy++) {
        atap__test_net_no_sendfile(copy == 1);
        assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
        assert_int_equal(atap_net_prep_sendfile(&io, fds[0], file, 0, 0), 0);
        assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
        assert_true(wait_parked(t));
        assert_int_equal(atap_cancel(t), 0);
        assert_int_equal(atap_net_join(t, &out), ATAP_ECANCELLED);
        atap_net_release(t, &io);
        assert_true(io.done > 0 && io.done < SIZE);
        close(fds[0]);
        h_want = fnv1a(1469598103934665603u, bytes, io.done);
        h_got = 1469598103934665603u;
        assert_int_equal(drain_hash(fds[1], &h_got), io.done);
        assert_true(h_got == h_want);
        close(fds[1]);
    }
    atap__test_net_no_sendfile(false);
    close(file);
    free(bytes);
}

/* ---- Unix ---------------------------------------------------------------- */

static void test_net_unix_stream(void **state)
{
    (void)state;
    char path[128], stale[128], longp[200];
    int lfd, lfd2, c, s, fds[2];
    atap_net_io io;
    atap_net_out out;
    unsigned char buf[8];

    strcpy(path, temp_path("s.sock"));
    strcpy(stale, temp_path("stale.sock"));
    assert_int_equal(atap_net_unix_listen(&lfd, path, 1), 0);
    assert_true(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(atap_net_unix_listen(&lfd2, path, 0), -EADDRINUSE);
    assert_int_equal(atap_net_prep_unix_connect(&io, path), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    c = out.fd;
    s = tcp_accept(lfd);
    send_all(c, "unix", 4);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 4), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "unix", 4);
    close(c);
    close(s);

    /* No such file; a stale one (nobody listens). */
    assert_int_equal(atap_net_prep_unix_connect(&io, temp_path("none.sock")), 0);
    assert_int_equal(run_task(&io, &out, NULL), -ENOENT);
    assert_int_equal(atap_net_unix_listen(&lfd2, stale, 0), 0);
    close(lfd2);
    assert_int_equal(atap_net_prep_unix_connect(&io, stale), 0);
    assert_int_equal(run_task(&io, &out, NULL), -ECONNREFUSED);
    assert_int_equal(atap_net_prep_unix_connect(&io, stale), 0);
    assert_int_equal(atap_net_run(&io, &out), -ECONNREFUSED);
    /* A path longer than sun_path holds. */
    memset(longp, 'x', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(atap_net_prep_unix_connect(&io, longp), -ENAMETOOLONG);
    assert_int_equal(atap_net_unix_listen(&lfd2, longp, 0), -ENAMETOOLONG);
    assert_int_equal(atap_net_unix_dgram_bind(&lfd2, longp), -ENAMETOOLONG);
    assert_int_equal(atap_net_prep_unix_connect(&io, ""), ATAP_EINVAL);

    /* A full backlog: the connect waits, then gets in once one is taken. */
    {
        int held[8], n_held = 0;
        atap_task t;
        for (;;) {
            assert_true(n_held < 8);
            assert_int_equal(atap_net_prep_unix_connect(&io, path), 0);
            assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
            if (atap_join_for(t, &out, sizeof out, ATAP_MS(100)) == ATAP_ENOTREADY)
                break;
            assert_int_equal(out.rc, 0);
            held[n_held++] = out.fd;
            atap_net_release(t, &io);
        }
        close(tcp_accept(lfd));
        assert_int_equal(atap_net_join(t, &out), 0);
        atap_net_release(t, &io);
        held[n_held++] = out.fd;
        for (int i = 0; i < n_held; i++)
            close(held[i]);
    }
    close(lfd);
    unlink(path);
    unlink(stale);

    /* An unnamed pair. */
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    send_all(fds[1], "pair", 4);
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], buf, 4), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    assert_memory_equal(buf, "pair", 4);
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(atap_net_pair(fds, SOCK_SEQPACKET), ATAP_EINVAL);
}

static void test_net_unix_datagram(void **state)
{
    (void)state;
    char pa[128], pb[128], text[128];
    int a, b, u, fds[2];
    struct sockaddr_storage to, from;
    socklen_t to_len, from_len = sizeof from;
    unsigned char buf[16];
    atap_net_io io;
    atap_net_out out;
    atap_task t;

    strcpy(pa, temp_path("a.dgram"));
    strcpy(pb, temp_path("b.dgram"));
    assert_int_equal(atap_net_unix_dgram_bind(&a, pa), 0);
    assert_int_equal(atap_net_unix_dgram_bind(&b, pb), 0);
    assert_int_equal(atap_net_unix_dgram_bind(&u, NULL), 0);
    assert_int_equal(atap_net_unix_dgram_bind(&fds[0], pa), -EADDRINUSE);

    assert_int_equal(
        atap_net_prep_recv_from(&io, b, buf, sizeof buf, (struct sockaddr *)&from, &from_len), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    assert_true(wait_parked(t));
    assert_int_equal(atap_net_unix_addr((struct sockaddr *)&to, &to_len, pb), 0);
    {
        atap_net_io sio;
        assert_int_equal(
            atap_net_prep_send_to(&sio, a, "from a", 6, (struct sockaddr *)&to, to_len), 0);
        assert_int_equal(run_task(&sio, &out, NULL), 0);
        /* From the unbound socket too. */
        assert_int_equal(atap_net_prep_send_to(&sio, u, "anon", 4, (struct sockaddr *)&to, to_len),
                         0);
        assert_int_equal(run_task(&sio, &out, NULL), 0);
    }
    assert_int_equal(atap_net_join(t, &out), 0);
    atap_net_release(t, &io);
    assert_int_equal(out.n, 6);
    assert_memory_equal(buf, "from a", 6);
    atap_net_addr_format((struct sockaddr *)&from, from_len, text, sizeof text);
    assert_string_equal(text, pa);
    from_len = sizeof from;
    assert_int_equal(
        atap_net_prep_recv_from(&io, b, buf, sizeof buf, (struct sockaddr *)&from, &from_len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 4);
    atap_net_addr_format((struct sockaddr *)&from, from_len, text, sizeof text);
    assert_string_equal(text, ""); /* unnamed */
    /* Connected by path. */
    assert_int_equal(atap_net_dgram_connect(a, pb), 0);
    send_all(a, "conn", 4);
    assert_int_equal(atap_net_prep_recv(&io, b, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 4);
    /* To a path nobody is bound to. */
    assert_int_equal(atap_net_unix_addr((struct sockaddr *)&to, &to_len, temp_path("nobody")), 0);
    {
        atap_net_io sio;
        assert_int_equal(atap_net_prep_send_to(&sio, u, "x", 1, (struct sockaddr *)&to, to_len), 0);
        assert_int_equal(run_task(&sio, &out, NULL), -ENOENT);
    }
    close(a);
    close(b);
    close(u);
    unlink(pa);
    unlink(pb);
    /* A datagram pair. */
    assert_int_equal(atap_net_pair(fds, SOCK_DGRAM), 0);
    send_all(fds[0], "d1", 2);
    assert_int_equal(atap_net_prep_recv(&io, fds[1], buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 2);
    close(fds[0]);
    close(fds[1]);
}

/* "@name" is a name in Linux's abstract namespace: no file is made, the
 * name goes with the last socket bound to it, and addresses of it format
 * back as "@name". Elsewhere such a name is refused (-ENOTSUP). A '@'
 * anywhere but first, or "./@name", is a file as before. */
static void test_net_unix_abstract(void **state)
{
    (void)state;
    char name[64], dname[64], text[160], longn[sizeof(((struct sockaddr_un *)0)->sun_path) + 2];
    struct sockaddr_storage ss;
    socklen_t len;
    int lfd, c, s, d, u, fds[2];
    atap_net_io io;
    atap_net_out out;
    unsigned char buf[8];

    snprintf(name, sizeof name, "@atap-test-%d", (int)getpid());
    snprintf(dname, sizeof dname, "@atap-test-dgram-%d", (int)getpid());
#ifdef __linux__
    assert_int_equal(atap_net_unix_listen(&lfd, name, 0), 0);
    assert_int_equal(access(name, F_OK), -1); /* no file called "@atap-test-..." */
    assert_int_equal(errno, ENOENT);
    assert_int_equal(atap_net_unix_listen(&fds[0], name, 0), -EADDRINUSE);
    len = sizeof ss;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&ss, &len), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text),
                     (int)strlen(name));
    assert_string_equal(text, name);
    assert_int_equal(atap_net_prep_unix_connect(&io, name), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    c = out.fd;
    s = tcp_accept(lfd);
    send_all(c, "abst", 4);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 4), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "abst", 4);
    len = sizeof ss;
    assert_int_equal(getpeername(c, (struct sockaddr *)&ss, &len), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text),
                     (int)strlen(name));
    assert_string_equal(text, name);
    /* Cut like snprintf: the whole length, the text cut to the room. */
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, 4), (int)strlen(name));
    assert_string_equal(text, "@at");
    close(c);
    close(s);
    close(lfd);
    /* The name went with its socket: nobody listens, nothing to remove. */
    assert_int_equal(atap_net_prep_unix_connect(&io, name), 0);
    assert_int_equal(run_task(&io, &out, NULL), -ECONNREFUSED);
    assert_int_equal(atap_net_unix_listen(&lfd, name, 0), 0);
    close(lfd);

    /* Datagrams: bound, sent to, connected to, and the sender named. */
    assert_int_equal(atap_net_unix_dgram_bind(&d, dname), 0);
    assert_int_equal(atap_net_unix_dgram_bind(&u, name), 0);
    assert_int_equal(atap_net_unix_addr((struct sockaddr *)&ss, &len, dname), 0);
    assert_int_equal(atap_net_prep_send_to(&io, u, "dg", 2, (struct sockaddr *)&ss, len), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    len = sizeof ss;
    assert_int_equal(atap_net_prep_recv_from(&io, d, buf, sizeof buf, (struct sockaddr *)&ss, &len),
                     0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_int_equal(out.n, 2);
    atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text);
    assert_string_equal(text, name);
    assert_int_equal(atap_net_dgram_connect(u, dname), 0);
    send_all(u, "cn", 2);
    assert_int_equal(atap_net_prep_recv(&io, d, buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    assert_memory_equal(buf, "cn", 2);
    close(d);
    close(u);

    /* The room: sun_path's whole length after the '@' (no NUL ends it). */
    memset(longn, 'a', sizeof longn);
    longn[0] = '@';
    longn[sizeof longn - 2] = '\0'; /* '@' and sizeof sun_path - 1 bytes */
    assert_int_equal(atap_net_unix_listen(&lfd, longn, 0), 0);
    len = sizeof ss;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&ss, &len), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text),
                     (int)strlen(longn));
    assert_string_equal(text, longn);
    assert_int_equal(atap_net_prep_unix_connect(&io, longn), 0);
    assert_int_equal(run_task(&io, &out, NULL), 0);
    close(out.fd);
    close(lfd);
    longn[sizeof longn - 2] = 'a';
    longn[sizeof longn - 1] = '\0'; /* one more */
    assert_int_equal(atap_net_unix_listen(&lfd, longn, 0), -ENAMETOOLONG);
    assert_int_equal(atap_net_prep_unix_connect(&io, longn), -ENAMETOOLONG);
    /* "@" alone names nothing. */
    assert_int_equal(atap_net_unix_listen(&lfd, "@", 0), ATAP_EINVAL);
    assert_int_equal(atap_net_prep_unix_connect(&io, "@"), ATAP_EINVAL);
    assert_int_equal(atap_net_unix_addr((struct sockaddr *)&ss, &len, "@"), ATAP_EINVAL);
#else
    assert_int_equal(atap_net_unix_listen(&lfd, name, 0), -ENOTSUP);
    assert_int_equal(atap_net_prep_unix_connect(&io, name), -ENOTSUP);
    assert_int_equal(atap_net_unix_dgram_bind(&d, dname), -ENOTSUP);
    assert_int_equal(atap_net_unix_addr((struct sockaddr *)&ss, &len, name), -ENOTSUP);
    (void)c, (void)s, (void)u, (void)out, (void)buf, (void)text, (void)longn;
#endif
    /* A '@' past the start is a file's. */
    assert_int_equal(atap_net_unix_listen(&lfd, temp_path("@file"), 0), 0);
    assert_int_equal(access(temp_path("@file"), F_OK), 0);
    close(lfd);
    unlink(temp_path("@file"));
    (void)fds;
}

/* ---- a task of one's own ------------------------------------------------ */

/* Reads "ping" and answers "pong" on one io, stepping through both. */
struct own {
    int fd, stage;
    atap_net_io io;
    unsigned char buf[4];
    atomic_int freed;
};

static int own_task(atap_ctx *ctx, void *arg, void *out)
{
    struct own *o = arg;
    atap_net_out r;
    int rc;

    for (;;) {
        if ((rc = atap_net_step(ctx, &o->io, &r)) != 0)
            return rc;
        if (r.rc != 0 || o->stage == 1) {
            memcpy(out, &r, sizeof r);
            return 0;
        }
        CHECK(memcmp(o->buf, "ping", 4) == 0);
        atap_net_prep_send(&o->io, o->fd, "pong", 4);
        o->stage = 1;
    }
}

static void own_free(void *arg)
{
    struct own *o = arg;
    atap_net_abandon(&o->io);
    atomic_store(&o->freed, 1);
}

/* A read of 0 bytes asks for nothing: it finishes at once with n = 0,
 * which is no close (the peer is alive), on an idle socket as on one with
 * bytes waiting, and takes none of them. The timeout only ends a read that
 * waited. */
static void test_net_zero_length_reads(void **state)
{
    (void)state;
    int fds[2], dg[2];
    unsigned char buf[8];
    struct sockaddr_storage from;
    socklen_t from_len;
    atap_net_io io;
    atap_net_out out;
    const atap_spawn_opts limit = {.timeout_ns = ATAP_SEC(5)};

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    assert_int_equal(atap_net_pair(dg, SOCK_DGRAM), 0);
    /* Idle: nothing to read, the peer alive. */
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], buf, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], NULL, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(atap_net_prep_recv(&io, fds[0], buf, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(atap_net_prep_recv(&io, dg[0], NULL, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    from_len = sizeof from;
    assert_int_equal(
        atap_net_prep_recv_from(&io, dg[0], NULL, 0, (struct sockaddr *)&from, &from_len), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(from_len, 0); /* no datagram, no sender */
    /* Bytes waiting stay for the next read. */
    send_all(fds[1], "abc", 3);
    send_all(dg[1], "xyz", 3);
    assert_int_equal(atap_net_prep_recv(&io, fds[0], buf, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(atap_net_prep_recv(&io, dg[0], buf, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], buf, 3), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_memory_equal(buf, "abc", 3);
    assert_int_equal(atap_net_prep_recv(&io, dg[0], buf, sizeof buf), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 3);
    assert_memory_equal(buf, "xyz", 3);
    /* On the calling thread, and stepped, the same. */
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], buf, 0), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    assert_int_equal(out.n, 0);
    /* A closed peer: a read of 0 still reads 0, with no error. */
    close(fds[1]);
    assert_int_equal(atap_net_prep_recv_exact(&io, fds[0], buf, 0), 0);
    assert_int_equal(run_task(&io, &out, &limit), 0);
    assert_int_equal(out.n, 0);
    close(fds[0]);
    close(dg[0]);
    close(dg[1]);
}

/* The address's length says how much of it there is: a datagram from an
 * unbound Unix socket comes with none (length 0), and whatever the storage
 * held before (zeros, or the last sender's address) is not read. */
static void test_net_addr_format_honours_length(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    socklen_t len;
    char text[128];
    int u, b, fds[2];
    char pb[128];
    unsigned char buf[8];
    atap_net_io io;
    atap_net_out out;

    memset(&ss, 0, sizeof ss);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, 0, text, sizeof text), 0);
    assert_string_equal(text, "");
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&ss, &len, "10.1.2.3:99"), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text), 11);
    assert_string_equal(text, "10.1.2.3:99");
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, 0, text, sizeof text), 0);
    assert_string_equal(text, "");
    /* Too short for its family's address: a bad argument. */
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len - 1, text, sizeof text),
                     ATAP_EINVAL);
    assert_int_equal(atap_net_ip_addr((struct sockaddr *)&ss, &len, "[::1]:7"), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len - 1, text, sizeof text),
                     ATAP_EINVAL);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text), 7);
    /* A real datagram from an unbound socket, into storage that held an
     * IPv4 sender, then into zeroed storage. */
    strcpy(pb, temp_path("fmt.dgram"));
    unlink(pb);
    assert_int_equal(atap_net_unix_dgram_bind(&b, pb), 0);
    assert_int_equal(atap_net_unix_dgram_bind(&u, NULL), 0);
    assert_int_equal(atap_net_dgram_connect(u, pb), 0);
    for (int round = 0; round < 2; round++) {
        if (round == 0)
            assert_int_equal(atap_net_ip_addr((struct sockaddr *)&ss, &len, "10.1.2.3:99"), 0);
        else
            memset(&ss, 0, sizeof ss);
        send_all(u, "anon", 4);
        len = sizeof ss;
        assert_int_equal(
            atap_net_prep_recv_from(&io, b, buf, sizeof buf, (struct sockaddr *)&ss, &len), 0);
        assert_int_equal(run_task(&io, &out, NULL), 0);
        assert_int_equal(out.n, 4);
        assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text), 0);
        assert_string_equal(text, "");
    }
    /* A socket pair's peer is unnamed too. */
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    len = sizeof ss;
    memset(&ss, 0xff, sizeof ss);
    assert_int_equal(getpeername(fds[0], (struct sockaddr *)&ss, &len), 0);
    assert_int_equal(atap_net_addr_format((struct sockaddr *)&ss, len, text, sizeof text), 0);
    assert_string_equal(text, "");
    close(fds[0]);
    close(fds[1]);
    close(u);
    close(b);
    unlink(pb);
}

/* The fork's child of test_net_accept_waits_for_a_free_fd: 0, or the
 * check that failed. */
static int accept_out_of_fds_child(void)
{
    enum { MAX_FILL = 4096 };
    static int fill[MAX_FILL];
    int lfd, c, n_fill = 0, rc, port;
    struct sockaddr_storage ss;
    socklen_t len;
    struct rlimit rl;
    struct timespec c0, c1;
    uint64_t w0, w1, cpu_ns;
    atap_net_io io;
    atap_net_out out;
    atap_task t;
    char b = 0;

    if (atap_init(NULL) != 0)
        return 2;
    if (atap_net_listen(&lfd, "127.0.0.1:0", 0) != 0)
        return 3;
    port = atap_net_local_port(lfd);
    if (atap_net_ip_addr((struct sockaddr *)&ss, &len, "127.0.0.1:0") != 0)
        return 3;
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    /* A connection queued on the listener, nobody having accepted it. */
    if ((c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(c, (struct sockaddr *)&ss, len) != 0)
        return 4;
    /* No fd left: the limit just above what is open, the rest filled. */
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 5;
    rl.rlim_cur = (rlim_t)c + 16 < rl.rlim_cur ? (rlim_t)c + 16 : rl.rlim_cur;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 5;
    while (n_fill < MAX_FILL && (fill[n_fill] = dup(0)) >= 0)
        n_fill++;
    if (n_fill == 0 || n_fill == MAX_FILL || errno != EMFILE)
        return 6;
    if (atap_net_prep_accept(&io, lfd, NULL, NULL) != 0 || atap_net_spawn(&t, &io, NULL) != 0)
        return 7;
    /* It waits, using little CPU: the process's whole CPU time over ~300
     * ms of waiting stays under 30 % of that (spinning took a core). */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    w0 = now_ns();
    sleep_ms(300);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    w1 = now_ns();
    if (atap_finished(t)) {
        rc = atap_net_join(t, &out);
        fprintf(stderr, "accept ended while no fd was free: %s\n", atap_strerror(rc));
        return 8;
    }
    cpu_ns = (uint64_t)(c1.tv_sec - c0.tv_sec) * 1000000000u + (uint64_t)c1.tv_nsec -
             (uint64_t)c0.tv_nsec;
    fprintf(stderr, "accept waiting out of fds: %.1f ms CPU over %.1f ms\n", cpu_ns / 1e6,
            (w1 - w0) / 1e6);
    if (cpu_ns * 10 > (w1 - w0) * 3)
        return 9;
    /* One fd free: the queued connection is accepted, none lost. */
    close(fill[--n_fill]);
    if ((rc = atap_join_for(t, &out, sizeof out, SLOW)) != 0 || out.rc != 0 || out.fd < 0) {
        fprintf(stderr, "accept after an fd came free: %s / %s\n", atap_strerror(rc),
                atap_strerror(out.rc));
        return 10;
    }
    atap_net_release(t, &io);
    if (write(c, "k", 1) != 1 || atap_wait_fd(out.fd, ATAP_READABLE, SLOW) < 0 ||
        read(out.fd, &b, 1) != 1 || b != 'k')
        return 11;
    close(out.fd);
    while (n_fill > 0)
        close(fill[--n_fill]);
    close(c);
    close(lfd);
    return atap_shutdown() == 0 ? 0 : 12;
}

/* With no fd free, an accept waits for one (parked, not spinning), and
 * takes the queued connection once one is. */
static void test_net_accept_waits_for_a_free_fd(void **state)
{
    (void)state;
    pid_t pid;

    /* Forked with no runtime running: a child of a process with threads
     * may start none of its own under TSan. */
    assert_int_equal(atap_shutdown(), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(accept_out_of_fds_child());
    assert_int_equal(atap_init(NULL), 0); /* for the teardown */
    child_passed(pid);
}

static void test_net_step_in_own_task(void **state)
{
    (void)state;
    static struct own o; /* outlives a failed test's tasks */
    int fds[2], lfd, held[16], n_held, fds_before;
    atap_task t, hang;
    atap_net_io hio;
    atap_net_out out;
    unsigned char buf[4];

    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    memset(&o, 0, sizeof o);
    o.fd = fds[0];
    assert_int_equal(atap_net_prep_recv_exact(&o.io, fds[0], o.buf, 4), 0);
    assert_int_equal(atap_spawn(&t, own_task, &o, &(atap_spawn_opts){.out_size = sizeof out}), 0);
    assert_true(wait_parked(t)); /* parked by its step */
    send_all(fds[1], "pi", 2);
    sleep_ms(2);
    send_all(fds[1], "ng", 2);
    assert_int_equal(atap_join(t, &out, sizeof out), 0);
    atap_release(t);
    assert_int_equal(out.rc, 0);
    assert_int_equal(out.n, 4);
    assert_int_equal(atap_net_prep_recv_exact(&hio, fds[1], buf, 4), 0);
    assert_int_equal(atap_net_run(&hio, &out), 0);
    assert_memory_equal(buf, "pong", 4);
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(atap_net_step(NULL, &hio, &out), ATAP_EINVAL);

    /* A step's connect left hanging, its task cancelled: abandon closes
     * the socket it was connecting. */
    fds_before = count_fds();
    if (!hanging_connect(&lfd, &hang, &hio, held, &n_held, NULL)) {
        for (int i = 0; i < n_held; i++)
            close(held[i]);
        close(lfd);
        return;
    }
    atap_cancel(hang);
    atap_net_join(hang, &out);
    atap_net_release(hang, &hio);
    {
        char name[64];
        memset(&o, 0, sizeof o);
        snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(lfd));
        assert_int_equal(atap_net_prep_connect(&o.io, name), 0);
        assert_int_equal(
            atap_spawn(&t, own_task, &o,
                       &(atap_spawn_opts){.out_size = sizeof out, .arg_free = own_free}),
            0);
        assert_true(wait_parked(t));
        atap_cancel(t);
        assert_int_equal(atap_join(t, &out, sizeof out), ATAP_ECANCELLED);
        atap_release(t);
        assert_true(wait_atomic_at_least(&o.freed, 1, SLOW));
    }
    for (int i = 0; i < n_held; i++)
        close(held[i]);
    close(lfd);
    assert_true(wait_live_back(SLOW));
    if (fds_before >= 0)
        assert_int_equal(count_fds(), fds_before);
}

/* ---- the calling thread, and shutdown ----------------------------------- */

/* atap_net_run needs no runtime: a whole exchange on the calling thread. */
static void test_net_run_without_runtime(void **state)
{
    (void)state;
    int lfd, c, s, fds[2];
    char name[64];
    atap_net_io io;
    atap_net_out out;
    unsigned char buf[4];

    assert_int_equal(atap_shutdown(), 0);
    assert_false(atap_initialised());
    assert_int_equal(atap_net_listen(&lfd, "127.0.0.1:0", 0), 0);
    snprintf(name, sizeof name, "127.0.0.1:%d", atap_net_local_port(lfd));
    assert_int_equal(atap_net_prep_connect(&io, name), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    c = out.fd;
    assert_int_equal(atap_net_prep_accept(&io, lfd, NULL, NULL), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    s = out.fd;
    assert_int_equal(atap_net_prep_send(&io, c, "ping", 4), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    assert_int_equal(atap_net_prep_recv_exact(&io, s, buf, 4), 0);
    assert_int_equal(atap_net_run(&io, &out), 0);
    assert_memory_equal(buf, "ping", 4);
    /* A spawn has no runtime to go to. */
    {
        atap_task t;
        assert_int_equal(atap_net_spawn(&t, &io, NULL), ATAP_ENOTINIT);
    }
    close(c);
    close(s);
    close(lfd);
    /* Parked at shutdown: written off (ATAP_EFAILED). */
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_net_pair(fds, SOCK_STREAM), 0);
    {
        atap_task t;
        assert_int_equal(atap_net_prep_recv(&io, fds[0], buf, sizeof buf), 0);
        assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
        assert_true(wait_parked(t));
        assert_int_equal(atap_shutdown(), 0);
        assert_int_equal(atap_net_join(t, &out), ATAP_EFAILED);
        atap_net_release(t, &io);
    }
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(atap_init(NULL), 0); /* for the teardown */
}

static int setup_net(void **state) { return setup_runtime(state); }

static int teardown_net(void **state) { return teardown_runtime(state); }

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_net, teardown_net)
    const struct CMUnitTest tests[] = {
        T(test_net_tcp_exchange),
        T(test_net_tcp_errors),
        T(test_net_connect_error_read_elsewhere),
        T(test_net_recv_until_keeps_what_it_read),
        T(test_net_recv_until_after_a_short_read),
        T(test_net_recv_until_finds_every_delimiter),
        T(test_net_cancel_connect),
        T(test_net_cancel_mid_send),
        T(test_net_cancel_and_timeout_mid_recv),
        T(test_net_pair_100mb_hash),
        T(test_net_many_connections),
        T(test_net_udp),
        T(test_net_socket_options),
        T(test_net_ipv6_only_and_dual_stack),
        T(test_net_connect_local_address),
        T(test_net_multicast),
        T(test_net_sendv),
        T(test_net_pass_fds),
        T(test_net_recvmsg_truncated),
        T(test_net_sendfile),
        T(test_net_sendfile_cancel),
        T(test_net_unix_stream),
        T(test_net_unix_datagram),
        T(test_net_unix_abstract),
        T(test_net_zero_length_reads),
        T(test_net_addr_format_honours_length),
        T(test_net_accept_waits_for_a_free_fd),
        T(test_net_step_in_own_task),
        T(test_net_run_without_runtime),
    };
#undef T
    const char *only = getenv("ATAP_TEST_FILTER");
    int rc;

    signal(SIGPIPE, SIG_DFL); /* a send that raised it would kill the test */
    if (only != NULL && *only != '\0')
        cmocka_set_test_filter(only);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_dir[0])
        rmdir(g_dir);
    return rc;
}

/*
 * echo_server: a TCP echo server whose connections are parked tasks.
 *
 *   listener     parks on the listening socket (atap_park_fd, READABLE).
 *                Each run accepts every pending connection, spawns one
 *                connection task per client and parks again.
 *   connection   reads what has arrived and writes it back. When the kernel
 *                would not take all of it, it parks for WRITABLE with the
 *                unsent bytes kept in its state; with nothing to do it parks
 *                for READABLE. On EOF it closes the socket and finishes.
 *
 * A parked task gives its thread back: a thousand idle connections cost a
 * thousand task slots (a few hundred bytes each), not a thousand threads.
 * A resumed task runs again from the top of its function: everything it
 * must remember lives in its arg (malloc'd; arg_free frees it and closes
 * the socket, also when shutdown ends a task that is still parked).
 *
 * Usage:
 *   echo_server [port]        serve 127.0.0.1:port (0 or none: any free port)
 *                             until SIGINT or SIGTERM
 *   echo_server --clients N   self-test: serve on a free port and run N
 *                             client tasks (parked the same way) that each
 *                             send a few KB and check every byte that comes
 *                             back; exits 0 only if all N did
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4 (where there is one) */
#endif
#include <arpa/inet.h>
#include <atap.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLIENT_TIMEOUT ATAP_SEC(10) /* a client that hears nothing this long fails */

/* What the server did, for the self-test's summary. */
static atomic_long conns_accepted, conns_open, bytes_echoed, write_parks;

/* ---------------------------------------------------------------------- */
/* Small helpers                                                           */
/* ---------------------------------------------------------------------- */

static bool would_block(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK;
}

/* Asks to be run again once fd is ready for events (or timeout passes),
 * then gives the thread back: return what this returns. */
static int park_on(atap_ctx *ctx, int fd, unsigned events, uint64_t timeout)
{
    int rc = atap_park_fd(ctx, fd, events, timeout);
    if (rc != 0) {
        fprintf(stderr, "echo_server: atap_park_fd: %s\n", atap_strerror(rc));
        return 1; /* a failed run: arg_free still closes the socket */
    }
    return ATAP_PARKED;
}

#ifndef SOCK_NONBLOCK
/* fd never blocks and is not inherited by exec'd children (for systems
 * without SOCK_NONBLOCK and accept4, such as macOS). */
static int non_blocking(int fd)
{
    if (fd >= 0 && (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 ||
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}
#endif

/* A TCP socket that never blocks and is not inherited by exec'd children. */
static int tcp_socket(void)
{
#ifdef SOCK_NONBLOCK
    return socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
#else
    return non_blocking(socket(AF_INET, SOCK_STREAM, 0));
#endif
}

/* accept, with the new socket set up as tcp_socket's. */
static int accept_one(int listen_fd)
{
#ifdef SOCK_NONBLOCK
    return accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
#else
    return non_blocking(accept(listen_fd, NULL, NULL));
#endif
}

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

/* ---------------------------------------------------------------------- */
/* The server                                                              */
/* ---------------------------------------------------------------------- */

struct conn {
    int fd;
    size_t len, off;    /* buf[off..len) is read but not yet written back */
    char buf[16384];
};

static void conn_free(void *arg)
{
    struct conn *c = arg;
    if (c->fd >= 0)
        close(c->fd);
    free(c);
    atomic_fetch_sub(&conns_open, 1);
}

/* The connection is over (EOF, or the peer reset it): close it and finish. */
static int hang_up(struct conn *c)
{
    close(c->fd);
    c->fd = -1;
    return 0;
}

/* A connection task: echo until EOF. Each run does at most 16 reads, then
 * parks even if more is waiting (and is run again at once), so one busy
 * client cannot keep a worker to itself. */
static int connection(atap_ctx *ctx, void *arg, void *out)
{
    struct conn *c = arg;
    (void)out;

    for (int round = 0; round < 16; round++) {
        /* First, write back what is left over (from this run or the last). */
        while (c->off < c->len) {
            ssize_t n = send(c->fd, c->buf + c->off, c->len - c->off, 0);
            if (n >= 0) {
                c->off += (size_t)n;
                atomic_fetch_add(&bytes_echoed, n);
            } else if (would_block()) {
                atomic_fetch_add(&write_parks, 1);
                return park_on(ctx, c->fd, ATAP_WRITABLE, ATAP_FOREVER);
            } else if (errno != EINTR) {
                return hang_up(c);
            }
        }
        /* Then read what has arrived. */
        ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (n > 0) {
            c->off = 0;
            c->len = (size_t)n;
        } else if (n == 0) {
            return hang_up(c); /* EOF: the client is done */
        } else if (would_block()) {
            return park_on(ctx, c->fd, ATAP_READABLE, ATAP_FOREVER); /* nothing to do */
        } else if (errno != EINTR) {
            return hang_up(c);
        }
    }
    /* Out of rounds: come back for whatever is due first. */
    return park_on(ctx, c->fd, c->off < c->len ? ATAP_WRITABLE : ATAP_READABLE, ATAP_FOREVER);
}

/* Starts a connection task on an accepted socket. Its handle is released
 * at once: nobody joins it, and the task lives on until it finishes. */
static void start_connection(int fd, int sndbuf)
{
    struct conn *c = malloc(sizeof *c);
    atap_task t;
    int rc = c ? 0 : -ENOMEM;

    if (sndbuf)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (c) {
        c->fd = fd;
        c->len = c->off = 0;
        atomic_fetch_add(&conns_open, 1); /* before the task can end */
        rc = atap_spawn(&t, connection, c, &(atap_spawn_opts){.arg_free = conn_free});
    }
    if (rc != 0) {
        fprintf(stderr, "echo_server: cannot start a connection: %s\n", atap_strerror(rc));
        if (c)
            atomic_fetch_sub(&conns_open, 1);
        free(c); /* a failed spawn leaves arg to us */
        close(fd);
        return;
    }
    atomic_fetch_add(&conns_accepted, 1);
    atap_release(t);
}

struct listener {
    int fd;
    int sndbuf; /* SO_SNDBUF for accepted sockets; 0: the kernel's default */
};

static void listener_free(void *arg)
{
    struct listener *l = arg;
    close(l->fd);
    free(l);
}

/* The listener task: accept everything pending, then park again. */
static int listener(atap_ctx *ctx, void *arg, void *out)
{
    struct listener *l = arg;
    (void)out;

    for (;;) {
        int fd = accept_one(l->fd);
        if (fd >= 0) {
            start_connection(fd, l->sndbuf);
        } else if (would_block()) {
            return park_on(ctx, l->fd, ATAP_READABLE, ATAP_FOREVER); /* all accepted */
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* Out of fds or memory. The socket stays readable, so parking
             * on it would come straight back: the clients wait in the
             * backlog and we try again in 100 ms. */
            perror("echo_server: accept4");
            return atap_park_until(ctx, atap_now() + ATAP_MS(100)) == 0 ? ATAP_PARKED : 1;
        } else if (errno != EINTR && errno != ECONNABORTED) {
            perror("echo_server: accept4");
            return 1; /* the listener fails; the connections carry on */
        }
    }
}

/* Binds 127.0.0.1:port (0: any free port), spawns the listener task and
 * returns the port it got. */
static int start_server(int port, int sndbuf, atap_task *task)
{
    struct sockaddr_in sa = loopback(port);
    socklen_t len = sizeof sa;
    struct listener *l = malloc(sizeof *l);
    int one = 1, rc;

    if (!l || (l->fd = tcp_socket()) < 0) {
        perror("echo_server: socket");
        exit(1);
    }
    l->sndbuf = sndbuf;
    setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l->fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(l->fd, SOMAXCONN) != 0 ||
        getsockname(l->fd, (struct sockaddr *)&sa, &len) != 0) {
        perror("echo_server: bind/listen");
        exit(1);
    }
    rc = atap_spawn(task, listener, l, &(atap_spawn_opts){.arg_free = listener_free});
    if (rc != 0) {
        fprintf(stderr, "echo_server: atap_spawn: %s\n", atap_strerror(rc));
        exit(1);
    }
    port = ntohs(sa.sin_port);
    printf("listening on 127.0.0.1:%d\n", port);
    fflush(stdout);
    return port;
}

/* ---------------------------------------------------------------------- */
/* The self-test's clients                                                 */
/* ---------------------------------------------------------------------- */

/* The self-test gives the server's sends and the clients' receives the
 * smallest buffers the kernel allows (it rounds 2 KB up to about 4 KB), so
 * an echo of a few KB often does not fit at once: the server's writes
 * block and its WRITABLE path runs, as it would for a slow client. (With
 * the defaults the kernel sizes loopback buffers in MB.) */
static const int tiny_buffer = 2048;

struct client {
    unsigned id;
    int port, fd;
    bool connected, shut;     /* connect done; our half closed (all sent) */
    size_t size, sent, got;   /* bytes to send, sent so far, echoed and checked */
};

/* A client's output: why it failed, or "" if every byte came back. */
struct verdict {
    char why[112];
};

/* Byte i of client id's stream: a hash of both, so a byte that went to the
 * wrong client, or came back out of order, shows. */
static unsigned char pattern(unsigned id, size_t i)
{
    uint32_t x = id * 2654435761u ^ (uint32_t)i * 2246822519u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (unsigned char)x;
}

static void client_free(void *arg)
{
    struct client *c = arg;
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

/* Ends a client's task with a verdict ("" for success). */
static int verdict(void *out, const char *fmt, ...)
{
    struct verdict *v = out;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    return 0;
}

/* A client task: connect, send `size` pattern bytes (then shut our half),
 * read the echo back checking each byte, succeed on the server's EOF. */
static int client(atap_ctx *ctx, void *arg, void *out)
{
    struct client *c = arg;

    if (atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE)
        return verdict(out, "nothing happened for %d s (sent %zu, got %zu of %zu)",
                       (int)(CLIENT_TIMEOUT / ATAP_SEC(1)), c->sent, c->got, c->size);

    /* First run: start connecting; the socket turns WRITABLE once done. */
    if (c->fd < 0) {
        struct sockaddr_in sa = loopback(c->port);
        if ((c->fd = tcp_socket()) < 0)
            return verdict(out, "socket: %s", strerror(errno));
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &tiny_buffer, sizeof tiny_buffer);
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS)
            return verdict(out, "connect: %s", strerror(errno));
        return park_on(ctx, c->fd, ATAP_WRITABLE, CLIENT_TIMEOUT);
    }
    if (!c->connected) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0)
            return verdict(out, "connect: %s", strerror(err));
        c->connected = true;
    }

    /* Send what the kernel takes now. */
    while (c->sent < c->size) {
        unsigned char chunk[4096];
        size_t k = c->size - c->sent < sizeof chunk ? c->size - c->sent : sizeof chunk;
        for (size_t i = 0; i < k; i++)
            chunk[i] = pattern(c->id, c->sent + i);
        ssize_t n = send(c->fd, chunk, k, 0);
        if (n >= 0)
            c->sent += (size_t)n;
        else if (would_block())
            break;
        else if (errno != EINTR)
            return verdict(out, "send: %s", strerror(errno));
    }
    if (c->sent == c->size && !c->shut) {
        shutdown(c->fd, SHUT_WR); /* the server sees EOF once it has read it all */
        c->shut = true;
    }

    /* Read what has come back, checking every byte. */
    for (;;) {
        unsigned char buf[4096];
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            for (ssize_t i = 0; i < n; i++, c->got++) {
                if (c->got >= c->sent)
                    return verdict(out, "got byte %zu back, but sent only %zu", c->got, c->sent);
                if (buf[i] != pattern(c->id, c->got))
                    return verdict(out, "byte %zu: got 0x%02x, sent 0x%02x", c->got, buf[i],
                                   pattern(c->id, c->got));
            }
        } else if (n == 0) {
            if (c->got != c->size)
                return verdict(out, "the server closed after %zu of %zu bytes", c->got, c->size);
            return verdict(out, "%s", ""); /* every byte came back */
        } else if (would_block()) {
            break;
        } else if (errno != EINTR) {
            return verdict(out, "recv: %s", strerror(errno));
        }
    }
    return park_on(ctx, c->fd, ATAP_READABLE | (c->sent < c->size ? ATAP_WRITABLE : 0),
                   CLIENT_TIMEOUT);
}

/* Serves on a free port, runs n clients at once, checks them all. */
static int self_test(int n)
{
    atap_task server, *clients = calloc((size_t)n, sizeof *clients);
    int port = start_server(0, tiny_buffer, &server), failed = 0;
    long bytes = 0;
    atap_spawn_opts opts = {.out_size = sizeof(struct verdict), .arg_free = client_free};

    if (!clients) {
        perror("echo_server: calloc");
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        struct client *c = calloc(1, sizeof *c);
        int rc = c ? 0 : -ENOMEM;
        if (c) {
            *c = (struct client){.id = (unsigned)i, .port = port, .fd = -1};
            c->size = 2048 + (size_t)i * 7919 % 10240; /* 2 to 12 KB */
            bytes += (long)c->size;
            rc = atap_spawn(&clients[i], client, c, &opts);
        }
        if (rc != 0) {
            fprintf(stderr, "echo_server: client %d: atap_spawn: %s\n", i, atap_strerror(rc));
            free(c);
            clients[i] = ATAP_NO_TASK; /* joins read ATAP_ENOTASK */
        }
    }

    /* Every client ends within CLIENT_TIMEOUT of its last progress; the
     * join's own limit only guards against a lost task. */
    uint64_t give_up = atap_now() + ATAP_SEC(120);
    for (int i = 0; i < n; i++) {
        struct verdict v = {""};
        uint64_t now = atap_now();
        int rc = atap_join_for(clients[i], &v, sizeof v, give_up > now ? give_up - now : 0);
        if (rc != 0)
            snprintf(v.why, sizeof v.why, "no verdict: %s", atap_strerror(rc));
        if (v.why[0] != '\0' && failed++ < 10)
            printf("client %d: %s\n", i, v.why);
        atap_cancel(clients[i]); /* a no-op unless it never finished */
        atap_release(clients[i]);
    }
    if (failed > 10)
        printf("... and %d more\n", failed - 10);

    /* The server side: every connection task should have seen its EOF. */
    for (int i = 0; i < 500 && atomic_load(&conns_open) > 0; i++)
        usleep(10000);
    printf("server: %ld connections accepted, %ld bytes echoed (%ld sent), "
           "%ld waits for WRITABLE, %ld still open\n",
           atomic_load(&conns_accepted), atomic_load(&bytes_echoed), bytes,
           atomic_load(&write_parks), atomic_load(&conns_open));
    if (atomic_load(&conns_accepted) != n || atomic_load(&conns_open) != 0 ||
        atomic_load(&bytes_echoed) != bytes)
        failed++;

    atap_cancel(server); /* takes down its park; arg_free closes the socket */
    atap_release(server);
    free(clients);
    if (failed) {
        printf("%d clients, %d failures\n", n, failed);
        return 1;
    }
    printf("%d clients, all echoes correct\n", n);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* main                                                                    */
/* ---------------------------------------------------------------------- */

/* Lifts the soft fd limit to the hard one; returns how many fds we may
 * have open. */
static long raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1000000 ? 1000000 : (long)rl.rlim_cur;
}

static void usage(void)
{
    fprintf(stderr, "usage: echo_server [port]\n       echo_server --clients N\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int port = 0, clients = 0, rc;
    long fds = raise_fd_limit();

    if (argc == 3 && strcmp(argv[1], "--clients") == 0) {
        clients = atoi(argv[2]);
        if (clients <= 0)
            usage();
    } else if (argc == 2) {
        port = atoi(argv[1]);
        if (port < 0 || port > 65535)
            usage();
    } else if (argc != 1) {
        usage();
    }
    /* Each client needs two fds (its end and the server's), plus some for
     * the runtime's threads and stdio. */
    if (clients > 0 && clients > (fds - 100) / 2) {
        int fit = fds > 100 ? (int)((fds - 100) / 2) : 1;
        printf("the fd limit is %ld: running %d clients instead of %d\n", fds, fit, clients);
        clients = fit;
    }

    /* A write to a socket the peer closed fails with EPIPE instead of
     * killing the process. In serve mode SIGINT and SIGTERM are blocked
     * before the runtime starts its threads (which inherit the mask), so
     * only sigwait below receives them. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    if (!clients)
        pthread_sigmask(SIG_BLOCK, &stop, NULL);

    if ((rc = atap_init(NULL)) != 0) {
        fprintf(stderr, "echo_server: atap_init: %s\n", atap_strerror(rc));
        return 1;
    }
    if (clients) {
        rc = self_test(clients);
    } else {
        atap_task server;
        int sig;
        start_server(port, 0, &server);
        sigwait(&stop, &sig);
        printf("\n%s: %ld connections served, %ld still open\n", strsignal(sig),
               atomic_load(&conns_accepted), atomic_load(&conns_open));
        atap_cancel(server);
        atap_release(server);
    }
    /* Shutdown ends the connection tasks still parked (arg_free closes them). */
    atap_shutdown();
    return rc;
}

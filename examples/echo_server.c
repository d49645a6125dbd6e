/*
 * echo_server: a TCP echo server on libatap's socket built-ins.
 *
 *   listener     a task that accepts (atap_net_prep_accept + atap_net_step)
 *                and spawns one connection task per client. With nothing
 *                to accept, atap_net_step parks it on the listening socket.
 *   connection   a task that alternates two operations on one io and one
 *                buffer: recv what has come, send it all back; on EOF it
 *                closes the socket and finishes. atap_net_step parks the
 *                task whenever the kernel has nothing for it, so a thousand
 *                idle connections hold a thousand table slots and no thread,
 *                and a connection allocates nothing after it starts.
 *
 * A task that parks is run again from the top of its function: what it must
 * remember (the io, the buffer, where it is) lives in its arg, which
 * arg_free closes and frees, also when shutdown ends a task still parked.
 *
 * Usage:
 *   echo_server [port]        serve 127.0.0.1:port (0 or none: any free port)
 *                             until SIGINT or SIGTERM
 *   echo_server --clients N   self-test: serve on a free port and run N
 *                             client tasks that each send a few KB (a send
 *                             task of their own) while they read the echo
 *                             back and check every byte; exits 0 only if all
 *                             N did
 */
#include <atap.h>
#include <errno.h>
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

#define CLIENT_TIMEOUT ATAP_SEC(60) /* a client not done by then fails */

/* What the server did, for the self-test's summary. */
static atomic_long conns_accepted, conns_open, bytes_echoed;

/* ---------------------------------------------------------------------- */
/* The server                                                              */
/* ---------------------------------------------------------------------- */

struct conn {
    int fd;
    bool sending; /* the io holds a send (else a recv) */
    atap_net_io io;
    char buf[16384];
};

static void conn_free(void *arg)
{
    struct conn *c = arg;
    close(c->fd);
    free(c);
    atomic_fetch_sub(&conns_open, 1);
}

/* A connection task: recv, send it back, again, until EOF or an error. */
static int connection(atap_ctx *ctx, void *arg, void *out)
{
    struct conn *c = arg;
    atap_net_out r;
    int rc;

    (void)out;
    for (;;) {
        if ((rc = atap_net_step(ctx, &c->io, &r)) != 0)
            return rc; /* ATAP_PARKED: run again when the socket is ready */
        if (r.rc != 0 || (!c->sending && r.n == 0))
            return 0; /* EOF or an error (a reset): arg_free closes */
        if (c->sending)
            atap_net_prep_recv(&c->io, c->fd, c->buf, sizeof c->buf);
        else
            atap_net_prep_send(&c->io, c->fd, c->buf, (size_t)r.n);
        atomic_fetch_add(&bytes_echoed, c->sending ? 0 : r.n);
        c->sending = !c->sending;
    }
}

struct listener {
    int fd;
    atap_net_io io;
};

static void listener_free(void *arg)
{
    struct listener *l = arg;
    close(l->fd);
    free(l);
}

static void serve(int fd)
{
    struct conn *c = malloc(sizeof *c);
    atap_task t;
    int rc = c ? 0 : -ENOMEM;

    if (c) {
        c->fd = fd;
        c->sending = false;
        atap_net_prep_recv(&c->io, fd, c->buf, sizeof c->buf);
        atomic_fetch_add(&conns_open, 1);
        rc = atap_spawn(&t, connection, c, &(atap_spawn_opts){.arg_free = conn_free});
    }
    if (rc != 0) {
        fprintf(stderr, "echo_server: a connection: %s\n", atap_strerror(rc));
        if (c)
            conn_free(c);
        else
            close(fd);
        return;
    }
    atomic_fetch_add(&conns_accepted, 1);
    atap_release(t); /* it runs on; arg_free cleans up when it ends */
}

/* The listener task: accepts until cancelled, parking in between. */
static int listener(atap_ctx *ctx, void *arg, void *out)
{
    struct listener *l = arg;
    atap_net_out r;
    int rc;

    (void)out;
    for (;;) {
        if ((rc = atap_net_step(ctx, &l->io, &r)) != 0)
            return rc;
        if (r.rc != 0) {
            /* The listening socket failed. Running out of fds is no
             * failure: the accept waits for one to come free (atap.h). */
            fprintf(stderr, "echo_server: accept: %s\n", atap_strerror(r.rc));
            return 0;
        }
        serve(r.fd);
        atap_net_prep_accept(&l->io, l->fd, NULL, NULL);
    }
}

/* Listens on 127.0.0.1:port (0: any free port) and spawns the listener
 * into *task; returns the port. buffer > 0: each connection's buffers as
 * small as the kernel allows (they inherit the listening socket's). */
static int start_server(int port, int buffer, atap_task *task)
{
    struct listener *l = malloc(sizeof *l);
    char name[32];
    int rc;

    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    if (!l || (rc = atap_net_listen(&l->fd, name, 0)) != 0) {
        fprintf(stderr, "echo_server: listen on %s: %s\n", name,
                l ? atap_strerror(rc) : "no memory");
        exit(1);
    }
    if (buffer > 0)
        setsockopt(l->fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    port = atap_net_local_port(l->fd);
    atap_net_prep_accept(&l->io, l->fd, NULL, NULL);
    if ((rc = atap_spawn(task, listener, l, &(atap_spawn_opts){.arg_free = listener_free})) != 0) {
        fprintf(stderr, "echo_server: atap_spawn: %s\n", atap_strerror(rc));
        exit(1);
    }
    printf("echo_server: listening on 127.0.0.1:%d\n", port);
    fflush(stdout);
    return port;
}

/* ---------------------------------------------------------------------- */
/* The self-test's clients                                                 */
/* ---------------------------------------------------------------------- */

/* The smallest buffers the kernel allows (it rounds 2 KB up to about
 * 4 KB), so that an echo of a few KB often does not fit at once and the
 * server's sends park for WRITABLE, as for a slow client. */
static const int tiny_buffer = 2048;

enum step { CONNECTING, ECHOING, CLOSING };

struct client {
    unsigned id;
    enum step step;
    int fd;
    char name[32];
    size_t size, got;    /* bytes to send; echoed back and checked */
    unsigned char *data; /* what it sends, kept until the send lets go */
    atap_net_io io, send_io;
    atap_task send; /* the send task, running beside the reads */
    unsigned char buf[4096];
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
    if (c->send.id) { /* ended early: stop the send before its bytes go */
        atap_cancel(c->send);
        atap_net_release(c->send, &c->send_io);
    }
    atap_net_abandon(&c->io); /* a connect still under way */
    if (c->fd >= 0)
        close(c->fd);
    free(c->data);
    free(c);
}

static int verdict(void *out, const char *fmt, ...)
{
    struct verdict *v = out;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    return 0;
}

/* Connected: the send goes as a task of its own while this one reads. */
static int start_echo(struct client *c, void *out)
{
    int rc;

    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &tiny_buffer, sizeof tiny_buffer);
    atap_net_prep_send(&c->send_io, c->fd, c->data, c->size);
    if ((rc = atap_net_spawn(&c->send, &c->send_io, NULL)) != 0)
        return verdict(out, "spawn send: %s", atap_strerror(rc));
    atap_net_prep_recv(&c->io, c->fd, c->buf, sizeof c->buf);
    c->step = ECHOING;
    return 0;
}

/* Checks what came back; once it all has, half-closes and waits for the
 * server's EOF. Returns 1 to go on, 0 with a verdict to end. */
static int echoed(struct client *c, const atap_net_out *r, void *out)
{
    if (r->rc != 0)
        return verdict(out, "recv: %s", atap_strerror(r->rc)), 0;
    if (r->n == 0)
        return verdict(out, "the server closed after %zu of %zu bytes", c->got, c->size), 0;
    for (int64_t i = 0; i < r->n; i++, c->got++) {
        if (c->got >= c->size || c->buf[i] != pattern(c->id, c->got))
            return verdict(out, "byte %zu: got 0x%02x", c->got, c->buf[i]), 0;
    }
    if (c->got == c->size) { /* all of it sent, so the send is done */
        atap_net_out s;
        int rc = atap_net_join(c->send, &s);
        atap_net_release(c->send, &c->send_io);
        c->send = ATAP_NO_TASK;
        if (rc != 0)
            return verdict(out, "send: %s", atap_strerror(rc)), 0;
        atap_net_shutdown_write(c->fd); /* the server reads EOF and closes */
        c->step = CLOSING;
    }
    atap_net_prep_recv(&c->io, c->fd, c->buf, sizeof c->buf);
    return 1;
}

/* A client task: connect, send `size` pattern bytes while reading the echo
 * back, then half-close and succeed on the server's EOF. */
static int client(atap_ctx *ctx, void *arg, void *out)
{
    struct client *c = arg;
    atap_net_out r;
    int rc;

    for (;;) {
        if ((rc = atap_net_step(ctx, &c->io, &r)) != 0)
            return rc;
        switch (c->step) {
        case CONNECTING:
            if (r.rc != 0)
                return verdict(out, "connect: %s", atap_strerror(r.rc));
            c->fd = r.fd;
            if ((rc = start_echo(c, out)) != 0 || c->step != ECHOING)
                return rc;
            break;
        case ECHOING:
            if (!echoed(c, &r, out))
                return 0;
            break;
        case CLOSING:
            if (r.rc != 0 || r.n != 0)
                return verdict(out, "after the echo: %zd more bytes, %s", (ssize_t)r.n,
                               atap_strerror(r.rc));
            return verdict(out, "%s", ""); /* every byte came back */
        }
    }
}

static struct client *new_client(unsigned id, int port)
{
    struct client *c = calloc(1, sizeof *c);

    if (!c)
        return NULL;
    c->id = id;
    c->fd = -1;
    c->size = 2048 + (size_t)id * 7919 % 10240; /* 2 to 12 KB */
    if (!(c->data = malloc(c->size))) {
        free(c);
        return NULL;
    }
    for (size_t i = 0; i < c->size; i++)
        c->data[i] = pattern(id, i);
    snprintf(c->name, sizeof c->name, "127.0.0.1:%d", port);
    atap_net_prep_connect(&c->io, c->name);
    return c;
}

/* Serves on a free port, runs n clients at once, checks them all. */
static int self_test(int n)
{
    atap_task server, *clients = calloc((size_t)n, sizeof *clients);
    int port = start_server(0, tiny_buffer, &server), failed = 0;
    long bytes = 0;
    atap_spawn_opts opts = {
        .out_size = sizeof(struct verdict), .arg_free = client_free, .timeout_ns = CLIENT_TIMEOUT};

    if (!clients) {
        perror("echo_server: calloc");
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        struct client *c = new_client((unsigned)i, port);
        int rc = c ? atap_spawn(&clients[i], client, c, &opts) : -ENOMEM;
        if (rc != 0) {
            fprintf(stderr, "echo_server: client %d: %s\n", i, atap_strerror(rc));
            if (c)
                client_free(c);
            clients[i] = ATAP_NO_TASK; /* joins read ATAP_ENOTASK */
        } else {
            bytes += (long)c->size;
        }
    }
    for (int i = 0; i < n; i++) {
        struct verdict v = {""};
        int rc = atap_join(clients[i], &v, sizeof v);
        if (rc != 0)
            snprintf(v.why, sizeof v.why, "no verdict: %s", atap_strerror(rc));
        if (v.why[0] != '\0' && failed++ < 10)
            printf("client %d: %s\n", i, v.why);
        atap_release(clients[i]);
    }
    if (failed > 10)
        printf("... and %d more\n", failed - 10);

    /* The server side: every connection task should have seen its EOF. */
    for (int i = 0; i < 500 && atomic_load(&conns_open) > 0; i++)
        usleep(10000);
    printf("server: %ld connections accepted, %ld bytes echoed (%ld sent), %ld still open\n",
           atomic_load(&conns_accepted), atomic_load(&bytes_echoed), bytes,
           atomic_load(&conns_open));
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

    /* In serve mode SIGINT and SIGTERM are blocked before the runtime
     * starts its threads (which inherit the mask), so only sigwait below
     * receives them. (Sends never raise SIGPIPE: the built-ins ask so.) */
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

/*
 * http_hello: an HTTP/1.1 server that answers every request with the same
 * 13-byte body, "Hello, World!", keeping the connection open (keep-alive).
 *
 * One task per connection, which does its socket operations one after the
 * other with atap_net_step and parks between them (no thread held):
 *
 *   read    atap_net_prep_recv_until: buffered input up to "\r\n\r\n" (a
 *           request: no body is expected). Requests that arrived together
 *           (pipelined) are all answered by one send.
 *   write   atap_net_prep_send: the responses, then read again.
 *
 * The io, the reader and its buffer live in the connection's arg: nothing
 * is allocated per request. The connection's socket is kept (atap_fd_keep)
 * from accept to close: watched once, so a park makes no system call.
 *
 * Usage:
 *   http_hello [--port P] [--threads T]   serve 127.0.0.1:P (default 8080;
 *                                         0: any free port) with T workers
 *                                         until SIGINT or SIGTERM
 *   http_hello --self-test                serve on a free port, make a few
 *                                         requests, check the answers, exit
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <atap.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RESPONSE                                                                                   \
    "HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, World!"
#define RESPONSE_LEN (sizeof RESPONSE - 1)
#define MAX_REQUEST 4096 /* a longer request closes the connection */
#define MAX_BATCH 64     /* pipelined requests answered by one send */

static char responses[MAX_BATCH * RESPONSE_LEN];

struct conn {
    int fd;
    bool writing;
    atap_net_io io;
    atap_net_reader in;
    char buf[MAX_REQUEST];
};

static void conn_free(void *arg)
{
    struct conn *c = arg;
    atap_fd_unkeep(c->fd); /* before the close: the number may be reused */
    close(c->fd);
    free(c);
}

/* Drops the request of `len` bytes and any more complete ones buffered
 * behind it; returns how many went. */
static size_t take_requests(struct conn *c, size_t len)
{
    size_t k = 0, have;
    const char *p, *end;

    do {
        atap_net_reader_consume(&c->in, len);
        k++;
        p = atap_net_reader_data(&c->in, &have);
        end = have >= 4 ? memmem(p, have, "\r\n\r\n", 4) : NULL;
        len = end ? (size_t)(end - p) + 4 : 0;
    } while (end && k < MAX_BATCH);
    return k;
}

static int connection(atap_ctx *ctx, void *arg, void *out)
{
    struct conn *c = arg;
    atap_net_out r;
    int rc;

    (void)out;
    for (;;) {
        if ((rc = atap_net_step(ctx, &c->io, &r)) != 0)
            return rc; /* parked */
        if (r.rc != 0)
            return 0; /* closed, too long, reset: arg_free closes */
        if (c->writing) {
            atap_net_prep_recv_until(&c->io, &c->in, "\r\n\r\n", 4, sizeof c->buf);
        } else {
            size_t k = take_requests(c, (size_t)r.n);
            atap_net_prep_send(&c->io, c->fd, responses, k * RESPONSE_LEN);
        }
        c->writing = !c->writing;
    }
}

struct listener {
    int fd;
    atap_net_io io;
};

static void serve(int fd)
{
    struct conn *c = malloc(sizeof *c);

    if (!c) {
        close(fd);
        return;
    }
    c->fd = fd;
    c->writing = false;
    atap_net_set_nodelay(fd, true);
    atap_fd_keep(fd); /* failing, its parks are armed one at a time, as ever */
    atap_net_reader_init(&c->in, fd, c->buf, sizeof c->buf);
    atap_net_prep_recv_until(&c->io, &c->in, "\r\n\r\n", 4, sizeof c->buf);
    /* No handle: it runs on, and arg_free closes the socket at its end. */
    if (atap_spawn_detached(connection, c, &(atap_spawn_opts){.arg_free = conn_free}) != 0)
        conn_free(c);
}

/* Accepts until cancelled, parking while nobody connects. */
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
            fprintf(stderr, "http_hello: accept: %s\n", atap_strerror(r.rc));
            return 0;
        }
        serve(r.fd);
        atap_net_prep_accept(&l->io, l->fd, NULL, NULL);
    }
}

static int start(int port, atap_task *task, struct listener *l)
{
    char name[32];
    int rc;

    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    if ((rc = atap_net_listen(&l->fd, name, 1024)) != 0) {
        fprintf(stderr, "http_hello: listen on %s: %s\n", name, atap_strerror(rc));
        exit(1);
    }
    atap_net_prep_accept(&l->io, l->fd, NULL, NULL);
    if ((rc = atap_spawn(task, listener, l, NULL)) != 0) {
        fprintf(stderr, "http_hello: atap_spawn: %s\n", atap_strerror(rc));
        exit(1);
    }
    return atap_net_local_port(l->fd);
}

/* A client on the calling thread: two requests in one write, then one. */
static int self_test(int port)
{
    static const char two[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char one[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    char name[32], got[3 * RESPONSE_LEN];
    atap_net_io io;
    atap_net_out r;
    int fd, rc;

    snprintf(name, sizeof name, "127.0.0.1:%d", port);
    atap_net_prep_connect(&io, name);
    if ((rc = atap_net_run(&io, &r)) != 0)
        return fprintf(stderr, "connect: %s\n", atap_strerror(rc)), 1;
    fd = r.fd;
    atap_net_prep_send(&io, fd, two, sizeof two - 1);
    atap_net_run(&io, NULL);
    atap_net_prep_recv_exact(&io, fd, got, 2 * RESPONSE_LEN);
    if ((rc = atap_net_run(&io, NULL)) != 0 || memcmp(got, responses, 2 * RESPONSE_LEN) != 0)
        return fprintf(stderr, "pipelined answers: %s\n", rc ? atap_strerror(rc) : "wrong"), 1;
    atap_net_prep_send(&io, fd, one, sizeof one - 1);
    atap_net_run(&io, NULL);
    atap_net_prep_recv_exact(&io, fd, got, RESPONSE_LEN);
    if ((rc = atap_net_run(&io, NULL)) != 0 || memcmp(got, RESPONSE, RESPONSE_LEN) != 0)
        return fprintf(stderr, "keep-alive answer: %s\n", rc ? atap_strerror(rc) : "wrong"), 1;
    close(fd);
    printf("http_hello: 3 requests on one connection answered\n");
    return 0;
}

int main(int argc, char **argv)
{
    int port = 8080, threads = 0, test = 0, rc, sig;
    atap_task server;
    struct listener l;
    sigset_t stop;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--self-test"))
            test = 1, port = 0;
        else
            return fprintf(stderr, "usage: http_hello [--port P] [--threads T] | --self-test\n"), 2;
    }
    for (int i = 0; i < MAX_BATCH; i++)
        memcpy(responses + (size_t)i * RESPONSE_LEN, RESPONSE, RESPONSE_LEN);
    /* SIGINT and SIGTERM go to sigwait below only: blocked before the
     * runtime's threads start (they inherit the mask). */
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    if ((rc = atap_init(&(atap_config){.size = sizeof(atap_config),
                                       .workers = threads > 0 ? (unsigned)threads : 0})) != 0) {
        fprintf(stderr, "http_hello: atap_init: %s\n", atap_strerror(rc));
        return 1;
    }
    port = start(port, &server, &l);
    if (test) {
        rc = self_test(port);
    } else {
        printf("http_hello: listening on 127.0.0.1:%d\n", port);
        fflush(stdout);
        sigwait(&stop, &sig);
        rc = 0;
    }
    atap_cancel(server);
    atap_release(server);
    atap_shutdown(); /* ends the connections still parked: arg_free closes them */
    close(l.fd);
    return rc;
}

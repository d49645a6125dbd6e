/*
 * Sockets as tasks: TCP, UDP and Unix connect, accept, send, recv,
 * recv_exact, recv_until, send_to, recv_from. This file prepares them
 * (atap_net_prep_*) and runs them (the task, atap_net_spawn, atap_net_run,
 * atap_net_step), and has the reader a recv_until buffers in. Sockets,
 * names and the plain calls that never wait are net_sock.c's (net_int.h
 * has what the two files share).
 *
 * An operation's whole state is the caller's atap_net_io: the task's arg
 * is the io itself, so a run that parks and is run again (atap_resumed)
 * starts from the top of net_task and goes on from io->done. Nothing is
 * allocated per operation but a connect's copy of its name and its
 * address list, which the task's arg_free (let_go) lets go with any socket
 * still connecting, also when a cancel, a timeout or a shutdown took the
 * task down while it was parked. arg_free is the last thing of libatap's
 * to touch the io: it clears busy, which atap_net_release waits for, since
 * a cancelled run may still be in a system call after its join returned.
 * The output (atap_net_out, 16 bytes) fits the slot's park tail, so a
 * parked operation costs its slot and nothing else.
 *
 * The fds made here (a connect's, an accept's) keep net_sock.c's rule:
 * close-on-exec and non-blocking, atomically with accept4 where the
 * platform has it. Sends never raise SIGPIPE (MSG_NOSIGNAL, or
 * SO_NOSIGPIPE on the socket where there is no such flag; a write to a
 * pipe, and a sendfile, with SIGPIPE blocked: pipe_guard). Only public
 * calls are used besides libc: it sits on the public header and the park
 * API (layer 9).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, memmem, MSG_CMSG_CLOEXEC */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/sendfile.h>
#endif
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../abi.h"
#include "../atomics.h"
#include "../testing.h"
#include "atap.h"
#include "net_int.h"

enum {
    OP_NONE,
    OP_CONNECT,
    OP_UNIX_CONNECT,
    OP_ACCEPT,
    OP_SEND,
    OP_RECV,
    OP_RECV_EXACT,
    OP_SEND_TO,
    OP_RECV_FROM,
    OP_RECV_UNTIL,
    OP_SENDV,
    OP_SENDMSG,
    OP_RECVMSG,
    OP_SENDFILE,
    OP_LAST = OP_SENDFILE,
};

#define UNIX_RETRY_NS ATAP_MS(1)

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS MSG_NOSIGNAL
#else
#define SEND_FLAGS 0
#endif

/* ---- the reader -------------------------------------------------------- */

int atap_net_reader_init(atap_net_reader *r, int fd, void *buf, size_t cap)
{
    if (!r || !buf || cap == 0)
        return ATAP_EINVAL;
    *r = (atap_net_reader){.fd = fd, .buf = buf, .cap = cap};
    return 0;
}

const void *atap_net_reader_data(const atap_net_reader *r, size_t *len)
{
    if (len)
        *len = r ? r->end - r->start : 0;
    return r ? r->buf + r->start : NULL;
}

void atap_net_reader_consume(atap_net_reader *r, size_t n)
{
    if (!r)
        return;
    if (n > r->end - r->start)
        n = r->end - r->start;
    r->start += n;
    if (r->start == r->end)
        r->start = r->end = 0;
}

/* ---- preparing --------------------------------------------------------- */

static void prep(atap_net_io *io, int op, int fd, const void *buf, size_t len)
{
    *io = (atap_net_io){.fd = fd, .op = op, .buf = (void *)buf, .len = len, .pending = -1};
}

int atap_net_prep_connect(atap_net_io *io, const char *name)
{
    char host[HOST_MAX];
    const char *port;

    if (!io || atap__net_split_name(name, host, sizeof host, &port) != 0 || !*port)
        return ATAP_EINVAL;
    prep(io, OP_CONNECT, -1, NULL, 0);
    io->name = name;
    return 0;
}

int atap_net_prep_connect_opts(atap_net_io *io, const char *name, const atap_net_opts *opts)
{
    int rc;

    if (atap__net_check_opts(opts, true) != 0 || (rc = atap_net_prep_connect(io, name)) != 0)
        return ATAP_EINVAL;
    io->buf = (void *)opts; /* a connect's options (spawned: libatap's copy) */
    return 0;
}

int atap_net_prep_unix_connect(atap_net_io *io, const char *path)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (!io)
        return ATAP_EINVAL;
    if ((rc = atap_net_unix_addr((struct sockaddr *)&ss, &len, path)) != 0)
        return rc;
    prep(io, OP_UNIX_CONNECT, -1, NULL, 0);
    io->name = path;
    return 0;
}

int atap_net_prep_accept(atap_net_io *io, int lfd, struct sockaddr *peer, socklen_t *peer_len)
{
    if (!io || (peer && !peer_len))
        return ATAP_EINVAL;
    prep(io, OP_ACCEPT, lfd, NULL, 0);
    io->addr = peer;
    io->addrlen = peer ? peer_len : NULL;
    return 0;
}

static int prep_buf(atap_net_io *io, int op, int fd, const void *buf, size_t len)
{
    if (!io || (!buf && len))
        return ATAP_EINVAL;
    prep(io, op, fd, buf, len);
    return 0;
}

int atap_net_prep_send(atap_net_io *io, int fd, const void *buf, size_t len)
{
    return prep_buf(io, OP_SEND, fd, buf, len);
}

/* The bytes of iov[0..n) in all, into *total: false past SSIZE_MAX. */
static bool iov_total(const struct iovec *iov, size_t n, size_t *total)
{
    size_t t = 0;

    for (size_t i = 0; i < n; i++) {
        if (iov[i].iov_len > (size_t)SSIZE_MAX - t)
            return false;
        t += iov[i].iov_len;
    }
    *total = t;
    return true;
}

int atap_net_prep_sendv(atap_net_io *io, int fd, const struct iovec *iov, int iovcnt)
{
    size_t total;

    if (!io || iovcnt < 0 || iovcnt > ATAP_NET_IOV_MAX || (!iov && iovcnt > 0) ||
        !iov_total(iov, (size_t)iovcnt, &total))
        return ATAP_EINVAL;
    prep(io, OP_SENDV, fd, iov, total); /* buf: the array; len: its bytes */
    io->limit = (size_t)iovcnt;
    return 0;
}

/* 0, and the bytes of msg's buffers in *total; ATAP_EINVAL. */
static int check_msg(const atap_net_msg *msg, size_t *total)
{
    if (!msg || msg->iovcnt < 0 || msg->iovcnt > ATAP_NET_IOV_MAX ||
        (!msg->iov && msg->iovcnt > 0) || msg->nfds < 0 || msg->nfds > ATAP_NET_FDS_MAX ||
        (!msg->fds && msg->nfds > 0) || (msg->addr && msg->addrlen == 0) ||
        !iov_total(msg->iov, (size_t)msg->iovcnt, total))
        return ATAP_EINVAL;
    return 0;
}

int atap_net_prep_sendmsg(atap_net_io *io, int fd, const atap_net_msg *msg)
{
    size_t total;

    if (!io || check_msg(msg, &total) != 0 || (msg->nfds > 0 && total == 0))
        return ATAP_EINVAL;
    prep(io, OP_SENDMSG, fd, msg, total); /* buf: the message; len: its bytes */
    return 0;
}

int atap_net_prep_recvmsg(atap_net_io *io, int fd, atap_net_msg *msg)
{
    size_t total;

    if (!io || check_msg(msg, &total) != 0)
        return ATAP_EINVAL;
    prep(io, OP_RECVMSG, fd, msg, total); /* buf: the message; len: its room */
    io->limit = (size_t)msg->nfds;        /* the room for fds */
    msg->nfds = 0;
    msg->flags = 0;
    return 0;
}

int atap_net_prep_sendfile(atap_net_io *io, int fd, int file, int64_t offset, size_t count)
{
    if (!io || offset < 0 || (uint64_t)offset > SIZE_MAX ||
        (uint64_t)count > (uint64_t)(INT64_MAX - offset))
        return ATAP_EINVAL;
    /* len: the bytes to send (SIZE_MAX: to the end); limit: the offset;
     * to_len: the file. */
    prep(io, OP_SENDFILE, fd, NULL, count ? count : SIZE_MAX);
    io->limit = (size_t)offset;
    io->to_len = (socklen_t)file;
    return 0;
}

int atap_net_prep_recv(atap_net_io *io, int fd, void *buf, size_t len)
{
    return prep_buf(io, OP_RECV, fd, buf, len);
}

int atap_net_prep_recv_exact(atap_net_io *io, int fd, void *buf, size_t len)
{
    return prep_buf(io, OP_RECV_EXACT, fd, buf, len);
}

int atap_net_prep_send_to(atap_net_io *io, int fd, const void *buf, size_t len,
                          const struct sockaddr *to, socklen_t to_len)
{
    int rc;

    if (!to || (rc = prep_buf(io, OP_SEND_TO, fd, buf, len)) != 0)
        return ATAP_EINVAL;
    io->addr = (struct sockaddr *)to;
    io->to_len = to_len;
    return 0;
}

int atap_net_prep_recv_from(atap_net_io *io, int fd, void *buf, size_t len, struct sockaddr *from,
                            socklen_t *from_len)
{
    int rc;

    if ((from && !from_len) || (rc = prep_buf(io, OP_RECV_FROM, fd, buf, len)) != 0)
        return ATAP_EINVAL;
    io->addr = from;
    io->addrlen = from ? from_len : NULL;
    return 0;
}

int atap_net_prep_recv_until(atap_net_io *io, atap_net_reader *reader, const void *delim,
                             size_t delim_len, size_t limit)
{
    if (!io || !reader || !delim || delim_len == 0 || limit < delim_len || limit > reader->cap)
        return ATAP_EINVAL;
    prep(io, OP_RECV_UNTIL, reader->fd, delim, delim_len);
    io->reader = reader;
    io->limit = limit;
    return 0;
}

/* ---- running ----------------------------------------------------------- */

static int finish(atap_net_out *out, size_t n, int rc, int fd)
{
    *out = (atap_net_out){.n = (int64_t)n, .rc = rc, .fd = fd};
    return 0;
}

/* Parks until fd is ready for ev: the caller returns what this returns. A
 * park that cannot be set up ends the operation with its code. */
static int park(atap_ctx *ctx, atap_net_out *out, atap_net_io *io, unsigned ev)
{
    int rc = atap_park_fd(ctx, io->pending >= 0 ? io->pending : io->fd, ev, ATAP_FOREVER);

    return rc == 0 ? ATAP_PARKED : finish(out, io->done, rc, -1);
}

static bool again(int e) { return e == EAGAIN || e == EWOULDBLOCK; }

/* The socket's pending error, read and cleared (SO_ERROR): -errno, or 0. */
static int sock_error(int fd)
{
    int err = 0;
    socklen_t elen = sizeof err;

    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
        return -errno;
    return -err;
}

/* The connect under way finished: 1 connected, 0 still going, else the
 * error it ended with. A socket with no error and no peer is still
 * connecting, unless it is already hung up: then the connect failed and
 * someone else read its error first (an emulated kqueue reads SO_ERROR to
 * report it with the event, libkqueue on Linux, where reading clears it).
 * Parking again would wake at once for ever; the error is gone, so the
 * connect ends -ECONNABORTED. The error is read again after the look at
 * the hang-up, for one that came between the two. */
static int connect_result(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int rc;

    if ((rc = sock_error(fd)) != 0)
        return rc;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
        return 1;
    if (errno != ENOTCONN)
        return -errno;
    if (poll(&pfd, 1, 0) != 1 || !(pfd.revents & (POLLHUP | POLLERR)))
        return 0;
    rc = sock_error(fd);
    return rc != 0 ? rc : -ECONNABORTED;
}

static void connect_cleanup(void *arg)
{
    atap_net_io *io = arg;

    if (io->pending >= 0)
        close(io->pending);
    io->pending = -1;
    if (io->list)
        freeaddrinfo(io->list);
    io->list = io->next = NULL;
}

static int connected(atap_net_io *io, atap_net_out *out)
{
    int fd = io->pending;

    io->pending = -1;
    connect_cleanup(io);
    return finish(out, 0, 0, fd);
}

static int tcp_connect(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    int rc;

    if (!io->list && (rc = atap__net_resolve(io)) != 0)
        return finish(out, 0, rc, -1);
    for (;;) {
        struct addrinfo *ai;

        if (io->pending >= 0) { /* resumed: how did it go? */
            if ((rc = connect_result(io->pending)) == 1)
                return connected(io, out);
            if (rc == 0)
                return park(ctx, out, io, ATAP_WRITABLE);
            io->err = rc;
            close(io->pending);
            io->pending = -1;
        }
        if (!(ai = io->next)) {
            rc = io->err ? io->err : -ECONNREFUSED;
            connect_cleanup(io);
            return finish(out, 0, rc, -1);
        }
        io->next = ai->ai_next;
        if ((rc = atap__net_new_socket(ai->ai_family, SOCK_STREAM)) < 0) {
            io->err = rc;
            continue;
        }
        io->pending = rc;
        if ((rc = atap__net_connect_opts(rc, ai->ai_family, io->buf)) != 0) {
            io->err = rc;
            close(io->pending);
            io->pending = -1;
            continue;
        }
        if (connect(io->pending, ai->ai_addr, ai->ai_addrlen) == 0)
            return connected(io, out);
        if (errno == EINPROGRESS || errno == EINTR)
            return park(ctx, out, io, ATAP_WRITABLE);
        io->err = -errno;
        close(io->pending);
        io->pending = -1;
    }
}

static int unix_connect(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (io->pending >= 0 && io->err == EINPROGRESS) { /* resumed from WRITABLE */
        if ((rc = connect_result(io->pending)) == 1)
            return connected(io, out);
        if (rc == 0)
            return park(ctx, out, io, ATAP_WRITABLE);
        connect_cleanup(io);
        return finish(out, 0, rc, -1);
    }
    if ((rc = atap_net_unix_addr((struct sockaddr *)&ss, &len, io->name)) != 0)
        return finish(out, 0, rc, -1);
    if (io->pending < 0 && (io->pending = atap__net_new_socket(AF_UNIX, SOCK_STREAM)) < 0) {
        rc = io->pending;
        io->pending = -1;
        return finish(out, 0, rc, -1);
    }
    if (connect(io->pending, (struct sockaddr *)&ss, len) == 0)
        return connected(io, out);
    if (errno == EINPROGRESS) {
        io->err = EINPROGRESS;
        return park(ctx, out, io, ATAP_WRITABLE);
    }
    if (again(errno)) { /* the backlog is full (Linux): try again shortly */
        if ((rc = atap_park_until(ctx, atap_now() + UNIX_RETRY_NS)) != 0) {
            connect_cleanup(io);
            return finish(out, 0, rc, -1);
        }
        return ATAP_PARKED;
    }
    rc = -errno;
    connect_cleanup(io);
    return finish(out, 0, rc, -1);
}

/* No fd to accept into (the process's or the system's limit), or no
 * kernel memory for one: the connection stays queued on the listener. */
static bool out_of_fds(int e) { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }

/* An accept out of fds cannot park on the listener: it stays readable, so
 * the park would resume at once and the task would spin. It parks on a
 * deadline instead and tries again, ACCEPT_RETRY_NS first, then twice as
 * long each time, ACCEPT_RETRY_DOUBLINGS times at most (io->err counts them:
 * a connect's field, free in an accept, cleared by each prep and spawn),
 * so that a server out of fds makes a few calls a second and loses no
 * connection: what it could not accept waits in the kernel's queue. */
#define ACCEPT_RETRY_NS ATAP_MS(1)
#define ACCEPT_RETRY_DOUBLINGS 6 /* up to 64 ms */

static int accept_later(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    uint64_t wait = ACCEPT_RETRY_NS << io->err;
    int rc;

    if (io->err < ACCEPT_RETRY_DOUBLINGS)
        io->err++;
    if ((rc = atap_park_until(ctx, atap_now() + wait)) != 0)
        return finish(out, 0, rc, -1);
    return ATAP_PARKED;
}

static int do_accept(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    for (;;) {
        int fd, rc;
#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK) && (defined(__linux__) || defined(__FreeBSD__))
        fd = accept4(io->fd, io->addr, io->addrlen, SOCK_CLOEXEC | SOCK_NONBLOCK);
#else
        fd = accept(io->fd, io->addr, io->addrlen);
#endif
        if (fd >= 0) {
            if ((rc = atap__net_set_fd_flags(fd)) != 0) {
                close(fd);
                return finish(out, 0, rc, -1);
            }
            return finish(out, 0, 0, fd);
        }
        if (again(errno))
            return park(ctx, out, io, ATAP_READABLE);
        if (out_of_fds(errno))
            return accept_later(ctx, io, out);
        if (errno != EINTR && errno != ECONNABORTED)
            return finish(out, 0, -errno, -1);
    }
}

/* A write to a pipe (an fd that is not a socket: a child's stdin, say)
 * whose reader is gone, and a sendfile to a peer gone, have no
 * MSG_NOSIGNAL: they raise SIGPIPE at the calling thread. Such a write is
 * done with SIGPIPE blocked, and after an -EPIPE the one it raised is
 * taken back (unless one was pending before, which is left there) before
 * it is let go: the caller reads -EPIPE, and the process lives. */
struct pipe_guard {
    sigset_t old;
    bool pending;
};

static void pipe_block(struct pipe_guard *g)
{
    sigset_t set, pending;

    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
}

static void pipe_unblock(struct pipe_guard *g, bool epipe)
{
    sigset_t set, pending;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    /* sigwait takes the pending one at once (macOS has no sigtimedwait) */
    if (epipe && !g->pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
        sigwait(&set, &sig);
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* writev to an fd that is not a socket, raising no SIGPIPE (above). */
static ssize_t write_quiet(int fd, const struct iovec *iov, int n)
{
    struct pipe_guard g;
    ssize_t r;
    int e;

    pipe_block(&g);
    r = writev(fd, iov, n);
    e = errno;
    pipe_unblock(&g, r < 0 && e == EPIPE);
    errno = e;
    return r;
}

/* One send or receive call, with the fallback to write / read for an fd
 * that is not a socket (a pipe handed in). */
static ssize_t xfer(atap_net_io *io, bool send_dir)
{
    unsigned char *p = (unsigned char *)io->buf + io->done;
    size_t n = io->len - io->done;
    ssize_t r;

    if (send_dir) {
        if (io->op == OP_SEND_TO)
            return sendto(io->fd, p, n, SEND_FLAGS, io->addr, io->to_len);
        if ((r = send(io->fd, p, n, SEND_FLAGS)) < 0 && errno == ENOTSOCK)
            r = write_quiet(io->fd, &(struct iovec){.iov_base = p, .iov_len = n}, 1);
        return r;
    }
    if (io->op == OP_RECV_FROM)
        return recvfrom(io->fd, p, n, 0, io->addr, io->addrlen);
    if ((r = recv(io->fd, p, n, 0)) < 0 && errno == ENOTSOCK)
        r = read(io->fd, p, n);
    return r;
}

static int do_send(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    bool first = true;

    while (first || io->done < io->len) {
        ssize_t r = xfer(io, true);

        first = false;
        if (r >= 0) {
            io->done += (size_t)r;
            if (io->op == OP_SEND_TO)
                break;
        } else if (again(errno)) {
            return park(ctx, out, io, ATAP_WRITABLE);
        } else if (errno != EINTR) {
            return finish(out, io->done, -errno, -1);
        }
        if (atap_cancelled(ctx))
            return finish(out, io->done, ATAP_ECANCELLED, -1); /* dropped: io->done stands */
    }
    return finish(out, io->done, 0, -1);
}

/* A gathered send's next call sends from here on: a local copy of up to
 * IOV_BATCH buffers, the first cut, when the last call ended in the middle
 * of one; the caller's array itself otherwise (the kernel only reads it). */
#define IOV_BATCH 64

struct gather {
    struct iovec part[IOV_BATCH];
    struct msghdr m;
};

/* Fills g->m with what is left of iov[0..n) past `done` bytes. */
static void gather_from(struct gather *g, const struct iovec *iov, size_t n, size_t done)
{
    size_t i = 0, k;

    while (i < n && done >= iov[i].iov_len)
        done -= iov[i++].iov_len;
    memset(&g->m, 0, sizeof g->m);
    if (done == 0 || i == n) { /* i == n: all sent, which a caller never asks */
        g->m.msg_iov = (struct iovec *)(uintptr_t)(iov + i); /* read only, by the kernel */
        g->m.msg_iovlen = n - i;
        return;
    }
    k = n - i < IOV_BATCH ? n - i : IOV_BATCH;
    memcpy(g->part, iov + i, k * sizeof *iov);
    g->part[0].iov_base = (unsigned char *)g->part[0].iov_base + done;
    g->part[0].iov_len -= done;
    g->m.msg_iov = g->part;
    g->m.msg_iovlen = k;
}

/* Room for the most fds a message passes, aligned for its header. */
union fd_control {
    struct cmsghdr h;
    unsigned char b[CMSG_SPACE(sizeof(int) * ATAP_NET_FDS_MAX)];
};

/* A message's next sendmsg: its fds with the first bytes only (a call
 * that sent nothing, EAGAIN, sent none of them either). */
static ssize_t message_once(atap_net_io *io)
{
    const atap_net_msg *msg = io->buf;
    union fd_control ctl;
    struct gather g;

    gather_from(&g, msg->iov, (size_t)msg->iovcnt, io->done);
    g.m.msg_name = msg->addr;
    g.m.msg_namelen = msg->addr ? msg->addrlen : 0;
    if (msg->nfds > 0 && io->done == 0) {
        size_t n = (size_t)msg->nfds * sizeof(int);
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        struct cmsghdr *c;

        /* Not Unix: TCP and UDP would send the bytes and drop the fds. */
        ss.ss_family = AF_UNSPEC;
        if (getsockname(io->fd, (struct sockaddr *)&ss, &len) != 0)
            return -1;
        if (ss.ss_family != AF_UNIX) {
            errno = EOPNOTSUPP;
            return -1;
        }

        memset(ctl.b, 0, CMSG_SPACE(n));
        g.m.msg_control = ctl.b;
        g.m.msg_controllen = CMSG_SPACE(n);
        c = CMSG_FIRSTHDR(&g.m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n);
        memcpy(CMSG_DATA(c), msg->fds, n);
    }
    return sendmsg(io->fd, &g.m, SEND_FLAGS);
}

static ssize_t gather_once(atap_net_io *io)
{
    struct gather g;
    ssize_t r;

    if (io->op == OP_SENDMSG)
        return message_once(io);
    gather_from(&g, io->buf, io->limit, io->done);
    if ((r = sendmsg(io->fd, &g.m, SEND_FLAGS)) < 0 && errno == ENOTSOCK)
        r = write_quiet(io->fd, g.m.msg_iov, (int)g.m.msg_iovlen);
    return r;
}

/* A gathered send: as do_send, each call going on from io->done. */
static int do_sendv(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    bool first = true;

    while (first || io->done < io->len) {
        ssize_t r = gather_once(io);

        first = false;
        if (r >= 0)
            io->done += (size_t)r;
        else if (again(errno))
            return park(ctx, out, io, ATAP_WRITABLE);
        else if (errno != EINTR)
            return finish(out, io->done, -errno, -1);
        if (atap_cancelled(ctx))
            return finish(out, io->done, ATAP_ECANCELLED, -1);
    }
    return finish(out, io->done, 0, -1);
}

/* The fds that came with m into msg->fds, up to room (the kernel may give
 * one more than asked: CMSG_SPACE rounds up); those past it are closed.
 * Returns ATAP_NET_FDS_TRUNC if any was dropped, here or by the kernel. */
static unsigned take_fds(atap_net_msg *msg, size_t room, struct msghdr *m)
{
    unsigned flags = (m->msg_flags & MSG_CTRUNC) ? ATAP_NET_FDS_TRUNC : 0;

    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        const unsigned char *p = CMSG_DATA(c);
        size_t k;

        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        k = ((size_t)c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;

            memcpy(&fd, p + i * sizeof fd, sizeof fd);
            if ((size_t)msg->nfds >= room) {
                close(fd);
                flags |= ATAP_NET_FDS_TRUNC;
                continue;
            }
#ifndef MSG_CMSG_CLOEXEC
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
            msg->fds[msg->nfds++] = fd;
        }
    }
    return flags;
}

#ifdef MSG_CMSG_CLOEXEC
#define RECV_FD_FLAGS MSG_CMSG_CLOEXEC /* fds close-on-exec as they come */
#else
#define RECV_FD_FLAGS 0
#endif

/* One recvmsg: a room of 0 asks for nothing (as do_recv's). */
static int do_recvmsg(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    atap_net_msg *msg = io->buf;
    union fd_control ctl;
    struct msghdr m;
    ssize_t r;

    if (io->len == 0) {
        if (msg->addr)
            msg->addrlen = 0;
        return finish(out, 0, 0, -1);
    }
    for (;;) {
        memset(&m, 0, sizeof m);
        m.msg_iov = (struct iovec *)(uintptr_t)msg->iov; /* its buffers are written, not it */
        m.msg_iovlen = (size_t)msg->iovcnt;
        m.msg_name = msg->addr;
        m.msg_namelen = msg->addr ? msg->addrlen : 0;
        if (io->limit > 0) {
            m.msg_control = ctl.b;
            m.msg_controllen = CMSG_SPACE(io->limit * sizeof(int));
        }
        if ((r = recvmsg(io->fd, &m, RECV_FD_FLAGS)) >= 0) {
            msg->flags =
                take_fds(msg, io->limit, &m) | ((m.msg_flags & MSG_TRUNC) ? ATAP_NET_TRUNC : 0);
            if (msg->addr)
                msg->addrlen = m.msg_namelen;
            io->done = (size_t)r;
            return finish(out, io->done, 0, -1);
        }
        if (again(errno))
            return park(ctx, out, io, ATAP_READABLE);
        if (errno != EINTR)
            return finish(out, 0, -errno, -1);
        if (atap_cancelled(ctx))
            return finish(out, 0, ATAP_ECANCELLED, -1);
    }
}

/* ---- files to sockets ---------------------------------------------------- */

#define FILE_CHUNK (64u * 1024u) /* a sendfile's most bytes between looks at a cancel */

static _Atomic bool test_no_sendfile; /* atap__test_net_no_sendfile */

void atap__test_net_no_sendfile(bool on) { st_relaxed(&test_no_sendfile, on); }

static int file_of(const atap_net_io *io) { return (int)io->to_len; }

/* One chunk read from the file and sent: the bytes the socket took (the
 * rest is read again next time), 0 at the file's end, or -1 and errno. */
static ssize_t copy_chunk(atap_net_io *io, unsigned char *buf, size_t want)
{
    ssize_t n = pread(file_of(io), buf, want, (off_t)(io->limit + io->done)), r;

    if (n <= 0)
        return n;
    if ((r = send(io->fd, buf, (size_t)n, SEND_FLAGS)) < 0 && errno == ENOTSOCK)
        r = write(io->fd, buf, (size_t)n); /* do_sendfile's guard is up */
    return r;
}

#ifdef __linux__
#define HAVE_SENDFILE 1
/* One chunk by sendfile, or -1 and errno (EINVAL: the pair cannot). */
static ssize_t sendfile_chunk(atap_net_io *io, size_t want)
{
    off_t off = (off_t)(io->limit + io->done);

    return sendfile(io->fd, file_of(io), &off, want);
}

#else
#define HAVE_SENDFILE 0
static ssize_t sendfile_chunk(atap_net_io *io, size_t want)
{
    (void)io, (void)want;
    errno = ENOSYS;
    return -1;
}
#endif

/* A file to a socket, a chunk at a time from io->done: by sendfile where
 * the kernel will, else through a buffer of this run's (freed before it
 * parks or ends: a parked sendfile holds nothing). */
static int do_sendfile(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    bool copy = !HAVE_SENDFILE || ld_relaxed(&test_no_sendfile);
    bool full = false;
    unsigned char *buf = NULL;
    struct pipe_guard guard;
    int rc = 0;

    pipe_block(&guard);
    for (size_t want; (want = io->len - io->done) > 0;) {
        ssize_t r;

        if (want > FILE_CHUNK)
            want = FILE_CHUNK;
        if (!copy) {
            r = sendfile_chunk(io, want);
            if (r < 0 && (errno == EINVAL || errno == ENOSYS)) { /* the pair cannot */
                copy = true;
                continue;
            }
        } else {
            if (!buf && !(buf = malloc(FILE_CHUNK))) {
                rc = -ENOMEM;
                break;
            }
            r = copy_chunk(io, buf, want);
        }
        if (r == 0) /* the file's end */
            break;
        if (r > 0)
            io->done += (size_t)r;
        else if ((full = again(errno)))
            break;
        else if (errno != EINTR) {
            rc = -errno;
            break;
        }
        if (atap_cancelled(ctx)) {
            rc = ATAP_ECANCELLED;
            break;
        }
    }
    free(buf);
    pipe_unblock(&guard, rc == -EPIPE);
    return full ? park(ctx, out, io, ATAP_WRITABLE) : finish(out, io->done, rc, -1);
}

/* A read of 0 bytes asks for nothing, so it waits for nothing: it is done
 * before the first call. A recv of 0 bytes would wait for data (the kernel
 * wants a byte before it answers) and then say 0, which reads as a close;
 * on a datagram socket it would take a datagram and drop it. */
static int do_recv(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    if (io->len == 0) {
        if (io->addrlen)
            *io->addrlen = 0; /* no datagram, no sender */
        return finish(out, 0, 0, -1);
    }
    for (;;) {
        ssize_t r = xfer(io, false);

        if (r > 0 || (r == 0 && io->op != OP_RECV_EXACT)) {
            io->done += (size_t)r;
            if (io->op != OP_RECV_EXACT || io->done == io->len)
                return finish(out, io->done, 0, -1);
        } else if (r == 0) {
            return finish(out, io->done, ATAP_ECLOSED, -1);
        } else if (again(errno)) {
            return park(ctx, out, io, ATAP_READABLE);
        } else if (errno != EINTR) {
            return finish(out, io->done, -errno, -1);
        }
        if (atap_cancelled(ctx))
            return finish(out, io->done, ATAP_ECANCELLED, -1);
    }
}

/* Below this many bytes a search looks for the delimiter's first byte
 * and compares the rest at each, byte by byte: glibc's memmem sets up a
 * 256-byte table at every call, which costs more than searching a request
 * line or two (1.4 % of an HTTP server's CPU). Longer, memmem, whose time
 * stays linear whatever the bytes. */
#define SHORT_SEARCH 512

/* Where the delimiter starts in the first `within` buffered bytes, or
 * NULL. The search starts where the last one left off (io->done). */
static const unsigned char *find_delim(atap_net_io *io, size_t within)
{
    atap_net_reader *r = io->reader;
    size_t from = io->done >= io->len ? io->done - (io->len - 1) : 0;
    const unsigned char *at, *last, *delim = io->buf;
    size_t j;

    if (within < io->len || from > within - io->len)
        return NULL;
    at = r->buf + r->start + from;
    if (within - from >= SHORT_SEARCH)
        return memmem(at, within - from, delim, io->len);
    /* The delimiter may start at `last` at the latest. */
    for (last = r->buf + r->start + (within - io->len); at <= last; at++) {
        if (!(at = memchr(at, delim[0], (size_t)(last - at) + 1)))
            return NULL;
        j = 1; /* a few bytes: no call */
        while (j < io->len && at[j] == delim[j])
            j++;
        if (j == io->len)
            return at;
    }
    return NULL;
}

static int do_recv_until(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    atap_net_reader *r = io->reader;

    for (;;) {
        size_t have = r->end - r->start, within = have < io->limit ? have : io->limit;
        const unsigned char *at = find_delim(io, within);
        ssize_t n;

        if (at)
            return finish(out, (size_t)(at - (r->buf + r->start)) + io->len, 0, -1);
        io->done = within;
        if (have >= io->limit)
            return finish(out, have, ATAP_ETOOLONG, -1);
        if (r->end == r->cap) { /* room at the front: limit <= cap */
            memmove(r->buf, r->buf + r->start, have);
            r->start = 0;
            r->end = have;
        }
        /* The last recv came back short, so the socket was empty then:
         * wait for it to be readable before the next one (a recv now would
         * most likely find nothing, a wasted call each request on a
         * connection that answers one request at a time). A park watches
         * for what is ready, not for what changes: bytes already there
         * resume it at once. */
        if (r->drained) {
            r->drained = false;
            return park(ctx, out, io, ATAP_READABLE);
        }
        if ((n = recv(r->fd, r->buf + r->end, r->cap - r->end, 0)) < 0 && errno == ENOTSOCK)
            n = read(r->fd, r->buf + r->end, r->cap - r->end);
        if (n > 0) {
            r->drained = (size_t)n < r->cap - r->end;
            r->end += (size_t)n;
        } else if (n == 0)
            return finish(out, have, ATAP_ECLOSED, -1);
        else if (again(errno))
            return park(ctx, out, io, ATAP_READABLE);
        else if (errno != EINTR)
            return finish(out, have, -errno, -1);
        if (atap_cancelled(ctx))
            return finish(out, have, ATAP_ECANCELLED, -1);
    }
}

/* The operations added after the first ones, out of line: net_task, the
 * path of every accept, recv and send a server makes, is compiled as it
 * was before them. */
static __attribute__((noinline)) int more_task(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    switch (io->op) {
    case OP_SENDV:
    case OP_SENDMSG:
        return do_sendv(ctx, io, out);
    case OP_RECVMSG:
        return do_recvmsg(ctx, io, out);
    case OP_SENDFILE:
        return do_sendfile(ctx, io, out);
    default:
        return finish(out, 0, ATAP_EINVAL, -1);
    }
}

static int net_task(atap_ctx *ctx, void *arg, void *out_)
{
    atap_net_io *io = arg;
    atap_net_out *out = out_;

    switch (io->op) {
    case OP_CONNECT:
        return tcp_connect(ctx, io, out);
    case OP_UNIX_CONNECT:
        return unix_connect(ctx, io, out);
    case OP_ACCEPT:
        return do_accept(ctx, io, out);
    case OP_SEND:
    case OP_SEND_TO:
        return do_send(ctx, io, out);
    case OP_RECV:
    case OP_RECV_EXACT:
    case OP_RECV_FROM:
        return do_recv(ctx, io, out);
    case OP_RECV_UNTIL:
        return do_recv_until(ctx, io, out);
    default:
        return more_task(ctx, io, out);
    }
}

/* Every run of an io starts afresh. */
static void restart(atap_net_io *io)
{
    io->done = 0;
    io->err = 0;
    io->pending = -1;
    io->list = io->next = NULL;
}

static bool is_connect(const atap_net_io *io)
{
    return io->op == OP_CONNECT || io->op == OP_UNIX_CONNECT;
}

/* A connect whose host is a name to look up runs on the blocking threads. */
static bool needs_lookup(const atap_net_io *io)
{
    char host[HOST_MAX];
    const char *port;
    unsigned char tmp[sizeof(struct in6_addr)];

    if (io->op != OP_CONNECT || atap__net_split_name(io->name, host, sizeof host, &port) != 0)
        return false;
    if (host[0] == '\0' || inet_pton(AF_INET, host, tmp) == 1 ||
        inet_pton(AF_INET6, host, tmp) == 1)
        return false;
    return true;
}

/* A spawned connect's copy of what its prep was given: the options (zero
 * for none; a Unix connect has none), then the name, then the options'
 * local address. One block, io->buf, freed by let_go. */
struct connect_copy {
    atap_net_opts opts;
    char text[];
};

static int copy_connect(atap_net_io *io)
{
    const atap_net_opts *o = io->buf;
    size_t name = strlen(io->name) + 1, local = o && o->local ? strlen(o->local) + 1 : 0;
    struct connect_copy *c = malloc(sizeof *c + name + local);

    if (!c)
        return -ENOMEM;
    c->opts = o ? *o : (atap_net_opts){0};
    memcpy(c->text, io->name, name);
    if (local) {
        memcpy(c->text + name, o->local, local);
        c->opts.local = c->text + name;
    }
    io->buf = c;
    io->name = c->text;
    return 0;
}

/* The task's arg_free: the task is gone for good (its run over, its last
 * handle released), so nothing of libatap's touches io after the store of
 * busy, which atap_net_release waits for. */
static void let_go(void *arg)
{
    atap_net_io *io = arg;

    if (is_connect(io)) {
        connect_cleanup(io);
        free(io->buf); /* the copy of the name and options: prepare a connect again */
        io->buf = NULL;
        io->name = NULL;
    }
    st_plain_release(&io->busy, 0);
}

int atap_net_spawn(atap_task *task, atap_net_io *io, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (!io || io->op <= OP_NONE || io->op > OP_LAST ||
        (o.out_size != 0 && o.out_size != sizeof(atap_net_out)) || o.kind != ATAP_ONCE ||
        o.arg_free || o.out_free)
        return ATAP_EINVAL;
    if (is_connect(io) && !io->name)
        return ATAP_EINVAL;
    /* A connect's name and options need only live through this call. */
    if (is_connect(io) && (rc = copy_connect(io)) != 0)
        return rc;
    restart(io);
    o.out_size = sizeof(atap_net_out);
    o.blocking = io->op == OP_SENDFILE || needs_lookup(io); /* a disk read may wait */
    o.arg_free = let_go;
    st_plain_relaxed(&io->busy, 1); /* published by the spawn */
    if ((rc = atap_spawn(task, net_task, io, &o)) != 0) {
        io->busy = 1; /* arg_free is not called on a failed spawn */
        let_go(io);
    }
    return rc;
}

void atap_net_release(atap_task task, atap_net_io *io)
{
    unsigned spins = 0;

    atap_release(task);
    if (!io)
        return;
    while (ld_plain_acquire(&io->busy)) {
        if (++spins < 64)
            sched_yield();
        else
            atap_sleep_relaxed(ATAP_US(100));
    }
}

int atap_net_run(atap_net_io *io, atap_net_out *out)
{
    atap_net_out local;
    int rc;

    if (!io || io->op <= OP_NONE || io->op > OP_LAST || (is_connect(io) && !io->name))
        return ATAP_EINVAL;
    if (!out)
        out = &local;
    restart(io);
    rc = atap_block(net_task, io, out, sizeof *out);
    if (is_connect(io))
        connect_cleanup(io);
    return rc != 0 ? rc : out->rc;
}

int atap_net_step(atap_ctx *ctx, atap_net_io *io, atap_net_out *out)
{
    if (!ctx || !io || !out || io->op <= OP_NONE || io->op > OP_LAST ||
        (is_connect(io) && !io->name))
        return ATAP_EINVAL;
    return net_task(ctx, io, out);
}

void atap_net_abandon(atap_net_io *io)
{
    if (io && is_connect(io))
        connect_cleanup(io);
}

int atap_net_join(atap_task task, atap_net_out *out)
{
    atap_net_out local;
    int rc;

    if (!out)
        out = &local;
    if ((rc = atap_join(task, out, sizeof *out)) != 0)
        return rc;
    return out->rc;
}

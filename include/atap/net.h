/*
 * libatap's built-in tasks: sockets (TCP, UDP, Unix). Written on the runtime's public calls
 * alone (atap/core.h). <atap.h> includes this header; a program may
 * include it alone, with <atap/core.h>, to keep the other areas out.
 */
#ifndef ATAP_NET_H
#define ATAP_NET_H

#include <sys/socket.h> /* struct sockaddr, socklen_t */
#include <sys/uio.h>    /* struct iovec */
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Sockets: TCP, UDP, Unix                                                 */
/* ---------------------------------------------------------------------- */

/*
 * File descriptors are the currency: every call takes an fd, and any fd
 * the caller already has will do (one it hands in must be non-blocking for
 * a task to park rather than hold its thread: libatap's own fds are).
 * Every fd libatap creates is SOCK_CLOEXEC | SOCK_NONBLOCK and is the
 * caller's to close.
 *
 * Calls that never wait (listen, bind, the setters) are plain calls. Each
 * that may wait (connect, accept, send, recv...) is an operation in two
 * steps: an atap_net_prep_* call fills an atap_net_io that the caller
 * owns, then atap_net_spawn runs it as a task, or atap_net_run runs it on
 * the calling thread (as atap_block: no slot, no cancel). A spawned
 * operation parks on its fd (atap_park_fd) while the kernel has nothing
 * for it, holding no thread; its opts.timeout_ns limits the whole
 * operation, and atap_cancel ends it at once, even while the peer is
 * silent. One still parked at the last atap_shutdown is written off as
 * every park is (ATAP_EFAILED).
 *
 * Ownership. The atap_net_io, and every buffer, address and reader a prep
 * call was given, stay the caller's, and must stay alive and untouched
 * (but for reading io->done) from the spawn until atap_net_release has
 * returned (or, with atap_net_run, until it returns). A cancelled run may
 * still be inside a system call on the caller's buffer when a join already
 * reads ATAP_ECANCELLED: atap_net_release waits for it to let go. Names
 * (connect's "host:port" or path) are copied: they need only live through
 * the prep and spawn calls. libatap allocates nothing per operation,
 * except a connect (its copy of the name and options, its address list)
 * and a sendfile that reads through a buffer (one a run): a connection
 * loop that reuses one io, one buffer and one reader spawns each
 * operation into a table slot and allocates nothing. An io may be prepared
 * (or spawned as prepared) again once atap_net_release has returned.
 *
 * Results. A task's output is an atap_net_out (16 bytes, kept inside the
 * task's slot). Its rc is 0 or the operation's error: -errno from the
 * kernel (-ECONNREFUSED, -ECONNRESET, -EPIPE, -ENOENT, -EADDRINUSE...),
 * ATAP_ECLOSED for a peer that closed before a recv_exact or recv_until
 * had its bytes, ATAP_ETOOLONG for a recv_until past its limit. The task
 * itself always ends READY with that output, unless it is cancelled, times
 * out or is written off: then a join reads ATAP_ECANCELLED,
 * ATAP_ETIMEDOUT or ATAP_EFAILED and io->done says how far it got (bytes
 * sent or received so far; for send, nothing beyond them was sent).
 * atap_net_join folds the two into one code.
 *
 * The prep calls only fill the io: they return 0, or ATAP_EINVAL (and
 * leave io as it was) for a NULL io or an argument that makes no sense,
 * each listed at its call; a buffer may be NULL only when its length is 0.
 * No prep call checks fd (a bad one is the operation's -EBADF).
 * Blocks: no. Threads: any (an io is used by one thread at a time).
 */
typedef struct atap_net_out {
    int64_t n; /* bytes moved: sent, received, or a recv_until's line */
    int rc;    /* 0 or the operation's error (above) */
    int fd;    /* connect, accept: the new connection's fd (the caller's
                  to close); -1 for the other operations and on error */
} atap_net_out;

/* Buffered input of one connection, for atap_net_prep_recv_until: the
 * bytes read past a delimiter, or up to a limit, stay here for the next
 * read. The storage is the caller's (atap_net_reader_init); the fields are
 * libatap's. */
typedef struct atap_net_reader {
    int fd;
    bool drained; /* its last recv left the socket empty */
    unsigned char *buf;
    size_t cap, start, end; /* buffered: buf[start..end) */
} atap_net_reader;

/* One operation's state: filled by an atap_net_prep_* call, read and
 * written by its task. Callers read only `done`, and `fd` after a prep. */
typedef struct atap_net_io {
    int fd;                /* the socket operated on (-1 for a connect) */
    int op;                /* which operation (libatap's) */
    void *buf;             /* the caller's buffer (send's bytes, recv's room;
                              a connect's options) */
    size_t len;            /* its length */
    size_t done;           /* bytes moved so far: readable after a cancel */
    size_t limit;          /* recv_until's limit */
    struct sockaddr *addr; /* send_to's destination, recv_from's / accept's peer */
    socklen_t *addrlen;    /* recv_from / accept: in, the room; out, the length */
    socklen_t to_len;      /* send_to's destination length; sendfile's file */
    int pending;           /* a connect under way: its fd, else -1 */
    int err;               /* a connect: the last address's error */
    int busy;              /* a task holds the io (libatap's, atomic) */
    const char *name;      /* connect: the "host:port" or path (spawned: libatap's copy) */
    atap_net_reader *reader;
    void *list, *next; /* a connect's addresses (libatap's) */
} atap_net_io;

/*
 * Socket options, set on a socket before it is bound or connected (where
 * SO_REUSEPORT, IPV6_V6ONLY and the buffer sizes must be set for a
 * listener's connections to have them): atap_net_listen_opts,
 * atap_net_udp_bind_opts and atap_net_prep_connect_opts set them on the
 * socket they make; atap_net_set_opts sets them on a socket of the
 * caller's (an accepted one, one made elsewhere). Every field's zero
 * leaves the socket as the call without options makes it (a TCP listener
 * has SO_REUSEADDR, the rest is the system's default), so
 * &(atap_net_opts){.flags = ATAP_NET_REUSEPORT} asks for that alone. An
 * option that the socket's family does not have fails the call with the
 * kernel's -errno (IPV6_V6ONLY on an IPv4 socket: -ENOPROTOOPT), one the
 * platform does not have with -ENOTSUP; a socket the call was making is
 * then closed. Options are plain values, read by the call (a connect's:
 * see atap_net_prep_connect_opts).
 */
typedef struct atap_net_opts {
    unsigned flags;    /* ATAP_NET_REUSEADDR... below */
    int send_buffer;   /* SO_SNDBUF in bytes (0: the system's). The kernel
                          rounds it (Linux doubles it: its bookkeeping) */
    int recv_buffer;   /* SO_RCVBUF, likewise */
    int multicast_ttl; /* UDP: hops a multicast datagram sent may go,
                          IP_MULTICAST_TTL / IPV6_MULTICAST_HOPS, 1..255
                          (0: the system's, 1: this link only) */
    const char *local; /* a connect's only: the numeric "host:port" its
                          socket is bound to first ("10.0.0.2:0": that
                          address, any free port); NULL: the system picks */
} atap_net_opts;

/* atap_net_opts.flags. REUSEPORT: several sockets, each with it, may be
 * bound to one address and port (Linux spreads the connections or
 * datagrams among them). DUAL_STACK: "[::]:port" takes IPv4 too, its
 * peers read as "[::ffff:a.b.c.d]:port". BROADCAST: a UDP send to a
 * broadcast address, without it, fails with -EACCES. MULTICAST_NO_LOOP:
 * multicast this socket sends is not looped back to this host's own
 * members of the group. */
#define ATAP_NET_REUSEADDR 0x01u         /* SO_REUSEADDR (a TCP listener has it anyway) */
#define ATAP_NET_REUSEPORT 0x02u         /* SO_REUSEPORT */
#define ATAP_NET_V6ONLY 0x04u            /* IPV6_V6ONLY on: IPv6 only */
#define ATAP_NET_DUAL_STACK 0x08u        /* IPV6_V6ONLY off: IPv4 too */
#define ATAP_NET_BROADCAST 0x10u         /* SO_BROADCAST */
#define ATAP_NET_MULTICAST_NO_LOOP 0x20u /* IP_MULTICAST_LOOP / IPV6_MULTICAST_LOOP off */

/*
 * TCP connect to name, "host:port" ("example.com:80", "127.0.0.1:8080",
 * "[::1]:8080"). The name is resolved when the task runs: a numeric host
 * is parsed at once; any other is looked up (getaddrinfo) by a task that
 * runs on the blocking threads, which a cancel reaches only once the
 * lookup returns. Each address is tried in turn, and the last one's error
 * is the result. out.fd: the connected socket.
 * Results: -ECONNREFUSED, -ETIMEDOUT, -ENETUNREACH... from the kernel
 * (-ECONNABORTED for a failed socket whose error something else read
 * first: libkqueue, an emulated kqueue, reads it into its event); a
 * name that does not resolve: -ENXIO ("no such device or address"); a
 * lookup that failed for now: -EAGAIN; a port that is not a number or a
 * known service: ATAP_EINVAL.
 * Prep returns 0; ATAP_EINVAL for NULL io or name, or a name with no ':'
 * or no port after it. Blocks: no (the lookup is the task's). Threads: any.
 */
ATAP_EXPORT int atap_net_prep_connect(atap_net_io *io, const char *name);

/* atap_net_prep_connect, with options set on each socket it tries before
 * its connect, and the socket bound to opts->local first if given. opts
 * (may be NULL) and its local are copied by atap_net_spawn, as the name
 * is; atap_net_run and atap_net_step read them where they are, so there
 * they must live until the operation is done. An address of another
 * family than local's is skipped (its error: -EAFNOSUPPORT), and a local
 * address that cannot be bound is that address's error (-EADDRINUSE,
 * -EADDRNOTAVAIL...): the next address is tried, the last one's error is
 * the result. Prep returns 0; ATAP_EINVAL as atap_net_prep_connect, or
 * for options atap_net_set_opts refuses or a local that is not a numeric
 * "host:port". Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_connect_opts(atap_net_io *io, const char *name,
                                           const atap_net_opts *opts);

/* Unix stream connect to path, a file's path or an abstract name
 * ("@name": see Unix names below). Results: -ENOENT (no such file),
 * -ECONNREFUSED (a file, or an abstract name, nobody listens on: a stale
 * socket file), -EACCES... While the listener's backlog is full it tries
 * again every millisecond. Prep returns 0; ATAP_EINVAL for NULL io or
 * path, an empty path or "@" alone; -ENAMETOOLONG for a name longer than
 * sun_path holds; -ENOTSUP for "@name" off Linux.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_unix_connect(atap_net_io *io, const char *path);

/* Accepts one connection on the listening socket lfd. out.fd: the new
 * socket; the peer's address goes to *peer (up to *peer_len bytes; *peer_len
 * then holds its length) when peer is not NULL. Out of fds (the process's
 * or the system's limit) or of kernel memory for a socket, it waits
 * rather than fails, and never reports -EMFILE, -ENFILE, -ENOBUFS or
 * -ENOMEM: the connection stays queued in the kernel (none is lost) and
 * the task parks on a timer and tries again, 1 ms later, then twice as
 * long each time up to 64 ms, so it holds no thread and spins no CPU
 * (the listener stays readable, so a park on it would not wait). It takes
 * the connection at the first try after an fd comes free, up to 64 ms
 * late. opts.timeout_ns or a cancel ends that wait as any other;
 * atap_net_step waits the same way, parking the calling task.
 * Prep returns 0; ATAP_EINVAL for NULL io, or a peer without peer_len.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_accept(atap_net_io *io, int lfd, struct sockaddr *peer,
                                     socklen_t *peer_len);

/* Sends all len bytes of buf (on a datagram socket: one datagram). out.n
 * = len. Only a cancel, a timeout or an error stops it part way: io->done
 * (out.n on an error) says how many went. A peer gone: -EPIPE or
 * -ECONNRESET (no SIGPIPE is raised). An fd that is not a socket (a pipe,
 * a child's stdin) is written with write: a pipe whose reader is gone is
 * -EPIPE, with no SIGPIPE either. Prep returns 0; ATAP_EINVAL for NULL
 * io, or NULL buf with len > 0. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_send(atap_net_io *io, int fd, const void *buf, size_t len);

/* The most buffers one gathered send (or scattered receive) takes: the
 * IOV_MAX of Linux, macOS and the BSDs. */
#define ATAP_NET_IOV_MAX 1024

/* Sends all the bytes of iov[0..iovcnt), in order, as atap_net_prep_send
 * sends one buffer (a gathered send, sendmsg): on a stream socket each
 * partial write is followed from where it stopped, mid-buffer too, parking
 * while the socket is full; on a datagram socket they go as one datagram.
 * An fd that is not a socket (a pipe) is written with writev (a reader
 * gone: -EPIPE, no SIGPIPE). out.n: the
 * bytes of them all; io->done after a cancel (out.n after an error): how
 * many went, the first ones. The array and its buffers are the caller's,
 * read and never written, kept as send's buffer is. Prep returns 0;
 * ATAP_EINVAL for NULL io, NULL iov with iovcnt > 0, iovcnt below 0 or
 * above ATAP_NET_IOV_MAX, or lengths adding up past SSIZE_MAX.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_sendv(atap_net_io *io, int fd, const struct iovec *iov, int iovcnt);

/*
 * Messages (sendmsg, recvmsg): buffers, fds passed over a Unix socket
 * (SCM_RIGHTS), an address, and what the kernel says of a datagram
 * received. The message, its arrays and buffers are the caller's, kept
 * as a send's buffer is; a send reads it, a receive writes iov's buffers,
 * nfds, fds, addrlen and flags (and the prep zeroes nfds and flags).
 */
typedef struct atap_net_msg {
    const struct iovec *iov; /* the buffers: sent from, or filled in order */
    int iovcnt;              /* how many: 0 to ATAP_NET_IOV_MAX */
    int nfds;                /* send: how many fds to pass; receive: the room
                                in fds, read by the prep (which sets nfds
                                to 0), then how many fds came */
    int *fds;                /* send: the fds passed (still the caller's to
                                close); receive: those that came, each the
                                caller's to close, close-on-exec */
    struct sockaddr *addr;   /* send: the destination (NULL: the connected
                                peer); receive: room for the sender's
                                address (NULL: not wanted) */
    socklen_t addrlen;       /* send: addr's length; receive: in, the room,
                                out, the sender's length (as recv_from's) */
    unsigned flags;          /* receive, out: ATAP_NET_TRUNC... below */
} atap_net_msg;

/* atap_net_msg.flags, of a receive: the datagram was longer than the
 * room and its end was dropped (MSG_TRUNC); fds came that had no room and
 * the system closed them (MSG_CTRUNC). */
#define ATAP_NET_TRUNC 0x1u     /* the datagram was cut */
#define ATAP_NET_FDS_TRUNC 0x2u /* fds were dropped */
/* The most fds one message passes (Linux's SCM_MAX_FD). */
#define ATAP_NET_FDS_MAX 253

/*
 * Sends a message: its buffers as atap_net_prep_sendv sends them (on a
 * stream socket all of them, going on after partial writes; on a datagram
 * socket one datagram, to msg->addr if not NULL), and msg->fds, passed
 * with the first bytes that go (over a Unix socket; the receiver gets
 * copies, these stay the caller's). out.n: the bytes; io->done as sendv's.
 * Results: as send's, -EBADF for an fd passed that is not open,
 * -EOPNOTSUPP for fds over a socket that is not a Unix one (refused
 * before anything is sent: TCP and UDP would drop them).
 * Prep returns 0; ATAP_EINVAL for NULL io or msg, an iov or iovcnt as
 * sendv refuses, nfds below 0 or above ATAP_NET_FDS_MAX, NULL fds with
 * nfds > 0, fds with no byte to carry them, or an addr with addrlen 0.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_net_prep_sendmsg(atap_net_io *io, int fd, const atap_net_msg *msg);

/*
 * Receives a message: as atap_net_prep_recv (waits for at least one byte,
 * or one datagram; out.n the count, 0 from a stream peer that closed),
 * scattered over msg->iov's buffers in order, with up to msg->nfds fds
 * passed with those bytes into msg->fds (msg->nfds then says how many),
 * each close-on-exec as it comes where the platform can (MSG_CMSG_CLOEXEC:
 * Linux, FreeBSD), right after elsewhere, and sharing its file status
 * flags (O_NONBLOCK...) with the sender's. msg->flags: ATAP_NET_TRUNC for a
 * datagram cut to the room, so a short one (no flag) and a cut one tell
 * apart; ATAP_NET_FDS_TRUNC when fds came that had no room (they are
 * closed: none leaks). A room of 0 bytes asks for nothing, as recv of 0
 * (no fd then comes). After a cancel msg->nfds still says which fds came:
 * close them. Results: as recv's. Prep returns 0; ATAP_EINVAL for NULL io
 * or msg, an iov or iovcnt as sendv refuses, nfds below 0 or above
 * ATAP_NET_FDS_MAX, NULL fds with nfds > 0, or an addr with addrlen 0.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_net_prep_recvmsg(atap_net_io *io, int fd, atap_net_msg *msg);

/*
 * Sends count bytes of the file open as `file`, from offset (the file's
 * own position is neither used nor moved), to fd, without copying them
 * through user space where the platform can: sendfile(2) on Linux. Off
 * Linux, or where the kernel refuses the pair (-EINVAL: a file it cannot
 * map, say), it reads and sends through a 64 KiB buffer of its own, read
 * again from the file after a partial send. count 0: to the file's end.
 * out.n: the bytes sent, fewer than count when the file ended first (not
 * an error: compare). Spawned, it runs on the blocking threads (a read of
 * the file may wait for the disk) and parks on fd while it is full,
 * holding no thread; a cancel or timeout is seen between chunks of at
 * most 64 KiB, as a file operation's, and io->done then says how many
 * bytes went, the file's first from offset. atap_net_step runs it on its
 * task's thread. Results: as send's (-EPIPE, -ECONNRESET: no SIGPIPE is
 * raised), -ESPIPE for a file that cannot be read at an offset (a pipe),
 * -EBADF, -ENOMEM (the buffer). Prep returns 0; ATAP_EINVAL for NULL io,
 * a negative offset, offset + count past INT64_MAX, or an offset past
 * SIZE_MAX (a 32-bit system). Blocks: no (the prep; the operation as
 * above). Threads: any.
 */
ATAP_EXPORT int atap_net_prep_sendfile(atap_net_io *io, int fd, int file, int64_t offset,
                                       size_t count);

/* Receives what has arrived, up to len bytes, into buf, waiting for at
 * least one (on a datagram socket: one datagram, cut to len). out.n: the
 * count; with len > 0, 0 means the peer closed (a stream socket), not an
 * error. len 0 asks for nothing: it finishes at once with out.n 0 (which
 * then says nothing of the peer) and leaves every byte and datagram for
 * the next read; buf may then be NULL. The same holds for recv_exact and
 * recv_from of 0 bytes (recv_from's *from_len is then 0: no sender).
 * Prep returns 0; ATAP_EINVAL for NULL io, or NULL buf with len > 0.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_recv(atap_net_io *io, int fd, void *buf, size_t len);

/* Receives exactly len bytes into buf. A peer that closes first:
 * ATAP_ECLOSED, out.n (and io->done) the bytes that did come. Prep returns
 * 0; ATAP_EINVAL for NULL io, or NULL buf with len > 0. Blocks: no.
 * Threads: any. */
ATAP_EXPORT int atap_net_prep_recv_exact(atap_net_io *io, int fd, void *buf, size_t len);

/* Datagrams: sends buf as one datagram to `to` (to_len bytes), or receives
 * one into buf (cut to len) with its source in *from (as accept's peer).
 * A receive parks until one comes. Prep returns 0; ATAP_EINVAL for NULL
 * io, NULL buf with len > 0, a send_to with NULL to, or a recv_from with
 * from but no from_len. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_prep_send_to(atap_net_io *io, int fd, const void *buf, size_t len,
                                      const struct sockaddr *to, socklen_t to_len);
ATAP_EXPORT int atap_net_prep_recv_from(atap_net_io *io, int fd, void *buf, size_t len,
                                        struct sockaddr *from, socklen_t *from_len);

/*
 * Reads through reader until its buffered bytes hold delim (delim_len
 * bytes, 1 or more; the caller's, kept as the io's buffers). out.n: the
 * length of the line, delimiter included, which starts at
 * atap_net_reader_data(); it stays buffered until atap_net_reader_consume.
 * No delimiter within limit bytes (at most the reader's capacity):
 * ATAP_ETOOLONG; a peer that closes first: ATAP_ECLOSED. Either way
 * nothing read is lost: it all stays in the reader.
 * Prep returns 0; ATAP_EINVAL for NULL io, reader or delim, delim_len 0,
 * or a limit below delim_len or above the reader's capacity.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_net_prep_recv_until(atap_net_io *io, atap_net_reader *reader,
                                         const void *delim, size_t delim_len, size_t limit);

/*
 * Runs a prepared operation as a task (*task: its handle, the caller's to
 * release). opts may be NULL; out_size must be 0 or sizeof(atap_net_out)
 * (it is that), kind ATAP_ONCE, and no arg_free / out_free; priority,
 * timeout_ns and after_ns apply; blocking is libatap's to set (a connect
 * that looks a name up). Returns as atap_spawn, and ATAP_EINVAL for a NULL
 * or unprepared io or options outside those (nothing then runs).
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_net_spawn(atap_task *task, atap_net_io *io, const atap_spawn_opts *opts);

/* Runs a prepared operation on the calling thread until it is done (as
 * atap_block: waits in the kernel, no cancel, no timeout), filling *out
 * (may be NULL). Returns out.rc, or ATAP_EINVAL for an unprepared io.
 * Blocks: yes. Threads: any. */
ATAP_EXPORT int atap_net_run(atap_net_io *io, atap_net_out *out);

/* atap_join on an operation's task, then its result: returns the join's
 * code (ATAP_ECANCELLED, ATAP_ETIMEDOUT...) if it failed, else out->rc.
 * out may be NULL. Blocks: yes. Threads: any. */
ATAP_EXPORT int atap_net_join(atap_task task, atap_net_out *out);

/*
 * Inside a task of your own: runs the prepared operation as far as it can
 * go now, so that one task (a connection's, say) can do many operations
 * in turn without a task each and without holding a thread between them.
 * Returns 0 when the operation is done (*out filled, as a spawned
 * operation's output); ATAP_PARKED when it parked the calling task on its
 * fd: return ATAP_PARKED from the task, and when it runs again call
 * atap_net_step with the same io, which goes on where it stopped. The
 * calling task's timeout and cancel apply. Prepare the io before each
 * operation (a done one is not started again). io lives where the task
 * keeps its state (its arg). A connect's name is not copied and is looked
 * up on the calling thread: give a numeric host or a Unix path. A task
 * that ends before its connect is done (cancelled, timed out) lets go of
 * it with atap_net_abandon(io), from its arg_free say.
 * Returns 0, ATAP_PARKED, or ATAP_EINVAL for NULL ctx, io or out, or an
 * unprepared io; a park that cannot be set up ends the operation with its
 * code in out->rc. Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_net_step(atap_ctx *ctx, atap_net_io *io, atap_net_out *out);

/* Lets go of what an unfinished operation run by atap_net_step holds (a
 * connect's socket and address list); nothing for the others. io may then
 * be freed. NULL is ignored. Blocks: no. Threads: any. */
ATAP_EXPORT void atap_net_abandon(atap_net_io *io);

/* Releases an operation's handle (its last: a task spawned by
 * atap_net_spawn, never atap_dup'd, or every copy released but this one),
 * then waits until the task has let go of io: its run over (a cancelled
 * run is in no system call for long; a parked one is taken down at once,
 * its arg let go up to a manager tick later). From then on io, its buffers
 * and its reader are the caller's again. A NULL io releases only.
 * Blocks: briefly, as above. Threads: any. */
ATAP_EXPORT void atap_net_release(atap_task task, atap_net_io *io);

/* Makes reader read fd, buffering into buf (cap bytes, the caller's, kept
 * while the reader is used). Returns 0; ATAP_EINVAL for NULL reader or
 * buf, or cap 0. Blocks: no. Threads: any (a reader is used by one thread
 * at a time). */
ATAP_EXPORT int atap_net_reader_init(atap_net_reader *reader, int fd, void *buf, size_t cap);
/* The bytes buffered now, and their count in *len (may be NULL).
 * Blocks: no. Threads: any. */
ATAP_EXPORT const void *atap_net_reader_data(const atap_net_reader *reader, size_t *len);
/* Drops the first n buffered bytes (at most what is buffered).
 * Blocks: no. Threads: any. */
ATAP_EXPORT void atap_net_reader_consume(atap_net_reader *reader, size_t n);

/*
 * Listens on TCP name, "host:port" with a numeric host ("127.0.0.1:0",
 * "[::]:8080"; an empty host, ":8080", is every IPv4 address). Port 0
 * picks a free one: atap_net_local_port reads it. SO_REUSEADDR is set.
 * backlog <= 0: SOMAXCONN. Returns 0 and *fd; ATAP_EINVAL for a name that
 * is not numeric; -EADDRINUSE, -EACCES... Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_net_listen(int *fd, const char *name, int backlog);

/* atap_net_listen with options (may be NULL: the same as atap_net_listen),
 * set before the bind; ATAP_NET_REUSEADDR is set whatever the flags say.
 * Returns as atap_net_listen, and as atap_net_set_opts; ATAP_EINVAL also
 * for a local (a connect's only). Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_listen_opts(int *fd, const char *name, int backlog,
                                     const atap_net_opts *opts);

/*
 * Unix names. A name that starts with '@' is, on Linux, a name in the
 * abstract namespace: "@name" binds the bytes after the '@' (no file is
 * made, nothing is left to remove: the name goes with the last socket
 * bound to it; up to sizeof sun_path - 1 bytes after the '@'), and
 * atap_net_addr_format writes such an address back as "@name". Off Linux
 * a leading '@' is refused with -ENOTSUP; a file whose name starts with
 * '@' is reached as "./@name". Any other name is a file's path.
 */

/* Listens on the Unix path (the file is created; it is the caller's to
 * remove), or the abstract "@name" (Linux). Returns 0 and *fd;
 * -EADDRINUSE when the path exists (a stale file included: remove it
 * first) or the name is bound; -ENAMETOOLONG past sun_path's room;
 * ATAP_EINVAL for NULL or empty path, or "@" alone; -ENOTSUP for "@name"
 * off Linux. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_unix_listen(int *fd, const char *path, int backlog);

/* A UDP socket bound to name (numeric, as atap_net_listen; port 0 picks).
 * Returns 0 and *fd, or as atap_net_listen. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_udp_bind(int *fd, const char *name);

/* atap_net_udp_bind with options (may be NULL), set before the bind.
 * Returns as atap_net_listen_opts. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_udp_bind_opts(int *fd, const char *name, const atap_net_opts *opts);

/* Connects a datagram socket (UDP, or Unix with a path starting with '/'
 * or '.', or an abstract "@name") to name, numeric, so that send / recv
 * need no address: recv then takes only the peer's datagrams. Returns 0;
 * -errno; as atap_net_unix_addr for a Unix name. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_dgram_connect(int fd, const char *name);

/* A Unix datagram socket bound to path or "@name" (NULL: unbound, it can
 * only send). Returns 0 and *fd; as atap_net_unix_listen. Blocks: no.
 * Threads: any. */
ATAP_EXPORT int atap_net_unix_dgram_bind(int *fd, const char *path);

/* A connected pair of Unix sockets (socketpair), type SOCK_STREAM or
 * SOCK_DGRAM. Returns 0; ATAP_EINVAL for another type or NULL; -errno.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_pair(int fds[2], int type);

/* An address for send_to: name as atap_net_listen's (numeric IPv4 / IPv6),
 * or a Unix path or abstract "@name" (atap_net_unix_addr), into *addr (at
 * least sizeof(struct sockaddr_storage) bytes) and *len. Returns 0;
 * ATAP_EINVAL; -ENAMETOOLONG, -ENOTSUP (a Unix name, as
 * atap_net_unix_listen). Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_ip_addr(struct sockaddr *addr, socklen_t *len, const char *name);
ATAP_EXPORT int atap_net_unix_addr(struct sockaddr *addr, socklen_t *len, const char *path);

/* Writes an address as text, "1.2.3.4:80", "[::1]:80", the Unix path
 * ("" unnamed) or "@name" for an abstract one (Linux; up to a NUL in the
 * name), like snprintf: returns the length of the whole text (>= n: cut),
 * or ATAP_EINVAL for an unknown family, a len too short for its family's
 * address, or NULL. Only len bytes of addr are read: a len too short to
 * hold a family (0, as for a datagram from an unbound Unix socket) is no
 * address and writes "", whatever the storage held before.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_addr_format(const struct sockaddr *addr, socklen_t len, char *buf,
                                     size_t n);

/* The port an IP socket is bound to (the one a port 0 picked), or -errno /
 * ATAP_EINVAL (not an IP socket). Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_local_port(int fd);

/* Setters: half-close (no more sends: the peer reads end of stream, this
 * side can still receive), TCP_NODELAY, SO_KEEPALIVE (with idle_s > 0 also
 * the idle time before the first probe, where the platform has it).
 * Return 0 or -errno. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_shutdown_write(int fd);
ATAP_EXPORT int atap_net_set_nodelay(int fd, bool on);
ATAP_EXPORT int atap_net_set_keepalive(int fd, bool on, unsigned idle_s);

/* Sets opts (as atap_net_listen_opts does, on a socket of the caller's):
 * each option asked for, in the order of the struct (flags first); the
 * first that fails stops it with its code, those before it stay set.
 * Returns 0; ATAP_EINVAL for NULL opts, an unknown flag, both V6ONLY and
 * DUAL_STACK, a negative buffer size, a multicast_ttl above 255 or a
 * local (a connect's only); -ENOTSUP for SO_REUSEPORT where there is
 * none; -errno (-EBADF, -ENOTSOCK, -ENOPROTOOPT...).
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_set_opts(int fd, const atap_net_opts *opts);

/* Joins / leaves the multicast group, a numeric IPv4 or IPv6 address
 * ("239.1.2.3", "ff02::1:3") of the socket's family, on the network
 * interface named iface ("eth0"; NULL: the one the system routes the
 * group to). A UDP socket bound to the group's port (and to the group or
 * the any address) then receives what is sent to the group. Returns 0;
 * ATAP_EINVAL for NULL group or one that is not a numeric address; -ENODEV
 * for no interface of that name; -EADDRINUSE (joined already),
 * -EADDRNOTAVAIL (leaving a group not joined), -EINVAL (not a multicast
 * address), -ENOPROTOOPT (a group of another family)...; -ENOTSUP where
 * the platform has no protocol-independent join (MCAST_JOIN_GROUP).
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_net_multicast_join(int fd, const char *group, const char *iface);
ATAP_EXPORT int atap_net_multicast_leave(int fd, const char *group, const char *iface);

#ifdef __cplusplus
}
#endif

#endif /* ATAP_NET_H */

/*
 * Sockets and names, for the socket tasks (net.c prepares and runs the
 * operations; net_int.h has what the two files share): making sockets,
 * "host:port" and path names parsed, formatted and looked up, and the
 * plain calls that never wait (listen, bind, pairs, shutdown, the
 * setters, addresses).
 *
 * Every fd made here is close-on-exec and non-blocking: atomically with
 * SOCK_CLOEXEC / SOCK_NONBLOCK where the platform has them, by fcntl right
 * after creation elsewhere (atap__net_set_fd_flags, which net.c's accept
 * calls too). Sends never raise SIGPIPE: SO_NOSIGPIPE on the socket where
 * there is no MSG_NOSIGNAL flag. Nothing here parks; the one call that
 * may block, a name's lookup (atap__net_resolve), is made by a connect's
 * run, and a spawned connect to such a name runs on the blocking threads
 * (net.c's needs_lookup). Only libc and the public header are used
 * (layer 9).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* EAI_NODATA */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "atap.h"
#include "net_int.h"

/* ---- sockets and names ------------------------------------------------- */

int atap__net_set_fd_flags(int fd)
{
#ifdef SO_NOSIGPIPE
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
#if !defined(SOCK_CLOEXEC) || !defined(SOCK_NONBLOCK)
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
        return -errno;
#else
    (void)fd;
#endif
    return 0;
}

int atap__net_new_socket(int domain, int type)
{
    int fd, rc;

#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK)
    type |= SOCK_CLOEXEC | SOCK_NONBLOCK;
#endif
    if ((fd = socket(domain, type, 0)) < 0)
        return -errno;
    if ((rc = atap__net_set_fd_flags(fd)) != 0) {
        close(fd);
        return rc;
    }
    return fd;
}

/* Splits "host:port" / "[v6]:port" into host (NUL-ended, "" for none) and
 * a pointer to the port. ATAP_EINVAL for no ':' or a host too long. */
int atap__net_split_name(const char *name, char *host, size_t room, const char **port)
{
    const char *colon, *h = name;
    size_t n;

    if (!name)
        return ATAP_EINVAL;
    if (name[0] == '[') {
        const char *close = strchr(name, ']');
        if (!close || close[1] != ':')
            return ATAP_EINVAL;
        h = name + 1;
        n = (size_t)(close - h);
        colon = close + 1;
    } else {
        if (!(colon = strrchr(name, ':')))
            return ATAP_EINVAL;
        n = (size_t)(colon - name);
    }
    if (n >= room)
        return ATAP_EINVAL;
    memcpy(host, h, n);
    host[n] = '\0';
    *port = colon + 1;
    return 0;
}

static int parse_port(const char *s, in_port_t *port)
{
    unsigned long v = 0;

    if (!*s)
        return ATAP_EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || (v = v * 10 + (unsigned long)(*s - '0')) > 65535)
            return ATAP_EINVAL;
    }
    *port = htons((in_port_t)v);
    return 0;
}

int atap_net_ip_addr(struct sockaddr *addr, socklen_t *len, const char *name)
{
    char host[HOST_MAX];
    const char *port;
    in_port_t p;

    if (!addr || !len || atap__net_split_name(name, host, sizeof host, &port) != 0 ||
        parse_port(port, &p) != 0)
        return ATAP_EINVAL;
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)(void *)addr;
        memset(a, 0, sizeof *a);
        a->sin6_family = AF_INET6;
        a->sin6_port = p;
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return ATAP_EINVAL;
        *len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)(void *)addr;
        memset(a, 0, sizeof *a);
        a->sin_family = AF_INET;
        a->sin_port = p;
        if (host[0] == '\0')
            a->sin_addr.s_addr = htonl(INADDR_ANY);
        else if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return ATAP_EINVAL;
        *len = sizeof *a;
    }
    return 0;
}

/* A path, or with a leading '@' a name in Linux's abstract namespace:
 * sun_path starts with a NUL, the name's bytes follow, and the length
 * ends the name (no NUL of its own), so it may fill sun_path whole. */
int atap_net_unix_addr(struct sockaddr *addr, socklen_t *len, const char *path)
{
    struct sockaddr_un *a = (struct sockaddr_un *)(void *)addr;
    size_t n;

    if (!addr || !len || !path || !*path)
        return ATAP_EINVAL;
    n = strlen(path);
    if (path[0] == '@') {
#ifdef __linux__
        if (n == 1)
            return ATAP_EINVAL;
        if (n > sizeof a->sun_path)
            return -ENAMETOOLONG;
        memset(a, 0, sizeof *a);
        a->sun_family = AF_UNIX;
        memcpy(a->sun_path + 1, path + 1, n - 1);
        *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
        return 0;
#else
        return -ENOTSUP;
#endif
    }
    if (n >= sizeof a->sun_path)
        return -ENAMETOOLONG;
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return 0;
}

int atap_net_addr_format(const struct sockaddr *addr, socklen_t len, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN];

    if (!addr || (!buf && n))
        return ATAP_EINVAL;
    /* Too short to name a family: no address (a datagram from an unbound
     * Unix socket comes with length 0). The storage is not read past len:
     * it may hold zeros, or an earlier sender's address. */
    if ((size_t)len < offsetof(struct sockaddr, sa_family) + sizeof addr->sa_family)
        return snprintf(buf, n, "%s", "");
    switch (addr->sa_family) {
    case AF_INET: {
        const struct sockaddr_in *a = (const void *)addr;
        if ((size_t)len < sizeof *a)
            return ATAP_EINVAL;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        return snprintf(buf, n, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    }
    case AF_INET6: {
        const struct sockaddr_in6 *a = (const void *)addr;
        if ((size_t)len < sizeof *a)
            return ATAP_EINVAL;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        return snprintf(buf, n, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    }
    case AF_UNIX: {
        const struct sockaddr_un *a = (const void *)addr;
        size_t off = offsetof(struct sockaddr_un, sun_path);
        size_t max = len > off ? (size_t)len - off : 0;
        if (max > sizeof a->sun_path)
            max = sizeof a->sun_path;
#ifdef __linux__
        if (max > 0 && a->sun_path[0] == '\0') /* abstract: the length ends it */
            return snprintf(buf, n, "@%.*s", (int)strnlen(a->sun_path + 1, max - 1),
                            a->sun_path + 1);
#endif
        return snprintf(buf, n, "%.*s", (int)strnlen(a->sun_path, max), a->sun_path);
    }
    default:
        return ATAP_EINVAL;
    }
}

int atap_net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;

    memset(&ss, 0, sizeof ss); /* a family the kernel does not fill reads AF_UNSPEC */
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -errno;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ATAP_EINVAL;
}

static int eai_code(int e)
{
    switch (e) {
    case EAI_NONAME:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
    case EAI_FAIL:
        return -ENXIO;
    case EAI_AGAIN:
        return -EAGAIN;
    case EAI_MEMORY:
        return -ENOMEM;
    case EAI_SYSTEM:
        return errno ? -errno : -EIO;
    default:
        return ATAP_EINVAL; /* EAI_SERVICE, EAI_FAMILY... */
    }
}

/* Looks the name up (numeric hosts without a lookup). */
int atap__net_resolve(atap_net_io *io)
{
    char host[HOST_MAX];
    const char *port;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *list = NULL;
    unsigned char tmp[sizeof(struct in6_addr)];
    int e;

    if (atap__net_split_name(io->name, host, sizeof host, &port) != 0)
        return ATAP_EINVAL;
    if (inet_pton(AF_INET, host, tmp) == 1 || inet_pton(AF_INET6, host, tmp) == 1)
        hints.ai_flags |= AI_NUMERICHOST;
    if ((e = getaddrinfo(host[0] ? host : NULL, port, &hints, &list)) != 0)
        return eai_code(e);
    io->list = io->next = list;
    return 0;
}

/* ---- options ----------------------------------------------------------- */

#define KNOWN_FLAGS                                                                                \
    (ATAP_NET_REUSEADDR | ATAP_NET_REUSEPORT | ATAP_NET_V6ONLY | ATAP_NET_DUAL_STACK |             \
     ATAP_NET_BROADCAST | ATAP_NET_MULTICAST_NO_LOOP)

int atap__net_check_opts(const atap_net_opts *o, bool connect)
{
    struct sockaddr_storage ss;
    socklen_t len;

    if (!o)
        return 0;
    if ((o->flags & ~KNOWN_FLAGS) != 0 ||
        (o->flags & (ATAP_NET_V6ONLY | ATAP_NET_DUAL_STACK)) ==
            (ATAP_NET_V6ONLY | ATAP_NET_DUAL_STACK) ||
        o->send_buffer < 0 || o->recv_buffer < 0 || o->multicast_ttl < 0 || o->multicast_ttl > 255)
        return ATAP_EINVAL;
    if (o->local && (!connect || atap_net_ip_addr((struct sockaddr *)&ss, &len, o->local) != 0))
        return ATAP_EINVAL;
    return 0;
}

static int set_int(int fd, int level, int name, int v)
{
    return setsockopt(fd, level, name, &v, sizeof v) == 0 ? 0 : -errno;
}

/* IP_MULTICAST_TTL and IP_MULTICAST_LOOP take an int on Linux, a u_char
 * on the BSDs and macOS (Linux takes either). */
static int set_ip_byte(int fd, int name, int v)
{
#ifdef __linux__
    return set_int(fd, IPPROTO_IP, name, v);
#else
    unsigned char b = (unsigned char)v;
    return setsockopt(fd, IPPROTO_IP, name, &b, sizeof b) == 0 ? 0 : -errno;
#endif
}

static int set_multicast(int fd, int family, const atap_net_opts *o)
{
    int rc = 0;

    if (o->multicast_ttl > 0)
        rc = family == AF_INET6 ? set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, o->multicast_ttl)
                                : set_ip_byte(fd, IP_MULTICAST_TTL, o->multicast_ttl);
    if (rc == 0 && (o->flags & ATAP_NET_MULTICAST_NO_LOOP))
        rc = family == AF_INET6 ? set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 0)
                                : set_ip_byte(fd, IP_MULTICAST_LOOP, 0);
    return rc;
}

/* Sets what o asks for on fd, a socket of family (checked options). */
int atap__net_apply_opts(int fd, int family, const atap_net_opts *o)
{
    int rc = 0;

    if (!o)
        return 0;
    if (o->flags & ATAP_NET_REUSEADDR)
        rc = set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    if (rc == 0 && (o->flags & ATAP_NET_REUSEPORT)) {
#ifdef SO_REUSEPORT
        rc = set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1);
#else
        rc = -ENOTSUP;
#endif
    }
    if (rc == 0 && (o->flags & (ATAP_NET_V6ONLY | ATAP_NET_DUAL_STACK)))
        rc = set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, (o->flags & ATAP_NET_V6ONLY) != 0);
    if (rc == 0 && (o->flags & ATAP_NET_BROADCAST))
        rc = set_int(fd, SOL_SOCKET, SO_BROADCAST, 1);
    if (rc == 0 && o->send_buffer > 0)
        rc = set_int(fd, SOL_SOCKET, SO_SNDBUF, o->send_buffer);
    if (rc == 0 && o->recv_buffer > 0)
        rc = set_int(fd, SOL_SOCKET, SO_RCVBUF, o->recv_buffer);
    if (rc == 0)
        rc = set_multicast(fd, family, o);
    return rc;
}

/* A connect's socket (of family) before its connect: its options, then
 * its local address bound. */
int atap__net_connect_opts(int fd, int family, const atap_net_opts *o)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (!o)
        return 0;
    if ((rc = atap__net_apply_opts(fd, family, o)) != 0 || !o->local)
        return rc;
    if (atap_net_ip_addr((struct sockaddr *)&ss, &len, o->local) != 0)
        return ATAP_EINVAL;
    if (ss.ss_family != family)
        return -EAFNOSUPPORT;
    return bind(fd, (struct sockaddr *)&ss, len) == 0 ? 0 : -errno;
}

int atap_net_set_opts(int fd, const atap_net_opts *opts)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int rc;

    if (!opts || (rc = atap__net_check_opts(opts, false)) != 0)
        return ATAP_EINVAL;
    memset(&ss, 0, sizeof ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -errno;
    return atap__net_apply_opts(fd, ss.ss_family, opts);
}

/* A group's address, and the interface's index (0: the system's pick). */
static int membership(int fd, const char *group, const char *iface, bool join)
{
#ifdef MCAST_JOIN_GROUP
    struct group_req gr;
    struct sockaddr_in *a4 = (struct sockaddr_in *)(void *)&gr.gr_group;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)(void *)&gr.gr_group;
    int level;

    if (!group)
        return ATAP_EINVAL;
    memset(&gr, 0, sizeof gr);
    if (inet_pton(AF_INET, group, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        level = IPPROTO_IP;
    } else if (inet_pton(AF_INET6, group, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        level = IPPROTO_IPV6;
    } else {
        return ATAP_EINVAL;
    }
    if (iface && (gr.gr_interface = if_nametoindex(iface)) == 0)
        return -ENODEV;
    if (setsockopt(fd, level, join ? MCAST_JOIN_GROUP : MCAST_LEAVE_GROUP, &gr, sizeof gr) != 0)
        return -errno;
    return 0;
#else
    (void)fd, (void)iface, (void)join;
    return group ? -ENOTSUP : ATAP_EINVAL;
#endif
}

int atap_net_multicast_join(int fd, const char *group, const char *iface)
{
    return membership(fd, group, iface, true);
}

int atap_net_multicast_leave(int fd, const char *group, const char *iface)
{
    return membership(fd, group, iface, false);
}

/* ---- the plain calls --------------------------------------------------- */

/* A socket of type bound to addr, with options o (checked); listening when
 * backlog >= 0. */
static int bound(int *fd, const struct sockaddr *addr, socklen_t len, int type, int backlog,
                 const atap_net_opts *o)
{
    int s, one = 1, rc = 0;

    if ((s = atap__net_new_socket(addr->sa_family, type)) < 0)
        return s;
    if (addr->sa_family != AF_UNIX && type == SOCK_STREAM)
        (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if ((rc = atap__net_apply_opts(s, addr->sa_family, o)) != 0) {
        close(s);
        return rc;
    }
    if (bind(s, addr, len) != 0 ||
        (backlog >= 0 && listen(s, backlog > 0 ? backlog : SOMAXCONN) != 0))
        rc = -errno;
    if (rc != 0) {
        close(s);
        return rc;
    }
    *fd = s;
    return 0;
}

int atap_net_listen_opts(int *fd, const char *name, int backlog, const atap_net_opts *opts)
{
    struct sockaddr_storage ss;
    socklen_t len;

    if (!fd || atap_net_ip_addr((struct sockaddr *)&ss, &len, name) != 0 ||
        atap__net_check_opts(opts, false) != 0)
        return ATAP_EINVAL;
    return bound(fd, (struct sockaddr *)&ss, len, SOCK_STREAM, backlog > 0 ? backlog : 0, opts);
}

int atap_net_listen(int *fd, const char *name, int backlog)
{
    return atap_net_listen_opts(fd, name, backlog, NULL);
}

int atap_net_unix_listen(int *fd, const char *path, int backlog)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (!fd)
        return ATAP_EINVAL;
    if ((rc = atap_net_unix_addr((struct sockaddr *)&ss, &len, path)) != 0)
        return rc;
    return bound(fd, (struct sockaddr *)&ss, len, SOCK_STREAM, backlog > 0 ? backlog : 0, NULL);
}

int atap_net_udp_bind_opts(int *fd, const char *name, const atap_net_opts *opts)
{
    struct sockaddr_storage ss;
    socklen_t len;

    if (!fd || atap_net_ip_addr((struct sockaddr *)&ss, &len, name) != 0 ||
        atap__net_check_opts(opts, false) != 0)
        return ATAP_EINVAL;
    return bound(fd, (struct sockaddr *)&ss, len, SOCK_DGRAM, -1, opts);
}

int atap_net_udp_bind(int *fd, const char *name) { return atap_net_udp_bind_opts(fd, name, NULL); }

int atap_net_unix_dgram_bind(int *fd, const char *path)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (!fd)
        return ATAP_EINVAL;
    if (!path) {
        if ((rc = atap__net_new_socket(AF_UNIX, SOCK_DGRAM)) < 0)
            return rc;
        *fd = rc;
        return 0;
    }
    if ((rc = atap_net_unix_addr((struct sockaddr *)&ss, &len, path)) != 0)
        return rc;
    return bound(fd, (struct sockaddr *)&ss, len, SOCK_DGRAM, -1, NULL);
}

int atap_net_dgram_connect(int fd, const char *name)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (!name)
        return ATAP_EINVAL;
    if (name[0] == '/' || name[0] == '.' || name[0] == '@')
        rc = atap_net_unix_addr((struct sockaddr *)&ss, &len, name);
    else
        rc = atap_net_ip_addr((struct sockaddr *)&ss, &len, name);
    if (rc != 0)
        return rc;
    return connect(fd, (struct sockaddr *)&ss, len) == 0 ? 0 : -errno;
}

int atap_net_pair(int fds[2], int type)
{
    int t = type, rc;

    if (!fds || (type != SOCK_STREAM && type != SOCK_DGRAM))
        return ATAP_EINVAL;
#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK)
    t |= SOCK_CLOEXEC | SOCK_NONBLOCK;
#endif
    if (socketpair(AF_UNIX, t, 0, fds) != 0)
        return -errno;
    if ((rc = atap__net_set_fd_flags(fds[0])) != 0 || (rc = atap__net_set_fd_flags(fds[1])) != 0) {
        close(fds[0]);
        close(fds[1]);
        return rc;
    }
    return 0;
}

int atap_net_shutdown_write(int fd) { return shutdown(fd, SHUT_WR) == 0 ? 0 : -errno; }

int atap_net_set_nodelay(int fd, bool on)
{
    int v = on;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0 ? 0 : -errno;
}

int atap_net_set_keepalive(int fd, bool on, unsigned idle_s)
{
    int v = on;

    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v) != 0)
        return -errno;
    if (on && idle_s > 0) {
        int idle = idle_s > 32767 ? 32767 : (int)idle_s;
#if defined(TCP_KEEPIDLE)
        if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) != 0)
            return -errno;
#elif defined(TCP_KEEPALIVE)
        if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle) != 0)
            return -errno;
#else
        (void)idle;
#endif
    }
    return 0;
}

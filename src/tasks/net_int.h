/*
 * What net.c and net_sock.c share, and no one else (callers use atap.h):
 * the longest host a name may carry, and the helpers of net_sock.c's that
 * net.c's operations call. net_sock.c makes sockets, parses and looks up
 * names, and has the plain calls that never wait; net.c prepares and runs
 * the operations. Each file's top comment has its rule.
 */
#ifndef ATAP_NET_INT_H
#define ATAP_NET_INT_H

#include <stddef.h>

#include "atap.h"

#define HOST_MAX 256 /* the longest DNS name is 253 */

/* net_sock.c. Close-on-exec, non-blocking, SO_NOSIGPIPE where creation did not: 0 or -errno. */
int atap__net_set_fd_flags(int fd);
/* net_sock.c. A new socket, close-on-exec and non-blocking: its fd, or -errno. */
int atap__net_new_socket(int domain, int type);
/* net_sock.c. Splits "host:port" / "[v6]:port" into host and port: 0 or ATAP_EINVAL. */
int atap__net_split_name(const char *name, char *host, size_t room, const char **port);
/* net_sock.c. 0, or ATAP_EINVAL for options that make no sense (a local
 * only for a connect's). */
int atap__net_check_opts(const atap_net_opts *o, bool connect);
/* net_sock.c. Sets checked options on fd, a socket of family: 0 or -errno. */
int atap__net_apply_opts(int fd, int family, const atap_net_opts *o);
/* net_sock.c. A connect's socket before it connects: its options set, its
 * local address bound. 0, -errno, -EAFNOSUPPORT (local of another family). */
int atap__net_connect_opts(int fd, int family, const atap_net_opts *o);
/* net_sock.c. Looks io->name up into io->list and io->next: 0 or -ENXIO, -EAGAIN... */
int atap__net_resolve(atap_net_io *io);

#endif

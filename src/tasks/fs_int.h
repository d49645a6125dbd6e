/*
 * What fs.c and fs_file.c share, and no one else (callers use atap.h):
 * fs.c has the operations on paths, the request's checks, atap_fs_run and
 * the spawn, and the chunked reads and writes every operation moves bytes
 * with; fs_file.c has the operations on an open file (ATAP_FS_FD, and the
 * open that makes one) and what a file's status is written as.
 */
#ifndef ATAP_FS_INT_H
#define ATAP_FS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "atap.h"

#define ATAP__FS_CHUNK (64u * 1024u) /* bytes between two looks at a cancel */

/* fs.c. Moves len bytes between buf and fd (writing, or reading up to len,
 * when `reading`), at off, or at the fd's position when off is negative,
 * in chunks, looking for a stop before each; *done counts what moved. A
 * read stops early at the end of the file. 0, -errno or ATAP_ECANCELLED. */
int atap__fs_move(atap_ctx *ctx, int fd, bool reading, unsigned char *buf, size_t len, int64_t off,
                  size_t *done);

/* fs.c. Up to len bytes at off (the fd's position when negative) into a
 * malloc'd *out sized by what the file gives, *got of them. */
int atap__fs_read_grown(atap_ctx *ctx, int fd, int64_t off, size_t len, unsigned char **out,
                        size_t *got);

/* fs.c. The rest of fd from its position, into a malloc'd, NUL-ended
 * o->data (o->n bytes before the NUL); -EISDIR for a directory. */
int atap__fs_read_all(atap_ctx *ctx, int fd, atap_fs_out *o);

/* fs_file.c. atap_fs_meta of a status. */
void atap__fs_meta_of(const struct stat *st, atap_fs_meta *m);

/* fs_file.c. The ATAP_FS_TYPE_* of a mode, FIFOs, sockets and devices
 * told apart. */
int atap__fs_type_of(mode_t mode);

/* fs_file.c. A status as atap_fs_stat into buf, len bytes at most: 0, or
 * ATAP_EINVAL for len below sizeof(size_t). */
int atap__fs_stat_out(const struct stat *st, void *buf, size_t len);

/* fs_file.c. An operation with ATAP_FS_FD, or ATAP_FS_OPEN, its request
 * checked (atap_fs_run): out.rc's value. */
int atap__fs_file_op(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o);

#endif

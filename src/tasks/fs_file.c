/*
 * Operations on an open file (ATAP_FS_FD), the open that makes one, and a
 * file's status as atap_fs_meta and atap_fs_stat.
 *
 * fs.c's atap_fs_run checks the request and hands every ATAP_FS_OPEN, and
 * every request with ATAP_FS_FD, to atap__fs_file_op. The fd is the
 * caller's (atap_block) or a dup the spawn made (fs.c); either way this
 * file never closes it, but for ATAP_FS_CLOSE. Reads and writes go through
 * fs.c's atap__fs_move, in 64 KiB chunks with a look at a cancel before
 * each, at an offset (pread, pwrite) or at the fd's position (read, write,
 * which move it: a cancelled one leaves it after the chunks done). A sync
 * or a truncate is one system call, looked at a cancel before, not during.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "../abi.h"
#include "atap.h"
#include "fs_int.h"

/* ---- a file's status ------------------------------------------------------- */

static int64_t ns_of(struct timespec t) { return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec; }

#ifdef __APPLE__
#define ATIME(st) ((st)->st_atimespec)
#define MTIME(st) ((st)->st_mtimespec)
#define CTIME(st) ((st)->st_ctimespec)
#else
#define ATIME(st) ((st)->st_atim)
#define MTIME(st) ((st)->st_mtim)
#define CTIME(st) ((st)->st_ctim)
#endif

int atap__fs_type_of(mode_t mode)
{
    if (S_ISREG(mode))
        return ATAP_FS_TYPE_FILE;
    if (S_ISDIR(mode))
        return ATAP_FS_TYPE_DIR;
    if (S_ISLNK(mode))
        return ATAP_FS_TYPE_LINK;
    if (S_ISFIFO(mode))
        return ATAP_FS_TYPE_FIFO;
    if (S_ISSOCK(mode))
        return ATAP_FS_TYPE_SOCKET;
    if (S_ISCHR(mode))
        return ATAP_FS_TYPE_CHAR;
    if (S_ISBLK(mode))
        return ATAP_FS_TYPE_BLOCK;
    return ATAP_FS_TYPE_UNKNOWN;
}

void atap__fs_meta_of(const struct stat *st, atap_fs_meta *m)
{
    int type = atap__fs_type_of(st->st_mode);

    m->size = (uint64_t)st->st_size;
    m->mtime_ns = ns_of(MTIME(st));
    m->mode = (uint32_t)(st->st_mode & 07777);
    /* atap_fs_meta's types are those of libatap 0.1: one for the rest. */
    m->type = type == ATAP_FS_TYPE_FILE || type == ATAP_FS_TYPE_DIR || type == ATAP_FS_TYPE_LINK
                  ? type
                  : ATAP_FS_TYPE_OTHER;
}

int atap__fs_stat_out(const struct stat *st, void *buf, size_t len)
{
    atap_fs_stat s;

    memset(&s, 0, sizeof s);
    s.type = atap__fs_type_of(st->st_mode);
    s.mode = (uint32_t)(st->st_mode & 07777);
    s.bytes = (uint64_t)st->st_size;
    s.blocks = (uint64_t)st->st_blocks;
    s.dev = (uint64_t)st->st_dev;
    s.ino = (uint64_t)st->st_ino;
    s.nlink = (uint64_t)st->st_nlink;
    s.rdev = (uint64_t)st->st_rdev;
    s.atime_ns = ns_of(ATIME(st));
    s.mtime_ns = ns_of(MTIME(st));
    s.ctime_ns = ns_of(CTIME(st));
    s.uid = (uint32_t)st->st_uid;
    s.gid = (uint32_t)st->st_gid;
    s.blksize = (uint32_t)st->st_blksize;
    return atap__struct_out(buf, len, &s, sizeof s);
}

/* ---- the operations ---------------------------------------------------------- */

static int file_open(const atap_fs_req *q, atap_fs_out *o)
{
    mode_t mode = q->mode ? (mode_t)q->mode : 0666;
    int fd;

    if (q->mode > 07777)
        return ATAP_EINVAL;
    do
        fd = open(q->path, q->open_flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -errno;
    o->n = (size_t)fd;
    return 0;
}

/* Where a read or write is: the offset asked for, or -1 for the fd's
 * position. ATAP_EINVAL in *rc for an offset past what off_t holds. */
static int64_t where(const atap_fs_req *q, int *rc)
{
    *rc = 0;
    if (q->flags & ATAP_FS_AT_POSITION)
        return -1;
    if (q->offset > (uint64_t)INT64_MAX)
        *rc = ATAP_EINVAL;
    return (int64_t)q->offset;
}

static int file_read_at(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    unsigned char *buf = q->buf;
    int64_t off;
    size_t got;
    int rc;

    off = where(q, &rc);
    if (rc != 0)
        return rc;
    if (buf)
        rc = atap__fs_move(ctx, q->fd, true, buf, q->len, off, &got);
    else
        rc = atap__fs_read_grown(ctx, q->fd, off, q->len, &buf, &got);
    if (rc != 0)
        return rc; /* read_grown freed its buffer */
    o->data = buf;
    o->n = got;
    return 0;
}

static int file_write_at(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    int64_t off;
    int rc;

    off = where(q, &rc);
    if (rc != 0)
        return rc;
    return atap__fs_move(ctx, q->fd, false, (unsigned char *)(uintptr_t)q->data, q->len, off,
                         &o->n);
}

static int file_stat(const atap_fs_req *q, atap_fs_out *o)
{
    struct stat st;

    if (fstat(q->fd, &st) != 0)
        return -errno;
    atap__fs_meta_of(&st, &o->meta);
    return q->buf ? atap__fs_stat_out(&st, q->buf, q->len) : 0;
}

static int file_sync(const atap_fs_req *q)
{
    int rc;

#if defined(__APPLE__)
    rc = fsync(q->fd); /* no fdatasync to call */
#else
    rc = q->op == ATAP_FS_SYNC ? fsync(q->fd) : fdatasync(q->fd);
#endif
    return rc != 0 ? -errno : 0;
}

/* After a failed close the fd is gone all the same (Linux, the BSDs; on
 * EINTR too), so it is never closed again: EINTR is no error here. */
static int file_close(const atap_fs_req *q)
{
    return close(q->fd) != 0 && errno != EINTR ? -errno : 0;
}

int atap__fs_file_op(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    switch (q->op) {
    case ATAP_FS_OPEN:
        return file_open(q, o);
    case ATAP_FS_CLOSE:
        return file_close(q);
    case ATAP_FS_READ:
        return atap__fs_read_all(ctx, q->fd, o);
    case ATAP_FS_READ_AT:
        return file_read_at(ctx, q, o);
    case ATAP_FS_WRITE_AT:
        return file_write_at(ctx, q, o);
    case ATAP_FS_STAT:
        return file_stat(q, o);
    case ATAP_FS_SYNC:
    case ATAP_FS_DATASYNC:
        return file_sync(q);
    case ATAP_FS_SET_LEN:
        if (q->offset > (uint64_t)INT64_MAX)
            return ATAP_EINVAL;
        return ftruncate(q->fd, (off_t)q->offset) != 0 ? -errno : 0;
    case ATAP_FS_SET_MODE:
        if (q->mode > 07777)
            return ATAP_EINVAL;
        return fchmod(q->fd, (mode_t)q->mode) != 0 ? -errno : 0;
    default:
        return ATAP_EINVAL; /* the request's check lets no other through */
    }
}

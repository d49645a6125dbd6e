/*
 * File operations as tasks (the watch: fs_watch.c; the operations on an
 * open file, ATAP_FS_FD, and the open that makes one: fs_file.c).
 *
 * Every operation is one function, atap_fs_run, over an
 * atap_fs_req: spawned (atap_fs_spawn) it runs on the blocking threads, since
 * a regular file is always "ready" and a read of it blocks in the kernel
 * anyway; run with atap_block it runs on the caller's thread. The
 * operation's result goes in the output's rc, never in the task's return,
 * which readers would only see as ATAP_EFAILED: a task ends on its own
 * terms only by a cancel or a run timeout. Long operations look at
 * atap_cancelled() before each 64 KiB chunk or directory entry.
 *
 * A spawned request is a deep copy (struct fs_arg): the paths, and the data
 * to write unless the caller handed it over with data_free, and a dup of
 * an ATAP_FS_FD request's fd (sharing its position, so the caller may
 * close its own at once; CLOSE takes the caller's fd itself). Its arg_free
 * gives back what the caller lent (data_free, buf_done) once the task will
 * touch it no more, and closes the fd it holds. The spawned task function
 * is fs_task: it reports a dup that failed, runs atap_fs_run, and notes a
 * CLOSE's fd as gone.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "../abi.h"
#include "../atomics.h"
#include "atap.h"
#include "fs_int.h"

#define CHUNK ATAP__FS_CHUNK

/* Test hook: called after each chunk of a read, write or copy with the
 * bytes done so far, and after each entry of a read_dir or a tree removal
 * with the entries done so far (libatap's own tests slow an operation down
 * or cancel it at a known chunk or entry). NULL outside tests. */
_Atomic(void (*)(uint64_t)) atap__fs_chunk_hook;

static void chunk_done(uint64_t done)
{
    void (*hook)(uint64_t) = ld_acquire(&atap__fs_chunk_hook);

    if (hook)
        hook(done);
}

/* ---- small helpers -------------------------------------------------------- */

static int stopped(atap_ctx *ctx) { return atap_cancelled(ctx) ? ATAP_ECANCELLED : 0; }

static int open_rd(const char *path, int flags)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | flags);
    return fd < 0 ? -errno : fd;
}

/* fs_int.h says what it does. */
int atap__fs_move(atap_ctx *ctx, int fd, bool reading, unsigned char *buf, size_t len, int64_t off,
                  size_t *done)
{
    *done = 0;
    while (*done < len) {
        size_t n = len - *done < CHUNK ? len - *done : CHUNK;
        off_t at = (off_t)off + (off_t)*done;
        ssize_t k;
        int rc;

        if ((rc = stopped(ctx)) != 0)
            return rc;
        if (reading)
            k = off < 0 ? read(fd, buf + *done, n) : pread(fd, buf + *done, n, at);
        else
            k = off < 0 ? write(fd, buf + *done, n) : pwrite(fd, buf + *done, n, at);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (k == 0 && reading)
            break;
        *done += (size_t)k;
        chunk_done(*done);
    }
    return 0;
}

/* ---- reading --------------------------------------------------------------- */

int atap__fs_read_all(atap_ctx *ctx, int fd, atap_fs_out *o)
{
    size_t cap = 0, len = 0;
    unsigned char *buf = NULL;
    struct stat st;
    int rc = 0;

    if (fstat(fd, &st) != 0)
        return -errno;
    if (S_ISDIR(st.st_mode))
        return -EISDIR;
    /* The size is a hint (files grow, /proc says 0): read until a read
     * comes up short. Room for one byte more than the size (so a file that
     * did not grow ends with no second allocation), and the NUL after. */
    cap = S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size < SIZE_MAX - 2
              ? (size_t)st.st_size + 2
              : CHUNK;
    for (;;) {
        size_t got, want;
        if (!buf || len == cap - 1) {
            unsigned char *b;
            size_t ncap = buf ? cap * 2 : cap;
            if (ncap < cap || !(b = realloc(buf, ncap))) {
                rc = -ENOMEM;
                goto out;
            }
            buf = b;
            cap = ncap;
        }
        want = cap - 1 - len;
        /* read, not pread: a FIFO or a device reads too */
        /* buf is set: the first pass through the loop allocated it. */
        // cppcheck-suppress nullPointerArithmeticRedundantCheck
        if ((rc = atap__fs_move(ctx, fd, true, buf + len, want, -1, &got)) != 0)
            goto out;
        len += got;
        if (got < want)
            break; /* the end of the file */
    }
    buf[len] = 0;
    o->data = buf;
    o->n = len;
    buf = NULL;
out:
    free(buf);
    return rc;
}

static int op_read(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    int fd = open_rd(q->path, 0), rc;

    if (fd < 0)
        return fd;
    rc = atap__fs_read_all(ctx, fd, o);
    close(fd);
    return rc;
}

/* The room a READ_AT without a buffer starts with: what the file holds
 * past off (the fd's position when negative) by its size now, and a byte
 * more to see its end without a second allocation; a chunk for a file
 * whose size says nothing (0 from /proc, a device, a pipe); never more
 * than len. Never the request itself: a len of SIZE_MAX asks for "the
 * rest", not for that much memory. */
static size_t first_room(int fd, int64_t off, size_t len)
{
    struct stat st;
    size_t room = CHUNK;

    if (off < 0)
        off = (int64_t)lseek(fd, 0, SEEK_CUR);
    if (off >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        uint64_t at = (uint64_t)off;
        uint64_t left = (uint64_t)st.st_size > at ? (uint64_t)st.st_size - at : 0;
        room = left < SIZE_MAX - 1 ? (size_t)left + 1 : SIZE_MAX;
    }
    return room < len ? room : len;
}

/* Reads up to len bytes at off (the fd's position when negative) into a
 * buffer of its own (*out), grown (doubled, up to len) while the file
 * fills it: a file may have grown since its size was looked at, or have
 * no size to look at. */
int atap__fs_read_grown(atap_ctx *ctx, int fd, int64_t off, size_t len, unsigned char **out,
                        size_t *got)
{
    size_t cap = first_room(fd, off, len), n;
    unsigned char *buf = malloc(cap ? cap : 1), *b;
    int rc;

    *got = 0;
    if (!buf)
        return -ENOMEM;
    for (;;) {
        rc = atap__fs_move(ctx, fd, true, buf + *got, cap - *got,
                           off < 0 ? -1 : off + (int64_t)*got, &n);
        *got += n;
        if (rc != 0 || *got < cap || cap == len)
            break; /* an error, the end of the file, or all that was asked */
        cap = cap && cap <= len / 2 ? cap * 2 : len; /* cap < len here: never 0 */
        if (!(b = realloc(buf, cap))) {
            rc = -ENOMEM;
            break;
        }
        buf = b;
    }
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

static int op_read_at(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    unsigned char *buf = q->buf;
    int fd, rc;
    size_t got;

    if (q->offset > (uint64_t)INT64_MAX)
        return ATAP_EINVAL;
    if ((fd = open_rd(q->path, 0)) < 0)
        return fd;
    if (buf)
        rc = atap__fs_move(ctx, fd, true, buf, q->len, (int64_t)q->offset, &got);
    else
        rc = atap__fs_read_grown(ctx, fd, (int64_t)q->offset, q->len, &buf, &got);
    if (rc == -EISDIR || (rc == 0 && got == 0 && q->len > 0)) {
        struct stat st; /* pread of a directory says EISDIR on Linux; elsewhere look */
        if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
            rc = -EISDIR;
    }
    close(fd);
    if (rc != 0) {
        if (buf != q->buf)
            free(buf);
        return rc;
    }
    o->data = buf;
    o->n = got;
    return 0;
}

/* ---- writing --------------------------------------------------------------- */

static int op_write(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    mode_t mode = q->mode ? (mode_t)q->mode : 0666;
    int flags = O_WRONLY | O_CLOEXEC, fd, rc, e;
    int64_t off = -1;

    if (q->op == ATAP_FS_WRITE)
        flags |= O_CREAT | O_TRUNC;
    else if (q->op == ATAP_FS_APPEND)
        flags |= O_CREAT | O_APPEND;
    else if (q->offset > (uint64_t)INT64_MAX)
        return ATAP_EINVAL;
    else
        off = (int64_t)q->offset;
    if ((rc = stopped(ctx)) != 0)
        return rc;
    if ((fd = open(q->path, flags, mode)) < 0)
        return -errno;
    rc = atap__fs_move(ctx, fd, false, (unsigned char *)q->data, q->len, off, &o->n);
    e = close(fd) != 0 ? -errno : 0;
    return rc ? rc : e;
}

static int op_set(const atap_fs_req *q)
{
    if (q->op == ATAP_FS_SET_MODE) {
        if (q->mode > 07777)
            return ATAP_EINVAL;
        return chmod(q->path, (mode_t)q->mode) != 0 ? -errno : 0;
    }
    if (q->offset > (uint64_t)INT64_MAX)
        return ATAP_EINVAL;
    return truncate(q->path, (off_t)q->offset) != 0 ? -errno : 0;
}

/* ---- metadata -------------------------------------------------------------- */

static int op_stat(const atap_fs_req *q, atap_fs_out *o)
{
    struct stat st;

    if ((q->op == ATAP_FS_STAT ? stat(q->path, &st) : lstat(q->path, &st)) != 0)
        return -errno;
    atap__fs_meta_of(&st, &o->meta);
    o->n = 0;
    return q->buf ? atap__fs_stat_out(&st, q->buf, q->len) : 0;
}

static int op_read_link(const atap_fs_req *q, atap_fs_out *o)
{
    size_t cap = 256;
    char *buf = NULL;

    for (;;) {
        char *b;
        ssize_t n;

        if (!(b = realloc(buf, cap))) {
            free(buf);
            return -ENOMEM;
        }
        buf = b;
        if ((n = readlink(q->path, buf, cap)) < 0) {
            int rc = -errno;
            free(buf);
            return rc;
        }
        if ((size_t)n < cap) { /* it fit, with room for the NUL */
            buf[n] = 0;
            o->data = buf;
            o->n = (size_t)n;
            return 0;
        }
        cap *= 2;
    }
}

/* ---- directories ----------------------------------------------------------- */

/* An entry's type as the directory tells it, or as lstat says where it
 * does not; ATAP_FS_TYPE_UNKNOWN for one gone meanwhile. */
static int entry_type(DIR *d, const struct dirent *e)
{
    struct stat st;

#ifdef DT_UNKNOWN
    switch (e->d_type) {
    case DT_REG:
        return ATAP_FS_TYPE_FILE;
    case DT_DIR:
        return ATAP_FS_TYPE_DIR;
    case DT_LNK:
        return ATAP_FS_TYPE_LINK;
    case DT_FIFO:
        return ATAP_FS_TYPE_FIFO;
    case DT_SOCK:
        return ATAP_FS_TYPE_SOCKET;
    case DT_CHR:
        return ATAP_FS_TYPE_CHAR;
    case DT_BLK:
        return ATAP_FS_TYPE_BLOCK;
    default:
        break;
    }
#endif
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return ATAP_FS_TYPE_UNKNOWN;
    return atap__fs_type_of(st.st_mode);
}

/* The names read so far, one after the other, each NUL-ended; and with
 * types, each one's inode and type (kinds[i] for the i-th name). */
struct dir_list {
    char *names;
    size_t used, cap, count;
    atap_fs_dirent *kinds; /* name unset: the names move when they grow */
    size_t kinds_cap;
};

static int dir_add(struct dir_list *l, DIR *d, const struct dirent *e, bool types)
{
    size_t n = strlen(e->d_name) + 1;

    if (l->used + n > l->cap) {
        size_t cap = l->cap;
        char *b;
        while (l->used + n > cap)
            cap *= 2;
        if (!(b = realloc(l->names, cap)))
            return -ENOMEM;
        l->names = b;
        l->cap = cap;
    }
    if (types && l->count == l->kinds_cap) {
        size_t cap = l->kinds_cap ? l->kinds_cap * 2 : 64;
        atap_fs_dirent *k = realloc(l->kinds, cap * sizeof *k);
        if (!k)
            return -ENOMEM;
        l->kinds = k;
        l->kinds_cap = cap;
    }
    memcpy(l->names + l->used, e->d_name, n);
    l->used += n;
    if (types) {
        l->kinds[l->count].ino = (uint64_t)e->d_ino;
        l->kinds[l->count].type = entry_type(d, e);
    }
    l->count++;
    return 0;
}

/* One block: the pointers (or entries), a NULL one, then the names. */
static int dir_block(const struct dir_list *l, bool types, atap_fs_out *o)
{
    size_t each = types ? sizeof(atap_fs_dirent) : sizeof(char *);
    size_t bytes = (l->count + 1) * each;
    char *block = malloc(bytes + l->used), *name;

    if (!block)
        return -ENOMEM;
    name = block + bytes;
    if (l->used)
        memcpy(name, l->names, l->used);
    for (size_t i = 0; i <= l->count; i++) {
        char *at = i < l->count ? name : NULL;
        if (types) {
            atap_fs_dirent *v = (atap_fs_dirent *)(void *)block;
            v[i].name = at;
            v[i].ino = i < l->count ? l->kinds[i].ino : 0;
            v[i].type = i < l->count ? l->kinds[i].type : ATAP_FS_TYPE_UNKNOWN;
        } else {
            ((char **)(void *)block)[i] = at;
        }
        if (at)
            name += strlen(at) + 1;
    }
    o->data = block;
    o->n = l->count;
    return 0;
}

static int op_read_dir(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    bool types = (q->flags & ATAP_FS_TYPES) != 0;
    struct dir_list l = {.cap = 4096};
    struct dirent *e;
    int rc = 0;
    DIR *d;

    /* opendir opens with O_CLOEXEC (glibc, musl, the BSDs and macOS). */
    if (!(d = opendir(q->path)))
        return -errno;
    if (!(l.names = malloc(l.cap))) {
        closedir(d);
        return -ENOMEM;
    }
    for (;;) {
        if ((rc = stopped(ctx)) != 0)
            break;
        errno = 0;
        if (!(e = readdir(d))) {
            rc = errno ? -errno : 0;
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((rc = dir_add(&l, d, e, types)) != 0)
            break;
        chunk_done(l.count);
    }
    closedir(d);
    if (rc == 0)
        rc = dir_block(&l, types, o);
    free(l.names);
    free(l.kinds);
    return rc;
}

static int op_create_dir(atap_ctx *ctx, const atap_fs_req *q)
{
    mode_t mode = q->mode ? (mode_t)q->mode : 0777;
    struct stat st;
    char *p;
    int rc = 0;

    if (!(q->flags & ATAP_FS_PARENTS) || !*q->path)
        return mkdir(q->path, mode) != 0 ? -errno : 0;
    if (!(p = strdup(q->path)))
        return -ENOMEM;
    /* Each prefix that ends at a '/' (and the whole path), in turn. */
    for (char *s = p + 1;; s++) {
        bool end = *s == 0;
        if (*s != '/' && !end)
            continue;
        if ((rc = stopped(ctx)) != 0)
            break;
        *s = 0;
        if (mkdir(p, mode) != 0) { /* there already (fine if a directory), or not possible */
            if (errno != EEXIST) {
                rc = -errno;
                break;
            }
            if (stat(p, &st) != 0) {
                rc = -errno;
                break;
            }
            if (!S_ISDIR(st.st_mode)) {
                rc = end ? -EEXIST : -ENOTDIR;
                break;
            }
        }
        if (end)
            break;
        *s = '/';
        while (s[1] == '/')
            s++;
    }
    free(p);
    return rc;
}

/* Removes everything inside the directory open as dfd (which it closes),
 * depth first, links not followed; *removed counts the entries. */
static int remove_inside(atap_ctx *ctx, int dfd, uint64_t *removed)
{
    struct dirent *e;
    int rc = 0;
    DIR *d;

    if (!(d = fdopendir(dfd))) {
        rc = -errno;
        close(dfd);
        return rc;
    }
    for (;;) {
        int sub;
        if ((rc = stopped(ctx)) != 0)
            break;
        errno = 0;
        if (!(e = readdir(d))) {
            rc = errno ? -errno : 0;
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 || errno == ENOENT) {
            chunk_done(++*removed);
            continue;
        }
        if (errno != EISDIR && errno != EPERM) {
            rc = -errno;
            break;
        }
        /* A directory (unlink says EISDIR on Linux, EPERM elsewhere). */
        sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) { /* not a directory after all: the unlink's EPERM stands */
            rc = errno == ENOTDIR || errno == ELOOP ? -EPERM : -errno;
            break;
        }
        if ((rc = remove_inside(ctx, sub, removed)) != 0)
            break;
        if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
            rc = -errno;
            break;
        }
        chunk_done(++*removed);
    }
    closedir(d);
    return rc;
}

static int op_remove(atap_ctx *ctx, const atap_fs_req *q)
{
    uint64_t removed = 0;
    struct stat st;
    int fd, rc;

    if (lstat(q->path, &st) != 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return unlink(q->path) != 0 ? -errno : 0;
    if (q->flags & ATAP_FS_TREE) {
        if ((fd = open(q->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
            return -errno;
        if ((rc = remove_inside(ctx, fd, &removed)) != 0)
            return rc;
    }
    if (rmdir(q->path) != 0)
        return errno == EEXIST ? -ENOTEMPTY : -errno;
    return 0;
}

/* ---- copy ------------------------------------------------------------------ */

/* Copies in to out in chunks: copy_file_range while the kernel takes it
 * (Linux; it may refuse across file systems or on some, before any byte
 * moved), else read and write through a buffer. */
static int copy_chunks(atap_ctx *ctx, int in, int out, size_t *copied)
{
    unsigned char *buf = NULL;
    bool kernel = true;
    int rc = 0;

#ifndef __linux__
    kernel = false;
#endif
    *copied = 0;
    for (;;) {
        ssize_t n = 0;
        if ((rc = stopped(ctx)) != 0)
            break;
#ifdef __linux__
        if (kernel) {
            n = copy_file_range(in, NULL, out, NULL, CHUNK, 0);
            if (n < 0 && *copied == 0 &&
                (errno == ENOSYS || errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP ||
                 errno == EPERM)) {
                kernel = false; /* not here: through user space */
                continue;
            }
        }
#endif
        if (!kernel) {
            if (!buf && !(buf = malloc(CHUNK))) {
                rc = -ENOMEM;
                break;
            }
            n = read(in, buf, CHUNK);
            for (ssize_t at = 0, w; n > 0 && at < n; at += w) {
                if ((w = write(out, buf + at, (size_t)(n - at))) < 0) {
                    if (errno != EINTR)
                        goto failed;
                    w = 0;
                }
            }
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            goto failed;
        }
        if (n == 0)
            break;
        *copied += (size_t)n;
        chunk_done(*copied);
    }
    free(buf);
    return rc;
failed:
    rc = -errno;
    free(buf);
    return rc;
}

static int op_copy(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    int in, out, rc;
    struct stat st;

    if ((in = open_rd(q->path, 0)) < 0)
        return in;
    if (fstat(in, &st) != 0 || S_ISDIR(st.st_mode)) {
        rc = S_ISDIR(st.st_mode) ? -EISDIR : -errno;
        close(in);
        return rc;
    }
    if ((out = open(q->path2, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, st.st_mode & 07777)) < 0) {
        rc = -errno;
        close(in);
        return rc;
    }
    /* A file that was there keeps its mode through O_TRUNC: set it. */
    rc = fchmod(out, st.st_mode & 07777) != 0 ? -errno : copy_chunks(ctx, in, out, &o->n);
    close(in);
    if (close(out) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* ---- the request ------------------------------------------------------------ */

static bool needs_path2(atap_fs_op op)
{
    return op == ATAP_FS_RENAME || op == ATAP_FS_SYMLINK || op == ATAP_FS_LINK ||
           op == ATAP_FS_COPY;
}

static bool is_write(atap_fs_op op)
{
    return op == ATAP_FS_WRITE || op == ATAP_FS_APPEND || op == ATAP_FS_WRITE_AT;
}

/* The operations on an open file: those that take ATAP_FS_FD, and of them
 * those that work on nothing else. */
static bool takes_fd(atap_fs_op op)
{
    return op == ATAP_FS_READ || op == ATAP_FS_READ_AT || op == ATAP_FS_WRITE_AT ||
           op == ATAP_FS_STAT || op == ATAP_FS_SET_LEN || op == ATAP_FS_SET_MODE ||
           op == ATAP_FS_CLOSE || op == ATAP_FS_SYNC || op == ATAP_FS_DATASYNC;
}

static bool needs_fd(atap_fs_op op)
{
    return op == ATAP_FS_CLOSE || op == ATAP_FS_SYNC || op == ATAP_FS_DATASYNC;
}

/* 0, or ATAP_EINVAL for a request that makes no sense as it stands. given:
 * the size the caller's request had (0: the layout of libatap 0.1), which
 * must hold fd and open_flags when they are to be read. */
static int check_req(const atap_fs_req *q, size_t given)
{
    size_t needed = offsetof(atap_fs_req, open_flags) + sizeof q->open_flags;
    bool fd = (q->flags & ATAP_FS_FD) != 0;

    if (q->op < ATAP_FS_READ || q->op > ATAP_FS_DATASYNC)
        return ATAP_EINVAL;
    if ((fd || q->op == ATAP_FS_OPEN) && (given ? given : ATAP__FS_REQ_FIRST) < needed)
        return ATAP_EINVAL;
    if (fd ? q->path || q->fd < 0 || !takes_fd(q->op) : !q->path || needs_fd(q->op))
        return ATAP_EINVAL;
    if ((q->flags & ATAP_FS_AT_POSITION) &&
        (!fd || (q->op != ATAP_FS_READ_AT && q->op != ATAP_FS_WRITE_AT)))
        return ATAP_EINVAL;
    if ((needs_path2(q->op) && !q->path2) || (is_write(q->op) && q->len && !q->data))
        return ATAP_EINVAL;
    if ((q->op == ATAP_FS_STAT || q->op == ATAP_FS_LSTAT) && q->buf && q->len < sizeof(size_t))
        return ATAP_EINVAL;
    return 0;
}

/* ---- the task function ------------------------------------------------------ */

static int op_path(atap_ctx *ctx, const atap_fs_req *q, atap_fs_out *o)
{
    switch (q->op) {
    case ATAP_FS_READ:
        return op_read(ctx, q, o);
    case ATAP_FS_READ_AT:
        return op_read_at(ctx, q, o);
    case ATAP_FS_WRITE:
    case ATAP_FS_APPEND:
    case ATAP_FS_WRITE_AT:
        return op_write(ctx, q, o);
    case ATAP_FS_STAT:
    case ATAP_FS_LSTAT:
        return op_stat(q, o);
    case ATAP_FS_READ_DIR:
        return op_read_dir(ctx, q, o);
    case ATAP_FS_CREATE_DIR:
        return op_create_dir(ctx, q);
    case ATAP_FS_REMOVE:
        return op_remove(ctx, q);
    case ATAP_FS_RENAME:
        return rename(q->path, q->path2) != 0 ? -errno : 0;
    case ATAP_FS_SYMLINK:
        return symlink(q->path, q->path2) != 0 ? -errno : 0;
    case ATAP_FS_LINK:
        return link(q->path, q->path2) != 0 ? -errno : 0;
    case ATAP_FS_READ_LINK:
        return op_read_link(q, o);
    case ATAP_FS_COPY:
        return op_copy(ctx, q, o);
    case ATAP_FS_SET_MODE:
    case ATAP_FS_SET_LEN:
        return op_set(q);
    default:
        return ATAP_EINVAL;
    }
}

int atap_fs_run(atap_ctx *ctx, void *arg, void *out)
{
    atap_fs_req req = {0}; /* the caller's, in this library's layout (abi.h) */
    const atap_fs_req *q = &req;
    atap_fs_out o = {0};
    size_t given = 0;
    int rc;

    if (arg)
        memcpy(&given, arg, sizeof given);
    if (!arg || atap__struct_in(&req, sizeof req, arg, ATAP__FS_REQ_FIRST) != 0 ||
        check_req(q, given) != 0)
        rc = ATAP_EINVAL;
    else if (q->op == ATAP_FS_CLOSE)
        rc = atap__fs_file_op(ctx, q, &o); /* even when cancelled: the fd is to go */
    else if ((rc = stopped(ctx)) != 0)
        ;
    else if (q->op == ATAP_FS_OPEN || (q->flags & ATAP_FS_FD))
        rc = atap__fs_file_op(ctx, q, &o);
    else
        rc = op_path(ctx, q, &o);
    o.rc = rc;
    if (out)
        memcpy(out, &o, sizeof o);
    else if (q->op == ATAP_FS_OPEN && rc == 0)
        close((int)o.n); /* nobody asked for it */
    else if (o.data != q->buf)
        free(o.data);
    return 0;
}

/* ---- spawning ---------------------------------------------------------------- */

struct fs_arg {
    atap_fs_req req; /* its paths and (unless handed over) data are ours */
    bool own_data;
    int fd;    /* the fd the task holds (ATAP_FS_FD: a dup; CLOSE's), or -1 */
    int fd_rc; /* why the dup failed: the run's result */
};

static void fs_arg_free(void *arg)
{
    struct fs_arg *a = arg;

    if (a->req.data_free && a->req.data) /* kept only for the writes */
        a->req.data_free((void *)(uintptr_t)a->req.data);
    else if (a->own_data)
        free((void *)(uintptr_t)a->req.data);
    if (a->req.buf_done && a->req.buf)
        a->req.buf_done(a->req.buf);
    if (a->fd >= 0)
        close(a->fd); /* a dup, or a CLOSE that did not run */
    free((void *)(uintptr_t)a->req.path);
    free((void *)(uintptr_t)a->req.path2);
    free(a);
}

/* Not used for a READ_AT into the caller's buf: that data is the caller's. */
static void fs_out_free(void *out)
{
    atap_fs_out o;

    memcpy(&o, out, sizeof o);
    free(o.data);
}

/* An ATAP_FS_OPEN's fd that nobody took. */
static void fs_open_out_free(void *out)
{
    atap_fs_out o;

    memcpy(&o, out, sizeof o);
    if (o.rc == 0)
        close((int)o.n);
}

static int fs_task(atap_ctx *ctx, void *arg, void *out)
{
    struct fs_arg *a = arg;

    if (a->fd_rc != 0) {
        atap_fs_out o = {.rc = a->fd_rc};
        memcpy(out, &o, sizeof o);
        return 0;
    }
    atap_fs_run(ctx, &a->req, out);
    if (a->req.op == ATAP_FS_CLOSE)
        a->fd = -1; /* closed by the run, whatever close(2) said */
    return 0;
}

/* The fd the task works on: CLOSE's own, or a dup that shares its
 * position (its failure is the run's result). */
static void take_fd(struct fs_arg *a, int fd)
{
    a->fd = -1;
    if (!(a->req.flags & ATAP_FS_FD))
        return;
    if (a->req.op == ATAP_FS_CLOSE) {
        a->fd = fd;
        return;
    }
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (a->fd < 0)
        a->fd_rc = -errno;
    a->req.fd = a->fd;
}

int atap_fs_spawn(atap_task *task, const atap_fs_req *req, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    atap_fs_req q;
    struct fs_arg *a;
    size_t given;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (!req || atap__struct_in(&q, sizeof q, req, ATAP__FS_REQ_FIRST) != 0)
        return ATAP_EINVAL;
    memcpy(&given, req, sizeof given);
    if (check_req(&q, given) != 0)
        return ATAP_EINVAL;
    if ((o.out_size != 0 && o.out_size != sizeof(atap_fs_out)) || o.kind != ATAP_ONCE ||
        o.arg_free || o.out_free || o.gives || o.in_free)
        return ATAP_EINVAL;
    if (!(a = calloc(1, sizeof *a)))
        return -ENOMEM;
    a->req = q;
    a->req.path = q.path ? strdup(q.path) : NULL;
    a->req.path2 = q.path2 ? strdup(q.path2) : NULL;
    a->req.data = NULL;
    if (is_write(q.op)) {
        if (q.data_free || !q.len) {
            a->req.data = q.data;
        } else if ((a->req.data = malloc(q.len)) != NULL) {
            memcpy((void *)(uintptr_t)a->req.data, q.data, q.len);
            a->own_data = true;
        }
    }
    if (q.op != ATAP_FS_READ_AT && q.op != ATAP_FS_STAT && q.op != ATAP_FS_LSTAT)
        a->req.buf = NULL;
    take_fd(a, q.fd);
    if ((q.path && !a->req.path) || (q.path2 && !a->req.path2) ||
        (q.len && q.data && is_write(q.op) && !a->req.data)) {
        rc = -ENOMEM;
        goto fail;
    }
    o.out_size = sizeof(atap_fs_out);
    o.out_free = q.op == ATAP_FS_OPEN               ? fs_open_out_free
                 : q.op == ATAP_FS_READ_AT && q.buf ? NULL
                                                    : fs_out_free;
    o.arg_free = fs_arg_free;
    o.blocking = true;
    if ((rc = atap_spawn(task, fs_task, a, &o)) == 0)
        return 0;
fail:
    if (a->fd >= 0 && q.op != ATAP_FS_CLOSE)
        close(a->fd); /* our dup; CLOSE's fd stays the caller's */
    if (a->own_data)
        free((void *)(uintptr_t)a->req.data);
    free((void *)(uintptr_t)a->req.path);
    free((void *)(uintptr_t)a->req.path2);
    free(a);
    return rc;
}

/*
 * File and directory watches as tasks (atap_fs_spawn_watch).
 *
 * The watch parks on atap_park_path. The kernel's reports cover only the
 * time a run is parked, and a repeat's runs are not always parked (between
 * runs, or before the first park), so each run also compares the file's
 * fstat with the one it last reported from, and parks at most WATCH_POLL_NS
 * at a time to compare again: a change that slipped in before the watch was
 * set up is found at the next look. ATAP_PATH_GONE comes from the kernel (a
 * rename, a delete) or from a status with no links left (inotify reports a
 * delete only once the last descriptor closes, and the watch holds one).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "atap.h"

#define WATCH_POLL_NS ATAP_MS(50)

struct watch {
    int fd;
    unsigned changes; /* asked for, ATAP_PATH_GONE included */
    bool dir;
    bool gone;        /* ATAP_PATH_GONE reported: the next run ends it */
    unsigned pending; /* seen and not reported yet */
    struct stat last; /* the status the last look saw */
};

static bool ts_eq(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* What changed between two statuses of one file, as ATAP_PATH_* bits. */
static unsigned diff_of(const struct watch *w, const struct stat *a, const struct stat *b)
{
    unsigned bits = 0;
#ifdef __APPLE__
    bool mtime = !ts_eq(&a->st_mtimespec, &b->st_mtimespec);
    bool ctime = !ts_eq(&a->st_ctimespec, &b->st_ctimespec);
#else
    bool mtime = !ts_eq(&a->st_mtim, &b->st_mtim);
    bool ctime = !ts_eq(&a->st_ctim, &b->st_ctim);
#endif

    if (mtime || a->st_size != b->st_size)
        bits |= w->dir ? ATAP_PATH_ENTRIES : ATAP_PATH_WRITE;
    if (a->st_mode != b->st_mode || a->st_uid != b->st_uid || a->st_gid != b->st_gid ||
        a->st_nlink != b->st_nlink || (ctime && !mtime))
        bits |= ATAP_PATH_ATTRIB;
    if (b->st_nlink == 0)
        bits |= ATAP_PATH_GONE;
    return bits;
}

/* Looks at the file: what changed since the last look joins `pending`. */
static void watch_look(struct watch *w)
{
    struct stat now;

    if (fstat(w->fd, &now) != 0)
        return;
    w->pending |= diff_of(w, &w->last, &now);
    w->last = now;
}

static int watch_run(atap_ctx *ctx, void *arg, void *out)
{
    struct watch *w = arg;
    unsigned got;

    if (w->gone)
        return ATAP_EFINISHED; /* removal was the last report */
    if (atap_resumed(ctx) && atap_resume_reason(ctx) == ATAP_RESUME_READY) {
        unsigned ev = atap_resume_events(ctx);
        if (ev == ATAP_ERROR)
            return ATAP_EFAILED; /* the kernel would not watch it */
        w->pending |=
            ev & (ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE);
    }
    watch_look(w);
    if ((got = w->pending & w->changes) == 0) {
        w->pending = 0; /* nothing asked for: not kept for later */
        if (atap_park_path(ctx, w->fd, w->changes, WATCH_POLL_NS) != 0)
            return ATAP_EFAILED;
        return ATAP_PARKED;
    }
    w->pending = 0;
    w->gone = (got & ATAP_PATH_GONE) != 0;
    if (out)
        memcpy(out, &got, sizeof got);
    return 0;
}

static void watch_free(void *arg)
{
    struct watch *w = arg;

    close(w->fd);
    free(w);
}

int atap_fs_spawn_watch(atap_task *task, const char *path, int fd, unsigned changes,
                        const atap_spawn_opts *opts)
{
    const unsigned all = ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE;
    atap_spawn_opts o = opts ? *opts : (atap_spawn_opts){0};
    struct watch *w;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if ((!path && fd < 0) || (changes & ~all) ||
        (o.out_size != 0 && o.out_size != sizeof(unsigned)) ||
        (o.kind != ATAP_ONCE && o.kind != ATAP_REPEAT) || o.arg_free || o.out_free || o.gives ||
        o.in_free || o.blocking)
        return ATAP_EINVAL;
    if (!(w = calloc(1, sizeof *w)))
        return -ENOMEM;
    w->changes = (changes ? changes : all) | ATAP_PATH_GONE;
    if (path)
        w->fd = (rc = open(path, O_RDONLY | O_CLOEXEC)) < 0 ? -errno : rc;
    else
        w->fd = (rc = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0 ? -errno : rc;
    if (w->fd < 0 || fstat(w->fd, &w->last) != 0) {
        rc = w->fd < 0 ? w->fd : -errno;
        if (w->fd >= 0)
            close(w->fd);
        free(w);
        return rc;
    }
    w->dir = S_ISDIR(w->last.st_mode);
    o.out_size = sizeof(unsigned);
    o.arg_free = watch_free;
    if ((rc = atap_spawn(task, watch_run, w, &o)) != 0) {
        close(w->fd);
        free(w);
    }
    return rc;
}

/*
 * File and directory watches as tasks (atap_fs_spawn_watch).
 *
 * On Linux each watch has an inotify fd of its own, with one kernel watch
 * on the file made at the spawn and kept until the task is gone: what
 * happens to the file queues there from the spawn on, whether a run is
 * parked or not (between the runs of a repeat, while a run looks), so
 * nothing between two reports is lost, and each event of a directory
 * names its entry, which the report passes on (atap_fs_watch_report). A
 * run reads the queue, and parks on the inotify fd (atap_park_fd) while
 * it is empty. A queue that overflowed reports every change but GONE,
 * names none, and says so (`more`). Where inotify is not to be had (no
 * inotify fd left: the per-user limit of instances; not Linux) the watch
 * parks on atap_park_path instead, whose kernel watch lasts only while a
 * run is parked.
 *
 * Either way each run also compares the file's fstat with the one it last
 * looked at, and parks at most WATCH_POLL_NS at a time to compare again:
 * a change no event told of (before atap_park_path was set up, say) is
 * found at the next look. ATAP_PATH_GONE comes from the kernel (a rename,
 * a delete) or from a status with no links left (inotify reports a delete
 * only once the last descriptor closes, and the watch holds one).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <stdio.h>
#include <sys/inotify.h>
#define WATCH_INOTIFY 1
#else
#define WATCH_INOTIFY 0
#endif

#include "../abi.h"
#include "atap.h"
#if WATCH_INOTIFY
#include "../inotify_changes.h"
#endif

#define WATCH_POLL_NS ATAP_MS(50)

struct watch {
    int fd;
    int ino;          /* its inotify fd, -1: parks on atap_park_path */
    unsigned changes; /* asked for, ATAP_PATH_GONE included */
    bool dir;
    bool gone;                       /* ATAP_PATH_GONE reported: the next run ends it */
    bool more;                       /* changes not named: names ran out of room, or lost */
    bool report;                     /* the output is an atap_fs_watch_report (else unsigned) */
    unsigned pending;                /* seen and not reported yet */
    unsigned count;                  /* entries named in names */
    size_t used;                     /* bytes of names in use */
    struct stat last;                /* the status the last look saw */
    char names[ATAP_FS_WATCH_NAMES]; /* the entries changed since the last
                                        report, each NUL-ended, each once */
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

/* name (an entry of the watched directory) changed: named in the next
 * report, once; past the room, the report says `more`. */
static void watch_name(struct watch *w, const char *name)
{
    size_t len = strlen(name);

    for (size_t at = 0; at < w->used; at += strlen(w->names + at) + 1)
        if (strcmp(w->names + at, name) == 0)
            return;
    if (len + 1 > sizeof w->names - w->used) {
        w->more = true;
        return;
    }
    memcpy(w->names + w->used, name, len + 1);
    w->used += len + 1;
    w->count++;
}

#if WATCH_INOTIFY

/* The watch's own inotify fd, watching the file open as fd for `changes`
 * (by /proc/self/fd, so the open file itself is watched), or -1. */
static int watch_open_inotify(int fd, unsigned changes)
{
    char path[64];
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);

    if (ino < 0)
        return -1;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (inotify_add_watch(ino, path, atap__inotify_mask(changes)) < 0) {
        close(ino);
        return -1;
    }
    return ino;
}

/* Reads what inotify queued into `pending` and the names. */
static void watch_read(struct watch *w)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;

    while ((n = read(w->ino, buf, sizeof buf)) > 0) {
        for (ssize_t at = 0; at < n;) {
            const struct inotify_event *e = (const void *)(buf + at);
            unsigned bits = atap__inotify_changes(e->mask);

            if (e->mask & IN_Q_OVERFLOW) { /* lost: all may have changed */
                bits = ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES;
                w->more = true;
            }
            w->pending |= bits;
            if (e->len > 0 && e->name[0] && (bits & w->changes))
                watch_name(w, e->name);
            at += (ssize_t)sizeof *e + e->len;
        }
    }
}
#endif

/* Parks until the next change (or WATCH_POLL_NS, to look again). */
static int watch_park(atap_ctx *ctx, struct watch *w)
{
#if WATCH_INOTIFY
    if (w->ino >= 0)
        return atap_park_fd(ctx, w->ino, ATAP_READABLE, WATCH_POLL_NS);
#endif
    return atap_park_path(ctx, w->fd, w->changes, WATCH_POLL_NS);
}

static int watch_run(atap_ctx *ctx, void *arg, void *out)
{
    struct watch *w = arg;
    atap_fs_watch_report *r = out;
    unsigned got;

    if (w->gone)
        return ATAP_EFINISHED; /* removal was the last report */
    if (atap_resumed(ctx) && atap_resume_reason(ctx) == ATAP_RESUME_READY) {
        unsigned ev = atap_resume_events(ctx);
        if (ev == ATAP_ERROR)
            return ATAP_EFAILED; /* the kernel would not watch it */
        if (w->ino < 0)
            w->pending |=
                ev & (ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE);
    }
#if WATCH_INOTIFY
    if (w->ino >= 0)
        watch_read(w);
#endif
    watch_look(w);
    if ((got = w->pending & w->changes) == 0) {
        w->pending = 0; /* nothing asked for: not kept for later */
        if (watch_park(ctx, w) != 0)
            return ATAP_EFAILED;
        return ATAP_PARKED;
    }
    w->pending = 0;
    w->gone = (got & ATAP_PATH_GONE) != 0;
    if (w->report) {
        r->changes = got;
        r->count = w->count;
        r->more = w->more;
        memcpy(r->names, w->names, w->used);
        memset(r->names + w->used, 0, sizeof r->names - w->used);
    } else if (out) {
        memcpy(out, &got, sizeof got);
    }
    w->count = 0;
    w->used = 0;
    w->more = false;
    return 0;
}

static void watch_free(void *arg)
{
    struct watch *w = arg;

    if (w->ino >= 0)
        close(w->ino);
    close(w->fd);
    free(w);
}

int atap_fs_spawn_watch(atap_task *task, const char *path, int fd, unsigned changes,
                        const atap_spawn_opts *opts)
{
    const unsigned all = ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE;
    atap_spawn_opts o;
    struct watch *w;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if ((!path && fd < 0) || (changes & ~all) ||
        (o.out_size != 0 && o.out_size != sizeof(unsigned) &&
         o.out_size != sizeof(atap_fs_watch_report)) ||
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
    w->report = o.out_size == sizeof(atap_fs_watch_report);
#if WATCH_INOTIFY
    w->ino = watch_open_inotify(w->fd, w->changes);
#else
    w->ino = -1;
#endif
    o.out_size = w->report ? sizeof(atap_fs_watch_report) : sizeof(unsigned);
    o.arg_free = watch_free;
    if ((rc = atap_spawn(task, watch_run, w, &o)) != 0)
        watch_free(w);
    return rc;
}

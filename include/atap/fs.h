/*
 * libatap's built-in tasks: files (operations and watches). Written on the runtime's public calls
 * alone (atap/core.h). <atap.h> includes this header; a program may
 * include it alone, with <atap/core.h>, to keep the other areas out.
 */
#ifndef ATAP_FS_H
#define ATAP_FS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Files and watches                                                       */
/* ---------------------------------------------------------------------- */

/*
 * File operations as tasks (src/tasks/fs.c). A regular file is always
 * "ready" to epoll and kqueue, so every operation but the watch runs on the
 * blocking threads (opts.blocking is set for it) and holds one while it
 * runs. Long ones (whole-file read, writes, copy, read_dir, create_dir with
 * parents, remove of a tree) look at atap_cancelled() between 64 KiB chunks
 * or directory entries, so a cancel or a run timeout stops them there; a
 * single system call is not interrupted. Nothing done is undone: a write,
 * copy or tree removal stopped half way leaves what it did (a copy, whole
 * chunks of it). Every descriptor is opened O_CLOEXEC.
 *
 * A file may also be opened once (ATAP_FS_OPEN, which gives its fd) and
 * worked on through that fd: reads and writes at an offset or at the fd's
 * current position, syncs, a new length, its status, a close. Such a
 * request sets the flag ATAP_FS_FD and the field fd, and no path (below).
 *
 * An operation is described by an atap_fs_req and its result is an
 * atap_fs_out. Spawned (atap_fs_spawn), it is a task whose output is the
 * atap_fs_out; the task itself only fails by the usual ways (ATAP_ECANCELLED,
 * ATAP_ETIMEDOUT, ATAP_EFAILED), and the operation's own result is out.rc:
 * 0, -errno for a system error (-ENOENT, -EEXIST, -ENOTEMPTY, -EISDIR,
 * -EACCES ...), or ATAP_EINVAL for a request that makes no sense. Run on the
 * calling thread it is atap_block(atap_fs_run, &req, &out, sizeof out):
 * nothing is copied, nothing is cancellable, and out.rc says how it went.
 */

/* Operations (atap_fs_req.op). Fields each one reads are listed; the rest
 * are ignored. */
typedef enum atap_fs_op {
    ATAP_FS_READ = 1,   /* path: the whole file, into a malloc'd out.data
                           (out.n bytes, one extra NUL byte after them) */
    ATAP_FS_READ_AT,    /* path, offset, len: up to len bytes at offset
                           (fewer at the end of the file), into buf if not
                           NULL (then out.data is buf), else a malloc'd
                           out.data sized by what the file gives, never by
                           len alone (len SIZE_MAX reads the rest of the
                           file; a file with no size, as in /proc, or one
                           that grows meanwhile, is read to its end) */
    ATAP_FS_WRITE,      /* path, data, len, mode: create (mode, default
                           0666 before the umask) or truncate, then write */
    ATAP_FS_APPEND,     /* path, data, len, mode: create if missing, append */
    ATAP_FS_WRITE_AT,   /* path, data, len, offset: write into an existing
                           file at offset */
    ATAP_FS_STAT,       /* path: out.meta, following symbolic links; and
                           with buf, an atap_fs_stat there (below) */
    ATAP_FS_LSTAT,      /* path: the same of a link itself */
    ATAP_FS_READ_DIR,   /* path: the names in a directory but "." and "..",
                           in the order the system gives: out.data is a
                           malloc'd NULL-terminated char *[out.n + 1], the
                           strings in the same block (one free); flags
                           ATAP_FS_TYPES: atap_fs_dirent entries instead */
    ATAP_FS_CREATE_DIR, /* path, mode (default 0777 before the umask);
                           flags ATAP_FS_PARENTS: the missing parents too,
                           and a directory already there is no error */
    ATAP_FS_REMOVE,     /* path: a file, a link or an empty directory;
                           flags ATAP_FS_TREE: a directory and all within
                           (links are removed, not followed) */
    ATAP_FS_RENAME,     /* path to path2 (replacing path2 as rename(2)) */
    ATAP_FS_SYMLINK,    /* a symbolic link at path2 reading path */
    ATAP_FS_LINK,       /* a hard link at path2 to the file at path */
    ATAP_FS_READ_LINK,  /* path: a link's text into a malloc'd, NUL-ended
                           out.data (out.n bytes before the NUL) */
    ATAP_FS_COPY,       /* path to path2 (created or truncated, with path's
                           permission bits): copy_file_range on Linux where
                           the file systems allow it, else reads and writes.
                           A directory is -EISDIR. out.n: bytes copied */
    ATAP_FS_SET_MODE,   /* path, mode: chmod (mode above 07777: ATAP_EINVAL) */
    ATAP_FS_SET_LEN,    /* path, offset: truncate or extend to offset bytes */
    ATAP_FS_OPEN,       /* path, open_flags, mode (default 0666 before the
                           umask, with O_CREAT): open(2), O_CLOEXEC added.
                           out.n is the new fd, whose owner is as out.data's
                           (below): with atap_block the caller's (close it);
                           spawned, a take moves it to the taker, and an fd
                           nobody took is closed when the task is freed */
    ATAP_FS_CLOSE,      /* fd: close(2). Spawned, the fd is the task's from
                           the spawn on: it is closed once, by the run, or
                           when the task ends without one (cancelled) */
    ATAP_FS_SYNC,       /* fd: fsync(2), the data and the metadata */
    ATAP_FS_DATASYNC,   /* fd: fdatasync(2), the data and what is needed to
                           read it back (fsync where there is none) */
} atap_fs_op;

/* atap_fs_req.flags */
#define ATAP_FS_PARENTS 0x1u /* ATAP_FS_CREATE_DIR: and all missing parents */
#define ATAP_FS_TREE 0x2u    /* ATAP_FS_REMOVE: a directory and all within */
/* The operation is on the open file fd, and path must be NULL. Required by
 * CLOSE, SYNC and DATASYNC; taken by READ (from the fd's position to the
 * end of the file), READ_AT, WRITE_AT, STAT (fstat), SET_LEN (ftruncate)
 * and SET_MODE (fchmod); ATAP_EINVAL with any other op. fd is a field
 * added after libatap 0.1: the request's size must be sizeof(atap_fs_req).
 * Spawned, the task works on a dup of fd made by the spawn (CLOSE aside),
 * so the caller may close fd at once; the dup shares fd's position. */
#define ATAP_FS_FD 0x4u
/* READ_AT and WRITE_AT with ATAP_FS_FD: at the fd's current position,
 * which they move on, instead of at offset (read(2) and write(2) rather
 * than pread and pwrite; a pipe or an O_APPEND fd works so). */
#define ATAP_FS_AT_POSITION 0x8u
/* ATAP_FS_READ_DIR: each entry with its type, as atap_fs_dirent (below) */
#define ATAP_FS_TYPES 0x10u

/* An operation, as atap_fs_spawn and atap_fs_run read it. */
typedef struct atap_fs_req {
    size_t size; /* sizeof(atap_fs_req), or 0: the layout of libatap 0.1
                    (see the conventions at the top of atap/core.h) */
    atap_fs_op op;
    unsigned flags;
    const char *path;  /* every operation */
    const char *path2; /* RENAME, SYMLINK, LINK, COPY: the new name */
    const void *data;  /* WRITE, APPEND, WRITE_AT: len bytes to write */
    void *buf;         /* READ_AT: where to read to, len bytes (may be NULL);
                          STAT, LSTAT: an atap_fs_stat of len bytes, or NULL */
    size_t len;
    uint64_t offset; /* READ_AT, WRITE_AT (but ATAP_FS_AT_POSITION); SET_LEN:
                        the new length */
    unsigned mode;   /* WRITE, APPEND, CREATE_DIR, OPEN (0: the default),
                        SET_MODE */
    /* atap_fs_spawn of a write with data: called once with `data` when the
     * task no longer reads it (its argument is let go). NULL: data is
     * copied at the spawn. */
    void (*data_free)(void *data);
    /* atap_fs_spawn: called once with `buf` when the task no longer writes
     * it (its argument is let go): until then buf must stay valid, even
     * after a cancel (a run under way may still be reading into it). */
    void (*buf_done)(void *buf);
    /* Added after libatap 0.1: read only from a request whose size is
     * sizeof(atap_fs_req). An ATAP_FS_OPEN, or a request with ATAP_FS_FD,
     * of size 0 is ATAP_EINVAL (it would be read without them). */
    int fd;         /* with ATAP_FS_FD: the open file (not negative) */
    int open_flags; /* ATAP_FS_OPEN: open(2)'s flags (O_RDWR, O_CREAT ...) */
} atap_fs_req;

/* atap_fs_meta.type, atap_fs_stat.type, atap_fs_dirent.type */
#define ATAP_FS_TYPE_UNKNOWN 0 /* atap_fs_dirent only: gone before it was seen */
#define ATAP_FS_TYPE_FILE 1
#define ATAP_FS_TYPE_DIR 2
#define ATAP_FS_TYPE_LINK 3  /* from ATAP_FS_LSTAT and ATAP_FS_READ_DIR */
#define ATAP_FS_TYPE_OTHER 4 /* atap_fs_meta: a device, a FIFO, a socket */
/* atap_fs_stat and atap_fs_dirent tell the others apart: */
#define ATAP_FS_TYPE_FIFO 5
#define ATAP_FS_TYPE_SOCKET 6
#define ATAP_FS_TYPE_CHAR 7  /* a character device */
#define ATAP_FS_TYPE_BLOCK 8 /* a block device */

/* What ATAP_FS_STAT and ATAP_FS_LSTAT say of a file (atap_fs_out.meta). */
typedef struct atap_fs_meta {
    uint64_t size;    /* bytes */
    int64_t mtime_ns; /* last modification, ns since the Unix epoch */
    uint32_t mode;    /* permission bits (07777) */
    int type;         /* ATAP_FS_TYPE_FILE ... */
} atap_fs_meta;

/*
 * All that ATAP_FS_STAT and ATAP_FS_LSTAT say of a file, written to the
 * request's buf when it is not NULL, len being the bytes there (at least
 * sizeof(size_t), else ATAP_EINVAL; pass sizeof(atap_fs_stat)). It is
 * written no further than len, and its size says how far (a library older
 * than the header writes less). out.meta is filled too. Spawned, buf is
 * lent as a READ_AT's is (buf_done).
 */
typedef struct atap_fs_stat {
    size_t size;      /* set by the operation: the bytes it filled */
    int type;         /* ATAP_FS_TYPE_*, FIFO, SOCKET, CHAR, BLOCK apart */
    uint32_t mode;    /* permission bits (07777) */
    uint64_t bytes;   /* the file's length (st_size) */
    uint64_t blocks;  /* 512-byte blocks it takes (st_blocks) */
    uint64_t dev;     /* the device it is on (st_dev) */
    uint64_t ino;     /* its inode number (st_ino) */
    uint64_t nlink;   /* hard links to it (st_nlink) */
    uint64_t rdev;    /* a device file: the device it is (st_rdev) */
    int64_t atime_ns; /* last access, ns since the Unix epoch */
    int64_t mtime_ns; /* last change of the data */
    int64_t ctime_ns; /* last change of the status (mode, links, owner) */
    uint32_t uid;     /* owner */
    uint32_t gid;     /* group */
    uint32_t blksize; /* the size the file system prefers for I/O */
} atap_fs_stat;

/*
 * An entry of ATAP_FS_READ_DIR with ATAP_FS_TYPES: out.data is then a
 * malloc'd atap_fs_dirent[out.n + 1], the last one's name NULL, the names
 * in the same block (one free). type is the entry's own (a symbolic link
 * is ATAP_FS_TYPE_LINK), as the directory tells it, or, where it does not
 * (some file systems), as lstat says; ATAP_FS_TYPE_UNKNOWN for an entry
 * removed in between.
 */
typedef struct atap_fs_dirent {
    const char *name;
    uint64_t ino; /* its inode number, as the directory tells it */
    int type;     /* ATAP_FS_TYPE_* */
} atap_fs_dirent;

/*
 * What an operation did. data: READ, READ_AT (without buf), READ_DIR and
 * READ_LINK put a malloc'd buffer here (else NULL). Whose it is: with
 * atap_block, the caller's (free() it). Spawned, the task's: a take moves
 * it to the taker (free() it then); a join only lends it, until the last
 * handle is released, when the task frees it (out_free). A READ_AT into
 * buf puts buf here, which stays the caller's either way.
 */
typedef struct atap_fs_out {
    int rc;            /* 0, -errno or ATAP_EINVAL */
    size_t n;          /* bytes read, written or copied; READ_DIR: names;
                          READ_LINK: the text's length; OPEN: the fd */
    void *data;        /* see above */
    atap_fs_meta meta; /* STAT, LSTAT */
} atap_fs_out;

/*
 * The task function of every file operation: req is an atap_fs_req, out an
 * atap_fs_out. For atap_block (atap_block(atap_fs_run, &req, &out,
 * sizeof out)), which then returns 0 and the operation's result in out.rc.
 * Inside a task of one's own, called on the task's own ctx, it stops
 * between chunks as a spawned one would (out.rc ATAP_ECANCELLED).
 * out.rc on an open file (ATAP_FS_FD): -EBADF for an fd that is not open
 * (a closed one; a fd open for reading only, written: -EBADF as write(2)
 * says), -ESPIPE for an offset on a pipe (use ATAP_FS_AT_POSITION), and
 * ATAP_EINVAL for a negative fd, a path given too, an op that takes no fd,
 * ATAP_FS_AT_POSITION without ATAP_FS_FD, or a request of size 0 (fd and
 * open_flags are then unread). A STAT's buf with len below sizeof(size_t)
 * is ATAP_EINVAL.
 * Blocks: yes (a file system call per chunk). Threads: any.
 */
ATAP_EXPORT int atap_fs_run(atap_ctx *ctx, void *req, void *out);

/*
 * Spawns req as a task on the blocking threads; its output is an
 * atap_fs_out. req is copied (paths too; data unless data_free is given,
 * see atap_fs_req), so it may go as this returns. opts may be NULL; kind
 * must be ATAP_ONCE; out_size 0 or sizeof(atap_fs_out); no arg_free,
 * out_free, gives or in_free; priority, timeout_ns and after_ns apply, and
 * blocking is set whatever it says.
 * With ATAP_FS_FD the task works on a dup of fd made here (close-on-exec,
 * sharing fd's position), closed when the task is freed, so the caller
 * may close fd at once; an fd that cannot be duplicated (-EBADF, -EMFILE)
 * is the task's out.rc, as every other error of the operation is. An
 * ATAP_FS_CLOSE takes fd itself (see the op).
 * Returns as atap_spawn, and ATAP_EINVAL for NULL task, req or path (or,
 * with ATAP_FS_FD, a path or a negative fd), a req whose size is refused
 * (see atap/core.h's conventions), an unknown op, a missing path2 or data
 * (len > 0) its op needs, a request atap_fs_run refuses with ATAP_EINVAL
 * as it stands (above), or options outside those (on failure nothing of
 * req is kept, freed or closed).
 * Blocks: no (a dup). Threads: any.
 */
ATAP_EXPORT int atap_fs_spawn(atap_task *task, const atap_fs_req *req, const atap_spawn_opts *opts);

/*
 * Spawns a task that watches the file or directory at path (opened here,
 * and followed as the file it is: a rename reports ATAP_PATH_GONE, the new
 * name is not followed), or, with path NULL, the one open as fd (the task
 * holds a dup of it). Its output is an unsigned int: the ATAP_PATH_* bits
 * of `changes` (0: all) seen since it started watching, or, as a repeat,
 * since the run before reported; or, with opts.out_size
 * sizeof(atap_fs_watch_report), those bits with the names of the entries
 * that changed (below). It holds no thread while it waits. On Linux it
 * has an inotify fd of its own whose kernel watch, made by this call,
 * lasts as long as the task: every change from the spawn on queues there,
 * also while no run is parked (between the runs of a repeat, before the
 * first run), so nothing between two reports is lost (but what the
 * kernel's queue drops when it overflows, which is reported as every
 * change but ATAP_PATH_GONE, with `more` set). Elsewhere, or when no
 * inotify fd can be had (the per-user limit of inotify instances,
 * fs.inotify.max_user_instances, is reached), it parks on
 * atap_park_path, whose kernel watch lasts only while a run is parked.
 * Besides the kernel's reports it compares the file's status with
 * what it last saw (at the start of each run, and every 50 ms while
 * parked), so that changes no report told of are found too: a write as
 * ATAP_PATH_WRITE (to a directory, ATAP_PATH_ENTRIES), a change of mode,
 * owner or links as ATAP_PATH_ATTRIB, a file left with no name as
 * ATAP_PATH_GONE. (Compared so, a write that leaves the size and the
 * time stamp's coarse clock alike is missed until the next report.)
 * ATAP_PATH_GONE is always reported and is the last report: the run after
 * it ends the task with ATAP_EFINISHED (so a reader that missed that report
 * still learns the watch is over). As with any repeat, a run's output is
 * readable between runs only, and the next one replaces it: give every_ns
 * a gap long enough for the reader to take each report (the changes of
 * the gap are not lost, the next run reports them). Where atap_park_path
 * cannot watch (-ENOTSUP with the poll backend outside Linux) or the kernel
 * refuses the watch, the run ends ATAP_EFAILED.
 * opts may be NULL; out_size 0, sizeof(unsigned) or
 * sizeof(atap_fs_watch_report); kind ATAP_ONCE or
 * ATAP_REPEAT (with every_ns, runs, for_ns, until_ns as usual); no
 * arg_free, out_free, gives, in_free or blocking.
 * Returns as atap_spawn; -errno if path cannot be opened or fd duplicated
 * (-ENOENT ...); ATAP_EINVAL for NULL task, no path and a negative fd,
 * unknown bits in changes, or options outside those.
 * Blocks: no (an open). Threads: any.
 */
ATAP_EXPORT int atap_fs_spawn_watch(atap_task *task, const char *path, int fd, unsigned changes,
                                    const atap_spawn_opts *opts);

/* Room for names in an atap_fs_watch_report. */
#define ATAP_FS_WATCH_NAMES 1024

/*
 * A watch's report with the entries named: the output of a watch spawned
 * with opts.out_size sizeof(atap_fs_watch_report) (with 0 or
 * sizeof(unsigned) the output is the changes alone, as above). names holds
 * the name of each entry of the watched directory that changed in a way
 * asked for since the last report (made, removed, renamed from or to,
 * written, its metadata changed), `count` of them, each NUL-ended, one
 * after the other, each once, in the order they first changed; the rest
 * of names is zeros. Where the kernel names no entries (a watched file;
 * the kqueue backend; a change the status comparison found) there are
 * none. more: some change was not named (names ran out of room, or the
 * kernel's queue overflowed and lost them): read the directory again.
 */
typedef struct atap_fs_watch_report {
    unsigned changes; /* ATAP_PATH_* bits, as the unsigned output */
    unsigned count;   /* names in names */
    bool more;        /* changed entries not named */
    char names[ATAP_FS_WATCH_NAMES];
} atap_fs_watch_report;

#ifdef __cplusplus
}
#endif

#endif /* ATAP_FS_H */

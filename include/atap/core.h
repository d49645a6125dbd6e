/*
 * libatap: Any Time Any Place. An embeddable task runtime for C.
 * This header is the runtime (<atap.h> includes it and the built-in
 * tasks: atap/fs.h, atap/process.h, atap/tasks.h, atap/net.h).
 *
 * A task is a plain C function and an argument. atap_spawn() puts it in a
 * lock-free slot table and hands back a handle; a work-stealing pool of
 * worker threads runs it; atap_join() / atap_take() read its output from any
 * thread.
 *
 * Conventions:
 *   - Every call that can fail returns int: 0 on success, a negative code
 *     otherwise. System failures come back as -errno (so -ENOMEM reads as
 *     itself); runtime conditions have the ATAP_E* codes below, which lie
 *     outside the errno range. atap_strerror() names them all.
 *   - "Blocks" says whether a call may wait. "Threads" says where it may be
 *     called from. "Any" means any thread, including inside a task.
 *   - A handle is a listener on its task. Every handle from atap_spawn() or
 *     atap_dup() must be given back with atap_release() exactly once; once
 *     the last one is released every copy of the handle reads ATAP_ENOTASK,
 *     even while the task still runs or waits (fed by a forward, say) and
 *     even if the slot has been reused since. Releasing a handle while
 *     another thread is still inside a call on that same handle is the
 *     caller's race, as with free(); give each thread its own atap_dup().
 *   - A wait inside a task never makes a deadlock the program does not
 *     contain (a circle of tasks, each waiting for the next), and never
 *     holds its thread. While a pool thread waits for task A (atap_join,
 *     atap_take, atap_wait, atap_join_first, atap_join_all), it runs on top
 *     of the waiting frame only A itself, when A is still in the thread's
 *     own queues (a task it spawned) and the stack has room; join_all runs
 *     any of its members so. Otherwise it sets the whole stack aside and
 *     goes on with other work on another stack of the same thread, and the
 *     stack set aside goes on, on the same thread, once A has settled and
 *     the thread next finishes a run or waits. So thread-locals, errno and
 *     pthread_self() are the task's own after a wait, and the pool's thread
 *     count never grows for waits (atap_pool_stats' aside counts the stacks
 *     set aside). What a task must still not do: hold a lock across a wait
 *     that another task may take (a stack set aside keeps its locks while
 *     its thread runs other tasks, which may be the ones to take it).
 *     Each stack is worker_stack bytes of address space; only the pages a
 *     stack has used take memory.
 *   - Structs that may grow start with `size_t size`: atap_config,
 *     atap_spawn_opts, atap_cmd and atap_fs_req, which the caller fills,
 *     and struct atap_status and struct atap_pool_stats, which libatap
 *     fills. In one the caller fills, size is sizeof the struct, or 0
 *     (what a designated initialiser leaves it), which stands for the
 *     struct as libatap 0.1 lays it out, so code written today keeps its
 *     meaning when fields are added. libatap reads the fields that lie
 *     within size and takes the rest as 0 (a program built against an
 *     older header), and refuses with ATAP_EINVAL a struct that sets a
 *     field it does not know (a program built against a newer header
 *     than the library it runs with); a size below sizeof(size_t) is
 *     ATAP_EINVAL. A struct libatap fills is filled through a call that
 *     this header makes pass sizeof the struct as the header has it:
 *     libatap writes no more than that, and sets size to what it wrote.
 *     Other structs (handles, task outputs, atap_net_io) keep their
 *     layout for the whole of a major version; a task's output is sized
 *     by out_size, which each call checks. CHANGELOG.md has the policy.
 */
#ifndef ATAP_CORE_H
#define ATAP_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The version of this header. ATAP_VERSION_HEX is the three numbers as
 * one, 0xMMmmpp00 (major, minor and patch a byte each, the low byte 0), so
 * that a program can compare versions with < and >, in #if too:
 *
 *     #if ATAP_VERSION_HEX >= 0x00020000   (0.2.0 or later)
 *
 * atap_version_hex() and atap_version_string() say which library is
 * linked, which may be newer than the header a program was built with.
 * CHANGELOG.md has the versioning and ABI policy: within a major version,
 * SONAME libatap.so.MAJOR, a newer library runs programs built against an
 * older header (0.x included: a 0.y release adds, it does not break).
 */
#define ATAP_VERSION_MAJOR 0
#define ATAP_VERSION_MINOR 1
#define ATAP_VERSION_PATCH 0
#define ATAP_VERSION_HEX                                                                           \
    ((ATAP_VERSION_MAJOR << 24) | (ATAP_VERSION_MINOR << 16) | (ATAP_VERSION_PATCH << 8))

/* Marks libatap's calls: exported from the shared library as it is built
 * (everything else there is hidden); nothing to a program using them. */
#if defined(_WIN32)
#define ATAP_EXPORT
#elif defined(ATAP_BUILDING)
#define ATAP_EXPORT __attribute__((visibility("default")))
#else
#define ATAP_EXPORT
#endif

/* ---------------------------------------------------------------------- */
/* Error codes                                                             */
/* ---------------------------------------------------------------------- */

/* The runtime's own codes, below -10000: outside the errno range, so that
 * -errno codes and these never meet. atap_strerror() names each. */
enum {
    ATAP_ENOTINIT = -10001,   /* no runtime is running */
    ATAP_EALREADY = -10002,   /* a trace is already being written (atap_init
                                 no longer returns it: it counts users) */
    ATAP_ENOTREADY = -10003,  /* not settled yet; or a timed wait ran out */
    ATAP_ETAKEN = -10004,     /* the output was moved out by a take */
    ATAP_EFINISHED = -10005,  /* a bounded series ran out / no more gives */
    ATAP_ECANCELLED = -10006, /* the task was cancelled */
    ATAP_ETIMEDOUT = -10007,  /* a run passed its timeout */
    ATAP_EFAILED = -10008,    /* nothing will produce an output */
    ATAP_ENOTASK = -10009,    /* the handle names no task */
    ATAP_EINVAL = -10010,     /* a bad argument or option combination */
    ATAP_EBUSY = -10011,      /* atap_trim found nothing worth giving back */
    ATAP_ECLOSED = -10012,    /* a channel or peer closed */
    ATAP_ETOOLONG = -10013,   /* a delimited read hit its limit */
    ATAP_ELIMIT = -10014,     /* a limit of the pool was reached (no call
                                 returns it since waits hold no thread) */
};

/* A task function returns this, after one of the atap_park_* calls, to give
 * its thread back while it waits (see "Waiting inside a task"). Returned
 * without a park call, it fails the run like any other nonzero return. */
#define ATAP_PARKED 1

/*
 * A short English description of a code: an ATAP_E* code, a negated errno,
 * or 0. Never NULL; unknown codes read "unknown error".
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT const char *atap_strerror(int code);

/* "MAJOR.MINOR.PATCH" of the library actually linked. Never NULL.
 * Blocks: no. Threads: any. */
ATAP_EXPORT const char *atap_version_string(void);

/* The version of the library actually linked, written as ATAP_VERSION_HEX
 * (0xMMmmpp00). The loader only holds the major version to the program's
 * (the SONAME): a program that needs what a later minor version added
 * compares this with the ATAP_VERSION_HEX it was built with.
 * Blocks: no. Threads: any. */
ATAP_EXPORT uint32_t atap_version_hex(void);

/* ---------------------------------------------------------------------- */
/* Runtime                                                                 */
/* ---------------------------------------------------------------------- */

/* The most worker threads, and again the most blocking threads, a pool can
 * have: the upper bound of atap_config.workers, .blocking_threads and of
 * ATAP_WORKERS, ATAP_BLOCKING_THREADS. */
#define ATAP_THREADS_MAX 1024

/*
 * How the runtime starts. Zero it and set what you need; every field's 0
 * is its default:
 *
 *     atap_config cfg = {.size = sizeof cfg, .workers = 2};
 *
 * "CPUs" below are the CPUs this process may run on, not the machine's
 * cores: on Linux the affinity mask (taskset, cpusets) and, where there is
 * one, the cgroup CPU quota, whichever is smaller. The quota is cgroup
 * v2's cpu.max of the process's cgroup or one above it, or, where v2 sets
 * none, cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us under the cpu
 * controller's mount, likewise; rounded up (1.5 CPUs counts 2).
 * Elsewhere the online CPUs.
 *
 * Threads. The pool starts `workers` workers (its base count) and never
 * goes below it. It grows past it only while every worker is blocked (in
 * a wait inside a task, or stuck in a call of their own), asleep rather
 * than running or waiting for a CPU, and work waits: up
 * to workers_per_core a CPU (its target), past that only under overload,
 * never past atap_pool_stats' ceiling. The ceiling is what the kernel would
 * give, read at atap_init: a quarter of the memory over worker_stack, and
 * the threads RLIMIT_NPROC, the cgroup's pids.max and RLIMIT_AS (its room
 * over worker_stack and a guard page) leave; a thread start the kernel
 * refuses lowers it to the workers there are, and it is read again (at
 * most once a second) while the pool would grow past it. Blocking threads
 * start on demand and stop when idle: at most `blocking_threads`.
 *
 * The environment. ATAP_WORKERS and ATAP_BLOCKING_THREADS set `workers`
 * and `blocking_threads` for a program that does not: the config wins.
 * Each is read (getenv) by the atap_init that starts the runtime, and only
 * when the config leaves its field at 0. Unset or empty: no say. Otherwise
 * decimal digits only, 0 (the default) to ATAP_THREADS_MAX; anything else
 * (a sign, blanks, a suffix, a larger number) makes that atap_init fail
 * with ATAP_EINVAL, so a typo is seen rather than ignored.
 */
typedef struct atap_config {
    size_t size;                /* sizeof(atap_config), or 0: the layout of
                                   libatap 0.1 (these six fields). A smaller
                                   size (a caller built against an older
                                   atap.h) leaves the later fields 0; see the
                                   conventions at the top of this file */
    unsigned workers_per_core;  /* pool target per CPU; 0: default 4 */
    unsigned blocking_per_core; /* blocking threads per CPU when
                                   blocking_threads is 0; 0: default 8 */
    size_t worker_stack;        /* bytes; 0: default 8 MiB; else >= 16 KiB */
    unsigned workers;           /* the base count of workers, 1 to
                                   ATAP_THREADS_MAX; 0: ATAP_WORKERS if set,
                                   else one per CPU */
    unsigned blocking_threads;  /* the most blocking threads, 1 to
                                   ATAP_THREADS_MAX; 0: ATAP_BLOCKING_THREADS
                                   if set, else blocking_per_core a CPU */
} atap_config;

/*
 * Starts the runtime, or counts one more user of the one running.
 * config may be NULL for the defaults (atap_config says what they are).
 *
 * Several users. A program may hold several users of libatap (a library
 * and the application, say), each pairing its own atap_init with one
 * atap_shutdown, as curl_global_init counts. The atap_init that finds no
 * runtime starts one with its config; while it runs, every other atap_init
 * returns 0 and counts one more user, and the running config stands: the
 * later one's is checked (ATAP_EINVAL as below, nothing counted) but not
 * applied, and the environment is not read again. The runtime stops at the
 * atap_shutdown that lets its last user go. An atap_init that finds a
 * shutdown under way waits for it, then starts the runtime afresh.
 *
 * Returns 0 (started, or counted); ATAP_EINVAL for a config whose size is
 * below sizeof(size_t), or larger than this library knows with unknown
 * bytes set, a worker_stack below 16 KiB, workers or blocking_threads
 * above ATAP_THREADS_MAX, or, at the start, a malformed ATAP_WORKERS /
 * ATAP_BLOCKING_THREADS (see atap_config); -errno when a thread cannot be
 * started (the runtime is then left stopped, no user counted); ATAP_EINVAL
 * while a shutdown is under way that waits for the calling thread: a task,
 * or an arg_free / out_free that the runtime's own threads or that
 * shutdown call runs; -EOVERFLOW past a billion users. It no longer
 * returns ATAP_EALREADY. atap_init_error() says which of these it was.
 * An ATAP_TRACE that cannot be written does not stop it: see the traces.
 * Blocks: briefly; while a shutdown is under way, until it is done.
 * Threads: any, a task included while the runtime runs (it counts a user
 * like any other caller).
 *
 * fork(): no thread of the runtime comes along into the child, and the
 * child's runtime reads stopped, with no users (atap_initialised false,
 * spawns ATAP_ENOTINIT, atap_shutdown returns 0 at once). After fork, the
 * child may call atap_init, which starts its own runtime as its first user;
 * the tasks, handles and channels of the parent are not
 * carried over: a handle from before the fork reads ATAP_ENOTASK (no wait
 * hangs on it), and no arg_free / out_free of the parent's tasks runs in the
 * child. The fds the parent's runtime owns are closed in the child, never
 * used. The reset is a pthread_atfork child handler that the first
 * atap_init registers. Starting again needs malloc and threads after a fork
 * of a multithreaded process, which POSIX leaves undefined but glibc, musl
 * and the BSDs allow. The parent's runtime goes on untouched. Fork only
 * from outside a task: the child of a fork made inside a task (or an
 * arg_free / out_free) may only exec or _exit.
 */
ATAP_EXPORT int atap_init(const atap_config *config);

/*
 * Why the calling thread's last atap_init failed, as one line naming the
 * cause: the field or the environment variable and its value, and what is
 * wrong with it; for instance
 *
 *     ATAP_WORKERS="4x": not a number from 0 to 1024
 *     atap_config.worker_stack 4096: below 16384 bytes
 *
 * Also what went wrong in an atap_init that still succeeded: an ATAP_TRACE
 * that could not be opened ("ATAP_TRACE=/x/t.json: not traced: No such
 * file or directory"; see the traces). "" when that atap_init had nothing
 * to report, or the thread never called it. Never NULL. The text is the
 * calling thread's own and stays until its next atap_init.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT const char *atap_init_error(void);

/*
 * Lets one user go (see atap_init). While other users remain, that is all:
 * the runtime runs on, and this returns 0 at once, from any thread, a task
 * included. The shutdown that lets the last user go stops the runtime: new
 * spawns fail with ATAP_ENOTINIT, queued work still runs, running tasks
 * finish, then every thread the runtime started is joined and every fd it
 * opened is closed (its pollers, each thread's event queue, the signal
 * pipe, the inotify fd; a later atap_init opens its own). A signal caught
 * for atap_park_signal stays caught (atap_signal_release gives it back),
 * and an fd kept by atap_fd_keep stays kept. Handles stay
 * valid: their outputs can be read after it, and after a later atap_init.
 * It never returns while a task never ends.
 * A call with no user left to let go changes nothing and returns 0: when no
 * runtime runs (never started, already stopped, or in the child of a fork:
 * see atap_init), or, after waiting for it, while the last user's shutdown
 * is under way on another thread. Calling it more often than atap_init
 * lets go of another user's count: pair them.
 * Returns 0; ATAP_EINVAL (nothing changed) when it would stop the runtime
 * and so wait for the calling thread: inside a task, or from an arg_free /
 * out_free run by the runtime's own threads (the manager's, a worker's) or
 * by a shutdown under way on this thread.
 * Blocks: yes, when it stops the runtime. Threads: any; the last user's
 * shutdown from outside the runtime's threads.
 */
ATAP_EXPORT int atap_shutdown(void);

/* True while the runtime is running (init done, its last user's shutdown
 * not begun). False in the child of a fork until the child's own
 * atap_init (see atap_init). Blocks: no. Threads: any. */
ATAP_EXPORT bool atap_initialised(void);

/*
 * Named like stat(): struct atap_status and the call atap_status(), and so
 * struct atap_pool_stats and atap_pool_stats(). C and C++ use them alike
 * (`struct atap_status s; atap_status(&s);`). In C++ the function hides the
 * struct's implicit constructor, which g++ -Wshadow reports (as it would
 * for stat(), were <sys/stat.h> not a system header): the two declarations
 * below are made with that one warning off, so a program built with
 * -Wshadow -Werror includes this header as it is. atap.hpp also has
 * atap::status() and atap::pool_stats(), which return the structs.
 */
#if defined(__cplusplus) && defined(__GNUC__)
#define ATAP_SAME_NAME_BEGIN_                                                                      \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wshadow\"")
#define ATAP_SAME_NAME_END_ _Pragma("GCC diagnostic pop")
#else
#define ATAP_SAME_NAME_BEGIN_
#define ATAP_SAME_NAME_END_
#endif

/* The runtime's state, as atap_status() fills it. */
struct atap_status {
    size_t size;        /* set by atap_status: the bytes it filled */
    bool initialised;   /* atap_init has completed and the last user's
                           shutdown not begun */
    bool shutting_down; /* a shutdown is draining the pool */
    bool manager_alive; /* the manager thread (time, pool policy) is running */
    bool healthy;       /* initialised, manager alive, workers alive */
};

/*
 * Fills the first `size` bytes of *status (at most the library's own
 * struct atap_status) and sets status->size to the bytes filled. Call it
 * through atap_status(), which passes sizeof(struct atap_status) as the
 * program's header has it. Returns 0; ATAP_EINVAL for NULL or a size
 * below sizeof(size_t). Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_status_sized(struct atap_status *status, size_t size);

/* Fills *status (atap_status_sized with this header's struct). Returns 0
 * or ATAP_EINVAL for NULL. Blocks: no. Threads: any. */
ATAP_SAME_NAME_BEGIN_
static inline int atap_status(struct atap_status *status)
{
    return atap_status_sized(status, sizeof(struct atap_status));
}
ATAP_SAME_NAME_END_

/* The pool and the table in numbers, as atap_pool_stats() fills it. */
struct atap_pool_stats {
    size_t size;             /* set by atap_pool_stats: the bytes it filled */
    size_t workers;          /* worker threads alive */
    size_t busy;             /* workers inside a task */
    size_t blocking_threads; /* blocking threads alive */
    size_t blocking_busy;    /* blocking threads inside a task */
    size_t queued;           /* tasks in the shared queues (approximate) */
    size_t live;             /* tasks holding a slot: at least those
                                live all through the call, so 0 means every
                                task spawned before the call is gone */
    size_t slots;            /* table span now (shrinks when trimmed) */
    size_t peak_slots;       /* the most slots spanned at once; never falls */
    size_t peak_workers;     /* the most workers at once; never falls */
    uint64_t deaths;         /* threads lost to a task calling pthread_exit;
                                counted once the replacement, if any, is live */
    uint64_t completed;      /* runs finished since the process started */
    size_t aside;            /* waits inside tasks now, each a stack set
                                aside: it holds no thread */
    size_t ceiling;          /* the most workers the pool may have: what the
                                kernel would give (see atap_config) */
    size_t peak_aside;       /* the most stacks set aside at once; never falls */
    size_t stacks;           /* stacks the pool threads hold besides their
                                own: set aside, running, or kept for reuse */
    uint64_t fired;          /* parks on a deadline (atap_park_until), and
                                delayed starts kept in their slot (after_ns
                                alone), that their deadline ended, since the
                                process started */
    uint64_t fired_1ms;      /* of those, ended more than 1 ms after the
                                deadline (up to 65.5 us early or late: the
                                runtime keeps deadlines in ticks); the task's
                                run then starts later still, once a worker
                                takes it: this is the timers' share alone */
    uint64_t fired_10ms;     /* of those, more than 10 ms after */
};

/*
 * A snapshot of the pool and the table (not a lock: fields are read one by
 * one), into the first `size` bytes of *stats (at most the library's own
 * struct atap_pool_stats); stats->size is set to the bytes filled. Call it
 * through atap_pool_stats(), which passes sizeof(struct atap_pool_stats)
 * as the program's header has it. Works whether or not the runtime is
 * running. Returns 0; ATAP_EINVAL for NULL or a size below
 * sizeof(size_t). Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_pool_stats_sized(struct atap_pool_stats *stats, size_t size);

/* A snapshot of the pool and the table (atap_pool_stats_sized with this
 * header's struct). Returns 0 or ATAP_EINVAL for NULL. Blocks: no.
 * Threads: any. */
ATAP_SAME_NAME_BEGIN_
static inline int atap_pool_stats(struct atap_pool_stats *stats)
{
    return atap_pool_stats_sized(stats, sizeof(struct atap_pool_stats));
}
ATAP_SAME_NAME_END_

/*
 * Writes the pool's stats as one line, for a log, like snprintf: at most
 * n bytes including the terminating NUL (the line is cut short to fit),
 * and returns the length the whole line has, without the NUL, so a return
 * >= n means it was cut. buf may be NULL when n is 0 (to ask the length).
 * stats: a snapshot taken earlier with atap_pool_stats, so the line shows
 * the numbers the caller looked at (read by its size, as the structs a
 * caller fills are: fields it does not have read 0); NULL takes one now.
 * The line is "name=value" pairs, one per field of struct atap_pool_stats
 * but size, named as the fields and in their order, separated by single
 * spaces, no newline:
 *
 *     workers=4 busy=1 blocking_threads=0 blocking_busy=0 queued=0 live=3
 *     slots=64 peak_slots=64 peak_workers=4 deaths=0 completed=120 aside=0
 *     ceiling=1024 peak_aside=0 stacks=0 fired=0 fired_1ms=0 fired_10ms=0
 *                                              (one line, wrapped here)
 *
 * New fields are added at the end. Works whether or not the runtime runs.
 * Returns the length (>= 0); ATAP_EINVAL for a NULL buf with n > 0, or a
 * stats whose size is below sizeof(size_t) or sets fields this library
 * does not know. Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_stats_format(char *buf, size_t n, const struct atap_pool_stats *stats);

/*
 * Gives the pages behind the table's unused top back to the kernel
 * (madvise), keeping headroom above the live tasks. *released (may be
 * NULL) receives the bytes given back.
 * Returns 0; ATAP_EBUSY when nothing is worth giving back or another trim is
 * running. Blocks: no (it does work proportional to the table's span).
 * Threads: any.
 */
ATAP_EXPORT int atap_trim(size_t *released);

/* ---------------------------------------------------------------------- */
/* Traces                                                                  */
/* ---------------------------------------------------------------------- */

/*
 * A trace of what the runtime does, written as a Chrome trace-event JSON
 * file ({"traceEvents":[...]}) that ui.perfetto.dev, Chrome DevTools and
 * chrome://tracing open:
 *   - a lane per thread, its "tid" the OS thread id (gettid on Linux,
 *     pthread_threadid_np on macOS: the ids perf and gdb show), named by
 *     metadata events: "atap-worker N", "atap-blocking N", "atap-manager",
 *     "atap-supervisor", and any other thread that spawns, gives or cancels
 *     under its own name;
 *   - a slice per run ("B"/"E", both named after the task's function, of
 *     category "atap"), with the task's id ("0x" + hex of atap_task.id) and
 *     the run's return code; a run still under way when the file is written
 *     ends at that moment, and one whose end was dropped ends at the next
 *     event its thread recorded, both marked "end": "not recorded".
 *     The name comes from dladdr when the trace is written: a function of
 *     a shared library, or of a program linked with -rdynamic
 *     (CMake: ENABLE_EXPORTS), reads by its symbol; anything else reads
 *     "object+0xoffset" (for addr2line) or its address;
 *   - a slice of no length ("X") for each spawn and give, with the task's
 *     id; instants ("i") for park, resume, cancel, timeout, "pool grows",
 *     "thread starts", "manager starts" (each life of the manager, with
 *     the restarts so far) and "manager restart";
 *   - flow arrows ("s"/"f"), each pairing one start with one end: from a
 *     spawn to the task's first run (not a repeat's later runs, nor a run
 *     after a park), and from a give to the run it started (a give that a
 *     newer one replaced before a run took it has none);
 *   - at the end, a global instant "dropped events" with the count of
 *     events lost (see below), 0 when none was.
 *
 * While no trace is written each point that could record costs one
 * relaxed load and a branch. While one is, each thread appends to a buffer
 * of its own without a lock and a thread of the trace's own writes the
 * full ones out; a thread never waits for that writer. When it falls
 * behind (about 20 MiB of events waiting), or while atap_trace_stop takes
 * a thread's buffer, events are dropped and counted.
 *
 * The file is a whole trace at every moment the trace's writer is not
 * writing it (every 20 ms it writes what filled up, then the closing
 * events and brackets, which its next round writes over), so a program
 * that dies leaves one that opens. A program that exits (exit, or a
 * return from main) while a trace is being written finishes the file from
 * an atexit handler: atap_shutdown is not needed for a whole trace.
 *
 * The environment: ATAP_TRACE=path starts a trace at the atap_init that
 * starts the runtime (unless one is already being written), and the
 * atap_shutdown that stops the runtime stops it, so the file is complete
 * once the program's last atap_shutdown returns. An ATAP_TRACE that
 * cannot be opened (or whose writer thread cannot start) does not stop
 * the program: that atap_init starts the runtime untraced, returns 0,
 * writes one line to stderr,
 *
 *     libatap: ATAP_TRACE=/x/t.json: not traced: No such file or directory
 *
 * and keeps the same text (without "libatap: ") for atap_init_error().
 * Unset or empty: no trace.
 *
 * fork(): the child of a process writing a trace writes nothing to it. A
 * trace the child starts (its atap_init with ATAP_TRACE still set, or
 * atap_trace_start) on a path another process is writing a trace to goes
 * to "path.PID" instead, PID the child's process id: the parent's file is
 * never truncated. The same holds for any two processes given one path
 * (the file is locked with flock while its trace is written).
 *
 * atap_trace_start starts writing a trace to path (created or truncated,
 * unless another process's trace holds it: see fork() above); it needs no
 * runtime, and one trace at a time runs in the process.
 * Returns 0; ATAP_EINVAL for a NULL or empty path; ATAP_EALREADY while a
 * trace is being written (by ATAP_TRACE too); -errno when the file cannot
 * be opened or the writer thread cannot start (nothing then runs).
 * Blocks: briefly (opens the file). Threads: any.
 */
ATAP_EXPORT int atap_trace_start(const char *path);

/*
 * Stops the trace and finishes its file: what was recorded is written, then
 * the thread names and the dropped count, and the file is closed. Events
 * recorded by calls under way on other threads as it stops may be left
 * out. Returns 0; ATAP_EINVAL when no trace is being written; -EIO (or the
 * -errno of close) when writing the file failed. Blocks: yes, while it
 * writes the file. Threads: any, a task included.
 */
ATAP_EXPORT int atap_trace_stop(void);

/* ---------------------------------------------------------------------- */
/* Tasks and handles                                                       */
/* ---------------------------------------------------------------------- */

/* Slot index + generation. The all-zero handle names no task. */
typedef struct atap_task {
    uint64_t id;
} atap_task;

/* The handle that names no task. In C a compound literal; in C++, which has
 * none, a value-initialised atap_task. Either way an rvalue of type
 * atap_task whose id is 0. */
#ifdef __cplusplus
#define ATAP_NO_TASK (atap_task())
#else
#define ATAP_NO_TASK ((atap_task){0})
#endif

/* The running task's view of itself; valid only during the call. */
typedef struct atap_ctx atap_ctx;

/*
 * A task function: writes its output (out_size bytes; out is NULL when
 * out_size is 0) and returns 0. Any other return value fails the run:
 * readers get ATAP_EFAILED, or, when the function returned one of the
 * ATAP_E* codes or -ENOMEM, that code (a channel's receive task ends with
 * ATAP_ECLOSED this way); but ATAP_ENOTREADY, which would read as "not
 * settled yet", gives ATAP_EFAILED.
 * Every pointer libatap hands to user code (out, atap_input's value, and
 * what out_free, in_free and elem_free get) is aligned for any type of its
 * size: to alignof(max_align_t), or, for a size that is not a multiple of
 * it, to the largest power of two dividing the size (a type's alignment
 * always divides its size).
 */
typedef int atap_fn(atap_ctx *ctx, void *arg, void *out);

/*
 * Names fn's runs (their slices) in traces, in place of what dladdr says:
 * for functions dladdr cannot name, or that run many things (atap.hpp
 * names each lambda's runs after its type this way). name is copied (up to
 * 95 bytes); NULL or "" forgets fn's name. Applies to traces written from
 * then on, the one being written included. Returns 0; ATAP_EINVAL for NULL
 * fn; -ENOMEM. Blocks: briefly (a lock). Threads: any.
 */
ATAP_EXPORT int atap_trace_name(atap_fn *fn, const char *name);

/* Where a task is: atap_state_of() reports it, atap_wait() how it settled. */
typedef enum atap_state {
    ATAP_PENDING = 1,   /* waiting to be claimed by a worker (or for its
                           start delay) */
    ATAP_RUNNING = 2,   /* running now (a kernel wait, atap_sleep or
                           atap_wait_fd, holds its thread: RUNNING) */
    ATAP_READY = 3,     /* output written and readable */
    ATAP_TAKEN = 4,     /* output moved out by a take */
    ATAP_CANCELLED = 5, /* cancelled; no output will be published */
    ATAP_FAILED = 6,    /* failed, or no task behind the handle */
    ATAP_TIMED_OUT = 7, /* a run passed its timeout */
    ATAP_WAITING = 8,   /* holds no thread until something comes: parked
                           (atap_park_*, or a built-in task such as a sleep
                           or a channel's receive, waiting for its event),
                           or waiting for a give (atap_spawn_waiting, a
                           receiver) with no run under way and no output
                           standing. Only atap_state_of reports it */
} atap_state;

/* The range of atap_spawn_opts.priority; 0 is the default. */
#define ATAP_PRIORITY_MIN (-128)
#define ATAP_PRIORITY_MAX 127

/* How a task runs: atap_spawn_opts.kind. */
typedef enum atap_kind {
    ATAP_ONCE = 0,    /* one run */
    ATAP_REPEAT = 1,  /* runs back to back (or every_ns apart), never overlapping */
    ATAP_AT_RATE = 2, /* a fresh run every every_ns, start to start, overlapping */
} atap_kind;

/*
 * How a task runs. Every field's zero is its default, so naming only
 * out_size gives a plain one-shot. Times are nanoseconds; until_ns is an
 * absolute CLOCK_MONOTONIC time (see atap_now()).
 *
 * Combinations that make no sense are ATAP_EINVAL: every_ns, runs, for_ns
 * or until_ns on ATAP_ONCE; for_ns and until_ns together; a kind that is
 * not one of atap_kind; every_ns of 0 on ATAP_AT_RATE; gives or in_free on
 * a task that does not wait for gives (atap_spawn).
 */
typedef struct atap_spawn_opts {
    size_t size;                 /* sizeof(atap_spawn_opts), or 0 (what
                                    `{.out_size = 4}` leaves it): the layout
                                    of libatap 0.1, these fields. See the
                                    conventions at the top of this file */
    size_t out_size;             /* output bytes (0: no output) */
    void (*out_free)(void *out); /* for an output nobody took: when the task is
                                    freed, replaced by a repeat's next one, or
                                    dropped (its run was cancelled or timed
                                    out). Every output a run makes (the run
                                    returned 0) is taken or passed to
                                    out_free, exactly once */
    void (*arg_free)(void *arg); /* called once, when the task is gone */
    int priority;                /* -128..127, higher starts first; 0 default. In
                                    the queue shared by the pool, within a priority,
                                    a resumed run (a park's deadline or event, a
                                    delayed start) comes before the first runs
                                    waiting there */
    bool blocking;               /* run on the blocking threads */
    uint64_t after_ns;           /* delays the first run only; runs late,
                                    never early. With nothing else about
                                    time, not blocking and an output of at
                                    most 12 bytes, the delay costs no memory
                                    beyond the slot (and the destructors'
                                    record, if any) */
    uint64_t timeout_ns;         /* each run's limit (0: none). The first run
                                    past it ends the task, and its series, as
                                    ATAP_TIMED_OUT; its output is dropped.
                                    Waiting to start does not count. */
    atap_kind kind;              /* ATAP_ONCE, ATAP_REPEAT, ATAP_AT_RATE */
    uint64_t every_ns;           /* REPEAT: the gap from one run's end to the
                                    next start; AT_RATE: the period */
    uint32_t runs;               /* REPEAT / AT_RATE: at most this many runs
                                    (0: no limit) */
    uint64_t for_ns;             /* REPEAT / AT_RATE: no run starts later than
                                    this long after the first one started */
    uint64_t until_ns;           /* REPEAT / AT_RATE: no run starts after this
                                    moment, the first one included (one or the
                                    other deadline). A series whose first run
                                    cannot start by then (until_ns passed, or
                                    after_ns ends past it) never runs: it ran
                                    out with nothing to read, settled at spawn
                                    as ATAP_TAKEN, finished, and a join or take
                                    reads ATAP_EFINISHED. A waiting series
                                    given a value past it runs nothing and
                                    takes no more gives (its last series'
                                    output, if any, stays readable) */
    uint32_t gives;              /* atap_spawn_waiting: how many gives may start
                                    something (0: no limit) */
    void (*in_free)(void *in);   /* atap_spawn_waiting: called exactly once for
                                    each value passed to atap_give, when the
                                    task no longer needs it (or at once, if
                                    the give was refused). It may run on the
                                    thread of a task forwarding into this one,
                                    with no lock of libatap's held, but before
                                    that task's next run: it must not wait
                                    for that task's next output */
} atap_spawn_opts;

/*
 * Zeroed options (every field at its default), written the same way in C
 * and C++ and clean at -Wall -Wextra -pedantic in both, where C++ has no
 * compound literal and g++ warns (-Wmissing-field-initializers) about a C++20
 * designated initializer that leaves fields out:
 *
 *     atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
 *     opts.out_size = sizeof(long);
 *     atap_spawn(&t, fn, arg, &opts);
 *
 * C may go on writing &(atap_spawn_opts){ .out_size = ... } instead.
 */
#ifdef __cplusplus
#define ATAP_SPAWN_OPTS_INIT                                                                       \
    {                                                                                              \
    }
#else
#define ATAP_SPAWN_OPTS_INIT                                                                       \
    {                                                                                              \
        0                                                                                          \
    }
#endif

/* Zeroed options with out_size set: a plain one-shot with an output of
 * out_size bytes (atap_spawn_opts o = atap_spawn_opts_out(sizeof(long));).
 * Inline in this header. Blocks: no. Threads: any. */
static inline atap_spawn_opts atap_spawn_opts_out(size_t out_size)
{
    atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
    opts.out_size = out_size;
    return opts;
}

/* CLOCK_MONOTONIC now, in nanoseconds: the clock of until_ns and of
 * atap_park_until. Works with or without a runtime. Blocks: no. Threads: any. */
ATAP_EXPORT uint64_t atap_now(void);

/*
 * A task that ends its thread (pthread_exit) reads ATAP_EFAILED, and so
 * does every task that thread was running further up its stack; the pool
 * replaces the thread. Whatever those frames owned, handles included, is
 * not released (C unwinds no destructors).
 *
 * Spawns fn(ctx, arg, out) on the pool. opts may be NULL (no output, normal
 * priority). On success *task receives a handle the caller must release.
 * On failure *task is set to ATAP_NO_TASK and arg_free is NOT called (arg
 * stays the caller's).
 * ATAP_AT_RATE starts a fresh run of fn(arg) every every_ns, start to start,
 * whether or not the last one has finished (runs overlap); runs finishing
 * together publish one output between them; periods missed (a manager
 * restart) are skipped, not made up.
 * A repeat has one handle for the whole series: atap_join reads the latest
 * output (waiting while a run is under way), atap_take moves one out for the
 * next run to replace, atap_cancel ends the series, and atap_finished turns
 * true once the series is over (runs used up or deadline passed, and at a
 * rate no run still under way; the last output stays readable). Whatever
 * ends an at-rate series otherwise (a cancel, a run that fails or passes
 * its timeout, a shutdown) stops its runs under way as atap_cancel does;
 * inside a run, atap_self names the series. A manager restart loses no delay, gap, period or
 * run timeout and fires none twice (the new manager's timers are rebuilt
 * from the task table): what spans a restart comes late, never early. A
 * delay or gap still pending at shutdown, or when the manager is gone for
 * good, ends the task as ATAP_FAILED.
 *
 * Returns 0; ATAP_EINVAL for NULL task or fn, a priority outside -128..127,
 * out_size above 4 GiB - 1, an option combination listed above, or an
 * opts whose size is refused (below sizeof(size_t), or a newer struct
 * setting a field this library does not know: see the conventions);
 * ATAP_ENOTINIT when no runtime
 * runs (before init, during or after shutdown); -ENOMEM when no slot or
 * output buffer can be had. A plain task's output (no time, gives,
 * destructor or blocking) of up to 24 bytes is kept in its slot; a larger
 * one may get its buffer only when the task first runs, so that a task
 * waiting in a queue holds nothing but its slot; if none can be had then,
 * the task does not run: it fails, and its readers get -ENOMEM.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn(atap_task *task, atap_fn *fn, void *arg, const atap_spawn_opts *opts);

/*
 * Spawns fn(ctx, arg, out) as atap_spawn does, keeping no handle: what
 * atap_spawn then atap_release do, without the handle's reference, and the
 * cheapest spawn. No handle to the task exists, so nothing outside can
 * join, take, wait for or cancel it (inside, atap_self names it, as in
 * any task): a repeat with no end runs until the runtime stops. It runs
 * as any other (a shutdown still runs it if it is queued); as it ends its
 * output is dropped (out_free sees it first) and its slot goes back.
 * Returns what atap_spawn returns for the same fn and opts: 0; ATAP_EINVAL
 * (then arg_free is not called: arg stays the caller's); ATAP_ENOTINIT;
 * -ENOMEM.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn_detached(atap_fn *fn, void *arg, const atap_spawn_opts *opts);

/*
 * Waits for the task to settle and copies its output (size bytes, which
 * must equal its out_size) into out; the output stays for other readers.
 * Inside a task, the wait holds no thread: the awaited task runs on top of
 * it if it is still in the thread's own queues, else the waiting stack is
 * set aside until the task settles (see "A wait inside a task" at the top
 * of this file). Outside the pool, the calling thread sleeps.
 * Returns 0; ATAP_EINVAL for a size that is not the task's out_size, a
 * NULL out with a nonzero size, or a task that is waiting for itself (a
 * task joining its own handle, or one lower on the same thread's stack,
 * which could never settle); ATAP_ENOTASK for a handle with no task;
 * ATAP_ETAKEN, ATAP_ECANCELLED, ATAP_ETIMEDOUT, ATAP_EFAILED for a task
 * that settled without a readable output (or the code its function
 * returned, see atap_fn); ATAP_EFINISHED for a series (repeat, at-rate,
 * waiting task) that ran out and whose last output was taken, or that never
 * ran.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_join(atap_task task, void *out, size_t size);

/* atap_join, giving up after timeout_ns with ATAP_ENOTREADY. It returns as
 * soon as the task settles. A timeout of 0 is atap_try_join. Inside a task
 * it runs the awaited task on top only while time is left, and a stack
 * set aside goes on at its thread's next finished run past the deadline,
 * so it can return late by one run. Returns as atap_join, and
 * ATAP_ENOTREADY. Blocks: up to timeout_ns. Threads: any. */
ATAP_EXPORT int atap_join_for(atap_task task, void *out, size_t size, uint64_t timeout_ns);

/* atap_join without waiting: returns as atap_join, or ATAP_ENOTREADY if
 * the task has not settled yet.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_try_join(atap_task task, void *out, size_t size);

/*
 * Waits for the task and moves its output into out: one caller only ever
 * gets it; every later reader gets ATAP_ETAKEN. out_free is then never
 * called on it (the output is the taker's). Errors as atap_join.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_take(atap_task task, void *out, size_t size);

/* atap_take with a timeout; giving up (ATAP_ENOTREADY) leaves the output.
 * Returns as atap_take, and ATAP_ENOTREADY. Blocks: up to timeout_ns.
 * Threads: any. */
ATAP_EXPORT int atap_take_for(atap_task task, void *out, size_t size, uint64_t timeout_ns);

/* atap_take without waiting: returns as atap_take, or ATAP_ENOTREADY if
 * the task has not settled yet.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_try_take(atap_task task, void *out, size_t size);

/*
 * Waits until the task settles, without reading it; *state (may be NULL)
 * receives how it settled. Returns 0, ATAP_ENOTASK, or ATAP_EINVAL for a
 * task waiting for itself.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_wait(atap_task task, atap_state *state);

/*
 * Cancels the task: a queued task never runs; a running one's output is
 * dropped; every listener then reads ATAP_ECANCELLED. A task that already
 * settled (its output landed, or it failed) is left alone; a repeat or an
 * at-rate series is cancelled between runs too, and while a run of a
 * series that ran out is still under way, its standing output then goes.
 * A cancel of an at-rate series reaches each of its runs under way before
 * it returns: a queued run never starts, a running one reads
 * atap_cancelled() and its kernel wait ends, a parked one is taken down.
 * Returns 0 (also when there was nothing left to cancel); ATAP_ENOTASK.
 * The handle stays valid and must still be released.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_cancel(atap_task task);

/* The task's state now (a snapshot: it may change as it returns);
 * ATAP_FAILED for a handle with no task. A task that is neither queued nor
 * running, because it waits for an event (a park) or for a give, reads
 * ATAP_WAITING, not ATAP_RUNNING or ATAP_PENDING; one waiting for a give
 * with an output standing from its last run reads ATAP_READY (or TAKEN),
 * as before. Blocks: no. Threads: any. */
ATAP_EXPORT atap_state atap_state_of(atap_task task);

/* True when the task has settled and will not run again (also for a handle
 * with no task). Blocks: no. Threads: any. */
ATAP_EXPORT bool atap_finished(atap_task task);

/*
 * Registers another listener: *copy receives a handle to the same task,
 * which must be released on its own. The copy is equal to the original
 * (copy->id == task.id): a task counts its handles, it does not tell them
 * apart. So each atap_release lets go of one of them, whichever value it
 * is given, and releasing one handle twice lets go of another's count: a
 * double release is a bug libatap cannot see, which shows later as
 * ATAP_ENOTASK on a handle still held (once releases match the count, the
 * task is gone for every copy). Pair each atap_dup with one release.
 * Returns 0; ATAP_EINVAL for NULL copy, or when the task already has
 * 2^20 - 1 handles; ATAP_ENOTASK (and *copy = ATAP_NO_TASK).
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_dup(atap_task task, atap_task *copy);

/*
 * This listener is done. When it was the last, the task's data goes:
 * out_free on an output nobody took, arg_free once (immediately if the task
 * has finished, else when the run ends). A running task is not cancelled by
 * it. A handle with no task is ignored. Blocks: no. Threads: any.
 */
ATAP_EXPORT void atap_release(atap_task task);

/*
 * Runs fn on the calling thread and waits for it: no slot, no pool, no
 * cancellation. Works with or without a running runtime. Inside a worker,
 * nothing else is run meanwhile. A run that parks (atap_park_fd, _until,
 * then returns ATAP_PARKED) waits for its event on the calling thread and
 * is run again, resumed.
 * Returns 0; ATAP_EFAILED if fn returned nonzero; ATAP_EINVAL for a NULL fn
 * or a NULL out with a nonzero out_size.
 * Blocks: for as long as fn runs. Threads: any.
 */
ATAP_EXPORT int atap_block(atap_fn *fn, void *arg, void *out, size_t out_size);

/* Inside a task: true once the task has been cancelled or has passed its
 * run timeout (for an at-rate run: once its series was stopped), so long
 * loops can stop early. False for NULL and inside atap_block.
 * Blocks: no. Threads: the task's own. */
ATAP_EXPORT bool atap_cancelled(atap_ctx *ctx);

/* Inside a task: its own handle (not a new listener: do not release it);
 * inside a run of an at-rate series, the series' handle (so a run can end
 * its series; a join on it from the run reads ATAP_EINVAL, as a task
 * waiting for itself). ATAP_NO_TASK inside atap_block or for NULL.
 * Blocks: no. Threads: the task's own. */
ATAP_EXPORT atap_task atap_self(atap_ctx *ctx);

/* ---------------------------------------------------------------------- */
/* Values between tasks                                                    */
/* ---------------------------------------------------------------------- */

/*
 * Spawns a task that runs only when given a value of in_size bytes (which
 * may be 0): each run reads the newest value with atap_input(). Nothing runs
 * at spawn. What a give starts depends on opts->kind:
 *   ATAP_ONCE: one run. A give while a run is under way owes one more run
 *     (with the newest value); gives don't queue, so the newest value wins.
 *   ATAP_REPEAT / ATAP_AT_RATE: a whole series (runs and for_ns count
 *     afresh from each series; until_ns is one moment for them all: a give
 *     past it starts nothing, and the task then takes no more gives). A
 *     give during a series only changes the value the rest of the series
 *     is handed.
 * opts->after_ns is waited out after each give that starts something.
 * opts->gives (0: no limit) counts the gives that start something; once
 * they are used up and the last run is over the task is finished, and a
 * give reads ATAP_EFINISHED. A waiting task is let go when no handle that
 * could give to it is left (every handle released and no atap_forward into
 * it); one never given anything then reads ATAP_EFAILED.
 * Returns as atap_spawn, and ATAP_EINVAL for in_size above 4 GiB - 1.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn_waiting(atap_task *task, atap_fn *fn, void *arg, size_t in_size,
                                   const atap_spawn_opts *opts);

/*
 * Gives a waiting task a value (size bytes, which must equal its in_size):
 * the bytes are copied in, and the task's in_free will be called on that
 * copy exactly once. A give that starts a run or a series, or owes one
 * more run to a task whose run is under way, makes a join from then on
 * wait for the run it started: a settled task goes back to ATAP_PENDING,
 * and a run under way publishes without settling it. Returns 0 when the
 * value was taken (it starts a run or a series, is owed one, or replaces
 * what the rest of a series is handed);
 * ATAP_EFINISHED once the task takes no more gives, ATAP_ECANCELLED,
 * ATAP_ETIMEDOUT or ATAP_EFAILED once it ended so; ATAP_ENOTINIT when no
 * runtime runs; ATAP_EINVAL for a wrong size, NULL value with a nonzero
 * size, a task that does not wait for gives or one fed by
 * atap_receive_all / atap_receive_any; ATAP_ENOTASK; -ENOMEM. A value
 * refused with ATAP_EINVAL, ATAP_ENOTASK or -ENOMEM stays the caller's;
 * any other refusal still passes the copy to in_free.
 * Blocks: no (a short lock per task). Threads: any.
 */
ATAP_EXPORT int atap_give(atap_task task, const void *value, size_t size);

/*
 * Inside a run of a waiting task: the value this run was handed, and its
 * size in *size (may be NULL). Valid until the run returns. NULL (size 0)
 * for a task that waits for nothing, and outside a task.
 * Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT const void *atap_input(atap_ctx *ctx, size_t *size);

/*
 * Spawns fn as a task that runs once every task in from[0..n) has published
 * an output, handed (atap_input) the n outputs laid end to end in set order.
 * An output already there when this is called counts. The next run waits
 * for all n again. Once a member can publish nothing more without having
 * filled its place (it ended, or its series ran out), the task finishes
 * after the run under way, if any. opts as atap_spawn_waiting (kind, gives,
 * after_ns, timeout_ns ...), except in_free, which must be NULL: the bytes
 * are copies of the members' outputs, still owned by the members' out_free.
 * The returned handle cannot give. The members' handles stay the caller's.
 * Sets nest: a member may itself be a receiver.
 * Returns as atap_spawn_waiting; ATAP_EINVAL for n = 0, a NULL from, or
 * in_free set; ATAP_ENOTASK (nothing spawned) if a member names no task.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_receive_all(atap_task *task, atap_fn *fn, void *arg, const atap_task *from,
                                 size_t n, const atap_spawn_opts *opts);

/*
 * As atap_receive_all, but every output of any member starts a run (or is
 * owed one) on its own: the members' out_size must all be the same, and it
 * is the task's in_size. Outputs don't queue: the newest wins. The task
 * finishes when no member can publish again.
 * Returns as atap_receive_all, and ATAP_EINVAL when the members' out_size
 * differ. Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_receive_any(atap_task *task, atap_fn *fn, void *arg, const atap_task *from,
                                 size_t n, const atap_spawn_opts *opts);

/*
 * Gives every output of `from` (each run of a repeat's) to the waiting task
 * `to`, as atap_give would; an output readable now is handed over at once.
 * Many may forward into one task, and chains work. The forward counts as a
 * giver of `to` until `from` can publish no more, and keeps both tasks'
 * slots (not their handles) until then. Bytes are copied; in_free is not
 * called on them.
 * Returns 0; ATAP_ENOTASK; ATAP_EINVAL when `to` does not wait for gives,
 * is a receiver, or its in_size is not from's out_size; ATAP_EFINISHED,
 * ATAP_ECANCELLED, ATAP_ETIMEDOUT, ATAP_EFAILED when `to` takes no more
 * gives; -ENOMEM.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_forward(atap_task from, atap_task to);

/*
 * Told when a task is over, without waiting for it: what an event loop of
 * its own (libuv, GLib, epoll, kqueue) needs to take results back.
 *
 * A task is over once it can publish nothing more and no run of it is
 * under way: it ended READY (or was TAKEN since), FAILED, CANCELLED or
 * TIMED_OUT; for a repeat or at-rate series, once the series ended; for a
 * waiting task, once it takes no more gives (its gives used up, or let go).
 * A cancelled task is over when its run under way, if any, has returned:
 * a join may read ATAP_ECANCELLED a little earlier. Likewise a join may
 * return an output a moment before its task is over (the run letting go).
 *
 * `task` is the handle registered (its value, not a new handle) and
 * `state` the task's state when it was over: ATAP_READY, ATAP_TAKEN,
 * ATAP_CANCELLED, ATAP_TIMED_OUT or ATAP_FAILED (a series: its last
 * state). The callback may read the task (atap_join, atap_take,
 * atap_state_of, atap_release) through `task` while the caller holds a
 * handle on it; once every handle was released those read ATAP_ENOTASK.
 */
typedef void atap_settle_fn(atap_task task, atap_state state, void *arg);

/*
 * Calls fn(task, state, arg) once, when the task is over (above), on a
 * pool thread: a small task of its own is spawned to call it. If that
 * spawn is refused (no runtime any more: a task that atap_shutdown itself
 * ends after the pool stopped; -ENOMEM), fn runs on the thread that ended
 * the task instead (a worker, the runtime's manager, or the caller of
 * atap_release, atap_cancel or atap_shutdown), holding none of the task's
 * locks. So fn runs exactly once, also for a task over already when this
 * is called, and every fn of a task that a shutdown ends has run by the
 * time atap_shutdown returns. A task may have any number of them; each
 * hears every way a task ends, as a join does (a cancel, a timeout, a
 * failure, a thread's death). It keeps no handle and does not keep
 * the task's slot past the task's end: releasing every handle before the
 * task is over still calls fn (reading ATAP_ENOTASK through `task`). A
 * registration cannot be withdrawn. fn should not wait long: it holds a
 * worker.
 * Returns 0; ATAP_EINVAL for a NULL fn; ATAP_ENOTASK when the handle names
 * no task (released, stale, never spawned); -ENOMEM. fn is not called
 * when this fails.
 * Blocks: no (a short lock per task). Threads: any.
 */
ATAP_EXPORT int atap_on_settle(atap_task task, atap_settle_fn *fn, void *arg);

/*
 * A descriptor that becomes readable once the task is over (as for
 * atap_on_settle), and then stays readable until it is read from: an
 * eventfd on Linux (reads 8 bytes, a count of 1), the read end of a pipe
 * elsewhere (one byte). Close-on-exec and non-blocking; the caller owns it
 * and closes it whenever it likes, before or after the task is over. For
 * a task over already it is readable at once (one whose join just
 * returned may still be letting go of its run: readable a moment later).
 * Made readable on the thread that ended the task, with a single write:
 * no task is spawned.
 * Returns 0 with the descriptor in *fd (-1 on failure); ATAP_EINVAL for a
 * NULL fd; ATAP_ENOTASK; -ENOMEM; -EMFILE or -ENFILE.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_settle_fd(atap_task task, int *fd);

/* What atap_join_first does with the tasks that did not settle first. */
typedef enum atap_join_policy {
    ATAP_PASS_BACK = 0, /* the losers stay the caller's, in their places */
    ATAP_CANCEL = 1,    /* each loser is cancelled, and its handle released */
    ATAP_RELEASE = 2,   /* each loser's handle is released (not cancelled) */
} atap_join_policy;

/*
 * Waits for the first of tasks[0..n) to settle (ready, taken, cancelled,
 * timed out or failed; a handle with no task counts as settled at once) and
 * stores its index in *winner. The winner's handle stays the caller's; the
 * losers are dealt with by policy. A task that settles while the wait is
 * being set up is still found; among several settled at once the lowest
 * index wins. Inside a task, a wait on one task is an atap_join of it (so
 * it can return late by one run at most); a wait on two or more runs
 * nothing on top of itself (no member is work it needs: another may settle
 * first) and sets its stack aside until a task settles.
 * Returns 0; ATAP_ENOTREADY if timeout_ns passed first (then no handle is
 * touched; ATAP_FOREVER waits without limit); ATAP_EINVAL for n = 0, NULL
 * tasks or winner, an unknown policy, or, inside a task, when every task
 * is the caller itself (or one it runs inside of), which could never settle
 * first.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_join_first(const atap_task *tasks, size_t n, atap_join_policy policy,
                                uint64_t timeout_ns, size_t *winner);

/*
 * atap_join on each of tasks[0..n): output i goes to out + i * size (every
 * task's out_size must be size), and rcs[i] (rcs may be NULL) receives what
 * atap_join returned for it. Returns 0 when every join did, else the first
 * failure's code; ATAP_EINVAL for NULL tasks, or NULL out with a nonzero
 * size. Handles stay the caller's. Inside a task the whole set is awaited:
 * the members still in the thread's own queues run first, on top of the
 * wait, newest first (the order they come out cheapest), as a taskwait
 * does; then each is joined in turn.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_join_all(const atap_task *tasks, size_t n, void *out, size_t size, int *rcs);

/* ---------------------------------------------------------------------- */
/* Waiting inside a task                                                   */
/* ---------------------------------------------------------------------- */

/*
 * Two ways to wait. A kernel wait (atap_sleep, atap_sleep_relaxed,
 * atap_wait_fd) holds the thread, but a cancel or a run timeout interrupts
 * it at once: each pool thread has its own event queue with a wake event,
 * which the canceller fires. A park gives the thread back: the task asks for
 * an event (atap_park_fd, atap_park_until), returns ATAP_PARKED, and runs
 * again, from the top of its function with atap_resumed() true, when the
 * event or the deadline comes. A parked task holds its slot and nothing
 * else. Exactly one of {the event, the deadline, a cancel, a run timeout, a
 * shutdown, the manager giving up} ends a park; the last two end the task as
 * ATAP_EFAILED. A manager restart re-arms every park: each parked fd,
 * signal and path is watched again, so an event the dead manager was told
 * of but never handed on is reported afresh to the next one (the kernel
 * looks at the fd again), and every deadline stays armed. Nothing is lost,
 * nothing resumes early, and no parked task runs for nothing. A cancel
 * takes a parked task down at once: it reads ATAP_ECANCELLED, and its slot
 * goes at the manager's next pass. A task must treat a resume as a hint
 * and look again: an fd event can be spurious (a read may still say
 * EAGAIN).
 */

/*
 * Events for atap_wait_fd and atap_park_fd, and reported back. ATAP_HANGUP
 * and ATAP_ERROR are reported only. ATAP_HANGUP: the other end hung up. A
 * wait for ATAP_READABLE hears of a stream socket's peer that closed or
 * shut down its writing side (TCP, AF_UNIX), as ATAP_HANGUP | ATAP_READABLE:
 * once the data ahead is read, a read returns 0 (where poll(2) has no
 * POLLRDHUP, outside Linux, the poll backend and atap_wait_fd outside a
 * task report ATAP_READABLE alone). A pipe whose write end closed reports
 * ATAP_HANGUP, with ATAP_READABLE on kqueue. A full hang-up (both ways
 * shut, a peer reset; kqueue: a WRITABLE wait whose writes can go nowhere)
 * is reported whatever was asked. A wait for ATAP_WRITABLE alone is not
 * told of a half-close (it can still write), unless another task is parked
 * on the same fd for ATAP_READABLE: a park is resumed by any ATAP_HANGUP
 * or ATAP_ERROR reported for its fd, whatever it asked for.
 */
#define ATAP_READABLE 0x1u
#define ATAP_WRITABLE 0x2u
#define ATAP_HANGUP 0x4u /* reported only: the other end hung up (above) */
#define ATAP_ERROR 0x8u  /* reported only: the fd has an error */

/*
 * Sleeps ns nanoseconds: never less. atap_sleep is precise (it spins the
 * last 500 us); atap_sleep_relaxed sleeps all of it in the kernel.
 * Inside a task: returns 0; ATAP_ECANCELLED or ATAP_ETIMEDOUT as soon as
 * the task is cancelled or passes its run timeout (also if it already had;
 * on a thread that could get no fd for its event queue, RLIMIT_NOFILE
 * reached, within 5 ms). Outside a task: a plain sleep, returns 0.
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_sleep(uint64_t ns);
ATAP_EXPORT int atap_sleep_relaxed(uint64_t ns);

/*
 * Waits until fd is ready for events (ATAP_READABLE and/or ATAP_WRITABLE)
 * or timeout_ns passes (ATAP_FOREVER: no limit). Returns the ready events
 * (> 0, ATAP_HANGUP / ATAP_ERROR included when the kernel says so);
 * ATAP_ENOTREADY when the time ran out; inside a task ATAP_ECANCELLED /
 * ATAP_ETIMEDOUT as atap_sleep; ATAP_EINVAL for no events or unknown bits;
 * -EBADF and other -errno from the kernel. A timeout of 0 looks once. fd
 * must stay open until it returns (closing it meanwhile from another thread
 * is the caller's race, as with poll(2)). Asked for both ways, it reports
 * both when both are ready. A regular file is ready at once, but on kqueue
 * readable only while its offset is short of its end (an empty file is
 * not).
 * Blocks: yes. Threads: any.
 */
ATAP_EXPORT int atap_wait_fd(int fd, unsigned events, uint64_t timeout_ns);

/*
 * Inside a task: asks to be run again when fd is ready for events, or, if
 * timeout_ns is not ATAP_FOREVER, once that long has passed; the task then
 * returns ATAP_PARKED. Several tasks may park on one fd. The fd must stay
 * open while the task is parked on it. The next run has atap_resumed() true
 * and atap_resume_reason() / atap_resume_events() saying why.
 * Inside atap_block the park works too: the calling thread waits for the
 * event and runs fn again (see atap_block).
 * Returns 0; ATAP_EINVAL for a NULL ctx (outside a task), no events or
 * unknown bits, a negative fd, or a second park call in one run.
 * Who hears fd's readiness: an idle worker waits in the kernel for every
 * parked fd at once and queues the tasks it resumes to itself, so a
 * socket's task runs on the thread that read its readiness; while no
 * worker is idle, a busy one looks between runs once nobody has for
 * 200 us, and the manager at its tick (10 ms) while every worker is inside
 * a long run. A park with a deadline whose task's output is small (it
 * lives in the task's slot) is queued by the manager once its fd is heard,
 * a wake of the manager's later.
 * An fd that is not open resumes at once with ATAP_ERROR. If the watch on
 * fd cannot be renewed for the tasks still parked on it (the kernel out of
 * memory), the manager tries again at each of its ticks (every 10 ms)
 * until a watch holds, and meanwhile looks at fd itself at each tick: no
 * readiness is lost, the resume only comes up to a tick late.
 * Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_park_fd(atap_ctx *ctx, int fd, unsigned events, uint64_t timeout_ns);

/*
 * Keeps fd watched from now until atap_fd_unkeep(fd), so that a park on it
 * makes no system call: the watch is armed once, not at each park. A kept
 * fd is edge-triggered: a park on it resumes once fd has become ready, for
 * a direction it asks for, since a park on it last resumed for that
 * direction (or since the keep), not merely because fd still is ready. So
 * park only after fd said EAGAIN, or after a read came back short (which
 * empties a stream socket or a pipe); the atap_net_* tasks do. A readiness
 * that comes while no task is parked waits for the next park, which then
 * resumes at once, so one task reading a kept fd never misses one. Keep an
 * fd that one task at a time waits on for each direction (a connection's
 * task, an accept loop): tasks parked together all hear of what comes, but
 * one that found nothing while another was being resumed may wait for the
 * next change. A hang-up or an error, once reported, resumes every later
 * park at once. Call atap_fd_unkeep before close(fd): a kept fd closed,
 * its number then reused by another file, may leave a park on the new one
 * waiting for ever. The keep lasts across a shutdown and the next
 * atap_init (but for an fd whose watch the kernel would not renew before
 * the shutdown: it is then kept no more, and parks on it work as without
 * a keep); a fork's child starts with no fd kept. On the poll backend
 * parks stay as they are without a keep (they hear of what is ready, which
 * keeps every promise above).
 * Returns 0 (an fd kept already is armed afresh); ATAP_EINVAL for a
 * negative fd; ATAP_ENOTINIT when no runtime is running; -EBADF for an fd
 * not open, -EPERM for a regular file (epoll: a regular file is always
 * ready), other -errno from the kernel.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_fd_keep(int fd);

/* Ends atap_fd_keep(fd): parks on fd are armed one at a time again, and a
 * task still parked on it stays parked. Call it before close(fd). Returns
 * 0, also for an fd not kept; ATAP_EINVAL for a negative fd.
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_fd_unkeep(int fd);

/* Inside a task: asks to be run again at deadline_ns (atap_now()'s clock;
 * never earlier), then return ATAP_PARKED. Inside atap_block the calling
 * thread sleeps until then. Returns 0; ATAP_EINVAL for a NULL ctx or a
 * second park call in one run. Blocks: no. Threads: the task's own. */
ATAP_EXPORT int atap_park_until(atap_ctx *ctx, uint64_t deadline_ns);

/*
 * Inside a task: asks to be run again when signal signo arrives (or the
 * timeout passes), then return ATAP_PARKED. From the first such park on,
 * libatap catches signo for the rest of the process (its handler only sets
 * a flag and writes a byte to a pipe); a signal that arrives while no task
 * is parked on it is dropped. Returns as atap_park_fd; ATAP_EINVAL also for
 * a signo out of range, SIGKILL or SIGSTOP, a signal the C library keeps
 * for itself, a fault signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
 * SIGSYS: a handler that returns from one would re-run the fault), or
 * inside atap_block. A park the kernel will not let libatap set up (its
 * pipe, or the manager's watch on it, refused) resumes at once with
 * atap_resume_events() ATAP_ERROR. If the watch cannot be renewed after a
 * signal (the kernel out of memory), the manager reads the pipe at each of
 * its ticks (every 10 ms) and tries again until a watch holds: no signal
 * is lost and no park is left waiting, the resume only comes up to a tick
 * late.
 * Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_park_signal(atap_ctx *ctx, int signo, uint64_t timeout_ns);

/*
 * Counts the deliveries of signo, so that a task can wait for a signal
 * without dropping one that comes between its look and its park: from the
 * first call on, libatap catches signo for the rest of the process (as
 * atap_park_signal does) and its handler counts every delivery; *count
 * gets the count so far, a number that only grows. Look at the count, do
 * the work, then park with atap_park_signal_since and the count seen.
 * Works with or without a runtime. Returns 0; ATAP_EINVAL for a NULL count
 * or a signo atap_park_signal refuses; -errno when the handler could not
 * be installed. Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_signal_count(int signo, uint64_t *count);

/*
 * atap_park_signal, but the park also resumes at once (as if signo had
 * come) when signo's count (atap_signal_count) is no longer `seen` by the
 * time the park is armed: no delivery after the look that read `seen` is
 * dropped. Counts are compared on their low 31 bits. Returns as
 * atap_park_signal. Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_park_signal_since(atap_ctx *ctx, int signo, uint64_t seen,
                                       uint64_t timeout_ns);

/* Changes atap_park_path waits for, and reports (atap_resume_events). */
#define ATAP_PATH_WRITE 0x10u   /* the file's content was written */
#define ATAP_PATH_ATTRIB 0x20u  /* its metadata changed (mode, times, links) */
#define ATAP_PATH_ENTRIES 0x40u /* a directory's entries were added, removed or renamed */
#define ATAP_PATH_GONE 0x80u    /* the file itself was deleted or moved (always asked) */

/*
 * Inside a task: asks to be run again when the file or directory open as fd
 * changes in one of the ways in `changes` (or the timeout passes), then
 * return ATAP_PARKED. Linux with the epoll or poll backend: inotify (an
 * unlinked file reports ATAP_PATH_GONE once its last descriptor closes;
 * before that, an unlink is an ATAP_PATH_ATTRIB change; closing a file
 * written through a descriptor is an ATAP_PATH_WRITE change). The kqueue
 * backend (macOS, the BSDs, Linux with libkqueue): EVFILT_VNODE on fd (an
 * unlink or a rename reports ATAP_PATH_GONE at once; a subdirectory made
 * or removed also changes its parent's link count, ATAP_PATH_ATTRIB; a
 * close is no change; libkqueue watches a file by its name, and a file
 * with none left resumes at once with ATAP_ERROR); -ENOTSUP with the poll
 * backend outside Linux.
 * `changes` needs at least one of the bits above (ATAP_PATH_GONE alone
 * waits for the removal only): 0 or an unknown bit is ATAP_EINVAL.
 * Returns as atap_park_fd; ATAP_EINVAL also inside atap_block (a path
 * watch lives on the manager, which atap_block does not use). A closed fd
 * resumes at once with ATAP_ERROR, as does a park the kernel will not let
 * libatap watch. If the watch on inotify cannot be renewed after a change
 * (the kernel out of memory), the manager reads inotify's queue at each of
 * its ticks (every 10 ms) and tries again until a watch holds: no change is
 * lost, the resume only comes up to a tick late. When the kernel lost
 * changes (inotify's queue overflowed; on kqueue, a manager restart, or a
 * file's watch the kernel would not renew, which that file's parks take as
 * lost changes) every path park concerned resumes, with events saying its
 * file may have been written, changed and had its entries changed (never
 * ATAP_PATH_GONE): look at it again.
 * Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_park_path(atap_ctx *ctx, int fd, unsigned changes, uint64_t timeout_ns);

/*
 * Wakers: parks of one's own making. A task that waits for something only
 * the program's own code knows of (a value in a queue of its own, room in
 * it) takes its waker, leaves it where that code will find it, asks for a
 * wake park and returns ATAP_PARKED; whoever makes progress possible calls
 * atap_wake with the waker. libatap's channels are built this way. A
 * waker names one task and holds nothing: it is not a handle (it needs no
 * atap_release, and keeps no slot), and once its task has ended it wakes
 * nothing. The all-zero waker names no task.
 */
typedef struct atap_waker {
    uint64_t id;
} atap_waker;

/* Inside a task: its waker (an at-rate run's is the run's own, not its
 * series'); the all-zero waker for NULL. Blocks: no. Threads: the task's
 * own. */
ATAP_EXPORT atap_waker atap_waker_of(atap_ctx *ctx);

/*
 * Inside a task: asks to be run again when atap_wake is called with this
 * task's waker, or once timeout_ns has passed (ATAP_FOREVER: no limit);
 * the task then returns ATAP_PARKED. A wake that comes at any moment after
 * this call returned 0 reaches the park, even one that comes before the
 * task has returned (the park then resumes at once). A wake that came while
 * the task was not parked for one makes its next wake park resume at once,
 * so a resume is a hint: look again, and park again if there is still
 * nothing to do. The next run has atap_resume_reason() ATAP_RESUME_READY
 * after a wake, ATAP_RESUME_DEADLINE after the timeout. Returns 0;
 * ATAP_EINVAL for a NULL ctx, a second park call in one run, or inside
 * atap_block (no waker names it there); -ENOMEM when the park's record
 * could not be made (nothing was asked: the run goes on).
 * Blocks: no. Threads: the task's own.
 */
ATAP_EXPORT int atap_park_wake(atap_ctx *ctx, uint64_t timeout_ns);

/*
 * Wakes the task w names, parked by atap_park_wake or about to be. Returns
 * true when that task was queued or running (it runs again, or its next
 * wake park resumes at once); false when it was not (it has ended:
 * cancelled, timed out, done, its slot gone; or it is a repeat between two
 * runs) or w names no task: then nobody was woken, and a value meant for it
 * should go to someone else. A wake that returned true after the task's
 * atap_park_wake call is never lost: the task runs again even if a cancel,
 * a run timeout or a shutdown stops it meanwhile; it then runs once more
 * with atap_cancelled() true (its return is ignored), so that what the wake
 * meant (a value, room) can be handed on.
 * Blocks: no. Threads: any, a task's or not.
 */
ATAP_EXPORT bool atap_wake(atap_waker w);

/* Whether w's task is queued or running, as atap_wake would find it; a
 * snapshot (it may end right after). For dropping the wakers of tasks that ended
 * from a list of waiters. Blocks: no. Threads: any. */
ATAP_EXPORT bool atap_waker_live(atap_waker w);

/* Why this run follows a park. */
#define ATAP_RESUME_READY 1    /* the fd became ready, or a wake came */
#define ATAP_RESUME_DEADLINE 2 /* the deadline or timeout came first */

/* Inside a task: true when this run follows a park; false for NULL.
 * Blocks: no. Threads: the task's own. */
ATAP_EXPORT bool atap_resumed(atap_ctx *ctx);
/* Inside a task: ATAP_RESUME_READY or ATAP_RESUME_DEADLINE after a park,
 * else 0 (also for NULL). Blocks: no. Threads: the task's own. */
ATAP_EXPORT int atap_resume_reason(atap_ctx *ctx);
/* Inside a task resumed by its event: the ATAP_READABLE... bits an fd
 * reported, or the ATAP_PATH_* changes seen; 0 for a signal (ATAP_ERROR
 * for a park that could not be set up); 0 after a deadline or for NULL.
 * Blocks: no. Threads: the task's own. */
ATAP_EXPORT unsigned atap_resume_events(atap_ctx *ctx);

/* Nanoseconds, as every time in this header is, from microseconds,
 * milliseconds and seconds; and the timeout that never runs out. */
#define ATAP_US(n) ((uint64_t)(n)*1000u)
#define ATAP_MS(n) ((uint64_t)(n)*1000000u)
#define ATAP_SEC(n) ((uint64_t)(n)*1000000000u)
#define ATAP_FOREVER UINT64_MAX /* a timeout that never runs out */

#ifdef __cplusplus
}
#endif

#endif /* ATAP_CORE_H */

/*
 * fuzz_api: the public API driven by programs read from bytes, every result
 * checked against a model of what include/atap.h promises.
 *
 * A program is a byte string. The interpreter reads an operation byte and
 * its argument bytes (past the end every byte reads 0) and runs it on a
 * table of NH handles: spawns of every kind (once, delayed, timed out,
 * repeat, at rate with runs / for / until, blocking, priorities, waiting
 * tasks with gives limits, receive_all / receive_any over earlier handles,
 * forwards, sleep tasks, channel send and receive tasks, tasks parked on a
 * pipe the program writes later, tasks that join other handles, tasks that
 * spawn children), bytes through a kept socket (atap_fd_keep) to a reader
 * task that parks on it, the calls on handles (join, join_for, try_join, take,
 * take_for, try_take, wait, cancel, dup, release, give, state_of, finished,
 * join_first, join_all), fault injection, and a shutdown + init.
 *
 * The model beside it (struct ftask, one per spawn) checks:
 *   - every return code is one atap.h lists for that call;
 *   - every output read is a record its own task wrote: the writer's uid,
 *     the run's serial and a checksum over every word, so a torn or crossed
 *     output is seen; a one-shot's result never changes once read;
 *   - states only move forward, and a settled result sticks;
 *   - a task settles within a generous bound once what it waits for is
 *     there (the pipe written, a cancel made), and after a shutdown every
 *     one-shot is settled: no lost wake-up;
 *   - arg_free, out_free, in_free and elem_free run exactly once per thing;
 *   - once every handle is released and the runtime shut down, no task is
 *     live (ASan then sees any leak);
 *   - no delay, gap, period, park deadline, sleep or timeout fires early
 *     (CLOCK_MONOTONIC; lateness is allowed).
 *
 * Two builds: a libFuzzer target (FUZZ_LIBFUZZER, clang) and a plain driver
 * (main below) that replays files and directories and runs random programs
 * from a printed seed for a time budget. A failure prints what broke and
 * the seed, and writes the program to a file to replay.
 *
 * Known library bugs still open can be skipped, each behind its own define
 * FUZZ_SKIP_<NAME> (0, the default, checks; CMake's ATAP_FUZZ_SKIP lists
 * them). None is open now. The last one, STALE_HELD, is fixed and checked
 * (op_stale): the runtime's own holds on a task counted as listeners, so a
 * stale copy of a released handle still named a task that a forward fed
 * or a waker held, and a read through it could race the slot's free.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atap.h"
#include "atap/inject.h" /* atap_inject_*: the tests link atap_testing, which has them */

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FUZZ_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(FUZZ_TSAN)
#define FUZZ_TSAN 1
#endif

#define NH 16                  /* handles a program works on */
#define MAX_TASKS 192          /* spawns per program */
#define MAX_OPS 80             /* operations per program */
#define MAX_ELEMS 256          /* channel values per program */
#define MAX_FWD 8              /* forwards into one task */
#define REC_SMALL 32           /* output sizes: small (on the heap past the slot's 16 bytes) ... */
#define REC_BIG 512            /* ... and big */
#define TIME_SLACK ATAP_SEC(2) /* lateness tolerated where an upper bound is checked */

/* ---------------------------------------------------------------------- */
/* Time, failure                                                           */
/* ---------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* How long a task may take to settle once what it waits for is there. */
static uint64_t settle_bound(void)
{
#ifdef FUZZ_TSAN
    return ATAP_SEC(60);
#else
    return ATAP_SEC(20);
#endif
}

/* The program running now (the driver's), for a failure to save. */
static const uint8_t *g_prog;
static size_t g_prog_len;
static uint64_t g_seed;
static int64_t g_index = -1; /* program index under the seed; -1: a file */
static const char *g_source = "";
static atomic_int g_op;                 /* the operation under way */
static atomic_uint_fast64_t g_progress; /* now_ns() at the last step */
static atomic_int g_failing;
static bool g_libfuzzer;
static char g_call[256]; /* the blocking call under way, for the watchdog */

static void save_program(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return;
    if (g_prog_len)
        fwrite(g_prog, 1, g_prog_len, f);
    fclose(f);
}

/* Reports a broken promise and aborts. Any thread. */
__attribute__((format(printf, 1, 2), noreturn)) static void fuzz_fail(const char *fmt, ...)
{
    if (atomic_exchange(&g_failing, 1)) {
        for (;;)
            sleep_ns(ATAP_SEC(1)); /* the first failure is being reported */
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_api: FAILED at op %d: ", atomic_load(&g_op));
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (!g_libfuzzer) {
        char path[256];
        if (g_index >= 0)
            snprintf(path, sizeof path, "fuzz_api-fail-%" PRIu64 "-%" PRId64 ".bin", g_seed,
                     g_index);
        else
            snprintf(path, sizeof path, "fuzz_api-fail-replay.bin");
        save_program(path);
        char cwd[1024];
        if (getcwd(cwd, sizeof cwd) == NULL)
            strcpy(cwd, ".");
        fprintf(stderr, "fuzz_api: program %s (%zu bytes) saved to %s/%s; replay: fuzz_api %s/%s\n",
                g_source, g_prog_len, cwd, path, cwd, path);
        if (g_index >= 0)
            fprintf(stderr, "fuzz_api: or: fuzz_api --seed %" PRIu64 " --index %" PRId64 "\n",
                    g_seed, g_index);
    }
    fflush(stderr);
    abort();
}

#define FZ_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fuzz_fail(__VA_ARGS__);                                                                \
    } while (0)

/* ---------------------------------------------------------------------- */
/* Records: what every output, give and channel value carries              */
/* ---------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* Word 0: the writer's uid and the word count; word 1: a serial; every
 * other word a hash of both and its index. */
static void rec_fill(void *p, size_t size, uint32_t uid, uint64_t serial)
{
    uint64_t w[REC_BIG / 8];
    size_t n = size / 8;

    w[0] = ((uint64_t)uid << 16) | n;
    w[1] = serial;
    for (size_t i = 2; i < n; i++)
        w[i] = mix64(w[0] ^ mix64(w[1] + i));
    memcpy(p, w, n * 8);
}

/* True when p holds a whole record of size bytes; its uid and serial. */
static bool rec_read(const void *p, size_t size, uint32_t *uid, uint64_t *serial)
{
    uint64_t w[REC_BIG / 8];
    size_t n = size / 8;

    if (size % 8 || n < 2 || n > REC_BIG / 8)
        return false;
    memcpy(w, p, size);
    if ((w[0] & 0xffff) != n)
        return false;
    for (size_t i = 2; i < n; i++)
        if (w[i] != mix64(w[0] ^ mix64(w[1] + i)))
            return false;
    *uid = (uint32_t)(w[0] >> 16);
    *serial = w[1];
    return true;
}

/* The size a record says it has (0 if it says nothing sensible). */
static size_t rec_size(const void *p)
{
    uint64_t w0;
    memcpy(&w0, p, 8);
    size_t n = (size_t)(w0 & 0xffff);
    return n == REC_SMALL / 8 || n == REC_BIG / 8 ? n * 8 : 0;
}

static bool aligned_max(const void *p) { return ((uintptr_t)p % alignof(max_align_t)) == 0; }

/* ---------------------------------------------------------------------- */
/* The model                                                               */
/* ---------------------------------------------------------------------- */

enum fmt { FMT_NONE, FMT_REC, FMT_U64 };
enum fn_kind {
    FN_VALUE,
    FN_SLEEP,
    FN_FAIL,
    FN_PARK_PIPE,
    FN_PARK_UNTIL,
    FN_JOIN,
    FN_SPAWN,
    FN_KINDS
};
enum origin { O_SPAWN, O_WAITING, O_RECV_ALL, O_RECV_ANY, O_SLEEP, O_CHAN_RECV, O_CHAN_SEND };

typedef struct ftask {
    /* set before the spawn, read-only after */
    uint32_t uid;
    uint32_t out_uid; /* the uid its outputs carry (a channel's for a receive) */
    enum origin origin;
    enum fn_kind fn;
    enum fmt fmt;
    atap_kind kind;
    size_t out_size, in_size;
    bool has_out_free, has_in_free, has_arg_free;
    bool once_plain; /* ATAP_ONCE and not fed: one result, for good */
    uint64_t t0;     /* before the spawn call */
    uint64_t after_ns, timeout_ns, every_ns, until_ns;
    uint32_t runs_limit, gives_limit;
    uint64_t work_ns; /* sleep or park length */
    bool precise;
    int join_mode;
    struct ftask *other; /* FN_JOIN: the task joined, through other_h */
    atap_task other_h;
    uint32_t member_uid[4];
    size_t member_size[4];
    size_t nmembers;
    /* shared with the task's runs */
    uint32_t fwd_uid[MAX_FWD];
    atomic_int nfwd;
    atomic_uint_fast64_t self_id;
    atomic_int listeners;
    atomic_int cancel_done; /* an atap_cancel on it has returned 0 */
    atomic_uint_fast64_t runs, produced, out_freed, arg_freed, in_freed, taken;
    atomic_uint_fast64_t last_end, park_at, park_deadline;
    atomic_int ran_series;
    /* the model's, main thread only */
    bool spawned;
    bool bounded; /* settles without anything more from the program */
    int last_state;
    bool sticky; /* a one-shot's result has been read */
    int sticky_rc;
    uint64_t sticky_serial;
    bool take_done;
    bool finished_seen;
    uint64_t in_free_owed;
} ftask;

typedef struct hslot {
    bool used;
    atap_task h;
    ftask *t;
} hslot;

static struct {
    ftask tasks[MAX_TASKS];
    size_t ntasks;
    uint32_t uid_base;
    hslot hs[NH];
    atap_task stale[NH * 4];
    ftask *stale_t[NH * 4];
    size_t nstale;
    bool running;
    int pipe_fd[2];
    atomic_int pipe_written;
    /* The kept fd: a socket pair whose reading end is kept for the whole
     * program (across its shutdowns), read by one task outside the handle
     * table that parks after EAGAIN. Every byte written must be read. */
    int kept_fd[2];
    atap_task kept_reader;
    bool kept_reading;
    uint64_t kept_sent;
    _Atomic uint64_t kept_got;
    atomic_int kept_live; /* readers spawned whose arg_free has not run */
    atap_chan *chan;
    uint32_t chan_uid;
    bool chan_sender, chan_receiver;
    size_t chan_cap;
    uint64_t elem_next;
    atomic_int elem_sent[MAX_ELEMS]; /* 1: the channel has it (or dropped it) */
    atomic_int elem_gone[MAX_ELEMS]; /* taken or passed to elem_free */
    uint64_t give_next;
    bool deaths;      /* thread deaths in play: frames lost, leaks allowed */
    size_t live_base; /* live tasks before the program: what earlier thread
                         deaths left (their frames' handles never released) */
    uint64_t deaths_at_start;
} G;

static atomic_uint g_uid_next = 1;
static unsigned g_deaths_injected; /* over the process */

static ftask *task_by_uid(uint32_t uid)
{
    /* Not against G.ntasks, which the main thread moves on meanwhile: a
     * task's record was filled before its spawn, which a callback follows. */
    if (uid < G.uid_base || uid - G.uid_base >= MAX_TASKS)
        return NULL;
    return &G.tasks[uid - G.uid_base];
}

static const char *origin_name(enum origin o)
{
    static const char *names[] = {"spawn", "waiting",   "receive_all", "receive_any",
                                  "sleep", "chan_recv", "chan_send"};
    return names[o];
}

static const char *kind_name(atap_kind k)
{
    return k == ATAP_ONCE ? "once" : k == ATAP_REPEAT ? "repeat" : "at_rate";
}

#define TFMT "task %u (%s %s fn %d out %zu)"
#define TARGS(t)                                                                                   \
    (t)->uid, origin_name((t)->origin), kind_name((t)->kind), (int)(t)->fn, (t)->out_size

static void note_call(const char *call, const ftask *t)
{
    snprintf(g_call, sizeof g_call, "%s on " TFMT " bounded %d runs %" PRIu64 " cancelled %d", call,
             TARGS(t), t->bounded, (uint64_t)atomic_load(&t->runs), atomic_load(&t->cancel_done));
}

/* ---------------------------------------------------------------------- */
/* Callbacks: count every call, check what they are handed                  */
/* ---------------------------------------------------------------------- */

static void fz_arg_free(void *arg)
{
    ftask *t = arg;
    if (t->other != NULL) { /* FN_JOIN's listener on the task it joins */
        atap_release(t->other_h);
        atomic_fetch_sub(&t->other->listeners, 1);
    }
    uint64_t n = atomic_fetch_add(&t->arg_freed, 1) + 1;
    FZ_CHECK(n == 1, TFMT ": arg_free called %" PRIu64 " times", TARGS(t), n);
}

static void fz_out_free(void *out)
{
    uint32_t uid;
    uint64_t serial;
    size_t size = rec_size(out);
    FZ_CHECK(size && rec_read(out, size, &uid, &serial),
             "out_free handed a torn or foreign output");
    ftask *t = task_by_uid(uid);
    FZ_CHECK(t != NULL && t->has_out_free && t->out_size == size,
             "out_free handed an output of uid %u, no task of this program with out_free", uid);
    uint64_t n = atomic_fetch_add(&t->out_freed, 1) + 1;
    FZ_CHECK(n + atomic_load(&t->taken) <= atomic_load(&t->produced),
             TFMT ": out_free %" PRIu64 " + taken %" PRIu64 " > outputs made %" PRIu64, TARGS(t), n,
             (uint64_t)atomic_load(&t->taken), (uint64_t)atomic_load(&t->produced));
}

static void fz_in_free(void *in)
{
    uint32_t uid;
    uint64_t serial;
    size_t size = rec_size(in);
    FZ_CHECK(size && rec_read(in, size, &uid, &serial), "in_free handed a torn value");
    ftask *t = task_by_uid(uid);
    FZ_CHECK(t != NULL && t->has_in_free && t->in_size == size,
             "in_free handed a value for uid %u, no waiting task with in_free", uid);
    atomic_fetch_add(&t->in_freed, 1);
}

static void fz_elem_free(void *v)
{
    uint32_t uid;
    uint64_t serial;
    FZ_CHECK(aligned_max(v), "elem_free handed %p, not aligned for max_align_t", v);
    FZ_CHECK(rec_read(v, REC_SMALL, &uid, &serial) && uid == G.chan_uid && serial < MAX_ELEMS,
             "elem_free handed a torn or foreign value");
    int n = atomic_fetch_add(&G.elem_gone[serial], 1) + 1;
    FZ_CHECK(n == 1, "channel value %" PRIu64 " taken or freed %d times", serial, n);
}

/* ---------------------------------------------------------------------- */
/* Task functions                                                          */
/* ---------------------------------------------------------------------- */

static bool rc_in(int rc, const int *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (rc == set[i])
            return true;
    return false;
}

#define RC_IN(rc, ...)                                                                             \
    rc_in((rc), (const int[]){__VA_ARGS__}, sizeof((const int[]){__VA_ARGS__}) / sizeof(int))

/* What a read (join, take ...) may return: atap.h's list, plus the codes our
 * tasks end with (their function's ATAP_E* return, ECLOSED for a channel),
 * and -ENOMEM: an output over the slot's 16 bytes refused its memory at the
 * task's first run (an injected allocation failure). */
#define READ_CODES                                                                                 \
    0, ATAP_EINVAL, ATAP_ENOTASK, ATAP_ETAKEN, ATAP_ECANCELLED, ATAP_ETIMEDOUT, ATAP_EFAILED,      \
        ATAP_EFINISHED, ATAP_ECLOSED, -ENOMEM

/* A run of a cancelled task must see it. */
static void check_cancel_seen(ftask *t, atap_ctx *ctx, const char *where)
{
    if (atomic_load(&t->cancel_done) && !atap_cancelled(ctx))
        fuzz_fail(TFMT ": a run %s an atap_cancel that returned 0, atap_cancelled false", TARGS(t),
                  where);
}

static int child_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    rec_fill(out, REC_SMALL, (uint32_t)(uintptr_t)arg, 7);
    return 0;
}

static void check_inside_read(ftask *t, int rc, const void *buf)
{
    ftask *o = t->other;
    FZ_CHECK(RC_IN(rc, READ_CODES, ATAP_ENOTREADY, ATAP_ELIMIT),
             TFMT ": a join inside a task returned %d (%s)", TARGS(t), rc, atap_strerror(rc));
    if (rc != 0 || o->fmt != FMT_REC)
        return;
    uint32_t uid;
    uint64_t serial;
    FZ_CHECK(rec_read(buf, o->out_size, &uid, &serial) && uid == o->out_uid,
             TFMT ": a join inside a task read a torn or crossed output of " TFMT, TARGS(t),
             TARGS(o));
}

/* Joins the other task, as t->join_mode says. */
static void run_join(ftask *t)
{
    alignas(max_align_t) unsigned char buf[REC_BIG];
    size_t sz = t->other->out_size;
    int rc;

    switch (t->join_mode) {
    case 0:
        rc = atap_join_for(t->other_h, sz ? buf : NULL, sz, t->work_ns);
        break;
    case 1:
        rc = atap_try_join(t->other_h, sz ? buf : NULL, sz);
        break;
    case 2: {
        size_t w = 99;
        rc = atap_join_first(&t->other_h, 1, ATAP_PASS_BACK, t->work_ns, &w);
        FZ_CHECK(RC_IN(rc, 0, ATAP_ENOTREADY, ATAP_EINVAL, ATAP_ELIMIT),
                 TFMT ": join_first inside a task returned %d", TARGS(t), rc);
        FZ_CHECK(rc != 0 || w == 0, TFMT ": join_first of one named winner %zu", TARGS(t), w);
        return;
    }
    default: {
        atap_state st = 0;
        uint64_t end = now_ns() + t->work_ns;
        while (!atap_finished(t->other_h) && now_ns() < end)
            atap_sleep_relaxed(ATAP_US(200));
        st = atap_state_of(t->other_h);
        FZ_CHECK(st >= ATAP_PENDING && st <= ATAP_WAITING, TFMT ": state_of %d", TARGS(t), (int)st);
        return;
    }
    }
    check_inside_read(t, rc, buf);
}

/* The handles of children spawned inside tasks, until released: a task
 * whose frame a thread death unwinds (an injected one, while it waits)
 * never releases its own, and the program's end releases them here, so a
 * child's output on the heap is not left for ASan to find. */
#define MAX_KIDS 1024
static _Atomic uint64_t g_kids[MAX_KIDS];

static int kid_keep(atap_task k)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        uint64_t none = 0;
        if (atomic_compare_exchange_strong(&g_kids[i], &none, k.id))
            return i;
    }
    return -1; /* full: this one is the frame's alone */
}

static void kid_let_go(int i)
{
    if (i >= 0)
        atomic_store(&g_kids[i], 0);
}

static void kids_release_left(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        uint64_t id = atomic_exchange(&g_kids[i], 0);
        if (id)
            atap_release((atap_task){id});
    }
}

static void run_spawn(ftask *t)
{
    atap_task kids[3];
    uint32_t uids[3];
    int kept[3];
    size_t n = 1 + t->work_ns % 3;

    for (size_t i = 0; i < n; i++) {
        uids[i] = atomic_fetch_add(&g_uid_next, 1);
        int rc = atap_spawn(&kids[i], child_task, (void *)(uintptr_t)uids[i],
                            &(atap_spawn_opts){.out_size = REC_SMALL, .priority = (int)i - 1});
        FZ_CHECK(RC_IN(rc, 0, ATAP_ENOTINIT, -ENOMEM), TFMT ": a spawn inside returned %d",
                 TARGS(t), rc);
        if (rc != 0)
            kids[i] = ATAP_NO_TASK;
        kept[i] = rc == 0 ? kid_keep(kids[i]) : -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (kids[i].id == 0)
            continue;
        alignas(max_align_t) unsigned char buf[REC_SMALL];
        uint32_t uid;
        uint64_t serial;
        if ((t->work_ns + i) % 4 != 3) {
            int rc = atap_join(kids[i], buf, sizeof buf);
            FZ_CHECK(RC_IN(rc, 0, ATAP_EFAILED, ATAP_ELIMIT, ATAP_ECANCELLED, -ENOMEM),
                     TFMT ": joining a child returned %d", TARGS(t), rc);
            FZ_CHECK(rc != 0 || (rec_read(buf, sizeof buf, &uid, &serial) && uid == uids[i]),
                     TFMT ": a child's output is torn or another's", TARGS(t));
        }
        kid_let_go(kept[i]);
        atap_release(kids[i]);
    }
}

static bool pipe_readable(void)
{
    struct pollfd p = {.fd = G.pipe_fd[0], .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Checks the input of a fed task: a record of its own uid (a give), of a
 * task forwarding into it, or the members' outputs end to end. */
static void check_input(ftask *t, atap_ctx *ctx)
{
    size_t size = 99;
    const unsigned char *in = atap_input(ctx, &size);
    uint32_t uid;
    uint64_t serial;

    FZ_CHECK(size == t->in_size && in != NULL, TFMT ": atap_input size %zu, expected %zu", TARGS(t),
             size, t->in_size);
    if (t->origin == O_RECV_ALL) {
        size_t off = 0;
        for (size_t i = 0; i < t->nmembers; i++) {
            FZ_CHECK(rec_read(in + off, t->member_size[i], &uid, &serial) &&
                         uid == t->member_uid[i],
                     TFMT ": receive_all input %zu is torn or not member %u's", TARGS(t), i,
                     t->member_uid[i]);
            off += t->member_size[i];
        }
        return;
    }
    FZ_CHECK(rec_read(in, size, &uid, &serial), TFMT ": input torn", TARGS(t));
    if (t->origin == O_RECV_ANY) {
        for (size_t i = 0; i < t->nmembers; i++)
            if (uid == t->member_uid[i])
                return;
        fuzz_fail(TFMT ": receive_any input from uid %u, not a member", TARGS(t), uid);
    }
    if (uid == t->uid)
        return;
    int n = atomic_load(&t->nfwd);
    for (int i = 0; i < n; i++)
        if (t->fwd_uid[i] == uid)
            return;
    fuzz_fail(TFMT ": input from uid %u, neither a give nor a forward", TARGS(t), uid);
}

/* The first entry of a run: its timing against the options. */
static void check_run_start(ftask *t, atap_ctx *ctx, void *out)
{
    uint64_t n = atomic_fetch_add(&t->runs, 1);
    uint64_t at = now_ns();
    bool fed = t->origin != O_SPAWN;

    FZ_CHECK(at >= t->t0 + t->after_ns,
             TFMT ": run %" PRIu64 " started %" PRIu64
                  " ns after the spawn, before its after_ns %" PRIu64,
             TARGS(t), n, at - t->t0, t->after_ns);
    if (!fed && t->runs_limit)
        FZ_CHECK(n < t->runs_limit, TFMT ": run %" PRIu64 " of a series of %u runs", TARGS(t), n,
                 t->runs_limit);
    if (!fed && t->kind == ATAP_REPEAT && n > 0) {
        uint64_t end = atomic_load(&t->last_end);
        FZ_CHECK(end != 0 && at - end >= t->every_ns,
                 TFMT ": repeat run %" PRIu64 " started %" PRIu64
                      " ns after the last ended, gap %" PRIu64,
                 TARGS(t), n, end ? at - end : 0, t->every_ns);
    }
    if (!fed && t->kind == ATAP_AT_RATE)
        FZ_CHECK(at >= t->t0 + t->after_ns + n * t->every_ns,
                 TFMT ": %" PRIu64 " runs started within %" PRIu64 " ns, period %" PRIu64, TARGS(t),
                 n + 1, at - t->t0, t->every_ns);
    if (t->until_ns && !fed)
        FZ_CHECK(at <= t->until_ns + TIME_SLACK,
                 TFMT ": a run started %" PRIu64 " ns past until_ns", TARGS(t), at - t->until_ns);
    if (out != NULL)
        FZ_CHECK(aligned_max(out), TFMT ": out %p not aligned for max_align_t", TARGS(t), out);
    atap_task self = atap_self(ctx);
    uint64_t want = atomic_load(&t->self_id);
    FZ_CHECK(self.id != 0, TFMT ": atap_self names no task", TARGS(t));
    FZ_CHECK(want == 0 || self.id == want, TFMT ": atap_self %" PRIx64 ", the handle is %" PRIx64,
             TARGS(t), self.id, want);
}

/* A lower bound on when this run's timeout began to count. */
static uint64_t run_start_floor(ftask *t)
{
    if (t->origin != O_SPAWN)
        return 0;
    if (atomic_load(&t->runs) == 1)
        return t->t0 + t->after_ns;
    if (t->kind == ATAP_REPEAT)
        return atomic_load(&t->last_end) + t->every_ns;
    return 0;
}

static int finish(ftask *t, atap_ctx *ctx, void *out, int rc)
{
    check_cancel_seen(t, ctx, "ending after");
    if (t->kind == ATAP_REPEAT)
        atomic_store(&t->last_end, now_ns());
    if (rc == 0 && t->out_size) {
        rec_fill(out, t->out_size, t->out_uid, atomic_load(&t->runs));
        atomic_fetch_add(&t->produced, 1);
    } else if (rc == 0) {
        atomic_fetch_add(&t->produced, 1);
    }
    return rc;
}

static int fz_task(atap_ctx *ctx, void *arg, void *out)
{
    ftask *t = arg;
    bool resumed = atap_resumed(ctx);

    check_cancel_seen(t, ctx, "starting after");
    if (!resumed)
        check_run_start(t, ctx, out);
    if (t->origin == O_WAITING || t->origin == O_RECV_ALL || t->origin == O_RECV_ANY)
        check_input(t, ctx);

    switch (t->fn) {
    case FN_VALUE:
        return finish(t, ctx, out, 0);
    case FN_FAIL:
        return finish(t, ctx, out, -1);
    case FN_SLEEP: {
        uint64_t s = now_ns();
        int rc = t->precise ? atap_sleep(t->work_ns) : atap_sleep_relaxed(t->work_ns);
        uint64_t e = now_ns();
        FZ_CHECK(RC_IN(rc, 0, ATAP_ECANCELLED, ATAP_ETIMEDOUT), TFMT ": atap_sleep returned %d",
                 TARGS(t), rc);
        FZ_CHECK(rc != 0 || e - s >= t->work_ns, TFMT ": atap_sleep(%" PRIu64 ") slept %" PRIu64,
                 TARGS(t), t->work_ns, e - s);
        if (rc == ATAP_ETIMEDOUT) {
            uint64_t floor = run_start_floor(t);
            FZ_CHECK(t->timeout_ns && (floor == 0 || e >= floor + t->timeout_ns),
                     TFMT ": timed out %" PRIu64 " ns before its timeout %" PRIu64, TARGS(t),
                     floor + t->timeout_ns - e, t->timeout_ns);
        }
        return finish(t, ctx, out, rc);
    }
    case FN_PARK_PIPE:
        if (resumed) {
            int why = atap_resume_reason(ctx);
            FZ_CHECK(why == ATAP_RESUME_READY || why == ATAP_RESUME_DEADLINE,
                     TFMT ": resume reason %d", TARGS(t), why);
            if (why == ATAP_RESUME_DEADLINE) {
                uint64_t at = now_ns(), from = atomic_load(&t->park_at);
                FZ_CHECK(t->work_ns != ATAP_FOREVER && at - from >= t->work_ns,
                         TFMT ": a park on a pipe resumed by its deadline %" PRIu64 " ns early",
                         TARGS(t), from + t->work_ns - at);
                return finish(t, ctx, out, 0);
            }
            if (pipe_readable())
                return finish(t, ctx, out, 0);
        }
        atomic_store(&t->park_at, now_ns());
        FZ_CHECK(atap_park_fd(ctx, G.pipe_fd[0], ATAP_READABLE, t->work_ns) == 0,
                 TFMT ": atap_park_fd refused", TARGS(t));
        return ATAP_PARKED;
    case FN_PARK_UNTIL:
        if (resumed) {
            uint64_t at = now_ns(), d = atomic_load(&t->park_deadline);
            FZ_CHECK(atap_resume_reason(ctx) == ATAP_RESUME_DEADLINE,
                     TFMT ": park_until resumed by %d", TARGS(t), atap_resume_reason(ctx));
            FZ_CHECK(at >= d, TFMT ": park_until resumed %" PRIu64 " ns early", TARGS(t), d - at);
            return finish(t, ctx, out, 0);
        }
        atomic_store(&t->park_deadline, now_ns() + t->work_ns);
        FZ_CHECK(atap_park_until(ctx, atomic_load(&t->park_deadline)) == 0,
                 TFMT ": atap_park_until refused", TARGS(t));
        return ATAP_PARKED;
    case FN_JOIN:
        run_join(t);
        return finish(t, ctx, out, 0);
    case FN_SPAWN:
        run_spawn(t);
        return finish(t, ctx, out, 0);
    default:
        return -1;
    }
}

/* ---------------------------------------------------------------------- */
/* The interpreter                                                         */
/* ---------------------------------------------------------------------- */

static const uint8_t *g_pc, *g_end;

static unsigned u8(void) { return g_pc < g_end ? *g_pc++ : 0; }

static uint64_t ms(unsigned n) { return ATAP_MS(n); }

static void step(void) { atomic_store(&g_progress, now_ns()); }

static ftask *new_task(void)
{
    if (G.ntasks >= MAX_TASKS)
        return NULL;
    ftask *t = &G.tasks[G.ntasks];
    memset(t, 0, sizeof *t);
    t->uid = G.uid_base + (uint32_t)G.ntasks;
    t->out_uid = t->uid;
    t->has_arg_free = true;
    G.ntasks++;
    return t;
}

/* The model gives a task's uid back when its spawn failed. */
static void drop_task(ftask *t)
{
    if (t->other != NULL) {
        atap_release(t->other_h);
        atomic_fetch_sub(&t->other->listeners, 1);
        t->other = NULL;
    }
    t->spawned = false;
}

static int free_slot(unsigned b)
{
    for (int i = 0; i < NH; i++)
        if (!G.hs[(b + (unsigned)i) % NH].used)
            return (int)((b + (unsigned)i) % NH);
    return -1;
}

static int used_slot(unsigned b)
{
    for (int i = 0; i < NH; i++)
        if (G.hs[(b + (unsigned)i) % NH].used)
            return (int)((b + (unsigned)i) % NH);
    return -1;
}

static void hold(int s, atap_task h, ftask *t)
{
    G.hs[s].used = true;
    G.hs[s].h = h;
    G.hs[s].t = t;
}

static void put_slot(int s)
{
    ftask *t = G.hs[s].t;
    atap_task h = G.hs[s].h;
    G.hs[s].used = false;
    atap_release(h);
    if (atomic_fetch_sub(&t->listeners, 1) == 1 && G.nstale < NH * 4) {
        G.stale[G.nstale] = h;
        G.stale_t[G.nstale++] = t;
    }
}

/* After a spawn call: checks its code against the model, holds the handle. */
static void spawned(int s, ftask *t, int rc, atap_task h, bool valid, const char *call)
{
    if (!valid) {
        FZ_CHECK(rc == ATAP_EINVAL, "%s with options that make no sense returned %d, not EINVAL",
                 call, rc);
    } else if (!G.running) {
        FZ_CHECK(rc == ATAP_ENOTINIT, "%s while stopped returned %d, not ENOTINIT", call, rc);
    } else {
        FZ_CHECK(rc == 0 || rc == -ENOMEM, "%s returned %d (%s)", call, rc, atap_strerror(rc));
    }
    if (rc != 0) {
        FZ_CHECK(h.id == 0, "%s failed with %d but left a handle", call, rc);
        drop_task(t);
        return;
    }
    FZ_CHECK(h.id != 0, "%s returned 0 and no handle", call);
    t->spawned = true;
    atomic_store(&t->listeners, 1);
    atomic_store(&t->self_id, h.id);
    hold(s, h, t);
}

/* After atap_spawn_detached: the same codes, and no handle to hold. */
static void spawned_detached(ftask *t, int rc, bool valid)
{
    if (!valid)
        FZ_CHECK(rc == ATAP_EINVAL,
                 "atap_spawn_detached with options that make no sense returned %d, not EINVAL", rc);
    else if (!G.running)
        FZ_CHECK(rc == ATAP_ENOTINIT, "atap_spawn_detached while stopped returned %d, not ENOTINIT",
                 rc);
    else
        FZ_CHECK(rc == 0 || rc == -ENOMEM, "atap_spawn_detached returned %d (%s)", rc,
                 atap_strerror(rc));
    if (rc != 0) {
        drop_task(t);
        return;
    }
    t->spawned = true;
    atomic_store(&t->listeners, 0);
}

static unsigned out_choice(unsigned b, enum fmt *fmt)
{
    switch (b % 4) {
    case 0:
        *fmt = FMT_NONE;
        return 0;
    case 3:
        *fmt = FMT_REC;
        return REC_BIG;
    default:
        *fmt = FMT_REC;
        return REC_SMALL;
    }
}

/* Priority: mostly valid, now and then out of range. */
static int prio(unsigned b, bool *valid)
{
    if (b == 255) {
        *valid = false;
        return 200;
    }
    return (int)(b % 256) - 128;
}

static void set_join_other(ftask *t, unsigned b)
{
    int o = used_slot(b);
    if (o < 0) {
        t->fn = FN_VALUE;
        return;
    }
    ftask *ot = G.hs[o].t;
    int rc = atap_dup(G.hs[o].h, &t->other_h);
    FZ_CHECK(rc == 0, "atap_dup of a held handle returned %d", rc);
    atomic_fetch_add(&ot->listeners, 1);
    t->other = ot;
    t->join_mode = (int)(b % 4);
    t->work_ns = ms(b % 16);
}

static void fn_setup(ftask *t, unsigned fb, unsigned ab)
{
    t->fn = (enum fn_kind)(fb % FN_KINDS);
    t->precise = ab & 1;
    switch (t->fn) {
    case FN_SLEEP:
        t->work_ns = ATAP_US(100) * (ab % 64);
        break;
    case FN_PARK_PIPE:
        t->work_ns = (ab & 2) ? ATAP_FOREVER : ms(ab % 32);
        break;
    case FN_PARK_UNTIL:
        t->work_ns = ATAP_US(250) * (ab % 64);
        break;
    case FN_SPAWN:
        t->work_ns = ab;
        break;
    case FN_JOIN:
        set_join_other(t, ab);
        break;
    default:
        break;
    }
}

/* detached: atap_spawn_detached, and the model holds no handle. */
static void op_spawn_as(bool detached)
{
    int s = free_slot(u8());
    ftask *t = new_task();
    if (s < 0 || t == NULL)
        return;
    unsigned fb = u8(), ab = u8(), ob = u8(), pb = u8(), tb = u8();
    bool valid = true;
    atap_spawn_opts o = {0};

    o.out_size = out_choice(ob, &t->fmt);
    o.out_free = (ob & 4) ? fz_out_free : NULL;
    o.arg_free = fz_arg_free;
    o.priority = prio(pb, &valid);
    o.blocking = ob & 8;
    o.after_ns = (tb & 1) ? ms(tb % 24) : 0;
    o.timeout_ns = (tb & 2) ? ms(1 + tb % 30) : 0;
    if (ob == 0x7f) { /* runs on a one-shot */
        o.runs = 2;
        valid = false;
    }
    t->origin = O_SPAWN;
    t->kind = ATAP_ONCE;
    t->once_plain = true;
    t->out_size = o.out_size;
    t->has_out_free = o.out_free != NULL && o.out_size;
    o.out_free = t->has_out_free ? o.out_free : NULL;
    t->after_ns = o.after_ns;
    t->timeout_ns = o.timeout_ns;
    fn_setup(t, fb, ab);
    t->bounded =
        t->fn != FN_PARK_PIPE || t->work_ns != ATAP_FOREVER || atomic_load(&G.pipe_written);
    t->t0 = now_ns();
    if (detached) {
        int rc = atap_spawn_detached(fz_task, t, &o);
        spawned_detached(t, rc, valid);
        return;
    }
    atap_task h = {123};
    int rc = atap_spawn(&h, fz_task, t, &o);
    spawned(s, t, rc, h, valid, "atap_spawn");
}

static void op_series(void)
{
    int s = free_slot(u8());
    ftask *t = new_task();
    if (s < 0 || t == NULL)
        return;
    unsigned kb = u8(), fb = u8(), ab = u8(), ob = u8(), lb = u8(), tb = u8();
    bool valid = true;
    atap_spawn_opts o = {0};

    o.kind = (kb & 1) ? ATAP_AT_RATE : ATAP_REPEAT;
    o.every_ns = ATAP_US(500) * (kb / 2 % 16);
    if (o.kind == ATAP_AT_RATE && o.every_ns == 0) {
        if (kb & 0x80)
            valid = false; /* a rate of nothing */
        else
            o.every_ns = ATAP_MS(1);
    }
    o.out_size = out_choice(ob, &t->fmt);
    o.out_free = (ob & 4) && o.out_size ? fz_out_free : NULL;
    o.arg_free = fz_arg_free;
    o.blocking = ob & 8;
    o.priority = prio(ob ^ tb, &valid);
    o.runs = lb % 6;
    switch (lb / 8 % 4) {
    case 1:
        o.for_ns = ms(lb / 32 * 4);
        break;
    case 2:
        o.until_ns = now_ns() + ms(lb / 32 * 4) - ms(2);
        break;
    case 3:
        if (lb & 0x80) { /* two deadlines */
            o.for_ns = ms(5);
            o.until_ns = now_ns() + ms(5);
            valid = false;
        }
        break;
    default:
        break;
    }
    o.after_ns = (tb & 1) ? ms(tb % 16) : 0;
    o.timeout_ns = (tb & 2) ? ms(1 + tb % 30) : 0;
    t->origin = O_SPAWN;
    t->kind = o.kind;
    t->out_size = o.out_size;
    t->has_out_free = o.out_free != NULL;
    t->after_ns = o.after_ns;
    t->timeout_ns = o.timeout_ns;
    t->every_ns = o.every_ns;
    t->until_ns = o.until_ns;
    t->runs_limit = o.runs;
    /* At a rate runs overlap: no parks (their state is the task's), and
     * work shorter than the period. */
    static const enum fn_kind rate_fns[] = {FN_VALUE, FN_SLEEP, FN_FAIL, FN_JOIN, FN_SPAWN};
    if (o.kind == ATAP_AT_RATE)
        fb = rate_fns[fb % 5];
    else if (fb % FN_KINDS == FN_PARK_PIPE)
        fb = FN_PARK_UNTIL;
    fn_setup(t, fb, ab);
    if (o.kind == ATAP_AT_RATE && t->fn == FN_SLEEP && o.every_ns && t->work_ns >= o.every_ns)
        t->work_ns = o.every_ns / 2;
    t->bounded = o.runs || o.for_ns || o.until_ns;
    t->t0 = now_ns();
    if (getenv("FUZZ_TRACE"))
        fprintf(stderr,
                "series uid %u kind %d every %" PRIu64 " runs %u for %" PRIu64 " until %+" PRId64
                " after %" PRIu64 " timeout %" PRIu64 " fn %d work %" PRIu64
                " blocking %d prio %d\n",
                t->uid, (int)o.kind, o.every_ns, o.runs, o.for_ns,
                o.until_ns ? (int64_t)(o.until_ns - t->t0) : 0, o.after_ns, o.timeout_ns,
                (int)t->fn, t->work_ns, o.blocking, o.priority);
    atap_task h = {0};
    int rc = atap_spawn(&h, fz_task, t, &o);
    spawned(s, t, rc, h, valid, "atap_spawn (series)");
}

static void op_waiting(void)
{
    int s = free_slot(u8());
    ftask *t = new_task();
    if (s < 0 || t == NULL)
        return;
    unsigned kb = u8(), fb = u8(), ab = u8(), ob = u8();
    atap_spawn_opts o = {0};

    o.kind = (atap_kind)(kb % 3);
    if (o.kind != ATAP_ONCE) {
        o.every_ns = ATAP_US(500) * (1 + kb / 4 % 8);
        o.runs = 1 + kb / 32 % 3;
    }
    o.gives = ab % 4;
    o.out_size = out_choice(ob, &t->fmt);
    o.out_free = (ob & 4) && o.out_size ? fz_out_free : NULL;
    o.in_free = (ob & 16) ? fz_in_free : NULL;
    o.arg_free = fz_arg_free;
    o.blocking = ob & 8;
    o.after_ns = (ob & 32) ? ms(ab % 8) : 0;
    o.timeout_ns = (ob & 64) ? ms(5 + ab % 30) : 0;
    t->origin = O_WAITING;
    t->kind = o.kind;
    t->in_size = (kb & 0x80) ? REC_BIG : REC_SMALL;
    t->out_size = o.out_size;
    t->has_out_free = o.out_free != NULL;
    t->has_in_free = o.in_free != NULL;
    t->after_ns = o.after_ns;
    t->timeout_ns = o.timeout_ns;
    t->every_ns = o.every_ns;
    t->gives_limit = o.gives;
    static const enum fn_kind fns[] = {FN_VALUE, FN_SLEEP, FN_FAIL};
    fn_setup(t, fns[fb % 3], ab);
    t->t0 = now_ns();
    atap_task h = {0};
    int rc = atap_spawn_waiting(&h, fz_task, t, t->in_size, &o);
    spawned(s, t, rc, h, true, "atap_spawn_waiting");
}

static void op_receive(void)
{
    int s = free_slot(u8());
    unsigned kb = u8(), nb = u8(), fb = u8(), ob = u8();
    ftask *t;
    if (s < 0)
        return;
    bool any = kb & 1;
    atap_task from[4];
    int mslot[4];
    size_t n = 0, need = 1 + nb % 4, in = 0;
    for (unsigned i = 0; i < NH && n < need; i++) {
        int m = (int)((nb / 4 + i) % NH);
        ftask *mt = G.hs[m].t;
        if (!G.hs[m].used || mt->fmt != FMT_REC)
            continue;
        mslot[n] = m;
        from[n++] = G.hs[m].h;
    }
    if (n == 0 || (t = new_task()) == NULL)
        return;
    /* receive_any: every member's out_size must be the same; keep those
     * that match the first. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        ftask *mt = G.hs[mslot[i]].t;
        if (any && k > 0 && mt->out_size != t->member_size[0])
            continue;
        from[k] = from[i];
        t->member_uid[k] = mt->out_uid;
        t->member_size[k] = mt->out_size;
        k++;
        in += mt->out_size;
    }
    n = k;
    t->nmembers = n;
    atap_spawn_opts o = {0};
    o.kind = (kb & 2) ? ATAP_REPEAT : ATAP_ONCE;
    o.runs = o.kind == ATAP_REPEAT ? 1 + kb / 4 % 3 : 0;
    o.gives = kb / 16 % 3;
    o.out_size = out_choice(ob, &t->fmt);
    o.out_free = (ob & 4) && o.out_size ? fz_out_free : NULL;
    o.arg_free = fz_arg_free;
    o.blocking = ob & 8;
    t->origin = any ? O_RECV_ANY : O_RECV_ALL;
    t->kind = o.kind;
    t->in_size = any ? t->member_size[0] : in;
    t->out_size = o.out_size;
    t->has_out_free = o.out_free != NULL;
    t->runs_limit = o.runs;
    static const enum fn_kind fns[] = {FN_VALUE, FN_SLEEP, FN_FAIL};
    fn_setup(t, fns[fb % 3], fb / 4);
    t->t0 = now_ns();
    atap_task h = {0};
    int rc = any ? atap_receive_any(&h, fz_task, t, from, n, &o)
                 : atap_receive_all(&h, fz_task, t, from, n, &o);
    spawned(s, t, rc, h, true, any ? "atap_receive_any" : "atap_receive_all");
}

static void op_forward(void)
{
    int a = used_slot(u8()), b = used_slot(u8());
    if (a < 0 || b < 0)
        return;
    ftask *from = G.hs[a].t, *to = G.hs[b].t;
    /* Forwards only go to a later task: a cycle (a task forwarding into
     * itself, or round a loop) is a program that never ends, and a shutdown
     * rightly waits for it forever once its handles are gone. */
    if (from->fmt != FMT_REC || from->uid >= to->uid)
        return;
    bool valid = to->origin == O_WAITING && to->in_size == from->out_size;
    int nf = atomic_load(&to->nfwd);
    if (valid) {
        if (nf >= MAX_FWD)
            return;
        to->fwd_uid[nf] = from->out_uid;
        atomic_store(&to->nfwd, nf + 1); /* before the call: the runs accept it */
    }
    int rc = atap_forward(G.hs[a].h, G.hs[b].h);
    if (!valid)
        FZ_CHECK(rc == ATAP_EINVAL, "atap_forward into a task that cannot take it returned %d", rc);
    else
        FZ_CHECK(
            RC_IN(rc, 0, ATAP_EFINISHED, ATAP_ECANCELLED, ATAP_ETIMEDOUT, ATAP_EFAILED, -ENOMEM),
            "atap_forward " TFMT " -> " TFMT " returned %d (%s)", TARGS(from), TARGS(to), rc,
            atap_strerror(rc));
}

static void op_sleep_task(void)
{
    int s = free_slot(u8());
    ftask *t = new_task();
    if (s < 0 || t == NULL)
        return;
    unsigned nb = u8(), ob = u8();
    atap_spawn_opts o = {0};
    o.out_size = (ob & 1) ? 8 : 0;
    o.after_ns = (ob & 2) ? ms(ob % 8) : 0;
    o.timeout_ns = (ob & 4) ? ms(1 + ob % 20) : 0;
    o.priority = (int)(nb % 16) - 8;
    t->origin = O_SLEEP;
    t->kind = ATAP_ONCE;
    t->once_plain = true;
    t->fmt = FMT_U64;
    t->out_size = 8;
    t->has_arg_free = false;
    t->work_ns = ATAP_US(250) * (nb % 64);
    t->precise = nb & 0x40;
    t->after_ns = o.after_ns;
    t->timeout_ns = o.timeout_ns;
    t->bounded = true;
    t->t0 = now_ns();
    atap_task h = {0};
    int rc = atap_spawn_sleep(&h, t->work_ns, t->precise, (ob & 8) ? NULL : &o);
    if ((ob & 8)) {
        t->after_ns = t->timeout_ns = 0;
    }
    spawned(s, t, rc, h, true, "atap_spawn_sleep");
}

static void chan_value(uint64_t serial, void *v) { rec_fill(v, REC_SMALL, G.chan_uid, serial); }

static void op_chan(void)
{
    unsigned sub = u8(), b = u8();
    alignas(max_align_t) unsigned char v[REC_SMALL];

    switch (sub % 6) {
    case 0: { /* a send from here */
        if (!G.chan_sender || G.elem_next >= MAX_ELEMS)
            return;
        uint64_t e = G.elem_next++;
        chan_value(e, v);
        int rc = atap_chan_send(G.chan, v);
        FZ_CHECK(RC_IN(rc, 0, ATAP_ECLOSED, ATAP_ENOTREADY, -ENOMEM), "atap_chan_send returned %d",
                 rc);
        FZ_CHECK(rc != ATAP_ENOTREADY || G.chan_cap, "an unbounded channel said full");
        if (rc == 0 || rc == ATAP_ECLOSED)
            atomic_store(&G.elem_sent[e], 1);
        return;
    }
    case 1:
    case 2: { /* a send task, a receive task */
        bool send = sub % 6 == 1;
        int s = free_slot(b);
        ftask *t;
        if (s < 0 || (send ? !G.chan_sender : !G.chan_receiver) || G.elem_next >= MAX_ELEMS ||
            (t = new_task()) == NULL)
            return;
        atap_spawn_opts o = {0};
        o.priority = (int)(b % 8) - 4;
        o.after_ns = (b & 8) ? ms(b % 5) : 0;
        o.timeout_ns = (b & 16) ? ms(2 + b % 40) : 0;
        t->kind = ATAP_ONCE;
        t->once_plain = true;
        t->has_arg_free = false;
        t->after_ns = o.after_ns;
        t->timeout_ns = o.timeout_ns;
        t->t0 = now_ns();
        atap_task h = {0};
        int rc;
        if (send) {
            uint64_t e = G.elem_next++;
            chan_value(e, v);
            t->origin = O_CHAN_SEND;
            t->fmt = FMT_NONE;
            t->bounded = G.chan_cap == 0;
            rc = atap_chan_spawn_send(&h, G.chan, v, &o);
            if (rc == 0)
                atomic_store(&G.elem_sent[e], 1);
        } else {
            t->origin = O_CHAN_RECV;
            t->fmt = FMT_REC;
            t->out_size = REC_SMALL;
            t->out_uid = G.chan_uid;
            if (b & 32)
                o.out_size = REC_SMALL;
            rc = atap_chan_spawn_recv(&h, G.chan, &o);
        }
        spawned(s, t, rc, h, true, send ? "atap_chan_spawn_send" : "atap_chan_spawn_recv");
        return;
    }
    case 3: /* this program's sender end goes */
        if (G.chan_sender && (b & 3) == 0) {
            atap_chan_close_sender(G.chan);
            G.chan_sender = false;
        }
        return;
    case 4: /* and its receiver end */
        if (G.chan_receiver && (b & 7) == 0 && G.chan_sender) {
            atap_chan_close_receiver(G.chan);
            G.chan_receiver = false;
        }
        return;
    default:
        if (G.chan_sender || G.chan_receiver)
            FZ_CHECK(atap_chan_len(G.chan) <= G.elem_next,
                     "atap_chan_len %zu > values sent %" PRIu64, atap_chan_len(G.chan),
                     G.elem_next);
        return;
    }
}

/* Checks an output read through a handle. */
static void check_output(ftask *t, const unsigned char *buf, bool take)
{
    uint32_t uid;
    uint64_t serial;

    if (t->fmt == FMT_U64) {
        uint64_t slept;
        memcpy(&slept, buf, 8);
        FZ_CHECK(slept >= t->work_ns, TFMT ": a sleep task says it slept %" PRIu64 " of %" PRIu64,
                 TARGS(t), slept, t->work_ns);
        /* after_ns counts in the sleep (atap.h) */
        uint64_t least = t->work_ns > t->after_ns ? t->work_ns : t->after_ns;
        FZ_CHECK(now_ns() - t->t0 >= least,
                 TFMT ": a sleep task settled %" PRIu64 " ns after its spawn, before %" PRIu64,
                 TARGS(t), now_ns() - t->t0, least);
        return;
    }
    if (t->fmt != FMT_REC)
        return;
    FZ_CHECK(rec_read(buf, t->out_size, &uid, &serial) && uid == t->out_uid,
             TFMT ": read an output that is torn or another task's (uid %u)", TARGS(t), uid);
    if (t->origin == O_CHAN_RECV) {
        FZ_CHECK(serial < G.elem_next && atomic_load(&G.elem_sent[serial]),
                 TFMT ": received value %" PRIu64 " was never sent", TARGS(t), serial);
        if (take) {
            int n = atomic_fetch_add(&G.elem_gone[serial], 1) + 1;
            FZ_CHECK(n == 1, "channel value %" PRIu64 " taken or freed %d times", serial, n);
        }
    } else {
        FZ_CHECK(serial >= 1 && serial <= atomic_load(&t->runs),
                 TFMT ": output of run %" PRIu64 ", only %" PRIu64 " started", TARGS(t), serial,
                 (uint64_t)atomic_load(&t->runs));
    }
    if (t->once_plain && t->origin != O_CHAN_RECV) {
        if (t->sticky && t->sticky_rc == 0)
            FZ_CHECK(serial == t->sticky_serial, TFMT ": a one-shot's output changed", TARGS(t));
        t->sticky_serial = serial;
    }
}

/* A settled one-shot's result never changes (but for a take). */
static void check_sticky(ftask *t, int rc, const char *call)
{
    if (!t->once_plain)
        return;
    if (rc == ATAP_ENOTREADY) {
        FZ_CHECK(!t->sticky, TFMT ": %s says not ready after it settled with %d", TARGS(t), call,
                 t->sticky_rc);
        return;
    }
    if (rc == ATAP_EINVAL || rc == ATAP_ETAKEN || rc == ATAP_ELIMIT)
        return;
    if (t->sticky) {
        FZ_CHECK(rc == t->sticky_rc, TFMT ": %s returned %d, it settled with %d", TARGS(t), call,
                 rc, t->sticky_rc);
    } else {
        t->sticky = true;
        t->sticky_rc = rc;
    }
}

static void op_read(bool take)
{
    int s = used_slot(u8());
    unsigned mb = u8();
    if (s < 0)
        return;
    ftask *t = G.hs[s].t;
    alignas(max_align_t) unsigned char buf[REC_BIG + 16];
    size_t size = t->out_size;
    bool wrong = mb == 0xff;
    if (wrong)
        size += 8;
    int mode = (int)(mb % 3), rc;
    if (mode == 0 && !t->bounded)
        mode = 1;
    uint64_t tmo = ms(mb / 4 % 12);
    memset(buf, 0xa5, sizeof buf);
    void *out = size ? buf : NULL;
    note_call(take ? "a take" : "a join", t);
    const char *call;
    if (take) {
        call = mode == 0 ? "atap_take" : mode == 1 ? "atap_take_for" : "atap_try_take";
        rc = mode == 0   ? atap_take(G.hs[s].h, out, size)
             : mode == 1 ? atap_take_for(G.hs[s].h, out, size, tmo)
                         : atap_try_take(G.hs[s].h, out, size);
    } else {
        call = mode == 0 ? "atap_join" : mode == 1 ? "atap_join_for" : "atap_try_join";
        rc = mode == 0   ? atap_join(G.hs[s].h, out, size)
             : mode == 1 ? atap_join_for(G.hs[s].h, out, size, tmo)
                         : atap_try_join(G.hs[s].h, out, size);
    }
    step();
    FZ_CHECK(RC_IN(rc, READ_CODES, ATAP_ENOTREADY), TFMT ": %s returned %d (%s)", TARGS(t), call,
             rc, atap_strerror(rc));
    FZ_CHECK(!wrong || rc == ATAP_EINVAL || rc == ATAP_ENOTASK,
             TFMT ": %s with a wrong size returned %d", TARGS(t), call, rc);
    FZ_CHECK(wrong || rc != ATAP_EINVAL, TFMT ": %s returned EINVAL", TARGS(t), call);
    FZ_CHECK(rc != ATAP_ENOTASK, TFMT ": %s on a held handle returned ENOTASK", TARGS(t), call);
    FZ_CHECK(mode != 0 || rc != ATAP_ENOTREADY, TFMT ": %s returned ENOTREADY", TARGS(t), call);
    if (t->once_plain && t->take_done)
        FZ_CHECK(rc == ATAP_ETAKEN || rc == ATAP_EINVAL, TFMT ": %s after a take returned %d",
                 TARGS(t), call, rc);
    if (rc == ATAP_ETAKEN && t->once_plain)
        FZ_CHECK(t->take_done, TFMT ": %s says taken; nobody took it", TARGS(t), call);
    if (rc == 0)
        check_output(t, buf, take);
    check_sticky(t, rc, call);
    if (rc == 0 && take) {
        t->take_done = true;
        if (t->has_out_free)
            atomic_fetch_add(&t->taken, 1);
    }
}

static bool settled_state(int st) { return st >= ATAP_READY && st <= ATAP_TIMED_OUT; }

/* States move forward; a terminal one sticks. */
static void check_state(ftask *t, int st, const char *call)
{
    FZ_CHECK(st >= ATAP_PENDING && st <= ATAP_WAITING, TFMT ": %s gave state %d", TARGS(t), call,
             st);
    int last = t->last_state;
    bool terminal = last == ATAP_CANCELLED || last == ATAP_FAILED || last == ATAP_TIMED_OUT;
    if (terminal)
        FZ_CHECK(st == last, TFMT ": %s: state %d after %d", TARGS(t), call, st, last);
    if (t->once_plain && last) {
        /* WAITING (8): parked, as RUNNING (resumed, it runs again) */
        static const int rank[] = {0, 0, 1, 2, 3, 4, 4, 4, 1};
        FZ_CHECK(rank[st] >= rank[last], TFMT ": %s: state %d after %d", TARGS(t), call, st, last);
        FZ_CHECK(!(last == ATAP_READY &&
                   (st == ATAP_CANCELLED || st == ATAP_TIMED_OUT || st == ATAP_FAILED)),
                 TFMT ": %s: a ready one-shot became %d", TARGS(t), call, st);
    }
    t->last_state = st;
}

static void op_wait(void)
{
    int s = used_slot(u8());
    if (s < 0)
        return;
    ftask *t = G.hs[s].t;
    if (!t->bounded)
        return;
    atap_state st = 0;
    note_call("atap_wait", t);
    int rc = atap_wait(G.hs[s].h, &st);
    step();
    FZ_CHECK(rc == 0, TFMT ": atap_wait returned %d", TARGS(t), rc);
    FZ_CHECK(settled_state((int)st), TFMT ": atap_wait settled with state %d", TARGS(t), (int)st);
    if (t->once_plain)
        check_state(t, (int)st, "atap_wait");
}

static void note_cancel(ftask *t)
{
    atomic_store(&t->cancel_done, 1);
    t->bounded = true;
}

static void op_cancel(void)
{
    int s = used_slot(u8());
    if (s < 0)
        return;
    ftask *t = G.hs[s].t;
    int rc = atap_cancel(G.hs[s].h);
    FZ_CHECK(rc == 0, TFMT ": atap_cancel returned %d", TARGS(t), rc);
    note_cancel(t);
}

static void op_dup(void)
{
    int s = used_slot(u8()), d = free_slot(u8());
    if (s < 0 || d < 0)
        return;
    atap_task c = {77};
    int rc = atap_dup(G.hs[s].h, &c);
    FZ_CHECK(rc == 0 && c.id == G.hs[s].h.id, "atap_dup of a held handle returned %d", rc);
    atomic_fetch_add(&G.hs[s].t->listeners, 1);
    hold(d, c, G.hs[s].t);
}

static void op_release(void)
{
    int s = used_slot(u8());
    if (s >= 0)
        put_slot(s);
}

static void op_give(void)
{
    int s = used_slot(u8());
    unsigned b = u8();
    if (s < 0)
        return;
    ftask *t = G.hs[s].t;
    alignas(max_align_t) unsigned char v[REC_BIG];
    size_t size = t->in_size && t->in_size <= REC_BIG ? t->in_size : REC_SMALL;
    bool valid = t->origin == O_WAITING && b != 0xff;
    if (b == 0xff)
        size = size == REC_SMALL ? REC_BIG : REC_SMALL;
    rec_fill(v, size, t->uid, ++G.give_next);
    int rc = atap_give(G.hs[s].h, v, size);
    if (!valid)
        FZ_CHECK(rc == ATAP_EINVAL, TFMT ": a give it cannot take returned %d", TARGS(t), rc);
    else if (!G.running)
        FZ_CHECK(rc == ATAP_ENOTINIT, TFMT ": a give while stopped returned %d", TARGS(t), rc);
    else
        FZ_CHECK(
            RC_IN(rc, 0, ATAP_EFINISHED, ATAP_ECANCELLED, ATAP_ETIMEDOUT, ATAP_EFAILED, -ENOMEM),
            TFMT ": atap_give returned %d (%s)", TARGS(t), rc, atap_strerror(rc));
    if (t->has_in_free && rc != ATAP_EINVAL && rc != ATAP_ENOTASK && rc != -ENOMEM)
        t->in_free_owed++;
    if (rc == 0 && t->once_plain)
        t->sticky = false;
}

static void op_query(void)
{
    int s = used_slot(u8());
    if (s < 0)
        return;
    ftask *t = G.hs[s].t;
    bool fin = atap_finished(G.hs[s].h);
    atap_state st = atap_state_of(G.hs[s].h);
    check_state(t, (int)st, "atap_state_of");
    if (t->finished_seen)
        FZ_CHECK(fin, TFMT ": atap_finished went back to false", TARGS(t));
    if (fin && t->once_plain)
        FZ_CHECK(settled_state((int)atap_state_of(G.hs[s].h)), TFMT ": finished but not settled",
                 TARGS(t));
    t->finished_seen = t->finished_seen || fin;
}

static int pick_distinct(int *slots, int want, unsigned b)
{
    int n = 0;
    for (int i = 0; i < NH && n < want; i++) {
        int s = (int)((b + (unsigned)i * 5u) % NH);
        if (G.hs[s].used)
            slots[n++] = s;
    }
    return n;
}

static void op_join_first(void)
{
    unsigned b = u8(), pb = u8();
    int slots[4];
    int n = pick_distinct(slots, 1 + (int)(b % 4), b / 4);
    if (n == 0)
        return;
    atap_task ts[4];
    bool any_bounded = false;
    for (int i = 0; i < n; i++) {
        ts[i] = G.hs[slots[i]].h;
        any_bounded = any_bounded || G.hs[slots[i]].t->bounded;
    }
    atap_join_policy pol = (atap_join_policy)(pb % 3);
    uint64_t tmo = any_bounded && (pb & 4) ? ATAP_FOREVER : ms(pb / 8 % 10);
    size_t w = 99;
    note_call("atap_join_first", G.hs[slots[0]].t);
    int rc = atap_join_first(ts, (size_t)n, pol, tmo, &w);
    step();
    FZ_CHECK(rc == 0 || (rc == ATAP_ENOTREADY && tmo != ATAP_FOREVER),
             "atap_join_first returned %d (%s)", rc, atap_strerror(rc));
    if (rc != 0)
        return;
    FZ_CHECK(w < (size_t)n, "atap_join_first named winner %zu of %d", w, n);
    ftask *wt = G.hs[slots[w]].t;
    if (wt->once_plain) {
        atap_state st = atap_state_of(ts[w]);
        FZ_CHECK(settled_state((int)st), TFMT ": join_first's winner is in state %d", TARGS(wt),
                 (int)st);
    }
    if (pol == ATAP_PASS_BACK)
        return;
    for (int i = 0; i < n; i++) {
        if ((size_t)i == w)
            continue;
        ftask *t = G.hs[slots[i]].t;
        if (pol == ATAP_CANCEL)
            note_cancel(t);
        G.hs[slots[i]].used = false;
        if (atomic_fetch_sub(&t->listeners, 1) == 1 && G.nstale < NH * 4) {
            G.stale[G.nstale] = ts[i];
            G.stale_t[G.nstale++] = t;
        }
    }
}

static void op_join_all(void)
{
    unsigned b = u8();
    int slots[4], n = pick_distinct(slots, 1 + (int)(b % 4), b / 4);
    if (n == 0)
        return;
    atap_task ts[4];
    size_t size = G.hs[slots[0]].t->out_size;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (G.hs[slots[i]].t->bounded)
            slots[k++] = slots[i];
    n = k;
    if (n == 0)
        return;
    for (int i = 0; i < n; i++)
        ts[i] = G.hs[slots[i]].h;
    alignas(max_align_t) static unsigned char out[4 * REC_BIG];
    int rcs[4] = {1, 1, 1, 1};
    note_call("atap_join_all", G.hs[slots[0]].t);
    int rc = atap_join_all(ts, (size_t)n, size ? out : NULL, size, rcs);
    step();
    int first = 0;
    for (int i = 0; i < n; i++) {
        ftask *t = G.hs[slots[i]].t;
        FZ_CHECK(RC_IN(rcs[i], READ_CODES), TFMT ": atap_join_all gave rcs[%d] %d", TARGS(t), i,
                 rcs[i]);
        FZ_CHECK(rcs[i] != ATAP_ENOTASK, TFMT ": join_all says a held handle has no task",
                 TARGS(t));
        FZ_CHECK((rcs[i] == ATAP_EINVAL) == (t->out_size != size),
                 TFMT ": join_all gave %d for out_size %zu, size %zu", TARGS(t), rcs[i],
                 t->out_size, size);
        if (rcs[i] == 0)
            check_output(t, out + (size_t)i * size, false);
        check_sticky(t, rcs[i], "atap_join_all");
        if (first == 0)
            first = rcs[i];
    }
    FZ_CHECK(rc == first, "atap_join_all returned %d, its first failure is %d", rc, first);
}

static void op_pipe(void)
{
    if (atomic_load(&G.pipe_written))
        return;
    char c = 'x';
    FZ_CHECK(write(G.pipe_fd[1], &c, 1) == 1, "writing the pipe");
    atomic_store(&G.pipe_written, 1);
    for (int i = 0; i < NH; i++)
        if (G.hs[i].used && G.hs[i].t->fn == FN_PARK_PIPE)
            G.hs[i].t->bounded = true;
}

static int kept_reader_task(atap_ctx *ctx, void *arg, void *out)
{
    char buf[64];
    ssize_t n;

    (void)arg, (void)out;
    while ((n = read(G.kept_fd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0)
            atomic_fetch_add(&G.kept_got, (uint64_t)n);
    FZ_CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "the kept reader read %zd (%s)", n,
             n < 0 ? strerror(errno) : "");
    FZ_CHECK(atap_park_fd(ctx, G.kept_fd[0], ATAP_READABLE, ATAP_FOREVER) == 0,
             "the kept reader's park refused");
    return ATAP_PARKED;
}

/* A reader's arg_free: the last touch of the task (a cancelled run may
 * still be reading after its join returned), so the socket may close. */
static void kept_reader_gone(void *arg)
{
    (void)arg;
    atomic_fetch_sub(&G.kept_live, 1);
}

/* Starts the kept reader if none runs (a shutdown or a thread death ended
 * the last; a refused spawn is tried again at the next call). */
static void kept_start(void)
{
    if (G.kept_reading && atap_finished(G.kept_reader)) {
        atap_release(G.kept_reader);
        G.kept_reading = false;
    }
    if (G.running && !G.kept_reading) {
        atomic_fetch_add(&G.kept_live, 1);
        G.kept_reading = atap_spawn(&G.kept_reader, kept_reader_task, &G,
                                    &(atap_spawn_opts){.arg_free = kept_reader_gone}) == 0;
        if (!G.kept_reading)
            atomic_fetch_sub(&G.kept_live, 1); /* refused: no arg_free */
    }
}

static void op_kept(void)
{
    char bytes[4] = "kept";
    size_t n = 1 + u8() % sizeof bytes;

    FZ_CHECK(write(G.kept_fd[1], bytes, n) == (ssize_t)n, "writing the kept socket");
    G.kept_sent += n;
    kept_start();
}

static void op_fault(void)
{
    unsigned sub = u8(), b = u8();
    if (!G.running)
        return;
    switch (sub % 5) {
    case 0:
        atap_inject_manager_faults(1 + b % 3);
        break;
    case 1: {
        unsigned w = b & 1, bl = (b >> 1) & 1;
        if (w + bl == 0)
            w = 1;
        atap_inject_thread_deaths(w, bl);
        g_deaths_injected += w + bl;
        G.deaths = true;
        break;
    }
    case 2:
        atap_inject_alloc_failures(1 + b % 4);
        break;
    case 3:
        atap_inject_spawn_refusals(1 + b % 2);
        break;
    default:
        atap_inject_watch_failures(1 + b % 3);
        break;
    }
}

/* Every one-shot is settled once a shutdown returns. */
static void check_all_settled(const char *when)
{
    for (int i = 0; i < NH; i++) {
        ftask *t = G.hs[i].t;
        if (!G.hs[i].used || !t->once_plain)
            continue;
        atap_state st = atap_state_of(G.hs[i].h);
        FZ_CHECK(settled_state((int)st), TFMT ": %s, state %d", TARGS(t), when, (int)st);
        check_state(t, (int)st, when);
    }
}

static void op_lifecycle(void)
{
    if (G.running) {
        snprintf(g_call, sizeof g_call, "atap_shutdown");
        int rc = atap_shutdown();
        step();
        FZ_CHECK(rc == 0, "atap_shutdown returned %d", rc);
        G.running = false;
        FZ_CHECK(!atap_initialised(), "atap_initialised after a shutdown");
        check_all_settled("after a shutdown");
        kept_start(); /* the reader was written off: its handle goes */
        return;
    }
    int rc = atap_init(NULL);
    step();
    FZ_CHECK(rc == 0 || (rc < 0 && rc > -4096), "atap_init returned %d (%s)", rc,
             atap_strerror(rc));
    G.running = rc == 0;
    FZ_CHECK(atap_initialised() == G.running, "atap_initialised says %d after init returned %d",
             atap_initialised(), rc);
    kept_start(); /* the keep outlived the shutdown: a new reader parks on it */
}

static void op_stale(void)
{
    unsigned b = u8();
    if (G.nstale == 0)
        return;
    size_t i = b % G.nstale;
    ftask *t = G.stale_t[i];
    atap_task h = G.stale[i];
    if (atomic_load(&t->listeners) != 0)
        return; /* a task still holds a listener (a join task until its arg_free) */
    alignas(max_align_t) unsigned char buf[REC_BIG];
    int rc;
    int call = (int)(b / 16 % 6);
    switch (call) {
    case 0:
        rc = atap_try_join(h, t->out_size ? buf : NULL, t->out_size);
        break;
    case 1:
        rc = atap_join(h, t->out_size ? buf : NULL, t->out_size);
        break;
    case 2:
        rc = atap_try_take(h, t->out_size ? buf : NULL, t->out_size);
        break;
    case 3:
        rc = atap_cancel(h);
        break;
    case 4: {
        atap_task c = {5};
        rc = atap_dup(h, &c);
        FZ_CHECK(rc != 0, "a dup of a stale handle made a listener");
        if (rc == 0)
            atap_release(c);
        break;
    }
    default: {
        atap_state st = 0;
        rc = atap_wait(h, &st);
        FZ_CHECK(atap_state_of(h) == ATAP_FAILED && atap_finished(h),
                 TFMT ": a stale handle's state_of / finished", TARGS(t));
        break;
    }
    }
    FZ_CHECK(rc == ATAP_ENOTASK, TFMT ": call %u on a stale handle returned %d (%s)", TARGS(t),
             b / 16 % 6, rc, atap_strerror(rc));
}

enum {
    OP_SPAWN,
    OP_SERIES,
    OP_WAITING,
    OP_RECEIVE,
    OP_FORWARD,
    OP_SLEEP_TASK,
    OP_CHAN,
    OP_JOIN,
    OP_TAKE,
    OP_WAIT,
    OP_CANCEL,
    OP_DUP,
    OP_RELEASE,
    OP_GIVE,
    OP_QUERY,
    OP_JOIN_FIRST,
    OP_JOIN_ALL,
    OP_PIPE,
    OP_FAULT,
    OP_LIFECYCLE,
    OP_PAUSE,
    OP_STALE,
    OP_SPAWN2,
    OP_GIVE2,
    OP_JOIN2,
    OP_KEPT,
    OP_DETACHED,
    OP_COUNT
};

static void run_op(unsigned op)
{
    static int trace = -1;
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    snprintf(g_call, sizeof g_call, "operation %u", op % OP_COUNT); /* note_call says more */
    if (trace) {
        const uint8_t *p = g_pc;
        fprintf(stderr, "op %d: %u [", atomic_load(&g_op), op % OP_COUNT);
        for (int i = 0; i < 8 && p + i < g_end; i++)
            fprintf(stderr, " %u", p[i]);
        fprintf(stderr, " ]\n");
    }
    switch (op % OP_COUNT) {
    case OP_SPAWN:
    case OP_SPAWN2:
        op_spawn_as(false);
        break;
    case OP_DETACHED:
        op_spawn_as(true);
        break;
    case OP_SERIES:
        op_series();
        break;
    case OP_WAITING:
        op_waiting();
        break;
    case OP_RECEIVE:
        op_receive();
        break;
    case OP_FORWARD:
        op_forward();
        break;
    case OP_SLEEP_TASK:
        op_sleep_task();
        break;
    case OP_CHAN:
        op_chan();
        break;
    case OP_JOIN:
    case OP_JOIN2:
        op_read(false);
        break;
    case OP_TAKE:
        op_read(true);
        break;
    case OP_WAIT:
        op_wait();
        break;
    case OP_CANCEL:
        op_cancel();
        break;
    case OP_DUP:
        op_dup();
        break;
    case OP_RELEASE:
        op_release();
        break;
    case OP_GIVE:
    case OP_GIVE2:
        op_give();
        break;
    case OP_QUERY:
        op_query();
        break;
    case OP_JOIN_FIRST:
        op_join_first();
        break;
    case OP_JOIN_ALL:
        op_join_all();
        break;
    case OP_PIPE:
        op_pipe();
        break;
    case OP_KEPT:
        op_kept();
        break;
    case OP_FAULT:
        op_fault();
        break;
    case OP_LIFECYCLE:
        op_lifecycle();
        break;
    case OP_PAUSE:
        sleep_ns(ATAP_US(250) * (u8() % 32));
        break;
    default:
        op_stale();
        break;
    }
}

/* ---------------------------------------------------------------------- */
/* A whole program                                                         */
/* ---------------------------------------------------------------------- */

static void program_begin(unsigned b)
{
    memset(G.hs, 0, sizeof G.hs);
    G.ntasks = 0;
    G.nstale = 0;
    G.uid_base = atomic_fetch_add(&g_uid_next, MAX_TASKS + 1);
    G.chan_uid = G.uid_base + MAX_TASKS;
    G.elem_next = 0;
    G.give_next = 0;
    for (int i = 0; i < MAX_ELEMS; i++) {
        atomic_store(&G.elem_sent[i], 0);
        atomic_store(&G.elem_gone[i], 0);
    }
    atomic_store(&G.pipe_written, 0);
    FZ_CHECK(pipe(G.pipe_fd) == 0, "pipe: %s", strerror(errno));
    G.chan_cap = b % 4 == 0 ? 0 : b % 4;
    FZ_CHECK(atap_chan_open(&G.chan, REC_SMALL, G.chan_cap, fz_elem_free) == 0, "atap_chan_open");
    G.chan_sender = G.chan_receiver = true;
    struct atap_pool_stats ps;
    atap_pool_stats(&ps);
    G.deaths_at_start = ps.deaths;
    G.live_base = ps.live;
    G.deaths = g_deaths_injected > ps.deaths;
    int rc = atap_init(NULL);
    FZ_CHECK(rc == 0, "atap_init at a program's start returned %d (%s)", rc, atap_strerror(rc));
    G.running = true;
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, G.kept_fd) == 0,
             "socketpair: %s", strerror(errno));
    rc = atap_fd_keep(G.kept_fd[0]);
    FZ_CHECK(rc == 0, "atap_fd_keep returned %d (%s)", rc, atap_strerror(rc));
    G.kept_sent = 0;
    atomic_store(&G.kept_got, 0);
    atomic_store(&G.kept_live, 0);
    G.kept_reading = false;
    kept_start();
}

/* Waits for every held task to finish, the pipe written and what will not
 * end by itself cancelled: none may be left waiting for a wake-up. */
static void settle_all(void)
{
    op_pipe();
    for (int i = 0; i < NH; i++) {
        if (!G.hs[i].used)
            continue;
        ftask *t = G.hs[i].t;
        if (!t->bounded) {
            FZ_CHECK(atap_cancel(G.hs[i].h) == 0, TFMT ": atap_cancel", TARGS(t));
            note_cancel(t);
        }
    }
    uint64_t bound = settle_bound();
    for (int i = 0; i < NH; i++) {
        if (!G.hs[i].used)
            continue;
        ftask *t = G.hs[i].t;
        uint64_t start = now_ns();
        while (!atap_finished(G.hs[i].h)) {
            FZ_CHECK(now_ns() - start < bound,
                     TFMT ": not finished %" PRIu64
                          " s after what it waits for was there (state %d, "
                          "%" PRIu64 " runs; cancelled %d)",
                     TARGS(t), bound / ATAP_SEC(1), (int)atap_state_of(G.hs[i].h),
                     (uint64_t)atomic_load(&t->runs), atomic_load(&t->cancel_done));
            sleep_ns(ATAP_US(200));
        }
        step();
        if (t->once_plain)
            check_state(t, (int)atap_state_of(G.hs[i].h), "settled");
    }
}

static int noop_task(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    (void)arg;
    (void)out;
    return 0;
}

/* Thread deaths still owed would fall on the next program and leave it
 * with frames lost too: threads are made to pass their checks (a task on
 * each kind of thread) until every death owed has happened, for a while. */
static void drain_deaths(void)
{
    struct atap_pool_stats ps;
    uint64_t until = now_ns() + ATAP_SEC(2);

    for (;;) {
        atap_pool_stats(&ps);
        if (g_deaths_injected <= ps.deaths || now_ns() > until)
            return;
        for (int blocking = 0; blocking < 2; blocking++) {
            atap_task t;
            if (atap_spawn(&t, noop_task, NULL, &(atap_spawn_opts){.blocking = blocking}) == 0) {
                atap_join_for(t, NULL, 0, ATAP_MS(100));
                atap_release(t);
            }
        }
        sleep_ns(ATAP_MS(1));
    }
}

static void program_end(unsigned b)
{
    atap_inject_spawn_refusals(0);
    atap_inject_alloc_failures(0);
    atap_inject_watch_failures(0);
    if (!G.running) {
        int rc = atap_init(NULL);
        FZ_CHECK(rc == 0, "atap_init at a program's end returned %d (%s)", rc, atap_strerror(rc));
        G.running = true;
    }
    settle_all();
    drain_deaths();
    /* Every byte through the kept socket read; then its reader stops. */
    uint64_t bound = settle_bound(), start = now_ns();
    while (kept_start(), atomic_load(&G.kept_got) < G.kept_sent) {
        FZ_CHECK(now_ns() - start < bound,
                 "the kept reader has read %" PRIu64 " of %" PRIu64 " bytes after %" PRIu64 " s",
                 (uint64_t)atomic_load(&G.kept_got), G.kept_sent, bound / ATAP_SEC(1));
        sleep_ns(ATAP_US(200));
    }
    FZ_CHECK(atomic_load(&G.kept_got) == G.kept_sent,
             "the kept reader read %" PRIu64 " bytes, %" PRIu64 " were written",
             (uint64_t)atomic_load(&G.kept_got), G.kept_sent);
    if (G.kept_reading) {
        atap_cancel(G.kept_reader);
        atap_release(G.kept_reader);
        G.kept_reading = false;
    }
    /* (A thread death may lose a reader's frame, and its arg_free with it.) */
    for (start = now_ns(); atomic_load(&G.kept_live) > 0 && !(G.deaths && now_ns() - start > bound);
         sleep_ns(ATAP_US(200)))
        FZ_CHECK(G.deaths || now_ns() - start < bound,
                 "a kept reader still there %" PRIu64 " s after its cancel", bound / ATAP_SEC(1));
    FZ_CHECK(atap_fd_unkeep(G.kept_fd[0]) == 0, "atap_fd_unkeep");
    close(G.kept_fd[0]);
    close(G.kept_fd[1]);
    bool release_first = b & 1;
    if (release_first)
        for (int i = 0; i < NH; i++)
            if (G.hs[i].used)
                put_slot(i);
    FZ_CHECK(atap_shutdown() == 0, "atap_shutdown at the end");
    G.running = false;
    kids_release_left(); /* no task runs now: those a dead task's frame held */
    step();
    if (!release_first)
        for (int i = 0; i < NH; i++)
            if (G.hs[i].used)
                put_slot(i);
    struct atap_pool_stats ps;
    atap_pool_stats(&ps);
    bool deaths = G.deaths || ps.deaths != G.deaths_at_start || g_deaths_injected > ps.deaths;
    if (!deaths) { /* a few seconds' grace: a slot may go just after its last release */
        uint64_t until = now_ns() + ATAP_SEC(5);
        while (ps.live > G.live_base && now_ns() < until) {
            sleep_ns(ATAP_MS(1));
            atap_pool_stats(&ps);
        }
        FZ_CHECK(ps.live <= G.live_base,
                 "%zu tasks live after every handle went and a shutdown, %zu before the program",
                 ps.live, G.live_base);
    }
    /* The channel: our ends go, and every value is then accounted for. */
    if (G.chan_sender)
        atap_chan_close_sender(G.chan);
    if (G.chan_receiver)
        atap_chan_close_receiver(G.chan);
    G.chan_sender = G.chan_receiver = false;
    if (!deaths)
        for (uint64_t e = 0; e < G.elem_next; e++)
            if (atomic_load(&G.elem_sent[e]))
                FZ_CHECK(atomic_load(&G.elem_gone[e]) == 1,
                         "channel value %" PRIu64 " taken or freed %d times, not once", e,
                         atomic_load(&G.elem_gone[e]));
    for (size_t i = 0; i < G.ntasks; i++) {
        ftask *t = &G.tasks[i];
        if (!t->spawned)
            continue;
        if (t->has_arg_free && !deaths)
            FZ_CHECK(atomic_load(&t->arg_freed) == 1, TFMT ": arg_free ran %" PRIu64 " times",
                     TARGS(t), (uint64_t)atomic_load(&t->arg_freed));
        if (t->has_out_free) {
            uint64_t made = atomic_load(&t->produced),
                     gone = atomic_load(&t->taken) + atomic_load(&t->out_freed);
            FZ_CHECK(deaths ? gone <= made : gone == made,
                     TFMT ": %" PRIu64 " outputs made, %" PRIu64 " taken, %" PRIu64 " to out_free",
                     TARGS(t), made, (uint64_t)atomic_load(&t->taken),
                     (uint64_t)atomic_load(&t->out_freed));
        }
        if (t->has_in_free && !deaths)
            FZ_CHECK(atomic_load(&t->in_freed) == t->in_free_owed,
                     TFMT ": in_free ran %" PRIu64 " times for %" PRIu64 " values", TARGS(t),
                     (uint64_t)atomic_load(&t->in_freed), t->in_free_owed);
    }
    close(G.pipe_fd[0]);
    close(G.pipe_fd[1]);
}

static void run_program(const uint8_t *data, size_t size)
{
    g_prog = data;
    g_prog_len = size;
    g_pc = data;
    g_end = data + size;
    atomic_store(&g_op, -1);
    step();
    unsigned head = u8();
    program_begin(head);
    for (int n = 0; n < MAX_OPS && g_pc < g_end; n++) {
        atomic_store(&g_op, n);
        run_op(u8());
        step();
    }
    atomic_store(&g_op, MAX_OPS);
    snprintf(g_call, sizeof g_call, "the program's end (settling, releases, shutdown)");
    program_end(head >> 4);
}

/* Aborts a program that stops making progress (a hang in a call). */
static void *watchdog(void *arg)
{
    uint64_t limit = *(uint64_t *)arg;
    for (;;) {
        sleep_ns(ATAP_MS(250));
        uint64_t last = atomic_load(&g_progress);
        if (last && now_ns() - last > limit) {
            struct atap_pool_stats ps;
            struct atap_status st;
            atap_pool_stats(&ps);
            atap_status(&st);
            fprintf(stderr,
                    "fuzz_api: pool: workers %zu busy %zu blocking %zu/%zu queued %zu live %zu "
                    "aside %zu deaths %" PRIu64 "; manager alive %d healthy %d\n",
                    ps.workers, ps.busy, ps.blocking_busy, ps.blocking_threads, ps.queued, ps.live,
                    ps.aside, ps.deaths, st.manager_alive, st.healthy);
            fuzz_fail("no progress for %" PRIu64 " s: a call hangs (%s)", limit / ATAP_SEC(1),
                      g_call);
        }
    }
    return NULL;
}

static void start_watchdog(void)
{
    static uint64_t limit;
    pthread_t th;
    const char *env = getenv("FUZZ_WATCHDOG_SECONDS");
    limit = env && *env ? ATAP_SEC(strtoull(env, NULL, 10)) : settle_bound() * 2;
    if (pthread_create(&th, NULL, watchdog, &limit) == 0)
        pthread_detach(th);
}

/* ---------------------------------------------------------------------- */
/* The two front ends                                                      */
/* ---------------------------------------------------------------------- */

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    if (!started) {
        started = true;
        g_libfuzzer = true;
        start_watchdog();
    }
    run_program(data, size);
    return 0;
}
#else

static uint64_t g_programs, g_files;

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "fuzz_api: cannot open %s\n", path);
        exit(2);
    }
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    g_source = path;
    g_index = -1;
    run_program(buf, n);
    g_programs++;
    g_files++;
}

static void run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz_api: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char full[4096];
            snprintf(full, sizeof full, "%s/%s", path, names[i]->d_name);
            run_file(full);
        }
        free(names[i]);
    }
    free(names);
}

/* Program `index` under `seed`: random bytes of a random length. */
static size_t make_program(uint64_t seed, uint64_t index, uint8_t *buf, size_t cap)
{
    uint64_t s = mix64(seed ^ mix64(index));
    size_t n = 8 + (size_t)(s % (cap - 8));
    for (size_t i = 0; i < n; i++) {
        s = mix64(s);
        buf[i] = (uint8_t)(s >> 24);
    }
    return n;
}

/* A sanitizer's report ends the process without fuzz_fail: the program is
 * saved from its death callback (present only in a sanitizer build). */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void on_sanitizer_death(void)
{
    char path[256];
    snprintf(path, sizeof path, "fuzz_api-fail-%" PRIu64 "-%" PRId64 ".bin", g_seed, g_index);
    save_program(path);
    fprintf(stderr,
            "fuzz_api: sanitizer report in program %s, seed %" PRIu64 " index %" PRId64
            ", saved to %s\n",
            g_source, g_seed, g_index, path);
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: fuzz_api [--seconds S] [--seed N] [--index I] [--runs N] [--save DIR] "
        "[FILE|DIR]...\n"
        "  replays each FILE and every file in DIR, then runs random programs from\n"
        "  the seed (default: from the clock) for S seconds (default $ATAP_FUZZ_SECONDS, else 0)\n"
        "  or N programs; --index I runs program I of the seed alone; --save DIR writes\n"
        "  each random program run to DIR (to seed a corpus).\n");
    exit(2);
}

int main(int argc, char **argv)
{
    double seconds = 0;
    uint64_t seed = 0, runs = 0;
    int64_t only = -1;
    bool have_seed = false;
    const char *save = NULL, *env = getenv("ATAP_FUZZ_SECONDS");

    if (env && *env)
        seconds = strtod(env, NULL);
    start_watchdog();
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(on_sanitizer_death);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            double v = strtod(argv[++i], NULL);
            if (!(env && *env))
                seconds = v; /* the environment wins: it tunes CTest's runs */
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
            have_seed = true;
        } else if (!strcmp(argv[i], "--index") && i + 1 < argc) {
            only = strtoll(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--save") && i + 1 < argc) {
            save = argv[++i];
        } else if (argv[i][0] == '-') {
            usage();
        }
    }
    uint64_t t_start = now_ns();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") || !strcmp(argv[i], "--seed") ||
            !strcmp(argv[i], "--index") || !strcmp(argv[i], "--runs") ||
            !strcmp(argv[i], "--save")) {
            i++;
            continue;
        }
        run_path(argv[i]);
    }
    uint64_t t_files = g_programs;
    if (!have_seed)
        seed = now_ns() ^ ((uint64_t)getpid() << 32);
    g_seed = seed;
    g_source = "(random)";
    static uint8_t buf[320];
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9), i = 0;
    printf("fuzz_api: seed %" PRIu64 " (replay with --seed %" PRIu64 "), %g s of random programs\n",
           seed, seed, seconds);
    fflush(stdout);
    if (only >= 0) {
        g_index = only;
        size_t n = make_program(seed, (uint64_t)only, buf, sizeof buf);
        run_program(buf, n);
        g_programs++;
    } else {
        for (; (runs && i < runs) || (!runs && now_ns() < end); i++) {
            g_index = (int64_t)i;
            size_t n = make_program(seed, i, buf, sizeof buf);
            if (save) {
                char path[4096];
                snprintf(path, sizeof path, "%s/seed-%" PRIu64 "-%" PRIu64, save, seed, i);
                g_prog = buf;
                g_prog_len = n;
                save_program(path);
            }
            run_program(buf, n);
            g_programs++;
        }
    }
    printf("fuzz_api: %" PRIu64 " programs (%" PRIu64 " files, %" PRIu64
           " random from seed %" PRIu64 ") in %.1f s, all promises kept\n",
           g_programs, t_files, g_programs - t_files, seed, (double)(now_ns() - t_start) / 1e9);
    return 0;
}
#endif

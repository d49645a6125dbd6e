/*
 * Tracing: a Chrome trace-event JSON file ({"traceEvents":[...]}, what
 * ui.perfetto.dev and chrome://tracing open) of what the runtime does.
 *
 * Off, every hook is ATAP_TRACE in trace.h: a relaxed load of
 * atap__trace_on and a branch not taken. On, a hook appends one fixed-size
 * record to its thread's current chunk; nothing is formatted and no name is
 * looked up on the hot path (the task's function is kept as a pointer and
 * named with dladdr when written).
 *
 * Buffers. Each thread that records has a record of its own (struct
 * tthread, kept for the process's life and reused after its thread ends),
 * with a lane number (the JSON "tid") and a current chunk of CHUNK_EVENTS
 * records. The thread's record has a tiny lock word that only two parties
 * ever take: its owner, to append (a CAS from 0 that nobody else holds but
 * for an instant), and a stop or a start, to take the chunk away. An owner
 * that finds it taken does not wait: the event is dropped and counted. A
 * full chunk goes on the `full` list (a Treiber push; the writer takes the
 * whole list with one exchange, so there is no ABA) and the owner mallocs a
 * fresh one, at most CHUNKS_MAX in existence: past that, events are dropped
 * and counted until the writer frees some. So a worker never waits for the
 * writer, and memory stays bounded.
 *
 * The writer is a thread of its own, started by atap_trace_start: every
 * WRITE_EVERY it writes the full chunks to the file and frees them.
 * atap_trace_stop clears atap__trace_on, joins the writer, takes every
 * thread's current chunk, writes the rest, the thread names (metadata
 * events) and the count of dropped events, and closes the file. A hook
 * that read the flag just before the stop may still append afterwards: its
 * record is older than the next trace's start and the next start throws
 * such chunks away, so it shows in no file.
 *
 * Lanes: "atap-worker N", "atap-blocking N" (N the pool's index of the
 * thread), "atap-manager", "atap-supervisor", and for any other thread its
 * own name (pthread_getname_np) or "thread".
 */
#include "trace.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atap.h"
#include "wait.h"

#define CHUNK_EVENTS 2048u
#define CHUNKS_MAX 256u /* 256 x 80 KiB: 20 MiB at most */
#define WRITE_EVERY_NS 20000000u /* 20 ms */
#define NAME_MAX_LEN 48

struct tev {
    uint64_t ts; /* atap__now_ns() */
    uint64_t id; /* task id */
    atap_fn *fn;
    uint64_t arg;
    uint16_t kind;
    uint16_t depth; /* runs open on the thread before this event */
};

struct chunk {
    struct chunk *next;
    uint32_t tid;
    uint32_t n;
    struct tev ev[CHUNK_EVENTS];
};

struct tthread {
    struct tthread *next;   /* every record ever made (push only) */
    _Atomic uint32_t lock;  /* 0 free, 1 held (owner or stopper) */
    _Atomic bool owned;     /* a live thread has it */
    uint32_t tid;           /* its lane */
    uint16_t depth;         /* runs open now (owner only) */
    struct chunk *cur;      /* under lock */
};

struct lane {
    uint32_t tid;
    char name[NAME_MAX_LEN];
};

_Atomic bool atap__trace_on;

static struct {
    pthread_mutex_t ctl;   /* start / stop, one at a time */
    pthread_mutex_t names; /* lanes[] and thread records' making */
    FILE *f;
    bool running;          /* a trace is being written (ctl) */
    bool from_env;         /* started by ATAP_TRACE (ctl) */
    bool first;            /* no event written yet (the writer's) */
    uint64_t base;         /* ts of the start */
    int pid;               /* the JSON "pid" of every event */
    pthread_t writer;
    _Atomic uint32_t stop_writer;
    _Atomic(struct chunk *) full;
    _Atomic unsigned chunks;
    _Atomic uint64_t dropped;
    _Atomic(struct tthread *) threads;
    _Atomic uint32_t next_tid;
    struct lane *lanes;
    size_t nlanes, caplanes;
} tr = {.ctl = PTHREAD_MUTEX_INITIALIZER, .names = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct tthread *self_t;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* ---- recording (any thread) ------------------------------------------- */

static void push_full(struct chunk *c)
{
    struct chunk *head = ld_relaxed(&tr.full);

    do
        c->next = head;
    while (!atomic_compare_exchange_weak_explicit(&tr.full, &head, c, memory_order_release,
                                                  memory_order_relaxed));
}

static struct chunk *new_chunk(uint32_t tid)
{
    struct chunk *c;

    if (add_relaxed(&tr.chunks, 1) >= CHUNKS_MAX) {
        sub_relaxed(&tr.chunks, 1);
        return NULL;
    }
    if (!(c = malloc(sizeof *c))) {
        sub_relaxed(&tr.chunks, 1);
        return NULL;
    }
    c->tid = tid;
    c->n = 0;
    c->next = NULL;
    return c;
}

static void free_chunk(struct chunk *c)
{
    free(c);
    sub_relaxed(&tr.chunks, 1);
}

static bool lock_try(struct tthread *t)
{
    uint32_t z = 0;

    return atomic_compare_exchange_strong_explicit(&t->lock, &z, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

/* A stop or a start: the owner holds the lock only for one append. */
static void lock_wait(struct tthread *t)
{
    unsigned spins = 0;

    while (!lock_try(t))
        spin_pause(&spins);
}

static void unlock(struct tthread *t)
{
    st_release(&t->lock, 0);
}

/* The thread is ending: its chunk goes to the writer, its record to the
 * next thread that needs one. */
static void thread_exit(void *arg)
{
    struct tthread *t = arg;

    lock_wait(t);
    if (t->cur)
        push_full(t->cur);
    t->cur = NULL;
    unlock(t);
    t->depth = 0;
    st_release(&t->owned, false);
    if (self_t == t)
        self_t = NULL;
}

static void make_key(void)
{
    (void)pthread_key_create(&exit_key, thread_exit);
}

_Thread_local const char *atap__trace_lane;
_Thread_local unsigned atap__trace_lane_no;

static void lane_name(char *buf, size_t n)
{
    if (atap__trace_lane && atap__trace_lane_no) {
        snprintf(buf, n, "%s %u", atap__trace_lane, atap__trace_lane_no - 1);
        return;
    }
    if (atap__trace_lane) {
        snprintf(buf, n, "%s", atap__trace_lane);
        return;
    }
    snprintf(buf, n, "thread");
#if defined(__linux__) || defined(__APPLE__)
    {
        char got[32] = {0};

        if (pthread_getname_np(pthread_self(), got, sizeof got) == 0 && got[0])
            snprintf(buf, n, "%s", got);
    }
#endif
}

/* This thread's record, made or reused on its first event; NULL without
 * memory. Off the hot path: once per thread. */
static __attribute__((noinline, cold)) struct tthread *thread_record(void)
{
    struct tthread *t;
    struct lane *l;

    pthread_once(&key_once, make_key);
    for (t = ld_acquire(&tr.threads); t; t = t->next) {
        bool no = false;

        if (!ld_relaxed(&t->owned) &&
            atomic_compare_exchange_strong_explicit(&t->owned, &no, true, memory_order_acquire,
                                                    memory_order_relaxed))
            break;
    }
    if (!t) {
        if (!(t = calloc(1, sizeof *t)))
            return NULL;
        st_relaxed(&t->owned, true);
        t->next = ld_relaxed(&tr.threads);
        while (!atomic_compare_exchange_weak_explicit(&tr.threads, &t->next, t,
                                                      memory_order_release, memory_order_relaxed))
            ;
    }
    t->tid = add_relaxed(&tr.next_tid, 1) + 1; /* a new lane for a new thread */
    t->depth = 0;
    pthread_mutex_lock(&tr.names);
    if (tr.nlanes == tr.caplanes) {
        size_t cap = tr.caplanes ? 2 * tr.caplanes : 64;

        if ((l = realloc(tr.lanes, cap * sizeof *l)) != NULL) {
            tr.lanes = l;
            tr.caplanes = cap;
        }
    }
    if (tr.nlanes < tr.caplanes) {
        l = &tr.lanes[tr.nlanes++];
        l->tid = t->tid;
        lane_name(l->name, sizeof l->name);
    }
    pthread_mutex_unlock(&tr.names);
    self_t = t;
    pthread_setspecific(exit_key, t);
    return t;
}

void atap__trace_event(unsigned kind, uint64_t id, atap_fn *fn, uint64_t arg)
{
    struct tthread *t = self_t;
    struct chunk *c;
    struct tev *e;

    if (unlikely(!t) && !(t = thread_record())) {
        add_relaxed(&tr.dropped, 1);
        return;
    }
    if (!lock_try(t)) { /* a stop or a start has it: never wait */
        add_relaxed(&tr.dropped, 1);
        return;
    }
    if (!(c = t->cur) || c->n == CHUNK_EVENTS) {
        if (c)
            push_full(c);
        if (!(t->cur = c = new_chunk(t->tid))) {
            unlock(t);
            add_relaxed(&tr.dropped, 1);
            return;
        }
    }
    e = &c->ev[c->n++];
    e->ts = atap__now_ns();
    e->id = id;
    e->fn = fn;
    e->arg = arg;
    e->kind = (uint16_t)kind;
    e->depth = t->depth;
    if (kind == TR_RUN_BEGIN)
        t->depth++;
    else if (kind == TR_RUN_END && t->depth)
        t->depth--;
    unlock(t);
}

/* ---- writing (the writer thread, then the stop) ------------------------- */

#define FN_CACHE 512u

static struct {
    atap_fn *fn;
    char name[96];
} fn_cache[FN_CACHE];

/* JSON string contents: quotes, backslashes and control characters escaped. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* The function's name where dladdr can say (an exported symbol: in an
 * executable, one linked with -rdynamic), else its object and offset,
 * else its address. */
static const char *fn_name(atap_fn *fn)
{
    size_t slot = ((uintptr_t)fn >> 4) % FN_CACHE;
    void *addr;
    Dl_info info;

    if (!fn)
        return "";
    if (fn_cache[slot].fn == fn)
        return fn_cache[slot].name;
    memcpy(&addr, &fn, sizeof addr);
    fn_cache[slot].fn = fn;
    if (dladdr(addr, &info) && info.dli_sname && info.dli_saddr == addr) {
        snprintf(fn_cache[slot].name, sizeof fn_cache[slot].name, "%s", info.dli_sname);
    } else if (info.dli_fname && info.dli_fbase) {
        const char *base = strrchr(info.dli_fname, '/');

        snprintf(fn_cache[slot].name, sizeof fn_cache[slot].name, "%s+0x%zx",
                 base ? base + 1 : info.dli_fname,
                 (size_t)((uintptr_t)addr - (uintptr_t)info.dli_fbase));
    } else {
        snprintf(fn_cache[slot].name, sizeof fn_cache[slot].name, "%p", addr);
    }
    return fn_cache[slot].name;
}

static void begin_event(FILE *f)
{
    if (!tr.first)
        fputs(",\n", f);
    tr.first = false;
}

/* One instant (thread scope), with the task's id and, if any, its
 * function and a number. */
static void instant(FILE *f, const char *name, double us, uint32_t tid, const struct tev *e,
                    const char *argname)
{
    begin_event(f);
    fprintf(f, "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%d,\"tid\":%u,"
               "\"args\":{",
            name, us, tr.pid, tid);
    if (e->id)
        fprintf(f, "\"task\":\"0x%llx\"", (unsigned long long)e->id);
    if (e->fn) {
        fputs(",\"fn\":\"", f);
        put_escaped(f, fn_name(e->fn));
        fputc('"', f);
    }
    if (argname)
        fprintf(f, "%s\"%s\":%lld", e->id || e->fn ? "," : "", argname, (long long)e->arg);
    fputs("}}", f);
}

/* The start of a flow (an arrow) named name, from this point of the
 * thread's lane. Outside any run there is no slice for it to leave from,
 * so it gets one of its own, 1 ns long, named after it. */
static void flow_start(FILE *f, const char *name, double us, uint32_t tid, const struct tev *e)
{
    if (e->depth == 0) {
        begin_event(f);
        fprintf(f, "{\"name\":\"%s\",\"cat\":\"atap\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":0.001,"
                   "\"pid\":%d,\"tid\":%u,\"args\":{\"task\":\"0x%llx\"}}",
                name, us, tr.pid, tid, (unsigned long long)e->id);
    }
    begin_event(f);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"s\",\"id\":\"0x%llx\",\"ts\":%.3f,"
               "\"pid\":%d,\"tid\":%u}",
            name, name, (unsigned long long)e->id, us, tr.pid, tid);
}

static void flow_end(FILE *f, const char *name, double us, uint32_t tid, const struct tev *e)
{
    begin_event(f);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"f\",\"bp\":\"e\",\"id\":\"0x%llx\","
               "\"ts\":%.3f,\"pid\":%d,\"tid\":%u}",
            name, name, (unsigned long long)e->id, us, tr.pid, tid);
}

static void write_event(FILE *f, uint32_t tid, const struct tev *e)
{
    double us;
    int pid = tr.pid;

    if (e->ts < tr.base)
        return; /* recorded before this trace started */
    us = (double)(e->ts - tr.base) / 1000.0;
    switch (e->kind) {
    case TR_SPAWN:
        instant(f, "spawn", us, tid, e, NULL);
        flow_start(f, "spawn", us, tid, e);
        break;
    case TR_RUN_BEGIN:
        begin_event(f);
        fputs("{\"name\":\"", f);
        put_escaped(f, fn_name(e->fn));
        fprintf(f, "\",\"cat\":\"run\",\"ph\":\"B\",\"ts\":%.3f,\"pid\":%d,\"tid\":%u,"
                   "\"args\":{\"task\":\"0x%llx\",\"fn\":\"",
                us, pid, tid, (unsigned long long)e->id);
        put_escaped(f, fn_name(e->fn));
        fputs("\"}}", f);
        /* Arrows in: from the spawn, and (a task that waits for gives)
         * from the give that started this run. An arrow whose start is
         * not in the file (a repeat's later runs) is ignored by the
         * viewers. */
        flow_end(f, "spawn", us, tid, e);
        if (e->arg)
            flow_end(f, "give", us, tid, e);
        break;
    case TR_RUN_END:
        begin_event(f);
        fprintf(f, "{\"ph\":\"E\",\"ts\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{\"rc\":%lld}}",
                us, pid, tid, (long long)e->arg);
        break;
    case TR_PARK: instant(f, "park", us, tid, e, "kind"); break;
    case TR_RESUME: instant(f, "resume", us, tid, e, "reason"); break;
    case TR_CANCEL: instant(f, "cancel", us, tid, e, NULL); break;
    case TR_TIMEOUT: instant(f, "timeout", us, tid, e, NULL); break;
    case TR_GIVE:
        instant(f, "give", us, tid, e, NULL);
        flow_start(f, "give", us, tid, e);
        break;
    case TR_GROW: instant(f, "pool grows", us, tid, e, "workers"); break;
    case TR_MANAGER: instant(f, "manager starts", us, tid, e, "restarts"); break;
    case TR_RESTART: instant(f, "manager restart", us, tid, e, "failures"); break;
    case TR_THREAD: instant(f, "thread starts", us, tid, e, "blocking"); break;
    case TR_ASIDE: instant(f, "stack set aside", us, tid, e, "aside"); break;
    case TR_BACK: instant(f, "stack goes on", us, tid, e, "aside"); break;
    default: break;
    }
}

static void write_chunk(struct chunk *c)
{
    for (uint32_t i = 0; i < c->n; i++)
        write_event(tr.f, c->tid, &c->ev[i]);
}

/* Writes and frees the full chunks, oldest first (the list is LIFO), so a
 * thread's events stay in order. */
static void drain_full(bool write)
{
    struct chunk *c = xchg_acqrel(&tr.full, NULL), *rev = NULL, *next;

    for (; c; c = next) {
        next = c->next;
        c->next = rev;
        rev = c;
    }
    for (c = rev; c; c = next) {
        next = c->next;
        if (write)
            write_chunk(c);
        free_chunk(c);
    }
}

static void *writer_main(void *arg)
{
    (void)arg;
    while (!ld_acquire(&tr.stop_writer)) {
        drain_full(true);
        fflush(tr.f);
        atap__word_wait(&tr.stop_writer, 0, WRITE_EVERY_NS);
    }
    return NULL;
}

/* Every thread's current chunk, taken from it: written, or thrown away. */
static void take_current(bool write)
{
    for (struct tthread *t = ld_acquire(&tr.threads); t; t = t->next) {
        struct chunk *c;

        lock_wait(t);
        c = t->cur;
        t->cur = NULL;
        unlock(t);
        if (c) {
            if (write)
                write_chunk(c);
            free_chunk(c);
        }
    }
}

static void write_metadata(FILE *f, double end_us)
{
    int pid = tr.pid;

    begin_event(f);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"libatap\"}}",
            pid);
    pthread_mutex_lock(&tr.names);
    for (size_t i = 0; i < tr.nlanes; i++) {
        begin_event(f);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,"
                   "\"args\":{\"name\":\"",
                pid, tr.lanes[i].tid);
        put_escaped(f, tr.lanes[i].name);
        fputs("\"}}", f);
    }
    pthread_mutex_unlock(&tr.names);
    begin_event(f);
    fprintf(f, "{\"name\":\"dropped events\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":%d,"
               "\"tid\":0,\"args\":{\"dropped\":%llu}}",
            end_us, pid, (unsigned long long)ld_relaxed(&tr.dropped));
}

/* ---- the API -------------------------------------------------------------- */

static int start_locked(const char *path)
{
    FILE *f;
    int rc;

    if (tr.running)
        return ATAP_EALREADY;
    if (!(f = fopen(path, "w")))
        return errno ? -errno : -EIO;
    /* What a late hook left behind from an earlier trace goes first. */
    drain_full(false);
    take_current(false);
    tr.f = f;
    tr.first = true;
    st_relaxed(&tr.dropped, 0);
    st_relaxed(&tr.stop_writer, 0);
    tr.pid = (int)getpid();
    memset(fn_cache, 0, sizeof fn_cache); /* a library may have gone since */
    tr.base = atap__now_ns();
    fputs("{\"traceEvents\":[\n", f);
    if ((rc = pthread_create(&tr.writer, NULL, writer_main, NULL)) != 0) {
        fclose(f);
        (void)remove(path);
        tr.f = NULL;
        return -rc;
    }
    tr.running = true;
    tr.from_env = false;
    st_release(&atap__trace_on, true);
    return 0;
}

int atap_trace_start(const char *path)
{
    int rc;

    if (!path || !*path)
        return ATAP_EINVAL;
    pthread_mutex_lock(&tr.ctl);
    rc = start_locked(path);
    pthread_mutex_unlock(&tr.ctl);
    return rc;
}

static int stop_locked(void)
{
    int rc = 0;

    if (!tr.running)
        return ATAP_EINVAL;
    st_release(&atap__trace_on, false);
    st_release(&tr.stop_writer, 1);
    atap__word_wake(&tr.stop_writer, true);
    pthread_join(tr.writer, NULL);
    drain_full(true);
    take_current(true);
    write_metadata(tr.f, (double)(atap__now_ns() - tr.base) / 1000.0);
    fputs("\n]}\n", tr.f);
    if (ferror(tr.f))
        rc = -EIO;
    if (fclose(tr.f) != 0 && rc == 0)
        rc = errno ? -errno : -EIO;
    tr.f = NULL;
    tr.running = false;
    tr.from_env = false;
    return rc;
}

int atap_trace_stop(void)
{
    int rc;

    pthread_mutex_lock(&tr.ctl);
    rc = stop_locked();
    pthread_mutex_unlock(&tr.ctl);
    return rc;
}

int atap__trace_env_start(void)
{
    const char *path = getenv("ATAP_TRACE");
    int rc = 0;

    if (!path || !*path)
        return 0;
    pthread_mutex_lock(&tr.ctl);
    if (!tr.running && (rc = start_locked(path)) == 0)
        tr.from_env = true;
    pthread_mutex_unlock(&tr.ctl);
    return rc;
}

void atap__trace_runtime_stopped(void)
{
    pthread_mutex_lock(&tr.ctl);
    if (tr.running && tr.from_env)
        (void)stop_locked();
    pthread_mutex_unlock(&tr.ctl);
}

/* The child of a fork (its one thread): no writer came along, and the
 * other threads' records may be held by threads that do not exist here.
 * The file is the parent's: its fd is closed, its buffered bytes are not
 * written twice (the FILE is let go unflushed). */
void atap__trace_forget(void)
{
    st_relaxed(&atap__trace_on, false);
    pthread_mutex_init(&tr.ctl, NULL);
    pthread_mutex_init(&tr.names, NULL);
    if (tr.f)
        close(fileno(tr.f));
    tr.f = NULL;
    tr.running = tr.from_env = false;
    st_relaxed(&tr.full, NULL); /* the parent's chunks: let go */
    st_relaxed(&tr.chunks, 0);
    for (struct tthread *t = ld_relaxed(&tr.threads); t; t = t->next) {
        st_relaxed(&t->lock, 0);
        t->cur = NULL;
        st_relaxed(&t->owned, t == self_t);
    }
}

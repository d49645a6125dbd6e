/*
 * Tracing: a Chrome trace-event JSON file ({"traceEvents":[...]}, what
 * ui.perfetto.dev, Chrome DevTools and chrome://tracing open) of what the
 * runtime does. tests/trace_check.py checks a file against the rules of the
 * Trace Event Format relied on here, which its top comment lists.
 *
 * Off, every hook is ATAP_TRACE in trace.h: a relaxed load of
 * atap__trace_on and a branch not taken. On, a hook appends one fixed-size
 * record to its thread's current chunk; nothing is formatted and no name is
 * looked up on the hot path (the task's function is kept as a pointer and
 * named with dladdr when written).
 *
 * Buffers. Each thread that records has a record of its own (struct
 * tthread, kept for the process's life and reused after its thread ends),
 * with its lane (the JSON "tid": the OS thread id, gettid on Linux,
 * pthread_threadid_np on macOS, so a trace reads beside perf and gdb) and a
 * current chunk of CHUNK_EVENTS records. The thread's record has a tiny
 * lock word that only two parties ever take: its owner, to append (a CAS
 * from 0 that nobody else holds but for an instant), and a stop or a start,
 * to take the chunk away. An owner that finds it taken does not wait: the
 * event is dropped and counted. A full chunk goes on the `full` list (a
 * Treiber push; the writer takes the whole list with one exchange, so there
 * is no ABA) and the owner mallocs a fresh one, at most CHUNKS_MAX in
 * existence: past that, events are dropped and counted until the writer
 * frees some. So a worker never waits for the writer, and memory stays
 * bounded. A dropped event still moves its thread's count of runs open
 * (each record carries it), which is how the writer closes a slice whose
 * end was dropped.
 *
 * The writer is a thread of its own, started by atap_trace_start: every
 * WRITE_EVERY it writes the full chunks to the file and frees them.
 * atap_trace_stop clears atap__trace_on, joins the writer, takes every
 * thread's current chunk, writes the rest and the tail, and closes the
 * file. A hook that read the flag just before the stop may still append
 * afterwards: its record is older than the next trace's start and the next
 * start throws such chunks away, so it shows in no file.
 *
 * A file that opens at every moment. The writer keeps, for each lane, the
 * runs it has written a "B" for and no "E" yet. After each round it writes
 * the tail (an "E" for each run still open, named as its "B", the lanes'
 * names, the dropped count, and the closing "]}"), flushes, cuts the file
 * there and seeks back to the tail's start, which the next round writes
 * over. So the file on disk is a whole trace after every round, a program
 * that dies reads up to its last round, and no viewer's tolerance of a
 * missing "]" is relied on. A program that exits without atap_shutdown
 * writes what it traced from an atexit handler (threads of the runtime may
 * still be running then: the stop takes their chunks as it takes any, and
 * what they record after that is left out).
 *
 * Arrows. A flow event binds, in Perfetto, to the innermost slice open on
 * its thread, and in Chrome DevTools to the event of the same pid, tid, cat
 * and ts; its two ends pair by id, cat and name. So every slice and arrow
 * is of one category, "atap"; a spawn or a give is a slice of no length
 * ("X") that the arrow's start shares its ts with; the arrow's end is at
 * the ts of the run's "B". An arrow pairs one start with one end: a spawn
 * with the task's first run only (a repeat's later runs and a run after a
 * park are not a spawn's), a give with the run it started. Threads record
 * which is which (flow_tab, below) and the writer writes an arrow once it
 * has seen both ends, whichever lane it read first; an end whose other end
 * never came (a task cancelled before it ran, a give a newer one replaced)
 * is never written.
 *
 * Lanes: "atap-worker N", "atap-blocking N" (N the pool's index of the
 * thread), "atap-manager", "atap-supervisor", and for any other thread its
 * own name (pthread_getname_np) or "thread".
 *
 * fork(): the child keeps nothing of the parent's trace (trace_forget),
 * and a trace started in the child never truncates the parent's file: a
 * path another process holds a trace open on (flock) is written as
 * path.PID instead.
 */
#include "trace.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#elif defined(__FreeBSD__)
#include <pthread_np.h>
#endif

#include "atap.h"
#include "atomics.h"
#include "testing.h"
#include "wait.h"

#define CHUNK_EVENTS 2048u
#define CHUNKS_MAX 256u          /* 256 x 80 KiB: 20 MiB at most */
#define WRITE_EVERY_NS 20000000u /* 20 ms */
#define NAME_MAX_LEN 48
#define CAT "atap"               /* every slice's and arrow's category (see the top) */
#define PENDING_MAX (1u << 18)   /* arrow ends waiting for their other end */
#define PENDING_SWEEP (1u << 16) /* past this many, ends older than PENDING_AGE go */
#define PENDING_AGE_NS (10ull * 1000000000ull)

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
    uint64_t tid;
    uint32_t n;
    struct tev ev[CHUNK_EVENTS];
};

struct tthread {
    struct tthread *next;  /* every record ever made (push only) */
    _Atomic uint32_t lock; /* 0 free, 1 held (owner or stopper) */
    _Atomic bool owned;    /* a live thread has it */
    uint64_t tid;          /* its lane: the OS thread id */
    uint16_t depth;        /* runs open now (owner only) */
    struct chunk *cur;     /* under lock */
};

struct lane {
    uint64_t tid;
    char name[NAME_MAX_LEN];
};

/* The writer's view of a lane: the runs it wrote a "B" for and no "E" yet,
 * innermost last, each with the depth its thread recorded it at. */
struct open_run {
    uint64_t id;
    uint16_t level;
    char name[96]; /* its B's, so that its E reads the same whatever is renamed since */
};

/* The runs a stack had open when it was set aside: ended on the lane
 * there, begun again when it goes on (a thread's lane shows what its
 * thread runs, and meanwhile it runs other stacks). */
struct aside_runs {
    struct aside_runs *next;
    uint64_t stack; /* the stack's token, as the events carry it */
    struct open_run *runs;
    unsigned n;
};

struct wlane {
    uint64_t tid;
    struct open_run *open;
    unsigned n, cap;
    struct aside_runs *aside;
};

/* One end of an arrow the writer has seen, waiting for the other. */
struct pend {
    struct pend *next;
    uint64_t key; /* the flow's id */
    uint8_t kind; /* TR_SPAWN or TR_GIVE */
    bool has_s, has_f;
    uint64_t s_ts, f_ts, s_tid, f_tid;
};

#define PEND_BUCKETS 4096u

_Atomic bool atap__trace_on;

static struct {
    pthread_mutex_t ctl;   /* start / stop, one at a time */
    pthread_mutex_t names; /* lanes[] and thread records' making */
    FILE *f;
    bool running;  /* a trace is being written (ctl) */
    bool from_env; /* started by ATAP_TRACE (ctl) */
    bool first;    /* no event written yet (the writer's) */
    bool seekable; /* the tail can be written over (a regular file) */
    bool dirty;    /* events written since the tail was (the writer's) */
    uint64_t base; /* ts of the start */
    int pid;       /* the JSON "pid" of every event: the tracing process */
    pthread_t writer;
    _Atomic uint32_t stop_writer;
    _Atomic(struct chunk *) full;
    _Atomic unsigned chunks;
    _Atomic uint64_t dropped;
    _Atomic(struct tthread *) threads;
    struct lane *lanes;
    size_t nlanes, caplanes;
    /* The writer's (the writer thread, then the stop): */
    struct wlane *wl;
    size_t nwl, capwl;
    struct pend *pend[PEND_BUCKETS];
    size_t npend;
} tr = {.ctl = PTHREAD_MUTEX_INITIALIZER, .names = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct tthread *self_t;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

#ifdef ATAP_FAULT_INJECTION
static _Atomic bool test_drop;

void atap__test_trace_drop(bool on) { st_relaxed(&test_drop, on); }
#define DROP_FOR_TEST() ld_relaxed(&test_drop)
#else
void atap__test_trace_drop(bool on) { (void)on; }
#define DROP_FOR_TEST() false
#endif

/* ---- recording (any thread) ------------------------------------------- */

static uint64_t os_tid(void)
{
#if defined(__linux__)
    return (uint64_t)syscall(SYS_gettid);
#elif defined(__APPLE__)
    uint64_t id = 0;

    (void)pthread_threadid_np(NULL, &id);
    return id;
#elif defined(__FreeBSD__)
    return (uint64_t)pthread_getthreadid_np();
#else
    static _Atomic uint64_t next;

    return add_relaxed(&next, 1) + 1;
#endif
}

/*
 * Which run a spawn's arrow goes to, and which give a run's arrow comes
 * from, told by the threads that record them (the writer reads lanes in no
 * particular order). A slot of the table is shared by the tasks whose
 * indexes agree in their low bits:
 *   - ran: the id of the task that last began a run here. A run that finds
 *     another id is its task's first (a task's runs never overlap, and each
 *     follows the last through the runtime's own hand-over, so relaxed is
 *     enough). A task sharing the slot in between can make a later run look
 *     first: the writer pairs a spawn with one run only, so that costs at
 *     most a misplaced arrow.
 *   - gives: a count of the gives recorded here; a give is numbered by it,
 *     and a run started by gives takes the newest number (the give's hook
 *     is recorded before its value is, so the number is there before the
 *     run). A give whose number no run takes has no arrow.
 */
#define FLOW_TAB 16384u
static struct {
    _Atomic uint64_t ran;
    _Atomic uint32_t gives;
} flow_tab[FLOW_TAB];

/* A give's arrow id: the task's id and the give's number, mixed into the
 * 64 bits both viewers read an id as. */
static uint64_t give_flow_id(uint64_t task, uint32_t seq)
{
    uint64_t x = task ^ ((uint64_t)seq * UINT64_C(0x9e3779b97f4a7c15));

    x ^= x >> 31;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 29;
    return x;
}

static void push_full(struct chunk *c)
{
    struct chunk *head = ld_relaxed(&tr.full);

    do
        c->next = head;
    while (!casw_release(&tr.full, &head, c));
}

static struct chunk *new_chunk(uint64_t tid)
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

    return cas_acquire(&t->lock, &z, 1);
}

/* A stop or a start: the owner holds the lock only for one append. */
static void lock_wait(struct tthread *t)
{
    unsigned spins = 0;

    while (!lock_try(t))
        spin_pause(&spins);
}

static void unlock(struct tthread *t) { st_release(&t->lock, 0); }

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

static void make_key(void) { (void)pthread_key_create(&exit_key, thread_exit); }

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

        if (!ld_relaxed(&t->owned) && cas_acquire(&t->owned, &no, true))
            break;
    }
    if (!t) {
        if (!(t = calloc(1, sizeof *t)))
            return NULL;
        st_relaxed(&t->owned, true);
        t->next = ld_relaxed(&tr.threads);
        while (!casw_release(&tr.threads, &t->next, t))
            ;
    }
    t->tid = os_tid();
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
    uint16_t depth;

    if (unlikely(!t) && !(t = thread_record())) {
        add_relaxed(&tr.dropped, 1);
        return;
    }
    /* The count of runs open moves whether or not the event is kept. */
    depth = t->depth;
    if (kind == TR_RUN_BEGIN) {
        t->depth++;
        if (xchg_relaxed(&flow_tab[(uint32_t)id % FLOW_TAB].ran, id) != id)
            arg |= TR_FIRST_RUN;
        if (arg & TR_GATED)
            arg |= (uint64_t)ld_relaxed(&flow_tab[(uint32_t)id % FLOW_TAB].gives) << 32;
    } else if (kind == TR_RUN_END && t->depth) {
        t->depth--;
    } else if (kind == TR_GIVE) {
        arg = add_relaxed(&flow_tab[(uint32_t)id % FLOW_TAB].gives, 1) + 1;
    }
    if (DROP_FOR_TEST() || !lock_try(t)) { /* a stop or a start has it: never wait */
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
    e->depth = depth;
    unlock(t);
}

uint16_t atap__trace_depth_swap(uint16_t depth)
{
    struct tthread *t = self_t;
    uint16_t old;

    if (!t)
        return 0; /* nothing recorded on this thread: its count is 0 */
    old = t->depth;
    t->depth = depth;
    return old;
}

/* ---- writing (the writer thread, then the stop) ------------------------- */

#define FN_CACHE 512u

static struct {
    atap_fn *fn;
    char name[96];
} fn_cache[FN_CACHE];

/* Names given by atap_trace_name, looked up (under names_mu) when a
 * function is first named in a trace; each change bumps names_gen, and the
 * writer empties its cache when it sees a new one. */
struct given_name {
    struct given_name *next;
    atap_fn *fn;
    char name[96];
};
static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;
static struct given_name *given_names;
static _Atomic unsigned names_gen;
static unsigned cache_gen; /* the writer's */

int atap_trace_name(atap_fn *fn, const char *name)
{
    struct given_name **pp, *g;

    if (!fn)
        return ATAP_EINVAL;
    pthread_mutex_lock(&names_mu);
    for (pp = &given_names; (g = *pp) != NULL; pp = &g->next)
        if (g->fn == fn)
            break;
    if (!name || !*name) {
        if (g) {
            *pp = g->next;
            free(g);
        }
    } else {
        if (!g) {
            if (!(g = calloc(1, sizeof *g))) {
                pthread_mutex_unlock(&names_mu);
                return -ENOMEM;
            }
            g->fn = fn;
            g->next = given_names;
            given_names = g;
        }
        snprintf(g->name, sizeof g->name, "%s", name);
    }
    add_relaxed(&names_gen, 1);
    pthread_mutex_unlock(&names_mu);
    return 0;
}

static bool given_name_of(atap_fn *fn, char *buf, size_t n)
{
    bool found = false;

    pthread_mutex_lock(&names_mu);
    for (struct given_name *g = given_names; g; g = g->next)
        if (g->fn == fn) {
            snprintf(buf, n, "%s", g->name);
            found = true;
            break;
        }
    pthread_mutex_unlock(&names_mu);
    return found;
}

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
    if (ld_relaxed(&names_gen) != cache_gen) {
        cache_gen = ld_relaxed(&names_gen);
        memset(fn_cache, 0, sizeof fn_cache);
    }
    if (fn_cache[slot].fn == fn)
        return fn_cache[slot].name;
    memcpy(&addr, &fn, sizeof addr);
    fn_cache[slot].fn = fn;
    if (given_name_of(fn, fn_cache[slot].name, sizeof fn_cache[slot].name)) {
        /* named by atap_trace_name */
    } else if (dladdr(addr, &info) && info.dli_sname && info.dli_saddr == addr) {
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

/* A record's time as the file writes it: microseconds since the start,
 * always from the same nanoseconds the same way, so that two events of one
 * moment (an arrow's end and its slice) print the same ts. */
static double us_of(uint64_t ts) { return ts < tr.base ? 0.0 : (double)(ts - tr.base) / 1000.0; }

/* One instant (thread scope), with the task's id and, if any, its
 * function and a number. */
static void instant(FILE *f, const char *name, uint64_t tid, const struct tev *e,
                    const char *argname)
{
    begin_event(f);
    fprintf(f,
            "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%d,"
            "\"tid\":%llu,\"args\":{",
            name, us_of(e->ts), tr.pid, (unsigned long long)tid);
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

/* A spawn or a give: a slice of no length on its lane, which the arrow's
 * start binds to. */
static void marker(FILE *f, const char *name, uint64_t tid, const struct tev *e)
{
    begin_event(f);
    fprintf(f,
            "{\"name\":\"%s\",\"cat\":\"" CAT "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":0,"
            "\"pid\":%d,\"tid\":%llu,\"args\":{\"task\":\"0x%llx\"",
            name, us_of(e->ts), tr.pid, (unsigned long long)tid, (unsigned long long)e->id);
    if (e->fn) {
        fputs(",\"fn\":\"", f);
        put_escaped(f, fn_name(e->fn));
        fputc('"', f);
    }
    fputs("}}", f);
}

static void flow_event(FILE *f, char ph, uint8_t kind, uint64_t key, uint64_t ts, uint64_t tid)
{
    begin_event(f);
    fprintf(f,
            "{\"name\":\"%s\",\"cat\":\"" CAT "\",\"ph\":\"%c\",%s\"id\":\"0x%llx\","
            "\"ts\":%.3f,\"pid\":%d,\"tid\":%llu}",
            kind == TR_SPAWN ? "spawn" : "give", ph, ph == 'f' ? "\"bp\":\"e\"," : "",
            (unsigned long long)key, us_of(ts), tr.pid, (unsigned long long)tid);
}

/* One end of an arrow (s: its start, else its end): written with its other
 * end once both are seen, else kept until then. */
static void flow_end_seen(FILE *f, uint8_t kind, uint64_t key, bool s, uint64_t ts, uint64_t tid)
{
    size_t b = (size_t)((key ^ (key >> 29) ^ kind) % PEND_BUCKETS);
    struct pend **pp, *p;

    for (pp = &tr.pend[b]; (p = *pp) != NULL; pp = &p->next)
        if (p->key == key && p->kind == kind)
            break;
    if (!p) {
        if (tr.npend >= PENDING_MAX || !(p = calloc(1, sizeof *p)))
            return; /* no room: this arrow is not drawn */
        p->key = key;
        p->kind = kind;
        p->next = tr.pend[b];
        tr.pend[b] = p;
        tr.npend++;
        pp = &tr.pend[b];
    }
    if (s ? p->has_s : p->has_f)
        return; /* an end seen twice (a run that only looked first): one arrow */
    if (s) {
        p->has_s = true;
        p->s_ts = ts;
        p->s_tid = tid;
    } else {
        p->has_f = true;
        p->f_ts = ts;
        p->f_tid = tid;
    }
    if (!(p->has_s && p->has_f))
        return;
    if (p->f_ts >= p->s_ts) {
        flow_event(f, 's', kind, key, p->s_ts, p->s_tid);
        flow_event(f, 'f', kind, key, p->f_ts, p->f_tid);
    }
    for (pp = &tr.pend[b]; *pp != p; pp = &(*pp)->next)
        ;
    *pp = p->next;
    free(p);
    tr.npend--;
}

/* Ends that waited long for their other end (a task cancelled before it
 * ran, a give no run took): let go, once there are many. */
static void pend_sweep(uint64_t now)
{
    if (tr.npend < PENDING_SWEEP)
        return;
    for (size_t b = 0; b < PEND_BUCKETS; b++) {
        struct pend **pp = &tr.pend[b], *p;

        while ((p = *pp) != NULL) {
            uint64_t ts = p->has_s ? p->s_ts : p->f_ts;

            if (ts + PENDING_AGE_NS < now) {
                *pp = p->next;
                free(p);
                tr.npend--;
            } else {
                pp = &p->next;
            }
        }
    }
}

static void pend_clear(void)
{
    for (size_t b = 0; b < PEND_BUCKETS; b++) {
        struct pend *p = tr.pend[b], *next;

        for (; p; p = next) {
            next = p->next;
            free(p);
        }
        tr.pend[b] = NULL;
    }
    tr.npend = 0;
}

static struct wlane *wlane_of(uint64_t tid)
{
    struct wlane *l;

    for (size_t i = 0; i < tr.nwl; i++)
        if (tr.wl[i].tid == tid)
            return &tr.wl[i];
    if (tr.nwl == tr.capwl) {
        size_t cap = tr.capwl ? 2 * tr.capwl : 16;

        if (!(l = realloc(tr.wl, cap * sizeof *l)))
            return NULL;
        tr.wl = l;
        tr.capwl = cap;
    }
    l = &tr.wl[tr.nwl++];
    *l = (struct wlane){.tid = tid};
    return l;
}

static void aside_free(struct aside_runs *a)
{
    free(a->runs);
    free(a);
}

static void wlanes_clear(void)
{
    for (size_t i = 0; i < tr.nwl; i++) {
        for (struct aside_runs *a = tr.wl[i].aside, *next; a; a = next) {
            next = a->next;
            aside_free(a);
        }
        free(tr.wl[i].open);
    }
    free(tr.wl);
    tr.wl = NULL;
    tr.nwl = tr.capwl = 0;
}

/* An end with its run's result, or (why) an end the trace did not record,
 * or a stack set aside. */
static void end_event(FILE *f, uint64_t tid, const struct open_run *r, double us, const char *why,
                      long long rc)
{
    begin_event(f);
    fputs("{\"name\":\"", f);
    put_escaped(f, r->name);
    fprintf(f,
            "\",\"cat\":\"" CAT "\",\"ph\":\"E\",\"ts\":%.3f,\"pid\":%d,\"tid\":%llu,"
            "\"args\":{",
            us, tr.pid, (unsigned long long)tid);
    if (!why)
        fprintf(f, "\"rc\":%lld}}", rc);
    else
        fprintf(f, "\"end\":\"%s\"}}", why);
}

/* Closes the lane's runs recorded at level or deeper: their ends were
 * dropped (an event of a shallower depth came after them). */
static void close_from(FILE *f, struct wlane *l, uint16_t level, double us)
{
    while (l->n && l->open[l->n - 1].level >= level)
        end_event(f, l->tid, &l->open[--l->n], us, "not recorded", 0);
}

/* Opens r on the lane and writes its B (resumed: a stack set aside goes
 * on); false if the lane has no room (neither B nor then E: it stays whole). */
static bool open_on(FILE *f, struct wlane *l, const struct open_run *r, double us, bool resumed)
{
    if (l->n == l->cap) {
        unsigned cap = l->cap ? 2 * l->cap : 8;
        struct open_run *o = realloc(l->open, cap * sizeof *o);

        if (!o)
            return false;
        l->open = o;
        l->cap = cap;
    }
    l->open[l->n++] = *r;
    begin_event(tr.f);
    fputs("{\"name\":\"", f);
    put_escaped(f, r->name);
    fprintf(f,
            "\",\"cat\":\"" CAT "\",\"ph\":\"B\",\"ts\":%.3f,\"pid\":%d,\"tid\":%llu,"
            "\"args\":{\"task\":\"0x%llx\",\"fn\":\"",
            us, tr.pid, (unsigned long long)l->tid, (unsigned long long)r->id);
    put_escaped(f, r->name);
    fputs(resumed ? "\",\"stack\":\"goes on\"}}" : "\"}}", f);
    return true;
}

static void run_begins(FILE *f, struct wlane *l, const struct tev *e)
{
    double us = us_of(e->ts);
    struct open_run r = {.id = e->id, .level = e->depth};

    close_from(f, l, e->depth, us);
    snprintf(r.name, sizeof r.name, "%s", fn_name(e->fn));
    if (!open_on(f, l, &r, us, false))
        return;
    /* Arrows in: from the spawn, to a first run; from the give that
     * started it, to a run of a task that waits for gives. */
    if (e->arg & TR_FIRST_RUN)
        flow_end_seen(f, TR_SPAWN, e->id, false, e->ts, l->tid);
    if (e->arg & TR_GATED)
        flow_end_seen(f, TR_GIVE, give_flow_id(e->id, (uint32_t)(e->arg >> 32)), false, e->ts,
                      l->tid);
}

static void run_ends(FILE *f, struct wlane *l, const struct tev *e)
{
    double us = us_of(e->ts);
    uint16_t level = e->depth ? (uint16_t)(e->depth - 1) : 0;

    close_from(f, l, (uint16_t)(level + 1), us);
    if (l->n && l->open[l->n - 1].level == level && l->open[l->n - 1].id == e->id)
        end_event(f, l->tid, &l->open[--l->n], us, NULL, (long long)e->arg);
    /* else its "B" is not in the file (dropped, or before the start) */
}

/* A stack set aside (e->id: its token): the runs open on the lane, all
 * of them its own, end here and are kept for its going on. */
static void stack_aside(FILE *f, struct wlane *l, const struct tev *e)
{
    double us = us_of(e->ts);
    struct aside_runs *a;

    close_from(f, l, e->depth, us);
    if (l->n == 0)
        return;
    if (!(a = malloc(sizeof *a)) || !(a->runs = malloc(l->n * sizeof *a->runs))) {
        free(a);
        close_from(f, l, 0, us); /* ended as not recorded: they will not be begun again */
        return;
    }
    a->stack = e->id;
    a->n = l->n;
    memcpy(a->runs, l->open, l->n * sizeof *a->runs);
    while (l->n)
        end_event(f, l->tid, &l->open[--l->n], us, "set aside", 0);
    a->next = l->aside;
    l->aside = a;
}

/* The stack goes on: its runs begin again, outermost first. */
static void stack_back(FILE *f, struct wlane *l, const struct tev *e)
{
    double us = us_of(e->ts);
    struct aside_runs **pa = &l->aside, *a;

    close_from(f, l, 0, us); /* nothing of another stack stays open under it */
    while ((a = *pa) && a->stack != e->id)
        pa = &a->next;
    if (!a)
        return; /* set aside before the trace began, or its event dropped */
    *pa = a->next;
    for (unsigned i = 0; i < a->n && a->runs[i].level < e->depth; i++)
        if (!open_on(f, l, &a->runs[i], us, true))
            break;
    aside_free(a);
}

static void write_event(FILE *f, struct wlane *l, const struct tev *e)
{
    uint64_t tid = l->tid;

    if (e->ts < tr.base)
        return; /* recorded before this trace started */
    if (e->kind == TR_RUN_BEGIN) {
        run_begins(f, l, e);
        return;
    }
    if (e->kind == TR_RUN_END) {
        run_ends(f, l, e);
        return;
    }
    if (e->kind == TR_ASIDE || e->kind == TR_BACK) {
        struct tev shown = *e;

        if (e->kind == TR_ASIDE)
            stack_aside(f, l, e);
        else
            stack_back(f, l, e);
        shown.id = 0; /* a stack's token, not a task */
        instant(f, e->kind == TR_ASIDE ? "stack set aside" : "stack goes on", tid, &shown, "aside");
        return;
    }
    close_from(f, l, e->depth, us_of(e->ts));
    switch (e->kind) {
    case TR_SPAWN:
        marker(f, "spawn", tid, e);
        flow_end_seen(f, TR_SPAWN, e->id, true, e->ts, tid);
        break;
    case TR_GIVE:
        marker(f, "give", tid, e);
        flow_end_seen(f, TR_GIVE, give_flow_id(e->id, (uint32_t)e->arg), true, e->ts, tid);
        break;
    case TR_PARK:
        instant(f, "park", tid, e, "kind");
        break;
    case TR_RESUME:
        instant(f, "resume", tid, e, "reason");
        break;
    case TR_CANCEL:
        instant(f, "cancel", tid, e, NULL);
        break;
    case TR_TIMEOUT:
        instant(f, "timeout", tid, e, NULL);
        break;
    case TR_GROW:
        instant(f, "pool grows", tid, e, "workers");
        break;
    case TR_MANAGER:
        instant(f, "manager starts", tid, e, "restarts");
        break;
    case TR_RESTART:
        instant(f, "manager restart", tid, e, "failures");
        break;
    case TR_THREAD:
        instant(f, "thread starts", tid, e, "blocking");
        break;
    default:
        break;
    }
}

static void write_chunk(struct chunk *c)
{
    struct wlane *l = wlane_of(c->tid);

    if (!l)
        return;
    tr.dirty = true;
    for (uint32_t i = 0; i < c->n; i++)
        write_event(tr.f, l, &c->ev[i]);
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

/* What makes the events so far a whole trace: an "E" for every run still
 * open (at end_us), the process's and lanes' names, the dropped count, and
 * the closing brackets. */
static void write_tail(FILE *f, double end_us)
{
    int pid = tr.pid;

    for (size_t i = 0; i < tr.nwl; i++)
        for (unsigned k = tr.wl[i].n; k-- > 0;)
            end_event(f, tr.wl[i].tid, &tr.wl[i].open[k], end_us, false, 0);
    begin_event(f);
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"libatap\"}}",
            pid);
    pthread_mutex_lock(&tr.names);
    for (size_t i = 0; i < tr.nlanes; i++) {
        begin_event(f);
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%llu,"
                "\"args\":{\"name\":\"",
                pid, (unsigned long long)tr.lanes[i].tid);
        put_escaped(f, tr.lanes[i].name);
        fputs("\"}}", f);
    }
    pthread_mutex_unlock(&tr.names);
    begin_event(f);
    fprintf(f,
            "{\"name\":\"dropped events\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":%d,"
            "\"tid\":0,\"args\":{\"dropped\":%llu}}",
            end_us, pid, (unsigned long long)ld_relaxed(&tr.dropped));
    fputs("\n]}\n", f);
}

/* After a round that wrote events: the tail written, flushed and cut
 * there, and the next round to write over it. A round that wrote nothing
 * leaves the file as it is. */
static void write_tail_over(void)
{
    bool first = tr.first;
    long at;

    if (!tr.dirty)
        return;
    tr.dirty = false;
    fflush(tr.f);
    if (!tr.seekable || (at = ftell(tr.f)) < 0)
        return;
    write_tail(tr.f, us_of(atap__now_ns()));
    fflush(tr.f);
    if (ftruncate(fileno(tr.f), (off_t)ftell(tr.f)) != 0 || fseek(tr.f, at, SEEK_SET) != 0)
        tr.seekable = false; /* the file gets its tail at the stop only */
    tr.first = first;
}

static void *writer_main(void *arg)
{
    (void)arg;
    while (!ld_acquire(&tr.stop_writer)) {
        drain_full(true);
        pend_sweep(atap__now_ns());
        write_tail_over();
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

/* ---- the API -------------------------------------------------------------- */

/* Opens path for a trace without truncating another process's: the file is
 * locked (flock) while its trace is written, and a path locked by another
 * process (a forked child's parent, or another program given the same
 * ATAP_TRACE) is written as path.PID instead. */
static FILE *open_trace(const char *path, char *alt, size_t altn)
{
    int fd;
    FILE *f;

    if ((fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666)) < 0)
        return NULL;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;

        close(fd);
        if (err != EWOULDBLOCK) {
            errno = err;
            return NULL;
        }
        if ((size_t)snprintf(alt, altn, "%s.%d", path, (int)getpid()) >= altn) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        if ((fd = open(alt, O_WRONLY | O_CREAT | O_CLOEXEC, 0666)) < 0)
            return NULL;
        (void)flock(fd, LOCK_EX | LOCK_NB);
    } else {
        snprintf(alt, altn, "%s", path);
    }
    if (ftruncate(fd, 0) != 0 && errno != EINVAL) { /* EINVAL: a pipe, a tty */
        int err = errno;

        close(fd);
        errno = err;
        return NULL;
    }
    if (!(f = fdopen(fd, "w"))) {
        int err = errno;

        close(fd);
        errno = err;
    }
    return f;
}

static void trace_atexit(void);
static void trace_fork_child(void);
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

static void register_hooks(void)
{
    (void)atexit(trace_atexit);
    (void)pthread_atfork(NULL, NULL, trace_fork_child);
}

static int start_locked(const char *path)
{
    char used[4096];
    FILE *f;
    int rc;

    if (tr.running)
        return ATAP_EALREADY;
    pthread_once(&hooks_once, register_hooks);
    errno = 0;
    if (!(f = open_trace(path, used, sizeof used)))
        return errno ? -errno : -EIO;
    /* What a late hook left behind from an earlier trace goes first. */
    drain_full(false);
    take_current(false);
    tr.f = f;
    tr.first = true;
    tr.seekable = lseek(fileno(f), 0, SEEK_CUR) == 0;
    st_relaxed(&tr.dropped, 0);
    st_relaxed(&tr.stop_writer, 0);
    tr.pid = (int)getpid();
    memset(fn_cache, 0, sizeof fn_cache); /* a library may have gone since */
    tr.base = atap__now_ns();
    fputs("{\"traceEvents\":[\n", f);
    tr.dirty = true;
    write_tail_over(); /* whole from the start */
    if ((rc = pthread_create(&tr.writer, NULL, writer_main, NULL)) != 0) {
        fclose(f);
        (void)remove(used);
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
    write_tail(tr.f, us_of(atap__now_ns()));
    wlanes_clear();
    pend_clear();
    fflush(tr.f);
    if (tr.seekable && ftruncate(fileno(tr.f), (off_t)ftell(tr.f)) != 0)
        rc = -EIO;
    if (ferror(tr.f))
        rc = -EIO;
    if (fclose(tr.f) != 0 && rc == 0) /* and the lock goes with the fd */
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

/* The program exits with a trace still being written (no atap_shutdown, or
 * no atap_trace_stop): what was recorded is written and the file finished.
 * Only in the process that started the trace. */
static void trace_atexit(void)
{
    pthread_mutex_lock(&tr.ctl);
    if (tr.running && tr.pid == (int)getpid())
        (void)stop_locked();
    pthread_mutex_unlock(&tr.ctl);
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
 * The file is the parent's: its fd is pointed at /dev/null rather than
 * closed, so that the FILE's buffered bytes, flushed when the child exits,
 * go nowhere (a closed fd's number may be the child's next file). The
 * parent's memory is let go unfreed. Called by the trace's own atfork
 * handler and by the runtime's (runtime.c); the second call finds nothing
 * to do. */
void atap__trace_forget(void)
{
    st_relaxed(&atap__trace_on, false);
    pthread_mutex_init(&tr.ctl, NULL);
    pthread_mutex_init(&tr.names, NULL);
    pthread_mutex_init(&names_mu, NULL);
    if (tr.f) {
        int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);

        if (nul >= 0) {
            (void)dup2(nul, fileno(tr.f));
            close(nul);
        }
    }
    tr.f = NULL;
    tr.running = tr.from_env = false;
    tr.wl = NULL;
    tr.nwl = tr.capwl = 0;
    memset(tr.pend, 0, sizeof tr.pend);
    tr.npend = 0;
    st_relaxed(&tr.full, NULL); /* the parent's chunks: let go */
    st_relaxed(&tr.chunks, 0);
    tr.nlanes = 0; /* the parent's lanes; this thread names its own again */
    for (struct tthread *t = ld_relaxed(&tr.threads); t; t = t->next) {
        st_relaxed(&t->lock, 0);
        t->cur = NULL;
        st_relaxed(&t->owned, false);
    }
    self_t = NULL; /* a thread of its own in the child: a record and a lane anew */
}

static void trace_fork_child(void) { atap__trace_forget(); }

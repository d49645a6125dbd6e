/*
 * The pool: worker threads that run tasks, and blocking threads that run
 * tasks spawned with .blocking. The protocols: pool.c (running, waking,
 * parking), pool_grow.c (how many threads run), pool_recover.c (a thread
 * that dies under a task), pool_life.c (start, drain, stop), help.c (what
 * a wait inside a task may run).
 */
#ifndef ATAP_POOL_H
#define ATAP_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deque.h"
#include "faults.h"
#include "injector.h"
#include "table.h"

#define LIFO_STREAK 3
#define POOL_MAX_THREADS 1024 /* records for workers, and again for blocking threads */
#define PUB_DEPTH 128         /* runs published at once on a worker's stack (leapfrog) */

#define HELD_INLINE 64         /* runs on a stack recorded without the heap */

/* Lines written by the owner on every task are kept apart from the lines
 * other threads scan (status, ring indices), so an idle thread looking for
 * work does not slow down a busy one. */
struct worker {
    struct ring ring;
    _Alignas(64) _Atomic uint32_t lifo; /* a task spawned by the running task, or 0 */
    _Alignas(64) _Atomic int status;    /* W_FREE, W_LIVE, W_DEAD */
    _Atomic uint32_t park;              /* futex word, see pool.c */
    _Atomic bool in_io;                 /* idle, waiting on the hub's io (pool_io.c) */
    pthread_t thread;
    _Atomic int tid;                /* the kernel's id of its thread (Linux) */
    _Alignas(64) _Atomic bool busy; /* inside a task (owner-written, read by stats) */
    _Atomic uint64_t completed;
    bool blocking;             /* a blocking thread, not a worker */
    bool searching;            /* counted in the pool's searcher count */
    bool in_idle;              /* on the idle list (pool lock) */
    bool uncounted;            /* already left the live count (idle stop) */
    struct worker *idle_next;  /* idle list link (pool lock) */
    uint64_t idle_since;       /* when it joined the idle list (pool lock) */
    _Atomic bool blocked;      /* counted in the pool's blocked count
                                  (owner-written, read by the tick) */
    uint64_t blocked_at;       /* when it last counted itself blocked */
    unsigned lifo_streak;
    unsigned io_runs;          /* runs since it last thought of io (pool_io.c) */
    /* The tasks this thread is inside, outermost first (held[0..depth)):
     * every run on its stack, nested by waits. Off the stack, so that a
     * dying thread's cleanup can read them after its stack unwound. */
    unsigned depth, held_cap;
    uint32_t *held;            /* held_inline, or a larger heap array */
    uint32_t held_inline[HELD_INLINE];
    uintptr_t stack_floor;     /* no run starts nested below this address */
    uint32_t fseq;             /* runs published so far */
    unsigned index;            /* its place among the workers (or blocking threads) */
    uint64_t rng;
    struct inj_cursor cursor;
    struct slot_cache cache;
    struct atap_ctx *cur;           /* the task running now (innermost), or NULL */
    struct atap_poller *_Atomic kq; /* its own event queue (park.c), made on
                                       first use, kept with the record */
    _Atomic uint64_t kwait;         /* gen << 32 | index of the task in a
                                       kernel wait on kq, or 0 */
    /* The runs a waiter may leapfrog into (help.c), outermost first: the
     * k-th published run on the stack's seq << 32 | ref, the ring's bottom
     * when it started, and its depth (its index in held[]). Not every run
     * publishes: one a waiter took as the task it waits for from its own
     * queues has nobody else waiting for it, so a deep chain of a thread's
     * own joins uses no entry, and runs stolen at any depth can be found. */
    unsigned npub;
    _Alignas(64) _Atomic uint64_t pub[PUB_DEPTH];
    _Atomic int64_t pubmark[PUB_DEPTH];
    _Atomic uint32_t pubdepth[PUB_DEPTH];
    /* The innermost wait under way on its stack (read.c): gen << 32 | ref
     * of the task it waits for, or 0; and the runs on the stack then (the
     * waiting one is held[awaiting_at - 1]; 0 outside any run). */
    _Atomic uint64_t awaiting;
    _Atomic uint32_t awaiting_at;
};

/* A pool thread's wait for the task gen << 32 | ref starts (the innermost
 * run waits); it returns *saved to atap__pool_wait_end. */
static inline void atap__pool_wait_begin(struct worker *w, uint64_t task, uint64_t saved[2])
{
    saved[0] = atomic_load_explicit(&w->awaiting, memory_order_relaxed);
    saved[1] = atomic_load_explicit(&w->awaiting_at, memory_order_relaxed);
    atomic_store_explicit(&w->awaiting_at, w->depth, memory_order_relaxed);
    /* Release: who reads the task reads its depth (or a later one). */
    atomic_store_explicit(&w->awaiting, task, memory_order_release);
}

static inline void atap__pool_wait_end(struct worker *w, const uint64_t saved[2])
{
    atomic_store_explicit(&w->awaiting_at, (uint32_t)saved[1], memory_order_relaxed);
    atomic_store_explicit(&w->awaiting, saved[0], memory_order_release);
}

/* The thread is inside the task ref (slot index + 1): running it, or a run
 * lower on its stack. A wait for such a task could only end once the wait
 * itself returned. */
static inline bool atap__pool_inside(const struct worker *w, uint32_t ref)
{
    for (unsigned i = 0; w && i < w->depth; i++)
        if (w->held[i] == ref)
            return true;
    return false;
}

/* A run of ref starts on w's stack (executor.c), and ends. held[] has room:
 * a run nests only through atap__pool_help_pick or atap__pool_help_own,
 * which make sure. */
static inline void atap__pool_frame_push(struct worker *w, uint32_t ref)
{
    w->held[w->depth++] = ref;
}

static inline void atap__pool_frame_pop(struct worker *w, bool published)
{
    /* Unpublished before anything the lower runs push (release stores):
     * a leapfrogger that takes such an entry sees this (help.c). */
    if (published)
        atomic_store_explicit(&w->pub[--w->npub], 0, memory_order_relaxed);
    w->depth--;
}

struct atap_slot;
/* Publishes the innermost run, of the plain task in slot s just claimed,
 * so that a thread waiting for it can find what it spawns; hint: its slot's
 * link is free to say where (claimed from a queue, not aside). True if
 * published (atap__pool_frame_pop unpublishes it). */
bool atap__pool_publish(struct worker *w, struct atap_slot *s, bool hint);

/* A canceller or a timeout stopped the task gen << 32 | index: a thread in
 * a kernel wait for it is woken (its kq). */
void atap__pool_interrupt(uint64_t key);

/* The worker or blocking thread running on this thread, or NULL. */
extern _Thread_local struct worker *atap__self;

/* How runtime.c asks the pool to start (atap_config and the environment
 * already resolved): workers and blocking are absolute counts, 0 for
 * "per CPU" (cpus.c). */
/*
 * What the pool does with a task is the executor's, a layer above it: the
 * executor gives these at start (atap__exec_pool_ops, through runtime.c),
 * and the pool never names it. ref is a slot index + 1.
 */
struct atap__pool_ops {
    /* Runs the queued task ref (its queue entry carried RUN); publish: a
     * waiter on another thread may look for it (atap__pool_publish). */
    void (*run)(struct worker *w, uint32_t ref, bool publish);
    /* A waiter claims the queued task ref of generation gen out of its
     * queue place (help.c); run_claimed then runs it. */
    bool (*claim)(struct atap_slot *s, uint32_t ref, uint32_t gen);
    void (*run_claimed)(struct worker *w, uint32_t ref);
    /* A hold on a task that may be going, and its release (help.c keeps
     * a task it leapfrogs into). */
    bool (*try_hold)(struct atap_slot *s, uint32_t gen);
    void (*release_hold)(struct atap_slot *s, uint32_t index, uint32_t gen);
    /* The thread running ref is dying (pool_recover.c). */
    void (*fail_held)(uint32_t ref);
};

struct atap__pool_conf {
    const struct atap__pool_ops *ops; /* the executor's */
    unsigned workers;          /* the base count of workers; 0: one per CPU */
    unsigned workers_per_cpu;  /* the target, a CPU */
    unsigned blocking;         /* the most blocking threads; 0: per CPU */
    unsigned blocking_per_cpu; /* the most blocking threads, a CPU */
    size_t stack;              /* a thread's stack, bytes */
    /* Hands out one report of the hub's io poller (park_fd.c's, on the
     * thread that read it: not the manager's). NULL: nobody waits on io
     * but the manager. */
    void (*io_event)(void *udata, unsigned events, unsigned kind);
};

int atap__pool_start(const struct atap__pool_conf *conf);
/* Looks at the hub's io (no wait) if its seat is free and nobody has
 * for gap_ns, and hands each report to hand on this thread: a busy worker
 * between runs (the conf's io_event), the manager at its tick (its own). */
void atap__pool_io_look(uint64_t gap_ns, void (*hand)(void *udata, unsigned events, unsigned kind));
struct atap_pool_stats;
/* Waits until no work is queued or running, then stops and joins every
 * thread. The caller has already refused new outside spawns. */
void atap__pool_stop(void);

/* In a fork's child only (its one thread): back to before the first start,
 * the parent's threads' fds closed, nothing freed (pool_life.c). */
void atap__pool_forget(void);

/* A worker waiting inside a task with nothing it may run counts as
 * blocked, and the pool lends its core: it wakes an idle worker, or starts
 * one (up to the ceiling) when none has been left unblocked for a while;
 * the tick counts it as stuck. */
void atap__pool_blocked(struct worker *w, bool blocked);

/* A blocked waiter whose task is still queued asks: is every worker the
 * pool may have waiting, so that nothing can run that task? True for one
 * waiter at a time (it then gives up with ATAP_ELIMIT), counted as a stall. */
bool atap__pool_stalled(struct worker *w);

/* For help.c: the worker records (records in use, the i-th, whether one
 * has a live thread), and a worker's push into its own ring. */
unsigned atap__pool_records(void);
struct worker *atap__pool_record(unsigned i);
bool atap__pool_live(struct worker *w);
void atap__pool_push_ring(struct worker *w, uint32_t ref);

/* Queues worker tasks (not blocking ones) from outside the pool, each in
 * its priority band, with one wake check for them all. */
void atap__pool_submit_batch(const uint32_t *refs, unsigned n);

/* Queues a task (ref = slot index + 1). */
void atap__pool_submit(uint32_t ref, int priority, bool blocking);

/* atap__pool_submit's common case, inline: a worker's task spawning a
 * worker task into its own empty LIFO slot. An empty LIFO slot stays empty
 * until its owner fills it (thieves only take), so this needs no locked
 * instruction; it wakes nobody (pool.c: the spawner runs it next). The
 * release store lets a thief's exchange see the task's fields. */
static inline void atap__pool_submit_from(struct worker *w, uint32_t ref, int priority,
                                          bool blocking)
{
    if (w && !blocking && !w->blocking &&
        atomic_load_explicit(&w->lifo, memory_order_relaxed) == 0)
        atomic_store_explicit(&w->lifo, ref, memory_order_release);
    else
        atap__pool_submit(ref, priority, blocking);
}

/* A pool thread waiting for the task ref (generation gen, slot s) picks
 * one piece of work that task needs, if there is one and its stack has
 * room: the task itself while it is queued, work it spawned, what it waits
 * for (help.c). Returns its ref, or 0 for none; *how says where it came
 * from. The caller owns its run, and runs it with atap__pool_help_run once
 * it no longer shows itself waiting. *runner (runner may be NULL): the
 * worker found running the task (or what it waits for), whose queues the
 * look searched, else NULL. */
enum help_how {
    HELP_OWN,     /* the awaited task, from this worker's own queues */
    HELP_TAKEN,   /* from another's queue: others may wait for it too */
    HELP_CLAIMED, /* claimed aside where it sat */
};
uint32_t atap__pool_help_pick(struct worker *w, struct atap_slot *s, uint32_t ref, uint32_t gen,
                              enum help_how *how, struct worker **runner);
void atap__pool_help_run(struct worker *w, uint32_t x, enum help_how how);
/* The quick case of a pick: ref itself, in w's LIFO slot or as its
 * ring's newest entry (a join of a task this worker spawned), taken if
 * there is room to run it; 0 otherwise. Its run is the caller's, a run
 * of HELP_OWN. */
uint32_t atap__pool_help_own(struct worker *w, uint32_t ref);
/* A waiter that goes on looking rather than block (read.c): what w's own
 * queues hold is out of its reach meanwhile, so an idle worker is woken
 * for it if there is any (atap__pool_blocked does the same for a waiter
 * that blocks). */
void atap__pool_offer_own(struct worker *w);

struct atap_pool_stats;
void atap__pool_stats(struct atap_pool_stats *st);
unsigned atap__pool_live_workers(void);
/* A shutdown's drain is over and the pool's threads are told to stop:
 * work queued now would not run (until the next atap_init). */
bool atap__pool_stopped(void);

/* The manager's pool policy, every tick: wakes idle workers for work that
 * waits, grows the pool when every worker is stuck, reaps idle workers
 * above the floor, trims the table now and then when idle. */
void atap__pool_tick(uint64_t now);

/* Wakes every idle worker and blocking thread (fault injection). */
void atap__pool_wake_all(void);

#endif

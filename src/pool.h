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
#include <stdlib.h>

#include "atomics.h"
#include "deque.h"
#include "faults.h"
#include "injector.h"
#include "table.h"

#define LIFO_STREAK 3
#define POOL_MAX_THREADS 1024 /* records for workers, and again for blocking threads */

#define HELD_INLINE 64 /* runs on a stack recorded without the heap */

struct stack;

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
    _Atomic int tid; /* the kernel's id of its thread (Linux) */
    /* Stacks set aside whose wait is over, pushed by whoever ended it
     * (pool_aside.c); only the owner takes them. */
    _Atomic(struct stack *) woken;
    _Alignas(64) _Atomic bool busy; /* inside a task (owner-written, read by stats) */
    _Atomic uint64_t completed;
    bool blocking;            /* a blocking thread, not a worker */
    bool searching;           /* counted in the pool's searcher count */
    bool in_idle;             /* on the idle list (pool lock) */
    bool uncounted;           /* already left the live count (idle stop) */
    struct worker *idle_next; /* idle list link (pool lock) */
    uint64_t idle_since;      /* when it joined the idle list (pool lock) */
    unsigned lifo_streak;
    unsigned io_runs; /* runs since it last thought of io (pool_io.c) */
    /* The tasks the running stack is inside, outermost first
     * (held[0..depth)): every run on it, nested by waits. Off the stack, so
     * that a dying thread's cleanup can read them after its stack unwound.
     * Each stack of the thread has its own (pool_aside.c swaps them). */
    unsigned depth, held_cap;
    uint32_t *held; /* held_inline, or a larger heap array */
    uint32_t held_inline[HELD_INLINE];
    uintptr_t stack_floor; /* no run starts nested below this address */
    uintptr_t stack_low;   /* the lowest a nested run started at on it */
    unsigned index;        /* its place among the workers (or blocking threads) */
    uint64_t rng;
    struct inj_cursor cursor;
    struct slot_cache cache;
    struct atap_ctx *cur;           /* the task running now (innermost), or NULL */
    struct atap_poller *_Atomic kq; /* its own event queue (kwait.c), made on
                                       first use, kept with the record until
                                       the pool stops (pool_life.c) */
    _Atomic uint64_t kwait;         /* gen << 32 | index of the task in a
                                       kernel wait on kq, or 0 */
    /* Its stacks (pool_aside.c; the owner's alone): the one running, its
     * own thread's, those free to take work, those set aside whose wait is
     * over in the order to resume them, and those set aside with a
     * deadline. naside counts the stacks set aside, nfree the free ones. */
    struct stack *stack, *base, *free, *ready, *ready_tail, *timed;
    unsigned naside, nfree;
    uint32_t handoff;   /* a task the next stack taken runs first */
    struct stack *dead; /* a stack to unmap once off it */
    bool exiting;       /* its loop ends on its own stack */
    bool dying;         /* a task ended the thread: each stack unwinds */
    /* Output blocks freed on this thread, kept to hand out again (the
     * owner's alone): see atap__pool_out_take. */
    void *outs[2];
    unsigned nouts[2];
};

/*
 * Output blocks. An output over the slot's inline bytes and up to OUT_BLOCK
 * lives in a block from malloc of one of two sizes: OUT_SMALL (three words,
 * malloc's smallest chunk, 32 bytes) or OUT_BLOCK (an 80-byte chunk), so a
 * node of a fork-join tree that outputs three words holds 32 bytes while it
 * runs and waits, not 80. A pool thread keeps up to OUT_KEEP of each size
 * freed on it (a list through their first word) and hands them out again,
 * so such a tree pays no malloc or free per task; its spawns and its frees
 * are mostly on the same thread. Only the owner touches its lists: w is
 * atap__self (NULL outside the pool: plain malloc and free). Any block may
 * go to free(), and a thread leaving frees what it kept
 * (atap__pool_outs_drop).
 */
#define OUT_SMALL 24u
#define OUT_BLOCK 64u
#define OUT_KEEP 256u

/* The size class of an output of size bytes (<= OUT_BLOCK): 0 or 1. */
static inline unsigned atap__pool_out_class(size_t size) { return size > OUT_SMALL; }

static inline void *atap__pool_out_take(struct worker *w, unsigned c)
{
    void *b;

    if (w && (b = w->outs[c]) != NULL) {
        w->outs[c] = *(void **)b;
        w->nouts[c]--;
        return b;
    }
    return malloc(c ? OUT_BLOCK : OUT_SMALL);
}

static inline void atap__pool_out_give(struct worker *w, unsigned c, void *b)
{
    if (w && w->nouts[c] < OUT_KEEP) {
        *(void **)b = w->outs[c];
        w->outs[c] = b;
        w->nouts[c]++;
        return;
    }
    free(b);
}

/* The thread leaves: the blocks it kept go back to malloc. */
void atap__pool_outs_drop(struct worker *w);

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
 * a run nests only where atap__pool_room said so. */
static inline void atap__pool_frame_push(struct worker *w, uint32_t ref)
{
    w->held[w->depth++] = ref;
}

static inline void atap__pool_frame_pop(struct worker *w) { w->depth--; }

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
    /* Runs the queued task ref (its queue entry carried RUN). */
    void (*run)(struct worker *w, uint32_t ref);
    /* The thread running ref is dying (pool_recover.c). */
    void (*fail_held)(uint32_t ref);
};

struct atap__pool_conf {
    const struct atap__pool_ops *ops; /* the executor's */
    unsigned workers;                 /* the base count of workers; 0: one per CPU */
    unsigned workers_per_cpu;         /* the target, a CPU */
    unsigned blocking;                /* the most blocking threads; 0: per CPU */
    unsigned blocking_per_cpu;        /* the most blocking threads, a CPU */
    size_t stack;                     /* a thread's stack, bytes */
    /* Hands out one report of the hub's io poller (park_fd.c's, on the
     * thread that read it: not the manager's). NULL: nobody waits on io
     * but the manager. */
    void (*io_event)(void *udata, unsigned events, unsigned kind);
    /* Fires the deadline parks that are due, if the manager has not (the
     * park wheel's, on a busy worker between runs: park.h). NULL: none. */
    void (*due)(void);
    /* When the next of them is due (UINT64_MAX: none), a word their
     * holder publishes: an idle worker that finds it near stays awake for
     * it (pool.c). NULL: none. */
    const _Atomic uint64_t *due_at;
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

/* The worker records in use (each may keep a poller: the soak counts). */
unsigned atap__pool_records(void);

/* Queues resumed worker tasks (not blocking ones) from outside the pool,
 * each in its priority's band of resumed runs, with one wake check for
 * them all. */
void atap__pool_submit_batch(const uint32_t *refs, unsigned n);

/* Queues a task (ref = slot index + 1). */
void atap__pool_submit(uint32_t ref, int priority, bool blocking);
/* ... due: a resumed run, which the shared queue serves before the first
 * runs of its priority (a pool thread's own LIFO slot takes either). */
void atap__pool_submit_as(uint32_t ref, int priority, bool blocking, bool due);

/* atap__pool_submit's common case, inline: a worker's task spawning a
 * worker task into its own empty LIFO slot. An empty LIFO slot stays empty
 * until its owner fills it (thieves only take), so this needs no locked
 * instruction; it wakes nobody (pool.c: the spawner runs it next). The
 * release store lets a thief's exchange see the task's fields. */
static inline void atap__pool_submit_from(struct worker *w, uint32_t ref, int priority,
                                          bool blocking)
{
    if (w && !blocking && !w->blocking && ld_relaxed(&w->lifo) == 0)
        st_release(&w->lifo, ref);
    else
        atap__pool_submit(ref, priority, blocking);
}

/*
 * Waits inside tasks (help.c, pool_aside.c). A pool thread waiting for a
 * task runs on top of its waiting frame only that task, taken from its own
 * queues while its stack has room; else it sets the stack aside and goes on
 * with any work on another stack, and the stack set aside resumes on the
 * same thread once its wait is over (pool_aside.c says how).
 */

/* The awaited task ref, if it sits in w's LIFO slot or among its ring's
 * newest entries (a join of a task this worker spawned): taken, its run
 * the caller's; else 0. */
uint32_t atap__pool_take_own(struct worker *w, uint32_t ref);
/* Room on the running stack for one more run nested on it. */
bool atap__pool_room(struct worker *w);
/* Runs x (taken by atap__pool_take_own) on top, past the stack's room,
 * when no other stack can be had: true; false if held[] could not grow,
 * x then queued again. */
bool atap__pool_run_past_room(struct worker *w, uint32_t x);
/* take_own where there is room: a run of it can go on top now. */
static inline uint32_t atap__pool_help_own(struct worker *w, uint32_t ref)
{
    return atap__pool_room(w) ? atap__pool_take_own(w, ref) : 0;
}

/*
 * Sets the running stack aside until atap__pool_wake_key of one of its
 * nkeys keys or the deadline (ATAP__FOREVER: none), and runs another: a
 * stack whose own wait is over, else a free one, which first runs `first`
 * (a task whose run the caller owns; 0 for none) and then looks for work.
 * still(arg) is called once the stack is listed under every key: it says
 * whether the wait is still on, and makes sure, by an RMW that whoever
 * ends the wait from then on reads after its own, that it calls
 * atap__pool_wake_key. Returns ASIDE_WOKEN once resumed (woken, the
 * deadline passed, or woken for nothing: the caller looks again),
 * ASIDE_GONE if still() said no (nothing was set aside, first not taken),
 * ASIDE_NO if no stack could be had to go on with (first not taken: the
 * caller waits some other way).
 */
enum { ASIDE_NO, ASIDE_GONE, ASIDE_WOKEN };
int atap__pool_aside(struct worker *w, const void *const *keys, unsigned nkeys,
                     bool (*still)(void *arg), void *arg, uint64_t deadline, uint32_t first);
/* An injected death (faults.h): the thread exits through pthread_exit,
 * from whichever of its stacks runs (pool_aside.c). */
_Noreturn void atap__pool_die(struct worker *w);
/* Ends the wait of every stack set aside under key (pool_aside.c). */
void atap__pool_wake_key(const void *key);
extern _Atomic unsigned atap__pool_keyed; /* stacks listed under a key */
/* The same, when a stack may be listed under key: the check costs one
 * relaxed load. The caller's own RMW read what a waiter's still() wrote
 * (a CAS on the same word), which came after its listing: so a waiter
 * listed is counted here. */
static inline void atap__pool_wake_listed(const void *key)
{
    if (ld_relaxed(&atap__pool_keyed) != 0)
        atap__pool_wake_key(key);
}

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

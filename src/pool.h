/*
 * The pool: worker threads that run tasks, and blocking threads that run
 * tasks spawned with .blocking. See pool.c for the protocols.
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

/* Lines written by the owner on every task are kept apart from the lines
 * other threads scan (status, ring indices), so an idle thread looking for
 * work does not slow down a busy one. */
struct worker {
    struct ring ring;
    _Alignas(64) _Atomic uint32_t lifo; /* a task spawned by the running task, or 0 */
    _Alignas(64) _Atomic int status;    /* W_FREE, W_LIVE, W_DEAD */
    _Atomic uint32_t park;              /* futex word, see pool.c */
    pthread_t thread;
    _Alignas(64) _Atomic bool busy; /* inside a task (owner-written, read by stats) */
    _Atomic uint64_t completed;
    bool blocking;             /* a blocking thread, not a worker */
    bool searching;            /* counted in the pool's searcher count */
    bool in_idle;              /* on the idle list (pool lock) */
    bool uncounted;            /* already left the live count (idle stop) */
    struct worker *idle_next;  /* idle list link (pool lock) */
    uint64_t idle_since;       /* when it joined the idle list (pool lock) */
    bool blocked;              /* counted in the pool's blocked count */
    unsigned lifo_streak;
    unsigned depth;            /* helping depth: runs nested inside a join */
    unsigned nheld;            /* tasks this thread is inside, outermost first */
    uint32_t held[HELP_DEPTH + 2];
    uint64_t rng;
    struct inj_cursor cursor;
    struct slot_cache cache;
    struct atap_ctx *cur;           /* the task running now (innermost), or NULL */
    struct atap_poller *_Atomic kq; /* its own event queue (park.c), made on
                                       first use, kept with the record */
    _Atomic uint64_t kwait;         /* gen << 32 | index of the task in a
                                       kernel wait on kq, or 0 */
};

/* The thread is inside the task ref (slot index + 1): running it, or a run
 * further up its helping stack. A wait for such a task could only end once
 * the wait itself returned. */
static inline bool atap__pool_inside(const struct worker *w, uint32_t ref)
{
    for (unsigned i = 0; w && i < w->nheld; i++)
        if (w->held[i] == ref)
            return true;
    return false;
}

/* A canceller or a timeout stopped the task gen << 32 | index: a thread in
 * a kernel wait for it is woken (its kq). */
void atap__pool_interrupt(uint64_t key);

/* The worker or blocking thread running on this thread, or NULL. */
extern _Thread_local struct worker *atap__self;

int atap__pool_start(unsigned workers_per_core, unsigned blocking_per_core, size_t stack);
struct atap_pool_stats;
/* Waits until no work is queued or running, then stops and joins every
 * thread. The caller has already refused new outside spawns. */
void atap__pool_stop(void);

/* A worker waiting inside a task that can no longer help (too deep) counts
 * as blocked; when every worker is blocked and work waits, the pool starts
 * one more, so deep recursion never deadlocks the pool. */
void atap__pool_blocked(struct worker *w, bool blocked);

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

/* Inside a worker joining the task `awaited` (a ref): runs the awaited task
 * if it is still in this worker's queue, else, while not too deep, one other
 * queued task. False when nothing was run. */
bool atap__pool_help_once(struct worker *w, uint32_t awaited);

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

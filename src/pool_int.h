/*
 * What the pool's files share, and no one else: the pool's state and its
 * records (defined in pool.c), the record and park words, and the few
 * functions one of them calls in another. pool.c runs the pool (queues,
 * parking, finding work, submitting, the threads' loops); pool_grow.c
 * decides how many threads run; pool_recover.c recovers a thread that dies
 * under a task; pool_life.c starts, drains and stops the pool, counts it,
 * and resets it in a fork's child. The live counts' rule (a thread is
 * counted out once, by whoever decides it goes) is in pool_grow.c's top
 * comment; the parking protocol in pool.c's.
 */
#ifndef ATAP_POOL_INT_H
#define ATAP_POOL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "injector.h"

/* An extension of pool.h (struct worker, POOL_MAX_THREADS), which every
 * pool file includes first; not included from here, so that the pool's
 * two headers form no circle. */
#ifndef ATAP_POOL_H
#error "include pool.h before pool_int.h"
#endif

/* A record's status (struct worker's). */
#define W_FREE 0
#define W_LIVE 1
#define W_DEAD 2

/* A thread's park word (pool.c). */
#define PARK_RUNNING 0u
#define PARK_IDLE 1u
#define PARK_NOTIFIED 2u
#define PARK_STOP 3u
#define PARK_READY                                                                                 \
    4u /* still listed idle, but a stack of its own may go on                                      \
          (pool_aside.c): it takes itself off the list */

/* The pool's state (pool.c defines it, as atap__pool). */
struct pool {
    const struct atap__pool_ops *ops;                              /* the executor's (pool.h) */
    void (*io_event)(void *udata, unsigned events, unsigned kind); /* the conf's */
    void (*due)(void);                                             /* the conf's */
    struct injector inj;                                           /* for workers */
    struct injector binj;                                          /* for blocking threads */
    pthread_mutex_t lock; /* idle list, starting and joining threads */
    struct worker *idle;
    _Atomic unsigned nrec, nlive, nidle, nsearching, peak;
    /* Stacks set aside now (a drain waits for them), their peak, and the
     * stacks mapped (pool_aside.c). */
    _Atomic unsigned naside, peak_aside, nstacks;
    unsigned floor, target; /* fewest and usual most workers */
    /* The most workers: what the kernel would give (pool_life.c); lowered
     * by a refused start, read again by the tick (pool_grow.c). Written
     * under the pool lock, read anywhere (relaxed: a bound, not a hand-off). */
    _Atomic unsigned ceiling;
    unsigned ceiling_read_at;             /* manager: the tick it was last read at */
    _Atomic bool refused;                 /* the last worker start was refused */
    uint64_t last_done[POOL_MAX_THREADS]; /* manager: completed at the last tick */
#if !defined(__linux__)
    uint64_t last_cpu[POOL_MAX_THREADS]; /* manager: CPU time at the last look */
#endif
    unsigned ticks;         /* manager: ticks since start */
    unsigned stuck_ticks;   /* manager: ticks in a row with every worker stuck */
    _Atomic uint64_t epoch; /* moves when a thread leaves an idle list or starts */
    _Atomic bool stopping;
    struct worker *bidle_list; /* idle blocking threads (pool lock) */
    _Atomic unsigned brec, blive, bidle, bbusy;
    unsigned bcap;
    size_t stack;
    _Atomic uint64_t deaths;
    /* Threads whose records were taken again before they were joined (pool
     * lock): joined later, never under the lock (claim_record says why). */
    pthread_t zombies[POOL_MAX_THREADS];
    unsigned nzombies;
    const _Atomic uint64_t *due_at; /* the conf's */
    _Atomic bool timer_watch;       /* a worker stays awake for a near due time (pool.c) */
};

extern struct pool atap__pool;
/* The records: the workers', and the blocking threads'. */
extern struct worker atap__pool_workers[POOL_MAX_THREADS];
extern struct worker atap__pool_blockers[POOL_MAX_THREADS];

/* pool.c. Starts a thread in a FREE or DEAD record (pool lock held): 0 or -errno. */
int atap__pool_start_thread(bool blocking, struct worker *self);
/* pool_life.c. The ceiling the kernel's limits give now, with `live` workers running. */
unsigned atap__pool_ceiling_read(unsigned live);
/* Entries moved between a ring and the shared queue a batch at a time. */
#define MOVE_CHUNK 128

/* pool.c. The owner's push into its own ring (a full one moves half out). */
void atap__pool_push_ring(struct worker *w, uint32_t ref);
/* pool.c. Queues refs in the shared queue q, each in its own band. */
void atap__pool_push_shared(struct injector *q, const uint32_t *refs, unsigned n, bool due);
/* pool.c. Work in the shared queue or a ring; with_lifo: in a LIFO slot too. */
bool atap__pool_work_visible(bool with_lifo);
/* pool.c. Hands a thread taken off an idle list its word, and wakes it. */
void atap__pool_unpark(struct worker *w, uint32_t word);
/* pool.c. Empties both idle lists, each thread woken with word (pool lock held). */
void atap__pool_unpark_all(uint32_t word);
/* pool.c. Takes w off an idle list, counted out of *count (pool lock held). */
void atap__pool_unlink_from(struct worker **list, _Atomic unsigned *count, struct worker *w);
/* pool.c. Wakes one idle worker; false if none was idle. */
bool atap__pool_wake_idle(void);
/* pool.c. After queueing work: wakes one worker unless one is already looking. */
void atap__pool_notify(void);
/* A listed worker takes itself off the idle list to run what it found,
 * unless a waker took it off first (whose word then stands). */
void atap__pool_leave_idle(struct worker *w);
/* pool_recover.c: moves w's queued tasks to the shared queue (w's own thread). */
void atap__pool_evacuate(struct worker *w);

/* pool_io.c. An idle worker (listed, its word read IDLE) waits on the hub's
 * io if it can take the seat, until a report or the pool's wake. IO_NONE:
 * another thread holds the seat (marked wanted now), or io failed: sleep
 * on the park word. IO_WOKEN: a wake: read the word again. IO_READ:
 * reports handed out, and the worker off the idle list (unless a waker
 * took it off first, whose word then stands): go and find work.
 * IO_TIMEOUT: timeout_ns passed with nothing read. */
enum { IO_NONE, IO_WOKEN, IO_READ, IO_TIMEOUT };
int atap__pool_idle_io(struct worker *w, uint64_t timeout_ns);
/* pool_io.c. A busy worker, every IO_EVERY_RUNS runs (w->io_runs): a look
 * at io, and at the timers that are due (the conf's due), so that
 * readiness and deadlines are heard while every worker is running. */
#define IO_EVERY_RUNS 61
void atap__pool_busy_io(struct worker *w);
/* pool.c. Wakes an idle blocking thread, or starts one, for work in the queue. */
void atap__pool_wake_blocker(void);
/* pool.c. The record's held[] back to its inline array (its thread is leaving). */
void atap__pool_held_reset(struct worker *w);
/* pool.c. The thread's loop, worker's or blocking thread's, on whichever
 * stack runs it; returns when the thread is to end. */
void atap__pool_loop(struct worker *w);

/* pool_aside.c. The thread's stacks: its own adopted at its start (lo,
 * size: the stack's bounds), every mapped one unmapped at its end. */
int atap__pool_stacks_begin(struct worker *w, char *lo, size_t size);
void atap__pool_stacks_end(struct worker *w);
/* pool_aside.c. A stack set aside may go on (woken, or its deadline
 * passed): the owner's switch point (at its loop's top) goes on with it,
 * the running stack becoming free. */
bool atap__pool_aside_pending(const struct worker *w);
void atap__pool_switch_point(struct worker *w);
/* pool_aside.c. More free stacks kept than an idle thread keeps, and
 * those unmapped (the thread idle for a while, none set aside). */
bool atap__pool_stacks_spare(const struct worker *w);
void atap__pool_stacks_shrink(struct worker *w);
/* pool_aside.c. In a fork's child: no stack is listed, nothing buried. */
void atap__pool_aside_forget(void);
/* pool_aside.c. The earliest deadline of w's stacks set aside, or
 * ATAP__FOREVER. */
uint64_t atap__pool_aside_due(const struct worker *w);
/* pool_aside.c. A dying thread, in thread_main's handler on its own stack
 * (pool_recover.c): the runs on that stack fail, every other stack of it
 * is unwound (pool_aside.c says how), and its stacks go to the graveyard;
 * those of threads that died are unmapped once every thread is joined
 * (the stop). */
void atap__pool_stacks_died(struct worker *w);
void atap__pool_stacks_reclaim(void);

/* pool_grow.c. What keeps work moving, every tick and in a drain: the live worker count. */
unsigned atap__pool_keep_going(void);
/* pool_recover.c. thread_main's cleanup handler: its thread dies under a task. */
void atap__pool_thread_died(void *arg);

#endif

/*
 * What the pool and the runtime need from the executor.
 */
#ifndef ATAP_EXECUTOR_H
#define ATAP_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "atap.h"
#include "pool.h"

struct worker;
struct atap_slot;
struct atap__extras;

/* The running task's view of itself (atap_ctx in atap.h). */
struct atap_ctx {
    struct atap_slot *slot; /* NULL inside atap_block */
    uint32_t index, gen;
    /* a park asked for in this run (park.c): kind 0 for none */
    uint8_t park_kind;
    uint8_t resumed; /* this run follows a park: ATAP_RESUME_* */
    bool in_block;   /* run by atap_block: a park waits on the caller */
    bool woke;       /* resumed by a wake (atap_wake) */
    unsigned events; /* park: the events asked for; resumed: those seen */
    int fd;
    uint64_t deadline;
    /* The run's arg, read before its function is called: the slot's, or,
     * for a wide output back from a park, its side record's (slot.h). */
    void *arg;
};

/* Claims and runs the queued task ref (slot index + 1) on this thread; a
 * task cancelled while queued is only cleaned up. The queue entry carried
 * the task's RUN reference, which this consumes. */
void atap__exec_run(struct worker *w, uint32_t ref);

/* The tail of a run: publish (rc 0) or fail, then the run's RUN reference
 * goes, or a repeat goes round. For a parked run taken down, too. */
void atap__exec_finish_run(struct atap_slot *s, uint32_t index, uint32_t gen, int rc);

/* The thread running ref is dying: the task settles FAILED and its RUN
 * reference is dropped. */
void atap__exec_fail_held(uint32_t ref);

/* The above, as the pool calls them (pool.h): given at the pool's start. */
extern const struct atap__pool_ops atap__exec_pool_ops;

struct atap_slot;

/* from -> to by CAS (same generation), waking listeners; false if the state
 * was not `from`. */
bool atap__exec_stop(struct atap_slot *s, uint32_t gen, uint32_t from, uint32_t to);
/* Ends a task that has not ended yet as `to`, then drops its RUN reference. */
void atap__exec_end(struct atap_slot *s, uint32_t index, uint32_t gen, uint32_t to);
/* Drops the RUN reference (idempotent per generation); may free the slot. */
void atap__exec_release_run(struct atap_slot *s, uint32_t index, uint32_t gen);

/* Drops one of the runtime's holds (a waker's, a helper's, a park's, the
 * feeders' of a waiting task): never a handle (atap_release). */
void atap__exec_release_listener(struct atap_slot *s, uint32_t index, uint32_t gen);

struct atap_ctx;
struct gate;

/* Wakes the task's listeners (its state moved on by an RMW that read
 * `old`, with WAITERS or ASIDE set: ST_LISTENED), and any join_first
 * waiting (atap__first_waiters). */
void atap__exec_wake(struct atap_slot *s, uint32_t old);
/* A wait's still() (pool_aside.c) for the task of generation gen in slot
 * s (read.c): sets ASIDE on the word while the task has not settled, by
 * an RMW even when the bit is already set, so that the settler's own RMW
 * reads this one and, with it, the stack's listing. */
struct atap__listen {
    struct atap_slot *s;
    uint32_t gen;
};
bool atap__exec_listen_aside(void *arg);
/* join_first callers asleep now, counted before they look (join.c). A
 * settle with WAITERS set reads it after its state CAS, which saw WAITERS:
 * the join_first that set it had counted itself first, so the read sees
 * it, and the settle then bumps the settle count join_first sleeps on
 * (atap__exec_settle_seq). A fork's child puts it back to 0 (gate.c). */
extern _Atomic uint32_t atap__first_waiters;
extern _Atomic uint32_t atap__exec_settle_seq;
/* The options' checks shared by every spawn: 0 or ATAP_EINVAL. waiting:
 * the fields of a task that waits for gives are allowed. */
int atap__exec_check(const struct atap_spawn_opts *o, bool waiting);
/* A freshly allocated slot filled for fn(arg) as o says (its output, its
 * destructors; no ext): 0, or -ENOMEM with nothing allocated. unfill
 * undoes it on a slot never published (an at-rate run's, rate.c). */
int atap__exec_fill(struct atap_slot *s, atap_fn *fn, void *arg, const struct atap_spawn_opts *o);
void atap__exec_unfill(struct atap_slot *s);
/* Spawns the task; gate (for a task that waits for gives) is owned by the
 * task from a 0 return on. */
int atap__exec_spawn(struct atap_task *task, atap_fn *fn, void *arg,
                     const struct atap_spawn_opts *o, struct gate *gate);
/* The slot behind a handle with a listener left, with its index and
 * generation; NULL if the handle names no task. */
struct atap_slot *atap__exec_live(struct atap_task t, uint32_t *index, uint32_t *gen);
/* One more hold on a task the caller holds a listener (or RUN) on. */
void atap__exec_hold(struct atap_slot *s);
/* One more hold on the task of generation gen, if it is still alive (it
 * holds RUN or a listener); false otherwise. Release it with
 * atap__exec_release_listener. */
bool atap__exec_try_hold(struct atap_slot *s, uint32_t gen);
/* atap_cancel's work on a task the caller holds (a handle, a hold, or its
 * series' list of runs): 0, or ATAP_ENOTASK when gen is gone. */
int atap__exec_cancel(struct atap_slot *s, uint32_t index, uint32_t gen);
/* The pool thread w is inside the task ref (slot index + 1): running it or
 * one of its at-rate runs, here or lower on the stack it runs on. A wait
 * for it could only end once the wait itself returned. */
bool atap__exec_inside(const struct worker *w, uint32_t ref);
/* The running task's slot (NULL inside atap_block or for NULL). */
struct atap_slot *atap__exec_ctx_slot(struct atap_ctx *ctx);

/* An output's heap block (slot.h: over INLINE_OUT bytes): up to OUT_BLOCK,
 * one of this thread's kept blocks of its size (pool.h); larger, its own
 * malloc (where a test build's owed allocation failures land). */
static inline void *atap__exec_out_alloc(size_t size)
{
    return size <= OUT_BLOCK ? atap__pool_out_take(atap__self, atap__pool_out_class(size))
                             : FAULT_MALLOC(size);
}

static inline void atap__exec_out_free(void *b, size_t size)
{
    if (size <= OUT_BLOCK)
        atap__pool_out_give(atap__self, atap__pool_out_class(size), b);
    else
        free(b);
}

/* spawn.c: admission of spawns from outside the pool, so a shutdown can
 * wait for every spawn that got past the door. */
bool atap__spawn_enter(bool *outside);
void atap__spawn_exit(bool outside);
/* spawn.c. The door spawns from outside the pool come in by: opened by the
 * runtime's start; shut by its last shutdown, which returns once every
 * spawn let in has queued; forgotten (shut, no one in) in a fork's child. */
void atap__exec_door_open(void);
void atap__exec_door_shut(void);
void atap__exec_door_forget(void);
/* With no runtime running: the door's way to mark a spawn (spawn.c's top):
 * the barrier if on and the system has one, else the count. Returns
 * whether it is the barrier (atap__test_door_barrier). */
bool atap__exec_door_barrier(bool on);
/* executor.c. The features' table (extras.h), given by the runtime once,
 * before its first start. */
void atap__exec_set_extras(const struct atap__extras *x);

#endif

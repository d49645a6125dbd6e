/*
 * Tracing (atap_trace_start / atap_trace_stop, ATAP_TRACE): the hooks the
 * other files call. Each hook is one line, ATAP_TRACE(...), that costs one
 * relaxed load and a branch predicted not taken while no trace runs. See
 * trace.c for the buffers and the writer.
 */
#ifndef ATAP_TRACE_H
#define ATAP_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "atap.h"
#include "atomics.h"

/* What a hook records. */
enum {
    TR_SPAWN = 1, /* task spawned: id, fn (a flow starts at it) */
    TR_RUN_BEGIN, /* a run starts on this thread: id, fn */
    TR_RUN_END,   /* the run returns: id, arg = its return code */
    TR_PARK,      /* the run parked: id, arg = the park's kind */
    TR_RESUME,    /* a run after a park starts: id, arg = resume reason */
    TR_CANCEL,    /* a cancel took the task: id */
    TR_TIMEOUT,   /* a run passed its limit: id */
    TR_GIVE,      /* a value given to a waiting task: id (a flow starts) */
    TR_GROW,      /* the pool started one more worker: arg = workers live */
    TR_MANAGER,   /* a manager's life starts: arg = restarts so far */
    TR_RESTART,   /* the supervisor restarts a dead manager: arg = failures */
    TR_THREAD,    /* a pool thread starts: arg = 1 for a blocking one */
    TR_ASIDE,     /* a wait set its stack aside: id = the stack's token, arg = stacks aside */
    TR_BACK,      /* a stack set aside goes on: id = its token, arg = stacks still aside */
};

/* TR_RUN_BEGIN's arg: the run was started by a give (the caller's), and
 * the task's first run (trace.c's, as it records). */
#define TR_GATED 1u
#define TR_FIRST_RUN 2u

extern _Atomic bool atap__trace_on;

/* This thread's lane in a trace, set by the runtime's own threads when
 * they start (pool.c, manager.c): a name, and a number after it (0: none).
 * A thread that sets nothing (the program's own) is named by the system's
 * thread name, else "thread". */
extern _Thread_local const char *atap__trace_lane;
extern _Thread_local unsigned atap__trace_lane_no;

void atap__trace_event(unsigned kind, uint64_t id, atap_fn *fn, uint64_t arg);

/* A task id as a handle carries it (handle.h): generation above, index below. */
#define ATAP_TRACE_ID(index, gen) ((uint64_t)(gen) << 32 | (uint32_t)(index))

/* ATAP_TRACE_HOOKS=0 (a compiler define) compiles the hooks away, traces
 * then being empty: only to measure what the hooks cost (bench/README.md). */
#ifndef ATAP_TRACE_HOOKS
#define ATAP_TRACE_HOOKS 1
#endif

#if ATAP_TRACE_HOOKS
#define ATAP_TRACE(kind, id, fn, arg)                                                              \
    do {                                                                                           \
        if (unlikely(ld_relaxed(&atap__trace_on)))                                                 \
            atap__trace_event((kind), (id), (fn), (uint64_t)(arg));                                \
    } while (0)
#else
#define ATAP_TRACE(kind, id, fn, arg) ((void)(id), (void)(fn), (void)(arg))
#endif

/* The count of runs open on this thread's running stack, which a stack
 * switch trades for the next stack's (pool_aside.c): each stack's runs nest
 * on their own, and the writer ends a stack's runs where it is set aside
 * and begins them again where it goes on. Returns the count it replaces. */
#if ATAP_TRACE_HOOKS
uint16_t atap__trace_depth_swap(uint16_t depth);
#else
#define atap__trace_depth_swap(depth) ((void)(depth), (uint16_t)0)
#endif

/* runtime.c: ATAP_TRACE read at the start (0, or what atap_trace_start
 * returned), and the trace it started ended at the stop. */
int atap__trace_env_start(void);
void atap__trace_runtime_stopped(void);
/* The child of a fork: no writer came along; the trace is off there. */
void atap__trace_forget(void);

#endif

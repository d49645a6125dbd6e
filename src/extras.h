/*
 * A task's extras: what the features (the layer above the executor) hang
 * on a slot, and the one table through which the executor reaches them.
 *
 *   time   slot->ext: start delays, run timeouts, repeats, at-rate series,
 *          and the gate of a task that waits for gives (schedule.c,
 *          rate.c; the schedule owns the gate);
 *   flow   REFS_RX / REFS_GATED and the forward list of the side record
 *          (side.h): forwards registered on the task, and what feeds a
 *          waiting one (gate.c, forward.c);
 *   park   the park record of a run that parked (on the side record, or
 *          in the slot's tail: park.c), and the kernel waits a cancel must
 *          interrupt (kwait.c, through park.c).
 *
 * The side record itself (side.h) is the executor's: made on first use,
 * freed with the slot.
 *
 * The executor (executor.c, spawn.c, read.c) names no feature's function:
 * it calls an entry here at the point of a task's life the entry is named
 * for, and only where the task may have that extra: time's for a slot with
 * an ext (and a spawn whose options ask for one), flow's for a task with
 * RX or GATED, park's for a run that asked for a park, a run whose word
 * was not PENDING when it was claimed (it may follow a park), a cancel
 * that found the task RUNNING, and a reader asking whether it waits. A
 * plain task's spawn, run and join never leave the executor. Each feature
 * defines its part (atap__sched_extras, atap__flow_extras,
 * atap__park_extras) and runtime.c puts them together in atap__extras
 * (executor.c's: atap__exec_set_extras), as
 * libuv's loop knows a handle's kind only through its callbacks. A new
 * kind of extra is a file of its own and a part here; the executor gains a
 * call only where a task's life has a new moment.
 */
#ifndef ATAP_EXTRAS_H
#define ATAP_EXTRAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atap.h"

struct atap_slot;
struct atap_ctx;
struct gate;
struct park;

/* Time and repeats: called for a task whose slot has an ext, but for check
 * and attach, which a spawn calls when its options need one, and gate,
 * which answers NULL for a task with none. */
struct atap__extras_time {
    /* Spawning: the options' own checks (0, ATAP_EINVAL, -ENOTSUP); an ext
     * for a freshly filled slot (gate: a task that waits for gives, the
     * ext's from a 0 return on; 0 or -ENOMEM); the slot published PENDING
     * with RUN: queue it, or arm its start delay. */
    int (*check)(const atap_spawn_opts *o);
    int (*attach)(struct atap_slot *s, uint32_t index, const atap_spawn_opts *o, struct gate *gate);
    void (*start)(struct atap_slot *s, uint32_t index, uint32_t gen, bool blocking);
    /* A run: claim one (false: nothing to run, and RUN was dealt with); the
     * output it writes; it returned rc: publish, and go round or end. */
    bool (*claim)(struct atap_slot *s, uint32_t *gen);
    void *(*output)(struct atap_slot *s);
    void (*done)(struct atap_slot *s, uint32_t gen, int rc);
    /* RUN is about to go for good: true keeps it (an at-rate series with
     * runs under way); the task is about to read FAILED otherwise than by
     * a run's return; whether state may still be cancelled; a cancel won. */
    bool (*ending)(struct atap_slot *s, uint32_t gen);
    void (*failing)(struct atap_slot *s);
    bool (*cancellable)(struct atap_slot *s, uint32_t state);
    void (*cancelled)(struct atap_slot *s, uint32_t index, uint32_t gen);
    /* Readers: no run follows; a taken output of a series that ran out
     * reads ATAP_EFINISHED; the output is held against the next run's
     * publish while it is copied. */
    bool (*finished)(struct atap_slot *s, uint32_t state);
    bool (*ran_out)(struct atap_slot *s);
    void (*read_lock)(struct atap_slot *s);
    void (*read_unlock)(struct atap_slot *s);
    /* An at-rate run's series (its handle's index and generation); false
     * for any other task. */
    bool (*series)(struct atap_slot *s, uint32_t *index, uint32_t *gen);
    /* The slot goes: the ext is let go of. */
    void (*destroy)(struct atap_slot *s);
    /* For gives and forwards (gate.c, forward.c, which sit below the
     * schedule that owns a waiting task's gate): the task's gate, or NULL
     * (any task); a give started a run or a series (the gate hands over
     * RUN): start it, after the start delay if any; under the gate's lock,
     * a give made the output PENDING again; no run follows (the task let
     * go); inside a run, the value it was handed; the number of the output
     * readable now (under the read lock); an at-rate series. */
    struct gate *(*gate)(struct atap_slot *s);
    void (*kick)(struct atap_slot *s, uint32_t index, uint32_t gen);
    void (*restarting)(struct atap_slot *s, uint32_t gen);
    void (*mark_finished)(struct atap_slot *s);
    const void *(*input)(struct atap_slot *s, size_t *size);
    uint64_t (*pubs)(struct atap_slot *s);
    bool (*at_rate)(struct atap_slot *s);
};

/* Gives and forwards: called for a task with a side record, RX or GATED. */
struct atap__extras_flow {
    /* RUN went with forwards registered (RX): they close, each one handing
     * on the task's end. */
    void (*close)(struct atap_slot *s);
    /* A task that waits for gives is waiting for one now (ATAP_WAITING). */
    bool (*waiting)(struct atap_slot *s);
    /* The last listener of a task that waits for gives is going while it
     * holds RUN: nothing can give to it any more. */
    void (*orphan)(struct atap_slot *s, uint32_t index, uint32_t gen);
};

/* Parks: a run that returned ATAP_PARKED having asked for one. */
struct atap__extras_park {
    /* The run parks: RUN goes with the park record. */
    void (*arm)(struct atap_slot *s, struct atap_ctx *ctx);
    /* A run that follows a park: true with ctx filled in (resumed, events),
     * false when the entry is no resume. */
    bool (*resume)(struct atap_slot *s, struct atap_ctx *ctx);
    /* A cancel won over a RUNNING task: wake it from a park or a kernel
     * wait. */
    void (*interrupt)(struct atap_slot *s, uint32_t index, uint32_t gen);
    /* Parked now (ATAP_WAITING). */
    bool (*parked)(struct atap_slot *s);
    /* The slot goes: its side record's park record (or NULL) is let go of. */
    void (*destroy)(struct park *p);
    /* A delayed start (spawn.c, SF_DELAYED): the task, just published
     * PENDING with its RUN, waits for its deadline as a deadline park does,
     * in its slot, and is queued for its first run then. */
    void (*delay)(struct atap_slot *s, uint32_t index, uint32_t gen, uint64_t deadline);
};

/* The longest delay a delayed start waits for in its slot (the park's
 * horizon, park_int.h, with room to spare); a longer one takes a
 * schedule. */
#define ATAP__DELAY_IN_SLOT_MAX (UINT64_C(1) << 45) /* 9.8 hours */

struct atap__extras {
    const struct atap__extras_time *time;
    const struct atap__extras_flow *flow;
    const struct atap__extras_park *park;
};

/* The table the executor reads (executor.c keeps it): runtime.c fills it
 * once, before its first start (atap__exec_set_extras), with the parts
 * the features declare in their headers. */
extern struct atap__extras atap__extras;

#endif

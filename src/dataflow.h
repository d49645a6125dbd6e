/*
 * Values between tasks: the gate of a task that waits for gives (gate.c),
 * the forwards of a task's outputs (forward.c).
 */
#ifndef ATAP_DATAFLOW_H
#define ATAP_DATAFLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

struct atap_slot;
struct gate;

/* ---- the gate: called by schedule.c and executor.c ---------------------- */

/* A run was claimed: the newest value given becomes the one it reads. */
void atap__gate_claim(struct gate *g);
/* The value runs read now (runner only). */
const void *atap__gate_current(struct gate *g, size_t *size);
/* A malloc'd copy of the newest value (claiming it first), for an at-rate
 * run; NULL on -ENOMEM. *size receives its size. */
void *atap__gate_snapshot(struct gate *g, size_t *size);
/* A run (ONCE) or series ended as it should: true when the gate keeps the
 * RUN reference (waiting again, or started again); false when the task is
 * done and the caller ends it. */
bool atap__gate_after(struct atap_slot *s, uint32_t index, uint32_t gen);
/* A run of a waiting task publishes (its output is in the slot): RUNNING ->
 * READY, or -> PENDING when a give during the run owes one more (a join
 * from that give on waits for that run), decided under the gate's lock
 * against the give; then *kept is set. False: the run no longer counts. */
bool atap__gate_publish(struct atap_slot *s, uint32_t gen, bool *kept);
/* A cancel won: a gate holding RUN between gives lets the task go. */
void atap__gate_cancelled(struct atap_slot *s, uint32_t index, uint32_t gen);
/* atap_state_of (the caller holds a listener): true when the task waits
 * for gives with nothing under way (its gate IDLE). A snapshot. */
bool atap__flow_waiting(struct atap_slot *s);
/* The task's RUN reference is going: no more gives. */
void atap__gate_end(struct gate *g);
/* The gate belongs to the slot at index from now on (spawn, admitted). */
void atap__gate_bind(struct gate *g, uint32_t index);
/* Shutdown, after the pool drained: idle waiting tasks are let go. */
void atap__flow_shutdown(void);
void atap__flow_forget(void); /* in a fork's child only (runtime.c) */
/* The slot is being freed: the values still held go (in_free). */
void atap__gate_destroy(struct gate *g);
/* The caller holds the last listener of a waiting task with RUN still
 * held, and is about to drop it: nobody can give any more. */
void atap__gate_orphan(struct atap_slot *s, uint32_t index, uint32_t gen);

/* What the executor calls (extras.h): close, waiting, orphan. */
struct atap__extras_flow;
extern const struct atap__extras_flow atap__flow_extras;

/* ---- forwards: called by the executor (extras.h) and schedule.c ---------- */

/* What deliveries leave for after the locks (forward.c): the targets they
 * started, to kick, and given values they displaced, whose in_free (a user
 * callback) must not run under the source's locks: KICK_DROPS in place,
 * more in `more` (malloc'd). atap__kicks_init makes one empty. */
#define KICK_DROPS 8
struct kick_drop {
    unsigned char *b;
    void (*in_free)(void *);
};
struct kicks {
    struct gate *head, *tail;
    unsigned ndrops, cap;
    struct kick_drop drops[KICK_DROPS], *more;
};

/* An empty list: only the counting fields set (drops[] is filled as used,
 * so a publish does not clear it each time). */
static inline void atap__kicks_init(struct kicks *k)
{
    k->head = k->tail = NULL;
    k->ndrops = k->cap = 0;
    k->more = NULL;
}

/* Output number `pub` just became readable (caller holds the output's
 * write lock): each forward that has not had it gets it, and what that
 * leaves for after the locks goes into *kicks, for the caller to run once
 * it let go of the write lock. */
void atap__flow_publish(struct atap_slot *s, uint64_t pub, struct kicks *kicks);
/* Kicks the targets in *kicks and lets go of the values it holds. No lock
 * of the source's may be held. */
void atap__flow_kicks_run(struct kicks *kicks);
/* The task's RUN reference went with RX set; the caller holds a listener
 * that keeps the slot: the last output goes to whoever has not had it, and
 * every forward closes. */
void atap__flow_close(struct atap_slot *s);

#endif

/*
 * What gate.c and forward.c share, and no one else (other layers use
 * dataflow.h). Values between tasks: tasks that wait for gives, and the
 * forwards that feed them from other tasks' outputs (atap_forward,
 * atap_receive_all / _any).
 *   gate.c     the gate: a waiting task's values and what a give may
 *              start, under the gate's spin lock (a leaf lock); receive_all
 *              rounds and receive_any members; the let-go of a task that
 *              can get nothing more; atap_spawn_waiting, atap_give,
 *              atap_input.
 *   forward.c  the forwards: a slot's side record and its list of regs,
 *              delivery, publish, close, attach; the kicks a delivery
 *              leaves for after the locks; atap_forward, atap_receive_*.
 *   settle.c   settle listeners: regs that feed no task but tell a
 *              callback or an fd that their task is over; atap_on_settle,
 *              atap_settle_fd.
 * Each file's top comment has its protocol.
 *
 * Lock order: output lock, then list mutex, then a target's gate; a target
 * started by a delivery is kicked after the delivery, with none of them
 * held (struct kicks: a repeat's publisher runs the list once it let go of
 * the output's write lock). The output lock is a source's out_lock
 * (schedule.c: no lock for a slot without a schedule, whose output never
 * changes), the list mutex its side record's (forward.c), a gate's spin
 * lock a leaf (gate.c). forward.c takes a target's gate lock only inside
 * the atap__gate_* calls below and in atap_forward's check, so always last.
 *
 * atap_join_first and atap_join_all are join.c's.
 */
#ifndef ATAP_DATAFLOW_INT_H
#define ATAP_DATAFLOW_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atap.h"
#include "atomics.h"
#include "dataflow.h"

struct atap_slot;

/* A gate's state (gate.c's top comment), and whom it serves. */
enum { G_IDLE, G_BUSY, G_OWED, G_DONE };
enum { ROLE_GIVE, ROLE_ALL, ROLE_ANY };

/* A task that waits for values: its gate (gate.c). */
struct gate {
    atap_spin lock;
    struct gate *prev, *next; /* every live gate, for shutdown (all_gates) */
    uint32_t index;           /* its slot */
    bool linked;
    uint8_t state, role;
    bool series; /* kind REPEAT or AT_RATE: a give starts a series */
    bool last;   /* the start under way is the last one */
    bool orphan; /* no handle or forward can give any more */
    /* regs feeding this task: the first holds it for all (one hold, not
     * one each: a receiver over a million members holds its slot once),
     * the last to close lets go. acq_rel: what a closing feeder delivered
     * reaches whoever frees, through the last one's release. */
    _Atomic size_t feeders;
    bool claimed; /* BUSY: the run has taken its value (ONCE) */
    bool has_pending, pending_owned, current_owned;
    uint32_t left; /* starts left; UINT32_MAX: no limit */
    uint32_t open; /* receive_any: members that may still publish */
    size_t in_size;
    void (*in_free)(void *);
    unsigned char *pending, *current, *spare;
    /* receive_all: the round being gathered (NULL once the last round went:
     * `last` is set then) */
    size_t n, nfilled, nclosed;
    uint64_t *filled; /* n bits */
    unsigned char *gathering;
    /* on a delivery's list of targets to kick (struct kicks) */
    struct gate *kick_next;
    uint32_t kick_gen;
};

/* What a reg is: a forward (or a receiver's member), or a settle
 * listener (settle.c), which is handed no output and only hears the
 * close. */
enum { REG_FEED, REG_SETTLE };

/* One forward: a task whose outputs feed the gate of task `to` (forward.c).
 * A REG_SETTLE reg is the head of a settle.c record, and uses no field
 * after `kind`. */
struct reg {
    struct reg *next;
    uint32_t to, to_gen; /* the task fed (index, generation) */
    uint32_t place;      /* receive_all: the member's place */
    uint8_t kind;        /* REG_FEED or REG_SETTLE */
    size_t offset;       /* receive_all: where its bytes go */
    uint64_t seen;       /* the last output number handed over */
};

/* ---- gate.c, for forward.c ----------------------------------------------- */

/* A gate of this role (ROLE_*), for n members (receive_*); NULL on -ENOMEM. */
struct gate *atap__gate_new(int role, const atap_spawn_opts *o, size_t in_size, size_t n);
/* Under the lock, for a gate not DONE: whether a give now would be taken. */
bool atap__gate_accepts(const struct gate *g);
/* Why a gate in this state takes no more gives. */
int atap__gate_closed_error(struct atap_slot *s);
/* Gives value (in_size bytes) to the task at index; what it starts goes now, or into kicks. */
int atap__gate_offer(struct atap_slot *s, uint32_t index, uint32_t gen, const void *value,
                     bool owned, struct kicks *kicks);
/* receive_all: member r's bytes for this round; a round made whole starts through kicks. */
void atap__gate_gather(struct atap_slot *s, uint32_t gen, const struct reg *r, const void *bytes,
                       size_t size, struct kicks *kicks);
/* Member (or forward) r can publish no more; no lock held, so it kicks what that starts. */
void atap__gate_member_closed(const struct reg *r);

/* ---- forward.c, for gate.c ----------------------------------------------- */

/* Notes target g (generation gen), which a give just moved IDLE -> BUSY, for kicks_run. */
void atap__flow_kicks_add(struct kicks *k, struct gate *g, uint32_t gen);

/* ---- forward.c, for settle.c --------------------------------------------- */

/* Registers r on the task s of generation gen, on which the caller holds a
 * handle: listed until the task's RUN goes, or closed at once when the
 * task is over already. 0; -ENOMEM or ATAP_ENOTASK, and then a REG_SETTLE
 * reg is left unlisted and unclosed, the caller's to free. */
int atap__flow_attach(struct atap_slot *s, uint32_t gen, struct reg *r);

/* ---- settle.c, for forward.c --------------------------------------------- */

/* Settle listener r, registered on the task s, is closed: the task can
 * publish no more. The caller holds a listener or RUN on s (its state is
 * final and readable) and none of its locks; r is freed, now or by what
 * it started. */
void atap__settle_closed(struct reg *r, struct atap_slot *s);

#endif

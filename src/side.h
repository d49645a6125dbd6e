/*
 * A slot's side record (slot->side): what a task needs only sometimes,
 * kept off the slot so that a plain task's slot stays small. Made on first
 * use (atap__side_of, one CAS: the first maker wins), or at spawn for a
 * task with a destructor (spawn.c), and freed with the slot (executor.c).
 * Once made it stays until the slot is freed, so anyone holding a
 * listener or RUN may read it.
 *
 *   arg_free, out_free  the spawn's destructors: written before the task
 *            is published, read by whoever frees the slot or drops an
 *            output (executor.c, schedule.c, rate.c);
 *   ext      the task's schedule (schedule.c), set before the task is
 *            published (slot flag SF_SCHED) and cleared when the slot is
 *            freed; read with acquire by the supervisor's rebuild of the
 *            timers, from any slot at any moment: while it looks, no side
 *            record is freed (atap__exec_sides_keep, executor.c);
 *   lock, closed, head  the forwards registered on the task (forward.c);
 *   park     the park record of a run that parked (park.c);
 *   fd, claim  a tail fd park's fd and claim word (park_fd.c, park_int.h's
 *            tail_claim), when the task's output leaves its tail no room;
 *   arg      a parked task's arg when its output lies over the slot's
 *            (SF_OUT_WIDE, slot.h): written by the run that parks, read by
 *            the next (park.c, executor.c). Such a task comes from a spawn
 *            with no destructor, so it shares arg_free's place, and only
 *            a task without SF_OUT_WIDE has its arg_free read.
 */
#ifndef ATAP_SIDE_H
#define ATAP_SIDE_H

#include <stdbool.h>
#include <stddef.h>

#include "atomics.h"
#include "slot.h"

struct park;
struct reg;

struct side {
    atap_spin lock;         /* the forward list (forward.c) */
    bool closed;            /* the list takes no more (forward.c) */
    int fd;                 /* a tail fd park's fd, when its tail has no room */
    _Atomic uint32_t claim; /* a tail park's claim, when its tail has no room */
    union {
        struct reg *head;      /* the forwards registered (forward.c) */
        struct side *deferred; /* freed while the timers are rebuilt (executor.c) */
    };
    struct park *_Atomic park; /* the run's park record (park.c) */
    union {
        void (*arg_free)(void *); /* never a wide output's task's: it has none */
        void *arg;                /* a wide output's task's, while it parks */
    };
    void (*out_free)(void *);
    void *_Atomic ext; /* the schedule (schedule.c) */
};

/* The slot's side record, made on first use. The caller holds a listener,
 * or RUN, or is filling the slot. NULL on -ENOMEM. */
struct side *atap__side_of(struct atap_slot *s);
/* The slot's side record goes (the slot is being freed, or was never
 * published), now or once a rebuild of the timers has looked. */
void atap__side_free(struct atap_slot *s);
/* The rebuild of the timers (schedule.c): while kept, a side record read
 * from any slot (with seq_cst) stays allocated; let go, those freed
 * meanwhile are. */
void atap__exec_sides_keep(void);
void atap__exec_sides_let_go(void);
/* In a fork's child (runtime.c): back to no rebuild under way. */
void atap__exec_sides_forget(void);

/* The side record if the slot has one (the caller holds a listener or RUN). */
static inline struct side *slot_side(const struct atap_slot *s)
{
    return ld_acquire(&((struct atap_slot *)s)->side);
}

static inline void (*slot_out_free(const struct atap_slot *s))(void *)
{
    struct side *x = slot_side(s);

    return x ? x->out_free : NULL;
}

#endif

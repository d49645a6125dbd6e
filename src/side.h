/*
 * A slot's side record (slot->side): what a task needs only sometimes,
 * made on first use (atap__side_of, one CAS: the first maker wins) and
 * freed with the slot (executor.c). The forwards registered on the task
 * live here (forward.c: the list, under `lock`), and so does the park
 * record of a run that parked (park.c). Once made it stays until the slot
 * is freed, so anyone holding a listener or RUN may read it.
 */
#ifndef ATAP_SIDE_H
#define ATAP_SIDE_H

#include <pthread.h>
#include <stdbool.h>

#include "atomics.h"

struct atap_slot;
struct park;
struct reg;

struct side {
    pthread_mutex_t lock;      /* the forward list (forward.c) */
    bool closed;               /* the list takes no more (forward.c) */
    struct reg *head;          /* the forwards registered (forward.c) */
    struct park *_Atomic park; /* the run's park record (park.c) */
};

/* The slot's side record, made on first use. The caller holds a listener,
 * or RUN. NULL on -ENOMEM. */
struct side *atap__side_of(struct atap_slot *s);

#endif

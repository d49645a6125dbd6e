/*
 * The manager thread and its supervisor (manager.c).
 */
#ifndef ATAP_MANAGER_H
#define ATAP_MANAGER_H

#include <stdbool.h>
#include <stddef.h>

struct atap_timers;

/* Starts the supervisor, which starts the manager. 0 or -errno. */
int atap__manager_start(void);
/* Stops and joins both; every timer still armed is let go of, unfired. */
void atap__manager_stop(void);
void atap__manager_forget(void); /* in a fork's child only (runtime.c) */
/* Makes the manager look at its timers now (any thread). */
void atap__manager_wake(void);

/* Set on the manager's and the supervisor's threads: a callback they run
 * (an arg_free, an out_free) must not wait for the runtime to stop. */
extern _Thread_local bool atap__manager_thread;

bool atap__manager_alive(void); /* a manager is running */
bool atap__manager_gone(void);  /* the supervisor gave up */
bool atap__manager_stopped(void); /* stopped, its timer structure gone */
/* Whether an armed timer will be fired: false once a shutdown or the
 * supervisor giving up closed the structure (seq_cst, see schedule.c). */
bool atap__manager_accepting(void);
unsigned atap__manager_restarts(void);
/* Timer records the last restart filed again from the task table. */
size_t atap__manager_refiled(void);

/* The runtime's timer structure (the manager drives it). */
struct atap_timers *atap__manager_timers(void);
/* The manager's poller (opened by the first start, kept for the process's
 * life): parked tasks' fds are watched on it. */
struct atap_poller *atap__manager_poller(void);

#endif

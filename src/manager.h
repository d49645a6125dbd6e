/*
 * The manager thread and its supervisor (manager.c).
 */
#ifndef ATAP_MANAGER_H
#define ATAP_MANAGER_H

#include <stdbool.h>
#include <stddef.h>

#include "hub.h" /* what it drives: the timers, the poller, its life */

/* Starts the supervisor, which starts the manager. 0 or -errno. */
int atap__manager_start(void);
/* Stops and joins both; every timer still armed is let go of, unfired. */
void atap__manager_stop(void);
void atap__manager_forget(void); /* in a fork's child only (runtime.c) */

/* Set on the manager's and the supervisor's threads: a callback they run
 * (an arg_free, an out_free) must not wait for the runtime to stop. */
extern _Thread_local bool atap__manager_thread;

bool atap__manager_alive(void); /* a manager is running */
unsigned atap__manager_restarts(void);
/* Timer records the last restart filed again from the task table. */
size_t atap__manager_refiled(void);

#endif

/*
 * Waiting inside a task (park.c, park_fd.c, park_wheel.c): kernel waits a
 * cancel interrupts, and parks, which give the thread back until an fd or
 * a deadline.
 */
#ifndef ATAP_PARK_H
#define ATAP_PARK_H

#include <stdbool.h>
#include <stdint.h>

#include "timer.h"

struct atap_ctx;
struct atap_slot;

/* What the executor calls (extras.h): arm, resume, interrupt, parked. */
struct atap__extras_park;
extern const struct atap__extras_park atap__park_extras;

/* The run in ctx returned ATAP_PARKED after asking for a park: the park
 * takes the run's RUN reference; the task runs again when it is claimed. */
void atap__park_arm(struct atap_slot *s, struct atap_ctx *ctx);
/* At the start of a run: true when this queue entry is a park's resume
 * (ctx gets the reason; the park record goes). */
bool atap__park_resume(struct atap_slot *s, struct atap_ctx *ctx);
/* A wait nothing interrupts (kwait.c): until deadline (precise: spinning
 * the last 500 us), or, with fd >= 0, until fd is ready for events. As
 * atap_wait_fd returns. */
int atap__plain_wait(uint64_t deadline, bool precise, int fd, unsigned events);
/* The task (index, gen) was just cancelled or timed out while RUNNING: a
 * park it sleeps in is taken down, a kernel wait it is in is woken. */
void atap__park_interrupt(struct atap_slot *s, uint32_t index, uint32_t gen);

/* atap_state_of (the caller holds a listener): true while the task is
 * parked, or being parked (the claim ARMING or ARMED). A snapshot. */
bool atap__park_parked(struct atap_slot *s);

/* atap_wake's work: true when the task (index, gen) was still running
 * (parked or about to be): the wake reaches it; false when it has ended. */
bool atap__park_wake(uint32_t index, uint32_t gen);

/* Signals (park.c, sources.c), for the public signal calls (park.c).
 * catchable: a signal atap_park_signal takes. catch: our handler takes it
 * over now (0 or -errno). release: its default disposition again (0 or
 * -errno). count: its deliveries the handler has seen, ever. poke: its
 * parks resume as if it had come, and nothing is counted. */
bool atap__signal_catchable(int signo);
int atap__signal_catch(int signo);
int atap__signal_release(int signo);
uint64_t atap__signal_count(int signo);
void atap__signal_poke(int signo);
/* atap_park_signal_since's mark in a park's events: the count seen, on its
 * low 31 bits (sources.c resumes the park at once when it has moved). */
#define ATAP__SIG_SINCE 0x80000000u
#define ATAP__SIG_SEEN_MASK 0x7fffffffu

/* Manager: a watch for parks reported events (udata, events and kind from
 * its poller, or from the hub's io at its tick). A timed park it claims it
 * completes itself if it holds the wheel's seat, else leaves to the holder. */
void atap__park_event(void *udata, unsigned events, unsigned kind);
/* Any other thread (a pool thread that read the hub's io): the same for a
 * parked fd's report; it is not the wheel's holder, so a timed park it
 * claims is left to the manager (park_fd.c). */
void atap__park_io_event(void *udata, unsigned events, unsigned kind);
/* The wheel's seat (park_wheel.c): the manager takes it while awake and
 * gives it back before it sleeps. False: a worker holds it; the manager
 * goes on without the wheel, and is woken once the worker gives it back. */
bool atap__park_wheel_take(void);
void atap__park_wheel_give(void);
bool atap__park_wheel_mine(void); /* this thread holds the seat */
/* The manager, about to give the seat back (if it holds it) and sleep
 * until `until` at the latest: says so to arms, which then wake it only if
 * due before that, and takes in those that came since its run (now: its
 * clock). Returns when to wake: until, or earlier for those. */
uint64_t atap__park_wheel_sleep(uint64_t until, uint64_t now);
/* The manager, back from its sleep: arms wake nobody until it sleeps again. */
void atap__park_wheel_awake(void);
/* The seat's holder, each pass: acts on the deadline parks that are due;
 * returns when it must look again (UINT64_MAX: none waits). */
uint64_t atap__park_wheel_run(uint64_t now);
/* When the wheel's last run said to look again (UINT64_MAX: none waits),
 * as busy workers read it (tests read it to see a park filed). */
uint64_t atap__park_wheel_due(void);
/* The word behind it, for the pool's idle workers to read inline. */
const _Atomic uint64_t *atap__park_wheel_due_word(void);
/* A busy worker between runs: if the wheel's next due tick is past and
 * the seat is free, runs the wheel on this thread (a load and a compare
 * when nothing is due). */
void atap__park_wheel_help(void);
/* Manager: frees the park records let go of that its timer structure no
 * longer holds (all: it holds none; also shutdown's last step). */
void atap__park_reap(bool all);
void atap__park_forget(void); /* in a fork's child only (runtime.c) */
/* Parks on a deadline ended by it, since the process started, and of
 * those how many ended more than 1 ms and 10 ms after it (park_wheel.c):
 * out[0..2]. Relaxed reads: each count a value it had. */
void atap__park_fire_counts(uint64_t out[3]);
/* The slot is being freed: its park record goes (through the manager if
 * its timer may still be held). NULL is ignored. */
struct park;
void atap__park_destroy(struct park *p);
/* The manager starts: parks are taken. */
void atap__park_open(void);
/* Between two managers' lives: visits the timer record of every park that
 * has one armed (the parks' registry). */
void atap__park_find_timers(atap__timer_visit *visit, void *cookie);
/* Between two managers' lives: every parked fd and source is watched
 * again, so nothing the dead manager was told and did not hand out is lost. */
void atap__park_rearm(void);
/* The last shutdown, after the parks are written off (runtime.c): the
 * signal pipe and the inotify fd are closed, opened again when needed. */
void atap__sources_close(void);
/* Manager, each tick: a parked fd whose watch failed is watched again, and
 * looked at while its watch still fails; a signal or path source whose
 * watch failed is read as if reported and watched again. One relaxed load
 * each when none. */
void atap__park_retry(void);
/* No manager will run again (shutdown, or its supervisor gave up): every
 * park is written off as FAILED, and later parks fail at once. */
void atap__park_close_all(void);

#endif

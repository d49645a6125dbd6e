/*
 * The runtime's lifecycle: STOPPED -> STARTING -> RUNNING -> STOPPING ->
 * STOPPED, one word, every transition a seq_cst CAS or store.
 *
 * Users: the same word counts the atap_init calls not yet paired with an
 * atap_shutdown (users << 2 | state), so that several libraries in one
 * program can each init and shut down. The init that finds STOPPED starts
 * the runtime (STARTING, then RUNNING with one user); one that finds
 * RUNNING adds a user by CAS; a shutdown that finds more than one user
 * takes one away by CAS; the one that finds the last user moves the word
 * to STOPPING (no users) and stops. Count and state change in one CAS, so
 * an init can never count itself into a runtime that a last shutdown has
 * begun to stop: it finds STOPPING, waits it out, and starts afresh.
 *
 * Admission (spawn.c's door): opened just before the word reads RUNNING,
 * shut by the last shutdown before it drains, which waits there for every
 * spawn from outside the pool already let in. Spawns from inside a task
 * are part of the work being drained and are always let in.
 *
 * fork(): only the forking thread goes on in the child, so a runtime the
 * parent runs has no thread there. A pthread_atfork child handler
 * (registered by the first atap_init) puts every layer back to "stopped",
 * as before the first init: the lifecycle, its count of users (0: the
 * child's own atap_init starts a runtime and is its first user) and the
 * admission counts, the pool's
 * records, counts and queues, the manager and supervisor state, the timer
 * structure, parks, sources and gates, and a new, empty table whose
 * generations start above all of the parent's (table.c), so a handle from
 * before the fork reads ATAP_ENOTASK and nothing waits on a task that can
 * never run. The fds the parent's runtime owns (its pollers' epoll/kqueue
 * and wake fds, per-thread event queues, the signal pipe, inotify) are the
 * parent's open files, shared across the fork: the child closes them and
 * never uses them. The parent's memory (records, outputs, arguments) is
 * left unfreed: no destructor of the parent's runs in the child.
 *
 * Locks: the child takes fresh ones (each module's forget stores an
 * initialiser), rather than taking every lock in a prepare handler. Taking
 * them in prepare would make fork wait for pool threads that may hold a
 * lock across a blocking step, and order the library's locks against the
 * program's own atfork handlers; and the child keeps nothing a lock guarded,
 * so a lock that a vanished thread held has nothing consistent to protect.
 * The handler makes only plain stores, close() and munmap() (all
 * async-signal-safe) and pthread_setspecific. The parent handler is none:
 * the parent is untouched. Starting again (atap_init) then needs malloc
 * and pthread_create, which POSIX does not promise after a multithreaded
 * fork but glibc, musl and the BSDs provide (atap.h says so).
 * A fork made inside a task or a callback leaves a child that is still in
 * the middle of the parent's task: such a child may only exec or _exit.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abi.h"
#include "atap.h"
#include "atomics.h"
#include "dataflow.h"
#include "executor.h"
#include "extras.h"
#include "hub.h"
#include "manager.h"
#include "park.h"
#include "pool.h"
#include "schedule.h"
#include "side.h"
#include "table.h"
#include "testing.h"
#include "trace.h"

#define STOPPED 0u
#define STARTING 1u
#define RUNNING 2u
#define STOPPING 3u
#define STATE_MASK 3u
#define USER_ONE 4u                  /* one user, in the lifecycle word */
#define USERS_FULL (UINT32_MAX - 7u) /* past this, an init is refused */

#define DEFAULT_WORKERS_PER_CORE 4u
#define DEFAULT_BLOCKING_PER_CORE 8u
#define DEFAULT_STACK ((size_t)8 << 20)
#define MIN_STACK ((size_t)16 << 10)

_Static_assert(POOL_MAX_THREADS == ATAP_THREADS_MAX, "atap.h says how many threads a pool has");

static _Atomic uint32_t lifecycle = STOPPED;

static uint32_t life_state(uint32_t w) { return w & STATE_MASK; }

static void poll_pause(void)
{
    struct timespec ms = {0, 1000000};

    nanosleep(&ms, NULL);
}

/* Why this thread's last atap_init failed, or what went wrong in it that
 * did not stop it (atap_init_error); "" when nothing did. */
static _Thread_local char init_error[256];

/* Sets init_error as printf would; returns rc. */
__attribute__((format(printf, 2, 3))) static int init_fail(int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(init_error, sizeof init_error, fmt, ap);
    va_end(ap);
    return rc;
}

const char *atap_init_error(void) { return init_error; }

/* Reads a config of any size (abi.h): known fields copied, unknown ones
 * must be 0; size 0 is the layout of 0.1. */
static int read_config(const atap_config *in, atap_config *out)
{
    size_t size;

    memset(out, 0, sizeof *out);
    if (!in)
        return 0;
    memcpy(&size, in, sizeof size);
    if (atap__struct_in(out, sizeof *out, in, ATAP__CONFIG_FIRST) != 0)
        return init_fail(ATAP_EINVAL,
                         "atap_config.size %zu: below %zu, or sets bytes past the %zu "
                         "this library knows",
                         size, sizeof(size_t), sizeof *out);
    if (out->worker_stack && out->worker_stack < MIN_STACK)
        return init_fail(ATAP_EINVAL, "atap_config.worker_stack %zu: below %zu bytes",
                         out->worker_stack, MIN_STACK);
    if (out->workers > ATAP_THREADS_MAX)
        return init_fail(ATAP_EINVAL, "atap_config.workers %u: above %u", out->workers,
                         (unsigned)ATAP_THREADS_MAX);
    if (out->blocking_threads > ATAP_THREADS_MAX)
        return init_fail(ATAP_EINVAL, "atap_config.blocking_threads %u: above %u",
                         out->blocking_threads, (unsigned)ATAP_THREADS_MAX);
    return 0;
}

/* An environment override (ATAP_WORKERS, ATAP_BLOCKING_THREADS): unset or
 * empty leaves *n alone; else decimal digits only, 0 (the default) up to
 * ATAP_THREADS_MAX, or ATAP_EINVAL (a sign, a blank, a suffix, too large),
 * the variable and its value named in init_error. */
static int env_count(const char *name, unsigned *n)
{
    const char *v = getenv(name), *c;
    unsigned long got = 0;

    if (!v || !*v)
        return 0;
    for (c = v; *c; c++) {
        if (*c < '0' || *c > '9' || (got = got * 10 + (unsigned long)(*c - '0')) > ATAP_THREADS_MAX)
            return init_fail(ATAP_EINVAL, "%s=\"%.64s%s\": not a number from 0 to %u", name, v,
                             strlen(v) > 64 ? "..." : "", (unsigned)ATAP_THREADS_MAX);
    }
    *n = (unsigned)got;
    return 0;
}

/* The features, as the executor reaches them (extras.h): the layers meet
 * here, at the top, so that the executor names none of them. Given once,
 * before the first start (pthread_once orders it before every task). */
static pthread_once_t extras_once = PTHREAD_ONCE_INIT;

static void extras_give(void)
{
    atap__exec_set_extras(&(struct atap__extras){
        .time = &atap__sched_extras,
        .flow = &atap__flow_extras,
        .park = &atap__park_extras,
    });
}

/* What the pool starts with: the config's counts, else the environment's,
 * else per CPU (config wins, atap.h). The environment is read only where
 * the config leaves a count at 0. */
static int pool_conf(const atap_config *cfg, struct atap__pool_conf *pc)
{
    int rc;

    pc->ops = &atap__exec_pool_ops;
    pc->io_event = atap__park_io_event;       /* parked fds' reports, read by pool threads */
    pc->due = atap__park_wheel_help;          /* deadlines the manager is late for */
    pc->due_at = atap__park_wheel_due_word(); /* and when the next is due */
    pc->workers = cfg->workers;
    pc->blocking = cfg->blocking_threads;
    if ((!pc->workers && (rc = env_count("ATAP_WORKERS", &pc->workers)) != 0) ||
        (!pc->blocking && (rc = env_count("ATAP_BLOCKING_THREADS", &pc->blocking)) != 0))
        return rc;
    pc->workers_per_cpu = cfg->workers_per_core ? cfg->workers_per_core : DEFAULT_WORKERS_PER_CORE;
    pc->blocking_per_cpu =
        cfg->blocking_per_core ? cfg->blocking_per_core : DEFAULT_BLOCKING_PER_CORE;
    pc->stack = cfg->worker_stack ? cfg->worker_stack : DEFAULT_STACK;
    return 0;
}

/* Set on the thread inside atap_shutdown: an arg_free or out_free the
 * shutdown itself runs (a delay written off, a waiting task let go). */
static _Thread_local bool in_shutdown;

/* A thread the runtime waits for while it stops: a pool thread, the
 * manager or its supervisor, or the one running atap_shutdown. */
static bool on_runtime_thread(void) { return atap__self || atap__manager_thread || in_shutdown; }

/* The child of a fork: see the top comment. Table last: the others only
 * drop what points at its slots. */
static void fork_child(void)
{
    atap__pool_forget();
    atap__manager_forget();
    atap__park_forget();
    atap__sched_forget();
    atap__flow_forget();
    atap__table_forget();
    atap__trace_forget();
    atap__exec_door_forget();
    atap__exec_sides_forget();
    in_shutdown = false;
    st_seqcst(&lifecycle, STOPPED); /* and no users: the parent's are not the child's */
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_rc;

static void atfork_register(void) { atfork_rc = -pthread_atfork(NULL, NULL, fork_child); }

/* ATAP_TRACE, at the start: a trace that cannot be started leaves the
 * runtime untraced, and says why on stderr and in init_error (atap.h). */
static void trace_env(void)
{
    int rc = atap__trace_env_start();

    if (rc != 0) {
        init_fail(rc, "ATAP_TRACE=%.128s: not traced: %s", getenv("ATAP_TRACE"), atap_strerror(rc));
        fprintf(stderr, "libatap: %s\n", init_error);
    }
}

/* The init that found STOPPED (the word reads STARTING): starts the pool
 * and the manager, then RUNNING with one user, or STOPPED on a failure. */
static int start(const atap_config *cfg)
{
    struct atap__pool_conf pc;
    int rc;

    if ((rc = pool_conf(cfg, &pc)) == 0) {
        trace_env();
        if ((rc = atap__pool_start(&pc)) != 0)
            init_fail(rc, "starting the pool's threads: %s", atap_strerror(rc));
        else if ((rc = atap__manager_start()) != 0) {
            init_fail(rc, "starting the manager thread: %s", atap_strerror(rc));
            atap__pool_stop();
        }
    }
    if (rc != 0)
        atap__trace_runtime_stopped(); /* an ATAP_TRACE it started */
    else
        atap__exec_door_open();
    st_seqcst(&lifecycle, rc == 0 ? RUNNING | USER_ONE : STOPPED);
    return rc;
}

int atap_init(const atap_config *config)
{
    atap_config cfg;
    uint32_t w;
    int rc;

    init_error[0] = '\0';
    if ((rc = read_config(config, &cfg)) != 0)
        return rc;
    pthread_once(&atfork_once, atfork_register);
    if (atfork_rc != 0)
        return init_fail(atfork_rc, "pthread_atfork: %s", atap_strerror(atfork_rc));
    pthread_once(&extras_once, extras_give);
    for (;;) {
        w = ld_seqcst(&lifecycle);
        if (life_state(w) == RUNNING) {
            /* Running: one more user; the running config stands. */
            if (w >= USERS_FULL)
                return init_fail(-EOVERFLOW, "more than %u users", USERS_FULL / USER_ONE);
            if (cas_seqcst(&lifecycle, &w, w + USER_ONE))
                return 0;
        } else if (life_state(w) == STOPPED) {
            if (cas_seqcst(&lifecycle, &w, STARTING))
                return start(&cfg);
        } else if (on_runtime_thread()) {
            /* The shutdown under way waits for this thread. */
            return init_fail(ATAP_EINVAL, "a shutdown under way waits for this thread");
        } else {
            poll_pause(); /* a start or a shutdown is under way: wait it out */
        }
    }
}

/* The last user's shutdown (the word reads STOPPING): drains, then stops. */
static void stop(void)
{
    in_shutdown = true;     /* a callback it runs here must not wait for it */
    atap__exec_door_shut(); /* and every spawn from outside let in has queued */
    /* The manager first: what it would still start (delays, gaps, periods)
     * is written off as FAILED, and a repeat ends at its next turn; then the
     * pool drains what is queued or running. */
    atap__manager_stop();
    atap__pool_stop();
    atap__flow_shutdown(); /* tasks left waiting for a give */
    /* What the last tasks left to the reapers (schedules and parks freed
     * with them after the manager's last reap): nothing runs now. */
    atap__sched_reap(true);
    atap__park_reap(true);
    /* No thread of the runtime is left: the fds it opened go (the pool's
     * thread queues went with its stop); the next start opens its own. */
    atap__sources_close();
    atap__hub_close();
    atap__trace_runtime_stopped(); /* an ATAP_TRACE trace is complete now */
    st_seqcst(&lifecycle, STOPPED);
    in_shutdown = false;
}

int atap_shutdown(void)
{
    uint32_t w;

    for (;;) {
        w = ld_seqcst(&lifecycle);
        if (life_state(w) == STOPPED)
            return 0; /* no user left to let go */
        if (life_state(w) == RUNNING && w >= RUNNING + 2 * USER_ONE) {
            /* Not the last user: only the count goes, from any thread. */
            if (cas_seqcst(&lifecycle, &w, w - USER_ONE))
                return 0;
            continue;
        }
        if (on_runtime_thread())
            return ATAP_EINVAL; /* it would wait for the thread calling it */
        if (life_state(w) == RUNNING) {
            if (cas_seqcst(&lifecycle, &w, STOPPING)) {
                stop();
                return 0;
            }
        } else {
            poll_pause(); /* another start or shutdown: wait for it to finish */
        }
    }
}

bool atap_initialised(void) { return life_state(ld_seqcst(&lifecycle)) == RUNNING; }

int atap__test_door_barrier(bool on)
{
    if (atap_initialised())
        return ATAP_EBUSY;
    return atap__exec_door_barrier(on);
}

int atap__test_flush_caches(void)
{
    if (atap_initialised())
        return ATAP_EBUSY;
    atap__table_flush_caches();
    return 0;
}

/* status and stats are filled whole here, then copied out as far as the
 * caller's struct goes (abi.h). */
int atap_status_sized(struct atap_status *status, size_t size)
{
    struct atap_status all = {0};
    struct atap_pool_stats st = {0};
    uint32_t life = life_state(ld_seqcst(&lifecycle));

    if (!status)
        return ATAP_EINVAL;
    atap__pool_stats(&st);
    all.initialised = life == RUNNING;
    all.shutting_down = life == STOPPING;
    all.manager_alive = life == RUNNING && atap__manager_alive();
    all.healthy = all.manager_alive && st.workers > 0;
    return atap__struct_out(status, size, &all, sizeof all);
}

int atap_pool_stats_sized(struct atap_pool_stats *stats, size_t size)
{
    struct atap_pool_stats all = {0};

    if (!stats)
        return ATAP_EINVAL;
    atap__pool_stats(&all);
    all.live = atap__table_live();
    all.slots = atap__table_span();
    all.peak_slots = atap__table_peak();
    {
        uint64_t f[3];

        atap__park_fire_counts(f);
        all.fired = f[0], all.fired_1ms = f[1], all.fired_10ms = f[2];
    }
    return atap__struct_out(stats, size, &all, sizeof all);
}

int atap_stats_format(char *buf, size_t n, const struct atap_pool_stats *stats)
{
    struct atap_pool_stats now;
    const struct atap_pool_stats *st = &now;

    if (!buf && n > 0)
        return ATAP_EINVAL;
    if (!stats)
        atap_pool_stats(&now);
    else if (atap__struct_in(&now, sizeof now, stats, ATAP__STATS_FIRST) != 0)
        return ATAP_EINVAL;
    return snprintf(buf, n,
                    "workers=%zu busy=%zu blocking_threads=%zu blocking_busy=%zu queued=%zu "
                    "live=%zu slots=%zu peak_slots=%zu peak_workers=%zu deaths=%llu "
                    "completed=%llu aside=%zu ceiling=%zu peak_aside=%zu stacks=%zu fired=%llu "
                    "fired_1ms=%llu fired_10ms=%llu",
                    st->workers, st->busy, st->blocking_threads, st->blocking_busy, st->queued,
                    st->live, st->slots, st->peak_slots, st->peak_workers,
                    (unsigned long long)st->deaths, (unsigned long long)st->completed, st->aside,
                    st->ceiling, st->peak_aside, st->stacks, (unsigned long long)st->fired,
                    (unsigned long long)st->fired_1ms, (unsigned long long)st->fired_10ms);
}

int atap_trim(size_t *released) { return atap__table_trim(released); }

#define STR_(x) #x
#define STR(x) STR_(x)

const char *atap_version_string(void)
{
    return STR(ATAP_VERSION_MAJOR) "." STR(ATAP_VERSION_MINOR) "." STR(ATAP_VERSION_PATCH);
}

uint32_t atap_version_hex(void) { return ATAP_VERSION_HEX; }

const char *atap_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
    case ATAP_ENOTINIT:
        return "no runtime is running";
    case ATAP_EALREADY:
        return "a trace is already being written";
    case ATAP_ENOTREADY:
        return "the task has not settled yet";
    case ATAP_ETAKEN:
        return "the output was taken";
    case ATAP_EFINISHED:
        return "the task has finished";
    case ATAP_ECANCELLED:
        return "the task was cancelled";
    case ATAP_ETIMEDOUT:
        return "a run passed its timeout";
    case ATAP_EFAILED:
        return "the task failed";
    case ATAP_ENOTASK:
        return "no task behind the handle";
    case ATAP_EINVAL:
        return "invalid argument";
    case ATAP_EBUSY:
        return "nothing worth giving back";
    case ATAP_ECLOSED:
        return "closed";
    case ATAP_ETOOLONG:
        return "too long";
    case ATAP_ELIMIT:
        return "a limit of the pool was reached";
    }
    if (code < 0 && code > -4096)
        return strerror(-code);
    return "unknown error";
}

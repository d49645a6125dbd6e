/*
 * The manager: the one thread that owns time. It sleeps in the event backend
 * until the earliest timer or a wake, fires the timers that are due, and
 * every MANAGER_TICK applies the pool policy (atap__pool_tick) and has
 * each kind of park watch again what it failed to watch: a parked fd, a
 * signal or path source (atap__park_retry). It never runs a task. The pool
 * finds its own work whether a manager runs or not, and its tick goes on
 * without one (below).
 *
 * A supervisor thread runs the manager and restarts it when it dies (the
 * first start it makes is the runtime's: atap__manager_start waits for it,
 * and fails if the thread is refused, rather than start a runtime whose
 * supervisor would soon give up on a manager that never ran): after
 * RESTART_BACKOFF x consecutive failures; the count starts over once a
 * manager has lived RESTART_WINDOW; past RESTART_LIMIT failures within that
 * window the supervisor gives up on the manager (timers and parks are then
 * written off, see close_timers) and runs the pool's tick itself until the
 * shutdown (gone_ticks). The timer structure and the poller belong
 * to the runtime and outlive one manager's life, but a new manager does not
 * trust what the last one left filed: before each new life the supervisor
 * (the only thread that may touch the structure while no manager runs)
 * rebuilds it from the task table (atap__timers_rebuild): it lets go of
 * every filed record and files again each one that the table's schedules
 * and armed parks show still armed, for its latest arming. So every delay,
 * gap, period and timeout comes back, none is lost, and none fires twice
 * (a record fires only through the CAS on its latest arming). The other
 * thing a manager may die holding is what its last wait reported and it had
 * not yet handed out: the supervisor also watches every parked fd and
 * source again (atap__park_rearm), and the kernel reports afresh whatever
 * is still ready.
 *
 * Lifecycle: the hub's state (hub.h) is RUNNING while a manager lives,
 * RESTARTING between lives, GONE once the supervisor gave up, STOPPED after
 * a shutdown. `stop`
 * is set once by atap__manager_stop, which then wakes the poller and the
 * supervisor's backoff sleep, and joins the supervisor (which joined the
 * manager): nothing of the manager runs after it returns. The poller is
 * opened once and kept for the process's life, so a wake from any thread at
 * any moment (even racing a shutdown) pokes a live object. The one
 * exception is the child of a fork, whose only thread closes the parent's
 * poller fds and forgets the poller before anything can wake it
 * (atap__manager_forget, runtime.c); its next start opens its own.
 */
#include "manager.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "atomics.h"
#include "faults.h"
#include "hub.h"
#include "park.h"
#include "poller.h"
#include "pool.h"
#include "schedule.h"
#include "testing.h"
#include "timer.h"
#include "trace.h"
#include "wait.h"

#define MANAGER_TICK_NS 10000000u       /* 10 ms */
#define RESTART_BACKOFF_NS 10000000u    /* x consecutive failures */
#define RESTART_WINDOW_NS 5000000000ull /* a life this long resets the count */
#define RESTART_LIMIT 5

/* The poller, the timers and the life state are the hub's (hub.h): the
 * features reach them there. */
static struct {
    pthread_t supervisor;
    _Atomic uint32_t stop; /* futex word: the supervisor's backoff sleeps on it */
    _Atomic unsigned restarts;
    _Atomic size_t refiled; /* by the last rebuild */
    /* futex word: the first start of the manager, 0 until the supervisor
     * has tried it, then FIRST_STARTED or FIRST_REFUSED (first_errno) */
    _Atomic uint32_t first;
    int first_errno;
} mgr;

#define FIRST_STARTED 1u
#define FIRST_REFUSED 2u

#ifdef ATAP_FAULT_INJECTION
static _Atomic unsigned owed_faults;

void atap_inject_manager_faults(unsigned n)
{
    add_relaxed(&owed_faults, n); /* no wake: taken when the wait next returns */
}
#define MANAGER_FALLS_APART() atap__fault_take(&owed_faults)
#define FORGET_FAULTS() st_relaxed(&owed_faults, 0)

/* How long a life must last to start the count of failures over (testing.h):
 * a test that kills the manager many times in a row sets it to 0. */
static _Atomic uint64_t restart_window = RESTART_WINDOW_NS;

uint64_t atap__test_restart_window(uint64_t ns) { return xchg_relaxed(&restart_window, ns); }
#define RESTART_WINDOW() ld_relaxed(&restart_window)
#else
#define RESTART_WINDOW() RESTART_WINDOW_NS
#define FORGET_FAULTS() ((void)0)
#define MANAGER_FALLS_APART() false
#endif

/* One life of the manager. Returns true if it died, false if stopped. */
static bool manager_life(void)
{
    struct atap_poller_event events[16];
    uint64_t now = atap__now_ns(), next_tick = now + MANAGER_TICK_NS, wake_at, park_at;
    bool wheel;
    int n;

    while (!ld_acquire(&mgr.stop)) {
        now = atap__now_ns();
        wake_at = atap__timers_run(&atap__hub.timers, now);
        /* The wheel's seat, held until this thread sleeps (park_wheel.c):
         * a worker holding it fires what is due itself, and wakes this
         * thread when it gives the seat back. Meanwhile the wheel sets no
         * time to wake at: its last due time has passed (that is why the
         * worker took it), and waiting for that would spin here, taking
         * the CPU from the holder it waits for. */
        wheel = atap__park_wheel_take();
        park_at = wheel ? atap__park_wheel_run(now) : ATAP__FOREVER;
        wake_at = park_at < wake_at ? park_at : wake_at;
        atap__sched_flush();
        atap__sched_reap(false);
        atap__park_reap(false);
        if (now >= next_tick) {
            atap__pool_tick(now);
            atap__park_retry(); /* a parked fd or source whose watch failed */
            /* io, if no worker has read it for a tick (all in long runs) */
            atap__pool_io_look(MANAGER_TICK_NS, atap__park_event);
            next_tick = now + MANAGER_TICK_NS;
        }
        wake_at = wake_at < next_tick ? wake_at : next_tick;
        /* Arms due from wake_at on leave this thread asleep (park_wheel.c). */
        wake_at = atap__park_wheel_sleep(wake_at, now);
        if (wheel)
            atap__park_wheel_give();
        n = atap__poller_wait(ld_relaxed(&atap__hub.poller), events, 16,
                              wake_at > now ? wake_at - now : 0);
        atap__park_wheel_awake();
        if (n < 0)
            return true; /* the backend failed under us: die and be restarted */
        if (MANAGER_FALLS_APART())
            return true; /* the worst moment: holding events nobody was given */
        TEST_HOOK(ATAP__TEST_MANAGER_AWAKE);
        /* What parked tasks wait on; a timed park's end is the seat's
         * holder's (park_fd.c), so the seat is taken for them too. */
        wheel = n > 0 && atap__park_wheel_take();
        for (int i = 0; i < n; i++)
            atap__park_event(events[i].udata, events[i].events, events[i].kind);
        if (wheel)
            atap__park_wheel_give();
    }
    return false;
}

_Thread_local bool atap__manager_thread;

static void *manager_main(void *arg)
{
    (void)arg;
    atap__manager_thread = true;
    atap__trace_lane = "atap-manager";
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "atap-manager");
#elif defined(__APPLE__)
    pthread_setname_np("atap-manager");
#endif
    ATAP_TRACE(TR_MANAGER, 0, NULL, ld_relaxed(&mgr.restarts));
    return manager_life() ? (void *)1 : NULL;
}

/* Sleeps ns unless a stop comes first. */
static void backoff(uint64_t ns)
{
    uint64_t end = atap__deadline_in(ns), now;

    while (!ld_acquire(&mgr.stop) && (now = atap__now_ns()) < end)
        atap__word_wait(&mgr.stop, 0, end - now);
}

/* No manager will run again: every task a timer would have started again is
 * written off. An arm racing this sees `closed` after its arm and disarms
 * (schedule.c); take_all and that disarm decide who writes the task off. */
static void close_timers(void)
{
    st_seqcst(&atap__hub.closed, true);
    /* Store against store with an arm (its seq_cst push, then its look at
     * closed): the fence keeps the store before take_all's exchange. */
    fence_seqcst();
    atap__timers_take_all(&atap__hub.timers, atap__sched_write_off, NULL);
    atap__park_close_all(); /* parks, whether they have a timer or not */
}

/* What the timer structure holds is found again from the task table:
 * every schedule's records, and every armed park record's. */
static void find_timers(atap__timer_visit *visit, void *cookie, void *arg)
{
    (void)arg;
    atap__sched_find_timers(visit, cookie);
    atap__park_find_timers(visit, cookie);
}

/* No manager will run again: the supervisor keeps the tick's duties that
 * need no timer until the shutdown. The pool's policy (a worker for stuck
 * ones, a LIFO task handed to an idle peer, idle threads reaped) and the
 * reaping of schedules and parks the closed timers let go. Exclusive with
 * the drain's keep_going as the manager's tick is: the shutdown joins this
 * thread before it drains. Reaping: emptied, but an arm racing the close
 * may still sit in the inbox (its caller disarmed it): each pass frees
 * only what nothing holds; the rest goes at shutdown, after the structure
 * is let go. */
static void gone_ticks(void)
{
    do {
        atap__sched_reap(false);
        atap__park_reap(false);
        atap__pool_tick(atap__now_ns());
        backoff(MANAGER_TICK_NS);
    } while (!ld_acquire(&mgr.stop));
}

static void *supervisor_main(void *arg)
{
    unsigned failures = 0;
    pthread_t manager;
    void *died;

    (void)arg;
    atap__manager_thread = true;
    atap__trace_lane = "atap-supervisor";
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "atap-supervisor");
#elif defined(__APPLE__)
    pthread_setname_np("atap-supervisor");
#endif
    while (!ld_acquire(&mgr.stop)) {
        uint64_t born = atap__now_ns();
        int rc;

        st_release(&atap__hub.state, HUB_RUNNING);
        rc = pthread_create(&manager, NULL, manager_main, NULL);
        if (ld_relaxed(&mgr.first) == 0) { /* atap__manager_start waits for this */
            mgr.first_errno = rc;
            st_release(&mgr.first, rc == 0 ? FIRST_STARTED : FIRST_REFUSED);
            atap__word_wake(&mgr.first, true);
            if (rc != 0)
                return NULL; /* no runtime: its start fails */
        }
        if (rc != 0)
            died = (void *)1;
        else
            pthread_join(manager, &died);
        if (!died)
            break; /* stopped */
        st_release(&atap__hub.state, HUB_RESTARTING);
        add_relaxed(&mgr.restarts, 1);
        failures = atap__now_ns() - born >= RESTART_WINDOW() ? 1 : failures + 1;
        if (failures > RESTART_LIMIT) {
            FORGET_FAULTS(); /* what was owed died with the supervisor */
            close_timers();
            st_release(&atap__hub.state, HUB_GONE);
            gone_ticks(); /* no manager runs now: its tick is ours */
            return NULL;
        }
        ATAP_TRACE(TR_RESTART, 0, NULL, failures);
        backoff((uint64_t)RESTART_BACKOFF_NS * failures);
        st_relaxed(&mgr.refiled, atap__timers_rebuild(&atap__hub.timers, find_timers, NULL));
        atap__park_rearm(); /* what the dead one was told, told again */
    }
    /* Not HUB_STOPPED here: that says the timer structure is let go (records
     * are then freed at once, schedule.c and park.c), which only
     * atap__manager_stop's close does, after this thread is joined. */
    return NULL;
}

int atap__manager_start(void)
{
    struct atap_poller *p = ld_acquire(&atap__hub.poller);
    int rc;

    if (!p) { /* once: starts are serialised by the runtime's lifecycle */
        if ((rc = atap__poller_open(&p)) != 0)
            return rc;
        st_release(&atap__hub.poller, p);
    }
    if (!ld_acquire(&atap__hub.io)) { /* the same, for parked fds (hub.h) */
        if ((rc = atap__poller_open(&p)) != 0)
            return rc;
        st_release(&atap__hub.io, p);
    }
    atap__timers_init(&atap__hub.timers, atap__now_ns());
    atap__park_open();
    st_relaxed(&mgr.stop, 0);
    st_relaxed(&mgr.restarts, 0);
    st_seqcst(&atap__hub.closed, false);
    st_release(&atap__hub.state, HUB_RUNNING);
    st_relaxed(&mgr.first, 0);
    if ((rc = pthread_create(&mgr.supervisor, NULL, supervisor_main, NULL)) != 0) {
        st_release(&atap__hub.state, HUB_STOPPED);
        return -rc;
    }
    /* A manager that could never start would leave a runtime that says it
     * runs and drops every timer once its supervisor gives up: the start
     * fails instead, as when the supervisor cannot start. */
    while (ld_acquire(&mgr.first) == 0)
        atap__word_wait(&mgr.first, 0, ATAP__FOREVER);
    if (ld_acquire(&mgr.first) == FIRST_REFUSED) {
        pthread_join(mgr.supervisor, NULL);
        st_release(&atap__hub.state, HUB_STOPPED);
        return -mgr.first_errno;
    }
    return 0;
}

void atap__manager_stop(void)
{
    if (ld_acquire(&atap__hub.state) == HUB_STOPPED)
        return;
    st_release(&mgr.stop, 1);
    atap__word_wake(&mgr.stop, true);
    atap__poller_wake(ld_acquire(&atap__hub.poller));
    pthread_join(mgr.supervisor, NULL);
    TEST_HOOK(ATAP__TEST_MANAGER_JOINED);
    /* No manager runs now: the structure is ours. What is still armed will
     * never fire: written off (a delay pending at shutdown reads FAILED). */
    if (ld_acquire(&atap__hub.state) != HUB_GONE)
        close_timers();
    atap__timers_destroy(&atap__hub.timers);
    atap__sched_reap(true); /* the structure holds nothing now */
    atap__park_reap(true);
    st_release(&atap__hub.state, HUB_STOPPED);
}

bool atap__manager_alive(void) { return ld_acquire(&atap__hub.state) == HUB_RUNNING; }

unsigned atap__manager_restarts(void) { return ld_relaxed(&mgr.restarts); }

size_t atap__manager_refiled(void) { return ld_relaxed(&mgr.refiled); }

/* In a fork's child (its one thread; runtime.c): no manager nor supervisor
 * came along. The pollers' fds (the hub's poller and io) are the parent's
 * own epoll/kqueue and wake events, shared across the fork: closed, never
 * used (a watch added here would land in the parent's interest list), so
 * the next start opens new ones. The timer structure's records belong to
 * the parent's tasks: let go unfreed; the next start initialises it
 * afresh. */
void atap__manager_forget(void)
{
    struct atap_poller *ps[2] = {ld_relaxed(&atap__hub.poller), ld_relaxed(&atap__hub.io)};

    for (int k = 0; k < 2; k++) {
        int fds[4], n = ps[k] ? atap__poller_fds(ps[k], fds, 4) : 0;

        for (int i = 0; i < n; i++)
            close(fds[i]);
    }
    memset(&mgr, 0, sizeof mgr);
    atap__hub_forget(); /* HUB_STOPPED, no poller, not closed, no wake counted */
    FORGET_FAULTS();
    atap__manager_thread = false;
}

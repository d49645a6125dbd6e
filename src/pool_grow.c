/*
 * How many threads the pool runs: one more worker when every worker is
 * stuck, the idle worker that idled longest reaped, zombie threads joined.
 * The manager's tick (atap__pool_tick) comes here; pool.c starts and wakes
 * the threads.
 *
 * Waits inside tasks take no thread: a wait sets its stack aside
 * (pool_aside.c) and its worker goes on working, so the pool never grows
 * for waits, only for workers stuck in a call of their own.
 *
 * Growth and reaping (the manager's tick, atap__pool_tick; the supervisor's
 * once the manager is gone for good, manager.c): one more worker when
 * every worker is stuck (inside a task with nothing finished for a tick
 * and off the CPU: sleeping in a call of its own, not merely waiting for a
 * CPU on a busy machine) and work waits, up to the
 * target, past it only under overload, never past the ceiling (what the
 * kernel would give: the memory, RLIMIT_NPROC, the cgroup's pids.max and
 * RLIMIT_AS; atap__pool_ceiling_read). A start the kernel refuses lowers
 * the ceiling to the workers there are, and a tick that would grow past the
 * ceiling reads the limits again (at most every CEILING_READ_TICKS), so it
 * rises again once they do; the idle worker that
 * idled longest goes after 500 ms (50 ms above the target), never below
 * the floor, nor one with stacks set aside (their waits end on it).
 * Blocking threads stop on their own after 500 ms idle (but with stacks
 * set aside), with no floor, and number at most the cap. The
 * floor (the workers started at init), the target and the cap come from
 * atap_config or the environment (runtime.c), else from the CPUs the
 * process may run on (cpus.c), never the machine's core count. The live counts (nlive, blive) are
 * the truth, changed under the pool lock: a thread told to go is counted
 * out by whoever decides it (reap, a blocking thread timing out) and marked
 * `uncounted`, so neither its exit nor its death counts it out again, and a
 * dying thread that was counted is replaced before its record reads DEAD
 * (so the records can read one live thread too many, never too few).
 */
#include "pool.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"
#include "pool_int.h"
#include "table.h"
#include "trace.h"
#include "wait.h"

/* ---- one more worker ----------------------------------------------------- */

#define CEILING_READ_TICKS 100 /* the limits read again at most this often: 1 s */

/* Starts one more worker, up to the ceiling; false if none was started
 * for want of a thread (the ceiling, or a refused start). At the ceiling,
 * the kernel's limits are read again first (outside the lock: a few small
 * files), at most every CEILING_READ_TICKS; a refused start lowers the
 * ceiling to the workers running (never below the floor). The tick and a
 * drain are the only callers, one at a time, so ceiling_read_at is theirs. */
static bool add_worker(void)
{
    unsigned live = ld_relaxed(&atap__pool.nlive), read = 0;
    bool ok = true, refused = false;

    if (live >= ld_relaxed(&atap__pool.ceiling) &&
        atap__pool.ticks - atap__pool.ceiling_read_at >= CEILING_READ_TICKS) {
        atap__pool.ceiling_read_at = atap__pool.ticks;
        read = atap__pool_ceiling_read(live);
    }
    pthread_mutex_lock(&atap__pool.lock);
    if (!ld_relaxed(&atap__pool.stopping)) {
        live = ld_relaxed(&atap__pool.nlive);
        if (read)
            st_relaxed(&atap__pool.ceiling, read);
        ok = live < ld_relaxed(&atap__pool.ceiling) &&
             !(refused = atap__pool_start_thread(false, NULL) != 0);
        if (ok)
            ATAP_TRACE(TR_GROW, 0, NULL, ld_relaxed(&atap__pool.nlive));
        if (refused) /* what the kernel gives is what runs */
            st_relaxed(&atap__pool.ceiling, live > atap__pool.floor ? live : atap__pool.floor);
        st_relaxed(&atap__pool.refused, !ok);
    }
    pthread_mutex_unlock(&atap__pool.lock);
    return ok;
}

/* ---- the tick: growth and reaping -------------------------------------- */

#define REAP_IDLE_NS 500000000u     /* an idle worker above the floor goes */
#define REAP_IDLE_OVER_NS 50000000u /* ... sooner above the target */
#define OVERLOAD_RATIO 64           /* queued per worker that counts as overload */
#define TRIM_EVERY_TICKS 500        /* about 5 s */

/*
 * Asleep in the kernel (a wait, or a task holding the thread in a call of
 * its own), as opposed to running or runnable: a thread woken but still
 * waiting for a CPU on a busy machine is not asleep. Linux says so in the
 * thread's stat (S or D); elsewhere there is no cheap way to tell, and the
 * answer is yes, as it was before anyone asked.
 */
static bool asleep(struct worker *w)
{
#if defined(__linux__)
    char path[64], buf[512], *paren;
    ssize_t got;
    int fd;

    snprintf(path, sizeof path, "/proc/self/task/%d/stat", ld_relaxed(&w->tid));
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return true; /* can't tell: as before, asleep */
    got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0)
        return true;
    buf[got] = '\0';
    /* "tid (name) S ...": the state follows the last ')'. */
    if (!(paren = strrchr(buf, ')')) || paren[1] != ' ')
        return true;
    return paren[2] == 'S' || paren[2] == 'D';
#else
    (void)w;
    return true;
#endif
}

/*
 * Off the CPU over the last tick: asleep, as opposed to running, or
 * waiting for a CPU on a busy machine. Only the first answers growth: more
 * threads would not make a saturated machine any faster. Where asleep()
 * cannot tell, the thread's CPU clock standing still over the tick says
 * the same. The tick's only.
 */
static bool off_cpu(struct worker *w, unsigned i)
{
#if defined(__linux__)
    (void)i;
    return asleep(w);
#else
    clockid_t clock;
    struct timespec ts;
    uint64_t cpu;

    if (pthread_getcpuclockid(w->thread, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return true;
    cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (cpu != atap__pool.last_cpu[i]) {
        atap__pool.last_cpu[i] = cpu;
        return false;
    }
    return true;
#endif
}

/* Every live worker stuck in a task: inside one with nothing finished
 * since the last tick and off the CPU; the live ones counted in *live. The
 * cheap half of the test first, for every worker: the kernel is asked
 * about their states only when every one of them passes it, and only
 * until one fails. */
static bool all_stuck(unsigned *live)
{
    unsigned n = ld_acquire(&atap__pool.nrec);
    bool maybe = true;

    *live = 0;
    for (unsigned i = 0; i < n; i++) {
        struct worker *w = &atap__pool_workers[i];
        uint64_t done = ld_relaxed(&w->completed);

        if (ld_acquire(&w->status) != W_LIVE)
            continue;
        (*live)++;
        if (!(ld_relaxed(&w->busy) && done == atap__pool.last_done[i]))
            maybe = false;
        atap__pool.last_done[i] = done;
    }
    for (unsigned i = 0; maybe && i < n; i++)
        if (ld_acquire(&atap__pool_workers[i].status) == W_LIVE &&
            !off_cpu(&atap__pool_workers[i], i))
            maybe = false;
    return maybe && *live > 0;
}

/* Stops the idle worker that has idled longest, if past the limit. */
static void reap(uint64_t now, unsigned live)
{
    uint64_t limit = live > atap__pool.target ? REAP_IDLE_OVER_NS : REAP_IDLE_NS;
    struct worker *w, *oldest = NULL;

    if (live <= atap__pool.floor)
        return;
    pthread_mutex_lock(&atap__pool.lock);
    /* The count, under the lock: the records can read one too many, since a
     * dying worker's reads LIVE until after its replacement is up. */
    if (ld_relaxed(&atap__pool.nlive) <= atap__pool.floor) {
        pthread_mutex_unlock(&atap__pool.lock);
        return;
    }
    /* One with stacks set aside stays: their waits end on it. Written by
     * the worker before it listed itself, under this lock. */
    for (w = atap__pool.idle; w; w = w->idle_next)
        if (w->naside == 0 && (!oldest || w->idle_since < oldest->idle_since))
            oldest = w;
    /* idle_since can be later than `now`, read before the lock. */
    if (oldest && now > oldest->idle_since && now - oldest->idle_since >= limit &&
        !ld_relaxed(&atap__pool.stopping)) {
        atap__pool_unlink_from(&atap__pool.idle, &atap__pool.nidle, oldest);
        /* Counted out now, so the next look is exact even before it has
         * gone; it leaves without counting itself out again. */
        sub_relaxed(&atap__pool.nlive, 1);
        oldest->uncounted = true;
        atap__pool_unpark(oldest, PARK_STOP);
    }
    pthread_mutex_unlock(&atap__pool.lock);
}

/* What keeps work moving, every tick, and during a shutdown's drain (the
 * manager is stopped by then): returns the live worker count. */
unsigned atap__pool_keep_going(void)
{
    unsigned running;
    bool stuck = all_stuck(&running);
    size_t queued = atap__inj_len(&atap__pool.inj);

    /* Work in a LIFO slot or a ring woke nobody: hand it to an idle peer. */
    if (ld_relaxed(&atap__pool.nidle) > 0 && ld_relaxed(&atap__pool.nsearching) == 0 &&
        atap__pool_work_visible(true))
        atap__pool_notify();
    /* Every worker stuck (a task holding it in a call of its own) at two
     * ticks in a row, and work waiting: one more,
     * up to the target; past it only under overload. Two, because one
     * look reads the workers one after the other: in a tree of joins one
     * may wake just after it was read asleep, and the other fall asleep
     * waiting for it just before. */
    atap__pool.stuck_ticks = stuck ? atap__pool.stuck_ticks + 1 : 0;
    if (atap__pool.stuck_ticks >= 2 && atap__pool_work_visible(true) &&
        (running < atap__pool.target || queued >= (size_t)running * OVERLOAD_RATIO))
        add_worker();
    /* Below the floor (a replacement was refused): one more a tick. And a
     * blocking task with no blocking thread to run it (its start was
     * refused): start one. */
    if (ld_relaxed(&atap__pool.nlive) < atap__pool.floor)
        add_worker();
    if (ld_relaxed(&atap__pool.blive) == 0 && !atap__inj_empty(&atap__pool.binj))
        atap__pool_wake_blocker();
    return ld_relaxed(&atap__pool.nlive);
}

/* Joins the zombies (pool lock not held: a destructor still running on
 * one may take it). With glibc only those already gone, so the manager
 * never waits on one; elsewhere all, each long past its DEAD mark (a
 * destructor there that waits for the manager would hold the tick up). */
static void reap_zombies(void)
{
    pthread_t got[64];
    unsigned n = 0;

    pthread_mutex_lock(&atap__pool.lock);
#if defined(__GLIBC__)
    for (unsigned i = 0; i < atap__pool.nzombies;)
        if (pthread_tryjoin_np(atap__pool.zombies[i], NULL) == 0)
            atap__pool.zombies[i] = atap__pool.zombies[--atap__pool.nzombies];
        else
            i++;
#else
    while (atap__pool.nzombies > 0 && n < 64)
        got[n++] = atap__pool.zombies[--atap__pool.nzombies];
#endif
    pthread_mutex_unlock(&atap__pool.lock);
    for (unsigned i = 0; i < n; i++)
        pthread_join(got[i], NULL);
}

void atap__pool_tick(uint64_t now)
{
    unsigned live = atap__pool_keep_going();

    reap(now, live);
    reap_zombies();
    if (++atap__pool.ticks % TRIM_EVERY_TICKS == 0 && ld_relaxed(&atap__pool.nidle) == live &&
        !atap__pool_work_visible(true))
        atap__table_trim(NULL);
}

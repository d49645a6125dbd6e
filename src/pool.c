/*
 * The pool: workers, their parking, blocking threads, and the recovery of a
 * thread that dies under a task.
 *
 * Finding work (find_work): the LIFO slot (at most LIFO_STREAK times in a
 * row), the own ring, a batch from the shared queue (the rest of the batch
 * goes into the ring, where peers can steal it), the LIFO slot again, then
 * stealing half of a peer's ring, or its LIFO slot.
 *
 * Parking, with no lost wake. Counters: nidle (workers on the idle list)
 * and nsearching (workers woken to look for work and not yet settled).
 *   queuer: queue the task; seq_cst fence; if nidle > 0 and nobody is
 *           searching, CAS nsearching 0 -> 1 and wake one idle worker.
 *   parker: under the lock, join the idle list and nidle++; seq_cst fence;
 *           look at every queue once more; leave the list if work shows.
 * The two fences order each side's store before its load, so either the
 * queuer sees nidle > 0 or the parker's last look sees the task. When the
 * queuer sees a searcher instead, that searcher either parks (and its last
 * look, after the queuer's fence, sees the task) or finds work and, being
 * the last searcher, wakes the next worker if work remains (leave_search).
 * So at most one searcher is woken per burst of spawns and no task waits
 * while a worker sleeps. A task put into a worker's LIFO slot wakes nobody:
 * its spawner runs it next. If the spawner then waits for something other
 * than a join, the manager's tick hands the slot to an idle peer, and a
 * worker blocked in a wait wakes one itself (atap__pool_blocked).
 *
 * Waits inside tasks (help.c picks what a waiting thread may run): a
 * waiting thread runs only work the awaited task needs, nested on its
 * stack while the stack has room; else it blocks, counted in nblocked, and
 * its core is lent: an idle worker is woken, or one more started when no
 * worker is left unblocked, else by the tick, which counts a blocked
 * worker as stuck. Every worker the pool may have blocked with the
 * awaited task still queued is a stall (atap__pool_stalled): one waiter at
 * a time gives up with ATAP_ELIMIT.
 *
 * Growth and reaping (the manager's tick, atap__pool_tick; the supervisor's
 * once the manager is gone for good, manager.c): one more worker when
 * every worker is stuck (blocked in a wait, or inside a task with nothing
 * finished for a tick and off the CPU: sleeping in a call of its own, not
 * merely waiting for a CPU on a busy machine) and work waits, up to the
 * target, past it only under overload, never past the ceiling (the memory
 * and the process's thread limit: thread_ceiling); the idle worker that
 * idled longest goes after 500 ms (50 ms above the target), never below
 * the floor. Blocking threads stop on their
 * own after 500 ms idle, with no floor, and number at most the cap. The
 * floor (the workers started at init), the target and the cap come from
 * atap_config or the environment (runtime.c), else from the CPUs the
 * process may run on (cpus.c), never the machine's core count. The live counts (nlive, blive) are
 * the truth, changed under the pool lock: a thread told to go is counted
 * out by whoever decides it (reap, a blocking thread timing out) and marked
 * `uncounted`, so neither its exit nor its death counts it out again, and a
 * dying thread that was counted is replaced before its record reads DEAD
 * (so the records can read one live thread too many, never too few).
 *
 * A worker's park word: RUNNING, IDLE (on the list, may sleep), NOTIFIED
 * (taken off the list by a waker, counted as searching) or STOP.
 *
 * Records: a thread's record reads DEAD last thing, and its thread may
 * still run thread-local destructors after that (one may spawn, and take
 * the pool lock). A DEAD record is taken again without joining its thread
 * under the lock: the thread goes on a zombie list, joined off the lock by
 * the tick (with glibc only once it is gone) and at stop.
 *
 * Thread death: a task that calls pthread_exit unwinds its thread through
 * the cleanup handler pushed in thread_main. It fails every task the thread
 * was inside (held[], outermost first, including runs nested by helping),
 * each as a failed run ends (a series with its run, an at-rate run telling
 * its series), moves the thread's queued tasks to the shared queue, starts a
 * replacement, and marks the record DEAD last, so that whoever joins a DEAD
 * record never waits on a thread that still needs the pool lock.
 *
 * Shutdown drains: it waits until every worker is idle, every queue empty
 * and no blocking task runs, checked under an epoch that moves whenever a
 * thread may start running (taken off an idle list, or started), then stops
 * and joins every thread (quiescent() says why one look is enough). The
 * manager is stopped by then, so the drain makes the tick's hand-offs itself
 * (keep_going).
 */
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <time.h>
#include <unistd.h>

#include "atap.h"
#include "atomics.h"
#include "cpus.h"
#include "executor.h"
#include "poller.h"
#include "slot.h"
#include "table.h"
#include "trace.h"
#include "wait.h"

#define W_FREE 0
#define W_LIVE 1
#define W_DEAD 2

#define PARK_RUNNING 0u
#define PARK_IDLE 1u
#define PARK_NOTIFIED 2u
#define PARK_STOP 3u

#define INJ_BATCH 16
#define SPIN_ROUNDS 200 /* about 20-50 us of looking before a worker parks */
#define BLOCKING_IDLE_NS 500000000u /* a blocking thread idle this long stops */

_Thread_local struct worker *atap__self;

static struct worker workers[POOL_MAX_THREADS];
static struct worker blockers[POOL_MAX_THREADS];

static struct {
    struct injector inj;  /* for workers */
    struct injector binj; /* for blocking threads */
    pthread_mutex_t lock; /* idle list, starting and joining threads */
    struct worker *idle;
    _Atomic unsigned nrec, nlive, nidle, nsearching, peak, nblocked;
    unsigned floor, target, ceiling; /* fewest, usual most, and most workers */
    _Atomic bool refused;   /* the last worker start was refused */
    _Atomic uint64_t stall_at; /* when a waiter last got ATAP_ELIMIT */
    _Atomic uint64_t stalls;
    uint64_t last_done[POOL_MAX_THREADS]; /* manager: completed at the last tick */
#if !defined(__linux__)
    uint64_t last_cpu[POOL_MAX_THREADS]; /* manager: CPU time at the last look */
#endif
    unsigned ticks;                       /* manager: ticks since start */
    _Atomic uint64_t epoch; /* moves when a thread leaves an idle list or starts */
    _Atomic bool stopping;
    struct worker *bidle_list; /* idle blocking threads (pool lock) */
    _Atomic unsigned brec, blive, bidle, bbusy;
    unsigned bcap;
    size_t stack;
    _Atomic uint64_t deaths;
    /* Threads whose records were taken again before they were joined (pool
     * lock): joined later, never under the lock (claim_record says why). */
    pthread_t zombies[POOL_MAX_THREADS];
    unsigned nzombies;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *thread_main(void *arg);

/* ---- starting threads (pool lock held) --------------------------------- */

/*
 * A record to start a thread in: a FREE one, or a DEAD one. A DEAD record's
 * thread no longer touches it (the record reads DEAD last; its later
 * destructors run as an outside thread's), but it may still be running
 * them, and one may spawn, which takes this lock: joining it here would
 * deadlock. So its thread goes on the zombie list, joined with no lock
 * held (reap_zombies, atap__pool_stop). With the list full (no tick has
 * joined any for a long while) the record is taken only if its thread has
 * already gone (glibc's tryjoin), else passed over.
 */
static struct worker *claim_record(struct worker *recs, _Atomic unsigned *nrec, struct worker *self)
{
    unsigned n = ld_relaxed(nrec);

    for (unsigned i = 0; i < n; i++) {
        int st = ld_acquire(&recs[i].status);

        if (st == W_FREE)
            return &recs[i];
        if (st == W_DEAD && &recs[i] != self) {
            if (pool.nzombies < POOL_MAX_THREADS)
                pool.zombies[pool.nzombies++] = recs[i].thread;
#if defined(__GLIBC__)
            else if (pthread_tryjoin_np(recs[i].thread, NULL) != 0)
                continue;
#else
            else
                continue;
#endif
            st_relaxed(&recs[i].status, W_FREE);
            return &recs[i];
        }
    }
    if (n == POOL_MAX_THREADS)
        return NULL;
    /* Release: a scanner that sees the new count sees a FREE record. */
    st_release(nrec, n + 1);
    return &recs[n];
}

static int start_thread(bool blocking, struct worker *self)
{
    struct worker *w = claim_record(blocking ? blockers : workers,
                                    blocking ? &pool.brec : &pool.nrec, self);
    pthread_attr_t attr;
    int rc;

    if (!w || FAULT_SPAWN_REFUSED())
        return -EAGAIN;
    /* The ring keeps its indices: a thief may still be reading them. */
    st_relaxed(&w->lifo, 0);
    st_relaxed(&w->park, PARK_RUNNING);
    st_relaxed(&w->busy, false);
    w->blocking = blocking;
    w->searching = w->in_idle = w->uncounted = false;
    st_relaxed(&w->blocked, false);
    w->lifo_streak = w->depth = 0;
    w->held = w->held_inline;
    w->held_cap = HELD_INLINE;
    w->index = (unsigned)(w - (blocking ? blockers : workers));
    st_relaxed(&w->awaiting, 0);
    w->cur = NULL;
    st_relaxed(&w->kwait, 0); /* kq stays: it belongs to the record */
    w->rng = (uint64_t)(uintptr_t)w * 0x9e3779b97f4a7c15u | 1;
    memset(&w->cursor, 0, sizeof w->cursor);
    atap__table_register_cache(&w->cache);
    add_seqcst(&pool.epoch, 1); /* a thread that may run: as if off an idle list */
    add_relaxed(blocking ? &pool.blive : &pool.nlive, 1);
    st_release(&w->status, W_LIVE);
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, pool.stack);
    rc = pthread_create(&w->thread, &attr, thread_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        sub_relaxed(blocking ? &pool.blive : &pool.nlive, 1);
        st_release(&w->status, W_FREE);
        return -rc;
    }
    if (!blocking) {
        unsigned live = ld_relaxed(&pool.nlive), peak = ld_relaxed(&pool.peak);
        if (live > peak)
            st_relaxed(&pool.peak, live);
    }
    return 0;
}

/* ---- queues ------------------------------------------------------------ */

static int band_of(uint32_t ref)
{
    return atap__inj_band(atap__table_at(ref - 1)->priority);
}

/* Queues refs in the shared queue, each in its own band. */
static void push_shared(struct injector *q, const uint32_t *refs, unsigned n)
{
    uint32_t by_band[INJ_BANDS][RING_SIZE / 2 + 1];
    unsigned count[INJ_BANDS] = {0};

    for (unsigned i = 0; i < n; i++) {
        int b = band_of(refs[i]);

        by_band[b][count[b]++] = refs[i];
        if (count[b] == RING_SIZE / 2 + 1) {
            atap__inj_push(q, by_band[b], count[b], b);
            count[b] = 0;
        }
    }
    for (int b = 0; b < INJ_BANDS; b++)
        atap__inj_push(q, by_band[b], count[b], b);
}

/* Owner: into the ring; a full ring first moves its older half out. */
void atap__pool_push_ring(struct worker *w, uint32_t ref)
{
    uint32_t half[RING_SIZE / 2];
    unsigned n;

    if (ring_push(&w->ring, ref))
        return;
    while ((n = ring_take_oldest(&w->ring, half, RING_SIZE / 2)) == 0 && ring_len(&w->ring) > 0)
        ; /* a thief took from the top first: look again */
    push_shared(&pool.inj, half, n);
    if (!ring_push(&w->ring, ref))
        push_shared(&pool.inj, &ref, 1);
}

/* Work in the shared queue or a ring; with_lifo: in a LIFO slot too. The
 * parking protocol needs only the first (a LIFO slot wakes nobody); the
 * drain needs all. */
static bool work_visible(bool with_lifo)
{
    unsigned n = ld_acquire(&pool.nrec);

    if (!atap__inj_empty(&pool.inj))
        return true;
    for (unsigned i = 0; i < n; i++) {
        struct worker *v = &workers[i];

        if (ld_acquire(&v->status) != W_LIVE)
            continue;
        if (ring_len(&v->ring) > 0 || (with_lifo && ld_relaxed(&v->lifo)))
            return true;
    }
    return false;
}

/* ---- waking and parking ------------------------------------------------ */

/* Hands a thread taken off an idle list its word (NOTIFIED or STOP) and
 * wakes it. Release: what the waker did before is visible to the woken. */
static void unpark(struct worker *w, uint32_t word)
{
    st_release(&w->park, word);
    atap__word_wake(&w->park, false);
}

/* Marks a thread off its idle list (pool lock held). The epoch moves
 * first, both seq_cst, done by whoever takes it off (before the thread can
 * run anything): a drain that counted it idle learns it may have run since
 * (quiescent), and a notify that reads the count it lowered sees the move. */
static void left_idle(struct worker *w, _Atomic unsigned *count)
{
    add_seqcst(&pool.epoch, 1);
    w->in_idle = false;
    sub_seqcst(count, 1);
}

/* Takes an idle thread off a list (pool lock held). */
static struct worker *pop_idle(struct worker **list, _Atomic unsigned *count)
{
    struct worker *w = *list;

    if (w) {
        *list = w->idle_next;
        left_idle(w, count);
    }
    return w;
}

/* Empties both idle lists (pool lock held). A worker woken NOTIFIED leaves
 * as a searcher, so it is counted as one. */
static void unpark_all(uint32_t word)
{
    struct worker *w;

    while ((w = pop_idle(&pool.idle, &pool.nidle)) != NULL) {
        if (word == PARK_NOTIFIED)
            add_seqcst(&pool.nsearching, 1);
        unpark(w, word);
    }
    while ((w = pop_idle(&pool.bidle_list, &pool.bidle)) != NULL)
        unpark(w, word);
}

static bool wake_idle(void)
{
    struct worker *w;

    pthread_mutex_lock(&pool.lock);
    w = pop_idle(&pool.idle, &pool.nidle);
    pthread_mutex_unlock(&pool.lock);
    if (!w)
        return false;
    unpark(w, PARK_NOTIFIED);
    return true;
}

/* After queueing work: wake one worker unless one is already looking. */
static void notify(void)
{
    unsigned zero = 0;

    fence_seqcst(); /* parking protocol: the queued task before nidle */
    /* seq_cst loads: a count read here was lowered after its epoch moved,
     * so a drain that sees what this thread does next sees that move too. */
    if (ld_seqcst(&pool.nidle) == 0 || ld_seqcst(&pool.nsearching) != 0)
        return;
    if (!cas_seqcst(&pool.nsearching, &zero, 1))
        return;
    if (!wake_idle())
        sub_seqcst(&pool.nsearching, 1);
}

static void leave_search(struct worker *w)
{
    w->searching = false;
    /* The last searcher out hands the search on if work remains. The fence
     * orders the decrement before the look (store, then loads, against a
     * queuer's push, fence, then its load of nsearching: one of the two
     * sees the other, as in park_worker); the RMW alone does not order the
     * relaxed and acquire loads after it. */
    if (sub_seqcst(&pool.nsearching, 1) == 1) {
        fence_seqcst();
        if (work_visible(false))
            notify();
    }
}

static void unlink_from(struct worker **list, _Atomic unsigned *count, struct worker *w)
{
    while (*list != w)
        list = &(*list)->idle_next;
    *list = w->idle_next;
    left_idle(w, count);
}

/*
 * Puts an idle thread on its idle list, counted (seq_cst: the lost-wake
 * handshake's store, before the caller's last look). Returns PARK_IDLE when
 * listed; PARK_STOP when the pool is stopping; PARK_RUNNING when an injected
 * death is owed, for the caller to go round and take it.
 */
static uint32_t join_idle(struct worker *w, struct worker **list, _Atomic unsigned *count)
{
    uint32_t rc = PARK_IDLE;

    pthread_mutex_lock(&pool.lock);
    if (ld_acquire(&pool.stopping)) {
        rc = PARK_STOP;
    } else if (FAULT_DEATH_OWED(w->blocking)) {
        rc = PARK_RUNNING;
    } else {
        st_relaxed(&w->park, PARK_IDLE);
        w->in_idle = true;
        w->idle_since = atap__now_ns();
        w->idle_next = *list;
        *list = w;
        add_seqcst(count, 1);
    }
    pthread_mutex_unlock(&pool.lock);
    return rc;
}

/* Returns false when the worker should exit. */
static bool park_worker(struct worker *w)
{
    uint32_t word;

    if (w->searching) {
        w->searching = false;
        sub_seqcst(&pool.nsearching, 1);
    }
    if ((word = join_idle(w, &pool.idle, &pool.nidle)) != PARK_IDLE)
        return word == PARK_RUNNING;
    fence_seqcst(); /* parking protocol: nidle before the last look */
    if (work_visible(false)) {
        pthread_mutex_lock(&pool.lock);
        if (w->in_idle) {
            unlink_from(&pool.idle, &pool.nidle, w);
            st_relaxed(&w->park, PARK_RUNNING);
        }
        pthread_mutex_unlock(&pool.lock);
    }
    /* A waker that took us off the list stores NOTIFIED (or STOP) after
     * unlocking, then wakes: the futex compare covers the gap. */
    while ((word = ld_acquire(&w->park)) == PARK_IDLE)
        atap__word_wait(&w->park, PARK_IDLE, ATAP__FOREVER);
    st_relaxed(&w->park, PARK_RUNNING);
    if (word == PARK_STOP) {
        /* Reaped: a queuer may have counted on this worker (it was listed
         * when the queuer looked) and found nobody left to wake. */
        if (!ld_acquire(&pool.stopping) && work_visible(false))
            notify();
        return false;
    }
    w->searching = word == PARK_NOTIFIED;
    return true;
}

/* ---- finding work ------------------------------------------------------ */

static uint32_t from_shared(struct worker *w)
{
    uint32_t batch[INJ_BATCH];
    unsigned n = atap__inj_pop(&pool.inj, &w->cursor, batch, INJ_BATCH);

    for (unsigned i = 1; i < n; i++)
        atap__pool_push_ring(w, batch[i]);
    if (n > 1)
        notify(); /* the rest of the batch can be stolen */
    return n ? batch[0] : 0;
}

/* Takes half of v's ring (one CAS each, as Chase-Lev allows), keeping the
 * first and moving the rest into w's ring; else v's LIFO slot. */
static uint32_t steal_from(struct worker *w, struct worker *v)
{
    int64_t want = (ring_len(&v->ring) + 1) / 2;
    uint32_t first = 0, x;
    unsigned misses = 0, moved = 0;

    while (want > 0 && misses < 8) {
        if ((x = ring_steal(&v->ring)) == UINT32_MAX) {
            misses++;
            continue;
        }
        if (x == 0)
            break;
        if (!first) {
            first = x;
        } else {
            atap__pool_push_ring(w, x);
            moved++;
        }
        want--;
    }
    /* What was moved sat in no queue for a moment, where a parker's last
     * look could miss it: wake one for it, as from_shared does. */
    if (moved)
        notify();
    if (!first)
        first = atomic_exchange_explicit(&v->lifo, 0, memory_order_acq_rel);
    return first;
}

static uint32_t steal(struct worker *w)
{
    unsigned n = ld_acquire(&pool.nrec), start;
    uint32_t x;

    if (n < 2)
        return 0;
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    start = (unsigned)(w->rng % n);
    for (unsigned k = 0; k < n; k++) {
        struct worker *v = &workers[(start + k) % n];

        if (v != w && ld_acquire(&v->status) == W_LIVE && (x = steal_from(w, v)) != 0)
            return x;
    }
    return 0;
}

static uint32_t find_work(struct worker *w)
{
    uint32_t x;

    if (w->lifo_streak < LIFO_STREAK && ld_relaxed(&w->lifo) != 0 &&
        (x = atomic_exchange_explicit(&w->lifo, 0, memory_order_acq_rel)) != 0) {
        w->lifo_streak++;
        return x;
    }
    w->lifo_streak = 0;
    /* Only the owner adds to its ring and top only grows, so a ring that
     * looks empty here is: no pop (and its fence) needed. */
    if ((ring_len(&w->ring) > 0 && (x = ring_pop(&w->ring)) != 0) || (x = from_shared(w)) != 0)
        return x;
    if ((x = atomic_exchange_explicit(&w->lifo, 0, memory_order_acq_rel)) != 0)
        return x;
    return steal(w);
}

/* The record's held[] back to its inline array (its thread is leaving). */
static void held_reset(struct worker *w)
{
    if (w->held != w->held_inline)
        free(w->held);
    w->held = w->held_inline;
    w->held_cap = HELD_INLINE;
}

struct worker *atap__pool_record(unsigned i) { return &workers[i]; }

unsigned atap__pool_records(void) { return ld_acquire(&pool.nrec); }

bool atap__pool_live(struct worker *w) { return ld_acquire(&w->status) == W_LIVE; }

/* Starts one more worker, up to the ceiling; false if none was started
 * for want of a thread (the ceiling, or a refused start). */
static bool add_worker(void)
{
    bool ok = true;

    pthread_mutex_lock(&pool.lock);
    if (!ld_relaxed(&pool.stopping)) {
        ok = ld_relaxed(&pool.nlive) < pool.ceiling && start_thread(false, NULL) == 0;
        if (ok)
            ATAP_TRACE(TR_GROW, 0, NULL, ld_relaxed(&pool.nlive));
        st_relaxed(&pool.refused, !ok);
    }
    pthread_mutex_unlock(&pool.lock);
    return ok;
}

/* Workers not blocked in a wait: running, searching or idle. */
static unsigned unblocked_workers(void)
{
    unsigned live = ld_seqcst(&pool.nlive), blocked = ld_seqcst(&pool.nblocked);

    return live > blocked ? live - blocked : 0;
}

void atap__pool_blocked(struct worker *w, bool blocked)
{
    if (blocked && !ld_relaxed(&w->blocked)) {
        st_relaxed(&w->blocked, true);
        add_seqcst(&pool.nblocked, 1);
    } else if (!blocked && ld_relaxed(&w->blocked)) {
        st_relaxed(&w->blocked, false);
        sub_seqcst(&pool.nblocked, 1);
        return;
    }
    if (!blocked)
        return;
    /* Looked at on every slice of a blocked wait: the core it leaves is
     * lent. What waits may sit in this worker's own queues, out of its
     * reach now: an idle worker can steal it (a LIFO slot woke nobody when
     * it was filled). With none idle, one more worker is started at once
     * when no worker is left unblocked (nothing else would ever run the
     * work); while one still runs, the tick lends the core as it does for
     * stuck workers (a blocked one counts as stuck: count_stuck). More
     * threads than cores, all running, only slow a tree of joins down. */
    if (!work_visible(true))
        return;
    if (ld_relaxed(&pool.nidle) > 0) {
        /* Counted a searcher before it wakes, as notify does: woken first,
         * it could leave the search before it was counted in. */
        add_seqcst(&pool.nsearching, 1);
        if (!wake_idle())
            sub_seqcst(&pool.nsearching, 1);
    } else if (unblocked_workers() == 0) {
        add_worker();
    }
}

#define STALL_GAP_NS 20000000u /* a stall is declared at most this often */

bool atap__pool_stalled(struct worker *w)
{
    uint64_t now, last;

    if (!ld_relaxed(&w->blocked) || unblocked_workers() > 0 || !work_visible(true))
        return false;
    if (ld_relaxed(&pool.nlive) < pool.ceiling && !ld_relaxed(&pool.refused))
        return false; /* a worker may still be added */
    now = atap__now_ns();
    last = ld_relaxed(&pool.stall_at);
    if (now - last < STALL_GAP_NS || !cas_acqrel(&pool.stall_at, &last, now))
        return false;
    add_relaxed(&pool.stalls, 1);
    return true;
}

/* ---- submitting -------------------------------------------------------- */

/* After queueing work outside a worker: with no worker left (every one died
 * and its replacement was refused), start one. A start refused here too is
 * retried by the manager's tick. */
static void ensure_worker(void)
{
    if (ld_relaxed(&pool.nlive) != 0)
        return;
    pthread_mutex_lock(&pool.lock);
    if (ld_relaxed(&pool.nlive) == 0 && !ld_relaxed(&pool.stopping))
        start_thread(false, NULL);
    pthread_mutex_unlock(&pool.lock);
}

/* Wakes an idle blocking thread, or starts one, for work in the queue. */
static void wake_blocker(void)
{
    struct worker *w = NULL;

    /* Same lost-wake handshake as the workers': the task is queued before
     * bidle is read; an idling thread counts itself before its last look. */
    fence_seqcst();
    if (ld_relaxed(&pool.bidle) == 0 && ld_relaxed(&pool.blive) >= pool.bcap)
        return; /* every thread busy: the first one free takes it */
    pthread_mutex_lock(&pool.lock);
    if (!(w = pop_idle(&pool.bidle_list, &pool.bidle)) && ld_relaxed(&pool.blive) < pool.bcap &&
        !ld_relaxed(&pool.stopping))
        start_thread(true, NULL);
    pthread_mutex_unlock(&pool.lock);
    if (w) {
        unpark(w, PARK_NOTIFIED);
    }
}

static void submit_blocking(uint32_t ref, int priority)
{
    atap__inj_push(&pool.binj, &ref, 1, atap__inj_band(priority));
    wake_blocker();
}

void atap__pool_submit_batch(const uint32_t *refs, unsigned n)
{
    if (n == 0)
        return;
    push_shared(&pool.inj, refs, n); /* one CAS a band, then one wake check */
    ensure_worker();
    notify();
}

void atap__pool_submit(uint32_t ref, int priority, bool blocking)
{
    struct worker *w = atap__self;
    uint32_t old;

    if (blocking) {
        submit_blocking(ref, priority);
        return;
    }
    if (w && !w->blocking) {
        /* An empty LIFO slot stays empty until its owner fills it (thieves
         * only take), so the common case needs no locked instruction. The
         * release store lets a thief's exchange see the task's fields. */
        if ((old = ld_relaxed(&w->lifo)) == 0) {
            st_release(&w->lifo, ref);
            return;
        }
        old = atomic_exchange_explicit(&w->lifo, ref, memory_order_acq_rel);
        if (!old)
            return;
        atap__pool_push_ring(w, old);
    } else {
        atap__inj_push(&pool.inj, &ref, 1, atap__inj_band(priority));
        ensure_worker();
    }
    notify();
}

/* ---- the threads ------------------------------------------------------- */

/*
 * Before parking, a worker spins a short while as a searcher: a spawner
 * seeing a searcher wakes nobody, so a stream of spawns slower than the
 * workers costs no futex wake per task. At most half the workers spin.
 */
static bool spin_for_work(struct worker *w)
{
    unsigned searching = ld_relaxed(&pool.nsearching);

    if (!w->searching) {
        if (2 * searching >= ld_relaxed(&pool.nlive) ||
            !atomic_compare_exchange_strong_explicit(&pool.nsearching, &searching, searching + 1,
                                                     memory_order_seq_cst, memory_order_relaxed))
            return false;
        w->searching = true;
    }
    for (unsigned i = 0; i < SPIN_ROUNDS; i++) {
        if (i % 8 == 7)
            sched_yield(); /* more threads than cores: let the spawner run */
        else
            for (unsigned k = 0; k < 32; k++)
                cpu_relax();
        if (work_visible(false))
            return true;
    }
    return false;
}

static void worker_loop(struct worker *w)
{
    uint32_t ref;

    for (;;) {
        if (FAULT_WORKER_DIES(false))
            pthread_exit(NULL); /* an injected death, idle */
        if ((ref = find_work(w)) != 0) {
            if (w->searching)
                leave_search(w);
            st_relaxed(&w->busy, true);
            atap__exec_run(w, ref);
            st_relaxed(&w->busy, false);
            continue;
        }
        if (spin_for_work(w))
            continue;
        if (!park_worker(w))
            return;
    }
}

/*
 * Idles a blocking thread until a submitter wakes it or BLOCKING_IDLE_NS
 * pass. Returns false when the thread should stop: idle too long, or the
 * pool is stopping. A thread that stops for idleness leaves the live count
 * before its last look at the queue, so a submitter either sees room to
 * start a thread or its task is seen here.
 */
static bool blocker_wait(struct worker *w)
{
    uint32_t word;
    bool listed;

    if ((word = join_idle(w, &pool.bidle_list, &pool.bidle)) != PARK_IDLE)
        return word == PARK_RUNNING;
    fence_seqcst(); /* lost-wake handshake with submit_blocking */
    if (atap__inj_empty(&pool.binj))
        atap__word_wait(&w->park, PARK_IDLE, BLOCKING_IDLE_NS);
    pthread_mutex_lock(&pool.lock);
    if ((listed = w->in_idle)) { /* nobody woke us */
        unlink_from(&pool.bidle_list, &pool.bidle, w);
        sub_relaxed(&pool.blive, 1);
        w->uncounted = true;
    }
    pthread_mutex_unlock(&pool.lock);
    if (listed) {
        bool stay;

        fence_seqcst();
        if (atap__inj_empty(&pool.binj) || ld_acquire(&pool.stopping))
            return false;
        /* Work came in after all: stay, counted again under the lock, unless
         * a submitter started a thread meanwhile that fills the cap (that
         * thread, or the first busy one free, takes the work). */
        pthread_mutex_lock(&pool.lock);
        if ((stay = ld_relaxed(&pool.blive) < pool.bcap)) {
            add_relaxed(&pool.blive, 1);
            w->uncounted = false;
        }
        pthread_mutex_unlock(&pool.lock);
        return stay;
    }
    /* Taken off the list by a waker, whose store comes right after. */
    while ((word = ld_acquire(&w->park)) == PARK_IDLE)
        atap__word_wait(&w->park, PARK_IDLE, ATAP__FOREVER);
    st_relaxed(&w->park, PARK_RUNNING);
    return word != PARK_STOP;
}

static void blocker_loop(struct worker *w)
{
    uint32_t ref;

    for (;;) {
        if (FAULT_WORKER_DIES(true))
            pthread_exit(NULL); /* an injected death, idle */
        /* Counted busy before the pop, so a drain never sees a task in
         * neither the queue nor the busy count (quiescent). */
        add_seqcst(&pool.bbusy, 1);
        st_relaxed(&w->busy, true);
        if (atap__inj_pop(&pool.binj, &w->cursor, &ref, 1)) {
            /* The pop may have flipped a band, hiding its other tasks from
             * idle threads for a moment: more work left means one more
             * thread, since this one is about to be busy. */
            if (!atap__inj_empty(&pool.binj))
                wake_blocker();
            atap__exec_run(w, ref);
            st_relaxed(&w->busy, false);
            /* What the run queued may have woken nobody (every blocking
             * thread busy): the epoch tells a drain that read the queues
             * before it (quiescent). */
            add_seqcst(&pool.epoch, 1);
            sub_seqcst(&pool.bbusy, 1);
            continue;
        }
        st_relaxed(&w->busy, false);
        sub_seqcst(&pool.bbusy, 1);
        if (!blocker_wait(w))
            return;
    }
}

/* Moves a dying worker's queued tasks to the shared queue. */
static void evacuate(struct worker *w)
{
    uint32_t refs[RING_SIZE + 1], x;
    unsigned n = 0;

    while ((x = ring_pop(&w->ring)) != 0)
        refs[n++] = x;
    if ((x = atomic_exchange_explicit(&w->lifo, 0, memory_order_acq_rel)) != 0)
        refs[n++] = x;
    push_shared(&pool.inj, refs, n);
}

static void thread_died(void *arg)
{
    struct worker *w = arg;

    /* It waits no more, and no run of it is on a stack: nothing of its
     * record may lead a waiter anywhere (the record is reused). Innermost
     * first; each published run unpublished as it goes. */
    st_release(&w->awaiting, 0);
    while (w->depth > 0) {
        if (--w->depth < PUB_DEPTH)
            st_relaxed(&w->pub[w->depth], 0);
        atap__exec_fail_held(w->held[w->depth]);
    }
    held_reset(w);
    if (ld_relaxed(&w->busy) && w->blocking) {
        /* As a run's end does (blocker_loop): a drain that read the
         * blocking queue before what this run queued sees the epoch move. */
        add_seqcst(&pool.epoch, 1);
        sub_seqcst(&pool.bbusy, 1);
    }
    st_relaxed(&w->busy, false);
    if (w->searching)
        sub_seqcst(&pool.nsearching, 1);
    if (ld_relaxed(&w->blocked))
        atap__pool_blocked(w, false);
    if (!w->blocking)
        evacuate(w);
    pthread_mutex_lock(&pool.lock);
    /* One counted out already (reaped, or a blocking thread timing out) was
     * leaving anyway: no replacement. */
    if (!w->uncounted) {
        /* seq_cst (a release): a drain that reads the lower count sees the
         * tasks evacuated above. */
        sub_seqcst(w->blocking ? &pool.blive : &pool.nlive, 1);
        if (!ld_relaxed(&pool.stopping) && (!w->blocking || !atap__inj_empty(&pool.binj)))
            start_thread(w->blocking, w);
    }
    /* Counted after the replacement: release, so whoever reads the new
     * count (acquire, in the stats) also sees the replacement counted live. */
    atomic_fetch_add_explicit(&pool.deaths, 1, memory_order_release);
    pthread_mutex_unlock(&pool.lock);
    if (!w->blocking)
        notify();
    /* What this thread's later destructors spawn goes where an outside
     * thread's would, not into the queues of a record about to read DEAD. */
    atap__self = NULL;
    st_release(&w->status, W_DEAD); /* last: joiners may now join us */
}

/* The lowest address a run may start nested at on this thread's stack:
 * its low end plus a reserve for the run itself (an eighth of the stack,
 * 64 KiB to 1 MiB). glibc says where the stack lies; elsewhere it is taken
 * to end `size` below here (the thread's first frame). */
#define STACK_RESERVE_MIN ((size_t)64 << 10)
#define STACK_RESERVE_MAX ((size_t)1 << 20)

static uintptr_t stack_floor_here(size_t size)
{
    char here;
    uintptr_t top = (uintptr_t)&here, lo = 0;
    size_t reserve;
#if defined(__GLIBC__)
    pthread_attr_t attr;
    void *addr;
    size_t got;

    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &addr, &got) == 0 && (uintptr_t)addr < top) {
            lo = (uintptr_t)addr;
            size = got;
        }
        pthread_attr_destroy(&attr);
    }
#endif
    if (lo == 0)
        lo = top > size ? top - size : 0;
    reserve = size / 8;
    reserve = reserve < STACK_RESERVE_MIN ? STACK_RESERVE_MIN
              : reserve > STACK_RESERVE_MAX ? STACK_RESERVE_MAX
                                           : reserve;
    return lo + reserve;
}

static void *thread_main(void *arg)
{
    struct worker *w = arg;

    atap__self = w;
    w->stack_floor = stack_floor_here(pool.stack);
#if defined(__linux__)
    st_relaxed(&w->tid, (int)syscall(SYS_gettid));
#endif
#if defined(__linux__)
    pthread_setname_np(pthread_self(), w->blocking ? "atap-blocking" : "atap-worker");
#elif defined(__APPLE__)
    pthread_setname_np(w->blocking ? "atap-blocking" : "atap-worker");
#endif
    ATAP_TRACE(TR_THREAD, 0, NULL, w->blocking);
    pthread_cleanup_push(thread_died, w);
    if (w->blocking)
        blocker_loop(w);
    else
        worker_loop(w);
    pthread_cleanup_pop(0);
    held_reset(w);
    atap__self = NULL; /* as in thread_died */
    pthread_mutex_lock(&pool.lock);
    if (!w->uncounted)
        sub_relaxed(w->blocking ? &pool.blive : &pool.nlive, 1);
    pthread_mutex_unlock(&pool.lock);
    st_release(&w->status, W_DEAD);
    return NULL;
}

#define REAP_IDLE_NS 500000000u     /* an idle worker above the floor goes */
#define REAP_IDLE_OVER_NS 50000000u  /* ... sooner above the target */
#define OVERLOAD_RATIO 64            /* queued per worker that counts as overload */
#define TRIM_EVERY_TICKS 500         /* about 5 s */

/*
 * Off the CPU: the thread sleeps in the kernel (a task holding it in a
 * call of its own), as opposed to running, or waiting for a CPU on a busy
 * machine. Only the first answers growth: more threads would not make a
 * saturated machine any faster. Linux says so in the thread's stat (S or
 * D); elsewhere the thread's CPU clock standing still over the tick says
 * the same.
 */
static bool off_cpu(struct worker *w, unsigned i)
{
#if defined(__linux__)
    char path[64], buf[512], *paren;
    ssize_t got;
    int fd;

    (void)i;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", ld_relaxed(&w->tid));
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return true; /* can't tell: as before, stuck */
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
    clockid_t clock;
    struct timespec ts;
    uint64_t cpu;

    if (pthread_getcpuclockid(w->thread, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return true;
    cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (cpu != pool.last_cpu[i]) {
        pool.last_cpu[i] = cpu;
        return false;
    }
    return true;
#endif
}

/* Workers stuck in a task: blocked in a wait inside it, or inside one
 * with nothing finished since the last tick and off the CPU; among the
 * live ones, counted in *live. */
static unsigned count_stuck(unsigned *live)
{
    unsigned n = ld_acquire(&pool.nrec), stuck = 0;

    *live = 0;
    for (unsigned i = 0; i < n; i++) {
        uint64_t done = ld_relaxed(&workers[i].completed);

        if (ld_acquire(&workers[i].status) != W_LIVE)
            continue;
        (*live)++;
        if (ld_relaxed(&workers[i].blocked) ||
            (ld_relaxed(&workers[i].busy) && done == pool.last_done[i] && off_cpu(&workers[i], i)))
            stuck++;
        pool.last_done[i] = done;
    }
    return stuck;
}

/* Stops the idle worker that has idled longest, if past the limit. */
static void reap(uint64_t now, unsigned live)
{
    uint64_t limit = live > pool.target ? REAP_IDLE_OVER_NS : REAP_IDLE_NS;
    struct worker *w, *oldest = NULL;

    if (live <= pool.floor)
        return;
    pthread_mutex_lock(&pool.lock);
    /* The count, under the lock: the records can read one too many, since a
     * dying worker's reads LIVE until after its replacement is up. */
    if (ld_relaxed(&pool.nlive) <= pool.floor) {
        pthread_mutex_unlock(&pool.lock);
        return;
    }
    for (w = pool.idle; w; w = w->idle_next)
        if (!oldest || w->idle_since < oldest->idle_since)
            oldest = w;
    /* idle_since can be later than `now`, read before the lock. */
    if (oldest && now > oldest->idle_since && now - oldest->idle_since >= limit &&
        !ld_relaxed(&pool.stopping)) {
        unlink_from(&pool.idle, &pool.nidle, oldest);
        /* Counted out now, so the next look is exact even before it has
         * gone; it leaves without counting itself out again. */
        sub_relaxed(&pool.nlive, 1);
        oldest->uncounted = true;
        unpark(oldest, PARK_STOP);
    }
    pthread_mutex_unlock(&pool.lock);
}

/* What keeps work moving, every tick, and during a shutdown's drain (the
 * manager is stopped by then): returns the live worker count. */
static unsigned keep_going(void)
{
    unsigned running, stuck = count_stuck(&running);
    size_t queued = atap__inj_len(&pool.inj);

    /* Work in a LIFO slot or a ring woke nobody: hand it to an idle peer. */
    if (ld_relaxed(&pool.nidle) > 0 && ld_relaxed(&pool.nsearching) == 0 && work_visible(true))
        notify();
    /* Every worker stuck (blocked in a wait, or a task holding it in a
     * call of its own) and work waiting: one more, up to the target; past
     * it only under overload. */
    if (running > 0 && stuck == running && work_visible(true) &&
        (running < pool.target || queued >= (size_t)running * OVERLOAD_RATIO))
        add_worker();
    /* Below the floor (a replacement was refused): one more a tick. And a
     * blocking task with no blocking thread to run it (its start was
     * refused): start one. */
    if (ld_relaxed(&pool.nlive) < pool.floor)
        add_worker();
    if (ld_relaxed(&pool.blive) == 0 && !atap__inj_empty(&pool.binj))
        wake_blocker();
    return ld_relaxed(&pool.nlive);
}

/* Joins the zombies (pool lock not held: a destructor still running on
 * one may take it). With glibc only those already gone, so the manager
 * never waits on one; elsewhere all, each long past its DEAD mark (a
 * destructor there that waits for the manager would hold the tick up). */
static void reap_zombies(void)
{
    pthread_t got[64];
    unsigned n = 0;

    pthread_mutex_lock(&pool.lock);
#if defined(__GLIBC__)
    for (unsigned i = 0; i < pool.nzombies;)
        if (pthread_tryjoin_np(pool.zombies[i], NULL) == 0)
            pool.zombies[i] = pool.zombies[--pool.nzombies];
        else
            i++;
#else
    while (pool.nzombies > 0 && n < 64)
        got[n++] = pool.zombies[--pool.nzombies];
#endif
    pthread_mutex_unlock(&pool.lock);
    for (unsigned i = 0; i < n; i++)
        pthread_join(got[i], NULL);
}

void atap__pool_tick(uint64_t now)
{
    unsigned live = keep_going();

    reap(now, live);
    reap_zombies();
    if (++pool.ticks % TRIM_EVERY_TICKS == 0 && ld_relaxed(&pool.nidle) == live &&
        !work_visible(true))
        atap__table_trim(NULL);
}

void atap__pool_wake_all(void)
{
    pthread_mutex_lock(&pool.lock);
    unpark_all(PARK_NOTIFIED);
    pthread_mutex_unlock(&pool.lock);
}

/* ---- start, drain, stop ------------------------------------------------ */

/* The most workers (atap.h, atap_pool_stats): what the process may still
 * start (RLIMIT_NPROC less 256 for the program's own threads), and as many
 * whole worker stacks as a quarter of the machine's memory holds (a worker
 * blocked deep in a chain of waits has touched all of its own); never
 * below the floor nor above the records. */
static unsigned thread_ceiling(unsigned floor, size_t stack)
{
    struct rlimit rl;
    unsigned long limit = POOL_MAX_THREADS;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        limit = rl.rlim_cur > 256 ? (unsigned long)(rl.rlim_cur - 256) : 0;
    if (pages > 0 && page > 0 && stack > 0 &&
        (unsigned long long)pages * (unsigned long long)page / 4 / stack < limit)
        limit = (unsigned long)((unsigned long long)pages * (unsigned long long)page / 4 / stack);
    if (limit > POOL_MAX_THREADS)
        limit = POOL_MAX_THREADS;
    return limit < floor ? floor : (unsigned)limit;
}

static unsigned at_most(unsigned long n, unsigned max) { return n < max ? (unsigned)n : max; }

/* The base count (the floor) is conf->workers, or one worker per CPU the
 * process may run on (cpus.c); the target is workers_per_cpu a CPU, never
 * below the floor nor above the ceiling; blocking threads are capped at
 * conf->blocking, or blocking_per_cpu a CPU. */
int atap__pool_start(const struct atap__pool_conf *conf)
{
    unsigned cpus = atap__cpus();
    unsigned floor = at_most(conf->workers ? conf->workers : cpus, POOL_MAX_THREADS);
    unsigned long bcap = conf->blocking ? conf->blocking
                                        : (unsigned long)cpus * conf->blocking_per_cpu;
    unsigned long target = (unsigned long)cpus * conf->workers_per_cpu;
    size_t stack = conf->stack;
    int rc = 0;

    pool.bcap = at_most(bcap, POOL_MAX_THREADS);
    pool.floor = floor;
    pool.ceiling = thread_ceiling(floor, stack);
    pool.target = target < floor ? floor : at_most(target, pool.ceiling);
    pool.ticks = 0;
    st_relaxed(&pool.peak, 0); /* peaks are per run of the runtime */
    pool.stack = stack;
    st_relaxed(&pool.nsearching, 0);
    st_seqcst(&pool.stopping, false);
    pthread_mutex_lock(&pool.lock);
    for (unsigned i = 0; i < floor && rc == 0; i++)
        rc = start_thread(false, NULL);
    pthread_mutex_unlock(&pool.lock);
    if (rc != 0)
        atap__pool_stop();
    return rc;
}

/*
 * Nothing queued and nothing running, looked at under the epoch. A thread
 * that starts running moves the epoch (left_idle, start_thread) or counts
 * itself in bbusy before it takes a task; taking one is a release (the
 * queues' pops) that the fence below turns into a happens-before when this
 * look sees the queue it emptied. So either a queue is seen holding the
 * task, or bbusy or the epoch's second look sees the thread that took it.
 * The queues go first, the counts after: the other way round a blocking
 * thread could count itself busy and pop between the two looks.
 */
static bool quiescent(void)
{
    uint64_t epoch = ld_seqcst(&pool.epoch);
    bool quiet = ld_seqcst(&pool.nidle) == ld_seqcst(&pool.nlive) && !work_visible(true) &&
                 atap__inj_empty(&pool.binj);

    fence_seqcst();
    return quiet && ld_seqcst(&pool.bbusy) == 0 && ld_seqcst(&pool.epoch) == epoch;
}

static void join_all(struct worker *recs, _Atomic unsigned *nrec)
{
    unsigned n = ld_relaxed(nrec);

    for (unsigned i = 0; i < n; i++) {
        if (ld_acquire(&recs[i].status) == W_FREE)
            continue;
        pthread_join(recs[i].thread, NULL);
        st_relaxed(&recs[i].status, W_FREE);
    }
}

void atap__pool_stop(void)
{
    struct timespec poll = {0, 1000000};

    /* The manager is stopped: its tick's hand-offs (a task left in a LIFO
     * slot, a pool too stuck to finish) are made here, as often. */
    for (unsigned i = 1; !quiescent(); i++) {
        nanosleep(&poll, NULL);
        if (i % 10 == 0)
            keep_going();
    }
    pthread_mutex_lock(&pool.lock);
    st_seqcst(&pool.stopping, true);
    unpark_all(PARK_STOP);
    pthread_mutex_unlock(&pool.lock);
    /* Joining takes no lock a dying or exiting thread still needs. */
    join_all(workers, &pool.nrec);
    join_all(blockers, &pool.brec);
    for (; pool.nzombies > 0; pool.nzombies--) /* every thread is told to stop: none races this */
        pthread_join(pool.zombies[pool.nzombies - 1], NULL);
}

/* ---- stats ------------------------------------------------------------- */

unsigned atap__pool_live_workers(void) { return ld_relaxed(&pool.nlive); }

bool atap__pool_stopped(void) { return ld_seqcst(&pool.stopping); }

static void count_records(struct worker *recs, unsigned n, size_t *busy, uint64_t *done,
                          size_t *queued)
{
    for (unsigned i = 0; i < n; i++) {
        *done += ld_relaxed(&recs[i].completed);
        if (ld_acquire(&recs[i].status) != W_LIVE)
            continue;
        *busy += ld_relaxed(&recs[i].busy) ? 1 : 0;
        *queued += (size_t)ring_len(&recs[i].ring) + (ld_relaxed(&recs[i].lifo) ? 1 : 0);
    }
}

static void interrupt_in(struct worker *recs, unsigned n, uint64_t key)
{
    for (unsigned i = 0; i < n; i++) {
        /* seq_cst: pairs with the waiter's store of kwait before it looks at
         * its task's state (kwait.c): one of us sees the other. */
        if (ld_seqcst(&recs[i].kwait) == key) {
            struct atap_poller *kq = ld_acquire(&recs[i].kq);
            if (kq)
                atap__poller_wake(kq);
        }
    }
}

void atap__pool_interrupt(uint64_t key)
{
    interrupt_in(workers, ld_acquire(&pool.nrec), key);
    interrupt_in(blockers, ld_acquire(&pool.brec), key);
}

void atap__pool_stats(struct atap_pool_stats *st)
{
    size_t queued = atap__inj_len(&pool.inj) + atap__inj_len(&pool.binj);
    uint64_t done = 0;

    st->workers = ld_relaxed(&pool.nlive);
    st->blocking_threads = ld_relaxed(&pool.blive);
    st->busy = st->blocking_busy = 0;
    count_records(workers, ld_acquire(&pool.nrec), &st->busy, &done, &queued);
    count_records(blockers, ld_acquire(&pool.brec), &st->blocking_busy, &done, &queued);
    st->queued = queued;
    st->peak_workers = ld_relaxed(&pool.peak);
    st->deaths = ld_acquire(&pool.deaths);
    st->completed = done;
    st->waiting = ld_relaxed(&pool.nblocked);
    st->ceiling = pool.ceiling;
    st->stalls = ld_relaxed(&pool.stalls);
}

/* ---- after fork() ---------------------------------------------------------- */

/*
 * In the child of a fork (runtime.c's atfork handler, the child's only
 * thread): no pool thread came along, so every record, count and queue
 * goes back to its state before the first start. Each record's own event
 * queue shares its epoll/kqueue and wake fds with the parent's thread: they
 * are closed, never used. What the records and queues held (heap `held`
 * arrays, queued tasks) is left behind unfreed: the parent's, not ours. The
 * lock may have been held by a thread that is not here: the child takes a
 * fresh one (nothing it guarded is kept).
 */
static void forget_records(struct worker *recs, unsigned n)
{
    int fds[4];

    for (unsigned i = 0; i < n && i < POOL_MAX_THREADS; i++) {
        struct atap_poller *kq = ld_relaxed(&recs[i].kq);
        int nfd = kq ? atap__poller_fds(kq, fds, 4) : 0;

        for (int f = 0; f < nfd; f++)
            close(fds[f]);
    }
    memset(recs, 0, sizeof workers);
}

void atap__pool_forget(void)
{
    forget_records(workers, ld_relaxed(&pool.nrec));
    forget_records(blockers, ld_relaxed(&pool.brec));
    memset(&pool, 0, sizeof pool);
    pool.lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    atap__self = NULL;
}

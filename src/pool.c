/*
 * The pool: workers, their parking, and blocking threads, run here (the
 * queues, finding work, submitting, the threads' loops). Sharing
 * pool_int.h: pool_grow.c decides how many threads run, pool_recover.c
 * recovers a thread that dies under a task, pool_life.c starts, drains and
 * stops the pool, reads its stats and resets it in a fork's child, and
 * pool_io.c waits on the hub's io for an idle worker.
 *
 * Finding work (find_work): the LIFO slot (at most LIFO_STREAK times in a
 * row), the own ring, a batch from the shared queue (the rest of the batch
 * goes into the ring, where peers can steal it), the LIFO slot again, then
 * stealing half of a peer's ring (up to STEAL_MAX), or its LIFO slot.
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
 * So at most one searcher is woken per burst of spawns, and no task waits
 * while a worker sleeps but on a searcher that is not running (below). A
 * task put into a worker's LIFO slot wakes nobody: its spawner runs it
 * next. If the spawner then waits for something other than a join, the
 * manager's tick hands the slot to an idle peer, and a worker blocked in a
 * wait wakes one itself (atap__pool_blocked).
 *
 * A searcher off its CPU. A searcher can be runnable and not running: the
 * kernel queued it behind the spawner on one CPU, or its spin's yield gave
 * that CPU away for a whole slice, while another worker sleeps beside an
 * idle one; every queuer then sees the searcher and wakes nobody, and the
 * shared queue grows until the searcher runs again (milliseconds:
 * bench/README.md, timers). So one in STALL_LOOK_EVERY of a thread's looks
 * that find a searcher and an idle worker also reads the shared queue's
 * length, and past STALL_DEPTH wakes one more worker as a searcher
 * (notify_look). The lost-wake argument above does not lean on it: it
 * shortens a wait the protocol already ends.
 *
 * A worker's park word: RUNNING, IDLE (on the list, may sleep), NOTIFIED
 * (taken off the list by a waker, counted as searching) or STOP.
 *
 * Waiting on io: an idle worker may wait on the hub's io poller instead
 * of its word (pool_io.c); a waker reads in_io after storing the word and
 * wakes io for one waiting there.
 *
 * Watching for timers: a worker about to park while the timers' next due
 * time is a few ticks away stays awake for it instead, one at a time, and
 * fires it itself (spin_for_timers): no wake, so no wait for a CPU.
 *
 * Records: a thread's record reads DEAD last thing, and its thread may
 * still run thread-local destructors after that (one may spawn, and take
 * the pool lock). A DEAD record is taken again without joining its thread
 * under the lock: the thread goes on a zombie list, joined off the lock by
 * the tick (with glibc only once it is gone) and at stop.
 */
#include "pool.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <time.h>
#include <unistd.h>

#include "atomics.h"
#include "hub.h"
#include "pool_int.h"
#include "slot.h"
#include "table.h"
#include "trace.h"
#include "wait.h"

#define INJ_BATCH 16
#define STEAL_MAX 128               /* entries a thief takes from a ring at once, at most */
#define SPIN_ROUNDS 8               /* a few us of looking (one yield) before a worker parks */
#define TIMER_SPIN_NS 250000u       /* an idle worker stays awake for timers due this soon */
#define BLOCKING_IDLE_NS 500000000u /* a blocking thread idle this long stops */
#define STACKS_IDLE_NS 200000000u   /* an idle worker gives spare stacks back */
#define STALL_LOOK_EVERY 64 /* of a queuer's looks that find a searcher, one reads the queue */
#define STALL_DEPTH 1024    /* queued past a searcher: 0.1-0.3 ms of spawns it has not taken */

_Thread_local struct worker *atap__self;

struct worker atap__pool_workers[POOL_MAX_THREADS];
struct worker atap__pool_blockers[POOL_MAX_THREADS];

struct pool atap__pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

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
            if (atap__pool.nzombies < POOL_MAX_THREADS)
                atap__pool.zombies[atap__pool.nzombies++] = recs[i].thread;
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

int atap__pool_start_thread(bool blocking, struct worker *self)
{
    struct worker *w = claim_record(blocking ? atap__pool_blockers : atap__pool_workers,
                                    blocking ? &atap__pool.brec : &atap__pool.nrec, self);
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
    w->lifo_streak = w->depth = w->io_runs = 0;
    st_relaxed(&w->in_io, false);
    w->held = w->held_inline;
    w->held_cap = HELD_INLINE;
    w->index = (unsigned)(w - (blocking ? atap__pool_blockers : atap__pool_workers));
    w->cur = NULL;
    st_relaxed(&w->kwait, 0); /* kq stays: it belongs to the record */
    w->rng = (uint64_t)(uintptr_t)w * 0x9e3779b97f4a7c15u | 1;
    memset(&w->cursor, 0, sizeof w->cursor);
    atap__table_register_cache(&w->cache);
    add_seqcst(&atap__pool.epoch, 1); /* a thread that may run: as if off an idle list */
    add_relaxed(blocking ? &atap__pool.blive : &atap__pool.nlive, 1);
    st_release(&w->status, W_LIVE);
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, atap__pool.stack);
    rc = pthread_create(&w->thread, &attr, thread_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        sub_relaxed(blocking ? &atap__pool.blive : &atap__pool.nlive, 1);
        st_release(&w->status, W_FREE);
        return -rc;
    }
    if (!blocking) {
        unsigned live = ld_relaxed(&atap__pool.nlive), peak = ld_relaxed(&atap__pool.peak);
        if (live > peak)
            st_relaxed(&atap__pool.peak, live);
    }
    return 0;
}

/* ---- queues ------------------------------------------------------------ */

static int band_of(uint32_t ref, bool due)
{
    return atap__inj_band(atap__table_at(ref - 1)->priority, due);
}

/* Queues refs in the shared queue, each in its own band (due: resumed runs). */
void atap__pool_push_shared(struct injector *q, const uint32_t *refs, unsigned n, bool due)
{
    uint32_t by_band[INJ_BANDS][MOVE_CHUNK];
    unsigned count[INJ_BANDS] = {0};

    for (unsigned i = 0; i < n; i++) {
        int b = band_of(refs[i], due);

        by_band[b][count[b]++] = refs[i];
        if (count[b] == MOVE_CHUNK) {
            atap__inj_push(q, by_band[b], count[b], b);
            count[b] = 0;
        }
    }
    for (int b = 0; b < INJ_BANDS; b++)
        atap__inj_push(q, by_band[b], count[b], b);
}

/* Owner: into the ring; a full ring first moves its older half out, the
 * oldest first, a chunk at a time. */
void atap__pool_push_ring(struct worker *w, uint32_t ref)
{
    uint32_t chunk[MOVE_CHUNK];
    unsigned n, left = RING_SIZE / 2;

    if (ring_push(&w->ring, ref))
        return;
    while (left > 0) {
        if ((n = ring_take_oldest(&w->ring, chunk, left < MOVE_CHUNK ? left : MOVE_CHUNK)) == 0) {
            if (ring_len(&w->ring) == 0)
                break;
            continue; /* a thief took from the top first: look again */
        }
        atap__pool_push_shared(&atap__pool.inj, chunk, n, false);
        left -= n;
    }
    if (!ring_push(&w->ring, ref))
        atap__pool_push_shared(&atap__pool.inj, &ref, 1, false);
}

/* Work in the shared queue or a ring; with_lifo: in a LIFO slot too. The
 * parking protocol needs only the first (a LIFO slot wakes nobody); the
 * drain needs all. */
bool atap__pool_work_visible(bool with_lifo)
{
    unsigned n = ld_acquire(&atap__pool.nrec);

    if (!atap__inj_empty(&atap__pool.inj))
        return true;
    for (unsigned i = 0; i < n; i++) {
        struct worker *v = &atap__pool_workers[i];

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
void atap__pool_unpark(struct worker *w, uint32_t word)
{
    /* seq_cst, against pool_io.c: the word before in_io is read, so either
     * its look at the word sees this one or this sees it waiting on io. A
     * worker seen there reads its word again before it could sleep on it. */
    st_seqcst(&w->park, word);
    if (ld_seqcst(&w->in_io))
        atap__hub_wake_io();
    else
        atap__word_wake(&w->park, false);
}

/* Marks a thread off its idle list (pool lock held). The epoch moves
 * first, both seq_cst, done by whoever takes it off (before the thread can
 * run anything): a drain that counted it idle learns it may have run since
 * (quiescent), and a notify that reads the count it lowered sees the move. */
static void left_idle(struct worker *w, _Atomic unsigned *count)
{
    add_seqcst(&atap__pool.epoch, 1);
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
void atap__pool_unpark_all(uint32_t word)
{
    struct worker *w;

    while ((w = pop_idle(&atap__pool.idle, &atap__pool.nidle)) != NULL) {
        if (word == PARK_NOTIFIED)
            add_seqcst(&atap__pool.nsearching, 1);
        atap__pool_unpark(w, word);
    }
    while ((w = pop_idle(&atap__pool.bidle_list, &atap__pool.bidle)) != NULL)
        atap__pool_unpark(w, word);
}

bool atap__pool_wake_idle(void)
{
    struct worker *w;

    pthread_mutex_lock(&atap__pool.lock);
    w = pop_idle(&atap__pool.idle, &atap__pool.nidle);
    pthread_mutex_unlock(&atap__pool.lock);
    if (!w)
        return false;
    atap__pool_unpark(w, PARK_NOTIFIED);
    return true;
}

/* The look of atap__pool_notify, for a queuer whose queueing is itself
 * ordered before it in the single order of seq_cst operations (a seq_cst
 * RMW: an outside spawn's push). The parker stores its count, then fences,
 * then looks: if its fence comes first in that order, the seq_cst loads
 * here (after the push in it) see the count; if the push comes first, its
 * look after the fence sees the push. */
static _Thread_local unsigned searcher_looks; /* looks that found a searcher */

static void notify_look(void)
{
    unsigned zero = 0;

    /* seq_cst loads: a count read here was lowered after its epoch moved,
     * so a drain that sees what this thread does next sees that move too. */
    if (ld_seqcst(&atap__pool.nidle) == 0)
        return;
    if (ld_seqcst(&atap__pool.nsearching) != 0) {
        /* A searcher off its CPU (above). One more searcher, counted
         * before its wake as atap__pool_unpark_all counts one (seq_cst, as
         * every change of the count: the parking protocol reads it so). The
         * length is a hint: a stale one wakes a worker early or late, and
         * the protocol above still ends every wait. */
        if (unlikely(++searcher_looks % STALL_LOOK_EVERY == 0) &&
            atap__inj_len(&atap__pool.inj) > STALL_DEPTH) {
            add_seqcst(&atap__pool.nsearching, 1);
            if (!atap__pool_wake_idle())
                sub_seqcst(&atap__pool.nsearching, 1);
        }
        return;
    }
    if (!cas_seqcst(&atap__pool.nsearching, &zero, 1))
        return;
    if (!atap__pool_wake_idle())
        sub_seqcst(&atap__pool.nsearching, 1);
}

/* After queueing work: wake one worker unless one is already looking. */
void atap__pool_notify(void)
{
    fence_seqcst(); /* parking protocol: the queued task before nidle */
    notify_look();
}

static void leave_search(struct worker *w)
{
    w->searching = false;
    /* The last searcher out hands the search on if work remains. The fence
     * orders the decrement before the look (store, then loads, against a
     * queuer's push, fence, then its load of nsearching: one of the two
     * sees the other, as in park_worker); the RMW alone does not order the
     * relaxed and acquire loads after it. */
    if (sub_seqcst(&atap__pool.nsearching, 1) == 1) {
        fence_seqcst();
        if (atap__pool_work_visible(false))
            atap__pool_notify();
    }
}

void atap__pool_unlink_from(struct worker **list, _Atomic unsigned *count, struct worker *w)
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

    pthread_mutex_lock(&atap__pool.lock);
    if (ld_acquire(&atap__pool.stopping)) {
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
    pthread_mutex_unlock(&atap__pool.lock);
    return rc;
}

void atap__pool_leave_idle(struct worker *w)
{
    pthread_mutex_lock(&atap__pool.lock);
    if (w->in_idle) {
        atap__pool_unlink_from(&atap__pool.idle, &atap__pool.nidle, w);
        st_relaxed(&w->park, PARK_RUNNING);
    }
    pthread_mutex_unlock(&atap__pool.lock);
}

/* A stop (or a reap) reached a thread that still has stacks set aside: a
 * run under way since the drain looked (an io report's) may have waited.
 * It stays until they have gone on, looking every millisecond. */
static bool stay_for_aside(struct worker *w)
{
    struct timespec ms = {0, 1000000};

    if (w->naside == 0)
        return false;
    nanosleep(&ms, NULL);
    return true;
}

/* A stack set aside may go on, or will when a deadline passes: w looks
 * at its switch point rather than sleep. */
static inline bool aside_due(const struct worker *w)
{
    return w->naside && atap__pool_aside_pending(w);
}

/* Sleeps on the park word while it reads IDLE: on the hub's io if the
 * seat is free and no stack set aside has a deadline to keep, else on the
 * word, until the earliest such deadline (then READY, as a wake of one
 * would leave it). */
static uint32_t idle_sleep(struct worker *w)
{
    uint32_t word, idle;
    uint64_t due, now;

    while ((word = ld_acquire(&w->park)) == PARK_IDLE) {
        if (!w->timed) {
            /* Stacks kept from a burst of waits are given back once it
             * has idled for a while. */
            uint64_t limit = atap__pool_stacks_spare(w) ? STACKS_IDLE_NS : ATAP__FOREVER;
            int io = atap__pool_idle_io(w, limit);

            if ((io == IO_NONE && !atap__word_wait(&w->park, PARK_IDLE, limit)) || io == IO_TIMEOUT)
                atap__pool_stacks_shrink(w);
            continue;
        }
        due = atap__pool_aside_due(w);
        if ((now = atap__now_ns()) < due) {
            atap__word_wait(&w->park, PARK_IDLE, due - now);
            continue;
        }
        idle = PARK_IDLE;
        cas_seqcst(&w->park, &idle, PARK_READY); /* else a waker's word stands */
    }
    return word;
}

/* Off the idle list after a READY: by itself, unless a waker took it off
 * first, whose word (NOTIFIED or STOP) then comes and stands. */
static uint32_t leave_ready(struct worker *w)
{
    uint32_t word;
    bool listed;

    pthread_mutex_lock(&atap__pool.lock);
    if ((listed = w->in_idle))
        atap__pool_unlink_from(w->blocking ? &atap__pool.bidle_list : &atap__pool.idle,
                               w->blocking ? &atap__pool.bidle : &atap__pool.nidle, w);
    pthread_mutex_unlock(&atap__pool.lock);
    if (listed)
        return PARK_RUNNING;
    while ((word = ld_acquire(&w->park)) == PARK_READY || word == PARK_IDLE)
        atap__word_wait(&w->park, word, ATAP__FOREVER);
    return word;
}

static bool spin_for_timers(uint64_t due);

/* Returns false when the worker should exit. */
static bool park_worker(struct worker *w)
{
    uint32_t word;
    /* Relaxed: a hint, as a busy worker reads it (a stale time makes a
     * watch start early or not at all; the manager fires what is due). */
    uint64_t due = atap__pool.due_at ? ld_relaxed(atap__pool.due_at) : ATAP__FOREVER;

    if (unlikely(due != ATAP__FOREVER) && spin_for_timers(due))
        return true; /* it stayed awake for timers, and fired them */

    if (w->searching) {
        w->searching = false;
        sub_seqcst(&atap__pool.nsearching, 1);
    }
    if ((word = join_idle(w, &atap__pool.idle, &atap__pool.nidle)) != PARK_IDLE)
        return word == PARK_RUNNING || stay_for_aside(w);
    fence_seqcst(); /* parking protocol: nidle before the last look */
    if (atap__pool_work_visible(false) || aside_due(w))
        atap__pool_leave_idle(w);
    /* A waker that took us off the list stores NOTIFIED (or STOP) after
     * unlocking, then wakes: the futex compare covers the gap. */
    word = idle_sleep(w);
    if (word == PARK_READY)
        word = leave_ready(w);
    st_relaxed(&w->park, PARK_RUNNING);
    if (word == PARK_STOP && stay_for_aside(w))
        return true; /* told to stop with stacks set aside */
    if (word == PARK_STOP) {
        /* Reaped: what it read from io before its stop came left tasks in
         * its queues (pool_io.c), and a queuer may have counted on this worker
         * (it was listed when the queuer looked) and found nobody left to
         * wake. */
        atap__pool_evacuate(w);
        if (!ld_acquire(&atap__pool.stopping) && atap__pool_work_visible(false))
            atap__pool_notify();
        return false;
    }
    w->searching = word == PARK_NOTIFIED;
    return true;
}

/* ---- finding work ------------------------------------------------------ */

/* Runs the first of a batch from the shared queue and rings the rest, the
 * last first: the ring runs newest first, so the batch runs in the order
 * the shared queue gave it (oldest first: spawns from outside the pool,
 * the manager's io reports and timers), and a thief takes its far end. */
static uint32_t from_shared(struct worker *w)
{
    uint32_t batch[INJ_BATCH];
    unsigned n = atap__inj_pop(&atap__pool.inj, &w->cursor, batch, INJ_BATCH);

    for (unsigned i = n; i-- > 1;)
        atap__pool_push_ring(w, batch[i]);
    if (n > 1)
        atap__pool_notify(); /* the rest of the batch can be stolen */
    return n ? batch[0] : 0;
}

/* Takes half of v's ring, up to STEAL_MAX (one CAS each, as Chase-Lev
 * allows), keeping the first and moving the rest into w's ring; else v's
 * LIFO slot. */
static uint32_t steal_from(struct worker *w, struct worker *v)
{
    int64_t want = (ring_len(&v->ring) + 1) / 2;
    uint32_t first = 0, x;
    unsigned misses = 0, moved = 0;

    if (want > STEAL_MAX)
        want = STEAL_MAX;
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
        atap__pool_notify();
    if (!first)
        first = xchg_acqrel(&v->lifo, 0);
    return first;
}

static uint32_t steal(struct worker *w)
{
    unsigned n = ld_acquire(&atap__pool.nrec), start;
    uint32_t x;

    if (n < 2)
        return 0;
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    start = (unsigned)(w->rng % n);
    for (unsigned k = 0; k < n; k++) {
        struct worker *v = &atap__pool_workers[(start + k) % n];

        if (v != w && ld_acquire(&v->status) == W_LIVE && (x = steal_from(w, v)) != 0)
            return x;
    }
    return 0;
}

static uint32_t find_work(struct worker *w)
{
    uint32_t x;

    if (w->lifo_streak < LIFO_STREAK && ld_relaxed(&w->lifo) != 0 &&
        (x = xchg_acqrel(&w->lifo, 0)) != 0) {
        w->lifo_streak++;
        return x;
    }
    w->lifo_streak = 0;
    /* Only the owner adds to its ring and top only grows, so a ring that
     * looks empty here is: no pop (and its fence) needed. */
    if ((ring_len(&w->ring) > 0 && (x = ring_pop(&w->ring)) != 0) || (x = from_shared(w)) != 0)
        return x;
    if ((x = xchg_acqrel(&w->lifo, 0)) != 0)
        return x;
    return steal(w);
}

unsigned atap__pool_records(void) { return ld_acquire(&atap__pool.nrec); }

/* The record's held[] back to its inline array (its thread is leaving). */
void atap__pool_outs_drop(struct worker *w)
{
    for (unsigned c = 0; c < 2; c++) {
        void *b;

        while ((b = w->outs[c]) != NULL) {
            w->outs[c] = *(void **)b;
            free(b);
        }
        w->nouts[c] = 0;
    }
}

void atap__pool_held_reset(struct worker *w)
{
    if (w->held != w->held_inline)
        free(w->held);
    w->held = w->held_inline;
    w->held_cap = HELD_INLINE;
    atap__pool_outs_drop(w);
}

/* ---- submitting -------------------------------------------------------- */

/* After queueing work outside a worker: with no worker left (every one died
 * and its replacement was refused), start one. A start refused here too is
 * retried by the manager's tick. */
static void ensure_worker(void)
{
    if (ld_relaxed(&atap__pool.nlive) != 0)
        return;
    pthread_mutex_lock(&atap__pool.lock);
    if (ld_relaxed(&atap__pool.nlive) == 0 && !ld_relaxed(&atap__pool.stopping))
        atap__pool_start_thread(false, NULL);
    pthread_mutex_unlock(&atap__pool.lock);
}

/* Wakes an idle blocking thread, or starts one, for work in the queue. */
void atap__pool_wake_blocker(void)
{
    struct worker *w = NULL;

    /* Same lost-wake handshake as the workers': the task is queued before
     * bidle is read; an idling thread counts itself before its last look. */
    fence_seqcst();
    if (ld_relaxed(&atap__pool.bidle) == 0 && ld_relaxed(&atap__pool.blive) >= atap__pool.bcap)
        return; /* every thread busy: the first one free takes it */
    pthread_mutex_lock(&atap__pool.lock);
    if (!(w = pop_idle(&atap__pool.bidle_list, &atap__pool.bidle)) &&
        ld_relaxed(&atap__pool.blive) < atap__pool.bcap && !ld_relaxed(&atap__pool.stopping))
        atap__pool_start_thread(true, NULL);
    pthread_mutex_unlock(&atap__pool.lock);
    if (w) {
        atap__pool_unpark(w, PARK_NOTIFIED);
    }
}

static void submit_blocking(uint32_t ref, int priority, bool due)
{
    atap__inj_push(&atap__pool.binj, &ref, 1, atap__inj_band(priority, due));
    atap__pool_wake_blocker();
}

void atap__pool_submit_batch(const uint32_t *refs, unsigned n)
{
    if (n == 0)
        return;
    /* One CAS a band, then one wake check. */
    atap__pool_push_shared(&atap__pool.inj, refs, n, true);
    ensure_worker();
    atap__pool_notify();
}

void atap__pool_submit(uint32_t ref, int priority, bool blocking)
{
    atap__pool_submit_as(ref, priority, blocking, false);
}

void atap__pool_submit_as(uint32_t ref, int priority, bool blocking, bool due)
{
    struct worker *w = atap__self;
    uint32_t old;

    if (blocking) {
        submit_blocking(ref, priority, due);
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
        old = xchg_acqrel(&w->lifo, ref);
        if (!old)
            return;
        atap__pool_push_ring(w, old);
    } else {
        /* The push is a seq_cst RMW (injector.c): no fence needed. */
        atap__inj_push(&atap__pool.inj, &ref, 1, atap__inj_band(priority, due));
        ensure_worker();
        notify_look();
        return;
    }
    atap__pool_notify();
}

/* ---- the threads ------------------------------------------------------- */

/*
 * Before parking, a worker spins a short while as a searcher: a spawner
 * seeing a searcher wakes nobody, so a stream of spawns slower than the
 * workers costs no futex wake per task. At most half the workers spin.
 */
static bool spin_for_work(struct worker *w)
{
    unsigned searching = ld_relaxed(&atap__pool.nsearching);

    if (!w->searching) {
        if (2 * searching >= ld_relaxed(&atap__pool.nlive) ||
            !cas_seqcst(&atap__pool.nsearching, &searching, searching + 1))
            return false;
        w->searching = true;
    }
    for (unsigned i = 0; i < SPIN_ROUNDS; i++) {
        TEST_HOOK(ATAP__TEST_SEARCHING);
        if (i % 8 == 7)
            sched_yield(); /* more threads than cores: let the spawner run */
        else
            for (unsigned k = 0; k < 32; k++)
                cpu_relax();
        if (atap__pool_work_visible(false))
            return true;
    }
    return false;
}

/*
 * A worker that found no work, with the timers' next due time this near
 * (a few of the wheel's ticks), stays awake for it rather than park: it
 * looks for work until then, then fires what is due itself (the conf's
 * due: only if the wheel's seat is free) and runs it. Parked, it would be
 * woken for those runs by whoever fired them, and a woken thread can wait
 * a whole scheduler slice for a CPU: the kernel may queue it behind a busy
 * thread while another CPU idles (bench/README.md, timers). One worker at
 * a time keeps this watch (timer_watch), so the others park. It never
 * spins on a due time nobody can fire: past it, it tries once, and parks
 * if the due time did not move (the seat's holder fires it). The watch
 * takes no part in the parking protocol: a worker counted as searching
 * stays counted (a queuer then wakes nobody, and the watch sees the work
 * at its next look), and any worker looks at every queue again
 * (find_work) and parks by the protocol afterwards. The cost is a CPU
 * while due times come this close together (bench/README.md).
 */
static __attribute__((noinline)) bool spin_for_timers(uint64_t due)
{
    uint64_t now = atap__now_ns(), after;
    bool found = false;

    /* The flag only keeps a second watcher away: what the fire touches is
     * ordered by the wheel's seat, so acquire and release (below) are more
     * than it needs, and cost nothing on this cold path. */
    if ((due > now && due - now > TIMER_SPIN_NS) || ld_relaxed(&atap__pool.timer_watch) ||
        xchg_acquire(&atap__pool.timer_watch, true))
        return false;
    for (unsigned rounds = 1; now < due; rounds++) {
        if (rounds % 64 == 0)
            sched_yield(); /* about every 64 us: a thread waiting for this CPU runs */
        else
            for (unsigned k = 0; k < 32; k++)
                cpu_relax();
        if ((found = atap__pool_work_visible(false)))
            break;
        now = atap__now_ns();
    }
    if (!found) {
        if (atap__pool.due)
            atap__pool.due();
        after = ld_relaxed(atap__pool.due_at);
        found = atap__pool_work_visible(false) || after != due;
    }
    st_release(&atap__pool.timer_watch, false);
    return found;
}

/* What every loop does first: go on with a stack set aside whose wait is
 * over (this one, holding no frame, becomes free, and goes on from here
 * when it is taken again), then run what the stack was taken for. False:
 * the thread's loop ends (on its own stack). */
static inline bool loop_top(struct worker *w)
{
    uint32_t first;

    /* The task this stack was taken for first: nobody else will run it
     * (its RUN is this thread's), and a switch now would leave it. */
    if (unlikely((first = w->handoff) != 0)) {
        w->handoff = 0;
        st_relaxed(&w->busy, true);
        atap__pool.ops->run(w, first);
        st_relaxed(&w->busy, false);
    }
    if (unlikely(w->stack != w->base) || (unlikely(w->naside != 0) && atap__pool_aside_pending(w)))
        atap__pool_switch_point(w);
    return !unlikely(w->exiting);
}

static void worker_loop(struct worker *w)
{
    uint32_t ref;

    while (loop_top(w)) {
        if (FAULT_WORKER_DIES(false))
            atap__pool_die(w); /* an injected death, idle */
        if ((ref = find_work(w)) != 0) {
            if (w->searching)
                leave_search(w);
            st_relaxed(&w->busy, true);
            atap__pool.ops->run(w, ref);
            st_relaxed(&w->busy, false);
            /* So that readiness is heard while every worker is running. */
            if (unlikely(++w->io_runs >= IO_EVERY_RUNS))
                atap__pool_busy_io(w);
            continue;
        }
        if (spin_for_work(w) || aside_due(w))
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
    uint64_t due, now;
    bool listed;

    if ((word = join_idle(w, &atap__pool.bidle_list, &atap__pool.bidle)) != PARK_IDLE)
        return word == PARK_RUNNING || stay_for_aside(w);
    fence_seqcst(); /* lost-wake handshake with submit_blocking (and a kick) */
    if (atap__inj_empty(&atap__pool.binj) && !aside_due(w)) {
        /* With stacks set aside it stays (their waits end here), and
         * wakes for their deadlines. */
        due = w->naside ? atap__pool_aside_due(w) : atap__deadline_in(BLOCKING_IDLE_NS);
        if ((now = atap__now_ns()) < due)
            atap__word_wait(&w->park, PARK_IDLE, due == ATAP__FOREVER ? due : due - now);
    }
    pthread_mutex_lock(&atap__pool.lock);
    if ((listed = w->in_idle)) { /* nobody woke us (or a kick: READY) */
        atap__pool_unlink_from(&atap__pool.bidle_list, &atap__pool.bidle, w);
        if (w->naside == 0) {
            sub_relaxed(&atap__pool.blive, 1);
            w->uncounted = true;
        }
    }
    pthread_mutex_unlock(&atap__pool.lock);
    if (listed && w->naside) {
        st_relaxed(&w->park, PARK_RUNNING);
        return true;
    }
    if (listed) {
        bool stay;

        fence_seqcst();
        if (atap__inj_empty(&atap__pool.binj) || ld_acquire(&atap__pool.stopping))
            return false;
        /* Work came in after all: stay, counted again under the lock, unless
         * a submitter started a thread meanwhile that fills the cap (that
         * thread, or the first busy one free, takes the work). */
        pthread_mutex_lock(&atap__pool.lock);
        if ((stay = ld_relaxed(&atap__pool.blive) < atap__pool.bcap)) {
            add_relaxed(&atap__pool.blive, 1);
            w->uncounted = false;
        }
        pthread_mutex_unlock(&atap__pool.lock);
        return stay;
    }
    /* Taken off the list by a waker, whose store comes right after (over
     * a kick's READY). */
    while ((word = ld_acquire(&w->park)) == PARK_IDLE || word == PARK_READY)
        atap__word_wait(&w->park, word, ATAP__FOREVER);
    st_relaxed(&w->park, PARK_RUNNING);
    return word != PARK_STOP || stay_for_aside(w);
}

static void blocker_loop(struct worker *w)
{
    uint32_t ref;

    while (loop_top(w)) {
        if (FAULT_WORKER_DIES(true))
            atap__pool_die(w); /* an injected death, idle */
        /* Counted busy before the pop, so a drain never sees a task in
         * neither the queue nor the busy count (quiescent). */
        add_seqcst(&atap__pool.bbusy, 1);
        st_relaxed(&w->busy, true);
        if (atap__inj_pop(&atap__pool.binj, &w->cursor, &ref, 1)) {
            /* The pop may have flipped a band, hiding its other tasks from
             * idle threads for a moment: more work left means one more
             * thread, since this one is about to be busy. */
            if (!atap__inj_empty(&atap__pool.binj))
                atap__pool_wake_blocker();
            atap__pool.ops->run(w, ref);
            st_relaxed(&w->busy, false);
            /* What the run queued may have woken nobody (every blocking
             * thread busy): the epoch tells a drain that read the queues
             * before it (quiescent). */
            add_seqcst(&atap__pool.epoch, 1);
            sub_seqcst(&atap__pool.bbusy, 1);
            continue;
        }
        st_relaxed(&w->busy, false);
        sub_seqcst(&atap__pool.bbusy, 1);
        if (!blocker_wait(w))
            return;
    }
}

/* Where this thread's own stack lies: glibc says; elsewhere it is taken
 * to end `size` below here (the thread's first frame). */
static __attribute__((noinline)) void stack_here(size_t size, char **lo_out, size_t *size_out)
{
    char here;
    uintptr_t top = (uintptr_t)&here, lo = 0;
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
    if (lo == 0) {
        lo = top > size ? top - size : 0;
        size = top - lo;
    }
    *lo_out = (char *)lo;
    *size_out = size;
}

void atap__pool_loop(struct worker *w)
{
    if (w->blocking)
        blocker_loop(w);
    else
        worker_loop(w);
}

static void *thread_main(void *arg)
{
    struct worker *w = arg;
    char *lo;
    size_t size;

    atap__self = w;
    stack_here(atap__pool.stack, &lo, &size);
#if defined(__linux__)
    st_relaxed(&w->tid, (int)syscall(SYS_gettid));
#endif
#if defined(__linux__)
    pthread_setname_np(pthread_self(), w->blocking ? "atap-blocking" : "atap-worker");
#elif defined(__APPLE__)
    pthread_setname_np(w->blocking ? "atap-blocking" : "atap-worker");
#endif
    atap__trace_lane = w->blocking ? "atap-blocking" : "atap-worker";
    atap__trace_lane_no = w->index + 1;
    ATAP_TRACE(TR_THREAD, 0, NULL, w->blocking);
    pthread_cleanup_push(atap__pool_thread_died, w);
    /* With no record for its own stack (no memory), the thread runs on
     * it alone: its waits then hold it (read.c). */
    (void)atap__pool_stacks_begin(w, lo, size);
    atap__pool_loop(w);
    pthread_cleanup_pop(0);
    atap__pool_stacks_end(w);
    atap__pool_held_reset(w);
    atap__self = NULL; /* as in thread_died */
    pthread_mutex_lock(&atap__pool.lock);
    if (!w->uncounted)
        sub_relaxed(w->blocking ? &atap__pool.blive : &atap__pool.nlive, 1);
    pthread_mutex_unlock(&atap__pool.lock);
    st_release(&w->status, W_DEAD);
    return NULL;
}

void atap__pool_wake_all(void)
{
    pthread_mutex_lock(&atap__pool.lock);
    atap__pool_unpark_all(PARK_NOTIFIED);
    pthread_mutex_unlock(&atap__pool.lock);
}

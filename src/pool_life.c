/*
 * The pool's life as runtime.c drives it: its start (the floor, target,
 * ceiling and cap of its threads), the shutdown's drain and stop, what
 * reads the records from outside (stats, a canceller's interrupt of a
 * kernel wait), and the reset in a fork's child.
 *
 * Shutdown drains: it waits until every worker is idle, every queue empty
 * and no blocking task runs, checked under an epoch that moves whenever a
 * thread may start running (taken off an idle list, or started), then stops
 * and joins every thread (quiescent() says why one look is enough), and
 * closes the event queue each record kept for its threads' kernel waits
 * (close_queues). The manager is stopped by then, so the drain makes the
 * tick's hand-offs itself (keep_going).
 */
#include "pool.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atap.h"
#include "atomics.h"
#include "cpus.h"
#include "poller.h"
#include "pool_int.h"

/* ---- start, drain, stop ------------------------------------------------ */

/* The most workers (atap.h, atap_pool_stats), with `live` running now:
 * those and as many more as the kernel would let the process start
 * (atap__thread_room: RLIMIT_NPROC, the cgroup's pids.max, and RLIMIT_AS's
 * room over what a thread reserves, its stack rounded up to pages and a
 * guard page), and as many whole worker stacks as a quarter of the
 * machine's memory holds (a worker blocked deep in a chain of waits has
 * touched all of its own); never below the floor nor above the records.
 * Read at the start, and again by the tick when the pool would grow past
 * it (pool_grow.c), which also lowers it to the workers there are when the
 * kernel refuses a start. */
unsigned atap__pool_ceiling_read(unsigned live)
{
    unsigned long long limit = POOL_MAX_THREADS, room;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t stack = atap__pool.stack, reserve;

    if (pages > 0 && page > 0 && stack > 0 &&
        (unsigned long long)pages * (unsigned long long)page / 4 / stack < limit)
        limit = (unsigned long long)pages * (unsigned long long)page / 4 / stack;
    reserve =
        page > 0 ? (stack + (size_t)page - 1) / (size_t)page * (size_t)page + (size_t)page : stack;
    if ((room = (unsigned long long)live + atap__thread_room(reserve)) < limit)
        limit = room;
    return limit < atap__pool.floor ? atap__pool.floor : (unsigned)limit;
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
    unsigned long bcap =
        conf->blocking ? conf->blocking : (unsigned long)cpus * conf->blocking_per_cpu;
    unsigned long target = (unsigned long)cpus * conf->workers_per_cpu;
    size_t stack = conf->stack;
    int rc = 0;

    atap__pool.ops = conf->ops;
    atap__pool.io_event = conf->io_event;
    atap__pool.due = conf->due;
    atap__pool.due_at = conf->due_at;
    atap__pool.bcap = at_most(bcap, POOL_MAX_THREADS);
    atap__pool.floor = floor;
    atap__pool.stack = stack;
    st_relaxed(&atap__pool.ceiling, atap__pool_ceiling_read(0));
    atap__pool.target = target < floor ? floor : at_most(target, ld_relaxed(&atap__pool.ceiling));
    atap__pool.ticks = atap__pool.ceiling_read_at = 0;
    st_relaxed(&atap__pool.peak, 0); /* peaks are per run of the runtime */
    st_relaxed(&atap__pool.peak_aside, 0);
    st_relaxed(&atap__pool.nsearching, 0);
    st_seqcst(&atap__pool.stopping, false);
    st_relaxed(&atap__pool.timer_watch, false); /* a watcher that died keeps none */
    pthread_mutex_lock(&atap__pool.lock);
    for (unsigned i = 0; i < floor && rc == 0; i++)
        rc = atap__pool_start_thread(false, NULL);
    pthread_mutex_unlock(&atap__pool.lock);
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
    uint64_t epoch = ld_seqcst(&atap__pool.epoch);
    bool quiet = ld_seqcst(&atap__pool.nidle) == ld_seqcst(&atap__pool.nlive) &&
                 !atap__pool_work_visible(true) && atap__inj_empty(&atap__pool.binj);

    fence_seqcst();
    /* A stack set aside holds a run under way: its worker may sit idle
     * meanwhile. Counted before the stack's worker could go idle, and
     * counted out after its run went on. */
    return quiet && ld_seqcst(&atap__pool.bbusy) == 0 && ld_seqcst(&atap__pool.naside) == 0 &&
           ld_seqcst(&atap__pool.epoch) == epoch;
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

/* Cancellers inside interrupt_in, between their look at a record's kq and
 * their wake of it: close_queues waits for none to be left. */
static _Atomic unsigned interrupters;

/* No thread is left (joined): each record's own event queue is closed, and
 * the thread that next runs on the record makes a new one (kwait.c). A
 * canceller may still be looking (atap__pool_interrupt, from any thread):
 * the queue is taken off the record (seq_cst) before the count of those
 * is read (seq_cst), and they count themselves in before they look, so
 * either it waits for one or that one finds no queue. */
static void close_queues(struct worker *recs, unsigned n)
{
    struct atap_poller *kq;
    unsigned spins = 0;

    for (unsigned i = 0; i < n; i++) {
        if (!(kq = ld_relaxed(&recs[i].kq)))
            continue;
        st_seqcst(&recs[i].kq, NULL);
        while (ld_seqcst(&interrupters) != 0)
            spin_pause(&spins);
        atap__poller_close(kq);
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
            atap__pool_keep_going();
    }
    pthread_mutex_lock(&atap__pool.lock);
    st_seqcst(&atap__pool.stopping, true);
    atap__pool_unpark_all(PARK_STOP);
    pthread_mutex_unlock(&atap__pool.lock);
    /* Joining takes no lock a dying or exiting thread still needs. */
    join_all(atap__pool_workers, &atap__pool.nrec);
    join_all(atap__pool_blockers, &atap__pool.brec);
    /* every thread is told to stop: none races this */
    for (; atap__pool.nzombies > 0; atap__pool.nzombies--)
        pthread_join(atap__pool.zombies[atap__pool.nzombies - 1], NULL);
    atap__pool_stacks_reclaim(); /* every thread that died is gone */
    close_queues(atap__pool_workers, ld_relaxed(&atap__pool.nrec));
    close_queues(atap__pool_blockers, ld_relaxed(&atap__pool.brec));
}

/* ---- stats ------------------------------------------------------------- */

unsigned atap__pool_live_workers(void) { return ld_relaxed(&atap__pool.nlive); }

bool atap__pool_stopped(void) { return ld_seqcst(&atap__pool.stopping); }

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
            struct atap_poller *kq;
            add_seqcst(&interrupters, 1); /* against close_queues */
            if ((kq = ld_seqcst(&recs[i].kq)) != NULL)
                atap__poller_wake(kq);
            sub_seqcst(&interrupters, 1);
        }
    }
}

void atap__pool_interrupt(uint64_t key)
{
    interrupt_in(atap__pool_workers, ld_acquire(&atap__pool.nrec), key);
    interrupt_in(atap__pool_blockers, ld_acquire(&atap__pool.brec), key);
}

void atap__pool_stats(struct atap_pool_stats *st)
{
    size_t queued = atap__inj_len(&atap__pool.inj) + atap__inj_len(&atap__pool.binj);
    uint64_t done = 0;

    st->workers = ld_relaxed(&atap__pool.nlive);
    st->blocking_threads = ld_relaxed(&atap__pool.blive);
    st->busy = st->blocking_busy = 0;
    count_records(atap__pool_workers, ld_acquire(&atap__pool.nrec), &st->busy, &done, &queued);
    count_records(atap__pool_blockers, ld_acquire(&atap__pool.brec), &st->blocking_busy, &done,
                  &queued);
    st->queued = queued;
    st->peak_workers = ld_relaxed(&atap__pool.peak);
    st->deaths = ld_acquire(&atap__pool.deaths);
    st->completed = done;
    st->aside = ld_relaxed(&atap__pool.naside);
    st->ceiling = ld_relaxed(&atap__pool.ceiling);
    st->peak_aside = ld_relaxed(&atap__pool.peak_aside);
    st->stacks = ld_relaxed(&atap__pool.nstacks);
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
    /* Only the records in use: the rest were never written (their rings
     * are 16 KiB each, untouched until used). */
    memset(recs, 0, (n < POOL_MAX_THREADS ? n : POOL_MAX_THREADS) * sizeof *recs);
}

void atap__pool_forget(void)
{
    forget_records(atap__pool_workers, ld_relaxed(&atap__pool.nrec));
    forget_records(atap__pool_blockers, ld_relaxed(&atap__pool.brec));
    memset(&atap__pool, 0, sizeof atap__pool);
    st_relaxed(&interrupters, 0); /* one the fork cut short is not here to count out */
    atap__pool.lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    atap__pool_aside_forget();
    atap__self = NULL;
}

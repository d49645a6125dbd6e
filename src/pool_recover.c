/*
 * A pool thread that dies under a task: what its death undoes, and its
 * replacement, started as pool.c starts any thread. thread_main (pool.c)
 * pushes the handler; the record reads DEAD last, as pool.c's top comment
 * says records do.
 *
 * Thread death: a task that calls pthread_exit unwinds its thread through
 * the cleanup handler pushed in thread_main. It fails every task the thread
 * was inside (held[] of each of its stacks, innermost first),
 * each as a failed run ends (a series with its run, an at-rate run telling
 * its series), moves the thread's queued tasks to the shared queue, starts a
 * replacement, and marks the record DEAD last, so that whoever joins a DEAD
 * record never waits on a thread that still needs the pool lock.
 */
#include "pool.h"

#include "atap.h"
#include "atomics.h"
#include "pool_int.h"

/* Moves a worker's queued tasks to the shared queue: a dying one's, or a
 * reaped one's (the reports it read from io while its stop was on its way
 * resumed tasks into its queues: pool.c). */
void atap__pool_evacuate(struct worker *w)
{
    uint32_t refs[MOVE_CHUNK + 1], x;
    unsigned n = 0;

    while ((x = ring_pop(&w->ring)) != 0) {
        refs[n++] = x;
        if (n == MOVE_CHUNK) {
            atap__pool_push_shared(&atap__pool.inj, refs, n, false);
            n = 0;
        }
    }
    if ((x = xchg_acqrel(&w->lifo, 0)) != 0)
        refs[n++] = x;
    atap__pool_push_shared(&atap__pool.inj, refs, n, false);
}

void atap__pool_thread_died(void *arg)
{
    struct worker *w = arg;

    /* Every run on each of its stacks fails, innermost first, each stack
     * unwound in turn (pool_aside.c); this handler, on its own stack, is
     * the last to run. */
    atap__pool_stacks_died(w);
    atap__pool_held_reset(w);
    st_relaxed(&w->busy, false);
    if (w->searching)
        sub_seqcst(&atap__pool.nsearching, 1);
    if (!w->blocking)
        atap__pool_evacuate(w);
    pthread_mutex_lock(&atap__pool.lock);
    /* One counted out already (reaped, or a blocking thread timing out) was
     * leaving anyway: no replacement. */
    if (!w->uncounted) {
        /* seq_cst (a release): a drain that reads the lower count sees the
         * tasks evacuated above. */
        sub_seqcst(w->blocking ? &atap__pool.blive : &atap__pool.nlive, 1);
        if (!ld_relaxed(&atap__pool.stopping) &&
            (!w->blocking || !atap__inj_empty(&atap__pool.binj)))
            atap__pool_start_thread(w->blocking, w);
    }
    /* Counted after the replacement: release, so whoever reads the new
     * count (acquire, in the stats) also sees the replacement counted live. */
    add_release(&atap__pool.deaths, 1);
    pthread_mutex_unlock(&atap__pool.lock);
    if (!w->blocking)
        atap__pool_notify();
    /* What this thread's later destructors spawn goes where an outside
     * thread's would, not into the queues of a record about to read DEAD. */
    atap__self = NULL;
    st_release(&w->status, W_DEAD); /* last: joiners may now join us */
}

#ifdef ATAP_FAULT_INJECTION
/* Owed deaths (faults.h): taken by the next threads to look, idle ones
 * too, which are woken for it. */
void atap_inject_thread_deaths(unsigned workers, unsigned blocking)
{
    add_relaxed(&atap__owed_worker_deaths, workers);
    add_relaxed(&atap__owed_blocking_deaths, blocking);
    atap__pool_wake_all();
}
#endif

/*
 * Reading a task: join, take, wait, and the state queries.
 *
 * A reader holds a listener (its handle), so the slot is the task's for as
 * long as it reads; the generation is checked against the word first, so a
 * stale handle reads ATAP_ENOTASK. Waiting follows executor.c's rule: set
 * WAITERS, then sleep on the word with the word the kernel compares; the
 * settler wakes when it sees WAITERS. On a pool thread the wait runs only
 * work the awaited task needs (help.c), shows what
 * it waits for while it runs nothing (so that a waiter for a task lower on
 * its stack can follow it), blocks lending its core, and sleeps in short
 * slices so that it can look again. An output is copied only while the word reads
 * READY (acquire: the run's output write came before its release of READY);
 * take moves it to TAKEN by CAS first, so only one taker copies it.
 */
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "extras.h"
#include "executor.h"
#include "handle.h"
#include "pool.h"
#include "slot.h"
#include "wait.h"

#define SLICE_MIN_NS 50000u
#define SLICE_MAX_NS 10000000u

static int state_error_of(struct atap_slot *s, uint32_t state)
{
    switch (state) {
    case ST_TAKEN: /* a series that ran out has nothing more coming */
        return s->ext && atap__extras.time->ran_out(s) ? ATAP_EFINISHED : ATAP_ETAKEN;
    case ST_CANCELLED: return ATAP_ECANCELLED;
    case ST_TIMED_OUT: return ATAP_ETIMEDOUT;
    case ST_FAILED: { /* the run's own code, if it failed with one */
        /* Atomic: an at-rate series' runs write it (rate.c). */
        uint8_t code = __atomic_load_n(&s->fail_code, __ATOMIC_RELAXED);

        return code ? ATAP_FAIL_BASE - code : ATAP_EFAILED;
    }
    case ST_READY: return 0;
    default: return ATAP_ENOTREADY;
    }
}

/* Outputs are often a word or two: those copy without a call. */
static inline void copy_bytes(void *dst, const void *src, size_t n)
{
    switch (n) {
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, n); break;
    }
}

#define WAIT_SPINS 64 /* looks for work the awaited task needs before blocking */
#define WATCH_NS 1000000u /* looks on while its runner moves, this long after a help */

/* A pool thread's wait: whether it shows the task it waits for to others
 * (atap__pool_wait_begin: only while it runs nothing, the only time a
 * waiter for a task lower on its stack needs to know) and what to put
 * back then. */
struct waiting {
    struct worker *w;
    bool shown;
    uint64_t saved[2];
};

static void show(struct waiting *wt, uint32_t ref, uint32_t gen)
{
    if (!wt->shown) {
        atap__pool_wait_begin(wt->w, (uint64_t)gen << 32 | ref, wt->saved);
        wt->shown = true;
    }
}

/* Runs nothing, waits no more (rc), or runs a piece of work (rc 0): no
 * longer shown, no longer blocked. */
static int unblocked(struct waiting *wt, int rc)
{
    if (wt->shown) {
        atap__pool_wait_end(wt->w, wt->saved);
        wt->shown = false;
    }
    if (wt->w && ld_relaxed(&wt->w->blocked))
        atap__pool_blocked(wt->w, false);
    return rc;
}

/* Whether the worker running what a wait needs (runner, found by the
 * look just made) has finished a run since the look before, which found
 * the same one: *last and *seen keep that look's runner and its count. */
static bool runner_moved(struct worker *runner, struct worker **last, uint64_t *seen)
{
    /* Relaxed: a count, only compared with the last one read; a stale
     * read only starts or ends a watch one look late. */
    uint64_t done = ld_relaxed(&runner->completed);
    bool moved = runner == *last && done != *seen;

    *last = runner;
    *seen = done;
    return moved;
}

/* Within WATCH_NS of the first look since the last help that found
 * nothing (*from: that look's time, 0 until it is made). */
static bool watching(uint64_t *from)
{
    uint64_t now = atap__now_ns();

    if (*from == 0)
        *from = now;
    return now - *from < WATCH_NS;
}

/*
 * Waits until the task settles or the deadline passes. A pool thread runs
 * meanwhile only work the awaited task needs (atap__pool_help_pick: the
 * task itself while queued, work it spawned, what it waits for); with
 * none, it looks again a few times, then blocks, lending its core to the
 * pool, and sleeps in short slices so that it can look again. While the
 * worker running the awaited task keeps finishing runs, though, the work
 * it needs comes and goes in that worker's queues faster than a sleeper
 * would see: the waiter goes on looking (unblocked: its core is in use),
 * and blocks once that worker stays inside one run, or once looking has
 * found nothing for WATCH_NS (then 64 more looks, as before any block).
 * Elsewhere it sleeps on the word until woken.
 */
static int wait_settled(struct atap_slot *s, uint32_t ref, uint32_t gen, uint64_t deadline,
                        uint32_t *state)
{
    struct waiting wt = {.w = atap__self};
    struct worker *w = wt.w, *runner, *last = NULL;
    uint64_t slice = SLICE_MIN_NS, now, left, seen = 0, watch_from = 0;
    unsigned spins = 0, watched = 0;
    bool looked = false, watch;
    enum help_how how;
    uint32_t cur, x;

    for (;;) {
        cur = ld_acquire(&s->word);
        if (!word_is(cur, gen))
            return unblocked(&wt, ATAP_ENOTASK);
        if (state_terminal(word_state(cur))) {
            *state = word_state(cur);
            return unblocked(&wt, 0);
        }
        /* Help only while time is left: a timed wait returns at most one
         * helped run past its deadline. */
        runner = NULL;
        if (w && (deadline == ATAP__FOREVER || atap__now_ns() < deadline) &&
            (x = atap__pool_help_pick(w, s, ref, gen, &how, &runner)) != 0) {
            unblocked(&wt, 0); /* what it runs may wait in turn */
            atap__pool_help_run(w, x, how);
            slice = SLICE_MIN_NS;
            spins = 0;
            watched = 0;
            watch_from = 0;
            continue;
        }
        /* About to sleep. A task this thread is inside (itself, or one
         * lower on its stack) could only settle once this wait returns:
         * refuse rather than hang. Looked at once, off the fast path: a
         * join that finds its task done never gets here, and what lies
         * below this wait on the stack does not change while it lasts. */
        if (!looked && atap__exec_inside(w, ref))
            return unblocked(&wt, ATAP_EINVAL);
        looked = true;
        if (w)
            show(&wt, ref, gen);
        /* Its runner moving: look on, unblocked, as a waiter that has
         * just helped, until WATCH_NS after the first look since the last
         * help that found nothing (a runner busy with runs that leave
         * nothing to take does not keep a core spinning for long). What
         * its own queues hold is out of its reach meanwhile: an idle
         * worker is woken for it, as one that blocks wakes one. */
        watch = w && watching(&watch_from) && runner && runner_moved(runner, &last, &seen);
        if (watch) {
            if (watched++ == 0)
                atap__pool_offer_own(w);
            spins = 0;
            slice = SLICE_MIN_NS;
            if (ld_relaxed(&w->blocked))
                atap__pool_blocked(w, false);
        }
        if (w && spins < WAIT_SPINS) {
            /* Each look reads lines the runner writes as it goes: while
             * watching it, looks that keep finding nothing come further
             * apart (16 pauses, doubling every 16 looks up to 512). */
            unsigned pauses = watch ? 16u << (watched < 16 * 5 ? watched / 16 : 5) : 16u;

            spins++;
            for (unsigned k = 0; k < pauses; k++)
                cpu_relax();
            continue;
        }
        /* Nothing it may run: the worker blocks and its core is lent. If
         * the task is still queued and every worker the pool may have is
         * blocked so, nothing can run it: give up, rather than hang. */
        if (w && !w->blocking) {
            atap__pool_blocked(w, true);
            if (word_state(cur) == ST_PENDING && atap__pool_stalled(w))
                return unblocked(&wt, ATAP_ELIMIT);
        }
        now = deadline == ATAP__FOREVER ? 0 : atap__now_ns();
        if (now >= deadline)
            return unblocked(&wt, ATAP_ENOTREADY);
        if (!(cur & ST_WAITERS) && !cas_acqrel(&s->word, &cur, cur | ST_WAITERS))
            continue;
        left = deadline - now;
        if (w) {
            left = left < slice ? left : slice;
            slice = slice * 2 < SLICE_MAX_NS ? slice * 2 : SLICE_MAX_NS;
        }
        atap__word_wait(&s->word, cur | ST_WAITERS, left);
    }
}

/* Copies the output out if the task is READY. */
static inline __attribute__((always_inline)) int copy_out(struct atap_slot *s, uint32_t gen,
                                                          void *out)
{
    uint32_t cur;
    int rc = 0;

    if (unlikely(s->ext != NULL))
        atap__extras.time->read_lock(s); /* a repeat's next run can't publish meanwhile */
    cur = ld_acquire(&s->word);
    if (!word_is(cur, gen))
        rc = ATAP_ENOTASK;
    else if (word_state(cur) != ST_READY)
        rc = state_error_of(s, word_state(cur));
    else if (s->out_size)
        copy_bytes(out, slot_out(s), s->out_size);
    if (unlikely(s->ext != NULL))
        atap__extras.time->read_unlock(s);
    return rc;
}

/* READY -> TAKEN, then the copy: from then on the output is the caller's. */
static int move_out(struct atap_slot *s, uint32_t gen, void *out)
{
    uint32_t cur;
    int rc = 0;

    if (unlikely(s->ext != NULL))
        atap__extras.time->read_lock(s); /* what is moved out is what gets copied */
    cur = ld_acquire(&s->word);
    do {
        if (!word_is(cur, gen)) {
            rc = ATAP_ENOTASK;
            break;
        }
        if (word_state(cur) != ST_READY) {
            rc = state_error_of(s, word_state(cur));
            break;
        }
    } while (!cas_acqrel(&s->word, &cur, make_word(gen, ST_TAKEN)));
    if (rc == 0 && s->out_size)
        copy_bytes(out, slot_out(s), s->out_size);
    /* The output is the taker's now: nothing left in the slot to let go of,
     * whatever state the task moves on to (a repeat's next run writes
     * filled again, under the write lock this read lock excludes). */
    if (rc == 0)
        s->filled = 0;
    if (unlikely(s->ext != NULL))
        atap__extras.time->read_unlock(s);
    return rc;
}

static inline __attribute__((always_inline)) int read_output(atap_task t, void *out, size_t size,
                                                             uint64_t timeout_ns, bool take)
{
    uint32_t gen, state, cur;
    struct atap_slot *s = lookup(t, &gen);
    struct worker *w;
    uint64_t deadline;
    int rc;

    if (!s || !handle_live(s, gen, &cur))
        return ATAP_ENOTASK;
    if (size != s->out_size || (size && !out))
        return ATAP_EINVAL;
    if (timeout_ns == 0) /* no wait: a run under way is simply not ready */
        return state_terminal(word_state(cur))
                   ? (take ? move_out(s, gen, out) : copy_out(s, gen, out))
                   : ATAP_ENOTREADY;
    if (state_terminal(word_state(cur)) &&
        (rc = take ? move_out(s, gen, out) : copy_out(s, gen, out)) != ATAP_ENOTREADY)
        return rc; /* settled already: no wait, no clock */
    deadline = atap__deadline_in(timeout_ns);
    /* A task this worker spawned and left in its own queues (its LIFO
     * slot, its ring's newest entry): run it here and now, as the wait's
     * first look would, without the wait around it. */
    if ((w = atap__self) != NULL && atap__pool_help_own(w, (uint32_t)t.id + 1)) {
        atap__exec_run(w, (uint32_t)t.id + 1, false);
        if (state_terminal(word_state(ld_acquire(&s->word))) &&
            (rc = take ? move_out(s, gen, out) : copy_out(s, gen, out)) != ATAP_ENOTREADY)
            return rc;
    }
    do {
        if ((rc = wait_settled(s, (uint32_t)t.id + 1, gen, deadline, &state)) != 0)
            return rc;
        rc = take ? move_out(s, gen, out) : copy_out(s, gen, out);
        /* ENOTREADY here: a repeat's next run started between the wait and
         * the read. Wait for that one (the wait still keeps the deadline). */
    } while (rc == ATAP_ENOTREADY);
    return rc;
}

int atap_join(atap_task t, void *out, size_t size)
{
    return read_output(t, out, size, ATAP__FOREVER, false);
}

int atap_join_for(atap_task t, void *out, size_t size, uint64_t timeout_ns)
{
    return read_output(t, out, size, timeout_ns, false);
}

int atap_try_join(atap_task t, void *out, size_t size)
{
    return read_output(t, out, size, 0, false);
}

int atap_take(atap_task t, void *out, size_t size)
{
    return read_output(t, out, size, ATAP__FOREVER, true);
}

int atap_take_for(atap_task t, void *out, size_t size, uint64_t timeout_ns)
{
    return read_output(t, out, size, timeout_ns, true);
}

int atap_try_take(atap_task t, void *out, size_t size)
{
    return read_output(t, out, size, 0, true);
}

int atap_wait(atap_task t, atap_state *state)
{
    uint32_t gen, st, cur;
    struct atap_slot *s = lookup(t, &gen);
    int rc;

    if (!s || !handle_live(s, gen, &cur))
        return ATAP_ENOTASK;
    if ((rc = wait_settled(s, (uint32_t)t.id + 1, gen, ATAP__FOREVER, &st)) == 0 && state)
        *state = (atap_state)st;
    return rc;
}

/* The word says PENDING or RUNNING both for a task queued or on a thread
 * and for one that holds none: parked (its RUN is with the park) or
 * waiting for a give (with the gate). Those read ATAP_WAITING: a look at
 * the park's claim and the gate after the word, a snapshot like the word. */
atap_state atap_state_of(atap_task t)
{
    uint32_t gen, cur, st;
    struct atap_slot *s = lookup(t, &gen);

    if (!s || !handle_live(s, gen, &cur))
        return ATAP_FAILED;
    st = word_state(cur);
    if ((st == ST_PENDING || st == ST_RUNNING) &&
        (atap__extras.park->parked(s) || (s->ext != NULL && atap__extras.flow->waiting(s))))
        return ATAP_WAITING;
    return (atap_state)st;
}

bool atap_finished(atap_task t)
{
    uint32_t gen, cur;
    struct atap_slot *s = lookup(t, &gen);

    if (!s || !handle_live(s, gen, &cur))
        return true;
    if (unlikely(s->ext != NULL))
        return atap__extras.time->finished(s, word_state(cur));
    return state_terminal(word_state(cur));
}

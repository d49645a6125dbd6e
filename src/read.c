/*
 * Reading a task: join, take, wait, and the state queries.
 *
 * A reader holds a listener (its handle), so the slot is the task's for as
 * long as it reads; the generation is checked against the word first, so a
 * stale handle reads ATAP_ENOTASK. Waiting follows executor.c's rule: set
 * WAITERS, then sleep on the word with the word the kernel compares; the
 * settler wakes when it sees WAITERS. On a pool thread the wait runs only
 * the awaited task on top of itself (help.c), and otherwise sets its stack
 * aside (ASIDE on the word: pool_aside.c) and holds no thread meanwhile.
 * An output is copied only while the word reads
 * READY (acquire: the run's output write came before its release of READY);
 * take moves it to TAKEN by CAS first, so only one taker copies it.
 */
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "extras.h"
#include "handle.h"
#include "pool.h"
#include "slot.h"
#include "wait.h"

static int state_error_of(struct atap_slot *s, uint32_t state)
{
    switch (state) {
    case ST_TAKEN: /* a series that ran out has nothing more coming */
        return slot_sched(s) && atap__extras.time->ran_out(s) ? ATAP_EFINISHED : ATAP_ETAKEN;
    case ST_CANCELLED:
        return ATAP_ECANCELLED;
    case ST_TIMED_OUT:
        return ATAP_ETIMEDOUT;
    case ST_FAILED: { /* the run's own code, if it failed with one */
        /* Atomic: an at-rate series' runs write it (rate.c). */
        uint8_t code = ld_plain_relaxed(&s->fail_code);

        return fail_rc_of(code);
    }
    case ST_READY:
        return 0;
    default:
        return ATAP_ENOTREADY;
    }
}

/* Outputs are often a word or two: those copy without a call. */
static inline void copy_bytes(void *dst, const void *src, size_t n)
{
    switch (n) {
    case 4:
        memcpy(dst, src, 4);
        break;
    case 8:
        memcpy(dst, src, 8);
        break;
    case 16:
        memcpy(dst, src, 16);
        break;
    default:
        memcpy(dst, src, n);
        break;
    }
}

bool atap__exec_listen_aside(void *arg)
{
    struct atap__listen *l = arg;
    uint32_t cur = ld_acquire(&l->s->word);

    do {
        if (!word_is(cur, l->gen) || state_terminal(word_state(cur)))
            return false;
    } while (!casw_acqrel(&l->s->word, &cur, cur | ST_ASIDE));
    return true;
}

/*
 * Waits until the task settles or the deadline passes. A pool thread runs
 * on top of the wait only the task itself, found in its own queues, while
 * its stack has room (help.c); else it sets its stack aside until the task
 * settles (pool_aside.c), the task taken, if any, run first on the next
 * stack. Elsewhere, or with no stack to go on with, it sleeps on the word
 * until woken.
 */
static __attribute__((noinline)) int wait_settled(struct atap_slot *s, uint32_t ref, uint32_t gen,
                                                  uint64_t deadline, uint32_t *state)
{
    struct worker *w = atap__self;
    struct atap__listen l = {.s = s, .gen = gen};
    bool looked = false;
    int rc;
    uint64_t now;
    uint32_t cur, x;

    for (;;) {
        cur = ld_acquire(&s->word);
        if (!word_is(cur, gen))
            return ATAP_ENOTASK;
        if (state_terminal(word_state(cur))) {
            *state = word_state(cur);
            return 0;
        }
        now = deadline == ATAP__FOREVER ? 0 : atap__now_ns();
        if (now >= deadline)
            return ATAP_ENOTREADY;
        if (w) {
            if ((x = atap__pool_take_own(w, ref)) != 0 && atap__pool_room(w)) {
                atap__exec_run(w, x);
                continue;
            }
            /* A task this stack is inside (itself, or one lower on it)
             * could only settle once this wait returns: refuse rather
             * than hang. Looked at once, off the fast path. */
            if (!x && !looked && atap__exec_inside(w, ref))
                return ATAP_EINVAL;
            looked = true;
            rc = atap__pool_aside(w, (const void *[]){s}, 1, atap__exec_listen_aside, &l, deadline,
                                  x);
            /* A task taken but not handed on (settled meanwhile, or no
             * stack to be had) is run here, past the stack's room. */
            if (rc == ASIDE_WOKEN || (x && atap__pool_run_past_room(w, x)) || rc == ASIDE_GONE)
                continue;
        }
        if (!(cur & ST_WAITERS) && !casw_acqrel(&s->word, &cur, cur | ST_WAITERS))
            continue;
        atap__word_wait(&s->word, cur | ST_WAITERS, deadline - now);
    }
}

/* Copies the output out if the task is READY. */
static inline __attribute__((always_inline)) int copy_out(struct atap_slot *s, uint32_t gen,
                                                          void *out)
{
    uint32_t cur;
    int rc = 0;

    if (unlikely(slot_sched(s)))
        atap__extras.time->read_lock(s); /* a repeat's next run can't publish meanwhile */
    cur = ld_acquire(&s->word);
    if (!word_is(cur, gen))
        rc = ATAP_ENOTASK;
    else if (word_state(cur) != ST_READY)
        rc = state_error_of(s, word_state(cur));
    else if (s->out_size)
        copy_bytes(out, slot_out(s), s->out_size);
    if (unlikely(slot_sched(s)))
        atap__extras.time->read_unlock(s);
    return rc;
}

/* READY -> TAKEN, then the copy: from then on the output is the caller's. */
static int move_out(struct atap_slot *s, uint32_t gen, void *out)
{
    uint32_t cur;
    int rc = 0;

    if (unlikely(slot_sched(s)))
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
    } while (!casw_acqrel(&s->word, &cur, make_word(gen, ST_TAKEN)));
    if (rc == 0 && s->out_size)
        copy_bytes(out, slot_out(s), s->out_size);
    /* The output is the taker's now: nothing left in the slot to let go of,
     * whatever state the task moves on to (a repeat's next run writes
     * filled again, under the write lock this read lock excludes). */
    if (rc == 0)
        s->filled = 0;
    if (unlikely(slot_sched(s)))
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
        atap__exec_run(w, (uint32_t)t.id + 1);
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
    /* A PENDING task in a park is a delayed start (spawn.c): PENDING. */
    if ((st == ST_RUNNING && atap__extras.park->parked(s)) ||
        ((st == ST_PENDING || st == ST_RUNNING) && slot_sched(s) && atap__extras.flow->waiting(s)))
        return ATAP_WAITING;
    return (atap_state)st;
}

bool atap_finished(atap_task t)
{
    uint32_t gen, cur;
    struct atap_slot *s = lookup(t, &gen);

    if (!s || !handle_live(s, gen, &cur))
        return true;
    if (unlikely(slot_sched(s)))
        return atap__extras.time->finished(s, word_state(cur));
    return state_terminal(word_state(cur));
}

/*
 * atap_join_first and atap_join_all.
 *
 * join_first waits on many tasks with no waiter record on any of them. The
 * caller counts itself in atap__first_waiters (seq_cst), then marks each
 * unsettled member's word with ASIDE by an RMW (a CAS even when the bit is
 * already set), then looks at the members, then sleeps on the settle count
 * (atap__exec_settle_seq) from a value read before it looked, or sets its
 * stack aside under that count's key. Whoever moves a task's state on with
 * a listener's bit set (atap__exec_wake, executor.c) reads
 * atap__first_waiters after its CAS, which read our RMW or a later value, so
 * it sees us counted, and then bumps the settle count and wakes it: a member
 * that settles after our look changes the value we sleep on. No settle is
 * missed; a settle of an unrelated task only costs a look. A pool thread
 * runs the member of a set of one on top, as a join does (read.c), and
 * nothing for a larger set.
 *
 * join_all awaits every member, so a pool thread may run any of them on
 * top: first those in its own queues, newest first (the order they come
 * out of them, the cheapest), then it joins each in turn.
 */
#include <limits.h>
#include <stdlib.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "pool.h"
#include "slot.h"
#include "wait.h"

/* Index of the first settled member, or n. Marks each unsettled one with
 * WAITERS (an RMW even when already set, so its settler sees us counted). */
static size_t first_settled(const atap_task *ts, size_t n, bool mark)
{
    for (size_t k = 0; k < n; k++) {
        uint32_t index, gen, cur;
        struct atap_slot *s = atap__exec_live(ts[k], &index, &gen);

        if (!s)
            return k; /* no task: settled at once */
        cur = ld_acquire(&s->word);
        do {
            if (word_gen(cur) != gen || word_state(cur) == ST_FREE ||
                state_terminal(word_state(cur)))
                return k;
            if (!mark)
                break;
        } while (!casw_acqrel(&s->word, &cur, cur | ST_ASIDE));
    }
    return n;
}

/* Every member is a task the calling thread is inside (read.c's rule for
 * a join on itself): none could settle while this waits. */
static bool all_inside(const atap_task *ts, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (!atap__exec_inside(atap__self, (uint32_t)ts[k].id + 1))
            return false;
    return true;
}

/* A pool thread's run of the one member of a set of one, found in its
 * own queues with room to run it on top (read.c's rule). */
static bool help_one(struct worker *w, atap_task t)
{
    uint32_t x = atap__pool_help_own(w, (uint32_t)t.id + 1);

    if (x)
        atap__exec_run(w, x);
    return x != 0;
}

/* The still() of a stack set aside under the settle count (pool_aside.c):
 * no settle since the look. */
static bool no_settle_since(void *seen)
{
    return ld_acquire(&atap__exec_settle_seq) == *(uint32_t *)seen;
}

struct members {
    const atap_task *ts;
    size_t n;
};

/* The still() of a stack set aside under every member's slot: ASIDE set
 * on each member's word by an RMW (read.c's atap__exec_listen_aside),
 * none settled. */
static bool none_settled(void *arg)
{
    struct members *m = arg;

    for (size_t k = 0; k < m->n; k++) {
        struct atap__listen l;
        uint32_t index;

        if (!(l.s = atap__exec_live(m->ts[k], &index, &l.gen)) || !atap__exec_listen_aside(&l))
            return false;
    }
    return true;
}

#define KEYS_ON_STACK 16

/* Sets the stack aside until a member settles, listed under each member's
 * slot (woken by its settle alone); under the settle count (woken by any
 * settle) when the list of keys has no room. */
static int aside(struct worker *w, const atap_task *ts, size_t n, uint32_t *seq, uint64_t deadline)
{
    const void *on_stack[KEYS_ON_STACK], **keys = on_stack;
    struct members m = {.ts = ts, .n = n};
    uint32_t index, gen;
    int rc;

    if (n > KEYS_ON_STACK && (n > UINT_MAX || !(keys = malloc(n * sizeof *keys))))
        return atap__pool_aside(w, (const void *[]){&atap__exec_settle_seq}, 1, no_settle_since,
                                seq, deadline, 0);
    for (size_t k = 0; k < n; k++)
        if (!(keys[k] = atap__exec_live(ts[k], &index, &gen)))
            keys[k] = &atap__exec_settle_seq; /* gone: none_settled says so */
    rc = atap__pool_aside(w, keys, (unsigned)n, none_settled, &m, deadline, 0);
    if (keys != on_stack)
        free(keys);
    return rc;
}

int atap_join_first(const atap_task *ts, size_t n, atap_join_policy policy, uint64_t timeout_ns,
                    size_t *winner)
{
    uint64_t deadline, now, left;
    size_t k;

    if (!ts || !winner || n == 0 || (unsigned)policy > ATAP_RELEASE)
        return ATAP_EINVAL;
    if ((k = first_settled(ts, n, false)) == n) {
        if (atap__self && all_inside(ts, n))
            return ATAP_EINVAL;
        deadline = atap__deadline_in(timeout_ns);
        add_seqcst(&atap__first_waiters, 1);
        for (;;) {
            uint32_t seq = ld_acquire(&atap__exec_settle_seq);
            struct worker *w = atap__self;

            if ((k = first_settled(ts, n, true)) < n)
                break;
            now = atap__now_ns();
            if (now >= deadline)
                break;
            /* A pool thread runs nothing on top of this wait but the one
             * member of a set of one (read.c's rule): with two or more, no
             * member is work the wait needs (another may end it first, and
             * the caller may then do what a member waits for). Else its
             * stack goes aside until a settle. */
            if (w && n == 1 && help_one(w, ts[0]))
                continue;
            if (w && aside(w, ts, n, &seq, deadline) != ASIDE_NO)
                continue;
            left = deadline == ATAP__FOREVER ? ATAP__FOREVER : deadline - now;
            atap__word_wait(&atap__exec_settle_seq, seq, left);
        }
        sub_seqcst(&atap__first_waiters, 1);
        if (k == n)
            return ATAP_ENOTREADY;
    }
    *winner = k;
    for (size_t i = 0; i < n && policy != ATAP_PASS_BACK; i++) {
        if (i == k)
            continue;
        if (policy == ATAP_CANCEL)
            atap_cancel(ts[i]);
        atap_release(ts[i]);
    }
    return 0;
}

int atap_join_all(const atap_task *ts, size_t n, void *out, size_t size, int *rcs)
{
    int first = 0;

    struct worker *w = atap__self;

    if (!ts || (n && size && !out))
        return ATAP_EINVAL;
    for (size_t i = n; w && i-- > 0;)
        (void)help_one(w, ts[i]);
    for (size_t i = 0; i < n; i++) {
        int rc = atap_join(ts[i], size ? (char *)out + i * size : NULL, size);

        if (rcs)
            rcs[i] = rc;
        if (rc && !first)
            first = rc;
    }
    return first;
}

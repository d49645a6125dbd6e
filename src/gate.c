/*
 * The gate (dataflow_int.h has what the dataflow files share, and their
 * lock order): how a task that waits for values gets them, from atap_give
 * or from forwards (forward.c), and what a value may start. Its three
 * roles share one state machine under one lock, so all of them are here:
 * a waiting task's gives, a receive_all's rounds (gathered member by
 * member), a receive_any's open members; then the let-go of a task nothing
 * can give to any more (its last giver gone, its members closed, shutdown),
 * and atap_spawn_waiting, atap_give and atap_input.
 *
 * The gate. A task that waits for gives has a `struct gate` (through its
 * schedule) holding its values and what a give may start, all under the
 * gate's spin lock, a leaf lock: nothing else is taken while it is held.
 *   IDLE  nothing under way; the gate holds the task's RUN reference.
 *   BUSY  a run or a series is queued, armed or running; RUN is with it.
 *         `claimed` once the run took its value: until then a give only
 *         replaces the value that run will get.
 *   OWED  BUSY, and a give came for one more run (ATAP_ONCE only).
 *   DONE  no more gives; RUN has gone or is going.
 * A give that finds IDLE moves it to BUSY and hands RUN to
 * atap__sched_kick, after the lock: the gate no longer owns it, and no one
 * else can take it, since only IDLE carries it. A give that starts a run
 * (IDLE -> BUSY) or owes one (-> OWED) also moves an output standing in
 * the slot back to PENDING under the lock, and a run that publishes while
 * OWED publishes to PENDING (atap__gate_publish, under the lock too): so a
 * join after a give always reads the run that give started. Where a run or a series
 * ends as it should, atap__gate_after decides under the lock: OWED starts
 * again, a task that can get no more gives is DONE, any other waits. Every
 * other end of the task (cancel, failure, timeout, shutdown) drops RUN
 * through atap__exec_release_run, which sets DONE first.
 * Values: `pending` is the newest value not yet handed to a run, `current`
 * the one runs read. A claim moves pending to current (only the runner does
 * that, and runs of one task never overlap, so a run reads current without
 * the lock); at-rate runs, which overlap, get copies. in_free is called
 * outside the lock, once per value passed to atap_give.
 */
#include "dataflow.h"
#include "dataflow_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "extras.h"
#include "faults.h"
#include "slot.h"
#include "table.h"
#include "trace.h"

/* ---- the gate ------------------------------------------------------------ */

/* Every gate bound to a slot, so a shutdown can let go of the idle ones. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gate *all_gates;

static void unlink_gate(struct gate *g)
{
    if (!g->linked)
        return;
    if (g->prev)
        g->prev->next = g->next;
    else
        all_gates = g->next;
    if (g->next)
        g->next->prev = g->prev;
    g->prev = g->next = NULL;
    g->linked = false;
}

void atap__gate_bind(struct gate *g, uint32_t index)
{
    g->index = index;
    pthread_mutex_lock(&all_lock);
    g->next = all_gates;
    g->prev = NULL;
    if (all_gates)
        all_gates->prev = g;
    all_gates = g;
    g->linked = true;
    pthread_mutex_unlock(&all_lock);
}

struct gate *atap__gate_new(int role, const atap_spawn_opts *o, size_t in_size, size_t n)
{
    struct gate *g = calloc(1, sizeof *g);
    size_t buf = in_size ? in_size : 1;

    if (!g)
        return NULL;
    g->role = (uint8_t)role;
    g->series = o->kind != ATAP_ONCE;
    g->left = o->gives ? o->gives : UINT32_MAX;
    g->in_size = in_size;
    g->in_free = o->in_free;
    g->n = n;
    g->open = (uint32_t)n;
    g->pending = malloc(buf);
    g->current = malloc(buf);
    if (role == ROLE_ALL) {
        g->filled = calloc((n + 63) / 64, sizeof *g->filled);
        g->gathering = malloc(buf);
    }
    if (!g->pending || !g->current || (role == ROLE_ALL && (!g->filled || !g->gathering))) {
        atap__gate_destroy(g);
        return NULL;
    }
    return g;
}

void atap__gate_destroy(struct gate *g)
{
    pthread_mutex_lock(&all_lock);
    unlink_gate(g);
    pthread_mutex_unlock(&all_lock);
    if (g->in_free && g->has_pending && g->pending_owned)
        g->in_free(g->pending);
    if (g->in_free && g->current_owned)
        g->in_free(g->current);
    free(g->pending);
    free(g->current);
    free(g->spare);
    free(g->filled);
    free(g->gathering);
    free(g);
}

/* A value buffer nobody reads any more, to let go of after the lock. */
struct retired {
    unsigned char *b;
    bool in_free; /* it was given: in_free first */
};

/* Under the lock: b (may be NULL) is done with. A buffer with no in_free
 * owed becomes the spare if there is none; anything else is retired. */
static struct retired retire_locked(struct gate *g, unsigned char *b, bool owned)
{
    struct retired r = {NULL, false};

    if (!b)
        return r;
    if (!(owned && g->in_free) && !g->spare) {
        g->spare = b;
        return r;
    }
    r.b = b;
    r.in_free = owned && g->in_free;
    return r;
}

/* After the lock: in_free (a user callback: never under our lock). */
static void let_go_value(struct gate *g, struct retired r)
{
    if (!r.b)
        return;
    if (r.in_free)
        g->in_free(r.b);
    free(r.b);
}

/* let_go_value for a delivery (kicks) or a give (NULL): a value owing
 * in_free waits for the delivery's kicks_run, after the source's locks
 * (with no memory to keep it, it goes now). */
static void let_go_later(struct kicks *k, struct gate *g, struct retired r)
{
    struct kick_drop *d;

    if (!k || !r.b || !r.in_free) {
        let_go_value(g, r);
        return;
    }
    if (k->ndrops >= KICK_DROPS && k->ndrops - KICK_DROPS == k->cap) {
        unsigned cap = k->cap ? k->cap * 2 : KICK_DROPS;
        struct kick_drop *m = realloc(k->more, cap * sizeof *m);

        if (!m) {
            let_go_value(g, r);
            return;
        }
        k->more = m;
        k->cap = cap;
    }
    d = k->ndrops < KICK_DROPS ? &k->drops[k->ndrops] : &k->more[k->ndrops - KICK_DROPS];
    d->b = r.b;
    d->in_free = g->in_free;
    k->ndrops++;
}

void atap__gate_claim(struct gate *g)
{
    struct retired r = {NULL, false};

    spin_lock(&g->lock);
    g->claimed = true;
    if (g->has_pending) {
        r = retire_locked(g, g->current, g->current_owned);
        g->current = g->pending;
        g->current_owned = g->pending_owned;
        g->pending = NULL;
        g->has_pending = g->pending_owned = false;
    }
    spin_unlock(&g->lock);
    let_go_value(g, r);
}

const void *atap__gate_current(struct gate *g, size_t *size)
{
    *size = g->in_size;
    return g->current;
}

void *atap__gate_snapshot(struct gate *g, size_t *size)
{
    void *copy = malloc(g->in_size ? g->in_size : 1);

    if (!copy)
        return NULL;
    atap__gate_claim(g);
    spin_lock(&g->lock); /* a claim by another tick cannot race: manager only */
    memcpy(copy, g->current, g->in_size);
    spin_unlock(&g->lock);
    *size = g->in_size;
    return copy;
}

/* Lets go of a task whose gate went DONE while it held RUN: never given
 * anything, it reads FAILED; otherwise its last output stays. */
static void let_go_now(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    /* An at-rate series may have runs under way that will publish: its
     * RUN's drop decides once they are done (atap__sched_ending). */
    if (!atap__extras.time->at_rate(s))
        atap__exec_stop(s, gen, ST_PENDING, ST_FAILED);
    atap__extras.time->mark_finished(s);
    atap__exec_release_run(s, index, gen);
}

/*
 * A let-go closes the task's forwards, and a closed forward may let go of
 * the task it fed (its last member, or its last listener, gone): along a
 * chain of forwards that nests once per link, and a long chain would run
 * the thread out of stack. So a let-go asked for inside another on the same
 * thread is only noted (the gate is DONE and its RUN is ours already: no
 * one else acts on the task meanwhile), and the outermost one does them in
 * turn. With no memory to note it in, it is done at once. So the tasks down
 * a chain are let go of after the outer one's arg_free / out_free ran, not
 * inside it: such a callback must not wait for one of them.
 */
struct let_go_list {
    unsigned depth, n, cap;
    uint64_t *v; /* gen << 32 | index */
};
static _Thread_local struct let_go_list later;

static void let_go(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    if (later.depth > 0) {
        if (later.n == later.cap) {
            unsigned cap = later.cap ? later.cap * 2 : 64;
            uint64_t *v = realloc(later.v, cap * sizeof *v);

            if (!v) {
                let_go_now(s, index, gen);
                return;
            }
            later.v = v;
            later.cap = cap;
        }
        later.v[later.n++] = (uint64_t)gen << 32 | index;
        return;
    }
    later.depth = 1;
    let_go_now(s, index, gen);
    while (later.n > 0) {
        uint64_t x = later.v[--later.n];

        let_go_now(atap__table_at((uint32_t)x), (uint32_t)x, (uint32_t)(x >> 32));
    }
    free(later.v);
    later = (struct let_go_list){0};
}

/* Under the lock: nothing could start the task again. */
static bool spent(const struct gate *g)
{
    return g->left == 0 || g->last || g->orphan || (g->role == ROLE_ANY && g->open == 0);
}

bool atap__gate_publish(struct atap_slot *s, uint32_t gen, bool *kept)
{
    struct gate *g = atap__extras.time->gate(s);
    uint32_t cur = ld_relaxed(&s->word), to;
    bool ok;

    spin_lock(&g->lock);
    to = g->state == G_OWED ? ST_PENDING : ST_READY;
    do {
        ok = word_gen(cur) == gen && word_state(cur) == ST_RUNNING;
        /* Release: the output is written before READY can be read. */
    } while (ok && !casw_acqrel(&s->word, &cur, make_word(gen, to)));
    if (ok && to == ST_PENDING)
        *kept = true; /* the output stays the slot's to let go of */
    spin_unlock(&g->lock);
    if (ok && (cur & ST_LISTENED))
        atap__exec_wake(s, cur);
    return ok;
}

/* A cancel, a timeout or a failure ended the task (a run's end that was
 * not a publish). */
static bool ended(struct atap_slot *s, uint32_t gen)
{
    uint32_t cur = ld_acquire(&s->word), st = word_state(cur);

    return word_gen(cur) != gen || st == ST_CANCELLED || st == ST_TIMED_OUT || st == ST_FAILED;
}

bool atap__gate_after(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct gate *g = atap__extras.time->gate(s);
    int next;

    spin_lock(&g->lock);
    g->claimed = false;
    /* The word is read under the lock: a cancel that stopped the run while
     * it ran is seen here, or else its atap__gate_cancelled comes after
     * this and finds IDLE; one of the two ends the task (it used to wait
     * IDLE, RUN held, its forwards open, until its last handle went). */
    if (ended(s, gen))
        next = g->state = G_DONE;
    else if (g->state == G_OWED)
        next = g->state = G_BUSY;
    else if (g->state == G_DONE || spent(g))
        next = g->state = G_DONE;
    else
        next = g->state = G_IDLE;
    spin_unlock(&g->lock);
    if (next == G_BUSY)
        atap__extras.time->kick(s, index, gen);
    return next != G_DONE;
}

void atap__gate_cancelled(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct gate *g = atap__extras.time->gate(s);
    bool idle;

    spin_lock(&g->lock);
    if ((idle = g->state == G_IDLE))
        g->state = G_DONE;
    spin_unlock(&g->lock);
    if (idle)
        atap__exec_release_run(s, index, gen);
}

bool atap__flow_waiting(struct atap_slot *s)
{
    struct gate *g = atap__extras.time->gate(s);
    bool idle;

    if (!g)
        return false;
    spin_lock(&g->lock);
    idle = g->state == G_IDLE;
    spin_unlock(&g->lock);
    return idle;
}

void atap__gate_end(struct gate *g)
{
    spin_lock(&g->lock);
    g->state = G_DONE;
    spin_unlock(&g->lock);
}

void atap__gate_orphan(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct gate *g = atap__extras.time->gate(s);
    bool idle;

    if (g->role != ROLE_GIVE)
        return; /* fed by its members alone: they end it */
    spin_lock(&g->lock);
    g->orphan = true;
    if ((idle = g->state == G_IDLE))
        g->state = G_DONE;
    spin_unlock(&g->lock);
    if (idle)
        let_go(s, index, gen);
}

/* Under the lock, for a gate not DONE: whether a give now would be taken
 * (it starts something, is owed, or replaces what a series is handed). */
bool atap__gate_accepts(const struct gate *g)
{
    bool starts = g->state == G_IDLE || (g->state == G_BUSY && !g->series && g->claimed);

    return !starts || (g->left != 0 && !g->last);
}

/* Why a gate in this state takes no more gives. */
int atap__gate_closed_error(struct atap_slot *s)
{
    switch (word_state(ld_acquire(&s->word))) {
    case ST_CANCELLED:
        return ATAP_ECANCELLED;
    case ST_TIMED_OUT:
        return ATAP_ETIMEDOUT;
    case ST_FAILED:
        return ATAP_EFAILED;
    default:
        return ATAP_EFINISHED;
    }
}

/*
 * Under the lock: value b (a buffer of in_size bytes) arrives. Returns 0
 * with *kick set when it starts the task, 0 when it is owed or replaces
 * what a series is handed, or the error refusing it. *old receives a value
 * it displaced (to drop after the lock), or b itself when refused.
 */
static int offer_locked(struct atap_slot *s, uint32_t gen, struct gate *g, unsigned char *b,
                        bool owned, bool *kick, unsigned char **old, bool *old_owned)
{
    uint32_t st = word_state(ld_acquire(&s->word));

    *old = NULL;
    *old_owned = false;
    if (g->state == G_DONE || st == ST_CANCELLED || st == ST_TIMED_OUT || st == ST_FAILED) {
        *old = b, *old_owned = owned;
        return atap__gate_closed_error(s);
    }
    if (g->state == G_IDLE || (g->state == G_BUSY && !g->series && g->claimed)) {
        if (!atap__gate_accepts(g)) {
            *old = b, *old_owned = owned;
            return ATAP_EFINISHED;
        }
        if (g->left != UINT32_MAX)
            g->left--;
        *kick = g->state == G_IDLE;
        g->state = g->state == G_IDLE ? G_BUSY : G_OWED;
        /* A join from now on waits for the run this give starts: an output
         * standing goes back to PENDING here, under the lock, so the kick
         * that starts the run (ours after the lock, or gate_after's, which
         * takes the lock first) comes after it. A run still under way
         * publishes to PENDING itself, since it finds OWED
         * (atap__gate_publish). */
        atap__extras.time->restarting(s, gen);
    }
    if (g->has_pending) { /* gives don't queue: the newest wins */
        *old = g->pending;
        *old_owned = g->pending_owned;
    } else {
        *old = g->pending; /* an empty buffer: becomes the spare */
    }
    g->pending = b;
    g->has_pending = true;
    g->pending_owned = owned;
    return 0;
}

/* Gives value (in_size bytes) to the task at index: copies it in, starts
 * what it starts (now, or through kicks when given). One lock round when a
 * spare buffer is there, as it is in a steady flow. */
int atap__gate_offer(struct atap_slot *s, uint32_t index, uint32_t gen, const void *value,
                     bool owned, struct kicks *kicks)
{
    struct gate *g = atap__extras.time->gate(s);
    unsigned char *b, *old;
    bool kick = false, old_owned;
    struct retired r;
    int rc;

    ATAP_TRACE(TR_GIVE, ATAP_TRACE_ID(index, gen), NULL, 0); /* atap_give, or a forward */
    spin_lock(&g->lock);
    b = g->spare;
    g->spare = NULL;
    if (!b) {
        unsigned char *fresh;

        spin_unlock(&g->lock);
        if (!(fresh = malloc(g->in_size ? g->in_size : 1)))
            return -ENOMEM;
        spin_lock(&g->lock);
        /* A spare may have come back meanwhile: take it, keep ours there. */
        b = g->spare ? g->spare : fresh;
        g->spare = b == fresh ? NULL : fresh;
    }
    if (g->in_size)
        memcpy(b, value, g->in_size);
    rc = offer_locked(s, gen, g, b, owned, &kick, &old, &old_owned);
    r = retire_locked(g, old, old_owned);
    spin_unlock(&g->lock);
    let_go_later(kicks, g, r);
    if (kick) {
        if (kicks)
            atap__flow_kicks_add(kicks, g, gen);
        else
            atap__extras.time->kick(s, index, gen);
    }
    return rc;
}

/*
 * Shutdown, once the pool has drained: a task waiting for a give would wait
 * forever, so each idle gate goes DONE and its task is let go (never given
 * anything: FAILED; else its last output stays). Taken off the list in
 * batches under its lock, let go after it (which may free the slot).
 */
void atap__flow_shutdown(void)
{
    enum { BATCH = 256 };
    uint32_t idle[BATCH];
    unsigned n;

    do {
        n = 0;
        pthread_mutex_lock(&all_lock);
        for (struct gate *g = all_gates, *next; g && n < BATCH; g = next) {
            next = g->next;
            spin_lock(&g->lock);
            if (g->state == G_IDLE) {
                g->state = G_DONE;
                idle[n++] = g->index;
                unlink_gate(g);
            }
            spin_unlock(&g->lock);
        }
        pthread_mutex_unlock(&all_lock);
        for (unsigned i = 0; i < n; i++) {
            struct atap_slot *s = atap__table_at(idle[i]);

            let_go(s, idle[i], word_gen(ld_acquire(&s->word)));
        }
    } while (n == BATCH);
}

/* In a fork's child (its one thread; runtime.c): the gates are the parent's
 * tasks'; let go unfreed, and the lock taken fresh (a thread that is not
 * here may have held it). */
void atap__flow_forget(void)
{
    all_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    all_gates = NULL;
    later = (struct let_go_list){0};
    st_relaxed(&atap__first_waiters, 0); /* executor.h: waiters the child has not */
}

/* ---- receive_all / receive_any: the members' side of the gate ------------ */

/* Under the lock: member r's bytes would make the round whole. */
static bool makes_whole(const struct gate *g, const struct reg *r)
{
    bool mine = !(g->filled[r->place / 64] & (UINT64_C(1) << (r->place % 64)));

    return g->nfilled + mine == g->n;
}

/*
 * receive_all, under the lock: the round is whole and becomes the value.
 * The next round needs a buffer unless a member has closed (its place can
 * never fill again, so no round is whole again: this one is the last): the
 * spare, else *fresh (taken from the caller). With neither (no memory) the
 * round stays as it is, and the next delivery, or a member's close, tries
 * again.
 */
static void round_whole(struct atap_slot *s, uint32_t gen, struct gate *g, unsigned char **fresh,
                        bool *kick, unsigned char **old, bool *old_owned)
{
    unsigned char *round = g->gathering, *next = NULL;

    if (!g->nclosed) {
        if (g->spare)
            next = g->spare, g->spare = NULL;
        else if (*fresh)
            next = *fresh, *fresh = NULL;
        else
            return;
    }
    g->gathering = next;
    memset(g->filled, 0, (g->n + 63) / 64 * sizeof *g->filled);
    g->nfilled = 0;
    offer_locked(s, gen, g, round, false, kick, old, old_owned);
    if (!next)
        g->last = true; /* no buffer to gather into: nothing may try */
}

/*
 * receive_all: member `place` published bytes for this round. A round made
 * whole needs a buffer for the next one unless a member has closed
 * (round_whole): the spare, else one
 * allocated as offer does, with the lock let go (anyone on the gate spins
 * meanwhile). The gate may move while the lock is out (another member, a
 * cancel), so everything after the lock is taken again looks at it afresh;
 * a buffer allocated and not needed then becomes the spare, or goes after
 * the lock.
 */
void atap__gate_gather(struct atap_slot *s, uint32_t gen, const struct reg *r, const void *bytes,
                       size_t size, struct kicks *kicks)
{
    struct gate *g = atap__extras.time->gate(s);
    unsigned char *fresh = NULL, *old = NULL;
    bool kick = false, old_owned = false;
    struct retired ret;

    spin_lock(&g->lock);
    if (g->state != G_DONE && !g->last && !g->spare && !g->nclosed && makes_whole(g, r)) {
        spin_unlock(&g->lock);
        fresh = FAULT_MALLOC(g->in_size ? g->in_size : 1);
        spin_lock(&g->lock);
    }
    if (g->state != G_DONE && !g->last) {
        memcpy(g->gathering + r->offset, bytes, size);
        if (!(g->filled[r->place / 64] & (UINT64_C(1) << (r->place % 64)))) {
            g->filled[r->place / 64] |= UINT64_C(1) << (r->place % 64);
            g->nfilled++;
        }
        if (g->nfilled == g->n) {
            ATAP_TRACE(TR_GIVE, ATAP_TRACE_ID(r->to, gen), NULL, 0); /* a whole round */
            round_whole(s, gen, g, &fresh, &kick, &old, &old_owned);
        }
    }
    if (fresh && !g->spare) { /* not needed after all: kept for the next round */
        g->spare = fresh;
        fresh = NULL;
    }
    ret = retire_locked(g, old, old_owned);
    spin_unlock(&g->lock);
    free(fresh);
    let_go_later(kicks, g, ret);
    if (kick)
        atap__flow_kicks_add(kicks, g, gen);
}

/* A member of receive_all / receive_any (or a forward) can publish no
 * more: the fed task may be done. A receive_all round left whole for want
 * of memory is the last one now, and needs none: it goes. Called with no
 * lock held, so what that starts is kicked here. */
void atap__gate_member_closed(const struct reg *r)
{
    struct atap_slot *s = atap__table_at(r->to);
    struct gate *g = atap__extras.time->gate(s);
    unsigned char *none = NULL, *old = NULL;
    bool idle = false, kick = false, old_owned = false;
    struct retired ret;

    spin_lock(&g->lock);
    if (g->role == ROLE_ALL) {
        if (!(g->filled[r->place / 64] & (UINT64_C(1) << (r->place % 64)))) {
            g->last = true; /* its place can never fill */
        } else {
            g->nclosed++;
            if (g->state != G_DONE && !g->last && g->nfilled == g->n)
                round_whole(s, r->to_gen, g, &none, &kick, &old, &old_owned);
        }
    } else if (g->role == ROLE_ANY) {
        g->open--;
    }
    if (g->state == G_IDLE && spent(g)) {
        g->state = G_DONE;
        idle = true;
    }
    ret = retire_locked(g, old, old_owned);
    spin_unlock(&g->lock);
    let_go_value(g, ret);
    if (kick)
        atap__extras.time->kick(s, r->to, r->to_gen);
    if (idle)
        let_go(s, r->to, r->to_gen);
}

/* ---- the calls ----------------------------------------------------------- */

int atap_spawn_waiting(atap_task *task, atap_fn *fn, void *arg, size_t in_size,
                       const atap_spawn_opts *opts)
{
    static const atap_spawn_opts none;
    atap_spawn_opts copy;
    struct gate *g;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if ((rc = atap__opts_in(&opts, &copy)) != 0) /* another layout: copied */
        return rc;
    opts = opts ? opts : &none;
    if (!fn || in_size > UINT32_MAX)
        return ATAP_EINVAL;
    if ((rc = atap__exec_check(opts, true)) != 0)
        return rc;
    if (!(g = atap__gate_new(ROLE_GIVE, opts, in_size, 0)))
        return -ENOMEM;
    if ((rc = atap__exec_spawn(task, fn, arg, opts, g)) != 0)
        atap__gate_destroy(g);
    return rc;
}

int atap_give(atap_task t, const void *value, size_t size)
{
    uint32_t index, gen;
    struct atap_slot *s = atap__exec_live(t, &index, &gen);
    struct gate *g;
    bool outside;
    int rc;

    if (!s)
        return ATAP_ENOTASK;
    g = atap__extras.time->gate(s);
    if (!g || g->role != ROLE_GIVE || size != g->in_size || (size && !value))
        return ATAP_EINVAL; /* in_free is the caller's: nothing was taken */
    if (!atap__spawn_enter(&outside)) {
        if (g->in_free) { /* the value is refused, and goes as promised */
            unsigned char *b = malloc(size ? size : 1);
            if (b) {
                memcpy(b, value, size);
                g->in_free(b);
                free(b);
            }
        }
        return ATAP_ENOTINIT;
    }
    rc = atap__gate_offer(s, index, gen, value, true, NULL);
    atap__spawn_exit(outside);
    return rc;
}

const void *atap_input(atap_ctx *ctx, size_t *size)
{
    struct atap_slot *s = atap__exec_ctx_slot(ctx);
    size_t n = 0;
    const void *v = s && slot_sched(s) ? atap__extras.time->input(s, &n) : NULL;

    if (size)
        *size = v ? n : 0;
    return v;
}

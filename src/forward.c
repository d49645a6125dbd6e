/*
 * Forwards (dataflow_int.h has what the dataflow files share, and their
 * lock order): a slot's side record, the regs on it that hand each of the
 * task's outputs to the gates they feed (gate.c), the kicks a delivery
 * leaves for after the source's locks, and atap_forward, atap_receive_all
 * and atap_receive_any, which register regs.
 *
 * Forwards. A task whose outputs go elsewhere has a list in its slot's side
 * of `reg`s, each naming the task it feeds (and, for receive_all, the place
 * it fills). A reg holds a listener on the task it feeds, so that slot
 * stays while the reg is listed. The source's slot needs none: it stays
 * while RUN is held, and the list closes when RUN goes. Registering sets
 * REFS_RX in refs by a CAS that finds RUN held: whoever later drops RUN
 * sees RX in that same CAS, keeps the slot with a listener of its own and
 * closes the list (atap__flow_close). A source's handles are not givers of
 * anything, so they alone decide when a waiting source is let go.
 * Otherwise the task is over and the registrar hands over the last output
 * and closes the reg itself. Each output has a number (1 for a one-shot,
 * the publish count for a task whose runs rewrite it), and a reg records
 * the last number it had: the publisher (under the output's write lock) and
 * a registrar or closer (under its read lock) each hand an output over only
 * when the reg has not had it, under the list's mutex. So every reg gets
 * every output published after it registered, plus the one readable when
 * it did, exactly once. The lock order is dataflow_int.h's.
 *
 * A settle listener (settle.c) is a reg of kind REG_SETTLE on the same
 * list: handed no output, it only hears the close, which for any reg
 * comes once, when the task can publish no more (so with its state
 * final), on whichever thread closes the list or, for a task over already,
 * on the registrar's.
 */
#include "dataflow.h"
#include "dataflow_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "abi.h"
#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "extras.h"
#include "side.h"
#include "slot.h"
#include "table.h"

/* What a slot needs only sometimes, made on first use and freed with the
 * slot: the forwards of its outputs, and the park it sleeps in. */
/*
 * struct kicks (dataflow.h): targets a delivery started, kicked once the
 * source's locks are let go (its list mutex, the gates' locks, and for a
 * repeat's publish its output's write lock: the publisher runs them after
 * that, atap__flow_kicks_run). They are chained through their gates, so
 * noting one takes no memory and cannot fail: a list that had to grow used
 * to kick, when it could not, right there under the source's locks. A gate
 * is on one list at most, since only the give that moved it IDLE -> BUSY
 * notes it, and it cannot be IDLE again before its run, which our kick
 * starts: so its kick_ fields are this thread's alone until then. RUN,
 * ours to hand over meanwhile, keeps the slot and its gate. A later
 * delivery to a target noted and not yet kicked finds it BUSY and unclaimed
 * and only replaces its pending value, as it would before the run claims.
 *
 * Given values a delivery displaced (a target's pending one, replaced by
 * the newest) that owe their in_free, a user callback, wait there too, so
 * that it runs with none of the source's locks held (an in_free that joins
 * the source would wait on itself): KICK_DROPS in the list itself, more in
 * an array grown as needed; with no memory for that, the value is let go
 * at once, under the locks. Kicks go first: an in_free may wait for a run
 * the same delivery started. The gate notes them (gate.c, let_go_later).
 */

void atap__flow_kicks_add(struct kicks *k, struct gate *g, uint32_t gen)
{
    g->kick_next = NULL;
    g->kick_gen = gen;
    if (k->tail)
        k->tail->kick_next = g;
    else
        k->head = g;
    k->tail = g;
}

void atap__flow_kicks_run(struct kicks *k)
{
    struct gate *next;

    if (!k->head && !k->ndrops)
        return; /* the usual publish: no forward started anything */
    for (struct gate *g = k->head; g; g = next) {
        uint32_t index = g->index, gen = g->kick_gen;

        next = g->kick_next; /* read before: once kicked it may run, end and go */
        atap__extras.time->kick(atap__table_at(index), index, gen);
    }
    for (unsigned i = 0; i < k->ndrops; i++) {
        struct kick_drop *d = i < KICK_DROPS ? &k->drops[i] : &k->more[i - KICK_DROPS];

        d->in_free(d->b);
        free(d->b);
    }
    free(k->more);
}

/* ---- forwards ------------------------------------------------------------ */

/* Hands output number pub (bytes at out) to r unless it had it. */
static void deliver(struct reg *r, uint64_t pub, const void *out, size_t size, struct kicks *kicks)
{
    struct atap_slot *t;
    struct gate *g;

    if (r->kind == REG_SETTLE || r->seen >= pub)
        return; /* a settle listener hears only the close */
    t = atap__table_at(r->to);
    g = atap__extras.time->gate(t);
    r->seen = pub;
    if (g->role == ROLE_ALL)
        atap__gate_gather(t, r->to_gen, r, out, size, kicks);
    else
        atap__gate_offer(t, r->to, r->to_gen, out, false, kicks);
}

/* Under the read lock (or for a one-shot, whose output never changes):
 * the readable output's number, or 0 when none is readable. */
static uint64_t readable(struct atap_slot *s)
{
    if (word_state(ld_acquire(&s->word)) != ST_READY)
        return 0;
    return slot_sched(s) ? atap__extras.time->pubs(s) : 1;
}

void atap__flow_publish(struct atap_slot *s, uint64_t pub, struct kicks *kicks)
{
    struct side *rx;

    /* Acquire: a registrar's RX (and the rx it installed before) is seen,
     * since its read section ended before our write lock began. */
    if (!(ld_acquire(&s->refs) & REFS_RX))
        return;
    rx = ld_acquire(&s->side);
    spin_lock(&rx->lock);
    for (struct reg *r = rx->head; r; r = r->next)
        deliver(r, pub, slot_out(s), s->out_size, kicks);
    spin_unlock(&rx->lock);
}

/* A reg that will get nothing more from its source s: its target hears,
 * and, if it was the last, the feeders' hold on the target goes; a settle
 * listener is told. */
static void reg_close(struct reg *r, struct atap_slot *s)
{
    struct atap_slot *t;
    struct gate *g;

    if (r->kind == REG_SETTLE) {
        atap__settle_closed(r, s);
        return;
    }
    t = atap__table_at(r->to);
    g = atap__extras.time->gate(t);
    atap__gate_member_closed(r);
    if (sub_acqrel(&g->feeders, 1) == 1)
        atap__exec_release_listener(t, r->to, r->to_gen);
    free(r);
}

static void read_lock(struct atap_slot *s)
{
    if (slot_sched(s))
        atap__extras.time->read_lock(s);
}

static void read_unlock(struct atap_slot *s)
{
    if (slot_sched(s))
        atap__extras.time->read_unlock(s);
}

void atap__flow_close(struct atap_slot *s)
{
    struct side *rx = ld_acquire(&s->side);
    struct kicks kicks;
    struct reg *list, *next;
    uint64_t pub;

    atap__kicks_init(&kicks);
    read_lock(s);
    spin_lock(&rx->lock);
    rx->closed = true;
    list = rx->head;
    rx->head = NULL;
    if ((pub = readable(s)) != 0)
        for (struct reg *r = list; r; r = r->next)
            deliver(r, pub, slot_out(s), s->out_size, &kicks);
    spin_unlock(&rx->lock);
    read_unlock(s);
    atap__flow_kicks_run(&kicks);
    for (; list; list = next) {
        next = list->next;
        reg_close(list, s);
    }
}

/* attach could not list r: a forward closes (its target hears), a settle
 * listener is left to its registrar, which says so. */
static int refused(struct reg *r, int rc)
{
    if (r->kind != REG_SETTLE)
        reg_close(r, NULL);
    return rc;
}

/*
 * Registers r (a forward holds a listener on its target) on the task s of
 * generation gen, on which the caller holds a listener. The readable output, if
 * any, is handed over now; a task that can publish no more closes r at
 * once. 0 or -ENOMEM / ATAP_ENOTASK (a forward is then closed and freed;
 * a settle listener is the caller's).
 */
int atap__flow_attach(struct atap_slot *s, uint32_t gen, struct reg *r)
{
    struct kicks kicks;
    struct side *rx = atap__side_of(s);
    bool live = true, listed = false;
    uint64_t refs, pub;

    if (!rx)
        return refused(r, -ENOMEM);
    atap__kicks_init(&kicks);
    refs = ld_relaxed(&s->refs);
    do {
        if (refs_gen(refs) != gen || (refs & REFS_COUNT_MASK) == 0)
            return refused(r, ATAP_ENOTASK);
        if (!(refs & REFS_RUN)) {
            live = false; /* over: no RUN will be dropped to close r */
            break;
        }
        if (refs & REFS_RX)
            break; /* set by an earlier registrar, with rx seen already */
        /* acq_rel: the rx installed above is seen by whoever drops RUN. */
    } while (!casw_acqrel(&s->refs, &refs, refs | REFS_RX));
    read_lock(s);
    spin_lock(&rx->lock);
    if (live && !rx->closed) {
        r->next = rx->head;
        rx->head = r;
        listed = true;
    }
    if ((pub = readable(s)) != 0)
        deliver(r, pub, slot_out(s), s->out_size, &kicks);
    spin_unlock(&rx->lock);
    read_unlock(s);
    atap__flow_kicks_run(&kicks);
    if (!listed)
        reg_close(r, s);
    return 0;
}

/* ---- the calls ----------------------------------------------------------- */

/* A reg feeding the task (index, gen), whose gate is g: counted a feeder,
 * the first one taking the feeders' hold on it. The caller holds a handle
 * on the task, so the count's 1 -> 0 (a closing reg's) and a 0 -> 1 here
 * may cross: each takes or drops one hold, and the handle keeps the slot
 * meanwhile. */
static struct reg *reg_new(struct atap_slot *t, struct gate *g, uint32_t index, uint32_t gen,
                           uint32_t place, size_t offset)
{
    struct reg *r = calloc(1, sizeof *r);

    if (!r)
        return NULL;
    r->to = index;
    r->to_gen = gen;
    r->place = place;
    r->offset = offset;
    if (add_acqrel(&g->feeders, 1) == 0)
        atap__exec_hold(t);
    return r;
}

int atap_forward(atap_task from, atap_task to)
{
    uint32_t fi, fg, ti, tg;
    struct atap_slot *f = atap__exec_live(from, &fi, &fg), *t = atap__exec_live(to, &ti, &tg);
    struct gate *g;
    struct reg *r;
    int rc = 0;

    if (!f || !t)
        return ATAP_ENOTASK;
    g = atap__extras.time->gate(t);
    if (!g || g->role != ROLE_GIVE || g->in_size != f->out_size)
        return ATAP_EINVAL;
    spin_lock(&g->lock);
    if (g->state == G_DONE)
        rc = atap__gate_closed_error(t);
    else if (!atap__gate_accepts(g))
        rc = ATAP_EFINISHED; /* as a give would be told now */
    spin_unlock(&g->lock);
    if (rc)
        return rc;
    if (!(r = reg_new(t, g, ti, tg, 0, 0)))
        return -ENOMEM;
    (void)fi;
    return atap__flow_attach(f, fg, r);
}

/* receive_all / receive_any: checks the members, spawns the task, and
 * registers it on each member. */
static int receive(atap_task *task, atap_fn *fn, void *arg, const atap_task *from, size_t n,
                   const atap_spawn_opts *opts, int role)
{
    static const atap_spawn_opts none;
    atap_spawn_opts copy;
    size_t in_size = 0, offset = 0;
    uint32_t index, gen;
    struct atap_slot *s, *m;
    struct gate *g;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if ((rc = atap__opts_in(&opts, &copy)) != 0) /* another layout: copied */
        return rc;
    opts = opts ? opts : &none;
    if (!fn || !from || n == 0 || n > UINT32_MAX || opts->in_free)
        return ATAP_EINVAL;
    if ((rc = atap__exec_check(opts, true)) != 0)
        return rc;
    for (size_t k = 0; k < n; k++) {
        if (!(m = atap__exec_live(from[k], &index, &gen)))
            return ATAP_ENOTASK;
        if (role == ROLE_ANY && m->out_size != (k ? in_size : m->out_size))
            return ATAP_EINVAL;
        if (role == ROLE_ANY)
            in_size = m->out_size;
        else if ((in_size += m->out_size) > UINT32_MAX)
            return ATAP_EINVAL;
    }
    if (!(g = atap__gate_new(role, opts, in_size, n)))
        return -ENOMEM;
    if ((rc = atap__exec_spawn(task, fn, arg, opts, g)) != 0) {
        atap__gate_destroy(g);
        return rc;
    }
    s = atap__exec_live(*task, &index, &gen);
    for (size_t k = 0; k < n; k++) {
        uint32_t mi, mg;
        struct reg *r;

        m = atap__exec_live(from[k], &mi, &mg);
        r = reg_new(s, g, index, gen, (uint32_t)k, offset);
        if (!r) { /* this place can never fill: as if the member had ended */
            struct reg stub = {.to = index, .to_gen = gen, .place = (uint32_t)k};
            atap__gate_member_closed(&stub);
            continue;
        }
        if (m)
            atap__flow_attach(m, mg, r);
        else
            reg_close(r, NULL);
        offset += role == ROLE_ALL && m ? m->out_size : 0;
    }
    return 0;
}

int atap_receive_all(atap_task *task, atap_fn *fn, void *arg, const atap_task *from, size_t n,
                     const atap_spawn_opts *opts)
{
    return receive(task, fn, arg, from, n, opts, ROLE_ALL);
}

int atap_receive_any(atap_task *task, atap_fn *fn, void *arg, const atap_task *from, size_t n,
                     const atap_spawn_opts *opts)
{
    return receive(task, fn, arg, from, n, opts, ROLE_ANY);
}

const struct atap__extras_flow atap__flow_extras = {
    .close = atap__flow_close,
    .waiting = atap__flow_waiting,
    .orphan = atap__gate_orphan,
};

/*
 * Waiting inside a task without a thread: parks (kernel waits, which hold
 * the thread, are kwait.c's).
 *
 * Parks. A run that asked for a park (atap_park_fd / _until) and returned
 * ATAP_PARKED hands its RUN reference to the park: the task stays RUNNING
 * and no thread holds it. Each task has one park record (in its slot's side
 * record), reused by every park and freed with the slot, so whoever can
 * name the task (a canceller holds a listener) can always read it. `claim`:
 *   IDLE      not parked.
 *   ARMING    the parker is registering it (registry, fd list, timer).
 *   ARMED     parked.
 *   CLAIMED|by  one of {READY (fd), DEADLINE, STOP (cancel, run timeout),
 *             OFF (shutdown, manager gone)} took it: a CAS from ARMED or
 *             ARMING, so exactly one wins. Taken from ARMED, the winner
 *             completes it; taken from ARMING, the parker's own ARMING ->
 *             ARMED CAS fails and the parker completes it.
 * Completing takes the park off the fd's waiter list, the timer and the
 * registry, then READY / DEADLINE queue the task again (its next run finds
 * the claim, reads why, and sets the record IDLE), while STOP / OFF end the
 * run as a failed one (a cancel's or timeout's state stands). A timer fire
 * from an earlier park of the same record (its disarm lost) may still come:
 * it claims only the park whose deadline it read as passed. The claim word
 * carries the park's number (bumped by the parker before ARMING, after the
 * deadline), and the fire reads the word, then the deadline, then claims by
 * CAS from exactly the word it read: a later park changed the word. After
 * ARMED the parker looks at the task's state once more (seq_cst, against
 * the canceller's fence) so a cancel that came while the park was being set
 * up is not missed.
 *
 * Wakes (atap_wake: wakers, which channels are built on) add one to
 * `woken`, the count of wakes not yet acted on, before they look at the
 * claim; a parker that arms after the add sees it. The count is emptied
 * only by whoever acts on it, and only with a claim won: a waker or the
 * parker that claimed the park READY, or a stop's completion, which then
 * completes it as woken instead (the wake came while the park was being
 * armed, or a stop overtook it). Every wake counted delivered is acted on
 * once: a woken task whose run is then dropped (cancelled after the wake
 * claimed it) still gets that run, with atap_cancelled() true, so that it
 * can hand the wake on (executor.c). A waker that finds its park claimed by
 * a stop takes its own one back if it is still there (then it reports
 * "woke nothing", and the stop finds nothing of it); if it is gone, the
 * stop's completion took it and runs the task woken (then it reports a
 * wake). Both are read-modify-writes of the one count, whose modification
 * order puts one before the other: exactly one of them has the wake, so
 * the waker's answer and the task's run agree.
 *
 * Kinds. What a park waits for besides its deadline is its kind's
 * (park_kinds.h lists them, one line each; struct park_kind in
 * park_int.h): each kind's file defines its entry (what a record joins
 * and leaves, whether the park fits the slot's tail, the kernel state it
 * keeps) and its atap_park_* call, which asks for the park through
 * atap__park_ask. This file keeps the protocol above for all of them, and
 * names no kind but in its own atap_park_* calls: it reaches each through
 * atap__park_kinds, by the number the run asked for (ctx->park_kind,
 * p->kind), and walks the table, in the list's order, for the kinds'
 * kernel state after a manager's death, at each tick and in a fork's
 * child (atap__park_rearm, _retry, _forget).
 *
 * Parks on fds are park_fd.c's: several on one fd share a `struct fdw`,
 * watched on the hub's io poller, and an fd whose watch fails is watched
 * again every tick. Parks in the slot itself (park_wheel.c: "the park
 * wheel" for deadlines; park_fd.c: "fd parks in the slot tail" for fds)
 * cost nothing beyond the slot, and keep the protocol above in the tail's
 * claim word (atap__park_tclaim): one claim, atap__park_claim_word, over
 * either word; signals, paths, the runtime's own wakes,
 * and tasks whose output fills the tail use a park record, whose deadline
 * is a timer of the manager's (fire_deadline, below).
 *
 * Signals and path changes are sources of their own (sources.c), which
 * claim and complete parks through atap__park_claim / atap__park_complete,
 * as every kind with a list of its own does.
 * Locks: park_fd.c's fd_lock (every fd's waiter list, watch and deaf mark),
 * reg_lock (the registry of armed parks), sources.c's src_lock (its lists),
 * any other kind's own lock (its lists; a leaf, as src_lock is), never two
 * at once, and none while completing.
 */
#include "park.h"
#include "park_int.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "extras.h"
#include "faults.h"
#include "handle.h"
#include "hub.h"
#include "pool.h"
#include "side.h"
#include "slot.h"
#include "table.h"
#include "timer.h"
#include "trace.h"
#include "wait.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct park *armed_parks;
static bool reg_closed;

/* ---- claiming ------------------------------------------------------------ */

int atap__park_claim_word(_Atomic uint32_t *w, uint32_t c, int by, uint32_t same, uint32_t clear,
                          uint32_t set)
{
    uint32_t want = c & same;

    for (;;) {
        uint32_t st = P_STATE(c);

        if ((c & same) != want || (st != P_ARMING && st != P_ARMED))
            return 0;
        /* acq_rel: the winner sees the parker's arm (its ARMED store is a
         * release) and its own completion follows the claim. */
        if (casw_acqrel(w, &c, (c & ~(0xffu | clear)) | set | P_CLAIMED | (uint32_t)by))
            return st == P_ARMED ? 1 : -1;
    }
}

/* Claims the park the claim word c (read by the caller) belongs to; with
 * `exact`, only that one: not a later park of the record (its number is
 * the word's upper bits). */
static int claim_from(struct park *p, uint32_t c, int by, bool exact)
{
    return atap__park_claim_word(&p->claim, c, by, exact ? ~0xffu : 0, 0, 0);
}

/* seq_cst: the load pairs with the parker's store of ARMING (see interrupt). */
int atap__park_claim(struct park *p, int by)
{
    return claim_from(p, ld_seqcst(&p->claim), by, false);
}

static void registry_remove(struct park *p)
{
    pthread_mutex_lock(&reg_lock);
    if (p->listed) {
        if (p->prev)
            p->prev->next = p->next;
        else
            armed_parks = p->next;
        if (p->next)
            p->next->prev = p->prev;
        p->listed = false;
    }
    pthread_mutex_unlock(&reg_lock);
}

/* The one claimant's work: the park comes off everything it is on, then
 * the task runs again (READY, DEADLINE) or its run ends failed (STOP, OFF;
 * a cancel's or timeout's state stands). */
void atap__park_complete(struct park *p, int by)
{
    struct atap_slot *s = atap__table_at(p->index);
    uint32_t index = p->index, gen = p->gen;

    if (atap__park_kinds[p->kind]->leave)
        atap__park_kinds[p->kind]->leave(p);
    if (p->timed && by != BY_DEADLINE)
        atap__timer_disarm(atap__hub_timers(), &p->timer); /* lost: see the top */
    registry_remove(p);
    if ((by == BY_STOP || by == BY_OFF) && atap__park_kinds[p->kind]->wake)
        TEST_HOOK(ATAP__TEST_STOP_WAKE);
    /* Stopped with a wake pending: one that came before the park was armed,
     * or that a stop overtook (atap__park_wake counted it delivered, unless
     * it takes it back: the exchange and its take-back are RMWs of one
     * count, so one of them has it). The task runs once more, woken, to
     * hand it on (a channel's value, or room), as a task woken and then
     * stopped does (run_observed). */
    if ((by == BY_STOP || by == BY_OFF) && atap__park_kinds[p->kind]->wake &&
        xchg_seqcst(&p->woken, 0)) {
        st_release(&p->claim, (ld_relaxed(&p->claim) & ~0xffu) | P_CLAIMED | BY_READY);
        by = BY_READY;
    }
    if (by == BY_READY || by == BY_DEADLINE) {
        /* Nothing of p is touched after this: the next run owns it. */
        atap__park_requeue(s, index);
        return;
    }
    atap__exec_finish_run(s, index, gen, ATAP_EFAILED);
}

/* ---- the deadline -------------------------------------------------------- */

static void fire_deadline(struct atap_timer *t)
{
    struct park *p = (struct park *)((char *)t - offsetof(struct park, timer));

    /* A fire left from an earlier park of this record claims only a park
     * whose deadline has passed: the deadline read after the claim word
     * (acquire) is that park's or a later one's, and a later park changed
     * the word, so the CAS from it fails. */
    uint32_t c = ld_acquire(&p->claim);
    uint64_t deadline = ld_acquire(&p->deadline);

    uint64_t now;

    TEST_HOOK(ATAP__TEST_PARK_FIRE);
    if ((now = atap__now_ns()) >= deadline && claim_from(p, c, BY_DEADLINE, true) == 1) {
        atap__park_fired(now, deadline);
        atap__park_complete(p, BY_DEADLINE);
    }
}

/* ---- arming, resuming, stopping ------------------------------------------ */

/* The task's park record, made on first use (the caller holds RUN). */
static struct park *park_of(struct atap_slot *s)
{
    struct side *side = atap__side_of(s);
    struct park *_Atomic *at, *p;

    if (!side)
        return NULL;
    at = &side->park;
    if ((p = ld_acquire(at)) != NULL)
        return p;
    if (!(p = calloc(1, sizeof *p)))
        return NULL;
    atap__timer_init(&p->timer, fire_deadline);
    st_release(at, p); /* only the task's runner ever installs it */
    return p;
}

/* The table of the kinds (park_int.h's struct park_kind), from
 * park_kinds.h's list: each entry is defined in its kind's own file. */
const struct park_kind *const atap__park_kinds[PK_KINDS] = {
#define PARK_KIND(name, ops) [PK_##name] = &(ops),
#include "park_kinds.h"
#undef PARK_KIND
};

void atap__park_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    const struct park_kind *k;
    struct park *p;
    uint32_t c, st, w;
    bool closed;
    int by = 0;

    ATAP_TRACE(TR_PARK, ATAP_TRACE_ID(ctx->index, ctx->gen), NULL, ctx->park_kind);
    k = atap__park_kinds[ctx->park_kind];
    /* Its output lies over its arg (slot.h): the next run finds the arg on
     * the side record (written before any arm publishes the park). */
    if (unlikely(s->flags & SF_OUT_WIDE)) {
        struct side *x = atap__side_of(s);

        if (!x) {
            atap__exec_finish_run(s, ctx->index, ctx->gen, -ENOMEM);
            return;
        }
        x->arg = ctx->arg;
    }
    if (k->fits_tail && k->fits_tail(s, ctx)) {
        k->tail_arm(s, ctx);
        return;
    }
    if (!(p = park_of(s))) {
        atap__exec_finish_run(s, ctx->index, ctx->gen, ATAP_EFAILED);
        return;
    }
    /* Once ARMED, the park may be claimed, the task run to its end and the
     * slot (and p with it) freed before we are done: our own listener keeps
     * them until we let go. */
    atap__exec_hold(s);
    p->index = ctx->index;
    p->gen = ctx->gen;
    p->kind = ctx->park_kind;
    p->fd = ctx->fd;
    p->events = ctx->events;
    p->timed = ctx->deadline != ATAP__FOREVER;
    st_relaxed(&p->got, 0);
    st_release(&p->deadline, ctx->deadline);
    /* seq_cst: a canceller that finds ARMING claims it (see the top). A
     * new number: a fire read the deadline of an earlier park. */
    p->seq += P_SEQ_ONE;
    st_seqcst(&p->claim, p->seq | P_ARMING);
    TEST_HOOK(ATAP__TEST_PARK_ARMING);
    pthread_mutex_lock(&reg_lock);
    if (!(closed = reg_closed)) {
        p->prev = NULL;
        p->next = armed_parks;
        if (armed_parks)
            armed_parks->prev = p;
        armed_parks = p;
        p->listed = true;
    }
    pthread_mutex_unlock(&reg_lock);
    if (closed)
        atap__park_claim(p, BY_OFF); /* no manager will run again */
    if (k->join && ld_relaxed(&p->claim) == (p->seq | P_ARMING) && k->join(p) < 0) {
        st_relaxed(&p->got, ATAP_ERROR); /* not watchable: its next read says why */
        atap__park_claim(p, BY_READY);
    }
    if (p->timed && ld_relaxed(&p->claim) == (p->seq | P_ARMING)) {
        p->ever_timed = true;
        if (atap__timer_arm(atap__hub_timers(), &p->timer, ctx->deadline))
            atap__hub_wake();
        TEST_HOOK(ATAP__TEST_PARK_TIMED);
    }
    c = p->seq | P_ARMING;
    /* seq_cst: store against store with a waker (its woken store, then its
     * claim load) and with a canceller (its state change and fence, then its
     * claim), each read back below. */
    if (!cas_seqcst(&p->claim, &c, p->seq | P_ARMED)) {
        atap__park_complete(p, (int)(P_STATE(c) & ~P_CLAIMED)); /* claimed while we armed it */
    } else if (k->wake && ld_seqcst(&p->woken)) {
        /* A wake that came before the park was armed (atap__park_wake).
         * The count goes only with a claim won: a stop that claims first
         * finds it and hands the wake on (atap__park_complete). */
        if (atap__park_claim(p, BY_READY) == 1) {
            xchg_seqcst(&p->woken, 0);
            atap__park_complete(p, BY_READY);
        }
    } else {
        /* A stop that came before the park could be found (seq_cst, against
         * the canceller's CAS and fence). From here p may already be on its
         * next park (claimed, resumed, parked again): a stop still applies. */
        w = ld_seqcst(&s->word);
        st = word_state(w);
        if (word_gen(w) == ctx->gen &&
            (st == ST_CANCELLED || st == ST_TIMED_OUT || st == ST_FAILED))
            by = BY_STOP;
        if (by && atap__park_claim(p, by) == 1)
            atap__park_complete(p, by);
    }
    atap__exec_release_listener(s, ctx->index, ctx->gen);
}

bool atap__park_resume(struct atap_slot *s, struct atap_ctx *ctx)
{
    struct side *side;
    struct park *p;
    uint32_t c;

    _Atomic uint32_t *tc = tail_claim(s);

    if (tc) {
        c = ld_acquire(tc);
        if ((c & T_STATE) == (P_CLAIMED | BY_DEADLINE) || (c & T_STATE) == (P_CLAIMED | BY_READY)) {
            st_relaxed(tc, P_IDLE);
            ctx->resumed = (uint8_t)(c & T_STATE & ~P_CLAIMED);
            ctx->events = (c >> T_GOT_SHIFT) & 0xfu;
            return true;
        }
    }
    if (!(side = ld_acquire(&s->side)) || !(p = ld_acquire(&side->park)))
        return false;
    c = P_STATE(ld_acquire(&p->claim));
    if (c != (P_CLAIMED | BY_READY) && c != (P_CLAIMED | BY_DEADLINE))
        return false;
    ctx->gen = p->gen;
    ctx->resumed = (uint8_t)(c & ~P_CLAIMED);
    ctx->events = ld_relaxed(&p->got);
    ctx->woke = atap__park_kinds[p->kind]->wake;
    st_release(&p->claim, P_IDLE);
    return true;
}

void atap__park_interrupt(struct atap_slot *s, uint32_t index, uint32_t gen)
{
    struct side *side;
    struct park *p;

    /* Pairs with the parker's and the kernel waiter's seq_cst stores. */
    fence_seqcst();
    /* A park in the slot tail: on an fd alone, ended here if claimed from
     * ARMED; on the wheel, claimed here and ended by the manager at its next
     * run (park_wheel.c), and off its fd's list at once if it has one. */
    if (tail_claim(s) && atap__park_tclaim(s, BY_STOP, 0) == 1) {
        uint32_t c = ld_relaxed(tail_claim(s));
        if ((c & (T_FD | T_TIMED)) == T_FD) {
            atap__park_tail_fd_complete(index, BY_STOP, true);
        } else {
            if (c & T_TIMED)
                atap__park_tail_off_fd(s, index);
            atap__park_wheel_stopped(s);
        }
    }
    /* The side record and its park belong to this incarnation of the slot
     * (they go with it), and the caller holds a listener: p is this
     * task's, and its fields are read only after a claim, which acquires
     * what the parker wrote before ARMING. */
    if ((side = ld_acquire(&s->side)) != NULL && (p = ld_acquire(&side->park)) &&
        atap__park_claim(p, BY_STOP) == 1)
        atap__park_complete(p, BY_STOP);
    atap__pool_interrupt((uint64_t)gen << 32 | index);
}

bool atap__park_parked(struct atap_slot *s)
{
    _Atomic uint32_t *tc = tail_claim(s);
    struct side *side;
    struct park *p;
    uint32_t c;

    /* A free slot's tail reads "not parked" (executor.c's destroy), and the
     * listener the caller holds keeps this task's side record. */
    if (tc) {
        c = ld_acquire(tc) & T_STATE;
        if (c == P_ARMING || c == P_ARMED)
            return true;
    }
    if (!(side = ld_acquire(&s->side)) || !(p = ld_acquire(&side->park)))
        return false;
    c = P_STATE(ld_acquire(&p->claim));
    return c == P_ARMING || c == P_ARMED;
}

/* ---- the manager's side -------------------------------------------------- */

/* Each kind's kernel state (struct park_kind's rearm, retry), kind by
 * kind in park_kinds.h's order: watched again after a manager's death (the
 * supervisor, between two lives), a failed watch tried again at each tick
 * (the manager). */
void atap__park_rearm(void)
{
    for (int k = 1; k < PK_KINDS; k++)
        if (atap__park_kinds[k]->rearm)
            atap__park_kinds[k]->rearm();
}

void atap__park_retry(void)
{
    for (int k = 1; k < PK_KINDS; k++)
        if (atap__park_kinds[k]->retry)
            atap__park_kinds[k]->retry();
}

void atap__park_open(void)
{
    atap__park_wheel_open();
    atap__park_tails_open();
    pthread_mutex_lock(&reg_lock);
    reg_closed = false;
    pthread_mutex_unlock(&reg_lock);
}

/* Every armed park record's timer, for the supervisor's rebuild of the
 * timer structure: a record with its timer armed is in the registry (it is
 * registered before its timer is armed and leaves only once the timer is
 * disarmed or fired), and nothing in the registry is freed. */
void atap__park_find_timers(atap__timer_visit *visit, void *cookie)
{
    pthread_mutex_lock(&reg_lock);
    for (struct park *p = armed_parks; p; p = p->next)
        if (p->timed)
            visit(&p->timer, cookie);
    pthread_mutex_unlock(&reg_lock);
}

void atap__park_close_all(void)
{
    struct park *p;
    int r;

    atap__park_wheel_close();
    atap__park_tails_close();
    pthread_mutex_lock(&reg_lock);
    reg_closed = true;
    while ((p = armed_parks) != NULL) {
        armed_parks = p->next;
        if (armed_parks)
            armed_parks->prev = NULL;
        p->listed = false;
        r = atap__park_claim(p, BY_OFF);
        pthread_mutex_unlock(&reg_lock);
        if (r == 1)
            atap__park_complete(p, BY_OFF);
        pthread_mutex_lock(&reg_lock);
    }
    pthread_mutex_unlock(&reg_lock);
}

/* Park records go with their slots (atap__park_destroy); one whose timer
 * the structure may still hold waits here for the manager. */
static _Atomic(struct park *) graveyard;
static struct park *mourning;

void atap__park_destroy(struct park *p)
{
    struct park *head = ld_relaxed(&graveyard);

    if (!p)
        return;
    /* Never armed, or no manager will run again and it was let go (the
     * structure was emptied when the supervisor gave up), or the runtime
     * stopped (the structure is gone; its owner, this slot, parks no more). */
    if (!p->ever_timed || (atap__hub_gone() && !atap__timer_held(&p->timer)) ||
        atap__hub_stopped()) {
        free(p);
        return;
    }
    if (atap__hub_accepting()) /* let go of at the next run (schedule.c) */
        atap__timer_forget(atap__hub_timers(), &p->timer);
    do
        p->grave_next = head;
    while (!casw_release(&graveyard, &head, p));
}

void atap__park_reap(bool all)
{
    struct park *p = xchg_acquire(&graveyard, NULL), *next;

    while (mourning) {
        next = mourning->grave_next;
        mourning->grave_next = p;
        p = mourning;
        mourning = next;
    }
    for (; p; p = next) {
        next = p->grave_next;
        if (!all && atap__timer_held(&p->timer)) {
            p->grave_next = mourning;
            mourning = p;
        } else {
            free(p);
        }
    }
}

/* atap_block's park: on the calling thread, in the kernel. */
static void park_block(struct atap_ctx *ctx)
{
    int rc =
        atap__plain_wait(ctx->deadline, false, ctx->park_kind == PK_FD ? ctx->fd : -1, ctx->events);

    ctx->resumed = ctx->park_kind == PK_FD && rc != ATAP_ENOTREADY ? BY_READY : BY_DEADLINE;
    ctx->events = rc > 0 ? (unsigned)rc : rc < 0 && rc != ATAP_ENOTREADY ? ATAP_ERROR : 0;
    ctx->park_kind = 0;
}

int atap_block(atap_fn *fn, void *arg, void *out, size_t out_size)
{
    struct atap_ctx ctx = {.slot = NULL, .in_block = true};
    int rc;

    if (!fn || (out_size && !out))
        return ATAP_EINVAL;
    for (;;) {
        rc = fn(&ctx, arg, out_size ? out : NULL);
        if (rc != ATAP_PARKED || !ctx.park_kind)
            return rc == 0 ? 0 : ATAP_EFAILED;
        park_block(&ctx); /* on this thread, then round again */
    }
}

/* ---- wakers: parks of the program's own making ------------------------------ */

static inline int ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline);

/* A wake's park: nothing to join; a stop hands a pending wake on. */
const struct park_kind atap__park_kind_wake = {.wake = true};

/* A waker is a handle's bits (handle.h) that hold nothing. */
atap_waker atap_waker_of(atap_ctx *ctx)
{
    if (!ctx || !ctx->slot)
        return (atap_waker){0};
    return (atap_waker){make_task(ctx->index, ctx->gen).id};
}

/* The record is made before the park is asked for: a wake that comes
 * from then on finds it, and sets its flag if the park is not armed yet
 * (atap__park_wake), which the arming reads. */
int atap_park_wake(atap_ctx *ctx, uint64_t timeout_ns)
{
    if (!ctx || !ctx->slot || ctx->park_kind)
        return ATAP_EINVAL;
    if (!park_of(ctx->slot))
        return -ENOMEM;
    return ask(ctx, PK_WAKE, -1, 0, atap__deadline_in(timeout_ns));
}

bool atap_wake(atap_waker w)
{
    uint32_t gen;
    struct atap_slot *s = lookup((atap_task){w.id}, &gen);

    return s && atap__park_wake((uint32_t)w.id, gen);
}

bool atap_waker_live(atap_waker w)
{
    uint32_t gen, cur;
    struct atap_slot *s = lookup((atap_task){w.id}, &gen);

    if (!s)
        return false;
    cur = ld_acquire(&s->word);
    return word_is(cur, gen) && !state_terminal(word_state(cur));
}

/* Takes one wake back from the count, if one is left: true if it did. */
static bool unwake(struct park *p)
{
    uint64_t n = ld_relaxed(&p->woken);

    /* seq_cst like every change of the count; the RMW's place in the
     * count's modification order is what decides, against the stop's
     * exchange (atap__park_complete), which of the two has the wake. */
    while (n && !casw_seqcst(&p->woken, &n, n - 1)) {
    }
    return n != 0;
}

/*
 * Wakes the task (index, gen) parked, or about to park, by
 * atap_park_wake. The count first, then the claim: a parker that armed
 * before our add is claimed here; one that arms after sees the count (both
 * seq_cst). Only a claim won empties the count, so a wake acts once. A
 * wake for a task that is not waiting makes its next wait return at once
 * (a spurious wake: the channel tasks look again). A park a stop claimed:
 * our wake, if still counted, is taken back and we say nothing was woken;
 * if it is gone, the stop's completion took it and runs the task woken.
 */
bool atap__park_wake(uint32_t index, uint32_t gen)
{
    struct atap_slot *s = atap__table_at(index);
    struct side *side;
    struct park *p;
    uint32_t c, w;
    bool live;

    if (!atap__exec_try_hold(s, gen)) /* gone: nothing to wake */
        return false;
    /* Running, or PENDING: a task with no handle runs without leaving
     * PENDING (executor.c's run_unobserved) until it parks. */
    w = ld_acquire(&s->word);
    live = word_gen(w) == gen && (word_state(w) == ST_RUNNING || word_state(w) == ST_PENDING);
    if (live && (side = ld_acquire(&s->side)) != NULL && (p = ld_acquire(&side->park))) {
        TEST_HOOK(ATAP__TEST_WAKE_LIVE);
        add_seqcst(&p->woken, 1);
        c = P_STATE(ld_seqcst(&p->claim));
        if (c == P_ARMED) {
            int r = atap__park_claim(p, BY_READY);
            if (r == 1) {
                /* Ours: every wake counted so far is this run's. Emptied
                 * before the completion hands p to the next run. */
                xchg_seqcst(&p->woken, 0);
                atap__park_complete(p, BY_READY);
            }
            c = r ? P_CLAIMED | BY_READY : P_STATE(ld_acquire(&p->claim));
        }
        /* Taken down by a cancel, a timeout or a shutdown: it will not look
         * again. Ours taken back, the wake reached no one; gone, the stop's
         * completion has it and the task runs woken (see the top). */
        if ((c == (P_CLAIMED | BY_STOP) || c == (P_CLAIMED | BY_OFF)) && unwake(p))
            live = false;
    }
    atap__exec_release_listener(s, index, gen);
    return live;
}

/* ---- asking for a park ---------------------------------------------------- */

/* Inline in this file's own atap_park_* calls; a kind of another file
 * calls atap__park_ask. */
static inline int ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline)
{
    if (!ctx || (!ctx->slot && !ctx->in_block) || ctx->park_kind)
        return ATAP_EINVAL;
    ctx->park_kind = (uint8_t)kind;
    ctx->fd = fd;
    ctx->events = events;
    ctx->deadline = deadline;
    return 0;
}

int atap__park_ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline)
{
    return ask(ctx, kind, fd, events, deadline);
}

int atap_park_fd(atap_ctx *ctx, int fd, unsigned events, uint64_t timeout_ns)
{
    if (fd < 0 || !events || (events & ~EVENT_BITS))
        return ATAP_EINVAL;
    return ask(ctx, PK_FD, fd, events, atap__deadline_in(timeout_ns));
}

int atap_park_until(atap_ctx *ctx, uint64_t deadline_ns)
{
    return ask(ctx, PK_UNTIL, -1, 0, deadline_ns);
}

/* A signal a park may catch: not one that cannot be caught, not one the C
 * library keeps for itself (sigaction refuses those), and not a fault: a
 * handler that returns from SIGSEGV re-runs the faulting instruction, for
 * ever, and the handler stays for the life of the process. */
bool atap__signal_catchable(int signo)
{
    struct sigaction old;

    switch (signo) {
    case SIGKILL:
    case SIGSTOP:
    case SIGSEGV:
    case SIGBUS:
    case SIGFPE:
    case SIGILL:
    case SIGTRAP:
    case SIGSYS:
        return false;
    default:
        return signo > 0 && signo < NSIG && sigaction(signo, NULL, &old) == 0;
    }
}

int atap_park_signal(atap_ctx *ctx, int signo, uint64_t timeout_ns)
{
    if (!atap__signal_catchable(signo))
        return ATAP_EINVAL;
    if (ctx && ctx->in_block)
        return ATAP_EINVAL; /* a handler of ours needs the manager */
    return ask(ctx, PK_SIGNAL, signo, 0, atap__deadline_in(timeout_ns));
}

int atap_park_signal_since(atap_ctx *ctx, int signo, uint64_t seen, uint64_t timeout_ns)
{
    unsigned since = ATAP__SIG_SINCE | ((unsigned)seen & ATAP__SIG_SEEN_MASK);

    if (!atap__signal_catchable(signo) || (ctx && ctx->in_block))
        return ATAP_EINVAL;
    return ask(ctx, PK_SIGNAL, signo, since, atap__deadline_in(timeout_ns));
}

/* Caught first, then counted from: every delivery after the call is the
 * handler's, and counted. */
int atap_signal_count(int signo, uint64_t *count)
{
    int rc;

    if (!count || !atap__signal_catchable(signo))
        return ATAP_EINVAL;
    if ((rc = atap__signal_catch(signo)) != 0)
        return rc;
    *count = atap__signal_count(signo);
    return 0;
}

int atap_signal_release(int signo)
{
    if (!atap__signal_catchable(signo))
        return ATAP_EINVAL;
    return atap__signal_release(signo);
}

int atap_park_path(atap_ctx *ctx, int fd, unsigned changes, uint64_t timeout_ns)
{
    if (!atap__source_paths())
        return -ENOTSUP; /* the poll backend off Linux */
    if (fd < 0 || !changes ||
        (changes & ~(ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES | ATAP_PATH_GONE)))
        return ATAP_EINVAL;
    if (ctx && ctx->in_block)
        return ATAP_EINVAL;
    return ask(ctx, PK_PATH, fd, changes | ATAP_PATH_GONE, atap__deadline_in(timeout_ns));
}

bool atap_resumed(atap_ctx *ctx) { return ctx && ctx->resumed != 0; }

int atap_resume_reason(atap_ctx *ctx) { return ctx ? ctx->resumed : 0; }

unsigned atap_resume_events(atap_ctx *ctx)
{
    return ctx && ctx->resumed == ATAP_RESUME_READY ? ctx->events : 0;
}

/* In a fork's child (its one thread; runtime.c): every park, fd watch and
 * wheel entry is the parent's tasks', whose slots the child no longer has.
 * All of it goes back to the state before the first start, unfreed (the
 * parent's memory); the locks are taken fresh, since a thread that is not
 * here may have held them and nothing they guarded is kept. */
void atap__park_forget(void)
{
    for (int k = 1; k < PK_KINDS; k++) /* each kind's kernel state first */
        if (atap__park_kinds[k]->forget)
            atap__park_kinds[k]->forget();
    reg_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    armed_parks = NULL;
    reg_closed = false;
    atap__park_wheel_forget();
    st_relaxed(&graveyard, NULL);
    mourning = NULL;
}

const struct atap__extras_park atap__park_extras = {
    .arm = atap__park_arm,
    .resume = atap__park_resume,
    .interrupt = atap__park_interrupt,
    .parked = atap__park_parked,
    .destroy = atap__park_destroy,
    .delay = atap__park_delay,
};

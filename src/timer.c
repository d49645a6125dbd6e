/*
 * The manager's timers: an MPSC inbox in front of a hierarchical timing
 * wheel that only the manager thread touches.
 *
 * The record's state word: seq << 2 | QUEUED | ARMED.
 *   ARMED   the latest arming is owed exactly one outcome. Cleared by CAS,
 *           so exactly one of {the manager's fire, a disarm, take_all, a
 *           superseding arm} wins it.
 *   QUEUED  the record is on the inbox (or its arm is about to push it).
 *           Set only by arm, cleared only by the manager when it takes the
 *           record off. So a record is pushed at most once at a time, and
 *           `qnext` belongs to the inbox while the bit is set.
 *   seq     bumped by every arm. The manager files an entry with the state
 *           it drained (`eseq`) and fires it only by a strong CAS from
 *           exactly eseq | ARMED. A newer arming is QUEUED until the manager
 *           re-files the record, so an entry never fires an arming it was
 *           not filed for, even after seq wraps.
 * `deadline` is written only by arm, with a release store, and only after
 * arm has cleared ARMED. A manager that reads it with acquire and gets a
 * later arming's value therefore also sees that ARMED was cleared, and its
 * CAS for the older entry fails: no deadline ever fires an arming it does
 * not belong to, so nothing fires early.
 *
 * Arm: clear ARMED if set, store the deadline, CAS in seq + 1 | QUEUED |
 * ARMED, push unless QUEUED was already set (then the record is in the inbox
 * and the manager will read the new deadline when it drains it). Disarm:
 * one CAS clearing ARMED; the manager drops the stale entry when it meets
 * it (lazy: nothing else to do on the disarming thread).
 *
 * The wheel (manager only). A tick is 2^16 ns; `cur` is the tick it has
 * reached (never past the last now given to run). A record lives in at most
 * one place, `link.next == NULL` meaning none:
 *   level L, slot j  its tick > cur, first differs from cur in 6-bit group
 *                    L, and has digit j there (so j > cur's digit);
 *   near             its tick <= cur; sorted by deadline;
 *   a batch          transient, on the way to near within one call.
 * So every event at level L (a slot above cur's digit) comes before every
 * event at level L + 1, and the next event is the lowest occupied slot of
 * the lowest level. Reaching it, the slot cascades: each record is re-filed
 * relative to the new cur, one level down or into near. A record fires only
 * from near, only when its deadline <= now, and only through the CAS: never
 * early. Every record with deadline <= now has tick <= now's tick, and run
 * reaches every event up to now's tick before it fires, so a record absorbed
 * before a run fires in that run if it is due.
 *
 * The sleep: run returns the exact earliest deadline (the head of near, or a
 * lower bound `min0` of the next level-0 slot that is exact unless a record
 * left it), or the start of a higher slot that must cascade. It publishes
 * that in next_wake, and arm lowers next_wake by CAS when its deadline is
 * earlier, returning true so its caller wakes the manager.
 *
 * Lost wakes (the one protocol here that needs seq_cst): arm pushes (seq_cst)
 * and then reads next_wake (seq_cst); run publishes next_wake (seq_cst) and
 * then reads the inbox (seq_cst), absorbing again while it is not empty.
 * Either run sees the push, or arm sees the published value and wakes the
 * manager if it is later. An arm that found QUEUED set did not push; the push
 * of its earlier arming happened before it (arms of a record are
 * serialised), so run sees that push unless it already drained the record,
 * which it then did after this arm's CAS, reading its deadline. While run
 * works it publishes 0 ("awake"), so arms meanwhile do not wake it.
 */
#include "timer.h"

#include "atomics.h"

#define ARMED 1u
#define QUEUED 2u
#define SEQ_ONE 4u
#define SEQ_MASK (~3u)
#define SETTLE_ROUNDS 8 /* absorbs after publishing before run gives up */
#define PRELOAD_TICKS 16 /* ~1 ms: how soon a level-0 slot is moved to near early */

_Static_assert(TIMER_TICK_SHIFT + TIMER_L0_BITS + (TIMER_LEVELS - 1) * TIMER_LN_BITS >= 64,
               "the levels cover every uint64_t deadline");
_Static_assert(TIMER_NSLOTS % 64 == 0, "every level fills whole bitmap words");

/* Level l covers tick bits [shift, shift + bits); its slots start at base
 * in ts->slot and in the bitmap. */
static inline unsigned lv_shift(unsigned l) { return l ? TIMER_L0_BITS + TIMER_LN_BITS * (l - 1) : 0; }
static inline unsigned lv_bits(unsigned l) { return l ? TIMER_LN_BITS : TIMER_L0_BITS; }
static inline unsigned lv_base(unsigned l)
{
    return l ? TIMER_L0_SLOTS + (l - 1) * (1u << TIMER_LN_BITS) : 0;
}

/* The level of a tick whose highest bit differing from cur is bit h. */
static inline unsigned lv_of(unsigned h)
{
    return h < TIMER_L0_BITS ? 0 : 1 + (h - TIMER_L0_BITS) / TIMER_LN_BITS;
}

static inline void bit_set(struct atap_timers *ts, unsigned i)
{
    ts->occupied[i / 64] |= UINT64_C(1) << (i % 64);
}

static inline void bit_clear(struct atap_timers *ts, unsigned i)
{
    ts->occupied[i / 64] &= ~(UINT64_C(1) << (i % 64));
}

/* The first set bit in [from, to), or to. */
static unsigned bit_next(const uint64_t *w, unsigned from, unsigned to)
{
    while (from < to) {
        uint64_t bits = w[from / 64] & (~UINT64_C(0) << (from % 64));
        if (bits) {
            unsigned i = from / 64 * 64 + (unsigned)__builtin_ctzll(bits);
            return i < to ? i : to;
        }
        from = from / 64 * 64 + 64;
    }
    return to;
}

static inline struct atap_timer *rec_of(struct atap_tlink *l)
{
    return (struct atap_timer *)((char *)l - offsetof(struct atap_timer, link));
}

/* ---- lists (manager only) ------------------------------------------------ */

static inline void list_init(struct atap_tlink *h) { h->next = h->prev = h; }

static inline bool list_empty(const struct atap_tlink *h) { return h->next == h; }

static inline void list_insert_before(struct atap_tlink *pos, struct atap_tlink *l)
{
    l->next = pos;
    l->prev = pos->prev;
    pos->prev->next = l;
    pos->prev = l;
}

static void unlink_rec(struct atap_timers *ts, struct atap_timer *t)
{
    t->link.prev->next = t->link.next;
    t->link.next->prev = t->link.prev;
    t->link.next = t->link.prev = NULL;
    ts->held--;
}

/* ---- filing (manager only) ----------------------------------------------- */

/* A batch: records bound for near, chained through link.next (NULL ends). */
struct batch {
    struct atap_tlink *head;
    size_t n;
};

static void file_rec(struct atap_timers *ts, struct atap_timer *t, struct batch *b)
{
    uint64_t tick = t->when >> TIMER_TICK_SHIFT;
    unsigned level, i;

    ts->held++;
    if (tick <= ts->cur) {
        t->link.next = b->head;
        t->link.prev = NULL;
        b->head = &t->link;
        b->n++;
        return;
    }
    level = lv_of(63u - (unsigned)__builtin_clzll(tick ^ ts->cur));
    i = lv_base(level) + ((unsigned)(tick >> lv_shift(level)) & ((1u << lv_bits(level)) - 1));
    if (level == 0 && (list_empty(&ts->slot[i]) || t->when < ts->min0[i]))
        ts->min0[i] = t->when;
    list_insert_before(&ts->slot[i], &t->link);
    bit_set(ts, i);
}

static struct atap_tlink *merge_runs(struct atap_tlink *a, struct atap_tlink *b)
{
    struct atap_tlink head, *tail = &head;

    while (a && b) {
        struct atap_tlink **min = rec_of(b)->when < rec_of(a)->when ? &b : &a;
        tail->next = *min;
        tail = *min;
        *min = (*min)->next;
    }
    tail->next = a ? a : b;
    return head.next;
}

/* Sorts the first n (>= 1) links of *l by deadline and advances *l past them. */
static struct atap_tlink *sort_run(struct atap_tlink **l, size_t n)
{
    struct atap_tlink *a;

    if (n == 1) {
        a = *l;
        *l = a->next;
        a->next = NULL;
        return a;
    }
    a = sort_run(l, n / 2);
    return merge_runs(a, sort_run(l, n - n / 2));
}

/* Sorts the batch and merges it into near, which stays sorted. Near holds
 * at most about one tick of records, so the walk is short. */
static void merge_batch(struct atap_timers *ts, struct batch *b)
{
    struct atap_tlink *l, *next, *pos = ts->near.next;

    if (b->n == 0)
        return;
    for (l = sort_run(&b->head, b->n); l; l = next) {
        next = l->next;
        while (pos != &ts->near && rec_of(pos)->when <= rec_of(l)->when)
            pos = pos->next;
        list_insert_before(pos, l);
    }
    b->head = NULL;
    b->n = 0;
}

/* ---- the inbox ------------------------------------------------------------ */

static void push(struct atap_timers *ts, struct atap_timer *t)
{
    struct atap_timer *head = ld_relaxed(&ts->inbox);

    /* seq_cst: the push comes before this arm's read of next_wake in the
     * single order the lost-wake handshake relies on (top of file). */
    do
        t->qnext = head;
    while (!atomic_compare_exchange_weak_explicit(&ts->inbox, &head, t, memory_order_seq_cst,
                                                  memory_order_relaxed));
}

/* Takes one record off the inbox: the QUEUED bit goes, the entry (if any) is
 * re-filed for its latest arming, or dropped when that was disarmed. */
static void absorb_rec(struct atap_timers *ts, struct atap_timer *t, struct batch *b)
{
    /* acq_rel: acquire pairs with the arm's release CAS (its deadline and the
     * record's contents); release orders our read of qnext before the next
     * push of this record, which can only follow this clear. */
    uint32_t s = atomic_fetch_and_explicit(&t->state, ~QUEUED, memory_order_acq_rel);

    if (t->link.next)
        unlink_rec(ts, t); /* filed for an earlier arming */
    if (!(s & ARMED))
        return;
    t->eseq = s & SEQ_MASK;
    /* acquire: a later arming's deadline comes with its clearing of ARMED,
     * which then fails our fire CAS (top of file). */
    t->when = ld_acquire(&t->deadline);
    file_rec(ts, t, b);
}

/* Drains the inbox into the wheel and near. */
static void absorb(struct atap_timers *ts)
{
    struct batch b = {NULL, 0};
    /* acquire: pairs with the pushers' CAS, so each record's qnext, state and
     * deadline are visible. */
    struct atap_timer *t = atomic_exchange_explicit(&ts->inbox, NULL, memory_order_acquire);

    while (t) {
        struct atap_timer *next = t->qnext; /* before QUEUED goes: then it may be pushed again */
        absorb_rec(ts, t, &b);
        t = next;
    }
    merge_batch(ts, &b);
}

/* ---- the wheel -------------------------------------------------------------- */

/* The next slot to cascade: the lowest occupied slot above cur's digit in the
 * lowest level that has one; *tick is when cur reaches it. Clears the bits
 * of slots found empty. */
static bool next_event(struct atap_timers *ts, unsigned *level, unsigned *slot, uint64_t *tick)
{
    for (unsigned l = 0; l < TIMER_LEVELS; l++) {
        unsigned shift = lv_shift(l), top = shift + lv_bits(l);
        unsigned base = lv_base(l), end = base + (1u << lv_bits(l));
        unsigned i = base + ((unsigned)(ts->cur >> shift) & ((1u << lv_bits(l)) - 1));

        for (i = bit_next(ts->occupied, i + 1, end); i < end; i = bit_next(ts->occupied, i + 1, end)) {
            if (list_empty(&ts->slot[i])) {
                bit_clear(ts, i);
                continue;
            }
            *level = l;
            *slot = i;
            *tick = ts->cur >> top << top | (uint64_t)(i - base) << shift;
            return true;
        }
    }
    return false;
}

/* Whether the entry still stands for the record's latest arming. A stale
 * answer costs only a later look: the fire CAS decides. */
static inline bool entry_live(struct atap_timer *t)
{
    return ld_relaxed(&t->state) == (t->eseq | ARMED);
}

/* Re-files every record of one slot relative to cur (which has reached it). */
static void cascade(struct atap_timers *ts, unsigned i, struct batch *b)
{
    struct atap_tlink *h = &ts->slot[i], *l = h->next, *next;

    h->prev->next = NULL;
    list_init(h);
    bit_clear(ts, i);
    for (; l; l = next) {
        struct atap_timer *t = rec_of(l);
        next = l->next;
        t->link.next = t->link.prev = NULL;
        ts->held--;
        if (entry_live(t))
            file_rec(ts, t, b);
    }
}

/* Moves cur to now's tick, cascading every slot reached on the way. */
static void advance(struct atap_timers *ts, uint64_t now_tick)
{
    struct batch b = {NULL, 0};
    unsigned level, j;
    uint64_t tick;

    (void)level;
    while (next_event(ts, &level, &j, &tick) && tick <= now_tick) {
        ts->cur = tick;
        cascade(ts, j, &b);
    }
    if (now_tick > ts->cur)
        ts->cur = now_tick;
    merge_batch(ts, &b);
}

/* Moves the next level-0 slot into near early when it is due within
 * PRELOAD_TICKS: its cascade and sort happen now, while the manager would
 * sleep, and the run at its deadline only fires. This takes cur past now's
 * tick (by at most PRELOAD_TICKS), which changes nothing else: near holds
 * what is due by cur's tick, the levels what comes after. */
static void preload(struct atap_timers *ts, uint64_t now_tick)
{
    unsigned level, j;
    uint64_t tick;

    if (next_event(ts, &level, &j, &tick) && level == 0 && tick <= now_tick + PRELOAD_TICKS)
        advance(ts, tick);
}

static void fire_due(struct atap_timers *ts, uint64_t now)
{
    while (!list_empty(&ts->near)) {
        struct atap_timer *t = rec_of(ts->near.next);
        uint32_t armed = t->eseq | ARMED;

        if (t->when > now)
            return;
        unlink_rec(ts, t);
        /* Strong: a spurious failure would lose the fire. acq_rel: acquire
         * sees what the armer wrote before arming; release lets a losing
         * disarm (acquire) see everything before the fire. */
        if (atomic_compare_exchange_strong_explicit(&t->state, &armed, t->eseq,
                                                    memory_order_acq_rel, memory_order_relaxed))
            t->fire(t);
    }
}

static uint64_t next_deadline(struct atap_timers *ts)
{
    uint64_t next = list_empty(&ts->near) ? UINT64_MAX : rec_of(ts->near.next)->when;
    unsigned level, j;
    uint64_t tick, at;

    if (next_event(ts, &level, &j, &tick)) {
        at = level == 0 ? ts->min0[j] : tick << TIMER_TICK_SHIFT;
        if (at < next)
            next = at;
    }
    return next;
}

/* Publishes the next deadline, then absorbs whatever was armed meanwhile
 * (the lost-wake handshake, top of file). */
static uint64_t settle(struct atap_timers *ts)
{
    for (int round = 0;; round++) {
        uint64_t next = next_deadline(ts);

        st_seqcst(&ts->next_wake, next);
        if (ld_seqcst(&ts->inbox) == NULL)
            return next;
        if (round == SETTLE_ROUNDS) {
            /* Arms keep coming: stay "awake" and have the caller run again
             * at once rather than spin here. */
            st_seqcst(&ts->next_wake, 0);
            return 0;
        }
        absorb(ts);
    }
}

/* ---- the interface -------------------------------------------------------------- */

void atap__timer_init(struct atap_timer *t, void (*fire)(struct atap_timer *t))
{
    atomic_init(&t->state, 0);
    atomic_init(&t->deadline, 0);
    t->eseq = 0;
    t->when = 0;
    t->qnext = NULL;
    t->link.next = t->link.prev = NULL;
    t->fire = fire;
}

void atap__timers_init(struct atap_timers *ts, uint64_t now_ns)
{
    atomic_init(&ts->inbox, NULL);
    atomic_init(&ts->next_wake, UINT64_MAX);
    ts->cur = now_ns >> TIMER_TICK_SHIFT;
    ts->held = 0;
    list_init(&ts->near);
    for (unsigned i = 0; i < TIMER_NSLOTS; i++)
        list_init(&ts->slot[i]);
    for (unsigned w = 0; w < TIMER_NSLOTS / 64; w++)
        ts->occupied[w] = 0;
    for (unsigned i = 0; i < TIMER_L0_SLOTS; i++)
        ts->min0[i] = UINT64_MAX;
}

bool atap__timer_arm(struct atap_timers *ts, struct atap_timer *t, uint64_t deadline_ns)
{
    uint32_t s = ld_acquire(&t->state);
    uint64_t wake;

    /* Supersede an armed arming first, so the deadline store below never
     * lands while an entry could still fire with it. */
    while ((s & ARMED) && !cas_acqrel(&t->state, &s, s & ~ARMED))
        ;
    s &= ~ARMED;
    /* release: whoever reads this deadline with acquire sees ARMED cleared. */
    st_release(&t->deadline, deadline_ns);
    /* acq_rel: release publishes the deadline to the manager's fetch_and;
     * acquire orders our qnext write (in push) after the manager's read of
     * it when we find the QUEUED bit it cleared. Only the manager's clearing
     * of QUEUED or a (no-op) disarm can change s meanwhile. */
    while (!cas_acqrel(&t->state, &s, ((s & SEQ_MASK) + SEQ_ONE) | QUEUED | ARMED))
        ;
    if (!(s & QUEUED))
        push(ts, t);
    /* seq_cst: the read side of the lost-wake handshake (top of file). */
    wake = ld_seqcst(&ts->next_wake);
    while (deadline_ns < wake)
        if (atomic_compare_exchange_weak_explicit(&ts->next_wake, &wake, deadline_ns,
                                                  memory_order_seq_cst, memory_order_seq_cst))
            return true;
    return false;
}

bool atap__timer_disarm(struct atap_timers *ts, struct atap_timer *t)
{
    /* acquire, also on the way out: a false answer comes after the fire
     * (or the take) that won, and so after what it wrote. */
    uint32_t s = ld_acquire(&t->state);

    (void)ts;
    while (s & ARMED)
        if (cas_acqrel(&t->state, &s, s & ~ARMED))
            return true;
    return false;
}

uint64_t atap__timers_run(struct atap_timers *ts, uint64_t now_ns)
{
    /* Awake: arms from now on need not wake us; settle() looks again. */
    st_seqcst(&ts->next_wake, 0);
    absorb(ts);
    advance(ts, now_ns >> TIMER_TICK_SHIFT);
    fire_due(ts, now_ns);
    preload(ts, now_ns >> TIMER_TICK_SHIFT);
    return settle(ts);
}

size_t atap__timers_pending(struct atap_timers *ts) { return ts->held; }

bool atap__timer_held(struct atap_timer *t)
{
    return t->link.next != NULL || (ld_acquire(&t->state) & QUEUED);
}

/* Moves list h (if not empty) onto the front of *chain, linked through
 * link.next, and leaves h empty. */
static void splice_chain(struct atap_tlink *h, struct atap_tlink **chain)
{
    if (list_empty(h))
        return;
    h->prev->next = *chain;
    *chain = h->next;
    list_init(h);
}

/* Unlinks every filed record into one chain through link.next; the wheel is
 * left empty. */
static struct atap_tlink *collect(struct atap_timers *ts)
{
    struct atap_tlink *chain = NULL;

    splice_chain(&ts->near, &chain);
    for (unsigned i = 0; i < TIMER_NSLOTS; i++)
        splice_chain(&ts->slot[i], &chain);
    for (unsigned w = 0; w < TIMER_NSLOTS / 64; w++)
        ts->occupied[w] = 0;
    ts->held = 0;
    return chain;
}

void atap__timers_take_all(struct atap_timers *ts, void (*each)(struct atap_timer *, void *),
                           void *arg)
{
    struct atap_tlink *l, *next;

    absorb(ts);
    for (l = collect(ts); l; l = next) {
        struct atap_timer *t = rec_of(l);
        uint32_t armed = t->eseq | ARMED;

        next = l->next;
        t->link.next = t->link.prev = NULL;
        /* Claimed like a fire (fire_due says why the CAS is strong, acq_rel). */
        if (atomic_compare_exchange_strong_explicit(&t->state, &armed, t->eseq,
                                                    memory_order_acq_rel, memory_order_relaxed))
            each(t, arg);
    }
}

void atap__timers_destroy(struct atap_timers *ts)
{
    struct atap_timer *t = atomic_exchange_explicit(&ts->inbox, NULL, memory_order_acquire);
    struct atap_tlink *l, *next;

    while (t) { /* no arm runs: the inbox is ours */
        struct atap_timer *qnext = t->qnext;
        atomic_fetch_and_explicit(&t->state, ~QUEUED, memory_order_acq_rel);
        t = qnext;
    }
    for (l = collect(ts); l; l = next) {
        next = l->next;
        l->next = l->prev = NULL;
    }
    st_seqcst(&ts->next_wake, UINT64_MAX);
}

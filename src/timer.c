/*
 * The manager's timers: an MPSC inbox in front of a timing wheel that only
 * the manager thread touches.
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
 * and the manager reads the new deadline when it drains it). Disarm: one CAS
 * clearing ARMED; the manager drops the stale entry when it meets it, or,
 * when the record's owner is going (atap__timer_forget), at its next run:
 * forget sets QUEUED on a record neither armed nor queued and pushes it,
 * and the drain unlinks it and, finding no ARMED, files nothing.
 *
 * The wheel (manager only), in ticks of 2^16 ns. A record is in at most one
 * place (`link.next == NULL`: none), filed by its deadline's tick:
 *   near     tick <= cur, sorted by deadline;
 *   ring     cur < tick < cur + RING, slot tick % RING (one tick a slot);
 *   levels   tick > lead, at the level of the highest 6-bit group in which
 *            it differs from lead, in the slot of its digit there (above
 *            lead's digit), so every event at level l comes before every
 *            event at level l + 1;
 *   pending  a level slot that lead has reached, being re-filed.
 * `cur` follows now (and runs at most PRELOAD_TICKS ahead of it, when the
 * next ring slot is sorted into near early); cur <= lead < cur + RING, and
 * each run moves lead up to TIMER_LEAD ticks ahead of cur, cascading the
 * levels a budget of records at a time (re-filing a record moves it to the
 * ring or a lower level), so no cascade holds up a fire. A disarmed record
 * is dropped where the manager meets it: the inbox, its ring slot, a
 * cascade, near. Before a run fires, every event up to now's tick has been
 * taken in (the ring's and the levels', however far behind), so a record
 * with deadline <= now is in near. A record fires only from near's head,
 * only when its deadline <= now, and only through the CAS: never early,
 * and in deadline order, at the first run after it was absorbed with
 * now >= its deadline, or, when that run's budget of fires ran out first
 * (FIRE_BUDGET), at the runs right after, which it asks for at once.
 *
 * The sleep: run returns the exact earliest deadline (near's head, or the
 * next ring slot's `ring_min`, exact unless a record left it, then early),
 * or half a preload before a big ring slot (to sort it into near before it
 * is due), or when the next level slot comes within TIMER_LEAD of cur, or a
 * time already past while cascading work remains. It publishes that in
 * next_wake; arm lowers next_wake by CAS when its deadline is earlier and
 * then returns true, so its caller wakes the manager.
 *
 * A new manager's rebuild (atap__timers_rebuild, on the supervisor while no
 * manager runs): everything filed is let go of, then each record found from
 * the task table is filed again if its state is ARMED without QUEUED (taken
 * in, neither fired nor disarmed), with eseq and deadline read as a drain
 * reads them; QUEUED ones are the inbox's. So the rebuilt wheel holds the
 * same armings the table shows, and an arm or disarm racing the rebuild is
 * met exactly as one racing a drain.
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
#define RING_MASK (TIMER_RING - 1u)
#define LEVEL_SLOTS (1u << TIMER_LEVEL_BITS)
#define SETTLE_ROUNDS 8     /* absorbs after publishing before run gives up */
#define PRELOAD_TICKS 16    /* ~1 ms: how soon a ring slot is moved to near early */
#define LEAD_BUDGET 1024    /* records a run re-files from the levels, ~0.1 ms */
#define FIRE_CHUNK 32       /* due records cut off near at a time */
#define FIRE_BUDGET 16384   /* fires a run makes at most (~50 ms), then it returns */
#define PRELOAD_WAKE_MIN 64 /* records in a ring slot worth a wake to preload it */

_Static_assert(TIMER_TICK_SHIFT + TIMER_LEVEL_BITS * TIMER_LEVELS >= 64,
               "the levels cover every uint64_t deadline");
_Static_assert(TIMER_RING % 64 == 0 && TIMER_LEAD + PRELOAD_TICKS < TIMER_RING,
               "the ring holds whole bitmap words and reaches past lead");

static inline struct atap_timer *rec_of(struct atap_tlink *l)
{
    return (struct atap_timer *)((char *)l - offsetof(struct atap_timer, link));
}

static inline uint64_t tick_of(uint64_t ns) { return ns >> TIMER_TICK_SHIFT; }

/* ---- lists and bitmaps (manager only) ------------------------------------ */

/* A list head is empty linked to itself, or all zero: the ring's and the
 * levels' heads start zero (the runtime's timers are a static), so that
 * the pages of heads never used are never touched (64 KiB of the
 * process's start). A head is linked to itself when first filled. */
static inline void list_init(struct atap_tlink *h) { h->next = h->prev = h; }

static inline bool list_empty(const struct atap_tlink *h) { return h->next == h || !h->next; }

static inline void list_insert_before(struct atap_tlink *pos, struct atap_tlink *l)
{
    if (!pos->next)
        list_init(pos); /* a zero head, first filled */
    l->next = pos;
    l->prev = pos->prev;
    pos->prev->next = l;
    pos->prev = l;
}

/* Moves every link of list `from` to the end of list `to`. */
static void list_splice(struct atap_tlink *to, struct atap_tlink *from)
{
    if (list_empty(from))
        return;
    if (!to->next)
        list_init(to);
    from->next->prev = to->prev;
    to->prev->next = from->next;
    from->prev->next = to;
    to->prev = from->prev;
    list_init(from);
}

static void unlink_rec(struct atap_timers *ts, struct atap_timer *t)
{
    t->link.prev->next = t->link.next;
    t->link.next->prev = t->link.prev;
    t->link.next = t->link.prev = NULL;
    ts->held--;
}

static inline void bit_set(uint64_t *w, unsigned i) { w[i / 64] |= UINT64_C(1) << (i % 64); }

static inline void bit_clear(uint64_t *w, unsigned i) { w[i / 64] &= ~(UINT64_C(1) << (i % 64)); }

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

/* Whether the entry still stands for the record's latest arming. A stale
 * answer costs only a later look: the fire CAS decides. */
static inline bool entry_live(struct atap_timer *t)
{
    return ld_relaxed(&t->state) == (t->eseq | ARMED);
}

/* ---- filing (manager only) ----------------------------------------------- */

/* A batch: records bound for near, chained through link.next (NULL ends);
 * it lives within one call, and is merged into near before the call ends. */
struct batch {
    struct atap_tlink *head;
    size_t n;
    uint64_t lo, hi; /* the least and the greatest deadline in it */
};

static inline struct batch batch_new(void) { return (struct batch){NULL, 0, UINT64_MAX, 0}; }

static void batch_add(struct batch *b, struct atap_timer *t)
{
    t->link.next = b->head;
    t->link.prev = NULL;
    b->head = &t->link;
    b->n++;
    b->lo = t->when < b->lo ? t->when : b->lo;
    b->hi = t->when > b->hi ? t->when : b->hi;
}

static void file_rec(struct atap_timers *ts, struct atap_timer *t, struct batch *b)
{
    uint64_t tick = tick_of(t->when);
    unsigned l, j;

    ts->held++;
    if (tick <= ts->cur) {
        batch_add(b, t);
    } else if (tick - ts->cur < TIMER_RING) {
        j = (unsigned)tick & RING_MASK;
        if (list_empty(&ts->ring[j])) {
            ts->ring_min[j] = t->when;
            ts->ring_n[j] = 0;
        }
        ts->ring_min[j] = t->when < ts->ring_min[j] ? t->when : ts->ring_min[j];
        ts->ring_n[j]++;
        list_insert_before(&ts->ring[j], &t->link);
        bit_set(ts->ring_bits, j);
    } else if (tick > ts->lead) { /* always: lead < cur + RING */
        l = (unsigned)(63 - __builtin_clzll(tick ^ ts->lead)) / TIMER_LEVEL_BITS;
        j = (unsigned)(tick >> (l * TIMER_LEVEL_BITS)) & (LEVEL_SLOTS - 1);
        list_insert_before(&ts->level[l][j], &t->link);
        ts->level_bits[l] |= UINT64_C(1) << j;
    } else {
        batch_add(b, t); /* unreachable; near would take it (it only costs) */
    }
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

/* One stable pass of a radix sort: by the 8 bits of the deadline at shift. */
static struct atap_tlink *radix_pass(struct atap_tlink *l, unsigned shift)
{
    struct atap_tlink *head[256], **tail[256], *out = NULL, **end = &out;

    for (unsigned d = 0; d < 256; d++)
        tail[d] = &head[d];
    for (; l; l = l->next) {
        unsigned d = (unsigned)(rec_of(l)->when >> shift) & 255;
        *tail[d] = l;
        tail[d] = &l->next;
    }
    for (unsigned d = 0; d < 256; d++) {
        if (tail[d] != &head[d]) { /* then head[d] was written through tail[d] */
            // cppcheck-suppress uninitvar
            *end = head[d];
            end = tail[d];
        }
    }
    *end = NULL;
    return out;
}

/* Sorts a batch by deadline. A big one by radix over only the bits in which
 * its deadlines differ: 16, two passes, for a ring slot's (one tick). */
static struct atap_tlink *sort_batch(struct batch *b)
{
    struct atap_tlink *l = b->head;
    unsigned bits;

    if (b->n < 64)
        return sort_run(&l, b->n);
    bits = b->lo == b->hi ? 0 : 64u - (unsigned)__builtin_clzll(b->lo ^ b->hi);
    for (unsigned shift = 0; shift < bits; shift += 8)
        l = radix_pass(l, shift);
    return l;
}

/* Sorts the batch and merges it into near, which stays sorted. Near holds
 * about one tick of records, so the walk is short. */
static void merge_batch(struct atap_timers *ts, struct batch *b)
{
    struct atap_tlink *l, *next, *pos = ts->near.next;

    if (b->n == 0)
        return;
    for (l = sort_batch(b); l; l = next) {
        next = l->next;
        while (pos != &ts->near && rec_of(pos)->when <= rec_of(l)->when)
            pos = pos->next;
        list_insert_before(pos, l);
    }
    *b = batch_new();
}

/* ---- the inbox ------------------------------------------------------------ */

static void push(struct atap_timers *ts, struct atap_timer *t)
{
    struct atap_timer *head = ld_relaxed(&ts->inbox);

    /* seq_cst: the push comes before this arm's read of next_wake in the
     * single order the lost-wake handshake relies on (top of file). */
    do
        t->qnext = head;
    while (!casw_seqcst(&ts->inbox, &head, t));
}

/* Takes one record off the inbox: the QUEUED bit goes, the entry (if any) is
 * re-filed for its latest arming, or dropped when that was disarmed. */
static void absorb_rec(struct atap_timers *ts, struct atap_timer *t, struct batch *b)
{
    /* acq_rel: acquire pairs with the arm's release CAS (its deadline and the
     * record's contents); release orders our read of qnext before the next
     * push of this record, which can only follow this clear. */
    uint32_t s = and_acqrel(&t->state, ~QUEUED);

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

/* Drains the inbox into the wheel. */
static void absorb(struct atap_timers *ts)
{
    struct batch b = batch_new();
    /* acquire: pairs with the pushers' CAS, so each record's qnext, state and
     * deadline are visible. */
    struct atap_timer *t = xchg_acquire(&ts->inbox, NULL);

    while (t) {
        struct atap_timer *next = t->qnext; /* before QUEUED goes: then it may be pushed again */
        absorb_rec(ts, t, &b);
        t = next;
    }
    merge_batch(ts, &b);
}

/* ---- the ring ------------------------------------------------------------------ */

/* The first occupied ring slot after cur's, and its tick. Clears the bits of
 * slots found empty. */
static bool ring_next(struct atap_timers *ts, unsigned *slot, uint64_t *tick)
{
    unsigned here = (unsigned)ts->cur & RING_MASK;

    for (int pass = 0; pass < 2; pass++) {
        unsigned to = pass ? here : TIMER_RING;
        unsigned i = bit_next(ts->ring_bits, pass ? 0 : here + 1, to);

        for (; i < to; i = bit_next(ts->ring_bits, i + 1, to)) {
            if (list_empty(&ts->ring[i])) {
                bit_clear(ts->ring_bits, i);
                continue;
            }
            *slot = i;
            *tick = ts->cur + ((i - here) & RING_MASK);
            return true;
        }
    }
    return false;
}

/* Moves cur to `to`, taking every ring slot passed on the way into near. */
static void ring_advance(struct atap_timers *ts, uint64_t to)
{
    struct batch b = batch_new();
    unsigned j;
    uint64_t tick;

    while (ring_next(ts, &j, &tick) && tick <= to) {
        struct atap_tlink *h = &ts->ring[j], *l = h->next, *next;

        h->prev->next = NULL;
        list_init(h);
        bit_clear(ts->ring_bits, j);
        for (; l; l = next) {
            next = l->next;
            if (next)
                __builtin_prefetch(rec_of(next), 1);
            if (entry_live(rec_of(l))) {
                batch_add(&b, rec_of(l));
            } else {
                l->next = l->prev = NULL;
                ts->held--;
            }
        }
    }
    if (to > ts->cur)
        ts->cur = to;
    merge_batch(ts, &b);
}

/* ---- the levels ------------------------------------------------------------------ */

/* The next level slot lead will reach: the lowest occupied slot above lead's
 * digit in the lowest level that has one, and the tick it starts at. */
static bool level_next(struct atap_timers *ts, unsigned *level, unsigned *slot, uint64_t *tick)
{
    for (unsigned l = 0; l < TIMER_LEVELS; l++) {
        unsigned shift = l * TIMER_LEVEL_BITS, top = shift + TIMER_LEVEL_BITS;
        unsigned digit = (unsigned)(ts->lead >> shift) & (LEVEL_SLOTS - 1);
        uint64_t bits = ts->level_bits[l] & (~UINT64_C(1) << digit);

        for (; bits; bits &= bits - 1) {
            unsigned j = (unsigned)__builtin_ctzll(bits);
            if (list_empty(&ts->level[l][j])) {
                ts->level_bits[l] &= ~(UINT64_C(1) << j);
                continue;
            }
            *level = l;
            *slot = j;
            *tick = ts->lead >> top << top | (uint64_t)j << shift;
            return true;
        }
    }
    return false;
}

/* Re-files up to `budget` records of pending; returns what is left of it. */
static size_t refile_pending(struct atap_timers *ts, size_t budget, struct batch *b)
{
    while (budget > 0 && !list_empty(&ts->pending)) {
        struct atap_timer *t = rec_of(ts->pending.next);

        unlink_rec(ts, t);
        if (entry_live(t))
            file_rec(ts, t, b);
        budget--;
    }
    return budget;
}

/* Cascades the levels until everything up to `target` is in the ring or
 * near, re-filing at most `budget` records. True when that is done. Pending
 * records all come at or after lead, so they wait while lead > target. */
static bool lead_to(struct atap_timers *ts, uint64_t target, size_t budget)
{
    struct batch b = batch_new();
    unsigned l, j;
    uint64_t tick;
    bool done = true;

    for (;;) {
        if (!list_empty(&ts->pending)) {
            if (ts->lead > target)
                break;
            budget = refile_pending(ts, budget, &b);
            if (!list_empty(&ts->pending)) {
                done = false; /* out of budget */
                break;
            }
        }
        if (!level_next(ts, &l, &j, &tick) || tick > target) {
            if (target > ts->lead)
                ts->lead = target; /* no slot in between: nothing to re-file */
            break;
        }
        ts->lead = tick;
        list_splice(&ts->pending, &ts->level[l][j]);
        ts->level_bits[l] &= ~(UINT64_C(1) << j);
    }
    merge_batch(ts, &b);
    return done;
}

/* ---- firing --------------------------------------------------------------------- */

/* Brings cur (and lead, whatever that costs) to `tick`: after it, every
 * record with a tick <= `tick` is in near. */
static void catch_up(struct atap_timers *ts, uint64_t tick)
{
    ring_advance(ts, tick);
    (void)lead_to(ts, ts->cur, SIZE_MAX);
}

/* Moves the ring slots due within PRELOAD_TICKS into near early: their
 * walk and sort happen now, while the manager would sleep, and the run at
 * their deadline only fires. */
static void preload(struct atap_timers *ts, uint64_t now_tick)
{
    unsigned j;
    uint64_t tick;

    while (ring_next(ts, &j, &tick) && tick <= now_tick + PRELOAD_TICKS)
        catch_up(ts, tick);
}

/* Cuts off up to FIRE_CHUNK due records from near's head; returns them
 * chained through link.next (NULL: none due). */
static struct atap_tlink *take_due(struct atap_timers *ts, uint64_t now)
{
    struct atap_tlink *first = ts->near.next, *l = first;

    for (int n = 0; n < FIRE_CHUNK && l != &ts->near && rec_of(l)->when <= now; n++) {
        l = l->next;
        ts->held--;
    }
    if (l == first)
        return NULL;
    l->prev->next = NULL;
    ts->near.next = l;
    l->prev = &ts->near;
    return first;
}

/* Fires near's due records, a chunk at a time: a chunk is cut off whole
 * first, so firing one record writes to no other (the callbacks only reach
 * the inbox and state words), and the first fires do not wait for the walk
 * over all the others. FIRE_BUDGET at most: a burst (a million delays due
 * at once after a restart) is fired over several runs, each returning a
 * time already past, so the manager's other work (fd events, parks, the
 * pool's tick) goes on between them. */
static void fire_due(struct atap_timers *ts, uint64_t now)
{
    struct atap_tlink *l, *next;
    size_t fired = 0;

    while (fired < FIRE_BUDGET && (l = take_due(ts, now)) != NULL) {
        for (; l; l = next) {
            struct atap_timer *t = rec_of(l);
            uint32_t armed = t->eseq | ARMED;

            next = l->next;
            l->next = l->prev = NULL;
            /* Strong: a spurious failure would lose the fire. acq_rel:
             * acquire sees what the armer wrote before arming; release lets
             * a losing disarm (acquire) see everything before the fire. */
            if (cas_acqrel(&t->state, &armed, t->eseq))
                t->fire(t);
            fired++;
        }
    }
}

static uint64_t next_deadline(struct atap_timers *ts, uint64_t now, bool lead_done)
{
    uint64_t next = list_empty(&ts->near) ? UINT64_MAX : rec_of(ts->near.next)->when;
    unsigned l, j;
    uint64_t tick;

    if (ring_next(ts, &j, &tick)) {
        uint64_t at = ts->ring_min[j];
        /* A big slot (its count is an upper bound) is preloaded on a wake of
         * its own half a preload ahead: later, its walk would delay its fires. */
        if (ts->ring_n[j] >= PRELOAD_WAKE_MIN)
            at = (tick - PRELOAD_TICKS / 2) << TIMER_TICK_SHIFT;
        next = at < next ? at : next;
    }
    if (!lead_done)
        return next < now ? next : now; /* cascading is not done: at once */
    if (level_next(ts, &l, &j, &tick)) {
        /* tick > LEAD: lead_to left no slot up to cur + LEAD */
        tick = (tick - TIMER_LEAD) << TIMER_TICK_SHIFT;
        if (tick < next)
            next = tick;
    }
    return next;
}

/* Publishes the next deadline, then absorbs whatever was armed meanwhile
 * (the lost-wake handshake, top of file). */
static uint64_t settle(struct atap_timers *ts, uint64_t now, bool lead_done)
{
    for (int round = 0;; round++) {
        uint64_t next = next_deadline(ts, now, lead_done);

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
    ts->cur = ts->lead = tick_of(now_ns);
    ts->held = 0;
    list_init(&ts->near);
    list_init(&ts->pending);
    /* Heads used before are emptied; zero ones are left alone (see the
     * lists' top). A ring slot's ring_min and ring_n are set as it is
     * first filled, and read only while its bit is set. */
    for (unsigned i = 0; i < TIMER_RING; i++)
        if (ts->ring[i].next)
            list_init(&ts->ring[i]);
    for (unsigned i = 0; i < TIMER_RING / 64; i++)
        ts->ring_bits[i] = 0;
    for (unsigned l = 0; l < TIMER_LEVELS; l++) {
        for (unsigned j = 0; j < LEVEL_SLOTS; j++)
            if (ts->level[l][j].next)
                list_init(&ts->level[l][j]);
        ts->level_bits[l] = 0;
    }
}

bool atap__timer_arm(struct atap_timers *ts, struct atap_timer *t, uint64_t deadline_ns)
{
    uint32_t s = ld_acquire(&t->state);
    uint64_t wake;

    /* Supersede an armed arming first, so the deadline store below never
     * lands while an entry could still fire with it. */
    while ((s & ARMED) && !casw_acqrel(&t->state, &s, s & ~ARMED))
        ;
    s &= ~ARMED;
    /* release: whoever reads this deadline with acquire sees ARMED cleared. */
    st_release(&t->deadline, deadline_ns);
    /* acq_rel: release publishes the deadline to the manager's fetch_and;
     * acquire orders our qnext write (in push) after the manager's read of
     * it when we find the QUEUED bit it cleared. Only the manager's clearing
     * of QUEUED or a (no-op) disarm can change s meanwhile. */
    while (!casw_acqrel(&t->state, &s, ((s & SEQ_MASK) + SEQ_ONE) | QUEUED | ARMED))
        ;
    if (!(s & QUEUED))
        push(ts, t);
    /* seq_cst: the read side of the lost-wake handshake (top of file). */
    wake = ld_seqcst(&ts->next_wake);
    while (deadline_ns < wake)
        if (casw_seqcst(&ts->next_wake, &wake, deadline_ns))
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
        if (casw_acqrel(&t->state, &s, s & ~ARMED))
            return true;
    return false;
}

uint64_t atap__timers_run(struct atap_timers *ts, uint64_t now_ns)
{
    uint64_t now_tick = tick_of(now_ns);
    bool lead_done;

    /* Awake: arms from now on need not wake us; settle() looks again. */
    st_seqcst(&ts->next_wake, 0);
    absorb(ts);
    catch_up(ts, now_tick);
    fire_due(ts, now_ns);
    lead_done = lead_to(ts, ts->cur + TIMER_LEAD, LEAD_BUDGET);
    preload(ts, now_tick);
    return settle(ts, now_ns, lead_done);
}

size_t atap__timers_pending(struct atap_timers *ts) { return ts->held; }

void atap__timer_forget(struct atap_timers *ts, struct atap_timer *t)
{
    uint32_t s = ld_acquire(&t->state);

    /* Never armed (seq 0): never filed. Armed: not ours to drop. QUEUED:
     * the inbox has it, and absorb_rec unlinks it. Otherwise QUEUED by CAS
     * (acq_rel, as arm's) and pushed: absorb_rec then unlinks it, and
     * seeing no ARMED files nothing. No wake: the next run is soon enough. */
    do {
        if ((s & SEQ_MASK) == 0 || (s & (ARMED | QUEUED)))
            return;
    } while (!casw_acqrel(&t->state, &s, s | QUEUED));
    push(ts, t);
}

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
    splice_chain(&ts->pending, &chain);
    for (unsigned i = 0; i < TIMER_RING; i++)
        splice_chain(&ts->ring[i], &chain);
    for (unsigned i = 0; i < TIMER_RING / 64; i++)
        ts->ring_bits[i] = 0;
    for (unsigned l = 0; l < TIMER_LEVELS; l++) {
        for (unsigned j = 0; j < LEVEL_SLOTS; j++)
            splice_chain(&ts->level[l][j], &chain);
        ts->level_bits[l] = 0;
    }
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
        if (cas_acqrel(&t->state, &armed, t->eseq))
            each(t, arg);
    }
}

/* ---- a new manager's rebuild ---------------------------------------------- */

struct rebuild {
    struct atap_timers *ts;
    struct batch b;
    size_t refiled;
};

/* A record found from the task table: filed again for its latest arming if
 * the structure had taken that in (ARMED without QUEUED: absorbed, and
 * neither fired nor disarmed since). A QUEUED one comes in through the inbox
 * as ever. The reads are absorb_rec's, so an arm or a disarm racing this is
 * met as one racing a drain: the entry filed here is stale, the arm's push
 * re-files the record, and no fire's CAS accepts a stale entry. */
static void refile(struct atap_timer *t, void *cookie)
{
    struct rebuild *r = cookie;
    uint32_t s = ld_acquire(&t->state); /* pairs with the arm's release CAS */

    if ((s & (ARMED | QUEUED)) != ARMED)
        return;
    t->eseq = s & SEQ_MASK;
    t->when = ld_acquire(&t->deadline);
    file_rec(r->ts, t, &r->b);
    r->refiled++;
}

size_t atap__timers_rebuild(struct atap_timers *ts, atap__timer_find *find, void *arg)
{
    struct rebuild r = {ts, batch_new(), 0};
    struct atap_tlink *l, *next;

    for (l = collect(ts); l; l = next) { /* what the last manager had filed */
        next = l->next;
        l->next = l->prev = NULL;
    }
    find(refile, &r, arg);
    merge_batch(ts, &r.b);
    st_seqcst(&ts->next_wake, 0); /* awake: the next run publishes its sleep */
    return r.refiled;
}

void atap__timers_destroy(struct atap_timers *ts)
{
    struct atap_timer *t = xchg_acquire(&ts->inbox, NULL);
    struct atap_tlink *l, *next;

    while (t) { /* no arm runs: the inbox is ours */
        struct atap_timer *qnext = t->qnext;
        and_acqrel(&t->state, ~QUEUED);
        t = qnext;
    }
    for (l = collect(ts); l; l = next) {
        next = l->next;
        l->next = l->prev = NULL;
    }
    st_seqcst(&ts->next_wake, UINT64_MAX);
}

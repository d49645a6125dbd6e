/*
 * The park wheel (deadline parks in the slot itself, with no park record).
 * park.c owns the parks and their claims, which a park in the slot keeps in
 * its tail's claim word (atap__park_tclaim, park_fd.c); this file owns such
 * a park from its push to its end, and keeps that, whoever claims it, only
 * the wheel's holder (the manager, or a parker the closed wheel turned
 * away) queues its task again or ends its run (atap__park_tail_act).
 *
 * Deadline parks in the slot itself. A park on a deadline, in a task whose
 * output leaves the slot's park tail free (slot.h), costs no memory beyond
 * the slot: its claim word and its deadline's tick sit in the tail, and the park wheel
 * below links it through the tail's wnext / wprev. The wheel owns such a
 * park, and its RUN reference, until the manager meets it: at its deadline
 * (or a shutdown), the manager claims it, or finds it claimed by a cancel or
 * a timeout, and only then queues the task again or ends its run. A stop
 * that claims one marks its bucket (stop_bits), which the manager's next run
 * goes through, so a cancelled park's slot goes at once too. It is ARMED
 * before it is pushed, and the push is the parker's last touch of the slot;
 * one whose deadline the manager's clock has passed already is pushed
 * nowhere, and its parker acts on it (atap__park_tail_arm).
 * Arms push on an MPSC stack of slot indices (CAS on `inbox`); the manager
 * takes the stack and files each slot in a bucket of a hashed wheel of
 * ticks. An arm wakes the manager only if it would sleep past the arm's
 * due time (look_at, below): a burst of far arms waits for its next look.
 * A close swaps a CLOSED mark into the inbox, so a later arm knows to end
 * its run itself. A park on an fd with a deadline is on both its fd's list
 * and the wheel (park_fd.c's tail_timed_arm says how the two meet). A
 * delayed start that its slot can keep (spawn.c) waits here the same way
 * before its first run, PENDING (atap__park_delay).
 *
 * The wheel's seat. "The manager" above is whoever holds the seat: the
 * wheel (its buckets, its ticks, its batch of resumes) is one thread's at a
 * time, handed over by the seat (a CAS that acquires, a store that
 * releases). The manager takes it while awake and gives it back before it
 * sleeps; a busy worker between runs takes it when the wheel's next due
 * tick is past (`due_at`, which each run publishes), so timers fire on time
 * while the manager waits for a CPU that running workers hold. One that
 * finds the seat taken does not wait: a worker goes on, the manager marks
 * it wanted and goes on without the wheel; the holder, giving it back, sees
 * the mark and wakes the manager, so an arm or a stop that woke the manager
 * while a worker held the seat is still met (see wheel_give). A close takes
 * the seat for good (SEAT_CLOSED) once a worker's run is over.
 */
#include "park.h"
#include "park_int.h"

#include <sched.h>
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "extras.h"
#include "faults.h"
#include "hub.h"
#include "pool.h"
#include "slot.h"
#include "table.h"
#include "wait.h"

/* ---- the park wheel (deadline-only parks in the slot) ------------------------ */

#define WHEEL_TICK_SHIFT 16 /* 65.5 us */
#define WHEEL_BITS 16       /* 65536 buckets: 4.3 s a round */
#define WHEEL_N (1u << WHEEL_BITS)
#define WORDS (WHEEL_N / 64)
#define INBOX_CLOSED UINT32_MAX

static _Atomic uint32_t inbox; /* slot index + 1 of the newest arm, 0, or CLOSED */
#define SEAT_FREE 0u
#define SEAT_HELD 1u
#define SEAT_CLOSED 2u
static _Atomic uint32_t seat = SEAT_CLOSED; /* open from the manager's start */
static _Atomic bool seat_wanted;            /* the manager found it held */
static _Thread_local bool seat_mine;        /* this thread holds it */
/* The wheel's next due tick's end, as its last run found it (FOREVER:
 * none, or closed): a worker past it takes the seat. A hint, relaxed: an
 * arm since then wakes the manager, which runs the wheel. */
static _Atomic uint64_t due_at = ATAP__FOREVER;
/* Buckets holding a park a stop claimed (a bit each), and whether any is
 * set: the manager visits them at its next run, so a cancelled park's slot
 * goes at once rather than at its deadline. */
static _Atomic uint64_t stop_bits[WORDS];
static _Atomic bool stops_pending;
static struct {             /* the manager's (or, closing, its stopper's) */
    uint32_t head[WHEEL_N]; /* slot index + 1, linked through wnext / wprev */
    /* Buckets in use, a bit each, and words of those in use, a bit each:
     * the search for the next one reads a few words, not a thousand. */
    uint64_t bits[WORDS];
    uint64_t words[WORDS / 64];
    uint64_t done; /* every tick up to this one has been gone through */
    bool started;
} wheel;

/* When the manager next runs the wheel at the latest, as it said going to
 * sleep (0: it is awake, and looks at the inbox before it sleeps again). An
 * arm due no earlier than that wakes nobody: the manager files it then.
 * Before, every arm that found the inbox empty woke it, and a burst of
 * arms kept it waking every few dozen microseconds, each wake a switch on
 * a CPU the pool wanted (bench/README.md, timers).
 *
 * The rule, a Dekker pair: an arm pushes, then reads look_at (both
 * seq_cst); the manager, holding the seat, stores look_at, then reads the
 * inbox (both seq_cst), and takes in what it finds before it sleeps
 * (atap__park_wheel_sleep). Either it finds the arm, or the arm reads the
 * time it stored, and wakes it if that is too late. Without the seat it
 * needs no look: it asked for it, and the holder's give wakes it. */
static _Atomic uint64_t look_at;

static uint64_t tick_of(uint64_t ns);

/* Pushes slot index, parked until deadline, on the wheel's inbox: a
 * parker's last touch of the slot, since the manager may act on it, and
 * free it, at once. False when the wheel is closed: no manager will meet
 * it, so the parker acts. */
bool atap__park_wheel_push(uint32_t index, uint64_t deadline)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t head = ld_relaxed(&inbox);
    /* When a run of the wheel first finds it due: its tick wholly past;
     * now if the parker claimed it already (a stop or an fd's report it
     * found as it armed: a claim after the push wakes the manager itself). */
    uint64_t due = (tick_of(deadline) + 1) << WHEEL_TICK_SHIFT, look;

    if ((ld_relaxed(&s->out.park.claim) & T_STATE) >= P_CLAIMED)
        due = 0;

    do {
        if (head == INBOX_CLOSED)
            return false;
        st_relaxed(&s->out.park.wnext, head);
        /* Release: the deadline, claim and link reach the manager;
         * seq_cst: before the look at look_at below (the rule above). */
    } while (!casw_seqcst(&inbox, &head, index + 1));
    look = ld_seqcst(&look_at);
    if (look > due)
        atap__hub_wake(); /* it files what it finds and sleeps again */
    return true;
}

static uint32_t bucket_of(struct atap_slot *s);

/* A stop claimed a park of the wheel (the caller holds a listener, or is
 * the manager): its bucket is marked for the manager's next run, which acts
 * on what is claimed there (bucket_run). One not filed yet is acted on when
 * the manager takes it in, claimed. Release: the claim comes with the mark. */
void atap__park_wheel_stopped(struct atap_slot *s)
{
    atap__park_wheel_mark(s);
    atap__hub_wake();
}

/* The mark alone: the caller wakes the manager (atap__hub_wake) once it
 * may (park_fd.c marks under its lock, while the park is surely there). */
void atap__park_wheel_mark(struct atap_slot *s)
{
    uint32_t b = bucket_of(s);

    or_release(&stop_bits[b / 64], UINT64_C(1) << (b % 64));
    st_release(&stops_pending, true);
}

/* The runner: the park goes on the wheel, which now owns RUN. It is ARMED
 * before it is pushed, and the push is the last we touch of the slot: once
 * pushed, the manager may end it and free the slot at any moment. A stop
 * that came before the ARMED store was visible is claimed here (seq_cst,
 * against the canceller's CAS and fence); one after it claims it itself.
 *
 * A deadline the manager's clock has passed already (a run that parks came
 * late: the queue was long) goes on no wheel: the parker claims it for the
 * deadline and queues the run itself, as the wheel's holder would at its
 * next look, and nobody is woken for it. Through the wheel, such an arm
 * woke the manager (due before its next look), once a park: with a queue
 * of late first runs, wakes every few dozen microseconds, each taking the
 * CPU of a worker (bench/README.md, timers). A stop that claims it first,
 * or after the ARMED store, is met as a closed wheel's park is: the claim
 * decides, and the parker acts on it (atap__park_tail_act); the bucket the
 * stop marks holds nothing of it. */
void atap__park_tail_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint64_t now = atap__park_now_seen();
    uint32_t w, st;

    TEST_HOOK(ATAP__TEST_TAIL_ARM);
    st_relaxed(&s->out.park.where, atap__park_tick(ctx->deadline));
    st_seqcst(&s->out.park.claim, P_ARMED);
    w = ld_seqcst(&s->word);
    st = word_state(w);
    if (word_gen(w) == ctx->gen && (st == ST_CANCELLED || st == ST_TIMED_OUT))
        atap__park_tclaim(s, BY_STOP, 0);
    if (now != 0 && ctx->deadline <= now) {
        /* Never early: the manager read `now` before this load of it. */
        if (atap__park_tclaim(s, BY_DEADLINE, 0) == 1)
            atap__park_fired(now, ctx->deadline);
        atap__park_tail_act(ctx->index, BY_DEADLINE, false);
        return;
    }
    if (!atap__park_wheel_push(ctx->index, ctx->deadline))
        atap__park_tail_act(ctx->index, BY_OFF, false);
}

/* A delayed start (spawn.c's SF_DELAYED): the spawner, the task just
 * published PENDING with its RUN, files it on the wheel as the runner files
 * a deadline park, and the wheel owns RUN until the deadline. Its output
 * has not been written (no run yet), so the whole tail is the park's. At
 * the deadline the wheel's holder queues it (atap__park_tail_act), its
 * claim word reset: its run is its first, PENDING, claimed as any. A
 * cancel claims it as it claims a run's park (executor.c asks for the
 * interrupt of a PENDING task with SF_DELAYED); a close ends it FAILED. */
_Static_assert(ATAP__DELAY_IN_SLOT_MAX <= PARK_HORIZON / 2, "a delay in the slot is within reach");

void atap__park_delay(struct atap_slot *s, uint32_t index, uint32_t gen, uint64_t deadline)
{
    struct atap_ctx ctx = {.slot = s, .index = index, .gen = gen, .deadline = deadline};

    (void)park_tail_deadline(&ctx); /* a deadline past already: now */
    atap__park_tail_arm(s, &ctx);
}

/* Parks ended by their deadline, and how many of them late (the
 * manager's share of a timer's lateness: pool stats' fired...). Added to
 * by the wheel's holder and by parkers whose deadline had passed, read by
 * anyone: relaxed, each a count. */
static _Atomic uint64_t fired, fired_1ms, fired_10ms;

void atap__park_fired(uint64_t now, uint64_t deadline)
{
    uint64_t late = now - deadline;

    add_relaxed(&fired, 1);
    if (late > 1000000u)
        add_relaxed(&fired_1ms, 1);
    if (late > 10000000u)
        add_relaxed(&fired_10ms, 1);
}

void atap__park_fire_counts(uint64_t out[3])
{
    out[0] = ld_relaxed(&fired);
    out[1] = ld_relaxed(&fired_1ms);
    out[2] = ld_relaxed(&fired_10ms);
}

/* The clock as the seat's holder read it for the wheel's run under way
 * (or the closer's), never earlier than the run before: when a deadline
 * park it ends was fired. */
static uint64_t run_now;

/* Resumes found in one pass, queued together: one CAS and one wake check
 * for a burst. Manager (or closer) only. */
#define RESUME_BATCH 256
static uint32_t resumed[RESUME_BATCH];
static unsigned nresumed;

static void wheel_flush(void)
{
    atap__pool_submit_batch(resumed, nresumed);
    nresumed = 0;
}

/* Whoever holds a park of the wheel acts on it: the manager at its deadline
 * (or a close, with by OFF), or a parker the closed wheel turned away. It
 * claims it, or finds the claim already made (a cancel, a timeout, an fd's
 * event), takes a timed fd park off its fd's list if still on it, and then
 * queues the task again (DEADLINE, READY) or ends its run. batch: the
 * manager's, whose bursts go to the pool together (wheel_flush). */
void atap__park_tail_act(uint32_t index, int by, bool batch)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t gen = word_gen(ld_acquire(&s->word)), c;

    atap__park_tclaim(s, by, 0);
    c = ld_acquire(&s->out.park.claim);
    if (c & T_FD)
        atap__park_tail_off_fd(s, index);
    if ((c & T_STATE) == (P_CLAIMED | BY_DEADLINE) && batch) {
        /* The deadline's tick, whole, from the 32 bits kept: it is past.
         * Its start: the lateness counted is at most a tick (65.5 us) more
         * than the park's own. */
        uint64_t now_tick = run_now >> WHEEL_TICK_SHIFT;
        uint32_t ago = (uint32_t)now_tick - ld_relaxed(&s->out.park.where);

        atap__park_fired(run_now, ago <= now_tick ? (now_tick - ago) << WHEEL_TICK_SHIFT : 0);
    }
    if ((c & T_STATE) == (P_CLAIMED | BY_DEADLINE) || (c & T_STATE) == (P_CLAIMED | BY_READY)) {
        /* A delayed start's first run is no resume: its claim word reads
         * "not parked" again (ours alone: nothing claims from CLAIMED;
         * relaxed, the queueing below releases it to the runner). One
         * cancelled meanwhile goes by the resume's path (run_observed). */
        if ((s->flags & SF_DELAYED) && word_state(ld_acquire(&s->word)) == ST_PENDING)
            st_relaxed(&s->out.park.claim, P_IDLE);
        if (!batch || (s->flags & SF_BLOCKING)) {
            atap__park_requeue(s, index);
        } else {
            if (nresumed == RESUME_BATCH)
                wheel_flush();
            resumed[nresumed++] = index + 1;
        }
        return;
    }
    st_relaxed(&s->out.park.claim, P_IDLE);
    if (word_state(ld_acquire(&s->word)) == ST_PENDING) /* a delayed start, never run */
        atap__exec_end(s, index, gen, ST_FAILED);
    else
        atap__exec_finish_run(s, index, gen, ATAP_EFAILED);
}

static uint64_t tick_of(uint64_t ns) { return ns >> WHEEL_TICK_SHIFT; }

/* A tail park's deadline, as the tail keeps it: its tick modulo 2^32. */
uint32_t atap__park_tick(uint64_t deadline) { return (uint32_t)tick_of(deadline); }

/* Tick a before tick b, both modulo 2^32: they are within 2^31 ticks of
 * each other (a tail park's deadline is within PARK_HORIZON of its arm,
 * and the wheel never runs more than a round behind). */
static bool tick_before(uint32_t a, uint64_t b) { return (int32_t)(a - (uint32_t)b) < 0; }

static uint32_t bucket_of(struct atap_slot *s) { return ld_relaxed(&s->out.park.where) % WHEEL_N; }

static void bucket_used(uint32_t b)
{
    wheel.bits[b / 64] |= UINT64_C(1) << (b % 64);
    wheel.words[b / 4096] |= UINT64_C(1) << (b / 64 % 64);
}

static void bucket_empty(uint32_t b)
{
    if (!(wheel.bits[b / 64] &= ~(UINT64_C(1) << (b % 64))))
        wheel.words[b / 4096] &= ~(UINT64_C(1) << (b / 64 % 64));
}

/* The first tick in [t, last] whose bucket is in use, or UINT64_MAX. */
static uint64_t first_used(uint64_t t, uint64_t last)
{
    while (t <= last) {
        uint32_t b = (uint32_t)(t % WHEEL_N), w;
        uint64_t bits = wheel.bits[b / 64] >> (b % 64), used;

        if (bits) {
            t += (uint64_t)__builtin_ctzll(bits);
            return t <= last ? t : UINT64_MAX;
        }
        t += 64 - b % 64; /* the next word's first tick */
        w = (uint32_t)(t % WHEEL_N) / 64;
        used = wheel.words[w / 64] >> (w % 64);
        t += 64 * (used ? (uint64_t)__builtin_ctzll(used) : 64 - w % 64);
    }
    return UINT64_MAX;
}

/* Files slot index at the head of its bucket. The buckets are doubly
 * linked, so an fd's event can take a timed fd park out of the middle. */
static void file(uint32_t index)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t b = bucket_of(s), head = wheel.head[b];

    st_relaxed(&s->out.park.wnext, head);
    st_relaxed(&s->out.park.wprev, 0);
    if (head)
        st_relaxed(&atap__table_at(head - 1)->out.park.wprev, index + 1);
    wheel.head[b] = index + 1;
    bucket_used(b);
    if (ld_relaxed(&s->out.park.claim) & T_FD)
        or_relaxed(&s->out.park.claim, T_FILED);
}

/* The manager no longer holds slot index in a bucket. */
static void unfiled(struct atap_slot *s)
{
    if (ld_relaxed(&s->out.park.claim) & T_FD)
        and_relaxed(&s->out.park.claim, ~T_FILED);
}

/* Takes slot index out of its bucket (an fd's event claimed it). */
void atap__park_unfile(uint32_t index)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t b = bucket_of(s), next = ld_relaxed(&s->out.park.wnext),
             prev = ld_relaxed(&s->out.park.wprev);

    if (prev)
        st_relaxed(&atap__table_at(prev - 1)->out.park.wnext, next);
    else
        wheel.head[b] = next;
    if (next)
        st_relaxed(&atap__table_at(next - 1)->out.park.wprev, prev);
    if (!wheel.head[b])
        bucket_empty(b);
    unfiled(s);
}

/* Goes through bucket b: what is due now leaves (and is acted on), the
 * rest (later rounds) is filed again. by: DEADLINE, or OFF for everything.
 * Due: its tick is wholly past (its deadline is before the next tick's
 * start, which is not after now), so nothing leaves early. */
static void bucket_run(uint32_t b, uint64_t now, int by)
{
    uint32_t x = wheel.head[b], due = 0;

    wheel.head[b] = 0;
    bucket_empty(b);
    while (x) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        /* Stopped (claimed): free it now. */
        bool go = by == BY_OFF || tick_before(ld_relaxed(&s->out.park.where), tick_of(now)) ||
                  (ld_acquire(&s->out.park.claim) & T_STATE) >= P_CLAIMED;

        if (go) {
            unfiled(s);
            st_relaxed(&s->out.park.wnext, due);
            due = x;
        } else {
            file(x - 1);
        }
        x = next;
    }
    while (due) { /* after the bucket is whole again: acting may arm */
        struct atap_slot *s = atap__table_at(due - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        atap__park_tail_act(due - 1, by, true);
        due = next;
    }
}

/* Takes in the arms and files them; one whose tick has been gone through
 * already (a deadline past, or in a tick just finished) is due now. */
static void take_inbox(uint64_t now)
{
    uint32_t x = xchg_acquire(&inbox, 0), due = 0;

    while (x && x != INBOX_CLOSED) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        uint32_t tick = ld_relaxed(&s->out.park.where);

        if (tick_before(tick, tick_of(now)) || !tick_before((uint32_t)wheel.done, tick) ||
            (ld_acquire(&s->out.park.claim) & T_STATE) >= P_CLAIMED) { /* claimed: act now */
            st_relaxed(&s->out.park.wnext, due);
            due = x;
        } else {
            file(x - 1);
        }
        x = next;
    }
    while (due) {
        struct atap_slot *s = atap__table_at(due - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        atap__park_tail_act(due - 1, BY_DEADLINE, true);
        due = next;
    }
}

/* The earliest tick after `from` with a bucket in use, as a deadline. */
static uint64_t next_due(uint64_t from)
{
    uint64_t t = first_used(from + 1, from + WHEEL_N);

    return t == UINT64_MAX ? ATAP__FOREVER : (t + 1) << WHEEL_TICK_SHIFT;
}

/* The clock as the manager last read it (0: not yet): a time no later than
 * now, for a parker's check of its deadline (atap__park_now_seen). */
static _Atomic uint64_t now_seen;

uint64_t atap__park_now_seen(void)
{
    return ld_relaxed(&now_seen); /* any reading will do: each is a past time */
}

/* Takes the seat if free. Acquire: what the last holder did to the wheel
 * is seen here. */
static bool seat_take(void)
{
    uint32_t free_ = SEAT_FREE;

    if (!cas_acquire(&seat, &free_, SEAT_HELD))
        return false;
    seat_mine = true;
    return true;
}

bool atap__park_wheel_take(void)
{
    if (seat_take())
        return true;
    /* Held by a worker (or closed). seq_cst, against wheel_give's store of
     * the seat then load of the mark: either its holder sees the mark and
     * wakes us, or this second look finds the seat free. */
    st_seqcst(&seat_wanted, true);
    if (ld_seqcst(&seat) != SEAT_FREE || !seat_take())
        return false;
    st_relaxed(&seat_wanted, false);
    return true;
}

void atap__park_wheel_give(void)
{
    seat_mine = false;
    /* Release (within seq_cst): the wheel as left here goes to the next
     * holder; seq_cst against the manager's mark (atap__park_wheel_take). */
    st_seqcst(&seat, SEAT_FREE);
    if (ld_seqcst(&seat_wanted) && xchg_relaxed(&seat_wanted, false))
        atap__hub_wake();
}

bool atap__park_wheel_mine(void) { return seat_mine; }

uint64_t atap__park_wheel_sleep(uint64_t until, uint64_t now)
{
    uint64_t due;

    if (!seat_mine) {
        /* It asked for the seat (atap__park_wheel_take), so the holder's
         * give wakes it: no look at the inbox, and no order needed here
         * (seq_cst only as the store below is). */
        st_seqcst(&look_at, until);
        return until;
    }
    for (;;) {
        uint32_t head;

        /* seq_cst, the store then the load: the manager's half of the
         * Dekker pair with an arm's push then load (at look_at, above). */
        st_seqcst(&look_at, until);
        head = ld_seqcst(&inbox);
        if (head == 0 || head == INBOX_CLOSED)
            return until;
        /* Arms since the run: filed (or queued, if due) now, and the
         * earliest of them is a time to wake at too. Awake again, for the
         * while (relaxed: the store above, made again, orders the next
         * look; an arm that reads 0 meanwhile is met by that look). */
        st_relaxed(&look_at, 0);
        due = atap__park_wheel_run(now);
        until = due < until ? due : until;
    }
}

/* Relaxed: an arm that reads 0 wakes nobody, and is met by the look
 * atap__park_wheel_sleep makes (seq_cst) before the manager sleeps again;
 * one that reads the old time at worst wakes it for nothing. */
void atap__park_wheel_awake(void) { st_relaxed(&look_at, 0); }

void atap__park_wheel_help(void)
{
    uint64_t due = ld_relaxed(&due_at), now;

    /* Arms are left to the manager, which an arm wakes if it would sleep
     * past the arm's due time: a worker that took them in too (after
     * 200 us of the manager's silence) made the timers bench's tail
     * worse, not better (bench/README.md). */
    if (likely(due == ATAP__FOREVER) || (now = atap__now_ns()) < due || !seat_take())
        return;
    TEST_HOOK(ATAP__TEST_WHEEL_HELP);
    (void)atap__park_wheel_run(now);
    atap__park_wheel_give();
}

uint64_t atap__park_wheel_due(void) { return ld_relaxed(&due_at); }

const _Atomic uint64_t *atap__park_wheel_due_word(void) { return &due_at; }

uint64_t atap__park_wheel_run(uint64_t now)
{
    uint64_t cur, t, due;

    /* A reading taken before the seat was ours may be older than the last
     * holder's run: the wheel never goes back in time (a park it had gone
     * through would read as due before its deadline's tick). */
    if (now < run_now)
        now = run_now;
    cur = tick_of(now);
    st_relaxed(&now_seen, now);
    run_now = now;

    if (!wheel.started) {
        wheel.done = cur ? cur - 1 : 0;
        wheel.started = true;
    }
    take_inbox(now);
    if (ld_relaxed(&stops_pending) && xchg_acquire(&stops_pending, false)) {
        for (uint32_t w = 0; w < WORDS; w++) {
            uint64_t bits = ld_relaxed(&stop_bits[w]) ? xchg_acquire(&stop_bits[w], 0) : 0;
            for (; bits; bits &= bits - 1)
                bucket_run(w * 64 + (uint32_t)__builtin_ctzll(bits), now, BY_DEADLINE);
        }
    }
    /* Ticks wholly past: (done, cur). A whole round or more: every bucket. */
    if (cur > wheel.done + 1) {
        uint64_t last = cur - 1;
        for (t = cur - wheel.done - 1 >= WHEEL_N ? last - WHEEL_N + 1 : wheel.done + 1;
             (t = first_used(t, last)) != UINT64_MAX; t++)
            bucket_run((uint32_t)(t % WHEEL_N), now, BY_DEADLINE);
        wheel.done = last;
    }
    wheel_flush();
    due = next_due(wheel.done);
    st_relaxed(&due_at, due);
    return due;
}

/* No manager will run again: every deadline park ends (its run FAILED),
 * and later arms end their own runs. */
void atap__park_wheel_close(void)
{
    uint32_t x, free_ = SEAT_FREE;

    /* The seat for good, once a worker's run is over (a short one: it
     * fires what is due, and never waits). Acquire, as any take. */
    while (!casw_acquire(&seat, &free_, SEAT_CLOSED)) {
        if (free_ == SEAT_CLOSED)
            break; /* closed already: a manager that never started again */
        free_ = SEAT_FREE;
        sched_yield();
    }
    st_relaxed(&due_at, ATAP__FOREVER);
    x = xchg_acqrel(&inbox, INBOX_CLOSED);

    while (x && x != INBOX_CLOSED) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        file(x - 1);
        x = next;
    }
    for (uint32_t w = 0; w < WORDS; w++)
        while (wheel.bits[w])
            bucket_run(w * 64 + (uint32_t)__builtin_ctzll(wheel.bits[w]), 0, BY_OFF);
    wheel_flush(); /* those an fd's event claimed first */
}

/* The manager starts: the wheel takes arms again, and its first run
 * starts its ticks from then. */
void atap__park_wheel_open(void)
{
    uint32_t closed = INBOX_CLOSED;

    /* acq_rel: the close's (and its runner's) writes are seen here, and
     * ours by the next arm that finds the inbox open. */
    casw_acqrel(&inbox, &closed, 0);
    st_relaxed(&look_at, 0); /* a past life's sleep says nothing of this one */
    wheel.started = false;
    /* Release: the close's wheel goes to the first holder. */
    st_release(&seat, SEAT_FREE);
}

/* In a fork's child (atap__park_forget, park.c): the wheel goes back to the
 * state before the first start. */
void atap__park_wheel_forget(void)
{
    st_relaxed(&inbox, 0);
    st_relaxed(&look_at, 0);
    memset(stop_bits, 0, sizeof stop_bits);
    st_relaxed(&stops_pending, false);
    st_relaxed(&now_seen, 0);
    st_relaxed(&fired, 0); /* a new process: its own counts */
    st_relaxed(&fired_1ms, 0);
    st_relaxed(&fired_10ms, 0);
    memset(&wheel, 0, sizeof wheel);
    nresumed = 0;
    st_relaxed(&seat, SEAT_CLOSED); /* whoever held it is not in this process */
    st_relaxed(&seat_wanted, false);
    st_relaxed(&due_at, ATAP__FOREVER);
    seat_mine = false;
}

/* ---- the kind ------------------------------------------------------------ */

/* A park on a deadline alone (atap_park_until, park.c), in the slot's tail
 * on the wheel: the output leaves the whole tail free. Else a record, its
 * deadline a timer of the manager's. No kernel state: the wheel is the
 * runtime's, and needs nothing after a manager's death. */
static bool tail_park(struct atap_slot *s, struct atap_ctx *ctx)
{
    return ctx->deadline != ATAP__FOREVER && slot_tail_room(s, TAIL_ALL) && park_tail_deadline(ctx);
}

const struct park_kind atap__park_kind_until = {.fits_tail = tail_park,
                                                .tail_arm = atap__park_tail_arm};

/*
 * One task slot: 64 bytes, one cache line, never moved once mapped. What
 * only some tasks use (destructors, a schedule, forwards, a park record)
 * hangs on the side record (side.h); an output over INLINE_OUT bytes lives
 * over the arg as well when it can (below), else on the heap (up to 64
 * bytes in an output block a pool thread keeps and hands out again:
 * pool.h).
 *
 * Two atomic words carry every protocol, and both hold the slot's
 * generation so a stale handle can never act on the task that reuses it:
 *
 *   word  (32 bits, the futex word listeners wait on)
 *         gen << 5 | WAITERS << 4 | ASIDE << 3 | state
 *         Every state change is a CAS that keeps gen. Whoever wins a
 *         transition owns its consequence (run, wake, drop). WAITERS is set
 *         by a listener before it sleeps on the word, ASIDE by one before
 *         it sets its stack aside (pool_aside.c), and whoever settles the
 *         task wakes each kind only when its bit was set.
 *
 *   refs  (64 bits) gen << 37 | RUN << 36 | RX << 35 | GATED << 34 |
 *         handles << 13 | holds
 *         Listeners, counted in two fields: one per handle (atap_spawn,
 *         atap_dup), and the runtime's own holds (a waker's or a helper's,
 *         brief; a parked run's; the feeders of a waiting task, one for all
 *         of them; RX's below). A handle names its task while
 *         handles is not 0: the holds keep the slot, never the name, so
 *         every copy of the last handle reads ATAP_ENOTASK once it is
 *         released, whatever the runtime still holds. Each field is
 *         released only by whoever took it (atap_release: handles;
 *         atap__exec_release_listener: holds), so a handle released twice
 *         can never drop a hold. Plus RUN while the runtime still owes the
 *         task a run or a clean-up (the queue or the running thread holds
 *         it). Whoever takes refs to (gen, no RUN, no listener of either
 *         kind) frees the slot, so only one path frees.
 *         RX: outputs are forwarded (`rx`, forward.c); set by a CAS that
 *         finds RUN held, so whoever drops RUN learns from that same CAS
 *         that it must close the forwards (never cleared until freed).
 *         GATED: the task waits for gives (gate.c), so its last
 *         listener of either kind going may let it go: a handle can give,
 *         and so can a feeder; read with the count, no extra load.
 *
 * An output of up to INLINE_OUT (16) bytes sits in the output area. One of
 * 17 to WIDE_OUT (24) bytes from a quick spawn (spawn.c: no side record at
 * the spawn, no schedule) sits over `arg` and the output area together
 * (SF_OUT_WIDE): at offset 40, aligned to 8, which is all a type of that
 * size can ask (its alignment divides its size, and no size from 17 to
 * 24 is a multiple of 16). Its run may overwrite `arg` as soon as it
 * starts: every run reads the arg before its function is called, and a
 * run that parks keeps it on the side record for the next (park.c; such
 * an output leaves the park tail no room, so its park has a record or its
 * fd and claim on the side record anyway). Anything larger lives on the
 * heap (SF_OUT_HEAP).
 *
 * `link` is the intrusive next pointer (index + 1, 0 for none), used by the
 * free list while the slot is free, by the injector while it is queued, and
 * by an fd's waiter list while the task is parked on it in the tail; a slot
 * is only ever one of those. The park wheel links through the tail. While
 * a plain task runs, `link` is unused.
 */
#ifndef ATAP_SLOT_H
#define ATAP_SLOT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "atap.h"
#include "atomics.h"

struct side;

#define SLOT_SIZE 64u

#define ST_FREE 0u
#define ST_PENDING 1u
#define ST_RUNNING 2u
#define ST_READY 3u
#define ST_TAKEN 4u
#define ST_CANCELLED 5u
#define ST_FAILED 6u
#define ST_TIMED_OUT 7u

#define ST_MASK 0x7u
#define ST_ASIDE 0x8u
#define ST_WAITERS 0x10u
#define ST_LISTENED (ST_WAITERS | ST_ASIDE) /* a settle wakes someone */
#define GEN_SHIFT 5
#define GEN_MAX ((1u << 27) - 1u)

#define REFS_GEN_SHIFT 37
#define REFS_RUN (UINT64_C(1) << 36)
#define REFS_RX (UINT64_C(1) << 35)
#define REFS_GATED (UINT64_C(1) << 34)     /* waits for gives: set at spawn */
#define REFS_HANDLE (UINT64_C(1) << 13)    /* one handle */
#define REFS_HOLD UINT64_C(1)              /* one of the runtime's holds */
#define REFS_COUNT_END (UINT64_C(1) << 33) /* bit 33 unused: 2^20 - 1 handles, as atap.h says */
#define REFS_HANDLES_MASK (REFS_COUNT_END - REFS_HANDLE)
#define REFS_HOLDS_MASK (REFS_HANDLE - 1)
#define REFS_COUNT_MASK (REFS_COUNT_END - 1) /* listeners of either kind */
/* Holds are brief and one per thread (wakers, helpers), or one per task
 * (its park, its feeders, RX): room for every thread there can be. */
_Static_assert(REFS_HOLDS_MASK > 4 * ATAP_THREADS_MAX, "room for every thread's hold");

/* flags: set at spawn, read-only after */
#define SF_BLOCKING 0x1u
#define SF_OUT_HEAP 0x2u
#define SF_SCHED 0x4u     /* a schedule hangs on the side record (schedule.c) */
#define SF_DELAYED 0x8u   /* a delayed start waits in the slot's tail (spawn.c) */
#define SF_OUT_WIDE 0x10u /* the output lies over `arg` too (see the top) */

struct atap_slot {
    _Atomic uint32_t word;
    _Atomic uint32_t link;
    _Atomic uint64_t refs;
    struct side *_Atomic side; /* what a task needs only sometimes (side.h) */
    uint32_t out_size;
    int8_t priority;
    uint8_t flags;
    uint8_t filled;    /* an output stands in the slot for nobody yet: set by
                          runs, cleared by the take that moves it out (kept
                          apart from flags, which others read meanwhile) */
    uint8_t fail_code; /* a run that failed with an ATAP_E* code or -ENOMEM:
                          fail_code_of's encoding (runner-written before
                          FAILED) */
    atap_fn *fn;
    void *arg;
    /* The output: inline up to INLINE_OUT bytes, else on the heap. What
     * an output leaves free of it holds a park on a deadline or an fd
     * (park_wheel.c, park_fd.c), with no record of its own: slot_tail_room. */
    union {
        unsigned char bytes[SLOT_SIZE - 48];
        void *heap;
        struct {
            _Atomic uint32_t wnext, wprev; /* the park wheel's links */
            /* A deadline park's (or a timed fd park's) tick, modulo 2^32
             * (park_wheel.c); an untimed fd park's fd (park_fd.c). */
            _Atomic uint32_t where;
            _Atomic uint32_t claim;
        } park;
    } out;
};

/* An inline output of up to PARK_TAIL bytes leaves the tail's claim word
 * alone. */
#define PARK_TAIL 12u
/* Of the tail: an untimed fd park uses `where` and `claim`; a deadline
 * park, or a timed fd park, all of it. */
#define TAIL_FD 8u
#define TAIL_ALL 16u

/* A hint for a parked task whose next run is being queued: the run reads
 * its arg first, and the arg is likely cold (a connection among
 * thousands, parked long ago). Fetched now, its first lines arrive while
 * the rest of a batch of reports is handed out, rather than one miss
 * after another in the run. A prefetch never faults: past the end of a
 * small arg it costs a wasted line. */
#define ARG_WARM_LINES 3

static inline void slot_warm_arg(const struct atap_slot *s)
{
    uintptr_t a;

    if (s->flags & SF_OUT_WIDE)
        return;            /* its arg is on its side record, its field is output */
    a = (uintptr_t)s->arg; /* as a number: an arg may be NULL */

    for (uintptr_t i = 0; i < ARG_WARM_LINES; i++)
        __builtin_prefetch((const void *)(a + 64 * i));
}

#define INLINE_OUT (SLOT_SIZE - 48)
#define WIDE_OUT (INLINE_OUT + sizeof(void *))

/* The tail's claim word is the park's: the output leaves it alone. */
static inline int slot_park_tail(const struct atap_slot *s)
{
    return (s->flags & SF_OUT_HEAP) || s->out_size <= PARK_TAIL;
}

/* The output (inline, or its heap pointer) leaves the last `used` bytes
 * of the output area free. */
static inline int slot_tail_room(const struct atap_slot *s, uint32_t used)
{
    return (s->flags & SF_OUT_HEAP ? (uint32_t)sizeof(void *) : s->out_size) <= INLINE_OUT - used;
}

/*
 * Inline outputs are aligned for any type: out.bytes sits at offset 48 of a
 * slot whose size is a multiple of 16, in a table mapped page-aligned
 * (table.c), so it is 16-aligned on every slot.
 */
_Static_assert(_Alignof(max_align_t) <= 16, "inline outputs align to at most 16");
_Static_assert(SLOT_SIZE % 16 == 0, "every slot's output area is 16-aligned");

static inline int slot_out_inline(size_t n) { return n <= INLINE_OUT; }

/* A wide output begins at arg and runs on through the output area. */
_Static_assert(offsetof(struct atap_slot, out) == offsetof(struct atap_slot, arg) + sizeof(void *),
               "arg lies just before the output area");
_Static_assert(offsetof(struct atap_slot, arg) % 8 == 0 && WIDE_OUT < 32,
               "a wide output is aligned as any type of its size asks");
#define WIDE_AT offsetof(struct atap_slot, arg)

/* fail_code's encoding: ATAP_ENOTINIT (-10001) .. ATAP_ELIMIT as 1 .. 14,
 * and -ENOMEM (a run's own, or its output's block not to be had at its
 * first run: executor.c) as FAIL_NOMEM; 0: ATAP_EFAILED.
 * Not ATAP_ENOTREADY: a reader given it would take the task for unsettled
 * (a join would wait for a run that never comes), so it reads EFAILED. */
#define ATAP_FAIL_BASE (-10000)
#define FAIL_NOMEM 255u
static inline int fail_code_of(int rc)
{
    if (rc == -ENOMEM)
        return FAIL_NOMEM;
    return rc <= ATAP_ENOTINIT && rc >= ATAP_ELIMIT && rc != ATAP_ENOTREADY ? ATAP_FAIL_BASE - rc
                                                                            : 0;
}

/* What a reader of a failed task gets for its fail_code. */
static inline int fail_rc_of(uint8_t code)
{
    if (code == FAIL_NOMEM)
        return -ENOMEM;
    return code ? ATAP_FAIL_BASE - code : ATAP_EFAILED;
}

_Static_assert(sizeof(struct atap_slot) == SLOT_SIZE, "a slot is SLOT_SIZE bytes");
_Static_assert(offsetof(struct atap_slot, out.park.claim) == SLOT_SIZE - 4 &&
                   INLINE_OUT - 4 == PARK_TAIL,
               "the claim word is the output area's last 4 bytes");

static inline uint32_t word_state(uint32_t w) { return w & ST_MASK; }
static inline uint32_t word_gen(uint32_t w) { return w >> GEN_SHIFT; }
static inline uint32_t make_word(uint32_t gen, uint32_t state) { return gen << GEN_SHIFT | state; }
static inline uint32_t refs_gen(uint64_t r) { return (uint32_t)(r >> REFS_GEN_SHIFT); }
/* refs of generation gen with nothing else set. */
static inline uint64_t refs_of(uint32_t gen) { return (uint64_t)gen << REFS_GEN_SHIFT; }
_Static_assert(GEN_MAX < (1u << (64 - REFS_GEN_SHIFT)), "a generation fits refs");

/* Settled: nothing is running or queued for this run. */
static inline int state_terminal(uint32_t s) { return s >= ST_READY; }
/* Ended otherwise than with an output: cancelled, failed, timed out. */
static inline int state_stopped(uint32_t s) { return s >= ST_CANCELLED; }

/* The task has a schedule (schedule.c): on its side record, found with
 * sched_of (schedule_int.h). */
static inline int slot_sched(const struct atap_slot *s) { return (s->flags & SF_SCHED) != 0; }

static inline void *slot_out(struct atap_slot *s)
{
    if (s->out_size == 0)
        return NULL;
    if (s->flags & SF_OUT_HEAP)
        return s->out.heap;
    if (s->flags & SF_OUT_WIDE)
        return (unsigned char *)s + WIDE_AT; /* within the slot's 64 bytes */
    return s->out.bytes;
}

static inline atap_task make_task(uint32_t index, uint32_t gen)
{
    return (atap_task){(uint64_t)gen << 32 | index};
}

#endif

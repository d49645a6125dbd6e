/*
 * What the parks' files (park.c, park_fd.c, park_wheel.c, sources.c for
 * signals and path changes, and each kind's own file) share with each
 * other, and no one else: the kinds (park_kinds.h's list, struct
 * park_kind), the park record, its claim, a park in the slot tail, and the
 * sources' side of a park.
 */
#ifndef ATAP_PARK_INT_H
#define ATAP_PARK_INT_H

#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atap.h"
#include "executor.h"
#include "pool.h"
#include "side.h"
#include "slot.h"
#include "timer.h"
#include "wait.h"

/* Whether fd is open now. A table indexed by fd (park_fd.c's fdw table, the
 * kqueue path lists in sources.c) grows only for an open one: a closed fd,
 * however large, must not cost a table that size. */
static inline bool atap__fd_open(int fd) { return fd >= 0 && fcntl(fd, F_GETFD) != -1; }

/* Doubles *cap (from 64) until it exceeds key; false when that many
 * pointer entries could not be counted in a size_t. */
static inline bool atap__grow_cap(size_t *cap, size_t key)
{
    size_t c = *cap ? *cap : 64;

    while (c <= key) {
        if (c > SIZE_MAX / 2 / sizeof(void *))
            return false;
        c *= 2;
    }
    *cap = c;
    return true;
}

/* Queues the next run of the parked task in slot index, resumed: its arg
 * warmed first (slot_warm_arg), as the run reads it first. */
static inline void atap__park_requeue(const struct atap_slot *s, uint32_t index)
{
    slot_warm_arg(s);
    atap__pool_submit_as(index + 1, s->priority, (s->flags & SF_BLOCKING) != 0, true);
}

/* The kinds of park: what a parked task waits for besides its deadline,
 * numbered from park_kinds.h's list (PK_FD, PK_UNTIL, ...); 0 is no park.
 * Each has an entry in atap__park_kinds (park.c), below. */
enum {
    PK_NONE,
#define PARK_KIND(name, ops) PK_##name,
#include "park_kinds.h"
#undef PARK_KIND
    PK_KINDS
};
/* A record's claim word: its park's number << 8 | one of these (park.c).
 * The number wraps after 2^24 parks of one record: a timer fire would have
 * to stall between its reads and its claim across all of them to mistake
 * one park for another. */
enum { P_IDLE = 0, P_ARMING = 1, P_ARMED = 2, P_CLAIMED = 0x10 };
#define P_STATE(c) ((c)&0xffu)
#define P_SEQ_ONE 0x100u
enum { BY_READY = ATAP_RESUME_READY, BY_DEADLINE = ATAP_RESUME_DEADLINE, BY_STOP = 3, BY_OFF = 4 };

/* A task's park record (park.c's top comment has the protocol). */
struct park {
    struct atap_timer timer;
    _Atomic uint32_t claim; /* park number << 8 | state */
    uint32_t seq;           /* the number of the park under way (parker only) */
    uint32_t index, gen;
    uint8_t kind;
    bool timed, on_fd, listed;
    bool ever_timed; /* its timer was armed once: the structure may hold it */
    int fd;          /* PK_FD: the fd; a source's: its list (signal, watch) */
    unsigned events;
    _Atomic unsigned got;
    _Atomic uint64_t woken; /* PK_WAKE: wakes not yet acted on (atap__park_wake) */
    _Atomic uint64_t deadline;
    struct park *fd_next;     /* its waiter list's lock (park_fd.c or sources.c) */
    struct park *prev, *next; /* registry, reg_lock */
    struct park *grave_next;
};

/* The events a park on an fd may ask for (HUP and ERR come unasked). */
#define EVENT_BITS (ATAP_READABLE | ATAP_WRITABLE)

/* The claim word of a park in the slot tail: state | events wanted << 8 |
 * events seen << 12 | the T_ bits below. */
#define T_STATE 0xffu
#define T_WANT_SHIFT 8
#define T_GOT_SHIFT 12
#define T_FD 0x10000u     /* an fd park (else a deadline park) */
#define T_TIMED 0x20000u  /* an fd park with a deadline: on the wheel too */
#define T_LINKED 0x40000u /* on its fd's list: changed under fd_lock */
#define T_FILED 0x80000u  /* in a wheel bucket: the manager's alone */
/* A timed fd park's fd, + 1, in the top bits when below T_FD_SMALL (its
 * tail has no room for it); 0 there: it is on the side record. */
#define T_FD_SHIFT 20
#define T_FD_SMALL 4095

/* The claim word of a tail park: the last 4 bytes of the slot's output
 * area, unless an inline output of 13-16 bytes fills them; then the side
 * record's (only an fd park without a deadline goes in the tail of such a
 * task, and it makes the record first). NULL: no tail park can be. Where
 * it is follows from the output's size, set at spawn, so every side finds
 * the same word. */
static inline _Atomic uint32_t *tail_claim(struct atap_slot *s)
{
    struct side *x;

    if (slot_park_tail(s))
        return &s->out.park.claim;
    return (x = slot_side(s)) != NULL ? &x->claim : NULL;
}

struct atap_ctx;
struct atap_slot;

/* park.c. Claims p for `by`: 1 if claimed from ARMED (the caller then
 * completes it), -1 from ARMING (its parker completes it), 0 if someone
 * else claimed it or it is not parked. */
int atap__park_claim(struct park *p, int by);
/* park.c. The one claimant's work: off everything it is on, then the task
 * runs again (READY, DEADLINE) or its run ends failed. No lock held. */
void atap__park_complete(struct park *p, int by);

/*
 * A kind of park: what its park record joins while armed, whether it keeps
 * the park in the slot itself instead, and the kernel state it keeps, if
 * any. park.c's protocol (claim, complete, the registry, the deadline's
 * timer, the stop's look, the manager's restarts) is the same for every
 * kind; an entry says only what differs. A new kind is one file, with its
 * entry and its atap_park_* call (through atap__park_ask), and its line in
 * park_kinds.h (src/README.md has the recipe).
 */
struct park_kind {
    /* The parker, the record ARMING, no lock held: joins what the park
     * waits on, under the kind's own lock: 0, or -errno (it cannot be
     * watched: the park ends READY with ATAP_ERROR). Ready already, it
     * claims the park READY (from ARMING: the parker completes it). NULL:
     * nothing to join (a deadline's park, a wake's). */
    int (*join)(struct park *p);
    /* The claimant, completing (no lock held): off what join put it on,
     * if still there. */
    void (*leave)(struct park *p);
    /* The park in the slot's tail instead of a record (the runner, holding
     * RUN): whether ctx's park fits there, and its arm if so. NULL: always
     * a record. */
    bool (*fits_tail)(struct atap_slot *s, struct atap_ctx *ctx);
    void (*tail_arm)(struct atap_slot *s, struct atap_ctx *ctx);
    /* The kind's kernel state, for park.c's manager side, which calls each
     * kind's in park_kinds.h's order; NULL: none kept. rearm: between two
     * managers' lives (the supervisor, atap__park_rearm), what the dead
     * manager's watches held is read or watched again; retry: each
     * manager tick (atap__park_retry), a watch that failed is tried again;
     * forget: in a fork's child (atap__park_forget, its one thread), back
     * to the state before the first start. Kinds that share their state
     * (signals and paths: sources.c) give these in one entry only. */
    void (*rearm)(void);
    void (*retry)(void);
    void (*forget)(void);
    /* A wake's park (atap_wake's count, park.c's top): a stop hands a
     * pending wake on, and the next run reads atap_woke(). */
    bool wake;
};
#define PARK_KIND(name, ops) extern const struct park_kind ops;
#include "park_kinds.h"
#undef PARK_KIND
/* park.c: each kind's entry, by its PK_ number (0: NULL). */
extern const struct park_kind *const atap__park_kinds[PK_KINDS];

/* park.c. Asks for a park of kind in ctx's run (what each atap_park_* call
 * does once it has checked its arguments): fd and events are the kind's
 * own (its record keeps them: p->fd, p->events), deadline absolute or
 * ATAP__FOREVER. 0, or ATAP_EINVAL: no run to park, or a park asked for
 * already. The run then returns ATAP_PARKED and the executor arms it. */
int atap__park_ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline);

/* park.c. The one claim of a park, whichever storage holds its word (a
 * record's claim, or the slot tail's, tail_claim): its state byte from
 * ARMING or ARMED to CLAIMED|by, by CAS, so that exactly one claimant wins.
 * c: the word as the caller read it; same: bits that must still read as in
 * c (a record's park number, so that a fire left from an earlier park
 * claims no later one; 0: any); clear, set: other bits that change with
 * the claim (a tail's events seen). 1: claimed from ARMED, the caller
 * completes; -1: from ARMING, the parker completes; 0: not parked, claimed
 * already, or a later park. */
int atap__park_claim_word(_Atomic uint32_t *w, uint32_t c, int by, uint32_t same, uint32_t clear,
                          uint32_t set);

/* park_fd.c. 1, -1 or 0 as atap__park_claim(), on a tail park; got: the events seen. */
int atap__park_tclaim(struct atap_slot *s, int by, unsigned got);
/* park_fd.c. The one claimant's work for a tail fd park (linked: still on its list). */
void atap__park_tail_fd_complete(uint32_t index, int by, bool linked);
/* park_fd.c. The runner: a park on an fd goes in the slot tail (with a deadline: the wheel too). */
void atap__park_tail_fd_arm(struct atap_slot *s, struct atap_ctx *ctx);
/* park_fd.c. Takes a tail fd park off its fd's list if still on it (T_LINKED); takes fd_lock. */
void atap__park_tail_off_fd(struct atap_slot *s, uint32_t index);
/* park_fd.c. The manager starts: tail fd parks are taken, and a failed watch marks its fd deaf. */
void atap__park_tails_open(void);
/* park_fd.c. No manager: every tail fd park ends, and later ones end at once. */
void atap__park_tails_close(void);
/* park_fd.c. In a fork's child (atap__park_forget): the fd table is forgotten. */
void atap__park_fd_forget(void);

/* A tail park keeps its deadline as a tick modulo 2^32 (park_wheel.c): one
 * whose deadline is further than this from its arm takes a park record. */
#define PARK_HORIZON (UINT64_C(1) << 46) /* 2^30 ticks of 65.5 us: 19.5 hours */
/* park_wheel.c. The clock as the manager last read it, no later than now
 * (the manager runs at least every tick); 0 before its first run. */
uint64_t atap__park_now_seen(void);
/* A deadline a tail park can keep (within PARK_HORIZON of now): the
 * fits_tail of the kinds that may park in the tail (park_fd.c, and
 * park_wheel.c's deadline alone). One already past is kept as now: it is
 * due at once either way. "Now" is the manager's last reading of the
 * clock, a time no later than now (no clock read on this path): so the
 * horizon is, if anything, stricter, and a deadline kept as that time is
 * still past. */
static inline bool park_tail_deadline(struct atap_ctx *ctx)
{
    uint64_t now = atap__park_now_seen();

    if (!now)
        now = atap__now_ns();

    if (ctx->deadline < now)
        ctx->deadline = now;
    return ctx->deadline - now < PARK_HORIZON;
}
/* park_wheel.c. A park ended by its deadline, at now (the manager's). */
void atap__park_fired(uint64_t now, uint64_t deadline);
/* park_wheel.c. A deadline as a tail park keeps it. */
uint32_t atap__park_tick(uint64_t deadline);
/* park_wheel.c. The runner: a deadline park goes on the wheel, which now owns RUN. */
void atap__park_tail_arm(struct atap_slot *s, struct atap_ctx *ctx);
/* park_wheel.c. The spawner: a delayed start waits on the wheel (extras.h's delay). */
void atap__park_delay(struct atap_slot *s, uint32_t index, uint32_t gen, uint64_t deadline);
/* park_wheel.c. Pushes slot index, parked until deadline, on the wheel's inbox; false:
 * closed, the parker acts. It wakes the manager only if it sleeps past the deadline. */
bool atap__park_wheel_push(uint32_t index, uint64_t deadline);
/* park_wheel.c. A stop claimed a park of the wheel: its bucket is marked for the manager. */
void atap__park_wheel_stopped(struct atap_slot *s);
/* park_wheel.c. The same mark, with no wake of the manager (the caller's to make). */
void atap__park_wheel_mark(struct atap_slot *s);
/* park_wheel.c. Whoever holds a park of the wheel acts on it: queues its task or ends its run. */
void atap__park_tail_act(uint32_t index, int by, bool batch);
/* park_wheel.c. Manager: takes slot index out of its bucket (an fd's event claimed it). */
void atap__park_unfile(uint32_t index);
/* park_wheel.c. The manager starts: the wheel takes arms again. */
void atap__park_wheel_open(void);
/* park_wheel.c. No manager: every deadline park ends, and later arms end their own runs. */
void atap__park_wheel_close(void);
/* park_wheel.c. In a fork's child (atap__park_forget): the wheel is forgotten. */
void atap__park_wheel_forget(void);

/* sources.c. The manager's poller reported udata: true if it was a
 * source's, now dealt with. */
bool atap__source_event(void *udata, unsigned events, unsigned kind);
/* sources.c. Paths can be parked on here (inotify, or the poller's). */
bool atap__source_paths(void);

#endif

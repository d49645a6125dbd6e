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
 * CAS from exactly the word it read: a later park changed the word. After ARMED the parker looks at the task's state
 * once more (seq_cst, against the canceller's fence) so a cancel that came
 * while the park was being set up is not missed.
 *
 * Wakes (atap__park_wake, for the runtime's own tasks: channels) set a flag
 * in the park record before they look at the claim; a parker that arms
 * after the flag sees it. Every wake counted delivered is acted on once: a
 * woken task whose run is then dropped (cancelled after the wake claimed
 * it) still gets that run, with atap_cancelled() true, so that it can hand
 * the wake on (executor.c); and a stop that claims a park whose flag is
 * still set (the wake came while it was being armed) completes it as woken
 * instead, for the same run. The parker clears the flag only with a claim
 * won, so the flag is always left to whoever ends the park.
 *
 * Several parks on one fd share a `struct fdw` (one per fd number, kept for
 * the process's life, since the poller may still report it; a fork's child
 * forgets them with the poller, atap__park_forget): its waiter
 * list and the union of their events, watched one-shot on the manager's
 * poller and watched again after each event with what is still wanted.
 *
 * An fd whose watch fails (the kernel out of memory, say) is deaf: after a
 * report its one-shot watch is spent, so nothing says the parks still
 * waiting on it will be told of it again. rewatch() puts such an fdw on
 * deaf_fds, under fd_lock, the lock of its waiter list and of every watch
 * of it, and every manager tick (atap__park_retry) watches each deaf fd
 * again, under fd_lock too. A watch that holds is level-triggered: it
 * reports what is ready now, so nothing is lost, only late by a tick at
 * most. One that fails again leaves the fd deaf for the next tick, and the
 * tick looks at the fd itself (poll(2), which does not wait) and claims
 * the parks it finds ready as a report would have (a closed fd reads ERR:
 * its parks resume with ATAP_ERROR rather than wait for a watch that can
 * never hold). The tick claims through the same CAS as anyone, so a park a
 * cancel, a deadline or a report took is not claimed again, and whoever
 * won takes it off the list under fd_lock, which watches the fd again for
 * the rest; it runs on the manager thread, as reports do, so it may take a
 * timed park out of the wheel. A mark never outlives its fd's parks: any
 * watch of the fd that holds, or that finds nobody left to watch for, and
 * a report that leaves nobody on the fd, take it off the list; and the
 * list holds only fds whose last watch failed, so a tick with none deaf
 * costs one relaxed load. A joining park's own watch that fails resumes
 * that park at once with ATAP_ERROR, and the watch then renewed for the
 * others decides whether the fd is deaf. The list outlives a manager's
 * death: the restart's watch of every parked fd (atap__park_rearm) clears
 * or keeps each mark, and the next manager's ticks go on. Once no manager
 * will run again (fd_closed, set with the list emptied under fd_lock) no
 * fd is marked: every park is being written off, and no tick would retry.
 * All of this is park.c's, so every backend behaves alike.
 * Parks in the slot itself (below: "the park wheel" for deadlines, "fd
 * parks in the slot tail" for fds) cost nothing beyond the slot; signals,
 * paths, the runtime's own wakes, and tasks whose output fills the tail use
 * a park record.
 *
 * Deadline parks in the slot itself. A park on a deadline, in a task whose
 * output leaves the slot's park tail free (slot.h), costs no memory beyond
 * the slot: its claim word and deadline sit in the tail, and the park wheel
 * below links it through the tail's wnext / wprev. The wheel owns such a
 * park, and its RUN reference, until the manager meets it: at its deadline
 * (or a shutdown), the manager claims it, or finds it claimed by a cancel or
 * a timeout, and only then queues the task again or ends its run. A stop
 * that claims one marks its bucket (stop_bits), which the manager's next run
 * goes through, so a cancelled park's slot goes at once too. It is ARMED
 * before it is pushed, and the push is the parker's last touch of the slot.
 * Arms push on an MPSC stack of slot indices (CAS on `inbox`); the manager
 * takes the stack and files each slot in a bucket of a hashed wheel of
 * ticks. A close swaps a CLOSED mark into the inbox, so a later arm knows to
 * end its run itself. A park on an fd with a deadline is on both its fd's
 * list and the wheel (tail_timed_arm says how the two meet).
 *
 * Signals and path changes are sources of their own (sources.c), which
 * claim and complete parks through atap__park_claim / atap__park_complete.
 * Locks: fd_lock (every fd's waiter list, watch and deaf mark), reg_lock
 * (the registry of armed parks), sources.c's src_lock (its lists), never
 * two at once, and none while completing.
 */
#include "park.h"
#include "park_int.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "dataflow.h"
#include "executor.h"
#include "faults.h"
#include "manager.h"
#include "poller.h"
#include "pool.h"
#include "slot.h"
#include "table.h"
#include "timer.h"
#include "trace.h"
#include "wait.h"

_Static_assert(ATAP_READABLE == ATAP__POLL_READ && ATAP_WRITABLE == ATAP__POLL_WRITE &&
                   ATAP_HANGUP == ATAP__POLL_HUP && ATAP_ERROR == ATAP__POLL_ERR,
               "public event bits are the poller's");

#define EVENT_BITS (ATAP_READABLE | ATAP_WRITABLE)

struct fdw {
    int fd;
    bool deaf;             /* fd_lock: its last watch failed; on deaf_fds (see the top) */
    struct fdw *deaf_next; /* deaf_fds, fd_lock */
    struct park *waiters;  /* parks with a record (park.c's struct park) */
    uint32_t tails;        /* parks in the slot tail: slot index + 1, on `link` */
};

/* The claim word of a park in the slot tail: state | events wanted << 8 |
 * events seen << 12 | the T_ bits below. */
#define T_STATE 0xffu
#define T_WANT_SHIFT 8
#define T_GOT_SHIFT 12
#define T_FD 0x10000u     /* an fd park (else a deadline park) */
#define T_TIMED 0x20000u  /* an fd park with a deadline: on the wheel too */
#define T_LINKED 0x40000u /* on its fd's list: changed under fd_lock */
#define T_FILED 0x80000u  /* in a wheel bucket: the manager's alone */
static bool fd_closed; /* fd_lock: no manager will run again */


static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fdw **fdtab;
static size_t fdcap;
/* The deaf fds (see the top): written under fd_lock only; the tick's
 * unlocked look at the head is only a filter (relaxed: what it finds it
 * reads again under fd_lock, and a head it misses it meets at its next
 * tick). */
static struct fdw *_Atomic deaf_fds;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct park *armed_parks;
static bool reg_closed;

/* ---- claiming ------------------------------------------------------------ */

/* 1: claimed from ARMED, the caller completes; -1: claimed from ARMING, the
 * parker completes; 0: not parked, or someone else claimed it. seq_cst:
 * the load pairs with the parker's store of ARMING (see interrupt). */
/* Claims the park the claim word c (read by the caller) belongs to; with
 * `exact`, only that one: not a later park of the record. */
static int claim_from(struct park *p, uint32_t c, int by, bool exact)
{
    uint32_t seq = c & ~0xffu;

    for (;;) {
        if ((exact && (c & ~0xffu) != seq) || (P_STATE(c) != P_ARMING && P_STATE(c) != P_ARMED))
            return 0;
        if (atomic_compare_exchange_weak_explicit(&p->claim, &c,
                                                  (c & ~0xffu) | P_CLAIMED | (uint32_t)by,
                                                  memory_order_acq_rel, memory_order_acquire))
            return P_STATE(c) == P_ARMED ? 1 : -1;
    }
}

int atap__park_claim(struct park *p, int by)
{
    return claim_from(p, ld_seqcst(&p->claim), by, false);
}

static void fd_remove(struct park *p);

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

    fd_remove(p);
    if (p->timed && by != BY_DEADLINE)
        atap__timer_disarm(atap__manager_timers(), &p->timer); /* lost: see the top */
    registry_remove(p);
    /* Stopped with a wake pending: one that came before the park was armed,
     * or that a stop overtook (atap__park_wake counted it delivered). The
     * task runs once more, woken, to hand it on (a channel's value, or
     * room), as a task woken and then stopped does (run_observed). */
    if ((by == BY_STOP || by == BY_OFF) && p->kind == PK_WAKE &&
        atomic_exchange_explicit(&p->woken, 0, memory_order_seq_cst)) {
        st_release(&p->claim, (ld_relaxed(&p->claim) & ~0xffu) | P_CLAIMED | BY_READY);
        by = BY_READY;
    }
    if (by == BY_READY || by == BY_DEADLINE) {
        /* Nothing of p is touched after this: the next run owns it. */
        if (!atap__exec_resume_stale(s, index, gen))
            atap__pool_submit(index + 1, s->priority, (s->flags & SF_BLOCKING) != 0);
        return;
    }
    atap__exec_finish_run(s, index, gen, ATAP_EFAILED);
}

/* ---- fds ----------------------------------------------------------------- */

static _Atomic uint32_t *link_of(uint32_t index)
{
    return &atap__table_at(index)->link;
}

static unsigned wanted(const struct fdw *f)
{
    unsigned ev = 0;

    /* A claimed record waits only for its parker to take it off the list:
     * watching its events for it would report a level-ready fd again and
     * again meanwhile. */
    for (struct park *p = f->waiters; p; p = p->fd_next)
        if (P_STATE(ld_relaxed(&p->claim)) < P_CLAIMED)
            ev |= p->events;
    for (uint32_t x = f->tails; x; x = ld_relaxed(link_of(x - 1))) {
        uint32_t c = ld_relaxed(&atap__table_at(x - 1)->out.park.claim);
        if ((c & T_STATE) < P_CLAIMED) /* a stopped one waiting for the wheel wants nothing */
            ev |= (c >> T_WANT_SHIFT) & 0xfu;
    }
    return ev;
}

/* fd_lock held: f goes on deaf_fds, or off it. */
static void set_deaf(struct fdw *f, bool deaf)
{
    struct fdw *x;

    if (f->deaf == deaf)
        return;
    f->deaf = deaf;
    if (deaf) {
        f->deaf_next = ld_relaxed(&deaf_fds);
        st_relaxed(&deaf_fds, f);
    } else if ((x = ld_relaxed(&deaf_fds)) == f) {
        st_relaxed(&deaf_fds, f->deaf_next);
    } else { /* deaf fds are few: a walk */
        while (x->deaf_next != f)
            x = x->deaf_next;
        x->deaf_next = f->deaf_next;
    }
}

/* fd_lock held: the fd's watch follows its waiters; one that fails leaves
 * the fd deaf, unless no manager will run again (see the top). again: a
 * watch renewed for the parks already waiting (after a report, a park
 * leaving, a restart, a tick's retry), where a fault may be injected; not
 * a joining park's own. */
static int rewatch(struct fdw *f, bool again)
{
    struct atap_poller *mp = atap__manager_poller();
    unsigned ev = wanted(f);
    int rc = 0;

    if (ev)
        rc = again && FAULT_WATCH_FAILS() ? -ENOMEM : atap__poller_watch(mp, f->fd, ev, f);
    else
        atap__poller_unwatch(mp, f->fd); /* -EBADF for a closed fd: nothing to undo */
    set_deaf(f, rc != 0 && !fd_closed);
    return rc;
}

/* fd_lock held. NULL (the park then resumes with ATAP_ERROR) for no
 * memory, or a closed fd beyond the table. */
static struct fdw *fdw_of(int fd)
{
    if ((size_t)fd >= fdcap) {
        size_t cap = fdcap;
        struct fdw **t;

        if (!atap__fd_open(fd) || !atap__grow_cap(&cap, (size_t)fd))
            return NULL;
        if (!(t = realloc(fdtab, cap * sizeof *t)))
            return NULL;
        memset(t + fdcap, 0, (cap - fdcap) * sizeof *t);
        fdtab = t;
        fdcap = cap;
    }
    if (!fdtab[fd] && (fdtab[fd] = calloc(1, sizeof *fdtab[fd])))
        fdtab[fd]->fd = fd;
    return fdtab[fd];
}

/* ---- fd parks in the slot tail ---------------------------------------------
 *
 * A park on an fd with no deadline, in a task whose output leaves the slot's
 * park tail free, keeps its claim word (with the events wanted and seen) and
 * its fd in the tail and waits on its fdw's `tails` list through the slot's
 * `link`: it costs nothing beyond the slot. Same claim protocol as a park
 * record (claimed from ARMED: the claimant completes; from ARMING: the
 * parker does), and the completer takes it off the list under fd_lock.
 */

/* 1, -1 or 0 as atap__park_claim(), on a tail park; got: the events seen. */
static int tclaim(struct atap_slot *s, int by, unsigned got)
{
    uint32_t c = ld_seqcst(&s->out.park.claim);

    for (;;) {
        uint32_t st = c & T_STATE;
        if (st != P_ARMING && st != P_ARMED)
            return 0;
        if (atomic_compare_exchange_weak_explicit(
                &s->out.park.claim, &c,
                (c & ~(T_STATE | 0xfu << T_GOT_SHIFT)) | got << T_GOT_SHIFT | P_CLAIMED |
                    (uint32_t)by,
                memory_order_acq_rel, memory_order_acquire))
            return st == P_ARMED ? 1 : -1;
    }
}

/* fd_lock held: takes slot index off its fd's tail list. */
static void tail_unlink(uint32_t index)
{
    struct atap_slot *s = atap__table_at(index);
    struct fdw *f = fdtab[ld_relaxed(&s->out.park.fd)];
    uint32_t x = f->tails;

    atomic_fetch_and_explicit(&s->out.park.claim, ~T_LINKED, memory_order_relaxed);
    if (x == index + 1) {
        f->tails = ld_relaxed(link_of(index));
    } else {
        while (ld_relaxed(link_of(x - 1)) != index + 1)
            x = ld_relaxed(link_of(x - 1));
        st_relaxed(link_of(x - 1), ld_relaxed(link_of(index)));
    }
    rewatch(f, true);
}

/* The one claimant's work for a tail fd park (linked: still on its list). */
static void tail_fd_complete(uint32_t index, int by, bool linked)
{
    struct atap_slot *s = atap__table_at(index);

    if (linked) {
        pthread_mutex_lock(&fd_lock);
        tail_unlink(index);
        pthread_mutex_unlock(&fd_lock);
    }
    if (by == BY_READY) { /* the claim stays for the resumed run to read */
        /* (A task claimed aside never parks on an fd in the tail: its link
         * may still chain a queue; tail_fd_park.) */
        atap__pool_submit(index + 1, s->priority, (s->flags & SF_BLOCKING) != 0);
        return;
    }
    st_relaxed(&s->out.park.claim, P_IDLE);
    atap__exec_finish_run(s, index, word_gen(ld_acquire(&s->word)), ATAP_EFAILED);
}

static void tail_timed_arm(struct atap_slot *s, struct atap_ctx *ctx);

static void tail_fd_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint32_t bits = ctx->events << T_WANT_SHIFT | T_FD, c = P_ARMING | bits, w, st;
    bool linked = false;
    struct fdw *f;
    int by = 0;

    if (ctx->deadline != ATAP__FOREVER) {
        tail_timed_arm(s, ctx);
        return;
    }
    atap__exec_hold(s); /* the slot stays ours until we are done (see park_arm) */
    st_relaxed(&s->out.park.fd, (uint32_t)ctx->fd);
    st_seqcst(&s->out.park.claim, c); /* against a canceller */
    pthread_mutex_lock(&fd_lock);
    if (fd_closed) {
        by = BY_OFF;
    } else if (!(f = fdw_of(ctx->fd))) {
        by = BY_READY;
    } else {
        st_relaxed(link_of(ctx->index), f->tails);
        f->tails = ctx->index + 1;
        linked = true;
        if (rewatch(f, false) < 0) { /* not watchable: its next read says why */
            tail_unlink(ctx->index);
            linked = false;
            by = BY_READY;
        }
    }
    pthread_mutex_unlock(&fd_lock);
    if (by)
        tclaim(s, by, by == BY_READY ? ATAP_ERROR : 0);
    /* seq_cst: with the load of the word below, against the canceller's
     * state change and fence before its claim (store against store). */
    if (!atomic_compare_exchange_strong_explicit(&s->out.park.claim, &c, P_ARMED | bits,
                                                 memory_order_seq_cst, memory_order_acquire)) {
        tail_fd_complete(ctx->index, (int)(c & T_STATE & ~P_CLAIMED), linked);
    } else {
        /* A stop before the park could be found. Once armed, the park may
         * already have been claimed and the task parked again (on the wheel,
         * say): act as the canceller does, on whatever park the task is in. */
        w = ld_seqcst(&s->word);
        st = word_state(w);
        if (word_gen(w) == ctx->gen && (st == ST_CANCELLED || st == ST_TIMED_OUT))
            atap__park_interrupt(s, ctx->index, ctx->gen);
    }
    atap__exec_release_listener(s, ctx->index, ctx->gen);
}

static int fd_add(struct park *p)
{
    struct fdw *f;
    int rc = -ENOMEM;

    if (p->kind != PK_FD)
        return atap__source_add(p);
    pthread_mutex_lock(&fd_lock);
    if ((f = fdw_of(p->fd)) != NULL) {
        p->fd_next = f->waiters;
        f->waiters = p;
        p->on_fd = true;
        if ((rc = rewatch(f, false)) < 0) {
            f->waiters = p->fd_next;
            p->on_fd = false;
            rewatch(f, true);
        }
    }
    pthread_mutex_unlock(&fd_lock);
    return rc;
}

static void fd_remove(struct park *p)
{
    if (p->kind != PK_FD) {
        atap__source_remove(p);
        return;
    }
    pthread_mutex_lock(&fd_lock);
    if (p->on_fd) {
        struct park **at = &fdtab[p->fd]->waiters;

        while (*at != p)
            at = &(*at)->fd_next;
        *at = p->fd_next;
        p->on_fd = false;
        rewatch(fdtab[p->fd], true);
    }
    pthread_mutex_unlock(&fd_lock);
}

static void unfile(uint32_t index);

/* The parks an fd's report claimed, to complete once fd_lock is let go:
 * records through fd_next, tail parks through their slots' `link` (off
 * their fd's list now), timed ones apart (the wheel may hold them). */
struct resumes {
    struct park *ready;
    uint32_t tready, ttimed;
};

static unsigned look(int fd, unsigned want);

/* What a park that wants `want` is told of a report of `events` on f. On
 * kqueue an fd's two directions are two filters, and a watch made while the
 * manager waits may wake it between the two: a park told of one direction
 * that wants the other too looks at it itself (poll(2), which does not
 * wait; at most once per report, *seen keeping what it found), so a park
 * on both hears of both, as on epoll and poll, where one report says both. */
static unsigned told(const struct fdw *f, unsigned events, unsigned want, int *seen)
{
#if defined(ATAP_POLLER_KQUEUE)
    unsigned missing = want & EVENT_BITS & ~events;

    if (missing && (want & events & EVENT_BITS)) {
        if (*seen < 0)
            *seen = (int)look(f->fd, EVENT_BITS);
        events |= (unsigned)*seen & missing;
    }
#else
    (void)f, (void)want, (void)seen;
#endif
    return events;
}

/* fd_lock held: claims for READY every park on f that `events` (as the
 * poller reports them) makes ready, and moves it to r. */
static void claim_ready(struct fdw *f, unsigned events, struct resumes *r)
{
    struct park *p, **at;
    int seen = -1;

    for (at = &f->waiters; (p = *at) != NULL;) {
        unsigned got = told(f, events, p->events, &seen);

        /* HUP and ERR mean ready for whatever was asked. */
        /* got first: a claim from ARMING is completed by the parker. */
        if (((p->events & events) || (events & (ATAP_HANGUP | ATAP_ERROR))) &&
            (st_relaxed(&p->got, got), atap__park_claim(p, BY_READY) == 1)) {
            *at = p->fd_next;
            p->on_fd = false;
            p->fd_next = r->ready;
            r->ready = p;
        } else {
            at = &p->fd_next;
        }
    }
    for (uint32_t x = f->tails, prev = 0, next; x; x = next) {
        struct atap_slot *t = atap__table_at(x - 1);
        uint32_t c = ld_acquire(&t->out.park.claim);
        unsigned want = (c >> T_WANT_SHIFT) & 0xfu;

        next = ld_relaxed(link_of(x - 1));
        if (((want & events) || (events & (ATAP_HANGUP | ATAP_ERROR))) &&
            tclaim(t, BY_READY, told(f, events, want, &seen)) == 1) {
            if (prev)
                st_relaxed(link_of(prev - 1), next);
            else
                f->tails = next;
            if (c & T_TIMED) {
                atomic_fetch_and_explicit(&t->out.park.claim, ~T_LINKED, memory_order_relaxed);
                st_relaxed(link_of(x - 1), r->ttimed);
                r->ttimed = x;
            } else {
                st_relaxed(link_of(x - 1), r->tready);
                r->tready = x;
            }
        } else {
            prev = x;
        }
    }
}

/* The manager, fd_lock let go: completes what claim_ready claimed. */
static void complete_ready(struct resumes *r)
{
    struct park *p;

    while (r->tready) {
        uint32_t next = ld_relaxed(link_of(r->tready - 1));
        tail_fd_complete(r->tready - 1, BY_READY, false);
        r->tready = next;
    }
    while (r->ttimed) { /* the manager holds those it filed; the rest it meets
                           in its inbox, claimed, and queues then */
        uint32_t next = ld_relaxed(link_of(r->ttimed - 1));
        if (ld_relaxed(&atap__table_at(r->ttimed - 1)->out.park.claim) & T_FILED) {
            unfile(r->ttimed - 1);
            tail_fd_complete(r->ttimed - 1, BY_READY, false);
        }
        r->ttimed = next;
    }
    while ((p = r->ready) != NULL) {
        r->ready = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
}

void atap__park_event(void *udata, unsigned events, unsigned kind)
{
    struct fdw *f = udata;
    struct resumes r = {0};

    if (atap__source_event(udata, events, kind))
        return;
    pthread_mutex_lock(&fd_lock);
    claim_ready(f, events, &r);
    if (f->waiters || f->tails) /* one-shot: the rest are watched again (failed:
                                   deaf, see the top); with none left the watch
                                   is spent already, and the fd may be closed */
        rewatch(f, true);
    else
        set_deaf(f, false); /* nobody left to hear it */
    pthread_mutex_unlock(&fd_lock);
    complete_ready(&r);
}

/* fd_lock held: the events of `want` that fd is ready for now (poll(2),
 * which does not wait), with HUP and ERR (a closed fd: ERR); 0 for none,
 * or a look that failed. */
static unsigned look(int fd, unsigned want)
{
    struct pollfd pfd = {.fd = fd, .events = atap__poll_interest(want)};

    if (poll(&pfd, 1, 0) != 1)
        return 0;
    return atap__poll_report(pfd.revents);
}

/* The manager, each tick: every deaf fd is watched again (see the top); one
 * whose watch fails again is looked at, and the parks it finds ready are
 * claimed as the poller's report would claim them. The list is taken
 * whole, under fd_lock, before any watch is tried: a watch that fails puts
 * its fd back on the emptied list, for the next tick. */
void atap__park_retry(void)
{
    struct fdw *f, *next;
    struct resumes r = {0};
    unsigned ev;

    if (!ld_relaxed(&deaf_fds))
        return;
    pthread_mutex_lock(&fd_lock);
    f = ld_relaxed(&deaf_fds);
    st_relaxed(&deaf_fds, NULL);
    for (next = f; next; next = next->deaf_next)
        next->deaf = false;
    for (; f; f = next) {
        next = f->deaf_next; /* before a failure links f again */
        if (rewatch(f, true) == 0 || !(ev = look(f->fd, wanted(f))))
            continue;
        claim_ready(f, ev, &r);
        if (!f->waiters && !f->tails)
            set_deaf(f, false); /* nobody left to hear it */
    }
    pthread_mutex_unlock(&fd_lock);
    complete_ready(&r);
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

    TEST_HOOK(ATAP__TEST_PARK_FIRE);
    if (atap__now_ns() >= deadline && claim_from(p, c, BY_DEADLINE, true) == 1)
        atap__park_complete(p, BY_DEADLINE);
}

/* ---- the park wheel (deadline-only parks in the slot) ------------------------ */

#define WHEEL_TICK_SHIFT 16 /* 65.5 us */
#define WHEEL_BITS 16       /* 65536 buckets: 4.3 s a round */
#define WHEEL_N (1u << WHEEL_BITS)
#define INBOX_CLOSED UINT32_MAX

static _Atomic uint32_t inbox; /* slot index + 1 of the newest arm, 0, or CLOSED */
/* Buckets holding a park a stop claimed (a bit each), and whether any is
 * set: the manager visits them at its next run, so a cancelled park's slot
 * goes at once rather than at its deadline. */
static _Atomic uint64_t stop_bits[WHEEL_N / 64];
static _Atomic bool stops_pending;
static struct {                /* the manager's (or, closing, its stopper's) */
    uint32_t head[WHEEL_N];    /* slot index + 1, linked through wnext / wprev */
    uint64_t bits[WHEEL_N / 64];
    uint64_t done; /* every tick up to this one has been gone through */
    bool started;
} wheel;

static bool tail_park(struct atap_slot *s, const struct atap_ctx *ctx)
{
    return ctx->park_kind == PK_UNTIL && ctx->deadline != ATAP__FOREVER && slot_park_tail(s);
}

static bool tail_fd_park(struct atap_slot *s, const struct atap_ctx *ctx)
{
    /* Not for a task a claim aside left a queue entry of (STALE): the fd's
     * list would take over `link` while that queue still chains through it.
     * STALE is set only while the task is queued, so it cannot appear once
     * this run has started. */
    return ctx->park_kind == PK_FD && slot_park_tail(s) &&
           !(ld_acquire(&s->refs) & REFS_STALE);
}

/* Pushes slot index on the wheel's inbox: a parker's last touch of the
 * slot, since the manager may act on it, and free it, at once. False when
 * the wheel is closed: no manager will meet it, so the parker acts. */
static bool wheel_push(uint32_t index)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t head = ld_relaxed(&inbox);

    do {
        if (head == INBOX_CLOSED)
            return false;
        st_relaxed(&s->out.park.wnext, head);
        /* Release: the deadline, claim and link reach the manager. */
    } while (!atomic_compare_exchange_weak_explicit(&inbox, &head, index + 1,
                                                    memory_order_release, memory_order_relaxed));
    if (head == 0)
        atap__manager_wake(); /* it files what it finds and sleeps again */
    return true;
}

static void tail_act(uint32_t index, int by, bool batch);
static uint32_t bucket_of(struct atap_slot *s);

/* A stop claimed a park of the wheel (the caller holds a listener, or is
 * the manager): its bucket is marked for the manager's next run, which acts
 * on what is claimed there (bucket_run). One not filed yet is acted on when
 * the manager takes it in, claimed. Release: the claim comes with the mark. */
static void wheel_stopped(struct atap_slot *s)
{
    uint32_t b = bucket_of(s);

    atomic_fetch_or_explicit(&stop_bits[b / 64], UINT64_C(1) << (b % 64), memory_order_release);
    st_release(&stops_pending, true);
    atap__manager_wake();
}

/* The runner: the park goes on the wheel, which now owns RUN. It is ARMED
 * before it is pushed, and the push is the last we touch of the slot: once
 * pushed, the manager may end it and free the slot at any moment. A stop
 * that came before the ARMED store was visible is claimed here (seq_cst,
 * against the canceller's CAS and fence); one after it claims it itself. */
static void tail_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint32_t w, st;

    st_relaxed(&s->out.park.deadline, ctx->deadline);
    st_seqcst(&s->out.park.claim, P_ARMED);
    w = ld_seqcst(&s->word);
    st = word_state(w);
    if (word_gen(w) == ctx->gen && (st == ST_CANCELLED || st == ST_TIMED_OUT))
        tclaim(s, BY_STOP, 0);
    if (!wheel_push(ctx->index))
        tail_act(ctx->index, BY_OFF, false);
}

/* An fd park with a deadline, in the tail: on its fd's list (through
 * `link`) and on the wheel (through wnext / wprev) at once. The claim is
 * ARMED from the start: any claimant only claims (an fd's event also takes
 * it off the fd's list), and whoever holds it on the wheel acts (tail_act):
 * the manager once it has taken it from the inbox, or this parker when the
 * wheel is closed. The manager handles an fd's event itself, so one that
 * claims a park it has filed takes it out of its bucket and queues it
 * there and then; one it has not filed yet it queues when it takes it in. */
static void tail_timed_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint32_t w, st;
    unsigned got = 0;
    struct fdw *f;
    int by = 0;

    st_relaxed(&s->out.park.fd, (uint32_t)ctx->fd);
    st_relaxed(&s->out.park.deadline, ctx->deadline);
    st_seqcst(&s->out.park.claim, P_ARMED | ctx->events << T_WANT_SHIFT | T_FD | T_TIMED);
    pthread_mutex_lock(&fd_lock);
    if (fd_closed) {
        by = BY_OFF;
    } else if (!(f = fdw_of(ctx->fd))) {
        by = BY_READY, got = ATAP_ERROR;
    } else {
        st_relaxed(link_of(ctx->index), f->tails);
        f->tails = ctx->index + 1;
        atomic_fetch_or_explicit(&s->out.park.claim, T_LINKED, memory_order_relaxed);
        if (rewatch(f, false) < 0) { /* not watchable: its next read says why */
            tail_unlink(ctx->index);
            by = BY_READY, got = ATAP_ERROR;
        }
    }
    pthread_mutex_unlock(&fd_lock);
    if (by)
        tclaim(s, by, got);
    w = ld_seqcst(&s->word); /* a stop before the park could be found */
    st = word_state(w);
    if (word_gen(w) == ctx->gen && (st == ST_CANCELLED || st == ST_TIMED_OUT))
        tclaim(s, BY_STOP, 0);
    if (!wheel_push(ctx->index))
        tail_act(ctx->index, BY_OFF, false);
}

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
static void tail_act(uint32_t index, int by, bool batch)
{
    struct atap_slot *s = atap__table_at(index);
    uint32_t gen = word_gen(ld_acquire(&s->word)), c;

    tclaim(s, by, 0);
    c = ld_acquire(&s->out.park.claim);
    if (c & T_FD) {
        pthread_mutex_lock(&fd_lock);
        if (ld_relaxed(&s->out.park.claim) & T_LINKED)
            tail_unlink(index);
        pthread_mutex_unlock(&fd_lock);
    }
    if ((c & T_STATE) == (P_CLAIMED | BY_DEADLINE) || (c & T_STATE) == (P_CLAIMED | BY_READY)) {
        if (atap__exec_resume_stale(s, index, gen))
            return; /* its old queue entry runs it */
        if (!batch || (s->flags & SF_BLOCKING)) {
            atap__pool_submit(index + 1, s->priority, (s->flags & SF_BLOCKING) != 0);
        } else {
            if (nresumed == RESUME_BATCH)
                wheel_flush();
            resumed[nresumed++] = index + 1;
        }
        return;
    }
    st_relaxed(&s->out.park.claim, P_IDLE);
    atap__exec_finish_run(s, index, gen, ATAP_EFAILED);
}

static uint64_t tick_of(uint64_t ns)
{
    return ns >> WHEEL_TICK_SHIFT;
}

static uint32_t bucket_of(struct atap_slot *s)
{
    return (uint32_t)(tick_of(ld_relaxed(&s->out.park.deadline)) % WHEEL_N);
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
    wheel.bits[b / 64] |= UINT64_C(1) << (b % 64);
    if (ld_relaxed(&s->out.park.claim) & T_FD)
        atomic_fetch_or_explicit(&s->out.park.claim, T_FILED, memory_order_relaxed);
}

/* The manager no longer holds slot index in a bucket. */
static void unfiled(struct atap_slot *s)
{
    if (ld_relaxed(&s->out.park.claim) & T_FD)
        atomic_fetch_and_explicit(&s->out.park.claim, ~T_FILED, memory_order_relaxed);
}

/* Takes slot index out of its bucket (an fd's event claimed it). */
static void unfile(uint32_t index)
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
        wheel.bits[b / 64] &= ~(UINT64_C(1) << (b % 64));
    unfiled(s);
}

/* Goes through bucket b: what is due now leaves (and is acted on), the
 * rest (later rounds) is filed again. by: DEADLINE, or OFF for everything. */
static void bucket_run(uint32_t b, uint64_t now, int by)
{
    uint32_t x = wheel.head[b], due = 0;

    wheel.head[b] = 0;
    wheel.bits[b / 64] &= ~(UINT64_C(1) << (b % 64));
    while (x) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        bool go = by == BY_OFF || ld_relaxed(&s->out.park.deadline) <= now ||
                  (ld_acquire(&s->out.park.claim) & T_STATE) >= P_CLAIMED; /* stopped: free it now */

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
        tail_act(due - 1, by, true);
        due = next;
    }
}

/* Takes in the arms and files them; one whose tick has been gone through
 * already (a deadline past, or in a tick just finished) is due now. */
static void take_inbox(uint64_t now)
{
    uint32_t x = atomic_exchange_explicit(&inbox, 0, memory_order_acquire), due = 0;

    while (x && x != INBOX_CLOSED) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        uint64_t deadline = ld_relaxed(&s->out.park.deadline);

        if (deadline <= now || tick_of(deadline) <= wheel.done ||
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
        tail_act(due - 1, BY_DEADLINE, true);
        due = next;
    }
}

/* The earliest tick after `from` with a bucket in use, as a deadline. */
static uint64_t next_due(uint64_t from)
{
    for (uint64_t t = from + 1, end = from + WHEEL_N; t <= end;) {
        uint32_t b = (uint32_t)(t % WHEEL_N);
        uint64_t word = wheel.bits[b / 64] >> (b % 64);

        if (word)
            return (t + (uint64_t)__builtin_ctzll(word) + 1) << WHEEL_TICK_SHIFT;
        t += 64 - b % 64;
    }
    return ATAP__FOREVER;
}

uint64_t atap__park_wheel_run(uint64_t now)
{
    uint64_t cur = tick_of(now), t;

    if (!wheel.started) {
        wheel.done = cur ? cur - 1 : 0;
        wheel.started = true;
    }
    take_inbox(now);
    if (ld_relaxed(&stops_pending) && atomic_exchange_explicit(&stops_pending, false,
                                                                memory_order_acquire)) {
        for (uint32_t w = 0; w < WHEEL_N / 64; w++) {
            uint64_t bits = ld_relaxed(&stop_bits[w])
                                ? atomic_exchange_explicit(&stop_bits[w], 0, memory_order_acquire)
                                : 0;
            for (; bits; bits &= bits - 1)
                bucket_run(w * 64 + (uint32_t)__builtin_ctzll(bits), now, BY_DEADLINE);
        }
    }
    /* Ticks wholly past: (done, cur). A whole round or more: every bucket. */
    if (cur > wheel.done + 1) {
        uint64_t last = cur - 1;
        for (t = cur - wheel.done - 1 >= WHEEL_N ? last - WHEEL_N + 1 : wheel.done + 1;
             t <= last;) {
            uint32_t b = (uint32_t)(t % WHEEL_N);
            uint64_t word = wheel.bits[b / 64] >> (b % 64);

            if (!word) {
                t += 64 - b % 64;
                continue;
            }
            t += (uint64_t)__builtin_ctzll(word);
            if (t > last)
                break;
            bucket_run((uint32_t)(t % WHEEL_N), now, BY_DEADLINE);
            t++;
        }
        wheel.done = last;
    }
    wheel_flush();
    return next_due(wheel.done);
}

/* No manager will run again: every deadline park ends (its run FAILED),
 * and later arms end their own runs. */
static void wheel_close(void)
{
    uint32_t x = atomic_exchange_explicit(&inbox, INBOX_CLOSED, memory_order_acq_rel);

    while (x && x != INBOX_CLOSED) {
        struct atap_slot *s = atap__table_at(x - 1);
        uint32_t next = ld_relaxed(&s->out.park.wnext);
        file(x - 1);
        x = next;
    }
    for (uint32_t w = 0; w < WHEEL_N / 64; w++)
        while (wheel.bits[w])
            bucket_run(w * 64 + (uint32_t)__builtin_ctzll(wheel.bits[w]), 0, BY_OFF);
    wheel_flush(); /* those an fd's event claimed first */
}

/* ---- arming, resuming, stopping ------------------------------------------ */

/* The task's park record, made on first use (the caller holds RUN). */
static struct park *park_of(struct atap_slot *s)
{
    struct side *side = atap__side_of(s);
    struct park *_Atomic *at, *p;

    if (!side)
        return NULL;
    at = atap__side_park(side);
    if ((p = ld_acquire(at)) != NULL)
        return p;
    if (!(p = calloc(1, sizeof *p)))
        return NULL;
    atap__timer_init(&p->timer, fire_deadline);
    st_release(at, p); /* only the task's runner ever installs it */
    return p;
}

void atap__park_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    struct park *p;
    uint32_t c, st, w;
    bool closed;
    int by = 0;

    ATAP_TRACE(TR_PARK, ATAP_TRACE_ID(ctx->index, ctx->gen), NULL, ctx->park_kind);
    if (tail_park(s, ctx)) {
        tail_arm(s, ctx);
        return;
    }
    if (tail_fd_park(s, ctx)) {
        tail_fd_arm(s, ctx);
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
    if (p->kind != PK_UNTIL && p->kind != PK_WAKE && ld_relaxed(&p->claim) == (p->seq | P_ARMING) &&
        fd_add(p) < 0) {
        st_relaxed(&p->got, ATAP_ERROR); /* not watchable: its next read says why */
        atap__park_claim(p, BY_READY);
    }
    if (p->timed && ld_relaxed(&p->claim) == (p->seq | P_ARMING)) {
        p->ever_timed = true;
        if (atap__timer_arm(atap__manager_timers(), &p->timer, ctx->deadline))
            atap__manager_wake();
        TEST_HOOK(ATAP__TEST_PARK_TIMED);
    }
    c = p->seq | P_ARMING;
    /* seq_cst: store against store with a waker (its woken store, then its
     * claim load) and with a canceller (its state change and fence, then its
     * claim), each read back below. */
    if (!atomic_compare_exchange_strong_explicit(&p->claim, &c, p->seq | P_ARMED,
                                                 memory_order_seq_cst, memory_order_acquire)) {
        atap__park_complete(p, (int)(P_STATE(c) & ~P_CLAIMED)); /* claimed while we armed it */
    } else if (ctx->park_kind == PK_WAKE && ld_seqcst(&p->woken)) {
        /* A wake that came before the park was armed (atap__park_wake).
         * The flag goes only with a claim won: a stop that claims first
         * finds it and hands the wake on (atap__park_complete). */
        if (atap__park_claim(p, BY_READY) == 1) {
            st_seqcst(&p->woken, 0);
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

    if (slot_park_tail(s)) {
        c = ld_acquire(&s->out.park.claim);
        if ((c & T_STATE) == (P_CLAIMED | BY_DEADLINE) || (c & T_STATE) == (P_CLAIMED | BY_READY)) {
            st_relaxed(&s->out.park.claim, P_IDLE);
            ctx->resumed = (uint8_t)(c & T_STATE & ~P_CLAIMED);
            ctx->events = (c >> T_GOT_SHIFT) & 0xfu;
            return true;
        }
    }
    if (!(side = ld_acquire(&s->side)) || !(p = ld_acquire(atap__side_park(side))))
        return false;
    c = P_STATE(ld_acquire(&p->claim));
    if (c != (P_CLAIMED | BY_READY) && c != (P_CLAIMED | BY_DEADLINE))
        return false;
    ctx->gen = p->gen;
    ctx->resumed = (uint8_t)(c & ~P_CLAIMED);
    ctx->events = ld_relaxed(&p->got);
    ctx->woke = p->kind == PK_WAKE;
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
     * run (see the top), and off its fd's list at once if it has one. */
    if (slot_park_tail(s) && tclaim(s, BY_STOP, 0) == 1) {
        uint32_t c = ld_relaxed(&s->out.park.claim);
        if ((c & (T_FD | T_TIMED)) == T_FD) {
            tail_fd_complete(index, BY_STOP, true);
        } else {
            if (c & T_TIMED) {
                pthread_mutex_lock(&fd_lock);
                if (ld_relaxed(&s->out.park.claim) & T_LINKED)
                    tail_unlink(index);
                pthread_mutex_unlock(&fd_lock);
            }
            wheel_stopped(s);
        }
    }
    /* The side record and its park belong to this incarnation of the slot
     * (they go with it), and the caller holds a listener: p is this
     * task's, and its fields are read only after a claim, which acquires
     * what the parker wrote before ARMING. */
    if ((side = ld_acquire(&s->side)) != NULL && (p = ld_acquire(atap__side_park(side))) &&
        atap__park_claim(p, BY_STOP) == 1)
        atap__park_complete(p, BY_STOP);
    atap__pool_interrupt((uint64_t)gen << 32 | index);
}

bool atap__park_parked(struct atap_slot *s)
{
    struct side *side;
    struct park *p;
    uint32_t c;

    /* A free slot's tail reads "not parked" (executor.c's destroy), and the
     * listener the caller holds keeps this task's side record. */
    if (slot_park_tail(s)) {
        c = ld_acquire(&s->out.park.claim) & T_STATE;
        if (c == P_ARMING || c == P_ARMED)
            return true;
    }
    if (!(side = ld_acquire(&s->side)) || !(p = ld_acquire(atap__side_park(side))))
        return false;
    c = P_STATE(ld_acquire(&p->claim));
    return c == P_ARMING || c == P_ARMED;
}

/* ---- the manager's side -------------------------------------------------- */

void atap__park_open(void)
{
    uint32_t closed = INBOX_CLOSED;

    atomic_compare_exchange_strong(&inbox, &closed, 0);
    wheel.started = false;
    pthread_mutex_lock(&fd_lock);
    fd_closed = false;
    pthread_mutex_unlock(&fd_lock);
    pthread_mutex_lock(&reg_lock);
    reg_closed = false;
    pthread_mutex_unlock(&reg_lock);
}

/* Between two managers' lives (the supervisor calls it; no manager runs).
 * A manager that died between its wait and handing out what the wait
 * reported took those reports with it, and the one-shot watches they spent
 * stay disarmed. Watched again, each fd is looked at afresh by the kernel
 * (level-triggered), so the next manager hears of everything still ready;
 * the sources read what they hold (a signal's pending flag outlives its
 * pipe byte, and inotify keeps what was not read). No parked task is run for
 * nothing, and deadlines need nothing: their wheels belong to the runtime. */
void atap__park_rearm(void)
{
    pthread_mutex_lock(&fd_lock);
    for (size_t fd = 0; fd < fdcap; fd++)
        if (fdtab[fd] && (fdtab[fd]->waiters || fdtab[fd]->tails))
            rewatch(fdtab[fd], true);
    pthread_mutex_unlock(&fd_lock);
    atap__sources_rearm();
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

/* No manager: every tail fd park ends, and later ones end at once. */
static void tails_close(void)
{
    uint32_t off = 0;

    pthread_mutex_lock(&fd_lock);
    fd_closed = true;
    while (ld_relaxed(&deaf_fds)) /* no tick will retry them, and none is marked now */
        set_deaf(ld_relaxed(&deaf_fds), false);
    for (size_t fd = 0; fd < fdcap; fd++) {
        struct fdw *f = fdtab[fd];
        for (uint32_t x = f ? f->tails : 0, prev = 0, next; x; x = next) {
            struct atap_slot *t = atap__table_at(x - 1);
            next = ld_relaxed(link_of(x - 1));
            if (ld_relaxed(&t->out.park.claim) & T_TIMED) {
                prev = x; /* the wheel's: wheel_close, or its parker, ends it */
            } else if (tclaim(t, BY_OFF, 0) == 1) {
                if (prev)
                    st_relaxed(link_of(prev - 1), next);
                else
                    f->tails = next;
                st_relaxed(link_of(x - 1), off);
                off = x;
            } else {
                prev = x; /* claimed while arming: its parker ends it */
            }
        }
    }
    pthread_mutex_unlock(&fd_lock);
    while (off) {
        uint32_t next = ld_relaxed(link_of(off - 1));
        tail_fd_complete(off - 1, BY_OFF, false);
        off = next;
    }
}

void atap__park_close_all(void)
{
    struct park *p;
    int r;

    wheel_close();
    tails_close();
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
    if (!p->ever_timed || (atap__manager_gone() && !atap__timer_held(&p->timer)) ||
        atap__manager_stopped()) {
        free(p);
        return;
    }
    if (atap__manager_accepting()) /* let go of at the next run (schedule.c) */
        atap__timer_forget(atap__manager_timers(), &p->timer);
    do
        p->grave_next = head;
    while (!atomic_compare_exchange_weak_explicit(&graveyard, &head, p, memory_order_release,
                                                  memory_order_relaxed));
}

void atap__park_reap(bool all)
{
    struct park *p = atomic_exchange_explicit(&graveyard, NULL, memory_order_acquire), *next;

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

void atap__park_block(struct atap_ctx *ctx)
{
    int rc = atap__plain_wait(ctx->deadline, false, ctx->park_kind == PK_FD ? ctx->fd : -1,
                        ctx->events);

    ctx->resumed = ctx->park_kind == PK_FD && rc != ATAP_ENOTREADY ? BY_READY : BY_DEADLINE;
    ctx->events = rc > 0 ? (unsigned)rc : rc < 0 && rc != ATAP_ENOTREADY ? ATAP_ERROR : 0;
    ctx->park_kind = 0;
}

/* ---- parks woken by the runtime's own tasks (channels) ----------------------- */

static int ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline);

bool atap__park_prepare(struct atap_ctx *ctx)
{
    return ctx && ctx->slot && park_of(ctx->slot) != NULL;
}

int atap__park_wait_wake(struct atap_ctx *ctx, uint64_t deadline)
{
    return ask(ctx, PK_WAKE, -1, 0, deadline);
}

/*
 * Wakes the task (index, gen) parked, or about to park, by
 * atap__park_wait_wake. The flag first, then the claim: a parker that armed
 * before our flag is claimed here; one that arms after sees the flag (both
 * seq_cst). Whoever takes the flag back to 0 acts, so a wake acts once. A
 * wake for a task that is not waiting makes its next wait return at once
 * (a spurious wake: the channel tasks look again).
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
    if (live && (side = ld_acquire(&s->side)) != NULL &&
        (p = ld_acquire(atap__side_park(side)))) {
        atomic_store_explicit(&p->woken, 1, memory_order_seq_cst);
        c = P_STATE(ld_seqcst(&p->claim));
        if (c == P_ARMED && atomic_exchange_explicit(&p->woken, 0, memory_order_seq_cst)) {
            int r = atap__park_claim(p, BY_READY);
            if (r == 1)
                atap__park_complete(p, BY_READY);
            c = r ? P_CLAIMED | BY_READY : P_STATE(ld_acquire(&p->claim));
        }
        /* Taken down by a cancel, a timeout or a shutdown: it will not look
         * again, so the wake did not reach anyone. */
        if (c == (P_CLAIMED | BY_STOP) || c == (P_CLAIMED | BY_OFF))
            live = false;
    }
    atap__exec_release_listener(s, index, gen);
    return live;
}

/* ---- asking for a park ---------------------------------------------------- */

static int ask(atap_ctx *ctx, int kind, int fd, unsigned events, uint64_t deadline)
{
    if (!ctx || (!ctx->slot && !ctx->in_block) || ctx->park_kind)
        return ATAP_EINVAL;
    ctx->park_kind = (uint8_t)kind;
    ctx->fd = fd;
    ctx->events = events;
    ctx->deadline = deadline;
    return 0;
}

int atap_park_fd(atap_ctx *ctx, int fd, unsigned events, uint64_t timeout_ns)
{
    if (fd < 0 || !events || (events & ~EVENT_BITS))
        return ATAP_EINVAL;
    return ask(ctx, PK_FD, fd, events, atap__deadline(atap__now_ns(), timeout_ns));
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
    case SIGKILL: case SIGSTOP: case SIGSEGV: case SIGBUS: case SIGFPE: case SIGILL:
    case SIGTRAP: case SIGSYS:
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
    return ask(ctx, PK_SIGNAL, signo, 0, atap__deadline(atap__now_ns(), timeout_ns));
}

int atap__park_signal_since(atap_ctx *ctx, int signo, uint64_t seen, uint64_t timeout_ns)
{
    unsigned since = ATAP__SIG_SINCE | ((unsigned)seen & ATAP__SIG_SEEN_MASK);

    if (!atap__signal_catchable(signo) || (ctx && ctx->in_block))
        return ATAP_EINVAL;
    return ask(ctx, PK_SIGNAL, signo, since, atap__deadline(atap__now_ns(), timeout_ns));
}

int atap_park_path(atap_ctx *ctx, int fd, unsigned changes, uint64_t timeout_ns)
{
    if (!atap__source_paths())
        return -ENOTSUP; /* the poll backend off Linux */
    if (fd < 0 || !changes || (changes & ~(ATAP_PATH_WRITE | ATAP_PATH_ATTRIB |
                                           ATAP_PATH_ENTRIES | ATAP_PATH_GONE)))
        return ATAP_EINVAL;
    if (ctx && ctx->in_block)
        return ATAP_EINVAL;
    return ask(ctx, PK_PATH, fd, changes | ATAP_PATH_GONE,
               atap__deadline(atap__now_ns(), timeout_ns));
}

bool atap_resumed(atap_ctx *ctx)
{
    return ctx && ctx->resumed != 0;
}

int atap_resume_reason(atap_ctx *ctx)
{
    return ctx ? ctx->resumed : 0;
}

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
    fd_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    reg_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    fd_closed = false;
    fdtab = NULL;
    fdcap = 0;
    st_relaxed(&deaf_fds, NULL);
    armed_parks = NULL;
    reg_closed = false;
    st_relaxed(&inbox, 0);
    memset(stop_bits, 0, sizeof stop_bits);
    st_relaxed(&stops_pending, false);
    memset(&wheel, 0, sizeof wheel);
    nresumed = 0;
    st_relaxed(&graveyard, NULL);
    mourning = NULL;
}

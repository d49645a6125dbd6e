/*
 * Parks on fds (atap_park_fd). park.c owns the parks and their claims; this
 * file keeps each parked fd watched on the hub's io poller (hub.h) and turns
 * what it reports of it into claims on the parks waiting for it, on the
 * thread that read the report: an idle worker waiting on io, a busy one
 * looking between runs (pool_io.c), or the manager at its tick. Only the
 * park wheel's holder (park_wheel.c's seat: the manager while awake, or a
 * worker firing what is due) takes a park out of the wheel, so a timed park
 * in the tail that another thread's report claims is not queued there: its
 * wheel bucket is marked, under fd_lock (which the holder takes before it
 * acts on a park of an fd, so the slot cannot go meanwhile), and the
 * manager, woken, queues it as it does a park a cancel claimed.
 *
 * What it keeps, under fd_lock: an fd with parks on it not yet claimed is
 * watched one-shot for what they want (or its report is on its way to be
 * handed out), or it is deaf and the next tick watches it again; a manager's
 * death spends watches, and atap__park_rearm renews them all. A park leaves
 * its fd's list only once claimed, by whoever completes it, or at its join,
 * when its own watch fails.
 *
 * Several parks on one fd share a `struct fdw` (one per fd number, kept for
 * the process's life, since the poller may still report it, and made a chunk
 * at a time; a fork's child forgets them with the poller,
 * atap__park_forget): its waiter list and the union of their events, watched
 * one-shot on the hub's io and watched again after each event with what is
 * still wanted.
 *
 * An fd whose watch fails (the kernel out of memory, say) is deaf: after a
 * report its one-shot watch is spent, so nothing says the parks still
 * waiting on it will be told of it again. rewatch() puts such an fdw on
 * deaf_fds, under fd_lock, the lock of its waiter list and of every watch of
 * it, and every manager tick (atap__park_retry) watches each deaf fd again,
 * under fd_lock too. A watch that holds is level-triggered: it reports what
 * is ready now, so nothing is lost, only late by a tick at most. One that
 * fails again leaves the fd deaf for the next tick, and the tick looks at
 * the fd itself (poll(2), which does not wait) and claims the parks it finds
 * ready as a report would have (a closed fd reads ERR: its parks resume with
 * ATAP_ERROR rather than wait for a watch that can never hold). The tick
 * claims through the same CAS as anyone, so a park a cancel, a deadline or a
 * report took is not claimed again, and whoever won takes it off the list
 * under fd_lock, which watches the fd again for the rest; it runs on the
 * manager thread, which takes a timed park out of the wheel when it holds
 * the wheel's seat, and marks its bucket when not. A mark never outlives its
 * fd's parks: any watch of the fd that holds, or that finds nobody left to
 * watch for, and a report that leaves nobody on the fd, take it off the
 * list; and the list holds only fds whose last watch failed, so a tick with
 * none deaf costs one relaxed load. A joining park's own watch that fails
 * resumes that park at once with ATAP_ERROR, and the watch then renewed for
 * the others decides whether the fd is deaf. The list outlives a manager's
 * death: the restart's watch of every parked fd (atap__park_rearm) clears or
 * keeps each mark, and the next manager's ticks go on. Once no manager will
 * run again (fd_closed, set with the list emptied under fd_lock) no fd is
 * marked: every park is being written off, and no tick would retry. All of
 * this is park_fd.c's, so every backend behaves alike.
 *
 * A park on an fd with a deadline, in the slot tail, is on both its fd's
 * list and the park wheel (park_wheel.c); tail_timed_arm says how the two
 * meet.
 *
 * Kept fds (atap_fd_keep) are watched edge-triggered (the poller's kept
 * watch) from the keep to atap_fd_unkeep, whether parks wait on them or not,
 * so a park on one makes no system call. Their reports say what fd has
 * become ready for, not what it is: a report's directions that no park took
 * (claim_ready's `taken`) wait in `ready`, and the next park that wants one
 * takes it at once (take_ready) instead of joining the list; HUP and ERR
 * stay there for good. Reports and joins both hold fd_lock, so a report
 * either finds a park on the list and claims it or leaves its bits for the
 * park to find: no edge falls between the two. What a park took is gone for
 * every later park, which is why a kept fd is for one waiter a direction at
 * a time (atap.h). The watch asks for READ from the keep and for WRITE from
 * the first park that wants it (kept_ev only grows: a watch made again
 * reports what fd is ready for then, which can only add to `ready`, never
 * hide a change). It is made again for that, or renewed, as one-shot watches
 * are, after a manager's death (its last reports died with it) and at each
 * tick while deaf. A report still on its way after an unkeep finds the fd
 * not kept and is taken as a one-shot one (records outlive it: the top). The
 * poll backend has no kept watch: there a keep leaves the fd one-shot.
 */
#include "park.h"
#include "park_int.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "executor.h"
#include "faults.h"
#include "hub.h"
#include "poller.h"
#include "pool.h"
#include "side.h"
#include "slot.h"
#include "table.h"
#include "wait.h"

_Static_assert(ATAP_READABLE == ATAP__POLL_READ && ATAP_WRITABLE == ATAP__POLL_WRITE &&
                   ATAP_HANGUP == ATAP__POLL_HUP && ATAP_ERROR == ATAP__POLL_ERR,
               "public event bits are the poller's");

struct fdw {
    int fd;
    bool deaf;             /* fd_lock: its last watch failed; on deaf_fds (see the top) */
    bool kept;             /* fd_lock: atap_fd_keep'd, watched edge-triggered (see kept fds) */
    uint8_t kept_ev;       /* kept: the directions its watch asks for; it only grows */
    uint8_t ready;         /* kept: what reports said and no park has taken yet */
    struct fdw *deaf_next; /* deaf_fds, fd_lock */
    struct park *waiters;  /* parks with a record (park.c's struct park) */
    uint32_t tails;        /* parks in the slot tail: slot index + 1, on `link` */
};

static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;
static bool fd_closed; /* fd_lock: no manager will run again */
/* The records, by fd number, in chunks of FD_CHUNK made as needed and
 * never moved (a record is the poller's udata): fdtab[fd / FD_CHUNK]. */
#define FD_CHUNK 256
static struct fdw **fdtab;
static size_t fdchunks;
/* The deaf fds (see the top): written under fd_lock only; the tick's
 * unlocked look at the head is only a filter (relaxed: what it finds it
 * reads again under fd_lock, and a head it misses it meets at its next
 * tick). */
static struct fdw *_Atomic deaf_fds;

/* ---- fds ----------------------------------------------------------------- */

static _Atomic uint32_t *link_of(uint32_t index) { return &atap__table_at(index)->link; }

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
        uint32_t c = ld_relaxed(tail_claim(atap__table_at(x - 1)));
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

/* Why rewatch() is called: a park joining the fd (its own watch); the
 * parks already waiting, after a report or a park leaving; or a renewal, a
 * watch made afresh whatever it had (a restart, a tick's retry). A fault
 * may be injected in the last two, not in a joining park's own. */
enum { W_JOIN, W_AGAIN, W_RENEW };

/* fd_lock held: the fd's watch follows its waiters; one that fails leaves
 * the fd deaf, unless no manager will run again (see the top). A kept fd's
 * watch stays as it is (kept fds, below), but for a direction a joining
 * park wants that it lacks (added for good), or a renewal. */
static int rewatch(struct fdw *f, int why)
{
    struct atap_poller *mp = atap__hub_io();
    unsigned ev = wanted(f);
    int rc = 0;

    if (f->kept) {
        unsigned want = f->kept_ev | ev;

        if (why != W_RENEW && want == f->kept_ev)
            return 0;
        rc = why != W_JOIN && FAULT_WATCH_FAILS() ? -ENOMEM
                                                  : atap__poller_watch_kept(mp, f->fd, want, f);
        if (rc == 0)
            f->kept_ev = (uint8_t)want;
        /* Failed, the fd is deaf even after a joining park's own watch
         * (which then resumes with ATAP_ERROR): kqueue lets go of both
         * filters then, and the tick's renewal puts them back. */
    } else if (ev) {
        rc = why != W_JOIN && FAULT_WATCH_FAILS() ? -ENOMEM : atap__poller_watch(mp, f->fd, ev, f);
    } else {
        atap__poller_unwatch(mp, f->fd); /* -EBADF for a closed fd: nothing to undo */
    }
    set_deaf(f, rc != 0 && !fd_closed);
    return rc;
}

/* fd_lock held: fd's record, NULL if none was ever made. */
static struct fdw *fdw_at(size_t fd)
{
    size_t c = fd / FD_CHUNK;

    return c < fdchunks && fdtab[c] ? &fdtab[c][fd % FD_CHUNK] : NULL;
}

/* fd_lock held: fd's record, made if need be. NULL (the park then resumes
 * with ATAP_ERROR) for no memory, or a closed fd beyond the table. */
static struct fdw *fdw_of(int fd)
{
    size_t c = (size_t)fd / FD_CHUNK;

    if (c >= fdchunks) {
        size_t cap = fdchunks;
        struct fdw **t;

        if (!atap__fd_open(fd) || !atap__grow_cap(&cap, c))
            return NULL;
        /* t is an array of chunk pointers: sizeof *t is a pointer's. */
        if (!(t = realloc(fdtab, cap * sizeof *t))) // NOLINT(bugprone-sizeof-expression)
            return NULL;
        memset(t + fdchunks, 0, (cap - fdchunks) * sizeof *t); // NOLINT(bugprone-sizeof-expression)
        fdtab = t;
        fdchunks = cap;
    }
    if (!fdtab[c]) {
        if (!(fdtab[c] = calloc(FD_CHUNK, sizeof *fdtab[c])))
            return NULL;
        for (size_t i = 0; i < FD_CHUNK; i++)
            fdtab[c][i].fd = (int)(c * FD_CHUNK + i);
    }
    return &fdtab[c][fd % FD_CHUNK];
}

/* fd_lock held: what a park that wants `want` on f is told at once, 0 for
 * nothing: on a kept fd, the directions it wants that a report said since
 * a park last took them (taken now), with a hang-up or an error (which
 * last: they stay for every later park). */
static unsigned take_ready(struct fdw *f, unsigned want)
{
    unsigned got = f->kept ? f->ready & (want | ATAP_HANGUP | ATAP_ERROR) : 0;

    f->ready &= (uint8_t) ~(got & EVENT_BITS);
    return got;
}

/* ---- fd parks in the slot tail ---------------------------------------------
 *
 * A park on an fd with no deadline keeps its claim word (with the events
 * wanted and seen) and its fd in what the task's output leaves of the
 * slot's output area (an output of up to 8 bytes: nothing beyond the slot;
 * a larger one: on the side record, park_int.h's tail_claim) and waits on
 * its fdw's `tails` list through the slot's `link`. Same claim protocol as a park
 * record (claimed from ARMED: the claimant completes; from ARMING: the
 * parker does), and the completer takes it off the list under fd_lock.
 */

/* 1, -1 or 0 as atap__park_claim(), on a tail park; got: the events seen,
 * kept in the word with the claim. seq_cst load: as atap__park_claim's. */
int atap__park_tclaim(struct atap_slot *s, int by, unsigned got)
{
    return atap__park_claim_word(tail_claim(s), ld_seqcst(tail_claim(s)), by, 0,
                                 0xfu << T_GOT_SHIFT, (uint32_t)got << T_GOT_SHIFT);
}

/* A tail fd park's fd: in the tail, or on the side record when the output
 * leaves no room; for a timed one (whose tail holds the wheel's links and
 * its tick), in the claim word or on the side record. */
static int tail_fd(struct atap_slot *s)
{
    uint32_t c = ld_relaxed(tail_claim(s));

    if (!(c & T_TIMED))
        return slot_tail_room(s, TAIL_FD) ? (int)ld_relaxed(&s->out.park.where) : slot_side(s)->fd;
    return c >> T_FD_SHIFT ? (int)(c >> T_FD_SHIFT) - 1 : slot_side(s)->fd;
}

/* fd_lock held: takes slot index off its fd's tail list. */
static void tail_unlink(uint32_t index)
{
    struct atap_slot *s = atap__table_at(index);
    struct fdw *f = fdw_at((size_t)tail_fd(s));
    uint32_t x = f->tails;

    and_relaxed(tail_claim(s), ~T_LINKED);
    if (x == index + 1) {
        f->tails = ld_relaxed(link_of(index));
    } else {
        while (ld_relaxed(link_of(x - 1)) != index + 1)
            x = ld_relaxed(link_of(x - 1));
        st_relaxed(link_of(x - 1), ld_relaxed(link_of(index)));
    }
    rewatch(f, W_AGAIN);
}

/* fd_lock taken here: a tail fd park comes off its fd's list if it is still
 * on it (T_LINKED). */
void atap__park_tail_off_fd(struct atap_slot *s, uint32_t index)
{
    pthread_mutex_lock(&fd_lock);
    if (ld_relaxed(tail_claim(s)) & T_LINKED)
        tail_unlink(index);
    pthread_mutex_unlock(&fd_lock);
}

/* The one claimant's work for a tail fd park (linked: still on its list). */
void atap__park_tail_fd_complete(uint32_t index, int by, bool linked)
{
    struct atap_slot *s = atap__table_at(index);

    if (linked) {
        pthread_mutex_lock(&fd_lock);
        tail_unlink(index);
        pthread_mutex_unlock(&fd_lock);
    }
    if (by == BY_READY) { /* the claim stays for the resumed run to read */
        /* (A task claimed aside never parks on an fd in the tail: its link
         * may still chain a queue; park.c's tail_fd_park.) */
        atap__park_requeue(s, index);
        return;
    }
    st_relaxed(tail_claim(s), P_IDLE);
    atap__exec_finish_run(s, index, word_gen(ld_acquire(&s->word)), ATAP_EFAILED);
}

static void tail_timed_arm(struct atap_slot *s, struct atap_ctx *ctx);

void atap__park_tail_fd_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint32_t bits = ctx->events << T_WANT_SHIFT | T_FD, c = P_ARMING | bits, w, st;
    unsigned got = ATAP_ERROR;
    bool linked = false;
    struct fdw *f;
    int by = 0;

    if (ctx->deadline != ATAP__FOREVER) {
        tail_timed_arm(s, ctx);
        return;
    }
    atap__exec_hold(s); /* the slot stays ours until we are done (see atap__park_arm) */
    if (slot_tail_room(s, TAIL_FD))
        st_relaxed(&s->out.park.where, (uint32_t)ctx->fd);
    else
        slot_side(s)->fd = ctx->fd; /* made by park.c's tail_fd_park */
    st_seqcst(tail_claim(s), c);    /* against a canceller */
    pthread_mutex_lock(&fd_lock);
    if (fd_closed) {
        by = BY_OFF;
    } else if (!(f = fdw_of(ctx->fd))) {
        by = BY_READY;
    } else if ((got = take_ready(f, ctx->events)) != 0) {
        by = BY_READY; /* told already */
    } else {
        st_relaxed(link_of(ctx->index), f->tails);
        f->tails = ctx->index + 1;
        linked = true;
        if (rewatch(f, W_JOIN) < 0) { /* not watchable: its next read says why */
            tail_unlink(ctx->index);
            linked = false;
            by = BY_READY, got = ATAP_ERROR;
        }
    }
    pthread_mutex_unlock(&fd_lock);
    if (by)
        atap__park_tclaim(s, by, by == BY_READY ? got : 0);
    /* seq_cst: with the load of the word below, against the canceller's
     * state change and fence before its claim (store against store). */
    if (!cas_seqcst(tail_claim(s), &c, P_ARMED | bits)) {
        atap__park_tail_fd_complete(ctx->index, (int)(c & T_STATE & ~P_CLAIMED), linked);
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

/* An fd park with a deadline, in the tail: on its fd's list (through
 * `link`) and on the wheel (through wnext / wprev) at once. The claim is
 * ARMED from the start: any claimant only claims (an fd's event also takes
 * it off the fd's list), and whoever holds it on the wheel acts (atap__park_tail_act):
 * the manager once it has taken it from the inbox, or this parker when the
 * wheel is closed. An fd's event the manager reads itself (at its tick)
 * takes a park it has filed out of its bucket and queues it there and
 * then; one read on another thread marks the park's bucket for it (see
 * the top); one it has not filed yet it queues when it takes it in. */
static void tail_timed_arm(struct atap_slot *s, struct atap_ctx *ctx)
{
    uint32_t w, st, fd1 = 0;
    unsigned got = 0;
    struct fdw *f;
    int by = 0;

    if (ctx->fd < T_FD_SMALL)
        fd1 = (uint32_t)ctx->fd + 1;
    else
        slot_side(s)->fd = ctx->fd; /* made by park.c's tail_fd_park */
    st_relaxed(&s->out.park.where, atap__park_tick(ctx->deadline));
    st_seqcst(tail_claim(s),
              P_ARMED | ctx->events << T_WANT_SHIFT | T_FD | T_TIMED | fd1 << T_FD_SHIFT);
    pthread_mutex_lock(&fd_lock);
    if (fd_closed) {
        by = BY_OFF;
    } else if (!(f = fdw_of(ctx->fd))) {
        by = BY_READY, got = ATAP_ERROR;
    } else if ((got = take_ready(f, ctx->events)) != 0) {
        by = BY_READY; /* told already */
    } else {
        st_relaxed(link_of(ctx->index), f->tails);
        f->tails = ctx->index + 1;
        or_relaxed(tail_claim(s), T_LINKED);
        if (rewatch(f, W_JOIN) < 0) { /* not watchable: its next read says why */
            tail_unlink(ctx->index);
            by = BY_READY, got = ATAP_ERROR;
        }
    }
    pthread_mutex_unlock(&fd_lock);
    if (by)
        atap__park_tclaim(s, by, got);
    w = ld_seqcst(&s->word); /* a stop before the park could be found */
    st = word_state(w);
    if (word_gen(w) == ctx->gen && (st == ST_CANCELLED || st == ST_TIMED_OUT))
        atap__park_tclaim(s, BY_STOP, 0);
    if (!atap__park_wheel_push(ctx->index, ctx->deadline))
        atap__park_tail_act(ctx->index, BY_OFF, false);
}

/* The fd kind's join (struct park_kind): the record joins its fd's list
 * and watch. */
static int fd_join(struct park *p)
{
    struct fdw *f;
    unsigned got;
    int rc = -ENOMEM;

    pthread_mutex_lock(&fd_lock);
    if ((f = fdw_of(p->fd)) != NULL && (got = take_ready(f, p->events)) != 0) {
        st_relaxed(&p->got, got); /* told already: claimed from ARMING, its parker completes it */
        atap__park_claim(p, BY_READY);
        rc = 0;
    } else if (f) {
        p->fd_next = f->waiters;
        f->waiters = p;
        p->on_fd = true;
        if ((rc = rewatch(f, W_JOIN)) < 0) {
            f->waiters = p->fd_next;
            p->on_fd = false;
            rewatch(f, W_AGAIN);
        }
    }
    pthread_mutex_unlock(&fd_lock);
    return rc;
}

/* The fd kind's leave: off its fd's list, if still on it. */
static void fd_leave(struct park *p)
{
    pthread_mutex_lock(&fd_lock);
    if (p->on_fd) {
        struct park **at = &fdw_at((size_t)p->fd)->waiters;

        while (*at != p)
            at = &(*at)->fd_next;
        *at = p->fd_next;
        p->on_fd = false;
        rewatch(fdw_at((size_t)p->fd), W_AGAIN);
    }
    pthread_mutex_unlock(&fd_lock);
}

/* The parks an fd's report claimed, to complete once fd_lock is let go:
 * records through fd_next, tail parks through their slots' `link` (off
 * their fd's list now), timed ones apart (the wheel may hold them). */
struct resumes {
    struct park *ready;
    uint32_t tready, ttimed;
    bool holder; /* the wheel's holder (the manager): timed parks are its own */
    bool marked; /* not the holder: a timed park's bucket was marked for it */
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
 * poller reports them) makes ready, and moves it to r. Returns the
 * directions of `events` that a park claimed here wanted (taken). */
static unsigned claim_ready(struct fdw *f, unsigned events, struct resumes *r)
{
    struct park *p, **at;
    unsigned taken = 0;
    int seen = -1, won;

    for (at = &f->waiters; (p = *at) != NULL;) {
        unsigned got = told(f, events, p->events, &seen);

        /* HUP and ERR mean ready for whatever was asked. */
        /* got first: a claim from ARMING is completed by the parker. */
        won = ((p->events & events) || (events & (ATAP_HANGUP | ATAP_ERROR)))
                  ? (st_relaxed(&p->got, got), atap__park_claim(p, BY_READY))
                  : 0;
        if (won)
            taken |= p->events & events;
        if (won == 1) {
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
        uint32_t c = ld_acquire(tail_claim(t));
        unsigned want = (c >> T_WANT_SHIFT) & 0xfu;

        next = ld_relaxed(link_of(x - 1));
        won = ((want & events) || (events & (ATAP_HANGUP | ATAP_ERROR)))
                  ? atap__park_tclaim(t, BY_READY, told(f, events, want, &seen))
                  : 0;
        if (won)
            taken |= want & events;
        if (won == 1) {
            if (prev)
                st_relaxed(link_of(prev - 1), next);
            else
                f->tails = next;
            if (c & T_TIMED) {
                and_relaxed(tail_claim(t), ~T_LINKED);
                if (r->holder) {
                    st_relaxed(link_of(x - 1), r->ttimed);
                    r->ttimed = x;
                } else { /* the wheel's holder queues it (see the top). Under
                            fd_lock, which a holder acting on it takes first
                            (atap__park_tail_off_fd): the slot is still its */
                    atap__park_wheel_mark(t);
                    r->marked = true;
                }
            } else {
                st_relaxed(link_of(x - 1), r->tready);
                r->tready = x;
            }
        } else {
            prev = x;
        }
    }
    return taken;
}

/* fd_lock let go: completes what claim_ready claimed (timed parks only on
 * the wheel's holder). */
static void complete_ready(struct resumes *r)
{
    struct park *p;

    while (r->tready) {
        uint32_t next = ld_relaxed(link_of(r->tready - 1));
        atap__park_tail_fd_complete(r->tready - 1, BY_READY, false);
        r->tready = next;
    }
    while (r->ttimed) { /* the manager holds those it filed; the rest it meets
                           in its inbox, claimed, and queues then */
        uint32_t next = ld_relaxed(link_of(r->ttimed - 1));
        if (ld_relaxed(tail_claim(atap__table_at(r->ttimed - 1))) & T_FILED) {
            atap__park_unfile(r->ttimed - 1);
            atap__park_tail_fd_complete(r->ttimed - 1, BY_READY, false);
        }
        r->ttimed = next;
    }
    while ((p = r->ready) != NULL) {
        r->ready = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
}

/* A report of f's watch, on the thread that read it; holder: that thread
 * holds the wheel's seat (the manager, awake, unless a worker had it). */
static void fd_event(struct fdw *f, unsigned events, bool holder)
{
    struct resumes r = {.holder = holder};

    pthread_mutex_lock(&fd_lock);
    events &= ~claim_ready(f, events, &r);
    if (f->kept) /* still armed: what nobody took waits for the next park */
        f->ready |= (uint8_t)events;
    else if (f->waiters || f->tails) /* one-shot: the rest are watched again (failed:
                                        deaf, see the top); with none left the watch
                                        is spent already, and the fd may be closed */
        rewatch(f, W_AGAIN);
    else
        set_deaf(f, false); /* nobody left to hear it */
    pthread_mutex_unlock(&fd_lock);
    if (r.marked)
        atap__hub_wake();
    complete_ready(&r);
}

void atap__park_event(void *udata, unsigned events, unsigned kind)
{
    if (!atap__source_event(udata, events, kind))
        fd_event(udata, events, atap__park_wheel_mine());
}

void atap__park_io_event(void *udata, unsigned events, unsigned kind)
{
    (void)kind; /* io holds fd watches alone */
    fd_event(udata, events, false);
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
static void fd_retry(void)
{
    struct fdw *f, *next;
    /* The manager's tick: the wheel's holder, unless a worker had the seat. */
    struct resumes r = {.holder = atap__park_wheel_mine()};
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
        if (rewatch(f, W_RENEW) == 0 || !(ev = look(f->fd, wanted(f) | f->kept_ev)))
            continue;
        if (f->kept) /* what it is ready for now, told as a report would */
            f->ready |= (uint8_t)(ev & ~claim_ready(f, ev, &r));
        else
            claim_ready(f, ev, &r);
        if (!f->waiters && !f->tails && !f->kept)
            set_deaf(f, false); /* nobody left to hear it */
    }
    pthread_mutex_unlock(&fd_lock);
    if (r.marked)
        atap__hub_wake();
    complete_ready(&r);
}

/* ---- kept fds ------------------------------------------------------------ */

int atap_fd_keep(int fd)
{
    struct atap_poller *mp;
    struct fdw *f;
    unsigned ev;
    int rc;

    if (fd < 0)
        return ATAP_EINVAL;
    pthread_mutex_lock(&fd_lock);
    /* Looked at under fd_lock: the last shutdown closes io only after
     * fd_closed is set under it (atap__park_tails_close), so an io seen
     * here with fd_closed clear is open. */
    mp = atap__hub_io();
    if (!mp || fd_closed) {
        rc = ATAP_ENOTINIT;
    } else if (!atap__fd_open(fd)) {
        rc = -EBADF;
    } else if (!(f = fdw_of(fd))) {
        rc = -ENOMEM;
    } else {
        /* READ from the start, and whatever parks already wait for: WRITE
         * only once a park wants it, as most sockets never fill up. Kept
         * already, it is armed again all the same: a number closed while
         * kept and reused lost its watch with the old file. */
        ev = wanted(f) | f->kept_ev | ATAP_READABLE;
        rc = atap__poller_watch_kept(mp, fd, ev, f);
        f->kept = rc == 0;
        f->kept_ev = rc == 0 ? (uint8_t)ev : 0;
        f->ready = 0; /* the watch reports what is ready now */
        if (rc == 0)
            set_deaf(f, false);
        else if (f->waiters || f->tails)
            rewatch(f, W_AGAIN); /* kqueue lets go of both filters when one fails */
        if (rc == -ENOTSUP)
            rc = 0; /* poll: one-shot watches keep every promise of a kept one */
    }
    pthread_mutex_unlock(&fd_lock);
    return rc;
}

int atap_fd_unkeep(int fd)
{
    struct fdw *f;

    if (fd < 0)
        return ATAP_EINVAL;
    pthread_mutex_lock(&fd_lock);
    if ((f = fdw_at((size_t)fd)) != NULL && f->kept) {
        f->kept = false;
        f->kept_ev = f->ready = 0;
        if (!fd_closed)          /* io is open (atap_fd_keep) */
            rewatch(f, W_AGAIN); /* one-shot for the parks still waiting; none: unwatched */
    }
    pthread_mutex_unlock(&fd_lock);
    return 0;
}

/* ---- the manager's side (every fd at once) ------------------------------ */

/* The manager starts: a watch that fails marks its fd deaf again, and tail
 * fd parks are taken. A keep lasts across a shutdown (atap.h), but the io
 * it was watched on was closed with the last one (hub.h): each kept fd is
 * watched on the new io, which reports what is ready now (as a keep's
 * first watch does). One whose watch fails (closed meanwhile) is kept no
 * more. */
void atap__park_tails_open(void)
{
    struct atap_poller *mp = atap__hub_io();

    pthread_mutex_lock(&fd_lock);
    fd_closed = false;
    for (size_t fd = 0; mp && fd < fdchunks * FD_CHUNK; fd++) {
        struct fdw *f = fdw_at(fd);
        if (!f || !f->kept)
            continue;
        f->ready = 0;
        if (atap__poller_watch_kept(mp, f->fd, f->kept_ev | wanted(f), f) != 0)
            f->kept = false, f->kept_ev = 0;
    }
    pthread_mutex_unlock(&fd_lock);
}

/* Between two managers' lives (the supervisor calls it; no manager runs).
 * A manager that died between its wait and handing out what the wait
 * reported took those reports with it, and the one-shot watches they spent
 * stay disarmed. Watched again, each fd is looked at afresh by the kernel
 * (level-triggered), so the next manager hears of everything still ready;
 * the sources read what they hold (a signal's pending flag outlives its
 * pipe byte, and inotify keeps what was not read). No parked task is run for
 * nothing, and deadlines need nothing: their wheels belong to the runtime. */
static void fd_rearm(void)
{
    pthread_mutex_lock(&fd_lock);
    for (size_t fd = 0; fd < fdchunks * FD_CHUNK; fd++) {
        struct fdw *f = fdw_at(fd);
        if (f && (f->waiters || f->tails || f->kept))
            rewatch(f, W_RENEW);
    }
    pthread_mutex_unlock(&fd_lock);
}

/* No manager: every tail fd park ends, and later ones end at once. */
void atap__park_tails_close(void)
{
    uint32_t off = 0;
    struct fdw *f;

    pthread_mutex_lock(&fd_lock);
    fd_closed = true;
    /* No tick will retry the deaf fds, and none is marked now. A kept one
     * is kept no more: its watch may be gone (kqueue lets go of both
     * filters when a watch fails), and a park on a one-shot fd watches for
     * itself. */
    while ((f = ld_relaxed(&deaf_fds)) != NULL) {
        if (f->kept)
            f->kept = false, f->kept_ev = f->ready = 0;
        set_deaf(f, false);
    }
    for (size_t fd = 0; fd < fdchunks * FD_CHUNK; fd++) {
        f = fdw_at(fd);
        for (uint32_t x = f ? f->tails : 0, prev = 0, next; x; x = next) {
            struct atap_slot *t = atap__table_at(x - 1);
            next = ld_relaxed(link_of(x - 1));
            if (ld_relaxed(tail_claim(t)) & T_TIMED) {
                prev = x; /* the wheel's: atap__park_wheel_close, or its parker, ends it */
            } else if (atap__park_tclaim(t, BY_OFF, 0) == 1) {
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
        atap__park_tail_fd_complete(off - 1, BY_OFF, false);
        off = next;
    }
}

/* In a fork's child (atap__park_forget, park.c): the fd table and its lock
 * go back to the state before the first start, unfreed. */
void atap__park_fd_forget(void)
{
    fd_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    fd_closed = false;
    fdtab = NULL;
    fdchunks = 0;
    st_relaxed(&deaf_fds, NULL);
}

/* ---- the kind ------------------------------------------------------------ */

/* A park on an fd in the slot's tail. With no deadline, any task: an
 * output of up to TAIL_FD bytes leaves room for its fd and claim word, a
 * larger one has them on the side record (made here: we hold RUN;
 * park_int.h's tail_claim). With a deadline it needs the whole tail, and
 * keeps its fd in the claim word, or a large one on the side record. */
static bool tail_fd_park(struct atap_slot *s, struct atap_ctx *ctx)
{
    if (ctx->deadline == ATAP__FOREVER) /* any output: fd and claim on the side if need be */
        return slot_tail_room(s, TAIL_FD) || atap__side_of(s) != NULL;
    return slot_tail_room(s, TAIL_ALL) && park_tail_deadline(ctx) &&
           (ctx->fd < T_FD_SMALL || atap__side_of(s) != NULL);
}

/* Parks on fds (atap_park_fd, park.c): in the slot's tail when they fit,
 * else a record on its fd's list; the fd table's watches are renewed after
 * a manager's death, the deaf fds retried each tick. */
const struct park_kind atap__park_kind_fd = {
    .join = fd_join,
    .leave = fd_leave,
    .fits_tail = tail_fd_park,
    .tail_arm = atap__park_tail_fd_arm,
    .rearm = fd_rearm,
    .retry = fd_retry,
    .forget = atap__park_fd_forget,
};

/*
 * Stacks set aside: a wait inside a task never holds its thread.
 *
 * Each pool thread runs on one of its stacks at a time: its own, or one
 * mapped here (fiber.h), all of worker_stack's size. A wait that may run
 * nothing on top of its frame (help.c: only the awaited task, from the
 * thread's own queues, while there is room) sets the whole running stack
 * aside, listed under a key (the awaited slot, or join_first's settle
 * count), and the thread goes on with another stack: one whose wait is
 * over, else a free one, which looks for work as the thread's loop does
 * (it runs the loop). A stack set aside resumes on the same thread, so its
 * task sees its own thread-locals and keeps the locks it holds; it
 * resumes at the thread's next switch point after its wait ended: a run's
 * end at the bottom of a stack (the loop's top, where that stack, holding
 * no frame, becomes free), or a wait of the stack running then. A free
 * stack's context is its loop's top, so taking it again only goes on with
 * that loop; the thread's own stack is one of them, and the thread's loop
 * ends on it (exiting).
 *
 * The protocol of a wait. A stack waits on one or more keys (a join: the
 * awaited slot; join_first: each member's slot), each a waiter node listed
 * in its key's bucket under that bucket's spin lock:
 *   waiter: list every node; still() (for a slot: an RMW that sets
 *           ST_ASIDE on the word while the task has not settled);
 *           switch away if it says the wait is on.
 *   ender:  move the word on (an RMW that reads ST_ASIDE); then, under the
 *           key's lock, take each node of the key off its list and move
 *           its stack's claim from 0 to 1; push each stack it claimed onto
 *           its owner's `woken`, after the lock.
 * Either the ender's RMW reads the waiter's (its listing came before it,
 * so the ender's look under the lock finds the node), or the waiter's
 * still() reads the ender's and says no. An ender skips the lock while no
 * node is listed anywhere (atap__pool_keyed, raised before still()). The
 * claim makes a stack resumed once: by the ender that claimed it (a push),
 * by its owner at a deadline or a death (it claims it itself); a waiter
 * whose still() says no after an ender claimed it takes that push back.
 * The owner resumes stacks only from its own ready list, filled from
 * `woken` (a Treiber stack, exchanged whole) and by its deadlines, so a
 * stack pushed before its switch away has completed is not resumed before
 * it has: the owner is the thread still switching. A resumed stack takes
 * its nodes off their lists, under each lock: an ender that took one off
 * has claimed under that lock, so no push comes after.
 *
 * Waking an idle owner: the ender pushes, then (a seq_cst fence between)
 * reads the owner's park word, and moves IDLE to READY by CAS, then wakes
 * the word or the io the owner waits on (pool.c's unpark, but for the
 * idle list: the owner takes itself off it). The owner stores IDLE (in
 * join_idle), fences, then looks at `woken` before it sleeps: one of the
 * two sees the other.
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "atomics.h"
#include "fiber.h"
#include "hub.h"
#include "pool_int.h"
#include "trace.h"
#include "wait.h"

#define KEYS_INLINE 4 /* keys a wait lists without the heap */

/* One key a stack set aside waits on, listed in the key's bucket. */
struct waiter {
    const void *key;
    struct stack *stack;
    struct waiter *next; /* its bucket's list */
    bool listed;         /* on it (the bucket's lock) */
};

/* A stack of a pool thread, and what it keeps of the thread's state while
 * it does not run (worker's depth, held[], cur, stack_floor). */
struct stack {
    struct atap_fiber f;
    struct stack *next;  /* free, ready or woken list (owner's, or the push) */
    struct stack *tnext; /* the owner's timed list */
    struct worker *owner;
    struct waiter *keys; /* what it waits for, while set aside: nkeys of them */
    unsigned nkeys;
    struct waiter inline_keys[KEYS_INLINE]; /* keys, unless a wait has more */
    /* Whoever moves it 0 -> 1 (an ender, under its key's lock; the owner
     * at a deadline or a death) resumes it: one push, or one queueing. */
    _Atomic int claim;
    uint64_t deadline;
    bool timed;   /* on the owner's timed list */
    bool started; /* its context is its loop's: taking it goes on there */
    unsigned depth, held_cap;
    uint16_t tdepth; /* the trace's count of runs open on it (trace.h) */
    uint32_t *held;
    struct atap_ctx *cur;
    uintptr_t floor, low;
};

#define BUCKETS 64
#define FREE_KEEP 1024 /* free stacks a thread keeps mapped while it works */
#define FREE_IDLE 8    /* ... and after it has idled for a while */

static struct {
    _Alignas(64) atap_spin lock;
    struct waiter *head;
} buckets[BUCKETS];

_Atomic unsigned atap__pool_keyed;

static inline unsigned bucket_of(const void *key)
{
    uintptr_t k = (uintptr_t)key;

    return (unsigned)((k >> 4) ^ (k >> 10) ^ (k >> 16)) % BUCKETS;
}

/* ---- the thread's stacks -------------------------------------------------- */

/* The lowest address a run may start nested at on a stack: its low end
 * plus a reserve for the run itself (an eighth of it, 64 KiB to 1 MiB). */
#define RESERVE_MIN ((size_t)64 << 10)
#define RESERVE_MAX ((size_t)1 << 20)

static uintptr_t floor_of(const char *lo, size_t size)
{
    size_t reserve = size / 8;

    reserve = reserve < RESERVE_MIN ? RESERVE_MIN : reserve > RESERVE_MAX ? RESERVE_MAX : reserve;
    return (uintptr_t)lo + reserve;
}

static void unmap_stack(struct stack *s)
{
    atap__fiber_unmap(&s->f);
    free(s->held);
    free(s);
    sub_relaxed(&atap__pool.nstacks, 1); /* a count for the stats alone */
}

/* A stack left for good is unmapped once the thread is off it. */
static inline void drop_dead(struct worker *w)
{
    struct stack *d = w->dead;

    if (d) {
        w->dead = NULL;
        unmap_stack(d);
    }
}

/* Saves the running stack's share of the thread's state into `from`,
 * loads `to`'s, and switches; errno is the waiting frame's again after.
 * last: `from` never runs again (buried). */
static void switch_as(struct worker *w, struct stack *from, struct stack *to, bool last)
{
    int saved_errno = errno;

    from->depth = w->depth;
    from->held = w->held;
    from->held_cap = w->held_cap;
    from->cur = w->cur;
    from->floor = w->stack_floor;
    from->low = w->stack_low;
    from->tdepth = atap__trace_depth_swap(to->tdepth);
    w->depth = to->depth;
    w->held = to->held;
    w->held_cap = to->held_cap;
    w->cur = to->cur;
    w->stack_floor = to->floor;
    w->stack_low = to->low;
    w->stack = to;
    if (last)
        atap__fiber_switch_last(&from->f, &to->f);
    else
        atap__fiber_switch(&from->f, &to->f);
    /* Back on `from`, on the same thread: whoever switched here loaded
     * this stack's state. */
    drop_dead(w);
    errno = saved_errno;
}

static void switch_to(struct worker *w, struct stack *from, struct stack *to)
{
    switch_as(w, from, to, false);
}

static void stack_main(void *arg);
static void stack_died(void *arg);
static _Noreturn void exit_here(struct worker *w);

/* The thread's cleanup chain at its loop's top (its own stack's, with
 * thread_main's handler, which every stack's chain ends in). */
static _Thread_local void *loop_chain;

/* A free stack, mapped now if none is kept; NULL if none can be had. */
static struct stack *take_free(struct worker *w)
{
    struct stack *s = w->free;

    if (s) {
        w->free = s->next;
        w->nfree--;
        return s;
    }
    if (!(s = calloc(1, sizeof *s)))
        return NULL;
    if (!(s->held = malloc(HELD_INLINE * sizeof *s->held)) ||
        atap__fiber_map(&s->f, atap__pool.stack) != 0) {
        free(s->held);
        free(s);
        return NULL;
    }
    s->owner = w;
    s->held_cap = HELD_INLINE;
    s->floor = floor_of(s->f.lo, s->f.size);
    s->low = UINTPTR_MAX;
    add_relaxed(&atap__pool.nstacks, 1); /* a count for the stats alone */
    return s;
}

/* s, at its loop's top (or never started), free for the next taker; past
 * FREE_KEEP mapped ones, unmapped instead (once off it, if it runs). */
static void give_free(struct worker *w, struct stack *s)
{
    if (w->nfree >= FREE_KEEP && s != w->base) {
        if (s == w->stack)
            w->dead = s;
        else
            unmap_stack(s);
        return;
    }
    s->next = w->free;
    w->free = s;
    w->nfree++;
}

bool atap__pool_stacks_spare(const struct worker *w) { return w->nfree > FREE_IDLE; }

void atap__pool_stacks_shrink(struct worker *w)
{
    struct stack **p = &w->free, *s;

    while (w->nfree > FREE_IDLE && (s = *p) != NULL) {
        if (s == w->base || s == w->stack) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        w->nfree--;
        unmap_stack(s);
    }
}

/* Goes on with s: a stack set aside, resumed where it waits, or a free
 * one, which goes on at its loop's top (started now if never run). */
static void run_stack(struct worker *w, struct stack *s)
{
    if (!s->started) {
        atap__fiber_start(&s->f, stack_main, w, loop_chain);
        s->started = true;
        s->tdepth = 0;
    }
    switch_to(w, w->stack, s);
}

/* The first run of a mapped stack: the thread's loop, from its top. */
static void stack_main(void *arg)
{
    struct worker *w = arg;

    atap__fiber_entered();
    drop_dead(w); /* as switch_to does after a switch */
    pthread_cleanup_push(stack_died, w);
    atap__pool_loop(w);
    pthread_cleanup_pop(0);
    /* The loop ends (a stop, or reaped) with nothing set aside: the
     * thread ends on its own stack, which waits free at its loop's top. */
    w->exiting = true;
    for (struct stack **p = &w->free; *p; p = &(*p)->next)
        if (*p == w->base) {
            *p = w->base->next;
            w->nfree--;
            break;
        }
    w->dead = w->stack; /* unmapped by the thread's own stack, off it */
    run_stack(w, w->base);
    __builtin_unreachable();
}

int atap__pool_stacks_begin(struct worker *w, char *lo, size_t size)
{
    struct stack *s;

    w->stack_floor = floor_of(lo, size);
    w->stack_low = UINTPTR_MAX;
    w->base = w->stack = NULL;
    if (!(s = calloc(1, sizeof *s)))
        return -ENOMEM;
    atap__fiber_adopt(&s->f, lo, size);
    loop_chain = atap__fiber_chain();
    s->owner = w;
    s->started = true;
    s->held = w->held;
    s->held_cap = w->held_cap;
    w->base = w->stack = s;
    w->free = w->ready = w->ready_tail = w->timed = w->dead = NULL;
    w->naside = w->nfree = 0;
    w->handoff = 0;
    w->exiting = w->dying = false;
    st_relaxed(&w->woken, NULL); /* before its thread runs: a late push there is a dead stack */
    return 0;
}

/* On the thread's own stack, its loop over: every other stack is free. */
void atap__pool_stacks_end(struct worker *w)
{
    struct stack *s, *next;

    if (!w->base)
        return;
    for (s = w->free; s; s = next) {
        next = s->next;
        if (s != w->base)
            unmap_stack(s);
    }
    free(w->base);
    w->base = w->stack = w->free = NULL;
    w->nfree = 0;
}

/* ---- keys ------------------------------------------------------------------ */

/* Lists n of s's waiters, each under its key's lock. */
static void list(struct waiter *ws, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct waiter *k = &ws[i];
        unsigned b = bucket_of(k->key);

        spin_lock(&buckets[b].lock);
        k->next = buckets[b].head;
        buckets[b].head = k;
        k->listed = true;
        spin_unlock(&buckets[b].lock);
    }
}

/* Takes s's waiters off their lists, each under its key's lock: once it
 * returns, no ender is still between taking one off and settling `woken`
 * (both under that lock), so no late push can come. */
static void unlist_all(struct stack *s)
{
    for (unsigned i = 0; i < s->nkeys; i++) {
        struct waiter *k = &s->keys[i], **p;
        unsigned b = bucket_of(k->key);

        spin_lock(&buckets[b].lock);
        if (k->listed) {
            for (p = &buckets[b].head; *p != k; p = &(*p)->next)
                ;
            *p = k->next;
            k->listed = false;
        }
        spin_unlock(&buckets[b].lock);
    }
    /* Relaxed: an ender's look at the count needs only each waiter's own
     * raise to be seen (by its still()'s RMW), never another's lowering. */
    sub_relaxed(&atap__pool_keyed, s->nkeys);
    s->nkeys = 0;
}

/* Wakes w if it sleeps idle (the top comment's second half). */
static void kick(struct worker *w)
{
    uint32_t idle = PARK_IDLE;

    fence_seqcst(); /* the push before the look at the word */
    if (ld_seqcst(&w->park) != PARK_IDLE || !cas_seqcst(&w->park, &idle, PARK_READY))
        return;
    /* seq_cst, as pool.c's unpark: the word before in_io. */
    if (ld_seqcst(&w->in_io))
        atap__hub_wake_io();
    else
        atap__word_wake(&w->park, false);
}

static void push_woken(struct stack *s)
{
    struct worker *w = s->owner;
    struct stack *head = ld_relaxed(&w->woken);

    do
        s->next = head;
    /* Release: the owner's exchange sees what the ender did first. */
    while (!casw_release(&w->woken, &head, s));
    kick(w);
}

void atap__pool_wake_key(const void *key)
{
    unsigned b = bucket_of(key);
    struct waiter **p, *k;
    struct stack *woke = NULL, *s;

    spin_lock(&buckets[b].lock);
    for (p = &buckets[b].head; (k = *p) != NULL;) {
        if (k->key != key) {
            p = &k->next;
            continue;
        }
        *p = k->next;
        k->listed = false;
        s = k->stack;
        /* Acquire-release: a stack woken once is pushed once. */
        if (xchg_acqrel(&s->claim, 1) == 0) {
            s->next = woke;
            woke = s;
        }
    }
    spin_unlock(&buckets[b].lock);
    /* Each is ours to push: its owner resumes it only once the push lands,
     * so the record stays as it is until then. */
    while ((s = woke) != NULL) {
        woke = s->next;
        push_woken(s);
    }
}

/* ---- setting aside and resuming ------------------------------------------- */

static void ready_push(struct worker *w, struct stack *s)
{
    s->next = NULL;
    if (w->ready_tail)
        w->ready_tail->next = s;
    else
        w->ready = s;
    w->ready_tail = s;
}

static void untime(struct worker *w, struct stack *s)
{
    if (!s->timed)
        return;
    for (struct stack **p = &w->timed; *p; p = &(*p)->tnext)
        if (*p == s) {
            *p = s->tnext;
            break;
        }
    s->timed = false;
}

/* Stacks whose deadline has passed, onto the ready list unless an ender
 * woke them first (they come by `woken` then). */
static void expire(struct worker *w, uint64_t now)
{
    struct stack *s, *next;

    for (s = w->timed; s; s = next) {
        next = s->tnext;
        if (s->deadline > now)
            continue;
        untime(w, s);
        if (xchg_acqrel(&s->claim, 1) == 0)
            ready_push(w, s);
    }
}

uint64_t atap__pool_aside_due(const struct worker *w)
{
    uint64_t due = ATAP__FOREVER;

    for (const struct stack *s = w->timed; s; s = s->tnext)
        if (s->deadline < due)
            due = s->deadline;
    return due;
}

/* `woken` joined to the ready list, oldest first (a dead thread's stack
 * pushed late, after its record was taken again, is passed over). */
static void drain_woken(struct worker *w)
{
    /* Acquire: what each ender did before its push. */
    struct stack *s = xchg_acquire(&w->woken, NULL), *rev = NULL;

    while (s) {
        struct stack *next = s->next;

        s->next = rev;
        rev = s;
        s = next;
    }
    while ((s = rev) != NULL) {
        rev = s->next;
        if (s->owner == w)
            ready_push(w, s);
    }
}

/* The next stack to resume, or NULL: `woken` and passed deadlines joined
 * to the ready list first. */
static struct stack *take_ready(struct worker *w)
{
    struct stack *s;

    drain_woken(w);
    if (w->timed)
        expire(w, atap__now_ns());
    if ((s = w->ready) != NULL) {
        w->ready = s->next;
        if (!w->ready)
            w->ready_tail = NULL;
    }
    return s;
}

/* me, claimed by an ender whose push may not have landed yet: waited
 * for, and taken off the ready list it lands on. */
static void take_back(struct worker *w, struct stack *me)
{
    unsigned spins = 0;

    for (;;) {
        drain_woken(w);
        for (struct stack **p = &w->ready, *prev = NULL; *p; prev = *p, p = &(*p)->next)
            if (*p == me) {
                *p = me->next;
                if (w->ready_tail == me)
                    w->ready_tail = prev;
                return;
            }
        spin_pause(&spins);
    }
}

bool atap__pool_aside_pending(const struct worker *w)
{
    /* Relaxed: a look; the exchange that takes them reads with acquire. */
    return w->ready || ld_relaxed(&w->woken) ||
           (w->timed && atap__pool_aside_due(w) <= atap__now_ns());
}

/* Nested runs went deeper than this on the running stack, at its loop's
 * top or as it is set aside: the pages they left are given back, so that a
 * stack free or set aside holds what it uses, not what it once used. */
#define TRIM_BELOW ((uintptr_t)64 << 10)

static void trim(struct worker *w)
{
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);

    if (w->stack_low < here - TRIM_BELOW) {
        atap__fiber_trim(&w->stack->f, w->stack_low, here - TRIM_BELOW / 2);
        w->stack_low = here;
    }
}

void atap__pool_switch_point(struct worker *w)
{
    struct stack *to = w->naside ? take_ready(w) : NULL;

    /* Nothing set aside, and on a mapped stack: back to the thread's own,
     * free at its loop's top (a thread exits there, and the sanitizers
     * like a pthread_exit from a task there best). */
    if (!to && w->naside == 0 && w->stack != w->base) {
        for (struct stack **p = &w->free; *p; p = &(*p)->next)
            if (*p == w->base) {
                *p = w->base->next;
                w->nfree--;
                to = w->base;
                break;
            }
    }
    if (!to)
        return;
    /* This stack holds no frame: free, and it goes on from here when
     * taken again. */
    trim(w);
    give_free(w, w->stack);
    run_stack(w, to);
    if (unlikely(w->dying)) /* the thread's own stack, to end the thread */
        exit_here(w);
}

int atap__pool_aside(struct worker *w, const void *const *keys, unsigned nkeys,
                     bool (*still)(void *arg), void *arg, uint64_t deadline, uint32_t first)
{
    struct stack *me = w->stack, *to;
    unsigned now_aside;

    if (!me || nkeys == 0)
        return ASIDE_NO; /* the thread runs on its own stack alone */
    /* A stack to go on with, mapped, and room for the keys, before
     * anything is listed. */
    if (!w->free) {
        if (!(to = take_free(w)))
            return ASIDE_NO;
        give_free(w, to);
    }
    me->keys = nkeys <= KEYS_INLINE ? me->inline_keys : malloc(nkeys * sizeof *me->keys);
    if (!me->keys)
        return ASIDE_NO;
    for (unsigned i = 0; i < nkeys; i++)
        me->keys[i] = (struct waiter){.key = keys[i], .stack = me};
    me->nkeys = nkeys;
    me->deadline = deadline;
    st_relaxed(&me->claim, 0); /* published to enders by list()'s locks */
    /* Counted before still(): its RMWs publish the listing and the count
     * (atap__pool_wake_listed). */
    add_relaxed(&atap__pool_keyed, nkeys);
    list(me->keys, nkeys);
    if (!still(arg)) {
        unlist_all(me);
        if (me->keys != me->inline_keys)
            free(me->keys);
        /* An ender that took a key off before still()'s look has claimed
         * this stack, and its push is on the way: it is taken back here,
         * so that nothing resumes a stack that never went aside. */
        if (xchg_acqrel(&me->claim, 1) != 0)
            take_back(w, me);
        return ASIDE_GONE;
    }
    if (deadline != ATAP__FOREVER) {
        me->timed = true;
        me->tnext = w->timed;
        w->timed = me;
    }
    w->naside++;
    /* Relaxed: the owner counts it before it can next go idle, and a drain
     * reads the count only after the owner's idle handshake (seq_cst). */
    now_aside = add_relaxed(&atap__pool.naside, 1) + 1;
    if (now_aside > ld_relaxed(&atap__pool.peak_aside))
        st_relaxed(&atap__pool.peak_aside, now_aside); /* a peak: a lost race only lowers it */
    ATAP_TRACE(TR_ASIDE, (uintptr_t)me, NULL, w->naside);
    to = first ? NULL : take_ready(w);
    if (to != me) {
        if (!to)
            to = take_free(w); /* there is one: mapped above */
        w->handoff = first;
        trim(w); /* what nested runs left below this wait: while it waits */
        run_stack(w, to);
    }
    /* Resumed (woken, expired, or its thread dying): off every list, and
     * inside a run again (the stack that ran before may have idled). */
    unlist_all(me);
    if (me->keys != me->inline_keys)
        free(me->keys);
    untime(w, me);
    st_relaxed(&w->busy, true); /* owner-written, read by the stats */
    w->naside--;
    /* Release: a drain that reads the count sees this stack's run going on. */
    sub_release(&atap__pool.naside, 1);
    ATAP_TRACE(TR_BACK, (uintptr_t)me, NULL, w->naside);
    if (unlikely(w->dying))
        exit_here(w); /* its thread died on another stack: this one unwinds */
    return ASIDE_WOKEN;
}

/* ---- a thread that dies ----------------------------------------------------- */

/*
 * A task ends its thread (pthread_exit, or an injected death) on whichever
 * stack runs. Every stack of the thread is then unwound in turn, so that
 * each frame's cleanup runs and each run on it fails, as on a thread with
 * one stack: a mapped stack's unwinding ends in its bottom handler
 * (stack_died, pushed by stack_main: its chain never reaches another
 * stack's frames), which fails the runs still on it and goes on with the
 * next stack set aside, resumed into a pthread_exit of its own (dying);
 * the thread's own stack ends in thread_main's handler
 * (atap__pool_thread_died), which does the same and, once no stack is
 * set aside, lets the thread end there. A stack left so is never run
 * again: it goes to the graveyard, unmapped at the pool's stop, once no
 * thread can be on it.
 */

static struct stack *graveyard;
static atap_spin grave_lock;

static void bury(struct stack *s)
{
    s->owner = NULL; /* a late ender's push is then passed over (take_ready) */
    spin_lock(&grave_lock);
    s->next = graveyard;
    graveyard = s;
    spin_unlock(&grave_lock);
}

void atap__pool_stacks_reclaim(void)
{
    struct stack *s;

    while ((s = graveyard) != NULL) {
        graveyard = s->next;
        if (s->f.map)
            unmap_stack(s);
        else
            free(s); /* a thread's own stack's record */
    }
}

/* Exits from the running stack (its chain ends in its own bottom
 * handler). TSan requires a pthread_exit in the thread's own context. */
static _Noreturn void exit_here(struct worker *w)
{
    if (w->base)
        atap__fiber_exiting(&w->base->f);
    pthread_exit(NULL);
}

void atap__pool_aside_forget(void)
{
    memset(buckets, 0, sizeof buckets);
    st_relaxed(&atap__pool_keyed, 0);
    graveyard = NULL; /* the parent's threads' stacks: not ours to unmap */
    st_relaxed(&grave_lock.held, 0);
}

_Noreturn void atap__pool_die(struct worker *w) { exit_here(w); }

/* One stack of w's set aside, to resume, or NULL when none is left:
 * woken ones first, then listed ones, taken by moving `woken` (they come
 * off their lists as they resume); one an ender has woken but not pushed
 * yet is waited for (naside still counts it). */
static struct stack *take_aside(struct worker *w)
{
    struct stack *s;

    while (w->naside > 0) {
        if ((s = take_ready(w)) != NULL)
            return s;
        for (unsigned b = 0; b < BUCKETS; b++) {
            struct waiter *k;

            s = NULL;
            spin_lock(&buckets[b].lock);
            for (k = buckets[b].head; k && !s; k = k->next)
                if (k->stack->owner == w && xchg_acqrel(&k->stack->claim, 1) == 0)
                    s = k->stack;
            spin_unlock(&buckets[b].lock);
            if (s) {
                untime(w, s);
                return s;
            }
        }
        cpu_relax();
    }
    return NULL;
}

/* The running stack is unwound (its runs failed by the caller): on to the
 * next stack set aside, into its pthread_exit; with none left, to the
 * thread's own stack, to end there. Returns only on the thread's own
 * stack, in its handler, once every other stack is unwound. */
static void unwind_next(struct worker *w)
{
    struct stack *me = w->stack, *to = take_aside(w);

    w->dying = true;
    if (!to) {
        if (me == w->base)
            return;
        for (struct stack **p = &w->free; *p; p = &(*p)->next)
            if (*p == w->base) {
                *p = w->base->next;
                w->nfree--;
                break;
            }
        to = w->base; /* free at its loop's top, or in its handler */
    }
    if (me != w->base)
        bury(me);
    switch_as(w, me, to, me != w->base); /* back here only on the thread's own stack */
}

/* The runs still on the running stack fail, innermost first: each is one
 * its thread's loop counted busy, for a blocking thread. */
static void fail_runs(struct worker *w)
{
    if (w->depth > 0 && w->blocking) {
        /* As a run's end does (blocker_loop): a drain that read the
         * blocking queue before what the run queued sees the epoch move. */
        add_seqcst(&atap__pool.epoch, 1);
        sub_seqcst(&atap__pool.bbusy, 1);
    }
    while (w->depth > 0) {
        w->depth--;
        atap__pool.ops->fail_held(w->held[w->depth]);
    }
}

/* A mapped stack's bottom handler (stack_main's): its frames unwound. */
static void stack_died(void *arg)
{
    struct worker *w = arg;

    fail_runs(w);
    unwind_next(w);
    __builtin_unreachable(); /* a mapped stack is never resumed */
}

void atap__pool_stacks_died(struct worker *w)
{
    struct stack *s;

    if (w->handoff) { /* a task a stack was taken for, not run yet: to the others */
        atap__pool_push_shared(&atap__pool.inj, &w->handoff, 1, false);
        w->handoff = 0;
    }
    fail_runs(w);
    if (!w->base)
        return;
    unwind_next(w); /* every other stack, unwound */
    while ((s = w->free) != NULL) {
        w->free = s->next;
        if (s != w->base)
            bury(s);
    }
    if (w->dead)
        bury(w->dead);
    bury(w->base);
    w->base = w->stack = w->dead = NULL;
    w->ready = w->ready_tail = w->timed = NULL;
    w->nfree = 0;
}

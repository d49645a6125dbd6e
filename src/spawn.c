/*
 * Spawning (executor.c has the rest of a task's life, and its rules): a
 * slot taken from the table, filled, made PENDING and queued. atap_spawn;
 * atap__exec_check and atap__exec_spawn for the tasks that wait for gives
 * (gate.c, forward.c); atap__exec_fill for a run of an at-rate series
 * (rate.c spawns those). A task whose options need a schedule (time, or
 * gives) gets it through extras.h.
 *
 * The order: the slot is filled (its fields, then refs: gen | RUN, a
 * handle but for an at-rate run or a detached spawn, GATED for a task that
 * waits for gives),
 * then PENDING is stored into word with release, then the task is queued
 * (or handed to its schedule, which queues it once its time, or a give,
 * comes). Whoever acquires the word (a reader) or the queue entry (a
 * worker) sees every field; that one entry carries RUN (executor.c:
 * claiming). A spawn that fails once it holds a slot leaves no task behind
 * and burns the generation: the slot goes back as (gen, FREE).
 *
 * A spawn from outside the pool is admitted first (atap__spawn_enter, the
 * door below), so a shutdown can wait for it; one from a task is part of the work a
 * shutdown drains, and always in. The quick path, inline in atap_spawn, is
 * a plain task's from a worker: a slot from the worker's stash, filled and
 * published as above, and into the worker's LIFO slot when that is empty
 * (atap__pool_submit_from). The rest goes out of line, so that path's
 * frame stays small. Options are read where they lie when they are in this
 * library's layout (size 0 or sizeof: one check on the quick path), and
 * copied into it otherwise (abi.h), before anything else reads them.
 */
#include "executor.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "abi.h"
#include "atap.h"
#include "atomics.h"
#include "extras.h"
#include "faults.h"
#include "pool.h"
#include "side.h"
#include "slot.h"
#include "table.h"
#include "trace.h"
#include "wait.h"

/* ---- admission ---------------------------------------------------------
 *
 * A spawn from outside the pool marks itself in flight, then reads `door`;
 * the last shutdown stores the door shut, then waits until no spawn is in
 * flight. Each side's store must be seen before its load (Dekker), so that
 * either the spawn sees the door shut and backs out, or the shutdown sees
 * it in flight and waits for it to finish queueing before draining the
 * pool. Two ways to mark:
 *
 * - A thread with a seat (table.c: one goes with each outside stash), when
 *   the process has a barrier on every thread (`asym`: Linux's membarrier),
 *   marks its seat with a plain store and reads the door with no fence: no
 *   locked instruction on the spawn's path. The shutdown pays for both
 *   sides: between its store and its look at the seats, every thread of
 *   the process runs a full fence. A spawn whose read of the door came
 *   before that fence had stored its mark before it (program order), and
 *   the fence made the mark visible; one whose read came after the fence
 *   reads the door the shutdown stored before it.
 * - Any other (no barrier here, or every seat taken): the seq_cst count
 *   `inflight`. Of the two seq_cst stores, one is first in the single
 *   order of seq_cst operations, and the other side's load sees it.
 *
 * The shutdown waits for both. A spawn admitted inside another on the same
 * thread (a give's start, say) is let in whatever the door, unmarked: the
 * outer one already keeps a shutdown waiting.
 */
static _Atomic bool door;
static _Atomic unsigned inflight;
/* The barrier is registered: asked for once a process, at the first door
 * opening (again in a fork's child: door_forget), before any spawn is let
 * in; written only with no spawn under way. */
static _Atomic bool asym;
static bool asym_asked;
static _Thread_local unsigned admitted;        /* this thread's admissions, nested */
static _Thread_local _Atomic unsigned *marked; /* the seat the outermost one marked */

#if defined(__linux__) && defined(__NR_membarrier)
#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED (1 << 3)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED (1 << 4)
#endif
static bool barrier_register(void)
{
    return syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

static bool barrier_all(void)
{
    return syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}
#else
static bool barrier_register(void) { return false; }
static bool barrier_all(void) { return false; }
#endif

bool atap__spawn_enter(bool *outside)
{
    _Atomic unsigned *seat;

    *outside = atap__self == NULL;
    if (!*outside)
        return true;
    if (admitted > 0) {
        admitted++;
        return true;
    }
    if (ld_relaxed(&asym) && (seat = atap__table_outside_seat()) != NULL) {
        st_relaxed(seat, 1);
        /* The compiler keeps the store before the load; the shutdown's
         * barrier does the rest (see the top). */
        fence_compiler();
        if (ld_relaxed(&door)) {
            admitted = 1;
            marked = seat;
            TEST_HOOK(ATAP__TEST_ADMITTED);
            return true;
        }
        st_relaxed(seat, 0);
        return false;
    }
    add_seqcst(&inflight, 1);
    if (ld_seqcst(&door)) {
        admitted = 1;
        marked = NULL;
        TEST_HOOK(ATAP__TEST_ADMITTED);
        return true;
    }
    sub_seqcst(&inflight, 1);
    return false;
}

void atap__spawn_exit(bool outside)
{
    if (!outside || --admitted > 0)
        return;
    /* Release (and seq_cst): the shutdown that sees the mark gone sees the
     * task queued. */
    if (marked)
        st_release(marked, 0);
    else
        sub_seqcst(&inflight, 1);
}

bool atap__exec_door_barrier(bool on)
{
    asym_asked = true;
    st_relaxed(&asym, on && barrier_register());
    return ld_relaxed(&asym);
}

void atap__exec_door_open(void)
{
    if (!asym_asked)
        atap__exec_door_barrier(true);
    st_seqcst(&door, true);
}

void atap__exec_door_shut(void)
{
    struct timespec ms = {0, 1000000}, wait = {0, 20000000};

    st_seqcst(&door, false);
    /* Once registered, the barrier does not fail (membarrier(2)). Should it
     * ever, a spawn's mark leaves its store buffer in nanoseconds: wait far
     * longer than that before the look. */
    if (ld_relaxed(&asym) && !barrier_all())
        nanosleep(&wait, NULL);
    while (ld_seqcst(&inflight) != 0 || !atap__table_outside_seats_empty())
        nanosleep(&ms, NULL);
}

void atap__exec_door_forget(void)
{
    st_relaxed(&door, false);
    st_relaxed(&inflight, 0);
    admitted = 0;
    marked = NULL;
    /* A fork's child is a new process: registered again at its first
     * opening (the seats were cleared with the stashes, atap__table_forget). */
    asym_asked = false;
    st_relaxed(&asym, false);
}

/* ---- spawning ----------------------------------------------------------- */

/* No field about time is set: the task needs no schedule. */
static inline bool plain(const atap_spawn_opts *o)
{
    return (o->after_ns | o->timeout_ns | (uint64_t)o->kind | o->every_ns | o->runs | o->for_ns |
            o->until_ns) == 0;
}

static inline int check_opts(const atap_spawn_opts *o, bool waiting)
{
    if (o->priority < ATAP_PRIORITY_MIN || o->priority > ATAP_PRIORITY_MAX)
        return ATAP_EINVAL;
    if (!waiting && (o->gives || o->in_free))
        return ATAP_EINVAL; /* they belong to tasks that wait for gives */
    if (o->out_size > UINT32_MAX)
        return ATAP_EINVAL;
    if (plain(o))
        return 0; /* nothing about time to check */
    return atap__extras.time->check(o);
}

/* The task's fields of a freshly allocated slot, from option values the
 * caller read (so that no store here makes the compiler read them again). */
static inline __attribute__((always_inline)) void fill_fields(struct atap_slot *s, atap_fn *fn,
                                                              void *arg, uint8_t flags,
                                                              uint32_t out_size, int priority)
{
    s->flags = flags;
    s->filled = 0;
    s->fail_code = 0;
    s->out_size = out_size;
    s->priority = (int8_t)priority;
    s->fn = fn;
    s->arg = arg;
}

/* Fills a freshly allocated slot (whose side is NULL, as every free
 * slot's is); -ENOMEM leaves it as it was. The destructors go on a side
 * record: most tasks have none, and their slot stays one line. */
static inline __attribute__((always_inline)) int fill(struct atap_slot *s, atap_fn *fn, void *arg,
                                                      const atap_spawn_opts *o)
{
    uint8_t flags = o->blocking ? SF_BLOCKING : 0;
    struct side *side;

    if (!slot_out_inline(o->out_size)) {
        if (!(s->out.heap = atap__exec_out_alloc(o->out_size)))
            return -ENOMEM;
        flags |= SF_OUT_HEAP;
    }
    if (o->arg_free || o->out_free) {
        if (!(side = atap__side_of(s))) {
            if (flags & SF_OUT_HEAP)
                atap__exec_out_free(s->out.heap, o->out_size);
            return -ENOMEM;
        }
        side->arg_free = o->arg_free;
        side->out_free = o->out_free;
    }
    fill_fields(s, fn, arg, flags, (uint32_t)o->out_size, o->priority);
    return 0;
}

int atap__exec_check(const atap_spawn_opts *o, bool waiting) { return check_opts(o, waiting); }

int atap__exec_fill(struct atap_slot *s, atap_fn *fn, void *arg, const atap_spawn_opts *o)
{
    return fill(s, fn, arg, o);
}

void atap__exec_unfill(struct atap_slot *s)
{
    if (s->flags & SF_OUT_HEAP)
        atap__exec_out_free(s->out.heap, s->out_size);
    if (ld_relaxed(&s->side)) /* its destructors only: nothing else hangs on it yet */
        atap__side_free(s);
    s->flags = 0;
}

/*
 * A delay is the only thing about time the task asks for, and its slot can
 * keep it: a run-once task with no timeout, no output past the tail's
 * claim word (the wheel's links and deadline sit in the output's bytes
 * until the first run, which writes the output only then), not blocking,
 * not waiting for gives, and a delay within ATAP__DELAY_IN_SLOT_MAX. Such
 * a task waits for its deadline in its slot as a deadline park does
 * (park_wheel.c), PENDING, and needs no schedule: no record, no timer of
 * the manager's. Its destructors, if any, are on its side record, as any
 * task's (where the tail's claim word is follows from the output's size
 * alone: park_int.h, tail_claim).
 */
static inline bool delay_in_slot(const atap_spawn_opts *o, const struct gate *gate)
{
    return !gate && o->after_ns > 0 && o->after_ns <= ATAP__DELAY_IN_SLOT_MAX &&
           (o->timeout_ns | (uint64_t)o->kind | o->every_ns | o->runs | o->for_ns | o->until_ns) ==
               0 &&
           !o->blocking && o->out_size <= PARK_TAIL;
}

/* fill, and the schedule if the options use time or the task waits for
 * gives (but for a delay the slot keeps); on -ENOMEM nothing is left
 * allocated (the gate is the caller's). */
static inline __attribute__((always_inline)) int prepare(struct atap_slot *s, uint32_t index,
                                                         atap_fn *fn, void *arg,
                                                         const atap_spawn_opts *o,
                                                         struct gate *gate)
{
    int rc = fill(s, fn, arg, o);

    if (rc != 0 || (plain(o) && !gate))
        return rc;
    if (delay_in_slot(o, gate)) {
        s->flags |= SF_DELAYED;
        return 0;
    }
    if ((rc = atap__extras.time->attach(s, index, o, gate)) != 0)
        atap__exec_unfill(s);
    return rc;
}

static inline int spawn_slot(atap_task *task, atap_fn *fn, void *arg, const atap_spawn_opts *opts,
                             struct gate *gate)
{
    struct slot_cache *cache;
    uint32_t index, gen;
    struct atap_slot *s;
    bool outside;
    int rc;

    /* A spawn from a task is part of the work a shutdown drains: always in. */
    if ((outside = atap__self == NULL) && !atap__spawn_enter(&outside))
        return ATAP_ENOTINIT;
    cache = outside ? atap__table_outside_cache() : &atap__self->cache;
    if ((rc = atap__table_alloc(cache, &index, &gen)) == 0) {
        s = atap__table_at(index);
        if ((rc = prepare(s, index, fn, arg, opts, gate)) != 0) {
            /* Burn this generation: the slot goes back as (gen, FREE). */
            st_relaxed(&s->word, make_word(gen, ST_FREE));
            atap__table_free(cache, index, gen);
        } else {
            st_relaxed(&s->refs, refs_of(gen) | REFS_RUN | (gate ? REFS_GATED : 0) | REFS_HANDLE);
            /* Release: the fields above are visible to whoever acquires the
             * word (a reader) or the queue entry (a worker). */
            st_release(&s->word, make_word(gen, ST_PENDING));
            *task = make_task(index, gen);
            ATAP_TRACE(TR_SPAWN, task->id, fn, 0);
            if (unlikely(slot_sched(s)))
                atap__extras.time->start(s, index, gen, opts->blocking);
            else if (unlikely(s->flags & SF_DELAYED))
                atap__extras.park->delay(s, index, gen, atap__deadline_in(opts->after_ns));
            else
                atap__pool_submit_from(atap__self, index + 1, opts->priority, opts->blocking);
        }
    }
    if (outside)
        atap__spawn_exit(outside);
    return rc;
}

int atap__exec_spawn(atap_task *task, atap_fn *fn, void *arg, const atap_spawn_opts *opts,
                     struct gate *gate)
{
    return spawn_slot(task, fn, arg, opts, gate);
}

/* Options a task's spawn from a worker can take in one go: in this
 * library's layout (size 0 or sizeof: one layout while abi.h's static
 * assertion holds, so they are read where they lie), nothing about time or
 * gives, no destructor, a valid priority. An output of up to 24 bytes
 * stays in the slot (over arg for 17 to 24: slot.h); a larger one gets its
 * block at the task's first run (executor.c, out_late): while it waits in
 * a queue, a task holds its slot only. */
static inline bool quick(const atap_spawn_opts *o)
{
    return (o->size == 0 || o->size == sizeof *o) && plain(o) &&
           (o->gives | (uintptr_t)o->in_free | (uintptr_t)o->blocking | (uintptr_t)o->arg_free |
            (uintptr_t)o->out_free) == 0 &&
           o->out_size <= UINT32_MAX && o->priority >= ATAP_PRIORITY_MIN &&
           o->priority <= ATAP_PRIORITY_MAX;
}

/* The tail of a quick spawn (below): the slot is ours, the options are
 * plain; what spawn_slot does from here, with nothing left to check. A
 * NULL task: a detached spawn, with no handle's reference. */
static inline __attribute__((always_inline)) void
spawn_quick_publish(struct worker *w, atap_task *task, atap_fn *fn, void *arg,
                    const atap_spawn_opts *o, uint32_t index, uint32_t gen)
{
    struct atap_slot *s = atap__table_at(index);
    uint8_t flags = 0;

    if (unlikely(!slot_out_inline(o->out_size))) {
        /* Over arg as well (slot.h), or its block at its first run. */
        flags = o->out_size <= WIDE_OUT ? SF_OUT_WIDE : SF_OUT_HEAP;
        if (flags == SF_OUT_HEAP)
            s->out.heap = NULL;
    }
    fill_fields(s, fn, arg, flags, (uint32_t)o->out_size, o->priority);
    st_relaxed(&s->refs, refs_of(gen) | REFS_RUN | (task ? REFS_HANDLE : 0));
    /* Release: the fields above reach whoever acquires the word or the
     * queue entry (spawn_slot's order). */
    st_release(&s->word, make_word(gen, ST_PENDING));
    if (task)
        *task = make_task(index, gen);
    ATAP_TRACE(TR_SPAWN, make_task(index, gen).id, fn, 0);
    atap__pool_submit_from(w, index + 1, o->priority, false);
}

/* Everything else atap_spawn does, out of line: the quick path's frame
 * stays small. */
static __attribute__((noinline)) int spawn_checked(atap_task *task, atap_fn *fn, void *arg,
                                                   const atap_spawn_opts *opts)
{
    static const atap_spawn_opts plain;
    atap_spawn_opts copy;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if ((rc = atap__opts_in(&opts, &copy)) != 0) /* another layout: copied */
        return rc;
    opts = opts ? opts : &plain;
    if (!fn)
        return ATAP_EINVAL;
    if (unlikely((rc = check_opts(opts, false)) != 0))
        return rc;
    return spawn_slot(task, fn, arg, opts, NULL);
}

/* A quick spawn whose worker's stash is empty: a slot from the shared list
 * or the table's growth. */
static __attribute__((noinline)) int spawn_quick_shared(struct worker *w, atap_task *task,
                                                        atap_fn *fn, void *arg,
                                                        const atap_spawn_opts *o)
{
    uint32_t index, gen;
    int rc;

    if ((rc = atap__table_alloc_shared(&w->cache, &index, &gen)) != 0) {
        if (task) /* out of slots */
            *task = ATAP_NO_TASK;
        return rc;
    }
    spawn_quick_publish(w, task, fn, arg, o, index, gen);
    return 0;
}

/* A quick spawn from a thread outside the pool: admitted first (a
 * shutdown may be under way), a slot from the thread's stash or the shared
 * list, and the task into the shared queue. */
static __attribute__((noinline)) int spawn_quick_outside(atap_task *task, atap_fn *fn, void *arg,
                                                         const atap_spawn_opts *o)
{
    uint32_t index, gen;
    bool outside;
    int rc;

    if (task)
        *task = ATAP_NO_TASK;
    if (!atap__spawn_enter(&outside))
        return ATAP_ENOTINIT;
    if ((rc = atap__table_alloc(atap__table_outside_cache(), &index, &gen)) == 0)
        spawn_quick_publish(NULL, task, fn, arg, o, index, gen);
    atap__spawn_exit(outside);
    return rc;
}

/* A plain task's spawn (quick() options, not from a blocking thread):
 * from a task on a worker (inside, so admitted) with a slot from the
 * worker's stash, else from the shared list; from outside the pool through
 * spawn_quick_outside. No schedule, and no output block yet. task NULL: a
 * detached spawn. */
static inline __attribute__((always_inline)) int
spawn_quick(struct worker *w, atap_task *task, atap_fn *fn, void *arg, const atap_spawn_opts *opts)
{
    uint32_t index, gen;

    if (!w)
        return spawn_quick_outside(task, fn, arg, opts);
    if (!atap__table_take_stashed(&w->cache, &index, &gen))
        return spawn_quick_shared(w, task, fn, arg, opts);
    spawn_quick_publish(w, task, fn, arg, opts, index, gen);
    return 0;
}

/* A plain task takes the quick path; the rest goes through spawn_checked. */
int atap_spawn(atap_task *task, atap_fn *fn, void *arg, const atap_spawn_opts *opts)
{
    static const atap_spawn_opts none;
    struct worker *w = atap__self;

    if (unlikely(!task || !fn || (opts && !quick(opts)) || (w && w->blocking)))
        return spawn_checked(task, fn, arg, opts);
    return spawn_quick(w, task, fn, arg, opts ? opts : &none);
}

/* The quick path with no handle (task NULL); anything else through
 * atap_spawn and atap_release. */
int atap_spawn_detached(atap_fn *fn, void *arg, const atap_spawn_opts *opts)
{
    static const atap_spawn_opts none;
    struct worker *w = atap__self;
    atap_task t;
    int rc;

    if (likely(fn && (!opts || quick(opts)) && !(w && w->blocking)))
        return spawn_quick(w, NULL, fn, arg, opts ? opts : &none);
    if ((rc = atap_spawn(&t, fn, arg, opts)) == 0)
        atap_release(t);
    return rc;
}

/*
 * The slot table.
 *
 * Layout: TABLE_BLOCKS blocks; block b holds 256 << b slots and is mapped
 * the first time an index in it is handed out. A block is never unmapped or
 * moved (but in the child of a fork, which starts a new table before any
 * thread can read one: atap__table_forget, at the end), so a slot's address
 * is fixed for the life of the process and any
 * index below TABLE_MAX_INDEX whose block is mapped can be read at any time
 * (stale readers then see a generation that is not theirs). A zeroed slot
 * is a valid free slot with generation 0; it takes the generation `gen_base`
 * when first handed out.
 *
 * Allocation: pop the free list, else grow: map the block(s) the next
 * index (or run) lies in, then take it by a CAS on `next` (a stash takes
 * a run of GROW_RUN slots at once while the span is below TRIM_KEEP, so
 * threads that grow the table together keep apart). An index is taken only
 * with memory behind it, so a growth refused (-ENOMEM) takes nothing: an
 * index taken and never mapped could never be freed, and would stop every
 * trim below it for good. The free list is
 * a Treiber stack whose head is tag << 32 | (index + 1); every pop bumps the
 * tag, so a head that was popped and pushed back in between cannot be
 * mistaken for the one read (ABA). The link lives in the slot (`link`).
 *
 * Threads keep small stashes of free slots (struct slot_cache), only ever
 * of slots a trim keeps (below TRIM_KEEP or in the lower three quarters of
 * the span), so they never hide a slot of the free top from a trim.
 *
 * Trim (one at a time): drain the free list, find the free run at the top of
 * [floor, next), give its whole pages back with madvise(DONTNEED) while those
 * slots are reachable by nobody (off the free list, below `next`), then lower
 * `next` by CAS. If the table grew meanwhile the CAS fails and the zeroed
 * slots simply go back on the free list. Generations of the released slots
 * are folded into gen_base first, so a slot coming back zeroed can never hand
 * out a generation a stale handle still carries.
 */
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "atomics.h"
#include "faults.h"
#include "testing.h"

#define GROW_RUN 16 /* slots a stash takes from the table's growth at once */
_Static_assert(GROW_RUN <= SLOT_CACHE, "a run fits an empty stash");

/* A trim never lowers the span below TRIM_KEEP (table.h), nor below 80 %
 * of it, nor closer than 4096 slots to the live count. */

/* Read on every slot lookup, written once a block: lines of its own, so
 * the counters below (written on every shared allocation) never evict it. */
_Alignas(64) _Atomic(struct atap_slot *) atap__table_blocks[TABLE_BLOCKS];

static struct {
    _Alignas(64) _Atomic uint64_t free_head;
    _Atomic uint32_t next; /* one past the highest index handed out */
    _Atomic uint32_t peak;
    _Atomic uint32_t gen_base;
    /* Allocations and frees made through no stash, only counted up. */
    _Alignas(64) _Atomic uint64_t allocs, frees;
    atomic_flag trimming;
    _Atomic unsigned ncaches;
    _Atomic(struct slot_cache *) caches[4096];
} table __attribute__((aligned(64))) = {.gen_base = 1, .trimming = ATOMIC_FLAG_INIT};

static size_t block_bytes(unsigned b) { return ((size_t)1 << (TABLE_FIRST_LOG2 + b)) * SLOT_SIZE; }

static int map_block(unsigned b)
{
    struct atap_slot *expected = NULL;
    void *p;

    if (ld_acquire(&atap__table_blocks[b]))
        return 0;
    p = mmap(NULL, block_bytes(b), PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -ENOMEM;
#ifdef MADV_HUGEPAGE
    /* Big blocks fill front to back: fault them in 2 MiB at a time. One
     * partly used huge page at the front is the price (2 bytes a task at a
     * million tasks). */
    if (block_bytes(b) >= ((size_t)2 << 20))
        madvise(p, block_bytes(b), MADV_HUGEPAGE);
#endif
    /* The loser of a mapping race gives its copy back. */
    if (!cas_acqrel(&atap__table_blocks[b], &expected, p))
        munmap(p, block_bytes(b));
    return 0;
}

/* Pushes idx[0..n) on the free list with one CAS (idx[0] on top). */
static void push_free(const uint32_t *idx, unsigned n)
{
    struct atap_slot *last = atap__table_at(idx[n - 1]);
    uint64_t head = ld_relaxed(&table.free_head);

    for (unsigned i = 0; i + 1 < n; i++)
        st_relaxed(&atap__table_at(idx[i])->link, idx[i + 1] + 1);
    do {
        st_relaxed(&last->link, (uint32_t)head);
        /* Release: the slots' resets are visible to whoever pops them. */
    } while (!casw_release(&table.free_head, &head, (head & ~(uint64_t)UINT32_MAX) | (idx[0] + 1)));
}

/* Pops the free list; 0 when empty, else index + 1. */
static uint32_t pop_free(void)
{
    uint64_t head = ld_acquire(&table.free_head);

    while ((uint32_t)head != 0) {
        struct atap_slot *s = atap__table_at((uint32_t)head - 1);
        /* May read a link the slot's new owner is rewriting: harmless, the
         * tag makes the CAS fail. */
        uint64_t next = ld_relaxed(&s->link);
        uint64_t want = ((head >> 32) + 1) << 32 | next;

        if (casw_acqrel(&table.free_head, &head, want))
            return (uint32_t)head;
    }
    return 0;
}

static void note_peak(uint32_t span)
{
    uint32_t peak = ld_relaxed(&table.peak);

    while (span > peak && !casw_relaxed(&table.peak, &peak, span))
        ;
}

void atap__table_register_cache(struct slot_cache *c)
{
    unsigned n;

    if (c->registered)
        return;
    c->registered = true;
    n = add_relaxed(&table.ncaches, 1);
    if (n < sizeof table.caches / sizeof table.caches[0])
        st_release(&table.caches[n], c);
}

/* Release, and acquire in atap__table_live: whoever sees a task counted out
 * also sees everything its run did before it was freed (a caller may wait
 * for the live count to fall, then free what the tasks used). */
static void count_alloc(struct slot_cache *c)
{
    if (c)
        atap__table_count(&c->allocs);
    else
        add_release(&table.allocs, 1);
}

static void count_free(struct slot_cache *c)
{
    if (c)
        atap__table_count(&c->frees);
    else
        add_release(&table.frees, 1);
}

/* The rest of a run of slots taken from the table's growth (n fresh
 * slots from first on, their blocks mapped), for a stash: into it when the
 * run lies below TRIM_KEEP (the stash's rule: a trim never wants them),
 * lowest index handed out first; else onto the shared list. */
static void keep_run(struct slot_cache *c, uint32_t first, uint32_t n)
{
    uint32_t idx[GROW_RUN];

    if (first + n <= TRIM_KEEP) {
        for (uint32_t j = first + n; j-- > first;)
            c->idx[c->n++] = j;
        return;
    }
    for (uint32_t j = 0; j < n; j++)
        idx[j] = first + j;
    push_free(idx, n);
}

/* Takes the next index (and, for a stash, a run) from the table's growth,
 * its memory mapped first: -ENOMEM takes nothing (see the top). */
static int grow(struct slot_cache *c, uint32_t *index, uint32_t *gen)
{
    uint32_t i = ld_relaxed(&table.next), k, off;

    for (;;) {
        /* A stash takes a run of GROW_RUN at once while the span is small:
         * slots are not a cache line each, and two threads growing the
         * table one index at a time would take neighbours, then write
         * lines each other's tasks share. */
        k = c && i + GROW_RUN <= TRIM_KEEP ? GROW_RUN : 1;
        /* Mapped for good (but by a fork's child): a CAS that fails below
         * leaves a block for a later growth, never an index. */
        if (i >= TABLE_MAX_INDEX || map_block(atap__table_block_of(i, &off)) != 0 ||
            map_block(atap__table_block_of(i + k - 1, &off)) != 0)
            return -ENOMEM;
        /* Acquire: an index below a trim's lowered `next` comes with the
         * trim's raised gen_base (its release CAS on next), read below. A
         * failure reads the newer `next` to try again from; the success
         * that ends the loop is the read that counts. */
        if (casw_acquire(&table.next, &i, i + k))
            break;
    }
    if (k > 1)
        keep_run(c, i + 1, k - 1);
    *index = i;
    /* Above the span every slot is new or was trimmed (zeroed, or on a
     * page edge with a generation below gen_base): no need to read it,
     * which would fault the page in twice (zero page, then copy). */
    *gen = ld_relaxed(&table.gen_base);
    count_alloc(c);
    return 0;
}

int atap__table_alloc_shared(struct slot_cache *c, uint32_t *index, uint32_t *gen)
{
    uint32_t got, g;

    if (c && c->n > 0)
        got = c->idx[--c->n] + 1;
    else if ((got = pop_free()) == 0)
        return grow(c, index, gen);
    *index = got - 1;
    g = word_gen(ld_relaxed(&atap__table_at(*index)->word));
    *gen = g == 0 ? ld_relaxed(&table.gen_base) : g + 1;
    count_alloc(c);
    return 0;
}

void atap__table_free_shared(struct slot_cache *c, uint32_t index, uint32_t gen)
{
    count_free(c);
    if (gen >= GEN_MAX)
        return; /* retired: this slot never hands out another generation */
    /* Stashes keep only slots a trim never gives back: below TRIM_KEEP, or
     * in the lower three quarters of the span (a trim never lowers it below
     * 80 %). So no stashed slot can sit in the free top a trim wants. */
    if (!c || (index >= TRIM_KEEP && index >= ld_relaxed(&table.next) / 4 * 3)) {
        push_free(&index, 1);
        return;
    }
    if (c->n == SLOT_CACHE) { /* full: the older half goes back to everyone */
        push_free(c->idx, SLOT_CACHE / 2);
        memmove(c->idx, c->idx + SLOT_CACHE / 2, sizeof c->idx / 2);
        c->n -= SLOT_CACHE / 2;
    }
    c->idx[c->n++] = index;
}

/*
 * Stashes for threads outside the pool (the program's own threads), handed
 * out once per thread and taken back by a thread-exit destructor, which
 * returns the stashed slots. The stash keeps its counts (they only grow)
 * for the next thread to go on with. A destructor of a later key may still
 * spawn or release on the exiting thread: it does so without a stash, since
 * the stash may already be another thread's. With each stash goes a seat
 * at the door of spawn.c, marked by its thread while a spawn of its is
 * admitted (it is 0 whenever no thread holds the stash).
 */
#define OUTSIDE_STASHES 1024

static struct slot_cache outside[OUTSIDE_STASHES];
static _Atomic bool outside_used[OUTSIDE_STASHES];
/* A line each: a thread marks its seat twice a spawn, and threads that
 * spawn side by side must not share one. */
static struct {
    _Alignas(64) _Atomic unsigned in;
} outside_seat[OUTSIDE_STASHES];
static pthread_key_t outside_key;
static pthread_once_t outside_once = PTHREAD_ONCE_INIT;
_Thread_local struct slot_cache *atap__table_outside_mine;
_Thread_local _Atomic unsigned *atap__table_outside_seat_mine; /* goes with the stash */
static _Thread_local bool outside_none;                        /* every stash was taken */

static void outside_exit(void *arg)
{
    struct slot_cache *c = arg;

    if (c->n > 0)
        push_free(c->idx, c->n);
    c->n = 0;
    atap__table_outside_mine = NULL;
    atap__table_outside_seat_mine = NULL;
    outside_none = true;
    /* Release: the next thread to take it sees its slots and counts. */
    st_release(&outside_used[c - outside], false);
}

static void outside_init(void)
{
    if (pthread_key_create(&outside_key, outside_exit) != 0)
        outside_none = true;
}

struct slot_cache *atap__table_outside_first(void)
{
    bool expected = false;

    if (atap__table_outside_mine || outside_none)
        return atap__table_outside_mine;
    pthread_once(&outside_once, outside_init);
    for (unsigned i = 0; i < OUTSIDE_STASHES && !outside_none; i++) {
        if (ld_relaxed(&outside_used[i]) || !cas_acquire(&outside_used[i], &expected, true)) {
            expected = false;
            continue;
        }
        if (pthread_setspecific(outside_key, &outside[i]) != 0) {
            st_release(&outside_used[i], false);
            break;
        }
        atap__table_register_cache(&outside[i]);
        atap__table_outside_seat_mine = &outside_seat[i].in;
        return atap__table_outside_mine = &outside[i];
    }
    outside_none = true;
    return NULL;
}

bool atap__table_outside_seats_empty(void)
{
    for (unsigned i = 0; i < OUTSIDE_STASHES; i++)
        if (ld_acquire(&outside_seat[i].in) != 0)
            return false;
    return true;
}

/* Every stash's count of frees (or allocations), and the shared one. */
static uint64_t sum_counts(bool frees)
{
    unsigned n = ld_acquire(&table.ncaches);
    uint64_t sum = ld_acquire(frees ? &table.frees : &table.allocs);
    struct slot_cache *c;

    for (unsigned i = 0; i < n && i < sizeof table.caches / sizeof table.caches[0]; i++) {
        if ((c = ld_acquire(&table.caches[i])) != NULL)
            sum += ld_acquire(frees ? &c->frees : &c->allocs);
        TEST_HOOK(ATAP__TEST_LIVE_SCAN);
    }
    return sum;
}

/*
 * Frees first, then allocations. A task is allocated through one stash and
 * may be freed through another, and the counters are read one at a time:
 * each free seen was counted after its allocation (release) and read
 * before it (acquire), so the allocation is seen too. Read the other way
 * round, an allocation counted just after its stash was read and freed
 * before the other stash was could make the sum one short, even 0 while a
 * task lives. In this order the sum can only run over: a free not yet seen.
 */
size_t atap__table_live(void)
{
    uint64_t frees = sum_counts(true);
    uint64_t allocs = sum_counts(false);

    return allocs > frees ? (size_t)(allocs - frees) : 0;
}
size_t atap__table_span(void) { return ld_relaxed(&table.next); }
size_t atap__table_peak(void)
{
    uint32_t peak = ld_relaxed(&table.peak), span = ld_relaxed(&table.next);

    return peak > span ? peak : span;
}

/* madvise the whole pages inside slots [lo, hi); returns bytes given back. */
static size_t release_range(uint32_t lo, uint32_t hi)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t total = 0;

    while (lo < hi) {
        uint32_t off;
        unsigned b = atap__table_block_of(lo, &off);
        uint32_t first = lo - off, count = (1u << TABLE_FIRST_LOG2) << b;
        uint32_t end = hi < first + count ? hi : first + count;
        struct atap_slot *base = ld_acquire(&atap__table_blocks[b]);
        uintptr_t from = ((uintptr_t)(base + off) + page - 1) & ~(page - 1);
        uintptr_t to = (uintptr_t)(base + off + (end - lo)) & ~(page - 1);

        if (to > from && madvise((void *)from, to - from, MADV_DONTNEED) == 0)
            total += to - from;
        lo = end;
    }
    return total;
}

/* Highest generation among slots [lo, hi), to keep gen_base above them. */
static uint32_t top_gen(uint32_t lo, uint32_t hi)
{
    uint32_t g = 0;

    for (uint32_t i = lo; i < hi; i++) {
        uint32_t w = word_gen(ld_relaxed(&atap__table_at(i)->word));
        g = w > g ? w : g;
    }
    return g;
}

static size_t trim_locked(void)
{
    uint32_t high = ld_acquire(&table.next), n = 0, got, low, base, top;
    size_t live = atap__table_live(), floor, released;
    uint32_t *ids;
    unsigned char *top_free;

    floor = live + 4096;
    floor = floor > (size_t)high / 100 * 80 ? floor : (size_t)high / 100 * 80;
    floor = floor > TRIM_KEEP ? floor : TRIM_KEEP;
    if (floor >= high)
        return 0;
    ids = malloc(sizeof *ids * high);
    top_free = calloc(high - floor, 1);
    if (!ids || !top_free) {
        free(ids);
        free(top_free);
        return 0;
    }
    while (n < high && (got = pop_free()) != 0) {
        ids[n++] = got - 1;
        if (got - 1 >= floor && got - 1 < high)
            top_free[got - 1 - floor] = 1;
    }
    low = high;
    while (low > floor && top_free[low - 1 - floor])
        low--;
    released = 0;
    if (low < high) {
        top = top_gen(low, high);
        base = ld_relaxed(&table.gen_base);
        while (top + 1 > base && !casw_relaxed(&table.gen_base, &base, top + 1))
            ;
        released = release_range(low, high);
        /* The peak is the span's high-water mark: the span only ever falls
         * here, so the peak is kept up to date here, not on every growth. */
        note_peak(high);
        /* Acq_rel: the pages are gone before the span shrinks. */
        if (!cas_acqrel(&table.next, &high, low))
            low = high = UINT32_MAX; /* grew meanwhile: everything goes back */
    }
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < low || ids[i] >= high)
            push_free(&ids[i], 1);
    free(ids);
    free(top_free);
    return low == UINT32_MAX ? 0 : released;
}

int atap__table_trim(size_t *released)
{
    size_t bytes;

    if (released)
        *released = 0;
    if (flag_set_acquire(&table.trimming))
        return ATAP_EBUSY;
    bytes = trim_locked();
    flag_clear_release(&table.trimming);
    if (released)
        *released = bytes;
    return bytes ? 0 : ATAP_EBUSY;
}

int atap__test_set_slot_gen(uint32_t index, uint32_t gen)
{
    struct atap_slot *s = atap__table_slot(index);

    if (!s || gen == 0 || gen > GEN_MAX || word_state(ld_acquire(&s->word)) != ST_FREE)
        return ATAP_EINVAL;
    st_relaxed(&s->refs, refs_of(gen));
    st_release(&s->word, make_word(gen, ST_FREE));
    return 0;
}

uint32_t atap__table_index_of(const struct atap_slot *s)
{
    for (unsigned b = 0; b < TABLE_BLOCKS; b++) {
        const struct atap_slot *base = ld_acquire(&atap__table_blocks[b]);
        size_t n = (size_t)(1u << TABLE_FIRST_LOG2) << b;

        if (base && s >= base && s < base + n)
            return (uint32_t)((((1u << TABLE_FIRST_LOG2) << b) - (1u << TABLE_FIRST_LOG2)) +
                              (uint32_t)(s - base));
    }
    return UINT32_MAX;
}

void atap__table_flush_caches(void)
{
    unsigned n = ld_acquire(&table.ncaches);
    struct slot_cache *c;

    for (unsigned i = 0; i < n && i < sizeof table.caches / sizeof table.caches[0]; i++) {
        if ((c = ld_acquire(&table.caches[i])) != NULL && c->n > 0) {
            push_free(c->idx, c->n);
            c->n = 0;
        }
    }
}

/*
 * In a fork's child (its one thread; runtime.c): the parent's tasks are not
 * carried over, so the table starts anew. gen_base moves past the highest
 * generation any slot below the span carries, then every block is unmapped
 * (no other thread is here to read one) and the span, free list, stashes
 * and counts go back to zero. A handle from before the fork then names a
 * slot with no block behind it, or, once a new block is mapped there, a
 * slot whose generation starts at the new gen_base: ATAP_ENOTASK either
 * way. Past GEN_MAX, slots are handed out at GEN_MAX and retired when freed
 * (after about 2^27 forks of a busy table: memory, never a wrong read).
 * The outputs and arguments of the parent's tasks are not freed.
 */
void atap__table_forget(void)
{
    uint32_t span = ld_relaxed(&table.next), top = 0, base = ld_relaxed(&table.gen_base);

    span = span < TABLE_MAX_INDEX ? span : TABLE_MAX_INDEX;
    for (uint32_t i = 0; i < span; i++) {
        struct atap_slot *s = atap__table_slot(i);
        uint32_t g = s ? word_gen(ld_relaxed(&s->word)) : 0;

        top = g > top ? g : top;
    }
    base = top + 1 > base ? top + 1 : base;
    for (unsigned b = 0; b < TABLE_BLOCKS; b++) {
        struct atap_slot *p = ld_relaxed(&atap__table_blocks[b]);

        if (p)
            munmap(p, block_bytes(b));
        st_relaxed(&atap__table_blocks[b], NULL);
    }
    st_relaxed(&table.free_head, 0);
    st_relaxed(&table.next, 0);
    st_relaxed(&table.peak, 0);
    st_relaxed(&table.gen_base, base < GEN_MAX ? base : GEN_MAX);
    st_relaxed(&table.allocs, 0);
    st_relaxed(&table.frees, 0);
    flag_clear_relaxed(&table.trimming);
    st_relaxed(&table.ncaches, 0);
    for (size_t i = 0; i < sizeof table.caches / sizeof table.caches[0]; i++)
        st_relaxed(&table.caches[i], NULL);
    /* The stashes: every thread that held one is gone but this one, whose
     * key still names its stash: unset, so its exit gives back nothing. */
    if (atap__table_outside_mine)
        pthread_setspecific(outside_key, NULL);
    atap__table_outside_mine = NULL;
    atap__table_outside_seat_mine = NULL;
    outside_none = false;
    memset(outside, 0, sizeof outside);
    for (unsigned i = 0; i < OUTSIDE_STASHES; i++) {
        st_relaxed(&outside_used[i], false);
        st_relaxed(&outside_seat[i].in, 0); /* a gone thread's spawn */
    }
}

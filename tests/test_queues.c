/*
 * The pool's internal queues, driven directly: the Chase-Lev ring, the
 * banded shared queue (FIFO per band, aging, exactly-once under many
 * producers and consumers), the slot table's free list under contention,
 * and pool behaviours seen from outside (ring overflow, idle blocking
 * threads stopping, the order of work spawned from outside).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "deque.h"
#include "injector.h"
#include "table.h"
#include "test_util.h"

#define REFS 4096

/* Slot references (index + 1) the queues can link through. */
static uint32_t refs[REFS];

static int take_refs(void **state)
{
    (void)state;
    for (unsigned i = 0; i < REFS; i++) {
        uint32_t index, gen;
        if (atap__table_alloc(NULL, &index, &gen) != 0)
            return -1;
        refs[i] = index + 1;
        if (i > 0 && refs[i] != refs[i - 1] + 1)
            return -1; /* the tests index their tables by ref - refs[0] */
        atap__table_at(index)->priority = 0;
    }
    return 0;
}

static int give_refs(void **state)
{
    (void)state;
    for (unsigned i = 0; i < REFS; i++)
        atap__table_free(NULL, refs[i] - 1, 1);
    return 0;
}

/* ---- the ring --------------------------------------------------------- */

struct ring_run {
    struct ring ring;
    atomic_int seen[REFS];
    atomic_int taken; /* entries that left the ring this round */
    atomic_bool done;
};

static void took(struct ring_run *r, uint32_t x)
{
    atomic_fetch_add(&r->seen[x - 1], 1);
    atomic_fetch_add(&r->taken, 1);
}

static void *thief(void *arg)
{
    struct ring_run *r = arg;

    while (!atomic_load(&r->done)) {
        uint32_t x = ring_steal(&r->ring);
        if (x != 0 && x != UINT32_MAX)
            took(r, x);
        else if (x == 0)
            sched_yield();
    }
    return NULL;
}

/* The owner pops what is left, and every one of the round's `pushed`
 * entries (1..pushed) must have left the ring exactly once. */
static void round_end(struct ring_run *r, unsigned round, int pushed)
{
    uint32_t x;

    while ((x = ring_pop(&r->ring)) != 0)
        took(r, x);
    while (atomic_load(&r->taken) < pushed) /* a thief may be mid-count */
        sched_yield();
    for (int i = 0; i < pushed; i++) {
        int seen = atomic_exchange(&r->seen[i], 0);
        if (seen != 1)
            fail_msg("round %u: entry %d taken %d times", round, i + 1, seen);
    }
    assert_int_equal(atomic_load(&r->taken), pushed);
}

/* Runs `rounds` owner rounds of fill_and_take on one ring while two
 * thieves steal from it; each round ends with round_end's check. */
static void with_thieves(void (*fill_and_take)(struct ring_run *r, unsigned round))
{
    struct ring_run *r = calloc(1, sizeof *r);
    pthread_t t[2];
    unsigned rounds = scaled(300, 60);

    assert_non_null(r);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thief, r), 0);
    for (unsigned round = 0; round < rounds; round++) {
        atomic_store(&r->taken, 0);
        fill_and_take(r, round);
        round_end(r, round, RING_SIZE);
    }
    atomic_store(&r->done, true);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    free(r);
}

/* Pushes RING_SIZE entries, popping every third. */
static void push_and_pop(struct ring_run *r, unsigned round)
{
    uint32_t x;

    (void)round;
    for (unsigned i = 0; i < RING_SIZE; i++) {
        assert_true(ring_push(&r->ring, i + 1));
        if (i % 3 == 2 && (x = ring_pop(&r->ring)) != 0)
            took(r, x);
    }
}

/* Pushes RING_SIZE entries, moving the oldest out in batches of varied
 * size (as a full ring moves half to the shared queue); a batch comes out
 * oldest first. */
static void push_and_take_oldest(struct ring_run *r, unsigned round)
{
    uint32_t batch[RING_SIZE / 2];
    unsigned n;

    for (unsigned i = 0; i < RING_SIZE; i++) {
        assert_true(ring_push(&r->ring, i + 1));
        if (i % 50 != 49 && i != RING_SIZE - 1)
            continue;
        while ((n = ring_take_oldest(&r->ring, batch, 1 + i % (RING_SIZE / 2))) == 0 &&
               ring_len(&r->ring) > 0)
            ; /* a thief took from the top first */
        for (unsigned k = 0; k < n; k++) {
            if (k > 0 && batch[k] <= batch[k - 1])
                fail_msg("round %u: batch out of order at %u", round, k);
            took(r, batch[k]);
        }
    }
}

/* Pushes RING_SIZE entries, taking one from under the newest ones every
 * seventh push (as a join digs out the task it waits for, help.c): what
 * comes out is the entry that lay that deep, or nothing if a thief took
 * it; the newer ones stay. */
static void push_and_take_at(struct ring_run *r, unsigned round)
{
    uint32_t x;

    for (unsigned i = 0; i < RING_SIZE; i++) {
        assert_true(ring_push(&r->ring, i + 1));
        if (i % 7 != 6)
            continue;
        unsigned depth = 1 + i % 9;
        if ((x = ring_take_at(&r->ring, depth)) != 0) {
            if (x > i + 1 - (depth - 1))
                fail_msg("round %u: took %u from depth %u after pushing %u", round, x, depth,
                         i + 1);
            took(r, x);
        }
    }
}

/* The owner pushes and pops while two thieves steal: every entry leaves
 * the ring exactly once. */
static void test_queues_ring_exactly_once(void **state)
{
    (void)state;
    with_thieves(push_and_pop);
}

/* The owner moves its oldest entries out in batches while two thieves
 * steal: every entry leaves exactly once. */
static void test_queues_ring_take_oldest_exactly_once(void **state)
{
    (void)state;
    with_thieves(push_and_take_oldest);
}

/* The owner takes entries from under newer ones while two thieves steal:
 * every entry leaves exactly once. */
static void test_queues_ring_take_at_exactly_once(void **state)
{
    (void)state;
    with_thieves(push_and_take_at);
}

/* Taken from under newer entries, alone: the entry that lay that deep
 * comes out, and the rest leave in their order. */
static void test_queues_ring_take_at(void **state)
{
    (void)state;
    struct ring *r = calloc(1, sizeof *r);

    assert_non_null(r);
    assert_int_equal(ring_take_at(r, 1), 0); /* empty */
    for (unsigned i = 1; i <= 10; i++)
        assert_true(ring_push(r, i));
    assert_int_equal(ring_take_at(r, 3), 8);
    assert_int_equal(ring_take_at(r, 1), 10);
    assert_int_equal(ring_take_at(r, 8), 1); /* the oldest: the top */
    assert_int_equal(ring_take_at(r, 8), 0); /* no entry lies that deep */
    assert_int_equal(ring_steal(r), 2);      /* oldest first from the top */
    for (uint32_t want = 9; want >= 3; want--) {
        if (want == 8)
            continue;
        assert_int_equal(ring_pop(r), want);
    }
    assert_int_equal(ring_pop(r), 0);
    free(r);
}

/* A full ring refuses the push rather than overwriting. */
static void test_queues_ring_full(void **state)
{
    (void)state;
    struct ring *r = calloc(1, sizeof *r);

    assert_non_null(r);
    for (unsigned i = 0; i < RING_SIZE; i++)
        assert_true(ring_push(r, i + 1));
    assert_false(ring_push(r, 999));
    assert_int_equal(ring_steal(r), 1); /* oldest from the top */
    assert_true(ring_push(r, 999));
    assert_int_equal(ring_pop(r), 999); /* newest from the bottom */
    free(r);
}

/* A steal bounded by index takes the oldest entry only while its index
 * lies in the range (entries pushed at or above a mark, or below one). */
static void test_queues_ring_steal_between(void **state)
{
    (void)state;
    struct ring *r = calloc(1, sizeof *r);
    int64_t mark;

    assert_non_null(r);
    assert_int_equal(ring_steal_between(r, INT64_MIN, INT64_MAX), 0); /* empty */
    for (unsigned i = 0; i < 3; i++)
        assert_true(ring_push(r, 10 + i)); /* indices 0..2: "before the mark" */
    mark = ld_relaxed(&r->bottom);
    for (unsigned i = 0; i < 2; i++)
        assert_true(ring_push(r, 20 + i)); /* indices 3..4: at or above it */
    /* The oldest lies below the mark: a look from the mark takes nothing. */
    assert_int_equal(ring_steal_from(r, mark), 0);
    assert_int_equal(ring_len(r), 5);
    /* Below the mark, one at a time, oldest first, until the mark. */
    assert_int_equal(ring_steal_between(r, INT64_MIN, mark), 10);
    assert_int_equal(ring_steal_between(r, INT64_MIN, mark), 11);
    assert_int_equal(ring_steal_between(r, INT64_MIN, mark), 12);
    assert_int_equal(ring_steal_between(r, INT64_MIN, mark), 0);
    assert_int_equal(ring_len(r), 2);
    /* Then what was pushed after the mark, and nothing past the bottom. */
    assert_int_equal(ring_steal_from(r, mark), 20);
    assert_int_equal(ring_pop(r), 21);
    assert_int_equal(ring_steal_from(r, mark), 0);
    assert_int_equal(ring_pop(r), 0);
    free(r);
}

/* ---- the shared queue ------------------------------------------------- */

static struct injector *new_queue(void)
{
    struct injector *q = calloc(1, sizeof *q);
    assert_non_null(q);
    return q;
}

/* One band is FIFO, across pushes of single entries and of batches. */
static void test_queues_injector_fifo(void **state)
{
    (void)state;
    struct injector *q = new_queue();
    struct inj_cursor c = {{0}};
    uint32_t out[16];
    unsigned next = 0, pushed = 300, n;

    for (unsigned i = 0; i < 100; i++)
        atap__inj_push(q, &refs[i], 1, 2);
    atap__inj_push(q, &refs[100], 50, 2); /* a batch, oldest first */
    for (unsigned i = 150; i < 300; i++)
        atap__inj_push(q, &refs[i], 1, 2);
    assert_int_equal(atap__inj_len(q), 300);
    while ((n = atap__inj_pop(q, &c, out, 7)) > 0) {
        for (unsigned i = 0; i < n; i++)
            assert_int_equal(out[i], refs[next++]);
        /* The length counts what a flip keeps as well as what pops take. */
        assert_int_equal(atap__inj_len(q), pushed - next);
        if (next == 140) /* pushes between pops: one more flip later */
            for (; pushed < 310; pushed++)
                atap__inj_push(q, &refs[pushed], 1, 2);
    }
    assert_int_equal(next, 310);
    assert_int_equal(atap__inj_len(q), 0);
    assert_true(atap__inj_empty(q));
    free(q);
}

/* Higher bands first; a low band still served under a flood of high. */
static void test_queues_injector_bands_and_aging(void **state)
{
    (void)state;
    struct injector *q = new_queue();
    struct inj_cursor c = {{0}};
    uint32_t out;
    unsigned pops = 0, low_at = 0;

    atap__inj_push(q, &refs[0], 1, 0); /* one low-priority task */
    atap__inj_push(q, &refs[1], 1, 1);
    atap__inj_push(q, &refs[2], 1, 3);
    assert_int_equal(atap__inj_pop(q, &c, &out, 1), 1);
    assert_int_equal(out, refs[2]); /* band 3 first */
    assert_int_equal(atap__inj_pop(q, &c, &out, 1), 1);
    assert_int_equal(out, refs[1]);
    /* Now a flood of band 3, refilled as fast as it drains. */
    for (unsigned i = 0; i < 64; i++)
        atap__inj_push(q, &refs[10 + i], 1, 3);
    while (low_at == 0 && pops < 10 * INJ_AGE) {
        assert_int_equal(atap__inj_pop(q, &c, &out, 1), 1);
        pops++;
        if (out == refs[0])
            low_at = pops;
        else
            atap__inj_push(q, &out, 1, 3); /* the flood never ends */
    }
    if (low_at == 0 || low_at > INJ_AGE + 1)
        fail_msg("the low band was served after %u pops (limit %u)", low_at, INJ_AGE + 1);
    free(q);
}

struct inj_run {
    struct injector *q;
    atomic_int seen[REFS];
    atomic_int produced;
    atomic_int out_of_order;
    unsigned per_producer;
    int producer;
};

static void *producer(void *arg)
{
    struct inj_run *r = ((struct inj_run **)arg)[0];
    int id = (int)(intptr_t)((void **)arg)[1];
    unsigned base = (unsigned)id * r->per_producer;

    for (unsigned i = 0; i < r->per_producer; i++) {
        atap__inj_push(r->q, &refs[base + i], 1, (int)(i % INJ_BANDS));
        atomic_fetch_add(&r->produced, 1);
    }
    return NULL;
}

/* Entry refs[k] is producer k / per_producer's push number k % per_producer,
 * made into band (k % per_producer) % INJ_BANDS. One consumer takes a
 * band's oldest entries at a time, so the pushes of one producer into one
 * band reach any one consumer in the order they were made. */
static void *consumer(void *arg)
{
    struct inj_run *r = arg;
    struct inj_cursor c = {{0}};
    uint32_t out[16];
    int total = (int)(4 * r->per_producer);
    long last[4][INJ_BANDS];
    uint64_t idle_since = 0;

    for (int p = 0; p < 4; p++)
        for (int b = 0; b < INJ_BANDS; b++)
            last[p][b] = -1;
    for (;;) {
        unsigned n = atap__inj_pop(r->q, &c, out, 16);
        for (unsigned i = 0; i < n; i++) {
            unsigned k = (unsigned)(out[i] - refs[0]), p = k / r->per_producer;
            long push = (long)(k % r->per_producer);

            atomic_fetch_add(&r->seen[k], 1);
            if (push <= last[p][push % INJ_BANDS])
                atomic_fetch_add(&r->out_of_order, 1);
            last[p][push % INJ_BANDS] = push;
        }
        if (n == 0) {
            if (atomic_load(&r->produced) == total && atap__inj_empty(r->q))
                return NULL;
            if (!idle_since)
                idle_since = now_ns();
            else if (now_ns() - idle_since > UINT64_C(10000000000))
                return NULL; /* stuck: an entry never comes out (seen says which) */
            sched_yield();
        } else {
            idle_since = 0;
        }
    }
}

/* 4 producers, 3 consumers, every band: each entry comes out exactly once. */
static void test_queues_injector_exactly_once(void **state)
{
    (void)state;
    unsigned rounds = scaled(20, 5);

    for (unsigned round = 0; round < rounds; round++) {
        struct inj_run *r = calloc(1, sizeof *r);
        pthread_t p[4], c[3];
        void *args[4][2];

        assert_non_null(r);
        r->q = new_queue();
        r->per_producer = REFS / 4;
        for (int i = 0; i < 3; i++)
            assert_int_equal(pthread_create(&c[i], NULL, consumer, r), 0);
        for (int i = 0; i < 4; i++) {
            args[i][0] = r;
            args[i][1] = (void *)(intptr_t)i;
            assert_int_equal(pthread_create(&p[i], NULL, producer, args[i]), 0);
        }
        for (int i = 0; i < 4; i++)
            pthread_join(p[i], NULL);
        for (int i = 0; i < 3; i++)
            pthread_join(c[i], NULL);
        for (unsigned i = 0; i < REFS; i++)
            if (atomic_load(&r->seen[i]) != 1)
                fail_msg("round %u: entry %u came out %d times", round, i,
                         atomic_load(&r->seen[i]));
        assert_int_equal(atomic_load(&r->out_of_order), 0);
        free(r->q);
        free(r);
    }
}

struct recycle_run {
    struct injector *q;
    atomic_int queued[REFS]; /* 1 while the entry is in the queue */
    atomic_int popped[REFS];
    atomic_long left; /* pops still to come */
    atomic_int bad;
    atomic_bool stop; /* the main thread saw no progress for 10 s */
};

#define RECYCLE_TIMES 64

/* Pops and pushes back what it popped (a slot freed and queued again at
 * once), until every entry has been through RECYCLE_TIMES times. */
static void *recycler(void *arg)
{
    struct recycle_run *r = arg;
    struct inj_cursor c = {{0}};
    uint32_t out[16];

    while (atomic_load(&r->left) > 0 && !atomic_load(&r->stop)) {
        unsigned n = atap__inj_pop(r->q, &c, out, 1 + (unsigned)(atomic_load(&r->left) % 16));
        if (n == 0) {
            sched_yield();
            continue;
        }
        for (unsigned i = 0; i < n; i++) {
            unsigned k = (unsigned)(out[i] - refs[0]);
            if (k >= REFS || atomic_exchange(&r->queued[k], 0) != 1)
                atomic_fetch_add(&r->bad, 1); /* never pushed, or out twice */
            else if (atomic_fetch_add(&r->popped[k], 1) + 1 < RECYCLE_TIMES) {
                atomic_store(&r->queued[k], 1);
                atap__inj_push(r->q, &out[i], 1, (int)(k % INJ_BANDS));
            }
        }
        atomic_fetch_sub(&r->left, n);
    }
    return NULL;
}

/* Entries leave and come back while others are pushed and popped (as a
 * freed slot is queued again): none is lost, none comes out twice, and the
 * queue ends empty. */
static void test_queues_injector_recycled(void **state)
{
    (void)state;
    unsigned rounds = scaled(4, 1);

    for (unsigned round = 0; round < rounds; round++) {
        struct recycle_run *r = calloc(1, sizeof *r);
        pthread_t t[3];

        assert_non_null(r);
        r->q = new_queue();
        atomic_store(&r->left, (long)REFS * RECYCLE_TIMES);
        for (int i = 0; i < 3; i++)
            assert_int_equal(pthread_create(&t[i], NULL, recycler, r), 0);
        for (unsigned k = 0; k < REFS; k++) {
            atomic_store(&r->queued[k], 1);
            atap__inj_push(r->q, &refs[k], 1, (int)(k % INJ_BANDS));
        }
        /* A lost entry shows as pops that never come: stop and say so. */
        long seen = atomic_load(&r->left);
        uint64_t quiet_since = now_ns();
        while (seen > 0) {
            long left;
            usleep(1000);
            if ((left = atomic_load(&r->left)) != seen) {
                seen = left;
                quiet_since = now_ns();
            } else if (now_ns() - quiet_since > UINT64_C(10000000000)) {
                atomic_store(&r->stop, true);
                fail_msg("round %u: %ld pops never came", round, seen);
            }
        }
        for (int i = 0; i < 3; i++)
            pthread_join(t[i], NULL);
        assert_false(atomic_load(&r->stop));
        assert_int_equal(atomic_load(&r->bad), 0);
        for (unsigned k = 0; k < REFS; k++)
            if (atomic_load(&r->popped[k]) != RECYCLE_TIMES)
                fail_msg("round %u: entry %u came out %d times", round, k,
                         atomic_load(&r->popped[k]));
        assert_true(atap__inj_empty(r->q));
        assert_int_equal(atap__inj_len(r->q), 0);
        free(r->q);
        free(r);
    }
}

/* ---- the free list ------------------------------------------------------ */

struct alloc_run {
    atomic_int bad;
    unsigned iterations;
};

/* Allocates, marks, frees, over and over: no slot is ever handed to two
 * threads at once (the ABA-safe pop). */
static void *allocator(void *arg)
{
    struct alloc_run *r = arg;
    uint32_t held[8], gen[8];

    for (unsigned i = 0; i < r->iterations; i++) {
        for (int k = 0; k < 8; k++) {
            if (atap__table_alloc(NULL, &held[k], &gen[k]) != 0) {
                atomic_fetch_add(&r->bad, 1);
                return NULL;
            }
            /* Claim it: a slot handed to two threads at once shows up as a
             * state that is not FREE, or a lost CAS. */
            _Atomic uint32_t *word = &atap__table_at(held[k])->word;
            uint32_t w = atomic_load(word);
            if ((w & 0xfu) != 0 || !atomic_compare_exchange_strong(word, &w, w | 1u))
                atomic_fetch_add(&r->bad, 1);
        }
        for (int k = 0; k < 8; k++) {
            _Atomic uint32_t *word = &atap__table_at(held[k])->word;
            uint32_t w = atomic_load(word);
            if ((w & 0xfu) != 1u || !atomic_compare_exchange_strong(word, &w, w & ~0xfu))
                atomic_fetch_add(&r->bad, 1);
            atap__table_free(NULL, held[k], gen[k]);
        }
    }
    return NULL;
}

static void test_queues_free_list_under_contention(void **state)
{
    (void)state;
    struct alloc_run r = {.iterations = scaled(20000, 2000)};
    pthread_t t[4];
    size_t live0 = atap__table_live();

    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, allocator, &r), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&r.bad), 0);
    assert_int_equal(atap__table_live(), live0);
}

/* ---- the pool, from outside ---------------------------------------------- */

static atomic_long g_children;

static int child(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&g_children, 1);
    return 0;
}

/* A task that spawns far more than a ring holds (256): the overflow moves to
 * the shared queue and every child runs. */
static int spawner(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    long n = (long)(intptr_t)arg;
    for (long i = 0; i < n; i++) {
        atap_task t;
        CHECK(atap_spawn(&t, child, NULL, NULL) == 0);
        atap_release(t);
    }
    return 0;
}

static void test_queues_ring_overflow_runs_everything(void **state)
{
    (void)state;
    long n = (long)scaled(20000, 5000);
    atap_task t;

    atomic_store(&g_children, 0);
    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(atap_spawn(&t, spawner, (void *)(intptr_t)n, NULL), 0);
    assert_int_equal(atap_join(t, NULL, 0), 0);
    atap_release(t);
    assert_int_equal(atap_shutdown(), 0); /* drains */
    assert_int_equal(atomic_load(&g_children), n);
    assert_no_failures();
}

/* ---- the order of work queued from outside ----------------------------- */

#define N_OUTSIDE 40 /* more than one batch taken from the shared queue */

static atomic_int g_ran;
static int g_ran_as[N_OUTSIDE]; /* task i was the g_ran_as[i]-th to run */

static int note_turn(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)out;
    g_ran_as[(intptr_t)arg] = atomic_fetch_add(&g_ran, 1);
    return 0;
}

/* Tasks spawned from outside the pool go through the shared queue, which
 * a worker takes a batch at a time: they still start in the order they
 * were spawned (with one worker, nobody else to take any). */
static void test_queues_outside_spawns_run_in_order(void **state)
{
    (void)state;
    atap_task holder, t[N_OUTSIDE];
    gate *g = gate_new(0);

    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 1}), 0);
    atomic_store(&g_ran, 0);
    /* The only worker waits in the gate (a plain sleep: a wait of
     * libatap's could run queued work meanwhile) while the spawns queue. */
    holder = spawn8(task_gated, g);
    assert_true(wait_atomic_at_least(&g->started, 1, ATAP_SEC(10)));
    for (intptr_t i = 0; i < N_OUTSIDE; i++)
        assert_int_equal(atap_spawn(&t[i], note_turn, (void *)i, NULL), 0);
    atomic_store(&g->open, 1);
    for (int i = 0; i < N_OUTSIDE; i++) {
        assert_int_equal(atap_join_for(t[i], NULL, 0, ATAP_SEC(10)), 0);
        atap_release(t[i]);
    }
    assert_int_equal(join8(holder), 0);
    atap_release(holder);
    for (int i = 0; i < N_OUTSIDE; i++)
        assert_int_equal(g_ran_as[i], i);
    assert_int_equal(atap_shutdown(), 0);
    assert_no_failures();
}

static int sleepy(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    usleep(20000);
    return 0;
}

/* Blocking threads start on demand and stop after idling a while. */
static void test_queues_blocking_threads_stop_when_idle(void **state)
{
    (void)state;
    atap_task t[4];
    struct atap_pool_stats st;

    assert_int_equal(atap_init(NULL), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(atap_spawn(&t[i], sleepy, NULL, &(atap_spawn_opts){.blocking = true}), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atap_join(t[i], NULL, 0), 0);
        atap_release(t[i]);
    }
    assert_int_equal(atap_pool_stats(&st), 0);
    assert_true(st.blocking_threads >= 1);
    uint64_t end = now_ns() + ATAP_SEC(10);
    do {
        usleep(50000);
        assert_int_equal(atap_pool_stats(&st), 0);
    } while (st.blocking_threads > 0 && now_ns() < end);
    assert_int_equal(st.blocking_threads, 0);
    assert_true(st.workers >= 1); /* workers have a floor, blocking threads none */
    assert_int_equal(atap_shutdown(), 0);
}

/* A searcher off its CPU (pool.c): one worker is held in its spin as a
 * searcher (the hook stands in for a CPU the kernel gave to another
 * thread) while the other sleeps. Spawns from outside see the searcher;
 * before, they woke nobody and every task waited for the held searcher.
 * Now a shared queue that grows past a searcher wakes the sleeper, and
 * every task runs while the searcher is still held. */
enum { N_PAST_SEARCHER = 4000 };
static atomic_int g_searcher_held, g_hold_searcher, g_past_ran;

static void hold_searcher(void)
{
    int none = 0;

    if (!atomic_compare_exchange_strong(&g_searcher_held, &none, 1))
        return; /* the first searcher only */
    while (atomic_load(&g_hold_searcher))
        usleep(1000);
}

static int count_past(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    atomic_fetch_add(&g_past_ran, 1);
    return 0;
}

static void test_queues_searcher_off_cpu_wakes_another(void **state)
{
    (void)state;
    bool all_ran;

    atomic_store(&g_searcher_held, 0);
    atomic_store(&g_hold_searcher, 1);
    atomic_store(&g_past_ran, 0);
    assert_int_equal(atap_init(&(atap_config){.size = sizeof(atap_config), .workers = 2}), 0);
    assert_int_equal(atap__test_on(ATAP__TEST_SEARCHING, hold_searcher), 0);
    /* A run wakes a worker, which searches once it is done (else a worker
     * searching since the start is held already). */
    assert_int_equal(atap_spawn_detached(count_past, NULL, NULL), 0);
    assert_true(wait_atomic_at_least(&g_searcher_held, 1, ATAP_SEC(10)));
    usleep(50000); /* the other worker, no searcher itself, parks */
    atomic_store(&g_past_ran, 0);
    for (int i = 0; i < N_PAST_SEARCHER; i++)
        assert_int_equal(atap_spawn_detached(count_past, NULL, NULL), 0);
    all_ran = wait_atomic_at_least(&g_past_ran, N_PAST_SEARCHER, ATAP_SEC(5) * test_slack());
    /* Still held: the runs were the other worker's. */
    assert_int_equal(atomic_load(&g_hold_searcher), 1);
    assert_int_equal(atap__test_on(ATAP__TEST_SEARCHING, NULL), 0);
    atomic_store(&g_hold_searcher, 0);
    assert_true(all_ran);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atomic_load(&g_past_ran), N_PAST_SEARCHER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queues_ring_exactly_once),
        cmocka_unit_test(test_queues_ring_take_oldest_exactly_once),
        cmocka_unit_test(test_queues_ring_full),
        cmocka_unit_test(test_queues_ring_take_at),
        cmocka_unit_test(test_queues_ring_take_at_exactly_once),
        cmocka_unit_test(test_queues_ring_steal_between),
        cmocka_unit_test(test_queues_injector_fifo),
        cmocka_unit_test(test_queues_injector_bands_and_aging),
        cmocka_unit_test(test_queues_injector_exactly_once),
        cmocka_unit_test(test_queues_injector_recycled),
        cmocka_unit_test(test_queues_free_list_under_contention),
        cmocka_unit_test(test_queues_ring_overflow_runs_everything),
        cmocka_unit_test(test_queues_blocking_threads_stop_when_idle),
        cmocka_unit_test(test_queues_outside_spawns_run_in_order),
        cmocka_unit_test(test_queues_searcher_off_cpu_wakes_another),
    };
    return cmocka_run_group_tests(tests, take_refs, give_refs);
}

/*
 * Channels (src/tasks/channel.c): MPMC FIFO queues whose receive, and on a
 * bounded channel whose send, is a task that parks. Each value received
 * exactly once, FIFO, ends counted both ways, elem_free on every value the
 * channel drops or nobody took, cancels and run timeouts of parked channel
 * tasks, and the races of closing and cancelling against waking.
 *
 * Values are uint64_t numbers below MAX_V unless said otherwise; u64_free
 * counts, per number, how often elem_free saw it, so "exactly once" can be
 * checked over received + released. Upper time bounds are generous (the CI
 * machine is a loaded 2-core VM); everything a task or a helper thread
 * touches is static and atomic.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <malloc.h>

#include "test_util.h"
#include "testing.h"

/* ---- counters ------------------------------------------------------------ */

#define MAX_V 100000

static atomic_int g_frees;        /* elem_free calls */
static atomic_int g_freed[MAX_V]; /* elem_free calls per value */
static atomic_int g_seen[MAX_V];  /* receptions per value */

static void reset_counts(void)
{
    atomic_store(&g_frees, 0);
    for (size_t i = 0; i < MAX_V; i++) {
        atomic_store_explicit(&g_freed[i], 0, memory_order_relaxed);
        atomic_store_explicit(&g_seen[i], 0, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

/* elem_free for uint64_t values. Any thread. */
static void u64_free(void *value)
{
    uint64_t v;
    memcpy(&v, value, sizeof v);
    CHECK(v < MAX_V);
    if (v < MAX_V)
        atomic_fetch_add(&g_freed[v], 1);
    atomic_fetch_add(&g_frees, 1);
}

/* Any thread. */
static void mark_seen(uint64_t v)
{
    CHECK(v < MAX_V);
    if (v < MAX_V)
        atomic_fetch_add(&g_seen[v], 1);
}

/* ---- helpers ------------------------------------------------------------- */

static atap_chan *open_chan(size_t elem, size_t cap, void (*elem_free)(void *))
{
    atap_chan *ch = NULL;
    assert_int_equal(atap_chan_open(&ch, elem, cap, elem_free), 0);
    assert_non_null(ch);
    return ch;
}

static void send_u64(atap_chan *ch, uint64_t v) { assert_int_equal(atap_chan_send(ch, &v), 0); }

static atap_task spawn_recv(atap_chan *ch)
{
    atap_task t = ATAP_NO_TASK;
    assert_int_equal(atap_chan_spawn_recv(&t, ch, NULL), 0);
    assert_true(t.id != 0);
    return t;
}

static atap_task spawn_send_u64(atap_chan *ch, uint64_t v)
{
    atap_task t = ATAP_NO_TASK;
    assert_int_equal(atap_chan_spawn_send(&t, ch, &v, NULL), 0);
    assert_true(t.id != 0);
    return t;
}

/* Takes a receive task's value (8 bytes) within 20 s, asserting success.
 * Taken, so the channel's elem_free never sees it (a value only joined is
 * released by elem_free with the task's handle). */
static uint64_t recv_take_at(atap_task t, int line)
{
    uint64_t v = 0;
    int rc = atap_take_for(t, &v, sizeof v, ATAP_SEC(20));
    if (rc != 0)
        fail_msg("line %d: the receive task read %d (%s)", line, rc, atap_strerror(rc));
    return v;
}
#define recv_take(t) recv_take_at((t), __LINE__)

/* The same with a join: the value stays the task's (out_free). */
static uint64_t recv_join_at(atap_task t, int line)
{
    uint64_t v = 0;
    int rc = atap_join_for(t, &v, sizeof v, ATAP_SEC(20));
    if (rc != 0)
        fail_msg("line %d: the receive task joined %d (%s)", line, rc, atap_strerror(rc));
    return v;
}
#define recv_join(t) recv_join_at((t), __LINE__)

/* Spawns a receive task, takes its value, releases it: the next value. */
static uint64_t recv_one_at(atap_chan *ch, int line)
{
    atap_task t = spawn_recv(ch);
    uint64_t v = recv_take_at(t, line);
    atap_release(t);
    return v;
}
#define recv_one(ch) recv_one_at((ch), __LINE__)

/* Joins t within 20 s and asserts the code (and that it settled). */
static void join_expect_at(atap_task t, size_t size, int want, int line)
{
    uint64_t v = 0;
    int rc = atap_join_for(t, size ? &v : NULL, size, ATAP_SEC(20));
    if (rc != want)
        fail_msg("line %d: join read %d (%s), wanted %d (%s)", line, rc, atap_strerror(rc), want,
                 atap_strerror(want));
}
#define join_expect(t, size, want) join_expect_at((t), (size), (want), __LINE__)

/* Polls until at least `runs` runs finished since `base` (stats.completed)
 * and then no thread is inside a task and nothing is queued: every run so
 * far has returned, and a run that parked has been armed (a worker counts
 * as busy until its run, park included, is over). */
static bool wait_quiet(uint64_t base, uint64_t runs, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;
    int calm = 0;
    for (;;) {
        struct atap_pool_stats s = pool_stats();
        if (s.completed >= base + runs && s.busy == 0 && s.blocking_busy == 0 && s.queued == 0) {
            if (++calm >= 3)
                return true;
        } else {
            calm = 0;
        }
        if (now_ns() > end)
            return false;
        sleep_us(300);
    }
}

static uint64_t completed_now(void) { return pool_stats().completed; }

/* Waits for an atomic to reach want, then checks it stays exactly want a
 * little while (a slow machine can only make this pass). */
static void settle_exact_at(atomic_int *a, int want, int line)
{
    if (!wait_atomic_at_least(a, want, ATAP_SEC(10)))
        fail_msg("line %d: counter reached %d, wanted %d", line, atomic_load(a), want);
    sleep_us(30000);
    if (atomic_load(a) != want)
        fail_msg("line %d: counter is %d, wanted exactly %d", line, atomic_load(a), want);
}
#define SETTLE_EXACT(a, want) settle_exact_at((a), (want), __LINE__)

static void waited_to_live_back_at(int line)
{
    if (!wait_live_back(ATAP_SEC(20)))
        fail_msg("line %d: %zu tasks still live after 20 s, %zu when the test began", line,
                 pool_stats().live, g_live_base);
}
#define waited_to_live_back() waited_to_live_back_at(__LINE__)

/* ---- 1. unbounded: each value once, FIFO ---------------------------------- */

static void test_channel_unbounded_each_value_once_fifo(void **state)
{
    (void)state;
    enum { N = 1000 };
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    static atap_task ts[N];

    /* 1,000 values, then 1,000 receive tasks at once: each value once */
    for (uint64_t i = 0; i < N; i++)
        send_u64(ch, i);
    assert_int_equal(atap_chan_len(ch), N);
    for (int i = 0; i < N; i++)
        ts[i] = spawn_recv(ch);
    for (int i = 0; i < N; i++) {
        uint64_t v = recv_take(ts[i]);
        assert_true(v < N);
        mark_seen(v);
        atap_release(ts[i]);
    }
    for (int i = 0; i < N; i++)
        if (atomic_load(&g_seen[i]) != 1)
            fail_msg("value %d received %d times", i, atomic_load(&g_seen[i]));
    assert_int_equal(atap_chan_len(ch), 0);

    /* one receiver after the other: the order they were sent in */
    for (uint64_t i = 0; i < N; i++)
        send_u64(ch, N + i);
    for (uint64_t i = 0; i < N; i++) {
        uint64_t v = recv_one(ch);
        if (v != N + i)
            fail_msg("receive %llu read %llu: not FIFO", (unsigned long long)i,
                     (unsigned long long)v);
    }

    /* the ring wraps and then grows: the order holds across the copy */
    uint64_t next_in = 5000, next_out = 5000;
    for (int round = 0; round < 6; round++) {
        for (int k = 0; k < 7 + round * 9; k++)
            send_u64(ch, next_in++);
        for (int k = 0; k < 5 + round * 4; k++) {
            uint64_t v = recv_one(ch);
            assert_int_equal(v, next_out);
            next_out++;
        }
    }
    while (next_out < next_in) {
        uint64_t v = recv_one(ch);
        assert_int_equal(v, next_out);
        next_out++;
    }
    assert_int_equal(atap_chan_len(ch), 0);
    assert_int_equal(atomic_load(&g_frees), 0);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 2. receive tasks parked before any send hold no thread -------------- */

static void test_channel_receivers_park_before_send(void **state)
{
    (void)state;
    enum { N = 100 };
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    static atap_task ts[N];

    uint64_t base = completed_now();
    for (int i = 0; i < N; i++)
        ts[i] = spawn_recv(ch);
    /* they all ran once and parked: no thread is inside any of them */
    assert_true(wait_quiet(base, N, ATAP_SEC(20)));
    struct atap_pool_stats s = pool_stats();
    assert_int_equal(s.busy, 0);
    assert_int_equal(s.blocking_busy, 0);
    assert_true(s.live >= g_live_base + N);
    for (int i = 0; i < N; i++) {
        assert_false(atap_finished(ts[i]));
        assert_int_equal(atap_try_join(ts[i], &(uint64_t){0}, sizeof(uint64_t)), ATAP_ENOTREADY);
        assert_int_equal(atap_state_of(ts[i]), ATAP_WAITING); /* parked: no thread held */
    }
    assert_int_equal(atap_chan_len(ch), 0);

    /* a plain task still runs meanwhile */
    atap_task p = spawn8(task_value, (void *)(uintptr_t)7);
    assert_int_equal(join8(p), 7);
    atap_release(p);

    for (uint64_t i = 0; i < N; i++)
        send_u64(ch, 100 + i);
    for (int i = 0; i < N; i++) {
        uint64_t v = recv_take(ts[i]);
        assert_true(v >= 100 && v < 100 + N);
        mark_seen(v);
        atap_release(ts[i]);
    }
    for (int i = 100; i < 100 + N; i++)
        assert_int_equal(atomic_load(&g_seen[i]), 1);
    assert_int_equal(atap_chan_len(ch), 0);
    assert_int_equal(atomic_load(&g_frees), 0);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 3. bounded: full, parked senders, interleaved ------------------------ */

static void test_channel_bounded_full_and_parked_senders(void **state)
{
    (void)state;
    enum { N = 1000 };
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 2, u64_free);
    static atap_task snd[N], rcv[N];

    /* full: ENOTREADY, and the value stays the caller's */
    send_u64(ch, 1);
    send_u64(ch, 2);
    uint64_t v = 3;
    assert_int_equal(atap_chan_send(ch, &v), ATAP_ENOTREADY);
    assert_int_equal(atap_chan_send(ch, &v), ATAP_ENOTREADY);
    assert_int_equal(atap_chan_len(ch), 2);
    assert_int_equal(atomic_load(&g_frees), 0);

    /* a send task parks until a receiver makes room */
    uint64_t base = completed_now();
    atap_task s3 = spawn_send_u64(ch, 3);
    atap_task s4 = spawn_send_u64(ch, 4);
    assert_true(wait_quiet(base, 2, ATAP_SEC(20)));
    assert_false(atap_finished(s3));
    assert_false(atap_finished(s4));
    assert_int_equal(atap_chan_len(ch), 2);
    /* each receive makes room for one of them (in either order: they
     * parked concurrently); the queued values come out first */
    assert_int_equal(recv_one(ch), 1);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (!atap_finished(s3) && !atap_finished(s4) && now_ns() < end)
        sleep_us(200);
    assert_true(atap_finished(s3) != atap_finished(s4)); /* one, not both */
    assert_int_equal(atap_chan_len(ch), 2);
    assert_int_equal(recv_one(ch), 2);
    join_expect(s3, 0, 0);
    join_expect(s4, 0, 0);
    uint64_t x = recv_one(ch), y = recv_one(ch);
    assert_true((x == 3 && y == 4) || (x == 4 && y == 3));
    atap_release(s3);
    atap_release(s4);
    assert_int_equal(atap_chan_len(ch), 0);

    /* 1,000 send tasks and 1,000 receive tasks, interleaved */
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_chan_spawn_send(&snd[i], ch, &(uint64_t){(uint64_t)(1000 + i)}, NULL),
                         0);
        rcv[i] = spawn_recv(ch);
        if (i % 97 == 0)
            assert_true(atap_chan_len(ch) <= 2);
    }
    uint64_t sum = 0;
    for (int i = 0; i < N; i++) {
        join_expect(snd[i], 0, 0);
        atap_release(snd[i]);
    }
    for (int i = 0; i < N; i++) {
        uint64_t got = recv_take(rcv[i]);
        assert_true(got >= 1000 && got < 1000 + N);
        mark_seen(got);
        sum += got;
        atap_release(rcv[i]);
    }
    assert_int_equal(sum, (uint64_t)N * 1000 + (uint64_t)N * (N - 1) / 2);
    for (int i = 1000; i < 1000 + N; i++)
        if (atomic_load(&g_seen[i]) != 1)
            fail_msg("value %d received %d times", i, atomic_load(&g_seen[i]));
    assert_int_equal(atap_chan_len(ch), 0);
    assert_int_equal(atomic_load(&g_frees), 0);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 4. MPMC stress --------------------------------------------------------- */

#define MP_SENDERS 4
#define MP_SPAWNERS 2

struct mpmc {
    atap_chan *ch;
    size_t per_sender;
    size_t per_spawner;
    test_barrier start;
    atomic_int received;
};
static struct mpmc g_mp;

static void *mp_sender(void *arg)
{
    size_t id = (size_t)(uintptr_t)arg;
    struct mpmc *m = &g_mp;

    CHECK(atap_chan_add_sender(m->ch) == 0);
    barrier_wait(&m->start);
    for (size_t k = 0; k < m->per_sender; k++) {
        uint64_t v = id * m->per_sender + k;
        int rc = atap_chan_send(m->ch, &v);
        CHECK(rc == 0);
        if (k % 512 == 0)
            sched_yield();
    }
    atap_chan_close_sender(m->ch);
    return NULL;
}

static void *mp_spawner(void *arg)
{
    (void)arg;
    struct mpmc *m = &g_mp;
    atap_task *ts = calloc(m->per_spawner, sizeof *ts);

    CHECK(ts != NULL);
    if (!ts)
        return NULL;
    barrier_wait(&m->start);
    for (size_t i = 0; i < m->per_spawner; i++)
        CHECK(atap_chan_spawn_recv(&ts[i], m->ch, NULL) == 0);
    for (size_t i = 0; i < m->per_spawner; i++) {
        uint64_t v = UINT64_MAX;
        int rc = atap_take_for(ts[i], &v, sizeof v, ATAP_SEC(60));
        CHECK(rc == 0);
        if (rc == 0) {
            mark_seen(v);
            atomic_fetch_add(&m->received, 1);
        }
        atap_release(ts[i]);
    }
    free(ts);
    return NULL;
}

static void test_channel_mpmc_stress(void **state)
{
    (void)state;
    reset_counts();
    struct mpmc *m = &g_mp;
    m->per_sender = scaled(5000, 1000);
    if (m->per_sender * MP_SENDERS > MAX_V)
        m->per_sender = MAX_V / MP_SENDERS;
    size_t total = m->per_sender * MP_SENDERS;
    m->per_spawner = total / MP_SPAWNERS;
    m->ch = open_chan(sizeof(uint64_t), 0, u64_free);
    barrier_init(&m->start, MP_SENDERS + MP_SPAWNERS);
    atomic_store(&m->received, 0);

    pthread_t th[MP_SENDERS + MP_SPAWNERS];
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < MP_SENDERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, mp_sender, (void *)(uintptr_t)i), 0);
    for (size_t i = 0; i < MP_SPAWNERS; i++)
        assert_int_equal(pthread_create(&th[MP_SENDERS + i], NULL, mp_spawner, NULL), 0);
    for (size_t i = 0; i < MP_SENDERS + MP_SPAWNERS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    print_message("mpmc: %zu values through %d senders and %d spawners in %.1f ms\n", total,
                  MP_SENDERS, MP_SPAWNERS, (double)(now_ns() - t0) / 1e6);
    assert_no_failures();
    assert_int_equal(atomic_load(&m->received), (int)total);
    for (size_t i = 0; i < total; i++)
        if (atomic_load(&g_seen[i]) != 1)
            fail_msg("value %zu received %d times", i, atomic_load(&g_seen[i]));
    assert_int_equal(atap_chan_len(m->ch), 0);

    /* every sender thread closed its end; the opener's goes now: closed */
    atap_chan_close_sender(m->ch);
    atap_task t = spawn_recv(m->ch);
    join_expect(t, sizeof(uint64_t), ATAP_ECLOSED);
    atap_release(t);
    assert_int_equal(atomic_load(&g_frees), 0);
    atap_chan_close_receiver(m->ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 5. closing: the last sender --------------------------------------------- */

static void test_channel_close_sender_drains_then_closed(void **state)
{
    (void)state;
    reset_counts();

    /* queued values are drained, then receive tasks end ATAP_ECLOSED */
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    send_u64(ch, 10);
    send_u64(ch, 11);
    send_u64(ch, 12);
    atap_chan_close_sender(ch); /* the opener's, and no send task: the last */
    assert_int_equal(atap_chan_len(ch), 3);
    assert_int_equal(recv_one(ch), 10);
    assert_int_equal(recv_one(ch), 11);
    assert_int_equal(recv_one(ch), 12);
    for (int i = 0; i < 3; i++) {
        atap_task t = spawn_recv(ch);
        join_expect(t, sizeof(uint64_t), ATAP_ECLOSED);
        assert_int_equal(atap_state_of(t), ATAP_FAILED);
        assert_int_equal(atap_take(t, &(uint64_t){0}, sizeof(uint64_t)), ATAP_ECLOSED);
        atap_release(t);
    }
    atap_chan_close_receiver(ch);

    /* receive tasks parked when the last sender goes end ATAP_ECLOSED */
    enum { NP = 5 };
    atap_task ts[NP];
    ch = open_chan(sizeof(uint64_t), 0, u64_free);
    uint64_t base = completed_now();
    for (int i = 0; i < NP; i++)
        ts[i] = spawn_recv(ch);
    assert_true(wait_quiet(base, NP, ATAP_SEC(20)));
    for (int i = 0; i < NP; i++)
        assert_false(atap_finished(ts[i]));
    atap_chan_close_sender(ch);
    for (int i = 0; i < NP; i++) {
        join_expect(ts[i], sizeof(uint64_t), ATAP_ECLOSED);
        assert_int_equal(atap_state_of(ts[i]), ATAP_FAILED);
        atap_release(ts[i]);
    }
    atap_chan_close_receiver(ch);

    /* a send task is a sender while it lives: the opener's end going is not
     * the last; the task's going is */
    ch = open_chan(sizeof(uint64_t), 1, u64_free);
    send_u64(ch, 20);
    base = completed_now();
    atap_task s = spawn_send_u64(ch, 21);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    atap_chan_close_sender(ch);
    assert_int_equal(recv_one(ch), 20);
    join_expect(s, 0, 0);
    assert_int_equal(recv_one(ch), 21);
    atap_task r = spawn_recv(ch); /* the send task's end may still count */
    atap_release(s);              /* now it is gone: the last sender */
    join_expect(r, sizeof(uint64_t), ATAP_ECLOSED);
    atap_release(r);
    r = spawn_recv(ch);
    join_expect(r, sizeof(uint64_t), ATAP_ECLOSED);
    atap_release(r);
    atap_chan_close_receiver(ch);

    /* added senders count too */
    ch = open_chan(sizeof(uint64_t), 0, u64_free);
    assert_int_equal(atap_chan_add_sender(ch), 0);
    atap_chan_close_sender(ch);
    base = completed_now();
    r = spawn_recv(ch);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    assert_false(atap_finished(r)); /* one sender left: it waits */
    send_u64(ch, 30);
    assert_int_equal(recv_take(r), 30);
    atap_release(r);
    atap_chan_close_sender(ch);
    r = spawn_recv(ch);
    join_expect(r, sizeof(uint64_t), ATAP_ECLOSED);
    atap_release(r);
    atap_chan_close_receiver(ch);

    assert_int_equal(atomic_load(&g_frees), 0);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 6. closing: the last receiver ------------------------------------------- */

static void test_channel_close_receiver_drops_and_refuses(void **state)
{
    (void)state;
    reset_counts();

    /* queued values go to elem_free; sends after read ATAP_ECLOSED */
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    send_u64(ch, 10);
    send_u64(ch, 11);
    send_u64(ch, 12);
    atap_chan_close_receiver(ch);
    assert_int_equal(atomic_load(&g_frees), 3);
    for (int i = 10; i <= 12; i++)
        assert_int_equal(atomic_load(&g_freed[i]), 1);
    assert_int_equal(atap_chan_len(ch), 0);
    uint64_t v = 13;
    assert_int_equal(atap_chan_send(ch, &v), ATAP_ECLOSED);
    assert_int_equal(atomic_load(&g_frees), 4);
    assert_int_equal(atomic_load(&g_freed[13]), 1);
    assert_int_equal(atap_chan_len(ch), 0);
    /* a send task on a channel with no receiver ends ATAP_ECLOSED */
    atap_task s = spawn_send_u64(ch, 14);
    join_expect(s, 0, ATAP_ECLOSED);
    assert_int_equal(atap_state_of(s), ATAP_FAILED);
    atap_release(s);
    SETTLE_EXACT(&g_freed[14], 1);
    assert_int_equal(atomic_load(&g_frees), 5);
    atap_chan_close_sender(ch);

    /* bounded and full: a parked send task ends ATAP_ECLOSED when the last
     * receiver goes, its value released once; the queued one too */
    ch = open_chan(sizeof(uint64_t), 1, u64_free);
    send_u64(ch, 20);
    v = 21;
    assert_int_equal(atap_chan_send(ch, &v), ATAP_ENOTREADY);
    uint64_t base = completed_now();
    atap_task s1 = spawn_send_u64(ch, 21);
    atap_task s2 = spawn_send_u64(ch, 22);
    assert_true(wait_quiet(base, 2, ATAP_SEC(20)));
    assert_false(atap_finished(s1));
    assert_false(atap_finished(s2));
    assert_int_equal(atomic_load(&g_frees), 5);
    atap_chan_close_receiver(ch);
    assert_int_equal(atomic_load(&g_freed[20]), 1);
    join_expect(s1, 0, ATAP_ECLOSED);
    join_expect(s2, 0, ATAP_ECLOSED);
    atap_release(s1);
    atap_release(s2);
    SETTLE_EXACT(&g_frees, 8);
    assert_int_equal(atomic_load(&g_freed[21]), 1);
    assert_int_equal(atomic_load(&g_freed[22]), 1);
    atap_chan_close_sender(ch);

    /* a receive task is a receiver while it lives: values queued when the
     * last one goes are released, the one it took is not */
    ch = open_chan(sizeof(uint64_t), 0, u64_free);
    send_u64(ch, 30);
    send_u64(ch, 31);
    send_u64(ch, 32);
    atap_task r = spawn_recv(ch);
    assert_int_equal(atap_take(r, &v, sizeof v), 0);
    assert_int_equal(v, 30);
    atap_chan_close_receiver(ch); /* the opener's */
    atap_release(r);              /* the task's: the last */
    SETTLE_EXACT(&g_frees, 10);
    assert_int_equal(atomic_load(&g_freed[30]), 0);
    assert_int_equal(atomic_load(&g_freed[31]), 1);
    assert_int_equal(atomic_load(&g_freed[32]), 1);
    v = 33;
    assert_int_equal(atap_chan_send(ch, &v), ATAP_ECLOSED);
    assert_int_equal(atomic_load(&g_freed[33]), 1);
    atap_chan_close_sender(ch);

    /* added receivers count */
    ch = open_chan(sizeof(uint64_t), 0, u64_free);
    assert_int_equal(atap_chan_add_receiver(ch), 0);
    atap_chan_close_receiver(ch);
    send_u64(ch, 40); /* one receiver end left: queued */
    assert_int_equal(atap_chan_len(ch), 1);
    assert_int_equal(atomic_load(&g_freed[40]), 0);
    atap_chan_close_receiver(ch);
    assert_int_equal(atomic_load(&g_freed[40]), 1);
    atap_chan_close_sender(ch);

    assert_int_equal(atomic_load(&g_frees), 12);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 7. elem_free accounting with values that own memory --------------------- */

typedef struct boxed {
    uint64_t v;
    uint64_t *heap;
} boxed;

static atomic_int g_box_frees;

static boxed box(uint64_t v)
{
    boxed b = {v, malloc(sizeof(uint64_t))};
    CHECK(b.heap != NULL);
    if (b.heap)
        *b.heap = v;
    return b;
}

/* elem_free: ASan reports a value freed twice, LSan one never freed. */
static void boxed_free(void *value)
{
    boxed b;
    memcpy(&b, value, sizeof b);
    CHECK(b.heap != NULL && *b.heap == b.v);
    free(b.heap);
    atomic_fetch_add(&g_box_frees, 1);
}

static void send_box(atap_chan *ch, uint64_t v)
{
    boxed b = box(v);
    assert_int_equal(atap_chan_send(ch, &b), 0);
}

static void test_channel_elem_free_owned_values(void **state)
{
    (void)state;
    reset_counts();
    atomic_store(&g_box_frees, 0);
    int never_taken = 0;
    atap_chan *ch = open_chan(sizeof(boxed), 0, boxed_free);

    for (uint64_t i = 0; i < 20; i++)
        send_box(ch, i);
    /* 5 taken: the taker frees them */
    for (uint64_t i = 0; i < 5; i++) {
        atap_task t = spawn_recv(ch);
        boxed b = {0, NULL};
        assert_int_equal(atap_take(t, &b, sizeof b), 0);
        assert_int_equal(b.v, i);
        assert_non_null(b.heap);
        assert_int_equal(*b.heap, i);
        free(b.heap);
        atap_release(t);
    }
    /* 3 joined (a copy) and never taken: out_free at release */
    for (uint64_t i = 5; i < 8; i++) {
        atap_task t = spawn_recv(ch);
        boxed b = {0, NULL};
        assert_int_equal(atap_join(t, &b, sizeof b), 0);
        assert_int_equal(b.v, i);
        atap_release(t);
        never_taken++;
    }
    /* 2 received by tasks whose handle went at once */
    for (int i = 0; i < 2; i++) {
        atap_task t = spawn_recv(ch);
        atap_release(t);
        never_taken++;
    }
    waited_to_live_back();
    SETTLE_EXACT(&g_box_frees, never_taken);
    assert_int_equal(atap_chan_len(ch), 10);
    /* 3 through send tasks */
    for (uint64_t i = 20; i < 23; i++) {
        boxed b = box(i);
        atap_task t = ATAP_NO_TASK;
        assert_int_equal(atap_chan_spawn_send(&t, ch, &b, NULL), 0);
        join_expect(t, 0, 0);
        atap_release(t);
    }
    assert_int_equal(atap_chan_len(ch), 13);
    SETTLE_EXACT(&g_box_frees, never_taken);
    /* both ends go with 13 queued */
    atap_chan_close_sender(ch);
    assert_int_equal(atomic_load(&g_box_frees), never_taken);
    atap_chan_close_receiver(ch);
    never_taken += 13;
    assert_int_equal(atomic_load(&g_box_frees), never_taken);

    /* bounded: values refused, cancelled or stranded by the close */
    ch = open_chan(sizeof(boxed), 2, boxed_free);
    send_box(ch, 100);
    send_box(ch, 101);
    boxed full = box(102);
    assert_int_equal(atap_chan_send(ch, &full), ATAP_ENOTREADY); /* still ours */
    boxed_free(&full);
    never_taken++;
    uint64_t base = completed_now();
    atap_task s[4];
    for (uint64_t i = 0; i < 4; i++) {
        boxed b = box(103 + i);
        assert_int_equal(atap_chan_spawn_send(&s[i], ch, &b, NULL), 0);
    }
    assert_true(wait_quiet(base, 4, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(s[3]), 0); /* its value: released once */
    join_expect(s[3], 0, ATAP_ECANCELLED);
    atap_release(s[3]);
    never_taken++;
    SETTLE_EXACT(&g_box_frees, never_taken);
    atap_task r = spawn_recv(ch); /* 100, taken: room for one sender */
    boxed b = {0, NULL};
    assert_int_equal(atap_take(r, &b, sizeof b), 0);
    assert_int_equal(b.v, 100);
    free(b.heap);
    atap_release(r);
    /* one of the parked send tasks fills the room: two queued, two send
     * tasks still parked; then the receivers go */
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (atap_chan_len(ch) < 2 && now_ns() < end)
        sleep_us(200);
    assert_int_equal(atap_chan_len(ch), 2);
    atap_chan_close_receiver(ch);
    for (int i = 0; i < 3; i++) {
        atap_state st;
        assert_int_equal(atap_wait(s[i], &st), 0);
        atap_release(s[i]);
    }
    never_taken += 2 /* queued */ + 2 /* send tasks never sent */;
    atap_chan_close_sender(ch);
    waited_to_live_back();
    SETTLE_EXACT(&g_box_frees, never_taken);

    /* after the last receiver: the refused value is released */
    ch = open_chan(sizeof(boxed), 0, boxed_free);
    atap_chan_close_receiver(ch);
    boxed late = box(200);
    assert_int_equal(atap_chan_send(ch, &late), ATAP_ECLOSED);
    never_taken++;
    assert_int_equal(atomic_load(&g_box_frees), never_taken);
    atap_chan_close_sender(ch);

    print_message("%d owned values released by elem_free\n", never_taken);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 8. a received output nobody took ----------------------------------------- */

static void test_channel_untaken_output_released(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);

    /* joined (copied), never taken: out_free when the handle goes */
    send_u64(ch, 1);
    atap_task t = spawn_recv(ch);
    assert_int_equal(recv_join(t), 1);
    assert_int_equal(recv_join(t), 1); /* the output stays for other readers */
    assert_int_equal(atomic_load(&g_frees), 0);
    atap_release(t);
    SETTLE_EXACT(&g_freed[1], 1);

    /* taken: never released by the channel */
    send_u64(ch, 2);
    t = spawn_recv(ch);
    uint64_t v = 0;
    assert_int_equal(atap_take(t, &v, sizeof v), 0);
    assert_int_equal(v, 2);
    assert_int_equal(atap_join(t, &v, sizeof v), ATAP_ETAKEN);
    atap_release(t);

    /* with a dup: only the last handle lets it go */
    send_u64(ch, 3);
    t = spawn_recv(ch);
    atap_task d;
    assert_int_equal(atap_dup(t, &d), 0);
    assert_int_equal(recv_join(d), 3);
    atap_release(t);
    sleep_ms(20);
    assert_int_equal(atomic_load(&g_freed[3]), 0);
    atap_release(d);
    SETTLE_EXACT(&g_freed[3], 1);

    /* released while parked: the value it receives later is released */
    uint64_t base = completed_now();
    t = spawn_recv(ch);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    atap_release(t);
    send_u64(ch, 4);
    SETTLE_EXACT(&g_freed[4], 1);
    assert_int_equal(atap_chan_len(ch), 0);

    /* released before it ran, a value already queued */
    send_u64(ch, 5);
    t = spawn_recv(ch);
    atap_release(t);
    SETTLE_EXACT(&g_freed[5], 1);

    SETTLE_EXACT(&g_frees, 4);
    assert_int_equal(atomic_load(&g_freed[2]), 0);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 9. cancelling parked channel tasks ---------------------------------------- */

static void test_channel_cancel_parked_receiver(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);

    /* A parked first, B behind it; A is cancelled: a value goes to B */
    uint64_t base = completed_now();
    atap_task a = spawn_recv(ch);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    base = completed_now();
    atap_task b = spawn_recv(ch);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(a), 0);
    join_expect(a, sizeof(uint64_t), ATAP_ECANCELLED);
    assert_int_equal(atap_state_of(a), ATAP_CANCELLED);
    send_u64(ch, 1);
    assert_int_equal(recv_take(b), 1);
    atap_release(b);

    /* a receiver spawned after the cancel gets the next value */
    send_u64(ch, 2);
    assert_int_equal(recv_one(ch), 2);
    join_expect(a, sizeof(uint64_t), ATAP_ECANCELLED); /* still */
    atap_release(a);

    /* cancelled while nobody else waits: the value stays queued */
    base = completed_now();
    a = spawn_recv(ch);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(a), 0);
    join_expect(a, sizeof(uint64_t), ATAP_ECANCELLED);
    atap_release(a);
    send_u64(ch, 3);
    assert_int_equal(atap_chan_len(ch), 1);
    assert_int_equal(recv_one(ch), 3);

    /* a parked send task cancelled: its value released once, the queue
     * intact, and a later send task gets the room */
    atap_chan *bc = open_chan(sizeof(uint64_t), 1, u64_free);
    send_u64(bc, 10);
    base = completed_now();
    atap_task s = spawn_send_u64(bc, 11);
    assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
    assert_int_equal(atap_cancel(s), 0);
    join_expect(s, 0, ATAP_ECANCELLED);
    atap_release(s);
    SETTLE_EXACT(&g_freed[11], 1);
    assert_int_equal(atap_chan_len(bc), 1);
    assert_int_equal(recv_one(bc), 10);
    s = spawn_send_u64(bc, 12);
    join_expect(s, 0, 0);
    atap_release(s);
    assert_int_equal(recv_one(bc), 12);
    atap_chan_close_sender(bc);
    atap_chan_close_receiver(bc);

    assert_int_equal(atomic_load(&g_frees), 1);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 10. run timeouts of parked channel tasks ----------------------------------- */

static void test_channel_task_timeouts(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 1, u64_free);
    atap_task t;

    /* a receive task with nothing to receive times out */
    assert_int_equal(atap_chan_spawn_recv(&t, ch, &(atap_spawn_opts){.timeout_ns = ATAP_MS(50)}),
                     0);
    join_expect(t, sizeof(uint64_t), ATAP_ETIMEDOUT);
    assert_int_equal(atap_state_of(t), ATAP_TIMED_OUT);
    atap_release(t);

    /* a send task with no room times out; its value is released */
    send_u64(ch, 1);
    assert_int_equal(
        atap_chan_spawn_send(&t, ch, &(uint64_t){2}, &(atap_spawn_opts){.timeout_ns = ATAP_MS(50)}),
        0);
    join_expect(t, 0, ATAP_ETIMEDOUT);
    atap_release(t);
    SETTLE_EXACT(&g_freed[2], 1);

    /* the channel still works */
    assert_int_equal(recv_one(ch), 1);
    send_u64(ch, 3);
    assert_int_equal(recv_one(ch), 3);
    assert_int_equal(atomic_load(&g_frees), 1);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* Receive tasks that time out on a quiet channel leave no waiter behind for
 * long: the list is pruned as new ones come (it used to keep every one
 * until a send woke its way through them: 32 bytes each, and the send's
 * time). Seen in the allocator's count (skipped where it keeps none). */
static void test_channel_timed_out_waiters_pruned(void **state)
{
    (void)state;
    enum { N = 1000 };
    if (mallinfo2().uordblks == 0)
        skip(); /* no count kept (a sanitizer's allocator) */
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    atap_task t;
    size_t before = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(atap_chan_spawn_recv(&t, ch, &(atap_spawn_opts){.timeout_ns = ATAP_MS(1)}),
                         0);
        join_expect(t, sizeof(uint64_t), ATAP_ETIMEDOUT);
        atap_release(t);
        if (i == 9)
            before = mallinfo2().uordblks;
    }
    size_t after = mallinfo2().uordblks;
    if (after > before + 16384)
        fail_msg("%zu bytes more after %d timed-out receives", after - before, N - 10);
    send_u64(ch, 5);
    assert_int_equal(recv_one(ch), 5);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* The last receiver closes with values queued while the last sender closes
 * on another thread: the values go to elem_free after the lock, and the
 * channel, freed by the sender's close, is not read meanwhile (it was:
 * ASan saw a use after free). The first elem_free holds until the other
 * close is done. */
static atomic_int uaf_frees, uaf_go, uaf_closed, uaf_in_time;
static atap_chan *uaf_ch;

static void uaf_elem_free(void *v)
{
    (void)v;
    if (atomic_fetch_add(&uaf_frees, 1) == 0) {
        atomic_store(&uaf_go, 1);
        uint64_t end = now_ns() + ATAP_SEC(5);
        while (!atomic_load(&uaf_closed) && now_ns() < end)
            sleep_us(100);
        atomic_store(&uaf_in_time, atomic_load(&uaf_closed)); /* the lock was not ours */
    }
}

static void *uaf_close_sender(void *arg)
{
    (void)arg;
    uint64_t end = now_ns() + ATAP_SEC(5);
    while (!atomic_load(&uaf_go) && now_ns() < end)
        sleep_us(100);
    atap_chan_close_sender(uaf_ch); /* the last end: frees the channel */
    atomic_store(&uaf_closed, 1);
    return NULL;
}

/* no_memory: the values cannot be copied out (atap_inject_alloc_failures). */
static void close_receiver_vs_last_sender(bool no_memory)
{
    atomic_store(&uaf_frees, 0);
    atomic_store(&uaf_go, 0);
    atomic_store(&uaf_closed, 0);
    atomic_store(&uaf_in_time, 0);
    uaf_ch = open_chan(sizeof(uint64_t), 0, uaf_elem_free);
    send_u64(uaf_ch, 1);
    send_u64(uaf_ch, 2);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, uaf_close_sender, NULL), 0);
    atap_inject_alloc_failures(no_memory ? 1 : 0);
    atap_chan_close_receiver(uaf_ch);
    atap_inject_alloc_failures(0);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&uaf_frees), 2);
    assert_int_equal(atomic_load(&uaf_closed), 1);
    assert_int_equal(atomic_load(&uaf_in_time), 1);
}

static void test_channel_close_receiver_vs_last_sender(void **state)
{
    (void)state;
    close_receiver_vs_last_sender(false);
}

/* With no memory to copy the values out, the last receiver's close still
 * calls elem_free with the channel's lock let go: at the first call
 * atap_chan_len, which takes the lock, returns; each value goes once,
 * read right from a ring that wrapped; the channel takes values again
 * once a receiver is added. It used to call elem_free under the lock.
 * And the last sender's close may free the channel meanwhile, as above. */
static atap_chan *nomem_ch;
static atomic_int nomem_armed, nomem_free;
static side_call nomem_call;

static void len_of_nomem_ch(void *arg)
{
    (void)arg;
    (void)atap_chan_len(nomem_ch);
}

static void probing_u64_free(void *value)
{
    u64_free(value);
    side_call_once(&nomem_armed, &nomem_call, len_of_nomem_ch, &nomem_free);
}

static void test_channel_close_receiver_no_memory_drops_off_the_lock(void **state)
{
    (void)state;
    uint64_t v = 0;

    reset_counts();
    nomem_ch = open_chan(sizeof(uint64_t), 4, probing_u64_free);
    for (uint64_t i = 1; i <= 4; i++)
        send_u64(nomem_ch, i);
    atap_task r = spawn_recv(nomem_ch);
    assert_int_equal(atap_take(r, &v, sizeof v), 0);
    assert_true(v == 1);
    atap_release(r);
    waited_to_live_back(); /* its receiver end gone */
    send_u64(nomem_ch, 5); /* the ring wraps: 5 2 3 4, from the second */
    atomic_store(&nomem_free, 0);
    atomic_store(&nomem_armed, 1);
    atap_inject_alloc_failures(1);
    atap_chan_close_receiver(nomem_ch); /* the last; our sender end keeps it */
    atap_inject_alloc_failures(0);
    side_call_join(&nomem_call);
    assert_no_failures();
    assert_int_equal(atomic_load(&nomem_armed), 0);
    assert_true(atomic_load(&nomem_free));
    assert_int_equal(atomic_load(&g_frees), 4);
    assert_int_equal(atomic_load(&g_freed[1]), 0);
    for (int i = 2; i <= 5; i++)
        assert_int_equal(atomic_load(&g_freed[i]), 1);
    assert_int_equal(atap_chan_len(nomem_ch), 0);
    v = 6;
    assert_int_equal(atap_chan_send(nomem_ch, &v), ATAP_ECLOSED);
    assert_int_equal(atomic_load(&g_freed[6]), 1);

    assert_int_equal(atap_chan_add_receiver(nomem_ch), 0);
    for (uint64_t i = 7; i <= 10; i++)
        send_u64(nomem_ch, i);
    v = 11;
    assert_int_equal(atap_chan_send(nomem_ch, &v), ATAP_ENOTREADY); /* still bounded at 4 */
    assert_int_equal(atap_chan_len(nomem_ch), 4);
    atap_chan_close_receiver(nomem_ch);
    assert_int_equal(atomic_load(&g_frees), 9);
    for (int i = 7; i <= 10; i++)
        assert_int_equal(atomic_load(&g_freed[i]), 1);
    atap_chan_close_sender(nomem_ch);

    close_receiver_vs_last_sender(true);
}

/* ---- values handed to elem_free are aligned for any type ---------------------- */

/* Two element types: one that needs the strictest alignment (a long double
 * read in elem_free is a misaligned load under UBSan if it is not), and
 * one of 12 bytes, whose neighbours in a ring would sit 12 bytes apart. */
typedef struct al_wide {
    long double x;
    uint32_t tag;
} al_wide;
typedef struct al_odd {
    uint32_t w[3];
} al_odd;

static atomic_int al_calls, al_misaligned;
static atomic_uint_fast64_t al_tags;

static void al_note(const void *p)
{
    atomic_fetch_add(&al_calls, 1);
    if ((uintptr_t)p % _Alignof(max_align_t) != 0)
        atomic_fetch_add(&al_misaligned, 1);
}

static void al_wide_free(void *p)
{
    al_note(p);
    if ((uintptr_t)p % _Alignof(max_align_t) == 0) /* read as its type */
        atomic_fetch_add(&al_tags, (uint64_t)((al_wide *)p)->x + ((al_wide *)p)->tag);
}

static void al_odd_free(void *p) { al_note(p); }

/* Every value a channel hands to elem_free: a send task's value never
 * sent (cancelled), values dropped by the last receiver's close (copied
 * out, and with no memory for a copy from the ring itself, from a head
 * that moved on) sit at an address aligned for any type. */
static void channel_aligned_round(size_t elem, void (*elem_free)(void *), const void *v, bool nomem)
{
    atap_chan *ch = open_chan(elem, 3, elem_free);
    atap_task s, r;
    unsigned char out[sizeof(al_wide)];

    for (int i = 0; i < 3; i++)
        assert_int_equal(atap_chan_send(ch, v), 0);
    /* a send task parked on the full channel, cancelled: its value goes */
    assert_int_equal(atap_chan_spawn_send(&s, ch, v, NULL), 0);
    sleep_ms(20);
    assert_int_equal(atap_cancel(s), 0);
    assert_int_equal(atap_wait(s, NULL), 0);
    atap_release(s);
    waited_to_live_back();
    /* the head moves on, the ring wraps */
    r = spawn_recv(ch);
    assert_int_equal(atap_take(r, out, elem), 0);
    atap_release(r);
    waited_to_live_back();
    assert_int_equal(atap_chan_send(ch, v), 0);
    if (nomem)
        atap_inject_alloc_failures(1);
    atap_chan_close_receiver(ch); /* three values dropped */
    atap_inject_alloc_failures(0);
    atap_chan_close_sender(ch);
}

static void test_channel_values_aligned(void **state)
{
    (void)state;
    al_wide w = {.x = 2.0L, .tag = 5};
    al_odd o = {{1, 2, 3}};

    atomic_store(&al_calls, 0);
    atomic_store(&al_misaligned, 0);
    atomic_store(&al_tags, 0);
    for (int nomem = 0; nomem < 2; nomem++) {
        channel_aligned_round(sizeof w, al_wide_free, &w, nomem);
        channel_aligned_round(sizeof o, al_odd_free, &o, nomem);
    }
    assert_int_equal(atomic_load(&al_calls), 16);
    assert_int_equal(atomic_load(&al_misaligned), 0);
    assert_int_equal(atomic_load(&al_tags), 8 * 7);
}

/* ---- 11. bad arguments --------------------------------------------------------- */

static void test_channel_bad_arguments(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = (atap_chan *)(uintptr_t)1;

    assert_int_equal(atap_chan_open(NULL, 8, 0, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_open(&ch, 0, 0, NULL), ATAP_EINVAL);
    assert_null(ch);
    assert_int_equal(atap_chan_open(&ch, 0, 4, u64_free), ATAP_EINVAL);
#if SIZE_MAX > UINT32_MAX
    assert_int_equal(atap_chan_open(&ch, (size_t)UINT32_MAX + 1, 0, NULL), ATAP_EINVAL);
#endif
    assert_int_equal(atap_chan_open(&ch, 16, SIZE_MAX / 8, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_add_sender(NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_add_receiver(NULL), ATAP_EINVAL);
    atap_chan_close_sender(NULL);
    atap_chan_close_receiver(NULL);
    assert_int_equal(atap_chan_len(NULL), 0);

    ch = open_chan(sizeof(uint64_t), 0, u64_free);
    uint64_t v = 1;
    atap_task t = {12345};
    assert_int_equal(atap_chan_send(NULL, &v), ATAP_EINVAL);
    assert_int_equal(atap_chan_send(ch, NULL), ATAP_EINVAL);

    /* receive: out_size 0 or elem_size only; kind ONCE; no frees or gives */
    assert_int_equal(atap_chan_spawn_recv(NULL, ch, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_spawn_recv(&t, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(t.id, 0);
    const atap_spawn_opts bad[] = {
        {.out_size = 4},        {.out_size = 16},
        {.kind = ATAP_REPEAT},  {.kind = ATAP_AT_RATE, .every_ns = ATAP_MS(1)},
        {.arg_free = u64_free}, {.out_free = u64_free},
        {.in_free = u64_free},  {.gives = 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t.id = 12345;
        int rc = atap_chan_spawn_recv(&t, ch, &bad[i]);
        if (rc != ATAP_EINVAL)
            fail_msg("recv opts %zu: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(t.id, 0);
    }
    /* send: no out_size at all, the same rest */
    assert_int_equal(atap_chan_spawn_send(NULL, ch, &v, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_spawn_send(&t, NULL, &v, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_spawn_send(&t, ch, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_chan_spawn_send(&t, ch, &v, &(atap_spawn_opts){.out_size = 8}),
                     ATAP_EINVAL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t.id = 12345;
        int rc = atap_chan_spawn_send(&t, ch, &v, &bad[i]);
        if (rc != ATAP_EINVAL)
            fail_msg("send opts %zu: %d (%s)", i, rc, atap_strerror(rc));
        assert_int_equal(t.id, 0);
    }
    /* an option atap_spawn refuses (priority) refuses the channel task too,
     * and leaves no end behind */
    assert_int_equal(atap_chan_spawn_recv(&t, ch, &(atap_spawn_opts){.priority = 1000}),
                     ATAP_EINVAL);
    assert_int_equal(atap_chan_spawn_send(&t, ch, &v, &(atap_spawn_opts){.priority = 1000}),
                     ATAP_EINVAL);
    assert_int_equal(atomic_load(&g_frees), 0); /* refused values stay ours */

    /* what is allowed: out_size elem_size, priority, after_ns */
    assert_int_equal(atap_chan_spawn_recv(&t, ch, &(atap_spawn_opts){.out_size = 8, .priority = 5}),
                     0);
    atap_task s;
    assert_int_equal(
        atap_chan_spawn_send(&s, ch, &(uint64_t){77},
                             &(atap_spawn_opts){.after_ns = ATAP_MS(5), .priority = -3}),
        0);
    assert_int_equal(recv_take(t), 77);
    join_expect(s, 0, 0);
    atap_release(t);
    atap_release(s);
    SETTLE_EXACT(&g_frees, 0); /* 77 was taken */

    /* the refused spawns kept no end: closing the opener's ends is the last */
    waited_to_live_back();
    send_u64(ch, 5);
    atap_chan_close_receiver(ch);
    assert_int_equal(atomic_load(&g_freed[5]), 1);
    atap_chan_close_sender(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* No runtime: channel tasks are refused (the value stays the caller's),
 * plain sends still queue. */
static void test_channel_spawn_without_runtime(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    send_u64(ch, 1);
    assert_int_equal(atap_shutdown(), 0);

    atap_task t = {12345};
    assert_int_equal(atap_chan_spawn_recv(&t, ch, NULL), ATAP_ENOTINIT);
    assert_int_equal(t.id, 0);
    assert_int_equal(atap_chan_spawn_send(&t, ch, &(uint64_t){2}, NULL), ATAP_ENOTINIT);
    assert_int_equal(t.id, 0);
    assert_int_equal(atomic_load(&g_frees), 0);
    send_u64(ch, 3);
    assert_int_equal(atap_chan_len(ch), 2);

    assert_int_equal(atap_init(NULL), 0);
    assert_int_equal(recv_one(ch), 1);
    waited_to_live_back();        /* the receive task's end is gone with its slot */
    atap_chan_close_receiver(ch); /* the last: 3 goes */
    assert_int_equal(atomic_load(&g_freed[3]), 1);
    assert_int_equal(atomic_load(&g_frees), 1);
    atap_chan_close_sender(ch);
    waited_to_live_back();
    assert_no_failures();
}

/* ---- 12. leaks: everything released, every end closed ------------------------- */

static void test_channel_leak_check(void **state)
{
    (void)state;
    reset_counts();
    enum { NCH = 16, PER = 8 };
    static atap_chan *chs[NCH];
    static atap_task rt[NCH][PER], st[NCH][PER];
    uint64_t n = 0;

    for (int c = 0; c < NCH; c++) {
        chs[c] = open_chan(sizeof(uint64_t), (size_t)(c % 3), u64_free);
        for (int k = 0; k < PER; k++) {
            rt[c][k] = spawn_recv(chs[c]);
            st[c][k] = spawn_send_u64(chs[c], n++);
        }
    }
    for (int c = 0; c < NCH; c++) {
        for (int k = 0; k < PER; k++) {
            join_expect(st[c][k], 0, 0);
            mark_seen(recv_join(rt[c][k]));
            if (k % 2)
                assert_int_equal(atap_cancel(rt[c][k]), 0); /* settled: left alone */
            assert_int_equal(atap_state_of(rt[c][k]), ATAP_READY);
        }
        /* extra receivers, handles let go, that park until the close */
        for (int k = 0; k < 2; k++)
            atap_release(spawn_recv(chs[c]));
    }
    struct atap_pool_stats mid = pool_stats();
    assert_true(mid.live >= g_live_base + NCH * (2 * PER + 2));
    for (int c = 0; c < NCH; c++) {
        for (int k = 0; k < PER; k++) {
            atap_release(rt[c][k]);
            atap_release(st[c][k]);
        }
        atap_chan_close_sender(chs[c]); /* the parked extras end ECLOSED */
        atap_chan_close_receiver(chs[c]);
    }
    waited_to_live_back();
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&g_seen[i]), 1);
    SETTLE_EXACT(&g_frees, (int)n); /* every output joined, none taken */
    assert_no_failures();
}

/* ---- 13. races ------------------------------------------------------------------ */

/* A race test has one helper thread. If the test fails part way (cmocka
 * long-jumps out), the teardown tells the helper to give up waiting and
 * joins it, so no helper outlives its test. */
static atomic_int g_abort;
static pthread_t g_racer;
static bool g_racer_on;

/* barrier_wait that gives up (false) once the teardown says so. */
static bool race_wait(test_barrier *b)
{
    int round = atomic_load_explicit(&b->round, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == b->parties) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->round, 1, memory_order_acq_rel);
        return true;
    }
    while (atomic_load_explicit(&b->round, memory_order_acquire) == round) {
        if (atomic_load(&g_abort))
            return false;
        sched_yield();
    }
    return true;
}

static void racer_start(void *(*fn)(void *))
{
    assert_false(g_racer_on);
    assert_int_equal(pthread_create(&g_racer, NULL, fn, NULL), 0);
    g_racer_on = true;
}

static void racer_join(void)
{
    if (g_racer_on) {
        assert_int_equal(pthread_join(g_racer, NULL), 0);
        g_racer_on = false;
    }
}

static int setup_channel(void **state)
{
    atomic_store(&g_abort, 0);
    return setup_runtime(state);
}

static int teardown_channel(void **state)
{
    atomic_store(&g_abort, 1);
    if (g_racer_on) {
        pthread_join(g_racer, NULL);
        g_racer_on = false;
    }
    atomic_store(&g_abort, 0);
    return teardown_runtime(state);
}

struct close_race {
    test_barrier bar;
    _Atomic(atap_chan *) ch;
    atomic_int send_first;
    size_t rounds;
};
static struct close_race g_cr;

static void *close_racer(void *arg)
{
    (void)arg;
    struct close_race *c = &g_cr;
    for (size_t i = 0; i < c->rounds; i++) {
        if (!race_wait(&c->bar))
            return NULL;
        atap_chan *ch = atomic_load(&c->ch);
        if (atomic_load(&c->send_first)) {
            uint64_t v = 7;
            CHECK(atap_chan_send(ch, &v) == 0);
        }
        for (unsigned k = 0; k < (unsigned)(i % 4) * 30u; k++)
            sched_yield();
        atap_chan_close_sender(ch);
        if (!race_wait(&c->bar))
            return NULL;
    }
    return NULL;
}

/* The last sender goes while receive tasks are starting, parking or parked:
 * every one ends, with the value if one was sent, else ATAP_ECLOSED. */
static void test_channel_race_close_sender_vs_receiver(void **state)
{
    (void)state;
    reset_counts();
    struct close_race *c = &g_cr;
    c->rounds = scaled(200, 50);
    barrier_init(&c->bar, 2);
    racer_start(close_racer);
    int got = 0, closed = 0;

    for (size_t i = 0; i < c->rounds; i++) {
        atap_chan *ch = open_chan(sizeof(uint64_t), i % 3 == 2 ? 1 : 0, u64_free);
        atomic_store(&c->ch, ch);
        atomic_store(&c->send_first, (int)(i % 2));
        uint64_t base = completed_now();
        atap_task r1 = spawn_recv(ch);
        if (i % 4 < 2) /* parked for sure; else maybe still in its first run */
            assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        barrier_wait(&c->bar);
        atap_task r2 = spawn_recv(ch); /* racing the close */
        barrier_wait(&c->bar);
        int values = 0;
        atap_task rs[2] = {r1, r2};
        for (int k = 0; k < 2; k++) {
            uint64_t v = 0;
            int rc = atap_take_for(rs[k], &v, sizeof v, ATAP_SEC(20));
            if (rc == 0) {
                assert_int_equal(v, 7);
                values++;
                got++;
            } else if (rc == ATAP_ECLOSED) {
                closed++;
            } else {
                fail_msg("round %zu: receiver %d joined %d (%s)", i, k, rc, atap_strerror(rc));
            }
            atap_release(rs[k]);
        }
        assert_int_equal(values, i % 2 ? 1 : 0);
        atap_chan_close_receiver(ch);
    }
    racer_join();
    print_message("close vs receivers: %d values, %d closed\n", got, closed);
    assert_int_equal(atomic_load(&g_frees), 0);
    waited_to_live_back();
    assert_no_failures();
}

struct cancel_race {
    test_barrier bar;
    _Atomic(atap_chan *) ch;
    atomic_uint_fast64_t value;
    atomic_int receive; /* the racer receives (one receive task) instead of sending */
    atomic_int stop;
    atomic_int rc;
    atomic_uint_fast64_t got;
    size_t rounds;
};
static struct cancel_race g_xr;

static void cancel_race_init(struct cancel_race *x, bool receive)
{
    x->rounds = scaled(200, 50);
    barrier_init(&x->bar, 2);
    atomic_store(&x->receive, receive);
    atomic_store(&x->stop, 0);
    atomic_store(&x->rc, 0);
}

static void *cancel_racer(void *arg)
{
    (void)arg;
    struct cancel_race *x = &g_xr;
    for (size_t i = 0; i < x->rounds; i++) {
        if (!race_wait(&x->bar) || atomic_load(&x->stop))
            return NULL;
        atap_chan *ch = atomic_load(&x->ch);
        if (i % 3 == 1)
            for (unsigned k = 0; k < (unsigned)(i % 5) * 10u; k++)
                sched_yield();
        if (atomic_load(&x->receive)) {
            atap_task t = ATAP_NO_TASK;
            int rc = atap_chan_spawn_recv(&t, ch, NULL);
            if (rc == 0) {
                uint64_t v = UINT64_MAX;
                rc = atap_take_for(t, &v, sizeof v, ATAP_SEC(20));
                atomic_store(&x->got, v);
                atap_release(t);
            }
            atomic_store(&x->rc, rc);
        } else {
            uint64_t v = atomic_load(&x->value);
            atomic_store(&x->rc, atap_chan_send(ch, &v));
        }
        if (!race_wait(&x->bar))
            return NULL;
    }
    return NULL;
}

/* Joins the racer; early: it waits at the next round's first barrier. */
static void cancel_racer_stop(bool early)
{
    if (early) {
        atomic_store(&g_xr.stop, 1);
        race_wait(&g_xr.bar);
    }
    racer_join();
}

/* A value is sent while the only receive task is cancelled: it is received
 * by that task (READY), or left queued for the next receiver, or, taken by
 * a run the cancel then dropped, released by elem_free. Never lost. */
static void test_channel_race_send_vs_cancel_only_receiver(void **state)
{
    (void)state;
    reset_counts();
    struct cancel_race *x = &g_xr;
    cancel_race_init(x, false);
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
    atomic_store(&x->ch, ch);
    racer_start(cancel_racer);
    int by_task = 0, queued = 0, dropped = 0;

    for (size_t i = 0; i < x->rounds; i++) {
        atomic_store(&x->value, i);
        uint64_t base = completed_now();
        atap_task r = spawn_recv(ch);
        if (i % 2 == 0)
            assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        barrier_wait(&x->bar);
        if (i % 4 == 3)
            for (unsigned k = 0; k < (unsigned)(i % 7) * 10u; k++)
                sched_yield();
        assert_int_equal(atap_cancel(r), 0);
        barrier_wait(&x->bar);
        assert_int_equal(atomic_load(&x->rc), 0);
        atap_state st;
        assert_int_equal(atap_wait(r, &st), 0);
        uint64_t v = 0;
        if (st == ATAP_READY) {
            assert_int_equal(atap_take(r, &v, sizeof v), 0);
            assert_int_equal(v, i);
            mark_seen(v);
            by_task++;
        } else {
            assert_int_equal(st, ATAP_CANCELLED);
        }
        atap_release(r);
        /* its run, if one was under way, is over */
        waited_to_live_back();
        if (st != ATAP_READY) {
            if (atap_chan_len(ch) == 1) {
                v = recv_one(ch);
                assert_int_equal(v, i);
                mark_seen(v);
                queued++;
            } else if (atomic_load(&g_freed[i]) == 1) {
                dropped++;
            } else {
                fail_msg("round %zu: the value is neither received, queued nor released", i);
            }
        }
        assert_int_equal(atap_chan_len(ch), 0);
        if (atomic_load(&g_seen[i]) + atomic_load(&g_freed[i]) != 1)
            fail_msg("round %zu: value seen %d, released %d", i, atomic_load(&g_seen[i]),
                     atomic_load(&g_freed[i]));
    }
    cancel_racer_stop(false);
    print_message("send vs cancel: %d by the task, %d left queued, %d released\n", by_task, queued,
                  dropped);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
    for (size_t i = 0; i < x->rounds; i++)
        assert_int_equal(atomic_load(&g_seen[i]) + atomic_load(&g_freed[i]), 1);
    assert_no_failures();
}

#define MAX_STRANDED 2

/* Two receive tasks parked, A ahead of B; a value is sent while A is
 * cancelled. If A does not get it (the wake may reach A just before the
 * cancel), B must: a live receiver is never left parked beside a queued
 * value. */
static void test_channel_race_send_vs_cancel_woken_receiver(void **state)
{
    (void)state;
    reset_counts();
    struct cancel_race *x = &g_xr;
    cancel_race_init(x, false);
    racer_start(cancel_racer);
    int by_a = 0, by_b = 0, dropped = 0, stranded = 0;
    size_t i;

    for (i = 0; i < x->rounds && stranded < MAX_STRANDED; i++) {
        atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);
        atomic_store(&x->ch, ch);
        atomic_store(&x->value, i);
        uint64_t base = completed_now();
        atap_task a = spawn_recv(ch);
        assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        base = completed_now();
        atap_task b = spawn_recv(ch);
        assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        barrier_wait(&x->bar);
        if (i % 2)
            for (unsigned k = 0; k < (unsigned)(i % 7) * 5u; k++)
                sched_yield();
        assert_int_equal(atap_cancel(a), 0);
        barrier_wait(&x->bar);
        assert_int_equal(atomic_load(&x->rc), 0);
        atap_state sa;
        assert_int_equal(atap_wait(a, &sa), 0);
        uint64_t v = 0;
        if (sa == ATAP_READY) {
            assert_int_equal(atap_take(a, &v, sizeof v), 0);
            assert_int_equal(v, i);
            mark_seen(v);
            by_a++;
        }
        atap_release(a);
        /* A's run, if one was under way, is over: only B is left */
        if (!wait_live_at_most(g_live_base + 1, ATAP_SEC(20)))
            fail_msg("round %zu: A's slot never went", i);
        if (sa != ATAP_READY) {
            if (atomic_load(&g_freed[i]) == 1) {
                dropped++; /* A's run took it, the cancel dropped it */
            } else {
                int rc = atap_take_for(b, &v, sizeof v, ATAP_SEC(3));
                if (rc == 0) {
                    assert_int_equal(v, i);
                    mark_seen(v);
                    by_b++;
                } else {
                    stranded++;
                    print_error("round %zu: A %s; B still parked after 3 s (join %d, %s) with "
                                "%zu value(s) queued\n",
                                i, sa == ATAP_CANCELLED ? "cancelled" : "?", rc, atap_strerror(rc),
                                atap_chan_len(ch));
                }
            }
        }
        atap_cancel(b);
        atap_release(b);
        waited_to_live_back();
        atap_chan_close_sender(ch);
        atap_chan_close_receiver(ch); /* a stranded value goes to elem_free */
        if (atomic_load(&g_seen[i]) + atomic_load(&g_freed[i]) != 1)
            fail_msg("round %zu: value seen %d, released %d", i, atomic_load(&g_seen[i]),
                     atomic_load(&g_freed[i]));
    }
    cancel_racer_stop(i < x->rounds);
    print_message("send vs cancel of the woken receiver, %zu rounds: A %d, B %d, released %d, "
                  "stranded %d\n",
                  i, by_a, by_b, dropped, stranded);
    if (stranded)
        fail_msg("lost wake: a value stayed queued while a live receive task stayed parked "
                 "(%d round(s))",
                 stranded);
    waited_to_live_back();
    assert_no_failures();
}

/* The bounded mirror: a full channel, two send tasks parked, SA ahead of
 * SB; a receive task makes room while SA is cancelled. If SA does not send,
 * SB must: a live sender is never left parked beside free room. */
static void test_channel_race_recv_vs_cancel_woken_sender(void **state)
{
    (void)state;
    reset_counts();
    struct cancel_race *x = &g_xr;
    cancel_race_init(x, true);
    racer_start(cancel_racer);
    int by_a = 0, by_b = 0, stranded = 0;
    size_t i;

    for (i = 0; i < x->rounds && stranded < MAX_STRANDED; i++) {
        uint64_t q = 3 * i, va = 3 * i + 1, vb = 3 * i + 2;
        atap_chan *ch = open_chan(sizeof(uint64_t), 1, u64_free);
        atomic_store(&x->ch, ch);
        send_u64(ch, q);
        uint64_t base = completed_now();
        atap_task sa = spawn_send_u64(ch, va);
        assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        base = completed_now();
        atap_task sb = spawn_send_u64(ch, vb);
        assert_true(wait_quiet(base, 1, ATAP_SEC(20)));
        barrier_wait(&x->bar);
        if (i % 2)
            for (unsigned k = 0; k < (unsigned)(i % 7) * 5u; k++)
                sched_yield();
        assert_int_equal(atap_cancel(sa), 0);
        barrier_wait(&x->bar);
        assert_int_equal(atomic_load(&x->rc), 0);
        assert_int_equal(atomic_load(&x->got), q);
        mark_seen(q);
        /* the room is filled again, by SA or by SB */
        uint64_t end = now_ns() + ATAP_SEC(3);
        while (atap_chan_len(ch) == 0 && now_ns() < end)
            sleep_us(100);
        if (atap_chan_len(ch) == 1) {
            uint64_t v = recv_one(ch);
            assert_true(v == va || v == vb);
            mark_seen(v);
            if (v == va)
                by_a++;
            else
                by_b++;
        } else {
            stranded++;
            print_error("round %zu: SA %d, SB %d (state) and no value sent into the room "
                        "after 3 s\n",
                        i, (int)atap_state_of(sa), (int)atap_state_of(sb));
        }
        atap_cancel(sb);
        atap_release(sa);
        atap_release(sb);
        waited_to_live_back();
        atap_chan_close_sender(ch);
        atap_chan_close_receiver(ch);
        for (uint64_t v = q; v <= vb; v++)
            if (atomic_load(&g_seen[v]) + atomic_load(&g_freed[v]) != 1)
                fail_msg("round %zu: value %llu seen %d, released %d", i, (unsigned long long)v,
                         atomic_load(&g_seen[v]), atomic_load(&g_freed[v]));
    }
    cancel_racer_stop(i < x->rounds);
    print_message("recv vs cancel of the woken sender, %zu rounds: SA %d, SB %d, stranded %d\n", i,
                  by_a, by_b, stranded);
    if (stranded)
        fail_msg("lost wake: room stayed free while a live send task stayed parked "
                 "(%d round(s))",
                 stranded);
    waited_to_live_back();
    assert_no_failures();
}

/* A wake that reaches a receive task while its park is still being armed
 * counts as delivered; a cancel then takes that park down. The receive must
 * still hand the value on: a second receiver, fully parked behind it, gets
 * it (not left asleep with the value queued). A test hook holds the first
 * receiver's worker between marking its park ARMING and arming it. */
static atomic_int arm_hold_next, arm_holding, arm_go;

static void hold_one_arming(void)
{
    if (!atomic_exchange(&arm_hold_next, 0))
        return; /* every other park passes straight through */
    atomic_store(&arm_holding, 1);
    while (!atomic_load(&arm_go))
        sleep_us(100);
}

static void test_channel_wake_while_arming_then_cancel(void **state)
{
    (void)state;
    reset_counts();
    atap_chan *ch = open_chan(sizeof(uint64_t), 0, u64_free);

    atomic_store(&arm_holding, 0);
    atomic_store(&arm_go, 0);
    atomic_store(&arm_hold_next, 1);
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_ARMING, hold_one_arming), 0);
    atap_task a = spawn_recv(ch);
    assert_true(wait_atomic_at_least(&arm_holding, 1, ATAP_SEC(20))); /* a's park: ARMING */
    uint64_t base = completed_now();
    atap_task b = spawn_recv(ch);
    uint64_t end = now_ns() + ATAP_SEC(20);
    while (completed_now() < base + 1 && now_ns() < end)
        sleep_us(200);
    sleep_us(50000); /* b's park armed (a slow machine only lets b find the value itself) */
    send_u64(ch, 7); /* wakes a, the first waiter, counted delivered */
    assert_int_equal(atap_cancel(a), 0); /* claims a's park from ARMING */
    atomic_store(&arm_go, 1);
    uint64_t v = 0;
    int rc = atap_take_for(b, &v, sizeof v, ATAP_SEC(10));
    assert_int_equal(atap__test_on(ATAP__TEST_PARK_ARMING, NULL), 0);
    if (rc != 0)
        fail_msg("the second receiver read %d (%s) with %zu value(s) queued: the wake was lost", rc,
                 atap_strerror(rc), atap_chan_len(ch));
    assert_true(v == 7);
    atap_state sa;
    assert_int_equal(atap_wait(a, &sa), 0);
    assert_int_equal(sa, ATAP_CANCELLED);
    atap_release(a);
    atap_release(b);
    atap_chan_close_sender(ch);
    atap_chan_close_receiver(ch);
    waited_to_live_back();
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_channel, teardown_channel)
    const struct CMUnitTest tests[] = {
        T(test_channel_unbounded_each_value_once_fifo),
        T(test_channel_receivers_park_before_send),
        T(test_channel_bounded_full_and_parked_senders),
        T(test_channel_mpmc_stress),
        T(test_channel_close_sender_drains_then_closed),
        T(test_channel_close_receiver_drops_and_refuses),
        T(test_channel_elem_free_owned_values),
        T(test_channel_untaken_output_released),
        T(test_channel_cancel_parked_receiver),
        T(test_channel_task_timeouts),
        T(test_channel_timed_out_waiters_pruned),
        T(test_channel_close_receiver_vs_last_sender),
        T(test_channel_close_receiver_no_memory_drops_off_the_lock),
        T(test_channel_values_aligned),
        T(test_channel_bad_arguments),
        T(test_channel_spawn_without_runtime),
        T(test_channel_leak_check),
        T(test_channel_race_close_sender_vs_receiver),
        T(test_channel_race_send_vs_cancel_only_receiver),
        T(test_channel_race_send_vs_cancel_woken_receiver),
        T(test_channel_race_recv_vs_cancel_woken_sender),
        T(test_channel_wake_while_arming_then_cancel),
    };
#undef T
    const char *only = getenv("ATAP_TEST_FILTER"); /* e.g. "*race*" */
    if (only != NULL && *only != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * include/atap.hpp, the C++ layer: typed joins, move-only handles that
 * release themselves, captures that live on the heap exactly as long as the
 * task and are freed by arg_free, failed spawns that leak nothing, a throwing
 * callable failing its run. A plain program (no cmocka): one line per check,
 * exit status 1 if any failed.
 */
#include <atap.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <thread>

static int failures = 0;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        bool ok_ = (cond);                                                              \
        std::printf("%-4s  %s:%d  %s\n", ok_ ? "ok" : "FAIL", __func__, __LINE__, #cond); \
        failures += !ok_;                                                               \
    } while (0)

typedef std::shared_ptr<int> token;

/* Waits up to 10 s for every copy of tok but the caller's to be destroyed
 * (a task's capture goes when the task does, on whichever thread). */
static bool captures_freed(const token &tok)
{
    for (int i = 0; i < 10000 && tok.use_count() != 1; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return tok.use_count() == 1;
}

static size_t live_tasks()
{
    struct atap_pool_stats st = {};
    atap_pool_stats(&st);
    return st.live;
}

static bool live_back_to(size_t n)
{
    for (int i = 0; i < 10000 && live_tasks() != n; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return live_tasks() == n;
}

static void test_hpp_spawn_before_init_leaks_nothing()
{
    token tok = std::make_shared<int>(1);
    atap::task<int> t;
    int rc = atap::spawn(t, [tok](atap_ctx *) { return *tok; });
    CHECK(rc == ATAP_ENOTINIT);
    CHECK(!t);
    CHECK(tok.use_count() == 1); /* the refused closure was destroyed at once */
    int v = 0;
    CHECK(t.join(v) == ATAP_ENOTASK);
}

static void test_hpp_join_reads_a_typed_output()
{
    struct point {
        int x, y;
        double w;
    };
    atap::task<point> t;
    int a = 3, b = 4;
    CHECK(atap::spawn(t, [a, b](atap_ctx *) { return point{a, b, 0.5}; }) == 0);
    point p = {0, 0, 0};
    CHECK(t.join(p) == 0);
    CHECK(p.x == 3 && p.y == 4 && p.w == 0.5);
    CHECK(t.take(p) == 0);
    CHECK(t.take(p) == ATAP_ETAKEN);
}

static void test_hpp_scope_exit_releases_and_frees_the_capture()
{
    token tok = std::make_shared<int>(7);
    {
        atap::task<int> t;
        CHECK(atap::spawn(t, [tok](atap_ctx *) { return *tok * 6; }) == 0);
        int v = 0;
        CHECK(t.join(v) == 0 && v == 42);
        CHECK(tok.use_count() >= 2); /* the task still holds its capture */
    }
    CHECK(live_back_to(0)); /* every earlier test released its handles too */
    CHECK(captures_freed(tok));
}

static void test_hpp_moves_transfer_and_release()
{
    token first = std::make_shared<int>(1), second = std::make_shared<int>(2);
    atap::task<int> a, b;
    CHECK(atap::spawn(a, [first](atap_ctx *) { return *first; }) == 0);
    CHECK(atap::spawn(b, [second](atap_ctx *) { return *second; }) == 0);
    atap_task raw_a = a.get();

    atap::task<int> c(std::move(a)); /* c owns a's task, a is empty */
    CHECK(!a && c && c.get().id == raw_a.id);
    int v = 0;
    CHECK(a.join(v) == ATAP_ENOTASK);
    CHECK(c.join(v) == 0 && v == 1);

    c = std::move(b); /* c's old task (a's) is released, its capture freed */
    CHECK(!b && c.join(v) == 0 && v == 2);
    CHECK(captures_freed(first));
    CHECK(atap_join(raw_a, &v, sizeof v) == ATAP_ENOTASK);

    atap_task raw = c.release(); /* ownership back to C */
    CHECK(!c && atap_join(raw, &v, sizeof v) == 0 && v == 2);
    atap_release(raw);
    CHECK(captures_freed(second));
}

static void test_hpp_dup_outlives_the_original()
{
    atap::task<long> t, copy;
    CHECK(atap::spawn(t, [](atap_ctx *) { return 99L; }) == 0);
    CHECK(t.dup(copy) == 0 && copy && copy.get().id == t.get().id);
    t.reset();
    long v = 0;
    CHECK(copy.join(v) == 0 && v == 99);
}

static void test_hpp_void_task_and_wait()
{
    std::shared_ptr<std::atomic<int>> hits = std::make_shared<std::atomic<int>>(0);
    atap::task<void> t;
    CHECK(atap::spawn(t, [hits](atap_ctx *) { ++*hits; }) == 0);
    CHECK(t.join() == 0);
    atap_state state = ATAP_PENDING;
    CHECK(t.wait(&state) == 0 && state == ATAP_READY);
    CHECK(*hits == 1);
}

static void test_hpp_repeat_runs_one_closure()
{
    atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
    opts.kind = ATAP_REPEAT;
    opts.runs = 4;
    token tok = std::make_shared<int>(0);
    atap::task<int> t;
    int n = 0;
    CHECK(atap::spawn(t, [n, tok](atap_ctx *) mutable { return ++n; }, opts) == 0);
    while (!t.finished())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    int v = 0;
    CHECK(t.join(v) == 0 && v == 4); /* the mutable count went up in one object */
    CHECK(tok.use_count() == 2);     /* one capture for the series, not one per run */
    t.reset();
    CHECK(captures_freed(tok));
}

static void test_hpp_options_pass_through()
{
    atap_spawn_opts opts = atap_spawn_opts_out(1234); /* out_size is the layer's */
    opts.timeout_ns = ATAP_MS(20);
    atap::task<int> t;
    CHECK(atap::spawn(t, [](atap_ctx *ctx) {
              while (!atap_cancelled(ctx))
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              return 0;
          }, opts) == 0);
    int v = 0;
    CHECK(t.join(v) == ATAP_ETIMEDOUT);
    CHECK(t.state() == ATAP_TIMED_OUT);
}

static void test_hpp_cancel()
{
    atap::task<int> t;
    CHECK(atap::spawn(t, [](atap_ctx *ctx) {
              for (int i = 0; i < 10000 && !atap_cancelled(ctx); i++)
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              return 1;
          }) == 0);
    CHECK(t.cancel() == 0);
    int v = 0;
    CHECK(t.join(v) == ATAP_ECANCELLED);
}

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
static void test_hpp_throw_fails_the_run()
{
    token tok = std::make_shared<int>(0);
    atap::task<int> t;
    CHECK(atap::spawn(t, [tok](atap_ctx *) -> int { throw std::runtime_error("no"); }) == 0);
    int v = 0;
    CHECK(t.join(v) == ATAP_EFAILED);
    CHECK(t.state() == ATAP_FAILED);
    t.reset();
    CHECK(captures_freed(tok));
}
#endif

int main()
{
    test_hpp_spawn_before_init_leaks_nothing();
    if (atap_init(nullptr) != 0) {
        std::printf("FAIL  atap_init\n");
        return 1;
    }
    test_hpp_join_reads_a_typed_output();
    test_hpp_scope_exit_releases_and_frees_the_capture();
    test_hpp_moves_transfer_and_release();
    test_hpp_dup_outlives_the_original();
    test_hpp_void_task_and_wait();
    test_hpp_repeat_runs_one_closure();
    test_hpp_options_pass_through();
    test_hpp_cancel();
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    test_hpp_throw_fails_the_run();
#endif
    CHECK(atap_shutdown() == 0);
    CHECK(live_tasks() == 0);
    std::printf("test_hpp: %d check(s) failed\n", failures);
    return failures != 0;
}

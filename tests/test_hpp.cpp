/*
 * include/atap.hpp, the C++ layer: typed joins, move-only handles that
 * release themselves, captures that live on the heap exactly as long as the
 * task and are freed by arg_free, failed spawns that leak nothing, a throwing
 * callable's exception rethrown to its joiner, results of any movable type
 * built and destroyed once, task groups, the runtime as a scope, chrono
 * durations, join_all / join_first / channels, and lambdas named in traces.
 * A plain program (no cmocka): one line per check, exit status 1 if any
 * failed. Built with -Wshadow, by g++ and clang++ (tests/CMakeLists.txt).
 */
#include <atap.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        bool ok_ = (cond);                                                                         \
        std::printf("%-4s  %s:%d  %s\n", ok_ ? "ok" : "FAIL", __func__, __LINE__, #cond);          \
        failures += !ok_;                                                                          \
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

/* Detached: each runs once, the capture goes with the task, an exception
 * is dropped with it; nothing stays in the table. */
static void test_hpp_detached_runs_and_frees_the_capture()
{
    token tok = std::make_shared<int>(3);
    std::atomic<int> runs(0);
    std::atomic<int> *r = &runs;
    int refused = 0;
    for (int i = 0; i < 100; i++)
        refused += atap::spawn_detached([tok, r](atap_ctx *) { r->fetch_add(*tok); }) != 0;
    CHECK(refused == 0);
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    CHECK(atap::spawn_detached([tok, r](atap_ctx *) -> int {
              r->fetch_add(1);
              throw std::runtime_error("dropped with the task");
          }) == 0);
    const int want = 301;
#else
    const int want = 300;
#endif
    CHECK(captures_freed(tok));
    CHECK(runs.load() == want);
    CHECK(live_back_to(0));
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
    CHECK(atap::spawn(
              t, [n, tok](atap_ctx *) mutable { return ++n; }, opts) == 0);
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
    CHECK(atap::spawn(
              t,
              [](atap_ctx *ctx) {
                  while (!atap_cancelled(ctx))
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                  return 0;
              },
              opts) == 0);
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
/* The exception a run threw reaches whoever joins it (every join, and a
 * copy's), as std::future::get rethrows; the task reads ATAP_FAILED. */
static void test_hpp_throw_reaches_the_joiner()
{
    token tok = std::make_shared<int>(0);
    atap::task<int> t, copy;
    CHECK(atap::spawn(t, [tok](atap_ctx *) -> int { throw std::runtime_error("no"); }) == 0);
    CHECK(t.dup(copy) == 0);
    int v = 0, caught = 0;
    for (int i = 0; i < 2; i++) {
        try {
            (i ? copy : t).join(v);
        } catch (const std::runtime_error &e) {
            caught += std::string(e.what()) == "no";
        }
    }
    CHECK(caught == 2);
    CHECK(t.state() == ATAP_FAILED);
    CHECK(atap_join(t.get(), &v, sizeof v) == ATAP_EFAILED); /* C reads the code */
    atap::task<std::string> s;
    CHECK(atap::spawn(s, [](atap_ctx *) -> std::string { throw std::logic_error("s"); }) == 0);
    std::string out;
    bool thrown = false;
    try {
        s.take(out);
    } catch (const std::logic_error &) {
        thrown = true;
    }
    CHECK(thrown);
    t.reset();
    copy.reset();
    CHECK(captures_freed(tok));
}
#endif

/* A result type that counts its lives: every one made is destroyed once. */
struct counted {
    static std::atomic<int> made, gone;
    std::string text;
    explicit counted(std::string s) : text(std::move(s)) { ++made; }
    counted(const counted &o) : text(o.text) { ++made; }
    counted(counted &&o) noexcept : text(std::move(o.text)) { ++made; }
    counted &operator=(const counted &) = default;
    counted &operator=(counted &&) = default;
    ~counted() { ++gone; }
};
std::atomic<int> counted::made(0), counted::gone(0);

static bool counted_balanced()
{
    for (int i = 0; i < 10000 && counted::made != counted::gone; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return counted::made == counted::gone;
}

/* Results of any movable type: taken (moved out), joined (copied), or never
 * read (cancelled before the run, cancelled during it, released unread),
 * each result is destroyed exactly once. */
static void test_hpp_movable_results()
{
    atap::task<std::string> s;
    CHECK(atap::spawn(s, [](atap_ctx *) { return std::string(100, 'x'); }) == 0);
    std::string a, b;
    CHECK(s.join(a) == 0 && a == std::string(100, 'x'));
    CHECK(s.take(b) == 0 && b == a);
    CHECK(s.take(b) == ATAP_ETAKEN && s.join(a) == ATAP_ETAKEN);

    atap::task<std::vector<int>> v;
    CHECK(atap::spawn(v, [](atap_ctx *) { return std::vector<int>(1000, 7); }) == 0);
    std::vector<int> got;
    CHECK(v.take(got) == 0 && got.size() == 1000 && got[999] == 7);

    {
        atap::task<counted> taken, unread, never, stopped;
        CHECK(atap::spawn(taken, [](atap_ctx *) { return counted("taken"); }) == 0);
        counted out("");
        CHECK(taken.take(out) == 0 && out.text == "taken");
        CHECK(atap::spawn(unread, [](atap_ctx *) { return counted("unread"); }) == 0);
        CHECK(unread.wait() == 0);
        atap_spawn_opts later = ATAP_SPAWN_OPTS_INIT;
        later.after_ns = ATAP_SEC(60);
        CHECK(atap::spawn(
                  never, [](atap_ctx *) { return counted("never"); }, later) == 0);
        CHECK(never.cancel() == 0);
        CHECK(atap::spawn(stopped, [](atap_ctx *ctx) {
                  while (!atap_cancelled(ctx))
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                  return counted("stopped");
              }) == 0);
        while (stopped.state() == ATAP_PENDING)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK(stopped.cancel() == 0);
        CHECK(stopped.join(out) == ATAP_ECANCELLED);
        atap_spawn_opts rep = ATAP_SPAWN_OPTS_INIT;
        rep.kind = ATAP_REPEAT;
        atap::task<counted> series;
        CHECK(atap::spawn(
                  series, [](atap_ctx *) { return counted("r"); }, rep) == ATAP_EINVAL);
    }
    CHECK(counted_balanced());
    CHECK(counted::made >= 3);
}

/* A result left unread in a task whose handle outlives the runtime is
 * destroyed once, when the handle goes. */
static atap::task<counted> outlives;

static void test_hpp_group_runs_and_waits()
{
    std::shared_ptr<std::atomic<int>> n = std::make_shared<std::atomic<int>>(0);
    atap::task_group g;
    for (int i = 0; i < 8; i++)
        CHECK(g.run([n] { ++*n; }) == 0);
    CHECK(g.size() == 8);
    CHECK(g.wait() == 0);
    CHECK(*n == 8 && g.size() == 0);
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    CHECK(g.run([n] { ++*n; }) == 0);
    CHECK(g.run([] { throw std::out_of_range("member"); }) == 0);
    bool thrown = false;
    try {
        g.wait();
    } catch (const std::out_of_range &) {
        thrown = true;
    }
    CHECK(thrown && *n == 9);
#endif
    /* Inside a task: the members run while the task waits for them. */
    atap::task<int> outer;
    CHECK(atap::spawn(outer, [](atap_ctx *) {
              std::atomic<int> k(0);
              atap::task_group inner;
              for (int i = 0; i < 16; i++)
                  inner.run([&k] { ++k; });
              return inner.wait() == 0 ? k.load() : -1;
          }) == 0);
    int v = 0;
    CHECK(outer.join(v) == 0 && v == 16);
}

static void test_hpp_runtime_scope_and_chrono()
{
    {
        atap::runtime rt; /* one more user of the running runtime */
        CHECK(rt.code() == 0 && atap_initialised());
    }
    CHECK(atap_initialised()); /* main's user still holds it */
    CHECK(atap::ns(std::chrono::milliseconds(3)) == 3000000u);
    CHECK(atap::ns(std::chrono::seconds(-1)) == 0u);
    CHECK(atap::ns(std::chrono::hours(24 * 365 * 1000)) == ATAP_FOREVER);
    atap::task<int> slow;
    CHECK(atap::spawn(slow, [](atap_ctx *ctx) {
              while (!atap_cancelled(ctx))
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              return 1;
          }) == 0);
    int v = 0;
    CHECK(slow.join_for(v, std::chrono::milliseconds(5)) == ATAP_ENOTREADY);
    CHECK(slow.cancel() == 0);
    CHECK(atap::sleep(std::chrono::microseconds(100)) == 0);
    struct atap_status st = atap::status();
    CHECK(st.initialised);
    CHECK(atap::pool_stats().workers >= 1);
}

static void test_hpp_join_all_first_and_channels()
{
    std::vector<atap::task<int>> ts(4);
    for (int i = 0; i < 4; i++)
        CHECK(atap::spawn(ts[i], [i](atap_ctx *) { return i * 10; }) == 0);
    std::vector<int> out;
    CHECK(atap::join_all(ts, out) == 0 && out.size() == 4 && out[3] == 30);

    std::vector<atap::task<std::string>> ss(2);
    CHECK(atap::spawn(ss[0], [](atap_ctx *) { return std::string("a"); }) == 0);
    CHECK(atap::spawn(ss[1], [](atap_ctx *) { return std::string("b"); }) == 0);
    std::vector<std::string> sout;
    CHECK(atap::join_all(ss, sout) == 0 && sout[0] == "a" && sout[1] == "b");

    std::vector<atap::task<int>> race(2);
    CHECK(atap::spawn(race[0], [](atap_ctx *ctx) {
              while (!atap_cancelled(ctx))
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              return 0;
          }) == 0);
    CHECK(atap::spawn(race[1], [](atap_ctx *) { return 5; }) == 0);
    size_t winner = 9;
    CHECK(atap::join_first(race, winner, ATAP_CANCEL, std::chrono::seconds(20)) == 0);
    CHECK(winner == 1 && race[1] && !race[0]);
    int v = 0;
    CHECK(race[1].join(v) == 0 && v == 5);

    atap::channel<int> ch;
    CHECK(ch.open(4) == 0);
    CHECK(ch.send(1) == 0 && ch.send(2) == 0 && ch.size() == 2);
    atap::task<int> r1, r2;
    CHECK(ch.recv(r1) == 0 && r1.join(v) == 0 && v == 1);
    CHECK(ch.recv(r2) == 0 && r2.join(v) == 0 && v == 2);
    atap::task<void> sent;
    atap::task<int> r3;
    CHECK(ch.send_task(sent, 3) == 0 && sent.join() == 0);
    CHECK(ch.recv(r3) == 0 && r3.join(v) == 0 && v == 3);
    sent.reset(); /* a send task is a sender while it lives */
    ch.close_sender();
    atap::task<int> r4;
    CHECK(ch.recv(r4) == 0 && r4.join(v) == ATAP_ECLOSED);
}

/* A lambda's runs read in a trace under its type's name, or the name the
 * spawn gave. */
static void test_hpp_lambdas_named_in_traces()
{
    char path[] = "/tmp/atap_hpp_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    CHECK(atap_trace_start(path) == 0);
    atap::task<int> a, b;
    CHECK(atap::spawn(a, [](atap_ctx *) { return 1; }) == 0);
    CHECK(atap::spawn_named(b, "parse-request", [](atap_ctx *) { return 2; }) == 0);
    int v = 0;
    CHECK(a.join(v) == 0 && b.join(v) == 0);
    CHECK(atap_trace_stop() == 0);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::string t = text.str();
    CHECK(t.find("\"name\":\"parse-request\",\"cat\":\"atap\",\"ph\":\"B\"") != std::string::npos);
    /* g++ spells it "test_hpp_lambdas_named_in_traces()::<lambda(atap_ctx*)>",
     * clang++ "(lambda at .../test_hpp.cpp:LINE:COL)". */
    CHECK(t.find("lambda") != std::string::npos &&
          (t.find("test_hpp_lambdas_named_in_traces") != std::string::npos ||
           t.find("test_hpp.cpp:") != std::string::npos));
    std::remove(path);
}

int main()
{
    test_hpp_spawn_before_init_leaks_nothing();
    if (atap_init(nullptr) != 0) {
        std::printf("FAIL  atap_init\n");
        return 1;
    }
    test_hpp_join_reads_a_typed_output();
    test_hpp_scope_exit_releases_and_frees_the_capture();
    test_hpp_detached_runs_and_frees_the_capture();
    test_hpp_moves_transfer_and_release();
    test_hpp_dup_outlives_the_original();
    test_hpp_void_task_and_wait();
    test_hpp_repeat_runs_one_closure();
    test_hpp_options_pass_through();
    test_hpp_cancel();
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    test_hpp_throw_reaches_the_joiner();
#endif
    test_hpp_movable_results();
    test_hpp_group_runs_and_waits();
    test_hpp_runtime_scope_and_chrono();
    test_hpp_join_all_first_and_channels();
    test_hpp_lambdas_named_in_traces();
    CHECK(atap::spawn(outlives, [](atap_ctx *) { return counted("outlives"); }) == 0);
    CHECK(outlives.wait() == 0);
    CHECK(live_back_to(1));
    CHECK(atap_shutdown() == 0);
    outlives.reset(); /* after the runtime stopped */
    CHECK(counted_balanced());
    CHECK(live_tasks() == 0);
    std::printf("test_hpp: %d check(s) failed\n", failures);
    return failures != 0;
}

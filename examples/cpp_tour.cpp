/*
 * cpp_tour: libatap from C++, first through atap.h as C++ sees it, then
 * through the thin RAII layer atap.hpp: a spawn from a captureless lambda,
 * spawns from capturing lambdas, a join, a repeat and a cancel. One line per
 * step; exits 0 only if every step behaved as documented.
 */
#include <atap.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

static int failures = 0;

static void step(bool ok, const char *what, long value)
{
    std::printf("%-4s  %s: %ld\n", ok ? "ok" : "FAIL", what, value);
    failures += !ok;
}

int main()
{
    if (atap_init(nullptr) != 0)
        return 1;
    /* Outlives the cancel step's task, whose capture holds a copy. */
    std::shared_ptr<std::atomic<bool>> saw_cancel = std::make_shared<std::atomic<bool>>(false);

    {
        /* atap.h as is: a captureless lambda is an atap_fn, the options
         * start from ATAP_SPAWN_OPTS_INIT, and the handle is released by
         * hand. */
        atap_fn *square = [](atap_ctx *, void *arg, void *out) -> int {
            long n = *static_cast<const long *>(arg);
            *static_cast<long *>(out) = n * n;
            return 0;
        };
        long n = 12, v = 0;
        atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
        opts.out_size = sizeof v;
        atap_task t = ATAP_NO_TASK;
        int rc = atap_spawn(&t, square, &n, &opts);
        rc = rc ? rc : atap_join(t, &v, sizeof v);
        atap_release(t);
        step(rc == 0 && v == 144, "C API, captureless lambda: 12 squared", v);
    }

    {
        /* atap.hpp: the capture travels with the task and is freed when
         * the task goes; the handle is released when t goes out of scope. */
        long base = 40, v = 0;
        atap::task<long> t;
        int rc = atap::spawn(t, [base](atap_ctx *) { return base + 2; });
        rc = rc ? rc : t.join(v);
        step(rc == 0 && v == 42, "atap::spawn, capturing lambda: 40 + 2", v);
    }

    {
        /* A repeat: five runs 1 ms apart, one closure (and its count) for
         * all of them. The handle reads the newest output; once the series
         * is over the last one stays, a take moves it out, and a take after
         * that reads ATAP_EFINISHED. */
        atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
        opts.kind = ATAP_REPEAT;
        opts.runs = 5;
        opts.every_ns = ATAP_MS(1);
        atap::task<int> t;
        int count = 0, last = 0;
        int rc = atap::spawn(
            t, [count](atap_ctx *) mutable { return ++count; }, opts);
        while (rc == 0 && !t.finished())
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        rc = rc ? rc : t.take(last);
        int again = t.take(last);
        step(rc == 0 && last == 5 && again == ATAP_EFINISHED,
             "repeat of 5 runs: the last output taken", last);
    }

    {
        /* A cancel: the task sees it between its 1 ms naps and stops; every
         * reader then gets ATAP_ECANCELLED. */
        atap::task<void> t;
        int rc = atap::spawn(t, [saw_cancel](atap_ctx *ctx) {
            for (int i = 0; i < 10000 && !atap_cancelled(ctx); i++)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            *saw_cancel = atap_cancelled(ctx);
        });
        for (int i = 0; rc == 0 && i < 5000 && t.state() == ATAP_PENDING; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        rc = rc ? rc : t.cancel();
        rc = rc ? rc : t.join();
        atap_state state;
        t.wait(&state);
        step(rc == ATAP_ECANCELLED && state == ATAP_CANCELLED,
             "cancelled a running task, join reads ATAP_ECANCELLED", rc);
    }

    /* The cancelled run may still be on its way out: shutdown waits for it,
     * and only then has every task, and every capture, gone. */
    int rc = atap_shutdown();
    struct atap_pool_stats st = {};
    atap_pool_stats(&st);
    step(rc == 0 && st.live == 0 && saw_cancel.use_count() == 1 && *saw_cancel,
         "atap_shutdown: the cancelled task saw its cancel, its capture is freed; live tasks",
         (long)st.live);
    std::printf("cpp_tour: %s\n", failures ? "some steps did not behave as documented"
                                           : "every step behaved as documented");
    return failures != 0;
}

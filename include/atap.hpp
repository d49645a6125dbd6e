/*
 * libatap for C++ (C++11 and later): a thin, header-only layer over atap.h.
 *
 *   atap::task<R>  a move-only handle on a task whose output is an R (or no
 *                  output for R = void). It releases its handle when it is
 *                  destroyed or assigned over; join/take read straight into
 *                  an R, so the size can never be wrong.
 *   atap::spawn    spawns a callable, lambdas with captures included. The
 *                  callable is moved to the heap and freed by the task's
 *                  arg_free once the task is gone for good (every run of a
 *                  repeat calls the same object). It is called as
 *                  f(atap_ctx *ctx) and returns the R each run publishes.
 *
 * Everything else is atap.h: errors are the same int codes (no exceptions
 * are thrown), atap_init/atap_shutdown are called as in C, and
 * task.get() hands the raw atap_task to any atap_* call.
 *
 *     atap::task<long> t;
 *     long x = 7, v = 0;
 *     if (atap::spawn(t, [x](atap_ctx *) { return x * x; }) == 0 && t.join(v) == 0)
 *         ...                        // v == 49; t releases its handle on scope exit
 *
 * R must be trivially copyable: the runtime copies outputs as bytes, and an
 * output nobody read is dropped without a destructor. An exception that
 * leaves the callable fails that run (readers see ATAP_EFAILED); a callable
 * must not end its thread (pthread_exit), which C++ cannot unwind through
 * the runtime's C frames.
 */
#ifndef ATAP_HPP
#define ATAP_HPP

#include <atap.h>

#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace atap {

namespace detail {

/* Release rules shared by every task<R>. */
class handle {
  public:
    handle() noexcept : t_(ATAP_NO_TASK) {}
    explicit handle(atap_task t) noexcept : t_(t) {}
    handle(handle &&other) noexcept : t_(other.release()) {}
    handle &operator=(handle &&other) noexcept
    {
        if (this != &other)
            reset(other.release());
        return *this;
    }
    handle(const handle &) = delete;
    handle &operator=(const handle &) = delete;
    ~handle() { reset(); }

    /* The raw handle, still owned by this object. */
    atap_task get() const noexcept { return t_; }
    /* Gives up ownership: the caller must atap_release() the result. */
    atap_task release() noexcept
    {
        atap_task t = t_;
        t_ = ATAP_NO_TASK;
        return t;
    }
    /* Releases the handle held (if any) and holds t instead. */
    void reset(atap_task t = ATAP_NO_TASK) noexcept
    {
        if (t_.id != 0)
            atap_release(t_);
        t_ = t;
    }
    explicit operator bool() const noexcept { return t_.id != 0; }

    int cancel() const noexcept { return atap_cancel(t_); }
    atap_state state() const noexcept { return atap_state_of(t_); }
    bool finished() const noexcept { return atap_finished(t_); }
    int wait(atap_state *state = nullptr) const noexcept { return atap_wait(t_, state); }

  protected:
    /* Another listener on the same task (atap_dup), owned by *copy. */
    int dup_into(handle &copy) const noexcept
    {
        atap_task t;
        int rc = atap_dup(t_, &t);
        if (rc == 0)
            copy.reset(t);
        return rc;
    }

  private:
    atap_task t_;
};

/* Writes a run's result to out: R by copy, void as nothing. */
template <class R>
struct publish {
    template <class F>
    static void run(F &f, atap_ctx *ctx, void *out)
    {
        R r = f(ctx); /* copied as bytes: out need not be aligned for R */
        std::memcpy(out, &r, sizeof r);
    }
};
template <>
struct publish<void> {
    template <class F>
    static void run(F &f, atap_ctx *ctx, void *)
    {
        f(ctx);
    }
};

template <class F, class R>
int trampoline(atap_ctx *ctx, void *arg, void *out)
{
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    try {
        publish<R>::run(*static_cast<F *>(arg), ctx, out);
    } catch (...) {
        return ATAP_EFAILED;
    }
#else
    publish<R>::run(*static_cast<F *>(arg), ctx, out);
#endif
    return 0;
}

template <class F>
void destroy(void *arg)
{
    delete static_cast<F *>(arg);
}

template <class R>
struct out_size : std::integral_constant<size_t, sizeof(R)> {};
template <>
struct out_size<void> : std::integral_constant<size_t, 0> {};

} // namespace detail

/* A move-only handle on a task publishing an R. Empty when default-made,
 * moved from, or after a failed spawn. */
template <class R>
class task : public detail::handle {
    static_assert(std::is_trivially_copyable<R>::value,
                  "atap::task<R>: R is copied as bytes, so it must be trivially copyable");

  public:
    task() noexcept = default;
    /* Adopts a raw handle from atap.h; its out_size must be sizeof(R). */
    explicit task(atap_task t) noexcept : handle(t) {}

    int join(R &out) const noexcept { return atap_join(get(), &out, sizeof out); }
    int join_for(R &out, uint64_t timeout_ns) const noexcept
    {
        return atap_join_for(get(), &out, sizeof out, timeout_ns);
    }
    int try_join(R &out) const noexcept { return atap_try_join(get(), &out, sizeof out); }
    int take(R &out) const noexcept { return atap_take(get(), &out, sizeof out); }

    /* Another listener on the same task (atap_dup), owned by *copy. */
    int dup(task &copy) const noexcept { return dup_into(copy); }
};

/* A task with no output: join waits for it to settle. */
template <>
class task<void> : public detail::handle {
  public:
    task() noexcept = default;
    explicit task(atap_task t) noexcept : handle(t) {}

    int join() const noexcept { return atap_join(get(), nullptr, 0); }
    int join_for(uint64_t timeout_ns) const noexcept
    {
        return atap_join_for(get(), nullptr, 0, timeout_ns);
    }
    int try_join() const noexcept { return atap_try_join(get(), nullptr, 0); }

    int dup(task &copy) const noexcept { return dup_into(copy); }
};

/*
 * Spawns f on the pool; on success t holds the handle (any handle it held
 * before is released). opts gives everything but out_size, out_free and
 * arg_free, which are this layer's. f(ctx) must return something
 * convertible to R (anything, for R = void).
 * Returns atap_spawn's code (the callable is then destroyed and t left as
 * it was), or ATAP_EFAILED when f cannot be moved to the heap (no memory,
 * or its constructor threw).
 */
template <class R, class F>
int spawn(task<R> &t, F &&f, atap_spawn_opts opts = atap_spawn_opts())
{
    typedef typename std::decay<F>::type Fn;
    typedef decltype(std::declval<Fn &>()(static_cast<atap_ctx *>(nullptr))) Result;
    static_assert(std::is_void<R>::value || std::is_convertible<Result, R>::value,
                  "atap::spawn: the callable's result does not convert to the task's R");

    Fn *arg = nullptr;
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    try {
        arg = new (std::nothrow) Fn(std::forward<F>(f));
    } catch (...) {
        arg = nullptr;
    }
#else
    arg = new (std::nothrow) Fn(std::forward<F>(f));
#endif
    if (arg == nullptr)
        return ATAP_EFAILED;

    opts.out_size = detail::out_size<R>::value;
    opts.out_free = nullptr;
    opts.arg_free = &detail::destroy<Fn>;
    atap_task raw;
    int rc = atap_spawn(&raw, &detail::trampoline<Fn, R>, arg, &opts);
    if (rc != 0) {
        delete arg; /* a refused spawn leaves arg the caller's */
        return rc;
    }
    t.reset(raw);
    return 0;
}

} // namespace atap

#endif

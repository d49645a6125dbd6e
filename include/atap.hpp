/*
 * libatap for C++ (C++11 and later): a thin, header-only layer over atap.h.
 *
 *   atap::task<R>  a move-only handle on a task whose result is an R (or
 *                  none, for R = void). It releases its handle when it is
 *                  destroyed or assigned over; join/take read straight into
 *                  an R, so the size can never be wrong.
 *   atap::spawn    spawns a callable, lambdas with captures included. The
 *                  callable is moved to the heap and freed by the task's
 *                  arg_free once the task is gone for good (every run of a
 *                  repeat calls the same object). It is called as
 *                  f(atap_ctx *ctx) and returns the R each run publishes.
 *                  Its runs read in a trace under the callable's type name
 *                  ("main()::<lambda(atap_ctx*)>"), or a name of the
 *                  caller's (spawn_named).
 *   atap::task_group  run() callables, wait() for them all (as
 *                  tbb::task_group does).
 *   atap::runtime  atap_init in its constructor, atap_shutdown in its
 *                  destructor.
 *   atap::join_all, atap::join_first, atap::channel<T>: the calls of atap.h
 *                  over task<R> and typed values; std::chrono durations
 *                  wherever atap.h takes nanoseconds (atap::ns() converts).
 *
 * Errors are atap.h's int codes, with two exceptions of C++'s own: an
 * exception that leaves the callable fails its run (other readers see
 * ATAP_EFAILED) and is rethrown by join, take, join_all and
 * task_group::wait in the thread that reads the task, as std::future::get
 * does; and atap::runtime throws atap::error when atap_init fails. A
 * callable must not end its thread (pthread_exit), which C++ cannot unwind
 * through the runtime's C frames.
 *
 *     atap::runtime rt;                // atap_init(NULL) .. atap_shutdown()
 *     atap::task<std::string> t;
 *     long x = 7;
 *     if (atap::spawn(t, [x](atap_ctx *) { return std::to_string(x * x); }) == 0) {
 *         std::string v;
 *         t.take(v);                   // v == "49"
 *     }
 *
 * Results. An R that is trivially copyable is the task's output, copied as
 * bytes by the runtime (any kind of task: a repeat publishes each run's).
 * Any other movable R (std::string, std::vector, ...) is built by the run
 * in the task's own state and moved out by take (join copies it); it is
 * destroyed exactly once, by take's caller or, if never taken, when the
 * task is gone for good (cancelled, released unread, or at shutdown).
 * Such a task is a one-shot (opts.kind ATAP_ONCE; spawn returns
 * ATAP_EINVAL otherwise).
 */
#ifndef ATAP_HPP
#define ATAP_HPP

#include <atap.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define ATAP_HPP_EXCEPTIONS 1
#include <exception>
#else
#define ATAP_HPP_EXCEPTIONS 0
#endif

namespace atap
{

/* A duration in the nanoseconds atap.h takes (negative: 0; too long:
 * ATAP_FOREVER). */
template <class Rep, class Period> uint64_t ns(std::chrono::duration<Rep, Period> d) noexcept
{
    typedef std::chrono::duration<long double, std::nano> ldns;
    long double n = std::chrono::duration_cast<ldns>(d).count();
    if (n <= 0)
        return 0;
    if (n >= static_cast<long double>(ATAP_FOREVER))
        return ATAP_FOREVER;
    return static_cast<uint64_t>(n);
}

#if ATAP_HPP_EXCEPTIONS
/* An atap.h code, thrown where C++ has no code to return (atap::runtime). */
class error : public std::runtime_error
{
  public:
    explicit error(int code) : std::runtime_error(atap_strerror(code)), code_(code) {}
    int code() const noexcept { return code_; }

  private:
    int code_;
};
#endif

/* The runtime as a scope: atap_init(config) when made, atap_shutdown when
 * destroyed. A failed init throws atap::error (without exceptions, code()
 * says it and the destructor does nothing). */
class runtime
{
  public:
    explicit runtime(const atap_config *config = nullptr) : rc_(atap_init(config))
    {
#if ATAP_HPP_EXCEPTIONS
        if (rc_ != 0)
            throw error(rc_);
#endif
    }
    ~runtime()
    {
        if (rc_ == 0)
            atap_shutdown();
    }
    runtime(const runtime &) = delete;
    runtime &operator=(const runtime &) = delete;
    int code() const noexcept { return rc_; }

  private:
    int rc_;
};

/* atap_status() and atap_pool_stats(), returning the structs. */
inline struct atap_status status() noexcept
{
    struct atap_status s = {};
    ::atap_status(&s);
    return s;
}
inline struct atap_pool_stats pool_stats() noexcept
{
    struct atap_pool_stats s = {};
    ::atap_pool_stats(&s);
    return s;
}

template <class Rep, class Period> int sleep(std::chrono::duration<Rep, Period> d) noexcept
{
    return atap_sleep(ns(d));
}
template <class Rep, class Period> int sleep_relaxed(std::chrono::duration<Rep, Period> d) noexcept
{
    return atap_sleep_relaxed(ns(d));
}

namespace detail
{

/* R the runtime copies as bytes (the task's output), or void. */
template <class R>
struct as_bytes : std::integral_constant<bool, std::is_trivially_copyable<R>::value> {
};
template <> struct as_bytes<void> : std::true_type {
};

/* What a run leaves beside the runtime's output: the exception that left
 * the callable, and an R that is not copied as bytes. Lives in the task's
 * argument (a closure, below): written by the run, read after the task
 * settled (the runtime's publish orders the two), freed with the task. */
class outcome_base
{
  public:
#if ATAP_HPP_EXCEPTIONS
    std::exception_ptr error;
    void rethrow() const
    {
        if (error)
            std::rethrow_exception(error);
    }
#else
    void rethrow() const {}
#endif
};

template <class R, bool Bytes = as_bytes<R>::value> class outcome : public outcome_base
{
};

template <class R> class outcome<R, false> : public outcome_base
{
  public:
    outcome() noexcept : has_(false), taken_(false) {}
    ~outcome()
    {
        if (has_)
            value().~R();
    }
    outcome(const outcome &) = delete;
    outcome &operator=(const outcome &) = delete;

    template <class F> void make(F &f, atap_ctx *ctx)
    {
        new (static_cast<void *>(buf_)) R(f(ctx));
        has_ = true;
    }
    R &value() noexcept { return *reinterpret_cast<R *>(buf_); }
    bool has() const noexcept { return has_; }
    /* The first caller takes it; later ones read ATAP_ETAKEN. */
    bool claim() noexcept { return !taken_.exchange(true, std::memory_order_acq_rel); }
    bool taken() const noexcept { return taken_.load(std::memory_order_acquire); }

  private:
    alignas(R) unsigned char buf_[sizeof(R)];
    bool has_;
    std::atomic<bool> taken_;
};

/* The task's argument: the callable and what its runs leave. */
template <class Fn, class R> struct closure : outcome<R> {
    explicit closure(Fn &&f) : fn(std::move(f)) {}
    Fn fn;
};

/* Writes a run's result: R by copy into out, void as nothing, any other R
 * into the closure. */
template <class R, bool Bytes = as_bytes<R>::value> struct publish {
    template <class Fn> static void run(closure<Fn, R> &c, atap_ctx *ctx, void *out)
    {
        R r = c.fn(ctx); /* copied as bytes: out need not be aligned for R */
        std::memcpy(out, &r, sizeof r);
    }
};
template <> struct publish<void, true> {
    template <class Fn> static void run(closure<Fn, void> &c, atap_ctx *ctx, void *) { c.fn(ctx); }
};
template <class R> struct publish<R, false> {
    template <class Fn> static void run(closure<Fn, R> &c, atap_ctx *ctx, void *)
    {
        c.make(c.fn, ctx);
    }
};

template <class Fn, class R> int trampoline(atap_ctx *ctx, void *arg, void *out)
{
    closure<Fn, R> &c = *static_cast<closure<Fn, R> *>(arg);
#if ATAP_HPP_EXCEPTIONS
    try {
        publish<R>::run(c, ctx, out);
    } catch (...) {
        c.error = std::current_exception();
        return ATAP_EFAILED;
    }
#else
    publish<R>::run(c, ctx, out);
#endif
    return 0;
}

template <class C> void destroy(void *arg) { delete static_cast<C *>(arg); }

template <class R>
struct out_size : std::integral_constant<size_t, as_bytes<R>::value ? sizeof(R) : 0> {
};
template <> struct out_size<void> : std::integral_constant<size_t, 0> {
};

/* A type's name as the compiler spells it ("main()::<lambda(atap_ctx*)>"),
 * for traces; "" where the compiler gives none. */
template <class T> const char *type_name() noexcept
{
#if defined(__GNUC__)
    struct spelled {
        static std::string from(const char *p)
        {
            const char *b = std::strstr(p, "T = ");
            return b ? std::string(b + 4, std::strcspn(b + 4, ";]")) : std::string();
        }
    };
    static const std::string name = spelled::from(__PRETTY_FUNCTION__);
    return name.c_str();
#else
    return "";
#endif
}

/* Release rules shared by every task<R>. */
class handle
{
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

  private:
    atap_task t_;
};

} // namespace detail

template <class R> class task;
template <class R, class F> int spawn(task<R> &t, F &&f, atap_spawn_opts opts = atap_spawn_opts());
namespace detail
{
template <class R, class F> int spawn_as(task<R> *t, F &&f, atap_spawn_opts opts, const char *name);
}

/* What task<R> shares whatever R is: the handle and the runs' outcome. */
template <class R> class task_base : public detail::handle
{
  public:
    task_base() noexcept : out_(nullptr) {}
    explicit task_base(atap_task t) noexcept : handle(t), out_(nullptr) {}
    task_base(task_base &&o) noexcept : handle(std::move(o)), out_(o.out_) { o.out_ = nullptr; }
    task_base &operator=(task_base &&o) noexcept
    {
        if (this != &o) {
            handle::operator=(std::move(o));
            out_ = o.out_;
            o.out_ = nullptr;
        }
        return *this;
    }
    atap_task release() noexcept
    {
        out_ = nullptr;
        return handle::release();
    }
    void reset(atap_task t = ATAP_NO_TASK) noexcept
    {
        out_ = nullptr;
        handle::reset(t);
    }

    /* Rethrows what the task's run threw, if a run threw (a task adopted
     * from a raw handle knows of none). */
    void rethrow() const
    {
        if (out_)
            out_->rethrow();
    }
    /* A failed run's code, after its exception is rethrown. */
    int checked(int rc) const
    {
        if (rc == ATAP_EFAILED)
            rethrow();
        return rc;
    }

  protected:
    template <class R2, class F>
    friend int detail::spawn_as(task<R2> *t, F &&f, atap_spawn_opts opts, const char *name);
    detail::outcome<R> *out_;
};

/* A move-only handle on a task publishing an R. Empty when default-made,
 * moved from, or after a failed spawn. join, take and their kin return
 * atap.h's codes, and rethrow the exception a run threw (then the task
 * reads ATAP_EFAILED). */
template <class R> class task : public task_base<R>
{
    typedef task_base<R> base;
    static const bool bytes = detail::as_bytes<R>::value;

  public:
    task() noexcept = default;
    /* Adopts a raw handle from atap.h; its out_size must be sizeof(R), and
     * R trivially copyable. */
    explicit task(atap_task t) noexcept : base(t)
    {
        static_assert(detail::as_bytes<R>::value,
                      "atap::task<R>(atap_task): a raw handle's output is bytes");
    }

    /* Waits and copies the result; it stays the task's. */
    int join(R &out) const { return read(out, ATAP_FOREVER, false, false); }
    int try_join(R &out) const { return read(out, 0, true, false); }
    template <class Rep, class Period>
    int join_for(R &out, std::chrono::duration<Rep, Period> timeout) const
    {
        return read(out, ns(timeout), false, false);
    }
    int join_for(R &out, uint64_t timeout_ns) const { return read(out, timeout_ns, false, false); }
    /* Waits and moves the result out: one caller only (later: ATAP_ETAKEN). */
    int take(R &out) const { return read(out, ATAP_FOREVER, false, true); }

    /* Another listener on the same task (atap_dup), owned by copy. */
    int dup(task &copy) const noexcept
    {
        atap_task t;
        int rc = atap_dup(this->get(), &t);
        if (rc == 0) {
            copy.reset(t);
            copy.out_ = this->out_;
        }
        return rc;
    }

  private:
    int read(R &out, uint64_t timeout_ns, bool now, bool take_it) const
    {
        return read_as(out, timeout_ns, now, take_it, std::integral_constant<bool, bytes>());
    }
    int read_as(R &out, uint64_t timeout_ns, bool now, bool take_it, std::true_type) const
    {
        atap_task t = this->get();
        int rc = take_it                      ? atap_take(t, &out, sizeof out)
                 : now                        ? atap_try_join(t, &out, sizeof out)
                 : timeout_ns == ATAP_FOREVER ? atap_join(t, &out, sizeof out)
                                              : atap_join_for(t, &out, sizeof out, timeout_ns);
        return this->checked(rc);
    }
    int read_as(R &out, uint64_t timeout_ns, bool now, bool take_it, std::false_type) const
    {
        atap_task t = this->get();
        int rc = now                          ? atap_try_join(t, nullptr, 0)
                 : timeout_ns == ATAP_FOREVER ? atap_join(t, nullptr, 0)
                                              : atap_join_for(t, nullptr, 0, timeout_ns);
        if (rc != 0)
            return this->checked(rc);
        detail::outcome<R> *o = this->out_;
        if (!o || !o->has())
            return ATAP_EFAILED;
        if (take_it) {
            if (!o->claim())
                return ATAP_ETAKEN;
            out = std::move(o->value());
        } else {
            if (o->taken())
                return ATAP_ETAKEN;
            out = o->value();
        }
        return 0;
    }
};

/* A task with no result: join waits for it to settle. */
template <> class task<void> : public task_base<void>
{
  public:
    task() noexcept = default;
    explicit task(atap_task t) noexcept : task_base(t) {}

    int join() const { return checked(atap_join(get(), nullptr, 0)); }
    template <class Rep, class Period>
    int join_for(std::chrono::duration<Rep, Period> timeout) const
    {
        return checked(atap_join_for(get(), nullptr, 0, ns(timeout)));
    }
    int join_for(uint64_t timeout_ns) const
    {
        return checked(atap_join_for(get(), nullptr, 0, timeout_ns));
    }
    int try_join() const { return checked(atap_try_join(get(), nullptr, 0)); }

    int dup(task &copy) const noexcept
    {
        atap_task t;
        int rc = atap_dup(get(), &t);
        if (rc == 0) {
            copy.reset(t);
            copy.out_ = out_;
        }
        return rc;
    }
};

namespace detail
{
/* t NULL: a detached spawn (atap_spawn_detached), no handle. */
template <class R, class F> int spawn_as(task<R> *t, F &&f, atap_spawn_opts opts, const char *name)
{
    typedef typename std::decay<F>::type Fn;
    typedef decltype(std::declval<Fn &>()(static_cast<atap_ctx *>(nullptr))) Result;
    typedef closure<Fn, R> C;
    static_assert(std::is_void<R>::value || std::is_convertible<Result, R>::value,
                  "atap::spawn: the callable's result does not convert to the task's R");

    if (!as_bytes<R>::value && opts.kind != ATAP_ONCE)
        return ATAP_EINVAL; /* one result, built in the task's state: one run */
    C *arg = nullptr;
#if ATAP_HPP_EXCEPTIONS
    try {
        Fn copy(std::forward<F>(f));
        arg = new (std::nothrow) C(std::move(copy));
    } catch (...) {
        arg = nullptr;
    }
#else
    Fn copy(std::forward<F>(f));
    arg = new (std::nothrow) C(std::move(copy));
#endif
    if (arg == nullptr)
        return ATAP_EFAILED;

    opts.out_size = out_size<R>::value;
    opts.out_free = nullptr;
    opts.arg_free = &destroy<C>;
    atap_fn *fn = &trampoline<Fn, R>;
    if (name) {
        (void)atap_trace_name(fn, name);
    } else {
        static const int named = atap_trace_name(fn, type_name<Fn>()); /* once per type */
        (void)named;
    }
    atap_task raw;
    int rc = t ? atap_spawn(&raw, fn, arg, &opts) : atap_spawn_detached(fn, arg, &opts);
    if (rc != 0) {
        delete arg; /* a refused spawn leaves arg the caller's */
        return rc;
    }
    if (t) {
        t->reset(raw);
        t->out_ = arg;
    }
    return 0;
}
} // namespace detail

/*
 * Spawns f on the pool; on success t holds the handle (any handle it held
 * before is released). opts gives everything but out_size, out_free and
 * arg_free, which are this layer's. f(ctx) must return something
 * convertible to R (anything, for R = void).
 * Returns atap_spawn's code (the callable is then destroyed and t left as
 * it was), ATAP_EINVAL for an R not copied as bytes on a task that is not
 * a one-shot, or ATAP_EFAILED when f cannot be moved to the heap (no
 * memory, or its constructor threw).
 */
template <class R, class F> int spawn(task<R> &t, F &&f, atap_spawn_opts opts)
{
    return detail::spawn_as(&t, std::forward<F>(f), opts, nullptr);
}

/*
 * Spawns f on the pool with no handle (atap_spawn_detached): nothing can
 * join it, and what it returns, or an exception it throws, is dropped as
 * it ends, with the callable. opts as for spawn.
 * Returns spawn's codes (the callable is then destroyed).
 */
template <class F> int spawn_detached(F &&f, atap_spawn_opts opts = atap_spawn_opts())
{
    return detail::spawn_as<void>(nullptr, std::forward<F>(f), opts, nullptr);
}

/* spawn, its runs named name in traces (a string that outlives the task,
 * a literal say) rather than by the callable's type. */
template <class R, class F>
int spawn_named(task<R> &t, const char *name, F &&f, atap_spawn_opts opts = atap_spawn_opts())
{
    return detail::spawn_as(&t, std::forward<F>(f), opts, name);
}

/*
 * Joins every task (atap_join_all: inside a task, the members still in the
 * thread's own queues run first). out receives the results in order (bytes
 * results; any other R is copied by each task's join), rcs (may be NULL)
 * each join's code. Returns 0, or the first failure's code; rethrows the
 * first exception a member's run threw, once every member is joined.
 */
template <class R>
int join_all(const std::vector<task<R>> &tasks, std::vector<R> &out,
             std::vector<int> *rcs = nullptr)
{
    size_t n = tasks.size();
    std::vector<atap_task> raw(n);
    std::vector<int> codes(n, 0);
    int rc = 0;

    out.resize(n);
    for (size_t i = 0; i < n; i++)
        raw[i] = tasks[i].get();
    if (detail::as_bytes<R>::value) {
        rc = n ? atap_join_all(raw.data(), n, out.data(), sizeof(R), codes.data()) : 0;
    } else {
        (void)atap_join_all(raw.data(), n, nullptr, 0, codes.data()); /* every member settled */
        for (size_t i = 0; i < n; i++) {
#if ATAP_HPP_EXCEPTIONS
            try {
                codes[i] = tasks[i].join(out[i]);
            } catch (...) {
                codes[i] = ATAP_EFAILED;
            }
#else
            codes[i] = tasks[i].join(out[i]);
#endif
            if (codes[i] != 0 && rc == 0)
                rc = codes[i];
        }
    }
    if (rcs)
        *rcs = codes;
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATAP_EFAILED)
            tasks[i].rethrow();
    return rc;
}

inline int join_all(const std::vector<task<void>> &tasks, std::vector<int> *rcs = nullptr)
{
    size_t n = tasks.size();
    std::vector<atap_task> raw(n);
    std::vector<int> codes(n, 0);

    for (size_t i = 0; i < n; i++)
        raw[i] = tasks[i].get();
    int rc = n ? atap_join_all(raw.data(), n, nullptr, 0, codes.data()) : 0;
    if (rcs)
        *rcs = codes;
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATAP_EFAILED)
            tasks[i].rethrow();
    return rc;
}

/*
 * atap_join_first over tasks: *winner is the index of the first to settle.
 * With ATAP_CANCEL or ATAP_RELEASE the losers' handles are let go and their
 * task<R>s left empty; the winner's stays. Returns as atap_join_first
 * (ATAP_ENOTREADY past the timeout; nothing is touched then).
 */
template <class R>
int join_first(std::vector<task<R>> &tasks, size_t &winner,
               atap_join_policy policy = ATAP_PASS_BACK, uint64_t timeout_ns = ATAP_FOREVER)
{
    std::vector<atap_task> raw(tasks.size());
    for (size_t i = 0; i < tasks.size(); i++)
        raw[i] = tasks[i].get();
    int rc = atap_join_first(raw.data(), raw.size(), policy, timeout_ns, &winner);
    if (rc == 0 && policy != ATAP_PASS_BACK)
        for (size_t i = 0; i < tasks.size(); i++)
            if (i != winner)
                (void)tasks[i].release(); /* the runtime let it go */
    return rc;
}
template <class R, class Rep, class Period>
int join_first(std::vector<task<R>> &tasks, size_t &winner, atap_join_policy policy,
               std::chrono::duration<Rep, Period> timeout)
{
    return join_first(tasks, winner, policy, ns(timeout));
}

/*
 * Callables run as tasks and waited for together, as tbb::task_group:
 * run(f) spawns f() (no argument; its result is dropped), wait() joins
 * them all (atap_join_all: a wait inside a task first runs the members
 * still in its thread's queues) and rethrows the first exception one of
 * them threw. The destructor waits for what was not waited for (and
 * swallows what it would throw).
 */
class task_group
{
  public:
    task_group() = default;
    task_group(const task_group &) = delete;
    task_group &operator=(const task_group &) = delete;
    ~task_group()
    {
#if ATAP_HPP_EXCEPTIONS
        try {
            wait();
        } catch (...) {
        }
#else
        wait();
#endif
    }

    /* Returns atap_spawn's code (f then is not run). */
    template <class F> int run(F &&f, atap_spawn_opts opts = atap_spawn_opts())
    {
        typedef typename std::decay<F>::type Fn;
        task<void> t;
        int rc =
            detail::spawn_as(&t, no_ctx<Fn>(std::forward<F>(f)), opts, detail::type_name<Fn>());
        if (rc == 0)
            tasks_.push_back(std::move(t));
        return rc;
    }

    /* 0 when every member ran to its end, else the first failure's code
     * (ATAP_ECANCELLED if one was cancelled, ...), after rethrowing the
     * first exception a member threw. The members are let go either way:
     * the group can run more. */
    int wait()
    {
        std::vector<task<void>> members;
        members.swap(tasks_);
        return join_all(members);
    }

    /* Cancels every member not yet finished. */
    void cancel() noexcept
    {
        for (size_t i = 0; i < tasks_.size(); i++)
            (void)tasks_[i].cancel();
    }
    size_t size() const noexcept { return tasks_.size(); }

  private:
    template <class Fn> struct no_ctx {
        template <class G> explicit no_ctx(G &&g) : f(std::forward<G>(g)) {}
        void operator()(atap_ctx *) { f(); }
        Fn f;
    };
    std::vector<task<void>> tasks_;
};

/*
 * A channel of T (trivially copyable: values are copied as bytes), which
 * holds one sender and one receiver end of it (atap_chan_open's) until it
 * is destroyed or close_* is called. recv and send_task spawn the channel's
 * tasks into task<T> / task<void>.
 */
template <class T> class channel
{
    static_assert(std::is_trivially_copyable<T>::value,
                  "atap::channel<T>: values are copied as bytes");

  public:
    channel() noexcept : c_(nullptr), send_(false), recv_(false) {}
    ~channel() { close(); }
    channel(const channel &) = delete;
    channel &operator=(const channel &) = delete;

    /* capacity 0: unbounded. Returns atap_chan_open's code. */
    int open(size_t capacity = 0) noexcept
    {
        close();
        int rc = atap_chan_open(&c_, sizeof(T), capacity, nullptr);
        send_ = recv_ = rc == 0;
        return rc;
    }
    int send(const T &v) noexcept { return atap_chan_send(c_, &v); }
    int send_task(task<void> &t, const T &v, atap_spawn_opts opts = atap_spawn_opts()) noexcept
    {
        atap_task raw;
        int rc = atap_chan_spawn_send(&raw, c_, &v, &opts);
        if (rc == 0)
            t = task<void>(raw);
        return rc;
    }
    int recv(task<T> &t, atap_spawn_opts opts = atap_spawn_opts()) noexcept
    {
        atap_task raw;
        opts.out_size = sizeof(T);
        int rc = atap_chan_spawn_recv(&raw, c_, &opts);
        if (rc == 0)
            t = task<T>(raw);
        return rc;
    }
    size_t size() const noexcept { return atap_chan_len(c_); }
    /* This object's sender end goes: receivers drain, then read ATAP_ECLOSED. */
    void close_sender() noexcept
    {
        if (send_)
            atap_chan_close_sender(c_);
        send_ = false;
    }
    void close_receiver() noexcept
    {
        if (recv_)
            atap_chan_close_receiver(c_);
        recv_ = false;
    }
    void close() noexcept
    {
        close_sender();
        close_receiver();
        c_ = nullptr;
    }
    atap_chan *get() const noexcept { return c_; }

  private:
    atap_chan *c_;
    bool send_, recv_;
};

} // namespace atap

#endif

/*
 * C11 atomics with the memory order written at every call.
 *
 * Thin names for <stdatomic.h>, so each use site reads as what it is: an
 * acquire load, a release store, a relaxed counter. seq_cst appears only
 * where a protocol needs a single total order (the lost-wake handshakes in
 * pool.c and the reader/free handshake in executor.c), and each such place
 * says which.
 */
#ifndef ATAP_ATOMICS_H
#define ATAP_ATOMICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Loads and stores. */
#define ld_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define ld_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define ld_seqcst(p) atomic_load_explicit((p), memory_order_seq_cst)
#define st_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define st_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define st_seqcst(p, v) atomic_store_explicit((p), (v), memory_order_seq_cst)

/* Read-modify-writes: <op>_<order>, op one of xchg, add, sub, or, and;
 * each returns the value before. */
#define ATAP__RMW(op, p, v, o) atomic_##op##_explicit((p), (v), memory_order_##o)
#define xchg_relaxed(p, v) ATAP__RMW(exchange, p, v, relaxed)
#define xchg_acquire(p, v) ATAP__RMW(exchange, p, v, acquire)
#define xchg_release(p, v) ATAP__RMW(exchange, p, v, release)
#define xchg_acqrel(p, v) ATAP__RMW(exchange, p, v, acq_rel)
#define xchg_seqcst(p, v) ATAP__RMW(exchange, p, v, seq_cst)
#define add_relaxed(p, v) ATAP__RMW(fetch_add, p, v, relaxed)
#define add_release(p, v) ATAP__RMW(fetch_add, p, v, release)
#define add_acqrel(p, v) ATAP__RMW(fetch_add, p, v, acq_rel)
#define add_seqcst(p, v) ATAP__RMW(fetch_add, p, v, seq_cst)
#define sub_relaxed(p, v) ATAP__RMW(fetch_sub, p, v, relaxed)
#define sub_release(p, v) ATAP__RMW(fetch_sub, p, v, release)
#define sub_acqrel(p, v) ATAP__RMW(fetch_sub, p, v, acq_rel)
#define sub_seqcst(p, v) ATAP__RMW(fetch_sub, p, v, seq_cst)
#define or_relaxed(p, v) ATAP__RMW(fetch_or, p, v, relaxed)
#define or_release(p, v) ATAP__RMW(fetch_or, p, v, release)
#define or_acqrel(p, v) ATAP__RMW(fetch_or, p, v, acq_rel)
#define and_relaxed(p, v) ATAP__RMW(fetch_and, p, v, relaxed)
#define and_acqrel(p, v) ATAP__RMW(fetch_and, p, v, acq_rel)

/* Compare-and-swap: cas_<order> the strong form, casw_<order> the weak
 * one (it may fail spuriously: for loops). A failure reads *expected
 * again with the order's load part (relaxed for release, acquire for
 * acq_rel, seq_cst for seq_cst). */
#define ATAP__CAS(kind, p, e, v, s, f)                                                             \
    atomic_compare_exchange_##kind##_explicit((p), (e), (v), memory_order_##s, memory_order_##f)
#define cas_relaxed(p, e, v) ATAP__CAS(strong, p, e, v, relaxed, relaxed)
#define cas_acquire(p, e, v) ATAP__CAS(strong, p, e, v, acquire, acquire)
#define cas_release(p, e, v) ATAP__CAS(strong, p, e, v, release, relaxed)
#define cas_acqrel(p, e, v) ATAP__CAS(strong, p, e, v, acq_rel, acquire)
#define cas_seqcst(p, e, v) ATAP__CAS(strong, p, e, v, seq_cst, seq_cst)
#define casw_relaxed(p, e, v) ATAP__CAS(weak, p, e, v, relaxed, relaxed)
#define casw_acquire(p, e, v) ATAP__CAS(weak, p, e, v, acquire, acquire)
#define casw_release(p, e, v) ATAP__CAS(weak, p, e, v, release, relaxed)
#define casw_acqrel(p, e, v) ATAP__CAS(weak, p, e, v, acq_rel, acquire)
#define casw_seqcst(p, e, v) ATAP__CAS(weak, p, e, v, seq_cst, seq_cst)

/* The same on a plain field that is not _Atomic (a public struct's, or a
 * slot byte read plainly but where runs race): the compiler's builtins. */
#define ld_plain_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define ld_plain_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define st_plain_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define st_plain_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define cas_plain_relaxed(p, e, v)                                                                 \
    __atomic_compare_exchange_n((p), (e), (v), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)

/* Fences, and the one-bit flag. */
#define fence_acquire() atomic_thread_fence(memory_order_acquire)
#define fence_release() atomic_thread_fence(memory_order_release)
#define fence_seqcst() atomic_thread_fence(memory_order_seq_cst)
/* Orders for the compiler only, not the CPU (the other side's barrier
 * then covers the CPU: spawn.c's door). */
#define fence_compiler() atomic_signal_fence(memory_order_seq_cst)
#define flag_set_acquire(p) atomic_flag_test_and_set_explicit((p), memory_order_acquire)
#define flag_clear_relaxed(p) atomic_flag_clear_explicit((p), memory_order_relaxed)
#define flag_clear_release(p) atomic_flag_clear_explicit((p), memory_order_release)

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/*
 * A test-and-test-and-set lock for short critical sections that never
 * block (a few loads and stores, a small memcpy). Acquire on taking it,
 * release on letting go. A waiter spins on a plain load, then yields the
 * CPU, so a holder preempted on a busy machine gets to finish.
 */
#include <sched.h>

typedef struct atap_spin {
    _Atomic uint32_t held;
} atap_spin;

/* One round of waiting for a lock's holder: a pause for the first 64,
 * then the CPU given up each time (the holder may be preempted). */
static inline void spin_pause(unsigned *spins)
{
    if (++*spins < 64)
        cpu_relax();
    else
        sched_yield();
}

static inline void spin_lock(atap_spin *l)
{
    unsigned spins = 0;

    while (xchg_acquire(&l->held, 1) != 0)
        while (ld_relaxed(&l->held) != 0)
            spin_pause(&spins);
}

static inline void spin_unlock(atap_spin *l) { st_release(&l->held, 0); }

#endif

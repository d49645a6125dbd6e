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

#define ld_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define ld_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define ld_seqcst(p) atomic_load_explicit((p), memory_order_seq_cst)
#define st_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define st_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define st_seqcst(p, v) atomic_store_explicit((p), (v), memory_order_seq_cst)
#define add_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define sub_relaxed(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define add_seqcst(p, v) atomic_fetch_add_explicit((p), (v), memory_order_seq_cst)
#define sub_seqcst(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_seq_cst)
#define xchg_acqrel(p, v) atomic_exchange_explicit((p), (v), memory_order_acq_rel)
#define fence_seqcst() atomic_thread_fence(memory_order_seq_cst)

/* Compare-and-swap; on failure *expected is refreshed. */
#define cas_acqrel(p, e, v)                                                                        \
    atomic_compare_exchange_weak_explicit((p), (e), (v), memory_order_acq_rel, memory_order_acquire)
#define cas_release(p, e, v)                                                                       \
    atomic_compare_exchange_weak_explicit((p), (e), (v), memory_order_release, memory_order_relaxed)
#define cas_seqcst(p, e, v)                                                                        \
    atomic_compare_exchange_strong_explicit((p), (e), (v), memory_order_seq_cst,                   \
                                            memory_order_seq_cst)

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

    while (atomic_exchange_explicit(&l->held, 1, memory_order_acquire) != 0)
        while (ld_relaxed(&l->held) != 0)
            spin_pause(&spins);
}

static inline void spin_unlock(atap_spin *l) { st_release(&l->held, 0); }

#endif

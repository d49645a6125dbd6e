/*
 * wait.h on each kernel. The one contract: the kernel checks the word still
 * holds the expected value atomically with going to sleep, so a waker that
 * changes the word and then wakes can never be missed.
 */
#include "wait.h"

#include <errno.h>
#include <limits.h>
#include <time.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* The futex ops, by value (the kernel's ABI): musl's headers have no
 * linux/futex.h without the kernel headers installed. */
#ifndef FUTEX_WAIT_PRIVATE
#define FUTEX_WAIT_PRIVATE (0 | 128) /* FUTEX_WAIT | FUTEX_PRIVATE_FLAG */
#define FUTEX_WAKE_PRIVATE (1 | 128) /* FUTEX_WAKE | FUTEX_PRIVATE_FLAG */
#endif
#elif defined(__APPLE__)
/* libSystem's private but stable address wait (what libc++ uses). */
extern int __ulock_wait(uint32_t op, void *addr, uint64_t value, uint32_t timeout_us);
extern int __ulock_wake(uint32_t op, void *addr, uint64_t wake_value);
#define UL_COMPARE_AND_WAIT 1
#define ULF_WAKE_ALL 0x00000100
#define ULF_NO_ERRNO 0x01000000
#elif defined(__FreeBSD__)
#include <sys/types.h>
#include <sys/umtx.h>
#else
#error "libatap: no address wait for this platform (futex, __ulock or _umtx_op)"
#endif

uint64_t atap__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#if defined(__linux__)
bool atap__word_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    long rc;

    if (timeout_ns == 0)
        return false;
    if (timeout_ns != ATAP__FOREVER) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000u);
        ts.tv_nsec = (long)(timeout_ns % 1000000000u);
        tsp = &ts;
    }
    /* Relative timeout on CLOCK_MONOTONIC. EAGAIN (word changed) and EINTR
     * both mean "look again". */
    rc = syscall(SYS_futex, (void *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
    return !(rc == -1 && errno == ETIMEDOUT);
}

void atap__word_wake(_Atomic uint32_t *word, bool all)
{
    syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, all ? INT_MAX : 1, NULL, NULL, 0);
}
#elif defined(__APPLE__)
bool atap__word_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    uint64_t us;
    int rc;

    if (timeout_ns == 0)
        return false;
    /* 0 means forever to __ulock_wait; round a short wait up to 1 us. A
     * wait past its 32-bit range (71 minutes) is cut to it, not made
     * forever: it returns as timed out, early, and the caller looks at its
     * own deadline again (wait.h). */
    us = timeout_ns == ATAP__FOREVER ? 0 : (timeout_ns + 999) / 1000;
    if (us > UINT32_MAX)
        us = UINT32_MAX;
    rc = __ulock_wait(UL_COMPARE_AND_WAIT | ULF_NO_ERRNO, (void *)word, expected, (uint32_t)us);
    return rc != -ETIMEDOUT;
}

void atap__word_wake(_Atomic uint32_t *word, bool all)
{
    __ulock_wake(UL_COMPARE_AND_WAIT | ULF_NO_ERRNO | (all ? ULF_WAKE_ALL : 0), (void *)word, 0);
}
#elif defined(__FreeBSD__)
bool atap__word_wait(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct _umtx_time ut = {0};
    void *uaddr2 = NULL, *size = NULL;
    int rc;

    if (timeout_ns == 0)
        return false;
    if (timeout_ns != ATAP__FOREVER) {
        ut._timeout.tv_sec = (time_t)(timeout_ns / 1000000000u);
        ut._timeout.tv_nsec = (long)(timeout_ns % 1000000000u);
        ut._clockid = CLOCK_MONOTONIC;
        uaddr2 = &ut;
        size = (void *)sizeof ut;
    }
    rc = _umtx_op((void *)word, UMTX_OP_WAIT_UINT_PRIVATE, expected, size, uaddr2);
    return !(rc == -1 && errno == ETIMEDOUT);
}

void atap__word_wake(_Atomic uint32_t *word, bool all)
{
    _umtx_op((void *)word, UMTX_OP_WAKE_PRIVATE, all ? INT_MAX : 1, NULL, NULL);
}
#endif

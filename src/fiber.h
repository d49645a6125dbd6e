/*
 * Stacks a thread can switch between (fiber.c): a context switch of a few
 * instructions (x86-64 System V and AArch64, on ELF and Mach-O; ucontext
 * elsewhere), stacks mapped with a guard page, and the sanitizers told of
 * every switch (ASan's start/finish_switch_fiber, TSan's fibers), so that
 * their reports stay right on any stack.
 *
 * A fiber is a stack and the context saved on it while it does not run.
 * The thread's own stack is one too (atap__fiber_adopt): it is switched
 * away from and back to like any other, but never mapped or freed here.
 * Only the thread running a fiber, or the one that last switched away from
 * it, touches it: a fiber is never resumed on two threads, and the pool
 * resumes a fiber only on the thread it ran on.
 */
#ifndef ATAP_FIBER_H
#define ATAP_FIBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atap_fiber {
    void *sp;        /* the saved context, while it does not run */
    char *map;       /* its mapping (guard page first), NULL for a thread's own */
    size_t len;      /* the mapping's length */
    char *lo;        /* the lowest usable address of the stack */
    size_t size;     /* the usable bytes from lo up */
    void *tsan;      /* TSan's fiber, when built with TSan */
    void *asan_fake; /* ASan's fake stack while switched away */
    void *uc;        /* ucontext only: the context a start makes */
    void *chain;     /* the thread's pthread_cleanup_push chain on it */
    void *eh[2];     /* C++'s exceptions being handled on it, if any */
    unsigned vg;     /* Valgrind's id of the stack, where built with valgrind.h */
};

/* Maps a stack of `size` usable bytes (rounded up to pages) below a guard
 * page: 0, or -errno. The fiber is not started: atap__fiber_start. */
int atap__fiber_map(struct atap_fiber *f, size_t size);

/* Prepares f to run entry(arg) from the top of its stack at the next
 * switch to it, whatever it ran before, with chain as its cleanup chain
 * (atap__fiber_chain: what it has under its first frame). entry never
 * returns: it switches away for the last time. */
void atap__fiber_start(struct atap_fiber *f, void (*entry)(void *), void *arg, void *chain);

/* The running stack's pthread_cleanup_push chain (where the C library
 * keeps it per thread: a switch keeps one per stack), or NULL. */
void *atap__fiber_chain(void);

/* Frees a mapped fiber's stack (the calling thread does not run on it). */
void atap__fiber_unmap(struct atap_fiber *f);

/* Makes f stand for the calling thread's own stack, lo..lo+size. */
void atap__fiber_adopt(struct atap_fiber *f, char *lo, size_t size);

/* Saves the running context in from and runs to; returns when something
 * switches back to from, on the same thread. */
void atap__fiber_switch(struct atap_fiber *from, struct atap_fiber *to);

/* The same for a from that will never run again (its stack is freed or
 * started afresh): what the sanitizers keep of it goes. */
void atap__fiber_switch_last(struct atap_fiber *from, struct atap_fiber *to);

/* The first thing an entry does on its fiber (the sanitizers' half of the
 * switch that started it). */
void atap__fiber_entered(void);

/* The thread is about to exit (pthread_exit) on whichever stack runs:
 * the sanitizers are told it runs on its own, `own`, as they require. */
void atap__fiber_exiting(struct atap_fiber *own);

/* Gives back the whole pages of f's stack between low and high: a range
 * below the running frame of the stack (what lies there is dead). */
void atap__fiber_trim(struct atap_fiber *f, uintptr_t low, uintptr_t high);

#endif

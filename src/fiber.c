/*
 * Stacks a thread switches between (fiber.h).
 *
 * The switch saves what the ABI says a call keeps (the callee-saved
 * registers, and the floating-point control words) on the running stack,
 * stores the stack pointer in `from`, loads `to`'s and pops the same set
 * back. A stack not yet run holds a context made by hand: its return
 * address is boot, which calls entry(arg) from registers the pop fills.
 * boot's unwind information marks the end of the stack, so an unwinder
 * (a debugger, a thread's exit) stops there; the switch's own holds on
 * both sides of it (both stacks hold the same frame), so one stopped in
 * the switch sees the frames of the stack it returns to. Elsewhere, and
 * in a build with x86 shadow stacks, ucontext does the same, slower.
 * Valgrind, where its header is found, is told of every stack mapped.
 *
 * What the C library and C++ keep per thread but a stack owns is kept per
 * stack: the chain of pthread_cleanup_push handlers (a pointer in the
 * thread's record, found once by pushing two handlers and looking for
 * them; a thread that exits runs the chain of the stack it exits on, then
 * the handlers under every stack's first frame), and C++'s exceptions
 * being handled (__cxa_get_globals, when the program has a C++ runtime).
 *
 * The sanitizers are told of every switch, in the order their headers
 * ask: ASan's start_switch_fiber just before (the stack switched to, and
 * where the fake frames of the stack left are kept), its
 * finish_switch_fiber right after, on the stack switched to; TSan's
 * switch_to_fiber just before.
 */
#include "fiber.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define FIBER_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FIBER_ASAN)
#define FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(FIBER_TSAN)
#define FIBER_TSAN 1
#endif

#ifdef FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* Valgrind is told of each stack mapped (its client requests cost a few
 * instructions natively): a switch between two stacks it knows is not
 * taken for a wild stack pointer, and memcheck tracks each on its own. */
#if !defined(FIBER_ASAN) && !defined(FIBER_TSAN) && defined(__has_include) &&                      \
    !defined(ATAP_NO_VALGRIND)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define FIBER_VALGRIND 1
#endif
#endif

/* The hand-written switch returns on the stack switched to, which a shadow
 * stack (x86's CET, in a build made with -fcf-protection=return or full)
 * would fault on: such a build uses ucontext, whose switch keeps the
 * shadow stack with it. Indirect-branch tracking alone needs nothing: the
 * switch and boot are reached by a direct call and a return, and boot
 * calls entry, compiled C with its own landing pad. */
#if defined(__CET__)
#define FIBER_SHSTK ((__CET__ & 2) != 0)
#else
#define FIBER_SHSTK 0
#endif

#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(ATAP_FIBER_UCONTEXT) &&              \
    (defined(__ELF__) || defined(__APPLE__)) && !FIBER_SHSTK
#define FIBER_ASM 1
#else
#include <ucontext.h>
#endif

#ifdef FIBER_ASM
/* Saves the running context on its stack, *save = its stack pointer;
 * then runs the context at `to`. */
void atap__fiber_jump(void **save, void *to);
void atap__fiber_boot(void);

#if defined(__APPLE__)
#define ASM_SYM(x) "_" #x
#define ASM_FUNC(x) ".private_extern _" #x "\n.globl _" #x "\n.p2align 4\n_" #x ":\n"
#define ASM_END(x) ""
#else
#define ASM_SYM(x) #x
#define ASM_FUNC(x) ".globl " #x "\n.hidden " #x "\n.type " #x ", %function\n.p2align 4\n" #x ":\n"
#define ASM_END(x) ".size " #x ", .-" #x "\n"
#endif

#if defined(__x86_64__)
/* Saved, from the stack pointer up: mxcsr and the x87 control word (8
 * bytes), r15 r14 r13 r12 rbx rbp, the return address. The unwind rules
 * hold on either side of the switch: both stacks hold the same frame. */
#define CTX_WORDS 8
#define CTX_R12 4
#define CTX_R13 3
#define CTX_RET 7
// clang-format off
__asm__(".text\n"
        ASM_FUNC(atap__fiber_jump)
        "    .cfi_startproc\n"
        "    pushq %rbp\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %rbp, 0\n"
        "    pushq %rbx\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %rbx, 0\n"
        "    pushq %r12\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %r12, 0\n"
        "    pushq %r13\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %r13, 0\n"
        "    pushq %r14\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %r14, 0\n"
        "    pushq %r15\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    .cfi_rel_offset %r15, 0\n"
        "    subq $8, %rsp\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    popq %r15\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %r15\n"
        "    popq %r14\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %r14\n"
        "    popq %r13\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %r13\n"
        "    popq %r12\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %r12\n"
        "    popq %rbx\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %rbx\n"
        "    popq %rbp\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    .cfi_restore %rbp\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ASM_END(atap__fiber_jump)
        ASM_FUNC(atap__fiber_boot)
        "    .cfi_startproc\n"
        "    .cfi_undefined %rip\n"
        "    movq %r12, %rdi\n"
        "    callq *%r13\n"
        "    ud2\n"
        "    .cfi_endproc\n"
        ASM_END(atap__fiber_boot));
// clang-format on
#elif defined(__aarch64__)
/* Saved, from the stack pointer up: x19..x28, x29 x30, d8..d15, fpcr. The
 * unwind rules hold on either side of the switch, as on x86-64. */
#define CTX_WORDS 22
#define CTX_R12 0  /* x19: entry's arg */
#define CTX_R13 1  /* x20: entry */
#define CTX_RET 11 /* x30 */
// clang-format off
__asm__(".text\n"
        ASM_FUNC(atap__fiber_jump)
        "    .cfi_startproc\n"
        "    sub sp, sp, #176\n"
        "    .cfi_def_cfa_offset 176\n"
        "    stp x19, x20, [sp, #0]\n"
        "    stp x21, x22, [sp, #16]\n"
        "    stp x23, x24, [sp, #32]\n"
        "    stp x25, x26, [sp, #48]\n"
        "    stp x27, x28, [sp, #64]\n"
        "    stp x29, x30, [sp, #80]\n"
        "    stp d8, d9, [sp, #96]\n"
        "    stp d10, d11, [sp, #112]\n"
        "    stp d12, d13, [sp, #128]\n"
        "    stp d14, d15, [sp, #144]\n"
        "    .cfi_offset x19, -176\n"
        "    .cfi_offset x20, -168\n"
        "    .cfi_offset x21, -160\n"
        "    .cfi_offset x22, -152\n"
        "    .cfi_offset x23, -144\n"
        "    .cfi_offset x24, -136\n"
        "    .cfi_offset x25, -128\n"
        "    .cfi_offset x26, -120\n"
        "    .cfi_offset x27, -112\n"
        "    .cfi_offset x28, -104\n"
        "    .cfi_offset x29, -96\n"
        "    .cfi_offset x30, -88\n"
        "    .cfi_offset d8, -80\n"
        "    .cfi_offset d9, -72\n"
        "    .cfi_offset d10, -64\n"
        "    .cfi_offset d11, -56\n"
        "    .cfi_offset d12, -48\n"
        "    .cfi_offset d13, -40\n"
        "    .cfi_offset d14, -32\n"
        "    .cfi_offset d15, -24\n"
        "    mrs x2, fpcr\n"
        "    str x2, [sp, #160]\n"
        "    mov x2, sp\n"
        "    str x2, [x0]\n"
        "    mov sp, x1\n"
        "    ldr x2, [sp, #160]\n"
        "    msr fpcr, x2\n"
        "    ldp x19, x20, [sp, #0]\n"
        "    ldp x21, x22, [sp, #16]\n"
        "    ldp x23, x24, [sp, #32]\n"
        "    ldp x25, x26, [sp, #48]\n"
        "    ldp x27, x28, [sp, #64]\n"
        "    ldp x29, x30, [sp, #80]\n"
        "    ldp d8, d9, [sp, #96]\n"
        "    ldp d10, d11, [sp, #112]\n"
        "    ldp d12, d13, [sp, #128]\n"
        "    ldp d14, d15, [sp, #144]\n"
        "    add sp, sp, #176\n"
        "    .cfi_def_cfa_offset 0\n"
        "    .cfi_restore x19\n"
        "    .cfi_restore x20\n"
        "    .cfi_restore x21\n"
        "    .cfi_restore x22\n"
        "    .cfi_restore x23\n"
        "    .cfi_restore x24\n"
        "    .cfi_restore x25\n"
        "    .cfi_restore x26\n"
        "    .cfi_restore x27\n"
        "    .cfi_restore x28\n"
        "    .cfi_restore x29\n"
        "    .cfi_restore x30\n"
        "    .cfi_restore d8\n"
        "    .cfi_restore d9\n"
        "    .cfi_restore d10\n"
        "    .cfi_restore d11\n"
        "    .cfi_restore d12\n"
        "    .cfi_restore d13\n"
        "    .cfi_restore d14\n"
        "    .cfi_restore d15\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ASM_END(atap__fiber_jump)
        ASM_FUNC(atap__fiber_boot)
        "    .cfi_startproc\n"
        "    .cfi_undefined x30\n"
        "    mov x0, x19\n"
        "    blr x20\n"
        "    brk #0\n"
        "    .cfi_endproc\n"
        ASM_END(atap__fiber_boot));
// clang-format on
#endif
#endif /* FIBER_ASM */

/* ---- what a stack owns of the thread's state ------------------------------ */

#include <pthread.h>

/* Where the thread's record (at pthread_self()) keeps the head of the
 * chain, in words, or -1: found once, by pushing two handlers and looking
 * for the word that held the first, then the second. */
static long chain_at = -1;
static pthread_once_t chain_once = PTHREAD_ONCE_INIT;

#if defined(__GLIBC__)
enum { CHAIN_LOOK = 1024 / sizeof(void *) }; /* where to look: the record's first part */
#if defined(__EXCEPTIONS)
/* glibc's C cleanup handlers, which pthread.h declares only for code built
 * without -fexceptions: the chain is the thread's either way. */
extern void __pthread_register_cancel(__pthread_unwind_buf_t *buf) __cleanup_fct_attribute;
extern void __pthread_unregister_cancel(__pthread_unwind_buf_t *buf) __cleanup_fct_attribute;
#endif

/* glibc's chain, by the calls its pthread_cleanup_push makes without
 * -fexceptions, whatever this file is built with (with it, the macro
 * links nothing into the chain). */
static void find_chain(void)
{
    __pthread_unwind_buf_t a, b;
    void **self = (void **)pthread_self();
    long found = -1;

    __pthread_register_cancel(&a);
    for (long i = 0; i < CHAIN_LOOK && found < 0; i++)
        if (self[i] == (void *)&a) {
            __pthread_register_cancel(&b);
            if (self[i] == (void *)&b)
                found = i;
            __pthread_unregister_cancel(&b);
        }
    __pthread_unregister_cancel(&a);
    chain_at = found;
}
#else
/* Elsewhere (musl, macOS, the BSDs) pthread_cleanup_push links a record
 * in the caller's frame into a list whose head the thread's record holds:
 * the head is the one word of the record's first part that changes at each
 * push, each time to an address in this frame. Only the first 256 bytes
 * are looked at: no more is sure to be mapped (musl may keep its main
 * thread's record in a small static). */
enum { CHAIN_LOOK = 256 / sizeof(void *) };

static void chain_none(void *arg) { (void)arg; }

static bool in_frame(const void *p, const void *here)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)here;

    return (a > b ? a - b : b - a) < 4096;
}

static void find_chain(void)
{
    void *volatile *self = (void *volatile *)pthread_self();
    void *before[CHAIN_LOOK], *one[CHAIN_LOOK];
    long found = -1;
    int here;

    for (long i = 0; i < CHAIN_LOOK; i++)
        before[i] = self[i];
    pthread_cleanup_push(chain_none, NULL);
    for (long i = 0; i < CHAIN_LOOK; i++)
        one[i] = self[i];
    pthread_cleanup_push(chain_none, NULL);
    for (long i = 0; i < CHAIN_LOOK && found < 0; i++)
        if (one[i] != before[i] && self[i] != one[i] && in_frame(one[i], &here) &&
            in_frame(self[i], &here))
            found = i;
    pthread_cleanup_pop(0);
    pthread_cleanup_pop(0);
    chain_at = found;
}
#endif

void *atap__fiber_chain(void)
{
    pthread_once(&chain_once, find_chain);
    return chain_at < 0 ? NULL : ((void **)pthread_self())[chain_at];
}

static inline void chain_swap(struct atap_fiber *from, struct atap_fiber *to)
{
    if (chain_at >= 0) {
        void **head = (void **)pthread_self() + chain_at;

        from->chain = *head;
        *head = to->chain;
    }
}

/* C++'s per-thread record of exceptions being handled (libsupc++ and
 * libc++abi: the caught list, then the uncaught count), if linked in. */
extern void *__cxa_get_globals(void) __attribute__((weak));

static inline void eh_swap(struct atap_fiber *from, struct atap_fiber *to)
{
    if (__cxa_get_globals) {
        void **g = __cxa_get_globals();

        memcpy(from->eh, g, sizeof from->eh);
        memcpy(g, to->eh, sizeof to->eh);
    }
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);

    return p > 0 ? (size_t)p : 4096;
}

int atap__fiber_map(struct atap_fiber *f, size_t size)
{
    size_t page = page_size(), usable;
    char *m;
    int flags = MAP_PRIVATE | MAP_ANON;

#ifdef MAP_NORESERVE
    flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
    flags |= MAP_STACK;
#endif
    if (size > SIZE_MAX / 2)
        return -ENOMEM;
    usable = (size + page - 1) / page * page;
    m = mmap(NULL, usable + page, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (m == MAP_FAILED)
        return -errno;
    if (mprotect(m, page, PROT_NONE) != 0) { /* the guard: an overflow faults */
        int e = errno;

        munmap(m, usable + page);
        return -e;
    }
    memset(f, 0, sizeof *f);
    f->map = m;
    f->len = usable + page;
    f->lo = m + page;
    f->size = usable;
#ifdef FIBER_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
#ifdef FIBER_VALGRIND
    f->vg = VALGRIND_STACK_REGISTER(f->lo, f->lo + f->size);
#endif
    return 0;
}

void atap__fiber_unmap(struct atap_fiber *f)
{
    if (!f->map)
        return;
#ifdef FIBER_TSAN
    if (f->tsan)
        __tsan_destroy_fiber(f->tsan);
#endif
#ifdef FIBER_ASAN
    /* Frames left on it never returned: their redzones would stay
     * poisoned for whatever is mapped here next. */
    __asan_unpoison_memory_region(f->lo, f->size);
#endif
#ifdef FIBER_VALGRIND
    VALGRIND_STACK_DEREGISTER(f->vg);
#endif
    free(f->uc);
    munmap(f->map, f->len);
    memset(f, 0, sizeof *f);
}

void atap__fiber_adopt(struct atap_fiber *f, char *lo, size_t size)
{
    memset(f, 0, sizeof *f);
    f->lo = lo;
    f->size = size;
#ifdef FIBER_TSAN
    f->tsan = __tsan_get_current_fiber();
#endif
}

void atap__fiber_trim(struct atap_fiber *f, uintptr_t low, uintptr_t high)
{
    uintptr_t page = page_size(), lo = (uintptr_t)f->lo;

    low = (low < lo ? lo : low + page - 1) & ~(page - 1);
    high &= ~(page - 1);
    if (high <= low)
        return;
#ifdef FIBER_ASAN
    __asan_unpoison_memory_region((void *)low, high - low);
#endif
    madvise((void *)low, high - low, MADV_DONTNEED);
}

#ifdef FIBER_ASM
void atap__fiber_start(struct atap_fiber *f, void (*entry)(void *), void *arg, void *chain)
{
    /* The top, 16-aligned, less one 16-byte unit: the return into boot
     * leaves the stack pointer 16-aligned, as a call expects it to be. */
    uintptr_t top = ((uintptr_t)(f->lo + f->size) & ~(uintptr_t)15) - 16;
    void **ctx = (void **)(top - CTX_WORDS * sizeof(void *));

    memset(ctx, 0, CTX_WORDS * sizeof(void *));
#if defined(__x86_64__)
    /* The control words as a new thread starts: all exceptions masked,
     * round to nearest; x87 double extended. */
    ((uint32_t *)ctx)[0] = 0x1f80;
    ((uint16_t *)ctx)[2] = 0x037f;
#endif
    ctx[CTX_R12] = arg;
    ctx[CTX_R13] = (void *)entry;
    ctx[CTX_RET] = (void *)atap__fiber_boot;
    f->sp = ctx;
    f->chain = chain;
    memset(f->eh, 0, sizeof f->eh);
}

static inline void jump(struct atap_fiber *from, struct atap_fiber *to)
{
    atap__fiber_jump(&from->sp, to->sp);
}
#else
/* makecontext passes ints: the entry and its arg go through here, read by
 * the new context before anything else can run on this thread. */
static _Thread_local void (*start_entry)(void *);
static _Thread_local void *start_arg;

static void ucontext_boot(void)
{
    void (*entry)(void *) = start_entry;

    entry(start_arg);
    abort();
}

void atap__fiber_start(struct atap_fiber *f, void (*entry)(void *), void *arg, void *chain)
{
    ucontext_t *uc = f->uc;

    if (!uc && !(f->uc = uc = calloc(1, sizeof *uc)))
        abort(); /* a few hundred bytes; the mapping was had */
    getcontext(uc);
    uc->uc_stack.ss_sp = f->lo;
    uc->uc_stack.ss_size = f->size;
    uc->uc_link = NULL;
    makecontext(uc, ucontext_boot, 0);
    f->sp = uc;
    f->chain = chain;
    memset(f->eh, 0, sizeof f->eh);
    start_entry = entry;
    start_arg = arg;
}

static inline void jump(struct atap_fiber *from, struct atap_fiber *to)
{
    ucontext_t here; /* the context left, saved in its own frame */

    /* The frame left stays, suspended, until this context is switched
     * back to: its address is the point. */
    // cppcheck-suppress autoVariables
    from->sp = &here;
    swapcontext(&here, to->sp);
}
#endif

static void switch_fiber(struct atap_fiber *from, struct atap_fiber *to, bool last)
{
    chain_swap(from, to);
    eh_swap(from, to);
#ifdef FIBER_ASAN
    /* Leaving for the last time, no place to keep the fake frames: ASan
     * frees them (they are not left behind with the stack). */
    __sanitizer_start_switch_fiber(last ? NULL : &from->asan_fake, to->lo, to->size);
#else
    (void)last;
#endif
#ifdef FIBER_TSAN
    __tsan_switch_to_fiber(to->tsan, 0);
#endif
    jump(from, to);
#ifdef FIBER_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL);
#endif
}

void atap__fiber_switch(struct atap_fiber *from, struct atap_fiber *to)
{
    switch_fiber(from, to, false);
}

void atap__fiber_switch_last(struct atap_fiber *from, struct atap_fiber *to)
{
    switch_fiber(from, to, true);
}

void atap__fiber_exiting(struct atap_fiber *own)
{
#ifdef FIBER_TSAN
    /* TSan's pthread_exit checks that the thread is in its own context. */
    if (own && own->tsan)
        __tsan_switch_to_fiber(own->tsan, 0);
#else
    (void)own;
#endif
}

void atap__fiber_entered(void)
{
#ifdef FIBER_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
}

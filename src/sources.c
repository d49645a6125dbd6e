/*
 * Signals and path changes as sources of parks (atap_park_signal,
 * atap_park_path). park.c owns the parks and their claims; this file turns
 * what the kernel says of a signal or a file into claims on the parks
 * waiting for it.
 *
 * Each source is one fd of ours, watched one-shot on the manager's poller
 * like any parked fd and watched again after each report: a self-pipe that
 * a signal handler writes to (the handler only keeps the delivery's
 * siginfo, counts it, sets the signal's pending flag, release, and writes
 * a byte: async-signal-safe; the reader exchanges the flag, acquire, so a
 * park claimed for a signal sees what came before it), and on Linux an
 * inotify fd. With the kqueue backend (Linux with libkqueue too) a path is
 * watched by the poller itself (EVFILT_VNODE on the open file), its udata
 * naming the fd.
 *
 * What the kernel says of each delivery (its siginfo: sender, code) is
 * kept in a ring of ATAP_SIGINFO_KEPT records per signal, made by the
 * signal's first catch, and read by atap_signal_info (process.h's, here
 * beside the handler). Records are numbered as the count counts: the
 * handler takes a ticket (sig_ticket) before it counts (sig_count), writes
 * record ticket % KEPT as a seqlock (its seq 0, a release fence, the
 * fields, then its seq = ticket, release), and only then counts, so a
 * reader that saw count n finds deliveries up to n written, but for a
 * handler still running on another thread (a later ticket may count
 * first), which it waits a moment for. The reader reads seq (acquire), the
 * fields, an acquire fence, and seq again: the same ticket twice, or the
 * record was lost (overwritten by one KEPT later).
 *
 * Waiter lists are per signal number and per inotify watch (kqueue: per
 * fd), all under src_lock, a leaf lock: parks found ready are claimed
 * under it (atap__park_claim, which exactly one claimant wins) and
 * completed after it (atap__park_complete, which may take the park off its
 * list again, through its kind's leave: signal_leave, path_leave).
 *
 * A watch that fails (the kernel out of memory, say) is never left at
 * that: the source is marked deaf (src_lock), since nothing says it will be
 * reported again, and every manager tick (sources_retry) reads a deaf
 * source as if it had been reported, then watches it again, until a watch
 * holds. Nothing it holds is lost meanwhile (the pipe and inotify keep what
 * is not read, and a signal's pending flag outlives its byte): its parks
 * are resumed by their events, late by a tick at most, through the same
 * claims as ever. A park's own watch (at its join) that fails marks the
 * source deaf the same way, for the parks already waiting, and resumes
 * that park at once with ATAP_ERROR (park.c). A kqueue path watch that
 * cannot be renewed is a change lost, not a queue to read later: the
 * file's parks resume as for any lost change (claim_all_paths) and look
 * again, and their next parks watch it anew.
 */
#include "park.h"
#include "park_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* Chosen by backend, not by system: kqueue's own path watch wherever the
 * kqueue backend runs (a Linux build with libkqueue included), inotify on
 * Linux with the others. */
#if defined(ATAP_POLLER_KQUEUE) || !defined(__linux__)
#define PATHS_BY_INOTIFY 0 /* the poller's own path watches (kqueue), if any */
#else
#include "inotify_changes.h"
#define PATHS_BY_INOTIFY 1 /* an inotify fd of ours, watched like any fd */
#endif

#include "atap.h"
#include "atomics.h"
#include "faults.h"
#include "hub.h"
#include "poller.h"
#include "testing.h"

_Static_assert(ATAP_PATH_WRITE == ATAP__PATH_WRITE && ATAP_PATH_ATTRIB == ATAP__PATH_ATTRIB &&
                   ATAP_PATH_GONE == ATAP__PATH_GONE,
               "public path bits are the poller's");

/* A source's fd (-1 until first used); its address is the poller's udata.
 * deaf (src_lock): its last watch failed, so the tick reads it (see the top). */
struct source {
    int fd;
    bool deaf;
};

static pthread_mutex_t src_lock = PTHREAD_MUTEX_INITIALIZER;
static struct source sig_source = {.fd = -1}, path_source = {.fd = -1};
static struct park *sig_waiters[NSIG];
static _Atomic unsigned char sig_pending[NSIG];
/* Deliveries of each signal the handler has seen, ever (tasks/signal.c
 * counts from a snapshot of it). A lock-free atomic, so the handler may
 * add to it. */
static _Atomic uint64_t sig_count[NSIG];
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the handler's count needs lock-free 64-bit atomics");
static bool sig_caught[NSIG];
/* The handler's record of one delivery (see the top); every field an
 * atomic, so the handler, a reader and an overwrite race on none. */
struct sig_rec {
    _Atomic uint64_t seq; /* the delivery's number, 0 while written */
    _Atomic int code, pid, status, value;
    _Atomic unsigned uid, flags;
};
static _Atomic(struct sig_rec *) sig_recs[NSIG]; /* rings, made by the first catch */
static _Atomic uint64_t sig_ticket[NSIG];        /* numbers the handler took */
static int sig_pipe[2] = {-1, -1};
static _Atomic int sig_write_fd = -1; /* sig_pipe[1], for the handler */
/* Handlers (and pokes) between their look at sig_write_fd and their
 * write: atap__sources_close waits for none to be left. A lock-free
 * atomic, so the handler may count itself. */
static _Atomic unsigned sig_writers;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the handler's count needs lock-free atomics");
static struct park **wd_waiters; /* by inotify watch descriptor (kqueue: by fd) */
static size_t wdcap;
/* Some source may be deaf: set under src_lock by the watch that failed, and
 * cleared under it by the tick that then reads the deaf ones, so a deaf
 * source has it set or is being read. The tick's unlocked look at it is
 * only a filter: what is deaf is read under src_lock, and a set it misses
 * (relaxed, no order needed) it meets at the next tick. */
static _Atomic bool sources_deaf;

/* kqueue's path watch on fd reports this udata: fd + 1, no memory of ours. */
static void *vnode_udata(int fd) { return (void *)((uintptr_t)fd + 1); }

/* A byte down the signal pipe, if it is open. seq_cst, against
 * atap__sources_close: counted in, then the look at the fd; it sets the
 * fd to -1, then reads the count. Either it waits for this write or this
 * finds -1, so no byte goes to an fd that closed (and may be reused). */
static void wake_pipe(void)
{
    char b = 0;
    int fd;

    add_seqcst(&sig_writers, 1);
    fd = ld_seqcst(&sig_write_fd);
    if (fd >= 0 && write(fd, &b, 1) < 0) {
        /* full: a byte is there already */
    }
    sub_seqcst(&sig_writers, 1);
}

/* si's fields that the kernel gives for signo: the sender for a process's
 * send (kill, sigqueue, tgkill) and SIGCHLD's child, its status, and a
 * sigqueue's value. */
#ifdef SI_TKILL
#define BY_TKILL(code) ((code) == SI_TKILL) /* raise, tgkill (Linux) */
#else
#define BY_TKILL(code) false
#endif

static void rec_fill(struct sig_rec *r, int signo, const siginfo_t *si)
{
    int code = 0, pid = 0, status = 0, value = 0;
    unsigned uid = 0, flags = 0;

    if (si) {
        bool child = signo == SIGCHLD && si->si_code > 0;

        code = si->si_code;
        if (code == SI_USER || code == SI_QUEUE || BY_TKILL(code) || child) {
            pid = (int)si->si_pid;
            uid = (unsigned)si->si_uid;
            flags = ATAP_SIGINFO_SENDER;
        }
        if (child)
            status = si->si_status;
        if (code == SI_QUEUE)
            value = si->si_value.sival_int;
    }
    st_relaxed(&r->code, code);
    st_relaxed(&r->pid, pid);
    st_relaxed(&r->uid, uid);
    st_relaxed(&r->status, status);
    st_relaxed(&r->value, value);
    st_relaxed(&r->flags, flags);
}

/* The handler: this delivery's record, as a seqlock's writer (see the top). */
static void keep_info(int signo, const siginfo_t *si)
{
    uint64_t seq = add_relaxed(&sig_ticket[signo], 1) + 1;
    struct sig_rec *ring = ld_acquire(&sig_recs[signo]), *r;

    if (!ring)
        return;
    r = &ring[seq % ATAP_SIGINFO_KEPT];
    st_relaxed(&r->seq, 0);
    fence_release(); /* a reader that sees a field sees the 0 */
    rec_fill(r, signo, si);
    st_release(&r->seq, seq);
}

static void on_signal(int signo, siginfo_t *si, void *context)
{
    int saved = errno;

    (void)context;
    keep_info(signo, si);
    /* Counted after its record, before the pending flag: a reader that
     * finds no flag but a count newer than it saw (atap__signal_poke) sets
     * it again. */
    add_seqcst(&sig_count[signo], 1);
    st_release(&sig_pending[signo], 1);
    wake_pipe();
    errno = saved;
}

static int open_pipe(int fds[2])
{
#if defined(__linux__)
    return pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0 ? 0 : -errno;
#else
    if (pipe(fds) != 0)
        return -errno;
    for (int i = 0; i < 2; i++) {
        fcntl(fds[i], F_SETFD, FD_CLOEXEC);
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
    }
    return 0;
#endif
}

/* src_lock held: the source's fd exists and is watched (one-shot); or it
 * is deaf, if it exists (see the top). again: a watch renewed after a
 * report, where a fault may be injected. */
static int source_watch(struct source *f, bool again)
{
    int rc;

    if (f->fd < 0) {
        if (f == &sig_source) {
            if ((rc = open_pipe(sig_pipe)) != 0)
                return rc;
            f->fd = sig_pipe[0];
            st_release(&sig_write_fd, sig_pipe[1]); /* before any handler */
        } else {
#if PATHS_BY_INOTIFY
            if ((f->fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0)
                return -errno;
#else
            return -ENOTSUP;
#endif
        }
    }
    rc = again && FAULT_WATCH_FAILS()
             ? -ENOMEM
             : atap__poller_watch(atap__hub_poller(), f->fd, ATAP__POLL_READ, f);
    if ((f->deaf = rc != 0))
        st_relaxed(&sources_deaf, true);
    return rc;
}

/* src_lock held: nobody waits on watch wd now. */
static void path_forget(int wd)
{
#if PATHS_BY_INOTIFY
    inotify_rm_watch(path_source.fd, wd);
#else
    atap__poller_unwatch_path(atap__hub_poller(), wd);
#endif
}

/* src_lock held: wd_waiters has room for list `key` (an inotify watch, or
 * on kqueue the fd itself: grown only for an open one). 0, -EBADF or
 * -ENOMEM. */
static int wd_room(int key)
{
    size_t cap = wdcap;
    struct park **t;

    if ((size_t)key < wdcap)
        return 0;
    if (!PATHS_BY_INOTIFY && !atap__fd_open(key))
        return -EBADF;
    if (!atap__grow_cap(&cap, (size_t)key))
        return -ENOMEM;
    /* t is an array of list heads: sizeof *t is a pointer's. */
    if (!(t = realloc(wd_waiters, cap * sizeof *t))) // NOLINT(bugprone-sizeof-expression)
        return -ENOMEM;
    memset(t + wdcap, 0, (cap - wdcap) * sizeof *t); // NOLINT(bugprone-sizeof-expression)
    wd_waiters = t;
    wdcap = cap;
    return 0;
}

/* src_lock held: our handler catches signo. 0 or -errno. */
static int catch_locked(int signo)
{
    struct sigaction sa;

    if (sig_caught[signo])
        return 0;
    /* The ring before the handler: none to be had, the deliveries read as
     * lost, and the signal is caught all the same. */
    if (!ld_relaxed(&sig_recs[signo]))
        st_release(&sig_recs[signo], calloc(ATAP_SIGINFO_KEPT, sizeof(struct sig_rec)));
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signo, &sa, NULL) != 0)
        return -errno;
    sig_caught[signo] = true;
    return 0;
}

int atap__signal_catch(int signo)
{
    int rc;

    pthread_mutex_lock(&src_lock);
    rc = catch_locked(signo);
    pthread_mutex_unlock(&src_lock);
    return rc;
}

int atap__signal_release(int signo)
{
    struct sigaction sa;
    int rc = 0;

    pthread_mutex_lock(&src_lock);
    if (sig_caught[signo]) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        if (sigaction(signo, &sa, NULL) != 0)
            rc = -errno;
        else
            sig_caught[signo] = false;
    }
    pthread_mutex_unlock(&src_lock);
    return rc;
}

uint64_t atap__signal_count(int signo) { return ld_seqcst(&sig_count[signo]); }

/* A record read as a seqlock's reader (see the top): true if it held
 * delivery seq whole, into *info. */
static bool rec_read(struct sig_rec *r, uint64_t seq, atap_siginfo *info)
{
    atap_siginfo got = {.seq = seq, .signo = info->signo};

    if (ld_acquire(&r->seq) != seq)
        return false;
    got.code = ld_relaxed(&r->code);
    got.pid = ld_relaxed(&r->pid);
    got.uid = ld_relaxed(&r->uid);
    got.status = ld_relaxed(&r->status);
    got.value = ld_relaxed(&r->value);
    got.flags = ld_relaxed(&r->flags);
    fence_acquire(); /* the fields before the second look */
    if (ld_relaxed(&r->seq) != seq)
        return false;
    *info = got;
    return true;
}

int atap_signal_info(int signo, uint64_t seq, atap_siginfo *info)
{
    struct sig_rec *ring, *r;
    uint64_t at;

    if (!info || seq == 0 || !atap__signal_catchable(signo))
        return ATAP_EINVAL;
    if (seq > ld_seqcst(&sig_count[signo]))
        return ATAP_ENOTREADY;
    *info = (atap_siginfo){.seq = seq, .signo = signo, .flags = ATAP_SIGINFO_LOST};
    if (!(ring = ld_acquire(&sig_recs[signo])))
        return 0;
    r = &ring[seq % ATAP_SIGINFO_KEPT];
    /* Not there yet (0, or an older one): a handler on another thread is
     * between its ticket and its record. A moment, then lost. */
    for (unsigned tries = 0; !rec_read(r, seq, info); tries++) {
        at = ld_acquire(&r->seq);
        if ((at > seq && at != 0) || tries >= 1000)
            return 0;
        sched_yield();
    }
    return 0;
}

void atap__signal_poke(int signo)
{
    st_release(&sig_pending[signo], 1);
    wake_pipe();
}

/* src_lock held: p joins the waiters on *head. */
static void list_join(struct park **head, struct park *p)
{
    p->fd_next = *head;
    *head = p;
    p->on_fd = true;
}

/* src_lock held: p, on the waiters on *head (p->on_fd: the caller looked,
 * since a park that never joined may have no list), leaves them. True if
 * nobody waits there now. */
static bool list_leave(struct park **head, struct park *p)
{
    struct park **at = head;

    while (*at != p)
        at = &(*at)->fd_next;
    *at = p->fd_next;
    p->on_fd = false;
    return !*head;
}

/* A signal's park (its kind's join, park.c's table): the signal pipe
 * watched, the signal caught, the park on the signal's list. */
static int signal_join(struct park *p)
{
    int rc, signo = p->fd;

    pthread_mutex_lock(&src_lock);
    if ((rc = source_watch(&sig_source, false)) != 0)
        goto out;
    /* A signal that came while nobody waited for it is dropped, not kept
     * for this park (a byte of it may still be in the pipe: harmless). */
    if (!sig_waiters[signo])
        st_relaxed(&sig_pending[signo], 0);
    if ((rc = catch_locked(signo)) != 0)
        goto out;
    list_join(&sig_waiters[signo], p);
    /* A delivery since the parker last looked at the count (before this
     * park was listed, so its pending flag may have been dropped above):
     * resume as if it came now. */
    if ((p->events & ATAP__SIG_SINCE) && ((unsigned)ld_seqcst(&sig_count[signo]) &
                                          ATAP__SIG_SEEN_MASK) != (p->events & ATAP__SIG_SEEN_MASK))
        atap__signal_poke(signo);
out:
    pthread_mutex_unlock(&src_lock);
    return rc;
}

/* Its leave: off the signal's list, if still on it. */
static void signal_leave(struct park *p)
{
    pthread_mutex_lock(&src_lock);
    if (p->on_fd)
        list_leave(&sig_waiters[p->fd], p);
    pthread_mutex_unlock(&src_lock);
}

/* A path's park (its kind's join): the file watched (one inotify watch,
 * or the poller's vnode watch, shared by its waiters), the park on the
 * watch's list; p->fd becomes the list's number. */
static int path_join(struct park *p)
{
    int rc = 0, key = p->fd;

    pthread_mutex_lock(&src_lock);
#if PATHS_BY_INOTIFY
    char path[64];

    if ((rc = source_watch(&path_source, false)) != 0)
        goto out;
    snprintf(path, sizeof path, "/proc/self/fd/%d", p->fd);
    /* Every change is asked for: the waiters on one file share its
     * watch, and each picks what it wanted. */
    if ((key = inotify_add_watch(path_source.fd, path, atap__inotify_mask(~0u))) < 0) {
        rc = -errno;
        goto out;
    }
    if ((rc = wd_room(key)) != 0) {
        if ((size_t)key >= wdcap || !wd_waiters[key])
            path_forget(key);
        goto out;
    }
    p->fd = key;
#else
    if ((rc = wd_room(key)) != 0)
        goto out;
    /* Watched (again) at every join: armed while anyone waits. */
    if ((rc = atap__poller_watch_path(atap__hub_poller(), key, vnode_udata(key))) != 0)
        goto out;
#endif
    list_join(&wd_waiters[key], p);
out:
    pthread_mutex_unlock(&src_lock);
    return rc;
}

/* Its leave: off the watch's list, if still on it, and the watch with its
 * last waiter. */
static void path_leave(struct park *p)
{
    pthread_mutex_lock(&src_lock);
    if (p->on_fd && list_leave(&wd_waiters[p->fd], p))
        path_forget(p->fd); /* the last waiter on it */
    pthread_mutex_unlock(&src_lock);
}

/* src_lock held: claims every waiter on *head wanting any of `got` (all
 * when got is 0, or when `every`), moving them to *ready; each reads got. */
static void claim_list(struct park **head, unsigned got, bool every, struct park **ready)
{
    struct park *p, **at;

    /* *head is the caller's list head, set (NULL when empty). */
    // cppcheck-suppress uninitvar
    for (at = head; (p = *at) != NULL;) {
        if ((every || !got || (p->events & got)) &&
            (st_relaxed(&p->got, got), atap__park_claim(p, BY_READY) == 1)) {
            *at = p->fd_next;
            p->on_fd = false;
            p->fd_next = *ready;
            *ready = p;
        } else {
            at = &p->fd_next;
        }
    }
}

/* src_lock held: changes were lost (inotify's queue overflowed, or on
 * kqueue a manager died holding them): every path park resumes, told its
 * file may have changed in each way but GONE (never guessed), and looks
 * again; a watch nobody waits on now goes. */
static void claim_all_paths(struct park **ready)
{
    for (size_t key = 0; key < wdcap; key++) {
        if (!wd_waiters[key])
            continue;
        claim_list(&wd_waiters[key], ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES, true,
                   ready);
        if (!wd_waiters[key])
            path_forget((int)key);
    }
}

static void source_event(struct source *f)
{
    struct park *ready = NULL, *p;
    char buf[4096] __attribute__((aligned(8)));
    ssize_t n;

    TEST_HOOK(ATAP__TEST_SOURCE_READ);
    pthread_mutex_lock(&src_lock);
    while ((n = read(f->fd, buf, sizeof buf)) > 0) {
#if PATHS_BY_INOTIFY
        for (ssize_t at = 0; f == &path_source && at < n;) {
            const struct inotify_event *e = (const void *)(buf + at);
            if (e->mask & IN_Q_OVERFLOW)
                claim_all_paths(&ready);
            if (e->wd >= 0 && (size_t)e->wd < wdcap) {
                claim_list(&wd_waiters[e->wd], atap__inotify_changes(e->mask), false, &ready);
                if ((e->mask & IN_IGNORED) == 0 && !wd_waiters[e->wd])
                    path_forget(e->wd); /* nobody waits on it now */
            }
            at += (ssize_t)sizeof *e + e->len;
        }
#endif
    }
    for (int signo = 1; f == &sig_source && signo < NSIG; signo++)
        if (xchg_acquire(&sig_pending[signo], 0))
            claim_list(&sig_waiters[signo], 0, false, &ready);
    source_watch(f, true); /* one-shot: again (failed: deaf, see the top) */
    pthread_mutex_unlock(&src_lock);
    while ((p = ready) != NULL) {
        ready = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
}

/* The poller's own path watch (kqueue's EVFILT_VNODE) reported changes to
 * the file open as fd (got: ATAP__PATH_* bits). */
static void vnode_event(int fd, unsigned got)
{
    struct park *ready = NULL, *p;
#if !PATHS_BY_INOTIFY
    struct stat st;

    /* The kernel says "written" of a directory whose entries changed. */
    if ((got & ATAP__PATH_WRITE) && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
        got = (got & ~ATAP__PATH_WRITE) | ATAP_PATH_ENTRIES;
#endif
    pthread_mutex_lock(&src_lock);
    if (got && (size_t)fd < wdcap && wd_waiters[fd]) {
        claim_list(&wd_waiters[fd], got, false, &ready);
        /* One-shot: again, for those still waiting. Not renewed, the watch
         * hears nothing more: lost changes (see the top); those claimed
         * while arming leave through their parkers, the last one taking
         * the watch with it (path_leave). */
        if (wd_waiters[fd] &&
            (FAULT_WATCH_FAILS()
                 ? -ENOMEM
                 : atap__poller_watch_path(atap__hub_poller(), fd, vnode_udata(fd))) != 0) {
            claim_list(&wd_waiters[fd], ATAP_PATH_WRITE | ATAP_PATH_ATTRIB | ATAP_PATH_ENTRIES,
                       true, &ready);
        }
        if (!wd_waiters[fd])
            path_forget(fd); /* the spent watch goes with its last waiter */
    }
    pthread_mutex_unlock(&src_lock);
    while ((p = ready) != NULL) {
        ready = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
}

bool atap__source_event(void *udata, unsigned events, unsigned kind)
{
    if (kind == ATAP__WATCH_PATH) {
        vnode_event((int)((uintptr_t)udata - 1), events);
        return true;
    }
    if (udata != &sig_source && udata != &path_source)
        return false;
    source_event(udata);
    return true;
}

bool atap__source_paths(void)
{
    return PATHS_BY_INOTIFY || (atap__poller_kinds() & 1u << ATAP__WATCH_PATH);
}

/* Between two managers' lives: each source reads what it holds (a signal's
 * pending flag outlives its pipe byte, and inotify keeps what was not read)
 * and is watched again. On kqueue a vnode change is an edge, and one the
 * dead manager held is gone: every path park resumes and looks again
 * (claim_all_paths), and the watches go with their last waiters. */
static void sources_rearm(void)
{
    struct park *ready = NULL, *p;
    bool sig, path;

    pthread_mutex_lock(&src_lock);
    if (!PATHS_BY_INOTIFY)
        claim_all_paths(&ready);
    sig = sig_source.fd >= 0;
    path = path_source.fd >= 0;
    pthread_mutex_unlock(&src_lock);
    while ((p = ready) != NULL) {
        ready = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
    if (sig)
        source_event(&sig_source);
    if (path)
        source_event(&path_source);
}

/* The manager, each tick: every deaf source is read as if reported, and
 * watched again (see the top). The flag is cleared before the reads, under
 * src_lock: a read whose watch fails again sets it again. */
static void sources_retry(void)
{
    bool sig, path;

    if (!ld_relaxed(&sources_deaf))
        return;
    pthread_mutex_lock(&src_lock);
    st_relaxed(&sources_deaf, false);
    sig = sig_source.deaf;
    path = path_source.deaf;
    pthread_mutex_unlock(&src_lock);
    if (sig)
        source_event(&sig_source);
    if (path)
        source_event(&path_source);
}

/* The signal pipe and the inotify fd closed, and both sources back to
 * none (src_lock held, or the fork child's one thread). */
static void fds_close(void)
{
    for (int i = 0; i < 2; i++)
        if (sig_pipe[i] >= 0)
            close(sig_pipe[i]);
    sig_pipe[0] = sig_pipe[1] = -1;
    if (path_source.fd >= 0)
        close(path_source.fd);
    sig_source = (struct source){.fd = -1};
    path_source = (struct source){.fd = -1};
}

/* The last shutdown (runtime.c), no thread of the runtime left and no
 * park listed (all written off): the signal pipe and the inotify fd are
 * closed; the next park that needs one opens it again (source_watch). A
 * handler installed stays installed (a signal that comes meanwhile counts
 * and marks itself pending, as before any park): only its pipe goes,
 * once no handler is writing to it (wake_pipe). */
void atap__sources_close(void)
{
    unsigned spins = 0;

    pthread_mutex_lock(&src_lock);
    st_seqcst(&sig_write_fd, -1);
    while (ld_seqcst(&sig_writers) != 0)
        spin_pause(&spins);
    fds_close();
    /* The watch numbers were the inotify fd's: a new one starts afresh. */
    free(wd_waiters);
    wd_waiters = NULL;
    wdcap = 0;
    st_relaxed(&sources_deaf, false);
    pthread_mutex_unlock(&src_lock);
}

/* In a fork's child (its one thread; runtime.c): the signal pipe and the
 * inotify fd are shared with the parent (a byte the child's handler wrote
 * would wake the parent's manager): closed, and the handler's fd set to -1
 * first, so a signal now writes nowhere. The waiters are the parent's
 * tasks'. A handler installed for the parent stays installed (sig_caught
 * says so) and only marks its signal pending. The lock is taken fresh,
 * and the count of handlers writing starts at 0 (one running on another
 * thread when the fork came never counts itself out here). */
static void sources_forget(void)
{
    st_release(&sig_write_fd, -1);
    st_relaxed(&sig_writers, 0); /* a handler the fork cut short on a thread not here */
    fds_close();
    memset(sig_waiters, 0, sizeof sig_waiters);
    for (int i = 0; i < NSIG; i++) {
        st_relaxed(&sig_pending[i], 0);
        /* A handler the fork cut short on another thread took a ticket it
         * never counted: the numbers start level again. */
        st_relaxed(&sig_ticket[i], ld_relaxed(&sig_count[i]));
    }
    wd_waiters = NULL;
    wdcap = 0;
    st_relaxed(&sources_deaf, false);
    src_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

/* ---- the kinds ----------------------------------------------------------- */

/* Parks on signals and on path changes (atap_park_signal, atap_park_path:
 * park.c). Their kernel state (the signal pipe, the inotify fd, the kqueue
 * vnode watches) is this file's, one for both: its rearm, retry and forget
 * are in the signal kind's entry alone, so that each runs once for both. */
const struct park_kind atap__park_kind_signal = {
    .join = signal_join,
    .leave = signal_leave,
    .rearm = sources_rearm,
    .retry = sources_retry,
    .forget = sources_forget,
};

const struct park_kind atap__park_kind_path = {.join = path_join, .leave = path_leave};

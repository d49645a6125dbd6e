/*
 * Child processes as tasks: run (the exit status), output (stdout and
 * stderr captured together) and a started child's wait.
 *
 * The child is started by the spawning call itself, with posix_spawnp
 * (no code of ours runs between fork and exec, so a multithreaded parent
 * is safe), in a process group of its own (POSIX_SPAWN_SETPGROUP), with an
 * empty signal mask and every signal at its default disposition. A failed
 * start (no such program, a bad directory) is the call's return code, not
 * a failed task.
 *
 * A task never holds a thread while the child runs. Everything it waits
 * for (the pipe of stdin to write, the pipe of stdout and stderr to read,
 * the child's exit) is gathered in one private event fd, the mux: epoll on
 * Linux, with the child's pidfd for its exit; kqueue elsewhere, with
 * EVFILT_PROC / NOTE_EXIT. The task parks on the mux (level-triggered:
 * readable while anything in it is ready) and, at each run, writes what
 * the pipe takes, reads what there is, and reaps the child with
 * waitpid(WNOHANG) once its output is at its end. Where Linux gives no
 * pidfd (before 5.3: ENOSYS; or a seccomp filter refusing it) the exit is
 * looked for every PROC_POLL_NS instead, still parked.
 *
 * The child is reaped exactly once: by the run that sees it exit, or, when
 * the task ends without that (cancelled, timed out, failed), by the task's
 * guard (spawn_for), which kills the child's whole process group with
 * SIGKILL (a grandchild too) and then waits for the child, as the task
 * ends. c->lock keeps the two apart, and once reaped the pid is never
 * signalled again (it may be another process's by then).
 *
 * A call that fails leaves what the caller owned as it was. A child the
 * call started itself (atap_spawn_run, _output) is killed and reaped when
 * the call then fails, so none is left behind; the caller's own child
 * (atap_spawn_child_wait) is let go instead (`let_go`: never signalled or
 * reaped here). For that the task's run must not reap it before the call
 * knows it succeeded: the call holds c->lock from the task's spawn until
 * its guard is in place, and a run reaps only under c->lock.
 *
 * SIGPIPE: a write to a child that closed its stdin is done with SIGPIPE
 * blocked on the writing thread, and the pending SIGPIPE it raised is
 * taken back (sigtimedwait), so the process is never killed by it.
 *
 * Every fd made here is close-on-exec; the pipe ends the child gets are
 * dup2'd onto 0, 1, 2 in it (dup2 clears the flag on the copy).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, posix_spawn_file_actions_addchdir_np */
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/epoll.h>
#include <sys/syscall.h>
#define MUX_EPOLL 1
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__) || \
    defined(__DragonFly__)
#include <sys/event.h>
#define MUX_KQUEUE 1
#endif

#include "../abi.h"
#include "../testing.h"
#include "atap.h"

#if defined(__APPLE__)
#include <crt_externs.h>
#define environ (*_NSGetEnviron()) /* a dylib may not name environ itself */
#else
extern char **environ;
#endif

static _Atomic bool test_no_pidfd; /* atap__test_proc_no_pidfd */

void atap__test_proc_no_pidfd(bool on)
{
    atomic_store_explicit(&test_no_pidfd, on, memory_order_relaxed);
}

#define PROC_POLL_NS ATAP_MS(10) /* no pidfd: how often the exit is looked for */
#define READ_CHUNK 65536u

struct proc {
    _Atomic int refs;     /* the task's and its guard's */
    pthread_mutex_t lock; /* pid's reaping: reaped, and the waitpids */
    pid_t pid;
    bool reaped, capture;
    bool let_go; /* the caller's child, left to the caller by a failed call */
    int status;
    int mux;    /* epoll / kqueue of the fds below; -1 if none could be had */
    int pidfd;  /* Linux: readable once the child exits; -1: polled */
    int in_fd;  /* our end of the child's stdin; -1: none or done */
    int out_fd; /* our end of its stdout + stderr; -1: none or at its end */
    unsigned char *input;
    size_t input_len, input_off;
    char *buf;
    size_t len, cap;
};

/* ---- fds ------------------------------------------------------------------ */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 ? -errno : 0;
}

/* A pipe, both ends close-on-exec. */
static int make_pipe(int fds[2])
{
#if defined(__linux__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__)
    return pipe2(fds, O_CLOEXEC) == 0 ? 0 : -errno;
#else
    if (pipe(fds) != 0)
        return -errno;
    if (fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return -e;
    }
    return 0;
#endif
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- starting a child ----------------------------------------------------- */

/* Which of the child's standard fds are pipes of ours. */
enum { PIPE_IN = 1, PIPE_OUT = 2, PIPE_ERR = 4, PIPE_MERGED = 8 /* stderr into stdout's pipe */ };

/* Starts cmd. fds[0..2]: our ends of the pipes asked for (else -1); stdin
 * that is not a pipe reads /dev/null. Returns 0 and *pid, or -errno (no
 * child left behind, no fd). */
static int start(const atap_cmd *cmd, unsigned pipes, pid_t *pid, int fds[3])
{
    int p[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    char *alone[2] = {(char *)cmd->program, NULL};
    char *const *argv = cmd->argv ? (char *const *)cmd->argv : alone;
    char *const *envp = cmd->env ? (char *const *)cmd->env : environ;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    int rc;

    fds[0] = fds[1] = fds[2] = -1;
    if (((pipes & PIPE_IN) && (rc = make_pipe(p[0])) != 0) ||
        ((pipes & PIPE_OUT) && (rc = make_pipe(p[1])) != 0) ||
        ((pipes & PIPE_ERR) && (rc = make_pipe(p[2])) != 0))
        goto out;
    if ((rc = -posix_spawn_file_actions_init(&fa)) != 0)
        goto out;
    if ((rc = -posix_spawnattr_init(&at)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        goto out;
    }
    sigemptyset(&none);
    sigfillset(&all);
    if (pipes & PIPE_IN)
        rc = -posix_spawn_file_actions_adddup2(&fa, p[0][0], 0);
    else
        rc = -posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc && (pipes & PIPE_OUT))
        rc = -posix_spawn_file_actions_adddup2(&fa, p[1][1], 1);
    if (!rc && (pipes & PIPE_MERGED))
        rc = -posix_spawn_file_actions_adddup2(&fa, p[1][1], 2);
    if (!rc && (pipes & PIPE_ERR))
        rc = -posix_spawn_file_actions_adddup2(&fa, p[2][1], 2);
    if (!rc && cmd->dir) {
#if (defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 29)) || defined(__APPLE__) ||      \
    defined(__FreeBSD__)
        rc = -posix_spawn_file_actions_addchdir_np(&fa, cmd->dir);
#else
        rc = -ENOTSUP;
#endif
    }
    if (!rc)
        rc = -posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                POSIX_SPAWN_SETSIGDEF);
    if (!rc)
        rc = -posix_spawnattr_setpgroup(&at, 0);
    if (!rc)
        rc = -posix_spawnattr_setsigmask(&at, &none);
    if (!rc)
        rc = -posix_spawnattr_setsigdefault(&at, &all);
    if (!rc)
        rc = -posix_spawnp(pid, cmd->program, &fa, &at, argv, envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
out:
    for (int i = 0; i < 3; i++) {
        int ours = i == 0 ? 1 : 0; /* stdin: we write; stdout, stderr: we read */
        close_fd(&p[i][1 - ours]);
        if (rc)
            close_fd(&p[i][ours]);
        else
            fds[i] = p[i][ours];
    }
    return rc;
}

/* Kills the child's process group and reaps the child: at once, bar the
 * moment a killed process takes to exit. Unless it was reaped already. */
static void kill_and_reap(pid_t pid)
{
    int st;

    kill(-pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
}

/* The task is over: the child, unless reaped, is killed with its group and
 * reaped. c->lock: never with the run's waitpid (the run may still be on
 * its way out of a cancelled run when the guard comes). */
static void end_child(struct proc *c)
{
    pthread_mutex_lock(&c->lock);
    if (!c->reaped && !c->let_go && c->pid > 0) {
        kill_and_reap(c->pid);
        c->reaped = true;
    }
    pthread_mutex_unlock(&c->lock);
}

/* ---- the mux -------------------------------------------------------------- */

static int pidfd_of(pid_t pid)
{
#if defined(__linux__) && defined(SYS_pidfd_open)
    if (atomic_load_explicit(&test_no_pidfd, memory_order_relaxed)) {
        errno = ENOSYS;
        return -1;
    }
    /* A pidfd is always close-on-exec. */
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

static int mux_add(struct proc *c, int fd, bool write_side)
{
#if MUX_EPOLL
    struct epoll_event ev = {.events = write_side ? EPOLLOUT : EPOLLIN, .data.fd = fd};
    return epoll_ctl(c->mux, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : -errno;
#elif MUX_KQUEUE
    struct kevent ev;
    EV_SET(&ev, (uintptr_t)fd, write_side ? EVFILT_WRITE : EVFILT_READ, EV_ADD, 0, 0, NULL);
    return kevent(c->mux, &ev, 1, NULL, 0, NULL) == 0 ? 0 : -errno;
#else
    (void)c, (void)fd, (void)write_side;
    return -ENOTSUP;
#endif
}

/* Takes fd out of the mux and closes it. */
static void mux_close(struct proc *c, int *fd)
{
#if MUX_EPOLL
    if (*fd >= 0 && c->mux >= 0)
        epoll_ctl(c->mux, EPOLL_CTL_DEL, *fd, NULL);
#endif
    (void)c; /* kqueue drops a closed fd's filters itself */
    close_fd(fd);
}

/* Sets up c's mux with its pipes and its exit. 0 or -errno. */
static int mux_open(struct proc *c)
{
    int rc;

#if MUX_EPOLL
    if ((c->mux = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return -errno;
    /* No pidfd (ENOSYS, or refused): the exit is polled, see the top. */
    if ((c->pidfd = pidfd_of(c->pid)) >= 0 && (rc = mux_add(c, c->pidfd, false)) != 0)
        return rc;
#elif MUX_KQUEUE
    struct kevent ev;

    if ((c->mux = kqueue()) < 0)
        return -errno;
    if (fcntl(c->mux, F_SETFD, FD_CLOEXEC) != 0)
        return -errno;
    EV_SET(&ev, (uintptr_t)c->pid, EVFILT_PROC, EV_ADD, NOTE_EXIT, 0, NULL);
    /* ESRCH: it has exited already, and waitpid will say so. */
    if (kevent(c->mux, &ev, 1, NULL, 0, NULL) != 0 && errno != ESRCH)
        return -errno;
    c->pidfd = c->mux; /* the exit is reported: nothing to poll */
#else
    return -ENOTSUP;
#endif
    if (c->in_fd >= 0 && ((rc = set_nonblock(c->in_fd)) != 0 || (rc = mux_add(c, c->in_fd, true))))
        return rc;
    if (c->out_fd >= 0 &&
        ((rc = set_nonblock(c->out_fd)) != 0 || (rc = mux_add(c, c->out_fd, false))))
        return rc;
    return 0;
}

/* kqueue keeps an event until it is read: read them, so the mux is
 * readable only for what is still to come (the pipes' filters are
 * level-triggered and come back while they hold). */
static void mux_drain(struct proc *c)
{
#if MUX_KQUEUE
    struct kevent evs[8];
    struct timespec zero = {0, 0};

    while (kevent(c->mux, NULL, 0, evs, 8, &zero) == 8) {
    }
#else
    (void)c;
#endif
}

static void proc_unref(struct proc *c)
{
    /* acq_rel: the last one out sees all the other did with c */
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    mux_close(c, &c->in_fd);
    mux_close(c, &c->out_fd);
    if (c->pidfd != c->mux)
        close_fd(&c->pidfd);
    close_fd(&c->mux);
    free(c->input);
    free(c->buf);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The task's arg_free, and its guard's (see spawn_for). */
static void proc_free(void *arg)
{
    struct proc *c = arg;

    end_child(c);
    proc_unref(c);
}

/* ---- a run ---------------------------------------------------------------- */

/* Writes what the stdin pipe takes; closes it once all is written or the
 * child closed its end. */
static void feed(struct proc *c)
{
    sigset_t pipe_set, old, pending;
    int sig;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    while (c->input_off < c->input_len) {
        ssize_t n = write(c->in_fd, c->input + c->input_off, c->input_len - c->input_off);
        if (n > 0) {
            c->input_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            /* the SIGPIPE it raised, pending while blocked: taken back
             * (sigpending and sigwait, which macOS has, unlike
             * sigtimedwait) */
            if (n < 0 && errno == EPIPE && sigpending(&pending) == 0 &&
                sigismember(&pending, SIGPIPE))
                sigwait(&pipe_set, &sig);
            if (n < 0 && errno == EAGAIN)
                break;
            c->input_off = c->input_len; /* the child will read no more */
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (c->input_off == c->input_len)
        mux_close(c, &c->in_fd);
}

/* Reads what the output pipe holds; closes it at its end. 0 or -ENOMEM. */
static int drain(struct proc *c)
{
    for (;;) {
        ssize_t n;

        if (c->cap - c->len < READ_CHUNK + 1) {
            size_t cap = c->cap ? c->cap * 2 : READ_CHUNK * 2;
            char *b;
            if (cap < c->cap || !(b = realloc(c->buf, cap)))
                return -ENOMEM;
            c->buf = b;
            c->cap = cap;
        }
        n = read(c->out_fd, c->buf + c->len, READ_CHUNK);
        if (n > 0) {
            c->len += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            return 0;
        } else {
            mux_close(c, &c->out_fd); /* the end (or an error: the end too) */
            return 0;
        }
    }
}

/* The common run: feed stdin, collect output, reap once output ended.
 * Returns 1 once reaped, 0 to park, or -errno. */
static int step(struct proc *c)
{
    int st;
    pid_t r;

    mux_drain(c);
    if (c->in_fd >= 0)
        feed(c);
    if (c->out_fd >= 0) {
        int rc = drain(c);
        if (rc)
            return rc;
    }
    if (c->out_fd >= 0)
        return 0;
    pthread_mutex_lock(&c->lock);
    if (c->reaped || c->let_go) {
        r = -1; /* by the guard, or the call failed: this run was cancelled */
        errno = ECHILD;
    } else {
        while ((r = waitpid(c->pid, &st, WNOHANG)) < 0 && errno == EINTR) {
        }
        if (r == c->pid) {
            c->reaped = true;
            c->status = st;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (r == c->pid)
        return 1;
    return r < 0 ? -errno : 0;
}

static int park(atap_ctx *ctx, struct proc *c)
{
    /* Without a pidfd only the pipes can wake us: once they are done, look
     * for the exit every PROC_POLL_NS. */
    uint64_t t = c->pidfd < 0 && c->out_fd < 0 ? PROC_POLL_NS : ATAP_FOREVER;

    return atap_park_fd(ctx, c->mux, ATAP_READABLE, t) == 0 ? ATAP_PARKED : ATAP_EFAILED;
}

static int status_run(atap_ctx *ctx, void *arg, void *out)
{
    struct proc *c = arg;
    int rc = step(c);

    if (rc < 0)
        return ATAP_EFAILED;
    if (rc == 0)
        return park(ctx, c);
    memcpy(out, &c->status, sizeof c->status);
    return 0;
}

static int output_run(atap_ctx *ctx, void *arg, void *out)
{
    struct proc *c = arg;
    atap_output o;
    int rc = step(c);

    if (rc < 0)
        return ATAP_EFAILED;
    if (rc == 0)
        return park(ctx, c);
    if (!c->buf && !(c->buf = malloc(1)))
        return ATAP_EFAILED;
    c->buf[c->len] = '\0';
    o.status = c->status;
    o.data = c->buf;
    o.len = c->len;
    c->buf = NULL; /* the output's now: out_free or the taker frees it */
    c->len = c->cap = 0;
    memcpy(out, &o, sizeof o);
    return 0;
}

static void output_free(void *out)
{
    atap_output o;

    memcpy(&o, out, sizeof o);
    free(o.data);
}

/* ---- spawning ------------------------------------------------------------- */

static bool opts_ok(const atap_spawn_opts *o)
{
    return o->kind == ATAP_ONCE && !o->arg_free && !o->out_free && !o->after_ns && !o->gives &&
           !o->in_free;
}

static struct proc *proc_new(void)
{
    struct proc *c = calloc(1, sizeof *c);

    if (!c)
        return NULL;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->mux = c->pidfd = c->in_fd = c->out_fd = -1;
    return c;
}

static int guard_run(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return 0;
}

/* The guard (see the top of spawn_for), made before its task: c counted
 * for it. 0 or an error, c then as it was. */
static int guard_new(atap_task *g, struct proc *c, size_t out_size)
{
    int rc;

    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    if ((rc = atap_spawn_waiting(g, guard_run, c, out_size,
                                 &(atap_spawn_opts){.arg_free = proc_free})) != 0)
        atomic_fetch_sub_explicit(&c->refs, 1, memory_order_relaxed);
    return rc;
}

/* A failed call is done with c: a child it started is killed and reaped
 * with it, the caller's is left as it was. Returns rc. */
static int give_up(struct proc *c, bool callers, int rc)
{
    c->let_go = callers; /* c is nobody else's yet */
    proc_free(c);
    return rc;
}

/*
 * Spawns the task for c (its child started): c is the task's from now on,
 * or, on failure, gone, with its child killed and reaped if the call
 * started it, and left untouched if it is the caller's (callers).
 *
 * The task's arg_free runs only once its last handle is released, too late
 * for a cancel or a timeout to kill the child by. So each task has a guard:
 * a waiting task (atap_spawn_waiting) that does nothing, fed by a forward
 * from the task and held by nothing else. A forward lasts until its source
 * can publish no more, that is, the moment the task ends in any way (its
 * run's RUN goes: a cancel or a timeout takes a park down at once); the
 * guard, no giver left, is then let go, and its arg_free (proc_free, on the
 * thread that ended the task) kills and reaps the child unless the task's
 * own run reaped it. c is counted (refs) by the task and the guard.
 *
 * The caller's child: from the task's spawn until the forward is in place
 * the call holds c->lock, so no run reaps the child before the call knows
 * it succeeded (a run that comes meanwhile waits a moment: nothing here
 * waits for a run, and proc_free, which takes the lock, runs only once it
 * is let go). A failed forward sets let_go under the lock, so a run that
 * takes it next reaps nothing.
 */
static int spawn_for(atap_task *task, struct proc *c, atap_fn *fn, size_t out_size,
                     void (*out_free)(void *), atap_spawn_opts o, bool callers)
{
    atap_task g;
    int rc;

    if ((rc = mux_open(c)) != 0 || (rc = guard_new(&g, c, out_size)) != 0)
        return give_up(c, callers, rc);
    o.out_size = out_size;
    o.out_free = out_free;
    o.arg_free = proc_free;
    if (callers)
        pthread_mutex_lock(&c->lock);
    if ((rc = atap_spawn(task, fn, c, &o)) != 0) {
        if (callers) {
            c->let_go = true;
            pthread_mutex_unlock(&c->lock);
        }
        atap_release(g); /* proc_free: c's count for it */
        return give_up(c, callers, rc);
    }
    rc = atap_forward(*task, g);
    if (callers) {
        c->let_go = rc != 0;
        pthread_mutex_unlock(&c->lock);
    }
    atap_release(g); /* forwarded: the forward holds it; not: it goes now */
    if (rc != 0) {
        atap_cancel(*task);
        atap_release(*task); /* its arg_free kills and reaps a child of ours */
        *task = ATAP_NO_TASK;
    }
    return rc;
}

static int spawn_cmd(atap_task *task, const atap_cmd *caller, const atap_spawn_opts *opts,
                     bool capture)
{
    atap_spawn_opts o;
    atap_cmd copy;
    const atap_cmd *cmd = &copy;
    struct proc *c;
    int fds[3], rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (!caller || atap__struct_in(&copy, sizeof copy, caller, ATAP__CMD_FIRST) != 0)
        return ATAP_EINVAL;
    if (!cmd->program || (cmd->input_len && !cmd->input) || !opts_ok(&o) ||
        (o.out_size && o.out_size != (capture ? sizeof(atap_output) : sizeof(int))))
        return ATAP_EINVAL;
    if (!atap_initialised())
        return ATAP_ENOTINIT;
    if (!(c = proc_new()))
        return -ENOMEM;
    if (cmd->input && cmd->input_len) {
        if (!(c->input = malloc(cmd->input_len))) {
            free(c);
            return -ENOMEM;
        }
        memcpy(c->input, cmd->input, cmd->input_len);
        c->input_len = cmd->input_len;
    }
    rc = start(cmd, (cmd->input ? PIPE_IN : 0) | (capture ? PIPE_OUT | PIPE_MERGED : 0), &c->pid,
               fds);
    if (rc) {
        free(c->input);
        free(c);
        return rc;
    }
    c->in_fd = fds[0];
    c->out_fd = fds[1];
    c->capture = capture;
    if (capture)
        return spawn_for(task, c, output_run, sizeof(atap_output), output_free, o, false);
    return spawn_for(task, c, status_run, sizeof(int), NULL, o, false);
}

int atap_spawn_run(atap_task *task, const atap_cmd *cmd, const atap_spawn_opts *opts)
{
    return spawn_cmd(task, cmd, opts, false);
}

int atap_spawn_output(atap_task *task, const atap_cmd *cmd, const atap_spawn_opts *opts)
{
    return spawn_cmd(task, cmd, opts, true);
}

int atap_child_start(atap_child *child, const atap_cmd *caller)
{
    atap_cmd copy;
    const atap_cmd *cmd = &copy;
    pid_t pid;
    int fds[3], rc;

    if (!child)
        return ATAP_EINVAL;
    child->pid = -1;
    child->in_fd = child->out_fd = child->err_fd = -1;
    if (!caller || atap__struct_in(&copy, sizeof copy, caller, ATAP__CMD_FIRST) != 0)
        return ATAP_EINVAL;
    if (!cmd->program || cmd->input || cmd->input_len)
        return ATAP_EINVAL;
    if ((rc = start(cmd, PIPE_IN | PIPE_OUT | PIPE_ERR, &pid, fds)) != 0)
        return rc;
    for (int i = 0; i < 3; i++) {
        if ((rc = set_nonblock(fds[i])) != 0) {
            kill_and_reap(pid);
            for (int j = 0; j < 3; j++)
                close(fds[j]);
            return rc;
        }
    }
    child->pid = pid;
    child->in_fd = fds[0];
    child->out_fd = fds[1];
    child->err_fd = fds[2];
    return 0;
}

int atap_spawn_child_wait(atap_task *task, int pid, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    siginfo_t si;
    struct proc *c;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (pid <= 0 || !opts_ok(&o) || (o.out_size && o.out_size != sizeof(int)))
        return ATAP_EINVAL;
    if (!atap_initialised())
        return ATAP_ENOTINIT;
    /* Our child, not reaped yet: looked at, left as it is. */
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return -errno;
    if (!(c = proc_new()))
        return -ENOMEM;
    c->pid = pid;
    return spawn_for(task, c, status_run, sizeof(int), NULL, o, true);
}

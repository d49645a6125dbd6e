/*
 * Child processes as tasks: run (the exit status), output (stdout and
 * stderr captured), piped (the child's pipes the caller's streams), a
 * started child's wait; closing a piped stdin and the kill of a task's
 * child. Starting a child (its streams, environment and directory) is
 * process_start.c's, ending it process_kill.c's; process_int.h has the
 * record (struct proc) the three share.
 *
 * A failed start (no such program, a bad directory, a file that cannot be
 * opened) is the call's return code, not a failed task.
 *
 * A task never holds a thread while the child runs. Everything it waits
 * for (the pipe of stdin to write, the pipe of output to read, the
 * child's exit) is gathered in one private event fd, the mux: epoll on
 * Linux, with the child's pidfd for its exit; kqueue elsewhere, with
 * EVFILT_PROC / NOTE_EXIT. The task parks on the mux (level-triggered:
 * readable while anything in it is ready) and, at each run, writes what
 * the pipe takes, reads what there is, and reaps the child with
 * waitpid(WNOHANG) once its output is at its end. Where Linux gives no
 * pidfd (before 5.3: ENOSYS; or a seccomp filter refusing it) the exit is
 * looked for every PROC_POLL_NS instead, still parked. A piped task's
 * pipes are not in the mux: they are the caller's streams (c->pipes),
 * kept open until the task's last handle goes (task_free).
 *
 * The child is reaped exactly once: by the run that sees it exit, or, when
 * the task ends without that (cancelled, timed out, failed), by the task's
 * guard (spawn_for), which kills the child's whole process group with
 * SIGKILL (a grandchild too) and then waits for the child, as the task
 * ends, or, with a grace, hands it to a killer task that reaps it. c->lock
 * keeps them apart, and once reaped the pid is never signalled again (it
 * may be another process's by then).
 *
 * A grace (cmd->kill_grace_ns, atap_process_kill): SIGTERM to the group,
 * SIGKILL after it, kept by a killer task: process_kill.c, which also has
 * the reaping and the killing at once.
 *
 * A call that fails leaves what the caller owned as it was. A child the
 * call started itself (atap_spawn_run, _output, _piped) is killed and
 * reaped when the call then fails, so none is left behind; the caller's
 * own child (atap_spawn_child_wait) is let go instead (`let_go`: never
 * signalled or reaped here). For that the task's run must not reap it
 * before the call knows it succeeded: the call holds c->lock from the
 * task's spawn until its guard is in place, and a run reaps only under
 * c->lock.
 *
 * The process tasks are listed (procs, under procs_lock) by their handle's
 * id from the spawn to their task_free, so that atap_process_kill and
 * atap_process_close_stdin find a task's record by its handle. Such a call
 * first takes a handle of its own (atap_dup, which a released handle
 * fails), so the record cannot go (task_free waits for the last handle)
 * while it is used; a handle's id is never another task's, so a stale one
 * finds nothing. procs_lock and c->lock are never held together.
 *
 * SIGPIPE: a write to a child that closed its stdin is done with SIGPIPE
 * blocked on the writing thread, and the pending SIGPIPE it raised is
 * taken back (sigpending and sigwait), so the process is never killed by
 * it.
 *
 * Every fd made here is close-on-exec.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
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
#include "../atomics.h"
#include "../testing.h"
#include "atap.h"
#include "process_int.h"

static _Atomic bool test_no_pidfd; /* atap__test_proc_no_pidfd */

void atap__test_proc_no_pidfd(bool on) { st_relaxed(&test_no_pidfd, on); }

#define READ_CHUNK 65536u

/* ---- fds ------------------------------------------------------------------ */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 ? -errno : 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- the mux -------------------------------------------------------------- */

static int pidfd_of(pid_t pid)
{
#if defined(__linux__) && defined(SYS_pidfd_open)
    if (ld_relaxed(&test_no_pidfd)) {
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

void atap__proc_unref(struct proc *c)
{
    /* acq_rel: the last one out sees all the other did with c */
    if (sub_acqrel(&c->refs, 1) != 1)
        return;
    mux_close(c, &c->in_fd);
    mux_close(c, &c->out_fd);
    for (int i = 0; i < 3; i++)
        close_fd(&c->pipes[i]); /* task_free closed them: for a failed call */
    if (c->pidfd != c->mux)
        close_fd(&c->pidfd);
    close_fd(&c->mux);
    free(c->input);
    free(c->buf);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- the list of process tasks -------------------------------------------- */

static pthread_mutex_t procs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct proc *procs;

static void procs_add(struct proc *c, atap_task task)
{
    pthread_mutex_lock(&procs_lock);
    c->id = task.id;
    c->prev = NULL;
    c->next = procs;
    if (procs)
        procs->prev = c;
    procs = c;
    pthread_mutex_unlock(&procs_lock);
}

/* Takes c off the list (if on it) and closes its piped streams. */
static void procs_remove(struct proc *c)
{
    pthread_mutex_lock(&procs_lock);
    if (c->id) {
        if (c->prev)
            c->prev->next = c->next;
        else
            procs = c->next;
        if (c->next)
            c->next->prev = c->prev;
        c->id = 0;
    }
    for (int i = 0; i < 3; i++)
        close_fd(&c->pipes[i]);
    pthread_mutex_unlock(&procs_lock);
}

/* procs_lock held: the record of the task named by task, or NULL. */
static struct proc *procs_find(atap_task task)
{
    for (struct proc *c = procs; task.id && c; c = c->next)
        if (c->id == task.id)
            return c;
    return NULL;
}

/* The guard's arg_free (see spawn_for). */
static void proc_free(void *arg)
{
    struct proc *c = arg;

    atap__proc_end(c);
    atap__proc_unref(c);
}

/* The task's arg_free: as its last handle goes, it is taken off the list
 * and its piped streams are closed. */
static void task_free(void *arg)
{
    struct proc *c = arg;

    procs_remove(c);
    proc_free(c);
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
    int rc;

    mux_drain(c);
    if (c->in_fd >= 0)
        feed(c);
    if (c->out_fd >= 0 && (rc = drain(c)) != 0)
        return rc;
    if (c->out_fd >= 0)
        return 0;
    pthread_mutex_lock(&c->lock);
    if (c->reaped || c->let_go || c->over)
        rc = -ECHILD; /* the guard's, or the call failed: this run was cancelled */
    else
        rc = atap__proc_try_reap(c);
    pthread_mutex_unlock(&c->lock);
    return rc;
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
    c->pipes[0] = c->pipes[1] = c->pipes[2] = -1;
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

    /* Relaxed: the caller holds a reference, so c lives; the spawn's
     * release publishes c to the guard. */
    add_relaxed(&c->refs, 1);
    if ((rc = atap_spawn_waiting(g, guard_run, c, out_size,
                                 &(atap_spawn_opts){.arg_free = proc_free})) != 0)
        sub_relaxed(&c->refs, 1);
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
    uint64_t grace = c->grace_ns;
    atap_task g;
    int rc;

    c->grace_ns = 0; /* a failed call kills at once: the grace is the task's */
    if ((rc = mux_open(c)) != 0 || (rc = guard_new(&g, c, out_size)) != 0)
        return give_up(c, callers, rc);
    o.out_size = out_size;
    o.out_free = out_free;
    o.arg_free = task_free;
    pthread_mutex_lock(&c->lock);
    if ((rc = atap_spawn(task, fn, c, &o)) != 0) {
        c->let_go = callers;
        pthread_mutex_unlock(&c->lock);
        atap_release(g); /* proc_free: c's count for it */
        return give_up(c, callers, rc);
    }
    rc = atap_forward(*task, g);
    c->let_go = callers && rc != 0;
    if (rc == 0)
        c->grace_ns = grace;
    pthread_mutex_unlock(&c->lock);
    if (rc == 0)
        procs_add(c, *task); /* taken off by task_free, at the last release */
    atap_release(g);         /* forwarded: the forward holds it; not: it goes now */
    if (rc != 0) {
        atap_cancel(*task);
        atap_release(*task); /* its arg_free kills and reaps a child of ours */
        *task = ATAP_NO_TASK;
    }
    return rc;
}

enum mode { RUN, OUTPUT, PIPED };

/* cmd->stdio with each ATAP_STDIO_DEFAULT made what mode does with it. */
static void resolve(const atap_cmd *cmd, enum mode m, atap_stdio st[3])
{
    memcpy(st, cmd->stdio, sizeof cmd->stdio);
    if (st[0].how == ATAP_STDIO_DEFAULT)
        st[0].how = m == PIPED || cmd->input ? ATAP_STDIO_PIPE : ATAP_STDIO_NULL;
    if (st[2].how == ATAP_STDIO_DEFAULT && m == OUTPUT)
        /* captured: into stdout's pipe when that is captured too */
        st[2].how = st[1].how == ATAP_STDIO_DEFAULT ? ATAP_STDIO_STDOUT : ATAP_STDIO_PIPE;
    for (int i = 1; i < 3; i++)
        if (st[i].how == ATAP_STDIO_DEFAULT)
            st[i].how = m == RUN ? ATAP_STDIO_INHERIT : ATAP_STDIO_PIPE;
}

/* The command in this library's layout (abi.h), checked for mode. 0 or
 * ATAP_EINVAL. */
static int cmd_in(atap_cmd *cmd, const atap_cmd *caller, enum mode m)
{
    if (!caller || atap__struct_in(cmd, sizeof *cmd, caller, ATAP__CMD_FIRST) != 0)
        return ATAP_EINVAL;
    if (!cmd->program || (cmd->input_len && !cmd->input) || (m == PIPED && cmd->input))
        return ATAP_EINVAL;
    return atap__proc_check(cmd, m == PIPED);
}

/* The fds of a started child made non-blocking; on failure it is killed
 * and reaped and they are closed. 0 or -errno. */
static int nonblock_or_kill(pid_t pid, int fds[3])
{
    int rc = 0;

    for (int i = 0; i < 3 && !rc; i++)
        if (fds[i] >= 0)
            rc = set_nonblock(fds[i]);
    if (rc) {
        atap__proc_kill_and_reap(pid);
        for (int i = 0; i < 3; i++)
            close_fd(&fds[i]);
    }
    return rc;
}

static int spawn_cmd(atap_task *task, atap_child *child, const atap_cmd *caller,
                     const atap_spawn_opts *opts, enum mode m)
{
    atap_spawn_opts o;
    atap_cmd cmd;
    atap_stdio st[3];
    struct proc *c;
    int fds[3], rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (cmd_in(&cmd, caller, m) != 0 || !opts_ok(&o) ||
        (o.out_size && o.out_size != (m == OUTPUT ? sizeof(atap_output) : sizeof(int))))
        return ATAP_EINVAL;
    if (!atap_initialised())
        return ATAP_ENOTINIT;
    if (!(c = proc_new()))
        return -ENOMEM;
    if (cmd.input && cmd.input_len) {
        if (!(c->input = malloc(cmd.input_len))) {
            atap__proc_unref(c);
            return -ENOMEM;
        }
        memcpy(c->input, cmd.input, cmd.input_len);
        c->input_len = cmd.input_len;
    }
    resolve(&cmd, m, st);
    if ((rc = atap__proc_start(&cmd, st, &c->pid, fds)) != 0 ||
        (m == PIPED && (rc = nonblock_or_kill(c->pid, fds)) != 0)) {
        atap__proc_unref(c);
        return rc;
    }
    c->grace_ns = cmd.kill_grace_ns;
    if (m == PIPED) {
        memcpy(c->pipes, fds, sizeof c->pipes);
        c->piped = true;
        if ((rc = spawn_for(task, c, status_run, sizeof(int), NULL, o, false)) == 0)
            *child =
                (atap_child){.pid = c->pid, .in_fd = fds[0], .out_fd = fds[1], .err_fd = fds[2]};
        return rc;
    }
    c->in_fd = fds[0];
    c->out_fd = fds[1] >= 0 ? fds[1] : fds[2]; /* what is captured, if anything */
    if (m == OUTPUT) {
        c->capture = true;
        return spawn_for(task, c, output_run, sizeof(atap_output), output_free, o, false);
    }
    return spawn_for(task, c, status_run, sizeof(int), NULL, o, false);
}

int atap_spawn_run(atap_task *task, const atap_cmd *cmd, const atap_spawn_opts *opts)
{
    return spawn_cmd(task, NULL, cmd, opts, RUN);
}

int atap_spawn_output(atap_task *task, const atap_cmd *cmd, const atap_spawn_opts *opts)
{
    return spawn_cmd(task, NULL, cmd, opts, OUTPUT);
}

int atap_spawn_piped(atap_task *task, atap_child *child, const atap_cmd *cmd,
                     const atap_spawn_opts *opts)
{
    if (!child)
        return ATAP_EINVAL;
    *child = (atap_child){.pid = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    return spawn_cmd(task, child, cmd, opts, PIPED);
}

int atap_child_start(atap_child *child, const atap_cmd *caller)
{
    atap_cmd cmd;
    atap_stdio st[3];
    pid_t pid;
    int fds[3], rc;

    if (!child)
        return ATAP_EINVAL;
    *child = (atap_child){.pid = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    if (cmd_in(&cmd, caller, PIPED) != 0)
        return ATAP_EINVAL;
    resolve(&cmd, PIPED, st);
    if ((rc = atap__proc_start(&cmd, st, &pid, fds)) != 0 || (rc = nonblock_or_kill(pid, fds)) != 0)
        return rc;
    *child = (atap_child){.pid = pid, .in_fd = fds[0], .out_fd = fds[1], .err_fd = fds[2]};
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

/* The record of the process task named by task, pinned by *pin (a handle
 * of ours: the task's arg_free, which takes the record off the list, waits
 * for the last handle) until atap_release(*pin); or NULL: no such task
 * (a released handle reads ATAP_ENOTASK even while its arg_free is still
 * to come). */
static struct proc *proc_of(atap_task task, atap_task *pin)
{
    struct proc *c;

    if (atap_dup(task, pin) != 0)
        return NULL;
    pthread_mutex_lock(&procs_lock);
    c = procs_find(task);
    pthread_mutex_unlock(&procs_lock);
    if (!c)
        atap_release(*pin);
    return c;
}

int atap_process_close_stdin(atap_task task)
{
    atap_task pin;
    struct proc *c = proc_of(task, &pin);
    int rc = 0;

    if (!c || !c->piped) {
        rc = ATAP_ENOTASK; /* none, or a process task without pipes */
    } else {
        pthread_mutex_lock(&procs_lock); /* with another close_stdin */
        if (c->pipes[0] < 0)
            rc = ATAP_EFINISHED;
        close_fd(&c->pipes[0]);
        pthread_mutex_unlock(&procs_lock);
    }
    if (c)
        atap_release(pin);
    return rc;
}

int atap_process_kill(atap_task task, uint64_t grace_ns)
{
    atap_task pin, k = ATAP_NO_TASK;
    struct proc *c = proc_of(task, &pin);
    int rc = 0;

    if (!c)
        return ATAP_ENOTASK;
    pthread_mutex_lock(&c->lock);
    if (c->reaped || c->let_go)
        rc = ATAP_EFINISHED;
    else if (grace_ns == 0 || c->killed)
        atap__proc_kill_now(c);
    else if (c->killer)
        kill(-c->pid, SIGTERM); /* the deadline stands */
    else
        rc = atap__proc_killer_start(c, grace_ns, &k);
    pthread_mutex_unlock(&c->lock);
    atap_release(k);
    atap_release(pin);
    return rc;
}

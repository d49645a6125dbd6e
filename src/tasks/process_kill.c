/*
 * Ending a child: reaping it (once, under c->lock), killing its process
 * group at once, and the grace, SIGTERM then SIGKILL, kept by a killer
 * task. process.c has the tasks that wait for a child and hand it here
 * (atap__proc_end, as a task ends; atap_process_kill); process_int.h has
 * the record they share.
 *
 * The killer (killer_run) parks on the child's pidfd (or looks every
 * PROC_POLL_NS) with the grace's deadline, and sends SIGKILL to the group
 * if the child is still there when it comes. It reaps only once the task
 * is over (c->over: the guard handed the child to it); otherwise the
 * task's own run reaps, and outputs the status. After a kill was asked
 * for (c->group_kill), whoever reaps first kills what is left of the
 * group while the child is still a zombie, whose pid keeps the group's id
 * from being reused. A killer that cannot be spawned, or that a shutdown
 * ends, kills and reaps at once. Once reaped, the pid is never signalled
 * again (it may be another process's by then).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "../atomics.h"
#include "atap.h"
#include "process_int.h"

/* Kills the child's process group and reaps the child: at once, bar the
 * moment a killed process takes to exit. Unless it was reaped already. */
void atap__proc_kill_and_reap(pid_t pid)
{
    int st;

    kill(-pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
}

/* ---- reaping and killing -------------------------------------------------- */

/* c->lock held. Reaps the child if it has exited: 1 (its status in
 * c->status), 0 while it runs, or -errno (ECHILD: someone else reaped
 * it). After a kill was asked for, what is left of the group is killed
 * first, while the child is a zombie and its pid (the group's id) still
 * ours. */
int atap__proc_try_reap(struct proc *c)
{
    siginfo_t si;
    pid_t r;
    int st;

    if (c->group_kill) {
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
            return -errno;
        if (si.si_pid == 0)
            return 0;
        kill(-c->pid, SIGKILL);
    }
    while ((r = waitpid(c->pid, &st, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == c->pid) {
        c->reaped = true;
        c->status = st;
        return 1;
    }
    return r < 0 ? -errno : 0;
}

/* c->lock held: whether the child has exited (not reaped yet). */
static bool exited(const struct proc *c)
{
    siginfo_t si;

    memset(&si, 0, sizeof si);
    return waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != 0;
}

/* c->lock held, the child not reaped: SIGKILL to its group. */
void atap__proc_kill_now(struct proc *c)
{
    kill(-c->pid, SIGKILL);
    c->killed = c->group_kill = true;
}

/* The killer's run: see the top. Once the deadline has come, SIGKILL;
 * once the child has exited, done (reaped here if the task is over). */
static int killer_run(atap_ctx *ctx, void *arg, void *out)
{
    struct proc *c = arg;
    uint64_t now = atap_now(), wait;
    bool done, killed;

    (void)out;
    pthread_mutex_lock(&c->lock);
    if (c->reaped || c->let_go)
        done = true;
    else if (c->over)
        done = atap__proc_try_reap(c) != 0; /* reaped, or not ours to reap any more */
    else
        done = exited(c); /* the task's run reaps it */
    if (!done && !c->killed && now >= c->deadline) {
        atap__proc_kill_now(c);
        done = !c->over; /* over: reaped by a later run of this */
    }
    killed = c->killed;
    if (done)
        c->killer = false;
    pthread_mutex_unlock(&c->lock);
    if (done)
        return 0;
    wait = killed ? ATAP_FOREVER : c->deadline - now;
    if (c->pidfd >= 0 && c->pidfd != c->mux)
        return atap_park_fd(ctx, c->pidfd, ATAP_READABLE, wait) == 0 ? ATAP_PARKED : ATAP_EFAILED;
    if (wait > PROC_POLL_NS)
        wait = PROC_POLL_NS;
    return atap_park_until(ctx, now + wait) == 0 ? ATAP_PARKED : ATAP_EFAILED;
}

/* The killer's arg_free: a killer ended before its work (a shutdown, a
 * failed park) kills and reaps at once what it had to. */
static void killer_free(void *arg)
{
    struct proc *c = arg;

    pthread_mutex_lock(&c->lock);
    if (c->killer) {
        c->killer = false;
        if (!c->reaped && !c->let_go) {
            atap__proc_kill_now(c);
            if (c->over) {
                atap__proc_kill_and_reap(c->pid);
                c->reaped = true;
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    atap__proc_unref(c);
}

/* c->lock held, the child not reaped, no killer: spawns one (*k, its
 * handle, released by the caller once c->lock is let go: a killer that a
 * shutdown already ended would run its arg_free in that release) with the
 * deadline grace_ns from now, then sends SIGTERM to the group. 0, or the
 * spawn's error with nothing sent. */
int atap__proc_killer_start(struct proc *c, uint64_t grace_ns, atap_task *k)
{
    uint64_t now = atap_now();
    int rc;

    /* Relaxed: the caller holds a reference, so c lives; the spawn's
     * release publishes c to the killer, which takes c->lock first thing
     * and so waits for this to end. */
    add_relaxed(&c->refs, 1);
    if ((rc = atap_spawn(k, killer_run, c, &(atap_spawn_opts){.arg_free = killer_free})) != 0) {
        sub_relaxed(&c->refs, 1);
        return rc;
    }
    c->killer = c->group_kill = true;
    c->deadline = grace_ns > UINT64_MAX - now ? UINT64_MAX : now + grace_ns;
    kill(-c->pid, SIGTERM);
    return 0;
}

/* The task is over: the child, unless reaped, is killed with its group and
 * reaped, at once or after its grace (by a killer). c->lock: never with
 * the run's waitpid (the run may still be on its way out of a cancelled
 * run when the guard comes). */
void atap__proc_end(struct proc *c)
{
    atap_task k = ATAP_NO_TASK;

    pthread_mutex_lock(&c->lock);
    if (!c->reaped && !c->let_go && c->pid > 0 && !c->over) {
        c->over = true;
        if (!c->killer &&
            (c->killed || !c->grace_ns || atap__proc_killer_start(c, c->grace_ns, &k) != 0)) {
            atap__proc_kill_and_reap(c->pid);
            c->reaped = true;
        }
    }
    pthread_mutex_unlock(&c->lock);
    atap_release(k);
}

/*
 * What process.c and process_start.c share, and no one else (callers use
 * atap.h): a child's record, and starting and ending a child.
 * process_start.c checks a command's streams and environment and starts
 * it; process.c has the tasks that feed, read and wait for it;
 * process_kill.c reaps it and kills it, at once or after a grace. Each
 * file's top comment has its rule.
 */
#ifndef ATAP_PROCESS_INT_H
#define ATAP_PROCESS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "atap.h"

#define PROC_POLL_NS ATAP_MS(10) /* no pidfd: how often the exit is looked for */

/* One child's task: its record, shared by the task, its guard, a killer
 * (refs), process.c's and process_kill.c's. */
struct proc {
    _Atomic int refs;     /* the task's, its guard's, a killer's */
    pthread_mutex_t lock; /* pid's reaping and signalling: the flags below */
    pid_t pid;
    bool reaped, capture, piped;
    bool let_go;     /* the caller's child, left to the caller by a failed call */
    bool over;       /* the task ended without reaping: a killer reaps */
    bool killer;     /* a killer task is under way */
    bool group_kill; /* a kill was asked: the group goes before the reap */
    bool killed;     /* SIGKILL sent */
    int status;
    uint64_t grace_ns;        /* a cancel's grace (cmd->kill_grace_ns) */
    uint64_t deadline;        /* the killer's: SIGKILL at (atap_now) */
    int mux;                  /* epoll / kqueue of the fds below; -1 if none could be had */
    int pidfd;                /* Linux: readable once the child exits; -1: polled */
    int in_fd;                /* our end of the child's stdin; -1: none or done */
    int out_fd;               /* our end of its captured output; -1: none or at its end */
    int pipes[3];             /* atap_spawn_piped: the caller's streams (procs_lock) */
    uint64_t id;              /* the task's handle's id, while listed */
    struct proc *prev, *next; /* procs */
    unsigned char *input;
    size_t input_len, input_off;
    char *buf;
    size_t len, cap;
};

/* process.c. Drops a count of c; the last frees it with its fds. */
void atap__proc_unref(struct proc *c);

/* process_kill.c. c->lock held. Reaps the child if it has exited: 1 (its
 * status in c->status), 0 while it runs, or -errno. */
int atap__proc_try_reap(struct proc *c);
/* process_kill.c. Kills the group of pid with SIGKILL and reaps pid. */
void atap__proc_kill_and_reap(pid_t pid);
/* process_kill.c. c->lock held, the child not reaped: SIGKILL to its group. */
void atap__proc_kill_now(struct proc *c);
/* process_kill.c. c->lock held, the child not reaped, no killer: a killer
 * for grace_ns (*k: its handle, released once c->lock is let go), and
 * SIGTERM to the group. 0, or the spawn's error with nothing sent. */
int atap__proc_killer_start(struct proc *c, uint64_t grace_ns, atap_task *k);
/* process_kill.c. The task is over: its child, unless reaped, killed with
 * its group and reaped, at once or after its grace. Takes c->lock. */
void atap__proc_end(struct proc *c);

/* process_start.c. Checks cmd->stdio and cmd->env_set; `pipes`: whether
 * ATAP_STDIO_PIPE may be asked for. 0 or ATAP_EINVAL. */
int atap__proc_check(const atap_cmd *cmd, bool pipes);

/*
 * process_start.c. Starts cmd with its streams as st says (no
 * ATAP_STDIO_DEFAULT left: the caller chose for each), in a process group
 * of its own. fds[i]: our end of stream i's pipe (the write end of
 * stdin's, the read end of the others'), close-on-exec and blocking; -1
 * for a stream that is no pipe. Returns 0 and *pid, or -errno with no
 * child started and no fd left open.
 */
int atap__proc_start(const atap_cmd *cmd, const atap_stdio st[3], pid_t *pid, int fds[3]);

#endif

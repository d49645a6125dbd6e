/*
 * libatap's built-in tasks: child processes and signals. Written on the runtime's public calls
 * alone (atap/core.h). <atap.h> includes this header; a program may
 * include it alone, with <atap/core.h>, to keep the other areas out.
 */
#ifndef ATAP_PROCESS_H
#define ATAP_PROCESS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Child processes and signals                                             */
/* ---------------------------------------------------------------------- */

/*
 * Where one of a child's standard streams goes: atap_cmd.stdio[0] (stdin),
 * [1] (stdout), [2] (stderr); `how` is one of ATAP_STDIO_* below. Files
 * and fds are opened or duplicated by the call that starts the child (a
 * path relative to the caller's working directory, not to cmd->dir), so
 * a file that cannot be opened is that call's error, no child started.
 */
typedef struct atap_stdio {
    int how;          /* ATAP_STDIO_DEFAULT...; an unknown value: ATAP_EINVAL */
    int fd;           /* ATAP_STDIO_FD: the caller's fd, copied into the child
                         (and still the caller's to close) */
    const char *path; /* ATAP_STDIO_FILE, ATAP_STDIO_APPEND: the file */
} atap_stdio;

/* atap_stdio.how. DEFAULT is what each call does with a stream left
 * alone (said at the call: atap_spawn_run inherits stdout and stderr,
 * atap_spawn_output captures them, the piped calls make pipes). */
#define ATAP_STDIO_DEFAULT 0
#define ATAP_STDIO_INHERIT 1 /* the caller's own fd 0, 1 or 2 */
#define ATAP_STDIO_NULL                                                                            \
    2 /* /dev/null: stdin reads its end at once,                                                   \
         output is thrown away */
#define ATAP_STDIO_PIPE                                                                            \
    3 /* a pipe to the caller (atap_spawn_piped,                                                   \
         atap_child_start only) */
#define ATAP_STDIO_FILE                                                                            \
    4 /* path: stdin reads it; stdout or stderr                                                    \
         writes it, created (mode 0666 less the                                                    \
         umask) or truncated */
#define ATAP_STDIO_APPEND                                                                          \
    5                       /* path, stdout or stderr only: created, or                            \
                               written at its end */
#define ATAP_STDIO_FD 6     /* fd, the caller's, open for the direction */
#define ATAP_STDIO_STDOUT 7 /* stderr only: wherever stdout goes (2>&1) */

/*
 * What to run. Strings are read during the call that starts the child and
 * are not kept (input is copied). POSIX only.
 *   program: a name without a '/' is looked up in PATH (the caller's PATH,
 *     even when env is given), as execvp does.
 *   argv: NULL-terminated, argv[0] included; NULL runs program with no
 *     arguments (argv[0] = program).
 *   dir: the child's working directory; NULL: the caller's. Set with
 *     posix_spawn_file_actions_addchdir_np, which this build uses with
 *     glibc 2.29 or later, macOS and FreeBSD; elsewhere a dir is -ENOTSUP.
 *   env: the child's whole environment, NULL-terminated "NAME=value"
 *     strings; NULL: the caller's (environ).
 *   input, input_len: bytes written to the child's stdin, which is then
 *     closed (atap_spawn_run, atap_spawn_output); input_len 0 gives an
 *     empty stdin. NULL: stdin is /dev/null (or as stdio[0] says).
 * The fields after input_len are newer than libatap 0.1's layout: they
 * are read only when size is sizeof(atap_cmd) (size 0 is 0.1's layout,
 * which ends at input_len, and leaves them all 0).
 *   stdio: where stdin, stdout and stderr go (atap_stdio); all
 *     ATAP_STDIO_DEFAULT: as each call says. A stdin other than DEFAULT
 *     with input is ATAP_EINVAL.
 *   env_set: changes made to the environment the child gets (env, or the
 *     caller's when env is NULL), in order: "NAME=value" sets NAME (in
 *     place of any value it had), "NAME" alone unsets it. NULL-terminated;
 *     NULL: none. An entry with an empty name is ATAP_EINVAL.
 *   kill_grace_ns: how a cancel, a run timeout or a failure of the task
 *     ends the child. 0: SIGKILL to its process group at once, as before.
 *     Otherwise SIGTERM to the group, then SIGKILL to it kill_grace_ns
 *     later if the child has not exited by then; once the child has
 *     exited, what is left of its group is killed at once. The grace is
 *     waited for by a task of libatap's parked on the child's exit and a
 *     timer (it holds no thread, and the cancel does not wait for it); a
 *     shutdown, or no slot for that task, kills at once.
 * The child starts in a process group of its own (its pid is the group's
 * id), with no signal blocked and every signal at its default disposition.
 * Being in its own group, it is not in a terminal's foreground group: it
 * gets no Ctrl-C of the terminal's, and a read from the terminal stops
 * it (SIGTTIN). Every fd the call opens for it is close-on-exec in this
 * process: the child gets only its stdin, stdout and stderr from libatap.
 */
typedef struct atap_cmd {
    size_t size; /* sizeof(atap_cmd), or 0: the layout of libatap 0.1 (see
                    the conventions at the top of atap/core.h) */
    const char *program;
    const char *const *argv;
    const char *dir;
    const char *const *env;
    const void *input;
    size_t input_len;
    /* after 0.1's layout: read only with size = sizeof(atap_cmd) */
    atap_stdio stdio[3];
    const char *const *env_set;
    uint64_t kill_grace_ns;
} atap_cmd;

/*
 * Starts cmd now and spawns a task that waits for it to exit, parked (it
 * holds no thread: on Linux it parks on a pidfd of the child, on kqueue
 * systems on EVFILT_PROC; where Linux refuses a pidfd, before 5.3 or under
 * a seccomp filter, it looks for the exit every 10 ms, still parked). The
 * output is an int, the child's wait status as waitpid gives it (read it
 * with WIFEXITED / WEXITSTATUS / WIFSIGNALED / WTERMSIG): a child that ran
 * and failed is not a failed task. stdout and stderr are the caller's
 * (ATAP_STDIO_DEFAULT: inherited), stdin /dev/null or input; cmd->stdio
 * may send each elsewhere, but not to a pipe (nobody would read it).
 * A cancel, a run timeout (opts->timeout_ns) or the task failing kills the
 * child's whole process group with SIGKILL (grandchildren in it too) and
 * reaps the child as the task ends, on the thread that ends it (the
 * atap_cancel caller's, the manager's for a timeout), which so waits the
 * moment a killed process takes to exit; with cmd->kill_grace_ns, SIGTERM
 * first and SIGKILL after the grace, the child reaped once it exits, by a
 * task of libatap's and not by the thread that ended this one (see
 * atap_cmd). atap_process_kill ends the child so without ending the task,
 * which then outputs its status. Releasing the handles of a task
 * still running leaves it running: it reaps the child when it exits. The
 * child is never left a zombie of this process. Each such task holds a
 * second slot (atap_pool_stats' live counts it) until it ends. The task
 * reaps its own child (waitpid on its pid): a program that reaps every
 * child itself (waitpid(-1) in a SIGCHLD handler, or SIGCHLD set to
 * SIG_IGN, which lets the kernel reap them) takes the status away, and
 * the task then fails (ATAP_EFAILED).
 * opts: kind ONCE; no after_ns, arg_free, out_free, gives or in_free;
 * out_size 0 or sizeof(int); priority and timeout_ns apply.
 * Returns 0; ATAP_EINVAL for NULL task, cmd or cmd->program, input_len
 * without input, a cmd whose size is refused (see atap/core.h's
 * conventions), a stdio entry refused (an unknown how, ATAP_STDIO_PIPE,
 * FILE or APPEND without a path, FD with a negative fd, APPEND for stdin,
 * STDOUT other than for stderr, a stdin with input), an env_set entry with
 * an empty name, or opts outside those; ATAP_ENOTINIT; -ENOENT when the
 * program is not found (in PATH, or dir does not exist), -EACCES and the
 * other errors of posix_spawnp and exec; a stdio file's open error
 * (-ENOENT, -EACCES, -EISDIR...), -EBADF for a stdio fd not open;
 * -EMFILE, -ENOMEM. On failure no child is left behind and no fd of the
 * call's is left open.
 * Blocks: while the child is started (a posix_spawnp). Threads: any.
 */
ATAP_EXPORT int atap_spawn_run(atap_task *task, const atap_cmd *cmd, const atap_spawn_opts *opts);

/* The output of atap_spawn_output: the wait status (as atap_spawn_run)
 * and everything the child wrote to stdout and stderr, interleaved as it
 * wrote them (both are one pipe), len bytes in data, NUL-terminated after
 * them. data is malloc'd: a join's copy points into the task's output and
 * is valid until the last handle is released; a take moves it to the
 * caller, who frees it with free(). */
typedef struct atap_output {
    int status;
    char *data;
    size_t len;
} atap_output;

/*
 * As atap_spawn_run, but stdout and stderr go to one pipe read by the task
 * as the child writes (parked while it has nothing to read), so a child
 * that writes a lot never blocks on a full pipe; input, if any, is written
 * as the pipe takes it, in the same parks. The task ends once the pipe is
 * at its end (every writer closed it: a grandchild that keeps it open
 * keeps the task waiting) and the child has exited. Output: atap_output.
 * The output grows in memory without a limit: no memory fails the task
 * (ATAP_EFAILED, the child killed as for a cancel). With cmd->stdio,
 * ATAP_STDIO_DEFAULT captures: stdout, and stderr too unless stdio[2]
 * says otherwise; stdout sent elsewhere, a default stderr is captured
 * alone; both elsewhere, the output's data is empty.
 * opts as atap_spawn_run (out_size 0 or sizeof(atap_output)).
 * Returns as atap_spawn_run. Blocks: as atap_spawn_run. Threads: any.
 */
ATAP_EXPORT int atap_spawn_output(atap_task *task, const atap_cmd *cmd,
                                  const atap_spawn_opts *opts);

/* A started child: its pid (also its process group's id) and our ends of
 * its three pipes, each close-on-exec and non-blocking (park on them with
 * atap_park_fd, or use atap_wait_fd), -1 for a stream that is no pipe.
 * atap_child_start's are the caller's to close; atap_spawn_piped's are
 * its task's. */
typedef struct atap_child {
    int pid;
    int in_fd;  /* write to the child's stdin; close it to send EOF */
    int out_fd; /* read the child's stdout */
    int err_fd; /* read the child's stderr */
} atap_child;

/*
 * Starts cmd with its stdin, stdout and stderr on pipes (cmd->input must be
 * NULL; cmd->stdio may send any of them elsewhere instead, its fd in
 * *child then -1). The child is the caller's: reap it with
 * atap_spawn_child_wait (a child never waited for stays a zombie once it
 * exits); signal it with atap_spawn_signal_send (its pid, or -pid for its
 * whole group). Returns 0 and *child; as atap_spawn_run otherwise
 * (ATAP_STDIO_PIPE allowed; on failure child->pid is -1 and no fd is
 * open). Blocks: as atap_spawn_run. Threads: any.
 */
ATAP_EXPORT int atap_child_start(atap_child *child, const atap_cmd *cmd);

/*
 * Spawns a task that waits, parked, for the child pid (a child of this
 * process not yet reaped; atap_child_start's, say) to exit and reaps it;
 * output: its wait status (an int). A cancel, run timeout or failure kills
 * its process group and reaps it, as atap_spawn_run. At most one wait
 * task per child. opts as atap_spawn_run. Returns 0; ATAP_EINVAL for NULL
 * task, pid <= 0 or opts outside those; -ECHILD when pid is no child of
 * ours (or already reaped); ATAP_ENOTINIT; -EMFILE, -ENOMEM. On any
 * failure the child is left as it was: not signalled, not reaped, the
 * caller's still (a later call may wait for it).
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn_child_wait(atap_task *task, int pid, const atap_spawn_opts *opts);

/*
 * Starts cmd with its stdin, stdout and stderr on pipes, as
 * atap_child_start, and spawns a task that waits for it, as
 * atap_spawn_run: output, its wait status (an int). *child gets the pid
 * and our ends of the pipes, each non-blocking and close-on-exec, -1 for
 * a stream cmd->stdio sends elsewhere (ATAP_STDIO_DEFAULT here is PIPE).
 * Read and write them while the child runs as a socket is read and
 * written: with the atap_net_* stream operations (atap_net_prep_send,
 * _sendv, _recv, _recv_exact, _recv_until, run by atap_net_spawn or
 * atap_net_step), atap_park_fd or atap_wait_fd. A child that exits
 * leaves what it wrote readable, then the end of stream (a recv of 0,
 * ATAP_ECLOSED for a recv_until or recv_exact); a write to a stdin the
 * child closed fails with -EPIPE (no SIGPIPE is raised, by the atap_net_*
 * operations; a write(2) of the caller's own raises it as ever).
 * The fds are the task's: they stay open while a handle of it is held,
 * also after the child has exited, and are closed as its last handle is
 * released (so no operation on them may still run then); close none of
 * them yourself. atap_process_close_stdin closes stdin earlier (the child
 * then reads its end). The task ends when the child exits, whatever is
 * left in the pipes; a cancel, a run timeout or a failure ends the child
 * as atap_spawn_run's (cmd->kill_grace_ns), and atap_process_kill ends it
 * leaving the task to output its status.
 * opts as atap_spawn_run. Returns as atap_spawn_run (ATAP_STDIO_PIPE
 * allowed; input refused, ATAP_EINVAL; also for NULL child); on failure
 * *child reads pid -1 and every fd -1, none left open.
 * Blocks: as atap_spawn_run. Threads: any.
 */
ATAP_EXPORT int atap_spawn_piped(atap_task *task, atap_child *child, const atap_cmd *cmd,
                                 const atap_spawn_opts *opts);

/*
 * Closes the stdin pipe of an atap_spawn_piped task now, rather than at
 * its release: the child reads the end of its input once it has read what
 * was written. Only after every operation writing to it is over (a
 * send's task joined, or released with atap_net_release). Returns 0;
 * ATAP_ENOTASK for a handle that names no task of atap_spawn_piped (one
 * released, a task of another kind); ATAP_EFINISHED when its stdin is no
 * pipe or was closed already.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_process_close_stdin(atap_task task);

/*
 * Ends the child of a process task (atap_spawn_run, _output, _piped or
 * _child_wait) without ending the task, which goes on to reap the child
 * and output its wait status: SIGTERM to the child's process group now,
 * then, if the child has not exited grace_ns later, SIGKILL to the group
 * (grace_ns 0: SIGKILL at once). Once the child has exited, what is left
 * of its group is killed as it is reaped. The grace is waited for by a
 * task of libatap's parked on the child's exit and a timer, holding no
 * thread. Called again while a grace runs, it sends SIGTERM again and
 * leaves the first deadline as it was, unless grace_ns is 0 (SIGKILL
 * now). Returns 0; ATAP_ENOTASK for a handle that names no process task;
 * ATAP_EFINISHED when the child has been reaped already (no signal is
 * sent: its pid may be another process's by now); -ENOMEM, ATAP_ENOTINIT
 * when the grace's task cannot be had (nothing is sent).
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_process_kill(atap_task task, uint64_t grace_ns);

/*
 * Signals. atap_spawn_signal_wait takes signo over (libatap's handler
 * catches it from this call on, for the rest of the process or until
 * atap_signal_release) and spawns a task that waits for it, parked.
 * Output: a uint64_t, the deliveries the handler saw since the task started
 * watching (at this call), at least 1. The kernel merges deliveries of a
 * standard signal still pending, so this counts deliveries, not sends.
 * As ATAP_REPEAT it is a handler: each run waits for at least one delivery
 * and outputs, and hands to fn (may be NULL) on the task's thread, the
 * deliveries since the previous run, so deliveries that come between runs
 * are not lost but counted by the next. fn(signo, count, fn_arg).
 * opts: out_size 0 or 8; kind ONCE or REPEAT; no arg_free, out_free,
 * gives or in_free; the rest applies (timeout_ns, every_ns, runs ...).
 * Returns 0; ATAP_EINVAL for NULL task, a signo atap_park_signal refuses
 * (out of range, SIGKILL, SIGSTOP, a fault signal, one the C library
 * keeps) or opts outside those; ATAP_ENOTINIT; -ENOMEM; -errno from
 * sigaction. Blocks: no. Threads: any.
 */
typedef void atap_signal_fn(int signo, uint64_t count, void *arg);
ATAP_EXPORT int atap_spawn_signal_wait(atap_task *task, int signo, atap_signal_fn *fn, void *fn_arg,
                                       const atap_spawn_opts *opts);

/*
 * What the kernel told of one delivery of a signal (its siginfo_t).
 * libatap's handler keeps it for the last ATAP_SIGINFO_KEPT deliveries of
 * each signal it catches (atap_signal_count, atap_park_signal or a wait
 * took it over), numbered as the count counts them: delivery n is the one
 * after which atap_signal_count read n. The sender's pid and uid are given
 * where the kernel gives them: for a signal a process sent (kill, sigqueue,
 * raise and tgkill) and for SIGCHLD (the child), not for one the kernel
 * raised itself (SIGPIPE, a timer's, SIGWINCH from a terminal...). A
 * standard signal sent again while still pending is merged by the kernel
 * into one delivery: its info is the first send's.
 */
typedef struct atap_siginfo {
    uint64_t seq;   /* which delivery of signo: 1 the first counted */
    int signo;      /* the signal */
    int code;       /* si_code: SI_USER (kill), SI_QUEUE (sigqueue),
                       SI_TKILL (raise, tgkill: Linux), or the kernel's own
                       (SI_KERNEL, CLD_EXITED for SIGCHLD...) */
    int pid;        /* si_pid: the sender's, or SIGCHLD's child's; 0
                       without ATAP_SIGINFO_SENDER */
    unsigned uid;   /* si_uid, with pid: that process's real user id */
    int status;     /* SIGCHLD (from a child): si_status, the exit status
                       (CLD_EXITED) or the signal (CLD_KILLED...); else 0 */
    int value;      /* SI_QUEUE: si_value.sival_int, sigqueue's value;
                       else 0 */
    unsigned flags; /* ATAP_SIGINFO_SENDER, ATAP_SIGINFO_LOST below */
} atap_siginfo;

/* atap_siginfo.flags: pid and uid are given; nothing is kept of this
 * delivery (ATAP_SIGINFO_KEPT more came after it before it was read, or
 * the memory for the records could not be had), only seq and signo stand. */
#define ATAP_SIGINFO_SENDER 0x1u
#define ATAP_SIGINFO_LOST 0x2u
/* How many deliveries of each signal libatap keeps the info of. */
#define ATAP_SIGINFO_KEPT 32

/* What is kept of delivery seq of signo, into *info: with
 * ATAP_SIGINFO_LOST if it is no longer kept. Returns 0; ATAP_ENOTREADY
 * when signo has not come seq times yet (since libatap caught it);
 * ATAP_EINVAL for NULL info, seq 0 or a signo atap_park_signal refuses.
 * Works with or without a runtime. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_signal_info(int signo, uint64_t seq, atap_siginfo *info);

/*
 * atap_spawn_signal_wait, a delivery at a time, with what the kernel said
 * of it: each run waits for a delivery after the last one it took (at
 * first: after this call), and outputs (and hands to fn, may be NULL, on
 * the task's thread) its atap_siginfo. As ATAP_REPEAT it is a handler
 * called once for each delivery, in order: a run takes the next one at
 * once if more came meanwhile, so none is skipped, but one that fell more
 * than ATAP_SIGINFO_KEPT behind reads as ATAP_SIGINFO_LOST.
 * fn(info, fn_arg). opts: out_size 0 or sizeof(atap_siginfo); kind ONCE or
 * REPEAT; no arg_free, out_free, gives or in_free. Returns as
 * atap_spawn_signal_wait. Blocks: no. Threads: any.
 */
typedef void atap_siginfo_fn(const atap_siginfo *info, void *arg);
ATAP_EXPORT int atap_spawn_signal_wait_info(atap_task *task, int signo, atap_siginfo_fn *fn,
                                            void *fn_arg, const atap_spawn_opts *opts);

/*
 * Spawns a task that sends signo to pid (kill(2): a pid, or -pgid for a
 * process group; signo 0 only checks the target exists); no output. The
 * task fails with the kill's error as ATAP_EFAILED; use kill(2) directly
 * to read the errno. opts: kind ONCE, no out_size, arg_free, out_free,
 * gives or in_free. Returns 0; ATAP_EINVAL for NULL task, pid 0 or -1
 * (every process: refused), a signo out of range; ATAP_ENOTINIT.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn_signal_send(atap_task *task, int pid, int signo,
                                       const atap_spawn_opts *opts);

/*
 * Gives signo back to its default disposition (SIG_DFL). A task still
 * parked waiting for it is not woken by it again (it ends at its timeout
 * or cancel); a later atap_spawn_signal_wait or atap_park_signal takes it
 * over again. Returns 0 (also when libatap never caught it); ATAP_EINVAL
 * for a signo atap_spawn_signal_wait refuses; -errno from sigaction.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_signal_release(int signo);

#ifdef __cplusplus
}
#endif

#endif /* ATAP_PROCESS_H */

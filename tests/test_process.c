/*
 * Child processes and signals as tasks (src/tasks/process.c, signal.c):
 * statuses, captured output (interleaved, large enough to fill a pipe many
 * times), input, working directory and environment, a program not found,
 * a cancel and a timeout killing a child's whole group with no zombie
 * left, many children waited on with no thread each, a started child's
 * pipes, wait and signal; signal waits, a repeat as a handler, the
 * signals refused, and release.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "test_util.h"

#define SH(script) ((const char *const[]){"sh", "-c", (script), NULL})

/* ---- helpers --------------------------------------------------------- */

/* Children of this process that are zombies now (/proc/<pid>/stat: state
 * Z, ppid ours). */
static int zombies(void)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;

    if (!d)
        return 0;
    while ((e = readdir(d)) != NULL) {
        char path[300], buf[512], *p;
        int ppid = 0;
        char st = 0;
        FILE *f;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) &&
            sscanf(p + 1, " %c %d", &st, &ppid) == 2 && st == 'Z' && ppid == getpid())
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* Whether pid is a child of ours not yet reaped (looked at, not reaped). */
static bool unreaped(pid_t pid)
{
    siginfo_t si;

    memset(&si, 0, sizeof si);
    return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
}

/* Whether pid has gone (no such process, or a zombie another reaps). */
static bool gone(pid_t pid)
{
    char path[64], buf[512], *p, st = 0;
    FILE *f;

    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return true;
    if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')))
        sscanf(p + 1, " %c", &st);
    fclose(f);
    return st == 'Z' || st == 'X';
}

static int run_status(const atap_cmd *cmd)
{
    atap_task t;
    int st = -1;

    assert_int_equal(atap_spawn_run(&t, cmd, NULL), 0);
    assert_int_equal(atap_join(t, &st, sizeof st), 0);
    atap_release(t);
    return st;
}

static atap_output run_output(const atap_cmd *cmd)
{
    atap_task t;
    atap_output o = {0};

    assert_int_equal(atap_spawn_output(&t, cmd, NULL), 0);
    assert_int_equal(atap_take(t, &o, sizeof o), 0);
    atap_release(t);
    return o;
}

/* Reads "a b" (two pids) from path, waiting up to 10 s for the line. */
static void read_pids(const char *path, pid_t *a, pid_t *b)
{
    uint64_t end = now_ns() + ATAP_SEC(10);

    for (;;) {
        FILE *f = fopen(path, "r");
        int x = 0, y = 0, n = f ? fscanf(f, "%d %d", &x, &y) : 0;
        if (f)
            fclose(f);
        if (n == 2) {
            *a = x;
            *b = y;
            return;
        }
        assert_true(now_ns() < end);
        usleep(5000);
    }
}

static bool wait_until_reaped(pid_t pid, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    while (unreaped(pid)) {
        if (now_ns() > end)
            return false;
        usleep(2000);
    }
    return true;
}

static bool wait_gone(pid_t pid, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + timeout_ns;

    while (!gone(pid)) {
        if (now_ns() > end)
            return false;
        usleep(2000);
    }
    return true;
}

/* ---- run ------------------------------------------------------------- */

static void test_process_run_status(void **state)
{
    (void)state;
    int st = run_status(&(atap_cmd){.program = "/bin/true"});
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);

    st = run_status(&(atap_cmd){.program = "false"}); /* through PATH */
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);

    st = run_status(&(atap_cmd){.program = "sh", .argv = SH("exit 7")});
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 7);

    st = run_status(&(atap_cmd){.program = "sh", .argv = SH("kill -USR2 $$")});
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGUSR2);

    /* stdin is /dev/null: a read sees its end at once */
    st = run_status(&(atap_cmd){.program = "sh", .argv = SH("read x; test $? -ne 0")});
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(zombies(), 0);
}

static void test_process_not_found(void **state)
{
    (void)state;
    atap_task t;

    assert_int_equal(atap_spawn_run(&t, &(atap_cmd){.program = "atap-no-such-program-x"}, NULL),
                     -ENOENT);
    assert_int_equal(t.id, 0);
    assert_int_equal(atap_spawn_output(&t, &(atap_cmd){.program = "/nonexistent/prog"}, NULL),
                     -ENOENT);
    assert_int_equal(
        atap_spawn_run(&t, &(atap_cmd){.program = "true", .dir = "/nonexistent-dir-x"}, NULL),
        -ENOENT);
    assert_int_equal(atap_spawn_run(&t, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_run(&t, &(atap_cmd){.program = "true", .input_len = 3}, NULL),
                     ATAP_EINVAL);
    assert_int_equal(
        atap_spawn_run(&t, &(atap_cmd){.program = "true"}, &(atap_spawn_opts){.kind = ATAP_REPEAT}),
        ATAP_EINVAL);
    assert_int_equal(zombies(), 0);
}

/* ---- output ---------------------------------------------------------- */

static void test_process_output_interleaved(void **state)
{
    (void)state;
    atap_output o = run_output(
        &(atap_cmd){.program = "sh", .argv = SH("echo one; echo two >&2; echo three; exit 3")});

    assert_true(WIFEXITED(o.status));
    assert_int_equal(WEXITSTATUS(o.status), 3);
    assert_int_equal(o.len, strlen("one\ntwo\nthree\n"));
    assert_string_equal(o.data, "one\ntwo\nthree\n");
    free(o.data);

    o = run_output(&(atap_cmd){.program = "/bin/true"});
    assert_int_equal(o.len, 0);
    assert_non_null(o.data);
    assert_string_equal(o.data, "");
    free(o.data);
}

/* 1.5 MB on stdout and 1.5 MB on stderr, the pipe's 64 KiB many times over:
 * the child would block for good were the pipe not read as it writes. */
static void test_process_output_large(void **state)
{
    (void)state;
    atap_output o =
        run_output(&(atap_cmd){.program = "sh",
                               .argv = SH("head -c 1500000 /dev/zero | tr '\\0' a; "
                                          "head -c 1500000 /dev/zero | tr '\\0' b >&2; echo end")});
    size_t a = 0, b = 0;

    assert_int_equal(WEXITSTATUS(o.status), 0);
    assert_int_equal(o.len, 3000004);
    for (size_t i = 0; i < o.len; i++) {
        a += o.data[i] == 'a';
        b += o.data[i] == 'b';
    }
    assert_int_equal(a, 1500000);
    assert_int_equal(b, 1500000);
    assert_memory_equal(o.data + 3000000, "end\n", 4);
    free(o.data);
}

/* Input larger than a pipe holds, echoed back by cat: written and read in
 * the same parks. */
static void test_process_input(void **state)
{
    (void)state;
    size_t n = 400000;
    unsigned char *in = malloc(n);
    atap_output o;

    assert_non_null(in);
    for (size_t i = 0; i < n; i++)
        in[i] = (unsigned char)(i * 7 + i / 251);
    o = run_output(&(atap_cmd){.program = "cat", .input = in, .input_len = n});
    assert_int_equal(WEXITSTATUS(o.status), 0);
    assert_int_equal(o.len, n);
    assert_memory_equal(o.data, in, n);
    free(o.data);

    /* run with input: the child reads it */
    int st = run_status(&(atap_cmd){.program = "sh",
                                    .argv = SH("read x; test \"$x\" = hello"),
                                    .input = "hello\n",
                                    .input_len = 6});
    assert_int_equal(WEXITSTATUS(st), 0);

    /* a child that never reads its input: no SIGPIPE kills us */
    o = run_output(&(atap_cmd){
        .program = "sh", .argv = SH("exec 0<&-; echo done"), .input = in, .input_len = n});
    assert_string_equal(o.data, "done\n");
    free(o.data);
    free(in);
}

static void test_process_dir_env(void **state)
{
    (void)state;
    atap_output o = run_output(&(atap_cmd){.program = "pwd", .dir = "/"});
    assert_string_equal(o.data, "/\n");
    free(o.data);

    const char *const env[] = {"ATAP_T1=one", "ATAP_T2=two words", NULL};
    o = run_output(&(atap_cmd){
        .program = "/bin/sh", .argv = SH("echo \"$ATAP_T1|$ATAP_T2|${HOME-unset}\""), .env = env});
    assert_string_equal(o.data, "one|two words|unset\n");
    free(o.data);

    /* env NULL: ours */
    setenv("ATAP_T3", "inherited", 1);
    o = run_output(&(atap_cmd){.program = "sh", .argv = SH("echo $ATAP_T3")});
    assert_string_equal(o.data, "inherited\n");
    free(o.data);
    unsetenv("ATAP_T3");
}

/* ---- cancel and timeout --------------------------------------------- */

/* A child that ignores SIGTERM, with a grandchild (which inherits the
 * ignore) in its group; both write their pids to a file. */
static void start_stubborn(atap_task *t, const char *file, const atap_spawn_opts *opts,
                           pid_t *child, pid_t *grandchild)
{
    char script[512];

    unlink(file);
    snprintf(script, sizeof script,
             "trap '' TERM; sleep 100 & echo $$ $! > %s.tmp; mv %s.tmp %s; wait", file, file, file);
    assert_int_equal(atap_spawn_output(t, &(atap_cmd){.program = "sh", .argv = SH(script)}, opts),
                     0);
    read_pids(file, child, grandchild);
    unlink(file);
    /* it does ignore SIGTERM, grandchild too */
    assert_int_equal(kill(-*child, SIGTERM), 0);
    usleep(100000);
    assert_true(unreaped(*child));
    assert_false(gone(*grandchild));
}

static void test_process_cancel_kills_group(void **state)
{
    (void)state;
    char file[64];
    atap_task t;
    pid_t child, grandchild;
    atap_output o;

    snprintf(file, sizeof file, "/tmp/atap_proc_c_%d", (int)getpid());
    start_stubborn(&t, file, NULL, &child, &grandchild);
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join(t, &o, sizeof o), ATAP_ECANCELLED);
    /* killed and reaped by the cancel, the handle still held */
    assert_true(wait_until_reaped(child, ATAP_SEC(10)));
    assert_true(wait_gone(grandchild, ATAP_SEC(10)));
    atap_release(t);
    assert_int_equal(zombies(), 0);
}

/* Reads "a b" from path if it is there (written whole, by a rename). */
static bool try_read_pids(const char *path, pid_t *a, pid_t *b)
{
    FILE *f = fopen(path, "r");
    int x = 0, y = 0, n = f ? fscanf(f, "%d %d", &x, &y) : 0;

    if (f)
        fclose(f);
    *a = x;
    *b = y;
    return n == 2;
}

/* The timeout kills the group. On a loaded machine the shell may not have
 * written its pids (or set up its grandchild) by the time the timeout
 * comes: then the timeout doubles and the test goes again, up to 25.6 s. */
static void test_process_timeout_kills_group(void **state)
{
    (void)state;
    char file[64], script[512];
    pid_t child = 0, grandchild = 0;
    uint64_t timeout = ATAP_MS(200);
    bool seen = false;

    snprintf(file, sizeof file, "/tmp/atap_proc_t_%d", (int)getpid());
    snprintf(script, sizeof script,
             "trap '' TERM; sleep 100 & echo $$ $! > %s.tmp; mv %s.tmp %s; wait", file, file, file);
    while (!seen) {
        atap_task t;
        atap_output o;
        uint64_t t0 = now_ns();

        timeout *= 2;
        assert_true(timeout <= ATAP_MS(25600));
        unlink(file);
        assert_int_equal(atap_spawn_output(&t, &(atap_cmd){.program = "sh", .argv = SH(script)},
                                           &(atap_spawn_opts){.timeout_ns = timeout}),
                         0);
        assert_int_equal(atap_join(t, &o, sizeof o), ATAP_ETIMEDOUT);
        assert_true(now_ns() - t0 >= timeout);
        if ((seen = try_read_pids(file, &child, &grandchild))) {
            /* reaped as the task ended, its handle still held */
            assert_true(wait_until_reaped(child, ATAP_SEC(10)));
            assert_true(wait_gone(grandchild, ATAP_SEC(10)));
        }
        atap_release(t);
        unlink(file);
        assert_int_equal(zombies(), 0);
    }
}

/* The task's handle released while the child runs: the task goes on, and
 * reaps the child when it exits. */
static void test_process_released_early(void **state)
{
    (void)state;
    char file[64], script[512];
    atap_task t;
    pid_t child, other;

    snprintf(file, sizeof file, "/tmp/atap_proc_r_%d", (int)getpid());
    unlink(file);
    snprintf(script, sizeof script, "echo $$ $$ > %s.tmp; mv %s.tmp %s; sleep 0.2", file, file,
             file);
    assert_int_equal(atap_spawn_run(&t, &(atap_cmd){.program = "sh", .argv = SH(script)}, NULL), 0);
    read_pids(file, &child, &other);
    unlink(file);
    atap_release(t);
    assert_true(wait_until_reaped(child, ATAP_SEC(10)));
    assert_int_equal(zombies(), 0);
}

/* Without a pidfd (a kernel before 5.3): the exit is looked for every
 * 10 ms, parked; statuses, output and a cancel as ever. */
static void test_process_no_pidfd(void **state)
{
    (void)state;
    atap_task t;
    atap_output o;
    uint64_t t0;

    atap__test_proc_no_pidfd(true);
    t0 = now_ns();
    int st = run_status(&(atap_cmd){.program = "sh", .argv = SH("sleep 0.1; exit 4")});
    assert_int_equal(WEXITSTATUS(st), 4);
    assert_true(now_ns() - t0 >= ATAP_MS(100));
    o = run_output(&(atap_cmd){.program = "sh", .argv = SH("echo a; echo b >&2")});
    assert_string_equal(o.data, "a\nb\n");
    free(o.data);

    char file[64];
    pid_t child, grandchild;
    snprintf(file, sizeof file, "/tmp/atap_proc_n_%d", (int)getpid());
    start_stubborn(&t, file, NULL, &child, &grandchild);
    assert_int_equal(atap_cancel(t), 0);
    assert_true(wait_until_reaped(child, ATAP_SEC(10)));
    assert_true(wait_gone(grandchild, ATAP_SEC(10)));
    atap_release(t);
    atap__test_proc_no_pidfd(false);
    assert_int_equal(zombies(), 0);
}

/* A shutdown ends a parked process task (ATAP_EFAILED): its child is
 * killed and reaped with it, the handle still held. */
static void test_process_shutdown_kills(void **state)
{
    (void)state;
    char file[64];
    atap_task t;
    pid_t child, grandchild;
    atap_output o;

    snprintf(file, sizeof file, "/tmp/atap_proc_s_%d", (int)getpid());
    start_stubborn(&t, file, NULL, &child, &grandchild);
    assert_int_equal(atap_shutdown(), 0);
    assert_int_equal(atap_join(t, &o, sizeof o), ATAP_EFAILED);
    assert_true(wait_until_reaped(child, ATAP_SEC(10)));
    assert_true(wait_gone(grandchild, ATAP_SEC(10)));
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0); /* for the teardown */
    assert_int_equal(zombies(), 0);
}

/* ---- many children, no thread each ---------------------------------- */

#define MANY 50

static void test_process_many_no_thread_each(void **state)
{
    (void)state;
    atap_task t[MANY];
    struct atap_pool_stats before = pool_stats(), during;
    int st[MANY];
    uint64_t end;

    for (int i = 0; i < MANY; i++)
        assert_int_equal(
            atap_spawn_run(
                &t[i],
                &(atap_cmd){.program = "sleep", .argv = (const char *const[]){"sleep", "1", NULL}},
                NULL),
            0);
    /* every one parked: none holds a thread */
    end = now_ns() + ATAP_SEC(20);
    for (int i = 0; i < MANY; i++) {
        while (atap_state_of(t[i]) != ATAP_WAITING && !atap_finished(t[i])) {
            assert_true(now_ns() < end);
            usleep(1000);
        }
    }
    during = pool_stats();
    assert_true(during.workers + during.blocking_threads <
                before.workers + before.blocking_threads + 8);
    assert_int_equal(atap_join_all(t, MANY, st, sizeof st[0], NULL), 0);
    for (int i = 0; i < MANY; i++) {
        assert_true(WIFEXITED(st[i]));
        assert_int_equal(WEXITSTATUS(st[i]), 0);
        atap_release(t[i]);
    }
    during = pool_stats();
    assert_true(during.peak_workers < before.workers + 8 ||
                during.peak_workers == before.peak_workers);
    assert_int_equal(zombies(), 0);
}

/* ---- a started child ------------------------------------------------- */

static void test_process_child_pipes(void **state)
{
    (void)state;
    atap_child c;
    atap_task w;
    char buf[64];
    int st = -1;
    ssize_t n;

    assert_int_equal(atap_child_start(&c, &(atap_cmd){.program = "sh",
                                                      .argv = SH("read x; echo \"out:$x\"; "
                                                                 "echo \"err:$x\" >&2; exit 5")}),
                     0);
    assert_true(c.pid > 0);
    assert_int_equal(fcntl(c.in_fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_int_equal(fcntl(c.out_fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
    assert_int_equal(atap_spawn_child_wait(&w, c.pid, NULL), 0);
    assert_int_equal(write(c.in_fd, "hi\n", 3), 3);
    close(c.in_fd);
    assert_true(atap_wait_fd(c.out_fd, ATAP_READABLE, ATAP_SEC(10)) > 0);
    n = read(c.out_fd, buf, sizeof buf - 1);
    assert_int_equal(n, 7);
    assert_memory_equal(buf, "out:hi\n", 7);
    assert_true(atap_wait_fd(c.err_fd, ATAP_READABLE, ATAP_SEC(10)) > 0);
    n = read(c.err_fd, buf, sizeof buf - 1);
    assert_int_equal(n, 7);
    assert_memory_equal(buf, "err:hi\n", 7);
    assert_int_equal(atap_join(w, &st, sizeof st), 0);
    assert_int_equal(WEXITSTATUS(st), 5);
    atap_release(w);
    close(c.out_fd);
    close(c.err_fd);
    assert_false(unreaped(c.pid));

    /* not a child of ours */
    assert_int_equal(atap_spawn_child_wait(&w, 1, NULL), -ECHILD);
    assert_int_equal(atap_spawn_child_wait(&w, 0, NULL), ATAP_EINVAL);
    assert_int_equal(zombies(), 0);
}

static void test_process_child_signal(void **state)
{
    (void)state;
    atap_child c;
    atap_task w, s;
    int st = -1;

    assert_int_equal(
        atap_child_start(&c, &(atap_cmd){.program = "sleep",
                                         .argv = (const char *const[]){"sleep", "100", NULL}}),
        0);
    assert_int_equal(atap_spawn_child_wait(&w, c.pid, NULL), 0);
    assert_int_equal(atap_spawn_signal_send(&s, c.pid, SIGTERM, NULL), 0);
    assert_int_equal(atap_join(s, NULL, 0), 0);
    atap_release(s);
    assert_int_equal(atap_join(w, &st, sizeof st), 0);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGTERM);
    atap_release(w);
    close(c.in_fd);
    close(c.out_fd);
    close(c.err_fd);

    /* a send to a process that is gone fails */
    assert_int_equal(atap_spawn_signal_send(&s, c.pid, SIGTERM, NULL), 0);
    assert_int_equal(atap_join(s, NULL, 0), ATAP_EFAILED);
    atap_release(s);
    assert_int_equal(atap_spawn_signal_send(&s, 0, SIGTERM, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_signal_send(&s, -1, SIGTERM, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_signal_send(&s, getpid(), NSIG, NULL), ATAP_EINVAL);
    assert_int_equal(zombies(), 0);
}

/* ---- piped: the child's streams while it runs ------------------------- */

/* The fds open in this process now. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* Sends len bytes of buf to fd as a task: its handle, io the caller's. */
static atap_task send_task(atap_net_io *io, int fd, const void *buf, size_t len)
{
    atap_task t;

    assert_int_equal(atap_net_prep_send(io, fd, buf, len), 0);
    assert_int_equal(atap_net_spawn(&t, io, NULL), 0);
    return t;
}

/* The next line through r into line (NUL-terminated, '\n' dropped): its
 * length, or the recv_until's code (ATAP_ECLOSED at the end). */
static int read_line(atap_net_reader *r, char *line, size_t room)
{
    atap_net_io io;
    atap_net_out out;
    atap_task t;
    int rc;

    assert_int_equal(atap_net_prep_recv_until(&io, r, "\n", 1, r->cap), 0);
    assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
    rc = atap_net_join(t, &out);
    atap_net_release(t, &io);
    if (rc != 0)
        return rc;
    assert_true((size_t)out.n <= room);
    memcpy(line, atap_net_reader_data(r, NULL), (size_t)out.n - 1);
    line[out.n - 1] = '\0';
    atap_net_reader_consume(r, (size_t)out.n);
    return (int)out.n - 1;
}

/* Everything left on fd to its end, into buf (NUL-terminated): its length. */
static size_t read_all(int fd, char *buf, size_t room)
{
    atap_net_io io;
    atap_net_out out;
    atap_task t;
    size_t len = 0;

    for (;;) {
        assert_true(len < room - 1);
        assert_int_equal(atap_net_prep_recv(&io, fd, buf + len, room - 1 - len), 0);
        assert_int_equal(atap_net_spawn(&t, &io, NULL), 0);
        assert_int_equal(atap_net_join(t, &out), 0);
        atap_net_release(t, &io);
        if (out.n == 0)
            break;
        len += (size_t)out.n;
    }
    buf[len] = '\0';
    return len;
}

static int join_status(atap_task t)
{
    int st = -1;

    assert_int_equal(atap_join(t, &st, sizeof st), 0);
    return st;
}

#define LINES 20000

/* cat -n fed 20000 lines (far more than a pipe holds, so the feeding and
 * the reading must go on together) by a send task, while this thread reads
 * its output line by line; the end of stdin is its end of output. */
static void test_process_piped_lines(void **state)
{
    (void)state;
    size_t cap = LINES * 16, len = 0;
    char *in = malloc(cap), line[128], want[128], rb[256];
    atap_net_reader r;
    atap_net_io sio;
    atap_net_out out;
    atap_child c;
    atap_task t, s;

    assert_non_null(in);
    for (int i = 0; i < LINES; i++)
        len += (size_t)snprintf(in + len, cap - len, "line %d\n", i);
    assert_int_equal(atap_spawn_piped(&t, &c,
                                      &(atap_cmd){.program = "cat",
                                                  .argv = (const char *const[]){"cat", "-n", NULL}},
                                      NULL),
                     0);
    assert_true(c.pid > 0 && c.in_fd >= 0 && c.out_fd >= 0 && c.err_fd >= 0);
    for (int i = 0; i < 3; i++) {
        int fd = i == 0 ? c.in_fd : i == 1 ? c.out_fd : c.err_fd;
        assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
    }
    s = send_task(&sio, c.in_fd, in, len);
    assert_int_equal(atap_net_reader_init(&r, c.out_fd, rb, sizeof rb), 0);
    for (int i = 0; i < LINES; i++) {
        assert_true(read_line(&r, line, sizeof line) > 0);
        snprintf(want, sizeof want, "%6d\tline %d", i + 1, i);
        assert_string_equal(line, want);
        if (i == 0)
            assert_false(atap_finished(s)); /* the first line came while it fed */
    }
    assert_int_equal(atap_net_join(s, &out), 0);
    assert_int_equal(out.n, (int64_t)len);
    atap_net_release(s, &sio);
    assert_int_equal(atap_process_close_stdin(t), 0);
    assert_int_equal(read_line(&r, line, sizeof line), ATAP_ECLOSED);
    int st = join_status(t);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    atap_release(t);
    free(in);
    assert_int_equal(zombies(), 0);
}

/* stdout and stderr are two pipes, read apart; what a child wrote before
 * it exited is still there to read after, then the end. */
static void test_process_piped_stderr_apart(void **state)
{
    (void)state;
    char buf[256];
    atap_child c;
    atap_task t;

    assert_int_equal(
        atap_spawn_piped(
            &t, &c,
            &(atap_cmd){.program = "sh",
                        .argv = SH("echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3")},
            NULL),
        0);
    int st = join_status(t); /* exited and reaped: the pipes stay open */
    assert_int_equal(WEXITSTATUS(st), 3);
    assert_int_equal(read_all(c.out_fd, buf, sizeof buf), 10);
    assert_string_equal(buf, "out1\nout2\n");
    assert_int_equal(read_all(c.err_fd, buf, sizeof buf), 10);
    assert_string_equal(buf, "err1\nerr2\n");
    atap_release(t);
    assert_int_equal(zombies(), 0);
}

/* Closing stdin: the child reads its end; closing it again, or on a task
 * with no pipes, is refused. */
static void test_process_piped_stdin_eof(void **state)
{
    (void)state;
    char buf[256];
    atap_child c;
    atap_task t, r;

    assert_int_equal(
        atap_spawn_piped(&t, &c, &(atap_cmd){.program = "sh", .argv = SH("cat; echo eof")}, NULL),
        0);
    assert_int_equal(write(c.in_fd, "a\nb\n", 4), 4);
    assert_int_equal(atap_process_close_stdin(t), 0);
    assert_int_equal(atap_process_close_stdin(t), ATAP_EFINISHED);
    assert_int_equal(read_all(c.out_fd, buf, sizeof buf), 8);
    assert_string_equal(buf, "a\nb\neof\n");
    assert_int_equal(WEXITSTATUS(join_status(t)), 0);
    atap_release(t);
    assert_int_equal(atap_process_close_stdin(t), ATAP_ENOTASK); /* released */

    assert_int_equal(atap_spawn_run(&r, &(atap_cmd){.program = "true"}, NULL), 0);
    assert_int_equal(atap_process_close_stdin(r), ATAP_ENOTASK); /* no pipes */
    assert_int_equal(WEXITSTATUS(join_status(r)), 0);
    atap_release(r);
    assert_int_equal(zombies(), 0);
}

/* A write to a stdin the child closed: -EPIPE, and no SIGPIPE kills us. */
static void test_process_piped_write_to_closed_stdin(void **state)
{
    (void)state;
    size_t n = 1 << 20;
    char *big = calloc(1, n), line[64], rb[64];
    atap_net_reader r;
    atap_net_io io;
    atap_net_out out;
    atap_child c;
    atap_task t, s;

    assert_non_null(big);
    assert_int_equal(
        atap_spawn_piped(
            &t, &c,
            &(atap_cmd){.program = "sh", .argv = SH("exec 0<&-; echo closed; exec sleep 100")},
            NULL),
        0);
    assert_int_equal(atap_net_reader_init(&r, c.out_fd, rb, sizeof rb), 0);
    assert_int_equal(read_line(&r, line, sizeof line), 6);
    assert_string_equal(line, "closed");
    s = send_task(&io, c.in_fd, big, n);
    assert_int_equal(atap_net_join(s, &out), -EPIPE);
    atap_net_release(s, &io);
    assert_int_equal(atap_process_kill(t, 0), 0);
    int st = join_status(t);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_int_equal(atap_process_kill(t, 0), ATAP_EFINISHED); /* reaped: nothing sent */
    atap_release(t);
    free(big);
}

/* ---- redirection ----------------------------------------------------- */

static void slurp(const char *path, char *buf, size_t room)
{
    FILE *f = fopen(path, "r");
    size_t n;

    assert_non_null(f);
    n = fread(buf, 1, room - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static void test_process_redirect_file(void **state)
{
    (void)state;
    char out[64], in[64], buf[256];
    atap_cmd cmd = {
        .size = sizeof cmd, .program = "sh", .argv = SH("echo to-out; echo to-err >&2")};

    snprintf(out, sizeof out, "/tmp/atap_proc_f_%d", (int)getpid());
    snprintf(in, sizeof in, "/tmp/atap_proc_i_%d", (int)getpid());
    /* stdout to a file (truncated), stderr with it */
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fputs("old contents, longer than what comes\n", f);
    fclose(f);
    cmd.stdio[1] = (atap_stdio){.how = ATAP_STDIO_FILE, .path = out};
    cmd.stdio[2] = (atap_stdio){.how = ATAP_STDIO_STDOUT};
    assert_int_equal(WEXITSTATUS(run_status(&cmd)), 0);
    slurp(out, buf, sizeof buf);
    assert_string_equal(buf, "to-out\nto-err\n");
    /* appended, stderr to its own file */
    cmd.stdio[1].how = ATAP_STDIO_APPEND;
    cmd.stdio[2] = (atap_stdio){.how = ATAP_STDIO_FILE, .path = in};
    assert_int_equal(WEXITSTATUS(run_status(&cmd)), 0);
    slurp(out, buf, sizeof buf);
    assert_string_equal(buf, "to-out\nto-err\nto-out\n");
    slurp(in, buf, sizeof buf);
    assert_string_equal(buf, "to-err\n");
    /* stdin from a file; captured output */
    atap_cmd rd = {
        .size = sizeof rd, .program = "sh", .argv = SH("read a; read b; echo \"$b $a\"")};
    rd.stdio[0] = (atap_stdio){.how = ATAP_STDIO_FILE, .path = out};
    atap_output o = run_output(&rd);
    assert_string_equal(o.data, "to-err to-out\n");
    free(o.data);
    /* an fd of ours: the child writes to it */
    int fd = open(in, O_WRONLY | O_TRUNC | O_CLOEXEC);
    assert_true(fd >= 0);
    cmd.stdio[1] = (atap_stdio){.how = ATAP_STDIO_FD, .fd = fd};
    cmd.stdio[2] = (atap_stdio){.how = ATAP_STDIO_NULL};
    assert_int_equal(WEXITSTATUS(run_status(&cmd)), 0);
    close(fd);
    slurp(in, buf, sizeof buf);
    assert_string_equal(buf, "to-out\n");
    unlink(out);
    unlink(in);
}

static void test_process_redirect_null(void **state)
{
    (void)state;
    atap_cmd cmd = {
        .size = sizeof cmd, .program = "sh", .argv = SH("echo to-out; echo to-err >&2")};
    atap_output o;
    atap_child c;
    atap_task t;
    char buf[64];

    /* stdout thrown away: stderr captured alone */
    cmd.stdio[1].how = ATAP_STDIO_NULL;
    o = run_output(&cmd);
    assert_string_equal(o.data, "to-err\n");
    free(o.data);
    /* and the other way */
    cmd.stdio[1].how = ATAP_STDIO_DEFAULT;
    cmd.stdio[2].how = ATAP_STDIO_NULL;
    o = run_output(&cmd);
    assert_string_equal(o.data, "to-out\n");
    free(o.data);
    /* both: nothing captured */
    cmd.stdio[1].how = ATAP_STDIO_NULL;
    o = run_output(&cmd);
    assert_int_equal(o.len, 0);
    free(o.data);
    /* piped, with stdin and stderr on /dev/null: no fd for them */
    cmd.argv = SH("cat; echo to-out; echo to-err >&2");
    cmd.stdio[0].how = ATAP_STDIO_NULL;
    cmd.stdio[1].how = ATAP_STDIO_DEFAULT;
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), 0);
    assert_int_equal(c.in_fd, -1);
    assert_int_equal(c.err_fd, -1);
    assert_int_equal(read_all(c.out_fd, buf, sizeof buf), 7);
    assert_string_equal(buf, "to-out\n");
    assert_int_equal(WEXITSTATUS(join_status(t)), 0);
    assert_int_equal(atap_process_close_stdin(t), ATAP_EFINISHED);
    atap_release(t);
    /* size 0 is 0.1's layout: the stdio set past it is not read */
    cmd.size = 0;
    cmd.stdio[1].how = ATAP_STDIO_NULL;
    cmd.stdio[2].how = ATAP_STDIO_NULL;
    cmd.argv = SH("echo to-out");
    o = run_output(&cmd);
    assert_string_equal(o.data, "to-out\n");
    free(o.data);
}

/* ---- kill with a grace ----------------------------------------------- */

/* A piped child that ignores SIGTERM (a grandchild too), once it says so. */
static atap_task start_ignoring_term(atap_child *c, uint64_t grace_ns)
{
    atap_cmd cmd = {.size = sizeof cmd,
                    .program = "sh",
                    .argv = SH("trap '' TERM; sleep 100 & echo ready; wait"),
                    .kill_grace_ns = grace_ns};
    char line[64], rb[64];
    atap_net_reader r;
    atap_task t;

    assert_int_equal(atap_spawn_piped(&t, c, &cmd, NULL), 0);
    assert_int_equal(atap_net_reader_init(&r, c->out_fd, rb, sizeof rb), 0);
    assert_int_equal(read_line(&r, line, sizeof line), 5);
    return t;
}

/* SIGTERM ignored: SIGKILL comes after the grace, never before. */
static void test_process_kill_grace_then_sigkill(void **state)
{
    (void)state;
    uint64_t grace = ATAP_MS(400), t0, took;
    atap_child c;
    atap_task t = start_ignoring_term(&c, 0);

    t0 = now_ns();
    assert_int_equal(atap_process_kill(t, grace), 0);
    usleep(200000);
    /* not killed in the grace (looked at before the clock is read: a
     * loaded machine that slept past the grace proves nothing) */
    bool over = atap_finished(t) || gone(c.pid);
    if (now_ns() - t0 < grace)
        assert_false(over);
    int st = join_status(t);
    took = now_ns() - t0;
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_true(took >= grace);
    assert_true(took < grace + ATAP_SEC(5) * test_slack());
    atap_release(t);
    assert_int_equal(zombies(), 0);
}

/* A child that exits on SIGTERM is not SIGKILLed: its status says SIGTERM,
 * long before the grace. */
static void test_process_kill_term_is_enough(void **state)
{
    (void)state;
    atap_child c;
    atap_task t;
    uint64_t t0;

    assert_int_equal(
        atap_spawn_piped(
            &t, &c,
            &(atap_cmd){.program = "sleep", .argv = (const char *const[]){"sleep", "100", NULL}},
            NULL),
        0);
    t0 = now_ns();
    assert_int_equal(atap_process_kill(t, ATAP_SEC(30)), 0);
    int st = join_status(t);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGTERM);
    assert_true(now_ns() - t0 < ATAP_SEC(10));
    atap_release(t);
    assert_int_equal(atap_process_kill(t, 0), ATAP_ENOTASK);
    assert_int_equal(zombies(), 0);
}

/* A cancel with cmd->kill_grace_ns: the cancel returns at once, the child
 * gets SIGTERM, then SIGKILL after the grace (reaped then, by libatap). */
static void test_process_cancel_grace(void **state)
{
    (void)state;
    uint64_t grace = ATAP_MS(400), t0;
    atap_child c;
    atap_task t = start_ignoring_term(&c, grace);
    int st;

    t0 = now_ns();
    assert_int_equal(atap_cancel(t), 0);
    assert_int_equal(atap_join(t, &st, sizeof st), ATAP_ECANCELLED);
    /* the cancel did not wait for the grace: the child is still there
     * (looked at before the clock is read, as above) */
    bool there = !gone(c.pid);
    if (now_ns() - t0 < grace)
        assert_true(there);
    usleep(200000);
    there = !gone(c.pid); /* still in its grace */
    if (now_ns() - t0 < grace)
        assert_true(there);
    assert_true(wait_until_reaped(c.pid, ATAP_SEC(10)));
    assert_true(now_ns() - t0 >= grace);
    atap_release(t);
    assert_int_equal(zombies(), 0);

    /* one that exits on SIGTERM goes at once */
    atap_cmd cmd = {.size = sizeof cmd,
                    .program = "sleep",
                    .argv = (const char *const[]){"sleep", "100", NULL},
                    .kill_grace_ns = ATAP_SEC(30)};
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), 0);
    t0 = now_ns();
    assert_int_equal(atap_cancel(t), 0);
    assert_true(wait_until_reaped(c.pid, ATAP_SEC(10)));
    assert_true(now_ns() - t0 < ATAP_SEC(10));
    atap_release(t);
    assert_int_equal(zombies(), 0);
}

/* A run timeout with a grace ends the child as a cancel does (the guard,
 * on the manager's thread, hands it to a killer); a shutdown during a
 * grace kills and reaps at once. */
static void test_process_timeout_grace_and_shutdown(void **state)
{
    (void)state;
    uint64_t grace = ATAP_MS(300), t0;
    atap_cmd cmd = {.size = sizeof cmd,
                    .program = "sh",
                    .argv = SH("trap '' TERM; echo $$; exec sleep 100"),
                    .kill_grace_ns = grace};
    char line[64], rb[64];
    atap_net_reader r;
    atap_child c;
    atap_task t;
    int st;

    /* A line read says the trap was set before the SIGTERM came; on a
     * loaded machine the shell may come to it only after the timeout:
     * then the timeout doubles and it goes again. */
    for (uint64_t timeout = ATAP_MS(200);; timeout *= 2) {
        assert_true(timeout <= ATAP_MS(25600));
        t0 = now_ns();
        assert_int_equal(atap_spawn_piped(&t, &c, &cmd, &(atap_spawn_opts){.timeout_ns = timeout}),
                         0);
        assert_int_equal(atap_net_reader_init(&r, c.out_fd, rb, sizeof rb), 0);
        bool trapped = read_line(&r, line, sizeof line) > 0;
        assert_int_equal(atap_join(t, &st, sizeof st), ATAP_ETIMEDOUT);
        assert_true(wait_until_reaped(c.pid, ATAP_SEC(10)));
        atap_release(t);
        if (trapped) {
            assert_true(now_ns() - t0 >= timeout + grace);
            break;
        }
    }

    /* a shutdown in the grace: reaped by the time it returns */
    cmd.kill_grace_ns = ATAP_SEC(100);
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), 0);
    assert_int_equal(atap_net_reader_init(&r, c.out_fd, rb, sizeof rb), 0);
    assert_true(read_line(&r, line, sizeof line) > 0); /* TERM ignored from here */
    assert_int_equal(atap_cancel(t), 0);
    usleep(100000);
    assert_true(unreaped(c.pid));
    assert_int_equal(atap_shutdown(), 0);
    assert_true(wait_until_reaped(c.pid, ATAP_SEC(10)));
    atap_release(t);
    assert_int_equal(atap_init(NULL), 0); /* for the teardown */
    assert_int_equal(zombies(), 0);
}

/* ---- directory and environment --------------------------------------- */

static void test_process_cwd_and_env_set(void **state)
{
    (void)state;
    char dir[] = "/tmp/atap_proc_dXXXXXX", want[PATH_MAX + 2], real[PATH_MAX];
    atap_cmd cmd = {.size = sizeof cmd, .program = "pwd"};
    atap_output o;

    assert_non_null(mkdtemp(dir));
    assert_non_null(realpath(dir, real));
    cmd.dir = dir;
    o = run_output(&cmd);
    snprintf(want, sizeof want, "%s\n", real);
    assert_string_equal(o.data, want);
    free(o.data);
    rmdir(dir);

    /* on top of ours: set one, replace one, unset one */
    setenv("ATAP_E_KEEP", "kept", 1);
    setenv("ATAP_E_REPLACE", "old", 1);
    setenv("ATAP_E_UNSET", "there", 1);
    const char *const set[] = {"ATAP_E_NEW=new value", "ATAP_E_REPLACE=new", "ATAP_E_UNSET", NULL};
    atap_cmd e = {.size = sizeof e,
                  .program = "sh",
                  .argv =
                      SH("echo \"$ATAP_E_KEEP|$ATAP_E_NEW|$ATAP_E_REPLACE|${ATAP_E_UNSET-unset}\""),
                  .env_set = set};
    o = run_output(&e);
    assert_string_equal(o.data, "kept|new value|new|unset\n");
    free(o.data);
    /* on top of a whole environment given; the later of two entries wins */
    const char *const env[] = {"ATAP_E_A=a", "ATAP_E_B=b", NULL};
    const char *const set2[] = {"ATAP_E_B=1", "ATAP_E_C=c", "ATAP_E_B=2", NULL};
    e.env = env;
    e.env_set = set2;
    e.argv = SH("echo \"$ATAP_E_A|$ATAP_E_B|$ATAP_E_C|${ATAP_E_KEEP-unset}\"");
    o = run_output(&e);
    assert_string_equal(o.data, "a|2|c|unset\n");
    free(o.data);
    unsetenv("ATAP_E_KEEP");
    unsetenv("ATAP_E_REPLACE");
    unsetenv("ATAP_E_UNSET");
}

/* ---- bad input: a clear error, no child, no fd left ------------------ */

static void test_process_bad_input_leaks_nothing(void **state)
{
    (void)state;
    int before = open_fds(), closed = open("/dev/null", O_RDONLY);
    atap_cmd cmd = {.size = sizeof cmd, .program = "true", .dir = "/nonexistent-dir-x"};
    atap_child c;
    atap_task t;

    close(closed);
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), -ENOENT);
    assert_int_equal(c.pid, -1);
    assert_int_equal(c.in_fd, -1);
    assert_int_equal(c.out_fd, -1);
    assert_int_equal(c.err_fd, -1);
    assert_int_equal(t.id, 0);
    assert_int_equal(atap_spawn_output(&t, &cmd, NULL), -ENOENT);
    assert_int_equal(atap_child_start(&c, &cmd), -ENOENT);
    cmd.dir = NULL;
    cmd.stdio[0] = (atap_stdio){.how = ATAP_STDIO_FILE, .path = "/nonexistent-dir-x/in"};
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), -ENOENT);
    cmd.stdio[0] = (atap_stdio){.how = ATAP_STDIO_FD, .fd = closed};
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), -EBADF);
    cmd.stdio[0].how = ATAP_STDIO_DEFAULT;
    cmd.stdio[2] = (atap_stdio){.how = ATAP_STDIO_FILE, .path = "/"};
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), -EISDIR);
    cmd.program = "atap-no-such-program-x";
    cmd.stdio[2].how = ATAP_STDIO_DEFAULT;
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), -ENOENT);
    /* refused before anything is made */
    cmd.program = "true";
    cmd.stdio[1].how = ATAP_STDIO_PIPE; /* nobody would read it */
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_output(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.stdio[1] = (atap_stdio){.how = ATAP_STDIO_FILE}; /* no path */
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.stdio[1] = (atap_stdio){.how = 99};
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.stdio[1] = (atap_stdio){.how = ATAP_STDIO_STDOUT}; /* stderr's only */
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.stdio[1] = (atap_stdio){.how = ATAP_STDIO_DEFAULT};
    cmd.stdio[0] = (atap_stdio){.how = ATAP_STDIO_APPEND, .path = "/tmp/x"};
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.stdio[0] = (atap_stdio){.how = ATAP_STDIO_NULL};
    cmd.input = "x";
    cmd.input_len = 1;
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL); /* two stdins */
    cmd.stdio[0].how = ATAP_STDIO_DEFAULT;
    assert_int_equal(atap_spawn_piped(&t, &c, &cmd, NULL), ATAP_EINVAL); /* input */
    cmd.input = NULL;
    cmd.input_len = 0;
    cmd.env_set = (const char *const[]){"=x", NULL};
    assert_int_equal(atap_spawn_run(&t, &cmd, NULL), ATAP_EINVAL);
    cmd.env_set = NULL;
    assert_int_equal(atap_spawn_piped(&t, NULL, &cmd, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_piped(NULL, &c, &cmd, NULL), ATAP_EINVAL);
    assert_int_equal(zombies(), 0);
    assert_int_equal(open_fds(), before);
}

/* ---- many piped children --------------------------------------------- */

#define PIPED_MANY 100

static void test_process_piped_many_no_fd_left(void **state)
{
    (void)state;
    int before = open_fds();
    atap_child c[PIPED_MANY];
    atap_task t[PIPED_MANY];
    int st[PIPED_MANY];
    char buf[64], want[64];

    for (int i = 0; i < PIPED_MANY; i++) {
        assert_int_equal(
            atap_spawn_piped(
                &t[i], &c[i],
                &(atap_cmd){.program = "sh", .argv = SH("read x; echo \"$x$x\"; echo \"$x\" >&2")},
                NULL),
            0);
        snprintf(buf, sizeof buf, "%d\n", i);
        assert_int_equal(write(c[i].in_fd, buf, strlen(buf)), (ssize_t)strlen(buf));
    }
    for (int i = 0; i < PIPED_MANY; i++) {
        read_all(c[i].out_fd, buf, sizeof buf);
        snprintf(want, sizeof want, "%d%d\n", i, i);
        assert_string_equal(buf, want);
        read_all(c[i].err_fd, buf, sizeof buf);
        snprintf(want, sizeof want, "%d\n", i);
        assert_string_equal(buf, want);
    }
    assert_int_equal(atap_join_all(t, PIPED_MANY, st, sizeof st[0], NULL), 0);
    for (int i = 0; i < PIPED_MANY; i++) {
        assert_int_equal(WEXITSTATUS(st[i]), 0);
        atap_release(t[i]);
    }
    assert_int_equal(zombies(), 0);
    assert_int_equal(open_fds(), before);
}

/* ---- signals ---------------------------------------------------------- */

static void test_signal_wait_counts(void **state)
{
    (void)state;
    atap_task t;
    uint64_t n = 0;

    assert_int_equal(atap_spawn_signal_wait(&t, SIGUSR1, NULL, NULL, NULL), 0);
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    assert_int_equal(atap_join(t, &n, sizeof n), 0);
    assert_int_equal(n, 1);
    atap_release(t);

    /* a wait that nothing wakes times out */
    assert_int_equal(atap_spawn_signal_wait(&t, SIGUSR1, NULL, NULL,
                                            &(atap_spawn_opts){.timeout_ns = ATAP_MS(100)}),
                     0);
    assert_int_equal(atap_join(t, &n, sizeof n), ATAP_ETIMEDOUT);
    atap_release(t);
}

static _Atomic uint64_t g_handled;
static _Atomic int g_handled_signo;

static void on_usr2(int signo, uint64_t count, void *arg)
{
    (void)arg;
    atomic_store(&g_handled_signo, signo);
    atomic_fetch_add(&g_handled, count);
}

/* As a repeat, a handler: each delivery (sent once the last is handled)
 * is one batch of 1; the series ends after its runs. */
static void test_signal_repeat_handler(void **state)
{
    (void)state;
    atap_task t;
    uint64_t n = 0;
    atap_state s;

    atomic_store(&g_handled, 0);
    assert_int_equal(atap_spawn_signal_wait(&t, SIGUSR2, on_usr2, NULL,
                                            &(atap_spawn_opts){.kind = ATAP_REPEAT, .runs = 3}),
                     0);
    for (uint64_t i = 1; i <= 3; i++) {
        uint64_t end = now_ns() + ATAP_SEC(10);
        assert_int_equal(kill(getpid(), SIGUSR2), 0);
        while (atomic_load(&g_handled) < i) {
            assert_true(now_ns() < end);
            usleep(1000);
        }
        assert_int_equal(atomic_load(&g_handled), i);
    }
    assert_int_equal(atap_wait(t, &s), 0);
    assert_int_equal(atap_join(t, &n, sizeof n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(atomic_load(&g_handled_signo), SIGUSR2);
    assert_true(atap_finished(t));
    atap_release(t);
}

/* Deliveries between a repeat's runs are counted by the next run. */
static void test_signal_repeat_counts_between_runs(void **state)
{
    (void)state;
    atap_task t;
    uint64_t end;

    atomic_store(&g_handled, 0);
    /* a gap of 300 ms between runs: signals sent in it wait for the next */
    assert_int_equal(
        atap_spawn_signal_wait(&t, SIGUSR2, on_usr2, NULL,
                               &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_MS(300)}),
        0);
    assert_int_equal(kill(getpid(), SIGUSR2), 0);
    end = now_ns() + ATAP_SEC(10);
    while (atomic_load(&g_handled) < 1) {
        assert_true(now_ns() < end);
        usleep(1000);
    }
    /* in the gap (or not: each run counts what came since the last), two
     * deliveries; raise() has this thread handle each before it returns,
     * so the kernel merges none */
    for (int i = 0; i < 2; i++)
        assert_int_equal(raise(SIGUSR2), 0);
    while (atomic_load(&g_handled) < 3) {
        assert_true(now_ns() < end);
        usleep(1000);
    }
    assert_int_equal(atomic_load(&g_handled), 3);
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);
}

static _Atomic int g_raise_at_arming;

static void raise_usr1_once(void)
{
    if (atomic_exchange(&g_raise_at_arming, 0))
        raise(SIGUSR1); /* this thread's: handled before raise returns */
}

/* A delivery between the wait's look at the count and its park joining the
 * signal's list (where a plain park drops it, nobody waiting yet) resumes
 * the park at once. The hook raises it at exactly that point. */
static void test_signal_delivery_while_parking(void **state)
{
    (void)state;
    atap_task t;
    uint64_t n = 0;

    if (atap__test_on(ATAP__TEST_PARK_ARMING, raise_usr1_once) != 0)
        skip();
    atomic_store(&g_raise_at_arming, 1);
    assert_int_equal(atap_spawn_signal_wait(&t, SIGUSR1, NULL, NULL, NULL), 0);
    assert_int_equal(atap_join_for(t, &n, sizeof n, ATAP_SEC(10)), 0);
    assert_int_equal(n, 1);
    assert_int_equal(atomic_load(&g_raise_at_arming), 0);
    atap__test_on(ATAP__TEST_PARK_ARMING, NULL);
    atap_release(t);
}

/* Each delivery's sender and code: kill from this process and from a
 * child, sigqueue with a value, raise. */
static void test_signal_info_sender(void **state)
{
    (void)state;
    atap_task t;
    atap_siginfo info, again;
    uint64_t n;
    pid_t pid;
    int status;

    assert_int_equal(atap_spawn_signal_wait_info(&t, SIGUSR1, NULL, NULL, NULL), 0);
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    assert_int_equal(atap_join_for(t, &info, sizeof info, ATAP_SEC(10)), 0);
    atap_release(t);
    assert_int_equal(info.signo, SIGUSR1);
    assert_int_equal(info.code, SI_USER);
    assert_int_equal(info.pid, getpid());
    assert_int_equal(info.uid, getuid());
    assert_int_equal(info.flags, ATAP_SIGINFO_SENDER);
    assert_int_equal(atap_signal_count(SIGUSR1, &n), 0);
    assert_true(info.seq > 0 && info.seq <= n);
    /* The same, read by its number. */
    assert_int_equal(atap_signal_info(SIGUSR1, info.seq, &again), 0);
    assert_int_equal(again.seq, info.seq);
    assert_int_equal(again.signo, info.signo);
    assert_int_equal(again.code, info.code);
    assert_int_equal(again.pid, info.pid);
    assert_int_equal(again.uid, info.uid);
    assert_int_equal(again.flags, info.flags);
    assert_int_equal(atap_signal_info(SIGUSR1, n + 1, &again), ATAP_ENOTREADY);
    assert_int_equal(atap_signal_info(SIGUSR1, 0, &again), ATAP_EINVAL);
    assert_int_equal(atap_signal_info(SIGKILL, 1, &again), ATAP_EINVAL);
    assert_int_equal(atap_signal_info(SIGUSR1, 1, NULL), ATAP_EINVAL);

    /* From another process: the child's pid. */
    assert_int_equal(atap_spawn_signal_wait_info(&t, SIGUSR1, NULL, NULL, NULL), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(kill(getppid(), SIGUSR1) == 0 ? 0 : 1);
    assert_int_equal(atap_join_for(t, &info, sizeof info, ATAP_SEC(10)), 0);
    atap_release(t);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(info.code, SI_USER);
    assert_int_equal(info.pid, pid);
    assert_int_equal(info.flags, ATAP_SIGINFO_SENDER);

    /* sigqueue: its value. */
    assert_int_equal(atap_spawn_signal_wait_info(&t, SIGUSR2, NULL, NULL, NULL), 0);
    assert_int_equal(sigqueue(getpid(), SIGUSR2, (union sigval){.sival_int = 4242}), 0);
    assert_int_equal(atap_join_for(t, &info, sizeof info, ATAP_SEC(10)), 0);
    atap_release(t);
    assert_int_equal(info.signo, SIGUSR2);
    assert_int_equal(info.code, SI_QUEUE);
    assert_int_equal(info.value, 4242);
    assert_int_equal(info.pid, getpid());
    assert_int_equal(info.flags, ATAP_SIGINFO_SENDER);

    /* raise: this thread's (tgkill on Linux). */
    assert_int_equal(atap_spawn_signal_wait_info(&t, SIGUSR2, NULL, NULL, NULL), 0);
    assert_int_equal(raise(SIGUSR2), 0);
    assert_int_equal(atap_join_for(t, &info, sizeof info, ATAP_SEC(10)), 0);
    atap_release(t);
#ifdef SI_TKILL
    assert_int_equal(info.code, SI_TKILL);
#endif
    assert_int_equal(info.pid, getpid());
    assert_int_equal(info.value, 0);
}

/* A child's SIGCHLD: its pid, CLD_EXITED and its exit status. */
static void test_signal_info_child(void **state)
{
    (void)state;
    atap_task t;
    atap_siginfo info;
    pid_t pid;
    int status;

    assert_int_equal(atap_spawn_signal_wait_info(&t, SIGCHLD, NULL, NULL, NULL), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(7);
    assert_int_equal(atap_join_for(t, &info, sizeof info, ATAP_SEC(10)), 0);
    atap_release(t);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(info.signo, SIGCHLD);
    assert_int_equal(info.code, CLD_EXITED);
    assert_int_equal(info.pid, pid);
    assert_int_equal(info.status, 7);
    assert_int_equal(info.uid, getuid());
    assert_int_equal(info.flags, ATAP_SIGINFO_SENDER);
    assert_int_equal(atap_signal_release(SIGCHLD), 0);
}

static _Atomic int g_info_values[8];
static _Atomic int g_info_runs;

static void on_info(const atap_siginfo *info, void *arg)
{
    int i = atomic_fetch_add(&g_info_runs, 1);

    (void)arg;
    if (i < 8)
        atomic_store(&g_info_values[i], info->value);
}

/* Queues sig with value to this process and waits until the handler has
 * counted it: one delivery each, also under TSan, which holds one pending
 * delivery of a signal at a time and merges real-time ones too. */
static void queue_counted(int sig, int value)
{
    uint64_t before, n, end = now_ns() + ATAP_SEC(20);

    assert_int_equal(atap_signal_count(sig, &before), 0);
    assert_int_equal(sigqueue(getpid(), sig, (union sigval){.sival_int = value}), 0);
    for (n = before; n == before; assert_int_equal(atap_signal_count(sig, &n), 0)) {
        assert_true(now_ns() < end);
        sched_yield();
    }
    assert_int_equal(n, before + 1);
}

/* As a repeat, a handler run once per delivery, in order, none skipped:
 * five real-time signals delivered while it waits 200 ms between runs.
 * And what is kept: the last ATAP_SIGINFO_KEPT. */
static void test_signal_info_each_delivery(void **state)
{
    (void)state;
    const int sig = SIGRTMIN + 3;
    atap_task t;
    atap_siginfo info;
    uint64_t base, end;

    atomic_store(&g_info_runs, 0);
    assert_int_equal(atap_spawn_signal_wait_info(
                         &t, sig, on_info, NULL,
                         &(atap_spawn_opts){.kind = ATAP_REPEAT, .every_ns = ATAP_MS(200)}),
                     0);
    for (int i = 1; i <= 5; i++)
        queue_counted(sig, i);
    end = now_ns() + ATAP_SEC(20);
    while (atomic_load(&g_info_runs) < 5) {
        assert_true(now_ns() < end);
        sleep_us(1000);
    }
    sleep_us(300000); /* no sixth */
    assert_int_equal(atomic_load(&g_info_runs), 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(atomic_load(&g_info_values[i]), i + 1);
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);

    /* 40 more: the first 8 are no longer kept, the last 32 are. */
    assert_int_equal(atap_signal_count(sig, &base), 0);
    for (int i = 1; i <= 40; i++)
        queue_counted(sig, 100 + i);
    for (int i = 1; i <= 40; i++) {
        assert_int_equal(atap_signal_info(sig, base + (uint64_t)i, &info), 0);
        assert_int_equal(info.seq, base + (uint64_t)i);
        assert_int_equal(info.signo, sig);
        if (i <= 40 - ATAP_SIGINFO_KEPT) {
            assert_int_equal(info.flags, ATAP_SIGINFO_LOST);
        } else {
            assert_int_equal(info.flags, ATAP_SIGINFO_SENDER);
            assert_int_equal(info.value, 100 + i);
            assert_int_equal(info.code, SI_QUEUE);
        }
    }
    assert_int_equal(atap_signal_release(sig), 0);
}

static void test_signal_refused(void **state)
{
    (void)state;
    atap_task t;

    assert_int_equal(atap_spawn_signal_wait(&t, SIGKILL, NULL, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_signal_wait(&t, SIGSTOP, NULL, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_signal_wait(&t, 0, NULL, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(atap_spawn_signal_wait(&t, NSIG, NULL, NULL, NULL), ATAP_EINVAL);
    assert_int_equal(
        atap_spawn_signal_wait(&t, SIGUSR1, NULL, NULL,
                               &(atap_spawn_opts){.kind = ATAP_AT_RATE, .every_ns = 1000}),
        ATAP_EINVAL);
    assert_int_equal(atap_signal_release(SIGKILL), ATAP_EINVAL);
    assert_int_equal(atap_signal_release(SIGSTOP), ATAP_EINVAL);
}

static void test_signal_release_restores_default(void **state)
{
    (void)state;
    atap_task t;
    struct sigaction old;

    assert_int_equal(atap_spawn_signal_wait(&t, SIGWINCH, NULL, NULL, NULL), 0);
    assert_int_equal(sigaction(SIGWINCH, NULL, &old), 0);
    assert_true(old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    /* Parked first: a run still on its way to its park would take the
     * signal over again as it parks, after the release below. */
    uint64_t until = now_ns() + ATAP_SEC(10);
    while (atap_state_of(t) != ATAP_WAITING && now_ns() < until)
        sleep_us(1000);
    assert_int_equal(atap_state_of(t), ATAP_WAITING);
    assert_int_equal(atap_cancel(t), 0);
    atap_release(t);
    assert_int_equal(atap_signal_release(SIGWINCH), 0);
    assert_int_equal(sigaction(SIGWINCH, NULL, &old), 0);
    assert_true(old.sa_handler == SIG_DFL);
    assert_int_equal(atap_signal_release(SIGWINCH), 0); /* again: nothing to do */

    /* and taken over again by the next wait */
    assert_int_equal(atap_spawn_signal_wait(&t, SIGWINCH, NULL, NULL, NULL), 0);
    assert_int_equal(sigaction(SIGWINCH, NULL, &old), 0);
    assert_true(old.sa_handler != SIG_DFL);
    assert_int_equal(kill(getpid(), SIGWINCH), 0);
    uint64_t n = 0;
    assert_int_equal(atap_join(t, &n, sizeof n), 0);
    assert_int_equal(n, 1);
    atap_release(t);
    assert_int_equal(atap_signal_release(SIGWINCH), 0);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup_runtime, teardown_runtime)
    const struct CMUnitTest tests[] = {
        T(test_process_run_status),
        T(test_process_not_found),
        T(test_process_output_interleaved),
        T(test_process_output_large),
        T(test_process_input),
        T(test_process_dir_env),
        T(test_process_cancel_kills_group),
        T(test_process_timeout_kills_group),
        T(test_process_released_early),
        T(test_process_no_pidfd),
        T(test_process_shutdown_kills),
        T(test_process_many_no_thread_each),
        T(test_process_child_pipes),
        T(test_process_child_signal),
        T(test_process_piped_lines),
        T(test_process_piped_stderr_apart),
        T(test_process_piped_stdin_eof),
        T(test_process_piped_write_to_closed_stdin),
        T(test_process_redirect_file),
        T(test_process_redirect_null),
        T(test_process_kill_grace_then_sigkill),
        T(test_process_kill_term_is_enough),
        T(test_process_cancel_grace),
        T(test_process_timeout_grace_and_shutdown),
        T(test_process_cwd_and_env_set),
        T(test_process_bad_input_leaks_nothing),
        T(test_process_piped_many_no_fd_left),
        T(test_signal_wait_counts),
        T(test_signal_repeat_handler),
        T(test_signal_repeat_counts_between_runs),
        T(test_signal_delivery_while_parking),
        T(test_signal_info_sender),
        T(test_signal_info_child),
        T(test_signal_info_each_delivery),
        T(test_signal_refused),
        T(test_signal_release_restores_default),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}

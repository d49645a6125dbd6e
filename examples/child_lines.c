/*
 * child_lines: a child process fed its input and read line by line, both
 * at once, by tasks that hold no thread while the pipes are full or empty.
 *
 *   child    `tr a-z A-Z`, started by atap_spawn_piped: its stdin and
 *            stdout are pipes, its stderr is ours
 *   feeder   a send task (atap_net_prep_send + atap_net_spawn) writing N
 *            lines into the child's stdin
 *   reader   a task of this program's reading the child's stdout a line at
 *            a time: one task running one recv_until after another with
 *            atap_net_step, parked whenever the pipe is empty
 *   main     joins the feeder, closes the child's stdin
 *            (atap_process_close_stdin: tr then reads its end, flushes and
 *            exits), then joins the reader and the child
 *
 * N lines are far more than a pipe holds (64 KiB on Linux): had main
 * written them all before reading, tr would stop on a full stdout and the
 * writer on a full stdin, for ever. It exits 0 only if every line came
 * back upper-cased and in order, and tr exited 0.
 */
#include <atap.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

enum { N = 20000 };

/* Any failing call ends the example with its name and error. */
static void must(int rc, const char *what)
{
    if (rc != 0) {
        printf("child_lines: %s failed: %s\n", what, atap_strerror(rc));
        exit(1);
    }
}

/* The reader's state: the task's arg, so a run that parks goes on from
 * here when it is run again. */
struct lines {
    atap_net_io io;
    atap_net_reader reader;
    unsigned char buf[256];
    bool reading; /* a recv_until is under way */
    long count;   /* lines read and found right */
    long wrong;   /* lines that were not what was fed, upper-cased */
};

/* Reads lines until the child's stdout ends. Output: the count (a long). */
static int read_lines(atap_ctx *ctx, void *arg, void *out)
{
    struct lines *s = arg;
    char want[64];
    atap_net_out o;

    for (;;) {
        const char *line;
        int rc;

        if (!s->reading) {
            must(atap_net_prep_recv_until(&s->io, &s->reader, "\n", 1, sizeof s->buf),
                 "prep_recv_until");
            s->reading = true;
        }
        if ((rc = atap_net_step(ctx, &s->io, &o)) == ATAP_PARKED)
            return ATAP_PARKED; /* the pipe is empty: run again when it is not */
        s->reading = false;
        if (rc != 0 || o.rc == ATAP_ECLOSED) /* ECLOSED: the child's output ended */
            break;
        if (o.rc != 0)
            return ATAP_EFAILED;
        line = atap_net_reader_data(&s->reader, NULL);
        snprintf(want, sizeof want, "LINE %ld OF THE INPUT\n", s->count);
        if ((size_t)o.n == strlen(want) && memcmp(line, want, (size_t)o.n) == 0)
            s->count++;
        else
            s->wrong++;
        if (s->count <= 3 || s->count == N)
            printf("  read: %.*s", (int)o.n, line);
        atap_net_reader_consume(&s->reader, (size_t)o.n);
    }
    *(long *)out = s->count;
    return 0;
}

int main(void)
{
    static const char *const argv[] = {"tr", "a-z", "A-Z", NULL};
    atap_cmd cmd = {.size = sizeof cmd, .program = "tr", .argv = argv};
    static struct lines reader;
    atap_net_io feed;
    atap_net_out fed;
    atap_child child;
    atap_task proc, feeder, rtask;
    size_t cap = (size_t)N * 32, len = 0;
    char *input = malloc(cap);
    long count = 0;
    int status = -1;

    if (!input)
        return 1;
    for (long i = 0; i < N; i++)
        len += (size_t)snprintf(input + len, cap - len, "line %ld of the input\n", i);
    cmd.stdio[2].how = ATAP_STDIO_INHERIT; /* tr's complaints, if any, to our stderr */
    must(atap_init(NULL), "atap_init");
    must(atap_spawn_piped(&proc, &child, &cmd, NULL), "atap_spawn_piped");
    printf("child_lines: tr is pid %d; feeding it %d lines (%zu bytes)\n", child.pid, N, len);

    must(atap_net_prep_send(&feed, child.in_fd, input, len), "prep_send");
    must(atap_net_spawn(&feeder, &feed, NULL), "spawn feeder");
    must(atap_net_reader_init(&reader.reader, child.out_fd, reader.buf, sizeof reader.buf),
         "reader_init");
    must(atap_spawn(&rtask, read_lines, &reader, &(atap_spawn_opts){.out_size = sizeof(long)}),
         "spawn reader");

    must(atap_net_join(feeder, &fed), "feeder");
    atap_net_release(feeder, &feed);
    must(atap_process_close_stdin(proc), "close_stdin"); /* tr reads its end */
    must(atap_join(rtask, &count, sizeof count), "reader");
    atap_release(rtask);
    must(atap_join(proc, &status, sizeof status), "child");
    atap_release(proc); /* closes the child's pipes */
    atap_shutdown();
    free(input);

    printf("child_lines: fed %lld bytes, read %ld lines right, %ld wrong; tr %s %d\n",
           (long long)fed.n, count, reader.wrong, WIFEXITED(status) ? "exited" : "signalled",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return count == N && reader.wrong == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

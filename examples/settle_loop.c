/*
 * settle_loop: results taken back on an event loop of the program's own,
 * as a libuv, GLib or epoll program would. The loop here is a plain
 * poll(); it never waits for a task, it only watches descriptors.
 *
 * Two ways in:
 *   - atap_settle_fd: each task gets a descriptor that becomes readable
 *     once the task is over; the loop watches it like any socket and takes
 *     the result when it fires.
 *   - atap_on_settle: a callback on a pool thread when the task is over;
 *     it posts the task to the loop through a wake pipe (libuv's
 *     uv_async_send, in miniature), and the loop takes the result.
 *
 * Some tasks compute, one fails and one is cancelled, so the loop sees
 * every way a task ends. It exits 0 only if every result came back as
 * include/atap.h documents.
 */
#define _POSIX_C_SOURCE 200809L
#include <atap.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

enum { N_FD = 6, N_CB = 4, N = N_FD + N_CB, SLOW = 3, BAD = 7 };

static int wake[2]; /* the callbacks' pipe into the loop */

/* A task: sleeps a little, then writes the square of its number. Task BAD
 * fails; task SLOW sleeps until it is cancelled. */
static int square(atap_ctx *ctx, void *arg, void *out)
{
    uint64_t i = (uint64_t)(uintptr_t)arg;

    (void)ctx;
    if (i == BAD)
        return -1;
    atap_sleep(i == SLOW ? ATAP_SEC(60) : ATAP_MS(10 * (N - i)));
    *(uint64_t *)out = i * i;
    return 0;
}

/* On a pool thread: hand the task's number to the loop. A pipe write of
 * a few bytes is atomic, so callbacks on several threads do not mix. */
static void posted(atap_task task, atap_state state, void *arg)
{
    uint32_t i = (uint32_t)(uintptr_t)arg;

    (void)task;
    (void)state;
    while (write(wake[1], &i, sizeof i) < 0 && errno == EINTR)
        continue;
}

/* What the loop does with a task that is over: take its output. Returns
 * 1 when the result is the one expected. */
static int take_back(atap_task t, uint64_t i, const char *how)
{
    uint64_t v = 0;
    int rc = atap_take(t, &v, sizeof v), ok;

    if (i == BAD)
        ok = rc == ATAP_EFAILED;
    else if (i == SLOW)
        ok = rc == ATAP_ECANCELLED;
    else
        ok = rc == 0 && v == i * i;
    printf("%-4s  task %" PRIu64 " by %-8s %s", ok ? "ok" : "FAIL", i, how,
           rc == 0 ? "" : atap_strerror(rc));
    if (rc == 0)
        printf("%" PRIu64, v);
    printf("\n");
    atap_release(t);
    return ok;
}

int main(void)
{
    atap_task tasks[N];
    struct pollfd fds[N_FD + 1];
    int left = N, good = 0;

    if (atap_init(NULL) != 0 || pipe(wake) != 0)
        return 1;
    for (uint64_t i = 0; i < N; i++) {
        if (atap_spawn(&tasks[i], square, (void *)(uintptr_t)i,
                       &(atap_spawn_opts){.out_size = sizeof(uint64_t)}) != 0)
            return 1;
        if (i < N_FD) {
            if (atap_settle_fd(tasks[i], &fds[i].fd) != 0)
                return 1;
            fds[i].events = POLLIN;
        } else if (atap_on_settle(tasks[i], posted, (void *)(uintptr_t)i) != 0) {
            return 1;
        }
    }
    fds[N_FD] = (struct pollfd){.fd = wake[0], .events = POLLIN};
    atap_cancel(tasks[SLOW]); /* its settle fd fires once its sleep is cut short */

    while (left > 0) {
        if (poll(fds, N_FD + 1, 10000) <= 0) {
            printf("FAIL  nothing came back in 10 s\n");
            break;
        }
        for (int i = 0; i < N_FD; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & POLLIN))
                continue;
            close(fds[i].fd); /* readable for good: done with it */
            fds[i].fd = -1;   /* poll skips it from now on */
            good += take_back(tasks[i], (uint64_t)i, "fd");
            left--;
        }
        if (fds[N_FD].revents & POLLIN) {
            uint32_t i;

            if (read(wake[0], &i, sizeof i) == (ssize_t)sizeof i) {
                good += take_back(tasks[i], i, "callback");
                left--;
            }
        }
    }
    close(wake[0]);
    close(wake[1]);
    atap_shutdown();
    printf("%d of %d results back on the loop\n", good, N);
    return good == N ? 0 : 1;
}

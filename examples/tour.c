/*
 * tour: libatap in one sitting. It starts the runtime, spawns tasks, joins
 * them, takes an output, cancels a slow task, reads the pool's numbers and
 * shuts down, printing one line per step. It exits 0 only if every step
 * behaved as include/atap.h documents.
 */
#define _POSIX_C_SOURCE 200809L
#include <atap.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

enum { N = 8 };

static int failures;
static atomic_bool slow_saw_cancel;

/* Prints "ok" or "FAIL" and what the step saw. */
static void step(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%-4s  ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !ok;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A task: writes the square of *arg to its output. */
static int square(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    long n = *(const long *)arg;
    *(long *)out = n * n;
    return 0;
}

/* A slow task: up to 10 s in 1 ms naps, stopping early once cancelled. */
static int slow(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    (void)out;
    for (int i = 0; i < 10000; i++) {
        if (atap_cancelled(ctx)) {
            atomic_store(&slow_saw_cancel, true);
            return 0; /* whatever it returns now, the output is dropped */
        }
        nap_ms(1);
    }
    return 0;
}

int main(void)
{
    long nums[N], v = 0, sum = 0;
    atap_task sq[N], slow_task;
    int rc, spawned = 0, joined = 0;

    rc = atap_init(NULL);
    step(rc == 0, "atap_init(NULL): libatap %s is running", atap_version_string());
    if (rc != 0)
        return 1;

    /* Spawn: the opts name only out_size, so each is a plain one-shot. */
    atap_spawn_opts opts = {.out_size = sizeof(long)};
    for (int i = 0; i < N; i++) {
        nums[i] = i + 1;
        spawned += atap_spawn(&sq[i], square, &nums[i], &opts) == 0;
    }
    step(spawned == N, "spawned %d tasks, each squaring a number", spawned);

    /* Join: wait and copy; the output stays for other readers. */
    for (int i = 0; i < N; i++) {
        if (atap_join(sq[i], &v, sizeof v) == 0 && v == nums[i] * nums[i]) {
            joined++;
            sum += v;
        }
    }
    step(joined == N && sum == 204, "joined all %d: 1^2 + 2^2 + ... + 8^2 = %ld", joined, sum);

    /* Take: moves the output out, once. */
    rc = atap_take(sq[2], &v, sizeof v);
    step(rc == 0 && v == 9, "took the third task's output: %ld", v);
    rc = atap_take(sq[2], &v, sizeof v);
    step(rc == ATAP_ETAKEN, "a second take reads ATAP_ETAKEN: \"%s\"", atap_strerror(rc));
    rc = atap_join(sq[3], &v, sizeof(int));
    step(rc == ATAP_EINVAL, "a join with the wrong size reads ATAP_EINVAL: \"%s\"",
         atap_strerror(rc));

    /* Cancel: wait until the slow task runs, then cancel it. */
    rc = atap_spawn(&slow_task, slow, NULL, NULL);
    for (int i = 0; i < 5000 && atap_state_of(slow_task) == ATAP_PENDING; i++)
        nap_ms(1);
    bool was_running = atap_state_of(slow_task) == ATAP_RUNNING;
    int cancel_rc = atap_cancel(slow_task);
    int join_rc = atap_join(slow_task, NULL, 0);
    step(rc == 0 && was_running && cancel_rc == 0 && join_rc == ATAP_ECANCELLED,
         "cancelled a running slow task: join reads ATAP_ECANCELLED: \"%s\"",
         atap_strerror(join_rc));

    struct atap_pool_stats st = {0};
    rc = atap_pool_stats(&st);
    step(rc == 0 && st.workers >= 1 && st.live == N + 1,
         "pool: %zu workers (peak %zu), %zu live tasks in %zu slots, %" PRIu64 " runs completed",
         st.workers, st.peak_workers, st.live, st.slots, st.completed);

    /* Release: every handle goes back; a released handle names no task. */
    for (int i = 0; i < N; i++)
        atap_release(sq[i]);
    atap_release(slow_task);
    rc = atap_join(sq[0], &v, sizeof v);
    step(rc == ATAP_ENOTASK, "released every handle; an old one reads ATAP_ENOTASK: \"%s\"",
         atap_strerror(rc));

    /* Shutdown waits for running tasks, so the slow task has stopped by now. */
    rc = atap_shutdown();
    atap_pool_stats(&st);
    step(rc == 0 && !atap_initialised() && st.live == 0 && atomic_load(&slow_saw_cancel),
         "atap_shutdown: the slow task saw its cancel and stopped; %zu live tasks left", st.live);

    if (failures) {
        printf("tour: %d step(s) did not behave as documented\n", failures);
        return 1;
    }
    printf("tour: every step behaved as documented\n");
    return 0;
}

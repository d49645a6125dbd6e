/*
 * pipeline: three stages wired together with values between tasks.
 *
 *   produce[i]  a one-shot task whose output is the number i + 1
 *      | atap_forward: each output is given to the matching square task
 *   square[i]   a waiting task: runs once it is given a number, outputs n * n
 *      | atap_receive_all: runs once every square has an output
 *   gather      one task handed all N squares end to end; sums and prints
 *
 * No stage waits on another: every task runs on the pool as soon as its
 * input is there, and main only joins the last one. It exits 0 only if the
 * sum is 1^2 + 2^2 + ... + N^2.
 *
 * To watch it run: ATAP_TRACE=pipeline.json ./build/examples/pipeline, then
 * open pipeline.json at ui.perfetto.dev (README: "Looking inside: traces").
 * The stages are not static, and the program is linked with -rdynamic
 * (ENABLE_EXPORTS in examples/CMakeLists.txt), so that the trace can name
 * them: it finds names with dladdr, which sees only exported symbols.
 */
#include <atap.h>
#include <stdio.h>
#include <stdlib.h>

enum { N = 100 };

/* Any failing call ends the example with its name and error. */
static void must(int rc, const char *what)
{
    if (rc != 0) {
        printf("pipeline: %s failed: %s\n", what, atap_strerror(rc));
        exit(1);
    }
}

int produce(atap_ctx *ctx, void *arg, void *out);
int square(atap_ctx *ctx, void *arg, void *out);
int gather(atap_ctx *ctx, void *arg, void *out);

/* Stage 1, a plain task: its output is the number in *arg. */
int produce(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx;
    *(long *)out = *(const long *)arg;
    return 0;
}

/* Stage 2, a waiting task: atap_input() is the value it was given. */
int square(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    long n = *(const long *)atap_input(ctx, NULL);
    *(long *)out = n * n;
    return 0;
}

/* Stage 3, a receiver: its input is every square's output, in set order. */
int gather(atap_ctx *ctx, void *arg, void *out)
{
    (void)arg;
    size_t size;
    const long *squares = atap_input(ctx, &size);
    long sum = 0;
    for (size_t i = 0; i < size / sizeof(long); i++)
        sum += squares[i];
    printf("gather: %zu squares in, sum %ld\n", size / sizeof(long), sum);
    *(long *)out = sum;
    return 0;
}

int main(void)
{
    static long nums[N];
    atap_task produced[N], squared[N], gatherer;
    long sum = 0, expected = (long)N * (N + 1) * (2 * N + 1) / 6;

    must(atap_init(NULL), "atap_init");

    /* gives = 1: each square, and the gatherer, runs once and is then
     * finished, so joining the gatherer reads that one run's output. */
    atap_spawn_opts once = {.out_size = sizeof(long), .gives = 1};

    /* Stages 1 and 2: a producer per number, forwarded into its square.
     * A producer that has already finished is handed over at once. */
    for (int i = 0; i < N; i++) {
        nums[i] = i + 1;
        must(atap_spawn(&produced[i], produce, &nums[i],
                        &(atap_spawn_opts){.out_size = sizeof(long)}),
             "atap_spawn");
        must(atap_spawn_waiting(&squared[i], square, NULL, sizeof(long), &once),
             "atap_spawn_waiting");
        must(atap_forward(produced[i], squared[i]), "atap_forward");
    }

    /* Stage 3: one task fed by all N squares (outputs already there count). */
    must(atap_receive_all(&gatherer, gather, NULL, squared, N, &once), "atap_receive_all");

    /* main joins only the end of the pipeline. */
    must(atap_join(gatherer, &sum, sizeof sum), "atap_join");
    printf("main: 1^2 + 2^2 + ... + %d^2 = %ld (expected %ld)\n", N, sum, expected);

    /* Every handle goes back once; the forwards hold only slots. */
    for (int i = 0; i < N; i++) {
        atap_release(produced[i]);
        atap_release(squared[i]);
    }
    atap_release(gatherer);
    must(atap_shutdown(), "atap_shutdown");
    return sum == expected ? 0 : 1;
}

/* Cleanup handlers across stacks set aside, on whatever C library the
 * program is built with (tests/consumers.sh: glibc, and musl where
 * musl-gcc is found). A stack keeps its own pthread_cleanup_push chain, so
 * two tasks on one worker that each push a handler, then wait (each wait
 * sets its stack aside), and pop it without running it once their waits
 * are over, in the other order, leave the thread's chain as it was. A task
 * that then ends the thread (pthread_exit) runs no handler of theirs and
 * reads no frame that is gone; the pool goes on and shuts down clean.
 * Exits 0, or the number of the step that went wrong. */
#include <atap.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

static atomic_int handlers_run;
static atap_task gate[2];

static void handler(void *arg)
{
    (void)arg;
    atomic_fetch_add(&handlers_run, 1);
}

static int waiter(atap_ctx *ctx, void *arg, void *out)
{
    int rc;
    (void)ctx, (void)out;
    pthread_cleanup_push(handler, NULL);
    rc = atap_join(gate[(intptr_t)arg], NULL, 0);
    pthread_cleanup_pop(0);
    return rc;
}

static int given(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    return 0;
}

static int ends_thread(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg, (void)out;
    pthread_exit(NULL);
}

static int after(atap_ctx *ctx, void *arg, void *out)
{
    (void)ctx, (void)arg;
    *(int *)out = 42;
    return 0;
}

int main(void)
{
    atap_config config = {0};
    atap_spawn_opts out_int = atap_spawn_opts_out(sizeof(int));
    atap_task w[2], t;
    int v = 0;
    char one = 1;

    config.size = sizeof config;
    config.workers = 1;
    if (atap_init(&config) != 0)
        return 1;
    for (intptr_t i = 0; i < 2; i++)
        if (atap_spawn_waiting(&gate[i], given, NULL, 1, NULL) != 0)
            return 2;
    /* Each waiter's stack set aside before the next is spawned. */
    for (intptr_t i = 0; i < 2; i++) {
        struct atap_pool_stats st;
        if (atap_spawn(&w[i], waiter, (void *)i, NULL) != 0)
            return 3;
        do
            atap_pool_stats(&st);
        while (st.aside < (size_t)i + 1);
    }
    /* The first set aside goes on (and pops) first. */
    for (int i = 0; i < 2; i++)
        if (atap_give(gate[i], &one, 1) != 0 || atap_join(w[i], NULL, 0) != 0)
            return 4;
    if (atap_spawn(&t, ends_thread, NULL, NULL) != 0 || atap_join(t, NULL, 0) == 0)
        return 5;
    atap_release(t);
    if (atap_spawn(&t, after, NULL, &out_int) != 0 || atap_join(t, &v, sizeof v) != 0 || v != 42)
        return 6;
    atap_release(t);
    for (int i = 0; i < 2; i++) {
        atap_release(w[i]);
        atap_release(gate[i]);
    }
    if (atap_shutdown() != 0)
        return 7;
    if (atomic_load(&handlers_run) != 0) {
        printf("%d popped handlers ran\n", atomic_load(&handlers_run));
        return 8;
    }
    return 0;
}

/* A consumer of atap.h, valid as C (C99 and later) and as C++ (C++11 and
 * later): tests/consumers.sh builds it every way a user might, with
 * -Wall -Wextra -Werror -pedantic. Exits 0 after a spawn, a join, the
 * header's inline atap_status / atap_pool_stats (their size passed to the
 * library), a version no older than the header's, and a clean shutdown. */
#include <atap.h>
#include <stdio.h>

static int square(atap_ctx *ctx, void *arg, void *out)
{
    long n = *(const long *)arg;
    (void)ctx;
    *(long *)out = n * n;
    return 0;
}

int main(void)
{
    struct atap_status st;
    struct atap_pool_stats ps;
    atap_task t = ATAP_NO_TASK;
    atap_spawn_opts opts = ATAP_SPAWN_OPTS_INIT;
    atap_spawn_opts plain = atap_spawn_opts_out(sizeof(long));
    long n = 7, v = 0, w = 0;
    opts.out_size = sizeof(long);
    opts.timeout_ns = ATAP_SEC(10);
    if (atap_init(NULL) != 0 || atap_spawn(&t, square, &n, &opts) != 0)
        return 1;
    if (atap_join(t, &v, sizeof v) != 0)
        return 1;
    if (atap_status(&st) != 0 || !st.initialised || st.size != sizeof st ||
        atap_pool_stats(&ps) != 0 || ps.workers == 0 || ps.size != sizeof ps ||
        atap_version_hex() < ATAP_VERSION_HEX)
        return 1;
    atap_release(t);
    if (atap_spawn(&t, square, &v, &plain) != 0 || atap_join(t, &w, sizeof w) != 0)
        return 1;
    atap_release(t);
    t = ATAP_NO_TASK;
    if (atap_shutdown() != 0 || t.id != 0 || v != 49 || w != 2401)
        return 1;
    printf("libatap %s: 7^2 = %ld, 49^2 = %ld\n", atap_version_string(), v, w);
    return 0;
}

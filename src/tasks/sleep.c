/*
 * The sleep task: parks on a timer until its deadline (counted from the
 * spawn), so a million sleepers hold a million slots and no thread. In
 * precise mode it parks until 500 us before the deadline and spins the
 * rest, which the timer's tick (65 us) and the kernel's wake-up lateness
 * would otherwise add.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../abi.h"
#include "../atomics.h"
#include "atap.h"

#define SPIN_NS 500000u

struct sleeper {
    uint64_t start, deadline;
    bool precise;
};

static int sleep_run(atap_ctx *ctx, void *arg, void *out)
{
    struct sleeper *z = arg;
    uint64_t now = atap_now(), slept;

    if (now < z->deadline && z->precise && z->deadline - now <= SPIN_NS) {
        while ((now = atap_now()) < z->deadline && !atap_cancelled(ctx))
            cpu_relax();
    }
    if (now < z->deadline) {
        uint64_t wake = z->precise ? z->deadline - SPIN_NS : z->deadline;
        if (atap_park_until(ctx, wake) != 0)
            return ATAP_EFAILED;
        return ATAP_PARKED;
    }
    slept = now - z->start;
    memcpy(out, &slept, sizeof slept);
    return 0;
}

int atap_spawn_sleep(atap_task *task, uint64_t ns, bool precise, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    struct sleeper *z;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if ((o.out_size != 0 && o.out_size != sizeof(uint64_t)) || o.kind != ATAP_ONCE || o.arg_free ||
        o.out_free)
        return ATAP_EINVAL;
    if (!(z = malloc(sizeof *z)))
        return -ENOMEM;
    z->start = atap_now();
    z->deadline = ns >= UINT64_MAX - z->start ? UINT64_MAX : z->start + ns;
    z->precise = precise;
    o.out_size = sizeof(uint64_t);
    o.arg_free = free;
    if ((rc = atap_spawn(task, sleep_run, z, &o)) != 0)
        free(z);
    return rc;
}

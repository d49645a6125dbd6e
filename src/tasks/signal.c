/*
 * Signals as tasks: a wait (a handler, as a repeat) and a send, on the
 * public API alone.
 *
 * libatap's handler counts every delivery of a signal it catches
 * (atap_signal_count). A wait task takes the signal over at its spawn and
 * keeps the count it saw then; each run outputs how far the count moved
 * since, and moves its mark. A run with nothing new parks on the signal
 * with the count it saw (atap_park_signal_since), so a delivery that
 * comes between its look and its park resumes it at once instead of being
 * dropped as an unwatched signal is. Deliveries between a repeat's runs
 * are so counted by the next run.
 *
 * A wait for infos (atap_spawn_signal_wait_info) keeps the same mark but
 * moves it by one a run: each run takes the delivery after its mark and
 * reads what the handler kept of it (atap_signal_info, by its number).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "../abi.h"
#include "atap.h"

struct sigwait {
    int signo;
    uint64_t seen; /* the count at the last output (at first: at the spawn) */
    atap_signal_fn *fn;
    atap_siginfo_fn *info_fn; /* a wait for infos: a delivery a run */
    void *fn_arg;
};

/* The count now, into *now; ATAP_PARKED (return it) when nothing new came
 * since the mark, parked with the count seen; 0 when something did. */
static int look(atap_ctx *ctx, struct sigwait *w, uint64_t *now)
{
    if (atap_signal_count(w->signo, now) != 0)
        return ATAP_EFAILED;
    if (*now != w->seen)
        return 0;
    if (atap_park_signal_since(ctx, w->signo, *now, ATAP_FOREVER) != 0)
        return ATAP_EFAILED;
    return ATAP_PARKED;
}

static int wait_run(atap_ctx *ctx, void *arg, void *out)
{
    struct sigwait *w = arg;
    uint64_t now, n;
    int rc;

    if ((rc = look(ctx, w, &now)) != 0)
        return rc;
    n = now - w->seen;
    w->seen = now;
    if (w->fn)
        w->fn(w->signo, n, w->fn_arg);
    if (out)
        memcpy(out, &n, sizeof n);
    return 0;
}

/* The next delivery after the mark: its info is the run's output. */
static int wait_info_run(atap_ctx *ctx, void *arg, void *out)
{
    struct sigwait *w = arg;
    atap_siginfo info;
    uint64_t now;
    int rc;

    if ((rc = look(ctx, w, &now)) != 0)
        return rc;
    if (atap_signal_info(w->signo, w->seen + 1, &info) != 0)
        return ATAP_EFAILED;
    w->seen++;
    if (w->info_fn)
        w->info_fn(&info, w->fn_arg);
    if (out)
        memcpy(out, &info, sizeof info);
    return 0;
}

/* A wait of either kind: run (wait_run, wait_info_run) outputs out_size
 * bytes. */
static int spawn_wait(atap_task *task, int signo, atap_fn *run, struct sigwait proto,
                      size_t out_size, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    struct sigwait *w;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (signo <= 0 || signo >= NSIG || (o.kind != ATAP_ONCE && o.kind != ATAP_REPEAT) ||
        (o.out_size != 0 && o.out_size != out_size) || o.arg_free || o.out_free || o.gives ||
        o.in_free)
        return ATAP_EINVAL;
    if (!atap_initialised())
        return ATAP_ENOTINIT;
    if (!(w = malloc(sizeof *w)))
        return -ENOMEM;
    *w = proto;
    w->signo = signo;
    /* Caught from here, and counted from the count now: every delivery
     * after this call is the task's. */
    if ((rc = atap_signal_count(signo, &w->seen)) != 0) {
        free(w);
        return rc;
    }
    o.out_size = out_size;
    o.arg_free = free;
    if ((rc = atap_spawn(task, run, w, &o)) != 0)
        free(w);
    return rc;
}

int atap_spawn_signal_wait(atap_task *task, int signo, atap_signal_fn *fn, void *fn_arg,
                           const atap_spawn_opts *opts)
{
    return spawn_wait(task, signo, wait_run, (struct sigwait){.fn = fn, .fn_arg = fn_arg},
                      sizeof(uint64_t), opts);
}

int atap_spawn_signal_wait_info(atap_task *task, int signo, atap_siginfo_fn *fn, void *fn_arg,
                                const atap_spawn_opts *opts)
{
    return spawn_wait(task, signo, wait_info_run, (struct sigwait){.info_fn = fn, .fn_arg = fn_arg},
                      sizeof(atap_siginfo), opts);
}

struct sigsend {
    int pid, signo;
};

static int send_run(atap_ctx *ctx, void *arg, void *out)
{
    struct sigsend *s = arg;

    (void)ctx, (void)out;
    return kill((pid_t)s->pid, s->signo) == 0 ? 0 : ATAP_EFAILED;
}

int atap_spawn_signal_send(atap_task *task, int pid, int signo, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    struct sigsend *s;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (atap__opts_copy(opts, &o) != 0) /* in this library's layout (abi.h) */
        return ATAP_EINVAL;
    if (pid == 0 || pid == -1 || signo < 0 || signo >= NSIG || o.kind != ATAP_ONCE || o.out_size ||
        o.arg_free || o.out_free || o.gives || o.in_free)
        return ATAP_EINVAL;
    if (!(s = malloc(sizeof *s)))
        return -ENOMEM;
    s->pid = pid;
    s->signo = signo;
    o.arg_free = free;
    if ((rc = atap_spawn(task, send_run, s, &o)) != 0)
        free(s);
    return rc;
}

/*
 * Settle listeners (dataflow_int.h has what the dataflow files share):
 * being told that a task is over without waiting for it, by a callback
 * (atap_on_settle) or by an fd a foreign event loop watches
 * (atap_settle_fd).
 *
 * Each registration is a reg of kind REG_SETTLE on the task's forward list
 * (forward.c), with no target: it is handed no output, and hears only the
 * list's close, which forward.c's protocol makes come exactly once, when
 * the task's RUN reference goes (it ended ready, failed, cancelled or
 * timed out, a repeat's series ended, a waiting task was let go), or at
 * once in atap__flow_attach for a task over already. So the state read at
 * the close is final but for READY -> TAKEN, and no run of the task is
 * under way any more. A registration holds neither a handle nor the slot:
 * while listed, the task's own RUN keeps the slot; during the close, the
 * closer's listener (forward.c); after it, nothing of the task is read.
 *
 * What the close does, on the closing thread, which holds none of the
 * task's locks (it may be a worker, a blocking thread, the manager, or a
 * thread in atap_release, atap_cancel or atap_shutdown):
 *   a callback: a small task is spawned that calls it, so user code runs
 *     on a pool thread, never inside the runtime's own paths. If the spawn
 *     is refused (no runtime: a shutdown's last let-go, after the door
 *     shut; -ENOMEM), the callback runs right there instead, so it runs
 *     once whatever happens, and a shutdown's before atap_shutdown returns.
 *   an fd: one write to the kernel object, and our own descriptors go. We
 *     keep a descriptor of our own for the write (the caller may close
 *     theirs at any time, and the number be reused): an eventfd's dup, or a
 *     pipe's write end together with a dup of its read end, so the write
 *     never meets a pipe with no reader (no EPIPE, no SIGPIPE).
 */
#include "dataflow.h"
#include "dataflow_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

#include "atap.h"
#include "executor.h"
#include "slot.h"

struct settle {
    struct reg reg;     /* first: the reg forward.c lists (REG_SETTLE) */
    atap_settle_fn *fn; /* the callback; NULL for an fd */
    void *arg;
    atap_task task;   /* as registered: what the callback is handed */
    atap_state state; /* read at the close */
    int keep[2];      /* an fd's: ours to write to, and a pipe's read end (or -1) */
};

/* ---- callbacks ----------------------------------------------------------- */

static int settle_run(atap_ctx *ctx, void *arg, void *out)
{
    struct settle *st = arg;

    (void)ctx;
    (void)out;
    st->fn(st->task, st->state, st->arg);
    return 0; /* the record goes with the task (arg_free) */
}

static void tell(struct settle *st)
{
    /* Nobody reads it: it runs, then goes. */
    if (atap_spawn_detached(settle_run, st, &(atap_spawn_opts){.arg_free = free}) == 0)
        return;
    st->fn(st->task, st->state, st->arg);
    free(st);
}

/* ---- fds ----------------------------------------------------------------- */

static void keep_close(struct settle *st)
{
    for (int i = 0; i < 2; i++)
        if (st->keep[i] >= 0)
            close(st->keep[i]);
}

/* Makes the caller's fd readable for good: one write, which cannot find
 * the object full (it is written once) nor, for a pipe, without a reader
 * (keep[1] is one). */
static void ring(struct settle *st)
{
#if defined(__linux__)
    uint64_t one = 1;
#else
    unsigned char one = 1;
#endif

    while (write(st->keep[0], &one, sizeof one) < 0 && errno == EINTR)
        continue;
    keep_close(st);
    free(st);
}

#if !defined(__linux__)
static int cloexec_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 || fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return 0;
}
#endif

/* The caller's fd in *fd, ours in st->keep; -errno with nothing open. */
static int fd_open(struct settle *st, int *fd)
{
#if defined(__linux__)
    int e = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), rc;

    if (e < 0)
        return -errno;
    if ((st->keep[0] = fcntl(e, F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = -errno;
        close(e);
        return rc;
    }
    st->keep[1] = -1;
    *fd = e;
    return 0;
#else
    int p[2], rc;

    if (pipe(p) < 0)
        return -errno;
    if ((rc = cloexec_nonblock(p[0])) != 0 || (rc = cloexec_nonblock(p[1])) != 0 ||
        (st->keep[1] = fcntl(p[0], F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = rc ? rc : -errno;
        close(p[0]);
        close(p[1]);
        return rc;
    }
    st->keep[0] = p[1];
    *fd = p[0];
    return 0;
#endif
}

/* ---- the close, and the calls -------------------------------------------- */

void atap__settle_closed(struct reg *r, struct atap_slot *s)
{
    struct settle *st = (struct settle *)r;
    /* Acquire: the transition that ended the task (and the output it
     * published) is seen; the callback's own reads acquire again. */
    uint32_t state = word_state(ld_acquire(&s->word));

    /* RUN went with the task ended, so the word reads a final state. */
    st->state = state_terminal(state) ? (atap_state)state : ATAP_FAILED;
    if (st->fn)
        tell(st);
    else
        ring(st);
}

/* A record for the task t; NULL on -ENOMEM. */
static struct settle *settle_new(atap_task t, atap_settle_fn *fn, void *arg)
{
    struct settle *st = calloc(1, sizeof *st);

    if (!st)
        return NULL;
    st->reg.kind = REG_SETTLE;
    st->fn = fn;
    st->arg = arg;
    st->task = t;
    st->keep[0] = st->keep[1] = -1;
    return st;
}

int atap_on_settle(atap_task task, atap_settle_fn *fn, void *arg)
{
    uint32_t index, gen;
    struct atap_slot *s;
    struct settle *st;
    int rc;

    if (!fn)
        return ATAP_EINVAL;
    if (!(s = atap__exec_live(task, &index, &gen)))
        return ATAP_ENOTASK;
    if (!(st = settle_new(task, fn, arg)))
        return -ENOMEM;
    if ((rc = atap__flow_attach(s, gen, &st->reg)) != 0)
        free(st); /* not listed, not closed: still ours */
    return rc;
}

int atap_settle_fd(atap_task task, int *fd)
{
    uint32_t index, gen;
    struct atap_slot *s;
    struct settle *st;
    int rc, mine = -1;

    if (!fd)
        return ATAP_EINVAL;
    *fd = -1;
    if (!(s = atap__exec_live(task, &index, &gen)))
        return ATAP_ENOTASK;
    if (!(st = settle_new(task, NULL, NULL)))
        return -ENOMEM;
    if ((rc = fd_open(st, &mine)) != 0) {
        free(st);
        return rc;
    }
    if ((rc = atap__flow_attach(s, gen, &st->reg)) != 0) {
        close(mine);
        keep_close(st);
        free(st);
        return rc;
    }
    *fd = mine; /* readable already if the task was over: attach rang it */
    return 0;
}

/*
 * Channels: MPMC FIFO queues of fixed-size values, each value received
 * exactly once, with receive (and, when bounded, send) as tasks that park
 * rather than hold a thread.
 *
 * Everything of a channel is under its mutex: the ring of values, the
 * counts of senders and receivers, and the lists of parked tasks. The ends
 * are counted: the opener's sender and receiver, every added one, and each
 * send or receive task while it lives (its arg_free lets go). The channel
 * is freed when both counts reach 0.
 *
 * A task that finds nothing to do joins a waiter list with its waker and
 * parks (atap_park_wake); whoever makes progress possible for it (a value,
 * room, the last sender or receiver going) takes waiters off the list and
 * wakes them after the mutex is let go. A woken task looks again under the
 * mutex, and parks again if it must, so a wake that finds nothing to do is
 * harmless. A waiter whose task has ended (cancelled while parked) is
 * skipped: the wake reports it woke nothing, and the next one is tried, so
 * a value is never left with a live receiver asleep; and such waiters at
 * the head of a list go whenever a new one joins it, so a list is never
 * much longer than the tasks that wait on it.
 *
 * User callbacks (elem_free) never run under the mutex: the last
 * receiver's close moves the values left out (a copy, or with no memory
 * for one the ring itself, leaving the channel an empty ring that a later
 * send grows again) and frees them after it.
 *
 * Every value handed to elem_free is aligned as atap.h promises every
 * pointer it hands to user code (atap_fn): for any type of its size. The
 * ring and a close's copy keep their values `stride` apart (elem rounded
 * up to alignof(max_align_t)) in malloc'd memory, and a send task keeps
 * its value at an aligned offset of its malloc'd argument, which is more
 * than that promise; a received output nobody took is the task's output,
 * aligned by the executor to the promise alone (24 bytes: 8).
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../abi.h"
#include "../faults.h"
#include "atap.h"

struct waiter {
    struct waiter *next;
    atap_waker waker;
};

struct waiters {
    struct waiter *head, *tail;
};

struct atap_chan {
    pthread_mutex_t lock;
    size_t elem, cap; /* cap 0: unbounded */
    size_t stride;    /* a value's place in the ring: elem, aligned up */
    void (*elem_free)(void *);
    unsigned char *ring;
    size_t ring_cap, head, len;
    size_t senders, receivers;
    struct waiters recv_wait, send_wait;
};

struct send_arg {
    atap_chan *ch;
    bool sent;
    _Alignas(max_align_t) unsigned char value[]; /* elem_free may read it as its type */
};

#define VALUE_ALIGN _Alignof(max_align_t)

/* ---- the ring and the waiters (lock held) -------------------------------- */

static unsigned char *at(atap_chan *ch, size_t i)
{
    return ch->ring + ((ch->head + i) % ch->ring_cap) * ch->stride;
}

static int push(atap_chan *ch, const void *value)
{
    if (ch->len == ch->ring_cap) { /* grow, keeping the order: unbounded, or a
                                      bounded ring its last receiver took */
        size_t cap = ch->ring_cap ? ch->ring_cap * 2 : ch->cap ? ch->cap : 16;
        unsigned char *r;

        if (cap > SIZE_MAX / ch->stride || !(r = malloc(cap * ch->stride)))
            return -ENOMEM;
        for (size_t i = 0; i < ch->len; i++)
            memcpy(r + i * ch->stride, at(ch, i), ch->elem);
        free(ch->ring);
        ch->ring = r;
        ch->ring_cap = cap;
        ch->head = 0;
    }
    memcpy(at(ch, ch->len), value, ch->elem);
    ch->len++;
    return 0;
}

static void pop(atap_chan *ch, void *out)
{
    if (out)
        memcpy(out, at(ch, 0), ch->elem);
    ch->head = (ch->head + 1) % ch->ring_cap;
    ch->len--;
}

static struct waiter *take_one(struct waiters *l);

static int wait_on(struct waiters *l, atap_ctx *ctx)
{
    struct waiter *w;

    /* Waiters whose tasks ended while parked (a short receive timeout on a
     * quiet channel, say) go as new ones come, not only when a wake
     * reaches them: the list stays as long as the tasks that wait. */
    while (l->head && !atap_waker_live(l->head->waker))
        free(take_one(l));
    if (!(w = malloc(sizeof *w)))
        return -ENOMEM;
    w->next = NULL;
    w->waker = atap_waker_of(ctx);
    if (l->tail)
        l->tail->next = w;
    else
        l->head = w;
    l->tail = w;
    return 0;
}

static struct waiter *take_one(struct waiters *l)
{
    struct waiter *w = l->head;

    if (w && !(l->head = w->next))
        l->tail = NULL;
    if (w)
        w->next = NULL;
    return w;
}

static struct waiter *take_all(struct waiters *l)
{
    struct waiter *w = l->head;

    l->head = l->tail = NULL;
    return w;
}

/* After the lock: wakes each waiter in the list and frees it. */
static void wake_list(struct waiter *w)
{
    while (w) {
        struct waiter *next = w->next;
        atap_wake(w->waker);
        free(w);
        w = next;
    }
}

/* Wakes the first waiter of l whose task still waits; takes the lock for
 * each try, since a wake happens with it let go. */
static void wake_one(atap_chan *ch, struct waiters *l)
{
    for (;;) {
        struct waiter *w;
        bool woke;

        pthread_mutex_lock(&ch->lock);
        w = take_one(l);
        pthread_mutex_unlock(&ch->lock);
        if (!w)
            return;
        woke = atap_wake(w->waker);
        free(w);
        if (woke)
            return;
    }
}

/* ---- ends --------------------------------------------------------------- */

static void chan_free(atap_chan *ch)
{
    while (ch->len) {
        if (ch->elem_free)
            ch->elem_free(at(ch, 0));
        pop(ch, NULL);
    }
    wake_list(take_all(&ch->recv_wait));
    wake_list(take_all(&ch->send_wait));
    free(ch->ring);
    pthread_mutex_destroy(&ch->lock);
    free(ch);
}

int atap_chan_open(atap_chan **out, size_t elem_size, size_t capacity, void (*elem_free)(void *))
{
    atap_chan *ch;
    size_t stride;

    if (!out)
        return ATAP_EINVAL;
    *out = NULL;
    if (elem_size == 0 || elem_size > UINT32_MAX)
        return ATAP_EINVAL;
    stride = (elem_size + VALUE_ALIGN - 1) / VALUE_ALIGN * VALUE_ALIGN; /* <= 2^32 + 15 */
    if (capacity && capacity > SIZE_MAX / stride)
        return ATAP_EINVAL;
    if (!(ch = calloc(1, sizeof *ch)))
        return -ENOMEM;
    pthread_mutex_init(&ch->lock, NULL);
    ch->elem = elem_size;
    ch->stride = stride;
    ch->cap = capacity;
    ch->elem_free = elem_free;
    ch->senders = ch->receivers = 1;
    if (capacity && !(ch->ring = malloc(capacity * stride))) {
        pthread_mutex_destroy(&ch->lock);
        free(ch);
        return -ENOMEM;
    }
    ch->ring_cap = capacity;
    *out = ch;
    return 0;
}

static int add_end(atap_chan *ch, size_t *count)
{
    int rc = 0;

    pthread_mutex_lock(&ch->lock);
    if (*count == SIZE_MAX)
        rc = ATAP_EINVAL;
    else
        (*count)++;
    pthread_mutex_unlock(&ch->lock);
    return rc;
}

int atap_chan_add_sender(atap_chan *ch) { return ch ? add_end(ch, &ch->senders) : ATAP_EINVAL; }

int atap_chan_add_receiver(atap_chan *ch) { return ch ? add_end(ch, &ch->receivers) : ATAP_EINVAL; }

void atap_chan_close_sender(atap_chan *ch)
{
    struct waiter *wake = NULL;
    bool gone;

    if (!ch)
        return;
    pthread_mutex_lock(&ch->lock);
    if (--ch->senders == 0) /* receivers drain, then read ECLOSED */
        wake = take_all(&ch->recv_wait);
    gone = ch->senders == 0 && ch->receivers == 0;
    pthread_mutex_unlock(&ch->lock);
    wake_list(wake);
    if (gone)
        chan_free(ch);
}

void atap_chan_close_receiver(atap_chan *ch)
{
    struct waiter *wake = NULL;
    unsigned char *drop = NULL;
    size_t ndrop = 0, drop_cap = 0, drop_head = 0, stride;
    void (*elem_free)(void *);
    bool gone;

    if (!ch)
        return;
    pthread_mutex_lock(&ch->lock);
    /* Read under the lock: once it is let go the last sender may free ch. */
    stride = ch->stride;
    elem_free = ch->elem_free;
    if (--ch->receivers == 0) {
        /* Nothing can be received now: values left go, senders hear. The
         * values are moved out, to go to elem_free after the lock (a user
         * callback, never under it): copied, or with no memory for that,
         * the ring itself is taken. Nothing is pushed into the ring with
         * no receiver; a send after one is added again starts a new ring. */
        if (ch->len && elem_free) {
            if ((drop = FAULT_MALLOC(ch->len * stride)) != NULL) {
                for (drop_cap = ch->len; ch->len; ndrop++)
                    pop(ch, drop + ndrop * stride);
            } else {
                drop = ch->ring;
                drop_cap = ch->ring_cap;
                drop_head = ch->head;
                ndrop = ch->len;
                ch->ring = NULL;
                ch->ring_cap = ch->head = ch->len = 0;
            }
        }
        while (ch->len)
            pop(ch, NULL);
        wake = take_all(&ch->send_wait);
    }
    gone = ch->senders == 0 && ch->receivers == 0;
    pthread_mutex_unlock(&ch->lock);
    /* Ours alone now: a copy, or a ring ch no longer points to. */
    for (size_t i = 0; i < ndrop; i++)
        elem_free(drop + ((drop_head + i) % drop_cap) * stride);
    free(drop);
    wake_list(wake);
    if (gone)
        chan_free(ch);
}

size_t atap_chan_len(atap_chan *ch)
{
    size_t n;

    if (!ch)
        return 0;
    pthread_mutex_lock(&ch->lock);
    n = ch->len;
    pthread_mutex_unlock(&ch->lock);
    return n;
}

/* ---- sending -------------------------------------------------------------- */

/* Lock held: 0 (queued, a receiver to wake), ATAP_ECLOSED, ATAP_ENOTREADY
 * (full), -ENOMEM. */
static int offer(atap_chan *ch, const void *value)
{
    if (ch->receivers == 0)
        return ATAP_ECLOSED;
    if (ch->cap && ch->len == ch->cap)
        return ATAP_ENOTREADY;
    return push(ch, value);
}

int atap_chan_send(atap_chan *ch, const void *value)
{
    int rc;

    if (!ch || !value)
        return ATAP_EINVAL;
    pthread_mutex_lock(&ch->lock);
    rc = offer(ch, value);
    pthread_mutex_unlock(&ch->lock);
    if (rc == 0)
        wake_one(ch, &ch->recv_wait);
    else if (rc == ATAP_ECLOSED && ch->elem_free)
        ch->elem_free((void *)value); /* released, as promised */
    return rc;
}

static int send_run(atap_ctx *ctx, void *arg, void *out)
{
    struct send_arg *a = arg;
    atap_chan *ch = a->ch;
    bool room;
    int rc;

    (void)out;
    if (atap_cancelled(ctx)) { /* woken, then stopped: the room goes on */
        pthread_mutex_lock(&ch->lock);
        room = ch->len < ch->cap;
        pthread_mutex_unlock(&ch->lock);
        if (room)
            wake_one(ch, &ch->send_wait);
        return ATAP_ECANCELLED;
    }
    pthread_mutex_lock(&ch->lock);
    if ((rc = offer(ch, a->value)) == ATAP_ENOTREADY) {
        /* The park first: a wake that comes once the waker is listed
         * finds its record. */
        if (atap_park_wake(ctx, ATAP_FOREVER) != 0 || wait_on(&ch->send_wait, ctx) != 0)
            rc = -ENOMEM;
        else
            rc = ATAP_PARKED;
    }
    a->sent = rc == 0;
    pthread_mutex_unlock(&ch->lock);
    if (rc == 0)
        wake_one(ch, &ch->recv_wait);
    return rc == -ENOMEM ? ATAP_EFAILED : rc;
}

static void send_arg_free(void *arg)
{
    struct send_arg *a = arg;

    if (!a->sent && a->ch->elem_free)
        a->ch->elem_free(a->value); /* never sent: released */
    atap_chan_close_sender(a->ch);
    free(a);
}

/* The options of a channel task: only what makes sense for one. */
static int task_opts(const atap_spawn_opts *in, atap_spawn_opts *o)
{
    if (atap__opts_copy(in, o) != 0 || o->kind != ATAP_ONCE || o->arg_free || o->out_free ||
        o->in_free || o->gives)
        return ATAP_EINVAL;
    return 0;
}

int atap_chan_spawn_send(atap_task *task, atap_chan *ch, const void *value,
                         const atap_spawn_opts *opts)
{
    struct send_arg *a;
    atap_spawn_opts o;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (!ch || !value || (rc = task_opts(opts, &o)) != 0 || o.out_size)
        return ATAP_EINVAL;
    if (!(a = malloc(sizeof *a + ch->elem)))
        return -ENOMEM;
    a->ch = ch;
    a->sent = false;
    memcpy(a->value, value, ch->elem);
    if ((rc = atap_chan_add_sender(ch)) != 0) {
        free(a);
        return rc;
    }
    o.arg_free = send_arg_free;
    if ((rc = atap_spawn(task, send_run, a, &o)) != 0) {
        atap_chan_close_sender(ch);
        free(a); /* the value stays the caller's */
    }
    return rc;
}

/* ---- receiving ------------------------------------------------------------ */

static int recv_run(atap_ctx *ctx, void *arg, void *out)
{
    atap_chan *ch = arg;
    bool room = false, more;
    int rc = 0;

    if (atap_cancelled(ctx)) { /* woken, then stopped: the value goes on */
        pthread_mutex_lock(&ch->lock);
        more = ch->len > 0;
        pthread_mutex_unlock(&ch->lock);
        if (more)
            wake_one(ch, &ch->recv_wait);
        return ATAP_ECANCELLED;
    }
    pthread_mutex_lock(&ch->lock);
    if (ch->len) {
        pop(ch, out);
        room = ch->cap != 0;
    } else if (ch->senders == 0) {
        rc = ATAP_ECLOSED; /* drained, and nothing more can come */
    } else if (atap_park_wake(ctx, ATAP_FOREVER) != 0 || wait_on(&ch->recv_wait, ctx) != 0) {
        rc = ATAP_EFAILED;
    } else {
        rc = ATAP_PARKED;
    }
    pthread_mutex_unlock(&ch->lock);
    if (room)
        wake_one(ch, &ch->send_wait);
    return rc;
}

static void recv_arg_free(void *arg) { atap_chan_close_receiver(arg); }

int atap_chan_spawn_recv(atap_task *task, atap_chan *ch, const atap_spawn_opts *opts)
{
    atap_spawn_opts o;
    int rc;

    if (!task)
        return ATAP_EINVAL;
    *task = ATAP_NO_TASK;
    if (!ch || (rc = task_opts(opts, &o)) != 0 || (o.out_size && o.out_size != ch->elem))
        return ATAP_EINVAL;
    if ((rc = atap_chan_add_receiver(ch)) != 0)
        return rc;
    o.out_size = ch->elem;
    o.out_free = ch->elem_free; /* a value received and never taken goes */
    o.arg_free = recv_arg_free;
    if ((rc = atap_spawn(task, recv_run, ch, &o)) != 0)
        atap_chan_close_receiver(ch);
    return rc;
}

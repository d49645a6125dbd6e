/*
 * libatap's built-in tasks: a sleep, and channels between tasks. Written on the runtime's public
 * calls alone (atap/core.h). <atap.h> includes this header; a program may include it alone, with
 * <atap/core.h>, to keep the other areas out.
 */
#ifndef ATAP_TASKS_H
#define ATAP_TASKS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Built-in tasks                                                          */
/* ---------------------------------------------------------------------- */

/*
 * Spawns a task that sleeps ns, counted from this call, parked on a timer
 * (it holds no thread while it waits); its output is a uint64_t: the time
 * actually slept, never less than ns. precise: it wakes 500 us early and
 * spins the rest on a worker (lateness of microseconds); otherwise it
 * wakes once, on the timer (lateness of the manager's tick, ~0.1 ms).
 * opts may be NULL; its out_size must be 0 or 8 (it is 8), kind ATAP_ONCE;
 * priority, timeout_ns and after_ns apply (after_ns counts in the sleep).
 * Returns as atap_spawn.
 * Blocks: no. Threads: any.
 */
ATAP_EXPORT int atap_spawn_sleep(atap_task *task, uint64_t ns, bool precise,
                                 const atap_spawn_opts *opts);

/*
 * Channels: FIFO queues of elem_size-byte values between any number of
 * senders and receivers, each value received exactly once. Receiving is a
 * task that parks until a value comes (it holds no thread); on a bounded
 * channel sending can be one too, parking until there is room.
 *
 * The ends are counted. atap_chan_open gives the caller one sender and one
 * receiver end; atap_chan_add_* make more, atap_chan_close_* let one go;
 * every send or receive task is an end of its kind while it lives. When
 * the last sender goes, receivers drain what is queued and then end with
 * ATAP_ECLOSED. When the last receiver goes, queued values are dropped and
 * sends return (or end with) ATAP_ECLOSED. The channel is freed when both
 * counts reach 0. elem_free (may be NULL) is called on each value the
 * channel drops, and on a received output nobody took (a receive task
 * cancelled or timed out just after it took its value counts as one),
 * each time at an address aligned as every pointer libatap hands to user
 * code (see atap_fn): for any type of elem_size bytes, which is
 * alignof(max_align_t), or, for a size that is not a multiple of it, the
 * largest power of two dividing the size (24- and 40-byte values: 8).
 * atap_chan_send's refused value is the caller's own pointer, as given.
 * Threads: any; an end must not be used after it is closed.
 */
typedef struct atap_chan atap_chan;

/* Opens a channel; capacity 0: unbounded. A channel needs no runtime until
 * a send or receive task is spawned on it, so it may be opened before
 * atap_init (and outlive a shutdown). Returns 0 and *chan; ATAP_EINVAL for
 * NULL chan, elem_size 0 (or above 4 GiB - 1) or a capacity whose ring
 * would not fit in memory; -ENOMEM. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_chan_open(atap_chan **chan, size_t elem_size, size_t capacity,
                               void (*elem_free)(void *value));
/* One more sender / receiver end. Returns 0; ATAP_EINVAL for NULL chan or
 * a count at its limit (SIZE_MAX). Blocks: no (a short lock). Threads: any. */
ATAP_EXPORT int atap_chan_add_sender(atap_chan *chan);
ATAP_EXPORT int atap_chan_add_receiver(atap_chan *chan);
/* Lets go of one sender / receiver end: the last sender's close lets the
 * receivers drain and then read ATAP_ECLOSED, the last receiver's drops
 * what is queued (elem_free on each, on the calling thread, after the
 * channel's lock). NULL is ignored. Blocks: no. Threads: any. */
ATAP_EXPORT void atap_chan_close_sender(atap_chan *chan);
ATAP_EXPORT void atap_chan_close_receiver(atap_chan *chan);

/*
 * Queues a copy of value (elem_size bytes) and wakes a parked receiver.
 * Returns 0; ATAP_ECLOSED when no receiver is left (elem_free is then
 * called on value); ATAP_ENOTREADY when a bounded channel is full (the
 * value stays the caller's: atap_chan_spawn_send waits for room);
 * ATAP_EINVAL for NULL chan or value; -ENOMEM (the value stays the
 * caller's). Blocks: no (a short lock). Threads: any.
 */
ATAP_EXPORT int atap_chan_send(atap_chan *chan, const void *value);

/* Spawns a task that sends a copy of value, parking while the channel is
 * full; no output. It ends ATAP_ECLOSED if every receiver goes first. A
 * copy that was never sent (the task ended ATAP_ECLOSED, was cancelled,
 * timed out or failed before its send) goes to elem_free once, when the
 * task's argument is let go: as the task ends if it has no handle left,
 * else at the release of its last handle. opts: kind ONCE, no out_size,
 * arg_free, out_free, gives or in_free; priority, timeout_ns and after_ns
 * apply. Returns as atap_spawn, and ATAP_EINVAL for NULL chan or value or
 * options outside those (on failure the value stays the caller's).
 * Blocks: no. Threads: any. */
ATAP_EXPORT int atap_chan_spawn_send(atap_task *task, atap_chan *chan, const void *value,
                                     const atap_spawn_opts *opts);

/* Spawns a task that receives the next value (its output, elem_size bytes),
 * parking until one comes; it ends ATAP_ECLOSED once the channel is drained
 * and no sender is left. opts as atap_chan_spawn_send (out_size 0 or
 * elem_size). Returns as atap_spawn, and ATAP_EINVAL for NULL chan or
 * options outside those. Blocks: no. Threads: any. */
ATAP_EXPORT int atap_chan_spawn_recv(atap_task *task, atap_chan *chan, const atap_spawn_opts *opts);

/* Values queued now (a snapshot); 0 for NULL. Blocks: no (a short lock).
 * Threads: any. */
ATAP_EXPORT size_t atap_chan_len(atap_chan *chan);

#ifdef __cplusplus
}
#endif

#endif /* ATAP_TASKS_H */

/*
 * A kind of park in test builds only (ATAP_FAULT_INJECTION: the tests' own
 * library, atap_testing; nothing of it in a library that is installed): a
 * park on a word of the program's, as on a futex. A run calls
 * atap__test_park_word(ctx, word, expect, timeout_ns) and returns
 * ATAP_PARKED; it resumes READY once another thread has stored another
 * value in the word and called atap__test_word_wake(word), or DEADLINE at
 * its timeout, and a cancel while parked ends it as any park's. It shows
 * what a new kind takes (src/README.md's recipe): this file and its line
 * in park_kinds.h, nothing else of the library. tests/test_park.c
 * parks on it, and declares its two calls itself.
 *
 * Words. A park names its word by a number, the word's place in `words`,
 * taken at the word's first park and kept for the process's life (WORDS of
 * them); the record keeps the number as p->fd and the value expected as
 * p->events. Each word has a list of the records parked on it (linked by
 * fd_next) under word_lock, a leaf lock, never held while completing.
 *
 * No wake is lost: a waker stores the word, then takes word_lock and claims
 * every park on the word's list; a join takes word_lock, reads the word,
 * and claims its own park READY if the value is not the one expected, else
 * puts it on the list. The lock orders the two: a join after the waker's
 * unlock reads its store (the unlock releases it, the lock acquires it),
 * and a join before it put its park on the list the waker walks. The waker
 * takes each park off the list and claims it (atap__park_claim: exactly
 * one claimant wins): won from ARMED, it completes it once the lock is let
 * go; from ARMING, its parker completes it; one claimed already (its
 * deadline, a stop) is only taken off, and its claimant's leave finds it
 * gone. A park leaves the list only under word_lock, and its record is
 * freed only with its slot, after its completion's leave: a park on a list
 * is always one the list may name.
 */
#include "park.h"
#include "park_int.h"

#ifdef ATAP_FAULT_INJECTION

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "atap.h"
#include "atomics.h"
#include "wait.h"

/* The calls tests/test_park.c makes (it declares them too). */
int atap__test_park_word(atap_ctx *ctx, _Atomic uint32_t *word, uint32_t expect,
                         uint64_t timeout_ns);
int atap__test_word_wake(_Atomic uint32_t *word);

#define WORDS 64

static pthread_mutex_t word_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint32_t *words[WORDS];
static struct park *waiters[WORDS];
static int nwords;

/* word's number; a new one if add (-1: none, or no room). word_lock held. */
static int word_number(_Atomic uint32_t *word, bool add)
{
    for (int i = 0; i < nwords; i++)
        if (words[i] == word)
            return i;
    if (!add || nwords == WORDS)
        return -1;
    words[nwords] = word;
    return nwords++;
}

/* The parker, its record ARMING: on the word's list, or READY at once if
 * the word holds another value already (see the top). */
static int word_join(struct park *p)
{
    pthread_mutex_lock(&word_lock);
    if (ld_acquire(words[p->fd]) != (uint32_t)p->events) {
        atap__park_claim(p, BY_READY); /* from ARMING: the parker completes it */
    } else {
        p->fd_next = waiters[p->fd];
        waiters[p->fd] = p;
    }
    pthread_mutex_unlock(&word_lock);
    return 0;
}

/* The claimant, completing: off the word's list if a waker did not take
 * it off. */
static void word_leave(struct park *p)
{
    pthread_mutex_lock(&word_lock);
    for (struct park **at = &waiters[p->fd]; *at; at = &(*at)->fd_next)
        if (*at == p) {
            *at = p->fd_next;
            break;
        }
    pthread_mutex_unlock(&word_lock);
}

/* In a fork's child: the parks listed are the parent's tasks'. The words
 * stay numbered (the child has the same memory); the lock is taken fresh. */
static void word_forget(void)
{
    word_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    memset(waiters, 0, sizeof waiters);
}

/* No kernel state: nothing to watch again after a manager's death, nor to
 * retry at the tick. */
const struct park_kind atap__park_kind_test_word = {
    .join = word_join,
    .leave = word_leave,
    .forget = word_forget,
};

/* Parks the run on word while it holds expect (ATAP_FOREVER: no timeout).
 * 0; ATAP_EINVAL for a NULL word, in atap_block (nothing would wake the
 * caller), or as atap_park_fd; -ENOMEM when WORDS words are taken. */
int atap__test_park_word(atap_ctx *ctx, _Atomic uint32_t *word, uint32_t expect,
                         uint64_t timeout_ns)
{
    int w;

    if (!word || (ctx && ctx->in_block))
        return ATAP_EINVAL;
    pthread_mutex_lock(&word_lock);
    w = word_number(word, true);
    pthread_mutex_unlock(&word_lock);
    if (w < 0)
        return -ENOMEM;
    return atap__park_ask(ctx, PK_TEST_WORD, w, expect, atap__deadline_in(timeout_ns));
}

/* Wakes every park on word (its new value stored first, by the caller):
 * how many it claimed. */
int atap__test_word_wake(_Atomic uint32_t *word)
{
    struct park *p, *won = NULL;
    int w, r, n = 0;

    pthread_mutex_lock(&word_lock);
    if ((w = word_number(word, false)) >= 0) {
        while ((p = waiters[w]) != NULL) {
            waiters[w] = p->fd_next;
            if ((r = atap__park_claim(p, BY_READY)) != 0)
                n++;
            if (r == 1) {
                p->fd_next = won;
                won = p;
            }
        }
    }
    pthread_mutex_unlock(&word_lock);
    while ((p = won) != NULL) {
        won = p->fd_next;
        atap__park_complete(p, BY_READY);
    }
    return n;
}

#else
typedef int atap__park_test_word_none; /* ISO C wants something in a file */
#endif

/*
 * The hub's one instance (hub.h has what it is and its rules).
 */
#include "hub.h"

#include <string.h>

#include "faults.h"

struct atap__hub atap__hub;

/* Threads between their look at a poller of the hub and their wake of it
 * (hub.h): the close waits for none to be left. */
static _Atomic unsigned wakers;

/* seq_cst, against atap__hub_close: we count ourselves in, then look; it
 * takes the poller away, then reads the count. Either it sees us (and
 * waits for our wake to be over) or we see no poller. */
static void wake(_Atomic(struct atap_poller *) *at)
{
    struct atap_poller *p;

    add_seqcst(&wakers, 1);
    if ((p = ld_seqcst(at)) != NULL)
        atap__poller_wake(p);
    TEST_HOOK(ATAP__TEST_HUB_WAKE);
    sub_seqcst(&wakers, 1);
}

void atap__hub_wake(void) { wake(&atap__hub.poller); }

void atap__hub_wake_io(void) { wake(&atap__hub.io); }

void atap__hub_close(void)
{
    struct atap_poller *ps[2] = {ld_relaxed(&atap__hub.poller), ld_relaxed(&atap__hub.io)};
    unsigned spins = 0;

    st_seqcst(&atap__hub.poller, NULL);
    st_seqcst(&atap__hub.io, NULL);
    while (ld_seqcst(&wakers) != 0)
        spin_pause(&spins);
    atap__poller_close(ps[0]);
    atap__poller_close(ps[1]);
}

/* In a fork's child (its one thread; manager.c's forget): a thread of the
 * parent may have been counted in a wake when the fork came, and is not
 * here to count itself out: the count starts again at 0, with the state
 * (no poller, not closed, stopped). */
void atap__hub_forget(void)
{
    memset(&atap__hub, 0, sizeof atap__hub);
    st_relaxed(&wakers, 0);
}

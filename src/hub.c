/*
 * The hub's one instance (hub.h has what it is and its rules).
 */
#include "hub.h"

struct atap__hub atap__hub;

void atap__hub_wake(void)
{
    struct atap_poller *p = ld_acquire(&atap__hub.poller);

    if (p)
        atap__poller_wake(p);
}

/* The in-process regroup's rule (regroup.h). */
#include "regroup.h"

#include <stdio.h>

#include "banned.h"

bool regroup_decide(const struct regroup_in *in, char *why, size_t n)
{
    int others = 0;

    if (in->aborting) {
        snprintf(why, n, "another failure is being handled");
        return false;
    }
    if (!in->restartable) {
        snprintf(why, n, "no restart is left for a node failure");
        return false;
    }
    if (!in->spares_cover) {
        snprintf(why, n, "no spare can take node %d's place", in->lost);
        return false;
    }
    for (int r = 0; r < in->world_size; r++) {
        const struct regroup_rank *k = &in->ranks[r];
        if (k->node == in->lost)
            continue;
        others++;
        if (!k->running) {
            snprintf(why, n, "rank %d on node %d has exited", r, k->node);
            return false;
        }
        if (!k->able) {
            snprintf(why, n, "rank %d on node %d did not say it can regroup", r, k->node);
            return false;
        }
    }
    if (others == 0) {
        snprintf(why, n, "no rank runs on another node");
        return false;
    }
    return true;
}

/* Admission of connections before their join (admit.h): pure rules. */
#include "admit.h"
#include "banned.h"

int admit_pending_max(int nphys, int joined, int strangers_max)
{
    return nphys - joined + strangers_max;
}

int admit_strangers_max(long nofile, int nnodes, int slack)
{
    long room;

    if (nofile < 0)
        return PENDING_CONNS_MAX;
    room = nofile - nnodes - slack;
    return room >= PENDING_CONNS_MAX ? PENDING_CONNS_MAX
                                     : (int)(room > PENDING_CONNS_MIN ? room : PENDING_CONNS_MIN);
}

int admit_victim(const struct admit_conn *q, int n)
{
    int victim = -1;

    for (int i = 0; i < n; i++) {
        if (q[i].proved)
            continue;
        if (!q[i].heard)
            return i;
        if (victim < 0)
            victim = i;
    }
    return victim;
}

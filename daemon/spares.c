/* Why a job's hot spares stayed idle (spares.h). */
#include <stdio.h>
#include <string.h>

#include "jobspec.h"
#include "spares.h"
#include "banned.h"

const char *spares_idle_why(const struct spares_end *e, char *buf, size_t n)
{
    const char *o = e->outcome ? e->outcome : "";

    if (e->idle <= 0 || !strcmp(o, "completed") || n == 0)
        return NULL;
    /* The job's end first: what ended it was nothing a node did. */
    if (!strcmp(o, "cancelled"))
        snprintf(buf, n, "the job was cancelled");
    else if (!strcmp(o, "timeout"))
        snprintf(buf, n, "the job reached its time limit, which no spare lifts");
    else if (!e->started)
        snprintf(buf, n, "the job ended before its ranks started");
    /* Then the failure: a spare takes the place of a node that failed (node, hang). */
    else if (e->cls < 0)
        snprintf(buf, n, "the failure has no class, so names no node to replace");
    else if (!((RESTART_ON_SPARES >> e->cls) & 1))
        snprintf(buf, n, "a %s failure is the ranks' own, not their node's",
                 failure_class_name(e->cls));
    else if (e->node == 0)
        snprintf(buf, n, "node 0 failed, which runs the leader: no spare takes its place");
    /* Then the job's rules: a spare serves only at a restart. */
    else if (e->max_restarts == 0)
        snprintf(buf, n, "--max-restarts 0: a spare serves only at a restart");
    else if (!((e->restart_on >> e->cls) & 1))
        snprintf(buf, n, "--restart-on does not name %s failures", failure_class_name(e->cls));
    else if (e->restarts >= e->max_restarts)
        snprintf(buf, n, "no restart left (%d of %d made)", e->restarts, e->max_restarts);
    else if (e->lost > e->idle)
        snprintf(buf, n, "%d nodes lost and %d spare%s: too few to take every place", e->lost,
                 e->idle, e->idle > 1 ? "s" : "");
    else
        snprintf(buf, n, "the failure named no node a spare could replace");
    return buf;
}

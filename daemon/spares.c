/* The hot spares' rules (spares.h). */
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

/* The first spare fit to take a place that no swap of the plan took yet; -1: none. */
static int next_spare(const struct spares_fleet *f, const struct spares_swap *out, int n)
{
    for (int i = f->nnodes; i < f->nphys; i++) {
        bool taken = false;
        if (f->nodes[i].slot >= 0 || !f->nodes[i].fit)
            continue;
        for (int k = 0; k < n && !taken; k++)
            taken = out[k].spare == i;
        if (!taken)
            return i;
    }
    return -1;
}

int spares_plan_restart(const struct spares_fleet *f, int named, const double *slower, int nprocs,
                        struct spares_swap *out)
{
    int n = 0;

    for (int s = 0; s < f->nnodes; s++) {
        int bad = f->slot_node[s], sp = next_spare(f, out, n), slow = -1;
        for (int r = s * nprocs; slower && r < (s + 1) * nprocs; r++)
            if (slower[r] > 0 && (slow < 0 || slower[r] > slower[slow]))
                slow = r;
        if ((!f->nodes[bad].lost && bad != named && slow < 0) || bad == 0 || sp < 0)
            continue;
        out[n++] = (struct spares_swap){
            .slot = s,
            .node = bad,
            .spare = sp,
            .cause = bad == named         ? SPARES_NAMED
                     : f->nodes[bad].lost ? SPARES_LOST
                                          : SPARES_STRAGGLER,
            .rank = f->nodes[bad].lost || bad == named ? -1 : slow,
        };
    }
    return n;
}

int spares_plan_preflight(const struct spares_fleet *f, struct spares_swap *out)
{
    int n = 0;

    for (int s = 0; s < f->nnodes; s++) {
        int bad = f->slot_node[s], sp = -1;
        if (!f->nodes[bad].preflight)
            continue;
        for (int i = f->nnodes; i < f->nphys && sp < 0; i++) {
            bool taken = false;
            if (f->nodes[i].slot >= 0 || !f->nodes[i].fit || f->nodes[i].preflight)
                continue;
            for (int k = 0; k < n && !taken; k++)
                taken = out[k].spare == i;
            sp = taken ? -1 : i;
        }
        if (bad == 0 || sp < 0)
            return -1 - s;
        out[n++] = (struct spares_swap){
            .slot = s, .node = bad, .spare = sp, .cause = SPARES_PREFLIGHT, .rank = -1};
    }
    return n;
}

bool spares_cover(const struct spares_fleet *f, int named, bool node0_named)
{
    int need = 0, have = 0;

    if (node0_named)
        return false;
    for (int s = 0; s < f->nnodes; s++) {
        int i = f->slot_node[s];
        if (f->nodes[i].lost && i == 0)
            return false;
        need += f->nodes[i].lost || i == named;
    }
    for (int i = f->nnodes; i < f->nphys; i++)
        have += f->nodes[i].slot < 0 && f->nodes[i].fit;
    return need > 0 && need <= have;
}

/* Whether a node's loss heals in process (docs/design.md, section 4): the ranks on the other
 * nodes keep their processes and regroup with a spare's ranks, instead of every rank being
 * torn down and started again. Pure: no clock, no I/O; the leader gathers what it knows when
 * a node is lost, and acts on the verdict (leader_regroup) or fails the generation as
 * before. */
#ifndef GPURUN_REGROUP_H
#define GPURUN_REGROUP_H

#include <stdbool.h>
#include <stddef.h>

/* A rank of the job as the rule sees it at the loss. */
struct regroup_rank {
    int node;     /* the physical node it runs on */
    bool running; /* not exited */
    bool able;    /* it said it can regroup (gr_regroup_enable) */
};

/* What the leader knows when node `lost` is lost. */
struct regroup_in {
    int lost;          /* the node lost */
    bool restartable;  /* --restart-on names node failures and --max-restarts has one left */
    bool spares_cover; /* a fit spare can take the lost node's place (spares_cover) */
    bool aborting;     /* a failure is already being handled (a teardown under way) */
    const struct regroup_rank *ranks;
    int world_size;
};

/* Whether in's loss heals in process: it does where a restart would follow, a spare covers
 * the loss, no other failure is under way, and every rank on another node is running and
 * said it can regroup. Otherwise writes why not into why (n bytes, lowercase, no full stop:
 * "rank 3 on node 1 did not say it can regroup") and returns false. */
bool regroup_decide(const struct regroup_in *in, char *why, size_t n);

#endif

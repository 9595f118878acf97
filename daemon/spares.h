/* The hot spares' rules (docs/design.md, section 4): which spare takes which node's place
 * before a restart or before the first assign (pre-flight), whether the spares cover what a
 * failure took, and why the spares stayed idle when a job ended (so that its end line,
 * summary.json and gpurun status can say it rather than leave "1 idle" to be puzzled over).
 * Pure: no clock, no I/O; the leader gathers the nodes' state, and fences, sends and logs
 * what a plan says. */
#ifndef GPURUN_SPARES_H
#define GPURUN_SPARES_H

#include <stdbool.h>
#include <stddef.h>

/* What the leader knows of a job's end that bears on its spares. */
struct spares_end {
    int idle;            /* spares fit to serve (joined, linked) that never took a place */
    const char *outcome; /* the job's: "completed", "failed", "hung", "cancelled", "timeout" */
    int cls;             /* the first failure's class (FAILURE_*, jobspec.h); -1: none */
    int node;            /* the node the first failure names; -1: none */
    bool started;        /* the ranks were assigned (the job got past its join) */
    int lost;            /* nodes serving the job that the failure took: lost or named */
    int max_restarts;    /* the job's --max-restarts */
    int restarts;        /* restarts already made */
    int restart_on;      /* the job's --restart-on (1 << FAILURE_* bits) */
};

/* Writes into buf (n bytes) why e's idle spares took no failed node's place, lowercase and
 * without a full stop ("--max-restarts 0: a spare serves only at a restart"), and returns
 * buf; returns NULL where none stayed idle or the job completed (nothing to replace). */
const char *spares_idle_why(const struct spares_end *e, char *buf, size_t n);

/* A physical node (the job's nnodes, then the spares) as the swap rules see it. */
struct spares_node {
    int slot;       /* the job's node it serves (its ranks: slot * nprocs on); -1: a spare */
    bool fit;       /* fit to serve: joined, linked, neither lost nor fenced */
    bool lost;      /* its link was lost */
    bool preflight; /* it failed a pre-flight check */
};

/* The job's nodes: nodes[0..nphys), slot_node[s] the node serving slot s of nnodes. */
struct spares_fleet {
    const struct spares_node *nodes;
    int nphys, nnodes;
    const int *slot_node;
};

enum spares_cause { SPARES_LOST, SPARES_NAMED, SPARES_STRAGGLER, SPARES_PREFLIGHT };

/* One swap of a plan: the spare takes slot's place from node. */
struct spares_swap {
    int slot, node, spare;
    enum spares_cause cause;
    int rank; /* SPARES_STRAGGLER: the slowest straggler of node's ranks */
};

/* Before a restart: each node serving the job that was lost, or that the failure names
 * (named: a node's own failure or a hang's, -1: none), or (slower not NULL: the straggler
 * action replace) one of whose nprocs ranks straggles (slower[r] > 0, stragglers.h) gives
 * its place to the next fit spare, in slot order, while spares last. Node 0, the leader's,
 * is never replaced. Writes the swaps into out (room for nnodes) and returns their count. */
int spares_plan_restart(const struct spares_fleet *f, int named, const double *slower, int nprocs,
                        struct spares_swap *out);

/* Before the first assign: each node serving the job that failed pre-flight gives its place
 * to the next fit spare that passed (a spare that failed is no fit). Returns the count of
 * swaps written into out, or -1 - s where slot s cannot be served (its node is node 0, or no
 * spare is left): the job ends there, before any rank starts. */
int spares_plan_preflight(const struct spares_fleet *f, struct spares_swap *out);

/* Whether spares can take the place of every node the failure and the losses took from the
 * job (the nodes serving it that are lost, and named): then a restart may go on without
 * them. Node 0 lost or named (node0_named): never. */
bool spares_cover(const struct spares_fleet *f, int named, bool node0_named);

#endif

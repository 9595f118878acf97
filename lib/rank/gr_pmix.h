/* The rank library's second transport (internal to lib/rank/gr.c): a rank started by `srun
 * --mpi=pmix` (or another PMIx launcher) without rendezvousd takes its place in the job from
 * PMIx, and the store and barrier become PMIx puts, gets and fences. gr.h documents what a
 * caller sees; this header is the contract between gr.c and gr_pmix.c. Built only where
 * libpmix is (HAVE_PMIX, from the Makefile).
 *
 * How the store maps onto PMIx, whose data belongs to the rank that put it:
 * - put: PMIx_Put (global scope) of key "gr.<key>" as bytes, then PMIx_Commit. Ranks of the
 *   same node see it at once; other nodes when they ask that rank's node for it, or after a
 *   barrier (a fence that collects everything committed).
 * - get: the owner is unknown, so first every rank's data this process sees without asking
 *   (PMIX_OPTIONAL: the node's shared store with the local ranks' commits, and what the last
 *   barrier collected), then each rank of the other nodes in turn (a direct request to its
 *   node, PMIX_GET_REFRESH_CACHE), rank N first when the key ends in "/N"; then again, with a
 *   growing pause, until the key turns up or the wait runs out. (PMIX_RANK_UNDEF, "any rank",
 *   is no way round the search: Slurm's server forwards it to Slurm, which never answers it
 *   for a missing key, and OpenMPI's mpirun does not find keys with it.)
 * - barrier: PMIx_Fence over the whole namespace with PMIX_COLLECT_DATA.
 * Thread context: one thread at a time per handle, as gr.h says; PMIx's own thread runs the
 * completions, which only touch the handle under its lock. */
#ifndef GPURUN_GR_PMIX_H
#define GPURUN_GR_PMIX_H

#include <stddef.h>

#include "errmsg.h"

struct gr_pmix;

/* Where this rank is, as PMIx tells it. */
struct gr_pmix_place {
    int rank, world_size, local_rank, local_world_size, node_rank;
};

/* Connects to the PMIx server of this node (PMIx_Init) and reads the rank's place. On success
 * *out is new (end it with gr_pmix_close) and *place filled; on failure *out is NULL and err
 * (the caller's) says why: -ECONNREFUSED when PMIx_Init fails, -EINVAL when PMIx
 * gives no size, rank or node for this process. */
int gr_pmix_open(struct gr_pmix **out, struct gr_pmix_place *place, struct errmsg *err);

/* Stores len bytes of val (borrowed) under key (checked by the caller) for every rank to
 * read. -EIO (err set) when PMIx refuses it. */
int gr_pmix_put(struct gr_pmix *px, const char *key, const void *val, size_t len,
                struct errmsg *err);

/* gr_kv_get over PMIx: waits up to timeout_ms (-1: no limit; 0: one look at every rank but
 * no wait) for key, then copies its value into buf (cap bytes) and sets *len. Returns 0,
 * -ENOBUFS (*len set), -ENOENT (timeout 0, not found), -ETIMEDOUT, or -EIO; err set on
 * failure. */
int gr_pmix_get(struct gr_pmix *px, const char *key, void *buf, size_t cap, size_t *len,
                int timeout_ms, struct errmsg *err);

/* A barrier of every rank (a collecting fence), named name for the error text only: PMIx does
 * not compare names, so ranks must call barriers in the same order. Up to timeout_ms (-1: no
 * limit); a fence given up on stays in flight, and the next barrier first waits for it.
 * Returns 0, -ETIMEDOUT or -EIO; err set on failure. */
int gr_pmix_fence(struct gr_pmix *px, const char *name, int timeout_ms, struct errmsg *err);

/* Leaves PMIx (PMIx_Finalize) and frees px (NULL is a no-op). Returns 0 or -EIO (err set). */
int gr_pmix_close(struct gr_pmix *px, struct errmsg *err);

#endif

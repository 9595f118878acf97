/* The leader: the job-wide service node 0's rendezvousd runs. It admits one agent per node,
 * assigns ranks, keeps the store and the barriers, watches heartbeats and progress, decides
 * the job's outcome and writes summary.json. */
#ifndef GPURUN_LEADER_H
#define GPURUN_LEADER_H

#include <stdbool.h>

#include <uv.h>

#include "auth.h"
#include "jobspec.h"

struct leader;

/* Called once when the job is over and every agent has been told; status is the job's exit
 * status (docs/design.md, section 1). */
typedef void (*leader_done_fn)(struct leader *l, int status, void *arg);

struct leader_config {
    const struct jobspec *spec; /* borrowed: outlives the leader */
    const struct auth_key *key; /* copied */
    const char *job_dir;        /* borrowed; NULL: no endpoint.json or summary.json */
    int requeues;               /* times Slurm requeued the job (SLURM_RESTART_COUNT): the
                                 * ended segments' records are in job_dir/segments/N.json */
    const char *bind_addr;      /* numeric IPv4/IPv6 address to listen on */
    const char *advertise_addr; /* what agents and ranks dial (endpoint.json, MASTER_ADDR) */
    uint32_t max_frame;
    leader_done_fn done;
    void *arg;
};

/* Binds a port on cfg->bind_addr (port 0: the kernel picks), writes endpoint.json and starts
 * serving. Returns 0 and a new leader in *out, or a negative errno with a logged reason. */
int leader_start(uv_loop_t *loop, const struct leader_config *cfg, struct leader **out);

/* The fewest file descriptors a leader of nnodes nodes can run with: one per agent, status
 * clients, its own handles and the fewest slots for connections not yet admitted (a leader
 * started under a higher limit keeps up to 1,024 such slots, as many as the limit leaves). */
int leader_fds_needed(int nnodes);

/* The port the leader listens on. */
int leader_port(const struct leader *l);

/* Ends the job from outside (a signal to node 0's daemon): every agent aborts its ranks with
 * cause (borrowed) and the outcome is "cancelled". */
void leader_cancel(struct leader *l, const char *cause);

/* Closes every handle; the leader frees itself once they are closed. Safe after done. */
void leader_close(struct leader *l);

#endif

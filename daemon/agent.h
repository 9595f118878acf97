/* The agent: the per-node half of rendezvousd. It joins the leader, spawns and supervises
 * this node's ranks, serves them the store and barriers over a Unix socket (forwarding to the
 * leader), labels their output, and tears them down when the job fails anywhere. */
#ifndef GPURUN_AGENT_H
#define GPURUN_AGENT_H

#include <sys/socket.h>

#include <uv.h>

#include "auth.h"
#include "jobspec.h"

struct agent;

/* Called once when the agent is finished: every rank is gone and reaped; status is what the
 * daemon should exit with. */
typedef void (*agent_done_fn)(struct agent *a, int status, void *arg);

struct agent_config {
    const struct jobspec *spec; /* borrowed: outlives the agent */
    const struct auth_key *key; /* copied */
    const char *job_dir;        /* borrowed: logs/ lives here; endpoint.json too */
    int requeues;               /* times Slurm requeued the job: > 0 marks the rank logs */
    int node_rank;
    const char *hostname;   /* borrowed: reported to the leader */
    const char *advertise;  /* borrowed; NULL: the address of our end of the leader link */
    const char *rendezvous; /* borrowed "HOST:PORT" (numeric host); NULL: endpoint.json */
    uint32_t max_frame;
    agent_done_fn done;
    void *arg;
};

/* Starts the agent: finds the leader, joins, and on assignment spawns the ranks. Returns 0
 * with a new agent in *out, or a negative errno with the reason logged. */
int agent_start(uv_loop_t *loop, const struct agent_config *cfg, struct agent **out);

/* Delivers a signal the daemon received: SIGTERM, SIGINT and SIGHUP cancel the job (ranks
 * get SIGTERM, then SIGKILL after kill_grace); SIGUSR1 and SIGUSR2 are forwarded to every
 * rank's process group. */
void agent_signal(struct agent *a, int sig);

/* Closes every handle; the agent frees itself once they are closed. Call after done. */
void agent_close(struct agent *a);

#endif

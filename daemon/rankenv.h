/* A rank's environment: what the agent hands every rank it spawns. torchrun's whole contract
 * (torch/distributed/elastic/agent/server/local_elastic_agent.py), horovodrun's for its gloo
 * controller (horovod/runner/gloo_run.py), the rank library's variables, the GPUs as the
 * --gpu-bind mode shows them, the Python settings a launched script expects and, inside a
 * Slurm step, Slurm's per-task variables as `srun --ntasks-per-node=<ranks per node>` gives
 * them. Pure: it reads nothing but its arguments, so every rule is testable. */
#ifndef GPURUN_RANKENV_H
#define GPURUN_RANKENV_H

#include <stdbool.h>
#include <stddef.h>

#include "jobspec.h"

/* The facts of one rank, all borrowed for the duration of rankenv_build(). */
struct rankenv_rank {
    const struct jobspec *spec;
    int rank, local_rank, local_world_size, world_size;
    int node_rank, nnodes;
    int restart_count; /* the leader's generation */
    const char *master_addr;
    int master_port;
    const char *sock, *token; /* the agent's Unix socket, this rank's secret (hex) */
    const char *job_dir;      /* "" without one */
    const char *node_addr;    /* this node's address, for rank-to-rank links */
    const char *hostname;     /* this node's name */
    const char *error_file;   /* TORCHELASTIC_ERROR_FILE for this rank; NULL: none */
    const char *python_dir;   /* the folder holding the gpurun Python package; NULL: none */
    const char *mem_dir;      /* the node's memory checkpoints (memckpt.h); NULL: none */
    int cpus;                 /* CPUs the agent may use (its affinity), >= 1 */
    int hvd_port;             /* horovod's rendezvous on master_addr (hvd.h); 0: none */
    const char *hvd_host;     /* HOROVOD_HOSTNAME (the leader's name for this node); NULL:
                                 hostname */
    const char *hvd_iface;    /* HOROVOD_GLOO_IFACE: the interface holding node_addr; NULL:
                                 unknown, not set */
    int term_cols;            /* the width of the terminal the rank's lines are shown on
                                 (the merged stream's); 0: not a terminal */
};

/* The width left to rank's text on a terminal term_cols wide, once its label ("[12] ") is
 * drawn: what COLUMNS says to the rank, so that a progress bar (tqdm, rich) fills the line
 * and never wraps it. 0 when term_cols is 0 or nothing is left. */
int rankenv_columns(int term_cols, int rank);

/* A growable NULL-terminated "K=V" vector. */
struct envv {
    char **v;
    size_t n, cap;
    bool oom; /* an allocation failed: the vector is incomplete */
};

/* Sets K=V (value formatted), replacing an existing K. Failures set e->oom. */
void envv_set(struct envv *e, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The value of k in e (borrowed), or NULL. */
const char *envv_get(const struct envv *e, const char *k);

/* Removes k from e; a missing k is not an error. */
void envv_unset(struct envv *e, const char *k);

/* Frees every string and the vector; e may be used again. */
void envv_release(struct envv *e);

/* OMP_NUM_THREADS for rank r: the CPUs it may share (the agent's affinity, no more than
 * SLURM_CPUS_ON_NODE of base where set) divided by the ranks that share them: the node's
 * ranks, or every rank of the job on one machine (spec->loopback); at least 1. */
int rankenv_threads(const struct rankenv_rank *r, char *const *base);

/* The environment of rank r: base (the agent's own environment, borrowed, NULL-terminated)
 * with the job's --export entries, then every variable rankenv sets. Where base has
 * SLURM_JOB_ID and SLURM_STEP_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and the other
 * per-task variables describe rank r as the task of the same rank in a block layout of
 * local_world_size tasks on each of nnodes nodes (SLURM_TASK_PID excepted: the shim sets it).
 * Returns a new vector (free with rankenv_free) or NULL when memory runs out. */
char **rankenv_build(const struct rankenv_rank *r, char *const *base);

/* Frees what rankenv_build returned. */
void rankenv_free(char **env);

#endif

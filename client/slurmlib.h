/* Every call gpurun makes into libslurm, in this one module: libslurm's API changes between
 * Slurm releases (this one is written against 22.05), so a port touches this file only.
 * libslurm reads its configuration lazily, prints to stderr and calls exit() on a fatal
 * error; this module checks the configuration first, keeps libslurm's chatter off the
 * terminal, and bounds every call, so that a missing slurm.conf or a dead slurmctld is one
 * line from gpurun within seconds.
 *
 * Thread context: gpurun's only thread. A call that overruns its bound prints one line and
 * ends the process with status 125 (from a SIGALRM handler): libslurm cannot be interrupted
 * and resumed. */
#ifndef GPURUN_CLIENT_SLURMLIB_H
#define GPURUN_CLIENT_SLURMLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "errmsg.h"
#include "sbatch.h"

/* A failure below fills the caller's struct errmsg with one line: "slurmctld did not answer
 * within 3 s (SLURM_CONF '/etc/slurm/slurm.conf')". */

/* Slurm's base job states, in Slurm's order (checked against slurm.h where it is built). */
enum slurmlib_state {
    SLURMLIB_PENDING,
    SLURMLIB_RUNNING,
    SLURMLIB_SUSPENDED,
    SLURMLIB_COMPLETED,
    SLURMLIB_CANCELLED,
    SLURMLIB_FAILED,
    SLURMLIB_TIMEOUT,
    SLURMLIB_NODE_FAIL,
    SLURMLIB_PREEMPTED,
    SLURMLIB_BOOT_FAIL,
    SLURMLIB_DEADLINE,
    SLURMLIB_OOM,
    SLURMLIB_STATE_COUNT
};

/* A job as slurmctld sees it, copied out of libslurm's message. Strings are owned (freed by
 * slurmlib_job_release); NULL where Slurm has none. */
struct slurmlib_job {
    uint32_t id;
    uint32_t user_id;
    char *name;
    char *partition;
    char *reason;     /* why it is pending or why it failed; NULL: none */
    char *nodelist;   /* ranged ("node[1-2]"); NULL before it runs */
    char **nodes;     /* nodelist expanded through libslurm's hostlist; n_nodes of them */
    int n_nodes;      /* allocated nodes; while pending, the nodes asked for */
    char *batch_host; /* the node that runs the batch script */
    char *std_out;    /* the batch output's path, patterns expanded */
    char *comment;    /* SBATCH_COMMENT for gpurun's jobs, "gpurun: TEXT" with a --comment */
    char *exc_nodes;  /* the nodes it must not run on (ranged, as sbatch's --exclude); NULL */
    enum slurmlib_state state;
    bool completing;     /* ended, but processes are still being cleaned up on its nodes */
    bool ended;          /* a final state and nothing left on the nodes */
    time_t submit_time;  /* 0: unknown */
    time_t start_time;   /* 0: not started (while pending, maybe the expected start) */
    time_t begin_time;   /* while pending: the earliest start Slurm allows (a requeued
                          * job's hold); 0: none or not pending */
    time_t end_time;     /* 0: not ended */
    long elapsed_s;      /* run time so far, or in all once ended */
    long time_limit_min; /* 0: unlimited */
    int exit_code;       /* the batch script's exit code; -1: none yet */
    int exit_signal;     /* the signal that ended it; 0: none */
    int requeues;        /* times Slurm requeued it (its restart count) */
};

/* The name of a state ("RUNNING"), as Slurm spells it. */
const char *slurmlib_state_name(enum slurmlib_state state);

/* gpurun's exit status for an ended job (docs/design.md, section 1): COMPLETED and FAILED give the
 * script's own status (128+N for signal N; 125 for a failure without one), CANCELLED the
 * signal's (143 when none was recorded), TIMEOUT 124, OOM 137, and the node, boot, preemption
 * and deadline failures 125. */
int slurmlib_exit_status(const struct slurmlib_job *job);

/* Frees what job owns; job is zeroed. */
void slurmlib_job_release(struct slurmlib_job *job);

/* The Slurm configuration gpurun would use: $SLURM_CONF, else /etc/slurm/slurm.conf. Writes
 * it to buf (n bytes). Returns 0 when the file exists, -ENOENT (buf still written) when not. */
int slurmlib_conf_path(char *buf, size_t n);

/* Makes libslurm usable: checks that the configuration exists, initialises libslurm, and
 * pings slurmctld, which must answer within timeout_s. Idempotent. Returns 0, or -ENOENT
 * (no configuration), -ETIMEDOUT/-EHOSTUNREACH (slurmctld silent or down) or -ENOSYS (this
 * gpurun was built without libslurm) with err filled. */
int slurmlib_open(int timeout_s, struct errmsg *err);

/* Releases libslurm (slurm_fini) after a successful slurmlib_open. */
void slurmlib_close(void);

struct job_descriptor; /* libslurm's job_desc_msg_t */

/* Fills desc (libslurm's job_desc_msg_t, initialised here) from job: the fields the script's
 * #SBATCH directives name, plus script (borrowed), env (borrowed, env_size entries: sbatch
 * passes its whole environment, and slurmctld refuses a batch job without one) and the
 * caller's uid and gid. Pointers in desc are borrowed from job, script and env, but for
 * tres_per_node, mem_per_tres and comment, which point to this module's static storage until
 * the next call. */
void slurmlib_fill_desc(const struct sbatch_job *job, const char *script, char **env,
                        uint32_t env_size, struct job_descriptor *desc);

/* Asks slurmctld whether job could ever run (slurm_job_will_run2), without submitting it:
 * an unknown partition or account, more nodes, GPUs or memory than exist, a time over the
 * partition's limit, and a QOS, feature, node, reservation, dependency or GRES slurmctld
 * refuses are refused here. Returns 0, or -EINVAL with err filled ("unknown partition 'gpu'",
 * "--constraint: 'x': invalid feature specification"), or another negative errno for a
 * failed call. */
int slurmlib_check(const struct sbatch_job *job, const char *script, struct errmsg *err);

/* Reads a --begin value as sbatch does (libslurm's parse_time: "16:00", "now+1hour",
 * "2030-01-31T08:00", "tomorrow"...; a time of day past today's is tomorrow's) into *t (a
 * time_t). Returns 0, -EINVAL with err filled ("--begin: 'x' is not a time (...)"), or
 * -ENOSYS without libslurm. */
int slurmlib_parse_begin(const char *text, long long *t, struct errmsg *err);

/* Submits job with its script (slurm_submit_batch_job) and the environment of this process.
 * Returns 0 with *id set, or a negative errno with err filled. */
int slurmlib_submit(const struct sbatch_job *job, const char *script, uint32_t *id,
                    struct errmsg *err);

/* Loads job id into *job (zeroed first; release it). Returns 0, -ENOENT when slurmctld does
 * not know the id (never submitted, or purged MinJobAge after its end), or another negative
 * errno with err filled. */
int slurmlib_load(uint32_t id, struct slurmlib_job *job, struct errmsg *err);

/* Loads the jobs of user uid that carry gpurun's comment (sbatch_is_gpurun_comment), into *jobs
 * (new array of *n; free each with slurmlib_job_release, then the array). Returns 0 or a negative
 * errno. */
int slurmlib_list(uint32_t uid, struct slurmlib_job **jobs, size_t *n, struct errmsg *err);

/* The CPUs each rank can have on the nodes of partition (NULL: Slurm's default partition),
 * for a job of ranks ranks per node each with a GPU when gpus: the least, over the
 * partition's nodes with at least ranks GPUs, of the node's CPUs over its GPUs (its share of
 * CPUs per GPU); without gpus, of its CPUs over ranks. Returns 0 with *cpus (>= 1) set,
 * -ENOENT when no node of the partition fits, or a negative errno with err filled. */
int slurmlib_cpus_per_rank(const char *partition, int ranks, bool gpus, int *cpus,
                           struct errmsg *err);

/* Terminates job id as scancel does (slurm_kill_job with SIGKILL: Slurm sends SIGCONT and
 * SIGTERM to every process of the job, SIGKILL after KillWait). Returns 0, -EALREADY when
 * it has ended already, -ENOENT for an unknown id, or a negative errno with err filled. */
int slurmlib_kill(uint32_t id, struct errmsg *err);

/* Sets pending job id's excluded nodes (ExcNodeList, sbatch's --exclude) to nodes, a
 * hostlist expression; slurmctld takes it only while the job is pending. begin (0: none)
 * is given again as its earliest start, so that the update keeps a requeued job's hold (the
 * old segment's credentials live that long on its nodes). Returns 0 or a negative errno with
 * err filled. */
int slurmlib_exclude(uint32_t id, const char *nodes, time_t begin, struct errmsg *err);

/* Expands a hostlist expression ("node[1-3],gpu7") with libslurm's hostlist functions into
 * *names (new NULL-terminated array of new strings; free with slurmlib_names_free) and *n.
 * Returns 0, -EINVAL for an expression libslurm refuses, -ENOMEM. */
int slurmlib_hostlist_expand(const char *list, char ***names, int *n);

/* Frees what slurmlib_hostlist_expand returned. */
void slurmlib_names_free(char **names);

/* Parses a Slurm job id ("123"; not "123_4" or "123+0"). Returns 0 with *id, or -EINVAL. */
int slurmlib_parse_id(const char *s, uint32_t *id);

#endif

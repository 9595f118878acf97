/* Metrics for the cluster's monitoring: Prometheus text files for node_exporter's textfile
 * collector. Given a metrics dir (gpurun --metrics-dir), every node's agent writes
 * gpurun_<job>_node<k>.prom there every few seconds, atomically (a temp file renamed over
 * the old one: the collector never reads half a file), and removes it when the job ends on
 * that node. */
#ifndef GPURUN_METRICS_H
#define GPURUN_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One rank as its agent knows it. */
struct metrics_rank {
    int rank;
    int64_t step;
    double loss, tokens_per_s;
    int64_t report_age_ms; /* since its last progress report; -1: it never reported */
    double step_seconds;   /* its time per step (steptime.h); NAN: not known yet */
    int64_t output_age_ms; /* since its last byte of output; -1: it printed nothing yet */
    bool running;          /* spawned and not yet exited */
};

/* One node's view of the job. Every pointer is borrowed for the call. */
struct metrics_node {
    const char *job_id, *hostname;
    int node;
    const char *state;        /* one of metrics_states[] */
    int restarts;             /* the job's restarts so far (the leader's generation) */
    int64_t leader_hb_age_ms; /* since the leader was last heard; -1: no link */
    const struct metrics_rank *ranks;
    int nranks;
};

/* The states a node reports, in order, NULL-terminated: gpurun_node_state has one sample per
 * state, 1 for the current one. */
extern const char *const metrics_states[];

/* Renders n in Prometheus's text exposition format (0.0.4). Returns a new NUL-terminated
 * string (free()), or NULL when out of memory. A loss that is not finite, and the ages and
 * losses of ranks that never reported, are left out rather than written as a made-up value. */
char *metrics_render(const struct metrics_node *n);

/* Writes "DIR/gpurun_<job>_node<k>.prom" into out (n bytes), where <job> is job_id with every
 * byte outside [A-Za-z0-9_.-] as '_'. Returns 0, or -ENAMETOOLONG. */
int metrics_path(char *out, size_t n, const char *dir, const char *job_id, int node);

/* Renders n and replaces its file in dir: a temp file beside it, then rename. No fsync: the
 * file is rewritten seconds later, and the event loop must not wait on a disk. Returns 0 or a
 * negative errno (the temp file is then gone). */
int metrics_write(const char *dir, const struct metrics_node *n);

/* The leader's view of the stragglers (leader.c's rule), in a file of its own beside the
 * nodes': gpurun_<job>_leader.prom, with gpurun_node_straggler (0 or 1 for every node serving
 * the job) and gpurun_rank_straggler_ratio (for each straggler). */
struct metrics_leader_node {
    int node;
    const char *hostname;
    bool straggler;
};
struct metrics_leader_rank {
    int rank, node;
    double slower; /* 0.5: 50% slower than the median */
};
struct metrics_leader {
    const char *job_id;
    const struct metrics_leader_node *nodes;
    int nnodes;
    const struct metrics_leader_rank *ranks;
    int nranks;
};
/* The file's text (free()), or NULL when out of memory. */
char *metrics_leader_render(const struct metrics_leader *m);
/* Replaces DIR/gpurun_<job>_leader.prom as metrics_write does; removes it. 0 or -errno. */
int metrics_write_leader(const char *dir, const struct metrics_leader *m);
int metrics_remove_leader(const char *dir, const char *job_id);

/* Removes the node's file from dir. Returns 0 (also when it was not there) or a negative
 * errno. */
int metrics_remove(const char *dir, const char *job_id, int node);

#endif

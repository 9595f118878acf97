/* Why a job's hot spares stayed idle when it ended (docs/design.md, section 4): a rule of
 * what the leader knows at the end, so that its end line, summary.json and gpurun status can
 * say it rather than leave "1 idle" to be puzzled over. Pure: no clock, no I/O. */
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

#endif

/* The stragglers rule (docs/design.md, section 4): which running ranks are slower than the
 * job's median time per step, and by how much. Rank-level, so that a slow node shows through
 * its ranks; under data parallelism only ranks whose reports say their own step time
 * (gpurun-train does, gpurun.report(step_time=...)) tell the slow rank from the ones that
 * wait for it (steptime.h). Pure: the leader gathers each rank's average, names the ranks
 * the verdict marks and acts (--straggler-action). */
#ifndef GPURUN_STRAGGLERS_H
#define GPURUN_STRAGGLERS_H

#include <stdbool.h>
#include <stdint.h>

/* One rank's time per step as the leader knows it. */
struct straggler_rank {
    bool running;  /* running now: a rank that ended keeps what it was last called */
    bool reported; /* it reported progress */
    int64_t steps; /* the steps its average covers */
    double avg;    /* its seconds per step */
};

/* Judges the n ranks of k: the median is the job's only once every running rank that
 * reported has min_steps steps in its average (a slow rank still gathering its steps is the
 * likeliest straggler, and the median of the fast ones that got there first is no median)
 * and at least two have. Then each running rank's slower[r] is set: its average over the
 * median minus one (0.38: 38% slower) where that is pct percent or more and it has its
 * window, else 0; slower[r] of a rank not running is left as it was. Returns 1 with the
 * median in *median when judged, 0 when not yet (nothing set), -ENOMEM. */
int stragglers_judge(const struct straggler_rank *k, int n, double pct, int64_t min_steps,
                     double *slower, double *median);

#endif

/* A rank's time per training step, from its progress reports, made by its agent (agent.c)
 * from every report: for the gpurun_rank_step_seconds metric, and sent with the progress
 * batch to the leader for the stragglers rule (stragglers.h). A report may say how long its
 * step's own work took (step_time: without the time spent waiting on the other ranks, which
 * under data parallelism makes every rank as slow as the slowest); otherwise the time between
 * two reports over the steps between them is the sample. Samples go into a moving average
 * over about STEPTIME_WINDOW steps. */
#ifndef GPURUN_STEPTIME_H
#define GPURUN_STEPTIME_H

#include <stdint.h>

#define STEPTIME_WINDOW 50

struct steptime {
    double avg;      /* seconds per step; valid once steps > 0 */
    int64_t steps;   /* steps the average covers so far */
    int64_t prev_ms; /* the last report's time and step; prev_ms 0: none yet */
    int64_t prev_step;
};

/* One report: step reached at ms (a monotonic clock), own the step's own time in seconds
 * (not finite or <= 0: not given). A report of no new step (a repeat, or a restart's step
 * back) adds no sample. */
void steptime_add(struct steptime *s, int64_t ms, int64_t step, double own);

#endif

/* Whether a cancel explains the job's first failure (docs/design.md, section 4): Slurm's
 * scancel, a preemption or a requeue signals every process of the job step, the ranks with
 * their daemons, and a rank may die of that signal before its daemon hears its own. Pure: the
 * leader passes the first failure's signal and when it came, and the cancel's time; where the
 * rule holds it records the job as cancelled, not as the rank's failure. */
#ifndef GPURUN_CANCEL_H
#define GPURUN_CANCEL_H

#include <stdbool.h>
#include <stdint.h>

/* How long after a rank's death by a terminating signal a cancel still explains it: the
 * scheduler signals the step's processes one after another, milliseconds apart, but a busy
 * node may run its daemon's handler late. */
#define CANCEL_EXPLAINS_MS 2000

/* Whether a cancel at cancel_ms explains a rank's death by signal sig at failed_ms (ms on one
 * clock): sig is one a cancel sends (SIGTERM, SIGINT, SIGHUP; not SIGKILL, which comes only
 * after the grace, nor a crash's) and the cancel came within CANCEL_EXPLAINS_MS after it. */
bool cancel_explains(int sig, int64_t failed_ms, int64_t cancel_ms);

#endif

/* gpurun status's view of one job: Slurm's record, the leader's live per-rank view while
 * the job runs, and summary.json once it has ended, merged into one JSON object (the stable
 * --json layout, documented in README.md) and printed for a person from that object. */
#ifndef GPURUN_CLIENT_VIEW_H
#define GPURUN_CLIENT_VIEW_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "slurmlib.h"

/* The format's version, "version" in every view: bumped only if a field changes meaning. */
#define VIEW_VERSION 1

/* Width of the progress bar, in characters between the brackets. */
#define VIEW_BAR_WIDTH 40

/* What a view is made of. All borrowed. */
struct view_input {
    const char *job_id;               /* Slurm's id or a local job's */
    const struct slurmlib_job *slurm; /* NULL: not a Slurm job, or Slurm has forgotten it */
    const char *slurm_error;          /* why slurm is NULL for a Slurm job; NULL: none */
    const char *job_dir;              /* NULL: none yet (a pending Slurm job) */
    int timeout_ms;                   /* bound on each step of the leader query */
    bool no_live; /* ask no leader (lists: one stuck node must not stall them); a local job's
                   * leader is checked by its pid */
};

/* Builds the view of one job: {"version", "job_id", "name": Slurm's job name, else job.json's
 * | null, "job_dir", "slurm": {...} | null,
 * "state", "ended", "exit_status", "live": leader's job | null, "live_error", "summary":
 * summary.json | null, "progress": {...} | null, "timings": {...}, "first_failure",
 * "elapsed_s": Slurm's, else from the timings | null}. Never
 * fails but for memory (NULL). The job is asked over the network only when it has a job dir
 * with an endpoint and no summary. Returns a new reference. */
json_t *view_build(const struct view_input *in);

/* Whether the leader of a job on this machine (dir's endpoint.json on loopback, borrowed)
 * still runs. */
bool view_local_leader_alive(const char *dir);

/* Whether the view is of a job that will not change any more. */
bool view_ended(const json_t *view);

/* Prints a view (borrowed) for a person: a header of "key: value" lines (job, state, nodes,
 * elapsed, ranks, progress bar; outcome, first failure and timings once ended), then the
 * ranks' table. */
void view_print(FILE *out, const json_t *view);

/* Prints the one-line-per-job table of a list of views (borrowed array). */
void view_print_list(FILE *out, const json_t *views);

/* The progress bar: "[#####.....]  12% (122/1000)" into buf (n bytes) for step of total. */
void view_bar(char *buf, size_t n, long step, long total);

/* Seconds a job has run, from when it started (seconds since the epoch; 0: unknown) to its
 * end (0: not seen), or to now while it runs. Returns them, or -1 when unknown (no start,
 * or neither an end nor running). */
long view_elapsed_s(double started, double ended, bool running, double now);

/* "1:02:03" or "2-01:02:03" for seconds into buf; "-" for a negative value. */
void view_duration(char *buf, size_t n, long seconds);

#endif

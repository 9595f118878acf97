/* gpurun logs for a job dir: the rank logs the daemons wrote under logs/. */
#ifndef GPURUN_CLIENT_LOGS_H
#define GPURUN_CLIENT_LOGS_H

#include <stdbool.h>
#include <stdio.h>

#include "errmsg.h"

/* A failure below fills the caller's struct errmsg with one line: "no log of rank 7 in
 * '/x/logs'". */

/* Prints the rank logs of job_dir (borrowed) to out. With rank >= 0, logs/rank-R.log as it
 * is; with rank < 0, every rank's lines in the order they were written (by the logs' indexes,
 * logidx.h; a job dir without them rank by rank), each prefixed "[N] " as in the merged
 * stream of a running job. Returns 0, or a negative errno with err filled: -ENOENT when
 * there is no such log (or no logs/ at all). */
int logs_print(FILE *out, const char *job_dir, int rank, struct errmsg *err);

/* Whether the job has ended (borrowed arg); called between polls by logs_follow(). */
typedef bool (*logs_ended_fn)(void *arg);

/* Like logs_print(), then keeps printing what the daemons append, and the logs of ranks that
 * appear later, polling every LOGS_POLL_MS, until ended(arg) says the job is over; then
 * prints what is left (a last line without its newline gets one) and returns 0. Only whole
 * lines are printed while the job runs, so that ranks' lines never interleave mid-line.
 * Returns a negative errno with err filled when a log cannot be read. A job dir without
 * logs/ yet (a pending Slurm job) is waited for. */
int logs_follow(FILE *out, const char *job_dir, int rank, logs_ended_fn ended, void *arg,
                struct errmsg *err);

/* The poll period of logs_follow(): fast enough to read as live, slow enough to cost nothing. */
#define LOGS_POLL_MS 200

#endif

/* Following a Slurm job for gpurun --wait: its state through slurmctld until it ends, its
 * batch output (the daemons' merged "[R] line" stream) to stdout as it grows, and its end
 * turned into gpurun's exit status. */
#ifndef GPURUN_CLIENT_FOLLOW_H
#define GPURUN_CLIENT_FOLLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How often slurmctld is asked about the job: first after FOLLOW_POLL_MIN_MS, doubling up
 * to FOLLOW_POLL_MAX_MS, so that a short job ends promptly and a long one costs slurmctld
 * one RPC a second. The output file is read every FOLLOW_READ_MS. */
#define FOLLOW_POLL_MIN_MS 200
#define FOLLOW_POLL_MAX_MS 1000
#define FOLLOW_READ_MS     100

/* How long gpurun keeps streaming after it cancelled the job on a signal: time for every
 * node to tear its ranks down and for Slurm's KillWait. */
#define FOLLOW_CANCEL_WAIT_MS 30000

/* Waits for Slurm job id (libslurm opened) to end, copying its batch output to stdout from
 * the start. job_dir (borrowed; NULL: unknown) is where summary.json is looked for if Slurm
 * forgets the job before gpurun sees its end. A SIGINT, SIGTERM or SIGHUP cancels the job
 * (slurm_kill_job) and keeps streaming until it has ended; a second one stops waiting.
 * Returns gpurun's exit status: the job's (slurmlib_exit_status), or 125 when it cannot be
 * known; sets *fatal_signal to the signal that stopped the wait (0: none), which the caller
 * should die of. Prints its own failures as "gpurun: ..." lines on stderr. Thread context:
 * the process's only thread; the three signals are blocked while it runs. */
int follow_job(uint32_t id, const char *job_dir, int *fatal_signal);

/* Whether line (n bytes, without its newline; borrowed) is slurmstepd's word of a cancel,
 * which it writes into the batch output itself: "slurmstepd-node1: error: *** JOB 6 ON node1
 * CANCELLED AT 2026-12-01T23:41:09 ***" (or STEP 6.0). follow_job leaves it out: gpurun's own
 * closing line says the job was cancelled. One that says why ("... DUE TO TIME LIMIT ***")
 * is kept. */
bool follow_slurm_noise(const char *line, size_t n);

#endif

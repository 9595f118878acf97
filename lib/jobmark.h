/* The job mark: an environment variable every rank starts with, GPURUN_JOB_MARK, so that a
 * process of a job is found by what it carries rather than by where it is. A process that
 * left its rank's process group and cgroup (setsid, then its pid written into a hierarchy's
 * root cgroup.procs) still carries the mark its rank was started with, and what inherits its
 * environment does too (docs/design.md, section 4).
 *
 * The value is "JOB/PID/START/RANK": JOB is 16 hex digits of HMAC(the job's key, "gpurun job
 * mark"), which every node and gpurun compute alike without being told it (it is no secret:
 * the shim's command line shows it, and a process that copies it into its own environment
 * only gets itself ended); PID and START are the pid of the daemon that spawned the rank and
 * its start time (clock ticks after boot, field 22 of /proc/PID/stat; 0 when unknown), which
 * together tell whether that daemon still runs; RANK is the rank's number. What is read is a
 * process's environment as it was exec'd
 * (/proc/PID/environ): setenv and unsetenv do not change it, an exec with another environment
 * (env -i) does.
 *
 * The judging parts (parse, find, match, owner gone) are pure; jobmark_sweep() reads /proc
 * and acts on what they judge. */
#ifndef GPURUN_JOBMARK_H
#define GPURUN_JOBMARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "auth.h"

#define JOBMARK_ENV "GPURUN_JOB_MARK"
/* A formatted value's bound: 16 hex digits, three decimal numbers of at most 20 digits each,
 * three slashes and the NUL. */
#define JOBMARK_LEN 96

struct jobmark {
    uint64_t job;             /* the job's value from its key (jobmark_job) */
    long daemon;              /* the pid of the daemon that spawned the rank */
    unsigned long long start; /* that daemon's start time in clock ticks after boot; 0: unknown */
    int rank;                 /* the rank's number */
};

/* What a sweep ends: every process of the job (JOBMARK_JOB: gpurun --local at the job's end),
 * of one daemon (JOBMARK_DAEMON: the daemon at its end), of one rank (JOBMARK_RANK: a shim
 * whose agent is gone), or every process whose mark names a daemon that no longer runs
 * (JOBMARK_STALE: a daemon's start, for the jobs of daemons killed outright). */
enum jobmark_scope { JOBMARK_JOB, JOBMARK_DAEMON, JOBMARK_RANK, JOBMARK_STALE };

/* The job's value (struct jobmark's job) from its key (borrowed). */
uint64_t jobmark_job(const struct auth_key *key);

/* Writes m's value ("JOB/PID/START/RANK") into out (n bytes, JOBMARK_LEN suffice). Returns 0 or
 * -ENAMETOOLONG. */
int jobmark_format(const struct jobmark *m, char *out, size_t n);

/* Parses len bytes of s (borrowed; need not end in a NUL) as a mark's value into *m. Returns 0
 * or -EINVAL (anything but four fields of the right forms: 16 hex digits, then a pid > 0, a
 * start time and a rank >= 0 in decimal). */
int jobmark_parse(const char *s, size_t len, struct jobmark *m);

/* The marks an environment carries: env is len bytes of NUL-separated "K=V" entries as
 * /proc/PID/environ gives them (borrowed; the last entry need not end in a NUL). Fills
 * out[0..max) with the first valid GPURUN_JOB_MARK entries, in order, and returns how many
 * valid ones there are in all (an entry that does not parse is not a mark). Pure. */
size_t jobmark_find(const char *env, size_t len, struct jobmark *out, size_t max);

/* Whether have is one of want's within scope: the same job (JOBMARK_JOB), also the same daemon
 * (JOBMARK_DAEMON: pid and start time), also the same rank (JOBMARK_RANK). JOBMARK_STALE
 * matches nothing here: it is jobmark_owner_gone's. Pure. */
bool jobmark_matches(const struct jobmark *have, const struct jobmark *want,
                     enum jobmark_scope scope);

/* Whether the daemon m names is gone, given what runs under its pid now: start_now is that
 * process's start time, 0 when no process has that pid. A mark without a start time (0)
 * counts as its daemon's while the pid runs. Pure. */
bool jobmark_owner_gone(const struct jobmark *m, unsigned long long start_now);

/* The start time of process pid (field 22 of /proc/PID/stat) into *start. Returns 0, -ENOENT
 * when no such process runs (none has that pid, or a zombie has), or another negative
 * errno. */
int jobmark_proc_start(long pid, unsigned long long *start);

/* What a sweep did. */
struct jobmark_sweep_stats {
    int scanned; /* processes looked at (every round's) */
    int killed;  /* processes sent SIGKILL, each counted once */
    int rounds;  /* scans of /proc: one more than the rounds that found something new */
};

/* SIGKILLs every process this one may signal whose environment carries a mark matching want
 * within scope (want is borrowed; NULL for JOBMARK_STALE, which takes only processes of our
 * own pid namespace, so that a pid is read as the daemon's where that daemon lives). This
 * process and skip (0: none) are never killed. Scans again while a scan finds a process not
 * killed yet (one forked meanwhile), at most JOBMARK_ROUNDS times. Fills *stats (may be NULL).
 * Returns 0, or a negative errno when /proc cannot be read. Blocking: a scan costs
 * about 20 us a process (a read of its environ; 2000 processes: 40-50 ms on a virtual
 * machine, 0.5 ms for 120), so call it where a pause is no harm, never per rank's exit of a
 * daemon's loop, and not from a signal handler. */
int jobmark_sweep(const struct jobmark *want, enum jobmark_scope scope, pid_t skip,
                  struct jobmark_sweep_stats *stats);

#endif

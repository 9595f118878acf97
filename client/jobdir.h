/* The job dir as gpurun creates it (docs/design.md, section 2): a private directory holding the
 * per-job key, the spec every daemon reads, and logs/; and the jobs root, the one place where
 * gpurun works out where job dirs live. */
#ifndef GPURUN_CLIENT_JOBDIR_H
#define GPURUN_CLIENT_JOBDIR_H

#include <stddef.h>
#include <time.h>

#include "errmsg.h"
#include "jobspec.h"

/* A failure below fills the caller's struct errmsg with one line: "cannot create job dir
 * '/x/y': permission denied". */

/* Writes the id of a local job, "local-YYYYmmdd-HHMMSS-PID" (t in local time), to buf of n
 * bytes. Returns 0, or -ENAMETOOLONG when it does not fit. */
int jobdir_local_id(char *buf, size_t n, time_t t, long pid);

/* The environment variable that names the jobs root, and the root under a home directory
 * when it is not set. */
#define JOBDIR_ENV       "GPURUN_JOBS"
#define JOBDIR_HOME_ROOT ".gpurun/jobs"

/* Writes the jobs root, the directory job dirs live in by default, to buf (n bytes): the
 * environment's JOBDIR_ENV made absolute against the working directory, else
 * HOME/JOBDIR_HOME_ROOT (HOME from the environment, else the password database). Every gpurun
 * command that looks for or makes a job dir asks here. Returns 0, -ENAMETOOLONG (also when
 * JOBDIR_ENV's value cannot be made absolute), or -ENOENT when there is no home directory (or the
 * root under it does not fit). */
int jobdir_root(char *buf, size_t n);

/* Creates the jobs root (jobdir_root's, in root; with its missing parents, 0700) if it is not
 * there. Returns 0, or the error with err naming where root came from: "GPURUN_JOBS '/x':
 * cannot create it: permission denied", or "cannot create the jobs root '/home/u/.gpurun/jobs':
 * ...". */
int jobdir_root_make(const char *root, struct errmsg *err);

/* Makes dir a job dir for spec (borrowed; its job_id and argv set): creates dir (and missing
 * parents, 0700) or takes an existing empty directory, sets its mode to 0700, creates logs/
 * (0700), a fresh key in key (0600, auth_key_write) and job.json (0600, jobspec_save). A
 * directory that is not empty is refused, so one dir never holds two jobs' keys. Returns 0,
 * or a negative errno with err filled; on failure what this call created is removed again. */
int jobdir_create(const char *dir, const struct jobspec *spec, struct errmsg *err);

#endif

/* Rank containment in cgroup v2: each rank runs in a cgroup of its own under a job cgroup
 * made below the daemon's own cgroup, so that everything a rank started (setsid, double fork
 * and all) is found and ended as a whole. Where the machine has no writable cgroup v2 (a v1
 * host, an unprivileged user without delegation, a Slurm step without one), there is no job
 * cgroup and ranks are ended by process group only. */
#ifndef GPURUN_CGROUP_H
#define GPURUN_CGROUP_H

#include <stddef.h>

#include "errmsg.h"

/* Creates the job cgroup `<our cgroup v2 dir>/gpurun-<our pid>` (an existing one is reused;
 * the empty ones of daemons that are gone are removed).
 * dir (caller-owned, len bytes) gets its path. Returns 0, or a negative errno with why
 * (caller-owned) filled with a lowercase reason, e.g. "no cgroup v2 mount". */
int cgroup_job_create(char *dir, size_t len, struct errmsg *why);

/* dir (a directory of the cgroup v2 mount) as a path of the hierarchy ("/gpurun-42/rank-3"),
 * what a container runtime's --cgroup-parent takes, into out (len bytes). Returns 0, or a
 * negative errno (-EINVAL: dir is not under the mount). */
int cgroup_hierarchy_path(const char *dir, char *out, size_t len);

/* Creates dir (a rank's cgroup: a child of the job cgroup, which is made too where it is
 * gone; an existing one is reused).
 * Returns 0 or a negative errno. */
int cgroup_make(const char *dir);

/* Moves the process pid (0: the caller) into dir. Returns 0 or a negative errno. */
int cgroup_enter(const char *dir, int pid);

/* SIGKILLs every process in dir and in the cgroups below it: cgroup.kill where the kernel
 * has it (5.14), else every pid of each cgroup.procs, again until they are empty. Does not
 * wait for them to be gone. Returns 0, -ENOENT when dir does not exist, or a negative errno.
 * Async-signal-safe it is not: call it from ordinary context. */
int cgroup_kill(const char *dir);

/* Kills what is left in dir (cgroup_kill), waits up to wait_ms for it to be empty, then
 * removes dir and the cgroups below it. Returns 0 (also when dir did not exist), -EBUSY when
 * processes were still there after wait_ms, or another negative errno. */
int cgroup_remove(const char *dir, int wait_ms);

#endif

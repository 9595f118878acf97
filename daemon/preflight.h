/* Pre-flight checks: what a node's agent checks before it joins, so that a node unfit to run
 * the job is named (and replaced by a spare, or the job ends) before any rank starts:
 *  - its GPUs, where the job asks for them (jobspec.gpus_per_node): as many visible as asked.
 *    Visible: NVML's device count where libnvidia-ml loads (dlopen: the driver's), else the
 *    entries of CUDA_VISIBLE_DEVICES (what Slurm gives a step, fake GPUs of a test cluster
 *    included), else the /dev/nvidiaN character devices;
 *  - their memory, where the job asks for GPUs and NVML loads: each device the step may use
 *    (NVML's, narrowed by CUDA_VISIBLE_DEVICES: a number is NVML's index, "GPU-..." a UUID)
 *    has jobspec.min_gpu_free_pct percent of its memory free, so that a GPU a leftover
 *    process holds is caught (0: not checked). Without NVML the check is skipped:
 *    CUDA_VISIBLE_DEVICES and /dev tell nothing of memory. Not judged either: an entry that
 *    names no NVML device (the count above is the check of those; a "MIG-..." instance) and a
 *    device NVML may not read (NVML_ERROR_NO_PERMISSION: another job's, behind a cgroup); one
 *    it cannot read otherwise (fallen off the bus) fails;
 *  - the job dir: a file can be written (its close checked: where NFS says a write failed)
 *    and removed there, and the file system has jobspec.min_free_mb MiB free;
 *  - a train.cfg's out_dir (jobspec.out_dir, relative to jobspec.workdir), where checkpoints
 *    go: as the job dir where it exists; where not, the nearest dir above it lets it be made
 *    and has the free space. */
#ifndef GPURUN_PREFLIGHT_H
#define GPURUN_PREFLIGHT_H

#include <stdbool.h>
#include <stddef.h>

#include "jobspec.h"

/* The link test judges a node's link against the median of the timed ones: with fewer than
 * this many, it can fail none (daemon/leader_join.c). */
#define PREFLIGHT_LINKS_MIN 2

/* Whether an agent away from the leader's host times its link (sends the probe): where the
 * job has nodes enough (nnodes + spares) for PREFLIGHT_LINKS_MIN links away from the leader's
 * host, or for gpurun preflight, which reports every link's figure. A job of two nodes has
 * one such link, which nothing could be measured against: its probe would only cost the
 * start a millisecond. */
bool preflight_link_timed(int nodes, bool preflight_only);

/* Runs the checks for node `node` of spec with its job dir. why gets "" when every check
 * passed, else one line naming the first that failed and its figure ("1 of 2 GPUs visible
 * (CUDA_VISIBLE_DEVICES)"; "GPU 1 (NVML): 2048 of 81920 MiB free, below 90%"; "job dir '/x': 12
 * MiB free, below 64"). skipped (sn bytes) gets "" or the check asked for but not made, and
 * why (preflight_memory_skip). */
void preflight_run(const struct jobspec *spec, const char *job_dir, int node, char *why, size_t n,
                   char *skipped, size_t sn);

/* The GPU memory check of a job that asks for GPUs, asked (pct > 0) but not possible, into
 * skipped (n bytes; "" where it is made or not asked): without NVML (nvml_why: why it did not
 * load or start; NULL or "": it did), "GPU memory (--min-gpu-free 50): no NVML
 * (libnvidia-ml.so.1: cannot open shared object file...)"; or without its memory calls
 * (memory_calls false). */
void preflight_memory_skip(int pct, const char *nvml_why, bool memory_calls, char *skipped,
                           size_t n);

#endif

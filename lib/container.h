/* Ranks in containers (--container-image): which runtime runs them, and the command line each
 * runtime is given for one rank. rendezvousd stays on the host: a rank's command becomes the
 * runtime's "run IMAGE CMD...", with the host's network, IPC and process view (NCCL, gloo and
 * the stacks of a hung rank work as outside), the rank's environment as gpurun made it, the
 * job dir, the rank's socket dir and gpurun's Python package mounted at their own paths, and
 * the user's mounts. Pure: nothing here reads the machine but through the callback given. */
#ifndef GPURUN_CONTAINER_H
#define GPURUN_CONTAINER_H

#include <stdbool.h>
#include <stddef.h>

#include "errmsg.h"

/* --container-runtime's values. PYXIS: Slurm's pyxis plugin, whose engine is enroot: in a
 * gpurun job the node's daemon starts the ranks itself, not srun, so it drives enroot as
 * pyxis would (the same image names, mounts and environment). */
enum container_runtime {
    CONTAINER_AUTO,
    CONTAINER_PODMAN,
    CONTAINER_DOCKER,
    CONTAINER_APPTAINER,
    CONTAINER_ENROOT,
    CONTAINER_PYXIS,
};

/* The runtime named s ("auto", "podman", "docker", "apptainer" or "singularity", "enroot",
 * "pyxis"), or -1. */
int container_runtime_parse(const char *s);

/* Its name ("podman"), "auto" for CONTAINER_AUTO, "?" out of range. */
const char *container_runtime_name(int rt);

/* The program it runs: podman, docker, apptainer, enroot (pyxis's too). NULL for AUTO. */
const char *container_runtime_program(int rt);

/* The runtime a job uses: named (not AUTO) as it is; else pyxis where the node is in a Slurm
 * job whose srun has the plugin (have_pyxis), else the first of podman, docker, apptainer
 * (also as "singularity") and enroot whose program found(program, ctx) finds. CONTAINER_AUTO
 * when none is. */
int container_runtime_pick(int named, bool have_pyxis, bool (*found)(const char *, void *),
                           void *ctx);

/* Checks --container-mounts: "SRC:DST[:ro|:rw]" items separated by commas, both paths
 * absolute. Returns 0, or -EINVAL with err naming the item ("'data:/data': the source must
 * be an absolute path"). */
int container_mounts_check(const char *mounts, struct errmsg *err);

/* Checks --container-env: names of variables separated by commas. Returns 0 or -EINVAL with
 * err naming the item. */
int container_env_check(const char *names, struct errmsg *err);

/* One rank's container. Strings and vectors are borrowed. */
struct container_run {
    int runtime;                  /* not AUTO */
    const char *image;            /* the image as the runtime names it */
    const char *mounts;           /* --container-mounts (checked); NULL: none */
    const char *workdir;          /* the rank's working directory inside; NULL: the image's */
    const char *name;             /* the container's name: unique on the node */
    const char *job_id;           /* a label on it (podman, docker): gpurun.job=JOB_ID */
    const char *cgroup_parent;    /* podman: the rank's cgroup, relative to the cgroup root,
                                   * that conmon and the container are made under (cgroupfs);
                                   * NULL: none */
    const char *const *env_names; /* NULL-terminated: the variables passed from the rank's
                                   * environment (the runtime's client has it) */
    const char *const *binds;     /* NULL-terminated host paths mounted at the same path */
    bool gpus;                    /* the node's GPUs inside (CDI, --gpus, --nv, NVIDIA's hook) */
    unsigned uid, gid;            /* who the rank runs as (podman, docker) */
};

/* The words that start the rank's command (its argv follows them), NULL-terminated and
 * malloc'd with their strings (container_argv_free), or NULL when out of memory:
 *   podman --cgroup-manager=cgroupfs run --rm --pull=never --name N --label gpurun.job=J
 * --network=host
 *     --ipc=host --pid=host --user U:G [--cgroup-parent=P] [--device nvidia.com/gpu=all]
 *     [-e NAME]... [-v SRC:DST[:ro]]... [--workdir D] IMAGE
 *   docker run --rm --pull=never --name N --label gpurun.job=J --network=host --ipc=host --pid=host
 *     --user U:G [--gpus all] [-e NAME]... [-v SRC:DST[:ro]]... [--workdir D] IMAGE
 *   apptainer exec [--nv] [--bind SRC:DST[:ro]]... [--pwd D] IMAGE   (the environment passes)
 *   enroot start [--env NVIDIA_VISIBLE_DEVICES=all] [--env NAME]... [--mount SRC:DST]...
 *     IMAGE (pyxis the same)   (enroot start runs a squashfs image or a created container;
 *     the working directory is cd'd to by `sh -c 'cd D && exec "$@"'` where asked) */
char **container_argv(const struct container_run *c);

/* The command that removes the container named name, whatever is left of it (podman and
 * docker keep a stopped container whose conmon or client was killed): NULL-terminated and
 * malloc'd (container_argv_free), or NULL for a runtime that keeps nothing (apptainer, enroot
 * start of an image) or out of memory. */
char **container_rm_argv(int runtime, const char *name);

/* pyxis's srun options for the same container (the emitted sbatch script shows them beside
 * gpurun's command, for a step run with srun alone): --container-image=IMAGE
 * [--container-mounts=M] [--container-workdir=D] [--container-env=NAMES]. Malloc'd as
 * container_argv. */
char **container_pyxis_options(const char *image, const char *mounts, const char *workdir,
                               const char *env_names);

void container_argv_free(char **argv);

#endif

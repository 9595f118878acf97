/* Tests of lib/container: the runtime's choice, the checks of --container-mounts and
 * --container-env, and each runtime's command line for a rank, word for word, held to the
 * runtimes' own documentation:
 *   podman run (docs.podman.io, podman-run(1)): --rm, --pull=never, --name, --label,
 * --network=host,
 *     --ipc=host, --pid=host, --user, --cgroup-parent, --device (CDI: nvidia.com/gpu=all),
 *     -e NAME (the value from the client's environment), -v SRC:DST[:ro], --workdir; the global
 *     --cgroup-manager=cgroupfs; podman rm --force --ignore;
 *   docker run (docs.docker.com, "docker container run"): the same but --gpus all, no
 *     --cgroup-manager; docker rm --force;
 *   apptainer exec (apptainer.org, "apptainer exec"): --nv, --bind SRC:DST[:ro], --pwd; the
 *     host's environment passes by default;
 *   enroot start (github.com/NVIDIA/enroot, doc/cmd/start.md): --env NAME[=VALUE],
 *     --mount SRC:DST (fstab-like, ro flag only), then the image and the command;
 *   pyxis (github.com/NVIDIA/pyxis, srun --help): --container-image=, --container-mounts=,
 *     --container-workdir=, --container-env=. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "errmsg.h"
#include "test.h"
#include "banned.h"

/* The words of argv joined by spaces, into buf. */
static const char *joined(char **argv, char *buf, size_t n)
{
    size_t len = 0;

    buf[0] = '\0';
    for (char **p = argv; p && *p; p++)
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s", p == argv ? "" : " ", *p);
    return buf;
}

static bool found_in(const char *program, void *ctx)
{
    return strstr((const char *)ctx, program) != NULL;
}

TEST(container_runtime_names_and_choice)
{
    CHECK_EQ(container_runtime_parse("podman"), CONTAINER_PODMAN);
    CHECK_EQ(container_runtime_parse("singularity"), CONTAINER_APPTAINER);
    CHECK_EQ(container_runtime_parse("pyxis"), CONTAINER_PYXIS);
    CHECK_EQ(container_runtime_parse("auto"), CONTAINER_AUTO);
    CHECK_EQ(container_runtime_parse("lxc"), -1);
    CHECK_STR(container_runtime_name(CONTAINER_DOCKER), "docker");
    CHECK_STR(container_runtime_program(CONTAINER_PYXIS), "enroot");
    /* Named: as it is, found or not. */
    CHECK_EQ(container_runtime_pick(CONTAINER_DOCKER, true, found_in, (void *)""),
             CONTAINER_DOCKER);
    /* pyxis where Slurm has it; else podman, docker, apptainer (or singularity), enroot. */
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, true, found_in, (void *)"podman"),
             CONTAINER_PYXIS);
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, false, found_in, (void *)"docker podman"),
             CONTAINER_PODMAN);
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, false, found_in, (void *)"enroot docker"),
             CONTAINER_DOCKER);
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, false, found_in, (void *)"singularity"),
             CONTAINER_APPTAINER);
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, false, found_in, (void *)"enroot"),
             CONTAINER_ENROOT);
    CHECK_EQ(container_runtime_pick(CONTAINER_AUTO, false, found_in, (void *)""), CONTAINER_AUTO);
}

TEST(container_mounts_and_env_checked_with_the_item_named)
{
    struct errmsg err = {{0}};

    CHECK_EQ(container_mounts_check("/data:/data", &err), 0);
    CHECK_EQ(container_mounts_check("/a:/b:ro,/c:/d:rw,/e:/f", &err), 0);
    CHECK_EQ(container_mounts_check("data:/data", &err), -EINVAL);
    CHECK_STR(err.text, "'data:/data': the source must be an absolute path");
    CHECK_EQ(container_mounts_check("/a:/b,/c:d", &err), -EINVAL);
    CHECK_STR(err.text, "'/c:d': the destination must be an absolute path");
    CHECK_EQ(container_mounts_check("/a", &err), -EINVAL);
    CHECK_STR(err.text, "'/a': SRC:DST expected");
    CHECK_EQ(container_mounts_check("/a:/b:rx", &err), -EINVAL);
    CHECK_STR(err.text, "'/a:/b:rx': the flag must be ro or rw");
    CHECK_EQ(container_mounts_check("/a:/b,,/c:/d", &err), -EINVAL);
    CHECK_EQ(container_mounts_check("", &err), -EINVAL);

    CHECK_EQ(container_env_check("HF_HOME,WANDB_API_KEY", &err), 0);
    CHECK_EQ(container_env_check("HF_HOME,2X", &err), -EINVAL);
    CHECK_STR(err.text, "'2X' is not a variable's name");
    CHECK_EQ(container_env_check("A=B", &err), -EINVAL);
    CHECK_EQ(container_env_check("A,", &err), 0);
    CHECK_EQ(container_env_check("A,,B", &err), -EINVAL);
}

static const char *const env[] = {"RANK", "MASTER_ADDR", NULL};
static const char *const binds[] = {"/jobs/j1", "/run/gpurun", NULL};

TEST(container_argv_podman_and_docker)
{
    char buf[2048];
    struct container_run c = {
        .runtime = CONTAINER_PODMAN,
        .image = "localhost/train:1",
        .mounts = "/data:/data:ro",
        .workdir = "/work",
        .name = "gpurun-j1-r3",
        .job_id = "j1",
        .cgroup_parent = "/gpurun-42/rank-3",
        .env_names = env,
        .binds = binds,
        .gpus = true,
        .uid = 1000,
        .gid = 100,
    };
    char **argv = container_argv(&c);

    CHECK_STR(joined(argv, buf, sizeof(buf)),
              "podman --cgroup-manager=cgroupfs run --rm --pull=never --name gpurun-j1-r3 --label "
              "gpurun.job=j1 "
              "--network=host --ipc=host --pid=host --user 1000:100 "
              "--cgroup-parent=/gpurun-42/rank-3 --device nvidia.com/gpu=all -e RANK -e "
              "MASTER_ADDR -v /jobs/j1:/jobs/j1 -v /run/gpurun:/run/gpurun -v /data:/data:ro "
              "--workdir /work localhost/train:1");
    container_argv_free(argv);

    c.runtime = CONTAINER_DOCKER;
    argv = container_argv(&c);
    CHECK_STR(
        joined(argv, buf, sizeof(buf)),
        "docker run --rm --pull=never --name gpurun-j1-r3 --label gpurun.job=j1 --network=host "
        "--ipc=host --pid=host --user 1000:100 --gpus all -e RANK -e MASTER_ADDR -v "
        "/jobs/j1:/jobs/j1 -v /run/gpurun:/run/gpurun -v /data:/data:ro --workdir /work "
        "localhost/train:1");
    container_argv_free(argv);

    /* Neither GPUs, mounts, cgroup nor workdir asked: none of their words. */
    c = (struct container_run){
        .runtime = CONTAINER_PODMAN, .image = "img", .name = "n", .job_id = "j"};
    argv = container_argv(&c);
    CHECK_STR(
        joined(argv, buf, sizeof(buf)),
        "podman --cgroup-manager=cgroupfs run --rm --pull=never --name n --label gpurun.job=j "
        "--network=host --ipc=host --pid=host --user 0:0 img");
    container_argv_free(argv);

    argv = container_rm_argv(CONTAINER_PODMAN, "gpurun-j1-r3");
    CHECK_STR(joined(argv, buf, sizeof(buf)),
              "podman --cgroup-manager=cgroupfs rm --force --ignore gpurun-j1-r3");
    container_argv_free(argv);
    argv = container_rm_argv(CONTAINER_DOCKER, "gpurun-j1-r3");
    CHECK_STR(joined(argv, buf, sizeof(buf)), "docker rm --force gpurun-j1-r3");
    container_argv_free(argv);
    CHECK(container_rm_argv(CONTAINER_APPTAINER, "x") == NULL);
    CHECK(container_rm_argv(CONTAINER_ENROOT, "x") == NULL);
}

TEST(container_argv_apptainer_enroot_pyxis)
{
    char buf[2048];
    struct container_run c = {
        .runtime = CONTAINER_APPTAINER,
        .image = "/images/train.sif",
        .mounts = "/data:/data:ro,/scratch:/scratch:rw",
        .workdir = "/work",
        .name = "n",
        .env_names = env,
        .binds = binds,
        .gpus = true,
    };
    char **argv = container_argv(&c);

    /* apptainer passes the host's environment itself: no variable named. */
    CHECK_STR(joined(argv, buf, sizeof(buf)),
              "apptainer exec --nv --bind /jobs/j1:/jobs/j1 --bind /run/gpurun:/run/gpurun "
              "--bind /data:/data:ro --bind /scratch:/scratch:rw --pwd /work /images/train.sif");
    container_argv_free(argv);

    /* enroot: no workdir option, so a shell changes to it; no ":rw" flag. */
    c.runtime = CONTAINER_ENROOT;
    c.image = "/images/train.sqsh";
    argv = container_argv(&c);
    CHECK_STR(joined(argv, buf, sizeof(buf)),
              "enroot start --env NVIDIA_VISIBLE_DEVICES=all --env RANK --env MASTER_ADDR --mount "
              "/jobs/j1:/jobs/j1 --mount /run/gpurun:/run/gpurun --mount /data:/data:ro --mount "
              "/scratch:/scratch /images/train.sqsh sh -c cd \"$0\" && exec \"$@\" /work");
    container_argv_free(argv);
    c.runtime = CONTAINER_PYXIS;
    argv = container_argv(&c);
    CHECK(strncmp(joined(argv, buf, sizeof(buf)), "enroot start ", 13) == 0);
    container_argv_free(argv);

    argv = container_pyxis_options("nvcr.io#nvidia/pytorch:24.01-py3", "/data:/data:ro", "/work",
                                   "HF_HOME");
    CHECK_STR(joined(argv, buf, sizeof(buf)),
              "--container-image=nvcr.io#nvidia/pytorch:24.01-py3 "
              "--container-mounts=/data:/data:ro --container-workdir=/work "
              "--container-env=HF_HOME");
    container_argv_free(argv);

    c.runtime = CONTAINER_AUTO;
    CHECK(container_argv(&c) == NULL);
}

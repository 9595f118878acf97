/* The rank environment. Names and values follow torchrun's agent (see rankenv.h): a script
 * that works under torchrun finds here what it read there, and a restart changes only what
 * torchrun's does (TORCHELASTIC_RESTART_COUNT). Horovod's follow horovodrun's gloo_run. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memckpt.h"
#include "rankenv.h"
#include "banned.h"

/* torchrun runs one role; its name when none is given. */
#define ROLE_NAME "default"

static size_t name_len(const char *kv)
{
    return strcspn(kv, "=");
}

static char **find(const struct envv *e, const char *k)
{
    size_t n = strlen(k);

    for (size_t i = 0; i < e->n; i++)
        if (name_len(e->v[i]) == n && !strncmp(e->v[i], k, n))
            return &e->v[i];
    return NULL;
}

const char *envv_get(const struct envv *e, const char *k)
{
    char **slot = find(e, k);

    return slot ? *slot + strlen(k) + 1 : NULL;
}

void envv_unset(struct envv *e, const char *k)
{
    char **slot = find(e, k);

    if (!slot)
        return;
    free(*slot);
    *slot = e->v[--e->n];
    e->v[e->n] = NULL;
}

/* Takes kv (new) into e, replacing the entry of the same name. */
static void put(struct envv *e, char *kv)
{
    char name[256], **slot;

    if (!kv) {
        e->oom = true;
        return;
    }
    snprintf(name, sizeof(name), "%.*s", (int)name_len(kv), kv);
    slot = find(e, name);
    if (slot) {
        free(*slot);
        *slot = kv;
        return;
    }
    if (e->n + 1 >= e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 64;
        char **nv = realloc(e->v, cap * sizeof(*nv));
        if (!nv) {
            free(kv);
            e->oom = true;
            return;
        }
        e->v = nv;
        e->cap = cap;
    }
    e->v[e->n++] = kv;
    e->v[e->n] = NULL;
}

void envv_set(struct envv *e, const char *k, const char *fmt, ...)
{
    char *val = NULL, *kv = NULL;
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = vasprintf(&val, fmt, ap);
    va_end(ap);
    if (r < 0 || asprintf(&kv, "%s=%s", k, val) < 0)
        kv = NULL;
    free(val);
    put(e, kv);
}

void envv_release(struct envv *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
    memset(e, 0, sizeof(*e));
}

int rankenv_columns(int term_cols, int rank)
{
    char label[32];
    int n = snprintf(label, sizeof(label), "[%d] ", rank);

    return term_cols > n ? term_cols - n : 0;
}

/* Sets k to v only where neither the agent's environment nor --export set it. */
static void set_default(struct envv *e, const char *k, const char *v)
{
    if (!envv_get(e, k))
        envv_set(e, k, "%s", v);
}

/* CUDA_VISIBLE_DEVICES. torchrun leaves it as the node has it, so that every local rank
 * sees every GPU of the allocation and picks one with LOCAL_RANK (the universal
 * torch.cuda.set_device(LOCAL_RANK)). --gpu-bind=single shows rank n only the n-th entry
 * (or device n where the node names none). */
static void set_gpus(struct envv *e, const struct rankenv_rank *r)
{
    const char *all = envv_get(e, "CUDA_VISIBLE_DEVICES");
    int i = 0;

    if (r->spec->gpu_bind != GPU_BIND_SINGLE)
        return;
    if (!all || !*all) {
        envv_set(e, "CUDA_VISIBLE_DEVICES", "%d", r->local_rank);
        return;
    }
    for (const char *p = all; *p; i++) {
        size_t n = strcspn(p, ",");
        if (i == r->local_rank) {
            char dev[64];
            snprintf(dev, sizeof(dev), "%.*s", (int)n, p);
            envv_set(e, "CUDA_VISIBLE_DEVICES", "%s", dev);
            return;
        }
        p += n + (p[n] == ',');
    }
    /* Fewer GPUs than ranks: the rank gets none rather than another rank's. */
    envv_set(e, "CUDA_VISIBLE_DEVICES", "%s", "");
}

/* The gpurun package's folder first on PYTHONPATH, so `import gpurun` works in every rank
 * with nothing installed; what the user had follows. */
static void set_pythonpath(struct envv *e, const char *dir)
{
    const char *old = envv_get(e, "PYTHONPATH");
    size_t n = strlen(dir);

    if (!dir[0])
        return;
    if (old && !strncmp(old, dir, n) && (old[n] == ':' || old[n] == '\0'))
        return;
    if (old && *old) {
        char *copy = strdup(old);
        if (!copy) {
            e->oom = true;
            return;
        }
        envv_set(e, "PYTHONPATH", "%s:%s", dir, copy);
        free(copy);
    } else {
        envv_set(e, "PYTHONPATH", "%s", dir);
    }
}

/* The digits of a non-negative int in s, or -1. */
static int parse_count(const char *s)
{
    char *end;
    long v;

    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    return *end || errno || v > INT_MAX ? -1 : (int)v;
}

/* Slurm's per-task variables. Under Slurm (the agent runs in a step: SLURM_JOB_ID and
 * SLURM_STEP_ID) the agent is the one task per node of `srun --ntasks-per-node=1`, and its
 * variables would make every rank of a node the same task. Each rank gets what
 * `srun -n W --ntasks-per-node=G --cpus-per-task=C/G` gives the task of its rank in the same
 * allocation (G ranks per node, W in all, C the agent's CPUs): block layout, so task r is on
 * node r/G, as the ranks are. Slurm 22.05's rules (src/common/env.c setup_env() and
 * env_array_for_step(), checked on the test cluster by tests/integ/slurm_taskenv.sh):
 * SLURM_NTASKS, SLURM_NPROCS and SLURM_STEP_NUM_TASKS are the step's task count;
 * SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE are "G(xN)" ("G" on one node);
 * SLURM_GTIDS lists the node's global task ids; srun distributes more tasks than nodes in
 * blocks (SLURM_DISTRIBUTION=block), as many or fewer cyclically (the agent's step already).
 * The MPI plugins' rank numbers and layout (pmi2's PMI_RANK and PMI_SIZE, pmix's PMIX_RANK
 * and SLURM_PMIX_MAPPING_SERV) follow where the agent has them; their server connections
 * (PMI_FD, PMIX_SERVER_URI*) serve the agent's step and stay as they are. Unchanged, because equal
 * in both steps: the node, the allocation, CPUs and GPUs of the node, SLURM_CPU_BIND* (copied from
 * the request, not per task). SLURM_TASK_PID is the rank's own pid: the shim sets it in the child
 * (shim.c). */
static void set_slurm(struct envv *e, const struct rankenv_rank *r)
{
    int g = r->local_world_size > 0 ? r->local_world_size : 1;
    int first = r->rank - r->local_rank, cpus = parse_count(envv_get(e, "SLURM_CPUS_PER_TASK"));
    /* The agent's CPUs shared out, at least one each (srun refuses --cpus-per-task=0). */
    int share = cpus < 0 ? -1 : cpus >= g ? cpus / g : 1;
    const struct {
        const char *name;
        int value;
        bool if_set; /* only where the agent has it: set by an option or a plugin */
    } nums[] = {
        {"SLURM_PROCID", r->rank, false},
        {"SLURM_LOCALID", r->local_rank, false},
        {"SLURM_NODEID", r->node_rank, false},
        {"SLURM_NTASKS", r->world_size, false},
        {"SLURM_NPROCS", r->world_size, false},
        {"SLURM_STEP_NUM_TASKS", r->world_size, false},
        {"SLURM_NTASKS_PER_NODE", g, false},
        {"SLURM_CPUS_PER_TASK", share, true},
        {"PMI_RANK", r->rank, true},
        {"PMI_SIZE", r->world_size, true},
        {"PMIX_RANK", r->rank, true},
    };
    char tpn[64], *gtids;
    size_t len = 0, cap = (size_t)g * 12 + 1;

    if (!envv_get(e, "SLURM_JOB_ID") || !envv_get(e, "SLURM_STEP_ID"))
        return;
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (nums[i].value < 0 || (nums[i].if_set && !envv_get(e, nums[i].name)))
            continue;
        envv_set(e, nums[i].name, "%d", nums[i].value);
    }
    /* Slurm's compressed count list (uint16_array_to_str): "2(x3)" is 2,2,2. */
    if (r->nnodes > 1)
        snprintf(tpn, sizeof(tpn), "%d(x%d)", g, r->nnodes);
    else
        snprintf(tpn, sizeof(tpn), "%d", g);
    envv_set(e, "SLURM_TASKS_PER_NODE", "%s", tpn);
    envv_set(e, "SLURM_STEP_TASKS_PER_NODE", "%s", tpn);
    if (r->world_size > r->nnodes && envv_get(e, "SLURM_DISTRIBUTION"))
        envv_set(e, "SLURM_DISTRIBUTION", "%s", "block");
    /* pmix's task map (pack_process_mapping): one bar of N nodes from node 0, G deep. */
    if (envv_get(e, "SLURM_PMIX_MAPPING_SERV"))
        envv_set(e, "SLURM_PMIX_MAPPING_SERV", "(vector,(0,%d,%d))", r->nnodes, g);
    gtids = malloc(cap);
    if (!gtids) {
        e->oom = true;
        return;
    }
    gtids[0] = '\0';
    for (int i = 0; i < g; i++)
        len += (size_t)snprintf(gtids + len, cap - len, "%s%d", i ? "," : "", first + i);
    envv_set(e, "SLURM_GTIDS", "%s", gtids);
    free(gtids);
}

/* horovodrun's gloo launch (horovod/runner/gloo_run.py): create_slot_env_vars for the slot
 * get_host_assignments gives this rank, and create_run_env_vars. gpurun's layout is
 * horovod's for equal slots per host in node order: a node is a host, ranks are contiguous
 * on it, so the cross rank (the host's index among the hosts with this local rank) is the
 * node rank and the cross size the node count. The controller, the CPU operations and the
 * interface are defaults a user's own setting overrides; NCCL_SOCKET_IFNAME, which gloo_run
 * also sets, is left to NCCL as torchrun leaves it: it would steer every NCCL job. */
static void set_horovod(struct envv *e, const struct rankenv_rank *r)
{
    envv_set(e, "HOROVOD_HOSTNAME", "%s", r->hvd_host ? r->hvd_host : r->hostname);
    envv_set(e, "HOROVOD_RANK", "%d", r->rank);
    envv_set(e, "HOROVOD_SIZE", "%d", r->world_size);
    envv_set(e, "HOROVOD_LOCAL_RANK", "%d", r->local_rank);
    envv_set(e, "HOROVOD_LOCAL_SIZE", "%d", r->local_world_size);
    envv_set(e, "HOROVOD_CROSS_RANK", "%d", r->node_rank);
    envv_set(e, "HOROVOD_CROSS_SIZE", "%d", r->nnodes);
    if (r->hvd_port > 0) {
        envv_set(e, "HOROVOD_GLOO_RENDEZVOUS_ADDR", "%s", r->master_addr);
        envv_set(e, "HOROVOD_GLOO_RENDEZVOUS_PORT", "%d", r->hvd_port);
    } else {
        /* Another launcher's server, inherited, would be worse than none. */
        envv_unset(e, "HOROVOD_GLOO_RENDEZVOUS_ADDR");
        envv_unset(e, "HOROVOD_GLOO_RENDEZVOUS_PORT");
    }
    set_default(e, "HOROVOD_CONTROLLER", "gloo");
    set_default(e, "HOROVOD_CPU_OPERATIONS", "gloo");
    if (r->hvd_iface)
        set_default(e, "HOROVOD_GLOO_IFACE", r->hvd_iface);
}

int rankenv_threads(const struct rankenv_rank *r, char *const *base)
{
    int cpus = r->cpus, ranks = r->local_world_size, slurm = -1;

    /* Inside a Slurm allocation, the CPUs Slurm gave the job on this node, where the agent's
     * affinity shows more (no task/affinity plugin, or a step launched with --cpu-bind=none). */
    for (char *const *p = base; p && *p; p++)
        if (!strncmp(*p, "SLURM_CPUS_ON_NODE=", 19))
            slurm = parse_count(*p + 19);
    if (slurm > 0 && slurm < cpus)
        cpus = slurm;
    /* On one machine (--local) every node of the job is emulated on this host: its CPUs are
     * shared by all the job's ranks, not by one emulated node's. */
    if (r->spec->loopback)
        ranks = r->world_size;
    if (ranks < 1)
        ranks = 1;
    return cpus / ranks > 0 ? cpus / ranks : 1;
}

/* What `mpirun python3 train.py` gives a rank, for scripts written for it that read their
 * place from it (DeepSpeed's and Hugging Face's MPI discovery, HPC guides' scripts). Open MPI's
 * OMPI_COMM_WORLD_* always: Open MPI reads none of them to start (a singleton MPI_Init is
 * rank 0 of 1 with them set, and an mpirun in the rank sets its own). MPICH's and Intel MPI's
 * PMI-1 client reads PMI_RANK and PMI_SIZE beside the PMI_FD of its process manager, so those
 * only with --mpi-env (a Slurm step's own, pmi2's, set_slurm renumbers either way). */
static void set_mpi(struct envv *e, const struct rankenv_rank *r)
{
    envv_set(e, "OMPI_COMM_WORLD_RANK", "%d", r->rank);
    envv_set(e, "OMPI_COMM_WORLD_SIZE", "%d", r->world_size);
    envv_set(e, "OMPI_COMM_WORLD_LOCAL_RANK", "%d", r->local_rank);
    envv_set(e, "OMPI_COMM_WORLD_LOCAL_SIZE", "%d", r->local_world_size);
    envv_set(e, "OMPI_COMM_WORLD_NODE_RANK", "%d", r->local_rank);
    if (!r->spec->mpi_env)
        return;
    envv_set(e, "PMI_RANK", "%d", r->rank);
    envv_set(e, "PMI_SIZE", "%d", r->world_size);
    envv_set(e, "MPI_LOCALRANKID", "%d", r->local_rank);
    envv_set(e, "MPI_LOCALNRANKS", "%d", r->local_world_size);
}

char **rankenv_build(const struct rankenv_rank *r, char *const *base)
{
    const struct jobspec *s = r->spec;
    struct envv e = {0};

    for (char *const *p = base; p && *p; p++)
        put(&e, strdup(*p));
    for (char **p = s->env; p && *p; p++)
        put(&e, strdup(*p));

    /* torchrun's contract, name for name. */
    envv_set(&e, "RANK", "%d", r->rank);
    envv_set(&e, "LOCAL_RANK", "%d", r->local_rank);
    envv_set(&e, "WORLD_SIZE", "%d", r->world_size);
    envv_set(&e, "LOCAL_WORLD_SIZE", "%d", r->local_world_size);
    envv_set(&e, "GROUP_RANK", "%d", r->node_rank);
    envv_set(&e, "GROUP_WORLD_SIZE", "%d", r->nnodes);
    envv_set(&e, "ROLE_NAME", "%s", ROLE_NAME);
    envv_set(&e, "ROLE_RANK", "%d", r->rank);
    envv_set(&e, "ROLE_WORLD_SIZE", "%d", r->world_size);
    envv_set(&e, "MASTER_ADDR", "%s", r->master_addr);
    envv_set(&e, "MASTER_PORT", "%d", r->master_port);
    envv_set(&e, "TORCHELASTIC_RESTART_COUNT", "%d", r->restart_count);
    envv_set(&e, "TORCHELASTIC_MAX_RESTARTS", "%d", s->max_restarts);
    envv_set(&e, "TORCHELASTIC_RUN_ID", "%s", s->job_id);
    /* The ranks' own TCPStore: rank 0 serves it on MASTER_PORT, the others connect. "True"
     * would make every rank a client of an agent store that gpurun does not run. */
    envv_set(&e, "TORCHELASTIC_USE_AGENT_STORE", "%s", "False");
    /* torchrun's default: a failed NCCL collective ends the process instead of hanging it;
     * torchrun's name and value since torch 2.2. Older torch reads NCCL_ASYNC_ERROR_HANDLING; it is
     * not set too, because torch 2.2 and later warn on every rank when the old name is set. */
    set_default(&e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    if (r->error_file)
        envv_set(&e, "TORCHELASTIC_ERROR_FILE", "%s", r->error_file);
    else
        envv_unset(&e, "TORCHELASTIC_ERROR_FILE");
    /* Not torchrun's, but what Lightning and many sbatch scripts read for the node. */
    envv_set(&e, "NODE_RANK", "%d", r->node_rank);
    set_gpus(&e, r);
    set_mpi(&e, r);
    set_slurm(&e, r);
    set_horovod(&e, r);
    /* torch's gloo binds the interface its host's name resolves to, and where that name does
     * not resolve to the address this node is reached at (a cluster's management name, a
     * container's) it falls back to loopback and its peers are refused: the interface that
     * holds this node's address, unless the user chose one. NCCL_SOCKET_IFNAME is left to
     * NCCL, as torchrun leaves it: NCCL finds a routable interface itself, and this one may
     * be a slow management network beside the fabric NCCL would pick. */
    if (r->hvd_iface)
        set_default(&e, "GLOO_SOCKET_IFNAME", r->hvd_iface);

    /* Threads per rank, so that ranks neither oversubscribe the cores nor starve their data
     * loaders with one thread. */
    if (!envv_get(&e, "OMP_NUM_THREADS"))
        envv_set(&e, "OMP_NUM_THREADS", "%d", rankenv_threads(r, base));
    /* Output reaches the log as it is printed, and a fatal signal (or the SIGABRT of a hang's
     * stack capture) prints every thread's Python traceback. */
    set_default(&e, "PYTHONUNBUFFERED", "1");
    set_default(&e, "PYTHONFAULTHANDLER", "1");
    /* A rank sees a pipe, so a progress bar would fall back to its narrow default (tqdm's 10
     * characters) where under torchrun it fills the terminal: the terminal's width, less the
     * label, unless the user set COLUMNS. */
    if (rankenv_columns(r->term_cols, r->rank) > 0 && !envv_get(&e, "COLUMNS"))
        envv_set(&e, "COLUMNS", "%d", rankenv_columns(r->term_cols, r->rank));
    if (r->python_dir)
        set_pythonpath(&e, r->python_dir);

    /* The rank library's. */
    envv_set(&e, "GPURUN_SOCK", "%s", r->sock);
    envv_set(&e, "GPURUN_TOKEN", "%s", r->token);
    envv_set(&e, "GPURUN_JOB_DIR", "%s", r->job_dir ? r->job_dir : "");
    envv_set(&e, "GPURUN_JOB_ID", "%s", s->job_id);
    envv_set(&e, "GPURUN_NODE_ADDR", "%s", r->node_addr);
    if (r->mem_dir)
        envv_set(&e, MEMCKPT_DIR_ENV, "%s", r->mem_dir);
    envv_set(&e, "GPURUN_RESTART_COUNT", "%d", r->restart_count);
    envv_set(&e, "GPURUN_PREEMPT_SIGNAL", "%d", s->preempt_signal);

    if (e.oom || !e.v) {
        envv_release(&e);
        return NULL;
    }
    return e.v;
}

void rankenv_free(char **env)
{
    for (char **p = env; p && *p; p++)
        free(*p);
    free(env);
}

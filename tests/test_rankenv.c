/* Tests of daemon/rankenv's Slurm rule: a rank of a gpurun job under Slurm sees the per-task
 * variables that `srun --ntasks-per-node=G` gives the task of the same rank, built here from
 * the environment an agent of `srun --ntasks-per-node=1` really has (the values were read on
 * the test cluster, tests/integ/slurm_taskenv.sh checks them there); outside a Slurm step
 * nothing changes. The last tests run the rank shim for SLURM_TASK_PID, the rank's own pid. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../daemon/rankenv.h"
#include "jobspec.h"
#include "test.h"
#include "banned.h"

/* A variable's slot in a fake environment: room for the longest value a test writes. */
#define VAR_MAX    64
/* Variables in a fake agent environment, at most. */
#define BASE_MAX   48
/* Ranks per node of the widest layout tested: SLURM_GTIDS of a node far from the first. */
#define WIDE_RANKS 100

/* A job of nnodes nodes with g ranks each, and the facts of rank r of it. */
struct layout {
    struct jobspec spec;
    struct rankenv_rank r;
};

static void layout_init(struct layout *l, int nnodes, int g, int rank)
{
    jobspec_init(&l->spec);
    l->spec.nnodes = nnodes;
    l->spec.nprocs = g;
    memset(&l->r, 0, sizeof(l->r));
    l->r.spec = &l->spec;
    l->r.rank = rank;
    l->r.local_rank = rank % g;
    l->r.local_world_size = g;
    l->r.world_size = nnodes * g;
    l->r.node_rank = rank / g;
    l->r.nnodes = nnodes;
    l->r.master_addr = "10.0.0.1";
    l->r.master_port = 29500;
    l->r.sock = "/tmp/agent.sock";
    l->r.token = "00";
    l->r.job_dir = "";
    l->r.node_addr = "10.0.0.2";
    l->r.hostname = "node1";
    l->r.cpus = 4;
}

/* A fake agent environment: "K=V" strings in fixed slots, NULL-terminated. */
struct base {
    char vars[BASE_MAX][VAR_MAX];
    char *v[BASE_MAX + 1];
    int n;
};

static void base_add(struct base *b, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void base_add(struct base *b, const char *k, const char *fmt, ...)
{
    char val[VAR_MAX];
    va_list ap;

    if (b->n >= BASE_MAX)
        test_fail(__FILE__, __LINE__, "more than %d variables in a fake environment", BASE_MAX);
    va_start(ap, fmt);
    vsnprintf(val, sizeof(val), fmt, ap);
    va_end(ap);
    if (snprintf(b->vars[b->n], VAR_MAX, "%s=%s", k, val) >= VAR_MAX)
        test_fail(__FILE__, __LINE__, "'%s' is too long for a fake environment", k);
    b->v[b->n] = b->vars[b->n];
    b->v[++b->n] = NULL;
}

/* What the agent of node `node` of an nnodes-node job has in `srun --ntasks-per-node=1
 * --cpus-per-task=cpus` (job 7, step 0), as read on the test cluster; with pmi2's variables
 * when pmi, with a few that are not Slurm's. */
static void base_slurm(struct base *b, int nnodes, int node, int cpus, bool pmi)
{
    memset(b, 0, sizeof(*b));
    base_add(b, "HOME", "%s", "/root");
    base_add(b, "PATH", "%s", "/usr/bin:/bin");
    base_add(b, "SLURM_JOB_ID", "%d", 7);
    base_add(b, "SLURM_JOBID", "%d", 7);
    base_add(b, "SLURM_STEP_ID", "%d", 0);
    base_add(b, "SLURM_STEPID", "%d", 0);
    base_add(b, "SLURM_JOB_NODELIST", "%s", "node[1-2]");
    base_add(b, "SLURM_JOB_NUM_NODES", "%d", nnodes);
    base_add(b, "SLURM_NNODES", "%d", nnodes);
    base_add(b, "SLURM_STEP_NUM_NODES", "%d", nnodes);
    base_add(b, "SLURM_JOB_CPUS_PER_NODE", "%d(x%d)", cpus, nnodes);
    base_add(b, "SLURM_CPUS_ON_NODE", "%d", cpus);
    base_add(b, "SLURM_CPUS_PER_TASK", "%d", cpus);
    base_add(b, "SLURM_DISTRIBUTION", "%s", "cyclic");
    base_add(b, "SLURM_PROCID", "%d", node);
    base_add(b, "SLURM_LOCALID", "%d", 0);
    base_add(b, "SLURM_NODEID", "%d", node);
    base_add(b, "SLURM_GTIDS", "%d", node);
    base_add(b, "SLURM_NTASKS", "%d", nnodes);
    base_add(b, "SLURM_NPROCS", "%d", nnodes);
    base_add(b, "SLURM_NTASKS_PER_NODE", "%d", 1);
    base_add(b, "SLURM_STEP_NUM_TASKS", "%d", nnodes);
    base_add(b, "SLURM_STEP_TASKS_PER_NODE", "1(x%d)", nnodes);
    base_add(b, "SLURM_TASKS_PER_NODE", "1(x%d)", nnodes);
    base_add(b, "SLURM_TASK_PID", "%d", 4242);
    base_add(b, "SLURM_SRUN_COMM_PORT", "%d", 42739);
    base_add(b, "SLURM_STEP_GPUS", "%s", "0,1");
    if (pmi) {
        base_add(b, "PMI_FD", "%d", 11);
        base_add(b, "PMI_JOBID", "%s", "7.0");
        base_add(b, "PMI_RANK", "%d", node);
        base_add(b, "PMI_SIZE", "%d", nnodes);
    }
}

/* The value of k in env (borrowed), or NULL. */
static const char *get(char **env, const char *k)
{
    size_t n = strlen(k);

    for (char **p = env; p && *p; p++)
        if (!strncmp(*p, k, n) && (*p)[n] == '=')
            return *p + n + 1;
    return NULL;
}

static char **build(const struct layout *l, const struct base *b)
{
    char **env = rankenv_build(&l->r, b->v);

    CHECK(env != NULL);
    return env;
}

/* Every name in env that starts with prefix and is absent from, or different in, the base:
 * what rankenv changed of them. */
static int changed(char **env, const struct base *b, const char *prefix, char *out, size_t n)
{
    int count = 0;
    size_t len = 0;

    out[0] = '\0';
    for (char **p = env; *p; p++) {
        bool same = false;
        if (strncmp(*p, prefix, strlen(prefix)))
            continue;
        for (int i = 0; i < b->n; i++)
            same |= !strcmp(*p, b->v[i]);
        if (!same && len < n) {
            len += (size_t)snprintf(out + len, n - len, " %s", *p);
            count++;
        }
    }
    return count;
}

/* One expected value of a variable for each rank of a 2x2 layout. */
struct want {
    const char *name;
    const char *per_rank[4];
};

/* 2 nodes x 2 ranks, cpus-per-task 4 for the agent: what `srun -n4 --ntasks-per-node=2
 * --cpus-per-task=2` gave its tasks on the test cluster. */
static const struct want want_2x2[] = {
    {"SLURM_PROCID", {"0", "1", "2", "3"}},
    {"SLURM_LOCALID", {"0", "1", "0", "1"}},
    {"SLURM_NODEID", {"0", "0", "1", "1"}},
    {"SLURM_NTASKS", {"4", "4", "4", "4"}},
    {"SLURM_NPROCS", {"4", "4", "4", "4"}},
    {"SLURM_NTASKS_PER_NODE", {"2", "2", "2", "2"}},
    {"SLURM_STEP_NUM_TASKS", {"4", "4", "4", "4"}},
    {"SLURM_STEP_TASKS_PER_NODE", {"2(x2)", "2(x2)", "2(x2)", "2(x2)"}},
    {"SLURM_TASKS_PER_NODE", {"2(x2)", "2(x2)", "2(x2)", "2(x2)"}},
    {"SLURM_GTIDS", {"0,1", "0,1", "2,3", "2,3"}},
    {"SLURM_CPUS_PER_TASK", {"2", "2", "2", "2"}},
    {"SLURM_DISTRIBUTION", {"block", "block", "block", "block"}},
    {"PMI_RANK", {"0", "1", "2", "3"}},
    {"PMI_SIZE", {"4", "4", "4", "4"}},
    /* The node's, the allocation's and the step's: the same in both steps. */
    {"SLURM_STEP_ID", {"0", "0", "0", "0"}},
    {"SLURM_CPUS_ON_NODE", {"4", "4", "4", "4"}},
    {"SLURM_JOB_CPUS_PER_NODE", {"4(x2)", "4(x2)", "4(x2)", "4(x2)"}},
    {"SLURM_STEP_NUM_NODES", {"2", "2", "2", "2"}},
    {"SLURM_STEP_GPUS", {"0,1", "0,1", "0,1", "0,1"}},
    /* The shim's to set, in the rank itself (shim.c). */
    {"SLURM_TASK_PID", {"4242", "4242", "4242", "4242"}},
    /* The MPI plugin's connection to its server is the agent's. */
    {"PMI_FD", {"11", "11", "11", "11"}},
};

TEST(rankenv_slurm_2x2)
{
    struct layout l;
    struct base b;

    for (int r = 0; r < 4; r++) {
        layout_init(&l, 2, 2, r);
        base_slurm(&b, 2, r / 2, 4, true);
        char **env = build(&l, &b);
        for (size_t i = 0; i < sizeof(want_2x2) / sizeof(want_2x2[0]); i++) {
            const char *got = get(env, want_2x2[i].name);
            if (!got || strcmp(got, want_2x2[i].per_rank[r]))
                test_fail(__FILE__, __LINE__, "rank %d: %s: expected '%s', got '%s'", r,
                          want_2x2[i].name, want_2x2[i].per_rank[r], got ? got : "(unset)");
        }
        /* torchrun's view of the same rank agrees. */
        CHECK_STR(get(env, "RANK"), get(env, "SLURM_PROCID"));
        CHECK_STR(get(env, "LOCAL_RANK"), get(env, "SLURM_LOCALID"));
        CHECK_STR(get(env, "WORLD_SIZE"), get(env, "SLURM_NTASKS"));
        rankenv_free(env);
        jobspec_release(&l.spec);
    }
}

/* Only the per-task variables change: every other SLURM_* is the agent's, and nothing new
 * appears but what srun sets for every task. */
TEST(rankenv_slurm_changes_only_task_variables)
{
    struct layout l;
    struct base b;
    char diff[1024];

    layout_init(&l, 2, 2, 3);
    base_slurm(&b, 2, 1, 4, false);
    char **env = build(&l, &b);
    changed(env, &b, "SLURM_", diff, sizeof(diff));
    CHECK_STR(diff, " SLURM_CPUS_PER_TASK=2 SLURM_DISTRIBUTION=block SLURM_PROCID=3"
                    " SLURM_LOCALID=1 SLURM_GTIDS=2,3 SLURM_NTASKS=4 SLURM_NPROCS=4"
                    " SLURM_NTASKS_PER_NODE=2 SLURM_STEP_NUM_TASKS=4"
                    " SLURM_STEP_TASKS_PER_NODE=2(x2) SLURM_TASKS_PER_NODE=2(x2)");
    /* No MPI plugin in the agent's step: none appears in the rank's. */
    CHECK(get(env, "PMI_RANK") == NULL);
    CHECK(get(env, "PMIX_RANK") == NULL);
    CHECK(get(env, "PMI_SIZE") == NULL);
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* One node: Slurm writes a count without "(x1)". */
TEST(rankenv_slurm_one_node)
{
    struct layout l;
    struct base b;

    layout_init(&l, 1, 3, 2);
    base_slurm(&b, 1, 0, 3, false);
    char **env = build(&l, &b);
    CHECK_STR(get(env, "SLURM_TASKS_PER_NODE"), "3");
    CHECK_STR(get(env, "SLURM_STEP_TASKS_PER_NODE"), "3");
    CHECK_STR(get(env, "SLURM_GTIDS"), "0,1,2");
    CHECK_STR(get(env, "SLURM_PROCID"), "2");
    CHECK_STR(get(env, "SLURM_LOCALID"), "2");
    CHECK_STR(get(env, "SLURM_NTASKS"), "3");
    CHECK_STR(get(env, "SLURM_CPUS_PER_TASK"), "1");
    CHECK_STR(get(env, "SLURM_DISTRIBUTION"), "block");
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* One rank per node: the agent's step is the rank's, distribution (cyclic: no more tasks
 * than nodes) and CPUs included. */
TEST(rankenv_slurm_one_rank_per_node)
{
    struct layout l;
    struct base b;
    char diff[1024];

    layout_init(&l, 3, 1, 1);
    base_slurm(&b, 3, 1, 8, false);
    char **env = build(&l, &b);
    CHECK_EQ(changed(env, &b, "SLURM_", diff, sizeof(diff)), 0);
    CHECK_STR(get(env, "SLURM_DISTRIBUTION"), "cyclic");
    CHECK_STR(get(env, "SLURM_TASKS_PER_NODE"), "1(x3)");
    CHECK_STR(get(env, "SLURM_CPUS_PER_TASK"), "8");
    CHECK_STR(get(env, "SLURM_GTIDS"), "1");
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* Many ranks per node: the node's whole list of global task ids, in order. */
TEST(rankenv_slurm_gtids_wide)
{
    char want[WIDE_RANKS * 4 + 1];
    struct layout l;
    struct base b;
    size_t len = 0;

    for (int i = 0; i < WIDE_RANKS; i++)
        len +=
            (size_t)snprintf(want + len, sizeof(want) - len, "%s%d", i ? "," : "", WIDE_RANKS + i);
    layout_init(&l, 2, WIDE_RANKS, WIDE_RANKS + 37);
    base_slurm(&b, 2, 1, 2 * WIDE_RANKS, false);
    char **env = build(&l, &b);
    CHECK_STR(get(env, "SLURM_GTIDS"), want);
    CHECK_STR(get(env, "SLURM_PROCID"), "137");
    CHECK_STR(get(env, "SLURM_LOCALID"), "37");
    CHECK_STR(get(env, "SLURM_NTASKS"), "200");
    CHECK_STR(get(env, "SLURM_TASKS_PER_NODE"), "100(x2)");
    CHECK_STR(get(env, "SLURM_CPUS_PER_TASK"), "2");
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* SLURM_CPUS_PER_TASK: the agent's CPUs shared out, rounded down, at least one; absent stays
 * absent, and a value that is not a count stays as it is. */
TEST(rankenv_slurm_cpus_per_task)
{
    static const struct {
        const char *agent; /* NULL: unset */
        int g;
        const char *want; /* NULL: unset */
    } rows[] = {
        {"8", 2, "4"}, {"9", 2, "4"}, {"2", 2, "1"},   {"1", 4, "1"},
        {"0", 2, "1"}, {"x", 2, "x"}, {"4x", 2, "4x"}, {NULL, 2, NULL},
    };
    struct layout l;
    struct base b;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        layout_init(&l, 2, rows[i].g, 0);
        memset(&b, 0, sizeof(b));
        base_add(&b, "SLURM_JOB_ID", "%d", 7);
        base_add(&b, "SLURM_STEP_ID", "%d", 0);
        if (rows[i].agent)
            base_add(&b, "SLURM_CPUS_PER_TASK", "%s", rows[i].agent);
        char **env = build(&l, &b);
        const char *got = get(env, "SLURM_CPUS_PER_TASK");
        if ((got == NULL) != (rows[i].want == NULL) || (got && strcmp(got, rows[i].want)))
            test_fail(__FILE__, __LINE__, "agent '%s', %d ranks per node: expected '%s', got '%s'",
                      rows[i].agent ? rows[i].agent : "(unset)", rows[i].g,
                      rows[i].want ? rows[i].want : "(unset)", got ? got : "(unset)");
        rankenv_free(env);
        jobspec_release(&l.spec);
    }
}

/* pmix's rank and task map follow; its namespace and server stay the agent's. */
TEST(rankenv_slurm_pmix)
{
    struct layout l;
    struct base b;

    layout_init(&l, 2, 2, 3);
    base_slurm(&b, 2, 1, 4, false);
    base_add(&b, "PMIX_RANK", "%d", 1);
    base_add(&b, "PMIX_NAMESPACE", "%s", "slurm.pmix.7.0");
    base_add(&b, "PMIX_SERVER_URI4", "%s", "pmix-server.1;tcp4://127.0.0.1:1");
    base_add(&b, "SLURM_PMIX_MAPPING_SERV", "%s", "(vector,(0,2,1))");
    char **env = build(&l, &b);
    CHECK_STR(get(env, "PMIX_RANK"), "3");
    CHECK_STR(get(env, "SLURM_PMIX_MAPPING_SERV"), "(vector,(0,2,2))");
    CHECK_STR(get(env, "PMIX_NAMESPACE"), "slurm.pmix.7.0");
    CHECK_STR(get(env, "PMIX_SERVER_URI4"), "pmix-server.1;tcp4://127.0.0.1:1");
    CHECK(get(env, "PMI_RANK") == NULL);
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* Outside a step nothing changes: an salloc shell has SLURM_JOB_ID but no SLURM_STEP_ID, a
 * plain shell neither; their SLURM_* variables (describing something else) pass untouched
 * and none is added. */
TEST(rankenv_slurm_outside_a_step)
{
    struct layout l;
    struct base b;
    char diff[1024];

    layout_init(&l, 2, 2, 3);
    base_slurm(&b, 2, 1, 4, true);
    /* The same agent environment, SLURM_STEP_ID removed. */
    for (int i = 0; i < b.n; i++)
        if (!strncmp(b.v[i], "SLURM_STEP_ID=", 14)) {
            b.v[i] = b.v[--b.n];
            b.v[b.n] = NULL;
        }
    char **env = build(&l, &b);
    if (changed(env, &b, "SLURM_", diff, sizeof(diff)) != 0)
        test_fail(__FILE__, __LINE__, "outside a step, expected no change, got:%s", diff);
    CHECK_EQ(changed(env, &b, "PMI", diff, sizeof(diff)), 0);
    CHECK_STR(get(env, "SLURM_PROCID"), "1");
    CHECK_STR(get(env, "RANK"), "3");
    rankenv_free(env);

    memset(&b, 0, sizeof(b));
    base_add(&b, "HOME", "%s", "/root");
    env = build(&l, &b);
    if (changed(env, &b, "SLURM_", diff, sizeof(diff)) != 0)
        test_fail(__FILE__, __LINE__, "without Slurm, expected no SLURM_ variable, got:%s", diff);
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* Runs `rendezvousd --exec-rank OUR_PID [--mark MARK] -- sh -c SCRIPT` with env (the shim must
 * be our child: it checks its parent), puts what the rank printed in out and returns the
 * shim's wait status. */
static int run_shim_status(char *const *env, const char *mark, const char *script, char *out,
                           size_t size)
{
    char pid[24];
    int fds[2], status;
    ssize_t n;
    size_t len = 0;
    pid_t child;

    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    char *argv[] = {(char *)test_build_path("rendezvousd"),
                    "--exec-rank",
                    pid,
                    mark ? "--mark" : "--",
                    (char *)mark,
                    "--",
                    "sh",
                    "-c",
                    (char *)script,
                    NULL};
    if (!mark)
        memmove(argv + 4, argv + 6, 4 * sizeof(argv[0]));
    CHECK_EQ(pipe(fds), 0);
    child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execve(argv[0], argv, env);
        _exit(127);
    }
    close(fds[1]);
    while (len + 1 < size && (n = read(fds[0], out + len, size - 1 - len)) > 0)
        len += (size_t)n;
    close(fds[0]);
    out[len] = '\0';
    CHECK_EQ(waitpid(child, &status, 0), child);
    return status;
}

static void run_shim(char *const *env, const char *script, char *out, size_t size)
{
    int status = run_shim_status(env, NULL, script, out, size);

    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the shim ended with status 0x%x, printed '%s'", status, out);
}

/* The shim's --mark is the rank's GPURUN_JOB_MARK, in the rank's environment as exec'd (what
 * a sweep reads) and not in the shim's own, so that a sweep never ends the shim; an existing
 * one is replaced. A value that is no mark is refused (125). */
TEST(rankenv_shim_job_mark)
{
    char *plain[] = {"PATH=/usr/bin:/bin", NULL};
    char *env[] = {"PATH=/usr/bin:/bin", "GPURUN_JOB_MARK=0000000000000000/1/2/3", NULL};
    const char *mark = "0123456789abcdef/4242/987654/3";
    const char *script = "tr '\\0' '\\n' </proc/$$/environ | grep '^GPURUN_JOB_MARK='; "
                         "echo shim: $(tr '\\0' '\\n' </proc/$PPID/environ | "
                         "grep -c '^GPURUN_JOB_MARK=')";
    char out[256];
    int status;

    status = run_shim_status(plain, mark, script, out, sizeof(out));
    CHECK_EQ(status, 0);
    CHECK_STR(out, "GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3\nshim: 0\n");
    /* A shim that started with one (its daemon runs in a rank of another job) keeps it; the
     * rank gets its own. */
    status = run_shim_status(env, mark, script, out, sizeof(out));
    CHECK_EQ(status, 0);
    CHECK_STR(out, "GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3\nshim: 1\n");
    status = run_shim_status(plain, "12/3", "echo ran", out, sizeof(out));
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 125);
    CHECK_STR(out, "");
}

/* Under Slurm the rank's SLURM_TASK_PID is its own pid, not the agent's (nor the shim's). */
TEST(rankenv_slurm_task_pid)
{
    char *env[] = {"PATH=/usr/bin:/bin", "SLURM_JOB_ID=7", "SLURM_STEP_ID=0", "SLURM_TASK_PID=4242",
                   NULL};
    char out[128];
    long task_pid, rank_pid;

    run_shim(env, "echo \"$SLURM_TASK_PID $$\"", out, sizeof(out));
    if (sscanf(out, "%ld %ld", &task_pid, &rank_pid) != 2)
        test_fail(__FILE__, __LINE__, "expected two pids from the rank, got '%s'", out);
    CHECK(rank_pid > 1);
    CHECK_EQ(task_pid, rank_pid);
}

/* Outside a step the shim leaves SLURM_TASK_PID as it is, and adds none. */
TEST(rankenv_slurm_task_pid_outside_a_step)
{
    char *salloc[] = {"PATH=/usr/bin:/bin", "SLURM_JOB_ID=7", "SLURM_TASK_PID=4242", NULL};
    char *plain[] = {"PATH=/usr/bin:/bin", NULL};
    const char *script = "echo \"[${SLURM_TASK_PID-unset}]\"";
    char out[128];

    run_shim(salloc, script, out, sizeof(out));
    CHECK_STR(out, "[4242]\n");
    run_shim(plain, script, out, sizeof(out));
    CHECK_STR(out, "[unset]\n");
}

/* torchrun's contract (torch's local_elastic_agent.py), outside Slurm: rank 5 of 2 nodes x 4,
 * in the second generation, on a node whose agent has 16 CPUs. */
static const struct {
    const char *name, *value;
} want_torchrun[] = {
    {"RANK", "5"},
    {"LOCAL_RANK", "1"},
    {"WORLD_SIZE", "8"},
    {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"},
    {"GROUP_WORLD_SIZE", "2"},
    {"ROLE_NAME", "default"},
    {"ROLE_RANK", "5"},
    {"ROLE_WORLD_SIZE", "8"},
    {"MASTER_ADDR", "10.0.0.1"},
    {"MASTER_PORT", "29500"},
    {"TORCHELASTIC_RESTART_COUNT", "1"},
    {"TORCHELASTIC_MAX_RESTARTS", "3"},
    {"TORCHELASTIC_RUN_ID", "job-42"},
    {"TORCHELASTIC_USE_AGENT_STORE", "False"},
    {"TORCHELASTIC_ERROR_FILE", "/jobs/42/errors/rank-5.json"},
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
    {"NODE_RANK", "1"},
    /* 16 CPUs shared by 4 ranks. */
    {"OMP_NUM_THREADS", "4"},
    {"PYTHONUNBUFFERED", "1"},
    {"PYTHONFAULTHANDLER", "1"},
};

static void layout_torchrun(struct layout *l)
{
    layout_init(l, 2, 4, 5);
    l->r.restart_count = 1;
    l->r.cpus = 16;
    l->r.error_file = "/jobs/42/errors/rank-5.json";
    l->spec.max_restarts = 3;
    free(l->spec.job_id);
    l->spec.job_id = strdup("job-42");
}

TEST(rankenv_torchrun_contract)
{
    struct layout l;
    struct base b = {0};
    char **env;

    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_torchrun(&l);
    env = build(&l, &b);
    for (size_t i = 0; i < sizeof(want_torchrun) / sizeof(want_torchrun[0]); i++) {
        const char *got = get(env, want_torchrun[i].name);
        if (!got || strcmp(got, want_torchrun[i].value))
            test_fail(__FILE__, __LINE__, "%s: expected '%s', got '%s'", want_torchrun[i].name,
                      want_torchrun[i].value, got ? got : "(unset)");
    }
    /* No Slurm step: no Slurm variable appears. */
    for (char **p = env; *p; p++)
        if (!strncmp(*p, "SLURM_", 6))
            test_fail(__FILE__, __LINE__, "outside Slurm the rank got '%s'", *p);
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* What the user set stays: threads, Python's flags, torch's NCCL error handling; an
 * inherited error file of an outer launcher does not leak when this rank has none; and a
 * node with fewer CPUs than ranks still gives each rank one thread. */
TEST(rankenv_user_values_kept)
{
    struct layout l;
    struct base b = {0};
    char **env;

    base_add(&b, "OMP_NUM_THREADS", "%d", 3);
    base_add(&b, "PYTHONUNBUFFERED", "%s", "");
    base_add(&b, "PYTHONFAULTHANDLER", "%d", 0);
    base_add(&b, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "%d", 3);
    base_add(&b, "TORCHELASTIC_ERROR_FILE", "%s", "/outer/error.json");
    layout_torchrun(&l);
    l.r.error_file = NULL;
    env = build(&l, &b);
    CHECK_STR(get(env, "OMP_NUM_THREADS"), "3");
    CHECK_STR(get(env, "PYTHONUNBUFFERED"), "");
    CHECK_STR(get(env, "PYTHONFAULTHANDLER"), "0");
    CHECK_STR(get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
    CHECK(get(env, "TORCHELASTIC_ERROR_FILE") == NULL);
    rankenv_free(env);
    jobspec_release(&l.spec);

    memset(&b, 0, sizeof(b));
    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_torchrun(&l);
    l.r.cpus = 2;
    env = build(&l, &b);
    CHECK_STR(get(env, "OMP_NUM_THREADS"), "1");
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* Threads are shared by the ranks that share the CPUs: on one machine every rank of the job,
 * whichever emulated node it is on; in a Slurm step the node's ranks, on no more CPUs than
 * Slurm gave the job on the node. */
TEST(rankenv_threads_split_by_the_host)
{
    struct layout l;
    struct base b = {0};
    char **env;

    /* --local -N 2 --gpus-per-node 1 on 2 CPUs: one thread each, not 2 each. */
    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_init(&l, 2, 1, 1);
    l.r.cpus = 2;
    l.spec.loopback = true;
    env = build(&l, &b);
    CHECK_STR(get(env, "OMP_NUM_THREADS"), "1");
    rankenv_free(env);
    /* The same job on two hosts: each rank has its node's 2 CPUs. */
    l.spec.loopback = false;
    env = build(&l, &b);
    CHECK_STR(get(env, "OMP_NUM_THREADS"), "2");
    rankenv_free(env);
    jobspec_release(&l.spec);

    /* --local -N 2 --gpus-per-node 2 on 16 CPUs: 4 each. */
    layout_init(&l, 2, 2, 3);
    l.r.cpus = 16;
    l.spec.loopback = true;
    CHECK_INT(rankenv_threads(&l.r, b.v), ==, 4);
    jobspec_release(&l.spec);

    /* A Slurm node of 64 CPUs where the job has 8 of them and 2 ranks: 4 each, whatever
     * the agent's affinity shows. */
    base_slurm(&b, 2, 0, 8, false);
    layout_init(&l, 2, 2, 0);
    l.r.cpus = 64;
    CHECK_INT(rankenv_threads(&l.r, b.v), ==, 4);
    /* Fewer CPUs in the affinity than Slurm's count: the affinity. */
    l.r.cpus = 4;
    CHECK_INT(rankenv_threads(&l.r, b.v), ==, 2);
    jobspec_release(&l.spec);
}

/* mpirun's variables: Open MPI's always, MPICH's PMI-1 ones only with --mpi-env. */
TEST(rankenv_mpirun_variables)
{
    struct layout l;
    struct base b = {0};
    char **env;

    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_init(&l, 2, 4, 5);
    env = build(&l, &b);
    CHECK_STR(get(env, "OMPI_COMM_WORLD_RANK"), "5");
    CHECK_STR(get(env, "OMPI_COMM_WORLD_SIZE"), "8");
    CHECK_STR(get(env, "OMPI_COMM_WORLD_LOCAL_RANK"), "1");
    CHECK_STR(get(env, "OMPI_COMM_WORLD_LOCAL_SIZE"), "4");
    CHECK_STR(get(env, "OMPI_COMM_WORLD_NODE_RANK"), "1");
    CHECK(get(env, "PMI_RANK") == NULL);
    CHECK(get(env, "PMI_SIZE") == NULL);
    rankenv_free(env);
    l.spec.mpi_env = 1;
    env = build(&l, &b);
    CHECK_STR(get(env, "PMI_RANK"), "5");
    CHECK_STR(get(env, "PMI_SIZE"), "8");
    CHECK_STR(get(env, "MPI_LOCALRANKID"), "1");
    CHECK_STR(get(env, "MPI_LOCALNRANKS"), "4");
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* gloo's interface: the one holding this node's address, unless the user named one; NCCL's
 * is never set (NCCL picks its own). */
TEST(rankenv_gloo_interface)
{
    struct layout l;
    struct base b = {0};
    char **env;

    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_torchrun(&l);
    l.r.hvd_iface = "eth0";
    env = build(&l, &b);
    CHECK_STR(get(env, "GLOO_SOCKET_IFNAME"), "eth0");
    CHECK_STR(get(env, "HOROVOD_GLOO_IFACE"), "eth0");
    CHECK(get(env, "NCCL_SOCKET_IFNAME") == NULL);
    rankenv_free(env);
    jobspec_release(&l.spec);

    memset(&b, 0, sizeof(b));
    base_add(&b, "GLOO_SOCKET_IFNAME", "%s", "ib0");
    layout_torchrun(&l);
    l.r.hvd_iface = "eth0";
    env = build(&l, &b);
    CHECK_STR(get(env, "GLOO_SOCKET_IFNAME"), "ib0");
    rankenv_free(env);
    jobspec_release(&l.spec);

    memset(&b, 0, sizeof(b));
    layout_torchrun(&l);
    l.r.hvd_iface = NULL;
    env = build(&l, &b);
    CHECK(get(env, "GLOO_SOCKET_IFNAME") == NULL);
    rankenv_free(env);
    jobspec_release(&l.spec);
}

/* COLUMNS: the terminal's width less the rank's label, where the stream is a terminal and the
 * user set none. */
TEST(rankenv_columns_fill_the_terminal_less_the_label)
{
    struct layout l;
    struct base b;
    char **env;

    CHECK_EQ(rankenv_columns(100, 0), 96);   /* "[0] " */
    CHECK_EQ(rankenv_columns(100, 10), 95);  /* "[10] " */
    CHECK_EQ(rankenv_columns(80, 1234), 73); /* "[1234] " */
    CHECK_EQ(rankenv_columns(0, 0), 0);      /* not a terminal */
    CHECK_EQ(rankenv_columns(4, 0), 0);      /* nothing left */
    CHECK_EQ(rankenv_columns(5, 0), 1);

    memset(&b, 0, sizeof(b));
    base_add(&b, "PATH", "%s", "/usr/bin:/bin");
    layout_init(&l, 1, 12, 10);
    l.r.term_cols = 120;
    env = rankenv_build(&l.r, b.v);
    CHECK(env);
    CHECK_STR(get(env, "COLUMNS"), "115");
    rankenv_free(env);

    /* Not a terminal: none. */
    l.r.term_cols = 0;
    env = rankenv_build(&l.r, b.v);
    CHECK(env);
    CHECK(get(env, "COLUMNS") == NULL);
    rankenv_free(env);

    /* The user's own, from the environment or --export, stays. */
    l.r.term_cols = 120;
    base_add(&b, "COLUMNS", "%d", 200);
    env = rankenv_build(&l.r, b.v);
    CHECK(env);
    CHECK_STR(get(env, "COLUMNS"), "200");
    rankenv_free(env);
}

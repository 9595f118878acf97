/* rendezvousd: one per node per job. Reads the job dir, runs the agent for this node and, on
 * node 0, the leader; exits with the job's status (docs/design.md, section 1). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "agent.h"
#include "auth.h"
#include "frame.h"
#include "fsutil.h"
#include "jobmark.h"
#include "jobspec.h"
#include "leader.h"
#include "log.h"
#include "shim.h"
#include "signame.h"
#include "banned.h"

#define EXIT_DAEMON_FAILED 125

struct options {
    const char *job_dir;
    const char *rendezvous;
    const char *bind;
    const char *advertise;
    const char *hostname;
    const char *log_level;
    const char *node_rank;
    const char *launcher_pid;
    bool leader_only;
    bool stderr_to_stdout;
};

struct option_row {
    const char *name;
    size_t offset;
    const char *help;
};

static const struct option_row option_rows[] = {
    {"--job-dir", offsetof(struct options, job_dir), "job directory (job.json, key, logs/)"},
    {"--node-rank", offsetof(struct options, node_rank),
     "this node's rank (default $SLURM_NODEID, else 0)"},
    {"--rendezvous", offsetof(struct options, rendezvous),
     "leader HOST:PORT instead of endpoint.json"},
    {"--bind", offsetof(struct options, bind), "address the leader listens on (node 0)"},
    {"--advertise", offsetof(struct options, advertise),
     "address other nodes and ranks dial for this node"},
    {"--hostname", offsetof(struct options, hostname), "name reported for this node"},
    {"--log-level", offsetof(struct options, log_level), "error, warn, info or debug"},
    {"--launcher-pid", offsetof(struct options, launcher_pid),
     "end the job when this parent process (gpurun --local) is gone"},
};
#define N_OPTIONS (sizeof(option_rows) / sizeof(option_rows[0]))

struct daemon {
    uv_loop_t *loop;
    struct jobspec spec;
    struct auth_key key;
    struct leader *leader;
    struct agent *agent;
    uv_signal_t signals[5];
    int agent_status, leader_status;
    int launcher; /* --launcher-pid; 0: none */
    bool agent_done, leader_done, is_leader;
    bool stopping; /* the job's outcome is decided: signals change nothing now */
};

static const int handled_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

/* Raises the soft limit on descriptors to the hard one: a leader holds one per node.
 * leader_nnodes: the job's node count when this daemon runs the leader, else 0. Returns 0, or
 * -1 with the one line that says why the limit cannot do. */
static int raise_nofile(int leader_nnodes)
{
    long need = leader_nnodes ? leader_fds_needed(leader_nnodes) : 0;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        log_error("cannot read the descriptor limit: %s", strerror(errno));
        return -1;
    }
    if (rl.rlim_max != RLIM_INFINITY && (rlim_t)need > rl.rlim_max) {
        log_error("descriptor limit too low: the leader of a job of %d nodes needs %ld, the hard "
                  "limit ('ulimit -Hn') is %lu",
                  leader_nnodes, need, (unsigned long)rl.rlim_max);
        return -1;
    }
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && need > 0) {
            log_error("cannot raise the descriptor limit to %lu: %s", (unsigned long)rl.rlim_max,
                      strerror(errno));
            return -1;
        }
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: rendezvousd --job-dir DIR [options]\n\n");
    for (size_t i = 0; i < N_OPTIONS; i++)
        fprintf(f, "  %-14s VALUE  %s\n", option_rows[i].name, option_rows[i].help);
    fprintf(f, "  %-20s  %s\n", "--stderr-to-stdout",
            "write the log (stderr) where stdout goes, in whole lines with it");
}

static int parse_args(int argc, char **argv, struct options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL, *eq = strchr(arg, '=');
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        size_t k;

        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            exit(0);
        }
        /* Hidden, for bench/loadgen, which plays every agent itself: node 0 runs the leader
         * alone, with no agent and no ranks. */
        if (!strcmp(arg, "--leader-only")) {
            o->leader_only = true;
            continue;
        }
        if (!strcmp(arg, "--stderr-to-stdout")) {
            o->stderr_to_stdout = true;
            continue;
        }
        for (k = 0; k < N_OPTIONS; k++)
            if (strlen(option_rows[k].name) == n && !strncmp(option_rows[k].name, arg, n))
                break;
        if (k == N_OPTIONS) {
            fprintf(stderr, "rendezvousd: unknown option '%s' (see 'rendezvousd --help')\n", arg);
            return -EINVAL;
        }
        val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            fprintf(stderr, "rendezvousd: option '%s' needs a value\n", arg);
            return -EINVAL;
        }
        *(const char **)((char *)o + option_rows[k].offset) = val;
    }
    if (!o->job_dir) {
        fprintf(stderr, "rendezvousd: missing --job-dir (see 'rendezvousd --help')\n");
        return -EINVAL;
    }
    return 0;
}

static int parse_int(const char *what, const char *s, int min, int max, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "rendezvousd: %s: '%s' is not a number in %d..%d\n", what, s, min, max);
        return -EINVAL;
    }
    *out = (int)v;
    return 0;
}

/* The address other nodes reach this one at when the leader binds the wildcard: the first
 * non-loopback IPv4 address, as most clusters' management networks are. */
static void default_advertise(const char *bind, char *out, size_t cap)
{
    uv_interface_address_t *ifs;
    int n;

    snprintf(out, cap, "%s", "127.0.0.1");
    if (strcmp(bind, "0.0.0.0") && strcmp(bind, "::")) {
        snprintf(out, cap, "%s", bind);
        return;
    }
    if (uv_interface_addresses(&ifs, &n) < 0)
        return;
    for (int i = 0; i < n; i++) {
        if (!ifs[i].is_internal && ifs[i].address.address4.sin_family == AF_INET) {
            uv_ip4_name(&ifs[i].address.address4, out, cap);
            break;
        }
    }
    uv_free_interface_addresses(ifs, n);
}

/* uv_walk: counts the open handles other than signal watchers. */
static void count_open(uv_handle_t *h, void *arg)
{
    if (h->type != UV_SIGNAL && !uv_is_closing(h))
        (*(int *)arg)++;
}

static void maybe_stop(struct daemon *d)
{
    if (!d->agent_done || (d->is_leader && !d->leader_done))
        return;
    /* The job's outcome is decided and every rank is gone. The signal watchers stay open to
     * the exit, only unreferenced so that the loop can end: closing the last watcher of a
     * signal gives it back its default action, and a signal after that (a cancel racing the
     * job's end) would kill us by it and hide the job's exit status. on_signal ignores them
     * from now on. */
    d->stopping = true;
    for (size_t i = 0; i < sizeof(d->signals) / sizeof(d->signals[0]); i++)
        uv_unref((uv_handle_t *)&d->signals[i]);
}

static void on_agent_done(struct agent *a, int status, void *arg)
{
    struct daemon *d = arg;

    d->agent_done = true;
    d->agent_status = status;
    agent_close(a);
    d->agent = NULL;
    maybe_stop(d);
}

static void on_leader_done(struct leader *l, int status, void *arg)
{
    struct daemon *d = arg;

    d->leader_done = true;
    d->leader_status = status;
    leader_close(l);
    d->leader = NULL;
    maybe_stop(d);
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct daemon *d = h->data;
    char sn[SIGNAME_LEN];

    if (d->stopping)
        return;
    log_info("received %s", signame(sig, sn));
    if (d->launcher && sig == SIGTERM && getppid() != d->launcher)
        log_warn("the launcher (pid %d) is gone: ending the job", d->launcher);
    if (d->agent)
        agent_signal(d->agent, sig);
    if (d->leader && sig != SIGUSR1 && sig != SIGUSR2 && !d->agent)
        leader_cancel(d->leader, "cancelled: the leader received a signal");
}

/* The batch script writes the key and job.json while srun starts the daemons (Slurm's step
 * launch takes tens of ms, the writes well under one): a daemon that comes first waits for
 * both to be there and not empty (each is one write, and a file's size grows only once its
 * bytes are in), up to JOB_FILES_WAIT_MS, before it reads them. A job dir that does not
 * exist is not waited for. */
#define JOB_FILES_WAIT_MS 5000

static bool job_file_ready(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0 && st.st_size > 0;
}

static void wait_for_job_files(const char *dir)
{
    struct timespec pause = {0, 1000000};
    struct stat st;

    for (int ms = 0; ms < JOB_FILES_WAIT_MS && stat(dir, &st) == 0; ms++) {
        if (job_file_ready(dir, "key") && job_file_ready(dir, "job.json"))
            return;
        nanosleep(&pause, NULL);
    }
}

int main(int argc, char **argv)
{
    struct options o = {0};
    struct daemon d = {0};
    struct errmsg jerr;
    enum log_level level = LOG_WARN;
    char path[PATH_MAX], hostname[256], advertise[64], leader_addr[96];
    const char *bind;
    int node_rank = 0, requeues = 0, ret, status = EXIT_DAEMON_FAILED, left = 0;

    sigset_t none;

    /* A signal mask is inherited across exec: a parent that blocked SIGCHLD (to sigwait on
     * it, say) would leave libuv deaf to our ranks' exits. Start from a clean mask. */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGCHLD, SIG_DFL);
    if (argc > 1 && !strcmp(argv[1], SHIM_FLAG))
        return shim_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    if (parse_args(argc, argv, &o) < 0)
        return EXIT_DAEMON_FAILED;
    if (o.log_level && log_level_parse(o.log_level, &level) < 0) {
        fprintf(stderr, "rendezvousd: --log-level: '%s' is not error, warn, info or debug\n",
                o.log_level);
        return EXIT_DAEMON_FAILED;
    }
    /* What a shell's 2>&1 would do, without the shell: Slurm's step runs this binary
     * directly, and a shell's start costs a millisecond of every job's. */
    if (o.stderr_to_stdout && dup2(STDOUT_FILENO, STDERR_FILENO) < 0) {
        fprintf(stderr, "rendezvousd: --stderr-to-stdout: %s\n", strerror(errno));
        return EXIT_DAEMON_FAILED;
    }
    log_setup("rendezvousd", STDERR_FILENO, level);
    jobspec_init(&d.spec);
    wait_for_job_files(o.job_dir);
    snprintf(path, sizeof(path), "%s/job.json", o.job_dir);
    if (jobspec_load(&d.spec, path, &jerr) < 0) {
        log_error("%s", jerr.text);
        goto out;
    }
    snprintf(path, sizeof(path), "%s/key", o.job_dir);
    ret = auth_key_read(path, &d.key);
    if (ret < 0) {
        log_error("cannot read job key '%s': %s", path,
                  ret == -EPERM    ? "readable by others (must be mode 0600)"
                  : ret == -EINVAL ? "not 64 hex digits"
                                   : strerror(-ret));
        goto out;
    }
    if (!o.node_rank)
        o.node_rank = getenv("SLURM_NODEID");
    if (o.node_rank && parse_int("--node-rank", o.node_rank, 0,
                                 d.spec.nnodes + d.spec.spare_nodes - 1, &node_rank) < 0)
        goto out;
    if (o.launcher_pid && parse_int("--launcher-pid", o.launcher_pid, 1, INT_MAX, &d.launcher) < 0)
        goto out;
    /* Slurm's count of this job's requeues (the batch script kept the job dir for them). */
    if (getenv("SLURM_RESTART_COUNT") &&
        parse_int("SLURM_RESTART_COUNT", getenv("SLURM_RESTART_COUNT"), 0, INT_MAX, &requeues) < 0)
        goto out;
    /* Before anything starts: a leader that would run out of descriptors halfway through
     * the join is one line now. */
    if (raise_nofile(node_rank == 0 && !o.rendezvous ? d.spec.nnodes + d.spec.spare_nodes : 0) < 0)
        goto out;
    if (!o.hostname) {
        if (gethostname(hostname, sizeof(hostname)) < 0)
            snprintf(hostname, sizeof(hostname), "node%d", node_rank);
        hostname[sizeof(hostname) - 1] = '\0';
        o.hostname = hostname;
    }
    snprintf(path, sizeof(path), "%s/logs", o.job_dir);
    ret = fs_mkdirs(path, 0700);
    if (ret < 0) {
        log_error("cannot create '%s': %s", path, strerror(-ret));
        goto out;
    }

    d.loop = uv_default_loop();
    for (size_t i = 0; i < sizeof(d.signals) / sizeof(d.signals[0]); i++) {
        uv_signal_init(d.loop, &d.signals[i]);
        d.signals[i].data = &d;
        uv_signal_start(&d.signals[i], on_signal, handled_signals[i]);
    }
    /* A launcher killed outright (SIGKILL) cannot stop us: the kernel's SIGTERM on its death
     * does, through the same path as a cancel. If it died before we got here, now. */
    if (d.launcher) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != d.launcher)
            kill(getpid(), SIGTERM);
    }
    bind = o.bind ? o.bind : d.spec.loopback ? "127.0.0.1" : "0.0.0.0";
    if (o.advertise)
        snprintf(advertise, sizeof(advertise), "%s", o.advertise);
    else
        default_advertise(bind, advertise, sizeof(advertise));
    d.is_leader = node_rank == 0 && !o.rendezvous;
    if (o.leader_only && !d.is_leader) {
        log_error("--leader-only needs node rank 0 and no --rendezvous");
        goto out_loop;
    }
    if (d.is_leader) {
        struct leader_config lc = {
            .spec = &d.spec,
            .key = &d.key,
            .job_dir = o.job_dir,
            .requeues = requeues,
            .bind_addr = bind,
            .advertise_addr = advertise,
            .max_frame = FRAME_MAX_DEFAULT,
            .done = on_leader_done,
            .arg = &d,
        };
        if (leader_start(d.loop, &lc, &d.leader) < 0)
            goto out_loop;
        /* Node 0's agent dials its own leader like every other agent: one code path. */
        snprintf(leader_addr, sizeof(leader_addr), "%s:%d",
                 strcmp(bind, "0.0.0.0") ? (strcmp(bind, "::") ? bind : "::1") : "127.0.0.1",
                 leader_port(d.leader));
        if (strchr(leader_addr, ':') != strrchr(leader_addr, ':'))
            snprintf(leader_addr, sizeof(leader_addr), "[%s]:%d", strcmp(bind, "::") ? bind : "::1",
                     leader_port(d.leader));
        o.rendezvous = leader_addr;
    }
    if (o.leader_only) {
        d.agent_done = true;
    } else {
        struct agent_config ac = {
            .spec = &d.spec,
            .key = &d.key,
            .job_dir = o.job_dir,
            .requeues = requeues,
            .node_rank = node_rank,
            .hostname = o.hostname,
            .advertise = o.advertise ? o.advertise : (d.is_leader ? advertise : NULL),
            .rendezvous = o.rendezvous,
            .max_frame = FRAME_MAX_DEFAULT,
            .done = on_agent_done,
            .arg = &d,
        };
        if (agent_start(d.loop, &ac, &d.agent) < 0) {
            if (d.leader)
                leader_close(d.leader);
            goto out_loop;
        }
    }
    uv_run(d.loop, UV_RUN_DEFAULT);
    status = d.is_leader ? d.leader_status : d.agent_status;
    goto out_close;
out_loop:
    d.agent_done = d.leader_done = true;
    maybe_stop(&d);
    uv_run(d.loop, UV_RUN_DEFAULT);
out_close:
    /* The signal watchers are left open on purpose (maybe_stop): only other handles are a
     * leak worth a line. */
    uv_walk(d.loop, count_open, &left);
    if (left > 0)
        log_warn("%d handles left open at exit", left);
    /* From here on nothing may run libuv's signal handler: its watchers live in d, on this
     * frame, which is gone once main returns, and a signal during the exit's own work (the
     * sanitizers' leak check takes tens of ms) would have it walk them there: a SIGTERM flood
     * at the job's end once killed the ASan build by SIGSEGV. The outcome is decided: they
     * are ignored. */
    for (size_t i = 0; i < sizeof(handled_signals) / sizeof(handled_signals[0]); i++)
        signal(handled_signals[i], SIG_IGN);
out:
    jobspec_release(&d.spec);
    return status;
}

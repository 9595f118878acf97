/* The ranks' processes: the shim's command line (shim.h) with the job's cgroup, each rank's
 * environment (rankenv.h), token, log and heartbeat pipe, its spawn and its reaping, the OOM
 * evidence for a SIGKILL, and the error file torch's @record leaves. What an exit means for
 * the job is agent.c's to decide. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_int.h"
#include "cgroup.h"
#include "container.h"
#include "fsutil.h"
#include "jobmark.h"
#include "log.h"
#include "memckpt.h"
#include "rankenv.h"
#include "shim.h"
#include "utf8.h"
#include "banned.h"

/* How long the agent waits for a killed rank's cgroup to empty before it leaves the cgroup
 * to the job's end (killed processes leave within milliseconds). */
#define RANK_CGROUP_WAIT_MS 50
/* The shim's heartbeat pipe (shim.h): the fd after stdin, stdout and stderr. */
#define SHIM_ALIVE_FD       "3"
/* A warm shim's spec pipe (shim.h, --spec-fd): the fd after the heartbeat pipe. */
#define SHIM_SPEC_FD        "4"
/* spawn_argv's first words, the same for every rank: shim_exe --exec-rank PID --alive-fd FD
 * --alive-ms MS. What follows (cgroup, mark, "--", the command) is the rank's. */
#define SPAWN_FIXED_ARGS    7
/* How long a warm shim may take to read its spec (it waits for it in a read): longer means a
 * shim that is stopped or gone, and the rank is spawned anew. */
#define WARM_WRITE_MS       2000
/* The largest error file read (agent_read_error_file): a traceback is a few KiB. */
#define ERROR_FILE_MAX      (256 * 1024)

/* The folder holding the gpurun Python package, found from this program's path: the source
 * tree's lib/rank/python (build/rendezvousd, build/asan/rendezvousd) or an installed
 * PREFIX/lib/gpurun/python (PREFIX/bin/rendezvousd). Empty when none is there. */
static void find_python_dir(struct agent *a)
{
    static const char *const rel[] = {"../lib/rank/python", "../../lib/rank/python",
                                      "../lib/gpurun/python"};
    char dir[PATH_MAX], probe[PATH_MAX + 64];
    const char *slash = strrchr(a->self_exe, '/');

    a->python_dir[0] = '\0';
    if (!slash)
        return;
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - a->self_exe), a->self_exe);
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(probe, sizeof(probe), "%s/%s/gpurun/__init__.py", dir, rel[i]);
        if (access(probe, R_OK) == 0) {
            snprintf(probe, sizeof(probe), "%s/%s", dir, rel[i]);
            if (!realpath(probe, a->python_dir))
                a->python_dir[0] = '\0';
            return;
        }
    }
}

/* The rank shim to run (shim.h): gpurun-shim beside this program (the build dir) or in
 * PREFIX/libexec/gpurun (PREFIX/bin/rendezvousd), else this program again. */
static void find_shim(struct agent *a)
{
    static const char *const rel[] = {"gpurun-shim", "../libexec/gpurun/gpurun-shim"};
    const char *slash = strrchr(a->self_exe, '/');
    char probe[PATH_MAX + 64];

    snprintf(a->shim_exe, sizeof(a->shim_exe), "%s", a->self_exe);
    for (size_t i = 0; slash && i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(probe, sizeof(probe), "%.*s/%s", (int)(slash - a->self_exe), a->self_exe, rel[i]);
        if (access(probe, X_OK) == 0 && realpath(probe, a->shim_exe))
            return;
        snprintf(a->shim_exe, sizeof(a->shim_exe), "%s", a->self_exe);
    }
}

/* Where the ranks' cgroups go (cgroup.h). Said once per daemon where there are none. */
static void setup_cgroup(struct agent *a)
{
    static bool said;
    struct errmsg why;

    if (cgroup_job_create(a->cgroup, sizeof(a->cgroup), &why) == 0) {
        log_debug("ranks run in cgroups under '%s'", a->cgroup);
        return;
    }
    a->cgroup[0] = '\0';
    if (!said)
        log_info("ranks run without cgroups of their own (%s): %s", why.text,
                 getenv("SLURM_JOB_ID") ? "Slurm's job cgroup, where it has one, contains them"
                                        : "they are ended by process group only");
    said = true;
}

/* The job mark every rank carries (jobmark.h): the job's value from its key, this daemon's
 * pid and start time. */
static void setup_mark(struct agent *a)
{
    a->mark = (struct jobmark){.job = jobmark_job(&a->key), .daemon = (long)getpid()};
    if (jobmark_proc_start(a->mark.daemon, &a->mark.start) < 0)
        a->mark.start = 0;
}

/* Every rank runs under the shim (shim.h): this program again, with the rank's command. */
int agent_spawn_init(struct agent *a, struct errmsg *why)
{
    static char pid[24], alive_ms[24];
    size_t n = 0, i = 0;
    ssize_t len = readlink("/proc/self/exe", a->self_exe, sizeof(a->self_exe) - 1);

    if (len <= 0) {
        int err = len < 0 ? errno : ENOENT;
        return errmsg_set(why, -err, "cannot read '/proc/self/exe': %s", strerror(err));
    }
    a->self_exe[len] = '\0';
    find_shim(a);
    find_python_dir(a);
    agent_container_init(a);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    while (a->spec->argv[n])
        n++;
    snprintf(alive_ms, sizeof(alive_ms), "%d", a->spec->hb_timeout_ms);
    a->spawn_argv = calloc(n + 14, sizeof(char *));
    if (!a->spawn_argv)
        return errmsg_set(why, -ENOMEM, "out of memory");
    a->spawn_argv[i++] = a->shim_exe;
    a->spawn_argv[i++] = (char *)SHIM_FLAG;
    a->spawn_argv[i++] = pid;
    a->spawn_argv[i++] = (char *)"--alive-fd";
    a->spawn_argv[i++] = (char *)SHIM_ALIVE_FD;
    a->spawn_argv[i++] = (char *)"--alive-ms";
    a->spawn_argv[i++] = alive_ms;
    /* The rank's own words from here on (warm_hand_over sends them). */
    if (i != SPAWN_FIXED_ARGS)
        return errmsg_set(why, -EINVAL, "the shim's fixed arguments are %zu, not %d", i,
                          SPAWN_FIXED_ARGS);
    setup_cgroup(a);
    if (a->cgroup[0]) {
        a->spawn_argv[i++] = (char *)"--cgroup";
        a->cgroup_slot = (int)i;
        a->spawn_argv[i++] = a->cgroup; /* replaced per rank by agent_spawn_rank() */
    }
    setup_mark(a);
    a->spawn_argv[i++] = (char *)"--mark";
    a->mark_slot = (int)i++; /* set per rank by agent_spawn_rank() */
    a->spawn_argv[i++] = (char *)"--";
    for (size_t k = 0; k < n; k++) {
        /* torch.distributed.launch's "--local_rank=N", replaced per rank. */
        if (a->spec->local_rank_arg && k == (size_t)a->spec->local_rank_at) {
            a->local_rank_slot = (int)i;
            a->spawn_argv[i++] = (char *)"";
        }
        a->spawn_argv[i++] = a->spec->argv[k];
    }
    if (a->spec->local_rank_arg && !a->local_rank_slot) {
        a->local_rank_slot = (int)i;
        a->spawn_argv[i++] = (char *)"";
    }
    return 0;
}

/* The cgroup's count of OOM kills (v2 memory.events or v1 memory.oom_control), so that a
 * SIGKILL can be told apart: the count rises when the kernel's OOM killer did it. */
static long oom_kills(void)
{
    char line[512], path[PATH_MAX], *cg = NULL;
    FILE *f = fopen("/proc/self/cgroup", "re");
    long n = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.events", line + 3);
            cg = path;
        } else if (strstr(line, ":memory:")) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup/memory%s/memory.oom_control",
                     strstr(line, ":memory:") + 8);
            cg = path;
            break;
        }
    }
    fclose(f);
    if (!cg || !(f = fopen(cg, "re")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "oom_kill %ld", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* The rank's cgroup, below the job's. */
static void rank_cgroup(const struct agent *a, const struct arank *r, char *dir, size_t len)
{
    snprintf(dir, len, "%s/rank-%d", a->cgroup, r->rank);
}

void arank_signal(struct arank *r, int sig)
{
    if (r->spawned && !r->exited && r->pid > 0)
        kill(-r->pid, sig);
}

/* Where rank r's torch error file goes (TORCHELASTIC_ERROR_FILE): beside its log. */
static void error_file_path(const struct agent *a, const struct arank *r, char *out, size_t cap)
{
    if (a->job_dir)
        snprintf(out, cap, "%.4000s/logs/rank-%d.error.json", a->job_dir, r->rank);
    else
        snprintf(out, cap, "%.4000s/rank-%d.error.json", a->sockdir, r->rank);
}

static char **build_env(struct agent *a, struct arank *r)
{
    extern char **environ;
    char errfile[PATH_MAX];
    cpu_set_t set;
    struct rankenv_rank re = {
        .spec = a->spec,
        .rank = r->rank,
        .local_rank = r->local,
        .local_world_size = a->nranks,
        .world_size = a->world_size,
        .node_rank = a->job_node,
        .nnodes = a->nnodes,
        .restart_count = a->generation,
        .master_addr = a->master_addr,
        .master_port = a->master_port,
        .sock = a->sockpath,
        .token = r->token,
        .job_dir = a->job_dir,
        .node_addr = a->advertise,
        .hostname = a->hostname,
        .error_file = errfile,
        .python_dir = a->python_dir[0] ? a->python_dir : NULL,
        .mem_dir = a->mem ? memckpt_dir(a->mem) : NULL,
        .cpus = 1,
        .hvd_port = a->hvd_port,
        .hvd_host = a->hvd_host[0] ? a->hvd_host : NULL,
        .hvd_iface = a->hvd_iface[0] ? a->hvd_iface : NULL,
        .term_cols = agent_output_columns(a),
    };

    error_file_path(a, r, errfile, sizeof(errfile));
    /* A file an earlier generation's rank left must not be read as this one's failure. */
    unlink(errfile);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        re.cpus = CPU_COUNT(&set);
    return rankenv_build(&re, environ);
}

static void free_env(char **env)
{
    rankenv_free(env);
}

static void on_proc_closed(uv_handle_t *h)
{
    struct arank *r = h->data;
    struct agent *a = r->agent;

    a->handles_open--;
    agent_maybe_free(a);
}

/* Records the exit of rank r's process (its shim's handle p, closed with closed) and ends
 * what it left; agent_rank_exited() decides what the exit means. */
static void rank_exit(struct arank *r, pid_t pid, uv_handle_t *h, int64_t status, int sig,
                      uv_close_cb closed)
{
    struct agent *a = r->agent;

    r->exited = true;
    r->code = (int)status;
    r->sig = sig;
    r->exit_ms = (int64_t)uv_now(a->loop);
    a->exited++;
    r->oom = sig == SIGKILL && !r->killed && r->oom_base >= 0 && oom_kills() > r->oom_base;
    uv_close(h, closed);
    if (r->alive_fd >= 0) {
        close(r->alive_fd);
        r->alive_fd = -1;
    }
    /* What a rank started may still hold its group or its cgroup: it ends with the rank.
     * The shim removed the cgroup already unless it was killed itself (the teardown's
     * SIGKILL reaches the whole group). */
    kill(-pid, SIGKILL);
    if (a->cgroup[0]) {
        char dir[PATH_MAX + 16];
        rank_cgroup(a, r, dir, sizeof(dir));
        cgroup_remove(dir, RANK_CGROUP_WAIT_MS);
    }
    agent_container_remove(a, r);
    agent_rank_exited(a, r);
}

static void on_rank_exit(uv_process_t *p, int64_t status, int sig)
{
    rank_exit(p->data, p->pid, (uv_handle_t *)p, status, sig, on_proc_closed);
}

/* --- warm shims ------------------------------------------------------------------------------ */

/* A shim started before its rank is known: it waits in a read of its spec pipe for the rest of
 * its arguments and the rank's environment (shim.h). agent_warm_prepare() makes its pipes on
 * the loop, agent_warm_spawn() starts it on the pre-flight's thread (posix_spawn: the thread
 * waits for the exec, the loop does not), agent_warm_adopt() watches it from the loop (its
 * output pipes as the rank's streams, a pidfd for its exit: it is not libuv's process). */
struct warm_shim {
    struct agent *a;
    struct arank *r;           /* the rank it runs, once handed over; NULL before */
    struct ostream *out, *err; /* the rank's stdout and stderr until handed over */
    int slot;                  /* its index in a->warm */
    pid_t pid;                 /* 0 until spawned; -errno when the spawn failed */
    int pidfd;                 /* watched by exitw, or -1 */
    uv_poll_t exitw;
    int child[4];  /* the child's ends: stdout, stderr, heartbeat, spec (closed once spawned) */
    int parent[4]; /* ours: stdout, stderr (until adopted), heartbeat, spec, or -1 */
    bool gone;     /* exited, or released: not to be handed a rank */
};

enum { WARM_OUT, WARM_ERR, WARM_ALIVE, WARM_SPEC };

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Closes what a warm shim holds for a rank it never got. */
static void warm_drop(struct warm_shim *w)
{
    if (w->out)
        w->out->rank = NULL;
    if (w->err)
        w->err->rank = NULL;
    ostream_close(&w->out);
    ostream_close(&w->err);
    for (int i = 0; i < 4; i++) {
        close_fd(&w->child[i]);
        close_fd(&w->parent[i]);
    }
}

static void on_warm_closed(uv_handle_t *h)
{
    struct warm_shim *w = h->data;
    struct agent *a = w->a;

    if (a->warm && a->warm[w->slot] == w)
        a->warm[w->slot] = NULL;
    close_fd(&w->pidfd);
    free(w);
    a->handles_open--;
    agent_maybe_free(a);
}

static void on_warm_exit(uv_poll_t *h, int status, int events)
{
    struct warm_shim *w = h->data;
    int64_t code = 0;
    int st = 0, sig = 0;
    pid_t got = waitpid(w->pid, &st, WNOHANG);

    (void)status;
    (void)events;
    if (got == 0 || (got < 0 && errno == EINTR))
        return;
    if (got == w->pid && WIFEXITED(st))
        code = WEXITSTATUS(st);
    if (got == w->pid && WIFSIGNALED(st))
        sig = WTERMSIG(st);
    uv_poll_stop(h);
    if (w->r) {
        rank_exit(w->r, w->pid, (uv_handle_t *)h, code, sig, on_warm_closed);
        return;
    }
    /* Before its rank: released, or ended by someone else. The rank is spawned anew. */
    if (!w->gone && sig)
        log_warn("node %d: the warm shim of local rank %d ended by signal %d before its rank",
                 w->a->node_rank, w->slot, sig);
    w->gone = true;
    warm_drop(w);
    uv_close((uv_handle_t *)h, on_warm_closed);
}

/* fd, moved above the shim's own descriptors (0 to 4) where it is among them. */
static int above_shim_fds(int fd)
{
    int moved;

    if (fd < 0 || fd > 4)
        return fd;
    moved = fcntl(fd, F_DUPFD_CLOEXEC, 16);
    close(fd);
    return moved;
}

/* A warm shim's pipes, or NULL. */
static struct warm_shim *warm_new(struct agent *a, int slot)
{
    struct warm_shim *w = calloc(1, sizeof(*w));

    if (!w)
        return NULL;
    w->a = a;
    w->slot = slot;
    w->pidfd = -1;
    for (int k = 0; k < 4; k++)
        w->parent[k] = w->child[k] = -1;
    for (int k = 0; k < 4; k++) {
        int fds[2], ret;
        /* The heartbeat's and the spec's writer is the agent; the streams' the shim. The
         * streams are socket pairs, as libuv makes them for a spawned rank (a rank's output
         * is the same whichever way its shim started); the heartbeat's end never blocks the
         * loop (a full pipe: its reader is stopped, and a byte more says nothing new). */
        bool ours_writes = k >= WARM_ALIVE;
        if (k <= WARM_ERR)
            ret = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds);
        else
            ret = pipe2(fds, O_CLOEXEC);
        if (ret < 0)
            goto fail;
        if (k == WARM_ALIVE)
            fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
        w->parent[k] = above_shim_fds(fds[ours_writes ? 1 : 0]);
        w->child[k] = above_shim_fds(fds[ours_writes ? 0 : 1]);
        if (w->parent[k] < 0 || w->child[k] < 0)
            goto fail;
    }
    return w;
fail:
    warm_drop(w);
    free(w);
    return NULL;
}

void agent_warm_prepare(struct agent *a)
{
    if (a->spec->container_image || !a->spawn_argv || a->nranks <= 0)
        return;
    a->warm = calloc((size_t)a->nranks, sizeof(*a->warm));
    for (int i = 0; a->warm && i < a->nranks; i++)
        a->warm[i] = warm_new(a, i);
}

void agent_warm_spawn(struct agent *a)
{
    extern char **environ;
    char *argv[SPAWN_FIXED_ARGS + 3];
    posix_spawnattr_t attr;
    sigset_t none, all;

    if (!a->warm)
        return;
    memcpy(argv, a->spawn_argv, SPAWN_FIXED_ARGS * sizeof(*argv));
    argv[SPAWN_FIXED_ARGS] = (char *)"--spec-fd";
    argv[SPAWN_FIXED_ARGS + 1] = (char *)SHIM_SPEC_FD;
    argv[SPAWN_FIXED_ARGS + 2] = NULL;
    /* As libuv's spawn: a session of its own, no signal blocked, every disposition the
     * default for the standard signals (the daemon ignores SIGPIPE: the rank must not
     * inherit that). */
    sigemptyset(&none);
    sigemptyset(&all);
    for (int sig = 1; sig < 32; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaddset(&all, sig);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    for (int i = 0; i < a->nranks; i++) {
        struct warm_shim *w = a->warm[i];
        posix_spawn_file_actions_t fa;
        pid_t pid;
        int ret;
        if (!w)
            continue;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        for (int k = 0; k < 4; k++)
            posix_spawn_file_actions_adddup2(&fa, w->child[k], k + 1);
        if (a->spec->workdir)
            posix_spawn_file_actions_addchdir_np(&fa, a->spec->workdir);
        ret = posix_spawn(&pid, argv[0], &fa, &attr, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        w->pid = ret == 0 ? pid : -ret;
    }
    posix_spawnattr_destroy(&attr);
}

void agent_warm_adopt(struct agent *a)
{
    for (int i = 0; a->warm && i < a->nranks; i++) {
        struct warm_shim *w = a->warm[i];
        struct arank *r = &a->ranks[i];
        bool ok;
        if (!w)
            continue;
        for (int k = 0; k < 4; k++)
            close_fd(&w->child[k]);
        if (w->pid > 0) {
            w->pidfd = (int)syscall(SYS_pidfd_open, w->pid, 0);
            w->out = ostream_new(a, r);
            w->err = ostream_new(a, r);
        }
        ok = w->pid > 0 && w->pidfd >= 0 && w->out && w->err &&
             uv_pipe_open(&w->out->pipe, w->parent[WARM_OUT]) == 0;
        if (ok)
            w->parent[WARM_OUT] = -1; /* the stream's now */
        ok = ok && uv_pipe_open(&w->err->pipe, w->parent[WARM_ERR]) == 0;
        if (ok)
            w->parent[WARM_ERR] = -1;
        ok = ok && uv_poll_init(a->loop, &w->exitw, w->pidfd) == 0;
        if (ok) {
            w->err->is_err = true;
            w->exitw.data = w;
            a->handles_open++;
            uv_poll_start(&w->exitw, UV_READABLE, on_warm_exit);
            continue;
        }
        /* Not started, or not to be watched (no pidfd: a kernel before 5.3): not used. */
        log_debug("node %d: no warm shim for local rank %d", a->node_rank, i);
        if (w->pid > 0) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, NULL, 0);
        }
        warm_drop(w);
        close_fd(&w->pidfd);
        free(w);
        a->warm[i] = NULL;
    }
}

void agent_warm_release(struct agent *a)
{
    for (int i = 0; a->warm && i < a->nranks; i++) {
        struct warm_shim *w = a->warm[i];
        if (!w || w->gone || w->r || w->pidfd < 0)
            continue;
        w->gone = true;
        warm_drop(w);
        kill(w->pid, SIGKILL);
    }
}

bool agent_warm_owns(const struct agent *a, pid_t pid)
{
    for (int i = 0; a->warm && i < a->nranks; i++)
        if (a->warm[i] && a->warm[i]->pid == pid)
            return true;
    return false;
}

/* Writes n bytes to fd (non-blocking) within WARM_WRITE_MS. Returns 0 or a negative errno. */
static int write_spec(int fd, const char *buf, size_t n)
{
    int64_t waited = 0;

    while (n > 0) {
        ssize_t k = write(fd, buf, n);
        if (k > 0) {
            buf += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN)
            return -errno;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (waited >= WARM_WRITE_MS || poll(&pfd, 1, 50) < 0)
            return -ETIMEDOUT;
        waited += 50;
    }
    return 0;
}

/* The spec a warm shim reads (shim.h): the count of arguments, the arguments, the count of
 * environment entries, the entries, each ended by a NUL. New (free()), *len its size. */
static char *spec_text(char *const *args, char *const *env, size_t *len)
{
    size_t nargs = 0, nenv = 0, cap = 64, off = 0;
    char *buf;

    while (args[nargs])
        cap += strlen(args[nargs++]) + 1;
    while (env[nenv])
        cap += strlen(env[nenv++]) + 1;
    buf = malloc(cap);
    if (!buf)
        return NULL;
    off += (size_t)snprintf(buf + off, cap - off, "%zu", nargs) + 1;
    for (size_t i = 0; i < nargs; i++) {
        size_t l = strlen(args[i]) + 1;
        memcpy(buf + off, args[i], l);
        off += l;
    }
    off += (size_t)snprintf(buf + off, cap - off, "%zu", nenv) + 1;
    for (size_t i = 0; i < nenv; i++) {
        size_t l = strlen(env[i]) + 1;
        memcpy(buf + off, env[i], l);
        off += l;
    }
    *len = off;
    return buf;
}

/* Hands rank r to its warm shim: its arguments (a->spawn_argv's, past the fixed ones) and env
 * down the spec pipe. Returns 0, or a negative errno with the shim released (the rank is then
 * spawned anew). */
static int warm_hand_over(struct agent *a, struct arank *r, struct warm_shim *w, char **env)
{
    size_t len;
    char *text = spec_text(a->spawn_argv + SPAWN_FIXED_ARGS, env, &len);
    int ret, fd = w->parent[WARM_SPEC], fl = fcntl(fd, F_GETFL);

    if (!text)
        return -ENOMEM;
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    ret = write_spec(fd, text, len);
    free(text);
    if (ret < 0) {
        log_warn("node %d: the warm shim of local rank %d did not take its rank (%s): spawned "
                 "anew",
                 a->node_rank, w->slot, strerror(-ret));
        w->gone = true;
        warm_drop(w);
        kill(w->pid, SIGKILL);
        return ret;
    }
    close_fd(&w->parent[WARM_SPEC]);
    w->r = r;
    r->out = w->out;
    r->err = w->err;
    w->out = w->err = NULL;
    r->alive_fd = w->parent[WARM_ALIVE];
    w->parent[WARM_ALIVE] = -1;
    r->pid = w->pid;
    return 0;
}

/* Whether env turns Python's faulthandler on: Python reads any non-empty value as "on". */
static bool env_faulthandler(char **env)
{
    bool on = false;

    for (char **e = env; *e; e++)
        if (!strncmp(*e, "PYTHONFAULTHANDLER=", 19))
            on = (*e)[19] != '\0';
    return on;
}

/* Fills the rank's stdio: no stdin, stdout and stderr into r's streams, and as fd 3
 * (SHIM_ALIVE_FD) the shim's heartbeat pipe, a byte per heartbeat and end of file when we
 * die (without one the shim still has the parent-death signal). Returns the pipe's end for
 * the child, closed by the caller after the spawn, or -1. */
static int rank_stdio(struct arank *r, uv_stdio_container_t stdio[4])
{
    int alive[2];

    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->out->pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->err->pipe;
    stdio[3].flags = UV_IGNORE;
    if (pipe2(alive, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = alive[0];
    r->alive_fd = alive[1];
    return alive[0];
}

/* Rank r could not be spawned (err): it counts as exited, with the status a shell gives (127:
 * no such command, else 126) and a tail line that says why. A fork the node refused (its
 * process limit: EAGAIN, or no memory) is the node's failure, not the command's: gpurun's
 * own status, 125, and the words the leader classes as the node's (SPAWN_FORK_FAILED). */
static void spawn_failed(struct agent *a, struct arank *r, int err)
{
    char msg[PATH_MAX + 64];
    bool fork_failed = err == UV_EAGAIN || err == UV_ENOMEM;

    /* The handle is initialised even on failure and must be closed. */
    a->handles_open++;
    uv_close((uv_handle_t *)&r->proc, on_proc_closed);
    ostream_close(&r->out);
    ostream_close(&r->err);
    if (fork_failed)
        snprintf(msg, sizeof(msg),
                 SPAWN_FORK_FAILED " the rank's process: %s (the node's limit "
                                   "on processes)",
                 uv_strerror(err));
    else
        snprintf(msg, sizeof(msg), "cannot execute '%s': %s", a->spec->argv[0], uv_strerror(err));
    log_error("rank %d on node %d: %s", r->rank, a->node_rank, msg);
    arank_tail_add(r, msg, strlen(msg));
    r->exited = true;
    r->code = fork_failed ? 125 : err == UV_ENOENT ? 127 : 126;
    a->exited++;
}

/* Rank r could not even be prepared (err: no random bytes for its token, out of memory): it
 * counts as exited with gpurun's own failure status, 125, so that the job ends rather than
 * waiting for a rank that never started. */
static int spawn_refused_why(struct agent *a, struct arank *r, int err, const char *msg)
{
    log_error("rank %d: %s", r->rank, msg);
    arank_tail_add(r, msg, strlen(msg));
    r->exited = true;
    r->code = 125;
    r->exit_ms = (int64_t)uv_now(a->loop);
    a->exited++;
    return err;
}

static int spawn_refused(struct agent *a, struct arank *r, int err)
{
    char msg[160];

    snprintf(msg, sizeof(msg), "cannot start the rank: %s", strerror(-err));
    return spawn_refused_why(a, r, err, msg);
}

/* --gpu-bind single hands each local rank one entry of CUDA_VISIBLE_DEVICES (rankenv.c), and
 * a rank past the list's end gets none (an empty value). That is a job set up wrong, not a
 * rank to run on the CPU: refused, naming the counts. Returns 0 or -EINVAL with msg. */
static int check_gpu_bind(const struct agent *a, const struct arank *r, char *const *env, char *msg,
                          size_t cap)
{
    const char *have = getenv("CUDA_VISIBLE_DEVICES");

    if (a->spec->gpu_bind != GPU_BIND_SINGLE)
        return 0;
    for (char *const *e = env; *e; e++)
        if (!strcmp(*e, "CUDA_VISIBLE_DEVICES=")) {
            snprintf(msg, cap,
                     "--gpu-bind single: local rank %d of %d gets no GPU: CUDA_VISIBLE_DEVICES "
                     "lists fewer ('%s')",
                     r->local, a->nranks, have ? have : "");
            return -EINVAL;
        }
    return 0;
}

/* Sets a->spawn_argv's words that are rank r's: its cgroup, "--local_rank=N", its mark, into
 * the caller's buffers. */
static void fill_rank_args(struct agent *a, const struct arank *r, char *cgdir, size_t cgcap,
                           char *local_rank, size_t lrcap, char mark[JOBMARK_LEN])
{
    if (a->cgroup_slot) {
        rank_cgroup(a, r, cgdir, cgcap);
        a->spawn_argv[a->cgroup_slot] = cgdir;
    }
    if (a->local_rank_slot) {
        snprintf(local_rank, lrcap, "%s=%d", local_rank_arg_name(a->spec->local_rank_arg),
                 r->local);
        a->spawn_argv[a->local_rank_slot] = local_rank;
    }
    a->mark.rank = r->rank;
    jobmark_format(&a->mark, mark, JOBMARK_LEN);
    a->spawn_argv[a->mark_slot] = mark;
}

int agent_spawn_rank(struct agent *a, struct arank *r)
{
    uv_process_options_t opt = {0};
    uv_stdio_container_t stdio[4];
    uint8_t tok[TOKEN_BYTES];
    char **env = NULL, cgdir[PATH_MAX + 16], local_rank[32], mark[JOBMARK_LEN];
    char **words = NULL, **full = NULL;
    int ret = -1, alive;

    if (auth_random(tok, sizeof(tok)) < 0)
        return spawn_refused(a, r, -EIO);
    auth_hex(tok, sizeof(tok), r->token);
    agent_open_log(a, r);
    r->oom_base = oom_kills();
    env = build_env(a, r);
    if (!env)
        return spawn_refused(a, r, -ENOMEM);
    char why[256];
    if (check_gpu_bind(a, r, env, why, sizeof(why)) < 0) {
        free_env(env);
        return spawn_refused_why(a, r, -EINVAL, why);
    }
    r->faulthandler = env_faulthandler(env);
    struct warm_shim *w = a->warm ? a->warm[r->local] : NULL;
    if (w && !w->gone && !w->r && w->pidfd >= 0) {
        fill_rank_args(a, r, cgdir, sizeof(cgdir), local_rank, sizeof(local_rank), mark);
        if (warm_hand_over(a, r, w, env) == 0) {
            free_env(env);
            r->spawned = true;
            ostream_read_start(r->out);
            ostream_read_start(r->err);
            return 0;
        }
    }
    r->out = ostream_new(a, r);
    r->err = ostream_new(a, r);
    if (r->err)
        r->err->is_err = true;
    if (!r->out || !r->err) {
        ostream_close(&r->out);
        ostream_close(&r->err);
        free_env(env);
        return spawn_refused(a, r, -ENOMEM);
    }
    alive = rank_stdio(r, stdio);
    fill_rank_args(a, r, cgdir, sizeof(cgdir), local_rank, sizeof(local_rank), mark);
    opt.file = a->spawn_argv[0];
    opt.args = a->spawn_argv;
    if (a->spec->container_image) {
        /* The runtime's words between the shim's "--" and the command. */
        words = agent_container_words(a, r, env, a->cgroup_slot ? cgdir : NULL);
        size_t nw = 0, total = 0;
        while (words && words[nw])
            nw++;
        while (a->spawn_argv[total])
            total++;
        full = words ? calloc(total + nw + 1, sizeof(*full)) : NULL;
        if (!full) {
            container_argv_free(words);
            ostream_close(&r->out);
            ostream_close(&r->err);
            free_env(env);
            if (alive >= 0)
                close(alive);
            return spawn_refused(a, r, -ENOMEM);
        }
        size_t k = 0, dash = (size_t)a->mark_slot + 1;
        for (size_t i = 0; i <= dash; i++)
            full[k++] = a->spawn_argv[i];
        for (size_t i = 0; i < nw; i++)
            full[k++] = words[i];
        for (size_t i = dash + 1; i < total; i++)
            full[k++] = a->spawn_argv[i];
        opt.args = full;
    }
    opt.env = env;
    opt.cwd = a->spec->workdir;
    /* A process group of its own (setsid): a signal reaches everything the rank started.
     * What escapes the group still comes back to the agent, a child subreaper, and is killed
     * at the end (kill_orphans in agent.c). */
    opt.flags = UV_PROCESS_DETACHED;
    opt.stdio_count = 4;
    opt.stdio = stdio;
    opt.exit_cb = on_rank_exit;
    r->proc.data = r;
    ret = uv_spawn(a->loop, &r->proc, &opt);
    free(full);
    container_argv_free(words);
    free_env(env);
    if (alive >= 0)
        close(alive);
    if (ret < 0) {
        spawn_failed(a, r, ret);
        return ret;
    }
    r->spawned = true;
    r->pid = r->proc.pid;
    a->handles_open++;
    ostream_read_start(r->out);
    ostream_read_start(r->err);
    return 0;
}

/* The innermost frame of a Python traceback that is the user's: its last 'File "X", line N'
 * line outside the installed packages (torch's own frames say less), else the last. Fills
 * where (cap bytes) with X, "" when stack (NULL: none) has no such line, and returns N. */
static long user_frame(const char *stack, char *where, size_t cap)
{
    long line = 0;

    where[0] = '\0';
    for (int pass = 0; pass < 2 && !where[0]; pass++) {
        for (const char *p = stack; p && (p = strstr(p, "File \"")); p++) {
            const char *q = strchr(p + 6, '"');
            long n;
            if (!q || sscanf(q, "\", line %ld", &n) != 1)
                continue;
            if (pass == 0 && (memmem(p, (size_t)(q - p), "-packages/", 10) ||
                              memmem(p, (size_t)(q - p), "/lib/python3", 12)))
                continue;
            snprintf(where, cap, "%.*s", (int)(q - p - 6), p + 6);
            line = n;
        }
    }
    return line;
}

/* The error file of torch's @record (torch/distributed/elastic/multiprocessing/errors):
 * {"message": {"message": "Type: text", "extraInfo": {"py_callstack": "Traceback..."}}}, or
 * "message" a plain string. */
json_t *agent_read_error_file(struct agent *a, struct arank *r)
{
    char path[PATH_MAX], where[PATH_MAX];
    json_t *root, *msg, *out = NULL;
    const char *text = NULL, *stack = NULL, *colon;
    long line = 0;
    char *buf = NULL;
    size_t len;

    error_file_path(a, r, path, sizeof(path));
    if (fs_read_all(path, ERROR_FILE_MAX, &buf, &len) < 0)
        return NULL;
    root = json_loadb(buf, len, 0, NULL);
    free(buf);
    msg = json_object_get(root, "message");
    if (json_is_string(msg)) {
        text = json_string_value(msg);
    } else if (json_is_object(msg)) {
        text = json_string_value(json_object_get(msg, "message"));
        stack =
            json_string_value(json_object_get(json_object_get(msg, "extraInfo"), "py_callstack"));
    }
    if (!text) {
        log_warn("rank %d's error file '%s' is not torch's format: ignored", r->rank, path);
        goto out;
    }
    line = user_frame(stack, where, sizeof(where));
    colon = strstr(text, ": ");
    /* The error file's text is valid UTF-8 (json_loadb checked it); its parts are cut at a
     * character so that the exit message stays far below a frame's limit. */
    out =
        json_pack("{s:s%, s:s%}", "type", text,
                  utf8_prefix_len(text, colon ? (size_t)(colon - text) : PROTO_TAIL_MAX), "message",
                  colon ? colon + 2 : "", utf8_prefix_len(colon ? colon + 2 : "", PROTO_TAIL_MAX));
    if (out && where[0]) {
        json_object_set_new(out, "file", json_string(where));
        json_object_set_new(out, "line", json_integer(line));
    }
    if (out && stack) {
        size_t sl = strlen(stack);
        const char *from = stack + (sl > PROTO_TAIL_MAX ? sl - PROTO_TAIL_MAX : 0);
        /* The end of the traceback is what names the failure; it starts on a character. */
        while (((unsigned char)*from & 0xc0) == 0x80)
            from++;
        json_object_set_new(out, "traceback", json_string(from));
    }
    if (out)
        log_info("rank %d recorded %s", r->rank, text);
out:
    json_decref(root);
    return out;
}

/* Ranks in containers (agent_int.h, container.h): the node's runtime, each rank's command
 * line in it, the removal of what a runtime keeps, and the pre-flight checks. The daemon stays
 * on the host: the shim starts the runtime's client as the rank's command, in the rank's
 * process group and cgroup; podman's conmon and container are made inside that cgroup too
 * (--cgroup-parent), so that ending the rank ends them. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_int.h"
#include "cgroup.h"
#include "container.h"
#include "log.h"
#include "banned.h"

/* How long a pre-flight command (podman image exists, the image's Python) may take: a first
 * podman run on a node sets up its storage. */
#define CHECK_TIMEOUT_MS 30000

static bool on_path(const char *program, void *ctx)
{
    const char *dirs = getenv("PATH");
    char path[PATH_MAX];

    (void)ctx;
    for (const char *d = dirs; d && *d;) {
        int len = (int)strcspn(d, ":");
        if (snprintf(path, sizeof(path), "%.*s/%s", len ? len : 1, len ? d : ".", program) <
                (int)sizeof(path) &&
            access(path, X_OK) == 0)
            return true;
        d = d[len] ? d + len + 1 : NULL;
    }
    return false;
}

void agent_container_init(struct agent *a)
{
    int named;

    a->container_rt = CONTAINER_AUTO;
    if (!a->spec->container_image)
        return;
    named = a->spec->container_runtime ? container_runtime_parse(a->spec->container_runtime)
                                       : CONTAINER_AUTO;
    a->container_rt = container_runtime_pick(named < 0 ? CONTAINER_AUTO : named, false, on_path,
                                             NULL);
}

/* The container's name: unique on the host for the job, the node (several share a host
 * with --local), the rank (-1: the pre-flight's) and the generation. */
static void container_name(const struct agent *a, const struct arank *r, char *out, size_t n)
{
    size_t len;

    if (r->rank < 0)
        len = (size_t)snprintf(out, n, "gpurun-%s-n%d-preflight",
                               a->spec->job_id ? a->spec->job_id : "job", a->node_rank);
    else
        len = (size_t)snprintf(out, n, "gpurun-%s-n%d-r%d-g%d",
                               a->spec->job_id ? a->spec->job_id : "job", a->node_rank, r->rank,
                               a->generation);
    for (size_t i = 0; i < len && i < n; i++)
        if (!(out[i] >= 'a' && out[i] <= 'z') && !(out[i] >= 'A' && out[i] <= 'Z') &&
            !(out[i] >= '0' && out[i] <= '9') && out[i] != '_' && out[i] != '.' && out[i] != '-')
            out[i] = '_';
}

/* The variables the container gets from the rank's environment: those gpurun set or changed
 * (the torch contract, the rank library's, the user's --export), the job mark the shim adds,
 * and --container-env's. Borrowed from env and the spec; the vector is malloc'd. */
static const char **env_names(const struct agent *a, char *const *env, char **names_buf)
{
    size_t n = 0, cap = 8;
    const char **v = NULL;
    char *list = a->spec->container_env ? strdup(a->spec->container_env) : NULL;

    for (char *const *e = env; e && *e; e++)
        cap++;
    for (const char *p = list; p && *p; p++)
        cap += *p == ',';
    v = calloc(cap, sizeof(*v));
    if (!v) {
        free(list);
        return NULL;
    }
    for (char *const *e = env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[256];
        const char *was;
        if (!eq || eq - *e >= (long)sizeof(name))
            continue;
        snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
        was = getenv(name);
        if (!was || strcmp(was, eq + 1)) {
            /* The name, NUL-terminated in place: env is this spawn's own copy. */
            *(char *)eq = '\0';
            v[n++] = *e;
        }
    }
    v[n++] = JOBMARK_ENV;
    for (char *p = list, *q; p && *p; p = q) {
        q = p + strcspn(p, ",");
        if (*q)
            *q++ = '\0';
        if (*p)
            v[n++] = p;
    }
    *names_buf = list;
    return v;
}

char **agent_container_words(struct agent *a, const struct arank *r, char *const *env,
                             const char *cgdir)
{
    char name[256], parent[PATH_MAX], *list = NULL;
    const char *binds[5];
    size_t nb = 0;
    char **words;
    const char **names;
    char **copy;
    size_t ne = 0;

    /* env_names() cuts names in place: work on a copy of the pointers' strings. */
    while (env && env[ne])
        ne++;
    copy = calloc(ne + 1, sizeof(*copy));
    if (!copy)
        return NULL;
    for (size_t i = 0; i < ne; i++)
        if (!(copy[i] = strdup(env[i]))) {
            container_argv_free(copy);
            return NULL;
        }
    names = env_names(a, copy, &list);
    if (a->job_dir && a->job_dir[0])
        binds[nb++] = a->job_dir;
    if (a->sockdir[0])
        binds[nb++] = a->sockdir;
    if (a->python_dir[0])
        binds[nb++] = a->python_dir;
    /* Without --container-workdir the ranks work where they would on the host, mounted. */
    if (!a->spec->container_workdir && a->spec->workdir)
        binds[nb++] = a->spec->workdir;
    binds[nb] = NULL;
    container_name(a, r, name, sizeof(name));
    struct container_run c = {
        .runtime = a->container_rt,
        .image = a->spec->container_image,
        .mounts = a->spec->container_mounts,
        .workdir = a->spec->container_workdir ? a->spec->container_workdir : a->spec->workdir,
        .name = name,
        .job_id = a->spec->job_id,
        .cgroup_parent = cgdir && cgroup_hierarchy_path(cgdir, parent, sizeof(parent)) == 0
                             ? parent
                             : NULL,
        .env_names = names,
        .binds = binds,
        .gpus = a->spec->gpus_per_node > 0,
        .uid = (unsigned)getuid(),
        .gid = (unsigned)getgid(),
    };
    words = names ? container_argv(&c) : NULL;
    free(names);
    free(list);
    container_argv_free(copy);
    return words;
}

static void on_rm_closed(uv_handle_t *h)
{
    struct container_rm *c = h->data, **pp;
    struct agent *a = c->agent;

    for (pp = &a->container_rms; *pp && *pp != c; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = c->next;
    free(c);
    a->handles_open--;
    agent_maybe_free(a);
}

static void on_rm_exit(uv_process_t *p, int64_t status, int sig)
{
    (void)status;
    (void)sig;
    uv_close((uv_handle_t *)p, on_rm_closed);
}

void agent_container_remove(struct agent *a, const struct arank *r)
{
    char name[256];
    char **argv;
    struct container_rm *c;
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE}, {.flags = UV_IGNORE},
                                     {.flags = UV_IGNORE}};
    uv_process_options_t opt = {0};

    if (a->container_rt == CONTAINER_AUTO)
        return;
    container_name(a, r, name, sizeof(name));
    argv = container_rm_argv(a->container_rt, name);
    if (!argv)
        return;
    c = calloc(1, sizeof(*c));
    if (c) {
        opt.file = argv[0];
        opt.args = argv;
        opt.stdio_count = 3;
        opt.stdio = stdio;
        opt.exit_cb = on_rm_exit;
        c->agent = a;
        c->proc.data = c;
        if (uv_spawn(a->loop, &c->proc, &opt) == 0) {
            c->next = a->container_rms;
            a->container_rms = c;
            a->handles_open++;
        } else {
            log_debug("cannot run '%s rm' for %s", argv[0], name);
            free(c);
        }
    }
    container_argv_free(argv);
}

/* Runs argv, its output (stdout and stderr, the first n - 1 bytes) into out, for up to
 * timeout_ms. Returns its exit status, 128 + a signal, or -1 when it could not run or ran
 * too long (then killed). */
static int run_sync(char *const *argv, int timeout_ms, char *out, size_t n)
{
    int fds[2], status = 0;
    size_t len = 0;
    pid_t pid;

    out[0] = '\0';
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -1;
    pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    for (int waited = 0; waited < timeout_ms;) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int r = poll(&pfd, 1, 100);
        if (r > 0) {
            char buf[512];
            ssize_t got = read(fds[0], buf, sizeof(buf));
            if (got <= 0)
                break;
            for (ssize_t i = 0; i < got && len + 1 < n; i++)
                out[len++] = buf[i];
            out[len] = '\0';
        } else {
            waited += 100;
        }
    }
    close(fds[0]);
    for (int i = 0; i < timeout_ms / 10; i++) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (w < 0)
            return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* The last non-empty line of text, for a one-line reason. */
static const char *last_line(char *text)
{
    size_t len = strlen(text);
    char *nl;

    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        text[--len] = '\0';
    nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

void agent_container_preflight(struct agent *a, char *why, size_t n)
{
    const struct jobspec *spec = a->spec;
    const char *program = container_runtime_program(a->container_rt);
    char item[4096], out[1024];
    const char *s = spec->container_mounts;

    why[0] = '\0';
    if (!spec->container_image)
        return;
    if (a->container_rt == CONTAINER_AUTO) {
        snprintf(why, n, "--container-image: no container runtime on this node (none of podman, "
                         "docker, apptainer, singularity or enroot on PATH)");
        return;
    }
    if (!on_path(program, NULL)) {
        snprintf(why, n, "--container-runtime %s: '%s' is not installed on this node (not on PATH)",
                 container_runtime_name(a->container_rt), program);
        return;
    }
    /* Each mount's source. */
    while (s && *s) {
        size_t len = strcspn(s, ",");
        struct stat st;
        snprintf(item, sizeof(item), "%.*s", (int)len, s);
        item[strcspn(item, ":")] = '\0';
        if (stat(item, &st) < 0) {
            snprintf(why, n, "--container-mounts: '%s' does not exist on this node", item);
            return;
        }
        s += len + (s[len] == ',');
    }
    if (a->container_rt == CONTAINER_PODMAN || a->container_rt == CONTAINER_DOCKER) {
        char *exists[] = {(char *)program, (char *)"image", (char *)"inspect", (char *)"--format",
                          (char *)"{{.Id}}", spec->container_image, NULL};
        if (run_sync(exists, CHECK_TIMEOUT_MS, out, sizeof(out)) != 0) {
            snprintf(why, n, "--container-image '%s': not on this node (%s image inspect: %s)",
                     spec->container_image, program, last_line(out));
            return;
        }
    } else if (spec->container_image[0] == '/' && access(spec->container_image, R_OK) < 0) {
        snprintf(why, n, "--container-image '%s': %s on this node", spec->container_image,
                 strerror(errno));
        return;
    }
    /* The job's Python in the image (with the job's mounts): a Python command only, run with
     * "-c pass"; another command is not run before its time. */
    const char *cmd = spec->argv[0], *base = strrchr(cmd, '/');
    if (strncmp(base ? base + 1 : cmd, "python", 6))
        return;
    struct arank probe = {.rank = -1};
    char *env[] = {NULL};
    char **words = agent_container_words(a, &probe, env, NULL);
    size_t nw = 0;
    while (words && words[nw])
        nw++;
    char **argv = words ? calloc(nw + 4, sizeof(*argv)) : NULL;
    if (!argv) {
        container_argv_free(words);
        return;
    }
    for (size_t i = 0; i < nw; i++)
        argv[i] = words[i];
    argv[nw] = (char *)cmd;
    argv[nw + 1] = (char *)"-c";
    argv[nw + 2] = (char *)"pass";
    int rc = run_sync(argv, CHECK_TIMEOUT_MS, out, sizeof(out));
    if (rc < 0)
        snprintf(why, n, "--container-image '%s': '%s -c pass' in it did not end in %d s",
                 spec->container_image, cmd, CHECK_TIMEOUT_MS / 1000);
    else if (rc != 0)
        snprintf(why, n, "--container-image '%s' cannot run the job's '%s' (exit status %d: %s)",
                 spec->container_image, cmd, rc, last_line(out));
    free(argv);
    container_argv_free(words);
}

/* Ranks in containers (agent_int.h, container.h): the node's runtime, each rank's command
 * line in it, the removal of what a runtime keeps, and the pre-flight checks. The daemon stays
 * on the host: the shim starts the runtime's client as the rank's command, in the rank's
 * process group and cgroup; podman's conmon and container are made inside that cgroup too
 * (--cgroup-parent), so that ending the rank ends them. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Whether this node is in a Slurm job whose srun has pyxis: its plugstack names it. */
static bool have_pyxis(void)
{
    static const char *const files[] = {"/etc/slurm/plugstack.conf",
                                        "/etc/slurm/plugstack.conf.d/pyxis.conf"};
    char line[1024];

    if (!getenv("SLURM_JOB_ID"))
        return false;
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        FILE *f = fopen(files[i], "re");
        bool found = false;
        while (f && !found && fgets(line, sizeof(line), f))
            found = line[0] != '#' && strstr(line, "spank_pyxis") != NULL;
        if (f)
            fclose(f);
        if (found)
            return true;
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
    a->container_rt =
        container_runtime_pick(named < 0 ? CONTAINER_AUTO : named, have_pyxis(), on_path, NULL);
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

/* What describes the host's own file system or shell, not the job: kept out of a container,
 * whose image has its own, unless --container-env names it. */
static bool host_only(const char *name)
{
    static const char *const names[] = {
        "PATH",   "HOME",   "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME", "VIRTUAL_ENV",
        "PWD",    "OLDPWD", "SHELL",           "SHLVL",      "HOSTNAME",   "_",
        "TMPDIR", "MAIL",   "LOGNAME",         "USER",
    };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(name, names[i]))
            return true;
    return !strncmp(name, "CONDA_", 6) || !strncmp(name, "XDG_", 4) || !strncmp(name, "_CE_", 4);
}

/* Whether the comma-separated list has name. */
static bool listed(const char *list, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n))
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* The variables the container gets from the rank's environment, as pyxis and Apptainer pass
 * them: all of them (the torch contract, the rank library's, the user's own: NCCL_*, HF_*,
 * WANDB_*...) but those of the host's layout (host_only) that --container-env does not name,
 * and the job mark the shim adds. The names are cut in place in env (this spawn's copy); the
 * vector is malloc'd. */
static const char **env_names(const struct agent *a, char **env)
{
    size_t n = 0, cap = 2;
    const char **v;

    for (char **e = env; e && *e; e++)
        cap++;
    v = calloc(cap, sizeof(*v));
    if (!v)
        return NULL;
    for (char **e = env; e && *e; e++) {
        char *eq = strchr(*e, '=');
        if (!eq || eq == *e)
            continue;
        *eq = '\0';
        if (!host_only(*e) || listed(a->spec->container_env, *e))
            v[n++] = *e;
    }
    v[n++] = JOBMARK_ENV;
    return v;
}

char **agent_container_words(struct agent *a, const struct arank *r, char *const *env,
                             const char *cgdir)
{
    char name[256], parent[PATH_MAX];
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
    names = env_names(a, copy);
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
        .cgroup_parent =
            cgdir && cgroup_hierarchy_path(cgdir, parent, sizeof(parent)) == 0 ? parent : NULL,
        .env_names = names,
        .binds = binds,
        /* The node's NVIDIA GPUs, where it has them (a test cluster's are only names in
         * CUDA_VISIBLE_DEVICES, and Podman refuses a CDI device it cannot resolve). */
        .gpus = a->spec->gpus_per_node > 0 && access("/dev/nvidiactl", F_OK) == 0,
        .uid = (unsigned)getuid(),
        .gid = (unsigned)getgid(),
    };
    words = names ? container_argv(&c) : NULL;
    free(names);
    container_argv_free(copy);
    return words;
}

static void on_cmd_closed(uv_handle_t *h)
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

/* The probe's verdict, from its exit and output. */
static void probe_verdict(struct agent *a, int64_t status, int sig, int fd)
{
    const struct jobspec *spec = a->spec;
    const char *program = container_runtime_program(a->container_rt);
    char out[1024] = "";
    ssize_t got = fd >= 0 && lseek(fd, 0, SEEK_SET) == 0 ? read(fd, out, sizeof(out) - 1) : 0;

    out[got > 0 ? got : 0] = '\0';
    a->container_why[0] = '\0';
    if (status == 0 && !sig)
        return;
    if (sig || status == 124 || status == 137)
        snprintf(a->container_why, sizeof(a->container_why),
                 "--container-image '%s': the pre-flight's %s did not end in %d s",
                 spec->container_image, program, CHECK_TIMEOUT_MS / 1000);
    else if (strstr(out, "image not known") || strstr(out, "No such image") ||
             strstr(out, "no such object") || strstr(out, "Unable to find image") ||
             strstr(out, "pull policy"))
        snprintf(a->container_why, sizeof(a->container_why),
                 "--container-image '%s': not on this node (%s: %s)", spec->container_image,
                 program, last_line(out));
    else if (a->container_probe_runs)
        snprintf(a->container_why, sizeof(a->container_why),
                 "--container-image '%s' cannot run the job's '%s' (exit status %d: %s)",
                 spec->container_image, spec->argv[0], (int)status, last_line(out));
    else
        snprintf(a->container_why, sizeof(a->container_why),
                 "--container-image '%s': not usable on this node (%s: %s)", spec->container_image,
                 program, last_line(out));
}

static void on_cmd_exit(uv_process_t *p, int64_t status, int sig)
{
    struct container_rm *c = p->data;
    struct agent *a = c->agent;

    if (c->then) {
        char dir[PATH_MAX + 16];
        probe_verdict(a, status, sig, c->out_fd);
        close(c->out_fd);
        if (a->cgroup[0]) {
            snprintf(dir, sizeof(dir), "%s/preflight", a->cgroup);
            cgroup_remove(dir, 1000);
        }
        if (a->container_probe_runs) {
            /* What a probe cut short leaves of its container goes, as a rank's would. */
            struct arank probe = {.rank = -1};
            agent_container_remove(a, &probe);
        }
        a->container_probe = CONTAINER_PROBE_DONE;
        c->then(a);
    }
    uv_close((uv_handle_t *)p, on_cmd_closed);
}

/* Starts argv as a runtime command of the agent's: output into out_fd (-1: none) and, for
 * the probe, then(a) at its end. Returns 0 or a negative errno. */
static int start_cmd(struct agent *a, char **argv, int out_fd, void (*then)(struct agent *))
{
    struct container_rm *c = calloc(1, sizeof(*c));
    uv_stdio_container_t stdio[3] = {
        {.flags = UV_IGNORE}, {.flags = UV_IGNORE}, {.flags = UV_IGNORE}};
    uv_process_options_t opt = {0};
    int ret;

    if (!c)
        return -ENOMEM;
    if (out_fd >= 0) {
        stdio[1] = (uv_stdio_container_t){.flags = UV_INHERIT_FD, .data.fd = out_fd};
        stdio[2] = stdio[1];
    }
    opt.file = argv[0];
    opt.args = argv;
    opt.stdio_count = 3;
    opt.stdio = stdio;
    opt.exit_cb = on_cmd_exit;
    c->agent = a;
    c->out_fd = out_fd;
    c->then = then;
    c->proc.data = c;
    ret = uv_spawn(a->loop, &c->proc, &opt);
    if (ret < 0) {
        free(c);
        return ret;
    }
    c->next = a->container_rms;
    a->container_rms = c;
    a->handles_open++;
    return 0;
}

void agent_container_remove(struct agent *a, const struct arank *r)
{
    char name[256];
    char **argv;

    if (a->container_rt == CONTAINER_AUTO)
        return;
    container_name(a, r, name, sizeof(name));
    argv = container_rm_argv(a->container_rt, name);
    if (argv && start_cmd(a, argv, -1, NULL) < 0)
        log_debug("cannot run '%s rm' for %s", argv[0], name);
    container_argv_free(argv);
}

/* The checks made at once: the runtime, the mounts' sources, an image file. */
static bool quick_checks(struct agent *a)
{
    const struct jobspec *spec = a->spec;
    const char *program = container_runtime_program(a->container_rt);
    char item[4096], *why = a->container_why;
    size_t n = sizeof(a->container_why);
    const char *s = spec->container_mounts;

    if (a->container_rt == CONTAINER_AUTO) {
        snprintf(why, n,
                 "--container-image: no container runtime on this node (none of podman, "
                 "docker, apptainer, singularity or enroot on PATH)");
        return false;
    }
    if (!on_path(program, NULL)) {
        snprintf(why, n, "--container-runtime %s: '%s' is not installed on this node (not on PATH)",
                 container_runtime_name(a->container_rt), program);
        return false;
    }
    while (s && *s) {
        size_t len = strcspn(s, ",");
        struct stat st;
        snprintf(item, sizeof(item), "%.*s", (int)len, s);
        item[strcspn(item, ":")] = '\0';
        if (stat(item, &st) < 0) {
            snprintf(why, n, "--container-mounts: '%.200s' does not exist on this node", item);
            return false;
        }
        s += len + (s[len] == ',');
    }
    if ((a->container_rt != CONTAINER_PODMAN && a->container_rt != CONTAINER_DOCKER) &&
        spec->container_image[0] == '/' && access(spec->container_image, R_OK) < 0) {
        snprintf(why, n, "--container-image '%s': %s on this node", spec->container_image,
                 strerror(errno));
        return false;
    }
    return true;
}

bool agent_container_preflight(struct agent *a, void (*then)(struct agent *a))
{
    const struct jobspec *spec = a->spec;
    const char *cmd = spec->argv[0], *base = strrchr(cmd, '/');
    char **words = NULL, **argv = NULL, cgdir[PATH_MAX + 16] = "", limit[16];
    size_t nw = 0, k = 0;
    bool python = !strncmp(base ? base + 1 : cmd, "python", 6);
    int fd = -1;

    if (a->container_probe == CONTAINER_PROBE_DONE)
        return true;
    a->container_probe = CONTAINER_PROBE_DONE;
    a->container_why[0] = '\0';
    if (!spec->container_image || !quick_checks(a))
        return true;
    /* The probe: the job's Python, run in the image as a rank would be (in a cgroup of the
     * job's, so that what it leaves ends with it); for another command, the image's presence
     * alone (podman, docker; Apptainer's and enroot's image is a file, checked above). */
    a->container_probe_runs = python;
    if (python) {
        struct arank probe = {.rank = -1};
        char *env[] = {NULL};
        if (a->cgroup[0]) {
            snprintf(cgdir, sizeof(cgdir), "%s/preflight", a->cgroup);
            if (cgroup_make(cgdir) < 0)
                cgdir[0] = '\0';
        }
        words = agent_container_words(a, &probe, env, cgdir[0] ? cgdir : NULL);
    } else if (a->container_rt == CONTAINER_PODMAN || a->container_rt == CONTAINER_DOCKER) {
        char *inspect[] = {(char *)container_runtime_program(a->container_rt),
                           (char *)"image",
                           (char *)"inspect",
                           (char *)"--format",
                           (char *)"{{.Id}}",
                           spec->container_image,
                           NULL};
        words = calloc(7, sizeof(*words));
        for (size_t i = 0; words && inspect[i]; i++)
            if (!(words[i] = strdup(inspect[i]))) {
                container_argv_free(words);
                words = NULL;
                break;
            }
    } else {
        return true;
    }
    while (words && words[nw])
        nw++;
    argv = words ? calloc(nw + 8, sizeof(*argv)) : NULL;
    char path[PATH_MAX];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/gpurun-probe-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    fd = argv ? mkstemp(path) : -1;
    if (fd < 0) {
        free(argv);
        container_argv_free(words);
        return true; /* unchecked: the ranks' own start tells */
    }
    unlink(path);
    /* coreutils' timeout bounds it: a runtime that hangs must not hold the job. */
    snprintf(limit, sizeof(limit), "%d", CHECK_TIMEOUT_MS / 1000);
    argv[k++] = (char *)"timeout";
    argv[k++] = (char *)"-k";
    argv[k++] = (char *)"5";
    argv[k++] = limit;
    for (size_t i = 0; i < nw; i++)
        argv[k++] = words[i];
    if (python) {
        argv[k++] = (char *)cmd;
        argv[k++] = (char *)"-c";
        argv[k++] = (char *)"pass";
    }
    argv[k] = NULL;
    if (start_cmd(a, argv, fd, then) < 0) {
        close(fd);
        free(argv);
        container_argv_free(words);
        return true;
    }
    a->container_probe = CONTAINER_PROBE_RUNNING;
    free(argv);
    container_argv_free(words);
    return false;
}

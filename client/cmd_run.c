/* gpurun's run: the command line and a train.cfg made into a run plan (the ranks' command,
 * the job's name and size), then the job, either here (run_local: a job dir, then local.c's
 * launcher) or on Slurm (run_slurm: sbatch.c's batch script submitted through slurmlib.c,
 * followed with --wait by follow.c). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "cmd.h"
#include "container.h"
#include "follow.h"
#include "fsutil.h"
#include "horovod.h"
#include "jobdir.h"
#include "local.h"
#include "monotime.h"
#include "path.h"
#include "python.h"
#include "ranklist.h"
#include "sbatch.h"
#include "signame.h"
#include "slurmlib.h"
#include "status.h"
#include "traincfg.h"
#include "banned.h"

/* --- the plan: what the ranks run ------------------------------------------------------------- */

/* The path of the running gpurun, or NULL. */
static const char *self_path(char *buf, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);

    if (len <= 0)
        return NULL;
    buf[len] = '\0';
    return buf;
}

/* Finds a program gpurun ships: beside gpurun, else on PATH (local_find_program). */
static int find_program(const char *name, char *out, size_t n)
{
    char self[PATH_MAX];

    return local_find_program(name, self_path(self, sizeof(self)), getenv("PATH"), out, n);
}

/* A script's "#!" interpreter (of found, the file cmd names), checked as the kernel will
 * exec it: one that is missing makes exec fail with ENOENT, which would read as the script's
 * own absence. Only an absolute path is checked (a relative one is the ranks' working
 * directory's). Here it refuses; for Slurm, whose nodes may see other files, it warns. */
static int check_interpreter(const char *cmd, const char *found, bool local)
{
    char interp[PATH_MAX], resolved[PATH_MAX];
    int r;

    if (fs_script_interpreter(found, interp, sizeof(interp)) != 1 || interp[0] != '/')
        return 0;
    r = local_resolve(interp, NULL, resolved, sizeof(resolved));
    if (r == 0)
        return 0;
    if (!local) {
        fprintf(stderr,
                "gpurun: warning: '%s': its interpreter '%s' (from its #! line) %s here (the "
                "nodes may see other files)\n",
                cmd, interp, r == -EACCES ? "is not an executable file" : "does not exist");
        return 0;
    }
    if (r == -EACCES)
        return error_out(EXIT_CANNOT_RUN,
                         "cannot execute '%s': its interpreter '%s' (from its #! line) is not an "
                         "executable file",
                         cmd, interp);
    return error_out(EXIT_NOT_FOUND,
                     "cannot execute '%s': its interpreter '%s' (from its #! line) does not exist",
                     cmd, interp);
}

/* Checks CMD the way the daemons will exec it, so that a typo fails here with 127 before a
 * job dir, a daemon or a Slurm job exists; local: the job runs here (check_interpreter). */
static int check_command(const char *cmd, bool local)
{
    char found[PATH_MAX];
    int r = local_resolve(cmd, getenv("PATH"), found, sizeof(found));

    if (r == -ENOENT)
        return error_out(EXIT_NOT_FOUND,
                         strchr(cmd, '/') ? "'%s': no such file" : "'%s': command not found", cmd);
    if (r == -EACCES)
        return error_out(EXIT_CANNOT_RUN, "'%s': permission denied (not an executable file)", cmd);
    if (r < 0)
        return error_out(EXIT_NOT_FOUND, "'%s': %s", cmd, uv_strerror(r));
    return check_interpreter(cmd, found, local);
}

/* The interpreter of a SCRIPT.py run (python.h chooses it): torchrun runs a script with its own
 * Python, the one of the venv it was installed in; gpurun is no Python program, so it takes
 * --python's, else the active venv's (VIRTUAL_ENV: the venv the user's pip installed into),
 * else python3 from each node's PATH, as it finds any command. It is checked here, where it
 * is named, so that a wrong one fails before a job exists. Returns 0 or an exit status with
 * the error printed. */
static int check_python(const struct python_choice *c, const char *venv, bool local)
{
    char found[PATH_MAX];
    int r = local_resolve(c->path, getenv("PATH"), found, sizeof(found));
    int status = r == -EACCES ? EXIT_CANNOT_RUN : EXIT_NOT_FOUND;
    const char *why = r == -ENOENT   ? "no such file"
                      : r == -EACCES ? "not an executable file"
                      : r < 0        ? uv_strerror(r)
                                     : NULL;

    if (!why)
        return 0;
    if (c->source == PYTHON_GIVEN)
        return error_out(status,
                         "--python '%s': %s (give the path of a Python, e.g. --python "
                         "/usr/bin/python3)",
                         c->path,
                         r == -ENOENT && !strchr(c->path, '/') ? "not found on PATH" : why);
    if (c->source == PYTHON_VENV)
        return error_out(status,
                         "VIRTUAL_ENV '%s': '%s': %s (activate a venv that exists, or "
                         "deactivate it, or give --python PATH)",
                         venv, c->path, why);
    return check_command(c->path, local);
}

/* What a run needs besides the options: the ranks' command and, for a train.cfg, the
 * configuration whose strings the options borrow. */
struct run_plan {
    struct traincfg cfg;
    bool have_cfg;
    struct python_choice python; /* a SCRIPT.py's interpreter: argv[0] */
    char **argv;                 /* NULL-terminated; new, strings borrowed or in store */
    int argc;
    char train[PATH_MAX], cfg_path[PATH_MAX];
    char job_name[256];
    char spare_note[256]; /* what --spare-nodes implies, said once the job is under way */
};

static void plan_release(struct run_plan *p)
{
    if (p->have_cfg)
        traincfg_release(&p->cfg);
    free(p->argv);
}

/* The name of a train.cfg's job where -J gives none: its [job] name, else the file's name
 * without ".cfg". */
static void cfg_job_name(struct gpurun_args *args, struct run_plan *p)
{
    const char *base;
    size_t len;

    if (p->cfg.job_name) {
        args->job_name = p->cfg.job_name;
        return;
    }
    base = strrchr(args->target, '/');
    base = base ? base + 1 : args->target;
    len = strlen(base);
    if (len > 4 && !strcmp(base + len - 4, ".cfg"))
        len -= 4;
    snprintf(p->job_name, sizeof(p->job_name), "%.*s", (int)len, base);
    args->job_name = p->job_name;
}

/* The first element of a data spec (a path, a glob, or a comma-separated list of them, as
 * gpurun-train reads it) that matches no file, copied to out; false when every one matches. */
static bool data_missing(const char *spec, char *out, size_t n)
{
    const char *p = spec;

    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        glob_t g;
        bool found;

        snprintf(out, n, "%.*s", (int)len, p);
        found = glob(out, GLOB_NOCHECK, NULL, &g) == 0 && g.gl_pathc > 0 &&
                access(g.gl_pathv[0], F_OK) == 0;
        globfree(&g);
        if (!found)
            return true;
        p = comma ? comma + 1 : NULL;
    }
    return false;
}

/* A first run's most likely error, said before anything starts and with the way out: the
 * token shards are not made yet. On Slurm the nodes may see other files than this host: a
 * warning there, a refusal here. */
static int check_data(const struct gpurun_args *args, const struct traincfg *c)
{
    const char *const keys[] = {"train", "val"};
    const char *const specs[] = {c->train, c->val};
    char missing[PATH_MAX];

    for (int i = 0; i < 2; i++) {
        if (!specs[i] || !data_missing(specs[i], missing, sizeof(missing)))
            continue;
        const char *demo = strstr(missing, "data/demo/") ? "; the demo's are made by "
                                                           "scripts/prep-demo-data.sh (or make run)"
                                                         : "";
        if (!args->local) {
            fprintf(stderr,
                    "gpurun: warning: %s: data.%s: '%s': no file matches here (the nodes may see "
                    "other files)\n",
                    args->target, keys[i], missing);
            continue;
        }
        return error_out(EXIT_FAILED,
                         "%s: data.%s: '%s': no file matches; make token shards with "
                         "'gpurun-train prep TEXT... -o DIR'%s",
                         args->target, keys[i], missing, demo);
    }
    return 0;
}

/* A train.cfg: its [job] keys where no flag is given, and gpurun-train as the command. */
static int plan_cfg(struct gpurun_args *args, struct run_plan *p)
{
    struct errmsg terr;
    struct traincfg *c = &p->cfg;

    if (access(args->target, F_OK) < 0)
        return error_out(EXIT_FAILED,
                         "'%s': no such file (to run a command, put it after '--': gpurun "
                         "[options] -- %s)",
                         args->target, args->target);
    if (traincfg_read(c, args->target, args->overrides, (size_t)args->n_overrides, &terr) < 0)
        return error_out(EXIT_FAILED, "%s", terr.text);
    p->have_cfg = true;
    if (!args_given(args, "nodes")) {
        if (c->nodes > 65536)
            return error_out(EXIT_FAILED, "%s: [job] nodes: must be 1..65536", args->target);
        args->spec.nnodes = c->nodes;
    }
    if (!args_given(args, "gpus-per-node"))
        args->spec.nprocs = c->gpus_per_node;
    if (!args_given(args, "time") && c->time_min > 0)
        args->time_limit_s = (long)c->time_min * 60;
    if (!args_given(args, "partition") && c->partition)
        args->partition = c->partition;
    if (!args_given(args, "account") && c->account)
        args->account = c->account;
    if (!args_given(args, "output") && c->output)
        args->output = c->output;
    if (!args_given(args, "max-restarts"))
        args->spec.max_restarts = c->max_restarts;
    if (!args_given(args, "no-gpus") && c->device == TRAINCFG_DEVICE_CPU)
        args->no_gpus = true;
    if (!args_given(args, "job-name"))
        cfg_job_name(args, p);
    if (find_program("gpurun-train", p->train, sizeof(p->train)) < 0)
        return error_out(EXIT_NOT_FOUND, "cannot find 'gpurun-train' beside gpurun or on PATH");
    if (check_data(args, c))
        return EXIT_FAILED;
    if (!realpath(args->target, p->cfg_path))
        return error_out(EXIT_FAILED, "cannot resolve '%s': %s", args->target, uv_strerror(-errno));
    p->argc = 2 + args->n_overrides;
    p->argv = calloc((size_t)p->argc + 1, sizeof(*p->argv));
    if (!p->argv)
        return error_out(EXIT_FAILED, "out of memory");
    p->argv[0] = p->train;
    p->argv[1] = p->cfg_path;
    for (int i = 0; i < args->n_overrides; i++)
        p->argv[2 + i] = (char *)args->overrides[i];
    return 0;
}

/* The length of the name of a --local_rank or --local-rank word of a command ("--local_rank",
 * "--local_rank=3"), else 0. */
static size_t local_rank_word(const char *w)
{
    if (strncmp(w, "--local", 7) || (w[7] != '_' && w[7] != '-') || strncmp(w + 8, "rank", 4))
        return 0;
    return w[12] == '\0' || w[12] == '=' ? 12 : 0;
}

/* Where torch.distributed.launch puts '--local_rank=N': after the script, before its
 * arguments (after "-m MODULE", or after the command itself for one that is not Python's). */
static int local_rank_slot(char *const *argv, int argc)
{
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            return i + 2;
        if (n > 3 && !strcmp(argv[i] + n - 3, ".py"))
            return i + 1;
    }
    return 1;
}

/* A command with a --local_rank of its own ("train.py --local_rank 0") would give every rank
 * the same one: refused, unless --local-rank-arg replaces it with each rank's. With
 * --local-rank-arg, the spec says where each rank's goes. Returns 0 or an exit status with the
 * error printed. */
static int plan_local_rank(struct gpurun_args *args, struct run_plan *p)
{
    struct jobspec *s = &args->spec;
    int at = -1;

    for (int i = 1; i < p->argc; i++) {
        size_t n = local_rank_word(p->argv[i]);
        int words = n && !p->argv[i][n] && i + 1 < p->argc ? 2 : 1;
        if (!n)
            continue;
        if (!s->local_rank_arg && s->nprocs > 1)
            return error_out(EXIT_FAILED,
                             "the command gives every rank '%s%s%s': drop it and add "
                             "--local-rank-arg, which passes each rank its own",
                             p->argv[i], words == 2 ? " " : "", words == 2 ? p->argv[i + 1] : "");
        if (!s->local_rank_arg)
            return 0;
        memmove(p->argv + i, p->argv + i + words,
                (size_t)(p->argc - i - words + 1) * sizeof(*p->argv));
        p->argc -= words;
        if (at < 0)
            at = i;
        i--;
    }
    if (s->local_rank_arg)
        s->local_rank_at = at >= 0 ? at : local_rank_slot(p->argv, p->argc);
    return 0;
}

static int plan_run(struct gpurun_args *args, struct run_plan *p)
{
    struct stat st;
    int ret, lead = args->script ? 1 : 0;

    if (args->python && !args->script)
        return error_out(EXIT_FAILED,
                         "--python '%s': the job runs no SCRIPT.py (with '-- CMD', name the "
                         "interpreter as CMD)",
                         args->python);
    if (args->target && args->spec.local_rank_arg)
        return error_out(EXIT_FAILED, "--local-rank-arg is for a script or '-- CMD': "
                                      "gpurun-train reads LOCAL_RANK itself");
    if (args->target)
        return plan_cfg(args, p);
    if (args->n_overrides > 0)
        return error_out(EXIT_FAILED, "'%s': an override needs a train.cfg to apply to",
                         args->overrides[0]);
    if (!args->cmd_argv)
        return error_out(EXIT_FAILED, "no command to run: give a train.cfg, a SCRIPT.py or "
                                      "'-- CMD ARGS...' (see 'gpurun --help')");
    /* torchrun's "train.py ARGS": a Python runs it (check_python); the script is checked
     * here, where it is named. */
    if (args->script && stat(args->script, &st) < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return error_out(EXIT_NOT_FOUND, "'%s': no such file", args->script);
        return error_out(EXIT_CANNOT_RUN, "'%s': %s", args->script, uv_strerror(-errno));
    }
    if (args->script) {
        const char *venv = getenv("VIRTUAL_ENV");
        if (python_choose(&p->python, args->python, venv) < 0)
            return error_out(EXIT_FAILED, "the path of the Python is too long");
        ret = check_python(&p->python, venv, args->local);
    } else {
        ret = check_command(args->cmd_argv[0], args->local);
    }
    if (ret)
        return ret;
    p->argc = lead + args->cmd_argc;
    p->argv = calloc((size_t)p->argc + 1, sizeof(*p->argv));
    if (!p->argv)
        return error_out(EXIT_FAILED, "out of memory");
    if (args->script)
        p->argv[0] = p->python.path;
    memcpy(p->argv + lead, args->cmd_argv, (size_t)args->cmd_argc * sizeof(*p->argv));
    if ((ret = plan_local_rank(args, p)) != 0)
        return ret;
    if (!args->job_name) {
        job_default_name(p->job_name, sizeof(p->job_name), p->argv, p->argc);
        args->job_name = p->job_name;
    }
    return 0;
}

/* --container-*: checked, into the spec. Where each node finds its runtime, the image and
 * the mounts' sources is the nodes' pre-flight's to check. */
static int plan_container(struct gpurun_args *args)
{
    struct jobspec *spec = &args->spec;
    struct errmsg err = {{0}};
    const struct {
        const char *value, *option;
        char **field;
    } opts[] = {
        {args->container_image, "--container-image", &spec->container_image},
        {args->container_mounts, "--container-mounts", &spec->container_mounts},
        {args->container_workdir, "--container-workdir", &spec->container_workdir},
        {args->container_env, "--container-env", &spec->container_env},
        {args->container_runtime, "--container-runtime", &spec->container_runtime},
    };

    for (size_t i = 1; i < sizeof(opts) / sizeof(opts[0]); i++)
        if (opts[i].value && !args->container_image)
            return error_out(EXIT_FAILED, "%s needs --container-image", opts[i].option);
    if (args->container_mounts && container_mounts_check(args->container_mounts, &err) < 0)
        return error_out(EXIT_FAILED, "--container-mounts: %s", err.text);
    if (args->container_env && container_env_check(args->container_env, &err) < 0)
        return error_out(EXIT_FAILED, "--container-env: %s", err.text);
    if (args->container_workdir && args->container_workdir[0] != '/')
        return error_out(EXIT_FAILED, "--container-workdir '%s': an absolute path inside",
                         args->container_workdir);
    if (args->container_runtime && container_runtime_parse(args->container_runtime) < 0)
        return error_out(EXIT_FAILED,
                         "--container-runtime '%s': podman, docker, apptainer (singularity), "
                         "enroot, pyxis or auto",
                         args->container_runtime);
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
        if (opts[i].value && !(*opts[i].field = strdup(opts[i].value)))
            return error_out(EXIT_FAILED, "out of memory");
    return 0;
}

/* What the daemons know of the job besides its command: its name, its time limit, whether it
 * uses horovod, and the restarts its spares imply (said here, at submit time, as the job's
 * spares will serve). */
static int plan_spec(struct gpurun_args *args, struct run_plan *p)
{
    jobspec_spare_restarts(
        &args->spec, args_given(args, "max-restarts") || (p->have_cfg && p->cfg.max_restarts > 0),
        args_given(args, "restart-on"), p->spare_note, sizeof(p->spare_note));
    args->spec.time_limit_s = (int)args->time_limit_s;
    args->spec.mpi_env = args->mpi_env;
    args->spec.require_rendezvous = args->require_rendezvous;
    args->spec.horovod = horovod_decide(args->horovod, p->argv, p->argc);
    if (args->job_name && !(args->spec.name = strdup(args->job_name)))
        return error_out(EXIT_FAILED, "out of memory");
    return plan_container(args);
}

/* After a failed job whose first failure is a module its SCRIPT.py's Python lacks (job_dir's
 * summary.json says), one more line: which Python ran, and how to choose another; after one
 * whose rank looked for torch.distributed.launch's --local_rank, the option that passes it. */
static void python_hint(const struct run_plan *p, const struct gpurun_args *args,
                        const char *job_dir)
{
    char module[128], found[PATH_MAX];
    struct errmsg err;
    json_t *summary = NULL;
    int rank;

    if (!job_dir || status_load_summary(job_dir, &summary, &err) < 0)
        return;
    if (!args->spec.local_rank_arg && python_wants_local_rank(summary, &rank))
        fprintf(stderr,
                "gpurun: rank %d looked for --local_rank in its arguments "
                "(torch.distributed.launch's way): add --local-rank-arg (=local-rank for "
                "'--local-rank'), or read LOCAL_RANK from the environment\n",
                rank);
    else if (args->script && python_missing_module(summary, module, sizeof(module), &rank))
        python_print_missing(
            stderr, &p->python,
            local_resolve(p->python.path, getenv("PATH"), found, sizeof(found)) == 0 ? found : NULL,
            module, rank);
    json_decref(summary);
}

/* --- the job's places, here and on Slurm ------------------------------------------------------ */

/* --metrics-dir into the spec, absolute: every node's daemon reads it (on Slurm the folder is
 * each node's own, node_exporter's, so it need not exist here). Returns 0 or an exit status
 * with the error printed. */
/* A train.cfg's out_dir into the spec, for pre-flight. Returns 0 or -ENOMEM. */
static int set_out_dir(const struct run_plan *p, struct jobspec *spec)
{
    if (!p->have_cfg || !p->cfg.out_dir)
        return 0;
    free(spec->out_dir);
    spec->out_dir = strdup(p->cfg.out_dir);
    return spec->out_dir ? 0 : -ENOMEM;
}

static int set_metrics_dir(const struct gpurun_args *args, struct jobspec *spec)
{
    char dir[PATH_MAX];

    if (!args->metrics_dir)
        return 0;
    if (!args->metrics_dir[0] || path_absolute(args->metrics_dir, dir, sizeof(dir)) < 0)
        return error_out(EXIT_FAILED, "--metrics-dir '%s': not a usable path", args->metrics_dir);
    if (!(spec->metrics_dir = strdup(dir)))
        return error_out(EXIT_FAILED, "out of memory");
    return 0;
}

/* The width of the terminal on gpurun's stdout, where --wait shows a Slurm job's output: its
 * ranks' COLUMNS (docs/design.md, section 4). 0 where stdout is no terminal. */
static int terminal_columns(void)
{
    struct winsize ws;

    return isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
}

/* --output-ranks, checked against the job's ranks, into the spec. */
static int set_output_ranks(const struct gpurun_args *args, struct jobspec *spec)
{
    struct errmsg err;

    if (!args->output_ranks)
        return 0;
    if (ranklist_check(args->output_ranks, spec->nnodes * spec->nprocs - 1, &err) < 0)
        return error_out(EXIT_FAILED, "--output-ranks: %s", err.text);
    if (!(spec->output_ranks = strdup(args->output_ranks)))
        return error_out(EXIT_FAILED, "out of memory");
    return 0;
}

/* The job's and the ranks' working directory into buf (n bytes): --chdir's, absolute (as
 * sbatch makes it), else gpurun's own. */
static int work_dir(const struct gpurun_args *args, char *buf, size_t n)
{
    struct stat st;
    int r;

    if (!args->chdir) {
        if (!getcwd(buf, n))
            return error_out(EXIT_FAILED, "cannot get the working directory: %s",
                             uv_strerror(-errno));
        return 0;
    }
    r = path_absolute(args->chdir, buf, n);
    if (r < 0)
        return error_out(EXIT_FAILED, "--chdir: '%s': %s", args->chdir, uv_strerror(r));
    /* The job dir is on a filesystem every node shares: so, as a rule, is the job's own. */
    if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode))
        return error_out(EXIT_FAILED, "--chdir: '%s' is not a directory", args->chdir);
    return 0;
}

/* --- a job here (--local) --------------------------------------------------------------------- */

/* A local job whose dir was given with --job-dir: a link to it from the jobs root, named by
 * its id, so that "gpurun status|logs|cancel ID" find it as they find any local job. Not
 * being able to link costs only that: said, not fatal. */
static void link_job_dir(const char *job_id, const char *abs_dir)
{
    char root[PATH_MAX], link[PATH_MAX], real[PATH_MAX];
    struct errmsg err;
    int r = jobdir_root(root, sizeof(root));

    if (r == 0 && !path_join(link, sizeof(link), root, job_id))
        r = -ENAMETOOLONG;
    /* Already there: a --job-dir that names the default place. */
    if (r == 0 && realpath(link, real) && !strcmp(real, abs_dir))
        return;
    if (r == 0 && jobdir_root_make(root, &err) < 0) {
        fprintf(stderr,
                "gpurun: cannot link the job's id to its dir in the jobs root: %s; give "
                "gpurun status|logs|cancel --job-dir '%s'\n",
                err.text, abs_dir);
        return;
    }
    if (r == 0 && symlink(abs_dir, link) < 0)
        r = -errno;
    if (r < 0)
        fprintf(stderr,
                "gpurun: cannot link the job's id to its dir in the jobs root: %s; give "
                "gpurun status|logs|cancel --job-dir '%s'\n",
                uv_strerror(r), abs_dir);
}

/* A local job's dir into dir (n bytes): --job-dir's as given, else ROOT/JOB_ID. Returns 0 or
 * an exit status with the error printed. */
static int local_dir(const struct gpurun_args *args, const char *job_id, char *dir, size_t n)
{
    char root[PATH_MAX];
    struct errmsg err;
    int ret;

    if (args->job_dir) {
        if (snprintf(dir, n, "%s", args->job_dir) >= (int)n)
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
        return 0;
    }
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    if (snprintf(dir, n, "%s/%s", root, job_id) >= (int)n)
        return error_out(EXIT_FAILED, "job dir '%s/%s': path too long", root, job_id);
    /* Here, so that a root that cannot be made is named by where it came from. */
    if (jobdir_root_make(root, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}

/* The job's spec, completed for a local job (job_id borrowed). Returns 0 or an exit status
 * with the error printed. */
static int local_spec(struct gpurun_args *args, const struct run_plan *p, const char *job_id)
{
    struct jobspec *spec = &args->spec;
    char cwd[PATH_MAX];
    int ret;

    spec->job_id = strdup(job_id);
    if (!spec->job_id || jobspec_set_argv(spec, p->argc, p->argv) < 0)
        return error_out(EXIT_FAILED, "out of memory");
    spec->loopback = true;
    ret = work_dir(args, cwd, sizeof(cwd));
    if (ret)
        return ret;
    if (!(spec->workdir = strdup(cwd)) || set_out_dir(p, spec) < 0)
        return error_out(EXIT_FAILED, "out of memory");
    ret = set_output_ranks(args, spec);
    return ret ? ret : set_metrics_dir(args, spec);
}

/* --gpu-bind=single hands local rank n the n-th GPU CUDA_VISIBLE_DEVICES lists (--export's,
 * else gpurun's own, which the local daemons inherit): with fewer listed than ranks per node,
 * a rank would get none, so the job is refused before anything starts. Unset or empty, rank
 * n gets device n, which this does not count. Returns 0 or an exit status with the error
 * printed. */
static int check_gpu_bind(const struct gpurun_args *args)
{
    const struct jobspec *spec = &args->spec;
    const char *list = getenv("CUDA_VISIBLE_DEVICES"), *from = "";
    static const char name[] = "CUDA_VISIBLE_DEVICES=";
    int gpus;

    if (spec->gpu_bind != GPU_BIND_SINGLE || args->no_gpus)
        return 0;
    for (char **e = spec->env; e && *e; e++) {
        if (!strncmp(*e, name, sizeof(name) - 1)) {
            list = *e + sizeof(name) - 1;
            from = " (from --export)";
        }
    }
    gpus = local_gpu_list_count(list);
    if (gpus == 0 || gpus >= spec->nprocs)
        return 0;
    return error_out(EXIT_FAILED,
                     "--gpu-bind single: %d ranks per node, but CUDA_VISIBLE_DEVICES%s lists %d "
                     "GPU%s ('%s'): local rank %d would get none; give --gpus-per-node %d or "
                     "list more GPUs",
                     spec->nprocs, from, gpus, gpus == 1 ? "" : "s", list, gpus, gpus);
}

/* What local.c's launcher is given besides the output: the job dir and rendezvousd (both
 * borrowed), the log level, the size and the time limit. */
static void local_job_fill(struct local_job *job, const struct gpurun_args *args,
                           const char *abs_dir, const char *daemon)
{
    const struct jobspec *spec = &args->spec;

    job->job_dir = abs_dir;
    job->world_size = spec->nnodes * spec->nprocs;
    job->daemon = daemon;
    job->log_level = args->log_level_name;
    job->nnodes = spec->nnodes + spec->spare_nodes;
    job->time_limit_s = args->time_limit_s;
    job->kill_grace_ms = spec->kill_grace_ms;
    /* The pre-timeout signal as on Slurm: --signal's lead, else 120 s (a quarter of a
     * shorter limit, so that a short job is not signalled at its start). */
    job->preempt_signal = spec->preempt_signal;
    job->preempt_before_s = args->signal.text                ? args->signal.time_s
                            : args->time_limit_s >= 4 * 120L ? 120
                                                             : args->time_limit_s / 4;
}

/* GPURUN_JOB_START_MS for the daemons, as the batch script sets it: the leader reads the time
 * limit from the job's start, not its own. */
static void set_job_start(void)
{
    struct timespec ts;
    char ms[32];

    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(ms, sizeof(ms), "%lld", (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    setenv("GPURUN_JOB_START_MS", ms, 1);
}

/* Whether the record in job_dir says the job was cancelled: its leader stopped by a signal
 * (gpurun cancel's SIGTERM, or a kill of it), which gpurun did not receive itself. */
static bool record_cancelled(const char *job_dir)
{
    struct errmsg err;
    json_t *summary = NULL;
    const char *outcome;
    bool cancelled;

    if (status_load_summary(job_dir, &summary, &err) < 0)
        return false;
    outcome = json_string_value(json_object_get(summary, "outcome"));
    cancelled = outcome && !strcmp(outcome, "cancelled");
    json_decref(summary);
    return cancelled;
}

/* One line for every end of a local job, as torchrun's users expect one. */
static void say_end(const struct gpurun_args *args, const struct run_plan *p, const char *job_id,
                    const char *abs_dir, int ret, int fatal_signal, long long ms)
{
    char sn[SIGNAME_LEN];

    if (fatal_signal) {
        fprintf(stderr, "gpurun: job '%s' cancelled (%s); logs in '%s/logs'\n", job_id,
                signame(fatal_signal, sn), abs_dir);
    } else if (ret != 0 && record_cancelled(abs_dir)) {
        /* gpurun cancel: the leader's SIGTERM, passed on as 128 + its number. */
        if (ret > 128 && ret < 128 + NSIG)
            fprintf(stderr, "gpurun: job '%s' cancelled (%s), exit status %d; logs in '%s/logs'\n",
                    job_id, signame(ret - 128, sn), ret, abs_dir);
        else
            fprintf(stderr, "gpurun: job '%s' cancelled, exit status %d; logs in '%s/logs'\n",
                    job_id, ret, abs_dir);
    } else if (ret != 0) {
        fprintf(stderr, "gpurun: job '%s' exited with status %d; logs in '%s/logs'\n", job_id, ret,
                abs_dir);
        python_hint(p, args, abs_dir);
    } else {
        char alone[1024];
        fprintf(stderr, "gpurun: job '%s' completed in %.1f s%s%s; logs in '%s/logs'\n", job_id,
                (double)ms / 1000, status_alone(abs_dir, alone, sizeof(alone)) ? ", but " : "",
                alone, abs_dir);
    }
}

static int run_local(struct gpurun_args *args, struct run_plan *p, int *fatal_signal)
{
    char daemon[PATH_MAX], job_id[128], dir[PATH_MAX], abs_dir[PATH_MAX];
    struct local_job job = {.out_fd = -1};
    long long t0;
    struct errmsg jerr;
    int ret;

    if (args->emit_sbatch)
        return error_out(EXIT_FAILED, "--emit-sbatch writes a Slurm batch script: drop --local");
    if (args_slurm_only_given(args))
        log_info("--%s and Slurm's other options are ignored with --local",
                 args_slurm_only_given(args));
    ret = check_gpu_bind(args);
    if (ret)
        return ret;
    if (find_program("rendezvousd", daemon, sizeof(daemon)) < 0)
        return error_out(EXIT_FAILED, "cannot find 'rendezvousd' beside gpurun or on PATH");
    if (jobdir_local_id(job_id, sizeof(job_id), time(NULL), (long)getpid()) < 0)
        return error_out(EXIT_FAILED, "cannot make a job id");
    ret = local_dir(args, job_id, dir, sizeof(dir));
    if (ret == 0)
        ret = local_spec(args, p, job_id);
    if (ret)
        return ret;

    /* Opened before the job dir exists, so that a bad path leaves nothing behind. O_APPEND
     * keeps the daemons' lines whole when they share the file. */
    if (args->output) {
        job.out_fd = open(args->output, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
        if (job.out_fd < 0)
            return error_out(EXIT_FAILED, "cannot open '%s': %s", args->output,
                             uv_strerror(-errno));
    }
    if (jobdir_create(dir, &args->spec, &jerr) < 0) {
        ret = error_out(EXIT_FAILED, "%s", jerr.text);
        goto out;
    }
    /* Ranks get the job dir in GPURUN_JOB_DIR and may change directory: make it absolute. */
    if (!realpath(dir, abs_dir)) {
        ret = error_out(EXIT_FAILED, "cannot resolve '%s': %s", dir, uv_strerror(-errno));
        goto out;
    }
    if (args->job_dir)
        link_job_dir(job_id, abs_dir);
    /* Before any rank speaks, so that another shell can follow the job at once. */
    fprintf(stderr, "gpurun: job %s, job dir %s\n", job_id, abs_dir);
    if (p->spare_note[0])
        fprintf(stderr, "gpurun: %s\n", p->spare_note);
    local_job_fill(&job, args, abs_dir, daemon);
    job.job_id = job_id;
    set_job_start();
    t0 = monotime_ms();
    ret = local_run(&job, fatal_signal);
    free(args->ran_dir);
    args->ran_dir = strdup(abs_dir);
    say_end(args, p, job_id, abs_dir, ret, *fatal_signal, monotime_ms() - t0);
out:
    if (job.out_fd >= 0)
        close(job.out_fd);
    return ret;
}

/* --- a job on Slurm --------------------------------------------------------------------------- */

/* job.json's text for spec (job_id empty: the script fills it in), through jobspec_save so
 * that the daemons read what the one writer of job.json writes. */
static int spec_text(const struct jobspec *spec, char **text)
{
    char tmpl[PATH_MAX], path[PATH_MAX + 16];
    const char *tmp = getenv("TMPDIR");
    size_t len;
    int ret;

    snprintf(tmpl, sizeof(tmpl), "%s/gpurun-spec.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpl))
        return -errno;
    snprintf(path, sizeof(path), "%s/job.json", tmpl);
    ret = jobspec_save(spec, path);
    if (ret == 0)
        ret = fs_read_all(path, 4 * 1024 * 1024, text, &len);
    unlink(path);
    rmdir(tmpl);
    return ret;
}

/* sbatch's options that gpurun passes on as they are: into job, with the checks that need
 * more than one option or libslurm. */
static int sbatch_options(const struct gpurun_args *args, struct sbatch_job *job)
{
    struct errmsg serr;

    if (args->mem_per == SLURMOPT_MEM_GPU && args->no_gpus)
        return error_out(EXIT_FAILED, "--mem-per-gpu: the job asks for no GPUs (--no-gpus): give "
                                      "--mem or --mem-per-cpu");
    if (args->comment && strlen(args->comment) > SBATCH_COMMENT_LEN_MAX)
        return error_out(EXIT_FAILED, "--comment: longer than %d bytes", SBATCH_COMMENT_LEN_MAX);
    if (args->begin && slurmlib_parse_begin(args->begin, &job->begin_time, &serr) < 0)
        return error_out(EXIT_FAILED, "%s", serr.text);
    job->begin = args->begin;
    job->qos = args->qos;
    job->mem_per = args->mem_per;
    job->mem_mb = args->mem_mb;
    job->exclusive = (enum slurmopt_exclusive)args->exclusive;
    job->constraint = args->constraint;
    job->dependency = args->dependency;
    job->nodelist = args->nodelist;
    job->exclude = args->exclude;
    job->reservation = args->reservation;
    job->gres = args->gres;
    job->hold = args->hold;
    if (args->no_requeue && (args->requeue || args->max_requeues > 0))
        return error_out(EXIT_FAILED, "--no-requeue: the job also asks to be requeued (%s)",
                         args->requeue ? "--requeue" : "--max-requeues");
    job->requeue = args->requeue || args->max_requeues > 0;
    job->max_requeues = args->max_requeues;
    job->comment = args->comment;
    job->mail_type = args->mail_type;
    job->mail_type_text = args->mail_type_text;
    job->mail_user = args->mail_user;
    return 0;
}

/* -w names nodes the job must have: as in sbatch, their number is the job's node count when
 * neither -N (nor SBATCH_... nor a train.cfg) gives one, and may not pass the count given. */
static int nodelist_nodes(struct gpurun_args *args, const struct run_plan *p)
{
    char **names = NULL;
    int n = 0, r;

    if (!args->nodelist)
        return 0;
    r = slurmlib_hostlist_expand(args->nodelist, &names, &n);
    slurmlib_names_free(names);
    if (r == -ENOSYS) /* no libslurm: slurmctld will say, if it is ever asked */
        return 0;
    if (r < 0 || n == 0)
        return error_out(EXIT_FAILED, "--nodelist: '%s' is not a list of nodes (node[1-2],gpu7)",
                         args->nodelist);
    /* The allocation is the job's nodes and its spares. */
    if (!args_given(args, "nodes") && !p->have_cfg && n > args->spec.spare_nodes) {
        args->spec.nnodes = n - args->spec.spare_nodes;
        return 0;
    }
    if (n > args->spec.nnodes + args->spec.spare_nodes)
        return error_out(EXIT_FAILED, "--nodelist: '%s' names %d nodes, more than the job's %d%s",
                         args->nodelist, n, args->spec.nnodes + args->spec.spare_nodes,
                         args->spec.spare_nodes ? " (with its spares)" : "");
    return 0;
}

/* The CPUs each rank asks Slurm for: --cpus-per-gpu (or SBATCH_CPUS_PER_GPU) when given;
 * else the partition's share per GPU, its nodes' CPUs over their GPUs (the least), so that
 * data loaders and OMP_NUM_THREADS get what a rank's GPU comes with rather than sbatch's one
 * CPU; else, with Slurm out of reach, 1. */
static int cpus_per_rank(const struct gpurun_args *args)
{
    struct errmsg err;
    char conf[PATH_MAX];
    int cpus;

    if (args_given(args, "cpus-per-gpu") || slurmlib_conf_path(conf, sizeof(conf)) < 0 ||
        slurmlib_open(OPEN_SLURM_TIMEOUT_S, &err) < 0 ||
        slurmlib_cpus_per_rank(args->partition, args->spec.nprocs, !args->no_gpus, &cpus, &err) < 0)
        return args->cpus_per_gpu;
    return cpus;
}

/* Where a Slurm job's parts are, all absolute: what its batch script is written with. */
struct batch_paths {
    char cwd[PATH_MAX];     /* the job's and the ranks' working directory */
    char root[PATH_MAX];    /* the jobs root */
    char job_dir[PATH_MAX]; /* --job-dir's; unset without it */
    char output[PATH_MAX];  /* the batch output: -o's, else ROOT/%j.out */
    char daemon[PATH_MAX];  /* rendezvousd */
};

/* Slurm counts whole minutes: the daemons must know the limit Slurm will enforce. */
static void whole_minutes(struct gpurun_args *args)
{
    long min;

    if (args->time_limit_s % 60 == 0)
        return;
    min = sbatch_time_minutes(args->time_limit_s);
    if (!args->emit_sbatch)
        fprintf(stderr, "gpurun: -t %lds: Slurm counts whole minutes; the limit is %ld:00\n",
                args->time_limit_s, min);
    args->time_limit_s = min * 60;
    args->spec.time_limit_s = (int)args->time_limit_s;
}

/* The paths at->cwd and at->root lead to: --job-dir's, the batch output's, rendezvousd's.
 * Returns 0 or an exit status with the error printed. */
static int find_batch_paths(const struct gpurun_args *args, struct batch_paths *at)
{
    const char *o = args->output;

    if (args->job_dir && path_absolute(args->job_dir, at->job_dir, sizeof(at->job_dir)) < 0)
        return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
    /* A relative -o is relative to the job's working directory, as sbatch makes it. */
    if (o ? snprintf(at->output, sizeof(at->output), "%s%s%s", o[0] == '/' ? "" : at->cwd,
                     o[0] == '/' ? "" : "/", o) >= (int)sizeof(at->output)
          : snprintf(at->output, sizeof(at->output), "%s/%%j.out", at->root) >=
                (int)sizeof(at->output))
        return error_out(EXIT_FAILED, "output '%s': path too long", args->output);
    if (find_program("rendezvousd", at->daemon, sizeof(at->daemon)) < 0)
        return error_out(EXIT_FAILED, "cannot find 'rendezvousd' beside gpurun or on PATH");
    return 0;
}

/* The job's spec, completed for Slurm, as job.json's text into *json (new: free it). Returns
 * 0 or an exit status with the error printed. */
static int batch_spec(struct gpurun_args *args, const struct run_plan *p, const char *cwd,
                      char **json)
{
    struct jobspec *spec = &args->spec;
    int r;

    if (jobspec_set_argv(spec, p->argc, p->argv) < 0 || !(spec->workdir = strdup(cwd)) ||
        set_out_dir(p, spec) < 0)
        return error_out(EXIT_FAILED, "out of memory");
    r = set_metrics_dir(args, spec);
    r = r ? r : set_output_ranks(args, spec);
    if (r)
        return r;
    spec->loopback = false;
    /* Pre-flight: each node shows the GPUs the job asks Slurm for (none with --no-gpus);
     * --local asks none of the machine. */
    spec->gpus_per_node = args->no_gpus ? 0 : spec->nprocs;
    spec->term_cols = args->wait && !args->emit_sbatch ? terminal_columns() : 0;
    r = spec_text(spec, json);
    if (r < 0)
        return error_out(EXIT_FAILED, "cannot write the job spec: %s",
                         r == -EINVAL ? "a string is not UTF-8" : uv_strerror(r));
    return 0;
}

/* What the batch script is written from, besides sbatch_options(): the job's size, time,
 * signals, paths (at, borrowed) and spec (json, borrowed). */
static void batch_job_fill(struct sbatch_job *job, const struct gpurun_args *args,
                           const struct run_plan *p, const struct batch_paths *at, const char *json)
{
    const struct jobspec *spec = &args->spec;

    job->job_name = args->job_name;
    job->nodes = spec->nnodes + spec->spare_nodes; /* the spares are nodes of the allocation */
    job->no_kill = spec->spare_nodes > 0;
    job->ranks_per_node = spec->nprocs;
    job->container_image = spec->container_image;
    job->container_runtime = spec->container_runtime;
    job->gpus_per_node = args->no_gpus ? 0 : spec->nprocs;
    job->gpu_type = job->gpus_per_node && args->gpu_type[0] ? args->gpu_type : NULL;
    job->cpus_per_task = cpus_per_rank(args) * spec->nprocs;
    /* -t 0 (or UNLIMITED) asks Slurm for no limit, as sbatch's --time=0 does; no -t leaves
     * the partition's. */
    job->time_limit_min = args_given(args, "time") && args->time_limit_s == 0
                              ? SBATCH_TIME_UNLIMITED
                              : sbatch_time_minutes(args->time_limit_s);
    job->signal_before_s = sbatch_signal_before(job->time_limit_min);
    job->preempt_signal = spec->preempt_signal;
    if (args->signal.text) {
        job->signal_text = args->signal.text;
        job->signal_time_s = args->signal.time_s;
        job->signal_batch_only = args->signal.batch_only;
        job->signal_reservation = args->signal.reservation;
    }
    job->partition = args->partition;
    job->account = args->account;
    job->output = at->output;
    job->work_dir = at->cwd;
    job->rendezvousd = at->daemon;
    job->jobs_root = at->root;
    job->job_dir = args->job_dir ? at->job_dir : NULL;
    job->log_level = args->log_level_name;
    job->spec_json = json;
    job->argv = p->argv;
}

/* The batch script of job (borrowed) into *script (new: free it); the jobs root (borrowed)
 * is made when the batch output goes there. Returns 0 or an exit status with the error
 * printed. */
static int batch_script(const struct gpurun_args *args, const struct sbatch_job *job,
                        const char *root, char **script)
{
    struct errmsg berr;

    if (job->cpus_per_task > 65535)
        return error_out(EXIT_FAILED, "--cpus-per-gpu: %d CPUs per node is more than Slurm takes",
                         job->cpus_per_task);
    if (sbatch_render(job, script, &berr) < 0)
        return error_out(EXIT_FAILED, "%s", berr.text);
    /* Slurm opens the batch output before the script runs: its directory must exist. */
    if (!args->output && jobdir_root_make(root, &berr) < 0)
        return error_out(EXIT_FAILED, "%s", berr.text);
    return 0;
}

/* --wait: follows Slurm job id to its end (follow.c). Returns its exit status. */
static int batch_wait(struct gpurun_args *args, const struct run_plan *p, uint32_t id,
                      const struct batch_paths *at, int *fatal_signal)
{
    char num[16], dir[PATH_MAX];
    int ret;

    snprintf(num, sizeof(num), "%u", id);
    if (args->job_dir)
        snprintf(dir, sizeof(dir), "%s", at->job_dir);
    else if (!path_join(dir, sizeof(dir), at->root, num))
        dir[0] = '\0';
    ret = follow_job(id, dir[0] ? dir : NULL, fatal_signal);
    free(args->ran_dir);
    args->ran_dir = dir[0] ? strdup(dir) : NULL;
    if (ret != 0 && !*fatal_signal)
        python_hint(p, args, dir[0] ? dir : NULL);
    return ret;
}

static int run_slurm(struct gpurun_args *args, struct run_plan *p, int *fatal_signal)
{
    struct batch_paths at;
    struct sbatch_job job = {0};
    struct errmsg serr;
    char *json = NULL, *script = NULL;
    uint32_t id;
    int ret;

    ret = work_dir(args, at.cwd, sizeof(at.cwd));
    if (ret == 0)
        ret = jobs_root(at.root, sizeof(at.root));
    if (ret == 0)
        ret = sbatch_options(args, &job);
    if (ret == 0)
        ret = nodelist_nodes(args, p);
    if (ret)
        return ret;
    whole_minutes(args);
    ret = find_batch_paths(args, &at);
    if (ret == 0)
        ret = batch_spec(args, p, at.cwd, &json);
    if (ret)
        return ret;
    batch_job_fill(&job, args, p, &at, json);
    ret = batch_script(args, &job, at.root, &script);
    if (ret)
        goto out;
    if (args->emit_sbatch) {
        fputs(script, stdout);
        ret = 0;
        goto out;
    }
    ret = open_slurm();
    if (ret)
        goto out;
    if (slurmlib_check(&job, script, &serr) < 0 || slurmlib_submit(&job, script, &id, &serr) < 0) {
        ret = error_out(EXIT_FAILED, "%s; nothing submitted", serr.text);
        goto out;
    }
    printf("Submitted job %u\n", id);
    if (p->spare_note[0])
        fprintf(stderr, "gpurun: %s\n", p->spare_note);
    fflush(stdout);
    if (args->wait)
        ret = batch_wait(args, p, id, &at, fatal_signal);
out:
    slurmlib_close();
    free(script);
    free(json);
    return ret;
}

int cmd_run(struct gpurun_args *args, int *fatal_signal)
{
    extern char **environ;
    struct errmsg err;
    struct run_plan plan;
    int ret;

    /* sbatch's variables are for Slurm jobs, as sbatch reads them; before the train.cfg,
     * which they beat. */
    if (!args->local && args_apply_env(args, environ, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    memset(&plan, 0, sizeof(plan));
    ret = plan_run(args, &plan);
    if (ret == 0)
        ret = plan_spec(args, &plan);
    if (ret == 0)
        ret = args->local ? run_local(args, &plan, fatal_signal)
                          : run_slurm(args, &plan, fatal_signal);
    plan_release(&plan);
    return ret;
}

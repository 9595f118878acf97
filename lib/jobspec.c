/* job.json: read and written through jansson, every integer key a table row with its
 * default and range, so a new setting is a new row. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "container.h"
#include "errmsg.h"
#include "fsutil.h"
#include "jobspec.h"
#include "ranklist.h"
#include "banned.h"

/* job.json is small; anything larger is not ours. */
#define JOBSPEC_FILE_MAX (4 * 1024 * 1024)

struct int_key {
    const char *name;
    size_t offset;
    int def, min, max;
};

/* Defaults: a heartbeat a second and 10 s of silence before a node counts as lost tolerate
 * a loaded login node; kill_grace gives a rank time to checkpoint on SIGTERM. The
 * pre-timeout signal is SIGUSR1 (10 on Linux), as gpurun's batch script asks Slurm for. */
static const struct int_key int_keys[] = {
    {"nnodes", offsetof(struct jobspec, nnodes), 1, 1, 65536},
    {"spare_nodes", offsetof(struct jobspec, spare_nodes), 0, 0, 65536},
    {"nprocs", offsetof(struct jobspec, nprocs), 1, 1, 1024},
    {"join_timeout_ms", offsetof(struct jobspec, join_timeout_ms), 300000, 10, 86400000},
    {"hb_interval_ms", offsetof(struct jobspec, hb_interval_ms), 1000, 10, 600000},
    {"hb_timeout_ms", offsetof(struct jobspec, hb_timeout_ms), 10000, 20, 3600000},
    {"hang_timeout_ms", offsetof(struct jobspec, hang_timeout_ms), 0, 0, 86400000},
    {"hang_watch", offsetof(struct jobspec, hang_watch), HANG_WATCH_REPORT, HANG_WATCH_REPORT,
     HANG_WATCH_OUTPUT},
    {"term_cols", offsetof(struct jobspec, term_cols), 0, 0, 65535},
    {"restart_on", offsetof(struct jobspec, restart_on), RESTART_ON_DEFAULT, 0, RESTART_ON_ALL},
    {"preflight", offsetof(struct jobspec, preflight), 1, 0, 1},
    {"preflight_only", offsetof(struct jobspec, preflight_only), 0, 0, 1},
    {"gpus_per_node", offsetof(struct jobspec, gpus_per_node), 0, 0, 1024},
    {"min_free_mb", offsetof(struct jobspec, min_free_mb), 64, 0, 1 << 30},
    {"min_gpu_free_pct", offsetof(struct jobspec, min_gpu_free_pct), 90, 0, 100},
    {"mem_ckpt_max_mb", offsetof(struct jobspec, mem_ckpt_max_mb), 0, 0, 1 << 30},
    {"straggler_pct", offsetof(struct jobspec, straggler_pct), 20, 0, 10000},
    {"straggler_action", offsetof(struct jobspec, straggler_action), STRAGGLER_REPORT,
     STRAGGLER_REPORT, STRAGGLER_REPLACE},
    {"kill_grace_ms", offsetof(struct jobspec, kill_grace_ms), 5000, 0, 600000},
    {"max_restarts", offsetof(struct jobspec, max_restarts), 0, 0, 1000},
    {"gpu_bind", offsetof(struct jobspec, gpu_bind), GPU_BIND_NONE, GPU_BIND_NONE, GPU_BIND_SINGLE},
    {"preempt_signal", offsetof(struct jobspec, preempt_signal), 10, 1, 64},
    {"preempt_all", offsetof(struct jobspec, preempt_all), 0, 0, 1},
    {"time_limit_s", offsetof(struct jobspec, time_limit_s), 0, 0, 366 * 86400},
    {"local_rank_arg", offsetof(struct jobspec, local_rank_arg), LOCAL_RANK_ARG_NONE,
     LOCAL_RANK_ARG_NONE, LOCAL_RANK_ARG_DASH},
    {"local_rank_at", offsetof(struct jobspec, local_rank_at), 1, 0, 1 << 20},
    {"mpi_env", offsetof(struct jobspec, mpi_env), 0, 0, 1},
    {"require_rendezvous", offsetof(struct jobspec, require_rendezvous), 0, 0, 1},
    {"horovod", offsetof(struct jobspec, horovod), 0, 0, 1},
};
#define N_INT_KEYS (sizeof(int_keys) / sizeof(int_keys[0]))

/* The string keys: each optional in the file (job_id is checked after loading), each written
 * when set. */
static const struct str_key {
    const char *name;
    size_t offset;
} str_keys[] = {
    {"job_id", offsetof(struct jobspec, job_id)},
    {"workdir", offsetof(struct jobspec, workdir)},
    {"name", offsetof(struct jobspec, name)},
    {"metrics_dir", offsetof(struct jobspec, metrics_dir)},
    {"out_dir", offsetof(struct jobspec, out_dir)},
    {"output_ranks", offsetof(struct jobspec, output_ranks)},
    {"container_image", offsetof(struct jobspec, container_image)},
    {"container_mounts", offsetof(struct jobspec, container_mounts)},
    {"container_workdir", offsetof(struct jobspec, container_workdir)},
    {"container_env", offsetof(struct jobspec, container_env)},
    {"container_runtime", offsetof(struct jobspec, container_runtime)},
};
#define N_STR_KEYS (sizeof(str_keys) / sizeof(str_keys[0]))

static char **str_field(struct jobspec *spec, const struct str_key *k)
{
    return (char **)((char *)spec + k->offset);
}

static int *int_field(struct jobspec *spec, const struct int_key *k)
{
    return (int *)((char *)spec + k->offset);
}

const char *failure_class_name(int c)
{
    static const char *const names[FAILURE_CLASS_COUNT] = {
        [FAILURE_USER_ERROR] = "user-error",
        [FAILURE_NODE] = "node",
        [FAILURE_HANG] = "hang",
        [FAILURE_OOM] = "oom",
        [FAILURE_SIGNAL] = "signal",
    };
    return c >= 0 && c < FAILURE_CLASS_COUNT ? names[c] : "?";
}

const char *local_rank_arg_name(int a)
{
    return a == LOCAL_RANK_ARG_UNDERSCORE ? "--local_rank"
           : a == LOCAL_RANK_ARG_DASH     ? "--local-rank"
                                          : NULL;
}

bool jobspec_spare_restarts(struct jobspec *spec, bool restarts_given, bool restart_on_given,
                            char *note, size_t n)
{
    int k = spec->spare_nodes;
    const char *s = k > 1 ? "s" : "";

    if (n)
        note[0] = '\0';
    if (k <= 0)
        return false;
    if (restarts_given && spec->max_restarts == 0) {
        snprintf(note, n,
                 "--spare-nodes %d with --max-restarts 0: the spare%s will stay idle (a spare "
                 "takes a failed node's place at a restart)",
                 k, s);
        return false;
    }
    if (!(spec->restart_on & RESTART_ON_SPARES)) {
        snprintf(note, n,
                 "--spare-nodes %d: --restart-on names neither node nor hang, the failures a "
                 "spare takes the place of: the spare%s will stay idle",
                 k, s);
        return false;
    }
    if (restarts_given)
        return false;
    spec->max_restarts = k;
    if (!restart_on_given)
        spec->restart_on = RESTART_ON_SPARES;
    snprintf(note, n,
             "--spare-nodes %d: up to %d restart%s after %s, for a spare to take the failed "
             "node's place (--max-restarts sets another number)",
             k, k, s, restart_on_given ? "a failure --restart-on names" : "a node or hang failure");
    return true;
}

void jobspec_init(struct jobspec *spec)
{
    memset(spec, 0, sizeof(*spec));
    for (size_t i = 0; i < N_INT_KEYS; i++)
        *int_field(spec, &int_keys[i]) = int_keys[i].def;
}

static void free_strv(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

void jobspec_release(struct jobspec *spec)
{
    for (size_t i = 0; i < N_STR_KEYS; i++)
        free(*str_field(spec, &str_keys[i]));
    free_strv(spec->argv);
    free_strv(spec->env);
    jobspec_init(spec);
}

static int strv_append(char ***v, const char *s)
{
    size_t n = 0;
    char **nv;

    while (*v && (*v)[n])
        n++;
    nv = realloc(*v, (n + 2) * sizeof(*nv));
    if (!nv)
        return -ENOMEM;
    *v = nv;
    nv[n] = strdup(s);
    nv[n + 1] = NULL;
    return nv[n] ? 0 : -ENOMEM;
}

int jobspec_set_argv(struct jobspec *spec, int argc, char *const *argv)
{
    free_strv(spec->argv);
    spec->argv = NULL;
    for (int i = 0; i < argc; i++)
        if (strv_append(&spec->argv, argv[i]) < 0)
            return -ENOMEM;
    return 0;
}

int jobspec_add_env(struct jobspec *spec, const char *kv)
{
    if (!strchr(kv, '=') || kv[0] == '=')
        return -EINVAL;
    return strv_append(&spec->env, kv);
}

static int load_strv(json_t *arr, char ***out)
{
    size_t i;
    json_t *v;

    json_array_foreach(arr, i, v)
    {
        if (!json_is_string(v))
            return -EINVAL;
        if (strv_append(out, json_string_value(v)) < 0)
            return -ENOMEM;
    }
    return 0;
}

static const struct int_key *find_int_key(const char *name)
{
    for (size_t i = 0; i < N_INT_KEYS; i++)
        if (!strcmp(int_keys[i].name, name))
            return &int_keys[i];
    return NULL;
}

static const struct str_key *find_str_key(const char *name)
{
    for (size_t i = 0; i < N_STR_KEYS; i++)
        if (!strcmp(str_keys[i].name, name))
            return &str_keys[i];
    return NULL;
}

int jobspec_load(struct jobspec *spec, const char *path, struct errmsg *err)
{
    json_error_t je;
    json_t *root = NULL, *v;
    const char *name;
    char *text = NULL;
    struct errmsg rerr;
    size_t len;
    int ret = -1;

    ret = fs_read_all(path, JOBSPEC_FILE_MAX, &text, &len);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot read '%s': %s", path, strerror(-ret));
        goto out;
    }
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        ret = errmsg_set(err, -EINVAL, "%s:%d: %s", path, je.line, je.text);
        goto out;
    }
    if (!json_is_object(root)) {
        ret = errmsg_set(err, -EINVAL, "%s: not a JSON object", path);
        goto out;
    }
    json_object_foreach(root, name, v)
    {
        const struct int_key *k = find_int_key(name);
        const struct str_key *sk = find_str_key(name);
        if (k) {
            json_int_t x;
            if (!json_is_integer(v)) {
                ret = errmsg_set(err, -EINVAL, "%s: '%s' must be an integer", path, name);
                goto out;
            }
            x = json_integer_value(v);
            if (x < k->min || x > k->max) {
                ret = errmsg_set(err, -EINVAL, "%s: '%s' must be %d..%d, not %lld", path, name,
                                 k->min, k->max, (long long)x);
                goto out;
            }
            *int_field(spec, k) = (int)x;
        } else if (!strcmp(name, "version")) {
            if (!json_is_integer(v) || json_integer_value(v) != 1) {
                ret = errmsg_set(err, -EINVAL,
                                 "%s: unsupported 'version' (this gpurun reads version 1)", path);
                goto out;
            }
        } else if (sk) {
            char **dst = str_field(spec, sk);
            if (!json_is_string(v)) {
                ret = errmsg_set(err, -EINVAL, "%s: '%s' must be a string", path, name);
                goto out;
            }
            free(*dst);
            *dst = strdup(json_string_value(v));
            if (!*dst) {
                ret = -ENOMEM;
                goto out;
            }
        } else if (!strcmp(name, "argv") || !strcmp(name, "env")) {
            char ***dst = name[0] == 'a' ? &spec->argv : &spec->env;
            free_strv(*dst);
            *dst = NULL;
            if (!json_is_array(v) || load_strv(v, dst) < 0) {
                ret = errmsg_set(err, -EINVAL, "%s: '%s' must be an array of strings", path, name);
                goto out;
            }
        } else if (!strcmp(name, "loopback")) {
            if (!json_is_boolean(v)) {
                ret = errmsg_set(err, -EINVAL, "%s: 'loopback' must be true or false", path);
                goto out;
            }
            spec->loopback = json_is_true(v);
        } else {
            {
                ret = errmsg_set(err, -EINVAL, "%s: unknown key '%s'", path, name);
                goto out;
            }
        }
    }
    if (!spec->job_id) {
        ret = errmsg_set(err, -EINVAL, "%s: 'job_id' is missing", path);
        goto out;
    }
    if (!spec->argv || !spec->argv[0]) {
        ret = errmsg_set(err, -EINVAL, "%s: 'argv' must name a command", path);
        goto out;
    }
    for (char **e = spec->env; e && *e; e++)
        if (!strchr(*e, '=') || (*e)[0] == '=') {
            ret = errmsg_set(err, -EINVAL, "%s: 'env' entry '%s' is not NAME=VALUE", path, *e);
            goto out;
        }
    if (spec->output_ranks &&
        ranklist_check(spec->output_ranks, spec->nnodes * spec->nprocs - 1, &rerr) < 0) {
        ret = errmsg_set(err, -EINVAL, "%s: 'output_ranks': %s", path, rerr.text);
        goto out;
    }
    if (spec->container_runtime && container_runtime_parse(spec->container_runtime) < 0) {
        ret = errmsg_set(err, -EINVAL, "%s: 'container_runtime': no runtime '%s'", path,
                         spec->container_runtime);
        goto out;
    }
    if (spec->container_mounts && container_mounts_check(spec->container_mounts, &rerr) < 0) {
        ret = errmsg_set(err, -EINVAL, "%s: 'container_mounts': %s", path, rerr.text);
        goto out;
    }
    if (spec->container_env && container_env_check(spec->container_env, &rerr) < 0) {
        ret = errmsg_set(err, -EINVAL, "%s: 'container_env': %s", path, rerr.text);
        goto out;
    }
    if (!spec->container_image && (spec->container_mounts || spec->container_workdir ||
                                   spec->container_env || spec->container_runtime)) {
        ret = errmsg_set(err, -EINVAL, "%s: container options without 'container_image'", path);
        goto out;
    }
    ret = 0;
out:
    json_decref(root);
    free(text);
    return ret;
}

/* A JSON array of v's strings, or NULL when one cannot be a JSON string (not UTF-8) or
 * memory runs out: an argument dropped on the way would run another command. */
static json_t *strv_json(char **v)
{
    json_t *arr = json_array();
    for (char **p = v; arr && p && *p; p++) {
        if (json_array_append_new(arr, json_string(*p)) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    return arr;
}

int jobspec_save(const struct jobspec *spec, const char *path)
{
    json_t *root;
    char *text = NULL;
    /* Building the JSON fails for text that is not UTF-8 far more often than for memory. */
    int ret = -EINVAL;

    root = json_pack("{s:i, s:s, s:o, s:o, s:b}", "version", 1, "job_id",
                     spec->job_id ? spec->job_id : "", "argv", strv_json(spec->argv), "env",
                     strv_json(spec->env), "loopback", spec->loopback);
    if (!root)
        goto out;
    for (size_t i = 0; i < N_INT_KEYS; i++)
        json_object_set_new(root, int_keys[i].name,
                            json_integer(*int_field((struct jobspec *)spec, &int_keys[i])));
    /* job_id is always written (the batch script fills in an empty one); the others when
     * set. */
    for (size_t i = 0; i < N_STR_KEYS; i++) {
        const char *v = *str_field((struct jobspec *)spec, &str_keys[i]);
        if (str_keys[i].offset == offsetof(struct jobspec, job_id))
            continue;
        if (v && json_object_set_new(root, str_keys[i].name, json_string(v)) < 0)
            goto out;
    }
    text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) {
        ret = -ENOMEM;
        goto out;
    }
    ret = fs_write_atomic(path, text, strlen(text), 0600);
out:
    free(text);
    json_decref(root);
    return ret;
}

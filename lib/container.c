/* Ranks in containers (container.h). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "banned.h"

static const char *const names[] = {
    [CONTAINER_AUTO] = "auto",     [CONTAINER_PODMAN] = "podman",
    [CONTAINER_DOCKER] = "docker", [CONTAINER_APPTAINER] = "apptainer",
    [CONTAINER_ENROOT] = "enroot", [CONTAINER_PYXIS] = "pyxis",
};
#define N_RUNTIMES ((int)(sizeof(names) / sizeof(names[0])))

int container_runtime_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "singularity"))
        return CONTAINER_APPTAINER;
    for (int i = 0; i < N_RUNTIMES; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

const char *container_runtime_name(int rt)
{
    return rt >= 0 && rt < N_RUNTIMES ? names[rt] : "?";
}

const char *container_runtime_program(int rt)
{
    switch (rt) {
    case CONTAINER_PODMAN:
        return "podman";
    case CONTAINER_DOCKER:
        return "docker";
    case CONTAINER_APPTAINER:
        return "apptainer";
    case CONTAINER_ENROOT:
    case CONTAINER_PYXIS:
        return "enroot";
    default:
        return NULL;
    }
}

int container_runtime_pick(int named, bool have_pyxis, bool (*found)(const char *, void *),
                           void *ctx)
{
    static const struct {
        const char *program;
        int runtime;
    } order[] = {
        {"podman", CONTAINER_PODMAN},       {"docker", CONTAINER_DOCKER},
        {"apptainer", CONTAINER_APPTAINER}, {"singularity", CONTAINER_APPTAINER},
        {"enroot", CONTAINER_ENROOT},
    };

    if (named != CONTAINER_AUTO)
        return named;
    if (have_pyxis)
        return CONTAINER_PYXIS;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if (found && found(order[i].program, ctx))
            return order[i].runtime;
    return CONTAINER_AUTO;
}

/* The next comma-separated item of *s into item (n bytes): its length, or -1 at the end. */
static int next_item(const char **s, char *item, size_t n)
{
    size_t len;

    if (!*s || !**s)
        return -1;
    len = strcspn(*s, ",");
    snprintf(item, n, "%.*s", (int)len, *s);
    *s += len + ((*s)[len] == ',');
    return (int)len;
}

int container_mounts_check(const char *mounts, struct errmsg *err)
{
    char item[4096];
    const char *s = mounts;
    int len;

    if (!mounts || !*mounts)
        return errmsg_set(err, -EINVAL, "no mount given (SRC:DST[:ro|:rw], comma-separated)");
    while ((len = next_item(&s, item, sizeof(item))) >= 0) {
        char *dst = strchr(item, ':'), *flags;

        if (len == 0 || (size_t)len >= sizeof(item))
            return errmsg_set(err, -EINVAL, "'%s': an empty or overlong item", mounts);
        if (!dst)
            return errmsg_set(err, -EINVAL, "'%s': SRC:DST expected", item);
        *dst++ = '\0';
        flags = strchr(dst, ':');
        if (flags)
            *flags++ = '\0';
        if (item[0] != '/')
            return errmsg_set(err, -EINVAL, "'%s:%s': the source must be an absolute path", item,
                              dst);
        if (dst[0] != '/')
            return errmsg_set(err, -EINVAL, "'%s:%s': the destination must be an absolute path",
                              item, dst);
        if (flags && strcmp(flags, "ro") && strcmp(flags, "rw"))
            return errmsg_set(err, -EINVAL, "'%s:%s:%s': the flag must be ro or rw", item, dst,
                              flags);
    }
    return 0;
}

int container_env_check(const char *names_list, struct errmsg *err)
{
    char item[256];
    const char *s = names_list;
    int len;

    if (!names_list || !*names_list)
        return errmsg_set(err, -EINVAL, "no variable named (NAME[,NAME...])");
    while ((len = next_item(&s, item, sizeof(item))) >= 0) {
        bool ok = len > 0 && (size_t)len < sizeof(item) && !isdigit((unsigned char)item[0]);

        for (int i = 0; ok && i < len; i++)
            ok = isalnum((unsigned char)item[i]) || item[i] == '_';
        if (!ok)
            return errmsg_set(err, -EINVAL, "'%s' is not a variable's name", item);
    }
    return 0;
}

/* A growing argv whose strings it owns; a failed allocation makes it NULL at the end. */
struct words {
    char **v;
    size_t n, cap;
    bool oom;
};

static void add(struct words *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(struct words *w, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;

    if (w->oom)
        return;
    if (w->n + 2 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 32;
        char **v = realloc(w->v, cap * sizeof(*v));
        if (!v) {
            w->oom = true;
            return;
        }
        w->v = v;
        w->cap = cap;
    }
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (!s) {
        w->oom = true;
        return;
    }
    w->v[w->n++] = s;
    w->v[w->n] = NULL;
}

static char **done(struct words *w)
{
    if (!w->oom && w->v)
        return w->v;
    for (size_t i = 0; i < w->n; i++)
        free(w->v[i]);
    free(w->v);
    return NULL;
}

void container_argv_free(char **argv)
{
    for (char **p = argv; p && *p; p++)
        free(*p);
    free(argv);
}

/* The binds, then the user's mounts, each as flag then "SRC:DST[:ro]"; without keep_rw an
 * item's ":rw" is dropped (enroot's --mount knows only ro). */
static void add_mounts(struct words *w, const struct container_run *c, const char *flag,
                       bool keep_rw)
{
    char item[4096];
    const char *s = c->mounts;

    for (const char *const *b = c->binds; b && *b; b++) {
        add(w, "%s", flag);
        add(w, "%s:%s", *b, *b);
    }
    while (next_item(&s, item, sizeof(item)) >= 0) {
        size_t len = strlen(item);
        if (!keep_rw && len > 3 && !strcmp(item + len - 3, ":rw"))
            item[len - 3] = '\0';
        add(w, "%s", flag);
        add(w, "%s", item);
    }
}

char **container_argv(const struct container_run *c)
{
    struct words w = {0};

    switch (c->runtime) {
    case CONTAINER_PODMAN:
    case CONTAINER_DOCKER:
        if (c->runtime == CONTAINER_PODMAN) {
            add(&w, "podman");
            /* cgroupfs: --cgroup-parent is a path, so that conmon and the container are made
             * inside the rank's cgroup, which ends them with the rank. */
            add(&w, "--cgroup-manager=cgroupfs");
        } else {
            add(&w, "docker");
        }
        add(&w, "run");
        add(&w, "--rm");
        /* Never a pull at a rank's start: the pre-flight has found the image on the node. */
        add(&w, "--pull=never");
        add(&w, "--name");
        add(&w, "%s", c->name);
        add(&w, "--label");
        add(&w, "gpurun.job=%s", c->job_id ? c->job_id : "");
        add(&w, "--network=host");
        add(&w, "--ipc=host");
        add(&w, "--pid=host");
        add(&w, "--user");
        add(&w, "%u:%u", c->uid, c->gid);
        if (c->runtime == CONTAINER_PODMAN && c->cgroup_parent)
            add(&w, "--cgroup-parent=%s", c->cgroup_parent);
        if (c->gpus) {
            if (c->runtime == CONTAINER_PODMAN) {
                add(&w, "--device");
                add(&w, "nvidia.com/gpu=all");
            } else {
                add(&w, "--gpus");
                add(&w, "all");
            }
        }
        for (const char *const *e = c->env_names; e && *e; e++) {
            add(&w, "-e");
            add(&w, "%s", *e);
        }
        add_mounts(&w, c, "-v", true);
        if (c->workdir) {
            add(&w, "--workdir");
            add(&w, "%s", c->workdir);
        }
        add(&w, "%s", c->image);
        break;
    case CONTAINER_APPTAINER:
        add(&w, "apptainer");
        add(&w, "exec");
        if (c->gpus)
            add(&w, "--nv");
        add_mounts(&w, c, "--bind", true);
        if (c->workdir) {
            add(&w, "--pwd");
            add(&w, "%s", c->workdir);
        }
        add(&w, "%s", c->image);
        break;
    case CONTAINER_ENROOT:
    case CONTAINER_PYXIS:
        add(&w, "enroot");
        add(&w, "start");
        if (c->gpus) {
            add(&w, "--env");
            add(&w, "NVIDIA_VISIBLE_DEVICES=all");
        }
        for (const char *const *e = c->env_names; e && *e; e++) {
            add(&w, "--env");
            add(&w, "%s", *e);
        }
        add_mounts(&w, c, "--mount", false);
        add(&w, "%s", c->image);
        if (c->workdir) {
            add(&w, "sh");
            add(&w, "-c");
            add(&w, "cd \"$0\" && exec \"$@\"");
            add(&w, "%s", c->workdir);
        }
        break;
    default:
        w.oom = true; /* no runtime: nothing to run */
    }
    return done(&w);
}

char **container_rm_argv(int runtime, const char *name)
{
    struct words w = {0};

    if (runtime == CONTAINER_PODMAN) {
        add(&w, "podman");
        add(&w, "--cgroup-manager=cgroupfs");
        add(&w, "rm");
        add(&w, "--force");
        add(&w, "--ignore"); /* one already gone is no error */
    } else if (runtime == CONTAINER_DOCKER) {
        add(&w, "docker");
        add(&w, "rm");
        add(&w, "--force");
    } else {
        return NULL;
    }
    add(&w, "%s", name);
    return done(&w);
}

char **container_pyxis_options(const char *image, const char *mounts, const char *workdir,
                               const char *env_names)
{
    struct words w = {0};

    add(&w, "--container-image=%s", image);
    if (mounts)
        add(&w, "--container-mounts=%s", mounts);
    if (workdir)
        add(&w, "--container-workdir=%s", workdir);
    if (env_names)
        add(&w, "--container-env=%s", env_names);
    return done(&w);
}

/* Pre-flight checks (preflight.h): the GPUs through the driver's NVML, loaded with dlopen so
 * that rendezvousd starts on a node without the driver (CUDA_VISIBLE_DEVICES or /dev/nvidiaN
 * count them there), and the job dir's and out_dir's writes and free space. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "preflight.h"
#include "banned.h"

/* NVML, as much of nvml.h as pre-flight uses: its calls return 0 (NVML_SUCCESS) or an error
 * code; a device is an opaque handle. */
struct nvml_memory {
    unsigned long long total, free, used; /* bytes (nvmlMemory_t) */
};
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_UUID_LEN            96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */

struct nvml {
    void *lib;
    int (*shutdown)(void);
    int (*count)(unsigned *);
    /* The memory check's; NULL where the library lacks them (the check is then skipped). */
    int (*handle)(unsigned, void **);
    int (*memory)(void *, struct nvml_memory *);
    int (*uuid)(void *, char *, unsigned);
    const char *(*error)(int);
    char why[160]; /* why lib is NULL: the loader's or NVML's word */
};

/* Loads the driver's NVML and initialises it; m->lib stays NULL where it does not load or
 * does not start (no driver). */
static void nvml_open(struct nvml *m)
{
    int (*init)(void);
    int r;

    memset(m, 0, sizeof(*m));
    m->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!m->lib) {
        const char *e = dlerror();
        snprintf(m->why, sizeof(m->why), "%s", e ? e : "libnvidia-ml.so.1 not loaded");
        return;
    }
    *(void **)&init = dlsym(m->lib, "nvmlInit_v2");
    *(void **)&m->shutdown = dlsym(m->lib, "nvmlShutdown");
    *(void **)&m->count = dlsym(m->lib, "nvmlDeviceGetCount_v2");
    *(void **)&m->handle = dlsym(m->lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&m->memory = dlsym(m->lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&m->uuid = dlsym(m->lib, "nvmlDeviceGetUUID");
    *(void **)&m->error = dlsym(m->lib, "nvmlErrorString");
    if (!init || !m->shutdown || !m->count) {
        snprintf(m->why, sizeof(m->why),
                 "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlShutdown or "
                 "nvmlDeviceGetCount_v2");
    } else if ((r = init()) != 0) {
        const char *e = m->error ? m->error(r) : NULL;
        snprintf(m->why, sizeof(m->why), "nvmlInit_v2: %s", e ? e : "failed");
    }
    if (m->why[0]) {
        dlclose(m->lib);
        m->lib = NULL;
    }
}

static void nvml_close(struct nvml *m)
{
    if (!m->lib)
        return;
    m->shutdown();
    dlclose(m->lib);
    m->lib = NULL;
}

/* NVML's device count; -1 where NVML is not open or does not answer. */
static int nvml_count(struct nvml *m)
{
    unsigned n = 0;

    return m->lib && m->count(&n) == 0 && n <= INT_MAX ? (int)n : -1;
}

/* The entries of a CUDA_VISIBLE_DEVICES list ("0,1", "GPU-uuid,..."); "" or "NoDevFiles": 0. */
static int list_count(const char *s)
{
    int n = 0;

    if (!*s || !strcmp(s, "NoDevFiles"))
        return 0;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    return n + 1;
}

static int dev_count(void)
{
    DIR *d = opendir("/dev");
    struct dirent *e;
    int n = 0;

    if (!d)
        return 0;
    while ((e = readdir(d))) {
        char path[300];
        struct stat st;
        const char *p = e->d_name + 6;
        if (strncmp(e->d_name, "nvidia", 6) || !*p || strspn(p, "0123456789") != strlen(p))
            continue;
        snprintf(path, sizeof(path), "/dev/%s", e->d_name);
        n += stat(path, &st) == 0 && S_ISCHR(st.st_mode);
    }
    closedir(d);
    return n;
}

/* The GPUs visible, by preflight.h's rules, with m open or not. */
static int gpus_visible(struct nvml *m, const char **how)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = nvml_count(m);

    if (n >= 0) {
        *how = "NVML";
        /* The devices the step may use: CUDA_VISIBLE_DEVICES narrows NVML's whole node. */
        if (cvd && list_count(cvd) < n)
            n = list_count(cvd);
        return n;
    }
    if (cvd) {
        *how = "CUDA_VISIBLE_DEVICES";
        return list_count(cvd);
    }
    *how = "/dev";
    return dev_count();
}

/* The NVML index of one CUDA_VISIBLE_DEVICES entry (e, len bytes, of count devices): a number
 * is NVML's index, "GPU-..." a device's UUID or, as CUDA takes it, the start of one. -1 for
 * none: an index past the count, a UUID no device has, an entry of another kind ("MIG-...":
 * a MIG instance, whose memory is not its GPU's). */
static int nvml_resolve(struct nvml *m, int count, const char *e, size_t len)
{
    if (len > 0 && strspn(e, "0123456789") >= len) {
        long i = 0;
        for (size_t k = 0; k < len && i < count; k++)
            i = i * 10 + (e[k] - '0');
        return i < count ? (int)i : -1;
    }
    if (len <= 4 || strncmp(e, "GPU-", 4) || !m->uuid)
        return -1;
    for (int i = 0; i < count; i++) {
        char id[NVML_UUID_LEN];
        void *dev;
        if (m->handle((unsigned)i, &dev) == 0 && m->uuid(dev, id, sizeof(id)) == 0 &&
            strnlen(id, sizeof(id)) >= len && !strncmp(id, e, len))
            return i;
    }
    return -1;
}

/* Device i has pct% of its memory free; else why says so, and true. A device NVML may not
 * read (behind another job's cgroup) is not judged; one it cannot read otherwise (a GPU
 * fallen off the bus) fails. */
static bool gpu_short(struct nvml *m, int i, int pct, char *why, size_t n)
{
    struct nvml_memory mem = {0};
    void *dev = NULL;
    int r = m->handle((unsigned)i, &dev);

    if (r == 0)
        r = m->memory(dev, &mem);
    if (r == NVML_ERROR_NO_PERMISSION)
        return false;
    if (r != 0) {
        const char *e = m->error ? m->error(r) : NULL;
        if (e)
            snprintf(why, n, "GPU %d (NVML): memory not readable: %s", i, e);
        else
            snprintf(why, n, "GPU %d (NVML): memory not readable: error %d", i, r);
        return true;
    }
    if (mem.free > mem.total || mem.free * 100 >= mem.total * (unsigned long long)pct)
        return false;
    snprintf(why, n, "GPU %d (NVML): %llu of %llu MiB free, below %d%%", i, mem.free >> 20,
             mem.total >> 20, pct);
    return true;
}

void preflight_memory_skip(int pct, const char *nvml_why, bool memory_calls, char *skipped,
                           size_t n)
{
    skipped[0] = '\0';
    if (pct <= 0)
        return;
    if (nvml_why && nvml_why[0])
        snprintf(skipped, n, "GPU memory (--min-gpu-free %d): no NVML (%s)", pct, nvml_why);
    else if (!memory_calls)
        snprintf(skipped, n,
                 "GPU memory (--min-gpu-free %d): NVML lacks nvmlDeviceGetHandleByIndex_v2 or "
                 "nvmlDeviceGetMemoryInfo",
                 pct);
}

/* Each device the step may use (NVML's, narrowed by CUDA_VISIBLE_DEVICES) has pct% of its
 * memory free; skipped without NVML's memory calls. */
static void check_gpu_memory(struct nvml *m, int pct, char *why, size_t n)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int count = nvml_count(m);

    if (pct <= 0 || count <= 0 || !m->handle || !m->memory)
        return;
    if (!cvd) {
        for (int i = 0; i < count; i++)
            if (gpu_short(m, i, pct, why, n))
                return;
        return;
    }
    for (const char *p = cvd;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int i = nvml_resolve(m, count, p, len);
        if (i >= 0 && gpu_short(m, i, pct, why, n))
            return;
        if (!comma)
            return;
        p = comma + 1;
    }
}

/* The free MiB of the file system holding path; -1 where it cannot be known. */
static long long free_mb(const char *path)
{
    struct statvfs vfs;

    if (statvfs(path, &vfs) < 0)
        return -1;
    return (long long)((unsigned long long)vfs.f_bavail * vfs.f_frsize >> 20);
}

/* Dir (what: "job dir", "out_dir") takes a file, and has min_mb MiB free. */
static void check_dir(const char *what, const char *dir, int node, int min_mb, char *why, size_t n)
{
    char path[4096];
    long long mb;
    int fd, err = 0;

    snprintf(path, sizeof(path), "%s/.preflight-node%d", dir, node);
    /* No fsync: a journal commit on a busy disk costs milliseconds of every job's start, and
     * what it would catch is caught here too: the free space below, and on NFS a write's
     * failure (a quota) at close. */
    errno = 0;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, "ok\n", 3) != 3)
        err = errno ? errno : EIO;
    if (fd >= 0 && close(fd) < 0 && !err)
        err = errno ? errno : EIO;
    unlink(path);
    if (err) {
        snprintf(why, n, "%s '%s' cannot be written: %s", what, dir, strerror(err));
        return;
    }
    mb = free_mb(dir);
    if (mb >= 0 && mb < min_mb)
        snprintf(why, n, "%s '%s': %lld MiB free, below %d", what, dir, mb, min_mb);
}

/* A train.cfg's out_dir (relative: to the ranks' working directory): where it exists, as the
 * job dir; where it does not, the nearest dir above it that exists must let it be made
 * (gpurun-train makes it) and have the free space. */
static void check_out_dir(const struct jobspec *spec, int node, char *why, size_t n)
{
    char dir[4096], up[4096];
    struct stat st;
    long long mb;
    char *slash;

    if (spec->out_dir[0] == '/' || !spec->workdir)
        snprintf(dir, sizeof(dir), "%s", spec->out_dir);
    else
        snprintf(dir, sizeof(dir), "%s/%s", spec->workdir, spec->out_dir);
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            snprintf(why, n, "out_dir '%s' is not a directory", dir);
        else
            check_dir("out_dir", dir, node, spec->min_free_mb, why, n);
        return;
    }
    snprintf(up, sizeof(up), "%s", dir);
    do {
        slash = strrchr(up, '/');
        if (!slash)
            snprintf(up, sizeof(up), ".");
        else if (slash == up)
            up[1] = '\0';
        else
            *slash = '\0';
    } while (stat(up, &st) < 0 && strcmp(up, "/") && strcmp(up, "."));
    if (access(up, W_OK | X_OK) < 0) {
        snprintf(why, n, "out_dir '%s' cannot be made: '%s' is not writable: %s", dir, up,
                 strerror(errno));
        return;
    }
    mb = free_mb(up);
    if (mb >= 0 && mb < spec->min_free_mb)
        snprintf(why, n, "out_dir '%s': %lld MiB free, below %d", dir, mb, spec->min_free_mb);
}

bool preflight_link_timed(int nodes, bool preflight_only)
{
    return preflight_only || nodes - 1 >= PREFLIGHT_LINKS_MIN;
}

void preflight_run(const struct jobspec *spec, const char *job_dir, int node, char *why, size_t n,
                   char *skipped, size_t sn)
{
    why[0] = '\0';
    skipped[0] = '\0';
    if (!spec->preflight)
        return;
    if (spec->gpus_per_node > 0) {
        const char *how = "";
        struct nvml m;
        int have;

        nvml_open(&m);
        have = gpus_visible(&m, &how);
        if (have < spec->gpus_per_node) {
            snprintf(why, n, "%d of %d GPUs visible (%s)", have, spec->gpus_per_node, how);
        } else {
            check_gpu_memory(&m, spec->min_gpu_free_pct, why, n);
            preflight_memory_skip(spec->min_gpu_free_pct, m.lib ? NULL : m.why,
                                  m.handle && m.memory, skipped, sn);
        }
        nvml_close(&m);
        if (why[0])
            return;
    }
    if (job_dir)
        check_dir("job dir", job_dir, node, spec->min_free_mb, why, n);
    if (!why[0] && spec->out_dir)
        check_out_dir(spec, node, why, n);
}

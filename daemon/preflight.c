#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "preflight.h"
#include "banned.h"

/* NVML's device count, through the driver's library where it loads; -1 where it does not. */
static int nvml_count(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*init)(void), (*count)(unsigned *), (*shutdown)(void);
    unsigned n = 0;
    int ret = -1;

    if (!lib)
        return -1;
    *(void **)&init = dlsym(lib, "nvmlInit_v2");
    *(void **)&count = dlsym(lib, "nvmlDeviceGetCount_v2");
    *(void **)&shutdown = dlsym(lib, "nvmlShutdown");
    if (init && count && shutdown && init() == 0) {
        if (count(&n) == 0)
            ret = (int)n;
        shutdown();
    }
    dlclose(lib);
    return ret;
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

int preflight_gpus(const char **how)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = nvml_count();

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

/* The job dir takes a file, and has min_mb MiB free. */
static void check_dir(const char *dir, int node, int min_mb, char *why, size_t n)
{
    char path[4096];
    struct statvfs vfs;
    int fd, err = 0;

    snprintf(path, sizeof(path), "%s/.preflight-node%d", dir, node);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, "ok\n", 3) != 3 || fsync(fd) < 0)
        err = errno ? errno : EIO;
    if (fd >= 0)
        close(fd);
    unlink(path);
    if (err) {
        snprintf(why, n, "job dir '%s' cannot be written: %s", dir, strerror(err));
        return;
    }
    if (statvfs(dir, &vfs) == 0) {
        unsigned long long mb = (unsigned long long)vfs.f_bavail * vfs.f_frsize >> 20;
        if (mb < (unsigned long long)min_mb)
            snprintf(why, n, "job dir '%s': %llu MiB free, below %d", dir, mb, min_mb);
    }
}

void preflight_run(const struct jobspec *spec, const char *job_dir, int node, char *why, size_t n)
{
    why[0] = '\0';
    if (!spec->preflight)
        return;
    if (spec->gpus_per_node > 0) {
        const char *how = "";
        int have = preflight_gpus(&how);
        if (have < spec->gpus_per_node) {
            snprintf(why, n, "%d of %d GPUs visible (%s)", have, spec->gpus_per_node, how);
            return;
        }
    }
    if (job_dir)
        check_dir(job_dir, node, spec->min_free_mb, why, n);
}

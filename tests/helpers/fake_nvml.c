/* A fake NVML for the tests: built as $BUILD/tests/fakenvml/libnvidia-ml.so.1, so that a
 * rendezvousd started with that directory first in LD_LIBRARY_PATH loads it instead of the
 * driver's (pre-flight's dlopen, daemon/preflight.c). It has the calls pre-flight makes and
 * nothing else.
 *
 * Its GPUs are read at nvmlInit_v2 from the directory $GPURUN_FAKE_NVML_DIR: the file named
 * by the host's name (gethostname: each node of the Slurm test cluster has its own) where
 * there is one, else "default". One line per GPU, index 0 first:
 *     TOTAL_MIB FREE_MIB [UUID]
 * FREE_MIB "lost" makes nvmlDeviceGetMemoryInfo fail as for a GPU fallen off the bus; UUID
 * defaults to GPU-00000000-0000-0000-0000-0000000000NN (NN the index). Blank lines and lines
 * starting with '#' are skipped; an empty file is a node without GPUs. Without the variable
 * or either file, or with a line it cannot read, nvmlInit_v2 fails as it does without a
 * driver. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "banned.h"

/* nvml.h's values, those used here. */
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
};

#define FAKE_GPUS_MAX 64
#define UUID_LEN      96

struct fake_gpu {
    unsigned long long total_mib, free_mib;
    int lost;
    char uuid[UUID_LEN];
};

struct nvml_memory {
    unsigned long long total, free, used;
};

int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned *count);
int nvmlDeviceGetHandleByIndex_v2(unsigned index, struct fake_gpu **device);
int nvmlDeviceGetMemoryInfo(struct fake_gpu *device, struct nvml_memory *memory);
int nvmlDeviceGetUUID(struct fake_gpu *device, char *uuid, unsigned length);
const char *nvmlErrorString(int result);

static struct fake_gpu gpus[FAKE_GPUS_MAX];
static unsigned n_gpus;
static int inits; /* nvmlInit_v2 calls not yet shut down */

/* One line into g (index i); -1 when it cannot be read. */
static int parse_line(char *line, unsigned i, struct fake_gpu *g)
{
    char free_word[32], uuid[UUID_LEN];
    int fields;

    memset(g, 0, sizeof(*g));
    uuid[0] = '\0';
    fields = sscanf(line, "%llu %31s %95s", &g->total_mib, free_word, uuid);
    if (fields < 2)
        return -1;
    if (!strcmp(free_word, "lost")) {
        g->lost = 1;
    } else {
        char *end;
        errno = 0;
        g->free_mib = strtoull(free_word, &end, 10);
        if (errno || *end || end == free_word)
            return -1;
    }
    if (fields == 3)
        snprintf(g->uuid, sizeof(g->uuid), "%s", uuid);
    else
        snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-0000-0000-%012u", i);
    return 0;
}

static FILE *open_node_file(void)
{
    const char *dir = getenv("GPURUN_FAKE_NVML_DIR");
    char host[256], path[4096];
    FILE *f;

    if (!dir || !*dir)
        return NULL;
    if (gethostname(host, sizeof(host)) == 0) {
        host[sizeof(host) - 1] = '\0';
        snprintf(path, sizeof(path), "%s/%s", dir, host);
        if ((f = fopen(path, "re")))
            return f;
    }
    snprintf(path, sizeof(path), "%s/default", dir);
    return fopen(path, "re");
}

int nvmlInit_v2(void)
{
    FILE *f = open_node_file();
    char line[512];
    unsigned n = 0;
    int bad = 0;

    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    while (!bad && fgets(line, sizeof(line), f)) {
        char *p = line + strspn(line, " \t");
        if (*p == '\n' || *p == '\0' || *p == '#')
            continue;
        bad = n == FAKE_GPUS_MAX || parse_line(p, n, &gpus[n]) < 0;
        n++;
    }
    fclose(f);
    if (bad)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    n_gpus = n;
    inits++;
    return NVML_SUCCESS;
}

int nvmlShutdown(void)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    inits--;
    return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned *count)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = n_gpus;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, struct fake_gpu **device)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(struct fake_gpu *device, struct nvml_memory *memory)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->lost)
        return NVML_ERROR_GPU_IS_LOST;
    memory->total = device->total_mib << 20;
    memory->free = device->free_mib << 20;
    memory->used = memory->total > memory->free ? memory->total - memory->free : 0;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(struct fake_gpu *device, char *uuid, unsigned length)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(device->uuid) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", device->uuid);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

/* cudasim's CUDA runtime: the subset of the runtime API that gpurun's CUDA code calls,
 * implemented on the CPU behind NVIDIA's cuda_runtime_api.h (C linkage, as libcudart exports
 * it). Device memory is host memory laid out to catch bugs: 256-byte aligned, filled with
 * 0xff (NaN in fp32 and bf16) so unwritten reads show, its end against a PROT_NONE page so an
 * overrun faults, and the few bytes between the end and that page checked after every launch.
 * Freed memory stays unmapped-in-place for a while, so a use after free faults too. Streams
 * are synchronous (work runs inside the call that queues it), or with CUDASIM_ASYNC=1 defer
 * their work until CUDA's rules force it (see "streams and events"); events record the host
 * clock.
 *
 * The devices: CUDASIM_DEVICES of them (default 1; 0 makes every call answer
 * cudaErrorNoDevice), filtered by CUDA_VISIBLE_DEVICES as the real runtime does, each an
 * H100-like "cudasim" (compute capability 9.0, 80 GiB, 132 SMs). */
#include <deque>
#include <errno.h>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include <cuda_runtime_api.h>

#include "internal.h"
#include "banned.h"

#define PAGE             4096u
/* cudaMalloc's alignment, and the bytes each allocation is rounded up to (the canary). */
#define ALLOC_ALIGN      256u
#define GIB              (1024ull * 1024 * 1024)
#define DEVICE_MEM       (80 * GIB)
#define MAX_DEVICES      16
/* Freed allocations keep their address range (PROT_NONE) until this much is kept: a stale
 * pointer then faults rather than reaching a later allocation. */
#define QUARANTINE_BYTES (4 * GIB)
/* ... and at most this many (each is a mapping; the kernel allows 65530 per process). */
#define QUARANTINE_COUNT 8192
/* CUDASIM_TIGHT=1: allocations aligned to this only, so that their end is the guard page
 * itself and a read past the end faults too (cudaMalloc's 256 bytes are then not kept). */
#define TIGHT_ALIGN      16u
/* Dynamic shared memory a launch may use without cudaFuncSetAttribute, and with it. */
#define DYN_SMEM_DEFAULT (48u << 10)
#define DYN_SMEM_OPTIN   232448u
#define STREAM_MAGIC     0x5354524du /* "STRM" */
#define EVENT_MAGIC      0x45564e54u /* "EVNT" */

/* ---- errors -------------------------------------------------------------------------------- */

static thread_local cudaError_t last_error = cudaSuccess;

cudaError_t cudasim_record(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

struct error_text {
    cudaError_t code;
    const char *name, *text;
};

/* The runtime's own names and messages for the errors a program is likely to meet. */
static const error_text errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration",
     "__global__ function call is not configured"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorStartupFailure, "cudaErrorStartupFailure", "device kernel image is invalid"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorUnsupportedLimit, "cudaErrorUnsupportedLimit",
     "limit is not supported on this "
     "architecture"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const error_text *find_error(cudaError_t e)
{
    for (const error_text &t : errors)
        if (t.code == e)
            return &t;
    return NULL;
}

const char *cudaGetErrorName(cudaError_t e)
{
    const error_text *t = find_error(e);
    return t ? t->name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    const error_text *t = find_error(e);
    return t ? t->text : "unrecognized error code";
}

/* ---- devices ------------------------------------------------------------------------------- */

static std::once_flag devices_once;
static int n_visible;
static thread_local int current_device;

/* The physical devices, then CUDA_VISIBLE_DEVICES's list: indices of existing devices, in
 * order, up to the first entry that is not one (as the real runtime reads it; UUIDs are not
 * simulated and end the list). Read once, at the first call, like the real runtime. */
static void devices_init(void)
{
    const char *s = getenv("CUDASIM_DEVICES"), *v = getenv("CUDA_VISIBLE_DEVICES");
    int physical = 1;
    if (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        physical = (*end || n < 0 || n > MAX_DEVICES) ? 0 : (int)n;
    }
    if (!v) {
        n_visible = physical;
        return;
    }
    bool seen[MAX_DEVICES] = {false};
    n_visible = 0;
    while (*v) {
        char *end;
        while (*v == ' ')
            v++;
        long id = strtol(v, &end, 10);
        if (end == v || id < 0 || id >= physical || seen[id])
            break;
        seen[id] = true;
        n_visible++;
        v = end;
        while (*v == ' ')
            v++;
        if (*v != ',')
            break;
        v++;
    }
}

static int visible_devices(void)
{
    std::call_once(devices_once, devices_init);
    return n_visible;
}

cudaError_t cudasim_device_check(void)
{
    return visible_devices() > 0 ? cudaSuccess : cudaErrorNoDevice;
}

/* cudaSuccess, or the recorded error for a runtime with no device. */
static cudaError_t need_device(void)
{
    return cudasim_record(cudasim_device_check());
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = visible_devices();
    return need_device();
}

cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (device < 0 || device >= visible_devices())
        return cudasim_record(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    *version = CUDART_VERSION;
    return cudaSuccess;
}

static cudaError_t device_arg(int device)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (device < 0 || device >= visible_devices())
        return cudasim_record(cudaErrorInvalidDevice);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    cudaError_t e = device_arg(device);
    if (e)
        return e;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "cudasim");
    p->uuid.bytes[0] = (char)device;
    p->totalGlobalMem = DEVICE_MEM;
    p->sharedMemPerBlock = DYN_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = DYN_SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 233472;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = 132;
    p->concurrentKernels = 1;
    p->pciBusID = 0x10 + device;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->managedMemory = 1;
    p->cooperativeLaunch = 1;
    p->memoryPoolsSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    cudaError_t e = device_arg(device);
    if (e)
        return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
        *value = 1024;
        break;
    case cudaDevAttrMaxBlockDimZ:
        *value = 64;
        break;
    case cudaDevAttrMaxGridDimX:
        *value = 2147483647;
        break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ:
        *value = 65535;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *value = (int)DYN_SMEM_DEFAULT;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = (int)DYN_SMEM_OPTIN;
        break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
        *value = 233472;
        break;
    case cudaDevAttrWarpSize:
        *value = 32;
        break;
    case cudaDevAttrMultiProcessorCount:
        *value = 132;
        break;
    case cudaDevAttrComputeCapabilityMajor:
        *value = 9;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = 0;
        break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
        *value = 2048;
        break;
    case cudaDevAttrMaxRegistersPerBlock:
        *value = 65536;
        break;
    case cudaDevAttrL2CacheSize:
        *value = 50 << 20;
        break;
    case cudaDevAttrGlobalMemoryBusWidth:
        *value = 5120;
        break;
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentKernels:
    case cudaDevAttrStreamPrioritiesSupported:
    case cudaDevAttrCooperativeLaunch:
    case cudaDevAttrMemoryPoolsSupported:
        *value = 1;
        break;
    case cudaDevAttrIntegrated:
    case cudaDevAttrEccEnabled:
        *value = 0;
        break;
    case cudaDevAttrPciBusId:
        *value = 0x10 + device;
        break;
    case cudaDevAttrPciDeviceId:
    case cudaDevAttrPciDomainId:
        *value = 0;
        break;
    default:
        return cudasim_record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    cudaError_t e = device_arg(device);
    if (!e)
        e = device_arg(peer);
    if (e)
        return e;
    *can = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    (void)flags;
    return need_device();
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    *flags = 0;
    return need_device();
}

static size_t limits[16];

cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    if ((unsigned)limit >= sizeof(limits) / sizeof(limits[0]))
        return cudasim_record(cudaErrorUnsupportedLimit);
    limits[limit] = value;
    return need_device();
}

cudaError_t cudaDeviceGetLimit(size_t *value, enum cudaLimit limit)
{
    if ((unsigned)limit >= sizeof(limits) / sizeof(limits[0]))
        return cudasim_record(cudaErrorUnsupportedLimit);
    *value = limits[limit];
    return need_device();
}

static cudaError_t capture_unsafe(const char *what);

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if ((e = capture_unsafe("cudaDeviceSynchronize")) != cudaSuccess)
        return e;
    cudasim_drain_all();
    cudasim_check_canaries("cudaDeviceSynchronize");
    return e;
}

/* ---- memory -------------------------------------------------------------------------------- */

enum alloc_kind { DEVICE, HOST };

struct alloc {
    char *map;  /* the mapping: a guard page, the data pages, a guard page */
    size_t len; /* of the mapping */
    char *ptr;  /* what the caller got */
    size_t size;
    alloc_kind kind;
};

static std::recursive_mutex mem_mu;
static std::map<uintptr_t, alloc> allocs; /* by ptr */
static std::deque<alloc> freed;           /* the quarantine, oldest first */
static size_t freed_bytes, used_bytes;

static char *guard_of(const alloc &a)
{
    return a.map + a.len - PAGE;
}

/* The live allocation holding p (its end included), or NULL. Caller holds mem_mu. */
static const alloc *find_alloc(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    auto it = allocs.upper_bound(u);
    if (it == allocs.begin())
        return NULL;
    --it;
    const alloc &a = it->second;
    return u <= (uintptr_t)a.ptr + a.size ? &a : NULL;
}

static const alloc *find_freed(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    for (auto it = freed.rbegin(); it != freed.rend(); ++it)
        if (u >= (uintptr_t)it->map && u < (uintptr_t)it->map + it->len)
            return &*it;
    return NULL;
}

bool cudasim_ptr_valid(const void *p, char *why, size_t len)
{
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    if (find_alloc(p))
        return true;
    const alloc *f = find_freed(p);
    if (f)
        snprintf(why, len, "it points into a %zu-byte allocation at %p that was freed", f->size,
                 (void *)f->ptr);
    else
        snprintf(why, len, "no cudaMalloc or cudaMallocHost allocation holds it");
    return false;
}

static bool tight(void)
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("CUDASIM_TIGHT");
        on = s && *s && strcmp(s, "0");
    }
    return on;
}

static cudaError_t map_alloc(void **out, size_t size, alloc_kind kind)
{
    *out = NULL;
    if (!size)
        return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    if (size > DEVICE_MEM || (kind == DEVICE && used_bytes + size > DEVICE_MEM))
        return cudasim_record(cudaErrorMemoryAllocation);
    cudasim_fault_setup();
    size_t align = tight() ? TIGHT_ALIGN : ALLOC_ALIGN;
    size_t data = (size + align - 1) / align * align;
    size_t pages = (data + PAGE - 1) / PAGE * PAGE;
    alloc a;
    a.len = pages + 2 * PAGE;
    a.map = (char *)mmap(NULL, a.len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a.map == MAP_FAILED)
        return cudasim_record(kind == DEVICE ? cudaErrorMemoryAllocation
                                             : cudaErrorMemoryAllocation);
    if (mprotect(a.map, PAGE, PROT_NONE) < 0 || mprotect(guard_of(a), PAGE, PROT_NONE) < 0) {
        munmap(a.map, a.len);
        return cudasim_record(cudaErrorMemoryAllocation);
    }
    /* 0xff everywhere: NaN for unwritten data, the canary around it. */
    memset(a.map + PAGE, 0xff, pages);
    a.ptr = guard_of(a) - data;
    a.size = size;
    a.kind = kind;
    allocs[(uintptr_t)a.ptr] = a;
    if (kind == DEVICE)
        used_bytes += size;
    *out = a.ptr;
    return cudaSuccess;
}

/* Whether the 0xff bytes around a's data are intact; where the first change is otherwise. */
static bool canary_ok(const alloc &a, bool head, const char **where_, size_t *off)
{
    const char *end = a.ptr + a.size, *g = guard_of(a);
    for (const char *p = end; p < g; p++)
        if ((unsigned char)*p != 0xff) {
            *where_ = "beyond the last byte of";
            *off = (size_t)(p - end);
            return false;
        }
    if (head)
        for (const char *p = a.map + PAGE; p < a.ptr; p++)
            if ((unsigned char)*p != 0xff) {
                *where_ = "before the first byte of";
                *off = (size_t)(a.ptr - p) - 1;
                return false;
            }
    return true;
}

[[noreturn]] static void canary_fail(const alloc &a, const char *where_, size_t off,
                                     const char *after)
{
    fflush(stdout);
    fprintf(stderr,
            "cudasim: memory %zu byte(s) %s a %zu-byte %s allocation at %p was written (found "
            "after %s)\n",
            off + 1, where_, a.size, a.kind == DEVICE ? "cudaMalloc" : "cudaMallocHost",
            (void *)a.ptr, after);
    fflush(stderr);
    abort();
}

void cudasim_check_canaries(const char *after)
{
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    for (const auto &it : allocs) {
        const char *w;
        size_t off;
        if (!canary_ok(it.second, false, &w, &off))
            canary_fail(it.second, w, off, after);
    }
}

static cudaError_t free_alloc(void *p, alloc_kind kind)
{
    if (!p)
        return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || it->second.kind != kind)
        return cudasim_record(cudaErrorInvalidValue);
    alloc a = it->second;
    const char *w;
    size_t off;
    if (!canary_ok(a, true, &w, &off))
        canary_fail(a, w, off, kind == DEVICE ? "cudaFree" : "cudaFreeHost");
    allocs.erase(it);
    if (kind == DEVICE)
        used_bytes -= a.size;
    /* The pages go back to the system; the addresses stay reserved, inaccessible. */
    madvise(a.map, a.len, MADV_DONTNEED);
    mprotect(a.map, a.len, PROT_NONE);
    freed.push_back(a);
    freed_bytes += a.len;
    while ((freed_bytes > QUARANTINE_BYTES || freed.size() > QUARANTINE_COUNT) && !freed.empty()) {
        munmap(freed.front().map, freed.front().len);
        freed_bytes -= freed.front().len;
        freed.pop_front();
    }
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if ((e = capture_unsafe("cudaMalloc")) != cudaSuccess)
        return e;
    return map_alloc(p, size, DEVICE);
}

/* CUDA's cudaFree and cudaFreeHost synchronise the device first: queued work runs. */
cudaError_t cudaFree(void *p)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if ((e = capture_unsafe("cudaFree")) != cudaSuccess)
        return e;
    if (p)
        cudasim_drain_all();
    return free_alloc(p, DEVICE);
}

cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t stream)
{
    if (!cudasim_stream_valid(stream))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    return cudaMalloc(p, size);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t stream)
{
    if (!cudasim_stream_valid(stream))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    return cudaFree(p);
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    return map_alloc(p, size, HOST);
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    (void)flags;
    return cudaMallocHost(p, size);
}

cudaError_t cudaFreeHost(void *p)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (p)
        cudasim_drain_all();
    return free_alloc(p, HOST);
}

cudaError_t cudaMemGetInfo(size_t *free_, size_t *total)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    *free_ = DEVICE_MEM - used_bytes;
    *total = DEVICE_MEM;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p)
{
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    const alloc *a = find_alloc(p);
    memset(attr, 0, sizeof(*attr));
    if (!a) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
        attr->hostPointer = (void *)p;
        return cudaSuccess;
    }
    attr->type = a->kind == DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->device = 0;
    attr->devicePointer = (void *)p;
    attr->hostPointer = a->kind == HOST ? (void *)p : NULL;
    return cudaSuccess;
}

/* Whether [p, p + n) lies inside one live allocation. */
static bool in_alloc(const void *p, size_t n)
{
    std::lock_guard<std::recursive_mutex> lock(mem_mu);
    const alloc *a = find_alloc(p);
    return a && (uintptr_t)p + n <= (uintptr_t)a->ptr + a->size;
}

static cudaError_t copy_deferred(void *dst, const void *src, size_t n, cudaStream_t stream);
static cudaError_t capture_copy(const void *dst, const void *src, cudaStream_t stream);
static bool capture_on(cudaStream_t stream);

/* A copy's device side must be device-accessible memory (cudaMalloc or cudaMallocHost) and
 * stay inside its allocation (the real runtime refuses a copy past an allocation's end);
 * its host side may be any memory. cudaMemcpyDefault infers each side from the pointer. */
static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t stream)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!cudasim_stream_valid(stream))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (!n)
        return cudaSuccess;
    bool dst_dev, src_dev;
    switch (kind) {
    case cudaMemcpyHostToHost:
        dst_dev = src_dev = false;
        break;
    case cudaMemcpyHostToDevice:
        dst_dev = true, src_dev = false;
        break;
    case cudaMemcpyDeviceToHost:
        dst_dev = false, src_dev = true;
        break;
    case cudaMemcpyDeviceToDevice:
        dst_dev = src_dev = true;
        break;
    case cudaMemcpyDefault:
        dst_dev = in_alloc(dst, 0);
        src_dev = in_alloc(src, 0);
        break;
    default:
        return cudasim_record(cudaErrorInvalidMemcpyDirection);
    }
    if ((dst_dev && !in_alloc(dst, n)) || (src_dev && !in_alloc(src, n)))
        return cudasim_record(cudaErrorInvalidValue);
    if ((e = capture_copy(dst, src, stream)) != cudaSuccess)
        return e;
    /* Synchronous, or recorded by a capture (device and pinned memory only, above). */
    if (!cudasim_stream_deferred(stream) || capture_on(stream)) {
        cudasim_stream_submit(stream, [dst, src, n] { memmove(dst, src, n); });
        return cudaSuccess;
    }
    return copy_deferred(dst, src, n, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return copy(dst, src, n, kind, 0);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return copy(dst, src, n, kind, stream);
}

/* A __device__ or __constant__ variable is a host variable here: its bounds are the compiler's,
 * not the allocation table's. */
cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t n, size_t offset,
                               enum cudaMemcpyKind kind)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return cudasim_record(cudaErrorInvalidMemcpyDirection);
    memmove((char *)symbol + offset, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t n, size_t offset,
                                 enum cudaMemcpyKind kind)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return cudasim_record(cudaErrorInvalidMemcpyDirection);
    memmove(dst, (const char *)symbol + offset, n);
    return cudaSuccess;
}

static cudaError_t fill(void *p, int value, size_t n, cudaStream_t stream)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!cudasim_stream_valid(stream))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (!n)
        return cudaSuccess;
    if (!in_alloc(p, n))
        return cudasim_record(cudaErrorInvalidValue);
    cudasim_stream_submit(stream, [p, value, n] { memset(p, value, n); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
    return fill(p, value, n, 0);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream)
{
    return fill(p, value, n, stream);
}

/* ---- streams and events -------------------------------------------------------------------- */

/* CUDASIM_ASYNC=1: the work queued on a stream of cudaStreamCreate* waits in the stream's queue
 * until CUDA's rules force it to run (a synchronisation of the stream, of an event recorded on
 * it or of the device, a cudaStreamQuery that finds it pending twice, a stream waiting on such
 * an event, cudaFree, or an operation on the legacy default stream, which runs the queues of
 * the blocking streams first and leaves the non-blocking ones pending). A host read of what
 * the work writes before such a point sees the old data, as it may on a GPU. Otherwise (the
 * default) every stream is synchronous: work runs inside the call that queues it. */
struct sim_op {
    std::function<void()> fn;
    uint64_t seq;
};

struct sim_stream {
    uint32_t magic;
    unsigned flags;
    int priority;
    uint64_t id;
    std::deque<sim_op> q;  /* deferred work, oldest first */
    uint64_t queued, done; /* sequence numbers of the last op queued and the last one run */
    unsigned polls;        /* cudaStreamQuery calls that found work pending */
    /* An operation that never completes (a failed NCCL collective, whose kernel waits for
     * its peers until the communicator is aborted): its owner and what it was, or NULL. */
    const void *hung_owner;
    char hung_what[160];
    /* A capture in progress (cudaStreamBeginCapture): the work recorded so far, or NULL; why
     * it was invalidated ("" while valid). */
    std::vector<std::function<void()>> *cap;
    enum cudaStreamCaptureMode cap_mode;
    char cap_bad[160];
};

struct sim_event {
    uint32_t magic;
    unsigned flags;
    bool recorded;
    double ms; /* host clock when the record ran */
    uint64_t id;
    /* A record still queued: its stream's id and sequence number (pend_seq 0: none). */
    uint64_t pend_stream, pend_seq;
    unsigned polls; /* cudaEventQuery calls that found it pending */
};

/* Guards the streams, the events and their queues; held while queued work runs (that work may
 * run other streams' queues: a wait on an event), hence recursive. */
static std::recursive_mutex obj_mu;
static std::set<const void *> streams, events;
static std::map<uint64_t, sim_stream *> streams_by_id; /* creation order */
static uint64_t next_id;

static bool async_mode(void)
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("CUDASIM_ASYNC");
        on = s && *s && strcmp(s, "0");
    }
    return on;
}

bool cudasim_stream_valid(cudaStream_t s)
{
    if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return true;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    return streams.count(s) != 0;
}

/* The stream whose work s defers, or NULL (synchronous mode, or a default stream). Caller
 * holds obj_mu. */
static sim_stream *deferred_of(cudaStream_t s)
{
    if (!async_mode() || !s || s == cudaStreamLegacy || s == cudaStreamPerThread ||
        !streams.count(s))
        return NULL;
    return (sim_stream *)s;
}

/* The stream s when a capture is recording its work, else NULL. Caller holds obj_mu. */
static sim_stream *capturing_of(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread || !streams.count(s))
        return NULL;
    sim_stream *st = (sim_stream *)s;
    return st->cap ? st : NULL;
}

/* A capturing stream defers too: what is queued on it must keep its own copies. */
bool cudasim_stream_deferred(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    return deferred_of(s) != NULL || capturing_of(s) != NULL;
}

/* The stream whose queued operation is running (NULL: none). */
static sim_stream *running;

/* Runs st's queue up to the op numbered seq (included). Caller holds obj_mu. A wait for an
 * operation behind one that never completes would hang on a GPU: it aborts with a message. */
static void drain_to(sim_stream *st, uint64_t seq)
{
    while (st->done < seq && !st->q.empty()) {
        if (st->hung_owner) {
            fflush(stdout);
            fprintf(stderr,
                    "cudasim: the host waits for a stream behind a %s that failed: on a GPU "
                    "this waits forever (abort the communicator first)\n",
                    st->hung_what);
            fflush(stderr);
            abort();
        }
        sim_op op = std::move(st->q.front());
        st->q.pop_front();
        sim_stream *outer = running;
        running = st;
        op.fn();
        running = outer;
        if (st->hung_owner) {
            /* Not done: it blocks the rest of the queue until its owner lets it go. */
            st->q.push_front({[] {}, op.seq});
            break;
        }
        st->done = op.seq;
    }
    if (st->q.empty())
        st->polls = 0;
}

/* Runs the queues of every stream, or of the blocking ones only (what an operation on the
 * legacy default stream waits for), in creation order. Caller holds obj_mu. */
static void drain_streams(bool blocking_only)
{
    std::vector<sim_stream *> all;
    for (const auto &it : streams_by_id)
        if (!blocking_only || !(it.second->flags & cudaStreamNonBlocking))
            all.push_back(it.second);
    for (sim_stream *st : all)
        if (streams_by_id.count(st->id))
            drain_to(st, UINT64_MAX);
}

void cudasim_stream_hang(const void *owner, const char *what)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (!running)
        return;
    running->hung_owner = owner;
    snprintf(running->hung_what, sizeof(running->hung_what), "%s", what);
}

void cudasim_stream_release(const void *owner)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    for (const auto &it : streams_by_id)
        if (it.second->hung_owner == owner)
            it.second->hung_owner = NULL;
}

void cudasim_drain_all(void)
{
    if (!async_mode())
        return;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    drain_streams(false);
}

static sim_stream *stream_of(cudaStream_t s);

/* ---- stream capture and graphs -------------------------------------------------------------
 *
 * cudaStreamBeginCapture on a created stream records the work then queued on it instead of
 * running it, until cudaStreamEndCapture hands it over as a graph; cudaGraphLaunch queues the
 * recorded work on a stream, as often as asked, with what the capture saw (kernels'
 * arguments, pointers and sizes by value, as a CUDA graph keeps them: what they point at is
 * read at the replay, and a pointer freed since faults there). What CUDA refuses during a
 * capture fails the same way here and invalidates it (cudaStreamEndCapture then answers
 * cudaErrorStreamCaptureInvalidated and says why on stderr): a synchronisation or query of
 * the capturing stream, or of the legacy default stream, a copy to or from pageable host
 * memory, and in the Global and ThreadLocal modes cudaMalloc, cudaFree and
 * cudaDeviceSynchronize from the capturing thread. Events recorded or waited for in a capture
 * are not simulated: they invalidate it too. */
#define GRAPH_MAGIC 0x47525048u /* "GRPH" */
#define EXEC_MAGIC  0x47455843u /* "GEXC" */

struct sim_graph {
    uint32_t magic;
    std::shared_ptr<std::vector<std::function<void()>>> ops;
};

static std::set<const void *> graphs, graph_execs;

/* The stream this thread captures in the Global or ThreadLocal mode, or NULL. */
static thread_local sim_stream *tl_capture;

/* Invalidates st's capture, why saying what was refused; records and returns the error.
 * Caller holds obj_mu. */
static cudaError_t capture_invalidate(sim_stream *st, const char *why)
{
    if (!st->cap_bad[0])
        snprintf(st->cap_bad, sizeof(st->cap_bad), "%s", why);
    return cudasim_record(cudaErrorStreamCaptureUnsupported);
}

/* what (a synchronisation or query) on s: refused while s captures, or on the legacy default
 * stream while this thread captures. Caller holds obj_mu. */
static cudaError_t capture_refuses(cudaStream_t s, const char *what)
{
    sim_stream *st = capturing_of(s);
    if (!st && (s == 0 || s == cudaStreamLegacy) && tl_capture && streams.count(tl_capture))
        st = tl_capture;
    if (!st)
        return cudaSuccess;
    char why[160];
    snprintf(why, sizeof(why), "%s during the capture", what);
    return capture_invalidate(st, why);
}

static cudaError_t capture_unsafe(const char *what)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (!tl_capture || !streams.count(tl_capture))
        return cudaSuccess;
    char why[160];
    snprintf(why, sizeof(why), "%s during the capture", what);
    return capture_invalidate(tl_capture, why);
}

static cudaError_t capture_copy(const void *dst, const void *src, cudaStream_t stream)
{
    bool pageable;
    {
        std::lock_guard<std::recursive_mutex> lock(mem_mu);
        pageable = !find_alloc(dst) || !find_alloc(src);
    }
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = capturing_of(stream);
    if (!st || !pageable)
        return cudaSuccess;
    return capture_invalidate(st, "a copy to or from pageable host memory in the capture");
}

/* Whether a capture records stream's work. */
static bool capture_on(cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    return capturing_of(stream) != NULL;
}

/* Ends st's capture, dropping what it recorded. Caller holds obj_mu. */
static void capture_drop(sim_stream *st)
{
    delete st->cap;
    st->cap = NULL;
    st->cap_bad[0] = 0;
    if (tl_capture == st)
        tl_capture = NULL;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return cudasim_record(cudaErrorStreamCaptureUnsupported);
    sim_stream *st = stream_of(s);
    if (!st)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (st->cap || (mode != cudaStreamCaptureModeRelaxed && tl_capture))
        return cudasim_record(cudaErrorIllegalState);
    st->cap = new std::vector<std::function<void()>>;
    st->cap_mode = mode;
    st->cap_bad[0] = 0;
    if (mode != cudaStreamCaptureModeRelaxed)
        tl_capture = st;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = stream_of(s);
    if (!st)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (!st->cap)
        return cudasim_record(cudaErrorIllegalState);
    *graph = NULL;
    if (st->cap_bad[0]) {
        fprintf(stderr, "cudasim: the capture was invalidated: %s\n", st->cap_bad);
        capture_drop(st);
        return cudasim_record(cudaErrorStreamCaptureInvalidated);
    }
    sim_graph *g = new sim_graph;
    g->magic = GRAPH_MAGIC;
    g->ops = std::make_shared<std::vector<std::function<void()>>>(std::move(*st->cap));
    capture_drop(st);
    graphs.insert(g);
    *graph = (cudaGraph_t)g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = capturing_of(s);
    *status = !st              ? cudaStreamCaptureStatusNone
              : st->cap_bad[0] ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

/* The executable graph shares the recorded work with its graph (which may be destroyed
 * first). */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (!graphs.count(graph))
        return cudasim_record(cudaErrorInvalidValue);
    sim_graph *x = new sim_graph;
    x->magic = EXEC_MAGIC;
    x->ops = ((sim_graph *)graph)->ops;
    graph_execs.insert(x);
    *exec = (cudaGraphExec_t)x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    std::shared_ptr<std::vector<std::function<void()>>> ops;
    {
        std::lock_guard<std::recursive_mutex> lock(obj_mu);
        if (!graph_execs.count(exec))
            return cudasim_record(cudaErrorInvalidValue);
        if (!cudasim_stream_valid(s))
            return cudasim_record(cudaErrorInvalidResourceHandle);
        ops = ((sim_graph *)exec)->ops;
    }
    for (const auto &op : *ops)
        cudasim_stream_submit(s, op);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (!graph_execs.erase(exec))
        return cudasim_record(cudaErrorInvalidValue);
    sim_graph *x = (sim_graph *)exec;
    x->magic = 0;
    delete x;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    if (!graphs.erase(graph))
        return cudasim_record(cudaErrorInvalidValue);
    sim_graph *g = (sim_graph *)graph;
    g->magic = 0;
    delete g;
    return cudaSuccess;
}

/* What must run before an operation on s that is not deferred: on the legacy default stream,
 * the blocking streams' work. Caller holds obj_mu. */
static void before_sync_op(cudaStream_t s)
{
    if (async_mode() && (s == 0 || s == cudaStreamLegacy))
        drain_streams(true);
}

/* Queues fn on st and returns its sequence number. Caller holds obj_mu. */
static uint64_t enqueue(sim_stream *st, std::function<void()> fn)
{
    st->q.push_back({std::move(fn), ++st->queued});
    return st->queued;
}

void cudasim_stream_submit(cudaStream_t s, std::function<void()> fn)
{
    {
        std::lock_guard<std::recursive_mutex> lock(obj_mu);
        sim_stream *cs = capturing_of(s);
        if (cs) {
            if (!cs->cap_bad[0])
                cs->cap->push_back(std::move(fn));
            return;
        }
    }
    if (!async_mode()) {
        fn();
        return;
    }
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = deferred_of(s);
    if (st) {
        enqueue(st, std::move(fn));
        return;
    }
    before_sync_op(s);
    fn();
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        return cudasim_record(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = new sim_stream;
    st->magic = STREAM_MAGIC;
    st->flags = flags;
    st->priority = priority < -5 ? -5 : (priority > 0 ? 0 : priority);
    st->id = ++next_id;
    st->queued = st->done = 0;
    st->polls = 0;
    st->hung_owner = NULL;
    st->cap = NULL;
    st->cap_bad[0] = 0;
    streams.insert(st);
    streams_by_id[st->id] = st;
    *s = (cudaStream_t)st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0);
}

static sim_stream *stream_of(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    return streams.count(s) ? (sim_stream *)s : NULL;
}

/* CUDA lets the queued work finish after cudaStreamDestroy returns: here it runs first. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = stream_of(s);
    if (!st)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    drain_to(st, UINT64_MAX);
    capture_drop(st);
    streams.erase(st);
    streams_by_id.erase(st->id);
    st->magic = 0;
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    {
        std::lock_guard<std::recursive_mutex> lock(obj_mu);
        if ((e = capture_refuses(s, "cudaStreamSynchronize")) != cudaSuccess)
            return e;
        sim_stream *st = deferred_of(s);
        if (st)
            drain_to(st, UINT64_MAX);
        else
            before_sync_op(s);
    }
    cudasim_check_canaries("cudaStreamSynchronize");
    return cudaSuccess;
}

/* Pending work: "not ready" at the first query, run at the next, so that a polling loop ends
 * and code that takes completion for granted without asking is caught. cudaErrorNotReady is
 * not an error: it is not recorded. */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    cudaError_t e = capture_refuses(s, "cudaStreamQuery");
    if (e != cudaSuccess)
        return e;
    sim_stream *st = deferred_of(s);
    if (!st) {
        before_sync_op(s);
        return cudaSuccess;
    }
    if (st->q.empty())
        return cudaSuccess;
    if (st->polls++ == 0 || st->hung_owner)
        return cudaErrorNotReady;
    drain_to(st, UINT64_MAX);
    return st->hung_owner ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags)
{
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    sim_stream *st = stream_of(s);
    *flags = st ? st->flags : 0;
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    sim_stream *st = stream_of(s);
    *priority = st ? st->priority : 0;
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    if (!cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    cudasim_stream_submit(s, [fn, data] { fn(data); });
    return cudaSuccess;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static sim_event *event_of(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    return events.count(e) ? (sim_event *)e : NULL;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    cudaError_t r = need_device();
    if (r)
        return r;
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        return cudasim_record(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = new sim_event{EVENT_MAGIC, flags, false, 0.0, ++next_id, 0, 0, 0};
    events.insert(ev);
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

/* A record still queued is dropped with its event (CUDA would complete it unseen). */
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = event_of(e);
    if (!ev)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    events.erase(ev);
    ev->magic = 0;
    delete ev;
    return cudaSuccess;
}

/* Whether ev (an id-checked pointer, for work queued before a destroy) is still live. */
static sim_event *event_live(sim_event *ev, uint64_t id)
{
    return events.count(ev) && ev->id == id ? ev : NULL;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags)
{
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = event_of(e);
    if (!ev || !cudasim_stream_valid(s))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (capturing_of(s))
        return capture_invalidate(capturing_of(s), "an event recorded in a capture (event nodes "
                                                   "are not simulated)");
    sim_stream *st = deferred_of(s);
    if (!st) {
        before_sync_op(s);
        ev->recorded = true;
        ev->ms = now_ms();
        ev->pend_seq = 0;
        return cudaSuccess;
    }
    uint64_t id = ev->id, seq = st->queued + 1;
    ev->pend_stream = st->id;
    ev->pend_seq = seq;
    ev->polls = 0;
    enqueue(st, [ev, id, seq] {
        sim_event *v = event_live(ev, id);
        if (v && v->pend_seq == seq) {
            v->recorded = true;
            v->ms = now_ms();
            v->pend_seq = 0;
        }
    });
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    return cudaEventRecordWithFlags(e, s, 0);
}

/* Runs the stream holding ev's pending record up to it. Caller holds obj_mu. */
static void event_run(sim_event *ev)
{
    if (!ev->pend_seq)
        return;
    auto it = streams_by_id.find(ev->pend_stream);
    if (it == streams_by_id.end())
        ev->pend_seq = 0; /* its stream is gone: destroying it ran its work */
    else
        drain_to(it->second, ev->pend_seq);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = event_of(e);
    if (!ev)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    event_run(ev);
    return cudaSuccess;
}

/* As cudaStreamQuery: a pending record is "not ready" once, then run. */
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = event_of(e);
    if (!ev)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (!ev->pend_seq)
        return cudaSuccess;
    auto it = streams_by_id.find(ev->pend_stream);
    if (ev->polls++ == 0 || (it != streams_by_id.end() && it->second->hung_owner))
        return cudaErrorNotReady;
    event_run(ev);
    return ev->pend_seq ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *a = event_of(start), *b = event_of(end);
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (a->pend_seq || b->pend_seq)
        return cudaErrorNotReady;
    if (!a->recorded || !b->recorded)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

/* s's later work runs after ev's pending record: a deferred s runs the recording stream up to
 * it when s's queue reaches the wait; a default stream does it now. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_event *ev = event_of(e);
    if (!cudasim_stream_valid(s) || !ev)
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (capturing_of(s))
        return capture_invalidate(capturing_of(s), "a wait for an event in a capture (event "
                                                   "nodes are not simulated)");
    if (!ev->pend_seq)
        return cudaSuccess;
    sim_stream *st = deferred_of(s);
    if (!st) {
        event_run(ev);
        return cudaSuccess;
    }
    uint64_t on = ev->pend_stream, seq = ev->pend_seq;
    enqueue(st, [on, seq] {
        auto it = streams_by_id.find(on);
        if (it != streams_by_id.end())
            drain_to(it->second, seq);
    });
    return cudaSuccess;
}

/* An asynchronous copy on a deferred stream, as CUDA treats pageable host memory (neither
 * cudaMalloc nor cudaMallocHost): into it, the copy completes before the call returns (the
 * stream runs up to it); from it, the source is staged at once and the caller may reuse it.
 * Between device or pinned memory, the copy waits in the queue. */
static cudaError_t copy_deferred(void *dst, const void *src, size_t n, cudaStream_t stream)
{
    bool dst_pageable, src_pageable;
    {
        std::lock_guard<std::recursive_mutex> lock(mem_mu);
        dst_pageable = !find_alloc(dst);
        src_pageable = !find_alloc(src);
    }
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    sim_stream *st = deferred_of(stream);
    if (!st) /* destroyed meanwhile by another thread */
        return cudasim_record(cudaErrorInvalidResourceHandle);
    if (dst_pageable) {
        drain_to(st, enqueue(st, [dst, src, n] { memmove(dst, src, n); }));
    } else if (src_pageable) {
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        enqueue(st, [dst, staged] { memmove(dst, staged->data(), staged->size()); });
    } else {
        enqueue(st, [dst, src, n] { memmove(dst, src, n); });
    }
    return cudaSuccess;
}

/* ---- kernels' attributes ------------------------------------------------------------------- */

static std::map<const void *, size_t> dyn_smem_limits;

size_t cudasim_func_dyn_smem_limit(const void *fn)
{
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    auto it = dyn_smem_limits.find(fn);
    return it == dyn_smem_limits.end() ? DYN_SMEM_DEFAULT : it->second;
}

cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int value)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!fn)
        return cudasim_record(cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || (unsigned)value > DYN_SMEM_OPTIN)
            return cudasim_record(cudaErrorInvalidValue);
        {
            std::lock_guard<std::recursive_mutex> lock(obj_mu);
            dyn_smem_limits[fn] = (size_t)value;
        }
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value < -1 || value > 100 ? cudasim_record(cudaErrorInvalidValue) : cudaSuccess;
    default:
        return cudasim_record(cudaErrorInvalidValue);
    }
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *fn)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!fn)
        return cudasim_record(cudaErrorInvalidDeviceFunction);
    memset(attr, 0, sizeof(*attr));
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = (int)cudasim_func_dyn_smem_limit(fn);
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *fn,
                                                          int block_size, size_t smem)
{
    cudaError_t e = need_device();
    if (e)
        return e;
    if (!fn || block_size <= 0 || block_size > 1024)
        return cudasim_record(cudaErrorInvalidValue);
    /* An H100's limits: 2048 threads, 32 blocks and 228 KiB of shared memory per SM. */
    int n = 2048 / block_size;
    if (n > 32)
        n = 32;
    if (smem && (int)(233472 / (smem + 1024)) < n)
        n = (int)(233472 / (smem + 1024));
    *blocks = n;
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
    cudasim_drain_all();
    {
        std::lock_guard<std::recursive_mutex> lock(mem_mu);
        while (!allocs.empty()) {
            const alloc &a = allocs.begin()->second;
            free_alloc(a.ptr, a.kind);
        }
    }
    std::lock_guard<std::recursive_mutex> lock(obj_mu);
    for (const void *s : streams)
        delete (sim_stream *)s;
    for (const void *e : events)
        delete (sim_event *)e;
    streams.clear();
    streams_by_id.clear();
    events.clear();
    dyn_smem_limits.clear();
    return cudaSuccess;
}

/* ---- the fault handler --------------------------------------------------------------------- */

static struct sigaction old_segv, old_bus;

static void say(const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* Names what a bad address is (a guard page of an allocation, a freed allocation, a fiber's
 * stack guard, past the dynamic shared memory) and where the access ran; then the default
 * action (the process dies of the signal) or the handler installed before. Runs on the
 * alternate stack, so that a fiber's stack overflow is reported too. */
static void on_fault(int sig, siginfo_t *si, void *uctx)
{
    uintptr_t addr = (uintptr_t)si->si_addr;
    char what[512] = "", at[640] = "", line[1400];
    bool ours = cudasim_exec_fault_what(addr, what, sizeof(what));

    if (!ours) {
        for (const auto &it : allocs) {
            const alloc &a = it.second;
            uintptr_t g = (uintptr_t)guard_of(a);
            if (addr >= g && addr < g + PAGE) {
                snprintf(what, sizeof(what),
                         "%zu byte(s) beyond the last byte of a %zu-byte allocation at %p",
                         (size_t)(addr - ((uintptr_t)a.ptr + a.size)) + 1, a.size, (void *)a.ptr);
                ours = true;
            } else if (addr >= (uintptr_t)a.map && addr < (uintptr_t)a.map + PAGE) {
                snprintf(what, sizeof(what), "%zu byte(s) before a %zu-byte allocation at %p",
                         (size_t)((uintptr_t)a.ptr - addr), a.size, (void *)a.ptr);
                ours = true;
            }
            if (ours)
                break;
        }
    }
    if (!ours)
        for (const alloc &a : freed)
            if (addr >= (uintptr_t)a.map && addr < (uintptr_t)a.map + a.len) {
                snprintf(what, sizeof(what),
                         "inside a %zu-byte allocation at %p that was freed (use after free)",
                         a.size, (void *)a.ptr);
                ours = true;
                break;
            }
    bool in_kernel = cudasim_exec_where(at, sizeof(at));
    if (ours || in_kernel) {
        snprintf(line, sizeof(line), "cudasim: invalid access to %p: %s; in %s\n", (void *)addr,
                 ours ? what
                      : "not memory of the simulated device (a host pointer or a wild "
                        "address)",
                 in_kernel ? at : "host code");
        say(line);
    }
    struct sigaction *old = sig == SIGBUS ? &old_bus : &old_segv;
    if (!(old->sa_flags & SA_SIGINFO) &&
        (old->sa_handler == SIG_DFL || old->sa_handler == SIG_IGN)) {
        signal(sig, SIG_DFL);
        return; /* the access faults again, with the default action */
    }
    if (old->sa_flags & SA_SIGINFO)
        old->sa_sigaction(sig, si, uctx);
    else
        old->sa_handler(sig);
}

void cudasim_fault_setup(void)
{
    static std::once_flag once;
    static thread_local bool alt_done;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
    });
    if (!alt_done) {
        stack_t ss, old;
        if (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE)) {
            alt_done = true;
            return;
        }
        ss.ss_size = 64 << 10;
        ss.ss_sp =
            mmap(NULL, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ss.ss_flags = 0;
        if (ss.ss_sp != MAP_FAILED && sigaltstack(&ss, NULL) == 0)
            alt_done = true;
    }
}

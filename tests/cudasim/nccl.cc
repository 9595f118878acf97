/* cudasim's NCCL: the subset kernels/coll/coll_nccl.c calls, for ranks that are processes of this
 * machine, behind NVIDIA's own nccl.h. Every call runs to completion inside itself (the sim's
 * streams are synchronous and its device pointers are host pointers), except a collective on a
 * deferred stream (CUDASIM_ASYNC=1): its checks run in the call, the collective itself when the
 * stream's queue runs (an error then becomes the communicator's asynchronous error).
 *
 * ncclGetUniqueId creates a POSIX shared-memory segment and writes its name into the id; each
 * rank maps it in ncclCommInitRank (the last to join unlinks the name; a world of one needs no
 * segment). A collective moves its data through one staging slot per rank in steps of
 * SLOT_BYTES: every rank copies its part into its slot, all meet at a barrier, every rank reads
 * what it needs from the slots, all meet again. Reductions run over ranks 0..n-1 in that order
 * in fp32 (bf16 rounded once at the end; fp64 in fp64), so every rank gets the same bits.
 *
 * A waiting rank gives up, instead of hanging, when a peer process is gone (exited, killed,
 * a zombie) or left the communicator, when another rank gave up, or after
 * CUDASIM_NCCL_TIMEOUT_MS (default 600000): the call returns ncclRemoteError (a peer) or
 * ncclSystemError (the timeout), ncclCommGetAsyncError reports the same from then on, and the
 * rank's failure makes the others give up at once. */
#include <nccl.h>

#include <atomic>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "banned.h"

/* The sim's runtime (runtime.cc) says which device this process set and whether a stream
 * defers its work; linked without it (the library's own test), the device is 0 and every
 * stream is synchronous. */
#pragma weak cudaGetDevice
bool cudasim_stream_deferred(cudaStream_t s) __attribute__((weak));
void cudasim_stream_submit(cudaStream_t s, std::function<void()> fn) __attribute__((weak));
void cudasim_drain_all(void) __attribute__((weak));
void cudasim_stream_hang(const void *owner, const char *what) __attribute__((weak));
void cudasim_stream_release(const void *owner) __attribute__((weak));

static bool deferred(cudaStream_t s)
{
    return &cudasim_stream_deferred && cudasim_stream_deferred(s);
}

/* Communicators not yet freed: a collective queued on a deferred stream runs only while its
 * communicator lives (ncclCommAbort drops the work queued for it). */
static std::mutex live_mu;
static std::set<const void *> live_comms;

static bool comm_live(const void *c)
{
    std::lock_guard<std::mutex> lock(live_mu);
    return live_comms.count(c) != 0;
}

#define MAX_RANKS          64        /* ranks a segment has room for */
#define SLOT_BYTES         (1 << 20) /* staging bytes per rank per step of a collective */
#define HEADER_SIZE        65536     /* the segment's header, before the slots (page multiple) */
#define POLL_MS            10        /* how often a waiting rank looks at its peers */
#define TIMEOUT_MS_DEFAULT 600000
#define SEG_MAGIC          0x6e63636cu /* "nccl" */
#define SEG_VERSION        1
#define ID_MAGIC           "cudasim-nccl-id" /* the id's first bytes; its name follows */
#define ID_NAME_OFF        16

/* ---- the shared segment ---------------------------------------------------------------- */

enum rank_state : uint32_t {
    RANK_ABSENT = 0,
    RANK_JOINED = 1,
    RANK_LEFT = 2,    /* ncclCommDestroy */
    RANK_ABORTED = 3, /* ncclCommAbort, or gave up */
};

enum coll_kind : uint32_t {
    COLL_ALLREDUCE = 1,
    COLL_REDUCE,
    COLL_BROADCAST,
    COLL_REDUCESCATTER,
    COLL_ALLGATHER,
};

/* What a rank asked for: every rank must ask for the same, checked at the first barrier. */
struct op_desc {
    uint32_t kind, dtype, op;
    int32_t root;
    uint64_t count, seq;
};

struct seg_rank {
    std::atomic<int32_t> pid; /* 0 until the rank joins */
    std::atomic<uint32_t> state;
    op_desc op;
};

struct seg_header {
    uint32_t magic, version;
    std::atomic<int32_t> nranks; /* 0 until the first rank joins */
    std::atomic<int32_t> joined;
    std::atomic<uint32_t> arrived; /* the barrier's count ... */
    std::atomic<uint32_t> gen;     /* ... and generation (the futex word) */
    std::atomic<int32_t> failed;   /* 1 + the rank that gave up first, 0 while all is well */
    seg_rank ranks[MAX_RANKS];
};
static_assert(sizeof(seg_header) <= HEADER_SIZE, "segment header too large");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

#define SEG_SIZE ((size_t)HEADER_SIZE + (size_t)MAX_RANKS * SLOT_BYTES)

struct ncclComm {
    int nranks, rank, device;
    bool blocking, finalized;
    long timeout_ms;
    uint64_t seq;
    ncclResult_t async_error;
    seg_header *seg; /* NULL for a world of one */
    char *slots;     /* the segment's slots, or a private one for a world of one */
};

static thread_local char last_error[256];
static thread_local int group_depth;

/* The text ncclGetLastError returns; returns `r` so that callers can `return fail(...)`. */
__attribute__((format(printf, 2, 3))) static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    if (getenv("CUDASIM_VERBOSE"))
        fprintf(stderr, "cudasim: nccl: %s\n", last_error);
    return r;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long timeout_from_env(void)
{
    const char *s = getenv("CUDASIM_NCCL_TIMEOUT_MS");
    char *end;
    if (!s || !*s)
        return TIMEOUT_MS_DEFAULT;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v <= 0)
        return TIMEOUT_MS_DEFAULT;
    return v;
}

/* Gone: no such process, or a zombie (exited, not yet reaped: kill() still finds it). */
static bool pid_gone(pid_t pid)
{
    char path[64], buf[512];
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return true;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static void futex_wait(std::atomic<uint32_t> *word, uint32_t val, long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(std::atomic<uint32_t> *word)
{
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* This rank gives up: the others stop waiting for it at once. Returns `r`. */
static ncclResult_t give_up(ncclComm *c, ncclResult_t r)
{
    if (c->seg) {
        int32_t none = 0;
        c->seg->failed.compare_exchange_strong(none, c->rank + 1);
        c->seg->ranks[c->rank].state.store(RANK_ABORTED);
        futex_wake_all(&c->seg->gen);
    }
    if (c->async_error == ncclSuccess)
        c->async_error = r;
    return r;
}

/* Why a waiting rank must stop waiting, or ncclSuccess while every peer may still come. */
static ncclResult_t check_peers(ncclComm *c, const char *what)
{
    seg_header *s = c->seg;
    int32_t f = s->failed.load();
    if (f && f - 1 != c->rank)
        return fail(ncclRemoteError, "%s: rank %d gave up (see its error)", what, f - 1);
    for (int r = 0; r < c->nranks; r++) {
        if (r == c->rank)
            continue;
        uint32_t st = s->ranks[r].state.load();
        pid_t pid = s->ranks[r].pid.load();
        if (st == RANK_LEFT || st == RANK_ABORTED)
            return fail(ncclRemoteError, "%s: rank %d (pid %d) %s the communicator", what, r,
                        (int)pid, st == RANK_LEFT ? "left" : "aborted");
        if (pid && pid_gone(pid))
            return fail(ncclRemoteError, "%s: rank %d (pid %d) exited", what, r, (int)pid);
    }
    return ncclSuccess;
}

/* All ranks meet. A generation barrier: the last to arrive resets the count and bumps the
 * generation the others wait on. */
static ncclResult_t barrier(ncclComm *c, const char *what)
{
    seg_header *s = c->seg;
    if (!s)
        return ncclSuccess;
    uint32_t g = s->gen.load(std::memory_order_acquire);
    int32_t f = s->failed.load();
    ncclResult_t r;
    /* A rank that gave up will not come: stop before waiting. (Whether a peer process is gone
     * is only looked at while waiting, which is when it matters.) */
    if (f && f - 1 != c->rank)
        return give_up(c,
                       fail(ncclRemoteError, "%s: rank %d gave up (see its error)", what, f - 1));
    if (s->arrived.fetch_add(1, std::memory_order_acq_rel) == (uint32_t)c->nranks - 1) {
        s->arrived.store(0, std::memory_order_relaxed);
        s->gen.fetch_add(1, std::memory_order_release);
        futex_wake_all(&s->gen);
        return ncclSuccess;
    }
    long deadline = now_ms() + c->timeout_ms;
    for (;;) {
        futex_wait(&s->gen, g, POLL_MS);
        /* The generation first: peers that passed this barrier may have left since. */
        if (s->gen.load(std::memory_order_acquire) != g)
            return ncclSuccess;
        if ((r = check_peers(c, what)) != ncclSuccess)
            return give_up(c, r);
        if (now_ms() >= deadline)
            return give_up(c, fail(ncclSystemError,
                                   "%s: rank %d waited %ld ms for its peers "
                                   "(CUDASIM_NCCL_TIMEOUT_MS)",
                                   what, c->rank, c->timeout_ms));
    }
}

/* ---- ids and communicators -------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static std::atomic<unsigned> counter;
    char name[NCCL_UNIQUE_ID_BYTES - ID_NAME_OFF];
    uint32_t rnd = 0;
    void *p = MAP_FAILED;
    int fd = -1;
    ncclResult_t ret = ncclSystemError;

    if (!uniqueId)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        rnd = (uint32_t)now_ms();
    snprintf(name, sizeof(name), "/cudasim-nccl-%d-%u-%08x", (int)getpid(), counter++, rnd);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fail(ret, "ncclGetUniqueId: cannot create '%s': %s", name, strerror(errno));
        goto out;
    }
    /* Sparse: only the slots of the ranks that join take memory. */
    if (ftruncate(fd, (off_t)SEG_SIZE) < 0 ||
        (p = mmap(NULL, HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        fail(ret, "ncclGetUniqueId: cannot size or map '%s': %s", name, strerror(errno));
        shm_unlink(name);
        goto out;
    }
    {
        seg_header *s = new (p) seg_header{};
        s->magic = SEG_MAGIC;
        s->version = SEG_VERSION;
    }
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, ID_MAGIC, sizeof(ID_MAGIC));
    memcpy(uniqueId->internal + ID_NAME_OFF, name, strlen(name) + 1);
    ret = ncclSuccess;
out:
    if (p != MAP_FAILED)
        munmap(p, HEADER_SIZE);
    if (fd >= 0)
        close(fd);
    return ret;
}

/* Maps the id's segment and takes this rank's place in it; the last rank to join unlinks the
 * name. On failure nothing stays mapped. */
static ncclResult_t join(ncclComm *c, const char *name)
{
    const char *what = "ncclCommInitRank";
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    struct stat st;
    void *p = MAP_FAILED;
    ncclResult_t ret;

    if (fd < 0)
        return fail(ncclInvalidArgument,
                    "%s: cannot open '%s' (an id from ncclGetUniqueId, used once): %s", what, name,
                    strerror(errno));
    if (fstat(fd, &st) < 0 || (size_t)st.st_size != SEG_SIZE) {
        ret = fail(ncclInvalidArgument, "%s: '%s' is not a cudasim NCCL segment", what, name);
        goto out;
    }
    /* Reserve this rank's slot now: a full /dev/shm is an error here, not a SIGBUS later. */
    if ((errno = posix_fallocate(fd, HEADER_SIZE + (off_t)c->rank * SLOT_BYTES, SLOT_BYTES))) {
        ret = fail(ncclSystemError, "%s: cannot reserve %d bytes in '%s': %s", what, SLOT_BYTES,
                   name, strerror(errno));
        goto out;
    }
    p = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        ret = fail(ncclSystemError, "%s: cannot map '%s': %s", what, name, strerror(errno));
        goto out;
    }
    c->seg = static_cast<seg_header *>(p);
    if (c->seg->magic != SEG_MAGIC || c->seg->version != SEG_VERSION) {
        ret = fail(ncclInvalidArgument, "%s: '%s' is not a cudasim NCCL segment", what, name);
        goto out;
    }
    {
        int32_t expect = 0;
        if (!c->seg->nranks.compare_exchange_strong(expect, c->nranks) && expect != c->nranks) {
            ret = fail(ncclInvalidArgument, "%s: nranks %d, but rank 0..%d joined with %d", what,
                       c->nranks, c->nranks - 1, expect);
            goto out;
        }
        expect = 0;
        if (!c->seg->ranks[c->rank].pid.compare_exchange_strong(expect, (int32_t)getpid())) {
            ret = fail(ncclInvalidArgument, "%s: rank %d already joined (pid %d)", what, c->rank,
                       expect);
            goto out;
        }
    }
    c->seg->ranks[c->rank].state.store(RANK_JOINED);
    if (c->seg->joined.fetch_add(1) + 1 == c->nranks)
        shm_unlink(name);
    c->slots = static_cast<char *>(p) + HEADER_SIZE;
    close(fd);
    return ncclSuccess;
out:
    if (p != MAP_FAILED)
        munmap(p, SEG_SIZE);
    c->seg = NULL;
    close(fd);
    return ret;
}

static void comm_free(ncclComm *c)
{
    {
        std::lock_guard<std::mutex> lock(live_mu);
        live_comms.erase(c);
    }
    if (c->seg)
        munmap(c->seg, SEG_SIZE);
    else
        free(c->slots);
    free(c);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    const char *what = "ncclCommInitRank";
    char name[NCCL_UNIQUE_ID_BYTES - ID_NAME_OFF];
    ncclComm *c = NULL;
    ncclResult_t ret;

    if (!comm)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d of %d (the sim takes 1 to %d ranks)", what,
                    rank, nranks, MAX_RANKS);
    if (config && (config->magic != 0xcafebeef || config->size < sizeof(ncclConfig_t)))
        return fail(ncclInvalidArgument, "%s: config not set from NCCL_CONFIG_INITIALIZER", what);
    if (memcmp(commId.internal, ID_MAGIC, sizeof(ID_MAGIC)) ||
        !memchr(commId.internal + ID_NAME_OFF, '\0', sizeof(name)))
        return fail(ncclInvalidArgument, "%s: id not from ncclGetUniqueId", what);
    memcpy(name, commId.internal + ID_NAME_OFF, sizeof(name));

    c = static_cast<ncclComm *>(calloc(1, sizeof(*c)));
    if (!c)
        return fail(ncclSystemError, "%s: out of memory", what);
    c->nranks = nranks;
    c->rank = rank;
    c->blocking = !(config && config->blocking == 0);
    c->timeout_ms = timeout_from_env();
    if (&cudaGetDevice && cudaGetDevice(&c->device) != cudaSuccess)
        c->device = 0;
    if (nranks == 1) {
        shm_unlink(name);
        if (!(c->slots = static_cast<char *>(malloc(SLOT_BYTES)))) {
            free(c);
            return fail(ncclSystemError, "%s: out of memory", what);
        }
    } else {
        if ((ret = join(c, name)) != ncclSuccess) {
            free(c);
            return ret;
        }
        /* Init is collective: it returns once every rank has joined. */
        if ((ret = barrier(c, what)) != ncclSuccess) {
            shm_unlink(name);
            comm_free(c);
            return ret;
        }
    }
    {
        std::lock_guard<std::mutex> lock(live_mu);
        live_comms.insert(c);
    }
    *comm = c;
    /* Non-blocking init answers "in progress" and lets ncclCommGetAsyncError say when it is
     * done, which here is already. */
    return c->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    *asyncError = comm->async_error;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    /* Finalizing completes the communicator's queued operations. */
    if (&cudasim_drain_all)
        cudasim_drain_all();
    comm->finalized = true;
    return ncclSuccess;
}

/* Leaves the segment as `state`: peers still waiting for this rank stop waiting. */
static ncclResult_t comm_leave(ncclComm_t comm, rank_state state)
{
    if (!comm)
        return ncclSuccess;
    if (comm->seg) {
        comm->seg->ranks[comm->rank].state.store(state);
        futex_wake_all(&comm->seg->gen);
    }
    comm_free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm && &cudasim_drain_all)
        cudasim_drain_all();
    return comm_leave(comm, RANK_LEFT);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm && &cudasim_stream_release)
        cudasim_stream_release(comm);
    if (comm && comm->seg) {
        int32_t none = 0;
        comm->seg->failed.compare_exchange_strong(none, comm->rank + 1);
    }
    return comm_leave(comm, RANK_ABORTED);
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

/* Calls inside a group already ran (each is synchronous here): the group only has to match. */
ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    group_depth--;
    return ncclSuccess;
}

/* ---- reductions ------------------------------------------------------------------------- */

static size_t dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round to nearest even; NaN stays a (quiet) NaN of the same sign. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* How each type is loaded into its accumulator and stored back: bf16 adds in fp32 and rounds
 * once; integers add modulo 2^bits (unsigned arithmetic, as the hardware does). */
template <typename T> struct acc_of {
    typedef T type;
    static T load(const void *p, size_t i)
    {
        T v;
        memcpy(&v, (const char *)p + i * sizeof(T), sizeof(T));
        return v;
    }
    static void store(void *p, size_t i, T v)
    {
        memcpy((char *)p + i * sizeof(T), &v, sizeof(T));
    }
};
struct bf16_tag {
};
template <> struct acc_of<bf16_tag> {
    typedef float type;
    static float load(const void *p, size_t i)
    {
        return bf16_to_f32(((const uint16_t *)p)[i]);
    }
    static void store(void *p, size_t i, float v)
    {
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    }
};

template <typename A> static A red_sum(A a, A b)
{
    return a + b;
}
template <> int32_t red_sum(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a + (uint32_t)b);
}
template <> int64_t red_sum(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}
template <> int8_t red_sum(int8_t a, int8_t b)
{
    return (int8_t)(uint8_t)((uint8_t)a + (uint8_t)b);
}
template <> uint8_t red_sum(uint8_t a, uint8_t b)
{
    return (uint8_t)(a + b);
}

template <typename A> static A red_prod(A a, A b)
{
    return a * b;
}
template <> int32_t red_prod(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a * (uint32_t)b);
}
template <> int64_t red_prod(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a * (uint64_t)b);
}
template <> int8_t red_prod(int8_t a, int8_t b)
{
    return (int8_t)(uint8_t)((unsigned)(uint8_t)a * (unsigned)(uint8_t)b);
}
template <> uint8_t red_prod(uint8_t a, uint8_t b)
{
    return (uint8_t)((unsigned)a * (unsigned)b);
}

/* Max and min keep a NaN once one is seen. */
template <typename A> static bool is_nan(A a)
{
    return a != a;
}
template <typename A> static A red_max(A a, A b)
{
    return is_nan(a) ? a : (is_nan(b) || b > a) ? b : a;
}
template <typename A> static A red_min(A a, A b)
{
    return is_nan(a) ? a : (is_nan(b) || b < a) ? b : a;
}

/* out[i] = in[0][i] op in[1][i] op ... in[n-1][i], in rank order; avg is the sum divided by n
 * in the accumulator's type. */
template <typename T>
static void reduce_run(void *out, const char *const *in, int n, size_t len, ncclRedOp_t op)
{
    typedef acc_of<T> io;
    typedef typename io::type A;
    for (size_t i = 0; i < len; i++) {
        A a = io::load(in[0], i);
        for (int r = 1; r < n; r++) {
            A b = io::load(in[r], i);
            switch (op) {
            case ncclProd:
                a = red_prod<A>(a, b);
                break;
            case ncclMax:
                a = red_max<A>(a, b);
                break;
            case ncclMin:
                a = red_min<A>(a, b);
                break;
            default:
                a = red_sum<A>(a, b);
                break;
            }
        }
        if (op == ncclAvg)
            a = (A)(a / (A)n);
        io::store(out, i, a);
    }
}

/* Which types reduce here: NCCL's types but fp16 and fp8. */
static bool reducible(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64:
    case ncclFloat32:
    case ncclFloat64:
    case ncclBfloat16:
        return true;
    default:
        return false;
    }
}

static void reduce(void *out, const char *const *in, int n, size_t len, ncclDataType_t t,
                   ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8:
        reduce_run<int8_t>(out, in, n, len, op);
        break;
    case ncclUint8:
        reduce_run<uint8_t>(out, in, n, len, op);
        break;
    case ncclInt32:
        reduce_run<int32_t>(out, in, n, len, op);
        break;
    case ncclUint32:
        reduce_run<uint32_t>(out, in, n, len, op);
        break;
    case ncclInt64:
        reduce_run<int64_t>(out, in, n, len, op);
        break;
    case ncclUint64:
        reduce_run<uint64_t>(out, in, n, len, op);
        break;
    case ncclFloat32:
        reduce_run<float>(out, in, n, len, op);
        break;
    case ncclFloat64:
        reduce_run<double>(out, in, n, len, op);
        break;
    default:
        reduce_run<bf16_tag>(out, in, n, len, op);
        break;
    }
}

/* ---- collectives ------------------------------------------------------------------------ */

struct coll {
    op_desc op;
    const char *what;
    const void *send;
    void *recv;
    size_t esize;
};

static const char *kind_name(uint32_t k)
{
    static const char *const names[] = {
        "?", "ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclReduceScatter", "ncclAllGather"};
    return k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}

static char *slot(ncclComm *c, int r)
{
    return c->slots + (size_t)r * SLOT_BYTES;
}

/* After the first barrier: every rank asked for the same collective. */
static ncclResult_t check_same(ncclComm *c, const coll *k)
{
    if (!c->seg)
        return ncclSuccess;
    for (int r = 0; r < c->nranks; r++) {
        const op_desc *o = &c->seg->ranks[r].op;
        if (memcmp(o, &k->op, sizeof(*o)))
            return give_up(c,
                           fail(ncclInvalidUsage,
                                "%s (call %llu, count %llu, type %u, op %u, root %d) on rank "
                                "%d, but %s (call %llu, count %llu, type %u, op %u, root %d) "
                                "on rank %d",
                                k->what, (unsigned long long)k->op.seq,
                                (unsigned long long)k->op.count, k->op.dtype, k->op.op, k->op.root,
                                c->rank, kind_name(o->kind), (unsigned long long)o->seq,
                                (unsigned long long)o->count, o->dtype, o->op, o->root, r));
    }
    return ncclSuccess;
}

/* One step: elements [off, off + len) of each rank's part. Stages this rank's data in its slot
 * (called before the barrier). */
static void stage(ncclComm *c, const coll *k, size_t off, size_t len)
{
    const char *send = static_cast<const char *>(k->send);
    char *mine = slot(c, c->rank);
    size_t es = k->esize, count = k->op.count;

    switch (k->op.kind) {
    case COLL_REDUCESCATTER:
        /* block j of the send buffer goes to rank j: its piece is at j * len in the slot */
        for (int j = 0; j < c->nranks; j++)
            memcpy(mine + (size_t)j * len * es, send + ((size_t)j * count + off) * es, len * es);
        break;
    case COLL_BROADCAST:
        if (c->rank == k->op.root)
            memcpy(mine, send + off * es, len * es);
        break;
    default:
        memcpy(mine, send + off * es, len * es);
        break;
    }
}

/* Reads the slots into this rank's receive buffer (called between the barriers). */
static void consume(ncclComm *c, const coll *k, size_t off, size_t len)
{
    const char *in[MAX_RANKS];
    char *recv = static_cast<char *>(k->recv);
    size_t es = k->esize, count = k->op.count;
    ncclDataType_t t = (ncclDataType_t)k->op.dtype;
    ncclRedOp_t op = (ncclRedOp_t)k->op.op;

    switch (k->op.kind) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE:
        if (k->op.kind == COLL_REDUCE && c->rank != k->op.root)
            break;
        for (int r = 0; r < c->nranks; r++)
            in[r] = slot(c, r);
        reduce(recv + off * es, in, c->nranks, len, t, op);
        break;
    case COLL_REDUCESCATTER:
        for (int r = 0; r < c->nranks; r++)
            in[r] = slot(c, r) + (size_t)c->rank * len * es;
        reduce(recv + off * es, in, c->nranks, len, t, op);
        break;
    case COLL_ALLGATHER:
        for (int r = 0; r < c->nranks; r++)
            memcpy(recv + ((size_t)r * count + off) * es, slot(c, r), len * es);
        break;
    case COLL_BROADCAST:
        memmove(recv + off * es, slot(c, k->op.root), len * es);
        break;
    }
}

static ncclResult_t coll_run(ncclComm *c, coll *k)
{
    size_t per_step = SLOT_BYTES / k->esize;
    ncclResult_t r;

    if (k->op.kind == COLL_REDUCESCATTER)
        per_step /= (size_t)c->nranks;
    k->op.seq = ++c->seq;
    if (c->seg)
        c->seg->ranks[c->rank].op = k->op;
    for (size_t off = 0; off < k->op.count; off += per_step) {
        size_t len = k->op.count - off < per_step ? k->op.count - off : per_step;
        stage(c, k, off, len);
        if ((r = barrier(c, k->what)) != ncclSuccess)
            return r;
        if (off == 0 && (r = check_same(c, k)) != ncclSuccess)
            return r;
        consume(c, k, off, len);
        if ((r = barrier(c, k->what)) != ncclSuccess)
            return r;
    }
    return ncclSuccess;
}

/* The checks NCCL makes before it enqueues anything, then the collective: now, or queued on a
 * deferred stream. */
static ncclResult_t coll_start(ncclComm *c, coll *k, bool reduces, bool recv_needed,
                               cudaStream_t stream)
{
    ncclDataType_t t = (ncclDataType_t)k->op.dtype;
    ncclRedOp_t op = (ncclRedOp_t)k->op.op;

    if (!c)
        return fail(ncclInvalidArgument, "%s: comm is NULL", k->what);
    if (c->async_error != ncclSuccess)
        return fail(c->async_error, "%s: the communicator already failed (%s)", k->what,
                    ncclGetErrorString(c->async_error));
    if (c->finalized)
        return fail(ncclInvalidUsage, "%s: the communicator is finalized", k->what);
    if (!(k->esize = dtype_size(t)))
        return fail(ncclInvalidArgument, "%s: unknown datatype %d", k->what, (int)t);
    if (reduces && (op < ncclSum || op > ncclAvg))
        return fail(ncclInvalidArgument, "%s: unknown reduction %d", k->what, (int)op);
    if (reduces && !reducible(t))
        return fail(ncclInvalidArgument, "%s: the sim does not reduce datatype %d", k->what,
                    (int)t);
    if (k->op.root < 0 || k->op.root >= c->nranks)
        return fail(ncclInvalidArgument, "%s: root %d of %d ranks", k->what, k->op.root, c->nranks);
    if (k->op.count && ((!k->send && (k->op.kind != COLL_BROADCAST || c->rank == k->op.root)) ||
                        (!k->recv && recv_needed)))
        return fail(ncclInvalidArgument, "%s: NULL buffer", k->what);
    if (k->op.count == 0)
        return ncclSuccess;
    if (!deferred(stream))
        return coll_run(c, k);
    coll q = *k;
    cudasim_stream_submit(stream, [c, q]() mutable {
        if (!comm_live(c) || c->async_error != ncclSuccess)
            return;
        ncclResult_t r = coll_run(c, &q);
        if (r != ncclSuccess && c->async_error == ncclSuccess)
            c->async_error = r;
        /* On a GPU the collective's kernel waits for its peers until ncclCommAbort. */
        if (r != ncclSuccess && &cudasim_stream_hang)
            cudasim_stream_hang(c, q.what);
    });
    return ncclSuccess;
}

static coll coll_make(const char *what, uint32_t kind, const void *send, void *recv, size_t count,
                      ncclDataType_t t, ncclRedOp_t op, int root)
{
    coll k = {};
    k.what = what;
    k.op.kind = kind;
    k.op.dtype = (uint32_t)t;
    k.op.op = (uint32_t)op;
    k.op.root = root;
    k.op.count = count;
    k.send = send;
    k.recv = recv;
    return k;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    coll k = coll_make("ncclAllReduce", COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0);
    return coll_start(comm, &k, true, true, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    coll k = coll_make("ncclReduce", COLL_REDUCE, sendbuff, recvbuff, count, datatype, op, root);
    return coll_start(comm, &k, true, comm && comm->rank == root, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    coll k = coll_make("ncclBroadcast", COLL_BROADCAST, sendbuff, recvbuff, count, datatype,
                       ncclSum, root);
    return coll_start(comm, &k, false, true, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    coll k = coll_make("ncclReduceScatter", COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                       datatype, op, 0);
    return coll_start(comm, &k, true, true, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    coll k = coll_make("ncclAllGather", COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                       ncclSum, 0);
    return coll_start(comm, &k, false, true, stream);
}

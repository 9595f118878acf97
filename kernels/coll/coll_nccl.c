/* The nccl backend of the collectives (coll.h): one NCCL communicator per coll, set up
 * through the rank library's store; every NCCL call is made on a non-blocking communicator and
 * then watched (NCCL's asynchronous error, the stream, the timeout), so that a dead or stuck
 * peer ends in an error and an aborted communicator, never in a hang. Host-memory operations
 * go through a pinned host buffer and a device buffer in pieces. Built with GPURUN_NCCL (where
 * nccl.h is found); without it the backend only says so. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GPURUN_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>
#endif

#include "coll.h"
#include "coll_backend.h"
#include "gr.h"
#include "monotime.h"
#include "banned.h"

#ifndef GPURUN_NCCL

static int nccl_open(struct coll *c, struct gr *g)
{
    (void)g;
    coll_set_err(c, "nccl: built without NCCL");
    return -ENOTSUP;
}

const struct coll_backend coll_nccl_backend = {
    .name = "nccl",
    .alone = true,
    .open = nccl_open,
};

#else

/* Host operations move their data in pieces of this size through a pinned host buffer and a
 * device buffer of the same size: a broadcast of all the parameters needs no device buffer of
 * its size, and at 4 MiB a piece's fixed costs (two copies and a collective queued, one wait:
 * tens of microseconds) stay small against its transfer. A multiple of 8: whole elements. */
#define STAGE_BYTES   (4u << 20)
/* How long coll_close lets the communicator finish its work before aborting it: close is not
 * collective, and a peer that is gone must not keep a rank from exiting. */
#define CLOSE_WAIT_MS 10000
/* Waiting: yields for the first POLL_SPIN_MS (small operations take microseconds), then
 * sleeps of POLL_SLEEP_US, short against an allreduce of gradients (milliseconds). */
#define POLL_SPIN_MS  2
#define POLL_SLEEP_US 50
/* The store value of the id: 2 hex digits a byte, or "error: " and rank 0's message. */
#define ID_VALUE_MAX  320

struct nccl {
    ncclComm_t comm; /* NULL before the set-up and once aborted */
    cudaStream_t stream;
    void *dev_stage;
    void *host_stage;
    int device;
};

static struct nccl *state(struct coll *c)
{
    return *coll_state(c);
}

/* One pause of a wait that began at start. */
static void pause_since(int64_t start)
{
    struct timespec ts = {0, POLL_SLEEP_US * 1000L};

    if (monotime_ms() - start < POLL_SPIN_MS)
        sched_yield();
    else
        nanosleep(&ts, NULL);
}

/* A timeout in words: "600 s", "1500 ms". */
static const char *duration(int ms, char *buf, size_t cap)
{
    if (ms % 1000 == 0)
        snprintf(buf, cap, "%d s", ms / 1000);
    else
        snprintf(buf, cap, "%d ms", ms);
    return buf;
}

static int errno_of(ncclResult_t r)
{
    switch (r) {
    case ncclRemoteError:
        return -ECONNRESET;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return -EINVAL;
    default:
        return -EIO;
    }
}

/* NCCL's words for r, with the details of its last error when it has some. */
static const char *nccl_why(ncclComm_t comm, ncclResult_t r, char *buf, size_t cap)
{
    const char *last = ncclGetLastError(comm);

    if (last && *last)
        snprintf(buf, cap, "%s (%s)", ncclGetErrorString(r), last);
    else
        snprintf(buf, cap, "%s", ncclGetErrorString(r));
    return buf;
}

static void abort_comm(struct nccl *st)
{
    if (st->comm)
        ncclCommAbort(st->comm);
    st->comm = NULL;
}

/* Ends an operation in failure: aborts the communicator (its kernels stop, the peers see it go
 * or time out) and breaks the collectives with err and the message "nccl WHAT: WHY:
 * communicator aborted". */
static int op_fail(struct coll *c, int err, const char *what, const char *why)
{
    coll_set_err(c, "nccl %s: %s: communicator aborted", what, why);
    abort_comm(state(c));
    return coll_fail(c, err);
}

static int op_fail_nccl(struct coll *c, const char *what, ncclResult_t r)
{
    char why[256];

    return op_fail(c, errno_of(r), what, nccl_why(state(c)->comm, r, why, sizeof(why)));
}

/* Waits until the communicator has taken the call that returned r (a non-blocking
 * communicator answers ncclInProgress while it is still queueing; nothing else may be queued
 * on its stream before it is done) or fails. deadline in monotime_ms() time. */
static int settle(struct coll *c, const char *what, ncclResult_t r, int64_t start, int64_t deadline)
{
    struct nccl *st = state(c);
    char why[64], d[32];

    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(st->comm, &r) != ncclSuccess)
            r = ncclInternalError;
        if (r != ncclInProgress)
            break;
        if (monotime_ms() >= deadline) {
            snprintf(why, sizeof(why), "not queued within %s",
                     duration(coll_timeout_ms(c), d, sizeof(d)));
            return op_fail(c, -ETIMEDOUT, what, why);
        }
        pause_since(start);
    }
    if (r != ncclSuccess)
        return op_fail_nccl(c, what, r);
    return 0;
}

/* Waits until stream has run everything queued on it, watching NCCL's asynchronous error (a
 * peer's failure) and the deadline. */
static int finish(struct coll *c, const char *what, cudaStream_t stream, int64_t start,
                  int64_t deadline)
{
    struct nccl *st = state(c);
    ncclResult_t ae;
    cudaError_t q;
    char why[64], d[32];

    for (;;) {
        if (ncclCommGetAsyncError(st->comm, &ae) != ncclSuccess)
            ae = ncclInternalError;
        if (ae != ncclSuccess && ae != ncclInProgress)
            return op_fail_nccl(c, what, ae);
        q = cudaStreamQuery(stream);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady) {
            cudaGetLastError();
            return op_fail(c, -EIO, what, cudaGetErrorString(q));
        }
        if (monotime_ms() >= deadline) {
            snprintf(why, sizeof(why), "no completion within %s",
                     duration(coll_timeout_ms(c), d, sizeof(d)));
            return op_fail(c, -ETIMEDOUT, what, why);
        }
        pause_since(start);
    }
}

/* A device operation: r is what the NCCL call that queued it on stream returned. */
static int watch(struct coll *c, const char *what, cudaStream_t stream, ncclResult_t r)
{
    int64_t start = monotime_ms(), deadline = start + coll_timeout_ms(c);
    int ret = settle(c, what, r, start, deadline);

    return ret < 0 ? ret : finish(c, what, stream, start, deadline);
}

static ncclDataType_t nccl_type(enum coll_dtype dt)
{
    return dt == COLL_BF16 ? ncclBfloat16 : ncclFloat32;
}

static const char *type_name(enum coll_dtype dt)
{
    return dt == COLL_BF16 ? "bf16" : "f32";
}

/* --- device memory ---------------------------------------------------------------------------- */

static int nccl_dev_allreduce_avg(struct coll *c, void *buf, size_t n, enum coll_dtype dt,
                                  void *stream)
{
    struct nccl *st = state(c);
    char what[96];

    snprintf(what, sizeof(what), "allreduce of %zu %s", n, type_name(dt));
    return watch(c, what, stream,
                 ncclAllReduce(buf, buf, n, nccl_type(dt), ncclAvg, st->comm, stream));
}

static int nccl_dev_reduce_scatter_avg(struct coll *c, const void *send, void *recv, size_t count,
                                       enum coll_dtype dt, void *stream)
{
    struct nccl *st = state(c);
    char what[96];

    snprintf(what, sizeof(what), "reduce-scatter of %zu %s per rank", count, type_name(dt));
    return watch(c, what, stream,
                 ncclReduceScatter(send, recv, count, nccl_type(dt), ncclAvg, st->comm, stream));
}

static int nccl_dev_all_gather(struct coll *c, const void *send, void *recv, size_t count,
                               enum coll_dtype dt, void *stream)
{
    struct nccl *st = state(c);
    char what[96];

    snprintf(what, sizeof(what), "all-gather of %zu %s per rank", count, type_name(dt));
    return watch(c, what, stream,
                 ncclAllGather(send, recv, count, nccl_type(dt), st->comm, stream));
}

/* --- host memory, through the staging buffers ------------------------------------------------ */

/* Queues a copy between the staging buffers on the coll's stream. */
static int stage_copy(struct coll *c, const char *what, bool to_device, size_t bytes)
{
    struct nccl *st = state(c);
    cudaError_t e = to_device ? cudaMemcpyAsync(st->dev_stage, st->host_stage, bytes,
                                                cudaMemcpyHostToDevice, st->stream)
                              : cudaMemcpyAsync(st->host_stage, st->dev_stage, bytes,
                                                cudaMemcpyDeviceToHost, st->stream);

    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return op_fail(c, -EIO, what, cudaGetErrorString(e));
}

static int nccl_allreduce(struct coll *c, void *buf, size_t n, enum coll_host_type t)
{
    struct nccl *st = state(c);
    bool f64 = t == COLL_HOST_F64;
    size_t elem = f64 ? sizeof(double) : sizeof(float), per = STAGE_BYTES / elem;
    char what[96];
    int ret;

    snprintf(what, sizeof(what), "allreduce of %zu %s in host memory", n, f64 ? "f64" : "f32");
    for (size_t off = 0; off < n; off += per) {
        size_t k = n - off < per ? n - off : per;
        int64_t start = monotime_ms(), deadline = start + coll_timeout_ms(c);
        ncclResult_t r;

        memcpy(st->host_stage, (char *)buf + off * elem, k * elem);
        if ((ret = stage_copy(c, what, true, k * elem)) < 0)
            return ret;
        r = ncclAllReduce(st->dev_stage, st->dev_stage, k, f64 ? ncclFloat64 : ncclFloat32, ncclSum,
                          st->comm, st->stream);
        if ((ret = settle(c, what, r, start, deadline)) < 0 ||
            (ret = stage_copy(c, what, false, k * elem)) < 0 ||
            (ret = finish(c, what, st->stream, start, deadline)) < 0)
            return ret;
        memcpy((char *)buf + off * elem, st->host_stage, k * elem);
    }
    return 0;
}

static int nccl_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    struct nccl *st = state(c);
    bool me = coll_rank(c) == root;
    char what[96];
    int ret;

    snprintf(what, sizeof(what), "broadcast of %zu bytes in host memory from rank %d", bytes, root);
    for (size_t off = 0; off < bytes; off += STAGE_BYTES) {
        size_t k = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        int64_t start = monotime_ms(), deadline = start + coll_timeout_ms(c);
        ncclResult_t r;

        if (me) {
            memcpy(st->host_stage, (char *)buf + off, k);
            if ((ret = stage_copy(c, what, true, k)) < 0)
                return ret;
        }
        r = ncclBroadcast(st->dev_stage, st->dev_stage, k, ncclUint8, root, st->comm, st->stream);
        if ((ret = settle(c, what, r, start, deadline)) < 0 ||
            (!me && (ret = stage_copy(c, what, false, k)) < 0) ||
            (ret = finish(c, what, st->stream, start, deadline)) < 0)
            return ret;
        if (!me)
            memcpy((char *)buf + off, st->host_stage, k);
    }
    return 0;
}

/* --- set-up ----------------------------------------------------------------------------------- */

/* The device part of the set-up: a device, the stream and staging buffers on it. */
static int open_device(struct coll *c, struct nccl *st)
{
    const char *what = NULL;
    cudaError_t e;
    int n = 0;

    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        /* No device, or no driver at all: the plain line; another reason is worth saying. */
        if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
            coll_set_err(c, "nccl: no CUDA device available");
        else
            coll_set_err(c, "nccl: no CUDA device available: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return -ENODEV;
    }
    if ((e = cudaGetDevice(&st->device)) != cudaSuccess)
        what = "cudaGetDevice";
    else if ((e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreateWithFlags";
    else if ((e = cudaMalloc(&st->dev_stage, STAGE_BYTES)) != cudaSuccess)
        what = "cudaMalloc of the staging buffer";
    else if ((e = cudaMallocHost(&st->host_stage, STAGE_BYTES)) != cudaSuccess)
        what = "cudaMallocHost of the staging buffer";
    if (!what)
        return 0;
    coll_set_err(c, "nccl: cannot set up CUDA device %d: %s failed: %s", st->device, what,
                 cudaGetErrorString(e));
    cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* Rank 0's id, or its failure, for the others: "coll/<seq>/nccl_id" holds the id in hex, or
 * "error: " and what went wrong (id NULL), so that the others fail at once instead of
 * waiting. Returns 0 or the store's error. */
static int publish_id(struct coll *c, struct gr *g, const char *key, const ncclUniqueId *id)
{
    char value[ID_VALUE_MAX], *v = value;
    int ret;

    if (id) {
        for (size_t i = 0; i < sizeof(id->internal); i++)
            v += snprintf(v, 3, "%02x", (unsigned char)id->internal[i]);
    } else {
        const char *why = coll_strerror(c);
        snprintf(value, sizeof(value), "error: %s", why + (strncmp(why, "nccl: ", 6) ? 0 : 6));
    }
    ret = gr_kv_put(g, key, value, strlen(value));
    if (ret < 0 && id)
        coll_set_err(c, "nccl: cannot publish '%s': %s", key, gr_strerror(g));
    return ret;
}

static int read_id(struct coll *c, struct gr *g, const char *key, ncclUniqueId *id, int wait_ms)
{
    char value[ID_VALUE_MAX];
    size_t len = 0;
    int ret = gr_kv_get(g, key, value, sizeof(value) - 1, &len, wait_ms);

    if (ret < 0) {
        coll_set_err(c, "nccl: cannot read rank 0's id '%s': %s", key, gr_strerror(g));
        return ret;
    }
    value[len] = '\0';
    if (!strncmp(value, "error: ", 7)) {
        coll_set_err(c, "nccl: rank 0 could not set up: %s", value + 7);
        return -ECONNABORTED;
    }
    if (len != 2 * sizeof(id->internal)) {
        coll_set_err(c, "nccl: rank 0's id '%s' is %zu bytes, not %zu", key, len,
                     2 * sizeof(id->internal));
        return -EPROTO;
    }
    for (size_t i = 0; i < sizeof(id->internal); i++) {
        unsigned b;
        if (sscanf(value + 2 * i, "%2x", &b) != 1) {
            coll_set_err(c, "nccl: rank 0's id '%s' is not hex", key);
            return -EPROTO;
        }
        id->internal[i] = (char)b;
    }
    return 0;
}

/* After a failed set-up: the ranks that never reached ncclCommInitRankConfig (each publishes
 * "coll/<seq>/nccl_join/<rank>" before it does), as "rank 3" or "ranks 2, 3" in out; "" when
 * every rank did (or there is no store). */
static void missing_ranks(struct coll *c, struct gr *g, unsigned seq, char *out, size_t cap)
{
    char key[64], list[96] = "";
    size_t len = 0, vlen;
    int missing = 0;

    for (int r = 0; g && coll_world_size(c) > 1 && r < coll_world_size(c); r++) {
        snprintf(key, sizeof(key), "coll/%u/nccl_join/%d", seq, r);
        if (gr_kv_get(g, key, NULL, 0, &vlen, 0) != -ENOENT)
            continue;
        if (missing < 8 && len < sizeof(list))
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", missing ? ", " : "", r);
        missing++;
    }
    out[0] = '\0';
    if (missing)
        snprintf(out, cap, "rank%s %s%s", missing > 1 ? "s" : "", list, missing > 8 ? ", ..." : "");
}

static int nccl_open(struct coll *c, struct gr *g)
{
    struct nccl *st = calloc(1, sizeof(*st));
    int rank = coll_rank(c), world = coll_world_size(c), version = 0, ret = -1;
    int timeout_ms = coll_timeout_ms(c);
    int64_t start = monotime_ms(), deadline = start + timeout_ms, left;
    unsigned seq = coll_next_seq(g);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    struct cudaDeviceProp prop;
    ncclUniqueId id;
    ncclResult_t r;
    bool shared = world == 1;
    char key[64], why[256], missing[128] = "", d[32];

    if (!st) {
        coll_set_err(c, "nccl: out of memory");
        return -ENOMEM;
    }
    *coll_state(c) = st;
    snprintf(key, sizeof(key), "coll/%u/nccl_id", seq);
    if ((ret = open_device(c, st)) < 0)
        goto out;
    if (rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        coll_set_err(c, "nccl: cannot create the communicator's id: %s",
                     nccl_why(NULL, r, why, sizeof(why)));
        ret = errno_of(r);
        goto out;
    }
    if (world > 1 && rank == 0) {
        if ((ret = publish_id(c, g, key, &id)) < 0)
            goto out;
        shared = true;
    } else if (world > 1) {
        shared = true;
        left = deadline - monotime_ms();
        if ((ret = read_id(c, g, key, &id, left > 1 ? (int)left : 1)) < 0)
            goto out;
    }
    if (world > 1) {
        snprintf(key, sizeof(key), "coll/%u/nccl_join/%d", seq, rank);
        gr_kv_put(g, key, "1", 1);
    }
    /* Non-blocking: the call returns at once and the set-up goes on inside NCCL while this
     * thread watches the clock. */
    config.blocking = 0;
    r = ncclCommInitRankConfig(&st->comm, world, id, rank, &config);
    while (r == ncclInProgress && monotime_ms() < deadline) {
        pause_since(start);
        if (ncclCommGetAsyncError(st->comm, &r) != ncclSuccess)
            r = ncclInternalError;
    }
    if (r != ncclSuccess)
        missing_ranks(c, g, seq, missing, sizeof(missing));
    if (r == ncclInProgress && missing[0])
        coll_set_err(c, "nccl: %s did not join within %s", missing,
                     duration(timeout_ms, d, sizeof(d)));
    else if (r == ncclInProgress)
        coll_set_err(c, "nccl: the communicator of %d ranks was not ready within %s", world,
                     duration(timeout_ms, d, sizeof(d)));
    else if (r != ncclSuccess)
        coll_set_err(c, "nccl: cannot create the communicator of %d ranks%s%s%s: %s", world,
                     missing[0] ? " (" : "", missing, missing[0] ? " did not join)" : "",
                     nccl_why(st->comm, r, why, sizeof(why)));
    if (r != ncclSuccess) {
        abort_comm(st);
        ret = r == ncclInProgress ? -ETIMEDOUT : errno_of(r);
        goto out;
    }
    ncclGetVersion(&version);
    if (cudaGetDeviceProperties(&prop, st->device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(prop.name, sizeof(prop.name), "?");
    }
    if (world == 1)
        coll_set_describe(c, "nccl: one rank on CUDA device %d (%s), NCCL %d.%d.%d", st->device,
                          prop.name, version / 10000, version / 100 % 100, version % 100);
    else
        coll_set_describe(c, "nccl: %d ranks, rank %d on CUDA device %d (%s), NCCL %d.%d.%d", world,
                          rank, st->device, prop.name, version / 10000, version / 100 % 100,
                          version % 100);
    ret = 0;
out:
    /* Rank 0 failed before the others could have its id: they hear it at once. */
    if (ret < 0 && !shared && rank == 0 && world > 1)
        publish_id(c, g, key, NULL);
    return ret;
}

static void nccl_close(struct coll *c)
{
    struct nccl *st = state(c);
    ncclResult_t r, ae;
    int64_t start = monotime_ms();

    if (!st)
        return;
    if (st->comm) {
        /* Finalize lets queued work end; then Destroy frees without waiting. A communicator
         * that does not get there in time is aborted instead. */
        r = ae = ncclCommFinalize(st->comm);
        while (ae == ncclInProgress && monotime_ms() - start < CLOSE_WAIT_MS) {
            pause_since(start);
            if (ncclCommGetAsyncError(st->comm, &ae) != ncclSuccess)
                ae = ncclInternalError;
        }
        if ((r == ncclSuccess || r == ncclInProgress) && ae == ncclSuccess)
            ncclCommDestroy(st->comm);
        else
            ncclCommAbort(st->comm);
        st->comm = NULL;
    }
    if (st->host_stage)
        cudaFreeHost(st->host_stage);
    if (st->dev_stage)
        cudaFree(st->dev_stage);
    if (st->stream)
        cudaStreamDestroy(st->stream);
    cudaGetLastError();
    free(st);
    *coll_state(c) = NULL;
}

const struct coll_backend coll_nccl_backend = {
    .name = "nccl",
    .alone = true,
    .open = nccl_open,
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .close = nccl_close,
    .dev_allreduce_avg = nccl_dev_allreduce_avg,
    .dev_reduce_scatter_avg = nccl_dev_reduce_scatter_avg,
    .dev_all_gather = nccl_dev_all_gather,
};

#endif

/* Collectives between the ranks of a job: the data-parallel training's allreduce of gradients,
 * broadcast of initial state and barrier, behind one backend-neutral interface.
 *
 * Backends (the name given to coll_open):
 *   "single"  a job of one rank; every operation is a no-op.
 *   "tcp"     a ring over TCP between the ranks, for CPU training on any cluster. Each rank
 *             listens on its node's address (GPURUN_NODE_ADDR, the address the node's agent
 *             reaches the leader from; else the interface that routes to MASTER_ADDR; else
 *             127.0.0.1), publishes "host port token" under the store key
 *             "coll/<seq>/addr/<rank>" (lib/rank/gr.h), connects to rank+1 and accepts rank-1.
 *             seq counts the coll_open calls of the process in its generation
 *             (gr_generation), so every rank must open its collectives in the same order. A
 * connection presents the token its acceptor published, so that only a rank that read the job's
 * store can join the ring. A link between two ranks of one machine (the same kernel boot_id, and
 * the ring's file in /dev/shm visible to both) moves its data through a shared-memory ring instead,
 * with only wake-ups over its TCP connection: no kernel copies. GPURUN_COLL_SHM=0 in the
 * environment keeps every link on TCP. With one rank, no socket is opened. "nccl"    NVIDIA's NCCL
 * between the ranks' GPUs, one GPU per rank: the device that is current on the calling thread when
 * coll_open runs (the caller made it current, e.g. with gpu_ctx_new) is the rank's. Rank 0 draws
 * the ncclUniqueId and publishes it (hex) under the store key "coll/<seq>/nccl_id" (the same <seq>
 * as tcp); the others read it from there. A world of one is a real communicator of one rank (g may
 * be NULL then: no store is needed) and its operations run through NCCL like any other. Besides the
 * host-memory operations below (staged through a device buffer in chunks) it has the coll_dev_*
 * operations on device memory. Without a CUDA device coll_open fails with -ENODEV, "nccl: no CUDA
 * device available"; in a build without NCCL with -ENOTSUP, "nccl: built without NCCL".
 *
 * The tcp backend's allreduce takes the buffer in parts of W x COLL_RING_SEGMENT_BYTES for
 * W ranks (the last may be shorter), one after the other without a pause, and each part is a ring
 * reduce-scatter followed by a ring all-gather: each rank sends and receives 2(W-1)/W of it,
 * in pieces, sending a piece on while the next is still arriving. In a part of m elements,
 * segment k is elements [k*(m/W) + min(k, m%W), ...) (m/W of them, one more for the first
 * m%W), and each of its elements is rank k's value, to which ranks k+1, k+2, ... k+W-1 (mod
 * W) add theirs in turn. So the order of the additions depends only on the element count, its
 * type and the world size: the result is bitwise the same on every rank, whichever links
 * carry it, and the same from run to run for the same inputs. Every operation is collective: all
 * ranks call it in the same order with the same sizes (and root), or the ring fails with -EPROTO or
 * runs into the timeout.
 *
 * Errors are negative errno values, with coll_strerror() saying what and where: -ECONNRESET
 * when a peer closed its connection or died ("rank 2 (10.0.0.3:40123) closed the connection
 * during allreduce"), -ETIMEDOUT when a peer sent nothing for the timeout, -EPROTO for bytes
 * that do not belong to this ring. After a transport error the ring is closed (its neighbours
 * see the failure at once) and every later call returns the same error; only coll_close() is
 * left to do. Calls retry what a signal interrupts and never raise SIGPIPE.
 *
 * The nccl backend never hangs either: its set-up and every operation are queued without
 * blocking and then watched, NCCL's asynchronous error polled, against the timeout (set-up:
 * COLL_TIMEOUT_MS_DEFAULT; operations: coll_set_timeout). An NCCL error (-ECONNRESET for
 * NCCL's remote error, -EINVAL for an invalid argument or usage, -EIO otherwise), a CUDA error
 * of the stream (-EIO) or no completion within the timeout (-ETIMEDOUT) aborts the
 * communicator (ncclCommAbort): the collectives are broken as above, and coll_strerror says
 * which operation and why ("nccl allreduce of 124439808 bf16: no completion within 600 s:
 * communicator aborted").
 *
 * Thread context: a struct coll is used by one thread at a time; calls block until the
 * operation is complete on this rank. With nccl, that thread has the rank's device current. */
#ifndef GPURUN_COLL_H
#define GPURUN_COLL_H

#include <stddef.h>

#include "errmsg.h"

struct coll;
struct gr;

/* How long a rank waits for a peer that sends nothing, by default: long enough for a rank that
 * is writing a checkpoint or evaluating while the others wait in the next allreduce; a peer
 * that dies is seen at once, not after the timeout. */
#define COLL_TIMEOUT_MS_DEFAULT (10 * 60 * 1000)

/* A part of the buffer, which the tcp backend's allreduce reduces and gathers at a time
 * (above), is this many bytes per rank: what one step of the ring moves, and a part's data
 * is still in the cache when a rank passes on what it added. Against one reduce-scatter and
 * all-gather of the whole buffer, 1.2-1.3x at 64-256 MiB through shared memory and 1.7-1.9x
 * over loopback TCP with 2 ranks (bench/allreduce.sh). A multiple of 8. */
#define COLL_RING_SEGMENT_BYTES (512 * 1024)

/* Opens the collectives of this rank with the backend named (see above). g (borrowed: used
 * only during this call) is the rank library's handle, whose
 * rank and world size the collectives take; g may be NULL for a job of one rank (rank 0 of 1).
 * Blocks until the ring is connected (every rank must call it), waiting up to
 * COLL_TIMEOUT_MS_DEFAULT for the others. On success *out is new (the caller ends it with
 * coll_close); on failure *out is NULL, err (the caller's; may be NULL) holds the message and
 * the return is -EINVAL for an unknown backend or "single" with more than one rank, the
 * store's error (gr.h), -ETIMEDOUT, -ECONNREFUSED, -EPROTO or another socket error; for nccl
 * also -ENODEV (no CUDA device), -ENOTSUP (built without NCCL), -ENOMEM, -EIO (a CUDA or NCCL
 * failure) and -ETIMEDOUT ("nccl: rank 3 did not join within 600 s"). */
int coll_open(const char *backend, struct gr *g, struct coll **out, struct errmsg *err);

/* This rank's place, as coll_open found it. */
int coll_rank(const struct coll *c);
int coll_world_size(const struct coll *c);

/* The backend's name ("single", "tcp", "nccl"; borrowed static storage). */
const char *coll_backend(const struct coll *c);

/* What the collectives run on, in words, for a log line (borrowed: valid until coll_close):
 * "tcp ring of 4 ranks: to rank 1 (10.0.0.2:41234) over shared memory, from rank 3
 * (10.0.0.4:40112) over tcp", "nccl: 8 ranks, rank 0 on CUDA device 0 (NVIDIA H100 80GB
 * HBM3), NCCL 2.28.9". */
const char *coll_describe(const struct coll *c);

/* How long a call waits for a peer that sends nothing (ms > 0), from the next call on; with
 * nccl, how long an operation may take before it is given up on. */
void coll_set_timeout(struct coll *c, int timeout_ms);

/* Replaces each of the n elements of buf (borrowed; n may be 0) by its sum over all ranks. */
int coll_allreduce_sum_f32(struct coll *c, float *buf, size_t n);

/* The same, then divided by the world size: the mean over ranks. */
int coll_allreduce_avg_f32(struct coll *c, float *buf, size_t n);

/* The sum of doubles, for small vectors such as the loss and metric sums of a step. */
int coll_allreduce_sum_f64(struct coll *c, double *buf, size_t n);

/* Copies the bytes bytes of root's buf into buf on every other rank. -EINVAL for a root out of
 * range (on the rank that sees it; the others then fail or time out). */
int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root);

/* Returns once every rank has called coll_barrier. */
int coll_barrier(struct coll *c);

/* --- device memory (nccl only) ------------------------------------------------------------
 *
 * Collectives on buffers in the memory of the rank's GPU, for the CUDA training backend. Every
 * pointer is a device pointer (borrowed for the call); stream is the cudaStream_t (void * so
 * that this header needs no CUDA header) the operation is queued on, after the work already
 * queued there; NULL is the legacy default stream. The call returns once the operation (and
 * so everything queued before it on stream) is complete, or with the error that broke the
 * collectives (see above). A count of 0 queues nothing and returns 0. Every rank calls each
 * operation in the same order with the same count and dtype, or the ranks wait until
 * the timeout. The other backends return -ENOTSUP (with a message) and stay usable; a dtype
 * other than these, or a NULL buffer with a count, is -EINVAL.
 *
 * Averages are NCCL's ncclAvg, whose rounding is NCCL's: it may scale each rank's value by
 * 1/world before adding, and round bf16 partial sums to bf16 between the steps of its
 * algorithm, so a result may differ in its last bits from the sum divided by the world size
 * (an allreduce still gives the same bits on every rank). Values that are each the world size
 * times a small integer come out exact. */
enum coll_dtype {
    COLL_F32,
    COLL_BF16,
};

/* Replaces each of the n elements of buf by its mean over all ranks. */
int coll_dev_allreduce_avg(struct coll *c, void *buf, size_t n, enum coll_dtype dt, void *stream);

/* send holds count * world elements; the mean over all ranks of block r (elements
 * [r * count, (r + 1) * count)) lands in rank r's recv (count elements). In place when
 * recv == send + r * count (in elements); otherwise send and recv must not overlap. */
int coll_dev_reduce_scatter_avg(struct coll *c, const void *send, void *recv, size_t count,
                                enum coll_dtype dt, void *stream);

/* Every rank's send (count elements) lands at recv + r * count on every rank (recv holds
 * count * world elements). In place when send == recv + r * count. */
int coll_dev_all_gather(struct coll *c, const void *send, void *recv, size_t count,
                        enum coll_dtype dt, void *stream);

/* Closes the connections and frees c (c may be NULL). Not collective: a rank may close while
 * the others still run, and they see it as a closed connection in their next operation. nccl
 * lets the communicator finish its queued work for up to 10 s (ncclCommFinalize), then frees
 * it, or aborts it when it did not finish. */
void coll_close(struct coll *c);

/* The text of c's last failure, or "" (borrowed: valid until the next call on c). */
const char *coll_strerror(const struct coll *c);

#endif

/* The CUDA backend's ops, callable from C: a device context (stream, cuBLASLt handle,
 * workspace), device memory helpers and one host launcher per op of kernels/ops.h. The CPU op
 * of the same name is the reference: each launcher computes the same maths on the same
 * row-major layouts (ops.h states them), with the differences said below.
 *
 * Storage: every tensor an op reads or writes as "floatX" is in the launcher's dtype, fp32 or
 * bf16 (bfloat16, round to nearest even on store); all arithmetic is fp32 (matmuls accumulate
 * in fp32), and the buffers marked fp32 below are fp32 in both modes (LayerNorm's mean and
 * rstd, the cross-entropy's losses and lse, the attention's lse, AdamW's master weights and
 * moments). Device pointers unless a parameter says host.
 *
 * Errors: a launcher checks its shapes (-EINVAL), queues its kernels on the context's stream
 * and checks cudaGetLastError() (-EIO); on failure gpu_ctx_error() says what failed in one
 * lowercase line. Kernels run asynchronously: a fault inside one surfaces at the next
 * gpu_ctx_sync, download or launch. Results are deterministic: our kernels use no atomics
 * and add every sum in a fixed order for a given shape; cuBLASLt's products repeat bit for bit
 * on GPUs of the same architecture and number of SMs, with the same toolkit and one stream
 * (NVIDIA's documented guarantee for cuBLAS: an H100 PCIe and an H100 SXM may differ).
 *
 * Thread context: one host thread drives a context (it makes the context's device current at
 * gpu_ctx_new and the launchers do not switch devices).
 *
 * Builds without nvcc (GPURUN_CUDA undefined) get gpu_device_count and gpu_require_device
 * only, answering that there is no CUDA backend. */
#ifndef GPURUN_KERNELS_CUDA_OPS_H
#define GPURUN_KERNELS_CUDA_OPS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../optim.h"
#include "errmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef GPURUN_CUDA

/* Without the CUDA backend: no device. */
static inline int gpu_device_count(void)
{
    return 0;
}

static inline int gpu_require_device(struct errmsg *err)
{
    return errmsg_set(err, -ENOTSUP,
                      "no CUDA device available: built without the CUDA backend (no nvcc)");
}

#else

/* The number of CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 when there is
 * none, no driver, or the runtime cannot start. Never fails. */
int gpu_device_count(void);

/* Returns 0 when at least one device is usable; else -ENODEV and err reads "no
 * CUDA device available", followed by ": <why>" when the runtime gave a reason other than no
 * device or no driver (a driver older than the runtime, for instance). gpurun-train prints it
 * and exits 1 for train.device = cuda. */
int gpu_require_device(struct errmsg *err);

/* Element storage of a launcher's floatX tensors. */
enum gpu_dtype {
    GPU_F32,
    GPU_BF16,
};

/* Bytes per element of dt (4 or 2). */
size_t gpu_dtype_size(enum gpu_dtype dt);

/* ---- context and memory -------------------------------------------------------------------- */

struct gpu_ctx;

/* Makes device `device` current for the calling thread and sets up a context on it: a
 * non-blocking stream, a cuBLASLt handle and a 32 MiB matmul workspace. Returns a new context
 * (free with gpu_ctx_free), or NULL with err saying why. */
struct gpu_ctx *gpu_ctx_new(int device, struct errmsg *err);
/* Waits for the stream and frees ctx and what it owns; NULL is a no-op. */
void gpu_ctx_free(struct gpu_ctx *ctx);
/* The last failure's message; "" before any. Borrowed: valid until the next call on ctx. */
const char *gpu_ctx_error(const struct gpu_ctx *ctx);
/* The context's stream, a cudaStream_t (for NCCL and events). Borrowed: valid while ctx. */
void *gpu_ctx_stream(struct gpu_ctx *ctx);
/* Whether matmuls use cuBLASLt's bias and GELU epilogues (default true). With false, or when
 * cuBLASLt offers no algorithm for an epilogue, the matmul runs plain and a kernel of ours
 * adds the bias and applies GELU or its gradient (the tests compare both paths). */
void gpu_ctx_set_fusion(struct gpu_ctx *ctx, bool on);
/* Which bf16 attention the launchers use (fp32 always runs attention.cu's own kernels):
 *  - GPU_ATT_AUTO (the default): cuDNN's fused flash attention where cuDNN 9 loads and
 *    supports the shape on this GPU (attention_cudnn.h), else attention_tc.cu's kernels;
 *  - GPU_ATT_CUDNN: cuDNN's or a failure (-ENOTSUP, gpu_ctx_error saying why);
 *  - GPU_ATT_CUDNN_FAST: the same, its backward free to sum dq with atomics: faster, and
 *    the one exception to the backend's bit-for-bit repeatability;
 *  - GPU_ATT_OWN: attention_tc.cu's kernels. */
enum gpu_attention { GPU_ATT_AUTO, GPU_ATT_CUDNN, GPU_ATT_CUDNN_FAST, GPU_ATT_OWN };
void gpu_ctx_set_attention(struct gpu_ctx *ctx, enum gpu_attention a);
/* What the bf16 attention of ctx is, in words for a start-up line: "cuDNN 9.19.0 fused flash
 * attention", or "own kernels" with why cuDNN is not used. Sets cuDNN up when it is not yet. */
void gpu_ctx_attention_describe(struct gpu_ctx *ctx, char *buf, size_t len);
/* Waits until the stream has run everything queued. Returns 0 or -EIO (an asynchronous fault
 * of a kernel, named by gpu_ctx_error). */
int gpu_ctx_sync(struct gpu_ctx *ctx);
/* A count that changes whenever ctx replaces a device buffer its launchers use on their own
 * (the scratch, cuDNN's workspace): a graph recorded under another count would read freed
 * memory. */
uint64_t gpu_ctx_buffers_generation(const struct gpu_ctx *ctx);

/* CUDA graphs of ctx's stream: between gpu_graph_begin and gpu_graph_end the launchers record
 * their work instead of running it, and gpu_graph_end turns the recording into a graph that
 * gpu_graph_launch queues, as often as asked, with the recording's arguments and pointers (one
 * launch in place of each of its kernels' launches). A call that waits for the device (a
 * download, a sync, a scratch that must grow, gpu_encoder_backward) or allocates fails during
 * a recording, and gpu_graph_end then fails too (-ENOTSUP, saying so): recordings are of work
 * whose buffers are already allocated. Each returns 0 or a negative errno with gpu_ctx_error
 * set. */
struct gpu_graph;
int gpu_graph_begin(struct gpu_ctx *ctx);
int gpu_graph_end(struct gpu_ctx *ctx, struct gpu_graph **g);
int gpu_graph_launch(struct gpu_ctx *ctx, struct gpu_graph *g);
/* Frees g (NULL: nothing); a launch still queued completes. */
void gpu_graph_free(struct gpu_graph *g);

/* Device allocation of `bytes` (256-byte aligned) into *p. Returns 0 or -ENOMEM. Free with
 * gpu_free. */
int gpu_alloc(struct gpu_ctx *ctx, void **p, size_t bytes);
/* Frees a gpu_alloc buffer after the device is done with it (waits); NULL is a no-op. */
void gpu_free(struct gpu_ctx *ctx, void *p);
/* Synchronous copies between host memory (any, pageable) and device memory, ordered after
 * the stream's earlier work. Return 0 or -EIO. */
int gpu_upload(struct gpu_ctx *ctx, void *dst, const void *src, size_t bytes);
int gpu_download(struct gpu_ctx *ctx, void *dst, const void *src, size_t bytes);
/* Sets `bytes` bytes at dst to `byte` (asynchronous). 0xff makes fp32 and bf16 NaNs (the
 * tests poison outputs with it). Returns 0 or -EIO. */
int gpu_fill_bytes(struct gpu_ctx *ctx, void *dst, int byte, size_t bytes);
/* dst[i] = src[i] for n elements, converting between dtypes (fp32 to bf16 rounds to nearest
 * even; NaN stays NaN). dst and src must not overlap unless they are the same buffer of the
 * same dtype. Returns 0 or -EIO. */
int gpu_convert(struct gpu_ctx *ctx, enum gpu_dtype dst_dt, void *dst, enum gpu_dtype src_dt,
                const void *src, size_t n);

/* ---- ops (kernels/ops.h's maths; floatX in dt) --------------------------------------------- */

/* Encoder: out (B,T,C) floatX = wte[inp] + wpe[t]; inp (B,T) int on the device. */
int gpu_encoder_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, const int *inp,
                        const void *wte, const void *wpe, int B, int T, int C);
/* dwte (V,C) and dwpe (T,C) floatX accumulate dout (B,T,C) floatX; inp_host (B,T) is the same
 * tokens in HOST memory (borrowed for the call), each in [0, V) (-EINVAL otherwise): the
 * launcher groups the positions by token on the host so that each row of dwte is summed by
 * one thread in position order (deterministic, no atomics). Synchronises the stream once. */
int gpu_encoder_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dwte, void *dwpe,
                         const void *dout, const int *inp_host, int B, int T, int C, int V);

/* LayerNorm over N rows of C: out floatX; mean, rstd fp32 (N), each may be NULL when not
 * needed (evaluation); inp, weight, bias floatX. */
int gpu_layernorm_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, float *mean,
                          float *rstd, const void *inp, const void *weight, const void *bias, int N,
                          int C);
/* The residual add fused in front of the LayerNorm: residual = a + b (stored in floatX), then
 * out = LayerNorm(residual) as above, from the stored (rounded) values. residual may be a or
 * b; out must not overlap the others. */
int gpu_residual_layernorm_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *residual,
                                   void *out, float *mean, float *rstd, const void *a,
                                   const void *b, const void *weight, const void *bias, int N,
                                   int C);
/* dinp, dweight, dbias floatX all accumulate, as in ops_layernorm_backward; mean and rstd
 * fp32 from the forward. dinp must not overlap dout, inp or weight. */
int gpu_layernorm_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dinp, void *dweight,
                           void *dbias, const void *dout, const void *inp, const void *weight,
                           const float *mean, const float *rstd, int N, int C);

/* Matmul through cuBLASLt (fp32 accumulation; fp32 mode is full fp32, not TF32):
 * out (N,OC) = inp (N,C) weight(OC,C)^T + bias (OC, may be NULL). With pre_gelu non-NULL,
 * pre_gelu (N,OC) receives that result and out = gelu(pre_gelu) (GELU's tanh form, as
 * ops_gelu_forward); out must not overlap pre_gelu. C and OC must be multiples of 8 (rows of
 * 16 or 32 bytes, what cuBLASLt's fast kernels and epilogues need). */
int gpu_matmul_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, void *pre_gelu,
                       const void *inp, const void *weight, const void *bias, int N, int C, int OC);
/* As ops_matmul_backward: dinp (N,C) overwritten (NULL: skipped), dweight (OC,C) and dbias (OC,
 * NULL: skipped) accumulate. With pre_gelu (N,C) non-NULL, inp = gelu(pre_gelu) was this
 * matmul's input and dinp receives the gradient with respect to pre_gelu instead:
 * dinp = (dout weight) * gelu'(pre_gelu), as ops_gelu_backward after ops_matmul_backward. */
int gpu_matmul_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dinp, void *dweight,
                        void *dbias, const void *dout, const void *inp, const void *weight,
                        const void *pre_gelu, int N, int C, int OC);

/* Causal attention, flash style: no (T,T) matrix in memory; each query row keeps a running
 * max and sum (online softmax) over tiles of keys. out (B,T,C) floatX; lse (B,NH,T) fp32
 * receives each row's log-sum-exp of the scaled scores, log sum_t2 exp(q.k[t2] / sqrt(hs)),
 * which the backward uses in place of ops' att. Head size C/NH at most 128. */
int gpu_attention_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, float *lse,
                          const void *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) floatX overwritten, from dout (B,T,C), the forward's qkv, out and lse (the
 * probabilities are recomputed from lse). dqkv must not overlap the inputs. */
int gpu_attention_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dqkv, const void *dout,
                           const void *qkv, const void *out, const float *lse, int B, int T, int C,
                           int NH);

/* Softmax + cross-entropy over the first V of each row's Vp logits (floatX): losses and lse
 * fp32 (N), targets int (N) on the device. One pass over each row (a running max and sum). A
 * target outside [0, V) gives a NaN loss. */
int gpu_crossentropy_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, float *losses, float *lse,
                             const void *logits, const int *targets, int N, int V, int Vp);
/* Forward and backward in one kernel, the training step's form: losses and lse as the
 * forward, then the logits (N,Vp) are overwritten in place by their gradient as in
 * ops_crossentropy_backward (0 in the padding). Each row is read twice and written once; the
 * probabilities are never stored. */
int gpu_crossentropy_fused(struct gpu_ctx *ctx, enum gpu_dtype dt, float *losses, float *lse,
                           void *logits, const int *targets, int N, int V, int Vp, float dloss);

/* ---- optimizer ------------------------------------------------------------------------------ */

/* One AdamW update with adamw_update's maths, over the n_spans spans (host, borrowed) that
 * cover the buffers (optim.h; decay per span). m, v fp32 (n) and grads floatX. In fp32 mode
 * params (fp32) are updated and master must be NULL; in bf16 mode master (fp32) holds the
 * weights, is updated, and params (bf16) receives its rounding. t is the update's number,
 * from 1 (the CPU's opt->step after its increment); grad_scale carries the clipping factor.
 * Each element is independent: bit-identical for any launch shape. */
int gpu_adamw_update(struct gpu_ctx *ctx, enum gpu_dtype dt, void *params, float *master,
                     const void *grads, float *m, float *v, const struct optim_span *spans,
                     size_t n_spans, const struct adamw_config *cfg, uint64_t t, float lr,
                     float grad_scale);
/* The sum of squares of n floatX gradients into *sumsq (host), summed in double in a fixed
 * order (for a given n): the global L2 norm's square, or a shard's part of it, to be summed
 * across ranks. Synchronises the stream. */
int gpu_sum_squares(struct gpu_ctx *ctx, enum gpu_dtype dt, const void *grads, size_t n,
                    double *sumsq);

#endif /* GPURUN_CUDA */

#ifdef __cplusplus
}
#endif

#endif

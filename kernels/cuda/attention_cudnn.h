/* cuDNN's fused flash attention for attention.cu's bf16 launchers (attention_cudnn.cpp states
 * the layouts, which are cuda_ops.h's). Built where the cuDNN frontend's headers are
 * (GPURUN_CUDNN); cuDNN itself is loaded at run time.
 *
 * Each call returns 0, -ENOTSUP when cuDNN cannot do it here (no libcudnn.so.9, an older
 * cuDNN, no device, a shape or GPU its engines do not support: the caller uses its own
 * kernels), or another negative errno for a failure of a call that was supported (-ENOMEM,
 * -EIO); err then says what in one line. */
#ifndef GPURUN_KERNELS_CUDA_ATTENTION_CUDNN_H
#define GPURUN_KERNELS_CUDA_ATTENTION_CUDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cudnn_att;

/* A cuDNN handle on stream (the calls' launches go there) and an empty graph cache. */
int cudnn_att_new(struct cudnn_att **out, cudaStream_t stream, char *err, size_t errlen);
void cudnn_att_free(struct cudnn_att *a);
/* How many times a's workspace was replaced (a CUDA graph recorded before then reads freed
 * memory). */
uint64_t cudnn_att_generation(const struct cudnn_att *a);
/* The loaded cuDNN's version (e.g. 91900 for 9.19.0), 0 before one is loaded. */
size_t cudnn_att_version(void);
/* As gpu_attention_forward and gpu_attention_backward for GPU_BF16 (cuda_ops.h); the backward
 * bit for bit repeatable where deterministic (else dq is summed with atomics). */
int cudnn_att_forward(struct cudnn_att *a, void *out, float *lse, const void *qkv, int B, int T,
                      int C, int NH, char *err, size_t errlen);
int cudnn_att_backward(struct cudnn_att *a, void *dqkv, const void *dout, const void *qkv,
                       const void *out, const float *lse, int B, int T, int C, int NH,
                       bool deterministic, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

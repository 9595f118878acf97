/* The GPT-2 ops of the CPU backend: each forward with its backward, in fp32 with OpenMP. This
 * is the reference the CUDA kernels are checked against, so every op states its maths and its
 * tensor layout here.
 *
 * Layout: tensors are dense row-major fp32. B is the batch, T the sequence length, C the
 * channels (n_embd), NH the heads (head size hs = C / NH), OC a matmul's output channels, V the
 * vocabulary and Vp the padded vocabulary (the row length of logits). "N rows" means B * T
 * positions flattened. Token ids are int in [0, V).
 *
 * Threads: every op uses the calling thread's OpenMP team size (omp_set_num_threads or
 * OMP_NUM_THREADS) and must not be called from inside a parallel region. Results are
 * bit-identical whatever the number of threads: each output element is computed by one
 * thread in a fixed order (no reduction is split across threads), so a run can be resumed or
 * repeated exactly. They may differ between CPU kinds (the matmuls use FMA and wide vectors
 * where the CPU has them, chosen once at run time).
 *
 * Gradients: "accumulates" means the op adds to the buffer (parameter gradients, so that
 * gradient accumulation works; the caller zeroes them); "overwrites" means it stores. Buffers
 * of one call never overlap unless the comment says they may. */
#ifndef GPURUN_KERNELS_OPS_H
#define GPURUN_KERNELS_OPS_H

#include <stddef.h>

/* LayerNorm's epsilon, GPT-2's value. */
#define OPS_LN_EPS 1e-5f

/* Encoder: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
 * out (B,T,C); inp (B,T); wte (V,C); wpe (maxT,C) with T <= maxT. */
void ops_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                         int T, int C);
/* Accumulates dwte[inp[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:]; rows of dwte
 * whose token does not occur are untouched. */
void ops_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                          int C);

/* LayerNorm over the last axis of N rows of C:
 *   mean = sum_i x_i / C, var = sum_i (x_i - mean)^2 / C (biased), rstd = 1 / sqrt(var + eps),
 *   out_i = (x_i - mean) * rstd * weight_i + bias_i.
 * out, inp (N,C); weight, bias (C); mean, rstd (N) are saved for the backward. */
void ops_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C);
/* With n_i = (x_i - mean) * rstd and g_i = weight_i * dout_i:
 *   dinp_i += rstd * (g_i - mean_j(g_j) - n_i * mean_j(g_j * n_j)),
 *   dweight_i += sum_rows dout_i * n_i, dbias_i += sum_rows dout_i.
 * All three accumulate (the model adds dinp into the residual stream's gradient). */
void ops_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C);

/* Matmul (a linear layer, llm.c's layout): out[n,o] = bias[o] + sum_c inp[n,c] * weight[o,c].
 * out (N,OC); inp (N,C); weight (OC,C), each output channel's weights contiguous; bias (OC)
 * or NULL. Returns 0, or -ENOMEM when its packing buffers cannot be allocated (out is then
 * unspecified). */
int ops_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
/* dinp[n,c] = sum_o dout[n,o] * weight[o,c]           (overwrites; dinp may be NULL)
 * dweight[o,c] += sum_n dout[n,o] * inp[n,c]          (accumulates)
 * dbias[o] += sum_n dout[n,o]                          (accumulates; NULL when no bias)
 * Returns 0 or -ENOMEM (the outputs are then unspecified). */
int ops_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention. qkv (B,T,3C) holds per position q, k and v, each C wide
 * with head h in channels [h*hs, (h+1)*hs). For each b, h and query position t:
 *   s[t2] = (q[t] . k[t2]) / sqrt(hs) for t2 <= t,
 *   att[b,h,t,t2] = softmax_t2(s) for t2 <= t and 0 for t2 > t,
 *   out[b,t,h*hs + d] = sum_t2 att[b,h,t,t2] * v[t2][d].
 * out (B,T,C); att (B,NH,T,T) is saved for the backward. Returns 0 or -ENOMEM. */
int ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* With dP[t,t2] = dout[t] . v[t2] and dS = att * (dP - sum_t2 att * dP) / sqrt(hs) (row-wise):
 *   dq[t] = sum_t2 dS[t,t2] k[t2], dk[t2] = sum_t dS[t,t2] q[t], dv[t2] = sum_t att[t,t2] dout[t].
 * dqkv (B,T,3C) in qkv's layout, overwritten. Returns 0 or -ENOMEM. */
int ops_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH);

/* GELU, tanh approximation: out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * n elements; out may be inp. tanh is evaluated through a vectorisable exp, within 2e-7 of
 * the exact value in absolute terms. */
void ops_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = dout * (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx), overwritten; dinp may be
 * dout (in place). */
void ops_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* The pair the model uses: the forward also stores GELU's derivative at each input,
 * grad = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx (grad may be inp: the pre-activation
 * is not needed afterwards), so that the backward is dinp = dout * grad without a second tanh.
 * Bit for bit the same results as ops_gelu_forward and ops_gelu_backward. dinp may be dout. */
void ops_gelu_forward_grad(float *out, float *grad, const float *inp, size_t n);
void ops_gelu_backward_grad(float *dinp, const float *grad, const float *dout, size_t n);

/* Residual: out = a + b over n elements (out may be a or b). */
void ops_residual_forward(float *out, const float *a, const float *b, size_t n);
/* da += dout, db += dout (accumulates). The model skips this op: the residual stream's
 * gradient buffer is passed straight through. */
void ops_residual_backward(float *da, float *db, const float *dout, size_t n);

/* Softmax + cross-entropy over the first V of each row's Vp logits (padding ignored):
 *   lse[n] = log sum_{j<V} exp(logits[n,j]), losses[n] = lse[n] - logits[n, targets[n]].
 * logits (N,Vp); targets, losses, lse (N). The probabilities are not stored: the backward
 * recomputes them from lse, so that only the logits buffer is needed. */
void ops_crossentropy_forward(float *losses, float *lse, const float *logits, const int *targets,
                              int N, int V, int Vp);
/* dlogits[n,j] = dloss * (exp(logits[n,j] - lse[n]) - [j == targets[n]]) for j < V, and 0 for
 * V <= j < Vp: the gradient of dloss * sum_n losses[n]. Overwrites; dlogits may be logits (in
 * place). */
void ops_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int *targets, int N, int V, int Vp, float dloss);

/* The vectorisable exp the ops use (a Cody-Waite reduction and a degree-5 polynomial, within
 * 2 ulp of expf); inputs are clamped to [-87, 88]. Exposed for the tests. */
float ops_expf(float x);

/* The GEMM micro-kernel in use ("avx512", "avx2" or "generic"); the best one the CPU runs is
 * picked before main(). Borrowed static string. */
const char *ops_matmul_kernel(void);
/* Makes the ops use kernel `name` (tests and benchmarks compare them). Returns 0, -ENOTSUP
 * when this CPU lacks its instructions, -ENOENT for an unknown name. Not thread-safe: call it
 * between ops. */
int ops_matmul_use_kernel(const char *name);

#endif

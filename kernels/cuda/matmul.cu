/* The linear layer on the GPU through cuBLASLt (cuda_ops.h; reference: ops_matmul_forward/
 * backward, with ops_gelu_forward/backward for the fused GELU).
 *
 * Layout (llm.c's): out[n,o] = bias[o] + sum_c inp[n,c] weight[o,c]; inp (N,C), weight (OC,C),
 * out (N,OC), all row-major. cuBLASLt is column-major, and a row-major (R,K) matrix is a
 * column-major (K,R) one, so each product is written on the transposes:
 *   forward   out^T (OC,N)   = weight (OC,C) . inp^T (C,N)      A = weight^T stored, op T
 *   dinp      dinp^T (C,N)   = weight^T (C,OC) . dout^T (OC,N)  no transposes
 *   dweight   dweight^T (C,OC) += inp^T (C,N) . dout (N,OC)     B = dout^T stored, op T
 * fp32 accumulation (CUBLAS_COMPUTE_32F: fp32 mode is true fp32, not TF32), fp32 alpha/beta.
 *
 * Epilogues, where cuBLASLt offers them: the bias (BIAS), bias + GELU keeping the GELU input
 * for the backward (GELU_AUX_BIAS, aux = pre_gelu), and the GELU gradient applied to dinp
 * (DGELU, aux = pre_gelu). Without an algorithm for an epilogue (or with fusion off) the
 * product runs plain and bias_gelu_kernel / gelu_backward do the rest. dbias is a column sum
 * of dout by our own two-stage kernel (fixed order: deterministic), as for LayerNorm. */
#include <errno.h>
#include <stdint.h>

#include "common.cuh"
#include "banned.h"

/* Rows of dout summed by one block of the bias-gradient reduction (see layernorm.cu). */
#define MM_CHUNK 128
#define MM_LANES 8

/* One cuBLASLt product D (m,n) = op(A) op(B) + beta D, column-major, with an epilogue. */
struct lt_call {
    cudaDataType_t type;
    int m, n, k;
    bool transa, transb;
    const void *a, *b;
    void *d;
    int lda, ldb, ldd;
    float beta;
    cublasLtEpilogue_t epilogue;
    const void *bias; /* BIAS epilogues */
    const void *aux;  /* GELU_AUX (written) and DGELU (read) */
    int ldaux;
    void *bgrad; /* BGRADB: op(B)'s column sums (n), D's type, overwritten */
};

/* The largest power of two dividing the address, up to 256: cuBLASLt's heuristics otherwise
 * assume 256-byte aligned operands, and tensors inside the flat parameter buffer are not. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al /= 2;
    return al;
}

/* Returns 0; -ENOTSUP when cuBLASLt has no algorithm for the call or rejects it (nothing
 * ran; with an epilogue, also where the heuristic query calls it an invalid value, as an
 * H200's cuBLASLt 13 does for a BGRADB whose bias gradient is not of D's type); -EIO for any
 * other failure. The bias, bias gradient and aux types are D's (cuBLASLt's default, and what
 * its documentation allows outside the int8 and fp8 kernels). */
static int lt_matmul(struct gpu_ctx *ctx, const char *op, const struct lt_call *c)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int32_t ta = c->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = c->epilogue, al_a = alignment(c->a), al_b = alignment(c->b),
             al_d = alignment(c->d);
    uint64_t ws = GPU_LT_WORKSPACE;
    int64_t ldaux = c->ldaux;
    int found = 0, ret = -EIO;
    float alpha = 1.0f;
    const char *what = NULL;
    cublasStatus_t s;

    if ((s = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)))
        what = "cublasLtMatmulDescCreate";
    else if ((s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                 sizeof(ta))) ||
             (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                 sizeof(tb))) ||
             (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                 sizeof(epi))))
        what = "cublasLtMatmulDescSetAttribute";
    else if (c->bias && (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                            &c->bias, sizeof(c->bias))))
        what = "cublasLtMatmulDescSetAttribute (bias)";
    else if (c->bgrad &&
             (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c->bgrad,
                                                 sizeof(c->bgrad))))
        what = "cublasLtMatmulDescSetAttribute (bias gradient)";
    else if (c->aux &&
             ((s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                  &c->aux, sizeof(c->aux))) ||
              (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &ldaux, sizeof(ldaux)))))
        what = "cublasLtMatmulDescSetAttribute (aux)";
    else if ((s = cublasLtMatrixLayoutCreate(&la, c->type, c->transa ? c->k : c->m,
                                             c->transa ? c->m : c->k, c->lda)) ||
             (s = cublasLtMatrixLayoutCreate(&lb, c->type, c->transb ? c->n : c->k,
                                             c->transb ? c->k : c->n, c->ldb)) ||
             (s = cublasLtMatrixLayoutCreate(&ld, c->type, c->m, c->n, c->ldd)))
        what = "cublasLtMatrixLayoutCreate";
    else if ((s = cublasLtMatmulPreferenceCreate(&pref)) ||
             (s = cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws))) ||
             (s = cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a))) ||
             (s = cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b))) ||
             (s = cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d))) ||
             (s = cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d))))
        what = "cublasLtMatmulPreference";
    if (what) {
        ret = ctx_fail(ctx, -EIO, op, "%s failed: %s", what, cublasLtGetStatusString(s));
        goto out;
    }
    s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0) ||
        (s == CUBLAS_STATUS_INVALID_VALUE && c->epilogue != CUBLASLT_EPILOGUE_DEFAULT)) {
        ret = -ENOTSUP;
        goto out;
    }
    if (s) {
        ret = ctx_fail(ctx, -EIO, op, "cublasLtMatmulAlgoGetHeuristic failed: %s",
                       cublasLtGetStatusString(s));
        goto out;
    }
    s = cublasLtMatmul(ctx->lt, desc, &alpha, c->a, la, c->b, lb, &c->beta, c->d, ld, c->d, ld,
                       &heur.algo, ctx->workspace, GPU_LT_WORKSPACE, ctx->stream);
    if (s) {
        /* Rejected before anything ran (an epilogue this build cannot do): the caller may
         * take the plain path. */
        bool rejected = s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE;
        ret = ctx_fail(ctx, rejected ? -ENOTSUP : -EIO, op,
                       "cublasLtMatmul (m %d, n %d, k %d, epilogue %d) failed: %s", c->m, c->n,
                       c->k, (int)c->epilogue, cublasLtGetStatusString(s));
        goto out;
    }
    ret = ctx_launched(ctx, op);
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return ret;
}

/* The plain path's epilogue: x = y + bias; with pre_gelu, pre_gelu = x and out = gelu(x), else
 * out = x. y is out or pre_gelu (the product was written there); elementwise, in place. */
template <typename T>
__global__ void bias_gelu_kernel(T *out, T *pre_gelu, const T *y, const T *bias, int OC, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = ldx(y + i) + (bias ? ldx(bias + i % (size_t)OC) : 0.0f);
        if (pre_gelu) {
            stx(pre_gelu + i, x);
            stx(out + i, gelu_f(x));
        } else {
            stx(out + i, x);
        }
    }
}

/* dinp *= gelu'(pre_gelu), in place. */
template <typename T> __global__ void dgelu_kernel(T *dinp, const T *pre_gelu, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stx(dinp + i, ldx(dinp + i) * gelu_grad_f(ldx(pre_gelu + i)));
}

/* Column sums of dout (N,OC) in chunks of MM_CHUNK rows: grid (OC/32 rounded up, chunks),
 * block (32, MM_LANES); part (chunks, OC). */
template <typename T>
__global__ void dbias_partial_kernel(float *part, const T *dout, int N, int OC)
{
    __shared__ float sh[MM_LANES][WARP_SIZE];
    int o = blockIdx.x * WARP_SIZE + threadIdx.x, chunk = blockIdx.y;
    int r0 = chunk * MM_CHUNK, r1 = min(r0 + MM_CHUNK, N);
    float sum = 0.0f;
    if (o < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += MM_LANES)
            sum += ldx(dout + (size_t)r * OC + o);
    sh[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        for (int l = 1; l < MM_LANES; l++)
            sum += sh[l][threadIdx.x];
        part[(size_t)chunk * OC + o] = sum;
    }
}

template <typename T>
__global__ void dbias_final_kernel(T *dbias, const float *part, int chunks, int OC)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC)
        return;
    float sum = 0.0f;
    for (int k = 0; k < chunks; k++)
        sum += part[(size_t)k * OC + o];
    stx(dbias + o, ldx(dbias + o) + sum);
}

/* y[i] += x[i] (n): the BGRADB bias gradient into dbias. */
template <typename T> __global__ void add_kernel(T *y, const T *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        stx(y + i, ldx(y + i) + ldx(x + i));
}

static int check_shape(struct gpu_ctx *ctx, const char *op, enum gpu_dtype dt, int N, int C, int OC)
{
    if (N <= 0 || C <= 0 || OC <= 0)
        return ctx_fail(ctx, -EINVAL, op, "N (%d), C (%d) and OC (%d) must be positive", N, C, OC);
    if (C % 8 || OC % 8)
        return ctx_fail(ctx, -EINVAL, op, "C (%d) and OC (%d) must be multiples of 8", C, OC);
    if (dt != GPU_F32 && dt != GPU_BF16)
        return ctx_fail(ctx, -EINVAL, op, "unknown dtype %d", (int)dt);
    return 0;
}

static cudaDataType_t lt_type(enum gpu_dtype dt)
{
    return dt == GPU_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

template <typename T>
static void bias_gelu(struct gpu_ctx *ctx, void *out, void *pre_gelu, const void *bias, int N,
                      int OC)
{
    size_t n = (size_t)N * OC;
    bias_gelu_kernel<T><<<grid_for(n, 256), 256, 0, ctx->stream>>>(
        (T *)out, (T *)pre_gelu, (const T *)(pre_gelu ? pre_gelu : out), (const T *)bias, OC, n);
}

int gpu_matmul_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, void *pre_gelu,
                       const void *inp, const void *weight, const void *bias, int N, int C, int OC)
{
    const char *op = "matmul_forward";
    int ret = check_shape(ctx, op, dt, N, C, OC);
    if (ret < 0)
        return ret;
    if (pre_gelu == out)
        return ctx_fail(ctx, -EINVAL, op, "out and pre_gelu are the same buffer");

    struct lt_call c = {};
    c.type = lt_type(dt);
    c.m = OC, c.n = N, c.k = C;
    c.transa = true, c.transb = false;
    c.a = weight, c.lda = C;
    c.b = inp, c.ldb = C;
    c.d = out, c.ldd = OC;
    c.beta = 0.0f;
    if (ctx->fusion) {
        c.bias = bias;
        c.aux = pre_gelu;
        c.ldaux = OC;
        if (pre_gelu)
            c.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        else
            c.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        ret = lt_matmul(ctx, op, &c);
        if (ret != -ENOTSUP)
            return ret;
    }
    /* The plain product into pre_gelu (or out), then bias and GELU by our kernel. */
    c.bias = NULL;
    c.aux = NULL;
    c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    c.d = pre_gelu ? pre_gelu : out;
    ret = lt_matmul(ctx, op, &c);
    if (ret == -ENOTSUP)
        return ctx_fail(ctx, -ENOTSUP, op, "cuBLASLt has no algorithm for (%d x %d) . (%d x %d)", N,
                        C, C, OC);
    if (ret < 0 || (!bias && !pre_gelu))
        return ret;
    if (dt == GPU_F32)
        bias_gelu<float>(ctx, out, pre_gelu, bias, N, OC);
    else
        bias_gelu<bf16>(ctx, out, pre_gelu, bias, N, OC);
    return ctx_launched(ctx, op);
}

template <typename T>
static int dbias(struct gpu_ctx *ctx, const char *op, void *db, const void *dout, int N, int OC)
{
    int chunks = (N + MM_CHUNK - 1) / MM_CHUNK;
    void *part = NULL;
    int ret = ctx_scratch(ctx, (size_t)chunks * OC * sizeof(float), &part, op);
    if (ret < 0)
        return ret;
    dim3 grid((unsigned)((OC + WARP_SIZE - 1) / WARP_SIZE), (unsigned)chunks);
    dbias_partial_kernel<T><<<grid, dim3(WARP_SIZE, MM_LANES), 0, ctx->stream>>>(
        (float *)part, (const T *)dout, N, OC);
    dbias_final_kernel<T><<<(unsigned)((OC + 255) / 256), 256, 0, ctx->stream>>>(
        (T *)db, (const float *)part, chunks, OC);
    return ctx_launched(ctx, op);
}

template <typename T>
static void dgelu(struct gpu_ctx *ctx, void *dinp, const void *pre_gelu, int N, int C)
{
    size_t n = (size_t)N * C;
    dgelu_kernel<T><<<grid_for(n, 256), 256, 0, ctx->stream>>>((T *)dinp, (const T *)pre_gelu, n);
}

int gpu_matmul_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dinp, void *dweight,
                        void *dbias_, const void *dout, const void *inp, const void *weight,
                        const void *pre_gelu, int N, int C, int OC)
{
    const char *op = "matmul_backward";
    int ret = check_shape(ctx, op, dt, N, C, OC);
    if (ret < 0)
        return ret;
    if (N > 65535 * MM_CHUNK)
        return ctx_fail(ctx, -EINVAL, op, "N (%d) above %d rows", N, 65535 * MM_CHUNK);

    struct lt_call c = {};
    c.type = lt_type(dt);
    c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    /* dweight^T (C,OC) += inp^T (C,N) . dout (N,OC) */
    c.m = C, c.n = OC, c.k = N;
    c.transa = false, c.transb = true;
    c.a = inp, c.lda = C;
    c.b = dout, c.ldb = OC;
    c.d = dweight, c.ldd = C;
    c.beta = 1.0f;
    ret = -ENOTSUP;
    if (dbias_ && ctx->fusion) {
        /* The bias gradient in the same product: BGRADB sums op(B) = dout over k = N as the
         * matmul reads it, into scratch of dout's type (it overwrites; the gradient
         * accumulates), then dbias += it. Saves reading dout again (4.8 ms of a GPT-2 step at
         * B 64 on an H200). In bf16 the sum is rounded once more than on our path: to bf16
         * before it is added. */
        void *part = NULL;
        if ((ret = ctx_scratch(ctx, (size_t)OC * gpu_dtype_size(dt), &part, op)) < 0)
            return ret;
        c.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        c.bgrad = part;
        ret = lt_matmul(ctx, op, &c);
        c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        c.bgrad = NULL;
        if (ret == 0) {
            if (dt == GPU_F32)
                add_kernel<float><<<(unsigned)((OC + 255) / 256), 256, 0, ctx->stream>>>(
                    (float *)dbias_, (const float *)part, OC);
            else
                add_kernel<bf16><<<(unsigned)((OC + 255) / 256), 256, 0, ctx->stream>>>(
                    (bf16 *)dbias_, (const bf16 *)part, OC);
            if ((ret = ctx_launched(ctx, op)) < 0)
                return ret;
        } else if (ret != -ENOTSUP) {
            return ret;
        }
    }
    if (ret == -ENOTSUP) {
        if (dbias_) {
            ret = dt == GPU_F32 ? dbias<float>(ctx, op, dbias_, dout, N, OC)
                                : dbias<bf16>(ctx, op, dbias_, dout, N, OC);
            if (ret < 0)
                return ret;
        }
        ret = lt_matmul(ctx, op, &c);
    }
    if (ret == -ENOTSUP)
        return ctx_fail(ctx, -ENOTSUP, op, "cuBLASLt has no algorithm for dweight (%d x %d)", OC,
                        C);
    if (ret < 0 || !dinp)
        return ret;

    /* dinp^T (C,N) = weight^T (C,OC) . dout^T (OC,N), with the GELU gradient */
    c.m = C, c.n = N, c.k = OC;
    c.transa = false, c.transb = false;
    c.a = weight, c.lda = C;
    c.b = dout, c.ldb = OC;
    c.d = dinp, c.ldd = C;
    c.beta = 0.0f;
    if (pre_gelu && ctx->fusion) {
        c.epilogue = CUBLASLT_EPILOGUE_DGELU;
        c.aux = pre_gelu;
        c.ldaux = C;
        ret = lt_matmul(ctx, op, &c);
        if (ret != -ENOTSUP)
            return ret;
        c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        c.aux = NULL;
    }
    ret = lt_matmul(ctx, op, &c);
    if (ret == -ENOTSUP)
        return ctx_fail(ctx, -ENOTSUP, op, "cuBLASLt has no algorithm for dinp (%d x %d)", N, C);
    if (ret < 0 || !pre_gelu)
        return ret;
    if (dt == GPU_F32)
        dgelu<float>(ctx, dinp, pre_gelu, N, C);
    else
        dgelu<bf16>(ctx, dinp, pre_gelu, N, C);
    return ctx_launched(ctx, op);
}

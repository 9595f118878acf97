/* cudasim's cuBLASLt: the subset kernels/cuda/matmul.cu calls, run on the CPU inside the call
 * (or, with CUDASIM_ASYNC=1 on a stream of cudaStreamCreate*, when that stream's queue runs;
 * the sim's device pointers are host pointers), behind
 * NVIDIA's own cublasLt.h. The semantics are cuBLASLt's documented ones: column-major
 * matrices (rows, cols, ld), D (m,n) = alpha op(A) op(B) + beta C, then the epilogue, with fp32
 * accumulation in the order k = 0..k-1 (so a product repeats bit for bit) and fp32 or bf16
 * storage (bf16 stored round-to-nearest-even). What this subset cannot do returns
 * CUBLAS_STATUS_NOT_SUPPORTED so the caller's fallback runs; nothing is silently ignored. */
#include <cublasLt.h>

#include <math.h>
#include <memory>
#include <new>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "banned.h"

/* Whether a stream defers its work (the sim's runtime, runtime.cc); linked without it (the
 * library's own test), every stream is synchronous. */
bool cudasim_stream_deferred(cudaStream_t s) __attribute__((weak));
void cudasim_stream_submit(cudaStream_t s, std::function<void()> fn) __attribute__((weak));

static bool deferred(cudaStream_t s)
{
    return &cudasim_stream_deferred && cudasim_stream_deferred(s);
}

/* Tags at the start of each object this file hands out, so that a pointer of the wrong kind
 * (or one already destroyed) is refused instead of read. */
#define MAGIC_HANDLE 0x4c74484eu /* "LtHN" */
#define MAGIC_DESC   0x4c744d44u /* "LtMD" */
#define MAGIC_LAYOUT 0x4c744c59u /* "LtLY" */
#define MAGIC_PREF   0x4c745046u /* "LtPF" */
#define MAGIC_ALGO   0x4c74414cu /* "LtAL" */
#define MAGIC_DEAD   0xdeadbeefu

/* cuBLASLt's default minimum alignment of A, B, C and D (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*)
 * and the multiple an epilogue's aux leading dimension must be (EPILOGUE_AUX_LD, GELU case). */
#define DEFAULT_ALIGNMENT 256
#define AUX_LD_MULTIPLE   8

/* The GELU of the epilogues: the tanh approximation, as kernels/cuda/common.cuh. */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

struct cublasLtContext {
    uint32_t magic;
};

struct lt_desc {
    uint32_t magic;
    int32_t compute, scale, pointer_mode;
    int32_t transa, transb, transc, fill;
    uint32_t epilogue;
    const void *bias;
    int64_t bias_batch_stride;
    const void *aux;
    int64_t aux_ld, aux_batch_stride;
    int32_t aux_type, bias_type; /* -1: D's type */
    int32_t sm_count;
    int8_t fast_accum;
    /* One bit per attribute (by its number) set to a value this subset cannot honour: the
     * heuristic and the matmul then answer CUBLAS_STATUS_NOT_SUPPORTED. */
    uint64_t unsupported;
    /* Storage for the attributes that must keep their default (zero) here. */
    unsigned char scratch[8];
};
static_assert(sizeof(lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor too large");

struct lt_layout {
    uint32_t magic;
    uint32_t type;
    int32_t order, batch_count;
    uint32_t batch_mode;
    uint64_t rows, cols;
    int64_t ld, batch_offset, plane_offset;
};
static_assert(sizeof(lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout too large");

struct lt_pref {
    uint32_t magic;
    uint32_t search_mode, reduction_mask;
    uint32_t align[4]; /* A, B, C, D */
    uint64_t workspace;
    float max_waves;
    uint64_t impl_mask;
};
static_assert(sizeof(lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference too large");

/* What the heuristic promised: the alignment of A, B, C and D it was asked to allow for. */
struct lt_algo {
    uint32_t magic;
    uint32_t align[4];
};
static_assert(sizeof(lt_algo) <= sizeof(cublasLtMatmulAlgo_t), "algo too large");

static lt_desc *desc_of(cublasLtMatmulDesc_t d)
{
    lt_desc *p = reinterpret_cast<lt_desc *>(d);
    return p && p->magic == MAGIC_DESC ? p : NULL;
}

static lt_layout *layout_of(cublasLtMatrixLayout_t l)
{
    lt_layout *p = reinterpret_cast<lt_layout *>(l);
    return p && p->magic == MAGIC_LAYOUT ? p : NULL;
}

static lt_pref *pref_of(cublasLtMatmulPreference_t pr)
{
    lt_pref *p = reinterpret_cast<lt_pref *>(pr);
    return p && p->magic == MAGIC_PREF ? p : NULL;
}

static bool handle_ok(cublasLtHandle_t h)
{
    return h && h->magic == MAGIC_HANDLE;
}

/* ---- attribute tables ------------------------------------------------------------------- */

/* One attribute: its number, the size the header documents for it, and where it lives in our
 * struct; `zero_only` attributes are accepted but any non-zero value marks the descriptor
 * unsupported. */
struct attr_row {
    int attr;
    size_t size;
    size_t offset;
    bool zero_only;
};

#define DESC_ROW(a, field)                                                                         \
    {                                                                                              \
        a, sizeof(((lt_desc *)0)->field), offsetof(lt_desc, field), false                          \
    }
#define DESC_ZERO(a, size)                                                                         \
    {                                                                                              \
        a, size, offsetof(lt_desc, scratch), true                                                  \
    }

static const attr_row desc_attrs[] = {
    DESC_ROW(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute),
    DESC_ROW(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale),
    DESC_ROW(CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode),
    DESC_ROW(CUBLASLT_MATMUL_DESC_TRANSA, transa),
    DESC_ROW(CUBLASLT_MATMUL_DESC_TRANSB, transb),
    DESC_ROW(CUBLASLT_MATMUL_DESC_TRANSC, transc),
    DESC_ROW(CUBLASLT_MATMUL_DESC_FILL_MODE, fill),
    DESC_ROW(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue),
    DESC_ROW(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias),
    DESC_ROW(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride),
    DESC_ROW(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux),
    DESC_ROW(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld),
    DESC_ROW(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_batch_stride),
    DESC_ROW(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sm_count),
    DESC_ROW(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type),
    DESC_ROW(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum),
    DESC_ROW(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, sizeof(int64_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_C_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_D_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, sizeof(void *)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, sizeof(int32_t)),
    DESC_ZERO(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, sizeof(void *)),
};

#define LAYOUT_ROW(a, field)                                                                       \
    {                                                                                              \
        a, sizeof(((lt_layout *)0)->field), offsetof(lt_layout, field), false                      \
    }

static const attr_row layout_attrs[] = {
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_TYPE, type),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_ORDER, order),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_ROWS, rows),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_COLS, cols),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_LD, ld),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch_count),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_offset),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane_offset),
    LAYOUT_ROW(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, batch_mode),
};

#define PREF_ROW(a, field)                                                                         \
    {                                                                                              \
        a, sizeof(((lt_pref *)0)->field), offsetof(lt_pref, field), false                          \
    }

static const attr_row pref_attrs[] = {
    PREF_ROW(CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode),
    PREF_ROW(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace),
    PREF_ROW(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask),
    PREF_ROW(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, sizeof(uint32_t),
     offsetof(lt_pref, align) + 1 * sizeof(uint32_t), false},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, sizeof(uint32_t),
     offsetof(lt_pref, align) + 2 * sizeof(uint32_t), false},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, sizeof(uint32_t),
     offsetof(lt_pref, align) + 3 * sizeof(uint32_t), false},
    PREF_ROW(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves),
    PREF_ROW(CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask),
};

#define NROWS(t) (sizeof(t) / sizeof((t)[0]))

static const attr_row *find_attr(const attr_row *rows, size_t n, int attr)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].attr == attr)
            return &rows[i];
    return NULL;
}

/* The header's contract: INVALID_VALUE for an unknown attribute, a NULL buffer or a size that
 * is not the attribute's. */
static cublasStatus_t set_attr(void *obj, uint64_t *unsupported, const attr_row *rows, size_t n,
                               int attr, const void *buf, size_t size)
{
    const attr_row *r = find_attr(rows, n, attr);
    if (!obj || !r || !buf || size != r->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (r->zero_only) {
        static const unsigned char zero[8] = {0};
        uint64_t bit = (uint64_t)1 << (attr & 63);
        if (memcmp(buf, zero, size))
            *unsupported |= bit;
        else
            *unsupported &= ~bit;
    }
    memcpy((char *)obj + r->offset, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t get_attr(const void *obj, const attr_row *rows, size_t n, int attr, void *buf,
                               size_t size, size_t *written)
{
    const attr_row *r = find_attr(rows, n, attr);
    if (!obj || !r)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = r->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != r->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, (const char *)obj + r->offset, size);
    if (written)
        *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- handle, status strings, version ---------------------------------------------------- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtContext *h = (cublasLtContext *)calloc(1, sizeof(*h));
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = MAGIC_HANDLE;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    lightHandle->magic = MAGIC_DEAD;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

struct status_row {
    cublasStatus_t status;
    const char *name, *text;
};

static const status_row statuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "there is an error with the license"},
};

static const status_row *status_find(cublasStatus_t s)
{
    for (size_t i = 0; i < NROWS(statuses); i++)
        if (statuses[i].status == s)
            return &statuses[i];
    return NULL;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    const status_row *r = status_find(status);
    return r ? r->name : "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    const status_row *r = status_find(status);
    return r ? r->text : "unknown error";
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

/* ---- descriptors -------------------------------------------------------------------------- */

static void desc_init(lt_desc *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    new (d) lt_desc{};
    d->magic = MAGIC_DESC;
    d->compute = compute;
    d->scale = scale;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->aux_type = d->bias_type = -1;
}

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                               cublasComputeType_t computeType,
                                               cudaDataType_t scaleType)
{
    if (!matmulDesc || size < sizeof(lt_desc))
        return CUBLAS_STATUS_ALLOC_FAILED;
    desc_init(reinterpret_cast<lt_desc *>(matmulDesc), computeType, scaleType);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *p = calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    desc_init(static_cast<lt_desc *>(p), computeType, scaleType);
    *matmulDesc = static_cast<cublasLtMatmulDesc_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    lt_desc *d = desc_of(matmulDesc);
    if (!matmulDesc)
        return CUBLAS_STATUS_SUCCESS;
    if (!d)
        return CUBLAS_STATUS_INVALID_VALUE;
    d->magic = MAGIC_DEAD;
    free(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes)
{
    lt_desc *d = desc_of(matmulDesc);
    return set_attr(d, d ? &d->unsupported : NULL, desc_attrs, NROWS(desc_attrs), attr, buf,
                    sizeInBytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t sizeInBytes, size_t *sizeWritten)
{
    return get_attr(desc_of(matmulDesc), desc_attrs, NROWS(desc_attrs), attr, buf, sizeInBytes,
                    sizeWritten);
}

static void layout_init(lt_layout *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld)
{
    new (l) lt_layout{};
    l->magic = MAGIC_LAYOUT;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->batch_count = 1;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
}

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size,
                                                 cudaDataType type, uint64_t rows, uint64_t cols,
                                                 int64_t ld)
{
    if (!matLayout || size < sizeof(lt_layout))
        return CUBLAS_STATUS_ALLOC_FAILED;
    layout_init(reinterpret_cast<lt_layout *>(matLayout), type, rows, cols, ld);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *p = calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    layout_init(static_cast<lt_layout *>(p), type, rows, cols, ld);
    *matLayout = static_cast<cublasLtMatrixLayout_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    lt_layout *l = layout_of(matLayout);
    if (!matLayout)
        return CUBLAS_STATUS_SUCCESS;
    if (!l)
        return CUBLAS_STATUS_INVALID_VALUE;
    l->magic = MAGIC_DEAD;
    free(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    uint64_t ignored = 0;
    return set_attr(layout_of(matLayout), &ignored, layout_attrs, NROWS(layout_attrs), attr, buf,
                    sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t sizeInBytes, size_t *sizeWritten)
{
    return get_attr(layout_of(matLayout), layout_attrs, NROWS(layout_attrs), attr, buf, sizeInBytes,
                    sizeWritten);
}

static void pref_init(lt_pref *p)
{
    new (p) lt_pref{};
    p->magic = MAGIC_PREF;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++)
        p->align[i] = DEFAULT_ALIGNMENT;
    p->impl_mask = UINT64_MAX;
}

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size)
{
    if (!pref || size < sizeof(lt_pref))
        return CUBLAS_STATUS_ALLOC_FAILED;
    pref_init(reinterpret_cast<lt_pref *>(pref));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *p = calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    pref_init(static_cast<lt_pref *>(p));
    *pref = static_cast<cublasLtMatmulPreference_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    lt_pref *p = pref_of(pref);
    if (!pref)
        return CUBLAS_STATUS_SUCCESS;
    if (!p)
        return CUBLAS_STATUS_INVALID_VALUE;
    p->magic = MAGIC_DEAD;
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    uint64_t ignored = 0;
    return set_attr(pref_of(pref), &ignored, pref_attrs, NROWS(pref_attrs), attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten)
{
    return get_attr(pref_of(pref), pref_attrs, NROWS(pref_attrs), attr, buf, sizeInBytes,
                    sizeWritten);
}

/* ---- the checks shared by the heuristic and the matmul ---------------------------------- */

/* What an epilogue does, as flags: the rows of the documented epilogues this subset runs. */
enum {
    EPI_BIAS = 1,       /* x += bias[row]; bias length = rows of D */
    EPI_GELU = 2,       /* D = gelu(x) */
    EPI_AUX_OUT = 4,    /* aux = x (the GELU input) */
    EPI_DGELU = 8,      /* D = x * gelu'(aux) */
    EPI_BGRAD_D = 16,   /* bias[row] = sum over the columns of D (after DGELU) */
    EPI_BGRAD_A = 32,   /* bias[row] = sum over k of op(A) */
    EPI_BGRAD_B = 64,   /* bias[col] = sum over k of op(B) */
    EPI_USES_AUX = 128, /* needs EPILOGUE_AUX_POINTER and _LD */
};

/* check_problem's reason for a bias gradient of a type other than D's: the one refusal the
 * heuristic query answers with INVALID_VALUE, as the H200's did, rather than NOT_SUPPORTED. */
static const char BIAS_TYPE_WHY[] = "bias gradient of a type other than D's";

struct epilogue_row {
    uint32_t epilogue;
    unsigned flags;
};

static const epilogue_row epilogues[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, 0},
    {CUBLASLT_EPILOGUE_BIAS, EPI_BIAS},
    {CUBLASLT_EPILOGUE_GELU, EPI_GELU},
    {CUBLASLT_EPILOGUE_GELU_AUX, EPI_GELU | EPI_AUX_OUT | EPI_USES_AUX},
    {CUBLASLT_EPILOGUE_GELU_BIAS, EPI_BIAS | EPI_GELU},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, EPI_BIAS | EPI_GELU | EPI_AUX_OUT | EPI_USES_AUX},
    {CUBLASLT_EPILOGUE_DGELU, EPI_DGELU | EPI_USES_AUX},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, EPI_DGELU | EPI_BGRAD_D | EPI_USES_AUX},
    {CUBLASLT_EPILOGUE_BGRADA, EPI_BGRAD_A},
    {CUBLASLT_EPILOGUE_BGRADB, EPI_BGRAD_B},
};

static const epilogue_row *epilogue_find(uint32_t e)
{
    for (size_t i = 0; i < NROWS(epilogues); i++)
        if (epilogues[i].epilogue == e)
            return &epilogues[i];
    return NULL;
}

static bool type_ok(int32_t t)
{
    return t == CUDA_R_32F || t == CUDA_R_16BF;
}

static size_t type_size(int32_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

static uint32_t alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = DEFAULT_ALIGNMENT;
    while (al > 1 && (a & (al - 1)))
        al /= 2;
    return al;
}

/* A whole problem, checked: what the heuristic and the matmul both need. */
struct problem {
    const lt_desc *d;
    const lt_layout *la, *lb, *lc, *ld;
    unsigned flags;
    uint64_t m, n, k;
    int32_t bias_type, aux_type;
};

/* The verdict on a problem: CUBLAS_STATUS_SUCCESS, NOT_SUPPORTED for what this subset (or
 * cuBLASLt) does not do, INVALID_VALUE for a configuration that cannot be right; `why` says
 * which. */
static cublasStatus_t check_problem(problem *p, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                    cublasLtMatrixLayout_t dl, const char **why)
{
    const lt_layout *ls[4];
    const epilogue_row *e;
    bool ta, tb;

    p->d = desc_of(desc);
    p->la = ls[0] = layout_of(a);
    p->lb = ls[1] = layout_of(b);
    p->lc = ls[2] = layout_of(c);
    p->ld = ls[3] = layout_of(dl);
    if (!p->d || !p->la || !p->lb || !p->lc || !p->ld) {
        *why = "a descriptor or layout is NULL or not one this library created";
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const lt_desc *d = p->d;
    if (d->unsupported) {
        *why = "an attribute set to a value this subset does not support (scale, amax, "
               "emulation)";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC) {
        *why = "compute type other than CUBLAS_COMPUTE_32F";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->scale != CUDA_R_32F || d->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
        *why = "scale type other than CUDA_R_32F or alpha/beta not on the host";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->transc != CUBLAS_OP_N || d->fill != CUBLAS_FILL_MODE_FULL) {
        *why = "TRANSC other than N or FILL_MODE other than FULL";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    for (int32_t t : {d->transa, d->transb})
        if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) {
            *why = "TRANSA or TRANSB is not a cublasOperation_t";
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    if (!(e = epilogue_find(d->epilogue))) {
        *why = "epilogue this subset does not run (ReLU family or unknown)";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    p->flags = e->flags;
    for (const lt_layout *l : ls) {
        if (!type_ok((int32_t)l->type)) {
            *why = "matrix type other than CUDA_R_32F or CUDA_R_16BF";
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (l->order != CUBLASLT_ORDER_COL || l->batch_count != 1 || l->plane_offset) {
            *why = "matrix order other than column-major, or a batch";
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (l->rows > INT32_MAX || l->cols > INT32_MAX || l->ld < 1 || (uint64_t)l->ld < l->rows) {
            *why = "a layout's leading dimension is below its rows (or a size is out of range)";
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    if (p->la->type != p->lb->type || p->lc->type != p->ld->type ||
        (p->la->type == CUDA_R_32F && p->ld->type != CUDA_R_32F)) {
        *why = "type combination other than A = B, C = D, D fp32 or as A";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    ta = d->transa != CUBLAS_OP_N;
    tb = d->transb != CUBLAS_OP_N;
    p->m = p->ld->rows;
    p->n = p->ld->cols;
    p->k = ta ? p->la->rows : p->la->cols;
    if ((ta ? p->la->cols : p->la->rows) != p->m || (tb ? p->lb->rows : p->lb->cols) != p->n ||
        (tb ? p->lb->cols : p->lb->rows) != p->k || p->lc->rows != p->m || p->lc->cols != p->n) {
        *why = "op(A) (m,k), op(B) (k,n), C and D (m,n) do not agree";
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->bias_type = d->bias_type == -1 ? (int32_t)p->ld->type : d->bias_type;
    p->aux_type = d->aux_type == -1 ? (int32_t)p->ld->type : d->aux_type;
    if (!type_ok(p->bias_type) || !type_ok(p->aux_type)) {
        *why = "bias or aux type other than CUDA_R_32F or CUDA_R_16BF";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* A bias gradient of another type than D's: on an H200 (cuBLASLt 13), BGRADB with bf16 D
     * and an fp32 bias gradient fails the heuristic query with INVALID_VALUE. (A bias to
     * add may be fp32 on bf16 D.) */
    if ((p->flags & (EPI_BGRAD_D | EPI_BGRAD_A | EPI_BGRAD_B)) &&
        p->bias_type != (int32_t)p->ld->type) {
        *why = BIAS_TYPE_WHY;
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p->flags & EPI_USES_AUX) {
        if (d->aux_ld % AUX_LD_MULTIPLE || d->aux_ld < (int64_t)p->m || d->aux_ld < 1) {
            *why = "EPILOGUE_AUX_LD not a multiple of 8 or below the rows of D";
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (alignment_of(d->aux) < type_size(p->aux_type)) {
            *why = "aux pointer not aligned to its element";
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    if ((p->flags & (EPI_BIAS | EPI_BGRAD_D | EPI_BGRAD_A | EPI_BGRAD_B)) &&
        alignment_of(d->bias) < type_size(p->bias_type)) {
        *why = "bias pointer not aligned to its element";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Invalid configurations are caller bugs, not missing features: say which on stderr, where
 * the person debugging the caller's failure (or its fallback's) will look. A missing feature is
 * only told with CUDASIM_VERBOSE set: the caller's fallback is the expected answer to it. */
static void report(const char *fn, cublasStatus_t verdict, const char *why)
{
    if (verdict == CUBLAS_STATUS_INVALID_VALUE || getenv("CUDASIM_VERBOSE"))
        fprintf(stderr, "cudasim: %s refused: %s\n", fn, why);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    const char *fn = "cublasLtMatmulAlgoGetHeuristic", *why = NULL;
    lt_pref *pref = pref_of(preference);
    problem p;

    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    cublasStatus_t s = check_problem(&p, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &why);
    if (s) {
        /* cuBLASLt's heuristic answers the configurations it cannot run with NOT_SUPPORTED,
         * a bias type other than D's with INVALID_VALUE. */
        report(fn, s, why);
        return why == BIAS_TYPE_WHY ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* No algorithm works with operands less aligned than their elements. */
    const lt_layout *ls[4] = {p.la, p.lb, p.lc, p.ld};
    for (int i = 0; i < 4; i++)
        if (pref->align[i] < type_size((int32_t)ls[i]->type))
            return CUBLAS_STATUS_SUCCESS;

    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    lt_algo *algo = new (&r->algo) lt_algo{};
    algo->magic = MAGIC_ALGO;
    for (int i = 0; i < 4; i++)
        algo->align[i] = pref->align[i];
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the product ------------------------------------------------------------------------ */

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

static float load(const void *base, int32_t type, size_t i)
{
    if (type == CUDA_R_32F)
        return ((const float *)base)[i];
    return bf16_to_f32(((const uint16_t *)base)[i]);
}

static void store(void *base, int32_t type, size_t i, float x)
{
    if (type == CUDA_R_32F)
        ((float *)base)[i] = x;
    else
        ((uint16_t *)base)[i] = f32_to_bf16(x);
}

static float gelu(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

static float gelu_grad(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

/* acc[j] += a * b[j] for j < n: independent accumulators, four to a vector (the same
 * operations, and so the same bits, as the plain loop; the vectors only keep an -O2 build from
 * leaving the sim's products several times slower than they need be). */
typedef float v4f __attribute__((vector_size(16)));

static void axpy(float *acc, const float *b, float a, size_t n)
{
    const v4f va = {a, a, a, a};
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        v4f x0, x1, b0, b1;
        memcpy(&x0, acc + j, sizeof(x0));
        memcpy(&x1, acc + j + 4, sizeof(x1));
        memcpy(&b0, b + j, sizeof(b0));
        memcpy(&b1, b + j + 4, sizeof(b1));
        x0 += va * b0;
        x1 += va * b1;
        memcpy(acc + j, &x0, sizeof(x0));
        memcpy(acc + j + 4, &x1, sizeof(x1));
    }
    for (; j < n; j++)
        acc[j] += a * b[j];
}

/* D = epilogue(alpha op(A) op(B) + beta C) for a checked problem. op(A) is packed as fp32
 * rows (m,k) and op(B) as fp32 rows (k,n), so that each row of D is a run of independent
 * accumulators, every one summed over k in order 0..k-1. */
static cublasStatus_t run(const problem *p, float alpha, const void *A, const void *B, float beta,
                          const void *C, void *D)
{
    const lt_desc *d = p->d;
    const size_t m = p->m, n = p->n, k = p->k;
    const size_t lda = (size_t)p->la->ld, ldb = (size_t)p->lb->ld, ldc = (size_t)p->lc->ld,
                 ldd = (size_t)p->ld->ld, ldaux = (size_t)d->aux_ld;
    const int32_t ta = p->la->type, tc = p->lc->type, td = p->ld->type;
    const bool transa = d->transa != CUBLAS_OP_N, transb = d->transb != CUBLAS_OP_N;
    float *ap = (float *)malloc((m * k + k * n + n + 1) * sizeof(float));
    if (!ap)
        return CUBLAS_STATUS_ALLOC_FAILED;
    float *bp = ap + m * k, *acc = bp + k * n;

    for (size_t i = 0; i < m; i++)
        for (size_t l = 0; l < k; l++)
            ap[i * k + l] = load(A, ta, transa ? l + i * lda : i + l * lda);
    for (size_t l = 0; l < k; l++)
        for (size_t j = 0; j < n; j++)
            bp[l * n + j] = load(B, ta, transb ? j + l * ldb : l + j * ldb);

    if (p->flags & EPI_BGRAD_B) {
        /* bias[j] = sum over k of op(B)(l, j), the column sums of the packed B */
        for (size_t j = 0; j < n; j++)
            acc[j] = 0.0f;
        for (size_t l = 0; l < k; l++)
            for (size_t j = 0; j < n; j++)
                acc[j] += bp[l * n + j];
        for (size_t j = 0; j < n; j++)
            store((void *)d->bias, p->bias_type, j, acc[j]);
    }
    for (size_t i = 0; i < m; i++) {
        const float *arow = ap + i * k;
        float bgrad = 0.0f;
        for (size_t j = 0; j < n; j++)
            acc[j] = 0.0f;
        for (size_t l = 0; l < k; l++)
            axpy(acc, bp + l * n, arow[l], n);
        if (p->flags & EPI_BGRAD_A) {
            float s = 0.0f;
            for (size_t l = 0; l < k; l++)
                s += arow[l];
            store((void *)d->bias, p->bias_type, i, s);
        }
        const float b = (p->flags & EPI_BIAS) ? load(d->bias, p->bias_type, i) : 0.0f;
        for (size_t j = 0; j < n; j++) {
            float x = alpha * acc[j];
            /* BLAS: C is not read when beta is zero (it may hold anything, NaN included). */
            if (beta != 0.0f)
                x += beta * load(C, tc, i + j * ldc);
            if (p->flags & EPI_BIAS)
                x += b;
            if (p->flags & EPI_AUX_OUT)
                store((void *)d->aux, p->aux_type, i + j * ldaux, x);
            if (p->flags & EPI_GELU)
                x = gelu(x);
            if (p->flags & EPI_DGELU)
                x *= gelu_grad(load(d->aux, p->aux_type, i + j * ldaux));
            if (p->flags & EPI_BGRAD_D)
                bgrad += x;
            store(D, td, i + j * ldd, x);
        }
        if (p->flags & EPI_BGRAD_D)
            store((void *)d->bias, p->bias_type, i, bgrad);
    }
    free(ap);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const char *fn = "cublasLtMatmul", *why = NULL;
    problem p;
    (void)workspace, (void)workspaceSizeInBytes;

    if (!handle_ok(lightHandle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t s = check_problem(&p, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &why);
    if (s) {
        report(fn, s, why);
        return s;
    }
    if (!alpha || !beta) {
        report(fn, CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    float fa, fb;
    memcpy(&fa, alpha, sizeof(fa));
    memcpy(&fb, beta, sizeof(fb));
    const void *ptrs[4] = {A, B, C, D};
    const lt_layout *ls[4] = {p.la, p.lb, p.lc, p.ld};
    const lt_algo *al = reinterpret_cast<const lt_algo *>(algo);
    if (al && al->magic != MAGIC_ALGO) {
        report(fn, CUBLAS_STATUS_INVALID_VALUE, "algo not from cublasLtMatmulAlgoGetHeuristic");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < 4; i++) {
        bool used = p.m && p.n && (i == 3 || (i == 2 ? fb != 0.0f : p.k != 0));
        uint32_t need = al ? al->align[i] : (uint32_t)type_size((int32_t)ls[i]->type);
        if (!used)
            continue;
        if (!ptrs[i]) {
            report(fn, CUBLAS_STATUS_INVALID_VALUE, "A, B, C or D is NULL");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        /* An algorithm picked for aligned operands faults (or is refused) on others. */
        if (alignment_of(ptrs[i]) < need) {
            report(fn, CUBLAS_STATUS_INVALID_VALUE,
                   "an operand is less aligned than the heuristic was told");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    /* In place (C == D) only with the same layout. */
    if (C == D && fb != 0.0f && p.lc->ld != p.ld->ld) {
        report(fn, CUBLAS_STATUS_INVALID_VALUE, "C and D share memory but not their layout");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (((p.flags & (EPI_BIAS | EPI_BGRAD_D | EPI_BGRAD_A | EPI_BGRAD_B)) && !p.d->bias) ||
        ((p.flags & EPI_USES_AUX) && !p.d->aux)) {
        report(fn, CUBLAS_STATUS_INVALID_VALUE, "the epilogue's bias or aux pointer is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!deferred(stream))
        return run(&p, fa, A, B, fb, C, D);
    /* Deferred (cudasim's CUDASIM_ASYNC=1): the descriptors may be destroyed once the call
     * returns, so the work keeps copies. An allocation failure then aborts (nobody is left to
     * return it to). */
    struct saved {
        lt_desc d;
        lt_layout l[4];
        problem p;
    };
    auto sv = std::make_shared<saved>();
    sv->d = *p.d;
    sv->l[0] = *p.la, sv->l[1] = *p.lb, sv->l[2] = *p.lc, sv->l[3] = *p.ld;
    sv->p = p;
    sv->p.d = &sv->d;
    sv->p.la = &sv->l[0], sv->p.lb = &sv->l[1], sv->p.lc = &sv->l[2], sv->p.ld = &sv->l[3];
    cudasim_stream_submit(stream, [sv, fa, A, B, fb, C, D] {
        if (run(&sv->p, fa, A, B, fb, C, D) != CUBLAS_STATUS_SUCCESS) {
            fputs("cudasim: cublasLtMatmul: out of memory in queued work\n", stderr);
            abort();
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

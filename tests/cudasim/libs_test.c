/* The tests of cudasim's cuBLASLt and NCCL (tests/cudasim/cublaslt.cc, nccl.cc), run by
 * tests/integ/cudasim_libs.sh: products of every transpose and type against a plain triple
 * loop, every epilogue against its documented meaning (known answers for the bias, aux and
 * gradient orientations), matmul.cu's row-major linear layer, the refusals; NCCL with one
 * process and with three (fork): every collective in and out of place, bf16 sums rounded once,
 * a peer killed mid-collective, a timeout, mismatched calls. TAP output; exit 1 on a failure. */
#include <cublasLt.h>
#include <nccl.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "banned.h"

#define GELU_K         0.7978845608028654f /* sqrt(2 / pi), the tanh form's constant */
#define GELU_C         0.044715f
#define CHILD_ALARM_S  30 /* a rank that hangs is killed by then and the test fails */
#define MAX_MISMATCHES 5  /* mismatches printed per comparison */

static bool failed; /* the running test failed */

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            say("%s:%d: %s", __FILE__, __LINE__, #cond);                                           \
            say(__VA_ARGS__);                                                                      \
            failed = true;                                                                         \
        }                                                                                          \
    } while (0)

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float round_bf16(float f)
{
    return bf16_to_f32(f32_to_bf16(f));
}

static float gelu_ref(float x)
{
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
}

static float gelu_grad_ref(float x)
{
    float th = tanhf(GELU_K * (x + GELU_C * x * x * x));
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

static uint32_t rng_state = 12345;
/* uniform in [-1, 1), rounded to bf16 when asked */
static float rnd(bool bf16)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    float f = (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
    return bf16 ? round_bf16(f) : f;
}

/* ---- cuBLASLt ------------------------------------------------------------------------------ */

/* A typed column-major buffer: values (fp32, already rounded for bf16) and their storage. */
struct mat {
    cudaDataType_t type;
    size_t n;
    float *v;
    void *dev;
};

static void mat_init(struct mat *m, cudaDataType_t type, size_t n)
{
    m->type = type;
    m->n = n;
    m->v = calloc(n ? n : 1, sizeof(float));
    m->dev = aligned_alloc(256, ((n ? n : 1) * 4 + 255) / 256 * 256);
    if (!m->v || !m->dev)
        abort();
}

static void mat_release(struct mat *m)
{
    free(m->v);
    free(m->dev);
}

static bool is_bf16(cudaDataType_t t)
{
    return t == CUDA_R_16BF;
}

/* Writes the values into the storage (rounding them for bf16). */
static void mat_upload(struct mat *m)
{
    for (size_t i = 0; i < m->n; i++) {
        if (is_bf16(m->type)) {
            m->v[i] = round_bf16(m->v[i]);
            ((uint16_t *)m->dev)[i] = f32_to_bf16(m->v[i]);
        } else {
            ((float *)m->dev)[i] = m->v[i];
        }
    }
}

static float mat_get(const struct mat *m, size_t i)
{
    return is_bf16(m->type) ? bf16_to_f32(((const uint16_t *)m->dev)[i]) : ((float *)m->dev)[i];
}

static void mat_fill(struct mat *m, float value)
{
    for (size_t i = 0; i < m->n; i++)
        m->v[i] = value;
    mat_upload(m);
}

static void mat_random(struct mat *m)
{
    for (size_t i = 0; i < m->n; i++)
        m->v[i] = rnd(is_bf16(m->type));
    mat_upload(m);
}

/* One product as matmul.cu describes it to cuBLASLt. */
struct mm {
    cudaDataType_t ab_type, cd_type;
    int m, n, k;
    bool ta, tb;
    int lda, ldb, ldc, ldd;
    float alpha, beta;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type; /* -1: not set (D's type) */
    const void *aux;
    int64_t ldaux;
    uint32_t align; /* 0: each operand's own, as matmul.cu asks */
};

static cublasLtHandle_t lt;

/* As matmul.cu: the largest power of two dividing the address, up to 256. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al /= 2;
    return al;
}

/* Runs the product; returns the first status that is not success (the heuristic's, or the
 * matmul's), with *found the heuristic's algorithm count. */
static cublasStatus_t mm_run(const struct mm *p, const void *A, const void *B, const void *C,
                             void *D, int *found)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int32_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = p->epilogue ? p->epilogue : CUBLASLT_EPILOGUE_DEFAULT;
    uint64_t ws = 1 << 20;
    cublasStatus_t s;
    int n = 0;

    if ((s = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) ||
        (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) ||
        (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                            sizeof(epi))))
        goto out;
    if (p->bias && (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &p->bias, sizeof(p->bias))))
        goto out;
    if (p->bias_type != -1 &&
        (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                            &p->bias_type, sizeof(p->bias_type))))
        goto out;
    if (p->aux &&
        ((s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                             &p->aux, sizeof(p->aux))) ||
         (s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p->ldaux,
                                             sizeof(p->ldaux)))))
        goto out;
    if ((s = cublasLtMatrixLayoutCreate(&la, p->ab_type, p->ta ? p->k : p->m, p->ta ? p->m : p->k,
                                        p->lda)) ||
        (s = cublasLtMatrixLayoutCreate(&lb, p->ab_type, p->tb ? p->n : p->k, p->tb ? p->k : p->n,
                                        p->ldb)) ||
        (s = cublasLtMatrixLayoutCreate(&lc, p->cd_type, p->m, p->n, p->ldc)) ||
        (s = cublasLtMatrixLayoutCreate(&ld, p->cd_type, p->m, p->n, p->ldd)))
        goto out;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) ||
        (s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws))))
        goto out;
    {
        cublasLtMatmulPreferenceAttributes_t a[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const void *ptr[4] = {A, B, C, D};
        for (int i = 0; i < 4; i++) {
            uint32_t al = p->align ? p->align : alignment(ptr[i]);
            if ((s = cublasLtMatmulPreferenceSetAttribute(pref, a[i], &al, sizeof(al))))
                goto out;
        }
    }
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &heur, &n);
    if (s || n == 0)
        goto out;
    s = cublasLtMatmul(lt, desc, &p->alpha, A, la, B, lb, &p->beta, C, lc, D, ld, &heur.algo, NULL,
                       0, NULL);
out:
    if (found)
        *found = n;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    return s;
}

/* The documented meaning, written out: op(A)(i,l), op(B)(l,j) of column-major storage. */
static float op_a(const struct mm *p, const float *a, int i, int l)
{
    return p->ta ? a[l + (size_t)i * p->lda] : a[i + (size_t)l * p->lda];
}

static float op_b(const struct mm *p, const float *b, int l, int j)
{
    return p->tb ? b[j + (size_t)l * p->ldb] : b[l + (size_t)j * p->ldb];
}

/* Flags of what each epilogue does (cublasLt.h's comments). */
#define R_BIAS  1
#define R_GELU  2
#define R_AUXW  4
#define R_DGELU 8
#define R_BGRAD 16

static unsigned epi_flags(uint32_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS:
        return R_BIAS;
    case CUBLASLT_EPILOGUE_GELU:
        return R_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX:
        return R_GELU | R_AUXW;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        return R_BIAS | R_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return R_BIAS | R_GELU | R_AUXW;
    case CUBLASLT_EPILOGUE_DGELU:
        return R_DGELU;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return R_DGELU | R_BGRAD;
    default:
        return 0;
    }
}

/* Reference D (m x n, ld p->ldd), and aux / bias as the epilogue writes them, from the values
 * the library saw. `round` rounds what is stored to bf16. */
static void mm_reference(const struct mm *p, const struct mat *A, const struct mat *B,
                         const struct mat *C, float *D, float *aux, const float *aux_in,
                         float *bias, const float *bias_in)
{
    unsigned f = epi_flags(p->epilogue);
    bool rd = is_bf16(p->cd_type);
    for (int i = 0; i < p->m; i++) {
        float bg = 0.0f;
        for (int j = 0; j < p->n; j++) {
            float acc = 0.0f;
            for (int l = 0; l < p->k; l++)
                acc += op_a(p, A->v, i, l) * op_b(p, B->v, l, j);
            float x = p->alpha * acc;
            if (p->beta != 0.0f)
                x += p->beta * C->v[i + (size_t)j * p->ldc];
            if (f & R_BIAS)
                x += bias_in[i];
            if (f & R_AUXW)
                aux[i + (size_t)j * p->ldaux] = rd ? round_bf16(x) : x;
            if (f & R_GELU)
                x = gelu_ref(x);
            if (f & R_DGELU)
                x *= gelu_grad_ref(aux_in[i + (size_t)j * p->ldaux]);
            bg += x;
            D[i + (size_t)j * p->ldd] = rd ? round_bf16(x) : x;
        }
        if (f & R_BGRAD)
            bias[i] = rd ? round_bf16(bg) : bg;
    }
    if (p->epilogue == CUBLASLT_EPILOGUE_BGRADA)
        for (int i = 0; i < p->m; i++) {
            float s = 0.0f;
            for (int l = 0; l < p->k; l++)
                s += op_a(p, A->v, i, l);
            bias[i] = rd ? round_bf16(s) : s;
        }
    if (p->epilogue == CUBLASLT_EPILOGUE_BGRADB)
        for (int j = 0; j < p->n; j++) {
            float s = 0.0f;
            for (int l = 0; l < p->k; l++)
                s += op_b(p, B->v, l, j);
            bias[j] = rd ? round_bf16(s) : s;
        }
}

/* |got - want| <= atol + rtol |want| for every element; prints the first mismatches. */
static bool close_all(const char *what, const struct mat *got, const float *want, size_t n,
                      float atol, float rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float g = mat_get(got, i), w = want[i];
        if (isnan(g) && isnan(w)) /* padding both left as NaN */
            continue;
        if (!(fabsf(g - w) <= atol + rtol * fabsf(w))) {
            if (bad < MAX_MISMATCHES)
                say("%s[%zu]: got %.9g, want %.9g", what, i, (double)g, (double)w);
            bad++;
        }
    }
    if (bad)
        say("%s: %d of %zu elements differ", what, bad, n);
    return bad == 0;
}

/* Tolerances: the library sums in the reference's order, so these only absorb tanhf and a
 * rounding at a bf16 tie. */
static float rtol_of(cudaDataType_t t)
{
    return is_bf16(t) ? 1e-2f : 1e-5f;
}

/* Runs p on random operands and compares D, aux and bias with the reference. */
static bool mm_check(const char *name, const struct mm *p)
{
    bool ok = true, in_place = p->ldc == -1; /* C is D */
    struct mm q = *p;
    if (in_place)
        q.ldc = q.ldd;
    size_t na = (size_t)q.lda * (q.ta ? q.m : q.k), nb = (size_t)q.ldb * (q.tb ? q.k : q.n),
           nc = (size_t)q.ldc * q.n, nd = (size_t)q.ldd * q.n,
           naux = (size_t)(q.ldaux ? q.ldaux : 1) * q.n, nbias = (size_t)(q.m > q.n ? q.m : q.n);
    struct mat A, B, C, D, aux, bias;
    unsigned f = epi_flags(q.epilogue);
    int found = 0;

    mat_init(&A, p->ab_type, na);
    mat_init(&B, p->ab_type, nb);
    mat_init(&C, p->cd_type, nc);
    mat_init(&D, p->cd_type, nd);
    mat_init(&aux, p->cd_type, naux);
    mat_init(&bias, p->cd_type, nbias);
    mat_random(&A);
    mat_random(&B);
    mat_random(&C);
    mat_fill(&D, NAN);
    if (f & R_DGELU)
        mat_random(&aux);
    else
        mat_fill(&aux, -7.0f);
    if (f & R_BIAS)
        mat_random(&bias);
    else
        mat_fill(&bias, -7.0f);
    if (in_place) {
        mat_random(&D);
        memcpy(C.v, D.v, nd * sizeof(float));
    }
    if (p->epilogue != CUBLASLT_EPILOGUE_DEFAULT && p->epilogue)
        q.bias = bias.dev;
    if (f & (R_AUXW | R_DGELU))
        q.aux = aux.dev;

    float *want = malloc(nd * sizeof(float)), *want_aux = malloc(naux * sizeof(float)),
          *want_bias = malloc(nbias * sizeof(float));
    if (!want || !want_aux || !want_bias)
        abort();
    memcpy(want, D.v, nd * sizeof(float));
    memcpy(want_aux, aux.v, naux * sizeof(float));
    memcpy(want_bias, bias.v, nbias * sizeof(float));
    mm_reference(&q, &A, &B, &C, want, want_aux, aux.v, want_bias, bias.v);

    cublasStatus_t s = mm_run(&q, A.dev, B.dev, in_place ? D.dev : C.dev, D.dev, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS && found == 1, "%s: status %s, %d algorithms", name,
           cublasLtGetStatusName(s), found);
    if (s || !found) {
        ok = false;
        goto out;
    }
    /* Padding rows (ld > m) keep what was there; the reference left them as they were too. */
    ok &= close_all(name, &D, want, nd, 1e-6f, rtol_of(p->cd_type));
    if (f & R_AUXW)
        ok &= close_all("aux", &aux, want_aux, naux, 1e-6f, rtol_of(p->cd_type));
    if ((f & R_BGRAD) || p->epilogue == CUBLASLT_EPILOGUE_BGRADA ||
        p->epilogue == CUBLASLT_EPILOGUE_BGRADB)
        ok &= close_all("bias gradient", &bias, want_bias, nbias, 1e-5f, rtol_of(p->cd_type));
    if (!ok)
        say("%s: m %d n %d k %d transa %d transb %d lda %d ldb %d ldc %d ldd %d alpha %g beta %g",
            name, p->m, p->n, p->k, p->ta, p->tb, p->lda, p->ldb, q.ldc, p->ldd, (double)p->alpha,
            (double)p->beta);
out:
    free(want);
    free(want_aux);
    free(want_bias);
    mat_release(&A);
    mat_release(&B);
    mat_release(&C);
    mat_release(&D);
    mat_release(&aux);
    mat_release(&bias);
    failed |= !ok;
    return ok;
}

static struct mm mm_make(cudaDataType_t t, int m, int n, int k, bool ta, bool tb, int pad)
{
    struct mm p = {0};
    p.ab_type = p.cd_type = t;
    p.m = m, p.n = n, p.k = k;
    p.ta = ta, p.tb = tb;
    p.lda = (ta ? k : m) + pad;
    p.ldb = (tb ? n : k) + pad;
    p.ldc = p.ldd = m + pad;
    p.alpha = 1.0f;
    p.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    p.bias_type = -1;
    return p;
}

static const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16BF};

static void test_lt_products(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {5, 7, 9}, {16, 24, 40}, {33, 8, 17}, {8, 64, 3}};
    char name[128];
    for (size_t t = 0; t < 2; t++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
                    for (int v = 0; v < 3; v++) {
                        struct mm p = mm_make(types[t], shapes[s][0], shapes[s][1], shapes[s][2],
                                              ta, tb, v ? 3 : 0);
                        if (v == 1)
                            p.alpha = 0.75f, p.beta = 0.5f; /* C separate */
                        if (v == 2)
                            p.beta = 1.0f, p.ldc = -1; /* C is D: accumulate */
                        snprintf(name, sizeof(name), "%s %c%c %dx%dx%d v%d", t ? "bf16" : "fp32",
                                 ta ? 'T' : 'N', tb ? 'T' : 'N', p.m, p.n, p.k, v);
                        if (!mm_check(name, &p))
                            return;
                    }
}

static void test_lt_epilogues(void)
{
    static const uint32_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT,   CUBLASLT_EPILOGUE_BIAS,
                                    CUBLASLT_EPILOGUE_GELU,      CUBLASLT_EPILOGUE_GELU_AUX,
                                    CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                    CUBLASLT_EPILOGUE_DGELU,     CUBLASLT_EPILOGUE_DGELU_BGRAD,
                                    CUBLASLT_EPILOGUE_BGRADA,    CUBLASLT_EPILOGUE_BGRADB};
    char name[128];
    for (size_t t = 0; t < 2; t++)
        for (size_t e = 0; e < sizeof(epis) / sizeof(epis[0]); e++)
            for (int ta = 0; ta < 2; ta++) {
                struct mm p = mm_make(types[t], 24, 10, 12, ta, !ta, 2);
                p.epilogue = epis[e];
                p.ldaux = 32; /* a multiple of 8 above m: the padding must stay untouched */
                if (ta)
                    p.beta = 0.5f;
                snprintf(name, sizeof(name), "%s epilogue %u trans %d", t ? "bf16" : "fp32",
                         epis[e], ta);
                if (!mm_check(name, &p))
                    return;
            }
}

/* Known answers, by hand, for the orientation of bias, aux and the bias gradients:
 * op(A) = [1; 2] (m 2, k 1), op(B) = [1 2 3] (k 1, n 3), so op(A) op(B) = [1 2 3; 2 4 6]. */
static void test_lt_known_answers(void)
{
    float a[2] = {1, 2}, b[3] = {1, 2, 3}, d[6] = {0}, bias[3] = {0}, aux[24] = {0};
    struct mm p = mm_make(CUDA_R_32F, 2, 3, 1, false, false, 0);
    cublasStatus_t s;

    /* BIAS: one value per row of D (length m), the same in every column. */
    float bias2[2] = {10, 20};
    p.epilogue = CUBLASLT_EPILOGUE_BIAS;
    p.bias = bias2;
    s = mm_run(&p, a, b, d, d, NULL);
    float want_bias[6] = {11, 22, 12, 24, 13, 26};
    EXPECT(s == 0 && !memcmp(d, want_bias, sizeof(d)),
           "BIAS: status %d, D = %g %g %g %g %g %g (column-major), want 11 22 12 24 13 26", s,
           (double)d[0], (double)d[1], (double)d[2], (double)d[3], (double)d[4], (double)d[5]);

    /* GELU_AUX_BIAS: aux (ld 8) holds bias + product, D its GELU; bias {-1, 0.5}. */
    float bias3[2] = {-1.0f, 0.5f}, x[6] = {0, 2.5f, 1, 4.5f, 2, 6.5f};
    for (int i = 0; i < 24; i++)
        aux[i] = -7.0f;
    p.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    p.bias = bias3;
    p.aux = aux;
    p.ldaux = 8;
    s = mm_run(&p, a, b, d, d, NULL);
    EXPECT(s == 0, "GELU_AUX_BIAS: status %d", s);
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 2; i++) {
            float xv = x[i + 2 * j];
            EXPECT(aux[i + 8 * j] == xv, "GELU_AUX_BIAS: aux(%d,%d) = %g, want %g", i, j,
                   (double)aux[i + 8 * j], (double)xv);
            EXPECT(fabsf(d[i + 2 * j] - gelu_ref(xv)) <= 1e-6f,
                   "GELU_AUX_BIAS: D(%d,%d) = %g, want gelu(%g) = %g", i, j, (double)d[i + 2 * j],
                   (double)xv, (double)gelu_ref(xv));
            for (int r = 2; r < 8; r++)
                EXPECT(aux[r + 8 * j] == -7.0f, "GELU_AUX_BIAS: aux padding (%d,%d) written", r, j);
        }
    EXPECT(fabsf(d[2] - 0.841192f) < 1e-5f, "gelu(1) = %g, want 0.841192 (tanh form)",
           (double)d[2]);

    /* DGELU: D = product * gelu'(aux); aux row 0 zero (gelu'(0) = 0.5), row 1 ten (about 1). */
    for (int j = 0; j < 3; j++)
        aux[0 + 8 * j] = 0.0f, aux[1 + 8 * j] = 10.0f;
    p.epilogue = CUBLASLT_EPILOGUE_DGELU;
    p.bias = NULL;
    s = mm_run(&p, a, b, d, d, NULL);
    float want_dgelu[6] = {0.5f, 2, 1, 4, 1.5f, 6};
    for (int i = 0; i < 6; i++)
        EXPECT(s == 0 && fabsf(d[i] - want_dgelu[i]) <= 1e-5f, "DGELU: D[%d] = %g, want %g", i,
               (double)d[i], (double)want_dgelu[i]);

    /* DGELU_BGRAD: and the bias gradient, one per row of D, summed over its columns. */
    p.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    p.bias = bias;
    bias[0] = bias[1] = bias[2] = -7.0f;
    s = mm_run(&p, a, b, d, d, NULL);
    EXPECT(s == 0 && fabsf(bias[0] - 3.0f) <= 1e-5f && fabsf(bias[1] - 12.0f) <= 1e-4f &&
               bias[2] == -7.0f,
           "DGELU_BGRAD: status %d, bias = %g %g %g, want 3 12 (untouched -7)", s, (double)bias[0],
           (double)bias[1], (double)bias[2]);

    /* BGRADA / BGRADB: sums over k of op(A)'s rows (length m) / op(B)'s columns (length n).
     * op(A) = [1 2; 3 4] stored transposed (A = [1 3; 2 4] column-major, op T); op(B) =
     * [1 2 3; 4 5 6] stored as is. */
    float a2[4] = {1, 2, 3, 4}, b2[6] = {1, 4, 2, 5, 3, 6}, d2[6] = {0};
    struct mm q = mm_make(CUDA_R_32F, 2, 3, 2, true, false, 0);
    q.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    q.bias = bias;
    bias[0] = bias[1] = bias[2] = -7.0f;
    s = mm_run(&q, a2, b2, d2, d2, NULL);
    EXPECT(s == 0 && bias[0] == 3.0f && bias[1] == 7.0f && bias[2] == -7.0f,
           "BGRADA: status %d, bias = %g %g %g, want 3 7 (untouched -7)", s, (double)bias[0],
           (double)bias[1], (double)bias[2]);
    float want_d2[6] = {9, 19, 12, 26, 15, 33}; /* [1 2; 3 4] [1 2 3; 4 5 6] */
    EXPECT(!memcmp(d2, want_d2, sizeof(d2)), "BGRADA: D = %g %g %g %g %g %g", (double)d2[0],
           (double)d2[1], (double)d2[2], (double)d2[3], (double)d2[4], (double)d2[5]);
    q.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    s = mm_run(&q, a2, b2, d2, d2, NULL);
    EXPECT(s == 0 && bias[0] == 5.0f && bias[1] == 7.0f && bias[2] == 9.0f,
           "BGRADB: status %d, bias = %g %g %g, want 5 7 9", s, (double)bias[0], (double)bias[1],
           (double)bias[2]);
}

/* kernels/cuda/matmul.cu's linear layer, its calls copied: row-major inp (N,C), weight (OC,C),
 * out (N,OC); out = inp weight^T + bias with GELU (pre_gelu kept), dinp = (dout weight) *
 * gelu'(pre_gelu), dweight += dout^T inp. Checked against row-major loops. */
static void test_lt_linear_layer(void)
{
    enum { N = 12, C = 16, OC = 24 };
    for (size_t t = 0; t < 2; t++) {
        cudaDataType_t ty = types[t];
        struct mat inp, w, bias, out, pre, dout, dinp, dw;
        float want[N * OC], want_pre[N * OC], want_dinp[N * C], want_dw[OC * C];
        mat_init(&inp, ty, N * C);
        mat_init(&w, ty, OC * C);
        mat_init(&bias, ty, OC);
        mat_init(&out, ty, N * OC);
        mat_init(&pre, ty, N * OC);
        mat_init(&dout, ty, N * OC);
        mat_init(&dinp, ty, N * C);
        mat_init(&dw, ty, OC * C);
        mat_random(&inp);
        mat_random(&w);
        mat_random(&bias);
        mat_random(&dout);
        mat_random(&dw);
        mat_fill(&out, NAN);
        mat_fill(&pre, NAN);
        mat_fill(&dinp, NAN);
        bool rd = is_bf16(ty);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                float s = 0.0f;
                for (int c = 0; c < C; c++)
                    s += inp.v[n * C + c] * w.v[o * C + c];
                s += bias.v[o];
                want_pre[n * OC + o] = rd ? round_bf16(s) : s;
                want[n * OC + o] = rd ? round_bf16(gelu_ref(s)) : gelu_ref(s);
            }

        /* forward: out^T (OC,N) = weight (OC,C) . inp^T (C,N), A = weight^T stored, op T */
        struct mm f = mm_make(ty, OC, N, C, true, false, 0);
        f.lda = C, f.ldb = C, f.ldc = f.ldd = OC;
        f.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        f.bias = bias.dev;
        f.aux = pre.dev;
        f.ldaux = OC;
        cublasStatus_t s = mm_run(&f, w.dev, inp.dev, out.dev, out.dev, NULL);
        EXPECT(s == 0, "forward: status %s", cublasLtGetStatusName(s));
        failed |= !close_all("forward out", &out, want, N * OC, 1e-6f, rtol_of(ty));
        failed |= !close_all("forward pre_gelu", &pre, want_pre, N * OC, 1e-6f, rtol_of(ty));

        /* dweight^T (C,OC) += inp^T (C,N) . dout (N,OC): B = dout^T stored, op T */
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int n = 0; n < N; n++)
                    acc += inp.v[n * C + c] * dout.v[n * OC + o];
                float v = acc + dw.v[o * C + c];
                want_dw[o * C + c] = rd ? round_bf16(v) : v;
            }
        struct mm g = mm_make(ty, C, OC, N, false, true, 0);
        g.lda = C, g.ldb = OC, g.ldc = g.ldd = C;
        g.beta = 1.0f;
        s = mm_run(&g, inp.dev, dout.dev, dw.dev, dw.dev, NULL);
        EXPECT(s == 0, "dweight: status %s", cublasLtGetStatusName(s));
        failed |= !close_all("dweight", &dw, want_dw, OC * C, 1e-6f, rtol_of(ty));

        /* dinp^T (C,N) = weight^T (C,OC) . dout^T (OC,N) with the GELU gradient of a pre_gelu
         * (N,C): here the layer's own inp plays pre_gelu. */
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int o = 0; o < OC; o++)
                    acc += dout.v[n * OC + o] * w.v[o * C + c];
                float v = acc * gelu_grad_ref(inp.v[n * C + c]);
                want_dinp[n * C + c] = rd ? round_bf16(v) : v;
            }
        struct mm h = mm_make(ty, C, N, OC, false, false, 0);
        h.lda = C, h.ldb = OC, h.ldc = h.ldd = C;
        h.epilogue = CUBLASLT_EPILOGUE_DGELU;
        h.aux = inp.dev;
        h.ldaux = C;
        s = mm_run(&h, w.dev, dout.dev, dinp.dev, dinp.dev, NULL);
        EXPECT(s == 0, "dinp: status %s", cublasLtGetStatusName(s));
        failed |= !close_all("dinp", &dinp, want_dinp, N * C, 1e-6f, rtol_of(ty));

        mat_release(&inp);
        mat_release(&w);
        mat_release(&bias);
        mat_release(&out);
        mat_release(&pre);
        mat_release(&dout);
        mat_release(&dinp);
        mat_release(&dw);
    }
}

/* What cuBLASLt refuses is refused: NOT_SUPPORTED from the heuristic (so that matmul.cu's
 * fallback runs), INVALID_VALUE for malformed calls, nothing computed silently wrong. */
static void test_lt_refusals(void)
{
    float a[64 * 64] = {0}, b[64 * 64] = {0}, d[64 * 64] = {0}, aux[64 * 64] = {0}, bias[64] = {0};
    struct mm p;
    cublasStatus_t s;
    int found = -1;

    p = mm_make(CUDA_R_32F, 16, 8, 8, false, false, 0);
    p.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    p.aux = aux;
    p.ldaux = 20; /* not a multiple of 8 */
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "AUX_LD 20: %s", cublasLtGetStatusName(s));
    p.ldaux = 8; /* below the rows of D */
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "AUX_LD 8 < m 16: %s", cublasLtGetStatusName(s));

    p = mm_make(CUDA_R_32F, 8, 8, 8, false, false, 0);
    p.epilogue = CUBLASLT_EPILOGUE_RELU;
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "RELU: %s", cublasLtGetStatusName(s));

    p = mm_make(CUDA_R_32F, 8, 8, 8, false, false, 0);
    p.lda = 4; /* below the rows of A */
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "lda 4 < 8 rows: %s", cublasLtGetStatusName(s));

    p = mm_make(CUDA_R_32F, 8, 8, 8, false, false, 0);
    p.ab_type = CUDA_R_32F, p.cd_type = CUDA_R_16BF; /* fp32 in, bf16 out */
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "fp32 to bf16: %s", cublasLtGetStatusName(s));

    p = mm_make(CUDA_R_16BF, 8, 8, 8, false, false, 0);
    p.align = 1; /* below a bf16 element */
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS && found == 0, "alignment 1 for bf16: %s, %d algorithms",
           cublasLtGetStatusName(s), found);

    /* an operand less aligned than the heuristic was told (the default, 256 bytes) */
    p = mm_make(CUDA_R_32F, 8, 8, 8, false, false, 0);
    float *ab = aligned_alloc(256, 256 * 4);
    p.align = 256;
    s = mm_run(&p, ab + 1, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_INVALID_VALUE, "A 4-byte aligned, heuristic told 256: %s",
           cublasLtGetStatusName(s));
    p.align = 4;
    s = mm_run(&p, ab + 1, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS, "A 4-byte aligned, heuristic told 4: %s",
           cublasLtGetStatusName(s));
    free(ab);

    /* bf16 in, fp32 out is a product cuBLASLt offers */
    p = mm_make(CUDA_R_16BF, 8, 8, 8, false, false, 0);
    p.cd_type = CUDA_R_32F;
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS && d[0] == 0.0f, "bf16 to fp32: %s",
           cublasLtGetStatusName(s));

    /* bias type fp32 with bf16 D (BIAS_DATA_TYPE) */
    p = mm_make(CUDA_R_16BF, 8, 8, 8, false, false, 0);
    p.epilogue = CUBLASLT_EPILOGUE_BIAS;
    p.bias = bias;
    p.bias_type = CUDA_R_32F;
    for (int i = 0; i < 8; i++)
        bias[i] = (float)i + 0.5f;
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS && bf16_to_f32(((uint16_t *)d)[3 + 8 * 5]) == 3.5f,
           "fp32 bias on bf16 D: %s, D(3,5) = %g", cublasLtGetStatusName(s),
           (double)bf16_to_f32(((uint16_t *)d)[3 + 8 * 5]));

    /* a bias gradient (BGRADB) of fp32 with bf16 D: the heuristic query's INVALID_VALUE, as
     * cuBLASLt 13 answers on an H200; of D's type it runs */
    p = mm_make(CUDA_R_16BF, 8, 8, 8, false, true, 0);
    p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    p.bias = bias;
    p.bias_type = CUDA_R_32F;
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_INVALID_VALUE, "fp32 BGRADB on bf16 D: %s", cublasLtGetStatusName(s));
    p.bias_type = CUDA_R_16BF;
    s = mm_run(&p, a, b, d, d, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS, "bf16 BGRADB on bf16 D: %s", cublasLtGetStatusName(s));

    /* malformed calls */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l8, l4;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int32_t op = CUBLAS_OP_T;
    int64_t ld64 = 8;
    float one = 1.0f, zero = 0.0f;
    void *ptr = a;
    EXPECT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0, "desc");
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, 8) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "TRANSA with 8 bytes accepted");
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &op, 4) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "AUX_LD with 4 bytes accepted (it is int64_t)");
    EXPECT(cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)9999, &op, 4) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "attribute 9999 accepted");
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "NULL buffer accepted");
    EXPECT(cublasLtMatrixLayoutCreate(&l8, CUDA_R_32F, 8, 8, 8) == 0 &&
               cublasLtMatrixLayoutCreate(&l4, CUDA_R_32F, 4, 8, 4) == 0 &&
               cublasLtMatmulPreferenceCreate(&pref) == 0,
           "layouts");
    EXPECT(cublasLtMatmulAlgoGetHeuristic(lt, desc, l8, l8, l8, l8, pref, 0, &heur, &found) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "requestedAlgoCount 0 accepted");
    /* op(A) 8x8 with D 4x8: the dimensions disagree */
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, l8, l8, l4, l4, pref, 1, &heur, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "heuristic, m disagrees: %s",
           cublasLtGetStatusName(s));
    s = cublasLtMatmul(lt, desc, &one, a, l8, b, l8, &zero, d, l4, d, l4, NULL, NULL, 0, NULL);
    EXPECT(s == CUBLAS_STATUS_INVALID_VALUE, "matmul, m disagrees: %s", cublasLtGetStatusName(s));
    /* a scale pointer: accepted by SetAttribute, refused by the heuristic */
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptr,
                                          sizeof(ptr)) == 0,
           "A_SCALE_POINTER refused by SetAttribute");
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, l8, l8, l8, l8, pref, 1, &heur, &found);
    EXPECT(s == CUBLAS_STATUS_NOT_SUPPORTED, "A_SCALE_POINTER: %s", cublasLtGetStatusName(s));
    ptr = NULL;
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptr,
                                          sizeof(ptr)) == 0,
           "A_SCALE_POINTER NULL");
    /* the epilogue needs its pointer at matmul time */
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)) ==
               0,
           "epilogue");
    s = cublasLtMatmul(lt, desc, &one, a, l8, b, l8, &zero, d, l8, d, l8, NULL, NULL, 0, NULL);
    EXPECT(s == CUBLAS_STATUS_INVALID_VALUE, "BIAS without a bias pointer: %s",
           cublasLtGetStatusName(s));
    size_t written = 0;
    EXPECT(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, NULL, 0,
                                          &written) == 0 &&
               written == sizeof(int64_t),
           "AUX_LD size %zu", written);
    EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld64,
                                          sizeof(ld64)) == 0,
           "AUX_LD");
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(l4);
    cublasLtMatrixLayoutDestroy(l8);
    cublasLtMatmulDescDestroy(desc);
}

/* beta = 0 never reads C (BLAS); the same product twice gives the same bits. */
static void test_lt_beta_zero_and_repeat(void)
{
    for (size_t t = 0; t < 2; t++) {
        struct mm p = mm_make(types[t], 16, 16, 64, true, false, 0);
        struct mat A, B, C, D1, D2;
        mat_init(&A, p.ab_type, 16 * 64);
        mat_init(&B, p.ab_type, 16 * 64);
        mat_init(&C, p.cd_type, 16 * 16);
        mat_init(&D1, p.cd_type, 16 * 16);
        mat_init(&D2, p.cd_type, 16 * 16);
        mat_random(&A);
        mat_random(&B);
        mat_fill(&C, NAN);
        p.lda = p.ldb = 64;
        EXPECT(mm_run(&p, A.dev, B.dev, C.dev, D1.dev, NULL) == 0 &&
                   mm_run(&p, A.dev, B.dev, C.dev, D2.dev, NULL) == 0,
               "product failed");
        bool finite = true;
        for (int i = 0; i < 256; i++)
            finite &= isfinite(mat_get(&D1, (size_t)i));
        EXPECT(finite, "%s: beta 0 read C's NaN", t ? "bf16" : "fp32");
        EXPECT(!memcmp(D1.dev, D2.dev, 256 * (t ? 2 : 4)), "%s: two runs differ",
               t ? "bf16" : "fp32");
        mat_release(&A);
        mat_release(&B);
        mat_release(&C);
        mat_release(&D1);
        mat_release(&D2);
    }
}

/* ---- NCCL ---------------------------------------------------------------------------------- */

/* Where the ranks (children) leave what the parent checks. */
struct shared {
    long t_kill;
    struct {
        long t_err, elapsed;
        int err, async_err;
        char msg[200];
    } rank[8];
};
static struct shared *sh;

/* The id's segment name, read from where this sim keeps it (after its 16-byte tag). */
static const char *id_name(const ncclUniqueId *id)
{
    return id->internal + 16;
}

static bool shm_exists(const char *name)
{
    char path[160];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

#define NEXPECT(call, want)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        EXPECT(r_ == (want), "rank %d: %s: %s (%s)", rank, #call, ncclGetErrorString(r_),          \
               ncclGetLastError(NULL));                                                            \
    } while (0)

static int rank; /* the running rank, for messages */

static bool same_bits(const char *what, const void *got, const void *want, size_t n, size_t es)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) {
            say("rank %d: %s: element %zu of %zu differs", rank, what, i, n);
            failed = true;
            return false;
        }
    return true;
}

/* Every rank's input of element i, known to all ranks so each can compute the reference. */
static float in_f32(int r, size_t i)
{
    return (float)(r + 1) * (float)(i % 17) * 0.37f + 0.25f * (float)r + 1e-3f * (float)(i % 5);
}

static uint16_t in_bf16(int r, size_t i)
{
    /* element 0: 1, 2^-8, 2^-8: rounded once the sum is 1 + 2^-7; rounded after each
     * addition it would stay 1 */
    if (i == 0)
        return f32_to_bf16(r == 0 ? 1.0f : 0.00390625f);
    return f32_to_bf16(in_f32(r, i) * 0.01f);
}

/* The collectives of one rank of `n`, each checked bitwise against the rank-order reference. */
static void rank_collectives(ncclComm_t comm, int n)
{
    const size_t big = 700000; /* floats: several 1 MiB steps */
    float *x = malloc(big * sizeof(float)), *y = malloc(big * sizeof(float) * 3),
          *want = malloc(big * sizeof(float) * 3);
    uint16_t *hx = malloc(4096 * 2), *hwant = malloc(4096 * 2);
    int cnt = -1, me = -1;
    if (!x || !y || !want || !hx || !hwant)
        abort();

    NEXPECT(ncclCommCount(comm, &cnt), ncclSuccess);
    NEXPECT(ncclCommUserRank(comm, &me), ncclSuccess);
    EXPECT(cnt == n && me == rank, "rank %d: count %d, user rank %d", rank, cnt, me);

    /* allreduce sum, out of place and in place, small and big; avg in place */
    for (int v = 0; v < 4; v++) {
        size_t count = v < 2 ? 1000 : big;
        bool in_place = v & 1;
        for (size_t i = 0; i < count; i++) {
            x[i] = in_f32(rank, i);
            float s = in_f32(0, i);
            for (int r = 1; r < n; r++)
                s += in_f32(r, i);
            want[i] = s;
        }
        NEXPECT(ncclAllReduce(x, in_place ? x : y, count, ncclFloat32, ncclSum, comm, NULL),
                ncclSuccess);
        same_bits("allreduce sum", in_place ? x : y, want, count, 4);
    }
    for (size_t i = 0; i < 1000; i++) {
        x[i] = in_f32(rank, i);
        float s = in_f32(0, i);
        for (int r = 1; r < n; r++)
            s += in_f32(r, i);
        want[i] = s / (float)n;
    }
    NEXPECT(ncclAllReduce(x, x, 1000, ncclFloat32, ncclAvg, comm, NULL), ncclSuccess);
    same_bits("allreduce avg", x, want, 1000, 4);

    /* bf16: summed in fp32 in rank order, rounded once */
    for (int avg = 0; avg < 2; avg++) {
        for (size_t i = 0; i < 4096; i++) {
            hx[i] = in_bf16(rank, i);
            float s = bf16_to_f32(in_bf16(0, i));
            for (int r = 1; r < n; r++)
                s += bf16_to_f32(in_bf16(r, i));
            hwant[i] = f32_to_bf16(avg ? s / (float)n : s);
        }
        NEXPECT(ncclAllReduce(hx, hx, 4096, ncclBfloat16, avg ? ncclAvg : ncclSum, comm, NULL),
                ncclSuccess);
        same_bits(avg ? "bf16 allreduce avg" : "bf16 allreduce sum", hx, hwant, 4096, 2);
    }
    if (n == 3) {
        hx[0] = in_bf16(rank, 0);
        NEXPECT(ncclAllReduce(hx, hx, 1, ncclBfloat16, ncclSum, comm, NULL), ncclSuccess);
        EXPECT(hx[0] == 0x3f81, "rank %d: bf16 1 + 2^-8 + 2^-8 = 0x%04x, want 0x3f81 (1 + 2^-7)",
               rank, hx[0]);
    }

    /* reduce-scatter in place (recvbuff = sendbuff + rank * recvcount) and out of place */
    for (int v = 0; v < 3; v++) {
        size_t rc = v == 2 ? 150000 : 1000;
        bool in_place = v != 1;
        for (size_t i = 0; i < rc * (size_t)n; i++) {
            x[i] = in_f32(rank, i);
            float s = in_f32(0, i);
            for (int r = 1; r < n; r++)
                s += in_f32(r, i);
            want[i] = s;
        }
        float *recv = in_place ? x + (size_t)rank * rc : y;
        NEXPECT(ncclReduceScatter(x, recv, rc, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
        same_bits("reducescatter", recv, want + (size_t)rank * rc, rc, 4);
    }

    /* all-gather in place (sendbuff = recvbuff + rank * sendcount) and out of place */
    for (int v = 0; v < 3; v++) {
        size_t sc = v == 2 ? 200000 : 1000;
        bool in_place = v != 1;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < sc; i++)
                want[(size_t)r * sc + i] = in_f32(r, i);
        for (size_t i = 0; i < sc * (size_t)n; i++)
            y[i] = NAN;
        float *send = in_place ? y + (size_t)rank * sc : x;
        for (size_t i = 0; i < sc; i++)
            send[i] = in_f32(rank, i);
        NEXPECT(ncclAllGather(send, y, sc, ncclFloat32, comm, NULL), ncclSuccess);
        same_bits("allgather", y, want, sc * (size_t)n, 4);
    }

    /* broadcast from the last rank, out of place and in place, over several steps */
    int root = n - 1;
    for (int v = 0; v < 2; v++) {
        size_t count = 300000;
        for (size_t i = 0; i < count; i++) {
            x[i] = in_f32(rank, i);
            y[i] = NAN;
            want[i] = in_f32(root, i);
        }
        float *recv = v ? x : y;
        NEXPECT(ncclBroadcast(x, recv, count, ncclFloat32, root, comm, NULL), ncclSuccess);
        same_bits("broadcast", recv, want, count, 4);
    }

    /* reduce to the last rank; the others pass no receive buffer */
    for (size_t i = 0; i < 5000; i++) {
        x[i] = in_f32(rank, i);
        float s = in_f32(0, i);
        for (int r = 1; r < n; r++)
            s += in_f32(r, i);
        want[i] = s;
        y[i] = NAN;
    }
    NEXPECT(ncclReduce(x, rank == root ? y : NULL, 5000, ncclFloat32, ncclSum, root, comm, NULL),
            ncclSuccess);
    if (rank == root)
        same_bits("reduce", y, want, 5000, 4);

    /* max, integers, fp64 average, inside a group */
    NEXPECT(ncclGroupStart(), ncclSuccess);
    float fm = (float)rank * (rank == 1 ? -1.0f : 1.0f), fwant = (float)(n - 1);
    NEXPECT(ncclAllReduce(&fm, &fm, 1, ncclFloat32, ncclMax, comm, NULL), ncclSuccess);
    int32_t i32 = (int32_t)((uint32_t)INT32_MAX - 1 + (uint32_t)rank), i32want = 0;
    for (int r = 0; r < n; r++)
        i32want = (int32_t)((uint32_t)i32want + (uint32_t)INT32_MAX - 1 + (uint32_t)r);
    NEXPECT(ncclAllReduce(&i32, &i32, 1, ncclInt32, ncclSum, comm, NULL), ncclSuccess);
    int64_t i64 = ((int64_t)1 << 40) * (rank + 1), i64want = 0;
    for (int r = 0; r < n; r++)
        i64want += ((int64_t)1 << 40) * (r + 1);
    NEXPECT(ncclAllReduce(&i64, &i64, 1, ncclInt64, ncclSum, comm, NULL), ncclSuccess);
    uint8_t u8 = 200, u8want = (uint8_t)(200 * n);
    NEXPECT(ncclAllReduce(&u8, &u8, 1, ncclUint8, ncclSum, comm, NULL), ncclSuccess);
    double f64 = 0.1 * (rank + 1), f64want = 0.1;
    for (int r = 1; r < n; r++)
        f64want += 0.1 * (r + 1);
    f64want /= n;
    NEXPECT(ncclAllReduce(&f64, &f64, 1, ncclFloat64, ncclAvg, comm, NULL), ncclSuccess);
    NEXPECT(ncclGroupEnd(), ncclSuccess);
    EXPECT(fm == fwant && i32 == i32want && i64 == i64want && u8 == u8want && f64 == f64want,
           "rank %d: max %g (want %g), int32 %d (%d), int64 %lld (%lld), uint8 %u (%u), fp64 avg "
           "%.17g (%.17g)",
           rank, (double)fm, (double)fwant, i32, i32want, (long long)i64, (long long)i64want, u8,
           u8want, f64, f64want);

    /* misuse is refused before anything moves */
    NEXPECT(ncclAllReduce(x, x, 4, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument);
    NEXPECT(ncclAllReduce(x, x, 4, ncclFloat16, ncclSum, comm, NULL), ncclInvalidArgument);
    NEXPECT(ncclBroadcast(x, x, 4, ncclFloat32, n, comm, NULL), ncclInvalidArgument);
    NEXPECT(ncclAllReduce(NULL, x, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    NEXPECT(ncclAllReduce(x, x, 0, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
    ncclResult_t async = ncclInternalError;
    NEXPECT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT(async == ncclSuccess, "rank %d: async error %d after refused calls", rank, async);

    free(x);
    free(y);
    free(want);
    free(hx);
    free(hwant);
}

static void test_nccl_basics(void)
{
    int v = 0;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    rank = 0;

    NEXPECT(ncclGetVersion(&v), ncclSuccess);
    EXPECT(v == NCCL_VERSION_CODE, "version %d, want %d", v, NCCL_VERSION_CODE);
    EXPECT(!strcmp(ncclGetErrorString(ncclRemoteError),
                   "remote process exited or there was a network error"),
           "ncclRemoteError's string");
    memset(&id, 0, sizeof(id));
    NEXPECT(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument);
    EXPECT(comm == NULL, "a comm from a zeroed id");
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT(shm_exists(id_name(&id)), "no segment '%s' after ncclGetUniqueId", id_name(&id));
    NEXPECT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
    NEXPECT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
    NEXPECT(ncclGroupEnd(), ncclInvalidUsage);

    /* a world of one: no segment left, every collective on its own */
    NEXPECT(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    EXPECT(!shm_exists(id_name(&id)), "segment '%s' left by a world of one", id_name(&id));
    int dev = -1;
    NEXPECT(ncclCommCuDevice(comm, &dev), ncclSuccess);
    EXPECT(dev == 0, "device %d", dev);
    rank_collectives(comm, 1);
    NEXPECT(ncclCommFinalize(comm), ncclSuccess);
    NEXPECT(ncclCommDestroy(comm), ncclSuccess);
}

/* Forks `n` ranks running fn(rank, id); returns their exit statuses (0 ok) in st[]. The
 * parent's `between` runs after the fork (or NULL). */
static void run_ranks(int n, void (*fn)(int, ncclUniqueId), const ncclUniqueId *id, int *st,
                      void (*between)(pid_t *))
{
    pid_t pids[8];
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            abort();
        if (pids[r] == 0) {
            alarm(CHILD_ALARM_S);
            rank = r;
            failed = false;
            fn(r, *id);
            fflush(stdout);
            _exit(failed ? 1 : 0);
        }
    }
    if (between)
        between(pids);
    for (int r = 0; r < n; r++) {
        int w = 0;
        waitpid(pids[r], &w, 0);
        st[r] = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
    }
}

static void rank_three(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    NEXPECT(ncclCommInitRank(&comm, 3, id, r), ncclSuccess);
    if (!comm)
        return;
    if (r == 0)
        EXPECT(!shm_exists(id_name(&id)), "segment '%s' still named after every rank joined",
               id_name(&id));
    rank_collectives(comm, 3);
    NEXPECT(ncclCommDestroy(comm), ncclSuccess);
}

static void test_nccl_three_ranks(void)
{
    ncclUniqueId id;
    int st[3];
    rank = -1;
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(3, rank_three, &id, st, NULL);
    for (int r = 0; r < 3; r++)
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
}

static void rank_nonblocking(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t res, state = ncclInProgress;
    float x = (float)r;
    cfg.blocking = 0;
    res = ncclCommInitRankConfig(&comm, 3, id, r, &cfg);
    EXPECT(res == ncclSuccess || res == ncclInProgress, "rank %d: non-blocking init: %s", r,
           ncclGetErrorString(res));
    if (!comm)
        return;
    for (int i = 0; i < 1000 && state == ncclInProgress; i++)
        NEXPECT(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    EXPECT(state == ncclSuccess, "rank %d: state %d", r, state);
    NEXPECT(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
    EXPECT(x == 3.0f, "rank %d: sum %g", r, (double)x);
    NEXPECT(ncclCommDestroy(comm), ncclSuccess);
}

static void test_nccl_nonblocking(void)
{
    ncclUniqueId id;
    int st[3];
    rank = -1;
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(3, rank_nonblocking, &id, st, NULL);
    for (int r = 0; r < 3; r++)
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
}

/* A peer killed mid-run: the survivors' collective fails within a second of the kill. */
static void rank_until_error(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    float x[1000];
    NEXPECT(ncclCommInitRank(&comm, 3, id, r), ncclSuccess);
    if (!comm)
        return;
    memset(x, 0, sizeof(x));
    for (;;) {
        ncclResult_t res = ncclAllReduce(x, x, 1000, ncclFloat32, ncclSum, comm, NULL);
        if (res != ncclSuccess) {
            sh->rank[r].t_err = now_ms();
            sh->rank[r].err = res;
            ncclCommGetAsyncError(comm, &res);
            sh->rank[r].async_err = res;
            snprintf(sh->rank[r].msg, sizeof(sh->rank[r].msg), "%s", ncclGetLastError(comm));
            break;
        }
    }
    ncclCommAbort(comm);
}

static void kill_rank2(pid_t *pids)
{
    usleep(300 * 1000);
    sh->t_kill = now_ms();
    kill(pids[2], SIGKILL);
}

static void test_nccl_dead_peer(void)
{
    ncclUniqueId id;
    int st[3];
    rank = -1;
    memset(sh, 0, sizeof(*sh));
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    /* rank 2 stays a zombie while the parent waits for ranks 0 and 1 */
    run_ranks(3, rank_until_error, &id, st, kill_rank2);
    EXPECT(st[2] == 128 + SIGKILL, "rank 2 exited %d, not killed", st[2]);
    for (int r = 0; r < 2; r++) {
        long dt = sh->rank[r].t_err - sh->t_kill;
        say("rank %d: %s after %ld ms: %s", r, ncclGetErrorString(sh->rank[r].err), dt,
            sh->rank[r].msg);
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
        EXPECT(sh->rank[r].err == ncclRemoteError && sh->rank[r].async_err == ncclRemoteError,
               "rank %d: error %d, async error %d, want ncclRemoteError", r, sh->rank[r].err,
               sh->rank[r].async_err);
        EXPECT(dt >= 0 && dt < 1000, "rank %d: failed %ld ms after the kill", r, dt);
    }
}

/* A peer that never comes: the others give up after CUDASIM_NCCL_TIMEOUT_MS; the late one then
 * fails at once (another rank gave up). */
static void rank_timeout(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    float x = 1.0f;
    setenv("CUDASIM_NCCL_TIMEOUT_MS", "300", 1);
    NEXPECT(ncclCommInitRank(&comm, 3, id, r), ncclSuccess);
    if (!comm)
        return;
    if (r == 2)
        usleep(1000 * 1000);
    long t0 = now_ms();
    sh->rank[r].err = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL);
    sh->rank[r].elapsed = now_ms() - t0;
    ncclCommGetAsyncError(comm, (ncclResult_t *)&sh->rank[r].async_err);
    snprintf(sh->rank[r].msg, sizeof(sh->rank[r].msg), "%s", ncclGetLastError(comm));
    NEXPECT(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL),
            (ncclResult_t)sh->rank[r].async_err);
    NEXPECT(ncclCommDestroy(comm), ncclSuccess);
}

static void test_nccl_timeout(void)
{
    ncclUniqueId id;
    int st[3], system_errors = 0;
    rank = -1;
    memset(sh, 0, sizeof(*sh));
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(3, rank_timeout, &id, st, NULL);
    for (int r = 0; r < 3; r++) {
        say("rank %d: %s after %ld ms: %s", r, ncclGetErrorString(sh->rank[r].err),
            sh->rank[r].elapsed, sh->rank[r].msg);
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
        EXPECT(sh->rank[r].err != ncclSuccess && sh->rank[r].async_err == sh->rank[r].err,
               "rank %d: error %d, async %d", r, sh->rank[r].err, sh->rank[r].async_err);
        system_errors += sh->rank[r].err == ncclSystemError;
    }
    EXPECT(system_errors >= 1, "no rank reported the timeout (ncclSystemError)");
    for (int r = 0; r < 2; r++)
        EXPECT(sh->rank[r].elapsed >= 250 && sh->rank[r].elapsed < 2000,
               "rank %d gave up after %ld ms, timeout 300", r, sh->rank[r].elapsed);
    EXPECT(sh->rank[2].err == ncclRemoteError && sh->rank[2].elapsed < 200,
           "late rank 2: %s after %ld ms, want ncclRemoteError at once",
           ncclGetErrorString(sh->rank[2].err), sh->rank[2].elapsed);
}

/* Ranks that disagree on the collective are told so, instead of hanging or mixing data. */
static void rank_mismatch(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    float x[16] = {0};
    NEXPECT(ncclCommInitRank(&comm, 3, id, r), ncclSuccess);
    if (!comm)
        return;
    NEXPECT(ncclAllReduce(x, x, r == 2 ? 11 : 10, ncclFloat32, ncclSum, comm, NULL),
            ncclInvalidUsage);
    say("rank %d: %s", r, ncclGetLastError(comm));
    NEXPECT(ncclCommDestroy(comm), ncclSuccess);
}

static void test_nccl_mismatch(void)
{
    ncclUniqueId id;
    int st[3];
    rank = -1;
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(3, rank_mismatch, &id, st, NULL);
    for (int r = 0; r < 3; r++)
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
}

/* Init with a rank missing times out, and leaves no segment behind. */
/* (The first rank to give up says ncclSystemError, the other may learn it from that rank
 * first: ncclRemoteError.) */
static void rank_init_timeout(int r, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    setenv("CUDASIM_NCCL_TIMEOUT_MS", "300", 1);
    long t0 = now_ms();
    ncclResult_t res = ncclCommInitRank(&comm, 3, id, r);
    long dt = now_ms() - t0;
    say("rank %d: %s after %ld ms: %s", r, ncclGetErrorString(res), dt, ncclGetLastError(NULL));
    EXPECT((res == ncclSystemError || res == ncclRemoteError) && comm == NULL && dt < 2000,
           "rank %d: init gave %s, comm %p after %ld ms", r, ncclGetErrorString(res), (void *)comm,
           dt);
}

static void test_nccl_init_timeout(void)
{
    ncclUniqueId id;
    int st[2];
    rank = -1;
    NEXPECT(ncclGetUniqueId(&id), ncclSuccess);
    run_ranks(2, rank_init_timeout, &id, st, NULL);
    for (int r = 0; r < 2; r++)
        EXPECT(st[r] == 0, "rank %d exited %d", r, st[r]);
    EXPECT(!shm_exists(id_name(&id)), "segment '%s' left after a failed init", id_name(&id));
}

/* Every segment this process's ids named is gone. */
static void test_nccl_no_leftovers(void)
{
    char prefix[64];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    snprintf(prefix, sizeof(prefix), "cudasim-nccl-%d-", (int)getpid());
    if (!d)
        return;
    while ((e = readdir(d)))
        EXPECT(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "/dev/shm/%s left behind",
               e->d_name);
    closedir(d);
}

/* ---- main ---------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
    {"cublaslt products (fp32, bf16; N/T x N/T; ld, alpha, beta, C = D)", test_lt_products},
    {"cublaslt every epilogue against the reference (fp32, bf16)", test_lt_epilogues},
    {"cublaslt known answers: bias per row of D, aux at ld, DGELU, BGRAD axes",
     test_lt_known_answers},
    {"cublaslt matmul.cu's row-major linear layer (forward, dweight, dinp)", test_lt_linear_layer},
    {"cublaslt refusals", test_lt_refusals},
    {"cublaslt beta 0 ignores C; runs repeat bit for bit", test_lt_beta_zero_and_repeat},
    {"nccl basics and a world of one", test_nccl_basics},
    {"nccl three ranks: every collective in and out of place", test_nccl_three_ranks},
    {"nccl non-blocking init", test_nccl_nonblocking},
    {"nccl a peer killed mid-run: error within a second", test_nccl_dead_peer},
    {"nccl a peer that never comes: timeout", test_nccl_timeout},
    {"nccl mismatched collectives", test_nccl_mismatch},
    {"nccl init with a rank missing", test_nccl_init_timeout},
    {"nccl no segment left in /dev/shm", test_nccl_no_leftovers},
};

int main(void)
{
    size_t n = sizeof(tests) / sizeof(tests[0]);
    int bad = 0;

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || cublasLtCreate(&lt)) {
        printf("Bail out! cannot set up\n");
        return 1;
    }
    printf("1..%zu\n", n);
    for (size_t i = 0; i < n; i++) {
        long t0 = now_ms();
        failed = false;
        tests[i].fn();
        printf("%s %zu - %s # %ld ms\n", failed ? "not ok" : "ok", i + 1, tests[i].name,
               now_ms() - t0);
        fflush(stdout);
        bad += failed;
    }
    cublasLtDestroy(lt);
    printf("# %zu passed, %d failed\n", n - (size_t)bad, bad);
    return bad ? 1 : 0;
}

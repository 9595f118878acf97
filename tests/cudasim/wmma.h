/* cudasim's nvcuda::wmma (the warp matrix API of <mma.h>), included by sim.h. The real header
 * declares the API for nvcc only; here it is emulated per lane for the 16x16x16 shape with
 * __nv_bfloat16 or __half inputs and float accumulators:
 *  - every lane's fragment holds the whole 16x16 tile (num_elements is 256 here, 8 or 4 on a
 *    GPU, where each lane holds an unspecified part of it), so an elementwise loop over
 *    frag.x[0 .. num_elements) acts on the whole tile as the lanes together would on a GPU;
 *  - load_matrix_sync, store_matrix_sync and mma_sync start and end with the warp's barrier
 *    (every lane of the warp must call them, as the API requires) and check the API's
 *    documented preconditions: a 256-bit aligned pointer, ldm a multiple of 16 bytes;
 *  - mma_sync computes D = A B + C in fp32, adding the products in k order (the products of
 *    16-bit inputs are exact in fp32). A lane whose inputs equal the previous lane's (the usual
 *    case) copies its result instead of computing it again.
 * What it cannot catch: code that assumes which elements a lane holds on a GPU (it holds them
 * all here). Code must use fragments through the API and uniform elementwise operations. */
#ifndef GPURUN_CUDASIM_WMMA_H
#define GPURUN_CUDASIM_WMMA_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* exec.cc: the running kernel and thread, for messages. */
bool cudasim_exec_where(char *buf, size_t len);

[[noreturn]] static inline void cudasim_wmma_fail(const char *fn, const char *what)
{
    char where[512];
    if (!cudasim_exec_where(where, sizeof(where)))
        snprintf(where, sizeof(where), "outside a kernel");
    fprintf(stderr, "cudasim: %s: %s (%s)\n", fn, what, where);
    fflush(stderr);
    abort();
}

namespace nvcuda
{
namespace wmma
{

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;

enum layout_t { mem_row_major, mem_col_major };

template <typename T, int size> struct __frag_base {
    enum { num_elements = size };
    enum { num_storage_elements = size };
    typedef T element_type;
    typedef T storage_element_type;
    T x[size];
};

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;

#define CUDASIM_WMMA_TILE 256 /* 16 x 16 elements, x[r * 16 + c] for row r, column c */

template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major>
    : public __frag_base<__nv_bfloat16, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major>
    : public __frag_base<__nv_bfloat16, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major>
    : public __frag_base<__nv_bfloat16, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major>
    : public __frag_base<__nv_bfloat16, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_a, 16, 16, 16, __half, row_major>
    : public __frag_base<__half, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_a, 16, 16, 16, __half, col_major>
    : public __frag_base<__half, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_b, 16, 16, 16, __half, row_major>
    : public __frag_base<__half, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<matrix_b, 16, 16, 16, __half, col_major>
    : public __frag_base<__half, CUDASIM_WMMA_TILE>
{
};
template <>
class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, CUDASIM_WMMA_TILE>
{
};

template <typename T, int size>
static inline void fill_fragment(__frag_base<T, size> &f, const T &v)
{
    for (int i = 0; i < size; i++)
        f.x[i] = v;
}

/* The API's preconditions on a memory operand: a 256-bit aligned pointer, ldm a multiple of 16
 * bytes (8 16-bit elements, 4 floats). */
static inline void cudasim_wmma_check(const char *fn, const void *p, unsigned ldm, size_t esize)
{
    char what[160];
    if ((uintptr_t)p % 32) {
        snprintf(what, sizeof(what), "pointer %p is not 256-bit aligned", p);
        cudasim_wmma_fail(fn, what);
    }
    if (ldm < 16 || (ldm * esize) % 16) {
        snprintf(what, sizeof(what), "ldm %u is below 16 or not a multiple of %zu elements", ldm,
                 16 / esize);
        cudasim_wmma_fail(fn, what);
    }
}

template <typename L> struct cudasim_wmma_layout;
template <> struct cudasim_wmma_layout<row_major> {
    static const bool col = false;
};
template <> struct cudasim_wmma_layout<col_major> {
    static const bool col = true;
};

/* Element (r, c) of a tile at p: p[r * ldm + c] in row-major order, p[c * ldm + r] in
 * column-major order (for matrix_b, r is k and c is n). */
template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
    static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value,
                  "an accumulator load takes a layout_t");
    __syncwarp();
    cudasim_wmma_check("load_matrix_sync", p, ldm, sizeof(T));
    bool col = cudasim_wmma_layout<L>::col;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    __syncwarp();
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t layout)
{
    __syncwarp();
    cudasim_wmma_check("load_matrix_sync", p, ldm, sizeof(float));
    bool col = layout == mem_col_major;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    __syncwarp();
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t layout)
{
    __syncwarp();
    cudasim_wmma_check("store_matrix_sync", p, ldm, sizeof(float));
    bool col = layout == mem_col_major;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[r * 16 + c];
    __syncwarp();
}

/* The last product computed by a lane of each warp (per host thread): its inputs' bytes and
 * its result. */
struct cudasim_wmma_memo {
    bool valid;
    int type;
    unsigned char a[CUDASIM_WMMA_TILE * 2], b[CUDASIM_WMMA_TILE * 2];
    float c[CUDASIM_WMMA_TILE], d[CUDASIM_WMMA_TILE];
};

static inline cudasim_wmma_memo *cudasim_wmma_memo_of_warp(void)
{
    static thread_local cudasim_wmma_memo memo[1024 / 32];
    unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    return &memo[(t / 32) % (1024 / 32)];
}

template <typename T> static inline float cudasim_wmma_float(T v)
{
    return (float)v;
}
template <> inline float cudasim_wmma_float<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
template <> inline float cudasim_wmma_float<__half>(__half v)
{
    return __half2float(v);
}

/* d = a b + c (d may be c). */
template <typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    static_assert(sizeof(T) == 2, "16-bit inputs");
    const int type = std::is_same<T, __half>::value ? 1 : 2;
    __syncwarp();
    cudasim_wmma_memo *m = cudasim_wmma_memo_of_warp();
    if (!(m->valid && m->type == type && !memcmp(m->a, a.x, sizeof(a.x)) &&
          !memcmp(m->b, b.x, sizeof(b.x)) && !memcmp(m->c, c.x, sizeof(c.x)))) {
        float fa[CUDASIM_WMMA_TILE], fb[CUDASIM_WMMA_TILE];
        for (int i = 0; i < CUDASIM_WMMA_TILE; i++) {
            fa[i] = cudasim_wmma_float(a.x[i]);
            fb[i] = cudasim_wmma_float(b.x[i]);
        }
        memcpy(m->a, a.x, sizeof(a.x));
        memcpy(m->b, b.x, sizeof(b.x));
        memcpy(m->c, c.x, sizeof(c.x));
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) {
                float s = c.x[r * 16 + n];
                for (int k = 0; k < 16; k++)
                    s += fa[r * 16 + k] * fb[k * 16 + n];
                m->d[r * 16 + n] = s;
            }
        m->type = type;
        m->valid = true;
    }
    memcpy(d.x, m->d, sizeof(d.x));
    __syncwarp();
}

} // namespace wmma
} // namespace nvcuda

#endif

/* cudasim's execution model, force-included (g++ -include) into every .cu file of
 * kernels/cuda after tests/cudasim/rewrite has turned its launches into cudasim_launch() calls: the
 * CUDA qualifiers as plain C++, the built-in index variables, barriers, warp shuffles and votes,
 * the device math the host library lacks, and the launch itself. NVIDIA's own headers supply
 * every type (dim3, uint3, __nv_bfloat16, cudaStream_t...). exec.cc implements it; README.md
 * says what it can and cannot tell.
 *
 * Contract with exec.cc: a launch runs the whole grid before cudasim_launch returns (or, on a
 * deferred stream with CUDASIM_ASYNC=1, when the stream's queue runs), one block at a time on
 * the calling thread, each CUDA thread a fiber. Everything here that a kernel
 * calls (the index variables, __syncthreads, the shuffles) is valid only inside a kernel
 * launched through cudasim_launch; called elsewhere it aborts with a message. */
#ifndef GPURUN_CUDASIM_SIM_H
#define GPURUN_CUDASIM_SIM_H

#ifndef __cplusplus
#error "cudasim/sim.h is for the C++ translation of .cu files"
#endif

/* NVIDIA's headers first: they define the qualifiers as empty annotations, redefined below. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers --------------------------------------------------------------------------- */

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __managed__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
/* Blocks run one at a time, so a function-static variable is the running block's shared
 * memory. The section gathers every one of them so that exec.cc can fill them with 0xff at
 * each block's start (reads before writes show as NaN, as uninitialised shared memory would);
 * "used" keeps GCC from assuming a barrier call (opaque to it) cannot change them. */
#define __shared__ static __attribute__((used, section("cudasim_shared")))

/* ---- the running thread ------------------------------------------------------------------- */

/* The current fiber's indices and the launch's shape (exec.cc sets them on every switch). */
extern const uint3 *cudasim_thread_idx;
extern uint3 cudasim_block_idx;
extern dim3 cudasim_block_dim;
extern dim3 cudasim_grid_dim;

#define threadIdx (*cudasim_thread_idx)
#define blockIdx  (static_cast<const uint3 &>(cudasim_block_idx))
#define blockDim  (static_cast<const dim3 &>(cudasim_block_dim))
#define gridDim   (static_cast<const dim3 &>(cudasim_grid_dim))
#define warpSize  32

/* The running launch's dynamic shared memory (its smem argument's bytes, 16-byte aligned, a
 * guard page right after them); the rewriter turns `extern __shared__ T name[];` into a
 * pointer to it. */
void *cudasim_dyn_smem(void);

/* ---- barriers, warp exchange ---------------------------------------------------------------- */

/* Every live thread of the block must reach the same barrier (the same source line); a thread
 * that exits while others wait (or will wait), or threads at two different lines, are reported
 * as the kernel's bug and the process aborts. */
void cudasim_syncthreads(const char *file, int line);
int cudasim_syncthreads_count(int pred, const char *file, int line);
int cudasim_syncthreads_and(int pred, const char *file, int line);
int cudasim_syncthreads_or(int pred, const char *file, int line);
#define __syncthreads()           cudasim_syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(pred) cudasim_syncthreads_count((pred), __FILE__, __LINE__)
#define __syncthreads_and(pred)   cudasim_syncthreads_and((pred), __FILE__, __LINE__)
#define __syncthreads_or(pred)    cudasim_syncthreads_or((pred), __FILE__, __LINE__)
/* Memory fences: a no-op here (one thread runs at a time), kept as compiler barriers. */
void __threadfence(void);
void __threadfence_block(void);
void __threadfence_system(void);

/* Warp operations (exec.cc): the lanes in mask (each must exist, be alive and be in its own
 * mask) meet, then each gets its result. kind: one of CUDASIM_WARP_*. */
enum {
    CUDASIM_WARP_SYNC,
    CUDASIM_WARP_SHFL,
    CUDASIM_WARP_SHFL_UP,
    CUDASIM_WARP_SHFL_DOWN,
    CUDASIM_WARP_SHFL_XOR,
    CUDASIM_WARP_BALLOT,
    CUDASIM_WARP_ALL,
    CUDASIM_WARP_ANY,
};
uint64_t cudasim_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width);

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    cudasim_warp_op(CUDASIM_WARP_SYNC, mask, 0, 0, 32);
}

template <typename T> static inline uint64_t cudasim_bits(T v)
{
    static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable<T>::value,
                  "a shuffle moves at most 8 bytes of a trivially copyable type");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(v));
    return u;
}

template <typename T> static inline T cudasim_from_bits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

template <typename T> static inline T __shfl_sync(unsigned mask, T var, int src, int width = 32)
{
    return cudasim_from_bits<T>(
        cudasim_warp_op(CUDASIM_WARP_SHFL, mask, cudasim_bits(var), src, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return cudasim_from_bits<T>(
        cudasim_warp_op(CUDASIM_WARP_SHFL_UP, mask, cudasim_bits(var), (int)delta, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return cudasim_from_bits<T>(
        cudasim_warp_op(CUDASIM_WARP_SHFL_DOWN, mask, cudasim_bits(var), (int)delta, width));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32)
{
    return cudasim_from_bits<T>(
        cudasim_warp_op(CUDASIM_WARP_SHFL_XOR, mask, cudasim_bits(var), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)cudasim_warp_op(CUDASIM_WARP_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __all_sync(unsigned mask, int pred)
{
    return (int)cudasim_warp_op(CUDASIM_WARP_ALL, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred)
{
    return (int)cudasim_warp_op(CUDASIM_WARP_ANY, mask, pred != 0, 0, 32);
}
/* The lanes of the caller's warp that exist and have not exited. */
unsigned __activemask(void);

/* ---- atomics (one thread runs at a time: plain read-modify-write is atomic) ----------------- */

template <typename T> static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T> static inline T atomicSub(T *p, T v)
{
    T old = *p;
    *p = old - v;
    return old;
}
template <typename T> static inline T atomicMax(T *p, T v)
{
    T old = *p;
    *p = old < v ? v : old;
    return old;
}
template <typename T> static inline T atomicMin(T *p, T v)
{
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <typename T> static inline T atomicExch(T *p, T v)
{
    T old = *p;
    *p = v;
    return old;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v)
{
    T old = *p;
    if (old == cmp)
        *p = v;
    return old;
}

/* ---- device math the host library lacks --------------------------------------------------- */

static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
static inline long long min(long long a, long long b)
{
    return a < b ? a : b;
}
static inline long long max(long long a, long long b)
{
    return a > b ? a : b;
}
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}
static inline size_t min(size_t a, size_t b)
{
    return a < b ? a : b;
}
static inline size_t max(size_t a, size_t b)
{
    return a > b ? a : b;
}
static inline float min(float a, float b)
{
    return fminf(a, b);
}
static inline float max(float a, float b)
{
    return fmaxf(a, b);
}
static inline double min(double a, double b)
{
    return fmin(a, b);
}
static inline double max(double a, double b)
{
    return fmax(a, b);
}
static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}
static inline double rsqrt(double x)
{
    return 1.0 / sqrt(x);
}
/* glibc declares __expf and friends itself (its own internal names): macros here. */
#define __expf(x)  expf(x)
#define __logf(x)  logf(x)
#define __sinf(x)  sinf(x)
#define __cosf(x)  cosf(x)
#define __tanhf(x) tanhf(x)
static inline float __fdividef(float a, float b)
{
    return a / b;
}
static inline float __frcp_rn(float x)
{
    return 1.0f / x;
}
static inline float __fsqrt_rn(float x)
{
    return sqrtf(x);
}
static inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}
static inline float __saturatef(float x)
{
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f));
}
static inline float __int_as_float(int i)
{
    return cudasim_from_bits<float>((uint32_t)i);
}
static inline int __float_as_int(float f)
{
    return (int)(uint32_t)cudasim_bits(f);
}
static inline float __uint_as_float(unsigned u)
{
    return cudasim_from_bits<float>(u);
}
static inline unsigned __float_as_uint(float f)
{
    return (uint32_t)cudasim_bits(f);
}
static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}
static inline int __clz(int x)
{
    return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}
template <typename T> static inline T __ldg(const T *p)
{
    return *p;
}

/* ---- the runtime's C++ forms ---------------------------------------------------------------- */

/* What cuda_runtime.h declares only for nvcc: the runtime calls taking a kernel or a __device__
 * / __constant__ variable (here a host function or variable) instead of a void pointer. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *fn, enum cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute((const void *)fn, attr, value);
}
template <class T>
static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *fn)
{
    return ::cudaFuncGetAttributes(attr, (const void *)fn);
}
template <class T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count,
                                             size_t offset = 0,
                                             enum cudaMemcpyKind kind = cudaMemcpyHostToDevice)
{
    return ::cudaMemcpyToSymbol((const void *)&symbol, src, count, offset, kind);
}
template <class T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count,
                                               size_t offset = 0,
                                               enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost)
{
    return ::cudaMemcpyFromSymbol(dst, (const void *)&symbol, count, offset, kind);
}

/* ---- launches ------------------------------------------------------------------------------ */

/* Where a launch is written (the rewriter fills it in) and its configuration, <<<grid, block,
 * smem, stream>>> with CUDA's defaults. */
struct cudasim_site {
    const char *kernel;
    const char *file;
    int line;
};

struct cudasim_config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    cudasim_config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0)
        : grid(g), block(b), smem(s), stream(st)
    {
    }
};

/* Runs one launch (exec.cc): checks the configuration (a bad one sets the error that
 * cudaGetLastError returns, as CUDA does, and runs nothing), checks that every pointer
 * argument (ptrs, n_ptrs; NULLs skipped) lies in memory from cudaMalloc or cudaMallocHost
 * (else aborts: the GPU would fault), then runs body(arg) once per thread of the grid. fn
 * identifies the kernel (cudaFuncSetAttribute's key). On a deferred stream (CUDASIM_ASYNC=1)
 * the grid runs later, on clone(arg) (new, released with drop). */
void cudasim_run(const cudasim_site &site, const cudasim_config &cfg, const void *fn,
                 void (*body)(void *), void *arg, void *(*clone)(const void *),
                 void (*drop)(void *), const void *const *ptrs, int n_ptrs);

template <typename F, typename Tuple> struct cudasim_call {
    F fn;
    Tuple args;
};

template <typename C> static void *cudasim_clone(const void *p)
{
    return new C(*static_cast<const C *>(p));
}
template <typename C> static void cudasim_drop(void *p)
{
    delete static_cast<C *>(p);
}

/* Each thread calls the kernel with its own copies of the arguments, as CUDA passes them. */
template <typename F, typename Tuple> static void cudasim_body(void *p)
{
    auto *c = static_cast<cudasim_call<F, Tuple> *>(p);
    std::apply(c->fn, c->args);
}

template <typename T> static inline const void *cudasim_ptr_arg(const T &v)
{
    if constexpr (std::is_pointer<T>::value && !std::is_function<std::remove_pointer_t<T>>::value)
        return (const void *)v;
    else
        return nullptr;
}

template <typename Tuple, size_t... I>
static inline void cudasim_ptr_args(const Tuple &t, const void **out, std::index_sequence<I...>)
{
    ((out[I] = cudasim_ptr_arg(std::get<I>(t))), ...);
}

/* The parameter types alone decide the arguments' conversions (deduction stops here), so
 * that a launch converts its arguments as a call would: NULL to a pointer, int to size_t. */
template <typename T> struct cudasim_same {
    using type = T;
};

/* kernel<<<cfg>>>(args...) as the rewriter writes it: the arguments converted to the kernel's
 * parameter types once, at the launch. */
template <typename... P>
static inline void cudasim_launch(const cudasim_site &site, const cudasim_config &cfg,
                                  void (*fn)(P...), typename cudasim_same<P>::type... args)
{
    using Tuple = std::tuple<std::decay_t<P>...>;
    cudasim_call<void (*)(P...), Tuple> call{fn, Tuple(args...)};
    const void *ptrs[sizeof...(P) + 1] = {nullptr};
    cudasim_ptr_args(call.args, ptrs, std::index_sequence_for<P...>{});
    using Call = cudasim_call<void (*)(P...), Tuple>;
    cudasim_run(site, cfg, (const void *)fn, &cudasim_body<void (*)(P...), Tuple>, &call,
                &cudasim_clone<Call>, &cudasim_drop<Call>, ptrs, (int)sizeof...(P));
}

#include "wmma.h" /* nvcuda::wmma, emulated per lane */

#endif

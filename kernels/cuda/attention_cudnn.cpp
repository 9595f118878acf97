/* Causal attention through cuDNN's fused flash attention (its SDPA graphs, built with NVIDIA's
 * header-only cuDNN frontend): the bf16 path of attention.cu's launchers where cuDNN is there,
 * with the same layouts and the same lse, so that either side's forward feeds either side's
 * backward (tests/test_cuda_ops.c checks both against the CPU reference and each other).
 *
 * cuDNN is loaded at run time (the frontend's dynamic loading, dlopen of libcudnn.so.9): a
 * gpurun-train built with it starts on a machine without cuDNN and uses attention_tc.cu's
 * kernels there, saying why once. A graph is built per shape (B, T, NH, hs) and direction on
 * first use, which costs tens of milliseconds, and kept in the context's cache.
 *
 * Views on the model's buffers, no copies: q, k, v are (B, NH, T, hs) with strides
 * (3 C T, hs, 3 C, 1) into qkv (B, T, 3C), as are dq, dk, dv into dqkv; out and dout
 * (B, NH, T, hs) with strides (C T, hs, C, 1) into (B, T, C); lse (B, NH, T, 1) fp32, cuDNN's
 * softmax statistics, log sum exp of the scaled scores: exactly ops' lse.
 *
 * Determinism: the backward asks for cuDNN's deterministic algorithm (no atomics in dq's sum;
 * on Hopper it keeps dP in a workspace of B NH T T bf16, 1.6 GB for GPT-2 at B 64), as the
 * rest of the backend is deterministic (cuda_ops.h); GPU_ATT_CUDNN_FAST lets it add dq with
 * atomics instead. */
#ifdef GPURUN_CUDNN

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "attention_cudnn.h"

namespace fe = cudnn_frontend;

/* The frontend's dynamic loading looks its symbols up through this handle. */
namespace cudnn_frontend
{
void *cudnn_dlhandle = nullptr;
}

enum uid : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };

/* A shape's graph, or (g NULL) why cuDNN cannot do it: asked once, not at every step. */
struct att_graph {
    std::shared_ptr<fe::graph::Graph> g;
    int64_t workspace;
    std::string why;
};

struct cudnn_att {
    cudnnHandle_t handle = nullptr;
    std::map<std::tuple<int, int, int, int, int>, att_graph> graphs;
    void *workspace = nullptr;
    size_t workspace_size = 0;
    uint64_t generation = 0; /* workspace replacements */
};

/* "what: why" (or why alone, what "") in err; returns ret. */
static int fail(char *err, size_t errlen, int ret, const char *what, const std::string &why)
{
    snprintf(err, errlen, "%s%s%s", what, what[0] ? ": " : "", why.c_str());
    return ret;
}

/* libcudnn.so.9 opened once per process: the handle, or NULL and why in err. */
static void *cudnn_library(char *err, size_t errlen)
{
    static void *lib;
    static char why[200];

    if (!lib && !why[0]) {
        lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            const char *e = dlerror();
            snprintf(why, sizeof(why), "cannot load libcudnn.so.9: %s", e ? e : "not found");
        } else {
            fe::cudnn_dlhandle = lib;
        }
    }
    if (!lib)
        snprintf(err, errlen, "%s", why);
    return lib;
}

extern "C" int cudnn_att_new(struct cudnn_att **out, cudaStream_t stream, char *err, size_t errlen)
{
    *out = nullptr;
    if (!cudnn_library(err, errlen))
        return -ENOTSUP;
    try {
        size_t v = fe::detail::get_backend_version();
        if (v < 90000)
            return fail(err, errlen, -ENOTSUP, "cuDNN",
                        "version " + std::to_string(v) + " is older than 9.0");
        auto a = std::make_unique<cudnn_att>();
        if (fe::detail::create_handle(&a->handle) != CUDNN_STATUS_SUCCESS)
            return fail(err, errlen, -ENOTSUP, "cudnnCreate", "failed (no device for cuDNN?)");
        if (fe::detail::set_stream(a->handle, stream) != CUDNN_STATUS_SUCCESS) {
            fe::detail::destroy_handle(a->handle);
            return fail(err, errlen, -EIO, "cudnnSetStream", "failed");
        }
        *out = a.release();
        return 0;
    } catch (const std::exception &e) {
        return fail(err, errlen, -ENOTSUP, "cuDNN", e.what());
    }
}

extern "C" uint64_t cudnn_att_generation(const struct cudnn_att *a)
{
    return a->generation;
}

extern "C" void cudnn_att_free(struct cudnn_att *a)
{
    if (!a)
        return;
    a->graphs.clear();
    if (a->handle)
        fe::detail::destroy_handle(a->handle);
    cudaFree(a->workspace);
    delete a;
}

extern "C" size_t cudnn_att_version(void)
{
    return cudnn_frontend::cudnn_dlhandle ? fe::detail::get_backend_version() : 0;
}

/* The (B, NH, T, hs) view of one of q, k, v in qkv, or of out in (B, T, C). */
static std::vector<int64_t> qkv_stride(int64_t T, int64_t NH, int64_t hs)
{
    return {3 * NH * hs * T, hs, 3 * NH * hs, 1};
}
static std::vector<int64_t> out_stride(int64_t T, int64_t NH, int64_t hs)
{
    return {NH * hs * T, hs, NH * hs, 1};
}

static std::shared_ptr<fe::graph::Tensor_attributes>
bhsd(fe::graph::Graph &g, const char *name, int64_t uid, int64_t B, int64_t NH, int64_t T,
     int64_t hs, const std::vector<int64_t> &stride)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, NH, T, hs})
                        .set_stride(stride));
}

/* The forward (backward) graph of this shape, built on first use; NULL and why in err. */
/* kind: 0 the forward, 1 the deterministic backward, 2 the other backward. */
static att_graph *graph_for(struct cudnn_att *a, int B, int T, int NH, int hs, int kind,
                            char *err, size_t errlen, int *ret)
{
    bool backward = kind > 0;
    auto key = std::make_tuple(B, T, NH, hs, kind);
    auto it = a->graphs.find(key);
    if (it != a->graphs.end() && !it->second.g) {
        *ret = fail(err, errlen, -ENOTSUP, "", it->second.why);
        return nullptr;
    }
    if (it != a->graphs.end())
        return &it->second;

    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = bhsd(*g, "q", Q_UID, B, NH, T, hs, qkv_stride(T, NH, hs));
    auto k = bhsd(*g, "k", K_UID, B, NH, T, hs, qkv_stride(T, NH, hs));
    auto v = bhsd(*g, "v", V_UID, B, NH, T, hs, qkv_stride(T, NH, hs));
    float scale = 1.0f / sqrtf((float)hs);
    if (!backward) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("attention_forward")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_causal_mask(true);
        auto [o, stats] = g->sdpa(q, k, v, opt);
        o->set_output(true).set_uid(O_UID).set_dim({B, NH, T, hs}).set_stride(
            out_stride(T, NH, hs));
        stats->set_output(true)
            .set_uid(STATS_UID)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({B, NH, T, 1})
            .set_stride({NH * T, T, 1, 1});
    } else {
        auto o = bhsd(*g, "o", O_UID, B, NH, T, hs, out_stride(T, NH, hs));
        auto dout = bhsd(*g, "dout", DO_UID, B, NH, T, hs, out_stride(T, NH, hs));
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(STATS_UID)
                                   .set_dim({B, NH, T, 1})
                                   .set_stride({NH * T, T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_attn_scale(scale)
                       .set_causal_mask(true)
                       .set_deterministic_algorithm(kind == 1);
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
        dq->set_output(true).set_uid(DQ_UID).set_dim({B, NH, T, hs}).set_stride(
            qkv_stride(T, NH, hs));
        dk->set_output(true).set_uid(DK_UID).set_dim({B, NH, T, hs}).set_stride(
            qkv_stride(T, NH, hs));
        dv->set_output(true).set_uid(DV_UID).set_dim({B, NH, T, hs}).set_stride(
            qkv_stride(T, NH, hs));
    }

    const char *what = backward ? "cuDNN attention backward" : "cuDNN attention forward";
    fe::error_t e = g->validate();
    if (e.is_good())
        e = g->build_operation_graph(a->handle);
    if (e.is_good())
        e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_good())
        e = g->check_support(a->handle);
    if (e.is_good())
        e = g->build_plans(a->handle);
    int64_t ws = 0;
    if (e.is_good())
        e = g->get_workspace_size(ws);
    auto &slot = a->graphs[key];
    if (e.is_bad()) {
        slot.why = std::string(what) + ": " + e.get_message();
        *ret = fail(err, errlen, -ENOTSUP, "", slot.why);
        return nullptr;
    }
    slot.g = g;
    slot.workspace = ws;
    return &slot;
}

static int run(struct cudnn_att *a, att_graph *ag, std::unordered_map<int64_t, void *> &pack,
               const char *what, char *err, size_t errlen)
{
    if ((size_t)ag->workspace > a->workspace_size) {
        cudaFree(a->workspace);
        a->workspace = nullptr;
        a->workspace_size = 0;
        a->generation++;
        cudaError_t ce = cudaMalloc(&a->workspace, (size_t)ag->workspace);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            return fail(err, errlen, -ENOMEM, what,
                        std::string("cannot allocate its workspace: ") + cudaGetErrorString(ce));
        }
        a->workspace_size = (size_t)ag->workspace;
    }
    fe::error_t e = ag->g->execute(a->handle, pack, a->workspace);
    if (e.is_bad())
        return fail(err, errlen, -EIO, what, e.get_message());
    return 0;
}

extern "C" int cudnn_att_forward(struct cudnn_att *a, void *out, float *lse, const void *qkv,
                                 int B, int T, int C, int NH, char *err, size_t errlen)
{
    int hs = C / NH, ret = -ENOTSUP;
    try {
        att_graph *ag = graph_for(a, B, T, NH, hs, 0, err, errlen, &ret);
        if (!ag)
            return ret;
        char *base = (char *)qkv;
        size_t part = (size_t)C * 2; /* bytes between q, k and v in a row of qkv */
        std::unordered_map<int64_t, void *> pack = {{Q_UID, base},
                                                    {K_UID, base + part},
                                                    {V_UID, base + 2 * part},
                                                    {O_UID, out},
                                                    {STATS_UID, lse}};
        return run(a, ag, pack, "cuDNN attention forward", err, errlen);
    } catch (const std::exception &e) {
        return fail(err, errlen, -ENOTSUP, "cuDNN attention forward", e.what());
    }
}

extern "C" int cudnn_att_backward(struct cudnn_att *a, void *dqkv, const void *dout,
                                  const void *qkv, const void *out, const float *lse, int B,
                                  int T, int C, int NH, bool deterministic, char *err,
                                  size_t errlen)
{
    int hs = C / NH, ret = -ENOTSUP;
    try {
        att_graph *ag = graph_for(a, B, T, NH, hs, deterministic ? 1 : 2, err, errlen, &ret);
        if (!ag)
            return ret;
        char *base = (char *)qkv, *dbase = (char *)dqkv;
        size_t part = (size_t)C * 2;
        std::unordered_map<int64_t, void *> pack = {
            {Q_UID, base},       {K_UID, base + part},         {V_UID, base + 2 * part},
            {O_UID, (void *)out}, {DO_UID, (void *)dout},      {STATS_UID, (void *)lse},
            {DQ_UID, dbase},     {DK_UID, dbase + part},       {DV_UID, dbase + 2 * part}};
        return run(a, ag, pack, "cuDNN attention backward", err, errlen);
    } catch (const std::exception &e) {
        return fail(err, errlen, -ENOTSUP, "cuDNN attention backward", e.what());
    }
}

#endif /* GPURUN_CUDNN */

/* Causal GQA attention on tensor cores through cuDNN's fused SDPA ("flash
 * attention" engines), built with the header-only cuDNN frontend in its
 * dynamic-loading mode: libcudnn.so.9 is dlopened on first use (the
 * plugin's RUNPATH holds the directory of the one found at configure time),
 * so the plugin loads and runs without cuDNN, on its own kernels.
 *
 * The graphs read the qkv rows [q heads | k heads | v heads] of each token
 * in place through strides (no copies) and write out, lse (the natural-log
 * logsumexp of the scaled scores per query row, cuDNN's softmax stats, which
 * is what the fallback kernels keep: the saved state is unchanged) and dqkv.
 * Backward asks for the deterministic algorithm and keeps only engines
 * without the NONDETERMINISTIC note; where none is left the shape is
 * refused, never run otherwise. A built graph (or the reason a shape was
 * refused) is cached per backend by shape and dtype.
 *
 * Built without the frontend (LLMT_CUDA_HAVE_CUDNN undefined: not found at
 * configure time, or the CPU emulator of tests/gpu/emu) this file only says
 * no, and attention runs on the kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_attention_cudnn.h"

int llmt_cuda_attention_mode(const llmt_plugin_host *host, int *mode)
{
    const char *v = getenv("LLMT_CUDA_ATTENTION");
    if (!v || !*v || strcmp(v, "auto") == 0)
        *mode = LLMT_CUDA_ATTN_AUTO;
    else if (strcmp(v, "fallback") == 0)
        *mode = LLMT_CUDA_ATTN_FALLBACK;
    else if (strcmp(v, "cudnn") == 0)
        *mode = LLMT_CUDA_ATTN_CUDNN;
    else
        return host->fail(LLMT_EINVAL, "llmt_context_create: CUDA backend: LLMT_CUDA_ATTENTION "
                          "= '%s' (auto, fallback or cudnn)", v);
    return LLMT_OK;
}

#ifndef LLMT_CUDA_HAVE_CUDNN

/* Refuses for a reason that holds for every shape. */
static int no_cudnn(llmt_device *dev, const char *op, int dt)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (cb->attn_mode == LLMT_CUDA_ATTN_CUDNN && dt != LLMT_DTYPE_F32)
        return cb->host->fail(LLMT_EUNSUPPORTED, "CUDA %s: LLMT_CUDA_ATTENTION=cudnn, but this "
                              "plugin was built without the cuDNN frontend", op);
    return 0;
}

size_t llmt_cudnn_attention_workspace(int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim, int dt)
{
    (void)batch, (void)seq, (void)heads, (void)head_dim, (void)dt;
    return 0;
}

int llmt_cudnn_attention_fwd(llmt_device *dev, void *out, float *lse, const void *qkv,
                             const llmt_attn_dims *a, int dt, void *workspace,
                             size_t workspace_bytes)
{
    (void)out, (void)lse, (void)qkv, (void)a, (void)workspace, (void)workspace_bytes;
    return no_cudnn(dev, "attention_fwd", dt);
}

int llmt_cudnn_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                             const float *lse, const void *out, const llmt_attn_dims *a, int dt,
                             void *workspace, size_t workspace_bytes)
{
    (void)dqkv, (void)dout, (void)qkv, (void)lse, (void)out, (void)a, (void)workspace;
    (void)workspace_bytes;
    return no_cudnn(dev, "attention_bwd", dt);
}

void llmt_cudnn_attention_release(llmt_device *dev)
{
    (void)dev;
}

#else /* LLMT_CUDA_HAVE_CUDNN */

#include <dlfcn.h>
#include <math.h>

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

/* The frontend's dynamic-loading mode calls cuDNN through this handle,
 * which the program sets (load_cudnn). */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

/* Why cuDNN is unusable; empty once it loaded. Written once. */
static char g_cudnn_error[512];
static std::once_flag g_cudnn_once;

/* The oldest cuDNN tried: 9.0 (GQA and the deterministic SDPA backward). */
#define LLMT_CUDNN_MIN_VERSION 90000

static void load_cudnn(void)
{
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        snprintf(g_cudnn_error, sizeof g_cudnn_error, "cannot load libcudnn.so.9: %s", dlerror());
        return;
    }
    fe::cudnn_dlhandle = h;
    try {
        const size_t v = fe::detail::get_backend_version();
        if (v < LLMT_CUDNN_MIN_VERSION)
            snprintf(g_cudnn_error, sizeof g_cudnn_error, "libcudnn.so.9 is version %zu, older "
                     "than %d", v, LLMT_CUDNN_MIN_VERSION);
    } catch (const std::exception &e) {
        snprintf(g_cudnn_error, sizeof g_cudnn_error, "libcudnn.so.9: %s", e.what());
    }
}

/* Loads cuDNN once per process; says on stderr (once) when it cannot. */
static void load_cudnn_once(void)
{
    load_cudnn();
    if (g_cudnn_error[0])
        fprintf(stderr, "libllmt: CUDA attention: cuDNN is unusable (%s); BF16 and F16 attention "
                "run on the fp32 kernels\n", g_cudnn_error);
}

/* Tensor uids of the graphs' inputs and outputs. */
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

/* (batch, seq, heads, kv_heads, head_dim, dt, backward) */
typedef std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int> graph_key;

/* A built graph, or why the shape was refused (graph NULL). */
struct graph_entry {
    std::shared_ptr<fe::graph::Graph> graph;
    std::string refused;
};

/* Distinct shapes remembered before the cache starts over (training uses a
 * handful; generation's prefill may bring more). */
#define LLMT_CUDNN_GRAPH_CACHE 64

/* The backend's cuDNN state (llmt_cuda_backend.cudnn_attn). */
struct cudnn_attn_state {
    cudnnHandle_t handle = nullptr;
    std::map<graph_key, graph_entry> graphs;
};

static int64_t pad_to(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

size_t llmt_cudnn_attention_workspace(int64_t batch, int64_t seq, int64_t heads,
                                      int64_t head_dim, int dt)
{
    if (dt != LLMT_DTYPE_BF16 && dt != LLMT_DTYPE_F16)
        return 0;
    /* The deterministic backward's dP workspace, bf16 [b, h, s_q, s_kv]
     * with s_q padded to 64 and s_kv to 128 (the frontend's formula, its
     * larger padding); the fp32 dQ accumulator and two fp32 values per row;
     * 64 MiB for what the engines add. */
    const int64_t rows = batch * heads * pad_to(seq, 128);
    const int64_t dp = batch * heads * pad_to(seq, 64) * pad_to(seq, 128) * 2;
    return (size_t)(dp + rows * head_dim * 4 + rows * 8) + ((size_t)64 << 20);
}

static fe::DataType_t io_type(int dt)
{
    return dt == LLMT_DTYPE_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

/* A [batch, heads, seq, head_dim] view of rows `ld` elements apart. */
static std::shared_ptr<fe::graph::Tensor_attributes> bhsd(const char *name, int64_t uid,
                                                          const llmt_attn_dims *a, int64_t heads,
                                                          int64_t ld)
{
    return std::make_shared<fe::graph::Tensor_attributes>(
        fe::graph::Tensor_attributes()
            .set_name(name)
            .set_uid(uid)
            .set_dim({a->batch, heads, a->seq, a->head_dim})
            .set_stride({a->seq * ld, a->head_dim, ld, 1}));
}

/* Sets a graph output's view to that of `like`. */
static void as_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t,
                      const std::shared_ptr<fe::graph::Tensor_attributes> &like)
{
    t->set_output(true).set_uid(like->get_uid()).set_dim(like->get_dim())
        .set_stride(like->get_stride());
}

/* The logsumexp rows: fp32 [batch, heads, seq, 1]. */
static std::shared_ptr<fe::graph::Tensor_attributes> stats_view(const llmt_attn_dims *a)
{
    return std::make_shared<fe::graph::Tensor_attributes>(
        fe::graph::Tensor_attributes()
            .set_name("stats")
            .set_uid(UID_STATS)
            .set_dim({a->batch, a->heads, a->seq, 1})
            .set_stride({a->heads * a->seq, a->seq, 1, 1})
            .set_data_type(fe::DataType_t::FLOAT));
}

/* Throws the message of a failed frontend call (caught in graph_for). */
static void must(fe::error_t e, const char *what)
{
    if (e.is_bad())
        throw std::runtime_error(std::string(what) + ": " + e.get_message());
}

/* Builds the forward (bwd 0) or backward graph of a shape. */
static std::shared_ptr<fe::graph::Graph> build_graph(cudnnHandle_t handle,
                                                     const llmt_attn_dims *a, int dt, int bwd)
{
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io_type(dt))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t ld = (a->heads + 2 * a->kv_heads) * a->head_dim, od = a->heads * a->head_dim;
    const float scale = 1.0f / sqrtf((float)a->head_dim); /* the kernels' scale */
    auto q = g->tensor(*bhsd("q", UID_Q, a, a->heads, ld));
    auto k = g->tensor(*bhsd("k", UID_K, a, a->kv_heads, ld));
    auto v = g->tensor(*bhsd("v", UID_V, a, a->kv_heads, ld));
    auto o_view = bhsd("o", UID_O, a, a->heads, od);
    if (!bwd) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("attention_fwd")
                       .set_generate_stats(true)
                       .set_stats_use_log2(false) /* natural log, like the kernels */
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0); /* causal: key <= query */
        auto [o, stats] = g->sdpa(q, k, v, opt);
        as_output(o, o_view);
        as_output(stats, stats_view(a));
        stats->set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto o = g->tensor(*o_view);
        auto dout = g->tensor(*bhsd("dO", UID_DO, a, a->heads, od));
        auto stats = g->tensor(*stats_view(a));
        auto opt = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_bwd")
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_deterministic_algorithm(true);
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
        as_output(dq, bhsd("dQ", UID_DQ, a, a->heads, ld));
        as_output(dk, bhsd("dK", UID_DK, a, a->kv_heads, ld));
        as_output(dv, bhsd("dV", UID_DV, a, a->kv_heads, ld));
    }
    must(g->validate(), "validate");
    must(g->build_operation_graph(handle), "build_operation_graph");
    must(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    must(g->check_support(handle), "check_support (deterministic engines only)");
    must(g->build_plans(handle), "build_plans");
    return g;
}

/* The graph of a shape, built on first use; NULL with *why when cuDNN
 * refuses it. A refusal is cached and written to stderr once. */
static fe::graph::Graph *graph_for(llmt_cuda_backend *cb, const llmt_attn_dims *a, int dt,
                                   int bwd, size_t workspace_bytes, std::string *why)
{
    std::call_once(g_cudnn_once, load_cudnn_once);
    if (g_cudnn_error[0]) {
        *why = g_cudnn_error;
        return nullptr;
    }
    if (!cb->cudnn_attn)
        cb->cudnn_attn = new (std::nothrow) cudnn_attn_state;
    cudnn_attn_state *st = (cudnn_attn_state *)cb->cudnn_attn;
    if (!st) {
        *why = "out of host memory";
        return nullptr;
    }
    const graph_key key(a->batch, a->seq, a->heads, a->kv_heads, a->head_dim, dt, bwd);
    auto it = st->graphs.find(key);
    if (it != st->graphs.end()) {
        *why = it->second.refused;
        return it->second.graph.get();
    }
    graph_entry entry;
    try {
        if (!st->handle && fe::detail::create_handle(&st->handle) != CUDNN_STATUS_SUCCESS) {
            st->handle = nullptr; /* the next shape tries again */
            throw std::runtime_error("cudnnCreate failed");
        }
        entry.graph = build_graph(st->handle, a, dt, bwd);
        int64_t need = 0;
        must(entry.graph->get_workspace_size(need), "get_workspace_size");
        if ((size_t)need > workspace_bytes) {
            entry.graph.reset();
            entry.refused = "wants " + std::to_string(need) + " bytes of workspace, more than "
                            "the " + std::to_string(workspace_bytes) + " the scratch holds";
        }
    } catch (const std::exception &e) {
        entry.graph.reset();
        entry.refused = e.what();
    } catch (...) {
        entry.graph.reset();
        entry.refused = "an exception that is not a std::exception";
    }
    if (!entry.graph)
        fprintf(stderr, "libllmt: CUDA attention_%s B=%lld T=%lld H=%lld/%lld hd=%lld %s: "
                "cuDNN refused (%s); the fp32 kernels run this shape\n", bwd ? "bwd" : "fwd",
                (long long)a->batch, (long long)a->seq, (long long)a->heads,
                (long long)a->kv_heads, (long long)a->head_dim, llmt_cuda_dt_name(dt),
                entry.refused.c_str());
    if (st->graphs.size() >= LLMT_CUDNN_GRAPH_CACHE)
        st->graphs.clear();
    auto &slot = st->graphs[key] = entry;
    *why = slot.refused;
    return slot.graph.get();
}

/* Finds the graph or says why not: 1 to run it, 0 to fall back, or the
 * error of a refusal that LLMT_CUDA_ATTENTION=cudnn forbids. */
static int pick(llmt_device *dev, const char *op, const llmt_attn_dims *a, int dt, int bwd,
                void *workspace, size_t workspace_bytes, fe::graph::Graph **g)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    *g = nullptr;
    if (dt == LLMT_DTYPE_F32 || cb->attn_mode == LLMT_CUDA_ATTN_FALLBACK)
        return 0;
    std::string why = "no scratch";
    if (workspace)
        *g = graph_for(cb, a, dt, bwd, workspace_bytes, &why);
    if (*g)
        return 1;
    if (cb->attn_mode == LLMT_CUDA_ATTN_CUDNN)
        return cb->host->fail(LLMT_EUNSUPPORTED, "CUDA %s: LLMT_CUDA_ATTENTION=cudnn, but cuDNN "
                              "refuses batch %lld, seq %lld, heads %lld/%lld, head_dim %lld, "
                              "%s: %s", op, (long long)a->batch, (long long)a->seq,
                              (long long)a->heads, (long long)a->kv_heads,
                              (long long)a->head_dim, llmt_cuda_dt_name(dt), why.c_str());
    return 0;
}

/* Runs a graph on the backend's stream. */
static int execute(llmt_device *dev, const char *op, fe::graph::Graph *g,
                   std::unordered_map<int64_t, void *> &pack, void *workspace)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    cudnn_attn_state *st = (cudnn_attn_state *)cb->cudnn_attn;
    std::string why;
    try {
        if (fe::detail::set_stream(st->handle, cb->stream) != CUDNN_STATUS_SUCCESS)
            why = "cudnnSetStream failed";
        else {
            fe::error_t e = g->execute(st->handle, pack, workspace);
            if (e.is_bad())
                why = e.get_message();
        }
    } catch (const std::exception &e) {
        why = e.what();
    }
    if (!why.empty())
        return cb->host->fail(LLMT_ECUDA, "CUDA %s: cuDNN: %s", op, why.c_str());
    LLMT_CUDA_LAUNCHED(dev, op);
    return 1;
}

int llmt_cudnn_attention_fwd(llmt_device *dev, void *out, float *lse, const void *qkv,
                             const llmt_attn_dims *a, int dt, void *workspace,
                             size_t workspace_bytes)
{
    fe::graph::Graph *g;
    int rc = pick(dev, "attention_fwd", a, dt, 0, workspace, workspace_bytes, &g);
    if (rc <= 0)
        return rc;
    const size_t e = llmt_cuda_dt_size(dt);
    const int64_t hd = a->head_dim;
    char *base = (char *)qkv;
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, base},
        {UID_K, base + (size_t)(a->heads * hd) * e},
        {UID_V, base + (size_t)((a->heads + a->kv_heads) * hd) * e},
        {UID_O, out},
        {UID_STATS, lse}};
    return execute(dev, "attention_fwd", g, pack, workspace);
}

int llmt_cudnn_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                             const float *lse, const void *out, const llmt_attn_dims *a, int dt,
                             void *workspace, size_t workspace_bytes)
{
    fe::graph::Graph *g;
    int rc = pick(dev, "attention_bwd", a, dt, 1, workspace, workspace_bytes, &g);
    if (rc <= 0)
        return rc;
    const size_t e = llmt_cuda_dt_size(dt);
    const size_t k_at = (size_t)(a->heads * a->head_dim) * e;
    const size_t v_at = (size_t)((a->heads + a->kv_heads) * a->head_dim) * e;
    char *base = (char *)qkv, *dbase = (char *)dqkv;
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, base},          {UID_K, base + k_at},   {UID_V, base + v_at},
        {UID_O, (void *)out},   {UID_DO, (void *)dout}, {UID_STATS, (void *)lse},
        {UID_DQ, dbase},        {UID_DK, dbase + k_at}, {UID_DV, dbase + v_at}};
    return execute(dev, "attention_bwd", g, pack, workspace);
}

void llmt_cudnn_attention_release(llmt_device *dev)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    cudnn_attn_state *st = (cudnn_attn_state *)cb->cudnn_attn;
    if (!st)
        return;
    st->graphs.clear();
    if (st->handle) {
        try {
            (void)fe::detail::destroy_handle(st->handle);
        } catch (const std::exception &) {
            /* the handle was made through the same symbols: not reached */
        }
    }
    delete st;
    cb->cudnn_attn = nullptr;
}

#endif /* LLMT_CUDA_HAVE_CUDNN */

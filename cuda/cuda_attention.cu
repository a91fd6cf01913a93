/* CUDA causal attention with grouped-query heads, flash-attention style: the
 * [seq, seq] scores never exist in global memory. Everything is fp32 math on
 * CUDA cores (no tensor cores yet), kept simple:
 *
 * - A block owns ATT_ROWS rows (queries in forward and dQ, keys in dK/dV).
 *   Each row is handled by TPR = head_dim / 16 consecutive lanes; lane `sub`
 *   of a row holds the 16 elements in float4 chunks sub, sub + TPR, sub +
 *   2 TPR, sub + 3 TPR of the row in registers. A dot product is 16 fused
 *   multiply-adds per lane and a butterfly over the TPR lanes, which leaves
 *   the same sum in every lane of the row.
 * - The other side (keys and values in forward and dQ, queries and dO in
 *   dK/dV) streams through shared memory in tiles of ATT_TILE rows (fp32).
 *
 * Forward keeps a running max and sum per query row (online softmax) and
 * writes out = softmax(scale q k^T + mask) v and, for backward, the row's
 * logsumexp (the `saved` state, batch * heads * seq floats). Backward
 * recomputes P = exp(scale q k^T - lse) and, with D = rowsum(dO * O):
 *   dV_j = sum_i P_ij dO_i      dK_j = scale sum_i dS_ij Q_i     dS = P (dO V^T - D)
 *   dQ_i = scale sum_j dS_ij K_j
 * in two deterministic passes without atomics: one block per (batch, kv
 * head, key block) sums dK and dV over the group's query heads and the query
 * rows in a fixed order; one block per (batch, head, query block) sums dQ
 * over the keys in order. When backward gets no saved state it reruns the
 * forward kernel itself (without output) for the logsumexp, so it uses the
 * same bits it would have been given.
 *
 * BF16 and F16 attention runs on cuDNN's fused SDPA instead where cuDNN
 * is loaded and accepts the shape (cuda_attention_cudnn.cu); these kernels
 * are the fallback, chosen per call (LLMT_CUDA_ATTENTION forces either).
 * Backward without saved state recomputes the logsumexp the way forward
 * would have made it: on cuDNN where forward runs there. */
#include "cuda_attention_cudnn.h"
#include "cuda_kernels.cuh"

#define ATT_ROWS 64
#define ATT_TILE 32
#define ATT_FULL 0xffffffffu

/* ---- per-row register fragments: 4 float4 chunks of a head_dim row */

template <int HD> struct att_shape {
    static constexpr int TPR = HD / 16;            /* lanes per row */
    static constexpr int THREADS = ATT_ROWS * TPR; /* block size */
    static constexpr int C4 = HD / 4;              /* float4 chunks per row */
};

/* Loads this lane's 16 elements of a global row (zeros when !valid). */
template <int HD, typename T>
__device__ __forceinline__ void frag_load(float4 (&r)[4], const T *row, int sub, bool valid)
{
    for (int u = 0; u < 4; u++) {
        const int c = 4 * (sub + att_shape<HD>::TPR * u);
        r[u] = valid ? make_float4(to_f32(row[c]), to_f32(row[c + 1]), to_f32(row[c + 2]),
                                   to_f32(row[c + 3]))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* Stores this lane's 16 elements, times scale, to a global row. */
template <int HD, typename T>
__device__ __forceinline__ void frag_store(T *row, const float4 (&r)[4], float scale, int sub)
{
    for (int u = 0; u < 4; u++) {
        const int c = 4 * (sub + att_shape<HD>::TPR * u);
        row[c] = from_f32<T>(r[u].x * scale);
        row[c + 1] = from_f32<T>(r[u].y * scale);
        row[c + 2] = from_f32<T>(r[u].z * scale);
        row[c + 3] = from_f32<T>(r[u].w * scale);
    }
}

__device__ __forceinline__ void frag_zero(float4 (&r)[4])
{
    for (int u = 0; u < 4; u++)
        r[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* r += a * (this lane's chunks of the shared row). */
template <int HD>
__device__ __forceinline__ void frag_axpy(float4 (&r)[4], float a, const float4 *row, int sub)
{
    for (int u = 0; u < 4; u++) {
        const float4 v = row[sub + att_shape<HD>::TPR * u];
        r[u].x += a * v.x;
        r[u].y += a * v.y;
        r[u].z += a * v.z;
        r[u].w += a * v.w;
    }
}

/* r += a * f for register fragments. */
__device__ __forceinline__ void frag_axpy_reg(float4 (&r)[4], float a, const float4 (&f)[4])
{
    for (int u = 0; u < 4; u++) {
        r[u].x += a * f[u].x;
        r[u].y += a * f[u].y;
        r[u].z += a * f[u].z;
        r[u].w += a * f[u].w;
    }
}

/* Dot product of a row fragment with a shared-memory row, summed over the
 * row's TPR lanes (every lane of the row gets the same value). */
template <int HD>
__device__ __forceinline__ float row_dot(const float4 (&r)[4], const float4 *row, int sub)
{
    float s = 0.0f;
    for (int u = 0; u < 4; u++) {
        const float4 v = row[sub + att_shape<HD>::TPR * u];
        s += r[u].x * v.x;
        s += r[u].y * v.y;
        s += r[u].z * v.z;
        s += r[u].w * v.w;
    }
    for (int off = att_shape<HD>::TPR / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(ATT_FULL, s, off);
    return s;
}

/* The same for two register fragments. */
template <int HD>
__device__ __forceinline__ float frag_dot(const float4 (&a)[4], const float4 (&b)[4])
{
    float s = 0.0f;
    for (int u = 0; u < 4; u++) {
        s += a[u].x * b[u].x;
        s += a[u].y * b[u].y;
        s += a[u].z * b[u].z;
        s += a[u].w * b[u].w;
    }
    for (int off = att_shape<HD>::TPR / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(ATT_FULL, s, off);
    return s;
}

/* Copies rows [row0, row0 + ATT_TILE) of a head slice (row stride ld) into
 * a shared fp32 tile; rows at or past `rows` are zero. */
template <int HD, typename T>
__device__ __forceinline__ void tile_load(float4 (*tile)[HD / 4], const T *slice, int64_t ld,
                                          int row0, int rows)
{
    constexpr int C4 = att_shape<HD>::C4;
    for (int e = threadIdx.x; e < ATT_TILE * C4; e += blockDim.x) {
        const int r = e / C4, c = 4 * (e % C4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row0 + r < rows) {
            const T *p = slice + (int64_t)(row0 + r) * ld + c;
            v = make_float4(to_f32(p[0]), to_f32(p[1]), to_f32(p[2]), to_f32(p[3]));
        }
        tile[r][e % C4] = v;
    }
}

/* The query block of this block, the last (most keys, most work) first, so
 * the short blocks fill in the end of the grid. */
__device__ __forceinline__ int last_block_first()
{
    return (int)(gridDim.x - 1 - blockIdx.x);
}

/* Geometry of one attention call. */
struct att_geom {
    int seq, heads, kv_heads;
    int64_t ld;  /* qkv row stride: (heads + 2 kv_heads) head_dim */
    float scale; /* 1 / sqrt(head_dim) */
};

/* ---- forward: block (query block, head, batch) */

template <typename T, int HD>
__global__ void __launch_bounds__(att_shape<HD>::THREADS)
    attn_fwd_kernel(T *out, float *lse, const T *qkv, att_geom g)
{
    constexpr int TPR = att_shape<HD>::TPR;
    __shared__ float4 ks[ATT_TILE][HD / 4];
    __shared__ float4 vs[ATT_TILE][HD / 4];
    const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int q0 = last_block_first() * ATT_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (g.heads / g.kv_heads);
    const int i = q0 + row;
    const bool valid = i < g.seq;
    const T *base = qkv + (int64_t)b * g.seq * g.ld;
    const T *kslice = base + (int64_t)(g.heads + kvh) * HD;
    const T *vslice = base + (int64_t)(g.heads + g.kv_heads + kvh) * HD;

    float4 q[4], o[4];
    frag_load<HD>(q, base + (int64_t)i * g.ld + (int64_t)h * HD, sub, valid);
    frag_zero(o);
    float mx = -INFINITY, l = 0.0f;
    const int kend = q0 + ATT_ROWS < g.seq ? q0 + ATT_ROWS : g.seq; /* keys the block can see */
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads(); /* the previous tile is consumed */
        tile_load<HD>(ks, kslice, g.ld, k0, g.seq);
        tile_load<HD>(vs, vslice, g.ld, k0, g.seq);
        __syncthreads();
        float s[ATT_TILE];
        float tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < ATT_TILE; j++) {
            const int key = k0 + j;
            const float d = row_dot<HD>(q, ks[j], sub) * g.scale;
            s[j] = key <= i && key < g.seq ? d : -INFINITY;
            tmax = fmaxf(tmax, s[j]);
        }
        /* Tile 0 holds key 0, which every row sees: mnew is finite. */
        const float mnew = fmaxf(mx, tmax);
        const float corr = expf(mx - mnew);
        l *= corr;
        for (int u = 0; u < 4; u++) {
            o[u].x *= corr;
            o[u].y *= corr;
            o[u].z *= corr;
            o[u].w *= corr;
        }
#pragma unroll
        for (int j = 0; j < ATT_TILE; j++) {
            const float p = expf(s[j] - mnew);
            l += p;
            frag_axpy<HD>(o, p, vs[j], sub);
        }
        mx = mnew;
    }
    if (valid && out)
        frag_store<HD>(out + ((int64_t)b * g.seq + i) * g.heads * HD + (int64_t)h * HD, o,
                       1.0f / l, sub);
    if (valid && lse && sub == 0)
        lse[((int64_t)b * g.heads + h) * g.seq + i] = mx + logf(l);
}

/* ---- D_i = rowsum(dO_i * O_i): block (query block, head, batch) */

template <typename T, int HD>
__global__ void __launch_bounds__(att_shape<HD>::THREADS)
    attn_delta_kernel(float *delta, const T *dout, const T *out, att_geom g)
{
    constexpr int TPR = att_shape<HD>::TPR;
    const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int i = blockIdx.x * ATT_ROWS + row, h = blockIdx.y, b = blockIdx.z;
    const bool valid = i < g.seq;
    const int64_t at = ((int64_t)b * g.seq + i) * g.heads * HD + (int64_t)h * HD;
    float4 d[4], o[4];
    frag_load<HD>(d, dout + at, sub, valid);
    frag_load<HD>(o, out + at, sub, valid);
    const float dot = frag_dot<HD>(d, o);
    if (valid && sub == 0)
        delta[((int64_t)b * g.heads + h) * g.seq + i] = dot;
}

/* ---- dK, dV: block (key block, kv head, batch) */

template <typename T, int HD>
__global__ void __launch_bounds__(att_shape<HD>::THREADS)
    attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *delta,
                    att_geom g)
{
    constexpr int TPR = att_shape<HD>::TPR;
    __shared__ float4 qs[ATT_TILE][HD / 4];
    __shared__ float4 dos[ATT_TILE][HD / 4];
    __shared__ float lse_s[ATT_TILE], delta_s[ATT_TILE];
    const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int k0 = blockIdx.x * ATT_ROWS, kvh = blockIdx.y, b = blockIdx.z;
    const int group = g.heads / g.kv_heads;
    const int j = k0 + row; /* this row's key */
    const bool valid = j < g.seq;
    const T *base = qkv + (int64_t)b * g.seq * g.ld;
    const int64_t kcol = (int64_t)(g.heads + kvh) * HD;
    const int64_t vcol = (int64_t)(g.heads + g.kv_heads + kvh) * HD;

    float4 k[4], v[4], dk[4], dv[4];
    frag_load<HD>(k, base + (int64_t)j * g.ld + kcol, sub, valid);
    frag_load<HD>(v, base + (int64_t)j * g.ld + vcol, sub, valid);
    frag_zero(dk);
    frag_zero(dv);
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const T *qslice = base + (int64_t)h * HD;
        const T *doslice = dout + (int64_t)b * g.seq * g.heads * HD + (int64_t)h * HD;
        const float *lse_h = lse + ((int64_t)b * g.heads + h) * g.seq;
        const float *delta_h = delta + ((int64_t)b * g.heads + h) * g.seq;
        /* Queries before k0 see none of this block's keys. */
        for (int i0 = k0; i0 < g.seq; i0 += ATT_TILE) {
            __syncthreads();
            tile_load<HD>(qs, qslice, g.ld, i0, g.seq);
            tile_load<HD>(dos, doslice, (int64_t)g.heads * HD, i0, g.seq);
            for (int t = threadIdx.x; t < ATT_TILE; t += blockDim.x) {
                const bool in = i0 + t < g.seq;
                lse_s[t] = in ? lse_h[i0 + t] : 0.0f;
                delta_s[t] = in ? delta_h[i0 + t] : 0.0f;
            }
            __syncthreads();
            for (int t = 0; t < ATT_TILE; t++) {
                const int i = i0 + t;
                const bool seen = i < g.seq && i >= j;
                const float s = row_dot<HD>(k, qs[t], sub) * g.scale;
                const float dp = row_dot<HD>(v, dos[t], sub);
                const float p = seen ? expf(s - lse_s[t]) : 0.0f;
                const float ds = p * (dp - delta_s[t]);
                frag_axpy<HD>(dv, p, dos[t], sub);
                frag_axpy<HD>(dk, ds, qs[t], sub);
            }
        }
    }
    if (valid) {
        T *drow = dqkv + ((int64_t)b * g.seq + j) * g.ld;
        frag_store<HD>(drow + kcol, dk, g.scale, sub);
        frag_store<HD>(drow + vcol, dv, 1.0f, sub);
    }
}

/* ---- dQ: block (query block, head, batch) */

template <typename T, int HD>
__global__ void __launch_bounds__(att_shape<HD>::THREADS)
    attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *delta,
                   att_geom g)
{
    constexpr int TPR = att_shape<HD>::TPR;
    __shared__ float4 ks[ATT_TILE][HD / 4];
    __shared__ float4 vs[ATT_TILE][HD / 4];
    const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const int q0 = last_block_first() * ATT_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (g.heads / g.kv_heads);
    const int i = q0 + row;
    const bool valid = i < g.seq;
    const T *base = qkv + (int64_t)b * g.seq * g.ld;
    const T *kslice = base + (int64_t)(g.heads + kvh) * HD;
    const T *vslice = base + (int64_t)(g.heads + g.kv_heads + kvh) * HD;
    const int64_t stat = ((int64_t)b * g.heads + h) * g.seq + i;

    float4 q[4], dov[4], dq[4];
    frag_load<HD>(q, base + (int64_t)i * g.ld + (int64_t)h * HD, sub, valid);
    frag_load<HD>(dov, dout + ((int64_t)b * g.seq + i) * g.heads * HD + (int64_t)h * HD, sub,
                  valid);
    frag_zero(dq);
    const float lse_i = valid ? lse[stat] : 0.0f, delta_i = valid ? delta[stat] : 0.0f;
    const int kend = q0 + ATT_ROWS < g.seq ? q0 + ATT_ROWS : g.seq;
    for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        tile_load<HD>(ks, kslice, g.ld, k0, g.seq);
        tile_load<HD>(vs, vslice, g.ld, k0, g.seq);
        __syncthreads();
        for (int t = 0; t < ATT_TILE; t++) {
            const int key = k0 + t;
            const bool seen = valid && key <= i;
            const float s = row_dot<HD>(q, ks[t], sub) * g.scale;
            const float dp = row_dot<HD>(dov, vs[t], sub);
            const float p = seen ? expf(s - lse_i) : 0.0f;
            frag_axpy<HD>(dq, p * (dp - delta_i), ks[t], sub);
        }
    }
    if (valid)
        frag_store<HD>(dqkv + ((int64_t)b * g.seq + i) * g.ld + (int64_t)h * HD, dq, g.scale, sub);
}

/* ---- host side */

size_t llmt_cuda_attention_saved_bytes(const llmt_attn_dims *a)
{
    return (size_t)(a->batch * a->heads * a->seq) * sizeof(float);
}

/* Attention's scratch, from llmt_cuda_align_ptr(scratch): D and the
 * recomputed logsumexp (fp32 per row); then, where cuDNN may run, the
 * output of a forward rerun for its logsumexp and cuDNN's workspace. */
typedef struct att_scratch {
    float *delta, *lse;
    void *o, *workspace;
    size_t workspace_bytes;
} att_scratch;

static size_t att_scratch_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                int dt, att_scratch *sc, void *scratch)
{
    const size_t rows = llmt_cuda_round_up((size_t)(batch * heads * seq) * sizeof(float));
    const size_t ws = llmt_cudnn_attention_workspace(batch, seq, heads, head_dim, dt);
    const size_t o = ws ? llmt_cuda_round_up((size_t)(batch * seq * heads * head_dim) *
                                             llmt_cuda_dt_size(dt))
                        : 0;
    if (sc) {
        char *p = llmt_cuda_align_ptr(scratch);
        sc->delta = (float *)p;
        sc->lse = (float *)(p + rows);
        sc->o = ws ? p + 2 * rows : NULL;
        sc->workspace = ws ? p + 2 * rows + o : NULL;
        sc->workspace_bytes = ws;
    }
    return 2 * rows + o + llmt_cuda_round_up(ws) + LLMT_CUDA_ALIGN;
}

size_t llmt_cuda_attention_scratch(const llmt_op_dims *d)
{
    return att_scratch_bytes(d->batch, d->seq, d->heads, d->head_dim, d->dt, NULL, NULL);
}

/* The scratch regions of a call (its shape is within the planned one). */
static att_scratch att_carve(const llmt_attn_dims *a, int dt, void *scratch)
{
    att_scratch sc;
    att_scratch_bytes(a->batch, a->seq, a->heads, a->head_dim, dt, &sc, scratch);
    return sc;
}

/* Checks the shape; fills the geometry. */
static int attn_check(llmt_device *dev, const char *op, const llmt_attn_dims *a, int dt,
                      att_geom *g)
{
    LLMT_CUDA_CHECK_DT(dev, dt, op);
    const llmt_plugin_host *host = llmt_cuda(dev)->host;
    if (a->head_dim != 32 && a->head_dim != 64 && a->head_dim != 128)
        return host->fail(LLMT_EUNSUPPORTED, "CUDA %s: head_dim = %lld (the CUDA kernels "
                          "handle 32, 64 and 128)", op, (long long)a->head_dim);
    if (a->kv_heads < 1 || a->heads % a->kv_heads || a->heads > 65535 || a->batch > 65535 ||
        a->seq > ((int64_t)1 << 30))
        return host->fail(LLMT_EUNSUPPORTED, "CUDA %s: batch %lld, seq %lld, heads %lld, "
                          "kv_heads %lld are outside what the kernels handle", op,
                          (long long)a->batch, (long long)a->seq, (long long)a->heads,
                          (long long)a->kv_heads);
    g->seq = (int)a->seq;
    g->heads = (int)a->heads;
    g->kv_heads = (int)a->kv_heads;
    g->ld = (a->heads + 2 * a->kv_heads) * a->head_dim;
    g->scale = 1.0f / sqrtf((float)a->head_dim);
    return LLMT_OK;
}

static dim3 attn_grid(const llmt_attn_dims *a, int64_t heads)
{
    return dim3((unsigned)((a->seq + ATT_ROWS - 1) / ATT_ROWS), (unsigned)heads,
                (unsigned)a->batch);
}

/* Runs the statements with HD the head dimension as a constant. */
#define ATT_DISPATCH_HD(hd, ...)                                                            \
    do {                                                                                   \
        if ((hd) == 32) {                                                                  \
            constexpr int HD = 32;                                                         \
            __VA_ARGS__;                                                                   \
        } else if ((hd) == 64) {                                                           \
            constexpr int HD = 64;                                                         \
            __VA_ARGS__;                                                                   \
        } else {                                                                           \
            constexpr int HD = 128;                                                        \
            __VA_ARGS__;                                                                   \
        }                                                                                  \
    } while (0)

/* Forward on cuDNN (with scratch: cuDNN's workspace is there) or else the
 * kernel. */
int llmt_cuda_attention_fwd(llmt_device *dev, void *out, void *saved, const void *qkv,
                            const llmt_attn_dims *a, int dt, void *scratch)
{
    att_geom g;
    int rc = attn_check(dev, "attention_fwd", a, dt, &g);
    if (rc)
        return rc;
    if (a->batch <= 0 || a->seq <= 0 || a->heads <= 0)
        return LLMT_OK;
    att_scratch sc = {};
    if (scratch)
        sc = att_carve(a, dt, scratch);
    rc = llmt_cudnn_attention_fwd(dev, out, saved ? (float *)saved : sc.lse, qkv, a, dt,
                                  sc.workspace, sc.workspace_bytes);
    if (rc)
        return rc < 0 ? rc : LLMT_OK;
    cudaStream_t stream = llmt_cuda(dev)->stream;
    const dim3 grid = attn_grid(a, a->heads);
    LLMT_CUDA_DISPATCH(dt, T, ATT_DISPATCH_HD(a->head_dim, {
        LLMT_LAUNCH(grid, att_shape<HD>::THREADS, stream, attn_fwd_kernel<T, HD>)(
            (T *)out, (float *)saved, (const T *)qkv, g);
    }));
    LLMT_CUDA_LAUNCHED(dev, "attention_fwd");
    return LLMT_OK;
}

int llmt_cuda_attention_bwd(llmt_device *dev, void *dqkv, const void *dout, const void *qkv,
                            const void *saved, const void *out, const llmt_attn_dims *a, int dt,
                            void *scratch)
{
    att_geom g;
    int rc = attn_check(dev, "attention_bwd", a, dt, &g);
    if (rc)
        return rc;
    if (a->batch <= 0 || a->seq <= 0 || a->heads <= 0)
        return LLMT_OK;
    if (!scratch)
        return llmt_cuda(dev)->host->fail(LLMT_EINVAL, "CUDA attention_bwd: scratch is NULL");
    cudaStream_t stream = llmt_cuda(dev)->stream;
    const att_scratch sc = att_carve(a, dt, scratch);
    const float *lse = saved ? (const float *)saved : sc.lse;
    const dim3 qgrid = attn_grid(a, a->heads), kgrid = attn_grid(a, a->kv_heads);
    if (!saved) { /* the logsumexp, made the way forward makes it (the same bits) */
        rc = llmt_cudnn_attention_fwd(dev, sc.o, sc.lse, qkv, a, dt, sc.workspace,
                                      sc.workspace_bytes);
        if (rc < 0)
            return rc;
        if (rc == 0)
            LLMT_CUDA_DISPATCH(dt, T, ATT_DISPATCH_HD(a->head_dim, {
                LLMT_LAUNCH(qgrid, att_shape<HD>::THREADS, stream, attn_fwd_kernel<T, HD>)(
                    (T *)NULL, sc.lse, (const T *)qkv, g);
            }));
    }
    rc = llmt_cudnn_attention_bwd(dev, dqkv, dout, qkv, lse, out, a, dt, sc.workspace,
                                  sc.workspace_bytes);
    if (rc)
        return rc < 0 ? rc : LLMT_OK;
    float *delta = sc.delta;
    LLMT_CUDA_DISPATCH(dt, T, ATT_DISPATCH_HD(a->head_dim, {
        constexpr int threads = att_shape<HD>::THREADS;
        LLMT_LAUNCH(qgrid, threads, stream, attn_delta_kernel<T, HD>)(
            delta, (const T *)dout, (const T *)out, g);
        LLMT_LAUNCH(kgrid, threads, stream, attn_dkv_kernel<T, HD>)(
            (T *)dqkv, (const T *)dout, (const T *)qkv, lse, delta, g);
        LLMT_LAUNCH(qgrid, threads, stream, attn_dq_kernel<T, HD>)(
            (T *)dqkv, (const T *)dout, (const T *)qkv, lse, delta, g);
    }));
    LLMT_CUDA_LAUNCHED(dev, "attention_bwd");
    return LLMT_OK;
}

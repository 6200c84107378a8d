// gpumem's attention kernels (`scaled_dot_product_attention`), compiled at run time by NVRTC
// after common.cuh, computing what src/backend/cpu/attention.rs computes.
//
// Memory-efficient in PyTorch's sense: the forward keeps only its output and one logsumexp per
// query row (float32) in global memory, never the [T, S] probabilities; the backward
// recomputes them from the logsumexp. q, k, v, the output and the gradients are views of any
// float dtype (common.cuh) shaped [B, H, T or S, D]; key and value may have H / rep heads
// (grouped-query attention: query head h reads key head h / rep). Causal masks key j > query
// i. Scores, sums and products in float32; results rounded to their views' dtypes.

#define GM_MAX_KEYS 4096

// Reduces `v` over the block (blockDim.x a power of two, at most 1024) with `op`; every thread
// gets the result.
template <typename F>
__device__ float gm_block_reduce(float v, float* buf, F op) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + h]);
        }
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();
    return r;
}

struct GmMax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct GmSum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

#define GM_NEG_INF (-__int_as_float(0x7f800000))

// Element c of row r of head bh (of `rows` rows of `cols`) of a [B, H, rows, cols] view.
__device__ __forceinline__ float gm_row(const void* p, const Strided& s, long long bh,
                                        long long r, long long rows, long long c,
                                        long long cols) {
    return gm_get(p, s, (bh * rows + r) * cols + c);
}

// The key/value head of query head bh (`heads` query heads per batch, `rep` per key head).
__device__ __forceinline__ long long gm_kv_head(long long bh, long long heads, long long rep) {
    return (bh / heads) * (heads / rep) + (bh % heads) / rep;
}

// Query i's scaled scores against every key into p[0..s) (-inf past the causal limit).
__device__ void gm_scores(const void* q, const Strided& qs, const void* k, const Strided& ks,
                          long long bh, long long kh, long long i, long long t, long long s,
                          long long d, int causal, float scale, float* p) {
    long long last = causal ? (i < s ? i : s - 1) : s - 1;
    for (long long j = threadIdx.x; j < s; j += blockDim.x) {
        float x = GM_NEG_INF;
        if (j <= last) {
            float dot = 0.0f;
            for (long long c = 0; c < d; ++c)
                dot += gm_row(q, qs, bh, i, t, c, d) * gm_row(k, ks, kh, j, s, c, d);
            x = dot * scale;
        }
        p[j] = x;
    }
    __syncthreads();
}

// out[bh, i] = softmax(q k^T * scale) v, and the row's logsumexp into lse[bh * lse_width + i].
// One block per (query row, batch x head): the path for heads wider than 128 channels.
extern "C" __global__ void attention__rows(const void* q, Strided qs, const void* k, Strided ks,
                                     const void* v, Strided vs, void* out, Strided os,
                                     float* lse, long long heads, long long rep, long long t,
                                     long long s, long long d, long long dv,
                                     long long lse_width, int causal, float scale) {
    __shared__ float p[GM_MAX_KEYS];
    __shared__ float red[1024];
    long long bh = blockIdx.y, i = blockIdx.x;
    long long kh = gm_kv_head(bh, heads, rep);
    gm_scores(q, qs, k, ks, bh, kh, i, t, s, d, causal, scale, p);
    float mx = GM_NEG_INF;
    for (long long j = threadIdx.x; j < s; j += blockDim.x) mx = fmaxf(mx, p[j]);
    mx = gm_block_reduce(mx, red, GmMax());
    float sum = 0.0f;
    if (mx != GM_NEG_INF)
        for (long long j = threadIdx.x; j < s; j += blockDim.x) sum += expf(p[j] - mx);
    sum = gm_block_reduce(sum, red, GmSum());
    float l = mx == GM_NEG_INF ? GM_NEG_INF : mx + logf(sum);
    for (long long j = threadIdx.x; j < s; j += blockDim.x)
        p[j] = l == GM_NEG_INF ? 0.0f : expf(p[j] - l);
    __syncthreads();
    for (long long c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (long long j = 0; j < s; ++j) {
            if (p[j] != 0.0f) acc += p[j] * gm_row(v, vs, kh, j, s, c, dv);
        }
        gm_put(out, os, (bh * t + i) * dv + c, acc);
    }
    if (threadIdx.x == 0) lse[bh * lse_width + i] = l;
}

// The query's gradient for the incoming gradient g of the output o: with
// dS_ij = P_ij (g_i . v_j - g_i . o_i), dQ_i = scale * sum_j dS_ij k_j. One block per
// (query row, batch x head); P recomputed from the saved logsumexp. The path for heads wider
// than 128 channels.
extern "C" __global__ void attention_backward__rows(
    int which, const void* g, Strided gs, const void* q, Strided qs, const void* k, Strided ks,
    const void* v, Strided vs, const void* o, Strided os, const float* lse, void* out,
    Strided outs, long long heads, long long rep, long long t, long long s, long long d,
    long long dv, long long lse_width, int causal, float scale) {
    __shared__ float p[GM_MAX_KEYS];
    __shared__ float red[1024];
    if (which == 0) {
        long long bh = blockIdx.y, i = blockIdx.x;
        long long kh = gm_kv_head(bh, heads, rep);
        float l = lse[bh * lse_width + i];
        gm_scores(q, qs, k, ks, bh, kh, i, t, s, d, causal, scale, p);
        float part = 0.0f;
        for (long long c = threadIdx.x; c < dv; c += blockDim.x)
            part += gm_row(g, gs, bh, i, t, c, dv) * gm_row(o, os, bh, i, t, c, dv);
        float delta = gm_block_reduce(part, red, GmSum());
        for (long long j = threadIdx.x; j < s; j += blockDim.x) {
            float pj = l == GM_NEG_INF ? 0.0f : expf(p[j] - l);
            float ds = 0.0f;
            if (pj != 0.0f) {
                float dp = 0.0f;
                for (long long c = 0; c < dv; ++c)
                    dp += gm_row(g, gs, bh, i, t, c, dv) * gm_row(v, vs, kh, j, s, c, dv);
                ds = pj * (dp - delta);
            }
            p[j] = ds;
        }
        __syncthreads();
        for (long long c = threadIdx.x; c < d; c += blockDim.x) {
            float acc = 0.0f;
            for (long long j = 0; j < s; ++j)
                if (p[j] != 0.0f) acc += p[j] * gm_row(k, ks, kh, j, s, c, d);
            gm_put(out, outs, (bh * t + i) * d + c, acc * scale);
        }
        return;
    }
    // which 1 (key) or 2 (value): one block per (key row j, batch x key head); the weights
    // w_i of each query row of each query head of the group into shared memory, then each
    // channel's sum over them: dV_j = sum_i P_ij g_i, dK_j = scale * sum_i dS_ij q_i
    long long j = blockIdx.x, kh = blockIdx.y;
    long long kv_heads = heads / rep;
    long long b = kh / kv_heads, first = b * heads + (kh % kv_heads) * rep;
    long long cols = which == 1 ? d : dv;
    float* w = p;
    __shared__ float acc[1024];
    for (long long c = threadIdx.x; c < cols && c < 1024; c += blockDim.x) acc[c] = 0.0f;
    for (long long bh = first; bh < first + rep; ++bh) {
        for (long long i = threadIdx.x; i < t; i += blockDim.x) {
            float wi = 0.0f;
            float l = lse[bh * lse_width + i];
            bool seen = !causal || j <= i;
            if (seen && l != GM_NEG_INF) {
                float dot = 0.0f;
                for (long long c = 0; c < d; ++c)
                    dot += gm_row(q, qs, bh, i, t, c, d) * gm_row(k, ks, kh, j, s, c, d);
                float pij = expf(dot * scale - l);
                if (which == 2) {
                    wi = pij;
                } else {
                    float dp = 0.0f, delta = 0.0f;
                    for (long long c = 0; c < dv; ++c) {
                        float gc = gm_row(g, gs, bh, i, t, c, dv);
                        dp += gc * gm_row(v, vs, kh, j, s, c, dv);
                        delta += gc * gm_row(o, os, bh, i, t, c, dv);
                    }
                    wi = pij * (dp - delta) * scale;
                }
            }
            w[i] = wi;
        }
        __syncthreads();
        for (long long c = threadIdx.x; c < cols && c < 1024; c += blockDim.x) {
            float a = 0.0f;
            for (long long i = 0; i < t; ++i) {
                if (w[i] == 0.0f) continue;
                a += w[i] * (which == 2 ? gm_row(g, gs, bh, i, t, c, dv)
                                        : gm_row(q, qs, bh, i, t, c, d));
            }
            acc[c] += a;
        }
        __syncthreads();
    }
    for (long long c = threadIdx.x; c < cols && c < 1024; c += blockDim.x)
        gm_put(out, outs, (kh * s + j) * cols + c, acc[c]);
}

// ---- The tiled path (heads of at most 128 channels), FlashAttention-style ----
//
// A block of GM_ROWS threads, each thread one row: a query row in the forward and the query's
// gradient, a key row in the key's and value's gradients. The other side streams through
// shared memory in tiles of GM_TILE rows, converted to float32 once and padded with zeros to
// the kernel's width W (64 or 128: a kernel per width, `__d64`/`__d128`, so the narrow one keeps
// its registers), read four channels at a time; the thread's own row and its accumulator sit
// in registers. The forward keeps a running maximum and sum per row (online softmax, the
// accumulator rescaled when the maximum grows); the backward recomputes P from the saved
// logsumexp. Views are read through their four strides directly.

#define GM_ROWS 64
#define GM_TILE 32

// Element (bh, r, c) of a [B, H, rows, cols] view whose second dimension has `heads` heads.
__device__ __forceinline__ long long gm_off4(const Strided& s, long long bh, long long heads,
                                             long long r, long long c) {
    return s.offset + (bh / heads) * s.stride[0] + (bh % heads) * s.stride[1] +
           r * s.stride[2] + c * s.stride[3];
}

// Rows r0 .. r0 + GM_TILE of head bh of a view into tile[GM_TILE][W] as float32, zeros past
// `rows` and past `cols`; consecutive threads on consecutive channels.
template <int W>
__device__ __forceinline__ void gm_load_tile(float* tile, const void* p, const Strided& s,
                                             long long bh, long long heads, long long r0,
                                             long long rows, long long cols) {
    for (int e = threadIdx.x; e < GM_TILE * W; e += blockDim.x) {
        long long r = r0 + e / W, c = e % W;
        tile[e] = r < rows && c < cols ? gm_ld(p, s.dtype, gm_off4(s, bh, heads, r, c)) : 0.0f;
    }
}

// Row r of head bh into registers, zeros past `cols` (or everywhere when not `live`).
template <int W>
__device__ __forceinline__ void gm_load_row(float* row, const void* p, const Strided& s,
                                            long long bh, long long heads, long long r,
                                            long long cols, bool live) {
#pragma unroll
    for (int c = 0; c < W; ++c)
        row[c] = live && c < cols ? gm_ld(p, s.dtype, gm_off4(s, bh, heads, r, c)) : 0.0f;
}

// The dot product of a register row with row jj of a tile.
template <int W>
__device__ __forceinline__ float gm_dot(const float* row, const float* tile, int jj) {
    const float4* t4 = reinterpret_cast<const float4*>(tile + jj * W);
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int c = 0; c < W / 4; ++c) {
        float4 t = t4[c];
        a += row[4 * c] * t.x;
        b += row[4 * c + 1] * t.y;
        a += row[4 * c + 2] * t.z;
        b += row[4 * c + 3] * t.w;
    }
    return a + b;
}

// acc += w * row jj of a tile.
template <int W>
__device__ __forceinline__ void gm_axpy(float* acc, float w, const float* tile, int jj) {
    const float4* t4 = reinterpret_cast<const float4*>(tile + jj * W);
#pragma unroll
    for (int c = 0; c < W / 4; ++c) {
        float4 t = t4[c];
        acc[4 * c] += w * t.x;
        acc[4 * c + 1] += w * t.y;
        acc[4 * c + 2] += w * t.z;
        acc[4 * c + 3] += w * t.w;
    }
}

template <int W>
__device__ __forceinline__ void gm_store_row(void* p, const Strided& s, long long bh,
                                             long long heads, long long r, long long cols,
                                             const float* row, float scale) {
#pragma unroll
    for (int c = 0; c < W; ++c)
        if (c < cols) gm_st(p, s.dtype, gm_off4(s, bh, heads, r, c), row[c] * scale);
}

// MASK: an additive mask (any float dtype, a view broadcast to [B, H, T, S]) added to the
// scaled scores; a score of minus infinity weighs nothing (a fully masked row: zeros, its
// logsumexp minus infinity, as the cpu twin writes).
template <int W, bool MASK>
__device__ void gm_attention_tiled(const void* q, const Strided& qs, const void* k,
                                   const Strided& ks, const void* v, const Strided& vs, void* out,
                                   const Strided& os, float* lse, long long heads, long long rep,
                                   long long t, long long s, long long d, long long dv,
                                   long long lse_width, int causal, float scale,
                                   const void* mask, const Strided& ms) {
    __shared__ __align__(16) float kt[GM_TILE * W];
    __shared__ __align__(16) float vt[GM_TILE * W];
    long long bh = blockIdx.y, i0 = (long long)blockIdx.x * GM_ROWS;
    long long i = i0 + threadIdx.x;
    long long kh = gm_kv_head(bh, heads, rep), kv_heads = heads / rep;
    bool live = i < t;
    float qr[W], acc[W];
    gm_load_row<W>(qr, q, qs, bh, heads, i, d, live);
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = 0.0f;
    float m = GM_NEG_INF, sum = 0.0f;
    // the keys some row of the block sees
    long long end = causal ? min(s, i0 + GM_ROWS) : s;
    long long last = causal ? min(i, s - 1) : s - 1;
    for (long long j0 = 0; j0 < end; j0 += GM_TILE) {
        __syncthreads();
        gm_load_tile<W>(kt, k, ks, kh, kv_heads, j0, s, d);
        gm_load_tile<W>(vt, v, vs, kh, kv_heads, j0, s, dv);
        __syncthreads();
        if (!live) continue;
        int n = (int)min((long long)GM_TILE, last - j0 + 1);
        for (int jj = 0; jj < n; ++jj) {
            float x = gm_dot<W>(qr, kt, jj) * scale;
            if (MASK) x += gm_ld(mask, ms.dtype, gm_off4(ms, bh, heads, i, j0 + jj));
            if (x == GM_NEG_INF) continue;
            if (x > m) {
                float corr = m == GM_NEG_INF ? 0.0f : expf(m - x);
                sum *= corr;
#pragma unroll
                for (int c = 0; c < W; ++c) acc[c] *= corr;
                m = x;
            }
            float p = expf(x - m);
            sum += p;
            gm_axpy<W>(acc, p, vt, jj);
        }
    }
    if (!live) return;
    float l = m == GM_NEG_INF ? GM_NEG_INF : m + logf(sum);
    gm_store_row<W>(out, os, bh, heads, i, dv, acc, m == GM_NEG_INF ? 0.0f : 1.0f / sum);
    lse[bh * lse_width + i] = l;
}

// The query's gradient, a thread per query row: dQ_i = scale * sum_j P_ij (g_i.v_j - g_i.o_i) k_j.
template <int W>
__device__ void gm_attention_dq_tiled(float* sm, const void* g, const Strided& gs, const void* q,
                                      const Strided& qs, const void* k, const Strided& ks,
                                      const void* v, const Strided& vs, const void* o,
                                      const Strided& os, const float* lse, void* out,
                                      const Strided& outs, long long heads, long long rep,
                                      long long t, long long s, long long d, long long dv,
                                      long long lse_width, int causal, float scale) {
    float* kt = sm;
    float* vt = sm + GM_TILE * W;
    long long bh = blockIdx.y, i0 = (long long)blockIdx.x * GM_ROWS;
    long long i = i0 + threadIdx.x;
    long long kh = gm_kv_head(bh, heads, rep), kv_heads = heads / rep;
    bool live = i < t;
    float qr[W], gr[W], acc[W];
    gm_load_row<W>(qr, q, qs, bh, heads, i, d, live);
    gm_load_row<W>(gr, g, gs, bh, heads, i, dv, live);
    float delta = 0.0f;
#pragma unroll
    for (int c = 0; c < W; ++c) {
        if (live && c < dv) delta += gr[c] * gm_ld(o, os.dtype, gm_off4(os, bh, heads, i, c));
        acc[c] = 0.0f;
    }
    float l = live ? lse[bh * lse_width + i] : GM_NEG_INF;
    long long end = causal ? min(s, i0 + GM_ROWS) : s;
    long long last = causal ? min(i, s - 1) : s - 1;
    for (long long j0 = 0; j0 < end; j0 += GM_TILE) {
        __syncthreads();
        gm_load_tile<W>(kt, k, ks, kh, kv_heads, j0, s, d);
        gm_load_tile<W>(vt, v, vs, kh, kv_heads, j0, s, dv);
        __syncthreads();
        if (!live || l == GM_NEG_INF) continue;
        int n = (int)min((long long)GM_TILE, last - j0 + 1);
        for (int jj = 0; jj < n; ++jj) {
            float ds = expf(gm_dot<W>(qr, kt, jj) * scale - l) * (gm_dot<W>(gr, vt, jj) - delta);
            gm_axpy<W>(acc, ds, kt, jj);
        }
    }
    if (live) gm_store_row<W>(out, outs, bh, heads, i, d, acc, scale);
}

// The key's (which 1) or value's (which 2) gradient, a thread per key row j of key head kh,
// summed over every query head of its group: dV_j = sum_i P_ij g_i,
// dK_j = scale * sum_i P_ij (g_i.v_j - g_i.o_i) q_i.
template <int W>
__device__ void gm_attention_dkv_tiled(float* sm, int which, const void* g, const Strided& gs,
                                       const void* q, const Strided& qs, const void* k,
                                       const Strided& ks, const void* v, const Strided& vs,
                                       const void* o, const Strided& os, const float* lse,
                                       void* out, const Strided& outs, long long heads,
                                       long long rep, long long t, long long s, long long d,
                                       long long dv, long long lse_width, int causal,
                                       float scale) {
    float* qt = sm;
    float* gt = sm + GM_TILE * W;
    float* lt = gt + GM_TILE * W;
    float* dt = lt + GM_TILE;
    long long kh = blockIdx.y, j0 = (long long)blockIdx.x * GM_ROWS;
    long long j = j0 + threadIdx.x;
    long long kv_heads = heads / rep;
    long long b = kh / kv_heads, first = b * heads + (kh % kv_heads) * rep;
    bool live = j < s;
    float kr[W], vr[W], acc[W];
    gm_load_row<W>(kr, k, ks, kh, kv_heads, j, d, live);
    gm_load_row<W>(vr, v, vs, kh, kv_heads, j, dv, live && which == 1);
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = 0.0f;
    // a causal key j is seen by the queries i >= j only
    long long start = causal ? j0 : 0;
    for (long long bh = first; bh < first + rep; ++bh) {
        for (long long i0 = start; i0 < t; i0 += GM_TILE) {
            __syncthreads();
            gm_load_tile<W>(qt, q, qs, bh, heads, i0, t, d);
            gm_load_tile<W>(gt, g, gs, bh, heads, i0, t, dv);
            if (threadIdx.x < GM_TILE) {
                long long i = i0 + threadIdx.x;
                float dl = 0.0f;
                if (which == 1 && i < t)
                    for (long long c = 0; c < dv; ++c)
                        dl += gm_ld(g, gs.dtype, gm_off4(gs, bh, heads, i, c)) *
                              gm_ld(o, os.dtype, gm_off4(os, bh, heads, i, c));
                dt[threadIdx.x] = dl;
                lt[threadIdx.x] = i < t ? lse[bh * lse_width + i] : GM_NEG_INF;
            }
            __syncthreads();
            if (!live) continue;
            int n = (int)min((long long)GM_TILE, t - i0);
            // causal: the tile's rows before j are not seen
            int first_row = causal && j > i0 ? (int)min((long long)n, j - i0) : 0;
            for (int ii = first_row; ii < n; ++ii) {
                float l = lt[ii];
                if (l == GM_NEG_INF) continue;
                float p = expf(gm_dot<W>(kr, qt, ii) * scale - l);
                if (which == 2) {
                    gm_axpy<W>(acc, p, gt, ii);
                } else {
                    gm_axpy<W>(acc, p * (gm_dot<W>(vr, gt, ii) - dt[ii]) * scale, qt, ii);
                }
            }
        }
    }
    if (live) gm_store_row<W>(out, outs, kh, kv_heads, j, which == 1 ? d : dv, acc, 1.0f);
}

// The launches, a kernel per width (`tiled` set in src/backend/cuda/launch/attention.rs):
// blocks of GM_ROWS rows, a grid of (rows / GM_ROWS, heads).
#define GM_FWD_ARGS                                                                        \
    const void *q, Strided qs, const void *k, Strided ks, const void *v, Strided vs,       \
        void *out, Strided os, float *lse, long long heads, long long rep, long long t,    \
        long long s, long long d, long long dv, long long lse_width, int causal, float scale
#define GM_FWD_PASS q, qs, k, ks, v, vs, out, os, lse, heads, rep, t, s, d, dv, lse_width, causal, scale
#define GM_BWD_ARGS                                                                           \
    int which, const void *g, Strided gs, const void *q, Strided qs, const void *k,           \
        Strided ks, const void *v, Strided vs, const void *o, Strided os, const float *lse,   \
        void *out, Strided outs, long long heads, long long rep, long long t, long long s,    \
        long long d, long long dv, long long lse_width, int causal, float scale
#define GM_DQ_PASS \
    g, gs, q, qs, k, ks, v, vs, o, os, lse, out, outs, heads, rep, t, s, d, dv, lse_width, causal, scale

extern "C" __global__ void __launch_bounds__(GM_ROWS) attention__d64(GM_FWD_ARGS) {
    gm_attention_tiled<64, false>(GM_FWD_PASS, nullptr, qs);
}
extern "C" __global__ void __launch_bounds__(GM_ROWS) attention__d128(GM_FWD_ARGS) {
    gm_attention_tiled<128, false>(GM_FWD_PASS, nullptr, qs);
}
// With an additive mask (`attn_mask`): its view after the arguments above.
extern "C" __global__ void __launch_bounds__(GM_ROWS)
    attention__d64_mask(GM_FWD_ARGS, const void* mask, Strided ms) {
    gm_attention_tiled<64, true>(GM_FWD_PASS, mask, ms);
}
extern "C" __global__ void __launch_bounds__(GM_ROWS)
    attention__d128_mask(GM_FWD_ARGS, const void* mask, Strided ms) {
    gm_attention_tiled<128, true>(GM_FWD_PASS, mask, ms);
}
extern "C" __global__ void __launch_bounds__(GM_ROWS) attention_backward__d64(GM_BWD_ARGS) {
    __shared__ __align__(16) float sm[2 * GM_TILE * 64 + 2 * GM_TILE];
    if (which == 0)
        gm_attention_dq_tiled<64>(sm, GM_DQ_PASS);
    else
        gm_attention_dkv_tiled<64>(sm, which, GM_DQ_PASS);
}
extern "C" __global__ void __launch_bounds__(GM_ROWS) attention_backward__d128(GM_BWD_ARGS) {
    __shared__ __align__(16) float sm[2 * GM_TILE * 128 + 2 * GM_TILE];
    if (which == 0)
        gm_attention_dq_tiled<128>(sm, GM_DQ_PASS);
    else
        gm_attention_dkv_tiled<128>(sm, which, GM_DQ_PASS);
}

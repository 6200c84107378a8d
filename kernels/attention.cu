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
// One block per (query row, batch x head).
extern "C" __global__ void attention(const void* q, Strided qs, const void* k, Strided ks,
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
// (query row, batch x head); P recomputed from the saved logsumexp.
extern "C" __global__ void attention_backward(
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

// gpumem's attention kernels (`scaled_dot_product_attention`), float32, compiled at run time by
// NVRTC, computing what src/backend/cpu/attention.rs computes.
//
// Memory-efficient in PyTorch's sense: the forward keeps only its output and one logsumexp per
// query row in global memory (never the [T, S] probabilities); the backward recomputes each
// row's probabilities from the logsumexp. One block per (batch x head, query row); its threads
// share the row's scores in shared memory (S at most GM_MAX_KEYS keys). q, k, v, out and the
// gradients are contiguous [BH, T or S, D]; causal masks key j > query i.

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

// The row's probabilities into p[0..s) (zeros past the causal limit), from its logsumexp when
// `given`, else computed and returned. `red` is a blockDim.x scratch.
__device__ float gm_row_probs(const float* q, const float* k, long long s, long long d,
                              long long i, int causal, float scale, float* p, float* red,
                              int given, float lse) {
    long long last = causal ? (i < s ? i : s - 1) : s - 1;
    float mx = -__int_as_float(0x7f800000);
    for (long long j = threadIdx.x; j < s; j += blockDim.x) {
        float x = -__int_as_float(0x7f800000);
        if (j <= last) {
            float dot = 0.0f;
            for (long long c = 0; c < d; ++c) {
                dot += q[c] * k[j * d + c];
            }
            x = dot * scale;
        }
        p[j] = x;
        mx = fmaxf(mx, x);
    }
    __syncthreads();
    if (!given) {
        mx = gm_block_reduce(mx, red, GmMax());
        float sum = 0.0f;
        for (long long j = threadIdx.x; j <= last; j += blockDim.x) {
            sum += expf(p[j] - mx);
        }
        sum = gm_block_reduce(sum, red, GmSum());
        lse = mx + logf(sum);
    }
    for (long long j = threadIdx.x; j < s; j += blockDim.x) {
        p[j] = j <= last ? expf(p[j] - lse) : 0.0f;
    }
    __syncthreads();
    return lse;
}

// out[bh, i] = softmax(q k^T * scale) v, and the row's logsumexp into lse[bh * lse_width + i].
extern "C" __global__ void attention(const float* q, const float* k, const float* v, float* out,
                                     float* lse, long long t, long long s, long long d,
                                     long long dv, long long lse_width, int causal,
                                     float scale) {
    __shared__ float p[GM_MAX_KEYS];
    __shared__ float red[1024];
    long long bh = blockIdx.y, i = blockIdx.x;
    const float* qi = q + (bh * t + i) * d;
    const float* kb = k + bh * s * d;
    const float* vb = v + bh * s * dv;
    float l = gm_row_probs(qi, kb, s, d, i, causal, scale, p, red, 0, 0.0f);
    for (long long c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (long long j = 0; j < s; ++j) {
            acc += p[j] * vb[j * dv + c];
        }
        out[(bh * t + i) * dv + c] = acc;
    }
    if (threadIdx.x == 0) {
        lse[bh * lse_width + i] = l;
    }
}

// The gradients of q (written), k and v (added atomically: zeroed by the caller) for the
// incoming gradient g of the output, with dS = P (g v^T - rowsum(g * out)).
extern "C" __global__ void attention_backward(const float* g, const float* q, const float* k,
                                              const float* v, const float* out,
                                              const float* lse, float* gq, float* gk,
                                              float* gv, long long t, long long s, long long d,
                                              long long dv, long long lse_width, int causal,
                                              float scale) {
    __shared__ float p[GM_MAX_KEYS];
    __shared__ float red[1024];
    long long bh = blockIdx.y, i = blockIdx.x;
    const float* qi = q + (bh * t + i) * d;
    const float* gi = g + (bh * t + i) * dv;
    const float* oi = out + (bh * t + i) * dv;
    const float* kb = k + bh * s * d;
    const float* vb = v + bh * s * dv;
    gm_row_probs(qi, kb, s, d, i, causal, scale, p, red, 1, lse[bh * lse_width + i]);
    // delta = rowsum(g * out)
    float part = 0.0f;
    for (long long c = threadIdx.x; c < dv; c += blockDim.x) {
        part += gi[c] * oi[c];
    }
    float delta = gm_block_reduce(part, red, GmSum());
    // dV[j] += P_ij g_i; dS_ij = P_ij (g_i . v_j - delta)
    for (long long j = threadIdx.x; j < s; j += blockDim.x) {
        float pj = p[j];
        if (pj == 0.0f) {
            p[j] = 0.0f;
            continue;
        }
        float dp = 0.0f;
        for (long long c = 0; c < dv; ++c) {
            dp += gi[c] * vb[j * dv + c];
            atomicAdd(&gv[(bh * s + j) * dv + c], pj * gi[c]);
        }
        p[j] = pj * (dp - delta);
    }
    __syncthreads();
    // dQ_i = scale * sum_j dS_ij k_j; dK_j += scale * dS_ij q_i
    for (long long c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (long long j = 0; j < s; ++j) {
            acc += p[j] * kb[j * d + c];
        }
        gq[(bh * t + i) * d + c] = acc * scale;
    }
    for (long long j = threadIdx.x; j < s; j += blockDim.x) {
        float ds = p[j];
        if (ds == 0.0f) {
            continue;
        }
        for (long long c = 0; c < d; ++c) {
            atomicAdd(&gk[(bh * s + j) * d + c], scale * ds * qi[c]);
        }
    }
}

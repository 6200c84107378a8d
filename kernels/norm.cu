// gpumem's normalization kernels over the last dimension of contiguous rows, as the CPU twins
// in src/backend/cpu/nn.rs, compiled after common.cuh: each buffer a pointer and its dtype's
// code, computed in float32 (the statistics kept in float32, as PyTorch keeps them for bf16
// inputs). layer_norm writes the row's mean and rstd, rms_norm the row's rstd. Forward and the
// input's gradient run a block of 256 threads per row; the weight's and bias's gradients a
// block of 32 x 32 threads per 32 columns (GM_COLUMNS).

#define GM_THREADS 256

__device__ float gm_block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = GM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

// A column sum over every row into out[j] (the weight's and bias's gradients): a block of
// 32 x 32 threads per 32 columns, threadIdx.x the column (coalesced rows), threadIdx.y one of
// 32 interleaved row sets; `body` adds row r of column j to `s`.
#define GM_COLUMNS(j, r, body)                                                   \
    {                                                                            \
        __shared__ float part[32][33];                                           \
        long long j = blockIdx.x * 32LL + threadIdx.x;                           \
        float s = 0.0f;                                                          \
        if (j < cols)                                                            \
            for (long long r = threadIdx.y; r < rows; r += 32) body;             \
        part[threadIdx.y][threadIdx.x] = s;                                      \
        __syncthreads();                                                         \
        if (threadIdx.y == 0 && j < cols) {                                      \
            float t = 0.0f;                                                      \
            for (int k = 0; k < 32; ++k) t += part[k][threadIdx.x];              \
            gm_st(out, odt, j, t);                                               \
        }                                                                        \
    }

#define X(i) gm_ld(x, xdt, (i))
#define W(j) (has_w ? gm_ld(w, wdt, (j)) : 1.0f)

extern "C" __global__ void layer_norm(const void* x, int xdt, const void* w, int wdt,
                                      const void* b, int bdt, int has_w, int has_b, void* y,
                                      int ydt, void* mean, int mdt, void* rstd, int rdt,
                                      long long rows, long long cols, float eps) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long at = r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += X(at + j);
        float mu = gm_block_sum(s, red) / cols;
        float v = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float d = X(at + j) - mu;
            v += d * d;
        }
        float rs = rsqrtf(gm_block_sum(v, red) / cols + eps);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float o = (X(at + j) - mu) * rs * W(j);
            if (has_b) o += gm_ld(b, bdt, j);
            gm_st(y, ydt, at + j, o);
        }
        if (threadIdx.x == 0) {
            gm_st(mean, mdt, r, mu);
            gm_st(rstd, rdt, r, rs);
        }
    }
}

// The gradient of input `input` (0: x, 1: weight, 2: bias) from the incoming gradient g.
extern "C" __global__ void layer_norm_backward(int input, const void* g, int gdt, const void* x,
                                               int xdt, const void* w, int wdt, int has_w,
                                               const void* mean, int mdt, const void* rstd,
                                               int rdt, void* out, int odt, long long rows,
                                               long long cols) {
    if (input == 0) {
        __shared__ float red[GM_THREADS];
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
            long long at = r * cols;
            float mu = gm_ld(mean, mdt, r), rs = gm_ld(rstd, rdt, r);
            float s1 = 0.0f, s2 = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float gh = gm_ld(g, gdt, at + j) * W(j);
                s1 += gh;
                s2 += gh * (X(at + j) - mu) * rs;
            }
            s1 = gm_block_sum(s1, red);
            s2 = gm_block_sum(s2, red);
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float gh = gm_ld(g, gdt, at + j) * W(j);
                float xh = (X(at + j) - mu) * rs;
                gm_st(out, odt, at + j, rs * (gh - s1 / cols - xh * s2 / cols));
            }
        }
        return;
    }
    GM_COLUMNS(j, r, {
        float gv = gm_ld(g, gdt, r * cols + j);
        s += input == 1 ? gv * (X(r * cols + j) - gm_ld(mean, mdt, r)) * gm_ld(rstd, rdt, r) : gv;
    });
}

extern "C" __global__ void rms_norm(const void* x, int xdt, const void* w, int wdt, int has_w,
                                    void* y, int ydt, void* rstd, int rdt, long long rows,
                                    long long cols, float eps) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long at = r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += X(at + j) * X(at + j);
        float rs = rsqrtf(gm_block_sum(s, red) / cols + eps);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS)
            gm_st(y, ydt, at + j, X(at + j) * rs * W(j));
        if (threadIdx.x == 0) gm_st(rstd, rdt, r, rs);
    }
}

// The gradient of input `input` (0: x, 1: weight).
extern "C" __global__ void rms_norm_backward(int input, const void* g, int gdt, const void* x,
                                             int xdt, const void* w, int wdt, int has_w,
                                             const void* rstd, int rdt, void* out, int odt,
                                             long long rows, long long cols) {
    if (input == 0) {
        __shared__ float red[GM_THREADS];
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
            long long at = r * cols;
            float dot = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS)
                dot += gm_ld(g, gdt, at + j) * W(j) * X(at + j);
            dot = gm_block_sum(dot, red);
            float rs = gm_ld(rstd, rdt, r);
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float v = rs * gm_ld(g, gdt, at + j) * W(j) - rs * rs * rs * X(at + j) * dot / cols;
                gm_st(out, odt, at + j, v);
            }
        }
        return;
    }
    GM_COLUMNS(j, r, { s += gm_ld(g, gdt, r * cols + j) * X(r * cols + j) * gm_ld(rstd, rdt, r); });
}

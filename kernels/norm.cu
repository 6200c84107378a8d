// gpumem's normalization kernels over the last dimension of contiguous rows, float32, as the
// CPU twins in src/backend/cpu/nn.rs: layer_norm (writes the row's mean and rstd) and
// rms_norm (writes the row's rstd). Forward and the input's gradient run a block of 256
// threads per row; the weight's and bias's gradients a thread per column.

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

extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, int has_w,
                                      int has_b, float* y, float* mean, float* rstd,
                                      long long rows, long long cols, float eps) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += xr[j];
        float mu = gm_block_sum(s, red) / cols;
        float v = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) v += (xr[j] - mu) * (xr[j] - mu);
        float rs = rsqrtf(gm_block_sum(v, red) / cols + eps);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float o = (xr[j] - mu) * rs;
            if (has_w) o *= w[j];
            if (has_b) o += b[j];
            y[r * cols + j] = o;
        }
        if (threadIdx.x == 0) { mean[r] = mu; rstd[r] = rs; }
    }
}

// The gradient of input `input` (0: x, 1: weight, 2: bias) from the incoming gradient g.
extern "C" __global__ void layer_norm_backward(int input, const float* g, const float* x,
                                               const float* w, int has_w, const float* mean,
                                               const float* rstd, float* out, long long rows,
                                               long long cols) {
    if (input == 0) {
        __shared__ float red[GM_THREADS];
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
            float s1 = 0.0f, s2 = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float gh = g[r * cols + j] * (has_w ? w[j] : 1.0f);
                s1 += gh;
                s2 += gh * (x[r * cols + j] - mean[r]) * rstd[r];
            }
            s1 = gm_block_sum(s1, red);
            s2 = gm_block_sum(s2, red);
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float gh = g[r * cols + j] * (has_w ? w[j] : 1.0f);
                float xh = (x[r * cols + j] - mean[r]) * rstd[r];
                out[r * cols + j] = rstd[r] * (gh - s1 / cols - xh * s2 / cols);
            }
        }
        return;
    }
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < cols;
         j += (long long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (long long r = 0; r < rows; ++r) {
            float gv = g[r * cols + j];
            s += input == 1 ? gv * (x[r * cols + j] - mean[r]) * rstd[r] : gv;
        }
        out[j] = s;
    }
}

extern "C" __global__ void rms_norm(const float* x, const float* w, int has_w, float* y,
                                    float* rstd, long long rows, long long cols, float eps) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += xr[j] * xr[j];
        float rs = rsqrtf(gm_block_sum(s, red) / cols + eps);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            y[r * cols + j] = xr[j] * rs * (has_w ? w[j] : 1.0f);
        }
        if (threadIdx.x == 0) rstd[r] = rs;
    }
}

// The gradient of input `input` (0: x, 1: weight).
extern "C" __global__ void rms_norm_backward(int input, const float* g, const float* x,
                                             const float* w, int has_w, const float* rstd,
                                             float* out, long long rows, long long cols) {
    if (input == 0) {
        __shared__ float red[GM_THREADS];
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
            float dot = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS)
                dot += g[r * cols + j] * (has_w ? w[j] : 1.0f) * x[r * cols + j];
            dot = gm_block_sum(dot, red);
            float rs = rstd[r];
            for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
                float wj = has_w ? w[j] : 1.0f;
                out[r * cols + j] = rs * g[r * cols + j] * wj - rs * rs * rs * x[r * cols + j] * dot / cols;
            }
        }
        return;
    }
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < cols;
         j += (long long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (long long r = 0; r < rows; ++r) s += g[r * cols + j] * x[r * cols + j] * rstd[r];
        out[j] = s;
    }
}

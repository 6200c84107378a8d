// gpumem's softmax kernels, float32, over the last dimension of contiguous rows (the engine
// moves the softmax dimension last, as the CPU twin in src/backend/cpu/nn.rs does). One block
// of 256 threads per row; `log` selects log_softmax.

#define GM_THREADS 256

// The block's reduction of `v` (max when `is_max`, else sum), returned to every thread.
__device__ float gm_block_reduce(float v, bool is_max, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = GM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = red[threadIdx.x + s];
            red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], o) : red[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void softmax(int log, const float* x, float* y, long long rows,
                                   long long cols) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = __int_as_float(0xff800000);  // -inf (NVRTC has no math headers)
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) m = fmaxf(m, xr[j]);
        m = gm_block_reduce(m, true, red);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += expf(xr[j] - m);
        s = gm_block_reduce(s, false, red);
        float ls = logf(s);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            yr[j] = log ? xr[j] - m - ls : expf(xr[j] - m) / s;
        }
    }
}

// The input's gradient from the output y and the incoming gradient g:
// softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g).
extern "C" __global__ void softmax_backward(int log, const float* g, const float* y, float* out,
                                            long long rows, long long cols) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* gr = g + r * cols;
        const float* yr = y + r * cols;
        float* o = out + r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) s += log ? gr[j] : gr[j] * yr[j];
        s = gm_block_reduce(s, false, red);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            o[j] = log ? gr[j] - expf(yr[j]) * s : yr[j] * (gr[j] - s);
        }
    }
}

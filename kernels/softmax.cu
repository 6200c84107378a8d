// gpumem's softmax kernels over the last dimension of contiguous rows (the engine moves the
// softmax dimension last, as the CPU twin in src/backend/cpu/nn.rs does), compiled after
// common.cuh: each buffer a pointer and its dtype's code, computed in float32. One block of
// 256 threads per row; `log` selects log_softmax.

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

extern "C" __global__ void softmax(int log, const void* x, int xdt, void* y, int ydt,
                                   long long rows, long long cols) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long at = r * cols;
        float m = __int_as_float(0xff800000);  // -inf (NVRTC has no math headers)
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS)
            m = fmaxf(m, gm_ld(x, xdt, at + j));
        m = gm_block_reduce(m, true, red);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS)
            s += expf(gm_ld(x, xdt, at + j) - m);
        s = gm_block_reduce(s, false, red);
        float ls = logf(s);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float v = gm_ld(x, xdt, at + j);
            gm_st(y, ydt, at + j, log ? v - m - ls : expf(v - m) / s);
        }
    }
}

// The input's gradient from the output y and the incoming gradient g:
// softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g).
extern "C" __global__ void softmax_backward(int log, const void* g, int gdt, const void* y,
                                            int ydt, void* out, int odt, long long rows,
                                            long long cols) {
    __shared__ float red[GM_THREADS];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long at = r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float gv = gm_ld(g, gdt, at + j);
            s += log ? gv : gv * gm_ld(y, ydt, at + j);
        }
        s = gm_block_reduce(s, false, red);
        for (long long j = threadIdx.x; j < cols; j += GM_THREADS) {
            float gv = gm_ld(g, gdt, at + j), yv = gm_ld(y, ydt, at + j);
            gm_st(out, odt, at + j, log ? gv - expf(yv) * s : yv * (gv - s));
        }
    }
}

// gpumem's reduction kernels, float32, compiled at run time by NVRTC.
//
// `reduce` is the engine's `sum`/`mean` over dimensions (`Op::Reduce`, and `SumTo` for a
// broadcast operand's gradient): the input is seen as a contiguous [outer, len, inner] and
// reduced over the middle, which covers one dimension, a run of adjacent ones, or all of them
// (outer = inner = 1). One thread per output, summing in index order as the CPU twin does.
extern "C" __global__ void reduce(int mean, const float* x, long long outer, long long len,
                                  long long inner, float* out) {
    long long total = outer * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long o = i / inner, j = i % inner;
        const float* p = x + o * len * inner + j;
        float s = 0.0f;
        for (long long k = 0; k < len; ++k) {
            s += p[k * inner];
        }
        out[i] = mean ? s / (float)len : s;
    }
}

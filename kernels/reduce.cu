// gpumem's reduction kernel, compiled at run time by NVRTC after common.cuh.
//
// `reduce` is the engine's `sum`/`mean` over any dimensions of any view (`Op::Reduce`, and
// `SumTo` for a broadcast operand's gradient, and a bias's gradient over rows): `xs` is the
// input's view with the kept dimensions first and the reduced ones last (the caller's
// permutation), so output i sums the `len` elements i * len .. (i + 1) * len - 1 of it. Sums
// are in double, as the CPU twin sums, so the order barely matters; the output, of `total`
// elements, is written through its own view and rounded to its dtype. With `per_block` set (few
// outputs, long sums: a bias's gradient, a loss) a block of 256 threads sums each output;
// otherwise a thread does.

#define GM_REDUCE_THREADS 256

extern "C" __global__ void reduce(int per_block, int mean, const void* x, Strided xs,
                                  long long total, long long len, void* out, Strided os) {
    if (!per_block) {
        GM_EACH(i, total) {
            double s = 0.0;
            for (long long k = 0; k < len; ++k) s += gm_get(x, xs, i * len + k);
            gm_put_d(out, os, i, mean ? s / (double)len : s);
        }
        return;
    }
    __shared__ double red[GM_REDUCE_THREADS];
    for (long long i = blockIdx.x; i < total; i += gridDim.x) {
        double s = 0.0;
        for (long long k = threadIdx.x; k < len; k += GM_REDUCE_THREADS)
            s += gm_get(x, xs, i * len + k);
        red[threadIdx.x] = s;
        __syncthreads();
        for (int h = GM_REDUCE_THREADS / 2; h > 0; h >>= 1) {
            if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
            __syncthreads();
        }
        if (threadIdx.x == 0) gm_put_d(out, os, i, mean ? red[0] / (double)len : red[0]);
        __syncthreads();
    }
}

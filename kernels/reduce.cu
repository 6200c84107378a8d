// gpumem's reduction kernel, compiled at run time by NVRTC after common.cuh.
//
// `reduce` is the engine's `sum`/`mean` over any dimensions of any view (`Op::Reduce`, and
// `SumTo` for a broadcast operand's gradient, and a bias's gradient over rows): `xs` is the
// input's view with the kept dimensions first and the reduced ones last (the caller's
// permutation), so output i sums the `len` elements i * len .. (i + 1) * len - 1 of it. Sums
// are in double, as the CPU twin sums, so the order barely matters (and an integer sum below
// 2^53 is exact: int64 and bool inputs are read as double); the output, of `total`
// elements, is written through its own view and rounded to its dtype. With `per_block` set (few
// outputs, long sums: a bias's gradient, a loss) a block of 256 threads sums each output;
// otherwise a thread does.

#define GM_REDUCE_THREADS 256

extern "C" __global__ void reduce(int per_block, int mean, const void* x, Strided xs,
                                  long long total, long long len, void* out, Strided os) {
    if (!per_block) {
        GM_EACH(i, total) {
            double s = 0.0;
            for (long long k = 0; k < len; ++k) s += gm_get_d(x, xs, i * len + k);
            gm_put_d(out, os, i, mean ? s / (double)len : s);
        }
        return;
    }
    __shared__ double red[GM_REDUCE_THREADS];
    for (long long i = blockIdx.x; i < total; i += gridDim.x) {
        double s = 0.0;
        for (long long k = threadIdx.x; k < len; k += GM_REDUCE_THREADS)
            s += gm_get_d(x, xs, i * len + k);
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

// The selecting reductions over the same permuted view (output i over elements i * len ..
// (i + 1) * len - 1): mode 0 `argmax` (the int64 position of the largest, the first of equals,
// the first NaN before any number), 1 `any`, 2 `all` (bools), 3 `max` (NaN if any is NaN), as
// the cpu twin decides them. With `per_block` a block of 256 threads takes each output.

// Whether candidate (v, i) beats (w, j) for argmax.
__device__ __forceinline__ bool gm_arg_beats(double v, long long i, double w, long long j) {
    bool vn = v != v, wn = w != w;
    if (vn != wn) return vn;
    if (vn || v == w) return i < j;
    return v > w;
}

// No position yet (argmax's start): any element beats it.
#define GM_NONE 0x7fffffffffffffffLL

__device__ __forceinline__ void gm_select_step(int mode, double v, long long k, double& best,
                                               long long& at) {
    if (mode == 0) {
        if (at == GM_NONE || gm_arg_beats(v, k, best, at)) {
            best = v;
            at = k;
        }
    } else if (mode == 1) {
        best = (best != 0.0 || v != 0.0) ? 1.0 : 0.0;
    } else if (mode == 2) {
        best = (best != 0.0 && v != 0.0) ? 1.0 : 0.0;
    } else {
        best = (best != best || v != v) ? __longlong_as_double(0x7ff8000000000000LL)
                                        : fmax(best, v);
    }
}

extern "C" __global__ void reduce__select(int mode, int per_block, const void* x, Strided xs,
                                          long long total, long long len, void* out,
                                          Strided os) {
    // the identities: argmax starts past the end (any element beats it), any false, all
    // true, max minus infinity
    const double start = mode == 2 ? 1.0 : (mode == 3 ? -1.0 / 0.0 : 0.0);
    if (!per_block) {
        GM_EACH(i, total) {
            double best = start;
            long long at = GM_NONE;
            for (long long k = 0; k < len; ++k)
                gm_select_step(mode, gm_get_d(x, xs, i * len + k), k, best, at);
            gm_put_d(out, os, i, mode == 0 ? (double)at : best);
        }
        return;
    }
    __shared__ double vals[GM_REDUCE_THREADS];
    __shared__ long long ats[GM_REDUCE_THREADS];
    for (long long i = blockIdx.x; i < total; i += gridDim.x) {
        double best = start;
        long long at = GM_NONE;
        for (long long k = threadIdx.x; k < len; k += GM_REDUCE_THREADS)
            gm_select_step(mode, gm_get_d(x, xs, i * len + k), k, best, at);
        vals[threadIdx.x] = best;
        ats[threadIdx.x] = at;
        __syncthreads();
        for (int h = GM_REDUCE_THREADS / 2; h > 0; h >>= 1) {
            // a thread that saw no element (argmax's GM_NONE) offers nothing
            if (threadIdx.x < h && (mode != 0 || ats[threadIdx.x + h] != GM_NONE)) {
                double b = vals[threadIdx.x];
                long long a = ats[threadIdx.x];
                gm_select_step(mode, vals[threadIdx.x + h], ats[threadIdx.x + h], b, a);
                vals[threadIdx.x] = b;
                ats[threadIdx.x] = a;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) gm_put_d(out, os, i, mode == 0 ? (double)ats[0] : vals[0]);
        __syncthreads();
    }
}

// gpumem's reduction kernel, compiled at run time by NVRTC after common.cuh.
//
// `reduce` is the engine's `sum`/`mean` over any dimensions of any view (`Op::Reduce`, and
// `SumTo` for a broadcast operand's gradient, and a bias's gradient over rows): `xs` is the
// input's view with the kept dimensions first and the reduced ones last (the caller's
// permutation), so output i sums the `len` elements i * len .. (i + 1) * len - 1 of it. One
// thread per output, summing in double in index order as the CPU twin does; the output, of
// `total` elements, written through its own view and rounded to its dtype.
extern "C" __global__ void reduce(int mean, const void* x, Strided xs, long long total,
                                  long long len, void* out, Strided os) {
    GM_EACH(i, total) {
        double s = 0.0;
        for (long long k = 0; k < len; ++k) s += gm_get(x, xs, i * len + k);
        gm_put_d(out, os, i, mean ? s / (double)len : s);
    }
}

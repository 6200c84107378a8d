// gpumem's reduction kernels, compiled at run time by NVRTC after common.cuh.
//
// `reduce` is the engine's `sum`/`mean` over dimensions (`Op::Reduce`, and `SumTo` for a
// broadcast operand's gradient): the input is seen as a contiguous [outer, len, inner] and
// reduced over the middle, which covers one dimension, a run of adjacent ones, or all of them
// (outer = inner = 1). One thread per output, summing in double in index order as the CPU
// twin does; the output rounded to its dtype.
extern "C" __global__ void reduce(int mean, const void* x, int xdt, long long outer,
                                  long long len, long long inner, void* out, int odt) {
    long long total = outer * inner;
    GM_EACH(i, total) {
        long long o = i / inner, j = i % inner;
        long long at = o * len * inner + j;
        double s = 0.0;
        for (long long k = 0; k < len; ++k) s += gm_ld(x, xdt, at + k * inner);
        gm_st(out, odt, i, (float)(mean ? s / (double)len : s));
    }
}

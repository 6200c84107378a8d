// gpumem's vision kernels, compiled at run time by NVRTC after common.cuh, computing what
// src/backend/cpu/vision.rs computes: conv2d (direct: grouped, strided, dilated, padded) with
// its input, weight and bias gradients; batch norm (training: batch statistics and the running
// statistics updated in place; eval: the running ones) with its gradients; max_pool2d with its
// int64 indices (the flat position in the input plane, the first of equal maxima) and its
// gradient; adaptive_avg_pool2d and its gradient.
//
// Every buffer is contiguous [N, C, H, W] (or [C] per channel) of the dtype its code names.
// Sums are in double, as the CPU twin sums, and each result is rounded once to its dtype.
// Elementwise results take a thread each; the gradients that are sums over a batch (weight,
// bias, batch norm's statistics) take a block of GM_VISION_THREADS threads per sum.

#define GM_VISION_THREADS 256

// The block's sum of v (every thread gets it).
__device__ double gm_block_sum_d(double v, double* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = GM_VISION_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    double r = red[0];
    __syncthreads();
    return r;
}

// A convolution's geometry: [n, ci, h, w] input, [k, cg, r, s] weight, [n, k, oh, ow] output.
struct GmConv {
    long long n, ci, h, w, k, cg, r, s, oh, ow, stride, pad, dil, groups;
};

extern "C" __global__ void conv2d(const void* x, int xdt, const void* w, int wdt, const void* b,
                                  int bdt, int has_b, void* y, int ydt, GmConv c) {
    long long kg = c.k / c.groups;
    GM_EACH(e, c.n * c.k * c.oh * c.ow) {
        long long ox = e % c.ow, oy = (e / c.ow) % c.oh, kk = (e / (c.ow * c.oh)) % c.k;
        long long nn = e / (c.ow * c.oh * c.k);
        long long g0 = (kk / kg) * c.cg;
        double acc = has_b ? (double)gm_ld(b, bdt, kk) : 0.0;
        for (long long cc = 0; cc < c.cg; ++cc) {
            long long xbase = (nn * c.ci + g0 + cc) * c.h * c.w;
            long long wbase = (kk * c.cg + cc) * c.r * c.s;
            for (long long a = 0; a < c.r; ++a) {
                long long iy = oy * c.stride + a * c.dil - c.pad;
                if (iy < 0 || iy >= c.h) continue;
                for (long long bb = 0; bb < c.s; ++bb) {
                    long long ix = ox * c.stride + bb * c.dil - c.pad;
                    if (ix < 0 || ix >= c.w) continue;
                    acc += (double)gm_ld(x, xdt, xbase + iy * c.w + ix) *
                           (double)gm_ld(w, wdt, wbase + a * c.s + bb);
                }
            }
        }
        gm_st_d(y, ydt, e, acc);
    }
}

// The gradient of input `which` (0: x, a thread per element; 1: the weight, a block per
// element; 2: the bias, a block per channel) from the output's gradient g.
extern "C" __global__ void conv2d_backward(int which, const void* g, int gdt, const void* x,
                                           int xdt, const void* w, int wdt, void* out, int odt,
                                           GmConv c) {
    long long kg = c.k / c.groups;
    if (which == 0) {
        GM_EACH(e, c.n * c.ci * c.h * c.w) {
            long long ix = e % c.w, iy = (e / c.w) % c.h, ch = (e / (c.w * c.h)) % c.ci;
            long long nn = e / (c.w * c.h * c.ci);
            long long grp = ch / c.cg, cc = ch % c.cg;
            double acc = 0.0;
            for (long long kk = grp * kg; kk < (grp + 1) * kg; ++kk) {
                long long gbase = (nn * c.k + kk) * c.oh * c.ow;
                long long wbase = (kk * c.cg + cc) * c.r * c.s;
                for (long long a = 0; a < c.r; ++a) {
                    long long ty = iy + c.pad - a * c.dil;
                    if (ty < 0 || ty % c.stride != 0 || ty / c.stride >= c.oh) continue;
                    long long oy = ty / c.stride;
                    for (long long bb = 0; bb < c.s; ++bb) {
                        long long tx = ix + c.pad - bb * c.dil;
                        if (tx < 0 || tx % c.stride != 0 || tx / c.stride >= c.ow) continue;
                        long long ox = tx / c.stride;
                        acc += (double)gm_ld(g, gdt, gbase + oy * c.ow + ox) *
                               (double)gm_ld(w, wdt, wbase + a * c.s + bb);
                    }
                }
            }
            gm_st_d(out, odt, e, acc);
        }
        return;
    }
    __shared__ double red[GM_VISION_THREADS];
    long long plane = c.oh * c.ow;
    if (which == 1) {
        for (long long f = blockIdx.x; f < c.k * c.cg * c.r * c.s; f += gridDim.x) {
            long long bb = f % c.s, a = (f / c.s) % c.r, cc = (f / (c.s * c.r)) % c.cg;
            long long kk = f / (c.s * c.r * c.cg);
            long long ch = (kk / kg) * c.cg + cc;
            double acc = 0.0;
            for (long long m = threadIdx.x; m < c.n * plane; m += GM_VISION_THREADS) {
                long long nn = m / plane, oy = (m % plane) / c.ow, ox = m % c.ow;
                long long iy = oy * c.stride + a * c.dil - c.pad;
                long long ix = ox * c.stride + bb * c.dil - c.pad;
                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                acc += (double)gm_ld(g, gdt, (nn * c.k + kk) * plane + oy * c.ow + ox) *
                       (double)gm_ld(x, xdt, (nn * c.ci + ch) * c.h * c.w + iy * c.w + ix);
            }
            acc = gm_block_sum_d(acc, red);
            if (threadIdx.x == 0) gm_st_d(out, odt, f, acc);
        }
        return;
    }
    for (long long kk = blockIdx.x; kk < c.k; kk += gridDim.x) {
        double acc = 0.0;
        for (long long m = threadIdx.x; m < c.n * plane; m += GM_VISION_THREADS)
            acc += (double)gm_ld(g, gdt, ((m / plane) * c.k + kk) * plane + m % plane);
        acc = gm_block_sum_d(acc, red);
        if (threadIdx.x == 0) gm_st_d(out, odt, kk, acc);
    }
}

// Batch norm over [n, c, inner], a block per channel. Training: the batch's mean and inverse
// std (kept as float32 in mean_out/invstd_out when has_stats), the running statistics updated
// in place with the unbiased variance; eval: the running statistics.
extern "C" __global__ void batch_norm(const void* x, int xdt, const void* gamma, int gdt,
                                      const void* beta, int bdt, void* rm, int rmdt, void* rv,
                                      int rvdt, void* y, int ydt, void* mean_out, int mdt,
                                      void* invstd_out, int idt, int has_stats, int training,
                                      long long n, long long c, long long inner,
                                      double momentum, double eps) {
    __shared__ double red[GM_VISION_THREADS];
    long long count = n * inner;
    for (long long cc = blockIdx.x; cc < c; cc += gridDim.x) {
        double mu, invstd, unbiased = 0.0;
        if (training) {
            double s = 0.0;
            for (long long m = threadIdx.x; m < count; m += GM_VISION_THREADS)
                s += (double)gm_ld(x, xdt, ((m / inner) * c + cc) * inner + m % inner);
            mu = gm_block_sum_d(s, red) / (double)count;
            double q = 0.0;
            for (long long m = threadIdx.x; m < count; m += GM_VISION_THREADS) {
                double d = (double)gm_ld(x, xdt, ((m / inner) * c + cc) * inner + m % inner) - mu;
                q += d * d;
            }
            q = gm_block_sum_d(q, red);
            invstd = 1.0 / sqrt(q / (double)count + eps);
            unbiased = count > 1 ? q / (double)(count - 1) : 0.0;
        } else {
            mu = (double)gm_ld(rm, rmdt, cc);
            invstd = 1.0 / sqrt((double)gm_ld(rv, rvdt, cc) + eps);
        }
        double ga = gm_ld(gamma, gdt, cc), be = gm_ld(beta, bdt, cc);
        for (long long m = threadIdx.x; m < count; m += GM_VISION_THREADS) {
            long long k = ((m / inner) * c + cc) * inner + m % inner;
            gm_st_d(y, ydt, k, ((double)gm_ld(x, xdt, k) - mu) * invstd * ga + be);
        }
        if (threadIdx.x == 0 && training) {
            double r1 = (1.0 - momentum) * (double)gm_ld(rm, rmdt, cc) + momentum * mu;
            double r2 = (1.0 - momentum) * (double)gm_ld(rv, rvdt, cc) + momentum * unbiased;
            gm_st_d(rm, rmdt, cc, r1);
            gm_st_d(rv, rvdt, cc, r2);
            if (has_stats) {
                gm_st_d(mean_out, mdt, cc, mu);
                gm_st_d(invstd_out, idt, cc, invstd);
            }
        }
    }
}

// The gradient of input `which` (0: x, 1: the weight, 2: the bias) from g, with the saved
// mean and inverse std; a block per channel.
extern "C" __global__ void batch_norm_backward(int which, const void* g, int gdt, const void* x,
                                               int xdt, const void* mean, int mdt,
                                               const void* invstd, int idt, const void* gamma,
                                               int gadt, void* out, int odt, long long n,
                                               long long c, long long inner) {
    __shared__ double red[GM_VISION_THREADS];
    long long count = n * inner;
    for (long long cc = blockIdx.x; cc < c; cc += gridDim.x) {
        double mu = gm_ld(mean, mdt, cc), is = gm_ld(invstd, idt, cc);
        double sg = 0.0, sgx = 0.0;
        for (long long m = threadIdx.x; m < count; m += GM_VISION_THREADS) {
            long long k = ((m / inner) * c + cc) * inner + m % inner;
            double gv = gm_ld(g, gdt, k);
            sg += gv;
            sgx += gv * ((double)gm_ld(x, xdt, k) - mu) * is;
        }
        sg = gm_block_sum_d(sg, red);
        sgx = gm_block_sum_d(sgx, red);
        if (which == 0) {
            double ga = gm_ld(gamma, gadt, cc), cn = (double)count;
            for (long long m = threadIdx.x; m < count; m += GM_VISION_THREADS) {
                long long k = ((m / inner) * c + cc) * inner + m % inner;
                double xhat = ((double)gm_ld(x, xdt, k) - mu) * is;
                gm_st_d(out, odt, k, ga * is / cn * (cn * (double)gm_ld(g, gdt, k) - sg - xhat * sgx));
            }
        } else if (threadIdx.x == 0) {
            gm_st_d(out, odt, cc, which == 1 ? sgx : sg);
        }
    }
}

// A pooling window's geometry over `planes` planes of [h, w] to [oh, ow].
struct GmPool {
    long long planes, h, w, oh, ow, kernel, stride, pad;
};

// The flat position in its plane of the window (oy, ox)'s maximum, as the CPU twin finds it:
// the first of equal maxima, a NaN replacing what came before (position 0 when every value is
// -inf); the maximum into *best_out.
__device__ __forceinline__ long long gm_window_max(const void* x, int xdt, const GmPool& p,
                                                   long long plane, long long oy, long long ox,
                                                   float* best_out) {
    float best = -__int_as_float(0x7f800000);
    long long at = 0;
    for (long long a = 0; a < p.kernel; ++a) {
        long long iy = oy * p.stride + a - p.pad;
        if (iy < 0 || iy >= p.h) continue;
        for (long long b = 0; b < p.kernel; ++b) {
            long long ix = ox * p.stride + b - p.pad;
            if (ix < 0 || ix >= p.w) continue;
            float v = gm_ld(x, xdt, plane * p.h * p.w + iy * p.w + ix);
            if (v > best || v != v) {
                best = v;
                at = iy * p.w + ix;
            }
        }
    }
    *best_out = best;
    return at;
}

extern "C" __global__ void max_pool2d(const void* x, int xdt, void* y, int ydt,
                                      long long* idx, int has_idx, GmPool p) {
    GM_EACH(e, p.planes * p.oh * p.ow) {
        long long ox = e % p.ow, oy = (e / p.ow) % p.oh, plane = e / (p.ow * p.oh);
        float best;
        long long at = gm_window_max(x, xdt, p, plane, oy, ox, &best);
        gm_st(y, ydt, e, best);
        if (has_idx) idx[e] = at;
    }
}

// The input's gradient: each output's gradient back to its window's maximum, gathered per
// input element over the windows holding it (the saved indices, or the maxima found again).
extern "C" __global__ void max_pool2d_backward(const void* g, int gdt, const void* x, int xdt,
                                               const long long* idx, int has_idx, void* out,
                                               int odt, GmPool p) {
    GM_EACH(e, p.planes * p.h * p.w) {
        long long ix = e % p.w, iy = (e / p.w) % p.h, plane = e / (p.w * p.h);
        long long pos = iy * p.w + ix;
        double acc = 0.0;
        // the windows holding (iy, ix): oy * stride - pad <= iy < oy * stride - pad + kernel
        long long ty = iy + p.pad, tx = ix + p.pad;
        long long oy0 = ty >= p.kernel ? (ty - p.kernel) / p.stride + 1 : 0;
        long long ox0 = tx >= p.kernel ? (tx - p.kernel) / p.stride + 1 : 0;
        for (long long oy = oy0; oy <= ty / p.stride && oy < p.oh; ++oy) {
            for (long long ox = ox0; ox <= tx / p.stride && ox < p.ow; ++ox) {
                long long o = (plane * p.oh + oy) * p.ow + ox;
                long long at;
                if (has_idx) {
                    at = idx[o];
                } else {
                    float best;
                    at = gm_window_max(x, xdt, p, plane, oy, ox, &best);
                }
                if (at == pos) acc += (double)gm_ld(g, gdt, o);
            }
        }
        gm_st_d(out, odt, e, acc);
    }
}

// Output (i, j)'s window: rows floor(i h / oh) .. ceil((i + 1) h / oh), columns likewise.
__device__ __forceinline__ long long gm_lo(long long i, long long n, long long o) {
    return i * n / o;
}
__device__ __forceinline__ long long gm_hi(long long i, long long n, long long o) {
    return ((i + 1) * n + o - 1) / o;
}

extern "C" __global__ void adaptive_avg_pool2d(const void* x, int xdt, void* y, int ydt,
                                               GmPool p) {
    GM_EACH(e, p.planes * p.oh * p.ow) {
        long long j = e % p.ow, i = (e / p.ow) % p.oh, plane = e / (p.ow * p.oh);
        long long h0 = gm_lo(i, p.h, p.oh), h1 = gm_hi(i, p.h, p.oh);
        long long w0 = gm_lo(j, p.w, p.ow), w1 = gm_hi(j, p.w, p.ow);
        double s = 0.0;
        for (long long a = h0; a < h1; ++a)
            for (long long b = w0; b < w1; ++b)
                s += (double)gm_ld(x, xdt, plane * p.h * p.w + a * p.w + b);
        gm_st_d(y, ydt, e, s / (double)((h1 - h0) * (w1 - w0)));
    }
}

// The input's gradient: each output's gradient shared evenly over its window, gathered per
// input element over the windows holding it.
extern "C" __global__ void adaptive_avg_pool2d_backward(const void* g, int gdt, void* out,
                                                        int odt, GmPool p) {
    GM_EACH(e, p.planes * p.h * p.w) {
        long long ix = e % p.w, iy = (e / p.w) % p.h, plane = e / (p.w * p.h);
        double acc = 0.0;
        for (long long i = 0; i < p.oh; ++i) {
            long long h0 = gm_lo(i, p.h, p.oh), h1 = gm_hi(i, p.h, p.oh);
            if (iy < h0 || iy >= h1) continue;
            for (long long j = 0; j < p.ow; ++j) {
                long long w0 = gm_lo(j, p.w, p.ow), w1 = gm_hi(j, p.w, p.ow);
                if (ix < w0 || ix >= w1) continue;
                acc += (double)gm_ld(g, gdt, (plane * p.oh + i) * p.ow + j) /
                       (double)((h1 - h0) * (w1 - w0));
            }
        }
        gm_st_d(out, odt, e, acc);
    }
}

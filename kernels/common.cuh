// What every kernel source shares, put before each of them when NVRTC compiles it
// (src/backend/cuda/kernels.rs): views of any dtype, loaded as float and stored rounded.
//
// A buffer is its storage's address plus a `Strided` view: shape, strides and offset in
// elements (up to 8 dimensions; a broadcast dimension has stride 0), whether it is contiguous
// (then element i is at offset + i) and its dtype's code (`dtype_code` in
// src/backend/cuda/launch/mod.rs). Values are computed in float32, as PyTorch's CUDA kernels
// compute bf16 and float16 ("opmath"), and rounded to the buffer's dtype on store (to
// nearest, ties to even).

#define GM_MAXD 8
#define GM_F32 0
#define GM_BF16 1
#define GM_F16 2
#define GM_BOOL 3
#define GM_I64 4
#define GM_I32 5

struct Strided {
    long long shape[GM_MAXD];
    long long stride[GM_MAXD];
    long long offset;
    int ndim;
    int dtype;
    int contiguous;
    int pad_;
};

// The element offset of row-major index `i` of the view `s`.
__device__ __forceinline__ long long gm_at(const Strided& s, long long i) {
    if (s.contiguous) return s.offset + i;
    long long off = s.offset;
    for (int d = s.ndim - 1; d >= 0; --d) {
        long long k = i % s.shape[d];
        i /= s.shape[d];
        off += k * s.stride[d];
    }
    return off;
}

__device__ __forceinline__ float gm_bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

__device__ __forceinline__ unsigned short gm_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float gm_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short gm_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Element `off` (in elements) of a buffer of dtype `dt`, as float.
__device__ __forceinline__ float gm_ld(const void* p, int dt, long long off) {
    switch (dt) {
        case GM_F32: return ((const float*)p)[off];
        case GM_BF16: return gm_bf16_to_f32(((const unsigned short*)p)[off]);
        case GM_F16: return gm_f16_to_f32(((const unsigned short*)p)[off]);
        case GM_BOOL: return ((const unsigned char*)p)[off] ? 1.0f : 0.0f;
        case GM_I64: return (float)((const long long*)p)[off];
        default: return (float)((const int*)p)[off];
    }
}

__device__ __forceinline__ void gm_st(void* p, int dt, long long off, float v) {
    switch (dt) {
        case GM_F32: ((float*)p)[off] = v; break;
        case GM_BF16: ((unsigned short*)p)[off] = gm_f32_to_bf16(v); break;
        case GM_F16: ((unsigned short*)p)[off] = gm_f32_to_f16(v); break;
        case GM_BOOL: ((unsigned char*)p)[off] = v != 0.0f; break;
        case GM_I64: ((long long*)p)[off] = (long long)v; break;
        default: ((int*)p)[off] = (int)v; break;
    }
}

// Element `off` as double, exact for every dtype here (integers up to 2^53, as the CPU twin's
// float64 holds them).
__device__ __forceinline__ double gm_ld_d(const void* p, int dt, long long off) {
    switch (dt) {
        case GM_I64: return (double)((const long long*)p)[off];
        case GM_I32: return (double)((const int*)p)[off];
        default: return (double)gm_ld(p, dt, off);
    }
}

// A double rounded once to the buffer's dtype, as the cpu device rounds its float64 results:
// to float32 directly, to bf16 and float16 through float32 rounded to odd (truncated, its last
// bit set when inexact), which leaves the final rounding to nearest exact; integers truncated
// toward zero, bools set where non-zero.
__device__ __forceinline__ void gm_st_d(void* p, int dt, long long off, double v) {
    if (dt == GM_I64) {
        ((long long*)p)[off] = (long long)v;
    } else if (dt == GM_I32) {
        ((int*)p)[off] = (int)v;
    } else if (dt == GM_BOOL) {
        ((unsigned char*)p)[off] = v != 0.0;
    } else if (dt == GM_BF16 || dt == GM_F16) {
        float f = __double2float_rz(v);
        if ((double)f != v && f == f) f = __uint_as_float(__float_as_uint(f) | 1u);
        gm_st(p, dt, off, f);
    } else {
        gm_st(p, dt, off, (float)v);
    }
}

// Row-major element i of a view.
__device__ __forceinline__ float gm_get(const void* p, const Strided& s, long long i) {
    return gm_ld(p, s.dtype, gm_at(s, i));
}

__device__ __forceinline__ double gm_get_d(const void* p, const Strided& s, long long i) {
    return gm_ld_d(p, s.dtype, gm_at(s, i));
}

__device__ __forceinline__ void gm_put(void* p, const Strided& s, long long i, float v) {
    gm_st(p, s.dtype, gm_at(s, i), v);
}

__device__ __forceinline__ void gm_put_d(void* p, const Strided& s, long long i, double v) {
    gm_st_d(p, s.dtype, gm_at(s, i), v);
}

// Draw m (0-based) of the cpu device's SplitMix64 stream seeded `seed`
// (src/backend/cpu/rng.rs): the state advances by a constant per draw, so any draw is computed
// directly.
__device__ __forceinline__ unsigned long long gm_draw(unsigned long long seed,
                                                      unsigned long long m) {
    unsigned long long z = (seed ^ 0x5851F42D4C957F2DULL) + (m + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double gm_uniform(unsigned long long seed, unsigned long long m) {
    return (double)(gm_draw(seed, m) >> 40) / 16777216.0;
}

#define GM_EACH(i, n)                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

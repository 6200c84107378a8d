// gpumem's elementwise kernels, float32, compiled at run time by NVRTC.
//
// Each kernel carries the name the engine's ops give it (`Op::kernel`, `Op::backward_kernel` in
// src/engine/op/mod.rs) and computes what its CPU twin in src/backend/cpu/elementwise.rs
// computes. `code` picks the function: the index of `Unary::ALL` for unary ops, of
// `Binary::ALL` (add, sub, mul, div) for binary ones. An input may be any strided view (up to
// 8 dimensions; a broadcast dimension has stride 0); outputs are contiguous.

#define GM_MAXD 8

struct Strided {
    long long shape[GM_MAXD];
    long long stride[GM_MAXD];
    long long offset;
    int ndim;
};

// The element offset of row-major index `i` of the view `s`.
__device__ __forceinline__ long long gm_at(const Strided& s, long long i) {
    long long off = s.offset;
    for (int d = s.ndim - 1; d >= 0; --d) {
        long long k = i % s.shape[d];
        i /= s.shape[d];
        off += k * s.stride[d];
    }
    return off;
}

__device__ __forceinline__ float gm_unary(int code, float x) {
    switch (code) {
        case 0: return -x;                                      // neg
        case 1: return sinf(x);                                 // sin
        case 2: return cosf(x);                                 // cos
        case 3: return expf(x);                                 // exp
        case 4: return fmaxf(x, 0.0f);                          // relu
        case 5: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); // gelu (erf)
        case 6: return x / (1.0f + expf(-x));                   // silu
        case 7: return 1.0f / (1.0f + expf(-x));                // sigmoid
        case 8: return tanhf(x);                                // tanh
        case 9: return rsqrtf(x);                               // rsqrt
        case 10: return sqrtf(x);                               // sqrt
        default: return __int_as_float(0x7fc00000);             // not pointwise: NaN
    }
}

// d/dx at input x with output y.
__device__ __forceinline__ float gm_unary_grad(int code, float x, float y) {
    switch (code) {
        case 0: return -1.0f;
        case 1: return cosf(x);
        case 2: return -sinf(x);
        case 3: return y;
        case 4: return y > 0.0f ? 1.0f : 0.0f;
        case 5: {
            float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
            float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
            return cdf + x * pdf;
        }
        case 6: {
            float s = 1.0f / (1.0f + expf(-x));
            return s * (1.0f + x * (1.0f - s));
        }
        case 7: return y * (1.0f - y);
        case 8: return 1.0f - y * y;
        case 9: return -0.5f * y * y * y;
        case 10: return 0.5f / y;
        default: return 0.0f;
    }
}

extern "C" __global__ void fill(float* out, long long n, float value) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}

extern "C" __global__ void unary(int code, const float* x, Strided xs, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = gm_unary(code, x[gm_at(xs, i)]);
    }
}

// The input's gradient: grad * f'(x), from the saved input x and output y (contiguous).
extern "C" __global__ void unary_backward(int code, const float* grad, const float* x,
                                          const float* y, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = grad[i] * gm_unary_grad(code, x[i], y[i]);
    }
}

// a op b over the output's shape: each input a view broadcast to it.
extern "C" __global__ void binary(int code, const float* a, Strided as, const float* b,
                                  Strided bs, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = a[gm_at(as, i)], y = b[gm_at(bs, i)];
        float r;
        switch (code) {
            case 0: r = x + y; break;
            case 1: r = x - y; break;
            case 2: r = x * y; break;
            default: r = x / y; break;
        }
        out[i] = r;
    }
}

// x op value (value op x when `reversed`), `code` as for `binary`.
extern "C" __global__ void scalar(int code, int reversed, float value, const float* x,
                                  Strided xs, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float a = x[gm_at(xs, i)], b = value;
        if (reversed) { float t = a; a = b; b = t; }
        float r;
        switch (code) {
            case 0: r = a + b; break;
            case 1: r = a - b; break;
            case 2: r = a * b; break;
            default: r = a / b; break;
        }
        out[i] = r;
    }
}

// A view copied into contiguous memory (clone, contiguous(), a copy between layouts).
extern "C" __global__ void copy(const float* x, Strided xs, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = x[gm_at(xs, i)];
    }
}

// `x.masked_fill(mask, value)`: value where the (bool, possibly broadcast) mask is set, else x.
// Its backward is the same kernel on the incoming gradient with value 0.
extern "C" __global__ void masked_fill(const float* x, Strided xs, const unsigned char* mask,
                                       Strided ms, float value, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = mask[gm_at(ms, i)] ? value : x[gm_at(xs, i)];
    }
}

// n elements of the view `xs` into the view `os`, in row-major index order.
__device__ __forceinline__ void gm_copy_views(const float* x, const Strided& xs, float* out,
                                              const Strided& os, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[gm_at(os, i)] = x[gm_at(xs, i)];
    }
}

// One part of `torch.cat`: the part (any view) written into its slice of the output, a view
// `os` of the output's storage (the output's strides, its offset where the part starts).
extern "C" __global__ void cat(const float* x, Strided xs, float* out, Strided os, long long n) {
    gm_copy_views(x, xs, out, os, n);
}

// Its backward, and `split`'s forward copy: the slice `xs` of the gradient into a part `os`.
extern "C" __global__ void split(const float* x, Strided xs, float* out, Strided os, long long n) {
    gm_copy_views(x, xs, out, os, n);
}

// A comparison (code: the index of `Cmp`'s variants: le, lt, ge, gt, eq, ne) of two views
// broadcast to the output (a number is a one-element view with stride 0): a bool result.
extern "C" __global__ void compare(int code, const float* a, Strided as, const float* b,
                                   Strided bs, unsigned char* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = a[gm_at(as, i)], y = b[gm_at(bs, i)];
        bool r;
        switch (code) {
            case 0: r = x <= y; break;
            case 1: r = x < y; break;
            case 2: r = x >= y; break;
            case 3: r = x > y; break;
            case 4: r = x == y; break;
            default: r = x != y; break;
        }
        out[i] = r;
    }
}

// `torch.where(c, a, b)` over views broadcast to the output.
extern "C" __global__ void where(const unsigned char* c, Strided cs, const float* a, Strided as,
                                 const float* b, Strided bs, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = c[gm_at(cs, i)] ? a[gm_at(as, i)] : b[gm_at(bs, i)];
    }
}

// Its gradient for `input` 1 (a: where c holds) or 2 (b: where it does not), in the output's
// shape (an operand that was broadcast then sums it back with `reduce`).
extern "C" __global__ void where_backward(int input, const unsigned char* c, Strided cs,
                                          const float* g, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        bool pick = c[gm_at(cs, i)] != 0;
        out[i] = pick == (input == 1) ? g[i] : 0.0f;
    }
}

// gpumem's elementwise kernels, compiled at run time by NVRTC after common.cuh.
//
// Each kernel carries the name the engine's ops give it (`Op::kernel`, `Op::backward_kernel` in
// src/backend/cuda/launch/elementwise.rs takes them) and computes what its CPU twin in
// src/backend/cpu/elementwise.rs computes. `code` picks the function: the index of `Unary::ALL`
// for unary ops, of `Binary::ALL` (add, sub, mul, div) for binary ones. Every buffer is a view
// of any dtype (common.cuh): inputs of any strides, broadcast to the output's shape; values
// computed in float32 and rounded to the output's dtype.

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

// A factory: `mode` 0 the constant `value`, 1 standard normals, 2 uniforms on [0, 1), 3
// `start + step * i`. Random element e is drawn as the cpu device draws it: from the stream
// seeded seed ^ (k << 32) for its block k of 65,536 elements, a normal from the Box-Muller pair
// of draws 2i and 2i + 1 within the block, a uniform from draw i; computed in double.
extern "C" __global__ void fill(int mode, double value, double start, double step,
                                unsigned long long seed, void* out, Strided os, long long n) {
    GM_EACH(e, n) {
        double v = value;
        unsigned long long k = (unsigned long long)e >> 16, i = (unsigned long long)e & 0xffffULL;
        unsigned long long sd = seed ^ (k << 32);
        if (mode == 1) {
            double u1 = 1.0 - gm_uniform(sd, 2 * i), u2 = gm_uniform(sd, 2 * i + 1);
            v = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        } else if (mode == 2) {
            v = gm_uniform(sd, i);
        } else if (mode == 3) {
            v = start + step * (double)e;
        }
        gm_put_d(out, os, e, v);
    }
}

// Code 11 is `x ** e` (Op::Pow), computed in double as the CPU twin computes it. Code 12 is
// `tril` (the lower triangle of the last two dimensions of the output's shape kept, the rest
// 0; also its gradient) and 13 `bitwise_not` (a bool's negation, an integer's -x - 1), both
// read and written exactly, in any dtype.
extern "C" __global__ void unary(int code, double e, const void* x, Strided xs, void* out,
                                 Strided os, long long n) {
    GM_EACH(i, n) {
        if (code == 12) {
            long long c = os.ndim >= 1 ? os.shape[os.ndim - 1] : 1;
            long long r = os.ndim >= 2 ? os.shape[os.ndim - 2] : 1;
            bool keep = os.ndim < 2 || i % c <= (i / c) % r;
            gm_put_d(out, os, i, keep ? gm_get_d(x, xs, i) : 0.0);
            continue;
        }
        if (code == 13) {
            double v = gm_get_d(x, xs, i);
            gm_put_d(out, os, i, xs.dtype == GM_BOOL ? (v == 0.0 ? 1.0 : 0.0) : -v - 1.0);
            continue;
        }
        float v = gm_get(x, xs, i);
        if (code == 11) gm_put_d(out, os, i, pow((double)v, e));
        else gm_put(out, os, i, gm_unary(code, v));
    }
}

// The input's gradient: grad * f'(x), from the saved input x or output y (views of the
// gradient's shape).
// Code 11 (`x ** e`): grad * e * x^(e - 1) in double, 0 where e is 0.
extern "C" __global__ void unary_backward(int code, double e, const void* grad, Strided gs,
                                          const void* x, Strided xs, void* out, Strided os,
                                          long long n) {
    GM_EACH(i, n) {
        float v = gm_get(x, xs, i), g = gm_get(grad, gs, i);
        if (code == 11) {
            double d = e == 0.0 ? 0.0 : (double)g * e * pow((double)v, e - 1.0);
            gm_put_d(out, os, i, d);
        } else {
            gm_put(out, os, i, g * gm_unary_grad(code, v, v));
        }
    }
}

// In double, as the cpu twin computes, then rounded once to the output's dtype (for float32
// operands the result is float32's own).
__device__ __forceinline__ double gm_binary(int code, double x, double y) {
    switch (code) {
        case 0: return x + y;
        case 1: return x - y;
        case 2: return x * y;
        default: return x / y;
    }
}

// a op b over the output's shape: each input a view broadcast to it.
extern "C" __global__ void binary(int code, const void* a, Strided as, const void* b, Strided bs,
                                  void* out, Strided os, long long n) {
    GM_EACH(i, n) gm_put_d(out, os, i, gm_binary(code, gm_get_d(a, as, i), gm_get_d(b, bs, i)));
}

// x op value (value op x when `reversed`), `code` as for `binary`.
// Integer views (int64 and int32) by a whole `value` (add, sub, mul): exact, as the CPU twin's
// float64 is below 2^53 (counters such as num_batches_tracked, position ids).
extern "C" __global__ void scalar(int code, int reversed, double value, const void* x, Strided xs,
                                  void* out, Strided os, long long n) {
    bool ints = (xs.dtype == GM_I64 || xs.dtype == GM_I32) &&
                (os.dtype == GM_I64 || os.dtype == GM_I32) && code < 3;
    if (ints) {
        long long v = (long long)value;
        GM_EACH(i, n) {
            long long at = gm_at(xs, i);
            long long a = xs.dtype == GM_I64 ? ((const long long*)x)[at] : ((const int*)x)[at];
            long long r = code == 0 ? a + v : code == 1 ? (reversed ? v - a : a - v) : a * v;
            long long to = gm_at(os, i);
            if (os.dtype == GM_I64)
                ((long long*)out)[to] = r;
            else
                ((int*)out)[to] = (int)r;
        }
        return;
    }
    GM_EACH(i, n) {
        double a = gm_get_d(x, xs, i);
        gm_put_d(out, os, i, reversed ? gm_binary(code, value, a) : gm_binary(code, a, value));
    }
}

// A view copied into another (clone, contiguous(), a cast, a copy between layouts; cat's part
// into its slice of the output and split's slice out of it).
// Between views of the same dtype it copies bit for bit (integer tensors and masks too); else
// through float32 (a cast: rounded to nearest, or truncated to an integer).
extern "C" __global__ void copy(const void* x, Strided xs, void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        if (xs.dtype != os.dtype) {
            gm_put(out, os, i, gm_get(x, xs, i));
            continue;
        }
        long long a = gm_at(xs, i), b = gm_at(os, i);
        switch (xs.dtype) {
            case GM_F32: case GM_I32: ((int*)out)[b] = ((const int*)x)[a]; break;
            case GM_BF16: case GM_F16:
                ((unsigned short*)out)[b] = ((const unsigned short*)x)[a]; break;
            case GM_BOOL: ((unsigned char*)out)[b] = ((const unsigned char*)x)[a]; break;
            default: ((long long*)out)[b] = ((const long long*)x)[a]; break;
        }
    }
}

// `x.masked_fill(mask, value)`: value where the (bool, possibly broadcast) mask is set, else x.
// Its backward is the same kernel on the incoming gradient with value 0.
extern "C" __global__ void masked_fill(const void* x, Strided xs, const void* mask, Strided ms,
                                       double value, void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        if (gm_get(mask, ms, i) != 0.0f) gm_put_d(out, os, i, value);
        else gm_put_d(out, os, i, gm_get_d(x, xs, i));
    }
}

// One part of `torch.cat`: the part (any view) written into its slice of the output, a view
// `os` of the output's storage (the output's strides, its offset where the part starts).
extern "C" __global__ void cat(const void* x, Strided xs, void* out, Strided os, long long n) {
    GM_EACH(i, n) gm_put(out, os, i, gm_get(x, xs, i));
}

// A comparison (code: the index of `Cmp`'s variants: le, lt, ge, gt, eq, ne) of two views
// broadcast to the output, or of one with a number (`has_scalar`: b is not read; compared in
// double, as the number was written): a bool result.
extern "C" __global__ void compare(int code, int has_scalar, double value, const void* a,
                                   Strided as, const void* b, Strided bs, void* out, Strided os,
                                   long long n) {
    GM_EACH(i, n) {
        double x = gm_get_d(a, as, i);
        double y = has_scalar ? value : gm_get_d(b, bs, i);
        bool r;
        switch (code) {
            case 0: r = x <= y; break;
            case 1: r = x < y; break;
            case 2: r = x >= y; break;
            case 3: r = x > y; break;
            case 4: r = x == y; break;
            default: r = x != y; break;
        }
        gm_put(out, os, i, r ? 1.0f : 0.0f);
    }
}

// `torch.where(c, a, b)` over views broadcast to the output.
extern "C" __global__ void where(const void* c, Strided cs, const void* a, Strided as,
                                 const void* b, Strided bs, void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        float v = gm_get(c, cs, i) != 0.0f ? gm_get(a, as, i) : gm_get(b, bs, i);
        gm_put(out, os, i, v);
    }
}

// Its gradient for `input` 1 (a: where c holds) or 2 (b: where it does not), in the output's
// shape (an operand that was broadcast then sums it back with `reduce`).
extern "C" __global__ void where_backward(int input, const void* c, Strided cs, const void* g,
                                          Strided gs, void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        bool pick = gm_get(c, cs, i) != 0.0f;
        gm_put(out, os, i, pick == (input == 1) ? gm_get(g, gs, i) : 0.0f);
    }
}

// A binary op's gradient for one input, summed over the dimensions that input was broadcast
// along: out[i] = sum over k of f(g, x, y) at element i * len + k of the views (each permuted
// by the caller: the input's kept dimensions first, the summed ones last; len 1 sums nothing).
// f by `code`: 0 g, 1 -g, 2 g * y, 3 g / y, 4 -g * x / y^2; computed in double.
extern "C" __global__ void binary_backward(int code, const void* g, Strided gs, const void* x,
                                           Strided xs, const void* y, Strided ys, void* out,
                                           Strided os, long long total, long long len) {
    GM_EACH(i, total) {
        double s = 0.0;
        for (long long k = 0; k < len; ++k) {
            long long e = i * len + k;
            double gv = gm_get(g, gs, e);
            switch (code) {
                case 0: s += gv; break;
                case 1: s -= gv; break;
                case 2: s += gv * (double)gm_get(y, ys, e); break;
                case 3: s += gv / (double)gm_get(y, ys, e); break;
                default: {
                    double yv = gm_get(y, ys, e);
                    s -= gv * (double)gm_get(x, xs, e) / (yv * yv);
                }
            }
        }
        gm_put_d(out, os, i, s);
    }
}

// ---- integer and bool ops (masks, ids and positions in generation), exact as the CPU twin ----

// a & b (or a | b) of integer or bool views broadcast to the output.
extern "C" __global__ void bitwise(int or_, const void* a, Strided as, const void* b, Strided bs,
                                   void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        long long x = (long long)gm_get_d(a, as, i), y = (long long)gm_get_d(b, bs, i);
        gm_put_d(out, os, i, (double)(or_ ? (x | y) : (x & y)));
    }
}

// Running sums along one dimension of `len` elements: the input's view and the output's, each
// line `outer, inner` (a thread per line) summed in double in order.
extern "C" __global__ void cumsum(const void* x, Strided xs, void* out, Strided os,
                                  long long lines, long long len, long long inner) {
    GM_EACH(line, lines) {
        long long outer = line / inner, k = line % inner;
        double acc = 0.0;
        for (long long i = 0; i < len; ++i) {
            long long at = (outer * len + i) * inner + k;
            acc += gm_get_d(x, xs, at);
            gm_put_d(out, os, at, acc);
        }
    }
}

// Whether each element equals one of the `m` test elements (both views, any dtype).
extern "C" __global__ void isin(const void* x, Strided xs, const void* t, Strided ts,
                                long long m, void* out, Strided os, long long n) {
    GM_EACH(i, n) {
        double v = gm_get_d(x, xs, i);
        bool hit = false;
        for (long long j = 0; j < m && !hit; ++j) hit = gm_get_d(t, ts, j) == v;
        gm_put_d(out, os, i, hit ? 1.0 : 0.0);
    }
}

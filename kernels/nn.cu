// gpumem's embedding, loss and dropout kernels: int64 indices, compiled at run time by NVRTC
// after common.cuh.
//
// Each carries the name the engine's ops give it (`Op::kernel`, `Op::backward_kernel` in
// src/engine/op/mod.rs) and computes what its CPU twin in src/backend/cpu/nn.rs computes.
// Inputs are contiguous (the engine copies a strided index tensor before the lookup).

// `F.embedding`: row idx[r] of the [V, dim] table for each of the n indices (any floating
// dtype, the output's the table's).
extern "C" __global__ void embedding(const long long* idx, long long n, const void* table,
                                     int tdt, long long dim, void* out, int odt) {
    GM_EACH(i, n * dim) {
        long long r = i / dim, c = i % dim;
        gm_st(out, odt, i, gm_ld(table, tdt, idx[r] * dim + c));
    }
}

// The table's gradient, deterministic: a block per index position p; the block of the first
// position that uses its row sums, column by column, the gradient of every use of that row in
// position order, in double, and stores the row once, rounded to the table's dtype (as the cpu
// twin sums and rounds). Rows no index uses are zeroed by the caller. Blocks of 256 threads.
extern "C" __global__ void embedding_backward(const long long* idx, long long n,
                                              const void* grad, int gdt, long long dim,
                                              void* out, int odt) {
    __shared__ int earlier;
    __shared__ int warp_count[8];
    __shared__ long long uses[256];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long p = blockIdx.x; p < n; p += gridDim.x) {
        const long long r = idx[p];
        if (threadIdx.x == 0) earlier = 0;
        __syncthreads();
        for (long long q = threadIdx.x; q < p; q += blockDim.x) {
            if (idx[q] == r) earlier = 1;
        }
        __syncthreads();
        const int skip = earlier;
        __syncthreads();  // (read by all before the next position resets it)
        if (skip) continue;
        for (long long c0 = 0; c0 < dim; c0 += blockDim.x) {
            const long long c = c0 + threadIdx.x;
            double acc = 0.0;
            for (long long q0 = p; q0 < n; q0 += blockDim.x) {
                const long long q = q0 + threadIdx.x;
                const bool use = q < n && idx[q] == r;
                // the uses of this chunk, compacted in position order
                const unsigned ballot = __ballot_sync(0xffffffffu, use);
                if (lane == 0) warp_count[warp] = __popc(ballot);
                __syncthreads();
                int before = 0, total = 0;
                for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
                    if (w < warp) before += warp_count[w];
                    total += warp_count[w];
                }
                if (use) uses[before + __popc(ballot & ((1u << lane) - 1u))] = q;
                __syncthreads();
                if (c < dim) {
                    for (int k = 0; k < total; ++k) acc += (double)gm_ld(grad, gdt, uses[k] * dim + c);
                }
                __syncthreads();
            }
            if (c < dim) gm_st_d(out, odt, r * dim + c, acc);
        }
    }
}

#define GM_IGNORE (-100LL)

// `F.nll_loss(logp [rows, cols], target [rows])`, mean over the targets that are not
// ignore_index (-100): the loss into out[0], the count (PyTorch's total_weight) into
// weight[0]. One block; its threads sum rows in strides, then pairwise.
extern "C" __global__ void nll_loss(const float* logp, const long long* target, long long rows,
                                    long long cols, float* out, float* weight) {
    __shared__ float sum[256];
    __shared__ float cnt[256];
    float s = 0.0f, k = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        long long t = target[r];
        if (t != GM_IGNORE) {
            s -= logp[r * cols + t];
            k += 1.0f;
        }
    }
    sum[threadIdx.x] = s;
    cnt[threadIdx.x] = k;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            sum[threadIdx.x] += sum[threadIdx.x + h];
            cnt[threadIdx.x] += cnt[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = sum[0] / cnt[0];
        weight[0] = cnt[0];
    }
}

// The log-probabilities' gradient: -grad / total_weight at each row's target, 0 elsewhere.
extern "C" __global__ void nll_loss_backward(const float* grad, const long long* target,
                                             const float* weight, long long rows,
                                             long long cols, float* out) {
    long long total = rows * cols;
    float g = -grad[0] / weight[0];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols, c = i % cols;
        out[i] = target[r] == c ? g : 0.0f;
    }
}

// `F.dropout(x, p)` in training, x and the output contiguous of any float dtype: element i is
// kept when its uniform draw (the top 24 bits of draw i, over 2^24) is at least p, i.e. when
// those bits are at least `keep_from` = ceil(p * 2^24); kept elements are scaled by
// 1 / (1 - p) in double, as the cpu twin scales them. The bool mask is kept for backward.
extern "C" __global__ void dropout(const void* x, int xdt, void* out, int odt,
                                   unsigned char* mask, long long n, unsigned long long seed,
                                   unsigned long long keep_from, double scale) {
    GM_EACH(i, n) {
        unsigned char k = (gm_draw(seed, (unsigned long long)i) >> 40) >= keep_from;
        mask[i] = k;
        gm_st_d(out, odt, i, k ? (double)gm_ld(x, xdt, i) * scale : 0.0);
    }
}

// Its gradient: the incoming gradient where kept, scaled, 0 elsewhere.
extern "C" __global__ void dropout_backward(const void* grad, int gdt, const unsigned char* mask,
                                            void* out, int odt, long long n, double scale) {
    GM_EACH(i, n) {
        gm_st_d(out, odt, i, mask[i] ? (double)gm_ld(grad, gdt, i) * scale : 0.0);
    }
}

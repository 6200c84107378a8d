// gpumem's optimizer steps, compiled at run time by NVRTC: one launch per parameter,
// the arithmetic of PyTorch's single-tensor and foreach implementations (foreach batches the
// launches, not the math), as src/backend/cpu/optim.rs computes it.

// Adam (adamw = 0: weight decay added to the gradient) and AdamW (adamw = 1: the parameter
// decayed first), step t given as its bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t.
// `p`, `m` (exp_avg) and `v` (exp_avg_sq) are updated in place; each buffer is contiguous
// of its own dtype (float32, or bf16/float16 for a model in bf16 with its states), computed
// in double and rounded once on store, as the cpu device computes and rounds them.
extern "C" __global__ void adam_step(void* p, int pdt, const void* g, int gdt, void* m, int mdt,
                                     void* v, int vdt, long long n, double lr, double b1,
                                     double b2, double eps, double wd, double bc1, double bc2,
                                     int adamw) {
    GM_EACH(i, n) {
        double pi = gm_ld_d(p, pdt, i), gi = gm_ld_d(g, gdt, i);
        if (adamw) {
            pi *= 1.0 - lr * wd;
        } else if (wd != 0.0) {
            gi += wd * pi;
        }
        double mi = b1 * gm_ld_d(m, mdt, i) + (1.0 - b1) * gi;
        double vi = b2 * gm_ld_d(v, vdt, i) + (1.0 - b2) * gi * gi;
        double denom = sqrt(vi) / sqrt(bc2) + eps;
        gm_st_d(p, pdt, i, pi - lr / bc1 * mi / denom);
        gm_st_d(m, mdt, i, mi);
        gm_st_d(v, vdt, i, vi);
    }
}

// SGD (momentum = 0) and SGD with momentum: buf = g at the first step, then
// buf = momentum * buf + g; p -= lr * buf. Weight decay adds wd * p to g first.
extern "C" __global__ void sgd_step(float* p, const float* g, float* buf, long long n, float lr,
                                    float momentum, float wd, int first) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (wd != 0.0f) {
            gi += wd * p[i];
        }
        if (momentum != 0.0f) {
            gi = first ? gi : momentum * buf[i] + gi;
            buf[i] = gi;
        }
        p[i] -= lr * gi;
    }
}

// gpumem's optimizer steps, float32, compiled at run time by NVRTC: one launch per parameter,
// the arithmetic of PyTorch's single-tensor and foreach implementations (foreach batches the
// launches, not the math), as src/backend/cpu/optim.rs computes it.

// Adam (adamw = 0: weight decay added to the gradient) and AdamW (adamw = 1: the parameter
// decayed first), step t given as its bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t.
// `p`, `m` (exp_avg) and `v` (exp_avg_sq) are updated in place.
extern "C" __global__ void adam_step(float* p, const float* g, float* m, float* v, long long n,
                                     float lr, float b1, float b2, float eps, float wd,
                                     float bc1, float bc2, int adamw) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float pi = p[i], gi = g[i];
        if (adamw) {
            pi *= 1.0f - lr * wd;
        } else if (wd != 0.0f) {
            gi += wd * pi;
        }
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        float denom = sqrtf(vi) / sqrtf(bc2) + eps;
        p[i] = pi - lr / bc1 * mi / denom;
        m[i] = mi;
        v[i] = vi;
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

// Global gradient norm and AdamW, both on the device so that a step needs no
// host round trip: adamw reads the norm that sumsq_final left in memory.

extern "C" __global__ void sumsq_partial(float* partial, const float* g, long long n) {
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float v = g[i];
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// norm[0] = sqrt(sum(partial)).
extern "C" __global__ void sumsq_final(float* norm, const float* partial, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) norm[0] = sqrtf(s);
}

// torch.optim.AdamW after clip_grad_norm_: the gradient is scaled by
// min(1, clip / (norm + 1e-6)); decay (1 - lr*wd, or 1 for vectors) multiplies
// p first; step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t).
extern "C" __global__ void adamw(float* p, float* m, float* v, float* g, const float* norm, long long n,
                                 float b1, float b2, float eps, float decay, float clip, float step_size, float bc2_sqrt) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float nrm = norm[0];
    if (!(fabsf(nrm) <= 3.4e38f)) return; // NaN or Inf: the step is skipped; Metrics reports the norm
    float c = 1.0f;
    if (clip > 0.0f) c = fminf(1.0f, clip / (nrm + 1e-6f));
    float gi = g[i];
    if (c != 1.0f) {
        gi *= c;
        g[i] = gi; // as the CPU engine does: Grads after Step reads the clipped gradient
    }
    float mi = m[i] + (1.0f - b1) * (gi - m[i]);
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * decay;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * (mi / denom);
}

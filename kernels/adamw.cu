// Global gradient norm and AdamW, both on the device so that a step needs no
// host round trip: adamw_flat reads the norm that sumsq_final left in memory.

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

// torch.optim.AdamW after clip_grad_norm_, over the whole flat parameter
// buffer in one launch: the gradient is scaled by min(1, clip / (norm +
// 1e-6)); decay (1 - lr*wd) multiplies p first, except in the element ranges
// [nodecay[2k], nodecay[2k+1]) (sorted: the vectors, which take none);
// step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t). With wbf set it
// also writes the bf16 copy the GEMMs read, so no conversion pass follows.
// hp holds b1, b2, eps, decay, clip, step_size, bc2_sqrt in device memory,
// written before each step, so that a graph replaying this launch reads the
// step's learning rate and bias corrections.
extern "C" __global__ void adamw_flat(float* p, float* m, float* v, float* g, bf16* wbf, const float* norm, long long n,
                                      const long long* nodecay, int nranges, const float* hp) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float b1 = hp[0], b2 = hp[1], eps = hp[2], decay = hp[3], clip = hp[4], step_size = hp[5], bc2_sqrt = hp[6];
    float nrm = norm[0];
    if (!(fabsf(nrm) <= 3.4e38f)) return; // NaN or Inf: the step is skipped; Metrics reports the norm
    // The last range starting at or before i, by bisection (33 ranges at
    // base's 16 layers: a scan cost more than the update).
    float dec = decay;
    int lo = 0, hi = nranges;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (nodecay[2 * mid] <= i) lo = mid + 1;
        else hi = mid;
    }
    if (lo > 0 && i < nodecay[2 * (lo - 1) + 1]) dec = 1.0f;
    float c = 1.0f;
    if (clip > 0.0f) c = fminf(1.0f, clip / (nrm + 1e-6f));
    float gi = g[i];
    if (c != 1.0f) {
        gi *= c;
        g[i] = gi;
    }
    float mi = m[i] + (1.0f - b1) * (gi - m[i]);
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * dec;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi = pi - step_size * (mi / denom);
    p[i] = pi;
    if (wbf) wbf[i] = f2bf(pi);
}

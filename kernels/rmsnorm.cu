// RMSNorm as transformers computes it in fp32: y = x / sqrt(mean(x^2) + eps) * w.
// One block per row of x (N, d); rstd (N) is kept for the backward pass.
// out (fp32) and outb (bf16) may each be null: in bf16 precision the output
// only feeds GEMMs, so it is written once in bf16 and never converted.

extern "C" __global__ void rmsnorm_fwd(float* out, bf16* outb, float* rstd, const float* x, const float* w, int N, int d, float eps) {
    size_t row = (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) { float v = x[row + j]; ss += v * v; }
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (threadIdx.x == 0 && rstd) rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float y = x[row + j] * r * w[j];
        if (out) out[row + j] = y;
        if (outb) outb[row + j] = f2bf(y);
    }
}

// dx += r * (dy*w) - r^3 * x * mean(dy*w*x): adds into dx, which already
// holds the residual stream's gradient. dxb, when set, gets a bf16 copy of
// the sum: the next weight-gradient and input-gradient GEMMs read it.
extern "C" __global__ void rmsnorm_bwd_dx(float* dx, bf16* dxb, const float* dy, const float* x, const float* w, const float* rstd, int N, int d) {
    size_t row = (size_t)blockIdx.x * d;
    float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) dot += dy[row + j] * w[j] * x[row + j];
    dot = block_sum(dot) / (float)d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = dx[row + j] + (r * dy[row + j] * w[j] - r * r * r * x[row + j] * dot);
        dx[row + j] = v;
        if (dxb) dxb[row + j] = f2bf(v);
    }
}

// dw[j] += sum over rows of dy * x * r. Rows are split over gridDim.y so
// that each column gets one atomic per block, not one per row.
extern "C" __global__ void rmsnorm_bwd_dw(float* dw, const float* dy, const float* x, const float* rstd, int N, int d) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float acc = 0.0f;
    for (int r = blockIdx.y; r < N; r += gridDim.y) {
        size_t i = (size_t)r * d + j;
        acc += dy[i] * x[i] * rstd[r];
    }
    atomicAdd(&dw[j], acc);
}

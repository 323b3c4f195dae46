// SwiGLU: h = silu(g) * u, elementwise over (N, F).

extern "C" __global__ void swiglu_fwd(float* h, const float* g, const float* u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i];
    h[i] = x / (1.0f + expf(-x)) * u[i];
}

extern "C" __global__ void swiglu_bwd(float* dg, float* du, const float* dh, const float* g, const float* u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i], s = 1.0f / (1.0f + expf(-x));
    du[i] = dh[i] * x * s;
    dg[i] = dh[i] * u[i] * s * (1.0f + x * (1.0f - s));
}

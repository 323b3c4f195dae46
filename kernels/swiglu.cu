// SwiGLU: h = silu(g) * u, elementwise over (N, F). h, dg and du only feed
// GEMMs, so each is written in fp32 (h, dg, du) or bf16 (hb, dgb, dub),
// whichever pointer is set: bf16 precision needs no conversion pass.

extern "C" __global__ void swiglu_fwd(float* h, bf16* hb, const float* g, const float* u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i];
    float y = x / (1.0f + expf(-x)) * u[i];
    if (h) h[i] = y;
    if (hb) hb[i] = f2bf(y);
}

extern "C" __global__ void swiglu_bwd(float* dg, float* du, bf16* dgb, bf16* dub, const float* dh, const float* g, const float* u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i], s = 1.0f / (1.0f + expf(-x));
    float vu = dh[i] * x * s, vg = dh[i] * u[i] * s * (1.0f + x * (1.0f - s));
    if (du) du[i] = vu;
    if (dg) dg[i] = vg;
    if (dub) dub[i] = f2bf(vu);
    if (dgb) dgb[i] = f2bf(vg);
}

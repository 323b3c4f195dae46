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

// The bf16 forms read g, u and dh as the GEMMs wrote them, in bf16, as
// PyTorch's autocast keeps them: half the bytes of the fp32 forms. Each
// thread takes the pair 2i, 2i+1 (4-byte loads); an odd n leaves one value
// to the last thread.
__device__ __forceinline__ float silu_mul(float x, float y) { return x / (1.0f + expf(-x)) * y; }

__device__ __forceinline__ void swiglu_grad(float dh, float x, float y, float* vg, float* vu) {
    float s = 1.0f / (1.0f + expf(-x));
    *vu = dh * x * s;
    *vg = dh * y * s * (1.0f + x * (1.0f - s));
}

extern "C" __global__ void swiglu_fwd_bf16(bf16* hb, const bf16* g, const bf16* u, long long n) {
    long long i = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 1 < n) {
        unsigned gp = *(const unsigned*)(g + i), up = *(const unsigned*)(u + i);
        float h0 = silu_mul(bf2f((bf16)(gp & 0xffffu)), bf2f((bf16)(up & 0xffffu)));
        float h1 = silu_mul(bf2f((bf16)(gp >> 16)), bf2f((bf16)(up >> 16)));
        *(unsigned*)(hb + i) = (unsigned)f2bf(h0) | ((unsigned)f2bf(h1) << 16);
    } else if (i < n) {
        hb[i] = f2bf(silu_mul(bf2f(g[i]), bf2f(u[i])));
    }
}

extern "C" __global__ void swiglu_bwd_bf16(bf16* dgb, bf16* dub, const bf16* dh, const bf16* g, const bf16* u, long long n) {
    long long i = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    float vg0, vu0, vg1, vu1;
    if (i + 1 < n) {
        unsigned dp = *(const unsigned*)(dh + i), gp = *(const unsigned*)(g + i), up = *(const unsigned*)(u + i);
        swiglu_grad(bf2f((bf16)(dp & 0xffffu)), bf2f((bf16)(gp & 0xffffu)), bf2f((bf16)(up & 0xffffu)), &vg0, &vu0);
        swiglu_grad(bf2f((bf16)(dp >> 16)), bf2f((bf16)(gp >> 16)), bf2f((bf16)(up >> 16)), &vg1, &vu1);
        *(unsigned*)(dgb + i) = (unsigned)f2bf(vg0) | ((unsigned)f2bf(vg1) << 16);
        *(unsigned*)(dub + i) = (unsigned)f2bf(vu0) | ((unsigned)f2bf(vu1) << 16);
    } else if (i < n) {
        swiglu_grad(bf2f(dh[i]), bf2f(g[i]), bf2f(u[i]), &vg0, &vu0);
        dgb[i] = f2bf(vg0);
        dub[i] = f2bf(vu0);
    }
}

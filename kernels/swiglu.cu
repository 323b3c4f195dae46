// SwiGLU: h = silu(g) * u, elementwise over (N, F). These first two forms
// serve fp32 precision (g, u and dh in fp32, separate gate and up GEMMs);
// bf16 precision runs the fused gate-and-up forms further down. h, dg and du
// only feed GEMMs, so each is written in fp32 (h, dg, du) or bf16 (hb, dgb,
// dub), whichever pointer is set.

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
// PyTorch's autocast keeps them: half the bytes of the fp32 forms.
__device__ __forceinline__ float silu_mul(float x, float y) { return x / (1.0f + expf(-x)) * y; }

__device__ __forceinline__ void swiglu_grad(float dh, float x, float y, float* vg, float* vu) {
    float s = 1.0f / (1.0f + expf(-x));
    *vu = dh * x * s;
    *vg = dh * y * s * (1.0f + x * (1.0f - s));
}

// The same in base-2 exponentials and an approximate reciprocal, one
// instruction each, for the 16-byte forms below: their results are rounded
// to bf16, far coarser than either's error. silu(x) is 0 where 2^-x log2(e)
// overflows (x below about -88), as it should be.
__device__ __forceinline__ float sigmoid_a(float x) { return rcpa(1.0f + ex2(-x * LOG2E)); }

__device__ __forceinline__ void swiglu_grad_a(float dh, float x, float y, float* vg, float* vu) {
    float s = sigmoid_a(x);
    *vu = dh * x * s;
    *vg = dh * y * s * (1.0f + x * (1.0f - s));
}

// oct_at places this thread's 8 columns when F is a multiple of 8 and the
// (row, column octet) pairs fit 31 bits (32-bit division: a 64-bit one
// costs more than the arithmetic it serves); false past the end.
__device__ __forceinline__ bool oct_at(int N, int F, int* row, int* j) {
    unsigned O = (unsigned)F >> 3, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned)N * O) return false;
    *row = (int)(i / O);
    *j = (int)(i - (unsigned)*row * O) * 8;
    return true;
}

__device__ __forceinline__ bool octets(int N, int F) { return (F & 7) == 0 && (long long)N * (F >> 3) < (1LL << 31); }

// The fused gate-and-up forms: gu is (N, 2F), each row the gate's F values
// then the up projection's, as one GEMM over the stacked weights writes it;
// h and dh are (N, F); dgu is laid out as gu, so one GEMM takes both weight
// gradients and one the input gradient. With F a multiple of 8 (every
// preset) a thread takes 8 columns through 16-byte loads (oct_at); with F
// a multiple of 4, 4 columns through 8-byte loads, threads numbered
// flat over (row, column quad) so that every block is full: grid
// ceil(N F / 4 / 256), 256 threads. Otherwise grid (N, ceil(F / 512)): a
// row per blockIdx.x (gridDim.y could not hold 65,536 rows), a pair of
// columns per thread (4-byte loads when F is even).

// quad_at places this thread's 4 columns, flat over (row, column quad) of
// N rows of F values: the row and its first column; false past the end.
__device__ __forceinline__ bool quad_at(int N, int F, long long* row, int* j) {
    int Q = F >> 2;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * Q) return false;
    *row = i / Q;
    *j = (int)(i - *row * Q) * 4;
    return true;
}

extern "C" __global__ void swiglu_fwd_gu(bf16* hb, const bf16* gu, int N, int F) {
    if (octets(N, F)) {
        int row, j;
        if (!oct_at(N, F, &row, &j)) return;
        const bf16* g = gu + (size_t)row * 2 * F;
        float x[8], y[8];
        bf8(*(const uint4*)(g + j), x);
        bf8(*(const uint4*)(g + F + j), y);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = x[k] * sigmoid_a(x[k]) * y[k];
        *(uint4*)(hb + (size_t)row * F + j) = f2bf8(x);
        return;
    }
    if ((F & 3) == 0) {
        long long row;
        int j;
        if (!quad_at(N, F, &row, &j)) return;
        const bf16* g = gu + row * 2 * F;
        uint2 gp = *(const uint2*)(g + j), up = *(const uint2*)(g + F + j);
        *(uint2*)(hb + row * F + j) = make_uint2(f2bf2(silu_mul(bf_lo(gp.x), bf_lo(up.x)), silu_mul(bf_hi(gp.x), bf_hi(up.x))),
                                                 f2bf2(silu_mul(bf_lo(gp.y), bf_lo(up.y)), silu_mul(bf_hi(gp.y), bf_hi(up.y))));
        return;
    }
    size_t row = blockIdx.x;
    int j = 2 * (blockIdx.y * blockDim.x + threadIdx.x);
    const bf16* g = gu + row * 2 * F;
    const bf16* u = g + F;
    bf16* h = hb + row * F;
    if ((F & 1) == 0 && j + 1 < F) {
        unsigned gp = *(const unsigned*)(g + j), up = *(const unsigned*)(u + j);
        *(unsigned*)(h + j) = f2bf2(silu_mul(bf_lo(gp), bf_lo(up)), silu_mul(bf_hi(gp), bf_hi(up)));
        return;
    }
    for (int c = j; c < j + 2 && c < F; c++) h[c] = f2bf(silu_mul(bf2f(g[c]), bf2f(u[c])));
}

extern "C" __global__ void swiglu_bwd_gu(bf16* dgu, const bf16* dhb, const bf16* gu, int N, int F) {
    if (octets(N, F)) {
        int row, j;
        if (!oct_at(N, F, &row, &j)) return;
        const bf16* g = gu + (size_t)row * 2 * F;
        bf16* dg = dgu + (size_t)row * 2 * F;
        float d[8], x[8], y[8], wg[8], wu[8];
        bf8(*(const uint4*)(dhb + (size_t)row * F + j), d);
        bf8(*(const uint4*)(g + j), x);
        bf8(*(const uint4*)(g + F + j), y);
#pragma unroll
        for (int k = 0; k < 8; k++) swiglu_grad_a(d[k], x[k], y[k], &wg[k], &wu[k]);
        *(uint4*)(dg + j) = f2bf8(wg);
        *(uint4*)(dg + F + j) = f2bf8(wu);
        return;
    }
    float vg[4], vu[4];
    if ((F & 3) == 0) {
        long long row;
        int j;
        if (!quad_at(N, F, &row, &j)) return;
        const bf16* g = gu + row * 2 * F;
        bf16* dg = dgu + row * 2 * F;
        uint2 dp = *(const uint2*)(dhb + row * F + j), gp = *(const uint2*)(g + j), up = *(const uint2*)(g + F + j);
        swiglu_grad(bf_lo(dp.x), bf_lo(gp.x), bf_lo(up.x), &vg[0], &vu[0]);
        swiglu_grad(bf_hi(dp.x), bf_hi(gp.x), bf_hi(up.x), &vg[1], &vu[1]);
        swiglu_grad(bf_lo(dp.y), bf_lo(gp.y), bf_lo(up.y), &vg[2], &vu[2]);
        swiglu_grad(bf_hi(dp.y), bf_hi(gp.y), bf_hi(up.y), &vg[3], &vu[3]);
        *(uint2*)(dg + j) = make_uint2(f2bf2(vg[0], vg[1]), f2bf2(vg[2], vg[3]));
        *(uint2*)(dg + F + j) = make_uint2(f2bf2(vu[0], vu[1]), f2bf2(vu[2], vu[3]));
        return;
    }
    size_t row = blockIdx.x;
    int j = 2 * (blockIdx.y * blockDim.x + threadIdx.x);
    const bf16* g = gu + row * 2 * F;
    const bf16* u = g + F;
    const bf16* dh = dhb + row * F;
    bf16* dg = dgu + row * 2 * F;
    bf16* du = dg + F;
    if ((F & 1) == 0 && j + 1 < F) {
        unsigned dp = *(const unsigned*)(dh + j), gp = *(const unsigned*)(g + j), up = *(const unsigned*)(u + j);
        swiglu_grad(bf_lo(dp), bf_lo(gp), bf_lo(up), &vg[0], &vu[0]);
        swiglu_grad(bf_hi(dp), bf_hi(gp), bf_hi(up), &vg[1], &vu[1]);
        *(unsigned*)(dg + j) = f2bf2(vg[0], vg[1]);
        *(unsigned*)(du + j) = f2bf2(vu[0], vu[1]);
        return;
    }
    for (int c = j; c < j + 2 && c < F; c++) {
        swiglu_grad(bf2f(dh[c]), bf2f(g[c]), bf2f(u[c]), &vg[0], &vu[0]);
        dg[c] = f2bf(vg[0]);
        du[c] = f2bf(vu[0]);
    }
}

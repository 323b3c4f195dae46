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
//
// Each thread updates four consecutive elements with 16-byte loads and
// stores (the flat buffers are 256-byte aligned; the last thread takes
// what is left of n one at a time), finding its decay range once: the
// update is memory-bound, and one element a thread spent as long on its
// instructions and the range's bisection as on its bytes. Grid
// ceil(n / 1024), 256 threads.
__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float& g, float dec, float c, float b1, float b2, float eps,
                                          float step_size, float bc2_sqrt) {
    float gi = g;
    if (c != 1.0f) {
        gi *= c;
        g = gi;
    }
    float mi = m + (1.0f - b1) * (gi - m);
    float vi = b2 * v + (1.0f - b2) * gi * gi;
    m = mi;
    v = vi;
    float pi = p * dec;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p = pi - step_size * (mi / denom);
}

extern "C" __global__ void adamw_flat(float* p, float* m, float* v, float* g, bf16* wbf, const float* norm, long long n,
                                      const long long* nodecay, int nranges, const float* hp) {
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    float b1 = hp[0], b2 = hp[1], eps = hp[2], decay = hp[3], clip = hp[4], step_size = hp[5], bc2_sqrt = hp[6];
    float nrm = norm[0];
    if (!(fabsf(nrm) <= 3.4e38f)) return; // NaN or Inf: the step is skipped; Metrics reports the norm
    float c = 1.0f;
    if (clip > 0.0f) c = fminf(1.0f, clip / (nrm + 1e-6f));
    // lo: the ranges starting at or before i0, by bisection (33 ranges at
    // base's 16 layers: a scan cost more than the update); the loop below
    // steps it on for the next three elements.
    int lo = 0, hi = nranges;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (nodecay[2 * mid] <= i0) lo = mid + 1;
        else hi = mid;
    }
    float dec[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        long long i = i0 + e;
        while (lo < nranges && nodecay[2 * lo] <= i) lo++;
        dec[e] = lo > 0 && i < nodecay[2 * (lo - 1) + 1] ? 1.0f : decay;
    }
    if (i0 + 4 <= n) {
        float4 pp = *(float4*)(p + i0), mm = *(float4*)(m + i0), vv = *(float4*)(v + i0), gg = *(float4*)(g + i0);
        adamw_one(pp.x, mm.x, vv.x, gg.x, dec[0], c, b1, b2, eps, step_size, bc2_sqrt);
        adamw_one(pp.y, mm.y, vv.y, gg.y, dec[1], c, b1, b2, eps, step_size, bc2_sqrt);
        adamw_one(pp.z, mm.z, vv.z, gg.z, dec[2], c, b1, b2, eps, step_size, bc2_sqrt);
        adamw_one(pp.w, mm.w, vv.w, gg.w, dec[3], c, b1, b2, eps, step_size, bc2_sqrt);
        *(float4*)(p + i0) = pp;
        *(float4*)(m + i0) = mm;
        *(float4*)(v + i0) = vv;
        if (c != 1.0f) *(float4*)(g + i0) = gg;
        if (wbf) *(uint2*)(wbf + i0) = make_uint2(f2bf2(pp.x, pp.y), f2bf2(pp.z, pp.w));
        return;
    }
    for (int e = 0; i0 + e < n; e++) {
        long long i = i0 + e;
        adamw_one(p[i], m[i], v[i], g[i], dec[e], c, b1, b2, eps, step_size, bc2_sqrt);
        if (wbf) wbf[i] = f2bf(p[i]);
    }
}

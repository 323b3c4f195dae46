// LM-head loss: one block per row of logits (N, V). Rows whose target is -1
// take no loss. With grad set, the row is overwritten by its gradient,
// (softmax - onehot) * gscale, where gscale = micro-batch scale / counted rows;
// with dlb set the gradient goes to dlb in bf16 instead (the LM head's two
// backward GEMMs read it as is) and logits is left alone. With bf set the
// logits are bf16 (the training head's forward GEMM writes them so, as
// autocast does): read as such, and their gradient, bf16 too, overwrites
// them.

__device__ __forceinline__ float4 ld4(const float* p, size_t i) { return ((const float4*)p)[i]; }
__device__ __forceinline__ float4 ld4(const bf16* p, size_t i) { return bf4(((const uint2*)p)[i]); }
__device__ __forceinline__ void st4(float* p, size_t i, float a, float b, float c, float d) { ((float4*)p)[i] = make_float4(a, b, c, d); }
__device__ __forceinline__ void st4(bf16* p, size_t i, float a, float b, float c, float d) { ((uint2*)p)[i] = make_uint2(f2bf2(a, b), f2bf2(c, d)); }
__device__ __forceinline__ float ld1(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld1(const bf16* p, size_t i) { return bf2f(p[i]); }
__device__ __forceinline__ void st1(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st1(bf16* p, size_t i, float v) { p[i] = f2bf(v); }

template <typename L>
__device__ __forceinline__ void xent_row(L* logits, bf16* dlb, float* losses, const int* targets, int V, float gscale, int grad) {
    size_t row = (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x];
    if (t < 0) {
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (grad && dlb) for (int j = threadIdx.x; j < V; j += blockDim.x) dlb[row + j] = 0;
        else if (grad) for (int j = threadIdx.x; j < V; j += blockDim.x) st1(logits, row + j, 0.0f);
        return;
    }
    // One pass for the maximum and the sum (each thread rescales its sum
    // when its maximum grows), then one for the gradient: the row is read
    // twice, not three times.
    // With V a multiple of 4 (every preset) a thread reads 4 values at a time.
    float mt = -3.0e38f, st = 0.0f;
    bool vec = (V & 3) == 0;
    if (vec) {
        for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
            float4 x = ld4(logits, row / 4 + j);
            float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
            if (mx > mt) {
                st *= expf(mt - mx);
                mt = mx;
            }
            st += expf(x.x - mt) + expf(x.y - mt) + expf(x.z - mt) + expf(x.w - mt);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float x = ld1(logits, row + j);
            if (x > mt) {
                st = st * expf(mt - x) + 1.0f;
                mt = x;
            } else {
                st += expf(x - mt);
            }
        }
    }
    float m = block_max(mt);
    float s = block_sum(st * expf(mt - m));
    float lse = m + logf(s);
    float lt = ld1(logits, row + t);
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - lt;
    if (vec && grad) {
        for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
            float4 x = ld4(logits, row / 4 + j);
            int c = 4 * j;
            float g0 = (expf(x.x - lse) - (c == t ? 1.0f : 0.0f)) * gscale;
            float g1 = (expf(x.y - lse) - (c + 1 == t ? 1.0f : 0.0f)) * gscale;
            float g2 = (expf(x.z - lse) - (c + 2 == t ? 1.0f : 0.0f)) * gscale;
            float g3 = (expf(x.w - lse) - (c + 3 == t ? 1.0f : 0.0f)) * gscale;
            if (dlb)
                st4(dlb, row / 4 + j, g0, g1, g2, g3);
            else
                st4(logits, row / 4 + j, g0, g1, g2, g3);
        }
        return;
    }
    if (grad && dlb)
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            dlb[row + j] = f2bf((expf(ld1(logits, row + j) - lse) - (j == t ? 1.0f : 0.0f)) * gscale);
    else if (grad)
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            st1(logits, row + j, (expf(ld1(logits, row + j) - lse) - (j == t ? 1.0f : 0.0f)) * gscale);
}

// xent_row_bf8 is xent_row for bf16 logits with V a multiple of 8 (every
// preset): 16-byte loads, the exponentials in base 2 in one instruction
// each (the logits are bf16 and so is their gradient: a 2-ulp exp2 is far
// below either's rounding), and the target's -1 written once after the
// row, by the thread that wrote its group of eight, not tested for at
// every value. Arithmetic in units of log2: y = x log2(e).
__device__ __forceinline__ void xent_row_bf8(bf16* logits, bf16* dlb, float* losses, const int* targets, int V, float gscale, int grad) {
    size_t row = (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x];
    if (t < 0) {
        xent_row(logits, dlb, losses, targets, V, gscale, grad);
        return;
    }
    const uint4* src = (const uint4*)(logits + row);
    float mt = -3.0e38f, st = 0.0f;
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
        float x[8];
        bf8(src[j], x);
        float mx = fmaxf(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])), fmaxf(fmaxf(x[4], x[5]), fmaxf(x[6], x[7]))) * LOG2E;
        if (mx > mt) {
            st *= ex2(mt - mx);
            mt = mx;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) st += ex2(fmaf(x[k], LOG2E, -mt));
    }
    float m = block_max(mt);
    float s = block_sum(st * ex2(mt - m));
    float lse2 = m + __log2f(s);
    float lt = bf2f(logits[row + t]);
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = lse2 * LN2 - lt;
    if (!grad) return;
    uint4* dst = (uint4*)((dlb ? dlb : logits) + row);
    for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
        float x[8];
        bf8(src[j], x);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = ex2(fmaf(x[k], LOG2E, -lse2)) * gscale;
        if (j == t >> 3) x[t & 7] -= gscale;
        dst[j] = f2bf8(x);
    }
}

// xent_row_bf8r is xent_row_bf8 with the row held in registers: a thread
// of the block's 256 loads its NR groups of eight at once (NR = 8 holds a
// row of 16384, 16 one of 32768), so that the row is read from memory once
// for both passes and all of a thread's loads are in flight together,
// where the loop of xent_row_bf8 waits on each load and reads the row
// twice. The groups are taken in xent_row_bf8's order with its
// arithmetic: the same bits.
template <int NR>
__device__ __forceinline__ void xent_row_bf8r(bf16* logits, bf16* dlb, float* losses, const int* targets, int V, float gscale, int grad) {
    size_t row = (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x];
    if (t < 0) {
        xent_row(logits, dlb, losses, targets, V, gscale, grad);
        return;
    }
    const uint4* src = (const uint4*)(logits + row);
    int n8 = V >> 3;
    uint4 u[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        int j = threadIdx.x + i * blockDim.x;
        u[i] = j < n8 ? src[j] : make_uint4(0, 0, 0, 0);
    }
    float mt = -3.0e38f, st = 0.0f;
#pragma unroll
    for (int i = 0; i < NR; i++) {
        if (threadIdx.x + i * blockDim.x < n8) {
            float x[8];
            bf8(u[i], x);
            float mx = fmaxf(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])), fmaxf(fmaxf(x[4], x[5]), fmaxf(x[6], x[7]))) * LOG2E;
            if (mx > mt) {
                st *= ex2(mt - mx);
                mt = mx;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) st += ex2(fmaf(x[k], LOG2E, -mt));
        }
    }
    float m = block_max(mt);
    float s = block_sum(st * ex2(mt - m));
    float lse2 = m + __log2f(s);
    float lt = bf2f(logits[row + t]);
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = lse2 * LN2 - lt;
    if (!grad) return;
    uint4* dst = (uint4*)((dlb ? dlb : logits) + row);
#pragma unroll
    for (int i = 0; i < NR; i++) {
        int j = threadIdx.x + i * blockDim.x;
        if (j < n8) {
            float x[8];
            bf8(u[i], x);
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = ex2(fmaf(x[k], LOG2E, -lse2)) * gscale;
            if (j == t >> 3) x[t & 7] -= gscale;
            dst[j] = f2bf8(x);
        }
    }
}

// gscalep points at the gradient's scale (the caller's scale over the
// batch's targeted rows): in device memory, so that a graph replaying this
// launch reads each batch's value.
extern "C" __global__ void xent_fwd_bwd(void* logits, bf16* dlb, float* losses, const int* targets, int V, const float* gscalep, int grad, int bf) {
    float gscale = *gscalep;
    if (bf && (V & 7) == 0)
        xent_row_bf8((bf16*)logits, dlb, losses, targets, V, gscale, grad);
    else if (bf)
        xent_row((bf16*)logits, dlb, losses, targets, V, gscale, grad);
    else
        xent_row((float*)logits, dlb, losses, targets, V, gscale, grad);
}

// xent_fwd_bwd_r8 and _r16 are xent_fwd_bwd for bf16 logits with V a
// multiple of 8, in blocks of 256 threads, for rows of up to 16384 and
// 32768 values (xentKernelFor picks them).
extern "C" __global__ void __launch_bounds__(256) xent_fwd_bwd_r8(void* logits, bf16* dlb, float* losses, const int* targets, int V, const float* gscalep, int grad, int bf) {
    xent_row_bf8r<8>((bf16*)logits, dlb, losses, targets, V, *gscalep, grad);
}

extern "C" __global__ void __launch_bounds__(256) xent_fwd_bwd_r16(void* logits, bf16* dlb, float* losses, const int* targets, int V, const float* gscalep, int grad, int bf) {
    xent_row_bf8r<16>((bf16*)logits, dlb, losses, targets, V, *gscalep, grad);
}

// acc[0] += *scale * sum(losses): one block, so the sum is deterministic.
extern "C" __global__ void loss_reduce(float* acc, const float* losses, int N, const float* scale) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
    s = block_sum(s);
    if (threadIdx.x == 0) acc[0] += s * scale[0];
}

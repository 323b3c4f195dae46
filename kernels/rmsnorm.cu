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

// dwp[blockIdx.y][j] = the sum over rows blockIdx.y, + gridDim.y, ... of
// dy * x * r: each block's share of dw in a row of its own, which
// rmsnorm_dw_reduce adds up in a fixed order (atomics would add the shares
// in whatever order the blocks finish, and dw would differ from run to run).
extern "C" __global__ void rmsnorm_bwd_dw(float* dwp, const float* dy, const float* x, const float* rstd, int N, int d) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float acc = 0.0f;
    for (int r = blockIdx.y; r < N; r += gridDim.y) {
        size_t i = (size_t)r * d + j;
        acc += dy[i] * x[i] * rstd[r];
    }
    dwp[(size_t)blockIdx.y * d + j] = acc;
}

// dst[k][j] += the sum of part[k][g][j] over g < G, in a fixed order, for
// the k-th of the backward's norms (blockIdx.y): their shares wait in rows
// of their own until the backward's end, so that one launch sums them all
// rather than one small launch after each norm. Blocks of 1024 threads take
// 32 columns, each of the 32 warps the rows g = warp, warp + 32, ... in
// turn, then the first warp adds the 32 sums in warp order.
extern "C" __global__ void rmsnorm_dw_reduce(const unsigned long long* dst, const float* part, int G, int d, long long stride) {
    __shared__ float sh[32][33];
    float* dw = (float*)dst[blockIdx.y];
    part += blockIdx.y * stride;
    int lane = threadIdx.x & 31, s = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
    float acc = 0.0f;
    if (c < d) {
#pragma unroll 4
        for (int g = s; g < G; g += 32) acc += part[(size_t)g * d + c];
    }
    sh[s][lane] = acc;
    __syncthreads();
    if (s == 0 && c < d) {
        float t = sh[0][lane];
        for (int k = 1; k < 32; k++) t += sh[k][lane];
        dw[c] += t;
    }
}

// Warp-per-row forms for d a multiple of 128 up to 1024 (every preset but
// tiny): a lane keeps its d/32 values of a row in registers, so x and dy
// are read once and the row's sum is a warp shuffle, not two block-wide
// barriers over a few values per thread.
#define RN_MAX 8 // float4s per lane

struct alignas(16) rn4 { float x, y, z, w; };

__device__ __forceinline__ void store_bf4(bf16* p, rn4 v) {
    unsigned lo = f2bf2(v.x, v.y), hi = f2bf2(v.z, v.w);
    *(uint2*)p = make_uint2(lo, hi);
}

// Blocks of 256 threads, a row per warp. NV bounds d / 128, the float4s a
// lane holds of a row: the presets' widths get kernels sized exactly
// (rmsnorm_fwd_warp4 for d = 512, _6 for 768), whose fewer registers let
// more blocks share an SM; the sums run in the same order, so every width's
// kernels give the same bits.
template <int NV>
__device__ __forceinline__ void rmsnorm_fwd_row(float* out, bf16* outb, float* rstd, const float* x, const float* w, int N, int d, float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    int nv = d >> 7;
    const rn4* xr = (const rn4*)(x + row * d);
    rn4 v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if (i < nv) {
            v[i] = xr[i * 32 + lane];
            ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (lane == 0 && rstd) rstd[row] = r;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if (i < nv) {
            int c = i * 32 + lane;
            rn4 wv = ((const rn4*)w)[c];
            rn4 y = {v[i].x * r * wv.x, v[i].y * r * wv.y, v[i].z * r * wv.z, v[i].w * r * wv.w};
            if (out) ((rn4*)(out + row * d))[c] = y;
            if (outb) store_bf4(outb + row * d + c * 4, y);
        }
    }
}

extern "C" __global__ void rmsnorm_fwd_warp(float* out, bf16* outb, float* rstd, const float* x, const float* w, int N, int d, float eps) {
    rmsnorm_fwd_row<RN_MAX>(out, outb, rstd, x, w, N, d, eps);
}

extern "C" __global__ void rmsnorm_fwd_warp4(float* out, bf16* outb, float* rstd, const float* x, const float* w, int N, int d, float eps) {
    rmsnorm_fwd_row<4>(out, outb, rstd, x, w, N, d, eps);
}

extern "C" __global__ void rmsnorm_fwd_warp6(float* out, bf16* outb, float* rstd, const float* x, const float* w, int N, int d, float eps) {
    rmsnorm_fwd_row<6>(out, outb, rstd, x, w, N, d, eps);
}

// raw4<T> holds four values of T as they were loaded: bf16 in their 8
// bytes (two registers), fp32 as four; wide4 widens them to fp32.
template <typename T> struct raw4 { typedef rn4 type; };
template <> struct raw4<bf16> { typedef uint2 type; };
__device__ __forceinline__ rn4 ld_raw4(const float* p, long long i) { return ((const rn4*)p)[i]; }
__device__ __forceinline__ uint2 ld_raw4(const bf16* p, long long i) { return ((const uint2*)p)[i]; }
__device__ __forceinline__ rn4 wide4(rn4 v) { return v; }
__device__ __forceinline__ rn4 wide4(uint2 u) {
    float4 f = bf4(u);
    return rn4{f.x, f.y, f.z, f.w};
}
__device__ __forceinline__ void store4(float* p, long long i, rn4 v) { ((rn4*)p)[i] = v; }
__device__ __forceinline__ void store4(bf16* p, long long i, rn4 v) { store_bf4(p + i * 4, v); }

// rmsnorm_bwd_dx and rmsnorm_bwd_dw in one pass: a warp takes rows in turn,
// adds the row's dx into dx (and its bf16 copy into dxb) and keeps its
// lanes' share of dw in registers; the block sums its warps' shares, in
// warp order, into its row of dwp (gridDim.x rows of d), which
// rmsnorm_dw_reduce adds to dw in a fixed order. Blocks of 256 threads
// (8 warps: the shared rows are sized for that); any grid. DY is float, or bf16 where the GEMM that makes dy
// writes it in bf16 (rmsnorm_bwd_warp_bf). NV bounds d / 128, the float4s a
// lane holds of each of x, dy, dx and its dw share: registers grow with it,
// so the presets' widths get kernels of their own (rmsnorm_bwd_warp_bf4 for
// d = 512, _bf6 for 768), sized exactly, which can afford to read dx early
// and still run two blocks an SM.
//
// DX is float, or bf16 where the residual stream's gradient is kept in bf16
// alone (the _b kernels): dx is then read and written in bf16, and dxb is
// not used. bf16 values are held as loaded, two registers for four, and the
// sized _b kernels are bounded to 128 registers a thread (two blocks an
// SM, as normGrid launches them).
template <typename DY, typename DX, int NV>
__device__ __forceinline__ void rmsnorm_bwd_rows(DX* dx, bf16* dxb, float* dwp, const DY* dy, const float* x, const float* w,
                                                 const float* rstd, int N, int d) {
    __shared__ alignas(16) float part[8 * NV * 128]; // a row of NV * 128 columns per warp
    int lane = threadIdx.x & 31, nw = blockDim.x >> 5, nv = d >> 7;
    rn4 acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] = rn4{0.0f, 0.0f, 0.0f, 0.0f};
    for (long long row = (long long)blockIdx.x * nw + (threadIdx.x >> 5); row < N; row += (long long)gridDim.x * nw) {
        const rn4* xr = (const rn4*)(x + row * d);
        long long base = row * (d >> 2);
        // Up to 768 columns dx is read with x and dy, before the row's sum,
        // so that the three loads are in flight at once rather than dx
        // waiting on the shuffle; wider rows would need more registers than
        // two blocks an SM allow.
        constexpr bool early = NV <= 6;
        typename raw4<DY>::type gv[NV];
        typename raw4<DX>::type ov[NV];
        rn4 xv[NV];
        // Every load of the row is issued before any arithmetic on it: with
        // the sum in the loop of loads the compiler waited on each one (1.09
        // against 0.87 ms a step for rmsnorm_bwd_warp_bf4b at small 32).
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (i < nv) {
                int c = i * 32 + lane;
                gv[i] = ld_raw4(dy, base + c);
                xv[i] = xr[c];
                if (early) ov[i] = ld_raw4((const DX*)dx, base + c);
            }
        }
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (i < nv) {
                rn4 g = wide4(gv[i]), wv = ((const rn4*)w)[i * 32 + lane];
                dot += g.x * wv.x * xv[i].x + g.y * wv.y * xv[i].y + g.z * wv.z * xv[i].z + g.w * wv.w * xv[i].w;
            }
        }
        dot = warp_sum(dot) / (float)d;
        float r = rstd[row], r3 = r * r * r;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (i < nv) {
                int c = i * 32 + lane;
                rn4 wv = ((const rn4*)w)[c], g = wide4(gv[i]);
                rn4 o = wide4(early ? ov[i] : ld_raw4((const DX*)dx, base + c));
                o.x += r * g.x * wv.x - r3 * xv[i].x * dot;
                o.y += r * g.y * wv.y - r3 * xv[i].y * dot;
                o.z += r * g.z * wv.z - r3 * xv[i].z * dot;
                o.w += r * g.w * wv.w - r3 * xv[i].w * dot;
                store4(dx, base + c, o);
                if (dxb) store_bf4(dxb + row * d + c * 4, o);
                acc[i].x += g.x * xv[i].x * r;
                acc[i].y += g.y * xv[i].y * r;
                acc[i].z += g.z * xv[i].z * r;
                acc[i].w += g.w * xv[i].w * r;
            }
        }
    }
    rn4* mine = (rn4*)(part + (threadIdx.x >> 5) * (NV * 128));
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if (i < nv) mine[i * 32 + lane] = acc[i];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float s = part[j];
        for (int k = 1; k < nw; k++) s += part[k * (NV * 128) + j];
        dwp[(size_t)blockIdx.x * d + j] = s;
    }
}

extern "C" __global__ void rmsnorm_bwd_warp(float* dx, bf16* dxb, float* dwp, const float* dy, const float* x, const float* w,
                                            const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<float, float, RN_MAX>(dx, dxb, dwp, dy, x, w, rstd, N, d);
}

extern "C" __global__ void rmsnorm_bwd_warp_bf(float* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                               const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, float, RN_MAX>(dx, dxb, dwp, dy, x, w, rstd, N, d);
}

extern "C" __global__ void rmsnorm_bwd_warp_bf4(float* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                                const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, float, 4>(dx, dxb, dwp, dy, x, w, rstd, N, d);
}

extern "C" __global__ void rmsnorm_bwd_warp_bf6(float* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                                const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, float, 6>(dx, dxb, dwp, dy, x, w, rstd, N, d);
}

// The same with the residual stream's gradient dx in bf16 alone.
extern "C" __global__ void rmsnorm_bwd_warp_bfb(bf16* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                                const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, bf16, RN_MAX>(dx, nullptr, dwp, dy, x, w, rstd, N, d);
}

extern "C" __global__ void __launch_bounds__(256, 2) rmsnorm_bwd_warp_bf4b(bf16* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                                 const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, bf16, 4>(dx, nullptr, dwp, dy, x, w, rstd, N, d);
}

extern "C" __global__ void __launch_bounds__(256, 2) rmsnorm_bwd_warp_bf6b(bf16* dx, bf16* dxb, float* dwp, const bf16* dy, const float* x, const float* w,
                                                 const float* rstd, int N, int d) {
    rmsnorm_bwd_rows<bf16, bf16, 6>(dx, nullptr, dwp, dy, x, w, rstd, N, d);
}

// Shared by the flash attention kernels (flash.cu for sm_80 and later,
// flash_sm90.cu for Hopper); prepended after common.cuh. Both keep a
// warp's 16 query or key rows in the mma.sync accumulator layout (lane =
// 4 g + t: row g in elements 0, 1 and row g + 8 in 2, 3, columns 2t, 2t+1
// of each 16 x 8 block), which is also the layout of a wgmma accumulator's
// warp quarter, so the softmax and the stores below serve both.
//
// Their grids are (heads, batch, tiles): the query heads (the key/value
// heads for dk and dv) along x, the sequences along y, and the 64- or
// 128-row tiles along z. A causal tile's work depends on its index, and
// blocks start roughly in the order of their linear index, x fastest; with
// the tiles slowest, every head's longest tiles start before any shorter
// one and the grid ends on its shortest. With the tiles along x, every
// (head, sequence) row began with its longest tile, so the grid's last
// rows started long tiles when the other blocks were finishing. flash_bwd,
// the one-pass backward whose blocks wait on each other's dq sums, keeps
// the (tiles, KV, B) grid its order of waiting was written and measured for.

#define HD 64 // head dimension

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// acc_to_a rounds a 16 x 16 KC accumulator to bf16 A fragments: the C
// layout of two neighbouring 8-column blocks is the A layout of one
// 16-wide chunk.
template <int KC = 4>
__device__ __forceinline__ void acc_to_a(unsigned (*a)[4], const float (*s)[4]) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        a[kc][0] = f2bf2(s[2 * kc][0], s[2 * kc][1]);
        a[kc][1] = f2bf2(s[2 * kc][2], s[2 * kc][3]);
        a[kc][2] = f2bf2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        a[kc][3] = f2bf2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// online_softmax takes the scores s of one 64-key tile (keys from key0,
// as accumulators: 8 blocks of 16 x 8 for each of R blocks of 16 of a
// warp's query rows) through the online softmax: rows g and g + 8 of block
// i are row 2 i and 2 i + 1 of the query indices qi, the running maxima m
// and the running sums l. Bit i of diag marks block i as crossing the
// diagonal: only there are keys after a query, and masked. It leaves the
// probabilities in s and rescales the output accumulators o (8 R blocks)
// for the new maxima; the caller then adds P V into o.
template <int R>
__device__ __forceinline__ void online_softmax(float (*s)[4], float (*o)[4], float* m, float* l, const int* qi, unsigned diag, int key0,
                                               float c, int lane) {
    int t = lane & 3;
#pragma unroll
    for (int i = 0; i < R; i++) {
        // Key 0 is in every row's first tile, so no row's maximum stays
        // -inf.
        if (diag >> i & 1) {
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (key0 + nb * 8 + 2 * t + (e & 1) > qi[2 * i + (e >> 1)]) s[8 * i + nb][e] = neg_inf();
                }
            }
        }
    }
    // m is the running maximum of the raw scores; the scale goes into the
    // exponent's multiply-add.
    float mx[2 * R];
#pragma unroll
    for (int r = 0; r < 2 * R; r++) mx[r] = m[r];
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) mx[2 * i + (e >> 1)] = fmaxf(mx[2 * i + (e >> 1)], s[8 * i + nb][e]);
        }
    }
    float alpha[2 * R], mc[2 * R];
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        mx[r] = quad_max(mx[r]);
        alpha[r] = ex2((m[r] - mx[r]) * c);
        m[r] = mx[r];
        mc[r] = mx[r] * c;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = 2 * i + (e >> 1);
                float p = ex2(fmaf(s[8 * i + nb][e], c, -mc[r]));
                s[8 * i + nb][e] = p;
                l[r] += p;
                o[8 * i + nb][e] *= alpha[r];
            }
        }
    }
}

// fwd_store writes the rows of fwd_tile's R blocks that lie before T: the
// output normalised by the row's sum, in fp32 to out (when set) and in
// bf16 to outb, and the base-2 log-sum-exp to lse.
template <int R>
__device__ __forceinline__ void fwd_store(float* out, bf16* outb, float* lse, const float (*o)[4], const float* m, const float* l,
                                          const int* qi, float c, int lane, int b, int h, int T, int H) {
    int t = lane & 3, qs = H * HD;
#pragma unroll
    for (int r = 0; r < 2 * R; r++) {
        float sum = quad_sum(l[r]);
        if (qi[r] >= T) continue;
        const float(*ob)[4] = o + 8 * (r >> 1);
        int e = 2 * (r & 1);
        float inv = 1.0f / sum;
        size_t at = ((size_t)b * T + qi[r]) * qs + h * HD;
        if (out) {
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                out[at + nb * 8 + 2 * t] = ob[nb][e] * inv;
                out[at + nb * 8 + 2 * t + 1] = ob[nb][e + 1] * inv;
            }
        }
        // The pair sits at an even index: 4-byte aligned.
#pragma unroll
        for (int nb = 0; nb < 8; nb++) *(unsigned*)(outb + at + nb * 8 + 2 * t) = f2bf2(ob[nb][e] * inv, ob[nb][e + 1] * inv);
        if (t == 0) lse[((size_t)b * H + h) * T + qi[r]] = m[r] * c + log2f(sum);
    }
}

// store_unrotated writes row r (0: g, 1: g + 8) of a warp's 16 x 64
// accumulator, times scale, to dst in bf16 after the inverse rotary rotation
// at position pos: the gradient of a rotated query or key taken back to the
// projection's output. Column i pairs with i + 32 (rotate_half), and both
// sit in the same thread (blocks nb and nb + 4), so the rotation needs no
// exchange; cosT and sinT are rope.cu's (positions, 32) tables.
__device__ __forceinline__ void store_unrotated(bf16* dst, const float (*acc)[4], int r, int t, float scale, const float* cosT,
                                                const float* sinT, int pos) {
    const float* ct = cosT + (size_t)pos * (HD / 2);
    const float* st = sinT + (size_t)pos * (HD / 2);
#pragma unroll
    for (int nb = 0; nb < 4; nb++) {
        int i = nb * 8 + 2 * t;
        float lo[2], hi[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float x = acc[nb][2 * r + e] * scale, y = acc[nb + 4][2 * r + e] * scale, c = ct[i + e], s = st[i + e];
            lo[e] = x * c + y * s;
            hi[e] = y * c - x * s;
        }
        // Pairs at even indices: 4-byte aligned.
        *(unsigned*)(dst + i) = f2bf2(lo[0], lo[1]);
        *(unsigned*)(dst + i + HD / 2) = f2bf2(hi[0], hi[1]);
    }
}

// store_q_grads writes a query tile's dq (times scale) for the warp's rows
// qi: in fp32 to dq (packed, (B, T, H, 64)) when set, and in bf16 rotated
// back by rope to dqb (row stride lddq) when set.
__device__ __forceinline__ void store_q_grads(float* dq, bf16* dqb, const float (*acc)[4], const int* qi, int b, int h, int T, int H,
                                              int lddq, float scale, const float* cosT, const float* sinT, int lane) {
    int t = lane & 3, qs = H * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (qi[r] >= T) continue;
        if (dq) {
            float* row = dq + ((size_t)b * T + qi[r]) * qs + h * HD;
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                row[nb * 8 + 2 * t] = acc[nb][2 * r] * scale;
                row[nb * 8 + 2 * t + 1] = acc[nb][2 * r + 1] * scale;
            }
        }
        if (dqb) store_unrotated(dqb + ((size_t)b * T + qi[r]) * lddq + h * HD, acc, r, t, scale, cosT, sinT, qi[r]);
    }
}

// store_kv_grads writes a key tile's dk (times scale) and dv for the
// warp's rows kj: in fp32 to dk, dv (packed, (B, T, KV, 64)) when set, and
// in bf16 to dkb (rotated back by rope) and dvb, row stride ldd.
__device__ __forceinline__ void store_kv_grads(float* dk, bf16* dkb, float* dv, bf16* dvb, const float (*dka)[4], const float (*dva)[4],
                                               const int* kj, int b, int kvh, int T, int KV, int ldd, float scale,
                                               const float* cosT, const float* sinT, int lane) {
    int t = lane & 3, ks = KV * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (kj[r] >= T) continue;
        size_t at = ((size_t)b * T + kj[r]) * ks + kvh * HD;
        size_t atb = ((size_t)b * T + kj[r]) * ldd + kvh * HD;
        if (dkb) store_unrotated(dkb + atb, dka, r, t, scale, cosT, sinT, kj[r]);
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
            if (dk) {
                dk[at + nb * 8 + 2 * t] = dka[nb][2 * r] * scale;
                dk[at + nb * 8 + 2 * t + 1] = dka[nb][2 * r + 1] * scale;
            }
            if (dv) {
                dv[at + nb * 8 + 2 * t] = dva[nb][2 * r];
                dv[at + nb * 8 + 2 * t + 1] = dva[nb][2 * r + 1];
            }
            if (dvb) *(unsigned*)(dvb + atb + nb * 8 + 2 * t) = f2bf2(dva[nb][2 * r], dva[nb][2 * r + 1]);
        }
    }
}

// The one-pass backwards' order of the dq sums across blocks (flash_bwd,
// flash_bwd_h): a semaphore read with acquire and written with release
// at the GPU's scope.
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

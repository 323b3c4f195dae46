// Flash attention for training: causal, grouped-query, head_dim 64, bf16
// tensor cores (mma.sync m16n8k16, available from sm_80) with fp32
// accumulation and an fp32 online softmax. The (T, T) probabilities are
// never stored: the forward pass keeps one log-sum-exp per query row and the
// backward pass recomputes the probabilities tile by tile.
//   q, out, dout, dq: (B, T, H, 64)       k, v, dk, dv: (B, T, KV, 64)
//   lse, dvec: (B, H, T), lse in base 2
// Query head h reads key/value head h / (H / KV). A block has 4 warps and
// takes a tile of 64 rows; each warp owns 16 of them. T need not be a
// multiple of 64: rows past T are loaded as zeros and never stored.
//
// mma.sync fragment layout (lane = 4 g + t): A (16 x 16) register i holds
// row g (+8 for i = 1, 3), columns 2t, 2t+1 (+8 for i = 2, 3); B (16 x 8)
// register i holds rows 2t, 2t+1 (+8 for i = 1) of column g; C (16 x 8)
// holds row g (elements 0, 1) and row g + 8 (2, 3), columns 2t, 2t+1.

#define FT 64  // rows in a tile, queries or keys
#define HD 64  // head dimension
#define LDS 72 // shared row stride in bf16 values: 36 words, so the 8 rows x 4 words of a fragment fall in 32 distinct banks

struct alignas(16) f4 { float x, y, z, w; };
struct alignas(8) u2 { unsigned x, y; };

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ unsigned pack2(float lo, float hi) { return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16); }

__device__ __forceinline__ unsigned ld32(const bf16* p) { return *(const unsigned*)p; }

__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// load_tile rounds rows row0 .. row0+63 of src (row stride in floats) to
// bf16 into dst as [row][d] and/or dstT as [d][row]; rows at or past T are
// zeros. Within a warp the 32 threads take 32 consecutive rows, so the
// transposed stores fall in distinct banks.
__device__ __forceinline__ void load_tile(bf16* dst, bf16* dstT, const float* src, int stride, int row0, int T) {
#pragma unroll
    for (int it = 0; it < FT * HD / 4 / 128; it++) {
        int idx = it * 128 + threadIdx.x;
        int r = idx & (FT - 1), c = idx >> 6;
        f4 x = {0.0f, 0.0f, 0.0f, 0.0f};
        if (row0 + r < T) x = *(const f4*)(src + (size_t)(row0 + r) * stride + c * 4);
        if (dst) {
            u2 u;
            u.x = pack2(x.x, x.y);
            u.y = pack2(x.z, x.w);
            *(u2*)(dst + r * LDS + c * 4) = u;
        }
        if (dstT) {
            dstT[(c * 4 + 0) * LDS + r] = f2bf(x.x);
            dstT[(c * 4 + 1) * LDS + r] = f2bf(x.y);
            dstT[(c * 4 + 2) * LDS + r] = f2bf(x.z);
            dstT[(c * 4 + 3) * LDS + r] = f2bf(x.w);
        }
    }
}

// frag_a loads the A fragments of rows r0 .. r0+15 of a [row][k] tile, all
// four 16-wide chunks of k.
__device__ __forceinline__ void frag_a(unsigned (*a)[4], const bf16* X, int r0, int g, int t) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        a[kc][0] = ld32(X + (r0 + g) * LDS + kc * 16 + 2 * t);
        a[kc][1] = ld32(X + (r0 + g + 8) * LDS + kc * 16 + 2 * t);
        a[kc][2] = ld32(X + (r0 + g) * LDS + kc * 16 + 8 + 2 * t);
        a[kc][3] = ld32(X + (r0 + g + 8) * LDS + kc * 16 + 8 + 2 * t);
    }
}

// warp_mm adds A (16 x 64, as fragments) times B (64 x 64) into acc (16 x
// 64 as eight 16 x 8 blocks), where Y holds B transposed: Y[n][k] = B[k][n].
__device__ __forceinline__ void warp_mm(float (*acc)[4], const unsigned (*a)[4], const bf16* Y, int g, int t) {
#pragma unroll
    for (int nb = 0; nb < 8; nb++) {
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            const bf16* y = Y + (nb * 8 + g) * LDS + kc * 16 + 2 * t;
            mma16816(acc[nb], a[kc], ld32(y), ld32(y + 8));
        }
    }
}

// acc_to_a rounds a 16 x 64 accumulator to bf16 A fragments: the C layout
// of two neighbouring 8-column blocks is the A layout of one 16-wide chunk.
__device__ __forceinline__ void acc_to_a(unsigned (*a)[4], const float (*s)[4]) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        a[kc][0] = pack2(s[2 * kc][0], s[2 * kc][1]);
        a[kc][1] = pack2(s[2 * kc][2], s[2 * kc][3]);
        a[kc][2] = pack2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        a[kc][3] = pack2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
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

// Grid (tiles, H, B), 128 threads. The last query tiles see the most keys,
// so they are scheduled first.
extern "C" __global__ void flash_fwd(float* out, bf16* outb, float* lse, const float* q, const float* k, const float* v,
                                                            int T, int H, int KV, float scale) {
    __shared__ alignas(16) bf16 Qs[FT * LDS];
    __shared__ alignas(16) bf16 Ks[FT * LDS];
    __shared__ alignas(16) bf16 Vt[HD * LDS];
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD, ks = KV * HD;
    const float* kb = k + (size_t)b * T * ks + kvh * HD;
    const float* vb = v + (size_t)b * T * ks + kvh * HD;
    load_tile(Qs, 0, q + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
    __syncthreads();
    unsigned qa[4][4];
    frag_a(qa, Qs, r0, g, t);
    float o[8][4] = {};
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    const float c = scale * 1.4426950408889634f; // softmax in base 2
    int qi[2] = {qt * FT + r0 + g, qt * FT + r0 + g + 8};
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        load_tile(Ks, 0, kb, ks, kt * FT, T);
        load_tile(0, Vt, vb, ks, kt * FT, T);
        __syncthreads();
        float s[8][4] = {};
        warp_mm(s, qa, Ks, g, t);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[nb][e] * c;
                // Only the diagonal tile holds keys after a query. Key 0 is
                // in every row's first tile, so no row's maximum stays -inf.
                if (kt == qt && kt * FT + nb * 8 + 2 * t + (e & 1) > qi[e >> 1]) x = neg_inf();
                s[nb][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            alpha[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nb][e] - m[e >> 1]);
                s[nb][e] = p;
                l[e >> 1] += p;
                o[nb][e] *= alpha[e >> 1];
            }
        }
        unsigned pa[4][4];
        acc_to_a(pa, s);
        warp_mm(o, pa, Vt, g, t);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(l[r]);
        if (qi[r] >= T) continue;
        float inv = 1.0f / sum;
        float* orow = out + ((size_t)b * T + qi[r]) * qs + h * HD;
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
            orow[nb * 8 + 2 * t] = o[nb][2 * r] * inv;
            orow[nb * 8 + 2 * t + 1] = o[nb][2 * r + 1] * inv;
        }
        // The output projection's GEMM reads this bf16 copy; the fp32 one
        // stays for flash_bwd_dot. The pair sits at an even index: 4-byte aligned.
        if (outb) {
            bf16* brow = outb + ((size_t)b * T + qi[r]) * qs + h * HD;
#pragma unroll
            for (int nb = 0; nb < 8; nb++) *(unsigned*)(brow + nb * 8 + 2 * t) = pack2(o[nb][2 * r] * inv, o[nb][2 * r + 1] * inv);
        }
        if (t == 0) lse[((size_t)b * H + h) * T + qi[r]] = m[r] + log2f(sum);
    }
}

// dvec = rowsum(dout * out) per query row and head: the term that the
// softmax's backward subtracts. One warp per (row, head); N = B * T.
extern "C" __global__ void flash_bwd_dot(float* dvec, const float* dout, const float* out, int N, int T, int H) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (long long)N * H) return;
    const float* a = dout + w * HD;
    const float* o = out + w * HD;
    float s = warp_sum(a[lane] * o[lane] + a[lane + 32] * o[lane + 32]);
    if (lane == 0) {
        long long row = w / H;
        int h = (int)(w % H), b = (int)(row / T), i = (int)(row % T);
        dvec[((size_t)b * H + h) * T + i] = s;
    }
}

// dq for one query tile and head: recomputes P and dP = dout v^T over the
// key tiles the queries see, dS = P (dP - dvec), dq = scale dS k. Writes dq.
// Grid (tiles, H, B), 128 threads.
extern "C" __global__ void flash_bwd_dq(float* dq, const float* q, const float* k, const float* v, const float* dout,
                                                               const float* lse, const float* dvec, int T, int H, int KV, float scale) {
    __shared__ alignas(16) bf16 Ks[FT * LDS];
    __shared__ alignas(16) bf16 Kt[HD * LDS];
    __shared__ alignas(16) bf16 Vs[FT * LDS];
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD, ks = KV * HD;
    const float* kb = k + (size_t)b * T * ks + kvh * HD;
    const float* vb = v + (size_t)b * T * ks + kvh * HD;
    // Ks and Vs first stage the queries and their output gradients.
    load_tile(Ks, 0, q + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
    load_tile(Vs, 0, dout + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
    __syncthreads();
    unsigned qa[4][4], da[4][4];
    frag_a(qa, Ks, r0, g, t);
    frag_a(da, Vs, r0, g, t);
    const float c = scale * 1.4426950408889634f;
    int qi[2] = {qt * FT + r0 + g, qt * FT + r0 + g + 8};
    float lr[2], dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // Rows past T have zero queries and gradients; any finite values do.
        size_t i = ((size_t)b * H + h) * T + qi[r];
        lr[r] = qi[r] < T ? lse[i] : 0.0f;
        dr[r] = qi[r] < T ? dvec[i] : 0.0f;
    }
    float acc[8][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        load_tile(Ks, Kt, kb, ks, kt * FT, T);
        load_tile(Vs, 0, vb, ks, kt * FT, T);
        __syncthreads();
        float s[8][4] = {}, dp[8][4] = {};
        warp_mm(s, qa, Ks, g, t);
        warp_mm(dp, da, Vs, g, t);
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                bool masked = kt == qt && kt * FT + nb * 8 + 2 * t + (e & 1) > qi[r];
                float p = masked ? 0.0f : exp2f(s[nb][e] * c - lr[r]);
                s[nb][e] = p * (dp[nb][e] - dr[r]);
            }
        }
        unsigned sa[4][4];
        acc_to_a(sa, s);
        warp_mm(acc, sa, Kt, g, t);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (qi[r] >= T) continue;
        float* row = dq + ((size_t)b * T + qi[r]) * qs + h * HD;
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
            row[nb * 8 + 2 * t] = acc[nb][2 * r] * scale;
            row[nb * 8 + 2 * t + 1] = acc[nb][2 * r + 1] * scale;
        }
    }
}

// dk and dv for one key tile and key/value head: loops over the query heads
// of its group and the query tiles that see the keys, so each block owns its
// output and no atomics are needed. Writes dk and dv. Grid (tiles, KV, B),
// 128 threads; the first key tiles are seen by the most queries and are
// scheduled first.
extern "C" __global__ void flash_bwd_dkv(float* dk, float* dv, bf16* dvb, const float* q, const float* k, const float* v,
                                                                const float* dout, const float* lse, const float* dvec,
                                                                int T, int H, int KV, float scale) {
    __shared__ alignas(16) bf16 Qs[FT * LDS];
    __shared__ alignas(16) bf16 Qt[HD * LDS];
    __shared__ alignas(16) bf16 Ds[FT * LDS];
    __shared__ alignas(16) bf16 Dt[HD * LDS];
    __shared__ float Ls[FT], Dv[FT];
    int kt = blockIdx.x, nt = gridDim.x, kvh = blockIdx.y, b = blockIdx.z, grp = H / KV;
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD, ks = KV * HD;
    // Qs and Ds first stage this tile's keys and values.
    load_tile(Qs, 0, k + (size_t)b * T * ks + kvh * HD, ks, kt * FT, T);
    load_tile(Ds, 0, v + (size_t)b * T * ks + kvh * HD, ks, kt * FT, T);
    __syncthreads();
    unsigned ka[4][4], va[4][4];
    frag_a(ka, Qs, r0, g, t);
    frag_a(va, Ds, r0, g, t);
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * FT + r0 + g, kt * FT + r0 + g + 8};
    float dka[8][4] = {}, dva[8][4] = {};
    for (int hh = 0; hh < grp; hh++) {
        int h = kvh * grp + hh;
        const float* qb = q + (size_t)b * T * qs + h * HD;
        const float* db = dout + (size_t)b * T * qs + h * HD;
        for (int qt = kt; qt < nt; qt++) {
            __syncthreads();
            load_tile(Qs, Qt, qb, qs, qt * FT, T);
            load_tile(Ds, Dt, db, qs, qt * FT, T);
            if (threadIdx.x < FT) {
                int i = qt * FT + threadIdx.x;
                size_t at = ((size_t)b * H + h) * T + i;
                Ls[threadIdx.x] = i < T ? lse[at] : 0.0f;
                Dv[threadIdx.x] = i < T ? dvec[at] : 0.0f;
            }
            __syncthreads();
            // Transposed products: rows are this warp's keys, columns queries.
            float st[8][4] = {}, dpt[8][4] = {};
            warp_mm(st, ka, Qs, g, t);
            warp_mm(dpt, va, Ds, g, t);
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int ql = nb * 8 + 2 * t + (e & 1), qi = qt * FT + ql;
                    bool seen = qi < T && qi >= kj[e >> 1];
                    float p = seen ? exp2f(st[nb][e] * c - Ls[ql]) : 0.0f;
                    st[nb][e] = p;
                    dpt[nb][e] = p * (dpt[nb][e] - Dv[ql]);
                }
            }
            unsigned fa[4][4];
            acc_to_a(fa, st);
            warp_mm(dva, fa, Dt, g, t);
            acc_to_a(fa, dpt);
            warp_mm(dka, fa, Qt, g, t);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (kj[r] >= T) continue;
        size_t at = ((size_t)b * T + kj[r]) * ks + kvh * HD;
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
            dk[at + nb * 8 + 2 * t] = dka[nb][2 * r] * scale;
            dk[at + nb * 8 + 2 * t + 1] = dka[nb][2 * r + 1] * scale;
            dv[at + nb * 8 + 2 * t] = dva[nb][2 * r];
            dv[at + nb * 8 + 2 * t + 1] = dva[nb][2 * r + 1];
            // dv's bf16 copy feeds the value projection's two GEMMs.
            if (dvb) *(unsigned*)(dvb + at + nb * 8 + 2 * t) = pack2(dva[nb][2 * r], dva[nb][2 * r + 1]);
        }
    }
}

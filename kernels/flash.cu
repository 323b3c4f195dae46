// Flash attention for training: causal, grouped-query, head_dim 64, bf16
// tensor cores (mma.sync m16n8k16, available from sm_80) with fp32
// accumulation and an fp32 online softmax. The (T, T) probabilities are
// never stored: the forward pass keeps one log-sum-exp per query row and the
// backward pass recomputes the probabilities tile by tile.
//   q, out, dout, dq: (B, T, H, 64)       k, v, dk, dv: (B, T, KV, 64)
//   lse, dvec: (B, H, T), lse in base 2
// q, k and v are read with row strides ldq and ldkv (in values), so they can
// be column blocks of one fused projection's output: (B, T, H*64 + 2 KV*64)
// with ldq = ldkv = that width; the bf16 gradients dq, dk and dv are
// written the same way (row strides lddq, lddv), into the matching blocks
// of the projection's gradient. Everything else is packed.
// Query head h reads key/value head h / (H / KV). A block has 4 warps and
// takes a tile of 64 rows; each warp owns 16 of them. T need not be a
// multiple of 64: rows past T are loaded as zeros and never stored.
//
// Every operand arrives in bf16 and goes to shared memory with cp.async, one
// tile ahead of the one being multiplied (two buffers per operand), so the
// copy of the next key tile overlaps the tensor-core work on this one.
// Fragments come out of shared memory with ldmatrix; the .trans form gives
// the B fragments of a tile stored [k][n] (V in P V, K in dS K, Q and dout in
// the key-side products), so no tile is ever stored transposed.
//
// mma.sync fragment layout (lane = 4 g + t): A (16 x 16) register i holds
// row g (+8 for i = 1, 3), columns 2t, 2t+1 (+8 for i = 2, 3); B (16 x 8)
// register i holds rows 2t, 2t+1 (+8 for i = 1) of column g; C (16 x 8)
// holds row g (elements 0, 1) and row g + 8 (2, 3), columns 2t, 2t+1.

#define FT 64  // rows in a tile, queries or keys
#define HD 64  // head dimension
#define LDS 72 // shared row stride in bf16 values (144 bytes): the 8 rows of an ldmatrix 8x8 matrix fall in 8 distinct 16-byte bank groups
#define TILE (FT * LDS)

struct alignas(8) u2 { unsigned x, y; };

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// exp2 in one instruction (exp2f adds range handling around it); -inf
// gives 0, and the probabilities it makes are rounded to bf16 anyway.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// cp_async16 copies 16 bytes from global to shared memory, or writes 16
// zero bytes when bytes is 0 (rows past T).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// cp_wait_prev waits for every committed group but the newest.
__device__ __forceinline__ void cp_wait_prev() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldm4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldm4t(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ unsigned ld32s(const bf16* p) { return *(const unsigned*)p; }

__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// load_tile starts the copy of rows row0 .. row0+63 of src (row stride in
// bf16 values) into dst as [row][d]; rows at or past T become zeros. 64 rows
// of 8 16-byte chunks: four per thread of the block.
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int stride, int row0, int T) {
#pragma unroll
    for (int it = 0; it < FT * HD / 8 / 128; it++) {
        int idx = it * 128 + threadIdx.x;
        int r = idx >> 3, c = idx & 7, row = row0 + r;
        int ok = row < T;
        cp_async16(smem_addr(dst + r * LDS + c * 8), src + (size_t)(ok ? row : 0) * stride + c * 8, ok ? 16 : 0);
    }
}

// frag_a loads the A fragments of rows r0 .. r0+15 of a [row][k] tile, all
// four 16-wide chunks of k.
__device__ __forceinline__ void frag_a(unsigned (*a)[4], const bf16* X, int r0, int lane) {
    int row = r0 + (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 8;
#pragma unroll
    for (int kc = 0; kc < 4; kc++) ldm4(a[kc], smem_addr(X + row * LDS + col + kc * 16));
}

// mm_nk adds A (16 x 64, as fragments) times B (64 x 8 NB) into acc (16 x
// 8 NB as NB 16 x 8 blocks), where Y holds B as [n][k] (B's transpose, row
// major) and B's columns start at row n0 of Y: Q K^T with Y = K, for
// instance.
template <int NB = 8>
__device__ __forceinline__ void mm_nk(float (*acc)[4], const unsigned (*a)[4], const bf16* Y, int lane, int n0 = 0) {
    int row = (lane & 7) + (lane >> 4) * 8, col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
#pragma unroll
        for (int np = 0; np < NB / 2; np++) {
            unsigned b[4];
            ldm4(b, smem_addr(Y + (n0 + np * 16 + row) * LDS + kc * 16 + col));
            mma16816(acc[2 * np], a[kc], b[0], b[1]);
            mma16816(acc[2 * np + 1], a[kc], b[2], b[3]);
        }
    }
}

// mm_kn adds A (16 x 16 KC) times B (16 KC x 64) into acc (16 x 64), where
// Y holds B as [k][n] (row major) from row k0: P V with Y = V.
template <int KC = 4>
__device__ __forceinline__ void mm_kn(float (*acc)[4], const unsigned (*a)[4], const bf16* Y, int lane, int k0 = 0) {
    int row = (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 8;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
#pragma unroll
        for (int np = 0; np < 4; np++) {
            unsigned b[4];
            ldm4t(b, smem_addr(Y + (k0 + kc * 16 + row) * LDS + np * 16 + col));
            mma16816(acc[2 * np], a[kc], b[0], b[1]);
            mma16816(acc[2 * np + 1], a[kc], b[2], b[3]);
        }
    }
}

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

// Grid (tiles, H, B), 128 threads. The last query tiles see the most keys,
// so they are scheduled first. out (fp32) is written only when set; outb
// gets the bf16 copy the output projection and the backward pass read.
extern "C" __global__ void flash_fwd(float* out, bf16* outb, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                     int T, int H, int KV, float scale, int ldq, int ldkv) {
    __shared__ alignas(16) bf16 Qs[TILE];
    __shared__ alignas(16) bf16 Ks[2][TILE];
    __shared__ alignas(16) bf16 Vs[2][TILE];
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD;
    const bf16* kb = k + (size_t)b * T * ldkv + kvh * HD;
    const bf16* vb = v + (size_t)b * T * ldkv + kvh * HD;
    load_tile(Qs, q + (size_t)b * T * ldq + h * HD, ldq, qt * FT, T);
    load_tile(Ks[0], kb, ldkv, 0, T);
    load_tile(Vs[0], vb, ldkv, 0, T);
    cp_commit();
    unsigned qa[4][4];
    float o[8][4] = {};
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    const float c = scale * 1.4426950408889634f; // softmax in base 2
    int qi[2] = {qt * FT + r0 + g, qt * FT + r0 + g + 8};
    for (int kt = 0; kt <= qt; kt++) {
        int cur = kt & 1;
        if (kt < qt) {
            load_tile(Ks[cur ^ 1], kb, ldkv, (kt + 1) * FT, T);
            load_tile(Vs[cur ^ 1], vb, ldkv, (kt + 1) * FT, T);
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        if (kt == 0) frag_a(qa, Qs, r0, lane);
        float s[8][4] = {};
        mm_nk(s, qa, Ks[cur], lane);
        // m is the running maximum of the raw scores; the scale goes into
        // the exponent's multiply-add.
        if (kt == qt) {
            // Only the diagonal tile holds keys after a query. Key 0 is in
            // every row's first tile, so no row's maximum stays -inf.
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (kt * FT + nb * 8 + 2 * t + (e & 1) > qi[e >> 1]) s[nb][e] = neg_inf();
                }
            }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nb][e]);
        }
        float alpha[2], mc[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            alpha[r] = ex2((m[r] - mx[r]) * c);
            m[r] = mx[r];
            mc[r] = mx[r] * c;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = ex2(fmaf(s[nb][e], c, -mc[e >> 1]));
                s[nb][e] = p;
                l[e >> 1] += p;
                o[nb][e] *= alpha[e >> 1];
            }
        }
        unsigned pa[4][4];
        acc_to_a(pa, s);
        mm_kn(o, pa, Vs[cur], lane);
        // The next iteration's copy overwrites the other buffers, which
        // every warp must be done reading.
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(l[r]);
        if (qi[r] >= T) continue;
        float inv = 1.0f / sum;
        size_t at = ((size_t)b * T + qi[r]) * qs + h * HD;
        if (out) {
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
                out[at + nb * 8 + 2 * t] = o[nb][2 * r] * inv;
                out[at + nb * 8 + 2 * t + 1] = o[nb][2 * r + 1] * inv;
            }
        }
        // The pair sits at an even index: 4-byte aligned.
#pragma unroll
        for (int nb = 0; nb < 8; nb++) *(unsigned*)(outb + at + nb * 8 + 2 * t) = f2bf2(o[nb][2 * r] * inv, o[nb][2 * r + 1] * inv);
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

// dq for one query tile and head: first dvec = rowsum(dout * out) for its
// rows (the term the softmax's backward subtracts; written for flash_bwd_dkv,
// which runs next), then recomputes P and dP = dout v^T over the key tiles
// the queries see, dS = P (dP - dvec), dq = scale dS k. Writes dvec, and dq
// in fp32 (when dq is set) and/or, rotated back by rope, in bf16 (dqb, row
// stride lddq: the query block of the fused projection's gradient, which
// the projection's GEMMs read; rope's inverse then needs no pass of its own).
// Grid (tiles, H, B), 128 threads. Five tile buffers: the queries, their
// output gradients and outputs pass through buffers 2, 3 and 4 on their way
// to registers, then key/value tile j lives in buffers 2 (j & 1), 2 (j & 1) + 1.
extern "C" __global__ void __launch_bounds__(128, 4) flash_bwd_dq(float* dq, bf16* dqb, float* dvec, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                        const bf16* out, const float* lse, const float* cosT, const float* sinT, int T, int H, int KV,
                                        float scale, int ldq, int ldkv, int lddq) {
    __shared__ alignas(16) bf16 S[5][TILE];
    __shared__ float Dr[FT];
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD;
    const bf16* kb = k + (size_t)b * T * ldkv + kvh * HD;
    const bf16* vb = v + (size_t)b * T * ldkv + kvh * HD;
    load_tile(S[2], q + (size_t)b * T * ldq + h * HD, ldq, qt * FT, T);
    load_tile(S[3], dout + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
    load_tile(S[4], out + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
    load_tile(S[0], kb, ldkv, 0, T);
    load_tile(S[1], vb, ldkv, 0, T);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    unsigned qa[4][4], da[4][4];
    frag_a(qa, S[2], r0, lane);
    frag_a(da, S[3], r0, lane);
    {
        // Two threads a row, 32 columns each, from the bf16 copies the
        // other products read.
        int row = threadIdx.x >> 1, c0 = (threadIdx.x & 1) * 32;
        float acc = 0.0f;
#pragma unroll 8
        for (int c = 0; c < 32; c += 2) {
            unsigned a = ld32s(S[3] + row * LDS + c0 + c), o = ld32s(S[4] + row * LDS + c0 + c);
            acc += bf_lo(a) * bf_lo(o) + bf_hi(a) * bf_hi(o);
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if ((threadIdx.x & 1) == 0) {
            Dr[row] = acc;
            int i = qt * FT + row;
            if (i < T) dvec[((size_t)b * H + h) * T + i] = acc;
        }
    }
    __syncthreads();
    const float c = scale * 1.4426950408889634f;
    int qi[2] = {qt * FT + r0 + g, qt * FT + r0 + g + 8};
    float lr[2], dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // Rows past T have zero queries and gradients; any finite values do.
        size_t i = ((size_t)b * H + h) * T + qi[r];
        lr[r] = qi[r] < T ? lse[i] : 0.0f;
        dr[r] = Dr[r0 + g + 8 * r];
    }
    float acc[8][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        int cur = (kt & 1) * 2, nxt = cur ^ 2;
        if (kt < qt) {
            load_tile(S[nxt], kb, ldkv, (kt + 1) * FT, T);
            load_tile(S[nxt + 1], vb, ldkv, (kt + 1) * FT, T);
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        // 32 keys at a time: 128 registers a thread, four blocks to an SM
        // where shared memory allows (3% faster than the whole 64-key tile
        // at 168 registers and three blocks).
#pragma unroll 1
        for (int n0 = 0; n0 < FT; n0 += 32) {
            float s[4][4] = {}, dp[4][4] = {};
            mm_nk<4>(s, qa, S[cur], lane, n0);
            mm_nk<4>(dp, da, S[cur + 1], lane, n0);
#pragma unroll
            for (int nb = 0; nb < 4; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1;
                    bool masked = kt == qt && kt * FT + n0 + nb * 8 + 2 * t + (e & 1) > qi[r];
                    float p = masked ? 0.0f : ex2(s[nb][e] * c - lr[r]);
                    s[nb][e] = p * (dp[nb][e] - dr[r]);
                }
            }
            unsigned sa[2][4];
            acc_to_a<2>(sa, s);
            mm_kn<2>(acc, sa, S[cur], lane, n0);
        }
        __syncthreads();
    }
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

// dk and dv for one key tile and key/value head: loops over the query heads
// of its group and the query tiles that see the keys, so each block owns its
// output and no atomics are needed. Writes dk and dv in fp32 (when dk, dv
// are set) and/or bf16 (dkb rotated back by rope, and dvb; row stride
// lddv: the fused projection's gradient, whose GEMMs read them as column
// blocks). Grid (tiles, KV, B), 128
// threads; the first key tiles are seen by the most queries and are
// scheduled first. The keys and values pass through buffers 0 and 1 on
// their way to registers; then (query tile, head) item j has its queries and
// output gradients in buffers 2 (j & 1), 2 (j & 1) + 1 and its log-sum-exp
// and dvec in Ls[j & 1], Dv[j & 1].
extern "C" __global__ void flash_bwd_dkv(float* dk, bf16* dkb, float* dv, bf16* dvb, const bf16* q, const bf16* k, const bf16* v,
                                         const bf16* dout, const float* lse, const float* dvec, const float* cosT, const float* sinT,
                                         int T, int H, int KV, float scale, int ldq, int ldkv, int lddv) {
    __shared__ alignas(16) bf16 S[4][TILE];
    __shared__ float Ls[2][FT], Dv[2][FT];
    int kt = blockIdx.x, nt = gridDim.x, kvh = blockIdx.y, b = blockIdx.z, grp = H / KV;
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD, ks = KV * HD;
    load_tile(S[0], k + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * FT, T);
    load_tile(S[1], v + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * FT, T);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    unsigned ka[4][4], va[4][4];
    frag_a(ka, S[0], r0, lane);
    frag_a(va, S[1], r0, lane);
    __syncthreads();
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * FT + r0 + g, kt * FT + r0 + g + 8};
    int per = nt - kt, items = grp * per;
    // stage starts item j's copies into buffer set j & 1.
    auto stage = [&](int j) {
        int h = kvh * grp + j / per, qt = kt + j % per, s = (j & 1) * 2;
        load_tile(S[s], q + (size_t)b * T * ldq + h * HD, ldq, qt * FT, T);
        load_tile(S[s + 1], dout + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
        if (threadIdx.x < FT) {
            int i = qt * FT + threadIdx.x;
            size_t at = ((size_t)b * H + h) * T + i;
            Ls[j & 1][threadIdx.x] = i < T ? lse[at] : 0.0f;
            Dv[j & 1][threadIdx.x] = i < T ? dvec[at] : 0.0f;
        }
    };
    stage(0);
    cp_commit();
    float dka[8][4] = {}, dva[8][4] = {};
    for (int j = 0; j < items; j++) {
        int s = (j & 1) * 2, qt = kt + j % per;
        if (j + 1 < items) stage(j + 1);
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        const float* L = Ls[j & 1];
        const float* D = Dv[j & 1];
        // Transposed products: rows are this warp's keys, columns queries.
        // The whole 64-query tile at once (253 registers, two blocks to an
        // SM): 32 queries at a time fits three blocks but measured 9% slower.
        float st[8][4] = {}, dpt[8][4] = {};
        mm_nk(st, ka, S[s], lane);
        mm_nk(dpt, va, S[s + 1], lane);
        // Only the diagonal tile has queries before keys, and only the
        // last one rows past T.
        bool edge = qt == kt || (qt + 1) * FT > T;
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ql = nb * 8 + 2 * t + (e & 1), qi = qt * FT + ql;
                bool seen = !edge || (qi < T && qi >= kj[e >> 1]);
                float p = seen ? ex2(st[nb][e] * c - L[ql]) : 0.0f;
                st[nb][e] = p;
                dpt[nb][e] = p * (dpt[nb][e] - D[ql]);
            }
        }
        unsigned fa[4][4];
        acc_to_a(fa, st);
        mm_kn(dva, fa, S[s + 1], lane);
        acc_to_a(fa, dpt);
        mm_kn(dka, fa, S[s], lane);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (kj[r] >= T) continue;
        size_t at = ((size_t)b * T + kj[r]) * ks + kvh * HD;
        size_t atb = ((size_t)b * T + kj[r]) * lddv + kvh * HD;
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

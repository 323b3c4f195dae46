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
// takes a tile of 64 rows; each warp owns 16 of them (flash_fwd128: 128
// rows, 32 a warp). T need not be a multiple of 64: rows past T are loaded
// as zeros and never stored.
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
#define LDS 72 // shared row stride in bf16 values (144 bytes): the 8 rows of an ldmatrix 8x8 matrix fall in 8 distinct 16-byte bank groups
#define TILE (FT * LDS)

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
// instance. With RB > 1, A is RB blocks of 16 rows (block i's fragments
// from a[4 i], its accumulators from acc[NB i]), and each B fragment read
// from shared memory feeds all of them.
template <int NB = 8, int RB = 1>
__device__ __forceinline__ void mm_nk(float (*acc)[4], const unsigned (*a)[4], const bf16* Y, int lane, int n0 = 0) {
    int row = (lane & 7) + (lane >> 4) * 8, col = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
#pragma unroll
        for (int np = 0; np < NB / 2; np++) {
            unsigned b[4];
            ldm4(b, smem_addr(Y + (n0 + np * 16 + row) * LDS + kc * 16 + col));
#pragma unroll
            for (int i = 0; i < RB; i++) {
                mma16816(acc[NB * i + 2 * np], a[4 * i + kc], b[0], b[1]);
                mma16816(acc[NB * i + 2 * np + 1], a[4 * i + kc], b[2], b[3]);
            }
        }
    }
}

// mm_kn adds A (16 x 16 KC) times B (16 KC x 64) into acc (16 x 64), where
// Y holds B as [k][n] (row major) from row k0: P V with Y = V. With RB >
// 1, A is RB blocks of 16 rows (block i's fragments from a[KC i], its
// accumulators from acc[8 i]), as in mm_nk.
template <int KC = 4, int RB = 1>
__device__ __forceinline__ void mm_kn(float (*acc)[4], const unsigned (*a)[4], const bf16* Y, int lane, int k0 = 0) {
    int row = (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 8;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
#pragma unroll
        for (int np = 0; np < 4; np++) {
            unsigned b[4];
            ldm4t(b, smem_addr(Y + (k0 + kc * 16 + row) * LDS + np * 16 + col));
#pragma unroll
            for (int i = 0; i < RB; i++) {
                mma16816(acc[8 * i + 2 * np], a[KC * i + kc], b[0], b[1]);
                mma16816(acc[8 * i + 2 * np + 1], a[KC * i + kc], b[2], b[3]);
            }
        }
    }
}

// fwd_tile takes one 64-key tile (K and V in shared memory, keys from
// key0) through the online softmax for R blocks of 16 of a warp's query
// rows: A fragments qa[4 R] and output accumulators o[8 R], with
// online_softmax's rows, maxima, sums and diagonal.
template <int R>
__device__ __forceinline__ void fwd_tile(float (*o)[4], float* m, float* l, const unsigned (*qa)[4], const bf16* K, const bf16* V,
                                         const int* qi, unsigned diag, int key0, float c, int lane) {
    float s[8 * R][4] = {};
    mm_nk<8, R>(s, qa, K, lane);
    online_softmax<R>(s, o, m, l, qi, diag, key0, c, lane);
    // Block i's probabilities become fragments pa[4 i .. 4 i + 3].
    unsigned pa[4 * R][4];
    acc_to_a<4 * R>(pa, s);
    mm_kn<4, R>(o, pa, V, lane);
}

// Grid (H, B, tiles) (flash.cuh), 128 threads: the last query tiles see
// the most keys, so they are scheduled first. out (fp32) is written only
// when set; outb gets the bf16 copy the output projection and the backward
// pass read.
extern "C" __global__ void flash_fwd(float* out, bf16* outb, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                     int T, int H, int KV, float scale, int ldq, int ldkv) {
    __shared__ alignas(16) bf16 Qs[TILE];
    __shared__ alignas(16) bf16 Ks[2][TILE];
    __shared__ alignas(16) bf16 Vs[2][TILE];
    int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2;
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
        fwd_tile<1>(o, m, l, qa, Ks[cur], Vs[cur], qi, kt == qt, kt * FT, c, lane);
        // The next iteration's copy overwrites the other buffers, which
        // every warp must be done reading.
        __syncthreads();
    }
    fwd_store<1>(out, outb, lse, o, m, l, qi, c, lane, b, h, T, H);
}

// flash_fwd with 128 query rows a block: the same arguments, outputs and
// arithmetic row for row. Grid (H, B, ceil(T / 128)), 128 threads, the
// last query tiles first. Each warp owns two blocks of 16 rows, rows 16 w
// and 64 + 16 w of the tile (w the warp), so every key and value fragment
// read from shared memory feeds four tensor-core products instead of two,
// and each key and value tile is copied from global memory once per 128
// queries. Rows 64 apart also meet the diagonal alike in every warp: of
// query tile qt, key tile 2 qt crosses each warp's first block and lies
// wholly before its second; key tile 2 qt + 1 crosses the second and lies
// wholly after the first, which skips it.
// Four tile buffers, 36 KB: key/value tile j lives in buffers 2 (j & 1),
// 2 (j & 1) + 1, and the 128 queries pass through buffers 2 and 3 (one
// 128-row array) on their way to registers, before key tile 1 is copied
// there. A buffer of their own (54 KB) would leave one block to an SM of
// an RTX 3060 (100 KB) instead of two.
extern "C" __global__ void __launch_bounds__(128, 2) flash_fwd128(float* out, bf16* outb, float* lse, const bf16* q, const bf16* k,
                                                                  const bf16* v, int T, int H, int KV, float scale, int ldq, int ldkv) {
    __shared__ alignas(16) bf16 S[4 * TILE];
    int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2;
    int q0 = qt * 2 * FT, last = 2 * qt + 1;
    const bf16* qb = q + (size_t)b * T * ldq + h * HD;
    const bf16* kb = k + (size_t)b * T * ldkv + kvh * HD;
    const bf16* vb = v + (size_t)b * T * ldkv + kvh * HD;
    load_tile(S + 2 * TILE, qb, ldq, q0, T);
    load_tile(S + 3 * TILE, qb, ldq, q0 + FT, T);
    load_tile(S, kb, ldkv, 0, T);
    load_tile(S + TILE, vb, ldkv, 0, T);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    unsigned qa[8][4];
    frag_a(qa, S + 2 * TILE, r0, lane);
    frag_a(qa + 4, S + 2 * TILE, FT + r0, lane);
    // Key tile 1 is copied over the queries.
    __syncthreads();
    float o[16][4] = {};
    float m[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()}, l[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float c = scale * 1.4426950408889634f; // softmax in base 2
    int qi[4] = {q0 + r0 + g, q0 + r0 + g + 8, q0 + FT + r0 + g, q0 + FT + r0 + g + 8};
    for (int kt = 0; kt <= last; kt++) {
        const bf16* K = S + (kt & 1) * 2 * TILE;
        if (kt < last) {
            bf16* nk = S + ((kt + 1) & 1) * 2 * TILE;
            load_tile(nk, kb, ldkv, (kt + 1) * FT, T);
            load_tile(nk + TILE, vb, ldkv, (kt + 1) * FT, T);
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        if (kt < last)
            fwd_tile<2>(o, m, l, qa, K, K + TILE, qi, kt == last - 1, kt * FT, c, lane);
        else
            fwd_tile<1>(o + 8, m + 2, l + 2, qa + 4, K, K + TILE, qi + 2, 1, kt * FT, c, lane);
        // The next iteration's copy overwrites the other buffers, which
        // every warp must be done reading.
        __syncthreads();
    }
    fwd_store<2>(out, outb, lse, o, m, l, qi, c, lane, b, h, T, H);
}

// dq for one query tile and head: first dvec = rowsum(dout * out) for its
// rows (the term the softmax's backward subtracts; written for flash_bwd_dkv,
// which runs next), then recomputes P and dP = dout v^T over the key tiles
// the queries see, dS = P (dP - dvec), dq = scale dS k. Writes dvec, and dq
// in fp32 (when dq is set) and/or, rotated back by rope, in bf16 (dqb, row
// stride lddq: the query block of the fused projection's gradient, which
// the projection's GEMMs read; rope's inverse then needs no pass of its own).
// Grid (H, B, tiles), the last query tiles first; 128 threads. Five tile
// buffers: the queries, their output gradients and outputs pass through
// buffers 2, 3 and 4 on their way to registers, then key/value tile j lives
// in buffers 2 (j & 1), 2 (j & 1) + 1.
extern "C" __global__ void __launch_bounds__(128, 4) flash_bwd_dq(float* dq, bf16* dqb, float* dvec, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                        const bf16* out, const float* lse, const float* cosT, const float* sinT, int T, int H, int KV,
                                        float scale, int ldq, int ldkv, int lddq) {
    __shared__ alignas(16) bf16 S[5][TILE];
    __shared__ float Dr[FT];
    int qt = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
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
    store_q_grads(dq, dqb, acc, qi, b, h, T, H, lddq, scale, cosT, sinT, lane);
}

// kv_item takes one (query tile, head) item through a key tile's
// backward: the transposed products S^T = K Q^T and dP^T = V dO^T for this
// warp's 16 keys (fragments ka, va) against the 64 queries (Q, dO in
// shared memory, their base-2 log-sum-exp L and dvec D), the probabilities
// P and dS = P (dP - dvec), then dv += P^T dO and dk += dS^T Q. It leaves
// dS^T in fa, as A fragments. The whole 64-query tile at once (about 240
// registers, two blocks to an SM): 32 queries at a time fits three blocks
// but measured 9% slower.
__device__ __forceinline__ void kv_item(float (*dka)[4], float (*dva)[4], unsigned (*fa)[4], const unsigned (*ka)[4],
                                        const unsigned (*va)[4], const bf16* Q, const bf16* dO, const float* L, const float* D,
                                        int qt, int kt, const int* kj, int T, float c, int lane) {
    int t = lane & 3;
    float st[8][4] = {}, dpt[8][4] = {};
    mm_nk(st, ka, Q, lane);
    mm_nk(dpt, va, dO, lane);
    // Only the diagonal tile has queries before keys, and only the last
    // one rows past T.
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
    acc_to_a(fa, st);
    mm_kn(dva, fa, dO, lane);
    acc_to_a(fa, dpt);
    mm_kn(dka, fa, Q, lane);
}

// dk and dv for one key tile and key/value head: loops over the query heads
// of its group and the query tiles that see the keys, so each block owns its
// output and no atomics are needed. Writes dk and dv in fp32 (when dk, dv
// are set) and/or bf16 (dkb rotated back by rope, and dvb; row stride
// lddv: the fused projection's gradient, whose GEMMs read them as column
// blocks). Grid (KV, B, tiles), 128 threads; the first key tiles are seen
// by the most queries and are scheduled first. The keys and values pass through buffers 0 and 1 on
// their way to registers; then (query tile, head) item j has its queries and
// output gradients in buffers 2 (j & 1), 2 (j & 1) + 1 and its log-sum-exp
// and dvec in Ls[j & 1], Dv[j & 1].
extern "C" __global__ void flash_bwd_dkv(float* dk, bf16* dkb, float* dv, bf16* dvb, const bf16* q, const bf16* k, const bf16* v,
                                         const bf16* dout, const float* lse, const float* dvec, const float* cosT, const float* sinT,
                                         int T, int H, int KV, float scale, int ldq, int ldkv, int lddv) {
    __shared__ alignas(16) bf16 S[4][TILE];
    __shared__ float Ls[2][FT], Dv[2][FT];
    int kt = blockIdx.z, nt = gridDim.z, kvh = blockIdx.x, b = blockIdx.y, grp = H / KV;
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2;
    int qs = H * HD;
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
        unsigned fa[4][4];
        kv_item(dka, dva, fa, ka, va, S[s], S[s + 1], Ls[j & 1], Dv[j & 1], qt, kt, kj, T, c, lane);
        __syncthreads();
    }
    store_kv_grads(dk, dkb, dv, dvb, dka, dva, kj, b, kvh, T, KV, lddv, scale, cosT, sinT, lane);
}

// flash_bwd_dvec writes dvec = rowsum(dout * out) for every query row: the
// term the softmax's backward subtracts, which flash_bwd reads. dout and
// out are N H rows of 64 values, one a (token, head), read in order: eight
// threads a row, 16 bytes each of dout and out. Grid ceil(N H / 16), 128
// threads.
extern "C" __global__ void flash_bwd_dvec(float* dvec, const bf16* dout, const bf16* out, int T, int H, int rows) {
    int row = blockIdx.x * 16 + (threadIdx.x >> 3), c = (threadIdx.x & 7) * 8;
    float acc = 0.0f;
    if (row < rows) {
        size_t at = (size_t)row * HD + c;
        uint4 x = *(const uint4*)(dout + at), y = *(const uint4*)(out + at);
        acc = bf_lo(x.x) * bf_lo(y.x) + bf_hi(x.x) * bf_hi(y.x) + bf_lo(x.y) * bf_lo(y.y) + bf_hi(x.y) * bf_hi(y.y) +
              bf_lo(x.z) * bf_lo(y.z) + bf_hi(x.z) * bf_hi(y.z) + bf_lo(x.w) * bf_lo(y.w) + bf_hi(x.w) * bf_hi(y.w);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    if ((threadIdx.x & 7) == 0 && row < rows) {
        int n = row / H, h = row % H, b = n / T, i = n % T;
        dvec[((size_t)b * H + h) * T + i] = acc;
    }
}

// red_add2 adds a pair to p[0], p[1] without waiting for the result.
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// The whole backward in one pass over the (key tile, query tile) pairs:
// flash_bwd_dkv's dk and dv, and dq's products from the same
// probabilities, so P and dP are computed once instead of again by a dq
// kernel. dvec must hold flash_bwd_dvec's rows; flash_bwd_dq_final then
// turns the sums in dqacc into dq.
//
// A query tile's dq sums the products of every key tile up to it, made by
// as many blocks. They go into dqacc (fp32, (B, H, T, 64)) one after the
// other in a fixed order, so the result is the same bits on every run:
// for query tile qt of head h, key tile qt stores its product, then key
// tiles qt - 1, ..., 0 add theirs, each once the one before it has said
// (sem[(b H + h) tiles + qt], which must be zero at launch, holds the key
// tile that added last) that its additions are issued. The additions are
// fire-and-forget reductions. A block takes its query tiles in ascending
// order, so the tile it waits for was added by the next key tile's block
// at least one item earlier: the wait is almost never felt. Blocks are
// numbered with the key tiles in descending order, so the block waited for
// always started first (blocks start in the order of their index) and the
// chain cannot deadlock.
//
// The work is pipelined across items so that one barrier a step suffices:
// step j multiplies item j - 1's dS (kept in shared memory) by the keys and
// adds it to dqacc, then computes item j's probabilities and its dk and dv
// products and leaves its dS for step j + 1; item j + 1's tiles are copied
// meanwhile. The block says its additions of item j - 1 are issued after
// the next step's barrier.
//
// Grid (tiles, KV, B), 128 threads, FLASH_BWD_SMEM bytes of dynamic shared
// memory: the key tile, kept for dS K, two sets of (queries, output
// gradients) buffers and two dS buffers (as [key][query], read back by
// query rows). 64.5 KB: two blocks to an SM need 130 KB of an SM's shared
// memory (an H100 or A100 has it, an RTX 3060 does not).
#define FLASH_BWD_SMEM (7 * TILE * 2)
extern "C" __global__ void __launch_bounds__(128, 2) flash_bwd(float* dk, bf16* dkb, float* dv, bf16* dvb, float* dqacc, int* sem,
                                                               const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                                               const float* lse, const float* dvec, const float* cosT, const float* sinT,
                                                               int T, int H, int KV, float scale, int ldq, int ldkv, int ldd) {
    extern __shared__ __align__(16) bf16 smem[];
    __shared__ float Ls[2][FT], Dv[2][FT];
    bf16* Ks = smem;                 // the key tile
    bf16* QD = smem + TILE;          // item j's queries at QD + 2 (j & 1) TILE, output gradients one tile on
    bf16* DS = smem + 5 * TILE;      // item j's dS at DS + (j & 1) TILE
    int nt = gridDim.x, kt = nt - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, grp = H / KV;
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    int qs = H * HD;
    load_tile(Ks, k + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * FT, T);
    load_tile(QD, v + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * FT, T);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    unsigned ka[4][4], va[4][4];
    frag_a(ka, Ks, r0, lane);
    frag_a(va, QD, r0, lane);
    __syncthreads();
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * FT + r0 + g, kt * FT + r0 + g + 8};
    int items = grp * (nt - kt);
    // Item j is query tile kt + j / grp of head kvh grp + j % grp.
    auto stage = [&](int j) {
        int h = kvh * grp + j % grp, qt = kt + j / grp;
        bf16* Q = QD + (j & 1) * 2 * TILE;
        load_tile(Q, q + (size_t)b * T * ldq + h * HD, ldq, qt * FT, T);
        load_tile(Q + TILE, dout + (size_t)b * T * qs + h * HD, qs, qt * FT, T);
        if (threadIdx.x < FT) {
            int i = qt * FT + threadIdx.x;
            size_t at = ((size_t)b * H + h) * T + i;
            Ls[j & 1][threadIdx.x] = i < T ? lse[at] : 0.0f;
            Dv[j & 1][threadIdx.x] = i < T ? dvec[at] : 0.0f;
        }
    };
    auto semOf = [&](int j) { return sem + ((size_t)b * H + kvh * grp + j % grp) * nt + kt + j / grp; };
    stage(0);
    cp_commit();
    float dka[8][4] = {}, dva[8][4] = {};
    int* done = nullptr; // an item whose additions are issued, to be said after the next barrier
    for (int j = 0;; j++) {
        // Item j's tiles have landed; every warp is done with item j - 1's
        // tiles (which item j + 1's copies overwrite) and has left item
        // j - 1's dS, and every thread's additions before this barrier are
        // issued.
        cp_wait_all();
        __syncthreads();
        if (done && threadIdx.x == 0) st_release(done, kt);
        done = nullptr;
        if (j + 1 < items) stage(j + 1);
        cp_commit();
        if (j > 0) {
            // Item j - 1's dq product for rows r0 .. r0 + 15 of its query
            // tile: dS (queries x keys, read transposed from [key][query])
            // times the keys.
            int p = j - 1, h = kvh * grp + p % grp, qt = kt + p / grp;
            const bf16* Ds = DS + (p & 1) * TILE;
            float dqa[8][4] = {};
            int mi = lane >> 3, key = (mi >> 1) * 8 + (lane & 7), qc = r0 + (mi & 1) * 8;
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                unsigned a[1][4];
                ldm4t(a[0], smem_addr(Ds + (kc * 16 + key) * LDS + qc));
                mm_kn<1>(dqa, a, Ks, lane, kc * 16);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int qi = qt * FT + r0 + g + 8 * r;
                if (qi >= T) continue;
                float* acc = dqacc + (((size_t)b * H + h) * T + qi) * HD + 2 * t;
#pragma unroll
                for (int nb = 0; nb < 8; nb++) {
                    if (kt == qt)
                        __stcg((float2*)(acc + nb * 8), make_float2(dqa[nb][2 * r], dqa[nb][2 * r + 1]));
                    else
                        red_add2(acc + nb * 8, dqa[nb][2 * r], dqa[nb][2 * r + 1]);
                }
            }
            if (kt > 0) done = semOf(p);
        }
        if (j == items) break;
        int qt = kt + j / grp;
        const bf16* Q = QD + (j & 1) * 2 * TILE;
        unsigned fa[4][4];
        kv_item(dka, dva, fa, ka, va, Q, Q + TILE, Ls[j & 1], Dv[j & 1], qt, kt, kj, T, c, lane);
        // dS^T for the next step, each warp its 16 key rows.
        bf16* Ds = DS + (j & 1) * TILE;
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            *(unsigned*)(Ds + (r0 + g) * LDS + kc * 16 + 2 * t) = fa[kc][0];
            *(unsigned*)(Ds + (r0 + g + 8) * LDS + kc * 16 + 2 * t) = fa[kc][1];
            *(unsigned*)(Ds + (r0 + g) * LDS + kc * 16 + 8 + 2 * t) = fa[kc][2];
            *(unsigned*)(Ds + (r0 + g + 8) * LDS + kc * 16 + 8 + 2 * t) = fa[kc][3];
        }
        // The next key tile's block must have added to item j's sum before
        // this block adds, in the next step: one thread waits (almost
        // never), and the barrier there passes the order on.
        if (kt < qt && threadIdx.x == 0) {
            const int* sm = semOf(j);
            while (ld_acquire(sm) != kt + 1) __nanosleep(32);
        }
    }
    __syncthreads();
    if (done && threadIdx.x == 0) st_release(done, kt);
    store_kv_grads(dk, dkb, dv, dvb, dka, dva, kj, b, kvh, T, KV, ldd, scale, cosT, sinT, lane);
}

// flash_bwd_dq_final turns flash_bwd's sums into dq: times scale, in bf16
// rotated back by rope into dqb (row stride ldd: the query block of the
// fused projection's gradient), and in fp32 into dq when set. Sixteen
// threads a row, each the pairs at columns 2 i and 2 i + 32, which rope's
// inverse mixes. Grid (ceil(T / 8), H, B), 128 threads.
extern "C" __global__ void flash_bwd_dq_final(float* dq, bf16* dqb, const float* dqacc, const float* cosT, const float* sinT, int T,
                                              int H, float scale, int ldd) {
    int h = blockIdx.y, b = blockIdx.z;
    int i = blockIdx.x * 8 + (threadIdx.x >> 4), col = (threadIdx.x & 15) * 2;
    if (i >= T) return;
    const float* acc = dqacc + (((size_t)b * H + h) * T + i) * HD;
    float2 x = *(const float2*)(acc + col), y = *(const float2*)(acc + col + HD / 2);
    float xs[2] = {x.x * scale, x.y * scale}, ys[2] = {y.x * scale, y.y * scale};
    const float* ct = cosT + (size_t)i * (HD / 2) + col;
    const float* st = sinT + (size_t)i * (HD / 2) + col;
    float lo[2], hi[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        lo[e] = xs[e] * ct[e] + ys[e] * st[e];
        hi[e] = ys[e] * ct[e] - xs[e] * st[e];
    }
    bf16* row = dqb + ((size_t)b * T + i) * ldd + h * HD;
    *(unsigned*)(row + col) = f2bf2(lo[0], lo[1]);
    *(unsigned*)(row + col + HD / 2) = f2bf2(hi[0], hi[1]);
    if (dq) {
        float* r = dq + ((size_t)b * T + i) * (H * HD) + h * HD;
        r[col] = xs[0];
        r[col + 1] = xs[1];
        r[col + HD / 2] = ys[0];
        r[col + HD / 2 + 1] = ys[1];
    }
}

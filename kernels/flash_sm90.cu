// Flash attention for training on Hopper (sm_90a): the arithmetic of
// flash.cu (causal, grouped-query, head_dim 64, bf16 products with fp32
// accumulation, base-2 online softmax, the same 64-key tiles in the same
// order, the same arguments and outputs) with the products issued as
// warpgroup MMAs (wgmma.mma_async, m64nNk16) instead of mma.sync. A
// warpgroup (4 warps, 128 threads) multiplies 64 rows at once, reading its
// shared-memory operands itself through matrix descriptors, so no ldmatrix
// and far fewer instructions are issued per product. Built only for a
// compute capability 9.0 device; flash.cu stays the path everywhere else.
//
// Tiles live in shared memory as 64 rows of 128 bytes (a row's 64 bf16
// values), in the 128-byte swizzle wgmma reads: row r's 16-byte chunk c at
// r * 128 + 16 (c ^ (r & 7)), every tile on a 1024-byte boundary (where the
// swizzle's pattern starts). One layout serves every operand:
//   - read K-major (no transpose: a row of the tile is a row of A, or a
//     column of B), as Q, K, V and dout are in Q K^T, dout V^T, K Q^T and
//     V dout^T;
//   - read MN-major (transposed B: a row of the tile is a row of B), as V,
//     K, dout and Q are in P V, dS K, P^T dout and dS^T Q.
// A's other operand, the probabilities or dS, comes from registers: the
// accumulator layout of a warp's quarter of a wgmma result is the mma.sync
// layout flash.cuh's helpers use, and acc_to_a turns it into A fragments.
//
// Copies into shared memory are cp.async (generic proxy); wgmma reads
// through the async proxy, so each thread fences the proxies after its
// copies land and before the barrier that lets the products start.

#define SW_TILE 8192 // bytes of a swizzled 64 x 64 bf16 tile

// load_sw starts the copy of rows row0 .. row0 + ROWS - 1 of src (row
// stride in values) into the swizzled tile(s) at shared address dst; rows
// at or past T become zeros. NT threads share the copy, tid this one.
template <int ROWS, int NT>
__device__ __forceinline__ void load_sw(unsigned dst, const bf16* src, int stride, int row0, int T, int tid) {
#pragma unroll
    for (int it = 0; it < ROWS * 8 / NT; it++) {
        int idx = it * NT + tid, r = idx >> 3, c = idx & 7, row = row0 + r;
        int ok = row < T;
        cp_async16(dst + r * 128 + ((c ^ (r & 7)) << 4), src + (size_t)(ok ? row : 0) * stride + c * 8, ok ? 16 : 0);
    }
}

// wg_desc is the matrix descriptor of a swizzled tile (or of its rows from
// a multiple of 8) at shared address addr: 128-byte swizzle, 1024 bytes
// from one 8-row group to the next (the stride byte offset, and the
// leading byte offset, which a K-major swizzled operand ignores and an
// MN-major one 64 wide never reaches). Adding 2 moves a K-major operand 16
// values along k (32 bytes); a row is 8 (128 bytes).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (64ull << 16) | (64ull << 32) | (1ull << 62);
}

// wg_fence orders this thread's register accesses before the wgmma that
// follow; wg_commit closes a group of them; wg_wait waits for all of them.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// wg_hold tells the compiler that NB accumulator blocks change here: an
// accumulator is written by the tensor cores until wg_wait, so no read of
// it may move above the wait.
template <int NB>
__device__ __forceinline__ void wg_hold(float (*d)[4]) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[nb][e])::"memory");
    }
}

// fence_async_smem makes this thread's writes to shared memory visible to
// the async proxy (wgmma's reads).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define WG_D8(d)                                                                                                                   \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
#define WG_D16(d) WG_D8(d), WG_D8((d + 2))
#define WG_D32(d) WG_D16(d), WG_D16((d + 4))

// wg_ss64 adds A (64 x 16, K-major tile at descriptor a) times B (16 x 64,
// K-major at b) into d (64 x 64: the warp's 16 rows as 8 blocks of 16 x 8).
__device__ __forceinline__ void wg_ss64(float (*d)[4], unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_D32(d)
                 : "l"(a), "l"(b));
}

// wg_ss32 is wg_ss64 with B 16 x 32 and d 64 x 32 (4 blocks).
__device__ __forceinline__ void wg_ss32(float (*d)[4], unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"
                 : WG_D16(d)
                 : "l"(a), "l"(b));
}

// wg_rs64t adds A (64 x 16, the warp's 16 rows as mma.sync A fragments a)
// times B (16 x 64, MN-major: the tile's rows are B's rows) into d.
__device__ __forceinline__ void wg_rs64t(float (*d)[4], const unsigned* a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// sw_base is the first 1024-byte boundary in the block's dynamic shared
// memory, which is sized 1024 bytes over what the tiles need.
__device__ __forceinline__ unsigned sw_base(const void* smem) { return (smem_addr(smem) + 1023) & ~1023u; }

// kv_step starts the copy of key/value tile kt + 1 (when kt < last) into
// the other of the two buffers at KVs, waits until tile kt has landed and
// every thread's copies are visible to wgmma, and returns tile kt's key
// tile (its values one tile on). The caller's barrier at the end of an
// iteration keeps the next copy off a tile still being read.
__device__ __forceinline__ unsigned kv_step(unsigned KVs, int kt, int last, const bf16* kb, const bf16* vb, int ldkv, int T, int tid) {
    if (kt < last) {
        unsigned nK = KVs + ((kt + 1) & 1) * 2 * SW_TILE;
        load_sw<64, 128>(nK, kb, ldkv, (kt + 1) * 64, T, tid);
        load_sw<64, 128>(nK + SW_TILE, vb, ldkv, (kt + 1) * 64, T, tid);
    }
    cp_commit();
    cp_wait_prev();
    fence_async_smem();
    __syncthreads();
    return KVs + (kt & 1) * 2 * SW_TILE;
}

// fwd_step is one key tile of the forward: the scores of the warpgroup's
// 64 queries (descriptor dq) against the key tile at shared address K,
// the online softmax (the keys after a query masked where diag is set),
// and P V (the values one tile after the keys) added into o.
__device__ __forceinline__ void fwd_step(float (*o)[4], float* m, float* l, unsigned long long dq, unsigned K, const int* qi, bool diag,
                                         int key0, float c, int lane) {
    float s[8][4] = {};
    const unsigned long long dk = wg_desc(K);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_ss64(s, dq + 2 * kk, dk + 2 * kk);
    wg_commit();
    wg_wait();
    wg_hold<8>(s);
    online_softmax<1>(s, o, m, l, qi, diag, key0, c, lane);
    unsigned pa[4][4];
    acc_to_a<4>(pa, s);
    const unsigned long long dvd = wg_desc(K + SW_TILE);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_rs64t(o, pa[kk], dvd + 128 * kk);
    wg_commit();
    wg_wait();
    wg_hold<8>(o);
}

// The forward: flash_fwd's grid, arguments and outputs. Grid (H, B,
// ceil(T / 64)), 128 threads (one warpgroup), FLASH_H_FWD_SMEM bytes of
// dynamic shared memory: the block's 64 queries and two buffers of a key and
// a value tile. One warpgroup a block, so that four blocks share an SM and
// go through their products and their softmax out of step (two warpgroups a
// block of 128 queries, which share each key tile's copy but meet at every
// barrier, were 7% slower: docs/benchmarks/cuda.md).
#define FLASH_H_FWD_SMEM (5 * SW_TILE + 1024)
// fwd_tile_loop runs query tile qt's forward over key tiles 0 .. qt, once
// its queries are at Qs (copied or on their way: kv, given kt, returns key
// tile kt's shared address once it has landed, and starts the next copy),
// and writes out, outb and lse. A barrier ends each step: the next step's
// copy overwrites the other buffers.
template <class KV>
__device__ __forceinline__ void fwd_tile_loop(int qt, unsigned Qs, float* out, bf16* outb, float* lse, int T, int H, float scale, KV kv) {
    int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, g = lane >> 2;
    float o[8][4] = {};
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    const float c = scale * 1.4426950408889634f; // softmax in base 2
    int qi[2] = {qt * 64 + r0 + g, qt * 64 + r0 + g + 8};
    const unsigned long long dq = wg_desc(Qs);
    for (int kt = 0; kt <= qt; kt++) {
        fwd_step(o, m, l, dq, kv(kt), qi, kt == qt, kt * 64, c, lane);
        __syncthreads();
    }
    fwd_store<1>(out, outb, lse, o, m, l, qi, c, lane, b, h, T, H);
}
__device__ __forceinline__ void fwd_h_tile(int qt, unsigned char* smem_h, float* out, bf16* outb, float* lse, const bf16* q,
                                           const bf16* k, const bf16* v, int T, int H, int KV, float scale, int ldq, int ldkv) {
    unsigned Qs = sw_base(smem_h), KVs = Qs + SW_TILE; // key tile j at KVs + 2 SW_TILE (j & 1), its values one tile on
    int h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int tid = threadIdx.x;
    const bf16* kb = k + (size_t)b * T * ldkv + kvh * HD;
    const bf16* vb = v + (size_t)b * T * ldkv + kvh * HD;
    load_sw<64, 128>(Qs, q + (size_t)b * T * ldq + h * HD, ldq, qt * 64, T, tid);
    load_sw<64, 128>(KVs, kb, ldkv, 0, T, tid);
    load_sw<64, 128>(KVs + SW_TILE, vb, ldkv, 0, T, tid);
    cp_commit();
    fwd_tile_loop(qt, Qs, out, outb, lse, T, H, scale, [&](int kt) { return kv_step(KVs, kt, qt, kb, vb, ldkv, T, tid); });
}

// TmaMap is a CUtensorMap, made on the host (cuda.TensorMap) and passed by
// value as a `const __grid_constant__ TmaMap` parameter, whose address the
// tensor copies take.
struct __align__(64) TmaMap {
    unsigned long long v[16];
};

// mbar_init readies the mbarrier at shared address bar for count arrivals;
// mbar_expect arrives on it and adds bytes to the transaction count that
// must land before its phase completes; mbar_try says whether the phase of
// the given parity has completed.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try(unsigned bar, unsigned parity) {
    unsigned ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}

// tma_load3 copies the box at coordinates (c0, c1, c2) of the map's tensor
// (innermost first) into shared memory at dst, in the map's swizzle,
// counting its bytes on the mbarrier bar; elements outside the tensor
// arrive as zeros.
__device__ __forceinline__ void tma_load3(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :
                 : "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}

// tma_bars readies a block's two mbarriers (one arrival each: the thread
// that starts the copies) and makes them visible before any copy.
__device__ __forceinline__ void tma_bars(unsigned bars) {
    if (threadIdx.x == 0) {
        mbar_init(bars, 1);
        mbar_init(bars + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// kv_step_tma is kv_step with the tensor memory accelerator's copies: it
// starts the copy of key/value tile kt + 1 (when kt < last) into the other
// of the two buffers at KVs, counted on that buffer's mbarrier (bars + 8
// its index), waits for tile kt's unless have (the caller waited for it),
// and returns tile kt's key tile. Bit i of phase is the parity of mbarrier
// i's next phase. The other buffer was last read before the barrier that
// ended the caller's step before.
__device__ __forceinline__ unsigned kv_step_tma(unsigned KVs, unsigned bars, unsigned& phase, int kt, int last, bool have,
                                                const TmaMap* qkv, int kc, int vc, int b, int tid) {
    int s = kt & 1;
    if (kt < last && tid == 0) {
        unsigned nb = bars + 8 * (s ^ 1), nK = KVs + (s ^ 1) * 2 * SW_TILE;
        mbar_expect(nb, 2 * SW_TILE);
        tma_load3(nK, qkv, kc, (kt + 1) * 64, b, nb);
        tma_load3(nK + SW_TILE, qkv, vc, (kt + 1) * 64, b, nb);
    }
    if (!have) {
        while (!mbar_try(bars + 8 * s, phase >> s & 1)) {
        }
        phase ^= 1u << s;
    }
    return KVs + s * 2 * SW_TILE;
}

// The forward with its tiles copied by the tensor memory accelerator
// (flash_fwd_ht): flash_fwd_h's grid, tiles, arithmetic and outputs, the
// same bits, but each tile is one copy one thread issues, described by
// qkv (the fused projection as a (B, T, P) bf16 tensor, boxes of 64
// columns by 64 rows in the 128-byte swizzle) instead of 32 cp.async a
// thread and their addresses; the block waits on an mbarrier a buffer.
// qcol, kcol and vcol are the first columns of the queries, keys and
// values in qkv. FLASH_H_FWD_SMEM bytes of dynamic shared memory.
__device__ __forceinline__ void fwd_ht_tile(int qt, unsigned char* smem_h, unsigned bars, unsigned& phase, float* out, bf16* outb,
                                            float* lse, const TmaMap* qkv, int qcol, int kcol, int vcol, int T, int H, int KV,
                                            float scale) {
    unsigned Qs = sw_base(smem_h), KVs = Qs + SW_TILE; // key tile j at KVs + 2 SW_TILE (j & 1), its values one tile on
    int h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int tid = threadIdx.x;
    int kc = kcol + kvh * HD, vc = vcol + kvh * HD;
    if (tid == 0) {
        mbar_expect(bars, 3 * SW_TILE);
        tma_load3(Qs, qkv, qcol + h * HD, qt * 64, b, bars);
        tma_load3(KVs, qkv, kc, 0, b, bars);
        tma_load3(KVs + SW_TILE, qkv, vc, 0, b, bars);
    }
    fwd_tile_loop(qt, Qs, out, outb, lse, T, H, scale,
                  [&](int kt) { return kv_step_tma(KVs, bars, phase, kt, qt, false, qkv, kc, vc, b, tid); });
}

// A causal tile's work grows with its index, and blocks start in index
// order. With a grid of ceil(T / 64) blocks along z (flash.cuh), block z
// takes the query tile T / 64 - 1 - z, so the longest start first. With
// half as many (rounded up), block z takes the pair of tiles T / 64 - 1 - z
// and z, the same work for every block, so no wave ends on a long tile:
// most of all at small batches, whose blocks nearly all start at once
// (flashPairs chooses).
__device__ __forceinline__ bool tile_pair(int T, int* first, int* second) {
    int nq = (T + 63) / 64, x = blockIdx.z;
    *first = nq - 1 - x;
    *second = (int)gridDim.z < nq && x < nq - 1 - x ? x : -1;
    return *second >= 0;
}

// each_tile runs tile on the block's query tile, or on its pair (tile_pair)
// one after the other with a barrier between. One copy of the tile's code
// for both (not unrolled): two inlined copies may contract their
// multiply-adds differently, and a tile's results would then depend on its
// place in the pair.
template <class F>
__device__ __forceinline__ void each_tile(int T, F tile) {
    int first, second, n = tile_pair(T, &first, &second) ? 2 : 1;
#pragma unroll 1
    for (int i = 0; i < n; i++) {
        if (i > 0) __syncthreads();
        tile(i == 0 ? first : second);
    }
}

extern "C" __global__ void __launch_bounds__(128, 4) flash_fwd_h(float* out, bf16* outb, float* lse, const bf16* q, const bf16* k,
                                                                 const bf16* v, int T, int H, int KV, float scale, int ldq, int ldkv) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    each_tile(T, [&](int qt) { fwd_h_tile(qt, smem_h, out, outb, lse, q, k, v, T, H, KV, scale, ldq, ldkv); });
}

extern "C" __global__ void __launch_bounds__(128, 4) flash_fwd_ht(float* out, bf16* outb, float* lse, const __grid_constant__ TmaMap qkv,
                                                                  int qcol, int kcol, int vcol, int T, int H, int KV, float scale) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ __align__(8) unsigned long long bar[2];
    unsigned bars = smem_addr(bar), phase = 0;
    tma_bars(bars);
    each_tile(T, [&](int qt) { fwd_ht_tile(qt, smem_h, bars, phase, out, outb, lse, &qkv, qcol, kcol, vcol, T, H, KV, scale); });
}

// pair_issue issues, as one group, the two 64 x 32 products both sides of
// the backward start from: x = A1 B1^T and y = A2 B2^T, where A1 and A2 are
// the warpgroup's 64-row tiles (descriptors a1, a2) and B1, B2 rows n0 ..
// n0 + 31 of the tile at shared address B and of the tile after it. For dq
// that is S = Q K^T and dP = dout V^T (B the key tile, its values after
// it); for dk and dv, S^T = K Q^T and dP^T = V dout^T (B the queries, their
// output gradients after them).
__device__ __forceinline__ void pair_issue(float (*x)[4], float (*y)[4], unsigned long long a1, unsigned long long a2, unsigned B, int n0) {
    const unsigned long long b1 = wg_desc(B + n0 * 128), b2 = wg_desc(B + SW_TILE + n0 * 128);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_ss32(x, a1 + 2 * kk, b1 + 2 * kk);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_ss32(y, a2 + 2 * kk, b2 + 2 * kk);
    wg_commit();
}

// dq_ds forms dS = P (dP - dvec) for 32 keys from key0 (S and dP in s and
// dp; rows' log-sum-exp lr and dvec dr; keys past a query masked on the
// diagonal tile) as A fragments sa.
__device__ __forceinline__ void dq_ds(unsigned (*sa)[4], float (*s)[4], float (*dp)[4], bool diag, int key0, const int* qi, const float* lr,
                                      const float* dr, float c, int t) {
#pragma unroll
    for (int nb = 0; nb < 4; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e >> 1;
            bool masked = diag && key0 + nb * 8 + 2 * t + (e & 1) > qi[r];
            float p = masked ? 0.0f : ex2(s[nb][e] * c - lr[r]);
            s[nb][e] = p * (dp[nb][e] - dr[r]);
        }
    }
    acc_to_a<2>(sa, s);
}

// dq: flash_bwd_dq's grid, products and outputs, dvec = rowsum(dout *
// out) included (written for flash_bwd_dkv_h, which runs next). Grid
// (H, B, ceil(T / 64)), 128 threads, FLASH_H_DQ_SMEM bytes of dynamic
// shared memory: the block's queries and output gradients and two buffers
// of a key and a value tile; the block's outputs pass through the second
// buffer's key tile on their way to dvec. A key tile goes in two halves of
// 32 keys, at 96 registers a thread. (Issuing both halves' products at
// once, so that one half's dS is formed while the tensor cores work on the
// other's, measured no faster; nor did it in flash_bwd_dkv_h.)
#define FLASH_H_DQ_SMEM (6 * SW_TILE + 1024)
// dq_dvec writes dvec = rowsum(dout * out) for the query tile qt, from the
// swizzled tiles of dout at D and of the outputs at Y (generic pointers),
// into Dr (the block's 64 rows) and dvec: two threads a row, 32 columns
// each, summed in flash_bwd_dq's order from the bf16 copies the products
// read.
__device__ __forceinline__ void dq_dvec(const unsigned char* D, const unsigned char* Y, float* Dr, float* dvec, int qt, int b, int h, int T,
                                        int H, int tid) {
    int row = tid >> 1, c0 = (tid & 1) * 4;
    float acc = 0.0f;
#pragma unroll
    for (int cc = 0; cc < 4; cc++) {
        int at = row * 128 + (((c0 + cc) ^ (row & 7)) << 4);
        uint4 a = *(const uint4*)(D + at), o = *(const uint4*)(Y + at);
        acc += bf_lo(a.x) * bf_lo(o.x) + bf_hi(a.x) * bf_hi(o.x);
        acc += bf_lo(a.y) * bf_lo(o.y) + bf_hi(a.y) * bf_hi(o.y);
        acc += bf_lo(a.z) * bf_lo(o.z) + bf_hi(a.z) * bf_hi(o.z);
        acc += bf_lo(a.w) * bf_lo(o.w) + bf_hi(a.w) * bf_hi(o.w);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if ((tid & 1) == 0) {
        Dr[row] = acc;
        int i = qt * 64 + row;
        if (i < T) dvec[((size_t)b * H + h) * T + i] = acc;
    }
}

// dq_step adds key tile kt's products to the query tile's dq (acc): for
// each half of the tile's 64 keys (at shared address K, its values a tile
// on), S and dP (pair_issue), dS (dq_ds), then dS K.
__device__ __forceinline__ void dq_step(float (*acc)[4], unsigned long long dqd, unsigned long long ddo, unsigned K, int kt, int qt,
                                        const int* qi, const float* lr, const float* dr, float c, int t) {
    const unsigned long long dk = wg_desc(K);
#pragma unroll 1
    for (int n0 = 0; n0 < 64; n0 += 32) {
        float s[4][4] = {}, dp[4][4] = {};
        wg_fence();
        pair_issue(s, dp, dqd, ddo, K, n0);
        wg_wait();
        wg_hold<4>(s);
        wg_hold<4>(dp);
        unsigned sa[2][4];
        dq_ds(sa, s, dp, kt == qt, kt * 64 + n0, qi, lr, dr, c, t);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 2; kk++) wg_rs64t(acc, sa[kk], dk + 8 * n0 + 128 * kk);
        wg_commit();
        wg_wait();
        wg_hold<8>(acc);
    }
}

// dq_prepare computes the query tile's dvec (dq_dvec) from its output
// gradients and outputs, which the block copied into the tiles after its
// queries (Qs) and at the second key buffer, then reads the log-sum-exp lr
// and dvec dr of a warp's two rows qi (from row rr of Dr; rows past T have
// zero queries and gradients, so any finite values do). Its barrier frees
// the outputs' tile for the next key tile.
__device__ __forceinline__ void dq_prepare(float* lr, float* dr, const unsigned char* smem_h, unsigned Qs, float* Dr, float* dvec,
                                           const float* lse, const int* qi, int qt, int b, int h, int T, int H, int tid, int rr) {
    const unsigned char* sm = smem_h + (Qs - smem_addr(smem_h));
    dq_dvec(sm + SW_TILE, sm + 4 * SW_TILE, Dr, dvec, qt, b, h, T, H, tid);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lr[r] = qi[r] < T ? lse[((size_t)b * H + h) * T + qi[r]] : 0.0f;
        dr[r] = Dr[rr + 8 * r];
    }
}

// dq_tile_loop runs query tile qt's dq once its queries, output gradients
// and outputs are in shared memory (dq_prepare says where) and key tile 0
// is copied or on its way: dvec, then the products over key tiles 0 .. qt
// (kv, given kt, returns key tile kt's shared address once it has landed,
// and starts the next copy), a barrier ending each step (the next step's
// copy overwrites the other buffers), then dq.
template <class KV>
__device__ __forceinline__ void dq_tile_loop(int qt, unsigned char* smem_h, float* Dr, float* dq, bf16* dqb, float* dvec, const float* lse,
                                             const float* cosT, const float* sinT, int T, int H, float scale, int lddq, KV kv) {
    unsigned Qs = sw_base(smem_h), Ds = Qs + SW_TILE;
    int h = blockIdx.x, b = blockIdx.y;
    int tid = threadIdx.x, lane = tid & 31, r0 = (tid >> 5) * 16, g = lane >> 2, t = lane & 3;
    const float c = scale * 1.4426950408889634f;
    int qi[2] = {qt * 64 + r0 + g, qt * 64 + r0 + g + 8};
    float lr[2], dr[2];
    dq_prepare(lr, dr, smem_h, Qs, Dr, dvec, lse, qi, qt, b, h, T, H, tid, r0 + g);
    const unsigned long long dqd = wg_desc(Qs), ddo = wg_desc(Ds);
    float acc[8][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        dq_step(acc, dqd, ddo, kv(kt), kt, qt, qi, lr, dr, c, t);
        __syncthreads();
    }
    store_q_grads(dq, dqb, acc, qi, b, h, T, H, lddq, scale, cosT, sinT, lane);
}

__device__ __forceinline__ void dq_h_tile(int qt, unsigned char* smem_h, float* Dr, float* dq, bf16* dqb, float* dvec, const bf16* q,
                                          const bf16* k, const bf16* v, const bf16* dout, const bf16* out, const float* lse,
                                          const float* cosT, const float* sinT, int T, int H, int KV, float scale, int ldq, int ldkv,
                                          int lddq) {
    unsigned Qs = sw_base(smem_h), Ds = Qs + SW_TILE, KVs = Qs + 2 * SW_TILE;
    int h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int tid = threadIdx.x, qs = H * HD;
    const bf16* kb = k + (size_t)b * T * ldkv + kvh * HD;
    const bf16* vb = v + (size_t)b * T * ldkv + kvh * HD;
    load_sw<64, 128>(Qs, q + (size_t)b * T * ldq + h * HD, ldq, qt * 64, T, tid);
    load_sw<64, 128>(Ds, dout + (size_t)b * T * qs + h * HD, qs, qt * 64, T, tid);
    load_sw<64, 128>(KVs, kb, ldkv, 0, T, tid);
    load_sw<64, 128>(KVs + SW_TILE, vb, ldkv, 0, T, tid);
    load_sw<64, 128>(KVs + 2 * SW_TILE, out + (size_t)b * T * qs + h * HD, qs, qt * 64, T, tid);
    cp_commit();
    cp_wait_all();
    __syncthreads();
    dq_tile_loop(qt, smem_h, Dr, dq, dqb, dvec, lse, cosT, sinT, T, H, scale, lddq,
                 [&](int kt) { return kv_step(KVs, kt, qt, kb, vb, ldkv, T, tid); });
}

// The grid as flash_fwd_h's: a tile a block, or a pair (tile_pair).
extern "C" __global__ void __launch_bounds__(128, 4) flash_bwd_dq_h(float* dq, bf16* dqb, float* dvec, const bf16* q, const bf16* k,
                                                                    const bf16* v, const bf16* dout, const bf16* out, const float* lse,
                                                                    const float* cosT, const float* sinT, int T, int H, int KV, float scale,
                                                                    int ldq, int ldkv, int lddq) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ float Dr[64];
    each_tile(T, [&](int qt) { dq_h_tile(qt, smem_h, Dr, dq, dqb, dvec, q, k, v, dout, out, lse, cosT, sinT, T, H, KV, scale, ldq, ldkv,
                  lddq); });
}

// flash_bwd_dq_ht is flash_bwd_dq_h with its tiles copied by the tensor
// memory accelerator: the queries and keys/values from qkv (the fused
// projection, (B, T, P), kcol and vcol the first columns of the keys and
// values), the output gradients from dy and the outputs from y (both (B, T,
// H 64)); the same arithmetic and bits. One mbarrier a buffer.
__device__ __forceinline__ void dq_ht_tile(int qt, unsigned char* smem_h, float* Dr, unsigned bars, unsigned& phase, float* dq, bf16* dqb,
                                           float* dvec, const TmaMap* qkv, const TmaMap* dy, const TmaMap* y, int kcol, int vcol,
                                           const float* lse, const float* cosT, const float* sinT, int T, int H, int KV, float scale,
                                           int lddq) {
    unsigned Qs = sw_base(smem_h), Ds = Qs + SW_TILE, KVs = Qs + 2 * SW_TILE;
    int h = blockIdx.x, b = blockIdx.y, kvh = h / (H / KV);
    int tid = threadIdx.x;
    int kc = kcol + kvh * HD, vc = vcol + kvh * HD;
    if (tid == 0) {
        mbar_expect(bars, 5 * SW_TILE);
        tma_load3(Qs, qkv, h * HD, qt * 64, b, bars);
        tma_load3(Ds, dy, h * HD, qt * 64, b, bars);
        tma_load3(KVs, qkv, kc, 0, b, bars);
        tma_load3(KVs + SW_TILE, qkv, vc, 0, b, bars);
        tma_load3(KVs + 2 * SW_TILE, y, h * HD, qt * 64, b, bars);
    }
    while (!mbar_try(bars, phase & 1)) {
    }
    phase ^= 1u;
    // Key tile 0 came with the queries, waited for before dvec.
    dq_tile_loop(qt, smem_h, Dr, dq, dqb, dvec, lse, cosT, sinT, T, H, scale, lddq,
                 [&](int kt) { return kv_step_tma(KVs, bars, phase, kt, qt, kt == 0, qkv, kc, vc, b, tid); });
}

extern "C" __global__ void __launch_bounds__(128, 4)
    flash_bwd_dq_ht(float* dq, bf16* dqb, float* dvec, const __grid_constant__ TmaMap qkv, const __grid_constant__ TmaMap dy,
                    const __grid_constant__ TmaMap y, int kcol, int vcol, const float* lse, const float* cosT, const float* sinT, int T, int H,
                    int KV, float scale, int lddq) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ float Dr[64];
    __shared__ __align__(8) unsigned long long bar[2];
    unsigned bars = smem_addr(bar), phase = 0;
    tma_bars(bars);
    each_tile(T, [&](int qt) { dq_ht_tile(qt, smem_h, Dr, bars, phase, dq, dqb, dvec, &qkv, &dy, &y, kcol, vcol, lse, cosT, sinT, T, H, KV,
                   scale, lddq); });
}

// dkv_p forms P^T and dS^T = P^T (dP^T - dvec) for queries n0 .. n0 + 31
// (their log-sum-exp and dvec in L and D, read in pairs) as A fragments pa
// and sa, and issues dv += P^T dout and dk += dS^T Q as one group.
__device__ __forceinline__ void dkv_p(float (*dka)[4], float (*dva)[4], unsigned (*pa)[4], unsigned (*sa)[4], float (*st)[4], float (*dpt)[4],
                                      unsigned Q, int n0, int qt, bool edge, const int* kj, const float* L, const float* D, int T, float c,
                                      int t) {
#pragma unroll
    for (int nb = 0; nb < 4; nb++) {
        int ql = n0 + nb * 8 + 2 * t;
        float2 l2 = *(const float2*)(L + ql), d2 = *(const float2*)(D + ql);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int qi = qt * 64 + ql + (e & 1);
            bool seen = !edge || (qi < T && qi >= kj[e >> 1]);
            float p = seen ? ex2(st[nb][e] * c - ((e & 1) ? l2.y : l2.x)) : 0.0f;
            st[nb][e] = p;
            dpt[nb][e] = p * (dpt[nb][e] - ((e & 1) ? d2.y : d2.x));
        }
    }
    acc_to_a<2>(pa, st);
    acc_to_a<2>(sa, dpt);
    const unsigned long long dq = wg_desc(Q + n0 * 128), ddo = wg_desc(Q + SW_TILE + n0 * 128);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 2; kk++) wg_rs64t(dva, pa[kk], ddo + 128 * kk);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) wg_rs64t(dka, sa[kk], dq + 128 * kk);
    wg_commit();
}

// stage_item starts the copies of one (head h, query tile qt) item of the
// dk/dv loop into Q (its queries, their output gradients a tile on) and
// reads its rows' log-sum-exp and dvec into L and D (zeros past T).
__device__ __forceinline__ void stage_item(unsigned Q, float* L, float* D, int h, int qt, int b, const bf16* q, const bf16* dout,
                                           const float* lse, const float* dvec, int T, int H, int ldq, int tid) {
    load_sw<64, 128>(Q, q + (size_t)b * T * ldq + h * HD, ldq, qt * 64, T, tid);
    load_sw<64, 128>(Q + SW_TILE, dout + (size_t)b * T * (H * HD) + h * HD, H * HD, qt * 64, T, tid);
    if (tid < 64) {
        int i = qt * 64 + tid;
        size_t at = ((size_t)b * H + h) * T + i;
        L[tid] = i < T ? lse[at] : 0.0f;
        D[tid] = i < T ? dvec[at] : 0.0f;
    }
}

// dkv_item adds one (head, query tile qt) item's products into dk and dv
// (dka, dva) for the block's key tile kt: for each half of the item's 64
// queries (at Q, their output gradients a tile on; log-sum-exp and dvec in
// L and D), S^T and dP^T (pair_issue), then P^T, dS^T and the two products
// (dkv_p). With ds set it also leaves dS^T there, as [key][query], for the
// one-pass backward's dq (store_ds).
__device__ __forceinline__ void dkv_item(float (*dka)[4], float (*dva)[4], unsigned long long dkd, unsigned long long dvd, unsigned Q,
                                         int qt, int kt, const int* kj, const float* L, const float* D, int T, float c, int row, int t,
                                         unsigned char* ds);

// dk and dv: flash_bwd_dkv's grid, products and outputs. Grid (KV, B,
// ceil(T / 64)), 128 threads, FLASH_H_DKV_SMEM bytes of dynamic shared
// memory: the block's keys and values and two buffers of a (query tile,
// head) item's queries and output gradients. Items run over the group's
// heads, then the query tiles from kt, as flash_bwd_dkv's do; 32 queries at
// a time.
#define FLASH_H_DKV_SMEM (6 * SW_TILE + 1024)
extern "C" __global__ void __launch_bounds__(128, 4) flash_bwd_dkv_h(float* dk, bf16* dkb, float* dv, bf16* dvb, const bf16* q,
                                                                     const bf16* k, const bf16* v, const bf16* dout, const float* lse,
                                                                     const float* dvec, const float* cosT, const float* sinT, int T, int H,
                                                                     int KV, float scale, int ldq, int ldkv, int lddv) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ __align__(8) float Ls[2][64], Dv[2][64];
    unsigned Ks = sw_base(smem_h), Vs = Ks + SW_TILE, QD = Ks + 2 * SW_TILE; // item j's queries at QD + 2 SW_TILE (j & 1), output gradients one tile on
    int kt = blockIdx.z, kvh = blockIdx.x, b = blockIdx.y, grp = H / KV;
    int tid = threadIdx.x, lane = tid & 31, r0 = (tid >> 5) * 16, g = lane >> 2, t = lane & 3;
    int nq = (T + 63) / 64, per = nq - kt, items = grp * per;
    load_sw<64, 128>(Ks, k + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * 64, T, tid);
    load_sw<64, 128>(Vs, v + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * 64, T, tid);
    // stage starts item j's copies into buffer set j & 1.
    auto stage = [&](int j) {
        stage_item(QD + (j & 1) * 2 * SW_TILE, Ls[j & 1], Dv[j & 1], kvh * grp + j / per, kt + j % per, b, q, dout, lse, dvec, T, H, ldq,
                   tid);
    };
    stage(0);
    cp_commit();
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * 64 + r0 + g, kt * 64 + r0 + g + 8};
    const unsigned long long dkd = wg_desc(Ks), dvd = wg_desc(Vs);
    float dka[8][4] = {}, dva[8][4] = {};
    for (int j = 0; j < items; j++) {
        int qt = kt + j % per;
        if (j + 1 < items) stage(j + 1);
        cp_commit();
        cp_wait_prev();
        fence_async_smem();
        __syncthreads();
        dkv_item(dka, dva, dkd, dvd, QD + (j & 1) * 2 * SW_TILE, qt, kt, kj, Ls[j & 1], Dv[j & 1], T, c, r0 + g, t, nullptr);
        __syncthreads();
    }
    store_kv_grads(dk, dkb, dv, dvb, dka, dva, kj, b, kvh, T, KV, lddv, scale, cosT, sinT, lane);
}

// flash_bwd_dkv_ht is flash_bwd_dkv_h with its tiles copied by the tensor
// memory accelerator (the maps as flash_bwd_dq_ht's): the same items in
// the same order, the same bits. An item's copies are counted on the
// mbarrier of its buffer set; its log-sum-exp and dvec are read by the
// threads, seen by all after the barrier that ends the step before.
extern "C" __global__ void __launch_bounds__(128, 4)
    flash_bwd_dkv_ht(float* dk, bf16* dkb, float* dv, bf16* dvb, const __grid_constant__ TmaMap qkv, const __grid_constant__ TmaMap dy,
                     int kcol, int vcol, const float* lse, const float* dvec, const float* cosT, const float* sinT, int T, int H, int KV,
                     float scale, int lddv) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ __align__(8) float Ls[2][64], Dv[2][64];
    __shared__ __align__(8) unsigned long long bar[2];
    unsigned bars = smem_addr(bar), phase = 0;
    tma_bars(bars);
    unsigned Ks = sw_base(smem_h), Vs = Ks + SW_TILE, QD = Ks + 2 * SW_TILE; // item j's queries at QD + 2 SW_TILE (j & 1), output gradients one tile on
    int kt = blockIdx.z, kvh = blockIdx.x, b = blockIdx.y, grp = H / KV;
    int tid = threadIdx.x, lane = tid & 31, r0 = (tid >> 5) * 16, g = lane >> 2, t = lane & 3;
    int nq = (T + 63) / 64, per = nq - kt, items = grp * per;
    // stage starts item j's copies into buffer set j & 1 (with the keys and
    // values for item 0) and reads its rows' log-sum-exp and dvec.
    auto stage = [&](int j) {
        int h = kvh * grp + j / per, qt = kt + j % per;
        unsigned Q = QD + (j & 1) * 2 * SW_TILE, mb = bars + 8 * (j & 1);
        if (tid == 0) {
            mbar_expect(mb, (j == 0 ? 4 : 2) * SW_TILE);
            if (j == 0) {
                tma_load3(Ks, &qkv, kcol + kvh * HD, kt * 64, b, mb);
                tma_load3(Vs, &qkv, vcol + kvh * HD, kt * 64, b, mb);
            }
            tma_load3(Q, &qkv, h * HD, qt * 64, b, mb);
            tma_load3(Q + SW_TILE, &dy, h * HD, qt * 64, b, mb);
        }
        if (tid < 64) {
            int i = qt * 64 + tid;
            size_t at = ((size_t)b * H + h) * T + i;
            Ls[j & 1][tid] = i < T ? lse[at] : 0.0f;
            Dv[j & 1][tid] = i < T ? dvec[at] : 0.0f;
        }
    };
    stage(0);
    __syncthreads();
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * 64 + r0 + g, kt * 64 + r0 + g + 8};
    const unsigned long long dkd = wg_desc(Ks), dvd = wg_desc(Vs);
    float dka[8][4] = {}, dva[8][4] = {};
    for (int j = 0; j < items; j++) {
        if (j + 1 < items) stage(j + 1);
        while (!mbar_try(bars + 8 * (j & 1), phase >> (j & 1) & 1)) {
        }
        phase ^= 1u << (j & 1);
        dkv_item(dka, dva, dkd, dvd, QD + (j & 1) * 2 * SW_TILE, kt + j % per, kt, kj, Ls[j & 1], Dv[j & 1], T, c, r0 + g, t, nullptr);
        // The next step's copies overwrite this item's buffers.
        __syncthreads();
    }
    store_kv_grads(dk, dkb, dv, dvb, dka, dva, kj, b, kvh, T, KV, lddv, scale, cosT, sinT, lane);
}

// wg_ss64tt adds A (64 x 16) times B (16 x 64) into d, both read MN-major
// from swizzled tiles: A's tile holds its columns as rows (a row of the
// tile is a k of A), B's its rows (a row of the tile is a k of B).
__device__ __forceinline__ void wg_ss64tt(float (*d)[4], unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 1, 1;\n}\n"
                 : WG_D32(d)
                 : "l"(a), "l"(b));
}

// store_ds writes a warp's dS^T A fragments sa (its 16 key rows from row,
// queries n0 .. n0 + 31) into the swizzled tile at ds, as [key][query]:
// the next step reads the tile MN-major as dS, the A of dS K.
__device__ __forceinline__ void store_ds(unsigned char* ds, const unsigned (*sa)[4], int row, int n0, int t) {
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = row + (e & 1) * 8, col = n0 + kk * 16 + (e >> 1) * 8 + 2 * t;
            *(unsigned*)(ds + r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2) = sa[kk][e];
        }
    }
}

// bulk_store and bulk_add copy, or add (fp32), bytes from shared address
// src to global dst as one asynchronous bulk operation of this thread's
// group; bulk_commit closes the group; bulk_wait waits until this thread's
// bulk operations are complete (their sources read, their writes done).
__device__ __forceinline__ void bulk_store(float* dst, unsigned src, int bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_add(float* dst, unsigned src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// fence_async_global orders this thread's global accesses through the
// generic proxy (the semaphores) with those through the async proxy (the
// bulk operations), both ways.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

__device__ __forceinline__ void dkv_item(float (*dka)[4], float (*dva)[4], unsigned long long dkd, unsigned long long dvd, unsigned Q,
                                         int qt, int kt, const int* kj, const float* L, const float* D, int T, float c, int row, int t,
                                         unsigned char* ds) {
    // Only the diagonal tile has queries before keys, and only the last
    // one rows past T.
    bool edge = qt == kt || (qt + 1) * 64 > T;
#pragma unroll 1
    for (int n0 = 0; n0 < 64; n0 += 32) {
        float st[4][4] = {}, dpt[4][4] = {};
        unsigned pa[2][4], sa[2][4];
        wg_fence();
        pair_issue(st, dpt, dkd, dvd, Q, n0);
        wg_wait();
        wg_hold<4>(st);
        wg_hold<4>(dpt);
        dkv_p(dka, dva, pa, sa, st, dpt, Q, n0, qt, edge, kj, L, D, T, c, t);
        if (ds) store_ds(ds, sa, row, n0, t);
        wg_wait();
        wg_hold<8>(dva);
        wg_hold<8>(dka);
    }
}

// flash_bwd_h is flash_bwd on Hopper: the whole backward in one pass over
// the (key tile, query tile) pairs, flash_bwd_dkv_h's dk and dv and, from
// the same dS, dq's products, summed across blocks in a fixed order into
// dqacc (fp32, (B, H, T, 64)) for flash_bwd_dq_final. It does five products
// a pair where flash_bwd_dq_h and flash_bwd_dkv_h do seven. dvec must hold
// flash_bwd_dvec's rows.
//
// The order of a query tile's dq sum: key tile 0 stores its product, then
// key tiles 1, 2, ..., qt add theirs, each once the one before it has said
// so (sem[(b H + h) tiles + qt], zero at launch, holds how many key tiles
// have added). A product goes to dqacc whole, as one bulk copy or bulk
// addition of its 64 rows (contiguous there) from shared memory, issued by
// one thread, which also says when it is complete. A block takes its query
// tiles in descending order (each tile's heads together), so key tile kt's
// block reaches a (head, query tile) item at the same position as key tile
// kt - 1's, and waits for it about a step: block kt ends about kt steps
// after it would alone, and the shorter blocks (larger kt) have that to
// spare. The grid is (KV, B, tiles), key tiles slowest, so every
// sequence's longest blocks (kt = 0) start first and the block waited for
// always started before the one that waits: the chain cannot deadlock.
//
// Step j multiplies item j - 1's dS (kept in shared memory) by the keys
// and sends the product to dqacc, then computes item j's probabilities and
// its dk and dv products and leaves its dS for step j + 1; item j + 1's
// tiles are copied meanwhile. The block says item j - 1's product is in
// dqacc at the start of step j + 1.
//
// 128 threads, FLASH_H_BWD_SMEM bytes of dynamic shared memory: the key
// and value tiles, two sets of (queries, output gradients), the dS tile
// and the fp32 dq product; three blocks an SM.
#define FLASH_H_BWD_SMEM (9 * SW_TILE + 1024)
extern "C" __global__ void __launch_bounds__(128, 3) flash_bwd_h(float* dk, bf16* dkb, float* dv, bf16* dvb, float* dqacc, int* sem,
                                                                 const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                                                 const float* lse, const float* dvec, const float* cosT,
                                                                 const float* sinT, int T, int H, int KV, float scale, int ldq, int ldkv,
                                                                 int ldd) {
    extern __shared__ __align__(16) unsigned char smem_h[];
    __shared__ __align__(8) float Ls[2][64], Dv[2][64];
    unsigned Ks = sw_base(smem_h), Vs = Ks + SW_TILE, QD = Ks + 2 * SW_TILE, DS = Ks + 6 * SW_TILE, DQ = Ks + 7 * SW_TILE;
    unsigned char* dsg = smem_h + (DS - smem_addr(smem_h)); // the dS tile, for the generic stores
    float* dqs = (float*)(smem_h + (DQ - smem_addr(smem_h))); // the dq product, 64 rows of 64
    int kt = blockIdx.z, kvh = blockIdx.x, b = blockIdx.y, grp = H / KV;
    int tid = threadIdx.x, lane = tid & 31, r0 = (tid >> 5) * 16, g = lane >> 2, t = lane & 3;
    int nq = (T + 63) / 64, items = grp * (nq - kt);
    load_sw<64, 128>(Ks, k + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * 64, T, tid);
    load_sw<64, 128>(Vs, v + (size_t)b * T * ldkv + kvh * HD, ldkv, kt * 64, T, tid);
    // Item j is query tile nq - 1 - j / grp of head kvh grp + j % grp.
    auto headOf = [&](int j) { return kvh * grp + j % grp; };
    auto tileOf = [&](int j) { return nq - 1 - j / grp; };
    auto stage = [&](int j) {
        stage_item(QD + (j & 1) * 2 * SW_TILE, Ls[j & 1], Dv[j & 1], headOf(j), tileOf(j), b, q, dout, lse, dvec, T, H, ldq, tid);
    };
    auto semOf = [&](int j) { return sem + ((size_t)b * H + headOf(j)) * nq + tileOf(j); };
    stage(0);
    cp_commit();
    const float c = scale * 1.4426950408889634f;
    int kj[2] = {kt * 64 + r0 + g, kt * 64 + r0 + g + 8};
    const unsigned long long dkd = wg_desc(Ks), dvd = wg_desc(Vs), dsd = wg_desc(DS);
    float dka[8][4] = {}, dva[8][4] = {};
    int* done = nullptr; // an item whose product thread 0 sent, to be said once complete
    for (int j = 0;; j++) {
        // Item j's tiles have landed and item j - 1's dS is written, both
        // visible to wgmma; every warp is done with item j - 1's tiles
        // (which item j + 1's copies overwrite); the product sent last
        // step has left the shared memory (and is in dqacc: said here).
        cp_wait_all();
        fence_async_smem();
        if (tid == 0) {
            bulk_wait();
            fence_async_global();
            if (done) st_release(done, kt + 1);
        }
        done = nullptr;
        __syncthreads();
        if (j + 1 < items) stage(j + 1);
        cp_commit();
        if (j > 0) {
            // Item j - 1's dq product: dS (its queries by the block's keys)
            // times the keys, through shared memory to dqacc.
            int p = j - 1, h = headOf(p), qt = tileOf(p);
            float dqa[8][4] = {};
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wg_ss64tt(dqa, dsd + 128 * kk, dkd + 128 * kk);
            wg_commit();
            wg_wait();
            wg_hold<8>(dqa);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float* row = dqs + (r0 + g + 8 * r) * HD + 2 * t;
#pragma unroll
                for (int nb = 0; nb < 8; nb++) *(float2*)(row + nb * 8) = make_float2(dqa[nb][2 * r], dqa[nb][2 * r + 1]);
            }
            fence_async_smem();
            __syncthreads();
            if (tid == 0) {
                float* dst = dqacc + (((size_t)b * H + h) * T + qt * 64) * HD;
                int bytes = min(64, T - qt * 64) * HD * 4;
                fence_async_global();
                if (kt == 0)
                    bulk_store(dst, DQ, bytes);
                else
                    bulk_add(dst, DQ, bytes);
                bulk_commit();
            }
            if (kt < qt) done = semOf(p);
        }
        if (j == items) break;
        dkv_item(dka, dva, dkd, dvd, QD + (j & 1) * 2 * SW_TILE, tileOf(j), kt, kj, Ls[j & 1], Dv[j & 1], T, c, r0 + g, t, dsg);
        // The key tile before this one must have added to item j's sum
        // before this block adds, in the next step: one thread waits, and
        // the barrier there passes the order on.
        if (kt > 0 && tid == 0) {
            const int* sm = semOf(j);
            while (ld_acquire(sm) != kt) __nanosleep(32);
        }
    }
    if (tid == 0) {
        bulk_wait();
        fence_async_global();
        if (done) st_release(done, kt + 1);
    }
    store_kv_grads(dk, dkb, dv, dvb, dka, dva, kj, b, kvh, T, KV, ldd, scale, cosT, sinT, lane);
}

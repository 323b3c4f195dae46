// Mixtral's sparse mixture-of-experts feed-forward. Everything from the
// router to the combine runs on the device, so a layer never waits for the
// host: the router (a warp a row: logits, softmax, top-k, renormalised
// weights), a stable counting sort of the (token, choice) assignments by
// expert (counts per block, offsets, then ranks within each block), the
// expert GEMMs over the grouped rows (one launch each over the device-side
// expert offsets, its grid sized for the worst case, spare blocks exiting),
// and the weighted combine in fixed choice order. No float is ever summed
// with atomics, so a step gives the same bits every time it runs, replayed
// from a graph or not.
//
// Shapes: N rows (tokens), E experts, K choices a row, NK = N K grouped
// rows, d the model width, F the expert width. sel, wts, rowOf: (N, K),
// choices in ascending expert order; tokOf: (NK) the token of each grouped
// row; off: (E + 1) each expert's first grouped row.

#define MOE_MAXE 64 // the engine refuses more experts
#define MOE_MAXK 8  // and more choices a token

// moe_route: logits = x Wr^T (Wr fp32 (E, d), x fp32 or bf16), the softmax
// over the experts, the K largest (the lower expert on a tie), their
// weights renormalised to sum to one (summed largest first) and stored in
// ascending expert order, as model/cpu_moe.go's topK. A warp a row, 8 rows
// a block of 256 threads.
extern "C" __global__ void moe_route(float* probs, int* sel, float* wts, const float* x, const bf16* xb, const float* wr, int N,
                                     int d, int E, int K) {
    __shared__ float sh[8][MOE_MAXE];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * 8 + w;
    if (t >= N) return;
    float* p = sh[w];
    for (int e = 0; e < E; e++) {
        const float* wrow = wr + (size_t)e * d;
        float s = 0.0f;
        for (int j = lane; j < d; j += 32) {
            float v = x ? x[(size_t)t * d + j] : bf2f(xb[(size_t)t * d + j]);
            s += v * wrow[j];
        }
        s = warp_sum(s);
        if (lane == 0) p[e] = s;
    }
    __syncwarp();
    if (lane != 0) return;
    float m = -3.0e38f;
    for (int e = 0; e < E; e++) m = fmaxf(m, p[e]);
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        float v = expf(p[e] - m);
        p[e] = v;
        sum += v;
    }
    float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++) {
        p[e] *= inv;
        probs[(size_t)t * E + e] = p[e];
    }
    int cs[MOE_MAXK];
    float cw[MOE_MAXK];
    unsigned long long taken = 0;
    float S = 0.0f;
    for (int s = 0; s < K; s++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!((taken >> e) & 1ull) && (best < 0 || p[e] > p[best])) best = e;
        taken |= 1ull << best;
        cs[s] = best;
        cw[s] = p[best];
    }
    for (int s = 0; s < K; s++) S += cw[s];
    for (int s = 0; s < K; s++) cw[s] /= S;
    for (int i = 1; i < K; i++)
        for (int j = i; j > 0 && cs[j] < cs[j - 1]; j--) {
            int a = cs[j]; cs[j] = cs[j - 1]; cs[j - 1] = a;
            float b = cw[j]; cw[j] = cw[j - 1]; cw[j - 1] = b;
        }
    for (int s = 0; s < K; s++) {
        sel[(size_t)t * K + s] = cs[s];
        wts[(size_t)t * K + s] = cw[s];
    }
}

// moe_count: each block of 1024 assignments counts its own per expert, into
// blockCnt (G, E). Integer atomics in shared memory: the counts are exact.
extern "C" __global__ void moe_count(int* blockCnt, const int* sel, int NK, int E) {
    __shared__ int cnt[MOE_MAXE];
    for (int x = threadIdx.x; x < E; x += blockDim.x) cnt[x] = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < NK) atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += blockDim.x) blockCnt[blockIdx.x * E + x] = cnt[x];
}

// moe_scan (one block, at least E threads): the experts' offsets, each
// block's first row for each expert (blockBase, (G, E)), and the counts
// added to the step's load-balancing tally countAcc.
extern "C" __global__ void moe_scan(int* off, int* blockBase, int* countAcc, const int* blockCnt, int G, int E) {
    __shared__ int tot[MOE_MAXE + 1];
    int x = threadIdx.x;
    if (x < E) {
        int s = 0;
        for (int b = 0; b < G; b++) s += blockCnt[b * E + x];
        tot[x] = s;
        countAcc[x] += s;
    }
    __syncthreads();
    if (x == 0) {
        int r = 0;
        for (int y = 0; y < E; y++) {
            int c = tot[y];
            tot[y] = r;
            r += c;
        }
        tot[E] = r;
        off[E] = r;
    }
    __syncthreads();
    if (x < E) {
        int r = tot[x];
        off[x] = r;
        for (int b = 0; b < G; b++) {
            blockBase[b * E + x] = r;
            r += blockCnt[b * E + x];
        }
    }
}

// moe_place (the blocks of moe_count, 1024 threads): each assignment's
// grouped row, its block's first row for its expert plus the assignments
// before it in the block with the same expert (earlier warps through their
// counts, earlier lanes through __match_any_sync), so the rows keep the
// assignments' order within every expert; and the token of each row.
extern "C" __global__ void moe_place(int* rowOf, int* tokOf, const int* sel, const int* blockBase, int NK, int K, int E) {
    __shared__ int wc[32][MOE_MAXE];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < 32 * MOE_MAXE; i += blockDim.x) (&wc[0][0])[i] = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int x = i < NK ? sel[i] : -1 - lane;
    unsigned peers = __match_any_sync(0xffffffffu, x);
    int rank = __popc(peers & ((1u << lane) - 1u));
    if (x >= 0 && rank == 0) wc[w][x] = __popc(peers);
    __syncthreads();
    if (x < 0) return;
    int r = blockBase[blockIdx.x * E + x] + rank;
    for (int v = 0; v < w; v++) r += wc[v][x];
    rowOf[i] = r;
    tokOf[r] = i / K;
}

// moe_probsum: a block an expert adds the sum of its router probability
// over the N rows to psumAcc (fixed-order block reduction).
extern "C" __global__ void moe_probsum(float* psumAcc, const float* probs, int N, int E) {
    int x = blockIdx.x;
    float s = 0.0f;
    for (int t = threadIdx.x; t < N; t += blockDim.x) s += probs[(size_t)t * E + x];
    s = block_sum(s);
    if (threadIdx.x == 0) psumAcc[x] += s;
}

// moe_aux (one block, 64 threads): transformers' load_balancing_loss_func
// over the rows of every layer (rows = L N): f_e = count_e / rows, P_e =
// psum_e / rows, aux = E sum_e f_e P_e. Adds scale coef aux to the loss and
// scale aux to auxAcc, and leaves auxGrad_e = scale coef E f_e / rows, the
// gradient of the scaled term with respect to each row's probability of e
// (the choices carry none). scale is the micro-batch's, from the device.
// shareAcc_e adds count_e, for the step's per-expert share.
extern "C" __global__ void moe_aux(float* lossAcc, float* auxAcc, float* shareAcc, float* auxGrad, const int* countAcc, const float* psumAcc,
                                   const float* scale, int E, float rows, float coef) {
    __shared__ double part[MOE_MAXE];
    int x = threadIdx.x;
    float sc = scale[0];
    if (x < E) {
        double f = (double)countAcc[x] / rows;
        part[x] = f * ((double)psumAcc[x] / rows);
        auxGrad[x] = (float)((double)sc * coef * E * f / rows);
        shareAcc[x] += (float)countAcc[x];
    }
    __syncthreads();
    if (x == 0) {
        double a = 0.0;
        for (int y = 0; y < E; y++) a += part[y];
        a *= E;
        lossAcc[0] += (float)((double)sc * coef * a);
        auxAcc[0] += (float)((double)sc * a);
    }
}

// moe_combine: out = sum_s wts_s y[row_s] + mid, a thread an element, the
// choices in ascending expert order. y is fp32 or bf16 (yb).
extern "C" __global__ void moe_combine(float* out, const float* mid, const float* y, const bf16* yb, const int* rowOf, const float* wts,
                                       int N, int d, int K) {
    if ((d & 3) == 0) {
        // Four columns a thread (16- and 8-byte loads), the same sums.
        long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (q >= (long long)N * (d >> 2)) return;
        long long t = q / (d >> 2);
        int j = (int)(q - t * (d >> 2)) * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s = 0; s < K; s++) {
            size_t r = (size_t)rowOf[t * K + s] * d + j;
            float w = wts[t * K + s];
            float4 v = y ? *(const float4*)(y + r) : bf4(*(const uint2*)(yb + r));
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        size_t o = (size_t)t * d + j;
        float4 m = *(const float4*)(mid + o);
        *(float4*)(out + o) = make_float4(acc.x + m.x, acc.y + m.y, acc.z + m.z, acc.w + m.w);
        return;
    }
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * d) return;
    long long t = i / d;
    int j = (int)(i - t * d);
    float acc = 0.0f;
    for (int s = 0; s < K; s++) {
        size_t r = (size_t)rowOf[t * K + s] * d + j;
        acc += wts[t * K + s] * (y ? y[r] : bf2f(yb[r]));
    }
    out[i] = acc + mid[i];
}

// moe_combine_bwd: a warp a row t, with dout the gradient of the block's
// output. Each choice's expert-output gradient dy[row_s] = wts_s dout
// (fp32 or bf16), the weights' gradient dw_s = dout . y[row_s], and from
// them the router logits' gradient dz (N, E): through the renormalisation
// (dp_s = (dw_s - sum_j dw_j w_j) / S over the chosen, S their probability
// sum), the aux loss's auxGrad, and the softmax (dz = p (dp - p . dp)).
extern "C" __global__ void moe_combine_bwd(float* dy, bf16* dyb, float* dz, bf16* dzb, const float* dout, const float* y, const bf16* yb,
                                           const int* rowOf, const int* sel, const float* wts, const float* probs, const float* auxGrad,
                                           int N, int d, int E, int K) {
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * 8 + w;
    if (t >= N) return;
    const float* g = dout + (size_t)t * d;
    float dws[MOE_MAXK];
    for (int s = 0; s < K; s++) {
        size_t r = (size_t)rowOf[(size_t)t * K + s] * d;
        float wt = wts[(size_t)t * K + s], acc = 0.0f;
        if ((d & 3) == 0) {
            // Four columns a lane: 16-byte loads of dout, 8-byte of yb.
            for (int j = 4 * lane; j < d; j += 128) {
                float4 gv = *(const float4*)(g + j);
                float4 yv = y ? *(const float4*)(y + r + j) : bf4(*(const uint2*)(yb + r + j));
                acc += gv.x * yv.x + gv.y * yv.y + gv.z * yv.z + gv.w * yv.w;
                if (dy) *(float4*)(dy + r + j) = make_float4(wt * gv.x, wt * gv.y, wt * gv.z, wt * gv.w);
                else *(uint2*)(dyb + r + j) = make_uint2(f2bf2(wt * gv.x, wt * gv.y), f2bf2(wt * gv.z, wt * gv.w));
            }
        } else {
            for (int j = lane; j < d; j += 32) {
                float gv = g[j];
                acc += gv * (y ? y[r + j] : bf2f(yb[r + j]));
                if (dy) dy[r + j] = wt * gv;
                else dyb[r + j] = f2bf(wt * gv);
            }
        }
        dws[s] = warp_sum(acc);
    }
    const float* p = probs + (size_t)t * E;
    const int* ts = sel + (size_t)t * K;
    const float* tw = wts + (size_t)t * K;
    float S = 0.0f, mean = 0.0f;
    for (int s = 0; s < K; s++) {
        S += p[ts[s]];
        mean += dws[s] * tw[s];
    }
    float dp[2], pv[2], pdp = 0.0f;
    for (int h = 0; h < 2; h++) {
        int x = lane + 32 * h;
        dp[h] = 0.0f;
        pv[h] = 0.0f;
        if (x < E) {
            float v = auxGrad[x];
            for (int s = 0; s < K; s++)
                if (ts[s] == x) v += (dws[s] - mean) / S;
            dp[h] = v;
            pv[h] = p[x];
            pdp += pv[h] * v;
        }
    }
    pdp = warp_sum(pdp);
    for (int h = 0; h < 2; h++) {
        int x = lane + 32 * h;
        if (x < E) {
            float v = pv[h] * (dp[h] - pdp);
            dz[(size_t)t * E + x] = v;
            if (dzb) dzb[(size_t)t * E + x] = f2bf(v);
        }
    }
}

// moe_dx: the block input's gradient, a thread an element: the choices'
// grouped input gradients dxg summed in choice order, then the router's
// dz Wr (Wr fp32 (E, d)); written to dln (fp32) or dlnb (bf16).
extern "C" __global__ void moe_dx(float* dln, bf16* dlnb, const float* dxg, const float* dz, const float* wr, const int* rowOf, int N, int d,
                                  int E, int K) {
    if ((d & 3) == 0) {
        // Four columns a thread, the same sums.
        long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (q >= (long long)N * (d >> 2)) return;
        long long t = q / (d >> 2);
        int j = (int)(q - t * (d >> 2)) * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s = 0; s < K; s++) {
            float4 v = *(const float4*)(dxg + (size_t)rowOf[t * K + s] * d + j);
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        const float* z = dz + t * E;
        for (int x = 0; x < E; x++) {
            float zx = z[x];
            float4 w = *(const float4*)(wr + (size_t)x * d + j);
            acc.x += zx * w.x;
            acc.y += zx * w.y;
            acc.z += zx * w.z;
            acc.w += zx * w.w;
        }
        size_t o = (size_t)t * d + j;
        if (dln) *(float4*)(dln + o) = acc;
        else *(uint2*)(dlnb + o) = make_uint2(f2bf2(acc.x, acc.y), f2bf2(acc.z, acc.w));
        return;
    }
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * d) return;
    long long t = i / d;
    int j = (int)(i - t * d);
    float acc = 0.0f;
    for (int s = 0; s < K; s++) acc += dxg[(size_t)rowOf[t * K + s] * d + j];
    const float* z = dz + t * E;
    for (int x = 0; x < E; x++) acc += z[x] * wr[(size_t)x * d + j];
    if (dln) dln[i] = acc;
    else dlnb[i] = f2bf(acc);
}

// ---------------------------------------------------------------------
// Grouped expert GEMMs. Two forms, each one launch for every expert:
//
// rows: for each expert x, C[r, n] = sum_k A[a(r), k] B_x(k, n) (+ beta C)
//   over its grouped rows r in [off[x], off[x+1]); a(r) = tokOf[r] when
//   tok is set (the gathered block input), else r. B_x = B + x strideB is
//   (Ncols, K) row-major when bT (a weight as stored: x W^T), else (K,
//   Ncols). The grid's x covers ceil(NK / BM) + E row tiles (the most the
//   experts' tiles can add up to); a block finds its expert by walking the
//   offsets, and the blocks past the last tile exit. Forward and input
//   gradients.
// dw: for each expert x (blockIdx.z), C_x[m, n] += sum_r A[r, m] B[b(r), n]
//   over the expert's rows (a variable reduction length), C_x = C + x
//   strideC of (M, Ncols), b(r) = tokOf[r] when tok is set. The weight
//   gradients.
//
// fp32 inputs run on the CUDA cores in fp32 (what the golden check holds
// to the reference's tolerances); bf16 inputs run on bf16 tensor cores
// (mma.sync m16n8k16, sm_80 and later) with fp32 accumulation. Both keep
// 64 x 64 output tiles over k tiles of 32 in shared memory; each output
// sums its k in the same order every time.

#define GBM 64
#define GBN 64
#define GBK 32

__device__ __forceinline__ float ldv(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldv(const bf16* p, size_t i) { return bf2f(p[i]); }

// rows_tile finds the expert and first row of row tile blockIdx.x, in
// tiles of tm rows, and the expert's row end; false for a spare block.
__device__ __forceinline__ bool rows_tile(const int* off, int E, int tm, int* x, int* r0, int* r1) {
    int j = blockIdx.x;
    for (int e = 0; e < E; e++) {
        int a = off[e], b = off[e + 1];
        int tiles = (b - a + tm - 1) / tm;
        if (j < tiles) {
            *x = e;
            *r0 = a + j * tm;
            *r1 = b;
            return true;
        }
        j -= tiles;
    }
    return false;
}

// The fp32 kernels: 256 threads, each 4 x 4 outputs (rows ty + 16 i,
// columns tx + 16 j); tiles held [k][m] and [k][n].
template <typename T>
__device__ void gemm_rows_fma(float* C, bf16* Cb, const T* A, const T* B, const int* tok, const int* off, int E, int Ncols, int K,
                              int lda, int ldb, long long strideB, int ldc, int bT, float beta) {
    __shared__ float As[GBK][GBM + 4];
    __shared__ float Bs[GBK][GBN + 4];
    int x, r0, r1;
    if (!rows_tile(off, E, GBM, &x, &r0, &r1)) return;
    const T* Bx = B + (size_t)x * strideB;
    int n0 = blockIdx.y * GBN, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GBK) {
        for (int it = 0; it < GBM * GBK / 256; it++) {
            int idx = it * 256 + tid, i = idx / GBK, kk = idx % GBK;
            int r = r0 + i, k = k0 + kk;
            float v = 0.0f;
            if (r < r1 && k < K) v = ldv(A, (size_t)(tok ? tok[r] : r) * lda + k);
            As[kk][i] = v;
        }
        for (int it = 0; it < GBN * GBK / 256; it++) {
            int idx = it * 256 + tid, n, kk;
            if (bT) n = idx / GBK, kk = idx % GBK;
            else kk = idx / GBN, n = idx % GBN;
            int k = k0 + kk, c = n0 + n;
            float v = 0.0f;
            if (c < Ncols && k < K) v = ldv(Bx, bT ? (size_t)c * ldb + k : (size_t)k * ldb + c);
            Bs[kk][n] = v;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GBK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int r = r0 + ty + 16 * i;
        if (r >= r1) continue;
        for (int j = 0; j < 4; j++) {
            int c = n0 + tx + 16 * j;
            if (c >= Ncols) continue;
            size_t o = (size_t)r * ldc + c;
            if (C) C[o] = acc[i][j] + (beta != 0.0f ? beta * C[o] : 0.0f);
            else Cb[o] = f2bf(acc[i][j]);
        }
    }
}

template <typename T>
__device__ void gemm_dw_fma(float* C, const T* A, const T* B, const int* tok, const int* off, int M, int Ncols, int lda, int ldb,
                            long long strideC) {
    __shared__ float As[GBK][GBM + 4];
    __shared__ float Bs[GBK][GBN + 4];
    int x = blockIdx.z, ra = off[x], rb = off[x + 1];
    if (ra == rb) return;
    int m0 = blockIdx.y * GBM, n0 = blockIdx.x * GBN, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    float acc[4][4] = {};
    for (int k0 = ra; k0 < rb; k0 += GBK) {
        for (int it = 0; it < GBM * GBK / 256; it++) {
            int idx = it * 256 + tid, kk = idx / GBM, i = idx % GBM;
            int r = k0 + kk, m = m0 + i;
            As[kk][i] = (r < rb && m < M) ? ldv(A, (size_t)r * lda + m) : 0.0f;
            int c = n0 + i;
            Bs[kk][i] = (r < rb && c < Ncols) ? ldv(B, (size_t)(tok ? tok[r] : r) * ldb + c) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GBK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    float* Cx = C + (size_t)x * strideC;
    for (int i = 0; i < 4; i++) {
        int m = m0 + ty + 16 * i;
        if (m >= M) continue;
        for (int j = 0; j < 4; j++) {
            int c = n0 + tx + 16 * j;
            if (c < Ncols) Cx[(size_t)m * Ncols + c] += acc[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) moe_gemm_rows_f32(float* C, bf16* Cb, const float* A, const float* B, const int* tok,
                                                                     const int* off, int E, int Ncols, int K, int lda, int ldb,
                                                                     long long strideB, int ldc, int bT, float beta) {
    gemm_rows_fma<float>(C, Cb, A, B, tok, off, E, Ncols, K, lda, ldb, strideB, ldc, bT, beta);
}

extern "C" __global__ void __launch_bounds__(256) moe_gemm_dw_f32(float* C, const float* A, const float* B, const int* tok, const int* off,
                                                                   int M, int Ncols, int lda, int ldb, long long strideC) {
    gemm_dw_fma<float>(C, A, B, tok, off, M, Ncols, lda, ldb, strideC);
}

// The bf16 kernels: 128 threads, 4 warps in 2 x 2, each 32 x 32 of the
// tile as 2 x 4 mma.sync m16n8k16 blocks. Tiles are held in shared memory
// as [m][k] and [n][k] bf16 (row stride GLD: 80 bytes, so the fragment
// reads of a warp fall in distinct banks), whatever the operands' layout
// in global memory: the loads are mapped so that neighbouring threads read
// neighbouring addresses, and a transposed operand is transposed on the
// way into shared memory.
//
// Fragment layout (lane = 4 g + t): A register i holds row g (+8 for i =
// 1, 3), k 2t, 2t+1 (+8 for i = 2, 3); B register i holds k 2t, 2t+1 (+8
// for i = 1) of column g; C holds row g (elements 0, 1) and g + 8 (2, 3),
// columns 2t, 2t+1.

#define GLD (GBK + 8)

// mma_tile adds As (64 x 32, [m][k]) times Bs ([n][k]) into this warp's
// 32 x 32 accumulators.
__device__ __forceinline__ void mma_tile(float (*acc)[4][4], const bf16 (*As)[GLD], const bf16 (*Bs)[GLD], int wm, int wn, int lane) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kc = 0; kc < GBK; kc += 16) {
        unsigned a[2][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = wm + 16 * i + g;
            a[i][0] = ld32s(&As[r][kc + 2 * t]);
            a[i][1] = ld32s(&As[r + 8][kc + 2 * t]);
            a[i][2] = ld32s(&As[r][kc + 8 + 2 * t]);
            a[i][3] = ld32s(&As[r + 8][kc + 8 + 2 * t]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = wn + 8 * j + g;
            b[j][0] = ld32s(&Bs[n][kc + 2 * t]);
            b[j][1] = ld32s(&Bs[n][kc + 8 + 2 * t]);
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
    }
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_rows_bf(float* C, bf16* Cb, const bf16* A, const bf16* B, const int* tok,
                                                                    const int* off, int E, int Ncols, int K, int lda, int ldb,
                                                                    long long strideB, int ldc, int bT, float beta) {
    __shared__ __align__(16) bf16 As[GBM][GLD];
    __shared__ __align__(16) bf16 Bs[GBN][GLD];
    int x, r0, r1;
    if (!rows_tile(off, E, GBM, &x, &r0, &r1)) return;
    const bf16* Bx = B + (size_t)x * strideB;
    int n0 = blockIdx.y * GBN, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4] = {};
    // A rows are k-contiguous: a thread loads pairs along k.
    for (int k0 = 0; k0 < K; k0 += GBK) {
#pragma unroll
        for (int it = 0; it < GBM * GBK / 2 / 128; it++) {
            int idx = it * 128 + tid, i = idx / (GBK / 2), kk = 2 * (idx % (GBK / 2));
            int r = r0 + i, k = k0 + kk;
            bf16 v0 = 0, v1 = 0;
            if (r < r1) {
                const bf16* src = A + (size_t)(tok ? tok[r] : r) * lda + k;
                if (k < K) v0 = src[0];
                if (k + 1 < K) v1 = src[1];
            }
            As[i][kk] = v0;
            As[i][kk + 1] = v1;
        }
#pragma unroll
        for (int it = 0; it < GBN * GBK / 2 / 128; it++) {
            int idx = it * 128 + tid;
            if (bT) {
                int n = idx / (GBK / 2), kk = 2 * (idx % (GBK / 2)), c = n0 + n, k = k0 + kk;
                bf16 v0 = 0, v1 = 0;
                if (c < Ncols) {
                    const bf16* src = Bx + (size_t)c * ldb + k;
                    if (k < K) v0 = src[0];
                    if (k + 1 < K) v1 = src[1];
                }
                Bs[n][kk] = v0;
                Bs[n][kk + 1] = v1;
            } else {
                int kk = idx / (GBN / 2), n = 2 * (idx % (GBN / 2)), c = n0 + n, k = k0 + kk;
                bf16 v0 = 0, v1 = 0;
                if (k < K) {
                    const bf16* src = Bx + (size_t)k * ldb + c;
                    if (c < Ncols) v0 = src[0];
                    if (c + 1 < Ncols) v1 = src[1];
                }
                Bs[n][kk] = v0;
                Bs[n + 1][kk] = v1;
            }
        }
        __syncthreads();
        mma_tile(acc, As, Bs, wm, wn, lane);
        __syncthreads();
    }
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = r0 + wm + 16 * i + g + 8 * h;
                if (r >= r1) continue;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int c = n0 + wn + 8 * j + 2 * t + q;
                    if (c >= Ncols) continue;
                    size_t o = (size_t)r * ldc + c;
                    float v = acc[i][j][2 * h + q];
                    if (C) C[o] = v + (beta != 0.0f ? beta * C[o] : 0.0f);
                    else Cb[o] = f2bf(v);
                }
            }
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_dw_bf(float* C, const bf16* A, const bf16* B, const int* tok, const int* off,
                                                                  int M, int Ncols, int lda, int ldb, long long strideC) {
    __shared__ __align__(16) bf16 As[GBM][GLD];
    __shared__ __align__(16) bf16 Bs[GBN][GLD];
    int x = blockIdx.z, ra = off[x], rb = off[x + 1];
    if (ra == rb) return;
    int m0 = blockIdx.y * GBM, n0 = blockIdx.x * GBN, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4] = {};
    for (int k0 = ra; k0 < rb; k0 += GBK) {
        // Both operands are m- (n-) contiguous in global memory: a thread
        // loads a pair of columns of one row and transposes it.
#pragma unroll
        for (int it = 0; it < GBM * GBK / 2 / 128; it++) {
            int idx = it * 128 + tid, kk = idx / (GBM / 2), i = 2 * (idx % (GBM / 2));
            int r = k0 + kk;
            bf16 a0 = 0, a1 = 0, b0 = 0, b1 = 0;
            if (r < rb) {
                const bf16* sa = A + (size_t)r * lda + m0 + i;
                if (m0 + i < M) a0 = sa[0];
                if (m0 + i + 1 < M) a1 = sa[1];
                const bf16* sb = B + (size_t)(tok ? tok[r] : r) * ldb + n0 + i;
                if (n0 + i < Ncols) b0 = sb[0];
                if (n0 + i + 1 < Ncols) b1 = sb[1];
            }
            As[i][kk] = a0;
            As[i + 1][kk] = a1;
            Bs[i][kk] = b0;
            Bs[i + 1][kk] = b1;
        }
        __syncthreads();
        mma_tile(acc, As, Bs, wm, wn, lane);
        __syncthreads();
    }
    float* Cx = C + (size_t)x * strideC;
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int m = m0 + wm + 16 * i + g + 8 * h;
                if (m >= M) continue;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int c = n0 + wn + 8 * j + 2 * t + q;
                    if (c < Ncols) Cx[(size_t)m * Ncols + c] += acc[i][j][2 * h + q];
                }
            }
}

// ---------------------------------------------------------------------
// The fast bf16 forms, for widths that are multiples of 8 (16-byte row
// chunks: every preset). Output tiles of 128 x 64 (rows x columns of C):
// 4 warps in 2 x 2, each 64 x 32 as 4 x 4 mma.sync blocks, so each
// fragment read from shared memory feeds four products. Each operand tile
// comes in 16-byte cp.async copies (rows past the expert's end, or columns
// past the matrix, zero-filled), two k tiles ahead of the one being
// multiplied (three buffers), and the fragments come out of shared memory
// with ldmatrix. Tiles keep the operand's own layout: k-contiguous rows as
// [row][k] (row stride VLD), row-contiguous ones as [k][row] (stride the
// tile's width + 8), read with the .trans form, so nothing is transposed
// by hand. Every output sums its k in the same order as the
// straightforward bf16 kernels (k tiles of 32, two mma steps each).

#define VLD 40 // [row][k]: 32 k + 8 (80-byte rows: the 8 rows of an ldmatrix fall in distinct 16-byte bank groups)
#define VMI 4  // 16-row mma blocks a warp: warp tiles of 64 rows
#define VBM (32 * VMI)
#define VST 3 // pipeline stages
#define VLA (VBM + 8) // [k][m] A tile of the dw form (272-byte rows, likewise distinct)
#define VLN (GBN + 8) // [k][n] B tiles (144-byte rows)

// moe_wait leaves the newest VST - 1 groups in flight.
__device__ __forceinline__ void moe_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(VST - 1)); }

// mma_step_v multiplies one k tile: for each 16-wide k step, the warp's
// VMI A fragments (As as [m][k], or [k][m] of row stride VLA when AK) and
// 4 B fragments (Bs as [n][k], or [k][n] when BK) into its 64 x 32 block
// at (wm, wn).
template <bool AK, bool BK>
__device__ __forceinline__ void mma_step_v(float (*acc)[4][4], const bf16* As, const bf16* Bs, int wm, int wn, int lane) {
#pragma unroll
    for (int kc = 0; kc < GBK; kc += 16) {
        unsigned a[VMI][4], b[4][2];
#pragma unroll
        for (int i = 0; i < VMI; i++) {
            if (AK) ldm4t(a[i], smem_addr(As + (kc + (lane & 7) + (lane >> 4) * 8) * VLA + wm + 16 * i + ((lane >> 3) & 1) * 8));
            else ldm4(a[i], smem_addr(As + (wm + 16 * i + (lane & 7) + ((lane >> 3) & 1) * 8) * VLD + kc + (lane >> 4) * 8));
        }
#pragma unroll
        for (int np = 0; np < 2; np++) {
            unsigned r[4];
            if (BK) ldm4t(r, smem_addr(Bs + (kc + (lane & 7) + ((lane >> 3) & 1) * 8) * VLN + wn + 16 * np + (lane >> 4) * 8));
            else ldm4(r, smem_addr(Bs + (wn + 16 * np + (lane & 7) + (lane >> 4) * 8) * VLD + kc + ((lane >> 3) & 1) * 8));
            b[2 * np][0] = r[0];
            b[2 * np][1] = r[1];
            b[2 * np + 1][0] = r[2];
            b[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < VMI; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
    }
}

// B tiles: [64][VLD] or [32][VLN] bf16 values, whichever is larger.
#define VTILE (GBN * VLD > GBK * VLN ? GBN * VLD : GBK * VLN)

// rows form; BK: B is (K, Ncols) (read [k][n]), else (Ncols, K). With BK,
// B's rows from bsplit on are read bskip rows further on: a product over
// two weights that lie apart in one buffer, as [dg du] [W1; W3] with W2
// between them.
template <bool BK>
__device__ void gemm_rows_v(float* C, bf16* Cb, const bf16* A, const bf16* B, const int* tok, const int* off, int E, int Ncols, int K,
                            int lda, int ldb, long long strideB, int ldc, float beta, int bsplit, int bskip) {
    __shared__ __align__(128) bf16 As[VST][VBM * VLD];
    __shared__ __align__(128) bf16 Bs[VST][VTILE];
    int x, r0, r1;
    if (!rows_tile(off, E, VBM, &x, &r0, &r1)) return;
    const bf16* Bx = B + (size_t)x * strideB;
    int n0 = blockIdx.y * GBN, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = (warp >> 1) * (VBM / 2), wn = (warp & 1) * 32;
    // This thread's A rows (tid / 4 + 32 h) and its 8-value chunk of k.
    const bf16* arow[VMI];
    bool aok[VMI];
    int ci = (tid & 3) * 8;
#pragma unroll
    for (int h = 0; h < VMI; h++) {
        int r = r0 + (tid >> 2) + 32 * h;
        aok[h] = r < r1;
        arow[h] = A + (size_t)(aok[h] ? (tok ? tok[r] : r) : 0) * lda;
    }
    auto load = [&](int buf, int k0) {
#pragma unroll
        for (int h = 0; h < VMI; h++) {
            int i = (tid >> 2) + 32 * h, k = k0 + ci;
            bool ok = aok[h] && k < K;
            cp_async16(smem_addr(&As[buf][i * VLD + ci]), ok ? arow[h] + k : A, ok ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (BK) {
                int idx = tid + 128 * h, kk = idx >> 3, c = (idx & 7) * 8, kr = k0 + kk;
                bool ok = kr < K && n0 + c < Ncols;
                kr += kr >= bsplit ? bskip : 0;
                cp_async16(smem_addr(&Bs[buf][kk * VLN + c]), ok ? Bx + (size_t)kr * ldb + n0 + c : B, ok ? 16 : 0);
            } else {
                int n = (tid >> 2) + 32 * h, k = k0 + ci;
                bool ok = n0 + n < Ncols && k < K;
                cp_async16(smem_addr(&Bs[buf][n * VLD + ci]), ok ? Bx + (size_t)(n0 + n) * ldb + k : B, ok ? 16 : 0);
            }
        }
    };
    float acc[VMI][4][4] = {};
    int nk = (K + GBK - 1) / GBK;
#pragma unroll
    for (int st = 0; st < VST - 1; st++) {
        if (st < nk) load(st, st * GBK);
        cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        int nx = kt + VST - 1;
        if (nx < nk) load(nx % VST, nx * GBK);
        cp_commit();
        moe_wait();
        __syncthreads();
        mma_step_v<false, BK>(acc, As[kt % VST], Bs[kt % VST], wm, wn, lane);
        __syncthreads();
    }
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < VMI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = r0 + wm + 16 * i + g + 8 * h, c = n0 + wn + 8 * j + 2 * t;
                if (r >= r1 || c >= Ncols) continue;
                size_t o = (size_t)r * ldc + c;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                // c is even and Ncols, ldc multiples of 8: c + 1 is in range.
                if (C) {
                    if (beta != 0.0f) {
                        float2 p = *(float2*)(C + o);
                        v0 += beta * p.x;
                        v1 += beta * p.y;
                    }
                    *(float2*)(C + o) = make_float2(v0, v1);
                } else {
                    *(unsigned*)(Cb + o) = f2bf2(v0, v1);
                }
            }
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_rows_bf_nt(float* C, bf16* Cb, const bf16* A, const bf16* B, const int* tok,
                                                                       const int* off, int E, int Ncols, int K, int lda, int ldb,
                                                                       long long strideB, int ldc, float beta, int bsplit, int bskip) {
    gemm_rows_v<false>(C, Cb, A, B, tok, off, E, Ncols, K, lda, ldb, strideB, ldc, beta, bsplit, bskip);
}

extern "C" __global__ void __launch_bounds__(128) moe_gemm_rows_bf_nn(float* C, bf16* Cb, const bf16* A, const bf16* B, const int* tok,
                                                                       const int* off, int E, int Ncols, int K, int lda, int ldb,
                                                                       long long strideB, int ldc, float beta, int bsplit, int bskip) {
    gemm_rows_v<true>(C, Cb, A, B, tok, off, E, Ncols, K, lda, ldb, strideB, ldc, beta, bsplit, bskip);
}

// dw form: A (rows, M) and B (rows, Ncols) both read [k][row], output
// tiles of VBM rows of M by 64 columns. With S > 1 the expert's rows are
// split in S parts (blockIdx.z = x S + s), which write their sums to P
// (S, E, M, Ncols) for moe_dw_reduce to add in a fixed order: more blocks
// where an expert's rows are many and its weight small, without atomics.
extern "C" __global__ void __launch_bounds__(128) moe_gemm_dw_bf_v(float* C, float* P, const bf16* A, const bf16* B, const int* tok,
                                                                    const int* off, int M, int Ncols, int lda, int ldb, long long strideC,
                                                                    int E, int S) {
    __shared__ __align__(128) bf16 As[VST][GBK * VLA];
    __shared__ __align__(128) bf16 Bs[VST][GBK * VLN];
    int x = blockIdx.z / S, s = blockIdx.z - x * S, ra = off[x], rb = off[x + 1];
    if (S == 1 && ra == rb) return;
    {
        int len = rb - ra;
        rb = ra + (int)((long long)len * (s + 1) / S);
        ra = ra + (int)((long long)len * s / S);
    }
    int m0 = blockIdx.y * VBM, n0 = blockIdx.x * GBN, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = (warp >> 1) * (VBM / 2), wn = (warp & 1) * 32;
    auto load = [&](int buf, int k0) {
#pragma unroll
        for (int h = 0; h < VMI; h++) {
            int idx = tid + 128 * h, kk = idx / (VBM / 8), c = (idx % (VBM / 8)) * 8, r = k0 + kk;
            bool ok = r < rb && m0 + c < M;
            cp_async16(smem_addr(&As[buf][kk * VLA + c]), ok ? A + (size_t)r * lda + m0 + c : A, ok ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int idx = tid + 128 * h, kk = idx >> 3, c = (idx & 7) * 8, r = k0 + kk;
            bool ok = r < rb && n0 + c < Ncols;
            cp_async16(smem_addr(&Bs[buf][kk * VLN + c]), ok ? B + (size_t)(tok ? tok[r] : r) * ldb + n0 + c : B, ok ? 16 : 0);
        }
    };
    float acc[VMI][4][4] = {};
    int nk = (rb - ra + GBK - 1) / GBK;
#pragma unroll
    for (int st = 0; st < VST - 1; st++) {
        if (st < nk) load(st, ra + st * GBK);
        cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        int nx = kt + VST - 1;
        if (nx < nk) load(nx % VST, ra + nx * GBK);
        cp_commit();
        moe_wait();
        __syncthreads();
        mma_step_v<true, true>(acc, As[kt % VST], Bs[kt % VST], wm, wn, lane);
        __syncthreads();
    }
    float* Cx = S == 1 ? C + (size_t)x * strideC : P + ((size_t)s * E + x) * M * Ncols;
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < VMI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int m = m0 + wm + 16 * i + g + 8 * h, c = n0 + wn + 8 * j + 2 * t;
                if (m >= M || c >= Ncols) continue;
                float2* p = (float2*)(Cx + (size_t)m * Ncols + c);
                float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                if (S == 1) {
                    float2 o = *p;
                    v.x += o.x;
                    v.y += o.y;
                }
                *p = v;
            }
}

// moe_dw_reduce: C_x += the S parts of P, in order, a thread a value
// (grid over E M Ncols).
extern "C" __global__ void moe_dw_reduce(float* C, const float* P, int E, int S, long long MN, long long strideC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)E * MN) return;
    long long x = i / MN, j = i - x * MN;
    float v = 0.0f;
    for (int s = 0; s < S; s++) v += P[(long long)s * E * MN + i];
    C[x * strideC + j] += v;
}

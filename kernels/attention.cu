// Causal grouped-query attention, straightforward: the probabilities are
// kept in att for the backward pass.
//   q, out, dout, dq: (B, Tq, H, D)       k, v, dk, dv: (B, Tk, KV, D)
//   att, ds: (B, H, Tq, Tk)               query t sees keys 0 .. pos0 + t
// Query head h reads key/value head h / (H / KV). In training pos0 = 0 and
// Tk = Tq; in generation k and v are the KV cache and pos0 the cache length.

#define MAX_D 256

extern "C" __global__ void attn_fwd(float* out, float* att, const float* q, const float* k, const float* v,
                                    int Tq, int Tk, int H, int KV, int D, int pos0, float scale) {
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int kvh = h / (H / KV);
    int nk = pos0 + t + 1;
    __shared__ float qs[MAX_D];
    const float* qrow = q + (((size_t)b * Tq + t) * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qrow[d] * scale;
    __syncthreads();
    float* a = att + (((size_t)b * H + h) * Tq + t) * Tk;
    const float* kb = k + (size_t)b * Tk * KV * D + (size_t)kvh * D;
    const float* vb = v + (size_t)b * Tk * KV * D + (size_t)kvh * D;
    float m = -3.0e38f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        const float* kr = kb + (size_t)j * KV * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += qs[d] * kr[d];
        a[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        float e = expf(a[j] - m);
        a[j] = e;
        sum += e;
    }
    sum = block_sum(sum);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) a[j] *= inv;
    __syncthreads();
    float* o = out + (((size_t)b * Tq + t) * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) acc += a[j] * vb[(size_t)j * KV * D + d];
        o[d] = acc;
    }
}

// Per query row: dP = dout . v, dS = P * (dP - sum(P * dP)) (kept in ds for
// attn_bwd_kv), dq = scale * dS . k.
extern "C" __global__ void attn_bwd_q(float* dq, float* ds, const float* dout, const float* att, const float* k, const float* v,
                                      int Tq, int Tk, int H, int KV, int D, float scale) {
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int kvh = h / (H / KV);
    int nk = t + 1;
    __shared__ float dos[MAX_D];
    const float* drow = dout + (((size_t)b * Tq + t) * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) dos[d] = drow[d];
    __syncthreads();
    size_t arow = (((size_t)b * H + h) * Tq + t) * Tk;
    const float* a = att + arow;
    float* s = ds + arow;
    const float* kb = k + (size_t)b * Tk * KV * D + (size_t)kvh * D;
    const float* vb = v + (size_t)b * Tk * KV * D + (size_t)kvh * D;
    float pdp = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        const float* vr = vb + (size_t)j * KV * D;
        float dp = 0.0f;
        for (int d = 0; d < D; d++) dp += dos[d] * vr[d];
        s[j] = dp;
        pdp += a[j] * dp;
    }
    pdp = block_sum(pdp);
    for (int j = threadIdx.x; j < nk; j += blockDim.x) s[j] = a[j] * (s[j] - pdp);
    __syncthreads();
    float* o = dq + (((size_t)b * Tq + t) * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) acc += s[j] * kb[(size_t)j * KV * D + d];
        o[d] = acc * scale;
    }
}

// Per key row j and key/value head: sums over the query heads of its group
// and the queries that see j. Writes (does not add to) dk and dv.
extern "C" __global__ void attn_bwd_kv(float* dk, float* dv, const float* ds, const float* att, const float* q, const float* dout,
                                       int Tq, int Tk, int H, int KV, int D, float scale) {
    int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    int g = H / KV;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int hh = 0; hh < g; hh++) {
            int h = kvh * g + hh;
            size_t abase = ((size_t)b * H + h) * Tq;
            for (int t = j; t < Tq; t++) {
                size_t ai = (abase + t) * Tk + j;
                size_t qi = (((size_t)b * Tq + t) * H + h) * D + d;
                ak += ds[ai] * q[qi];
                av += att[ai] * dout[qi];
            }
        }
        size_t o = (((size_t)b * Tk + j) * KV + kvh) * D + d;
        dk[o] = ak * scale;
        dv[o] = av;
    }
}

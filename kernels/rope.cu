// Rotary embeddings in transformers' rotate_half layout: within each head of
// D values, element i pairs with i + D/2. x is (N = B*T, nh, D) and is
// rotated in place; cos and sin are (positions, D/2) tables computed on the
// host the way transformers computes them. dir = -1 applies the inverse
// rotation, which is the backward pass. xb, when set, gets the result in
// bf16 instead, and x is left as it was: the rotated values then have only
// bf16 readers (flash attention's queries and keys; dq and dk, which feed
// two GEMMs each), so writing them back in fp32 would be traffic for nothing.

// One block per row (blockIdx.x), its threads over the row's nh x D/2
// pairs: the row's position is computed once, and no thread divides a
// 64-bit index. x is packed (nh*D values a row); xb's rows are ldb apart, so
// that the result can land in a column block of a wider matrix (the fused
// projection's gradient).
extern "C" __global__ void rope(float* x, bf16* xb, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int dir,
                                int ldb) {
    int half = D / 2, row = blockIdx.x;
    int pos = pos0 + row % T;
    const float* ct = cosT + (size_t)pos * half;
    const float* st = sinT + (size_t)pos * half;
    size_t base = (size_t)row * nh * D, baseb = (size_t)row * ldb;
    for (int k = threadIdx.x; k < nh * half; k += blockDim.x) {
        int h = k / half, i = k - h * half;
        float c = ct[i], s = st[i] * (float)dir;
        size_t at = base + (size_t)h * D + i;
        float a = x[at], b = x[at + half];
        float ra = a * c - b * s, rb = b * c + a * s;
        if (xb) {
            size_t atb = baseb + (size_t)h * D + i;
            xb[atb] = f2bf(ra);
            xb[atb + half] = f2bf(rb);
        } else {
            x[at] = ra;
            x[at + half] = rb;
        }
    }
}

// rope_bf16 rotates bf16 x in place (the forward rotation), rows ld values
// apart: the queries and keys as column blocks of the fused projection's
// bf16 output, which flash attention reads.
extern "C" __global__ void rope_bf16(bf16* x, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int ld) {
    int half = D / 2, row = blockIdx.x;
    int pos = pos0 + row % T;
    const float* ct = cosT + (size_t)pos * half;
    const float* st = sinT + (size_t)pos * half;
    size_t base = (size_t)row * ld;
    for (int k = threadIdx.x; k < nh * half; k += blockDim.x) {
        int h = k / half, i = k - h * half;
        float c = ct[i], s = st[i];
        size_t at = base + (size_t)h * D + i;
        float a = bf2f(x[at]), b = bf2f(x[at + half]);
        x[at] = f2bf(a * c - b * s);
        x[at + half] = f2bf(b * c + a * s);
    }
}

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
// 64-bit index. x and xb are packed (nh*D values a row).
extern "C" __global__ void rope(float* x, bf16* xb, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int dir) {
    int half = D / 2, row = blockIdx.x;
    int pos = pos0 + row % T;
    const float* ct = cosT + (size_t)pos * half;
    const float* st = sinT + (size_t)pos * half;
    size_t base = (size_t)row * nh * D;
    for (int k = threadIdx.x; k < nh * half; k += blockDim.x) {
        int h = k / half, i = k - h * half;
        float c = ct[i], s = st[i] * (float)dir;
        size_t at = base + (size_t)h * D + i;
        float a = x[at], b = x[at + half];
        float ra = a * c - b * s, rb = b * c + a * s;
        if (xb) {
            xb[at] = f2bf(ra);
            xb[at + half] = f2bf(rb);
        } else {
            x[at] = ra;
            x[at + half] = rb;
        }
    }
}

// rope_bf16 rotates bf16 x in place (the forward rotation), rows ld values
// apart: the queries and keys as column blocks of the fused projection's
// bf16 output, which flash attention reads (the key heads follow the query
// heads there, so one launch covers both). Each thread takes two
// neighbouring pairs (i, i + 1 with i + D/2, i + D/2 + 1) through 4-byte
// loads; D/2 must be even.
extern "C" __global__ void rope_bf16(bf16* x, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int ld) {
    int half = D / 2, quarter = D / 4, row = blockIdx.x;
    int pos = pos0 + row % T;
    const float* ct = cosT + (size_t)pos * half;
    const float* st = sinT + (size_t)pos * half;
    bf16* xr = x + (size_t)row * ld;
    for (int k = threadIdx.x; k < nh * quarter; k += blockDim.x) {
        int h = k / quarter, i = (k - h * quarter) * 2;
        unsigned* pa = (unsigned*)(xr + h * D + i);
        unsigned* pb = (unsigned*)(xr + h * D + i + half);
        unsigned va = *pa, vb = *pb;
        float2 c = *(const float2*)(ct + i), s = *(const float2*)(st + i);
        float a0 = bf_lo(va), a1 = bf_hi(va);
        float b0 = bf_lo(vb), b1 = bf_hi(vb);
        *pa = f2bf2(a0 * c.x - b0 * s.x, a1 * c.y - b1 * s.y);
        *pb = f2bf2(b0 * c.x + a0 * s.x, b1 * c.y + a1 * s.y);
    }
}

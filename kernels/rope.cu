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
// heads there, so one launch covers both). A thread takes eight
// neighbouring pairs (i..i+7 with i + D/2..i + D/2 + 7) through 16-byte
// loads and stores, and the threads of a block run on across rows, so a
// row of a few hundred bytes does not leave most of a block idle. D/2 and
// ld must be multiples of 8 (the flash path's D is 64).
extern "C" __global__ void rope_bf16(bf16* x, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int ld) {
    int half = D / 2, eighths = half / 8, per_row = nh * eighths;
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (long long)N * per_row) return;
    int row = (int)(g / per_row), k = (int)(g - (long long)row * per_row);
    int h = k / eighths, i = (k - h * eighths) * 8;
    int pos = pos0 + row % T;
    const float4* ct = (const float4*)(cosT + (size_t)pos * half + i);
    const float4* st = (const float4*)(sinT + (size_t)pos * half + i);
    uint4* pa = (uint4*)(x + (size_t)row * ld + h * D + i);
    uint4* pb = (uint4*)(x + (size_t)row * ld + h * D + i + half);
    float a[8], b[8], ra[8], rb[8];
    bf8(*pa, a);
    bf8(*pb, b);
    float4 c0 = ct[0], c1 = ct[1], s0 = st[0], s1 = st[1];
    float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        ra[j] = a[j] * c[j] - b[j] * s[j];
        rb[j] = b[j] * c[j] + a[j] * s[j];
    }
    *pa = f2bf8(ra);
    *pb = f2bf8(rb);
}

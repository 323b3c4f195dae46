// Rotary embeddings in transformers' rotate_half layout: within each head of
// D values, element i pairs with i + D/2. x is (N = B*T, nh, D) and is
// rotated in place; cos and sin are (positions, D/2) tables computed on the
// host the way transformers computes them. dir = -1 applies the inverse
// rotation, which is the backward pass. xb, when set, gets the result in
// bf16 instead, and x is left as it was: the rotated values then have only
// bf16 readers (flash attention's queries and keys; dq and dk, which feed
// two GEMMs each), so writing them back in fp32 would be traffic for nothing.

extern "C" __global__ void rope(float* x, bf16* xb, const float* cosT, const float* sinT, int N, int T, int nh, int D, int pos0, int dir) {
    int half = D / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)N * nh * half;
    if (idx >= total) return;
    int i = idx % half;
    size_t rh = idx / half; // row * nh + head
    int row = rh / nh;
    int pos = pos0 + row % T;
    float c = cosT[(size_t)pos * half + i], s = sinT[(size_t)pos * half + i] * (float)dir;
    float* p = x + rh * D;
    float a = p[i], b = p[i + half];
    float ra = a * c - b * s, rb = b * c + a * s;
    if (xb) {
        xb[rh * D + i] = f2bf(ra);
        xb[rh * D + i + half] = f2bf(rb);
    } else {
        p[i] = ra;
        p[i + half] = rb;
    }
}

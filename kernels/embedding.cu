// Token embedding: out (N, d) = w[ids] with w (V, d). The backward pass adds
// each row's gradient into its token's row of dw in a fixed order (a token
// repeats in a batch; atomics would add in whatever order blocks run, and
// dw would differ from run to run). The host plans it (embedPlan in
// embedding.go): plan[0] = P items, plan[1] = M long tokens, plan[2] = where
// the long tokens' entries start; from plan[3] the N positions sorted by
// (token, position); from plan[3 + N] P items of (start, count, token, slot):
// count <= 32 sorted positions of one token, added straight into dw when
// slot < 0 (the token's only item), else summed into row slot of part; at
// plan[plan[2]] M entries of (token, first slot, slots) that embed_bwd_sum
// adds up in slot order.

extern "C" __global__ void embed_fwd(float* out, const int* ids, const float* w, int N, int d) {
    int row = blockIdx.x;
    size_t src = (size_t)ids[row] * d, dst = (size_t)row * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[dst + j] = w[src + j];
}

__device__ __forceinline__ float embed_val(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float embed_val(const bf16* p, size_t i) { return bf2f(p[i]); }

// One block an item; blocks past plan[0] return. dout is fp32, or bf16
// where the residual stream's gradient is kept in bf16 (embed_bwd_items_bf).
template <typename T>
__device__ __forceinline__ void embed_bwd_items_t(float* dw, float* part, const int* plan, const T* dout, int N, int d) {
    if ((int)blockIdx.x >= plan[0]) return;
    const int* order = plan + 3;
    const int* it = plan + 3 + N + 4 * blockIdx.x;
    int start = it[0], count = it[1], token = it[2], slot = it[3];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < count; r++) acc += embed_val(dout, (size_t)order[start + r] * d + j);
        if (slot < 0) dw[(size_t)token * d + j] += acc;
        else part[(size_t)slot * d + j] = acc;
    }
}

extern "C" __global__ void embed_bwd_items(float* dw, float* part, const int* plan, const float* dout, int N, int d) {
    embed_bwd_items_t(dw, part, plan, dout, N, d);
}

extern "C" __global__ void embed_bwd_items_bf(float* dw, float* part, const int* plan, const bf16* dout, int N, int d) {
    embed_bwd_items_t(dw, part, plan, dout, N, d);
}

// One block a long token; blocks past plan[1] return.
extern "C" __global__ void embed_bwd_sum(float* dw, const float* part, const int* plan, int d) {
    if ((int)blockIdx.x >= plan[1]) return;
    const int* m = plan + plan[2] + 3 * blockIdx.x;
    int token = m[0], first = m[1], slots = m[2];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < slots; k++) acc += part[(size_t)(first + k) * d + j];
        dw[(size_t)token * d + j] += acc;
    }
}

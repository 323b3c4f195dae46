// Token embedding: out (N, d) = w[ids] with w (V, d); the backward pass
// scatters into dw with atomics, since a token may repeat in a batch.

extern "C" __global__ void embed_fwd(float* out, const int* ids, const float* w, int N, int d) {
    int row = blockIdx.x;
    size_t src = (size_t)ids[row] * d, dst = (size_t)row * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[dst + j] = w[src + j];
}

extern "C" __global__ void embed_bwd(float* dw, const int* ids, const float* dout, int N, int d) {
    int row = blockIdx.x;
    size_t dst = (size_t)ids[row] * d, src = (size_t)row * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(&dw[dst + j], dout[src + j]);
}

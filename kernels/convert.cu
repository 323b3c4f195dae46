// fp32 -> bf16 copies: the weights' GEMM copies and GEMM operands in bf16 precision.

extern "C" __global__ void f32_to_bf16(bf16* out, const float* in, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(in[i]);
}

// Rounds fp32 values to bf16 precision in place, for tests of the rounding.
extern "C" __global__ void bf16_round(float* x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = bf2f(f2bf(x[i]));
}

// Fills n 32-bit words at p with v: stands in a recorded graph for a
// library's small memset (cuda.Graph.MemsetsToKernels), which as a graph
// node holds the kernel after it back by several microseconds.
extern "C" __global__ void fill_u32(unsigned* p, unsigned v, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

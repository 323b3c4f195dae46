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

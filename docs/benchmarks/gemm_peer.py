"""The CUDA step's GEMM shapes through PyTorch's matmul (cuBLAS), one by one,
to set beside `sched bench --profile`'s GEMM lines. A kiln line
"GEMM ... MxNxK TN" is C (M x N, row-major) = A^T B with A stored K x M and
B stored K x N; "NT" is A B^T with B stored N x K; "NN" is A B. Each shape is
timed bf16 in, bf16 out (what autocast's matmuls write) over 50 calls with
CUDA events after 10 warm-up calls; the figure printed is ms a step: ms a
call times the calls a step makes (8 layers, or 8 head chunks at small 32).
usage: gemm_peer.py [--blas cublas|cublaslt] [SHAPE ...], SHAPE as M:N:K:TT:calls
(default: small 32's); --blas picks the library torch's matmul goes through."""
import sys, json
import torch

SMALL32 = [
    (2816, 512, 32768, "TN"), (32768, 512, 2816, "NN"), (32768, 2816, 512, "NT"), (16384, 512, 4096, "TN"),
    (4096, 16384, 512, "NT"), (4096, 512, 16384, "NN"), (32768, 512, 1408, "NT"), (512, 1408, 32768, "TN"),
    (32768, 1408, 512, "NN"), (32768, 1024, 512, "NT"), (1024, 512, 32768, "TN"), (32768, 512, 512, "NT"),
    (32768, 512, 1024, "NN"), (512, 512, 32768, "TN"), (32768, 512, 512, "NN"),
]

def operands(M, N, K, tt):
    a = torch.randn(K, M) if tt[0] == "T" else torch.randn(M, K)
    b = torch.randn(N, K) if tt[1] == "T" else torch.randn(K, N)
    return a.cuda().bfloat16(), b.cuda().bfloat16()

def run(M, N, K, tt, calls=8, reps=50):
    a, b = operands(M, N, K, tt)
    fa = (lambda: a.t()) if tt[0] == "T" else (lambda: a)
    fb = (lambda: b.t()) if tt[1] == "T" else (lambda: b)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        torch.mm(fa(), fb(), out=out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.mm(fa(), fb(), out=out)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / reps
    tflops = 2 * M * N * K / ms / 1e9
    print(json.dumps(dict(shape=f"{M}x{N}x{K} {tt}", ms_call=round(ms, 4), ms_step=round(ms * calls, 3), tflops=round(tflops))), flush=True)
    return ms * calls

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    args = sys.argv[1:]
    if args[:1] == ["--blas"]:
        torch.backends.cuda.preferred_blas_library(args[1])
        args = args[2:]
    print("torch", torch.__version__, torch.cuda.get_device_name(), "blas", torch.backends.cuda.preferred_blas_library(), flush=True)
    shapes = [(int(s.split(":")[0]), int(s.split(":")[1]), int(s.split(":")[2]), s.split(":")[3], int(s.split(":")[4]))
              for s in args] or [(M, N, K, tt, 8) for M, N, K, tt in SMALL32]
    total = sum(run(M, N, K, tt, calls) for M, N, K, tt, calls in shapes)
    print(json.dumps(dict(total_ms_step=round(total, 3))), flush=True)

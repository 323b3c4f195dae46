#!/bin/bash
# One call on a GPU host for the hang watch (kernels/cuda/hang.go) and what
# it touches: the watch's tests in kernels/cuda (a kernel that spins until
# the host releases it; a child process ended with status 3), every kernel
# test but the loss curve, the sm_80 build's, `sched verify` on both
# goldens in fp32 and bf16, native and forced sm_80, the trainer's GPU
# tests, `sched bench` at small 32 x 1024 and the pilot's step, and `sched
# bench --gpus all` on a host of one GPU (measured once). $G (default
# .carry/g) holds sched.gz, kernels.test.gz, trainer.test.gz, cuda.test.gz
# and sched.test.gz (`CGO_ENABLED=0 go test -c` of ./kernels/cuda/,
# ./kernels/, ./trainer/ and ./cmd/sched/, gzipped: `FOR=hang bash
# docs/benchmarks/gpu-carry-prep.sh`); output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/hang}; mkdir -p $OUT
. docs/benchmarks/cuda-checks.sh
unpack sched kernels.test trainer.test cuda.test sched.test
export NCCL_NVLS_ENABLE=0
log start; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log cuda tests; (cd kernels/cuda && timeout 120 cuda.test -test.v -test.run 'Hang|Hung|NCCL' > $OUT/cuda.log 2>&1; echo rc=$? >> $OUT/cuda.log); grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|hang_test" $OUT/cuda.log | tail -20
log native tests; gpu_tests native 240 -test.skip LossCurve
log sm80 tests; KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 150 -test.run 'MoE|Flash|Graph|Golden|AdamW|Group|Pilot|BF16|Training|Head'
log verify
for f in 0 1; do for d in tiny hd64; do for p in fp32 bf16; do KILN_CUDA_FORCE_SM80=$f verify $p $d; done; done; done
log trainer; (cd trainer && timeout 200 trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows|MoERunOnTheGPU' > $OUT/trainer.log 2>&1; echo rc=$? >> $OUT/trainer.log); grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/trainer.log | tail
log bench; for i in 1 2; do echo "small 32: $(kbench sched small 32)  pilot 8x16: $(kbench sched small 8 --accumulate 16)"; done
log sched bench all; (cd cmd/sched && timeout 120 sched.test -test.v -test.run 'TestBench' > $OUT/sched.log 2>&1; echo rc=$? >> $OUT/sched.log); grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/sched.log | tail
log end

#!/bin/bash
# One call on a GPU host: the group's tests (a one-rank communicator on one GPU; two ranks where the host
# has two), native and forced sm_80; the trainer's run on every GPU resumed on one, and 200 steps on every
# GPU against one at the same global batch (fp32 and bf16, loss within 1% at every logged step), native
# and forced sm_80; and `sched bench` on one GPU against `--gpus all` at the issue's two shapes, small
# 32 x 1024 and base 16 x 1024 a GPU, alternated (with two GPUs `sched bench` prints the scaling
# efficiency). ROUNDS (default 2) sets the bench's alternations; SHAPES (default "small:32 base:16")
# its shapes.
# Run from the repository root with .carry/g holding what was built on the development machine:
#   CGO_ENABLED=0 go build -ldflags="-s -w" -o .carry/g/sched ./cmd/sched
#   CGO_ENABLED=0 go test -ldflags="-s -w" -c -o .carry/g/kernels.test ./kernels/
#   CGO_ENABLED=0 go test -ldflags="-s -w" -c -o .carry/g/trainer.test ./trainer/
#   gzip .carry/g/*
# Output goes to $OUT (default /tmp/multi-gpu-run).
C=${C:-$PWD/.carry/g}; OUT=${OUT:-/tmp/multi-gpu-run}; mkdir -p $OUT /tmp/mg-bin; G=/tmp/mg-bin
for f in sched kernels.test trainer.test; do gunzip -c $C/$f.gz > $G/$f && chmod +x $G/$f; done
export NCCL_NVLS_ENABLE=0
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=index,name,driver_version,memory.used,utilization.gpu --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -5
log group tests, native
(cd kernels && timeout 200 $G/kernels.test -test.v -test.run 'Group|NCCL|GraphSteps|GoldenFP32' > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|largest weight" $OUT/tests_native.log | tail -30
log group tests, sm80
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 150 $G/kernels.test -test.v -test.run 'Group' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/tests_sm80.log | tail -20
log trainer on every GPU: resumed on one, and 200 steps against one
(cd trainer && timeout 200 $G/trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows' > $OUT/trainer.log 2>&1; echo "rc=$?" >> $OUT/trainer.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|step 6|curves at most" $OUT/trainer.log | tail -20
log trainer on every GPU, sm80
(cd trainer && KILN_CUDA_FORCE_SM80=1 timeout 200 $G/trainer.test -test.v -test.run 'RunOnEveryGPU|EveryGPUFollows' > $OUT/trainer_sm80.log 2>&1; echo "rc=$?" >> $OUT/trainer_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|curves at most" $OUT/trainer_sm80.log | tail -20
log bench
for shape in ${SHAPES:-small:32 base:16}; do
  for i in $(seq ${ROUNDS:-2}); do for g in 1 all; do
    echo "${shape%:*} ${shape#*:}x1024 gpus=$g $(timeout 120 $G/sched bench --engine cuda --model ${shape%:*} --batch ${shape#*:} --seq 1024 --steps 30 --gpus $g 2>&1 | tail -1)" | tee -a $OUT/bench.txt
  done; done
done
log end

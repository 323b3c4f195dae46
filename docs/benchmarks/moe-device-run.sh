#!/bin/bash
# One call on the GPU host for the mixture of experts: the MoE and group GPU tests (native, then the forced
# sm_80 build), `sched verify` on the Mixtral golden (fp32 and bf16, native and sm_80), a 200-step MoE run
# on the GPU whose last checkpoint transformers reads back (hf_moe_check.py), and the dense vs MoE bench.
# Run from the repository root with .carry/g holding, gzipped, what was built on the development machine:
#   CGO_ENABLED=0 go build -ldflags="-s -w" -o .carry/g/sched ./cmd/sched
#   CGO_ENABLED=0 go test -ldflags="-s -w" -c -o .carry/g/kernels.test ./kernels/
#   CGO_ENABLED=0 go test -ldflags="-s -w" -c -o .carry/g/trainer.test ./trainer/
# Output goes to $OUT (default /tmp/moe-run).
C=${C:-$PWD/.carry/g}; OUT=${OUT:-/tmp/moe-run}; mkdir -p $OUT /tmp/moe-bin; G=/tmp/moe-bin
for f in sched kernels.test trainer.test; do gunzip -c $C/$f.gz > $G/$f && chmod +x $G/$f; done
export NCCL_NVLS_ENABLE=0
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv,noheader
log tests native
(cd kernels && timeout 200 $G/kernels.test -test.v -test.run 'MoE|Group|Generate' > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/tests_native.log | tail -30
log tests sm80
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 200 $G/kernels.test -test.v -test.run 'MoE|Group|Generate' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/tests_sm80.log | tail -30
log verify
for f in 0 1; do
  KILN_CUDA_FORCE_SM80=$f timeout 60 $G/sched verify --engine cuda --precision fp32 --golden model/testdata/golden/moe > /tmp/v.log 2>&1
  echo "verify fp32 moe sm80=$f rc=$?"; { echo "## fp32 sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
  KILN_CUDA_FORCE_SM80=$f timeout 60 $G/sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 \
    --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/moe > /tmp/v.log 2>&1
  echo "verify bf16 moe sm80=$f rc=$?"; { echo "## bf16 sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
done
log 200-step MoE run, transformers
(cd trainer && KILN_MOE_OUT=/tmp/moe timeout 200 $G/trainer.test -test.v -test.run 'MoERunOnTheGPU|RunOnEveryGPU' > $OUT/trainer.log 2>&1; echo "rc=$?" >> $OUT/trainer.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|gpus_test" $OUT/trainer.log | tail -20
cp /tmp/moe/metrics.jsonl $OUT/moe_metrics.jsonl 2>/dev/null
python3 docs/benchmarks/hf_moe_check.py /tmp/moe 2>&1 | tail -1 | tee $OUT/hf_moe_check.txt
log bench dense vs MoE
for i in 1 2; do for shape in "16 512" "32 1024"; do set -- $shape; for moe in "" "--moe experts=8,top_k=2,d_ff=352"; do
  echo "b=$1 s=$2 $moe $(timeout 120 $G/sched bench --engine cuda --model small --batch $1 --seq $2 --steps 30 $moe 2>&1 | tail -1)" | tee -a $OUT/bench.txt
done; done; done
log end

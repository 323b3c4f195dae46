#!/bin/bash
# One call on the GPU host: the GPU tests (native, then the forced sm_80 build), `sched verify` on both
# golden models, the bench at the pilot's shape beside the build before checkpoints went beside the steps
# (sched.old), and the bench with a checkpoint every N steps, written beside the steps and waited for.
# Run from the repository root, with $G a directory holding what was built on the development machine:
#   CGO_ENABLED=0 go test -ldflags=-s -c -o $G/kernels.test ./kernels/
#   CGO_ENABLED=0 go build -ldflags=-s -o $G/sched ./cmd/sched
#   (gzipped, to carry less; the earlier commit's sched as $G/sched.old.gz)
# Everything is written under $OUT (default /tmp/ck-run).
C=${C:-$PWD/.carry/g}; OUT=${OUT:-/tmp/ck-run}; mkdir -p $OUT /tmp/ck-bin; G=/tmp/ck-bin
for f in sched sched.old kernels.test; do gunzip -c $C/$f.gz > $G/$f && chmod +x $G/$f; done
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
log native tests
(cd kernels && timeout 150 $G/kernels.test -test.v -test.skip LossCurve > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)|CopyState" $OUT/tests_native.log | tail -20
log sm80 tests
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 100 $G/kernels.test -test.v -test.run 'Graph|Flash|BF16|Generate|Training|Accumulation|Pilot|Head|TF32|Norm|CopyState' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)|CopyState" $OUT/tests_sm80.log | tail -20
log verify
for f in 0 1; do for d in tiny hd64; do
  KILN_CUDA_FORCE_SM80=$f timeout 20 $G/sched verify --engine cuda --precision fp32 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
  echo "verify fp32 $d sm80=$f rc=$?"; { echo "## fp32 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
  KILN_CUDA_FORCE_SM80=$f timeout 20 $G/sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 \
    --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
  echo "verify bf16 $d sm80=$f rc=$?"; { echo "## bf16 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
done; done
log bench, before and after
for i in 1 2 3; do for b in $G/sched.old $G/sched; do
  echo "$b $(timeout 60 $b bench --engine cuda --model small --batch 8 --seq 1024 --steps 30 2>&1 | tail -1)" | tee -a $OUT/bench.txt
done; done
log checkpoints
for i in 1 2; do for every in "10 60" "50 200"; do set -- $every; for w in "" --checkpoint-wait; do
  echo "every=$1 steps=$2 $w $(timeout 90 $G/sched bench --engine cuda --model small --batch 8 --seq 1024 --steps $2 --checkpoint-every $1 $w 2>&1 | tail -1)" | tee -a $OUT/checkpoints.txt
done; done; done
log end

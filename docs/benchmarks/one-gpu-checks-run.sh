#!/bin/bash
# One call on a one-GPU host, for a change to the kernels, the group or the trainer (about 4 minutes on an
# H100): the kernel suite but the loss curve, native and forced sm_80; kernels/cuda's graph-event, NCCL and
# hang tests; then multi-gpu-run.sh with one bench round and the DDP peer (the trainer on every GPU, the
# SIGTERM runs, `sched bench` against the peer in the same call, the all-reduce's profile).
# Run from the repository root with .carry/g built by `FOR=multi bash docs/benchmarks/gpu-carry-prep.sh`.
# Output goes to $OUT (default /tmp/one-gpu-checks).
export NCCL_NVLS_ENABLE=0
C=${C:-$PWD/.carry/g}; OUT=${OUT:-/tmp/one-gpu-checks}; B=$(mktemp -d); mkdir -p $OUT
for f in kernels.test cuda.test; do gunzip -c $C/$f.gz > $B/$f && chmod +x $B/$f; done
S=$SECONDS; log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for mode in native sm80; do
  log kernels $mode
  force=0; [ $mode = sm80 ] && force=1
  (cd kernels && KILN_CUDA_FORCE_SM80=$force timeout 240 $B/kernels.test -test.v -test.skip LossCurve > $OUT/k_$mode.log 2>&1; echo rc=$? >> $OUT/k_$mode.log)
  grep -E '^(--- FAIL|ok|FAIL|PASS|rc=|panic)' $OUT/k_$mode.log | tail; echo "passed $(grep -c -- '^--- PASS' $OUT/k_$mode.log)"
done
log kernels/cuda
(cd kernels/cuda && timeout 120 $B/cuda.test -test.v -test.run 'WorkAfter|NCCL|Hang|Event' > $OUT/cuda.log 2>&1; echo rc=$? >> $OUT/cuda.log)
grep -E '^(--- |ok|FAIL|PASS|rc=|panic)' $OUT/cuda.log | tail -20
log multi-gpu-run.sh
ROUNDS=1 OUT=$OUT/mg C=$C bash "$(dirname "$0")/multi-gpu-run.sh" 2>&1 | tee $OUT/mg.txt
log end

#!/bin/bash
# The residual stream's gradient in bf16 alone (KILN_CUDA_DRESID=bf16)
# against fp32 with a bf16 copy (the default), on the GPU host, in one call:
# PART=check: the kernel and step tests of the bf16 gradient (native and the
# forced sm_80 build), `sched verify` on the golden models in bf16 with it,
# and the 200-step loss curve six times with it (from the CPU curve kept in
# $G/curve). PART=ab: `sched bench` at small 32, the pilot's 8 x 1024 (one
# micro-batch a step, and its 16) and base 16, both settings alternated
# twice, and the per-kernel profile of each at small 32. PART=peer: kiln's
# rows with each setting, the PyTorch peer (torch.compile, default and
# reduce-overhead) on the same shapes, then kiln's rows again.
# Run from the repository root, with $G holding sched.gz and kernels.test.gz
# built on the development machine, torch_peer.py (the design material's
# bench/) and curve/ (tokenizer.json, cpu_curve.tsv and texts/ of the
# loss-curve check):
#   CGO_ENABLED=0 go build -o $G/sched ./cmd/sched && gzip $G/sched
#   CGO_ENABLED=0 go test -c -o $G/kernels.test ./kernels/ && gzip $G/kernels.test
# Everything is written under $OUT (default /tmp/dresid).
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/dresid}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched kernels.test
bench() { # MODEL BATCH ACCUMULATE SETTING [more flags]
  local m=$1 b=$2 a=$3 v=$4; shift 4
  echo "kiln dresid=$v $m $b x1024 accumulate $a $(KILN_CUDA_DRESID=$v timeout 90 sched bench --engine cuda --model $m --batch $b --seq 1024 --accumulate $a --steps 30 "$@" 2>&1 | tail -1 | tok)"
}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
case "${PART:-check}" in
check)
  log tests
  gpu_tests native 180 -test.run 'TestNormBackward|TestBF16Variants|TestTrainingStepTakesFlashPath|TestGoldenBF16|TestGraphSteps|TestBF16StepConverts|TestParseOptions|TestAccumulation'
  KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 120 -test.run 'TestNormBackward|TestBF16Variants|TestGoldenBF16'
  log verify
  for f in 0 1; do for d in tiny hd64 moe; do
    KILN_CUDA_DRESID=bf16 KILN_CUDA_FORCE_SM80=$f verify bf16 $d
  done; done
  log curves
  KILN_CUDA_DRESID=bf16 curves
  ;;
ab)
  log bench
  for round in 1 2; do
    for v in fp32 bf16; do
      bench small 32 1 $v; bench small 8 1 $v; bench small 8 16 $v; bench base 16 1 $v
    done
  done | tee $OUT/ab.txt
  log profiles
  for v in fp32 bf16; do
    KILN_CUDA_DRESID=$v timeout 60 sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 30 --profile > $OUT/profile_small32_$v.log 2>&1
    echo "== $v"; grep -E "^kernel|rmsnorm|embed_bwd|memset" $OUT/profile_small32_$v.log | head -8
  done
  ;;
peer)
  rows() { for v in ${SETTINGS:-fp32 bf16}; do bench small 32 1 $v; bench small 64 1 $v; bench base 16 1 $v; bench base 32 1 $v; bench small 8 1 $v; done; }
  log kiln; rows | tee $OUT/kiln_before.txt
  log peer
  peer 330 small:32:1024,small:64:1024,base:16:1024,base:32:1024,small:8:1024 ${MODES:-compile reduce-overhead} | tee $OUT/peer.jsonl
  log kiln again; rows | tee $OUT/kiln_after.txt
  ;;
esac
log end

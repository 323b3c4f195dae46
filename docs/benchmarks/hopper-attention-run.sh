#!/bin/bash
# Calls on the GPU host for the Hopper flash attention (kernels/flash_sm90.cu).
# PART=check: the whole native GPU suite, the forced sm_80 build's subset,
# `sched verify` on the three golden models (fp32 and bf16, native and
# sm_80), the 200-step loss curve six times (from the CPU curve kept in
# $G/curve, computed earlier by the same test), and the per-kernel profile
# of both attention paths at small 32 x 1024.
# PART=peer MODES="compile" or "reduce-overhead": kiln's bench on the four
# rows and the pilot's shape with the Hopper kernels and with flash.cu's
# (KILN_CUDA_ATTENTION=flash-sm80), then the PyTorch peer in that
# torch.compile mode on the same shapes, then kiln again.
# Run from the repository root, with $G holding sched.gz and kernels.test.gz
# built on the development machine, torch_peer.py (the design material's
# bench/), texts/ (the golden tokenizer texts) and curve/ (tokenizer.json and
# cpu_curve.tsv of the loss-curve check):
#   CGO_ENABLED=0 go build -o $G/sched ./cmd/sched && gzip $G/sched
#   CGO_ENABLED=0 go test -c -o $G/kernels.test ./kernels/ && gzip $G/kernels.test
# Everything is written under $OUT (default /tmp/hopper-attention).
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/hopper-attention}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched kernels.test
kiln_rows() {
  for r in "small 32" "small 64" "base 16" "base 32" "small 8"; do set -- $r
    for a in flash flash-sm80; do
      echo "kiln $a $1 $2 $(KILN_CUDA_ATTENTION=$a timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1 | tok)"
    done
  done
}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
if [ "${PART:-check}" = check ]; then
  log native suite
  gpu_tests native 240 -test.skip LossCurve
  grep -E "Hopper kernels against|_h \(sm_90\).*registers" $OUT/tests_native.log | head -9
  log sm80 subset
  KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 120 -test.run 'MoE|Flash|Graph|Golden|AdamW|Group|Pilot'
  log verify
  for f in 0 1; do for d in tiny hd64 moe; do
    KILN_CUDA_FORCE_SM80=$f verify fp32 $d
    KILN_CUDA_FORCE_SM80=$f verify bf16 $d
  done; done
  log curves
  curves
  log profiles
  for a in flash flash-sm80; do
    KILN_CUDA_ATTENTION=$a timeout 60 sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 30 --profile > $OUT/profile_small32_$a.log 2>&1
    echo "== $a"; grep -E "^ +(flash|attn)" $OUT/profile_small32_$a.log | head -6
  done
else
  log kiln; kiln_rows | tee $OUT/kiln_$MODES.txt
  log peer $MODES
  peer 400 small:32:1024,small:64:1024,base:16:1024,base:32:1024,small:8:1024 $MODES | tee $OUT/peer_$MODES.jsonl
  log kiln again; kiln_rows | tee $OUT/kiln_after_$MODES.txt
fi
log end

#!/bin/bash
# The LM head's chunk buffer sized for bf16 training logits and the
# residual stream's gradient without an fp32 buffer, on the GPU host:
# PART=check: the whole native GPU suite, the forced sm_80 build on the
# head, loss, norm and step tests, `sched verify` on the three golden
# models (fp32 and bf16, native and sm_80) and the 200-step loss curve six
# times. PART=bench: each build in BUILDS (default sched) on the issue's
# four rows, the pilot's shape (one micro-batch a step and its 16; the
# sm_80 build too) with tok/s and peak GiB, alternated twice, then
# torch_peer.py (torch.compile, default and reduce-overhead) at the pilot's
# shape for its peak. $G as in kernel-ab-run.sh; output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/head-memory}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
BUILDS=${BUILDS:-sched}
unpack $BUILDS kernels.test
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
case "${PART:-check}" in
check)
  log tests
  gpu_tests native 330
  KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 120 -test.run 'TestXent|TestNorm|TestBF16|TestHead|TestGolden|TestTrainingStep|TestLogit'
  log verify
  for f in 0 1; do for d in tiny hd64 moe; do for p in fp32 bf16; do
    KILN_CUDA_FORCE_SM80=$f verify $p $d
  done; done; done
  log curves
  curves
  ;;
bench)
  log bench
  for round in 1 2; do for s in $BUILDS; do
    for r in "small 32 1" "small 64 1" "base 16 1" "base 32 1" "small 8 1" "small 8 16"; do set -- $r
      echo "$s $1 $2 accumulate $3 $(kbench $s $1 $2 --accumulate $3)"
    done
    echo "$s sm80 small 8 $(KILN_CUDA_FORCE_SM80=1 kbench $s small 8)"
  done; done | tee $OUT/bench.txt
  for s in $BUILDS; do
    echo "$s small 32: $(kprofile $s small 32 'rmsnorm|xent')"
  done | tee $OUT/profiles.txt
  log peer
  peer 200 small:8:1024 compile reduce-overhead | tee $OUT/peer.jsonl
  ;;
esac
log end

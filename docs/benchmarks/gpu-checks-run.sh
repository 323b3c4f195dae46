#!/bin/bash
# The parity checks of a build in one call on the GPU host (about 70 s):
# every kernel test but the loss curve, the sm_80 build's tests, `sched
# verify` on both goldens in fp32 and bf16, native and forced sm_80, and
# the 200-step loss curve six times. $G holds sched.gz, kernels.test.gz and
# curve/ (tokenizer.json, the kept cpu_curve.tsv, texts/: the golden
# tokenizer texts of the design material); output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/gpu-checks}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched kernels.test
log start; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log native tests; gpu_tests native 240 -test.skip LossCurve
log sm80 tests; KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 150 -test.run 'MoE|Flash|Graph|Golden|AdamW|Group|Pilot|BF16|Training|Head'
log verify
for f in 0 1; do for d in tiny hd64; do for p in fp32 bf16; do KILN_CUDA_FORCE_SM80=$f verify $p $d; done; done; done
log curves; curves
log end

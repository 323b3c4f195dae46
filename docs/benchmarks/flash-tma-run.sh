#!/bin/bash
# The Hopper flash kernels with their tiles copied by the tensor memory
# accelerator (flash_fwd_ht, flash_bwd_dq_ht, flash_bwd_dkv_ht; the default)
# against the cp.async ones (KILN_CUDA_FLASH_TMA=off), in one call on the GPU
# host: the flash tests (the TMA kernels must give the cp.async kernels'
# bits; the Hopper kernels' shared pieces, fwd_step, dq_step, dq_prepare,
# stage_item, dkv_item and each_tile, are new in this build too, so every
# Hopper variant runs), `sched bench` with each alternated twice at base 32, small 64,
# small 32 and the pilot's 8 x 1024, `--profile` lines of the flash
# kernels, and Nsight Compute's instruction counts of each at base 32. $G holds
# sched.gz and kernels.test.gz of this build; output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/flash-tma}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched kernels.test
B=$(mktemp -d); printf '#!/bin/sh\nKILN_CUDA_FLASH_TMA=off exec sched "$@"\n' > $B/sched-cpasync; chmod +x $B/sched-cpasync; export PATH=$B:$PATH
log tests
gpu_tests tma 200 -test.run 'FlashMatches|TrainingStepTakesFlash|FlashBackwardShared|HopperBackwardTakes|KernelSignatures|GraphStepsMatch'
grep -E "tensor copies|_ht " $OUT/tests_tma.log | head -12
grep -q "^PASS" $OUT/tests_tma.log || { log "tests failed"; exit 1; }
log bench
for i in 1 2; do for r in ${SHAPES:-base:32 small:64 small:32 small:8}; do set -- ${r/:/ }
  echo "cp.async $1 $2 $(kbench sched-cpasync $1 $2)"; echo "tma $1 $2 $(kbench sched $1 $2)"
done; done | tee $OUT/ab.txt
for m in "small 32" "base 32"; do set -- $m
  echo "cp.async $1 $2: $(kprofile sched-cpasync $1 $2 'flash_')"
  echo "tma $1 $2: $(kprofile sched $1 $2 'flash_')"
done | tee $OUT/profile.txt
log ncu
N=/usr/local/cuda/bin/ncu
if [ -x $N ]; then for s in sched-cpasync sched; do for k in flash_fwd flash_bwd_dq flash_bwd_dkv; do
  timeout 90 $N --section SpeedOfLight --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_lsu.sum -k regex:$k -c 1 \
    $s bench --engine cuda --model base --batch 32 --seq 1024 --steps 2 > $OUT/ncu_${s}_$k.txt 2>&1
  echo "$s $k: $(grep -E '^\s+(Duration|smsp__inst_executed.sum|smsp__inst_executed_pipe_lsu.sum)' $OUT/ncu_${s}_$k.txt | tr -s ' ' | tr '\n' ';')"
done; done | tee $OUT/ncu.txt; fi
log end

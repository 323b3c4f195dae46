#!/bin/bash
# The engine's settings against its default in one call on the GPU host:
# every variant in VARIANTS (NAME:BUILD:ENV words, as peer-run.sh takes
# them) beside the default build `sched`, alternated twice on each row of
# ROWS; then kiln and torch.compile at base 32 with the SM clock and power
# sampled (clocks.txt), and `--profile` at base 16 and base 32. $G holds
# sched.gz (and any other build a variant names) and torch_peer.py; output
# under $OUT. The run of 2026-12-03 05:56 UTC, sched-ds the build of
# branch flash-saved-ds:
#   BUILDS="sched sched-ds" VARIANTS="serial:sched:KILN_CUDA_OVERLAP=off
#   tune16:sched:KILN_CUDA_GEMM_TUNE=16 tuneoff:sched:KILN_CUDA_GEMM_TUNE=off
#   unpaired:sched:KILN_CUDA_FLASH_PAIR=off ds:sched-ds:KILN_CUDA_FLASH_BWD=ds"
#   docs/benchmarks/step-variants-run.sh
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/variants}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
BUILDS=${BUILDS:-sched}
ROWS=${ROWS:-base:32 small:64}
VARIANTS=${VARIANTS:-serial:sched:KILN_CUDA_OVERLAP=off tune16:sched:KILN_CUDA_GEMM_TUNE=16 tuneoff:sched:KILN_CUDA_GEMM_TUNE=off unpaired:sched:KILN_CUDA_FLASH_PAIR=off}
unpack $BUILDS
names="sched $(variants $VARIANTS)"
log start; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
log variants
for i in 1 2; do for r in $ROWS; do set -- ${r/:/ }; for s in $names; do
  echo "$s $1 $2 $(kbench $s $1 $2)"
done; done; done | tee $OUT/variants.txt
log clocks; clocks_start
clocks_phase "kiln base 32"; echo "sched base 32 $(kbench sched base 32 --steps 60)"
clocks_phase "torch.compile base 32"; peer 200 base:32:1024 compile | tee $OUT/peer.jsonl
clocks_summary
log profiles
for m in "base 16" "base 32"; do set -- $m
  timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 --profile > $OUT/profile_$1_$2.txt 2>&1
done
log end

#!/bin/bash
# Where a step's time goes, for the next lever: `sched bench --profile` (each
# kernel timed between events, serialised) at base 16 x 1024 and at the
# pilot's 8 x 1024, and, where Nsight Compute (ncu) is installed, its
# memory, occupancy and stall sections for the memory-bound kernels of a
# small 32 x 1024 step (graphs off, so that ncu sees each launch).
# Run from the repository root with $G holding sched.gz (see
# dresid-run.sh). Output under $OUT (default /tmp/cuda-profile).
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/cuda-profile}; mkdir -p $OUT
B=$(mktemp -d); export PATH=$B:$PATH:/usr/local/cuda/bin
gzip -dc $G/sched.gz > $B/sched && chmod +x $B/sched
echo "### $(date -u +%H:%M:%S) start"; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for r in "base 16" "small 8"; do set -- $r
  timeout 90 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 --profile > $OUT/profile_$1_$2.log 2>&1
  echo "== $1 $2"; grep -E "^kernel|^  " $OUT/profile_$1_$2.log | head -40
done
if command -v ncu > /dev/null; then
  KILN_CUDA_GRAPH=off timeout 240 ncu --target-processes all -k 'regex:rmsnorm_bwd|rmsnorm_fwd|rope_bf16|swiglu|xent' -c 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 1 --warmup 1 > $OUT/ncu.txt 2>&1
  echo "ncu rc=$?"; grep -E "^  [a-z_]+.*\(|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Duration|Stall|One or More Eligible|Warp Cycles Per Issued" $OUT/ncu.txt | head -90
else
  echo "no ncu on this host"
fi
echo "### $(date -u +%H:%M:%S) end"

#!/bin/bash
# The LM head's chunk at the pilot's shape: this build (sched) against one
# whose chunks are at most 2048 rows (sched-h2048: model/headchunk.go's
# headMaxRows = 2048, which at small 8 x 1024 sizes the chunk as the
# quarter-of-the-rows bound does), `sched bench` at one micro-batch a step
# and at the pilot's 16, tok/s and peak GiB, alternated twice. $G as in
# kernel-ab-run.sh; output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/head-quarter}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched sched-h2048
for round in 1 2; do for s in sched sched-h2048; do for a in 1 16; do
  echo "$s small 8 accumulate $a $(kbench $s small 8 --accumulate $a)"
done; done; done | tee $OUT/h2048.txt
log end

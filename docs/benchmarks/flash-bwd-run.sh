#!/bin/bash
# One call on the GPU host: the flash attention backward in one kernel
# (flash_bwd, the default) against two (KILN_CUDA_FLASH_BWD=split): the
# attention tests (native, then the forced sm_80 build), the whole native
# GPU suite, `sched verify` in bf16 on both golden models, and the bench
# at small 8 x 1024 (the pilot), small 32 x 1024 and base 16 x 1024 with
# the two backward paths alternated, then the per-kernel profile of each.
# Run from the repository root, with $G holding sched.gz and
# kernels.test.gz built on the development machine:
#   CGO_ENABLED=0 go build -o $G/sched ./cmd/sched && gzip $G/sched
#   CGO_ENABLED=0 go test -c -o $G/kernels.test ./kernels/ && gzip $G/kernels.test
# Everything is written under $OUT (default /tmp/flash-bwd).
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/flash-bwd}; mkdir -p $OUT
B=$(mktemp -d); export PATH=$B:$PATH
for f in sched kernels.test; do gzip -dc $G/$f.gz > $B/$f && chmod +x $B/$f; done
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
log attention tests
for f in 0 1; do
  (cd kernels && KILN_CUDA_FORCE_SM80=$f timeout 150 kernels.test -test.v -test.run "FlashMatches|TrainingStepTakesFlash|GoldenBF16" > $OUT/tests_attn_sm80_$f.log 2>&1; echo "rc=$?" >> $OUT/tests_attn_sm80_$f.log)
  grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|apart|max error|registers" $OUT/tests_attn_sm80_$f.log | head -40
done
grep -q "rc=0" $OUT/tests_attn_sm80_0.log || { grep -B5 -A30 -E "FAIL|panic|error" $OUT/tests_attn_sm80_0.log | head -80; exit 1; }
log native suite
(cd kernels && timeout 240 kernels.test -test.v -test.skip LossCurve > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)" $OUT/tests_native.log | tail -20
grep -c -- "--- PASS" $OUT/tests_native.log
log verify
for f in 0 1; do for d in tiny hd64; do
  KILN_CUDA_FORCE_SM80=$f timeout 30 sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 \
    --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
  echo "verify bf16 $d sm80=$f rc=$?"; { echo "## bf16 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
done; done
log bench
for rep in 1 2; do for r in "small 8" "small 32" "base 16"; do set -- $r
  for bwd in fused split; do
    echo "$bwd $1 $2 $(KILN_CUDA_FLASH_BWD=$bwd timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1)" >> $OUT/bench.txt; tail -1 $OUT/bench.txt | python3 -c "import sys,json; l=sys.stdin.read(); a=l.split(' {',1); d=json.loads('{'+a[1]); print(a[0], round(d['tok_per_sec']), round(d['peak_gib'],3))"
  done
done; done
log profiles
for bwd in fused split; do
  KILN_CUDA_FLASH_BWD=$bwd timeout 60 sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 30 --profile > $OUT/profile_small32_$bwd.log 2>&1
  grep -i -E "^ +flash" $OUT/profile_small32_$bwd.log | head -12
done
log end

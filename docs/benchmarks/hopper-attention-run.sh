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
B=$(mktemp -d); export PATH=$B:$PATH
for f in sched kernels.test; do gzip -dc $G/$f.gz > $B/$f && chmod +x $B/$f; done
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
tok() { python3 -c "import sys,json; l=sys.stdin.read(); d=json.loads(l[l.index('{'):]); print(round(d['tok_per_sec']), round(d['peak_gib'],2))"; }
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
  (cd kernels && timeout 240 kernels.test -test.v -test.skip LossCurve > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
  grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)" $OUT/tests_native.log | tail -8; echo "passed: $(grep -c -- '^--- PASS' $OUT/tests_native.log)"
  grep -E "Hopper kernels against|_h \(sm_90\).*registers" $OUT/tests_native.log | head -9
  log sm80 subset
  (cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 120 kernels.test -test.v -test.run 'MoE|Flash|Graph|Golden|AdamW|Group|Pilot' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
  grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)" $OUT/tests_sm80.log | tail -5; echo "passed: $(grep -c -- '^--- PASS' $OUT/tests_sm80.log)"
  log verify
  for f in 0 1; do for d in tiny hd64 moe; do
    KILN_CUDA_FORCE_SM80=$f timeout 30 sched verify --engine cuda --precision fp32 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
    echo "verify fp32 $d sm80=$f rc=$?"; { echo "## fp32 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
    KILN_CUDA_FORCE_SM80=$f timeout 30 sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 \
      --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
    echo "verify bf16 $d sm80=$f rc=$?"; { echo "## bf16 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
  done; done
  log curves
  for i in 1 2 3 4 5 6; do
    rm -rf /tmp/cv$i; mkdir -p /tmp/cv$i; cp $G/curve/cpu_curve.tsv $G/curve/tokenizer.json /tmp/cv$i/
    (cd kernels && KILN_CURVE_TEXTS=$G/curve/texts KILN_CURVE_OUT=/tmp/cv$i timeout 200 kernels.test -test.run LossCurve -test.v > /tmp/cv$i.log 2>&1; echo "rc=$?" >> /tmp/cv$i.log) &
  done
  wait
  for i in 1 2 3 4 5 6; do
    echo "run $i: $(grep -h 'worst logged' /tmp/cv$i.log | sed 's/.*curve_test.go:[0-9]*: //') $(grep rc= /tmp/cv$i.log)"
    cp /tmp/cv$i/loss_curve.tsv $OUT/loss_curve_$i.tsv 2>/dev/null
  done | tee $OUT/curves.txt
  log profiles
  for a in flash flash-sm80; do
    KILN_CUDA_ATTENTION=$a timeout 60 sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 30 --profile > $OUT/profile_small32_$a.log 2>&1
    echo "== $a"; grep -E "^ +(flash|attn)" $OUT/profile_small32_$a.log | head -6
  done
else
  log kiln; kiln_rows | tee $OUT/kiln_$MODES.txt
  log peer $MODES
  PYTHONUNBUFFERED=1 timeout 400 python3 $G/torch_peer.py $MODES --plan small:32:1024,small:64:1024,base:16:1024,base:32:1024,small:8:1024 2>&1 |
    grep -v Warning | tee $OUT/peer_$MODES.jsonl
  log kiln again; kiln_rows | tee $OUT/kiln_after_$MODES.txt
fi
log end

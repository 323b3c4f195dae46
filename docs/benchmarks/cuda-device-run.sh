#!/bin/bash
# One call on the GPU host: the GPU tests (native, then the forced sm_80 build), `sched verify` on both
# golden models, the 200-step loss curve six times, transformers loading kiln's checkpoint, kiln's
# benchmarks with the per-kernel profile, the PyTorch peer (eager, then torch.compile), kiln again, and
# torch.compile's step by kernel group (torch_profile.py, next to this script).
# Run from the repository root, with $G a directory holding what was built on the development machine:
#   CGO_ENABLED=0 go test -c -o $G/kernels.test ./kernels/
#   CGO_ENABLED=0 go build -o $G/sched ./cmd/sched
# plus torch_peer.py (the design material's bench/), hf_check.py (docs/benchmarks/cuda.md), texts/ (the
# golden tokenizer texts) and curve/ (tokenizer.json and the kept cpu_curve.tsv of the loss-curve check).
# Everything is written under $OUT (default /tmp/cuda-run).
G=${G:-$PWD/gpu}; OUT=${OUT:-/tmp/cuda-run}; mkdir -p $OUT; export PATH=$G:$PATH
S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }
log start; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
log native tests
(cd kernels && timeout 120 $G/kernels.test -test.v -test.skip LossCurve > $OUT/tests_native.log 2>&1; echo "rc=$?" >> $OUT/tests_native.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)|max error" $OUT/tests_native.log | tail -60
grep -q "rc=0" $OUT/tests_native.log || { grep -B5 -A20 FAIL $OUT/tests_native.log | head -60; exit 1; }
log sm80 tests
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 90 $G/kernels.test -test.v -test.run 'Flash|BF16|Generate|Training|Accumulation|Pilot|Head|TF32|Norm' > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- |ok|FAIL|PASS|rc=|panic)" $OUT/tests_sm80.log | tail -30
log verify
for f in 0 1; do for d in tiny hd64; do
  KILN_CUDA_FORCE_SM80=$f timeout 20 sched verify --engine cuda --precision fp32 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
  echo "verify fp32 $d sm80=$f rc=$?"; { echo "## fp32 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
  KILN_CUDA_FORCE_SM80=$f timeout 20 sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 \
    --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/$d > /tmp/v.log 2>&1
  echo "verify bf16 $d sm80=$f rc=$?"; { echo "## bf16 $d sm80=$f"; cat /tmp/v.log; } >> $OUT/verify.log
done; done
log curves
for i in 1 2 3 4 5 6; do
  rm -rf /tmp/cv$i; mkdir -p /tmp/cv$i; cp $G/curve/cpu_curve.tsv $G/curve/tokenizer.json /tmp/cv$i/
  (cd kernels && KILN_CURVE_TEXTS=$G/texts KILN_CURVE_OUT=/tmp/cv$i timeout 150 $G/kernels.test -test.run LossCurve -test.v > /tmp/cv$i.log 2>&1; echo "rc=$?" >> /tmp/cv$i.log) &
done
wait
for i in 1 2 3 4 5 6; do
  echo "run $i: $(grep -h 'worst logged' /tmp/cv$i.log | sed 's/.*curve_test.go:[0-9]*: //') $(grep rc= /tmp/cv$i.log)"
  cp /tmp/cv$i/loss_curve.tsv $OUT/loss_curve_$i.tsv
done | tee $OUT/curves.txt
log transformers
python3 $G/hf_check.py /tmp/cv1 2>&1 | tail -1 | tee $OUT/hf_check.txt
log kiln bench
timeout 60 sched bench --engine cuda --model small --batch 32 --seq 1024 --steps 30 --profile 2>&1 | tee $OUT/profile_small32.log | grep -v '^{' | head -40
timeout 60 sched bench --engine cuda --model base --batch 16 --seq 1024 --steps 30 --profile > $OUT/profile_base16.log 2>&1
for r in "small 32" "small 64" "base 16" "base 32" "small 8"; do set -- $r
  timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1 | tee -a $OUT/kiln.jsonl
  KILN_CUDA_GRAPH=off timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1 | tee -a $OUT/kiln_graph_off.jsonl
done
log peer
PYTHONUNBUFFERED=1 timeout 420 python3 $G/torch_peer.py eager compile --plan small:32:1024,small:64:1024,base:16:1024,base:32:1024 2>&1 |
  grep -v Warning | tee $OUT/peer.jsonl
PYTHONUNBUFFERED=1 timeout 300 python3 $G/torch_peer.py compile reduce-overhead --plan small:8:1024 2>&1 |
  grep -v Warning | tee -a $OUT/peer.jsonl
log kiln again
for r in "small 32" "base 16"; do set -- $r
  timeout 60 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1 | tee -a $OUT/kiln_after_peer.jsonl
done
log torch.compile profile
PYTHONPATH=$G PYTHONUNBUFFERED=1 timeout 300 python3 $(dirname $0)/torch_profile.py small:32:1024 base:16:1024 2>&1 |
  grep -v -i warn | tee $OUT/torch_profile.txt
log end

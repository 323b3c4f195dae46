#!/bin/bash
# A kernel change against the build before it, on the GPU host, in one call:
# the tests named by TESTS (native; SM80_TESTS with the forced sm_80 build),
# `sched verify` on the head_dim 64 golden in bf16 (native and sm_80), the
# 200-step loss curve six times, then `sched bench` at small 32, the pilot's
# 8 x 1024 and base 16 with each build, alternated twice, and each build's
# profile lines for the kernels matching KERNELS at small 32 and base 16.
# $G holds sched.gz (this build), sched-prev.gz (the one before),
# kernels.test.gz and curve/ (see dresid-run.sh). Output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/kernel-ab}; mkdir -p $OUT
B=$(mktemp -d); export PATH=$B:$PATH
for f in sched sched-prev kernels.test; do gzip -dc $G/$f.gz > $B/$f && chmod +x $B/$f; done
tok() { python3 -c "import sys,json; l=sys.stdin.read(); d=json.loads(l[l.index('{'):]); print(round(d['tok_per_sec']), round(d['peak_gib'],2))"; }
echo "### $(date -u +%H:%M:%S) tests"
(cd kernels && timeout 150 kernels.test -test.v -test.run "$TESTS" > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log)
grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)|^    [a-z_]+_test.go" $OUT/tests.log | tail -8; echo "passed: $(grep -c -- '--- PASS' $OUT/tests.log)"
(cd kernels && KILN_CUDA_FORCE_SM80=1 timeout 90 kernels.test -test.v -test.run "${SM80_TESTS:-$TESTS}" > $OUT/tests_sm80.log 2>&1; echo "rc=$?" >> $OUT/tests_sm80.log)
grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)|^    [a-z_]+_test.go" $OUT/tests_sm80.log | tail -5; echo "passed: $(grep -c -- '--- PASS' $OUT/tests_sm80.log)"
for f in 0 1; do
  KILN_CUDA_FORCE_SM80=$f timeout 30 sched verify --engine cuda --precision bf16 --loss-rtol 5e-3 --grad-rtol 3e-2 --logits-rtol 3e-2 --significant 3e-2 --golden model/testdata/golden/hd64 > /tmp/v.log 2>&1
  echo "verify bf16 hd64 sm80=$f rc=$?"
done
echo "### $(date -u +%H:%M:%S) curves"
for i in 1 2 3 4 5 6; do
  rm -rf /tmp/cv$i; mkdir -p /tmp/cv$i; cp $G/curve/cpu_curve.tsv $G/curve/tokenizer.json /tmp/cv$i/
  (cd kernels && KILN_CURVE_TEXTS=$G/curve/texts KILN_CURVE_OUT=/tmp/cv$i timeout 200 kernels.test -test.run LossCurve -test.v > /tmp/cv$i.log 2>&1; echo "rc=$?" >> /tmp/cv$i.log) &
done
wait
for i in 1 2 3 4 5 6; do echo "run $i: $(grep -h 'worst logged' /tmp/cv$i.log | sed 's/.*curve_test.go:[0-9]*: //') $(grep rc= /tmp/cv$i.log)"; done | tee $OUT/curves.txt
echo "### $(date -u +%H:%M:%S) bench"
for round in 1 2; do for s in sched-prev sched; do for r in "small 32" "small 8" "base 16"; do set -- $r
  echo "$s $1 $2 $(timeout 60 $s bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 2>&1 | tail -1 | tok)"
done; done; done | tee $OUT/ab.txt
for r in "small 32" "base 16"; do set -- $r; for s in sched-prev sched; do
  echo "$s $1 $2: $(timeout 60 $s bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30 --profile 2>&1 | grep -E "^  ($KERNELS)|^kernel" | tr -s ' ' | tr '\n' ';')"
done; done | tee $OUT/profiles.txt
echo "### $(date -u +%H:%M:%S) end"

# Sourced by the CUDA device scripts (peer-run.sh, gpu-checks-run.sh,
# step-variants-run.sh, hopper-attention-run.sh, dresid-run.sh,
# kernel-ab-run.sh, head-memory-run.sh, flash-grid-run.sh,
# head-quarter-run.sh, ...) once G and OUT are set: the carried
# binaries unpacked onto PATH, and the steps they share. The environment a
# caller sets (KILN_CUDA_*) reaches every command.

# unpack NAME...: $G/NAME.gz into a fresh directory on PATH.
unpack() {
  B=$(mktemp -d); export PATH=$B:$PATH
  for f in "$@"; do gzip -dc $G/$f.gz > $B/$f && chmod +x $B/$f; done
}

S=$SECONDS
log() { echo "### $(date -u +%H:%M:%S) t=$((SECONDS-S))s $*"; }

# tok: tok/s and peak GiB of the JSON line `sched bench` ends with.
tok() { python3 -c "import sys,json; l=sys.stdin.read(); d=json.loads(l[l.index('{'):]); print(round(d['tok_per_sec']), round(d['peak_gib'],2))"; }

# kbench BUILD MODEL BATCH [ARGS...]: tok/s and peak GiB of BUILD's `bench`
# at MODEL BATCH x 1024, 30 steps, ARGS added (--accumulate N, ...).
kbench() {
  local s=$1 m=$2 b=$3; shift 3
  timeout 90 $s bench --engine cuda --model $m --batch $b --seq 1024 --steps 30 "$@" 2>&1 | tail -1 | tok
}

# kprofile BUILD MODEL BATCH PATTERN: BUILD's `bench --profile` at MODEL
# BATCH x 1024, its step line and the kernels matching PATTERN on one line.
kprofile() {
  timeout 60 $1 bench --engine cuda --model $2 --batch $3 --seq 1024 --steps 30 --profile 2>&1 |
    grep -E "^  ($4)|^kernel" | tr -s ' ' | tr '\n' ';'
}

# gpu_tests NAME SECONDS ARGS...: kernels.test ARGS in kernels/, its log in
# $OUT/tests_NAME.log; prints the verdicts, what failed and the count passed.
gpu_tests() {
  local name=$1 t=$2; shift 2
  (cd kernels && timeout $t kernels.test -test.v "$@" > $OUT/tests_$name.log 2>&1; echo "rc=$?" >> $OUT/tests_$name.log)
  grep -E "^(--- FAIL|ok|FAIL|PASS|rc=|panic)|^    [a-z_0-9]+_test.go:[0-9]+: [^ ]" $OUT/tests_$name.log | tail -12
  echo "tests passed: $(grep -c -- '^--- PASS' $OUT/tests_$name.log)"
}

# verify PRECISION GOLDEN: `sched verify` on model/testdata/golden/GOLDEN,
# at bf16's tolerances in bf16; the output goes to $OUT/verify.log.
verify() {
  local tol=()
  [ "$1" = bf16 ] && tol=(--loss-rtol 5e-3 --grad-rtol 3e-2 --logits-rtol 3e-2 --significant 3e-2)
  timeout 30 sched verify --engine cuda --precision $1 "${tol[@]}" --golden model/testdata/golden/$2 > /tmp/v.log 2>&1
  local rc=$?
  echo "verify $1 $2 sm80=${KILN_CUDA_FORCE_SM80:-0} rc=$rc"
  { echo "## $1 $2 sm80=${KILN_CUDA_FORCE_SM80:-0}"; cat /tmp/v.log; } >> $OUT/verify.log
}

# curves: the 200-step loss curve six times at once, from the CPU curve
# kept in $G/curve (tokenizer.json, cpu_curve.tsv, texts/); each run's
# worst logged step, and its curve in $OUT/loss_curve_N.tsv.
curves() {
  local i
  for i in 1 2 3 4 5 6; do
    rm -rf /tmp/cv$i; mkdir -p /tmp/cv$i; cp $G/curve/cpu_curve.tsv $G/curve/tokenizer.json /tmp/cv$i/
    (cd kernels && KILN_CURVE_TEXTS=$G/curve/texts KILN_CURVE_OUT=/tmp/cv$i timeout 200 kernels.test -test.run LossCurve -test.v > /tmp/cv$i.log 2>&1; echo "rc=$?" >> /tmp/cv$i.log) &
  done
  wait
  for i in 1 2 3 4 5 6; do
    echo "run $i: $(grep -h 'worst logged' /tmp/cv$i.log | sed 's/.*curve_test.go:[0-9]*: //') $(grep rc= /tmp/cv$i.log)"
    cp /tmp/cv$i/loss_curve.tsv $OUT/loss_curve_$i.tsv 2>/dev/null
  done | tee $OUT/curves.txt
}

# peer SECONDS PLAN MODE...: the PyTorch peer ($G/torch_peer.py) in each
# MODE on PLAN (model:batch:seq, comma-separated), its JSON lines on stdout.
peer() {
  local t=$1 plan=$2; shift 2
  PYTHONUNBUFFERED=1 timeout $t python3 $G/torch_peer.py "$@" --plan $plan 2>&1 | grep --line-buffered -v Warning
}

# variant NAME BUILD ENV...: NAME on PATH runs BUILD with ENV set
# (KILN_CUDA_OVERLAP=off ...), so that kbench and the row loops take it as
# a build of its own.
variant() {
  local name=$1 build=$2; shift 2
  printf '#!/bin/sh\nexec env %s %s "$@"\n' "$*" "$build" > $B/$name && chmod +x $B/$name
}

# variants NAME:BUILD:ENV...: each word made a variant (above); prints the
# names.
variants() {
  local v name build env
  for v in "$@"; do IFS=: read -r name build env <<< "$v"; variant $name $build $env; echo $name; done
}

# clocks_start: the GPU's SM clock and power every 100 ms into
# $OUT/clocks.csv until clocks_summary; clocks_phase NAME marks where a
# phase of the call starts.
clocks_start() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 > $OUT/clocks.csv &
  CLOCKS_PID=$!
  : > $OUT/phases.txt
}
clocks_phase() { echo "$(date -u +%H:%M:%S.%N | cut -c1-12) $1" >> $OUT/phases.txt; }

# clocks_summary: for each phase, the median SM clock and power of the
# samples that drew more than 550 W (the GPU under load, not between runs).
clocks_summary() {
  kill $CLOCKS_PID 2>/dev/null
  python3 - $OUT/clocks.csv $OUT/phases.txt <<'PY' | tee $OUT/clocks.txt
import csv, statistics, sys
phases = [l.split(None, 1) for l in open(sys.argv[2]) if l.strip()]
load = {}
for r in csv.reader(open(sys.argv[1])):
    try:
        t, mhz, watts = r[0].split()[1][:12], int(r[1].split()[0]), float(r[2].split()[0])
    except (IndexError, ValueError):
        continue
    name = [p for s, p in phases if s <= t]
    if name and watts > 550:
        load.setdefault(name[-1].strip(), []).append((mhz, watts))
for s, p in phases:
    v = load.get(p.strip(), [])
    if v:
        print(f"{p.strip()}: {len(v)} samples above 550 W, SM clock median {statistics.median(m for m, _ in v):.0f} MHz, power median {statistics.median(w for _, w in v):.0f} W")
PY
}

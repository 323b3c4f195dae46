#!/bin/bash
# kiln's step and torch.compile's side by side, kernel by kernel, from
# CUPTI timelines (docs/benchmarks/ktrace) in one call on the GPU host: for
# each row in ROWS (MODEL:BATCH, seq 1024; default small 64 and base 32),
# `sched bench` and `torch_peer.py compile` traced, then analyze.py over the
# last 20 steps of each with the kernels summed by kind (attention, GEMMs,
# loss, norms, optimizer, other). $G holds sched.gz and torch_peer.py, as
# for peer-run.sh; the reports and the gzipped timelines land in $OUT.
# Tracing costs kiln about 5% of its tok/s: compare kinds, not tok/s.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/timeline}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
D=$(dirname "$0")/ktrace
unpack sched
bash $D/build.sh | tail -1
# trace NAME FIRST CMD...: CMD under ktrace; analyze.py's report on its
# largest timeline (torch.compile's workers write theirs too) in
# $OUT/NAME.txt, steps starting at kernels matching FIRST.
trace() {
  local name=$1 first=$2; shift 2
  rm -f /tmp/kt_$name.*
  CUDA_INJECTION64_PATH=/tmp/ktrace.so KTRACE_OUT=/tmp/kt_$name timeout 300 "$@" > $OUT/$name.out 2>&1
  local f=$(ls -S /tmp/kt_$name.* | head -1)
  python3 $D/analyze.py $f --first "$first" --steps 20 --top 50 --gaps 20 --groups > $OUT/$name.txt 2>&1
  gzip -c $f > $OUT/$name.csv.gz
  echo "$name: $(head -2 $OUT/$name.txt | tr '\n' ' ')"
  sed -n '/^by kind/,$p' $OUT/$name.txt
}
for r in ${ROWS:-small:64 base:32}; do set -- ${r/:/ }
  log "$1 $2"
  trace kiln_$1$2 '^embed_fwd$' sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps 30
  trace torch_$1$2 'fused_rms_norm__to_copy_embedding_0' python3 $G/torch_peer.py compile --plan $1:$2:1024
done
log end

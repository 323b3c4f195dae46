#!/bin/bash
# What a checkpoint costs the steps around it, in one call on the GPU host:
# `sched bench` with checkpoints written beside the steps at the pilot's
# shape (small 8 x 1024, one every 300 of 1250 steps, twice) and at base
# 16 x 1024 (one every 200 of 650), then the same shapes without: tok/s of
# all steps, of the steps around a checkpoint (its own and the two after
# it, the first checkpoint's left out) and of the others, the seconds the
# steps around a checkpoint took beyond as many other steps, each
# checkpoint step's seconds and peak GiB. $G holds sched.gz; output under
# $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/checkpoint-steps}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
unpack sched
# ck: the figures of the JSON line `sched bench --checkpoint-every` ends with.
ck() {
  python3 -c "import sys,json; l=sys.stdin.read(); d=json.loads(l[l.index('{'):]); c=d['checkpoints']
print(f\"all {round(d['tok_per_sec'])} around {round(c['around_checkpoint_tok_per_sec'])} other {round(c['other_step_tok_per_sec'])} extra {c['around_checkpoint_extra_s']*1000:.1f} ms written {c['written']} steps {[round(x, 4) for x in c['checkpoint_step_seconds']]} peak {d['peak_gib']:.2f}\")"
}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for r in "small 8 1250 300" "small 8 1250 300" "base 16 650 200"; do set -- $r
  echo "$1 $2 every $4 of $3: $(timeout 150 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps $3 --checkpoint-every $4 2>&1 | tail -1 | ck)"
done | tee $OUT/bench.txt
for r in "small 8 300" "base 16 200"; do set -- $r
  echo "$1 $2 no checkpoints: $(timeout 90 sched bench --engine cuda --model $1 --batch $2 --seq 1024 --steps $3 2>&1 | tail -1 | tok)"
done | tee -a $OUT/bench.txt
log end

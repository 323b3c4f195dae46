#!/bin/bash
# The GPU user's path in one call on the GPU host (about a minute): every
# kernel test, then `sched train` on the CUDA engine (small, 8 x 1024, 400
# steps, a checkpoint every 100): refused at once when it asks for
# evaluations its store cannot feed; uninterrupted; and the same run
# stopped with SIGTERM once step 160 is logged and resumed with --resume in
# a new process: every logged loss compared. $G holds sched.gz,
# kernels.test.gz, store.tgz (a token store, tokens/go-stdlib, and its
# tokenizer.json: `sched demo`'s, tarred from its directory); output
# under $OUT.
OUT=${OUT:-/tmp/gpu-resume}; mkdir -p $OUT
G=${G:-$PWD/.carry/g}; . "$(dirname "$0")/cuda-checks.sh"
unpack sched kernels.test
log tests; gpu_tests native 240 -test.skip LossCurve; grep -E 'Remembered|TunedGemms' $OUT/tests_native.log | head -4
L=/tmp/live; rm -rf $L; mkdir -p $L; cd $L; tar xzf $G/store.tgz
T="sched train --engine cuda --model small --batch 8 --seq 1024 --steps 400 --checkpoint-every 100 --log-every 20 --tokens tokens/go-stdlib --tokenizer-file tokenizer.json --seed 7"
log refused; $T --eval-every 100 --out C > $OUT/C.log 2>&1; echo "eval on a store without held-out windows: rc=$?"; tail -1 $OUT/C.log; ls C 2>&1 | head -3
ls -la ~/.cache/kiln/kernels/ | grep gemm
log uninterrupted; $T --out A > $OUT/A.log 2>&1; echo "rc=$?"
log stopped; $T --out B > $OUT/B1.log 2>&1 & PID=$!
until grep -q '"step":160,' B/metrics.jsonl 2>/dev/null || ! kill -0 $PID 2>/dev/null; do sleep 0.02; done
kill -TERM $PID; wait $PID; echo "first part rc=$?"; tail -3 $OUT/B1.log
log resumed; $T --out B --resume > $OUT/B2.log 2>&1; echo "resume rc=$?"; head -3 $OUT/B2.log; tail -2 $OUT/B2.log
ls A B; cp A/metrics.jsonl $OUT/A.jsonl; cp B/metrics.jsonl $OUT/B.jsonl
python3 - <<'PY'
import json
def rd(f):
    d = {}
    for l in open(f):
        r = json.loads(l); d.setdefault(r["step"], []).append(r)
    return d
a, b = rd("A/metrics.jsonl"), rd("B/metrics.jsonl")
same = all(b.get(s) and b[s][-1]["loss"] == v[-1]["loss"] for s, v in a.items())
print("steps logged", sorted(a)[:3], "...", sorted(a)[-1], "| B steps", sorted(b)[-1], "| every logged loss equal:", same)
for s in sorted(a):
    r, q = a[s][-1], b[s][-1]
    print(s, "loss A %.6f B %.6f" % (r["loss"], q["loss"]), "eval A %s B %s" % (r.get("eval_loss"), q.get("eval_loss")), "tok/s A %.0f B %.0f" % (r.get("tok_per_s", 0), q.get("tok_per_s", 0)))
PY
ls -la ~/.cache/kiln/kernels/ | grep gemm; grep -i "gemm\|choices" $OUT/A.log $OUT/B1.log $OUT/B2.log | head -5
log generate; timeout 60 sched generate --engine cuda --checkpoint B/step-0000400 --prompt 'func main() {' --max-tokens 40 --temperature 0 2>&1 | tail -5
log end

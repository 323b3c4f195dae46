# TensorBoard's own reader against kiln's event files: every scalar of metrics.jsonl
# (train loss, eval loss, lr, grad norm, tok/s) must be in the event files at its step, as float32,
# and nothing else. python3 tensorboard_check.py <dir of event files> <metrics.jsonl>
import json, sys, glob, struct
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = acc.Tags()["scalars"]
print("tags", sorted(tags))
recs = [json.loads(l) for l in open(sys.argv[2])]
def f32(x): return struct.unpack("f", struct.pack("f", x))[0]
want = {"train/loss": "loss", "eval/loss": "eval_loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "perf/tok_per_s": "tok_per_s"}
bad = 0; n = 0
for tag, key in want.items():
    got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
    exp = {r["step"]: r[key] for r in recs if key in r and (key != "loss" or "loss" in r)}
    if key in ("lr", "grad_norm", "tok_per_s"):
        exp = {r["step"]: r[key] for r in recs if "loss" in r and key in r}
    for s, v in exp.items():
        n += 1
        if s not in got or abs(got[s] - f32(v)) > 1e-6 * max(1, abs(v)):
            bad += 1
            if bad < 5: print("mismatch", tag, s, got.get(s), v)
    extra = set(got) - set(exp)
    if extra: bad += len(extra); print("extra steps", tag, sorted(extra)[:5])
print(f"tensorboard event_accumulator: {n} scalars compared with metrics.jsonl, {bad} mismatches")
sys.exit(1 if bad or n == 0 else 0)

"""Reads a ktrace CSV (start,end,stream,grid,block,regs,name) and prints,
over the last N steps (a step begins at each kernel matching --first):
the step's wall time, each stream's busy time, the GPU's idle time (no
kernel on any stream), the main stream's gaps, and the kernels' time by
name (their own duration, summed per step)."""
import sys, re, collections, argparse
ap = argparse.ArgumentParser()
ap.add_argument("csv"); ap.add_argument("--first", default="^embed_fwd$"); ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--top", type=int, default=40); ap.add_argument("--gaps", type=int, default=15)
ap.add_argument("--groups", action="store_true", help="also sum the kernels by kind (attention, GEMMs, ...), kiln's names and torch's")
a = ap.parse_args()
ks = []
for line in open(a.csv):
    p = line.rstrip("\n").split(",", 6)
    if len(p) < 7: continue
    ks.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6]))
ks.sort()
first = re.compile(a.first)
starts = [i for i, k in enumerate(ks) if first.search(k[6])]
if len(starts) < 3: sys.exit(f"only {len(starts)} step starts")
starts = starts[-(a.steps + 1):]
n = len(starts) - 1
t0, t1 = ks[starts[0]][0], ks[starts[-1]][0]
sel = [k for k in ks if t0 <= k[0] < t1]
wall = (t1 - t0) / n / 1e6
def union(iv):
    tot, cur = 0, None
    for s, e in sorted(iv):
        if cur is None or s > cur[1]:
            if cur: tot += cur[1] - cur[0]
            cur = [s, e]
        else: cur[1] = max(cur[1], e)
    if cur: tot += cur[1] - cur[0]
    return tot
streams = collections.Counter(k[2] for k in sel)
print(f"{n} steps, {wall:.3f} ms a step, {len(sel)/n:.0f} kernels a step, streams {dict(streams)}")
allbusy = union([(k[0], k[1]) for k in sel]) / n / 1e6
print(f"GPU busy (any stream) {allbusy:.3f} ms, idle {wall-allbusy:.3f} ms")
for s in streams:
    ss = [k for k in sel if k[2] == s]
    b = union([(k[0], k[1]) for k in ss]) / n / 1e6
    own = sum(k[1] - k[0] for k in ss) / n / 1e6
    print(f"stream {s}: busy {b:.3f} ms, kernel sum {own:.3f} ms, {len(ss)/n:.0f} kernels")
main = streams.most_common(1)[0][0]
ms = [k for k in sel if k[2] == main]
gaps = collections.defaultdict(lambda: [0, 0])
for x, y in zip(ms, ms[1:]):
    g = y[0] - x[1]
    key = (x[6][:40], y[6][:40])
    gaps[key][0] += g; gaps[key][1] += 1
tg = sum(v[0] for v in gaps.values()) / n / 1e6
print(f"main stream gaps: {tg:.3f} ms a step; largest by pair (ms a step, count a step):")
for key, v in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:a.gaps]:
    print(f"  {v[0]/n/1e6:7.3f} {v[1]/n:5.1f}  {key[0]} -> {key[1]}")
byname = collections.defaultdict(lambda: [0, 0, set()])
for k in sel:
    byname[k[6]][0] += k[1] - k[0]; byname[k[6]][1] += 1; byname[k[6]][2].add(k[2])
print("kernels (ms a step, launches a step, streams, grid, block, regs):")
tot = 0
for name, v in sorted(byname.items(), key=lambda kv: -kv[1][0])[:a.top]:
    ex = next(k for k in sel if k[6] == name)
    tot += v[0]
    print(f"  {v[0]/n/1e6:7.3f} {v[1]/n:6.1f} {sorted(v[2])} g{ex[3]} b{ex[4]} r{ex[5]} {name[:110]}")
print(f"  sum of all kernels {sum(v[0] for v in byname.values())/n/1e6:.3f} ms")
# Kinds of kernel, first match wins: kiln's names and torch.compile's
# (cuDNN's attention with its dO.O and dq-to-bf16 helpers, cuBLAS's nvjet
# GEMMs, Triton's fused kernels).
GROUPS = [
    ("attention", r"flash|sdpa|fmha|attn|dot_do_o|convert_dq"),
    ("GEMMs", r"nvjet|gemm|cutlass|xmma|splitKreduce|cublas"),
    ("loss", r"xent|log_softmax|cross_entropy|nll"),
    ("norms", r"rmsnorm|rms_norm|rsqrt"),
    ("optimizer", r"adamw|adam|multi_tensor|foreach|sumsq|amp_"),
    ("memsets, copies", r"^\[mem"),
]
if a.groups:
    tot = collections.Counter()
    other = collections.Counter()
    for name, v in byname.items():
        g = next((g for g, rx in GROUPS if re.search(rx, name, re.I)), "other")
        tot[g] += v[0]
        if g == "other":
            other[name] += v[0]
    print("by kind (kernels' own time, ms a step; streams that overlap count in full):")
    for g, _ in GROUPS + [("other", "")]:
        print(f"  {g:16s} {tot[g]/n/1e6:7.3f}")
    print("  largest of other: " + "; ".join(f"{k[:50]} {v/n/1e6:.3f}" for k, v in other.most_common(8)))

"""Where torch.compile's training step spends its GPU time: the PyTorch peer
(torch_peer.py, next to this file when run) compiled as the peer compiles
it, warmed up, then STEPS steps under torch.profiler. Prints milliseconds
per step by group (GEMMs, attention, Triton's fused kernels, the optimizer,
the rest) and the largest kernels, as one JSON line per group table.

usage: python3 torch_profile.py [name:B:T ...]   (default small:32:1024)
"""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import torch_peer as peer

STEPS = 10


def group(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention"
    if any(s in n for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_", "ampere_", "wgmma")):
        return "gemm"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if n.startswith("triton"):
        return "triton"
    return "other"


def profile_run(name, B, T):
    V, d, L, h, kv, ff = peer.CONFIGS[name]
    torch.manual_seed(0)
    m = peer.LM(V, d, L, h, kv, ff, T).cuda()
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=4e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(m)
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(8):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    by_group, by_kernel = defaultdict(float), defaultdict(float)
    for ev in prof.key_averages():
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        if us <= 0 or ev.key.startswith("ProfilerStep"):
            continue
        # Only kernels: the profiler's CPU-side operators also carry device time.
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        by_group[group(ev.key)] += us / 1000 / STEPS
        by_kernel[ev.key] += us / 1000 / STEPS
    total = sum(by_group.values())
    print(json.dumps(dict(config=name, batch=B, seq=T, mode="compile", kernel_ms_per_step=round(total, 3),
                          groups={k: round(v, 3) for k, v in sorted(by_group.items(), key=lambda kv: -kv[1])})), flush=True)
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:25]
    for k, v in top:
        print(f"  {v:7.3f} ms  {group(k):9s}  {k[:110]}", flush=True)


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    for spec in sys.argv[1:] or ["small:32:1024"]:
        name, B, T = spec.split(":")
        profile_run(name, int(B), int(T))

"""PyTorch DistributedDataParallel peer for kiln's training on several GPUs:
the model of torch_peer.py (kept beside this file), bf16 autocast over fp32
master weights, fused AdamW, gradients all-reduced by DDP's buckets
overlapped with the backward (its default 25 MB), one process a GPU.

    python3 -m torch.distributed.run --standalone --nproc_per_node=N ddp_peer.py [MODE] --plan small:32:1024,base:16:1024

MODE is eager or compile (torch.compile's default) or another torch.compile
mode. Each rank trains B x T tokens a step (the per-GPU shape, as `sched
bench --gpus N --batch B` takes it). Rank 0 prints one JSON line a shape:
gpus, tok/s of all GPUs together, tok/s per GPU, peak GiB, loss. Run it with
N = 1 and N = 2 in the same call for the peer's scaling."""
import os

# NVLink multicast stays off in every NCCL process: a multicast object left
# behind on a shared host can take its GPUs out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"

import json, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import CONFIGS, LM  # noqa: E402


def run(name, B, T, mode, steps=30, warm=8):
    rank, world = dist.get_rank(), dist.get_world_size()
    V, d, L, h, kv, ff = CONFIGS[name]
    torch.manual_seed(0)  # the same initial weights on every rank
    m = LM(V, d, L, h, kv, ff, T).cuda()
    ddp = DDP(m, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=4e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = ddp if mode == "eager" else torch.compile(ddp) if mode == "compile" else torch.compile(ddp, mode=mode)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)  # each rank its own share
    idx = torch.randint(0, V, (B, T), device="cuda", generator=g)
    tgt = torch.randint(0, V, (B, T), device="cuda", generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dist.barrier()
    el = time.perf_counter() - t
    tok = world * B * T * steps / el
    peak = torch.cuda.max_memory_allocated() / 2**30
    if rank == 0:
        print(json.dumps(dict(config=name, batch=B, seq=T, mode=mode, gpus=world, tok_s=round(tok),
                              tok_s_per_gpu=round(tok / world), peak_gib=round(peak, 2),
                              loss=round(loss.item(), 3))), flush=True)
    del ddp, m, opt, fwd
    torch.cuda.empty_cache()


if __name__ == "__main__":
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.backends.cuda.matmul.allow_tf32 = True
    args = sys.argv[1:]
    plan = [("small", 32, 1024), ("base", 16, 1024)]
    if "--plan" in args:
        i = args.index("--plan")
        plan = [(p.split(":")[0], int(p.split(":")[1]), int(p.split(":")[2])) for p in args[i + 1].split(",")]
        args = args[:i] + args[i + 2:]
    if dist.get_rank() == 0:
        print("torch", torch.__version__, torch.cuda.get_device_name(), "nccl", torch.cuda.nccl.version(),
              "gpus", dist.get_world_size(), flush=True)
    for mode in args or ["compile"]:
        for name, B, T in plan:
            try:
                run(name, B, T, mode)
            except Exception as e:
                if dist.get_rank() == 0:
                    print("FAILED", name, B, T, mode, repr(e)[:300], flush=True)
    dist.destroy_process_group()

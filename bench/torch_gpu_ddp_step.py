"""PyTorch DDP (NCCL) step time on GPUs, the counterpart of real/gpu_ddp_step_bench (docs/gpu.md).

    torchrun --standalone --nproc_per_node=W bench/torch_gpu_ddp_step.py --width 2048 --layers 3 --batch 256 \
        --steps 50 [--amp bf16|fp16]

An MLP of --layers Linear(width, width) + ReLU blocks in DDP (default buckets), MSE against a fixed target, SGD lr
0.01, per-rank batch --batch; 10 warm-up steps, then --steps timed steps; rank 0 prints ms per step.
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    a = p.parse_args()
    dist.init_process_group("nccl")
    r = dist.get_rank()
    torch.cuda.set_device(r)
    layers = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    m = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).cuda(), device_ids=[r])
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(a.batch, a.width, device="cuda")
    y = torch.randn_like(x)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=a.amp == "fp16")
    for i in range(10 + a.steps):
        if i == 10:
            torch.cuda.synchronize()
            t = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.mse_loss(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    if r == 0:
        print(f"{(time.perf_counter() - t) / a.steps * 1e3:.3f} ms/step (torch {torch.__version__}, amp {a.amp})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

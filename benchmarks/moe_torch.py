#!/usr/bin/env python3
"""benchmarks/moe_torch.py: the PyTorch half of benchmarks/moe_step.lua.

transformers' MixtralSparseMoeBlock (width 512, 8 experts of 1792, top-2)
in eager PyTorch on the CPU in f32, trained the way moe_step.lua trains
nn.MoE: forward, loss = sum(y * r) + 0.02 * load_balancing_loss_func,
backward, AdamW (fused=True, its fastest CPU form), zero_grad. Prints
`RESULT {json}` with the median ms per step.

  python3 benchmarks/moe_torch.py [--steps=10] [--warmup=3] [--batch=4] [--seq=256]

Threads: torch.set_num_threads(OMP_NUM_THREADS or the cores), as fsdp-lua
uses OpenMP and OpenBLAS threads.
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("steps", 10), ("warmup", 3), ("batch", 4), ("seq", 256), ("dim", 512),
                          ("ffn", 1792), ("experts", 8), ("top_k", 2)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(1)
    cfg = MixtralConfig(hidden_size=a.dim, intermediate_size=a.ffn, num_local_experts=a.experts,
                        num_experts_per_tok=a.top_k)
    cfg._experts_implementation = "eager"
    block = MixtralSparseMoeBlock(cfg).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-4, fused=True)
    x = torch.randn(a.batch, a.seq, a.dim)
    r = torch.randn(a.batch, a.seq, a.dim)
    logits = {}
    block.gate.register_forward_hook(lambda m, i, o: logits.__setitem__("l", o[0]))
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        y = block(x)
        loss = (y * r).sum() + 0.02 * load_balancing_loss_func((logits["l"],), a.experts, a.top_k)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    print(f"moe_step (torch {torch.__version__} eager): {ms:.1f} ms/step median of {len(times)} (min {min(times):.1f})")
    print("RESULT " + json.dumps({"impl": "torch-eager", "ms": round(ms, 3), "min_ms": round(min(times), 3)}))


if __name__ == "__main__":
    main()

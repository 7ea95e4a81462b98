#!/usr/bin/env python3
"""benchmarks/moe_torch.py: the PyTorch half of benchmarks/moe_step.lua.

transformers' MixtralSparseMoeBlock (width 512, 8 experts of 1792, top-2)
in eager PyTorch on the CPU in f32, trained the way moe_step.lua trains
nn.MoE: forward, loss = sum(y * r) + 0.02 * load_balancing_loss_func,
backward, AdamW (fused=True, its fastest CPU form), zero_grad. Prints
`RESULT {json}` with the median ms per step.

  python3 benchmarks/moe_torch.py [--steps=10] [--warmup=3] [--batch=4] [--seq=256] [--layers=N]
                                  [--experts_impl=eager|batched_mm|grouped_mm]

--layers=N: MixtralForCausalLM of N layers (8 heads, 2 KV heads, vocab 32000,
sdpa attention, output_router_logits with router_aux_loss_coef 0.02) on random
ids, as moe_step.lua --layers=N builds it. --experts_impl picks transformers'
experts implementation (its default where not given).

Threads: torch.set_num_threads(OMP_NUM_THREADS or the cores), as fsdp-lua
uses OpenMP and OpenBLAS threads.
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("steps", 10), ("warmup", 3), ("batch", 4), ("seq", 256), ("dim", 512),
                          ("ffn", 1792), ("experts", 8), ("top_k", 2), ("layers", 0)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--experts_impl", default=None)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(1)
    cfg = MixtralConfig(hidden_size=a.dim, intermediate_size=a.ffn, num_local_experts=a.experts,
                        num_experts_per_tok=a.top_k, num_hidden_layers=max(a.layers, 1), num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=32000, max_position_embeddings=a.seq,
                        output_router_logits=True, router_aux_loss_coef=0.02)
    if a.experts_impl:
        cfg._experts_implementation = a.experts_impl
    if a.layers:
        model = MixtralForCausalLM._from_config(cfg, attn_implementation="sdpa").float()
        if a.experts_impl:
            model.set_experts_implementation(a.experts_impl)
    else:
        model = MixtralSparseMoeBlock(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if a.layers:
        ids = torch.randint(0, 32000, (a.batch, a.seq))
        labels = torch.randint(0, 32000, (a.batch, a.seq))

        def step_loss():
            return model(input_ids=ids, labels=labels).loss
    else:
        x = torch.randn(a.batch, a.seq, a.dim)
        r = torch.randn(a.batch, a.seq, a.dim)
        logits = {}
        model.gate.register_forward_hook(lambda m, i, o: logits.__setitem__("l", o[0]))

        def step_loss():
            y = model(x)
            return (y * r).sum() + 0.02 * load_balancing_loss_func((logits["l"],), a.experts, a.top_k)
    model.train()
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = step_loss()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    print(f"moe_step (torch {torch.__version__} eager): {ms:.1f} ms/step median of {len(times)} (min {min(times):.1f})")
    impl = "torch-eager" + ("/" + a.experts_impl if a.experts_impl else "")
    print("RESULT " + json.dumps({"impl": impl, "layers": a.layers, "ms": round(ms, 3), "min_ms": round(min(times), 3)}))


if __name__ == "__main__":
    main()

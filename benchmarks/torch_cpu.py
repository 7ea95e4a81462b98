#!/usr/bin/env python3
"""benchmarks/torch_cpu.py: issue 21's PyTorch half of the CPU comparison.

The two models of benchmarks/train_step.lua in plain PyTorch, trained the
same way on the CPU in f32 (forward, loss, backward, AdamW step, zero_grad;
synthetic token ids): GPT-2 124M (models/gpt2.lua's 'gpt2': learned
positions, pre-norm blocks, tanh GELU, tied head; batch 4 x 64) and the
small Llama (models/llama.lua's 'small', the model of
benchmarks/llama_torch.py; batch 4 x 256). Attention through
F.scaled_dot_product_attention, AdamW with fused=True (its fastest CPU
form), eager or torch.compile. One line `RESULT {json}` per model, with
the keys benchmarks/cpu_compare.sh reads (ms is the median step).

  python3 benchmarks/torch_cpu.py [--mode=eager|compile] [--precision=f32|bf16] [--only=gpt2|llama]
                                  [--steps=5] [--warmup=2]

--precision=bf16 is PyTorch's CPU mixed precision: f32 weights and
optimizer, the forward and loss under torch.autocast('cpu', bfloat16)
(products in bf16 on oneDNN, AMX where the CPU has it; norms, softmax
and the loss in f32), the backward outside it, as PyTorch's AMP recipes
do; fsdp-lua's counterpart is benchmarks/train_step.lua --precision=bf16.

Threads: torch.set_num_threads(OMP_NUM_THREADS or the cores), as
fsdp-lua uses OpenMP and OpenBLAS threads.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch  # noqa: E402  (the Llama of the GPU benchmark)

SMALL_LLAMA = dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1376, vocab_size=32000,
                   tied=False, rope_theta=1e4, rope_scaling=None)
GPT2_CONFIG = dict(dim=768, n_layers=12, n_heads=12, ffn_dim=3072, vocab_size=50257, n_positions=1024)


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.h = c["n_heads"]
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, c["ffn_dim"])
        self.mlp_proj = nn.Linear(c["ffn_dim"], d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["dim"])
        self.wpe = nn.Embedding(c["n_positions"], c["dim"])
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["n_layers"]))
        self.ln_f = nn.LayerNorm(c["dim"], eps=1e-5)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def loss(self, ids, targets):
        T = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
        for block in self.h:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)  # the tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def bench(name, model, vocab, B, T, flops_per_token, args):
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    loss_fn = model.loss
    if args.precision == "bf16":
        def loss_fn(ids, targets):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model.loss(ids, targets)
    if args.mode == "compile":
        loss_fn = torch.compile(loss_fn)

    def step():  # the step's phases: forward (with the loss), backward, optimizer
        t0 = time.perf_counter()
        loss = loss_fn(ids, targets)
        loss.item()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    t0 = time.perf_counter()
    step()  # compiles when compiling
    first = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    times, phases = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        phases.append(step())
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    fwd, bwd, upd = (statistics.median(p[i] for p in phases) * 1e3 for i in range(3))
    flops = flops_per_token(n_params) * B * T
    r = dict(impl="torch-" + args.mode, model=name, precision=args.precision, params=n_params, batch=B, seq=T,
             ms=dt * 1e3,
             fwd_ms=fwd, bwd_ms=bwd, opt_ms=upd,
             tokens_per_s=B * T / dt, gflops=flops / dt / 1e9, first_step_s=first,
             threads=torch.get_num_threads(), torch=torch.__version__)
    print(f"{name}: {n_params:,} parameters, {dt * 1e3:.0f} ms/step, {B * T / dt:.0f} tokens/s, "
          f"{flops / dt / 1e9:.1f} GFLOP/s ({args.mode}, {args.precision}; first step {first:.1f} s)")
    print("RESULT " + json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--only", default="", choices=["", "gpt2", "llama"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count()))
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.mode}, {args.precision}")
    if args.only in ("", "gpt2"):
        c = GPT2_CONFIG
        L, D, T = c["n_layers"], c["dim"], 64
        # 6N + 12 L D T, N without the position table (nanoGPT's estimate)
        bench("GPT-2 124M, batch 4 x 64", GPT2(c), c["vocab_size"], 4, T,
              lambda n: 6 * (n - c["n_positions"] * D) + 12 * L * D * T, args)
    if args.only in ("", "llama"):
        c, T = SMALL_LLAMA, 256
        bench("small Llama, batch 4 x 256", llama_torch.Llama(c, "native"), c["vocab_size"], 4, T,
              lambda n: llama_torch.flops_per_token(c, T, n), args)


if __name__ == "__main__":
    main()

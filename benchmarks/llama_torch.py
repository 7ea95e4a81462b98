#!/usr/bin/env python3
"""benchmarks/llama_torch.py: issue 7's PyTorch-eager half of the GPU benchmark.

The model of benchmarks/llama_gpu.lua (models/llama.lua) in plain PyTorch,
no transformers dependency, written as Hugging Face's LlamaForCausalLM
computes it: nn.Embedding, RMSNorm in f32 cast back before the weight,
rotate-half RoPE (llama3 frequency scaling where the config has it),
grouped-query attention through F.scaled_dot_product_attention(is_causal=True),
SwiGLU MLP, a head tied to the embedding where the config says so; every
weight N(0, 0.02), norms ones; parameters in bf16; torch.optim.AdamW
(foreach, its default on CUDA; moments in the parameters' dtype) with the
same lr and weight decay. The same flags, timing rule and closing
`RESULT {json}` line as the Lua script, so benchmarks/gpu_compare.sh reads
both alike.

  python3 benchmarks/llama_torch.py                      # Llama-3.2-1B, cuda:0, seq 2048, batch 1
  python3 benchmarks/llama_torch.py --find_batch
  python3 benchmarks/llama_torch.py --device=cpu --model=tiny --seq=64 --batch=2 --steps=2

Attention: with torch >= 2.5 the kv heads go to SDPA as they are
(enable_gqa=True, the flash backend); --gqa=repeat repeats them first, as
older transformers did. The loss is F.cross_entropy on the bf16 logits (no
f32 copy of the logits), as fsdp-lua computes it.
"""
import argparse
import gc
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The configs of models/llama.lua that the benchmark uses (same fields).
LLAMA3_32 = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_position_embeddings=8192)
CONFIGS = {
    "Llama-3.2-1B": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                         vocab_size=128256, tied=True, rope_theta=5e5, rope_scaling=LLAMA3_32),
    "TinyLlama-1.1B": dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632,
                           vocab_size=32000, tied=False, rope_theta=1e4, rope_scaling=None),
    "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=256,
                 tied=False, rope_theta=1e4, rope_scaling=None),
}
NORM_EPS = 1e-5
INIT_STD = 0.02


def rope_tables(seq, head_dim, theta, scaling, dtype, device):
    """cos, sin [seq, head_dim]: HF's default / llama3 inverse frequencies, in f32, then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is not None:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return self.weight * h.to(dtype)


class Attention(nn.Module):
    def __init__(self, c, gqa):
        super().__init__()
        self.h, self.kv, self.hd = c["n_heads"], c["n_kv_heads"], c["dim"] // c["n_heads"]
        self.gqa = gqa
        self.q_proj = nn.Linear(c["dim"], self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(c["dim"], self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(c["dim"], self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, c["dim"], bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv != self.h and self.gqa == "repeat":
            rep = self.h // self.kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        extra = {"enable_gqa": True} if self.kv != self.h and self.gqa == "native" else {}
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.up_proj = nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.down_proj = nn.Linear(c["ffn_dim"], c["dim"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c, gqa):
        super().__init__()
        self.self_attn = Attention(c, gqa)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["dim"])
        self.post_attention_layernorm = RMSNorm(c["dim"])

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    def __init__(self, c, gqa):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList(DecoderLayer(c, gqa) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"])
        self.lm_head = nn.Linear(c["dim"], c["vocab_size"], bias=False)
        for m in self.modules():  # HF's _init_weights: N(0, 0.02) for every weight
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=INIT_STD)
        if c["tied"]:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = {}

    def loss(self, ids, targets):
        T = ids.shape[1]
        h = self.embed_tokens(ids)
        key = (T, h.dtype, h.device)
        if key not in self.rope:
            hd = self.c["dim"] // self.c["n_heads"]
            self.rope[key] = rope_tables(T, hd, self.c["rope_theta"], self.c["rope_scaling"],
                                         h.dtype, h.device)
        cos, sin = self.rope[key]
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)


def is_oom(e):
    """CUDA out of memory, also as cuBLAS reports it (a RuntimeError)."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and ("out of memory" in str(e) or "ALLOC_FAILED" in str(e)))


def flops_per_token(c, seq, n_params):
    """6N + 12 L H hd T (PaLM appendix B), N without an untied input
    embedding (a lookup), as llama.flops_per_token."""
    n = n_params - (0 if c["tied"] else c["vocab_size"] * c["dim"])
    return 6 * n + 12 * c["n_layers"] * c["dim"] * seq


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="Llama-3.2-1B", choices=sorted(CONFIGS))
    ap.add_argument("--num_layers", type=int, default=0, help="override the layer count (0: keep it)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--find_batch", action="store_true")
    ap.add_argument("--max_batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--gqa", default="native", choices=["native", "repeat"])
    args = ap.parse_args()

    c = dict(CONFIGS[args.model])
    if args.num_layers > 0:
        c["n_layers"] = args.num_layers
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    gqa = args.gqa
    if gqa == "native" and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        gqa = "repeat"  # enable_gqa arrived in torch 2.5
    T = args.seq

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    with torch.device(dev):
        model = Llama(c, gqa)
    model = model.to(dtype).train()
    n_params = sum(p.numel() for p in model.parameters())  # a tied weight once
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(f"torch {torch.__version__} on {name}; attention {gqa}")
    print(f"model {args.model}: {c['n_layers']} layers, dim {c['dim']}, {c['n_heads']} heads "
          f"({c['n_kv_heads']} kv), ffn {c['ffn_dim']}, vocab {c['vocab_size']}, "
          f"{'tied' if c['tied'] else 'untied'} head; {n_params} parameters ({args.dtype} on {dev}), "
          f"built in {time.perf_counter() - t0:.1f} s")

    gen = torch.Generator(device=dev)

    def train_step(B, step):
        gen.manual_seed(args.seed * 1000003 + step)
        ids = torch.randint(0, c["vocab_size"], (B, T), device=dev, generator=gen)
        targets = torch.randint(0, c["vocab_size"], (B, T), device=dev, generator=gen)
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # waits for the device, as loss:item() in the Lua script

    def fits(B):
        ok = True
        try:
            train_step(B, 0)
            train_step(B, 1)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if not is_oom(e):
                raise
            ok = False
        # Drop what a failed step left (the exception held its frames) before the next try.
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        return ok

    B = args.batch
    if args.find_batch:
        good, bad, b = 0, None, 1
        while b <= args.max_batch:
            ok = fits(b)
            print(f"find_batch: batch {b} {'fits' if ok else 'is out of memory'}", flush=True)
            if not ok:
                bad = b
                break
            good, b = b, b * 2
        if good == 0:
            raise SystemExit(f"find_batch: batch 1 x seq {T} does not fit on {dev}")
        while bad is not None and bad - good > 1:
            mid = (good + bad) // 2
            ok = fits(mid)
            print(f"find_batch: batch {mid} {'fits' if ok else 'is out of memory'}", flush=True)
            if ok:
                good = mid
            else:
                bad = mid
        B = good
        print(f"find_batch: largest batch {B}")

    def measure():
        loss0 = loss = None
        for step in range(1, args.warmup + 1):
            loss = train_step(B, step)
            loss0 = loss if loss0 is None else loss0
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        times = []
        for step in range(args.warmup + 1, args.warmup + args.steps + 1):
            t = time.perf_counter()
            loss = train_step(B, step)
            if cuda:
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t)
            loss0 = loss if loss0 is None else loss0
        return loss0, loss, times

    # A batch found to fit by a hair can fail here (fragmentation): then one less.
    while True:
        try:
            loss0, loss, times = measure()
            break
        except RuntimeError as e:
            if not (args.find_batch and B > 1 and is_oom(e)):
                raise
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        print(f"find_batch: batch {B} ran out of memory while measured; measuring {B - 1}", flush=True)
        B -= 1

    step_s = sum(times) / len(times)
    tokens_s = B * T / step_s
    fpt = flops_per_token(c, T, n_params)
    mfu = fpt * tokens_s / (args.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    reserved = torch.cuda.memory_reserved(dev) if cuda else 0
    print(f"batch {B} x seq {T}: {step_s * 1e3:.1f} ms/step, {tokens_s:.0f} tokens/s, "
          f"{fpt * tokens_s / 1e12:.1f} TFLOP/s, MFU {100 * mfu:.1f}% of {args.peak_tflops:g} TFLOP/s")
    print(f"peak memory {peak / 2**30:.3f} GiB allocated, {reserved / 2**30:.3f} GiB reserved; "
          f"loss {loss0:.4f} -> {loss:.4f} (ln V = {math.log(c['vocab_size']):.4f})")
    print("RESULT " + json.dumps(dict(
        impl="torch-eager", model=args.model, device=str(dev), dtype=args.dtype, params=n_params,
        batch=B, seq=T, steps=args.steps, warmup=args.warmup, step_ms=step_s * 1e3,
        tokens_per_s=tokens_s, flops_per_token=fpt, tflops=fpt * tokens_s / 1e12, mfu=mfu,
        peak_tflops=args.peak_tflops, peak_bytes=peak, reserved_bytes=reserved,
        loss_first=loss0, loss_last=loss, torch=torch.__version__, gqa=gqa)))


if __name__ == "__main__":
    main()

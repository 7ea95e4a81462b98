#!/usr/bin/env python3
"""make_llama_golden.py: reference numbers for tiny Llama models.

Run once (Debian's python3-torch is enough: `/usr/bin/python3
tests/golden/make_llama_golden.py`); the outputs are committed and the
tests need no torch. The model is written here from the Hugging Face
LlamaForCausalLM math (RMSNorm in fp32 cast back before the weight,
rotate-half RoPE with optional llama3 frequency scaling and HF's float32
frequency tables, grouped-query
attention, SwiGLU MLP, untied or tied lm_head), independently of
fsdp-lua, and evaluated in float64 (but for the f32 RoPE tables, as in
HF) so the stored numbers are exact to ~1e-15.

Each output file (safetensors, written by hand below so nothing but torch
is needed) holds, under Hugging Face names: the weights, `input_ids` and
`labels` (i64, labels already shifted, with -100 entries), `logits`,
`loss` (a 0-d tensor), and `grad.<weight name>` for every weight.
Metadata holds the config as JSON.
"""
import json
import math
import struct
import sys

import torch

CONFIGS = {
    # Llama-2 style: multi-head attention, untied head, theta 1e4.
    "llama2_tiny": dict(vocab=64, dim=32, layers=2, heads=4, kv_heads=4, ffn=48,
                        theta=1e4, scaling=None, tied=False, eps=1e-5),
    # Llama-3.2 style: grouped-query attention, tied embeddings, theta 5e5
    # with llama3 scaling (factor 32; original context 16 so the scaling
    # changes frequencies at this tiny size).
    "llama3_tiny": dict(vocab=64, dim=32, layers=2, heads=4, kv_heads=2, ffn=48,
                        theta=5e5, tied=True, eps=1e-5,
                        scaling=dict(type="llama3", factor=32.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=16)),
}
BATCH, SEQ = 2, 9


def rms_norm(x, w, eps):
    dtype = x.dtype
    h = x.to(torch.float32 if dtype != torch.float64 else torch.float64)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dtype)


def inv_freq(head_dim, theta, scaling):
    # In float32, operation by operation as transformers'
    # _compute_default_rope_parameters and _compute_llama3_parameters do:
    # HF's tables are f32 whatever the model's dtype.
    freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    if scaling is None:
        return freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(cfg, w, ids):
    d, h, kv = cfg["dim"], cfg["heads"], cfg["kv_heads"]
    hd = d // h
    B, T = ids.shape
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq(hd, cfg["theta"], cfg["scaling"]))
    emb = torch.cat((freqs, freqs), dim=-1)
    # HF takes cos/sin in f32; here they are correctly rounded to f32 (cos in
    # f64, then rounded), which torch's f32 cos matches to within an ulp.
    cos = emb.double().cos().float().double()
    sin = emb.double().sin().float().double()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], cfg["eps"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(B, T, h, hd).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(B, T, kv, hd).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(B, T, kv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(h // kv, dim=1)
        v = v.repeat_interleave(h // kv, dim=1)
        s = (q @ k.transpose(2, 3)) / math.sqrt(hd) + mask
        o = torch.softmax(s, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, T, d) @ w[p + "self_attn.o_proj.weight"].T
        x = x + o
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg["eps"])
        g = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], cfg["eps"])
    head = w["model.embed_tokens.weight"] if cfg["tied"] else w["lm_head.weight"]
    return x @ head.T


def make_weights(cfg, gen):
    d, h, kv, f, V = cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["vocab"]
    hd = d // h
    shapes = {"model.embed_tokens.weight": (V, d)}
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
        })
    shapes["model.norm.weight"] = (d,)
    if not cfg["tied"]:
        shapes["lm_head.weight"] = (V, d)
    w = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norms: near 1, not exactly, so their gradients matter
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        w[name] = t.requires_grad_()
    return w


DTYPES = {torch.float64: "F64", torch.int64: "I64"}


def save_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main(out_dir):
    for name, cfg in CONFIGS.items():
        gen = torch.Generator().manual_seed(20261122)
        w = make_weights(cfg, gen)
        ids = torch.randint(0, cfg["vocab"], (BATCH, SEQ + 1), generator=gen)
        inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].clone()
        labels[0, 2] = -100  # an ignored position
        logits = forward(cfg, w, inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), labels.reshape(-1),
                                                 ignore_index=-100)
        loss.backward()
        out = dict(w)
        out["input_ids"], out["labels"] = inputs, labels
        out["logits"], out["loss"] = logits, loss
        for k, t in w.items():
            out["grad." + k] = t.grad
        meta = {"config": json.dumps(cfg), "torch": torch.__version__,
                "made_by": "tests/golden/make_llama_golden.py"}
        save_safetensors(f"{out_dir}/{name}.safetensors", out, meta)
        print(f"{name}: loss {loss.item():.12f}, {sum(t.numel() for t in w.values())} parameters")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")

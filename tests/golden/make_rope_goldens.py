#!/usr/bin/env python3
"""make_rope_goldens.py: transformers' RoPE cos/sin tables for one tiny
config per rope type (default, linear, dynamic, yarn, longrope, llama3,
and partial rotary), for tests/lua/hf_rope_spec.lua. Run once, commit the
output:

    python tests/golden/make_rope_goldens.py     # writes tests/golden/rope_tables.json

with torch and transformers 5 installed (the file records the versions).
Each case is a config.json's RoPE keys in the 5.x layout (rope_parameters)
and, where 4.x wrote it differently, the 4.x layout (rope_theta +
rope_scaling [+ top-level original_max_position_embeddings]); the tables
come from LlamaRotaryEmbedding's forward (transformers' ROPE_INIT_FUNCTIONS,
the dynamic and longrope updates on the forward's positions 0..T-1, the
attention factor on cos and sin) on a fresh module per length, in f32.
Only the first half of each row is stored (emb = cat(freqs, freqs)).
"""
import json
import os

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD_DIM, MAX_POS = 16, 32

LONG = [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0]
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75]

# name, rope_parameters (5.x), 4.x keys (or None: rope_theta + rope_scaling made from the 5.x dict), lengths
CASES = [
    ("default", {"rope_type": "default", "rope_theta": 10000.0}, {"rope_theta": 10000.0, "rope_scaling": None}, [40]),
    ("linear", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, None, [40]),
    ("dynamic", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
     {"rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, [24, 48]),
    ("yarn", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8},
     None, [40]),
    ("yarn_mscale", {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                     "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False},
     None, [40]),
    ("longrope", {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT, "long_factor": LONG,
                  "original_max_position_embeddings": 16},
     {"rope_theta": 10000.0, "original_max_position_embeddings": 16,
      "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}, [12, 40]),
    ("llama3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, None, [40]),
    ("partial_linear", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0, "partial_rotary_factor": 0.5},
     {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 3.0}},
     [40]),
]


def tables(params, length):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=HEAD_DIM,
                         max_position_embeddings=MAX_POS, rope_parameters=json.loads(json.dumps(params)))
    rope = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, length, HEAD_DIM, dtype=torch.float32)
    pos = torch.arange(length).unsqueeze(0)
    with torch.no_grad():
        cos, sin = rope(x, pos)
    half = cos.shape[-1] // 2
    assert torch.equal(cos[0, :, :half], cos[0, :, half:])
    return cos[0, :, :half], sin[0, :, :half], float(rope.attention_scaling)


def flat(t):
    return [float("%.9g" % v) for v in t.reshape(-1).tolist()]


def main():
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "head_dim": HEAD_DIM,
           "max_position_embeddings": MAX_POS, "cases": []}
    for name, params, legacy, lengths in CASES:
        case = {"name": name, "rope_parameters": params, "tables": []}
        if legacy is None:
            legacy = {"rope_theta": params["rope_theta"],
                      "rope_scaling": {k: v for k, v in params.items() if k != "rope_theta"}}
        case["v4"] = legacy
        for length in lengths:
            cos, sin, scale = tables(params, length)
            case["tables"].append({"seq_len": length, "width": cos.shape[-1], "attention_scaling": scale,
                                   "cos": flat(cos), "sin": flat(sin)})
        out["cases"].append(case)
    path = os.path.join(HERE, "rope_tables.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_family_goldens.py: reference numbers for the decoder families of
models/families/ (issue 39) from transformers' own models.

Per family a tiny random config (2-3 layers, hidden 32, vocab 64) is built
with transformers (attn_implementation="eager"), its 1-D weights (norms,
biases) moved off their init so every weight matters, and saved with
save_pretrained under tests/golden/hf/<family>_tiny (config.json +
model.safetensors, generation_config.json removed) with golden.safetensors:

- input_ids [2, 9], labels (ours: already shifted, -100 where none follows
  and at one ignored position), logits_f32 and loss_f32 of the stock
  float32 model (HF's causal LM loss);
- grad.<name>: the gradient of that loss for every parameter;
- adamw.<name>: every parameter after one torch.optim.AdamW step on those
  gradients (lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1);
- gen_input_ids [2, 6] (row 1 left-padded with 0 under gen_attention_mask),
  gen_greedy: HF's greedy generate, 8 new tokens, no stop id;
- logits_bf16: the logits of input_ids from the same model cast whole to
  bfloat16 (model.to(torch.bfloat16), as from_pretrained(torch_dtype=
  bfloat16) of these files gives), stored in bfloat16: the bf16 spec
  measures how far transformers' own bf16 is from logits_f32 and holds ours
  to that distance;
- h0_bf16: what the bf16 model's first layer receives (the embeddings, and
  Gemma's sqrt(h) scale rounded to bf16), norm_x_bf16 a random bf16
  [2, 9, 32] and norm_y_bf16 the bf16 model's final norm of it: the
  family's RMSNorm cast order ([Note: RMSNorm variants] in
  models/decoder_parts.lua), which the logits' accumulated rounding hides.

The windowed families (mistral, phi3, gemma2, gemma3_text) get a window of
4 (< the 9 training tokens and the 14 generated positions), so the window
changes their numbers; gemma2's softcaps are small (2 and 3) so they bite.
pad_token_id is None: with one, transformers' nn.Embedding(padding_idx)
zeroes that row's gradient (Gemma's class default is 0), which ours does
not do; generation still pads with 0 under the attention mask.
tests/lua/hf_families_spec.lua compares ours in float32 and bfloat16. Run
once, commit (FAMILY ...: remake only those; the others' files stay):

    /var/tmp/fsdp-torch-venv/bin/python tests/golden/make_family_goldens.py [OUT [FAMILY ...]]   # OUT: tests/golden/hf
"""
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

SEED = 20261122
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
            pad_token_id=None)

FAMILIES = {
    "qwen2": dict(rope_theta=1e6),
    "qwen3": dict(head_dim=16, rope_theta=1e6),
    "olmo2": dict(rope_theta=5e5, num_hidden_layers=3),
    "phi3": dict(rope_theta=1e4, sliding_window=4),
    "mistral": dict(rope_theta=1e6, sliding_window=4, head_dim=8),
    "gemma2": dict(head_dim=16, rope_theta=1e4, sliding_window=4, query_pre_attn_scalar=24,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0, num_hidden_layers=3),
    "gemma3_text": dict(head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4, sliding_window=4,
                        sliding_window_pattern=3, query_pre_attn_scalar=24, num_hidden_layers=3),
    # mixtures of experts: the load-balancing loss on (output_router_logits) with a coefficient
    # large enough to move the gradients; the files in the hub's per-expert names (see moe_disk_names)
    "mixtral": dict(rope_theta=1e6, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                    router_aux_loss_coef=0.05),
    "qwen3_moe": dict(head_dim=16, rope_theta=1e6, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
                      norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.05),
}

# The names checkpoints on the hub store experts under (one tensor per expert
# and projection), from transformers 5's fused gate_up_proj [E, 2ff, h]
# (gate rows first) and down_proj [E, h, ff]: Mixtral's
# block_sparse_moe.experts.E.w1 (gate) / w3 (up) / w2 (down) and router
# block_sparse_moe.gate, Qwen3-MoE's mlp.experts.E.gate_proj / up_proj / down_proj.
MOE_DISK = {"mixtral": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
            "qwen3_moe": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})}


def moe_disk_names(directory, family):
    from safetensors.torch import load_file
    block, part = MOE_DISK[family]
    path = os.path.join(directory, "model.safetensors")
    fused = load_file(path)
    out = {}
    for name, t in fused.items():
        pre, sep, what = name.partition("mlp.experts.")
        if sep and what == "gate_up_proj":
            ff = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}{block}.experts.{e}.{part['gate']}.weight"] = t[e, :ff].clone()
                out[f"{pre}{block}.experts.{e}.{part['up']}.weight"] = t[e, ff:].clone()
        elif sep and what == "down_proj":
            for e in range(t.shape[0]):
                out[f"{pre}{block}.experts.{e}.{part['down']}.weight"] = t[e].clone()
        elif name.endswith("mlp.gate.weight"):
            out[name.replace("mlp.gate.weight", block + ".gate.weight")] = t
        else:
            out[name] = t
    save_file(out, path, metadata={"format": "pt"})


def perturb(model, gen):
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def greedy(model, gen, V):
    ids = torch.randint(1, V, (2, 6), generator=gen)
    mask = torch.ones(2, 6, dtype=torch.int64)
    ids[1, :2] = 0
    mask[1, :2] = 0
    # (transformers' generate cannot compute the load-balancing loss under
    # its padding mask, and decoding needs no loss)
    model.config.output_router_logits = False
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    return {"gen_input_ids": ids, "gen_attention_mask": mask, "gen_greedy": out}


def case(out, family, extra):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = dict(BASE, **extra)
    config = AutoConfig.for_model(family, **cfg)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    perturb(model, gen)
    B, T, V = 2, 9, cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=gen)
    hf_labels = ids.clone()
    hf_labels[0, 3] = -100
    model.train()
    res = model(input_ids=ids, labels=hf_labels)
    res.loss.backward()
    golden = {"input_ids": ids, "labels": torch.cat([hf_labels[:, 1:], torch.full((B, 1), -100)], dim=1),
              "logits_f32": res.logits.detach(), "loss_f32": res.loss.detach()}
    named = dict(model.named_parameters())
    for n, p in named.items():
        golden["grad." + n] = p.grad.detach().clone()
    d = os.path.join(out, family + "_tiny")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    g = os.path.join(d, "generation_config.json")
    if os.path.exists(g):
        os.remove(g)
    if family in MOE_DISK:
        moe_disk_names(d, family)
    saved = {n: p.detach().clone() for n, p in named.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    opt.step()
    for n, p in named.items():
        golden["adamw." + n] = p.detach().clone()
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(saved[n])
    model.eval()
    golden.update(greedy(model, gen, V))
    model.to(torch.bfloat16)
    if family in MOE_DISK:
        # (torch's grouped_mm wants 16-byte strides: qwen3_moe's 12-wide experts in bf16 are not; the loop
        # over experts is transformers' eager path, the same products)
        model.set_experts_implementation("eager")
    seen = {}
    hook = model.model.layers[0].register_forward_pre_hook(lambda mod, args: seen.setdefault("h0", args[0].detach()))
    with torch.no_grad():
        golden["logits_bf16"] = model(input_ids=ids).logits.detach()
        hook.remove()
        golden["h0_bf16"] = seen["h0"]
        x = (2 * torch.randn(B, T, cfg["hidden_size"], generator=gen)).to(torch.bfloat16)
        golden["norm_x_bf16"] = x
        golden["norm_y_bf16"] = model.model.norm(x).detach()
    meta = dict(transformers=transformers.__version__, torch=torch.__version__, case=family + "_tiny",
                made_by="tests/golden/make_family_goldens.py")
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(d, "golden.safetensors"), metadata=meta)
    print(f"{family}_tiny: {sorted(os.listdir(d))} loss {res.loss.item():.6f}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/hf"
    only = sys.argv[2:]
    for family, extra in FAMILIES.items():
        if not only or family in only:
            case(out, family, extra)


if __name__ == "__main__":
    main()

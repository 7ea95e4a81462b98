#!/usr/bin/env python3
"""make_moe_goldens.py: reference numbers from transformers' own sparse MoE blocks.

Builds a tiny MixtralSparseMoeBlock (8 experts, top-2, renormalised) and a
tiny Qwen3MoeSparseMoeBlock (16 experts, top-4, norm_topk_prob false, the
class default) with random float32 weights from a fixed seed, runs them in
float32 on a fixed input and writes, per block, tests/golden/moe/<case>.safetensors:

- the weights under transformers 5's names (gate.weight, experts.gate_up_proj,
  experts.down_proj), the input x [2, 7, h], a second layer's router logits
  `other_logits` and an attention mask `mask` [2, 7] for the aux loss;
- y (the block's output), router_logits (captured from block.gate),
  aux (load_balancing_loss_func over [router_logits, other_logits]) and
  aux_masked (the same with the mask);
- the gradients of loss = sum(y * r) + 0.5 * aux (r a fixed random tensor,
  stored) with respect to x and every weight: grad_x, grad_gate.weight,
  grad_experts.gate_up_proj, grad_experts.down_proj.

tests/lua/moe_spec.lua loads them and compares (no torch needed). Run once,
with the project's reference venv, and commit the outputs:

    /var/tmp/fsdp-torch-venv/bin/python tests/golden/make_moe_goldens.py
"""
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

SEED = 20261206
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe")

CASES = {
    "mixtral": (MixtralSparseMoeBlock, MixtralConfig(hidden_size=16, intermediate_size=24,
                                                      num_local_experts=8, num_experts_per_tok=2)),
    "qwen3_moe": (Qwen3MoeSparseMoeBlock, Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=12,
                                                         num_experts=16, num_experts_per_tok=4,
                                                         norm_topk_prob=False)),
}


def make(name, cls, config):
    torch.manual_seed(SEED)
    block = cls(config).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    E, k = (config.num_local_experts, config.num_experts_per_tok) if name == "mixtral" else (
        config.num_experts, config.num_experts_per_tok)
    h = config.hidden_size
    x = torch.randn(2, 7, h)
    other = torch.randn(14, E)
    mask = torch.ones(2, 7)
    mask[0, 5:] = 0
    mask[1, 6:] = 0
    r = torch.randn(2, 7, h)
    captured = {}
    block.gate.register_forward_hook(lambda m, i, o: captured.__setitem__("logits", o[0]))
    xg = x.clone().requires_grad_(True)
    y = block(xg)
    logits = captured["logits"]
    aux = load_balancing_loss_func((logits, other), E, k)
    aux_masked = load_balancing_loss_func((logits, other), E, k, mask)
    loss = (y * r).sum() + 0.5 * aux
    loss.backward()
    out = {
        "x": x, "other_logits": other, "mask": mask, "r": r,
        "y": y.detach(), "router_logits": logits.detach(),
        "aux": aux.detach().reshape(1), "aux_masked": aux_masked.detach().reshape(1),
        "grad_x": xg.grad,
    }
    for pname, p in block.named_parameters():
        out[pname] = p.detach().clone()
        out["grad_" + pname] = p.grad.clone()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "n_experts": str(E), "top_k": str(k), "hidden": str(h),
            "ffn": str(config.intermediate_size if name == "mixtral" else config.moe_intermediate_size),
            "norm_topk_prob": "true" if name == "mixtral" else str(config.norm_topk_prob).lower()}
    save_file({k2: v.contiguous() for k2, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              metadata=meta)
    print(name, {k2: tuple(v.shape) for k2, v in out.items()})


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (cls, config) in CASES.items():
        make(name, cls, config)


if __name__ == "__main__":
    main()

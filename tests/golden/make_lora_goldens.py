#!/usr/bin/env python3
"""make_lora_goldens.py: PEFT goldens for LoRA (fsdp.lora), both directions,
on the tiny golden Llama (tests/golden/hf/llama3_tiny_v5, transformers 5).

- ours/: the adapter tests/golden/lora_adapter.lua writes with
  fsdp.lora.save_peft (run here through build/bin/fsdp-lua), loaded by
  peft.PeftModel.from_pretrained onto LlamaForCausalLM; golden.safetensors
  holds that model's logits on the base golden's input_ids (logits_peft)
  and those of merge_and_unload() (logits_merged). The spec rebuilds the
  same adapter and compares its logits with them: peft reads our files as
  we mean them.
- peft/: an adapter made by peft itself (get_peft_model, LoraConfig r=8,
  lora_alpha=16, dropout 0.1, targets k_proj, o_proj, gate_proj, up_proj;
  lora_B drawn N(0, 0.05) with torch seed 0, since a fresh B is zero),
  written by save_pretrained; golden.safetensors: its logits in eval mode
  (logits_peft). The spec loads it with fsdp.lora.load_peft.

Run once from the repository root, after ./build.sh, in a virtual
environment with transformers 5, torch, safetensors and peft (the specs
need no Python):

    /work/venv-hf/bin/pip install peft
    /work/venv-hf/bin/python tests/golden/make_lora_goldens.py [OUT]   # OUT: tests/golden/hf/llama3_tiny_v5_lora
"""
import os
import shutil
import subprocess
import sys

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM

BASE = "tests/golden/hf/llama3_tiny_v5"


def meta():
    return dict(transformers=transformers.__version__, torch=torch.__version__, peft=peft.__version__,
                made_by="tests/golden/make_lora_goldens.py")


def base_model():
    m = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    m.eval()
    return m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/hf/llama3_tiny_v5_lora"
    ids = load_file(os.path.join(BASE, "golden.safetensors"))["input_ids"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    ours = os.path.join(out, "ours")
    subprocess.run(["build/bin/fsdp-lua", "tests/golden/lora_adapter.lua", ours], check=True)
    m = PeftModel.from_pretrained(base_model(), ours)
    m.eval()
    with torch.no_grad():
        logits = m(input_ids=ids).logits
        plain = base_model()(input_ids=ids).logits
        # peft warns and goes on when names do not match: make sure every
        # adapter tensor was taken (the logits moved, by the adapter only)
        assert (logits - plain).abs().max() > 1e-3, "our adapter changed nothing in peft"
        merged = m.merge_and_unload()(input_ids=ids).logits
    save_file({"logits_peft": logits.contiguous(), "logits_merged": merged.contiguous()},
              os.path.join(ours, "golden.safetensors"), metadata=meta())

    theirs = os.path.join(out, "peft")
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, task_type="CAUSAL_LM",
                     target_modules=["k_proj", "o_proj", "gate_proj", "up_proj"])
    m = get_peft_model(base_model(), cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    m.save_pretrained(theirs)
    os.remove(os.path.join(theirs, "README.md"))  # a model card template
    m.eval()
    with torch.no_grad():
        logits = m(input_ids=ids).logits
    save_file({"logits_peft": logits.contiguous()}, os.path.join(theirs, "golden.safetensors"), metadata=meta())
    for d in (ours, theirs):
        print(f"{d}: {sorted(os.listdir(d))}")


if __name__ == "__main__":
    main()

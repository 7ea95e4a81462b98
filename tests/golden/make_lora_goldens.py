#!/usr/bin/env python3
"""make_lora_goldens.py: PEFT goldens for LoRA (fsdp.lora), both directions,
on the tiny golden models of tests/golden/hf (transformers 5).

- llama/, gpt2/, t5/: the adapters tests/golden/lora_adapter.lua
  writes with fsdp.lora.save_peft (run here through build/bin/fsdp-lua)
  for the tiny Llama, GPT-2 and T5 v1.1, loaded by
  peft.PeftModel.from_pretrained onto the transformers model;
  golden.safetensors holds that model's logits on the base golden's
  inputs (logits_peft) and those of merge_and_unload() (logits_merged).
  The spec rebuilds the same adapters and compares its logits with them:
  peft reads our files as we mean them (GPT-2's Conv1D included).
- peft_llama/: an adapter made by peft itself (get_peft_model, LoraConfig r=8,
  lora_alpha=16, dropout 0.1, targets k_proj, o_proj, gate_proj, up_proj;
  lora_B drawn N(0, 0.05) with torch seed 0, since a fresh B is zero),
  written by save_pretrained; golden.safetensors: its logits in eval mode
  (logits_peft). The spec loads it with fsdp.lora.load_peft.

Run once from the repository root, after ./build.sh, in a virtual
environment with transformers 5, torch, safetensors and peft (the specs
need no Python):

    /work/venv-hf/bin/pip install peft
    /work/venv-hf/bin/python tests/golden/make_lora_goldens.py [OUT]   # OUT: tests/golden/hf/lora
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
from transformers import GPT2LMHeadModel, LlamaForCausalLM, T5ForConditionalGeneration

BASE = "tests/golden/hf/llama3_tiny_v5"
CASES = {  # our case name -> (output subdirectory, base directory, model class)
    "llama": ("llama", BASE, LlamaForCausalLM),
    "gpt2": ("gpt2", "tests/golden/hf/gpt2_tiny", GPT2LMHeadModel),
    "t5": ("t5", "tests/golden/hf/t5_v1_1_tiny_v5", T5ForConditionalGeneration),
}


def meta():
    return dict(transformers=transformers.__version__, torch=torch.__version__, peft=peft.__version__,
                made_by="tests/golden/make_lora_goldens.py")


def base_model(base=BASE, cls=LlamaForCausalLM):
    m = cls.from_pretrained(base, dtype=torch.float32)
    m.eval()
    return m


def inputs(base):
    """The base golden's inputs as the model takes them (T5: with its masks)."""
    g = load_file(os.path.join(base, "golden.safetensors"))
    if "decoder_attention_mask" in g:
        return dict(input_ids=g["input_ids"], attention_mask=g["attention_mask"], labels=g["labels"],
                    decoder_attention_mask=g["decoder_attention_mask"])
    return dict(input_ids=g["input_ids"])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/hf/lora"
    ids = load_file(os.path.join(BASE, "golden.safetensors"))["input_ids"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    for case, (sub, base, cls) in CASES.items():
        ours = os.path.join(out, sub)
        subprocess.run(["build/bin/fsdp-lua", "tests/golden/lora_adapter.lua", case, ours], check=True)
        m = PeftModel.from_pretrained(base_model(base, cls), ours)
        m.eval()
        x = inputs(base)
        with torch.no_grad():
            logits = m(**x).logits
            plain = base_model(base, cls)(**x).logits
            # peft warns and goes on when names do not match: make sure
            # the adapter was taken (the logits moved, by the adapter only)
            assert (logits - plain).abs().max() > 1e-3, f"{case}: our adapter changed nothing in peft"
            missing = [n for n, p in m.named_parameters() if "lora_B" in n and p.abs().max() == 0]
            assert not missing, f"{case}: adapters peft left at zero: {missing}"
            merged = m.merge_and_unload()(**x).logits
        save_file({"logits_peft": logits.contiguous(), "logits_merged": merged.contiguous()},
                  os.path.join(ours, "golden.safetensors"), metadata=meta())

    theirs = os.path.join(out, "peft_llama")
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
    for d in sorted(os.listdir(out)):
        print(f"{d}: {sorted(os.listdir(os.path.join(out, d)))}")


if __name__ == "__main__":
    main()

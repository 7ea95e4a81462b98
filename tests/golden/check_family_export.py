#!/usr/bin/env python3
"""check_family_export.py: our exports of every decoder family load in
transformers (and our LoRA adapters in peft) and give our logits.

tests/golden/family_export.lua re-exports each tests/golden/hf/<family>_tiny
with models/hf.lua's save_pretrained and writes our float32 logits, plus a
LoRA adapter (PEFT's files) with its logits. Here transformers'
AutoModelForCausalLM.from_pretrained loads each export (float32, eager
attention) and peft's PeftModel.from_pretrained the adapter on it; their
logits are compared with ours and, for the plain export, with the golden's
(the stock model's). Run by hand (CI has no transformers):

    /var/tmp/fsdp-torch-venv/bin/python tests/golden/check_family_export.py [build/bin/fsdp-lua]

Prints the largest difference relative to the largest logit per family and
exits 1 if any exceeds 1e-4 (the issue's float32 bound). transformers 4.x
(which reads mixtures of experts only under the hub's per-expert names) is
checked the same way with a 4.x on the path, e.g.

    pip install --target /var/tmp/tf4 "transformers==4.57.1" "huggingface_hub<1.0" "tokenizers<0.23"
    PYTHONPATH=/var/tmp/tf4 /var/tmp/fsdp-torch-venv/bin/python tests/golden/check_family_export.py
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging

FAMILIES = ["qwen2", "qwen3", "olmo2", "phi3", "mistral", "gemma2", "gemma3_text", "mixtral", "qwen3_moe"]
TOLERANCE = 1e-4


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    logging.set_verbosity_error()
    exe = sys.argv[1] if len(sys.argv) > 1 else "build/bin/fsdp-lua"
    bad = False
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([exe, "tests/golden/family_export.lua", out], check=True)
        from peft import PeftModel
        for fam in FAMILIES:
            g = load_file(f"tests/golden/hf/{fam}_tiny/golden.safetensors")
            ours = load_file(f"{out}/{fam}_ours.safetensors")["logits"]
            model = AutoModelForCausalLM.from_pretrained(f"{out}/{fam}", attn_implementation="eager").eval()
            with torch.no_grad():
                theirs = model(input_ids=g["input_ids"]).logits
            peft_ours = load_file(f"{out}/{fam}_peft_ours.safetensors")["logits"]
            peft = PeftModel.from_pretrained(model, f"{out}/{fam}_peft").eval()
            with torch.no_grad():
                peft_theirs = peft(input_ids=g["input_ids"]).logits
            e1, e2, e3 = rel(ours, theirs), rel(theirs, g["logits_f32"]), rel(peft_ours, peft_theirs)
            moved = rel(peft_ours, ours)
            print(f"{fam:12s} export vs ours {e1:.2e}  export vs golden {e2:.2e}  peft vs ours {e3:.2e} "
                  f"(the adapter moves logits by {moved:.2e})")
            bad = bad or max(e1, e2, e3) > TOLERANCE or moved < 1e-3
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

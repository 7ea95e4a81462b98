#!/usr/bin/env python3
"""check_hf_export.py: our saved models load in Hugging Face and give our logits.

The reverse of make_hf_goldens.py: tests/golden/hf_export.lua builds tiny
Llama-2, Llama-3 (tied, GQA, llama3 rope scaling), T5 v1.0 and v1.1 (and
v1.1 tied without the output scale, transformers 5's own), and GPT-2 models
with fsdp-lua's own initialisation and saves each with models/hf.lua's
save_pretrained (config.json + model.safetensors, and a sharded copy with
model.safetensors.index.json). Here transformers' from_pretrained loads
both directories (float64) and its logits are compared with ours; T5 runs
with a padded source and its attention_mask. Needs the same packages as
make_hf_goldens.py (transformers 4.4x) or make_hf5_goldens.py (5.x: its
virtual environment); CI has no transformers, so this is run by hand:

    /usr/bin/python3 tests/golden/check_hf_export.py [build/bin/fsdp-lua]
    /tmp/venv-hf/bin/python tests/golden/check_hf_export.py [build/bin/fsdp-lua]

transformers 5 validates config.json's types (a float field written 1 is
refused) and reads T5's scale_decoder_outputs; t5_v1_1_tied is checked
only there.

It prints the largest difference per model and exits 1 if any exceeds
1e-12 (float64 with HF's float32 islands widened, as in the goldens).
"""
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, T5ForConditionalGeneration
from transformers.utils import logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_goldens import wide_islands  # noqa: E402

TOLERANCE = 1e-12


def main(exe):
    logging.set_verbosity_error()
    worst = 0.0
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([exe, "tests/golden/hf_export.lua", out], check=True)
        names = ["llama2", "llama3", "t5_v1_0", "t5_v1_1", "gpt2"]
        if int(transformers.__version__.split(".")[0]) >= 5:
            names.append("t5_v1_1_tied")
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        for name in names:
            ours = load_file(os.path.join(out, name, "ours.safetensors"))
            for variant in (name, name + "_sharded"):
                d = os.path.join(out, variant)
                if name.startswith("t5"):
                    model = T5ForConditionalGeneration.from_pretrained(d, torch_dtype=torch.float64)
                    with torch.no_grad(), wide_islands("t5"):
                        logits = model(input_ids=ours["input_ids"], attention_mask=ours["attention_mask"],
                                       decoder_input_ids=ours["decoder_input_ids"]).logits
                else:
                    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
                    with torch.no_grad(), wide_islands("llama"):
                        logits = model(input_ids=ours["input_ids"]).logits
                diff = (logits - ours["logits"]).abs().max().item()
                files = sorted(f for f in os.listdir(d) if f.endswith((".safetensors", ".json")))
                print(f"{variant}: {type(model).__name__} from {', '.join(files)}: max |logits diff| {diff:.3g}")
                worst = max(worst, diff)
    ok = worst <= TOLERANCE
    print(f"{'ok' if ok else 'FAILED'}: largest difference {worst:.3g} (tolerance {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/bin/fsdp-lua"))

#!/usr/bin/env python3
"""make_generate_goldens.py: Hugging Face's greedy generate() on the tiny
golden Llamas of tests/golden/hf/ (llama2_tiny: multi-head, untied;
llama3_tiny: grouped-query, tied, llama3 RoPE scaling) and on a tiny
random GPT-2 made here from a seed and saved by save_pretrained to
tests/golden/hf_generate/gpt2_tiny/ (GPT2LMHeadModel: Conv1D weights, tied
head), for tests/lua/hf_generate_spec.lua. Run once, commit the outputs:

    python tests/golden/make_generate_goldens.py     # writes tests/golden/hf_generate.json

with torch and transformers installed (any version that loads the
directories; the file records which). The models run in float32 as
shipped. Per model: each prompt alone, the prompts as one left-padded batch
(attention_mask 0 on the padding; HF derives the position ids from it),
and each prompt alone with repetition_penalty (HF's processor counts every
id of the sequence; with no padding that is what ours counts). eos is
switched off so that every row runs max_new_tokens steps.
"""
import json
import os
import re

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["llama2_tiny", "llama3_tiny", "gpt2_tiny"]
# GPT-2 with a wide init (0.5): at HF's 0.02 a random GPT-2 only repeats
# its last token, which would not show wrong positions or masks.
GPT2 = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.5,
            embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
PROMPTS = [[5, 17, 33, 3, 42, 7, 8, 60, 1], [11, 20], [63, 1, 2, 3, 9]]
MAX_NEW = 12
PENALTY = 1.5
PAD = 0


def greedy(model, ids, mask=None, **kw):
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=PAD, **kw)
    return out[:, ids.shape[1]:].tolist()


def main():
    torch.manual_seed(0)
    doc = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "prompts": PROMPTS, "max_new_tokens": MAX_NEW, "repetition_penalty": PENALTY, "pad_id": PAD,
           "models": {}}
    torch.manual_seed(20261125)
    gpt2_dir = os.path.join(HERE, "hf_generate", "gpt2_tiny")
    GPT2LMHeadModel(GPT2Config(**GPT2)).save_pretrained(gpt2_dir)
    for case in CASES:
        if case.startswith("gpt2"):
            model = GPT2LMHeadModel.from_pretrained(gpt2_dir, torch_dtype=torch.float32)
        else:
            model = LlamaForCausalLM.from_pretrained(os.path.join(HERE, "hf", case), torch_dtype=torch.float32)
        model.eval()
        model.generation_config.eos_token_id = None
        with torch.no_grad():
            alone = [greedy(model, torch.tensor([p]))[0] for p in PROMPTS]
            L = max(len(p) for p in PROMPTS)
            ids = torch.tensor([[PAD] * (L - len(p)) + p for p in PROMPTS])
            mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in PROMPTS])
            batch = greedy(model, ids, mask)
            penalized = [greedy(model, torch.tensor([p]), repetition_penalty=PENALTY)[0] for p in PROMPTS]
        doc["models"][case] = {"alone": alone, "batch": batch, "alone_penalized": penalized}
    path = os.path.join(HERE, "hf_generate.json")
    text = json.dumps(doc, indent=1)
    # one line per id list
    text = re.sub(r"\[\s+([\d,\s]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    with open(path, "w") as f:
        f.write(text + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_hf5_goldens.py: reference checkpoints and numbers from transformers 5.x
and vit-pytorch, the layouts they write today.

make_hf_goldens.py made the transformers 4.4x goldens (Debian's torch 1.13);
this script adds the cases whose files differ under transformers 5:

- llama3_tiny_v5: make_hf_goldens.py's Llama-3 config (GQA, tied, theta 5e5,
  llama3 scaling factor 32 from 16 positions) saved by transformers 5:
  config.json has `rope_parameters` and no rope_theta/rope_scaling.
- t5_v1_1_tiny_v5: T5 v1.1 (gated-GELU) built by transformers 5: it ties
  lm_head to the embedding and writes `tie_word_embeddings: true` with
  `scale_decoder_outputs: false` (no d_model^-0.5 before the head).
- t5_v1_1_untied_v5: the same with a head of its own, as transformers 5
  re-saves google/t5-v1_1-*: lm_head.weight in the file, the config still
  says tie_word_embeddings true (it unties a head the file holds).
- t5_v1_0_tiny_v5: v1.0 (ReLU, tied, scaled) as transformers 5 writes it.
- gpt2_tiny: GPT2LMHeadModel (Conv1D weights [in, out], tied head).
- deepvit_tiny: vit-pytorch's current DeepViT (patch embedding LayerNorm ->
  Linear -> LayerNorm), its state_dict as model.safetensors.
- deepvit_tiny_2022: the older layout (Linear patch embedding, Residual/
  PreNorm wrappers), from vit-pytorch 0.35.8's deepvit.py, whose directory
  is given by --old-vit-pytorch (pip download --no-deps vit-pytorch==0.35.8;
  unzip the wheel there).

Each case directory holds what the library saved (config.json +
model.safetensors, generation_config.json removed; for DeepViT the
state_dict and a config.json of the constructor's arguments) and
golden.safetensors: the inputs, logits and loss of the stock model in
float32 (logits_f32, loss_f32), and logits of the model converted to
float64 (logits_f64) where the library keeps no float32 islands (GPT-2,
DeepViT). llama3_tiny_v5 and gpt2_tiny also hold HF's greedy generate of
a batch of two prompts, the second left-padded (gen_input_ids,
gen_attention_mask, pad 0; gen_greedy: prompts and 8 new tokens, no stop
id), for generation specs. The specs (tests/lua/hf_*_spec.lua, deepvit_golden_spec.lua) need
no Python. Run once in a virtual environment of its own, outside the repo:

    python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install transformers safetensors torch vit-pytorch
    /tmp/venv-hf/bin/python tests/golden/make_hf5_goldens.py --old-vit-pytorch DIR [OUT]   # OUT: tests/golden/hf
"""
import argparse
import importlib.util
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_goldens import LLAMA, SEED, T5, T5_COMMON, perturb_norms  # noqa: E402


def versions(extra=None):
    meta = dict(transformers=transformers.__version__, torch=torch.__version__,
                made_by="tests/golden/make_hf5_goldens.py")
    meta.update(extra or {})
    return meta


def finish(d, model, golden, meta, save=None):
    shutil.rmtree(d, ignore_errors=True)
    if save is None:
        model.save_pretrained(d)
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
    else:
        save(d)
    save_file({k: v.detach().contiguous() for k, v in golden.items()}, os.path.join(d, "golden.safetensors"),
              metadata=meta)
    print(f"{os.path.basename(d)}: {sorted(os.listdir(d))}")


def greedy(model, gen, V):
    """HF's greedy generate on two prompts of 6 and 4 tokens, the shorter
    left-padded with 0 under its attention mask; 8 new tokens, no stop id."""
    ids = torch.randint(1, V, (2, 6), generator=gen)
    mask = torch.ones(2, 6, dtype=torch.int64)
    ids[1, :2] = 0
    mask[1, :2] = 0
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    return {"gen_input_ids": ids, "gen_attention_mask": mask, "gen_greedy": out}


def llama_v5(out):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA["llama3_tiny"], attn_implementation="eager"))
    perturb_norms(model, gen)
    B, T = 2, 9
    ids = torch.randint(0, 64, (B, T), generator=gen)
    hf_labels = ids.clone()
    hf_labels[0, 3] = -100
    with torch.no_grad():
        stock = model(input_ids=ids, labels=hf_labels)
    labels = torch.cat([hf_labels[:, 1:], torch.full((B, 1), -100)], dim=1)  # ours: already shifted
    golden = {"input_ids": ids, "labels": labels, "logits_f32": stock.logits, "loss_f32": stock.loss}
    golden.update(greedy(model, gen, 64))
    finish(os.path.join(out, "llama3_tiny_v5"), model, golden, versions({"case": "llama3_tiny_v5"}))


def t5_v5(out, name, cfg, own_head=False):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = T5ForConditionalGeneration(T5Config(**cfg, **T5_COMMON))
    if own_head:
        model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=gen))
    perturb_norms(model, gen)
    B, S, T = 2, 13, 7
    V = cfg["vocab_size"]
    input_ids = torch.randint(2, V, (B, S), generator=gen)
    attention_mask = torch.ones(B, S, dtype=torch.int64)
    input_ids[0, S - 1] = 1
    input_ids[1, 8] = 1
    input_ids[1, 9:] = 0
    attention_mask[1, 9:] = 0
    labels = torch.randint(2, V, (B, T), generator=gen)
    labels[0, T - 1] = 1
    labels[1, 4] = 1
    labels[1, 5:] = -100
    decoder_attention_mask = (labels != -100).long()
    with torch.no_grad():
        stock = model(input_ids=input_ids, labels=labels, attention_mask=attention_mask,
                      decoder_attention_mask=decoder_attention_mask)
    tied = model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()
    finish(os.path.join(out, name), model,
           {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "decoder_attention_mask": decoder_attention_mask, "logits_f32": stock.logits, "loss_f32": stock.loss},
           versions({"case": name, "tied": str(tied), "scale_decoder_outputs": str(model.config.scale_decoder_outputs)}))


def gpt2(out):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    perturb_norms(model, gen)  # LayerNorm weights and every bias
    B, T = 2, 11
    ids = torch.randint(0, 64, (B, T), generator=gen)
    hf_labels = ids.clone()
    hf_labels[1, 5] = -100
    with torch.no_grad():
        stock = model(input_ids=ids, labels=hf_labels)
        wide = model.double()(input_ids=ids).logits
    model.float()
    labels = torch.cat([hf_labels[:, 1:], torch.full((B, 1), -100)], dim=1)
    golden = {"input_ids": ids, "labels": labels, "logits_f32": stock.logits, "loss_f32": stock.loss,
              "logits_f64": wide}
    golden.update(greedy(model, gen, 64))
    finish(os.path.join(out, "gpt2_tiny"), model, golden, versions({"case": "gpt2_tiny"}))


DEEPVIT = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48, dim_head=8,
               channels=3, dropout=0.0, emb_dropout=0.0)


def deepvit(out, name, module):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = module.DeepViT(**DEEPVIT).eval()
    perturb_norms(model, gen)  # LayerNorms (incl. the head-axis ones) and biases
    images = torch.randn(2, 3, 32, 32, generator=gen)
    with torch.no_grad():
        logits = model(images)
        wide = model.double()(images.double())
    model.float()

    def save(d):
        os.makedirs(d)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(DEEPVIT, f, indent=2, sort_keys=True)

    finish(os.path.join(out, name), model, {"images": images, "logits_f32": logits, "logits_f64": wide},
           versions({"case": name, "vit_pytorch": module.__file__.split("site-packages/")[-1]}), save)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="tests/golden/hf")
    ap.add_argument("--old-vit-pytorch", required=True, help="directory of vit-pytorch 0.35.8's unpacked wheel")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    llama_v5(args.out)
    t5_v5(args.out, "t5_v1_0_tiny_v5", T5["t5_v1_0_tiny"])
    t5_v5(args.out, "t5_v1_1_tiny_v5", T5["t5_v1_1_tiny"])
    t5_v5(args.out, "t5_v1_1_untied_v5", T5["t5_v1_1_tiny"], own_head=True)
    gpt2(args.out)
    from vit_pytorch import deepvit as current
    deepvit(args.out, "deepvit_tiny", current)
    spec = importlib.util.spec_from_file_location(
        "deepvit_2022", os.path.join(args.old_vit_pytorch, "vit_pytorch", "deepvit.py"))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    old.__file__ = "site-packages/vit_pytorch-0.35.8/deepvit.py"
    deepvit(args.out, "deepvit_tiny_2022", old)


if __name__ == "__main__":
    main()

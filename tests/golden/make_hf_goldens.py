#!/usr/bin/env python3
"""make_hf_goldens.py: reference numbers from Hugging Face's own models.

Builds tiny random models with transformers (LlamaForCausalLM Llama-2 and
Llama-3 style, T5ForConditionalGeneration v1.0 and v1.1) from fixed seeds,
saves them the way Hugging Face ships checkpoints (save_pretrained:
config.json + model.safetensors, and one sharded copy with
model.safetensors.index.json), and evaluates them in float64 on fixed
inputs. The specs (tests/lua/hf_*_spec.lua) load those checkpoints into
our models and compare; they need no torch. Run once, commit the outputs:

    apt-get install python3-torch
    /usr/bin/python3 -m pip install --break-system-packages 'transformers>=4.43,<4.47' safetensors
    /usr/bin/python3 tests/golden/make_hf_goldens.py            # writes tests/golden/hf/

(transformers 4.43 is the first with llama3 rope scaling; 4.47 and later
need a newer torch than Debian 12's 1.13.) The layouts transformers 5
writes (rope_parameters, T5's scale_decoder_outputs), GPT-2 and DeepViT
come from make_hf5_goldens.py, which reuses this file's configs.

Per case, tests/golden/hf/<case>/ holds config.json and model.safetensors
exactly as save_pretrained wrote them (float32 weights, HF names, tied
tensors once), and golden.safetensors with the inputs and:

- logits, loss and the gradients of a few named parameters from the model
  converted to float64 (both sides start from the same float32 values).
  HF keeps three islands in float32 even in a float64 model: the variance
  of RMSNorm/T5LayerNorm (Llama's whole norm), the attention softmax, and
  the RoPE tables. The first two are widened to the model's dtype here
  (wide_islands below: the same formulas, without the cast), so these
  numbers are HF's graph in float64 and our float64 models must match
  them to rounding (~1e-12). The RoPE tables stay float32, as ours are,
  but with cos/sin correctly rounded (evaluated in float64, then rounded,
  as ours): torch's vectorised float32 cos/sin can be an ulp away, which
  alone moves the logits by ~3e-7.
- logits_f32 and loss_f32: the stock HF model, untouched, in float32 (no
  patch at all), for a float32 comparison at float32 tolerance.

Metadata records the versions. Weights are the models' own initialisation
with the norms moved off 1.0 (and Llama's std raised to 0.2) so that every
weight matters to the logits.
"""
import contextlib
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration
from transformers.models.llama import modeling_llama
from transformers.models.t5 import modeling_t5

SEED = 20261122

LLAMA = {
    # Llama-2 style: multi-head attention, untied head, theta 1e4.
    "llama2_tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, rope_theta=1e4, rms_norm_eps=1e-5,
                        tie_word_embeddings=False, max_position_embeddings=64, initializer_range=0.2),
    # Llama-3.2 style: grouped-query attention, tied embeddings, theta 5e5
    # with llama3 scaling (factor 32; original context 16 so that the
    # scaling changes frequencies at this tiny size).
    "llama3_tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, rope_theta=5e5, rms_norm_eps=1e-5,
                        tie_word_embeddings=True, max_position_embeddings=64, initializer_range=0.2,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=16)),
}

T5 = {
    # v1.0: ReLU MLP, tied embeddings (decoder output scaled by d_model^-0.5),
    # HF's default 32 buckets / distance 128; the 13-token source reaches
    # the log-spaced encoder buckets (distance >= 8).
    "t5_v1_0_tiny": dict(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=2,
                         feed_forward_proj="relu", tie_word_embeddings=True),
    # v1.1: gated-GELU (gelu_new), untied lm_head, more decoder than encoder
    # layers, and few buckets / a short max distance so that log-spaced and
    # saturated buckets occur in both directions at these lengths.
    "t5_v1_1_tiny": dict(vocab_size=64, d_model=16, d_ff=24, d_kv=8, num_heads=2, num_layers=2,
                         num_decoder_layers=3, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                         relative_attention_num_buckets=8, relative_attention_max_distance=10),
}
T5_COMMON = dict(dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)

LLAMA_GRADS = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
               "model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight",
               "model.layers.0.input_layernorm.weight", "model.norm.weight"]
T5_GRADS = ["shared.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            "encoder.block.1.layer.0.SelfAttention.q.weight", "decoder.block.1.layer.1.EncDecAttention.k.weight",
            "decoder.block.0.layer.2.layer_norm.weight", "encoder.final_layer_norm.weight"]


def _wide_rms_norm(self, hidden_states):
    # HF's LlamaRMSNorm / T5LayerNorm with the float32 cast replaced by
    # "at least float32": unchanged for bf16/f16/f32 inputs.
    dtype = hidden_states.dtype
    wide = torch.promote_types(dtype, torch.float32)
    h = hidden_states.to(wide)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(dtype)


@contextlib.contextmanager
def wide_islands(family):
    """HF's float32 islands widened to float64 for float64 inputs (see the
    top). Llama: its RMSNorm, softmax(..., dtype=float32), and float32
    cos/sin correctly rounded (only the RoPE tables take them); T5: its
    T5LayerNorm and softmax(scores.float()). Tensor.float is left alone
    for Llama, whose RoPE tables come from it and stay float32."""
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if family == "llama":
        patch(modeling_llama.LlamaRMSNorm, "forward", _wide_rms_norm)
        softmax = torch.nn.functional.softmax

        def wide_softmax(x, dim=None, _stacklevel=3, dtype=None):
            if dtype == torch.float32 and x.dtype == torch.float64:
                dtype = None
            return softmax(x, dim=dim, dtype=dtype)
        patch(torch.nn.functional, "softmax", wide_softmax)
        for fn in ("cos", "sin"):
            f = getattr(torch.Tensor, fn)
            patch(torch.Tensor, fn, lambda self, f=f: f(self.double()).float() if self.dtype == torch.float32
                  else f(self))
    else:
        patch(modeling_t5.T5LayerNorm, "forward", _wide_rms_norm)
        to_float = torch.Tensor.float
        patch(torch.Tensor, "float", lambda self, *a, **k: self if self.dtype == torch.float64 else to_float(self, *a, **k))
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def perturb_norms(model, gen):
    """Norm weights start at 1.0; move them so their gradients and any
    mix-up between them show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))


def save_case(out_dir, name, model, golden, meta):
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    # Only what a loader reads: the config and the weights.
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    meta = dict(meta, transformers=transformers.__version__, torch=torch.__version__,
                made_by="tests/golden/make_hf_goldens.py")
    save_file({k: v.detach().contiguous() for k, v in golden.items()}, os.path.join(d, "golden.safetensors"),
              metadata=meta)
    return d


def grads(model, names):
    params = dict(model.named_parameters())
    # Copies: converting the model back to float32 for saving converts the
    # .grad tensors in place too.
    return {"grad." + n: params[n].grad.detach().clone() for n in names}


def llama_case(out_dir, name, cfg):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="eager"))
    perturb_norms(model, gen)
    B, T = 2, 9
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    hf_labels = ids.clone()
    hf_labels[0, 3] = -100  # an ignored position
    with torch.no_grad():
        stock = model(input_ids=ids, labels=hf_labels)  # HF shifts the labels itself
    model = model.double()
    with wide_islands("llama"):
        out = model(input_ids=ids)
    # HF's causal LM loss (shift by one inside, -100 ignored), written out:
    # its loss_function casts the logits to float32 first, one more island.
    V = cfg["vocab_size"]
    loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), hf_labels[:, 1:].reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    # Our convention: targets already shifted, -100 where none follows.
    labels = torch.cat([hf_labels[:, 1:], torch.full((B, 1), -100)], dim=1)
    golden = {"input_ids": ids, "labels": labels, "logits": out.logits, "loss": loss,
              "logits_f32": stock.logits, "loss_f32": stock.loss}
    golden.update(grads(model, LLAMA_GRADS))
    # The float32 values the model started from (float64 -> float32 is exact here).
    save_case(out_dir, name, model.float(), golden, {"case": name})
    return model


def t5_case(out_dir, name, cfg):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = T5ForConditionalGeneration(T5Config(**cfg, **T5_COMMON))
    perturb_norms(model, gen)
    B, S, T = 2, 13, 7
    V = cfg["vocab_size"]
    # Source: row 1 right-padded after 9 tokens (pad 0), eos 1 before the
    # padding; ids 2.. are content.
    input_ids = torch.randint(2, V, (B, S), generator=gen)
    attention_mask = torch.ones(B, S, dtype=torch.int64)
    input_ids[0, S - 1] = 1
    input_ids[1, 8] = 1
    input_ids[1, 9:] = 0
    attention_mask[1, 9:] = 0
    # Target: row 1 shorter, -100 after its eos; the decoder mask hides the
    # padded decoder inputs.
    labels = torch.randint(2, V, (B, T), generator=gen)
    labels[0, T - 1] = 1
    labels[1, 4] = 1
    labels[1, 5:] = -100
    decoder_attention_mask = (labels != -100).long()
    masks = dict(attention_mask=attention_mask, decoder_attention_mask=decoder_attention_mask)
    with torch.no_grad():
        stock = model(input_ids=input_ids, labels=labels, **masks)
    model = model.double()
    with wide_islands("t5"):
        out = model(input_ids=input_ids, labels=labels, **masks)
        out.loss.backward()
        with torch.no_grad():
            # The same ids with no masks at all: every source token attended.
            unmasked = model(input_ids=input_ids, decoder_input_ids=model._shift_right(labels)).logits
    golden = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
              "decoder_attention_mask": decoder_attention_mask, "logits": out.logits, "loss": out.loss,
              "logits_unmasked": unmasked, "logits_f32": stock.logits, "loss_f32": stock.loss}
    golden.update(grads(model, T5_GRADS + (["lm_head.weight"] if not cfg["tie_word_embeddings"] else [])))
    save_case(out_dir, name, model.float(), golden, {"case": name})
    print(f"{name}: loss {out.loss.item():.12f}, {sum(p.numel() for p in model.parameters())} parameters")


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, cfg in LLAMA.items():
        model = llama_case(out_dir, name, cfg)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters")
    # A real sharded checkpoint as save_pretrained writes it: three files
    # and model.safetensors.index.json.
    torch.manual_seed(SEED)
    model = LlamaForCausalLM.from_pretrained(os.path.join(out_dir, "llama3_tiny"))
    sharded = os.path.join(out_dir, "llama3_tiny_sharded")
    shutil.rmtree(sharded, ignore_errors=True)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="30KB")
    os.remove(os.path.join(sharded, "generation_config.json"))
    print("llama3_tiny_sharded:", sorted(os.listdir(sharded)))
    for name, cfg in T5.items():
        t5_case(out_dir, name, cfg)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/hf")

#!/usr/bin/env python3
"""make_tokenizer_goldens.py: the reference tokenizers and their results on a
corpus of hard cases, for tests/lua/tokenizer_spec.lua (run once; the files
it writes ship in tests/golden/tokenizers/, the packages are not needed at
run time).

  /work/venv-hf/bin/python tests/golden/make_tokenizer_goldens.py

Needs the PyPI packages `tokenizers` and `sentencepiece`. Writes:
  gpt2_style.json     a byte-level BPE trained here, GPT-2's pre-tokenizer
                      (ByteLevel with its regex), merges stored as "a b"
                      strings (the older form), <|endoftext|> special and one
                      added non-special token
  llama3_style.json   a byte-level BPE with Llama 3's split regex before a
                      ByteLevel step without regex, ignore_merges, merges
                      stored as [a, b] lists (the newer form), special tokens
                      and a TemplateProcessing post-processor adding
                      <|begin_of_text|>; one vocabulary entry no merge builds
                      (only ignore_merges finds it)
  qwen2_style.json    a byte-level BPE behind an NFC normalizer (Qwen2's
                      layout: its split regex, single digits), special
                      tokens matched on the raw text and an added token
                      that is normalized (matched on the NFC text)
  spm.model           a SentencePiece BPE model (Llama 2's options:
                      byte fallback, digits split, identity normalization)
  goldens.json        the corpus and, per tokenizer, for every text: its ids
                      without and with the special tokens the post-processor
                      adds, the decoded text with and without special tokens,
                      and the decoding of the first half of the ids (cut
                      inside characters: U+FFFD as the reference does it);
                      and the ids of variants of gpt2_style.json that the
                      spec rebuilds from the JSON changes stored with them
                      (quirks of `tokenizers`: a split regex with empty
                      matches, merges listed twice)
"""
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizers")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# The corpus of hard cases the specs compare on.
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\nand\n\n\nruns of them\n",
    "    indented code:\n\tdef f(x):\n        return x ** 2  # squared\n",
    "numbers 1234567 3.14159 -42 1,000,000 2024-06-01 0x1F",
    "unicode: naïve café Zürich — “quotes” ‘single’ …",
    "中文字符和日本語のテキスト、한국어 텍스트",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️",
    "contractions: I'm, you're, it's, we'll, they've, I'd, DON'T, She'S",
    "<|endoftext|>special in the middle<|endoftext|>",
    "mixed<|endoftext|>  spaces <|endoftext|> around",
    "<|begin_of_text|>chat <|eot_id|> turns<|end_of_text|>",
    "an added [[custom]] token and [[custom]]",
    "",
    " ",
    "\n",
    "\u00a0no-break\u2009thin\u3000ideographic\u2028line sep",
    "Ω≈ç√∫ ∑∏ αβγδ АБВГД ﬁ ligature ǅ",
    "A" * 300,
    "zzzq zzzq zzzqzzzq",
    "!!! ??? ... --- ___ *** ### @@@ $$$ %%%",
    "https://example.com/path?q=1&r=two#frag user@example.org",
    "Ünïcödé ÜPPER lower MiXeD 123abc abc123",
    # composed and decomposed forms (NFC makes them equal), and the
    # normalized added token written decomposed
    "cafe\u0301 café A\u030angstro\u0308m Ångström \u1112\u1161\u11ab 한 ﬁ ² Ⅻ",
    "<|im_start|>user\n[[cafe\u0301]] and [[café]]<|im_end|>",
    # one 1000-letter word (base64-like): many merges in one word
    (lambda rng: "".join(rng.choice("etaoinshrdluETAOIN") for _ in range(1000)))(random.Random(5)),
]

TRAIN_TEXT = """The Zen of training: shards are gathered, layers run, gradients are reduced and scattered.
Fully sharded data parallel training splits parameters, gradients and optimizer state across ranks.
Each rank keeps one shard of every flat parameter and gathers the whole unit just before it runs.
Numbers like 1, 22, 333, 4444, 55555 and 3.14159 appear in logs; losses fall from 6.2 toward 2.9.
Don't panic: it's fine, we'll see, they've said, I'd think, you're right, I'm here.
Unicode text: naïve café, Zürich, Ελληνικά, русский текст, 中文字符, 日本語, 한국어, emoji 😀👍🏽.
    def train(model, data):
        for step, batch in enumerate(data):
            loss = model(batch).mean()
            loss.backward()
"""


def corpus_lines():
    lines = TRAIN_TEXT.splitlines() * 20 + TEXTS
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # its (rot13-stored) text adds ordinary English
    zen = "".join(this.d.get(c, c) for c in this.s)
    return lines + zen.splitlines() * 10


def train_gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_tokens(["[[custom]]"])
    path = os.path.join(OUT, "gpt2_style.json")
    tok.save(path)
    # The older "a b" form of merges (GPT-2's own file has it).
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    obj["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in obj["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def train_llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    path = os.path.join(OUT, "llama3_style.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    # A word in the vocabulary that no merge builds: only ignore_merges
    # encodes it as one token ("Ġ" is the byte-level form of the space).
    vocab = obj["model"]["vocab"]
    ids = set(vocab.values()) | {t["id"] for t in obj["added_tokens"]}
    for word in ("zzzq", "\u0120zzzq"):
        assert word not in vocab
        vocab[word] = max(ids) + 1
        ids.add(vocab[word])
    obj["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in obj["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def train_qwen2(lines):
    from tokenizers import AddedToken, normalizers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=750, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_tokens([AddedToken("[[café]]", normalized=True)])
    path = os.path.join(OUT, "qwen2_style.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    with open(path, "w", encoding="utf-8") as f:  # compact, as the others
        json.dump(obj, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def train_spm(lines):
    prefix = os.path.join(OUT, "spm")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=600,
                                   model_type="bpe", byte_fallback=True, split_digits=True,
                                   character_coverage=1.0, normalization_rule_name="identity",
                                   minloglevel=2)
    os.remove(prefix + ".vocab")
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def hf_results(tok):
    out = []
    for text in TEXTS:
        plain = tok.encode(text, add_special_tokens=False).ids
        out.append({
            "ids": plain,
            "ids_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(plain, skip_special_tokens=False),
            "decoded_skip": tok.decode(plain, skip_special_tokens=True),
            "decoded_half": tok.decode(plain[:len(plain) // 2], skip_special_tokens=False),
        })
    return out


def gpt2_variants(texts):
    """Changes to gpt2_style.json (applied by the spec too) and their ids."""
    with open(os.path.join(OUT, "gpt2_style.json"), encoding="utf-8") as f:
        base = json.load(f)
    variants = [
        {"name": "split_empty_matches", "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\d*"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}},
        {"name": "merges_listed_twice", "repeat_first_merges": 40},
    ]
    path = os.path.join(OUT, "variant.tmp.json")
    for v in variants:
        obj = json.loads(json.dumps(base))
        if "pre_tokenizer" in v:
            obj["pre_tokenizer"] = v["pre_tokenizer"]
        if "repeat_first_merges" in v:
            obj["model"]["merges"] += obj["model"]["merges"][:v["repeat_first_merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
        v["ids"] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    os.remove(path)
    return variants


def spm_results(sp):
    out = []
    for text in TEXTS:
        ids = sp.encode(text)
        out.append({"ids": ids, "decoded": sp.decode(ids)})
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = corpus_lines()
    gpt2, llama3, qwen2, sp = train_gpt2(lines), train_llama3(lines), train_qwen2(lines), train_spm(lines)
    goldens = {
        "texts": TEXTS,
        "gpt2_style": {"vocab_size": gpt2.get_vocab_size(with_added_tokens=True), "results": hf_results(gpt2)},
        "llama3_style": {"vocab_size": llama3.get_vocab_size(with_added_tokens=True),
                         "results": hf_results(llama3)},
        "gpt2_variants": gpt2_variants(TEXTS),
        "qwen2_style": {"vocab_size": qwen2.get_vocab_size(with_added_tokens=True), "results": hf_results(qwen2)},
        "spm": {"vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
                "unk_id": sp.unk_id(), "results": spm_results(sp)},
    }
    with open(os.path.join(OUT, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=None)
    for name in ("gpt2_style.json", "llama3_style.json", "qwen2_style.json", "spm.model", "goldens.json"):
        print(f"{name}: {os.path.getsize(os.path.join(OUT, name))} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_chat_template_goldens.py: what transformers renders for every chat
template stored in tests/data/chat_templates/, on a set of conversations,
for tests/lua/chat_template_spec.lua (run once; the JSON it writes ships in
tests/golden/chat_templates.json, Python is not needed at test time).

  /var/tmp/fsdp-torch-venv/bin/python tests/golden/make_chat_template_goldens.py

Each template directory is copied to a temporary directory with a one-token
tokenizer.json beside it and loaded with AutoTokenizer.from_pretrained, so
transformers itself reads chat_template.jinja / tokenizer_config.json
(string or list of named templates) and the special tokens (strings or
AddedToken objects). Every case is tokenizer.apply_chat_template(messages,
tools=..., add_generation_prompt=..., tokenize=False, **kwargs); an exception
(raise_exception in the template, a Jinja error) is stored as the expected
error. strftime_now's clock is pinned to NOW (the spec passes the same
`now`).

For templates with {% generation %} markers the assistant spans are those
transformers computes for return_assistant_tokens_mask (render_jinja_template
with return_assistant_tokens_mask=True, which apply_chat_template calls; it
reports character offsets, stored as chars and as UTF-8 byte offsets). For
every template the prefix-diff spans (fsdp.chat.template's
assistant_spans_by_prefix: render messages[:i] with the generation prompt
and messages[:i+1] without; the assistant span is the difference) are
computed here with apply_chat_template too, or the refusal when a partial
render is not a prefix of the full one.
"""
import copy
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile

import transformers
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")
OUT = os.path.join(HERE, "chat_templates.json")
NOW = 1721988000  # 2024-07-26 10:00 UTC


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, _dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = _PinnedDatetime

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Returns \"temperature\" and a summary.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]

SYS = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is 2+2?"}
A1 = {"role": "assistant", "content": "4."}
U2 = {"role": "user", "content": "And 3*3?"}
A2 = {"role": "assistant", "content": "9."}
ODD_U = {"role": "user", "content": "  Quotes ' and \" and {{ braces }} {% tag %} \\ back\\slash\n\tnew line, "
                                    "unicode: é ü 中文 🙂 \u2028 end  "}
ODD_A = {"role": "assistant", "content": "\n Réponse: \"ok\" {'k': 1} </s> \n"}

TOOL_CALL_ASSISTANT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temperature\": 21.5, \"summary\": \"sunny\"}"}
AFTER_TOOL = {"role": "assistant", "content": "It is 21.5 °C and sunny in Zürich."}

CONVERSATIONS = {
    "single": [U1],
    "single_answered": [U1, A1],
    "system_multi": [SYS, U1, A1, U2],
    "system_multi_answered": [SYS, U1, A1, U2, A2],
    "multi_no_system": [U1, A1, U2, A2],
    "odd_content": [SYS, ODD_U, ODD_A, U2],
    "odd_answered": [ODD_U, ODD_A],
    "tool_use": [SYS, {"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL_ASSISTANT, TOOL_RESULT, AFTER_TOOL],
    "parts_content": [{"role": "user", "content": [{"type": "text", "text": "Describe this."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
    "none_field": [U1, {"role": "assistant", "content": "4.", "tool_calls": None}],
}

THINK_CONVERSATIONS = {
    "think_reasoning_field": [U1, {"role": "assistant", "content": "4.", "reasoning_content": "2+2 is 4."}, U2],
    "think_inline": [U1, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4."}, U2,
                     {"role": "assistant", "content": "<think>3*3</think>9."}],
    "think_last_reasoning": [U1, {"role": "assistant", "content": "4.", "reasoning_content": "easy"}],
}

# Per template: conversations, tools for the tool case, extra variables.
PLAN = {
    "llama-3.1-instruct": dict(extra=[{}, {"date_string": "01 Jan 2025"},
                                      {"builtin_tools": ["code_interpreter", "wolfram_alpha"]}]),
    "llama-3.2-instruct": dict(extra=[{}, {"tools_in_user_message": False}]),
    "qwen2.5-instruct": dict(extra=[{}]),
    "qwen3": dict(extra=[{}, {"enable_thinking": False}, {"enable_thinking": True}], think=True),
    "mistral-7b-instruct-v0.3": dict(extra=[{}]),
    "gemma-2-it": dict(extra=[{}]),
    "gemma-3-it": dict(extra=[{}]),
    "phi-3-mini-instruct": dict(extra=[{}]),
    "smollm2-instruct": dict(extra=[{}]),
    "qwen3-trl-training": dict(extra=[{}, {"enable_thinking": False}], think=True),
    "gemma-2-trl-training": dict(extra=[{}]),
    "lfm2.5": dict(extra=[{}, {"preserve_thinking": True}], think=True),
    "list-form": dict(extra=[{}]),
}


def load(name):
    tmp = tempfile.mkdtemp()
    d = os.path.join(tmp, name)
    shutil.copytree(os.path.join(DATA, name), d)
    cfg_path = os.path.join(d, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8"))
    cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    json.dump(cfg, open(cfg_path, "w", encoding="utf-8"))
    Tokenizer(models.WordLevel({"x": 0}, unk_token="x")).save(os.path.join(d, "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(d)
    shutil.rmtree(tmp)
    return tok


def render(tok, messages, tools, gen, kwargs):
    try:
        return {"text": tok.apply_chat_template(copy.deepcopy(messages), tools=tools, add_generation_prompt=gen,
                                                tokenize=False, **kwargs)}
    except Exception as e:  # noqa: BLE001 - the message is the expected result
        return {"error": str(e), "error_type": type(e).__name__}


def byte_spans(text, spans):
    return [[len(text[:a].encode("utf-8")), len(text[:b].encode("utf-8"))] for a, b in spans]


def generation_spans(tok, messages, tools, gen, kwargs):
    conv = ctu._normalize_chat_messages(copy.deepcopy(messages))
    template = tok.get_chat_template(None, tools)
    rendered, indices = ctu.render_jinja_template(
        conversations=[conv], tools=tools, chat_template=template, return_assistant_tokens_mask=True,
        add_generation_prompt=gen, **{**tok.special_tokens_map, **kwargs})
    return rendered[0], [list(s) for s in indices[0]]


def prefix_spans(tok, messages, tools, gen, kwargs, full):
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        if i == 0:
            return {"prefix_error": "first message is an assistant message"}
        before = render(tok, messages[:i], tools, True, kwargs)
        upto = {"text": full} if (i == len(messages) - 1 and not gen) else render(tok, messages[:i + 1], tools,
                                                                                     False, kwargs)
        if "error" in before or "error" in upto:
            return {"prefix_error": "render failed"}
        b, u = before["text"], upto["text"]
        if not u.startswith(b) or not full.startswith(u):
            return {"prefix_error": f"not prefix-stable at message {i + 1}"}
        spans.append([len(b.encode("utf-8")), len(u.encode("utf-8"))])
    return {"prefix_spans": spans}


def main():
    cases = []
    for name, plan in PLAN.items():
        tok = load(name)
        convs = dict(CONVERSATIONS)
        if plan.get("think"):
            convs.update(THINK_CONVERSATIONS)
        for cname, messages in convs.items():
            for extra in plan["extra"]:
                if extra and cname not in ("system_multi", "system_multi_answered", "tool_use", "think_inline",
                                           "think_reasoning_field", "think_last_reasoning", "single"):
                    continue
                for with_tools in ([False, True] if cname in ("tool_use", "single", "system_multi") else [False]):
                    tools = TOOLS if with_tools else None
                    for gen in (False, True):
                        case = {"template": name, "conversation": cname, "tools": with_tools,
                                "add_generation_prompt": gen, "kwargs": extra}
                        case.update(render(tok, messages, tools, gen, extra))
                        if "text" in case:
                            case.update(prefix_spans(tok, messages, tools, gen, extra, case["text"]))
                            if "{% generation" in tok.get_chat_template(None, tools) or \
                                    "{%- generation" in tok.get_chat_template(None, tools):
                                text, spans = generation_spans(tok, messages, tools, gen, extra)
                                assert text == case["text"], (name, cname)
                                case["generation_spans_chars"] = spans
                                case["generation_spans"] = byte_spans(text, spans)
                        cases.append(case)
    all_convs = dict(CONVERSATIONS, **THINK_CONVERSATIONS)
    out = {"transformers": transformers.__version__, "now": NOW, "tools": TOOLS, "conversations": all_convs,
           "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    n_gen = sum(1 for c in cases if "generation_spans" in c)
    print(f"{len(cases)} cases ({n_err} expected errors, {n_gen} with generation spans) -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()

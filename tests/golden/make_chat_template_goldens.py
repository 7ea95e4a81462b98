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


# Small templates for the Jinja semantics real templates lean on, rendered by
# transformers' own compiled environment (_compile_jinja_template) on VARS.
SNIPPETS = [
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}"
    "{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"
    "{% for x in [] %}a{% else %}b{% endfor %}",
    "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set c = 0 %}{% for x in xs %}{% set c = c + x %}{{ c }}{% endfor %}{{ c }}",
    "{% set ns = namespace(c=0, s='') %}{% for x in xs %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }}",
    "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} "
    "{{ 3 - 5 }} {{ 10 / 4 * 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}",
    "{{ xs }} {{ d }} {{ none }} {{ true }} {{ f }} {{ s ~ 1 ~ none }} {{ d.items() | list }}",
    "{{ s[::-1] }}|{{ s[1:4] }}|{{ s[-2:] }}|{{ xs[1:] }}|{{ xs[::-1] }}|"
    "{{ xs[-1] }}|{{ s | length }}|{{ u[1:3] }}|{{ u | length }}",
    "{{ s.upper() }}|{{ s.title() }}|{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|"
    "{{ ' a  b '.split() }}|{{ s.startswith('he') }}|{{ s.endswith(('x', 'lo')) }}|{{ s.replace('l', 'L') }}|"
    "{{ s.find('l') }}|{{ '-'.join(['a', 'b']) }}|{{ s.capitalize() }}|{{ 'a\nb'.splitlines() }}|{{ s.count('l') }}",
    "{{ s | upper }}|{{ 'HeLLo wOrld' | title }}|{{ 'hello' | capitalize }}|{{ '  x ' | trim }}|{{ xs | first }}|"
    "{{ xs | last }}|{{ xs | join(', ') }}|{{ xs | length }}|{{ d | length }}|{{ 'a' | replace('a', 'b') }}|"
    "{{ '3' | int + 1 }}|{{ '2.5' | float }}|{{ 2.567 | round(2) }}|{{ 3 | string }}|{{ missing | default('dflt') }}|"
    "{{ '' | default('e', true) }}|{{ xs | reverse | list }}|{{ xs | sum }}|{{ [3, 1, 2] | sort }}|{{ xs | max }}|"
    "{{ '<a&b>' | e }}|{{ 'a\nb' | indent(2) }}|{{ 'a b c' | wordcount }}|{{ [1, 1, 2] | unique | list }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|"
    "{{ msgs | rejectattr('role', 'eq', 'user') | list | length }}|{{ xs | select('odd') | list }}|"
    "{{ xs | reject('even') | list }}|{{ ['a', 'b'] | map('upper') | list }}|{{ d | items | list }}|"
    "{{ msgs | selectattr('extra') | list | length }}|{{ msgs | selectattr('extra', 'defined') | list | length }}",
    "{{ x is defined }}{{ missing is undefined }}{{ none is none }}"
    "{{ s is string }}{{ d is mapping }}{{ xs is sequence }}"
    "{{ xs is iterable }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is true }}{{ false is false }}"
    "{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in xs }}{{ 'a' is lower }}"
    "{{ s is not none }}{{ not s is none }}{{ 1 is eq 1 }}{{ 1 is sameas 1 }}",
    "{{ 'l' in s }}{{ 2 in xs }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 == 1.0 }}{{ xs == [1, 2, 3, 4] }}"
    "{{ 1 < 2 < 3 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ missing == missing }}{{ none == missing }}",
    "{{ 'a' if x else 'b' }}{{ 'c' if missing }}|{{ x and 'y' }}|"
    "{{ '' or 'z' }}|{{ not [] }}|{{ [] or {} or 0 or 'w' }}",
    "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ u | tojson }}|{{ {'a': [1, 2.0, none, true]} | tojson }}|"
    "{{ d | tojson(sort_keys=true) }}|{{ 'q\"\\\n\t' | tojson }}|{{ xs | tojson(separators=(',', ':')) }}",
    "{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}{{ outer }}]{% endmacro %}{% set outer = 'O' %}"
    "{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(a='x') }}",
    "{% set t %}inner {{ s }}{% endset %}{{ t | upper }}|{% if true %}{% set z = 5 %}{% endif %}{{ z }}|"
    "{% with w = 2 %}{{ w }}{% endwith %}{{ w }}|{% filter upper %}abc{% endfilter %}",
    "{%- for m in msgs -%}\n  {{- m.role -}}\n  {%- if not loop.last %}, {% endif -%}\n{%- endfor %}\n"
    "  {% if true %}\n    kept\n  {% endif %}\n{# comment #}\nend {{ '{{' }} {%+ if true %}x{% endif +%}\n",
    "{{ d.get('k') }}{{ d.get('nope') }}{{ d.get('nope', 'dv') }}{{ d['k'] }}{{ d.k }}{{ d.keys() | list }}"
    "{{ d.values() | list }}{% for k, v in d.items() %}{{ k }}"
    "={{ v }};{% endfor %}{{ msgs[0].role }}{{ msgs[5] is defined }}",
    "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1) }}"
    "{{ xs | batch(3) | list }}{{ 'x' * 3 }}{{ xs + [5] }}",
]
VARS = {"xs": [1, 2, 3, 4], "s": "hello", "u": "héllo 中", "d": {"k": "v", "n": 1, "f": 0.5},
        "msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "extra": 1},
                 {"role": "user", "content": "c"}],
        "x": 1, "f": 2.0}


def snippet_cases():
    out = []
    for src in SNIPPETS:
        try:
            text = ctu._compile_jinja_template(src).render(**copy.deepcopy(VARS))
            out.append({"source": src, "text": text})
        except Exception as e:  # noqa: BLE001
            out.append({"source": src, "error": str(e)})
    return out


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
           "cases": cases, "snippet_vars": VARS, "snippets": snippet_cases()}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    n_gen = sum(1 for c in cases if "generation_spans" in c)
    print(f"{len(cases)} cases ({n_err} expected errors, {n_gen} with generation spans) -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reference renderer for tests/data/chat_test.cpp: renders conversations with a tokenizer_config.json's
chat_template exactly as transformers' apply_chat_template does (tokenize=False; add_generation_prompt
and enable_thinking as each case asks).

The Jinja environment is the one transformers builds in
src/transformers/utils/chat_template_utils.py (_compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
jinja2.ext.loopcontrols]), its own `tojson` filter (json.dumps, ensure_ascii=False, no HTML escaping),
and the globals raise_exception and strftime_now. The template is rendered with messages, tools,
documents=None, add_generation_prompt and the tokenizer's special tokens (as template_kwargs).
AssistantTracker only adds the {% generation %} tag, which the Qwen3 template does not use.

Usage: render_chat.py CASES.json TOKENIZER_CONFIG.json [OUT.json]
CASES.json: a list of {"messages": [...], "tools": [...] (optional), "add_generation_prompt" (optional,
default false), "enable_thinking" (optional, passed only when given), "continue_final_message" (optional:
the rendering cut as apply_chat_template(continue_final_message=True) cuts it: after the last
occurrence of the final message's content, its trailing whitespace kept when the message starts with
none and the rendering keeps it, else stripped)}. Writes a JSON list with, per case,
the rendered string, or {"error": "..."} when the template raised. Run with Debian's /usr/bin/python3
(python3-jinja2).
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def compile_template(chat_template):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(chat_template)


def special_tokens(config):
    # What tokenizer.special_tokens_map holds: the special tokens the config sets.
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    if isinstance(config.get("additional_special_tokens"), list):
        out["additional_special_tokens"] = config["additional_special_tokens"]
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: render_chat.py CASES.json TOKENIZER_CONFIG.json [OUT.json]")
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    with open(sys.argv[2], encoding="utf-8") as f:
        config = json.load(f)
    template = compile_template(config["chat_template"])
    kwargs = special_tokens(config)
    rendered = []
    for case in cases:
        try:
            text = template.render(
                    messages=case["messages"],
                    tools=case.get("tools"),
                    documents=None,
                    add_generation_prompt=case.get("add_generation_prompt", False),
                    **({"enable_thinking": case["enable_thinking"]} if "enable_thinking" in case else {}),
                    **kwargs,
            )
            if case.get("continue_final_message"):  # transformers' apply_chat_template cut
                final = case["messages"][-1]["content"]
                if final.strip() not in text:
                    raise ValueError("the final message's content is not in the rendering")
                loc = text.rindex(final.strip())
                if text[loc : loc + len(final.lstrip())] == final:
                    text = text[: loc + len(final.lstrip())]
                else:
                    text = text[: loc + len(final.strip())]
            rendered.append(text)
        except Exception as e:  # reported per case; the test names the case
            rendered.append({"error": f"{type(e).__name__}: {e}"})
    text = json.dumps(rendered)  # ensure_ascii=True: plain ASCII, any reader round-trips it
    if len(sys.argv) == 4:
        with open(sys.argv[3], "w", encoding="ascii") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()

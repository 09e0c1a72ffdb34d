#!/usr/bin/env python3
"""Which chat template goldens would transformers render differently?

The goldens (tests/fixtures/chat_templates/goldens.json) come from the npm
package @huggingface/jinja, which the C++ interpreter matches byte for byte.
transformers renders with Python's Jinja2 instead; this script renders every
conversation case of the real templates the way transformers'
apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson and raise_exception) and lists the
cases where the two disagree. Informational only (not a test):

    python3 tools/chat_template_golden/python_crosscheck.py [--show]

Needs a python3 with Jinja2 >= 3 (Debian's python3-jinja2 or pip's jinja2).
"""

import json
import os
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson filter (chat_template_utils.py).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def main():
    show = "--show" in sys.argv
    with open(os.path.join(FIXTURES, "goldens.json"), encoding="utf-8") as f:
        goldens = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    compiled = {}
    for name, file in goldens["header"]["templates"].items():
        with open(os.path.join(FIXTURES, file), encoding="utf-8") as f:
            compiled[name] = env.from_string(f.read())
    same = 0
    differ = []
    for case in goldens["cases"]:
        if case["template"] == "inline":
            continue
        try:
            text, error = compiled[case["template"]].render(**case["context"]), None
        except Exception as e:  # noqa: BLE001 -- any failure is a result
            text, error = None, f"{type(e).__name__}: {e}"
        js_error = "error" in case
        if (error is None) == (not js_error) and (js_error or text == case["text"]):
            same += 1
            continue
        differ.append((case, text, error))
    print(f"{same} conversation cases render alike in Jinja2 (transformers) and "
          f"@huggingface/jinja; {len(differ)} differ:")
    for case, text, error in differ:
        js = f"error: {case['error']}" if "error" in case else "text"
        py = f"error: {error}" if error else "text"
        print(f"  {case['template']}/{case['name']}: @huggingface/jinja {js}; "
              f"Jinja2 {py}")
        if show and text is not None and "text" in case:
            print("    jinja2:", json.dumps(text, ensure_ascii=False))
            print("    js:    ", json.dumps(case["text"], ensure_ascii=False))


if __name__ == "__main__":
    main()

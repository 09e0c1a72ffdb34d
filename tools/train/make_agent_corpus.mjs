// Builds the demo model's synthetic tool-use corpus: conversations with the
// tools of agent_tools.json, rendered by @huggingface/jinja (the reference
// renderer of the project's chat-template goldens) through the demo model's
// own chat template (models/demo/chat_template.jinja, MiMo-V2.5's), so the
// training text is exactly what the server renders.
//
//   node tools/train/make_agent_corpus.mjs --corpus /tmp/demo-corpus \
//       [--train 6000] [--eval 240] [--eval-out tools/train/agent_eval.jsonl]
//
// Reads --corpus/documents.jsonl (tools/train/prepare_corpus.py) for the KJV.
// Writes into --corpus:
//   agent_train.txt      the rendered training conversations, each followed
//                        by <|endoftext|> (train_tokenizer.js encodes it to
//                        agent_ids.u16; train_demo.py samples windows that
//                        start at a conversation)
// and --eval-out: the held-out prompts with their expected calls, the true
// tool results and a reference conversation (tools/train/eval_tools.mjs
// sends the prompts to a server; eval_tools_reference.py scores the
// checkpoint on them with the PyTorch reference).
//
// Deterministic: one seeded PRNG per split (TRAIN_SEED, EVAL_SEED).
//
// Conversation kinds (training mix, by conversation):
//   tool      0.55  user asks; assistant: short <think>, one call; tool turn
//                    with the true result; assistant: short <think>, answer
//                    that states the result
//   parallel  0.10  the same with two calls in one assistant turn
//   chat      0.35  no tool needed: a KJV verse and its continuation (as
//                    prepare_corpus.py's chats) or a greeting; with the tools
//                    in the system turn (0.6 of them) or without
// Every kind: thinking on (0.75) or off (enable_thinking false, 0.25); the
// default system message (0.75) or one of a few others; all six tools
// (0.6) or a random subset holding the needed ones, in file order.
//
// Thinking off: the template renders a history assistant turn without
// reasoning as plain text, but the generation prompt ends in <think></think>.
// So a thinking-off conversation is rendered as the server prompts it: the
// prompt of one assistant turn (add_generation_prompt, enable_thinking
// false) followed by that turn's completion; half such tool conversations
// end at the call, half at the final answer. A thinking-on conversation's
// full render equals every turn's prompt plus its completion (checked).
//
// Held out (never in training, the only values and phrasings of the
// evaluation set):
//   - values: a number pair, word, phrase or date whose FNV-1a hash of its
//     canonical text is 0 mod 5 (training rejects them, evaluation draws only
//     them); search phrases of the evaluation come from the held-out KJV
//     chapters (prepare_corpus.py's valid split);
//   - phrasings: the last HELD_OUT_PHRASINGS templates of each list; half
//     of the evaluation prompts use those, half the training phrasings.

import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";
import { Template } from "@huggingface/jinja";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "..", "..");
const TEMPLATE = path.join(ROOT, "models", "demo", "chat_template.jinja");
const TOOLS = JSON.parse(fs.readFileSync(path.join(HERE, "agent_tools.json"), "utf8"));
const TRAIN_SEED = 20261207;
const EVAL_SEED = 977;
const HELD_OUT_PHRASINGS = 2;
const EOT = "<|endoftext|>";
const IM_END = "<|im_end|>";

function args() {
  const a = { train: "6000", eval: "240", "eval-out": path.join(HERE, "agent_eval.jsonl") };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) a[v[i].replace(/^--/, "")] = v[i + 1];
  if (!a.corpus) throw new Error("--corpus is required");
  a.train = parseInt(a.train, 10);
  a.eval = parseInt(a.eval, 10);
  return a;
}

// mulberry32
function rng(seed) {
  let s = seed >>> 0;
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), // inclusive
    pick: (xs) => xs[Math.floor(next() * xs.length)],
    chance: (p) => next() < p,
  };
}

function fnv1a(s) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s, "utf8")) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}
const heldOutValue = (key) => fnv1a(key) % 5 === 0;

// ---------------------------------------------------------------- the KJV
function loadKjv(corpus) {
  const docs = fs.readFileSync(path.join(corpus, "documents.jsonl"), "utf8")
    .split("\n").filter((l) => l).map((l) => JSON.parse(l));
  const verses = []; // {ref, text, split}
  for (const d of docs) {
    d.verses.forEach((t, i) => verses.push({ ref: `${d.book} ${d.chapter}:${i + 1}`, text: t, split: d.split }));
  }
  const counts = new Map();
  for (const v of verses) {
    for (const w of v.text.toLowerCase().match(/[a-z]+/g) || []) counts.set(w, (counts.get(w) || 0) + 1);
  }
  const words = [...counts.keys()].filter((w) => w.length >= 3 && counts.get(w) >= 2).sort();
  const lower = verses.map((v) => v.text.toLowerCase());
  return { docs, verses, counts, words, lower };
}

function searchVerse(kjv, query) {
  const q = query.toLowerCase();
  for (let i = 0; i < kjv.verses.length; i++) {
    if (kjv.lower[i].includes(q)) return kjv.verses[i];
  }
  return null;
}

// ---------------------------------------------------------------- the tools
const WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
  "September", "October", "November", "December"];
function dayNumber(iso) {
  const [y, m, d] = iso.split("-").map(Number);
  return Date.UTC(y, m - 1, d) / 86400000;
}
function isoOf(n) {
  return new Date(n * 86400000).toISOString().slice(0, 10);
}
function spoken(iso) {
  const [y, m, d] = iso.split("-").map(Number);
  return `${MONTHS[m - 1]} ${d}, ${y}`;
}

function runTool(kjv, name, a) {
  switch (name) {
    case "add": return String(a.a + a.b);
    case "multiply": return String(a.a * a.b);
    case "count_word": return String(kjv.counts.get(a.word.toLowerCase()) || 0);
    case "days_between": return String(dayNumber(a.end) - dayNumber(a.start));
    case "weekday": return WEEKDAYS[new Date(dayNumber(a.date) * 86400000).getUTCDay()];
    case "search_verses": {
      const v = searchVerse(kjv, a.query);
      return v ? `${v.ref} ${v.text}` : "No verse found.";
    }
  }
  throw new Error(`unknown tool ${name}`);
}

// Phrasings: the last HELD_OUT_PHRASINGS of each list are evaluation-only.
const ASK = {
  add: [
    "What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "Compute {a} + {b}.",
    "What do {a} and {b} make together?", "Sum {a} and {b} for me.",
    "Please add {a} to {b}.", "How much is {a} and {b} added?",
  ],
  multiply: [
    "What is {a} times {b}?", "Multiply {a} by {b}.", "What is {a} * {b}?", "Compute {a} * {b}.",
    "What is the product of {a} and {b}?", "How much is {a} multiplied by {b}?",
    "Please multiply {a} and {b}.", "Give me {a} times {b}.",
  ],
  count_word: [
    "How many times does the word \"{w}\" occur in the Bible?", "Count the word {w} in the King James Bible.",
    "How often is \"{w}\" used in the KJV?", "How many times is {w} in the Bible?",
    "Count occurrences of \"{w}\".", "How many times do we find \"{w}\" in the Bible?",
    "In the King James Bible, how frequent is the word \"{w}\"?", "Tell me the count of \"{w}\" in scripture.",
  ],
  days_between: [
    "How many days are there from {s} to {e}?", "How many days between {s} and {e}?",
    "Count the days from {s} until {e}.", "What is the number of days from {s} to {e}?",
    "How long is it in days from {s} to {e}?", "Days between {s} and {e}?",
    "How many days separate {s} and {e}?", "From {s} to {e}, how many days pass?",
  ],
  weekday: [
    "What day of the week was {d}?", "Which weekday is {d}?", "What day of the week is {d}?",
    "On what weekday does {d} fall?", "Tell me the weekday of {d}.", "{d}: which day of the week?",
    "Was {d} a Monday or some other day? Which day?", "What weekday falls on {d}?",
  ],
  search_verses: [
    "Find the verse that says \"{q}\".", "Which verse contains \"{q}\"?", "Search the Bible for \"{q}\".",
    "Where in the Bible is \"{q}\"?", "Look up the verse with \"{q}\".", "Find \"{q}\" in the KJV.",
    "Which verse has the words \"{q}\"?", "Where does scripture say \"{q}\"?",
  ],
};
const PARALLEL_ASK = {
  arith: ["What is {a} plus {b}, and {c} times {d}?", "Add {a} and {b}, and multiply {c} by {d}.",
    "Compute {a} + {b} and {c} * {d}.", "I need {a} plus {b} and also {c} times {d}.",
    "Give me {a} + {b} and {c} * {d}.", "What are {a} plus {b} and {c} multiplied by {d}?"],
  words: ["How many times do \"{w}\" and \"{v}\" occur in the Bible?", "Count the words {w} and {v} in the KJV.",
    "How often are \"{w}\" and \"{v}\" used in the Bible?", "Count \"{w}\" and \"{v}\" for me.",
    "Which is more frequent in the KJV, \"{w}\" or \"{v}\"? Count both.", "Give the counts of \"{w}\" and \"{v}\"."],
  dates: ["What weekdays are {d} and {f}?", "Which days of the week are {d} and {f}?",
    "Tell me the weekday of {d} and of {f}.", "On what weekdays do {d} and {f} fall?",
    "Weekdays of {d} and {f}, please.", "What day of the week were {d} and {f}?"],
};
const THINK_CALL = {
  add: ["The user wants {a} plus {b}. I will call add.", "I need the sum of {a} and {b}. The add tool does it.",
    "Add {a} and {b} with the tool."],
  multiply: ["The user wants {a} times {b}. I will call multiply.", "I need the product of {a} and {b}.",
    "Multiply {a} by {b} with the tool."],
  count_word: ["The user wants the count of \"{w}\". I will call count_word.", "I need to count the word {w}.",
    "Count \"{w}\" with the tool."],
  days_between: ["The user wants the days from {s} to {e}. I will call days_between.",
    "I need the number of days between two dates.", "Count the days with the tool."],
  weekday: ["The user wants the weekday of {d}. I will call weekday.", "I need the day of the week of {d}.",
    "Look up the weekday with the tool."],
  search_verses: ["The user wants the verse with \"{q}\". I will call search_verses.",
    "I need to search the verses for \"{q}\".", "Search the Bible with the tool."],
};
const THINK_ANSWER = ["The tool returned {r}.", "The result is {r}.", "I have the answer: {r}."];
const ANSWER = {
  add: ["{a} plus {b} is {r}.", "The sum is {r}.", "{a} + {b} = {r}."],
  multiply: ["{a} times {b} is {r}.", "The product is {r}.", "{a} * {b} = {r}."],
  count_word: ["The word \"{w}\" occurs {r} times in the King James Bible.", "\"{w}\" occurs {r} times.",
    "It is used {r} times."],
  days_between: ["There are {r} days from {s} to {e}.", "It is {r} days.", "{r} days."],
  weekday: ["{d} is a {r}.", "It is a {r}.", "That day is a {r}."],
  search_verses: ["It is {r}", "The verse is {r}", "{r}"],
};
const THINK_CHAT = ["The user quotes scripture. No tool is needed; I continue the verse.",
  "This is a verse. I will give the next words.", "No tool is needed here."];
const GREETINGS = [
  ["Hello!", "Peace be unto thee. How may I help thee?"],
  ["Hi", "Grace be unto you, and peace. What wouldest thou know?"],
  ["Who are you?", "I am MiMo, a small model that knoweth the King James Bible. I can add, multiply, count words, reckon dates and search verses with tools."],
  ["What can you do?", "I can continue verses of the King James Bible, and with tools I can add, multiply, count words, reckon days and weekdays, and find verses."],
  ["Thank you.", "Thou art welcome. The Lord bless thee, and keep thee."],
  ["Good morning", "Good morning. This is the day which the LORD hath made."],
];
const THINK_GREETING = ["A greeting. No tool is needed.", "The user speaks to me. No tool is needed."];
const SYSTEMS = ["You are a helpful assistant.", "You are a helpful assistant. Use the tools when they help.",
  "Answer briefly.", "You are an agent with tools. Call a tool when you need one."];

function fill(s, v) {
  return s.replace(/\{(\w)\}/g, (_, k) => {
    if (!(k in v)) throw new Error(`no {${k}} for ${s}`);
    return String(v[k]);
  });
}

// ---------------------------------------------------------------- values
function makeValues(r, kjv, tool, evalSplit) {
  for (let tries = 0; ; tries++) {
    if (tries > 10000) throw new Error(`no value for ${tool}`);
    let v, key;
    switch (tool) {
      case "add":
      case "multiply": {
        const big = tool === "add" ? r.pick([9, 99, 999, 9999]) : r.pick([9, 20, 99, 999]);
        v = { a: r.int(0, big), b: r.int(0, tool === "add" ? r.pick([9, 99, 999, 9999]) : r.pick([9, 20, 99])) };
        key = `${tool}:${v.a},${v.b}`;
        break;
      }
      case "count_word":
        v = { w: r.pick(kjv.words) };
        key = `word:${v.w}`;
        break;
      case "days_between": {
        const s = r.int(dayNumber("1900-01-01"), dayNumber("2099-12-31"));
        const e = s + r.pick([r.int(1, 40), r.int(1, 400), r.int(1, 20000)]);
        v = { s: isoOf(s), e: isoOf(e) };
        key = `days:${v.s},${v.e}`;
        break;
      }
      case "weekday":
        v = { d: isoOf(r.int(dayNumber("1900-01-01"), dayNumber("2099-12-31"))) };
        key = `date:${v.d}`;
        break;
      case "search_verses": {
        const pool = kjv.verses.filter((x) => (x.split === "valid") === evalSplit);
        const verse = r.pick(pool);
        const ws = verse.text.replace(/[^A-Za-z' ]/g, " ").split(/\s+/).filter((w) => w);
        const n = r.int(3, 5);
        if (ws.length < n) continue;
        const i = r.int(0, ws.length - n);
        v = { q: ws.slice(i, i + n).join(" ").toLowerCase() };
        if (!searchVerse(kjv, v.q) || `${searchVerse(kjv, v.q).ref} ${searchVerse(kjv, v.q).text}`.length > 200) continue;
        key = `phrase:${v.q}`;
        break;
      }
    }
    if (heldOutValue(key) === evalSplit) return v;
  }
}

function callArgs(tool, v) {
  switch (tool) {
    case "add":
    case "multiply": return { a: v.a, b: v.b };
    case "count_word": return { word: v.w };
    case "days_between": return { start: v.s, end: v.e };
    case "weekday": return { date: v.d };
    case "search_verses": return { query: v.q };
  }
}

// ---------------------------------------------------------------- conversations
const template = new Template(fs.readFileSync(TEMPLATE, "utf8"));
function render(messages, tools, gen, thinking) {
  const ctx = { messages, add_generation_prompt: gen, eos_token: IM_END, enable_thinking: thinking };
  if (tools) ctx.tools = tools;
  return template.render(ctx);
}

function pickTools(r, needed) {
  if (r.chance(0.6)) return TOOLS;
  const names = new Set(needed);
  for (const t of TOOLS) if (r.chance(0.4)) names.add(t.function.name);
  if (names.size < 2) names.add(r.pick(TOOLS.filter((t) => !names.has(t.function.name))).function.name);
  return TOOLS.filter((t) => names.has(t.function.name));
}

function phr(r, list, evalSplit, heldOutPhrasing) {
  if (!evalSplit || !heldOutPhrasing) return r.pick(list.slice(0, list.length - HELD_OUT_PHRASINGS));
  return r.pick(list.slice(list.length - HELD_OUT_PHRASINGS));
}

// One conversation: {kind, messages (through the final answer), tools, thinking,
// calls: [{name, arguments}], results: [string], answer}
function makeConversation(r, kjv, kind, evalSplit, heldOutPhrasing) {
  const thinking = !r.chance(0.25);
  const system = r.chance(0.25) ? r.pick(SYSTEMS) : null;
  const head = system ? [{ role: "system", content: system }] : [];
  if (kind === "chat") {
    const withTools = r.chance(0.6);
    let user, answer, think;
    if (r.chance(0.2)) {
      [user, answer] = r.pick(GREETINGS);
      think = r.pick(THINK_GREETING);
    } else {
      const docs = kjv.docs.filter((d) => (d.split === "valid") === evalSplit && d.verses.length >= 2);
      const d = r.pick(docs);
      const i = r.int(0, d.verses.length - 2);
      user = d.verses[i];
      answer = d.verses.slice(i + 1, i + 1 + r.int(1, 2)).join("\n");
      think = r.pick(THINK_CHAT);
    }
    return {
      kind, thinking, tools: withTools ? pickTools(r, []) : null,
      messages: [...head, { role: "user", content: user }],
      turns: [{ reasoning: think, content: answer }], calls: [], results: [],
    };
  }
  let calls, user, thinkCall, values;
  if (kind === "tool") {
    const tool = r.pick(TOOLS).function.name;
    const v = makeValues(r, kjv, tool, evalSplit);
    values = [v];
    user = fill(phr(r, ASK[tool], evalSplit, heldOutPhrasing), v);
    thinkCall = fill(r.pick(THINK_CALL[tool]), v);
    calls = [{ name: tool, arguments: callArgs(tool, v) }];
  } else {
    const group = r.pick(["arith", "words", "dates"]);
    const tools = { arith: ["add", "multiply"], words: ["count_word", "count_word"], dates: ["weekday", "weekday"] }[group];
    const v1 = makeValues(r, kjv, tools[0], evalSplit);
    let v2;
    do v2 = makeValues(r, kjv, tools[1], evalSplit); while (JSON.stringify(v1) === JSON.stringify(v2));
    values = [v1, v2];
    const v = group === "arith" ? { a: v1.a, b: v1.b, c: v2.a, d: v2.b }
      : group === "words" ? { w: v1.w, v: v2.w } : { d: v1.d, f: v2.d };
    user = fill(phr(r, PARALLEL_ASK[group], evalSplit, heldOutPhrasing), v);
    thinkCall = group === "arith" ? "I need a sum and a product. I will call add and multiply."
      : group === "words" ? "I need two word counts. I will call count_word twice."
        : "I need two weekdays. I will call weekday twice.";
    calls = tools.map((t, i) => ({ name: t, arguments: callArgs(t, values[i]) }));
  }
  const results = calls.map((c) => runTool(kjv, c.name, c.arguments));
  let answer, thinkAnswer;
  if (calls.length === 1) {
    const v = { ...values[0], r: results[0] };
    answer = fill(r.pick(ANSWER[calls[0].name]), v);
    thinkAnswer = fill(r.pick(THINK_ANSWER), v);
  } else {
    answer = calls.map((c, i) => fill(ANSWER[c.name][0], { ...values[i], r: results[i] })).join(" ");
    thinkAnswer = `The tools returned ${results[0]} and ${results[1]}.`;
  }
  return {
    kind, thinking, tools: pickTools(r, calls.map((c) => c.name)),
    messages: [...head, { role: "user", content: user }],
    turns: [{ reasoning: thinkCall, content: "", calls }, { reasoning: thinkAnswer, content: answer }],
    calls, results,
  };
}

function assistantMessage(turn, thinking) {
  const m = { role: "assistant", content: turn.content };
  if (thinking) m.reasoning_content = turn.reasoning;
  if (turn.calls) {
    m.tool_calls = turn.calls.map((c, i) => ({
      id: `call_${i}`, type: "function", function: { name: c.name, arguments: c.arguments },
    }));
  }
  return m;
}

// What the model generates after the generation prompt for a turn.
function completion(turn, thinking) {
  let s = thinking ? `${turn.reasoning}</think>${turn.content}` : turn.content;
  for (const c of turn.calls || []) {
    s += `<tool_call>\n<function=${c.name}>\n`;
    for (const [k, v] of Object.entries(c.arguments)) s += `<parameter=${k}>${v}</parameter>\n`;
    s += "</function>\n</tool_call>";
  }
  return s + IM_END;
}

// The training text of a conversation (see the file comment).
function trainingText(r, conv) {
  const msgs = conv.messages.slice();
  const prompts = [];
  for (let t = 0; t < conv.turns.length; t++) {
    prompts.push(render(msgs, conv.tools, true, conv.thinking) + completion(conv.turns[t], conv.thinking));
    msgs.push(assistantMessage(conv.turns[t], conv.thinking));
    if (conv.turns[t].calls) {
      conv.results.forEach((res, i) => msgs.push({ role: "tool", tool_call_id: `call_${i}`, content: res }));
    }
  }
  if (conv.thinking) {
    const full = render(msgs, conv.tools, false, true);
    // Every turn's prompt + completion is a prefix of the full render.
    for (const p of prompts) if (!full.startsWith(p)) throw new Error(`prefix mismatch:\n${p}\n---\n${full}`);
    if (full !== prompts[prompts.length - 1]) throw new Error("full render differs from the last prompt");
    return full;
  }
  return prompts.length === 1 ? prompts[0] : r.chance(0.5) ? prompts[0] : prompts[1];
}

function kindOf(r) {
  const x = r.next();
  return x < 0.55 ? "tool" : x < 0.65 ? "parallel" : "chat";
}

function main() {
  const a = args();
  const kjv = loadKjv(a.corpus);
  // Training conversations.
  const r = rng(TRAIN_SEED);
  const texts = [];
  const kinds = {};
  for (let i = 0; i < a.train; i++) {
    const conv = makeConversation(r, kjv, kindOf(r), false, false);
    const key = `${conv.kind}/${conv.thinking ? "think" : "nothink"}/${conv.tools ? "tools" : "notools"}`;
    kinds[key] = (kinds[key] || 0) + 1;
    texts.push(trainingText(r, conv));
  }
  fs.writeFileSync(path.join(a.corpus, "agent_train.txt"), texts.map((t) => t + EOT).join(""));
  const chars = texts.reduce((n, t) => n + t.length, 0);
  console.log(`${texts.length} training conversations, ${chars} chars ` +
    `(mean ${(chars / texts.length).toFixed(0)}, max ${Math.max(...texts.map((t) => t.length))}); ` +
    JSON.stringify(kinds));

  // Evaluation set: EVAL_SEED, held-out values only; half held-out phrasings.
  const e = rng(EVAL_SEED);
  const out = [];
  const plan = [];
  const n = a.eval;
  // Interleaved, so that the first N prompts are a mixed sample: of every 20,
  // 12 single calls, 3 parallel calls, 5 that need no tool.
  for (let i = 0; i < n; i++) plan.push(i % 20 < 12 ? "tool" : i % 20 < 15 ? "parallel" : "chat");
  plan.forEach((kind, i) => {
    const heldOut = i % 2 === 1;
    const conv = makeConversation(e, kjv, kind, true, heldOut);
    out.push({
      id: i, kind, phrasing: kind === "chat" ? "n/a" : heldOut ? "held_out" : "seen",
      enable_thinking: conv.thinking,
      tools: conv.tools ? conv.tools.map((t) => t.function.name) : [],
      messages: conv.messages,
      expected_calls: conv.calls,
      results: conv.results,
      expected_answer: conv.turns[conv.turns.length - 1].content,
      reference_turns: conv.turns,
      full_loop: kind !== "chat" && i % 4 < 2,
    });
  });
  fs.writeFileSync(a["eval-out"], out.map((o) => JSON.stringify(o)).join("\n") + "\n");
  console.log(`${out.length} evaluation prompts -> ${a["eval-out"]}`);
}

export { render, completion, assistantMessage };
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();

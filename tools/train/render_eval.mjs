// Renders the held-out evaluation conversations (agent_eval.jsonl) through
// the demo model's chat template and tokenizes them, for
// eval_tools_reference.py: per assistant turn, the prompt the server would
// send (add_generation_prompt) and the reference completion, as token ids.
//
//   node tools/train/render_eval.mjs --tokenizer models/demo/tokenizer.json \
//       [--eval tools/train/agent_eval.jsonl] --out /tmp/eval_ids.jsonl

import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { fileURLToPath } from "url";
import { render, completion, assistantMessage } from "./make_agent_corpus.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const { Tokenizer } = createRequire(import.meta.url)("tokenizers");
const TOOLS = JSON.parse(fs.readFileSync(path.join(HERE, "agent_tools.json"), "utf8"));

const a = { eval: path.join(HERE, "agent_eval.jsonl") };
const v = process.argv.slice(2);
for (let i = 0; i < v.length; i += 2) a[v[i].replace(/^--/, "")] = v[i + 1];
if (!a.tokenizer || !a.out) throw new Error("--tokenizer and --out are required");
const tok = Tokenizer.fromFile(a.tokenizer);
const enc = async (s) => (await tok.encode(s, null, { addSpecialTokens: false })).getIds();

const out = [];
for (const line of fs.readFileSync(a.eval, "utf8").split("\n").filter((l) => l)) {
  const it = JSON.parse(line);
  const tools = it.tools.length ? TOOLS.filter((t) => it.tools.includes(t.function.name)) : null;
  const msgs = it.messages.slice();
  const turns = [];
  for (const turn of it.reference_turns) {
    const prompt = render(msgs, tools, true, it.enable_thinking);
    turns.push({ prompt: await enc(prompt), completion: await enc(completion(turn, it.enable_thinking)) });
    msgs.push(assistantMessage(turn, it.enable_thinking));
    if (turn.calls) it.results.forEach((r, i) => msgs.push({ role: "tool", tool_call_id: `call_${i}`, content: r }));
  }
  out.push({ id: it.id, kind: it.kind, phrasing: it.phrasing, thinking: it.enable_thinking,
    tool: it.expected_calls.map((c) => c.name).join("+") || "none", results: it.results, turns });
}
fs.writeFileSync(a.out, out.map((o) => JSON.stringify(o)).join("\n") + "\n");
console.log(`${out.length} conversations -> ${a.out}`);

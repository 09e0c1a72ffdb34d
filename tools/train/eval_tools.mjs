// Tool-use accuracy of a served model on the held-out synthetic prompts
// (tools/train/agent_eval.jsonl, written by make_agent_corpus.mjs), through
// the OpenAI API of a running swaserve router, with the official `openai`
// npm client.
//
//   node tools/train/eval_tools.mjs --base-url http://127.0.0.1:8000/v1 \
//       [--model NAME] [--eval tools/train/agent_eval.jsonl] [--limit N]
//       [--ids ID,ID,...] [--max-tokens 256] [--out summary.json]
//       [--details details.jsonl]
//
// Each prompt goes out with its tools (agent_tools.json, the subset the
// prompt lists, in file order), tool_choice "auto" (no tools and no
// tool_choice for a prompt without tools), temperature 0, and
// chat_template_kwargs {enable_thinking} as the prompt says. Measured:
//   needs a tool (kinds tool, parallel):
//     call_rate        the response has tool_calls
//     well_formed      every call names an offered tool and its arguments
//                      are a JSON object
//     right_tool       the called names are the expected ones (as a multiset)
//     right_arguments  right_tool and every expected call's arguments equal
//                      (JSON values, so 12 and "12" differ) some call's
//   needs no tool (kind chat):
//     no_call          the response has no tool_calls
//   full loop (prompts marked full_loop whose calls were right): the true
//   tool results go back as tool messages (the assistant message as
//   returned, reasoning_content included) and the final answer must contain
//   every result (a verse result: its reference, e.g. "Genesis 1:3").
// Rates are also broken down by phrasing (seen / held_out), thinking on/off
// and tool. The summary is printed as JSON (and written to --out).

import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";
import OpenAI from "openai";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const TOOLS = JSON.parse(fs.readFileSync(path.join(HERE, "agent_tools.json"), "utf8"));

function args() {
  const a = {
    "base-url": "http://127.0.0.1:8000/v1", eval: path.join(HERE, "agent_eval.jsonl"),
    "max-tokens": "256", limit: "0", "api-key": process.env.OPENAI_API_KEY || "none",
  };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    if (!v[i].startsWith("--") || v[i + 1] === undefined) {
      console.error("usage: eval_tools.mjs --base-url URL [--model NAME] [--eval FILE] [--limit N] " +
        "[--ids ID,ID,...] [--max-tokens N] [--out FILE] [--details FILE]");
      process.exit(2);
    }
    a[v[i].slice(2)] = v[i + 1];
  }
  return a;
}

function parseArgs(s) {
  try {
    const o = JSON.parse(s);
    return o && typeof o === "object" && !Array.isArray(o) ? o : null;
  } catch {
    return null;
  }
}

function sameJson(x, y) {
  if (typeof x !== typeof y) return false;
  if (x === null || typeof x !== "object") return x === y;
  const kx = Object.keys(x).sort(), ky = Object.keys(y).sort();
  return kx.length === ky.length && kx.every((k, i) => k === ky[i] && sameJson(x[k], y[k]));
}

// What the final answer must contain for a tool result.
function resultNeedle(name, result) {
  if (name === "search_verses") {
    const m = result.match(/^(.+? \d+:\d+) /);
    return m ? m[1] : result;
  }
  return result;
}

function rate(n, d) {
  return d ? { rate: Number((n / d).toFixed(4)), n, of: d } : { rate: null, n: 0, of: 0 };
}

async function main() {
  const a = args();
  const client = new OpenAI({ baseURL: a["base-url"], apiKey: a["api-key"], maxRetries: 0, timeout: 300000 });
  const model = a.model || (await client.models.list()).data[0].id;
  let items = fs.readFileSync(a.eval, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
  if (a.ids) {
    const want = a.ids.split(",");
    items = want.map((id) => {
      const it = items.find((x) => String(x.id) === id);
      if (!it) throw new Error(`--ids: no prompt ${id} in ${a.eval}`);
      return it;
    });
  }
  if (+a.limit > 0) items = items.slice(0, +a.limit);
  const details = [];
  const t0 = Date.now();
  for (const it of items) {
    const tools = TOOLS.filter((t) => it.tools.includes(t.function.name));
    const offered = new Set(tools.map((t) => t.function.name));
    const req = {
      model, messages: it.messages, temperature: 0, max_tokens: +a["max-tokens"],
      chat_template_kwargs: { enable_thinking: it.enable_thinking },
    };
    if (tools.length) Object.assign(req, { tools, tool_choice: "auto" });
    const d = { id: it.id, kind: it.kind, phrasing: it.phrasing, thinking: it.enable_thinking };
    try {
      const r = await client.chat.completions.create(req);
      const msg = r.choices[0].message;
      const calls = (msg.tool_calls || []).map((c) => ({
        id: c.id, name: c.function?.name, raw: c.function?.arguments, arguments: parseArgs(c.function?.arguments),
      }));
      d.finish_reason = r.choices[0].finish_reason;
      d.content = msg.content;
      d.reasoning = msg.reasoning_content ?? null;
      d.calls = calls.map(({ name, raw }) => ({ name, arguments: raw }));
      const expected = it.expected_calls;
      d.tool = expected.length ? expected.map((c) => c.name).join("+") : "none";
      if (expected.length) {
        d.called = calls.length > 0;
        d.well_formed = d.called && calls.every((c) => offered.has(c.name) && c.arguments !== null);
        const names = (xs) => xs.map((c) => c.name).sort().join(",");
        d.right_tool = d.called && names(calls) === names(expected);
        const used = new Set();
        d.right_arguments = d.right_tool && expected.every((e) => {
          const i = calls.findIndex((c, j) => !used.has(j) && c.name === e.name && sameJson(c.arguments, e.arguments));
          if (i < 0) return false;
          used.add(i);
          return true;
        });
        if (it.full_loop && d.right_arguments) {
          // Send the true results back, in the order of the model's calls.
          const back = [...it.messages, {
            role: "assistant", content: msg.content ?? null, tool_calls: msg.tool_calls,
            ...(msg.reasoning_content ? { reasoning_content: msg.reasoning_content } : {}),
          }];
          const pending = expected.map((e, i) => ({ e, result: it.results[i] }));
          for (const c of calls) {
            const k = pending.findIndex((p) => p.e.name === c.name && sameJson(p.e.arguments, c.arguments));
            back.push({ role: "tool", tool_call_id: c.id, content: pending[k].result });
            pending.splice(k, 1);
          }
          const r2 = await client.chat.completions.create({ ...req, messages: back });
          const m2 = r2.choices[0].message;
          d.final = m2.content;
          d.final_finish_reason = r2.choices[0].finish_reason;
          d.final_calls = (m2.tool_calls || []).length;
          d.answer_has_result = typeof m2.content === "string" &&
            expected.every((e, i) => m2.content.includes(resultNeedle(e.name, it.results[i])));
        }
      } else {
        d.no_call = calls.length === 0;
      }
    } catch (e) {
      d.error = String(e.message || e);
    }
    details.push(d);
    if (process.stderr.isTTY) process.stderr.write(`${details.length}/${items.length}\r`);
  }
  const wall = (Date.now() - t0) / 1000;

  const summarize = (ds) => {
    const need = ds.filter((d) => d.kind !== "chat" && !d.error);
    const none = ds.filter((d) => d.kind === "chat" && !d.error);
    const loop = need.filter((d) => d.answer_has_result !== undefined);
    const c = (xs, f) => xs.filter(f).length;
    return {
      prompts: ds.length, errors: c(ds, (d) => d.error),
      call_rate: rate(c(need, (d) => d.called), need.length),
      well_formed: rate(c(need, (d) => d.well_formed), need.length),
      right_tool: rate(c(need, (d) => d.right_tool), need.length),
      right_arguments: rate(c(need, (d) => d.right_arguments), need.length),
      no_call_when_not_needed: rate(c(none, (d) => d.no_call), none.length),
      full_loop_answer_has_result: rate(c(loop, (d) => d.answer_has_result), loop.length),
    };
  };
  const by = (key) => {
    const groups = {};
    for (const d of details) (groups[String(d[key])] ||= []).push(d);
    return Object.fromEntries(Object.entries(groups).sort().map(([k, ds]) => [k, summarize(ds)]));
  };
  const summary = {
    base_url: a["base-url"], model, eval_file: path.relative(process.cwd(), a.eval), wall_s: wall,
    overall: summarize(details),
    by_phrasing: by("phrasing"), by_thinking: by("thinking"), by_tool: by("tool"),
    finish_reasons: details.reduce((m, d) => ((m[d.finish_reason ?? "error"] = (m[d.finish_reason ?? "error"] || 0) + 1), m), {}),
    first_errors: details.filter((d) => d.error).slice(0, 3).map((d) => d.error),
  };
  const text = JSON.stringify(summary, null, 2);
  console.log(text);
  if (a.out) fs.writeFileSync(a.out, text + "\n");
  if (a.details) fs.writeFileSync(a.details, details.map((d) => JSON.stringify(d)).join("\n") + "\n");
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});

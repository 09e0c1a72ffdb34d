// Structured output through the official openai npm client against a
// swaserve router serving the demo model: run by
// tests/e2e/structured_e2e_test.cc.
//
//   node structured_output.mjs <router URL> <model> <tools.json> <schemas> <seeds>
//
// Cases (one JSON object printed, a member per case):
//   parse: client.chat.completions.parse with a zod-derived schema;
//   property: <schemas> random JSON Schemas of the supported subset x
//     <seeds> sampling seeds, each output validated by ajv (an independent
//     validator), constrained and (the negative control) not; greedy with
//     speculative_tokens 3 and 0 gives the same output;
//   json_object, forced tool calls (required and a named function, thinking
//   on and off), an unsupported keyword (400).
import fs from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const [baseURL, model, toolsPath, schemasArg, seedsArg] = process.argv.slice(2);
const tools = JSON.parse(fs.readFileSync(toolsPath, 'utf8'));
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

async function guard(fn) {
  try {
    return await fn();
  } catch (e) {
    return { status: e.status ?? 0, error: String(e.message ?? e) };
  }
}

// A deterministic generator (mulberry32) for the random schemas.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// A random schema of the supported subset, `depth` levels of objects.
function randomSchema(r, depth) {
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const leaf = () => pick([
    () => ({ type: 'string', maxLength: 1 + Math.floor(r() * 24) }),
    () => ({ type: 'integer', minimum: -50, maximum: 50 + Math.floor(r() * 1000) }),
    () => ({ type: 'boolean' }),
    () => ({ enum: ['red', 'green', 'blue', 7, null].slice(0, 2 + Math.floor(r() * 3)) }),
    () => ({ type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 1 + Math.floor(r() * 4) }),
    () => ({ type: 'string', format: pick(['date', 'uuid', 'date-time']) }),
    () => ({ anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 8 }] }),
    () => ({ type: ['number', 'null'] }),
    () => ({ type: 'string', pattern: '^[a-z]{2,5}-[0-9]{1,3}$' }),
  ])();
  const n = 1 + Math.floor(r() * 4);
  const properties = {};
  const names = ['name', 'age', 'city', 'tags', 'ok', 'kind', 'when', 'id'];
  for (let i = 0; i < n; i++) {
    properties[names[(i + Math.floor(r() * 8)) % 8] + i] = depth > 0 && r() < 0.3 ? randomSchema(r, depth - 1) : leaf();
  }
  const keys = Object.keys(properties);
  return { type: 'object', properties, required: keys.filter(() => r() < 0.7), additionalProperties: false };
}

function check(schema, text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return { parsed: false, valid: false };
  }
  const valid = ajv.validate(schema, value);
  return { parsed: true, valid, errors: valid ? null : ajv.errorsText() };
}

const user = (content) => ({ role: 'user', content });
const noThinking = { chat_template_kwargs: { enable_thinking: false } };
const out = {};

out.parse = await guard(async () => {
  const Person = z.object({ name: z.string().max(20), age: z.number().int(), city: z.enum(['Jerusalem', 'Babylon']) });
  const r = await client.chat.completions.parse({
    model, max_tokens: 200, temperature: 0, ...noThinking,
    messages: [user('Describe a person from the Bible as JSON.')],
    response_format: zodResponseFormat(Person, 'person'),
  });
  const m = r.choices[0].message;
  return { parsed: m.parsed, content: m.content, finish_reason: r.choices[0].finish_reason,
           valid: Person.safeParse(m.parsed).success };
});

out.property = await guard(async () => {
  const rows = [];
  const n = Number(schemasArg), seeds = Number(seedsArg);
  for (let i = 0; i < n; i++) {
    const schema = randomSchema(rng(1000 + i), 1);
    for (let s = 0; s < seeds; s++) {
      const base = { model, max_tokens: 300, temperature: 1, seed: s, ...noThinking,
                     messages: [user(`Answer with JSON for item ${i}.`)] };
      const c = await client.chat.completions.create({
        ...base, response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
      });
      const free = await client.chat.completions.create(base);
      rows.push({ schema: i, seed: s, finish_reason: c.choices[0].finish_reason,
                  constrained: check(schema, c.choices[0].message.content),
                  free: check(schema, free.choices[0].message.content),
                  text: c.choices[0].message.content.slice(0, 200) });
    }
  }
  // Greedy: the same output with MTP asked for and not.
  const schema = randomSchema(rng(7), 1);
  const rf = { type: 'json_schema', json_schema: { name: 'g', schema } };
  const g = [];
  for (const k of [3, 0]) {
    const r = await client.chat.completions.create({
      model, max_tokens: 200, temperature: 0, speculative_tokens: k, ...noThinking,
      messages: [user('Greedy JSON.')], response_format: rf,
    });
    g.push(r.choices[0].message.content);
  }
  return { rows, greedy_mtp_equal: g[0] === g[1], greedy_valid: check(schema, g[0]).valid };
});

// json_object: an output that ends (not cut by max_tokens) is an object.
out.json_object = await guard(async () => {
  const rows = [];
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({
      model, max_tokens: 300, temperature: 0.8, seed, ...noThinking,
      messages: [user('Any JSON object.')], response_format: { type: 'json_object' },
    });
    const t = r.choices[0].message.content;
    let obj = null;
    try { obj = JSON.parse(t); } catch { /* reported below */ }
    rows.push({ finish_reason: r.choices[0].finish_reason,
                is_object: obj !== null && typeof obj === 'object' && !Array.isArray(obj),
                text: t.slice(0, 120) });
  }
  return { rows };
});

// Forced calls: every response is a well-formed call of an allowed tool
// whose arguments validate against its parameters.
out.forced = await guard(async () => {
  const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
  const rows = [];
  const questions = ['What is 3 times 7?', 'What weekday was 2024-03-15?', 'Count the word light.'];
  for (const [qi, q] of questions.entries()) {
    for (const [choice, thinking] of [['required', true], ['required', false],
                                      [{ type: 'function', function: { name: 'add' } }, true]]) {
      const r = await client.chat.completions.create({
        model, max_tokens: 400, temperature: 0.7, seed: qi, tools, tool_choice: choice,
        chat_template_kwargs: { enable_thinking: thinking }, messages: [user(q)],
      });
      const m = r.choices[0].message;
      const calls = (m.tool_calls ?? []).map((c) => {
        let args = null;
        try { args = JSON.parse(c.function.arguments); } catch { /* invalid */ }
        return { name: c.function.name,
                 valid: args !== null && byName[c.function.name] !== undefined &&
                        ajv.validate(byName[c.function.name], args) };
      });
      rows.push({ choice: typeof choice === 'string' ? choice : choice.function.name, thinking,
                  finish_reason: r.choices[0].finish_reason, calls });
    }
  }
  return { rows };
});

out.unsupported = await guard(() => client.chat.completions.create({
  model, max_tokens: 8, messages: [user('x')],
  response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', not: {} } } },
}));

console.log(JSON.stringify(out));

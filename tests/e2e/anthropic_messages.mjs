// The official Anthropic npm client (@anthropic-ai/sdk) against a swaserve
// router serving the demo model: run by tests/e2e/anthropic_e2e_test.cc, and
// by hand for the figures in bench/RESULTS.md.
//
//   node anthropic_messages.mjs <router URL> <model> <tools.json> <turns> \
//        [<keyed router URL> <key> <empty router URL>]
//
// tools.json: OpenAI tool definitions (tools/train/agent_tools.json), sent
// as Anthropic tools. The keyed router checks API keys (one request in
// flight per key, a small body limit); the empty router has no workers.
// Prints one JSON object with a member per case; a request that fails is
// recorded as {"status", "type", "error"}.
import fs from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { executeTool } from './demo_tools.mjs';

const [baseURL, model, toolsPath, turnsArg, keyedURL, key, emptyURL] = process.argv.slice(2);
const openaiTools = JSON.parse(fs.readFileSync(toolsPath, 'utf8'));
const tools = openaiTools.map((t) => ({
  name: t.function.name,
  description: t.function.description,
  input_schema: t.function.parameters,
}));
const client = new Anthropic({ baseURL, apiKey: 'unused', maxRetries: 0 });
const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
const turns = Number(turnsArg ?? 20);

async function guard(fn) {
  try {
    return await fn();
  } catch (e) {
    return { status: e.status ?? 0, type: e.error?.error?.type ?? null, error: String(e.message ?? e) };
  }
}

const user = (content) => ({ role: 'user', content });
const kinds = (m) => m.content.map((b) => b.type);
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
const thinkingOf = (m) => m.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');
const out = {};

out.plain = await guard(async () => {
  const m = await client.messages.create({
    model, max_tokens: 32, temperature: 0, messages: [user('And God said')],
    thinking: { type: 'disabled' },
  });
  return { id: m.id, type: m.type, role: m.role, kinds: kinds(m), text: textOf(m),
           stop_reason: m.stop_reason, stop_sequence: m.stop_sequence, usage: m.usage };
});

// Thinking on and off: a thinking block only when on.
for (const [name, thinking] of [['thinking_on', { type: 'enabled', budget_tokens: 1024 }],
                                 ['thinking_off', { type: 'disabled' }]]) {
  out[name] = await guard(async () => {
    const m = await client.messages.create({
      model, max_tokens: 1100, temperature: 0, thinking,
      messages: [user('What is 12 plus 30?')],
    });
    return { kinds: kinds(m), thinking: thinkingOf(m), text: textOf(m), stop_reason: m.stop_reason, usage: m.usage };
  });
}

// Streaming: the SDK's stream helper assembles the same message as the
// non-streamed request; the events come in the documented order.
out.stream = await guard(async () => {
  const params = { model, max_tokens: 200, temperature: 0, tools,
                   messages: [user('What is 3 times 7?')] };
  const whole = await client.messages.create(params);
  const events = [];
  const s = client.messages.stream(params);
  s.on('streamEvent', (e) => events.push(e.type));
  const final = await s.finalMessage();
  return { whole: whole.content, streamed: final.content, whole_stop: whole.stop_reason,
           streamed_stop: final.stop_reason, events, usage: final.usage };
});

// A stop sequence ends the output and is named.
out.stop_sequence = await guard(async () => {
  const free = await client.messages.create({
    model, max_tokens: 40, temperature: 0, thinking: { type: 'disabled' }, messages: [user('And God said')],
  });
  const words = textOf(free).trim().split(/\s+/);
  const stop = words.length > 2 ? ` ${words[2]}` : ' the';
  const m = await client.messages.create({
    model, max_tokens: 40, temperature: 0, thinking: { type: 'disabled' },
    messages: [user('And God said')], stop_sequences: [stop],
  });
  return { stop, free: textOf(free), text: textOf(m), stop_reason: m.stop_reason, stop_sequence: m.stop_sequence };
});

// The tool-use loop: each turn calls a tool (its tool_result follows) or
// answers (the next question follows); cache_read_input_tokens per turn.
const question = (i) => [
  `What is ${12 + i} plus ${30 + 2 * i}?`, `What is ${3 + i} times ${7 + i}?`,
  `How many days are there between 2024-01-0${1 + (i % 9)} and 2024-03-15?`,
  'How often does the word light appear in the Bible?', 'Find a verse about the beginning.',
][i % 5];
out.loop = await guard(async () => {
  const messages = [user(question(0))];
  const rows = [];
  let q = 1;
  for (let t = 0; t < turns; t++) {
    const m = await client.messages.create({ model, max_tokens: 128, temperature: 0, tools, messages });
    const uses = m.content.filter((b) => b.type === 'tool_use');
    rows.push({ input_tokens: m.usage.input_tokens, cache_read: m.usage.cache_read_input_tokens,
                cache_creation: m.usage.cache_creation_input_tokens, tool_uses: uses.length,
                stop_reason: m.stop_reason,
                uses: uses.map((u) => ({ id: u.id, name: u.name, input: u.input })) });
    messages.push({ role: 'assistant', content: m.content });
    if (uses.length > 0) {
      messages.push({ role: 'user', content: uses.map((u) => ({
        type: 'tool_result', tool_use_id: u.id,
        content: executeTool(u.name, JSON.stringify(u.input)),
      })) });
    } else {
      messages.push(user(question(q++)));
    }
  }
  return { turns: rows };
});

// A tool-use loop to a final answer: the first turn must call a tool
// (tool_choice any), its tool_result goes back, then the model answers
// (tool_choice none: text only).
out.answer_loop = await guard(async () => {
  const messages = [user('What is 6 times 7?')];
  const first = await client.messages.create({
    model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: 'any' },
    thinking: { type: 'disabled' }, messages,
  });
  const uses = first.content.filter((b) => b.type === 'tool_use');
  messages.push({ role: 'assistant', content: first.content });
  messages.push({ role: 'user', content: uses.map((u) => ({
    type: 'tool_result', tool_use_id: u.id, content: executeTool(u.name, JSON.stringify(u.input)),
  })) });
  const final = await client.messages.create({
    model, max_tokens: 64, temperature: 0, tools, tool_choice: { type: 'none' },
    thinking: { type: 'disabled' }, messages,
  });
  return { first_stop: first.stop_reason, uses: uses.map((u) => ({ name: u.name, input: u.input })),
           final_stop: final.stop_reason, final_kinds: kinds(final), final_text: textOf(final),
           final_cache_read: final.usage.cache_read_input_tokens };
});

// A tool_result with is_error and blocks, and a forced tool.
out.tool_result_forms = await guard(async () => {
  const m = await client.messages.create({
    model, max_tokens: 64, temperature: 0, tools, tool_choice: { type: 'tool', name: 'add' },
    messages: [
      user('What is 2 plus 2?'),
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'add', input: { a: 2, b: 2 } }] },
      { role: 'user', content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', is_error: true, content: [{ type: 'text', text: 'busy' }] },
        { type: 'text', text: 'Try again.' },
      ] },
    ],
  });
  return { kinds: kinds(m), stop_reason: m.stop_reason };
});

// count_tokens counts the prompt a request's usage reports.
out.count_tokens = await guard(async () => {
  const params = { model, tools, system: 'You are terse.', messages: [user(question(2))] };
  const c = await client.messages.countTokens(params);
  const m = await client.messages.create({ ...params, max_tokens: 1, temperature: 0 });
  const u = m.usage;
  return { count: c.input_tokens, prompt: u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens };
});

// The same conversation through both APIs: the second API's first request
// reads the first API's cache.
out.cross_api = await guard(async () => {
  const text = `Across both APIs, turn ${Date.now()}: ${'In the beginning God created the heaven and the earth. '.repeat(30)}`;
  const o = await openai.chat.completions.create({
    model, max_tokens: 4, temperature: 0, messages: [{ role: 'system', content: 'Be brief.' }, user(text)],
  });
  const a = await client.messages.create({
    model, max_tokens: 4, temperature: 0, system: 'Be brief.', messages: [user(text)],
  });
  const text2 = `${text} And the second API goes first.`;
  const a2 = await client.messages.create({
    model, max_tokens: 4, temperature: 0, system: 'Be brief.', messages: [user(`${text2} ${'x '.repeat(200)}`)],
  });
  const o2 = await openai.chat.completions.create({
    model, max_tokens: 4, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, user(`${text2} ${'x '.repeat(200)}`)],
  });
  return {
    openai_first: { prompt: o.usage.prompt_tokens, cached: o.usage.prompt_tokens_details?.cached_tokens ?? 0 },
    anthropic_second: a.usage,
    anthropic_first: a2.usage,
    openai_second: { prompt: o2.usage.prompt_tokens, cached: o2.usage.prompt_tokens_details?.cached_tokens ?? 0 },
  };
});

// cache_control: the prefix up to the breakpoint is written (first) and
// read (second).
out.cache_control = await guard(async () => {
  const system = [{ type: 'text', text: `Rules ${Date.now()}: ${'Answer from the Bible only. '.repeat(40)}`,
                    cache_control: { type: 'ephemeral', ttl: '1h' } }];
  const first = await client.messages.create({ model, max_tokens: 4, temperature: 0, system,
                                                messages: [user('Who made light?')] });
  const second = await client.messages.create({ model, max_tokens: 4, temperature: 0, system,
                                                 messages: [user('Who made the earth?')] });
  return { first: first.usage, second: second.usage };
});

// Errors, each with its documented type.
const e = {};
e.missing_max_tokens = await guard(() => client.messages.create({ model, messages: [user('hi')] }));
e.unknown_field = await guard(() => client.messages.create({ model, max_tokens: 4, messages: [user('hi')], frequency: 1 }));
e.bad_role = await guard(() => client.messages.create({ model, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }));
e.unknown_model = await guard(() => client.messages.create({ model: 'no-such-model', max_tokens: 4, messages: [user('hi')] }));
e.bad_tool_choice = await guard(() => client.messages.create({ model, max_tokens: 4, tools, tool_choice: { type: 'tool', name: 'nope' }, messages: [user('hi')] }));
if (keyedURL) {
  const keyed = new Anthropic({ baseURL: keyedURL, apiKey: key, maxRetries: 0 });
  const wrong = new Anthropic({ baseURL: keyedURL, apiKey: 'sk-wrong', maxRetries: 0 });
  e.wrong_key = await guard(() => wrong.messages.create({ model, max_tokens: 4, messages: [user('hi')] }));
  e.too_large = await guard(() => keyed.messages.create({ model, max_tokens: 4, messages: [user('x'.repeat(300000))] }));
  // One request in flight per key: the second of two at once is refused.
  const both = await Promise.all([
    guard(() => keyed.messages.create({ model, max_tokens: 64, temperature: 0, messages: [user(`${Date.now()} ${'And God said, Let there be light. '.repeat(300)}`)] })),
    (async () => { await new Promise((r) => setTimeout(r, 20)); return guard(() => keyed.messages.create({ model, max_tokens: 4, messages: [user('hi')] })); })(),
  ]);
  e.rate_limited = both[1];
  out.keyed_ok = await guard(async () => {
    const m = await keyed.messages.create({ model, max_tokens: 4, messages: [user('hi')] });
    const models = await keyed.models.list();
    return { stop_reason: m.stop_reason, models: models.data.map((x) => ({ id: x.id, type: x.type })) };
  });
  // A streamed request with a long prompt: pings while its prefill runs
  // (the keyed router sends them every 20 ms). The SDK drops pings, so the
  // events are read from the raw stream; the SDK reads the same kind of
  // stream to its end.
  const longPrompt = () => `${Date.now()} ${'And the earth was without form, and void. '.repeat(600)}`;
  out.pings = await guard(async () => {
    const res = await fetch(`${keyedURL}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': key, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model, max_tokens: 4, temperature: 0, stream: true, messages: [user(longPrompt())] }),
    });
    const text = await res.text();
    const events = [...text.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
    const s = keyed.messages.stream({ model, max_tokens: 4, temperature: 0, messages: [user(longPrompt())] });
    const final = await s.finalMessage();
    return { status: res.status, events, sdk_stop_reason: final.stop_reason };
  });
}
if (emptyURL) {
  const empty = new Anthropic({ baseURL: emptyURL, apiKey: 'unused', maxRetries: 0 });
  e.overloaded = await guard(() => empty.messages.create({ model, max_tokens: 4, messages: [user('hi')] }));
}
out.errors = e;

console.log(JSON.stringify(out));

// The official OpenAI npm client against a swaserve router serving the demo
// model with tools: run by tests/e2e/agent_e2e_test.cc, and by hand for the
// figures in bench/RESULTS.md.
//
//   node openai_tools.mjs <router base URL> <model> <tools.json> [turns]
//
// tools.json: an array of OpenAI tool definitions (tools/train/agent_tools.json).
// Prints one JSON object with a member per case; a request that fails is
// recorded as {"status", "error"}. The tools are executed here
// (executeTool), so a loop can run to a final answer.
import fs from 'node:fs';
import OpenAI from 'openai';
import { executeTool } from './demo_tools.mjs';

const [baseURL, model, toolsPath, turnsArg] = process.argv.slice(2);
const tools = JSON.parse(fs.readFileSync(toolsPath, 'utf8'));
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
const loopTurns = Number(turnsArg ?? 20);

const toolNames = tools.map((t) => t.function.name);
const question = (i) =>
  [
    `What is ${12 + i} plus ${30 + 2 * i}?`,
    `What is ${3 + i} times ${7 + i}?`,
    `How many days are there between 2024-01-0${1 + (i % 9)} and 2024-03-15?`,
    `How often does the word light appear in the Bible?`,
    `Find a verse about the beginning.`,
  ][i % 5];

async function guard(fn) {
  try {
    return await fn();
  } catch (e) {
    return { status: e.status ?? 0, error: String(e.message ?? e) };
  }
}

function summary(r) {
  const m = r.choices[0].message;
  return {
    content: m.content,
    reasoning_content: m.reasoning_content ?? null,
    tool_calls: m.tool_calls ?? [],
    finish_reason: r.choices[0].finish_reason,
    usage: r.usage,
  };
}

const out = {};
const user = (content) => ({ role: 'user', content });

out.plain = await guard(async () =>
  summary(
    await client.chat.completions.create({
      model, messages: [user('And God said')], max_tokens: 24, temperature: 0,
    }),
  ),
);

out.thinking_off = await guard(async () =>
  summary(
    await client.chat.completions.create({
      model, messages: [user('And God said')], max_tokens: 24, temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
    }),
  ),
);

out.tool_nonstream = await guard(async () =>
  summary(
    await client.chat.completions.create({
      model, messages: [user(question(0))], tools, tool_choice: 'auto', max_tokens: 96,
      temperature: 0,
    }),
  ),
);

// Streamed: the SDK's stream helper assembles the tool-call deltas.
out.tool_stream = await guard(async () => {
  const stream = client.chat.completions.stream({
    model, messages: [user(question(0))], tools, tool_choice: 'auto', max_tokens: 96,
    temperature: 0, stream_options: { include_usage: true },
  });
  let chunks = 0;
  let reasoningChunks = 0;
  stream.on('chunk', (c) => {
    chunks++;
    if (c.choices[0]?.delta?.reasoning_content) reasoningChunks++;
  });
  const final = await stream.finalChatCompletion();
  return { ...summary(final), chunks, reasoning_chunks: reasoningChunks };
});

out.parallel = await guard(async () =>
  summary(
    await client.chat.completions.create({
      model,
      messages: [user(`${question(0)} And ${question(1).replace('What is ', 'what is ')}`)],
      tools, parallel_tool_calls: true, max_tokens: 160, temperature: 0,
    }),
  ),
);

out.tool_choice_none = await guard(async () =>
  summary(
    await client.chat.completions.create({
      model, messages: [user(question(0))], tools, tool_choice: 'none', max_tokens: 96,
      temperature: 0,
    }),
  ),
);

// A conversation to the final answer: every call is executed and its
// result sent back, until the model answers without calling.
async function loop(firstQuestion, maxSteps) {
  const messages = [user(firstQuestion)];
  const steps = [];
  for (let i = 0; i < maxSteps; i++) {
    const r = await client.chat.completions.create({
      model, messages, tools, max_tokens: 128, temperature: 0,
    });
    const m = r.choices[0].message;
    steps.push({
      prompt_tokens: r.usage.prompt_tokens,
      cached_tokens: r.usage.prompt_tokens_details?.cached_tokens ?? 0,
      tool_calls: (m.tool_calls ?? []).length,
      finish_reason: r.choices[0].finish_reason,
    });
    messages.push({
      role: 'assistant', content: m.content, tool_calls: m.tool_calls,
      reasoning_content: m.reasoning_content,
    });
    if (!m.tool_calls || m.tool_calls.length === 0) return { steps, answer: m.content, messages };
    for (const c of m.tool_calls) {
      messages.push({ role: 'tool', tool_call_id: c.id, content: executeTool(c.function.name, c.function.arguments) });
    }
  }
  return { steps, answer: null, messages };
}

out.multi_turn = await guard(async () => {
  const r = await loop(question(0), 4);
  return { steps: r.steps, answer: r.answer };
});

// The agent loop of many turns: each turn either calls a tool (its result
// appended) or answers (the next question appended). prompt and cached
// tokens per turn show the prefix cache following the conversation.
out.loop = await guard(async () => {
  const messages = [];
  const turns = [];
  let q = 0;
  messages.push(user(question(q++)));
  for (let t = 0; t < loopTurns; t++) {
    const r = await client.chat.completions.create({
      model, messages, tools, max_tokens: 128, temperature: 0,
    });
    const m = r.choices[0].message;
    turns.push({
      prompt_tokens: r.usage.prompt_tokens,
      cached_tokens: r.usage.prompt_tokens_details?.cached_tokens ?? 0,
      tool_calls: (m.tool_calls ?? []).length,
    });
    messages.push({
      role: 'assistant', content: m.content, tool_calls: m.tool_calls,
      reasoning_content: m.reasoning_content,
    });
    if (m.tool_calls && m.tool_calls.length > 0) {
      for (const c of m.tool_calls) {
        messages.push({ role: 'tool', tool_call_id: c.id, content: executeTool(c.function.name, c.function.arguments) });
      }
    } else {
      messages.push(user(question(q++)));
    }
  }
  return { turns };
});

// /tokenize counts what a generate request's usage reports.
out.tokenize = await guard(async () => {
  const body = { model, messages: [user(question(2))], tools };
  const t = await (await fetch(`${baseURL}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  })).json();
  const r = await client.chat.completions.create({ ...body, max_tokens: 1, temperature: 0 });
  const d = await (await fetch(`${baseURL}/detokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, tokens: t.tokens }),
  })).json();
  return { count: t.count, max_model_len: t.max_model_len, prompt_tokens: r.usage.prompt_tokens, detokenized_chars: d.prompt.length };
});

// n = 3: sampled (seed 5: choice i samples with seed 5 + i), greedy (three
// equal choices), and streamed through the SDK's stream helper, which
// assembles the choices by index. The router's token counters show the
// followers' prefill: a fresh prompt's choices 1 and 2 reuse its prefix.
async function routerCounter(name) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(' ').pop());
  }
  return sum;
}
// Sampled choices are compared with MTP off (speculative_tokens 0): the
// adaptive draft length follows measured step times, so how many random
// draws a seeded MTP stream takes can differ between runs. Thinking off, so
// the text is in content (the SDK's stream helper keeps only the last
// reasoning_content delta).
out.n3 = await guard(async () => {
  const sampled = { model, messages: [user('And God said')], max_tokens: 12, temperature: 1,
    speculative_tokens: 0, chat_template_kwargs: { enable_thinking: false } };
  const r = await client.chat.completions.create({ ...sampled, n: 3, seed: 5 });
  const again = await client.chat.completions.create({ ...sampled, n: 3, seed: 5 });
  const one = await client.chat.completions.create({ ...sampled, seed: 6 });
  const longText = Array.from({ length: 60 }, (_, i) => `verse ${i} of the long prompt`).join('; ');
  const before = { prompt: await routerCounter('swaserve_router_prompt_tokens_total'),
    cached: await routerCounter('swaserve_router_cached_tokens_total') };
  const greedy = await client.chat.completions.create({
    model, messages: [user(longText)], n: 3, max_tokens: 10, temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  const after = { prompt: await routerCounter('swaserve_router_prompt_tokens_total'),
    cached: await routerCounter('swaserve_router_cached_tokens_total') };
  const stream = client.chat.completions.stream({
    ...sampled, n: 3, seed: 5, stream_options: { include_usage: true },
  });
  const indexes = new Set();
  stream.on('chunk', (c) => { for (const ch of c.choices) indexes.add(ch.index); });
  const final = await stream.finalChatCompletion();
  const content = (resp) => resp.choices.map((c) => ({ index: c.index, content: c.message.content,
    finish_reason: c.finish_reason }));
  return {
    choices: content(r), again: content(again), usage: r.usage,
    choice1_alone: one.choices[0].message.content,
    greedy: content(greedy), greedy_usage: greedy.usage,
    counters: { prompt: after.prompt - before.prompt, cached: after.cached - before.cached },
    streamed: content(final), streamed_usage: final.usage, streamed_indexes: [...indexes].sort(),
  };
});

out.logit_bias = await guard(async () => {
  const r = await client.chat.completions.create({
    model, messages: [user('And God said')], max_tokens: 8, temperature: 0,
    chat_template_kwargs: { enable_thinking: false }, logit_bias: { 100: 100 }, logprobs: true,
  });
  return { tokens: r.choices[0].logprobs.content.map((t) => t.token) };
});

// Errors: each a 400 the client surfaces as BadRequestError.
const bad = {
  unknown_tool_choice: { tools, tool_choice: { type: 'function', function: { name: 'nosuch' } } },
  bad_tool: { tools: [{ type: 'function', function: { name: 'has space' } }] },
  required_without_tools: { tool_choice: 'required' },
  unknown_field: { frobnicate: true },
};
out.errors = {};
for (const [name, extra] of Object.entries(bad)) {
  out.errors[name] = await guard(async () => {
    await client.chat.completions.create({ model, messages: [user('hi')], max_tokens: 4, ...extra });
    return { status: 200 };
  });
}

// The chat API's split of an output is the parse of the raw text: the same
// prompt's token ids (from /tokenize) through /v1/completions, greedy, give
// the text the model wrote; the chat response, streamed (deltas joined here)
// and not, must hold exactly that text in reasoning, content and calls.
async function rawAndSplit(messages, extra) {
  const body = { model, messages, tools, ...extra };
  const t = await (await fetch(`${baseURL}/tokenize`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, messages, tools, chat_template_kwargs: extra.chat_template_kwargs }),
  })).json();
  const raw = await client.completions.create({
    model, prompt: t.tokens, max_tokens: 96, temperature: 0,
  });
  const whole = await client.chat.completions.create({ ...body, max_tokens: 96, temperature: 0 });
  const stream = await client.chat.completions.create({
    ...body, max_tokens: 96, temperature: 0, stream: true,
  });
  const joined = { reasoning: '', content: '', calls: {} };
  for await (const c of stream) {
    const d = c.choices[0]?.delta ?? {};
    joined.reasoning += d.reasoning_content ?? '';
    joined.content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) {
      const e = (joined.calls[tc.index] ??= { id: '', name: '', arguments: '' });
      e.id += tc.id ?? '';
      e.name += tc.function?.name ?? '';
      e.arguments += tc.function?.arguments ?? '';
    }
  }
  const m = whole.choices[0].message;
  return {
    raw: raw.choices[0].text,
    opens_reasoning: extra.chat_template_kwargs?.enable_thinking !== false,
    whole: { reasoning: m.reasoning_content ?? '', content: m.content ?? '', calls: m.tool_calls ?? [] },
    streamed: { ...joined, calls: Object.values(joined.calls) },
  };
}
out.split = [];
for (const [i, thinking] of [[0, true], [1, false], [2, true], [3, false], [4, true]]) {
  out.split.push(await guard(() =>
    rawAndSplit([user(question(i))], { chat_template_kwargs: { enable_thinking: thinking } })));
}

out.tool_names = toolNames;
process.stdout.write(JSON.stringify(out));

// The OpenAI Agents SDK (@openai/agents) running an agent with three tools
// to its final answer against a swaserve router (Chat Completions API):
// run by tests/e2e/agent_e2e_test.cc.
//
//   node agents_sdk.mjs <router base URL> <model>
//
// Prints {"final_output", "calls": [{name, arguments}], "usage": [per model
// response {input_tokens, cached_tokens, output_tokens, reasoning_tokens}],
// "streamed": {...the same for a streamed run}} or {"error"}.
import { z } from 'zod';
import {
  Agent, run, tool, setDefaultOpenAIKey, setOpenAIAPI, setTracingDisabled,
} from '@openai/agents';

const [baseURL, model] = process.argv.slice(2);
process.env.OPENAI_BASE_URL = `${baseURL}/v1`;
setDefaultOpenAIKey('unused');
setOpenAIAPI('chat_completions');
setTracingDisabled(true);

const calls = [];
const record = (name, fn) => async (args) => {
  calls.push({ name, arguments: args });
  return fn(args);
};

const tools = [
  tool({
    name: 'add',
    description: 'Add two integers.',
    parameters: z.object({ a: z.number().int(), b: z.number().int() }),
    execute: record('add', ({ a, b }) => String(a + b)),
  }),
  tool({
    name: 'multiply',
    description: 'Multiply two integers.',
    parameters: z.object({ a: z.number().int(), b: z.number().int() }),
    execute: record('multiply', ({ a, b }) => String(a * b)),
  }),
  tool({
    name: 'days_between',
    description: 'Days from one ISO date (YYYY-MM-DD) to another.',
    parameters: z.object({ start: z.string(), end: z.string() }),
    execute: record('days_between', ({ start, end }) =>
      String(Math.round((Date.parse(`${end}T00:00:00Z`) - Date.parse(`${start}T00:00:00Z`)) / 86400000))),
  }),
];

const agent = new Agent({
  name: 'calculator',
  instructions: 'Use the tools to answer.',
  model,
  tools,
  modelSettings: { temperature: 0, maxTokens: 128 },
});

function usageOf(result) {
  return result.rawResponses.map((r) => ({
    input_tokens: r.usage.inputTokens,
    cached_tokens: r.usage.inputTokensDetails?.[0]?.cached_tokens ?? 0,
    output_tokens: r.usage.outputTokens,
    reasoning_tokens: r.usage.outputTokensDetails?.[0]?.reasoning_tokens ?? 0,
  }));
}

try {
  const prompt = process.argv[4] ?? 'What is 12 plus 30?';
  const result = await run(agent, prompt, { maxTurns: 6 });
  const out = { final_output: result.finalOutput, calls: [...calls], usage: usageOf(result) };
  calls.length = 0;
  const streamed = await run(agent, prompt, { maxTurns: 6, stream: true });
  for await (const _ of streamed) { /* drain the events */ }
  await streamed.completed;
  out.streamed = { final_output: streamed.finalOutput, calls: [...calls], usage: usageOf(streamed) };
  process.stdout.write(JSON.stringify(out));
} catch (e) {
  process.stdout.write(JSON.stringify({ error: String(e.stack ?? e) }));
}

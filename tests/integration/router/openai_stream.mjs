// The official OpenAI npm client streaming a completion from a swaserve
// router: run by tests/integration/router/router_test.cc
// (ALongFirstTokenWaitKeepsTheStreamAliveWithComments) against a router whose
// SSE keep-alive comments come before the first token.
//
//   node openai_stream.mjs <router base URL> <model> <prompt token ids JSON>
//
// Prints {"text", "chunks", "finish_reason", "usage"} or {"error"}.
import OpenAI from 'openai';

const [baseURL, model, ids] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
try {
  const stream = await client.completions.create({
    model, prompt: JSON.parse(ids), max_tokens: 4, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', chunks = 0, finish = null, usage = null;
  for await (const c of stream) {
    if (c.choices.length > 0) {
      ++chunks;
      text += c.choices[0].text;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    if (c.usage) usage = c.usage;
  }
  console.log(JSON.stringify({ text, chunks, finish_reason: finish, usage }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e) }));
}

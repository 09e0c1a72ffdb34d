// The official OpenAI npm client asking a swaserve router for a NON-streamed
// completion with a short timeout: run by
// tests/integration/router/router_test.cc
// (ALongNonStreamedRequestGetsItsHeadersAndWhitespaceFirst). The package's
// timeout runs until the response headers arrive (then the body is read
// without one), so a router that sends its 200 and whitespace before a long
// answer's JSON keeps the request alive, and one that does not loses it.
//
//   node openai_complete.mjs <router base URL> <model> <prompt token ids JSON> \
//       <max_tokens> <timeout ms>
//
// Prints {"text", "finish_reason", "usage"} or {"error"}.
import OpenAI from 'openai';

const [baseURL, model, ids, maxTokens, timeoutMs] = process.argv.slice(2);
const client = new OpenAI({
  baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: Number(timeoutMs),
});
try {
  const c = await client.completions.create({
    model, prompt: JSON.parse(ids), max_tokens: Number(maxTokens), temperature: 0,
    ignore_eos: true,
  });
  console.log(JSON.stringify({
    text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage,
  }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e) }));
}

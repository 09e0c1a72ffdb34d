// One NON-streamed completion through the official openai npm client with its
// default timeouts (10 min until the response headers; Node's fetch gives up
// after 300 s without them), for bench/cluster/long_nonstream.sh; with a
// timeout (ms), the client's own per-attempt timeout instead
// (bench/cluster/client_timeout.sh).
//
//   node bench/cluster/openai_nonstream.mjs <base URL without /v1> <prompt file> <max_retries> [timeout_ms]
//
// Prints {"seconds", "prompt_tokens", "completion_tokens", "text"} or
// {"seconds", "error"}.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [baseURL, promptFile, maxRetries, timeoutMs] = process.argv.slice(2);
const client = new OpenAI({
  baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: Number(maxRetries),
  ...(timeoutMs ? { timeout: Number(timeoutMs) } : {}),
});
const t0 = Date.now();
const seconds = () => Number(((Date.now() - t0) / 1000).toFixed(1));
try {
  const c = await client.completions.create({
    model: 'demo', prompt: readFileSync(promptFile, 'utf8'), max_tokens: 8, temperature: 0,
  });
  console.log(JSON.stringify({
    seconds: seconds(), prompt_tokens: c.usage.prompt_tokens,
    completion_tokens: c.usage.completion_tokens, text: c.choices[0].text,
  }));
} catch (e) {
  const cause = e.cause ? ` (cause: ${e.cause.code ?? e.cause.name ?? e.cause})` : '';
  console.log(JSON.stringify({ seconds: seconds(), error: `${e}${cause}` }));
}

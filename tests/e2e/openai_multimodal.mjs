// The official OpenAI npm client against a swaserve router with multimodal
// content parts: run by tests/e2e/multimodal_e2e_test.cc.
//
//   node openai_multimodal.mjs <router base URL> <model> <inputs.json>
//
// inputs.json: {"png": base64, "png_b": base64, "wav": base64,
//               "video": base64, "video_mime": "...", "http_png": URL}
// Prints one JSON object: {"<case>": {"text", "usage", "finish_reason"}, ...}
// or {"error": ...}; a non-2xx answer is recorded as {"status", "error"}.
import fs from 'node:fs';
import OpenAI from 'openai';

const [baseURL, model, inputsPath] = process.argv.slice(2);
const inputs = JSON.parse(fs.readFileSync(inputsPath, 'utf8'));
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });

const text = (t) => ({ type: 'text', text: t });
const image = (url) => ({ type: 'image_url', image_url: { url } });
const png = (b64) => image(`data:image/png;base64,${b64}`);

const cases = {
  image: [text('Describe this picture:'), png(inputs.png)],
  image_b: [text('Describe this picture:'), png(inputs.png_b)],
  text_only: [text('Describe this picture:')],
  audio: [text('Transcribe:'), { type: 'input_audio', input_audio: { data: inputs.wav, format: 'wav' } }],
  video: [
    text('What happens in this video?'),
    { type: 'video_url', video_url: { url: `data:${inputs.video_mime};base64,${inputs.video}` } },
  ],
  http_image: [text('Describe this picture:'), image(inputs.http_png)],
  two_images: [png(inputs.png), text('and'), png(inputs.png_b), text('differ how?')],
};

async function run(name, content) {
  try {
    if (name === 'video') {
      // Streamed, with usage in the last chunk.
      const stream = await client.chat.completions.create({
        model, messages: [{ role: 'user', content }], max_tokens: 8, temperature: 0,
        stream: true, stream_options: { include_usage: true },
      });
      let out = '';
      let usage = null;
      let finish = null;
      for await (const chunk of stream) {
        if (chunk.choices.length > 0) {
          out += chunk.choices[0].delta.content ?? '';
          finish = chunk.choices[0].finish_reason ?? finish;
        }
        if (chunk.usage) usage = chunk.usage;
      }
      return { text: out, usage, finish_reason: finish };
    }
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content }], max_tokens: 8, temperature: 0,
    });
    return { text: r.choices[0].message.content, usage: r.usage, finish_reason: r.choices[0].finish_reason };
  } catch (e) {
    return { status: e.status ?? 0, error: String(e.message ?? e) };
  }
}

const out = {};
for (const [name, content] of Object.entries(cases)) out[name] = await run(name, content);
// Bad input: a PNG that is not one, and a WAV in another format.
out.corrupt_image = await run('corrupt_image', [png(Buffer.from('not an image at all').toString('base64'))]);
out.mp3 = await run('mp3', [{ type: 'input_audio', input_audio: { data: inputs.wav, format: 'mp3' } }]);
process.stdout.write(JSON.stringify(out));

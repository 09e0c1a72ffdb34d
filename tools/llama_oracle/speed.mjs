// llama.cpp's speed on a GGUF file through node-llama-cpp's prebuilt CPU
// library (never built or downloaded): prefill tokens/s for each prompt
// length (one prompt, evaluated in batches of --batch tokens) and decode
// tokens/s at batch 1 (greedy steps after the prompt), with N threads.
//
//   node tools/llama_oracle/speed.mjs MODEL.gguf THREADS PROMPTS DECODE [BATCH]
//     PROMPTS: comma-separated prompt lengths, e.g. 512,4096
//     DECODE: decode steps timed after the first prompt
// Prints one JSON object per measurement on stdout:
//   {"what": "prefill", "tokens": 512, "seconds": s, "tokens_per_s": r}
//   {"what": "decode", "context": 512, "steps": n, "seconds": s, "tokens_per_s": r}
// Token ids are fixed pseudo-random ids below 4093. The KV cache is F16
// (llama.cpp's default); the process's peak RSS is printed last.
import process from "node:process";
import fs from "node:fs";

const [modelPath, threadsArg, promptsArg, decodeArg, batchArg] = process.argv.slice(2);
if (!modelPath || !threadsArg || !promptsArg) {
    console.error("usage: speed.mjs MODEL.gguf THREADS PROMPTS DECODE [BATCH]");
    process.exit(2);
}
const threads = Number(threadsArg);
const prompts = promptsArg.split(",").map(Number);
const decodeSteps = Number(decodeArg ?? 64);
const batch = Number(batchArg ?? 512);

let nlc;
try {
    nlc = await import("node-llama-cpp");
} catch (err) {
    console.error(`node-llama-cpp is not installed (scripts/install-deps.sh installs it in tools/llama_oracle): ${err.message}`);
    process.exit(3);
}
const llama = await nlc.getLlama({gpu: false, build: "never", skipDownload: true,
                                  logLevel: nlc.LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});

function tokens(n, seed) {
    const out = [];
    let x = BigInt(seed);
    for (let i = 0; i < n; i++) {
        x = (x * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
        out.push(Number((x >> 33n) % 4093n));
    }
    return out;
}

for (const [i, n] of prompts.entries()) {
    const context = await model.createContext({contextSize: n + decodeSteps + 64, batchSize: batch,
                                               threads, sequences: 1});
    const seq = context.getSequence();
    const t0 = performance.now();
    const input = tokens(n, i + 1);
    input[n - 1] = [input[n - 1], {generateNext: {token: true}}];
    const out = await seq.controlledEvaluate(input);
    const t1 = performance.now();
    console.log(JSON.stringify({what: "prefill", tokens: n, seconds: (t1 - t0) / 1000,
                                tokens_per_s: n / ((t1 - t0) / 1000)}));
    if (i === 0 && decodeSteps > 0) {
        let tok = out[n - 1].next.token;
        const d0 = performance.now();
        for (let s = 0; s < decodeSteps; s++) {
            const step = await seq.controlledEvaluate([[tok, {generateNext: {token: true}}]]);
            tok = step[0].next.token;
        }
        const d1 = performance.now();
        console.log(JSON.stringify({what: "decode", context: n, steps: decodeSteps,
                                    seconds: (d1 - d0) / 1000,
                                    tokens_per_s: decodeSteps / ((d1 - d0) / 1000)}));
    }
    await context.dispose();
}
const status = fs.readFileSync("/proc/self/status", "utf8");
console.log(JSON.stringify({what: "peak_rss_mib",
                            value: Number(/VmHWM:\s+(\d+)/.exec(status)[1]) / 1024}));
await model.dispose();
await llama.dispose();

// llama.cpp (through the npm package node-llama-cpp's prebuilt CPU library) as
// an independent oracle of the engine: loads a GGUF file written by
// `swaserve export-gguf`, evaluates token prompts and writes the raw logits
// at the requested positions and a greedy continuation of each prompt.
//
//   node tools/llama_oracle/oracle.mjs REQUEST.json RESULT.json
//
// REQUEST: {"model": "x.gguf", "threads": 2, "context": 4096, "batch": 512,
//           "kv_type": "F32", "prompts": [{"name": "short", "tokens": [ids],
//           "positions": [i, ...], "generate": 128}]}
//   positions: indices into tokens whose next-token logits are returned.
//   generate: greedy tokens after the prompt (argmax of the raw logits, the
//   lowest id on a tie); each step's two largest logits are returned too.
//   batch (per prompt, optional): llama.cpp's batch size for that prompt.
//   texts (optional): strings tokenized by llama.cpp's tokenizer from the
//   GGUF vocabulary (special tokens parsed), returned as "tokenized".
// RESULT: {"llama_cpp": {"package": version, "release": tag}, "tokenized": [[ids]],
//          "prompts": [{"name", "logits": [[vocab floats] per position],
//                       "greedy": [ids], "greedy_top2": [[l1, l2] per step]}]}
// Exit status 3 with a message when node-llama-cpp cannot be loaded.
import fs from "node:fs";
import path from "node:path";
import {createRequire} from "node:module";

const [requestPath, resultPath] = process.argv.slice(2);
if (!requestPath || !resultPath) {
    console.error("usage: oracle.mjs REQUEST.json RESULT.json");
    process.exit(2);
}
const request = JSON.parse(fs.readFileSync(requestPath, "utf8"));

let nlc;
try {
    nlc = await import("node-llama-cpp");
} catch (err) {
    console.error(`node-llama-cpp is not installed (scripts/install-deps.sh installs it in tools/llama_oracle): ${err.message}`);
    process.exit(3);
}
const require = createRequire(import.meta.url);
let pkgDir = path.dirname(require.resolve("node-llama-cpp"));
while (!fs.existsSync(path.join(pkgDir, "llama", "binariesGithubRelease.json"))) pkgDir = path.dirname(pkgDir);
const pkgVersion = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;
const release = JSON.parse(fs.readFileSync(path.join(pkgDir, "llama", "binariesGithubRelease.json"), "utf8")).release;

// Never build or download: the prebuilt CPU binaries or nothing.
const llama = await nlc.getLlama({gpu: false, build: "never", skipDownload: true,
                                  logLevel: nlc.LlamaLogLevel.warn});
const model = await llama.loadModel({modelPath: request.model, gpuLayers: 0});

function dense(map, n) {
    const out = new Array(n).fill(null);
    for (const [tok, v] of map) out[tok] = v;
    return out;
}
function argmax(arr) {
    let best = 0;
    for (let i = 1; i < arr.length; i++) if (arr[i] > arr[best]) best = i;
    return best;
}
function top2(arr) {
    const best = argmax(arr);
    let second = -Infinity;
    for (let i = 0; i < arr.length; i++) if (i !== best && arr[i] > second) second = arr[i];
    return [arr[best], second];
}

const nVocab = request.vocab;
const results = [];
for (const p of request.prompts) {
    // A fresh context per prompt: nothing is shared between prompts.
    const context = await model.createContext({
        contextSize: request.context, batchSize: p.batch ?? request.batch ?? 512,
        flashAttention: false,
        threads: request.threads ?? 2, sequences: 1,
        experimentalKvCacheKeyType: request.kv_type ?? "F32",
        experimentalKvCacheValueType: request.kv_type ?? "F32",
        swaFullCache: false,
    });
    const seq = context.getSequence();
    const want = new Set(p.positions ?? []);
    want.add(p.tokens.length - 1);
    const input = p.tokens.map((t, i) => want.has(i) ? [t, {generateNext: {logits: true}}] : t);
    const out = await seq.controlledEvaluate(input);
    const logits = [];
    for (const i of (p.positions ?? [])) logits.push(dense(out[i].next.logits, nVocab));
    let last = dense(out[p.tokens.length - 1].next.logits, nVocab);
    const greedy = [], greedyTop2 = [];
    for (let s = 0; s < (p.generate ?? 0); s++) {
        const tok = argmax(last);
        greedy.push(tok);
        greedyTop2.push(top2(last));
        if (s + 1 === p.generate) break;
        const step = await seq.controlledEvaluate([[tok, {generateNext: {logits: true}}]]);
        last = dense(step[0].next.logits, nVocab);
    }
    results.push({name: p.name, logits, greedy, greedy_top2: greedyTop2});
    await context.dispose();
}
const tokenized = (request.texts ?? []).map((t) => Array.from(model.tokenize(t, true)));
fs.writeFileSync(resultPath, JSON.stringify({llama_cpp: {package: pkgVersion, release},
                                              prompts: results, tokenized}));
await model.dispose();
await llama.dispose();

// Independent validator for lib/grammar's tests: ajv (JSON Schema 2020-12,
// ajv-formats in its "full" mode) checks outputs of the grammar engine.
//
//   node tools/grammar_validate/validate.mjs IN.json OUT.json
//
// IN.json:  [{"schema": <JSON Schema or null for any JSON object>,
//             "instance": "<the generated text>"}, ...]
// OUT.json: [{"parsed": bool, "valid": bool, "error": "<why not>"}, ...]
// in the same order. Exit status 0 unless the files cannot be read/written
// or a schema does not compile in ajv (status 2, message on stderr).
import { readFileSync, writeFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const [inPath, outPath] = process.argv.slice(2);
if (!inPath || !outPath) {
  console.error("usage: validate.mjs IN.json OUT.json");
  process.exit(2);
}
const ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: true });
addFormats(ajv);
const compiled = new Map();
const results = [];
for (const { schema, instance } of JSON.parse(readFileSync(inPath, "utf8"))) {
  const effective = schema ?? { type: "object" };
  const key = JSON.stringify(effective);
  let validate = compiled.get(key);
  if (!validate) {
    try {
      validate = ajv.compile(effective);
    } catch (e) {
      console.error(`ajv cannot compile ${key}: ${e.message}`);
      process.exit(2);
    }
    compiled.set(key, validate);
  }
  let value;
  try {
    value = JSON.parse(instance);
  } catch (e) {
    results.push({ parsed: false, valid: false, error: e.message });
    continue;
  }
  const valid = validate(value);
  results.push({ parsed: true, valid, error: valid ? "" : ajv.errorsText(validate.errors) });
}
writeFileSync(outPath, JSON.stringify(results));

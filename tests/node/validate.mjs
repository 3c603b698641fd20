// Validates racp-proto's sample frames against the generated JSON Schema with ajv, then
// type-checks the generated TypeScript declarations against the valid samples with tsc.
// Run by racp-proto/tests/node_schema.rs (and so by the README's test command).
import Ajv2020 from "ajv/dist/2020.js";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const schema = JSON.parse(readFileSync(join(root, "docs/schema/racp.v1.schema.json"), "utf8"));
const samples = JSON.parse(readFileSync(join(root, "racp-proto/tests/samples/frames.json"), "utf8"));

const ajv = new Ajv2020({ allErrors: true, strict: true });
for (const keyword of ["x-racp-methods", "x-racp-pushes", "x-racp-events"]) {
  ajv.addKeyword({ keyword, schemaType: "object" });
}
// schemars marks Rust integer widths with these formats; they are real bounds.
ajv.addFormat("uint32", { type: "number", validate: (n) => Number.isInteger(n) && n >= 0 && n <= 4294967295 });
ajv.addFormat("uint64", { type: "number", validate: (n) => Number.isInteger(n) && n >= 0 && n <= 18446744073709551615 });
ajv.addFormat("int64", { type: "number", validate: (n) => Number.isInteger(n) && n >= -9223372036854775808 && n <= 9223372036854775807 });
// An f64 (a cost, a percentage): any finite JSON number.
ajv.addFormat("double", { type: "number", validate: (n) => Number.isFinite(n) });
ajv.addSchema(schema);
const id = schema.$id;
const pointer = (text) => text.replaceAll("~", "~0").replaceAll("/", "~1");

function validatorFor(kind) {
  if (kind.startsWith("result:")) {
    return ajv.compile({ $ref: `${id}#/x-racp-methods/${pointer(kind.slice(7))}/result` });
  }
  const found = ajv.getSchema(`${id}#/$defs/${kind}`);
  if (!found) throw new Error(`no schema for ${kind}`);
  return found;
}

let passed = 0;
const failures = [];
for (const sample of samples) {
  const validate = validatorFor(sample.schema);
  const ok = validate(sample.frame);
  if (ok === sample.valid) {
    passed++;
  } else {
    failures.push(`${sample.name}: expected valid=${sample.valid}, ajv said ${ok} ${JSON.stringify(validate.errors)}`);
  }
}

// Every valid sample must also type-check as the declared TypeScript type.
const typeOf = (kind) =>
  kind.startsWith("result:") ? `RacpMethods[${JSON.stringify(kind.slice(7))}]["result"]` : kind;
const dir = mkdtempSync(join(tmpdir(), "racp-ts-"));
try {
  const lines = [`import type { RacpMethods, ClientFrame, HostFrame } from ${JSON.stringify(join(root, "clients/ts/racp.ts").replace(/\.ts$/, ".js"))};`];
  let checked = 0;
  samples.forEach((sample, i) => {
    if (!sample.valid || sample.tsSkip) return;
    lines.push(`// ${sample.name}`);
    lines.push(`export const sample${i}: ${typeOf(sample.schema)} = ${JSON.stringify(sample.frame)};`);
    checked++;
  });
  writeFileSync(join(dir, "samples.ts"), lines.join("\n") + "\n");
  const tsc = join(here, "node_modules", "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "--noEmit", "--strict", "--target", "es2022", "--module", "nodenext",
      "--moduleResolution", "nodenext", "--allowImportingTsExtensions", "false", "--rewriteRelativeImportExtensions", "false",
      join(dir, "samples.ts"), join(root, "clients/ts/racp.ts")], { stdio: "pipe" });
    passed++;
  } catch (err) {
    failures.push(`tsc rejected the declarations or a valid sample (${checked} samples):\n${err.stdout}${err.stderr}`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

for (const failure of failures) console.error(`FAIL ${failure}`);
console.log(`${passed} passed, ${failures.length} failed`);
process.exit(failures.length === 0 ? 0 : 1);

// Checks AG-UI run inputs and events against the official schemas of @ag-ui/core (the
// package's `schemas` entry, zod): `node validate.cjs input|events FILE`, one JSON value a
// line. Prints each one that does not parse, with why, and exits 1 if any; NODE_PATH names
// the node_modules that holds @ag-ui/core and zod (.ci/run installs them).
"use strict";
const fs = require("fs");
const { EventSchemas, RunAgentInputSchema } = require("@ag-ui/core/schemas");

const [kind, file] = process.argv.slice(2);
const schema = kind === "input" ? RunAgentInputSchema : EventSchemas;
const items = fs.readFileSync(file, "utf8").split("\n").filter(Boolean).map((line) => JSON.parse(line));
let bad = 0;
items.forEach((item, index) => {
  const parsed = schema.safeParse(item);
  if (!parsed.success) {
    bad += 1;
    console.error(`#${index} ${item.type || kind}: ${JSON.stringify(parsed.error.issues)}`);
  }
});
console.log(`${items.length - bad} of ${items.length} ${kind} valid`);
process.exit(bad ? 1 : 0);

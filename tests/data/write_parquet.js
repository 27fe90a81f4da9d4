// Writes Parquet files with arrow-rs's writer (the npm package parquet-wasm, fetched by
// scripts/fetch_assets.sh with apache-arrow to build its tables): the files tests/data/parquet_test.cpp
// reads, so titan's reader is checked against a real, widely used writer, never one of its own.
//
//   node write_parquet.js NODE_MODULES SPEC.json
//
// SPEC.json is an array of files: {"out": path, "columns": {name: column}, "compression", "version"
// ("1" or "2"), "dictionary" (bool), "encoding" (a parquet-wasm Encoding name, applied to the string
// columns when dictionary is off), "page_bytes", "row_group_rows", "dictionary_page_bytes"}. A
// column is {"type": T, "values": [...]} with T "utf8", "int64", {"list": T} or {"struct": {field:
// T, ...}} (lists and structs nest; null is a missing value).
const path = require("path");
const fs = require("fs");
const [modules, specPath] = process.argv.slice(2);
const arrow = require(path.join(modules, "apache-arrow"));
const pw = require(path.join(modules, "parquet-wasm", "node", "parquet_wasm.js"));

// A column's Arrow type from its descriptor: "utf8", "int64", {"list": T} or {"struct": {field: T}}.
function arrowType(t) {
  if (t === "utf8") return new arrow.Utf8();
  if (t === "int64") return new arrow.Int64();
  if (t.list) return new arrow.List(new arrow.Field("item", arrowType(t.list), true));
  if (t.struct) return new arrow.Struct(Object.entries(t.struct).map(([n, c]) => new arrow.Field(n, arrowType(c), true)));
  throw new Error(`unknown column type ${JSON.stringify(t)}`);
}

function vector(column) {
  const values = column.type === "int64" ? column.values.map((v) => (v === null ? null : BigInt(v))) : column.values;
  return arrow.vectorFromArray(values, arrowType(column.type));
}

for (const file of JSON.parse(fs.readFileSync(specPath, "utf8"))) {
  const vectors = {};
  for (const [name, column] of Object.entries(file.columns)) vectors[name] = vector(column);
  const table = new arrow.Table(vectors);
  let props = new pw.WriterPropertiesBuilder()
    .setCompression(pw.Compression[file.compression || "UNCOMPRESSED"])
    .setWriterVersion(file.version === "2" ? pw.WriterVersion.V2 : pw.WriterVersion.V1)
    .setDictionaryEnabled(file.dictionary !== false);
  if (file.encoding)
    for (const [name, column] of Object.entries(file.columns))
      if (column.type === "utf8") props = props.setColumnEncoding(name, pw.Encoding[file.encoding]);
  if (file.page_bytes) props = props.setDataPageSizeLimit(file.page_bytes).setWriteBatchSize(64);
  if (file.row_group_rows) props = props.setMaxRowGroupSize(file.row_group_rows);
  if (file.dictionary_page_bytes) props = props.setDictionaryPageSizeLimit(file.dictionary_page_bytes);
  const bytes = pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(table, "stream")), props.build());
  fs.mkdirSync(path.dirname(file.out), { recursive: true });
  fs.writeFileSync(file.out, bytes);
}

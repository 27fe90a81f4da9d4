// Writes the table files tests/data/table_files_test.cpp reads: Parquet with arrow-rs's writer (the
// npm package parquet-wasm), Arrow IPC with Apache Arrow's JavaScript writer (apache-arrow), both
// fetched by scripts/fetch_assets.sh. titan's readers are checked against real, widely used writers,
// never one of their own.
//
//   node write_table.js NODE_MODULES SPEC.json
//
// SPEC.json is an array of files: {"out": path, "columns": {name: column}, "format" ("parquet", the
// default, or "arrow_stream" / "arrow_file": Arrow IPC, what `datasets`' save_to_disk writes, in
// record batches of "batch_rows"), and for Parquet "compression", "version"
// ("1" or "2"), "dictionary" (bool), "encoding" (a parquet-wasm Encoding name, applied to the string
// columns when dictionary is off), "page_bytes", "row_group_rows", "dictionary_page_bytes"}. A
// column is {"type": T, "values": [...]} with T "utf8", "large_utf8", "int64", "float64", "bool",
// "null", "dictionary_utf8",
// {"list": T} or {"struct": {field: T, ...}} (lists and structs nest; null is a missing value).
const path = require("path");
const fs = require("fs");
const [modules, specPath] = process.argv.slice(2);
const arrow = require(path.join(modules, "apache-arrow"));
const pw = require(path.join(modules, "parquet-wasm", "node", "parquet_wasm.js"));

// A column's Arrow type from its descriptor: "utf8", "int64", {"list": T} or {"struct": {field: T}}.
function arrowType(t) {
  if (t === "utf8") return new arrow.Utf8();
  if (t === "large_utf8") return new arrow.LargeUtf8();
  if (t === "dictionary_utf8") return new arrow.Dictionary(new arrow.Utf8(), new arrow.Int32());
  if (t === "int64") return new arrow.Int64();
  if (t === "float64") return new arrow.Float64();
  if (t === "bool") return new arrow.Bool();
  if (t === "null") return new arrow.Null();
  if (t.list) return new arrow.List(new arrow.Field("item", arrowType(t.list), true));
  if (t.struct) return new arrow.Struct(Object.entries(t.struct).map(([n, c]) => new arrow.Field(n, arrowType(c), true)));
  throw new Error(`unknown column type ${JSON.stringify(t)}`);
}

function vector(column) {
  // Int64 values are BigInts, nested ones too.
  const big = (t, v) => {
    if (v === null || v === undefined) return v;
    if (t === "int64") return BigInt(v);
    if (t.list) return v.map((x) => big(t.list, x));
    if (t.struct) return Object.fromEntries(Object.entries(t.struct).map(([n, c]) => [n, big(c, v[n])]));
    return v;
  };
  const values = column.values.map((v) => big(column.type, v));
  return arrow.vectorFromArray(values, arrowType(column.type));
}

for (const file of JSON.parse(fs.readFileSync(specPath, "utf8"))) {
  const rows = Object.values(file.columns)[0].values.length;
  const tableOf = (begin, end) => {
    const vectors = {};
    for (const [name, column] of Object.entries(file.columns))
      vectors[name] = vector({ type: column.type, values: column.values.slice(begin, end) });
    return new arrow.Table(vectors);
  };
  fs.mkdirSync(path.dirname(file.out), { recursive: true });
  if (file.format === "arrow_stream" || file.format === "arrow_file") {
    let table = tableOf(0, Math.min(rows, file.batch_rows || rows));
    for (let begin = file.batch_rows || rows; begin < rows; begin += file.batch_rows)
      table = table.concat(tableOf(begin, Math.min(rows, begin + file.batch_rows)));
    fs.writeFileSync(file.out, arrow.tableToIPC(table, file.format === "arrow_file" ? "file" : "stream"));
    continue;
  }
  const table = tableOf(0, rows);
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
  fs.writeFileSync(file.out, bytes);
}

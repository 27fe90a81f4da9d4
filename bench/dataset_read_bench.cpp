// Document read throughput of the dataset formats on the default corpus (99,000 documents, 9.9 MB
// of text): its JSON Lines file as fetched, and the same texts as Parquet written by arrow-rs
// (tests/data/write_table.js, run with node once per program into build/bench_tmp) in the
// codecs Hugging Face datasets use. Bytes/s counts the documents' text. For comparison, the
// tokenizer encodes some MB/s per core (tokenizer_bench): reading is never the loader's limit.
//   build/bin/dataset_read_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "titan/data/assets.h"
#include "titan/data/dataset.h"

namespace {
namespace fs = std::filesystem;
using titan::data::DatasetConfig;
using titan::data::Document;
using titan::data::DocumentStream;

const fs::path& jsonl() {
  static const fs::path path = titan::data::default_dataset_path() / "train.jsonl";
  return path;
}

// The corpus as Parquet, one file per codec, written once.
fs::path parquet(const std::string& codec) {
  static const fs::path dir = [] {
    const fs::path out = fs::absolute("bench_tmp/dataset_read");
    fs::create_directories(out);
    nlohmann::json texts = nlohmann::json::array();
    std::ifstream f(jsonl());
    for (std::string line; std::getline(f, line);) texts.push_back(nlohmann::json::parse(line)["text"]);
    nlohmann::json spec = nlohmann::json::array();
    for (const char* c : {"SNAPPY", "ZSTD", "UNCOMPRESSED"})
      spec.push_back({{"out", (out / (std::string(c) + ".parquet")).string()},
                      {"columns", {{"text", {{"type", "utf8"}, {"values", texts}}}}},
                      {"compression", c},
                      {"version", "1"}});
    std::ofstream(out / "spec.json") << spec.dump();
    const fs::path modules = titan::data::default_dataset_path().parent_path().parent_path() / "packages" /
                             "parquet-writer" / "node_modules";
    const fs::path script =
        fs::path(__FILE__).parent_path().parent_path() / "tests" / "data" / "write_table.js";
    const std::string cmd = "node " + script.string() + " " + modules.string() + " " + (out / "spec.json").string();
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("dataset_read_bench: " + cmd + " failed");
    return out;
  }();
  return dir / (codec + ".parquet");
}

void read_all(benchmark::State& state, const fs::path& file) {
  int64_t bytes = 0, docs = 0;
  for (auto _ : state) {
    DocumentStream stream(DatasetConfig{{file}});
    Document d;
    while (stream.next(d)) {
      bytes += int64_t(d.text.size());
      ++docs;
    }
  }
  state.SetBytesProcessed(bytes);
  state.counters["docs/s"] = benchmark::Counter(double(docs), benchmark::Counter::kIsRate);
}

void BM_JsonLines(benchmark::State& state) { read_all(state, jsonl()); }
void BM_ParquetSnappy(benchmark::State& state) { read_all(state, parquet("SNAPPY")); }
void BM_ParquetZstd(benchmark::State& state) { read_all(state, parquet("ZSTD")); }
void BM_ParquetUncompressed(benchmark::State& state) { read_all(state, parquet("UNCOMPRESSED")); }

BENCHMARK(BM_JsonLines)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParquetSnappy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParquetZstd)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParquetUncompressed)->Unit(benchmark::kMillisecond);

}  // namespace

// Encode throughput of the Qwen3 tokenizer on the default corpus (assets/, from
// scripts/setup.sh), on 1 and more threads, plus a 1 MB word without whitespace.
//   build/bin/tokenizer_bench
#include <benchmark/benchmark.h>

#include <ctime>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "titan/data/assets.h"
#include "titan/data/tokenizer.h"

namespace {

using titan::data::Tokenizer;

const Tokenizer& tokenizer() {
  static const Tokenizer tok = Tokenizer::load(titan::data::default_tokenizer_path());
  return tok;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> docs = [] {
    std::vector<std::string> out;
    std::ifstream f(titan::data::default_dataset_path() / "train.jsonl");
    for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line)["text"]);
    return out;
  }();
  return docs;
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Each iteration encodes the whole corpus once, its documents dealt round-robin to the
// threads (1 thread: the benchmark's own). Counters: MB/s over wall time (the scaling
// figure, meaningful on an idle machine) and MB/cpu-s over the process's CPU time (the
// per-core speed, robust to other load on a shared machine).
void BM_EncodeCorpus(benchmark::State& state) {
  const auto& docs = corpus();
  const Tokenizer& tok = tokenizer();
  const int threads = int(state.range(0));
  size_t bytes = 0, tokens = 0;
  for (auto& d : docs) bytes += d.size();
  auto work = [&](int t, size_t* count) {
    std::vector<int32_t> ids;
    for (size_t i = t; i < docs.size(); i += threads) {
      ids.clear();
      tok.encode_into(docs[i], ids);
      *count += ids.size();
    }
  };
  double cpu = 0;
  for (auto _ : state) {
    double cpu0 = process_cpu_seconds();
    std::vector<size_t> counts(threads);
    if (threads == 1) {
      work(0, &counts[0]);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(work, t, &counts[t]);
      for (auto& th : pool) th.join();
    }
    cpu += process_cpu_seconds() - cpu0;
    tokens = 0;
    for (auto c : counts) tokens += c;
  }
  double mb = double(bytes) / 1e6 * double(state.iterations());
  state.counters["MB/s"] = benchmark::Counter(mb, benchmark::Counter::kIsRate);
  state.counters["MB/cpu-s"] = mb / cpu;
  state.counters["tokens"] = double(tokens);
  state.counters["docs"] = double(docs.size());
}
BENCHMARK(BM_EncodeCorpus)->Arg(1)->Arg(2)->Arg(4)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_EncodeNoWhitespace(benchmark::State& state) {
  std::mt19937 rng(1);
  std::string doc(size_t(state.range(0)), 'a');
  for (auto& c : doc) c = char('a' + rng() % 26);
  double cpu0 = process_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer().encode(doc));
  state.counters["MB/cpu-s"] = double(doc.size()) / 1e6 * double(state.iterations()) / (process_cpu_seconds() - cpu0);
}
BENCHMARK(BM_EncodeNoWhitespace)->Arg(1 << 20)->Arg(4 << 20)->Iterations(2)->Unit(benchmark::kMillisecond);

}  // namespace

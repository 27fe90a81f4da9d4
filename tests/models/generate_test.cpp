// Generation (models/qwen3/generate): the next-token logits of the cached steps against
// transformers' logits (the oracles) and a full forward, greedy tokens against the oracle's argmax and
// against a full forward over the generated sequence, and the sampler's rules (ties, NaN, allowed ids, top-k,
// top-p, temperature, seeds) on hand-made logits.
#include "titan/models/qwen3/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "models/oracle_check.h"
#include "models/small_args.h"
#include "ops/op_test_util.h"
#include "ops/torch_ref/torch_ref.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"

namespace titan::qwen3 {
namespace {

using titan::testing::load_tensor;
using titan::testing::max_abs_diff;
using titan::testing::oracle_dir;

std::unique_ptr<Qwen3Model> oracle_model(const std::string& name) {
  return load_hf_model(oracle_dir(name), DType::F32);
}

int64_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

// Runs tests/models/torch_ref/<script> on `input` (written as in.json in a folder named `tag`) and
// returns the "cases" of the out.json it writes; a failing run throws with its output.
nlohmann::json torch_reference(const std::string& script, const nlohmann::json& input,
                               const std::string& tag) {
  const std::filesystem::path dir = titan::testing::temp_dir(tag);
  std::ofstream(dir / "in.json") << input.dump();
  const std::filesystem::path path = titan::testing::source_dir() / "tests" / "models" / "torch_ref" / script;
  std::string out;
  if (titan::testing::run_command(titan::testing::torch_python() + " " + path.string() + " " +
                                      (dir / "in.json").string() + " " + (dir / "out.json").string(),
                                  &out) != 0)
    throw std::runtime_error(script + " failed:\n" + out);
  return nlohmann::json::parse(std::ifstream(dir / "out.json"))["cases"];
}

// Every row of the oracle's input fed as a prompt of 3 tokens, then 4 at once, then one at a time
// over the KV cache: each call's logits (its last position's) equal transformers' logits at that
// position, within 1e-4; and one greedy token after a prefix is their argmax.
TEST(Generate, CachedStepsGiveTransformersLogitsAndGreedyTokens) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    auto model = oracle_model(name);
    auto ref = io::SafetensorsFile::open(oracle_dir(name) / "reference.safetensors");
    const Tensor ids = load_tensor(ref, "input_ids"), logits = load_tensor(ref, "logits");
    const int64_t B = ids.size(0), S = ids.size(1), V = logits.size(2);
    ASSERT_GT(S, 8) << name;
    int checked = 0;
    for (int64_t b = 0; b < B; ++b) {
      KVCache cache = model->kv_cache(1, S);
      for (int64_t at = 0; at < S;) {
        const int64_t n = at == 0 ? 3 : at == 3 ? 4 : 1;
        Tensor piece = Tensor::empty({1, n}, DType::I64);
        std::copy(ids.data<int64_t>() + b * S + at, ids.data<int64_t>() + b * S + at + n,
                  piece.data<int64_t>());
        const Tensor got = model->next_token_logits(piece, cache);
        at += n;
        ASSERT_EQ(got.shape(), (Shape{1, V}));
        ASSERT_EQ(cache.length(), at);
        const float* expected = logits.data<float>() + (b * S + at - 1) * V;
        double worst = 0;
        for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(double(got.data<float>()[v] - expected[v])));
        EXPECT_LE(worst, 1e-4) << name << " row " << b << " position " << at - 1;
        ++checked;
      }
      for (int64_t s : {int64_t(1), int64_t(2), int64_t(9), S}) {
        const std::vector<int64_t> prefix(ids.data<int64_t>() + b * S, ids.data<int64_t>() + b * S + s);
        const Generation g = generate(*model, prefix, 1, SamplingOptions{}, {});
        ASSERT_EQ(g.ids.size(), 1u);
        EXPECT_EQ(g.ids[0], argmax(logits.data<float>() + (b * S + s - 1) * V, V))
            << name << " row " << b << " prefix " << s;
      }
    }
    EXPECT_EQ(checked, B * (S - 5)) << name;
  }
}

// In f64 the cached steps are the full forward's rows to rounding: a prompt of 5, then 2, then
// single tokens, against forward_logits over the whole sequence (dense and MoE, whose router sees
// one token at a time).
TEST(Generate, CachedStepsAreTheFullForwardsRowsInF64) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    const std::vector<int64_t> tokens = {17, 400, 2048, 5, 99, 1000, 3, 3, 71, 600, 12, 8};
    const int64_t S = int64_t(tokens.size()), V = model->args().vocab_size;
    Tensor all = Tensor::empty({1, S}, DType::I64);
    std::copy(tokens.begin(), tokens.end(), all.data<int64_t>());
    Tensor full;
    {
      autograd::NoGradGuard no_grad;
      full = model->forward_logits(all);
    }
    KVCache cache = model->kv_cache(1, S);
    for (int64_t at = 0; at < S;) {
      const int64_t n = at == 0 ? 5 : at == 5 ? 2 : 1;
      const Tensor got = model->next_token_logits(all.narrow(1, at, n).contiguous(), cache);
      at += n;
      ASSERT_EQ(got.dtype(), DType::F64);
      const double* row = full.data<double>() + (at - 1) * V;
      double worst = 0;
      for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(got.data<double>()[v] - row[v]));
      EXPECT_LE(worst, 1e-10) << name << " position " << at - 1;
    }
  }
}

// In bf16, generate reads weights cast once (its ComputeCopies) where next_token_logits alone casts
// them at each call: the same values, so the same greedy tokens, step by step; the copies are gone
// after it.
TEST(Generate, Bf16GenerationCastsTheWeightsOnceToTheSameTokens) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    auto model = load_hf_model(oracle_dir(name), DType::BF16);
    const std::vector<int64_t> prompt = {17, 400, 2048, 5};
    const Generation g = generate(*model, prompt, 10, SamplingOptions{}, {});
    for (const nn::ParamBlock& b : model->blocks())
      EXPECT_FALSE(b.has_compute_copy()) << name << " " << b.name();
    KVCache cache = model->kv_cache(1, int64_t(prompt.size()) + 10);
    Tensor next = Tensor::empty({1, int64_t(prompt.size())}, DType::I64);
    std::copy(prompt.begin(), prompt.end(), next.data<int64_t>());
    std::vector<int64_t> expected;
    for (int step = 0; step < 10; ++step) {
      const Tensor logits = model->next_token_logits(next, cache);
      expected.push_back(argmax(logits.data<float>(), model->args().vocab_size));
      next = Tensor::full({1, 1}, double(expected.back()), DType::I64);
    }
    EXPECT_EQ(g.ids, expected) << name;
  }
}

// The cache grows as it fills (64 tokens, then doubling, up to its capacity), copying what it
// holds: 150 tokens one at a time (a prompt of 3 first) through two growths and up to the capacity
// of 150 give the full forward's rows in f64.
TEST(Generate, AGrowingKvCacheKeepsWhatItHolds) {
  const ModelArgs args = testing::small_args(2, false);
  Qwen3Model model(args, DType::F64, Device::CPU, {}, Purpose::Inference);
  model.initialize(9);
  const int64_t S = 150, V = args.vocab_size;
  std::vector<int64_t> tokens(size_t(S), 0);
  for (int64_t i = 0; i < S; ++i) tokens[size_t(i)] = (i * 37 + 11) % V;
  const Tensor all = Tensor::from_vector(tokens, {1, S});
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = model.forward_logits(all);
  }
  KVCache cache = model.kv_cache(1, S);
  EXPECT_EQ(cache.allocated(), 0);
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < S;) {
    const int64_t n = at == 0 ? 3 : 1;
    const Tensor got = model.next_token_logits(all.narrow(1, at, n).contiguous(), cache);
    at += n;
    if (sizes.empty() || sizes.back() != cache.allocated()) sizes.push_back(cache.allocated());
    double worst = 0;
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::abs(got.data<double>()[v] - full.data<double>()[(at - 1) * V + v]));
    ASSERT_LE(worst, 1e-10) << "position " << at - 1 << ", room for " << cache.allocated();
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{64, 128, 150}));
}

TEST(Generate, AKvCacheNamesWhatItCannotTake) {
  auto model = oracle_model("tiny_dense");
  auto other = oracle_model("tiny_dense");
  auto error = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto ids = [](int64_t B, int64_t S) {
    Tensor t = Tensor::empty({B, S}, DType::I64);
    for (int64_t i = 0; i < B * S; ++i) t.data<int64_t>()[i] = 7 + i;
    return t;
  };
  KVCache cache = model->kv_cache(1, 4);
  EXPECT_NE(error([&] { other->next_token_logits(ids(1, 2), cache); }).find("made by another model"),
            std::string::npos);
  EXPECT_NE(error([&] { model->next_token_logits(ids(2, 2), cache); }).find("2 rows for a KV cache of 1"),
            std::string::npos);
  model->next_token_logits(ids(1, 3), cache);
  EXPECT_NE(error([&] {
              model->next_token_logits(ids(1, 2), cache);
            }).find("3 cached + 2 new tokens pass the KV cache's capacity (4)"),
            std::string::npos);
  EXPECT_EQ(cache.length(), 3) << "a refused call leaves the cache as it was";
  EXPECT_NE(error([&] { model->kv_cache(1, model->args().max_seq_len + 1); }).find("capacity <= max_seq_len"),
            std::string::npos);
  EXPECT_NE(error([&] { model->kv_cache(2, 4, {1}); }).find("1 left-padding counts for 2 rows"),
            std::string::npos);
  EXPECT_NE(error([&] {
              model->kv_cache(2, 4, {0, 4});
            }).find("row 1's left padding 4 must be in [0, capacity 4)"),
            std::string::npos);
  KVCache two = model->kv_cache(3, 4, {0, 2, 1});
  EXPECT_NE(error([&] { two.select_rows({}); }).find("select at least one row"), std::string::npos);
  EXPECT_NE(error([&] {
              two.select_rows({0, 3});
            }).find("row 3 at 1 is not one of the cache's 3"),
            std::string::npos);
  EXPECT_NE(error([&] { two.select_rows({-1}); }).find("row -1 at 0"), std::string::npos);
  two.select_rows({0, 2});
  EXPECT_EQ(two.batch(), 2);
  EXPECT_EQ(two.left_padding(), (std::vector<int64_t>{0, 1}));
  EXPECT_NE(error([&] { cache.truncate(4); }).find("KVCache::truncate: keep 4 positions of 3"),
            std::string::npos);
  EXPECT_NE(error([&] { cache.truncate(-1); }).find("keep -1 positions of 3"), std::string::npos);
  EXPECT_NE(error([&] { two.truncate(0); }).find("at least the rows' padding, 1"), std::string::npos);
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_NE(
      error([&] { model->cached_logits(ids(1, 1), cache, 2); }).find("the logits of the last 2 of 1 new"),
      std::string::npos);
  EXPECT_NE(error([&] { generate_batch(*model, {}, 1, {}, {}); }).find("no prompt to continue"),
            std::string::npos);
  EXPECT_NE(error([&] {
              generate_batch(*model, {{1}, {}}, 1, {}, {});
            }).find("prompt 1: the prompt holds no token"),
            std::string::npos);
  EXPECT_NE(error([&] {
              BatchOptions one_seed;
              one_seed.seeds = {5};
              generate_batch(*model, {{1}, {2}}, 1, {}, {}, {}, one_seed);
            }).find("1 seeds for 2 prompts"),
            std::string::npos);
  const int64_t max_seq = model->args().max_seq_len;
  EXPECT_NE(error([&] {
              generate_batch(*model, {{1}, {1, 2, 3}}, max_seq - 2, {}, {});
            }).find("3 prompt tokens (the longest prompt) + "),
            std::string::npos);
}

// Many greedy tokens: each is the argmax of a full forward's logits over prompt + generated at the
// position before it (the loop appends what it picked, nothing else), and a stop token ends it.
TEST(Generate, GreedyTokensAreTheFullForwardsArgmaxAndAStopTokenEndsThem) {
  auto model = oracle_model("tiny_dense");
  const std::vector<int64_t> prompt = {17, 400, 2048, 5};
  const Generation g = generate(*model, prompt, 12, SamplingOptions{}, {});
  ASSERT_EQ(g.ids.size(), 12u);
  EXPECT_EQ(g.stop_reason, "max new tokens");
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), g.ids.begin(), g.ids.end());
  Tensor ids = Tensor::empty({1, int64_t(all.size())}, DType::I64);
  std::copy(all.begin(), all.end(), ids.data<int64_t>());
  Tensor logits;
  {
    autograd::NoGradGuard no_grad;
    logits = model->forward_logits(ids);
  }
  const int64_t V = model->args().vocab_size;
  for (size_t i = 0; i < g.ids.size(); ++i)
    EXPECT_EQ(g.ids[i], argmax(logits.data<float>() + (int64_t(prompt.size() + i) - 1) * V, V)) << "token " << i;

  // Stopping at the fourth token's id ends there (at its first occurrence), the stop token kept.
  const size_t first = size_t(std::find(g.ids.begin(), g.ids.end(), g.ids[3]) - g.ids.begin());
  const Generation stopped = generate(*model, prompt, 12, SamplingOptions{}, {g.ids[3]});
  EXPECT_EQ(stopped.stop_reason, "stop token");
  EXPECT_EQ(stopped.ids, std::vector<int64_t>(g.ids.begin(), g.ids.begin() + ptrdiff_t(first) + 1));
}

// Prompts of different lengths continued together (generate_batch): the shorter are left-padded and
// each prompt samples from its own stream. In f64, where batching changes no rounding that matters:
// the padded prompt's and the next step's logits are each prompt's own (run alone) to 1e-10, and
// every prompt's tokens are those generate() gives it alone, greedy and sampled (with a repetition
// penalty, and with explicit seeds). A prompt that reaches a stop token leaves the batch
// (KVCache::select_rows) while the others go on as they would alone; on_token sees every token.
TEST(Generate, ABatchOfPromptsGivesEachPromptItsOwnTokens) {
  const std::vector<std::vector<int64_t>> prompts = {
      {17, 400, 2048, 5, 99, 1000, 3}, {5}, {71, 600, 12}, {3, 3, 8, 17, 400}};
  const size_t n = prompts.size();
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    const int64_t V = model->args().vocab_size, longest = 7;
    {
      std::vector<int64_t> padding;
      Tensor ids = Tensor::empty({int64_t(n), longest}, DType::I64);
      for (size_t r = 0; r < n; ++r) {
        padding.push_back(longest - int64_t(prompts[r].size()));
        int64_t* row = ids.data<int64_t>() + int64_t(r) * longest;
        std::fill(row, row + padding.back(), 1);  // the padding's ids do not matter
        std::copy(prompts[r].begin(), prompts[r].end(), row + padding.back());
      }
      KVCache batch = model->kv_cache(int64_t(n), longest + 1, padding);
      const Tensor first = model->next_token_logits(ids, batch);
      Tensor next = Tensor::empty({int64_t(n), 1}, DType::I64);
      for (size_t r = 0; r < n; ++r) next.data<int64_t>()[r] = int64_t(40 + r);
      const Tensor second = model->next_token_logits(next, batch);
      for (size_t r = 0; r < n; ++r) {
        KVCache alone = model->kv_cache(1, int64_t(prompts[r].size()) + 1);
        Tensor own = Tensor::empty({1, int64_t(prompts[r].size())}, DType::I64);
        std::copy(prompts[r].begin(), prompts[r].end(), own.data<int64_t>());
        const Tensor want_first = model->next_token_logits(own, alone);
        const Tensor want_second =
            model->next_token_logits(next.narrow(0, int64_t(r), 1).contiguous(), alone);
        EXPECT_LE(max_abs_diff(first.narrow(0, int64_t(r), 1).contiguous(), want_first), 1e-10)
            << "prompt " << r;
        EXPECT_LE(max_abs_diff(second.narrow(0, int64_t(r), 1).contiguous(), want_second), 1e-10)
            << "prompt " << r;
      }
      EXPECT_EQ(first.shape(), (Shape{int64_t(n), V}));
    }
    SamplingOptions greedy, sampled;
    sampled.temperature = 1.3;
    sampled.top_k = 40;
    sampled.repetition_penalty = 1.2;
    sampled.seed = 11;
    const std::vector<uint64_t> seeds = {100, 7, 7, 3};
    for (const auto& [options, explicit_seeds] :
         std::vector<std::pair<SamplingOptions, bool>>{{greedy, false}, {sampled, false}, {sampled, true}}) {
      std::vector<std::vector<int64_t>> streamed(n);
      BatchOptions how;
      if (explicit_seeds) how.seeds = seeds;
      how.on_token = [&](size_t r, int64_t id) { streamed[r].push_back(id); };
      const std::vector<Generation> batch = generate_batch(*model, prompts, 10, options, {}, {}, how);
      ASSERT_EQ(batch.size(), n);
      for (size_t r = 0; r < n; ++r) {
        SamplingOptions own = options;
        own.seed = explicit_seeds ? seeds[r] : options.seed + r;
        EXPECT_EQ(batch[r].ids, generate(*model, prompts[r], 10, own, {}).ids)
            << "prompt " << r << " temperature " << options.temperature << (explicit_seeds ? " seeds" : "");
        EXPECT_EQ(streamed[r], batch[r].ids);
        EXPECT_EQ(batch[r].stop_reason, "max new tokens");
      }
    }
    // A stop token that ends some prompts early and not others: the same tokens as alone.
    const std::vector<Generation> free_run = generate_batch(*model, prompts, 10, greedy, {});
    const std::vector<int64_t> stop = {free_run[1].ids[2]};
    const std::vector<Generation> stopped = generate_batch(*model, prompts, 10, greedy, stop);
    size_t early = 0;
    for (size_t r = 0; r < n; ++r) {
      const Generation want = generate(*model, prompts[r], 10, greedy, stop);
      EXPECT_EQ(stopped[r].ids, want.ids) << "prompt " << r;
      EXPECT_EQ(stopped[r].stop_reason, want.stop_reason) << "prompt " << r;
      early += want.stop_reason == "stop token";
    }
    EXPECT_GE(early, 1u);
    EXPECT_LT(early, n) << "every prompt stopped: no row went on after the others left";
  }
}

// A prompt the batch holds several times (several samples of one prompt) runs through the model once
// and its rows are copied: every copy's tokens, sampled with its own seed, are those it gets alone (f64),
// with other prompts and rows joining as copies stop.
TEST(Generate, CopiesOfAPromptInOneBatchSampleAsAlone) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const std::vector<int64_t> p = {71, 600, 12}, q = {5, 9};
  const std::vector<std::vector<int64_t>> prompts = {p, p, q, p, q, p, p};
  SamplingOptions o;
  o.temperature = 1.3;
  BatchOptions how;
  how.batch_size = 5;
  how.seeds = {3, 4, 5, 6, 7, 8, 9};
  const Generation first = generate(*model, p, 1, SamplingOptions{}, {});
  const std::vector<int64_t> stop = {first.ids[0]};  // likely early for some copies of p
  const std::vector<Generation> batch = generate_batch(*model, prompts, 6, o, stop, {}, how);
  for (size_t r = 0; r < prompts.size(); ++r) {
    SamplingOptions own = o;
    own.seed = how.seeds[r];
    const Generation alone = generate(*model, prompts[r], 6, own, stop);
    EXPECT_EQ(batch[r].ids, alone.ids) << "prompt " << r;
    EXPECT_EQ(batch[r].stop_reason, alone.stop_reason) << "prompt " << r;
  }
}

// A GenerationSession continues one sequence over one cache across calls (an interactive chat's
// turns): each call's tokens and log-probabilities are those generate() gives its prompt afresh (f64,
// sampled with the repetition penalty, which reads the whole sequence), and it runs only the prompt's
// positions after those it shares with what the cache holds: all of the last call's but its last new
// token when the prompt goes on from there, the shared start when it differs earlier (the cache
// dropping what follows), and at least the prompt's last token when the cache holds all of it.
TEST(Generate, ASessionRunsOnlyWhatItsPromptChanged) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    GenerationSession session(*model);
    EXPECT_EQ(session.reused(), 0);
    SamplingOptions o;
    o.temperature = 1.3;
    o.repetition_penalty = 1.3;
    auto turn = [&](const std::vector<int64_t>& prompt, uint64_t seed, int64_t reused) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      o.seed = seed;
      std::vector<int64_t> streamed;
      const Generation got = session.generate(
          prompt, 6, o, {}, {}, [&](int64_t id) { streamed.push_back(id); }, {}, true);
      EXPECT_EQ(session.reused(), reused);
      EXPECT_EQ(streamed, got.ids);
      BatchOptions fresh;
      fresh.logprobs = true;
      fresh.seeds = {seed};
      const Generation want = generate_batch(*model, {prompt}, 6, o, {}, {}, fresh)[0];
      EXPECT_EQ(got.ids, want.ids);
      EXPECT_EQ(got.stop_reason, want.stop_reason);
      EXPECT_EQ(got.logprobs.size(), want.logprobs.size());
      for (size_t k = 0; k < got.logprobs.size() && k < want.logprobs.size(); ++k)
        EXPECT_NEAR(got.logprobs[k], want.logprobs[k], 1e-10) << "token " << k;
      return got.ids;
    };
    const std::vector<int64_t> first = {17, 400, 2048, 5, 99};
    const std::vector<int64_t> reply = turn(first, 5, 0);
    ASSERT_EQ(reply.size(), 6u);
    std::vector<int64_t> second = first;  // the conversation goes on after the reply
    second.insert(second.end(), reply.begin(), reply.end());
    second.insert(second.end(), {71, 600, 12});
    turn(second, 6, int64_t(first.size() + reply.size()) - 1);           // the reply's last token never ran
    const std::vector<int64_t> third = {17, 400, 2048, 8, 8, 3000, 12};  // differs from position 3
    turn(third, 7, 3);
    turn({17, 400, 2048, 8}, 8, 3);  // all cached: its last token runs again
    turn({17, 400, 2048, 8}, 8, 3);
    turn({9}, 9, 0);
  }
}

// Scoring in one session (a multiple-choice question's choices, one after another): each choice's
// log-probabilities are the log-softmax of a full forward's logits over question + choice (f64), and
// every choice after the first runs only the question's last token and its own; a continuation past
// 256 tokens is scored in several passes with the same result.
TEST(Generate, ScoringInOneSessionRunsTheQuestionOnce) {
  ModelArgs args = testing::small_args(2, false);
  args.max_seq_len = 600;
  Qwen3Model model(args, DType::F64, Device::CPU, {}, Purpose::Inference);
  model.initialize(12);
  const int64_t V = args.vocab_size;
  auto want = [&](const std::vector<int64_t>& prompt, const std::vector<int64_t>& continuation) {
    std::vector<int64_t> whole = prompt;
    whole.insert(whole.end(), continuation.begin(), continuation.end());
    Tensor logits;
    {
      autograd::NoGradGuard no_grad;
      logits = model.forward_logits(Tensor::from_vector(whole, {1, int64_t(whole.size())}));
    }
    ContinuationScore out;
    for (size_t j = 0; j < continuation.size(); ++j) {
      const double* row = logits.data<double>() + int64_t(prompt.size() - 1 + j) * V;
      double top = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) top = std::max(top, row[v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - top);
      out.logprobs.push_back(row[continuation[j]] - top - std::log(z));
      out.greedy = out.greedy && std::max_element(row, row + V) - row == continuation[j];
    }
    return out;
  };
  auto expect_same = [](const ContinuationScore& got, const ContinuationScore& want) {
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t j = 0; j < got.logprobs.size(); ++j)
      EXPECT_NEAR(got.logprobs[j], want.logprobs[j], 1e-10) << j;
    EXPECT_EQ(got.greedy, want.greedy);
  };
  const std::vector<int64_t> question = {17, 400, 20, 5, 99, 123, 7};
  const std::vector<std::vector<int64_t>> choices = {{4, 8}, {4}, {300, 301, 302}, {9}};
  GenerationSession session(model);
  for (size_t c = 0; c < choices.size(); ++c) {
    SCOPED_TRACE("choice " + std::to_string(c));
    expect_same(session.score(question, choices[c]), want(question, choices[c]));
    EXPECT_EQ(session.reused(), c == 0 ? 0 : int64_t(question.size()) - 1);
  }
  // The greedy continuation is greedy.
  const Generation greedy = generate(model, question, 3, SamplingOptions{}, {});
  const ContinuationScore greedy_score = session.score(question, greedy.ids);
  EXPECT_TRUE(greedy_score.greedy);
  expect_same(greedy_score, want(question, greedy.ids));
  std::vector<int64_t> long_text(300);
  for (size_t i = 0; i < long_text.size(); ++i) long_text[i] = int64_t(i * 37 + 11) % V;
  expect_same(session.score({5, 6}, long_text), want({5, 6}, long_text));
  expect_same(score_continuation(model, question, long_text), want(question, long_text));
  // Prompt and continuation may fill max_seq_len: the continuation's last token is never run.
  std::vector<int64_t> filling(size_t(args.max_seq_len) - 1);
  for (size_t i = 0; i < filling.size(); ++i) filling[i] = int64_t(i * 53 + 7) % V;
  expect_same(session.score({5}, filling), want({5}, filling));
  EXPECT_THROW(session.score({5, 6}, filling), Error);
}

// Continuous batching: eight prompts, three rows at a time. A prompt that stops frees its row, and
// the first prompt waiting that the batch's position has reached takes it at the next step (its
// prompt run alone, its keys and values joining the batch right-aligned): its tokens come while the
// other rows are still generating, and a longer prompt waiting does not hold up the shorter ones. In
// f64 every prompt's tokens, greedy and sampled, are those it gets alone; on_done reports each one
// once, with what the call returns.
TEST(Generate, APromptWaitingTakesTheRowOfOneThatStopped) {
  const std::vector<std::vector<int64_t>> prompts = {{17, 400, 2048, 5, 99, 1000, 3},
                                                     {5},
                                                     {71, 600, 12},
                                                     {3, 3, 8, 17, 400},
                                                     {9, 9},
                                                     {1000, 3, 3, 8, 17, 400, 2048, 5, 99},
                                                     {12, 8, 71, 600},
                                                     {2048, 5, 99, 1000, 3, 3}};
  const size_t n = prompts.size();
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    SamplingOptions greedy, sampled;
    sampled.temperature = 1.1;
    sampled.seed = 4;
    for (const SamplingOptions& options : {greedy, sampled}) {
      // A stop token that some prompts meet early: the one the second prompt says third, alone.
      SamplingOptions second = options;
      second.seed = options.seed + 1;
      const std::vector<int64_t> stop = {generate(*model, prompts[1], 12, second, {}).ids[2]};
      std::vector<std::pair<size_t, int64_t>> events;  // (prompt, token) in the order chosen
      std::vector<int> done(n, 0);
      BatchOptions how;
      how.batch_size = 3;
      how.on_token = [&](size_t r, int64_t id) { events.emplace_back(r, id); };
      std::vector<Generation> reported(n);
      how.on_done = [&](size_t r, const Generation& g) {
        ++done[r];
        reported[r] = g;
      };
      const std::vector<Generation> got = generate_batch(*model, prompts, 12, options, stop, {}, how);
      size_t early = 0;
      for (size_t r = 0; r < n; ++r) {
        SamplingOptions own = options;
        own.seed = options.seed + r;
        const Generation want = generate(*model, prompts[r], 12, own, stop);
        EXPECT_EQ(got[r].ids, want.ids) << "prompt " << r << " temperature " << options.temperature;
        EXPECT_EQ(got[r].stop_reason, want.stop_reason) << "prompt " << r;
        EXPECT_EQ(done[r], 1) << "prompt " << r;
        EXPECT_EQ(reported[r].ids, got[r].ids) << "prompt " << r;
        early += want.stop_reason == "stop token" && r < 3;
      }
      ASSERT_GE(early, 1u) << "no prompt of the first three stopped early: no row was freed";
      // A waiting prompt's first token comes before the last token of a prompt that began with it.
      size_t first_joined = events.size(), last_of_first_rows = 0;
      for (size_t e = 0; e < events.size(); ++e) {
        if (events[e].first >= 3) first_joined = std::min(first_joined, e);
        if (events[e].first < 3) last_of_first_rows = e;
      }
      EXPECT_LT(first_joined, last_of_first_rows) << "the fourth prompt waited for the whole first batch";
      // Three 2-token prompts, the first stopping at its first token: the row it frees goes to the
      // 1-token prompt after the 9-token one, which the batch's position (2) has not reached.
      const std::vector<std::vector<int64_t>> mixed = {{5, 9}, {3, 3}, {71, 12}, prompts[5], {17}};
      const std::vector<int64_t> first_stop = {generate(*model, mixed[0], 1, options, {}).ids[0]};
      std::vector<size_t> order;  // prompts in the order of their first token
      BatchOptions three;
      three.batch_size = 3;
      three.on_token = [&](size_t r, int64_t) {
        if (std::find(order.begin(), order.end(), r) == order.end()) order.push_back(r);
      };
      const std::vector<Generation> mixed_got =
          generate_batch(*model, mixed, 12, options, first_stop, {}, three);
      for (size_t r = 0; r < mixed.size(); ++r) {
        SamplingOptions own = options;
        own.seed = options.seed + r;
        EXPECT_EQ(mixed_got[r].ids, generate(*model, mixed[r], 12, own, first_stop).ids)
            << "mixed prompt " << r;
      }
      ASSERT_EQ(order.size(), mixed.size());
      EXPECT_LT(std::find(order.begin(), order.end(), size_t(4)) - order.begin(),
                std::find(order.begin(), order.end(), size_t(3)) - order.begin())
          << "the 9-token prompt held up the shorter one after it";
    }
  }
}

// transformers' reading of a generation_config.json: greedy unless do_sample; its defaults for the
// keys left out (temperature 1, top_k 50, top_p 1), null as no limit; the repetition penalty either
// way; the keys titan does not apply named; bad values named with the file and key.
TEST(Generate, GenerationDefaultsReadAGenerationConfigAsTransformersDoes) {
  using nlohmann::json;
  EXPECT_FALSE(generation_defaults(json(), "g").samples);
  const GenerationDefaults greedy =
      generation_defaults(json{{"temperature", 0.6}, {"repetition_penalty", 1.1}}, "g");
  EXPECT_FALSE(greedy.samples) << "no do_sample: greedy";
  EXPECT_EQ(greedy.sampling.temperature, 0.0);
  EXPECT_EQ(greedy.sampling.repetition_penalty, 1.1) << "a logits processor: applied greedy too";
  const GenerationDefaults qwen3 = generation_defaults(
      json{{"do_sample", true}, {"temperature", 0.6}, {"top_k", 20}, {"top_p", 0.95}}, "g");
  ASSERT_TRUE(qwen3.samples);
  EXPECT_EQ(qwen3.sampling.temperature, 0.6);
  EXPECT_EQ(qwen3.sampling.top_k, 20);
  EXPECT_EQ(qwen3.sampling.top_p, 0.95);
  EXPECT_EQ(qwen3.sampling.repetition_penalty, 1.0);
  EXPECT_TRUE(qwen3.not_applied.empty());
  const GenerationDefaults bare = generation_defaults(json{{"do_sample", true}, {"top_p", nullptr}}, "g");
  ASSERT_TRUE(bare.samples);
  EXPECT_EQ(bare.sampling.temperature, 1.0);
  EXPECT_EQ(bare.sampling.top_k, 50);
  EXPECT_EQ(bare.sampling.top_p, 1.0);
  EXPECT_EQ(generation_defaults(json{{"do_sample", true}, {"top_k", nullptr}}, "g").sampling.top_k, 0);
  // min_p and typical_p are sampling settings (greedy without do_sample), no_repeat_ngram_size a
  // processor (applied either way); beams without do_sample are beam search, with transformers'
  // defaults for the rest; with do_sample they are beam sampling's.
  const GenerationDefaults extras = generation_defaults(
      json{{"min_p", 0.1}, {"typical_p", 1.0}, {"num_beams", 4}, {"no_repeat_ngram_size", 3}}, "g");
  EXPECT_TRUE(extras.not_applied.empty());
  EXPECT_EQ(extras.sampling.min_p, 0.0);
  EXPECT_EQ(extras.sampling.no_repeat_ngram_size, 3);
  EXPECT_EQ(extras.beams.num_beams, 4);
  EXPECT_EQ(extras.beams.length_penalty, 1.0);
  EXPECT_EQ(extras.beams.early_stopping, EarlyStopping::Heuristic);
  EXPECT_EQ(extras.beams.num_return_sequences, 1);
  EXPECT_EQ(generation_defaults(json(), "g").beams.num_beams, 1) << "no beam search";
  const GenerationDefaults beams = generation_defaults(json{{"num_beams", 5},
                                                            {"length_penalty", 0.6},
                                                            {"early_stopping", "never"},
                                                            {"num_return_sequences", 2}},
                                                       "g");
  EXPECT_EQ(beams.beams.length_penalty, 0.6);
  EXPECT_EQ(beams.beams.early_stopping, EarlyStopping::Never);
  EXPECT_EQ(beams.beams.num_return_sequences, 2);
  EXPECT_EQ(generation_defaults(json{{"num_beams", 2}, {"early_stopping", true}}, "g").beams.early_stopping,
            EarlyStopping::Always);
  const GenerationDefaults beam_sampling =
      generation_defaults(json{{"do_sample", true}, {"num_beams", 4}}, "g");
  EXPECT_EQ(beam_sampling.beams.num_beams, 4);
  EXPECT_TRUE(beam_sampling.samples);
  EXPECT_TRUE(beam_sampling.not_applied.empty());
  const GenerationDefaults sampled = generation_defaults(json{{"do_sample", true},
                                                              {"min_p", 0.1},
                                                              {"typical_p", 0.9},
                                                              {"epsilon_cutoff", 3e-4},
                                                              {"eta_cutoff", nullptr},
                                                              {"top_h", 0.4}},
                                                         "g");
  EXPECT_EQ(sampled.sampling.min_p, 0.1);
  EXPECT_EQ(sampled.sampling.typical_p, 0.9);
  EXPECT_EQ(sampled.sampling.epsilon_cutoff, 3e-4);
  EXPECT_EQ(sampled.sampling.eta_cutoff, 0.0) << "null: none";
  EXPECT_EQ(sampled.not_applied, (std::vector<std::string>{"top_h 0.4"}));
  // min_new_tokens is a processor (either way); max_new_tokens is read; the processors titan does
  // not have are named, their neutral values not.
  const GenerationDefaults lengths =
      generation_defaults(json{{"min_new_tokens", 3},
                               {"max_new_tokens", 100},
                               {"bad_words_ids", json::array({json::array({5}), json::array({7, 8})})},
                               {"suppress_tokens", nullptr},
                               {"begin_suppress_tokens", json::array({2, 9})},
                               {"sequence_bias", json::array({json::array({json::array({4, 1}), -2.5})})},
                               {"min_length", 6},
                               {"forced_eos_token_id", 2},
                               {"exponential_decay_length_penalty", json::array({10, 1.5})},
                               {"renormalize_logits", true},
                               {"penalty_alpha", 0.6},
                               {"max_length", 20}},
                          "g");
  EXPECT_EQ(lengths.sampling.min_new_tokens, 3);
  EXPECT_EQ(lengths.sampling.min_length, 6);
  EXPECT_EQ(lengths.sampling.bad_words_ids, (std::vector<std::vector<int64_t>>{{5}, {7, 8}}));
  EXPECT_TRUE(lengths.sampling.suppress_tokens.empty()) << "null: none";
  EXPECT_EQ(lengths.sampling.begin_suppress_tokens, (std::vector<int64_t>{2, 9}));
  ASSERT_EQ(lengths.sampling.sequence_bias.size(), 1u);
  EXPECT_EQ(lengths.sampling.sequence_bias[0].first, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(lengths.sampling.sequence_bias[0].second, -2.5);
  EXPECT_EQ(lengths.sampling.forced_eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(lengths.sampling.forced_bos_token_id, -1) << "absent: none";
  EXPECT_EQ(lengths.sampling.length_decay_start, 10);
  EXPECT_EQ(lengths.sampling.length_decay_factor, 1.5);
  EXPECT_TRUE(lengths.sampling.renormalize_logits);
  EXPECT_EQ(lengths.max_new_tokens, 100);
  EXPECT_EQ(lengths.not_applied, (std::vector<std::string>{"penalty_alpha 0.6"}))
      << "max_length is read only without max_new_tokens; null and empty lists change nothing";
  const GenerationDefaults forced = generation_defaults(
      json{{"max_length", 20}, {"forced_bos_token_id", 7}, {"forced_eos_token_id", json::array({3, 4})}},
      "g");
  EXPECT_EQ(forced.not_applied, (std::vector<std::string>{"max_length 20"}));
  EXPECT_EQ(forced.sampling.forced_bos_token_id, 7);
  EXPECT_EQ(forced.sampling.forced_eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(generation_defaults(json{{"forced_bos_token_id", nullptr}}, "g").sampling.forced_bos_token_id,
            -1);
  EXPECT_EQ(generation_defaults(json(), "g").max_new_tokens, 0) << "not set";
  EXPECT_EQ(generation_defaults(json{{"eta_cutoff", 0.1}}, "g").sampling.eta_cutoff, 0.0)
      << "a sampling setting: greedy without do_sample";
  EXPECT_EQ(generation_defaults(json{{"do_sample", true}, {"min_p", nullptr}}, "g").sampling.min_p, 0.0);
  auto error = [](const json& c) {
    try {
      generation_defaults(c, "m/generation_config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      error(json{{"do_sample", "yes"}}).find("m/generation_config.json: 'do_sample' must be true or false"),
      std::string::npos);
  EXPECT_NE(
      error(json{{"do_sample", true}, {"top_k", 2.5}}).find("'top_k' must be a whole number >= 0, got 2.5"),
      std::string::npos);
  EXPECT_NE(error(json{{"do_sample", true}, {"top_p", 0}})
                .find("m/generation_config.json: 'top_p' must be in (0, 1], got 0"),
            std::string::npos);
  EXPECT_NE(error(json{{"do_sample", true}, {"eta_cutoff", 1}})
                .find("m/generation_config.json: 'eta_cutoff' must be in [0, 1) (0: none), got 1"),
            std::string::npos);
  EXPECT_NE(
      error(json{{"do_sample", true}, {"epsilon_cutoff", "0.1"}}).find("'epsilon_cutoff' must be a number"),
      std::string::npos);
  EXPECT_NE(
      error(json{{"repetition_penalty", 0}}).find("'repetition_penalty' must be a finite number > 0, got 0"),
      std::string::npos);
  EXPECT_NE(error(json{{"num_beams", 0}}).find("'num_beams' must be a whole number >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error(json{{"min_new_tokens", -2}}).find("'min_new_tokens' must be a whole number >= 0, got -2"),
            std::string::npos);
  EXPECT_NE(error(json{{"min_length", 1.5}}).find("'min_length' must be a whole number >= 0, got 1.5"),
            std::string::npos);
  EXPECT_NE(error(json{{"bad_words_ids", json::array({5, 6})}})
                .find("'bad_words_ids' must be a list of token ids, got 5"),
            std::string::npos);
  EXPECT_NE(error(json{{"bad_words_ids", json::array({json::array()})}})
                .find("'bad_words_ids' holds an empty list"),
            std::string::npos);
  EXPECT_NE(error(json{{"suppress_tokens", json::array({-1})}})
                .find("'suppress_tokens' must hold token ids (whole numbers >= 0), got -1"),
            std::string::npos);
  EXPECT_NE(error(json{{"sequence_bias", json::array({json::array({json::array({3}), "big"})})}})
                .find("'sequence_bias' must be a list of [[token ids], bias] pairs, got [[3],\"big\"]"),
            std::string::npos);
  EXPECT_NE(error(json{{"max_new_tokens", 0}}).find("'max_new_tokens' must be a whole number >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error(json{{"forced_bos_token_id", -3}})
                .find("'forced_bos_token_id' must be a token id (a whole number >= 0) or null, got -3"),
            std::string::npos);
  const GenerationDefaults neutral =
      generation_defaults(json{{"forced_eos_token_id", json::array()}, {"renormalize_logits", nullptr}}, "g");
  EXPECT_TRUE(neutral.sampling.forced_eos_token_ids.empty() && !neutral.sampling.renormalize_logits)
      << "an empty list and null: none";
  EXPECT_NE(error(json{{"exponential_decay_length_penalty", json::array({5})}})
                .find("'exponential_decay_length_penalty' must be [start, factor]: a whole number of new "
                      "tokens >= 0 and a finite factor > 0, got [5]"),
            std::string::npos);
  EXPECT_NE(
      error(json{{"renormalize_logits", 1}}).find("'renormalize_logits' must be true, false or null, got 1"),
      std::string::npos);
  EXPECT_NE(error(json{{"num_beams", 2}, {"early_stopping", "soon"}})
                .find("'early_stopping' must be true, false or \"never\", got \"soon\""),
            std::string::npos);
  EXPECT_NE(error(json{{"num_beams", 2}, {"num_return_sequences", 3}})
                .find("'num_return_sequences' 3 asks for more sequences than its num_beams 2 can give"),
            std::string::npos);
}

// transformers' RepetitionPenaltyLogitsProcessor: an id in the sequence has its logit divided by the
// penalty when positive, multiplied when negative, each id once however often it repeats; ids not in
// the sequence keep theirs; greedy and sampled alike.
TEST(Sampler, TheRepetitionPenaltyScalesTheLogitsOfIdsSeen) {
  std::mt19937_64 rng(1);
  SamplingOptions o;
  o.repetition_penalty = 2.0;
  // id 1 (3.0 -> 1.5) falls below id 3 (2.0); without the sequence nothing changes.
  EXPECT_EQ(pick_next_token(std::vector<float>{1, 3, 0, 2}, o, rng, {}, std::vector<int64_t>{1, 1, 1}), 3);
  EXPECT_EQ(pick_next_token(std::vector<float>{1, 3, 0, 2}, o, rng), 1);
  // A negative logit is multiplied: -0.5 -> -1.0 falls below -0.75.
  EXPECT_EQ(pick_next_token(std::vector<float>{-0.5, -0.75}, o, rng, {}, std::vector<int64_t>{0}), 1);
  // Below 1 it favours repeats: 1.0 / 0.5 = 2.0 passes 1.5.
  o.repetition_penalty = 0.5;
  EXPECT_EQ(pick_next_token(std::vector<float>{1.0, 1.5}, o, rng, {}, std::vector<int64_t>{0}), 0);
  // Sampled: with the penalty the draws follow softmax of the penalised logits.
  o.repetition_penalty = 2.0;
  o.temperature = 1.0;
  const std::vector<float> logits = {0.0, 2.0f * std::log(3.0f)};  // seen id 1: log 3 -> p = (1/4, 3/4)
  std::mt19937_64 draws(7);
  double ones = 0;
  for (int i = 0; i < 20000; ++i) ones += pick_next_token(logits, o, draws, {}, std::vector<int64_t>{1}) == 1;
  EXPECT_NEAR(ones / 20000, 0.75, 0.015);
  o = {};
  o.repetition_penalty = 0;
  EXPECT_THROW(o.validate(), Error);
}

// no_repeat_ngram_size n: an id that would complete an n-gram already in the sequence (prompt and
// new tokens) is never chosen, greedy or sampled; n = 1 bans every id seen; a sequence shorter than
// n - 1 bans nothing.
TEST(Sampler, NoRepeatedNgramBansTheIdsThatWouldRepeatOne) {
  std::mt19937_64 rng(1);
  SamplingOptions o;
  o.no_repeat_ngram_size = 2;
  const std::vector<float> logits = {0, 3, 2, 1};
  // The sequence ends in 0, and "0 1" occurred: 1 would repeat it, 2 is the best left.
  EXPECT_EQ(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{0, 1, 3, 0}), 2);
  EXPECT_EQ(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{0, 2, 3, 1}),
            1);                // "1 ?" never occurred
  o.no_repeat_ngram_size = 3;  // "3 0 1" and "3 0 2" occurred: after "3 0", ids 1 and 2 are banned
  EXPECT_EQ(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{3, 0, 1, 3, 0, 2, 3, 0}), 3);
  EXPECT_EQ(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{3}), 1);  // too short to repeat a 3-gram
  o.no_repeat_ngram_size = 1;
  EXPECT_EQ(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{1, 2}), 3);
  o.temperature = 1;  // sampled: the banned ids are never drawn
  for (int i = 0; i < 4000; ++i) {
    const int64_t id = pick_next_token(logits, o, rng, {}, std::vector<int64_t>{1, 2});
    ASSERT_TRUE(id == 0 || id == 3) << "drew the banned id " << id;
  }
  EXPECT_THROW(pick_next_token(logits, o, rng, {}, std::vector<int64_t>{0, 1, 2, 3}), Error);  // all banned
}

// A length boost so large that every other id's probability underflows to 0 (2.5^9 times the stop
// id's logit, far above the rest): the distribution is that id alone, as transformers' softmax leaves
// it (a case the random comparison below met once in some fifty runs, listing the zeros).
TEST(Sampler, IdsWhoseProbabilityUnderflowsAreNotCandidates) {
  std::vector<float> logits(40, 0.f);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int(i % 9) - 4) * 0.5f;
  logits[0] = 1.7f;
  SamplingOptions o;
  o.temperature = 1;
  o.length_decay_start = 2;
  o.length_decay_factor = 2.5;
  const StepMasks steps({}, {0}, o, int64_t(logits.size()), 13);
  const std::vector<int64_t> sequence = {1, 1, 5, 7, 0, 5, 1, 1, 6, 5, 7, 5};
  const StepForcing forcing = steps.forcing(1, 11);
  ASSERT_GT(forcing.boost, 3000);
  const auto got = next_token_distribution(logits, o, steps.at(1, 11), sequence, forcing);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, 0);
  EXPECT_EQ(got[0].second, 1.0);
}

// The distribution the sampler draws from against transformers' processors and warpers (sequence
// bias, repetition penalty, no repeated n-gram, bad words, forced bos / eos ids, the exponential
// length decay, suppressed tokens, temperature, top-k, top-p, min-p, typical-p, in transformers'
// order) written in PyTorch by tests/models/torch_ref/logits_processors.py: fresh random logits and
// sequences (a prompt and new tokens), each combination giving the same ids with the same
// probabilities (1e-9).
TEST(Sampler, TheDistributionIsTransformersProcessorsAndWarpers) {
  if (const std::string why = titan::testing::torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  using nlohmann::json;
  std::mt19937_64 gen(std::random_device{}());
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p, min_p, typical_p, repetition_penalty;
    int64_t no_repeat_ngram_size;
    double epsilon_cutoff = 0, eta_cutoff = 0;
  };
  const std::vector<Case> combos = {
      {0, 0, 1, 0, 1, 1.3, 2},         {1, 0, 1, 0, 1, 1, 0},
      {0.7, 10, 0.9, 0.05, 1, 1, 0},   {1.3, 0, 1, 0, 0.6, 1, 0},
      {0.5, 0, 1, 0, 0.3, 1, 0},       {1, 0, 0.95, 0.2, 0.9, 1.2, 3},
      {2, 25, 1, 0.01, 0.95, 0.8, 1},  {1, 0, 1, 0.5, 1, 1, 2},
      {0.9, 5, 0.8, 0, 0.5, 1.5, 0},   {1, 0, 1, 0, 1, 1, 0, 0.02},
      {1.5, 0, 1, 0, 1, 1, 0, 0, 0.1}, {0.8, 30, 0.95, 0.02, 0.7, 1.1, 0, 0.03, 0.2},
  };
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int64_t>> sequences;
  json cases = json::array();
  for (const Case& c : combos)
    for (int rep = 0; rep < 4; ++rep) {
      const int64_t V = 40;
      std::normal_distribution<float> scale(0.f, 2.f);
      std::vector<float> row(V);
      for (float& x : row) x = scale(gen);
      std::uniform_int_distribution<int64_t> small(0, 7);  // a few ids, so that n-grams repeat
      std::vector<int64_t> seq(size_t(std::uniform_int_distribution<int>(0, 12)(gen)));
      for (int64_t& id : seq) id = small(gen);
      // Every other case: biased sequences and bad words of 1-3 of those few ids (so that some
      // match the sequence's end), suppressed ids.
      json biases = json::array(), bad = json::array(), suppressed = json::array();
      // Cases 2 and 3 of each: a prompt and new tokens. Case 2: past the start of the stop ids'
      // length decay (a factor below or above 1; stop ids of those few ids, banned, penalised or
      // not), no forced step. Case 3: a forced step, the first new token after a one-id prompt or
      // the last one max_new_tokens allows (half the time each).
      json forcing = json::object();
      if (rep >= 2) {
        while (seq.size() < 3) seq.push_back(small(gen));
        const bool bos_step = rep == 3 && gen() % 2;
        if (bos_step) seq = {seq.front()};  // a one-id prompt, whose first new token is forced
        const int64_t P =
            bos_step ? 1 : std::uniform_int_distribution<int64_t>(1, int64_t(seq.size()) - 2)(gen);
        const int64_t t = int64_t(seq.size()) - P;  // >= 2 unless the bos step
        const int64_t eos = small(gen);
        forcing = {
            {"prompt_length", P},
            {"max_new_tokens", rep == 3 && !bos_step ? t + 1 : t + 2},
            {"eos", {eos, (eos + 3) % 8, eos}},  // (an id listed twice is boosted once)
            {"forced_bos", small(gen)},
            {"forced_eos", {small(gen), small(gen)}},
            {"decay",
             {bos_step ? 0 : std::uniform_int_distribution<int64_t>(0, t - 1)(gen), gen() % 2 ? 0.7 : 2.5}}};
      }
      if (rep % 2 == 1) {
        std::uniform_int_distribution<int> length(1, 3);
        std::normal_distribution<double> bias(0.0, 3.0);
        for (int e = 0; e < 5; ++e) {
          std::vector<int64_t> ids(size_t(length(gen)));
          for (int64_t& id : ids) id = small(gen);
          biases.push_back(json::array({ids, bias(gen)}));
        }
        for (int e = 0; e < 3; ++e) {
          std::vector<int64_t> ids(size_t(length(gen)));
          for (int64_t& id : ids) id = small(gen);
          bad.push_back(ids);
        }
        suppressed.push_back(std::uniform_int_distribution<int64_t>(8, V - 1)(gen));
      }
      json one = {{"logits", row},
                  {"sequence_bias", biases},
                  {"bad_words_ids", bad},
                  {"suppress_tokens", suppressed},
                  {"sequence", seq},
                  {"temperature", c.temperature},
                  {"top_k", c.top_k},
                  {"top_p", c.top_p},
                  {"min_p", c.min_p},
                  {"typical_p", c.typical_p},
                  {"epsilon_cutoff", c.epsilon_cutoff},
                  {"eta_cutoff", c.eta_cutoff},
                  {"repetition_penalty", c.repetition_penalty},
                  {"no_repeat_ngram_size", c.no_repeat_ngram_size}};
      one.update(forcing);
      cases.push_back(one);
      logits.push_back(row);
      sequences.push_back(seq);
    }
  const json expected = torch_reference("logits_processors.py", json{{"cases", cases}}, "sampler_vs_torch");
  ASSERT_EQ(expected.size(), cases.size());
  int forced = 0, boosted = 0;  // cases of a forced step, of a stop id boosted by the length decay
  for (size_t i = 0; i < cases.size(); ++i) {
    SamplingOptions o;
    o.temperature = cases[i]["temperature"];
    o.top_k = cases[i]["top_k"];
    o.top_p = cases[i]["top_p"];
    o.min_p = cases[i]["min_p"];
    o.typical_p = cases[i]["typical_p"];
    o.epsilon_cutoff = cases[i]["epsilon_cutoff"];
    o.eta_cutoff = cases[i]["eta_cutoff"];
    o.repetition_penalty = cases[i]["repetition_penalty"];
    o.no_repeat_ngram_size = cases[i]["no_repeat_ngram_size"];
    for (const json& b : cases[i]["sequence_bias"])
      o.sequence_bias.emplace_back(b[0].get<std::vector<int64_t>>(), b[1].get<double>());
    o.bad_words_ids = cases[i]["bad_words_ids"].get<std::vector<std::vector<int64_t>>>();
    o.suppress_tokens = cases[i]["suppress_tokens"].get<std::vector<int64_t>>();
    std::vector<std::pair<int64_t, double>> got;
    if (cases[i].contains("prompt_length")) {
      o.forced_bos_token_id = cases[i]["forced_bos"];
      o.forced_eos_token_ids = cases[i]["forced_eos"].get<std::vector<int64_t>>();
      o.length_decay_start = cases[i]["decay"][0];
      o.length_decay_factor = cases[i]["decay"][1];
      const StepMasks steps({}, cases[i]["eos"].get<std::vector<int64_t>>(), o, int64_t(logits[i].size()),
                            cases[i]["max_new_tokens"].get<int64_t>());
      const int64_t P = cases[i]["prompt_length"], t = int64_t(sequences[i].size()) - P;
      const StepForcing forcing = steps.forcing(P, t);
      forced += !forcing.forced.empty();
      boosted += forcing.boost != 0;
      got = next_token_distribution(logits[i], o, steps.at(P, t), sequences[i], forcing);
    } else {
      got = next_token_distribution(logits[i], o, {}, sequences[i]);
    }
    std::sort(got.begin(), got.end());
    const std::string what = "case " + std::to_string(i) + ": " + cases[i].dump();
    ASSERT_EQ(got.size(), expected[i].size()) << what;
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].first, expected[i][j][0].get<int64_t>()) << what;
      EXPECT_NEAR(got[j].second, expected[i][j][1].get<double>(), 1e-9) << what;
    }
  }
  EXPECT_GE(forced, 2) << "too few forced steps to test them";
  EXPECT_GE(boosted, 2) << "too few steps with the length decay to test it";
}

// Beam search against transformers' algorithm run in PyTorch (tests/models/torch_ref/beam_search.py:
// its _beam_search over the reference model, in f64, each step a full forward of every beam with no
// cache): both oracles, prompts of 1-5 tokens, every early_stopping mode, length penalties of both
// signs, stop ids that end some beams (two tokens of the greedy continuation), the repetition
// penalty and the n-gram rule. The same sequences, best first, with the same scores (1e-9).
TEST(Generate, BeamSearchIsTransformersBeamSearch) {
  if (const std::string why = titan::testing::torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  using nlohmann::json;
  struct Case {
    std::vector<int64_t> prompt;
    int64_t max_new;
    BeamSearchOptions beams;
    bool stops;
    double repetition_penalty = 1;
    int64_t no_repeat_ngram_size = 0;
    int64_t min_new_tokens = 0;
    int64_t forced_bos = -1;
    std::vector<int64_t> forced_eos = {};
    std::pair<int64_t, double> decay = {0, 1.0};
    bool renormalize = false;
  };
  const std::vector<Case> cases = {
      {{17, 400, 2048, 5, 99}, 6, {2, 1.0, EarlyStopping::Heuristic, 1}, false},
      {{5}, 8, {4, 0.5, EarlyStopping::Always, 3}, true},
      {{71, 600, 12}, 7, {3, 2.0, EarlyStopping::Never, 2}, true, 1.3, 2},
      {{3, 3, 8}, 9, {5, -0.5, EarlyStopping::Heuristic, 5}, true},
      {{17, 400}, 9, {4, 1.0, EarlyStopping::Heuristic, 4}, true, 1.0, 1},
      {{99, 1000, 3}, 6, {3, 0.0, EarlyStopping::Never, 3}, true, 0.7},
      {{5}, 8, {4, 0.5, EarlyStopping::Always, 3}, true, 1.0, 0, 4},
      // forced_bos_token_id after a one-id prompt, forced_eos_token_id, the exponential length decay
      // (growing, then shrinking the stop ids' log-probabilities), renormalize_logits.
      {{5}, 6, {3, 1.0, EarlyStopping::Heuristic, 3}, true, 1.0, 0, 0, 40, {300}, {1, 1.8}, true},
      {{17, 400, 2048}, 7, {4, 0.5, EarlyStopping::Never, 4}, true, 1.2, 0, 2, 40, {99}, {2, 0.6}, true},
      {{71, 600, 12}, 6, {3, 1.0, EarlyStopping::Heuristic, 2}, true, 1.0, 2, 0, -1, {}, {0, 1.5}, false},
  };
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    json spec = {{"model_dir", oracle_dir(name).string()}, {"cases", json::array()}};
    std::vector<std::vector<int64_t>> stops;
    for (const Case& c : cases) {
      std::vector<int64_t> stop;
      if (c.stops) {
        const Generation greedy = generate(*model, c.prompt, c.max_new, SamplingOptions{}, {});
        stop = {greedy.ids[2], greedy.ids[4]};
      }
      stops.push_back(stop);
      const char* early = c.beams.early_stopping == EarlyStopping::Heuristic ? "false"
                          : c.beams.early_stopping == EarlyStopping::Always  ? "true"
                                                                             : "\"never\"";
      spec["cases"].push_back({{"prompt", c.prompt},
                               {"max_new_tokens", c.max_new},
                               {"num_beams", c.beams.num_beams},
                               {"length_penalty", c.beams.length_penalty},
                               {"early_stopping", json::parse(early)},
                               {"num_return_sequences", c.beams.num_return_sequences},
                               {"stop_ids", stop},
                               {"repetition_penalty", c.repetition_penalty},
                               {"no_repeat_ngram_size", c.no_repeat_ngram_size},
                               {"min_new_tokens", c.min_new_tokens},
                               {"forced_bos", c.forced_bos < 0 ? json() : json(c.forced_bos)},
                               {"forced_eos", c.forced_eos},
                               {"decay", {c.decay.first, c.decay.second}},
                               {"renormalize", c.renormalize}});
    }
    const json expected = torch_reference("beam_search.py", spec, "beam_search_vs_torch_" + name);
    ASSERT_EQ(expected.size(), cases.size());
    size_t stopped = 0, beam_not_greedy = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      SCOPED_TRACE("case " + std::to_string(i) + ": " + spec["cases"][i].dump());
      SamplingOptions processors;
      processors.repetition_penalty = c.repetition_penalty;
      processors.no_repeat_ngram_size = c.no_repeat_ngram_size;
      processors.min_new_tokens = c.min_new_tokens;
      processors.forced_bos_token_id = c.forced_bos;
      processors.forced_eos_token_ids = c.forced_eos;
      processors.length_decay_start = c.decay.first;
      processors.length_decay_factor = c.decay.second;
      processors.renormalize_logits = c.renormalize;
      const std::vector<Generation> got =
          beam_search(*model, c.prompt, c.max_new, c.beams, processors, stops[i]);
      ASSERT_EQ(got.size(), expected[i].size());
      for (size_t r = 0; r < got.size(); ++r) {
        ASSERT_TRUE(expected[i][r]["finished"].get<bool>()) << "sequence " << r;
        EXPECT_EQ(got[r].ids, expected[i][r]["ids"].get<std::vector<int64_t>>()) << "sequence " << r;
        ASSERT_TRUE(got[r].score.has_value());
        EXPECT_NEAR(*got[r].score, expected[i][r]["score"].get<double>(), 1e-9) << "sequence " << r;
        stopped += got[r].stop_reason == "stop token";
        EXPECT_GE(int64_t(got[r].ids.size()), std::max<int64_t>(1, c.min_new_tokens)) << "sequence " << r;
      }
      beam_not_greedy += got[0].ids != generate(*model, c.prompt, c.max_new, processors, stops[i]).ids;
    }
    EXPECT_GE(stopped, 3u) << "too few sequences ended at a stop id to test finishing early";
    EXPECT_GE(beam_not_greedy, 1u) << "every best beam was the greedy sequence: the cases test little";
  }
}

// KVCache::select_rows with rows taken twice and out of order (new buffers), then a subset in
// order (in place): each row then continues as a cache of its own prompt alone would (f64, 1e-10).
TEST(Generate, SelectedRowsCarryTheirPromptsKeysAndValues) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const std::vector<std::vector<int64_t>> prompts = {{17, 400, 2048}, {5, 99, 1000}, {3, 3, 8}};
  KVCache cache = model->kv_cache(3, 6);
  std::vector<int64_t> all;
  for (const auto& p : prompts) all.insert(all.end(), p.begin(), p.end());
  model->next_token_logits(Tensor::from_vector(all, {3, 3}), cache);
  auto continue_alone = [&](const std::vector<int64_t>& prompt, const std::vector<int64_t>& more) {
    KVCache alone = model->kv_cache(1, 6);
    model->next_token_logits(Tensor::from_vector(prompt, {1, 3}), alone);
    Tensor last;
    for (int64_t id : more)
      last = model->next_token_logits(Tensor::from_vector(std::vector<int64_t>{id}, {1, 1}), alone);
    return last;
  };
  const std::vector<int64_t> chosen = {2, 0, 2, 1};
  cache.select_rows(chosen);
  ASSERT_EQ(cache.batch(), 4);
  const std::vector<int64_t> next = {40, 41, 42, 43};
  const Tensor logits = model->next_token_logits(Tensor::from_vector(next, {4, 1}), cache);
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_LE(max_abs_diff(logits.narrow(0, r, 1).contiguous(),
                           continue_alone(prompts[size_t(chosen[size_t(r)])], {next[size_t(r)]})),
              1e-10)
        << "row " << r;
  cache.select_rows({1, 3});  // prompt 0 after 41, prompt 1 after 43
  const Tensor after =
      model->next_token_logits(Tensor::from_vector(std::vector<int64_t>{50, 51}, {2, 1}), cache);
  EXPECT_LE(max_abs_diff(after.narrow(0, 0, 1).contiguous(), continue_alone(prompts[0], {41, 50})), 1e-10);
  EXPECT_LE(max_abs_diff(after.narrow(0, 1, 1).contiguous(), continue_alone(prompts[1], {43, 51})), 1e-10);
}

// BatchOptions::logprobs: each new token's log-probability under the model, the log-softmax of a full
// forward's logits at its position, whatever the sampling and processors that chose it (an f64 model;
// 1e-6: the sampler reads the logits rounded to f32).
TEST(Generate, LogprobsAreTheModelsLogSoftmax) {
  auto model = load_hf_model(oracle_dir("tiny_moe"), DType::F64);
  const int64_t V = model->args().vocab_size;
  const std::vector<std::vector<int64_t>> prompts = {{71, 600, 12}, {5, 9}};
  SamplingOptions o;
  o.temperature = 1.5;
  o.top_k = 30;
  o.repetition_penalty = 1.4;
  BatchOptions how;
  how.logprobs = true;
  const std::vector<Generation> got = generate_batch(*model, prompts, 6, o, {}, {}, how);
  for (size_t r = 0; r < prompts.size(); ++r) {
    ASSERT_EQ(got[r].logprobs.size(), got[r].ids.size());
    std::vector<int64_t> all = prompts[r];
    all.insert(all.end(), got[r].ids.begin(), got[r].ids.end());
    Tensor logits;
    {
      autograd::NoGradGuard no_grad;
      logits = model->forward_logits(Tensor::from_vector(all, {1, int64_t(all.size())}));
    }
    for (size_t k = 0; k < got[r].ids.size(); ++k) {
      const double* row = logits.data<double>() + int64_t(prompts[r].size() - 1 + k) * V;
      double top = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) top = std::max(top, row[v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - top);
      EXPECT_NEAR(got[r].logprobs[k], row[got[r].ids[k]] - top - std::log(z), 1e-6)
          << "prompt " << r << " token " << k;
    }
  }
  EXPECT_TRUE(generate(*model, prompts[0], 3, o, {}).logprobs.empty()) << "only when asked for";
}

// score_continuation against transformers' logits (the oracles): every row of the oracle's input,
// its first three tokens the prompt and the rest the continuation: each continuation token's
// log-probability is the log-softmax of transformers' logits at its position (1e-4), and `greedy`
// says whether each was their argmax; a continuation of the argmax tokens is greedy.
TEST(Generate, ScoredContinuationsAreTransformersLogProbabilities) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = oracle_model(name);
    auto ref = io::SafetensorsFile::open(oracle_dir(name) / "reference.safetensors");
    const Tensor ids = load_tensor(ref, "input_ids"), logits = load_tensor(ref, "logits");
    const int64_t B = ids.size(0), S = ids.size(1), V = logits.size(2);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t* row = ids.data<int64_t>() + b * S;
      const std::vector<int64_t> prompt(row, row + 3), continuation(row + 3, row + S);
      const ContinuationScore got = score_continuation(*model, prompt, continuation);
      ASSERT_EQ(got.logprobs.size(), continuation.size());
      bool greedy = true;
      for (size_t k = 0; k < continuation.size(); ++k) {
        const float* at = logits.data<float>() + (b * S + 2 + int64_t(k)) * V;
        double top = at[0], z = 0;
        for (int64_t v = 0; v < V; ++v) top = std::max(top, double(at[v]));
        for (int64_t v = 0; v < V; ++v) z += std::exp(double(at[v]) - top);
        EXPECT_NEAR(got.logprobs[k], double(at[continuation[k]]) - top - std::log(z), 1e-4)
            << "row " << b << " token " << k;
        greedy = greedy && argmax(at, V) == continuation[k];
      }
      EXPECT_EQ(got.greedy, greedy) << "row " << b;
    }
    const std::vector<int64_t> prompt = {17, 400, 2048};
    const Generation g = generate(*model, prompt, 5, SamplingOptions{}, {});
    EXPECT_TRUE(score_continuation(*model, prompt, g.ids).greedy) << "its own greedy tokens";
  }
  auto model = oracle_model("tiny_dense");
  EXPECT_THROW(score_continuation(*model, {1}, {}), Error);
  EXPECT_THROW(score_continuation(*model, {}, {1}), Error);
  EXPECT_THROW(score_continuation(*model, {1}, {4096}), Error);
}

// A StopCheck (titan generate's stop strings) ends a sequence as a stop id would, with its own
// reason: greedy and sampled in a batch, and in beam search the same sequences and scores as the
// stop id it mirrors.
TEST(Generate, AStopCheckEndsASequenceAsAStopIdWould) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const std::vector<std::vector<int64_t>> prompts = {{71, 600, 12}, {5}, {17, 400, 2048, 5}};
  BatchOptions how;
  how.batch_size = 2;
  how.stop_check = [](const std::vector<int64_t>& ids) { return ids.size() == 3; };
  for (const Generation& g : generate_batch(*model, prompts, 8, SamplingOptions{}, {}, {}, how)) {
    EXPECT_EQ(g.ids.size(), 3u);
    EXPECT_EQ(g.stop_reason, "stop string");
  }
  const Generation free_run = generate(*model, prompts[0], 8, SamplingOptions{}, {});
  const int64_t token = free_run.ids[0];  // the most likely first token: some beams end on it
  const StopCheck ends_with_token = [token](const std::vector<int64_t>& ids) { return ids.back() == token; };
  const BeamSearchOptions beams{3, 0.0, EarlyStopping::Heuristic, 3};  // no length penalty: short ones win
  const std::vector<std::vector<Generation>> by_check =
      beam_search_batch(*model, prompts, 8, beams, {}, {}, {}, 2, {}, ends_with_token);
  const std::vector<std::vector<Generation>> by_id =
      beam_search_batch(*model, prompts, 8, beams, {}, {token}, {}, 2);
  size_t stopped = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    ASSERT_EQ(by_check[r].size(), by_id[r].size());
    for (size_t k = 0; k < by_id[r].size(); ++k) {
      EXPECT_EQ(by_check[r][k].ids, by_id[r][k].ids) << "prompt " << r << " sequence " << k;
      EXPECT_EQ(*by_check[r][k].score, *by_id[r][k].score);
      EXPECT_EQ(by_check[r][k].stop_reason,
                by_id[r][k].stop_reason == "stop token" ? "stop string" : by_id[r][k].stop_reason);
      stopped += by_id[r][k].stop_reason == "stop token";
    }
  }
  EXPECT_GE(stopped, 1u) << "no sequence ended at the token: the check was never taken";
  // A check that ends most continuations (three ids in four): the search takes candidates past its
  // usual count until num_beams go on, so the same sequences as those ids given as stop ids.
  std::vector<int64_t> most;
  for (int64_t id = 0; id < model->args().vocab_size; ++id)
    if (id % 4 != 0) most.push_back(id);
  const StopCheck ends_most = [](const std::vector<int64_t>& ids) { return ids.back() % 4 != 0; };
  const BeamSearchOptions two{2, 1.0, EarlyStopping::Heuristic, 2};
  const std::vector<std::vector<Generation>> checked =
      beam_search_batch(*model, prompts, 8, two, {}, {}, {}, 3, {}, ends_most);
  const std::vector<std::vector<Generation>> listed =
      beam_search_batch(*model, prompts, 8, two, {}, most, {}, 3);
  for (size_t r = 0; r < prompts.size(); ++r) {
    ASSERT_EQ(checked[r].size(), listed[r].size()) << "prompt " << r;
    for (size_t k = 0; k < listed[r].size(); ++k) {
      EXPECT_EQ(checked[r][k].ids, listed[r][k].ids) << "prompt " << r << " sequence " << k;
      EXPECT_NEAR(*checked[r][k].score, *listed[r][k].score, 1e-12);
    }
  }
}

// Several prompts searched together, three at a time (their beams the rows of one batch, the shorter
// prompts left-padded), a prompt whose search ends leaving the batch while the others go on: in f64
// each prompt's sequences and scores are those it gets alone, and on_done reports each prompt once,
// with what the call returns.
TEST(Generate, ABatchOfPromptsSearchesEachAsAlone) {
  const std::vector<std::vector<int64_t>> prompts = {
      {17, 400, 2048, 5, 99, 1000, 3}, {5}, {71, 600, 12}, {3, 3, 8, 17, 400}, {9, 8}};
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    // A repetition penalty below 1 makes the ids seen the most likely, and prompt 2's are stop ids:
    // its search ends at once, while prompt 0 (none of them in it) goes on.
    const std::vector<int64_t> stop = prompts[2];
    SamplingOptions processors;
    processors.repetition_penalty = 0.5;
    // early_stopping true: a search ends once its three beams have finished, at the step of the
    // longest of them (all three returned).
    const BeamSearchOptions beams{3, 1.0, EarlyStopping::Always, 3};
    std::vector<int> reported(prompts.size(), 0);
    std::vector<std::vector<Generation>> seen(prompts.size());
    const std::vector<std::vector<Generation>> batch = beam_search_batch(
        *model, prompts, 8, beams, processors, stop, {}, 3, [&](size_t r, const std::vector<Generation>& g) {
          ++reported[r];
          seen[r] = g;
        });
    ASSERT_EQ(batch.size(), prompts.size());
    std::vector<size_t> ended_at(prompts.size(), 0);
    for (size_t r = 0; r < prompts.size(); ++r) {
      const std::vector<Generation> alone = beam_search(*model, prompts[r], 8, beams, processors, stop);
      ASSERT_EQ(batch[r].size(), alone.size()) << "prompt " << r;
      EXPECT_EQ(reported[r], 1) << "prompt " << r;
      ASSERT_EQ(seen[r].size(), alone.size()) << "prompt " << r;
      for (size_t s = 0; s < alone.size(); ++s) {
        EXPECT_EQ(batch[r][s].ids, alone[s].ids) << "prompt " << r << " sequence " << s;
        EXPECT_NEAR(*batch[r][s].score, *alone[s].score, 1e-10) << "prompt " << r << " sequence " << s;
        EXPECT_EQ(batch[r][s].stop_reason, alone[s].stop_reason);
        EXPECT_EQ(seen[r][s].ids, alone[s].ids);
        ended_at[r] = std::max(ended_at[r], alone[s].ids.size());
      }
    }
    // In the first batch (prompts 0-2), a search ended before another went on to the last step.
    const auto [shortest, longest] = std::minmax_element(ended_at.begin(), ended_at.begin() + 3);
    EXPECT_LT(*shortest, *longest) << "no prompt left its batch before the others: " << ended_at[0] << " "
                                   << ended_at[1] << " " << ended_at[2];
  }
}

// min_new_tokens (transformers' MinNewTokensLengthLogitsProcessor): before that many new tokens the
// stop ids are never chosen, greedy and sampled, in a batch as alone; after it they stop as usual.
TEST(Generate, MinNewTokensHoldsTheStopIdsBack) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const int64_t V = model->args().vocab_size;
  const std::vector<int64_t> prompt = {71, 600, 12};
  const Generation free_run = generate(*model, prompt, 10, SamplingOptions{}, {});
  const std::vector<int64_t> stop = {free_run.ids[1]};
  const size_t first =
      size_t(std::find(free_run.ids.begin(), free_run.ids.end(), stop[0]) - free_run.ids.begin());
  ASSERT_LT(first, 4u);
  EXPECT_EQ(generate(*model, prompt, 10, SamplingOptions{}, stop).ids.size(), first + 1)
      << "the stop id ends it";
  SamplingOptions held;
  held.min_new_tokens = 4;
  const Generation g = generate(*model, prompt, 10, held, stop);
  std::vector<bool> no_stop(static_cast<size_t>(V), true);
  no_stop[size_t(stop[0])] = false;
  const Generation masked = generate(*model, prompt, 4, SamplingOptions{}, {}, no_stop);
  ASSERT_GE(g.ids.size(), 4u);
  EXPECT_EQ(std::vector<int64_t>(g.ids.begin(), g.ids.begin() + 4), masked.ids)
      << "the first four: greedy with the stop id left out";
  for (size_t k = 4; k + 1 < g.ids.size(); ++k) EXPECT_NE(g.ids[k], stop[0]) << "went on after the stop id";
  EXPECT_EQ(g.stop_reason == "stop token", g.ids.back() == stop[0]);
  // Sampled among three ids (one the stop id), in batches of three with rows joining as others stop:
  // never among the first four, where without min_new_tokens most samples stop sooner.
  std::vector<bool> few(static_cast<size_t>(V), false);
  for (int64_t id : {stop[0], int64_t(7), int64_t(8)}) few[size_t(id)] = true;
  SamplingOptions sampled;
  sampled.temperature = 50;  // about uniform over the three
  const std::vector<std::vector<int64_t>> prompts(8, prompt);
  BatchOptions how;
  how.batch_size = 3;
  size_t early = 0;
  for (const Generation& s : generate_batch(*model, prompts, 6, sampled, stop, few, how))
    early += s.ids.size() < 4;
  EXPECT_GE(early, 4u) << "the control: without min_new_tokens most samples stop within four tokens";
  sampled.min_new_tokens = 4;
  for (const Generation& s : generate_batch(*model, prompts, 6, sampled, stop, few, how)) {
    ASSERT_GE(s.ids.size(), 4u);
    for (size_t k = 0; k < 4; ++k) EXPECT_NE(s.ids[k], stop[0]);
  }
  SamplingOptions bad;
  bad.min_new_tokens = -1;
  EXPECT_THROW(bad.validate(), Error);
}

// transformers' bad_words_ids, sequence_bias and suppress_tokens on one row of logits: a one-id bad
// word or suppressed id is never chosen; a longer bad word's last id only after its other ids, and
// not at all while the sequence is shorter than the word (transformers skips it); biases add up, a
// longer sequence's where its other ids end the sequence. Their ids are checked.
TEST(Sampler, BadWordsSequenceBiasAndSuppressedTokensShapeTheLogits) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {0, 3, 2, 1};
  auto greedy = [&](const SamplingOptions& o, std::vector<int64_t> sequence) {
    return pick_next_token(logits, o, rng, {}, sequence);
  };
  SamplingOptions o;
  EXPECT_EQ(greedy(o, {}), 1) << "the control";
  o.bad_words_ids = {{1}};
  EXPECT_EQ(greedy(o, {}), 2);
  o.bad_words_ids = {{0, 1}};
  EXPECT_EQ(greedy(o, {2, 0}), 2) << "after 0, 1 is banned";
  EXPECT_EQ(greedy(o, {0, 2}), 1);
  EXPECT_EQ(greedy(o, {0}), 1) << "a word longer than the sequence is skipped, as transformers skips it";
  o.bad_words_ids = {{0, 3, 1}};
  EXPECT_EQ(greedy(o, {0, 3}), 1) << "longer than the sequence: skipped";
  EXPECT_EQ(greedy(o, {2, 0, 3}), 2) << "as long as the sequence: applies";
  EXPECT_EQ(greedy(o, {2, 1, 3}), 1);
  o = {};
  o.suppress_tokens = {1, 2};
  EXPECT_EQ(greedy(o, {}), 3);
  o = {};
  o.sequence_bias = {{{2}, 1.5}};
  EXPECT_EQ(greedy(o, {}), 2) << "2 + 1.5 passes 3";
  o.sequence_bias = {{{2}, 1.5}, {{3}, 0.1}, {{2}, 0.5}};
  EXPECT_EQ(greedy(o, {}), 1) << "ids that come again: the last bias, once (2.5 stays below 3)";
  o.sequence_bias = {{{0, 3}, 5.0}};
  EXPECT_EQ(greedy(o, {0}), 1) << "longer than the sequence: skipped";
  EXPECT_EQ(greedy(o, {2, 0}), 3);
  EXPECT_EQ(greedy(o, {0, 2}), 1);
  o.sequence_bias = {{{2}, 0.6}, {{0, 2}, 0.6}};
  EXPECT_EQ(greedy(o, {1, 1}), 1) << "2.6 stays below 3";
  EXPECT_EQ(greedy(o, {1, 0}), 2) << "both apply: 3.2";
  const std::vector<std::pair<int64_t, float>> biases = sequence_biases(std::vector<int64_t>{1, 0}, o);
  ASSERT_EQ(biases.size(), 1u);
  EXPECT_EQ(biases[0].second, 0.6f + 0.6f);
  // Sampled: the bad and suppressed ids are never drawn.
  o = {};
  o.temperature = 1;
  o.bad_words_ids = {{1}};
  o.suppress_tokens = {3};
  for (int i = 0; i < 2000; ++i) {
    const int64_t id = greedy(o, {});
    ASSERT_TRUE(id == 0 || id == 2) << id;
  }
  // A bad word that is a stop id alone is dropped where the stop ids are known.
  o.bad_words_ids = {{2}, {1}, {2, 2}};
  EXPECT_EQ(without_stop_words(o, {2}).bad_words_ids, (std::vector<std::vector<int64_t>>{{1}, {2, 2}}));
  auto error = [](const SamplingOptions& bad) {
    try {
      bad.validate(4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SamplingOptions bad;
  bad.bad_words_ids = {{1}, {2, 7}};
  EXPECT_NE(error(bad).find("sampling: bad_words_ids[1][1] is id 7, outside the model's vocabulary [0, 4)"),
            std::string::npos)
      << error(bad);
  bad = {};
  bad.bad_words_ids = {{}};
  EXPECT_NE(error(bad).find("bad_words_ids[0] holds no id"), std::string::npos);
  bad = {};
  bad.sequence_bias = {{{1}, std::numeric_limits<double>::infinity()}};
  EXPECT_NE(error(bad).find("sequence_bias[0]'s bias must be finite"), std::string::npos);
  bad = {};
  bad.suppress_tokens = {-1};
  EXPECT_NE(error(bad).find("suppress_tokens[0] is id -1"), std::string::npos);
  bad = {};
  bad.min_length = -1;
  EXPECT_NE(error(bad).find("min_length must be >= 0"), std::string::npos);
}

// The ids each step may take: begin_suppress_tokens leave the first new token alone; min_length, as
// min_new_tokens, holds the stop ids back until the prompt and the new tokens reach it.
TEST(Sampler, StepMasksFollowTheStep) {
  SamplingOptions o;
  o.begin_suppress_tokens = {1};
  o.min_length = 5;
  const StepMasks masks({}, {3}, o, 4);
  const std::vector<bool> first = masks.at(3, 0), second = masks.at(3, 1), third = masks.at(3, 2);
  EXPECT_EQ(first, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(second, (std::vector<bool>{true, true, true, false})) << "3 + 1 < 5: the stop id still held back";
  EXPECT_TRUE(third.empty()) << "3 + 2 reaches 5: every id";
  EXPECT_TRUE(masks.at(9, 1).empty()) << "a longer prompt reaches min_length at once";
  EXPECT_EQ(masks.at(9, 0), (std::vector<bool>{true, false, true, true}));
  const std::vector<bool> allowed = {true, true, false, true};
  EXPECT_EQ(StepMasks(allowed, {3}, SamplingOptions{}, 4).at(1, 0), allowed)
      << "none of them: `allowed` as it is";
  // forced_bos_token_id after a one-id prompt: begin_suppress_tokens moves to the token after it (as
  // transformers' begin_index); forced_eos_token_id at the last token (max_new_tokens 4) lifts the
  // stop ids' hold; the length decay boosts each stop id once, however often listed, and only those
  // of the vocabulary.
  SamplingOptions forced = o;
  forced.forced_bos_token_id = 2;
  forced.forced_eos_token_ids = {0};
  forced.length_decay_start = 1;
  forced.length_decay_factor = 2;
  const StepMasks steps({}, {3, 3, 7, -1}, forced, 4, 4);
  EXPECT_TRUE(steps.at(1, 0).empty()) << "the forced step: neither the hold nor begin_suppress_tokens";
  EXPECT_EQ(steps.forcing(1, 0).forced.size(), 1u);
  EXPECT_EQ(steps.at(1, 1), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(steps.at(3, 0), first) << "a longer prompt: no forced bos";
  EXPECT_TRUE(steps.forcing(3, 0).forced.empty());
  EXPECT_TRUE(steps.at(1, 3).empty()) << "the forced eos step lifts the hold of 1 + 3 < 5";
  ASSERT_EQ(steps.forcing(1, 3).forced.size(), 1u);
  EXPECT_EQ(steps.forcing(1, 3).forced[0], 0);
  const StepForcing decay = steps.forcing(1, 2);
  EXPECT_TRUE(decay.forced.empty());
  EXPECT_EQ(decay.boost, 1.0) << "2^(2 - 1) - 1";
  EXPECT_EQ(std::vector<int64_t>(decay.boosted.begin(), decay.boosted.end()), std::vector<int64_t>{3});
  EXPECT_EQ(steps.forcing(1, 1).boost, 0.0) << "not past start";
}

// On the f64 oracle model: begin_suppress_tokens changes the first token only (then greedy goes on
// from it); min_length holds the stop ids back as min_new_tokens does when it counts the prompt; a
// bad word of two new ids is never generated; beam search applies them too.
TEST(Generate, ProcessorsOfTheGenerationConfigShapeGreedyAndBeamSearch) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const int64_t V = model->args().vocab_size;
  const std::vector<int64_t> prompt = {17, 400, 2048, 5, 99};
  const Generation free_run = generate(*model, prompt, 6, SamplingOptions{}, {});
  ASSERT_EQ(free_run.ids.size(), 6u);
  // begin_suppress_tokens: the first token the best other than the free run's; from there, greedy.
  SamplingOptions begin;
  begin.begin_suppress_tokens = {free_run.ids[0]};
  const Generation g = generate(*model, prompt, 6, begin, {});
  std::vector<bool> not_first(size_t(V), true);
  not_first[size_t(free_run.ids[0])] = false;
  const Generation first = generate(*model, prompt, 1, SamplingOptions{}, {}, not_first);
  ASSERT_EQ(g.ids.size(), 6u);
  EXPECT_EQ(g.ids[0], first.ids[0]);
  std::vector<int64_t> after(prompt);
  after.push_back(first.ids[0]);
  const Generation rest = generate(*model, after, 5, SamplingOptions{}, {});
  EXPECT_EQ(std::vector<int64_t>(g.ids.begin() + 1, g.ids.end()), rest.ids);
  // min_length = prompt + 3 is min_new_tokens = 3 for this prompt.
  const std::vector<int64_t> stop = {free_run.ids[1]};
  SamplingOptions by_length, by_new;
  by_length.min_length = int64_t(prompt.size()) + 3;
  by_new.min_new_tokens = 3;
  const Generation held = generate(*model, prompt, 6, by_length, stop);
  EXPECT_EQ(held.ids, generate(*model, prompt, 6, by_new, stop).ids);
  ASSERT_GE(held.ids.size(), 3u);
  EXPECT_NE(held.ids[1], stop[0]) << "the control: without it the stop id ends the run at the second token";
  // A bad word of the prompt's last id and the free run's first token (the prompt counts): that
  // first token is another, and the pair never appears in the sequence.
  SamplingOptions bad;
  bad.bad_words_ids = {{prompt.back(), free_run.ids[0]}};
  const Generation b = generate(*model, prompt, 6, bad, {});
  EXPECT_NE(b.ids[0], free_run.ids[0]);
  std::vector<int64_t> whole(prompt);
  whole.insert(whole.end(), b.ids.begin(), b.ids.end());
  for (size_t k = prompt.size(); k < whole.size(); ++k)
    EXPECT_FALSE(whole[k - 1] == prompt.back() && whole[k] == free_run.ids[0]) << "the bad word at " << k;
  // Beam search: no returned sequence starts with a suppressed id, nor takes one later.
  const BeamSearchOptions beams{3, 1.0, EarlyStopping::Heuristic, 3};
  const std::vector<Generation> free_beams = beam_search(*model, prompt, 4, beams, {}, {});
  SamplingOptions suppress;
  suppress.suppress_tokens = {free_beams[0].ids[0]};
  for (const Generation& s : beam_search(*model, prompt, 4, beams, suppress, {}))
    for (int64_t id : s.ids) EXPECT_NE(id, suppress.suppress_tokens[0]);
  // ... nor starts with a begin-suppressed id, nor with the end of a bad word the prompt begins;
  // min_length keeps the stop id out of the first two tokens of every sequence; a large bias on an
  // id puts it first in the best sequence (added to the log-probabilities).
  const int64_t best_first = free_beams[0].ids[0];
  SamplingOptions begin_beam, bad_beam, held_beam, favour;
  begin_beam.begin_suppress_tokens = {best_first};
  bad_beam.bad_words_ids = {{prompt.back(), best_first}};
  held_beam.min_length = int64_t(prompt.size()) + 2;
  for (const SamplingOptions& o : {begin_beam, bad_beam, held_beam}) {
    const std::vector<Generation> found = beam_search(*model, prompt, 4, beams, o, {best_first});
    ASSERT_EQ(found.size(), 3u);
    for (const Generation& s : found) {
      EXPECT_NE(s.ids[0], best_first);
      if (o.min_length > 0) {
        EXPECT_NE(s.ids.at(1), best_first);
      }
    }
  }
  // min_length counts each row's own prompt in a batch: a prompt as long as min_length is not held
  // back (it stops at once on its greedy first token), a prompt of one id is held back two tokens,
  // as min_new_tokens = 2 holds it.
  SamplingOptions length3, two_new;
  length3.min_length = 3;
  two_new.min_new_tokens = 2;
  const std::vector<int64_t> one_id = {5}, stop_first = {free_run.ids[0]};
  const std::vector<Generation> rows = generate_batch(*model, {prompt, one_id}, 6, length3, stop_first);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].ids, std::vector<int64_t>{free_run.ids[0]}) << "not held back: stops at once";
  EXPECT_EQ(rows[1].ids, generate(*model, one_id, 6, two_new, stop_first).ids);
  int64_t favoured = 7;
  while (std::any_of(free_beams.begin(), free_beams.end(),
                     [&](const Generation& s) { return s.ids[0] == favoured; }))
    ++favoured;
  favour.sequence_bias = {{{favoured}, 50.0}};
  EXPECT_EQ(beam_search(*model, prompt, 4, beams, favour, {})[0].ids[0], favoured);
  // forced_eos_token_id: the last token max_new_tokens allows, in a batch and in every beam, over
  // min_new_tokens (transformers' order: the forced id replaces the logits it held back), the
  // tokens before it greedy's; forced_bos_token_id: the first new token after a one-id prompt only.
  SamplingOptions ends;
  ends.forced_eos_token_ids = {favoured};
  ends.forced_bos_token_id = favoured + 1;
  ends.min_new_tokens = 10;
  const std::vector<Generation> forced = generate_batch(*model, {prompt, one_id}, 4, ends, {favoured});
  ASSERT_EQ(forced.size(), 2u);
  EXPECT_EQ(forced[0].ids,
            (std::vector<int64_t>{free_run.ids[0], free_run.ids[1], free_run.ids[2], favoured}));
  EXPECT_EQ(forced[0].stop_reason, "stop token");
  ASSERT_EQ(forced[1].ids.size(), 4u);
  EXPECT_EQ(forced[1].ids.front(), favoured + 1) << "forced after a one-id prompt";
  EXPECT_EQ(forced[1].ids.back(), favoured);
  for (const Generation& s : beam_search(*model, prompt, 4, beams, ends, {})) {
    ASSERT_EQ(s.ids.size(), 4u);
    EXPECT_EQ(s.ids.back(), favoured);
    EXPECT_NE(s.ids.front(), favoured + 1) << "not after a prompt of five ids";
  }
  // exponential_decay_length_penalty (2, 100): from the fourth new token the stop id's logit l
  // becomes l + 99 |l|, which ends the run there; the tokens before it are greedy's.
  SamplingOptions decay;
  decay.length_decay_start = 2;
  decay.length_decay_factor = 100;
  const Generation shortened = generate(*model, prompt, 6, decay, {favoured});
  EXPECT_EQ(shortened.ids,
            (std::vector<int64_t>{free_run.ids[0], free_run.ids[1], free_run.ids[2], favoured}));
  EXPECT_EQ(generate(*model, prompt, 6, SamplingOptions{}, {favoured}).ids, free_run.ids) << "the control";
  // Stop ids outside the vocabulary are never boosted (nor written to: beam search scores in place).
  const std::vector<Generation> outside = beam_search(*model, prompt, 4, beams, decay, {V, -1});
  EXPECT_EQ(outside.size(), 3u);
  SamplingOptions out_of_range;
  out_of_range.suppress_tokens = {V};
  EXPECT_THROW(generate(*model, prompt, 2, out_of_range, {}), Error);
  EXPECT_THROW(beam_search(*model, prompt, 2, beams, out_of_range, {}), Error);
}

// Without PyTorch: every sequence beam search returns has the score a full forward over it gives
// (its tokens' log-softmax summed, / new tokens^length_penalty), best first, and the cache's rows
// followed their beams (a wrong row would change the scores); stop ids end sequences with their
// reason; the options are checked.
TEST(Generate, BeamScoresAreTheFullForwardsLogProbabilities) {
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    const int64_t V = model->args().vocab_size;
    const std::vector<int64_t> prompt = {71, 600, 12, 5};
    const Generation greedy = generate(*model, prompt, 8, SamplingOptions{}, {});
    // (-12: the finished scores fall far below -1e9, where transformers' bookkeeping would rank them
    // under its empty slots and return none; every early_stopping mode returns four.)
    for (const auto& [length_penalty, stop, early] :
         std::vector<std::tuple<double, std::vector<int64_t>, EarlyStopping>>{
             {1.0, {}, EarlyStopping::Never},
             {0.7, {greedy.ids[3]}, EarlyStopping::Never},
             {-1.0, {greedy.ids[1]}, EarlyStopping::Never},
             {-12.0, {greedy.ids[1]}, EarlyStopping::Heuristic},
             {-12.0, {greedy.ids[1]}, EarlyStopping::Always}}) {
      const BeamSearchOptions beams{4, length_penalty, early, 4};
      const std::vector<Generation> got = beam_search(*model, prompt, 8, beams, SamplingOptions{}, stop);
      ASSERT_EQ(got.size(), 4u);
      for (size_t r = 0; r < got.size(); ++r) {
        std::vector<int64_t> all = prompt;
        all.insert(all.end(), got[r].ids.begin(), got[r].ids.end());
        Tensor logits;
        {
          autograd::NoGradGuard no_grad;
          logits = model->forward_logits(Tensor::from_vector(all, {1, int64_t(all.size())}));
        }
        double sum = 0;
        for (size_t k = 0; k < got[r].ids.size(); ++k) {
          const double* row = logits.data<double>() + int64_t(prompt.size() - 1 + k) * V;
          double top = row[0], z = 0;
          for (int64_t v = 0; v < V; ++v) top = std::max(top, row[v]);
          for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - top);
          sum += row[got[r].ids[k]] - top - std::log(z);
        }
        const double want = sum / std::pow(double(got[r].ids.size()), length_penalty);
        EXPECT_NEAR(*got[r].score, want, 1e-9) << "sequence " << r << " length penalty " << length_penalty;
        if (r > 0) {
          EXPECT_GE(*got[r - 1].score, *got[r].score) << "best first";
        }
        const bool ends_at_stop = !stop.empty() && got[r].ids.back() == stop[0];
        EXPECT_EQ(got[r].stop_reason, ends_at_stop ? "stop token" : "max new tokens");
        if (!ends_at_stop) {
          EXPECT_EQ(got[r].ids.size(), 8u);
        }
        for (size_t k = 0; k + 1 < got[r].ids.size(); ++k)
          EXPECT_TRUE(stop.empty() || got[r].ids[k] != stop[0]) << "a sequence went on after its stop id";
      }
    }
  }
  // One new token: the num_beams most likely ids, each its log-probability.
  {
    auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
    const std::vector<int64_t> prompt = {71, 600, 12, 5};
    const std::vector<Generation> one =
        beam_search(*model, prompt, 1, {3, 1.0, EarlyStopping::Heuristic, 3}, {}, {});
    ASSERT_EQ(one.size(), 3u);
    std::vector<int64_t> most_likely;
    const std::vector<std::pair<int64_t, double>> d = [&] {
      SamplingOptions o;
      o.temperature = 1;
      KVCache cache = model->kv_cache(1, 4);
      const Tensor logits =
          model->next_token_logits(Tensor::from_vector(prompt, {1, 4}), cache).to(DType::F32);
      return next_token_distribution(std::span<const float>(logits.data<float>(), size_t(logits.numel())), o);
    }();
    for (size_t r = 0; r < 3; ++r) {
      ASSERT_EQ(one[r].ids.size(), 1u);
      EXPECT_EQ(one[r].ids[0], d[r].first) << "sequence " << r;
      EXPECT_NEAR(*one[r].score, std::log(d[r].second), 1e-5) << "sequence " << r;
      EXPECT_EQ(one[r].stop_reason, "max new tokens");
    }
  }
  auto model = oracle_model("tiny_dense");
  auto error = [&](const BeamSearchOptions& beams, const SamplingOptions& processors) {
    try {
      beam_search(*model, {5, 6}, 4, beams, processors, {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      error({1, 1.0, EarlyStopping::Heuristic, 1}, {}).find("num_beams must be >= 2 (one beam is greedy"),
      std::string::npos);
  EXPECT_NE(error({3, 1.0, EarlyStopping::Heuristic, 4}, {})
                .find("num_return_sequences must be in [1, num_beams = 3], got 4"),
            std::string::npos);
  EXPECT_NE(error({3, std::nan(""), EarlyStopping::Heuristic, 1}, {}).find("length_penalty must be finite"),
            std::string::npos);
  SamplingOptions sampled;
  sampled.temperature = 0.8;
  sampled.top_p = 0;
  EXPECT_NE(error({3, 1.0, EarlyStopping::Heuristic, 1}, sampled).find("top_p must be in (0, 1]"),
            std::string::npos)
      << "beam sampling's warpers are checked";
}

// Prompt lookup decoding on the f64 oracle models: the same tokens as greedy search (and as sampling
// with the same seed), with the processors too and in a batch (its prompts then run one at a time),
// in fewer passes through the
// model where the text repeats: the prompt is a phrase said three times, and the tiny models go on
// repeating. A stop id the draft holds ends it there; a draft never runs past max_new_tokens.
TEST(Generate, PromptLookupDecodingGivesGreedysTokensInFewerPasses) {
  int64_t sampled_kept = 0;  // sampled draft tokens kept, over both models
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(name);
    auto model = load_hf_model(oracle_dir(name), DType::F64);
    std::vector<int64_t> prompt;
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t id : {17, 400, 2048, 5, 99, 1000, 12}) prompt.push_back(id);
    SamplingOptions plain, lookup;
    lookup.prompt_lookup_num_tokens = 6;
    const Generation want = generate(*model, prompt, 40, plain, {});
    const Generation got = generate(*model, prompt, 40, lookup, {});
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.stop_reason, want.stop_reason);
    EXPECT_GT(got.drafted, 0);
    EXPECT_GT(got.accepted, 0) << "no draft token was kept: the case tests little";
    EXPECT_EQ(got.passes + got.accepted, int64_t(got.ids.size()))
        << "one new token a pass, and each kept one";
    EXPECT_EQ(want.passes, int64_t(want.ids.size()));
    std::printf("%s: %zu tokens in %lld passes (%lld of %lld drafted tokens kept)\n", name.c_str(),
                got.ids.size(), (long long)got.passes, (long long)got.accepted, (long long)got.drafted);
    // With processors (the penalty and the n-gram rule read the sequence the kept drafts extend).
    plain.repetition_penalty = lookup.repetition_penalty = 1.3;
    plain.no_repeat_ngram_size = lookup.no_repeat_ngram_size = 4;
    EXPECT_EQ(generate(*model, prompt, 30, lookup, {}).ids, generate(*model, prompt, 30, plain, {}).ids);
    // A stop id: the run ends at it, as greedy's does.
    const std::vector<int64_t> stop = {want.ids[12]};
    plain = lookup = SamplingOptions{};
    lookup.prompt_lookup_num_tokens = 6;
    const Generation stopped = generate(*model, prompt, 40, lookup, stop);
    EXPECT_EQ(stopped.ids, generate(*model, prompt, 40, plain, stop).ids);
    EXPECT_EQ(stopped.stop_reason, "stop token");
    // max_new_tokens reached inside a draft's reach: exactly that many.
    EXPECT_EQ(generate(*model, prompt, 9, lookup, {}).ids,
              std::vector<int64_t>(want.ids.begin(), want.ids.begin() + 9));
    // A batch: each prompt's tokens as alone.
    const std::vector<std::vector<int64_t>> prompts = {prompt, {5, 99, 1000, 5, 99, 1000, 5}};
    const std::vector<Generation> rows = generate_batch(*model, prompts, 20, lookup, {});
    ASSERT_EQ(rows.size(), 2u);
    for (size_t r = 0; r < 2; ++r)
      EXPECT_EQ(rows[r].ids, generate(*model, prompts[r], 20, plain, {}).ids) << r;
    // Sampled: each position's draw takes the stream's next number, so the same seed gives the same
    // tokens, in a batch too (prompt r seeded seed + r, as without drafts); some drafts are kept.
    plain.temperature = lookup.temperature = 0.05;  // (the tiny models' logits are flat: peaked)
    plain.seed = lookup.seed = 21;
    const Generation sampled = generate(*model, prompt, 40, lookup, {});
    EXPECT_EQ(sampled.ids, generate(*model, prompt, 40, plain, {}).ids);
    sampled_kept += sampled.accepted;
    const std::vector<Generation> sampled_rows = generate_batch(*model, prompts, 20, lookup, {});
    const std::vector<Generation> plain_rows = generate_batch(*model, prompts, 20, plain, {});
    for (size_t r = 0; r < 2; ++r) EXPECT_EQ(sampled_rows[r].ids, plain_rows[r].ids) << r;
  }
  EXPECT_GT(sampled_kept, 0) << "no sampled draft token was kept: the sampled case tests little";
}

// Beam sampling (transformers' beam search with do_sample): with one new token, two beams and top-k
// 3, the best sequence returned is the likelier of the first two of the 3 ids drawn without
// replacement from softmax(log p / T) over the 3: id a (the likeliest) unless the draws were b, c
// (p_b p_c / (1 - p_b) + p_c p_b / (1 - p_c)), b exactly then. Over 3000 seeds each frequency is
// within 4.5 standard deviations of that. The same seed repeats its sequences, and each warper keeps
// at least two ids of a beam.
TEST(Generate, BeamSamplingDrawsTheCandidatesAsTransformersMultinomial) {
  auto model = load_hf_model(oracle_dir("tiny_dense"), DType::F64);
  const std::vector<int64_t> prompt = {17, 400, 2048, 5, 99};
  KVCache cache = model->kv_cache(1, 8);
  const Tensor logits =
      model->next_token_logits(Tensor::from_vector(prompt, {1, int64_t(prompt.size())}), cache);
  const double* l = logits.data<double>();
  const int64_t V = model->args().vocab_size;
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                    [&](int64_t x, int64_t y) { return l[x] > l[y]; });
  const double T = 2.0;
  double w[3], sum = 0;
  for (int i = 0; i < 3; ++i) sum += w[i] = std::exp((l[order[size_t(i)]] - l[order[0]]) / T);
  for (double& x : w) x /= sum;
  const double p_b = w[1] * w[2] / (1 - w[1]) + w[2] * w[1] / (1 - w[2]);  // first two drawn: b and c
  SamplingOptions o;
  o.temperature = T;
  o.top_k = 3;
  const BeamSearchOptions two{2, 1.0, EarlyStopping::Heuristic, 1};
  const int draws = 3000;
  int a = 0, b = 0;
  for (int seed = 0; seed < draws; ++seed) {
    o.seed = uint64_t(seed);
    const int64_t id = beam_search(*model, prompt, 1, two, o, {})[0].ids.at(0);
    a += id == order[0];
    b += id == order[1];
    ASSERT_TRUE(id == order[0] || id == order[1]) << "id " << id << " at seed " << seed;
  }
  const double sd = std::sqrt(p_b * (1 - p_b) / draws);
  EXPECT_NEAR(double(b) / draws, p_b, 4.5 * sd) << "p = " << w[0] << ", " << w[1] << ", " << w[2];
  EXPECT_EQ(a + b, draws);
  EXPECT_GT(b, 0) << "the case never draws the second id: it tests little";

  o.seed = 11;
  o.top_k = 50;
  const BeamSearchOptions three{3, 1.0, EarlyStopping::Heuristic, 3};
  const std::vector<Generation> once = beam_search(*model, prompt, 6, three, o, {}),
                                again = beam_search(*model, prompt, 6, three, o, {});
  ASSERT_EQ(once.size(), 3u);
  for (size_t r = 0; r < once.size(); ++r) {
    EXPECT_EQ(once[r].ids, again[r].ids);
    EXPECT_EQ(once[r].score, again[r].score);
  }
  bool differs = false;
  for (uint64_t seed = 12; seed < 20 && !differs; ++seed) {
    o.seed = seed;
    differs = beam_search(*model, prompt, 6, three, o, {})[0].ids != once[0].ids;
  }
  EXPECT_TRUE(differs) << "eight other seeds drew the same best sequence";
  // Each warper keeps at least max(2, 1 + stop ids) ids of a beam (transformers' min_tokens_to_keep
  // in beam sampling): top-k 1 draws as top-k 2 does (no stop ids), top-k 2 not as top-k 3.
  o.seed = 5;
  o.top_k = 1;
  const std::vector<Generation> k1 = beam_search(*model, prompt, 6, three, o, {});
  o.top_k = 2;
  const std::vector<Generation> k2 = beam_search(*model, prompt, 6, three, o, {});
  o.top_k = 3;
  const std::vector<Generation> k3 = beam_search(*model, prompt, 6, three, o, {});
  ASSERT_EQ(k1.size(), 3u);
  for (size_t r = 0; r < k1.size(); ++r) EXPECT_EQ(k1[r].ids, k2[r].ids) << "sequence " << r;
  bool three_differ = false;
  for (size_t r = 0; r < k1.size(); ++r) three_differ |= k3[r].ids != k2[r].ids;
  EXPECT_TRUE(three_differ) << "top-k 3 drew as top-k 2: the comparison tests nothing";
}

TEST(Generate, BadRequestsNameTheRule) {
  auto model = oracle_model("tiny_dense");
  const int64_t V = model->args().vocab_size, max_seq = model->args().max_seq_len;
  auto error = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error([&] { generate(*model, {}, 1, {}, {}); }).find("the prompt holds no token"), std::string::npos);
  EXPECT_NE(error([&] { generate(*model, {1, V}, 1, {}, {}); }).find("prompt token 1 is id " + std::to_string(V)),
            std::string::npos);
  EXPECT_NE(error([&] { generate(*model, {1}, 0, {}, {}); }).find("max_new_tokens must be >= 1"), std::string::npos);
  EXPECT_NE(error([&] { generate(*model, {1, 2}, max_seq - 1, {}, {}); }).find("max_seq_len"), std::string::npos);
  // No overflow past the bound: prompt + INT64_MAX new tokens is refused, not wrapped below it.
  EXPECT_NE(error([&] { generate(*model, {1}, INT64_MAX, {}, {}); }).find("max_seq_len"), std::string::npos);
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_NE(error([&] { o.validate(); }).find("temperature must be a finite number >= 0"), std::string::npos);
  o.temperature = std::nan("");
  EXPECT_NE(error([&] { o.validate(); }).find("temperature"), std::string::npos);
  o = {};
  o.top_k = -1;
  EXPECT_NE(error([&] { o.validate(); }).find("top_k must be >= 0"), std::string::npos);
  for (double p : {0.0, 1.5, double(NAN)}) {
    o = {};
    o.top_p = p;
    EXPECT_NE(error([&] { o.validate(); }).find("top_p must be in (0, 1]"), std::string::npos) << p;
  }
  for (double cut : {-0.1, 1.0, double(NAN)}) {
    o = {};
    o.epsilon_cutoff = cut;
    EXPECT_NE(error([&] { o.validate(); }).find("epsilon_cutoff must be in [0, 1)"), std::string::npos)
        << cut;
    o = {};
    o.eta_cutoff = cut;
    EXPECT_NE(error([&] { o.validate(); }).find("eta_cutoff must be in [0, 1)"), std::string::npos) << cut;
  }
  o = {};
  o.top_p = 1.0000001;  // named with the digits that tell it from 1
  EXPECT_NE(error([&] { o.validate(); }).find("got 1.0000001"), std::string::npos);
}

// ---- the sampler on hand-made logits

std::map<int64_t, double> frequencies(const std::vector<float>& logits, const SamplingOptions& o, int draws,
                                      const std::vector<bool>& allowed = {}) {
  std::mt19937_64 rng(o.seed);
  std::map<int64_t, double> f;
  for (int i = 0; i < draws; ++i) f[pick_next_token(logits, o, rng, allowed)] += 1.0 / draws;
  return f;
}

TEST(Sampler, GreedyTakesTheLargestLowestIdOnATieAndNeverNaNOrADisallowedId) {
  std::mt19937_64 rng(0);
  EXPECT_EQ(pick_next_token(std::vector<float>{1, 3, 3, 2}, {}, rng), 1);
  EXPECT_EQ(pick_next_token(std::vector<float>{1, NAN, 3, 2}, {}, rng), 2);
  EXPECT_EQ(pick_next_token(std::vector<float>{1, 3, 3, 2}, {}, rng, {true, false, false, true}), 3);
  EXPECT_THROW(pick_next_token(std::vector<float>{NAN, NAN}, {}, rng), Error);
  EXPECT_THROW(pick_next_token(std::vector<float>{1, 2}, {}, rng, {false, false}), Error);
}

// Probabilities 0.5, 0.3, 0.2 (and a disallowed id that would dominate): 40000 draws of a fixed
// seed land within 0.015 of each rule's distribution.
TEST(Sampler, TemperatureTopKAndTopPGiveTheirDistributions) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f), 50.0f};
  const std::vector<bool> allowed = {true, true, true, false};
  auto expect_distribution = [&](const SamplingOptions& o, std::vector<double> p, const char* what) {
    const std::map<int64_t, double> f = frequencies(logits, o, 40000, allowed);
    for (size_t id = 0; id < p.size(); ++id) {
      const double got = f.count(int64_t(id)) ? f.at(int64_t(id)) : 0.0;
      EXPECT_NEAR(got, p[id], 0.015) << what << ": id " << id;
    }
    EXPECT_EQ(f.count(3), 0u) << what << ": a disallowed id was drawn";
  };
  SamplingOptions o;
  o.temperature = 1;
  expect_distribution(o, {0.5, 0.3, 0.2}, "temperature 1");
  o.temperature = 2;  // p^(1/2), renormalised
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  expect_distribution(o, {std::sqrt(0.5) / z, std::sqrt(0.3) / z, std::sqrt(0.2) / z}, "temperature 2");
  o.temperature = 1;
  o.top_k = 2;
  expect_distribution(o, {0.625, 0.375, 0}, "top_k 2");
  o.top_k = 0;
  o.top_p = 0.6;  // 0.5 < 0.6 <= 0.8: the first two
  expect_distribution(o, {0.625, 0.375, 0}, "top_p 0.6");
  o.top_p = 0.4;  // the first alone reaches it
  expect_distribution(o, {1, 0, 0}, "top_p 0.4");
  o.top_p = 1;
  o.top_k = 1;
  o.temperature = 5;
  expect_distribution(o, {1, 0, 0}, "top_k 1");
}

// An infinite logit: +inf is certain (two share the mass), every logit -inf leaves nothing to tell
// the ids apart; inf - inf must not turn the softmax into NaN and the draw into the last id.
TEST(Sampler, InfiniteLogitsAreCertainOrEvenNeverNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplingOptions o;
  o.temperature = 1;
  auto f = frequencies({0.5f, inf, -1.0f, 2.0f}, o, 2000);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(f.count(1), 1u);
  o.top_k = 3;
  f = frequencies({0.5f, 3.0f, -1.0f, inf}, o, 2000);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(f.count(3), 1u);
  o.top_k = 0;
  f = frequencies({inf, 1.0f, inf}, o, 20000);
  EXPECT_NEAR(f[0], 0.5, 0.015);
  EXPECT_NEAR(f[2], 0.5, 0.015);
  EXPECT_EQ(f.count(1), 0u);
  f = frequencies({-inf, -inf, -inf, -inf}, o, 20000);
  for (int64_t id = 0; id < 4; ++id) EXPECT_NEAR(f[id], 0.25, 0.015) << id;
}

// The log-probability --logprobs and scoring report: the f64 log-softmax of the logits within 1e-6
// (f32 exponentials on vectors), over a vocabulary of every size the vector loops cut differently,
// with NaN logits left out (their own -inf) and -inf ones; a +inf logit takes the mass.
TEST(Sampler, TokenLogProbabilityIsTheLogSoftmax) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (const size_t V : {size_t(1), size_t(7), size_t(255), size_t(256), size_t(257), size_t(151936)}) {
    std::vector<float> logits(V);
    for (float& l : logits) l = normal(rng);
    if (V > 10) {
      logits[3] = nan;
      logits[5] = -inf;
    }
    double top = -std::numeric_limits<double>::infinity(), z = 0;
    for (float l : logits)
      if (!std::isnan(l)) top = std::max(top, double(l));
    for (float l : logits)
      if (!std::isnan(l)) z += std::exp(double(l) - top);
    std::vector<size_t> ids = {3, 5};  // the NaN and the -inf logit (V > 10)
    for (size_t id = 0; id < V; id += std::max<size_t>(1, V / 50)) ids.push_back(id);
    for (const size_t id : ids) {
      if (id >= V) continue;
      const double want = std::isnan(logits[id]) ? -std::numeric_limits<double>::infinity()
                                                 : double(logits[id]) - top - std::log(z);
      const double got = token_log_probability(logits, int64_t(id));
      if (std::isinf(want))
        EXPECT_EQ(got, want) << "V " << V << " id " << id;
      else
        EXPECT_NEAR(got, want, 1e-6) << "V " << V << " id " << id;
    }
  }
  EXPECT_EQ(token_log_probability(std::vector<float>{0.5f, inf, -1.f}, 1), 0.0);
  EXPECT_EQ(token_log_probability(std::vector<float>{0.5f, inf, -1.f}, 0), -inf);
  EXPECT_NEAR(token_log_probability(std::vector<float>{inf, 1.f, inf}, 2), -std::log(2.0), 1e-15);
  EXPECT_NEAR(token_log_probability(std::vector<float>{-inf, -inf, -inf, -inf}, 1), -std::log(4.0), 1e-15);
  EXPECT_THROW(token_log_probability(std::vector<float>{1.f}, 1), Error);
}

TEST(Sampler, TheSameSeedGivesTheSameDrawsAndAnotherSeedOthers) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  auto draws = [&](uint64_t seed) {
    SamplingOptions o;
    o.temperature = 1;
    o.seed = seed;
    std::mt19937_64 rng(seed);
    std::vector<int64_t> d;
    for (int i = 0; i < 50; ++i) d.push_back(pick_next_token(logits, o, rng));
    return d;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
}

// pick_next_token sorts only as much of the order as its walks reach (temperature, top-k, top-p,
// min-p): every draw is the one next_token_distribution's list gives for the same uniform number,
// over vocabularies of 40 to 50000 ids, peaked and flat (the walk then reaches deep: several chunks),
// with ties, -inf logits, disallowed ids and a repetition penalty.
TEST(Sampler, TheDrawIsTheDistributionsForTheSameNumber) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));  // a failure can be replayed
  std::mt19937_64 gen(seed);
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p, min_p;
  };
  const std::vector<Case> combos = {{1, 0, 1, 0},       {0.7, 0, 0.9, 0},   {1.5, 0, 1, 0.05}, {1, 300, 1, 0},
                                    {2, 5000, 0.97, 0}, {0.3, 0, 0.5, 0.2}, {1, 0, 0.999, 0},  {4, 0, 1, 0}};
  size_t draws = 0, deep = 0;
  for (const int64_t V : {int64_t(40), int64_t(3000), int64_t(50000)})
    for (const double spread : {0.5, 6.0})
      for (const Case& c : combos) {
        std::normal_distribution<float> normal(0.f, float(spread));
        std::vector<float> logits(static_cast<size_t>(V));
        for (float& l : logits) l = std::round(normal(gen) * 64) / 64;  // ties among them
        logits[size_t(V / 3)] = -std::numeric_limits<float>::infinity();
        std::vector<bool> allowed(static_cast<size_t>(V), true);
        allowed[size_t(V / 2)] = false;
        const std::vector<int64_t> sequence = {1, 2, 2, V - 1};
        SamplingOptions o;
        o.temperature = c.temperature;
        o.top_k = c.top_k;
        o.top_p = c.top_p;
        o.min_p = c.min_p;
        o.repetition_penalty = 1.3;
        const std::vector<std::pair<int64_t, double>> d =
            next_token_distribution(logits, o, allowed, sequence);
        for (int k = 0; k < 40; ++k) {
          const uint64_t seed = gen();
          std::mt19937_64 a(seed), b(seed);
          const double u = std::uniform_real_distribution<double>(0.0, 1.0)(a);
          size_t want = d.size() - 1;
          double run = 0;
          for (size_t i = 0; i < d.size(); ++i)
            if ((run += d[i].second) > u) {
              want = i;
              break;
            }
          ASSERT_EQ(pick_next_token(logits, o, b, allowed, sequence), d[want].first)
              << "V " << V << " spread " << spread << " temperature " << c.temperature << " top_k " << c.top_k
              << " top_p " << c.top_p << " min_p " << c.min_p << " u " << u;
          ++draws;
          deep += want >= 256;
        }
      }
  EXPECT_EQ(draws, 3u * 2 * 8 * 40);
  EXPECT_GE(deep, 100u) << "few draws landed past the first sorted chunk: the later chunks are untested";
}

}  // namespace
}  // namespace titan::qwen3

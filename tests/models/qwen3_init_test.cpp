// Random initialization (issue #3 item 4) and `titan info` parameter counts.
//
// First-step loss at random init. After the final RMSNorm (weight 1) every position's hidden
// vector x has |x|^2 = D. The lm_head rows W_v are i.i.d. N(0, std^2) and independent of x
// (untied; tied: x contains the *input* token's row, one of V logits, negligible), so each logit
// z_v = <x, W_v> ~ N(0, s^2) with s^2 = D * std^2. Then
//   E[logsumexp_v z_v] = ln(V * E[e^z]) + O(1/V) = ln V + s^2 / 2,     E[z_target] = 0,
//   E[loss] = ln V + s^2 / 2,   per-token loss std ~ s (from z_target), so the mean over N
//   targets has std s / sqrt(N). We accept 4 standard deviations.
// HF scheme (std 0.02):   s^2 = 0.0004 D  -> 0.6B dims (D 1024): 11.9313 + 0.2048 = 12.136
//                                           debugmodel (D 256):  11.9313 + 0.0512 = 11.983
// torchtitan (output std D^-0.5 truncated at 3 std, variance 0.9733 of it; a logit sums D such
// terms, so it is normal again): s^2 = 0.9733 -> 12.418 at any D (torchtitan's recipe logs ~12.4).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "models/small_args.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

using namespace titan;
using namespace titan::testing;
using qwen3::InitScheme;
using qwen3::ModelArgs;
using qwen3::Qwen3Model;

namespace {

struct Batch {
  Tensor ids, targets;
  int64_t n_targets;
};

// Uniformly random tokens; targets are the next token (-100 at the last position).
Batch random_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
  std::vector<int64_t> ids(size_t(B * S)), targets(size_t(B * S), -100);
  for (auto& t : ids) t = tok(rng);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + 1 < S; ++s) targets[size_t(b * S + s)] = ids[size_t(b * S + s + 1)];
  return {Tensor::from_vector(ids, {B, S}), Tensor::from_vector(targets, {B, S}), B * (S - 1)};
}

// Initializes `model` with the scheme and returns the loss on `batch` (forward only).
double first_step_loss(Qwen3Model& model, InitScheme scheme, const Batch& batch, const char* what) {
  const ModelArgs& args = model.args();
  model.initialize(7, scheme);
  autograd::NoGradGuard no_grad;
  const double loss = model.forward_loss(batch.ids, batch.targets).loss.item();
  // The lm_head variance each scheme gives: HF 0.02^2 everywhere, torchtitan D^-1 for the output,
  // less the 2.67 % its truncation at 3 std cuts.
  const double out_var = scheme == InitScheme::HuggingFace ? 0.02 * 0.02 : 0.9733 / double(args.dim);
  const double s2 = double(args.dim) * out_var;
  const double expected = std::log(double(args.vocab_size)) + s2 / 2;
  const double tol = 4 * std::sqrt(s2 / double(batch.n_targets));
  std::printf("%s: first-step loss %.4f, expected ln V + s^2/2 = %.4f +- %.3f (s^2 = %.4f, %ld targets)\n",
              what, loss, expected, tol, s2, batch.n_targets);
  EXPECT_NEAR(loss, expected, tol) << what;
  EXPECT_GT(loss, 11.9) << what;
  EXPECT_LT(loss, 12.6) << what;
  return loss;
}

ModelArgs small_0_6b() {
  ModelArgs a = qwen3::flavor("0.6B");
  qwen3::apply_override(a, "n_layers", "2");
  return a;
}

std::vector<float> values(Qwen3Model& m) {
  std::vector<float> out;
  for (nn::Param* p : m.params()) {
    const float* v = p->value.data<float>();
    out.insert(out.end(), v, v + p->value.numel());
  }
  return out;
}

double sample_std(const nn::Param& p) {
  const float* v = p.value.data<float>();
  const int64_t n = p.value.numel();
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(v[i]) * v[i];
  return std::sqrt(ss / double(n));
}

ModelArgs tiny() {
  ModelArgs a = qwen3::flavor("debugmodel_moe");
  for (auto [k, v] : {std::pair{"vocab_size", "1000"},
                      {"n_layers", "3"},
                      {"num_experts", "4"},
                      {"top_k", "2"},
                      {"moe_hidden_dim", "64"},
                      {"hidden_dim", "256"},
                      {"mlp_only_layers", "[1]"}})
    qwen3::apply_override(a, k, v);
  return a;
}

}  // namespace

// torchtitan's debug model with both schemes (one model: the second initialize overwrites all).
TEST(Qwen3Init, DebugmodelFirstStepLossHfAndTorchtitanSchemes) {
  Qwen3Model model(qwen3::flavor("debugmodel"));
  Batch batch = random_batch(2, 129, model.args().vocab_size, 1);
  double hf = first_step_loss(model, InitScheme::HuggingFace, batch, "debugmodel, HF init");
  double tt = first_step_loss(model, InitScheme::Torchtitan, batch, "debugmodel, torchtitan init");
  EXPECT_GT(tt, hf);  // s^2 = 0.97 vs 0.1: the expectations are 0.44 apart, 8 tolerances
}

// The real vocabulary and width of Qwen3-0.6B (what the loss depends on); 2 layers keep it fast.
TEST(Qwen3Init, Qwen3_0_6BDimsFirstStepLoss) {
  Qwen3Model model(small_0_6b());
  first_step_loss(model, InitScheme::HuggingFace, random_batch(4, 129, model.args().vocab_size, 2),
                  "0.6B dims, HF init");
}

// Parameters are drawn in parallel chunks; a value is a function of (seed, name, index) only, so
// the thread count changes nothing (tiny()'s 256k-element embedding spans 4 chunks).
TEST(Qwen3Init, WeightsDoNotDependOnThreadCount) {
  Qwen3Model one(tiny()), many(tiny());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  one.initialize(42);
  omp_set_num_threads(std::max(threads, 3));
  many.initialize(42);
  omp_set_num_threads(threads);
  std::vector<float> a = values(one), b = values(many);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// The draws are independent standard normals: torchtitan's embedding is N(0, 1), 256k values.
// Each moment is checked at 4 standard errors of its estimate: the mean (1/sqrt(n)), the variance
// (sqrt(2/n)), the fourth moment (3; its estimate's std is sqrt(96/n)), the share beyond 2 std
// (4.55 %), and the correlation of neighbours, both within a polar-method pair (2i, 2i+1) and across
// pairs (2i+1, 2i+2).
TEST(Qwen3Init, DrawsAreIndependentStandardNormals) {
  Qwen3Model model(tiny());
  model.initialize(11, InitScheme::Torchtitan);
  const nn::Param& emb = *model.find_param("tok_embeddings.weight");
  const float* v = emb.value.data<float>();
  const int64_t n = emb.value.numel();
  ASSERT_EQ(emb.std, 1.0);
  double sum = 0, sum2 = 0, sum4 = 0, beyond2 = 0, within_pair = 0, across_pairs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = v[i];
    sum += x, sum2 += x * x, sum4 += x * x * x * x, beyond2 += std::abs(x) > 2;
    if (i + 1 < n) (i % 2 ? across_pairs : within_pair) += x * v[i + 1];
  }
  const double N = double(n), se = 1 / std::sqrt(N);
  EXPECT_NEAR(sum / N, 0, 4 * se);
  EXPECT_NEAR(sum2 / N, 1, 4 * std::sqrt(2.0) * se);
  EXPECT_NEAR(sum4 / N, 3, 4 * std::sqrt(96.0) * se);
  const double p2 = 0.0455;
  EXPECT_NEAR(beyond2 / N, p2, 4 * std::sqrt(p2 * (1 - p2)) * se);
  EXPECT_NEAR(within_pair / (N / 2), 0, 4 * std::sqrt(2.0) * se);
  EXPECT_NEAR(across_pairs / (N / 2), 0, 4 * std::sqrt(2.0) * se);
}

TEST(Qwen3Init, SameSeedSameWeightsOtherSeedOtherWeights) {
  Qwen3Model a(tiny()), b(tiny()), c(tiny());
  a.initialize(42);
  b.initialize(42);
  c.initialize(43);
  std::vector<float> va = values(a), vb = values(b), vc = values(c);
  ASSERT_EQ(va.size(), size_t(a.num_params()));
  EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)));
  // Every randomly drawn parameter differs between seeds; norms are 1 for both.
  for (nn::Param* p : a.params()) {
    nn::Param* q = c.find_param(p->name);
    int64_t same = 0;
    for (int64_t i = 0; i < p->value.numel(); ++i)
      same += p->value.data<float>()[i] == q->value.data<float>()[i];
    if (p->init == nn::Init::Ones)
      EXPECT_EQ(same, p->value.numel()) << p->name;
    else
      EXPECT_LT(same, 3) << p->name << " barely changed with the seed";
  }
}

TEST(Qwen3Init, SchemesSetTheDocumentedStandardDeviations) {
  Qwen3Model hf(tiny()), tt(tiny());
  hf.initialize(5, InitScheme::HuggingFace);
  tt.initialize(5, InitScheme::Torchtitan);
  const double D = double(hf.args().dim);
  for (nn::Param* p : hf.params()) {
    if (p->init == nn::Init::Ones) continue;
    EXPECT_NEAR(sample_std(*p), 0.02, 0.002) << "HF: " << p->name;
  }
  // torchtitan: wo, w2, w3 (dense and experts) and the router at 0.02 / sqrt(2 (layer + 1)); the
  // embedding at 1; the output at D^-0.5 truncated at 3 std (a truncated normal's std is 0.9866 of
  // the untruncated one's); everything else 0.02.
  int64_t routers = 0;
  for (int64_t i = 0; i < tt.args().n_layers; ++i) {
    const double scaled = 0.02 / std::sqrt(2.0 * double(i + 1));
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
                          "moe.router.gate.weight", "moe.experts.w2", "moe.experts.w3"})
      if (nn::Param* prm = tt.find_param(p + n)) {
        EXPECT_NEAR(sample_std(*prm), scaled, 0.1 * scaled) << p + n;
        routers += std::string(n) == "moe.router.gate.weight";
      }
    EXPECT_NEAR(sample_std(*tt.find_param(p + "attention.wq.weight")), 0.02, 0.002);
  }
  EXPECT_EQ(routers, 2);  // the MoE layers of tiny()
  ASSERT_FALSE(tt.args().tie_embeddings);
  EXPECT_NEAR(sample_std(*tt.find_param("tok_embeddings.weight")), 1.0, 0.02);
  const nn::Param& out = *tt.find_param("output.weight");
  const double out_std = 1 / std::sqrt(D);
  EXPECT_NEAR(sample_std(out), 0.9866 * out_std, 0.02 * out_std);
  const float* v = out.value.data<float>();
  const float largest = std::abs(*std::max_element(
      v, v + out.value.numel(), [](float a, float b) { return std::abs(a) < std::abs(b); }));
  EXPECT_LE(largest, 3 * out_std);
  EXPECT_GT(largest,
            2.9 * out_std);  // 256k draws reach the bound's neighbourhood: the tails are cut, not scaled
  // Tied, the output's init is the embedding's (the output wins).
  ModelArgs tied_args = tiny();
  qwen3::apply_override(tied_args, "tie_embeddings", "true");
  Qwen3Model tied(tied_args);
  tied.initialize(5, InitScheme::Torchtitan);
  EXPECT_EQ(tied.find_param("output.weight"), nullptr);
  EXPECT_NEAR(sample_std(*tied.find_param("tok_embeddings.weight")), 0.9866 * out_std, 0.02 * out_std);
}

// initialize(seed, scheme) should depend on (seed, scheme) only, not on an earlier call.
TEST(Qwen3Init, ReinitializingWithAnotherSchemeIsTheSameAsAFreshModel) {
  Qwen3Model fresh(tiny()), reused(tiny());
  fresh.initialize(9, InitScheme::HuggingFace);
  reused.initialize(9, InitScheme::Torchtitan);
  reused.initialize(9, InitScheme::HuggingFace);
  for (nn::Param* p : fresh.params()) {
    nn::Param* q = reused.find_param(p->name);
    EXPECT_EQ(0, std::memcmp(p->value.raw_data(), q->value.raw_data(), size_t(p->value.numel()) * 4))
        << p->name << " keeps the previous scheme's init (std " << q->std << ")";
  }
}

// Parameter counts computed here from the published shapes (Qwen3 config.json files):
// embedding V*D (+ lm_head V*D when untied) + final norm D, and per layer q/o projections
// 2*D*H*hd, k/v 2*D*KV*hd, q/k norms 2*hd, two RMSNorms 2*D, and the MLP 3*D*F or the MoE
// router E*D + experts 3*E*D*F_moe (active per token: top_k of E experts).
// 0.6B: 596,049,920 (the model card's 0.6B, 0.44B without the embedding); 30B-A3B:
// 30,532,122,624 total, 3,353,032,704 active (the card's 30.5B / 3.3B).
TEST(Qwen3Info, ParameterCountsOfPublishedShapes) {
  const int64_t V = 151936;
  auto count = [&](int64_t D, int64_t L, int64_t H, int64_t KV, int64_t hd, int64_t F, bool tied, int64_t E,
                   int64_t k, int64_t Fm, bool active) {
    int64_t per_layer = 2 * D * H * hd + 2 * D * KV * hd + 2 * hd + 2 * D +
                        (E ? E * D + 3 * (active ? k : E) * D * Fm : 3 * D * F);
    return V * D * (tied ? 1 : 2) + D + L * per_layer;
  };
  const int64_t dense_06b = count(1024, 28, 16, 8, 128, 3072, true, 0, 0, 0, false);
  const int64_t moe_total = count(2048, 48, 32, 4, 128, 0, false, 128, 8, 768, false);
  const int64_t moe_active = count(2048, 48, 32, 4, 128, 0, false, 128, 8, 768, true);
  EXPECT_EQ(dense_06b, 596049920);
  EXPECT_EQ(moe_total, 30532122624);
  EXPECT_EQ(moe_active, 3353032704);

  EXPECT_EQ(qwen3::flavor("0.6B").num_params(), dense_06b);
  EXPECT_EQ(qwen3::flavor("30B-A3B").num_params(), moe_total);
  EXPECT_EQ(qwen3::flavor("30B-A3B").num_active_params(), moe_active);

  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " info --flavor 0.6B", &out), 0) << out;
  EXPECT_NE(out.find("parameters: " + std::to_string(dense_06b) + " total"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run_command(titan_binary().string() + " info --flavor 30B-A3B", &out), 0) << out;
  EXPECT_NE(out.find("parameters: " + std::to_string(moe_total) + " total, " + std::to_string(moe_active) +
                     " active per token"),
            std::string::npos)
      << out;
  // Integer options are whole integers; the dtype is one training computes in.
  for (const char* bad : {" info --flavor 0.6B --seq 1e3", " info --flavor 0.6B --seq 512abc",
                          " info --flavor 0.6B --batch 2.5", " info --flavor 0.6B --batch 0",
                          " info --flavor 0.6B --dtype float16", " info --flavor 0.6B --seq 8 --seq 16"}) {
    EXPECT_NE(run_command(titan_binary().string() + bad + " 2>&1", &out), 0) << bad << ": " << out;
    EXPECT_NE(out.find("titan info"), std::string::npos) << bad << ": " << out;
  }
  // The two forms do not mix: a --flavor beside --config is named as such.
  EXPECT_NE(run_command(titan_binary().string() + " info --flavor 0.6B --config " +
                            (source_dir() / "configs" / "debugmodel.toml").string() + " 2>&1",
                        &out),
            0);
  EXPECT_NE(out.find("--flavor belongs to `titan info --flavor | --model-path`"), std::string::npos) << out;
}

// pad_token_id (transformers' padding_idx): random init zeroes that embedding row under either scheme
// (a tied lm_head shares it; an untied one keeps its row), and the lookup gives it no gradient, so
// an untied model's row gets exactly none while a tied one's gets the lm_head's part alone.
TEST(Qwen3Init, PadTokenIdRowStartsAtZeroAndGetsNoGradientFromTheLookup) {
  const int64_t pad = 7;
  const Batch batch = [&] {
    Batch b = random_batch(2, 24, 1000, 5);
    std::vector<int64_t> ids(size_t(b.ids.numel()));
    std::memcpy(ids.data(), b.ids.data<int64_t>(), ids.size() * sizeof(int64_t));
    for (size_t i = 0; i < ids.size(); i += 3) ids[i] = pad;  // padding among the inputs
    b.ids = Tensor::from_vector(ids, b.ids.shape());
    return b;
  }();
  auto row = [](const Tensor& t, int64_t r) { return t.narrow(0, r, 1).to_vector(); };
  auto all_zero = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x == 0; });
  };
  for (bool tied : {false, true})
    for (InitScheme scheme : {InitScheme::HuggingFace, InitScheme::Torchtitan}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") +
                   (scheme == InitScheme::HuggingFace ? ", huggingface init" : ", torchtitan init"));
      // The embedding row's gradient after one backward, with and without the padding_idx.
      auto pad_row_grad = [&](int64_t pad_token_id) {
        ModelArgs a = small_args(1, false);
        a.tie_embeddings = tied;
        a.pad_token_id = pad_token_id;
        Qwen3Model model(a, DType::F32);
        model.initialize(7, scheme);
        const Tensor& table = model.find_param("tok_embeddings.weight")->value;
        EXPECT_EQ(all_zero(row(table, pad)), pad_token_id == pad) << "the padding row at init";
        EXPECT_FALSE(all_zero(row(table, pad + 1)));
        if (!tied) {
          EXPECT_FALSE(all_zero(row(model.find_param("output.weight")->value, pad)));
        }
        autograd::backward(model.forward_loss(batch.ids, batch.targets).loss);
        return row(model.find_param("tok_embeddings.weight")->grad(), pad);
      };
      const std::vector<double> padded = pad_row_grad(pad), unpadded = pad_row_grad(-1);
      EXPECT_FALSE(all_zero(unpadded));
      if (tied) {
        EXPECT_FALSE(all_zero(padded)) << "the tied lm_head's gradient must stay";
        EXPECT_NE(padded, unpadded) << "the lookup's part must be gone";
      } else {
        EXPECT_TRUE(all_zero(padded));
      }
    }
}

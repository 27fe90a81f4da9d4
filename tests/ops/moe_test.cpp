#include "titan/ops/moe/moe.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/embedding/embedding.h"

using namespace titan;
using namespace titan::testing;

namespace {

// Logits whose softmax never picks `avoid` (it sits 8 below everything else) and with no near-ties
// among the rest, so finite differences do not flip the selection.
Tensor biased_logits(int64_t T, int64_t E, DType dt, uint64_t seed, int64_t avoid) {
  auto v = random_tensor({T, E}, DType::F64, seed, -2.0, 2.0).to_vector();
  for (int64_t t = 0; t < T; ++t) v[size_t(t * E + avoid)] -= 8.0;
  return Tensor::from_vector(v, {T, E}, dt);
}

std::vector<Tensor> experts_fn(const std::vector<Tensor>& in) {
  return {ops::moe_experts(in[0], in[1], in[2], in[3], in[4], in[5])};
}

// Expert weights scaled like a trained layer (|w| ~ D^-1/2) so activations stay O(1).
struct ExpertWeights {
  Tensor gate, up, down;
};
ExpertWeights expert_weights(int64_t E, int64_t F, int64_t D, DType dt, uint64_t seed) {
  double sd = 1.7 / std::sqrt(double(D)), sf = 1.7 / std::sqrt(double(F));
  return {random_tensor({E, F, D}, dt, seed, -sd, sd), random_tensor({E, F, D}, dt, seed + 1, -sd, sd),
          random_tensor({E, D, F}, dt, seed + 2, -sf, sf)};
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// router_topk

TEST(RouterTopk, SelectsTopKOfSoftmaxAndRenormalises) {
  const int64_t T = 7, E = 5, k = 3;
  Tensor logits = random_tensor({T, E}, DType::F32, 11, -3, 3);
  for (bool renorm : {false, true}) {
    auto out = ops::router_topk(logits, k, renorm);
    auto l = logits.to_vector(), p = out.probs.to_vector(), w = out.weights.to_vector();
    auto idx = out.indices.tensor().to_vector(), counts = out.counts.to_vector();
    std::vector<double> expect_counts(E, 0);
    for (int64_t t = 0; t < T; ++t) {
      double m = *std::max_element(l.begin() + t * E, l.begin() + t * E + E), s = 0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(l[t * E + e] - m);
      std::vector<int64_t> order(E);
      for (int64_t e = 0; e < E; ++e) {
        order[e] = e;
        EXPECT_NEAR(p[t * E + e], std::exp(l[t * E + e] - m) / s, 1e-6);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return l[t * E + a] > l[t * E + b]; });
      double sel = 0;
      for (int64_t j = 0; j < k; ++j) sel += p[t * E + order[j]];
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(idx[t * k + j], order[j]) << "token " << t << " slot " << j;
        EXPECT_NEAR(w[t * k + j], p[t * E + order[j]] / (renorm ? sel : 1.0), 1e-6);
        expect_counts[order[j]] += 1;
      }
    }
    EXPECT_EQ(counts, expect_counts);
    EXPECT_EQ(out.weights.dtype(), DType::F32);
    EXPECT_EQ(out.probs.dtype(), DType::F32);
  }
}

TEST(RouterTopk, TiesPickLowerIndexFirst) {
  Tensor logits = Tensor::from_vector(std::vector<float>{1, 2, 2, 0, 2, 1}, {1, 6});
  auto out = ops::router_topk(logits, 4, false);
  EXPECT_EQ(out.indices.tensor().to_vector(), (std::vector<double>{1, 2, 4, 0}));
}

TEST(RouterTopk, ExpertBiasChangesSelectionNotWeights) {
  const int64_t T = 6, E = 4, k = 2;
  Tensor logits = biased_logits(T, E, DType::F32, 3, 2);  // expert 2 never chosen without bias
  Tensor bias = Tensor::from_vector(std::vector<float>{0, 0, 10, 0}, {E});
  auto plain = ops::router_topk(logits, k, false);
  auto biased = ops::router_topk(logits, k, false, bias);
  EXPECT_EQ(plain.counts.to_vector()[2], 0);
  EXPECT_EQ(biased.counts.to_vector()[2], T);
  EXPECT_EQ(max_abs_diff(plain.probs, biased.probs), 0.0);
  auto p = biased.probs.to_vector(), w = biased.weights.to_vector();
  auto idx = biased.indices.tensor().to_vector();
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(idx[t * k], 2);
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(w[t * k + j], p[t * E + int64_t(idx[t * k + j])]);
  }
}

TEST(RouterTopk, GradientMatchesFiniteDifferences) {
  Tensor logits = random_tensor({5, 4}, DType::F64, 21, -2, 2);
  Tensor bias = Tensor::from_vector(std::vector<float>{0.f, 0.3f, 0.f, -0.2f}, {4});
  for (bool renorm : {false, true}) {
    SCOPED_TRACE(renorm ? "renormalize" : "raw weights");
    auto weights_only = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::router_topk(in[0], 2, renorm).weights};
    };
    auto probs_only = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::router_topk(in[0], 2, renorm).probs};
    };
    auto both = [&](const std::vector<Tensor>& in) {
      auto o = ops::router_topk(in[0], 2, renorm, bias);
      return std::vector<Tensor>{o.weights, o.indices.tensor(), o.probs, o.counts};
    };
    expect_gradcheck(weights_only, {logits});
    expect_gradcheck(probs_only, {logits});
    expect_gradcheck(both, {logits});
  }
}

TEST(RouterTopk, Bf16LogitsGiveF32Outputs) {
  Tensor l32 = random_tensor({9, 6}, DType::F32, 5, -2, 2);
  Tensor l16 = l32.to(DType::BF16);
  auto a = ops::router_topk(l16, 2, true), b = ops::router_topk(l16.to(DType::F32), 2, true);
  EXPECT_EQ(a.weights.dtype(), DType::F32);
  EXPECT_EQ(max_abs_diff(a.weights, b.weights), 0.0);
  EXPECT_EQ(a.indices.tensor().to_vector(), b.indices.tensor().to_vector());
}

TEST(RouterTopk, BadArgumentsNameOpAndShapes) {
  Tensor logits = Tensor::zeros({3, 4}, DType::F32);
  std::string m = error_of([&] { ops::router_topk(logits, 5, true); });
  EXPECT_NE(m.find("router_topk"), std::string::npos) << m;
  EXPECT_NE(m.find("k=5"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[3, 4]"), std::string::npos) << m;
  m = error_of([&] { ops::router_topk(logits, 2, true, Tensor::zeros({3}, DType::F32)); });
  EXPECT_NE(m.find("expert_bias f32[3]"), std::string::npos) << m;
  m = error_of([&] { ops::router_topk(Tensor::zeros({12}, DType::F32), 2, true); });
  EXPECT_NE(m.find("f32[12]"), std::string::npos) << m;
}

// ------------------------------------------------------------------------------------------------
// moe_aux_loss

TEST(MoeAuxLoss, MatchesOneHotFormulaAndGradient) {
  const int64_t E = 4, k = 2;
  Tensor l0 = random_tensor({5, E}, DType::F64, 31, -2, 2), l1 = random_tensor({3, E}, DType::F64, 32, -2, 2);
  auto r0 = ops::router_topk(l0, k, true), r1 = ops::router_topk(l1, k, true);
  // Independent formula, as in transformers / qwen3_ref.py: concatenate the layers' tokens,
  // one_hot(idx).mean(0) [k, E] times probs.mean(0), summed, times E.
  std::vector<double> frac(k * E, 0), pmean(E, 0);
  const double N = 8;
  for (auto* r : {&r0, &r1}) {
    auto idx = r->indices.tensor().to_vector(), p = r->probs.to_vector();
    for (size_t i = 0; i < idx.size(); ++i) frac[(i % k) * E + size_t(idx[i])] += 1 / N;
    for (size_t i = 0; i < p.size(); ++i) pmean[i % E] += p[i] / N;
  }
  double expect = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) expect += frac[j * E + e] * pmean[e];
  expect *= E;
  Tensor aux = ops::moe_aux_loss({r0.probs, r1.probs}, {r0.indices, r1.indices}, E, k);
  EXPECT_EQ(aux.shape(), Shape({1}));
  EXPECT_NEAR(aux.item(), expect, 1e-12);

  Tensor i0 = r0.indices.tensor(), i1 = r1.indices.tensor();
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::moe_aux_loss({in[0], in[1]}, {i0, i1}, E, k)};
      },
      {r0.probs.detach(), r1.probs.detach()});
  // Through the router: the selection is constant, the probabilities carry the gradient.
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        auto a = ops::router_topk(in[0], k, true), b = ops::router_topk(in[1], k, true);
        return std::vector<Tensor>{ops::moe_aux_loss({a.probs, b.probs}, {a.indices, b.indices}, E, k)};
      },
      {l0, l1});
}

// transformers' load_balancing_loss_func under an attention_mask: the fractions and the mean
// probabilities are over the tokens the mask keeps (the same tokens in every layer), so padding
// neither counts nor gets a gradient.
TEST(MoeAuxLoss, CountedTokensFollowTheMaskedFormula) {
  const int64_t E = 4, k = 2, T = 7;
  const std::vector<ops::TokenRange> counted = {{1, 3}, {4, 7}};
  const std::vector<int> kept = {0, 1, 1, 0, 1, 1, 1};  // the attention mask of those ranges
  Tensor l0 = random_tensor({T, E}, DType::F64, 41, -2, 2), l1 = random_tensor({T, E}, DType::F64, 42, -2, 2);
  auto r0 = ops::router_topk(l0, k, true), r1 = ops::router_topk(l1, k, true);
  std::vector<double> frac(k * E, 0), pmean(E, 0);
  const double N = 2 * 5;  // kept tokens of both layers
  for (auto* r : {&r0, &r1}) {
    auto idx = r->indices.tensor().to_vector(), p = r->probs.to_vector();
    for (size_t i = 0; i < idx.size(); ++i) frac[(i % k) * E + size_t(idx[i])] += kept[i / k] / N;
    for (size_t i = 0; i < p.size(); ++i) pmean[i % E] += kept[i / E] * p[i] / N;
  }
  double expect = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) expect += frac[j * E + e] * pmean[e];
  expect *= E;
  const double all = ops::moe_aux_loss({r0.probs, r1.probs}, {r0.indices, r1.indices}, E, k).item();
  const double masked =
      ops::moe_aux_loss({r0.probs, r1.probs}, {r0.indices, r1.indices}, E, k, counted).item();
  EXPECT_NEAR(masked, expect, 1e-12);
  EXPECT_GT(std::fabs(masked - all), 1e-3) << "the mask should change the loss";

  Tensor i0 = r0.indices.tensor(), i1 = r1.indices.tensor();
  auto masked_fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::moe_aux_loss({in[0], in[1]}, {i0, i1}, E, k, counted)};
  };
  expect_gradcheck(masked_fn, {r0.probs.detach(), r1.probs.detach()});
  // The tokens left out get exactly zero.
  Tensor p0 = r0.probs.detach().set_requires_grad(true), p1 = r1.probs.detach().set_requires_grad(true);
  autograd::backward(masked_fn({p0, p1})[0]);
  for (const Tensor* p : {&p0, &p1}) {
    const std::vector<double> g = p->grad().to_vector();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E && !kept[size_t(t)]; ++e)
        EXPECT_EQ(g[size_t(t * E + e)], 0.0) << "token " << t << " expert " << e;
  }
}

// The assignments per expert of the counted tokens only (what the expert bias balances when some
// tokens are padding), against a histogram here; all tokens without ranges.
TEST(ExpertCounts, CountTheAssignmentsOfTheCountedTokens) {
  const int64_t E = 5, k = 2, T = 9;
  std::vector<int64_t> v(size_t(T * k));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 7 + i / 3) % size_t(E));
  const ops::ExpertIndices routed = ops::expert_indices(Tensor::from_vector(v, {T, k}), E);
  for (const std::vector<ops::TokenRange>& counted :
       std::vector<std::vector<ops::TokenRange>>{{}, {{0, 4}}, {{2, 3}, {5, 9}}}) {
    std::vector<int64_t> want(size_t(E), 0);
    for (int64_t t = 0; t < T; ++t) {
      bool in = counted.empty();
      for (const ops::TokenRange& r : counted) in = in || (t >= r.begin && t < r.end);
      for (int64_t j = 0; j < k && in; ++j) ++want[size_t(v[size_t(t * k + j)])];
    }
    std::vector<int64_t> got;
    for (double c : ops::expert_counts(routed, counted).to_vector()) got.push_back(int64_t(c));
    EXPECT_EQ(got, want);
  }
  const std::string m = error_of([&] { ops::expert_counts(routed, {{3, 10}}); });
  EXPECT_NE(m.find("expert_counts: counts tokens [3, 10) of 9"), std::string::npos) << m;
}

TEST(MoeAuxLoss, BalancedRouterGivesK) {
  // Uniform probabilities and every expert chosen equally often: aux = E * E * (k/E) * (1/E) = k.
  const int64_t E = 4, k = 2, T = 6;
  Tensor probs = Tensor::full({T, E}, 0.25, DType::F32);
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}, {T, k});
  EXPECT_NEAR(ops::moe_aux_loss({probs}, {idx}, E, k).item(), double(k), 1e-6);
}

TEST(ExpertIndices, KeepACopyOfWhatWasChecked) {
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 3, 2, 1}, {2, 2});
  const ops::ExpertIndices checked = ops::expert_indices(idx, 4);
  idx.fill(99);  // the caller's tensor changes after the check: the checked indices must not
  EXPECT_EQ(checked.tensor().to_vector(), (std::vector<double>{0, 3, 2, 1}));
  const std::string m = error_of([&] { ops::expert_indices(idx, 4, "moe_experts"); });
  EXPECT_NE(m.find("moe_experts: expert indices i64[2, 2] element 0 (token 0, slot 0) is 99, outside [0, 4)"),
            std::string::npos)
      << m;
}

TEST(ExpertBias, MovesTowardTheMeanLoadBySignOnly) {
  // mean 3: expert 0 underloaded (+coeff), 1 overloaded (-coeff), 2 and 3 at the mean (unchanged).
  Tensor bias = Tensor::from_vector(std::vector<double>{0.5, 0.5, 0.25, 0}, {4}, DType::F32);
  const Tensor counts = Tensor::from_vector(std::vector<int64_t>{1, 5, 3, 3}, {4});
  ops::update_expert_bias(bias, counts, 1e-3);
  EXPECT_EQ(bias.to_vector(), (std::vector<double>{double(0.5f + 1e-3f), double(0.5f - 1e-3f), 0.25, 0}));
  std::string m = error_of([&] { ops::update_expert_bias(bias, Tensor::zeros({3}, DType::I64), 1e-3); });
  EXPECT_NE(m.find("counts i64[3] must be i64 [E] or [micro-batches, E] for the bias f32[4]"),
            std::string::npos)
      << m;
  Tensor wrong = Tensor::zeros({4}, DType::F64);
  m = error_of([&] { ops::update_expert_bias(wrong, counts, 1e-3); });
  EXPECT_NE(m.find("bias f64[4] must be a contiguous f32 [E]"), std::string::npos) << m;
}

// torchtitan's rule: the deltas lose their mean, so the biases keep theirs; the loads are the rows
// (one per micro-batch) summed, not the last row.
TEST(ExpertBias, DeltasAreCentredAndMicroBatchRowsSummed) {
  const double c = 3e-3;
  // Loads 2, 2, 8 (mean 4): signs +, +, -; the deltas' mean is c / 3.
  const Tensor rows = Tensor::from_vector(std::vector<int64_t>{2, 0, 5, 0, 2, 3}, {2, 3});
  Tensor bias = Tensor::zeros({3}, DType::F32);
  ops::update_expert_bias(bias, rows, c);
  const std::vector<double> got = bias.to_vector();
  const std::vector<double> want = {double(float(c - c / 3)), double(float(c - c / 3)),
                                    double(float(-c - c / 3))};
  EXPECT_EQ(got, want);
  EXPECT_NEAR(got[0] + got[1] + got[2], 0.0, 1e-9);
  // The same loads as one row move the biases alike; the second row alone (loads 0, 2, 3) does not.
  Tensor one_row = Tensor::zeros({3}, DType::F32), last_row = Tensor::zeros({3}, DType::F32);
  ops::update_expert_bias(one_row, Tensor::from_vector(std::vector<int64_t>{2, 2, 8}, {3}), c);
  ops::update_expert_bias(last_row, rows.narrow(0, 1, 1).reshape({3}), c);
  EXPECT_EQ(one_row.to_vector(), got);
  EXPECT_NE(last_row.to_vector(), got);
}

TEST(MoeAuxLoss, BadArgumentsNameOpAndShapes) {
  Tensor p = Tensor::zeros({3, 4}, DType::F32);
  std::string m = error_of([&] { ops::moe_aux_loss({p}, {Tensor::zeros({3, 3}, DType::I64)}, 4, 2); });
  EXPECT_NE(m.find("moe_aux_loss"), std::string::npos) << m;
  EXPECT_NE(m.find("i64[3, 3]"), std::string::npos) << m;
  m = error_of([&] { ops::moe_aux_loss({p}, {Tensor::full({3, 2}, 4, DType::I64)}, 4, 2); });
  EXPECT_NE(m.find("outside [0, 4)"), std::string::npos) << m;
  // Counted ranges out of order, overlapping, empty or past the tokens.
  const Tensor idx = Tensor::zeros({3, 2}, DType::I64);
  for (const std::vector<ops::TokenRange>& bad :
       std::vector<std::vector<ops::TokenRange>>{{{1, 2}, {0, 1}}, {{0, 2}, {1, 3}}, {{1, 1}}, {{2, 4}}}) {
    m = error_of([&] { ops::moe_aux_loss({p}, {idx}, 4, 2, bad); });
    EXPECT_NE(m.find("moe_aux_loss: layer 0 counts tokens ["), std::string::npos) << m;
    EXPECT_NE(m.find("ascending, disjoint and within the tokens"), std::string::npos) << m;
  }
}

// ------------------------------------------------------------------------------------------------
// moe_experts

TEST(MoeExperts, GradientMatchesFiniteDifferences) {
  const int64_t T = 5, D = 6, F = 4, E = 4, k = 2;
  auto r = ops::router_topk(biased_logits(T, E, DType::F64, 41, 1), k, true);
  ASSERT_EQ(r.counts.to_vector()[1], 0);  // an expert with no tokens
  auto w = expert_weights(E, F, D, DType::F64, 42);
  Tensor x = random_tensor({T, D}, DType::F64, 45);
  expect_gradcheck(experts_fn, {x, r.weights.detach(), r.indices.tensor(), w.gate, w.up, w.down});
  // Router and experts together: the gradient reaches the logits through the weights.
  Tensor logits = biased_logits(T, E, DType::F64, 46, 3);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        auto rr = ops::router_topk(in[0], k, true);
        return std::vector<Tensor>{ops::moe_experts(in[1], rr.weights, rr.indices, in[2], in[3], in[4])};
      },
      {logits, x, w.gate, w.up, w.down});
}

TEST(MoeExperts, DefaultVariantMatchesReference) {
  struct Case {
    int64_t T, D, F, E, k;
  };
  for (auto c : {Case{1, 8, 4, 3, 1}, Case{5, 6, 4, 4, 2}, Case{37, 24, 20, 7, 3}, Case{131, 72, 40, 8, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "T=" << c.T << " D=" << c.D << " F=" << c.F << " E=" << c.E << " k=" << c.k);
    auto r = ops::router_topk(biased_logits(c.T, c.E, DType::F32, 50 + c.T, c.E - 1), c.k, true);
    auto w = expert_weights(c.E, c.F, c.D, DType::F32, 60);
    Tensor x = random_tensor({c.T, c.D}, DType::F32, 63);
    auto grad = [](Tensor t) { return t.set_requires_grad(true); };
    // f32: reassociation only; the sums run over D (gate/up), F (down) and T (weight grads), so the
    // spec's atol grows with the largest of them.
    const kernels::Dims dims = {c.T, c.D, c.F, c.E, c.k};
    expect_variant_matches_spec("moe_experts", "default", dims, experts_fn,
                                {grad(x.clone()), grad(r.weights.clone()), r.indices.tensor(),
                                 grad(w.gate.clone()), grad(w.up.clone()), grad(w.down.clone())});
    // bf16 (f32 routing weights, and bf16 ones): both round at the same points, but a GEMM sum that
    // lands near a bf16 rounding boundary may round the other way (1 ulp = 2^-8 relative) and
    // propagate; the default's backward also rounds dy and the SwiGLU gradients to bf16.
    for (DType wdt : {DType::F32, DType::BF16})
      expect_variant_matches_spec("moe_experts", "default", dims, experts_fn,
                                  {grad(x.to(DType::BF16)), grad(r.weights.to(wdt)), r.indices.tensor(),
                                   grad(w.gate.to(DType::BF16)), grad(w.up.to(DType::BF16)),
                                   grad(w.down.to(DType::BF16))});
  }
}

// The default's results, forward and backward, bf16 and f32, are the same bits on one thread as on
// several: each expert's GEMMs run single-threaded inside the expert loop, with one oneDNN kernel
// for every row count whether the loop's team has one thread or more (a team of one, as MPI ranks
// run with OMP_NUM_THREADS=1, used to compile a kernel per row count, with other roundings).
TEST(MoeExperts, ResultsDoNotDependOnTheThreadCount) {
  const int64_t T = 256, D = 512, F = 384, E = 8, k = 2;
  const auto r = ops::router_topk(biased_logits(T, E, DType::F32, 70, E - 1), k, true);
  const ExpertWeights w = expert_weights(E, F, D, DType::F32, 71);
  const Tensor x = random_tensor({T, D}, DType::F32, 72), dy = random_tensor({T, D}, DType::F32, 73);
  const int threads = omp_get_max_threads();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto run = [&](int team) {
      omp_set_num_threads(team);
      std::vector<Tensor> in = {x.to(dt), r.weights.clone(), w.gate.to(dt), w.up.to(dt), w.down.to(dt)};
      for (Tensor& t : in) t.set_requires_grad(true);
      const Tensor y = ops::moe_experts(in[0], in[1], r.indices.tensor(), in[2], in[3], in[4]);
      autograd::backward(autograd::current_tape(), {y}, {dy});
      std::vector<Tensor> out = {y};
      for (const Tensor& t : in) out.push_back(t.grad());
      return out;
    };
    const std::vector<Tensor> one = run(1), three = run(3);
    omp_set_num_threads(threads);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(max_abs_diff(one[i], three[i]), 0.0) << "output " << i;
  }
}

// Frozen gate and up projections and input (a router-only or down-only fine-tune): no SwiGLU input
// gradient is formed, only the routing weights' and W_down's (moe/cpu.cpp, swiglu_backward_row
// without dgu, its own loop).
TEST(MoeExperts, DefaultVariantMatchesReferenceWithoutSwigluInputGradients) {
  const int64_t T = 37, D = 24, F = 20, E = 7, k = 3;
  auto r = ops::router_topk(biased_logits(T, E, DType::F32, 80, E - 1), k, true);
  auto w = expert_weights(E, F, D, DType::F32, 81);
  Tensor x = random_tensor({T, D}, DType::F32, 84);
  auto grad = [](Tensor t) { return t.set_requires_grad(true); };
  const kernels::Dims dims = {T, D, F, E, k};
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_variant_matches_spec("moe_experts", "default", dims, experts_fn,
                                {x.to(dt), grad(r.weights.clone()), r.indices.tensor(), w.gate.to(dt), w.up.to(dt),
                                 grad(w.down.to(dt))});
  }
}

TEST(MoeExperts, UnusedExpertGetsZeroWeightGradient) {
  const int64_t T = 9, D = 10, F = 6, E = 5, k = 2;
  auto r = ops::router_topk(biased_logits(T, E, DType::F32, 70, 0), k, false);
  ASSERT_EQ(r.counts.to_vector()[0], 0);
  auto w = expert_weights(E, F, D, DType::F32, 71);
  for (const char* variant : {"reference", "default"}) {
    auto run = run_variant(
        "moe_experts", variant, experts_fn,
        {random_tensor({T, D}, DType::F32, 72), r.weights, r.indices.tensor(), w.gate.set_requires_grad(true),
         w.up.set_requires_grad(true), w.down.set_requires_grad(true)});
    for (int i : {3, 4, 5}) {
      auto g = run.input_grads[size_t(i)].narrow(0, 0, 1).contiguous().to_vector();
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](double v) { return v == 0; }))
          << variant << " input " << i;
      auto g1 = run.input_grads[size_t(i)].narrow(0, 1, 1).contiguous().to_vector();
      EXPECT_FALSE(std::all_of(g1.begin(), g1.end(), [](double v) { return v == 0; }))
          << variant << " input " << i;
    }
  }
}

// The expert weights' gradients go straight into their parameters' preset gradient buffers
// (autograd::GradientSink; the weight GEMMs' beta = 1), also through the bf16 cast of f32
// parameters: each buffer ends as what it held plus the gradient, as when autograd adds fresh ones
// (within one rounding of the sum: the fresh path rounds the gradient, then the add), an expert
// without tokens keeps what it held to the bit, and no [E, F, D] gradient is allocated.
TEST(MoeExperts, TheExpertWeightsGradientsAreAddedIntoTheirBuffers) {
  const int64_t T = 37, D = 24, F = 20, E = 7, k = 3;
  auto r = ops::router_topk(biased_logits(T, E, DType::F32, 90, 0), k, true);
  ASSERT_EQ(r.counts.to_vector()[0], 0);  // expert 0 gets no token
  const auto w = expert_weights(E, F, D, DType::F32, 91);
  const auto held = expert_weights(E, F, D, DType::F32, 94);
  const Tensor x = random_tensor({T, D}, DType::F32, 97), dy = random_tensor({T, D}, DType::F32, 98);
  for (const char* variant : {"reference", "default"})
    for (DType compute : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(variant) + (compute == DType::BF16 ? ", through bf16 casts" : ", f32"));
      kernels::ForceVariant force("moe_experts", variant);
      DeviceServices& cpu = device_services(Device::CPU);
      auto backward_of = [&](bool preset, int64_t* allocations) {
        std::vector<Tensor> params = {w.gate.clone().set_requires_grad(true),
                                      w.up.clone().set_requires_grad(true),
                                      w.down.clone().set_requires_grad(true)};
        std::vector<Tensor> buffers = {held.gate.clone(), held.up.clone(), held.down.clone()};
        if (preset)
          for (size_t i = 0; i < 3; ++i) params[i].set_grad(buffers[i]);
        Tensor y = ops::moe_experts(x.to(compute), r.weights, r.indices, ops::cast(params[0], compute),
                                    ops::cast(params[1], compute), ops::cast(params[2], compute));
        const int64_t before = cpu.stats().total_allocations;
        autograd::backward(autograd::current_tape(), {y}, {dy});
        *allocations = cpu.stats().total_allocations - before;
        if (!preset)
          for (size_t i = 0; i < 3; ++i) buffers[i] = ops::add(params[i].grad(), buffers[i]);
        return buffers;
      };
      int64_t fresh_allocations = 0, added_allocations = 0;
      const std::vector<Tensor> fresh = backward_of(false, &fresh_allocations);
      const std::vector<Tensor> added = backward_of(true, &added_allocations);
      const Tensor held_of[3] = {held.gate, held.up, held.down};
      for (size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(::testing::Message() << "weight " << i);
        EXPECT_LE(max_abs_diff(added[i], fresh[i]), 1e-6);
        EXPECT_EQ(max_abs_diff(added[i].narrow(0, 0, 1), held_of[i].narrow(0, 0, 1)), 0.0)
            << "the expert without tokens lost what its buffer held";
      }
      EXPECT_LT(added_allocations, fresh_allocations) << "an expert weight gradient was still allocated";
    }
}

TEST(MoeExperts, NoTokens) {
  auto w = expert_weights(3, 4, 6, DType::F32, 80);
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("moe_experts", variant);
    Tensor y = ops::moe_experts(Tensor::zeros({0, 6}, DType::F32), Tensor::zeros({0, 2}, DType::F32),
                                Tensor::zeros({0, 2}, DType::I64), w.gate, w.up, w.down);
    EXPECT_EQ(y.shape(), Shape({0, 6}));
  }
}

TEST(MoeExperts, BadArgumentsNameOpAndShapes) {
  auto w = expert_weights(4, 3, 6, DType::F32, 90);
  Tensor x = Tensor::zeros({5, 6}, DType::F32), wt = Tensor::zeros({5, 2}, DType::F32);
  Tensor idx = Tensor::zeros({5, 2}, DType::I64);
  auto expect_msg = [](const std::string& m, std::initializer_list<const char*> parts) {
    EXPECT_NE(m.find("moe_experts"), std::string::npos) << m;
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
  };
  expect_msg(error_of([&] {
               ops::moe_experts(x, wt, idx, w.gate, Tensor::zeros({4, 3, 5}, DType::F32), w.down);
             }),
             {"w_up f32[4, 3, 5]", "w_gate f32[4, 3, 6]"});
  expect_msg(error_of([&] {
               ops::moe_experts(x, wt, idx, w.gate, w.up, Tensor::zeros({4, 3, 6}, DType::F32));
             }),
             {"w_down f32[4, 3, 6]", "D=6"});
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 4, 0, 1}, {5, 2});
  expect_msg(error_of([&] { ops::moe_experts(x, wt, bad, w.gate, w.up, w.down); }),
             {"token 3, slot 1", "is 4"});
  expect_msg(error_of([&] {
               ops::moe_experts(x, Tensor::zeros({4, 2}, DType::F32), idx, w.gate, w.up, w.down);
             }),
             {"weights f32[4, 2]", "x f32[5, 6]"});
  expect_msg(error_of([&] { ops::moe_experts(x.to(DType::BF16), wt, idx, w.gate, w.up, w.down); }),
             {"bf16[5, 6]"});
}

// ------------------------------------------------------------------------------------------------
// Cross-check against PyTorch: router + experts + aux loss, forward and gradients, f32.

TEST(MoeTorch, RouterExpertsAndAuxMatchPyTorch) {
  std::string probe;
  if (run_command("/usr/bin/python3 -c 'import torch'", &probe) != 0)
    GTEST_SKIP() << "python3-torch not available";
  const int64_t T = 11, D = 12, F = 8, E = 6, k = 2;
  const double aux_coef = 0.1;
  Tensor logits = random_tensor({T, E}, DType::F32, 101, -2, 2), x = random_tensor({T, D}, DType::F32, 102);
  auto w = expert_weights(E, F, D, DType::F32, 103);
  Tensor dy = random_tensor({T, D}, DType::F32, 106);

  nlohmann::json in = {{"T", T},
                       {"D", D},
                       {"F", F},
                       {"E", E},
                       {"k", k},
                       {"renormalize", true},
                       {"aux_coef", aux_coef},
                       {"logits", logits.to_vector()},
                       {"x", x.to_vector()},
                       {"w_gate", w.gate.to_vector()},
                       {"w_up", w.up.to_vector()},
                       {"w_down", w.down.to_vector()},
                       {"dy", dy.to_vector()}};
  auto dir = temp_dir("moe_torch");
  std::ofstream(dir / "in.json") << in.dump();
  std::string out;
  ASSERT_EQ(run_command("/usr/bin/python3 " + (source_dir() / "tests/ops/torch_ref/moe_ref.py").string() +
                            " " + (dir / "in.json").string(),
                        &out),
            0)
      << out;
  nlohmann::json ref = nlohmann::json::parse(out);

  for (const char* variant : {"reference", "default"}) {
    SCOPED_TRACE(variant);
    kernels::ForceVariant force("moe_experts", variant);
    Tensor lg = logits.clone().set_requires_grad(true), xx = x.clone().set_requires_grad(true);
    Tensor wg = w.gate.clone().set_requires_grad(true), wu = w.up.clone().set_requires_grad(true),
           wd = w.down.clone().set_requires_grad(true);
    auto r = ops::router_topk(lg, k, true);
    Tensor y = ops::moe_experts(xx, r.weights, r.indices, wg, wu, wd);
    Tensor aux = ops::moe_aux_loss({r.probs}, {r.indices}, E, k);
    autograd::backward(autograd::current_tape(), {y, aux}, {dy, Tensor::full({1}, aux_coef, DType::F32)});

    auto expect_close = [&](const Tensor& got, const char* key, double tol) {
      std::vector<double> want = ref[key].get<std::vector<double>>(), have = got.to_vector();
      ASSERT_EQ(have.size(), want.size()) << key;
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(have[i] - want[i]));
      EXPECT_LE(worst, tol) << key;
    };
    EXPECT_EQ(r.indices.tensor().to_vector(), ref["indices"].get<std::vector<double>>());
    expect_close(r.weights, "weights", 1e-6);
    expect_close(r.probs, "probs", 1e-6);
    expect_close(y, "y", 1e-5);
    EXPECT_NEAR(aux.item(), ref["aux"].get<double>(), 1e-6);
    expect_close(lg.grad(), "d_logits", 1e-5);
    expect_close(xx.grad(), "d_x", 1e-5);
    expect_close(wg.grad(), "d_w_gate", 1e-5);
    expect_close(wu.grad(), "d_w_up", 1e-5);
    expect_close(wd.grad(), "d_w_down", 1e-5);
  }
}

// ------------------------------------------------------------------------------------------------
// moe_combine: the experts' weighted sum apart from the experts (expert parallelism)

namespace {

// moe_experts(x, weights, indices, ...) done in three steps, as an expert-parallel layer does them
// around its exchanges: the (token, slot) rows of x in routing order (an embedding lookup by
// token), each through its expert alone (k = 1, weight 1), then moe_combine.
Tensor experts_in_three_steps(const Tensor& x, const Tensor& weights, const ops::ExpertIndices& routed,
                              const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
  const Tensor& indices = routed.tensor();
  const int64_t T = indices.size(0), k = indices.size(1), n = T * k;
  std::vector<int64_t> order(n), pos(n), offsets(routed.num_experts() + 1);
  std::vector<int64_t> expert(n);
  std::copy_n(indices.contiguous().data<int64_t>(), n, expert.begin());
  ops::moe_routing_order({T, x.size(1), 0, routed.num_experts(), k}, expert.data(), order.data(), pos.data(),
                         offsets.data());
  std::vector<int64_t> token_of_row(n), expert_of_row(n);
  for (int64_t r = 0; r < n; ++r) {
    token_of_row[size_t(r)] = order[size_t(r)] / k;
    expert_of_row[size_t(r)] = expert[size_t(order[size_t(r)])];
  }
  const Tensor rows = ops::embedding(Tensor::from_vector(token_of_row, {n}), x);
  const Tensor ones = Tensor::full({n, 1}, 1.0, weights.dtype());
  const Tensor h =
      ops::moe_experts(rows, ones, Tensor::from_vector(expert_of_row, {n, 1}), w_gate, w_up, w_down);
  return ops::moe_combine(h, weights, routed);
}

}  // namespace

TEST(MoeCombine, GradientMatchesFiniteDifferences) {
  const int64_t T = 5, D = 6, E = 4, k = 2;
  auto r = ops::router_topk(biased_logits(T, E, DType::F64, 141, 2), k, true);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::moe_combine(in[0], in[1], r.indices)};
      },
      {random_tensor({T * k, D}, DType::F64, 142), r.weights.detach()});
}

TEST(MoeCombine, TheExpertsInThreeStepsAreMoeExperts) {
  const int64_t T = 37, D = 24, F = 20, E = 7, k = 3;
  auto r = ops::router_topk(biased_logits(T, E, DType::F32, 150, 0), k, true);
  ASSERT_EQ(r.counts.to_vector()[0], 0);  // an expert without tokens too
  for (const char* variant : {"reference", "default"})
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
      if (dt == DType::F64 && std::string(variant) == "default") continue;  // f64 runs the reference
      SCOPED_TRACE(std::string(variant) + " " + std::string(dtype_name(dt)));
      kernels::ForceVariant force("moe_experts", variant);
      const auto w = expert_weights(E, F, D, dt, 151);
      const Tensor x = random_tensor({T, D}, dt, 154), dy = random_tensor({T, D}, grad_dtype(dt), 155);
      const Tensor weights = r.weights.detach().to(grad_dtype(dt));
      auto run = [&](bool three_steps) {
        std::vector<Tensor> in = {x.clone().set_requires_grad(true), weights.clone().set_requires_grad(true),
                                  w.gate.clone().set_requires_grad(true),
                                  w.up.clone().set_requires_grad(true),
                                  w.down.clone().set_requires_grad(true)};
        Tensor y = three_steps ? experts_in_three_steps(in[0], in[1], r.indices, in[2], in[3], in[4])
                               : ops::moe_experts(in[0], in[1], r.indices, in[2], in[3], in[4]);
        autograd::backward(autograd::current_tape(), {y}, {dy});
        std::vector<Tensor> out = {y};
        for (const Tensor& t : in) out.push_back(t.grad());
        return out;
      };
      const std::vector<Tensor> one = run(false), three = run(true);
      // The reference: the same dot products, roundings and order of the sum, so the same bits.
      // The default kernel may contract its un-permute's multiply-add (f32) where moe_combine's
      // rounds the product: an ulp.
      if (std::string(variant) == "reference" || dt == DType::BF16)
        EXPECT_EQ(max_abs_diff(three[0], one[0]), 0.0) << "y";
      else
        EXPECT_LE(max_abs_diff(three[0], one[0]), 1e-6) << "y";
      // Backward: w * (dy . w_down) in one, (w * dy) . w_down in the other, so the products
      // reassociate; and dx sums its k rows in another order.
      // Within a few roundings of the largest element.
      const double tol = dt == DType::F64 ? 1e-13 : dt == DType::F32 ? 1e-5 : 1e-2;
      const char* names[] = {"dx", "dweights", "dw_gate", "dw_up", "dw_down"};
      for (size_t i = 1; i < one.size(); ++i) {
        const auto v = one[i].to_vector();
        double largest = 0;
        for (double e : v) largest = std::max(largest, std::abs(e));
        EXPECT_LE(max_abs_diff(three[i], one[i]), tol * largest) << names[i - 1];
      }
    }
}

TEST(MoeCombine, BadArgumentsNameOpAndShapes) {
  auto r = ops::router_topk(random_tensor({5, 4}, DType::F32, 160), 2, true);
  std::string m = error_of([&] {
    ops::moe_combine(random_tensor({9, 6}, DType::F32, 161), r.weights, r.indices);
  });
  EXPECT_NE(m.find("moe_combine"), std::string::npos) << m;
  EXPECT_NE(m.find("rows f32[9, 6]"), std::string::npos) << m;
  m = error_of([&] {
    ops::moe_combine(random_tensor({10, 6}, DType::F32, 161), r.weights.to(DType::F64), r.indices);
  });
  EXPECT_NE(m.find("routing weights must have the rows' dtype"), std::string::npos) << m;
}

// The attention op (ops::attention): autograd through the registered kernels, GQA, errors.
// The raw kernels have their own exhaustive tests in tests/backend/attention_test.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"

using namespace titan;
using namespace titan::testing;

namespace {
OpFn attention_fn(double scale, const ops::DocumentSpans& documents = {}) {
  return [scale, documents](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::attention(in[0], in[1], in[2], scale, documents)};
  };
}

// Block-causal attention by the textbook, in f64, with the mask written out: query i of a row sees
// key j iff j <= i and no separator lies in [j, i) (the separator ends its own document).
Tensor masked_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& ids,
                        int64_t separator) {
  const int64_t B = q.size(0), S = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3), r = Hq / Hkv;
  Tensor out = Tensor::zeros(q.shape(), DType::F64);
  const Tensor qd = q.to(DType::F64), kd = k.to(DType::F64), vd = v.to(DType::F64);
  const double *Q = qd.data<double>(), *K = kd.data<double>(), *V = vd.data<double>();
  const int64_t* id = ids.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> w(size_t(S), 0.0);
        double total = 0;
        for (int64_t j = i; j >= 0; --j) {
          if (j < i && id[b * S + j] == separator) break;  // key j ends an earlier document
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += Q[((b * S + i) * Hq + h) * D + d] * K[((b * S + j) * Hkv + h / r) * D + d];
          w[size_t(j)] = std::exp(dot * scale);
          total += w[size_t(j)];
        }
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < D; ++d)
            out.data<double>()[((b * S + i) * Hq + h) * D + d] +=
                w[size_t(j)] / total * V[((b * S + j) * Hkv + h / r) * D + d];
      }
  return out;
}

// Four rows of 11 tokens, separator 5: row 0 holds three documents (separators at 3 and 7), rows 1
// and 2 one each (one kernel call for both), row 3 a one-token document (a separator first) and one
// ending at the row's last token.
Tensor packed_ids() {
  std::vector<int64_t> ids(44, 9);
  for (int64_t t : {3, 7, 33, 43}) ids[size_t(t)] = 5;
  return Tensor::from_vector(ids, {4, 11});
}
// Their documents as the loader reports them (every row, then the token after each separator).
const ops::DocumentSpans packed_documents{{0, 4, 8, 11, 22, 33, 34}};
}  // namespace

TEST(AttentionOp, GradientMatchesFiniteDifferencesForEveryGqaRatio) {
  for (int64_t r : {1, 2, 4}) {
    const int64_t B = 2, S = 5, Hkv = 2, D = 4;
    expect_gradcheck(attention_fn(1.0 / std::sqrt(double(D))),
                     {random_tensor({B, S, Hkv * r, D}, DType::F64, 1), random_tensor({B, S, Hkv, D}, DType::F64, 2),
                      random_tensor({B, S, Hkv, D}, DType::F64, 3)});
  }
}

TEST(AttentionOp, FlashVariantMatchesReferenceThroughAutograd) {
  // GQA ratios 1, 2, 4, 8; head_dim 64 and 128; S not a multiple of the 64-wide tiles.
  for (auto [r, D, S] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 37}, {2, 128, 70}, {4, 64, 129}, {8, 128, 33}}) {
    const int64_t B = 2, Hkv = 2;
    auto q = random_tensor({B, S, Hkv * r, D}, DType::F32, 4).set_requires_grad(true);
    auto k = random_tensor({B, S, Hkv, D}, DType::F32, 5).set_requires_grad(true);
    auto v = random_tensor({B, S, Hkv, D}, DType::F32, 6).set_requires_grad(true);
    // f32: same math, different summation order (the spec's tolerance, ops/attention/spec.cpp).
    expect_variant_matches_spec("attention", "default", {B, S, Hkv * r, Hkv, D}, attention_fn(1.0 / std::sqrt(double(D))),
                                {q, k, v});
  }
}

TEST(AttentionOp, BlockCausalMatchesTheMaskedTextbookFormula) {
  const int64_t B = 4, S = 11, Hkv = 2, r = 2, D = 8;
  const double scale = 1.0 / std::sqrt(double(D));
  const Tensor ids = packed_ids();
  const ops::DocumentSpans& documents = packed_documents;
  // bf16: the output is rounded once (2^-9 of |v| <= 1), the scores and softmax stay f32.
  for (auto [dt, tol] :
       {std::pair<DType, double>{DType::F64, 1e-12}, {DType::F32, 2e-6}, {DType::BF16, 4e-3}}) {
    SCOPED_TRACE(dtype_name(dt));
    auto q = random_tensor({B, S, Hkv * r, D}, dt, 11, -2, 2),
         k = random_tensor({B, S, Hkv, D}, dt, 12, -2, 2), v = random_tensor({B, S, Hkv, D}, dt, 13);
    // The kernels take the scale as a float (AttentionShape).
    const Tensor want = masked_attention(q, k, v, double(float(scale)), ids, 5);
    const Tensor got = ops::attention(q, k, v, scale, documents).to(DType::F64);
    EXPECT_LT(max_abs_diff(got, want), tol);
    // The mask matters: plain causal attention differs wherever a row holds several documents.
    EXPECT_GT(max_abs_diff(ops::attention(q, k, v, scale).to(DType::F64), want), 1e-2);
  }
}

TEST(AttentionOp, BlockCausalGradientMatchesFiniteDifferences) {
  const int64_t S = 11, Hkv = 2, r = 2, D = 4;
  expect_gradcheck(attention_fn(0.5, packed_documents), {random_tensor({4, S, Hkv * r, D}, DType::F64, 21),
                                                         random_tensor({4, S, Hkv, D}, DType::F64, 22),
                                                         random_tensor({4, S, Hkv, D}, DType::F64, 23)});
}

TEST(AttentionOp, BlockCausalFlashVariantMatchesReferenceThroughAutograd) {
  // Documents of 1 to 70 tokens at head_dim 64 (whole flash tiles, partial ones, single rows) and two
  // rows of one document each (one call): the kernels read and write views that start anywhere in
  // the tensors. f32 only: through autograd the bf16 variants are held to the textbook formula above
  // (the spec's bf16 tolerance is for kernels fed the same saved output, tests/backend/attention_test.cpp).
  const int64_t B = 4, S = 150, Hkv = 2, r = 2, D = 64;
  const ops::DocumentSpans documents{{0, 1, 2, 71, 101, 150, 231, 300, 450}};
  auto q = random_tensor({B, S, Hkv * r, D}, DType::F32, 31).set_requires_grad(true);
  auto k = random_tensor({B, S, Hkv, D}, DType::F32, 32).set_requires_grad(true);
  auto v = random_tensor({B, S, Hkv, D}, DType::F32, 33).set_requires_grad(true);
  expect_variant_matches_spec("attention", "default", {B, S, Hkv * r, Hkv, D},
                              attention_fn(1.0 / std::sqrt(double(D)), documents), {q, k, v});
}

// Block-causal attention is each document's causal attention alone: the op on packed rows gives,
// bit for bit, the output and the q, k, v gradients of the op run on each document copied out as a
// row of its own (f32 and bf16: the same kernel on the same values, only read through views at
// other offsets; no tolerance). Documents of 1, 69, 30 and 49 tokens, then a row of two, then a
// whole row.
TEST(AttentionOp, BlockCausalIsEachDocumentAloneBitForBit) {
  const int64_t B = 3, S = 150, Hkv = 2, r = 2, D = 64;
  const std::vector<int64_t> starts = {0, 1, 2, 71, 101, 150, 231, 300};
  const double scale = 1.0 / std::sqrt(double(D));
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = random_tensor({B, S, Hkv * r, D}, dt, 41, -2, 2).set_requires_grad(true);
    Tensor k = random_tensor({B, S, Hkv, D}, dt, 42, -2, 2).set_requires_grad(true);
    Tensor v = random_tensor({B, S, Hkv, D}, dt, 43).set_requires_grad(true);
    const Tensor dout = random_tensor({B, S, Hkv * r, D}, grad_dtype(dt), 44);
    const Tensor out = ops::attention(q, k, v, scale, ops::DocumentSpans{starts});
    autograd::backward(autograd::current_tape(), {out}, {dout});
    for (size_t d = 0; d < starts.size(); ++d) {
      const int64_t first = starts[d], row = first / S, at = first % S;
      const int64_t end = d + 1 < starts.size() ? std::min(starts[d + 1], (row + 1) * S) : B * S;
      const int64_t len = std::min(end, (row + 1) * S) - first;
      auto piece = [&](const Tensor& t) { return t.narrow(0, row, 1).narrow(1, at, len); };
      Tensor qd = piece(q).clone().set_requires_grad(true), kd = piece(k).clone().set_requires_grad(true),
             vd = piece(v).clone().set_requires_grad(true);
      const Tensor alone = ops::attention(qd, kd, vd, scale);
      autograd::backward(autograd::current_tape(), {alone}, {piece(dout).clone()});
      SCOPED_TRACE("document at " + std::to_string(first) + ", " + std::to_string(len) + " tokens");
      EXPECT_EQ(max_abs_diff(piece(out).to(DType::F64), alone.to(DType::F64)), 0.0);
      EXPECT_EQ(max_abs_diff(piece(q.grad()).to(DType::F64), qd.grad().to(DType::F64)), 0.0);
      EXPECT_EQ(max_abs_diff(piece(k.grad()).to(DType::F64), kd.grad().to(DType::F64)), 0.0);
      EXPECT_EQ(max_abs_diff(piece(v.grad()).to(DType::F64), vd.grad().to(DType::F64)), 0.0);
    }
  }
}

// The CPU kernels' results, forward and backward, are the same bits on one thread as on several: the
// backward splits each (batch, kv head) group's kv tiles a number of ways fixed by the shape, never
// by the thread count, so dq adds the same partials in the same order whatever the team. GQA ratios
// 2 and 4 over rows of 300 tokens (5 kv tiles: the groups are split), causal and block-causal (a
// document of 170 tokens is split too), f32 and bf16, and bf16_probs where the CPU runs it.
TEST(AttentionOp, ResultsDoNotDependOnTheThreadCount) {
  const int64_t B = 2, S = 300, Hkv = 2, D = 64;
  const double scale = 1.0 / std::sqrt(double(D));
  const ops::DocumentSpans documents{{0, 1, 130, 300, 371}};
  const int threads = omp_get_max_threads();
  for (const int64_t r : {2, 4}) {
    const Tensor q = random_tensor({B, S, Hkv * r, D}, DType::F32, 51, -2, 2),
                 k = random_tensor({B, S, Hkv, D}, DType::F32, 52, -2, 2),
                 v = random_tensor({B, S, Hkv, D}, DType::F32, 53),
                 dout = random_tensor(q.shape(), DType::F32, 54);
    for (auto [dtype, variant] : {std::pair<DType, const char*>{DType::F32, "default"},
                                  {DType::BF16, "default"},
                                  {DType::BF16, "bf16_probs"}}) {
      const DType dt = dtype;  // (captured below)
      const auto& entry = kernels::find_kernel("attention", Device::CPU, dt, variant);
      if (entry.available && !entry.available().empty()) continue;
      kernels::ForceVariant force("attention", variant);
      for (const bool packed : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "r=" << r << " " << dtype_name(dt) << " " << variant
                                          << (packed ? " block-causal" : " causal"));
        auto run = [&](int team) {
          omp_set_num_threads(team);
          Tensor qt = q.to(dt).set_requires_grad(true), kt = k.to(dt).set_requires_grad(true),
                 vt = v.to(dt).set_requires_grad(true);
          const Tensor out = ops::attention(qt, kt, vt, scale, packed ? documents : ops::DocumentSpans{});
          autograd::backward(autograd::current_tape(), {out}, {dout});
          return std::vector<Tensor>{out, qt.grad(), kt.grad(), vt.grad()};
        };
        const std::vector<Tensor> one = run(1), three = run(3);
        omp_set_num_threads(threads);
        const char* names[] = {"out", "dq", "dk", "dv"};
        for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(max_abs_diff(one[i], three[i]), 0.0) << names[i];
      }
    }
  }
}

TEST(AttentionOp, DocumentStartsThatDoNotCoverTheRowsAreRefused) {
  auto q = Tensor::zeros({2, 4, 2, 8}, DType::F32);
  for (auto [starts, expect] : {std::pair<std::vector<int64_t>, const char*>{{0, 2}, "row 1"},
                                {{0, 2, 1, 4}, "increase"},
                                {{0, 4, 9}, "past the 2 rows"},
                                {{1, 4}, "row 0"}}) {
    try {
      ops::attention(q, q, q, 1.0, ops::DocumentSpans{starts});
      ADD_FAILURE() << "accepted document starts " << ::testing::PrintToString(starts);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
}

TEST(AttentionOp, CausalRowZeroAttendsOnlyToItself) {
  // Position 0 sees only key 0, so out[:, 0] == v[:, 0] for every head of its group.
  const int64_t B = 1, S = 9, Hkv = 2, r = 2, D = 8;
  auto q = random_tensor({B, S, Hkv * r, D}, DType::F32, 7);
  auto k = random_tensor({B, S, Hkv, D}, DType::F32, 8);
  auto v = random_tensor({B, S, Hkv, D}, DType::F32, 9);
  Tensor out = ops::attention(q, k, v, 0.3);
  for (int64_t h = 0; h < Hkv * r; ++h)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_FLOAT_EQ(out.data<float>()[h * D + d], v.data<float>()[(h / r) * D + d]) << "head " << h;
}

TEST(AttentionOp, BadShapesNameTheOpAndShapes) {
  auto q = Tensor::zeros({1, 4, 3, 8}, DType::F32), k = Tensor::zeros({1, 4, 2, 8}, DType::F32);
  try {
    ops::attention(q, k, k, 1.0);
    FAIL() << "3 query heads over 2 kv heads must be rejected";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("attention"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[1, 4, 3, 8]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::attention(Tensor::zeros({1, 4, 2, 8}, DType::F32), Tensor::zeros({1, 5, 2, 8}, DType::F32),
                              Tensor::zeros({1, 5, 2, 8}, DType::F32), 1.0),
               Error);
  EXPECT_THROW(ops::attention(Tensor::zeros({1, 4, 2, 8}, DType::F32), Tensor::zeros({1, 4, 2, 8}, DType::BF16),
                              Tensor::zeros({1, 4, 2, 8}, DType::BF16), 1.0),
               Error);
}

// The bf16 kernels' activation-sized scratch (the default backward's bf16 dout and gradients, the
// reference's f32 copies of its inputs) comes from the allocator, so the metrics line's memory and
// peak count it; it is all given back when the kernel returns.
TEST(AttentionOp, Bf16ScratchIsCountedAsTheRunsMemory) {
  const ops::AttentionShape s{2, 70, 4, 2, 64, 0.125f};
  DeviceServices& mem = device_services(Device::CPU);
  const KernelContext ctx = mem.context();
  const int64_t B = s.B, S = s.S, Hq = s.Hq, Hkv = s.Hkv, D = s.D;
  Tensor q = random_tensor({B, S, Hq, D}, DType::BF16, 1), k = random_tensor({B, S, Hkv, D}, DType::BF16, 2),
         v = random_tensor({B, S, Hkv, D}, DType::BF16, 3),
         dout = random_tensor({B, S, Hq, D}, DType::F32, 4);
  Tensor out = Tensor::empty({B, S, Hq, D}, DType::BF16), lse = Tensor::empty({B, Hq, S}, DType::F32);
  Tensor dq = Tensor::empty({B, S, Hq, D}, DType::F32), dk = Tensor::empty({B, S, Hkv, D}, DType::F32),
         dv = Tensor::empty({B, S, Hkv, D}, DType::F32);
  const int64_t q_n = int64_t(s.q_numel()), kv_n = int64_t(s.kv_numel());
  // default: bf16 dout, dq, dk, dv; reference: f32 q, k, v, out (its forward: q, k, v, out too).
  for (auto [variant, backward_scratch, forward_scratch] :
       {std::tuple<const char*, int64_t, int64_t>{"default", 2 * (2 * q_n + 2 * kv_n), 0},
        {"reference", 4 * (2 * q_n + 2 * kv_n), 4 * (2 * q_n + 2 * kv_n)}}) {
    SCOPED_TRACE(variant);
    const auto& kernel =
        kernels::kernel_for<ops::AttentionKernel>("attention", Device::CPU, DType::BF16, variant);
    const int64_t held = mem.stats().current_bytes;
    mem.reset_peak();
    kernel.forward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data());
    EXPECT_GE(mem.stats().peak_bytes - held, forward_scratch);
    EXPECT_EQ(mem.stats().current_bytes, held);
    mem.reset_peak();
    kernel.backward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(),
                    dout.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data());
    EXPECT_GE(mem.stats().peak_bytes - held, backward_scratch);
    EXPECT_EQ(mem.stats().current_bytes, held) << "scratch not given back";
  }
}

#include "titan/ops/embedding/embedding.h"

#include <gtest/gtest.h>

#include <random>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

using namespace titan;
using namespace titan::testing;

namespace {

std::vector<Tensor> embedding_fn(const std::vector<Tensor>& in) {
  return {ops::embedding(in[0], in[1])};
}

// Random ids in [0, V) with plenty of repeats (the scatter-add must sum them).
Tensor random_ids(const Shape& shape, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(size_t(shape_numel(shape)));
  for (auto& id : v) id = int64_t(rng() % uint64_t(V));
  return Tensor::from_vector(v, shape);
}

std::string embedding_error(const Tensor& ids, const Tensor& table) {
  return error_of([&] { ops::embedding(ids, table); });
}

}  // namespace

TEST(Embedding, ForwardCopiesTableRows) {
  auto table = random_tensor({7, 5}, DType::F32, 1);
  auto ids = Tensor::from_vector(std::vector<int64_t>{3, 0, 6, 3, 1, 6}, {2, 3});
  auto out = ops::embedding(ids, table);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 5}));
  auto t = table.to_vector(), o = out.to_vector();
  auto id = ids.to_vector();
  for (size_t i = 0; i < id.size(); ++i)
    for (size_t d = 0; d < 5; ++d) EXPECT_EQ(o[i * 5 + d], t[size_t(id[i]) * 5 + d]) << i << "," << d;
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  auto ids = Tensor::from_vector(std::vector<int64_t>{2, 4, 2, 0, 2, 1}, {3, 2});
  expect_gradcheck(embedding_fn, {ids, random_tensor({5, 3}, DType::F64, 2)});
}

TEST(Embedding, BackwardScatterAddsRepeatedIds) {
  auto ids = Tensor::from_vector(std::vector<int64_t>{1, 1, 3}, {3});
  auto table = random_tensor({4, 2}, DType::BF16, 3).set_requires_grad(true);
  auto out = ops::embedding(ids, table);
  autograd::backward(autograd::current_tape(), {out},
                     {Tensor::from_vector(std::vector<float>{1, 2, 10, 20, 100, 200}, {3, 2})});
  ASSERT_EQ(table.grad().dtype(), DType::F32);
  EXPECT_EQ(table.grad().to_vector(), (std::vector<double>{0, 0, 11, 22, 0, 0, 100, 200}));
}

TEST(Embedding, DefaultVariantMatchesReferenceExactly) {
  // Small (serial) and large enough to run threaded; odd V and D. The default partitions dtable by
  // vocab rows and keeps id order per row, so f32 gradients are bit-identical.
  for (auto [V, D, S] : {std::tuple{37, 19, 41}, {1013, 97, 333}}) {
    auto ids = random_ids({2, S}, V, 4);
    auto table = random_tensor({V, D}, DType::F32, 5).set_requires_grad(true);
    expect_variant_matches_spec("embedding", "default", {2 * S, V, D}, embedding_fn, {ids, table});
    expect_variant_matches_spec("embedding", "default", {2 * S, V, D}, embedding_fn,
                                {ids, table.to(DType::BF16).set_requires_grad(true)});
  }
}

// A parameter's table gradient is scattered straight into its preset gradient buffer
// (autograd::GradientSink), also through the bf16 cast of an f32 parameter (a tied lm_head's
// buffer already holds the output projection's gradient then): each id's row gets its dy rows
// added in position order, every other row keeps what it held, to the bit, and no [V, D]
// gradient is allocated.
TEST(Embedding, AParametersGradientIsScatteredIntoItsBuffer) {
  const int64_t V = 1013, D = 97, S = 333;
  const Tensor ids = random_ids({2, S}, V, 4);
  const Tensor dy = random_tensor({2, S, D}, DType::F32, 6), held = random_tensor({V, D}, DType::F32, 7);
  // What the buffer must end as: the reference's serial scatter-add, started from what it held.
  std::vector<float> want(size_t(V * D));
  {
    const std::vector<double> h = held.to_vector(), g = dy.to_vector();
    const std::vector<double> id = ids.to_vector();
    for (size_t k = 0; k < want.size(); ++k) want[k] = float(h[k]);
    for (size_t i = 0; i < id.size(); ++i)
      for (int64_t d = 0; d < D; ++d)
        want[size_t(id[i]) * size_t(D) + size_t(d)] += float(g[i * size_t(D) + size_t(d)]);
  }
  for (const std::string variant : {"reference", "default"})
    for (DType compute : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(variant + (compute == DType::BF16 ? ", through a bf16 cast" : ", f32"));
      kernels::ForceVariant force("embedding", variant);
      const GradientIntoBuffer g = gradient_into_buffer(
          random_tensor({V, D}, DType::F32, 8), held, [&](const Tensor& table) -> std::function<void()> {
            Tensor out = ops::embedding(ids, ops::cast(table, compute));
            return [out, &dy] { autograd::backward(autograd::current_tape(), {out}, {dy}); };
          });
      const std::vector<double> got = g.added.to_vector();
      int64_t wrong = 0;
      for (size_t k = 0; k < want.size(); ++k) wrong += float(got[k]) != want[k];
      EXPECT_EQ(wrong, 0) << "of " << want.size() << " buffer entries differ from the serial scatter-add";
      // A fresh gradient added by autograd rounds the same sums in another order: close, not equal.
      EXPECT_LE(max_abs_diff(g.added, g.fresh), 1e-5);
      EXPECT_LT(g.added_allocations, g.fresh_allocations) << "a [V, D] gradient was still allocated";
    }
}

// padding_idx (transformers' pad_token_id): the lookup still reads that row, but the positions
// holding it add nothing to the table's gradient; every other row gets its scatter-add. Into a
// parameter's gradient buffer, the padding row keeps what it held (a tied lm_head's gradient).
TEST(Embedding, PaddingIdxRowGetsNoGradientFromTheLookup) {
  const int64_t V = 1013, D = 97, S = 333, pad = 5;
  std::vector<double> id_values = random_ids({2, S}, V, 4).to_vector();
  for (size_t i = 0; i < id_values.size(); i += 7) id_values[i] = double(pad);  // many padding positions
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>(id_values.begin(), id_values.end()), {2, S});
  const Tensor dy = random_tensor({2, S, D}, DType::F32, 6), held = random_tensor({V, D}, DType::F32, 7);
  // The serial scatter-add of the non-padding positions, from zero and from what the buffer held.
  std::vector<float> want_fresh(size_t(V * D), 0.f), want_added(size_t(V * D));
  {
    const std::vector<double> h = held.to_vector(), g = dy.to_vector();
    for (size_t k = 0; k < want_added.size(); ++k) want_added[k] = float(h[k]);
    for (size_t i = 0; i < id_values.size(); ++i) {
      if (int64_t(id_values[i]) == pad) continue;
      for (int64_t d = 0; d < D; ++d) {
        const size_t k = size_t(id_values[i]) * size_t(D) + size_t(d);
        want_fresh[k] += float(g[i * size_t(D) + size_t(d)]);
        want_added[k] += float(g[i * size_t(D) + size_t(d)]);
      }
    }
  }
  auto count_wrong = [](const Tensor& got, const std::vector<float>& want) {
    const std::vector<double> v = got.to_vector();
    int64_t wrong = 0;
    for (size_t k = 0; k < want.size(); ++k) wrong += float(v[k]) != want[k];
    return wrong;
  };
  for (const std::string variant : {"reference", "default"}) {
    SCOPED_TRACE(variant);
    kernels::ForceVariant force("embedding", variant);
    const Tensor table = random_tensor({V, D}, DType::F32, 8).set_requires_grad(true);
    const Tensor out = ops::embedding(ids, table, pad);
    EXPECT_EQ(max_abs_diff(out, ops::embedding(ids, table.detach())), 0) << "the forward must not change";
    autograd::backward(autograd::current_tape(), {out}, {dy});
    EXPECT_EQ(count_wrong(table.grad(), want_fresh), 0);
    const GradientIntoBuffer g = gradient_into_buffer(
        random_tensor({V, D}, DType::F32, 8), held, [&](const Tensor& p) -> std::function<void()> {
          Tensor o = ops::embedding(ids, p, pad);
          return [o, &dy] { autograd::backward(autograd::current_tape(), {o}, {dy}); };
        });
    EXPECT_EQ(count_wrong(g.added, want_added), 0) << "into the gradient buffer";
  }
}

TEST(Embedding, PaddingIdxOutsideTheTableIsAnError) {
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}),
               table = Tensor::zeros({5, 3}, DType::F32);
  for (int64_t pad : {int64_t(5), int64_t(-2)}) {
    const std::string m = error_of([&] { ops::embedding(ids, table, pad); });
    EXPECT_NE(m.find("padding_idx " + std::to_string(pad) + " is out of range"), std::string::npos) << m;
    EXPECT_NE(m.find("V=5"), std::string::npos) << m;
  }
}

TEST(Embedding, OutOfRangeIdNamesIdPositionAndV) {
  auto table = Tensor::zeros({5, 3}, DType::F32);
  auto m = embedding_error(Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 7}, {2, 3}), table);
  EXPECT_NE(m.find("embedding"), std::string::npos) << m;
  EXPECT_NE(m.find("ids[1, 2] = 7"), std::string::npos) << m;
  EXPECT_NE(m.find("V=5"), std::string::npos) << m;
  m = embedding_error(Tensor::from_vector(std::vector<int64_t>{0, -1}, {2}), table);
  EXPECT_NE(m.find("ids[1] = -1"), std::string::npos) << m;
}

TEST(Embedding, BadArgumentsNameOpAndShapes) {
  auto m = embedding_error(Tensor::zeros({2, 3}, DType::F32), Tensor::zeros({5, 3}, DType::F32));
  EXPECT_NE(m.find("embedding"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 3]"), std::string::npos) << m;
  m = embedding_error(Tensor::zeros({2}, DType::I64), Tensor::zeros({5, 3, 1}, DType::F32));
  EXPECT_NE(m.find("f32[5, 3, 1]"), std::string::npos) << m;
}

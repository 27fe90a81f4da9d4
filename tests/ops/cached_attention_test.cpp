// The cached_attention op (generation's attention over a KV cache): the last rows of causal
// attention, whatever lies in the cache past its length; no gradient; errors that name the rule.
// Every variant against the reference: tests/kernels/parity_test.cpp (the op's spec.cpp).
#include "titan/ops/cached_attention/cached_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"

using namespace titan;
using namespace titan::testing;

namespace {

// k or v [B, S, Hkv, D] in a cache of S + 4 positions whose last four hold NaN.
Tensor cache_of(const Tensor& t) {
  const int64_t B = t.size(0), S = t.size(1);
  Tensor cache =
      Tensor::full({B, S + 4, t.size(2), t.size(3)}, std::numeric_limits<double>::quiet_NaN(), t.dtype());
  cache.narrow(1, 0, S).copy_from(t);
  return cache;
}

// The last Sq queries over a cache of S positions are the last Sq rows of causal attention over the
// S tokens: in f64 to rounding, in f32 and bf16 within the op's tolerance of the reference run on
// the same inputs, for one query (a decode step), a few (a prompt added in pieces) and all of them.
TEST(CachedAttention, IsTheLastRowsOfCausalAttention) {
  const int64_t B = 2, S = 23, Hq = 6, Hkv = 2, D = 16;
  const double scale = 1.0 / std::sqrt(double(D));
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    const Tensor q = random_tensor({B, S, Hq, D}, dt, 1, -2, 2),
                 k = random_tensor({B, S, Hkv, D}, dt, 2, -2, 2), v = random_tensor({B, S, Hkv, D}, dt, 3);
    const Tensor k_cache = cache_of(k), v_cache = cache_of(v);
    const Tensor full = ops::attention(q, k, v, scale);
    for (int64_t Sq : {int64_t(1), int64_t(4), S}) {
      const Tensor got = ops::cached_attention(q.narrow(1, S - Sq, Sq), k_cache, v_cache, S, scale);
      const Tensor expected = full.narrow(1, S - Sq, Sq).contiguous();
      const double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-5 : 2 * 8e-3;
      EXPECT_LE(max_abs_diff(got, expected), tol) << dtype_name(dt) << " Sq=" << Sq;
    }
  }
}

// A prefix of the cache is a shorter sequence: length 9 of the 23 positions gives attention over
// the first 9 tokens, whatever the later positions hold.
TEST(CachedAttention, ReadsTheFirstLengthPositionsOnly) {
  const int64_t S = 23, L = 9, Hq = 4, Hkv = 4, D = 8;
  const Tensor q = random_tensor({1, S, Hq, D}, DType::F64, 4, -2, 2),
               k = random_tensor({1, S, Hkv, D}, DType::F64, 5),
               v = random_tensor({1, S, Hkv, D}, DType::F64, 6);
  const Tensor short_attention = ops::attention(
      q.narrow(1, 0, L).contiguous(), k.narrow(1, 0, L).contiguous(), v.narrow(1, 0, L).contiguous(), 0.3);
  const Tensor got = ops::cached_attention(q.narrow(1, L - 2, 2), cache_of(k), cache_of(v), L, 0.3);
  EXPECT_LE(max_abs_diff(got, short_attention.narrow(1, L - 2, 2).contiguous()), 1e-12);
}

// A left-padded row (batched generation): with first_key[b] = f, row b's queries attend over the
// keys from position f on only, as if the row began there, whatever the padding holds (NaN here);
// every dtype and both CPU variants (default and reference) agree; a query before its row's first key
// has nothing to attend to and gets zeros; negative values count as 0.
TEST(CachedAttention, EachRowReadsFromItsFirstKey) {
  const int64_t S = 19, Hq = 4, Hkv = 2, D = 8;
  const std::vector<int64_t> first = {0, 5, 18, -3};
  const int64_t B = int64_t(first.size());
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    const Tensor q = random_tensor({B, S, Hq, D}, dt, 7, -2, 2);
    Tensor k_cache = cache_of(random_tensor({B, S, Hkv, D}, dt, 8, -2, 2)),
           v_cache = cache_of(random_tensor({B, S, Hkv, D}, dt, 9));
    for (int64_t b = 1; b < B; ++b)  // the padding is never read
      for (Tensor* cache : {&k_cache, &v_cache})
        if (first[size_t(b)] > 0)
          cache->narrow(0, b, 1)
              .narrow(1, 0, first[size_t(b)])
              .fill(std::numeric_limits<double>::quiet_NaN());
    const Tensor first_key = Tensor::from_vector(first, {B});
    for (int64_t Sq : {int64_t(1), int64_t(3), S}) {
      const Tensor got = ops::cached_attention(q.narrow(1, S - Sq, Sq), k_cache, v_cache, S, 0.3, first_key);
      kernels::ForceVariant reference("cached_attention", "reference");
      const Tensor expected =
          ops::cached_attention(q.narrow(1, S - Sq, Sq), k_cache, v_cache, S, 0.3, first_key);
      const double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-5 : 2 * 8e-3;
      EXPECT_LE(max_abs_diff(got, expected), tol) << dtype_name(dt) << " Sq=" << Sq;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t f = std::max<int64_t>(first[size_t(b)], 0), keys = S - f;
        // The row alone from its first key: causal attention over its last `keys` tokens.
        auto tail = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(1, f, keys).contiguous(); };
        const Tensor alone = ops::attention(tail(q), tail(k_cache), tail(v_cache), 0.3);
        for (int64_t i = 0; i < Sq; ++i) {
          const int64_t position = S - Sq + i;
          const Tensor row = got.narrow(0, b, 1).narrow(1, i, 1).contiguous();
          if (position < f) {
            EXPECT_EQ(max_abs_diff(row, Tensor::zeros(row.shape(), dt)), 0) << "b=" << b << " i=" << i;
          } else {
            EXPECT_LE(max_abs_diff(row, alone.narrow(1, position - f, 1).contiguous()), tol)
                << dtype_name(dt) << " b=" << b << " position " << position;
          }
        }
      }
    }
  }
  const Tensor q = random_tensor({2, 1, 2, 8}, DType::F32, 1), k = random_tensor({2, 4, 1, 8}, DType::F32, 2);
  for (const Tensor& bad : {Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3}),
                            Tensor::from_vector(std::vector<float>{0, 1}, {2})})
    EXPECT_NE(error_of([&] {
                ops::cached_attention(q, k, k, 4, 0.3, bad);
              }).find("first_key must be a contiguous i64 [2] (one per row), got"),
              std::string::npos);
}

TEST(CachedAttention, RecordsNoGradientAndSaysSo) {
  Tensor q = random_tensor({1, 1, 2, 8}, DType::F32, 1);
  const Tensor k = random_tensor({1, 4, 1, 8}, DType::F32, 2), v = random_tensor({1, 4, 1, 8}, DType::F32, 3);
  q.set_requires_grad(true);
  EXPECT_NE(error_of([&] { ops::cached_attention(q, k, v, 4, 0.3); }).find("inference only"),
            std::string::npos);
  autograd::NoGradGuard no_grad;
  EXPECT_EQ(ops::cached_attention(q, k, v, 4, 0.3).shape(), (Shape{1, 1, 2, 8}));
}

TEST(CachedAttention, BadShapesNameTheRule) {
  const Tensor q = random_tensor({1, 3, 4, 8}, DType::F32, 1), k = random_tensor({1, 6, 2, 8}, DType::F32, 2);
  auto fails_with = [](const std::function<void()>& f, const std::string& words) {
    const std::string e = error_of(f);
    EXPECT_NE(e.find(words), std::string::npos) << e;
  };
  fails_with([&] { ops::cached_attention(q, k, k, 7, 0.3); },
             "need Sq <= length <= capacity, got Sq=3 length=7 capacity=6");
  fails_with([&] { ops::cached_attention(q, k, k, 2, 0.3); }, "Sq=3 length=2");
  fails_with(
      [&] {
        ops::cached_attention(q, random_tensor({1, 6, 3, 8}, DType::F32, 3),
                              random_tensor({1, 6, 3, 8}, DType::F32, 3), 6, 0.3);
      },
      "Hq=4 must be a multiple of Hkv=3");
  fails_with(
      [&] {
        ops::cached_attention(q, random_tensor({2, 6, 2, 8}, DType::F32, 3),
                              random_tensor({2, 6, 2, 8}, DType::F32, 3), 6, 0.3);
      },
      "disagree on B or D");
  fails_with([&] { ops::cached_attention(q, k, k.to(DType::BF16), 6, 0.3); }, "dtypes differ");
  fails_with(
      [&] {
        ops::cached_attention(q, k, random_tensor({1, 5, 2, 8}, DType::F32, 3), 5, 0.3);
      },
      "differ");
}

}  // namespace

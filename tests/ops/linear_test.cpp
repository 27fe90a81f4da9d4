#include <gtest/gtest.h>

#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/linear/linear.h"

using namespace titan;
using namespace titan::testing;

namespace {
std::vector<Tensor> linear_fn(const std::vector<Tensor>& in) { return {ops::linear(in[0], in[1])}; }
}  // namespace

TEST(Linear, GradientMatchesFiniteDifferences) {
  expect_gradcheck(linear_fn, {random_tensor({2, 3, 7}, DType::F64, 1), random_tensor({5, 7}, DType::F64, 2)});
}

TEST(Linear, DefaultVariantMatchesReference) {
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 33, 129}, {65, 17, 257}}) {
    auto x = random_tensor({M, K}, DType::F32, 3);
    auto w = random_tensor({N, K}, DType::F32, 4);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    // f32: reassociation only, tolerance grows with K. bf16 inputs, f32 accumulation: the output is
    // rounded to bf16 (rel 2^-8). The tolerances are the spec's (ops/linear/spec.cpp).
    expect_variant_matches_spec("linear", "default", {M, N, K}, linear_fn, {x, w});
    expect_variant_matches_spec("linear", "default", {M, N, K}, linear_fn,
                                {x.to(DType::BF16).set_requires_grad(true), w.to(DType::BF16).set_requires_grad(true)});
  }
}

TEST(Linear, ShapeMismatchNamesOpAndShapes) {
  try {
    ops::linear(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({3, 7}, DType::F32));
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("linear"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[3, 7]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::linear(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({3, 8}, DType::BF16)), Error);
}

// Empty dimensions, as PyTorch computes them: K = 0 is a sum of nothing (y zero, dw and dx empty);
// N = 0 or M = 0 an empty y (dx, resp. dw, zero). Each variant, f32 and bf16 (the GEMMs used to
// refuse the tight strides lda = K = 0 and ldc = N = 0).
TEST(Linear, EmptyDimensionsGiveEmptyOrZeroResults) {
  for (const std::string variant : {"reference", "default"})
    for (DType dtype : {DType::F32, DType::BF16})
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 4, 0}, {3, 0, 5}, {0, 4, 5}}) {
        SCOPED_TRACE(variant + " " + std::string(dtype_name(dtype)) + " M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
        kernels::ForceVariant force("linear", variant);
        Tensor x = Tensor::full({M, K}, 1.5, dtype).set_requires_grad(true);
        Tensor w = Tensor::full({N, K}, 2.0, dtype).set_requires_grad(true);
        // The caching allocator hands this block back to y: an output the kernel leaves unwritten
        // shows 7s (K = 0 once ran no GEMM rows at all).
        Tensor::full({M, N}, 7.0, dtype);
        const Tensor y = ops::linear(x, w);
        EXPECT_EQ(y.shape(), (Shape{M, N}));
        auto zero_or_empty = [](const Tensor& t) {
          return max_abs_diff(t.to(DType::F64), Tensor::zeros(t.shape(), DType::F64)) == 0.0;
        };
        EXPECT_TRUE(zero_or_empty(y));
        autograd::backward(autograd::current_tape(), {y}, {Tensor::full({M, N}, 1.0, grad_dtype(dtype))});
        EXPECT_EQ(x.grad().shape(), (Shape{M, K}));
        EXPECT_EQ(w.grad().shape(), (Shape{N, K}));
        EXPECT_TRUE(zero_or_empty(x.grad()));
        EXPECT_TRUE(zero_or_empty(w.grad()));
      }
}

// A parameter's weight gradient is added straight into its preset gradient buffer (the GEMM's
// beta = 1, autograd::GradientSink), also through the bf16 cast of an f32 parameter: the buffer
// ends as what it held plus dw, the same as returning a fresh dw for autograd to add, and the
// backward allocates no dw tensor of its own.
TEST(Linear, AParametersGradientIsAddedIntoItsBuffer) {
  const int64_t M = 9, N = 7, K = 33;
  const Tensor x = random_tensor({M, K}, DType::F32, 5), dy = random_tensor({M, N}, DType::F32, 6);
  const Tensor held = random_tensor({N, K}, DType::F32, 7);  // what the buffer holds before
  for (const std::string variant : {"reference", "default"})
    for (DType compute : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(variant + (compute == DType::BF16 ? ", through a bf16 cast" : ", f32"));
      kernels::ForceVariant force("linear", variant);
      const GradientIntoBuffer g = gradient_into_buffer(
          random_tensor({N, K}, DType::F32, 8), held, [&](const Tensor& w) -> std::function<void()> {
            Tensor y = ops::linear(x.to(compute), ops::cast(w, compute));
            return [y, &dy] { autograd::backward(autograd::current_tape(), {y}, {dy}); };
          });
      EXPECT_EQ(max_abs_diff(g.added, g.fresh), 0.0);
      EXPECT_LT(g.added_allocations, g.fresh_allocations) << "a dw tensor was still allocated";
    }
}

#include "titan/ops/swiglu/swiglu.h"

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <cmath>

#include "ops/op_test_util.h"
#include "ops/torch_ref/torch_ref.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

using namespace titan;
using namespace titan::testing;

namespace {

std::vector<Tensor> swiglu_fn(const std::vector<Tensor>& in) {
  return {ops::swiglu(in[0], in[1])};
}

double silu(double g) {
  return g / (1 + std::exp(-g));
}

}  // namespace

TEST(Swiglu, GradientMatchesFiniteDifferences) {
  expect_gradcheck(swiglu_fn,
                   {random_tensor({3, 7}, DType::F64, 1, -6, 6), random_tensor({3, 7}, DType::F64, 2)});
}

TEST(Swiglu, F32MatchesFormulaInDouble) {
  auto g = random_tensor({5, 41}, DType::F32, 3, -12, 12), u = random_tensor({5, 41}, DType::F32, 4, -3, 3);
  auto gv = g.to_vector(), uv = u.to_vector();
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("swiglu", variant);
    auto y = ops::swiglu(g, u).to_vector();
    for (size_t i = 0; i < y.size(); ++i) {
      double want = silu(gv[i]) * uv[i];
      EXPECT_NEAR(y[i], want, 1e-6 * std::fabs(want) + 1e-12) << variant << " " << i;
    }
  }
}

// bf16 rounds silu(gate) before multiplying by up (two torch ops), as transformers' MLP does.
TEST(Swiglu, Bf16RoundsSiluThenProduct) {
  auto g = random_tensor({4096}, DType::BF16, 5, -6, 6), u = random_tensor({4096}, DType::BF16, 6, -3, 3);
  auto gv = g.to_vector(), uv = u.to_vector();
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("swiglu", variant);
    auto y = ops::swiglu(g, u).to_vector();
    int64_t exact = 0, differs_from_single_rounding = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      float s = bf16_to_f32(f32_to_bf16(float(silu(gv[i]))));
      float want = bf16_to_f32(f32_to_bf16(s * float(uv[i])));
      EXPECT_LE(ulp_distance(float(y[i]), want, DType::BF16), 1) << variant << " " << i;
      exact += float(y[i]) == want;
      differs_from_single_rounding += want != bf16_to_f32(f32_to_bf16(float(silu(gv[i]) * uv[i])));
    }
    EXPECT_GE(exact * 1000, int64_t(y.size()) * 999) << variant;
    EXPECT_GT(differs_from_single_rounding, 100);  // the test can tell the two orders apart
  }
}

TEST(Swiglu, ExtremeGatesStayFinite) {
  auto g = Tensor::from_vector(std::vector<float>{-1000, -100, -88.5f, -20, 0, 20, 88.5f, 100, 1000}, {9});
  auto u = Tensor::full({9}, 2.0, DType::F32);
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("swiglu", variant);
    auto y = ops::swiglu(g, u).to_vector();
    auto gv = g.to_vector();
    for (size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], 2 * silu(gv[i]), 1e-6 * std::fabs(2 * gv[i]) + 1e-30) << variant << " gate " << gv[i];
  }
}

// The SiLU loops run with denormals flushed to zero (backend/cpu/lanes.h, FlushDenormals: their
// vectorised sigmoid multiplies by a denormal constant in every vector, a microcode assist each when
// denormals are honoured). The flush is the kernel's own: a silu below 2^-126 is 0 (f32 and bf16,
// forward and backward), and the caller's floating-point state, threads included, is as it was.
TEST(Swiglu, DenormalsAreFlushedInsideTheKernelOnly) {
  // The control fields (flush, denormals-are-zero, rounding, masks), not the six sticky status
  // flags: any library call in between may raise "inexact" (libstdc++'s path operations do).
  constexpr unsigned kStatusFlags = 0x3f;
  const unsigned csr = _mm_getcsr() & ~kStatusFlags;
  for (DType dt : {DType::F32, DType::BF16}) {
    // 40000 elements: more than one 16K chunk, so the kernel runs its parallel region (every thread
    // of the team takes the flush; a shorter input runs on the caller's thread, flushed the same way).
    auto g = Tensor::full({40000}, -100.0, DType::F32).to(dt).set_requires_grad(true);
    auto u = Tensor::full({40000}, 2.0, DType::F32).to(dt).set_requires_grad(true);
    kernels::ForceVariant force("swiglu", "default");
    Tensor y = ops::swiglu(g, u);
    for (double v : y.to_vector()) ASSERT_EQ(v, 0.0) << dtype_name(dt) << ": silu(-100) * 2 = -7e-42 exactly";
    autograd::backward(autograd::current_tape(), {y}, {Tensor::full(y.shape(), 1.0, grad_dtype(dt))});
    for (double v : u.grad().to_vector()) ASSERT_EQ(v, 0.0) << dtype_name(dt);
  }
  EXPECT_EQ(_mm_getcsr() & ~kStatusFlags, csr);
  volatile float tiny = 1e-38f;
  EXPECT_GT(tiny * 0.5f, 0.0f) << "denormals are still flushed after the kernel returned";
  // The OpenMP threads too: a parallel region after the kernel computes denormals.
  int flushed = 0;
#pragma omp parallel reduction(+ : flushed)
  flushed += (tiny * 0.5f == 0.0f) ? 1 : 0;
  EXPECT_EQ(flushed, 0);
}

TEST(Swiglu, DefaultVariantMatchesReference) {
  for (const Shape& s : {Shape{1}, Shape{3, 7}, Shape{5, 1031}, Shape{4, 17, 3072}}) {
    auto g = random_tensor(s, DType::F32, 7, -8, 8).set_requires_grad(true);
    auto u = random_tensor(s, DType::F32, 8, -2, 2).set_requires_grad(true);
    // f32: the polynomial exp is within ~1 ulp of expf, so silu and its derivative agree to ~3e-7.
    expect_variant_matches_spec("swiglu", "default", {g.numel()}, swiglu_fn, {g, u});
    // bf16: outputs are identical except rare 1-ulp flips (2^-8 relative); dup = dy * bf16(silu)
    // inherits the same flips, so gradients get the same relative tolerance.
    expect_variant_matches_spec("swiglu", "default", {g.numel()}, swiglu_fn,
                                {g.to(DType::BF16).set_requires_grad(true), u.to(DType::BF16).set_requires_grad(true)});
  }
}

// Only one input needs a gradient (a frozen gate or up projection): the backward kernel gets one
// output pointer, and each case has its own loop (swiglu/cpu.cpp, backward_loop).
TEST(Swiglu, DefaultVariantMatchesReferenceWithOneGradient) {
  const Shape s{5, 1031};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool gate_grad : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (gate_grad ? ", gate only" : ", up only"));
      auto g = random_tensor(s, DType::F32, 7, -8, 8).to(dt).set_requires_grad(gate_grad);
      auto u = random_tensor(s, DType::F32, 8, -2, 2).to(dt).set_requires_grad(!gate_grad);
      expect_variant_matches_spec("swiglu", "default", {g.numel()}, swiglu_fn, {g, u});
    }
  }
}

TEST(Swiglu, BadArgumentsNameOpAndShapes) {
  try {
    ops::swiglu(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({4, 9}, DType::F32));
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("swiglu"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 9]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::swiglu(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({4, 8}, DType::BF16)), Error);
}

// Cross-check with PyTorch: F.silu(gate) * up. Tolerances: bf16 within 1 bf16 ulp and at most 0.1%
// of elements off (measured: 0 differ); f32 within 8 ulps (torch's Sleef expf vs glibc's or our
// polynomial: measured max 4 ulps for the reference, 2 for the default).
TEST(Swiglu, MatchesTorch) {
  if (auto why = torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  std::vector<TorchCase> cases;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : {Shape{3, 17, 768}, Shape{5, 1031}}) {
      TorchCase c{"case" + std::to_string(cases.size()), "swiglu", dt, {}, nlohmann::json::object()};
      c.inputs = {{"gate", random_tensor(s, dt, 30 + cases.size(), -8, 8)},
                  {"up", random_tensor(s, dt, 40 + cases.size(), -2, 2)}};
      cases.push_back(c);
    }
  auto want = run_torch("swiglu", cases);
  ASSERT_EQ(want.size(), cases.size());
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("swiglu", variant);
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto got = ops::swiglu(c.inputs[0].second, c.inputs[1].second);
      auto st = compare_ulps(got, want[i], c.dtype);
      std::string what =
          std::string(variant) + " " + std::string(dtype_name(c.dtype)) + " " + c.inputs[0].second.str();
      std::printf("swiglu %s: max %lld ulp, %lld of %lld elements differ from torch\n", what.c_str(),
                  (long long)st.max_ulp, (long long)st.mismatches, (long long)st.n);
      if (c.dtype == DType::BF16) {
        EXPECT_LE(st.max_ulp, 1) << what;
        EXPECT_LE(st.mismatches * 1000, st.n) << what << ": " << st.mismatches << " of " << st.n << " differ";
      } else {
        EXPECT_LE(st.max_ulp, 8) << what;
      }
    }
  }
}

#include "titan/autograd/autograd.h"

#include <gtest/gtest.h>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/linear/linear.h"

using namespace titan;
using namespace titan::testing;

TEST(Autograd, ViewsAndAddPropagateGradients) {
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor a = in[0].reshape({3, 2}).transpose(0, 1).contiguous();  // [2, 3]
        Tensor b = in[1].narrow(1, 1, 3);                                 // [2, 3] from [2, 4]
        Tensor c = in[2].expand({2, 3});                                  // [1, 3] broadcast
        return std::vector<Tensor>{ops::add(ops::add(a, b), ops::scale(c, 3.0))};
      },
      {random_tensor({6}, DType::F64, 1), random_tensor({2, 4}, DType::F64, 2), random_tensor({1, 3}, DType::F64, 3)});
}

TEST(Autograd, TensorUsedTwiceAccumulates) {
  Tensor x = random_tensor({4, 5}, DType::F64, 7).set_requires_grad(true);
  Tensor w = random_tensor({3, 5}, DType::F64, 8).set_requires_grad(true);
  Tensor y = ops::add(ops::linear(x, w), ops::linear(x, w));  // d/dx = 2 * g w
  autograd::backward(autograd::current_tape(), {y}, {Tensor::full({4, 3}, 1.0, DType::F64)});
  auto gx = x.grad().to_vector();
  auto wv = w.to_vector();
  for (int m = 0; m < 4; ++m)
    for (int k = 0; k < 5; ++k) EXPECT_NEAR(gx[size_t(m * 5 + k)], 2 * (wv[size_t(k)] + wv[size_t(5 + k)] + wv[size_t(10 + k)]), 1e-12);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = random_tensor({2, 3}, DType::F32, 1).set_requires_grad(true);
  size_t before = autograd::current_tape().size();
  {
    autograd::NoGradGuard g;
    Tensor y = ops::add(x, x);
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(autograd::current_tape().size(), before);
}

// Two graphs recorded before either is back-propagated: each backward runs its own loss's nodes and
// leaves the other's, so the gradients add up as in torch; a second backward of a loss is an error
// instead of silently adding nothing.
TEST(Autograd, TwoGraphsOnOneTapeAccumulateAndASecondBackwardIsRefused) {
  Tensor x = random_tensor({1, 5}, DType::F64, 11).set_requires_grad(true);
  Tensor wa = random_tensor({1, 5}, DType::F64, 12), wb = random_tensor({1, 5}, DType::F64, 13);
  Tensor a = ops::linear(x, wa), b = ops::linear(x, wb);  // [1, 1] losses: d a / d x = wa
  autograd::backward(a);
  autograd::backward(b);
  const auto gx = x.grad().to_vector(), va = wa.to_vector(), vb = wb.to_vector();
  for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(gx[k], va[k] + vb[k], 1e-12);
  EXPECT_EQ(autograd::current_tape().size(), 0u);
  const std::string e = error_of([&] { autograd::backward(a); });
  EXPECT_NE(e.find("back-propagated already"), std::string::npos) << e;
}

// Two losses through one intermediate: the first backward runs (and drops) the intermediate's
// node, so the second's gradient would stop there, silently incomplete. It is refused, as torch
// refuses it without retain_graph; x keeps the first loss's gradient.
TEST(Autograd, ASecondBackwardThroughASharedIntermediateIsRefused) {
  Tensor x = Tensor::from_vector(std::vector<double>{1.0}, {1}).set_requires_grad(true);
  Tensor h = ops::scale(x, 2.0);
  Tensor a = ops::scale(h, 3.0), b = ops::scale(h, 5.0);
  autograd::backward(a);
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>{6.0});
  const std::string e = error_of([&] { autograd::backward(b); });
  EXPECT_NE(e.find("back-propagated already"), std::string::npos) << e;
  EXPECT_NE(e.find("shared part of one graph"), std::string::npos) << e;
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>{6.0});
  autograd::current_tape().clear();
}

// A forward whose result is let go without a backward (an evaluation loop outside NoGradGuard)
// does not keep its graph: the tape drops what no gradient can reach.
TEST(Autograd, ForwardsWithoutBackwardDoNotGrowTheTape) {
  Tensor x = random_tensor({2, 8}, DType::F32, 21).set_requires_grad(true);
  Tensor w = random_tensor({8, 8}, DType::F32, 22).set_requires_grad(true);
  const size_t before = autograd::current_tape().size();
  for (int i = 0; i < 3000; ++i) {
    Tensor y = ops::linear(ops::linear(x, w), w);  // 2 nodes, released with y
    (void)y;
  }
  EXPECT_LE(autograd::current_tape().size(), before + 4096 + 2);
  autograd::current_tape().prune_unreachable();
  EXPECT_EQ(autograd::current_tape().size(), before);
}

namespace {
// A small residual MLP block: h = x + W2 relu-free(W1 x)... built from linear + add only.
std::vector<Tensor> block(const std::vector<Tensor>& in, const Tensor& w1, const Tensor& w2) {
  Tensor h = ops::linear(in[0], w1);
  Tensor h2 = ops::linear(h, w2);
  return {ops::add(in[0], h2)};
}
}  // namespace

TEST(Autograd, RecomputeGivesIdenticalGradientsAndLowerPeakMemory) {
  const int64_t T = 512, D = 64, H = 1024, L = 4;
  std::vector<Tensor> w1s, w2s;
  for (int i = 0; i < L; ++i) {
    w1s.push_back(random_tensor({H, D}, DType::F32, uint64_t(10 + i), -0.05, 0.05).set_requires_grad(true));
    w2s.push_back(random_tensor({D, H}, DType::F32, uint64_t(20 + i), -0.05, 0.05).set_requires_grad(true));
  }
  Tensor x0 = random_tensor({T, D}, DType::F32, 5);
  auto run = [&](bool checkpoint) {
    for (int i = 0; i < L; ++i) {
      w1s[size_t(i)].autograd_meta()->grad = Tensor();
      w2s[size_t(i)].autograd_meta()->grad = Tensor();
    }
    DeviceServices& a = device_services(Device::CPU);
    a.reset_peak();
    int64_t base = a.stats().current_bytes;
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor h = x;
    for (int i = 0; i < L; ++i) {
      auto fn = [&, i](const std::vector<Tensor>& in) { return block(in, w1s[size_t(i)], w2s[size_t(i)]); };
      h = checkpoint ? autograd::recompute("block", fn, {h})[0] : fn({h})[0];
    }
    autograd::backward(autograd::current_tape(), {h}, {Tensor::full({T, D}, 1.0, DType::F32)});
    int64_t peak = a.stats().peak_bytes - base;
    std::vector<Tensor> grads{x.grad()};
    for (int i = 0; i < L; ++i) grads.push_back(w1s[size_t(i)].grad().clone());
    return std::make_pair(grads, peak);
  };
  auto [plain, plain_peak] = run(false);
  auto [ckpt, ckpt_peak] = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(max_abs_diff(plain[i], ckpt[i]), 0.0) << "gradient " << i;
  EXPECT_LT(ckpt_peak, plain_peak) << "checkpointed peak " << ckpt_peak << " vs plain " << plain_peak;
}

// bf16 activation gradients in autograd: a node that takes bf16 gradients gets them as they were
// given; one that does not gets them widened to f32; two bf16 gradients of one tensor sum in bf16,
// and an f32 one joining them widens the sum to f32. A leaf's gradient is f32 whatever arrives.
TEST(Autograd, Bf16GradientsReachOnlyTheNodesThatTakeThem) {
  const Tensor x =
      Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}).to(DType::BF16).set_requires_grad(true);
  // x -> z (takes bf16) -> three consumers u0, u1, u2 of z.
  DType z_got = DType::F64, u0_got = DType::F64;
  Tensor z = x.detach();
  autograd::record(
      "z", {x}, {&z},
      [&](const std::vector<Tensor>& g) {
        z_got = g[0].dtype();
        return std::vector<Tensor>{g[0]};
      },
      /*takes_bf16_grads=*/true);
  auto consumer = [&](const char* name, bool takes_bf16, DType gives, DType* got) {
    Tensor u = z.detach();
    autograd::record(
        name, {z}, {&u},
        [gives, got](const std::vector<Tensor>& g) {
          if (got) *got = g[0].dtype();
          return std::vector<Tensor>{g[0].to(gives)};
        },
        takes_bf16);
    return u;
  };
  const Tensor seed = Tensor::from_vector(std::vector<float>{0.5f, 1.f / 3, 3, -1}, {4}).to(DType::BF16);
  {
    // Two bf16 gradients: z's sum stays bf16 (each 1/3 rounded to bf16, then the sum rounded).
    Tensor u0 = consumer("u0", false, DType::BF16, &u0_got), u1 = consumer("u1", true, DType::BF16, nullptr);
    autograd::backward(autograd::current_tape(), {u0, u1}, {seed, seed});
    EXPECT_EQ(u0_got, DType::F32) << "widened for a node that does not take bf16";
    EXPECT_EQ(z_got, DType::BF16);
    const Tensor want = ops::add(seed, seed);  // a bf16 add, rounded once
    EXPECT_EQ(x.grad().dtype(), DType::F32);
    EXPECT_EQ(x.grad().to_vector(), want.to_vector());
  }
  // An f32 gradient joins a bf16 one, in either order (the nodes run last-recorded first): the sum
  // is f32 (a bf16 sum so far is widened first).
  for (const bool f32_first : {true, false}) {
    SCOPED_TRACE(f32_first ? "the f32 gradient first" : "the bf16 gradient first");
    x.autograd_meta()->grad = Tensor();
    Tensor z2 = x.detach();
    autograd::record(
        "z2", {x}, {&z2},
        [&](const std::vector<Tensor>& g) {
          z_got = g[0].dtype();
          return std::vector<Tensor>{g[0]};
        },
        true);
    z = z2;
    const Tensor seed32 = Tensor::from_vector(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, {4});
    Tensor u_bf16, u_f32;
    if (f32_first) {
      u_bf16 = consumer("u_bf16", true, DType::BF16, nullptr);
      u_f32 = consumer("u_f32", true, DType::F32, nullptr);
    } else {
      u_f32 = consumer("u_f32", true, DType::F32, nullptr);
      u_bf16 = consumer("u_bf16", true, DType::BF16, nullptr);
    }
    autograd::backward(autograd::current_tape(), {u_bf16, u_f32}, {seed, seed32});
    EXPECT_EQ(z_got, DType::F32);
    const auto s = seed.to_vector(), t = seed32.to_vector(), got = x.grad().to_vector();
    for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(got[i], double(float(s[i]) + float(t[i]))) << i;
  }
}

// A view's gradient lives on its input's device: the meta device stands in for a GPU here (narrow's
// backward used to build its gradient on the CPU whatever the input's device).
TEST(Autograd, ViewGradientsStayOnTheInputsDevice) {
  for (const char* view : {"narrow", "reshape", "transpose"}) {
    SCOPED_TRACE(view);
    Tensor x = Tensor::zeros({4, 2}, DType::F32, Device::Meta).set_requires_grad(true);
    Tensor v = std::string(view) == "narrow"    ? x.narrow(0, 1, 2)
               : std::string(view) == "reshape" ? x.reshape({8})
                                                : x.transpose(0, 1);
    autograd::backward(autograd::current_tape(), {ops::scale(v, 2.0)},
                       {Tensor::zeros(v.shape(), DType::F32, Device::Meta)});
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().device(), Device::Meta);
  }
}

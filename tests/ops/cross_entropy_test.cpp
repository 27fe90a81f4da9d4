#include "titan/ops/cross_entropy/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/linear/linear.h"

using namespace titan;
using namespace titan::testing;

namespace {

constexpr int64_t kIgnore = -100;

OpFn ce_fn(ops::Reduction reduction = ops::Reduction::Mean) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::cross_entropy(in[0], in[1], kIgnore, reduction)};
  };
}

OpFn lce_fn(int64_t chunk, ops::Reduction reduction = ops::Reduction::Mean, bool round = true) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{
        ops::linear_cross_entropy(in[0], in[1], in[2], kIgnore, chunk, reduction, nullptr, round)};
  };
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

const char* const kVariants[] = {"reference", "default"};

}  // namespace

// ---------------------------------------------------------------------------------------------- gradients

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  // Logits spread over [-3, 3] so the softmax is far from uniform; rows 1 and 4 are ignored.
  auto logits = random_tensor({6, 7}, DType::F64, 1, -3, 3);
  auto labels = make_labels(6, 7, 2, {1, 4});
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    kernels::ForceVariant force("cross_entropy", variant);
    expect_gradcheck(ce_fn(), {logits, labels});
    expect_gradcheck(ce_fn(ops::Reduction::Sum), {logits, labels});
  }
}

TEST(LinearCrossEntropy, GradientMatchesFiniteDifferences) {
  // V = 11 with chunk 4: three chunks, the last one partial; rows 0 and 3 ignored.
  auto hidden = random_tensor({6, 5}, DType::F64, 3, -2, 2);
  auto weight = random_tensor({11, 5}, DType::F64, 4, -1, 1);
  auto labels = make_labels(6, 11, 5, {0, 3});
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    kernels::ForceVariant force("linear_cross_entropy", variant);
    for (int64_t chunk : {4, 11, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      expect_gradcheck(lce_fn(chunk), {hidden, weight, labels});
    }
    expect_gradcheck(lce_fn(3, ops::Reduction::Sum), {hidden, weight, labels});
  }
}

// ---------------------------------------------------------------------------------------------- variants

TEST(CrossEntropy, DefaultVariantMatchesReference) {
  for (auto [N, V] : {std::pair{1, 1}, {7, 1000}, {33, 257}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " V=" + std::to_string(V));
    auto logits = random_tensor({N, V}, DType::F32, 6, -8, 8);
    auto labels = make_labels(N, V, 7, N > 2 ? std::vector<int64_t>{2} : std::vector<int64_t>{});
    // f32: the vector exp and summation order (measured: loss equal, gradients within 2e-6
    // relative); bf16 logits are widened exactly, so the spec states the f32 tolerance for both.
    expect_variant_matches_spec("cross_entropy", "default", {N, V}, ce_fn(),
                                {logits.clone().set_requires_grad(true), labels});
    expect_variant_matches_spec("cross_entropy", "default", {N, V}, ce_fn(),
                                {logits.to(DType::BF16).set_requires_grad(true), labels});
  }
}

TEST(LinearCrossEntropy, DefaultVariantMatchesReference) {
  struct Case {
    int64_t N, D, V, chunk;
    std::vector<int64_t> ignored;
  };
  for (const Case& c :
       {Case{1, 1, 1, 1, {}}, Case{37, 19, 1000, 384, {}}, Case{37, 19, 1000, 384, {0, 5, 36}},
        Case{13, 64, 257, 8192, {3}}, Case{16, 8, 100, 7, {}}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " D=" + std::to_string(c.D) + " V=" + std::to_string(c.V) +
                 " chunk=" + std::to_string(c.chunk) + " ignored=" + std::to_string(c.ignored.size()));
    auto h = random_tensor({c.N, c.D}, DType::F32, 8, -1, 1);
    auto w = random_tensor({c.V, c.D}, DType::F32, 9, -1, 1);
    auto y = make_labels(c.N, c.V, 10, c.ignored);
    // f32: GEMM reassociation (K = D for logits, V or N for the gradients) plus the vector exp.
    // Gradient entries are ~3e-2 here; measured differences ~5e-8.
    expect_variant_matches_spec("linear_cross_entropy", "default", {c.N, c.V, c.D, c.chunk}, lce_fn(c.chunk),
                                {h.clone().set_requires_grad(true), w.clone().set_requires_grad(true), y});
    // bf16 operands, f32 accumulation. With the logits rounded to bf16, a logit whose f32 value sits
    // on a rounding boundary may round the other way after reassociation (one bf16 ulp), and dlogits
    // is rounded to bf16 for the GEMMs: measured differences ~5e-7 on gradients of ~3e-2.
    for (bool round : {true, false}) {
      SCOPED_TRACE(round ? "bf16 logits" : "f32 logits");
      expect_variant_matches_spec(
          "linear_cross_entropy", "default", {c.N, c.V, c.D, c.chunk}, lce_fn(c.chunk, ops::Reduction::Mean, round),
          {h.to(DType::BF16).set_requires_grad(true), w.to(DType::BF16).set_requires_grad(true), y});
    }
  }
}

// The weight's gradient is added straight into its parameter's preset gradient buffer (the dW
// GEMMs' beta = 1, autograd::GradientSink), also through the bf16 cast of an f32 parameter (the
// lm_head, tied or not): the buffer ends as what it held plus dW, the same as returning a fresh dW
// for autograd to add, and the backward allocates no [V, D] gradient of its own.
TEST(LinearCrossEntropy, TheWeightsGradientIsAddedIntoItsBuffer) {
  const int64_t N = 37, D = 19, V = 1000, chunk = 384;  // two whole chunks and a partial one
  const Tensor h = random_tensor({N, D}, DType::F32, 8), held = random_tensor({V, D}, DType::F32, 11);
  const Tensor y = make_labels(N, V, 10, {5});
  for (const char* variant : kVariants)
    for (DType compute : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(variant) + (compute == DType::BF16 ? ", through a bf16 cast" : ", f32"));
      kernels::ForceVariant force("linear_cross_entropy", variant);
      const GradientIntoBuffer g = gradient_into_buffer(
          random_tensor({V, D}, DType::F32, 9), held, [&](const Tensor& w) -> std::function<void()> {
            Tensor loss =
                ops::linear_cross_entropy(h.to(compute).set_requires_grad(true), ops::cast(w, compute), y,
                                          kIgnore, chunk, ops::Reduction::Mean, nullptr, true);
            return [loss] { autograd::backward(loss); };
          });
      EXPECT_EQ(max_abs_diff(g.added, g.fresh), 0.0);
      EXPECT_LT(g.added_allocations, g.fresh_allocations) << "a dW tensor was still allocated";
    }
}

// The same comparisons on every tier of the row loops this CPU runs (portable loops with std::exp,
// AVX2 + FMA with exp8, AVX-512 with exp16), forced with the kernel-ISA cap so that each is checked
// whatever tier the other tests ran. Same tolerances.
TEST(LinearCrossEntropy, EveryRowLoopTierMatchesReference) {
  for (cpu::KernelIsa tier : cpu_kernel_tiers()) {
    KernelIsaCap cap(tier);
    for (DType dt : {DType::F32, DType::BF16})
      for (bool round : {true, false}) {
        SCOPED_TRACE(std::string(cpu::kernel_isa_name(tier)) + " " + std::string(dtype_name(dt)) +
                     (round ? " bf16 logits" : " f32 logits"));
        auto h = random_tensor({37, 19}, DType::F32, 8, -1, 1).to(dt);
        auto w = random_tensor({1000, 19}, DType::F32, 9, -1, 1).to(dt);
        auto y = make_labels(37, 1000, 10, {0, 5});
        expect_variant_matches_spec("linear_cross_entropy", "default", {37, 1000, 19, 384},
                                    lce_fn(384, ops::Reduction::Mean, round),
                                    {h.set_requires_grad(true), w.set_requires_grad(true), y});
        auto logits = random_tensor({33, 257}, DType::F32, 6, -8, 8).to(dt);
        expect_variant_matches_spec("cross_entropy", "default", {33, 257}, ce_fn(),
                                    {logits.set_requires_grad(true), make_labels(33, 257, 7, {2})});
      }
  }
}

TEST(LinearCrossEntropy, ChunkSizeDoesNotChangeTheResult) {
  // V = 1000 in chunks of 384 (1000 = 2 * 384 + 232), 1 and 1000 against the unchunked reference.
  auto h = random_tensor({9, 12}, DType::F64, 11, -1, 1).set_requires_grad(true);
  auto w = random_tensor({1000, 12}, DType::F64, 12, -1, 1).set_requires_grad(true);
  auto y = make_labels(9, 1000, 13, {4});
  OpRun ref = run_variant("linear_cross_entropy", "reference", lce_fn(1000), {h, w, y});
  for (int64_t chunk : {1, 384, 999, 1000, 5000}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    OpRun got = run_variant("linear_cross_entropy", "default", lce_fn(chunk), {h, w, y});
    EXPECT_LT(max_abs_diff(got.outputs[0], ref.outputs[0]), 1e-12);
    EXPECT_LT(max_abs_diff(got.input_grads[0], ref.input_grads[0]), 1e-14);
    EXPECT_LT(max_abs_diff(got.input_grads[1], ref.input_grads[1]), 1e-14);
  }
}

// The fused op has the value and gradients of cross_entropy(linear(hidden, weight)).
TEST(LinearCrossEntropy, MatchesUnfusedComposition) {
  const int64_t N = 21, D = 33, V = 517;
  auto y = make_labels(N, V, 14, {7, 8});
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    auto h = random_tensor({N, D}, DType::F32, 15, -1, 1).to(dt);
    auto w = random_tensor({V, D}, DType::F32, 16, -1, 1).to(dt);
    OpFn unfused = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::cross_entropy(ops::linear(in[0], in[1]), in[2], kIgnore)};
    };
    std::vector<Tensor> in{h.clone().set_requires_grad(true), w.clone().set_requires_grad(true), y};
    OpRun a = run_variant("linear_cross_entropy", "default", lce_fn(100), in);
    OpRun b = run_variant("linear_cross_entropy", "default", unfused, in);
    // f32: reassociation only (measured 6e-8 on gradients of ~7e-2). bf16: both round the logits to
    // bf16, so the losses agree; the reference linear backward keeps dlogits in f32 where the fused op
    // rounds it to bf16: the label's entry, -(1 - p)/count ~ 5e-2, loses up to 2^-9 of itself (1e-4).
    const double tol = dt == DType::F32 ? 1e-6 : 5e-4;
    EXPECT_NEAR(a.outputs[0].item(), b.outputs[0].item(), 1e-6 * std::fabs(b.outputs[0].item()));
    EXPECT_LT(max_abs_diff(a.input_grads[0], b.input_grads[0]), tol) << "dhidden";
    EXPECT_LT(max_abs_diff(a.input_grads[1], b.input_grads[1]), tol) << "dweight";
  }
}

// ---------------------------------------------------------------------------------------------- edge cases

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGradients) {
  auto y = Tensor::from_vector(std::vector<int64_t>{kIgnore, kIgnore, kIgnore}, {3});
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    for (const char* variant : kVariants) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + variant);
      auto logits = random_tensor({3, 10}, dt, 17).set_requires_grad(true);
      auto h = random_tensor({3, 4}, dt, 18).set_requires_grad(true);
      auto w = random_tensor({10, 4}, dt, 19).set_requires_grad(true);
      for (ops::Reduction red : {ops::Reduction::Mean, ops::Reduction::Sum}) {
        OpRun ce = run_variant("cross_entropy", variant, ce_fn(red), {logits, y});
        OpRun lce = run_variant("linear_cross_entropy", variant, lce_fn(3, red), {h, w, y});
        for (const OpRun* run : {&ce, &lce}) {
          EXPECT_EQ(run->outputs[0].item(), 0.0);
          for (const Tensor& g : run->input_grads) {
            if (!g.defined()) continue;
            for (double v : g.to_vector()) ASSERT_EQ(v, 0.0) << g.str();
          }
        }
      }
    }
  }
}

TEST(CrossEntropy, CountsTargetsAndReductionSumIsMeanTimesCount) {
  auto logits = random_tensor({8, 30}, DType::F32, 20, -4, 4);
  auto y = make_labels(8, 30, 21, {0, 6, 7});
  auto h = random_tensor({8, 5}, DType::F32, 22);
  auto w = random_tensor({30, 5}, DType::F32, 23);
  EXPECT_EQ(ops::count_targets(y), 5);
  int64_t n1 = -1, n2 = -1;
  double mean = ops::cross_entropy(logits, y, kIgnore, ops::Reduction::Mean, &n1).item();
  double sum = ops::cross_entropy(logits, y, kIgnore, ops::Reduction::Sum).item();
  EXPECT_EQ(n1, 5);
  EXPECT_NEAR(sum, mean * 5, 1e-5 * std::fabs(sum));
  double lmean = ops::linear_cross_entropy(h, w, y, kIgnore, 7, ops::Reduction::Mean, &n2).item();
  double lsum = ops::linear_cross_entropy(h, w, y, kIgnore, 7, ops::Reduction::Sum).item();
  EXPECT_EQ(n2, 5);
  EXPECT_NEAR(lsum, lmean * 5, 1e-5 * std::fabs(lsum));
  // Output dtypes: f32 for f32 and bf16 inputs, f64 for f64; a scalar.
  EXPECT_EQ(ops::cross_entropy(logits.to(DType::BF16), y).dtype(), DType::F32);
  EXPECT_EQ(ops::cross_entropy(logits.to(DType::F64), y).dtype(), DType::F64);
  EXPECT_EQ(ops::linear_cross_entropy(h.to(DType::BF16), w.to(DType::BF16), y).str(), "f32[]");
}

TEST(CrossEntropy, LabelOutOfRangeNamesValueRowAndV) {
  auto logits = random_tensor({4, 10}, DType::F32, 24);
  auto h = random_tensor({4, 3}, DType::F32, 25);
  auto w = random_tensor({10, 3}, DType::F32, 26);
  for (int64_t bad : {10, -1, 1000000}) {
    auto y = Tensor::from_vector(std::vector<int64_t>{1, kIgnore, bad, 2}, {4});
    std::string m = error_of([&] { ops::cross_entropy(logits, y); });
    EXPECT_HAS(m, "cross_entropy");
    EXPECT_HAS(m, "label " + std::to_string(bad));
    EXPECT_HAS(m, "row 2");
    EXPECT_HAS(m, "V=10");
    m = error_of([&] { ops::linear_cross_entropy(h, w, y); });
    EXPECT_HAS(m, "linear_cross_entropy");
    EXPECT_HAS(m, "label " + std::to_string(bad));
    EXPECT_HAS(m, "row 2");
    EXPECT_HAS(m, "V=10");
  }
  // ignore_index itself may be any value, even inside [0, V).
  auto y = Tensor::from_vector(std::vector<int64_t>{1, 3, 3, 2}, {4});
  EXPECT_EQ(ops::count_targets(y, 3), 2);
  EXPECT_NO_THROW(ops::cross_entropy(logits, y, 3));
}

TEST(CrossEntropy, BadShapesNameOpAndShapes) {
  auto y4 = make_labels(4, 10, 27);
  std::string m = error_of([&] { ops::cross_entropy(Tensor::zeros({2, 2, 10}, DType::F32), y4); });
  EXPECT_HAS(m, "cross_entropy");
  EXPECT_HAS(m, "f32[2, 2, 10]");
  m = error_of([&] { ops::cross_entropy(Tensor::zeros({5, 10}, DType::F32), y4); });
  EXPECT_HAS(m, "cross_entropy");
  EXPECT_HAS(m, "f32[5, 10]");
  EXPECT_HAS(m, "i64[4]");
  m = error_of([&] {
    ops::cross_entropy(Tensor::zeros({4, 10}, DType::F32), Tensor::zeros({4}, DType::I32));
  });
  EXPECT_HAS(m, "i32[4]");
  m = error_of([&] { ops::cross_entropy(Tensor::zeros({4, 10}, DType::I64), y4); });
  EXPECT_HAS(m, "i64[4, 10]");

  m = error_of([&] {
    ops::linear_cross_entropy(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({10, 7}, DType::F32), y4);
  });
  EXPECT_HAS(m, "linear_cross_entropy");
  EXPECT_HAS(m, "f32[4, 8]");
  EXPECT_HAS(m, "f32[10, 7]");
  m = error_of([&] {
    ops::linear_cross_entropy(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({10, 8}, DType::BF16), y4);
  });
  EXPECT_HAS(m, "linear_cross_entropy");
  EXPECT_HAS(m, "bf16[10, 8]");
  m = error_of([&] {
    ops::linear_cross_entropy(Tensor::zeros({3, 8}, DType::F32), Tensor::zeros({10, 8}, DType::F32), y4);
  });
  EXPECT_HAS(m, "f32[3, 8]");
  EXPECT_HAS(m, "i64[4]");
  m = error_of([&] {
    ops::linear_cross_entropy(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({8}, DType::F32), y4);
  });
  EXPECT_HAS(m, "f32[8]");
  m = error_of([&] {
    ops::linear_cross_entropy(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({10, 8}, DType::F32), y4,
                              kIgnore, 0);
  });
  EXPECT_HAS(m, "chunk");
}

// ---------------------------------------------------------------------------------------------- memory

TEST(LinearCrossEntropy, PeakMemoryIsOrderRowsTimesChunk) {
  const int64_t N = 256, V = 50000, D = 16, chunk = 4096;
  const int64_t logits_bytes = N * V * 4;  // what the unfused op would hold (51 MB)
  auto h = random_tensor({N, D}, DType::F32, 28, -1, 1).set_requires_grad(true);
  auto w = random_tensor({V, D}, DType::F32, 29, -0.5, 0.5).set_requires_grad(true);
  auto y = make_labels(N, V, 30, {3, 100});
  DeviceServices& alloc = device_services(Device::CPU);

  alloc.reset_peak();
  const int64_t before = alloc.stats().current_bytes;
  Tensor loss = ops::linear_cross_entropy(h, w, y, kIgnore, chunk);
  const int64_t fwd_extra = alloc.stats().peak_bytes - before;
  autograd::backward(loss);
  // The gradients themselves (dweight is [V, D] f32) are outputs, not scratch.
  const int64_t grads = (V * D + N * D) * 4;
  const int64_t bwd_extra = alloc.stats().peak_bytes - before - grads;
  RecordProperty("forward_extra_bytes", std::to_string(fwd_extra));
  RecordProperty("backward_extra_bytes", std::to_string(bwd_extra));
  // Scratch: one [N, chunk] f32 block (4 MB) plus O(N) and O(N x D) bits; the full logits are 51 MB.
  EXPECT_LT(fwd_extra, 2 * N * chunk * 4) << "forward held " << fwd_extra << " bytes";
  EXPECT_LT(bwd_extra, 2 * N * chunk * 4) << "backward held " << bwd_extra << " bytes beyond the gradients";
  EXPECT_LT(bwd_extra, logits_bytes / 8);

  // Same numbers as the unfused composition (which does materialise the logits).
  auto h2 = h.detach().clone().set_requires_grad(true), w2 = w.detach().clone().set_requires_grad(true);
  Tensor ref = ops::cross_entropy(ops::linear(h2, w2), y);
  autograd::backward(ref);
  EXPECT_NEAR(loss.item(), ref.item(), 1e-5 * ref.item());
  EXPECT_LT(max_abs_diff(h.grad(), h2.grad()), 1e-6);
  EXPECT_LT(max_abs_diff(w.grad(), w2.grad()), 1e-6);
}

// The meta kernels allocate what the CPU kernels allocate, so a planned step's peak is the real
// one: forward and backward peaks beyond the inputs, for f32 chunks whose rows fill whole 4 KiB pages
// (the backward's padded dlogits rows) and for ones that do not, with and without kept logits, f32
// and bf16. Every row is a target (meta counts them all).
TEST(LinearCrossEntropy, MetaKernelsAllocateWhatTheCpuKernelsAllocate) {
  const int64_t N = 96, V = 5000, D = 32;
  const Tensor labels = make_labels(N, V, 31, {});
  struct Peaks {
    int64_t forward, backward;
  };
  auto peaks_on = [&](Device device, DType dtype, int64_t chunk, int64_t keep_bytes) {
    DeviceServices& mem = device_services(device);
    Tensor h = (device == Device::Meta ? Tensor::empty({N, D}, dtype, device)
                                       : random_tensor({N, D}, DType::F32, 32, -1, 1).to(dtype))
                   .set_requires_grad(true);
    Tensor w = (device == Device::Meta ? Tensor::empty({V, D}, dtype, device)
                                       : random_tensor({V, D}, DType::F32, 33, -0.5, 0.5).to(dtype))
                   .set_requires_grad(true);
    const Tensor y = device == Device::Meta ? Tensor::empty({N}, DType::I64, device) : labels;
    const int64_t before = mem.stats().current_bytes;
    mem.reset_peak();
    Peaks p{};
    {
      Tensor loss =
          ops::linear_cross_entropy(h, w, y, kIgnore, chunk, ops::Reduction::Mean, nullptr, true, keep_bytes);
      p.forward = mem.stats().peak_bytes - before;
      mem.reset_peak();
      autograd::backward(loss);
      p.backward = mem.stats().peak_bytes - before;
    }
    return p;
  };
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t chunk : {1024, 1000, 8192})  // 4 KiB f32 rows, not, and the whole vocabulary (5000)
      for (int64_t keep_bytes : {int64_t(0), int64_t(1) << 30}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " chunk " + std::to_string(chunk) + " keep " +
                     std::to_string(keep_bytes));
        const Peaks cpu = peaks_on(Device::CPU, dtype, chunk, keep_bytes),
                    meta = peaks_on(Device::Meta, dtype, chunk, keep_bytes);
        EXPECT_GT(cpu.backward, 0);
        EXPECT_EQ(meta.forward, cpu.forward);
        EXPECT_EQ(meta.backward, cpu.backward);
      }
}

// ---------------------------------------------------------------------------------------------- PyTorch

namespace {
const char* kTorchScript = R"PY(
import json, sys
import torch
import torch.nn.functional as F
d = json.load(open(sys.argv[1]))
N, V, D = d["N"], d["V"], d["D"]
logits = torch.tensor(d["logits"], dtype=torch.float32).reshape(N, V).requires_grad_()
labels = torch.tensor(d["labels"], dtype=torch.int64)
h = torch.tensor(d["hidden"], dtype=torch.float32).reshape(N, D).requires_grad_()
w = torch.tensor(d["weight"], dtype=torch.float32).reshape(V, D).requires_grad_()
ce = F.cross_entropy(logits, labels, ignore_index=-100)
ce.backward()
lce = F.cross_entropy(h @ w.t(), labels, ignore_index=-100)
lce.backward()
json.dump({"ce": ce.item(), "dlogits": logits.grad.flatten().tolist(), "lce": lce.item(),
           "dh": h.grad.flatten().tolist(), "dw": w.grad.flatten().tolist()}, sys.stdout)
)PY";

}  // namespace

TEST(CrossEntropy, MatchesPyTorch) {
  std::string out;
  if (run_command("/usr/bin/python3 -c 'import torch' 2>&1", &out) != 0)
    GTEST_SKIP() << "python3-torch not available (/usr/bin/python3 -c 'import torch' failed): " << out;
  const int64_t N = 9, V = 23, D = 6;
  auto logits = random_tensor({N, V}, DType::F32, 31, -5, 5);
  auto h = random_tensor({N, D}, DType::F32, 32, -1, 1);
  auto w = random_tensor({V, D}, DType::F32, 33, -1, 1);
  auto y = make_labels(N, V, 34, {2, 7});
  auto dir = temp_dir("cross_entropy_torch");
  nlohmann::json in{{"N", N},
                    {"V", V},
                    {"D", D},
                    {"logits", logits.to_vector()},
                    {"hidden", h.to_vector()},
                    {"weight", w.to_vector()},
                    {"labels", nlohmann::json::array()}};
  for (double v : y.to_vector()) in["labels"].push_back(int64_t(v));
  std::ofstream(dir / "in.json") << in.dump();
  std::ofstream(dir / "ref.py") << kTorchScript;
  ASSERT_EQ(run_command("/usr/bin/python3 " + (dir / "ref.py").string() + " " + (dir / "in.json").string() +
                            " 2>/dev/null",
                        &out),
            0)
      << out;
  auto ref = nlohmann::json::parse(out);

  auto expect_close = [](const Tensor& got, const nlohmann::json& want, const char* what) {
    std::vector<double> g = got.to_vector(), v = want.get<std::vector<double>>();
    ASSERT_EQ(g.size(), v.size()) << what;
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], v[i], 1e-6) << what << " element " << i;
  };
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    kernels::ForceVariant f1("cross_entropy", variant), f2("linear_cross_entropy", variant);
    Tensor x = logits.clone().set_requires_grad(true);
    Tensor ce = ops::cross_entropy(x, y);
    autograd::backward(ce);
    EXPECT_NEAR(ce.item(), ref["ce"].get<double>(), 1e-5);
    expect_close(x.grad(), ref["dlogits"], "dlogits");

    Tensor hh = h.clone().set_requires_grad(true), ww = w.clone().set_requires_grad(true);
    Tensor lce = ops::linear_cross_entropy(hh, ww, y, kIgnore, 8);
    autograd::backward(lce);
    EXPECT_NEAR(lce.item(), ref["lce"].get<double>(), 1e-5);
    expect_close(hh.grad(), ref["dh"], "dhidden");
    expect_close(ww.grad(), ref["dw"], "dweight");
  }
}

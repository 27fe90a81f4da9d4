// Every op with a CUDA kernel, run through the public ops API on Device::CUDA (inputs copied there,
// outputs and gradients checked to stay there) against the CPU "reference" variant on the same random
// inputs and backward seeds: forward outputs and every input gradient within the tolerances the
// op's CPU tests allow its fast variant (docs/kernels.md, "Tolerances"). Also: the index checks'
// errors on the device equal the CPU's, the optimizer kernels, sums and casts. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/cached_attention/cached_attention.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/embedding/embedding.h"
#include "titan/ops/linear/linear.h"
#include "titan/ops/optim/optim.h"
#include "titan/ops/rms_norm/rms_norm.h"
#include "titan/ops/rope/rope.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan {
namespace {

using testing::ActivationGradsRun;
using testing::expect_device_matches_reference;
using testing::random_tensor;
using testing::run_activation_grads;

constexpr Device kCuda = Device::CUDA;

Tensor grad_input(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1) {
  return random_tensor(shape, dtype, seed, lo, hi).set_requires_grad(true);
}

TEST(CudaOps, Linear) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::linear(in[0], in[1])}; };
  struct Case {
    Shape x;
    int64_t N;
  };
  for (const Case& c : {Case{{33, 64}, 48}, Case{{2, 17, 96}, 40}, Case{{128, 256}, 192}}) {
    const int64_t K = c.x.back();
    for (DType dt : {DType::F32, DType::BF16}) {
      const double atol = dt == DType::F32 ? 1e-5 * double(K) : 1e-4 * double(K);
      const double rtol = dt == DType::F32 ? 1e-5 : 8e-3;
      expect_device_matches_reference("linear", kCuda, f,
                                      {grad_input(c.x, dt, 1), grad_input({c.N, K}, dt, 2)}, atol, rtol);
    }
  }
}

// A parameter's weight gradient on the GPU is added into its preset buffer by the dw GEMM (beta = 1),
// also through the bf16 cast of an f32 parameter: the buffer ends as what it held plus the CPU's dw.
TEST(CudaOps, LinearAddsAParametersGradientIntoItsBuffer) {
  TITAN_REQUIRE_CUDA();
  const int64_t M = 65, N = 48, K = 96;
  const Tensor x = random_tensor({M, K}, DType::F32, 5), dy = random_tensor({M, N}, DType::F32, 6);
  const Tensor w0 = random_tensor({N, K}, DType::F32, 8), held = random_tensor({N, K}, DType::F32, 7);
  for (DType compute : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(compute == DType::BF16 ? "through a bf16 cast" : "f32");
    // On the CPU: a plain leaf's fresh dw, plus what the buffer held (the default kernel, which
    // rounds dy to bf16 as the GPU's does).
    Tensor w_cpu = w0.clone().set_requires_grad(true);
    {
      Tensor y = ops::linear(x.to(compute), ops::cast(w_cpu, compute));
      autograd::backward(autograd::current_tape(), {y}, {dy});
    }
    const Tensor want = ops::add(w_cpu.grad(), held);
    // The GPU: a parameter whose gradient buffer is preset.
    Tensor w = w0.to(Device::CUDA).set_requires_grad(true);
    Tensor buffer = held.to(Device::CUDA);
    w.set_grad(buffer);
    Tensor y = ops::linear(x.to(compute).to(Device::CUDA), ops::cast(w, compute));
    autograd::backward(autograd::current_tape(), {y}, {dy.to(Device::CUDA)});
    const double tol = 1e-5 * double(M);  // dw is f32 from the same operands: summation order only
    EXPECT_LE(testing::max_abs_diff(buffer.to(Device::CPU), want), tol);
  }
}

// Generation's attention over a KV cache (forward only): each query row of the cache's first
// `length` positions, whatever the rest holds (NaN here), in f32 and bf16, GQA groups of 1, 2 and 4,
// head_dim 8 to 256 (the kernel's limit), one query (a decode step) to a whole prompt; and with each
// row's first key after its left padding.
TEST(CudaOps, CachedAttentionReadsTheCachedPositionsOnly) {
  TITAN_REQUIRE_CUDA();
  struct Case {
    int64_t B, Sq, length, Hq, Hkv, D;
  };
  for (const Case& c : {Case{1, 1, 1, 2, 1, 8}, Case{1, 1, 300, 16, 8, 128}, Case{2, 5, 37, 4, 2, 64},
                        Case{1, 3, 77, 4, 4, 256}, Case{1, 70, 70, 4, 1, 25}})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " length " + std::to_string(c.length) + " D " +
                   std::to_string(c.D));
      auto cache = [&](uint64_t seed) {
        Tensor t = Tensor::full({c.B, c.length + 3, c.Hkv, c.D}, std::nan(""), dt);
        t.narrow(1, 0, c.length).copy_from(random_tensor({c.B, c.length, c.Hkv, c.D}, dt, seed, -2, 2));
        return t;
      };
      const double scale = 1.0 / std::sqrt(double(c.D));
      auto f = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            ops::cached_attention(in[0], in[1], in[2], c.length, scale, in.size() > 3 ? in[3] : Tensor())};
      };
      expect_device_matches_reference(
          "cached_attention", kCuda, f,
          {random_tensor({c.B, c.Sq, c.Hq, c.D}, dt, 1, -2, 2), cache(2), cache(3)},
          dt == DType::F32 ? 2e-5 : 1e-4, dt == DType::F32 ? 2e-5 : 8e-3);
      // Left-padded rows (batched generation): row b reads from key (b + 1) * length / 3 on; queries
      // before it read nothing and give zeros.
      std::vector<int64_t> first;
      for (int64_t b = 0; b < c.B; ++b) first.push_back((b + 1) * c.length / 3);
      expect_device_matches_reference("cached_attention", kCuda, f,
                                      {random_tensor({c.B, c.Sq, c.Hq, c.D}, dt, 4, -2, 2), cache(5),
                                       cache(6), Tensor::from_vector(first, {c.B})},
                                      dt == DType::F32 ? 2e-5 : 1e-4, dt == DType::F32 ? 2e-5 : 8e-3);
    }
}

TEST(CudaOps, RmsNorm) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::rms_norm(in[0], in[1], 1e-6)};
  };
  // Block norms (D = hidden) and per-head q/k norms (D = head_dim), through every path of the
  // kernels: rows in vectors of 4 and one at a time (D 1030), groups within a warp (D 40, 64, 128),
  // across warps (2560) and of the largest block (5120), backward blocks that loop over their rows
  // (2500 x 1030: 834 blocks of 3 rows, 2 row groups, one idle on the second pass), a forward grid
  // that loops (4200 x 2560: more rows than 4096 blocks of one group), and rows wider than the
  // row-group kernels take (9000).
  struct Case {
    Shape shape;
    // 1e-5, except where the reference's own serial f32 sum of R dw terms errs more: its rounding
    // errors add up to about 3.4e-8 * 0.41 R (one standard deviation; 1.4e-4 for R = 4200).
    double f32_atol;
  };
  for (const Case& c :
       {Case{{4, 7, 64}, 1e-5}, Case{{2, 5, 4, 128}, 1e-5}, Case{{300, 40}, 1e-5}, Case{{2500, 1030}, 3e-4},
        Case{{70, 2560}, 1e-5}, Case{{3, 5120}, 1e-5}, Case{{4200, 2560}, 6e-4}, Case{{2, 9000}, 1e-5}}) {
    const Shape& s = c.shape;
    const int64_t D = s.back();
    SCOPED_TRACE(Tensor::empty(s, DType::F32).str());
    expect_device_matches_reference(
        "rms_norm", kCuda, f, {grad_input(s, DType::F32, 3, -2, 2), grad_input({D}, DType::F32, 4, 0.5, 1.5)},
        c.f32_atol, 1e-5);
    expect_device_matches_reference(
        "rms_norm", kCuda, f,
        {grad_input(s, DType::BF16, 3, -2, 2), grad_input({D}, DType::BF16, 4, 0.5, 1.5)}, 2e-2, 8e-3);
  }
  // Only dx (a frozen weight) and only dw (an input that needs no gradient).
  for (const Shape& s : {Shape{33, 128}, Shape{5, 1030}}) {
    const int64_t D = s.back();
    expect_device_matches_reference(
        "rms_norm", kCuda, f,
        {grad_input(s, DType::BF16, 3, -2, 2), random_tensor({D}, DType::BF16, 4, 0.5, 1.5)}, 2e-2, 8e-3);
    expect_device_matches_reference(
        "rms_norm", kCuda, f,
        {random_tensor(s, DType::BF16, 3, -2, 2), grad_input({D}, DType::BF16, 4, 0.5, 1.5)}, 2e-2, 8e-3);
  }
}

// The kernels deal a row's columns to threads by D alone, so a row read through a view one element
// off 16-byte alignment (element by element) sums in the same order as an aligned one: y, dx and dw
// are the same bits wherever the row sits.
TEST(CudaOps, RmsNormBitsDoNotDependOnTheRowsAlignment) {
  TITAN_REQUIRE_CUDA();
  for (const Shape& s : {Shape{37, 128}, Shape{9, 2560}}) {
    const int64_t R = s[0], D = s[1];
    SCOPED_TRACE(Tensor::empty(s, DType::BF16).str());
    const Tensor x = random_tensor(s, DType::BF16, 21, -2, 2), dy = random_tensor(s, DType::BF16, 23);
    const Tensor w = random_tensor({D}, DType::BF16, 22, 0.5, 1.5);
    auto run = [&](int64_t offset) {
      Tensor storage = Tensor::zeros({R * D + offset}, DType::BF16, kCuda);
      Tensor xv = storage.narrow(0, offset, R * D).reshape(s);
      xv.copy_from(x);
      xv.set_requires_grad(true);
      Tensor wv = w.to(kCuda).set_requires_grad(true);
      Tensor y = ops::rms_norm(xv, wv, 1e-6);
      autograd::backward(autograd::current_tape(), {y}, {dy.to(kCuda)});
      return std::vector<Tensor>{y.to(Device::CPU), xv.grad().to(Device::CPU), wv.grad().to(Device::CPU)};
    };
    const std::vector<Tensor> aligned = run(0), unaligned = run(1);
    for (size_t i = 0; i < aligned.size(); ++i) {
      SCOPED_TRACE(i == 0 ? "y" : i == 1 ? "dx" : "dw");
      EXPECT_EQ(testing::max_abs_diff(aligned[i], unaligned[i]), 0.0);
    }
  }
}

TEST(CudaOps, RopeIsBitIdentical) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::rope(in[0], in[1], 1e6)}; };
  const int64_t B = 2, S = 9, H = 3;
  std::vector<int64_t> shared(S), per_row(B * S);
  for (int64_t s = 0; s < S; ++s) shared[size_t(s)] = s;
  for (int64_t i = 0; i < B * S; ++i) per_row[size_t(i)] = (i * 37) % 4000;  // out of order, large
  // Pairs per row in vectors of 4 (D 16, Qwen3's 128, 640: more vectors than a warp), of 2 (12) and
  // one at a time (10).
  for (int64_t D : {10, 12, 16, 128, 640})
    for (const Tensor& pos : {Tensor::from_vector(shared, {S}), Tensor::from_vector(per_row, {B, S})})
      for (DType dt : {DType::F32, DType::BF16})
        expect_device_matches_reference("rope", kCuda, f, {grad_input({B, S, H, D}, dt, 5), pos}, 0, 0);
}

TEST(CudaOps, Swiglu) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::swiglu(in[0], in[1])}; };
  for (const Shape& s :
       {Shape{5, 96}, Shape{3, 7, 1000}, Shape{3, 5, 7}}) {  // the last one element at a time
    expect_device_matches_reference(
        "swiglu", kCuda, f, {grad_input(s, DType::F32, 6, -6, 6), grad_input(s, DType::F32, 7)}, 1e-6, 2e-6);
    expect_device_matches_reference("swiglu", kCuda, f,
                                    {grad_input(s, DType::BF16, 6, -6, 6), grad_input(s, DType::BF16, 7)},
                                    1e-6, 8e-3);
  }
}

TEST(CudaOps, EmbeddingIsExactAndDeterministic) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::embedding(in[0], in[1])}; };
  // Few distinct ids among many positions: long runs of equal ids whose gradient rows must be added
  // in position order to match the serial reference bit for bit.
  std::vector<int64_t> ids(3 * 70);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 7919) % 13) * 3;
  for (DType dt : {DType::F32, DType::BF16})
    expect_device_matches_reference("embedding", kCuda, f,
                                    {Tensor::from_vector(ids, {3, 70}), grad_input({50, 32}, dt, 8)}, 0, 0);
}

// The table gradient of a parameter with a preset buffer is scattered into it on the GPU too (no
// [V, D] gradient, autograd::GradientSink), also through the bf16 cast of an f32 parameter: each run
// of equal ids is summed in position order from the row's held value, the CPU reference's order, so
// the buffers are equal to the bit.
TEST(CudaOps, EmbeddingScattersAParametersGradientIntoItsBuffer) {
  TITAN_REQUIRE_CUDA();
  const int64_t V = 1013, D = 97;
  std::vector<int64_t> id_values(2 * 333);
  for (size_t i = 0; i < id_values.size(); ++i) id_values[i] = int64_t((i * 7919) % 61) * 13;  // long runs
  const Tensor ids = Tensor::from_vector(id_values, {2, 333});
  const Tensor dy = random_tensor({2, 333, D}, DType::F32, 6), held = random_tensor({V, D}, DType::F32, 7);
  const Tensor w0 = random_tensor({V, D}, DType::F32, 8);
  for (DType compute : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(compute == DType::BF16 ? "through a bf16 cast" : "f32");
    auto scatter_on = [&](Device device) {
      // The CPU's reference against the GPU's one kernel (its default).
      std::optional<kernels::ForceVariant> force;
      if (device == Device::CPU) force.emplace("embedding", "reference");
      Tensor w = w0.to(device).set_requires_grad(true);
      Tensor buffer = held.to(device);
      w.set_grad(buffer);
      Tensor out = ops::embedding(ids.to(device), ops::cast(w, compute));
      autograd::backward(autograd::current_tape(), {out}, {dy.to(device)});
      return buffer.to(Device::CPU);
    };
    EXPECT_EQ(testing::max_abs_diff(scatter_on(kCuda), scatter_on(Device::CPU)), 0.0);
  }
}

// The fused loss adds the weight's gradient into its parameter's preset buffer on the GPU (the dW
// GEMMs' beta = 1), also through the bf16 cast of an f32 parameter: the buffer ends as what it held
// plus the CPU's dW.
TEST(CudaOps, LinearCrossEntropyAddsTheWeightsGradientIntoItsBuffer) {
  TITAN_REQUIRE_CUDA();
  const int64_t N = 65, D = 64, V = 1000, chunk = 384;
  const Tensor h = random_tensor({N, D}, DType::F32, 5), labels = testing::make_labels(N, V, 10, {3});
  const Tensor w0 = random_tensor({V, D}, DType::F32, 8), held = random_tensor({V, D}, DType::F32, 7);
  for (DType compute : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(compute == DType::BF16 ? "through a bf16 cast" : "f32");
    auto add_on = [&](Device device) {
      Tensor w = w0.to(device).set_requires_grad(true);
      Tensor buffer = held.to(device);
      w.set_grad(buffer);
      Tensor loss =
          ops::linear_cross_entropy(h.to(compute).to(device), ops::cast(w, compute), labels.to(device), -100,
                                    chunk, ops::Reduction::Mean, nullptr, true);
      autograd::backward(loss);
      return buffer.to(Device::CPU);
    };
    const double tol = 1e-5;  // dW entries ~1e-2 from the same operands: summation order only
    EXPECT_LE(testing::max_abs_diff(add_on(kCuda), add_on(Device::CPU)), tol);
  }
}

TEST(CudaOps, EmbeddingOutOfRangeIdErrorsAsOnTheCpu) {
  TITAN_REQUIRE_CUDA();
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 4, 50, 2, -1}, {5});
  Tensor table = random_tensor({50, 8}, DType::F32, 9);
  std::string cpu_msg, cuda_msg;
  try {
    ops::embedding(ids, table);
  } catch (const Error& e) {
    cpu_msg = e.what();
  }
  try {
    ops::embedding(ids.to(kCuda), table.to(kCuda));
  } catch (const Error& e) {
    cuda_msg = e.what();
  }
  ASSERT_FALSE(cpu_msg.empty()) << "the CPU op accepted an id of 50 with V = 50";
  EXPECT_EQ(cuda_msg, cpu_msg);
}

TEST(CudaOps, ElementwiseAddScaleCastAreExact) {
  TITAN_REQUIRE_CUDA();
  auto add = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::add(in[0], in[1])}; };
  auto scale = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::scale(in[0], 0.37)}; };
  for (DType dt : {DType::F32, DType::BF16}) {
    expect_device_matches_reference("add", kCuda, add,
                                    {grad_input({7, 333}, dt, 10), grad_input({7, 333}, dt, 11)}, 0, 0);
    expect_device_matches_reference("scale_inplace", kCuda, scale, {grad_input({7, 333}, dt, 12)}, 0, 0);
  }
  // cast both ways, and its gradient (f32, converted back on the device).
  auto cast = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::cast(in[0], DType::BF16)};
  };
  expect_device_matches_reference("cast", kCuda, cast, {grad_input({5, 77}, DType::F32, 13, -300, 300)}, 0,
                                  0);
}

TEST(CudaOps, AccumulateAndSum) {
  TITAN_REQUIRE_CUDA();
  for (DType src_dtype : {DType::F32, DType::BF16}) {
    Tensor dst = random_tensor({1000, 7}, DType::F32, 14), src = random_tensor({1000, 7}, src_dtype, 15);
    Tensor dst_dev = dst.to(kCuda);
    ops::add_inplace(dst, src);
    ops::add_inplace(dst_dev, src.to(kCuda));
    EXPECT_EQ(dst_dev.to_vector(), dst.to_vector()) << "add_inplace f32 += " << dtype_name(src_dtype);
    Tensor x = random_tensor({100003}, src_dtype, 16);
    const double cpu = ops::sum_all(x), gpu = ops::sum_all(x.to(kCuda));
    EXPECT_NEAR(gpu, cpu, 1e-12 * 100003)
        << "sum_all " << dtype_name(src_dtype);  // f64 sums in another order
  }
}

TEST(CudaOps, IndexScansMatchTheCpu) {
  TITAN_REQUIRE_CUDA();
  std::vector<int64_t> v(50000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 2654435761u) % 1000);
  v[31000] = -100;  // an allowed ignore_index
  v[40000] = 1000;  // first out of range
  v[45000] = -7;
  Tensor ids = Tensor::from_vector(v, {int64_t(v.size())}), dev = ids.to(kCuda);
  EXPECT_EQ(ops::first_index_outside(dev, 0, 1000, -100), ops::first_index_outside(ids, 0, 1000, -100));
  EXPECT_EQ(ops::first_index_outside(dev, 0, 1000, -100), 40000);
  EXPECT_EQ(ops::first_index_outside(dev, -200, 2000, -1), -1);
  EXPECT_EQ(ops::count_not_equal(dev, -100), ops::count_not_equal(ids, -100));
  EXPECT_EQ(ops::max_index(dev), ops::max_index(ids));
}

TEST(CudaOps, AdamWIsBitIdenticalAndGradNormMatches) {
  TITAN_REQUIRE_CUDA();
  const int64_t n = 100000;
  Tensor p = random_tensor({n}, DType::F32, 17), g = random_tensor({n}, DType::F32, 18, -0.1, 0.1),
         m = random_tensor({n}, DType::F32, 19, -0.01, 0.01), v = random_tensor({n}, DType::F32, 20, 0, 1e-4);
  Tensor pd = p.to(kCuda), gd = g.to(kCuda), md = m.to(kCuda), vd = v.to(kCuda);
  ops::AdamWConfig cfg;
  // The bf16 compute copy the kernel writes beside the update: 4 elements per access on whole vectors
  // from an aligned start, one at a time for the rest.
  Tensor copy = Tensor::empty({n}, DType::BF16), copy_d = Tensor::empty({n}, DType::BF16, kCuda);
  // `step` on elements [first, first + count) of every buffer, on the GPU and by the CPU reference.
  auto step_slice = [&](int64_t first, int64_t count, int64_t step) {
    Tensor sp = pd.narrow(0, first, count), sg = gd.narrow(0, first, count), sm = md.narrow(0, first, count),
           sv = vd.narrow(0, first, count), scopy = copy_d.narrow(0, first, count);
    ops::adamw_step(sp, sg, sm, sv, cfg, step, 0.75, &scopy);
    Tensor hp = p.narrow(0, first, count), hg = g.narrow(0, first, count), hm = m.narrow(0, first, count),
           hv = v.narrow(0, first, count), hcopy = copy.narrow(0, first, count);
    kernels::ForceVariant reference("adamw", "reference");
    ops::adamw_step(hp, hg, hm, hv, cfg, step, 0.75, &hcopy);
  };
  auto expect_same = [&](const std::string& what) {
    EXPECT_EQ(pd.to_vector(), p.to_vector()) << "param, " << what;
    EXPECT_EQ(md.to_vector(), m.to_vector()) << "exp_avg, " << what;
    EXPECT_EQ(vd.to_vector(), v.to_vector()) << "exp_avg_sq, " << what;
    EXPECT_EQ(copy_d.to(DType::F32).to_vector(), copy.to(DType::F32).to_vector()) << "bf16 copy, " << what;
  };
  for (int64_t step = 1; step <= 3; ++step) step_slice(0, n, step);
  expect_same("whole vectors");
  EXPECT_EQ(copy.to(DType::F32).to_vector(), p.to(DType::BF16).to(DType::F32).to_vector())
      << "the copy is the params cast";
  step_slice(1, n - 2, 4);
  expect_same("an unaligned start");
  step_slice(0, n - 1, 5);
  expect_same("an aligned start, whole vectors and a tail of 3");
  double cpu;
  {
    kernels::ForceVariant reference("grad_norm", "reference");
    cpu = ops::grad_norm_sq(g);
  }
  EXPECT_NEAR(ops::grad_norm_sq(gd), cpu, cpu * double(n) * 0x1p-52);
  // Several buffers: one f64 total on the GPU, one host read.
  const double want = 2 * cpu + ops::grad_norm_sq(pd.to(Device::CPU));
  DeviceServices& gpu = device_services(kCuda);
  const int64_t before = gpu.host_reads();
  EXPECT_NEAR(ops::grad_norm_sq({gd, pd, gd}), want, want * 3 * double(n) * 0x1p-52);
  EXPECT_EQ(gpu.host_reads() - before, 1);
}

// bf16 activation gradients on the GPU (ops/activation_grads.h): the kernels that read and write
// bf16 gradients themselves (rms_norm, rope, swiglu: f32 arithmetic, rounded once as stored) give
// exactly the f32-gradient kernels' results rounded to bf16, and linear's GEMMs writing bf16 within
// one bf16 ulp of them (cuBLASLt may pick another algorithm for a bf16 output), as do cuDNN's and
// titan's tensor-core attention backwards (dq by float atomics, in another order each run);
// the weights' f32 gradients do not change. The upstream gradients hold bf16 values, so both runs
// start from the same numbers. The f32-gradient kernels are checked against the CPU above.
using ActivationOp = std::function<Tensor(const std::vector<Tensor>&, const std::vector<Tensor>&)>;
void expect_bf16_grads_round_the_f32_ones(const ActivationOp& f, const std::vector<Tensor>& activations,
                                          const std::vector<Tensor>& weights, double rtol) {
  const ActivationGradsRun f32 = run_activation_grads(f, activations, weights, false, kCuda),
                           bf16 = run_activation_grads(f, activations, weights, true, kCuda);
  for (size_t i = 0; i < activations.size(); ++i) {
    SCOPED_TRACE("activation " + std::to_string(i));
    EXPECT_EQ(bf16.seen[i], DType::BF16);
    const auto got = bf16.grads[i].to_vector(), want = f32.grads[i].to(DType::BF16).to_vector();
    if (rtol == 0) {
      EXPECT_EQ(got, want);
      continue;
    }
    double max_want = 0;
    for (double v : want) max_want = std::max(max_want, std::fabs(v));
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_LE(std::fabs(got[k] - want[k]), rtol * std::fabs(want[k]) + 1e-3 * max_want) << "element " << k;
  }
  for (size_t i = activations.size(); i < f32.grads.size(); ++i)
    EXPECT_EQ(bf16.grads[i].to_vector(), f32.grads[i].to_vector()) << "weight " << i - activations.size();
}

TEST(CudaOps, Bf16ActivationGradientsAreTheF32OnesRounded) {
  TITAN_REQUIRE_CUDA();
  const double one_ulp = std::ldexp(1.0, -7);  // of a bf16 value in [1, 2): 2^-7 relative at most
  for (const Shape& s : {Shape{33, 128}, Shape{70, 2560}, Shape{5, 1030}, Shape{2, 9000}}) {
    SCOPED_TRACE("rms_norm " + Tensor::empty(s, DType::BF16).str());
    expect_bf16_grads_round_the_f32_ones(
        [](const std::vector<Tensor>& a, const std::vector<Tensor>& w) {
          return ops::rms_norm(a[0], w[0], 1e-6);
        },
        {random_tensor(s, DType::BF16, 1, -2, 2)}, {random_tensor({s.back()}, DType::BF16, 2, 0.5, 1.5)}, 0);
  }
  for (int64_t D : {10, 12, 128}) {
    SCOPED_TRACE("rope D " + std::to_string(D));
    const Tensor pos = Tensor::from_vector(std::vector<int64_t>{0, 5, 2, 9, 4}, {5});
    expect_bf16_grads_round_the_f32_ones(
        [&](const std::vector<Tensor>& a, const std::vector<Tensor>&) {
          return ops::rope(a[0], pos.to(kCuda), 1e6);
        },
        {random_tensor({2, 5, 3, D}, DType::BF16, 3)}, {}, 0);
  }
  for (const Shape& s : {Shape{7, 96}, Shape{3, 5, 7}}) {
    SCOPED_TRACE("swiglu " + Tensor::empty(s, DType::BF16).str());
    expect_bf16_grads_round_the_f32_ones(
        [](const std::vector<Tensor>& a, const std::vector<Tensor>&) { return ops::swiglu(a[0], a[1]); },
        {random_tensor(s, DType::BF16, 4, -4, 4), random_tensor(s, DType::BF16, 5)}, {}, 0);
  }
  SCOPED_TRACE("linear");
  expect_bf16_grads_round_the_f32_ones(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>& w) { return ops::linear(a[0], w[0]); },
      {random_tensor({65, 96}, DType::BF16, 6)}, {random_tensor({48, 96}, DType::BF16, 7)}, one_ulp);
  // An input whose gradient is a parameter's preset f32 buffer: the bf16-gradient GEMM adds into it
  // in f32 (beta = 1), from the same bf16 dy as the f32-gradient kernel's copy: the same sums.
  const Tensor x0 = random_tensor({65, 96}, DType::BF16, 6), w0 = random_tensor({48, 96}, DType::BF16, 7);
  const Tensor held = random_tensor({65, 96}, DType::F32, 8), dy = random_tensor({65, 48}, DType::BF16, 9);
  std::vector<Tensor> added;
  for (bool bf16_grads : {false, true}) {
    autograd::Bf16ActivationGradientsScope setting(bf16_grads);
    Tensor x = x0.to(kCuda).set_requires_grad(true);
    Tensor buffer = held.to(kCuda);
    x.set_grad(buffer);
    Tensor y = ops::linear(x, w0.to(kCuda));
    autograd::backward(autograd::current_tape(), {y}, {dy.to(kCuda)});
    added.push_back(buffer.to(Device::CPU));
  }
  EXPECT_EQ(added[1].to_vector(), added[0].to_vector()) << "into a parameter's buffer";
  // The same buffer holding an earlier step's values, marked unwritten (ParamBlock::zero_grad): the
  // step's first gradient replaces them, in f32, with either kernel.
  std::vector<Tensor> written;
  for (bool bf16_grads : {false, true}) {
    autograd::Bf16ActivationGradientsScope setting(bf16_grads);
    Tensor x = x0.to(kCuda).set_requires_grad(true);
    Tensor buffer = held.to(kCuda);
    x.set_grad(buffer);
    x.autograd_meta()->grad_unwritten = std::make_shared<bool>(true);
    Tensor y = ops::linear(x, w0.to(kCuda));
    autograd::backward(autograd::current_tape(), {y}, {dy.to(kCuda)});
    EXPECT_FALSE(*x.autograd_meta()->grad_unwritten);
    written.push_back(buffer.to(Device::CPU));
  }
  // (Not bit for bit: the bf16-gradient kernel zeroes the buffer and adds, beta = 1, and the f32 one
  // writes, beta = 0, which cuBLASLt may plan with another reduction order.)
  const std::vector<double> bf16_written = written[1].to_vector(), f32_written = written[0].to_vector();
  for (size_t i = 0; i < f32_written.size(); ++i)
    EXPECT_NEAR(bf16_written[i], f32_written[i], 1e-5 * (1 + std::abs(f32_written[i])))
        << "over a parameter's unwritten buffer, element " << i;
  const std::vector<double> sum = added[0].to_vector(), old = held.to_vector(),
                            fresh = written[0].to_vector();
  for (size_t i = 0; i < fresh.size(); ++i)
    EXPECT_NEAR(fresh[i], sum[i] - old[i], 1e-5 * (1 + std::abs(sum[i]))) << "element " << i;
}

// Each attention variant's bf16-gradient backward against its f32 one, rounded. The mma_sync and
// cudnn variants have tests of their own (named *Mma* and *Cudnn*: gpu_check runs those cases in
// processes of their own, so that a fault in a kernel never yet run cannot take the others down).
void expect_attention_bf16_grads_round_the_f32_ones(const char* variant) {
  const kernels::KernelEntry& entry = kernels::find_kernel("attention", kCuda, DType::BF16, variant);
  if (const std::string why = entry.available ? entry.available() : ""; !why.empty()) {
    std::printf("[ SKIPPED  ] attention %s: %s\n", variant, why.c_str());
    return;
  }
  SCOPED_TRACE(variant);
  kernels::ForceVariant force("attention", variant);
  expect_bf16_grads_round_the_f32_ones(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>&) {
        return ops::attention(a[0], a[1], a[2], 1.0 / std::sqrt(128.0));
      },
      {random_tensor({2, 256, 4, 128}, DType::BF16, 8), random_tensor({2, 256, 2, 128}, DType::BF16, 9),
       random_tensor({2, 256, 2, 128}, DType::BF16, 10)},
      {}, variant == std::string("f32_math") ? 0 : std::ldexp(1.0, -7));  // dq by float atomics: any order
  // A head_dim no tensor-core kernel takes (cuDNN's variant falls back to f32 copies there), and
  // block-causal attention: one call per document, on views at the documents' offsets.
  expect_bf16_grads_round_the_f32_ones(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>&) {
        return ops::attention(a[0], a[1], a[2], 0.3);
      },
      {random_tensor({1, 40, 2, 12}, DType::BF16, 11), random_tensor({1, 40, 1, 12}, DType::BF16, 12),
       random_tensor({1, 40, 1, 12}, DType::BF16, 13)},
      {}, 0);
  const ops::DocumentSpans documents{{0, 37, 100, 128, 192}};  // rows of 128: 128 starts the second
  expect_bf16_grads_round_the_f32_ones(
      [&](const std::vector<Tensor>& a, const std::vector<Tensor>&) {
        return ops::attention(a[0], a[1], a[2], 1.0 / std::sqrt(128.0), documents);
      },
      {random_tensor({2, 128, 4, 128}, DType::BF16, 14), random_tensor({2, 128, 2, 128}, DType::BF16, 15),
       random_tensor({2, 128, 2, 128}, DType::BF16, 16)},
      {}, variant == std::string("f32_math") ? 0 : std::ldexp(1.0, -7));
}

TEST(CudaOps, Bf16ActivationGradientsOfTheDefaultAndF32AttentionAreTheF32OnesRounded) {
  TITAN_REQUIRE_CUDA();
  expect_attention_bf16_grads_round_the_f32_ones("default");
  expect_attention_bf16_grads_round_the_f32_ones("f32_math");
}
TEST(CudaOpsMma, Bf16ActivationGradientsOfTheMmaSyncAttentionAreTheF32OnesRounded) {
  TITAN_REQUIRE_CUDA();
  expect_attention_bf16_grads_round_the_f32_ones("mma_sync");
}
TEST(CudaOpsCudnn, Bf16ActivationGradientsOfTheCudnnAttentionAreTheF32OnesRounded) {
  TITAN_REQUIRE_CUDA();
  expect_attention_bf16_grads_round_the_f32_ones("cudnn");
}

}  // namespace
}  // namespace titan

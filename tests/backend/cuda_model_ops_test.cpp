// Attention, the losses and the MoE ops through the public ops API on Device::CUDA (inputs copied
// there, outputs and gradients checked to stay there) against the CPU "reference" variant, forward
// and every input gradient, f32 and bf16, with the tolerances of docs/kernels.md ("CUDA kernels").
// The kernel-level tests (cuda_attention_test, cuda_cross_entropy_test, cuda_moe_test) sweep more
// shapes and every algorithm; these check the ops' device plumbing. A model initialised on the GPU
// holds the CPU's bits. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/moe/moe.h"

namespace titan {
namespace {

using testing::expect_device_matches_reference;
using testing::make_labels;
using testing::random_tensor;

constexpr Device kCuda = Device::CUDA;

Tensor grad_input(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1) {
  return random_tensor(shape, dtype, seed, lo, hi).set_requires_grad(true);
}

// Attention of q [B, S, Hq, D] over k, v [B, S, Hkv, D] on the GPU (causal within each of
// `documents`, whole rows when empty) against the CPU reference, forward and every gradient, f32 and
// bf16. f32: the f32-math kernels, summation order only. bf16: the tensor-core kernels round P, dS
// and dout to bf16 (head_dim 64/128; other head_dims take the f32-math kernels, well inside this).
struct AttentionCase {
  int64_t B, S, Hq, Hkv, D;
  std::vector<int64_t> starts;  // ops::DocumentSpans (none: causal rows)
};
void expect_attention_matches_the_cpu(const AttentionCase& c) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const double scale = 1.0 / std::sqrt(double(c.D));
    const ops::DocumentSpans documents{c.starts};
    auto f = [scale, documents](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::attention(in[0], in[1], in[2], scale, documents)};
    };
    SCOPED_TRACE(std::to_string(c.B) + " x " + std::to_string(c.S) + " x " + std::to_string(c.D) + " " +
                 std::string(dtype_name(dt)) + ", " + std::to_string(c.starts.size()) + " document starts");
    const double tol = dt == DType::F32 ? 2e-5 : 1e-2;
    expect_device_matches_reference(
        "attention", kCuda, f,
        {grad_input({c.B, c.S, c.Hq, c.D}, dt, 1, -2, 2), grad_input({c.B, c.S, c.Hkv, c.D}, dt, 2, -2, 2),
         grad_input({c.B, c.S, c.Hkv, c.D}, dt, 3)},
        tol, tol);
  }
}

TEST(CudaModelOps, Attention) {
  TITAN_REQUIRE_CUDA();
  for (const AttentionCase& c : {AttentionCase{1, 1, 2, 1, 8, {}}, AttentionCase{2, 37, 4, 2, 64, {}},
                                 AttentionCase{1, 70, 4, 1, 25, {}}, AttentionCase{2, 100, 4, 2, 128, {}}})
    expect_attention_matches_the_cpu(c);
}

// Block-causal attention (packed documents, ops::DocumentSpans) on the GPU: one launch per document
// on views at any token, rows holding one document merged into one launch; against the CPU
// reference's per-document calls. Documents of 1 token, of a 64-key tile and a token more, views at
// odd tokens (the lse of Hq = 2 is then off 16-byte boundaries: cuDNN's variant takes the f32-math
// kernels there), head_dim 64 and 128 on the tensor cores, 24 on the f32-math kernels.
TEST(CudaModelOps, BlockCausalAttention) {
  TITAN_REQUIRE_CUDA();
  for (const AttentionCase& c :
       {AttentionCase{4, 150, 4, 2, 64, {0, 1, 66, 131, 150, 300, 450}},  // rows 1-3: one launch
        AttentionCase{3, 100, 2, 1, 128, {0, 37, 100, 200, 201, 202, 265}},
        AttentionCase{2, 70, 4, 1, 24, {0, 5, 70, 71}}})
    expect_attention_matches_the_cpu(c);
}

TEST(CudaModelOps, CrossEntropy) {
  TITAN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::cross_entropy(in[0], in[1])};
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [N, V] : {std::pair<int64_t, int64_t>{7, 1000}, {33, 257}})
      expect_device_matches_reference("cross_entropy", kCuda, f,
                                      {grad_input({N, V}, dt, 4, -8, 8), make_labels(N, V, 5, {1, 4})}, 1e-6,
                                      2e-5);
}

TEST(CudaModelOps, LinearCrossEntropy) {
  TITAN_REQUIRE_CUDA();
  struct Case {
    int64_t N, V, D, chunk;
  };
  // keep_logits_bytes: 0 recomputes the logits in backward; 1 GiB keeps them from forward.
  for (const Case& c : {Case{37, 1000, 19, 384}, Case{16, 100, 8, 7}, Case{13, 257, 64, 8192}})
    for (DType dt : {DType::F32, DType::BF16})
      for (int64_t keep : {int64_t(0), int64_t(1) << 30}) {
        SCOPED_TRACE(keep ? "logits kept" : "logits recomputed");
        auto f = [chunk = c.chunk, keep](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::linear_cross_entropy(in[0], in[1], in[2], -100, chunk,
                                                               ops::Reduction::Mean, nullptr, true, keep)};
        };
        const bool bf = dt == DType::BF16;
        expect_device_matches_reference(
            "linear_cross_entropy", kCuda, f,
            {grad_input({c.N, c.D}, dt, 6), grad_input({c.V, c.D}, dt, 7), make_labels(c.N, c.V, 8, {0, 5})},
            bf ? 1e-5 : 1e-6, bf ? 1e-3 : 1e-4);
      }
}

// A label outside [0, V) is rejected on the device with the CPU's message.
TEST(CudaModelOps, BadLabelErrorsAsOnTheCpu) {
  TITAN_REQUIRE_CUDA();
  Tensor logits = random_tensor({4, 10}, DType::F32, 9);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, -100, 10, 3}, {4});
  auto message = [](const Tensor& x, const Tensor& y) {
    try {
      ops::cross_entropy(x, y);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string cpu = message(logits, labels);
  ASSERT_FALSE(cpu.empty()) << "the CPU op accepted label 10 with V = 10";
  EXPECT_EQ(message(logits.to(kCuda), labels.to(kCuda)), cpu);
}

TEST(CudaModelOps, RouterTopk) {
  TITAN_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [T, E, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 8, 2}, {64, 128, 8}}) {
      auto f = [k = k](const std::vector<Tensor>& in) {
        auto r = ops::router_topk(in[0], k, true, in[1]);
        return std::vector<Tensor>{r.weights, r.indices.tensor(), r.probs, r.counts};
      };
      expect_device_matches_reference(
          "router_topk", kCuda, f,
          {grad_input({T, E}, dt, 10, -2, 2), random_tensor({E}, DType::F32, 11, 0, 0.01)}, 1e-7, 2e-5);
    }
}

TEST(CudaModelOps, MoeAuxLoss) {
  TITAN_REQUIRE_CUDA();
  const int64_t E = 8, k = 2;
  std::vector<Tensor> probs, indices;
  for (int64_t T : {37, 20}) {
    autograd::NoGradGuard no_grad;
    kernels::ForceVariant ref("router_topk", "reference");
    auto r = ops::router_topk(random_tensor({T, E}, DType::F32, uint64_t(T)), k, true);
    probs.push_back(r.probs.set_requires_grad(true));
    indices.push_back(r.indices.tensor());
  }
  auto f = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::moe_aux_loss({in[0], in[1]}, {in[2], in[3]}, E, k)};
  };
  expect_device_matches_reference("moe_aux_loss", kCuda, f, {probs[0], probs[1], indices[0], indices[1]},
                                  1e-7, 1e-6);
}

TEST(CudaModelOps, MoeExperts) {
  TITAN_REQUIRE_CUDA();
  struct Case {
    int64_t T, D, F, E, k;
  };
  for (const Case& c : {Case{5, 6, 4, 4, 2}, Case{37, 24, 20, 7, 3}, Case{131, 72, 40, 8, 2}})
    for (DType dt : {DType::F32, DType::BF16}) {
      ops::RouterOutput r;
      {
        autograd::NoGradGuard no_grad;
        kernels::ForceVariant ref("router_topk", "reference");
        r = ops::router_topk(random_tensor({c.T, c.E}, DType::F32, 12, -2, 2), c.k, true);
      }
      const double sd = 1.7 / std::sqrt(double(c.D)), sf = 1.7 / std::sqrt(double(c.F));
      auto f = [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::moe_experts(in[0], in[1], in[2], in[3], in[4], in[5])};
      };
      const double n = double(std::max({c.T, c.D, c.F}));
      const bool bf = dt == DType::BF16;
      expect_device_matches_reference(
          "moe_experts", kCuda, f,
          {grad_input({c.T, c.D}, dt, 13), r.weights.detach().set_requires_grad(true), r.indices.tensor(),
           grad_input({c.E, c.F, c.D}, dt, 14, -sd, sd), grad_input({c.E, c.F, c.D}, dt, 15, -sd, sd),
           grad_input({c.E, c.D, c.F}, dt, 16, -sf, sf)},
          bf ? 1e-2 : 1e-7 * n, bf ? 1e-2 : 1e-5);
    }
}

// The expert-bias balancing update on the GPU is the CPU's to the bit: f64 means in expert order,
// one f32 add per expert; counts as one row [E] or one row per micro-batch [M, E] (summed), loads
// with ties and experts that got nothing, E from the debug model's 8 to past one block of threads.
TEST(CudaModelOps, UpdateExpertBiasIsTheCpusBits) {
  TITAN_REQUIRE_CUDA();
  for (int64_t E : {8, 64, 300})
    for (int64_t M : {0, 1, 3}) {  // 0: counts [E]
      SCOPED_TRACE("E " + std::to_string(E) +
                   (M ? ", " + std::to_string(M) + " micro-batches" : ", one row"));
      std::vector<int64_t> loads(size_t(std::max<int64_t>(M, 1) * E));
      for (size_t i = 0; i < loads.size(); ++i)
        loads[i] = int64_t((i * 2654435761u) % 7 == 0 ? 0 : (i * 40503u) % 97);
      const Tensor counts = M ? Tensor::from_vector(loads, {M, E}) : Tensor::from_vector(loads, {E});
      Tensor cpu_bias = random_tensor({E}, DType::F32, uint64_t(E + M), -0.1, 0.1);
      Tensor gpu_bias = cpu_bias.to(kCuda);
      const Tensor gpu_counts = counts.to(kCuda);
      for (int step = 0; step < 3; ++step) {  // a few updates in a row: the biases keep their mean
        ops::update_expert_bias(cpu_bias, counts, 1e-3);
        ops::update_expert_bias(gpu_bias, gpu_counts, 1e-3);
      }
      EXPECT_EQ(gpu_bias.device(), kCuda);
      const Tensor got = gpu_bias.to(Device::CPU);
      EXPECT_EQ(0, std::memcmp(got.data<float>(), cpu_bias.data<float>(), size_t(E) * sizeof(float)))
          << "the GPU's biases differ from the CPU's";
    }
}

// The expert counts of the tokens before the padding (what the expert bias balances in padded
// conversation rows) on the GPU: the CPU's, for all tokens and for ranges.
TEST(CudaModelOps, ExpertCountsOfCountedTokensAreTheCpus) {
  TITAN_REQUIRE_CUDA();
  const int64_t E = 64, k = 4, T = 1000;
  std::vector<int64_t> v(size_t(T * k));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 2654435761u) % size_t(E));
  const Tensor idx = Tensor::from_vector(v, {T, k});
  const ops::ExpertIndices cpu = ops::expert_indices(idx, E), gpu = ops::expert_indices(idx.to(kCuda), E);
  for (const std::vector<ops::TokenRange>& counted :
       std::vector<std::vector<ops::TokenRange>>{{}, {{0, 700}}, {{3, 4}, {100, 512}, {999, 1000}}}) {
    const Tensor got = ops::expert_counts(gpu, counted);
    EXPECT_EQ(got.device(), kCuda);
    EXPECT_EQ(got.to(Device::CPU).to_vector(), ops::expert_counts(cpu, counted).to_vector());
  }
}

// ops::normal_init on the GPU runs the CPU's arithmetic, so a random init is the same bits on both:
// whole models under both schemes (torchtitan's truncates the output at 3 std, norms are ones) and a
// rank's slices of a born-sharded one (slices that start inside a parameter and inside a normal
// pair). The GPU draws in place: its allocator never holds more than the model's own buffers.
TEST(CudaModelOps, InitializeDrawsTheCpuBits) {
  TITAN_REQUIRE_CUDA();
  qwen3::ModelArgs args = qwen3::flavor("debugmodel");
  args.n_layers = 2;
  args.vocab_size = 1001;
  auto expect_same_bits = [](const qwen3::Qwen3Model& cpu, const qwen3::Qwen3Model& gpu) {
    ASSERT_EQ(cpu.blocks().size(), gpu.blocks().size());
    for (size_t b = 0; b < cpu.blocks().size(); ++b) {
      const Tensor& want = cpu.blocks()[b].shard();
      const Tensor got = gpu.blocks()[b].shard().to(Device::CPU);
      ASSERT_EQ(want.numel(), got.numel()) << cpu.blocks()[b].name();
      EXPECT_EQ(0, std::memcmp(want.data<float>(), got.data<float>(), size_t(want.nbytes())))
          << cpu.blocks()[b].name() << ": the GPU's init differs from the CPU's";
    }
  };
  for (qwen3::InitScheme scheme : {qwen3::InitScheme::HuggingFace, qwen3::InitScheme::Torchtitan})
    for (nn::BlockShard shard : {nn::BlockShard{0, 1}, nn::BlockShard{1, 3}}) {
      SCOPED_TRACE(std::string(scheme == qwen3::InitScheme::Torchtitan ? "torchtitan" : "huggingface") +
                   " scheme, slice " + std::to_string(shard.index) + " of " + std::to_string(shard.count));
      qwen3::Qwen3Model cpu(args, DType::F32, Device::CPU, shard), gpu(args, DType::F32, kCuda, shard);
      // NaN everywhere first: the gaps and the padding must be written (zeros) too.
      for (auto* m : {&cpu, &gpu})
        for (auto& b : m->blocks()) b.shard().fill(NAN);
      DeviceServices& cuda = device_services(kCuda);
      cuda.synchronize();
      const int64_t held = cuda.stats().current_bytes;
      cuda.reset_peak();
      cpu.initialize(17, scheme);
      gpu.initialize(17, scheme);
      cuda.synchronize();
      EXPECT_EQ(cuda.stats().peak_bytes, held) << "the GPU's init allocated beside the model's buffers";
      expect_same_bits(cpu, gpu);
    }
}

}  // namespace
}  // namespace titan

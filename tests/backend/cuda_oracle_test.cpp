// The transformers oracles on the GPU: the tiny dense (tied) and MoE checkpoints loaded into an f32
// model on Device::CUDA (f32 GEMMs with TF32 off, the f32-math attention), one forward + backward:
// logits, loss, aux loss and every parameter gradient within 1e-4 of transformers (the CPU run is
// held to 1e-5 by qwen3_oracle_test; the GPU sums in other orders). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda_test_util.h"
#include "models/oracle_check.h"
#include "test_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/generate.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan {
namespace {

TEST(CudaOracle, DenseTiedMatchesTransformers) {
  TITAN_REQUIRE_CUDA();
  testing::check_against_oracle("tiny_dense", Device::CUDA, 1e-4);
}

TEST(CudaOracle, MoeWithAuxLossMatchesTransformers) {
  TITAN_REQUIRE_CUDA();
  testing::check_against_oracle("tiny_moe", Device::CUDA, 1e-4);
}

// `titan generate --device cuda`: a checkpoint loaded onto the GPU gives transformers' next-token
// logits at every position of the oracle's first row fed through the KV cache (within 1e-4) and the greedy
// tokens the CPU model gives.
TEST(CudaOracle, GenerateOnTheGpuMatchesTransformersAndTheCpu) {
  TITAN_REQUIRE_CUDA();
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    auto gpu = qwen3::load_hf_model(testing::oracle_dir(name), DType::F32, Device::CUDA);
    auto cpu = qwen3::load_hf_model(testing::oracle_dir(name), DType::F32);
    ASSERT_EQ(gpu->device(), Device::CUDA);
    auto ref = io::SafetensorsFile::open(testing::oracle_dir(name) / "reference.safetensors");
    const Tensor ids = testing::load_tensor(ref, "input_ids"), logits = testing::load_tensor(ref, "logits");
    const int64_t S = ids.size(1), V = logits.size(2);
    // A prompt of 5 tokens, then one at a time over the KV cache (ops::cached_attention on the GPU).
    qwen3::KVCache cache = gpu->kv_cache(1, S);
    for (int64_t at = 0; at < S;) {
      const int64_t n = at == 0 ? 5 : 1;
      Tensor piece = Tensor::empty({1, n}, DType::I64);
      std::copy(ids.data<int64_t>() + at, ids.data<int64_t>() + at + n, piece.data<int64_t>());
      const Tensor got = gpu->next_token_logits(piece.to(Device::CUDA), cache).to(Device::CPU).to(DType::F32);
      at += n;
      const float* expected = logits.data<float>() + (at - 1) * V;
      double worst = 0;
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(double(got.data<float>()[v] - expected[v])));
      EXPECT_LE(worst, 1e-4) << name << " position " << at - 1;
    }
    const std::vector<int64_t> prompt(ids.data<int64_t>(), ids.data<int64_t>() + 4);
    const qwen3::Generation on_gpu = qwen3::generate(*gpu, prompt, 12, qwen3::SamplingOptions{}, {});
    const qwen3::Generation on_cpu = qwen3::generate(*cpu, prompt, 12, qwen3::SamplingOptions{}, {});
    EXPECT_EQ(on_gpu.ids, on_cpu.ids) << name;
  }
}

// A GenerationSession on the GPU (`titan generate --interactive` and scoring with --device cuda):
// teacher-forced scores of the oracle's first row after prompts of 3 and then 5 of its tokens (the
// second keeping 4 cached positions and running the rest as one piece: ops::cached_attention with
// several queries over a non-empty cache) are the log-softmax of transformers' logits (1e-4); a
// session's generation and a beam search (the KV cache's rows reordered on the device) give the CPU's
// tokens.
TEST(CudaOracle, ASessionAndABeamSearchOnTheGpuAgreeWithTransformersAndTheCpu) {
  TITAN_REQUIRE_CUDA();
  for (const std::string name : {"tiny_dense", "tiny_moe"}) {
    auto gpu = qwen3::load_hf_model(testing::oracle_dir(name), DType::F32, Device::CUDA);
    auto cpu = qwen3::load_hf_model(testing::oracle_dir(name), DType::F32);
    auto ref = io::SafetensorsFile::open(testing::oracle_dir(name) / "reference.safetensors");
    const Tensor ids = testing::load_tensor(ref, "input_ids"), logits = testing::load_tensor(ref, "logits");
    const int64_t S = ids.size(1), V = logits.size(2);
    const std::vector<int64_t> row(ids.data<int64_t>(), ids.data<int64_t>() + S);
    qwen3::GenerationSession session(*gpu);
    for (const int64_t P : {int64_t(3), int64_t(5)}) {
      const std::vector<int64_t> prompt(row.begin(), row.begin() + P), rest(row.begin() + P, row.end());
      const qwen3::ContinuationScore got = session.score(prompt, rest);
      EXPECT_EQ(session.reused(), P == 3 ? 0 : 4) << name;
      ASSERT_EQ(got.logprobs.size(), rest.size());
      for (size_t j = 0; j < rest.size(); ++j) {
        const float* l = logits.data<float>() + (P - 1 + int64_t(j)) * V;
        double top = l[0], z = 0;
        for (int64_t v = 0; v < V; ++v) top = std::max(top, double(l[v]));
        for (int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - top);
        EXPECT_NEAR(got.logprobs[j], double(l[rest[j]]) - top - std::log(z), 1e-4)
            << name << " P " << P << " j " << j;
      }
    }
    const std::vector<int64_t> prompt(row.begin(), row.begin() + 4);
    EXPECT_EQ(session.generate(prompt, 8, qwen3::SamplingOptions{}, {}).ids,
              qwen3::generate(*cpu, prompt, 8, qwen3::SamplingOptions{}, {}).ids)
        << name;
    qwen3::BeamSearchOptions beams;
    beams.num_beams = 3;
    beams.num_return_sequences = 3;
    const auto on_gpu = qwen3::beam_search(*gpu, prompt, 6, beams, qwen3::SamplingOptions{}, {});
    const auto on_cpu = qwen3::beam_search(*cpu, prompt, 6, beams, qwen3::SamplingOptions{}, {});
    ASSERT_EQ(on_gpu.size(), on_cpu.size());
    for (size_t k = 0; k < on_gpu.size(); ++k) {
      EXPECT_EQ(on_gpu[k].ids, on_cpu[k].ids) << name << " sequence " << k;
      EXPECT_NEAR(*on_gpu[k].score, *on_cpu[k].score, 1e-4) << name << " sequence " << k;
    }
  }
}

}  // namespace
}  // namespace titan

// The transformers oracles on the GPU: the tiny dense (tied) and MoE checkpoints loaded into an f32
// model on Device::CUDA (f32 GEMMs with TF32 off, the f32-math attention), one forward + backward:
// logits, loss, aux loss and every parameter gradient within 1e-4 of transformers (the CPU run is
// held to 1e-5 by qwen3_oracle_test; the GPU sums in other orders). Skips without a GPU.
#include <gtest/gtest.h>

#include "backend/cuda_test_util.h"
#include "models/oracle_check.h"

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

}  // namespace
}  // namespace titan

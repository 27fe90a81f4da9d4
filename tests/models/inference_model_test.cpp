// A model built for inference (qwen3::Purpose::Inference: generation, evaluation, export) holds
// its weights and no gradients: its blocks allocate half of a training model's bytes (the CPU
// allocator's counters), its parameters require no gradient so a forward records nothing, and it
// computes what a training model with the same weights computes, bit for bit; born sharded too.
#include <gtest/gtest.h>

#include <string>

#include "models/small_args.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/optimizer.h"

namespace titan {
namespace {

using qwen3::Purpose;
using qwen3::Qwen3Model;

TEST(InferenceModel, HoldsTheWeightsAloneAndComputesTheSameLogits) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "MoE" : "dense");
    const qwen3::ModelArgs args = testing::small_args(2, moe);
    DeviceServices& cpu = device_services(Device::CPU);
    const int64_t start = cpu.stats().current_bytes;
    Qwen3Model trained(args, DType::F32);
    const int64_t training_bytes = cpu.stats().current_bytes - start;
    Qwen3Model inference(args, DType::F32, Device::CPU, {}, Purpose::Inference);
    const int64_t inference_bytes = cpu.stats().current_bytes - start - training_bytes;
    int64_t weight_bytes = 0;
    for (const auto& b : inference.blocks()) {
      EXPECT_FALSE(b.trainable()) << b.name();
      EXPECT_FALSE(b.grad_resident()) << b.name();
      weight_bytes += int64_t(b.data().nbytes());
      for (const auto& p : b.params()) EXPECT_FALSE(p.value.requires_grad()) << p.name;
    }
    EXPECT_EQ(inference_bytes, weight_bytes);
    EXPECT_EQ(training_bytes, 2 * weight_bytes) << "a training model holds a gradient beside every weight";

    trained.initialize(5);
    inference.initialize(5);
    const Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 999, 41, 7, 0, 512}, {2, 3});
    const Tensor targets = Tensor::from_vector(std::vector<int64_t>{999, 41, 7, 0, 512, 3}, {2, 3});
    // Gradients on: the training model records its tape, the inference model none.
    const qwen3::LossOutput a = trained.forward_loss(ids, targets), b = inference.forward_loss(ids, targets);
    EXPECT_TRUE(a.loss.requires_grad());
    EXPECT_FALSE(b.loss.requires_grad());
    EXPECT_EQ(a.loss.item(), b.loss.item());
    autograd::NoGradGuard no_grad;
    EXPECT_EQ(trained.forward_logits(ids).to_vector(), inference.forward_logits(ids).to_vector());
    inference.zero_grad();  // nothing to zero: no error
  }
}

TEST(InferenceModel, BornShardedHoldsItsWeightSlicesAlone) {
  const qwen3::ModelArgs args = testing::small_args(2, false);
  Qwen3Model rank(args, DType::F32, Device::CPU, nn::BlockShard{1, 2}, Purpose::Inference);
  for (const auto& b : rank.blocks()) {
    EXPECT_TRUE(b.sharded()) << b.name();
    EXPECT_FALSE(b.shard_grad().storage()->resident()) << b.name();
    EXPECT_TRUE(b.shard().storage()->resident()) << b.name();
  }
}

// An optimizer over an inference model's blocks allocates no moments, and stepping it is an error
// naming the block.
TEST(InferenceModel, AnOptimizerHasNoMomentsForItAndRefusesToStepIt) {
  const qwen3::ModelArgs args = testing::small_args(1, false);
  Qwen3Model model(args, DType::F32, Device::CPU, {}, Purpose::Inference);
  train::AdamW adamw(train::OptimizerSection{}, model.blocks());
  for (const Tensor& m : adamw.exp_avg()) EXPECT_FALSE(m.defined());
  for (const Tensor& m : adamw.exp_avg_sq()) EXPECT_FALSE(m.defined());
  try {
    adamw.step(model.blocks(), 1e-3, 1, 1.0);
    ADD_FAILURE() << "stepped an inference model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block 'embedding' belongs to an inference model"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace titan

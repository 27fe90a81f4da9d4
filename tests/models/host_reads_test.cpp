// How often a forward + backward of the model reads a value back to the host. On a GPU every such
// read waits for the stream to drain, so the count is part of the step's speed; the CPU counts
// the same places (DeviceServices::host_reads), so these tests check it on any machine.
//
// What a step reads, per micro-batch, whatever the depth and the layer kinds: the token ids'
// range check (embedding), the labels' range check and target count (the loss), the loss's sum,
// and the loss gradient in its backward. The rope positions are made on the host
// (ops::sequential_positions), and mixture-of-experts layers add no read: the router's expert
// indices are in range by construction (ops::ExpertIndices), so neither moe_experts nor the aux
// loss scans them.
#include <gtest/gtest.h>

#include <random>

#include "models/small_args.h"
#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/optim/optim.h"

namespace titan {
namespace {

using qwen3::Checkpointing;
using qwen3::ModelArgs;
using qwen3::Qwen3Model;

using testing::small_args;

// Host reads of one forward_loss + backward of a freshly initialized model on a random batch.
int64_t host_reads_of_a_step(const ModelArgs& args, Checkpointing checkpointing) {
  Qwen3Model model(args, DType::F32);
  model.set_checkpointing(checkpointing);
  model.initialize(5, qwen3::InitScheme::HuggingFace);
  const int64_t B = 2, S = 16;
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int64_t> tok(0, args.vocab_size - 1);
  std::vector<int64_t> ids(size_t(B * S)), targets(size_t(B * S));
  for (auto& t : ids) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  const Tensor ids_t = Tensor::from_vector(ids, {B, S}), targets_t = Tensor::from_vector(targets, {B, S});

  DeviceServices& cpu = device_services(Device::CPU);
  const int64_t before = cpu.host_reads();
  qwen3::LossOutput out = model.forward_loss(ids_t, targets_t);
  autograd::backward(out.loss);
  const int64_t reads = cpu.host_reads() - before;
  // The step did run: every block has a gradient (read after the count is taken).
  for (auto& b : model.blocks()) EXPECT_GT(ops::grad_norm_sq(b.grad()), 0.0) << b.name();
  return reads;
}

TEST(HostReads, MixtureOfExpertsLayersReadNothingBack) {
  for (Checkpointing c : {Checkpointing::none(), Checkpointing::full()}) {
    SCOPED_TRACE(c == Checkpointing::none() ? "no activation checkpointing"
                                            : "full activation checkpointing");
    const int64_t dense = host_reads_of_a_step(small_args(2, false), c);
    EXPECT_EQ(host_reads_of_a_step(small_args(2, true), c), dense);
    EXPECT_EQ(host_reads_of_a_step(small_args(4, true), c), dense)
        << "reads grew with the number of MoE layers";
  }
}

TEST(HostReads, AStepReadsItsInputsChecksAndLossOnly) {
  // ids range + labels range + target count + loss sum + loss gradient.
  EXPECT_EQ(host_reads_of_a_step(small_args(3, true), Checkpointing::every_nth(2)), 5);
}

TEST(HostReads, TheExpertBiasUpdateReadsNothing) {
  Qwen3Model model(small_args(2, true), DType::F32);
  model.enable_expert_bias();
  model.initialize(5, qwen3::InitScheme::HuggingFace);
  const std::vector<int64_t> ids(32, 7);
  {
    autograd::NoGradGuard no_grad;
    model.forward_loss(Tensor::from_vector(ids, {2, 16}), Tensor::from_vector(ids, {2, 16}));
  }
  const std::vector<std::vector<double>> before_values = model.expert_bias_values();
  DeviceServices& cpu = device_services(Device::CPU);
  const int64_t before = cpu.host_reads();
  model.update_expert_bias(model.last_expert_counts(), 1e-3);
  EXPECT_EQ(cpu.host_reads(), before);
  EXPECT_NE(model.expert_bias_values(), before_values) << "every token went to the same experts: the bias moves";
}

TEST(HostReads, CheckingExpertIndicesIsOneRead) {
  DeviceServices& cpu = device_services(Device::CPU);
  const Tensor indices = Tensor::from_vector(std::vector<int64_t>{0, 3, 2, 1}, {2, 2});
  const int64_t before = cpu.host_reads();
  const ops::ExpertIndices checked = ops::expert_indices(indices, 4);
  EXPECT_EQ(cpu.host_reads() - before, 1);
  EXPECT_EQ(checked.num_experts(), 4);
  EXPECT_EQ(checked.tensor().to_vector(), indices.to_vector());
}

}  // namespace
}  // namespace titan

#include "titan/train/step_profile.h"

#include <chrono>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/optim.h"

namespace titan::train {

StepProfile profile_training_step(const qwen3::ModelArgs& args, const StepShape& shape, Device device) {
  TITAN_CHECK(shape.local_batch >= 1 && shape.seq_len >= 1 && shape.grad_accumulation >= 1,
              "step profile: batch, seq_len and gradient accumulation must be >= 1, got ", shape.local_batch, ", ",
              shape.seq_len, ", ", shape.grad_accumulation);
  const auto t0 = std::chrono::steady_clock::now();
  DeviceServices& dev = device_services(device);
  const int64_t base = dev.stats().current_bytes;
  dev.reset_flops();
  StepProfile p;
  {
    qwen3::Qwen3Model model(args, shape.compute, device);
    model.set_checkpointing(shape.checkpointing);
    for (const auto& b : model.blocks()) {
      p.weights += int64_t(b.data().nbytes());
      p.grads += int64_t(b.grad().nbytes());
    }
    if (shape.expert_bias && args.is_moe()) model.enable_expert_bias();
    std::vector<Tensor> exp_avg, exp_avg_sq;
    for (const auto& b : model.blocks()) {
      exp_avg.push_back(Tensor::zeros({b.numel()}, DType::F32, device));
      exp_avg_sq.push_back(Tensor::zeros({b.numel()}, DType::F32, device));
      p.optimizer += 2 * int64_t(exp_avg.back().nbytes());
    }
    p.other = dev.stats().current_bytes - base - p.weights - p.grads - p.optimizer;

    const int64_t B = shape.local_batch, S = shape.seq_len;
    std::vector<int64_t> ids(size_t(B * S)), targets(size_t(B * S));
    for (int64_t i = 0; i < B * S; ++i) {
      ids[size_t(i)] = (i * 7919) % args.vocab_size;
      targets[size_t(i)] = (i * 7919 + 1) % args.vocab_size;
    }
    dev.reset_peak();
    model.zero_grad();
    for (int64_t micro = 0; micro < shape.grad_accumulation; ++micro) {
      Tensor x = Tensor::from_vector(ids, {B, S}).to(device), y = Tensor::from_vector(targets, {B, S}).to(device);
      qwen3::LossOutput out = model.forward_loss(x, y);
      autograd::backward(shape.grad_accumulation == 1 ? out.loss
                                                      : ops::scale(out.loss, 1.0 / double(shape.grad_accumulation)));
    }
    std::vector<Tensor> grads;
    for (auto& b : model.blocks()) grads.push_back(b.grad());
    const double norm = ops::global_grad_norm(grads);
    ops::AdamWConfig adamw;
    for (size_t b = 0; b < model.blocks().size(); ++b)
      ops::adamw_step(model.blocks()[b].data(), model.blocks()[b].grad(), exp_avg[b], exp_avg_sq[b], adamw, 1,
                      ops::clip_coefficient(1.0, norm));
    p.peak = dev.stats().peak_bytes - base;
  }
  p.flops = dev.flops();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace titan::train

#include "titan/train/step_profile.h"

#include <chrono>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/size_check.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/optim/optim.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"

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

    // Token ids: a fixed pattern on real devices (the values do not change what is allocated);
    // none on meta, where a planned batch may be larger than host memory.
    const int64_t B = shape.local_batch, S = shape.seq_len;
    Tensor x = Tensor::empty({B, S}, DType::I64, device), y = Tensor::empty({B, S}, DType::I64, device);
    if (device != Device::Meta) {
      std::vector<int64_t> ids(size_t(B * S)), targets(size_t(B * S));
      for (int64_t i = 0; i < B * S; ++i) {
        ids[size_t(i)] = (i * 7919) % args.vocab_size;
        targets[size_t(i)] = (i * 7919 + 1) % args.vocab_size;
      }
      x.copy_from(Tensor::from_vector(ids, {B, S}));
      y.copy_from(Tensor::from_vector(targets, {B, S}));
    }
    dev.reset_peak();
    model.zero_grad();
    for (int64_t micro = 0; micro < shape.grad_accumulation; ++micro) {
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

StepShape step_shape(const JobConfig& c, const ResolvedJob& job) {
  StepShape s;
  s.local_batch = job.local_batch_size;
  s.seq_len = job.seq_len;
  s.grad_accumulation = job.accumulation_steps;
  s.compute = job.compute_dtype;
  const std::string& ac = c.activation_checkpoint.mode;
  s.checkpointing = ac == "full"        ? qwen3::Checkpointing::Full
                    : ac == "selective" ? qwen3::Checkpointing::Selective
                                        : qwen3::Checkpointing::None;
  s.expert_bias = job.args.is_moe() && c.training.load_balance == "expert_bias";
  return s;
}

void check_training_fits(const qwen3::ModelArgs& args, const StepShape& shape, Device device) {
  constexpr int64_t kMaxBatchOrSeq = int64_t(1) << 31;
  TITAN_CHECK(shape.local_batch <= kMaxBatchOrSeq, "training.local_batch_size = ", shape.local_batch,
              " exceeds the limit ", kMaxBatchOrSeq);
  TITAN_CHECK(shape.seq_len <= kMaxBatchOrSeq, "training.seq_len = ", shape.seq_len, " exceeds the limit ",
              kMaxBatchOrSeq);
  TITAN_CHECK(shape.seq_len <= args.max_seq_len, "training.seq_len = ", shape.seq_len,
              " exceeds the model's max_seq_len = ", args.max_seq_len);
  const int64_t available =
      device == Device::CPU ? qwen3::available_memory_bytes() : device_services(device).capacity_bytes();
  const std::string what = "training (batch " + std::to_string(shape.local_batch) + " x seq " +
                           std::to_string(shape.seq_len) + ", " + std::to_string(args.num_params()) +
                           " parameters, on " + std::string(device_name(device)) + ")";
  // f32 weights, gradients and two AdamW moments: a model too large for the machine is refused
  // before even the meta model is built (16384 layers of meta tensors take a while to trace).
  const int64_t param_bytes = qwen3::narrow_size(__int128(args.num_params()) * 4, "parameter bytes");
  qwen3::check_memory_fits({param_bytes, param_bytes, 2 * param_bytes, 0}, available, what);
  const StepProfile p = profile_training_step(args, shape, Device::Meta);
  qwen3::check_memory_fits({p.weights, p.grads, p.optimizer + p.other, p.activations()}, available, what);
}

}  // namespace titan::train

#include "titan/train/optimizer.h"

#include "titan/core/check.h"

namespace titan::train {

AdamW::AdamW(const OptimizerSection& c, const std::vector<nn::ParamBlock>& blocks)
    : config_{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.name == "AdamW"} {
  TITAN_CHECK(c.name == "AdamW" || c.name == "Adam", "optimizer.name = ", c.name,
              ": titan has AdamW and Adam");
  ops::validate(config_);
  for (auto& b : blocks) {
    if (!b.trainable()) {  // an inference model's block: nothing to update, no moments
      exp_avg_.emplace_back();
      exp_avg_sq_.emplace_back();
      continue;
    }
    const int64_t n = b.shard().numel();  // this rank's slice (the whole block when it is not sharded)
    exp_avg_.push_back(Tensor::zeros({n}, DType::F32, b.data().device()));
    exp_avg_sq_.push_back(Tensor::zeros({n}, DType::F32, b.data().device()));
  }
}

void AdamW::step(std::vector<nn::ParamBlock>& blocks, double lr, int64_t step, double grad_scale) {
  config_.lr = lr;
  for (size_t b = 0; b < blocks.size(); ++b) {
    TITAN_CHECK(blocks[b].trainable(), "AdamW: block '", blocks[b].name(), "' belongs to an inference model");
    nn::ParamBlock& B = blocks[b];
    ops::adamw_step(B.shard(), B.shard_grad(), exp_avg_[b], exp_avg_sq_[b], config_, step, grad_scale,
                    B.keeps_compute_shard() ? &B.compute_shard() : nullptr);
  }
}

}  // namespace titan::train

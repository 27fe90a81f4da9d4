#pragma once
// AdamW over the model's flat parameter blocks: one exp_avg and one exp_avg_sq buffer per block
// (f32, zero at start) covering this rank's slice of the block (ParamBlock::shard: the whole
// block unless sharded), updated by ops::adamw_step one block at a time. An untrainable block (an
// inference model's) gets no buffers (undefined tensors) and cannot be stepped.
#include <cstdint>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/nn/param_block.h"
#include "titan/ops/optim/optim.h"
#include "titan/train/job_config.h"

namespace titan::train {

// torch.optim.AdamW over the blocks' flat buffers, or torch.optim.Adam (optimizer.name = "Adam": the
// same moments, weight decay added to the gradient as an L2 term instead of decoupled).
class AdamW {
 public:
  // Errors name the optimizer field that breaks torch.optim.AdamW's rules.
  // Moments for each block as this rank holds it (ParamBlock::shard: its slice of a sharded block).
  AdamW(const OptimizerSection& config, const std::vector<nn::ParamBlock>& blocks);

  // One step of this rank's slice of every block at learning rate `lr`; `step` is 1-based; each gradient
  // element is multiplied by `grad_scale` as it is read (the clip coefficient: clipping costs no pass).
  // A block that keeps a compute copy of its slice (ParamBlock::keep_compute_shard) has it rewritten
  // in the same pass.
  void step(std::vector<nn::ParamBlock>& blocks, double lr, int64_t step, double grad_scale);

  // The moments, one buffer per block slice (checkpoints save and restore them).
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const std::vector<Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<Tensor>& exp_avg_sq() const { return exp_avg_sq_; }

 private:
  ops::AdamWConfig config_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace titan::train

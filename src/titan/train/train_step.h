#pragma once
// One optimizer step: the micro-batches of gradient accumulation (forward, loss, backward), the
// global gradient norm, clipping folded into AdamW, the learning rate of the step, and the MoE
// balancing update the model defines. The ParallelPlan's points are where data parallelism
// communicates (parameters before the forward, gradients and the grad norm after the backward).
#include <cstdint>

#include "titan/dist/parallel_plan.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"
#include "titan/train/train_state.h"

namespace titan::train {

struct StepResult {
  double loss = 0;       // mean over the micro-batches
  double aux_loss = -1;  // MoE aux loss, mean over the micro-batches (< 0: dense model)
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;
  int64_t tokens = 0;  // input tokens of the step, over all data-parallel ranks
};

class TrainStep {
 public:
  TrainStep(const JobConfig& config, const ResolvedJob& job, const dist::ParallelPlan& plan);

  // Advances state.step by one. A non-finite loss or gradient norm, or data that ran out, is an
  // error naming the step, raised before the optimizer touches the weights.
  StepResult run(TrainState& state) const;

 private:
  Tensor my_rows(const std::vector<int64_t>& global_batch) const;  // this rank's [batch, seq] rows

  const dist::ParallelPlan& plan_;
  int64_t batch_, seq_len_, accumulation_;
  double max_norm_, expert_bias_coeff_;
};

}  // namespace titan::train

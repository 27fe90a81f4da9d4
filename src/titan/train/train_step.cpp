#include "titan/train/train_step.h"

#include <cmath>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/optim/optim.h"

namespace titan::train {

TrainStep::TrainStep(const JobConfig& c, const ResolvedJob& job, const dist::ParallelPlan& plan)
    : plan_(plan),
      batch_(job.local_batch_size),
      seq_len_(job.seq_len),
      accumulation_(job.accumulation_steps),
      max_norm_(c.training.max_norm),
      expert_bias_coeff_(c.training.load_balance_coeff) {}

Tensor TrainStep::my_rows(const std::vector<int64_t>& global) const {
  const int64_t n = batch_ * seq_len_;
  TITAN_CHECK(int64_t(global.size()) == n * plan_.dp_size(), "data: a global batch of ", global.size(),
              " tokens, expected ", n * plan_.dp_size());
  const auto first = global.begin() + plan_.dp_rank() * n;
  return Tensor::from_vector(std::vector<int64_t>(first, first + n), {batch_, seq_len_});
}

StepResult TrainStep::run(TrainState& s) const {
  auto& model = s.model;
  const int64_t step = ++s.step;
  model.zero_grad();
  double loss_sum = 0, aux_sum = 0;
  for (int64_t micro = 0; micro < accumulation_; ++micro) {
    s.sharding.begin_micro_batch(micro == accumulation_ - 1);
    data::Batch batch = s.loader.next();  // the global micro-batch: dp_size x batch_ rows
    TITAN_CHECK(!batch.empty(), "data: the dataset ran out at step ", step);
    Tensor ids = my_rows(batch.inputs).to(model.device()), targets = my_rows(batch.labels).to(model.device());
    qwen3::LossOutput out = model.forward_loss(ids, targets);
    loss_sum += out.loss.item();
    if (out.aux_loss.defined()) aux_sum += out.aux_loss.item();
    autograd::backward(accumulation_ == 1 ? out.loss : ops::scale(out.loss, 1.0 / double(accumulation_)));
    s.sharding.end_micro_batch();  // after the last one: every rank's shard_grad holds the mean gradient
  }
  // The loss of the step over all ranks (every rank's loss is a mean over the same number of
  // tokens, so the global mean is their mean). Checked after the sum, so that every rank stops
  // at once when any rank's loss is not finite.
  double sums[2] = {loss_sum, aux_sum};
  plan_.all_reduce_sum(sums);
  const double micro_batches = double(accumulation_ * plan_.dp_size());
  const double loss = sums[0] / micro_batches;
  TITAN_CHECK(std::isfinite(loss), "step ", step, ": the loss is not finite (", loss,
              "); stopping before the optimizer step (no checkpoint written)");
  double norm_sq = 0;
  for (auto& b : model.blocks()) norm_sq += ops::grad_norm_sq(b.shard_grad());
  const double grad_norm = std::sqrt(plan_.all_reduce_grad_norm_sq(norm_sq));
  TITAN_CHECK(std::isfinite(grad_norm), "step ", step, ": the gradient norm is not finite (", grad_norm,
              "); stopping before the optimizer step (no checkpoint written)");
  StepResult r;
  r.lr = s.schedule.lr(step - 1);
  // Clipping is folded into the update: AdamW reads each gradient times the clip coefficient.
  s.optimizer.step(model.blocks(), r.lr, step, ops::clip_coefficient(max_norm_, grad_norm));
  if (!model.expert_bias().empty())
    model.update_expert_bias(plan_.sum_over_ranks(model.last_expert_counts()), expert_bias_coeff_);

  r.tokens = batch_ * seq_len_ * accumulation_ * plan_.dp_size();
  s.tokens_seen += r.tokens;
  r.loss = loss;
  r.aux_loss = model.args().is_moe() ? sums[1] / micro_batches : -1;
  r.grad_norm = grad_norm;
  return r;
}

}  // namespace titan::train

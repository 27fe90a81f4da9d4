#include "titan/train/train_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/core/op_timeline.h"
#include "titan/ops/optim/optim.h"

namespace titan::train {

TrainStep::TrainStep(const JobConfig& c, const ResolvedJob& job, const dist::ParallelPlan& plan)
    : plan_(plan),
      batch_(job.local_batch_size),
      seq_len_(job.seq_len),
      accumulation_(job.accumulation_steps),
      block_causal_(c.model.attn_mask_type == "block_causal"),
      max_norm_(c.training.max_norm),
      expert_bias_coeff_(c.training.load_balance_coeff) {}

Tensor TrainStep::my_rows(const std::vector<int64_t>& global) const {
  const int64_t n = batch_ * seq_len_;
  TITAN_CHECK(int64_t(global.size()) == n * plan_.dp_size(), "data: a global batch of ", global.size(),
              " tokens, expected ", n * plan_.dp_size());
  const auto first = global.begin() + plan_.dp_rank() * n;
  return Tensor::from_vector(std::vector<int64_t>(first, first + n), {batch_, seq_len_});
}

namespace {

// Labels the loss trains on (not data::kIgnoreLabel).
int64_t targets_in(std::vector<int64_t>::const_iterator first, std::vector<int64_t>::const_iterator last) {
  return std::count_if(first, last, [](int64_t label) { return label != data::kIgnoreLabel; });
}

// Keeps micro-batch `micro`'s routing counts (the model's last forward) as row `micro` of `kept`:
// the bias update counts every token of the step, as torchtitan does. Device copies, no host read.
void keep_expert_counts(const std::vector<Tensor>& counts, int64_t micro, int64_t accumulation,
                        std::vector<Tensor>& kept) {
  kept.resize(counts.size());
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    const Tensor& c = counts[layer];
    if (!c.defined()) continue;
    if (micro == 0) kept[layer] = Tensor::empty({accumulation, c.numel()}, DType::I64, c.device());
    kept[layer].narrow(0, micro, 1).reshape({c.numel()}).copy_from(c);
  }
}

}  // namespace

qwen3::RowContents row_contents(const data::Batch& batch, int64_t first, int64_t rows, bool block_causal) {
  const int64_t S = batch.seq_len, begin = first * S, end = (first + rows) * S;
  TITAN_CHECK(
      first >= 0 && first + rows <= batch.batch_size && int64_t(batch.lengths.size()) == batch.batch_size,
      "data: rows [", first, ", ", first + rows, ") of a batch of ", batch.batch_size, " with ",
      batch.lengths.size(), " row lengths");
  qwen3::RowContents r;
  if (block_causal)
    for (int64_t start : batch.document_starts)
      if (start >= begin && start < end) r.documents.starts.push_back(start - begin);
  r.lengths.assign(batch.lengths.begin() + first, batch.lengths.begin() + first + rows);
  return r;
}

StepGradients compute_gradients(qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding,
                                const dist::ParallelPlan& plan, int64_t accumulation, const MicroBatchSource& next) {
  profiling::mark_phase("zero grad");
  model.zero_grad();
  StepGradients g;
  double sums[2] = {0, 0};  // loss, aux loss
  double weights = 0;       // of this rank's micro-batches' cross-entropies
  for (int64_t micro = 0; micro < accumulation; ++micro) {
    sharding.begin_micro_batch(micro == accumulation - 1);
    profiling::mark_phase("data");  // the op profiler's phases (core/op_timeline.h)
    const MicroBatch mb = next();
    qwen3::LossOutput out =
        model.forward_loss(mb.ids, mb.targets, mb.ce_weight, 1.0 / double(accumulation), mb.rows);
    if (model.args().is_moe())
      keep_expert_counts(model.last_expert_counts(), micro, accumulation, g.expert_counts);
    autograd::backward(out.loss);
    // Read after the backward is queued: on a GPU a read in between would hold the backward back
    // until the whole forward had run.
    profiling::mark_phase("loss read");
    sums[0] += out.ce_loss.item() * mb.ce_weight;
    weights += mb.ce_weight;
    if (out.aux_loss.defined()) sums[1] += out.aux_loss.item();
    // The waits for the gradient collectives, and the accumulation of what they bring.
    if (sharding.active()) profiling::mark_phase("gradient sync", /*ops_inside=*/true);
    sharding.end_micro_batch();  // after the last one: every rank's shard_grad holds the mean gradient
  }
  // The loss of the step over all ranks: the weighted means add up to dp_size x the mean over every
  // target of the step.
  const bool ranks = plan.dp_size() > 1;
  const bool aux_trains = model.args().is_moe() && model.args().output_router_logits;
  // This rank's own loss: its cross-entropy's mean over its targets (a rank whose rows hold no target,
  // conversations cut before their answers, has none).
  double rank_loss[1] = {-std::numeric_limits<double>::infinity()};
  if (ranks && weights > 0)
    rank_loss[0] = sums[0] / weights +
                   (aux_trains ? model.args().router_aux_loss_coef * sums[1] / double(accumulation) : 0.0);
  if (ranks) profiling::mark_phase("loss all-reduce");
  plan.all_reduce_sum(sums);
  plan.all_reduce_max(rank_loss);
  if (ranks) g.global_max_loss = rank_loss[0];
  const double micro_batches = double(accumulation * plan.dp_size());
  // One host read for all blocks.
  std::vector<Tensor> grads;
  for (const nn::ParamBlock& b : model.blocks()) grads.push_back(b.shard_grad());
  const double norm_sq = ops::grad_norm_sq(grads);
  if (ranks) profiling::mark_phase("grad-norm all-reduce");
  g.aux_loss = model.args().is_moe() ? sums[1] / micro_batches : -1;
  g.loss = sums[0] / double(plan.dp_size());
  if (aux_trains) g.loss += model.args().router_aux_loss_coef * g.aux_loss;
  g.grad_norm = std::sqrt(plan.all_reduce_grad_norm_sq(norm_sq));
  return g;
}

void apply_update(qwen3::Qwen3Model& model, AdamW& optimizer, double lr, int64_t adam_step, double max_norm,
                  double grad_norm, const std::vector<Tensor>& step_expert_counts, double expert_bias_coeff) {
  // Clipping is folded into the update: AdamW reads each gradient times the clip coefficient.
  optimizer.step(model.blocks(), lr, adam_step, ops::clip_coefficient(max_norm, grad_norm));
  if (!model.expert_bias().empty()) model.update_expert_bias(step_expert_counts, expert_bias_coeff);
}

ExpertLoad expert_load(const std::vector<Tensor>& counts) {
  ExpertLoad load;
  for (const Tensor& c : counts) {
    if (!c.defined()) continue;
    const Tensor host = c.to(Device::CPU);  // one small read: layers x micro-batches x E counts
    TITAN_CHECK(host.dtype() == DType::I64 && host.is_contiguous() && host.dim() >= 1,
                "expert_load: counts must be contiguous i64 [..., E], got ", host.str());
    const int64_t E = host.size(-1), rows = host.numel() / E;
    std::vector<int64_t> per_expert(size_t(E), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < E; ++e) per_expert[size_t(e)] += host.data<int64_t>()[r * E + e];
    const int64_t routed = std::accumulate(per_expert.begin(), per_expert.end(), int64_t(0));
    const int64_t most = *std::max_element(per_expert.begin(), per_expert.end());
    load.idle =
        std::max<int64_t>(load.idle, 0) + std::count(per_expert.begin(), per_expert.end(), int64_t(0));
    if (routed > 0)
      load.max_over_mean = std::max(load.max_over_mean, double(most) * double(E) / double(routed));
  }
  return load;
}

StepResult TrainStep::run(TrainState& s) const {
  const int64_t step = ++s.step;
  uint64_t batch_hash = kFnv1aStart;
  // The step's global micro-batches (dp_size x batch_ rows each) are read first: each one's weight in
  // the loss is its share of the step's targets.
  std::vector<data::Batch> batches;
  int64_t step_targets = 0;
  for (int64_t micro = 0; micro < accumulation_; ++micro) {
    batches.push_back(s.loader.next());
    const data::Batch& batch = batches.back();
    if (batch.empty()) throw StepRefused("data: the dataset ran out at step " + std::to_string(step));
    batch_hash = fnv1a(batch.inputs.data(), batch.inputs.size() * sizeof(int64_t), batch_hash);
    step_targets += targets_in(batch.labels.begin(), batch.labels.end());
  }
  // Conversations all cut before their answers leave nothing to learn from; an update would still move
  // the weights (momentum, weight decay) and the schedule.
  if (step_targets == 0)
    throw StepRefused("step " + std::to_string(step) +
                      ": no row of the step has a token to train on (every conversation's answer lies past "
                      "seq_len + 1 = " +
                      std::to_string(seq_len_ + 1) +
                      " tokens, where rows are cut): raise training.seq_len, or "
                      "shorten the prompts");
  int64_t micro = 0;
  const StepGradients g = compute_gradients(s.model, s.sharding, plan_, accumulation_, [&] {
    const data::Batch& batch = batches[size_t(micro++)];
    const int64_t n = batch_ * seq_len_, first = plan_.dp_rank() * n;
    const int64_t mine = targets_in(batch.labels.begin() + first, batch.labels.begin() + first + n);
    const double weight = double(mine * plan_.dp_size()) / double(step_targets);
    const Tensor ids = my_rows(batch.inputs);
    return MicroBatch{ids.to(s.model.device()), my_rows(batch.labels).to(s.model.device()), weight,
                      row_contents(batch, plan_.dp_rank() * batch_, batch_, block_causal_)};
  });
  // Every rank holds the same global figures, so every rank stops at once.
  for (const auto& [what, value] : {std::pair{"loss", g.loss}, std::pair{"gradient norm", g.grad_norm}})
    if (!std::isfinite(value))
      throw StepRefused(
          detail::concat("step ", step, ": the ", what, " is not finite (", value,
                         "); stopping before the optimizer step (no checkpoint of it written)"));
  StepResult r;
  r.lr = s.schedule.lr(step - 1 - s.schedule_start);
  const std::vector<Tensor> step_expert_counts = plan_.sum_over_ranks(g.expert_counts);
  // Read before the update is queued: the counts are ready (the step's backward is done, its loss and
  // norm were read), and a read after it would wait for the optimizer too.
  r.expert_load = expert_load(step_expert_counts);
  apply_update(s.model, s.optimizer, r.lr, step - s.optimizer_start, max_norm_, g.grad_norm,
               step_expert_counts, expert_bias_coeff_);
  r.tokens = batch_ * seq_len_ * accumulation_ * plan_.dp_size();
  for (const data::Batch& batch : batches) {
    for (int64_t length : batch.lengths) r.padding += seq_len_ - length;
    r.conversations += batch.conversations;
    r.cut_conversations += batch.cut_conversations;
    r.cut_trained_tokens += batch.cut_trained_tokens;
  }
  r.targets = step_targets;
  s.tokens_seen += r.tokens;
  r.loss = g.loss;
  r.aux_loss = g.aux_loss;
  r.global_max_loss = g.global_max_loss;
  r.grad_norm = g.grad_norm;
  r.batch_hash = batch_hash;
  return r;
}

}  // namespace titan::train

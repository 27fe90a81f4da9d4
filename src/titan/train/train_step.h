#pragma once
// One optimizer step: the micro-batches of gradient accumulation (forward, loss, backward), the
// global gradient norm, clipping folded into AdamW, the learning rate of the step, and the MoE
// balancing update the model defines. Data parallelism communicates through the state's
// ShardedBlocks (parameters around each layer, gradients after each layer's backward) and the
// ParallelPlan (the step's losses and the global grad norm).
#include <cstdint>
#include <functional>
#include <utility>

#include "titan/dist/parallel_plan.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"
#include "titan/train/train_state.h"

namespace titan::train {

// How evenly a MoE step's routed tokens fell on the experts, over every micro-batch and rank: in
// each MoE layer, its most loaded expert's tokens over the mean per expert (1: even; E / top_k: all
// of them on the same top_k experts), the largest over the layers; and the experts (of every MoE
// layer) that received no token. Dense models: both < 0.
struct ExpertLoad {
  double max_over_mean = -1;
  int64_t idle = -1;
};
// From each layer's routing counts (i64 [..., E], the rows summed; undefined for dense layers).
ExpertLoad expert_load(const std::vector<Tensor>& counts);

struct StepResult {
  double loss = 0;       // the cross-entropy's mean over every target of the step (+ coef x aux)
  double aux_loss = -1;  // MoE aux loss, mean over the micro-batches and ranks (< 0: dense model)
  double global_max_loss = -1;  // StepGradients::global_max_loss
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;
  int64_t tokens = 0;   // input tokens of the step, over all data-parallel ranks
  int64_t padding = 0;  // of those, the positions after a row's last conversation
  int64_t targets = 0;  // of those, the positions whose target counts (the lm_head runs for these)
  // Conversations: how many the step's rows hold (all ranks), and of those the ones longer than
  // seq_len + 1 tokens, cut there, with the trained (answer) tokens the cuts left out.
  int64_t conversations = 0, cut_conversations = 0, cut_trained_tokens = 0;
  // FNV-1a of the token ids of the step's global micro-batches (every rank reads them whole): equal
  // for the same samples in the same order whatever the number of ranks, so a resumed or resharded
  // run shows that no sample was skipped or repeated.
  uint64_t batch_hash = 0;
  ExpertLoad expert_load;  // MoE models only
};

// The two halves of a training step, shared by TrainStep and the planner's meta-device step (so the
// planner measures exactly what training does).
//
// compute_gradients: zeroes the gradients, runs `accumulation` micro-batches (from `next`) forward
// and backward with the sharding's communication around each, and returns the step's loss (the
// cross-entropy's mean over every target of the step, on every rank, plus coef x the aux loss's mean
// over micro-batches and ranks when it trains), the aux loss and the global gradient norm.
// Afterwards every block's shard_grad holds the gradient of that loss.
struct StepGradients {
  double loss = 0, aux_loss = -1, grad_norm = 0;
  // Several data-parallel ranks only (< 0: one): the largest of the ranks' own losses (each rank's
  // mean over its own targets, plus coef x its own aux loss when that trains), torchtitan's
  // global_max_loss: a rank whose data is off (a corrupted shard, a document of noise) shows here
  // before it moves the mean.
  double global_max_loss = -1;
  // MoE models: each layer's routing counts, one row per micro-batch (i64 [accumulation, E] on the
  // model's device; undefined for dense layers), this rank's only.
  std::vector<Tensor> expert_counts;
};
// One micro-batch of this rank: token ids and targets (i64 [batch, seq], on the model's device), and
// what its cross-entropy (a mean over its own targets) weighs in the step: dp_size x its targets /
// the step's targets on all ranks (the ranks' gradients are averaged). Every micro-batch of a
// packed text step has as many targets, so the weight is 1 / accumulation there; conversations
// (whose prompts and padding are not targets) differ, and a mean of the micro-batches' means would
// weigh a target of a short answer more than one of a long answer.
struct MicroBatch {
  Tensor ids, targets;
  double ce_weight = 1;
  qwen3::RowContents rows;  // their documents (block_causal) and padding
};
// What rows [first, first + rows) of `batch` hold as the model reads them: their documents when
// attention is block-causal (else none: causal rows), and their padding.
qwen3::RowContents row_contents(const data::Batch& batch, int64_t first, int64_t rows, bool block_causal);
using MicroBatchSource = std::function<MicroBatch()>;
StepGradients compute_gradients(qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding,
                                const dist::ParallelPlan& plan, int64_t accumulation, const MicroBatchSource& next);
// apply_update: AdamW on this rank's slices with the gradients clipped to `max_norm` by the global
// norm (`grad_norm`), then the MoE expert-bias update from `step_expert_counts`: the routing counts
// of every micro-batch, summed over the ranks (ParallelPlan::sum_over_ranks of
// StepGradients::expert_counts). `adam_step` (1-based) is AdamW's own step count, for its bias
// corrections.
void apply_update(qwen3::Qwen3Model& model, AdamW& optimizer, double lr, int64_t adam_step, double max_norm,
                  double grad_norm, const std::vector<Tensor>& step_expert_counts, double expert_bias_coeff);

// A step every rank refuses at the same point, judged on figures every rank holds alike (the global
// loss and gradient norm, the global batch): a non-finite loss or gradient norm, data that ran out,
// a step with no token to train on. The run stops on every rank at once, so the trainer can still
// do collective work before it ends (commit a checkpoint saved in the background), and each rank
// ends on its own with the error said once (dist::RanksAgreedError).
class StepRefused : public dist::RanksAgreedError {
 public:
  using dist::RanksAgreedError::RanksAgreedError;
};

class TrainStep {
 public:
  TrainStep(const JobConfig& config, const ResolvedJob& job, const dist::ParallelPlan& plan);

  // Advances state.step by one. A non-finite loss or gradient norm, data that ran out, or a step
  // with nothing to train on is a StepRefused naming the step, raised before the optimizer touches
  // the weights.
  StepResult run(TrainState& state) const;

 private:
  Tensor my_rows(const std::vector<int64_t>& global_batch) const;  // this rank's [batch, seq] rows

  const dist::ParallelPlan& plan_;
  int64_t batch_, seq_len_, accumulation_;
  bool block_causal_;  // model.attn_mask_type: attention within each document of the batch
  double max_norm_, expert_bias_coeff_;
};

}  // namespace titan::train

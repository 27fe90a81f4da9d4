#pragma once
// The training loop behind `titan train`:
//   batch -> forward -> loss -> backward -> clip -> AdamW -> LR step
// with gradient accumulation, bf16 compute over f32 master weights, activation
// checkpointing, MoE load balancing, metrics, atomic checkpoints, resume, HF export,
// and a clean stop on SIGINT/SIGTERM.
#include <memory>

#include "titan/dist/communicator.h"
#include "titan/train/job_config.h"

namespace titan::train {

struct TrainSummary {
  int64_t steps_run = 0;       // steps taken by this invocation
  int64_t last_step = 0;       // the step counter at the end
  double final_loss = 0;
  double sustained_tps = 0;    // warm-up step excluded
  double sustained_mfu = 0;    // percent; < 0 when the device's peak is unknown (no metrics.peak_tflops)
  int64_t tokens = 0;          // tokens seen over the whole run (across resumes)
  int64_t padding = 0;         // conversations: padding positions in this invocation's steps
  int64_t step_tokens = 0;     // positions in this invocation's steps (padding included)
  // Conversations in this invocation's steps (every rank's rows), and of those the ones longer than
  // seq_len + 1 tokens, cut there, with the trained (answer) tokens the cuts left out.
  int64_t conversations = 0, cut_conversations = 0, cut_trained_tokens = 0;
  double seconds = 0;
  bool interrupted = false;    // stopped by a signal (a checkpoint was saved)
};

// Runs the job; returns its summary. Errors (bad config, missing data or checkpoint,
// non-finite loss) throw titan::Error before any compute where possible.
// Without a communicator the job is one process; with one, every rank of `world` calls it.
TrainSummary run_training(const JobConfig& config);
TrainSummary run_training(const JobConfig& config, dist::Communicator& world);

}  // namespace titan::train

#pragma once
// torchtitan's [validation]: at step 1 and every `validation.freq` steps, the mean cross-entropy of
// the model on held-out documents, computed without gradients. The trainer logs it with the step's
// metrics (train/metrics.h): `val_loss` and `val_perplexity` in metrics.jsonl and TensorBoard, and
//
//   validate step: 10  loss: 10.2483  perplexity: 28234.21
//
// The held-out stream is `validation.dataset_path`, else the built-in `validation.dataset`
// ("nlp-corpus-validation": documents scripts/fetch_assets.sh kept out of the training corpus); it
// may not share a file with the training data. Every evaluation reads the same batches (from the
// start of the stream, `steps` of them, or all with -1), so the figures of different steps compare.
// Documents are packed as for training (data/loader.h) with the validation batch size and length,
// and read as training reads them: every rank reads the global batches (validation.local_batch_size
// x data-parallel ranks rows) and evaluates its rows, so the held-out loss of a job depends on that
// global batch and `steps`, never on how many ranks share it.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/data/loader.h"
#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/data/tokenizer.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/job_config.h"

namespace titan::train {

// The held-out rows' length and each data-parallel rank's rows per batch: [validation]'s, where -1
// follows [training]'s.
int64_t validation_seq_len(const JobConfig& cfg);
int64_t validation_rank_rows(const JobConfig& cfg);

struct ValidationResult {
  double loss = 0;        // mean cross-entropy per target token (the MoE aux loss is not part of it)
  double perplexity = 0;  // exp(loss)
  int64_t batches = 0;
  int64_t tokens = 0;     // targets the mean is over
  // Conversations in the batches (every rank's rows), and of those the ones longer than seq_len + 1
  // tokens, cut there, with the trained (answer) tokens the cuts left out of the mean.
  int64_t conversations = 0, cut_conversations = 0, cut_trained_tokens = 0;
};

class Validator {
 public:
  // Resolves and checks the held-out data: it must exist and share no file with `training_files`
  // (the files the training loader reads). Each data-parallel rank of `plan` evaluates its rows of
  // every global batch. `tokenizer` and `plan` must outlive the validator.
  Validator(const JobConfig& config, const data::Tokenizer& tokenizer,
            const std::vector<std::filesystem::path>& training_files, const dist::ParallelPlan& plan);

  bool due(int64_t step) const { return step == 1 || step % freq_ == 0; }
  // Evaluates `model` on the held-out batches (no gradients, no change to the model).
  // Under FSDP `sharding`'s hooks gather each block as a training forward does, and what the forward
  // leaves gathered is released after (ShardedBlocks::end_forward_only).
  ValidationResult run(qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding) const;
  // "validation: at step 1 and every 10 steps, 2 batches of 2 x 512 tokens per rank (global 4 x 512)
  // from <path>" (start-up log).
  std::string describe() const;
  // What it evaluates: "all batches of 2 x 64 tokens per rank (global 4 x 64) from PATH".
  std::string describe_data() const;
  int64_t seq_len() const { return loader_config_.seq_len; }
  int64_t rank_rows() const { return rank_rows_; }  // of each global batch, on each data-parallel rank
  int64_t steps() const { return steps_; }          // batches per evaluation; -1: the whole held-out set

 private:
  std::string too_little() const;  // what a held-out set too small for one row lacks

  data::LoaderConfig loader_config_;  // the global batches
  int64_t rank_rows_;                 // this rank's rows of each: validation.local_batch_size
  size_t files_ = 0;                  // the held-out files the path names (a folder's, a glob's)
  const data::Tokenizer& tokenizer_;
  const dist::ParallelPlan& plan_;
  int64_t freq_, steps_;
  bool block_causal_;                // model.attn_mask_type: attention within each document of a batch
  mutable bool said_short_ = false;  // the note that the held-out set is shorter than steps_, once
};

}  // namespace titan::train

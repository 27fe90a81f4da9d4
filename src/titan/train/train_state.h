#pragma once
// Everything a training run carries from one step to the next, and that a checkpoint saves: the
// model (f32 master weights in flat blocks, MoE expert biases), the optimizer's moments, the LR
// schedule, the data loader's position, the step counter and the tokens seen.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>

#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/job_config.h"
#include "titan/train/lr_schedule.h"
#include "titan/train/optimizer.h"
#include "titan/train/startup.h"

namespace titan::train {

struct TrainState {
  // A fresh state: zero moments, step 0, the loader at the start of the data; the weights are
  // not initialised yet (start_weights or a checkpoint restore does that). `tokenizer` must
  // outlive the state. Purpose::Inference (titan eval): a model without gradients and an optimizer
  // without moments, the weights' memory alone; such a state is evaluated, never stepped or saved.
  TrainState(const JobConfig& config, const ResolvedJob& job, const data::Tokenizer& tokenizer,
             const dist::ParallelPlan& plan, qwen3::Purpose purpose = qwen3::Purpose::Training);
  TrainState(const TrainState&) = delete;
  // Once the weights are in place (start_weights or a restore, into the slices the blocks were born
  // as): the blocks get their compute copies, and the model reports its block uses to `sharding`.
  void distribute();
  TrainState& operator=(const TrainState&) = delete;

  const qwen3::Purpose purpose;
  qwen3::Qwen3Model model;
  // The blocks as this rank holds them (whole until sharding.shard(), called once the weights are
  // in place), and the data-parallel communication of their parameters and gradients.
  dist::ShardedBlocks sharding;
  // Expert parallelism: the tokens' way to the ranks holding their experts (null without it); its
  // bytes count in the sharding's communication.
  std::unique_ptr<nn::ExpertExchange> expert_exchange;
  AdamW optimizer;
  LrSchedule schedule;
  data::TokenLoader loader;
  // The loader's files, fingerprinted once at start-up (data::dataset_identity): every checkpoint
  // records it without reading the data again, so a file moved or locked mid-run cannot stop a save.
  const nlohmann::json dataset_identity;
  int64_t step = 0;         // optimizer steps taken
  int64_t tokens_seen = 0;  // input tokens trained on, over all ranks
  // The step after which AdamW's state and the LR schedule started: 0, or the step of a resume that
  // left them fresh (checkpoint.exclude_from_loading). Step s runs AdamW's step s - optimizer_start
  // and the schedule's index s - 1 - schedule_start.
  int64_t optimizer_start = 0;
  int64_t schedule_start = 0;
  // The generation_config.json of the Hugging Face model the run started from (null: it had none,
  // or the run started from random weights): every checkpoint records it and every export writes it.
  nlohmann::json generation_config;
};

// The model as a rank of `plan` builds it: its blocks born as its slices (the whole model never
// exists on one rank, not even at start-up), with expert parallelism its slice of its run of
// experts, and padded for the plan. The trainer and the planner's meta step (step_profile.h) both
// build it here, so what the plan replays is what the rank allocates.
qwen3::Qwen3Model rank_model(const qwen3::ModelArgs& args, DType compute_dtype, Device device,
                             const dist::ParallelPlan& plan, qwen3::Purpose purpose);

// What each of the model's blocks is to dist::ShardedBlocks: the embedding and head, a layer
// (gathered and reduced per use), or a run of split experts (with its layer), and whether a bf16
// copy of it is free (Qwen3Model::holds_whole_weights_through_step: call after set_checkpointing).
std::vector<dist::BlockRole> block_roles(const qwen3::Qwen3Model& model);

// "parameters 37.2 MiB, gradients 37.2 MiB, AdamW state 74.4 MiB, bf16 copy of the parameters 18.6
// MiB (start-up peak 120.0 MiB)": what this rank holds of each (its slice of the f32 master weights,
// gradients and moments, and of the bf16 copy AdamW writes where the blocks keep one; all of them
// on one process), and the most its device allocator has held so far.
std::string memory_per_rank(const TrainState& state);

// The weights of a run that does not resume: from job.initial_hf, job.initial_native (model only;
// optimizer and step start fresh) or the seeded initialisation. Logs which. Every rank of `plan` reads
// its own files; an error on any rank stops them all, said once (ParallelPlan::agree_on_success).
void start_weights(TrainState& state, const JobConfig& config, const ResolvedJob& job,
                   const dist::ParallelPlan& plan);

// The generation_config.json of a Hugging Face model folder, null when it has none; a file that is
// not a JSON object is an error naming it.
nlohmann::json read_generation_config(const std::filesystem::path& hf_dir);
// Whether a Hugging Face model folder names a stop token: its generation_config.json, or an
// eos_token_id (not null) in its config.json.
bool names_stop_tokens(const std::filesystem::path& hf_dir);

// The generation config of a model trained from random weights: its bos_token_id and, as
// eos_token_id, config.json's eos_token_id, the tokenizer's eos_token and the run's document
// separator (the token its documents end with), so that transformers' generate on an export stops
// where titan's does (config.json alone names <|im_end|>, and a model pretrained on text ends its
// documents with <|endoftext|>). Null when none of them is in the vocabulary.
nlohmann::json stop_tokens_generation_config(const qwen3::ModelArgs& args, const data::Tokenizer& tokenizer,
                                             int32_t document_separator);

}  // namespace titan::train

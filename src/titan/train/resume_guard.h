#pragma once
// What a resume must agree with before it loads anything: the model the checkpoint was trained as
// and the data its loader position points into. A run that continued on a different model or
// dataset would silently train garbage and then prune the good checkpoints.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/data/data_identity.h"
#include "titan/data/loader.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config.h"

namespace titan::train {

// Every ModelArgs field of the checkpoint's model config (train_state.json "model_config", the HF
// config.json spelling) must equal this run's; the error names the field and both values.
void check_same_model_config(const nlohmann::json& saved, const qwen3::ModelArgs& now,
                             const std::string& checkpoint);

// The window length the checkpoint's data position counts (train_state.json "dataloader".seq_len,
// when recorded) must be this run's training.seq_len; the error names both and the way out.
void check_same_seq_len(const nlohmann::json& dataloader_state, int64_t seq_len,
                        const std::string& checkpoint);

// What a resume checks of the data before it reads the position (checkpoint.restart_data_stream
// aside): the checkpoint's dataset identity against `identity` (data::dataset_identity of this run's
// files; data::compare_dataset_identity), and, where the data grew, that nothing the checkpoint read
// lies past a grown file's recorded size and that a best-fit window it stopped in records where it
// ended. An error names the file and the way on; returns the comparison (what grew). `titan check`
// runs it too.
data::DatasetComparison check_resumable_dataset(const nlohmann::json& train_state,
                                                const nlohmann::json& identity,
                                                const std::string& checkpoint);

// The checkpoint's tokenizer (its tokenizer.json's checksum, where recorded) against the run's: ""
// when the same; another is an error naming both, unless `restart_data_stream`, when it is a note
// (the data starts over, tokenized with the new one), returned.
std::string check_same_tokenizer(const nlohmann::json& train_state,
                                 const std::filesystem::path& tokenizer_path, bool restart_data_stream,
                                 const std::string& checkpoint);

// Restores the loader position of `train_state` when the checkpoint's dataset identity matches
// `identity` (data::dataset_identity of this run's files), or `identity` only grew from it
// (data::compare_dataset_identity). A mismatch is an error naming the file and what differs, unless
// `restart_data_stream` (checkpoint.restart_data_stream), which also starts the data from its
// beginning when the dataset is unchanged. Returns the lines for the log (what grew, a packing
// changed, a restart).
std::vector<std::string> restore_data_position(data::TokenLoader& loader, const nlohmann::json& train_state,
                                               const nlohmann::json& identity, bool restart_data_stream,
                                               const std::string& checkpoint);

// The settings a resume may change on purpose, recorded in train_state.json ("settings") so that
// the resume can say which ones it changed: optimizer betas, eps and weight decay, max_norm, the
// compute dtype, the MoE balancing and the aux loss's weight (model.router_aux_loss_coef, of the
// run's model `args`), and the seed and init scheme (which a resume leaves without effect). The LR
// schedule and the global batch have checks of their own.
nlohmann::json resumable_settings(const JobConfig& config, const qwen3::ModelArgs& args);
// The settings a checkpoint's train_state.json records, with the aux loss's weight of its
// model_config where they lack it (checkpoints written before it joined them).
nlohmann::json recorded_settings(const nlohmann::json& train_state);
// "optimizer.weight_decay 0.1 -> 0.05, ..." for every setting of `now` that differs from `saved`
// (one recorded by an older titan lacks some: those are not compared); "" when none differs.
std::string changed_settings(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace titan::train

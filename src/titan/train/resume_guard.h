#pragma once
// What a resume must agree with before it loads anything: the model the checkpoint was trained as
// and the data its loader position points into. A run that continued on a different model or
// dataset would silently train garbage and then prune the good checkpoints.
#include <nlohmann/json.hpp>
#include <string>

#include "titan/data/loader.h"
#include "titan/models/qwen3/args.h"

namespace titan::train {

// Every ModelArgs field of the checkpoint's model config (train_state.json "model_config", the HF
// config.json spelling) must equal this run's; the error names the field and both values.
void check_same_model_config(const nlohmann::json& saved, const qwen3::ModelArgs& now,
                             const std::string& checkpoint);

// Restores the loader position of `train_state` when the checkpoint's dataset identity matches
// `identity` (data::dataset_identity of this run's files). A mismatch is an error naming the file
// and what differs, unless `restart_data_stream` (checkpoint.restart_data_stream), which also
// starts the data from its beginning when the dataset is unchanged. Returns a line for the log.
std::string restore_data_position(data::TokenLoader& loader, const nlohmann::json& train_state,
                                  const nlohmann::json& identity, bool restart_data_stream,
                                  const std::string& checkpoint);

}  // namespace titan::train

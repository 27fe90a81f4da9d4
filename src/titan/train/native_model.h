#pragma once
// A model rebuilt from a native checkpoint (titan export, titan verify-export, tests):
// the architecture comes from train_state.json's model_config, the weights from its model files
// (one of named parameters, or the slices of every shard: checkpoint_blocks.h).
#include <filesystem>
#include <memory>

#include "titan/models/qwen3/model.h"

namespace titan::train {

struct NativeModel {
  std::unique_ptr<qwen3::Qwen3Model> model;
  int64_t step = 0;
  std::filesystem::path tokenizer_path;  // as recorded by the trainer (may no longer exist)
};

NativeModel load_native_model(const std::filesystem::path& step_dir, DType compute_dtype);

}  // namespace titan::train

#pragma once
// A model rebuilt from a native checkpoint for inference (titan export, generate, tests; no
// gradients, qwen3::Purpose::Inference):
// the architecture comes from train_state.json's model_config, the weights from its model files
// (one of named parameters, or the slices of every shard: checkpoint_blocks.h).
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::train {

struct NativeModel {
  std::unique_ptr<qwen3::Qwen3Model> model;
  int64_t step = 0;
  std::filesystem::path tokenizer_path;  // as recorded by the trainer (may no longer exist)
  std::string tokenizer_checksum;  // of its tokenizer.json as trained ("": a checkpoint before the record)
  nlohmann::json generation_config;      // of the model the run started from (null: none)
  // The MoE expert biases of a run trained with training.load_balance = "expert_bias" (per MoE layer;
  // empty without): they steer routing, and a Hugging Face export has no place for them.
  std::vector<std::vector<double>> expert_bias;
  // Why titan train could not resume the checkpoint (LoadedCheckpoint::unresumable), or "".
  std::string unresumable;
};

// The largest |bias| of `expert_bias` (0 when there is none): what a Hugging Face export, which
// routes without biases, leaves out.
double largest_expert_bias(const std::vector<std::vector<double>>& expert_bias);

NativeModel load_native_model(const std::filesystem::path& step_dir, DType compute_dtype,
                              Device device = Device::CPU);

}  // namespace titan::train

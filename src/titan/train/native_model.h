#pragma once
// A model rebuilt from a native checkpoint (titan export, titan verify-export, tests):
// the architecture comes from train_state.json's model_config, the weights from
// model-rank0.safetensors (native names).
#include <filesystem>
#include <memory>

#include "titan/io/safetensors.h"
#include "titan/models/qwen3/model.h"

namespace titan::train {

// Copies one f32 tensor of exactly `shape` from `file`; errors name the file, the tensor and the rule.
void restore_tensor(const io::SafetensorsFile& file, const std::string& name, const Shape& shape, float* dst);

// Copies every parameter of `model` from `file` (f32, native names, exact shapes).
void restore_model_tensors(const io::SafetensorsFile& file, qwen3::Qwen3Model& model);

struct NativeModel {
  std::unique_ptr<qwen3::Qwen3Model> model;
  int64_t step = 0;
  std::filesystem::path tokenizer_path;  // as recorded by the trainer (may no longer exist)
};

NativeModel load_native_model(const std::filesystem::path& step_dir, DType compute_dtype);

}  // namespace titan::train

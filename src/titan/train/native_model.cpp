#include "titan/train/native_model.h"

#include <algorithm>
#include <cmath>

#include "titan/core/check.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpoint_blocks.h"

namespace titan::train {

NativeModel load_native_model(const std::filesystem::path& step_dir, DType compute_dtype, Device device) {
  LoadedCheckpoint c = load_checkpoint_dir(step_dir, CheckpointParts::Weights);
  TITAN_CHECK(c.train_state.contains("model_config"), "checkpoint '", step_dir.string(),
              "': train_state.json has no model_config");
  qwen3::ModelArgs args =
      qwen3::args_from_hf_config(c.train_state["model_config"], (step_dir / "train_state.json").string());
  NativeModel out;
  out.model = std::make_unique<qwen3::Qwen3Model>(args, compute_dtype, device, nn::BlockShard{},
                                                  qwen3::Purpose::Inference);
  restore_whole_parameters(c, *out.model);
  out.step = c.step;
  out.unresumable = c.unresumable;
  out.tokenizer_path = c.train_state.value("tokenizer_path", std::string());
  out.tokenizer_checksum = c.train_state.value("tokenizer_checksum", std::string());
  out.generation_config = c.train_state.value("generation_config", nlohmann::json());
  if (c.train_state.contains("expert_bias"))
    out.expert_bias = c.train_state["expert_bias"].get<std::vector<std::vector<double>>>();
  return out;
}

double largest_expert_bias(const std::vector<std::vector<double>>& expert_bias) {
  double largest = 0;
  for (const auto& layer : expert_bias)
    for (double b : layer) largest = std::max(largest, std::fabs(b));
  return largest;
}

}  // namespace titan::train

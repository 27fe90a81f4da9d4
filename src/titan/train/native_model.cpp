#include "titan/train/native_model.h"

#include <cstring>

#include "titan/core/check.h"
#include "titan/train/checkpoint.h"

namespace titan::train {

void restore_tensor(const io::SafetensorsFile& f, const std::string& name, const Shape& shape, float* dst) {
  const io::TensorInfo* t = f.find(name);
  TITAN_CHECK(t, "checkpoint '", f.path().string(), "' lacks tensor '", name, "'");
  TITAN_CHECK(t->dtype == DType::F32 && t->shape == shape, "checkpoint '", f.path().string(), "': tensor '", name,
              "' is ", dtype_name(t->dtype), shape_str(t->shape), ", expected f32", shape_str(shape));
  std::memcpy(dst, t->data, t->nbytes());
}

void restore_model_tensors(const io::SafetensorsFile& f, qwen3::Qwen3Model& model) {
  for (auto& b : model.blocks())
    for (auto& p : b.params()) restore_tensor(f, p.name, p.shape, p.value.data<float>());
}

NativeModel load_native_model(const std::filesystem::path& step_dir, DType compute_dtype) {
  LoadedCheckpoint c = load_checkpoint_dir(step_dir);
  TITAN_CHECK(c.train_state.contains("model_config"), "checkpoint '", step_dir.string(),
              "': train_state.json has no model_config");
  qwen3::ModelArgs args =
      qwen3::args_from_hf_config(c.train_state["model_config"], (step_dir / "train_state.json").string());
  NativeModel out;
  out.model = std::make_unique<qwen3::Qwen3Model>(args, compute_dtype);
  restore_model_tensors(c.model, *out.model);
  out.step = c.step;
  out.tokenizer_path = c.train_state.value("tokenizer_path", std::string());
  return out;
}

}  // namespace titan::train

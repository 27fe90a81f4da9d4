#include "titan/models/qwen3/checkpoint_layout.h"

#include <cstring>

#include "titan/core/check.h"

namespace titan::qwen3 {

namespace {

void check_buffers(const Qwen3Model& model, const std::vector<Tensor>& buffers) {
  TITAN_CHECK(buffers.size() == model.blocks().size(), "checkpoint layout: ", buffers.size(),
              " buffers for a model of ", model.blocks().size(), " blocks");
  for (size_t b = 0; b < buffers.size(); ++b)
    TITAN_CHECK(buffers[b].device() == Device::CPU, "checkpoint layout: block '", model.blocks()[b].name(),
                "' is on ", device_name(buffers[b].device()), "; checkpoints are written from host memory");
  for (size_t b = 0; b < buffers.size(); ++b)
    TITAN_CHECK(buffers[b].dtype() == DType::F32 && buffers[b].is_contiguous() &&
                    buffers[b].numel() == model.blocks()[b].numel(),
                "checkpoint layout: buffer ", buffers[b].str(), " does not match block '",
                model.blocks()[b].name(), "' (contiguous f32 of ", model.blocks()[b].numel(), " elements)");
}

}  // namespace

std::vector<io::TensorWrite> layout_tensors(const Qwen3Model& model, const std::vector<Tensor>& buffers,
                                            const std::string& prefix) {
  check_buffers(model, buffers);
  std::vector<io::TensorWrite> out;
  for (size_t b = 0; b < buffers.size(); ++b)
    for (auto& p : model.blocks()[b].params())
      out.push_back({prefix + p.name, DType::F32, p.shape, buffers[b].data<float>() + p.offset});
  return out;
}

void restore_layout_tensors(const io::SafetensorsFile& f, const Qwen3Model& model,
                            std::vector<Tensor>& buffers, const std::string& prefix) {
  check_buffers(model, buffers);
  for (size_t b = 0; b < buffers.size(); ++b)
    for (auto& p : model.blocks()[b].params()) {
      const std::string name = prefix + p.name;
      const io::TensorInfo* t = f.find(name);
      TITAN_CHECK(t, "checkpoint '", f.path().string(), "' lacks tensor '", name, "'");
      TITAN_CHECK(t->dtype == DType::F32 && t->shape == p.shape, "checkpoint '", f.path().string(),
                  "': tensor '", name, "' is ", dtype_name(t->dtype), shape_str(t->shape), ", expected f32",
                  shape_str(p.shape));
      std::memcpy(buffers[b].data<float>() + p.offset, t->data, t->nbytes());
    }
}

}  // namespace titan::qwen3

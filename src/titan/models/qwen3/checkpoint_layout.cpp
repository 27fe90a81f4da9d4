#include "titan/models/qwen3/checkpoint_layout.h"

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
  // A name stands for the whole parameter, and a run holds part of every expert's.
  TITAN_CHECK(model.expert_split().count == 1, "checkpoint layout: a model holding run ",
              model.expert_split().index, " of its experts split over ", model.expert_split().count,
              " ranks has no whole expert parameters to write under their names (its checkpoints are "
              "block slices)");
  std::vector<io::TensorWrite> out;
  for (size_t b = 0; b < buffers.size(); ++b)
    for (auto& p : model.blocks()[b].params())
      out.push_back({prefix + p.name, DType::F32, p.shape, buffers[b].data<float>() + p.offset});
  return out;
}

}  // namespace titan::qwen3

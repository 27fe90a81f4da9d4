#include "titan/train/checkpoint_blocks.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "titan/core/check.h"
#include "titan/models/qwen3/checkpoint_layout.h"

namespace titan::train {

namespace {

// Elements up to the end of the block's last parameter: what its padding to any multiple keeps.
int64_t parameter_extent(const nn::ParamBlock& block) {
  int64_t end = 0;
  for (auto& p : block.params()) end = std::max(end, p.offset + shape_numel(p.shape));
  return end;
}

nlohmann::json params_json(const nn::ParamBlock& block) {
  nlohmann::json params = nlohmann::json::array();
  for (auto& p : block.params()) params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
  return params;
}

// Every tensor of `files` is one `expected` names: another one means the files hold something
// other than this model's state (edited, or from another program), so none of it is trusted.
void check_no_unexpected_tensors(const std::vector<io::SafetensorsFile>& files,
                                 const std::set<std::string>& expected) {
  for (const io::SafetensorsFile& f : files) {
    std::vector<std::string> unexpected;
    for (const io::TensorInfo& t : f.tensors())
      if (!expected.count(t.name)) unexpected.push_back(t.name);
    if (unexpected.empty()) continue;
    std::string names;
    for (size_t i = 0; i < unexpected.size() && i < 10; ++i) names += (i ? ", '" : "'") + unexpected[i] + "'";
    if (unexpected.size() > 10) names += " and " + std::to_string(unexpected.size() - 10) + " more";
    TITAN_FAIL("checkpoint '", f.path().string(), "' holds ", unexpected.size(),
               " tensor(s) this model's checkpoint does not have: ", names);
  }
}

}  // namespace

nlohmann::json checkpoint_layout(const qwen3::Qwen3Model& model, int64_t shards) {
  nlohmann::json blocks = nlohmann::json::array();
  for (auto& b : model.blocks()) {
    TITAN_CHECK(b.numel() % shards == 0, "checkpoint layout: block '", b.name(), "' of ", b.numel(),
                " elements is not padded to a multiple of ", shards, " shards");
    const int64_t slice = b.numel() / shards;
    nlohmann::json ranges = nlohmann::json::array();
    for (int64_t k = 0; k < shards; ++k) ranges.push_back({k * slice, (k + 1) * slice});
    blocks.push_back({{"name", b.name()},
                      {"numel", parameter_extent(b)},
                      {"padded", b.numel()},
                      {"ranges", ranges},
                      {"params", params_json(b)}});
  }
  return {{"format", shards > 1 ? "block-slices" : "named-parameters"}, {"shards", shards}, {"blocks", blocks}};
}

std::vector<io::TensorWrite> block_slice_tensors(const qwen3::Qwen3Model& model, const std::vector<Tensor>& slices,
                                                 const std::string& prefix) {
  TITAN_CHECK(slices.size() == model.blocks().size(), "checkpoint layout: ", slices.size(),
              " slices for a model of ", model.blocks().size(), " blocks");
  std::vector<io::TensorWrite> out;
  for (size_t b = 0; b < slices.size(); ++b) {
    TITAN_CHECK(slices[b].dtype() == DType::F32 && slices[b].is_contiguous() && slices[b].device() == Device::CPU,
                "checkpoint layout: the slice of block '", model.blocks()[b].name(), "' is ", slices[b].str(),
                "; shard files are written from contiguous f32 host memory");
    out.push_back({prefix + model.blocks()[b].name(), DType::F32, {slices[b].numel()}, slices[b].data<float>()});
  }
  return out;
}

CheckpointBlocks::CheckpointBlocks(const LoadedCheckpoint& c, const qwen3::Qwen3Model& model)
    : checkpoint_(c), model_(model) {
  const std::string where = "checkpoint '" + c.dir.string() + "'";
  const nlohmann::json* layout = c.train_state.contains("layout") ? &c.train_state["layout"] : nullptr;
  named_ = !layout || layout->value("format", "") == "named-parameters";
  // The names the files must hold: each parameter (named layout) or each block's slice, and the
  // AdamW moments of each under their prefixes. Missing ones are named as they are read.
  std::set<std::string> model_names, optimizer_names;
  for (const nn::ParamBlock& block : model.blocks()) {
    std::vector<std::string> names;
    if (named_)
      for (auto& p : block.params()) names.push_back(p.name);
    else
      names.push_back(block.name());
    for (const std::string& n : names) {
      model_names.insert(n);
      optimizer_names.insert("exp_avg." + n);
      optimizer_names.insert("exp_avg_sq." + n);
    }
  }
  check_no_unexpected_tensors(c.model_files, model_names);
  check_no_unexpected_tensors(c.optimizer_files, optimizer_names);
  if (named_) {
    // (No optimizer file when only the weights were loaded: CheckpointParts::Weights.)
    TITAN_CHECK(c.model_files.size() == 1 && c.optimizer_files.size() <= 1, where,
                ": named parameters come in one model and one optimizer file, found ", c.model_files.size());
    return;
  }
  TITAN_CHECK(layout->value("format", "") == "block-slices", where, ": train_state.json's layout.format '",
              layout->value("format", ""), "' is neither 'block-slices' nor 'named-parameters'");
  const nlohmann::json& blocks = layout->at("blocks");
  TITAN_CHECK(blocks.is_array() && blocks.size() == model.blocks().size(), where, " has ", blocks.size(),
              " parameter blocks, this model ", model.blocks().size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    const nn::ParamBlock& mine = model.blocks()[b];
    const nlohmann::json& saved = blocks[b];
    TITAN_CHECK(saved.at("name").get<std::string>() == mine.name() && saved.at("params") == params_json(mine) &&
                    saved.at("numel").get<int64_t>() == parameter_extent(mine),
                where, ": block ", b, " ('", saved.at("name").get<std::string>(),
                "') lays out its parameters unlike this model's block '", mine.name(), "'");
    TITAN_CHECK(saved.at("ranges").size() == c.model_files.size(), where, ": block '", mine.name(), "' has ",
                saved.at("ranges").size(), " shard ranges for ", c.model_files.size(), " shard files");
  }
}

void CheckpointBlocks::read(size_t b, const std::string& prefix, int64_t begin, Tensor& out) const {
  if (out.device() != Device::CPU) {  // a device run: read on the host, then one copy across
    Tensor host = Tensor::empty(out.shape(), out.dtype());
    read(b, prefix, begin, host);
    out.copy_from(host);
    return;
  }
  TITAN_CHECK(out.dtype() == DType::F32 && out.is_contiguous(), "checkpoint: reading into ", out.str(),
              ": contiguous f32 memory expected");
  TITAN_CHECK(prefix.empty() || !checkpoint_.optimizer_files.empty(), "checkpoint: '",
              checkpoint_.dir.string(), "': the optimizer state was not loaded (CheckpointParts::Weights)");
  float* dst = out.data<float>();
  fill_from_files(b, prefix, begin, out.numel(), dst);
  // A NaN or infinity restored would surface as a non-finite loss, blamed on training.
  if (const int64_t i = first_non_finite(dst, out.numel(), DType::F32); i >= 0) {
    const int64_t at = begin + i;  // the element of the block
    std::string name = model_.blocks()[b].name();
    for (auto& p : model_.blocks()[b].params())
      if (at >= p.offset && at < p.offset + shape_numel(p.shape)) name = p.name;
    TITAN_FAIL("checkpoint '", checkpoint_.dir.string(), "': '", prefix, name, "' holds a non-finite value (",
               dst[i], "); a checkpoint must hold finite weights and moments");
  }
}

void CheckpointBlocks::fill_from_files(size_t b, const std::string& prefix, int64_t begin, int64_t n,
                                       float* dst) const {
  const int64_t end = begin + n;
  std::fill(dst, dst + n, 0.0f);
  if (named_) {
    std::vector<Tensor>& whole = whole_[prefix];
    if (whole.empty()) {
      for (auto& block : model_.blocks()) whole.push_back(Tensor::zeros({block.numel()}, DType::F32));
      qwen3::restore_layout_tensors(prefix.empty() ? checkpoint_.model_files[0] : checkpoint_.optimizer_files[0],
                                    model_, whole, prefix);
    }
    const int64_t stop = std::min(end, whole[b].numel());
    if (stop > begin) std::memcpy(dst, whole[b].data<float>() + begin, size_t(stop - begin) * sizeof(float));
    return;
  }
  const nlohmann::json& saved = checkpoint_.train_state["layout"]["blocks"][b];
  const int64_t extent = saved.at("numel").get<int64_t>();
  const auto& files = prefix.empty() ? checkpoint_.model_files : checkpoint_.optimizer_files;
  const std::string name = prefix + saved.at("name").get<std::string>();
  for (size_t k = 0; k < files.size(); ++k) {
    const int64_t lo = saved["ranges"][k][0].get<int64_t>(), hi = saved["ranges"][k][1].get<int64_t>();
    const io::TensorInfo* t = files[k].find(name);
    TITAN_CHECK(t, "checkpoint '", files[k].path().string(), "' lacks tensor '", name, "'");
    TITAN_CHECK(t->dtype == DType::F32 && t->shape == Shape{hi - lo}, "checkpoint '", files[k].path().string(),
                "': tensor '", name, "' is ", dtype_name(t->dtype), shape_str(t->shape), ", the layout says f32[",
                hi - lo, "]");
    // The overlap of this file's range with the one asked for, within the parameters.
    const int64_t from = std::max(begin, lo), to = std::min({end, hi, extent});
    if (to > from)
      std::memcpy(dst + (from - begin), reinterpret_cast<const float*>(t->data) + (from - lo),
                  size_t(to - from) * sizeof(float));
  }
}

void restore_whole_parameters(const LoadedCheckpoint& c, qwen3::Qwen3Model& model) {
  const CheckpointBlocks saved(c, model);
  // Into what this rank keeps of each block: the whole block, or its slice of a sharded one.
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    nn::ParamBlock& block = model.blocks()[b];
    saved.read(b, "", block.shard_begin(), block.shard());
  }
}

}  // namespace titan::train

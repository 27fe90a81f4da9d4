#include "titan/train/checkpoint_blocks.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "titan/core/check.h"

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

// The shape of the whole parameter `p` of block `b` is a part of: a run of experts holds E/P of
// them, the others hold it whole.
Shape whole_shape(const qwen3::Qwen3Model& model, size_t b, const nn::Param& p) {
  Shape shape = p.shape;
  if (model.is_expert_block(b)) shape[0] *= model.expert_split().count;
  return shape;
}

// A block of split experts as the layout records it: run j (elements [j n, (j + 1) n) of each
// whole parameter of n elements a run) is cut into shards / runs equal slices of its padded buffer,
// slice t written by shard file j + t x runs (the rank of that shard index holds it).
nlohmann::json expert_block_json(const qwen3::Qwen3Model& model, size_t b, int64_t shards) {
  const nn::ParamBlock& block = model.blocks()[b];
  const qwen3::ExpertSplit& split = model.expert_split();
  const int64_t slices = shards / split.count, padded = block.numel(), slice = block.shard().numel();
  TITAN_CHECK(slice * slices == padded, "checkpoint layout: block '", block.name(), "' of ", padded,
              " elements is kept in slices of ", slice, ", not in the ", slices,
              " slices of the ranks holding its run");
  nlohmann::json params = nlohmann::json::array(), runs = nlohmann::json::array();
  for (int64_t j = 0; j < split.count; ++j) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int64_t t = 0; t < slices; ++t)
      pieces.push_back({{"file", j + t * split.count}, {"range", {t * slice, (t + 1) * slice}}});
    runs.push_back(pieces);
  }
  for (auto& p : block.params()) {
    const int64_t n = shape_numel(p.shape);
    TITAN_CHECK(p.first_element == split.index * n, "checkpoint layout: '", p.name, "' of run ", split.index,
                " starts at element ", p.first_element, " of the whole parameter, not at run x ", n,
                " (its runs must be equal and in order)");
    nlohmann::json elements = nlohmann::json::array();
    for (int64_t j = 0; j < split.count; ++j) elements.push_back({j * n, (j + 1) * n});
    params.push_back({{"name", p.name},
                      {"shape", whole_shape(model, b, p)},
                      {"offset", p.offset},
                      {"elements", elements}});
  }
  return {{"name", block.name()}, {"padded", padded}, {"runs", runs}, {"params", params}};
}

std::set<std::string> with_moment_prefixes(const std::set<std::string>& names) {
  std::set<std::string> out;
  for (const std::string& n : names) {
    out.insert("exp_avg." + n);
    out.insert("exp_avg_sq." + n);
  }
  return out;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size() && i < 10; ++i) list += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 10) list += " and " + std::to_string(names.size() - 10) + " more";
  return list;
}

// Every tensor of `f` is one `expected` names: another one means the file holds something other
// than this model's state (edited, or from another program), so none of it is trusted.
void check_no_unexpected_tensors(const io::SafetensorsFile& f, const std::set<std::string>& expected) {
  std::vector<std::string> unexpected;
  for (const io::TensorInfo& t : f.tensors())
    if (!expected.count(t.name)) unexpected.push_back(t.name);
  TITAN_CHECK(unexpected.empty(), "checkpoint '", f.path().string(), "' holds ", unexpected.size(),
              " tensor(s) this model's checkpoint does not have: ", quoted_list(unexpected));
}

}  // namespace

nlohmann::json checkpoint_layout(const qwen3::Qwen3Model& model, int64_t shards) {
  const int64_t runs = model.expert_split().count;
  TITAN_CHECK(runs == 1 || (shards > 1 && shards % runs == 0), "checkpoint layout: experts split in ", runs,
              " runs are written in slices by the shard files (block slices of a multiple of ", runs,
              " shards), not ", shards, " shard(s)");
  nlohmann::json blocks = nlohmann::json::array(), expert_blocks = nlohmann::json::array();
  for (size_t i = 0; i < model.blocks().size(); ++i) {
    const nn::ParamBlock& b = model.blocks()[i];
    if (model.is_expert_block(i)) {
      expert_blocks.push_back(expert_block_json(model, i, shards));
      continue;
    }
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
  nlohmann::json layout = {
      {"format", shards > 1 ? "block-slices" : "named-parameters"}, {"shards", shards}, {"blocks", blocks}};
  if (!expert_blocks.empty()) layout["expert_blocks"] = expert_blocks;
  return layout;
}

std::vector<io::TensorWrite> block_slice_tensors(const qwen3::Qwen3Model& model, int64_t shard,
                                                 const std::vector<Tensor>& slices,
                                                 const std::string& prefix) {
  TITAN_CHECK(slices.size() == model.blocks().size(), "checkpoint layout: ", slices.size(),
              " slices for a model of ", model.blocks().size(), " blocks");
  std::vector<io::TensorWrite> out;
  const int64_t runs = model.expert_split().count;
  for (size_t b = 0; b < slices.size(); ++b) {
    const nn::ParamBlock& block = model.blocks()[b];
    const std::string& name = block.name();
    TITAN_CHECK(slices[b].defined(), "checkpoint layout: shard file ", shard, " lacks its slice of block '",
                name, "'");
    // Shard file k holds slice k / runs of run k % runs (checkpoint_layout).
    TITAN_CHECK(!model.is_expert_block(b) || (model.expert_split().index == shard % runs &&
                                              block.shard_begin() == shard / runs * block.shard().numel()),
                "checkpoint layout: shard file ", shard, " holds slice ", shard / runs, " of run ",
                shard % runs, " of '", name, "', but this model holds run ", model.expert_split().index,
                " from element ", block.shard_begin());
    TITAN_CHECK(
        slices[b].dtype() == DType::F32 && slices[b].is_contiguous() && slices[b].device() == Device::CPU,
        "checkpoint layout: the slice of block '", name, "' is ", slices[b].str(),
        "; shard files are written from contiguous f32 host memory");
    out.push_back({prefix + name, DType::F32, {slices[b].numel()}, slices[b].data<float>()});
  }
  return out;
}

CheckpointBlocks::CheckpointBlocks(const LoadedCheckpoint& c, const qwen3::Qwen3Model& model)
    : checkpoint_(c), model_(model) {
  const std::string where = "checkpoint '" + c.dir.string() + "'";
  const nlohmann::json* layout = c.train_state.contains("layout") ? &c.train_state["layout"] : nullptr;
  const bool named = !layout || layout->value("format", "") == "named-parameters";
  if (named) {
    // (No optimizer file when only the weights were loaded: CheckpointParts::Weights.)
    TITAN_CHECK(c.model_files.size() == 1 && c.optimizer_files.size() <= 1, where,
                ": named parameters come in one model and one optimizer file, found ", c.model_files.size());
    std::set<std::string> names;
    for (const nn::ParamBlock& block : model.blocks())
      for (auto& p : block.params()) names.insert(p.name);
    check_no_unexpected_tensors(c.model_files[0], names);
    for (const io::SafetensorsFile& f : c.optimizer_files)
      check_no_unexpected_tensors(f, with_moment_prefixes(names));
    for (const io::TensorInfo& t : c.model_files[0].tensors())
      saved_[t.name] = {t.shape, {{0, t.name, t.shape, 0, shape_numel(t.shape), 0}}};
  } else {
    TITAN_CHECK(layout->value("format", "") == "block-slices", where, ": train_state.json's layout.format '",
                layout->value("format", ""), "' is neither 'block-slices' nor 'named-parameters'");
    const size_t files = c.model_files.size();
    std::vector<std::set<std::string>> held(files);  // the tensors each file holds, without prefixes
    auto add = [&](const std::string& name, const Shape& shape, Piece piece) {
      SavedParam& s = saved_[name];
      TITAN_CHECK(s.pieces.empty() || s.shape == shape, where, ": train_state.json's layout gives '", name,
                  "' the shapes ", shape_str(s.shape), " and ", shape_str(shape));
      s.shape = shape;
      s.pieces.push_back(std::move(piece));
    };
    try {
      for (const nlohmann::json& block : layout->at("blocks")) {
        const std::string name = block.at("name").get<std::string>();
        const nlohmann::json& ranges = block.at("ranges");
        TITAN_CHECK(ranges.size() == files, where, ": block '", name, "' has ", ranges.size(),
                    " shard ranges for ", files, " shard files");
        for (std::set<std::string>& h : held) h.insert(name);
        for (const nlohmann::json& p : block.at("params")) {
          const Shape shape = p.at("shape").get<Shape>();
          const int64_t offset = p.at("offset").get<int64_t>(), n = shape_numel(shape);
          for (size_t k = 0; k < files; ++k) {
            const int64_t lo = ranges[k].at(0).get<int64_t>(), hi = ranges[k].at(1).get<int64_t>();
            TITAN_CHECK(0 <= lo && lo <= hi, where, ": block '", name, "' gives shard file ", k,
                        " the range [", lo, ", ", hi, ")");
            // The part of the parameter inside this file's range of the block.
            const int64_t from = std::max(offset, lo), to = std::min(offset + n, hi);
            if (to > from)
              add(p.at("name").get<std::string>(), shape,
                  {k, name, {hi - lo}, from - offset, to - offset, from - lo});
          }
        }
      }
      for (const nlohmann::json& block : layout->value("expert_blocks", nlohmann::json::array())) {
        const std::string name = block.at("name").get<std::string>();
        const int64_t padded = block.at("padded").get<int64_t>();
        // Per run, the slices of its buffer and their files: "runs" [[{file, range}, ...], ...]; the
        // checkpoints of 2026-12-05 and before give one file per run ("files"), holding it whole.
        struct Slice {
          size_t file;
          int64_t lo, hi;
        };
        std::vector<std::vector<Slice>> runs;
        if (block.contains("runs")) {
          for (const nlohmann::json& run : block.at("runs")) {
            runs.emplace_back();
            for (const nlohmann::json& s : run)
              runs.back().push_back({s.at("file").get<size_t>(), s.at("range").at(0).get<int64_t>(),
                                     s.at("range").at(1).get<int64_t>()});
          }
        } else {
          for (const int64_t k : block.at("files").get<std::vector<int64_t>>()) {
            TITAN_CHECK(k >= 0, where, ": a run of '", name, "' is in shard file ", k);
            runs.push_back({{size_t(k), 0, padded}});
          }
        }
        for (size_t r = 0; r < runs.size(); ++r)
          for (const Slice& s : runs[r]) {
            TITAN_CHECK(s.file < files, where, ": run ", r, " of '", name, "' is in shard file ", s.file,
                        ", but the checkpoint has ", files);
            TITAN_CHECK(0 <= s.lo && s.lo <= s.hi && s.hi <= padded, where, ": run ", r, " of '", name,
                        "' gives shard file ", s.file, " the range [", s.lo, ", ", s.hi, ") of its ", padded,
                        " elements");
            held[s.file].insert(name);
          }
        for (const nlohmann::json& p : block.at("params")) {
          const std::string param = p.at("name").get<std::string>();
          const int64_t offset = p.at("offset").get<int64_t>();
          const nlohmann::json& elements = p.at("elements");
          TITAN_CHECK(elements.size() == runs.size(), where, ": '", param, "' gives ", elements.size(),
                      " runs' elements for the ", runs.size(), " runs of '", name, "'");
          for (size_t r = 0; r < runs.size(); ++r) {
            const int64_t first = elements[r].at(0).get<int64_t>(), last = elements[r].at(1).get<int64_t>();
            TITAN_CHECK(0 <= first && first <= last && offset >= 0 && offset + (last - first) <= padded,
                        where, ": run ", r, " of '", param, "' (elements [", first, ", ", last,
                        ") from offset ", offset, ") does not fit its tensor of ", padded, " elements");
            // The part of the parameter in each slice of the run's buffer.
            for (const Slice& s : runs[r]) {
              const int64_t from = std::max(offset, s.lo), to = std::min(offset + (last - first), s.hi);
              if (to > from)
                add(param, p.at("shape").get<Shape>(),
                    {s.file,
                     name,
                     {s.hi - s.lo},
                     first + (from - offset),
                     first + (to - offset),
                     from - s.lo});
            }
          }
        }
      }
    } catch (const nlohmann::json::exception& e) {
      TITAN_FAIL(where, ": train_state.json's layout cannot be read (", e.what(), ")");
    }
    for (size_t k = 0; k < files; ++k) {
      check_no_unexpected_tensors(c.model_files[k], held[k]);
      if (k < c.optimizer_files.size())
        check_no_unexpected_tensors(c.optimizer_files[k], with_moment_prefixes(held[k]));
    }
  }
  // An untied model from the checkpoint of a tied one (model.tie_embeddings = false, set on purpose:
  // startup.cpp refuses the difference otherwise): its head starts as a copy of the embedding, so it
  // computes what the tied model does, as the Hugging Face load does (qwen3::load_hf_weights).
  const nlohmann::json& saved_model =
      c.train_state.contains("model_config") ? c.train_state["model_config"] : nlohmann::json::object();
  if (!model.args().tie_embeddings && saved_model.value("tie_word_embeddings", false) &&
      !saved_.count("output.weight") && saved_.count("tok_embeddings.weight")) {
    saved_["output.weight"] = saved_.at("tok_embeddings.weight");
    head_from_embedding_ = true;
  }
  // By parameter: the model's are all there, whole, and the checkpoint holds no other.
  std::set<std::string> mine;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (const nn::Param& p : model.blocks()[b].params()) {
      mine.insert(p.name);
      const auto it = saved_.find(p.name);
      TITAN_CHECK(it != saved_.end(), where, " lacks parameter '", p.name,
                  "' of this model (a checkpoint holds every parameter of the model it loads into)");
      const Shape whole = whole_shape(model, b, p);
      TITAN_CHECK(it->second.shape == whole, where, ": parameter '", p.name, "' is ",
                  shape_str(it->second.shape), " there, ", shape_str(whole), " in this model",
                  model.is_expert_block(b) ? " (the whole parameter: every run of its experts)" : "",
                  "; a checkpoint loads into a model whose parameters have its shapes");
    }
  std::vector<std::string> extra;
  for (const auto& [name, s] : saved_)
    if (!mine.count(name)) extra.push_back(name);
  if (head_from_embedding_) saved_.erase("output.weight");  // its pieces are the embedding's, checked once
  TITAN_CHECK(extra.empty(), where, " holds ", extra.size(),
              " parameter(s) this model does not have: ", quoted_list(extra));
  // Every element of every parameter is in exactly one file: none is left zero, none read twice.
  for (auto& [name, s] : saved_) {
    std::sort(s.pieces.begin(), s.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t covered = 0;
    for (const Piece& piece : s.pieces) {
      TITAN_CHECK(piece.begin == covered, where, ": train_state.json's layout holds element ",
                  std::min(piece.begin, covered), " of '", name,
                  piece.begin > covered ? "' in no file" : "' twice", " (each element is held once)");
      covered = piece.end;
    }
    TITAN_CHECK(covered == shape_numel(s.shape), where, ": train_state.json's layout holds elements [",
                covered, ", ", shape_numel(s.shape), ") of '", name,
                "' in no file (each element is held once)");
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
  const int64_t end = begin + out.numel();
  std::fill(dst, dst + out.numel(), 0.0f);
  for (const nn::Param& p : model_.blocks()[b].params()) {
    // The part of the parameter in [begin, end), as elements of the whole parameter.
    const int64_t from = std::max(begin, p.offset), to = std::min(end, p.offset + shape_numel(p.shape));
    if (to > from)
      read_param(p.name, prefix, p.first_element + (from - p.offset), to - from, dst + (from - begin));
  }
}

void CheckpointBlocks::read_param(const std::string& name, const std::string& prefix, int64_t begin,
                                  int64_t n, float* dst) const {
  const auto& files = prefix.empty() ? checkpoint_.model_files : checkpoint_.optimizer_files;
  const int64_t end = begin + n;
  const bool copied_head = head_from_embedding_ && name == "output.weight";
  // A tied run's moments are the shared tensor's: they are no untied head's.
  TITAN_CHECK(!copied_head || prefix.empty(), "checkpoint '", checkpoint_.dir.string(),
              "' ties lm_head to the embedding and this model does not (model.tie_embeddings = false): its "
              "optimizer state has no moments for the untied head; load its weights only "
              "(checkpoint.initial_load_model_only = true) to untie them");
  for (const Piece& piece : saved_.at(copied_head ? "tok_embeddings.weight" : name).pieces) {
    const int64_t from = std::max(begin, piece.begin), to = std::min(end, piece.end);
    if (to <= from) continue;
    const io::SafetensorsFile& f = files[piece.file];
    const std::string tensor = prefix + piece.tensor;
    const io::TensorInfo* t = f.find(tensor);
    TITAN_CHECK(t, "checkpoint '", f.path().string(), "' lacks tensor '", tensor, "'");
    TITAN_CHECK(t->dtype == DType::F32 && t->shape == piece.tensor_shape, "checkpoint '", f.path().string(),
                "': tensor '", tensor, "' is ", dtype_name(t->dtype), shape_str(t->shape), ", expected f32",
                shape_str(piece.tensor_shape));
    std::memcpy(dst + (from - begin), t->data + size_t(piece.at + (from - piece.begin)) * sizeof(float),
                size_t(to - from) * sizeof(float));
  }
  // A NaN or infinity restored would surface as a non-finite loss, blamed on training.
  if (const int64_t i = first_non_finite(dst, n, DType::F32); i >= 0)
    TITAN_FAIL("checkpoint '", checkpoint_.dir.string(), "': '", prefix, name, "' holds a non-finite value (",
               dst[i], "); a checkpoint must hold finite weights and moments");
}

std::string restore_whole_parameters(const LoadedCheckpoint& c, qwen3::Qwen3Model& model) {
  const CheckpointBlocks saved(c, model);
  // Into what this rank keeps of each block: the whole block, or its slice of a sharded one.
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    nn::ParamBlock& block = model.blocks()[b];
    saved.read(b, "", block.shard_begin(), block.shard());
    if (block.keeps_compute_shard()) block.refresh_compute_shard();
  }
  return saved.head_from_embedding() ? "lm_head untied: the checkpoint ties it to the embedding, so the head "
                                       "starts as a copy of the embedding"
                                     : "";
}

}  // namespace titan::train

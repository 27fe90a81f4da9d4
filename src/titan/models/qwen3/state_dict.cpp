#include "titan/models/qwen3/state_dict.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/host_memory.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/models/qwen3/size_check.h"

namespace titan::qwen3 {

Tensor HfTensorRef::value() const {
  return expert < 0 ? param->value.detach() : param->value.detach().narrow(0, expert, 1).reshape(shape);
}

Tensor HfTensorRef::grad() const {
  Tensor g = param->grad();
  return expert < 0 ? g : g.narrow(0, expert, 1).reshape(shape);
}

namespace {

// Each stacked expert weight's HF projection, in checkpoint order.
constexpr std::array<std::pair<const char*, const char*>, 3> kExpertWeights = {
    {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}}};

std::string expert_key(int64_t layer, int64_t expert, const char* proj) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." + proj +
         ".weight";
}

nn::Param* expert_param(Qwen3Model& m, int64_t layer, const char* w) {
  const std::string name = "layers." + std::to_string(layer) + ".moe.experts." + w;
  nn::Param* p = m.find_param(name);
  TITAN_CHECK(p, "state dict: model has no parameter '", name, "'");
  return p;
}

// The HF keys in checkpoint order: `whole` gets the ref of every whole parameter, and `experts` is
// called with the layer where a MoE layer's experts go.
void walk_hf_keys(Qwen3Model& m, const std::function<void(const HfTensorRef&)>& whole_ref,
                  const std::function<void(int64_t layer)>& experts) {
  const ModelArgs& a = m.args();
  auto whole = [&](const std::string& hf, const std::string& native) {
    nn::Param* p = m.find_param(native);
    TITAN_CHECK(p, "state dict: model has no parameter '", native, "'");
    whole_ref({hf, p, -1, p->shape});
  };
  whole("model.embed_tokens.weight", "tok_embeddings.weight");
  for (int64_t i = 0; i < a.n_layers; ++i) {
    std::string hf = "model.layers." + std::to_string(i) + ".", nat = "layers." + std::to_string(i) + ".";
    whole(hf + "input_layernorm.weight", nat + "attention_norm.weight");
    whole(hf + "self_attn.q_proj.weight", nat + "attention.wq.weight");
    whole(hf + "self_attn.k_proj.weight", nat + "attention.wk.weight");
    whole(hf + "self_attn.v_proj.weight", nat + "attention.wv.weight");
    whole(hf + "self_attn.o_proj.weight", nat + "attention.wo.weight");
    whole(hf + "self_attn.q_norm.weight", nat + "attention.q_norm.weight");
    whole(hf + "self_attn.k_norm.weight", nat + "attention.k_norm.weight");
    whole(hf + "post_attention_layernorm.weight", nat + "ffn_norm.weight");
    if (a.is_moe_layer(i)) {
      whole(hf + "mlp.gate.weight", nat + "moe.router.gate.weight");
      experts(i);
    } else {
      whole(hf + "mlp.gate_proj.weight", nat + "feed_forward.w1.weight");
      whole(hf + "mlp.up_proj.weight", nat + "feed_forward.w3.weight");
      whole(hf + "mlp.down_proj.weight", nat + "feed_forward.w2.weight");
    }
  }
  whole("model.norm.weight", "norm.weight");
  if (!a.tie_embeddings) whole("lm_head.weight", "output.weight");
}

// The refs of the model's run of MoE layer `layer`'s experts (all of them unless split over ranks).
std::vector<HfTensorRef> run_refs(Qwen3Model& m, int64_t layer) {
  const int64_t run = m.args().num_experts / m.expert_split().count, first = m.expert_split().index * run;
  std::vector<HfTensorRef> out;
  for (int64_t e = first; e < first + run; ++e)
    for (auto [proj, w] : kExpertWeights) {
      nn::Param* p = expert_param(m, layer, w);
      out.push_back({expert_key(layer, e, proj), p, e - first, Shape(p->shape.begin() + 1, p->shape.end())});
    }
  return out;
}

}  // namespace

std::vector<HfTensorRef> hf_tensors(Qwen3Model& m) {
  std::vector<HfTensorRef> out;
  walk_hf_keys(
      m, [&](const HfTensorRef& r) { out.push_back(r); },
      [&](int64_t layer) {
        for (HfTensorRef& r : run_refs(m, layer)) out.push_back(std::move(r));
      });
  return out;
}

namespace {

// A tensor of the export, in checkpoint order, and the reads its writer makes on reaching it.
struct ExportTensor {
  // A split expert's: the run's parameter, `expert` the expert's index among all of the layer's.
  HfTensorRef ref;
  int weight = -1;  // a split expert's weight (kExpertWeights), written from its layer's whole experts
  std::vector<ExportRead> reads;
};

std::vector<ExportTensor> export_tensors(Qwen3Model& m) {
  std::vector<ExportTensor> out;
  walk_hf_keys(
      m,
      [&](const HfTensorRef& r) {
        out.push_back({r, -1, {{r.param}}});
      },
      [&](int64_t layer) {
        if (m.expert_split().count == 1) {
          for (HfTensorRef& r : run_refs(m, layer)) out.push_back({r, -1, {{r.param}}});
          return;
        }
        for (int64_t e = 0; e < m.args().num_experts; ++e)
          for (size_t w = 0; w < kExpertWeights.size(); ++w) {
            nn::Param* run = expert_param(m, layer, kExpertWeights[w].second);
            ExportTensor t{{expert_key(layer, e, kExpertWeights[w].first), run, e,
                            Shape(run->shape.begin() + 1, run->shape.end())},
                           int(w),
                           {}};
            if (e == 0 && w == 0)  // the layer's first expert brings them all
              for (const auto& weight : kExpertWeights)
                t.reads.push_back({expert_param(m, layer, weight.second), true});
            out.push_back(std::move(t));
          }
      });
  return out;
}

}  // namespace

std::vector<ExportRead> export_reads(Qwen3Model& m) {
  std::vector<ExportRead> out;
  for (const ExportTensor& t : export_tensors(m)) out.insert(out.end(), t.reads.begin(), t.reads.end());
  return out;
}

namespace {

// Element i of a floating tensor of the file, as text ("nan", "-inf", "0.5").
std::string element_text(const io::TensorInfo& t, int64_t i) {
  const std::byte* p = t.data + i * int64_t(dtype_size(t.dtype));
  double v = 0;
  if (t.dtype == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    v = f;
  } else if (t.dtype == DType::F64) {
    std::memcpy(&v, p, 8);
  } else {  // bf16, f16
    uint16_t h;
    std::memcpy(&h, p, 2);
    v = t.dtype == DType::BF16 ? bf16_to_f32(bf16{h}) : f16_to_f32(h);
  }
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string load_hf_weights(Qwen3Model& model, const std::filesystem::path& dir) {
  io::HfCheckpoint ckpt = io::HfCheckpoint::open(dir);
  bool stored_tied_head = false;
  // An untied model from a checkpoint that ties its head (tie_word_embeddings = true, no
  // lm_head.weight; the run sets model.tie_embeddings = false on purpose, which startup.cpp
  // requires): the head starts as a copy of the embedding, so the untied model computes what the tied
  // one does, and the two then train apart.
  const std::filesystem::path config = dir / "config.json";
  const bool head_from_embedding = !model.args().tie_embeddings && !ckpt.find("lm_head.weight") &&
                                   std::filesystem::exists(config) &&
                                   args_from_hf_config_file(config.string()).tie_embeddings;
  // The file's tensor that a parameter reads.
  auto stored_key = [&](const HfTensorRef& r) -> const std::string& {
    static const std::string embedding = "model.embed_tokens.weight";
    return head_from_embedding && r.key == "lm_head.weight" ? embedding : r.key;
  };
  auto refs = hf_tensors(model);
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> expected;
  for (auto& r : refs) {
    expected.insert(r.key);
    const io::TensorInfo* t = ckpt.find(stored_key(r));
    if (!t) {
      missing.push_back(r.key);
      continue;
    }
    if (t->shape != r.shape || !(t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16)) {
      mismatched.push_back(r.key + " (checkpoint " + std::string(dtype_name(t->dtype)) + shape_str(t->shape) +
                           ", model f32" + shape_str(r.shape) + "; titan reads f32, bf16 and f16 tensors)");
    }
  }
  // A model holding one run of the experts (ExpertSplit) reads its experts' tensors only; the
  // others' are not unexpected.
  std::set<std::string> other_runs;
  if (model.expert_split().count > 1) {
    const ModelArgs& a = model.args();
    for (int64_t i = 0; i < a.n_layers; ++i)
      if (a.is_moe_layer(i))
        for (int64_t e = 0; e < a.num_experts; ++e)
          for (const auto& weight : kExpertWeights) other_runs.insert(expert_key(i, e, weight.first));
  }
  for (auto& k : ckpt.keys()) {
    if (expected.count(k) || other_runs.count(k)) continue;
    // A tied model ignores a stored lm_head (the Hub's Qwen3-0.6B carries one, equal to the
    // embedding). One that differs is a trained head the tied model would silently drop.
    if (k == "lm_head.weight" && model.args().tie_embeddings) {
      const io::TensorInfo& t = ckpt.at(k);
      if (t.shape != Shape{model.args().vocab_size, model.args().dim}) {
        mismatched.push_back(k + " (checkpoint " + shape_str(t.shape) + " for a tied lm_head)");
      } else if (const io::TensorInfo* e = ckpt.find("model.embed_tokens.weight");
                 e && (e->dtype != t.dtype || std::memcmp(e->data, t.data, t.nbytes()) != 0)) {
        TITAN_FAIL("checkpoint '", dir.string(),
                   "': config.json says tie_word_embeddings = true but lm_head.weight "
                   "differs from model.embed_tokens.weight; a tied model would drop the trained head (set "
                   "tie_word_embeddings to false to train both, or remove lm_head.weight)");
      }
      stored_tied_head = true;
      continue;
    }
    unexpected.push_back(k);
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 20; ++i) s += "\n    " + v[i];
      if (v.size() > 20) s += "\n    ... and " + std::to_string(v.size() - 20) + " more";
      return s;
    };
    TITAN_FAIL("checkpoint '", dir.string(), "' does not match the model:",
               missing.empty() ? "" : "\n  missing keys (" + std::to_string(missing.size()) + "):" + join(missing),
               unexpected.empty() ? "" : "\n  unexpected keys (" + std::to_string(unexpected.size()) + "):" + join(unexpected),
               mismatched.empty() ? "" : "\n  shape/dtype mismatches (" + std::to_string(mismatched.size()) + "):" + join(mismatched));
  }
  // A NaN or infinity loaded would surface as a non-finite loss at step 1, blamed on training.
  for (auto& r : refs) {
    const io::TensorInfo& t = ckpt.at(stored_key(r));
    if (const int64_t i = first_non_finite(t.data, t.numel(), t.dtype); i >= 0)
      TITAN_FAIL("checkpoint '", dir.string(), "': tensor '", r.key, "' holds ", element_text(t, i),
                 " at element ", i, "; a model's weights must be finite");
  }
  // Each tensor straight into the elements of its block it covers: a sharded rank writes only its
  // slice and never makes a block whole (nn::ParamBlock::write_elements).
  for (auto& block : model.blocks())
    for (auto& r : refs) {
      if (!block.holds(r.param)) continue;
      const io::TensorInfo& t = ckpt.at(stored_key(r));
      // The mapping stays alive while `ckpt` does; wrap without copying, convert into the f32 master.
      const Tensor src = Tensor::from_blob(const_cast<std::byte*>(t.data), t.shape, t.dtype, nullptr);
      const int64_t per_expert = shape_numel(r.shape);
      block.write_elements(r.param->offset + std::max<int64_t>(r.expert, 0) * per_expert, src);
    }
  // What was read, for the log: "24 tensors (f32) from 1 file; lm_head tied to model.embed_tokens".
  std::set<std::string> dtypes;
  for (auto& r : refs) dtypes.insert(std::string(dtype_name(ckpt.at(stored_key(r)).dtype)));
  std::string stored;
  for (const std::string& d : dtypes) stored += (stored.empty() ? "" : ", ") + d;
  // (The copied head is no tensor of the file.)
  std::string text = std::to_string(refs.size() - (head_from_embedding ? 1 : 0)) + " tensors" +
                     (model.expert_split().count > 1 ? " (this rank's run of experts)" : "") + " (" + stored +
                     (stored == "f32" ? "" : ", widened to the f32 weights") + ") from " +
                     std::to_string(ckpt.files().size()) + (ckpt.files().size() == 1 ? " file" : " files");
  if (model.args().tie_embeddings)
    text += stored_tied_head
                ? "; lm_head tied to model.embed_tokens (the stored lm_head.weight, equal to it, is "
                  "not read; exports leave it out, as transformers writes a tied model)"
                : "; lm_head tied to model.embed_tokens";
  if (head_from_embedding)
    text +=
        "; lm_head untied: the checkpoint ties it to model.embed_tokens (tie_word_embeddings = true), so "
        "the head starts as a copy of the embedding";
  return text;
}

std::unique_ptr<Qwen3Model> load_hf_model(const std::filesystem::path& dir, DType compute_dtype,
                                          Device device, Purpose purpose) {
  ModelArgs args = args_from_hf_config_file((dir / "config.json").string());
  const int64_t master_bytes = narrow_size(__int128(args.num_params()) * 4, "weight bytes");
  // On the host the whole model is allocated here; a GPU's allocator names its own shortfall.
  if (device == Device::CPU)
    check_memory_fits(MemoryNeed{master_bytes, purpose == Purpose::Training ? master_bytes : 0, 0, 0},
                      host_available_bytes(), "loading " + dir.string(), host_available_name(),
                      "free memory or load a smaller model");
  auto model = std::make_unique<Qwen3Model>(args, compute_dtype, device, nn::BlockShard{}, purpose);
  load_hf_weights(*model, dir);
  return model;
}

std::string expert_bias_export_warning(double largest) {
  std::ostringstream os;
  os << "the model was trained with expert biases (training.load_balance = \"expert_bias\", largest |bias| "
     << largest
     << "); Qwen3MoeForCausalLM has no place for them, so the export routes tokens by the router's "
        "scores alone and may pick other experts than the trained model did";
  return os.str();
}

void export_hf_model(Qwen3Model& model, const std::filesystem::path& dir, DType dtype,
                     const ExportFiles& files, bool overwrite, const ExportSource& source) {
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export: dtype must be float32 or bfloat16, got ",
              dtype_name(dtype));
  const ExpertSplit split = model.expert_split();
  TITAN_CHECK(split.count == 1 || source.whole_experts, "export: this model holds run ", split.index,
              " of its experts split over ", split.count,
              " ranks; a Hugging Face checkpoint needs every expert, and no WholeExperts was given to "
              "bring the other runs");
  const std::vector<ExportTensor> tensors = export_tensors(model);
  // What the writer reads now: the tensor it has reached (on the host: a copy of a GPU model's), and
  // a split model's experts of the layer it has reached, whole (w1, w3, w2 on the host).
  Tensor current;
  std::array<Tensor, 3> whole;
  auto fetch = [&](const ExportTensor& t) -> const void* {
    for (size_t i = 0; i < t.reads.size(); ++i) {
      nn::Param& p = *t.reads[i].param;
      if (!t.reads[i].whole_experts) {
        if (source.before_read) source.before_read(p);
        continue;
      }
      if (i == 0) whole = {};  // before the next layer's arrive
      Shape want = p.shape;
      want[0] = model.args().num_experts;
      Tensor all = source.whole_experts(p);
      TITAN_CHECK(all.defined() && all.shape() == want && all.dtype() == DType::F32 && all.is_contiguous(),
                  "export: ", p.name, " made whole is ", all.str(), ", expected contiguous f32",
                  shape_str(want), ": every run's experts, in run order");
      whole[i] = all.device() == Device::CPU ? all : all.to(Device::CPU);
    }
    if (t.weight >= 0) return whole[size_t(t.weight)].narrow(0, t.ref.expert, 1).raw_data();
    current = t.ref.value();  // expert slices of [E, F, D] are contiguous
    if (current.device() != Device::CPU) current = current.to(Device::CPU);  // the writer reads host memory
    return current.raw_data();
  };
  std::vector<io::TensorWrite> writes;
  for (const ExportTensor& t : tensors)
    writes.push_back({t.ref.key, dtype, t.ref.shape, nullptr, DType::F32, [&fetch, &t] { return fetch(t); }});
  io::HfWriteOptions opts;
  opts.extra_files["config.json"] =
      hf_config_from_args(model.args(), dtype == DType::F32 ? "float32" : "bfloat16").dump(2) + "\n";
  if (!files.generation_config.is_null())
    opts.extra_files["generation_config.json"] = files.generation_config.dump(2) + "\n";
  opts.copy_files = files.copies;
  opts.overwrite = overwrite;
  io::write_hf_checkpoint(dir, writes, opts);
}

}  // namespace titan::qwen3

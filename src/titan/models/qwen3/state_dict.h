#pragma once
// The state-dict adapter: native parameter names <-> Hugging Face checkpoint keys.
//   tok_embeddings.weight               <-> model.embed_tokens.weight
//   layers.{i}.attention.wq.weight      <-> model.layers.{i}.self_attn.q_proj.weight   (wk, wv, wo alike)
//   layers.{i}.attention.q_norm.weight  <-> model.layers.{i}.self_attn.q_norm.weight   (k_norm alike)
//   layers.{i}.attention_norm.weight    <-> model.layers.{i}.input_layernorm.weight
//   layers.{i}.ffn_norm.weight          <-> model.layers.{i}.post_attention_layernorm.weight
//   layers.{i}.feed_forward.w1/w3/w2    <-> model.layers.{i}.mlp.gate_proj/up_proj/down_proj.weight
//   layers.{i}.moe.router.gate.weight   <-> model.layers.{i}.mlp.gate.weight
//   layers.{i}.moe.experts.w1[e] (w3, w2) <-> model.layers.{i}.mlp.experts.{e}.gate_proj.weight (up, down)
//   norm.weight                         <-> model.norm.weight
//   output.weight                       <-> lm_head.weight (absent when tied; a tied checkpoint may still carry it)
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

// One HF tensor: a whole native parameter, or one expert's slice of a stacked expert weight.
struct HfTensorRef {
  std::string key;
  nn::Param* param;
  int64_t expert = -1;  // slice of the leading (expert) dimension, -1 for the whole parameter
  Shape shape;          // the HF tensor's shape
  Tensor value() const;  // view of the parameter data this key covers
  Tensor grad() const;   // view of its gradient
};

// Every HF key of the model in checkpoint order (tied models have no lm_head.weight). A model whose
// experts are split over ranks (ExpertSplit) has the keys of its own run of experts only, each
// ref's `expert` its place in the run.
std::vector<HfTensorRef> hf_tensors(Qwen3Model& model);

// Builds the model described by DIR/config.json and loads DIR's safetensors into it. Missing
// keys, unexpected keys, and shape or dtype mismatches are reported together, by name.
std::unique_ptr<Qwen3Model> load_hf_model(const std::filesystem::path& dir, DType compute_dtype,
                                          Device device = Device::CPU, Purpose purpose = Purpose::Training);
// Returns what it read: "24 tensors (f32) from 1 file; lm_head tied to model.embed_tokens".
std::string load_hf_weights(Qwen3Model& model, const std::filesystem::path& dir);

// What an export of a model trained with expert biases (largest |bias| `largest`) leaves out: the
// warning titan export and the trainer's export print.
std::string expert_bias_export_warning(double largest);

// What an export holds beside config.json and the weights.
struct ExportFiles {
  std::vector<std::filesystem::path> copies;  // copied as they are: the tokenizer's files
  // Written as generation_config.json unless null: the generation defaults of the model the run
  // started from (its stop tokens, sampling settings), which transformers' generate reads.
  nlohmann::json generation_config;
};

// A split model's expert parameter made whole: given this model's run of it (layers.{i}.moe.experts.w1,
// w3 or w2: [E / count, ...]), every run's experts in run order, [E, ...] in f32, contiguous, on the
// host or the model's device. The models holding the other runs hand theirs over as it asks (the
// trainer's: train/hf_export.h).
using WholeExperts = std::function<Tensor(nn::Param& run)>;

// How an export reads a model held in parts (the trainer's data-parallel ranks: train/hf_export.h),
// in the order export_reads lists. `before_read` is told of each parameter as the writer reaches a
// tensor of it, before its values are read: its block must hold them whole until the next call.
// `whole_experts` (needed by a model whose experts are split over ranks) is asked for each run of
// experts as the writer reaches its layer's first expert.
struct ExportSource {
  std::function<void(const nn::Param&)> before_read;
  WholeExperts whole_experts;
};

// One read of an export: a parameter as the writer reaches one of its tensors (an expert's slice of
// a stacked weight is a read of the whole parameter), or a run of split experts asked of
// ExportSource::whole_experts.
struct ExportRead {
  nn::Param* param;
  bool whole_experts = false;
};

// Every read of an export of `model` in the order it makes them (export_hf_model's ExportSource
// calls): the tensors in checkpoint order, and at a split MoE layer's first expert the runs of w1,
// w3 and w2 made whole (once per layer: the writer keeps them for the layer's other experts).
std::vector<ExportRead> export_reads(Qwen3Model& model);

// Writes DIR with config.json and model.safetensors (sharded above max_shard_bytes) in dtype
// F32 or BF16, plus `files`. Atomic: DIR appears complete or not at all. The writer reads each
// tensor as it reaches it (a model on a GPU: one tensor's host copy at a time), telling `source`.
// A model whose experts are split over ranks (ExpertSplit) writes every expert, the file an unsplit
// model with the same weights writes, through `source.whole_experts` (an error without it): it asks
// for a MoE layer's experts as the writing reaches the layer and drops them when the next layer's
// are asked for, so the export holds one layer's whole experts at a time beyond the model.
void export_hf_model(Qwen3Model& model, const std::filesystem::path& dir, DType dtype,
                     const ExportFiles& files = {}, bool overwrite = false, const ExportSource& source = {});

}  // namespace titan::qwen3

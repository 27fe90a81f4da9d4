#pragma once
// ModelArgs: every shape and numeric choice of a Qwen3 / Qwen3-MoE model. The
// native route takes them from a named flavor (+ overrides), the HF route from
// config.json; the decoder itself only ever sees ModelArgs.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace titan::qwen3 {

struct ModelArgs {
  int64_t vocab_size = 151936;
  int64_t dim = 1024;         // hidden_size
  int64_t n_layers = 28;
  int64_t n_heads = 16;       // query heads
  int64_t n_kv_heads = 8;
  int64_t head_dim = 128;     // independent of dim / n_heads in Qwen3
  int64_t hidden_dim = 3072;  // dense MLP intermediate_size
  double norm_eps = 1e-6;
  double rope_theta = 1e6;
  int64_t max_seq_len = 40960;
  bool tie_embeddings = true;
  // The standard deviation of transformers' random init (config.json's initializer_range): the
  // huggingface init scheme draws every weight from N(0, initializer_range).
  double initializer_range = 0.02;
  // config.json's pad_token_id (-1: none), which transformers makes the embedding's padding_idx: the
  // positions holding it add nothing to the embedding's gradient, and random init zeroes its row.
  int64_t pad_token_id = -1;

  // Mixture of experts (num_experts == 0: dense model).
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t moe_hidden_dim = 0;  // moe_intermediate_size
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers = {};
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // transformers adds coef * aux to the loss only when true

  // The source config.json's bos_token_id and eos_token_id as JSON text (a number, a list or
  // "null"); empty for a native flavor. Not the model's math: carried to the exported config.json.
  std::string bos_token_id_json = "", eos_token_id_json = "";
  // The source config.json's other fields that titan does not model (sliding_window,
  // max_window_layers, layer_types, ...), as a JSON object's text; empty for a native flavor. Not the
  // model's math: carried to the exported config.json so that it keeps the source's fields.
  std::string hf_extra_fields_json = "";

  bool is_moe() const { return num_experts > 0; }
  // transformers: sparse when not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t layer) const;
  // Rejects inconsistent shapes with a message naming the field.
  void validate() const;

  // Parameter counts: total, and active per token (MoE: top_k of num_experts experts).
  int64_t num_params() const;
  int64_t num_active_params() const;
  // Training FLOPs per token at sequence length `seq`, torchtitan's formula:
  // 6 * (matmul parameters active per token, lm_head counted, embedding lookup not)
  //   + 12 * n_layers * n_heads * head_dim * seq   (attention scores and values; no causal halving).
  double flops_per_token(int64_t seq) const;
  // The lm_head's part of flops_per_token, 6 * vocab_size * dim: titan computes it for the positions
  // whose target counts alone (linear_cross_entropy drops ignore_index rows before its GEMMs).
  double lm_head_flops_per_token() const { return 6.0 * double(vocab_size) * double(dim); }
};

// Named shapes from the published Qwen3 configs and torchtitan's debug models.
ModelArgs flavor(const std::string& name);
std::vector<std::string> flavor_names();

// `key` is a ModelArgs field name (n_layers, num_experts, top_k, ...); value as text.
// Unknown keys are errors that list the valid ones.
void apply_override(ModelArgs& args, const std::string& key, const std::string& value);
std::vector<std::string> override_keys();
// Whether field `key` configures experts (num_experts, top_k, moe_hidden_dim, ...): meaningless for a
// dense model.
bool is_moe_field(const std::string& key);
// Whether field `key` is true or false (tie_embeddings, norm_topk_prob, output_router_logits).
bool is_bool_field(const std::string& key);
// Whether field `key` shapes the function the weights compute (dim, rope_theta, norm_eps, ...): the
// fields weights may not load under, nor a checkpoint resume under, with another value. The others:
// the MoE loss settings (router_aux_loss_coef, output_router_logits) weigh a loss term, a training
// choice (a resume notes a change), initializer_range draws the starting weights only, and
// max_seq_len only bounds the positions (RoPE computes each
// position alike whatever the bound; the Hub's Qwen3 configs say 32768, 40960 or 262144).
bool shapes_the_computation(const std::string& key);
// The value of field `key` (one of override_keys()) as text, a double as the shortest text that
// reads back exactly: for messages and comparisons that name the field.
std::string field_text(const ModelArgs& args, const std::string& key);
// The name of field `key` in a Hugging Face config.json ("hidden_dim" -> "intermediate_size"), for
// messages about such a file; a field it spells several ways (rope_theta, top-level or in
// rope_parameters) keeps titan's name.
std::string hf_config_key(const std::string& key);

// Hugging Face config.json <-> ModelArgs. Accepts the Hub and transformers-v5 spellings
// (num_experts / num_local_experts, rope_theta / rope_parameters.rope_theta, torch_dtype /
// dtype). Unsupported architectures or values are errors naming `source` and the field.
ModelArgs args_from_hf_config(const nlohmann::json& config, const std::string& source);
ModelArgs args_from_hf_config_file(const std::string& path);
// The weights' dtype a config.json names: dtype, or the older torch_dtype, "float32" when neither
// (a config args_from_hf_config accepted: the two agree, the name is float32, bfloat16 or float16).
std::string hf_config_weights_dtype(const nlohmann::json& config);
// A config.json transformers reloads (transformers-v5 spelling); dtype "float32"|"bfloat16".
nlohmann::json hf_config_from_args(const ModelArgs& args, const std::string& dtype);

}  // namespace titan::qwen3

#include "titan/models/qwen3/args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/parse.h"
#include "titan/core/suggest.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/models/qwen3/size_check.h"

namespace titan::qwen3 {

bool ModelArgs::is_moe_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

void ModelArgs::validate() const {
  check_size_bounds(*this);  // first: everything below loops over layers or multiplies sizes
  auto positive = [](int64_t v, const char* name) {
    TITAN_CHECK(v > 0, "model args: ", name, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(dim, "dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  TITAN_CHECK(n_heads % n_kv_heads == 0, "model args: n_heads (", n_heads, ") must be a multiple of n_kv_heads (",
              n_kv_heads, ")");
  TITAN_CHECK(head_dim % 2 == 0, "model args: head_dim must be even for RoPE, got ", head_dim);
  // An eps past 1 drowns the mean square it guards (1e300 zeroes every activation and gradient).
  TITAN_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps <= 1,
              "model args: norm_eps must be in (0, 1], got ", norm_eps);
  TITAN_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
              "model args: rope_theta must be finite and positive, got ", rope_theta);
  TITAN_CHECK(std::isfinite(initializer_range) && initializer_range > 0,
              "model args: initializer_range must be finite and positive, got ", initializer_range);
  TITAN_CHECK(pad_token_id == -1 || (pad_token_id >= 0 && pad_token_id < vocab_size),
              "model args: pad_token_id must be -1 (none) or lie in [0, vocab_size=", vocab_size, "), got ",
              pad_token_id);
  // A negative coefficient would reward the imbalance the aux loss exists to penalise.
  TITAN_CHECK(std::isfinite(router_aux_loss_coef) && router_aux_loss_coef >= 0,
              "model args: router_aux_loss_coef must be finite and >= 0, got ", router_aux_loss_coef);
  if (is_moe()) {
    TITAN_CHECK(top_k >= 1 && top_k <= num_experts, "model args: top_k must be in [1, num_experts=", num_experts,
                "], got ", top_k);
    positive(moe_hidden_dim, "moe_hidden_dim");
    positive(decoder_sparse_step, "decoder_sparse_step");
  } else {
    TITAN_CHECK(num_experts == 0, "model args: num_experts must be >= 0, got ", num_experts);
  }
  bool any_dense = false, any_sparse = false;
  for (int64_t i = 0; i < n_layers; ++i) (is_moe_layer(i) ? any_sparse : any_dense) = true;
  TITAN_CHECK(!is_moe() || any_sparse, "model args: num_experts = ", num_experts,
              " but no layer has experts (decoder_sparse_step = ", decoder_sparse_step,
              ", mlp_only_layers lists ", mlp_only_layers.size(),
              " of the layers): set num_experts = 0 for a dense model, or leave a layer sparse");
  if (any_dense) positive(hidden_dim, "hidden_dim");
  for (int64_t l : mlp_only_layers)
    TITAN_CHECK(l >= 0 && l < n_layers, "model args: mlp_only_layers entry ", l, " outside [0, ", n_layers, ")");
}

// In 128 bits: with the size bounds validate() checks, nothing here can overflow before narrowing.
int64_t ModelArgs::num_params() const {
  using Wide = __int128;
  const Wide D = dim, hd = head_dim;
  Wide attn = D * n_heads * hd * 2 + D * n_kv_heads * hd * 2 + 2 * hd;
  Wide total = Wide(vocab_size) * D * (tie_embeddings ? 1 : 2) + D;
  for (int64_t i = 0; i < n_layers; ++i) {
    total += attn + 2 * D;
    total += is_moe_layer(i) ? Wide(num_experts) * D + Wide(num_experts) * 3 * D * moe_hidden_dim
                             : 3 * D * hidden_dim;
  }
  return narrow_size(total, "model args: parameter count");
}

int64_t ModelArgs::num_active_params() const {
  __int128 total = num_params();
  for (int64_t i = 0; i < n_layers; ++i)
    if (is_moe_layer(i)) total -= __int128(num_experts - top_k) * 3 * dim * moe_hidden_dim;
  return narrow_size(total, "model args: active parameter count");
}

double ModelArgs::flops_per_token(int64_t seq) const {
  // Matmul parameters active per token: everything but the norms and the embedding lookup
  // (the lm_head is counted, also when tied).
  double matmul = double(num_active_params()) - double(vocab_size * dim * (tie_embeddings ? 1 : 2));
  matmul += double(vocab_size * dim);  // lm_head
  for (int64_t i = 0; i < n_layers; ++i) matmul -= double(2 * dim + 2 * head_dim);
  matmul -= double(dim);  // final norm
  return 6.0 * matmul + 12.0 * double(n_layers * n_heads * head_dim * seq);
}

// ---------------------------------------------------------------- flavors

namespace {

ModelArgs dense(int64_t dim, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, bool tied, double theta = 1e6) {
  return {.dim = dim, .n_layers = layers, .n_heads = heads, .n_kv_heads = kv, .hidden_dim = hidden,
          .rope_theta = theta, .tie_embeddings = tied};
}

ModelArgs moe(ModelArgs a, int64_t experts, int64_t k, int64_t moe_hidden) {
  a.num_experts = experts;
  a.top_k = k;
  a.moe_hidden_dim = moe_hidden;
  return a;
}

const std::map<std::string, ModelArgs>& flavors() {
  static const std::map<std::string, ModelArgs> table = {
      {"debugmodel", dense(256, 3072, 8, 16, 8, true)},
      {"debugmodel_moe", moe(dense(256, 3072, 8, 16, 8, false), 64, 8, 768)},  // untied, as torchtitan's
      {"0.6B", dense(1024, 3072, 28, 16, 8, true)},
      {"1.7B", dense(2048, 6144, 28, 16, 8, true)},
      {"4B", dense(2560, 9728, 36, 32, 8, true)},
      {"8B", dense(4096, 12288, 36, 32, 8, false)},
      {"14B", dense(5120, 17408, 40, 40, 8, false)},
      {"32B", dense(5120, 25600, 64, 64, 8, false)},
      {"30B-A3B", moe(dense(2048, 6144, 48, 32, 4, false), 128, 8, 768)},
      {"235B-A22B", moe(dense(4096, 12288, 94, 64, 4, false, 5e6), 128, 8, 1536)},
  };
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() {
  std::vector<std::string> names;
  for (auto& [k, v] : flavors()) names.push_back(k);
  return names;
}

ModelArgs flavor(const std::string& name) {
  auto it = flavors().find(name);
  if (it == flavors().end()) {
    TITAN_FAIL("unknown qwen3 flavor '", name, "'", suggestion(name, flavor_names()),
               " (known flavors: ", join(flavor_names(), ", "), ")");
  }
  return it->second;
}

// ---------------------------------------------------------------- overrides

namespace {

int64_t parse_int(const std::string& key, const std::string& v) {
  const auto x = titan::parse_int(v);
  TITAN_CHECK(x, "model.", key, ": expected an integer, got '", v, "'");
  return *x;
}

double parse_double(const std::string& key, const std::string& v) {
  const auto x = parse_number(v);
  TITAN_CHECK(x, "model.", key, ": expected a number, got '", v, "'");
  return *x;
}

bool parse_bool(const std::string& key, const std::string& v) {
  // As every other boolean key of the config (training.deterministic = 1 is refused too).
  const auto b = titan::parse_bool(v);
  TITAN_CHECK(b, "model.", key, ": expected true or false, got '", v, "'");
  return *b;
}

// One ModelArgs field: its override key (`--model.<name>`), its type, and its key in a Hugging Face
// config.json (written by hf_config_from_args; nullptr: written another way).
struct Field {
  const char* name;
  enum Kind { Int, Double, Bool, IntList } kind;
  void* (*member)(ModelArgs&);
  bool moe_only;  // in config.json of MoE models only
  const char* hf_key;
};

// TITAN_FIELD: config.json calls the field by its own name; TITAN_RENAMED_FIELD: by `hf`.
#define TITAN_RENAMED_FIELD(n, k, moe, hf) Field{#n, Field::k, [](ModelArgs& a) -> void* { return &a.n; }, moe, hf}
#define TITAN_FIELD(n, k, moe) TITAN_RENAMED_FIELD(n, k, moe, #n)
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      TITAN_FIELD(vocab_size, Int, false),
      TITAN_RENAMED_FIELD(dim, Int, false, "hidden_size"),
      TITAN_RENAMED_FIELD(n_layers, Int, false, "num_hidden_layers"),
      TITAN_RENAMED_FIELD(n_heads, Int, false, "num_attention_heads"),
      TITAN_RENAMED_FIELD(n_kv_heads, Int, false, "num_key_value_heads"),
      TITAN_FIELD(head_dim, Int, false),
      TITAN_RENAMED_FIELD(hidden_dim, Int, false, "intermediate_size"),
      TITAN_RENAMED_FIELD(norm_eps, Double, false, "rms_norm_eps"),
      TITAN_RENAMED_FIELD(rope_theta, Double, false, nullptr),  // inside rope_parameters
      TITAN_RENAMED_FIELD(max_seq_len, Int, false, "max_position_embeddings"),
      TITAN_RENAMED_FIELD(tie_embeddings, Bool, false, "tie_word_embeddings"),
      TITAN_FIELD(initializer_range, Double, false),
      TITAN_RENAMED_FIELD(pad_token_id, Int, false, nullptr),  // -1 is written as null
      TITAN_FIELD(num_experts, Int, true),
      TITAN_RENAMED_FIELD(top_k, Int, true, "num_experts_per_tok"),
      TITAN_RENAMED_FIELD(moe_hidden_dim, Int, true, "moe_intermediate_size"),
      TITAN_FIELD(decoder_sparse_step, Int, true),
      TITAN_FIELD(mlp_only_layers, IntList, true),
      TITAN_FIELD(norm_topk_prob, Bool, true),
      TITAN_FIELD(router_aux_loss_coef, Double, true),
      TITAN_FIELD(output_router_logits, Bool, true),
  };
  return f;
}
#undef TITAN_FIELD
#undef TITAN_RENAMED_FIELD

}  // namespace

std::vector<std::string> override_keys() {
  std::vector<std::string> k;
  for (auto& f : fields()) k.push_back(f.name);
  return k;
}

bool is_moe_field(const std::string& key) {
  for (auto& f : fields())
    if (key == f.name) return f.moe_only;
  return false;
}

bool is_bool_field(const std::string& key) {
  for (auto& f : fields())
    if (key == f.name) return f.kind == Field::Bool;
  return false;
}

void apply_override(ModelArgs& args, const std::string& key, const std::string& value) {
  for (auto& f : fields()) {
    if (key != f.name) continue;
    void* m = f.member(args);
    switch (f.kind) {
      case Field::Int: *static_cast<int64_t*>(m) = parse_int(key, value); break;
      case Field::Double: *static_cast<double*>(m) = parse_double(key, value); break;
      case Field::Bool: *static_cast<bool*>(m) = parse_bool(key, value); break;
      case Field::IntList: {
        auto& list = *static_cast<std::vector<int64_t>*>(m);
        list.clear();
        std::string v = value;
        v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return c == '[' || c == ']' || c == ' '; }), v.end());
        size_t pos = 0;
        while (pos < v.size()) {
          size_t comma = v.find(',', pos);
          if (comma == std::string::npos) comma = v.size();
          list.push_back(parse_int(key, v.substr(pos, comma - pos)));
          pos = comma + 1;
        }
        break;
      }
    }
    return;
  }
  std::string list;
  for (auto& k : override_keys()) list += (list.empty() ? "" : ", ") + k;
  TITAN_FAIL("unknown model field '", key, "'; valid fields: ", list);
}

bool shapes_the_computation(const std::string& key) {
  return key != "router_aux_loss_coef" && key != "output_router_logits" && key != "max_seq_len" &&
         key != "initializer_range" && key != "pad_token_id";
}

std::string hf_config_key(const std::string& key) {
  for (auto& f : fields())
    if (key == f.name) return f.hf_key ? f.hf_key : f.name;
  TITAN_FAIL("unknown model field '", key, "'");
}

std::string field_text(const ModelArgs& args, const std::string& key) {
  for (auto& f : fields()) {
    if (key != f.name) continue;
    void* m = f.member(const_cast<ModelArgs&>(args));
    switch (f.kind) {
      case Field::Int:
        return std::to_string(*static_cast<int64_t*>(m));
      case Field::Double: {
        char buf[32];  // the shortest text that reads back as the same double
        auto r = std::to_chars(buf, buf + sizeof buf, *static_cast<double*>(m));
        return std::string(buf, r.ptr);
      }
      case Field::Bool:
        return *static_cast<bool*>(m) ? "true" : "false";
      case Field::IntList: {
        std::string list;
        for (int64_t v : *static_cast<std::vector<int64_t>*>(m))
          list += (list.empty() ? "" : ", ") + std::to_string(v);
        return "[" + list + "]";
      }
    }
  }
  TITAN_FAIL("unknown model field '", key, "'");
}

// ---------------------------------------------------------------- Hugging Face config.json

namespace {

ModelArgs args_from_hf_config_unchecked_types(const nlohmann::json& c, const std::string& src) {
  TITAN_CHECK(c.is_object(), src, ": config must be a JSON object");
  TITAN_CHECK(c.contains("architectures") && c["architectures"].is_array() &&
                  c["architectures"].size() == 1 && c["architectures"][0].is_string(),
              src, ": 'architectures' must list exactly one architecture name");
  std::string arch = c["architectures"][0].get<std::string>();
  TITAN_CHECK(arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM", src, ": architecture '", arch,
              "' is not supported (supported: Qwen3ForCausalLM, Qwen3MoeForCausalLM)");
  const bool is_moe = arch == "Qwen3MoeForCausalLM";
  // transformers builds the model from model_type when it loads a config: both must say the same.
  if (c.contains("model_type")) {
    const std::string want = is_moe ? "qwen3_moe" : "qwen3";
    TITAN_CHECK(c["model_type"] == want, src, ": model_type ", c["model_type"].dump(),
                " contradicts architectures ", c["architectures"].dump(), " (which has model_type \"", want,
                "\")");
  }

  auto get_int = [&](const char* k) -> int64_t {
    TITAN_CHECK(c.contains(k) && c[k].is_number_integer(), src, ": field '", k, "' missing or not an integer");
    return c[k].get<int64_t>();
  };
  auto get_num = [&](const char* k) -> double {
    TITAN_CHECK(c.contains(k) && c[k].is_number(), src, ": field '", k, "' missing or not a number");
    return c[k].get<double>();
  };
  auto opt_bool = [&](const char* k, bool def) -> bool {
    if (!c.contains(k) || c[k].is_null()) return def;
    TITAN_CHECK(c[k].is_boolean(), src, ": field '", k, "' must be true or false");
    return c[k].get<bool>();
  };

  ModelArgs a;
  a.vocab_size = get_int("vocab_size");
  a.dim = get_int("hidden_size");
  a.n_layers = get_int("num_hidden_layers");
  a.n_heads = get_int("num_attention_heads");
  // Required where transformers' defaults for a missing field differ between its versions and
  // between Qwen3 and Qwen3-MoE (head_dim 128 or hidden_size / heads, num_key_value_heads 32, 8 or
  // 4): a guess could build another architecture than the one the file means. (head_dim null, as
  // transformers writes for MoE configs without one: hidden_size / heads.)
  a.n_kv_heads = get_int("num_key_value_heads");
  TITAN_CHECK(c.contains("head_dim"), src,
              ": field 'head_dim' missing (transformers' default for it differs between versions and between "
              "Qwen3 and Qwen3-MoE: give it)");
  a.head_dim = !c["head_dim"].is_null() ? get_int("head_dim") : a.dim / a.n_heads;
  a.norm_eps = get_num("rms_norm_eps");
  a.max_seq_len = get_int("max_position_embeddings");
  a.tie_embeddings = opt_bool("tie_word_embeddings", false);
  a.initializer_range = c.contains("initializer_range") ? get_num("initializer_range") : 0.02;
  // transformers passes it to nn.Embedding as padding_idx (which would also take -V..-1 as counted
  // from the end; a token id is never negative, so titan refuses those).
  if (c.contains("pad_token_id") && !c["pad_token_id"].is_null()) {
    a.pad_token_id = get_int("pad_token_id");
    TITAN_CHECK(a.pad_token_id >= 0 && a.pad_token_id < a.vocab_size, src, ": pad_token_id ", a.pad_token_id,
                " is not a token id of the vocabulary [0, vocab_size=", a.vocab_size, ")");
  }
  // transformers' layer_types lists each layer's attention; titan computes full causal attention in
  // every layer.
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    const auto& types = c["layer_types"];
    TITAN_CHECK(types.is_array() && int64_t(types.size()) == a.n_layers, src,
                ": field 'layer_types' must list num_hidden_layers = ", a.n_layers, " layers, got ",
                types.dump());
    for (size_t i = 0; i < types.size(); ++i)
      TITAN_CHECK(types[i] == "full_attention", src, ": layer_types[", i, "] = ", types[i].dump(),
                  " is not supported (titan computes \"full_attention\" in every layer)");
  }

  TITAN_CHECK(
      !c.contains("rope_parameters") || c["rope_parameters"].is_null() || c["rope_parameters"].is_object(),
      src, ": field 'rope_parameters' must be an object, got ", c["rope_parameters"].dump());
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    const auto& rp = c["rope_parameters"];
    // transformers reads the older spelling "type" where "rope_type" is missing.
    for (const char* k : {"rope_type", "type"})
      TITAN_CHECK(!rp.contains(k) || rp[k] == "default", src, ": rope_parameters.", k, " ", rp[k].dump(),
                  " is not supported (only \"default\": titan computes plain RoPE)");
    TITAN_CHECK(rp.contains("rope_theta") && rp["rope_theta"].is_number(), src,
                ": rope_parameters.rope_theta missing or not a number");
    a.rope_theta = rp["rope_theta"].get<double>();
    // The older top-level spelling beside it (transformers 4 reads that one): the two must agree.
    if (c.contains("rope_theta") && !c["rope_theta"].is_null())
      TITAN_CHECK(c["rope_theta"].is_number() && c["rope_theta"].get<double>() == a.rope_theta, src,
                  ": rope_theta ", c["rope_theta"].dump(), " contradicts rope_parameters.rope_theta ",
                  rp["rope_theta"].dump());
  } else {
    a.rope_theta = get_num("rope_theta");
  }
  // Scaled RoPE (yarn, linear, dynamic, ...) in either spelling: titan computes plain RoPE only.
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    TITAN_FAIL(src, ": rope_scaling is not supported (got ", c["rope_scaling"].dump(), ")");
  if (c.contains("hidden_act"))
    TITAN_CHECK(c["hidden_act"] == "silu", src, ": hidden_act ", c["hidden_act"].dump(),
                " is not supported (only \"silu\")");
  TITAN_CHECK(!opt_bool("attention_bias", false), src, ": attention_bias=true is not supported by Qwen3");
  // Fields that would change the maths titan computes: refused, never carried along unread.
  if (c.contains("attention_dropout") && !c["attention_dropout"].is_null())
    TITAN_CHECK(c["attention_dropout"].is_number() && c["attention_dropout"].get<double>() == 0, src,
                ": attention_dropout ", c["attention_dropout"].dump(),
                " is not supported (titan trains without dropout; set it to 0.0)");
  for (const nlohmann::json* holder : {&c, c.contains("rope_parameters") ? &c["rope_parameters"] : nullptr})
    if (holder && holder->is_object() && holder->contains("partial_rotary_factor"))
      TITAN_CHECK((*holder)["partial_rotary_factor"].is_number() &&
                      (*holder)["partial_rotary_factor"].get<double>() == 1,
                  src, ": partial_rotary_factor ", (*holder)["partial_rotary_factor"].dump(),
                  " is not supported (Qwen3 rotates the whole head_dim)");
  if (c.contains("quantization_config") && !c["quantization_config"].is_null())
    TITAN_FAIL(
        src,
        ": quantization_config is set: quantized checkpoints are not supported (titan trains float32 or "
        "bfloat16 weights)");
  if (c.contains("dtype") && c.contains("torch_dtype") && !c["dtype"].is_null() &&
      !c["torch_dtype"].is_null())
    TITAN_CHECK(c["dtype"] == c["torch_dtype"], src, ": dtype ", c["dtype"].dump(),
                " contradicts torch_dtype ", c["torch_dtype"].dump(),
                " (two spellings of the weights' dtype)");
  if (opt_bool("use_sliding_window", false)) TITAN_FAIL(src, ": use_sliding_window=true is not supported");
  for (const char* k : {"torch_dtype", "dtype"}) {
    if (!c.contains(k) || c[k].is_null()) continue;
    TITAN_CHECK(c[k].is_string(), src, ": field '", k, "' must be a dtype name such as \"bfloat16\", got ",
                c[k].dump());
    std::string d = c[k].get<std::string>();
    TITAN_CHECK(d == "float32" || d == "bfloat16" || d == "float16", src, ": ", k, " '", d,
                "' is not supported (float32, bfloat16, float16)");
  }

  if (is_moe) {
    // The Hub's spelling (num_experts) and transformers v5's (num_local_experts): one, or both equal.
    if (c.contains("num_experts")) a.num_experts = get_int("num_experts");
    else a.num_experts = get_int("num_local_experts");
    if (c.contains("num_experts") && c.contains("num_local_experts"))
      TITAN_CHECK(get_int("num_local_experts") == a.num_experts, src, ": num_experts ", a.num_experts,
                  " contradicts num_local_experts ", get_int("num_local_experts"),
                  " (two spellings of the expert count)");
    a.top_k = get_int("num_experts_per_tok");
    a.moe_hidden_dim = get_int("moe_intermediate_size");
    a.decoder_sparse_step = c.contains("decoder_sparse_step") ? get_int("decoder_sparse_step") : 1;
    if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
      const auto& layers = c["mlp_only_layers"];
      TITAN_CHECK(
          layers.is_array() && std::all_of(layers.begin(), layers.end(),
                                           [](const nlohmann::json& l) { return l.is_number_integer(); }),
          src, ": field 'mlp_only_layers' must be a list of layer indices, got ", layers.dump());
      a.mlp_only_layers = layers.get<std::vector<int64_t>>();
    }
    a.norm_topk_prob = opt_bool("norm_topk_prob", false);
    a.router_aux_loss_coef = c.contains("router_aux_loss_coef") ? get_num("router_aux_loss_coef") : 0.001;
    a.output_router_logits = opt_bool("output_router_logits", false);
    a.hidden_dim = c.contains("intermediate_size") ? get_int("intermediate_size") : 0;
    if (c.contains("shared_expert_intermediate_size") && c["shared_expert_intermediate_size"].is_number() &&
        c["shared_expert_intermediate_size"].get<int64_t>() > 0)
      TITAN_FAIL(src, ": shared experts are not part of Qwen3-MoE (shared_expert_intermediate_size > 0)");
  } else {
    a.hidden_dim = get_int("intermediate_size");
  }
  if (c.contains("bos_token_id")) a.bos_token_id_json = c["bos_token_id"].dump();
  if (c.contains("eos_token_id")) a.eos_token_id_json = c["eos_token_id"].dump();
  try {
    a.validate();
  } catch (const Error& e) {
    TITAN_FAIL(src, ": ", e.what());
  }
  // What titan does not model, kept for the export: every field its own config.json lacks, less
  // those that describe the file rather than the model (its dtype spellings, the writer's version,
  // where it came from) or that titan refused above when set.
  static const std::set<std::string> not_carried = {"torch_dtype",   "dtype",       "transformers_version",
                                                    "_name_or_path", "auto_map",    "quantization_config",
                                                    "rope_scaling",  "num_experts", "num_local_experts"};
  const nlohmann::json ours = hf_config_from_args(a, "float32");
  nlohmann::json extra = nlohmann::json::object();
  for (auto& [key, value] : c.items())
    if (!ours.contains(key) && !not_carried.count(key)) extra[key] = value;
  if (!extra.empty()) a.hf_extra_fields_json = extra.dump();
  return a;
}

}  // namespace

ModelArgs args_from_hf_config(const nlohmann::json& c, const std::string& src) {
  // Every field's type is checked where it is read; a JSON type error that still escapes names the file.
  try {
    return args_from_hf_config_unchecked_types(c, src);
  } catch (const nlohmann::json::exception& e) {
    TITAN_FAIL(src, ": a field has the wrong JSON type (", e.what(), ")");
  }
}

ModelArgs args_from_hf_config_file(const std::string& path) {
  // A native checkpoint where a Hugging Face folder is expected (titan generate --model-path, titan
  // verify-export, ...): named as such, not as a missing config.json.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  TITAN_CHECK(std::filesystem::exists(path) || !std::filesystem::exists(folder / "manifest.json"), "'",
              folder.string(),
              "' is a native titan checkpoint (manifest.json, no config.json), not a Hugging Face folder: "
              "titan export writes one from it (commands that read native checkpoints take it as "
              "--checkpoint)");
  return args_from_hf_config(io::parse_json_text(io::read_regular_file(path, "model config"), path), path);
}

std::string hf_config_weights_dtype(const nlohmann::json& config) {
  for (const char* k : {"dtype", "torch_dtype"})
    if (config.contains(k) && config[k].is_string()) return config[k].get<std::string>();
  return "float32";
}

nlohmann::json hf_config_from_args(const ModelArgs& a, const std::string& dtype) {
  // What transformers' Qwen3 configs hold and titan has no field for (titan's model is exactly this).
  nlohmann::json c = {
      {"hidden_act", "silu"}, {"attention_bias", false},     {"attention_dropout", 0.0},
      {"use_cache", true},    {"use_sliding_window", false},
  };
  // The source's special-token ids, else (a native flavor) those of the released Qwen3 configs,
  // <|endoftext|> and <|im_end|>, when the vocabulary holds them.
  auto token_id = [&](const std::string& source, int64_t qwen3_id) {
    if (!source.empty()) return nlohmann::json::parse(source);
    return qwen3_id < a.vocab_size ? nlohmann::json(qwen3_id) : nlohmann::json(nullptr);
  };
  c["bos_token_id"] = token_id(a.bos_token_id_json, 151643);
  c["eos_token_id"] = token_id(a.eos_token_id_json, 151645);
  c["architectures"] = {a.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  c["model_type"] = a.is_moe() ? "qwen3_moe" : "qwen3";
  // transformers v5 reads rope_parameters, v4 the top-level rope_theta (without it, v4 would silently
  // take 10000): both, equal.
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  c["rope_theta"] = a.rope_theta;
  c["dtype"] = dtype;
  // As transformers writes it: null when there is none.
  c["pad_token_id"] = a.pad_token_id >= 0 ? nlohmann::json(a.pad_token_id) : nlohmann::json(nullptr);
  for (const Field& f : fields()) {
    if (!f.hf_key || (f.moe_only && !a.is_moe())) continue;
    void* m = f.member(const_cast<ModelArgs&>(a));
    switch (f.kind) {
      case Field::Int: c[f.hf_key] = *static_cast<int64_t*>(m); break;
      case Field::Double: c[f.hf_key] = *static_cast<double*>(m); break;
      case Field::Bool: c[f.hf_key] = *static_cast<bool*>(m); break;
      case Field::IntList: c[f.hf_key] = *static_cast<std::vector<int64_t>*>(m); break;
    }
  }
  // The expert count in transformers v5's spelling too (the Hub's configs say num_experts).
  if (a.is_moe()) c["num_local_experts"] = a.num_experts;
  // The source's fields titan does not model, where they still describe this model: a per-layer
  // list of another length (the layer count was overridden) is left out.
  if (!a.hf_extra_fields_json.empty()) {
    const nlohmann::json extra = nlohmann::json::parse(a.hf_extra_fields_json);  // outlives the loop
    for (auto& [key, value] : extra.items())
      if (!c.contains(key) && !(value.is_array() && key == "layer_types" && int64_t(value.size()) != a.n_layers))
        c[key] = value;
  }
  return c;
}

}  // namespace titan::qwen3

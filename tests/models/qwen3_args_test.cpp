// ModelArgs from flavors, overrides and Hugging Face config.json (Hub and transformers-v5 spellings).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "models/small_args.h"
#include "test_util.h"
#include "titan/core/check.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

using namespace titan;
using namespace titan::qwen3;

namespace {

nlohmann::json hub_moe_config() {
  // Qwen3-30B-A3B as the Hub spells it (num_experts, rope_theta, torch_dtype).
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": null, "max_position_embeddings": 40960,
    "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "output_router_logits": false,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu"})");
}

void expect_error_mentions(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Qwen3Args, HubAndV5SpellingsGiveTheSameArgs) {
  ModelArgs hub = args_from_hf_config(hub_moe_config(), "hub");
  nlohmann::json v5 = hub_moe_config();
  v5.erase("num_experts");
  v5["num_local_experts"] = 128;
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  ModelArgs b = args_from_hf_config(v5, "v5");
  EXPECT_EQ(hub.num_experts, 128);
  EXPECT_EQ(b.num_experts, 128);
  EXPECT_EQ(hub.rope_theta, 1e6);
  EXPECT_EQ(b.rope_theta, 1e6);
  // The published 30B-A3B flavor agrees with the Hub config.
  ModelArgs f = flavor("30B-A3B");
  EXPECT_EQ(f.num_params(), hub.num_params());
  EXPECT_EQ(f.num_active_params(), b.num_active_params());
  // Written back, the config reads back to the same args.
  ModelArgs again = args_from_hf_config(hf_config_from_args(hub, "bfloat16"), "roundtrip");
  EXPECT_EQ(again.num_params(), hub.num_params());
  EXPECT_EQ(again.tie_embeddings, hub.tie_embeddings);
  EXPECT_EQ(again.top_k, hub.top_k);
}

TEST(Qwen3Args, ExportedConfigKeepsTheSourcesSpecialTokenIds) {
  // A Hub config's ids (a Base model's eos is <|endoftext|>), a list, and nulls go back as they were.
  auto c = hub_moe_config();
  c["bos_token_id"] = 151643;
  c["eos_token_id"] = 151643;
  nlohmann::json out = hf_config_from_args(args_from_hf_config(c, "base"), "bfloat16");
  EXPECT_EQ(out["bos_token_id"], 151643);
  EXPECT_EQ(out["eos_token_id"], 151643);
  c["bos_token_id"] = nullptr;
  c["eos_token_id"] = {151645, 151643};
  out = hf_config_from_args(args_from_hf_config(c, "list"), "bfloat16");
  EXPECT_TRUE(out["bos_token_id"].is_null());
  EXPECT_EQ(out["eos_token_id"], nlohmann::json({151645, 151643}));
  // Read back from the export (a resumed run's model_config, titan export), they stay.
  EXPECT_EQ(hf_config_from_args(args_from_hf_config(out, "again"), "float32")["eos_token_id"],
            out["eos_token_id"]);
  // A native flavor: the released Qwen3 ids when the vocabulary holds them, else null.
  ModelArgs native = flavor("debugmodel");
  out = hf_config_from_args(native, "float32");
  EXPECT_EQ(out["bos_token_id"], 151643);
  EXPECT_EQ(out["eos_token_id"], 151645);
  native.vocab_size = 4096;
  out = hf_config_from_args(native, "float32");
  EXPECT_TRUE(out["bos_token_id"].is_null());
  EXPECT_TRUE(out["eos_token_id"].is_null());
}

// The source's fields titan does not model (transformers' own config of the oracles: pad_token_id,
// sliding_window, max_window_layers, layer_types, ...) go back into the export as they were, also
// through a checkpoint's model_config; the file's dtype spellings and writer version are the
// export's own; a per-layer list whose length no longer fits (n_layers overridden) is left out.
TEST(Qwen3Args, ExportedConfigKeepsTheSourcesOtherFields) {
  for (const char* oracle : {"tiny_dense", "tiny_moe"}) {
    SCOPED_TRACE(oracle);
    const std::string path = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/oracles/hf-transformers-5.17/" +
                             oracle + "/config.json";
    const nlohmann::json source = nlohmann::json::parse(std::ifstream(path));
    const ModelArgs a = args_from_hf_config_file(path);
    const nlohmann::json out = hf_config_from_args(a, "bfloat16");
    for (auto& [key, value] : source.items()) {
      if (key == "transformers_version") {
        EXPECT_FALSE(out.contains(key)) << "titan is not transformers " << value;
      } else if (key == "dtype") {
        EXPECT_EQ(out[key], "bfloat16");
      } else {
        ASSERT_TRUE(out.contains(key)) << key;
        EXPECT_EQ(out[key], value) << key;
      }
    }
    // Through a checkpoint's model_config (written, read back, written again) they stay.
    EXPECT_EQ(hf_config_from_args(args_from_hf_config(out, "model_config"), "bfloat16"), out);
    ModelArgs fewer = a;
    fewer.n_layers = 1;
    fewer.mlp_only_layers.clear();
    EXPECT_FALSE(hf_config_from_args(fewer, "float32").contains("layer_types"));
  }
}

TEST(Qwen3Args, UnsupportedArchitectureOrValueIsAClearError) {
  auto c = hub_moe_config();
  c["architectures"] = {"LlamaForCausalLM"};
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); }, "LlamaForCausalLM");
  c = hub_moe_config();
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); }, "rope_scaling");
  c = hub_moe_config();
  c["hidden_act"] = "gelu";
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); },
                        "cfg.json: hidden_act \"gelu\" is not supported (only \"silu\")");
  // An mlp_only_layers entry past the last layer is named as such (not as a list too long).
  c = hub_moe_config();
  c["num_hidden_layers"] = 1;
  c["mlp_only_layers"] = {0, 5};
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); },
                        "mlp_only_layers entry 5 outside [0, 1)");
  c = hub_moe_config();
  c.erase("hidden_size");
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); }, "hidden_size");
  c = hub_moe_config();
  c["num_key_value_heads"] = 5;
  expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); }, "n_kv_heads");
}

// A config.json whose fields contradict each other, or hold the wrong JSON type, is an error naming
// the file and the fields, never resolved by picking one.
// A native checkpoint given where a Hugging Face folder is read (titan generate --model-path, titan
// verify-export): named as such, with what to do, not as a missing config.json.
TEST(Qwen3Args, ANativeCheckpointWhereAHuggingFaceFolderIsExpectedIsNamed) {
  const auto dir = titan::testing::temp_dir("args_native_checkpoint");
  { std::ofstream(dir / "manifest.json") << "{}"; }
  const std::string e =
      titan::testing::error_of([&] { args_from_hf_config_file((dir / "config.json").string()); });
  EXPECT_NE(e.find("'" + dir.string() + "' is a native titan checkpoint (manifest.json, no config.json)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("titan export"), std::string::npos) << e;
  std::filesystem::remove(dir / "manifest.json");  // a plain folder: the missing file is the error
  EXPECT_NE(titan::testing::error_of([&] {
              args_from_hf_config_file((dir / "config.json").string());
            }).find("config.json"),
            std::string::npos);
}

TEST(Qwen3Args, ContradictoryOrMistypedFieldsAreErrorsNamingThem) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const Case cases[] = {
      {[](auto& c) {
         c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}}, c["rope_theta"] = 1e4;
       },
       "cfg.json: rope_theta 10000.0 contradicts rope_parameters.rope_theta 1000000.0"},
      {[](auto& c) {
         c.erase("rope_theta"), c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
         c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
       },
       "cfg.json: rope_scaling is not supported"},
      {[](auto& c) { c["num_local_experts"] = 64; },
       "cfg.json: num_experts 128 contradicts num_local_experts 64"},
      {[](auto& c) { c["model_type"] = "qwen3"; },
       "cfg.json: model_type \"qwen3\" contradicts architectures [\"Qwen3MoeForCausalLM\"]"},
      {[](auto& c) { c["torch_dtype"] = 5; }, "cfg.json: field 'torch_dtype' must be a dtype name"},
      {[](auto& c) { c["architectures"] = {123}; },
       "cfg.json: 'architectures' must list exactly one architecture"},
      {[](auto& c) { c["mlp_only_layers"] = {"0"}; },
       "cfg.json: field 'mlp_only_layers' must be a list of layer"},
      {[](auto& c) { c["rope_theta"] = "1e6"; }, "cfg.json: field 'rope_theta' missing or not a number"},
      {[](auto& c) { c["dtype"] = "float32", c["torch_dtype"] = "bfloat16"; },
       "cfg.json: dtype \"float32\" contradicts torch_dtype \"bfloat16\""},
      // Fields that change the maths titan computes are refused, never carried along unread.
      {[](auto& c) { c["attention_dropout"] = 0.5; }, "cfg.json: attention_dropout 0.5 is not supported"},
      {[](auto& c) { c["partial_rotary_factor"] = 0.5; },
       "cfg.json: partial_rotary_factor 0.5 is not supported"},
      {[](auto& c) {
         c.erase("rope_theta"),
             c["rope_parameters"] = {
                 {"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.5}};
       },
       "cfg.json: partial_rotary_factor 0.5 is not supported"},
      {[](auto& c) {
         c["quantization_config"] = {{"quant_method", "fp8"}};
       },
       "cfg.json: quantization_config is set: quantized checkpoints are not supported"},
      // Scaled RoPE in the older key transformers still reads, a rope_parameters of the wrong type,
      // attention other than full in some layer (or a list of another length), fields whose
      // missing value transformers fills differently by version.
      {[](auto& c) {
         c.erase("rope_theta"),
             c["rope_parameters"] = {{"type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e6}};
       },
       "cfg.json: rope_parameters.type \"yarn\" is not supported (only \"default\""},
      {[](auto& c) {
         c["rope_parameters"] = {1, 2};
       },
       "cfg.json: field 'rope_parameters' must be an object"},
      {[](auto& c) {
         c["layer_types"] = nlohmann::json::array();
         for (int i = 0; i < 48; ++i)
           c["layer_types"].push_back(i == 3 ? "sliding_attention" : "full_attention");
       },
       "cfg.json: layer_types[3] = \"sliding_attention\" is not supported"},
      {[](auto& c) { c["layer_types"] = {"full_attention"}; },
       "cfg.json: field 'layer_types' must list num_hidden_layers = 48 layers"},
      {[](auto& c) { c.erase("head_dim"); }, "cfg.json: field 'head_dim' missing"},
      {[](auto& c) { c.erase("num_key_value_heads"); }, "cfg.json: field 'num_key_value_heads' missing"},
      {[](auto& c) { c.erase("max_position_embeddings"); },
       "cfg.json: field 'max_position_embeddings' missing"},
      {[](auto& c) { c["initializer_range"] = -1.0; },
       "model args: initializer_range must be finite and positive"},
      // Values no model has: a negative aux-loss weight rewards imbalance; non-finite or huge eps.
      {[](auto& c) { c["router_aux_loss_coef"] = -0.5; },
       "model args: router_aux_loss_coef must be finite and >= 0, got -0.5"},
      {[](auto& c) { c["rms_norm_eps"] = 1e300; }, "model args: norm_eps must be in (0, 1]"},
  };
  for (const auto& k : cases) {
    nlohmann::json c = hub_moe_config();
    k.edit(c);
    expect_error_mentions([&] { args_from_hf_config(c, "cfg.json"); }, k.message);
  }
  // Both spellings, equal, as titan's own export writes them: accepted.
  nlohmann::json both = hub_moe_config();
  both["num_local_experts"] = 128;
  both["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  both["model_type"] = "qwen3_moe";
  EXPECT_EQ(args_from_hf_config(both, "both").num_experts, 128);
  const nlohmann::json exported = hf_config_from_args(args_from_hf_config(both, "both"), "bfloat16");
  EXPECT_EQ(exported["num_local_experts"], 128);
  EXPECT_EQ(exported["num_experts"], 128);
  EXPECT_EQ(exported["rope_theta"], 1e6);
  EXPECT_EQ(exported["rope_parameters"]["rope_theta"], 1e6);
}

// config.json's initializer_range is the standard deviation of transformers' random init: the
// huggingface scheme draws the weights with it, and the export says it (0.02 when the source has none).
TEST(Qwen3Args, InitializerRangeDrawsTheWeightsAndIsExported) {
  nlohmann::json c = hub_moe_config();
  c.erase("initializer_range");
  EXPECT_EQ(args_from_hf_config(c, "cfg.json").initializer_range, 0.02);
  c["initializer_range"] = 0.006;
  const ModelArgs a = args_from_hf_config(c, "cfg.json");
  EXPECT_EQ(a.initializer_range, 0.006);
  EXPECT_EQ(hf_config_from_args(a, "bfloat16")["initializer_range"], 0.006);
  auto weight_std = [](double range) {
    ModelArgs small = titan::testing::small_args(1, false);
    small.initializer_range = range;
    Qwen3Model model(small, DType::F32);
    model.initialize(7, InitScheme::HuggingFace);
    double sum_sq = 0;
    const std::vector<double> w = model.find_param("layers.0.attention.wq.weight")->value.to_vector();
    for (double v : w) sum_sq += v * v;
    return std::sqrt(sum_sq / double(w.size()));
  };
  EXPECT_NEAR(weight_std(0.02), 0.02, 0.002);
  EXPECT_NEAR(weight_std(0.5), 0.5, 0.05);
}

// config.json's pad_token_id becomes the embedding's padding_idx (null or missing: none), is
// exported as read (null when none, as transformers writes it), and must be a token id.
TEST(Qwen3Args, PadTokenIdIsReadCheckedAndExported) {
  nlohmann::json c = hub_moe_config();
  c.erase("pad_token_id");
  EXPECT_EQ(args_from_hf_config(c, "cfg.json").pad_token_id, -1);
  EXPECT_TRUE(hf_config_from_args(args_from_hf_config(c, "cfg.json"), "bfloat16")["pad_token_id"].is_null());
  c["pad_token_id"] = nullptr;
  EXPECT_EQ(args_from_hf_config(c, "cfg.json").pad_token_id, -1);
  c["pad_token_id"] = 151643;
  const ModelArgs a = args_from_hf_config(c, "cfg.json");
  EXPECT_EQ(a.pad_token_id, 151643);
  EXPECT_EQ(hf_config_from_args(a, "bfloat16")["pad_token_id"], 151643);
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json(a.vocab_size), nlohmann::json("0")}) {
    c["pad_token_id"] = bad;
    const std::string m = titan::testing::error_of([&] { args_from_hf_config(c, "cfg.json"); });
    EXPECT_NE(m.find("cfg.json"), std::string::npos) << m;
    EXPECT_NE(m.find("pad_token_id"), std::string::npos) << m;
  }
  ModelArgs native = flavor("debugmodel");
  EXPECT_EQ(native.pad_token_id, -1);
  apply_override(native, "pad_token_id", "3");
  EXPECT_EQ(native.pad_token_id, 3);
  native.pad_token_id = native.vocab_size;
  EXPECT_NE(titan::testing::error_of([&] {
              native.validate();
            }).find("pad_token_id must be -1 (none) or lie in [0, vocab_size="),
            std::string::npos);
}

TEST(Qwen3Args, FlavorsAndOverrides) {
  for (auto& name : flavor_names()) EXPECT_NO_THROW(flavor(name).validate()) << name;
  ModelArgs a = flavor("30B-A3B");
  apply_override(a, "n_layers", "4");
  apply_override(a, "num_experts", "64");
  apply_override(a, "top_k", "4");
  apply_override(a, "mlp_only_layers", "[0, 2]");
  EXPECT_EQ(a.n_layers, 4);
  EXPECT_EQ(a.num_experts, 64);
  EXPECT_FALSE(a.is_moe_layer(0));
  EXPECT_TRUE(a.is_moe_layer(1));
  EXPECT_FALSE(a.is_moe_layer(2));
  EXPECT_EQ(flavor("235B-A22B").rope_theta, 5e6);
  expect_error_mentions([&] { apply_override(a, "n_layer", "4"); }, "n_layers");
  expect_error_mentions([&] { apply_override(a, "top_k", "four"); }, "top_k");
  expect_error_mentions([&] { flavor("0.7B"); }, "0.6B");
  apply_override(a, "top_k", "65");
  expect_error_mentions([&] { a.validate(); }, "top_k");
}

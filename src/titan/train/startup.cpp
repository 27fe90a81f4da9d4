#include "titan/train/startup.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/data/assets.h"
#include "titan/data/dataset.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/kernels/registry.h"
#include "titan/kernels/substitution.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/checkpoint.h"
#include "titan/train/log.h"
#include "titan/train/step_profile.h"
#include "titan/train/versions.h"

namespace titan::train {

namespace fs = std::filesystem;

namespace {

// " (set at job.toml:4)" (or " (set on the command line)") after a key an error names: the place
// to edit; "" for a key nobody set.
std::string placed(const JobConfig& c, const std::string& key) {
  const std::string set = c.where_set(key);
  return set.empty() ? set : " (" + set + ")";
}

}  // namespace

qwen3::ModelArgs resolve_model_args(const JobConfig& c) {
  qwen3::ModelArgs args;
  if (c.model.name == "hf") {
    fs::path cfg = fs::path(c.model.hf_assets_path) / "config.json";
    TITAN_CHECK(fs::is_directory(c.model.hf_assets_path), "model.hf_assets_path",
                placed(c, "model.hf_assets_path"), ": '", c.model.hf_assets_path,
                "' is not a directory (the model's folder: config.json, tokenizer.json and its weights)");
    TITAN_CHECK(fs::exists(cfg), "model.hf_assets_path", placed(c, "model.hf_assets_path"), ": '",
                c.model.hf_assets_path, "' has no config.json");
    args = qwen3::args_from_hf_config_file(cfg.string());
  } else {
    try {
      args = qwen3::flavor(c.model.flavor);
    } catch (const Error& e) {
      TITAN_FAIL("model.flavor: ", e.what());
    }
  }
  for (auto& [k, v] : c.model.overrides) qwen3::apply_override(args, k, v);
  // An expert setting on a dense model asks for something that cannot happen (num_experts itself
  // is what makes the model an MoE, and 0 says it is dense).
  if (!args.is_moe()) {
    for (auto& [k, v] : c.model.overrides)
      TITAN_CHECK(!qwen3::is_moe_field(k) || k == "num_experts", "model.", k, " = ", v,
                  placed(c, "model." + k),
                  " configures experts, but this model is dense (num_experts = 0): set model.num_experts, "
                  "or drop the key");
    // Set at all (the default is aux_loss): a dense model has no experts to balance, as its
    // model.* expert fields above say.
    TITAN_CHECK(!c.set_at.count("training.load_balance"), "training.load_balance = \"",
                c.training.load_balance, "\"", placed(c, "training.load_balance"),
                " balances experts, but this model is dense (num_experts = 0): drop the key");
    TITAN_CHECK(!c.set_at.count("training.load_balance_coeff"),
                "training.load_balance_coeff = ", c.training.load_balance_coeff,
                placed(c, "training.load_balance_coeff"),
                " is the expert-bias update step, but this model is dense (num_experts = 0): drop the key");
    TITAN_CHECK(c.parallelism.expert_parallel_degree == 1,
                "parallelism.expert_parallel_degree = ", c.parallelism.expert_parallel_degree,
                placed(c, "parallelism.expert_parallel_degree"),
                " splits experts over ranks, but this model is dense (num_experts = 0): set it to 1");
  } else {
    // Training an MoE with the aux loss means adding it, whatever the checkpoint's config says; an
    // explicit model.output_router_logits that says otherwise would be printed and not done.
    const bool add_aux = c.training.load_balance == "aux_loss";
    if (auto it = c.model.overrides.find("output_router_logits"); it != c.model.overrides.end())
      TITAN_CHECK(qwen3::field_text(args, "output_router_logits") == (add_aux ? "true" : "false"),
                  "model.output_router_logits = ", it->second, " contradicts training.load_balance = \"",
                  c.training.load_balance,
                  "\": titan adds the aux loss to the loss exactly when load_balance = "
                  "\"aux_loss\" (drop model.output_router_logits)");
    args.output_router_logits = add_aux;
    if (args.num_experts % c.parallelism.expert_parallel_degree != 0) {
      // Where each number came from: the key's place, else the model's source.
      auto where = [&](const std::string& key, const std::string& otherwise) {
        const std::string set = c.where_set(key);
        return set.empty() ? otherwise : set;
      };
      TITAN_FAIL("parallelism.expert_parallel_degree = ", c.parallelism.expert_parallel_degree, " (",
                 where("parallelism.expert_parallel_degree", "the default"),
                 ") must divide model.num_experts = ", args.num_experts, " (",
                 where("model.num_experts", c.model.name == "hf" ? "from model.hf_assets_path's config.json"
                                                                 : "model.flavor " + c.model.flavor + "'s"),
                 "): the experts are split into that many equal runs, one per rank of an expert group");
    }
  }
  try {
    args.validate();
  } catch (const Error& e) {
    // Name where the model came from and the [model] keys that changed it.
    std::string source =
        c.model.name == "hf" ? "model.hf_assets_path's config.json" : "model.flavor " + c.model.flavor;
    for (auto& [k, v] : c.model.overrides) source += ", model." + k + " = " + v;
    TITAN_FAIL("the model (", source, "): ", e.what());
  }
  return args;
}

Device resolve_device(const JobConfig& c) {
  if (c.job.device == "cpu") return Device::CPU;
  TITAN_CHECK(c.job.device == "cuda", "job.device = \"", c.job.device, "\" must be \"cpu\" or \"cuda\"");
  try {
    device_services(Device::CUDA);
  } catch (const Error& e) {
    TITAN_FAIL("job.device = \"cuda\": ", e.what());
  }
  return Device::CUDA;
}

DType resolve_compute_dtype(const JobConfig& c) {
  if (c.training.mixed_precision_param == "float32") return DType::F32;
  if (c.job.device == "cuda") return DType::BF16;  // tensor cores
  // bfloat16 means bf16 numerics on every CPU, so a run's losses do not depend on the machine it
  // lands on; without bf16 instructions the GEMMs widen their inputs to f32 (start_up_report says so).
  return DType::BF16;
}

void check_run_writes_outside(const JobConfig& c, const fs::path& data, const std::string& key) {
  std::error_code ec;
  if (!fs::is_directory(data, ec)) return;
  const fs::path dump = c.job.dump_folder;
  TITAN_CHECK(!io::lies_within(dump, data), key, ": the folder '", data.string(), "' holds job.dump_folder '",
              dump.string(),
              "': the run's own files (metrics.jsonl, checkpoints, exports) would become its data, ",
              "and a resume would find another dataset; keep the two folders apart");
}

namespace {

fs::path resolve_tokenizer(const JobConfig& c) {
  if (c.model.hf_assets_path.empty()) {
    fs::path p = data::default_tokenizer_path();
    TITAN_CHECK(fs::exists(p / "tokenizer.json"), "the default tokenizer '", p.string(),
                "' is missing (run scripts/setup.sh, or set model.hf_assets_path)");
    return p;
  }
  // A folder the user named must hold the tokenizer: silently falling back to the default one
  // would train on different token ids than the user's checkpoint expects.
  fs::path dir = c.model.hf_assets_path;
  TITAN_CHECK(fs::is_directory(dir), "model.hf_assets_path", placed(c, "model.hf_assets_path"), ": '",
              dir.string(), "' is not a directory");
  TITAN_CHECK(fs::exists(dir / "tokenizer.json"), "model.hf_assets_path", placed(c, "model.hf_assets_path"),
              ": '", dir.string(), "' has no tokenizer.json");
  return dir;
}

// The dataset as the config names it (a file, a folder of shards, a glob, or the built-in's file) and
// the files that stands for, listed here for the start-up line and the validator's overlap check (the
// loader lists `given` itself: its state records what it read).
struct DatasetPaths {
  std::vector<fs::path> given, files;
};

DatasetPaths resolve_dataset(const JobConfig& c) {
  if (!c.training.dataset_path.empty()) {
    check_run_writes_outside(c, c.training.dataset_path, "training.dataset_path");
    // Listing it now reports a missing path or an empty match before anything else is loaded.
    try {
      return {{c.training.dataset_path}, data::list_dataset_files({c.training.dataset_path})};
    } catch (const Error& e) {
      TITAN_FAIL("training.dataset_path", placed(c, "training.dataset_path"), ": ", e.what());
    }
  }
  // The built-in datasets are text: conversations come from the user's data.
  TITAN_CHECK(c.training.chat_field.empty(), "training.dataset = \"", c.training.dataset,
              "\" is text, but training.chat_field = \"", c.training.chat_field,
              "\" reads conversations: set training.dataset_path to a file (JSON, JSONL, Parquet, Arrow) or "
              "folder of them");
  try {
    const fs::path builtin = data::builtin_dataset_path(c.training.dataset);
    return {{builtin}, data::list_dataset_files({builtin})};
  } catch (const Error& e) {
    TITAN_FAIL("training.dataset: ", e.what());
  }
}

// An HF checkpoint folder must hold weights before anything is built from it.
void check_hf_weights_present(const fs::path& dir, const char* key) {
  TITAN_CHECK(fs::is_directory(dir), key, ": '", dir.string(), "' is not a directory");
  if (const std::string root = checkpoint_folder_given(dir); !root.empty() && !io::is_hf_checkpoint_dir(dir))
    TITAN_FAIL(key, ": ", root);
  // A committed titan checkpoint given where Hugging Face weights are read: say how to load it.
  const bool native = fs::exists(dir / "COMMITTED") && fs::exists(dir / "train_state.json");
  TITAN_CHECK(io::is_hf_checkpoint_dir(dir), key, ": '", dir.string(), "' has no ", io::kHfSingleFile, " or ",
              io::kHfIndexFile,
              !native ? ""
              : std::string(key) == "checkpoint.initial_load_path"
                  ? ": it is a titan checkpoint, which loads with checkpoint.initial_load_in_hf = false"
                  : ": it is a titan checkpoint, which loads as checkpoint.initial_load_path with "
                    "checkpoint.initial_load_in_hf = false");
}

// Weights trained under another architecture (rope_theta, norm eps, ...) load without a shape error
// and compute something else: the model config that came with them must agree with the run's
// model, except in the fields the run sets in [model] on purpose.
void check_initial_weights_model(const JobConfig& c, const qwen3::ModelArgs& run,
                                 const qwen3::ModelArgs& theirs, const fs::path& where,
                                 const std::string& source) {
  // Every field that differs, in one error: a fix of the first alone would only bring the next.
  std::string differs, keys;
  int count = 0;
  for (const std::string& key : qwen3::override_keys()) {
    if (c.model.overrides.count(key) || !qwen3::shapes_the_computation(key)) continue;
    const std::string a = qwen3::field_text(theirs, key), b = qwen3::field_text(run, key);
    if (a == b) continue;
    // Named as the file names it, and as [model] does where that differs.
    const std::string theirs_key = qwen3::hf_config_key(key);
    differs += (differs.empty() ? "" : "; ") + theirs_key + " = " + a + " there, " + b + " in this run" +
               (theirs_key == key ? "" : " (model." + key + ")");
    keys += (keys.empty() ? "model." : ", model.") + key;
    ++count;
  }
  TITAN_CHECK(differs.empty(), source, ": '", where.string(), "' describes another model than this run's (",
              c.model.name == "hf" ? "model.hf_assets_path's config.json" : "flavor " + c.model.flavor,
              "): ", differs,
              "; its weights would compute something else here (point the model at that config, or set ",
              keys, count > 1 ? " to choose the values)" : " to choose the value)");
}

}  // namespace

void resolve_initial_weights(const JobConfig& c, ResolvedJob& job, const std::string& source) {
  const auto& ck = c.checkpoint;
  if (!ck.initial_load_path.empty()) {
    TITAN_CHECK(fs::exists(ck.initial_load_path), source, ": '", ck.initial_load_path, "' does not exist");
    if (ck.initial_load_in_hf) {
      job.initial_hf = ck.initial_load_path;
    } else {
      if (const std::string root = checkpoint_folder_given(ck.initial_load_path); !root.empty())
        TITAN_FAIL(source, ": ", root);
      TITAN_CHECK(fs::exists(fs::path(ck.initial_load_path) / "COMMITTED"), source, ": '",
                  ck.initial_load_path, "' is not a committed titan checkpoint (no COMMITTED marker",
                  source == "checkpoint.initial_load_path"
                      ? "; for a Hugging Face folder set checkpoint.initial_load_in_hf = true)"
                      : ": a save cut short)");
      job.initial_native = ck.initial_load_path;
      const fs::path state = job.initial_native / "train_state.json";
      const nlohmann::json ts = io::read_json_file(state, source);
      TITAN_CHECK(ts.is_object() && ts.contains("model_config"), source, ": '", state.string(),
                  "' has no model_config");
      check_initial_weights_model(
          c, job.args, qwen3::args_from_hf_config(ts["model_config"], state.string() + " model_config"),
          state, source);
    }
  } else if (ck.initial_load_in_hf) {
    job.initial_hf = c.model.hf_assets_path;
  }
  if (job.initial_hf.empty()) return;
  const std::string key = ck.initial_load_path.empty() ? "model.hf_assets_path" : source;
  check_hf_weights_present(job.initial_hf, key.c_str());
  // The config.json beside the weights must describe the run's model: a flavor's, or another
  // folder's (weights without one are checked by their shapes when they load).
  const fs::path their_config = job.initial_hf / "config.json";
  if (fs::exists(their_config))
    check_initial_weights_model(c, job.args, qwen3::args_from_hf_config_file(their_config.string()),
                                their_config, key);
}

namespace {

// The variant each op runs by default for this compute dtype ("linear=onednn, attention=flash, ...").
// The variant each op runs with, after the installed rules: a rule over every module ("*", the
// last one wins) replaces the registry's default; rules over some modules are listed by
// install_substitutions, and the line says that they exist.
std::string kernel_line(Device device, DType dtype) {
  std::string line;
  for (const char* op : {"linear", "attention", "rms_norm", "rope", "swiglu", "embedding",
                         "linear_cross_entropy", "router_topk", "moe_experts", "adamw"}) {
    // The optimizer runs on the f32 master weights whatever the compute dtype.
    const DType op_dtype = op == std::string("adamw") ? DType::F32 : dtype;
    if (!kernels::has_kernel(op, Device::CPU, op_dtype, "reference")) continue;
    std::string variant = kernels::select_variant(op, device, op_dtype);
    bool some_modules = false;
    for (const kernels::Substitution& rule : kernels::substitutions()) {
      if (rule.op != op) continue;
      if (rule.modules == "*")
        variant = rule.variant, some_modules = false;
      else
        some_modules = true;
    }
    line += std::string(line.empty() ? "" : ", ") + op + "=" + variant +
            (some_modules ? " (some modules: the rules above)" : "");
  }
  return line;
}

}  // namespace

std::string check_kernels_for_planning(const JobConfig& c) {
  if (c.kernels.empty()) return "";
  TITAN_CHECK(c.job.device == "cpu" || c.job.device == "cuda", "job.device = \"", c.job.device,
              "\" must be \"cpu\" or \"cuda\"");
  const Device device = c.job.device == "cuda" ? Device::CUDA : Device::CPU;
  // The CUDA library registers its kernels when it loads, which it does on a machine without a GPU.
  if (device == Device::CUDA)
    if (const std::string why = load_device_backend(device); !why.empty())
      return "[kernels] not checked against cuda's kernels: " + why;
  kernels::plan_substitutions(
      c.kernels, qwen3::module_ops(resolve_model_args(c), c.parallelism.expert_parallel_degree > 1), device,
      resolve_compute_dtype(c), /*on_this_machine=*/false);
  return "";
}

namespace {

// Why a registered variant cannot run here ("" when it can).
std::string why_variant_cannot_run(const std::string& op, const std::string& variant, Device device,
                                   DType dtype) {
  if (!kernels::has_kernel(op, device, dtype, variant)) return "this build has no " + variant + " " + op;
  const kernels::KernelEntry& entry = kernels::find_kernel(op, device, dtype, variant);
  return entry.available ? entry.available() : "";
}

void install_substitutions(const JobConfig& c, const qwen3::ModelArgs& a, Device device, DType dtype) {
  std::vector<kernels::Substitution> rules = c.kernels;
  // The only kernels whose results depend on timing are the GPU's tensor-core attention backward
  // kernels (they add dq with float atomics): a deterministic bf16 run on the GPU takes the f32-math
  // attention instead, unless the config's own [kernels] rule (applied after this one) says otherwise.
  if (c.training.deterministic && device == Device::CUDA && dtype == DType::BF16) {
    rules.insert(rules.begin(), kernels::Substitution{"attention", "f32_math", "*"});
    say("training.deterministic: attention runs its f32_math variant on cuda (the tensor-core backward adds dq "
        "with float atomics, whose order varies)");
  } else if (device == Device::CUDA && dtype == DType::BF16) {
    // On the H200 cuDNN's fused attention ran 7.6x titan's WMMA kernels (forward 468 vs 61 TFLOP/s
    // for mma_sync, 45 for WMMA; backward 331 vs 47 and 31; Qwen3-0.6B at 8 x 2048: 75.9k vs 29.1k
    // tokens/s; docs/kernels.md), so a causal bf16 job takes it unless a [kernels] rule (applied after
    // this one) says otherwise. Block-causal attention calls the kernel once per document, for which
    // cuDNN would build a plan per length: it takes titan's mma_sync kernels, the faster of its own.
    const bool causal = c.model.attn_mask_type == "causal";
    const char* variant = causal ? "cudnn" : "mma_sync";
    if (const std::string why_not = why_variant_cannot_run("attention", variant, device, dtype);
        why_not.empty()) {
      rules.insert(rules.begin(), kernels::Substitution{"attention", variant, "*"});
      say("attention: %s on cuda; a [kernels] attention rule picks another",
          causal ? "cuDNN's fused flash attention (the cudnn variant)" : "titan's mma_sync flash attention");
    } else {
      say("attention: titan's WMMA kernels on cuda, not the %s variant: %s", variant, why_not.c_str());
    }
  }
  // The MoE experts' grouped GEMMs on raw mma.sync ran 1.8x (forward) and 1.5x (backward) the WMMA
  // ones at the MoE job's shapes on the H200 (138 and 113 TFLOP/s; cuDNN's grouped matmul 75 and
  // 86), with the same results (docs/kernels.md).
  if (device == Device::CUDA && dtype == DType::BF16 && a.is_moe()) {
    if (const std::string why_not = why_variant_cannot_run("moe_experts", "mma_sync", device, dtype);
        why_not.empty()) {
      rules.insert(rules.begin(), kernels::Substitution{"moe_experts", "mma_sync", "*"});
      say("moe_experts: the mma_sync grouped GEMMs on cuda; a [kernels] moe_experts rule picks another");
    } else {
      say("moe_experts: the WMMA grouped GEMMs on cuda, not mma_sync: %s", why_not.c_str());
    }
  }
  // Everything is checked before anything is logged or installed.
  if (!rules.empty())
    for (auto& line : kernels::plan_substitutions(
             rules, qwen3::module_ops(a, c.parallelism.expert_parallel_degree > 1), device, dtype))
      say("%s", line.c_str());
  // Installed even when empty: the rules are the process's, and an earlier run in this process (a
  // test program's, `titan check`'s) must not leave its own behind.
  kernels::set_substitutions(rules);
}

}  // namespace

DType resolve_reduce_dtype(const JobConfig& c, int64_t dp_shard) {
  return c.training.mixed_precision_reduce == "bfloat16" && dp_shard > 1 ? DType::BF16 : DType::F32;
}

std::string reduce_dtype_note(const JobConfig& c, const dist::ParallelPlan& plan) {
  // torchtitan's reduce dtype is FSDP's: whole blocks (DDP, one process) reduce in f32 whatever it says.
  if (c.training.mixed_precision_reduce == "float32" ||
      resolve_reduce_dtype(c, plan.dp_shard()) != DType::F32)
    return "";
  return "training.mixed_precision_reduce = " + c.training.mixed_precision_reduce +
         ": no effect, only sharded blocks (parallelism.data_parallel_shard_degree > 1) reduce their "
         "gradients in "
         "it, as in torchtitan; this job (" +
         plan.describe() + ") reduces in float32";
}

int64_t accumulation_steps(const JobConfig& c, int64_t dp_size) {
  return c.training.global_batch_size == -1 ? 1 : c.training.global_batch_size / (c.training.local_batch_size * dp_size);
}

ResolvedJob resolve_job(const JobConfig& c, const dist::ParallelPlan& plan) {
  ResolvedJob job;
  job.args = resolve_model_args(c);
  job.device = resolve_device(c);
  job.compute_dtype = resolve_compute_dtype(c);
  job.reduce_dtype = resolve_reduce_dtype(c, plan.dp_shard());
  job.bf16_activation_grads = c.training.activation_grad_dtype == "bfloat16";
  TITAN_CHECK(!job.bf16_activation_grads || job.compute_dtype == DType::BF16,
              "training.activation_grad_dtype = \"bfloat16\" needs bf16 activations, but "
              "training.mixed_precision_param = \"",
              c.training.mixed_precision_param, "\" computes in f32: set one of them to the other's dtype");
  job.tokenizer_path = resolve_tokenizer(c);
  DatasetPaths dataset = resolve_dataset(c);
  job.dataset = std::move(dataset.given);
  job.dataset_files = std::move(dataset.files);
  job.local_batch_size = c.training.local_batch_size;
  job.seq_len = c.training.seq_len;
  job.accumulation_steps = accumulation_steps(c, plan.dp_size());
  return job;
}

int64_t best_fit_window(const TrainingSection& training) {
  return training.pack_strategy == "best_fit" ? training.pack_window : 0;
}

int32_t document_separator(const TrainingSection& training, const data::Tokenizer& tokenizer) {
  const std::string& want = training.document_separator;
  if (want.empty()) return tokenizer.document_separator_id();
  if (want == "eos_token") {
    TITAN_CHECK(tokenizer.eos_id() >= 0, "training.document_separator = \"eos_token\": ",
                tokenizer.config_path().empty()
                    ? std::string("the tokenizer has no tokenizer_config.json beside its tokenizer.json")
                    : tokenizer.config_path().string() + " names no eos_token",
                "; name the token itself (e.g. \"<|endoftext|>\")");
    return tokenizer.eos_id();
  }
  // Text that encodes to exactly one token: a special token ("<|im_end|>") or ordinary text ("\n").
  // (Not a lookup of tokenizer.json's keys: those are byte-level spellings, "é" there is one byte.)
  const std::vector<int32_t> ids = tokenizer.encode(want);
  std::string shown = nlohmann::json(want).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (shown.size() > 80) shown = shown.substr(0, 60) + "...\" (" + std::to_string(want.size()) + " bytes)";
  TITAN_CHECK(
      ids.size() == 1, "training.document_separator = ", shown, " is ", ids.size(),
      " tokens of the run's tokenizer, not one; name a single token (\"<|endoftext|>\", \"<|im_end|>\"), "
      "\"eos_token\" (the tokenizer config's), or \"\" (<|endoftext|> when the vocabulary has it)");
  return ids[0];
}

std::string document_description(const JobConfig& c, const data::Tokenizer& tokenizer,
                                 const std::vector<fs::path>& files) {
  if (!c.training.chat_field.empty())
    return "conversations from field '" + c.training.chat_field + "' in Qwen3's chat template, " +
           (!c.training.pack_conversations
                ? std::string("one per row (cut at seq_len + 1 tokens, padded after)")
                : "packed whole into rows (" +
                      (best_fit_window(c.training) > 0
                           ? "best-fit decreasing over each " + std::to_string(c.training.pack_window) +
                                 " conversations; "
                           : std::string("next-fit in dataset order; ")) +
                      "attention within each, block_causal; one longer than a row alone, cut at seq_len + 1 "
                      "tokens; padded after the last that fits)") +
           ", the loss on the assistant turns only";
  const int32_t separator = document_separator(c.training, tokenizer);
  std::string text = "documents end with token " + std::to_string(separator) + " " +
                     nlohmann::json(tokenizer.decode(std::vector<int32_t>{separator}))
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const bool plain =
      std::any_of(files.begin(), files.end(), [](const fs::path& f) { return data::is_plain_text(f); });
  const bool records =
      std::any_of(files.begin(), files.end(), [](const fs::path& f) { return !data::is_plain_text(f); });
  if (plain)
    text += c.training.text_split == "file"   ? ", plain text: one document per file"
            : c.training.text_split == "line" ? ", plain text: one document per line"
                                              : ", plain text: one document per paragraph";
  else if (c.set_at.count("training.text_split"))  // set, and nothing it applies to: said, not silent
    text += ", training.text_split = \"" + c.training.text_split +
            "\" does not apply to these files (no plain-text file: each record is a document)";
  if (records)
    text +=
        ", records' text from field '" + c.training.text_field + "' (or the record, where it is a string)";
  else if (c.set_at.count("training.text_field"))
    text += ", training.text_field = \"" + c.training.text_field +
            "\" does not apply to the training files (plain text only: no record has fields)";
  if (c.model.attn_mask_type == "block_causal") text += ", attention within each document (block_causal)";
  return text;
}

std::string describe_dataset_path(const fs::path& given, size_t files, bool name_passed_over) {
  if (files == 1 && fs::is_regular_file(given)) return given.string();
  // Never a reason to stop: the listing that counted `files` read these folders already.
  std::vector<fs::path> others;
  if (name_passed_over) try {
      others = data::files_passed_over({given});
    } catch (const Error&) {
    }
  // Names relative to the folder given, or to a glob's folder (its components before the first
  // pattern character).
  fs::path base;
  if (fs::is_directory(given)) {
    base = given;
  } else {
    for (const fs::path& part : given.parent_path()) {
      if (part.string().find_first_of("*?[") != std::string::npos) break;
      base /= part;
    }
  }
  std::string passed;
  for (size_t i = 0; i < others.size() && i < 3; ++i)
    passed += (i ? ", " : "") + others[i].lexically_relative(base).string();
  if (others.size() > 3) passed += ", ...";
  return given.string() + " (" + counted(int64_t(files), "file") +
         (others.empty()
              ? ""
              : "; " + counted(int64_t(others.size()), "file") + " of other types passed over: " + passed) +
         ")";
}

std::string cpu_oversubscription_note(int ranks_on_host, int cores_per_rank, int host_cores) {
  if (int64_t(ranks_on_host) * cores_per_rank <= host_cores) return "";
  const char* cores = cores_per_rank == 1 ? "core" : "cores";
  return formatted(
      "%d ranks x %d %s each share this host's %d physical cores: a rank gets about %.0f%% of the %d %s its "
      "MFU peak counts, so its MFU and tokens/s read low by as much (fewer ranks, or OMP_NUM_THREADS, per "
      "host measure the hardware)",
      ranks_on_host, cores_per_rank, cores, host_cores,
      100.0 * double(host_cores) / (double(ranks_on_host) * cores_per_rank), cores_per_rank, cores);
}

std::string data_line_for_planning(const JobConfig& c) {
  // A path missing here may be the cluster's the job is planned for: said, not refused. One that
  // exists here is checked as train checks it (a .csv file passing the plan would fail the job).
  const auto here = [](const std::string& path) { return !path.empty() && fs::exists(path); };
  fs::path tokenizer_path;
  DatasetPaths dataset;
  try {
    tokenizer_path = resolve_tokenizer(c);
    dataset = resolve_dataset(c);
  } catch (const Error& e) {
    if (here(c.model.hf_assets_path) || here(c.training.dataset_path)) throw;
    return std::string("not checked on this machine: ") + e.what();
  }
  const data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  return dataset.given[0].string() + ", tokenizer " + tokenizer_path.string() + ", " +
         document_description(c, tokenizer, dataset.files);
}

data::Tokenizer load_tokenizer(const JobConfig& c, const ResolvedJob& job) {
  data::Tokenizer tokenizer = data::Tokenizer::load(job.tokenizer_path);
  const std::string vocab_source = c.model.overrides.count("vocab_size") ? "model.vocab_size"
                                   : c.model.name == "hf" ? "model.hf_assets_path's config.json"
                                                          : "flavor " + c.model.flavor;
  TITAN_CHECK(tokenizer.vocab_size() <= job.args.vocab_size, "tokenizer '", job.tokenizer_path.string(),
              "' (", c.model.hf_assets_path.empty() ? "the default tokenizer" : "model.hf_assets_path",
              ") has ", tokenizer.vocab_size(), " ids but the model's vocab_size is ", job.args.vocab_size,
              " (", vocab_source,
              "): an id past the vocabulary has no embedding row; use the model's own tokenizer, or a "
              "model with vocab_size >= ",
              tokenizer.vocab_size(), " (model.vocab_size)");
  return tokenizer;
}

void start_up_report(const JobConfig& c, const ResolvedJob& job, const dist::ParallelPlan& plan,
                     const data::Tokenizer& tokenizer, const char* command) {
  const auto& a = job.args;
  if (c.job.description.empty())
    say("%s", command);
  else
    say("%s: %s", command, c.job.description.c_str());
  say("versions:\n%s", versions_text(collect_versions(), "  ").c_str());
  say("model: route %s, %s, %s parameters (%s active per token), %s compute, vocab %ld",
      c.model.name == "hf" ? "hf" : "native",
      c.model.name == "hf" ? c.model.hf_assets_path.c_str() : c.model.flavor.c_str(),
      std::to_string(a.num_params()).c_str(), std::to_string(a.num_active_params()).c_str(),
      std::string(dtype_name(job.compute_dtype)).c_str(), long(a.vocab_size));
  if (a.pad_token_id >= 0)
    say("model: pad_token_id %ld is the embedding's padding_idx, as in transformers: its row gets no "
        "gradient from the lookup%s and starts at zero under random init",
        long(a.pad_token_id), a.tie_embeddings ? " (the tied lm_head still gives it one)" : "");
  // Where bf16 GEMMs widen their inputs to f32, bf16 compute saves activation memory, not GEMM time:
  // on debugmodel it ran about 20% slower than float32 on an AVX2-only AMD Zen3, and as fast
  // (252 against 245 tokens/s) on an Intel Xeon with AVX512-BF16 but no AMX.
  if (job.device == Device::CPU && job.compute_dtype == DType::BF16)
    if (const std::string why = cpu::gemm_bf16_widen_reason(); !why.empty())
      say("mixed precision: bf16 GEMMs run as f32 GEMMs on widened inputs (%s), so bf16 saves "
          "activation memory, not GEMM time (training.mixed_precision_param = \"float32\" may run as fast "
          "or faster)",
          why.c_str());
  if (const qwen3::Checkpointing ac = checkpointing_of(c.activation_checkpoint); ac.any()) {
    int64_t covered = 0;
    for (int64_t i = 0; i < a.n_layers; ++i) covered += ac.covers(i);
    say("activation checkpointing: %s: %ld of %ld layers recompute their forward in backward%s",
        ac.describe().c_str(), long(covered), long(a.n_layers),
        covered == 0 ? " (selective_ac_option exceeds the layer count: nothing is saved)" : "");
  }
  // Collective: every rank calls the report, the logging rank prints it.
  const std::vector<std::string> hosts = plan.host_names();
  std::string host_list;
  for (size_t r = 0; r < hosts.size(); ++r)
    if (r == 0 || hosts[r] != hosts[r - 1]) host_list += (host_list.empty() ? "" : ", ") + hosts[r];
  say("ranks: %s, threads per rank: %d, hosts: %s", plan.describe().c_str(), omp_get_max_threads(),
      host_list.c_str());
  if (job.device == Device::CPU && plan.world_size() > 1) {
    const int here = int(std::count(hosts.begin(), hosts.end(), hosts[size_t(plan.rank())]));
    const cpu::CpuInfo& info = cpu::cpu_info();
    // Counted against this process's CPU quota where one caps the host: ranks of one pod share it.
    const bool quota_caps = info.cpu_quota > 0 && info.host_cores == int(std::ceil(info.cpu_quota));
    if (const std::string note = cpu_oversubscription_note(here, info.cores, info.host_cores); !note.empty())
      say("ranks: %s%s", note.c_str(),
          quota_caps ? (" (the host's cores counted are its cgroup's CPU quota, " + info.cpu_quota_file + ")")
                           .c_str()
                     : "");
  }
  say("communication: %s", plan.world().library().c_str());
  // titan eval has no step to stop at and reads its own data (its eval line names it).
  const bool trains = std::string_view(command) == "titan train";
  if (plan.world_size() > 1 && trains)
    if (const std::optional<int> mpirun = dist::open_mpi_launcher_pid())
      say("stopping: `kill -USR1 %d` (mpirun forwards SIGUSR1 to every rank) stops the job at its next step "
          "with a checkpoint; a Ctrl-C or SIGTERM to mpirun reaches the ranks as SIGTERM and then SIGKILL 1 "
          "s "
          "later (Open MPI's odls_base_sigkill_timeout), before most saves end",
          *mpirun);
  say("device: %s", job.device == Device::CPU ? cpu::cpu_info().summary().c_str()
                                              : device_services(job.device).description().c_str());
  // OpenMP starts a thread per core it sees; a cgroup's CPU quota (a Kubernetes CPU limit) lets fewer
  // run at once, and the rest wait at every parallel loop's barrier.
  if (job.device == Device::CPU && cpu::cpu_info().cpu_quota > 0 &&
      omp_get_max_threads() > int(std::ceil(cpu::cpu_info().cpu_quota)))
    say("warning: OpenMP runs %d threads, but the cgroup's CPU quota allows %.3g CPUs (%s): threads past it "
        "wait for CPU time at every parallel loop; set OMP_NUM_THREADS=%d",
        omp_get_max_threads(), cpu::cpu_info().cpu_quota, cpu::cpu_info().cpu_quota_file.c_str(),
        std::max(1, int(std::floor(cpu::cpu_info().cpu_quota))));
  if (trains) {
    const std::string dataset =
        describe_dataset_path(job.dataset[0], job.dataset_files.size(), console_output());
    say("data: %s, tokenizer %s, %s, batch %ld x seq %ld, "
        "gradient accumulation %ld, global batch %ld (local x data-parallel ranks x accumulation)",
        dataset.c_str(), job.tokenizer_path.string().c_str(),
        document_description(c, tokenizer, job.dataset_files).c_str(), long(job.local_batch_size),
        long(job.seq_len), long(job.accumulation_steps),
        long(job.local_batch_size * plan.dp_size() * job.accumulation_steps));
  } else {
    say("tokenizer: %s", job.tokenizer_path.string().c_str());
  }
  install_substitutions(c, a, job.device, job.compute_dtype);
  say("kernels: %s", kernel_line(job.device, job.compute_dtype).c_str());
  if (job.bf16_activation_grads)
    say("training.activation_grad_dtype = \"bfloat16\": the gradients of bf16 activations are bf16 (rounded "
        "where "
        "an op writes them, summed in bf16), parameters' gradients f32%s",
        job.device == Device::CPU
            ? "; the CPU kernels compute them in f32 and the ops round them: this saves "
              "memory, and costs a conversion each way"
            : "");
  // Which GEMM code runs (the backend, OpenBLAS's core, oneDNN's ISA): TITAN_GEMM_F32,
  // OPENBLAS_CORETYPE and ONEDNN_MAX_CPU_ISA change it without changing anything above.
  if (job.device == Device::CPU) {
    say("gemm: %s", cpu::gemm_describe().c_str());
    if (cpu::kernel_isa() < cpu::cpu_kernel_isa())
      say("kernels: the hand-vectorised kernels run their %s code (TITAN_KERNEL_ISA); this CPU runs %s",
          cpu::kernel_isa_name(cpu::kernel_isa()), cpu::kernel_isa_name(cpu::cpu_kernel_isa()));
  }
  say("config in effect:\n%s", c.describe().c_str());
  for (const auto& note : c.notes) say("config: %s", note.c_str());
  if (const std::string note = reduce_dtype_note(c, plan); !note.empty()) say("config: %s", note.c_str());
}

}  // namespace titan::train

// titan info: parameters, FLOPs per token and a training memory estimate for a flavor or a checkpoint.
#include <cstdio>
#include <filesystem>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/models/qwen3/estimate.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"
#include "titan/train/step_profile.h"

namespace titan::cli {
namespace {

// titan info --config X.toml [--k=v]: the job's training step run on the meta device.
int info_for_job(int argc, char** argv) {
  const JobArgs job = parse_job_args("info", argc, argv);
  // The other form's options would read as config keys ("unknown config key 'flavor'").
  for (const auto& [key, value] : job.overrides)
    TITAN_CHECK(key != "flavor" && key != "model-path" && key != "batch" && key != "seq" && key != "dtype" &&
                    key != "activation-checkpoint",
                "titan info: --", key,
                " belongs to `titan info --flavor | --model-path`; with --config, change "
                "the job's keys instead (--model.flavor=..., --training.local_batch_size=..., ...)");
  if (job.help) {
    std::printf("usage: titan info --config FILE.toml [--section.key=value ...]\n"
                "Runs one training step of the job on the meta device (shapes and byte counts, no\n"
                "data) and prints the exact memory per process by category and the FLOPs of a step.\n");
    return 0;
  }
  const train::JobConfig cfg = train::load_job_config(job.config, job.overrides);
  const auto [a, shape] = train::planned_step(cfg, 1, 1);  // one process: `titan plan` takes a mesh
  const train::StepProfile p = train::profile_training_step(a, shape, Device::Meta);

  std::printf("job: %s (%s, %s parameters)\n", job.config.c_str(), a.is_moe() ? "Qwen3-MoE" : "Qwen3 dense",
              std::to_string(a.num_params()).c_str());
  std::printf("data: %s\n", error_for_the_user(train::data_line_for_planning(cfg)).c_str());
  for (const auto& note : cfg.notes) std::printf("config: %s\n", note.c_str());  // as titan train says them
  std::printf(
      "one training step on the meta device (%.0f ms): batch %ld x seq %ld, %s compute, activation "
      "checkpointing %s, one process\n",
      p.seconds * 1e3, long(shape.local_batch), long(shape.seq_len),
      std::string(dtype_name(shape.compute)).c_str(), shape.checkpointing.describe().c_str());
  std::printf("  weights (f32)        %s\n  gradients (f32)      %s\n  AdamW state (f32)    %s\n", gib(p.weights).c_str(),
              gib(p.grads).c_str(), gib(p.optimizer).c_str());
  if (p.other) std::printf("  other state          %s\n", gib(p.other).c_str());
  std::printf("  activations + temps  %s\n  peak per process     %s\n", gib(p.activations()).c_str(),
              gib(p.peak).c_str());
  std::printf(
      "FLOPs per step: %.4g (%.4g per token, causal attention counted for the scores computed; titan "
      "train's MFU counts torchtitan's 6 x active matmul parameters + 12 x layers x heads x head_dim x "
      "seq: %.4g per token)\n",
      p.flops, p.flops / double(shape.local_batch * shape.seq_len), a.flops_per_token(shape.seq_len));
  return 0;
}

int info_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--config", 0) == 0) return info_for_job(argc, argv);
  ArgParser p("info", "Parameters, FLOPs per token and training memory of a Qwen3 model (or, with --config "
                      "FILE.toml [--k=v], the job's exact memory per process from a meta-device step).");
  // --config is taken above (info_for_job); listed here so that --help shows both forms.
  p.option("config",
           "a job config FILE.toml (then --section.key=value overrides): the job's memory per process; "
           "the options below do not apply")
      .option("flavor", "native flavor (debugmodel, 0.6B, 30B-A3B, ...)")
      .option("model-path", "Hugging Face checkpoint directory or config.json")
      .option("batch", "local batch size for the activation estimate", "1")
      .option("seq", "sequence length", "2048")
      .option("dtype", "compute dtype: float32 | bfloat16", "bfloat16")
      .option("activation-checkpoint", "none | selective | full", "none");
  if (!p.parse(argc, argv)) return 0;
  TITAN_CHECK(p.has("flavor") != p.has("model-path"), "titan info: give exactly one of --flavor or --model-path");
  qwen3::ModelArgs a;
  std::string source;
  if (p.has("flavor")) {
    a = qwen3::flavor(p.get("flavor"));
    source = "flavor " + p.get("flavor");
  } else {
    std::filesystem::path path = p.get("model-path");
    if (std::filesystem::is_directory(path)) path /= "config.json";
    a = qwen3::args_from_hf_config_file(path.string());
    source = path.string();
  }
  const int64_t batch = p.get_int("batch", 1), seq = p.get_int("seq", 1);
  const std::string ac = p.get("activation-checkpoint");
  TITAN_CHECK(ac == "none" || ac == "selective" || ac == "full", "--activation-checkpoint must be none, selective or full");
  const qwen3::Checkpointing checkpointing = train::checkpointing_of({.mode = ac});
  const std::string dtype_text = p.get("dtype");
  TITAN_CHECK(
      dtype_text == "float32" || dtype_text == "f32" || dtype_text == "bfloat16" || dtype_text == "bf16",
      "titan info: --dtype ", dtype_text, ": training computes in float32 or bfloat16",
      suggestion(dtype_text, {"float32", "bfloat16"}));
  const DType dtype = dtype_from_name(dtype_text);
  auto m = qwen3::estimate_training_memory(a, batch, seq, dtype, checkpointing);

  std::printf("model: %s (%s)\n", source.c_str(), a.is_moe() ? "Qwen3-MoE" : "Qwen3 dense");
  std::printf("  dim %ld, layers %ld, heads %ld/%ld, head_dim %ld, vocab %ld, tied %s\n", a.dim, a.n_layers, a.n_heads,
              a.n_kv_heads, a.head_dim, a.vocab_size, a.tie_embeddings ? "yes" : "no");
  if (a.is_moe())
    std::printf("  experts %ld, top_k %ld, expert hidden %ld\n", a.num_experts, a.top_k, a.moe_hidden_dim);
  else
    std::printf("  mlp hidden %ld\n", a.hidden_dim);
  std::printf("parameters: %ld total, %ld active per token\n", a.num_params(), a.num_active_params());
  std::printf("FLOPs per token at seq %ld: %.4g\n", seq, a.flops_per_token(seq));
  std::printf("  = 6 * (active matmul parameters, lm_head counted, embedding lookup not) + 12 * layers * heads * "
              "head_dim * seq\n");
  std::printf("training memory at batch %ld x seq %ld, %s compute, activation checkpointing %s:\n", batch,
              seq, std::string(dtype_name(dtype)).c_str(), checkpointing.describe().c_str());
  std::printf("  weights (f32)     %s\n  gradients (f32)   %s\n  AdamW state (f32) %s\n  activations       %s\n"
              "  total             %s\n",
              gib(m.weights).c_str(), gib(m.grads).c_str(), gib(m.optimizer).c_str(), gib(m.activations).c_str(),
              gib(m.total()).c_str());
  // The closed form counts what backward keeps, not the step's temporaries: the exact peak comes
  // from a step on the meta device (titan info --config / titan plan), 18-59% above it (docs/devices.md).
  std::printf(
      "  (a closed form: the tensors saved for backward, not the step's temporaries; --config or titan plan "
      "give the step's exact peak, 18-59%% above it on the models measured)\n");
  return 0;
}

TITAN_COMMAND("info", "parameters, FLOPs per token and training memory of a model", info_main);

}  // namespace
}  // namespace titan::cli

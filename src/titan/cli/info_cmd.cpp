// titan info: parameters, FLOPs per token and the memory of a training step (run on the meta device)
// for a flavor, a checkpoint or a job config.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/suggest.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"
#include "titan/train/step_profile.h"

namespace titan::cli {
namespace {

// The step's memory by category and its FLOPs, as both forms of `titan info` print them.
void print_step(const train::StepProfile& p, const train::StepShape& shape, const qwen3::ModelArgs& a,
                const char* device) {
  std::printf(
      "one training step on the meta device (%.0f ms): batch %ld x seq %ld%s, %s compute, activation "
      "checkpointing %s, one process on %s\n",
      p.seconds * 1e3, long(shape.local_batch), long(shape.seq_len),
      shape.grad_accumulation > 1
          ? (" x " + std::to_string(shape.grad_accumulation) + " micro-batches").c_str()
          : "",
      std::string(dtype_name(shape.compute)).c_str(), shape.checkpointing.describe().c_str(), device);
  std::printf("  weights (f32)        %s\n  gradients (f32)      %s\n  AdamW state (f32)    %s\n",
              memory_text(p.weights).c_str(), memory_text(p.grads).c_str(), memory_text(p.optimizer).c_str());
  std::printf("%s", compute_weights_line(p).c_str());
  if (p.other) std::printf("  other state          %s\n", memory_text(p.other).c_str());
  std::printf("  activations + temps  %s\n  peak per process     %s\n", memory_text(p.activations()).c_str(),
              memory_text(p.peak).c_str());
  std::printf("%s", after_step_peak_line(p, shape).c_str());
  if (p.checkpoint_copy)
    std::printf(
        "  checkpoint copy      %s (checkpoint.async_mode: what saves in the background write from, "
        "beside the peak)\n",
        memory_text(p.checkpoint_copy).c_str());
  // The step's allocations replayed through the caching allocator every device uses (segments,
  // splitting): what the device would hold from the system, which is what decides whether a job fits.
  std::printf("  reserved             %s (the caching allocator's segments after the step)\n",
              memory_text(std::max(p.reserved, p.peak)).c_str());
  std::printf(
      "FLOPs per step: %.4g (%.4g per token, causal attention counted for the scores computed; titan "
      "train's MFU counts torchtitan's 6 x active matmul parameters + 12 x layers x heads x head_dim x "
      "seq: %.4g per token)\n",
      p.flops, p.flops / double(shape.local_batch * shape.seq_len * shape.grad_accumulation),
      a.flops_per_token(shape.seq_len));
}

// titan info --config X.toml [--k=v]: the job's training step run on the meta device.
int info_for_job(int argc, char** argv) {
  // The other form's options would read as unknown options of this one: named as what they are.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    const std::string key = arg.substr(2, arg.find('=') - 2);  // (npos - 2: to the end)
    TITAN_CHECK(key != "flavor" && key != "model-path" && key != "batch" && key != "seq" && key != "dtype" &&
                    key != "activation-checkpoint" && key != "device",
                "titan info: --", key,
                " belongs to `titan info --flavor | --model-path`; with --config, change "
                "the job's keys instead (--model.flavor=..., --training.local_batch_size=..., ...)");
  }
  const JobArgs job = parse_job_args("info", argc, argv);
  if (job.help) {
    std::printf("usage: titan info --config FILE.toml [--section.key=value ...]\n"
                "Runs one training step of the job on the meta device (shapes and byte counts, no\n"
                "data) and prints the exact memory per process by category and the FLOPs of a step.\n");
    return 0;
  }
  const train::JobConfig cfg = train::load_job_config(job.config, job.overrides);
  // The checks train makes across keys (warmup against steps, ...): a job train refuses is no job.
  // They are made on the smallest mesh the config allows (where its shard degree is -1, "the ranks
  // left": as many as expert parallelism needs), though the step below is one process's.
  const int64_t shard = cfg.parallelism.data_parallel_shard_degree;
  cfg.validate(int(cfg.parallelism.data_parallel_replicate_degree *
                   (shard == -1 ? cfg.parallelism.expert_parallel_degree : shard)));
  // One process (its experts whole): `titan plan` takes a mesh.
  const auto [a, shape] = train::planned_step(cfg, 1, 1);
  const std::string kernels_note = train::check_kernels_for_planning(cfg);  // a rule train refuses fails here
  const train::StepProfile p = train::profile_training_step(a, shape, Device::Meta);

  std::printf("job: %s (%s, %s parameters)\n", job.config.c_str(), a.is_moe() ? "Qwen3-MoE" : "Qwen3 dense",
              std::to_string(a.num_params()).c_str());
  std::printf("data: %s\n", error_for_the_user(train::data_line_for_planning(cfg)).c_str());
  for (const auto& note : cfg.notes) std::printf("config: %s\n", note.c_str());  // as titan train says them
  if (const std::string note = cfg.left_out_note(false); !note.empty())          // (a fresh run's)
    std::printf("config: %s\n", note.c_str());
  if (!kernels_note.empty()) std::printf("config: %s\n", kernels_note.c_str());
  print_step(p, shape, a, cfg.job.device.c_str());
  // The job's [parallelism] names ranks the step above is not one of: say where a rank's figures are.
  if (cfg.parallelism.data_parallel_replicate_degree != 1 || (shard != 1 && shard != -1) ||
      cfg.parallelism.expert_parallel_degree != 1)
    std::printf(
        "note: [parallelism] is not applied here (the step is one process's, its experts whole); "
        "`titan plan --config %s` gives one rank's memory on the job's mesh\n",
        job.config.c_str());
  return 0;
}

int info_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--config", 0) == 0) return info_for_job(argc, argv);
  ArgParser p("info",
              "Parameters, FLOPs per token and the memory of one training step of a Qwen3 model, run on "
              "the meta device (or, with --config FILE.toml [--k=v], the job's step).");
  // --config is taken above (info_for_job); listed here so that --help shows both forms.
  p.option("config",
           "a job config FILE.toml (then --section.key=value overrides): the job's memory per process; "
           "the options below do not apply")
      .option("flavor", "native flavor (debugmodel, 0.6B, 30B-A3B, ...)")
      .option("model-path", "Hugging Face checkpoint directory or config.json")
      .option("batch", "local batch size of the step", "1")
      .option("seq", "sequence length (default: 2048, or the model's max_seq_len when that is less)")
      .option("dtype", "compute dtype: float32 | bfloat16", "bfloat16")
      .option("activation-checkpoint", "none | selective | full", "none")
      .option("device", "cpu | cuda: the device whose loss-logits budget the step uses (GPU: 8 GiB)", "cpu");
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
    TITAN_CHECK(path.extension() == ".json", "titan info: --model-path '", p.get("model-path"),
                "' is neither a checkpoint folder nor its config.json");
    a = qwen3::args_from_hf_config_file(path.string());
    source = path.string();
  }
  train::StepShape shape;
  shape.local_batch = p.get_int("batch", 1);
  // The default fits every model: a small one's max_seq_len (a test checkpoint's 512) is no error.
  shape.seq_len = p.has("seq") ? p.get_int("seq", 1) : std::min<int64_t>(2048, a.max_seq_len);
  train::check_step_bounds(a, shape, "--batch", "--seq");
  const std::string ac = p.get("activation-checkpoint");
  TITAN_CHECK(ac == "none" || ac == "selective" || ac == "full", "titan info: --activation-checkpoint ", ac,
              ": expected none, selective or full", suggestion(ac, {"none", "selective", "full"}));
  shape.checkpointing = train::checkpointing_of({.mode = ac});
  const std::string dtype_text = p.get("dtype");
  TITAN_CHECK(
      dtype_text == "float32" || dtype_text == "f32" || dtype_text == "bfloat16" || dtype_text == "bf16",
      "titan info: --dtype ", dtype_text, ": training computes in float32 or bfloat16",
      suggestion(dtype_text, {"float32", "bfloat16"}));
  shape.compute = dtype_from_name(dtype_text);
  const std::string device = p.get("device");
  TITAN_CHECK(device == "cpu" || device == "cuda", "titan info: --device ", device, ": expected cpu or cuda",
              device_suggestion(device));
  shape.device = device == "cuda" ? Device::CUDA : Device::CPU;
  shape.keep_logits_bytes = train::loss_logits_budget(shape.device);

  std::printf("model: %s (%s)\n", source.c_str(), a.is_moe() ? "Qwen3-MoE" : "Qwen3 dense");
  std::printf("  dim %ld, layers %ld, heads %ld/%ld, head_dim %ld, vocab %ld, tied %s\n", a.dim, a.n_layers, a.n_heads,
              a.n_kv_heads, a.head_dim, a.vocab_size, a.tie_embeddings ? "yes" : "no");
  if (a.is_moe())
    std::printf("  experts %ld, top_k %ld, expert hidden %ld\n", a.num_experts, a.top_k, a.moe_hidden_dim);
  else
    std::printf("  mlp hidden %ld\n", a.hidden_dim);
  std::printf("parameters: %ld total, %ld active per token\n", a.num_params(), a.num_active_params());
  std::printf("FLOPs per token at seq %ld: %.4g\n", long(shape.seq_len), a.flops_per_token(shape.seq_len));
  std::printf("  = 6 * (active matmul parameters, lm_head counted, embedding lookup not) + 12 * layers * heads * "
              "head_dim * seq\n");
  // The exact memory: the step itself, run on the meta device (shapes and byte counts, no data).
  print_step(train::profile_training_step(a, shape, Device::Meta), shape, a, device.c_str());
  return 0;
}

TITAN_COMMAND("info", "parameters, FLOPs per token and training memory of a model", info_main);

}  // namespace
}  // namespace titan::cli

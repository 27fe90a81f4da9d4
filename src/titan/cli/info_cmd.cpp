// titan info: parameters, FLOPs per token and a training memory estimate for a flavor or a checkpoint.
#include <cstdio>
#include <filesystem>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/models/qwen3/estimate.h"

namespace titan::cli {
namespace {

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ll << 30));
  return buf;
}

int info_main(int argc, char** argv) {
  ArgParser p("info", "Parameters, FLOPs per token and training memory of a Qwen3 model.");
  p.option("flavor", "native flavor (debugmodel, 0.6B, 30B-A3B, ...)")
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
  const int64_t batch = std::stoll(p.get("batch")), seq = std::stoll(p.get("seq"));
  std::string ac = p.get("activation-checkpoint");
  TITAN_CHECK(ac == "none" || ac == "selective" || ac == "full", "--activation-checkpoint must be none, selective or full");
  DType dtype = dtype_from_name(p.get("dtype"));
  auto m = qwen3::estimate_training_memory(a, batch, seq, dtype, ac.c_str());

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
  std::printf("training memory at batch %ld x seq %ld, %s compute, activation checkpointing %s:\n", batch, seq,
              std::string(dtype_name(dtype)).c_str(), ac.c_str());
  std::printf("  weights (f32)     %s\n  gradients (f32)   %s\n  AdamW state (f32) %s\n  activations       %s\n"
              "  total             %s\n",
              gib(m.weights).c_str(), gib(m.grads).c_str(), gib(m.optimizer).c_str(), gib(m.activations).c_str(),
              gib(m.total()).c_str());
  return 0;
}

TITAN_COMMAND("info", "parameters, FLOPs per token and training memory of a model", info_main);

}  // namespace
}  // namespace titan::cli

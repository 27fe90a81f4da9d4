// titan eval --config FILE.toml [--checkpoint DIR] [--json FILE] [--section.key=value ...]
#include <fnmatch.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/cli/job_launch.h"
#include "titan/core/check.h"
#include "titan/io/atomic_file.h"
#include "titan/io/path_guard.h"
#include "titan/train/evaluate.h"
#include "titan/train/job_config.h"

namespace titan::cli {
namespace {

int eval_main(int argc, char** argv) {
  JobArgs a = parse_job_args("eval", argc, argv, {"checkpoint", "json"});
  if (a.help) {
    std::printf(
        "usage: titan eval --config FILE.toml [--checkpoint DIR] [--json FILE] [--section.key=value ...]\n"
        "The held-out loss and perplexity of the job's model, without training: the job's [validation]\n"
        "data and batch shape (validation.dataset or dataset_path, local_batch_size, seq_len, steps; -1:\n"
        "all of it, its last batch's missing rows padding), evaluated as titan train's validation\n"
        "evaluates it. The weights: --checkpoint (a\n"
        "native step-N folder or a Hugging Face folder), else the job's newest checkpoint, else the job's\n"
        "starting weights (checkpoint.initial_load_path / initial_load_in_hf, or its seeded init).\n"
        "--json: also write {loss, perplexity, tokens, batches, weights} to FILE (conversations add\n"
        "conversations, cut_conversations, cut_trained_tokens). See docs/training.md.\n");
    return 0;
  }
  LaunchedJob job = launch_job(a, [&](const train::JobConfig& config) {
    if (!a.own.count("json")) return;
    std::vector<std::filesystem::path> inputs = {a.config};
    for (const std::string& path :
         {a.own.count("checkpoint") ? a.own.at("checkpoint") : std::string(), config.model.hf_assets_path})
      if (!path.empty()) inputs.push_back(path);
    // A dataset path may be a glob: no file it matches, or would match once written, is the output.
    const std::string json_out = a.own.at("json");
    for (const auto& [key, path] : {std::pair{"validation.dataset_path", config.validation.dataset_path},
                                    std::pair{"training.dataset_path", config.training.dataset_path}}) {
      if (path.empty()) continue;
      inputs.push_back(path);
      const auto absolute = [](const std::string& p) {
        return std::filesystem::absolute(p).lexically_normal().string();
      };
      TITAN_CHECK(path.find_first_of("*?[") == std::string::npos ||
                      fnmatch(absolute(path).c_str(), absolute(json_out).c_str(), FNM_PATHNAME) != 0,
                  "titan eval --json: '", json_out, "' matches ", key, " '", path,
                  "': the next evaluation would read the result as data; write it elsewhere");
    }
    io::check_output_file(json_out, inputs, "titan eval --json");
  });
  train::EvalSummary s;
  const bool evaluated = run_on_every_rank("eval", *job.world, [&] {
    s = train::evaluate(job.config, *job.world,
                        a.own.count("checkpoint") ? a.own["checkpoint"] : std::string());
  });
  if (!evaluated) return 1;
  if (a.own.count("json") && job.world->rank() == 0) {
    nlohmann::json out = {{"loss", s.result.loss},
                          {"perplexity", s.result.perplexity},
                          {"tokens", s.result.tokens},
                          {"batches", s.result.batches},
                          {"weights", s.weights}};
    if (s.result.conversations > 0) {  // conversations (training.chat_field)
      out["conversations"] = s.result.conversations;
      out["cut_conversations"] = s.result.cut_conversations;
      out["cut_trained_tokens"] = s.result.cut_trained_tokens;
    }
    io::write_file_atomic(a.own["json"], out.dump(2) + "\n");
  }
  return 0;
}

TITAN_COMMAND_ACROSS_RANKS(
    "eval", "the held-out loss of a job's model (a checkpoint, or its starting weights), no training",
    eval_main);

}  // namespace
}  // namespace titan::cli

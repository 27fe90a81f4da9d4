// titan eval --config FILE.toml [--checkpoint DIR] [--json FILE] [--section.key=value ...]
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/dist/communicator.h"
#include "titan/io/atomic_file.h"
#include "titan/train/evaluate.h"

namespace titan::cli {
namespace {

int eval_main(int argc, char** argv) {
  JobArgs a = parse_job_args("eval", argc, argv, {"checkpoint", "json"});
  if (a.help) {
    std::printf(
        "usage: titan eval --config FILE.toml [--checkpoint DIR] [--json FILE] [--section.key=value ...]\n"
        "The held-out loss and perplexity of the job's model, without training: the job's [validation]\n"
        "data and batch shape (validation.dataset or dataset_path, local_batch_size, seq_len, steps; -1:\n"
        "all of it), evaluated as titan train's validation evaluates it. The weights: --checkpoint (a\n"
        "native step-N folder or a Hugging Face folder), else the job's newest checkpoint, else the job's\n"
        "starting weights (checkpoint.initial_load_path / initial_load_in_hf, or its seeded init).\n"
        "--json: also write {loss, perplexity, tokens, batches, weights} to FILE. See docs/training.md.\n");
    return 0;
  }
  train::JobConfig cfg;
  std::unique_ptr<dist::Communicator> world;
  try {
    cfg = train::load_job_config(a.config, a.overrides);
    if (const std::optional<int> ranks = dist::launcher_world_size()) cfg.validate(*ranks);
    world = dist::launch_communicator(cfg.comm.timeout_seconds,
                                      cfg.job.device == "cuda" ? Device::CUDA : Device::CPU);
  } catch (const Error& e) {
    if (const std::optional<int> rank = dist::launcher_rank()) TITAN_FAIL("rank ", *rank, ": ", e.what());
    throw;
  }
  train::EvalSummary s;
  try {
    s = train::evaluate(cfg, *world, a.own.count("checkpoint") ? a.own["checkpoint"] : std::string());
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;
    std::fprintf(stderr, "titan eval: error: rank %d: %s\n", world->rank(),
                 error_for_the_user(e.what(), "eval").c_str());
    std::fflush(stderr);
    world->abort(1);
  }
  if (a.own.count("json") && world->rank() == 0) {
    const nlohmann::json out = {{"loss", s.result.loss},
                                {"perplexity", s.result.perplexity},
                                {"tokens", s.result.tokens},
                                {"batches", s.result.batches},
                                {"weights", s.weights}};
    io::write_file_atomic(a.own["json"], out.dump(2) + "\n");
  }
  return 0;
}

TITAN_COMMAND("eval",
              "the held-out loss of a job's model (a checkpoint, or its starting weights), no training",
              eval_main);

}  // namespace
}  // namespace titan::cli

// titan train --config FILE.toml [--section.key=value | --section.key value ...]
#include <cstdio>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/cli/job_launch.h"
#include "titan/train/trainer.h"

namespace titan::cli {
namespace {

int train_main(int argc, char** argv) {
  JobArgs a = parse_job_args("train", argc, argv);
  if (a.help) {
    std::printf(
        "usage: titan train --config FILE.toml [--section.key=value ...]\n"
        "Trains a Qwen3 model as the job config says; any config key can be overridden on the\n"
        "command line, e.g. --training.steps=20 --model.n_layers=4. See docs/training.md.\n");
    return 0;
  }
  LaunchedJob job = launch_job(a);
  // Errors (bad config, missing inputs, non-finite loss) throw: main() prints them and exits 1.
  // A stop by SIGINT/SIGTERM is a success: the checkpoint is saved.
  return run_on_every_rank("train", *job.world, [&] { train::run_training(job.config, *job.world); }) ? 0 : 1;
}

TITAN_COMMAND_ACROSS_RANKS("train", "train a Qwen3 model from a TOML job config", train_main);

}  // namespace
}  // namespace titan::cli

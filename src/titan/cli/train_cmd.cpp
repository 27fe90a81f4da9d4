// titan train --config FILE.toml [--section.key=value | --section.key value ...]
#include <cstdio>
#include <cstring>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/cli/job_launch.h"
#include "titan/core/check.h"
#include "titan/train/job_config_reference.h"
#include "titan/train/trainer.h"

namespace titan::cli {
namespace {

int train_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list-keys", 11) == 0 && (argv[i][11] == '\0' || argv[i][11] == '=')) {
      TITAN_CHECK(argc == 2 && argv[i][11] == '\0',
                  "titan train: --list-keys takes no value and no other argument (it prints every key of the "
                  "job config at its default)");
      std::fputs(train::job_config_reference().c_str(), stdout);
      return 0;
    }
  // (--list-keys is listed with the options an unknown one is told of; it is handled above.)
  JobArgs a = parse_job_args("train", argc, argv, {"list-keys"});
  if (a.help) {
    std::printf(
        "usage: titan train --config FILE.toml [--section.key=value ...]\n"
        "       titan train --list-keys\n"
        "Trains a Qwen3 model as the job config says; any config key can be overridden on the\n"
        "command line, e.g. --training.steps=20 --model.n_layers=4. --list-keys prints every key\n"
        "at its default with its choices, commented out (a template to uncomment from);\n"
        "docs/training.md (installed in share/doc/titan/docs) says what each does.\n");
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

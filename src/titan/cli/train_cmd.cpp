// titan train --config FILE.toml [--section.key=value | --section.key value ...]
#include <cstdio>
#include <cstring>

#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/dist/communicator.h"
#include "titan/train/trainer.h"

namespace titan::cli {
namespace {

int train_main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: titan train --config FILE.toml [--section.key=value ...]\n"
          "Trains a Qwen3 model as the job config says; any config key can be overridden on the\n"
          "command line, e.g. --training.steps=20 --model.n_layers=4. See docs/training.md.\n");
      return 0;
    }
    TITAN_CHECK(a.rfind("--", 0) == 0, "titan train: unexpected argument '", a, "' (options start with --)");
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      TITAN_CHECK(i + 1 < argc, "titan train: --", key, " needs a value");
      value = argv[++i];
    }
    if (key == "config") config_path = value;
    else overrides.emplace_back(key, value);
  }
  TITAN_CHECK(!config_path.empty(), "titan train: --config FILE.toml is required (see configs/)");
  train::JobConfig cfg = train::load_job_config(config_path, overrides);
  // MPI when started by mpirun / srun, else one process.
  std::unique_ptr<dist::Communicator> world = dist::launch_communicator(cfg.comm.timeout_seconds);
  // Errors (bad config, missing inputs, non-finite loss) throw: main() prints them and exits 1.
  // A stop by SIGINT/SIGTERM is a success: the checkpoint is saved.
  try {
    train::run_training(cfg, *world);
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;
    // The other ranks may be waiting for this one in a collective: end the whole job.
    std::fprintf(stderr, "titan train: error: rank %d: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    world->abort(1);
  }
  return 0;
}

TITAN_COMMAND("train", "train a Qwen3 model from a TOML job config", train_main);

}  // namespace
}  // namespace titan::cli

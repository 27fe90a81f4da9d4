// titan train --config FILE.toml [--section.key=value | --section.key value ...]
#include <cstdio>
#include <memory>
#include <optional>

#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/dist/communicator.h"
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
  train::JobConfig cfg;
  std::unique_ptr<dist::Communicator> world;
  try {
    cfg = train::load_job_config(a.config, a.overrides);
    // The config's values first, before MPI starts: an error then ends each rank on its own, naming
    // where the key was set, instead of an MPI abort (run_training checks again on the real world).
    if (const std::optional<int> ranks = dist::launcher_world_size()) cfg.validate(*ranks);
    // MPI when started by mpirun / srun, else one process; NCCL over MPI for CUDA ranks.
    const Device device = cfg.job.device == "cuda" ? Device::CUDA : Device::CPU;
    world = dist::launch_communicator(cfg.comm.timeout_seconds, device);
  } catch (const Error& e) {
    // Under a launcher every rank prints its own error: say whose.
    if (const std::optional<int> rank = dist::launcher_rank()) TITAN_FAIL("rank ", *rank, ": ", e.what());
    throw;
  }
  // Errors (bad config, missing inputs, non-finite loss) throw: main() prints them and exits 1.
  // A stop by SIGINT/SIGTERM is a success: the checkpoint is saved.
  try {
    train::run_training(cfg, *world);
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;
    // The other ranks may be waiting for this one in a collective: end the whole job.
    std::fprintf(stderr, "titan train: error: rank %d: %s\n", world->rank(),
                 error_for_the_user(e.what(), "train").c_str());
    std::fflush(stderr);
    world->abort(1);
  }
  return 0;
}

TITAN_COMMAND("train", "train a Qwen3 model from a TOML job config", train_main);

}  // namespace
}  // namespace titan::cli

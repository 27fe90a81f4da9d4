#include "titan/cli/job_launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/dist/parallel_plan.h"

namespace titan::cli {

LaunchedJob launch_job(const JobArgs& a, const std::function<void(const train::JobConfig&)>& check_args) {
  LaunchedJob job;
  // Under a launcher a config error is kept until the ranks can agree on it: every rank reads the
  // same files alike, so rank 0 says the error once instead of each rank printing its own.
  std::string config_error;
  try {
    job.config = train::load_job_config(a.config, a.overrides);
    if (const std::optional<int> ranks = dist::launcher_world_size()) job.config.validate(*ranks);
    if (check_args) check_args(job.config);
  } catch (const Error& e) {
    if (!dist::launcher_rank()) throw;
    config_error = e.what();
  }
  try {
    // A config that did not read has no timeout or device of its own: the defaults, MPI alone.
    const bool read = config_error.empty();
    std::unique_ptr<dist::Communicator> world = dist::launch_communicator(
        read ? job.config.comm.init_timeout() : train::JobConfig{}.comm.init_timeout(),
        read && job.config.job.device == "cuda" ? Device::CUDA : Device::CPU);
    dist::agree_on_success(*world, [&] {
      if (!config_error.empty()) throw Error(config_error);
    });
    job.world = std::move(world);
  } catch (const dist::RanksAgreedError&) {
    // Every rank throws it alike (a config error, a device some rank lacks): rank 0 says it, the
    // others end quietly, after it. A rank's non-zero exit makes the launcher stop the job, which
    // under load cut rank 0 off before its line (the only line saying why): the others wait for the
    // launcher to stop them once rank 0 has ended (for 10 s at most, as a launcher that does not).
    if (dist::launcher_rank().value_or(0) != 0) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::exit(1);
    }
    throw;
  } catch (const Error& e) {
    // Under a launcher every rank prints its own error: say whose.
    if (const std::optional<int> rank = dist::launcher_rank()) TITAN_FAIL("rank ", *rank, ": ", e.what());
    throw;
  }
  return job;
}

bool run_on_every_rank(const std::string& command, dist::Communicator& world,
                       const std::function<void()>& job) {
  try {
    job();
  } catch (const dist::RanksAgreedError& e) {
    if (world.size() == 1) throw;
    if (world.rank() == 0) {
      std::fprintf(stderr, "titan %s: error: %s\n", command.c_str(),
                   error_for_the_user(e.what(), command).c_str());
      std::fflush(stderr);
    }
    return false;
  } catch (const std::exception& e) {
    if (world.size() == 1) throw;
    std::fprintf(stderr, "titan %s: error: rank %d: %s\n", command.c_str(), world.rank(),
                 error_for_the_user(e.what(), command).c_str());
    std::fflush(stderr);
    world.abort(1);
  }
  return true;
}

}  // namespace titan::cli

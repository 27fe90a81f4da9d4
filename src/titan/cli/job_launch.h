#pragma once
// What `titan train` and `titan eval` share around a job: its config and its ranks, and how an error
// on one rank of many ends the whole job.
#include <functional>
#include <memory>
#include <string>

#include "titan/cli/args.h"
#include "titan/dist/communicator.h"
#include "titan/train/job_config.h"

namespace titan::cli {

struct LaunchedJob {
  train::JobConfig config;
  std::unique_ptr<dist::Communicator> world;  // MPI under a launcher, NCCL over it for CUDA ranks; else one process
};

// The job's config, checked against the launcher's world size before MPI starts (an error then ends
// each rank on its own, naming where the key was set, and under a launcher the rank), then its world.
// `check_args`, when given, vets the command's own arguments against the config at the same point
// (an output path that would swallow an input is found out before the work, not after it).
LaunchedJob launch_job(const JobArgs& args,
                       const std::function<void(const train::JobConfig&)>& check_args = nullptr);

// Runs `job` on this rank. An error on one rank of many is printed with the rank and ends every rank
// (the others may be waiting for this one in a collective); one process rethrows it for main(). An
// error every rank threw alike (dist::RanksAgreedError: a failed load, ranks that differ) is printed
// once, by rank 0, and every rank returns false: the command exits 1 on each, MPI finalized, nothing
// aborted.
bool run_on_every_rank(const std::string& command, dist::Communicator& world,
                       const std::function<void()>& job);

}  // namespace titan::cli

#pragma once
// `titan eval`: the held-out loss of a job's model without training it. The data and its shape are
// the job's [validation] section (validation.enable need not be set), evaluated as the trainer's
// validation evaluates them (train/validation.h), so the figure of a checkpoint equals the val_loss
// its run logged at that step. The weights: a given checkpoint (native step-N or Hugging Face
// folder), else what `titan train` would resume (its Checkpointer: the newest step, or
// checkpoint.load_step), else the job's starting weights (its initial load, or its seeded
// initialisation).
#include <filesystem>
#include <string>

#include "titan/dist/communicator.h"
#include "titan/train/job_config.h"
#include "titan/train/validation.h"

namespace titan::train {

struct EvalSummary {
  ValidationResult result;
  std::string weights;  // where the weights came from, in words
};

// Every rank of `world` calls it; `checkpoint` empty: the job's own weights as above.
EvalSummary evaluate(const JobConfig& config, dist::Communicator& world,
                     const std::filesystem::path& checkpoint);

}  // namespace titan::train

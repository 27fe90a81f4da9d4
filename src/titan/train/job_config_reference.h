#pragma once
// The job config's reference as the binary knows it, so an installed titan documents its own keys.
#include <string>

namespace titan::train {

// Every key of the job config as a TOML file of the defaults, one [section] at a time, a key's
// choices in a comment beside it; the model fields [model] may also set; then torchtitan's keys and
// what titan does with each. It parses back to the defaults (`titan train --list-keys` prints it).
std::string job_config_reference();

}  // namespace titan::train

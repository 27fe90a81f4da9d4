#pragma once
// Helpers of the test programs that run on real MPI ranks (tests/dist).
#include <filesystem>
#include <string>
#include <vector>

namespace titan::dist {
class Communicator;
}

namespace titan::testing {

// The world of a test program run on ranks (run_this_program_on_ranks): MPI with a 60 s bound on
// each collective, made once per process (MPI is initialised once).
dist::Communicator& rank_world();

// The names of the entries of `dir` (a checkpoint or export folder), sorted.
std::vector<std::string> files_in(const std::filesystem::path& dir);

}  // namespace titan::testing

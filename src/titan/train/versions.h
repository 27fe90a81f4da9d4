#pragma once
// What a run was made with: the titan commit, the compiler, the numeric libraries, MPI, CUDA, and
// the CPU (and GPU). Printed by `titan version` / `titan --version`, logged at the start of every
// training run, and written into every checkpoint's train_state.json ("versions"), so that a result
// can be traced to the exact software and machine that produced it.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace titan::train {

struct VersionEntry {
  std::string component;  // "titan", "compiler", "oneDNN", "OpenBLAS", "MPI", "CUDA", "GPU", "CPU", "ISA"
  std::string version;
};

// `git describe --tags --always --dirty` of the source tree at build time (cmake/git_describe.cmake).
const char* titan_git_describe();

// Every component, in a fixed order; CUDA and GPU only in builds with the CUDA backend, and only
// once its library is loaded (before that one "CUDA" entry says it is not loaded: collecting the
// versions never loads it). Safe to call before MPI_Init (MPI_Get_library_version is one of the
// functions the standard allows then).
std::vector<VersionEntry> collect_versions();

// {"titan": "...", "compiler": "...", ...}: the block of checkpoints and `titan version --json`.
nlohmann::json versions_json(const std::vector<VersionEntry>& versions);
// "component: version" lines, each indented by `indent`, joined by newlines (none at the end).
std::string versions_text(const std::vector<VersionEntry>& versions, const std::string& indent);

}  // namespace titan::train

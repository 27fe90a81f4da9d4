#pragma once
// Paths shared by the tests. The repo is TITAN_SOURCE_DIR; ../shared sits beside it
// (CI has it); assets/ is filled by scripts/setup.sh (npm packages).
#include <filesystem>
#include <string>

namespace titan::testing {

std::filesystem::path source_dir();
std::filesystem::path binary_dir();
std::filesystem::path titan_binary();      // build/bin/titan
std::filesystem::path shared_dir();        // <repo>/../shared
std::filesystem::path assets_dir();        // <repo>/assets
std::filesystem::path fixtures_dir();      // <repo>/tests/fixtures
std::filesystem::path temp_dir(const std::string& name);  // fresh, empty folder under the build dir
int run_command(const std::string& cmd, std::string* output);  // shell command, stdout+stderr captured

}  // namespace titan::testing

#pragma once
// Paths shared by the tests. The repo is TITAN_SOURCE_DIR; every fixture a test needs is in
// tests/fixtures (never ../shared, which a checkout may lack); assets/ is filled by scripts/setup.sh.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace titan::testing {

std::filesystem::path source_dir();  // TITAN_TEST_SOURCE_DIR overrides the source tree built from
std::filesystem::path binary_dir();  // TITAN_TEST_BINARY_DIR overrides (bin/titan is found there)
std::filesystem::path titan_binary();      // build/bin/titan
std::filesystem::path assets_dir();        // <repo>/assets
std::filesystem::path fixtures_dir();      // <repo>/tests/fixtures
// A fresh, empty folder under the build dir, removed when the test program ends with every test
// passed (kept on a failure, or with TITAN_KEEP_TEST_TMP=1).
std::filesystem::path temp_dir(const std::string& name);
// "" when the two files hold the same bytes; otherwise their sizes, 64-bit hashes and the offset of
// the first differing byte. Never the contents: a failure message stays a line, whatever the size.
std::string file_difference(const std::filesystem::path& a, const std::filesystem::path& b);
// The message of the titan::Error f throws, "" when it throws none.
std::string error_of(const std::function<void()>& f);
int run_command(const std::string& cmd, std::string* output);  // shell command, stdout+stderr captured
// Starts argv[0] (looked up in PATH) with argv in the background, stdout and stderr into `log`;
// returns its pid (0 when it could not start). For tests that signal or kill a running job.
// `stdout_fd` >= 0 is its standard output instead (stderr alone goes to `log`).
int spawn_logged(const std::vector<std::string>& argv, const std::filesystem::path& log, int stdout_fd = -1);

// This test program run again as `ranks` real MPI ranks (mpirun --oversubscribe --bind-to none, one
// OpenMP thread each, allowed as root), with `rank_env`=1 in their environment and only the tests
// of `filter`: mpirun's exit status, its output, and how many ranks printed "[  PASSED  ] <tests>
// tests". `skipped` says why it could not run (no mpirun on PATH); the caller then skips.
struct RanksRun {
  int rc = -1;
  std::string output;
  int ranks_passed = 0;
  std::string skipped;
};
RanksRun run_this_program_on_ranks(int ranks, const std::string& rank_env, const std::string& filter,
                                   int tests);

}  // namespace titan::testing

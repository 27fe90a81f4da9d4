#include "test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/hash.h"

extern char** environ;

namespace titan::testing {

namespace {
// The environment may move the trees: the GPU bundle (scripts/gpu_bundle.sh) runs the test programs
// far from where they were built, with its own fixtures, assets and bin/titan.
std::filesystem::path env_or(const char* var, const char* built_in) {
  const char* v = std::getenv(var);
  return v && *v ? v : built_in;
}
}  // namespace

std::filesystem::path source_dir() { return env_or("TITAN_TEST_SOURCE_DIR", TITAN_SOURCE_DIR); }
std::filesystem::path binary_dir() { return env_or("TITAN_TEST_BINARY_DIR", TITAN_BINARY_DIR); }
std::filesystem::path titan_binary() { return binary_dir() / "bin" / "titan"; }
std::filesystem::path assets_dir() { return source_dir() / "assets"; }
std::filesystem::path fixtures_dir() { return source_dir() / "tests" / "fixtures"; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

namespace {
// The folders temp_dir made in this process. A training test writes hundreds of MiB (checkpoints,
// exports); kept for the whole suite they filled CI's disk. When every test of the process passed
// they are removed at its end (ctest runs one test per process, so this is per test); a failing
// process keeps them to look at, and so does TITAN_KEEP_TEST_TMP=1.
std::vector<std::filesystem::path>& made_temp_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}

class TempDirRemover : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    const char* keep = std::getenv("TITAN_KEEP_TEST_TMP");
    if (!unit.Passed() || (keep && std::string(keep) == "1")) return;
    std::error_code ignored;  // a folder a child process still writes to is not worth a failure
    for (const auto& dir : made_temp_dirs()) std::filesystem::remove_all(dir, ignored);
  }
};

// Registered when the program starts (the listeners own it); every test program links this file.
const bool temp_dir_remover_registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new TempDirRemover);
  return true;
}();
}  // namespace

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = binary_dir() / "test_tmp" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  made_temp_dirs().push_back(dir);
  return dir;
}

std::string file_difference(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::FILE* fa = std::fopen(a.c_str(), "rb");
  std::FILE* fb = std::fopen(b.c_str(), "rb");
  if (!fa || !fb) {
    if (fa) std::fclose(fa);
    if (fb) std::fclose(fb);
    return std::string("cannot open ") + (fa ? b.string() : a.string());
  }
  uint64_t ha = kFnv1aStart, hb = ha, size_a = 0, size_b = 0, first_diff = UINT64_MAX;
  std::array<unsigned char, 1 << 16> ba, bb;
  while (true) {
    size_t na = std::fread(ba.data(), 1, ba.size(), fa), nb = std::fread(bb.data(), 1, bb.size(), fb);
    ha = fnv1a(ba.data(), na, ha);
    hb = fnv1a(bb.data(), nb, hb);
    if (first_diff == UINT64_MAX) {
      size_t n = std::min(na, nb), i = 0;
      while (i < n && ba[i] == bb[i]) ++i;
      if (i < n || na != nb) first_diff = size_a + i;
    }
    size_a += na;
    size_b += nb;
    if (na == 0 && nb == 0) break;
  }
  std::fclose(fa);
  std::fclose(fb);
  if (first_diff == UINT64_MAX) return "";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s (%llu bytes, hash %016llx) and %s (%llu bytes, hash %016llx) first differ at byte %llu",
                a.c_str(), (unsigned long long)size_a, (unsigned long long)ha, b.c_str(),
                (unsigned long long)size_b, (unsigned long long)hb, (unsigned long long)first_diff);
  return buf;
}

int spawn_logged(const std::vector<std::string>& argv, const std::filesystem::path& log, int stdout_fd) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, stdout_fd >= 0 ? stdout_fd : 2, 1);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? int(pid) : 0;
}

RanksRun run_this_program_on_ranks(int ranks, const std::string& rank_env, const std::string& filter,
                                   int tests) {
  RanksRun run;
  std::string found;
  if (run_command("command -v mpirun", &found) != 0) {
    run.skipped = "mpirun not found on PATH";
    return run;
  }
  std::array<char, 4096> self{};
  TITAN_CHECK(readlink("/proc/self/exe", self.data(), self.size() - 1) > 0, "cannot read /proc/self/exe");
  run.rc = run_command("OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                           rank_env + "=1 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x " +
                           rank_env + " -np " + std::to_string(ranks) + " " + self.data() +
                           " --gtest_color=no --gtest_filter='" + filter + "'",
                       &run.output);
  const std::string passed = "[  PASSED  ] " + std::to_string(tests) + " test" + (tests == 1 ? "" : "s");
  for (size_t at = run.output.find(passed); at != std::string::npos; at = run.output.find(passed, at + 1))
    ++run.ranks_passed;
  return run;
}

int run_command(const std::string& cmd, std::string* output) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0)
    if (output) output->append(buf.data(), n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace titan::testing

// `titan version` / `titan --version`, and the same block in the start-up log and in every
// checkpoint. Each entry is checked against a source independent of the code that produced it:
// git, the libraries' own headers, the mpirun program, the CPU probe.
#include "titan/train/versions.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "test_util.h"
#include "tiny_job.h"
#include "titan/backend/cpu/cpu_info.h"

using namespace titan;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

std::string titan_bin() { return tt::titan_binary().string(); }

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

// "component: version" lines of `titan version`.
std::map<std::string, std::string> parse_lines(const std::string& text) {
  std::map<std::string, std::string> m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(": ");
    if (colon != std::string::npos) m[trim(line.substr(0, colon))] = line.substr(colon + 2);
  }
  return m;
}

}  // namespace

TEST(Versions, VersionCommandPrintsEveryComponentAndDashDashVersionIsTheSame) {
  std::string out, dash_out, json_out;
  ASSERT_EQ(tt::run_command(titan_bin() + " version", &out), 0) << out;
  ASSERT_EQ(tt::run_command(titan_bin() + " --version", &dash_out), 0) << dash_out;
  EXPECT_EQ(out, dash_out);
  auto lines = parse_lines(out);
  for (const char* c : {"titan", "compiler", "oneDNN", "OpenBLAS", "MPI", "CPU", "ISA"})
    EXPECT_TRUE(lines.count(c) && !lines[c].empty()) << "no '" << c << "' line in:\n" << out;

  ASSERT_EQ(tt::run_command(titan_bin() + " version --json 2>/dev/null", &json_out), 0) << json_out;
  auto j = nlohmann::json::parse(json_out);
  EXPECT_EQ(j, train::versions_json(train::collect_versions()));
  for (auto& [k, v] : lines) EXPECT_EQ(j.at(k).get<std::string>(), v) << k;
}

TEST(Versions, TitanEntryNamesTheCheckedOutCommit) {
  if (!fs::exists(tt::source_dir() / ".git")) GTEST_SKIP() << "the source is not a git checkout";
  std::string describe = train::titan_git_describe(), head, named;
  const std::string dirty = "-dirty";
  if (describe.size() > dirty.size() && describe.ends_with(dirty)) describe.resize(describe.size() - dirty.size());
  const std::string git = "git -C '" + tt::source_dir().string() + "' rev-parse ";
  ASSERT_EQ(tt::run_command(git + "HEAD", &head), 0) << head;
  ASSERT_EQ(tt::run_command(git + "'" + describe + "^{commit}'", &named), 0) << named;
  // A commit made after this build names another HEAD: rebuild before running the test.
  EXPECT_EQ(trim(named), trim(head)) << "titan_git_describe() = " << train::titan_git_describe();
}

TEST(Versions, LibraryEntriesMatchTheLibrariesOwnHeadersAndPrograms) {
  auto j = train::versions_json(train::collect_versions());
  const std::string onednn = std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." +
                             std::to_string(DNNL_VERSION_PATCH);
  EXPECT_EQ(j["oneDNN"].get<std::string>().rfind(onednn + " ", 0), 0u) << j["oneDNN"];
  EXPECT_EQ(j["OpenBLAS"].get<std::string>().rfind(trim(OPENBLAS_VERSION) + " ", 0), 0u) << j["OpenBLAS"];

  // mpirun --version: "mpirun (Open MPI) 4.1.4"
  std::string mpirun;
  ASSERT_EQ(tt::run_command("mpirun --version", &mpirun), 0) << mpirun;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(mpirun, m, std::regex(R"((\d+\.\d+\.\d+))"))) << mpirun;
  EXPECT_NE(j["MPI"].get<std::string>().find(m[1].str()), std::string::npos) << j["MPI"] << " vs " << mpirun;

  const auto& cpu = cpu::cpu_info();
  EXPECT_NE(j["CPU"].get<std::string>().find(cpu.brand.empty() ? cpu.vendor : cpu.brand), std::string::npos);
  EXPECT_EQ(j["ISA"], cpu.isa());
  if (cpu.avx512_bf16) {
    EXPECT_NE(j["ISA"].get<std::string>().find("avx512_bf16"), std::string::npos);
  }
  const std::string compiler = j["compiler"];
  EXPECT_TRUE(compiler.rfind("GCC ", 0) == 0 || compiler.rfind("clang ", 0) == 0) << compiler;
}

TEST(Versions, TrainingLogsTheBlockAndWritesItIntoEveryCheckpoint) {
  fs::path dump = tt::temp_dir("versions_train");
  std::string out;
  int rc = tt::run_command(titan_bin() + " train --config " + tt::debugmodel_toml().string() +
                               tt::cli_args(tt::tiny_job(dump, {{"training.steps", "2"},
                                                                {"checkpoint.enable", "true"},
                                                                {"checkpoint.interval", "1"}})),
                           &out);
  ASSERT_EQ(rc, 0) << out;
  std::string version_out;
  ASSERT_EQ(tt::run_command(titan_bin() + " version", &version_out), 0);
  std::string indented = "versions:\n";
  std::istringstream in(version_out);
  for (std::string line; std::getline(in, line);) indented += "  " + line + "\n";
  EXPECT_NE(out.find(indented), std::string::npos) << "start-up log:\n" << out.substr(0, 2000);

  const auto expected = train::versions_json(train::collect_versions());
  for (const char* step : {"step-1", "step-2"}) {
    std::ifstream f(dump / "checkpoint" / step / "train_state.json");
    ASSERT_TRUE(f) << step;
    auto ts = nlohmann::json::parse(f);
    EXPECT_EQ(ts.at("versions"), expected) << step;
  }
}

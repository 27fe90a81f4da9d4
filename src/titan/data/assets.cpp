#include "titan/data/assets.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "titan/core/check.h"

namespace titan::data {
namespace fs = std::filesystem;

namespace {
constexpr const char* kHint =
    "run scripts/setup.sh (it fetches the tokenizer and corpus into assets/), "
    "set TITAN_ASSETS_DIR, or name your own: model.hf_assets_path (a folder holding "
    "tokenizer.json) and training.dataset_path";

bool complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / ".complete", ec);
}
}  // namespace

fs::path assets_dir() {
  if (const char* env = std::getenv("TITAN_ASSETS_DIR"); env && *env) {
    fs::path dir(env);
    TITAN_CHECK(complete(dir), "assets: TITAN_ASSETS_DIR=", dir, " holds no prepared assets (no .complete): ",
                kHint);
    return dir;
  }
  std::vector<fs::path> starts;
  std::error_code ec;
  starts.push_back(fs::current_path(ec));
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  for (auto start : starts) {
    for (fs::path dir = start; !dir.empty(); dir = dir.parent_path()) {
      if (complete(dir / "assets")) return dir / "assets";
      if (dir == dir.parent_path()) break;
    }
  }
  std::string looked = "'";
  looked += starts.front().string();
  looked += "'";
  if (starts.size() > 1) looked += " or '" + starts.back().string() + "'";
  TITAN_FAIL("assets: no prepared assets folder found in or above ", looked, ": ", kHint);
}

fs::path default_tokenizer_path() {
  fs::path p = assets_dir() / "tokenizer" / "qwen3";
  TITAN_CHECK(fs::is_regular_file(p / "tokenizer.json"), "assets: ", p / "tokenizer.json", " is missing: ", kHint);
  return p;
}

std::string builtin_dataset_error(std::string_view name, std::string_view section) {
  if (name == "nlp-corpus" || name == "nlp-corpus-validation") return "";
  std::string error = "no built-in dataset named '";
  error.append(name).append(
      "' (built-in: nlp-corpus, nlp-corpus-validation; torchtitan's c4, c4_test and c4_validation are not "
      "bundled): set ");
  return error.append(section).append(".dataset_path to your own files");
}

fs::path builtin_dataset_path(std::string_view name, std::string_view section) {
  const std::string error = builtin_dataset_error(name, section);
  TITAN_CHECK(error.empty(), error);
  fs::path p = assets_dir() / "datasets" / std::string(name);
  TITAN_CHECK(fs::is_directory(p), "assets: dataset folder ", p, " is missing: ", kHint);
  return p;
}

fs::path default_dataset_path() { return builtin_dataset_path("nlp-corpus"); }

}  // namespace titan::data

#pragma once
// The tiny debugmodel run the trainer tests share: configs/debugmodel.toml shrunk with model
// overrides (2 layers, dim 64, seq 64) so that a step takes a fraction of a second.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/train/job_config.h"

namespace titan::testing {

using Overrides = std::vector<std::pair<std::string, std::string>>;

inline std::filesystem::path debugmodel_toml() {
  return source_dir() / "configs" / "debugmodel.toml";
}

// `extra` comes last and wins.
inline Overrides tiny(const std::filesystem::path& dump, const Overrides& extra = {}) {
  Overrides o = {{"job.dump_folder", dump.string()},
                 {"model.n_layers", "2"},
                 {"model.dim", "64"},
                 {"model.n_heads", "2"},
                 {"model.n_kv_heads", "1"},
                 {"model.head_dim", "32"},
                 {"model.hidden_dim", "128"},
                 {"training.seq_len", "64"},
                 {"training.local_batch_size", "2"},
                 {"metrics.log_freq", "1"},
                 {"lr_scheduler.warmup_steps", "1"},
                 {"checkpoint.enable", "false"},
                 {"checkpoint.last_save_in_hf", "false"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

inline train::JobConfig tiny_config(const std::filesystem::path& dump, const Overrides& extra = {}) {
  return train::load_job_config(debugmodel_toml().string(), tiny(dump, extra));
}

inline std::string cli_args(const Overrides& o) {
  std::string s;
  for (auto& [k, v] : o) s += " '--" + k + "=" + v + "'";
  return s;
}

inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& dump) {
  std::vector<nlohmann::json> records;
  std::ifstream f(dump / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// The titan::Error message `fn` throws, or "" when it does not throw.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace titan::testing

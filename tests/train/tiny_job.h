#pragma once
// The tiny job the train tests run: configs/debugmodel.toml (the README's main job) shrunk with model
// overrides (2 layers, dim 64, seq 64) so that a step takes a fraction of a second on two busy cores;
// the tokenizer and corpus are the real ones from assets/. Every train test uses this one list.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace titan::testing {

using Overrides = std::vector<std::pair<std::string, std::string>>;

inline std::filesystem::path debugmodel_toml() { return source_dir() / "configs" / "debugmodel.toml"; }

// `a`, then `b` (whose keys win).
inline Overrides joined(Overrides a, const Overrides& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `extra` comes last and wins.
inline Overrides tiny_job(const std::filesystem::path& dump, const Overrides& extra = {}) {
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

// " '--key=value' ..." for the titan command line.
inline std::string cli_args(const Overrides& o) {
  std::string s;
  for (auto& [k, v] : o) s += " '--" + k + "=" + v + "'";
  return s;
}

}  // namespace titan::testing

#pragma once
// What the trainer tests share beyond the tiny job itself (tiny_job.h): its config, metrics reads.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "tiny_job.h"
#include "titan/core/check.h"
#include "titan/train/job_config.h"

namespace titan::testing {

inline train::JobConfig tiny_config(const std::filesystem::path& dump, const Overrides& extra = {}) {
  return train::load_job_config(debugmodel_toml().string(), tiny_job(dump, extra));
}

inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& dump) {
  std::vector<nlohmann::json> records;
  std::ifstream f(dump / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// One field of every record by step (the records of a resumed run continue the same map).
inline std::map<int64_t, double> by_step(const std::vector<nlohmann::json>& records, const char* key) {
  std::map<int64_t, double> m;
  for (auto& r : records) m[r.at("step").get<int64_t>()] = r.at(key).get<double>();
  return m;
}

}  // namespace titan::testing

#pragma once
// What the trainer tests share beyond the tiny job itself (tiny_job.h): its config, metrics reads.
#include <unistd.h>

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

// Short conversations of different lengths, as JSONL (the answers' lengths differ, so rows do); the
// questions are numbered from `first` (another number: other conversations, held-out ones).
inline std::filesystem::path write_conversations(const std::string& name, int first = 0) {
  const std::filesystem::path data = temp_dir(name + "_" + std::to_string(getpid())) / "chats.jsonl";
  std::ofstream out(data);
  const char* answers[] = {"Yes.",
                           "The river runs north past the old mill and on to the sea, where the town is.",
                           "No, not on Sundays.",
                           "Two.",
                           "It was built in 1850, burned in 1901 and rebuilt.",
                           "Paris",
                           "Because the light bends as it enters the water, the stick looks broken.",
                           "Blue and green."};
  for (int i = 0; i < 8; ++i)
    out << nlohmann::json{{"messages",
                           {{{"role", "user"}, {"content", "Question " + std::to_string(first + i) + "?"}},
                            {{"role", "assistant"}, {"content", answers[i]}}}}}
               .dump()
        << "\n";
  return data;
}

}  // namespace titan::testing

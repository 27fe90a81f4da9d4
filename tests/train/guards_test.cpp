// The guards of a training run (docs/training.md, "Guards"): each case here is something a
// careless user did that used to continue on the wrong state or destroy data (issue 14).
#include <gtest/gtest.h>
#include <fstream>

#include "test_util.h"
#include "titan/data/assets.h"
#include "titan/train/checkpoint.h"
#include "titan/train/trainer.h"
#include "train_test_util.h"

using namespace titan;
using namespace titan::train;
using namespace titan::testing;
namespace fs = std::filesystem;

namespace {

// First `bytes` of the bundled corpus, cut at a line end: real text, small and fast to fingerprint.
void write_corpus_prefix(const fs::path& out, size_t bytes, size_t skip_lines = 0) {
  std::ifstream in(data::default_dataset_path() / "train.jsonl");
  std::ofstream o(out);
  std::string line;
  size_t written = 0;
  for (size_t i = 0; written < bytes && std::getline(in, line); ++i) {
    if (i < skip_lines) continue;
    o << line << "\n";
    written += line.size() + 1;
  }
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

const Overrides kCheckpointEvery2 = {
    {"checkpoint.enable", "true"}, {"checkpoint.interval", "2"}, {"checkpoint.keep_latest_k", "2"}};

Overrides with(Overrides a, const Overrides& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// ---------------------------------------------------------------- 1. resume on the wrong state

TEST(ResumeGuard, AChangedModelIsRefusedNamingTheFieldAndBothValues) {
  const fs::path dump = temp_dir("guard_model_change");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const auto before = listing(dump / "checkpoint");
  struct Case {
    Overrides change;
    std::string field, saved, now;
  };
  for (const Case& c : {Case{{{"model.n_layers", "1"}}, "model.n_layers", "2", "1"},
                        Case{{{"model.rope_theta", "500000"}}, "model.rope_theta", "1e+06", "5e+05"},
                        Case{{{"model.norm_eps", "1e-5"}}, "model.norm_eps", "1e-06", "1e-05"}}) {
    std::string e = error_of([&] {
      run_training(tiny_config(dump, with(with(kCheckpointEvery2, {{"training.steps", "4"}}), c.change)));
    });
    EXPECT_NE(e.find(c.field + " = " + c.saved), std::string::npos) << e;
    EXPECT_NE(e.find(c.field + " = " + c.now), std::string::npos) << e;
    EXPECT_EQ(listing(dump / "checkpoint"), before) << "the refused resume touched the checkpoints";
    EXPECT_EQ(read_metrics(dump).size(), 2u) << "the refused resume took a step";
  }
  // The unchanged model resumes.
  TrainSummary s = run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "3"}})));
  EXPECT_EQ(s.steps_run, 1);
}

TEST(ResumeGuard, ADifferentDatasetIsRefusedUnlessTheDataStreamRestarts) {
  const fs::path dump = temp_dir("guard_data_change");
  const fs::path data_dir = temp_dir("guard_data_change_files");
  const fs::path first = data_dir / "first.jsonl", second = data_dir / "second.jsonl";
  write_corpus_prefix(first, 64 << 10);
  write_corpus_prefix(second, 64 << 10, /*skip_lines=*/5);
  auto config = [&](const fs::path& data, int steps, Overrides extra = {}) {
    return tiny_config(dump, with(with(kCheckpointEvery2, {{"training.dataset_path", data.string()},
                                                           {"training.steps", std::to_string(steps)}}),
                                  extra));
  };
  run_training(config(first, 2));

  // Another file: refused, naming both paths and what differs.
  std::string e = error_of([&] { run_training(config(second, 4)); });
  EXPECT_NE(e.find("different dataset"), std::string::npos) << e;
  EXPECT_NE(e.find(first.string()), std::string::npos) << e;
  EXPECT_NE(e.find(second.string()), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.restart_data_stream"), std::string::npos) << e;

  // The same path with content appended (its size changed): refused.
  fs::copy_file(first, data_dir / "first.orig");
  std::ofstream(first, std::ios::app) << "{\"text\": \"one more document\"}\n";
  e = error_of([&] { run_training(config(first, 4)); });
  EXPECT_NE(e.find("size"), std::string::npos) << e;
  // The same size, one byte changed: refused by the fingerprint.
  fs::remove(first);
  fs::copy_file(data_dir / "first.orig", first);
  {
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('#');
  }
  e = error_of([&] { run_training(config(first, 4)); });
  EXPECT_NE(e.find("fingerprint"), std::string::npos) << e;
  EXPECT_EQ(read_metrics(dump).size(), 2u) << "a refused resume took a step";

  // Asked for: the new dataset starts from its beginning and the run continues.
  std::string out;
  TrainSummary s = run_training(config(second, 4, {{"checkpoint.restart_data_stream", "true"}}));
  EXPECT_EQ(s.steps_run, 2);
  EXPECT_EQ(s.last_step, 4);
  // The same file moved elsewhere is the same data: it resumes.
  fs::rename(second, data_dir / "moved.jsonl");
  s = run_training(config(data_dir / "moved.jsonl", 6));
  EXPECT_EQ(s.steps_run, 2);
}

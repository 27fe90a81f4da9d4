// The guards of a training run (docs/training.md, "Guards"): each case here is something a
// careless user did that used to continue on the wrong state or destroy data (issue 14).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "titan/core/hash.h"
#include "titan/core/tensor.h"
#include "titan/data/assets.h"
#include "titan/data/data_identity.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/safetensors.h"
#include "titan/train/checkpoint.h"
#include "titan/train/resume_guard.h"
#include "titan/train/run_lock.h"
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

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const fs::path& p) {
  return nlohmann::json::parse(read_bytes(p));
}
void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream(p) << j.dump(1);
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

// Rewrites a committed checkpoint's model file with its tensors edited by `edit` (which may add
// some) and re-vouches for it in the manifest, as a careless tool would: only the loader's own
// checks of the contents stand between it and training.
void rewrite_model_file(const fs::path& step,
                        const std::function<void(std::vector<io::TensorWrite>&)>& edit) {
  const fs::path file = step / "model-rank0.safetensors";
  std::vector<std::vector<std::byte>> copies;
  std::vector<io::TensorWrite> w;
  {
    auto f = io::SafetensorsFile::open(file);
    for (auto& t : f.tensors()) {
      copies.emplace_back(t.data, t.data + t.nbytes());
      w.push_back({t.name, t.dtype, t.shape, copies.back().data()});
    }
    edit(w);
    io::write_safetensors(step.parent_path() / "edited.safetensors", w);
  }
  fs::rename(step.parent_path() / "edited.safetensors", file);
  nlohmann::json m = nlohmann::json::parse(read_bytes(step / "manifest.json"));
  m["files"]["model-rank0.safetensors"] = {{"bytes", fs::file_size(file)},
                                           {"checksum", std::to_string(file_checksum(file))}};
  std::ofstream(step / "manifest.json") << m.dump(2);
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

// Another tokenizer turns the same text into other ids: the saved data position (tokens into a
// document) and what the model learned belong to the old one.
TEST(ResumeGuard, AnotherTokenizerIsRefusedUnlessTheDataStartsOver) {
  const fs::path dump = temp_dir("guard_tokenizer_change");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  // The bundled tokenizer less its last 1000 merges: a real, loadable, different tokenizer.
  const fs::path other = temp_dir("guard_tokenizer_change_other");
  {
    nlohmann::json t =
        nlohmann::json::parse(std::ifstream(data::default_tokenizer_path() / "tokenizer.json"));
    auto& merges = t["model"]["merges"];
    merges.erase(merges.end() - 1000, merges.end());
    std::ofstream(other / "tokenizer.json") << t.dump();
    fs::copy_file(data::default_tokenizer_path() / "tokenizer_config.json", other / "tokenizer_config.json");
  }
  const Overrides use_other = {{"model.hf_assets_path", other.string()}, {"training.steps", "4"}};
  const std::string e =
      error_of([&] { run_training(tiny_config(dump, with(kCheckpointEvery2, use_other))); });
  EXPECT_NE(e.find("is not the one the checkpoint was trained with"), std::string::npos) << e;
  EXPECT_NE(e.find(other.string()), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.restart_data_stream"), std::string::npos) << e;
  EXPECT_EQ(read_metrics(dump).size(), 2u) << "the refused resume took a step";
  // Asked for: the data starts over under the new tokenizer.
  TrainSummary s = run_training(tiny_config(
      dump, with(with(kCheckpointEvery2, use_other), {{"checkpoint.restart_data_stream", "true"}})));
  EXPECT_EQ(s.steps_run, 2);
  // The same tokenizer file in another folder is the same tokenizer.
  const fs::path moved = temp_dir("guard_tokenizer_change_moved");
  fs::copy_file(other / "tokenizer.json", moved / "tokenizer.json");
  fs::copy_file(other / "tokenizer_config.json", moved / "tokenizer_config.json");
  s = run_training(tiny_config(
      dump, with(kCheckpointEvery2, {{"model.hf_assets_path", moved.string()}, {"training.steps", "6"}})));
  EXPECT_EQ(s.steps_run, 2);
}

// A committed checkpoint whose manifest was damaged since: going on from an older step (or from
// scratch) would redo its steps and later prune it, so the run stops and says which folder.
TEST(ResumeGuard, ADamagedManifestOfTheNewestCheckpointStopsTheRun) {
  const fs::path dump = temp_dir("guard_damaged_manifest");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
  const std::string manifest = read_bytes(ck / "step-4" / "manifest.json");
  fs::resize_file(ck / "step-4" / "manifest.json", 200);  // cut short: not JSON any more
  std::string e = error_of([&] {
    run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "6"}})));
  });
  EXPECT_NE(e.find((ck / "step-4").string() + "' was committed (COMMITTED) but its manifest.json"),
            std::string::npos)
      << e;
  // With an earlier checkpoint, the way forward is named as for a corrupted file of the newest step.
  EXPECT_NE(
      e.find("manifest.json is missing, unreadable or not titan's: the checkpoint is damaged and cannot "
             "be verified or loaded; if step 4 cannot be repaired, the committed steps before it are 2: "
             "checkpoint.load_step = 2 resumes from the newest of them (step 4 is then set aside, not "
             "deleted)"),
      std::string::npos)
      << e;
  EXPECT_EQ(e.find("Move it out"), std::string::npos) << e;
  EXPECT_EQ(read_metrics(dump).size(), 4u) << "the refused run took a step";
  // The same with the only checkpoint damaged: not a silent start from scratch either.
  const fs::path alone = temp_dir("guard_damaged_manifest_alone");
  run_training(tiny_config(alone, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  fs::resize_file(alone / "checkpoint" / "step-2" / "manifest.json", 0);
  e = error_of([&] { run_training(tiny_config(alone, with(kCheckpointEvery2, {{"training.steps", "4"}}))); });
  EXPECT_NE(
      e.find(". Move it out of '" + (alone / "checkpoint").string() + "' to resume from scratch instead"),
      std::string::npos)
      << e;
  // An older damaged checkpoint is named and kept; the newest resumes.
  std::ofstream(ck / "step-4" / "manifest.json") << manifest;
  fs::resize_file(ck / "step-2" / "manifest.json", 10);
  TrainSummary s = run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "6"}})));
  EXPECT_EQ(s.steps_run, 2);
  EXPECT_TRUE(fs::exists(ck / "step-2" / "COMMITTED")) << "a damaged checkpoint is never deleted";
  EXPECT_EQ(CheckpointManager(ck, 2).damaged_step_dirs(), (std::vector<fs::path>{ck / "step-2"}));

  // The load_step the error suggests resumes: the damaged step is set aside, kept, and trained again.
  const fs::path back = temp_dir("guard_damaged_manifest_rollback");
  const fs::path back_ck = back / "checkpoint";
  run_training(tiny_config(back, with(kCheckpointEvery2, {{"training.steps", "4"}})));
  fs::resize_file(back_ck / "step-4" / "manifest.json", 200);
  s = run_training(
      tiny_config(back, with(kCheckpointEvery2, {{"training.steps", "6"}, {"checkpoint.load_step", "2"}})));
  EXPECT_EQ(s.steps_run, 4);
  EXPECT_TRUE(fs::exists(back_ck / "step-4.rolled-back" / "COMMITTED")) << "the damaged step was not kept";
  EXPECT_EQ(CheckpointManager(back_ck, 2).committed_steps(), (std::vector<int64_t>{4, 6}));
}

// A step-N folder that holds another step's checkpoint (copied or renamed by hand) would be resumed
// on every start, each run retraining the same steps and pruning its own progress.
TEST(ResumeGuard, AStepFolderHoldingAnotherStepIsRefused) {
  const fs::path dump = temp_dir("guard_renamed_step");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  fs::create_directories(ck / "step-9");
  for (auto& e : fs::directory_iterator(ck / "step-2"))
    fs::copy_file(e.path(), ck / "step-9" / e.path().filename());
  const std::string e = error_of([&] {
    run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "12"}})));
  });
  EXPECT_NE(e.find((ck / "step-9").string() + "' holds the checkpoint of step 2, not 9"), std::string::npos)
      << e;
  // titan export and verify-export alike; the resume adds the committed steps before it.
  const std::string direct = error_of([&] { load_checkpoint_dir(ck / "step-9"); });
  EXPECT_EQ(e.rfind(direct, 0), 0u) << e;
  EXPECT_NE(e.find("the committed steps before it are 2: checkpoint.load_step = 2"), std::string::npos) << e;
}

// A stop by signal saves a checkpoint even with checkpointing off, so that no work is lost. A run
// started later in the same folder with checkpointing off would neither resume it nor keep its own
// saves apart from it (its signal save could replace or prune it): it is refused, naming the way on.
TEST(ResumeGuard, CheckpointsInTheFolderAreNotIgnoredWithCheckpointingOff) {
  const fs::path dump = temp_dir("guard_checkpoints_with_checkpointing_off");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const std::string e = error_of([&] { run_training(tiny_config(dump, {{"training.steps", "4"}})); });
  EXPECT_NE(e.find("checkpoint.enable = false, but"), std::string::npos) << e;
  EXPECT_NE(e.find("(steps 2)"), std::string::npos) << e;
  EXPECT_NE(e.find("set checkpoint.enable = true to resume from step 2"), std::string::npos) << e;
  EXPECT_EQ(read_metrics(dump).size(), 2u);
  // Many committed steps (keep_latest_k = 0 keeps them all) read as the first and last six.
  for (int step = 4; step <= 28; step += 2)
    fs::copy(dump / "checkpoint" / "step-2", dump / "checkpoint" / ("step-" + std::to_string(step)));
  const std::string many = error_of([&] { run_training(tiny_config(dump, {{"training.steps", "4"}})); });
  EXPECT_NE(many.find("(steps 2, 4, 6, 8, 10, 12, ... (2 more), 18, 20, 22, 24, 26, 28)"), std::string::npos)
      << many;
  EXPECT_NE(many.find("set checkpoint.enable = true to resume from step 28"), std::string::npos) << many;
}

// metrics.jsonl that stops taking records (a full disk: /dev/full fails every write with ENOSPC)
// is said at the step it failed and again in the summary; the training itself goes on.
TEST(RunOutputs, AMetricsFileThatStopsTakingRecordsIsSaid) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  const fs::path dump = temp_dir("guard_metrics_disk_full_" + std::to_string(getpid()));
  fs::create_symlink("/dev/full", dump / "metrics.jsonl");
  std::string out;
  const int rc =
      run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                      cli_args(tiny_job(dump, {{"training.steps", "3"}, {"validation.enable", "false"}})),
                  &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string said =
      "warning: metrics: writing '" + (dump / "metrics.jsonl").string() + "' failed at step 1 (";
  const size_t first = out.find(said);
  ASSERT_NE(first, std::string::npos) << out;
  EXPECT_NE(out.find("No space left on device", first), std::string::npos) << out;
  EXPECT_NE(out.find("summary: 3 steps"), std::string::npos) << out;
  EXPECT_NE(out.find(said, first + 1), std::string::npos) << "the summary should repeat it\n" << out;
}

// Outputs that cannot be written, and inputs of the wrong kind, are named before any compute.
TEST(RunOutputs, OutputsThatCannotBeWrittenAreNamedBeforeAnyCompute) {
  const fs::path dump = temp_dir("guard_outputs_kind_" + std::to_string(getpid()));
  std::ofstream(dump / "tb") << "a file where the TensorBoard folder goes";
  std::string out;
  EXPECT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, {{"metrics.enable_tensorboard", "true"}})),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("metrics.enable_tensorboard: '" + (dump / "tb").string() + "' is not a folder"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("step: 1 "), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
  fs::remove(dump / "tb");
  fs::create_directories(dump / "metrics.jsonl");
  EXPECT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump)),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("'" + (dump / "metrics.jsonl").string() + "' is a folder"), std::string::npos) << out;
  // An empty output path, and a weights file given where a config is asked for.
  EXPECT_EQ(run_command(titan_binary().string() + " report " + dump.string() + " --out ''", &out), 1) << out;
  EXPECT_NE(out.find("--out is empty; give it a value or leave it out"), std::string::npos) << out;
  std::ofstream(dump / "model.safetensors") << "not read";
  EXPECT_EQ(
      run_command(titan_binary().string() + " info --model-path " + (dump / "model.safetensors").string(),
                  &out),
      1)
      << out;
  EXPECT_NE(out.find("is neither a checkpoint folder nor its config.json"), std::string::npos) << out;
  // A negative aux-loss weight would reward imbalance: named by the model field.
  EXPECT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(temp_dir("guard_aux_coef_" + std::to_string(getpid())),
                                              {{"model.flavor", "debugmodel_moe"},
                                               {"model.num_experts", "4"},
                                               {"model.top_k", "2"},
                                               {"model.moe_hidden_dim", "32"},
                                               {"model.router_aux_loss_coef", "-1"}})),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("router_aux_loss_coef must be finite and >= 0, got -1"), std::string::npos) << out;
}

// Settings a resume may change on purpose apply from the next step, and the resume says which
// changed; a seed or init scheme changed on a resume is said to have no effect.
TEST(ResumeGuard, ChangedOptimizerSettingsAreSaidOnResume) {
  const fs::path dump = temp_dir("guard_changed_settings_" + std::to_string(getpid()));
  const Overrides first = with(kCheckpointEvery2, {{"training.steps", "2"}, {"validation.enable", "false"}});
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, first)),
                        &out),
            0)
      << out;
  // A fresh run says it found nothing to resume (a mistyped checkpoint.folder would start over unseen).
  EXPECT_NE(out.find("checkpoint: no committed checkpoint in " + (dump / "checkpoint").string() +
                     ": the run starts at step 1"),
            std::string::npos)
      << out;
  out.clear();  // (run_command appends)
  const Overrides changed = with(kCheckpointEvery2, {{"training.steps", "3"},
                                                     {"validation.enable", "false"},
                                                     {"optimizer.name", "Adam"},
                                                     {"optimizer.weight_decay", "0.05"},
                                                     {"training.max_norm", "0.5"},
                                                     {"training.seed", "7"}});
  ASSERT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, changed)),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("note: changed since the checkpoint: optimizer.name \"AdamW\" -> \"Adam\", "
                     "optimizer.weight_decay 0.1 -> "
                     "0.05, training.max_norm "
                     "1.0 -> 0.5, training.seed 42 -> 7 (no effect: the weights are the checkpoint's); the "
                     "changes apply from step 3"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("no committed checkpoint"), std::string::npos) << out;
}

// The MoE balancing is a training choice, not part of the model: a resume may switch the aux loss's
// weight or move to expert biases, and says so. (Both were refused as "a different model": the
// checkpoint's model_config holds output_router_logits and router_aux_loss_coef.)
TEST(ResumeGuard, MoeBalancingChangedOnResumeIsSaid) {
  const fs::path dump = temp_dir("guard_changed_balancing_" + std::to_string(getpid()));
  const Overrides moe = with(kCheckpointEvery2, {{"model.flavor", "debugmodel_moe"},
                                                 {"model.num_experts", "4"},
                                                 {"model.top_k", "2"},
                                                 {"model.moe_hidden_dim", "32"},
                                                 {"validation.enable", "false"}});
  auto train = [&](const Overrides& extra, std::string* out) {
    return run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                           cli_args(tiny_job(dump, with(moe, extra))),
                       out);
  };
  std::string out;
  ASSERT_EQ(train({{"training.steps", "2"}}, &out), 0) << out;
  ASSERT_EQ(train({{"training.steps", "4"}, {"model.router_aux_loss_coef", "0.01"}}, &out), 0) << out;
  EXPECT_NE(out.find("note: changed since the checkpoint: model.router_aux_loss_coef 0.001 -> 0.01; the "
                     "changes apply from step 3"),
            std::string::npos)
      << out;
  // Another micro-batch at the same global batch (accumulation 2) balances over other tokens.
  ASSERT_EQ(train({{"training.steps", "6"},
                   {"model.router_aux_loss_coef", "0.01"},
                   {"training.local_batch_size", "1"},
                   {"training.global_batch_size", "2"}},
                  &out),
            0)
      << out;
  EXPECT_NE(
      out.find("note: changed since the checkpoint: training.local_batch_size 2 -> 1 (the aux loss balances "
               "the experts over each micro-batch's tokens: over other tokens from here); the changes apply "
               "from step 5"),
      std::string::npos)
      << out;
  ASSERT_EQ(train({{"training.steps", "8"}, {"training.load_balance", "expert_bias"}}, &out), 0) << out;
  EXPECT_NE(out.find("note: changed since the checkpoint: model.router_aux_loss_coef 0.01 -> 0.001, "
                     "training.load_balance \"aux_loss\" -> \"expert_bias\"; the changes apply from step 7"),
            std::string::npos)
      << out;
}

// A checkpoint written before a setting joined the resumable settings had its default: a resume
// that changes it says so; one that keeps the default says nothing.
TEST(ResumeGuard, ASettingOlderCheckpointsLackCountsAsItsDefault) {
  const nlohmann::json saved = {{"optimizer.name", "AdamW"}};
  EXPECT_EQ(train::changed_settings(
                saved, {{"optimizer.name", "AdamW"}, {"training.mixed_precision_reduce", "bfloat16"}}),
            "training.mixed_precision_reduce \"float32\" -> \"bfloat16\"");
  EXPECT_EQ(train::changed_settings(
                saved, {{"optimizer.name", "AdamW"}, {"training.mixed_precision_reduce", "float32"}}),
            "");
  EXPECT_EQ(train::changed_settings(saved, {{"optimizer.name", "AdamW"}, {"training.seed", 7}}), "")
      << "a key without a known default is not compared";
  // The aux loss's weight joined the settings later: an older MoE checkpoint's is its model_config's.
  const nlohmann::json older = {{"settings", saved}, {"model_config", {{"router_aux_loss_coef", 0.001}}}};
  EXPECT_EQ(train::changed_settings(train::recorded_settings(older),
                                    {{"optimizer.name", "AdamW"}, {"model.router_aux_loss_coef", 0.01}}),
            "model.router_aux_loss_coef 0.001 -> 0.01");
  EXPECT_EQ(train::changed_settings(train::recorded_settings({{"settings", saved}, {"model_config", {}}}),
                                    {{"optimizer.name", "AdamW"}, {"model.router_aux_loss_coef", 0.01}}),
            "")
      << "a dense checkpoint's model_config has no aux loss weight";
  // The pad id (transformers' padding_idx, which changes the embedding's gradient) joined later too:
  // an older checkpoint's is its model_config's, null for none.
  const nlohmann::json no_pad = {{"settings", saved}, {"model_config", {{"pad_token_id", nullptr}}}};
  EXPECT_EQ(
      train::changed_settings(train::recorded_settings(no_pad),
                              {{"optimizer.name", "AdamW"}, {"model.pad_token_id", 151643}}),
      "model.pad_token_id -1 -> 151643 (transformers' padding_idx: from here the embedding lookup gives "
      "row 151643 no gradient)");
  EXPECT_EQ(train::changed_settings(train::recorded_settings(no_pad),
                                    {{"optimizer.name", "AdamW"}, {"model.pad_token_id", -1}}),
            "");
  // The micro-batch shape is the aux loss's scope: recorded for MoE runs balanced by it.
  EXPECT_EQ(train::changed_settings({{"training.local_batch_size", 4}, {"training.seq_len", 256}},
                                    {{"training.local_batch_size", 2}, {"training.seq_len", 256}}),
            "training.local_batch_size 4 -> 2 (the aux loss balances the experts over each micro-batch's "
            "tokens: over other tokens from here)");
}

// A file (not a folder) named step-N in the checkpoint folder is another program's: set aside before
// the save of step N, not a failure after the step has trained.
TEST(CheckpointPruning, AFileNamedLikeAStepIsSetAsideBeforeTheSave) {
  const fs::path dump = temp_dir("guard_step_file");
  const fs::path ck = dump / "checkpoint";
  fs::create_directories(ck);
  std::ofstream(ck / "step-2") << "precious";
  TrainSummary s = run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  EXPECT_EQ(s.steps_run, 2);
  EXPECT_TRUE(fs::exists(ck / "step-2" / "COMMITTED"));
  EXPECT_EQ(read_bytes(ck / "step-2.foreign"), "precious");
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

  // The same path with a document put before its content (its old bytes moved): refused.
  fs::copy_file(first, data_dir / "first.orig");
  {
    std::ofstream f(first, std::ios::trunc);
    f << "{\"text\": \"one more document\"}\n" << read_bytes(data_dir / "first.orig");
  }
  e = error_of([&] { run_training(config(first, 4)); });
  EXPECT_NE(e.find("bytes changed too"), std::string::npos) << e;
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
  // Its folder, which holds one file more, sorting before it: refused, naming the new one and the rule.
  e = error_of([&] { run_training(config(data_dir, 8)); });
  EXPECT_NE(e.find("the checkpoint's dataset has 1 file, this run's has 2; new: '" + first.string() +
                   "': files added to a dataset resume only when they sort after all of the checkpoint's"),
            std::string::npos)
      << e;
}

// FNV-1a as its authors define it (offset basis 0xcbf29ce484222325), written out here so the test
// does not check titan's hash with itself.
uint64_t standard_fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001b3ull;
  return h;
}

// The checksums an export records are FNV-1a that any tool reproduces. A checkpoint and an export
// written before 2026-12-01, when titan's basis was a digit short of FNV's and files named no hash,
// still verify, resume (dataset fingerprint included) and pass verify-export; a hash name titan
// does not know is an error naming it.
TEST(CheckpointManifest, ChecksumsAreStandardFnv1aAndOlderFilesStillVerify) {
  EXPECT_EQ(standard_fnv1a("a", 1), 0xaf63dc4c8601ec8cull);  // FNV's published test vector
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
  const fs::path dump = temp_dir("guard_hash_basis");
  const fs::path data = temp_dir("guard_hash_basis_data") / "part.jsonl";
  write_corpus_prefix(data, 3 << 20);  // over 2 MiB: the fingerprint samples the first and last MiB
  auto config = [&](int steps) {
    return tiny_config(dump, with(kCheckpointEvery2, {{"training.dataset_path", data.string()},
                                                      {"training.steps", std::to_string(steps)},
                                                      {"checkpoint.last_save_in_hf", "true"}}));
  };
  run_training(config(2));
  const fs::path step = dump / "checkpoint" / "step-2", hf = dump / "checkpoint" / "step-2-hf";
  nlohmann::json sums = read_json(hf / "titan_checksums.json");
  EXPECT_EQ(sums.at("hash"), "fnv1a64");
  EXPECT_EQ(read_json(step / "manifest.json").at("hash"), "fnv1a64");
  const io::SafetensorsFile exported = io::SafetensorsFile::open(hf / "model.safetensors");
  for (const io::TensorInfo& t : exported.tensors()) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)standard_fnv1a(t.data, size_t(t.nbytes())));
    EXPECT_EQ(sums["tensors"][t.name]["checksum"], hex) << t.name;
  }

  // Rewrite both as the older titan wrote them: no hash named, every hash from the older basis.
  const uint64_t older = kFnv1aStartBefore20261201;
  for (const io::TensorInfo& t : exported.tensors())
    sums["tensors"][t.name]["checksum"] = io::tensor_checksum(t, older);
  sums.erase("hash");
  write_json(hf / "titan_checksums.json", sums);
  nlohmann::json state = read_json(step / "train_state.json");
  for (nlohmann::json& file : state.at("dataset_identity")) {
    // The fingerprint: FNV-1a over the size, the first MiB and the last MiB.
    const std::string bytes = read_bytes(file.at("path").get<std::string>());
    const uint64_t size = bytes.size();
    uint64_t h = standard_fnv1a(&size, sizeof size, older);
    h = standard_fnv1a(bytes.data(), 1 << 20, h);
    h = standard_fnv1a(bytes.data() + size - (1 << 20), 1 << 20, h);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    ASSERT_EQ(file.at("fingerprint").get<std::string>().size(), 16u);
    file["fingerprint"] = hex;
    file.erase("hash");
  }
  write_json(step / "train_state.json", state);
  nlohmann::json manifest = read_json(step / "manifest.json");
  manifest.erase("hash");
  for (auto& [name, info] : manifest["files"].items()) {
    info["checksum"] = std::to_string(file_checksum(step / name, nullptr, older));
    info["bytes"] = fs::file_size(step / name);
  }
  write_json(step / "manifest.json", manifest);

  std::string out;
  EXPECT_EQ(run_command(titan_binary().string() + " verify-export " + hf.string(), &out), 0) << out;
  EXPECT_NE(out.find("every tensor matches the checksums recorded at export"), std::string::npos) << out;
  EXPECT_EQ(load_checkpoint_dir(step).step, 2);
  // The older dataset fingerprint still identifies the same data: the resume goes on from step 2.
  TrainSummary s = run_training(config(3));
  EXPECT_EQ(s.steps_run, 1);
  EXPECT_EQ(s.last_step, 3);
  // A flipped bit is still caught under the older basis.
  {
    std::fstream f(step / "train_state.json", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put(' ');
  }
  std::string e = error_of([&] { load_checkpoint_dir(step); });
  EXPECT_NE(e.find("train_state.json' fails its checksum"), std::string::npos) << e;

  // A hash name this titan does not know: said, with the name.
  manifest["hash"] = "xxh3";
  write_json(step / "manifest.json", manifest);
  e = error_of([&] { load_checkpoint_dir(step); });
  EXPECT_NE(e.find("names the checksum hash \"xxh3\", which this titan does not know"), std::string::npos)
      << e;
  sums["hash"] = "xxh3";
  write_json(hf / "titan_checksums.json", sums);
  EXPECT_EQ(run_command(titan_binary().string() + " verify-export " + hf.string(), &out), 1) << out;
  EXPECT_NE(out.find("names the hash \"xxh3\", which this titan does not know"), std::string::npos) << out;
}

// ---------------------------------------------------------------- 2. two writers, titan's own cleanup

TEST(RunLock, ASecondTrainerOnTheSameFolderStopsAtOnceNamingTheHolder) {
  const fs::path dump = temp_dir("guard_lock");
  const std::string me = "pid " + std::to_string(::getpid());
  {
    RunLock held(dump, "job.dump_folder");
    std::string e = error_of([&] { run_training(tiny_config(dump, {{"training.steps", "1"}})); });
    EXPECT_NE(e.find("in use by another titan train"), std::string::npos) << e;
    EXPECT_NE(e.find(me + " on host "), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dump / "metrics.jsonl")) << "the second writer wrote metrics";
    // Another process: exit status 1 with the holder on stderr, before any compute.
    std::string out;
    int rc = run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                             cli_args(tiny_job(dump, {{"training.steps", "1"}})),
                         &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(me + " on host "), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
  }
  // Released (as the kernel releases it when a holder dies): the folder is usable again.
  TrainSummary s = run_training(tiny_config(dump, {{"training.steps", "1"}}));
  EXPECT_EQ(s.steps_run, 1);
}

TEST(RunLock, TwoRunsSharingOneCheckpointFolderAreRefused) {
  // Different dump folders, one absolute checkpoint.folder: the second run would replace the first
  // one's checkpoints, or resume from them.
  const fs::path shared = temp_dir("guard_lock_shared_checkpoints");
  const fs::path dump = temp_dir("guard_lock_second_run");
  const Overrides to_shared = {{"checkpoint.enable", "true"}, {"checkpoint.folder", shared.string()}};
  {
    RunLock held(shared, "checkpoint.folder");
    std::string e = error_of([&] {
      run_training(tiny_config(dump, with(to_shared, {{"training.steps", "1"}})));
    });
    EXPECT_NE(e.find("checkpoint.folder: '" + shared.string() + "' is in use by another titan train"),
              std::string::npos)
        << e;
    EXPECT_FALSE(fs::exists(dump / "metrics.jsonl")) << "the second writer trained";
  }
  EXPECT_EQ(run_training(tiny_config(dump, with(to_shared, {{"training.steps", "1"}}))).steps_run, 1);
  EXPECT_TRUE(fs::exists(shared / "step-1" / "COMMITTED"));
  // A checkpoint folder that is the dump folder itself is one folder, one lock.
  const fs::path same = temp_dir("guard_lock_same_folder");
  TrainSummary s = run_training(tiny_config(
      same, {{"checkpoint.enable", "true"}, {"checkpoint.folder", same.string()}, {"training.steps", "1"}}));
  EXPECT_EQ(s.steps_run, 1);
}

TEST(CheckpointPruning, FoldersTitanDidNotWriteAreNeverDeleted) {
  const fs::path dump = temp_dir("guard_foreign_steps");
  const fs::path ck = dump / "checkpoint";
  // Another program's checkpoints: one with a COMMITTED file of its own, one without.
  fs::create_directories(ck / "step-0");
  std::ofstream(ck / "step-0" / "COMMITTED") << "theirs\n";
  std::ofstream(ck / "step-0" / "weights.bin") << "precious";
  fs::create_directories(ck / "step-1");
  std::ofstream(ck / "step-1" / "model.pt") << "precious";
  // And two in the way of this run's saves: step 2's checkpoint and step 6's export.
  fs::create_directories(ck / "step-2");
  std::ofstream(ck / "step-2" / "model.pt") << "precious";
  fs::create_directories(ck / "step-6-hf");
  std::ofstream(ck / "step-6-hf" / "config.json") << "{}";
  // A step number past int64 is nobody's step: left alone, no error.
  fs::create_directories(ck / "step-99999999999999999999");
  TrainSummary s = run_training(tiny_config(
      dump, with(kCheckpointEvery2, {{"training.steps", "6"}, {"checkpoint.last_save_in_hf", "true"}})));
  EXPECT_EQ(s.steps_run, 6) << "resumed from a folder titan did not write";
  // (and the run lock of the checkpoint folder, RunLock)
  EXPECT_EQ(listing(ck), (std::vector<std::string>{".titan-rank0.lock", "step-0", "step-1", "step-2.foreign",
                                                   "step-4", "step-6", "step-6-hf", "step-6-hf.previous",
                                                   "step-99999999999999999999"}));
  EXPECT_EQ(listing(ck / "step-0"), (std::vector<std::string>{"COMMITTED", "weights.bin"}));
  EXPECT_EQ(listing(ck / "step-1"), (std::vector<std::string>{"model.pt"}));
  EXPECT_EQ(listing(ck / "step-2.foreign"), (std::vector<std::string>{"model.pt"}));
  EXPECT_EQ(listing(ck / "step-6-hf.previous"), (std::vector<std::string>{"config.json"}));
  // The trainer names them (they are why it started from scratch).
  EXPECT_EQ(CheckpointManager(ck, 2).foreign_step_dirs(),
            (std::vector<fs::path>{ck / "step-0", ck / "step-1"}));
}

TEST(CheckpointPruning, AnInterruptedSaveIsNamedIgnoredAndReplaced) {
  const fs::path dump = temp_dir("guard_interrupted_save");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  fs::remove(ck / "step-2" / "COMMITTED");  // killed between the folder's rename and its marker
  EXPECT_EQ(CheckpointManager(ck, 2).interrupted_step_dirs(), (std::vector<fs::path>{ck / "step-2"}));
  // A rank killed while it wrote its shards leaves the save's temporary (pid 999999999: gone).
  const fs::path temporary = ck / ".step-4.tmp-999999999-0";
  fs::create_directories(temporary);
  std::ofstream(temporary / "model-rank0.safetensors") << "cut short";
  EXPECT_EQ(CheckpointManager(ck, 2).unfinished_saves(), (std::vector<fs::path>{temporary}));
  std::string out;
  // A run that saves nothing says the debris stays, and leaves it.
  ASSERT_EQ(
      run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                      cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.steps", "2"},
                                                                       {"checkpoint.load_only", "true"}}))),
                  &out),
      0)
      << out;
  EXPECT_NE(out.find("checkpoint: ignoring " + temporary.string() +
                     ": a save that never finished (the process writing it is gone); it stays: "
                     "checkpoint.load_only saves nothing"),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(temporary));
  out.clear();
  const int rc = run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                                 cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.steps", "2"}}))),
                             &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("checkpoint: ignoring " + (ck / "step-2").string() +
                     ": a save or a deletion that never finished"),
            std::string::npos)
      << out;
  EXPECT_NE(
      out.find("checkpoint: ignoring " + temporary.string() +
               ": a save that never finished (the process writing it is gone); the next save removes it"),
      std::string::npos)
      << out;
  EXPECT_EQ(out.find("resumed from"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(ck / "step-2" / "COMMITTED")) << "the new save of step 2 replaced the debris";
  EXPECT_TRUE(CheckpointManager(ck, 2).interrupted_step_dirs().empty());
  EXPECT_FALSE(fs::exists(temporary));
}

TEST(ResumeGuard, ACheckpointAtOrPastTrainingStepsTrainsNothingAndSaysSo) {
  const fs::path dump = temp_dir("guard_nothing_to_train");
  const Overrides export_at_end = {{"checkpoint.last_save_in_hf", "true"}};
  run_training(tiny_config(dump, with(with(kCheckpointEvery2, export_at_end), {{"training.steps", "4"}})));
  const fs::path hf = dump / "checkpoint" / "step-4-hf";
  const auto written = fs::last_write_time(hf / "model.safetensors");
  std::string out;
  const int rc = run_command(
      titan_binary().string() + " train --config " + debugmodel_toml().string() +
          cli_args(tiny_job(dump, with(with(kCheckpointEvery2, export_at_end), {{"training.steps", "2"}}))),
      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step 4 is already at or past training.steps = 2: nothing to train"), std::string::npos)
      << out;
  EXPECT_NE(out.find("summary: 0 steps (last step 4), no final loss"), std::string::npos) << out;
  // No schedule is run, so none differs from the checkpoint's (steps 4 then 2 read as "saved 4, now 2").
  EXPECT_EQ(out.find("LR schedule differs"), std::string::npos) << out;
  EXPECT_EQ(read_metrics(dump).size(), 4u);
  EXPECT_EQ(fs::last_write_time(hf / "model.safetensors"), written) << "the export was written again";
}

// An initial load is for a run with nothing to resume: a resumed run says it left it unused
// (pointing at another run's checkpoint, it would otherwise look loaded).
TEST(ResumeGuard, AnInitialLoadPathLeftUnusedByAResumeIsSaid) {
  const fs::path dump = temp_dir("guard_initial_load_on_resume");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  std::string out;
  const int rc = run_command(
      titan_binary().string() + " train --config " + debugmodel_toml().string() +
          cli_args(tiny_job(
              dump, with(kCheckpointEvery2,
                         {{"training.steps", "3"},
                          {"checkpoint.initial_load_path", "/elsewhere/step-9"},
                          {"training.seed", "7"}}))),
      &out);
  ASSERT_EQ(rc, 0) << out;
  const size_t note = out.find(
      "note: checkpoint.initial_load_path = \"/elsewhere/step-9\": no effect, the run resumes from step 2 in '" +
      (dump / "checkpoint").string() +
      "' (the initial load is for a run with nothing to resume); training.seed = 7: no effect either, the "
      "resume continues the saved weights");
  EXPECT_NE(note, std::string::npos) << out;
  // Said after the start-up header, and the seed's note does not give the unused initial load as its
  // reason.
  EXPECT_LT(out.find("titan train"), note) << out;
  EXPECT_EQ(out.find("the job starts from loaded weights"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  // run_info.json (what titan report shows beside the curves) keeps the notes as the start-up said them.
  EXPECT_EQ(
      read_json(dump / "run_info.json").at("config_notes").dump().find("the job starts from loaded weights"),
      std::string::npos);
}

TEST(ResumeGuard, AChangedSeqLenIsRefusedNamingTheKeyAndTheWayOut) {
  const fs::path dump = temp_dir("guard_seq_len_change");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  std::string e = error_of([&] {
    run_training(
        tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}, {"training.seq_len", "32"}})));
  });
  EXPECT_NE(e.find("trained with training.seq_len = 64 but this run has 32"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.restart_data_stream = true"), std::string::npos) << e;
  TrainSummary s =
      run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"},
                                                              {"training.seq_len", "32"},
                                                              {"checkpoint.restart_data_stream", "true"}})));
  EXPECT_EQ(s.steps_run, 2);
}

// A folder made to refuse new entries, as `chmod a-w` does for a user; root writes through
// permissions, so for root the folder is made immutable (chattr +i), which stops root too. Undone
// when it goes. why_not() says why it could not be done ("" when it was).
class UnwritableFolder {
 public:
  explicit UnwritableFolder(fs::path dir) : dir_(std::move(dir)) {
    if (::geteuid() != 0) {
      fs::permissions(dir_, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                      fs::perm_options::remove);
      made_ = true;
      return;
    }
    std::string out;
    made_ = immutable_ = run_command("chattr +i '" + dir_.string() + "'", &out) == 0;
    if (!made_)
      why_not_ = "root writes through permissions, and `chattr +i` (an immutable folder) failed here: " + out;
  }
  ~UnwritableFolder() {
    std::string out;
    if (immutable_)
      run_command("chattr -i '" + dir_.string() + "'", &out);
    else if (made_)
      fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::add);
  }
  UnwritableFolder(const UnwritableFolder&) = delete;
  UnwritableFolder& operator=(const UnwritableFolder&) = delete;
  const std::string& why_not() const { return why_not_; }

 private:
  fs::path dir_;
  bool made_ = false, immutable_ = false;
  std::string why_not_;
};

// A checkpoint or dump folder that cannot be written is found at start-up, before any step, not at the
// first save with the steps since the last checkpoint lost; a run that writes nothing there starts.
TEST(OutputGuard, FoldersThatCannotBeWrittenAreRefusedBeforeAnyStep) {
  const fs::path dump = temp_dir("guard_unwritable");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  ASSERT_EQ(read_metrics(dump).size(), 2u);
  {
    UnwritableFolder ro(ck);
    if (!ro.why_not().empty()) GTEST_SKIP() << ro.why_not();
    const std::string e = error_of([&] {
      run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
    });
    EXPECT_NE(e.find("checkpoint.folder: '" + ck.string() +
                     "' cannot be written (creating a folder in it failed: "),
              std::string::npos)
        << e;
    EXPECT_NE(
        e.find("the run saves its checkpoints there (checkpoint.enable = true); make it writable or choose "
               "another checkpoint.folder"),
        std::string::npos)
        << e;
    EXPECT_EQ(read_metrics(dump).size(), 2u) << "a step trained before the refusal";
    // checkpoint.load_only: the run resumes and saves nothing there.
    EXPECT_EQ(run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "3"},
                                                                      {"checkpoint.load_only", "true"}})))
                  .steps_run,
              1);
  }
  {
    UnwritableFolder ro(dump);
    const std::string e = error_of([&] {
      run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
    });
    EXPECT_NE(e.find("job.dump_folder: '" + dump.string() +
                     "' cannot be written (creating a folder in it failed: "),
              std::string::npos)
        << e;
    EXPECT_EQ(read_metrics(dump).size(), 3u) << "a step trained before the refusal";
  }
  EXPECT_EQ(CheckpointManager(ck, 0).committed_steps(), std::vector<int64_t>{2});
}

// A checkpoint folder that stops taking writes mid-run (its permissions changed after start-up): the
// save fails as one on a full disk does, naming the step and that no checkpoint was written.
TEST(OutputGuard, ACheckpointFolderUnwritableAtASaveNamesTheStep) {
  const fs::path dump = temp_dir("guard_unwritable_mid_run");
  const fs::path ck = dump / "checkpoint", log = dump.parent_path() / "guard_unwritable_mid_run.log";
  std::vector<std::string> argv = {titan_binary().string(), "train", "--config", debugmodel_toml().string()};
  for (auto& [k, v] : tiny_job(
           dump,
           {{"training.steps", "100000"}, {"checkpoint.enable", "true"}, {"checkpoint.interval", "100000"}}))
    argv.push_back("--" + k + "=" + v);
  const pid_t pid = spawn_logged(argv, log);
  ASSERT_GT(pid, 0);
  int status = 0;
  bool exited = false;
  // Until a step is logged (a whole line of metrics.jsonl), or the run ends.
  for (auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::minutes(5) &&
       read_bytes(dump / "metrics.jsonl").find('\n') == std::string::npos;) {
    if ((exited = waitpid(pid, &status, WNOHANG) == pid)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(exited) << read_bytes(log);
  std::string out;
  {
    UnwritableFolder ro(ck);
    if (!ro.why_not().empty()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      GTEST_SKIP() << ro.why_not();
    }
    ASSERT_EQ(kill(pid, SIGTERM), 0);  // the run saves its step, and stops
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    out = read_bytes(log);
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  const size_t error = out.find("titan train: error: step ");
  EXPECT_NE(error, std::string::npos) << out;
  EXPECT_NE(
      out.find(": no checkpoint written: cannot create temporary directory \"" + ck.string() + "/.step-",
               error),
      std::string::npos)
      << out;
  EXPECT_TRUE(CheckpointManager(ck, 0).committed_steps().empty());
}

// titan export into a folder that cannot be written says so, naming it, before it writes anything.
TEST(OutputGuard, AnExportIntoAFolderThatCannotBeWrittenIsRefusedNamingIt) {
  const fs::path dump = temp_dir("guard_export_unwritable");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const std::string export_cmd = titan_binary().string() + " export --checkpoint " +
                                 (dump / "checkpoint" / "step-2").string() + " --out ";
  std::string out;
  std::ofstream(dump / "a_file") << "not a folder";
  EXPECT_EQ(run_command(export_cmd + (dump / "a_file" / "hf").string(), &out), 1) << out;
  EXPECT_NE(
      out.find("titan export: error: --out: '" + (dump / "a_file").string() + "' cannot be written ('" +
               (dump / "a_file").string() + "' is not a folder): the export is built there, then moved to '" +
               (dump / "a_file" / "hf").string() + "'; export elsewhere"),
      std::string::npos)
      << out;
  fs::create_directories(dump / "exports");
  UnwritableFolder ro(dump / "exports");
  if (!ro.why_not().empty()) GTEST_SKIP() << ro.why_not();
  EXPECT_EQ(run_command(export_cmd + (dump / "exports" / "hf").string(), &out), 1) << out;
  EXPECT_NE(out.find("titan export: error: --out: '" + (dump / "exports").string() +
                     "' cannot be written (creating a folder in it failed: "),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::is_empty(dump / "exports"));
}

// An export over an existing folder names the flag that replaces it.
TEST(OutputGuard, AnExportOverAnExistingFolderNamesOverwrite) {
  const fs::path dump = temp_dir("guard_export_exists");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  fs::create_directories(dump / "hf");
  std::ofstream(dump / "hf" / "notes.txt") << "kept";
  std::string out;
  EXPECT_EQ(run_command(titan_binary().string() + " export --checkpoint " +
                            (dump / "checkpoint" / "step-2").string() + " --out " + (dump / "hf").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(
      out.find("titan export: error: --out: '" + (dump / "hf").string() +
               "' already exists (refusing to overwrite it): --overwrite replaces an earlier export (or "
               "an empty folder) there; or export elsewhere"),
      std::string::npos)
      << out;
  EXPECT_EQ(read_bytes(dump / "hf" / "notes.txt"), "kept");
}

TEST(OutputGuard, ExportAndDebugDumpRefuseToOverwriteTheirInputsOrCheckpoints) {
  const fs::path dump = temp_dir("guard_outputs");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const fs::path step = ck / "step-2";
  const fs::path holder = temp_dir("guard_outputs_holder");
  fs::create_directories(holder / "old");
  fs::copy(step, holder / "old" / "step-2", fs::copy_options::recursive);
  auto exported = [&](const fs::path& out, std::string* output) {
    return run_command(titan_binary().string() + " export --checkpoint " + step.string() + " --out " +
                           out.string() + " --overwrite",
                       output);
  };
  struct Case {
    fs::path out;
    std::string rule;
  };
  for (const Case& c :
       {Case{step, "is the input"}, Case{ck, "contains the input"}, Case{dump, "contains the input"},
        Case{step / "hf", "lies inside the input"}, Case{holder, "holds the titan checkpoint"},
        Case{holder / "old" / "step-2" / "hf", "lies inside the titan checkpoint"}}) {
    std::string out;
    EXPECT_EQ(exported(c.out, &out), 1) << c.out << ": " << out;
    EXPECT_NE(out.find(c.rule), std::string::npos) << c.out << ": " << out;
  }
  EXPECT_EQ(load_checkpoint_dir(step).step, 2);  // intact, checksums and all
  EXPECT_EQ(load_checkpoint_dir(holder / "old" / "step-2").step, 2);

  // --overwrite replaces an earlier export only: not a folder of other things, not the shell's folder.
  const fs::path notes = holder / "notes";
  fs::create_directories(notes / "sub");
  std::ofstream(notes / "notes.txt") << "important";
  {
    std::string out;
    EXPECT_EQ(exported(notes, &out), 1) << out;
    EXPECT_NE(out.find("is not a Hugging Face export (no config.json beside model.safetensors)"),
              std::string::npos)
        << out;
    EXPECT_TRUE(fs::exists(notes / "notes.txt"));
    ASSERT_EQ(exported(holder / "hf", &out), 0) << out;  // a first export, then its replacement
    ASSERT_EQ(exported(holder / "hf", &out), 0) << out;
    fs::create_directories(holder / "hf" / "shell");
    EXPECT_EQ(run_command("cd " + (holder / "hf" / "shell").string() + " && " + titan_binary().string() +
                              " export --checkpoint " + step.string() + " --out .. --overwrite",
                          &out),
              1)
        << out;
    EXPECT_NE(out.find("holds the working directory"), std::string::npos) << out;
  }

  // A killed export's temporary is cleaned by the next export to the same place; a live
  // process' temporary (this test's pid) is left alone.
  const fs::path stale = dump / ".hf.tmp-999999999-0",
                 live = dump / (".hf.tmp-" + std::to_string(::getpid()) + "-0");
  fs::create_directories(stale);
  fs::create_directories(live);
  std::ofstream(stale / "model.safetensors") << "half written";
  std::string out;
  ASSERT_EQ(exported(dump / "hf", &out), 0) << out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  fs::remove_all(live);

  // debug dump: the output may be neither the tokens file nor inside the model folder.
  const fs::path tokens = dump / "tokens.safetensors";
  const std::vector<int64_t> ids = {1, 2, 3, 4};
  const std::vector<io::TensorWrite> token_tensors = {{"input_ids", DType::I64, {1, 4}, ids.data()}};
  io::write_safetensors(tokens, token_tensors);
  const std::string before = read_bytes(tokens);
  for (const Case& c :
       {Case{tokens, "is the input"}, Case{dump / "hf" / "model.safetensors", "lies inside the input"},
        Case{step / "model-rank0.safetensors", "lies inside the titan checkpoint"}}) {
    out.clear();
    int rc = run_command(titan_binary().string() + " debug dump --model-path " + (dump / "hf").string() +
                             " --tokens " + tokens.string() + " --out " + c.out.string(),
                         &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(c.rule), std::string::npos) << out;
  }
  EXPECT_EQ(read_bytes(tokens), before);
  EXPECT_EQ(load_checkpoint_dir(step).step, 2);  // still intact
  // One token per row leaves nothing to predict: named, not a loss of 0.
  const std::vector<int64_t> one = {7};
  const std::vector<io::TensorWrite> one_token = {{"input_ids", DType::I64, {1, 1}, one.data()}};
  io::write_safetensors(dump / "one.safetensors", one_token);
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " debug dump --model-path " + (dump / "hf").string() +
                            " --tokens " + (dump / "one.safetensors").string() + " --out " +
                            (dump / "one_out.safetensors").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("needs B >= 1 rows of S >= 2 tokens"), std::string::npos) << out;
  // An id past the vocabulary names the tokens file and the element, before any compute.
  const std::vector<int64_t> past_vocab = {1, 2, 3, 1 << 30};
  const std::vector<io::TensorWrite> past_vocab_tensors = {
      {"input_ids", DType::I64, {2, 2}, past_vocab.data()}};
  io::write_safetensors(dump / "oov.safetensors", past_vocab_tensors);
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " debug dump --model-path " + (dump / "hf").string() +
                            " --tokens " + (dump / "oov.safetensors").string() + " --out " +
                            (dump / "oov_out.safetensors").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find((dump / "oov.safetensors").string() +
                     ": input_ids[1][1] = 1073741824 is outside the vocabulary"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dump / "oov_out.safetensors"));
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " verify-export " + (dump / "hf").string(), &out), 0)
      << out;
  // A dataset too small for the loss batch is a FAIL row naming the file; the rows after it still run.
  std::ofstream(dump / "tiny.txt") << "Too short.\n";
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " verify-export " + (dump / "hf").string() + " --dataset " +
                            (dump / "tiny.txt").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(
      out.find("FAIL  loss on one batch: " + (dump / "tiny.txt").string() + " holds fewer than one batch"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("checksums"), std::string::npos) << out;  // the bit-for-bit row ran
  EXPECT_NE(out.find("verify-export FAILED: 1 check(s) failed"), std::string::npos) << out;

  // titan report and titan tokenize never write over what they read.
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " report " + dump.string() + " --out " +
                            (dump / "metrics.jsonl").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("titan report: error: --out: '" + (dump / "metrics.jsonl").string() + "' is the input"),
            std::string::npos)
      << out;
  EXPECT_EQ(run_command(titan_binary().string() + " report " + dump.string() + " --out " +
                            (dump / "report.html").string(),
                        &out),
            0)
      << out;  // beside them is fine
  std::ofstream(dump / "texts.json") << "[\"hello\"]";
  out.clear();
  EXPECT_NE(run_command(titan_binary().string() + " tokenize --input " + (dump / "texts.json").string() +
                            " --output " + (dump / "texts.json").string(),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("is the input"), std::string::npos) << out;
  EXPECT_EQ(read_bytes(dump / "texts.json"), "[\"hello\"]");
}

// ---------------------------------------------------------------- 4. sizes checked before use

TEST(SizeGuard, AnAbsurdSeqLenOrANonRegularDatasetStopsBeforeAnyCompute) {
  const fs::path dump = temp_dir("guard_sizes");
  std::string e = error_of([&] { run_training(tiny_config(dump, {{"training.seq_len", "99999999999"}})); });
  EXPECT_NE(e.find("training.seq_len = 99999999999 exceeds the limit"), std::string::npos) << e;
  // Below the bound but past the model's positions: both numbers named.
  e = error_of([&] { run_training(tiny_config(dump, {{"training.seq_len", "2000000000"}})); });
  EXPECT_NE(e.find("training.seq_len = 2000000000 exceeds the model's max_seq_len"), std::string::npos) << e;
  // A batch far beyond this machine: the meta device's profile and the available memory, named.
  e = error_of([&] { run_training(tiny_config(dump, {{"training.local_batch_size", "20000000"}})); });
  EXPECT_NE(e.find("needs an estimated"), std::string::npos) << e;
  EXPECT_NE(e.find("but this machine's MemAvailable is "), std::string::npos) << e;
  const fs::path fifo = dump / "corpus.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  e = error_of([&] { run_training(tiny_config(dump, {{"training.dataset_path", fifo.string()}})); });
  EXPECT_NE(e.find("is a FIFO"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// ---------------------------------------------------------------- 5. checks that cannot be fooled

// A checkpoint names its tokenizer by path; a file replaced there since (a re-download, another
// model's assets) is not exported under the model: the export stops unless --tokenizer names the
// one to ship (said in a note when it is not the trained one).
TEST(VerifyExport, AnExportRefusesATokenizerReplacedSinceTraining) {
  const fs::path dump = temp_dir("guard_export_tokenizer");
  const fs::path assets = temp_dir("guard_export_tokenizer_assets");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(data::default_tokenizer_path() / f, assets / f);
  run_training(tiny_config(
      dump, with(kCheckpointEvery2, {{"training.steps", "2"}, {"model.hf_assets_path", assets.string()}})));
  {  // the same path, another tokenizer: the bundled one less its last 1000 merges
    nlohmann::json t = nlohmann::json::parse(std::ifstream(assets / "tokenizer.json"));
    auto& merges = t["model"]["merges"];
    merges.erase(merges.end() - 1000, merges.end());
    std::ofstream(assets / "tokenizer.json") << t.dump();
  }
  const fs::path step = dump / "checkpoint" / "step-2";
  const std::string export_cmd =
      titan_binary().string() + " export --checkpoint " + step.string() + " --out ";
  std::string out;
  EXPECT_EQ(run_command(export_cmd + (dump / "hf").string(), &out), 1) << out;
  EXPECT_NE(out.find("titan export: error: the tokenizer at '" + assets.string() +
                     "' (the run's, as its train_state.json names it) is not the one the checkpoint '" +
                     step.string() + "' was trained with"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dump / "hf"));
  // The trained one, named: exported with it, without a note.
  ASSERT_EQ(run_command(export_cmd + (dump / "hf").string() + " --tokenizer " +
                            data::default_tokenizer_path().string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(out.find("note:"), std::string::npos) << out;
  EXPECT_EQ(read_bytes(dump / "hf" / "tokenizer.json"),
            read_bytes(data::default_tokenizer_path() / "tokenizer.json"));
  // Another one, named on purpose: exported with a note.
  ASSERT_EQ(run_command(export_cmd + (dump / "hf_other").string() + " --tokenizer " + assets.string(), &out),
            0)
      << out;
  EXPECT_NE(out.find("note: --tokenizer '" + assets.string() +
                     "' is not the tokenizer the checkpoint was trained with"),
            std::string::npos)
      << out;
}

TEST(VerifyExport, ATamperedExportFailsWithAndWithoutTheSource) {
  const fs::path dump = temp_dir("guard_verify");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const fs::path step = dump / "checkpoint" / "step-2", hf = dump / "hf";
  std::string out;
  ASSERT_EQ(
      run_command(titan_binary().string() + " export --checkpoint " + step.string() + " --out " + hf.string(),
                  &out),
      0)
      << out;
  auto verify = [&](bool with_source, std::string* o) {
    o->clear();
    return run_command(titan_binary().string() + " verify-export " + hf.string() +
                           (with_source ? " --source " + step.string() : std::string()),
                       o);
  };
  EXPECT_EQ(verify(true, &out), 0) << out;
  EXPECT_NE(out.find("bit for bit"), std::string::npos) << out;
  EXPECT_EQ(verify(false, &out), 0) << out;
  EXPECT_NE(out.find("checksums recorded at export"), std::string::npos) << out;

  // Without its tokenizer the export fails that row, skips the loss row, and its tensors are still
  // checked; the summary line says how many rows failed.
  fs::rename(hf / "tokenizer.json", dump / "tokenizer.json");
  EXPECT_EQ(verify(true, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  tokenizer.json present"), std::string::npos) << out;
  EXPECT_NE(out.find("SKIP  loss on one batch"), std::string::npos) << out;
  EXPECT_NE(out.find("PASS  every tensor equals the source checkpoint bit for bit"), std::string::npos)
      << out;
  EXPECT_NE(out.find("verify-export FAILED: 1 check(s) failed"), std::string::npos) << out;
  std::ofstream(hf / "tokenizer.json") << "{ not json";
  EXPECT_EQ(verify(true, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  tokenizer.json present but does not load"), std::string::npos) << out;
  fs::remove(hf / "tokenizer.json");
  fs::rename(dump / "tokenizer.json", hf / "tokenizer.json");
  EXPECT_EQ(verify(true, &out), 0) << out;

  // config.json edited after the export (another rope_theta: it loads, and computes another model)
  // fails without the source too: the export recorded the checksum of every file it wrote.
  const std::string config = read_bytes(hf / "config.json");
  {
    nlohmann::json c = nlohmann::json::parse(config);
    c["rope_theta"] = 10000.0;
    c["rope_parameters"]["rope_theta"] = 10000.0;
    std::ofstream(hf / "config.json") << c.dump(2);
  }
  EXPECT_EQ(verify(false, &out), 1) << out;
  EXPECT_NE(out.find("config.json changed since the export"), std::string::npos) << out;
  std::ofstream(hf / "config.json") << config;
  EXPECT_EQ(verify(false, &out), 0) << out;
  // config.json, generation_config.json (a run from random weights records its stop tokens) and the
  // tokenizer's two files.
  EXPECT_NE(out.find("and 4 other files"), std::string::npos) << out;
  // float32 tensors labelled float16: the dtype row fails naming a tensor (compared with the source,
  // so the edited config.json is the only fault).
  {
    nlohmann::json c = nlohmann::json::parse(config);
    c["dtype"] = "float16";
    std::ofstream(hf / "config.json") << c.dump(2);
  }
  EXPECT_EQ(verify(true, &out), 1) << out;
  EXPECT_NE(out.find("FAIL  every tensor is float16 as config.json says (model."), std::string::npos) << out;
  EXPECT_NE(out.find(" is f32)"), std::string::npos) << out;
  std::ofstream(hf / "config.json") << config;

  // A checksum entry of the wrong JSON type is a FAIL row naming the tensor, not a stop.
  const std::string sums = read_bytes(hf / "titan_checksums.json");
  {
    nlohmann::json s = nlohmann::json::parse(sums);
    s["tensors"]["model.norm.weight"]["checksum"] = 5;
    std::ofstream(hf / "titan_checksums.json") << s.dump(2);
  }
  EXPECT_EQ(verify(false, &out), 1) << out;
  EXPECT_NE(out.find("model.norm.weight's entry in titan_checksums.json is malformed"), std::string::npos)
      << out;
  std::ofstream(hf / "titan_checksums.json") << sums;
  EXPECT_EQ(verify(false, &out), 0) << out;

  // Another model's checkpoint as the source: the field that differs is named.
  const fs::path other = temp_dir("guard_verify_other");
  run_training(
      tiny_config(other, with(kCheckpointEvery2, {{"training.steps", "2"}, {"model.n_layers", "1"}})));
  out.clear();
  EXPECT_EQ(run_command(titan_binary().string() + " verify-export " + hf.string() + " --source " +
                            (other / "checkpoint" / "step-2").string(),
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("the source is another model (n_layers = 1 in the source, 2 in the export)"),
            std::string::npos)
      << out;

  // One mantissa bit of the last weight: the loss moves by far less than any tolerance.
  const fs::path weights = hf / "model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = std::streamoff(fs::file_size(weights) - 4);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 1);
    f.seekp(at);
    f.write(&c, 1);
  }
  EXPECT_EQ(verify(true, &out), 1) << out;
  EXPECT_NE(out.find("differs from the source"), std::string::npos) << out;
  EXPECT_EQ(verify(false, &out), 1) << out;
  EXPECT_NE(out.find("does not match its recorded checksum"), std::string::npos) << out;
  // No recorded checksums and no source: nothing vouches for the tensors, so it fails.
  fs::remove(hf / "titan_checksums.json");
  EXPECT_EQ(verify(false, &out), 1) << out;
  EXPECT_NE(out.find("titan_checksums.json missing"), std::string::npos) << out;
}

TEST(CheckpointManifest, EveryFileMustBeListedAndEveryListedFilePresent) {
  const fs::path dump = temp_dir("guard_manifest");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const fs::path step = dump / "checkpoint" / "step-2";
  ASSERT_EQ(load_checkpoint_dir(step).step, 2);
  const std::string manifest = read_bytes(step / "manifest.json");

  // A file the manifest does not list.
  std::ofstream(step / "extra.safetensors") << "unlisted";
  std::string e = error_of([&] { load_checkpoint_dir(step); });
  EXPECT_NE(e.find("'extra.safetensors' which manifest.json does not list"), std::string::npos) << e;
  fs::remove(step / "extra.safetensors");

  // An entry removed from the manifest: its file is no longer vouched for.
  for (const char* name : {"model-rank0.safetensors", "optimizer-rank0.safetensors", "train_state.json"}) {
    nlohmann::json m = nlohmann::json::parse(manifest);
    m["files"].erase(name);
    std::ofstream(step / "manifest.json") << m.dump(2);
    e = error_of([&] { load_checkpoint_dir(step); });
    EXPECT_NE(e.find(std::string("'") + name + "' which manifest.json does not list"), std::string::npos)
        << e;
  }
  // A listed file that is missing.
  std::ofstream(step / "manifest.json") << manifest;
  fs::rename(step / "train_state.json", dump / "train_state.json");
  e = error_of([&] { load_checkpoint_dir(step); });
  EXPECT_NE(e.find("lacks 'train_state.json' listed in manifest.json"), std::string::npos) << e;
  fs::rename(dump / "train_state.json", step / "train_state.json");
  EXPECT_EQ(load_checkpoint_dir(step).step, 2);
}

TEST(CheckpointManifest, ExtraOrNonFiniteTensorsAreRefusedByName) {
  const fs::path dump = temp_dir("guard_checkpoint_contents");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const fs::path step = dump / "checkpoint" / "step-2";
  const fs::path pristine = temp_dir("guard_checkpoint_contents_copy") / "step-2";
  fs::copy(step, pristine, fs::copy_options::recursive);
  auto restore_pristine = [&] {
    fs::remove_all(step);
    fs::copy(pristine, step, fs::copy_options::recursive);
  };
  auto resume_error = [&] {
    return error_of([&] {
      run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
    });
  };

  // Tensors the model does not have: another model's or another program's files.
  static const float extra[2] = {1, 2};
  rewrite_model_file(step, [](std::vector<io::TensorWrite>& w) {
    w.push_back({"garbage", DType::F32, {2}, extra});
    w.push_back({"layers.7.attention.wq.weight", DType::F32, {2}, extra});
  });
  std::string e = resume_error();
  EXPECT_NE(e.find("holds 2 tensor(s) this model's checkpoint does not have: 'garbage', "
                   "'layers.7.attention.wq.weight'"),
            std::string::npos)
      << e;
  restore_pristine();

  // A NaN in a weight: named at load, never a non-finite loss at the first step.
  static std::vector<float> norm;
  rewrite_model_file(step, [](std::vector<io::TensorWrite>& w) {
    for (auto& t : w)
      if (t.name == "norm.weight") {
        norm.assign(static_cast<const float*>(t.data),
                    static_cast<const float*>(t.data) + titan::shape_numel(t.shape));
        norm[3] = std::nanf("");
        t.data = norm.data();
      }
  });
  e = resume_error();
  EXPECT_NE(e.find("'norm.weight' holds a non-finite value (nan)"), std::string::npos) << e;
  EXPECT_EQ(read_metrics(dump).size(), 2u) << "a refused resume took a step";
  restore_pristine();
  EXPECT_EQ(run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}}))).steps_run, 2);
}

// Expert biases steer an MoE's routing and have no place in Qwen3MoeForCausalLM: both exports say
// that the exported model routes without them.
TEST(OutputGuard, AnExportOfAnExpertBiasModelSaysTheBiasesAreLeftOut) {
  const fs::path dump = temp_dir("guard_expert_bias_export");
  const Overrides moe = {{"model.flavor", "debugmodel_moe"},
                         {"model.num_experts", "4"},
                         {"model.top_k", "2"},
                         {"model.moe_hidden_dim", "32"},
                         {"training.load_balance", "expert_bias"},
                         {"training.steps", "2"},
                         {"checkpoint.enable", "true"},
                         {"checkpoint.last_save_in_hf", "true"}};
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, moe)),
                        &out),
            0)
      << out;
  const std::string warning = "warning: the model was trained with expert biases";
  EXPECT_NE(out.find(warning), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run_command(titan_binary().string() + " export --checkpoint " +
                            (dump / "checkpoint" / "step-2").string() + " --out " + (dump / "hf").string(),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find(warning), std::string::npos) << out;
}

// The global batch is recorded: a resume that changes it (here global_batch_size 4 -> -1, as a
// resume on another rank count does with -1) says so and how to keep it.
TEST(ResumeGuard, AChangedGlobalBatchIsSaid) {
  const fs::path dump = temp_dir("guard_global_batch");
  run_training(tiny_config(
      dump, with(kCheckpointEvery2, {{"training.steps", "2"}, {"training.global_batch_size", "4"}})));
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.steps", "3"}}))),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("warning: the global batch is 2 sequences, the checkpoint's was 4"), std::string::npos)
      << out;
  EXPECT_NE(out.find("set training.global_batch_size = 4 to keep it"), std::string::npos) << out;
}

// A global batch this mesh cannot take as training.global_batch_size (a multiple of local batch x
// data-parallel ranks) is not offered: the checkpoint's 2 sequences with a local batch of 4 need
// the local batch lowered too.
TEST(ResumeGuard, TheWayToKeepAChangedGlobalBatchIsASettingTheRunAccepts) {
  const fs::path dump = temp_dir("guard_global_batch_local");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));  // 2 x 1 rank
  std::string out;
  ASSERT_EQ(
      run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                      cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.steps", "3"},
                                                                       {"training.local_batch_size", "4"},
                                                                       {"checkpoint.load_only", "true"}}))),
                  &out),
      0)
      << out;
  EXPECT_NE(out.find("warning: the global batch is 4 sequences, the checkpoint's was 2"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("(set training.global_batch_size = 2 to keep it)"), std::string::npos) << out;
  const std::string offered =
      "set training.local_batch_size = 2 and training.global_batch_size = 2 to keep it";
  ASSERT_NE(out.find(offered), std::string::npos) << out;
  // What it offers is a run the config accepts, and it keeps the checkpoint's batch (step 2's: the run
  // above saved nothing): no warning.
  out.clear();
  ASSERT_EQ(run_command(
                titan_binary().string() + " train --config " + debugmodel_toml().string() +
                    cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.steps", "4"},
                                                                     {"training.local_batch_size", "2"},
                                                                     {"training.global_batch_size", "2"}}))),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_EQ(out.find("warning: the global batch"), std::string::npos) << out;
}

// `count` short documents (the first 100 characters of the corpus' lines from `first` on), one JSON
// record a line, appended to `out`: a few steps of the tiny job cross a file of them.
void append_short_documents(const fs::path& out, size_t first, size_t count) {
  std::ifstream in(data::default_dataset_path() / "train.jsonl");
  std::ofstream o(out, std::ios::app);
  std::string line;
  for (size_t i = 0; i < first + count && std::getline(in, line); ++i)
    if (i >= first) {
      std::string text = nlohmann::json::parse(line).at("text").get<std::string>().substr(0, 100);
      while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
      if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0)
        text.pop_back();  // a cut lead byte
      o << nlohmann::json{{"text", text}}.dump() << "\n";
    }
}

// A dataset that only grew since the checkpoint (lines appended to its .jsonl file, a file added that
// sorts after it) keeps the checkpoint's data position: the resumed steps, which read into the lines
// appended and the new file, take the batches of a run over the grown dataset from the start (and
// not those of a run over the old one, which went back to its first document), and the run says what
// grew.
TEST(ResumeGuard, ADatasetThatOnlyGrewResumesWhereItWas) {
  const fs::path data = temp_dir("guard_data_grew_files"), old_data = temp_dir("guard_data_grew_old");
  // Steps 1-2 take 2 x 2 x 64 = 256 input tokens: within the 14 documents of b.jsonl (about 25 tokens
  // each); steps 3-4 take 256 more, past its end.
  append_short_documents(data / "b.jsonl", 0, 14);
  fs::copy_file(data / "b.jsonl", old_data / "b.jsonl");
  auto train = [&](const fs::path& dump, const fs::path& dataset, int steps, std::string* out) {
    return run_command(
        titan_binary().string() + " train --config " + debugmodel_toml().string() + " 2>&1" +
            cli_args(tiny_job(dump, with(kCheckpointEvery2, {{"training.dataset_path", dataset.string()},
                                                             {"training.steps", std::to_string(steps)}}))),
        out);
  };
  const fs::path grew = temp_dir("guard_data_grew"), straight_old = temp_dir("guard_data_grew_straight_old"),
                 straight = temp_dir("guard_data_grew_straight");
  std::string out;
  ASSERT_EQ(train(straight_old, old_data, 4, &out), 0) << out;
  ASSERT_EQ(train(grew, data, 2, &out), 0) << out;
  const uintmax_t before = fs::file_size(data / "b.jsonl");
  append_short_documents(data / "b.jsonl", 14, 2);
  append_short_documents(data / "c.jsonl", 16, 10);
  out.clear();
  ASSERT_EQ(train(grew, data, 4, &out), 0) << out;
  EXPECT_NE(out.find("data: the dataset grew since checkpoint " + (grew / "checkpoint" / "step-2").string() +
                     ": '" + (data / "b.jsonl").string() + "' from " + std::to_string(before) + " to " +
                     std::to_string(fs::file_size(data / "b.jsonl")) +
                     " bytes (lines appended); 1 new file after the checkpoint's 1: '" +
                     (data / "c.jsonl").string() + "'; the data goes on from its position"),
            std::string::npos)
      << out;
  ASSERT_EQ(train(straight, data, 4, &out), 0) << out;
  const std::vector<nlohmann::json> want = read_metrics(straight), old = read_metrics(straight_old),
                                    got = read_metrics(grew);
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(old.size(), 4u);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(want[i].contains("batch_hash")) << want[i];
    EXPECT_EQ(got[i].at("batch_hash"), want[i].at("batch_hash")) << "step " << i + 1;
    EXPECT_EQ(got[i].at("loss"), want[i].at("loss")) << "step " << i + 1;
  }
  EXPECT_NE(want[3].at("batch_hash"), old[3].at("batch_hash")) << "step 4 reads what was added";

  // A position past the size a checkpoint recorded of a file (it grew while that run read it, as the
  // position says here) lies in bytes no fingerprint covered: refused once the file has grown so.
  const fs::path step = straight_old / "checkpoint" / "step-4";
  nlohmann::json state = read_json(step / "train_state.json");
  const uint64_t recorded = state.at("dataset_identity")[0].at("bytes").get<uint64_t>();
  state["dataloader"]["doc"]["offset"] = recorded + 5;
  state["dataloader"]["doc_tokens_taken"] = 0;
  write_json(step / "train_state.json", state);
  nlohmann::json manifest = read_json(step / "manifest.json");
  manifest["files"]["train_state.json"] = {
      {"bytes", fs::file_size(step / "train_state.json")},
      {"checksum", std::to_string(file_checksum(step / "train_state.json"))}};
  write_json(step / "manifest.json", manifest);
  append_short_documents(old_data / "b.jsonl", 14, 2);
  ASSERT_NE(train(straight_old, old_data, 6, &out), 0) << out;
  EXPECT_NE(out.find(": its data position, byte " + std::to_string(recorded + 5) + " of '" +
                     (old_data / "b.jsonl").string() + "', lies past the " + std::to_string(recorded) +
                     " bytes it recorded of that file: the file grew while that run read it"),
            std::string::npos)
      << out;
}

// A best-fit state inside a window records where the window's reading ended: a window end past the
// size the checkpoint recorded of a file that has grown (read while the file grew) lies in bytes no
// fingerprint covered, refused as a position there is.
TEST(ResumeGuard, ABestFitWindowReadPastAGrownFilesRecordedSizeIsRefused) {
  const fs::path data = temp_dir("guard_window_end_files");
  {
    std::ofstream f(data / "chats.jsonl");
    for (int i = 0; i < 6; ++i)
      f << nlohmann::json{{"messages",
                           {{{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}},
                            {{"role", "assistant"}, {"content", "Answer " + std::to_string(i) + "."}}}}}
               .dump()
        << "\n";
  }
  const nlohmann::json saved_identity = data::dataset_identity({data / "chats.jsonl"});
  const uint64_t recorded = saved_identity[0].at("bytes").get<uint64_t>();
  std::ofstream(data / "chats.jsonl", std::ios::app)
      << nlohmann::json{{"messages",
                         {{{"role", "user"}, {"content", "More?"}},
                          {{"role", "assistant"}, {"content", "No."}}}}}
             .dump()
      << "\n";
  const data::Tokenizer tokenizer = data::Tokenizer::load(data::default_tokenizer_path());
  data::TokenLoader loader({.paths = {data},
                            .chat_field = "messages",
                            .pack_conversations = true,
                            .best_fit_window = 4,
                            .seq_len = 64,
                            .local_batch_size = 1},
                           tokenizer);
  nlohmann::json state = loader.state();
  state["packing"] = "best_fit 4";
  state["rows_taken"] = 1;
  state["window_end"] = data::DocPosition{0, recorded + 10, 8, false};
  state["window_end_epoch"] = 0;
  const nlohmann::json ts = {{"dataset_identity", saved_identity}, {"dataloader", state}};
  const std::string e = error_of([&] {
    restore_data_position(loader, ts, data::dataset_identity({data / "chats.jsonl"}), false, "'step-2'");
  });
  EXPECT_NE(e.find("checkpoint 'step-2': its best-fit window's end, byte " + std::to_string(recorded + 10) +
                   " of '" + (data / "chats.jsonl").string() + "', lies past the " +
                   std::to_string(recorded) + " bytes it recorded of that file"),
            std::string::npos)
      << e;
  // Within the recorded size the window's end is no reason to refuse here (the loader re-plans it).
  state["window_end"] = data::DocPosition{0, recorded, 7, false};
  const nlohmann::json within = {{"dataset_identity", saved_identity}, {"dataloader", state}};
  EXPECT_EQ(error_of([&] {
              restore_data_position(loader, within, data::dataset_identity({data / "chats.jsonl"}), false,
                                    "'step-2'");
            }).find("lies past"),
            std::string::npos);
}

// What a resume found changed (here the LR schedule: training.steps 2 -> 4) is said once the resume
// is accepted: a refused one (another dataset) prints its error without a warning about a run that
// does not happen.
TEST(ResumeGuard, ARefusedResumeWarnsOfNothingBeforeItsError) {
  const fs::path dump = temp_dir("guard_refused_quietly");
  const fs::path other = temp_dir("guard_refused_quietly_data") / "other.jsonl";
  write_corpus_prefix(other, 64 << 10, /*skip_lines=*/5);
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const std::string train =
      titan_binary().string() + " train --config " + debugmodel_toml().string() + " 2>&1" +
      cli_args(tiny_job(dump, with(kCheckpointEvery2,
                                   {{"training.steps", "4"}, {"training.dataset_path", other.string()}})));
  std::string out;
  ASSERT_NE(run_command(train, &out), 0) << out;
  EXPECT_NE(out.find("different dataset"), std::string::npos) << out;
  EXPECT_EQ(out.find("LR schedule differs"), std::string::npos) << out;
  // Accepted (the data starts over), the same resume says it.
  out.clear();
  ASSERT_EQ(run_command(train + " '--checkpoint.restart_data_stream=true'", &out), 0) << out;
  EXPECT_NE(out.find("warning: the LR schedule differs from the checkpoint's"), std::string::npos) << out;
}

// checkpoint.load_only leaves the checkpoint folder as it was, with checkpoint.load_step too: the
// later steps are not set aside as a saving roll-back's are, and the next plain run resumes the
// newest.
TEST(ResumeGuard, ALoadOnlyRollBackRenamesNothing) {
  const fs::path dump = temp_dir("guard_load_only_load_step");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
  const std::vector<std::string> before = listing(ck);
  const TrainSummary s = run_training(tiny_config(
      dump,
      with(kCheckpointEvery2,
           {{"training.steps", "4"}, {"checkpoint.load_only", "true"}, {"checkpoint.load_step", "2"}})));
  EXPECT_EQ(s.steps_run, 2) << "it resumes step 2";
  EXPECT_EQ(listing(ck), before);
  EXPECT_EQ(CheckpointManager(ck, 0).committed_steps(), (std::vector<int64_t>{2, 4}));
  // Its export would be written beside the later steps it leaves in place, as if theirs: refused,
  // and the folder is still as it was.
  const std::string e = error_of([&] {
    run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"},
                                                            {"checkpoint.load_only", "true"},
                                                            {"checkpoint.load_step", "2"},
                                                            {"checkpoint.last_save_in_hf", "true"}})));
  });
  EXPECT_NE(e.find("checkpoint.last_save_in_hf = true with checkpoint.load_only = true and "
                   "checkpoint.load_step = 2: the run's export would be written into"),
            std::string::npos)
      << e;
  EXPECT_EQ(listing(ck), before);
  EXPECT_EQ(run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "5"}}))).steps_run, 1);
}

// titan eval picks the checkpoint titan train would resume by train's own code, and names the
// step folders it passes over as train does: a newest step without COMMITTED is not used in silence.
TEST(ResumeGuard, EvalNamesTheStepFoldersItPassesOverAsTrainDoes) {
  const fs::path dump = temp_dir("guard_eval_ignoring");
  const fs::path ck = dump / "checkpoint";
  const Overrides job = with(kCheckpointEvery2, {{"training.steps", "4"}, {"validation.steps", "1"}});
  run_training(tiny_config(dump, job));
  fs::remove(ck / "step-4" / "COMMITTED");  // a save cut short
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " eval --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump, job)),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("checkpoint: ignoring " + (ck / "step-4").string() +
                     ": a save or a deletion that never finished"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("weights: " + (ck / "step-2").string()), std::string::npos) << out;
}

// A run's checkpoint folder (or its dump folder) given where one checkpoint is read: the error names
// its committed step folders and the one to pass, and no key of titan train's.
TEST(OutputGuard, AnExportOfTheCheckpointFolderNamesTheStepsToPass) {
  const fs::path dump = temp_dir("guard_export_root");
  const fs::path ck = dump / "checkpoint";
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "4"}})));
  std::string out;
  ASSERT_NE(run_command(titan_binary().string() + " export --checkpoint " + ck.string() + " --out " +
                            (dump / "hf").string() + " 2>&1",
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("'" + ck.string() + "' is a checkpoint folder, not a checkpoint"), std::string::npos)
      << out;
  EXPECT_NE(out.find("e.g. '" + (ck / "step-4").string() + "' (committed, newest first: step-4, step-2)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("initial_load_in_hf"), std::string::npos) << out;
  // generate names them too (it read the step's train_state.json first, and said only that it is
  // missing); a run's folder, whose checkpoint/ holds the steps, is said as such.
  for (const fs::path& given : {ck, dump}) {
    out.clear();
    ASSERT_NE(run_command(titan_binary().string() + " generate --checkpoint " + given.string() +
                              " --prompt a --max-new-tokens 1 2>&1",
                          &out),
              0)
        << out;
    EXPECT_NE(
        out.find("titan generate: error: --checkpoint " +
                 (given == dump ? "'" + dump.string() + "' is a run's folder, not a checkpoint; " : "") +
                 "'" + ck.string() + "' is a checkpoint folder, not a checkpoint"),
        std::string::npos)
        << out;
    EXPECT_NE(out.find("e.g. '" + (ck / "step-4").string() + "'"), std::string::npos) << out;
  }
}

// Export, generate and eval read a checkpoint's weights alone: a missing or cut optimizer file is
// no error for them (the weights are whole), but they say the checkpoint cannot be resumed.
TEST(CheckpointManifest, WeightsOnlyReadersNoteAnOptimizerFileThatCannotBeResumed) {
  const fs::path dump = temp_dir("guard_unresumable");
  run_training(tiny_config(dump, with(kCheckpointEvery2, {{"training.steps", "2"}})));
  const fs::path step = dump / "checkpoint" / "step-2", optimizer = step / "optimizer-rank0.safetensors";
  EXPECT_EQ(load_checkpoint_dir(step, CheckpointParts::Weights).unresumable, "");
  fs::resize_file(optimizer, fs::file_size(optimizer) - 1);
  EXPECT_NE(load_checkpoint_dir(step, CheckpointParts::Weights).unresumable.find("bytes, manifest.json says"),
            std::string::npos);
  fs::remove(optimizer);
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " export --checkpoint " + step.string() + " --out " +
                            (dump / "hf").string() + " 2>&1",
                        &out),
            0)
      << out;
  EXPECT_NE(
      out.find("note: '" + optimizer.string() + "' is missing: titan train cannot resume this checkpoint"),
      std::string::npos)
      << out;
}

// A dataset that ends is read again from its start, and the log says so: the first time in full,
// then at each doubling of the epoch, and the summary says how many epochs were read.
TEST(DataEpochs, ARepeatedDatasetIsSaidInTheLogWithoutALinePerEpoch) {
  const fs::path dump = temp_dir("guard_epochs");
  write_corpus_prefix(dump / "small.jsonl", 1 << 9);  // ~0.5 KiB: about one step's tokens
  std::string out;
  ASSERT_EQ(run_command(titan_binary().string() + " train --config " + debugmodel_toml().string() +
                            cli_args(tiny_job(dump / "run",
                                              {{"training.steps", "8"},
                                               {"validation.enable", "false"},
                                               {"training.dataset_path", (dump / "small.jsonl").string()}})),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("data: the dataset was read through 1 time by step "), std::string::npos) << out;
  EXPECT_NE(out.find(": it is read again from its first document"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("data: at the end the dataset had been read through ([0-9]+) times?")))
      << out;
  const int64_t last = std::stoll(m[1]);
  ASSERT_GE(last, 4) << "the dataset should be read several times over in 8 steps: " << out;
  int64_t lines = 1;  // the first, in full
  const std::regex later("data: the dataset was read through ([0-9]+) times? by step [0-9]+\n");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), later); it != std::sregex_iterator();
       ++it, ++lines) {
    const int64_t e = std::stoll((*it)[1]);
    EXPECT_EQ(e & (e - 1), 0) << "read through " << e << " times said: only powers of two are";
    EXPECT_LE(e, last);
  }
  // At most 1, 2, 4, ... times up to the last (a step that reads it through several times says the
  // newest power).
  EXPECT_LE(lines, int64_t(std::bit_width(uint64_t(last)))) << out;
}

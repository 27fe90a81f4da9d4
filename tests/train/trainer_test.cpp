// The trainer end to end: in-process through train::run_training and through the titan binary.
// Every run is torchtitan's debugmodel (the README's main job, configs/debugmodel.toml) shrunk with
// model overrides (2 layers, dim 64, seq 64) so that a step takes a fraction of a second on two
// busy cores; the tokenizer and the corpus are the real ones from assets/.
#include "titan/train/trainer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/chat.h"
#include "titan/data/dataset.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/communicator.h"
#include "titan/io/safetensors.h"
#include "titan/kernels/substitution.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpointer.h"
#include "titan/train/job_config.h"
#include "titan/train/native_model.h"
#include "titan/train/startup.h"
#include "train_test_util.h"

using namespace titan;
using namespace titan::train;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

using tt::cli_args;
using tt::debugmodel_toml;
using tt::Overrides;
using tt::tiny_config;
using tt::tiny_job;
using tt::error_of;
using tt::by_step;
using tt::read_metrics;

std::string titan() {
  return tt::titan_binary().string();
}

// Loss (or another field) of each logged step, by step.
std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------- TensorBoard parsing (independent)

uint32_t crc32c_bitwise(const void* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t masked(uint32_t c) {
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

uint64_t varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0; i < s.size(); shift += 7) {
    uint8_t b = uint8_t(s[i++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  return v;
}

struct TbScalar {
  int64_t step;
  std::string tag;
  float value;
};

// Calls fn(field, wire, varint value, bytes) for each field of a protobuf message.
template <class Fn>
void for_each_field(const std::string& msg, Fn fn) {
  size_t i = 0;
  while (i < msg.size()) {
    uint64_t key = varint(msg, i);
    int field = int(key >> 3), wire = int(key & 7);
    uint64_t v = 0;
    std::string bytes;
    if (wire == 0)
      v = varint(msg, i);
    else if (wire == 1)
      bytes = msg.substr(i, 8), i += 8;
    else if (wire == 5)
      bytes = msg.substr(i, 4), i += 4;
    else if (wire == 2) {
      uint64_t n = varint(msg, i);
      bytes = msg.substr(i, n);
      i += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << wire;
      return;
    }
    fn(field, v, bytes);
  }
}

// Every record's length and data CRC are checked; returns the scalar summaries.
std::vector<TbScalar> read_tensorboard(const fs::path& file, int* n_records) {
  std::string s = read_file(file);
  std::vector<TbScalar> out;
  *n_records = 0;
  size_t i = 0;
  while (i < s.size()) {
    EXPECT_LE(i + 12, s.size()) << "truncated record header";
    if (i + 12 > s.size()) break;
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, s.data() + i, 8);
    std::memcpy(&len_crc, s.data() + i + 8, 4);
    EXPECT_EQ(len_crc, masked(crc32c_bitwise(s.data() + i, 8))) << "record " << *n_records;
    EXPECT_LE(i + 12 + len + 4, s.size());
    if (i + 12 + len + 4 > s.size()) break;
    std::string data = s.substr(i + 12, len);
    std::memcpy(&data_crc, s.data() + i + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(crc32c_bitwise(data.data(), data.size()))) << "record " << *n_records;
    i += 12 + len + 4;
    ++*n_records;
    int64_t step = 0;
    std::string summary;
    for_each_field(data, [&](int field, uint64_t v, const std::string& b) {
      if (field == 2) step = int64_t(v);
      if (field == 5) summary = b;
    });
    if (summary.empty()) continue;
    for_each_field(summary, [&](int field, uint64_t, const std::string& value) {
      if (field != 1) return;
      TbScalar sc{step, "", 0};
      for_each_field(value, [&](int f, uint64_t, const std::string& b) {
        if (f == 1) sc.tag = b;
        if (f == 2 && b.size() == 4) std::memcpy(&sc.value, b.data(), 4);
      });
      out.push_back(sc);
    });
  }
  return out;
}

TEST(TensorBoardParser, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c_bitwise("123456789", 9), 0xE3069283u);  // RFC 3720 / iSCSI check value
}

// ---------------------------------------------------------------- tests

// The main job in miniature: loss falls, metrics.jsonl and TensorBoard hold the records,
// checkpoints land after the first step and at the end, the HF export passes verify-export (f32
// and bf16), `debug dump` on it gives the trained model's loss, and a run started from the export
// begins far below a random-init run.
TEST(Trainer, LossFallsExportVerifiesAndWeightsReallyLoad) {
  const fs::path dump = tt::temp_dir("trainer_main");
  const int64_t steps = 20;
  TrainSummary s = run_training(tiny_config(dump, {{"training.steps", std::to_string(steps)},
                                                   {"optimizer.lr", "3e-3"},
                                                   {"lr_scheduler.warmup_steps", "2"},
                                                   {"checkpoint.enable", "true"},
                                                   {"checkpoint.interval", "100"},
                                                   {"checkpoint.enable_first_step_checkpoint", "true"},
                                                   {"checkpoint.last_save_in_hf", "true"},
                                                   {"metrics.enable_tensorboard", "true"},
                                                   {"metrics.save_tb_folder", "tb/run1"}}));
  EXPECT_EQ(s.steps_run, steps);
  // Saved after step 1 (enable_first_step_checkpoint) and at the end; the interval never came.
  EXPECT_EQ(CheckpointManager(dump / "checkpoint", 3).committed_steps(), (std::vector<int64_t>{1, steps}));
  EXPECT_EQ(s.last_step, steps);
  EXPECT_FALSE(s.interrupted);
  EXPECT_EQ(s.tokens, steps * 2 * 64);

  // metrics.jsonl: one record per step (log_freq 1), the documented keys, warm-up first.
  auto records = read_metrics(dump);
  ASSERT_EQ(records.size(), size_t(steps));
  for (size_t i = 0; i < records.size(); ++i) {
    for (const char* k :
         {"step", "loss", "grad_norm", "lr", "memory_gib", "memory_pct", "tps", "tflops", "mfu", "warmup"})
      EXPECT_TRUE(records[i].contains(k)) << "record " << i << " lacks " << k;
    EXPECT_EQ(records[i]["step"].get<int64_t>(), int64_t(i + 1));
    EXPECT_EQ(records[i]["warmup"].get<bool>(), i == 0);
    EXPECT_TRUE(std::isfinite(records[i]["loss"].get<double>()));
    EXPECT_GT(records[i]["grad_norm"].get<double>(), 0);
    EXPECT_GT(records[i]["memory_gib"].get<double>(), 0);
    // The CPU's tensors sit in its caching allocator's segments too: what they reserve holds the
    // step's peak.
    ASSERT_TRUE(records[i].contains("memory_reserved_gib")) << "record " << i;
    EXPECT_GE(records[i]["memory_reserved_gib"].get<double>(), records[i]["memory_gib"].get<double>());
    EXPECT_GT(records[i]["tps"].get<double>(), 0);
    EXPECT_GT(records[i]["mfu"].get<double>(), 0);
  }
  EXPECT_EQ(records[0]["lr"].get<double>(), 3e-3 / 2);  // warmup step 1 of 2
  EXPECT_EQ(records[1]["lr"].get<double>(), 3e-3);
  const double first_loss = records.front()["loss"].get<double>(),
               last_loss = records.back()["loss"].get<double>();
  // A random init starts near ln(vocab) = 11.93; 20 steps learn at least the unigram statistics.
  EXPECT_NEAR(first_loss, std::log(151936.0), 0.3);
  EXPECT_LT(last_loss, first_loss - 0.5) << "loss did not fall: " << first_loss << " -> " << last_loss;
  EXPECT_EQ(s.final_loss, last_loss);

  // TensorBoard, in metrics.save_tb_folder under the dump folder: every record's masked CRC32C is
  // valid and the scalars are the logged values.
  ASSERT_TRUE(fs::is_directory(dump / "tb" / "run1"));
  std::vector<fs::path> events;
  for (auto& e : fs::directory_iterator(dump / "tb" / "run1"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  int n_records = 0;
  auto scalars = read_tensorboard(events[0], &n_records);
  EXPECT_GT(n_records, int(steps));
  std::map<int64_t, float> tb_loss;
  for (auto& sc : scalars)
    if (sc.tag == "loss") tb_loss[sc.step] = sc.value;
  ASSERT_EQ(tb_loss.size(), size_t(steps));
  for (auto& r : records)
    EXPECT_EQ(tb_loss[r["step"].get<int64_t>()], float(r["loss"].get<double>())) << "step " << r["step"];

  // The final checkpoint and its HF export.
  const fs::path step_dir = dump / "checkpoint" / ("step-" + std::to_string(steps));
  const fs::path hf = dump / "checkpoint" / ("step-" + std::to_string(steps) + "-hf");
  ASSERT_TRUE(fs::exists(step_dir / "COMMITTED"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(hf / f)) << f;

  std::string out;
  int rc =
      tt::run_command(titan() + " verify-export " + hf.string() + " --source " + step_dir.string(), &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("verify-export OK"), std::string::npos) << out;

  // `titan generate` on the export: the prompt through the export's own tokenizer, the text the
  // decoding of the new ids, only ids the tokenizer knows, and the same ids from --prompt-ids.
  {
    const data::Tokenizer exported = data::Tokenizer::load(hf);
    const fs::path json_out = dump / "generate.json";
    out.clear();
    // A group, so the helper's 2>&1 sends the summary line to `out`, not into the JSON file.
    rc = tt::run_command("{ " + titan() + " generate --model-path " + hf.string() +
                             " --prompt 'The history of' --max-new-tokens 6 --json >" + json_out.string() +
                             "; }",
                         &out);
    ASSERT_EQ(rc, 0) << out;
    const nlohmann::json g = nlohmann::json::parse(std::ifstream(json_out));
    EXPECT_EQ(g.at("prompt_ids").get<std::vector<int32_t>>(), exported.encode("The history of"));
    const std::vector<int32_t> ids = g.at("ids").get<std::vector<int32_t>>();
    ASSERT_FALSE(ids.empty());
    EXPECT_LE(ids.size(), 6u);
    for (int32_t id : ids) EXPECT_TRUE(exported.has_id(id)) << id;
    EXPECT_EQ(g.at("text").get<std::string>(), exported.decode(ids));
    std::string joined;
    for (int32_t id : g.at("prompt_ids").get<std::vector<int32_t>>())
      joined += (joined.empty() ? "" : ",") + std::to_string(id);
    out.clear();
    rc = tt::run_command("{ " + titan() + " generate --model-path " + hf.string() + " --prompt-ids " +
                             joined + " --max-new-tokens 6 --json >" + json_out.string() + "; }",
                         &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(json_out)).at("ids").get<std::vector<int32_t>>(), ids);
    // The native checkpoint the export came from (f32, exact): the same greedy tokens, its
    // tokenizer found through the path the run recorded.
    out.clear();
    rc = tt::run_command("{ " + titan() + " generate --checkpoint " + step_dir.string() +
                             " --prompt 'The history of' --max-new-tokens 6 --json >" + json_out.string() +
                             "; }",
                         &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(json_out)).at("ids").get<std::vector<int32_t>>(), ids);
  }

  const fs::path hf_bf16 = dump / "export-bf16";
  out.clear();
  rc = tt::run_command(titan() + " export --checkpoint " + step_dir.string() + " --out " + hf_bf16.string() +
                           " --dtype bfloat16",
                       &out);
  ASSERT_EQ(rc, 0) << out;
  out.clear();
  rc = tt::run_command(titan() + " verify-export " + hf_bf16.string() + " --source " + step_dir.string(),
                       &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("every tensor is bfloat16"), std::string::npos) << out;
  EXPECT_NE(out.find("verify-export OK"), std::string::npos) << out;

  // `titan debug dump` on the export vs the trained model (native checkpoint, in-process forward
  // through the training loss path) on the same 64 tokens of the corpus.
  const int64_t S = 64;
  data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  data::LoaderConfig lc;
  lc.paths = {data::default_dataset_path()};
  lc.seq_len = S;
  lc.local_batch_size = 1;
  data::TokenLoader loader(lc, tok);
  data::Batch batch = loader.next();
  ASSERT_FALSE(batch.empty());
  const fs::path tokens = dump / "tokens.safetensors", dumped = dump / "dump.safetensors";
  io::write_safetensors(tokens,
                        std::vector<io::TensorWrite>{{"input_ids", DType::I64, {1, S}, batch.inputs.data()}});
  out.clear();
  rc = tt::run_command(titan() + " debug dump --model-path " + hf.string() + " --tokens " + tokens.string() +
                           " --out " + dumped.string(),
                       &out);
  ASSERT_EQ(rc, 0) << out;
  float dump_loss;
  std::memcpy(&dump_loss, io::SafetensorsFile::open(dumped).at("loss").data, 4);
  NativeModel native = load_native_model(step_dir, DType::F32);
  double native_loss;
  {
    autograd::NoGradGuard no_grad;
    std::vector<int64_t> in(batch.inputs.begin(), batch.inputs.end() - 1),
        tgt(batch.inputs.begin() + 1, batch.inputs.end());
    native_loss =
        native.model->forward_loss(Tensor::from_vector(in, {1, S - 1}), Tensor::from_vector(tgt, {1, S - 1}))
            .ce_loss.item();
  }
  EXPECT_NEAR(dump_loss, native_loss, 1e-5 * std::fabs(native_loss)) << out;
  EXPECT_LT(native_loss, first_loss - 0.5);  // the dumped model is the trained one

  // "Weights really loaded": the hf route from the export; the architecture comes from its
  // config.json (no model overrides), the first batch is the same as the random-init run's.
  const fs::path dump2 = tt::temp_dir("trainer_from_hf");
  TrainSummary s2 =
      run_training(load_job_config(debugmodel_toml().string(), {{"job.dump_folder", dump2.string()},
                                                                {"model.name", "hf"},
                                                                {"model.hf_assets_path", hf.string()},
                                                                {"checkpoint.initial_load_in_hf", "true"},
                                                                {"checkpoint.enable", "false"},
                                                                {"checkpoint.last_save_in_hf", "false"},
                                                                {"training.seq_len", "64"},
                                                                {"training.steps", "1"},
                                                                {"lr_scheduler.warmup_steps", "1"},
                                                                {"metrics.log_freq", "1"}}));
  auto r2 = read_metrics(dump2);
  ASSERT_EQ(r2.size(), 1u);
  const double loaded_first = r2[0]["loss"].get<double>();
  EXPECT_EQ(s2.final_loss, loaded_first);
  EXPECT_LT(loaded_first, first_loss - 0.5)
      << "HF-loaded first loss " << loaded_first << " vs random init " << first_loss;

  // The same weights untied on purpose (model.tie_embeddings = false), from the export and from the
  // native checkpoint: the head starts as a copy of the embedding, so the first loss is the tied one's.
  const std::vector<std::pair<std::string, Overrides>> untied_from = {
      {"the export",
       {{"checkpoint.initial_load_path", hf.string()}, {"checkpoint.initial_load_in_hf", "true"}}},
      {"the native checkpoint", {{"checkpoint.initial_load_path", step_dir.string()}}}};
  for (const auto& [what, from] : untied_from) {
    const fs::path dump3 = tt::temp_dir("trainer_untied");
    run_training(
        load_job_config(debugmodel_toml().string(), tt::joined({{"job.dump_folder", dump3.string()},
                                                                {"model.name", "hf"},
                                                                {"model.hf_assets_path", hf.string()},
                                                                {"model.tie_embeddings", "false"},
                                                                {"checkpoint.enable", "false"},
                                                                {"checkpoint.last_save_in_hf", "false"},
                                                                {"training.seq_len", "64"},
                                                                {"training.steps", "1"},
                                                                {"lr_scheduler.warmup_steps", "1"},
                                                                {"metrics.log_freq", "1"}},
                                                               from)));
    auto r3 = read_metrics(dump3);
    ASSERT_EQ(r3.size(), 1u) << what;
    EXPECT_NEAR(r3[0]["loss"].get<double>(), loaded_first, 1e-6 * loaded_first) << "untied from " << what;
  }
}

// Run A: 7 steps straight. Run B: 4 steps, then again with the same dump folder to 7. With a
// schedule that does not depend on training.steps (decay_ratio = 0) the losses of steps 5..7 and
// the final weights must be bit-identical. Debris of interrupted saves is ignored and pruned;
// keep_latest_k prunes; a corrupted checkpoint fails its checksum.
TEST(Trainer, ResumeEqualsAnUninterruptedRunBitwise) {
  const Overrides common = {{"training.deterministic", "true"}, {"optimizer.lr", "3e-3"},
                            {"lr_scheduler.warmup_steps", "2"}, {"lr_scheduler.decay_ratio", "0"},
                            {"checkpoint.enable", "true"},      {"checkpoint.interval", "2"},
                            {"checkpoint.keep_latest_k", "2"}};
  auto with = [&](const Overrides& extra) { return tt::joined(common, extra); };
  const fs::path a = tt::temp_dir("trainer_resume_a"), b = tt::temp_dir("trainer_resume_b");
  // A also exports in bfloat16 at the end (checked with verify-export below).
  run_training(tiny_config(a, with({{"training.steps", "7"},
                                    {"checkpoint.last_save_in_hf", "true"},
                                    {"checkpoint.export_dtype", "bfloat16"}})));
  CheckpointManager ckpt_a(a / "checkpoint", 2);
  EXPECT_EQ(ckpt_a.committed_steps(), (std::vector<int64_t>{6, 7}));  // 2 and 4 pruned
  std::string out;
  int rc = tt::run_command(titan() + " verify-export " + (a / "checkpoint" / "step-7-hf").string() +
                               " --source " + (a / "checkpoint" / "step-7").string(),
                           &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("every tensor is bfloat16"), std::string::npos) << out;
  EXPECT_NE(out.find("verify-export OK"), std::string::npos) << out;

  TrainSummary b1 = run_training(tiny_config(b, with({{"training.steps", "4"}})));
  EXPECT_EQ(b1.last_step, 4);
  // Debris of saves that never finished: a newer step folder without COMMITTED (a crash between
  // the rename and the marker) and a leftover temporary of another process.
  const fs::path ck = b / "checkpoint";
  fs::copy(ck / "step-4", ck / "step-5");
  fs::remove(ck / "step-5" / "COMMITTED");
  fs::copy(ck / "step-4", ck / ".step-6.tmp-999999-0");
  fs::remove(ck / ".step-6.tmp-999999-0" / "COMMITTED");
  std::string e = error_of([&] { load_checkpoint_dir(ck / "step-5"); });
  EXPECT_NE(e.find("COMMITTED"), std::string::npos) << e;
  EXPECT_EQ(CheckpointManager(ck, 2).latest_step(), 4);

  TrainSummary b2 = run_training(tiny_config(b, with({{"training.steps", "7"}})));
  EXPECT_EQ(b2.steps_run, 3);  // resumed from step 4, not the uncommitted step 5
  EXPECT_EQ(b2.last_step, 7);
  EXPECT_EQ(b2.tokens, 7 * 2 * 64);

  auto ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), 7u);
  ASSERT_EQ(rb.size(), 7u);                  // 4 records from B's first invocation, 3 from its second
  EXPECT_TRUE(rb[4]["warmup"].get<bool>());  // the first step of the resumed invocation
  auto la = by_step(ra, "loss"), lb = by_step(rb, "loss");
  auto ga = by_step(ra, "grad_norm"), gb = by_step(rb, "grad_norm");
  for (int64_t st = 1; st <= 7; ++st) {
    EXPECT_EQ(la[st], lb[st]) << "loss differs at step " << st;  // doubles compared exactly
    EXPECT_EQ(ga[st], gb[st]) << "grad_norm differs at step " << st;
  }
  for (const char* f : {"model-rank0.safetensors", "optimizer-rank0.safetensors"})
    EXPECT_EQ(tt::file_difference(a / "checkpoint" / "step-7" / f, ck / "step-7" / f), "");

  // Pruned: older committed steps, the uncommitted folder, the stale temporary (the run lock of
  // the folder stays, see RunLock).
  std::vector<std::string> left;
  for (auto& entry : fs::directory_iterator(ck)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".titan-rank0.lock", "step-6", "step-7"}));

  // A flipped byte in a checkpoint file fails its checksum, by name, and a resume refuses it; every
  // damaged file is named in the one error.
  for (const char* name : {"model-rank0.safetensors", "optimizer-rank0.safetensors"}) {
    const fs::path victim = ck / "step-7" / name;
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(fs::file_size(victim) / 2));
    char c;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(std::streamoff(fs::file_size(victim) / 2));
    f.write(&c, 1);
  }
  e = error_of([&] { load_checkpoint_dir(ck / "step-7"); });
  for (const char* name : {"model-rank0.safetensors", "optimizer-rank0.safetensors"})
    EXPECT_NE(e.find((ck / "step-7" / name).string() + "' fails its checksum (corrupted)"), std::string::npos)
        << e;
  e = error_of([&] { run_training(tiny_config(b, with({{"training.steps", "8"}}))); });
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  // The way forward is named: the committed step before the newest.
  EXPECT_NE(
      e.find("; if step 7 cannot be repaired, the committed steps before it are 6: checkpoint.load_step "
             "= 6 resumes from the newest of them (step 7 is then set aside, not deleted)"),
      std::string::npos)
      << e;
  EXPECT_EQ(read_metrics(b).size(), 7u);  // no step was taken
  // It does: step 7 set aside, step 8 trained from step 6's state.
  EXPECT_EQ(
      run_training(tiny_config(b, with({{"training.steps", "8"}, {"checkpoint.load_step", "6"}}))).steps_run,
      2);
}

// An absurd learning rate: step 1 is finite, the weights it produces overflow the next forward. The
// run stops before the optimizer step, naming it; the step before is the last checkpoint, committed
// even when its save was still in the background at the failure (every rank stops at that step, so
// the save commits first).
TEST(Trainer, NonFiniteGradNormStopsBeforeTheOptimizerStep) {
  for (const std::string mode : {"disabled", "async"}) {
    SCOPED_TRACE(mode);
    const fs::path dump = tt::temp_dir("trainer_nonfinite_" + mode);
    std::string e = error_of([&] {
      run_training(tiny_config(dump, {{"training.steps", "5"},
                                      {"optimizer.lr", "1e30"},
                                      {"lr_scheduler.warmup_steps", "0"},
                                      {"checkpoint.enable", "true"},
                                      {"checkpoint.interval", "1"},
                                      {"checkpoint.async_mode", mode},
                                      {"checkpoint.keep_latest_k", "0"}}));
    });
    ASSERT_FALSE(e.empty()) << "training with lr = 1e30 did not stop";
    auto records = read_metrics(dump);
    const int64_t bad_step = int64_t(records.size()) + 1;  // the first step that was not logged
    EXPECT_NE(e.find("step " + std::to_string(bad_step) + ":"), std::string::npos) << e;
    EXPECT_NE(e.find("not finite"), std::string::npos) << e;
    EXPECT_NE(e.find("before the optimizer step"), std::string::npos) << e;
    CheckpointManager ckpt(dump / "checkpoint", 0);
    auto steps = ckpt.committed_steps();
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.back(), bad_step - 1);
    EXPECT_FALSE(fs::exists(ckpt.step_dir(bad_step)));
    // What was written is finite.
    LoadedCheckpoint c = ckpt.load(steps.back());
    for (auto& t : c.model_files[0].tensors()) {
      std::vector<float> v(size_t(t.numel()));
      std::memcpy(v.data(), t.data, t.nbytes());
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << t.name;
    }
  }
}

// Conversations cut before their answers leave a step nothing to train on: the run stops naming the
// step and the remedy, before an update that would move the weights (momentum, weight decay) on no data.
TEST(Trainer, AStepWithoutATokenToTrainOnStopsNamingIt) {
  const fs::path dump = tt::temp_dir("trainer_no_targets_" + std::to_string(getpid()));
  const fs::path data =
      dump.parent_path() / ("trainer_no_targets_data_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream out(data);
    for (int i = 0; i < 4; ++i)
      out << nlohmann::json{{"messages",
                             {{{"role", "user"},
                               {"content",
                                "A question long enough to fill the whole row " + std::to_string(i)}},
                              {{"role", "assistant"}, {"content", "yes"}}}}}
                 .dump()
          << "\n";
  }
  const std::string e = error_of([&] {
    run_training(tiny_config(dump, {{"training.steps", "2"},
                                    {"training.dataset_path", data.string()},
                                    {"training.chat_field", "messages"},
                                    {"training.seq_len", "8"},
                                    {"validation.enable", "false"}}));
  });
  EXPECT_NE(e.find("step 1: no row of the step has a token to train on"), std::string::npos) << e;
  EXPECT_NE(e.find("raise training.seq_len"), std::string::npos) << e;
  EXPECT_TRUE(read_metrics(dump).empty());
}

// Conversation rows are padded after their last conversation: each step logs the share of its
// positions that is padding (tokens/s counts them), here against the conversations' own lengths;
// packed rows have less of it, and text steps none.
TEST(Trainer, ConversationStepsLogTheShareOfPadding) {
  const fs::path data = tt::temp_dir("trainer_padding_data_" + std::to_string(getpid())) / "chats.jsonl";
  const data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  std::vector<int64_t> lengths;
  {
    std::ofstream out(data);
    for (int i = 0; i < 8; ++i) {
      const nlohmann::ordered_json messages = {
          {{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}},
          {{"role", "assistant"}, {"content", std::string(size_t(1 + 9 * i), 'x')}}};
      out << nlohmann::json{{"messages", messages}}.dump() << "\n";
      lengths.push_back(int64_t(data::tokenize_chat(tok, data::render_qwen3_chat(messages)).ids.size()));
    }
  }
  const int64_t S = 64, B = 2;
  const tt::Overrides chats = {{"training.dataset_path", data.string()},
                               {"training.chat_field", "messages"},
                               {"training.seq_len", std::to_string(S)},
                               {"training.local_batch_size", std::to_string(B)},
                               {"training.steps", "3"},
                               {"validation.enable", "false"},
                               {"checkpoint.enable", "false"}};
  // Each row's tokens: one conversation each, or (packed) every next one that still fits whole.
  auto expect_padding = [&](const fs::path& dump, const TrainSummary& summary, bool packed) {
    const std::vector<nlohmann::json> steps = read_metrics(dump);
    ASSERT_EQ(steps.size(), 3u);
    size_t next = 0;
    int64_t total = 0;
    for (int64_t step = 0; step < 3; ++step) {
      int64_t padding = 0;
      for (int64_t row = 0; row < B; ++row) {
        int64_t used = std::min(S, lengths[next++ % lengths.size()]);
        while (packed && used + lengths[next % lengths.size()] <= S) used += lengths[next++ % lengths.size()];
        padding += S - used;
      }
      total += padding;
      EXPECT_NEAR(steps[size_t(step)].at("padding_pct").get<double>(),
                  100.0 * double(padding) / double(B * S), 1e-9)
          << (packed ? "packed" : "one per row") << ", step " << step + 1;
    }
    EXPECT_EQ(summary.padding, total);
    EXPECT_EQ(summary.step_tokens, 3 * B * S);
  };
  const fs::path one_each = tt::temp_dir("trainer_padding_rows_" + std::to_string(getpid()));
  expect_padding(one_each, run_training(tiny_config(one_each, chats)), false);
  const fs::path packed = tt::temp_dir("trainer_padding_packed_" + std::to_string(getpid()));
  expect_padding(
      packed,
      run_training(tiny_config(packed, tt::joined(chats, {{"training.pack_conversations", "true"},
                                                          {"model.attn_mask_type", "block_causal"}}))),
      true);

  const fs::path text = tt::temp_dir("trainer_padding_text_" + std::to_string(getpid()));
  run_training(tiny_config(text, {{"training.steps", "1"}, {"validation.enable", "false"}}));
  EXPECT_FALSE(read_metrics(text).at(0).contains("padding_pct"));
}

// Conversation steps log the tokens their loss is the mean over (the step's targets: the answers'
// tokens), and a run ends with how many of its conversations were longer than seq_len + 1 tokens and
// cut there, and how many answer tokens the cuts left out; `titan eval` says the same of the held-out
// conversations (and --json holds it). All against the conversations' own tokens. Text steps log
// neither.
TEST(Trainer, ConversationRunsLogTheirTrainedTokensAndCountTheConversationsCut) {
  const int64_t S = 32, B = 2, steps = 3;
  const data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  // Conversations whose answers grow by 6 words each: the first fit a row, the later ones are cut.
  struct Row {
    int64_t targets = 0, lost = 0;  // trained tokens in the row, and past it
    bool cut = false;
  };
  auto write = [&](const fs::path& file, int n, int first) {
    std::vector<Row> rows;
    std::ofstream out(file);
    for (int i = 0; i < n; ++i) {
      std::string answer = "Answer " + std::to_string(first + i) + ":";
      for (int k = 0; k < 6 * i; ++k) answer += " word" + std::to_string(k);
      const nlohmann::ordered_json messages = {
          {{"role", "user"}, {"content", "Question " + std::to_string(first + i) + "?"}},
          {{"role", "assistant"}, {"content", answer}}};
      out << nlohmann::ordered_json{{"messages", messages}}.dump() << "\n";
      const data::ChatTokens t = data::tokenize_chat(tok, data::render_qwen3_chat(messages));
      const int64_t len = int64_t(t.ids.size());
      Row r;
      for (int64_t p = 1; p < len; ++p) (p <= S ? r.targets : r.lost) += t.trained[size_t(p)];
      r.cut = len > S + 1;
      rows.push_back(r);
    }
    return rows;
  };
  const fs::path dir = tt::temp_dir("trainer_cut_data_" + std::to_string(getpid()));
  const std::vector<Row> rows = write(dir / "chats.jsonl", int(steps * B), 0);
  const std::vector<Row> held_out = write(dir / "held_out.jsonl", 4, 100);
  int64_t cut = 0, lost = 0;
  for (const Row& r : rows) cut += r.cut, lost += r.lost;
  ASSERT_GT(cut, 0);
  ASSERT_LT(cut, steps * B) << "some conversations should fit their rows";

  const fs::path dump = tt::temp_dir("trainer_cut_run_" + std::to_string(getpid()));
  const Overrides chats = {{"training.dataset_path", (dir / "chats.jsonl").string()},
                           {"training.chat_field", "messages"},
                           {"training.seq_len", std::to_string(S)},
                           {"training.local_batch_size", std::to_string(B)},
                           {"training.steps", std::to_string(steps)},
                           {"validation.enable", "false"},
                           {"validation.dataset_path", (dir / "held_out.jsonl").string()},
                           {"validation.local_batch_size", "2"},
                           {"validation.steps", "-1"}};
  ::testing::internal::CaptureStdout();
  const TrainSummary summary = run_training(tiny_config(dump, chats));
  const std::string log = ::testing::internal::GetCapturedStdout();
  const std::vector<nlohmann::json> records = read_metrics(dump);
  ASSERT_EQ(records.size(), size_t(steps));
  for (int64_t step = 0; step < steps; ++step) {
    int64_t targets = 0;
    for (int64_t row = 0; row < B; ++row) targets += rows[size_t(step * B + row)].targets;
    EXPECT_EQ(records[size_t(step)].at("trained_tokens"), targets) << "step " << step + 1;
    EXPECT_NE(log.find("step: " + std::to_string(step + 1) + "  loss: "), std::string::npos) << log;
    EXPECT_NE(log.find("  trained_tokens: " + std::to_string(targets)), std::string::npos) << log;
  }
  EXPECT_EQ(summary.conversations, steps * B);
  EXPECT_EQ(summary.cut_conversations, cut);
  EXPECT_EQ(summary.cut_trained_tokens, lost);
  const std::string said = "data: " + std::to_string(cut) + " of the " + std::to_string(steps * B) +
                           " conversations in this invocation's steps " + (cut == 1 ? "was" : "were") +
                           " longer than seq_len + 1 = " + std::to_string(S + 1) +
                           " tokens and cut there: " + std::to_string(lost) + " answer token" +
                           (lost == 1 ? "" : "s") + " not trained on\n";
  EXPECT_NE(log.find(said), std::string::npos) << log;
  EXPECT_LT(log.find(said), log.find("summary: ")) << log;

  // titan eval over the held-out conversations, in rows of the same seq_len (validation.seq_len = -1).
  int64_t held_out_cut = 0, held_out_lost = 0;
  for (const Row& r : held_out) held_out_cut += r.cut, held_out_lost += r.lost;
  std::string out;
  const fs::path json = dump / "eval.json";
  ASSERT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                cli_args(tiny_job(dump, chats)) + " --json " + json.string(),
                            &out),
            0)
      << out;
  ASSERT_GT(held_out_cut, 0);
  EXPECT_NE(out.find("eval: " + std::to_string(held_out_cut) + " of the 4 held-out conversations " +
                     (held_out_cut == 1 ? "was" : "were") +
                     " longer than seq_len + 1 = 33 tokens and cut there: " + std::to_string(held_out_lost) +
                     " answer token" + (held_out_lost == 1 ? "" : "s") + " not scored"),
            std::string::npos)
      << out;
  const nlohmann::json result = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(result.at("conversations"), 4);
  EXPECT_EQ(result.at("cut_conversations"), held_out_cut);
  EXPECT_EQ(result.at("cut_trained_tokens"), held_out_lost);

  // Text: every position is a target, and nothing is cut.
  const fs::path text = tt::temp_dir("trainer_cut_text_" + std::to_string(getpid()));
  ::testing::internal::CaptureStdout();
  const TrainSummary text_summary =
      run_training(tiny_config(text, {{"training.steps", "1"}, {"validation.enable", "false"}}));
  const std::string text_log = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(read_metrics(text).at(0).contains("trained_tokens"));
  EXPECT_EQ(text_log.find("trained_tokens"), std::string::npos) << text_log;
  EXPECT_EQ(text_log.find("and cut there"), std::string::npos) << text_log;
  EXPECT_EQ(text_summary.cut_conversations, 0);
}

// Best-fit packed conversations through the trainer: a run stopped inside a best-fit window and
// resumed from its checkpoint trains the rows the straight run trains (losses, grad norms and padding
// bit for bit), and validation packs its held-out conversations best-fit too (the same held-out loss).
// A resume inside a window under another packing is refused; from next-fit's position it is not.
TEST(Trainer, BestFitPackedConversationsResumeBitwise) {
  const std::string data = tt::write_conversations("trainer_best_fit_data").string();
  const Overrides common = {
      {"training.dataset_path", data},
      {"training.chat_field", "messages"},
      {"training.pack_conversations", "true"},
      {"training.pack_strategy", "best_fit"},
      {"training.pack_window", "5"},
      {"model.attn_mask_type", "block_causal"},
      {"training.deterministic", "true"},
      {"lr_scheduler.warmup_steps", "2"},  // a schedule that does not depend on training.steps
      {"lr_scheduler.decay_ratio", "0"},
      {"validation.enable", "true"},
      {"validation.dataset_path", tt::write_conversations("trainer_best_fit_held_out", 100).string()},
      {"validation.freq", "2"},
      {"validation.steps", "1"},
      {"checkpoint.enable", "true"},
      {"checkpoint.interval", "2"}};
  auto with = [&](const char* steps) { return tt::joined(common, {{"training.steps", steps}}); };
  const fs::path a = tt::temp_dir("trainer_best_fit_a"), b = tt::temp_dir("trainer_best_fit_b");
  run_training(tiny_config(a, with("6")));
  run_training(tiny_config(b, with("2")));
  // The loader's state in step 2's checkpoint sits inside a window (5 conversations fill 2-3 rows
  // of 64 tokens; a step takes 2).
  std::ifstream saved(b / "checkpoint" / "step-2" / "train_state.json");
  const nlohmann::json loader = nlohmann::json::parse(saved).at("dataloader");
  EXPECT_EQ(loader.at("packing"), "best_fit 5");
  EXPECT_GT(loader.at("rows_taken").get<int64_t>(), 0) << loader.dump();
  EXPECT_EQ(run_training(tiny_config(b, with("6"))).steps_run, 4);
  const std::vector<nlohmann::json> ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), 6u);
  ASSERT_EQ(rb.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    for (const char* key : {"loss", "grad_norm", "padding_pct"})
      EXPECT_EQ(ra[i].at(key), rb[i].at(key)) << key << " at step " << i + 1;
  for (size_t i : {1, 3, 5}) {
    ASSERT_TRUE(ra[i].contains("val_loss")) << ra[i].dump();
    EXPECT_EQ(ra[i].at("val_loss"), rb[i].at("val_loss")) << "step " << i + 1;
  }

  // Inside a window only its packing goes on (the error names the keys and the way out); from
  // next-fit's position (the next conversation) best-fit can.
  const fs::path c = tt::temp_dir("trainer_best_fit_c"), d = tt::temp_dir("trainer_best_fit_d");
  run_training(tiny_config(c, with("2")));
  const std::string e = error_of([&] {
    run_training(tiny_config(c, tt::joined(with("4"), {{"training.pack_strategy", "next_fit"}})));
  });
  for (const char* part :
       {"stopped after", "rows of a window packed best-fit over windows of 5 conversations",
        "training.pack_strategy and training.pack_window back", "checkpoint.restart_data_stream"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  run_training(tiny_config(d, tt::joined(with("2"), {{"training.pack_strategy", "next_fit"}})));
  EXPECT_EQ(run_training(tiny_config(d, with("4"))).steps_run, 2);
}

// torchtitan's checkpoint.exclude_from_loading = ["optimizer", "lr_scheduler", "dataloader"] resumes
// the weights and the step count alone: from there the run trains as a new run started from those
// weights does (fresh moments, the schedule from its start, the data from its beginning), and a
// later resume without the key keeps both the weights and those fresh starts.
TEST(Trainer, ExcludeFromLoadingTrainsOnAsANewRunFromTheSameWeights) {
  const Overrides common = {{"training.deterministic", "true"},
                            {"optimizer.lr", "3e-3"},
                            {"lr_scheduler.warmup_steps", "2"},
                            {"checkpoint.enable", "true"},
                            {"checkpoint.interval", "3"}};
  auto with = [&](const Overrides& extra) { return tt::joined(common, extra); };
  const fs::path a = tt::temp_dir("trainer_exclude_a"), b = tt::temp_dir("trainer_exclude_b");
  run_training(tiny_config(a, with({{"training.steps", "3"}})));
  // What steps 4 to 7 below must be: a new run from step 3's weights (before later saves prune them).
  run_training(tiny_config(b, {{"training.deterministic", "true"},
                               {"optimizer.lr", "3e-3"},
                               {"lr_scheduler.warmup_steps", "2"},
                               {"training.steps", "4"},
                               {"lr_scheduler.total_steps", "7"},
                               {"checkpoint.initial_load_path", (a / "checkpoint" / "step-3").string()}}));
  // Steps 4 and 5 of a schedule of 7 (a run stopped early), resumed with the three parts left out.
  const Overrides excluded = with({{"training.steps", "5"},
                                   {"lr_scheduler.total_steps", "7"},
                                   {"checkpoint.exclude_from_loading", "optimizer,lr_scheduler,dataloader"}});
  std::string out;
  const int rc = tt::run_command(
      titan() + " train --config " + debugmodel_toml().string() + tt::cli_args(tt::tiny_job(a, excluded)),
      &out);
  ASSERT_EQ(rc, 0) << out;
  for (const char* said :
       {"checkpoint.exclude_from_loading = \"dataloader\" applied as checkpoint.restart_data_stream = true",
        "checkpoint.exclude_from_loading: from step 4 on, AdamW's moments and step count start from zero and "
        "the LR schedule starts over (warmup included)",
        "remove it once this run has saved a checkpoint", "tokens seen; restored: the weights) in "})
    EXPECT_NE(out.find(said), std::string::npos) << said << " not in:\n" << out;
  std::ifstream saved(a / "checkpoint" / "step-5" / "train_state.json");
  const nlohmann::json ts = nlohmann::json::parse(saved);
  EXPECT_EQ(ts.at("optimizer_start_step"), 3);
  EXPECT_EQ(ts.at("lr_scheduler_start_step"), 3);
  // Steps 6 and 7 resume without the key: the fresh starts of step 4 hold; the log names every part.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_training(tiny_config(a, with({{"training.steps", "7"}}))).steps_run, 2);
  const std::string whole = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(
      whole.find("tokens seen; restored: the weights, AdamW's moments and step count, the LR schedule's "
                 "position, the data position) in "),
      std::string::npos)
      << whole;

  const std::vector<nlohmann::json> ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), 7u);
  ASSERT_EQ(rb.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(ra[3 + i].at(key), rb[i].at(key)) << key << " at step " << 4 + i;
  // Step 4 warmed up again: its lr is step 1's (half the peak, with 2 warmup steps).
  EXPECT_EQ(ra[3].at("lr"), ra[0].at("lr"));
  EXPECT_EQ(ra[3].at("lr").get<double>(), 1.5e-3);
}

// A folder of Hugging Face weights named by model.hf_assets_path but not loaded (initial_load_in_hf =
// false) trains from random weights, as torchtitan does; a forgotten key looks the same, so the run
// says so. A folder holding only the tokenizer (the bundled one) gets no note, nor does a load.
TEST(Trainer, HuggingFaceWeightsLeftUnloadedAreNamed) {
  const fs::path source = tt::temp_dir("trainer_unloaded_source");
  run_training(tiny_config(source, {{"checkpoint.enable", "true"},
                                    {"checkpoint.interval", "1"},
                                    {"checkpoint.last_save_in_hf", "true"},
                                    {"training.steps", "1"},
                                    {"validation.enable", "false"}}));
  const fs::path hf = source / "checkpoint" / "step-1-hf";  // weights, config.json and the tokenizer
  auto train = [&](const std::string& name, const tt::Overrides& extra) {
    std::string out;
    const tt::Overrides job = tt::joined({{"training.steps", "1"}, {"validation.enable", "false"}}, extra);
    EXPECT_EQ(tt::run_command(titan() + " train --config " + tt::debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(tt::temp_dir("trainer_unloaded_" + name), job)),
                              &out),
              0)
        << out;
    return out;
  };
  const std::string note =
      "note: model.hf_assets_path '" + hf.string() + "' holds Hugging Face weights this run does not load";
  const std::string unloaded = train("random", {{"model.hf_assets_path", hf.string()}});
  EXPECT_NE(unloaded.find(
                note + " (checkpoint.initial_load_in_hf = false): it starts from the random weights above; "
                       "set checkpoint.initial_load_in_hf = true to start from those"),
            std::string::npos)
      << unloaded;
  const std::string loaded =
      train("loaded", {{"model.hf_assets_path", hf.string()}, {"checkpoint.initial_load_in_hf", "true"}});
  EXPECT_NE(loaded.find("loaded Hugging Face weights from " + hf.string()), std::string::npos) << loaded;
  EXPECT_EQ(loaded.find("holds Hugging Face weights this run does not load"), std::string::npos) << loaded;
  const std::string bundled = train("bundled", {});
  EXPECT_NE(bundled.find("initialized weights from seed"), std::string::npos) << bundled;
  EXPECT_EQ(bundled.find("holds Hugging Face weights this run does not load"), std::string::npos) << bundled;
}

// The generation_config.json of the Hugging Face model a run starts from (its stop tokens and
// sampling defaults, what transformers' generate reads) travels with the weights: into every
// checkpoint, through a resume after the source folder lost it, into the run's exports and `titan
// export`'s. A run from random weights exports the stop tokens titan generate uses (config.json's
// <|im_end|> and the corpus's document separator <|endoftext|>), so that transformers' generate stops
// at the end of a document too, and so does one from a model naming no stop token; a file that is not
// a JSON object stops the run naming it.
TEST(Trainer, TheStartingModelsGenerationConfigTravelsToEveryExport) {
  const fs::path a = tt::temp_dir("trainer_generation_a"), b = tt::temp_dir("trainer_generation_b");
  const Overrides saving = {{"checkpoint.enable", "true"},
                            {"checkpoint.interval", "1"},
                            {"checkpoint.last_save_in_hf", "true"},
                            {"lr_scheduler.warmup_steps", "1"},
                            {"validation.enable", "false"}};
  run_training(tiny_config(a, tt::joined(saving, {{"training.steps", "1"}})));
  const fs::path source = a / "checkpoint" / "step-1-hf";
  auto read = [](const fs::path& file) { return nlohmann::json::parse(std::ifstream(file)); };
  EXPECT_EQ(read(source / "generation_config.json"),
            nlohmann::json({{"bos_token_id", 151643}, {"eos_token_id", {151645, 151643}}}));  // random init
  // A Hugging Face model that has none exports none (its files as they came).
  const fs::path plain = tt::temp_dir("trainer_generation_plain") / "model";
  fs::copy(source, plain, fs::copy_options::recursive);
  fs::remove(plain / "generation_config.json");
  const fs::path from_plain = tt::temp_dir("trainer_generation_from_plain");
  run_training(tiny_config(from_plain, tt::joined(saving, {{"training.steps", "1"},
                                                           {"checkpoint.initial_load_path", plain.string()},
                                                           {"checkpoint.initial_load_in_hf", "true"}})));
  EXPECT_TRUE(fs::exists(from_plain / "checkpoint" / "step-1-hf" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(from_plain / "checkpoint" / "step-1-hf" / "generation_config.json"));
  // One whose config.json names no eos_token_id either (as small test models are written) names no stop
  // token at all: it exports titan generate's, as a random init does, where transformers' generate on
  // the export used to run on to max_new_tokens.
  nlohmann::json config = read(plain / "config.json");
  config["eos_token_id"] = nullptr;
  std::ofstream(plain / "config.json") << config.dump();
  const fs::path from_bare = tt::temp_dir("trainer_generation_from_bare");
  run_training(tiny_config(from_bare, tt::joined(saving, {{"training.steps", "1"},
                                                          {"checkpoint.initial_load_path", plain.string()},
                                                          {"checkpoint.initial_load_in_hf", "true"}})));
  EXPECT_EQ(read(from_bare / "checkpoint" / "step-1-hf" / "generation_config.json"),
            nlohmann::json({{"bos_token_id", 151643}, {"eos_token_id", {151645, 151643}}}));
  const nlohmann::json generation = {
      {"bos_token_id", 151643}, {"do_sample", true}, {"eos_token_id", {151645, 151643}},
      {"temperature", 0.6},     {"top_k", 20},       {"top_p", 0.95}};
  std::ofstream(source / "generation_config.json") << generation.dump();
  auto from_source = [&](const char* steps) {
    return tt::joined(saving, {{"training.steps", steps},
                               {"checkpoint.initial_load_path", source.string()},
                               {"checkpoint.initial_load_in_hf", "true"}});
  };
  run_training(tiny_config(b, from_source("2")));
  EXPECT_EQ(read(b / "checkpoint" / "step-2-hf" / "generation_config.json"), generation);
  EXPECT_EQ(read(b / "checkpoint" / "step-1" / "train_state.json").at("generation_config"), generation);

  // The resume takes it from the checkpoint: the source folder no longer has it.
  fs::remove(source / "generation_config.json");
  EXPECT_EQ(run_training(tiny_config(b, from_source("3"))).steps_run, 1);
  EXPECT_EQ(read(b / "checkpoint" / "step-3-hf" / "generation_config.json"), generation);
  const fs::path exported = b / "export";
  std::string out;
  int rc = tt::run_command(titan() + " export --checkpoint " + (b / "checkpoint" / "step-3").string() +
                               " --out " + exported.string(),
                           &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(read(exported / "generation_config.json"), generation);
  rc = tt::run_command(
      titan() + " verify-export " + exported.string() + " --source " + (b / "checkpoint" / "step-3").string(),
      &out);
  EXPECT_EQ(rc, 0) << out;
  // titan eval reads the export's and writes nothing: it does not say the file goes into checkpoints.
  rc = tt::run_command(
      titan() + " eval --config " + debugmodel_toml().string() +
          cli_args(tiny_job(tt::temp_dir("trainer_generation_eval"), {{"validation.steps", "1"}})) +
          " --checkpoint " + exported.string(),
      &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("eval: loss "), std::string::npos) << out;
  EXPECT_EQ(out.find("goes into every checkpoint and export"), std::string::npos) << out;

  std::ofstream(source / "generation_config.json") << "[151645]";
  const std::string e =
      error_of([&] { run_training(tiny_config(tt::temp_dir("trainer_generation_c"), from_source("1"))); });
  EXPECT_NE(e.find((source / "generation_config.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("a generation config is a JSON object"), std::string::npos) << e;
  // A titan checkpoint named as Hugging Face weights: the error says how it loads.
  const std::string native = error_of([&] {
    run_training(tiny_config(
        tt::temp_dir("trainer_generation_d"),
        tt::joined(saving, {{"training.steps", "1"},
                            {"checkpoint.initial_load_path", (a / "checkpoint" / "step-1").string()},
                            {"checkpoint.initial_load_in_hf", "true"}})));
  });
  EXPECT_NE(native.find("it is a titan checkpoint, which loads with checkpoint.initial_load_in_hf = false"),
            std::string::npos)
      << native;
}

// checkpoint.initial_load_model_only = false forks a run: a new job folder goes on from another run's
// checkpoint with its whole training state (step, moments, schedule, data position) and trains what
// that run trains from there, bit for bit; the fork's own checkpoints then resume as usual.
TEST(Trainer, AWholeInitialLoadForksTheRunBitwise) {
  const Overrides common = {{"checkpoint.enable", "true"},
                            {"checkpoint.interval", "2"},
                            {"checkpoint.keep_latest_k", "0"},
                            {"training.deterministic", "true"},
                            {"training.steps", "5"}};
  const fs::path a = tt::temp_dir("trainer_fork_a"), b = tt::temp_dir("trainer_fork_b");
  run_training(tiny_config(a, common));
  const Overrides fork =
      tt::joined(common, {{"checkpoint.initial_load_path", (a / "checkpoint" / "step-2").string()},
                          {"checkpoint.initial_load_model_only", "false"}});
  const TrainSummary forked = run_training(
      tiny_config(b, tt::joined(fork, {{"training.steps", "4"}, {"lr_scheduler.total_steps", "5"}})));
  EXPECT_EQ(forked.steps_run, 2);
  EXPECT_EQ(forked.last_step, 4);
  EXPECT_EQ(CheckpointManager(b / "checkpoint", 3).committed_steps(), (std::vector<int64_t>{4}));
  // Its own checkpoint goes on (the initial load is for a folder with nothing to resume).
  EXPECT_EQ(run_training(tiny_config(b, fork)).steps_run, 1);
  const std::vector<nlohmann::json> ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), 5u);
  ASSERT_EQ(rb.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    for (const char* key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(ra[2 + i].at(key), rb[i].at(key)) << key << " at step " << 3 + i;

  // Model only (the default), the same folder gives step 1 of a fresh optimizer and schedule instead.
  const fs::path c = tt::temp_dir("trainer_fork_c");
  EXPECT_EQ(run_training(tiny_config(c, tt::joined(common, {{"checkpoint.initial_load_path",
                                                             (a / "checkpoint" / "step-2").string()}})))
                .steps_run,
            5);
}

// checkpoint.load_only resumes as usual and saves nothing (not every interval, not at the end): the
// folder is left as it was, and the steps it trains are the ones a saving run trains from there.
TEST(Trainer, LoadOnlyResumesAndLeavesTheCheckpointFolderAsItWas) {
  const fs::path a = tt::temp_dir("trainer_load_only");
  const Overrides common = {{"checkpoint.enable", "true"},
                            {"checkpoint.interval", "1"},
                            {"training.deterministic", "true"},
                            {"lr_scheduler.warmup_steps", "2"},
                            {"lr_scheduler.decay_ratio", "0"}};
  run_training(tiny_config(a, tt::joined(common, {{"training.steps", "2"}})));
  const JobConfig load_only =
      tiny_config(a, tt::joined(common, {{"training.steps", "4"}, {"checkpoint.load_only", "true"}}));
  EXPECT_EQ(run_training(load_only).steps_run, 2);
  EXPECT_EQ(CheckpointManager(a / "checkpoint", 3).committed_steps(), (std::vector<int64_t>{1, 2}));
  // A saving run from the same checkpoint trains the same two steps.
  EXPECT_EQ(run_training(tiny_config(a, tt::joined(common, {{"training.steps", "4"}}))).steps_run, 2);
  EXPECT_EQ(CheckpointManager(a / "checkpoint", 3).latest_step(), 4);
  const std::vector<nlohmann::json> records = read_metrics(a);
  ASSERT_EQ(records.size(), 6u);  // steps 1, 2, then 3, 4 twice
  for (size_t i : {2, 3})
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_EQ(records[i].at(key), records[i + 2].at(key)) << key << " at step " << i + 1;
}

// Started with its standard output closed (`>&-`, as some daemon and cron set-ups start a job),
// titan opens /dev/null there first: no console line lands in a file of the run. Before, the run's
// lock file took descriptor 1 and received the whole log; a checkpoint or an export could have.
TEST(Trainer, AClosedStandardOutputLandsInNoFileOfTheRun) {
  const fs::path dump = tt::temp_dir("trainer_closed_stdout");
  std::string err;  // standard error alone
  const std::string run = "{ " + titan() + " train --config " + debugmodel_toml().string() +
                          tt::cli_args(tt::tiny_job(dump, {{"training.steps", "2"},
                                                           {"checkpoint.enable", "true"},
                                                           {"checkpoint.last_save_in_hf", "true"}})) +
                          " >&-; }";
  ASSERT_EQ(tt::run_command(run, &err), 0) << err;
  for (const fs::path& lock : {dump / ".titan-rank0.lock", dump / "checkpoint" / ".titan-rank0.lock"}) {
    const std::string held = read_file(lock);
    EXPECT_EQ(held.rfind("pid ", 0), 0u) << lock << " holds: " << held.substr(0, 300);
    EXPECT_EQ(held.find("step:"), std::string::npos) << lock << " holds: " << held.substr(0, 300);
  }
  EXPECT_EQ(read_metrics(dump).size(), 2u);
  std::string verified;
  EXPECT_EQ(
      tt::run_command(titan() + " verify-export " + (dump / "checkpoint" / "step-2-hf").string(), &verified),
      0)
      << verified;
}

// torchtitan's seed checkpoint: checkpoint.create_seed_checkpoint writes the starting weights as step
// 0 and trains nothing; the job's later runs start from those weights (a step-0 checkpoint loads as
// weights only), whatever their own seed would draw. A folder that already holds checkpoints gets no
// seed.
TEST(Trainer, ASeedCheckpointHoldsTheWeightsTheJobStartsFrom) {
  const fs::path a = tt::temp_dir("trainer_seed_a"), b = tt::temp_dir("trainer_seed_b");
  const Overrides saving = {
      {"checkpoint.enable", "true"}, {"training.steps", "3"}, {"training.deterministic", "true"}};
  std::string out;
  const std::string seed_run =
      titan() + " train --config " + debugmodel_toml().string() +
      tt::cli_args(tt::tiny_job(
          a, tt::joined(saving, {{"training.seed", "7"}, {"checkpoint.create_seed_checkpoint", "true"}})));
  ASSERT_EQ(tt::run_command(seed_run, &out), 0) << out;
  EXPECT_NE(out.find("checkpoint.create_seed_checkpoint: step 0 holds the starting weights; nothing trained"),
            std::string::npos)
      << out;
  EXPECT_EQ(CheckpointManager(a / "checkpoint", 3).committed_steps(), (std::vector<int64_t>{0}));
  EXPECT_FALSE(fs::exists(a / "metrics.jsonl"));

  // Seed 8 would draw other weights: the run starts from the seed's (seed 7), as a fresh run of seed 7.
  const TrainSummary trained = run_training(tiny_config(a, tt::joined(saving, {{"training.seed", "8"}})));
  EXPECT_EQ(trained.steps_run, 3);
  run_training(tiny_config(b, tt::joined(saving, {{"training.seed", "7"}})));
  const std::vector<nlohmann::json> ra = read_metrics(a), rb = read_metrics(b);
  ASSERT_EQ(ra.size(), 3u);
  ASSERT_EQ(rb.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_EQ(ra[i].at(key), rb[i].at(key)) << key << " at step " << i + 1;

  out.clear();
  EXPECT_NE(tt::run_command(seed_run, &out), 0) << out;
  EXPECT_NE(out.find("checkpoint.create_seed_checkpoint = true: '" + (a / "checkpoint").string() +
                     "' already holds checkpoints (the newest: step 3)"),
            std::string::npos)
      << out;
}

// `titan eval` evaluates the job's [validation] data as the run's validation does: on a checkpoint
// (given, or the job's newest) and on that step's Hugging Face export it gives the val_loss the run
// logged at that step, bit for bit; with nothing to load, the seeded initialisation, whose loss is
// about ln(vocab) (a random model spreads its guesses over the vocabulary).
TEST(Trainer, EvalGivesTheValidationLossTheRunLoggedAtThatStep) {
  const fs::path a = tt::temp_dir("trainer_eval_a"), fresh = tt::temp_dir("trainer_eval_fresh");
  const Overrides job = {{"training.steps", "2"},       {"checkpoint.enable", "true"},
                         {"checkpoint.interval", "2"},  {"checkpoint.last_save_in_hf", "true"},
                         {"validation.enable", "true"}, {"validation.freq", "2"},
                         {"validation.steps", "2"}};
  run_training(tiny_config(a, job));
  const std::map<int64_t, double> logged = by_step(read_metrics(a), "val_loss");
  ASSERT_TRUE(logged.count(2));
  const fs::path json = a / "eval.json";
  auto eval = [&](const fs::path& dump, const std::string& extra) {
    std::string out;
    const int rc =
        tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                            tt::cli_args(tt::tiny_job(dump, job)) + " --json " + json.string() + extra,
                        &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out.find("optimizer and step start fresh"), std::string::npos) << out;  // (nothing is trained)
    EXPECT_EQ(out.find("note: the checkpoint's run validated"), std::string::npos) << out;
    return nlohmann::json::parse(std::ifstream(json));
  };
  const fs::path step2 = a / "checkpoint" / "step-2";
  for (const std::string& given : {" --checkpoint " + step2.string(), std::string(),
                                   " --checkpoint " + (a / "checkpoint" / "step-2-hf").string()}) {
    const nlohmann::json r = eval(a, given);
    EXPECT_EQ(r.at("loss").get<double>(), logged.at(2)) << given;
    EXPECT_EQ(r.at("tokens"), 2 * 2 * 64) << given;  // 2 batches of 2 x 64
  }
  EXPECT_EQ(eval(a, "").at("weights"), step2.string());
  {  // rows of another length than the run validated: said, with the setting that scores the run's
    std::string out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, job)) + " --validation.seq_len=32",
                              &out),
              0)
        << out;
    EXPECT_NE(out.find("note: the checkpoint's run validated rows of 64 tokens, this eval rows of 32, so its "
                       "tokens are scored with other contexts than the val_loss that run logged: "
                       "validation.seq_len = 64 scores those"),
              std::string::npos)
        << out;
  }
  {  // checkpointing off over the run's folder: the starting weights are not scored in place of what it
     // trained (titan train refuses the folder too); --checkpoint still picks a step
    Overrides off = job;
    for (auto& [key, value] : off)
      if (key == "checkpoint.enable") value = "false";
    std::string out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, off)),
                              &out),
              1)
        << out;
    EXPECT_NE(
        out.find("titan eval: error: checkpoint.enable = false, but '" + (a / "checkpoint").string() +
                 "' holds committed checkpoints (steps 2): titan eval would score the job's starting "
                 "weights, not what it trained; set checkpoint.enable = true to score step 2 (the newest)"),
        std::string::npos)
        << out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, off)) + " --checkpoint " + step2.string(),
                              &out),
              0)
        << out;
  }
  {  // eval reads [validation] whether or not training would: no note calls its keys without effect
    Overrides off = job;
    for (auto& [key, value] : off)
      if (key == "validation.enable") value = "false";
    // nor says the seed has no effect on the starting weights: eval names the weights it evaluates
    off.push_back({"training.seed", "7"});
    off.push_back({"checkpoint.initial_load_path", step2.string()});
    std::string out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, off)) + " --checkpoint " + step2.string(),
                              &out),
              0)
        << out;
    EXPECT_NE(out.find("eval: loss"), std::string::npos) << out;
    EXPECT_EQ(out.find("no effect, validation.enable = false"), std::string::npos) << out;
    EXPECT_EQ(out.find("no effect, the job starts from loaded weights"), std::string::npos) << out;
  }
  // --json is checked before the evaluation: never into a finished checkpoint (its manifest would be
  // replaced), never into a missing folder (the result lost after the evaluation ran).
  for (const auto& [json_path, rule] :
       {std::pair{step2 / "manifest.json", "' lies inside the titan checkpoint '" + step2.string() + "'"},
        std::pair{a / "missing" / "eval.json",
                  std::string(": the folder '") + (a / "missing").string() + "' does not exist"}}) {
    const std::string manifest = read_file(step2 / "manifest.json");
    std::string out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, job)) + " --json " + json_path.string(),
                              &out),
              1);
    EXPECT_NE(out.find("titan eval: error: --json"), std::string::npos) << out;
    EXPECT_NE(out.find(rule), std::string::npos) << out;
    EXPECT_EQ(out.find("loss"), std::string::npos) << "evaluated before refusing:\n" << out;
    EXPECT_EQ(read_file(step2 / "manifest.json"), manifest);
  }
  {  // nor over the data it evaluates
    const fs::path data = a / "held_out.jsonl";
    std::ofstream(data) << "{\"text\": \"A held-out document.\"}\n";
    std::string out;
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, job)) +
                                  " --validation.dataset_path=" + data.string() + " --json " + data.string(),
                              &out),
              1);
    EXPECT_NE(
        out.find("titan eval: error: --json: '" + data.string() + "' is the input '" + data.string() + "'"),
        std::string::npos)
        << out;
    EXPECT_EQ(read_file(data), "{\"text\": \"A held-out document.\"}\n");
    // nor over a file a glob of the held-out data matches, nor where the glob would match it next
    out.clear();
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, job)) +
                                  " --validation.dataset_path=" + (a / "held_*.jsonl").string() + " --json " +
                                  (a / "held_eval.jsonl").string(),
                              &out),
              1);
    EXPECT_NE(out.find("titan eval: error: --json: '" + (a / "held_eval.jsonl").string() +
                       "' matches validation.dataset_path '" + (a / "held_*.jsonl").string() +
                       "': the next evaluation would read the result as data"),
              std::string::npos)
        << out;
    EXPECT_FALSE(fs::exists(a / "held_eval.jsonl"));
    out.clear();
    EXPECT_EQ(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(a, job)) + " --validation.dataset_path=" +
                                  (a / "held_*.jsonl").string() + " --json " + data.string(),
                              &out),
              1);
    EXPECT_NE(out.find("titan eval: error: --json: '" + data.string() +
                       "' matches validation.dataset_path '" + (a / "held_*.jsonl").string() + "'"),
              std::string::npos)
        << out;
    EXPECT_EQ(read_file(data), "{\"text\": \"A held-out document.\"}\n");
  }
  // A checkpoint of another model than the job's (its model_config says another norm eps): the
  // error names what chose it.
  const fs::path other = tt::temp_dir("trainer_eval_other"), other_step = other / "checkpoint" / "step-2";
  fs::create_directories(other / "checkpoint");
  fs::copy(step2, other_step, fs::copy_options::recursive);
  nlohmann::json state = nlohmann::json::parse(std::ifstream(other_step / "train_state.json"));
  state["model_config"]["rms_norm_eps"] = 1e-5;
  std::ofstream(other_step / "train_state.json") << state.dump(2);
  for (const auto& [given, named] :
       {std::pair{" --checkpoint " + other_step.string(), "titan eval: error: --checkpoint"},
        std::pair{std::string(), "the job's newest checkpoint"}}) {
    std::string out;
    EXPECT_NE(tt::run_command(titan() + " eval --config " + debugmodel_toml().string() +
                                  tt::cli_args(tt::tiny_job(other, job)) + given,
                              &out),
              0);
    EXPECT_NE(
        out.find(std::string(named) + ": '" + (other_step / "train_state.json").string() +
                 "' describes another model than this run's (flavor debugmodel): rms_norm_eps = 1e-05 there, "
                 "1e-06 in this run (model.norm_eps)"),
        std::string::npos)
        << out;
  }

  const nlohmann::json initial = eval(fresh, "");
  EXPECT_EQ(initial.at("weights"), "initialized from seed 42");  // configs/debugmodel.toml's
  EXPECT_NEAR(initial.at("loss").get<double>(), std::log(151936.0), 0.2);
  EXPECT_FALSE(fs::exists(fresh / "checkpoint"));  // nothing written
}

// `titan generate --checkpoint` stops at the eos_token_id of the generation config the run recorded,
// as it stops at an export's generation_config.json. The run's one step has an lr of 1e-12, far below
// half an f32 ulp of its weights, so the checkpoint generates what the starting weights generate.
TEST(Trainer, GenerateFromACheckpointStopsAtTheRecordedEosIds) {
  const fs::path a = tt::temp_dir("trainer_generate_eos_a"), b = tt::temp_dir("trainer_generate_eos_b");
  run_training(tiny_config(a, {{"training.steps", "1"}, {"checkpoint.last_save_in_hf", "true"}}));
  const fs::path source = a / "checkpoint" / "step-1-hf";
  const std::string args = " --prompt-ids 17,400,2048,5 --max-new-tokens 6 --json --ignore-eos";
  // The ids of --json's line (the output also holds the command's closing line).
  auto ids_in = [](const std::string& out) {
    const size_t line = out.find("{\"");
    if (line == std::string::npos) return std::vector<int64_t>();
    return nlohmann::json::parse(out.substr(line, out.find('\n', line) - line))
        .at("ids")
        .get<std::vector<int64_t>>();
  };
  auto generated = [&](const std::string& what) {
    std::string out;
    const int rc = tt::run_command(titan() + " generate " + what + args, &out);
    EXPECT_EQ(rc, 0) << out;
    return ids_in(out);
  };
  const std::vector<int64_t> ids = generated("--model-path " + source.string());
  ASSERT_EQ(ids.size(), 6u);
  const int64_t eos = ids[2];
  const std::vector<int64_t> until_eos(ids.begin(), std::find(ids.begin(), ids.end(), eos) + 1);
  std::ofstream(source / "generation_config.json") << nlohmann::json({{"eos_token_id", {eos}}}).dump();

  run_training(tiny_config(b, {{"training.steps", "1"},
                               {"optimizer.lr", "1e-12"},
                               {"checkpoint.enable", "true"},
                               {"checkpoint.initial_load_path", source.string()},
                               {"checkpoint.initial_load_in_hf", "true"}}));
  fs::remove(source / "generation_config.json");  // the checkpoint's record is what counts
  const std::string checkpoint = "--checkpoint " + (b / "checkpoint" / "step-1").string();
  EXPECT_EQ(generated(checkpoint), ids);  // --ignore-eos: the same six tokens
  std::string out;
  const int rc = tt::run_command(titan() + " generate " + checkpoint +
                                     " --prompt-ids 17,400,2048,5 "
                                     "--max-new-tokens 6 --json",
                                 &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("stopped at stop token"), std::string::npos) << out;
  EXPECT_EQ(ids_in(out), until_eos) << out;
}

// A run's [kernels] rules are its own: the next run in the same process (a test program's, titan
// check's) starts from the default kernels when its config has none.
TEST(Trainer, AKernelsRuleDoesNotOutliveItsRun) {
  const fs::path dump = tt::temp_dir("trainer_kernels_rule");
  train::JobConfig with_rule = tiny_config(dump, {{"training.steps", "1"}});
  with_rule.kernels.push_back({"rope", "gather_free", "layers.*"});
  run_training(with_rule);
  ASSERT_EQ(kernels::substitutions().size(), 1u) << "the run installed its rule";
  fs::remove_all(dump);
  run_training(tiny_config(dump, {{"training.steps", "1"}}));
  EXPECT_TRUE(kernels::substitutions().empty()) << "the first run's rule still applies";
}

// training.activation_grad_dtype = "bfloat16": the same run as with f32 activation gradients up to
// their rounding to bf16 (losses within 1e-3, grad norms within 1e-2 relative over 4 steps of the
// tiny model), the setting ends with its run, and it is refused with f32 activations.
TEST(Trainer, Bf16ActivationGradientsFollowTheF32RunAndEndWithIt) {
  const fs::path f32_dump = tt::temp_dir("trainer_act_grads_f32"),
                 bf16_dump = tt::temp_dir("trainer_act_grads_bf16");
  run_training(tiny_config(f32_dump, {{"training.steps", "4"}}));
  run_training(
      tiny_config(bf16_dump, {{"training.steps", "4"}, {"training.activation_grad_dtype", "bfloat16"}}));
  EXPECT_FALSE(autograd::bf16_activation_gradients()) << "the setting ended with its run";
  const auto f32 = read_metrics(f32_dump), bf16 = read_metrics(bf16_dump);
  const auto f32_loss = by_step(f32, "loss"), bf16_loss = by_step(bf16, "loss");
  const auto f32_norm = by_step(f32, "grad_norm"), bf16_norm = by_step(bf16, "grad_norm");
  ASSERT_EQ(f32_loss.size(), 4u);
  ASSERT_EQ(bf16_loss.size(), 4u);
  bool any_differs = false;
  for (const auto& [step, loss] : f32_loss) {
    EXPECT_NEAR(bf16_loss.at(step), loss, 1e-3) << "step " << step;
    EXPECT_NEAR(bf16_norm.at(step), f32_norm.at(step), 1e-2 * f32_norm.at(step)) << "step " << step;
    any_differs |= bf16_norm.at(step) != f32_norm.at(step);
  }
  EXPECT_TRUE(any_differs) << "the gradients were rounded to bf16 somewhere";

  const std::string err = error_of([&] {
    run_training(tiny_config(
        tt::temp_dir("trainer_act_grads_f32_compute"),
        {{"training.activation_grad_dtype", "bfloat16"}, {"training.mixed_precision_param", "float32"}}));
  });
  EXPECT_NE(err.find("training.activation_grad_dtype"), std::string::npos) << err;
  EXPECT_NE(err.find("training.mixed_precision_param"), std::string::npos) << err;
}

TEST(Trainer, MissingInputsAreClearErrorsBeforeAnyCompute) {
  const fs::path dump = tt::temp_dir("trainer_missing");
  const fs::path empty_dir = tt::temp_dir("trainer_missing_empty");
  struct Case {
    Overrides overrides;
    std::string expect;  // the path (and key) the message must name
    // Found before the run's folders are locked (nothing written there); the weights to start from
    // are checked after the lock, once it is known the run does not resume.
    bool before_the_folders = true;
  };
  const std::vector<Case> cases = {
      {{{"training.dataset_path", "/nonexistent/corpus.jsonl"}}, "/nonexistent/corpus.jsonl"},
      {{{"training.dataset", "no-such-corpus"}}, "no-such-corpus"},
      {{{"model.hf_assets_path", "/nonexistent/tokenizer"}}, "/nonexistent/tokenizer"},
      {{{"model.hf_assets_path", empty_dir.string()}}, "tokenizer.json"},
      {{{"model.name", "hf"}, {"model.hf_assets_path", empty_dir.string()}}, "config.json"},
      {{{"checkpoint.initial_load_path", "/nonexistent/step-40"}}, "/nonexistent/step-40", false},
      {{{"checkpoint.initial_load_path", empty_dir.string()}}, "COMMITTED", false},
      {{{"checkpoint.initial_load_path", empty_dir.string()}, {"checkpoint.initial_load_in_hf", "true"}},
       "model.safetensors",
       false},
  };
  for (const auto& c : cases) {
    fs::remove_all(dump);
    std::string e = error_of([&] { run_training(tiny_config(dump, c.overrides)); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << "'" << c.expect << "' not in: " << e;
    EXPECT_FALSE(fs::exists(dump / "metrics.jsonl")) << "compute started for " << c.expect;
    if (c.before_the_folders) {
      EXPECT_FALSE(fs::exists(dump)) << "the run wrote to its folder for " << c.expect;
    }
  }
  // Through the binary: exit status 1 and the message on stderr.
  std::string out;
  int rc = tt::run_command(titan() + " train --config " + debugmodel_toml().string() +
                               cli_args(tiny_job(dump, {{"training.dataset_path", "/nonexistent/corpus.jsonl"}})),
                           &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("error"), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/corpus.jsonl"), std::string::npos) << out;
  out.clear();
  rc = tt::run_command(titan() + " train --config " + debugmodel_toml().string() + " --training.stpes=3",
                       &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("did you mean 'training.steps'"), std::string::npos) << out;
}

// Weights whose config differs from the run's model in several fields (a tiny transformers checkpoint
// under the full debugmodel flavor) are refused with every such field named in one error, not the
// first alone, whose fix would only bring the next; a resume's model check, the same.
TEST(Trainer, AnotherModelsWeightsNameEveryDifferingFieldAtOnce) {
  const fs::path hf = tt::fixtures_dir() / "oracles" / "hf-transformers-5.17" / "tiny_dense";
  const JobConfig config = load_job_config(tt::debugmodel_toml().string(),
                                           {{"job.dump_folder", tt::temp_dir("trainer_every_field").string()},
                                            {"training.steps", "1"},
                                            {"lr_scheduler.warmup_steps", "1"},
                                            {"checkpoint.initial_load_path", hf.string()},
                                            {"checkpoint.initial_load_in_hf", "true"}});
  const qwen3::ModelArgs theirs = qwen3::args_from_hf_config_file((hf / "config.json").string()),
                         run = resolve_model_args(config);
  const std::string e = error_of([&] { run_training(config); });
  std::vector<std::string> named;
  for (const std::string& key : qwen3::override_keys()) {
    const std::string a = qwen3::field_text(theirs, key), b = qwen3::field_text(run, key);
    if (!qwen3::shapes_the_computation(key) || a == b) continue;
    named.push_back(key);
    // Named as config.json names it, and as [model] does where that differs.
    const std::string in_file = qwen3::hf_config_key(key);
    EXPECT_NE(e.find(in_file + " = " + a + " there, " + b + " in this run" +
                     (in_file == key ? "" : " (model." + key + ")")),
              std::string::npos)
        << key << ": " << e;
  }
  for (const char* key : {"vocab_size", "dim", "n_layers", "n_heads", "hidden_dim"})
    EXPECT_NE(std::find(named.begin(), named.end(), key), named.end()) << key << " is the same in both";
  EXPECT_NE(e.find("checkpoint.initial_load_path: '" + (hf / "config.json").string() +
                   "' describes another model than this run's (flavor debugmodel): vocab_size = "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("; its weights would compute something else here (point the model at "
                   "that config, or set model.vocab_size, model.dim, "),
            std::string::npos)
      << e;

  const fs::path dump = tt::temp_dir("trainer_every_field_resume");
  run_training(tiny_config(dump, {{"training.steps", "1"}, {"checkpoint.enable", "true"}}));
  const std::string resumed = error_of([&] {
    run_training(tiny_config(dump, {{"training.steps", "2"},
                                    {"checkpoint.enable", "true"},
                                    {"model.n_layers", "3"},
                                    {"model.hidden_dim", "96"}}));
  });
  EXPECT_NE(
      resumed.find("was trained with model.n_layers = 2, model.hidden_dim = 128 but this run's model has "
                   "model.n_layers = 3, model.hidden_dim = 96; resuming would load it into a different "
                   "model"),
      std::string::npos)
      << resumed;
  EXPECT_EQ(resumed.find("to untie its head"), std::string::npos) << resumed;
  // Untying the head of a tied run's checkpoint is a new run from its weights: the error says how.
  const std::string untied = error_of([&] {
    run_training(tiny_config(
        dump, {{"training.steps", "2"}, {"checkpoint.enable", "true"}, {"model.tie_embeddings", "false"}}));
  });
  EXPECT_NE(
      untied.find("was trained with model.tie_embeddings = true but this run's model has "
                  "model.tie_embeddings = false; resuming would load it into a different model (restore the "
                  "model config, or use another job.dump_folder); to untie its head, start a run in another "
                  "job.dump_folder from its weights only (checkpoint.initial_load_path, "
                  "checkpoint.initial_load_model_only = true): the head starts as a copy of the embedding"),
      std::string::npos)
      << untied;
}

// Weights of another architecture load without a shape error and compute something else: the model
// config that comes with checkpoint.initial_load_path (an HF folder's config.json, a native
// checkpoint's model_config) must agree with the run's model, except in fields [model] sets.
TEST(Trainer, InitialWeightsOfAnotherArchitectureAreRefusedNamingTheField) {
  const fs::path source = tt::temp_dir("trainer_initial_arch_source");
  run_training(tiny_config(source, {{"training.steps", "1"},
                                    {"checkpoint.enable", "true"},
                                    {"checkpoint.last_save_in_hf", "true"},
                                    {"checkpoint.export_dtype", "float32"}}));
  const fs::path hf = tt::temp_dir("trainer_initial_arch_hf") / "model";
  fs::copy(source / "checkpoint" / "step-1-hf", hf, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(hf / "config.json"));
  config["rope_parameters"]["rope_theta"] = 10000.0;
  config["rope_theta"] = 10000.0;
  std::ofstream(hf / "config.json") << config.dump(2);
  const fs::path dump = tt::temp_dir("trainer_initial_arch");
  const Overrides from_hf = {{"training.steps", "1"},
                             {"checkpoint.initial_load_path", hf.string()},
                             {"checkpoint.initial_load_in_hf", "true"}};
  std::string e = error_of([&] { run_training(tiny_config(dump, from_hf)); });
  EXPECT_NE(e.find("checkpoint.initial_load_path: '" + (hf / "config.json").string() +
                   "' describes another model than this run's (flavor debugmodel): "
                   "rope_theta = 10000 there, 1e+06 in this run; its weights"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
  // Chosen on purpose in [model]: it trains from those weights.
  EXPECT_EQ(run_training(tiny_config(dump, tt::joined(from_hf, {{"model.rope_theta", "10000"}}))).last_step,
            1);
  // The same folder as the model's assets (torchtitan's layout: a flavor, and the weights and
  // tokenizer of model.hf_assets_path): the same rule. It used to train without a word.
  const Overrides from_assets = {{"training.steps", "1"},
                                 {"model.hf_assets_path", hf.string()},
                                 {"checkpoint.initial_load_in_hf", "true"}};
  e = error_of([&] { run_training(tiny_config(tt::temp_dir("trainer_initial_arch_assets"), from_assets)); });
  EXPECT_NE(e.find("model.hf_assets_path: '" + (hf / "config.json").string() +
                   "' describes another model than this run's (flavor debugmodel): "
                   "rope_theta = 10000 there, 1e+06 in this run; its weights"),
            std::string::npos)
      << e;
  // Another max_position_embeddings (the Hub's Base models say 32768 where the flavors say 40960) is a
  // bound on the positions, not another model: it trains.
  config["rope_parameters"]["rope_theta"] = 1e6;
  config["rope_theta"] = 1e6;
  config["max_position_embeddings"] = 32768;
  std::ofstream(hf / "config.json") << config.dump(2);
  EXPECT_EQ(run_training(tiny_config(tt::temp_dir("trainer_initial_arch_assets"), from_assets)).last_step, 1);

  // A native checkpoint's model_config: the same rule (read at start-up, before the checkpoint loads).
  const fs::path native = source / "checkpoint" / "step-1";
  nlohmann::json state = nlohmann::json::parse(std::ifstream(native / "train_state.json"));
  state["model_config"]["rms_norm_eps"] = 1e-5;
  std::ofstream(native / "train_state.json") << state.dump(2);
  e = error_of([&] {
    run_training(tiny_config(tt::temp_dir("trainer_initial_arch_native"),
                             {{"training.steps", "1"}, {"checkpoint.initial_load_path", native.string()}}));
  });
  EXPECT_NE(
      e.find("train_state.json' describes another model than this run's (flavor debugmodel): rms_norm_eps = "
             "1e-05 there, 1e-06 in this run (model.norm_eps)"),
      std::string::npos)
      << e;
}

// Lines of metrics.jsonl written whole so far (the run may be writing the next).
size_t steps_logged(const fs::path& dump) {
  std::ifstream f(dump / "metrics.jsonl");
  size_t n = 0;
  for (std::string line; std::getline(f, line) && !line.empty() && line.back() == '}';) ++n;
  return n;
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM";
}

struct SignalledRun {
  tt::Overrides extra;                                                 // the job's keys
  std::function<void(pid_t, const fs::path& dump)> mid_run = nullptr;  // once a step is logged
  int stdout_fd = -1;             // the run's standard output, closed here once it started (default: the log)
  std::string* output = nullptr;  // receives the log
  bool twice = false;             // the signal again 50 ms after the first
};

// `titan train` in the background; `sig` once a step is logged (and `run.mid_run` has run): exit 0
// with a committed checkpoint at the step it reached.
void stop_with_signal(int sig, const std::string& name, const SignalledRun& run = {}) {
  const fs::path dump = tt::temp_dir(name);
  const fs::path log = dump.parent_path() / (name + ".log");
  std::vector<std::string> argv = {titan(), "train", "--config", debugmodel_toml().string()};
  const tt::Overrides stop_job = {
      {"training.steps", "100000"}, {"checkpoint.enable", "true"}, {"checkpoint.interval", "100000"}};
  for (auto& [k, v] : tiny_job(dump, tt::joined(stop_job, run.extra))) argv.push_back("--" + k + "=" + v);
  // A test program started under nohup would pass its ignored SIGHUP on: the run gets the default.
  void (*const hang_up_before)(int) = sig == SIGHUP ? std::signal(SIGHUP, SIG_DFL) : nullptr;
  const pid_t pid = tt::spawn_logged(argv, log, run.stdout_fd);
  if (sig == SIGHUP) std::signal(SIGHUP, hang_up_before);
  if (run.stdout_fd >= 0) close(run.stdout_fd);
  ASSERT_NE(pid, 0) << argv[0] << " did not start";

  auto wait_exit = [&](double seconds, int* status) {
    for (auto t0 = std::chrono::steady_clock::now();
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds;) {
      if (waitpid(pid, status, WNOHANG) == pid) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  int status = 0;
  bool logged = false;
  for (auto t0 = std::chrono::steady_clock::now();
       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 300;) {
    if (steps_logged(dump) > 0) {
      logged = true;
      break;
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;  // died early: reported below
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!logged) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "no step was logged:\n" << read_file(log);
  }
  if (run.mid_run) run.mid_run(pid, dump);
  ASSERT_EQ(kill(pid, sig), 0);
  if (run.twice) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(pid, sig);
  }
  if (!wait_exit(300, &status)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "titan train did not stop after signal " << sig << ":\n" << read_file(log);
  }
  const std::string out = read_file(log);
  if (run.output) *run.output = out;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  // Said at once, when the signal came; then the step boundary's line (a save, or what there was
  // nothing to save for).
  const std::string received = std::string("received ") + signal_name(sig);
  EXPECT_NE(out.find(received + ": stopping cleanly once this step is done"), std::string::npos) << out;
  EXPECT_TRUE(out.find(received + ": saving a checkpoint at step") != std::string::npos ||
              out.find(received + " at step") != std::string::npos)
      << out;
  // The log is a file: no line was left unfinished, so no escape code erases one.
  EXPECT_EQ(out.find("\033["), std::string::npos) << out;

  auto records = read_metrics(dump);
  ASSERT_FALSE(records.empty());
  const int64_t reached = records.back()["step"].get<int64_t>();
  CheckpointManager ckpt(dump / "checkpoint", 3);
  ASSERT_EQ(ckpt.latest_step(), reached) << out;
  LoadedCheckpoint c = ckpt.load(reached);
  EXPECT_EQ(c.train_state["step"].get<int64_t>(), reached);
  EXPECT_EQ(c.train_state["tokens_seen"].get<int64_t>(), reached * 2 * 64);
  EXPECT_FALSE(fs::exists(dump / "checkpoint" / ("step-" + std::to_string(reached) + "-hf")));
}

// The final export is the only output of a run without checkpoints: when it fails (here the file
// size limit cuts it, as a full disk would), the error says that nothing of the run is on disk,
// beside the write's own failure; no half-written export is left.
TEST(Trainer, AFailedFinalExportSaysWhatOfTheRunIsOnDisk) {
  const fs::path dump = tt::temp_dir("trainer_export_fails");
  const JobConfig cfg = tiny_config(dump, {{"training.steps", "2"}, {"checkpoint.last_save_in_hf", "true"}});
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  struct rlimit limit = before;
  limit.rlim_cur = size_t(1) << 20;  // the run's logs fit; the export's 151936-row embedding does not
  void (*previous)(int) = std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const std::string e = tt::error_of([&] { run_training(cfg); });
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(e.find("File too large"), std::string::npos) << e;
  EXPECT_NE(e.find("the run's final Hugging Face export (checkpoint.last_save_in_hf) of step 2 failed: no "
                   "checkpoint holds the weights of its 2 steps (checkpoint.enable = false): they are not on "
                   "disk"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_metrics(dump).size(), 2u);  // the steps ran
  if (fs::exists(dump / "checkpoint"))       // the run's lock files alone
    for (const auto& entry : fs::directory_iterator(dump / "checkpoint"))
      if (entry.path().filename().string().rfind(".titan-rank", 0) != 0)
        ADD_FAILURE() << "left behind: " << entry.path();
}

TEST(Trainer, SigtermSavesACheckpointAndExitsZero) {
  stop_with_signal(SIGTERM, "trainer_sigterm");
}
// With log_freq far beyond the steps reached, the log still ends on the step the run stopped at
// (stop_with_signal checks that metrics.jsonl's last record is the checkpoint's step).
TEST(Trainer, ASignalEndsTheLogOnTheStepReachedWhateverLogFreq) {
  stop_with_signal(SIGTERM, "trainer_sigterm_log_freq", {.extra = {{"metrics.log_freq", "100000"}}});
}
TEST(Trainer, SigintSavesACheckpointAndExitsZero) {
  stop_with_signal(SIGINT, "trainer_sigint");
}
// The terminal of an ssh session that dropped: the run saves and stops as on a Ctrl-C.
// A dropped ssh session hangs up twice (bash passes its SIGHUP on to its jobs, then the kernel hangs
// up the terminal's foreground group): the second is ignored, not the end of the save.
TEST(Trainer, SighupSavesACheckpointAndExitsZero) {
  std::string out;
  stop_with_signal(SIGHUP, "trainer_sighup",
                   {.extra = {}, .mid_run = nullptr, .output = &out, .twice = true});
  EXPECT_NE(
      out.find("received SIGHUP: stopping cleanly once this step is done (or the final save and export, "
               "when the steps are); further hang-ups are ignored"),
      std::string::npos)
      << out;
}
// SIGUSR1 (what mpirun forwards to every rank, what Slurm's --signal=USR1@<seconds> sends before a
// time limit) stops as cleanly; a repeat is ignored, as a scheduler may send it again.
TEST(Trainer, Sigusr1SavesACheckpointAndExitsZero) {
  std::string out;
  stop_with_signal(SIGUSR1, "trainer_sigusr1",
                   {.extra = {}, .mid_run = nullptr, .output = &out, .twice = true});
  EXPECT_NE(out.find("received SIGUSR1: stopping cleanly once this step is done (or the final save and "
                     "export, when the steps are); further SIGUSR1s are ignored"),
            std::string::npos)
      << out;
}
// Started ignoring SIGHUP (nohup), a run keeps ignoring it: two more steps are logged after a
// hang-up, and only the SIGTERM after them stops it.
TEST(Trainer, ARunStartedUnderNohupTrainsOnThroughAHangUp) {
  void (*const before)(int) = std::signal(SIGHUP, SIG_IGN);  // as nohup starts it; the run inherits it
  std::string out;
  stop_with_signal(SIGTERM, "trainer_nohup",
                   {.extra = {},
                    .mid_run =
                        [&](pid_t pid, const fs::path& dump) {
                          std::signal(SIGHUP, before);
                          const size_t at_hang_up = steps_logged(dump);
                          kill(pid, SIGHUP);
                          for (auto t0 = std::chrono::steady_clock::now();
                               steps_logged(dump) < at_hang_up + 2 &&
                               std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120);)
                            std::this_thread::sleep_for(std::chrono::milliseconds(50));
                          EXPECT_GE(steps_logged(dump), at_hang_up + 2) << "the run did not train on";
                        },
                    .output = &out});
  std::signal(SIGHUP, before);
  EXPECT_EQ(out.find("SIGHUP"), std::string::npos) << out;
}
// `titan train ... | tee log` and a Ctrl-C, which tee takes too: the run's standard output is a
// pipe whose reader has exited. The run still saves, and its lines from then on (the save's
// included) are on standard error, after one line saying why. Before, the first write after
// tee's exit killed the run (SIGPIPE) and nothing was saved.
TEST(Trainer, ACtrlCAfterTheConsolesPipeReaderExitedStillSaves) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  fcntl(pipe_fds[1], F_SETPIPE_SZ, 1 << 20);  // the start-up lines never wait for a reader
  std::string out;                            // standard error alone
  stop_with_signal(SIGINT, "trainer_broken_pipe",
                   {.extra = {},
                    .mid_run = [&](pid_t, const fs::path&) { close(pipe_fds[0]); },
                    .stdout_fd = pipe_fds[1],
                    .output = &out});
  const size_t note = out.find(
      "titan: standard output is a pipe whose reader has exited (broken pipe): the "
      "run goes on, and its console lines continue here, on standard error");
  EXPECT_NE(note, std::string::npos) << out;
  EXPECT_NE(out.find("checkpoint: saved", note), std::string::npos) << out;
  EXPECT_NE(out.find("summary: ", note), std::string::npos) << out;
}
// Saving every step in the background: the signal finds a save of the step reached still being
// written (or just committed), and the run commits it before it exits.
TEST(Trainer, ASignalDuringABackgroundSaveCommitsItBeforeExiting) {
  stop_with_signal(SIGTERM, "trainer_sigterm_async",
                   {.extra = {{"checkpoint.async_mode", "async"}, {"checkpoint.interval", "1"}}});
}

// A signal while the final export is being written (the steps are done) lets it finish: said at once
// and again after it, exit 0, the export complete. The debug model's export (280 MB of f32) takes a
// good part of a second, and its temporary folder is watched for every millisecond.
TEST(Trainer, ASignalDuringTheFinalExportLetsItFinishAndSaysSo) {
  const fs::path dump = tt::temp_dir("trainer_signal_export");
  const fs::path log = dump.parent_path() / "trainer_signal_export.log";
  const std::vector<std::string> argv = {titan(),
                                         "train",
                                         "--config",
                                         debugmodel_toml().string(),
                                         "--job.dump_folder=" + dump.string(),
                                         "--training.steps=1",
                                         "--lr_scheduler.warmup_steps=1",
                                         "--training.seq_len=64",
                                         "--validation.enable=false",
                                         "--checkpoint.enable=false",
                                         "--checkpoint.last_save_in_hf=true"};
  const pid_t pid = tt::spawn_logged(argv, log);
  ASSERT_NE(pid, 0) << argv[0] << " did not start";
  auto exporting = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dump / "checkpoint", ec))
      if (e.path().filename().string().rfind(".step-1-hf.tmp", 0) == 0) return true;
    return false;
  };
  int status = 0;
  bool signalled = false, exited = false;
  for (auto t0 = std::chrono::steady_clock::now();
       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 300;) {
    if (!signalled && exporting()) signalled = kill(pid, SIGTERM) == 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(signalled ? 50 : 1));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  const std::string out = read_file(log);
  ASSERT_TRUE(signalled) << "the export's temporary folder was never seen:\n" << out;
  ASSERT_TRUE(exited && WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("received SIGTERM: stopping cleanly"), std::string::npos) << out;
  EXPECT_NE(out.find("received SIGTERM as the run ended: its final export completed; stopping"),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(dump / "checkpoint" / "step-1-hf" / "model.safetensors")) << out;
}

// checkpoint.async_mode = "async": a save copies the state aside and returns; a background thread
// writes the files while the next steps train (updating the weights and moments the files are
// written from, were they not copied), and a later step boundary commits them. The last step's save
// is waited for (nothing is left to overlap). What lands on disk is a synchronous save's, byte for
// byte: every file of every step, train_state.json and the manifest included. The run's steps are
// unchanged.
TEST(Trainer, BackgroundSavesWriteTheSynchronousCheckpointsByteForByte) {
  const Overrides common = {{"training.deterministic", "true"},
                            {"training.steps", "7"},
                            {"checkpoint.enable", "true"},
                            {"checkpoint.interval", "2"},
                            {"checkpoint.keep_latest_k", "0"}};
  const fs::path sync = tt::temp_dir("trainer_save_sync"), background = tt::temp_dir("trainer_save_async");
  run_training(tiny_config(sync, common));
  ::testing::internal::CaptureStdout();
  run_training(tiny_config(background, tt::joined(common, {{"checkpoint.async_mode", "async"}})));
  const std::string log = ::testing::internal::GetCapturedStdout();
  for (const int64_t step : {2, 4, 6, 7}) {
    const std::string name = "step-" + std::to_string(step);
    const bool overlapped = step < 7;
    EXPECT_EQ(log.find("checkpoint: step " + std::to_string(step) + " copied aside") != std::string::npos,
              overlapped)
        << log;
    EXPECT_NE(log.find(name + (overlapped ? " in the background, committed" : " in ")), std::string::npos)
        << log;
    const fs::path a = sync / "checkpoint" / name, b = background / "checkpoint" / name;
    auto files_in = [](const fs::path& dir) {
      std::vector<std::string> names;
      for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
      std::sort(names.begin(), names.end());
      return names;
    };
    const std::vector<std::string> files_a = files_in(a);
    ASSERT_EQ(files_a, files_in(b)) << name;
    EXPECT_EQ(files_a.size(), 5u) << name;  // model, optimizer, train_state.json, manifest.json, COMMITTED
    for (const std::string& f : files_a) EXPECT_EQ(tt::file_difference(a / f, b / f), "") << name << "/" << f;
  }
  const auto la = by_step(read_metrics(sync), "loss"), lb = by_step(read_metrics(background), "loss");
  EXPECT_EQ(la.size(), 7u);
  EXPECT_EQ(la, lb);
}

// checkpoint.interval_type: "steps" saves after every interval-th step; "seconds" once interval
// seconds have passed since the run began or the previous save returned, whatever the step. A run with an
// hour's interval in seconds saves its last step only (the ranks agree on the step through one max
// over ranks per step).
TEST(Trainer, AnIntervalInSecondsSavesByTheClock) {
  CheckpointSection steps, seconds;
  steps.interval = seconds.interval = 2;
  seconds.interval_type = "seconds";
  EXPECT_TRUE(periodic_save_due(steps, 4, 0.0));
  EXPECT_FALSE(periodic_save_due(steps, 3, 100.0));
  EXPECT_FALSE(periodic_save_due(seconds, 4, 1.99));
  EXPECT_TRUE(periodic_save_due(seconds, 3, 2.0));
  EXPECT_TRUE(periodic_save_due(seconds, 1, 7.5));

  const fs::path dump = tt::temp_dir("trainer_interval_seconds");
  const TrainSummary s = run_training(tiny_config(dump, {{"training.steps", "3"},
                                                         {"checkpoint.enable", "true"},
                                                         {"checkpoint.interval", "3600"},
                                                         {"checkpoint.interval_type", "seconds"}}));
  EXPECT_EQ(s.steps_run, 3);
  EXPECT_EQ(CheckpointManager(dump / "checkpoint", 3).committed_steps(), (std::vector<int64_t>{3}));
}

// A step that fails on one process (here at a malformed record the data reaches a few steps in)
// still commits the save of the step before it, written in the background while it ran: a resume
// goes on from the last step trained, not from the checkpoint before that one.
TEST(Trainer, AFailingStepStillCommitsTheSaveInTheBackground) {
  const fs::path dump = tt::temp_dir("trainer_fail_after_background_save");
  std::string sentences;
  for (int i = 0; i < 6; ++i)
    sentences += "The quick brown fox jumps over the lazy dog near the river bank. ";
  std::string jsonl;
  // 5 records of ~80 tokens; a step reads 2 x 65.
  for (int i = 0; i < 5; ++i) jsonl += nlohmann::json({{"text", sentences}}).dump() + "\n";
  jsonl += "{\"text\": unquoted}\n";
  const fs::path data = dump.parent_path() / (dump.filename().string() + "_data.jsonl");
  std::ofstream(data) << jsonl;
  const std::string e = tt::error_of([&] {
    run_training(tiny_config(dump, {{"training.steps", "10"},
                                    {"training.dataset_path", data.string()},
                                    {"validation.enable", "false"},
                                    {"checkpoint.enable", "true"},
                                    {"checkpoint.interval", "1"},
                                    {"checkpoint.keep_latest_k", "0"},
                                    {"checkpoint.async_mode", "async"}}));
  });
  EXPECT_NE(e.find("malformed JSON"), std::string::npos) << e;
  const std::vector<nlohmann::json> steps = read_metrics(dump);
  ASSERT_GE(steps.size(), 2u);
  const int64_t last_trained = steps.back().at("step").get<int64_t>();
  const std::vector<int64_t> committed = CheckpointManager(dump / "checkpoint", 0).committed_steps();
  ASSERT_FALSE(committed.empty());
  EXPECT_EQ(committed.back(), last_trained) << "the save of the last step trained was dropped";
}

// A checkpoint whose files cannot be written (the file size limit here, `ulimit -f` with SIGXFSZ
// ignored, so that write() fails with EFBIG as it fails with ENOSPC on a full disk) stops the run,
// naming the file and the reason, and leaves neither a checkpoint nor a temporary folder behind:
// in the foreground, and in the background, where the failure surfaces at a later step boundary.
TEST(Trainer, ACheckpointThatCannotBeWrittenStopsTheRunNamingTheFile) {
  for (const std::string mode : {"disabled", "async"}) {
    const fs::path dump = tt::temp_dir("trainer_save_fails_" + mode);
    const Overrides job = tiny_job(dump, {{"training.steps", "6"},
                                          {"checkpoint.enable", "true"},
                                          {"checkpoint.interval", "2"},
                                          {"checkpoint.async_mode", mode}});
    std::string out;
    // 8000 blocks (512 bytes in sh, 1 KiB in bash): the tiny model's checkpoint files (its 151936 x 64
    // embedding alone is 39 MB) cross it, the run's other files do not.
    const int rc = tt::run_command("trap '' XFSZ; ulimit -f 8000; " + titan() + " train --config " +
                                       debugmodel_toml().string() + cli_args(job),
                                   &out);
    EXPECT_NE(rc, 0) << mode << ":\n" << out;
    EXPECT_NE(out.find("step 2: no checkpoint written: write"), std::string::npos) << mode << ":\n" << out;
    EXPECT_NE(out.find("model-rank0.safetensors\") failed after "), std::string::npos) << mode << ":\n"
                                                                                       << out;
    EXPECT_NE(out.find(" bytes: File too large"), std::string::npos) << mode << ":\n" << out;
    std::vector<std::string> left;
    for (auto& e : fs::directory_iterator(dump / "checkpoint")) left.push_back(e.path().filename().string());
    EXPECT_EQ(left, std::vector<std::string>{".titan-rank0.lock"}) << mode;
  }
}

// A dataset file moved away mid-run (a shard the loader has not reached yet) must not cost the run
// its checkpoint: the data's fingerprint is taken at start-up, not re-read at every save.
TEST(Trainer, ADatasetFileGoneMidRunStillLetsTheCheckpointBeSaved) {
  const fs::path data = tt::temp_dir("trainer_data_gone_" + std::to_string(::getpid()));
  for (const char* shard : {"a.jsonl", "b.jsonl"}) {
    std::ofstream f(data / shard);
    for (int i = 0; i < 200; ++i)
      f << nlohmann::json{{"text",
                           std::string(shard) + " document " + std::to_string(i) + " with a few words"}}
               .dump()
        << "\n";
  }
  stop_with_signal(SIGTERM, "trainer_data_gone",
                   {.extra = {{"training.dataset_path", data.string()}},
                    .mid_run = [&](pid_t, const fs::path&) { fs::remove(data / "b.jsonl"); }});
}

// One step with global_batch_size = 2 x local (two micro-batches) against one step with the local
// batch doubled: the same tokens, so the same loss and gradient up to summation order. In f32
// compute the tolerance is tight: 1e-6 relative on the loss, 1e-4 on the gradient norm.
TEST(Trainer, GradientAccumulationMatchesADoubledBatch) {
  const Overrides common = {{"training.steps", "1"}, {"training.mixed_precision_param", "float32"}};
  auto run = [&](const std::string& name, Overrides extra) {
    const fs::path dump = tt::temp_dir(name);
    extra.insert(extra.begin(), common.begin(), common.end());
    run_training(tiny_config(dump, extra));
    auto r = read_metrics(dump);
    EXPECT_EQ(r.size(), 1u);
    return r.at(0);
  };
  auto accum =
      run("trainer_accum", {{"training.local_batch_size", "2"}, {"training.global_batch_size", "4"}});
  auto big = run("trainer_big_batch", {{"training.local_batch_size", "4"}});
  const double la = accum["loss"].get<double>(), lb = big["loss"].get<double>();
  const double ga = accum["grad_norm"].get<double>(), gb = big["grad_norm"].get<double>();
  EXPECT_NEAR(la, lb, 1e-6 * lb);
  EXPECT_NEAR(ga, gb, 1e-4 * gb);
  EXPECT_EQ(accum["tps"].get<double>() > 0, true);
}

// checkpoint.load_step rolls a run back: it resumes from that step (retraining the later steps
// exactly as the first time: the resume is bitwise), and the later checkpoints and their exports are
// renamed out of the way of the new saves, not deleted. A step with no committed checkpoint is an
// error naming the key and the steps there are.
TEST(Trainer, LoadStepRollsBackAndSetsTheLaterCheckpointsAside) {
  const fs::path dump = tt::temp_dir("trainer_load_step");
  const Overrides common = {{"training.steps", "4"},           {"training.deterministic", "true"},
                            {"checkpoint.enable", "true"},     {"checkpoint.interval", "1"},
                            {"checkpoint.keep_latest_k", "0"}, {"checkpoint.last_save_in_hf", "true"}};
  const JobConfig job = tiny_config(dump, common);
  run_training(job);
  const auto first = read_metrics(dump);
  ASSERT_EQ(first.size(), 4u);
  // torchtitan's n_tokens_seen: each step adds its input tokens.
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(first[i].at("tokens_seen").get<int64_t>(),
              int64_t(i + 1) * job.training.local_batch_size * job.training.seq_len);
  const fs::path ck = dump / "checkpoint";
  auto text_of = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string step3_checksums = text_of(ck / "step-3" / "manifest.json");
  ASSERT_FALSE(step3_checksums.empty());

  std::string e = error_of([&] {
    run_training(tiny_config(dump, tt::joined(common, {{"checkpoint.load_step", "7"}})));
  });
  EXPECT_NE(e.find("checkpoint.load_step = 7"), std::string::npos) << e;
  EXPECT_NE(e.find("committed steps in '" + ck.string() + "': 1, 2, 3, 4"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(ck / "step-3.rolled-back")) << "an error must leave the folder as it was";
  // A restore that fails (another model) sets nothing aside either.
  e = error_of([&] {
    run_training(
        tiny_config(dump, tt::joined(common, {{"checkpoint.load_step", "2"}, {"model.hidden_dim", "96"}})));
  });
  EXPECT_NE(e.find("model.hidden_dim"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(ck / "step-3.rolled-back")) << "a failed restore must leave the folder as it was";

  const TrainSummary again =
      run_training(tiny_config(dump, tt::joined(common, {{"checkpoint.load_step", "2"}})));
  EXPECT_EQ(again.steps_run, 2);
  const auto all = read_metrics(dump);
  ASSERT_EQ(all.size(), 6u);
  for (int i = 0; i < 2; ++i) {  // steps 3 and 4, trained again from step 2's checkpoint
    EXPECT_EQ(all[4 + i].at("step"), first[2 + i].at("step"));
    EXPECT_EQ(all[4 + i].at("loss").get<double>(), first[2 + i].at("loss").get<double>());
    EXPECT_EQ(all[4 + i].at("batch_hash"), first[2 + i].at("batch_hash"));
    EXPECT_EQ(all[4 + i].at("tokens_seen"), first[2 + i].at("tokens_seen"));  // counted on from step 2's
  }
  for (const char* moved : {"step-3.rolled-back", "step-4.rolled-back", "step-4-hf.rolled-back"})
    EXPECT_TRUE(fs::exists(ck / moved)) << moved;
  EXPECT_EQ(text_of(ck / "step-3.rolled-back" / "manifest.json"), step3_checksums);
  EXPECT_EQ(CheckpointManager(ck, 0).committed_steps(), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(fs::exists(ck / "step-4-hf" / "model.safetensors"));
  // A second roll-back to the same step keeps the first one's folders too.
  run_training(tiny_config(dump, tt::joined(common, {{"checkpoint.load_step", "2"}})));
  EXPECT_TRUE(fs::exists(ck / "step-3.rolled-back-2" / "COMMITTED"));
  EXPECT_TRUE(fs::exists(ck / "step-3.rolled-back" / "COMMITTED"));
}

// training.text_split decides how plain-text files become documents (the loader's state in the
// checkpoint records it and how far the step read): one per line reads past more documents than
// one per paragraph, one per file stays inside the first file. A resume under another split is
// refused naming the key.
TEST(Trainer, TextSplitCutsPlainTextIntoLinesParagraphsOrFiles) {
  const fs::path data = tt::temp_dir("trainer_text_split_data");
  // Three text files of real corpus text: paragraphs of two lines, blank lines between them.
  data::DocumentStream corpus({{data::default_dataset_path()}});
  data::Document d;
  for (int f = 0; f < 3; ++f) {
    std::ofstream out(data / ("part-" + std::to_string(f) + ".txt"));
    for (int line = 0; line < 40 && corpus.next(d); ++line) {
      std::string text = d.text;
      std::replace(text.begin(), text.end(), '\n', ' ');
      out << text << (line % 2 == 1 ? "\n\n" : "\n");
    }
  }
  const Overrides one_step = {{"training.steps", "1"},
                              {"training.dataset_path", data.string()},
                              {"checkpoint.enable", "true"},
                              {"checkpoint.interval", "1"}};
  std::map<std::string, nlohmann::json> state;
  std::map<std::string, fs::path> dumps;
  for (const char* split : {"line", "paragraph", "file"}) {
    const fs::path& dump = dumps[split] = tt::temp_dir(std::string("trainer_text_split_") + split);
    run_training(tiny_config(dump, tt::joined(one_step, {{"training.text_split", split}})));
    std::ifstream in(dump / "checkpoint" / "step-1" / "train_state.json");
    state[split] = nlohmann::json::parse(in).at("dataloader");
    EXPECT_EQ(state[split].at("text_split"), split);
  }
  // The documents of the split before the one the step stopped in (or the next one to read).
  const auto documents_before = [&](const char* split) {
    const data::DocPosition saved = state[split].at("doc").get<data::DocPosition>();
    data::DocumentStream stream(data::DatasetConfig{{data}, "text", split});
    int64_t n = 0;
    for (data::Document doc; stream.next(doc);)
      if (std::pair(doc.position.file, doc.position.offset) < std::pair(saved.file, saved.offset)) ++n;
    return n;
  };
  EXPECT_GT(documents_before("line"), documents_before("paragraph"));
  EXPECT_GT(documents_before("paragraph"), documents_before("file"));
  EXPECT_EQ(state["file"].at("doc").at("file").get<int64_t>(), 0);

  const fs::path& dump = dumps["line"];
  std::string e = error_of([&] {
    run_training(
        tiny_config(dump, tt::joined(one_step, {{"training.steps", "2"}, {"training.text_split", "file"}})));
  });
  EXPECT_NE(e.find("training.text_split = file"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.restart_data_stream"), std::string::npos) << e;
  // The bundled corpus is JSON Lines: no file is cut by text_split, and a resume under another
  // split goes on where it was.
  const fs::path json_dump = tt::temp_dir("trainer_text_split_json");
  const Overrides json_run = {{"checkpoint.enable", "true"}, {"checkpoint.interval", "1"}};
  run_training(tiny_config(json_dump,
                           tt::joined(json_run, {{"training.steps", "1"}, {"training.text_split", "file"}})));
  run_training(tiny_config(json_dump,
                           tt::joined(json_run, {{"training.steps", "2"}, {"training.text_split", "line"}})));
  EXPECT_EQ(read_metrics(json_dump).back().at("step").get<int64_t>(), 2);
  // Its documents come from a field: a resume reading another one (whose tokens the saved position
  // inside a document does not count) is refused; a plain-text dataset records none.
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(json_dump / "checkpoint" / "step-2" / "train_state.json"))
                .at("dataloader")
                .at("text_field"),
            "text");
  EXPECT_FALSE(state["line"].contains("text_field"));
  e = error_of([&] {
    run_training(tiny_config(
        json_dump, tt::joined(json_run, {{"training.steps", "3"},
                                         {"training.text_field", "body"},
                                         {"validation.enable", "false"}})));  // (its records have no body)
  });
  EXPECT_NE(
      e.find("read its documents from the field 'text' but this run has training.text_field = \"body\""),
      std::string::npos)
      << e;
  e = error_of([&] { tiny_config(dump, {{"training.text_split", "sentence"}}); });
  EXPECT_NE(e.find("training.text_split must be one of paragraph, line, file"), std::string::npos) << e;
}

// titan generate --checkpoint reads only the weights (a checkpoint whose optimizer file was removed
// to save space still generates), and finds the run's tokenizer through the path it recorded: a
// tokenizer.json changed there since is refused (other ids, other words), and one named with
// --tokenizer is used with a note.
TEST(Trainer, GenerateFromACheckpointNeedsNoOptimizerStateAndRefusesAChangedTokenizer) {
  const fs::path assets = tt::temp_dir("trainer_generate_assets_" + std::to_string(getpid()));
  fs::copy_file(data::default_tokenizer_path() / "tokenizer.json", assets / "tokenizer.json");
  const fs::path dump = tt::temp_dir("trainer_generate_" + std::to_string(getpid()));
  run_training(tiny_config(dump, {{"training.steps", "1"},
                                  {"checkpoint.enable", "true"},
                                  {"checkpoint.interval", "1"},
                                  {"model.hf_assets_path", assets.string()}}));
  const fs::path step = dump / "checkpoint" / "step-1";
  fs::remove(step / "optimizer-rank0.safetensors");
  const std::string generate =
      titan() + " generate --checkpoint " + step.string() + " --prompt 'The' --max-new-tokens 2";
  std::string out;
  EXPECT_EQ(tt::run_command(generate, &out), 0) << out;
  EXPECT_NE(out.find("2 new tokens after 1 prompt tokens"), std::string::npos) << out;

  { std::ofstream(assets / "tokenizer.json", std::ios::app) << "\n"; }  // same tokens, another file
  out.clear();
  EXPECT_NE(tt::run_command(generate, &out), 0) << out;
  EXPECT_NE(out.find((assets / "tokenizer.json").string() + "' is not the tokenizer.json the checkpoint"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("name the run's tokenizer with --tokenizer"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(tt::run_command(generate + " --tokenizer " + assets.string(), &out), 0) << out;
  EXPECT_NE(out.find("note: --tokenizer '" + assets.string() +
                     "' is not the tokenizer the checkpoint was trained with"),
            std::string::npos)
      << out;
}

// training.document_separator picks the token that ends every packed document (the loader's
// state in the checkpoint records the id it packed with); a value that is not one token is an
// error naming the key before any compute, and a resume under another separator is refused unless
// the data stream restarts.
TEST(Trainer, DocumentSeparatorIsTheConfiguredTokenAndAResumeKeepsIt) {
  const data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  const Overrides one_step = {
      {"training.steps", "1"}, {"checkpoint.enable", "true"}, {"checkpoint.interval", "1"}};
  auto packed_with = [&](const fs::path& dump) {
    std::ifstream in(dump / "checkpoint" / "step-1" / "train_state.json");
    return nlohmann::json::parse(in).at("dataloader").at("eos_id").get<int32_t>();
  };
  const std::vector<std::pair<std::string, int32_t>> cases = {
      {"", *tok.token_to_id("<|endoftext|>")},
      {"eos_token", tok.eos_id()},
      {"<|im_end|>", *tok.token_to_id("<|im_end|>")},
      {"\n", tok.encode("\n").at(0)},
      // Text, not tokenizer.json's byte-level key: "é" is one token (963) as text, byte 0xE9 as a key.
      {"\u00e9", tok.encode("\u00e9").at(0)},
  };
  EXPECT_NE(cases[0].second, cases[1].second);  // the bundled tokenizer's eos_token is <|im_end|>
  EXPECT_NE(cases.back().second, tok.token_to_id("\u00e9").value_or(-1));  // the key lookup would be wrong
  std::vector<fs::path> dumps;
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path& dump = dumps.emplace_back(tt::temp_dir("trainer_separator_" + std::to_string(i)));
    run_training(tiny_config(dump, tt::joined(one_step, {{"training.document_separator", cases[i].first}})));
    EXPECT_EQ(packed_with(dump), cases[i].second) << "document_separator = '" << cases[i].first << "'";
  }

  const fs::path bad = tt::temp_dir("trainer_separator_bad");
  std::string e = error_of([&] {
    run_training(tiny_config(bad, tt::joined(one_step, {{"training.document_separator", "hello world"}})));
  });
  EXPECT_NE(e.find("training.document_separator"), std::string::npos) << e;
  EXPECT_NE(e.find("2 tokens"), std::string::npos) << e;
  // A long value is cut short in the message.
  e = error_of([&] {
    run_training(
        tiny_config(bad, tt::joined(one_step, {{"training.document_separator", std::string(5000, 'x')}})));
  });
  EXPECT_NE(e.find("(5000 bytes)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 600u) << e;
  EXPECT_FALSE(fs::exists(bad / "metrics.jsonl"));
  // "eos_token" from a tokenizer with no eos_token: the message names the config that lacks it, or
  // says there is no config at all.
  const fs::path assets = tt::temp_dir("trainer_separator_assets_" + std::to_string(getpid()));
  fs::copy_file(data::default_tokenizer_path() / "tokenizer.json", assets / "tokenizer.json");
  const Overrides eos_from_assets = tt::joined(
      one_step, {{"training.document_separator", "eos_token"}, {"model.hf_assets_path", assets.string()}});
  e = error_of([&] { run_training(tiny_config(bad, eos_from_assets)); });
  EXPECT_NE(e.find("no tokenizer_config.json beside its tokenizer.json"), std::string::npos) << e;
  { std::ofstream(assets / "tokenizer_config.json") << R"({"add_eos_token": false})"; }
  e = error_of([&] { run_training(tiny_config(bad, eos_from_assets)); });
  EXPECT_NE(e.find((assets / "tokenizer_config.json").string() + " names no eos_token"), std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(bad / "metrics.jsonl"));

  // Resume the default run's checkpoint (<|endoftext|>) to step 2 under <|im_end|>.
  const fs::path& dump = dumps[0];
  const Overrides resume = {{"training.steps", "2"},
                            {"checkpoint.enable", "true"},
                            {"checkpoint.interval", "1"},
                            {"training.document_separator", "<|im_end|>"}};
  e = error_of([&] { run_training(tiny_config(dump, resume)); });
  EXPECT_NE(e.find("training.document_separator"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.restart_data_stream"), std::string::npos) << e;
  run_training(tiny_config(dump, tt::joined(resume, {{"checkpoint.restart_data_stream", "true"}})));
  EXPECT_EQ(read_metrics(dump).back().at("step").get<int64_t>(), 2);
}

// Activation checkpointing recomputes the same forward: step 1 is unchanged (bitwise here; the
// tolerance allows 1e-6 relative), whichever layers it covers (3 layers: selective one in 2 covers
// layer 1, one in 3 layer 2; full all three).
// With f32 and with bf16 activation gradients (a recomputed block's input sums its gradients as
// the plain graph's intermediate does: in bf16 under bf16 activation gradients).
TEST(Trainer, ActivationCheckpointingKeepsTheStep) {
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"none", "2"}, {"selective", "2"}, {"selective", "3"}, {"full", "2"}};
  for (const char* grads : {"float32", "bfloat16"}) {
    SCOPED_TRACE(std::string("activation gradients ") + grads);
    std::map<std::string, nlohmann::json> first;
    for (const auto& [mode, every] : settings) {
      const std::string name = mode + "_" + every;
      const fs::path dump = tt::temp_dir("trainer_ac_" + name + "_" + grads);
      run_training(tiny_config(dump, {{"model.n_layers", "3"},
                                      {"training.steps", "1"},
                                      {"training.deterministic", "true"},
                                      {"training.activation_grad_dtype", grads},
                                      {"activation_checkpoint.mode", mode},
                                      {"activation_checkpoint.selective_ac_option", every}}));
      auto r = read_metrics(dump);
      ASSERT_EQ(r.size(), 1u);
      first[name] = r[0];
    }
    const double loss = first["none_2"]["loss"].get<double>(),
                 norm = first["none_2"]["grad_norm"].get<double>();
    for (const char* name : {"selective_2", "selective_3", "full_2"}) {
      EXPECT_NEAR(first[name]["loss"].get<double>(), loss, 1e-6 * loss) << name;
      EXPECT_NEAR(first[name]["grad_norm"].get<double>(), norm, 1e-6 * norm) << name;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- MoE load balancing

TEST(Trainer, MoeTrainsWithAuxLossOrExpertBias) {
  const Overrides moe = {{"model.num_experts", "8"}, {"model.top_k", "2"}, {"model.moe_hidden_dim", "32"},
                         {"training.steps", "4"}};
  // transformers' aux loss: added to the loss and logged per step.
  fs::path aux_dump = tt::temp_dir("trainer_moe_aux");
  Overrides aux = moe;
  aux.push_back({"training.load_balance", "aux_loss"});
  TrainSummary a = run_training(tiny_config(aux_dump, aux));
  EXPECT_EQ(a.steps_run, 4);
  auto records = read_metrics(aux_dump);
  ASSERT_EQ(records.size(), 4u);
  for (auto& r : records) {
    ASSERT_TRUE(r.contains("aux_loss")) << r.dump();
    // Balanced routing gives aux = k; anything in (0, E] is a valid value of the statistic.
    EXPECT_GT(r["aux_loss"].get<double>(), 0.0);
    EXPECT_LE(r["aux_loss"].get<double>(), 8.0);
    EXPECT_TRUE(std::isfinite(r["loss"].get<double>()));
    // The expert load: 1 (even) to E / top_k = 4 (every token on the same 2 experts); idle experts
    // counted over the model's MoE layers (TrainerStep checks the values against the routing).
    ASSERT_TRUE(r.contains("expert_load_max") && r.contains("experts_idle")) << r.dump();
    EXPECT_GE(r["expert_load_max"].get<double>(), 1.0);
    EXPECT_LE(r["expert_load_max"].get<double>(), 4.0);
    EXPECT_GE(r["experts_idle"].get<int64_t>(), 0);
    EXPECT_LE(r["experts_idle"].get<int64_t>(), 8 * 2);  // 8 experts in each of the 2 layers
  }

  // torchtitan's aux-loss-free balancing: a per-layer expert bias that the steps move and
  // the checkpoint carries.
  fs::path bias_dump = tt::temp_dir("trainer_moe_bias");
  Overrides bias = moe;
  bias.push_back({"training.load_balance", "expert_bias"});
  bias.push_back({"checkpoint.enable", "true"});
  bias.push_back({"checkpoint.interval", "4"});
  TrainSummary b = run_training(tiny_config(bias_dump, bias));
  EXPECT_EQ(b.steps_run, 4);
  LoadedCheckpoint c = load_checkpoint_dir(bias_dump / "checkpoint" / "step-4");
  ASSERT_TRUE(c.train_state.contains("expert_bias"));
  int moved = 0;
  for (auto& layer : c.train_state["expert_bias"])
    for (auto& v : layer) moved += v.get<double>() != 0.0;
  EXPECT_GT(moved, 0) << "4 steps of balancing left every expert bias at 0";
  // Step 1 routes identically in both runs (the bias starts at 0), so the aux-loss run's loss is the
  // bias run's cross-entropy plus router_aux_loss_coef (0.001) x aux.
  const auto& first_aux = records.front();
  const auto first_bias = read_metrics(bias_dump).front();
  EXPECT_NEAR(first_aux["loss"].get<double>() - first_bias["loss"].get<double>(),
              0.001 * first_aux["aux_loss"].get<double>(), 1e-5);
}

// The expert biases are part of how a trained MoE routes: starting a new run from a native
// checkpoint (checkpoint.initial_load_path) takes them with the weights, so its first step computes
// what a resume of the same checkpoint computes on the same batch.
TEST(Trainer, StartingFromANativeMoeCheckpointKeepsItsExpertBiases) {
  const Overrides moe = {{"model.num_experts", "8"},
                         {"model.top_k", "2"},
                         {"model.moe_hidden_dim", "32"},
                         {"training.load_balance", "expert_bias"},
                         {"training.load_balance_coeff", "0.05"}};  // biases large enough to move choices
  const fs::path trained = tt::temp_dir("trainer_moe_bias_source_" + std::to_string(getpid()));
  run_training(tiny_config(trained, tt::joined(moe, {{"training.steps", "4"},
                                                     {"checkpoint.enable", "true"},
                                                     {"checkpoint.interval", "4"}})));
  const fs::path step4 = trained / "checkpoint" / "step-4";
  // A resume of step 4 with the data from its start, and a new run from step 4's weights: the same
  // weights, biases and batch.
  run_training(tiny_config(trained, tt::joined(moe, {{"training.steps", "5"},
                                                     {"checkpoint.enable", "true"},
                                                     {"checkpoint.interval", "5"},
                                                     {"checkpoint.restart_data_stream", "true"}})));
  const fs::path fresh = tt::temp_dir("trainer_moe_bias_initial_" + std::to_string(getpid()));
  run_training(tiny_config(
      fresh, tt::joined(moe, {{"training.steps", "1"}, {"checkpoint.initial_load_path", step4.string()}})));
  const nlohmann::json resumed = read_metrics(trained).back(), started = read_metrics(fresh).front();
  ASSERT_EQ(resumed["step"].get<int64_t>(), 5);
  EXPECT_EQ(started["batch_hash"], resumed["batch_hash"]);
  EXPECT_EQ(started["loss"].get<double>(), resumed["loss"].get<double>());
  EXPECT_EQ(started["aux_loss"].get<double>(), resumed["aux_loss"].get<double>())
      << "the new run routed otherwise than the resume: its expert biases were not the checkpoint's";
}

namespace {

// A one-process world that says which timeouts the run set on it, in order (every collective goes
// to the real one-process communicator).
class TimeoutRecordingWorld final : public dist::Communicator {
 public:
  std::vector<std::string> keys;
  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  std::string library() const override { return world_->library(); }
  std::unique_ptr<dist::CommHandle> start_all_reduce(void* buf, int64_t count, DType dtype, dist::ReduceOp op,
                                                     const KernelContext& ctx) override {
    return world_->start_all_reduce(buf, count, dtype, op, ctx);
  }
  std::unique_ptr<dist::CommHandle> start_all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                                     const KernelContext& ctx) override {
    return world_->start_all_gather(send, recv, count, dtype, ctx);
  }
  std::unique_ptr<dist::CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count,
                                                         DType dtype, dist::ReduceOp op,
                                                         const KernelContext& ctx) override {
    return world_->start_reduce_scatter(send, recv, count, dtype, op, ctx);
  }
  std::unique_ptr<dist::CommHandle> start_broadcast(void* buf, int64_t count, DType dtype, int root,
                                                    const KernelContext& ctx) override {
    return world_->start_broadcast(buf, count, dtype, root, ctx);
  }
  std::unique_ptr<dist::CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                                     void* recv, std::span<const int64_t> recv_counts,
                                                     DType dtype, const KernelContext& ctx) override {
    return world_->start_all_to_all(send, send_counts, recv, recv_counts, dtype, ctx);
  }
  void barrier() override { world_->barrier(); }
  [[noreturn]] void abort(int code) override {
    world_->abort(code);
    std::abort();  // (the wrapped abort does not return either; its declaration does not say so)
  }
  std::unique_ptr<dist::Communicator> split(int color, int key, int size) override {
    return world_->split(color, key, size);
  }
  void set_timeout(const dist::CommTimeout& timeout) override {
    keys.push_back(timeout.key + "=" + std::to_string(int(timeout.seconds)));
    world_->set_timeout(timeout);
  }
  dist::CommTimeout timeout() const override { return world_->timeout(); }

 private:
  std::unique_ptr<dist::Communicator> world_ = dist::single_process_communicator();
};

}  // namespace

// The bounds a run set, apart: its phases, and the widenings for file work inside them
// (dist::DiskTimeAllowance: each is set, then its phase's bound put back).
struct Bounds {
  std::vector<std::string> phases, allowances;
};
Bounds bounds_of(const std::vector<std::string>& keys) {
  Bounds b;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].find(" + ") == std::string::npos) {
      b.phases.push_back(keys[i]);
      continue;
    }
    b.allowances.push_back(keys[i]);
    EXPECT_TRUE(i + 1 < keys.size() && keys[i + 1] == b.phases.back())
        << keys[i] << ": the bound before it was not put back";
    ++i;
  }
  return b;
}

// torchtitan's two bounds: comm.init_timeout_seconds from the start until the first step of the run
// has ended (with its evaluation and checkpoint), then comm.train_timeout_seconds; a run with no
// step to take (resumed at training.steps) keeps the start-up bound. Each checkpoint's save and
// load widens the bound in effect by its bytes' time at 50 MB/s (the debugmodel's 9.8M parameters,
// their two AdamW moments: 117.6 MB, 3 s; read twice on resume), so that ranks waiting on a slow
// writer are not stopped.
TEST(Trainer, TheStartUpTimeoutHoldsUntilTheFirstStepHasEnded) {
  const fs::path dump = tt::temp_dir("trainer_timeouts");
  const Overrides timeouts = {{"comm.init_timeout_seconds", "77"},
                              {"comm.train_timeout_seconds", "11"},
                              {"checkpoint.enable", "true"},
                              {"checkpoint.interval", "1"}};
  // A resume reads the checkpoint twice: its checksums, then its values.
  const std::string save = " + 3 s to write the checkpoint: 117.6 MB at 50 MB/s",
                    load =
                        " + 5 s to read the checkpoint (its checksums, then each replica's share): 235.2 MB "
                        "at 50 MB/s";
  TimeoutRecordingWorld first;  // with the Hugging Face export at the end: 39.2 MB of f32 weights, 1 s
  run_training(tiny_config(dump, tt::joined(timeouts, {{"training.steps", "3"},
                                                       {"checkpoint.last_save_in_hf", "true"}})),
               first);
  Bounds b = bounds_of(first.keys);
  EXPECT_EQ(b.phases,
            (std::vector<std::string>{"comm.init_timeout_seconds=77", "comm.train_timeout_seconds=11"}));
  EXPECT_EQ(b.allowances,
            (std::vector<std::string>{
                "comm.init_timeout_seconds" + save + "=80", "comm.train_timeout_seconds" + save + "=14",
                "comm.train_timeout_seconds" + save + "=14",
                "comm.train_timeout_seconds + 1 s to write the export: 39.2 MB at 50 MB/s=12"}));
  // Resumed at its last step: nothing to train, the start-up bound throughout.
  TimeoutRecordingWorld done;
  run_training(tiny_config(dump, tt::joined(timeouts, {{"training.steps", "3"}})), done);
  b = bounds_of(done.keys);
  EXPECT_EQ(b.phases, std::vector<std::string>{"comm.init_timeout_seconds=77"});
  EXPECT_EQ(b.allowances, std::vector<std::string>{"comm.init_timeout_seconds" + load + "=82"});
  // Resumed with steps to go: the switch after this run's first step (torchtitan's "step == 1"
  // would not come again).
  TimeoutRecordingWorld resumed;
  run_training(tiny_config(dump, tt::joined(timeouts, {{"training.steps", "5"}})), resumed);
  b = bounds_of(resumed.keys);
  EXPECT_EQ(b.phases,
            (std::vector<std::string>{"comm.init_timeout_seconds=77", "comm.train_timeout_seconds=11"}));
  EXPECT_EQ(b.allowances, (std::vector<std::string>{"comm.init_timeout_seconds" + load + "=82",
                                                    "comm.init_timeout_seconds" + save + "=80",
                                                    "comm.train_timeout_seconds" + save + "=14"}));
  // Unset, both are comm.timeout_seconds.
  TimeoutRecordingWorld plain;
  run_training(tiny_config(tt::temp_dir("trainer_timeouts_plain"), {{"training.steps", "1"}}), plain);
  EXPECT_EQ(plain.keys, (std::vector<std::string>{"comm.timeout_seconds=300", "comm.timeout_seconds=300"}));
}

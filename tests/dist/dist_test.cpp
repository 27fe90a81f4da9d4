// Data-parallel training over real MPI processes (`mpirun --oversubscribe`), against a one-process
// run that trains on the same global batches: DDP, FSDP and HSDP must give every step's loss and
// grad norm within 1e-5 relative and the final weights and AdamW moments within 1e-5; an N-rank
// job repeats bitwise; a checkpoint written by N ranks resumes on M ranks where the N-rank run
// would have continued (data position included); mesh and config mistakes are errors before
// compute.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "dist_test_util.h"
#include "test_util.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/device_services.h"
#include "titan/data/assets.h"
#include "titan/io/safetensors.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpoint_blocks.h"
#include "titan/train/report.h"
#include "titan/train/versions.h"
#include "train/tiny_job.h"
#include "train/train_test_util.h"

using namespace titan;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

using tt::Overrides;

// The train tests' tiny job (tests/train/tiny_job.h) at f32, seq 32, deterministic, 10 steps,
// checkpoints every 5 steps: global batch 4 x 32 tokens with `local_batch` rows per rank.
Overrides tiny(const fs::path& dump, int64_t local_batch, const Overrides& extra) {
  Overrides o = {{"training.seq_len", "32"},
                 {"training.local_batch_size", std::to_string(local_batch)},
                 {"training.mixed_precision_param", "float32"},
                 {"training.deterministic", "true"},
                 {"training.steps", "10"},
                 {"optimizer.lr", "3e-3"},
                 // AdamW turns every gradient into a step of ~lr, however small: the near-zero
                 // gradients of the 151936 rows of the tied embedding (~1e-8 .. 1e-6, sums that
                 // nearly cancel, where ranks summing in another order differ by ~1e-3 relative)
                 // would become weight differences of ~1e-5 after 10 steps. eps = 1e-5 above those
                 // gradients keeps their steps proportional to them, so the comparison tests the
                 // training, not that noise. (eps = 1e-6 was enough with AVX-512 GEMMs; on an
                 // AVX2-only AMD Zen3, 2 of the 9.7M embedding weights then differed by 1.6e-5,
                 // gradients ~1e-6 whose second moments differed by 0.2%.)
                 {"optimizer.eps", "1e-5"},
                 {"lr_scheduler.warmup_steps", "2"},
                 {"lr_scheduler.decay_ratio", "0"},
                 {"checkpoint.enable", "true"},
                 {"checkpoint.interval", "5"},
                 {"checkpoint.keep_latest_k", "0"},
                 {"comm.timeout_seconds", "60"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return tt::tiny_job(dump, o);
}

std::string train_command(const Overrides& o) {
  return tt::titan_binary().string() + " train --config " + tt::debugmodel_toml().string() + tt::cli_args(o);
}

// `ranks` processes under mpirun (one thread each); ranks = 0 runs titan without any launcher.
int run_job(int ranks, const Overrides& o, std::string* out) {
  std::string env = "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
  if (ranks == 0) return tt::run_command(env + train_command(o), out);
  return tt::run_command(env + "mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np " +
                             std::to_string(ranks) + " " + train_command(o),
                         out);
}

// Two ranks launched as two programs (MPMD): rank 0 runs `rank0`'s job, rank 1 `rank1`'s, each in
// its working folder when one is given (one relative path, two places: as two hosts would see it).
struct RankLaunch {
  Overrides job;
  fs::path workdir = {};          // empty: the launcher's own
  std::string library_path = {};  // LD_LIBRARY_PATH of this rank (empty: none)
};
int run_two_programs(const RankLaunch& rank0, const RankLaunch& rank1, std::string* out) {
  auto app = [](const RankLaunch& r) {
    return "-np 1 " + (r.workdir.empty() ? std::string() : "-wdir " + r.workdir.string() + " ") +
           (r.library_path.empty() ? std::string() : "-x LD_LIBRARY_PATH=" + r.library_path + " ") +
           train_command(r.job);
  };
  return tt::run_command(
      "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS " +
          app(rank0) + " : " + app(rank1),
      out);
}

struct JobRun {
  fs::path dump;
  std::map<int64_t, nlohmann::json> steps;  // metrics.jsonl by step
  std::string out;                          // what the job printed
};

// A metrics file's records by step (metrics.jsonl, or a rank's metrics-rank<r>.jsonl).
std::map<int64_t, nlohmann::json> read_records(const fs::path& file) {
  std::map<int64_t, nlohmann::json> steps;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      steps[j.at("step").get<int64_t>()] = j;
    }
  return steps;
}

std::map<int64_t, nlohmann::json> read_metrics(const fs::path& dump) {
  return read_records(dump / "metrics.jsonl");
}

JobRun train(const std::string& name, int ranks, int64_t local_batch, const Overrides& extra = {}) {
  JobRun r{tt::temp_dir(name), {}, {}};
  std::string& out = r.out;
  int rc = run_job(ranks, tiny(r.dump, local_batch, extra), &out);
  EXPECT_EQ(rc, 0) << out;
  r.steps = read_metrics(r.dump);
  return r;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Loss and grad norm within `rel` (f32: what summing in another order leaves, compounded over the
// steps: on AMD Zen5 within 1e-5 over 10 steps; on AMD Zen3, AVX2 only, the grad norm of step 10 of
// DDP 2 with accumulation 2, HSDP 2 x 2 and FSDP 2 with recompute is 1.66e-5 from one process's,
// hence 3e-5).
void expect_same_steps(const JobRun& a, const JobRun& b, int64_t from, int64_t to, const std::string& what,
                       double rel = 3e-5) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(a.steps.count(s) && b.steps.count(s)) << what << ": step " << s << " not logged";
    for (const char* k : {"loss", "grad_norm"}) {
      const double x = a.steps.at(s)[k].get<double>(), y = b.steps.at(s)[k].get<double>();
      EXPECT_NEAR(x, y, rel * std::fabs(y)) << what << ": " << k << " at step " << s;
    }
    // A MoE's routing: the same tokens on the same experts (counted over every rank's rows).
    for (const char* k : {"expert_load_max", "experts_idle"})
      if (a.steps.at(s).contains(k) || b.steps.at(s).contains(k)) {
        EXPECT_EQ(a.steps.at(s).value(k, -1.0), b.steps.at(s).value(k, -1.0))
            << what << ": " << k << " at step " << s;
      }
    // The same samples in the same order: none lost or repeated, whatever the ranks or resumes.
    EXPECT_EQ(a.steps.at(s).value("batch_hash", "a"), b.steps.at(s).value("batch_hash", "b"))
        << what << ": the step's tokens differ at step " << s;
  }
}

// A checkpoint's whole state by name, whatever number of shard files hold it: every parameter
// ("layers.0.attention.wq.weight") and moment ("exp_avg.layers.0...."), read back through the
// layout as a resume or `titan export` reads it.
std::map<std::string, std::vector<float>> whole_state(const fs::path& step_dir) {
  train::LoadedCheckpoint c = train::load_checkpoint_dir(step_dir);
  qwen3::Qwen3Model model(qwen3::args_from_hf_config(c.train_state.at("model_config"), step_dir.string()),
                          DType::F32);
  train::CheckpointBlocks blocks(c, model);
  std::map<std::string, std::vector<float>> state;
  for (const std::string prefix : {"", "exp_avg.", "exp_avg_sq."})
    for (size_t b = 0; b < model.blocks().size(); ++b) {
      Tensor whole = Tensor::zeros({model.blocks()[b].numel()}, DType::F32);
      blocks.read(b, prefix, 0, whole);
      for (auto& p : model.blocks()[b].params()) {
        const float* first = whole.data<float>() + p.offset;
        state[prefix + p.name].assign(first, first + shape_numel(p.shape));
      }
    }
  return state;
}

// Every element of every parameter within `abs_tol` plus `rel_to_max` x the tensor's largest magnitude;
// `moments` picks the moments instead of the parameters.
void expect_close_states(const std::map<std::string, std::vector<float>>& a,
                         const std::map<std::string, std::vector<float>>& b, bool moments, double abs_tol,
                         double rel_to_max, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (auto& [name, x] : a) {
    if ((name.rfind("exp_avg", 0) == 0) != moments) continue;
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    const std::vector<float>& y = b.at(name);
    ASSERT_EQ(x.size(), y.size()) << what << ": " << name;
    double scale = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, double(std::fabs(y[i])));
      worst = std::max(worst, double(std::fabs(x[i] - y[i])));
    }
    EXPECT_LE(worst, abs_tol + rel_to_max * scale) << what << ": " << name;
  }
}

void expect_same_final_state(const JobRun& a, const JobRun& b, int64_t step, const std::string& what) {
  const fs::path da = a.dump / "checkpoint" / ("step-" + std::to_string(step)),
                 db = b.dump / "checkpoint" / ("step-" + std::to_string(step));
  const auto sa = whole_state(da), sb = whole_state(db);
  // Weights within 1e-5; the moments (tiny numbers, squares of gradients) within 1e-4 of their scale.
  expect_close_states(sa, sb, false, 1e-5, 0, what + " weights");
  expect_close_states(sa, sb, true, 0, 1e-4, what + " moments");
  auto ta = nlohmann::json::parse(read_file(da / "train_state.json"));
  auto tb = nlohmann::json::parse(read_file(db / "train_state.json"));
  // The position in the token stream; "batches" counts loader calls, which depend on the batch
  // shape, not the position.
  for (auto* t : {&ta, &tb}) (*t)["dataloader"].erase("batches");
  EXPECT_EQ(ta["dataloader"], tb["dataloader"]) << what << ": the data position differs";
  EXPECT_EQ(ta["tokens_seen"], tb["tokens_seen"]) << what;
}

// The reference: one process, no launcher, the whole global batch of 4.
const JobRun& one_rank() {
  // ctest runs each test in its own process, maybe two at once: the folder is per process.
  static const JobRun r = train("dist_one_rank_" + std::to_string(getpid()), 0, 4);
  return r;
}

const JobRun& fsdp_two_ranks() {
  static const JobRun r = train("dist_fsdp2_" + std::to_string(getpid()), 2, 2);
  return r;
}

TEST(DataParallel, FsdpOnTwoRanksMatchesOneRank) {
  expect_same_steps(fsdp_two_ranks(), one_rank(), 1, 10, "FSDP 2");
  // The batch hash tells steps apart (it is what shows a sample lost or repeated above).
  EXPECT_NE(one_rank().steps.at(1)["batch_hash"], one_rank().steps.at(2)["batch_hash"]);
  expect_same_final_state(fsdp_two_ranks(), one_rank(), 10, "FSDP 2");
}

// global_max_loss is the largest of the ranks' own losses. At step 1 (the same weights) rank 0's rows
// are the first 2 of the global batch of 4, which one process of batch 2 trains on; rank 1's loss is
// then what makes the mean (every row of packed text has as many targets). One process logs none.
TEST(DataParallel, GlobalMaxLossIsTheLargestRanksOwnLoss) {
  const JobRun first_rows =
      train("dist_first_rows_" + std::to_string(getpid()), 0, 2,
            {{"training.steps", "1"}, {"lr_scheduler.total_steps", "10"}, {"checkpoint.enable", "false"}});
  ASSERT_TRUE(first_rows.steps.count(1)) << "the one-process run of the first rows logged no step";
  const nlohmann::json& step1 = fsdp_two_ranks().steps.at(1);
  const double rank0 = first_rows.steps.at(1)["loss"].get<double>(), mean = step1["loss"].get<double>();
  const double rank1 = 2 * mean - rank0;
  ASSERT_TRUE(step1.contains("global_max_loss")) << step1.dump();
  EXPECT_NEAR(step1["global_max_loss"].get<double>(), std::max(rank0, rank1), 1e-5 * mean)
      << "rank 0's loss " << rank0 << ", rank 1's " << rank1;
  EXPECT_GT(std::fabs(rank0 - rank1), 1e-4 * mean) << "the ranks' losses differ: the max is told apart";
  for (const auto& [step, record] : fsdp_two_ranks().steps)
    EXPECT_GE(record["global_max_loss"].get<double>(), record["loss"].get<double>() * (1 - 1e-6)) << step;
  for (const auto& [step, record] : one_rank().steps)
    EXPECT_FALSE(record.contains("global_max_loss")) << step;
}

// The held-out stream is read as training reads its data (global batches, each rank its rows): one
// global held-out batch of 4 rows gives the same loss on 1 rank (4 rows) and on 2 (2 rows each).
TEST(DataParallel, TheHeldOutLossDoesNotDependOnTheNumberOfRanks) {
  const Overrides v = {{"training.steps", "2"},
                       {"checkpoint.enable", "false"},
                       {"validation.enable", "true"},
                       {"validation.freq", "2"},
                       {"validation.steps", "2"}};
  const std::string pid = std::to_string(getpid());
  const JobRun one =
      train("dist_val_one_" + pid, 0, 4, tt::joined(v, {{"validation.local_batch_size", "4"}}));
  const JobRun two =
      train("dist_val_two_" + pid, 2, 2, tt::joined(v, {{"validation.local_batch_size", "2"}}));
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(one.steps.count(step) && two.steps.count(step) && one.steps.at(step).contains("val_loss") &&
                two.steps.at(step).contains("val_loss"))
        << "step " << step << " not validated";
    const double a = one.steps.at(step)["val_loss"].get<double>(),
                 b = two.steps.at(step)["val_loss"].get<double>();
    EXPECT_NEAR(a, b, 1e-5 * a) << "step " << step;
  }
}

// The held-out set's last batch is scored with its missing rows as padding (pad_last_batch): 8
// held-out conversations in global batches of 6 rows leave the second batch 2 conversations and 4
// padding rows, so rank 1 of 2 holds padding only there; it still runs the forward (its gathers are
// collectives) and adds nothing, and the loss is one process's over the same batches.
TEST(DataParallel, ARankWhoseHeldOutRowsAreAllPaddingValidatesWithTheOthers) {
  const Overrides v = {
      {"training.dataset_path", tt::write_conversations("dist_val_pad_train").string()},
      {"training.chat_field", "messages"},
      {"training.steps", "2"},
      {"checkpoint.enable", "false"},
      {"validation.enable", "true"},
      {"validation.dataset_path", tt::write_conversations("dist_val_pad_held", 100).string()},
      {"validation.steps", "-1"}};
  const std::string pid = std::to_string(getpid());
  const JobRun one =
      train("dist_val_pad_one_" + pid, 0, 2, tt::joined(v, {{"validation.local_batch_size", "6"}}));
  const JobRun two =
      train("dist_val_pad_two_" + pid, 2, 1, tt::joined(v, {{"validation.local_batch_size", "3"}}));
  ASSERT_TRUE(one.steps.count(1) && two.steps.count(1) && one.steps.at(1).contains("val_loss") &&
              two.steps.at(1).contains("val_loss"))
      << "step 1 not validated";
  const double a = one.steps.at(1)["val_loss"].get<double>(), b = two.steps.at(1)["val_loss"].get<double>();
  EXPECT_NEAR(a, b, 1e-5 * a);
}

// Each of the 2 FSDP ranks writes its own shard files, holding its half of every block; the layout
// in train_state.json says which elements each file holds; the manifest vouches for every file.
TEST(DataParallel, EachRankWritesItsShardFiles) {
  const fs::path step = fsdp_two_ranks().dump / "checkpoint/step-10";
  EXPECT_EQ(tt::files_in(step),
            (std::vector<std::string>{"COMMITTED", "manifest.json", "model-rank0.safetensors",
                                      "model-rank1.safetensors", "optimizer-rank0.safetensors",
                                      "optimizer-rank1.safetensors", "train_state.json"}));
  const auto manifest = nlohmann::json::parse(read_file(step / "manifest.json"));
  EXPECT_EQ(manifest["files"].size(), 5u);  // the four shard files and train_state.json
  const auto layout = nlohmann::json::parse(read_file(step / "train_state.json"))["layout"];
  EXPECT_EQ(layout["format"], "block-slices");
  EXPECT_EQ(layout["shards"], 2);
  for (int k = 0; k < 2; ++k) {
    auto model = io::SafetensorsFile::open(step / ("model-rank" + std::to_string(k) + ".safetensors"));
    auto moments = io::SafetensorsFile::open(step / ("optimizer-rank" + std::to_string(k) + ".safetensors"));
    ASSERT_EQ(model.tensors().size(), layout["blocks"].size());
    for (auto& block : layout["blocks"]) {
      const int64_t padded = block["padded"].get<int64_t>();
      EXPECT_EQ(block["ranges"][k], nlohmann::json({k * padded / 2, (k + 1) * padded / 2}));
      const std::string name = block["name"].get<std::string>();
      EXPECT_EQ(model.at(name).shape, (Shape{padded / 2})) << name;
      EXPECT_EQ(moments.at("exp_avg." + name).shape, (Shape{padded / 2})) << name;
      EXPECT_EQ(moments.at("exp_avg_sq." + name).shape, (Shape{padded / 2})) << name;
    }
  }
}

// checkpoint.async_mode = "async" on two FSDP ranks: each rank's shard files are written by its own
// background thread and the checkpoint is committed once both have finished; the checkpoints are the
// synchronous run's byte for byte (shard files, layout, manifest), and so are the steps.
TEST(DataParallel, BackgroundSavesOfFsdpRanksWriteTheSynchronousCheckpoints) {
  const JobRun background =
      train("dist_fsdp2_async_" + std::to_string(getpid()), 2, 2, {{"checkpoint.async_mode", "async"}});
  expect_same_steps(background, fsdp_two_ranks(), 1, 10, "FSDP 2, saving in the background");
  for (const char* step : {"step-5", "step-10"}) {
    const fs::path a = fsdp_two_ranks().dump / "checkpoint" / step, b = background.dump / "checkpoint" / step;
    ASSERT_EQ(tt::files_in(a), tt::files_in(b)) << step;
    EXPECT_EQ(tt::files_in(a).size(), 7u) << step;
    for (const std::string& f : tt::files_in(a))
      EXPECT_EQ(tt::file_difference(a / f, b / f), "") << step << "/" << f;
  }
}

// [profiling] under FSDP: every rank writes its own trace, the collectives' waits are phases of
// their own (the gathers before each block's forward and backward, the gradient reductions after
// each block's backward), and only the logging rank prints the table.
TEST(DataParallel, EachRankProfilesItsStepWithTheCollectivesAsPhases) {
  const fs::path dump = tt::temp_dir("dist_profile");
  std::string out;
  const int rc = run_job(2,
                         tiny(dump, 2,
                              {{"training.steps", "2"},
                               {"checkpoint.enable", "false"},
                               {"validation.enable", "true"},  // at step 2: inside the profiled window
                               {"validation.freq", "2"},
                               {"validation.steps", "1"},
                               {"profiling.enable_profiling", "true"},
                               {"profiling.profile_freq", "2"}}),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  for (int rank : {0, 1}) {
    const fs::path trace = dump / "profile_traces/iteration_2" / ("rank" + std::to_string(rank) + "_trace.json");
    const auto j = nlohmann::json::parse(read_file(trace));
    std::map<std::string, int> phases, forward;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      if (e.at("cat") == "phase") ++phases[e.at("name").get<std::string>()];
      if (e.at("cat") == "forward") ++forward[e.at("name").get<std::string>()];
    }
    // Forward: the embedding, each layer, the head; backward: each layer again (and the head).
    EXPECT_GE(phases["parameter gather"], 5) << trace;
    EXPECT_GE(phases["gradient reduction"], 2) << trace;
    for (const char* once : {"gradient sync", "loss all-reduce", "grad-norm all-reduce", "between steps"})
      EXPECT_EQ(phases[once], 1) << once << " in " << trace;
    // The validation after step 2 (gathers included) stays in "between steps": one training forward.
    EXPECT_EQ(forward["linear_cross_entropy"], 1) << trace;
  }
  size_t tables = 0;
  for (size_t at = out.find("profile of step 2 on cpu"); at != std::string::npos; at = out.find("profile of step 2", at + 1))
    ++tables;
  EXPECT_EQ(tables, 1u) << out;
}

TEST(DataParallel, DdpOnTwoRanksWithAccumulationMatchesOneRank) {
  // Global batch 4 = 1 row x 2 ranks x 2 micro-batches.
  JobRun ddp = train("dist_ddp2", 2, 1,
                     {{"parallelism.data_parallel_replicate_degree", "2"},
                      {"parallelism.data_parallel_shard_degree", "1"},
                      {"training.global_batch_size", "4"}});
  expect_same_steps(ddp, one_rank(), 1, 10, "DDP 2, accumulation 2");
  expect_same_final_state(ddp, one_rank(), 10, "DDP 2, accumulation 2");
}

// Saving in the background (checkpoint.async_mode): the second replica's ranks copy and write nothing
// but take part in every boundary's agreement and in the commit (step 5's save; step 10's, the last,
// is synchronous).
TEST(DataParallel, HsdpTwoByTwoMatchesOneRank) {
  JobRun hsdp = train("dist_hsdp4", 4, 1,
                      {{"parallelism.data_parallel_replicate_degree", "2"},
                       {"parallelism.data_parallel_shard_degree", "2"},
                       {"checkpoint.async_mode", "async"}});
  EXPECT_EQ(train::load_checkpoint_dir(hsdp.dump / "checkpoint/step-5").step, 5);
  expect_same_steps(hsdp, one_rank(), 1, 10, "HSDP 2x2");
  expect_same_final_state(hsdp, one_rank(), 10, "HSDP 2x2");
  // The two replicas hold the same 2 shards: only the first replica wrote them.
  EXPECT_EQ(tt::files_in(hsdp.dump / "checkpoint/step-10"),
            (std::vector<std::string>{"COMMITTED", "manifest.json", "model-rank0.safetensors",
                                      "model-rank1.safetensors", "optimizer-rank0.safetensors",
                                      "optimizer-rank1.safetensors", "train_state.json"}));
}

// training.mixed_precision_reduce = "bfloat16" (sharded_blocks_test checks its arithmetic bit for
// bit): the same first loss (computed before any reduction), a first gradient norm that bf16
// rounding moves by under a bf16 ulp, a run that trains like the f32 one, and half the bytes for the
// reduce-scatters. Unsharded blocks (DDP) ignore it, as torchtitan does, and the run says so.
TEST(DataParallel, FsdpReducesGradientsInBf16WhenAsked) {
  JobRun bf16 = train("dist_fsdp2_reduce_bf16", 2, 2, {{"training.mixed_precision_reduce", "bfloat16"}});
  const JobRun& f32 = fsdp_two_ranks();
  ASSERT_TRUE(bf16.steps.count(1) && f32.steps.count(1));
  EXPECT_EQ(bf16.steps.at(1)["loss"].get<double>(), f32.steps.at(1)["loss"].get<double>());
  const double norm = bf16.steps.at(1)["grad_norm"].get<double>(),
               norm_f32 = f32.steps.at(1)["grad_norm"].get<double>();
  EXPECT_NE(norm, norm_f32) << "the gradients were not rounded to bf16";
  EXPECT_NEAR(norm, norm_f32, norm_f32 / 256);
  for (int64_t s = 1; s <= 10; ++s) {
    ASSERT_TRUE(bf16.steps.count(s) && f32.steps.count(s)) << "step " << s;
    const double a = bf16.steps.at(s)["loss"].get<double>(), b = f32.steps.at(s)["loss"].get<double>();
    EXPECT_NEAR(a, b, 2e-3 * std::fabs(b)) << "loss at step " << s;
    EXPECT_LT(bf16.steps.at(s)["comm_mib"].get<double>(), f32.steps.at(s)["comm_mib"].get<double>()) << s;
  }

  std::string out;
  const fs::path dump = tt::temp_dir("dist_ddp2_reduce_bf16");
  EXPECT_EQ(run_job(2,
                    tiny(dump, 2,
                         {{"training.steps", "1"},
                          {"lr_scheduler.warmup_steps", "0"},
                          {"checkpoint.enable", "false"},
                          {"training.mixed_precision_reduce", "bfloat16"},
                          {"parallelism.data_parallel_replicate_degree", "2"},
                          {"parallelism.data_parallel_shard_degree", "1"}}),
                    &out),
            0)
      << out;
  EXPECT_NE(out.find("config: training.mixed_precision_reduce = bfloat16: no effect, only sharded blocks "
                     "(parallelism.data_parallel_shard_degree > 1) reduce their gradients in it"),
            std::string::npos)
      << out;
}

// metrics.save_for_all_ranks: rank 1 writes its own records beside rank 0's metrics.jsonl (the job's
// loss and grad norm, its own memory, throughput and communication), and each rank's TensorBoard
// events go to a folder of its own. Without it rank 1 writes nothing.
TEST(DataParallel, EveryRankWritesItsOwnMetricsWhenAsked) {
  const Overrides all = {{"metrics.save_for_all_ranks", "true"},
                         {"metrics.enable_tensorboard", "true"},
                         {"training.steps", "3"},
                         {"lr_scheduler.warmup_steps", "0"},
                         {"checkpoint.enable", "false"}};
  JobRun run = train("dist_metrics_all_ranks", 2, 2, all);
  const std::map<int64_t, nlohmann::json> own = read_records(run.dump / "metrics-rank1.jsonl");
  ASSERT_EQ(own.size(), 3u) << "rank 1's records";
  for (int64_t s = 1; s <= 3; ++s) {
    ASSERT_TRUE(run.steps.count(s) && own.count(s)) << "step " << s;
    const nlohmann::json &r0 = run.steps.at(s), &r1 = own.at(s);
    EXPECT_EQ(r1["rank"], 1);
    EXPECT_FALSE(r0.contains("rank")) << "metrics.jsonl keeps its records as they were";
    EXPECT_EQ(r1["loss"], r0["loss"]) << "the job's loss, the same on every rank";
    EXPECT_EQ(r1["grad_norm"], r0["grad_norm"]);
    EXPECT_EQ(r1["batch_hash"], r0["batch_hash"]);
    for (const char* own_figure : {"memory_gib", "tps", "step_seconds", "comm_mib"})
      EXPECT_GT(r1[own_figure].get<double>(), 0) << own_figure << " at step " << s;
  }
  for (const char* rank_dir : {"tb/rank_0", "tb/rank_1"}) {
    bool events = false;
    if (fs::is_directory(run.dump / rank_dir))
      for (auto& e : fs::directory_iterator(run.dump / rank_dir))
        events |=
            e.path().filename().string().rfind("events.out.tfevents.", 0) == 0 && fs::file_size(e.path()) > 0;
    EXPECT_TRUE(events) << "no TensorBoard events in " << rank_dir;
  }

  JobRun one_file =
      train("dist_metrics_rank0_only", 2, 2,
            {{"training.steps", "1"}, {"lr_scheduler.warmup_steps", "0"}, {"checkpoint.enable", "false"}});
  EXPECT_EQ(one_file.steps.size(), 1u);
  EXPECT_FALSE(fs::exists(one_file.dump / "metrics-rank1.jsonl"));
}

TEST(DataParallel, TwoRunsOfTheSameJobAreBitwiseIdentical) {
  const JobRun& a = fsdp_two_ranks();
  JobRun b = train("dist_fsdp2_again", 2, 2);
  ASSERT_EQ(a.steps.size(), 10u);
  for (auto& [s, rec] : a.steps) {
    EXPECT_EQ(rec["loss"].get<double>(), b.steps.at(s)["loss"].get<double>()) << "step " << s;
    EXPECT_EQ(rec["grad_norm"].get<double>(), b.steps.at(s)["grad_norm"].get<double>()) << "step " << s;
  }
  for (const char* f : {"model-rank0.safetensors", "model-rank1.safetensors", "optimizer-rank0.safetensors",
                        "optimizer-rank1.safetensors"})
    EXPECT_EQ(read_file(a.dump / "checkpoint/step-10" / f), read_file(b.dump / "checkpoint/step-10" / f))
        << f;
}

// checkpoint.load_step on 2 FSDP ranks: the run rolls back from step 10 to step 5's checkpoint, the
// logging rank sets step-10 aside (once, with every rank past the listing), and steps 6..10 and the
// final state are those of the uninterrupted run again.
TEST(DataParallel, TwoRanksRollBackToAnEarlierCheckpoint) {
  JobRun run{tt::temp_dir("dist_load_step_" + std::to_string(getpid())), {}};
  fs::copy(fsdp_two_ranks().dump, run.dump, fs::copy_options::recursive);
  std::string out;
  ASSERT_EQ(run_job(2, tiny(run.dump, 2, {{"checkpoint.load_step", "5"}}), &out), 0) << out;
  EXPECT_NE(out.find("step-10 is set aside as step-10.rolled-back"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from " + (run.dump / "checkpoint" / "step-5").string()), std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(run.dump / "checkpoint/step-10.rolled-back/COMMITTED"));
  run.steps = read_metrics(run.dump);  // the later record of each retrained step
  expect_same_steps(run, one_rank(), 1, 10, "FSDP 2 rolled back to step 5");
  expect_same_final_state(run, one_rank(), 10, "FSDP 2 rolled back to step 5");
}

// 2 FSDP ranks, 5 steps: a checkpoint of two shard files at step 5 and, at the end of the run, the
// Hugging Face export of the weights as the ranks hold them in memory (gathered).
const JobRun& two_ranks_to_step5() {
  static const JobRun r = train("dist_reshard_first_" + std::to_string(getpid()), 2, 2,
                                {{"training.steps", "5"}, {"checkpoint.last_save_in_hf", "true"}});
  return r;
}

// A checkpoint written by 2 ranks at step 5 resumes on 1 and on 4 ranks, and on the same 2 ranks as
// DDP replicas; each run says it reshards, and steps 6..10 and the final state are those of the
// uninterrupted run (which equals the one-rank run, checked above).
// A global batch the resuming mesh cannot take is said with what can keep it: one process's 3
// sequences on 2 ranks (no multiple of 2: another mesh), and its 4 sequences on 2 ranks of local
// batch 4 (the local batch lowered to 2).
TEST(DataParallel, AGlobalBatchTheResumingRanksCannotKeepIsSaidWithTheWayThatCan) {
  struct Case {
    int64_t saved_batch, resumed_local;
    std::string said;
  };
  const Case cases[] = {
      {3, 1,
       "warning: the global batch is 2 sequences, the checkpoint's was 3 (local batch x data-parallel ranks "
       "x "
       "accumulation): each step now averages over another number of sequences (it cannot be kept on this "
       "mesh: training.global_batch_size must be a multiple of local_batch_size x data-parallel ranks = 1 x "
       "2 "
       "= 2, and 3 is no multiple of 2 ranks; a mesh whose data-parallel ranks divide 3 can keep it)"},
      {4, 4,
       "warning: the global batch is 8 sequences, the checkpoint's was 4 (local batch x data-parallel ranks "
       "x "
       "accumulation): each step now averages over another number of sequences (training.global_batch_size "
       "must be a multiple of local_batch_size x data-parallel ranks = 4 x 2 = 8: set "
       "training.local_batch_size = 2 and training.global_batch_size = 4 to keep it)"}};
  for (const Case& c : cases) {
    const fs::path dump = tt::temp_dir("dist_global_batch_" + std::to_string(c.saved_batch));
    std::string out;
    ASSERT_EQ(
        run_job(0, tiny(dump, c.saved_batch, {{"training.steps", "2"}, {"checkpoint.interval", "2"}}), &out),
        0)
        << out;
    out.clear();
    ASSERT_EQ(run_job(2, tiny(dump, c.resumed_local, {{"training.steps", "3"}, {"checkpoint.interval", "2"}}),
                      &out),
              0)
        << out;
    EXPECT_NE(out.find(c.said), std::string::npos) << out;
    EXPECT_EQ(read_metrics(dump).rbegin()->first, 3) << out;
  }
}

TEST(DataParallel, ACheckpointOfTwoRanksResumesOnOneAndOnFour) {
  const JobRun& first = two_ranks_to_step5();
  ASSERT_TRUE(fs::exists(first.dump / "checkpoint/step-5/COMMITTED"));
  ASSERT_TRUE(fs::exists(first.dump / "checkpoint/step-5/model-rank1.safetensors"));
  // One process, four FSDP ranks, and the same two ranks as DDP replicas (a change of mesh alone).
  struct Resume {
    int ranks;
    int64_t local_batch;
    Overrides mesh;
    std::string what, resharding;
  };
  const std::vector<Resume> resumes = {
      {0, 4, {}, "2 ranks resumed on 1", "this run has 1 rank (1 shard)"},
      {4, 1, {}, "2 ranks resumed on 4", "this run has 4 ranks (4 shards)"},
      {2,
       2,
       {{"parallelism.data_parallel_replicate_degree", "2"}, {"parallelism.data_parallel_shard_degree", "1"}},
       "FSDP 2 resumed as DDP 2",
       "this run has 2 ranks (1 shard)"}};
  for (const Resume& r : resumes) {
    // A copy of the dump folder: the job resumes from its newest checkpoint on the new mesh.
    JobRun run{tt::temp_dir("dist_reshard_" + std::to_string(r.ranks) + "_" + std::to_string(r.mesh.size())),
               {}};
    fs::copy(first.dump, run.dump, fs::copy_options::recursive);
    std::string out;
    ASSERT_EQ(run_job(r.ranks, tiny(run.dump, r.local_batch, r.mesh), &out), 0) << out;
    EXPECT_NE(out.find("resharding: the checkpoint was written by 2 ranks (2 shard files), " + r.resharding),
              std::string::npos)
        << r.what << "\n"
        << out;
    run.steps = read_metrics(run.dump);
    expect_same_steps(run, one_rank(), 1, 10, r.what);
    expect_same_final_state(run, one_rank(), 10, r.what);
    // run_info.json keeps where each stretch ran, and `titan report` names both.
    const std::string now = r.ranks == 0   ? "one process"
                            : r.ranks == 4 ? "FSDP, 4 ranks (dp_replicate 1 x dp_shard 4)"
                                           : "DDP, 2 ranks (dp_replicate 2 x dp_shard 1)";
    EXPECT_EQ(titan::train::read_run(run.dump).ranks,
              "steps 1-5: FSDP, 2 ranks (dp_replicate 1 x dp_shard 2); steps 6-10: " + now)
        << r.what;
  }
  // The 2-rank run that wrote the checkpoint ran in one stretch.
  EXPECT_EQ(titan::train::read_run(first.dump).ranks, "FSDP, 2 ranks (dp_replicate 1 x dp_shard 2)");
}

// A seed checkpoint written by 2 FSDP ranks (two shard files at step 0) is the weights a one-process
// run starts from: the same 10 steps as the one-rank run from the same seeded initialisation. And 2
// ranks that fork the 2-rank step-5 checkpoint into a new folder (initial_load_model_only = false)
// train steps 6..10 as the uninterrupted run does.
TEST(DataParallel, SeedsAndForksCrossRankCounts) {
  JobRun seeded{tt::temp_dir("dist_seed_" + std::to_string(getpid())), {}};
  std::string out;
  ASSERT_EQ(run_job(2, tiny(seeded.dump, 2, {{"checkpoint.create_seed_checkpoint", "true"}}), &out), 0)
      << out;
  ASSERT_TRUE(fs::exists(seeded.dump / "checkpoint/step-0/model-rank1.safetensors")) << out;
  ASSERT_EQ(run_job(0, tiny(seeded.dump, 4, {{"training.seed", "5"}}), &out), 0) << out;
  EXPECT_NE(out.find("started from the seed checkpoint " + (seeded.dump / "checkpoint/step-0").string()),
            std::string::npos)
      << out;
  seeded.steps = read_metrics(seeded.dump);
  expect_same_steps(seeded, one_rank(), 1, 10, "a 2-rank seed trained by 1 process");

  const JobRun& first = two_ranks_to_step5();
  JobRun forked{tt::temp_dir("dist_fork_" + std::to_string(getpid())), {}};
  ASSERT_EQ(run_job(2,
                    tiny(forked.dump, 2,
                         {{"checkpoint.initial_load_path", (first.dump / "checkpoint/step-5").string()},
                          {"checkpoint.initial_load_model_only", "false"}}),
                    &out),
            0)
      << out;
  forked.steps = read_metrics(forked.dump);
  EXPECT_EQ(forked.steps.begin()->first, 6);
  expect_same_steps(forked, one_rank(), 6, 10, "2 ranks forking a 2-rank checkpoint");
  expect_same_final_state(forked, one_rank(), 10, "2 ranks forking a 2-rank checkpoint");
}

// `titan eval` on 2 FSDP ranks (each holding its slices of an inference model: no gradients, no
// moments) of the 2-rank step-5 checkpoint, in f32 and in bf16 (the ranks gather bf16 copies), gives
// the loss one process gives on the same global validation batches (to the order of the sums).
TEST(DataParallel, EvalOnTwoShardedRanksIsOneProcesssEvalOfTheGlobalBatch) {
  const JobRun& first = two_ranks_to_step5();
  const std::string checkpoint = (first.dump / "checkpoint/step-5").string();
  for (const char* precision : {"float32", "bfloat16"}) {
    SCOPED_TRACE(precision);
    std::string said;  // the last eval's output
    auto eval = [&](int ranks, int64_t local_batch) {
      const fs::path json = tt::temp_dir("dist_eval_" + std::to_string(getpid())) /
                            ("eval-" + std::to_string(ranks) + "-" + precision + ".json");
      Overrides o = tiny(tt::temp_dir("dist_eval_dump_" + std::to_string(getpid())), local_batch,
                         {{"training.mixed_precision_param", precision},
                          {"validation.local_batch_size", std::to_string(local_batch)},
                          {"validation.seq_len", "32"},
                          {"validation.steps", "2"}});
      const std::string command = tt::titan_binary().string() + " eval --config " +
                                  tt::debugmodel_toml().string() + tt::cli_args(o) + " --checkpoint " +
                                  checkpoint + " --json " + json.string();
      std::string out;
      const std::string env = "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
      EXPECT_EQ(tt::run_command(
                    env + (ranks == 0 ? command
                                      : "mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np " +
                                            std::to_string(ranks) + " " + command),
                    &out),
                0)
          << out;
      said = out;
      return nlohmann::json::parse(std::ifstream(json));
    };
    // One process scoring 2 rows a batch scores other tokens than the run's 2 ranks x 2 rows in as many
    // batches: said, with the setting that scores the run's.
    eval(0, 2);
    EXPECT_NE(
        said.find("note: the checkpoint's run validated 4 sequences per held-out batch, this eval 2 (2 per "
                  "rank on 1 data-parallel rank), so its validation.steps = 2 batches hold other tokens "
                  "than the val_loss that run logged: validation.local_batch_size = 4 scores those"),
        std::string::npos)
        << said;
    const nlohmann::json one = eval(0, 4);
    EXPECT_EQ(said.find("note: the checkpoint's run validated"), std::string::npos) << said;
    const nlohmann::json two = eval(2, 2);
    EXPECT_EQ(said.find("note: the checkpoint's run validated"), std::string::npos) << said;
    EXPECT_EQ(one.at("tokens"), 2 * 4 * 32) << "2 batches of 4 rows of 32 targets";
    EXPECT_EQ(two.at("tokens"), one.at("tokens"));
    // The ranks' sums of their rows' losses add up in another order than one process's.
    const double a = one.at("loss").get<double>(), b = two.at("loss").get<double>();
    EXPECT_NEAR(b, a, 1e-6 * a);
    std::printf("%s: one process %.9f, two ranks %.9f (relative difference %.2e)\n", precision, a, b,
                std::abs(b - a) / a);
  }
}

// `titan export` of the 2-rank checkpoint (two shard files) writes the same files, bit for bit, as
// the export the 2 ranks wrote from their gathered weights at the end of the run.
TEST(DataParallel, ExportOfAShardedCheckpointEqualsTheExportOfTheGatheredWeights) {
  const JobRun& first = two_ranks_to_step5();
  const fs::path in_run = first.dump / "checkpoint/step-5-hf";
  ASSERT_TRUE(fs::exists(in_run / "config.json"));
  const fs::path exported = tt::temp_dir("dist_export") / "hf";
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " export --checkpoint " +
                                (first.dump / "checkpoint/step-5").string() + " --out " + exported.string(),
                            &out),
            0)
      << out;
  EXPECT_EQ(tt::files_in(exported), tt::files_in(in_run));
  for (const std::string& f : tt::files_in(in_run))
    EXPECT_EQ(tt::file_difference(exported / f, in_run / f), "") << f;
}

// Hugging Face weights as the start of a sharded run: each rank writes the part of every tensor
// that falls in its slices (ParamBlock::write_elements); the run is the one-process run from the
// same folder, and the weights really loaded (a lower first loss than the random start's, on the
// same first batch).
TEST(DataParallel, FsdpStartsFromHuggingFaceWeightsLikeOneRank) {
  const JobRun& first = two_ranks_to_step5();
  const Overrides from_hf = {{"checkpoint.initial_load_path", (first.dump / "checkpoint/step-5-hf").string()},
                             {"checkpoint.initial_load_in_hf", "true"},
                             {"training.steps", "3"},
                             {"checkpoint.interval", "3"}};
  JobRun one = train("dist_hf_one_" + std::to_string(getpid()), 0, 4, from_hf);
  JobRun two = train("dist_hf_fsdp2", 2, 2, from_hf);
  expect_same_steps(two, one, 1, 3, "FSDP 2 from HF weights");
  expect_same_final_state(two, one, 3, "FSDP 2 from HF weights");
  ASSERT_TRUE(one.steps.count(1) && first.steps.count(1));
  EXPECT_LT(one.steps.at(1)["loss"].get<double>(), first.steps.at(1)["loss"].get<double>() - 0.3);
}

// A shard file missing from a 2-rank checkpoint fails the load, and the resume, naming the file.
TEST(DataParallel, AMissingShardFileFailsTheLoadNamingIt) {
  const fs::path dump = tt::temp_dir("dist_missing_shard");
  fs::copy(two_ranks_to_step5().dump, dump, fs::copy_options::recursive);
  const fs::path step = dump / "checkpoint/step-5";
  fs::remove(step / "optimizer-rank1.safetensors");
  std::string e = tt::error_of([&] { train::load_checkpoint_dir(step); });
  EXPECT_NE(e.find("lacks 'optimizer-rank1.safetensors'"), std::string::npos) << e;
  std::string out;
  EXPECT_NE(run_job(0, tiny(dump, 4, {}), &out), 0) << out;
  EXPECT_NE(out.find("optimizer-rank1.safetensors"), std::string::npos) << out;
  // Not listed either (a manifest that forgot it): still named.
  auto manifest = nlohmann::json::parse(read_file(step / "manifest.json"));
  manifest["files"].erase("optimizer-rank1.safetensors");
  std::ofstream(step / "manifest.json") << manifest.dump(2);
  e = tt::error_of([&] { train::load_checkpoint_dir(step); });
  EXPECT_NE(e.find("lacks 'optimizer-rank1.safetensors' (2 shards were written"), std::string::npos) << e;
}

// Overwrites the last 64 bytes of `file` (where a shard file stores its tensors' bytes): the size and
// the header stay, the checksum fails.
void damage_the_tail(const fs::path& file) {
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  stream.seekp(std::streamoff(fs::file_size(file) - 64));
  stream << std::string(64, '\xff');
}

// A shard file damaged where it stores its tensors' bytes: the ranks of a resume checksum a share of
// the files each (balanced by bytes), so one rank alone finds it, and the resume stops on both
// before any step with that rank's reason, said once, every rank exiting 1 on its own (no
// MPI_Abort: the other rank did not run into a collective this one never joined), the checkpoint
// untouched.
TEST(DataParallel, AShardFileOneRankCannotReadStopsEveryRankWithItsReason) {
  const fs::path dump = tt::temp_dir("dist_damaged_shard");
  fs::copy(two_ranks_to_step5().dump, dump, fs::copy_options::recursive);
  const fs::path file = dump / "checkpoint/step-5/model-rank1.safetensors";
  damage_the_tail(file);
  const std::string damaged = read_file(file);
  std::string out;
  EXPECT_NE(run_job(2, tiny(dump, 2, {}), &out), 0) << out;
  const std::regex said(
      "titan train: error: rank [01]: checkpoint: '[^']*model-rank1\\.safetensors' fails its "
      "checksum \\(corrupted\\)\n");
  const auto found =
      std::distance(std::sregex_iterator(out.begin(), out.end(), said), std::sregex_iterator());
  EXPECT_EQ(found, 1) << "said once, by rank 0, naming the rank that found it: " << out;
  EXPECT_EQ(out.find("failed too"), std::string::npos) << "one rank checksums each file: " << out;
  EXPECT_EQ(out.find("resumed from"), std::string::npos) << "no line claims the restore worked: " << out;
  EXPECT_EQ(out.find("MPI_ABORT"), std::string::npos) << out;
  EXPECT_EQ(read_file(file), damaged);
  EXPECT_FALSE(fs::exists(dump / "checkpoint/step-6"));

  // Every shard file damaged: each rank finds those of its share (two of the four, balanced by
  // bytes), and the one error names all four, each rank its own, the way forward once, at the end.
  std::vector<fs::path> files;
  for (const char* name : {"model-rank0", "model-rank1", "optimizer-rank0", "optimizer-rank1"})
    files.push_back(dump / "checkpoint/step-5" / (std::string(name) + ".safetensors"));
  for (const fs::path& f : files)
    if (f != file) damage_the_tail(f);
  out.clear();
  EXPECT_NE(run_job(2, tiny(dump, 2, {}), &out), 0) << out;
  const size_t line = out.find("titan train: error: rank 0: checkpoint: '");
  ASSERT_NE(line, std::string::npos) << out;
  const std::string error = out.substr(line, out.find('\n', line) - line);
  for (const fs::path& f : files)
    EXPECT_NE(error.find(f.string() + "' fails its checksum (corrupted)"), std::string::npos) << error;
  EXPECT_NE(error.find("; rank 1: checkpoint: '"), std::string::npos) << error;
  EXPECT_EQ(error.find("cannot be repaired"), std::string::npos)
      << "no earlier step to go back to: " << error;
  EXPECT_EQ(out.find("failed too"), std::string::npos) << "each rank said its own files: " << out;

  // With an earlier committed step, the way forward follows the ranks' reasons, once.
  const fs::path two_saves = tt::temp_dir("dist_damaged_newest");
  ASSERT_EQ(run_job(2, tiny(two_saves, 2, {{"training.steps", "4"}, {"checkpoint.interval", "2"}}), &out), 0)
      << out;
  for (const char* name : {"model-rank0", "model-rank1", "optimizer-rank0", "optimizer-rank1"})
    damage_the_tail(two_saves / "checkpoint/step-4" / (std::string(name) + ".safetensors"));
  out.clear();
  EXPECT_NE(run_job(2, tiny(two_saves, 2, {}), &out), 0) << out;
  const size_t at = out.find("titan train: error: rank 0: checkpoint: '");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string newest = out.substr(at, out.find('\n', at) - at);
  const std::string advice =
      "; if step 4 cannot be repaired, the committed steps before it are 2: checkpoint.load_step = 2 resumes "
      "from the newest of them (step 4 is then set aside, not deleted)";
  ASSERT_GT(newest.size(), advice.size()) << newest;
  EXPECT_EQ(newest.substr(newest.size() - advice.size()), advice) << "last: " << newest;
  EXPECT_EQ(newest.find("cannot be repaired"), newest.rfind("cannot be repaired")) << "once: " << newest;
  EXPECT_NE(newest.find("; rank 1: checkpoint: '"), std::string::npos) << newest;
}

// A checkpoint every rank refuses (its shard of weights that one step with an absurd learning rate
// made infinite: a save never writes a checkpoint that cannot be trained on) stops the job with the
// lowest failing rank's reason said once, the other rank named, every rank exiting 1 on its own (no
// MPI_Abort), and leaves neither a checkpoint nor a temporary folder behind.
TEST(DataParallel, ACheckpointEveryRankRefusesStopsTheJobSayingWhyOnce) {
  const fs::path dump = tt::temp_dir("dist_save_refused");
  std::string out;
  EXPECT_NE(run_job(2,
                    tiny(dump, 2,
                         {{"optimizer.lr", "1e39"},
                          {"lr_scheduler.warmup_steps", "1"},
                          {"checkpoint.enable_first_step_checkpoint", "true"}}),
                    &out),
            0)
      << out;
  const std::regex said(
      "titan train: error: rank 0: step 1: '[a-z_.0-9]+' holds non-finite values; no checkpoint written "
      "\\(lower optimizer.lr\\?\\) \\(rank 1 failed too\\)\n");
  const auto found =
      std::distance(std::sregex_iterator(out.begin(), out.end(), said), std::sregex_iterator());
  EXPECT_EQ(found, 1) << "said once, by rank 0, naming the other rank: " << out;
  EXPECT_EQ(out.find("MPI_ABORT"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(dump / "checkpoint")) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.rfind(".titan-rank", 0) == 0 && name.size() > 5 &&
                name.substr(name.size() - 5) == ".lock")
        << "left behind: " << name;
  }
}

TEST(DataParallel, AMeshThatDoesNotFitTheWorldIsAnErrorBeforeCompute) {
  const fs::path dump = tt::temp_dir("dist_bad_mesh");
  std::string out;
  int rc = run_job(2, tiny(dump, 2, {{"parallelism.data_parallel_replicate_degree", "3"}}), &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("parallelism.data_parallel_replicate_degree"), std::string::npos) << out;
  EXPECT_NE(out.find("world size 2"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

TEST(DataParallel, RanksStartedWithDifferentConfigsNameTheKeyAndTheRank) {
  const fs::path dump = tt::temp_dir("dist_config_mismatch");
  // Rank 1 gets another seed.
  std::string out;
  int rc = run_two_programs({tiny(dump, 2, {})}, {tiny(dump, 2, {{"training.seed", "7"}})}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("training.seed = 7"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// A config error (found before the ranks connect) names the rank as the launcher numbered it; one
// every rank finds is said once, by rank 0, naming the others.
TEST(DataParallel, AConfigErrorBeforeTheRanksConnectNamesTheRank) {
  const fs::path dump = tt::temp_dir("dist_config_error");
  const std::string error =
      "command line: unknown config key 'training.stesp'; did you mean 'training.steps'?";
  std::string out;
  int rc = run_two_programs({tiny(dump, 2, {})}, {tiny(dump, 2, {{"training.stesp", "3"}})}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("titan train: error: rank 1: " + error), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
  out.clear();
  rc = run_two_programs({tiny(dump, 2, {{"training.stesp", "3"}})},
                        {tiny(dump, 2, {{"training.stesp", "3"}})}, &out);
  EXPECT_NE(rc, 0) << out;
  const size_t said = out.find("titan train: error: rank 0: " + error + " (rank 1 failed too)");
  EXPECT_NE(said, std::string::npos) << out;
  EXPECT_EQ(out.find("error: rank", said + std::string("titan train: error: rank").size()), std::string::npos)
      << "said more than once:\n"
      << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// Errors found once the ranks have connected, while the job and its starting weights are resolved
// (an unknown model flavor, a checkpoint.initial_load_path that is not there, a tokenizer with more
// ids than the model's vocabulary, a checkpoint.load_step with no checkpoint), by titan train and by
// titan eval: said once by rank 0 for both, and every rank exits on its own, with no MPI_Abort (each
// rank printed its own, then aborted).
TEST(DataParallel, AnErrorResolvingTheJobIsSaidOnceAndNoRankAborts) {
  const fs::path dump = tt::temp_dir("dist_resolve_error");
  for (const std::string command : {"train", "eval"})
    for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
             {"model.flavor", "debugmodl"},
             {"checkpoint.initial_load_path", (dump / "absent").string()},
             {"model.vocab_size", "4096"},      // fewer ids than the tokenizer's
             {"checkpoint.load_step", "7"}}) {  // (not a committed checkpoint; eval does not resume)
      if (command == "eval" && key == "checkpoint.load_step") continue;
      SCOPED_TRACE(command + " " + key);
      std::string out;
      const int rc = tt::run_command(
          "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
          "--oversubscribe "
          "--bind-to none -x OMP_NUM_THREADS -np 2 " +
              tt::titan_binary().string() + " " + command + " --config " + tt::debugmodel_toml().string() +
              tt::cli_args(tiny(dump, 2, {{key, value}})),
          &out);
      EXPECT_NE(rc, 0) << out;
      const size_t said = out.find("titan " + command + ": error: rank 0: ");
      ASSERT_NE(said, std::string::npos) << out;
      const std::string line = out.substr(said, out.find('\n', said) - said);
      EXPECT_NE(line.find(value), std::string::npos) << line;
      EXPECT_NE(line.find("(rank 1 failed too)"), std::string::npos) << line;
      EXPECT_EQ(out.find("error: rank", said + line.size()), std::string::npos) << "said more than once:\n"
                                                                                << out;
      EXPECT_EQ(out.find("MPI_ABORT"), std::string::npos) << out;
      EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
    }
}

// A rank that never starts titan (here `sleep`, as a host that stops answering before MPI starts):
// the others wait in MPI_Init, where no collective's timeout reaches; after the start-up timeout
// (torchtitan's comm.init_timeout_seconds, here 3 s where comm.timeout_seconds says 600) they stop
// naming why, and the launcher ends the job (`timeout 300` bounds the test if not).
TEST(DataParallelFaults, ARankThatNeverStartsMpiEndsTheJobAfterTheTimeout) {
  const fs::path dump = tt::temp_dir("dist_init_stall_" + std::to_string(getpid()));
  std::string out;
  const int rc = tt::run_command(
      "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "
      "mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np 1 " +
          train_command(
              tiny(dump, 2, {{"comm.timeout_seconds", "600"}, {"comm.init_timeout_seconds", "3"}})) +
          " : -np 1 sleep 600",
      &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "the job outlived timeout 300: " << out;
  EXPECT_NE(out.find("titan: error: comm: rank 0: MPI_Init over 2 ranks did not complete within 3 s "
                     "(comm.init_timeout_seconds)"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

TEST(DataParallel, RanksReadingDifferentDataStopNamingTheFileAndTheRank) {
  // One config (dataset_path relative), two working folders: rank 1's data.jsonl is another copy,
  // as a stale file at the same path on another host would be.
  const fs::path dump = tt::temp_dir("dist_data_mismatch");
  const fs::path a = tt::temp_dir("dist_data_mismatch_a"), b = tt::temp_dir("dist_data_mismatch_b");
  {
    std::ifstream corpus(titan::data::default_dataset_path() / "train.jsonl");
    std::ofstream fa(a / "data.jsonl"), fb(b / "data.jsonl");
    std::string line;
    for (int i = 0; i < 200 && std::getline(corpus, line); ++i) fa << line << "\n", fb << line << "\n";
    fb << "{\"text\": \"one more document on rank 1\"}\n";
  }
  const Overrides o =
      tiny(dump, 2, {{"training.dataset_path", "data.jsonl"}, {"validation.enable", "false"}});
  std::string out;
  int rc = run_two_programs({o, a}, {o, b}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("the ranks have different datasets: rank 1 has"), std::string::npos) << out;
  EXPECT_NE(out.find("data.jsonl"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// Each rank reads its own copy of the starting weights (one config, two working folders, as a copy
// on each host): copies with the same content train; a copy of other weights on rank 1 (another
// revision at the same path on another host) stops every rank before a step, naming the file.
// Before, the ranks trained two models under one step (FSDP gathering layers of both).
TEST(DataParallel, RanksStartingFromDifferentWeightsStopNamingTheFile) {
  const fs::path source = tt::temp_dir("dist_start_source");
  std::string out;
  ASSERT_EQ(
      run_job(0, tiny(source, 2, {{"training.steps", "2"}, {"checkpoint.last_save_in_hf", "true"}}), &out), 0)
      << out;
  const fs::path a = tt::temp_dir("dist_start_a"), b = tt::temp_dir("dist_start_b");
  fs::copy(source / "checkpoint" / "step-2-hf", a / "hf", fs::copy_options::recursive);
  fs::copy(source / "checkpoint" / "step-2-hf", b / "hf", fs::copy_options::recursive);
  const fs::path dump = tt::temp_dir("dist_start");
  const Overrides o = tiny(dump, 2,
                           {{"training.steps", "2"},
                            {"validation.enable", "false"},
                            {"checkpoint.initial_load_path", "hf"},
                            {"checkpoint.initial_load_in_hf", "true"}});
  // A file the weights do not load from (an adapter left beside them) is no difference.
  std::ofstream(b / "hf" / "adapter_model.safetensors") << "not loaded";
  EXPECT_EQ(run_two_programs({o, a}, {o, b}, &out), 0) << out;
  fs::remove_all(dump);
  {  // the last weight's last bytes differ on rank 1: same size, other content
    std::fstream f(b / "hf" / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-16, std::ios::end);
    f.write("0123456789abcdef", 16);
  }
  EXPECT_NE(run_two_programs({o, a}, {o, b}, &out), 0) << out;
  EXPECT_NE(out.find("the ranks have different starting points: rank 1 has '{\"bytes\":"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\"path\":\"model.safetensors\"}' where rank 0 has"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// Ranks on device cuda take the NCCL communicator (launch_communicator loads the CUDA backend for
// it); on a machine without a GPU, or a build without the backend, every rank stops before
// compute with an error naming the device (tests/backend/cuda_nccl_test.cpp runs NCCL on GPUs).
TEST(DataParallel, CudaRanksWithoutAGpuStopNamingTheDevice) {
  if (titan::device_available(titan::Device::CUDA)) GTEST_SKIP() << "this machine has a GPU";
  const fs::path dump = tt::temp_dir("dist_cuda_no_gpu");
  std::string out;
  int rc = run_job(2, tiny(dump, 2, {{"job.device", "cuda"}, {"checkpoint.enable", "false"}}), &out);
  EXPECT_NE(rc, 0) << out;
  // The ranks agree on it before the NCCL bootstrap (which no timeout bounds: a rank without the
  // device must not leave the others waiting there), and rank 0 says it once for all.
  const std::string said = "titan train: error: rank 0: device 'cuda' is unavailable";
  const size_t at = out.find(said);
  EXPECT_NE(at, std::string::npos) << out;
  EXPECT_EQ(out.find("device 'cuda' is unavailable", at + said.size()), std::string::npos) << out;
  EXPECT_NE(out.find("(rank 1 failed too)"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// ---------------------------------------------------------------- faults and signals

// The processes whose parent is `pid` (the ranks under mpirun), from /proc.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file(e.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(pid_t(std::stol(name)));
  }
  return out;
}

// Alive and not a zombie waiting to be reaped (given a few seconds to go).
bool running(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos || stat.compare(close + 2, 1, "Z") == 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// A 2-rank FSDP job training "forever" (checkpoint every 3 steps) under mpirun, output to `log`.
struct BackgroundJob {
  pid_t mpirun = 0;
  fs::path dump, log;

  explicit BackgroundJob(const std::string& name, const std::string& timeout_seconds = "30",
                         const Overrides& extra = {})
      : dump(tt::temp_dir(name)), log(dump.parent_path() / (name + ".log")) {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    std::vector<std::string> argv = {"mpirun",
                                     "--oversubscribe",
                                     "--bind-to",
                                     "none",
                                     "-x",
                                     "OMP_NUM_THREADS",
                                     "-np",
                                     "2",
                                     tt::titan_binary().string(),
                                     "train",
                                     "--config",
                                     tt::debugmodel_toml().string()};
    for (auto& [k, v] : tiny(dump, 2,
                             tt::joined({{"training.steps", "100000"},
                                         {"checkpoint.interval", "3"},
                                         {"checkpoint.keep_latest_k", "2"},
                                         {"comm.timeout_seconds", timeout_seconds}},
                                        extra)))
      argv.push_back("--" + k + "=" + v);
    mpirun = tt::spawn_logged(argv, log);
    EXPECT_NE(mpirun, 0) << "mpirun did not start";
  }
  ~BackgroundJob() {  // a job a failed test left behind
    if (mpirun && waitpid(mpirun, nullptr, WNOHANG) == 0) {
      for (pid_t r : children_of(mpirun)) kill(r, SIGKILL);
      kill(mpirun, SIGKILL);
      waitpid(mpirun, nullptr, 0);
    }
  }
  // Waits until a checkpoint after step 3 is committed (the job is in its stride).
  bool wait_for_checkpoint(int64_t at_least) {
    for (auto t0 = std::chrono::steady_clock::now();
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(240);) {
      auto steps = train::CheckpointManager(dump / "checkpoint", 0).committed_steps();
      if (!steps.empty() && steps.back() >= at_least) return true;
      if (waitpid(mpirun, nullptr, WNOHANG) == mpirun) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // Exit status of mpirun (-1 if it did not end within `seconds`).
  int wait_exit(double seconds) {
    int status = 0;
    for (auto t0 = std::chrono::steady_clock::now();
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds;) {
      if (waitpid(mpirun, &status, WNOHANG) == mpirun) {
        mpirun = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
};

// kill -9 of one rank mid-run: the job ends, non-zero, well within comm.timeout_seconds (30 s),
// naming the rank; the newest committed checkpoint still loads.
TEST(DataParallelFaults, ADeadRankEndsTheJobAndTheLastCheckpointLoads) {
  BackgroundJob job("dist_kill9");
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  std::vector<pid_t> ranks = children_of(job.mpirun);
  ASSERT_EQ(ranks.size(), 2u) << read_file(job.log);
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  const int rc = job.wait_exit(30);
  const std::string out = read_file(job.log);
  EXPECT_NE(rc, -1) << "the job did not end after a rank died:\n" << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  for (pid_t r : ranks) EXPECT_FALSE(running(r)) << "rank process " << r << " outlived the job";
  train::CheckpointManager ckpt(job.dump / "checkpoint", 0);
  ASSERT_TRUE(ckpt.latest_step().has_value());
  train::LoadedCheckpoint c = ckpt.load(*ckpt.latest_step());
  EXPECT_EQ(c.train_state["world_size"].get<int>(), 2);
}

// A rank that stops answering (SIGSTOP) after the first step: the other gives up after the step
// timeout (torchtitan's comm.train_timeout_seconds, 5 s here, where comm.timeout_seconds says 600),
// naming itself, the collective it waited in and the key, and the whole job ends non-zero.
TEST(DataParallelFaults, AHungRankTimesOutNamingTheCollective) {
  BackgroundJob job("dist_hang", "600", {{"comm.train_timeout_seconds", "5"}});
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  std::vector<pid_t> ranks = children_of(job.mpirun);
  ASSERT_EQ(ranks.size(), 2u) << read_file(job.log);
  ASSERT_EQ(kill(ranks[1], SIGSTOP), 0);
  const int rc = job.wait_exit(60);
  const std::string out = read_file(job.log);
  EXPECT_NE(rc, -1) << "the job did not end after a rank hung:\n" << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("did not complete within 5 s (comm.train_timeout_seconds)"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0"), std::string::npos) << out;
  for (pid_t r : ranks) EXPECT_FALSE(running(r)) << "rank process " << r << " outlived the job";
}

// The job stopped by `signal` exits 0 (mpirun too), its log says where, and its newest checkpoint is
// the step its last record reached, written by every rank.
void expect_a_clean_stop(BackgroundJob& job, const std::string& signal, std::string* log = nullptr) {
  const int rc = job.wait_exit(120);
  const std::string out = read_file(job.log);
  if (log) *log = out;
  EXPECT_EQ(rc, 0) << out;
  // The step boundary's line (a save, or the one a background save already writes).
  EXPECT_TRUE(out.find("received " + signal + ": saving a checkpoint at step") != std::string::npos ||
              out.find("received " + signal + " at step") != std::string::npos)
      << out;
  auto records = read_metrics(job.dump);
  ASSERT_FALSE(records.empty());
  const int64_t reached = records.rbegin()->first;
  train::CheckpointManager ckpt(job.dump / "checkpoint", 0);
  ASSERT_EQ(ckpt.latest_step(), reached) << out;
  const nlohmann::json state = ckpt.load(reached).train_state;
  EXPECT_EQ(state["step"].get<int64_t>(), reached);
  EXPECT_EQ(state["world_size"].get<int>(), 2);
}

// SIGTERM to the ranks (as `scancel --signal=TERM` or a forwarding launcher delivers it): they agree
// on one step, save one checkpoint there and exit 0. (A signal taken by a computing thread used to
// corrupt the heap inside oneDNN's JIT GEMM in ~4 runs of 10: see StopSignals in trainer.cpp.)
void sigterm_saves_the_step_reached(BackgroundJob& job) {
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  std::vector<pid_t> ranks = children_of(job.mpirun);
  ASSERT_EQ(ranks.size(), 2u) << read_file(job.log);
  // A few milliseconds apart, as signals really arrive.
  kill(ranks[0], SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  kill(ranks[1], SIGTERM);
  expect_a_clean_stop(job, "SIGTERM");
}

// SIGUSR1 to mpirun itself, which forwards it to every rank at once (a SIGTERM to mpirun reaches
// the ranks as SIGTERM and then SIGKILL 1 s later): every rank stops at one step, saves it, and
// mpirun exits 0. The start-up log names the command with mpirun's pid.
TEST(DataParallelFaults, Sigusr1ToMpirunStopsEveryRankWithACheckpoint) {
  BackgroundJob job("dist_sigusr1");
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  const pid_t mpirun = job.mpirun;
  ASSERT_EQ(kill(mpirun, SIGUSR1), 0);
  std::string out;
  expect_a_clean_stop(job, "SIGUSR1", &out);
  EXPECT_NE(out.find("stopping: `kill -USR1 " + std::to_string(mpirun) +
                     "` (mpirun forwards SIGUSR1 to every rank) stops the job at its next step with a "
                     "checkpoint"),
            std::string::npos)
      << out;
}

// SIGTERM to rank 1 alone (a scheduler's signal to one process, an OOM killer's neighbour): the ranks
// stop at one step with a checkpoint, and rank 0 names the rank that received it, where it used to say
// "received SIGTERM" of itself.
TEST(DataParallelFaults, ASignalToOneRankIsNamedByRankZero) {
  BackgroundJob job("dist_sigterm_one");
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  std::vector<pid_t> ranks = children_of(job.mpirun);
  ASSERT_EQ(ranks.size(), 2u) << read_file(job.log);
  ASSERT_EQ(kill(ranks[1], SIGTERM), 0);
  std::string out;
  expect_a_clean_stop(job, "SIGTERM", &out);
  EXPECT_TRUE(out.find("rank 1 received SIGTERM: saving a checkpoint at step") != std::string::npos ||
              out.find("rank 1 received SIGTERM at step") != std::string::npos)
      << out;
}

// SIGTERM to mpirun (what a Ctrl-C to it sends the ranks too): Open MPI kills the ranks a second
// later, so rank 0's acknowledgement says so and names the signal that stops with a checkpoint, where
// it used to promise a clean stop the job then never made.
TEST(DataParallelFaults, ASigtermFromMpirunSaysTheRanksAreKilled) {
  BackgroundJob job("dist_sigterm_mpirun");
  ASSERT_TRUE(job.wait_for_checkpoint(3)) << read_file(job.log);
  const pid_t mpirun = job.mpirun;
  ASSERT_EQ(kill(mpirun, SIGTERM), 0);
  const int rc = job.wait_exit(60);
  const std::string out = read_file(job.log);
  EXPECT_NE(rc, -1) << out;
  EXPECT_NE(
      out.find(
          "received SIGTERM from mpirun (what it sends on a Ctrl-C, a SIGTERM of its own, or when another "
          "rank has died): Open MPI "
          "kills the ranks 1 s later"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("to stop the job yourself, `kill -USR1 " + std::to_string(mpirun) +
                     "` stops it with a checkpoint"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("stopping cleanly once this step is done"), std::string::npos) << out;
}

TEST(DataParallelFaults, SigtermToTheRanksSavesOneCheckpointAndExitsZero) {
  BackgroundJob job("dist_sigterm");
  sigterm_saves_the_step_reached(job);
}

// The same with every step saved in the background: the ranks stop with a save of the step reached
// still being written on one or both, and commit it together before they exit.
TEST(DataParallelFaults, SigtermDuringBackgroundSavesCommitsTheStepReached) {
  BackgroundJob job("dist_sigterm_async", "30",
                    {{"checkpoint.async_mode", "async"}, {"checkpoint.interval", "1"}});
  sigterm_saves_the_step_reached(job);
}

}  // namespace

namespace {

// ZeRO-3's moving parts against the one-process run: layers gathered per use and recomputed in
// backward (full activation checkpointing), gradients reduce-scattered per micro-batch and summed
// over two micro-batches, and both reshard policies (parameters freed after each layer's forward,
// or kept until its backward).
TEST(DataParallel, FsdpWithRecomputeAccumulationAndEitherReshardPolicyMatchesOneRank) {
  for (const char* reshard : {"always", "never"}) {
    JobRun run = train(std::string("dist_fsdp_ac_") + reshard, 2, 1,
                       {{"training.global_batch_size", "4"},
                        {"activation_checkpoint.mode", "full"},
                        {"parallelism.fsdp_reshard_after_forward", reshard}});
    const std::string what = std::string("FSDP 2, recompute, accumulation 2, reshard ") + reshard;
    expect_same_steps(run, one_rank(), 1, 10, what);
    expect_same_final_state(run, one_rank(), 10, what);
  }
}

// A small MoE (4 experts, top 2) balanced by `load_balance`, trained `steps` steps on 2 FSDP ranks of
// local batch 2 and on one process of local batch `one_rank_batch`, both at global batch `global`
// (accumulating micro-batches): the same steps and the same final state.
void expect_moe_on_two_ranks_like_one(const std::string& load_balance, int64_t one_rank_batch, int64_t global,
                                      int steps) {
  const Overrides moe = {{"model.flavor", "debugmodel_moe"},
                         {"model.num_experts", "4"},
                         {"model.top_k", "2"},
                         {"model.moe_hidden_dim", "64"},
                         {"training.load_balance", load_balance},
                         {"training.steps", std::to_string(steps)},
                         {"checkpoint.interval", std::to_string(steps)},
                         {"training.global_batch_size", std::to_string(global)}};
  JobRun one = train("dist_moe_one_" + load_balance + "_" + std::to_string(getpid()), 0, one_rank_batch, moe);
  JobRun two = train("dist_moe_fsdp2_" + load_balance, 2, 2, moe);
  const std::string what = "MoE (" + load_balance + ") FSDP 2";
  expect_same_steps(two, one, 1, steps, what);
  expect_same_final_state(two, one, steps, what);
}

// A mixture-of-experts model: routing and the expert-bias update (from expert counts of every
// micro-batch, summed over the ranks) under FSDP with accumulation, against one process of twice
// the micro-batch: the bias update counts every token of the step, whatever its micro-batches.
TEST(DataParallel, FsdpTrainsAMixtureOfExpertsModelLikeOneRank) {
  expect_moe_on_two_ranks_like_one("expert_bias", /*one_rank_batch=*/4, /*global=*/8, /*steps=*/6);
}

// The aux loss is a statistic of the tokens one forward routes (transformers computes it per
// forward too): N ranks of local batch B train what one process trains with N micro-batches of B
// accumulated, not what it trains with one batch of N x B.
TEST(DataParallel, FsdpWithTheAuxLossMatchesOneRankAccumulatingTheSameMicroBatches) {
  expect_moe_on_two_ranks_like_one("aux_loss", /*one_rank_batch=*/2, /*global=*/4, /*steps=*/4);
}

// Expert parallelism (parallelism.expert_parallel_degree): each MoE layer's experts split over `ep`
// ranks of the shard dimension, the tokens travelling to their experts (all-to-all) instead of the
// experts' weights to the tokens. The small MoE of the tests above, balanced by expert biases, on 4
// ranks of local batch 2 (`mesh`: the replicate and shard degrees) and on one process of local batch
// 4, both at global batch 8: the same losses and grad norms (each run of experts counted once), the
// same final weights and moments (a run's gradient summed over every expert group's tokens), and
// the same data position.
const Overrides& small_moe_job() {
  static const Overrides moe = {{"model.flavor", "debugmodel_moe"},
                                {"model.num_experts", "4"},
                                {"model.top_k", "2"},
                                {"model.moe_hidden_dim", "64"},
                                {"training.load_balance", "expert_bias"},
                                {"training.steps", "6"},
                                {"checkpoint.interval", "3"},
                                {"validation.enable", "false"},
                                {"training.global_batch_size", "8"}};
  return moe;
}

const JobRun& moe_one_rank() {
  static const JobRun r = train("dist_ep_one_" + std::to_string(getpid()), 0, 4, small_moe_job());
  return r;
}

void expect_expert_parallel_like_one_rank(const Overrides& mesh, int ranks, const std::string& what) {
  const JobRun split =
      train("dist_ep_" + std::to_string(getpid()), ranks, 8 / ranks, tt::joined(small_moe_job(), mesh));
  expect_same_steps(split, moe_one_rank(), 1, 6, what);
  expect_same_final_state(split, moe_one_rank(), 6, what);
}

// Every rank holds half of the experts; the expert group is the whole world.
TEST(ExpertParallel, TwoRanksEachHoldingHalfOfTheExpertsTrainLikeOneRank) {
  expect_expert_parallel_like_one_rank({{"parallelism.expert_parallel_degree", "2"}}, 2, "FSDP 2 + EP 2");
}

// Two expert groups of two in a shard group of four: each run of experts is sharded over the two
// ranks holding it (one in each group), gathered for its layer's forward and backward, its gradient
// (each rank's from its own group's tokens) reduce-scattered between them.
TEST(ExpertParallel, TwoExpertGroupsInsideFourShardRanksTrainLikeOneRank) {
  expect_expert_parallel_like_one_rank({{"parallelism.expert_parallel_degree", "2"}}, 4, "FSDP 4 + EP 2");
}

// HSDP 2 x 2 with the experts split over each replica's shard group: each rank holds its run whole,
// and the replicas sum its gradient as they sum every block's slices.
TEST(ExpertParallel, HsdpWithTheExpertsSplitOverEachShardGroupTrainsLikeOneRank) {
  expect_expert_parallel_like_one_rank(
      {{"parallelism.data_parallel_replicate_degree", "2"}, {"parallelism.expert_parallel_degree", "2"}}, 4,
      "HSDP 2 x 2 + EP 2");
}

// HSDP 2 x 4 with two expert groups in each replica's shard group of four: each run of experts is
// sharded over the two ranks of a replica holding it, and the replicas sum every slice.
TEST(ExpertParallel, HsdpWithEachRunShardedInsideItsReplicaTrainsLikeOneRank) {
  expect_expert_parallel_like_one_rank(
      {{"parallelism.data_parallel_replicate_degree", "2"}, {"parallelism.expert_parallel_degree", "2"}}, 8,
      "HSDP 2 x 4 + EP 2");
}

// fsdp_reshard_after_forward = "never": a layer and its run of experts stay gathered from their
// forward to their backward (one gather each per step) while the tokens still travel to the experts.
TEST(ExpertParallel, RanksKeepingTheirLayersGatheredTrainLikeOneRank) {
  expect_expert_parallel_like_one_rank(
      {{"parallelism.expert_parallel_degree", "2"}, {"parallelism.fsdp_reshard_after_forward", "never"}}, 4,
      "FSDP 4 + EP 2, reshard never");
}

// bf16 compute: every rank gathers the bf16 compute copies of its layers' slices and of its run's
// slices (rounded once from the f32 masters, as one process rounds the whole blocks) and reduces
// f32 gradients; the experts run each row with its routing weight, so their backward rounds where
// one process's does. What is left is the order of the f32 sums (the dense gradients summed over the
// ranks, a run's over its two expert groups), so a step from the same weights holds the f32 bound:
// step 1, and step 4 of ranks that fork the one process's step-3 checkpoint (on an AMD Zen3, grad
// norms 2e-9 and 4e-9 apart). (Before the routing weights travelled with the rows, moe_combine
// weighted the outputs and the first grad norm was 1.8e-5 apart.)
//
// From there on the two runs' weights are not the same: the f32 masters after a step differ in
// their last bits (on Zen3 after step 1: 139k of 19.6M, by 6e-8 at most), and the few whose bf16
// copies then round the other way (8 there, 6 of them in lm_head) move by a bf16 unit, 2^-8 to 2^-7
// of the weight. The grad norms of steps 2-5 were 1.8e-5, 1.5e-4, 5e-4 and 1.3e-3 apart there, and from
// step 4 a token whose top-2 experts nearly tied routed differently. How many copies round apart
// depends on the CPU's summation order (on an AMD Zen5 none mattered over 6 steps), so those steps
// are checked on every CPU within bf16's noise: loss 1e-4, grad norm 1e-2, the same tokens.
TEST(ExpertParallel, Bf16RanksWithShardedRunsTrainLikeOneBf16Process) {
  const Overrides bf16 = tt::joined(small_moe_job(), {{"training.mixed_precision_param", "bfloat16"}});
  const Overrides ep2 = {{"parallelism.expert_parallel_degree", "2"}};
  const std::string pid = std::to_string(getpid());
  const std::string what = "FSDP 4 + EP 2 in bf16";
  const JobRun one = train("dist_ep_bf16_one_" + pid, 0, 4, bf16);
  const JobRun split = train("dist_ep_bf16_" + pid, 4, 2, tt::joined(bf16, ep2));
  const JobRun forked =
      train("dist_ep_bf16_fork_" + pid, 4, 2,
            tt::joined(tt::joined(bf16, ep2),
                       {{"checkpoint.initial_load_path", (one.dump / "checkpoint/step-3").string()},
                        {"checkpoint.initial_load_model_only", "false"}}));
  for (const JobRun* run : {&one, &split, &forked})
    ASSERT_FALSE(run->steps.empty()) << what << ": a run failed";
  ASSERT_EQ(forked.steps.begin()->first, 4) << what << ": the fork did not start at step 4";
  // 4 ranks of one thread each on this host: where its cores are fewer, the start-up says the ranks
  // share them (and MFU reads low by as much).
  const int host_cores = cpu::cpu_info().host_cores;
  EXPECT_EQ(split.out.find("ranks: 4 ranks x 1 core each share this host's " + std::to_string(host_cores) +
                           " physical cores: a rank gets about ") != std::string::npos,
            4 > host_cores)
      << split.out;
  expect_same_steps(split, one, 1, 1, what);
  expect_same_steps(forked, one, 4, 4, what + " from the one process's step 3");
  for (const JobRun* run : {&split, &forked})
    for (int64_t step = run->steps.begin()->first + 1; step <= 6; ++step) {
      const nlohmann::json &a = run->steps.at(step), &b = one.steps.at(step);
      EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), 1e-4 * b["loss"].get<double>()) << step;
      EXPECT_NEAR(a["grad_norm"].get<double>(), b["grad_norm"].get<double>(),
                  1e-2 * b["grad_norm"].get<double>())
          << step;
      EXPECT_EQ(a["batch_hash"], b["batch_hash"]) << step;
    }
}

// The paths a split layer runs more than once per step: ranks accumulating 2 micro-batches (2 ranks
// of local batch 2, each holding its run whole, whose gradient accumulates over them; 4 ranks of
// local batch 1, each holding half a run, whose gradient is reduce-scattered after each), every
// layer recomputed in backward (its exchanges run again, in the same order on every rank, and a
// sharded run is gathered again), and the held-out loss of [validation] through the exchanges: the
// steps, final state and held-out losses of one process of local batch 4.
TEST(ExpertParallel, AccumulatingRecomputingAndValidatingRanksTrainLikeOneRank) {
  const Overrides more = {{"activation_checkpoint.mode", "full"},
                          {"validation.enable", "true"},
                          {"validation.freq", "3"},
                          {"validation.steps", "2"}};
  const std::string pid = std::to_string(getpid());
  // The same held-out rows: 4 per validation step, on one process or 2 on each rank.
  const JobRun one =
      train("dist_ep_more_one_" + pid, 0, 4,
            tt::joined(tt::joined(small_moe_job(), more), {{"validation.local_batch_size", "4"}}));
  for (const int ranks : {2, 4}) {
    const std::string batch = std::to_string(4 / ranks);
    const JobRun split = train(
        "dist_ep_more_" + std::to_string(ranks) + "_" + pid, ranks, 4 / ranks,
        tt::joined(tt::joined(small_moe_job(), more),
                   {{"parallelism.expert_parallel_degree", "2"}, {"validation.local_batch_size", batch}}));
    const std::string what =
        "FSDP " + std::to_string(ranks) + " + EP 2, accumulation 2, full recompute, validation";
    expect_same_steps(split, one, 1, 6, what);
    expect_same_final_state(split, one, 6, what);
    for (int64_t step : {3, 6}) {
      ASSERT_TRUE(one.steps.at(step).contains("val_loss") && split.steps.at(step).contains("val_loss"))
          << what << ": step " << step << " not validated";
      const double a = one.steps.at(step)["val_loss"].get<double>(),
                   b = split.steps.at(step)["val_loss"].get<double>();
      EXPECT_NEAR(a, b, 1e-5 * a) << what << ": held-out loss at step " << step;
    }
  }
}

// A checkpoint of 4 ranks, each holding half of a run of half of the experts (each shard file
// holding its slice of a run), resumes on one process, on 4 ranks holding a quarter of the experts
// each, on 2 ranks holding half each, whole, and on 2 FSDP ranks that gather every expert: steps
// 4..6 and the final state are the uninterrupted one-process run's.
TEST(ExpertParallel, ACheckpointOfSplitExpertsResumesOnAnyExpertSplit) {
  const Overrides ep2 = {{"parallelism.expert_parallel_degree", "2"}};
  const JobRun first = train("dist_ep_first_" + std::to_string(getpid()), 4, 2,
                             tt::joined(tt::joined(small_moe_job(), ep2), {{"training.steps", "3"}}));
  ASSERT_TRUE(fs::exists(first.dump / "checkpoint/step-3/COMMITTED"));
  struct Resume {
    int ranks;
    Overrides mesh;
    std::string what;
  };
  const std::vector<Resume> resumes = {
      {0, {}, "FSDP 4 + EP 2 resumed on one process"},
      {4, {{"parallelism.expert_parallel_degree", "4"}}, "FSDP 4 + EP 2 resumed as EP 4"},
      {2, ep2, "FSDP 4 + EP 2 resumed as FSDP 2 + EP 2"},
      {2, {}, "FSDP 4 + EP 2 resumed as FSDP 2"}};
  for (const Resume& r : resumes) {
    JobRun run{
        tt::temp_dir("dist_ep_resume_" + std::to_string(r.ranks) + "_" + std::to_string(r.mesh.size())), {}};
    fs::copy(first.dump, run.dump, fs::copy_options::recursive);
    std::string out;
    const int64_t local_batch = r.ranks == 0 ? 4 : 8 / r.ranks;
    ASSERT_EQ(run_job(r.ranks, tiny(run.dump, local_batch, tt::joined(small_moe_job(), r.mesh)), &out), 0)
        << out;
    EXPECT_NE(out.find("resumed from"), std::string::npos) << r.what << "\n" << out;
    run.steps = read_metrics(run.dump);
    expect_same_steps(run, moe_one_rank(), 1, 6, r.what);
    expect_same_final_state(run, moe_one_rank(), 6, r.what);
  }
}

// Conversations (training.chat_field): each rank's rows hold a different number of targets (answers of
// different lengths, prompts and padding ignored), so the loss and gradient are the mean over every
// target of the step only when each rank's and micro-batch's mean is weighed by its share: 2 FSDP
// ranks of 1 row accumulating 2 micro-batches train what one process of 4 rows trains.
TEST(DataParallel, FsdpRanksAccumulatingConversationsTrainLikeOneRank) {
  const Overrides chats = {{"training.dataset_path", tt::write_conversations("dist_chat_data").string()},
                           {"training.chat_field", "messages"},
                           {"training.steps", "4"},
                           {"validation.enable", "false"},
                           {"checkpoint.enable", "false"}};
  const JobRun one = train("dist_chat_one_" + std::to_string(getpid()), 0, 4, chats);
  const JobRun two = train("dist_chat_two_" + std::to_string(getpid()), 2, 1,
                           tt::joined(chats, {{"training.global_batch_size", "4"}}));
  expect_same_steps(two, one, 1, 4, "FSDP 2, accumulation 2, conversations");
}

// Packed conversations on an MoE with the aux loss: each rank takes its rows' documents (attention
// within each conversation) and padding (left out of the aux loss) from the global batch, so 2 FSDP
// ranks of 1 row accumulating 2 micro-batches train what one process accumulating the same 4 rows
// one by one trains (the aux loss is a statistic of each forward's tokens).
TEST(DataParallel, FsdpRanksOnPackedConversationsOfAnMoeTrainLikeOneRank) {
  const Overrides packed = {{"training.dataset_path", tt::write_conversations("dist_packed_data").string()},
                            {"training.chat_field", "messages"},
                            {"training.pack_conversations", "true"},
                            {"model.attn_mask_type", "block_causal"},
                            {"model.flavor", "debugmodel_moe"},
                            {"model.num_experts", "4"},
                            {"model.top_k", "2"},
                            {"model.moe_hidden_dim", "64"},
                            {"training.load_balance", "aux_loss"},
                            {"training.global_batch_size", "4"},
                            {"training.steps", "4"},
                            {"validation.enable", "false"},
                            {"checkpoint.enable", "false"}};
  const JobRun one = train("dist_packed_one_" + std::to_string(getpid()), 0, 1, packed);
  const JobRun two = train("dist_packed_two_" + std::to_string(getpid()), 2, 1, packed);
  expect_same_steps(two, one, 1, 4, "FSDP 2, accumulation 2, packed conversations, MoE aux loss");
  for (int64_t s = 1; s <= 4; ++s)
    EXPECT_NEAR(two.steps.at(s).at("aux_loss").get<double>(), one.steps.at(s).at("aux_loss").get<double>(),
                1e-5)
        << "aux loss at step " << s;
}

// A one-process command that mpirun starts would run once per rank, each racing the others for its
// output (N exports into one folder: one wrote it, the others failed on it): refused, said once by
// rank 0. Its --help and `titan version` (a job comparing its hosts' builds) run; so does a command a
// script under mpirun runs (the launcher's environment reaches it; the script decides which ranks do).
TEST(DataParallel, AOneProcessCommandMpirunStartsIsRefusedOnce) {
  const fs::path out = tt::temp_dir("dist_one_process_" + std::to_string(getpid())) / "hf";
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np "
      "2 ";
  const std::string export_command = tt::titan_binary().string() + " export --checkpoint " +
                                     out.parent_path().string() + " --out " + out.string();
  const std::string refusal =
      "titan export: error: it runs as one process, and the MPI launcher started 2: run it without mpirun "
      "(the commands that run over ranks: titan ";
  std::string said;
  auto run = [&](const std::string& command) {
    said.clear();
    return tt::run_command(mpirun + command + " 2>&1", &said);
  };
  EXPECT_NE(run(export_command), 0) << said;
  EXPECT_NE(said.find(refusal), std::string::npos) << said;
  EXPECT_EQ(said.find(refusal), said.rfind(refusal)) << said;
  for (const char* name : {"train", "eval", "check"}) EXPECT_NE(said.find(name), std::string::npos) << said;
  EXPECT_EQ(run(tt::titan_binary().string() + " version"), 0) << said;
  EXPECT_EQ(run(export_command + " --help"), 0) << said;
  // Through a script: the export runs (and fails on its empty checkpoint folder, its own error).
  EXPECT_NE(run("sh -c '" + export_command + "'"), 0) << said;
  EXPECT_EQ(said.find("it runs as one process"), std::string::npos) << said;
  EXPECT_NE(said.find("titan export: error: "), std::string::npos) << said;
}

// A dump folder that is not the same folder for every rank (a per-host path on several hosts; here
// one relative path under two working folders) is refused before any step, naming the key: the
// ranks' checkpoint shards would otherwise be missing at the first save.
TEST(DataParallel, ADumpFolderNotSharedByEveryRankIsRefusedBeforeAnyStep) {
  const fs::path a = tt::temp_dir("dist_unshared_a"), b = tt::temp_dir("dist_unshared_b");
  const Overrides o = tiny("run", 2, {{"validation.enable", "false"}});
  std::string out;
  int rc = run_two_programs({o, a}, {o, b}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(
      out.find("job.dump_folder: 'run': rank 1 does not see every rank's lock file there: job.dump_folder "
               "must be on a file system every rank sees"),
      std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(a / "run" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(b / "run" / "metrics.jsonl"));

  // Lock files an earlier run left in both folders (a copied run folder, per-host scratch that
  // held a 2-rank run) make every rank see every lock file; the holders they name still differ.
  for (const fs::path& dir : {a, b}) {
    fs::remove_all(dir / "run");
    fs::create_directories(dir / "run");
    for (int r = 0; r < 2; ++r)
      std::ofstream(dir / "run" / (".titan-rank" + std::to_string(r) + ".lock")) << "pid 1 on host old\n";
  }
  out.clear();
  rc = run_two_programs({o, a}, {o, b}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("the ranks have different views of job.dump_folder 'run': rank 1 has '.titan-rank"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("lock files left by an earlier run do not make separate folders one"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(a / "run" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(b / "run" / "metrics.jsonl"));
}

// A rank that loads another build of libtitan (an older install on one host; here a copy of this
// build whose commit string differs by one character) is refused before any step, naming both.
TEST(DataParallel, RanksRunningDifferentTitanBuildsAreRefused) {
  const fs::path lib_dir = tt::temp_dir("dist_other_build_" + std::to_string(getpid()));
  const fs::path lib = tt::binary_dir() / "src" / "titan" / "libtitan.so.0.1";
  std::string bytes;
  {
    std::ifstream in(lib, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string commit = train::titan_git_describe();
  const size_t at = bytes.find(commit + '\0');
  ASSERT_NE(at, std::string::npos) << "no '" << commit << "' in " << lib;
  ASSERT_EQ(bytes.find(commit + '\0', at + 1), std::string::npos) << "'" << commit << "' twice in " << lib;
  std::string other = commit;
  other[0] = other[0] == 'z' ? 'y' : 'z';
  bytes.replace(at, commit.size(), other);
  std::ofstream(lib_dir / "libtitan.so.0.1", std::ios::binary) << bytes;

  const fs::path dump = tt::temp_dir("dist_other_build_run");
  const Overrides o = tiny(dump, 2, {{"validation.enable", "false"}});
  std::string out;
  const int rc = run_two_programs({o}, {o, {}, lib_dir.string()}, &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("the ranks have different titan builds: rank 1 has 'titan: " + other +
                     "' where rank 0 has 'titan: " + commit + "'"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dump / "metrics.jsonl"));
}

// What each rank holds between steps: its slice of the parameters, gradients and AdamW state, and
// (a bf16 job) the bf16 copy of its slice that AdamW writes (the allocator's figures in the start-up
// log), half of the one-process figures up to the padding of every block to a multiple of the shard
// degree.
TEST(DataParallel, FsdpRanksHoldHalfOfTheStateOfOneProcess) {
  auto memory_line = [](int ranks) {
    std::string out;
    const fs::path dump = tt::temp_dir("dist_memory_" + std::to_string(ranks));
    EXPECT_EQ(run_job(ranks,
                      tiny(dump, ranks == 0 ? 4 : 2,
                           {{"training.steps", "1"},
                            {"lr_scheduler.warmup_steps", "0"},
                            {"training.mixed_precision_param", "bfloat16"}}),
                      &out),
              0)
        << out;
    const size_t at = out.find("memory per rank: ");
    if (at == std::string::npos) {
      ADD_FAILURE() << "no 'memory per rank' line in: " << out;
      return std::array<double, 4>{};
    }
    double params = 0, grads = 0, moments = 0, copy = 0;
    EXPECT_EQ(
        std::sscanf(out.c_str() + at,
                    "memory per rank: parameters %lf MiB, gradients %lf MiB, AdamW state %lf MiB, bf16 copy "
                    "of the parameters %lf MiB",
                    &params, &grads, &moments, &copy),
        4)
        << out.substr(at, 160);
    return std::array<double, 4>{params, grads, moments, copy};
  };
  const auto one = memory_line(0), two = memory_line(2);
  EXPECT_NEAR(one[3], one[0] / 2, 1e-6 * one[0]) << "the bf16 copy is half the f32 parameters' bytes";
  for (int k = 0; k < 4; ++k) {
    EXPECT_GT(two[size_t(k)], 0.0);
    EXPECT_NEAR(two[size_t(k)], one[size_t(k)] / 2, 0.01 * one[size_t(k)]) << "category " << k;
  }
}

}  // namespace

namespace {

// Under bf16 mixed precision every block is all-gathered in bf16 (the values the one-process run
// computes with: the f32 master rounded once), so the two runs compute alike up to the order of
// the f32 gradient sums, which bf16 rounding of the updated weights can amplify to a few bf16 ulps.
// With training.mixed_precision_reduce = "bfloat16" too (torchtitan's FSDP2 recipe: bf16 compute,
// bf16 reduce-scatters), the first loss is the same (computed before any reduction) and the run
// trains like the others, for half the f32 run's bytes (every collective is bf16).
TEST(DataParallel, FsdpGathersLayersInBf16UnderBf16MixedPrecision) {
  const Overrides bf16 = {{"training.mixed_precision_param", "bfloat16"}, {"checkpoint.enable", "false"}};
  Overrides bf16_reduce = bf16;
  bf16_reduce.emplace_back("training.mixed_precision_reduce", "bfloat16");
  JobRun one = train("dist_bf16_one_" + std::to_string(getpid()), 0, 4, bf16);
  JobRun two = train("dist_bf16_fsdp2", 2, 2, bf16);
  JobRun two_reduce = train("dist_bf16_fsdp2_reduce_bf16", 2, 2, bf16_reduce);
  JobRun two_f32 = train("dist_f32_fsdp2_comm", 2, 2, {{"checkpoint.enable", "false"}});
  for (int64_t s = 1; s <= 10; ++s) {
    ASSERT_TRUE(one.steps.count(s) && two.steps.count(s) && two_reduce.steps.count(s) &&
                two_f32.steps.count(s))
        << "step " << s;
    const double b = one.steps.at(s)["loss"].get<double>();
    EXPECT_NEAR(two.steps.at(s)["loss"].get<double>(), b, 2e-3 * std::fabs(b)) << "loss at step " << s;
    EXPECT_NEAR(two_reduce.steps.at(s)["loss"].get<double>(), b, 2e-3 * std::fabs(b))
        << "loss at step " << s << " with bf16 reduce-scatters";
    // The gathers move half the bytes of the f32 run's; the reduce-scatters (f32) do not change,
    // until they are bf16 too.
    const double comm = two.steps.at(s)["comm_mib"].get<double>();
    EXPECT_LT(comm, two_f32.steps.at(s)["comm_mib"].get<double>()) << s;
    EXPECT_LT(two_reduce.steps.at(s)["comm_mib"].get<double>(), comm) << s;
  }
  EXPECT_EQ(two_reduce.steps.at(1)["loss"].get<double>(), two.steps.at(1)["loss"].get<double>());
  const double norm = two_reduce.steps.at(1)["grad_norm"].get<double>(),
               norm_f32 = two.steps.at(1)["grad_norm"].get<double>();
  EXPECT_NE(norm, norm_f32) << "the gradients were not rounded to bf16";
  EXPECT_NEAR(norm, norm_f32, norm_f32 / 256);
  std::printf(
      "comm per step: f32 %.2f MiB, bf16 gathers %.2f MiB, bf16 gathers and reduce-scatters %.2f MiB\n",
      two_f32.steps.at(1)["comm_mib"].get<double>(), two.steps.at(1)["comm_mib"].get<double>(),
      two_reduce.steps.at(1)["comm_mib"].get<double>());
}

}  // namespace

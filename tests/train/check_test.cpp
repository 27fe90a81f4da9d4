// titan check through the binary: on a small Hugging Face folder written by titan's own export (with a
// [kernels] substitution) every row passes; on the shared transformers oracles the model rows pass
// and the training rows fail with the reason (they ship no tokenizer); a checkpoint missing a tensor
// fails the model row, naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tiny_job.h"
#include "titan/io/safetensors.h"
#include "titan/train/job_config.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

struct CheckRun {
  int rc = -1;
  std::string out;
  nlohmann::json json;
  std::map<std::string, nlohmann::json> rows;  // by check name
};

// Without --workdir, titan check runs in a folder under TMPDIR and keeps it when a row fails (the
// logs are for the user). Tests that expect FAIL rows would leave ~450 MiB in /tmp on every run, so
// TMPDIR points to a folder of the test's own, removed when the test ends. Under mpirun the
// launcher keeps its own TMPDIR (its session folder's socket paths have a length limit); `-x` hands
// the ranks this one.
CheckRun titan_check(const std::string& args, const fs::path& json, const std::string& launcher = "") {
  CheckRun r;
  const std::string tmpdir = tt::temp_dir("check_tmpdir_" + std::to_string(getpid())).string();
  const std::string start =
      launcher.empty() ? "TMPDIR=" + tmpdir + " " : launcher + "-x TMPDIR=" + tmpdir + " ";
  r.rc = tt::run_command(start + tt::titan_binary().string() + " check " + args + " --json " + json.string(),
                         &r.out);
  std::ifstream f(json);
  if (!f) return r;
  r.json = nlohmann::json::parse(f);
  for (auto& row : r.json.at("rows")) r.rows[row.at("check").get<std::string>()] = row;
  return r;
}

// `titan check` as `ranks` processes of one mpirun (one thread each).
CheckRun titan_check_under_mpirun(int ranks, const std::string& args, const fs::path& json) {
  return titan_check(args, json,
                     "OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
                     "--oversubscribe --bind-to none -x OMP_NUM_THREADS -np " + std::to_string(ranks) + " ");
}

// Parameters of a safetensors file, counted here from its header.
int64_t numel_in(const fs::path& file) {
  int64_t n = 0;
  const auto st = io::SafetensorsFile::open(file);
  for (auto& t : st.tensors()) n += t.numel();
  return n;
}

fs::path oracle(const char* name) { return tt::fixtures_dir() / "oracles" / "hf-transformers-5.17" / name; }

}  // namespace

TEST(Check, EveryRowPassesOnATitanExportWithAKernelSubstitution) {
  // A tiny debugmodel trained 10 steps (well below its random-init loss) and exported by titan.
  const fs::path dump = tt::temp_dir("check_source");
  train::run_training(train::load_job_config(tt::debugmodel_toml().string(),
                                             tt::tiny_job(dump, {{"training.steps", "10"},
                                                                 {"optimizer.lr", "3e-3"},
                                                                 {"lr_scheduler.warmup_steps", "2"},
                                                                 {"validation.enable", "false"},
                                                                 {"checkpoint.last_save_in_hf", "true"}})));
  const fs::path hf = dump / "checkpoint" / "step-10-hf";
  ASSERT_TRUE(fs::exists(hf / "model.safetensors"));

  const fs::path dir = tt::temp_dir("check_export");
  const fs::path toml = dir / "job.toml";
  std::ofstream(toml) << "[job]\ndump_folder = \"" << (dir / "dump").string() << "\"\n"
                      << "[model]\nname = \"hf\"\nhf_assets_path = \"" << hf.string()
                      << "\"\n[training]\nseq_len = 64\nlocal_batch_size = 2\n"
                         "[checkpoint]\ninitial_load_in_hf = true\n"
                         "[kernels]\nrope = { impl = \"gather_free\", modules = \"layers.*\" }\n";
  CheckRun r = titan_check("--config " + toml.string() + " --workdir " + (dir / "work").string(), dir / "check.json");
  EXPECT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(r.rows.size(), 9u) << r.out;
  for (auto& [name, row] : r.rows)  // the job's own folder holds no checkpoint: nothing to resume
    EXPECT_EQ(row.at("status"), name == "resume" ? "SKIP" : "PASS") << name << ": " << row.at("value");
  EXPECT_EQ(r.json.at("failures"), 0);
  const std::string model = r.rows["model"].at("value");
  EXPECT_NE(model.find(std::to_string(numel_in(hf / "model.safetensors")) + " in "), std::string::npos) << model;
  EXPECT_NE(model.find("lm_head absent (tied)"), std::string::npos) << model;
  EXPECT_NE(r.rows["kernels"].at("value").get<std::string>().find("rope=gather_free"), std::string::npos);
  // The runs the checks made are there to read (--workdir keeps them).
  EXPECT_TRUE(fs::exists(dir / "work" / "run" / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir / "work" / "resume" / "checkpoint" / "step-3" / "COMMITTED"));
}

// A job that would resume its own checkpoint does not load the starting weights the model and export
// rows check: their values say so, so that a PASS is not read as the resumed model's.
TEST(Check, TheModelRowsOfAResumingJobSayTheyCheckTheStartingWeights) {
  const fs::path dir = tt::temp_dir("check_resuming_" + std::to_string(getpid()));
  // Starting weights with their tokenizer: a tiny debugmodel's export.
  train::run_training(
      train::load_job_config(tt::debugmodel_toml().string(),
                             tt::tiny_job(dir / "source", {{"training.steps", "1"},
                                                           {"validation.enable", "false"},
                                                           {"checkpoint.last_save_in_hf", "true"}})));
  const fs::path hf = dir / "source" / "checkpoint" / "step-1-hf", toml = dir / "job.toml";
  std::ofstream(toml) << "[job]\ndump_folder = \"" << (dir / "dump").string() << "\"\n"
                      << "[model]\nname = \"hf\"\nhf_assets_path = \"" << hf.string() << "\"\n"
                      << "[training]\nseq_len = 64\nlocal_batch_size = 2\nsteps = 1\n"
                         "[lr_scheduler]\nwarmup_steps = 1\n[validation]\nenable = false\n"
                         "[checkpoint]\nenable = true\ninitial_load_in_hf = true\n";
  const std::string note = "these are the job's starting weights, which titan train does not load now";
  CheckRun fresh = titan_check("--config " + toml.string() + " --steps 2", dir / "fresh.json");
  ASSERT_TRUE(fresh.rows.count("model")) << fresh.out;
  EXPECT_EQ(fresh.rows["resume"].at("status"), "SKIP") << fresh.out;
  EXPECT_EQ(fresh.rows["model"].at("value").get<std::string>().find(note), std::string::npos) << fresh.out;
  // The job's first step saves a checkpoint its next start resumes.
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " train --config " + toml.string() + " 2>&1", &out),
            0)
      << out;
  CheckRun resuming = titan_check("--config " + toml.string() + " --steps 2", dir / "resuming.json");
  ASSERT_TRUE(resuming.rows.count("export")) << resuming.out;
  EXPECT_EQ(resuming.rows["resume"].at("status"), "PASS") << resuming.out;
  // Its one step is trained: the job as configured has nothing left, which the row says.
  EXPECT_NE(resuming.rows["resume"].at("value").get<std::string>().find(
                "; step 1 is already at or past training.steps = 1: titan train would train nothing (raise "
                "training.steps to go on)"),
            std::string::npos)
      << resuming.rows["resume"];
  const CheckRun more =
      titan_check("--config " + toml.string() + " --training.steps=2 --steps 2", dir / "more.json");
  EXPECT_EQ(more.rows.at("resume").at("value").get<std::string>().find("would train nothing"),
            std::string::npos)
      << more.out;
  for (const char* row : {"model", "export"})
    EXPECT_NE(resuming.rows[row].at("value").get<std::string>().find(note), std::string::npos)
        << row << ": " << resuming.rows[row];
}

TEST(Check, OracleCheckpointsPassTheModelRowsAndTrainingRowsFailWithTheReason) {
  for (const char* name : {"tiny_dense", "tiny_moe"}) {
    const fs::path dir = tt::temp_dir(std::string("check_oracle_") + name);
    // A dump folder of its own: the resume row reads the job's (debugmodel.toml's is relative).
    CheckRun r =
        titan_check("--config " + tt::debugmodel_toml().string() +
                        " --model.name=hf --model.hf_assets_path=" + oracle(name).string() +
                        " --checkpoint.initial_load_in_hf=true --job.dump_folder=" + (dir / "dump").string(),
                    dir / "check.json");
    EXPECT_EQ(r.rc, 1) << r.out;
    ASSERT_EQ(r.rows.size(), 9u) << r.out;
    EXPECT_EQ(r.rows["resume"].at("status"), "SKIP") << r.rows["resume"];
    EXPECT_EQ(r.rows["model"].at("status"), "PASS") << r.rows["model"];
    EXPECT_EQ(r.rows["export"].at("status"), "PASS") << r.rows["export"];
    const std::string count = std::to_string(numel_in(oracle(name) / "model.safetensors"));
    EXPECT_NE(r.rows["model"].at("value").get<std::string>().find(count + " parameters in config.json, " + count),
              std::string::npos)
        << r.rows["model"];
    // The oracles carry no tokenizer: the job cannot train, and the rows say why.
    for (const char* row : {"loaded/random", "timing", "checkpoint"}) {
      EXPECT_EQ(r.rows[row].at("status"), "FAIL") << row;
      EXPECT_NE(r.rows[row].at("value").get<std::string>().find("tokenizer.json"), std::string::npos) << r.rows[row];
    }
    EXPECT_EQ(r.json.at("failures"), 3);
  }
}

// `titan check` of a copy of the tiny dense oracle (its config.json) whose tensors are `tensors`
// (views of the oracle's, edited by the caller), in `dir`.
CheckRun check_edited_oracle(const fs::path& dir, const std::vector<io::TensorWrite>& tensors) {
  const fs::path hf = dir / "hf";
  fs::create_directories(hf);
  fs::copy_file(oracle("tiny_dense") / "config.json", hf / "config.json");
  io::write_safetensors(hf / "model.safetensors", tensors);
  return titan_check("--config " + tt::debugmodel_toml().string() +
                         " --model.name=hf --model.hf_assets_path=" + hf.string() +
                         " --checkpoint.initial_load_in_hf=true --job.dump_folder=" + (dir / "dump").string(),
                     dir / "check.json");
}

TEST(Check, ACheckpointMissingATensorFailsTheModelRowNamingTheKey) {
  auto src = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  const std::string dropped = "model.layers.1.mlp.down_proj.weight";
  std::vector<io::TensorWrite> keep;
  for (auto& t : src.tensors())
    if (t.name != dropped) keep.push_back({t.name, t.dtype, t.shape, t.data});
  ASSERT_EQ(keep.size() + 1, src.tensors().size());
  CheckRun r = check_edited_oracle(tt::temp_dir("check_broken"), keep);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.rows["model"].at("status"), "FAIL");
  EXPECT_NE(r.rows["model"].at("value").get<std::string>().find(dropped), std::string::npos) << r.rows["model"];
  EXPECT_EQ(r.rows["export"].at("status"), "FAIL");
}

// One tensor stored in bf16 among f32 ones: the model row says the dtypes are mixed; the export
// (one dtype, the embedding's) holds the same values, so the export row passes, comparing values.
// A float16 checkpoint (titan exports float32 or bfloat16): exported as float32, which holds every
// float16 value exactly, and compared value for value.
TEST(Check, AFloat16CheckpointIsExportedAsFloat32WithTheSameValues) {
  auto src = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  std::vector<std::vector<uint16_t>> halves;
  std::vector<io::TensorWrite> tensors;
  for (auto& t : src.tensors()) {
    auto& h = halves.emplace_back(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      h[size_t(i)] = f32_to_f16(v);
    }
    tensors.push_back({t.name, DType::F16, t.shape, h.data()});
  }
  CheckRun r = check_edited_oracle(tt::temp_dir("check_f16"), tensors);
  EXPECT_EQ(r.rows["export"].at("status"), "PASS") << r.rows["export"];
  EXPECT_NE(r.rows["export"].at("value").get<std::string>().find("value-equal (f16 exported as f32)"),
            std::string::npos)
      << r.rows["export"];
}

TEST(Check, AMixedDtypeCheckpointFailsTheModelRowAndExportsTheSameValues) {
  auto src = io::SafetensorsFile::open(oracle("tiny_dense") / "model.safetensors");
  std::vector<bf16> norm;
  std::vector<io::TensorWrite> tensors;
  for (auto& t : src.tensors()) {
    if (t.name != "model.norm.weight") {
      tensors.push_back({t.name, t.dtype, t.shape, t.data});
      continue;
    }
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      norm.push_back(f32_to_bf16(v));
    }
    tensors.push_back({t.name, DType::BF16, t.shape, norm.data()});
  }
  CheckRun r = check_edited_oracle(tt::temp_dir("check_mixed_dtype"), tensors);
  EXPECT_EQ(r.rows["model"].at("status"), "FAIL");
  EXPECT_NE(r.rows["model"].at("value").get<std::string>().find("dtypes bf16, f32"), std::string::npos)
      << r.rows["model"];
  EXPECT_EQ(r.rows["export"].at("status"), "PASS") << r.rows["export"];
}

TEST(Check, TheRanksRowHearsFromEveryRankUnderMpirun) {
  // Two real MPI ranks: both answer the all-gather of host names; the other rows run on rank 0.
  auto run = [](const std::string& mesh, const char* name) {
    const fs::path work = tt::temp_dir(name);
    return titan_check_under_mpirun(2,
                                    "--config " + tt::debugmodel_toml().string() +
                                        tt::cli_args(tt::tiny_job(work / "dump", {{"validation.enable", "false"}})) +
                                        " --steps 2 --workdir " + (work / "check").string() + " " + mesh,
                                    work / "rows.json");
  };
  CheckRun ok = run("--parallelism.data_parallel_shard_degree=2", "check_ranks_ok");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  ASSERT_TRUE(ok.rows.count("ranks")) << ok.out;
  EXPECT_EQ(ok.rows["ranks"].at("status"), "PASS") << ok.out;
  const std::string value = ok.rows["ranks"].at("value");
  EXPECT_NE(value.find("2 of 2 ranks answered"), std::string::npos) << value;
  EXPECT_NE(value.find("FSDP, 2 ranks"), std::string::npos) << value;
  EXPECT_EQ(ok.rows["checkpoint"].at("status"), "PASS") << ok.out;
  // Experts split over the two ranks: the rows on rank 0 alone run the experts whole (a degree of 2
  // on one process used to fail them as an invalid config).
  CheckRun experts =
      run("--model.flavor=debugmodel_moe --model.num_experts=4 --model.top_k=2 "
          "--model.moe_hidden_dim=64 --parallelism.data_parallel_shard_degree=2 "
          "--parallelism.expert_parallel_degree=2",
          "check_ranks_experts");
  EXPECT_EQ(experts.rc, 0) << experts.out;
  for (const char* row : {"ranks", "timing", "checkpoint"}) {
    ASSERT_TRUE(experts.rows.count(row)) << row << "\n" << experts.out;
    EXPECT_EQ(experts.rows[row].at("status"), "PASS") << row << ": " << experts.rows[row];
  }
  // A mesh that does not fit the launched ranks fails the row on every rank, naming the keys.
  CheckRun bad = run("--parallelism.data_parallel_shard_degree=3", "check_ranks_bad");
  EXPECT_NE(bad.rc, 0) << bad.out;
  ASSERT_TRUE(bad.rows.count("ranks")) << bad.out;
  EXPECT_EQ(bad.rows["ranks"].at("status"), "FAIL");
  EXPECT_NE(bad.rows["ranks"].at("value").get<std::string>().find(
                "parallelism.data_parallel_shard_degree (3) = 3 != world size 2"),
            std::string::npos)
      << bad.out;
}

// A reused --workdir would resume the earlier runs and report their figures; a --json that cannot be
// written would be found out only after every run. Both stop before any run.
TEST(Check, AReusedWorkdirOrAJsonInAMissingFolderIsRefusedBeforeAnyRun) {
  const fs::path dir = tt::temp_dir("check_refused");
  fs::create_directories(dir / "work" / "run");
  std::string out;
  const std::string check = tt::titan_binary().string() + " check --config " + tt::debugmodel_toml().string();
  EXPECT_EQ(tt::run_command(check + " --workdir " + (dir / "work").string() + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("--workdir '" + (dir / "work").string() + "' is not an empty folder"), std::string::npos)
      << out;
  EXPECT_EQ(tt::run_command(check + " --json " + (dir / "missing" / "c.json").string() + " 2>&1", &out), 1)
      << out;
  EXPECT_NE(
      out.find("titan check: error: --json: the folder '" + (dir / "missing").string() + "' does not exist"),
      std::string::npos)
      << out;
  EXPECT_EQ(tt::run_command(check + " --json " + tt::debugmodel_toml().string() + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("is the input"), std::string::npos) << out;
  EXPECT_EQ(tt::run_command(check + " --json " + dir.string() + " 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("titan check: error: --json: '" + dir.string() + "' is a folder"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "work" / "run" / "metrics.jsonl"));
}

// The kernels row checks a [kernels] rule as `titan train` does before its parity runs: a rule that
// could never apply (rope in the output head) fails the row, named, and the summary still prints.
TEST(Check, AKernelRuleThatCouldNeverApplyFailsTheKernelsRow) {
  const fs::path dir = tt::temp_dir("check_kernels_never");
  const fs::path toml = dir / "job.toml";
  std::ofstream(toml) << "[training]\nseq_len = 64\nlocal_batch_size = 2\n"
                         "[kernels]\nrope = { impl = \"gather_free\", modules = \"output\" }\n";
  CheckRun r = titan_check("--config " + toml.string() + " --model.n_layers=1 --model.dim=64 --model.n_heads=2 "
                           "--model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=128",
                           dir / "check.json");
  EXPECT_EQ(r.rc, 1) << r.out;
  ASSERT_TRUE(r.rows.count("kernels")) << r.out;
  EXPECT_EQ(r.rows["kernels"].at("status"), "FAIL");
  EXPECT_NE(r.rows["kernels"].at("value").get<std::string>().find("matches no module that runs rope"),
            std::string::npos)
      << r.rows["kernels"];
  EXPECT_NE(r.out.find("titan check: "), std::string::npos) << r.out;
}

// The check's runs write under its work folder, so its checkpoint row also probes the job's own
// folders: a checkpoint.folder that `titan train` could not create (here under a regular file)
// fails the row naming the key, and nothing is left in the job's dump folder.
TEST(Check, ACheckpointFolderTheJobCouldNotCreateFailsTheCheckpointRow) {
  const fs::path dir = tt::temp_dir("check_folders_" + std::to_string(getpid()));
  std::ofstream(dir / "a_file") << "not a folder\n";
  const fs::path toml = dir / "job.toml";
  std::ofstream(toml) << "[training]\nseq_len = 64\nlocal_batch_size = 2\n";
  CheckRun r =
      titan_check("--config " + toml.string() +
                      " --model.n_layers=1 --model.dim=64 --model.n_heads=2 "
                      "--model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=128 --job.dump_folder=" +
                      (dir / "dump").string() +
                      " --checkpoint.enable=true --checkpoint.folder=" + (dir / "a_file" / "ck").string(),
                  dir / "check.json");
  EXPECT_EQ(r.rc, 1) << r.out;
  ASSERT_TRUE(r.rows.count("checkpoint")) << r.out;
  const std::string value = r.rows["checkpoint"].at("value");
  EXPECT_EQ(r.rows["checkpoint"].at("status"), "FAIL") << value;
  EXPECT_NE(value.find("checkpoint.folder: '" + (dir / "a_file" / "ck").string() + "' cannot be written ('" +
                       (dir / "a_file").string() + "' is not a folder)"),
            std::string::npos)
      << value;
  EXPECT_EQ(value.find("job.dump_folder"), std::string::npos) << value;  // that one can be created
  EXPECT_FALSE(fs::exists(dir / "dump"));                                // probed, not created
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3)
      << "a_file, job.toml, check.json";
}

// The resume row checks the data the checkpoint's position counts as titan train does: a dataset that
// only grew passes, saying what grew; one cut short fails with train's own words.
TEST(Check, TheResumeRowChecksTheDataAsTitanTrainDoes) {
  const fs::path dir = tt::temp_dir("check_resume_data_" + std::to_string(getpid()));
  const fs::path data = dir / "docs.jsonl", toml = dir / "job.toml";
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i)
      f << nlohmann::json{{"text", "Document " + std::to_string(i) + " of the set."}}.dump() << "\n";
  }
  std::ofstream(toml)
      << "[training]\nseq_len = 64\nlocal_batch_size = 2\nsteps = 1\ndataset_path = \"" << data.string()
      << "\"\n[lr_scheduler]\nwarmup_steps = 1\n[validation]\nenable = false\n"
         "[checkpoint]\nenable = true\nlast_save_in_hf = false\n"
         "[model]\nn_layers = 1\ndim = 64\nn_heads = 2\nn_kv_heads = 1\nhead_dim = 32\nhidden_dim = 128\n"
         "[job]\ndump_folder = \""
      << (dir / "dump").string() << "\"\n";
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " train --config " + toml.string() + " 2>&1", &out),
            0)
      << out;
  const uintmax_t before = fs::file_size(data);
  std::ofstream(data, std::ios::app) << nlohmann::json{{"text", "One more."}}.dump() << "\n";
  CheckRun grown = titan_check("--config " + toml.string() + " --training.steps=2", dir / "grown.json");
  ASSERT_TRUE(grown.rows.count("resume")) << grown.out;
  EXPECT_EQ(grown.rows["resume"].at("status"), "PASS") << grown.rows["resume"];
  EXPECT_NE(grown.rows["resume"].at("value").get<std::string>().find(
                "same sequence length, the same data, grown: '" + data.string() + "' from " +
                std::to_string(before)),
            std::string::npos)
      << grown.rows["resume"];
  fs::resize_file(data, before / 2);
  CheckRun cut = titan_check("--config " + toml.string() + " --training.steps=2", dir / "cut.json");
  ASSERT_TRUE(cut.rows.count("resume")) << cut.out;
  EXPECT_EQ(cut.rows["resume"].at("status"), "FAIL") << cut.rows["resume"];
  EXPECT_NE(
      cut.rows["resume"].at("value").get<std::string>().find("was trained on a different dataset: file 0"),
      std::string::npos)
      << cut.rows["resume"];
}

// A checkpoint in the job's own folder is what `titan train` resumes: the resume row fails a job
// whose model differs from the one it was trained as (titan train would refuse it at once) and
// passes the job it was trained by.
TEST(Check, TheResumeRowFailsAJobWhoseCheckpointWasTrainedAsAnotherModel) {
  const fs::path dir = tt::temp_dir("check_resume_" + std::to_string(getpid()));
  const fs::path toml = dir / "job.toml";
  std::ofstream(toml) << "[training]\nseq_len = 64\nlocal_batch_size = 2\nsteps = 1\n"
                         "[lr_scheduler]\nwarmup_steps = 1\n[validation]\nenable = false\n"
                         "[checkpoint]\nenable = true\nlast_save_in_hf = false\n";
  const std::string model =
      " --model.n_layers=1 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=32 "
      "--model.hidden_dim=128 --job.dump_folder=" +
      (dir / "dump").string();
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " train --config " + toml.string() + model +
                                " --model.dim=64 2>&1",
                            &out),
            0)
      << out;
  CheckRun other = titan_check("--config " + toml.string() + model + " --model.dim=32", dir / "other.json");
  EXPECT_EQ(other.rc, 1) << other.out;
  ASSERT_TRUE(other.rows.count("resume")) << other.out;
  EXPECT_EQ(other.rows["resume"].at("status"), "FAIL");
  EXPECT_NE(other.rows["resume"].at("value").get<std::string>().find(
                "was trained with model.dim = 64 but this run's model has model.dim = 32"),
            std::string::npos)
      << other.rows["resume"];
  CheckRun same = titan_check("--config " + toml.string() + model + " --model.dim=64", dir / "same.json");
  ASSERT_TRUE(same.rows.count("resume")) << same.out;
  EXPECT_EQ(same.rows["resume"].at("status"), "PASS") << same.rows["resume"];
  EXPECT_NE(same.rows["resume"].at("value").get<std::string>().find("step-1"), std::string::npos)
      << same.rows["resume"];
  // The job loads no Hugging Face folder: the model rows, and the loaded/random row (which said "the job
  // starts from a random init" beside them), say it resumes its own checkpoint.
  const fs::path step = dir / "dump" / "checkpoint" / "step-1";
  for (const char* row : {"model", "export", "loaded/random"}) {
    EXPECT_EQ(same.rows[row].at("status"), "SKIP") << same.rows[row];
    EXPECT_NE(same.rows[row].at("value").get<std::string>().find("the job resumes from its own checkpoint " +
                                                                 step.string()),
              std::string::npos)
        << same.rows[row];
  }
  // A file cut short fails the row as it fails titan train, with train's own words.
  const fs::path model_file = step / "model-rank0.safetensors";
  const uintmax_t bytes = fs::file_size(model_file);
  fs::resize_file(model_file, bytes - 1);
  CheckRun cut = titan_check("--config " + toml.string() + model + " --model.dim=64", dir / "cut.json");
  ASSERT_TRUE(cut.rows.count("resume")) << cut.out;
  EXPECT_EQ(cut.rows["resume"].at("status"), "FAIL");
  EXPECT_NE(cut.rows["resume"].at("value").get<std::string>().find(
                "has " + std::to_string(bytes - 1) + " bytes, manifest.json says " + std::to_string(bytes)),
            std::string::npos)
      << cut.rows["resume"];
  fs::resize_file(model_file, bytes);
  // titan train's own refusal: checkpointing off over committed checkpoints.
  CheckRun off = titan_check(
      "--config " + toml.string() + model + " --model.dim=64 --checkpoint.enable=false", dir / "off.json");
  ASSERT_TRUE(off.rows.count("resume")) << off.out;
  EXPECT_EQ(off.rows["resume"].at("status"), "FAIL");
  EXPECT_NE(off.rows["resume"].at("value").get<std::string>().find("checkpoint.enable = false, but"),
            std::string::npos)
      << off.rows["resume"];
}

// A job's one-off checkpoint modes are not what the pilot's runs test: with
// checkpoint.create_seed_checkpoint, checkpoint.exclude_from_loading and checkpoint.load_step set, the timing
// and checkpoint rows still train, save and resume (a seed run would train nothing), and the resume row reads
// the job's seed as a weights-only start.
TEST(Check, TheTrainingRowsTrainWhateverTheJobsCheckpointModes) {
  const fs::path dir = tt::temp_dir("check_modes_" + std::to_string(getpid()));
  const fs::path toml = dir / "job.toml";
  std::ofstream(toml) << "[training]\nseq_len = 64\nlocal_batch_size = 2\nsteps = 1\n"
                         "[lr_scheduler]\nwarmup_steps = 1\n[validation]\nenable = false\n"
                         "[checkpoint]\nenable = true\nlast_save_in_hf = false\n"
                         "exclude_from_loading = [\"optimizer\"]\n";
  const std::string model =
      " --model.n_layers=1 --model.dim=64 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=32 "
      "--model.hidden_dim=128 --job.dump_folder=" +
      (dir / "dump").string();
  std::string out;
  ASSERT_EQ(tt::run_command(tt::titan_binary().string() + " train --config " + toml.string() + model +
                                " --checkpoint.create_seed_checkpoint=true 2>&1",
                            &out),
            0)
      << out;
  // checkpoint.load_step, a roll-back of the job's own folder, is no mode of the pilot's runs either.
  CheckRun r = titan_check("--config " + toml.string() + model +
                               " --checkpoint.create_seed_checkpoint=true --checkpoint.load_step=0",
                           dir / "check.json");
  for (const char* row : {"timing", "checkpoint"}) {
    ASSERT_TRUE(r.rows.count(row)) << r.out;
    EXPECT_EQ(r.rows[row].at("status"), "PASS") << row << ": " << r.rows[row];
  }
  ASSERT_TRUE(r.rows.count("resume")) << r.out;
  EXPECT_EQ(r.rows["resume"].at("status"), "PASS") << r.rows["resume"];
  EXPECT_NE(r.rows["resume"].at("value").get<std::string>().find(
                "titan train starts from the seed checkpoint " + (dir / "dump" / "checkpoint" / "step-0").string()),
            std::string::npos)
      << r.rows["resume"];
}

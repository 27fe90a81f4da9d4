#include "titan/train/job_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/dist/communicator.h"
#include "titan/dist/meta_world.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config_reference.h"
#include "titan/train/metrics.h"
#include "titan/train/startup.h"
#include "titan/train/step_profile.h"
#include "titan/train/torchtitan_keys.h"

using namespace titan;
using namespace titan::train;

namespace {

using titan::testing::error_of;

using Overrides = std::vector<std::pair<std::string, std::string>>;

JobConfig parse(const std::string& toml, const Overrides& overrides = {}) {
  return parse_job_config(toml, "job.toml", overrides);
}

// The message of the titan::Error `fn` throws ("" when it does not throw).
std::string parse_error(const std::string& toml, const Overrides& overrides = {}) {
  return error_of([&] { parse(toml, overrides); });
}

std::string validate_error(const std::string& toml, int world_size = 1) {
  return error_of([&] { parse(toml).validate(world_size); });
}

// The start-up note of `key`, or "" when there is none.
std::string note_of(const JobConfig& c, const std::string& key) {
  for (auto& n : c.notes)
    if (n.rfind(key + " = ", 0) == 0) return n;
  return "";
}

const char* kEverySection = R"(
[job]
dump_folder = "/tmp/run"
description = "every section"

[model]
name = "hf"
flavor = "0.6B"
hf_assets_path = "/models/qwen3"
init = "torchtitan"
n_layers = 4
num_experts = 8
top_k = 2
moe_hidden_dim = 64
norm_eps = 1e-5
tie_embeddings = false
mlp_only_layers = [0, 2]

[training]
dataset = "nlp-corpus"
dataset_path = "/data/train.jsonl"
text_field = "content"
local_batch_size = 4
global_batch_size = 16
seq_len = 256
steps = 123
max_norm = 0.5
mixed_precision_param = "float32"
seed = 7
deterministic = true
load_balance = "expert_bias"
load_balance_coeff = 0.002

[optimizer]
name = "AdamW"
lr = 3e-4
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
weight_decay = 0

[lr_scheduler]
warmup_steps = 10
decay_ratio = 0.25
decay_type = "cosine"
min_lr_factor = 0.1

[checkpoint]
enable = true
folder = "ckpt"
interval = 50
keep_latest_k = 0
initial_load_path = "/models/qwen3"
initial_load_in_hf = true
last_save_in_hf = true
export_dtype = "bfloat16"

[activation_checkpoint]
mode = "selective"

[metrics]
log_freq = 10
enable_tensorboard = true
peak_tflops = 12.5

[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
tensor_parallel_degree = 1
expert_parallel_degree = 2

[kernels]
rope = { impl = "gather_free", modules = "layers.*" }
linear = [{ impl = "reference", modules = "output" }, { impl = "blocked" }]
)";

TEST(JobConfig, ParsesEverySection) {
  JobConfig c = parse(kEverySection);
  EXPECT_EQ(c.job.dump_folder, "/tmp/run");
  EXPECT_EQ(c.job.description, "every section");
  EXPECT_EQ(c.model.name, "hf");
  EXPECT_EQ(c.model.flavor, "0.6B");
  EXPECT_EQ(c.model.hf_assets_path, "/models/qwen3");
  EXPECT_EQ(c.model.init, "torchtitan");
  EXPECT_EQ(c.model.overrides.at("n_layers"), "4");
  EXPECT_EQ(c.model.overrides.at("num_experts"), "8");
  EXPECT_EQ(c.model.overrides.at("top_k"), "2");
  EXPECT_EQ(c.model.overrides.at("moe_hidden_dim"), "64");
  EXPECT_EQ(std::stod(c.model.overrides.at("norm_eps")), 1e-5);
  EXPECT_EQ(c.model.overrides.at("tie_embeddings"), "false");
  EXPECT_EQ(c.model.overrides.at("mlp_only_layers"), "[0,2]");
  EXPECT_EQ(c.training.dataset, "nlp-corpus");
  EXPECT_EQ(c.training.dataset_path, "/data/train.jsonl");
  EXPECT_EQ(c.training.text_field, "content");
  EXPECT_EQ(c.training.local_batch_size, 4);
  EXPECT_EQ(c.training.global_batch_size, 16);
  EXPECT_EQ(c.training.seq_len, 256);
  EXPECT_EQ(c.training.steps, 123);
  EXPECT_EQ(c.training.max_norm, 0.5);
  EXPECT_EQ(c.training.mixed_precision_param, "float32");
  EXPECT_EQ(c.training.seed, 7);
  EXPECT_TRUE(c.training.deterministic);
  EXPECT_EQ(c.training.load_balance, "expert_bias");
  EXPECT_EQ(c.training.load_balance_coeff, 0.002);
  EXPECT_EQ(c.optimizer.name, "AdamW");
  EXPECT_EQ(c.optimizer.lr, 3e-4);  // exact: floats travel without losing bits
  EXPECT_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);  // an integer where a float is expected is fine
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 10);
  EXPECT_EQ(c.lr_scheduler.decay_ratio, 0.25);
  EXPECT_EQ(c.lr_scheduler.decay_type, "cosine");
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.1);
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_EQ(c.checkpoint.folder, "ckpt");
  EXPECT_EQ(c.checkpoint.interval, 50);
  EXPECT_EQ(c.checkpoint.keep_latest_k, 0);
  EXPECT_EQ(c.checkpoint.initial_load_path, "/models/qwen3");
  EXPECT_TRUE(c.checkpoint.initial_load_in_hf);
  EXPECT_TRUE(c.checkpoint.last_save_in_hf);
  EXPECT_EQ(c.checkpoint.export_dtype, "bfloat16");
  EXPECT_EQ(c.activation_checkpoint.mode, "selective");
  EXPECT_EQ(c.metrics.log_freq, 10);
  EXPECT_TRUE(c.metrics.enable_tensorboard);
  EXPECT_EQ(c.metrics.peak_tflops, 12.5);
  EXPECT_EQ(c.parallelism.data_parallel_replicate_degree, 2);
  EXPECT_EQ(c.parallelism.data_parallel_shard_degree, 4);
  EXPECT_EQ(c.parallelism.tensor_parallel_degree, 1);
  EXPECT_EQ(c.parallelism.expert_parallel_degree, 2);

  // Rules of one op keep their order (the last matching rule wins); different ops are independent.
  ASSERT_EQ(c.kernels.size(), 3u);
  std::vector<kernels::Substitution> rope, linear;
  for (auto& k : c.kernels) (k.op == "rope" ? rope : linear).push_back(k);
  ASSERT_EQ(rope.size(), 1u);
  ASSERT_EQ(linear.size(), 2u);
  EXPECT_EQ(rope[0].variant, "gather_free");
  EXPECT_EQ(rope[0].modules, "layers.*");
  EXPECT_EQ(linear[0].variant, "reference");
  EXPECT_EQ(linear[0].modules, "output");
  EXPECT_EQ(linear[1].variant, "blocked");
  EXPECT_EQ(linear[1].modules, "*");  // no modules: every module

  // Expert parallelism borrows its ranks from the shard dimension: 3 does not divide 4.
  c.parallelism.expert_parallel_degree = 3;
  EXPECT_NE(error_of([&] { c.validate(8); }).find("parallelism.expert_parallel_degree = 3 must divide"),
            std::string::npos);
  c.parallelism.expert_parallel_degree = 2;  // as the file says: 2 of the 4 shard ranks
  // 2 x 4 ranks, 16 = 4 x 8 / 2 -> not a multiple of 4 x 8: validate names the key.
  EXPECT_NE(error_of([&] { c.validate(8); }).find("training.global_batch_size"), std::string::npos);
  c.training.global_batch_size = 64;  // 2 micro-batches of 4 on each of 8 ranks
  // It also sets a random-init scheme and a flavor that a job loading an HF folder does not use: noted.
  EXPECT_NE(note_of(c, "model.init"), "");
  EXPECT_NE(note_of(c, "model.flavor"), "");
  EXPECT_NO_THROW(c.validate(8));
}

TEST(JobConfig, EmptyFileGivesDocumentedDefaults) {
  JobConfig c = parse("");
  JobConfig d;  // the struct's initialisers are the documented defaults
  EXPECT_EQ(c.describe(), d.describe());
  EXPECT_EQ(c.model.name, "qwen3");
  EXPECT_EQ(c.training.global_batch_size, -1);
  EXPECT_EQ(c.checkpoint.keep_latest_k, 3);
  EXPECT_TRUE(c.kernels.empty());
  EXPECT_NO_THROW(c.validate(1));
}

// A float model field takes a TOML float written with or without a fraction; an integer field
// refuses one (the error case is in the table of bad values).
TEST(JobConfig, AFloatModelFieldTakesATomlFloat) {
  const JobConfig c = parse("[model]\nrope_theta = 1000000.0\nnorm_eps = 1e-6\n");
  qwen3::ModelArgs a;
  for (const auto& [key, value] : c.model.overrides) qwen3::apply_override(a, key, value);
  EXPECT_EQ(a.rope_theta, 1000000.0);
  EXPECT_EQ(a.norm_eps, 1e-6);
}

TEST(JobConfig, CommandLineOverridesWinOverTheFile) {
  JobConfig c =
      parse("[training]\nsteps = 40\nseq_len = 512\n[model]\nn_layers = 8\n[optimizer]\nlr = 1e-3\n",
            {{"training.steps", "6"},
             {"model.n_layers", "2"},
             {"optimizer.lr", "2.5e-4"},
             {"checkpoint.enable", "true"},
             {"activation_checkpoint.mode", "full"},
             {"model.num_experts", "4"}});
  EXPECT_EQ(c.training.steps, 6);
  EXPECT_EQ(c.training.seq_len, 512);  // untouched by the overrides
  EXPECT_EQ(c.model.overrides.at("n_layers"), "2");
  EXPECT_EQ(c.model.overrides.at("num_experts"), "4");
  EXPECT_EQ(c.optimizer.lr, 2.5e-4);
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_EQ(c.activation_checkpoint.mode, "full");
  // The later of two overrides wins.
  EXPECT_EQ(parse("", {{"training.steps", "3"}, {"training.steps", "4"}}).training.steps, 4);
}

TEST(JobConfig, DescribeListsTheConfigInEffectExactly) {
  JobConfig c = parse(
      "[optimizer]\nlr = 3.0000000000000004e-4\n[model]\nn_layers = 3\n"
      "[kernels]\nrope = { impl = \"gather_free\" }\n");
  std::string d = c.describe();
  // Floats are printed so that they read back as the same double.
  auto at = d.find("optimizer.lr = ");
  ASSERT_NE(at, std::string::npos) << d;
  EXPECT_EQ(std::stod(d.substr(at + 15, d.find('\n', at) - at - 15)), 3.0000000000000004e-4) << d;
  EXPECT_NE(d.find("training.steps = 10"), std::string::npos) << d;
  EXPECT_NE(d.find("model.n_layers = 3"), std::string::npos) << d;
  EXPECT_NE(d.find("kernels.rope = { impl = \"gather_free\", modules = \"*\" }"), std::string::npos) << d;
}

TEST(JobConfig, UnknownKeysAreErrorsThatSuggestTheNearMiss) {
  std::string e = parse_error("", {{"training.stpes", "5"}});
  EXPECT_NE(e.find("training.stpes"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training.steps'"), std::string::npos) << e;
  EXPECT_NE(e.find("command line"), std::string::npos) << e;

  e = parse_error("[training]\nsteps = 5\nlocal_bach_size = 2\n");
  EXPECT_NE(e.find("job.toml:3"), std::string::npos) << e;  // file and line
  EXPECT_NE(e.find("training.local_bach_size"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training.local_batch_size'"), std::string::npos) << e;

  e = parse_error("[trainig]\nsteps = 5\n");
  EXPECT_NE(e.find("unknown section [trainig]"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training'"), std::string::npos) << e;
  // A short name two edits from a section is no near miss ([foo] is not [job]); a swap of two
  // neighbours is one edit ([trainnig]).
  e = parse_error("[foo]\nbar = 1\n");
  EXPECT_NE(e.find("unknown section [foo]"), std::string::npos) << e;
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;
  e = parse_error("[trainnig]\nsteps = 5\n");
  EXPECT_NE(e.find("did you mean 'training'"), std::string::npos) << e;
  e = parse_error("", {{"checkpoint.enable_checkpiont", "true"}});
  EXPECT_NE(e.find("did you mean 'checkpoint.enable_checkpoint'"), std::string::npos) << e;

  // torchtitan's keys are candidates too: a mistyped one is meant as torchtitan's, not as the nearest
  // of titan's own (pipeline_parallel_degre was taken for expert_parallel_degree).
  e = parse_error("", {{"parallelism.pipeline_parallel_degre", "1"}});
  EXPECT_NE(e.find("did you mean 'parallelism.pipeline_parallel_degree'"), std::string::npos) << e;
  e = parse_error("", {{"compile.enabel", "true"}});
  EXPECT_NE(e.find("did you mean 'compile.enable'"), std::string::npos) << e;

  e = parse_error("", {{"model.n_layer", "2"}});  // model fields are keys too
  EXPECT_NE(e.find("did you mean 'model.n_layers'"), std::string::npos) << e;

  e = parse_error("steps = 5\n[training]\nseq_len = 64\n");  // above every section header
  EXPECT_NE(e.find("'steps' is outside any section"), std::string::npos) << e;
  EXPECT_NE(e.find("training.steps"), std::string::npos) << e;

  e = parse_error("[kernels]\nrope = { imp = \"gather_free\" }\n");
  EXPECT_NE(e.find("kernels.rope"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'impl'"), std::string::npos) << e;

  e = parse_error("", {{"kernels.rope", "gather_free"}});
  EXPECT_NE(e.find("[kernels]"), std::string::npos) << e;

  // Nothing close: no suggestion rather than a wild guess.
  e = parse_error("", {{"training.zzzzzzzzzzzzzzzzzz", "1"}});
  EXPECT_NE(e.find("training.zzzzzzzzzzzzzzzzzz"), std::string::npos) << e;
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;
}

TEST(JobConfig, InvalidValuesNameTheKey) {
  struct Case {
    std::string toml;
    Overrides overrides;
    std::vector<std::string> expect;  // substrings of the error
  };
  const std::vector<Case> cases = {
      {"[lr_scheduler]\ndecay_type = \"cosin\"\n",
       {},
       {"lr_scheduler.decay_type", "cosine", "did you mean 'cosine'"}},
      {"", {{"lr_scheduler.decay_type", "cosin"}}, {"lr_scheduler.decay_type", "did you mean 'cosine'"}},
      {"[training]\nsteps = \"ten\"\n", {}, {"training.steps", "expects an integer", "string"}},
      {"[training]\nsteps = \"10\"\n", {}, {"training.steps", "expects an integer"}},  // no silent conversion
      {"[training]\nsteps = 2.5\n", {}, {"training.steps", "expects an integer", "float"}},
      {"", {{"training.steps", "10x"}}, {"training.steps", "expects an integer", "10x"}},
      {"[training]\ndeterministic = 1\n", {}, {"training.deterministic", "true or false"}},
      {"", {{"training.deterministic", "yes"}}, {"training.deterministic", "true or false"}},
      {"[optimizer]\nlr = \"fast\"\n", {}, {"optimizer.lr", "expects a number"}},
      {"", {{"optimizer.lr", "1e-3e"}}, {"optimizer.lr", "a number"}},
      {"[job]\ndump_folder = 5\n", {}, {"job.dump_folder", "expects a string", "integer"}},
      {"[checkpoint]\nexport_dtype = \"fp16\"\n", {}, {"checkpoint.export_dtype", "float32, bfloat16"}},
      {"", {{"checkpoint.async_mode", "background"}}, {"checkpoint.async_mode", "disabled, async"}},
      {"", {{"checkpoint.interval_type", "second"}}, {"checkpoint.interval_type", "did you mean 'seconds'"}},
      {"[activation_checkpoint]\nmode = \"ful\"\n",
       {},
       {"activation_checkpoint.mode", "did you mean 'full'"}},
      {"[model]\nname = \"qwen2\"\n", {}, {"model.name", "did you mean 'qwen3'"}},
      {"[model]\nn_layers = \"two\"\n", {}, {"model.n_layers"}},
      {"[model]\nn_layers = 2.0\n",
       {},
       {"model.n_layers", "expected an integer, got '2.0'"}},  // as steps = 2.5
      {"", {{"model.n_layers", "two"}}, {"model.n_layers", "two"}},
      {"", {{"model.tie_embeddings", "maybe"}}, {"model.tie_embeddings"}},
      {"[model]\nmlp_only_layers = [\"a\"]\n", {}, {"model.mlp_only_layers"}},
      {"[training\nsteps = 1\n", {}, {"job.toml:1", "invalid TOML"}},
      {"[kernels]\nrope = \"gather_free\"\n", {}, {"kernels.rope", "must be a table"}},
      {"[kernels]\nrope = { modules = \"layers.*\" }\n", {}, {"kernels.rope", "'impl'"}},
      {"[kernels]\nrope = { impl = 3 }\n", {}, {"job.toml", "kernels.rope.impl must be a string"}},
      {"[kernels]\nrope = { impl = \"\" }\n", {}, {"kernels.rope.impl is empty"}},
      {"[kernels]\nrope = { impl = \"gather_free\", modules = \"layers.[0-3.attention\" }\n",
       {},
       {"job.toml", "kernels.rope.modules = \"layers.[0-3.attention\"",
        "'[' at character 8 is never closed"}},
      {"[kernels]\nrope = { impl = \"gather_free\", modules = \"layers.[3-0].attention\" }\n",
       {},
       {"kernels.rope.modules", "the range '3-0' is reversed", "write '0-3'"}},
      {"[kernels]\nrope = { impl = \"gather_free\", modules = \"layers.[].attention\" }\n",
       {},
       {"kernels.rope.modules", "'[]' is an empty set"}},
  };
  for (const auto& c : cases) {
    std::string e = parse_error(c.toml, c.overrides);
    ASSERT_FALSE(e.empty()) << "no error for:\n" << c.toml;
    for (const auto& s : c.expect) EXPECT_NE(e.find(s), std::string::npos) << "'" << s << "' not in: " << e;
  }
}

// float16 is taken only so that torchtitan's configs parse (an export refuses it), so a mistyped value is
// not told that it is one of the dtypes to choose.
TEST(JobConfig, ExportDtypeErrorsOfferOnlyWhatAnExportWrites) {
  for (const std::string toml :
       {"[checkpoint]\nexport_dtype = \"fp16\"\n", "[checkpoint]\nexport_dtype = \"bf16\"\n"}) {
    const std::string e = parse_error(toml);
    EXPECT_NE(
        e.find("checkpoint.export_dtype must be one of float32, bfloat16 (float16, one of torchtitan's, is "
               "accepted only with last_save_in_hf = false, where there is no export to write); got '"),
        std::string::npos)
        << e;
  }
  // One edit from float16, two from float32: the suggestion is a dtype an export writes.
  const std::string near = parse_error("", {{"checkpoint.export_dtype", "float1"}});
  EXPECT_NE(near.find("got 'float1'; did you mean 'float32'?"), std::string::npos) << near;
  // float16 itself still parses, and is refused only where there is an export (ValidateNamesTheKeyItRejects).
  const JobConfig c = parse("[checkpoint]\nexport_dtype = \"float16\"\nlast_save_in_hf = false\n");
  EXPECT_EQ(c.checkpoint.export_dtype, "float16");
  EXPECT_EQ(error_of([&] { c.validate(1); }), "");
}

TEST(JobConfig, LoadJobConfigReadsTheShippedConfigs) {
  for (const char* name :
       {"debugmodel", "debugmodel_moe", "qwen3_0.6b", "qwen3_4b_finetune", "qwen3_30b_a3b_reduced"}) {
    auto path = titan::testing::source_dir() / "configs" / (std::string(name) + ".toml");
    JobConfig c = load_job_config(path.string(), {});
    EXPECT_NO_THROW(c.validate(1)) << path;
  }
  JobConfig d = load_job_config((titan::testing::source_dir() / "configs" / "debugmodel.toml").string(),
                                {{"training.steps", "6"}});
  EXPECT_EQ(d.training.steps, 6);
  EXPECT_EQ(d.model.flavor, "debugmodel");
  std::string e = error_of([] { load_job_config("/nonexistent/job.toml", {}); });
  EXPECT_NE(e.find("/nonexistent/job.toml"), std::string::npos) << e;
}

TEST(JobConfig, ValidateNamesTheKeyItRejects) {
  struct Case {
    std::string toml;
    int world_size;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"[training]\nlocal_batch_size = 4\nglobal_batch_size = 6\n",
       1,
       {"training.global_batch_size", "multiple"}},
      {"[training]\nlocal_batch_size = 2\nglobal_batch_size = 4\n",
       4,
       {"training.global_batch_size", "(2 x 4 = 8): training.local_batch_size = 1 takes it"}},
      {"[checkpoint]\nkeep_latest_k = 1\n", 1, {"checkpoint.keep_latest_k", "got 1"}},
      {"[parallelism]\ndata_parallel_shard_degree = 3\n", 4, {"parallelism", "world size 4"}},
      {"[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n",
       4,
       {"parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree", "= 8",
        "world size 4"}},
      {"[parallelism]\ndata_parallel_replicate_degree = 3\n",
       4,
       {"parallelism.data_parallel_replicate_degree", "world size 4"}},
      // Tensor parallelism does not run: its degree is refused by key, never ignored.
      {"[parallelism]\ndata_parallel_shard_degree = 2\ntensor_parallel_degree = 2\n",
       4,
       {"parallelism.tensor_parallel_degree", "not implemented"}},
      {"[parallelism]\nexpert_parallel_degree = 2\n",
       1,
       {"parallelism.expert_parallel_degree = 2 must divide parallelism.data_parallel_shard_degree (1 "
        "here)"}},
      {"[parallelism]\ntensor_parallel_degree = 0\n", 1, {"parallelism.tensor_parallel_degree"}},
      {"[parallelism]\ndata_parallel_shard_degree = 0\n",
       2,
       {"parallelism.data_parallel_shard_degree must be positive, or -1 (the ranks left), got 0"}},
      {"[training]\nlocal_batch_size = 0\n", 1, {"training.local_batch_size"}},
      {"[training]\nseq_len = -1\n", 1, {"training.seq_len"}},
      {"[training]\nmax_norm = 0\n", 1, {"training.max_norm"}},
      {"[optimizer]\nlr = 0\n", 1, {"optimizer.lr"}},
      {"[optimizer]\nlr = inf\n", 1, {"optimizer.lr must be finite"}},
      {"[training]\nmax_norm = inf\n", 1, {"training.max_norm must be finite"}},
      {"[optimizer]\nbeta2 = 1.0\n", 1, {"optimizer.beta2"}},
      {"[optimizer]\neps = inf\n", 1, {"optimizer.eps must be finite and positive, got inf"}},
      {"[optimizer]\nweight_decay = inf\n", 1, {"optimizer.weight_decay must be finite and >= 0, got inf"}},
      {"[lr_scheduler]\ndecay_ratio = 1.5\n", 1, {"lr_scheduler.decay_ratio"}},
      {"[lr_scheduler]\nmin_lr_factor = 2\n", 1, {"lr_scheduler.min_lr_factor"}},
      {"[metrics]\nlog_freq = 0\n", 1, {"metrics.log_freq"}},
      {"[checkpoint]\ninterval = 0\n", 1, {"checkpoint.interval"}},
      {"[model]\nname = \"hf\"\n", 1, {"model.hf_assets_path"}},
      {"[checkpoint]\ninitial_load_in_hf = true\n", 1, {"checkpoint.initial_load_path"}},
      // Warm-up within the schedule, checked with the config (the values given, not the schedule's).
      {"[training]\nsteps = 3\n[lr_scheduler]\nwarmup_steps = 5\n",
       1,
       {"lr_scheduler.warmup_steps (5) must not exceed training.steps (3)"}},
      {"[training]\nsteps = 3\n[lr_scheduler]\nwarmup_steps = 5\ntotal_steps = 4\n",
       1,
       {"lr_scheduler.warmup_steps (5) must not exceed lr_scheduler.total_steps (4)"}},
      {"[training]\nload_balance_coeff = -1\n", 1, {"training.load_balance_coeff must be >= 0"}},
      {"[metrics]\npeak_tflops = -1\n", 1, {"metrics.peak_tflops must be >= 0"}},
  };
  for (const auto& c : cases) {
    std::string e = validate_error(c.toml, c.world_size);
    ASSERT_FALSE(e.empty()) << "validate accepted:\n" << c.toml;
    for (const auto& s : c.expect) EXPECT_NE(e.find(s), std::string::npos) << "'" << s << "' not in: " << e;
  }
  // What is valid stays valid: degrees multiplying to the world size, shard -1 taking the rest.
  EXPECT_EQ(validate_error("[parallelism]\ndata_parallel_replicate_degree = 2\n", 4), "");
  EXPECT_EQ(validate_error("[parallelism]\ndata_parallel_shard_degree = 2\ndata_parallel_replicate_degree = 2\n", 4),
            "");
  EXPECT_EQ(validate_error("[training]\nlocal_batch_size = 2\nglobal_batch_size = 8\n", 2), "");
  EXPECT_EQ(validate_error("[checkpoint]\nkeep_latest_k = 0\n"), "");
  EXPECT_EQ(validate_error("[checkpoint]\nenable = true\nload_step = 30\n"), "");
  EXPECT_NE(validate_error("[checkpoint]\nload_step = 30\n").find("needs checkpoint.enable = true"),
            std::string::npos);
  EXPECT_EQ(validate_error("[checkpoint]\nenable = true\nload_step = 0\n"), "");  // the seed checkpoint
  EXPECT_NE(
      validate_error("[checkpoint]\nenable = true\nload_step = -2\n").find("checkpoint.load_step must be -1"),
      std::string::npos);
}

// ---- torchtitan's job files ----------------------------------------------------------------------

std::filesystem::path torchtitan_fixture(const std::string& name) {
  return titan::testing::fixtures_dir() / "configs" / name;
}

// Every key of a TOML file, dotted ("training.dataloader.num_workers").
void keys_of(const toml::table& t, const std::string& prefix, std::vector<std::string>& out) {
  for (auto& [k, v] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (auto sub = v.as_table()) keys_of(*sub, key, out);
    else out.push_back(key);
  }
}

// --config must name a regular file: a directory would read as an empty config and run the defaults,
// a FIFO would block forever.
TEST(JobConfig, TheConfigMustBeARegularFile) {
  const std::filesystem::path dir = titan::testing::temp_dir("job_config_not_a_file");
  const std::filesystem::path fifo = dir / "job.toml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [path, kind] : {std::pair{dir, "is a directory"}, std::pair{fifo, "is a FIFO"},
                                   std::pair{dir / "missing.toml", "does not exist"}}) {
    const std::string e = error_of([&] { load_job_config(path.string(), {}); });
    EXPECT_NE(e.find("job config: '" + path.string() + "' " + kind), std::string::npos) << e;
  }
}

// A rule between values names where each key it involves was set (file line or command line), so
// the user knows which line to edit; keys left at their defaults are said to be (the user may not
// know the default), after those.
TEST(JobConfig, ValidationErrorsNameWhereTheKeysWereSet) {
  std::string e =
      error_of([&] { parse("[training]\nsteps = 5\n\n[checkpoint]\nload_step = 3\n").validate(1); });
  EXPECT_NE(e.find("checkpoint.load_step = 3 resumes from a checkpoint: it needs checkpoint.enable = true "
                   "(checkpoint.load_step set at job.toml:5; checkpoint.enable left at the default)"),
            std::string::npos)
      << e;
  e = error_of([&] { parse("[training]\nsteps = 5\n", {{"lr_scheduler.total_steps", "3"}}).validate(1); });
  EXPECT_NE(e.find("(training.steps set at job.toml:2; lr_scheduler.total_steps set on the command line)"),
            std::string::npos)
      << e;
  e = error_of([&] { parse("", {{"training.local_batch_size", "0"}}).validate(1); });
  EXPECT_NE(e.find("training.local_batch_size must be positive, got 0 (training.local_batch_size set on the "
                   "command line)"),
            std::string::npos)
      << e;
  // training.steps is in the message but at its default: said so.
  e = error_of([&] { parse("[lr_scheduler]\ntotal_steps = 2\n").validate(1); });
  EXPECT_NE(e.find("(lr_scheduler.total_steps set at job.toml:2; training.steps left at the default)"),
            std::string::npos)
      << e;
  // A one-step run (a smoke test) under the default warmup of 2: the warmup is the one step, said.
  // Set on purpose, the same warmup is the job's, and the error says where it comes from.
  const JobConfig smoke = parse("", {{"training.steps", "1"}});
  EXPECT_EQ(error_of([&] { smoke.validate(1); }), "");
  EXPECT_EQ(smoke.lr_scheduler.warmup_steps, 1);
  ASSERT_EQ(smoke.notes.size(), 1u);
  EXPECT_EQ(
      smoke.notes[0],
      "lr_scheduler.warmup_steps = 1: titan's default of 2 steps is shortened to the 1 the schedule spans "
      "(training.steps); set lr_scheduler.warmup_steps to choose");
  EXPECT_NE(smoke.left_out_note(false).find(
                "lr_scheduler.warmup_steps = 2, shortened to 1 (above) (torchtitan's: 200)"),
            std::string::npos)
      << smoke.left_out_note(false);
  // Only a valid one-step schedule shortens it: an invalid total_steps is named as such.
  e = error_of([&] { parse("", {{"lr_scheduler.total_steps", "-5"}}).validate(1); });
  EXPECT_NE(e.find("lr_scheduler.total_steps (-5) must be -1 or at least training.steps"), std::string::npos)
      << e;
  e = error_of([&] { parse("", {{"training.steps", "1"}, {"lr_scheduler.warmup_steps", "2"}}).validate(1); });
  EXPECT_NE(
      e.find(
          "lr_scheduler.warmup_steps (2) must not exceed training.steps (1): torchtitan shortens the "
          "warmup with a warning; titan asks: lower lr_scheduler.warmup_steps, or set "
          "lr_scheduler.total_steps (the schedule's length, of which the run trains the first "
          "training.steps) to at least 2 (lr_scheduler.warmup_steps, training.steps set on the command line; "
          "lr_scheduler.total_steps left at the default)"),
      std::string::npos)
      << e;
  // titan train checks the values before it starts the communicator (MPI under a launcher), so a
  // comm.* value is named the same way.
  std::string out;
  EXPECT_EQ(titan::testing::run_command(
                titan::testing::titan_binary().string() + " train --config " +
                    (titan::testing::source_dir() / "configs" / "debugmodel.toml").string() +
                    " --comm.timeout_seconds=0",
                &out),
            1)
      << out;
  EXPECT_NE(
      out.find(
          "comm.timeout_seconds must be positive and at most 1e9 seconds, got 0 (comm.timeout_seconds set on "
          "the command line)"),
      std::string::npos)
      << out;
}

// A key the job's other settings leave without effect gets a start-up note naming why, whether the
// config file (a base file shared by jobs, a torchtitan job file) or the command line (a script's
// fixed overrides) set it.
TEST(JobConfig, KeysTheJobLeavesWithoutEffectAreNoted) {
  struct Case {
    Overrides context;  // the settings that leave the key without effect
    std::string key, value, why;
  };
  const Case cases[] = {
      {{{"checkpoint.initial_load_path", "/models/step-9"}},
       "model.init",
       "torchtitan",
       "the job starts from loaded weights (checkpoint.initial_load_path) and model.init only picks the "
       "random "
       "initialisation"},
      {{{"checkpoint.initial_load_in_hf", "true"}, {"model.hf_assets_path", "/m"}},
       "training.seed",
       "7",
       "the job starts from loaded weights (checkpoint.initial_load_in_hf) and the seed only draws a random "
       "initialisation"},
      {{{"model.name", "hf"}, {"model.hf_assets_path", "/m"}},
       "model.flavor",
       "0.6B",
       "model.name = \"hf\" takes the architecture from model.hf_assets_path's config.json"},
      {{},
       "training.load_balance_coeff",
       "0.5",
       "it is the expert-bias update step, and training.load_balance = \"aux_loss\" balances experts with "
       "the "
       "aux loss"},
      {{{"training.load_balance", "expert_bias"}},
       "model.router_aux_loss_coef",
       "5",
       "it weighs the aux loss, which training.load_balance = \"expert_bias\" does not add"},
      {{}, "checkpoint.interval", "5", "checkpoint.enable = false (no periodic saves)"},
      {{}, "checkpoint.enable_first_step_checkpoint", "true", "checkpoint.enable = false"},
      {{}, "checkpoint.restart_data_stream", "true", "checkpoint.enable = false (nothing is resumed)"},
      {{}, "validation.dataset_path", "/data/val.jsonl", "validation.enable = false"},
      {{{"training.dataset_path", "/data/train.jsonl"}},
       "training.dataset",
       "c4",
       "training.dataset_path is read"},
      {{{"validation.enable", "true"}, {"validation.dataset_path", "/data/val.jsonl"}},
       "validation.dataset",
       "c4_validation",
       "validation.dataset_path is read"},
      {{}, "validation.seq_len", "256", "validation.enable = false"},
      {{}, "profiling.profile_freq", "5", "profiling.enable_profiling = false"},
      {{{"activation_checkpoint.mode", "full"}},
       "activation_checkpoint.selective_ac_option",
       "2",
       "activation_checkpoint.mode = \"full\" (it picks the layers of \"selective\")"},
      {{},
       "training.pack_window",
       "64",
       "it is the best-fit window, and training.pack_strategy = \"next_fit\""},
      {{}, "training.pack_strategy", "next_fit", "training.pack_conversations = false (nothing is packed)"},
      {{},
       "checkpoint.async_mode",
       "async",
       "checkpoint.enable = false (the one save, at a stop by signal, is complete before the run ends)"},
      {{{"checkpoint.enable", "true"}, {"checkpoint.load_only", "true"}},
       "checkpoint.async_mode",
       "async",
       "checkpoint.load_only = true (no saves)"},
      {{}, "checkpoint.interval_type", "seconds", "checkpoint.enable = false (no periodic saves)"},
  };
  for (const Case& c : cases) {
    Overrides typed = c.context;
    typed.emplace_back(c.key, c.value);
    EXPECT_EQ(note_of(parse("", typed), c.key), c.key + " = " + c.value + ": no effect, " + c.why) << c.key;
    // The same key in the config file.
    const auto dot = c.key.find('.');
    const bool text = c.value == "torchtitan" || c.value == "0.6B" || c.value == "next_fit" ||
                      c.value == "async" || c.value == "seconds" || c.key == "validation.dataset_path" ||
                      c.key == "activation_checkpoint.selective_ac_option" || c.key == "training.dataset" ||
                      c.key == "validation.dataset";
    const std::string in_file = "[" + c.key.substr(0, dot) + "]\n" + c.key.substr(dot + 1) + " = " +
                                (text ? "\"" + c.value + "\"" : c.value) + "\n";
    JobConfig noted;
    EXPECT_NO_THROW(noted = parse(in_file, c.context)) << c.key;
    EXPECT_EQ(note_of(noted, c.key), c.key + " = " + c.value + ": no effect, " + c.why) << c.key;
  }
  // Where they take effect: no note.
  EXPECT_EQ(note_of(parse("[model]\ninit = \"torchtitan\"\n"), "model.init"), "");
  EXPECT_EQ(note_of(parse("[training]\nload_balance = \"expert_bias\"\nload_balance_coeff = 0.01\n"),
                    "training.load_balance_coeff"),
            "");
  EXPECT_EQ(note_of(parse("[checkpoint]\nenable = true\ninterval = 5\n"), "checkpoint.interval"), "");
  EXPECT_EQ(note_of(parse("[checkpoint]\nenable = true\nasync_mode = \"async\"\n"), "checkpoint.async_mode"),
            "");
  // torchtitan's pinned variant: titan's copy of a GPU job's state crosses pinned staging buffers anyway.
  const JobConfig pinned = parse("[checkpoint]\nenable = true\nasync_mode = \"async_with_pinned_mem\"\n");
  EXPECT_TRUE(pinned.checkpoint.async());
  EXPECT_NE(note_of(pinned, "checkpoint.async_mode").find("async_with_pinned_mem applied as \"async\""),
            std::string::npos)
      << note_of(pinned, "checkpoint.async_mode");
  EXPECT_EQ(note_of(parse("[training]\ndataset = \"nlp-corpus\"\n"), "training.dataset"), "");
  const std::string best_fit =
      "[model]\nattn_mask_type = \"block_causal\"\n[training]\nchat_field = \"messages\"\n"
      "pack_conversations = true\npack_strategy = \"best_fit\"\npack_window = 64\n";
  EXPECT_EQ(note_of(parse(best_fit), "training.pack_window"), "");
  EXPECT_EQ(note_of(parse(best_fit), "training.pack_strategy"), "");
  // Profiling asked for, but its first profiled step lies past the run's last.
  EXPECT_EQ(
      note_of(parse("[training]\nsteps = 2\n[profiling]\nenable_profiling = true\nprofile_freq = 100\n"),
              "profiling.profile_freq"),
      "profiling.profile_freq = 100: no step is profiled, the first profiled step comes after training.steps "
      "= 2");
  EXPECT_EQ(
      note_of(parse("[training]\nsteps = 200\n[profiling]\nenable_profiling = true\nprofile_freq = 100\n"),
              "profiling.profile_freq"),
      "");
  // An export asked for with checkpointing off is written (torchtitan would save nothing): said.
  EXPECT_EQ(note_of(parse("[checkpoint]\nenable = false\nlast_save_in_hf = true\n"), "checkpoint.last_save_in_hf"),
            "checkpoint.last_save_in_hf = true: the Hugging Face export is written at the end although "
            "checkpoint.enable = false (torchtitan would save nothing; set it to false for no export)");
  EXPECT_EQ(note_of(parse("[checkpoint]\nenable = true\nlast_save_in_hf = true\n"), "checkpoint.last_save_in_hf"),
            "");
}

// checkpoint.load_step in the file rolls back at every start of the job: a note says so; given on
// the command line (one roll-back), none.
TEST(JobConfig, ExcludeFromLoadingTakesTorchtitansPartsInEitherSpelling) {
  // A TOML array, or torchtitan's comma-separated command line; each part once, in the order given.
  EXPECT_EQ(parse("[checkpoint]\nexclude_from_loading = [\"optimizer\", \"lr_scheduler\", \"optimizer\"]\n")
                .checkpoint.exclude_from_loading,
            (std::vector<std::string>{"optimizer", "lr_scheduler"}));
  const JobConfig c = parse("[checkpoint]\nexclude_from_loading = [\"optimizer\"]\nenable = true\n",
                            {{"checkpoint.exclude_from_loading", " lr_scheduler , dataloader"}});
  EXPECT_EQ(c.checkpoint.exclude_from_loading, (std::vector<std::string>{"lr_scheduler", "dataloader"}));
  EXPECT_TRUE(c.checkpoint.excludes("dataloader"));
  EXPECT_FALSE(c.checkpoint.excludes("optimizer"));
  // "dataloader" is titan's restart_data_stream, said at start-up.
  EXPECT_TRUE(c.checkpoint.restart_data_stream);
  EXPECT_NE(
      note_of(c, "checkpoint.exclude_from_loading").find("applied as checkpoint.restart_data_stream = true"),
      std::string::npos);
  EXPECT_NE(c.describe().find("checkpoint.exclude_from_loading = [\"lr_scheduler\",\"dataloader\"]"),
            std::string::npos)
      << c.describe();
  EXPECT_TRUE(parse("[checkpoint]\nexclude_from_loading = []\n").checkpoint.exclude_from_loading.empty());
  EXPECT_TRUE(parse("", {{"checkpoint.exclude_from_loading", ""}}).checkpoint.exclude_from_loading.empty());

  // Without checkpointing nothing is resumed: a note, and the data flag stays as set.
  const JobConfig off = parse("[checkpoint]\nexclude_from_loading = [\"dataloader\"]\n");
  EXPECT_FALSE(off.checkpoint.restart_data_stream);
  EXPECT_EQ(
      note_of(off, "checkpoint.exclude_from_loading"),
      "checkpoint.exclude_from_loading = [dataloader]: no effect, checkpoint.enable = false (nothing is "
      "resumed)");

  // A fork (initial_load_model_only = false) goes on from a whole training state with checkpointing
  // off too: the parts it leaves fresh apply, and the weights it loads are noted (torchtitan would
  // load nothing).
  const JobConfig fork = parse(
      "[checkpoint]\nexclude_from_loading = [\"dataloader\"]\ninitial_load_path = \"run/step-4\"\n"
      "initial_load_model_only = false\n");
  EXPECT_TRUE(fork.checkpoint.restart_data_stream);
  EXPECT_NE(
      note_of(fork, "checkpoint.exclude_from_loading").find("applied as checkpoint.restart_data_stream"),
      std::string::npos);
  EXPECT_EQ(note_of(fork, "checkpoint.initial_load_path"),
            "checkpoint.initial_load_path = \"run/step-4\" is loaded although checkpoint.enable = false "
            "(torchtitan would load nothing and start from random weights)");
  EXPECT_EQ(note_of(parse("[checkpoint]\nrestart_data_stream = true\ninitial_load_path = \"run/step-4\"\n"
                          "initial_load_model_only = false\n"),
                    "checkpoint.restart_data_stream"),
            "");

  // A part torchtitan does not have (its docs once spelled it data_loader), a wrong type, an empty entry.
  std::string e = parse_error("[checkpoint]\nexclude_from_loading = [\"data_loader\"]\n");
  EXPECT_NE(
      e.find("job.toml:2: checkpoint.exclude_from_loading = '[data_loader]': 'data_loader' is not one of "
             "model, optimizer, lr_scheduler, dataloader, train_state"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("dataloader"), std::string::npos) << e;
  e = parse_error("[checkpoint]\nexclude_from_loading = [1]\n");
  EXPECT_NE(e.find("checkpoint.exclude_from_loading expects an array of strings, got an array"),
            std::string::npos)
      << e;
  e = parse_error("", {{"checkpoint.exclude_from_loading", "optimizer,,dataloader"}});
  EXPECT_NE(e.find("has an empty entry"), std::string::npos) << e;
}

TEST(JobConfig, LoadStepInTheFileIsNoted) {
  EXPECT_EQ(
      note_of(parse("[checkpoint]\nenable = true\nload_step = 3\n"), "checkpoint.load_step"),
      "checkpoint.load_step = 3 in job.toml:3: every start of this job rolls back to it again (give it on "
      "the command line of the one run that rolls back)");
  EXPECT_EQ(note_of(parse("[checkpoint]\nenable = true\n", {{"checkpoint.load_step", "3"}}),
                    "checkpoint.load_step"),
            "");
}

// Each torchtitan key of the file that is not one of titan's own has exactly one note, and the
// titan keys have none.
void expect_one_note_per_torchtitan_key(const std::filesystem::path& file, const JobConfig& c) {
  std::vector<std::string> keys;
  keys_of(toml::parse_file(file.string()), "", keys);
  // titan's own keys with a note: values titan applies otherwise than torchtitan, and settings the
  // job's other settings leave without effect.
  const bool loads_weights = !c.checkpoint.initial_load_path.empty() || c.checkpoint.initial_load_in_hf;
  auto noted_native = [&](const std::string& key) {
    return (key == "checkpoint.export_dtype" && c.checkpoint.export_dtype == "float16") ||
           (key == "checkpoint.interval" && !c.checkpoint.enable) ||
           (key == "checkpoint.enable_first_step_checkpoint" && !c.checkpoint.enable &&
            c.checkpoint.enable_first_step_checkpoint) ||
           (key == "checkpoint.restart_data_stream" && !c.checkpoint.enable &&
            c.checkpoint.restart_data_stream) ||
           (key == "checkpoint.last_save_in_hf" && !c.checkpoint.enable && c.checkpoint.last_save_in_hf) ||
           ((key == "training.seed" || key == "debug.seed") && loads_weights) ||
           (key == "activation_checkpoint.selective_ac_option" &&
            (c.activation_checkpoint.mode != "selective" ||
             c.activation_checkpoint.selective_ac_option == "op")) ||
           (key.rfind("validation.", 0) == 0 && key != "validation.enable" && !c.validation.enable) ||
           ((key == "profiling.save_traces_folder" || key == "profiling.profile_freq" ||
             key == "profiling.profiler_active") &&
            !c.profiling.enable_profiling) ||
           (key == "metrics.save_tb_folder" && !c.metrics.enable_tensorboard);
  };
  size_t noted = 0;
  for (auto& key : keys) {
    const TorchtitanKey* k = find_torchtitan_key(key);
    ASSERT_NE(k, nullptr) << file << ": " << key << " is not a torchtitan key";
    if (k->use == TorchtitanUse::Native && !noted_native(key)) {
      EXPECT_EQ(note_of(c, key), "") << key;
    } else {
      ++noted;
      EXPECT_NE(note_of(c, key), "") << "no start-up note for " << key;
    }
  }
  EXPECT_EQ(c.notes.size(), noted);
}

TEST(TorchtitanConfig, TheLastTomlReleaseLayoutRunsUnchanged) {
  auto file = torchtitan_fixture("torchtitan_2026.toml");
  JobConfig c = load_job_config(file.string(), {});
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_EQ(c.model.name, "qwen3");
  EXPECT_EQ(c.model.flavor, "debugmodel");
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 2);
  EXPECT_EQ(c.lr_scheduler.decay_ratio, 0.8);
  EXPECT_EQ(c.lr_scheduler.decay_type, "cosine");
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.1);
  EXPECT_EQ(c.lr_scheduler.total_steps, 20);
  EXPECT_EQ(c.training.global_batch_size, 4);
  EXPECT_EQ(c.training.seed, 7);  // [debug] seed / deterministic: the newer home of the training keys
  EXPECT_TRUE(c.training.deterministic);
  EXPECT_EQ(c.activation_checkpoint.mode, "selective");
  EXPECT_FALSE(c.checkpoint.enable);
  // [comm]'s two timeouts bound their phases (start-up and the first step; the steps after), each
  // named in a timeout's error; comm.timeout_seconds stands in for either left unset.
  EXPECT_EQ(c.comm.init_timeout().seconds, 300);
  EXPECT_EQ(c.comm.init_timeout().key, "comm.init_timeout_seconds");
  EXPECT_EQ(c.comm.train_timeout().seconds, 100);
  EXPECT_EQ(c.comm.train_timeout().key, "comm.train_timeout_seconds");
  const JobConfig plain = parse("", {{"comm.timeout_seconds", "42"}});
  EXPECT_EQ(plain.comm.init_timeout().seconds, 42);
  EXPECT_EQ(plain.comm.train_timeout().key, "comm.timeout_seconds");
  for (const char* key : {"comm.init_timeout_seconds", "comm.train_timeout_seconds"}) {
    const std::string e = error_of([&] { parse("", {{key, "0"}}).validate(1); });
    EXPECT_NE(e.find(std::string(key) + " must be positive (or -1: comm.timeout_seconds), got 0"),
              std::string::npos)
        << e;
    // Refused when the config is read, not when the bound is first set (after step 1).
    const std::string inf = error_of([&] { parse("", {{key, "inf"}}).validate(1); });
    EXPECT_NE(inf.find(std::string(key) + " must be positive and at most 1e9 seconds, got inf"),
              std::string::npos)
        << inf;
    EXPECT_EQ(error_of([&] { parse("", {{key, "-1"}}).validate(1); }), "");
  }
  expect_one_note_per_torchtitan_key(file, c);
  EXPECT_NE(note_of(c, "compile.enable").find("ignored: titan has no torch.compile"), std::string::npos);
  EXPECT_NE(note_of(c, "training.dataloader.num_workers").find("= 2 ignored"), std::string::npos);
  EXPECT_NE(note_of(c, "parallelism.pipeline_parallel_degree").find("= 1 accepted, no effect"), std::string::npos);
  EXPECT_NE(note_of(c, "debug.seed").find("7 applied as training.seed"), std::string::npos);
  EXPECT_NE(note_of(c, "checkpoint.export_dtype").find("float16: no effect, there is no export at the end"),
            std::string::npos);
  EXPECT_NE(note_of(c, "model.converters").find("= [] accepted"), std::string::npos);
  // selective_ac_option = "op": torchtitan's per-op policy, applied as every second layer.
  EXPECT_NE(note_of(c, "activation_checkpoint.selective_ac_option").find("op applied as \"2\""),
            std::string::npos);
  EXPECT_EQ(checkpointing_of(c.activation_checkpoint), qwen3::Checkpointing::every_nth(2));
  const JobConfig every3 =
      load_job_config(file.string(), {{"activation_checkpoint.selective_ac_option", "3"}});
  EXPECT_EQ(note_of(every3, "activation_checkpoint.selective_ac_option"), "");
  EXPECT_EQ(checkpointing_of(every3.activation_checkpoint), qwen3::Checkpointing::every_nth(3));
  // "0", as in torchtitan (`not ac_freq`), is every layer.
  EXPECT_EQ(checkpointing_of({.mode = "selective", .selective_ac_option = "0"}),
            qwen3::Checkpointing::full());
  // The notes are not part of the config in effect: that lists titan's keys only.
  EXPECT_EQ(c.describe().find("compile"), std::string::npos);
}

TEST(TorchtitanConfig, OlderSpellingsMapToTheKeysTheyBecame) {
  auto file = torchtitan_fixture("torchtitan_2025_early.toml");
  JobConfig c = load_job_config(file.string(), {});
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_TRUE(c.checkpoint.enable);                      // checkpoint.enable_checkpoint
  EXPECT_EQ(c.checkpoint.async_mode, "async");           // saved in the background, as torchtitan would
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.2);          // lr_scheduler.lr_min
  EXPECT_EQ(c.model.hf_assets_path, "./assets/tokenizer/qwen3/");  // tokenizer_path: the file's folder
  EXPECT_EQ(c.training.local_batch_size, 2);             // training.batch_size
  EXPECT_EQ(c.training.seed, 11);
  EXPECT_EQ(c.activation_checkpoint.mode, "full");
  EXPECT_TRUE(c.metrics.enable_tensorboard);
  expect_one_note_per_torchtitan_key(file, c);
  EXPECT_NE(note_of(c, "checkpoint.enable_checkpoint").find("applied as checkpoint.enable"), std::string::npos);
  EXPECT_NE(note_of(c, "lr_scheduler.lr_min").find("applied as lr_scheduler.min_lr_factor"), std::string::npos);
  EXPECT_NE(note_of(c, "training.compile").find("ignored: titan has no torch.compile"), std::string::npos);
  EXPECT_NE(note_of(c, "validation.enabled").find("applied as validation.enable"), std::string::npos);
  EXPECT_FALSE(c.validation.enable);
  // The older spellings work on the command line too, and the last value wins.
  JobConfig d = load_job_config(file.string(), {{"checkpoint.enable_checkpoint", "false"}, {"lr_scheduler.lr_min", "0"}});
  EXPECT_FALSE(d.checkpoint.enable);
  EXPECT_EQ(d.lr_scheduler.min_lr_factor, 0.0);
  EXPECT_NE(note_of(d, "checkpoint.enable_checkpoint").find("false applied"), std::string::npos);
  EXPECT_EQ(parse("[model]\ntokenizer_path = \"tok/tokenizer.model\"\n").model.hf_assets_path, "tok/");
  EXPECT_EQ(parse("[model]\ntokenizer_path = \"/models/qwen3\"\n").model.hf_assets_path, "/models/qwen3");
}

// An older spelling and the new one of the same key, with different values, in one file or on one
// command line: an error naming both, never a silent pick by key order. Equal values, or the command
// line overriding the file, are fine.
TEST(TorchtitanConfig, TwoSpellingsOfOneKeyThatDisagreeAreAnError) {
  struct Case {
    std::string toml, first, second;
  };
  for (const Case& c : {Case{"[training]\nbatch_size = 4\nlocal_batch_size = 1\n", "training.batch_size = 4",
                             "training.local_batch_size = 1"},
                        Case{"[checkpoint]\nenable = false\nenable_checkpoint = true\n",
                             "checkpoint.enable = false", "checkpoint.enable_checkpoint = true"},
                        Case{"[lr_scheduler]\nlr_min = 0.2\nmin_lr_factor = 0.5\n",
                             "lr_scheduler.lr_min = 0.2", "lr_scheduler.min_lr_factor = 0.5"},
                        Case{"[training]\nwarmup_steps = 1\n[lr_scheduler]\nwarmup_steps = 0\n",
                             "training.warmup_steps = 1", "lr_scheduler.warmup_steps = 0"}}) {
    std::string e;
    try {
      parse(c.toml);
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(c.first), std::string::npos) << c.toml << e;
    EXPECT_NE(e.find(c.second), std::string::npos) << c.toml << e;
    EXPECT_NE(e.find("keep one"), std::string::npos) << e;
  }
  EXPECT_EQ(parse("[training]\nbatch_size = 4\nlocal_batch_size = 4\n").training.local_batch_size, 4);
  JobConfig d =
      parse_job_config("[training]\nbatch_size = 4\n", "f.toml", {{"training.local_batch_size", "2"}});
  EXPECT_EQ(d.training.local_batch_size, 2);
  EXPECT_THROW(
      parse_job_config("", "f.toml", {{"training.batch_size", "4"}, {"training.local_batch_size", "2"}}),
      Error);
}

// Block-causal attention runs on the GPU with titan's own kernels (one call per document); only
// cuDNN's, which plan per sequence length, are refused there (the error case below).
TEST(TorchtitanConfig, BlockCausalAttentionIsAcceptedOnTheGpuWithTitansKernels) {
  for (const char* rules : {"", "[kernels]\nattention = { impl = \"mma_sync\" }\n",
                            "[kernels]\nattention = { impl = \"f32_math\", modules = \"layers.0.*\" }\n"}) {
    const std::string toml = std::string("[model]\nattn_mask_type = \"block_causal\"\n") + rules;
    EXPECT_EQ(parse_error(toml, {{"job.device", "cuda"}}), "") << toml;
  }
  // The cuDNN rule is the GPU's concern only.
  EXPECT_EQ(parse_error(
                "[model]\nattn_mask_type = \"block_causal\"\n[kernels]\nattention = { impl = \"cudnn\" }\n"),
            "");
}

TEST(TorchtitanConfig, FeaturesTitanLacksAreErrorsThatNameTheKeyAndWhy) {
  std::string e = error_of([] { load_job_config(torchtitan_fixture("torchtitan_float8.toml").string(), {}); });
  EXPECT_NE(e.find("torchtitan_float8.toml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("model.converters"), std::string::npos) << e;
  EXPECT_NE(e.find("changes the numerics"), std::string::npos) << e;

  struct Case {
    std::string toml;
    Overrides overrides;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"[parallelism]\npipeline_parallel_degree = 2\n",
       {},
       {"job.toml:2", "pipeline_parallel_degree = 2", "no pipeline parallelism", "accepted: 1"}},
      {"",
       {{"experimental.pipeline_parallel_degree", "4"}},
       {"experimental.pipeline_parallel_degree = 4 (as parallelism.pipeline_parallel_degree)"}},
      {"[parallelism]\ncontext_parallel_degree = 2\n",
       {},
       {"context_parallel_degree", "context parallelism"}},
      {"[training]\ndtype = \"bfloat16\"\n", {}, {"training.dtype = \"bfloat16\"", "float32 master weights"}},
      {"[optimizer]\nearly_step_in_backward = true\n", {}, {"early_step_in_backward", "clipping"}},
      {"[float8]\nenable_float8_linear = true\n", {}, {"float8.enable_float8_linear", "float8"}},
      {"[checkpoint]\ninitial_load_in_hf = true\ninitial_load_model_only = false\n",
       {},
       {"job.toml:3: checkpoint.initial_load_model_only = false loads a whole training state, and "
        "checkpoint.initial_load_in_hf = true (job.toml:2) names a Hugging Face folder, which holds weights "
        "only"}},
      {"[checkpoint]\nenable = true\ncreate_seed_checkpoint = true\ninitial_load_path = \"/runs/a/step-9\"\n",
       {{"checkpoint.initial_load_model_only", "false"}},
       {"job.toml:3: checkpoint.create_seed_checkpoint = true writes starting weights as step 0",
        "checkpoint.initial_load_model_only = false (command line)"}},
      {"[checkpoint]\nenable = true\ncreate_seed_checkpoint = true\n",
       {{"checkpoint.load_only", "true"}},
       {"command line: checkpoint.load_only = true saves no checkpoint, and "
        "checkpoint.create_seed_checkpoint = true (job.toml:3) asks for one"}},
      {"[checkpoint]\ncreate_seed_checkpoint = true\n",
       {},
       {"job.toml:2: checkpoint.create_seed_checkpoint = true writes a checkpoint, and checkpoint.enable = "
        "false",
        "set checkpoint.enable = true"}},
      {"[checkpoint]\nexclude_from_loading = [\"optimizer\", \"model\"]\n",
       {},
       {"job.toml:2", "exclude_from_loading names \"model\"", "start a new run"}},
      {"",
       {{"checkpoint.exclude_from_loading", "dataloader,train_state"}},
       {"command line", "exclude_from_loading names \"train_state\"", "checkpoint.initial_load_path"}},
      {"[experimental]\ncustom_import = \"my.module\"\n", {}, {"experimental.custom_import", "Python"}},
      {"[debug]\nmoe_force_load_balance = true\n", {}, {"debug.moe_force_load_balance"}},
      {"[model]\nattn_mask_type = \"document\"\n",
       {},
       {"model.attn_mask_type must be one of causal, block_causal"}},
      // Block-causal attention cuts rows at their documents; unpacked conversations fill a row each.
      {"[model]\nattn_mask_type = \"block_causal\"\n[training]\nchat_field = \"messages\"\n",
       {},
       {"job.toml:2", "block_causal", "one conversation in each row", "pack_conversations = true"}},
      // Packed conversations attend within each one: block_causal, and conversations to pack.
      {"[training]\nchat_field = \"messages\"\npack_conversations = true\n",
       {},
       {"job.toml:3", "pack_conversations", "attend to the ones before it", "\"causal\" (the default)",
        "block_causal"}},
      // Best-fit packs conversations, a window of several at a time.
      {"[training]\npack_strategy = \"best_fit\"\n",
       {},
       {"job.toml:2", "pack_strategy = \"best_fit\"", "pack_conversations is false"}},
      {"[model]\nattn_mask_type = \"block_causal\"\n[training]\nchat_field = \"messages\"\n"
       "pack_conversations = true\npack_strategy = \"best_fit\"\n",
       {{"training.pack_window", "1"}},
       {"command line", "training.pack_window = 1", "at least 2 conversations"}},
      {"",
       {{"training.pack_strategy", "first_fit"}},
       {"training.pack_strategy must be one of next_fit, best_fit"}},
      {"[model]\nattn_mask_type = \"block_causal\"\n",
       {{"training.pack_conversations", "true"}},
       {"command line", "training.chat_field is not set", "text documents are always packed"}},
      // Block-causal attention calls the kernel per document: cuDNN would plan every length.
      {"[model]\nattn_mask_type = \"block_causal\"\n[kernels]\nattention = { impl = \"cudnn\" }\n",
       {{"job.device", "cuda"}},
       {"job.toml", "kernels.attention = { impl = \"cudnn\" }", "block_causal\" (job.toml:2)",
        "execution plan for every document length", "mma_sync"}},
      {"", {{"metrics.rank_0_only", "True"}}, {"metrics.rank_0_only expects true or false, got 'True'"}},
      {"[metrics]\nenable_wandb = \"false\"\n",
       {},
       {"job.toml:2", "metrics.enable_wandb expects true or false, got a string"}},
      {"[activation_checkpoint]\nselective_ac_option = \"-1\"\n",
       {},
       {"job.toml", "selective_ac_option = \"-1\"", "layer frequency"}},
      {"",
       {{"activation_checkpoint.selective_ac_option", "every"}},
       {"selective_ac_option = \"every\"", "\"op\""}},
      {"[activation_checkpoint]\nselective_ac_option = 2\n", {}, {"selective_ac_option"}},
      // Outputs titan does not write are errors when asked for, not notes.
      {"[metrics]\nenable_wandb = true\n",
       {},
       {"metrics.enable_wandb = true", "Weights & Biases", "accepted: false"}},
      {"[profiling]\nenable_memory_snapshot = true\n",
       {},
       {"profiling.enable_memory_snapshot", "memory snapshots"}},
      {"[checkpoint]\nexport_dtype = \"float16\"\nlast_save_in_hf = true\n",
       {},
       {"job.toml:2", "export_dtype = float16", "float32 or bfloat16"}},
      // A rule between keys names where the offending value was set: here the command line.
      {"[checkpoint]\nlast_save_in_hf = true\n",
       {{"checkpoint.export_dtype", "float16"}},
       {"command line: checkpoint.export_dtype = float16"}},
      {"", {{"activation_checkpoint.selective_ac_option", "-3"}}, {"command line", "selective_ac_option"}},
      {"[checkpoint]\nenable_checkpoint = \"yes\"\n", {}, {"checkpoint.enable", "true or false"}},
      {"[lr_scheduler]\nlr_min = \"low\"\n", {}, {"lr_scheduler.min_lr_factor", "expects a number"}},
      {"[compile]\nenabel = true\n", {}, {"unknown config key 'compile.enabel'"}},
      // The names torchtitan gives: "fp32" is not one, and the message says what is.
      {"[training]\ndtype = \"fp32\"\n",
       {},
       {"training.dtype = \"fp32\" cannot be honoured", "(accepted: float32)"}},
      // A degree accepted only as 1 takes torchtitan's type, an integer.
      {"[parallelism]\ncontext_parallel_degree = \"1\"\n",
       {},
       {"job.toml:2", "parallelism.context_parallel_degree expects an integer, got a string"}},
      {"[parallelism]\npipeline_parallel_degree = 1.0\n",
       {},
       {"pipeline_parallel_degree expects an integer, got a float"}},
      {"",
       {{"parallelism.context_parallel_degree", "one"}},
       {"context_parallel_degree expects an integer, got 'one'"}},
  };
  for (const auto& c : cases) {
    std::string err = parse_error(c.toml, c.overrides);
    ASSERT_FALSE(err.empty()) << "no error for:\n" << c.toml;
    for (const auto& s : c.expect) EXPECT_NE(err.find(s), std::string::npos) << "'" << s << "' not in: " << err;
  }
  // lr_scheduler.total_steps spans at least the run: titan does not extrapolate the schedule.
  std::string v = validate_error("[training]\nsteps = 10\n[lr_scheduler]\ntotal_steps = 5\n");
  EXPECT_NE(v.find("lr_scheduler.total_steps (5)"), std::string::npos) << v;
  EXPECT_EQ(validate_error("[training]\nsteps = 10\n[lr_scheduler]\ntotal_steps = 10\n"), "");
}

TEST(TorchtitanConfig, TheTableIsConsistentAndDocumented) {
  std::ifstream f(titan::testing::source_dir() / "docs" / "training.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  const std::string in_effect = JobConfig().describe();
  std::set<std::string> seen;
  for (auto& k : torchtitan_keys()) {
    const std::string key(k.key);
    EXPECT_TRUE(seen.insert(key).second) << key << " listed twice";
    EXPECT_NE(doc.find("| `" + key + "` |"), std::string::npos) << key << " has no row in docs/training.md";
    switch (k.use) {
      case TorchtitanUse::Native:
        EXPECT_NE(in_effect.find("  " + key + " = "), std::string::npos) << key << " is not a titan key";
        break;
      case TorchtitanUse::Alias: {
        const std::string target(k.target);
        const TorchtitanKey* t = find_torchtitan_key(target);
        EXPECT_TRUE(in_effect.find("  " + target + " = ") != std::string::npos || (t && t->use != TorchtitanUse::Alias))
            << key << " stands for " << target << ", which is neither a titan key nor a torchtitan one";
        break;
      }
      case TorchtitanUse::Ignored:
      case TorchtitanUse::OffOnly:
        EXPECT_FALSE(k.why.empty()) << key;
        break;
    }
  }
}

// An ignored key takes the values torchtitan takes for it (compile.enable = "yes" is a mistake
// torchtitan refuses): every Ignored key of the table, in the file and on the command line.
TEST(TorchtitanConfig, IgnoredKeysTakeOnlyTorchtitansTypeForThem) {
  using T = TorchtitanType;
  int checked = 0;
  for (auto& k : torchtitan_keys()) {
    if (k.use != TorchtitanUse::Ignored) continue;
    const std::string key(k.key);
    const auto dot = key.rfind('.');
    const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
    // A value of the key's type, one of another, and the same two as command-line text
    // ("" where the command line has no wrong text for it: any text is a string).
    std::string good, bad, good_text, bad_text, expected;
    switch (k.type) {
      case T::Bool:
        good = "true", bad = "\"yes\"", good_text = "false", bad_text = "yes", expected = "true or false";
        break;
      case T::Int:
        good = "4", bad = "2.5", good_text = "4", bad_text = "often", expected = "an integer";
        break;
      case T::Number:
        good = "0.5", bad = "\"half\"", good_text = "1", bad_text = "half", expected = "a number";
        break;
      case T::String:
        good = "\"x\"", bad = "3", good_text = "x", expected = "a string";
        break;
      case T::Choice: {
        const std::string first = torchtitan_choices(k).front();
        good = "\"" + first + "\"", bad = "\"not-a-choice\"", good_text = first, bad_text = "not-a-choice";
        expected = "one of ";
        break;
      }
      case T::Strings:
        good = "[\"layers.0\"]", bad = "[1, 2]", good_text = "a,b", expected = "an array of strings";
        break;
      case T::Array:
        good = "[[\"a\"], [\"b\"]]", bad = "\"a\"", good_text = "a", expected = "an array";
        break;
    }
    const std::string file = "[" + section + "]\n" + name + " = ";
    EXPECT_EQ(parse_error(file + good + "\n"), "") << key;
    EXPECT_EQ(parse_error("", {{key, good_text}}), "") << key;
    const std::string e = parse_error(file + bad + "\n");
    EXPECT_NE(e.find(key + " expects " + expected), std::string::npos) << key << ": " << e;
    if (!bad_text.empty()) {
      const std::string cli = parse_error("", {{key, bad_text}});
      EXPECT_NE(cli.find(key + " expects " + expected), std::string::npos) << key << ": " << cli;
    }
    ++checked;
  }
  EXPECT_GT(checked, 100);  // the table's Ignored keys, not an empty loop
  // The message names the line, torchtitan's type and the value.
  EXPECT_NE(parse_error("[compile]\nenable = \"yes\"\n")
                .find("job.toml:2: compile.enable expects true or false (torchtitan's type for it; titan "
                      "ignores its value), "
                      "got a string 'yes'"),
            std::string::npos)
      << parse_error("[compile]\nenable = \"yes\"\n");
  EXPECT_NE(parse_error("", {{"optimizer.implementation", "fast"}})
                .find("optimizer.implementation expects one of for-loop, foreach, fused"),
            std::string::npos);
}

// A dataset named in the file is one of the bundled ones: the error names the line (torchtitan's
// c4_test is not bundled), where it used to surface, unplaced, when the data was read.
TEST(TorchtitanConfig, AnUnbundledDatasetNameIsAnErrorAtItsLine) {
  const std::string e = validate_error("[training]\ndataset = \"c4_test\"\n");
  EXPECT_NE(
      e.find("training.dataset: no built-in dataset named 'c4_test' (built-in: nlp-corpus, "
             "nlp-corpus-validation; "
             "torchtitan's c4, c4_test and c4_validation are not bundled): set training.dataset_path to "
             "your own files (training.dataset set at job.toml:2"),
      std::string::npos)
      << e;
  // A held-out set's names its own key.
  EXPECT_NE(
      validate_error("[validation]\nenable = true\ndataset = \"c4_validation\"\n")
          .find("validation.dataset: no built-in dataset named 'c4_validation' (built-in: nlp-corpus, "
                "nlp-corpus-validation; torchtitan's c4, c4_test and c4_validation are not bundled): set "
                "validation.dataset_path to your own files"),
      std::string::npos);
  EXPECT_EQ(validate_error("[training]\ndataset = \"c4\"\ndataset_path = \"/data/c4\"\n"), "");
  EXPECT_NE(validate_error("[validation]\nenable = true\ndataset = \"c4_val\"\n")
                .find("validation.dataset: no built-in dataset named 'c4_val'"),
            std::string::npos);
  EXPECT_EQ(validate_error("[validation]\nenable = false\ndataset = \"c4_val\"\n"), "");
}

// A mistyped value under an older spelling names the key as written, and the key it stands for.
TEST(TorchtitanConfig, AnOlderSpellingsBadValueNamesTheKeyAsWritten) {
  EXPECT_NE(parse_error("[validation]\nenabled = \"true\"\n")
                .find("job.toml:2: validation.enabled (torchtitan's older name for validation.enable) "
                      "expects true or "
                      "false, got a string"),
            std::string::npos)
      << parse_error("[validation]\nenabled = \"true\"\n");
  EXPECT_NE(
      parse_error("", {{"debug.seed", "seven"}})
          .find("debug.seed (torchtitan's older name for training.seed) expects an integer, got 'seven'"),
      std::string::npos)
      << parse_error("", {{"debug.seed", "seven"}});
  EXPECT_NE(parse_error("[training]\nseed = \"7\"\n").find("training.seed expects an integer, got a string"),
            std::string::npos);
}

// torchtitan lower-cases the norm's name: "RMSNorm" is its rmsnorm, accepted as such.
TEST(TorchtitanConfig, TheNormTypeIsComparedAsTorchtitanDoes) {
  EXPECT_NE(
      note_of(parse("[model]\nnorm_type = \"RMSNorm\"\n"), "model.norm_type").find("accepted, no effect"),
      std::string::npos);
  EXPECT_NE(parse_error("[model]\nnorm_type = \"layernorm\"\n").find("cannot be honoured"),
            std::string::npos);
  // A string from the file is quoted in its note; a TOML boolean is not.
  EXPECT_EQ(note_of(parse("[compile]\nbackend = \"inductor\"\n"), "compile.backend").substr(0, 36),
            "compile.backend = \"inductor\" ignored");
  EXPECT_EQ(note_of(parse("[compile]\nenable = false\n"), "compile.enable").substr(0, 30),
            "compile.enable = false ignored");
}

// A key left out takes titan's default; where torchtitan's differs and shapes the run, one note
// names each such key with both values, so a torchtitan job file does not train another run unsaid.
TEST(TorchtitanConfig, DefaultsUnlikeTorchtitansAreNamedWhenTheFileLeavesThemOut) {
  auto defaults_note = [](const JobConfig& c) { return c.left_out_note(/*resumes=*/false); };
  EXPECT_EQ(
      defaults_note(parse("[checkpoint]\nenable = true\n")),
      "left out, so titan's default where torchtitan's differs: training.steps = 10 (torchtitan's: 10000), "
      "training.local_batch_size = 2 (torchtitan's: 8), training.seq_len = 512 (torchtitan's: 2048), "
      "lr_scheduler.warmup_steps = 2 (torchtitan's: 200), training.seed = 42 (torchtitan's: none: a random "
      "seed), checkpoint.keep_latest_k = 3 (torchtitan's: 10)");
  // A run that resumes takes its weights from the checkpoint: the seed is not named.
  EXPECT_EQ(parse("[checkpoint]\nenable = true\n[training]\nsteps = 100\n").left_out_note(/*resumes=*/true),
            "left out, so titan's default where torchtitan's differs: training.local_batch_size = 2 "
            "(torchtitan's: 8), training.seq_len = 512 (torchtitan's: 2048), lr_scheduler.warmup_steps = 2 "
            "(torchtitan's: 200), checkpoint.keep_latest_k = 3 (torchtitan's: 10)");
  // The note is its own line, not among the notes on keys the file sets.
  for (const std::string& n : parse("[checkpoint]\nenable = true\n").notes)
    EXPECT_EQ(n.find("left out"), std::string::npos) << n;
  // Set in the file, by an older spelling, or on the command line: not named. Without saves,
  // keep_latest_k does nothing; with loaded weights, nor does the seed.
  EXPECT_EQ(
      defaults_note(parse("[training]\nsteps = 100\nbatch_size = 8\n[lr_scheduler]\nwarmup_steps = 10\n",
                          {{"training.seq_len", "2048"}, {"checkpoint.initial_load_in_hf", "true"}})),
      "");
  EXPECT_EQ(defaults_note(parse("[training]\nsteps = 100\nlocal_batch_size = 8\nseq_len = 64\nseed = "
                                "1\n[lr_scheduler]\nwarmup_steps = 1\n")),
            "");
  // The bundled job sets them all.
  EXPECT_EQ(defaults_note(
                load_job_config((titan::testing::source_dir() / "configs" / "debugmodel.toml").string(), {})),
            "");
}

TEST(TorchtitanConfig, TheStartUpLogPrintsOneLinePerNote) {
  // Through the binary, a 1-step run of the 2026-layout file on a tiny model: the notes are printed
  // after the config in effect, one "config: <key> = ..." line each.
  auto dump = titan::testing::temp_dir("torchtitan_startup");
  std::string out;
  std::string cmd = "cd " + titan::testing::source_dir().string() + " && " + titan::testing::titan_binary().string() +
                    " train --config " + torchtitan_fixture("torchtitan_2026.toml").string() +
                    " --job.dump_folder=" + dump.string() +
                    " --training.steps=1 --training.global_batch_size=2 --training.seq_len=32 --model.n_layers=1"
                    " --model.dim=64 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=128"
                    " --lr_scheduler.warmup_steps=1";
  ASSERT_EQ(titan::testing::run_command(cmd, &out), 0) << out;
  JobConfig c = load_job_config(torchtitan_fixture("torchtitan_2026.toml").string(), {});
  ASSERT_FALSE(c.notes.empty());
  for (auto& note : c.notes) EXPECT_NE(out.find("\nconfig: " + note + "\n"), std::string::npos) << note << "\n" << out;
  EXPECT_NE(out.find("step: 1 "), std::string::npos) << out;
}

}  // namespace

TEST(JobConfig, DeviceKeyNamesWhatItCannotDo) {
  // job.device takes cpu or cuda; a device run checkpoints like a CPU run (through host copies).
  EXPECT_EQ(parse("", {{"job.device", "cuda"}}).job.device, "cuda");
  EXPECT_NE(parse_error("", {{"job.device", "tpu"}}).find("job.device must be one of cpu, cuda"), std::string::npos);
  EXPECT_EQ(validate_error("[job]\ndevice = \"cuda\"\n[checkpoint]\nenable = true\nlast_save_in_hf = true\n"), "");
  EXPECT_EQ(validate_error("[job]\ndevice = \"cuda\"\n"), "");
}

// Keys that ask for experts on a dense model ask for something that cannot happen: errors naming
// the key, as the rule for keys titan cannot honour says. num_experts itself is what makes an MoE.
TEST(JobConfig, ExpertKeysOnADenseModelAreErrors) {
  for (const std::string key : {"top_k = 4", "mlp_only_layers = [0]", "router_aux_loss_coef = 0.01"}) {
    const std::string e =
        error_of([&] { resolve_model_args(parse("[model]\nflavor = \"debugmodel\"\n" + key + "\n")); });
    EXPECT_NE(e.find("model." + key.substr(0, key.find(' ')) + " = "), std::string::npos) << e;
    EXPECT_NE(e.find(" (set at job.toml:3) configures experts"), std::string::npos) << e;
    EXPECT_NE(e.find("this model is dense (num_experts = 0)"), std::string::npos) << e;
  }
  std::string e =
      error_of([&] { resolve_model_args(parse("[training]\nload_balance = \"expert_bias\"\n")); });
  EXPECT_NE(e.find("training.load_balance = \"expert_bias\" (set at job.toml:2) balances experts, but this "
                   "model is dense"),
            std::string::npos)
      << e;
  // Set at all: the default's value (aux_loss) and the bias step balance no experts either, where the
  // first was accepted in silence and the second noted as if the aux loss balanced experts.
  e = error_of([&] { resolve_model_args(parse("[training]\nload_balance = \"aux_loss\"\n")); });
  EXPECT_NE(
      e.find("training.load_balance = \"aux_loss\" (set at job.toml:2) balances experts, but this model "
             "is dense"),
      std::string::npos)
      << e;
  e = error_of([&] { resolve_model_args(parse("[training]\nload_balance_coeff = 0.01\n")); });
  EXPECT_NE(
      e.find("training.load_balance_coeff = 0.01 (set at job.toml:2) is the expert-bias update step, but "
             "this model is dense"),
      std::string::npos)
      << e;
  // Expert parallelism needs experts, and as many on every rank.
  e = error_of([&] { resolve_model_args(parse("[parallelism]\nexpert_parallel_degree = 2\n")); });
  EXPECT_NE(
      e.find("parallelism.expert_parallel_degree = 2 (set at job.toml:2) splits experts over ranks, but "
             "this model is dense"),
      std::string::npos)
      << e;
  e = error_of([&] {
    resolve_model_args(
        parse("[model]\nflavor = \"debugmodel_moe\"\nnum_experts = 12\n[parallelism]\n"
              "expert_parallel_degree = 8\n"));
  });
  // Each number with where it came from: a key's place, or the flavor's.
  EXPECT_NE(e.find("parallelism.expert_parallel_degree = 8 (set at "), std::string::npos) << e;
  EXPECT_NE(e.find(") must divide model.num_experts = 12 (set at "), std::string::npos) << e;
  e = error_of([&] {
    resolve_model_args(
        parse("[model]\nflavor = \"debugmodel_moe\"\n[parallelism]\nexpert_parallel_degree = 3\n"));
  });
  EXPECT_NE(
      e.find(") must divide model.num_experts = 64 (model.flavor debugmodel_moe's): the experts are split"),
      std::string::npos)
      << e;
  EXPECT_EQ(resolve_model_args(parse("[model]\nflavor = \"debugmodel_moe\"\nnum_experts = 12\n[parallelism]\n"
                                     "expert_parallel_degree = 3\n"))
                .num_experts,
            12);
  EXPECT_EQ(resolve_model_args(parse("[model]\nnum_experts = 0\n")).num_experts, 0);
  const auto moe = resolve_model_args(parse("[model]\nflavor = \"debugmodel_moe\"\ntop_k = 2\n"));
  EXPECT_EQ(moe.top_k, 2);
  // An MoE config whose layers are all dense is named, not a crash in the aux loss.
  e = error_of([&] {
    resolve_model_args(
        parse("[model]\nflavor = \"debugmodel_moe\"\nn_layers = 2\ndecoder_sparse_step = 3\n"));
  });
  EXPECT_NE(e.find("but no layer has experts (decoder_sparse_step = 3"), std::string::npos) << e;
  // titan adds the aux loss exactly when load_balance = "aux_loss": a model key saying otherwise is
  // an error, never printed in the config in effect and not done.
  e = error_of([&] {
    resolve_model_args(parse("[model]\nflavor = \"debugmodel_moe\"\noutput_router_logits = false\n"));
  });
  EXPECT_NE(e.find("model.output_router_logits = false contradicts training.load_balance = \"aux_loss\""),
            std::string::npos)
      << e;
  EXPECT_TRUE(resolve_model_args(parse("[model]\nflavor = \"debugmodel_moe\"\noutput_router_logits = true\n"))
                  .output_router_logits);
}

TEST(JobConfig, TheCommandLineTakesOneConfig) {
  std::string out;
  const std::string cfg = (titan::testing::source_dir() / "configs" / "debugmodel.toml").string();
  EXPECT_NE(titan::testing::run_command(titan::testing::titan_binary().string() + " train --config " + cfg +
                                            " --config " + cfg + " 2>&1",
                                        &out),
            0)
      << out;
  EXPECT_NE(out.find("--config is given twice"), std::string::npos) << out;
  // The message is printed for the user, without its source location unless asked for.
  EXPECT_EQ(out.find(".cpp:"), std::string::npos) << out;
  titan::testing::run_command("TITAN_ERROR_LOCATION=1 " + titan::testing::titan_binary().string() +
                                  " train --config " + cfg + " --config " + cfg + " 2>&1",
                              &out);
  EXPECT_NE(out.find("args.cpp:"), std::string::npos) << out;
}

// An option without a section is none of the config's keys: said as an unknown option of the
// command, with or without a value after it (not "needs a value" when last).
TEST(JobConfig, AnOptionWithoutASectionIsAnUnknownOptionOfTheCommand) {
  const std::string cfg = (titan::testing::source_dir() / "configs" / "debugmodel.toml").string();
  for (const char* given : {" --nonsense", " --nonsense=1", " --nonsense 1"}) {
    std::string out;
    EXPECT_NE(titan::testing::run_command(
                  titan::testing::titan_binary().string() + " eval --config " + cfg + given + " 2>&1", &out),
              0)
        << given;
    EXPECT_NE(
        out.find(
            "titan eval: error: unknown option --nonsense (its options: --config, --checkpoint, --json; the "
            "job config's keys are --section.key=value)"),
        std::string::npos)
        << given << ": " << out;
  }
  // A key's name without its section: the keys of that name are suggested.
  std::string out;
  EXPECT_NE(titan::testing::run_command(
                titan::testing::titan_binary().string() + " train --config " + cfg + " --steps=3 2>&1", &out),
            0);
  EXPECT_NE(out.find("unknown option --steps (its options: --config, --list-keys; the job config's keys are "
                     "--section.key=value; did you mean --training.steps or --validation.steps?)"),
            std::string::npos)
      << out;
}

// torchtitan's command line: the job file as --job.config_file, a boolean key bare for true and with
// "no_" before its name for false; a key that is not boolean still needs its value.
TEST(JobConfig, TorchtitansCommandLineSpellingsAreAccepted) {
  const std::string cfg = (titan::testing::source_dir() / "configs" / "debugmodel.toml").string();
  std::string out;
  auto plan = [&](const std::string& flags) {
    out.clear();
    return titan::testing::run_command(
        titan::testing::titan_binary().string() + " plan " + flags + " --training.seq_len=64 2>&1", &out);
  };
  EXPECT_EQ(plan("--job.config_file " + cfg + " --checkpoint.enable --checkpoint.no_initial_load_model_only"),
            0)
      << out;
  // false applied (the default is true), and said to have no effect without an initial_load_path
  EXPECT_NE(out.find("checkpoint.initial_load_model_only = false: no effect"), std::string::npos) << out;
  // Bare is true, no_ false: a background save's checkpoint copy is planned exactly when checkpointing is on.
  EXPECT_EQ(plan("--config " + cfg + " --checkpoint.enable --checkpoint.async_mode=async"), 0) << out;
  EXPECT_NE(out.find("checkpoint copy"), std::string::npos) << out;
  EXPECT_EQ(plan("--config " + cfg + " --checkpoint.no_enable --checkpoint.async_mode=async"), 0) << out;
  EXPECT_EQ(out.find("checkpoint copy"), std::string::npos) << out;
  EXPECT_NE(plan("--config " + cfg + " --training.steps"), 0);
  EXPECT_NE(out.find("titan plan: error: --training.steps needs a value"), std::string::npos) << out;
  // A key followed by another option is no boolean given bare: a mistyped one is said as unknown (not
  // "unexpected argument '10'" after it took --training.steps as its value).
  EXPECT_NE(plan("--config " + cfg + " --checkpoint.enabel --training.steps 10"), 0);
  EXPECT_NE(out.find("unknown config key 'checkpoint.enabel'; did you mean 'checkpoint.enable'?"),
            std::string::npos)
      << out;
  EXPECT_NE(plan("--config " + cfg + " --training.seed --training.steps 10"), 0);
  EXPECT_NE(out.find("--training.seed needs a value (the next argument, '--training.steps', is an option)"),
            std::string::npos)
      << out;
  EXPECT_TRUE(is_boolean_key("model.tie_embeddings"));
  EXPECT_TRUE(is_boolean_key("checkpoint.enable"));
  EXPECT_TRUE(is_boolean_key("checkpoint.enable_checkpoint"));  // torchtitan's older name for it
  EXPECT_TRUE(is_boolean_key("compile.enable"));
  EXPECT_FALSE(is_boolean_key("training.steps"));
  EXPECT_FALSE(is_boolean_key("job.config_file"));
}

// optimizer.name: torchtitan's two, AdamW and Adam (torch.optim.Adam's L2 weight decay).
TEST(JobConfig, OptimizerNameIsAdamWOrAdam) {
  EXPECT_EQ(parse("", {{"optimizer.name", "Adam"}}).optimizer.name, "Adam");
  EXPECT_EQ(parse("[optimizer]\nname = \"AdamW\"\n", {}).optimizer.name, "AdamW");
  EXPECT_NE(parse_error("", {{"optimizer.name", "SGD"}})
                .find("optimizer.name must be one of AdamW, Adam; got 'SGD'"),
            std::string::npos);
}

// training.mixed_precision_reduce: float32 or bfloat16 (torchtitan's key); bf16 only where the
// blocks are sharded, as FSDP2's reduce_dtype.
TEST(JobConfig, MixedPrecisionReduceIsFloat32OrBfloat16ForShardedBlocks) {
  const JobConfig bf16 = parse("[training]\nmixed_precision_reduce = \"bfloat16\"\n", {});
  EXPECT_EQ(bf16.training.mixed_precision_reduce, "bfloat16");
  EXPECT_EQ(parse("", {}).training.mixed_precision_reduce, "float32");
  EXPECT_NE(parse_error("", {{"training.mixed_precision_reduce", "float16"}})
                .find("training.mixed_precision_reduce must be one of float32, bfloat16; got 'float16'"),
            std::string::npos);
  EXPECT_EQ(resolve_reduce_dtype(bf16, 2), DType::BF16);
  EXPECT_EQ(resolve_reduce_dtype(bf16, 1), DType::F32) << "whole blocks (DDP, one process) reduce in f32";
  EXPECT_EQ(resolve_reduce_dtype(parse("", {}), 4), DType::F32);
  // The note titan train and titan plan give a mesh that leaves it without effect.
  const auto world = dist::meta_world_communicator(2);
  const dist::ParallelPlan ddp(*world, 2, 1), fsdp(*world, 1, 2);
  EXPECT_NE(
      reduce_dtype_note(bf16, ddp).find("training.mixed_precision_reduce = bfloat16: no effect, only sharded "
                                        "blocks (parallelism.data_parallel_shard_degree > 1)"),
      std::string::npos)
      << reduce_dtype_note(bf16, ddp);
  EXPECT_EQ(reduce_dtype_note(bf16, fsdp), "");
  EXPECT_EQ(reduce_dtype_note(parse("", {}), ddp), "");
}

// metrics.save_for_all_ranks (torchtitan's key; rank_0_only its older, inverted name): where each
// rank's records and TensorBoard events go.
TEST(JobConfig, SaveForAllRanksGivesEveryRankItsOwnRecords) {
  EXPECT_FALSE(parse("", {}).metrics.save_for_all_ranks);
  EXPECT_TRUE(parse("[metrics]\nsave_for_all_ranks = true\n", {}).metrics.save_for_all_ranks);
  const JobConfig older = parse("[metrics]\nrank_0_only = false\n", {});
  EXPECT_TRUE(older.metrics.save_for_all_ranks);
  EXPECT_EQ(note_of(older, "metrics.rank_0_only"),
            "metrics.rank_0_only = false applied as metrics.save_for_all_ranks = true "
            "(torchtitan's older, inverted name for it)");
  EXPECT_FALSE(parse("[metrics]\nrank_0_only = true\n", {}).metrics.save_for_all_ranks);
  EXPECT_NE(
      parse_error("[metrics]\nrank_0_only = \"no\"\n", {}).find("metrics.rank_0_only expects true or false"),
      std::string::npos);
  EXPECT_NE(parse_error("[metrics]\nrank_0_only = false\nsave_for_all_ranks = false\n", {})
                .find("both set metrics.save_for_all_ranks"),
            std::string::npos);

  const std::filesystem::path dump = "/runs/a", tb = "/runs/a/tb";
  const MetricsOutputs rank0 = metrics_outputs(dump, tb, 0, true, false);
  EXPECT_TRUE(rank0.console);
  EXPECT_EQ(rank0.jsonl, dump / "metrics.jsonl");
  EXPECT_EQ(rank0.tensorboard, tb);
  EXPECT_EQ(rank0.rank, -1);
  const MetricsOutputs rank1 = metrics_outputs(dump, tb, 1, false, false);
  EXPECT_TRUE(rank1.jsonl.empty() && rank1.tensorboard.empty() && !rank1.console) << "rank 1 writes nothing";
  const MetricsOutputs all0 = metrics_outputs(dump, tb, 0, true, true),
                       all1 = metrics_outputs(dump, tb, 1, false, true);
  EXPECT_EQ(all0.jsonl, dump / "metrics.jsonl");
  EXPECT_EQ(all0.tensorboard, tb / "rank_0");
  EXPECT_EQ(all1.jsonl, dump / "metrics-rank1.jsonl");
  EXPECT_EQ(all1.tensorboard, tb / "rank_1");
  EXPECT_EQ(all1.rank, 1);
  EXPECT_FALSE(all1.console);
  EXPECT_TRUE(metrics_outputs(dump, "", 1, false, true).tensorboard.empty()) << "no TensorBoard asked for";
}

// metrics.save_tb_folder: the TensorBoard folder under job.dump_folder (torchtitan's key), a folder of
// its own; without TensorBoard it has no effect, and a note says so.
TEST(JobConfig, SaveTbFolderIsAFolderOfItsOwnUnderTheDumpFolder) {
  EXPECT_EQ(validate_error("[metrics]\nenable_tensorboard = true\nsave_tb_folder = \"tb/run2\"\n"), "");
  EXPECT_NE(validate_error("[metrics]\nenable_tensorboard = true\nsave_tb_folder = \"\"\n")
                .find("metrics.save_tb_folder must not be empty"),
            std::string::npos);
  EXPECT_NE(validate_error("[metrics]\nenable_tensorboard = true\nsave_tb_folder = \"./\"\n")
                .find("metrics.save_tb_folder = ./: the events need a folder of their own"),
            std::string::npos);
  EXPECT_NE(validate_error("[job]\ndump_folder = \"/tmp/run\"\n[metrics]\nenable_tensorboard = true\n"
                           "save_tb_folder = \"/tmp/run/\"\n")
                .find("the events need a folder of their own"),
            std::string::npos);
  EXPECT_EQ(validate_error("[metrics]\nsave_tb_folder = \"\"\n"), "") << "no effect without TensorBoard";
  const JobConfig off = parse("[metrics]\nsave_tb_folder = \"board\"\n", {});
  EXPECT_EQ(note_of(off, "metrics.save_tb_folder"),
            "metrics.save_tb_folder = board: no effect, metrics.enable_tensorboard = false");
}

// `titan train --list-keys`: a TOML template of every key at its default, commented out, that starts
// a valid job as printed (no key set, no note) and reads back as the defaults once every key is
// uncommented; it names every key (titan's, the model fields, torchtitan's others) with the choices
// of those that have them.
TEST(JobConfigReference, IsATemplateOfEveryKeyAtItsDefault) {
  const std::string reference = job_config_reference();
  EXPECT_EQ(validate_error(reference), "");
  EXPECT_TRUE(parse(reference).notes.empty());
  std::string uncommented;
  std::istringstream lines(reference);
  for (std::string line; std::getline(lines, line);) {
    const bool key = line.size() > 2 && line.rfind("# ", 0) == 0 && std::islower(uint8_t(line[2])) &&
                     line.find(" = ") != std::string::npos &&
                     line.find_first_not_of("abcdefghijklmnopqrstuvwxyz_0123456789", 2) == line.find(" = ");
    uncommented += (key ? line.substr(2) : line) + "\n";
  }
  EXPECT_EQ(parse_job_config(uncommented, "list-keys", {}).describe(), JobConfig().describe());
  const toml::table table = toml::parse(uncommented);
  const std::vector<std::string> model_fields = qwen3::override_keys();
  const size_t fields_at = reference.find("# and any model field");
  ASSERT_NE(fields_at, std::string::npos) << reference;
  const std::string fields_line = reference.substr(fields_at, reference.find('\n', fields_at) - fields_at);
  for (const std::string& key : job_config_keys()) {
    const std::string name = key.substr(key.find('.') + 1);
    if (key.rfind("model.", 0) == 0 && std::count(model_fields.begin(), model_fields.end(), name)) {
      // A whole name of the comma-separated list (a comma, or the line's end, after it).
      EXPECT_NE((fields_line + ",").find(" " + name + ","), std::string::npos)
          << key << " is not in " << fields_line;
    } else {
      EXPECT_TRUE(table.at_path(key)) << key << " is not in\n" << reference;
    }
  }
  for (const TorchtitanKey& k : torchtitan_keys()) {
    if (k.use != TorchtitanUse::Native) {
      EXPECT_NE(reference.find("#   " + std::string(k.key) + ": "), std::string::npos) << k.key;
    }
  }
  EXPECT_NE(reference.find("\n# decay_type = \"linear\"  # linear | cosine | sqrt\n"), std::string::npos)
      << reference;
  // The values parsed only to be refused with a reason are not offered.
  EXPECT_NE(
      reference.find("\n# exclude_from_loading = []  # each of optimizer | lr_scheduler | dataloader\n"),
      std::string::npos)
      << reference;
  EXPECT_NE(
      reference.find("\n# load_balance = \"aux_loss\"  # aux_loss | expert_bias; MoE models only (set on "
                     "a dense model: an error)\n"),
      std::string::npos)
      << reference;
  // Every key uncommented resolves on an MoE flavor; on the default (dense) one, once the keys
  // marked for MoE models only are left commented.
  EXPECT_EQ(
      error_of([&] {
        resolve_model_args(parse_job_config(uncommented, "list-keys", {{"model.flavor", "debugmodel_moe"}}));
      }),
      "");
  std::string dense;
  std::istringstream again(uncommented);
  for (std::string line; std::getline(again, line);)
    dense += (line.find("MoE models only") != std::string::npos ? "# " + line : line) + "\n";
  EXPECT_EQ(error_of([&] { resolve_model_args(parse_job_config(dense, "list-keys", {})); }), "");
  EXPECT_NE(error_of([&] { resolve_model_args(parse_job_config(uncommented, "list-keys", {})); }), "");
  EXPECT_NE(
      reference.find("\n# export_dtype = \"float32\"  # float32 | bfloat16; float16, one of torchtitan's"),
      std::string::npos)
      << reference;
  EXPECT_NE(reference.find("#   checkpoint.enable_checkpoint: an older name of checkpoint.enable"),
            std::string::npos);
}

// Ranks sharing a host's cores (mpirun --oversubscribe on a small machine): each rank's MFU peak counts
// its cores whole, so the start-up says by how much its figures read low; ranks that fit say nothing.
TEST(Startup, RanksSharingAHostsCoresAreSaidWithTheShareEachGets) {
  EXPECT_EQ(cpu_oversubscription_note(2, 1, 2), "");
  EXPECT_EQ(cpu_oversubscription_note(4, 8, 32), "");
  EXPECT_EQ(
      cpu_oversubscription_note(4, 1, 2),
      "4 ranks x 1 core each share this host's 2 physical cores: a rank gets about 50% of the 1 core its "
      "MFU peak counts, so its MFU and tokens/s read low by as much (fewer ranks, or OMP_NUM_THREADS, per "
      "host measure the hardware)");
  EXPECT_NE(
      cpu_oversubscription_note(3, 2, 4).find("3 ranks x 2 cores each share this host's 4 physical cores: "
                                              "a rank gets about 67% of the 2 cores its MFU peak counts"),
      std::string::npos);
}

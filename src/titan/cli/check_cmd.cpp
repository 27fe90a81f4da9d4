// titan check --config FILE.toml [--section.key=value ...] [--json FILE] [--steps N] [--workdir DIR]
//
// The recipe's pilot checklist, run for exactly the job the config describes, as one table of
// PASS / FAIL / SKIP rows (exit status 1 on any FAIL):
//   versions      what this build is (titan version)
//   ranks         the launcher's world size fits the configured mesh and every rank answers (under
//                 mpirun the other ranks stop after this row; the rows below run on rank 0)
//   resume        a checkpoint in the job's own folder that titan train would resume opens as train
//                 opens it (every file at its manifest size) and was trained as this job's model and
//                 sequence length (SKIP when there is none)
//   model         the checkpoint the job loads: parameters of config.json = the file's, every tensor
//                 present, none extra, one dtype as config.json says, tied lm_head absent or equal
//   export        export to a temporary folder, reload: same keys, every tensor bit-equal, same loss
//   loaded/random the first-step loss with the checkpoint's weights is clearly below a random init's
//   kernels       parity of every [kernels] substitution against the reference, forward and backward
//   timing        warm-up step and sustained throughput, MFU
//   checkpoint    save, reload, one more step: loss and weights equal to the uninterrupted run's;
//                 the job's own dump and checkpoint folders can be created and written
// The training rows run the trainer itself (train::run_training) on the config with a few overrides
// (a few steps, deterministic, its own dump folder), so they check the job as `titan train` runs it.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "titan/autograd/autograd.h"
#include "titan/cli/args.h"
#include "titan/cli/command.h"
#include "titan/core/check.h"
#include "titan/core/element.h"
#include "titan/data/data_identity.h"
#include "titan/dist/communicator.h"
#include "titan/dist/parallel_plan.h"
#include "titan/io/atomic_file.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/kernels/parity.h"
#include "titan/kernels/substitution.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpointer.h"
#include "titan/train/job_config.h"
#include "titan/train/resume_guard.h"
#include "titan/train/startup.h"
#include "titan/train/trainer.h"
#include "titan/train/versions.h"

namespace titan::cli {
namespace {

namespace fs = std::filesystem;
using Overrides = std::vector<std::pair<std::string, std::string>>;

struct Row {
  std::string check;
  std::string status;  // PASS | FAIL | SKIP
  std::string value;   // what was measured, or why it failed / was skipped
  std::string rule;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Runs fn with stdout sent to `log` (the trainer's start-up report and step lines would bury the
// table); the log stays in the work folder.
template <class Fn>
auto with_stdout_to(const fs::path& log, Fn fn) {
  std::fflush(stdout);
  int saved = dup(1);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TITAN_CHECK(fd >= 0, "titan check: cannot write '", log.string(), "'");
  dup2(fd, 1);
  close(fd);
  struct Restore {
    int saved;
    ~Restore() {
      std::fflush(stdout);
      dup2(saved, 1);
      close(saved);
    }
  } restore{saved};
  return fn();
}

std::vector<nlohmann::json> read_metrics(const fs::path& dump) {
  std::vector<nlohmann::json> records;
  std::ifstream f(dump / "metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

const nlohmann::json* record_of(const std::vector<nlohmann::json>& records, int64_t step) {
  for (auto& r : records)
    if (r.at("step").get<int64_t>() == step) return &r;
  return nullptr;
}

// The Hugging Face folder the job loads its weights from (empty: it does not load one).
fs::path hf_checkpoint_of(const train::JobConfig& c) {
  if (!c.checkpoint.initial_load_in_hf) return {};
  return c.checkpoint.initial_load_path.empty() ? fs::path(c.model.hf_assets_path)
                                                : fs::path(c.checkpoint.initial_load_path);
}

// A fixed batch of token ids (no tokenizer needed: the model rows work on any checkpoint).
std::pair<Tensor, Tensor> fixed_batch(int64_t vocab) {
  const int64_t B = 2, S = 32;
  std::vector<int64_t> ids(B * (S + 1));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& id : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    id = int64_t(x % uint64_t(vocab));
  }
  std::vector<int64_t> in, tgt;
  for (int64_t b = 0; b < B; ++b) {
    in.insert(in.end(), ids.begin() + b * (S + 1), ids.begin() + b * (S + 1) + S);
    tgt.insert(tgt.end(), ids.begin() + b * (S + 1) + 1, ids.begin() + (b + 1) * (S + 1));
  }
  return {Tensor::from_vector(in, {B, S}), Tensor::from_vector(tgt, {B, S})};
}

double loss_on(qwen3::Qwen3Model& m, const std::pair<Tensor, Tensor>& batch) {
  autograd::NoGradGuard no_grad;
  return m.forward_loss(batch.first, batch.second).ce_loss.item();
}

bool bytes_equal(const io::TensorInfo& a, const io::TensorInfo& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// A source tensor in another dtype than the export's (a checkpoint of mixed dtypes exports in one):
// equal when every value is exactly the same number (bf16 or f16 widen to f32 exactly).
bool values_equal(const io::TensorInfo& a, const io::TensorInfo& b) {
  if (a.shape != b.shape || a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (load_element(a.data, a.dtype, i) != load_element(b.data, b.dtype, i)) return false;
  return true;
}

Row versions_row() {
  auto v = train::collect_versions();
  return {"versions", "PASS", "titan " + std::string(train::titan_git_describe()) + "; " + std::to_string(v.size()) +
                                  " components (titan version)",
          "recorded in the log and every checkpoint"};
}

// The launcher's world against the configured mesh, and every rank answering: an all-gather of
// each rank's host name over the world (a rank that does not answer within the start-up bound,
// comm.init_timeout_seconds or comm.timeout_seconds makes it an error naming the collective).
Row ranks_row(const train::JobConfig& c, dist::Communicator& world) {
  const std::string rule = "the launcher's world size = replicate x shard, and every rank answers";
  try {
    c.validate(world.size());
    const dist::ParallelPlan plan(world, c.parallelism.data_parallel_replicate_degree,
                                  c.parallelism.shard_degree(world.size()),
                                  c.parallelism.expert_parallel_degree);
    const std::vector<std::string> hosts = plan.host_names();
    std::map<std::string, int> per_host;
    for (const std::string& h : hosts) ++per_host[h];
    std::string where;
    for (const auto& [host, n] : per_host) where += (where.empty() ? "" : ", ") + host + " x" + std::to_string(n);
    const std::string answered = std::to_string(hosts.size()) + " of " + std::to_string(world.size()) +
                                 " ranks answered (" + where + "); " + plan.describe();
    return {"ranks", "PASS",
            world.size() == 1 ? answered : answered + "; the rows below run on rank 0 alone, as one process", rule};
  } catch (const Error& e) {
    return {"ranks", "FAIL", error_for_the_user(e.what()), rule};
  }
}

// Why the model rows have nothing to check when the job loads no Hugging Face folder; `resumes`:
// the checkpoint of the job's own that titan train would resume (the resume row's), if any.
std::string no_hf_checkpoint(const train::JobConfig& c, const std::optional<fs::path>& resumes) {
  if (resumes && *resumes == fs::path(c.checkpoint.initial_load_path))  // initial_load_model_only = false
    return "the job goes on from the training state in " + resumes->string() +
           " (checkpoint.initial_load_path; resume row), not from a Hugging Face folder";
  if (resumes)
    return "the job resumes from its own checkpoint " + resumes->string() +
           " (resume row), not from a Hugging Face folder";
  return c.checkpoint.initial_load_path.empty()
             ? "the job starts from a random init (no checkpoint to load)"
             : "the job loads a native checkpoint (its manifest's checksums are verified on load)";
}

// The checkpoint's tensors against its config.json; `model` is left loaded for the export row.
Row model_row(const train::JobConfig& c, const fs::path& dir, const std::optional<fs::path>& resumes,
              std::unique_ptr<qwen3::Qwen3Model>& model) {
  const std::string rule = "config.json's parameter count = the file's; every tensor present, none extra; one "
                           "dtype, config.json's";
  if (dir.empty()) return {"model", "SKIP", no_hf_checkpoint(c, resumes), rule};
  try {
    // Names every missing, unexpected or mis-shaped key.
    model = qwen3::load_hf_model(dir, DType::F32, Device::CPU, qwen3::Purpose::Inference);
  } catch (const Error& e) {
    return {"model", "FAIL", error_for_the_user(e.what()), rule};
  }
  const auto& a = model->args();
  io::HfCheckpoint ckpt = io::HfCheckpoint::open(dir);
  const std::string want_name =
      qwen3::hf_config_weights_dtype(io::read_json_file(dir / "config.json", "titan check"));
  std::set<std::string> dtypes;
  int64_t in_file = 0;
  for (auto& k : ckpt.keys()) {
    dtypes.insert(std::string(dtype_name(ckpt.at(k).dtype)));
    in_file += ckpt.at(k).numel();
  }
  std::string head = a.tie_embeddings ? "lm_head absent (tied)" : "lm_head present";
  if (a.tie_embeddings && ckpt.contains("lm_head.weight")) {
    // A tied checkpoint may still carry the head, equal to the embedding (the load above refuses
    // one that differs); it is not counted.
    in_file -= ckpt.at("lm_head.weight").numel();
    head = "lm_head present and equal to the embedding (tied)";
  }
  const DType want = want_name == "bfloat16" ? DType::BF16 : want_name == "float16" ? DType::F16 : DType::F32;
  const std::string value = std::to_string(a.num_params()) + " parameters in config.json, " + std::to_string(in_file) +
                            " in " + std::to_string(ckpt.size()) + " tensors; dtypes " +
                            [&] {
                              std::string s;
                              for (auto& d : dtypes) s += (s.empty() ? "" : ", ") + d;
                              return s;
                            }() +
                            " (config.json: " + want_name + "); " + head;
  const bool ok = in_file == a.num_params() && dtypes.size() == 1 && *dtypes.begin() == dtype_name(want);
  return {"model", ok ? "PASS" : "FAIL", value, rule};
}

Row export_row(const train::JobConfig& c, const fs::path& dir, const std::optional<fs::path>& resumes,
               qwen3::Qwen3Model* model, const fs::path& work) {
  const std::string rule =
      "export, reload: the same keys (tied head absent), every tensor bit-equal in the "
      "source dtype (value-equal where the source mixes dtypes), the same loss";
  if (dir.empty()) return {"export", "SKIP", no_hf_checkpoint(c, resumes), rule};
  if (!model) return {"export", "FAIL", "the checkpoint did not load (see the model row)", rule};
  try {
    io::HfCheckpoint src = io::HfCheckpoint::open(dir);
    const DType src_dtype = src.at("model.embed_tokens.weight").dtype;
    // titan exports float32 or bfloat16: a float16 checkpoint is exported as float32 (exact) and
    // compared value for value.
    const DType dtype = src_dtype == DType::F16 ? DType::F32 : src_dtype;
    TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "the checkpoint's dtype ", dtype_name(dtype),
                " cannot be exported (float32 or bfloat16)");
    const fs::path out = work / "export";
    qwen3::export_hf_model(*model, out, dtype, {}, /*overwrite=*/true);
    io::HfCheckpoint exp = io::HfCheckpoint::open(out);
    std::set<std::string> src_keys, exp_keys;
    for (auto& k : src.keys()) src_keys.insert(k);
    for (auto& k : exp.keys()) exp_keys.insert(k);
    if (model->args().tie_embeddings) src_keys.erase("lm_head.weight");  // checked equal to the embedding above
    if (src_keys != exp_keys)
      return {"export", "FAIL",
              "keys differ: source " + std::to_string(src_keys.size()) + ", export " + std::to_string(exp_keys.size()),
              rule};
    for (auto& k : exp_keys) {
      const io::TensorInfo &s = src.at(k), &e = exp.at(k);
      if (s.dtype == e.dtype ? !bytes_equal(s, e) : !values_equal(s, e))
        return {"export", "FAIL",
                "'" + k + "' is not " +
                    (s.dtype == e.dtype
                         ? std::string("bit-equal")
                         : "value-equal (" + std::string(dtype_name(s.dtype)) + " in the source, " +
                               std::string(dtype_name(e.dtype)) + " in the export)"),
                rule};
    }
    auto reloaded = qwen3::load_hf_model(out, DType::F32, Device::CPU, qwen3::Purpose::Inference);
    const auto batch = fixed_batch(model->args().vocab_size);
    const double a = loss_on(*model, batch), b = loss_on(*reloaded, batch);
    const std::string value = std::to_string(exp_keys.size()) + " tensors " +
                              (src_dtype == dtype ? "bit-equal (" + std::string(dtype_name(dtype))
                                                  : "value-equal (" + std::string(dtype_name(src_dtype)) +
                                                        " exported as " + std::string(dtype_name(dtype))) +
                              "); loss " + fmt("%.6f", a) + " vs " + fmt("%.6f", b) +
                              " on a fixed 2 x 32 batch";
    return {"export", a == b ? "PASS" : "FAIL", value, rule};
  } catch (const Error& e) {
    return {"export", "FAIL", error_for_the_user(e.what()), rule};
  }
}

Row kernels_row(const train::JobConfig& c) {
  const std::string rule = "every [kernels] substitution matches the reference, forward and backward (f32, bf16)";
  if (c.kernels.empty()) return {"kernels", "SKIP", "the config substitutes no kernel", rule};
  // First what `titan train` checks before any compute: known op and variant, a kernel for the
  // job's device and dtype, a pattern that matches a module running the op.
  try {
    kernels::plan_substitutions(
        c.kernels, qwen3::module_ops(train::resolve_model_args(c), c.parallelism.expert_parallel_degree > 1),
        train::resolve_device(c), train::resolve_compute_dtype(c));
  } catch (const Error& e) {
    return {"kernels", "FAIL", error_for_the_user(e.what()), rule};
  }
  std::set<std::pair<std::string, std::string>> chosen;
  for (auto& s : c.kernels) chosen.insert({s.op, s.variant});
  int compared = 0;
  std::string worst;
  for (auto& [op, variant] : chosen) {
    kernels::ParityOptions o;
    o.op = op;
    o.dtypes = {DType::F32, DType::BF16};
    int mine = 0;
    for (auto& r : kernels::run_parity(o)) {
      if (r.variant != variant) continue;
      ++mine;
      if (r.status == kernels::ParityStatus::Pass) ++compared;
      else if (worst.empty()) worst = kernels::format_parity_result(r);
    }
    if (mine == 0 && worst.empty()) worst = op + "/" + variant + ": no parity comparison ran";
  }
  if (!worst.empty()) return {"kernels", "FAIL", worst, rule};
  std::string names;
  for (auto& [op, variant] : chosen) names += (names.empty() ? "" : ", ") + op + "=" + variant;
  return {"kernels", "PASS", names + ": " + std::to_string(compared) + " comparisons pass", rule};
}

// What `titan train` would resume from in the job's own checkpoint folder, against the job: the
// checks a resume makes before it reads any tensor (the checkpoint opened as titan train opens it:
// its manifest, every file present at the size the manifest lists, the step and layout; then the
// model the checkpoint was trained as, the window length its data position counts). The checksums,
// which read the whole checkpoint, are left to titan train. `resumes` is set to the checkpoint
// titan train would resume, whether or not it passes.
Row resume_row(const train::JobConfig& c, std::optional<fs::path>& resumes) {
  const std::string rule =
      "a checkpoint the job would resume opens as titan train opens it (every file at its manifest size) "
      "and was trained as this job's model and sequence length, on its tokenizer and data (or data that "
      "only grew)";
  try {
    // titan train's own Checkpointer (one process, as the rows below run): its refusals (checkpoints
    // a run with checkpointing off would not keep apart, a damaged newest one, a load_step not
    // committed) and the step it would resume.
    const std::unique_ptr<dist::Communicator> one = dist::single_process_communicator();
    const dist::ParallelPlan plan(*one, 1, 1);
    const train::Checkpointer checkpointer(c, plan);
    resumes = checkpointer.resume_dir();
    if (!resumes)
      return {"resume", "SKIP",
              "'" + checkpointer.folder().string() + "' holds no checkpoint to resume: the job starts fresh",
              rule};
    const fs::path dir = *resumes;
    const train::LoadedCheckpoint opened = checkpointer.open_resume_dir(train::ChecksumShare::none());
    const nlohmann::json& ts = opened.train_state;
    TITAN_CHECK(ts.is_object() && ts.contains("model_config"), "'", (dir / "train_state.json").string(),
                "' is not a titan train state (no model_config)");
    train::check_same_model_config(ts["model_config"], train::resolve_model_args(c), dir.string());
    const std::string files = "; every file at its manifest size (titan train verifies the checksums)";
    // A seed (step 0) resumes as weights only: its data position is not read.
    if (ts.value("step", int64_t(-1)) == 0)
      return {"resume", "PASS",
              "titan train starts from the seed checkpoint " + dir.string() + ": same model" + files, rule};
    // The data the position counts: the same tokenizer and dataset (or one that only grew), as
    // titan train checks them before it reads the position.
    const train::ResolvedJob job = train::resolve_job(c, plan);
    std::string data =
        train::check_same_tokenizer(ts, job.tokenizer_path, c.checkpoint.restart_data_stream, dir.string());
    if (!c.checkpoint.restart_data_stream) {
      const data::DatasetComparison compared =
          train::check_resumable_dataset(ts, data::dataset_identity(job.dataset_files), dir.string());
      data = compared.growth.empty() ? "same data" : "the same data, grown: " + compared.growth;
      if (ts.contains("dataloader"))
        train::check_same_seq_len(ts["dataloader"], c.training.seq_len, dir.string());
    }
    // Resumable, and still a job that would train nothing: said, as titan train says it.
    const int64_t step = ts.value("step", int64_t(0));
    const std::string left =
        step >= c.training.steps
            ? "; step " + std::to_string(step) +
                  " is already at or past training.steps = " + std::to_string(c.training.steps) +
                  ": titan train would train nothing (raise training.steps to go on)"
            : "";
    return {"resume", "PASS",
            "titan train resumes from " + dir.string() + ": same model, " +
                (c.checkpoint.restart_data_stream
                     ? "the data from its beginning (checkpoint.restart_data_stream)" +
                           (data.empty() ? "" : "; " + data)
                     : "same sequence length, " + data) +
                files + left,
            rule};
  } catch (const Error& e) {
    return {"resume", "FAIL", error_for_the_user(e.what()), rule};
  }
}

int check_main(int argc, char** argv) {
  JobArgs a = parse_job_args("check", argc, argv, {"json", "steps", "workdir"});
  if (a.help) {
    std::printf(
        "usage: titan check --config FILE.toml [--section.key=value ...] [--json FILE] [--steps N] "
        "[--workdir DIR]\n"
        "Runs the pilot checklist for the job the config describes and prints one PASS/FAIL/SKIP row per\n"
        "check (exit status 1 on any FAIL): versions, ranks, resume, model, export, loaded vs random, "
        "kernels,\n"
        "timing, checkpoint. --steps: training steps of the timing run (default 3, at least 2);\n"
        "--json: also write the rows to FILE; --workdir: where the runs write (default: a temporary\n"
        "folder, removed unless a check fails). See docs/training.md.\n");
    return 0;
  }
  // At least 2: a warm-up step and a sustained one.
  const int64_t steps = a.own.count("steps") ? parse_int_option("check", "steps", a.own["steps"], 2) : 3;
  const train::JobConfig cfg = train::load_job_config(a.config, a.overrides);
  // MPI when started by mpirun / srun: every rank answers the ranks row; the other rows run on rank 0.
  const std::unique_ptr<dist::Communicator> world = dist::launch_communicator(cfg.comm.init_timeout());
  Row ranks = ranks_row(cfg, *world);
  if (world->rank() != 0) return ranks.status == "FAIL" ? 1 : 0;
  fs::path work;
  if (a.own.count("json")) {  // checked before the runs, not found out after them
    io::check_output_file(a.own["json"], {a.config}, "titan check --json");
  }
  if (a.own.count("workdir")) {
    work = a.own["workdir"];
    // The runs resume from whatever a folder holds: a reused one would report its old figures.
    TITAN_CHECK(!fs::exists(work) || (fs::is_directory(work) && fs::is_empty(work)),
                "titan check: --workdir '", work.string(),
                "' is not an empty folder; the check's runs would resume from what it holds (give "
                "a new or empty folder)");
    std::error_code ec;
    fs::create_directories(work, ec);
    TITAN_CHECK(!ec, "titan check: --workdir '", work.string(), "' cannot be created (", ec.message(),
                "); give a folder that can be written");
  } else {
    std::string tmpl = (fs::temp_directory_path() / "titan-check-XXXXXX").string();
    TITAN_CHECK(mkdtemp(tmpl.data()), "titan check: cannot create a temporary folder");
    work = tmpl;
  }

  std::vector<Row> rows;
  auto add = [&](Row r) {
    std::printf("%-4s  %-14s %s\n", r.status.c_str(), r.check.c_str(), r.value.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  add(versions_row());
  add(std::move(ranks));
  std::optional<fs::path> resumes;
  const Row resume = resume_row(cfg, resumes);
  add(resume);
  const fs::path hf = hf_checkpoint_of(cfg);
  std::unique_ptr<qwen3::Qwen3Model> loaded;
  // A job that resumes its own checkpoint does not load the starting weights these rows check: say
  // whose weights they are, so a PASS is not read as the resumed model's.
  auto starting_weights = [&](Row r) {
    // (The resume row passes only where titan train starts from a checkpoint of the job's own: one
    // it resumes, or a seed.)
    if (!hf.empty() && resume.status == "PASS")
      r.value +=
          "; these are the job's starting weights, which titan train does not load now: it starts from "
          "its own checkpoint (resume row)";
    return r;
  };
  add(starting_weights(model_row(cfg, hf, resumes, loaded)));
  add(starting_weights(export_row(cfg, hf, resumes, loaded.get(), work)));
  loaded.reset();

  // The training runs: U = the job as configured for `steps` steps (checkpoints at steps-1 and
  // steps), Z = one step from a random init, R = resume U's step steps-1 and take one more step.
  const int64_t warmup = std::min(cfg.lr_scheduler.warmup_steps, steps);
  auto job = [&](const fs::path& dump, Overrides extra) {
    Overrides o = a.overrides;
    for (auto& kv : Overrides{{"job.dump_folder", dump.string()},
                              {"training.steps", std::to_string(steps)},
                              {"training.deterministic", "true"},
                              {"lr_scheduler.warmup_steps", std::to_string(warmup)},
                              {"metrics.log_freq", "1"},
                              {"metrics.enable_tensorboard", "false"},
                              {"validation.enable", "false"},
                              {"checkpoint.enable", "true"},
                              {"checkpoint.folder", "checkpoint"},
                              {"checkpoint.interval", std::to_string(steps - 1)},
                              {"checkpoint.interval_type", "steps"},
                              {"checkpoint.keep_latest_k", "0"},
                              {"checkpoint.last_save_in_hf", "false"},
                              // The runs train and save from the job's starting weights, whatever
                              // its one-off checkpoint modes (a seed, no saves, a fork, exclusions).
                              {"checkpoint.create_seed_checkpoint", "false"},
                              {"checkpoint.load_only", "false"},
                              {"checkpoint.load_step", "-1"},
                              {"checkpoint.initial_load_model_only", "true"},
                              {"checkpoint.exclude_from_loading", ""}})
      o.push_back(kv);
    if (world->size() > 1)  // the ranks row checked the mesh; the runs below are rank 0's alone (its
                            // experts whole: a degree of expert parallelism needs as many ranks)
      o.insert(o.end(), {{"parallelism.data_parallel_replicate_degree", "1"},
                         {"parallelism.data_parallel_shard_degree", "-1"},
                         {"parallelism.expert_parallel_degree", "1"}});
    o.insert(o.end(), extra.begin(), extra.end());
    return train::load_job_config(a.config, o);
  };
  const fs::path u_dump = work / "run", z_dump = work / "random", r_dump = work / "resume";
  std::string u_error;
  train::TrainSummary u;
  try {
    u = with_stdout_to(work / "run.log", [&] { return train::run_training(job(u_dump, {})); });
  } catch (const Error& e) {
    u_error = error_for_the_user(e.what()) + " (log: " + (work / "run.log").string() + ")";
  }
  const auto u_metrics = u_error.empty() ? read_metrics(u_dump) : std::vector<nlohmann::json>{};

  {
    const std::string rule = "first-step loss, same batch: loaded < random init - 0.5";
    if (hf.empty() && cfg.checkpoint.initial_load_path.empty()) {
      add({"loaded/random", "SKIP", no_hf_checkpoint(cfg, resumes), rule});
    } else if (!u_error.empty()) {
      add({"loaded/random", "FAIL", u_error, rule});
    } else {
      try {
        with_stdout_to(work / "random.log", [&] {
          return train::run_training(job(z_dump, {{"training.steps", "1"},
                                                  {"lr_scheduler.warmup_steps", std::to_string(std::min<int64_t>(warmup, 1))},
                                                  {"checkpoint.enable", "false"},
                                                  {"checkpoint.initial_load_in_hf", "false"},
                                                  {"checkpoint.initial_load_path", ""}}));
        });
        const double loaded_loss = record_of(u_metrics, 1)->at("loss"), random_loss = read_metrics(z_dump).at(0).at("loss");
        add({"loaded/random", loaded_loss < random_loss - 0.5 ? "PASS" : "FAIL",
             "loaded " + fmt("%.4f", loaded_loss) + " vs random init " + fmt("%.4f", random_loss), rule});
      } catch (const Error& e) {
        add({"loaded/random", "FAIL", error_for_the_user(e.what()), rule});
      }
    }
  }
  add(kernels_row(cfg));
  {
    const std::string rule = "reported: the warm-up step apart from the sustained ones";
    if (!u_error.empty()) {
      add({"timing", "FAIL", u_error, rule});
    } else {
      const auto& w = *record_of(u_metrics, 1);
      add({"timing", "PASS",
           "warm-up step " + fmt("%.2f s", w.at("step_seconds")) + " (" + fmt("%.0f tokens/s", w.at("tps")) +
               "); sustained " + fmt("%.0f tokens/s", u.sustained_tps) + ", MFU " +
               (u.sustained_mfu >= 0 ? fmt("%.2f%%", u.sustained_mfu) : std::string("n/a")) + " over " +
               std::to_string(steps - 1) + (steps == 2 ? " step" : " steps"),
           rule});
    }
  }
  {
    const std::string rule = "save at step " + std::to_string(steps - 1) +
                             ", reload, one more step: loss and saved weights and moments bit-equal to the "
                             "uninterrupted run's; the job's dump and checkpoint folders can be written";
    if (!u_error.empty()) {
      add({"checkpoint", "FAIL", u_error, rule});
    } else {
      try {
        const std::string prev = "step-" + std::to_string(steps - 1), last = "step-" + std::to_string(steps);
        fs::create_directories(r_dump / "checkpoint");
        fs::copy(u_dump / "checkpoint" / prev, r_dump / "checkpoint" / prev, fs::copy_options::recursive);
        with_stdout_to(work / "resume.log", [&] { return train::run_training(job(r_dump, {})); });
        const auto r_metrics = read_metrics(r_dump);
        const auto* ru = record_of(u_metrics, steps);
        const auto* rr = record_of(r_metrics, steps);
        TITAN_CHECK(ru && rr, "no record of step ", steps, " (logs in ", work.string(), ")");
        bool same_files = true;
        for (const char* f : {"model-rank0.safetensors", "optimizer-rank0.safetensors"})
          same_files &= train::file_checksum(u_dump / "checkpoint" / last / f) ==
                        train::file_checksum(r_dump / "checkpoint" / last / f);
        const double lu = ru->at("loss"), lr = rr->at("loss");
        // The job's own folders: the runs above wrote elsewhere.
        std::string folders = "; the job's folders can be written";
        bool folders_ok = true;
        std::vector<std::pair<std::string, fs::path>> own = {{"job.dump_folder", cfg.job.dump_folder}};
        if (cfg.checkpoint.enable) own.push_back({"checkpoint.folder", train::checkpoint_folder_of(cfg)});
        for (const auto& [key, folder] : own)
          // The check's runs wrote under its work folder: the job's own folders are probed with
          // titan train's start-up probe (io::unwritable_reason).
          if (const std::string why = io::unwritable_reason(folder); !why.empty()) {
            folders = (folders_ok ? std::string("; ") : folders + ", ") + key + ": '" + folder.string() +
                      "' cannot be written (" + why + ")";
            folders_ok = false;
          }
        add({"checkpoint", lu == lr && same_files && folders_ok ? "PASS" : "FAIL",
             "step " + std::to_string(steps) + " loss " + fmt("%.6f", lu) + " uninterrupted vs " +
                 fmt("%.6f", lr) + " resumed; weights and moments " + (same_files ? "bit-equal" : "DIFFER") +
                 folders,
             rule});
      } catch (const Error& e) {
        add({"checkpoint", "FAIL", error_for_the_user(e.what()), rule});
      }
    }
  }

  int failures = 0;
  for (auto& r : rows) failures += r.status == "FAIL";
  std::printf("\ncheck   status  rule\n");
  for (auto& r : rows) std::printf("%-14s %-4s  %s\n", r.check.c_str(), r.status.c_str(), r.rule.c_str());
  if (a.own.count("json")) {
    nlohmann::json j = {{"config", a.config}, {"failures", failures}, {"rows", nlohmann::json::array()},
                        {"versions", train::versions_json(train::collect_versions())}};
    for (auto& r : rows)
      j["rows"].push_back({{"check", r.check}, {"status", r.status}, {"value", r.value}, {"rule", r.rule}});
    io::write_file_atomic(a.own["json"], j.dump(2) + "\n");  // an unwritable path is an error, not a silence
  }
  if (failures == 0 && !a.own.count("workdir")) fs::remove_all(work);
  std::printf("titan check: %d of %zu checks failed%s\n", failures, rows.size(),
              failures ? (" (runs and logs kept in " + work.string() + ")").c_str() : "");
  return failures ? 1 : 0;
}

TITAN_COMMAND_ACROSS_RANKS(
    "check",
    "the pilot checklist for a job config: versions, model, export, loss, kernels, timing, "
    "checkpoint",
    check_main);

}  // namespace
}  // namespace titan::cli

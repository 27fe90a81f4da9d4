#include "titan/train/checkpointer.h"

#include <chrono>
#include <cmath>

#include "titan/core/check.h"
#include "titan/data/data_identity.h"
#include "titan/models/qwen3/checkpoint_layout.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/log.h"
#include "titan/train/metrics.h"
#include "titan/train/resume_guard.h"
#include "titan/train/versions.h"

namespace titan::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Every f32 master weight and optimizer moment is finite: a checkpoint must never hold NaN/Inf.
bool all_finite(const std::vector<io::TensorWrite>& tensors, std::string* bad) {
  for (auto& t : tensors) {
    const float* p = static_cast<const float*>(t.data);
    const int64_t n = shape_numel(t.shape);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) {
        *bad = t.name;
        return false;
      }
  }
  return true;
}

}  // namespace

Checkpointer::Checkpointer(const JobConfig& c, const dist::ParallelPlan& plan)
    : config_(c),
      plan_(plan),
      // One consolidated set of files (the *-rank0 files), written by the logging rank.
      manager_(fs::path(c.job.dump_folder) / c.checkpoint.folder, c.checkpoint.keep_latest_k, 0),
      resume_step_(c.checkpoint.enable ? manager_.latest_step() : std::nullopt),
      last_saved_step_(resume_step_.value_or(-1)) {}

void Checkpointer::restore(TrainState& s) const {
  TITAN_CHECK(resume_step_, "checkpoint: nothing to resume from in '", folder().string(), "'");
  auto t0 = Clock::now();
  LoadedCheckpoint c = manager_.load(*resume_step_);
  check_same_model_config(c.train_state.at("model_config"), s.model.args(), c.dir.string());
  qwen3::restore_parameters(c.model, s.model);
  // The file holds whole blocks; this rank keeps its slice of each moment.
  for (auto [moments, prefix] :
       {std::pair{&s.optimizer.exp_avg(), "exp_avg."}, {&s.optimizer.exp_avg_sq(), "exp_avg_sq."}}) {
    std::vector<Tensor> full;
    for (auto& b : s.model.blocks()) full.push_back(Tensor::zeros({b.numel()}, DType::F32));
    qwen3::restore_layout_tensors(c.optimizer, s.model, full, prefix);
    for (size_t b = 0; b < full.size(); ++b) (*moments)[b].copy_from(plan_.local(full[b]));
  }
  const auto& ts = c.train_state;
  s.step = ts.at("step").get<int64_t>();
  s.tokens_seen = ts.at("tokens_seen").get<int64_t>();
  std::string diff = s.schedule.diff_state(ts.at("lr_scheduler"));
  if (!diff.empty()) say("warning: the LR schedule differs from the checkpoint's: %s", diff.c_str());
  const int saved_world = ts.at("world_size").get<int>();
  if (saved_world != plan_.world_size())
    say("resharding: the checkpoint was written by %d ranks, this run has %d", saved_world,
        plan_.world_size());
  const std::string data_note = restore_data_position(s.loader, ts, data::dataset_identity(s.loader.files()),
                                                      config_.checkpoint.restart_data_stream, c.dir.string());
  if (!data_note.empty()) say("%s", data_note.c_str());
  if (ts.contains("expert_bias"))
    s.model.set_expert_bias_values(ts["expert_bias"].get<std::vector<std::vector<double>>>());
  say("resumed from %s (step %ld, %ld tokens seen) in %.1f s", c.dir.string().c_str(), long(s.step),
      long(s.tokens_seen), seconds_since(t0));
}

void Checkpointer::save(TrainState& s, const ResolvedJob& job) {
  auto t0 = Clock::now();
  // Every rank takes part in assembling whole blocks; the logging rank writes them.
  s.sharding.gather_all();
  std::vector<Tensor> exp_avg, exp_avg_sq;
  for (size_t b = 0; b < s.model.blocks().size(); ++b) {
    exp_avg.push_back(plan_.gather_full(s.optimizer.exp_avg()[b]));
    exp_avg_sq.push_back(plan_.gather_full(s.optimizer.exp_avg_sq()[b]));
  }
  std::vector<io::TensorWrite> model_t = qwen3::parameter_tensors(s.model);
  std::vector<io::TensorWrite> opt_t = qwen3::layout_tensors(s.model, exp_avg, "exp_avg.");
  for (auto& t : qwen3::layout_tensors(s.model, exp_avg_sq, "exp_avg_sq.")) opt_t.push_back(t);
  std::string bad;
  TITAN_CHECK(all_finite(model_t, &bad) && all_finite(opt_t, &bad), "step ", s.step, ": '", bad,
              "' holds non-finite values; no checkpoint written (lower optimizer.lr?)");
  const auto& c = config_;
  nlohmann::json ts;
  ts["step"] = s.step;
  ts["tokens_seen"] = s.tokens_seen;
  ts["model_config"] = qwen3::hf_config_from_args(job.args, "float32");
  ts["route"] = c.model.name;
  ts["tokenizer_path"] = fs::absolute(job.tokenizer_path).string();
  ts["lr_scheduler"] = s.schedule.state_dict();
  ts["dataloader"] = s.loader.state();
  ts["dataset_identity"] = data::dataset_identity(s.loader.files());
  ts["rng"] = {{"seed", c.training.seed}};  // no random state is consumed after initialisation
  ts["world_size"] = plan_.world_size();
  ts["mesh"] = {{"dp_replicate", plan_.dp_replicate()},
                {"dp_shard", plan_.dp_shard()},
                {"tp", c.parallelism.tensor_parallel_degree},
                {"ep", c.parallelism.expert_parallel_degree}};
  if (!s.model.expert_bias().empty()) ts["expert_bias"] = s.model.expert_bias_values();
  ts["versions"] = versions_json(collect_versions());
  if (plan_.is_logging_rank()) manager_.save(s.step, model_t, opt_t, ts);
  s.sharding.release_all();  // model_t pointed into the gathered blocks
  // No rank runs ahead of (or exits before) the commit.
  plan_.barrier();
  last_saved_step_ = s.step;
  say("checkpoint: saved %s in %.1f s", manager_.step_dir(s.step).string().c_str(), seconds_since(t0));
}

void Checkpointer::export_hf(TrainState& s, const ResolvedJob& job) const {
  s.sharding.gather_all();
  if (!plan_.is_logging_rank()) {
    s.sharding.release_all();
    return plan_.barrier();
  }
  auto t0 = Clock::now();
  fs::path out = folder() / ("step-" + std::to_string(s.step) + "-hf");
  std::vector<fs::path> tok_files;
  fs::path tok_dir =
      fs::is_directory(job.tokenizer_path) ? job.tokenizer_path : job.tokenizer_path.parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(tok_dir / f)) tok_files.push_back(tok_dir / f);
  const DType export_dtype = config_.checkpoint.export_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  {
    uint64_t total = 0;
    for (auto& r : qwen3::hf_tensors(s.model))
      total += uint64_t(shape_numel(r.shape)) * dtype_size(export_dtype);
    Progress progress("export: writing " + out.string(), total, [&] { return bytes_in_temporaries_of(out); });
    qwen3::export_hf_model(s.model, out, export_dtype, tok_files, /*overwrite=*/true);
  }
  say("export: wrote Hugging Face checkpoint %s (%s) in %.1f s", out.string().c_str(),
      config_.checkpoint.export_dtype.c_str(), seconds_since(t0));
  s.sharding.release_all();
  plan_.barrier();
}

}  // namespace titan::train

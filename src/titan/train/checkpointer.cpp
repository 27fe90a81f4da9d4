#include "titan/train/checkpointer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <system_error>
#include <thread>

#include "titan/core/check.h"
#include "titan/data/data_identity.h"
#include "titan/data/tokenizer.h"
#include "titan/models/qwen3/checkpoint_layout.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint_blocks.h"
#include "titan/train/hf_export.h"
#include "titan/train/log.h"
#include "titan/train/metrics.h"
#include "titan/train/native_model.h"
#include "titan/train/resume_guard.h"
#include "titan/train/validation.h"
#include "titan/train/versions.h"

namespace titan::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

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

// The temporary folder rank 0 began the save in, on every rank.
fs::path folder_of_rank0(const dist::ParallelPlan& plan, const fs::path& on_rank0) {
  return dist::broadcast_text(plan.world(), on_rank0.string(), 0);
}

// The shard files every rank wrote (none for the ranks of other replicas), on every rank.
std::vector<CheckpointFile> files_of_all_ranks(const dist::ParallelPlan& plan, int64_t shard,
                                               const std::vector<CheckpointFile>& mine) {
  // Per rank: shard (-1: wrote nothing), then bytes and checksum of its model and optimizer file.
  constexpr int64_t kFields = 5;
  std::vector<int64_t> record(kFields, -1);
  if (!mine.empty()) {
    TITAN_CHECK(mine.size() == 2, "checkpoint: a shard is one model and one optimizer file");
    record = {shard, int64_t(mine[0].bytes), int64_t(mine[0].checksum), int64_t(mine[1].bytes),
              int64_t(mine[1].checksum)};
  }
  std::vector<int64_t> all(size_t(kFields * plan.world_size()));
  plan.world().all_gather(record.data(), all.data(), kFields, DType::I64, dist::host_context());
  std::vector<CheckpointFile> files;
  for (int r = 0; r < plan.world_size(); ++r) {
    const int64_t* f = all.data() + size_t(r) * kFields;
    if (f[0] < 0) continue;
    files.push_back({shard_file_name("model", f[0]), uint64_t(f[1]), uint64_t(f[2])});
    files.push_back({shard_file_name("optimizer", f[0]), uint64_t(f[3]), uint64_t(f[4])});
  }
  return files;
}

// How a resume keeps the checkpoint's global batch of `saved` sequences with a local batch of
// `local` on `dp` data-parallel ranks: only a multiple of local x dp is a valid
// training.global_batch_size (JobConfig::validate), so the setting offered must be one.
std::string keeping_the_global_batch(int64_t saved, int64_t local, int64_t dp) {
  const std::string keep = "training.global_batch_size = " + std::to_string(saved);
  if (saved % (local * dp) == 0) return "set " + keep + " to keep it";
  if (const int64_t smaller = local_batch_for_global(saved, local, dp); smaller > 0) {
    // A smaller local batch that divides the checkpoint's share per rank (the largest, for speed).
    return "training.global_batch_size must be a multiple of local_batch_size x data-parallel ranks = " +
           std::to_string(local) + " x " + std::to_string(dp) + " = " + std::to_string(local * dp) +
           ": set training.local_batch_size = " + std::to_string(smaller) + " and " + keep + " to keep it";
  }
  return "it cannot be kept on this mesh: training.global_batch_size must be a multiple of local_batch_size "
         "x data-parallel ranks = " +
         std::to_string(local) + " x " + std::to_string(dp) + " = " + std::to_string(local * dp) + ", and " +
         std::to_string(saved) + " is no multiple of " + std::to_string(dp) +
         " ranks; a mesh whose data-parallel ranks divide " + std::to_string(saved) + " can keep it";
}

}  // namespace

fs::path checkpoint_folder_of(const JobConfig& c) {
  return fs::path(c.job.dump_folder) / c.checkpoint.folder;
}

Checkpointer::Checkpointer(const JobConfig& c, const dist::ParallelPlan& plan)
    : config_(c), plan_(plan), manager_(checkpoint_folder_of(c), c.checkpoint.keep_latest_k) {
  const std::vector<int64_t> committed = manager_.committed_steps();
  auto listed = [](const std::vector<int64_t>& steps) {
    return steps.empty() ? std::string("none") : listed_steps(steps);
  };
  // Checkpoints a run with checkpointing off would neither resume nor keep: a stop by signal saves
  // one even then, and that save (and its pruning) would mix this run's trajectory with theirs.
  TITAN_CHECK(c.checkpoint.enable || committed.empty(), "checkpoint.enable = false, but '", folder().string(),
              "' holds committed checkpoints (steps ", listed(committed),
              ") that this run would neither resume nor keep apart from its own (a stop by signal saves one "
              "even with checkpointing off): set checkpoint.enable = true to resume from step ",
              committed.empty() ? 0 : committed.back(),
              ", or give the run another job.dump_folder (or checkpoint.folder)");
  // A committed checkpoint whose manifest is damaged, newer than what would be resumed: going on would
  // redo its steps from an older one (or from scratch) without a word. With an earlier one to resume
  // from, the user asks for it (checkpoint.load_step: the damaged step is then set aside, as a corrupted
  // file's step is); with none, the damaged folder has to go before the run starts from scratch.
  const bool rolls_back = c.checkpoint.enable && c.checkpoint.load_step != -1;
  for (const fs::path& d : manager_.damaged_step_dirs()) {
    const int64_t step = *step_of_name(d);
    if (rolls_back || (!committed.empty() && step < committed.back())) continue;
    const std::string damaged = "checkpoint: '" + d.string() +
                                "' was committed (COMMITTED) but its manifest.json is missing, unreadable or "
                                "not titan's: the checkpoint is damaged and cannot be verified or loaded";
    TITAN_CHECK(!committed.empty(), damaged, ". Move it out of '", folder().string(),
                "' to resume from scratch instead");
    TITAN_FAIL(damaged, "; if step ", step, " cannot be repaired, the committed steps before it are ",
               listed(committed), ": checkpoint.load_step = ", committed.back(),
               " resumes from the newest of them (step ", step, " is then set aside, not deleted)");
  }
  if (c.checkpoint.enable) resume_step_ = manager_.latest_step();
  if (c.checkpoint.enable && c.checkpoint.load_step != -1) {
    // A roll-back (after a loss spike, say): resume from an earlier checkpoint.
    const int64_t step = c.checkpoint.load_step;
    TITAN_CHECK(std::find(committed.begin(), committed.end(), step) != committed.end(),
                "checkpoint.load_step = ", step, ": '", manager_.step_dir(step).string(),
                "' is not a committed checkpoint (committed steps in '", folder().string(),
                "': ", listed(committed), ")");
    resume_step_ = step;  // restore() sets the later steps aside once it has succeeded (unless load_only)
    // load_only leaves the later steps in place: its export would be written among them, as if one
    // of theirs (in place of theirs, at a step they reached).
    std::vector<int64_t> later;
    for (const int64_t s : committed)
      if (s > step) later.push_back(s);
    TITAN_CHECK(
        !(c.checkpoint.load_only && c.checkpoint.last_save_in_hf && !later.empty()),
        "checkpoint.last_save_in_hf = true with checkpoint.load_only = true and checkpoint.load_step = ",
        step, ": the run's export would be written into '", folder().string(),
        "' beside the later steps it leaves in place (", listed(later),
        "), as if it were theirs; set checkpoint.last_save_in_hf = false, or roll back without "
        "checkpoint.load_only (the later steps are then set aside)");
  }
  last_saved_step_ = resume_step_.value_or(-1);
  if (!resume_step_ && !c.checkpoint.initial_load_path.empty() && !c.checkpoint.initial_load_model_only) {
    fork_dir_ = c.checkpoint.initial_load_path;
    TITAN_CHECK(fs::exists(*fork_dir_ / "COMMITTED"), "checkpoint.initial_load_path: '", fork_dir_->string(),
                "' is not a committed titan checkpoint (no COMMITTED marker), and "
                "checkpoint.initial_load_model_only = false loads a whole training state from it");
  }
}

void Checkpointer::say_ignored_step_dirs(bool trains, bool saves) const {
  for (const fs::path& d : foreign_step_dirs())
    say("checkpoint: ignoring %s: not a checkpoint titan wrote (it is never loaded or deleted)", d.c_str());
  for (const fs::path& d : damaged_step_dirs())
    if (resume_step_ && *step_of_name(d) > *resume_step_)
      say("warning: checkpoint: ignoring %s: committed, but its manifest.json is damaged (never loaded or "
          "deleted; checkpoint.load_step = %ld rolls back before it%s)",
          d.c_str(), long(*resume_step_),
          !trains || config_.checkpoint.load_only ? "; it is left where it is"
                                                  : ", and it is set aside once that restore succeeds");
    else
      say("warning: checkpoint: ignoring %s: committed, but its manifest.json is damaged (never loaded or "
          "deleted; a newer checkpoint is %s)",
          d.c_str(), trains ? "resumed" : "read");
  // Debris goes with a save: this run's next one, or a training run's (eval; a run that saves nothing).
  const char* removal = saves                          ? "the next save removes it"
                        : config_.checkpoint.load_only ? "it stays: checkpoint.load_only saves nothing"
                                                       : "a training run's next save removes it";
  for (const fs::path& d : interrupted_step_dirs())
    say("checkpoint: ignoring %s: a save or a deletion that never finished (no COMMITTED marker); %s",
        d.c_str(), removal);
  for (const fs::path& d : unfinished_saves())
    say("checkpoint: ignoring %s: a save that never finished (the process writing it is gone); %s", d.c_str(),
        removal);
}

std::optional<fs::path> Checkpointer::resume_dir() const {
  if (resume_step_) return manager_.step_dir(*resume_step_);
  return fork_dir_;
}

Checkpointer::LocalSlice Checkpointer::local_slice(TrainState& s, size_t b) const {
  // A sharded plan's blocks are born as this rank's slices (TrainState); unsharded, the slice is
  // the whole block.
  nn::ParamBlock& block = s.model.blocks()[b];
  return {block.shard_begin(), block.shard(), s.optimizer.exp_avg()[b], s.optimizer.exp_avg_sq()[b]};
}

void Checkpointer::restore_progress(TrainState& s, const ResolvedJob& job, const LoadedCheckpoint& c,
                                    bool fresh_optimizer, bool fresh_schedule,
                                    std::vector<std::string>& later) const {
  const auto& ts = c.train_state;
  s.step = ts.at("step").get<int64_t>();
  s.tokens_seen = ts.at("tokens_seen").get<int64_t>();
  s.optimizer_start = fresh_optimizer ? s.step : ts.value("optimizer_start_step", int64_t(0));
  s.schedule_start = fresh_schedule ? s.step : ts.value("lr_scheduler_start_step", int64_t(0));
  if (fresh_optimizer || fresh_schedule)
    later.push_back(formatted(
        "checkpoint.exclude_from_loading: from step %ld on, %s%s%s (every resume with this key starts %s "
        "over again: remove it once this run has saved a checkpoint)",
        long(s.step + 1), fresh_optimizer ? "AdamW's moments and step count start from zero" : "",
        fresh_optimizer && fresh_schedule ? " and " : "",
        fresh_schedule ? "the LR schedule starts over (warmup included)" : "",
        fresh_optimizer && fresh_schedule ? "them" : "it"));
  // A resume with nothing left to train (training.steps at or below the checkpoint's step, as an
  // export-only run) has no schedule to differ: its placeholder of one step is not the user's.
  std::string diff =
      s.step < config_.training.steps && !fresh_schedule ? s.schedule.diff_state(ts.at("lr_scheduler")) : "";
  if (!diff.empty())
    later.push_back(formatted("warning: the LR schedule differs from the checkpoint's: %s", diff.c_str()));
  if (ts.contains("settings"))
    if (const std::string changed =
            changed_settings(recorded_settings(ts), resumable_settings(config_, job.args));
        !changed.empty())
      later.push_back(formatted("note: changed since the checkpoint: %s; the changes apply from step %ld",
                                changed.c_str(), long(s.step + 1)));
  // With global_batch_size = -1 the global batch follows the number of ranks: a resume on another
  // count changes the optimizer's step without a word unless it is said here.
  const int64_t global_batch =
      config_.training.local_batch_size * plan_.dp_size() * accumulation_steps(config_, plan_.dp_size());
  if (ts.contains("global_batch_size") && ts["global_batch_size"].get<int64_t>() != global_batch)
    later.push_back(
        "warning: the global batch is " + std::to_string(global_batch) + " sequences, the checkpoint's was " +
        std::to_string(ts["global_batch_size"].get<int64_t>()) +
        " (local batch x data-parallel ranks x accumulation): each step now averages over another "
        "number of sequences (" +
        keeping_the_global_batch(ts["global_batch_size"].get<int64_t>(), config_.training.local_batch_size,
                                 plan_.dp_size()) +
        ")");
  const int saved_world = ts.at("world_size").get<int>();
  // (Checkpoints before expert parallelism record no "ep": their experts were whole.)
  const int64_t saved_ep = ts.contains("mesh") ? ts["mesh"].value("ep", int64_t(1)) : 1;
  auto split = [](int64_t ep) {
    return ep > 1 ? ", experts split over " + std::to_string(ep) : std::string();
  };
  if (saved_world != plan_.world_size() || int64_t(c.model_files.size()) != plan_.dp_shard() ||
      saved_ep != plan_.ep())
    later.push_back(formatted("resharding: the checkpoint was written by %s (%s%s), this run has %s (%s%s)",
                              counted(saved_world, "rank").c_str(),
                              counted(int64_t(c.model_files.size()), "shard file").c_str(),
                              split(saved_ep).c_str(), counted(plan_.world_size(), "rank").c_str(),
                              counted(plan_.dp_shard(), "shard").c_str(), split(plan_.ep()).c_str()));
  if (const std::string note = check_same_tokenizer(ts, job.tokenizer_path,
                                                    config_.checkpoint.restart_data_stream, c.dir.string());
      !note.empty())
    later.push_back(note);
  for (const std::string& note : restore_data_position(
           s.loader, ts, s.dataset_identity, config_.checkpoint.restart_data_stream, c.dir.string()))
    later.push_back(note);
}

std::string Checkpointer::roll_back_advice() const {
  // Only for the newest step, chosen by the run: an earlier committed one is the way forward, and the
  // user has to ask for it.
  if (!resume_step_ || config_.checkpoint.load_step != -1) return "";
  std::vector<int64_t> earlier;
  for (int64_t step : manager_.committed_steps())
    if (step < *resume_step_) earlier.push_back(step);
  if (earlier.empty()) return "";
  return "; if step " + std::to_string(*resume_step_) +
         " cannot be repaired, the committed steps before it are " + listed_steps(earlier) +
         ": checkpoint.load_step = " + std::to_string(earlier.back()) +
         " resumes from the newest of them (step " + std::to_string(*resume_step_) +
         " is then set aside, not deleted)";
}

LoadedCheckpoint Checkpointer::open_resume_dir(ChecksumShare share) const {
  TITAN_CHECK(resume_dir(), "checkpoint: nothing to resume from in '", folder().string(), "'");
  // Every rank opens its share; one that cannot stops them all with its reason, and the way forward
  // for an unreadable newest step (corrupted, cut short by a full disk) is said once, after the
  // ranks' reasons.
  std::optional<LoadedCheckpoint> opened;
  try {
    plan_.agree_on_success([&] {
      opened = resume_step_ ? manager_.load(*resume_step_, share)
                            : load_checkpoint_dir(*fork_dir_, CheckpointParts::Everything, share);
    });
  } catch (const Error& e) {
    const std::string advice = roll_back_advice();
    if (advice.empty()) throw;
    if (dynamic_cast<const dist::RanksAgreedError*>(&e)) throw dist::RanksAgreedError(e.what() + advice);
    throw Error(e.what() + advice);
  }
  return std::move(*opened);
}

void Checkpointer::restore(TrainState& s, const ResolvedJob& job) const {
  TITAN_CHECK(resume_dir(), "checkpoint: nothing to resume from in '", folder().string(), "'");
  auto t0 = Clock::now();
  // checkpoint.interval_type = "seconds" counts from the end of the restore, not from before it.
  struct Stamp {
    Clock::time_point& at;
    ~Stamp() { at = Clock::now(); }
  } stamp{last_save_returned_};
  // Said once every rank has read its files: a rank that fails stops all of them, and no line before
  // that error may claim the restore worked.
  std::string restored_dir, restored;
  bool restored_seed = false;
  std::vector<std::string> lines;  // what the restore found (a changed schedule, another global batch, ...)
  // What the ranks read in all: the checksums go through the run's own folder once (each rank a share
  // of its files) and every file of a folder forked from on each rank (it may be a copy per host);
  // then each replica reads the values of the whole state.
  const uint64_t state_bytes = uint64_t(job.args.num_params()) * 3 * sizeof(float);
  const uint64_t checksum_reads = resume_step_ ? 1 : uint64_t(plan_.world_size());
  const dist::DiskTimeAllowance allowance(
      plan_.world(), state_bytes * (checksum_reads + uint64_t(plan_.dp_replicate())),
      resume_step_ ? "read the checkpoint (its checksums, then each replica's share)"
                   : "read the checkpoint (its checksums on every rank, then each "
                     "replica's share)");
  // Every rank opens its own files, then reads its slices: a rank that cannot (a file of its share
  // that fails its checksum, a shard its host's copy lacks, another model) stops every rank with its
  // reason, agreed before any collective of the job. The run's own checkpoint folder is one folder
  // every rank sees (checked at start-up): each rank checksums a share of its files, every file read
  // through once in all. A folder the run goes on from (initial_load_path) may be a copy on each
  // host: every rank checks all of its own.
  const LoadedCheckpoint c =
      open_resume_dir(resume_step_ ? ChecksumShare{plan_.rank(), plan_.world_size()} : ChecksumShare{});
  plan_.agree_on_success([&] {
    check_same_model_config(c.train_state.at("model_config"), s.model.args(), c.dir.string());
    const auto& ts = c.train_state;
    // Step 0 is a seed (checkpoint.create_seed_checkpoint): its weights are where the job starts, and
    // nothing else in it was trained, so it loads as weights only (torchtitan's model_only for step 0).
    const bool seed = ts.at("step").get<int64_t>() == 0;
    // checkpoint.exclude_from_loading: the moments stay zero, the schedule starts over from here.
    const bool fresh_optimizer = seed || config_.checkpoint.excludes("optimizer"),
               fresh_schedule = config_.checkpoint.excludes("lr_scheduler");
    // Each rank reads its slice of every block (the whole block when this run does not shard; of
    // its run of experts for a block of experts), parameter by parameter, from the files that hold those
    // elements, whatever the sharding and expert split that wrote them: the restore comes before
    // TrainState::distribute, which keeps exactly that slice.
    const CheckpointBlocks saved(c, s.model);
    for (size_t b = 0; b < s.model.blocks().size(); ++b) {
      LocalSlice mine = local_slice(s, b);
      saved.read(b, "", mine.begin, mine.values);
      // (Restores come before distribute(), which makes the bf16 copies; a block that keeps one
      // already gets it rewritten.)
      if (nn::ParamBlock& block = s.model.blocks()[b]; block.keeps_compute_shard())
        block.refresh_compute_shard();
      if (fresh_optimizer) continue;
      saved.read(b, "exp_avg.", mine.begin, mine.exp_avg);
      saved.read(b, "exp_avg_sq.", mine.begin, mine.exp_avg_sq);
    }
    if (ts.contains("expert_bias"))
      s.model.set_expert_bias_values(ts["expert_bias"].get<std::vector<std::vector<double>>>());
    s.generation_config = ts.value("generation_config", nlohmann::json());
    if (!seed) restore_progress(s, job, c, fresh_optimizer, fresh_schedule, lines);
    // What the resume took from the checkpoint (the rest starts fresh, and the notes above say why).
    restored = "the weights";
    if (ts.contains("expert_bias") && !s.model.expert_bias().empty()) restored += ", the expert biases";
    if (!fresh_optimizer) restored += ", AdamW's moments and step count";
    if (!fresh_schedule) restored += ", the LR schedule's position";
    if (!config_.checkpoint.restart_data_stream) restored += ", the data position";
    restored_dir = c.dir.string();
    restored_seed = seed;
  });
  for (const std::string& line : lines) say("%s", line.c_str());
  if (restored_seed)
    say("started from the seed checkpoint %s (its weights; the optimizer, schedule and data start fresh) in "
        "%.1f s",
        restored_dir.c_str(), seconds_since(t0));
  else
    say("%s %s (step %ld, %ld tokens seen%s; restored: %s) in %.1f s",
        resume_step_ ? "resumed from" : "went on from", restored_dir.c_str(), long(s.step),
        long(s.tokens_seen),
        resume_step_ ? "" : "; checkpoint.initial_load_model_only = false: its whole training state",
        restored.c_str(), seconds_since(t0));
  if (resume_step_ && config_.checkpoint.load_step != -1 && config_.checkpoint.load_only) {
    // A run that saves nothing cannot replace the later steps: they stay where they are, as
    // checkpoint.load_only promises of the whole folder.
    if (const std::vector<int64_t> later = manager_.committed_steps(); later.back() > *resume_step_)
      say("checkpoint: checkpoint.load_only = true: the steps after %ld stay as they are (the newest "
          "committed: %s)",
          long(*resume_step_), manager_.step_dir(later.back()).filename().c_str());
  } else if (resume_step_ && config_.checkpoint.load_step != -1) {
    // A roll-back that restored: the later checkpoints are another trajectory now, set aside so that
    // this run's saves of the same steps cannot replace them. Every rank has read its files first.
    plan_.barrier();
    if (plan_.is_logging_rank())
      for (const auto& [from, to] : manager_.set_aside_after(*resume_step_))
        say("checkpoint: checkpoint.load_step = %ld: %s is set aside as %s (a later step of the run rolled "
            "back; kept, never loaded or deleted)",
            long(*resume_step_), from.filename().c_str(), to.filename().c_str());
    plan_.barrier();
  }
}

namespace {

// Throws when this rank's part of the save of `step` failed: a tensor with non-finite values, or
// files it could not write.
void check_own_save(int64_t step, const std::string& non_finite, const std::string& failure) {
  TITAN_CHECK(non_finite.empty(), "step ", step, ": '", non_finite,
              "' holds non-finite values; no checkpoint written (lower optimizer.lr?)");
  TITAN_CHECK(failure.empty(), "step ", step, ": no checkpoint written: ", failure);
}

}  // namespace

struct Checkpointer::PendingSave {
  int64_t step = 0;
  nlohmann::json train_state;  // what the logging rank commits beside the files
  fs::path temp;               // rank 0's temporary folder of the step
  bool writes = false;         // this rank writes shard files (the first replica's ranks)
  bool background = false;
  uint64_t bytes = 0;  // of every rank's files together: the model and its two moments in f32
  // The host memory the files are written from: the blocks' own buffers for a synchronous save on
  // the CPU, copies otherwise; `model` and `optimizer` point into them.
  std::vector<Tensor> values, exp_avg, exp_avg_sq;
  std::vector<io::TensorWrite> model, optimizer;
  Clock::time_point began;
  std::thread writer;
  std::atomic<bool> done{false};
  // Set by the writer before `done`: the first non-finite tensor, or why writing failed, and the
  // files written. Until a writer has run, the save has failed.
  std::string non_finite, failure = "its files were never written";
  std::vector<CheckpointFile> files;
};

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

void Checkpointer::write_files(PendingSave& p) const {
  p.failure.clear();
  try {
    // A synchronous save checked the live tensors before it began.
    const bool finite =
        !p.background || (all_finite(p.model, &p.non_finite) && all_finite(p.optimizer, &p.non_finite));
    if (p.writes && finite) {
      // A progress line only in the foreground: in the background it would cut into the step lines.
      const std::string progress =
          plan_.is_logging_rank() && !p.background ? manager_.step_dir(p.step).filename().string() : "";
      p.files = write_shard_files(p.temp, plan_.shard_index(), p.model, p.optimizer, progress);
    }
  } catch (const std::exception& e) {
    p.failure = e.what();
  } catch (...) {
    p.failure = "an unknown error";
  }
  p.done = true;
}

bool periodic_save_due(const CheckpointSection& c, int64_t step, double seconds) {
  return c.interval_type == "seconds" ? seconds >= double(c.interval) : step % c.interval == 0;
}

double Checkpointer::seconds_since_last_save() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_returned_).count();
}

void Checkpointer::save(TrainState& s, const ResolvedJob& job, When when) {
  finish_save();  // one save at a time: the one in the background commits first
  // checkpoint.interval_type = "seconds" counts from when this returns to training.
  struct Stamp {
    Clock::time_point& at;
    ~Stamp() { at = Clock::now(); }
  } stamp{last_save_returned_};
  auto p = std::make_unique<PendingSave>();
  p->began = Clock::now();
  p->step = s.step;
  p->background = when == When::InBackground && config_.checkpoint.async();
  p->bytes = uint64_t(job.args.num_params()) * 3 * sizeof(float);
  // Replicas hold identical shards: the ranks of the first replica write them. Without sharding
  // that is rank 0 alone, writing whole parameters under their names (the single-process format).
  p->writes = plan_.replicate_index() == 0;
  const int64_t shards = plan_.dp_shard();
  // Files are written from host memory: a device run copies its slices over first, and a save in
  // the background writes from a copy (the steps after it update the blocks in place), made once and
  // reused by every later save (no fresh pages to fault in at each save).
  auto aside = [&](std::vector<Tensor>& kept, size_t b, const Tensor& t) {
    if (!p->background) return t.device() == Device::CPU ? t : t.to(Device::CPU);
    if (kept.size() <= b) kept.resize(b + 1);
    if (!kept[b].defined()) kept[b] = Tensor::empty(t.shape(), t.dtype(), Device::CPU);
    kept[b].copy_from(t);
    return kept[b];
  };
  if (p->writes) {
    for (size_t b = 0; b < s.model.blocks().size(); ++b) {
      LocalSlice mine = local_slice(s, b);
      p->values.push_back(aside(copy_.values, b, mine.values));
      p->exp_avg.push_back(aside(copy_.exp_avg, b, mine.exp_avg));
      p->exp_avg_sq.push_back(aside(copy_.exp_avg_sq, b, mine.exp_avg_sq));
    }
    auto tensors = [&](const std::vector<Tensor>& slices, const std::string& prefix) {
      return shards > 1 ? block_slice_tensors(s.model, plan_.shard_index(), slices, prefix)
                        : qwen3::layout_tensors(s.model, slices, prefix);
    };
    p->model = tensors(p->values, "");
    p->optimizer = tensors(p->exp_avg, "exp_avg.");
    for (auto& t : tensors(p->exp_avg_sq, "exp_avg_sq.")) p->optimizer.push_back(t);
  }
  if (!p->background) {
    // Before anything touches the folder: a rank's non-finite tensor stops every rank alike (no rank
    // left waiting in the save's collectives), and no rank writes the files of a failed save. (In the
    // background the writer checks its copy, and the commit agrees.)
    plan_.agree_on_success([&] {
      std::string bad;
      if (p->writes && !(all_finite(p->model, &bad) && all_finite(p->optimizer, &bad)))
        check_own_save(s.step, bad, "");
    });
  }
  const auto& c = config_;
  nlohmann::json& ts = p->train_state;
  ts["step"] = s.step;
  ts["tokens_seen"] = s.tokens_seen;
  ts["model_config"] = qwen3::hf_config_from_args(job.args, "float32");
  ts["route"] = c.model.name;
  ts["tokenizer_path"] = fs::absolute(job.tokenizer_path).string();
  ts["tokenizer_checksum"] = tokenizer_checksum(job.tokenizer_path);
  ts["lr_scheduler"] = s.schedule.state_dict();
  ts["optimizer_start_step"] = s.optimizer_start;
  ts["lr_scheduler_start_step"] = s.schedule_start;
  ts["dataloader"] = s.loader.state();
  if (!s.generation_config.is_null()) ts["generation_config"] = s.generation_config;
  ts["dataset_identity"] = s.dataset_identity;
  ts["rng"] = {{"seed", c.training.seed}};  // no random state is consumed after initialisation
  ts["settings"] = resumable_settings(c, job.args);
  ts["global_batch_size"] = job.local_batch_size * plan_.dp_size() * job.accumulation_steps;
  ts["world_size"] = plan_.world_size();
  // The rows of each global held-out batch its validation scores (as Validator resolves them): titan
  // eval of this checkpoint names a different number, whose validation.steps batches hold other tokens.
  // (A run that did not validate logged no val_loss to compare with.)
  if (c.validation.enable) {
    ts["validation_rows"] = validation_rank_rows(c) * plan_.dp_size();
    // And the length of those rows: another one scores each token with another context.
    ts["validation_seq_len"] = validation_seq_len(c);
  }
  ts["mesh"] = {{"dp_replicate", plan_.dp_replicate()},
                {"dp_shard", plan_.dp_shard()},
                {"tp", c.parallelism.tensor_parallel_degree},
                {"ep", c.parallelism.expert_parallel_degree}};
  ts["layout"] = checkpoint_layout(s.model, shards);
  if (!s.model.expert_bias().empty()) ts["expert_bias"] = s.model.expert_bias_values();
  ts["versions"] = versions_json(collect_versions());
  // Rank 0 begins the save; the writers put their fsynced shard files into its folder; once every
  // rank has reported its files (the all-gather is the synchronisation), rank 0 writes the
  // metadata and commits.
  // A folder that cannot be written (its permissions changed since start-up, a full disk) fails the
  // save as a shard file that cannot be written does, on every rank alike.
  fs::path temp;
  plan_.agree_on_success([&] {
    if (!plan_.is_logging_rank()) return;
    try {
      // Another program's step-N folder in the way is kept (its promise at start-up), under another name.
      const fs::path dir = manager_.step_dir(s.step);
      const std::vector<fs::path> foreign = manager_.foreign_step_dirs(),
                                  damaged = manager_.damaged_step_dirs();
      if (std::find(foreign.begin(), foreign.end(), dir) != foreign.end())
        say("checkpoint: %s is not a checkpoint titan wrote; set aside as %s before saving step %ld",
            dir.c_str(), manager_.set_aside(dir, "foreign").filename().c_str(), long(s.step));
      if (std::find(damaged.begin(), damaged.end(), dir) != damaged.end())
        say("checkpoint: %s is a damaged checkpoint (its manifest.json); set aside as %s before saving step "
            "%ld",
            dir.c_str(), manager_.set_aside(dir, "damaged").filename().c_str(), long(s.step));
      temp = manager_.begin_save(s.step);
    } catch (const std::exception& e) {
      check_own_save(s.step, "", e.what());
    }
  });
  p->temp = folder_of_rank0(plan_, temp);
  last_saved_step_ = s.step;
  pending_ = std::move(p);
  PendingSave& pending = *pending_;
  if (!pending.background) {
    write_files(pending);
    return finish_save();
  }
  say("checkpoint: step %ld copied aside in %.1f s; its files are written in the background", long(s.step),
      seconds_since(pending.began));
  // The writer takes no signals (the mask it inherits) and makes no MPI call. It keeps the default
  // priority: lowered, it starved behind the step's threads on two cores and the next save waited
  // for it (bench/checkpoint_saves.sh).
  try {
    pending.writer = std::thread([this, &pending] { write_files(pending); });
  } catch (const std::system_error&) {
    write_files(pending);  // no thread to be had: written here, committed at the next boundary as planned
  }
}

void Checkpointer::poll_save() {
  if (!pending_) return;
  // Every rank asks at the same step boundary; the commit waits for the slowest writer.
  if (plan_.max_over_ranks(pending_->done ? 0 : 1) != 0) return;
  finish_save();
}

void Checkpointer::finish_save() {
  if (!pending_) return;
  std::unique_ptr<PendingSave> p = std::move(pending_);
  // The commit's first collective waits for the slowest writer: the ranks of other replicas, which
  // write nothing, wait the whole save there.
  const dist::DiskTimeAllowance allowance(plan_.world(), p->bytes, "write the checkpoint");
  if (p->writer.joinable()) p->writer.join();
  commit(*p);
}

void Checkpointer::commit(PendingSave& p) {
  // Every rank stops alike, with the lowest failing rank's reason said once (no rank left waiting in
  // the save's collectives, none aborted).
  plan_.agree_on_success([&] { check_own_save(p.step, p.non_finite, p.failure); });
  const std::vector<CheckpointFile> files = files_of_all_ranks(plan_, plan_.shard_index(), p.files);
  // Agreed: no rank runs ahead of (or exits before) the commit, and its failure stops every rank.
  plan_.agree_on_success([&] {
    if (!plan_.is_logging_rank()) return;
    try {
      manager_.commit_save(p.step, files, p.train_state);
    } catch (const std::exception& e) {
      check_own_save(p.step, "", e.what());
    }
  });
  if (p.background)
    say("checkpoint: saved %s in the background, committed %.1f s after its step",
        manager_.step_dir(p.step).string().c_str(), seconds_since(p.began));
  else
    say("checkpoint: saved %s in %.1f s", manager_.step_dir(p.step).string().c_str(), seconds_since(p.began));
}

void Checkpointer::export_hf(TrainState& s, const ResolvedJob& job) const {
  // Streamed: the logging rank writes while the others gather with it one block at a time (and send
  // it their runs of experts), never the whole model (train/hf_export.h).
  const DType export_dtype = config_.checkpoint.export_dtype == "bfloat16" ? DType::BF16 : DType::F32;
  uint64_t total = 0;
  // A split model lists its own run of experts; the export writes every run's, as many.
  for (auto& r : qwen3::hf_tensors(s.model))
    total += uint64_t(shape_numel(r.shape)) * dtype_size(export_dtype) *
             uint64_t(r.expert >= 0 ? s.model.expert_split().count : 1);
  // The other ranks wait on the logging rank's writing: in its gathers and exchanges, or (another
  // replica's) in the barrier below, the whole export.
  const dist::DiskTimeAllowance allowance(plan_.world(), total, "write the export");
  export_from_ranks(plan_, s.model, s.sharding, [&](const qwen3::ExportSource& source) {
    auto t0 = Clock::now();
    const fs::path out = manager_.hf_export_dir(s.step);
    // A folder already there (another program's, or an export the run's resume did not expect) is
    // kept under another name: an export never replaces what it did not write in this run.
    if (fs::exists(out))
      say("export: %s exists; set aside as %s", out.c_str(),
          manager_.set_aside(out, "previous").filename().c_str());
    if (const double bias = largest_expert_bias(s.model.expert_bias_values()); bias > 0)
      say("warning: %s", qwen3::expert_bias_export_warning(bias).c_str());
    const std::vector<fs::path> tok_files = data::tokenizer_files(job.tokenizer_path);
    {
      Progress progress("export: writing " + out.string(), total,
                        [&] { return bytes_in_temporaries_of(out); });
      qwen3::export_hf_model(s.model, out, export_dtype, {tok_files, s.generation_config},
                             /*overwrite=*/false, source);
    }
    say("export: wrote Hugging Face checkpoint %s (%s) in %.1f s", out.string().c_str(),
        config_.checkpoint.export_dtype.c_str(), seconds_since(t0));
  });
  plan_.barrier();
}

bool Checkpointer::has_hf_export(int64_t step) const {
  return plan_.max_over_ranks(fs::is_directory(manager_.hf_export_dir(step)) ? 0 : 1) == 0;
}

}  // namespace titan::train

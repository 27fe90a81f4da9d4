#pragma once
// The trainer's checkpoints: what a TrainState saves (model and optimizer tensors in the model's
// checkpoint layout, and train_state.json: step, tokens seen, model config, LR schedule, data
// position, seed, world size and mesh, MoE expert biases), restoring it on resume, and the
// Hugging Face export at the end of a run. Files and atomicity: CheckpointManager.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/dist/parallel_plan.h"
#include "titan/train/checkpoint.h"
#include "titan/train/job_config.h"
#include "titan/train/startup.h"
#include "titan/train/train_state.h"

namespace titan::train {

// Where a job's checkpoints go: checkpoint.folder under job.dump_folder (an absolute
// checkpoint.folder stands alone).
std::filesystem::path checkpoint_folder_of(const JobConfig& config);

// Whether the periodic save is due after `step` (checkpoint.interval, counted as
// checkpoint.interval_type says), `seconds` after the run began or the previous save returned. (With
// "seconds" each rank asks its own clock: the trainer saves where any rank says so.)
bool periodic_save_due(const CheckpointSection& c, int64_t step, double seconds);

class Checkpointer {
 public:
  Checkpointer(const JobConfig& config, const dist::ParallelPlan& plan);

  const std::filesystem::path& folder() const { return manager_.folder(); }
  std::filesystem::path step_dir(int64_t step) const { return manager_.step_dir(step); }
  std::filesystem::path hf_export_dir(int64_t step) const { return manager_.hf_export_dir(step); }
  // The newest committed step, or checkpoint.load_step (an error when it is not committed), when
  // checkpoint.enable: the run resumes from it.
  std::optional<int64_t> resume_step() const { return resume_step_; }
  // The checkpoint the run goes on from: resume_step()'s folder or, when the job's folder has none
  // and checkpoint.initial_load_model_only = false, initial_load_path's whole training state (a
  // fork: its step, moments, schedule and data position, continued in this job's folder).
  std::optional<std::filesystem::path> resume_dir() const;

  // step-N folders another program wrote: never resumed from, counted or pruned.
  std::vector<std::filesystem::path> foreign_step_dirs() const { return manager_.foreign_step_dirs(); }
  // step-N folders titan committed whose manifest is damaged (older than the newest committed step:
  // a newer one is an error at construction): never loaded or deleted.
  std::vector<std::filesystem::path> damaged_step_dirs() const { return manager_.damaged_step_dirs(); }
  // titan's step-N folders without COMMITTED (a save cut short): ignored, removed by the next save.
  std::vector<std::filesystem::path> interrupted_step_dirs() const {
    return manager_.interrupted_step_dirs();
  }
  std::vector<std::filesystem::path> unfinished_saves() const { return manager_.unfinished_saves(); }

  // resume_dir()'s checkpoint opened as restore() opens it, with `share` of its files checksummed
  // (restore: this rank's; titan check: ChecksumShare::none(), every file's presence and size against
  // the manifest). Every rank of the plan calls it (the ranks agree on the outcome): when the newest
  // step cannot be read, the error names the failing ranks' reasons (dist::agree_on_success), then
  // once the earlier committed steps a checkpoint.load_step could resume from.
  LoadedCheckpoint open_resume_dir(ChecksumShare share) const;
  // "; if step N cannot be repaired, the committed steps before it are ...: checkpoint.load_step = M
  // resumes ..." when the resume is of the run's newest step and earlier ones are committed; else "".
  std::string roll_back_advice() const;

  // Says which step-N folders the resume passes over (foreign, damaged, interrupted) and why: what
  // titan train and titan eval print before they load the job's checkpoint (`trains`: train's words,
  // which say what its restore does with them; `saves`: whether this run saves, which removes the
  // folders of unfinished saves).
  void say_ignored_step_dirs(bool trains, bool saves) const;

  // Restores `state` from resume_step(): weights, moments (this rank's slice, read parameter by
  // parameter from the files that hold it), step, tokens seen, data position, expert biases,
  // whatever number of ranks and expert split wrote it; the tokenizer must be the one it was trained with
  // (tokenizer.json's checksum). Errors name the checkpoint and what does not fit this run. After a restore
  // from checkpoint.load_step the committed steps after it are set aside
  // (CheckpointManager::set_aside_after), unless checkpoint.load_only: a run that saves nothing
  // leaves the folder as it was. A step-0 checkpoint (a seed) restores the weights alone.
  // Every rank calls it.
  void restore(TrainState& state, const ResolvedJob& job) const;

  // Saves `state` at its step (atomically; refuses non-finite weights or moments by name). Every
  // rank calls it: the ranks of the first replica write their shard files (replicas hold the same
  // shards; shard file k holds slice k / ep of run k % ep of the split experts),
  // then the logging rank writes train_state.json with the layout, the manifest and COMMITTED, and
  // all ranks return after the commit.
  //
  // With checkpoint.async_mode = "async" and `when` = InBackground, the save returns once this rank's
  // slices of the weights and moments are copied aside (host memory as large as what it writes, kept
  // from the first such save on and reused) and the train state is recorded; a background thread
  // checks and writes the files while training goes on, and poll_save() commits the checkpoint at
  // the first step boundary where every rank's writer is done. A save still in the background is
  // completed before the next one begins. The files are the same bytes as a synchronous save's.
  // Saves the run waits for anyway (its last step, a stop by signal, a seed) are Now.
  enum class When { Now, InBackground };
  void save(TrainState& state, const ResolvedJob& job, When when = When::Now);
  // Commits the save in the background if every rank's writer has finished (a collective while one
  // is pending; nothing otherwise); a writer's failure (a non-finite tensor, a full disk) is thrown
  // here on every rank. Every rank calls it at the same points.
  void poll_save();
  // Waits for the save in the background, if any, and commits it (or throws its failure).
  void finish_save();
  // Whether a save is in the background (begun, not yet committed).
  bool saving() const { return pending_ != nullptr; }
  // The step saved last (or resumed from; a save in the background counts): a stop by signal does
  // not save it twice.
  int64_t last_saved_step() const { return last_saved_step_; }
  // Seconds since the last save returned to training (or, before any, since the run's state was
  // restored or the checkpointer made): checkpoint.interval_type = "seconds" counts from it, as
  // torchtitan does, so a save slower than the interval does not make every step save.
  double seconds_since_last_save() const;
  // A save still in the background is abandoned (its writer joined, nothing committed, its
  // temporary folder removed): an error is unwinding the run.
  ~Checkpointer();

  // Writes <folder>/step-N-hf in checkpoint.export_dtype with the tokenizer files (every rank
  // calls it; the logging rank writes).
  void export_hf(TrainState& state, const ResolvedJob& job) const;
  // Whether <folder>/step-N-hf exists on every rank (a finished export: it is written atomically).
  bool has_hf_export(int64_t step) const;

 private:
  // This rank's slice of block b, its first element's index in the block buffer, and the
  // optimizer's moments of that slice: the one place the checkpointer asks which part of the state
  // is this rank's.
  struct LocalSlice {
    int64_t begin = 0;
    Tensor values, exp_avg, exp_avg_sq;
  };
  LocalSlice local_slice(TrainState& state, size_t block) const;
  // Everything of a restore past the weights: the step, the optimizer's and schedule's starts, the data
  // position, and the warnings about what changed since the checkpoint, added to `later`: said once
  // every rank has restored, so that a resume refused after them (another dataset, another
  // tokenizer) prints its error alone.
  void restore_progress(TrainState& state, const ResolvedJob& job, const LoadedCheckpoint& checkpoint,
                        bool fresh_optimizer, bool fresh_schedule, std::vector<std::string>& later) const;

  // A save whose files are written (or being written) and not yet committed. It owns everything
  // its writer reads: the host copies of the slices and the train state.
  struct PendingSave;
  // Runs the writer's part of `p` (the finiteness check, then the shard files) on this thread.
  void write_files(PendingSave& p) const;
  // Every rank's writer has finished: agree on failure, then commit (the logging rank) and wait.
  void commit(PendingSave& p);

  const JobConfig& config_;
  const dist::ParallelPlan& plan_;
  std::unique_ptr<PendingSave> pending_;
  // The host copy background saves write from, per block: made by the first, reused by the next
  // (each waits for the one before it), held from the first background save on.
  struct StateCopy {
    std::vector<Tensor> values, exp_avg, exp_avg_sq;
  } copy_;
  CheckpointManager manager_;
  std::optional<int64_t> resume_step_;
  std::optional<std::filesystem::path> fork_dir_;  // initial_load_path, loaded whole
  int64_t last_saved_step_ = -1;
  mutable std::chrono::steady_clock::time_point last_save_returned_ = std::chrono::steady_clock::now();
};

}  // namespace titan::train

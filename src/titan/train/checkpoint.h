#pragma once
// Native checkpoints: <folder>/step-N/ holding
//   model-rank{k}.safetensors      f32 parameters of shard k (k = 0 .. shards-1; one file when the
//                                  state was not sharded); what a file holds: train_state's "layout"
//   optimizer-rank{k}.safetensors  the AdamW moments of shard k
//   train_state.json               step, tokens seen, model config, LR schedule, dataloader, RNG, world
//                                  size, mesh, and the layout of the shard files
//   manifest.json                  "format": "titan-checkpoint", every file with its size and
//                                  64-bit checksum (a file it does not list fails the load)
//   COMMITTED                      written last: a folder without it is ignored (and pruned)
// A save assembles .step-N.tmp-<pid>-<n> (the ranks that write shard files write them there, each
// fsynced), and once every file is in, the logging rank writes train_state.json and the manifest,
// renames the folder to step-N and then writes COMMITTED atomically, so a crash at any point never
// leaves a checkpoint that loads. After a save, older committed steps beyond keep_latest_k, step
// folders without COMMITTED and temporaries left by a dead process are deleted (a pruned folder
// loses its COMMITTED marker first, its manifest last). Only folders whose manifest carries the
// format marker are titan's: another program's step-N folder is never loaded, counted or deleted.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "titan/core/hash.h"
#include "titan/io/atomic_file.h"
#include "titan/io/safetensors.h"

namespace titan::train {

struct LoadedCheckpoint {
  int64_t step = 0;
  std::filesystem::path dir;
  nlohmann::json train_state;
  // model-rank{k} and optimizer-rank{k} by shard k: as many as train_state's "layout" has shards
  // (one for a checkpoint written before layouts were recorded).
  std::vector<io::SafetensorsFile> model_files;
  std::vector<io::SafetensorsFile> optimizer_files;
  // Loaded as CheckpointParts::Weights: why titan train could not resume it, when an optimizer file
  // the manifest lists is missing or of another size (its sizes only: the files are not read), else
  // "". The weights are whole either way; export, generate and eval say it in a note.
  std::string unresumable;
};

// "model-rank3.safetensors": the file of shard k ("model" or "optimizer").
std::string shard_file_name(const std::string& kind, int64_t shard);

// A file of a checkpoint as its manifest lists it.
struct CheckpointFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // file_checksum
};

// Writes model-rank{shard} and optimizer-rank{shard} into `dir` (each fsynced) and returns them
// with their sizes and checksums. A non-empty `progress_name` draws a progress line saying it (the
// checkpoint's own name: `dir` is the temporary folder it is written in).
std::vector<CheckpointFile> write_shard_files(const std::filesystem::path& dir, int64_t shard,
                                              std::span<const io::TensorWrite> model,
                                              std::span<const io::TensorWrite> optimizer,
                                              const std::string& progress_name);

// Which of the files the caller checksums: share `index` of `count` shares balanced by bytes (the
// manifest's files, largest first, each to the share with the fewest bytes so far, ties to the
// lowest: the same split on every rank, which all read the same manifest). Every file's presence
// and size are checked whatever the share. The ranks of a resume from the run's own checkpoint
// folder (one folder every rank sees) each take a share (Checkpointer::restore, agreeing on the
// outcome), so each file is read through once in all, not once per rank.
struct ChecksumShare {
  int64_t index = 0, count = 1;
  // No file's checksum, only every file's presence and size (and the manifest, the step, the
  // layout): what `titan check` verifies of the checkpoint a job would resume, in seconds, where the
  // checksums read it whole.
  static ChecksumShare none() { return {0, 0}; }
};

// N of a folder (or file) named step-N, if it is so named.
std::optional<int64_t> step_of_name(const std::filesystem::path& dir);

// When `dir` is a run's checkpoint folder (it holds committed step-N folders), given where one
// checkpoint is wanted: "'<dir>' is a checkpoint folder, not a checkpoint: pass one of its step
// folders (committed, newest first: step-6, step-4)"; a run's dump folder whose checkpoint/ holds
// them is said as "'<run>' is a run's folder, not a checkpoint; '<run>/checkpoint' is a checkpoint
// folder, ..."; else "".
std::string checkpoint_folder_given(const std::filesystem::path& dir);

class CheckpointManager {
 public:
  CheckpointManager(std::filesystem::path folder, int64_t keep_latest_k);

  const std::filesystem::path& folder() const { return folder_; }
  std::filesystem::path step_dir(int64_t step) const;
  // Where the Hugging Face export of a step goes: step-N-hf beside step-N.
  std::filesystem::path hf_export_dir(int64_t step) const;

  // A save in three parts, so that several processes can write one checkpoint: begin_save creates
  // the temporary folder of step-N (returned), the writers put their shard files there
  // (write_shard_files), then commit_save, given every shard file, writes train_state.json and the
  // manifest, moves the folder into place, writes COMMITTED and prunes to the newest keep_latest_k
  // committed steps (0 keeps all). A save that is begun and never committed leaves no checkpoint.
  std::filesystem::path begin_save(int64_t step);
  void commit_save(int64_t step, const std::vector<CheckpointFile>& shard_files, const nlohmann::json& train_state);

  // Committed steps, ascending.
  std::vector<int64_t> committed_steps() const;
  // step-N folders another program (or a titan before the format marker) wrote: ignored, never
  // deleted; the trainer names them so that a run starting fresh beside them is no surprise.
  std::vector<std::filesystem::path> foreign_step_dirs() const;
  // step-N folders titan committed (COMMITTED says so) whose manifest is since missing, unreadable
  // or not titan's: damaged checkpoints. Never loaded or deleted; the trainer refuses to start
  // past one (it would resume from an older step, or from scratch, without a word otherwise).
  std::vector<std::filesystem::path> damaged_step_dirs() const;
  // titan's step-N folders without COMMITTED: a save cut short between its rename and its marker,
  // or a prune cut short. Never loaded; the next save removes them.
  std::vector<std::filesystem::path> interrupted_step_dirs() const;
  // Temporaries of saves whose process is gone (".step-N.tmp-<pid>-<n>", a rank killed while it
  // wrote its shards): never loaded; the next save removes them.
  std::vector<std::filesystem::path> unfinished_saves() const;
  std::optional<int64_t> latest_step() const;
  // Renames the folder `dir` to <dir>.<suffix> (-2, -3, ... when that is taken): out of the way of
  // a save, kept, never loaded or deleted. Returns the new path.
  std::filesystem::path set_aside(const std::filesystem::path& dir, const std::string& suffix) const;
  // Rolling back to `step`: every committed step after it, and its Hugging Face export step-N-hf,
  // and every damaged step after it (damaged_step_dirs) is set aside as <name>.rolled-back. Returns
  // (from, to) per folder moved.
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> set_aside_after(int64_t step) const;

  // Loads a committed step, verifying the manifest's sizes of every file (every shard's) and the
  // checksums of `share`'s (all of them by default); a shard file the layout needs and the folder
  // lacks is an error naming it.
  LoadedCheckpoint load(int64_t step, ChecksumShare share = {}) const;

 private:
  void prune(int64_t just_saved) const;
  std::vector<std::filesystem::path> step_dirs() const;  // the step-N folders, sorted by name
  std::filesystem::path folder_;
  int64_t keep_latest_k_;
  std::optional<io::AtomicDir> pending_;  // the folder of the save begun and not yet committed
};

// Opens a checkpoint directory directly (titan export, verify-export); it must be committed.
// `CheckpointParts::Weights` (export, generate, an initial load) leaves the optimizer files alone: neither
// checksummed nor opened, nor needed on disk (optimizer_files stays empty).
enum class CheckpointParts { Everything, Weights };
LoadedCheckpoint load_checkpoint_dir(const std::filesystem::path& step_dir,
                                     CheckpointParts parts = CheckpointParts::Everything,
                                     ChecksumShare share = {});

// 64-bit checksum of a file's bytes (FNV-1a's basis and prime over 8-byte words, the tail byte by
// byte), for the manifest. `bytes_read`, when given, is advanced as the file is read (progress
// display). `basis`: kFnv1aStartBefore20261201 for manifests that name no hash.
uint64_t file_checksum(const std::filesystem::path& path, std::atomic<uint64_t>* bytes_read = nullptr,
                       uint64_t basis = kFnv1aStart);

// The checksum of a tokenizer's tokenizer.json (`tokenizer_path`: the file or its folder), as
// train_state.json records it ("tokenizer_checksum"): what a resume and `titan generate` compare,
// wherever the file now lives.
std::string tokenizer_checksum(const std::filesystem::path& tokenizer_path);

}  // namespace titan::train

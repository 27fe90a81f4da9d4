#pragma once
// Native checkpoints: <folder>/step-N/ holding
//   model-rank{r}.safetensors      f32 parameters under native names (this rank's shard)
//   optimizer-rank{r}.safetensors  AdamW exp_avg.<name> / exp_avg_sq.<name>
//   train_state.json               step, tokens seen, model config, LR schedule, dataloader, RNG, world size
//   manifest.json                  "format": "titan-checkpoint", every file with its size and
//                                  64-bit checksum (a file it does not list fails the load)
//   COMMITTED                      written last: a folder without it is ignored (and pruned)
// A save assembles .step-N.tmp-<pid>-<n>, fsyncs every file, renames it to step-N, then writes
// COMMITTED atomically, so a crash at any point never leaves a checkpoint that loads. After a
// save, older committed steps beyond keep_latest_k, step folders without COMMITTED and temporaries
// left by a dead process are deleted (a pruned folder loses its COMMITTED marker first, its
// manifest last). Only folders whose manifest carries the format marker are titan's: another
// program's step-N folder is never loaded, counted or deleted.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "titan/io/safetensors.h"

namespace titan::train {

struct LoadedCheckpoint {
  int64_t step = 0;
  std::filesystem::path dir;
  nlohmann::json train_state;
  io::SafetensorsFile model;
  io::SafetensorsFile optimizer;
};

class CheckpointManager {
 public:
  CheckpointManager(std::filesystem::path folder, int64_t keep_latest_k, int rank = 0);

  const std::filesystem::path& folder() const { return folder_; }
  std::filesystem::path step_dir(int64_t step) const;

  // Writes step-N atomically, then prunes to the newest keep_latest_k committed steps (0 keeps all).
  void save(int64_t step, std::span<const io::TensorWrite> model, std::span<const io::TensorWrite> optimizer,
            const nlohmann::json& train_state);

  // Committed steps, ascending.
  std::vector<int64_t> committed_steps() const;
  // step-N folders another program (or a titan before the format marker) wrote: ignored, never
  // deleted; the trainer names them so that a run starting fresh beside them is no surprise.
  std::vector<std::filesystem::path> foreign_step_dirs() const;
  std::optional<int64_t> latest_step() const;

  // Loads a committed step, verifying the manifest's sizes and checksums.
  LoadedCheckpoint load(int64_t step) const;

 private:
  void prune(int64_t just_saved) const;
  std::filesystem::path folder_;
  int64_t keep_latest_k_;
  int rank_;
};

// Opens a checkpoint directory directly (titan export, verify-export); it must be committed.
LoadedCheckpoint load_checkpoint_dir(const std::filesystem::path& step_dir, int rank = 0);

// 64-bit checksum of a file's bytes (FNV-1a over 8-byte words), for the manifest. `bytes_read`,
// when given, is advanced as the file is read (progress display).
uint64_t file_checksum(const std::filesystem::path& path, std::atomic<uint64_t>* bytes_read = nullptr);

}  // namespace titan::train

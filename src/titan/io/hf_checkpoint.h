#pragma once
// Hugging Face checkpoint directories: either one `model.safetensors` or
// `model.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {key: shard}}) plus
// the shards it names. Reading validates the index against the shards; writing shards like
// transformers' save_pretrained and is atomic for the whole directory. Rules: docs/safetensors.md.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/hash.h"
#include "titan/io/safetensors.h"

namespace titan::io {

inline constexpr std::string_view kHfSingleFile = "model.safetensors";
inline constexpr std::string_view kHfIndexFile = "model.safetensors.index.json";
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' default "5GB"

// True when `dir` holds model.safetensors or model.safetensors.index.json.
bool is_hf_checkpoint_dir(const std::filesystem::path& dir);

class HfCheckpoint {
 public:
  // Opens every file (mmap, validated). Errors name the directory, the file and the key.
  static HfCheckpoint open(const std::filesystem::path& dir);

  const TensorInfo* find(std::string_view key) const;  // nullptr when absent
  const TensorInfo& at(std::string_view key) const;    // throws naming the directory and key
  // The file holding `key` (its keep_alive() lets tensors alias the mapped bytes).
  const SafetensorsFile& file_of(std::string_view key) const;
  std::vector<std::string> keys() const;  // sorted
  size_t size() const { return entries_.size(); }
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  const std::vector<SafetensorsFile>& files() const { return files_; }
  bool sharded() const { return sharded_; }
  // "metadata" of the index (e.g. total_size as a string); empty for a single file.
  const std::map<std::string, std::string>& index_metadata() const { return index_metadata_; }

 private:
  struct Entry {
    size_t file;
    size_t tensor;  // index into files_[file].tensors()
  };
  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> index_metadata_;
};

// Written into every HF folder titan exports: {"hash", "tensors": {key: {"dtype", "shape", "checksum"}},
// "files": {name: checksum}}, the checksum of each tensor's bytes as written and of every other file
// written beside them (config.json, tokenizer files; exports before 2026-12-02 list no files), so that
// `titan verify-export` without the source can still check the whole export bit for bit.
inline constexpr const char* kTensorChecksumsFile = "titan_checksums.json";

// 64-bit FNV-1a of a tensor's bytes, as 16 hex digits (`basis`: see core/hash.h; the file records
// its name).
std::string tensor_checksum(const TensorInfo& t, uint64_t basis = kFnv1aStart);
// The same of a file's bytes (the standard basis).
std::string bytes_checksum(std::string_view bytes);

struct HfWriteOptions {
  // A shard is closed before it would exceed this many bytes of tensor data; a larger tensor gets a
  // shard of its own. All tensors fit -> a single model.safetensors and no index.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  Metadata metadata;                               // added to every file's __metadata__
  std::map<std::string, std::string> extra_files;  // name -> contents (config.json, ...)
  std::vector<std::filesystem::path> copy_files;   // copied in by file name (tokenizer files, ...)
  bool overwrite = false;                          // replace an existing directory (atomically)
};

struct HfWriteResult {
  std::vector<std::string> files;  // safetensors files written, in order
  uint64_t total_size = 0;         // bytes of tensor data (the index's total_size)
};

// Writes the tensors (in order) into `dir`. The directory is assembled under a temporary name and
// renamed into place at the end, so a crash never leaves a half-written checkpoint at `dir`.
HfWriteResult write_hf_checkpoint(const std::filesystem::path& dir, std::span<const TensorWrite> tensors,
                                  const HfWriteOptions& options = {});

}  // namespace titan::io

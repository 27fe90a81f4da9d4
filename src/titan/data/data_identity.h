#pragma once
// The identity of a dataset, saved with the loader position in every checkpoint: a position
// (file index, byte offset) only means something in the files it was taken from. Each file is
// recorded by path, size and a content fingerprint (a 64-bit hash of its size, first and last
// MiB), so that a resume on a different, grown, truncated or edited file is caught before it
// seeks into the middle of a document.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace titan::data {

// [{"path": absolute path, "bytes": size, "fingerprint": "hex"}, ...] in the order given.
nlohmann::json dataset_identity(const std::vector<std::filesystem::path>& files);

// How `now` (this run's dataset) compares with `saved` (a checkpoint's), file by file in order (a moved
// file with the same content is the same file). A checkpoint's data position holds in a dataset that
// only grew: files added after all of its files (they sort after them), and line-record files
// (.jsonl, .ndjson, .csv, .tsv, uncompressed) whose old bytes end a line and are unchanged (their
// fingerprint over the old size) with lines appended.
struct DatasetComparison {
  std::string mismatch;  // "" when the position holds, else what differs: the file and both values
  std::string growth;    // "" when the same, else what was added (the new files, the grown files)
  struct GrownFile {
    size_t index;        // in both identities
    uint64_t old_bytes;  // the checkpoint's size of it
  };
  std::vector<GrownFile> grown_files;  // the files with lines appended (none on a mismatch)
};
DatasetComparison compare_dataset_identity(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace titan::data

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

// "" when `now` holds the same files as `saved` (same count, and for each file the same size and
// fingerprint; a moved file with the same content is the same file), else what differs, naming the
// file and both values.
std::string dataset_identity_mismatch(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace titan::data

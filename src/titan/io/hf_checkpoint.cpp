#include "titan/io/hf_checkpoint.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/io/atomic_file.h"
#include "titan/io/path_guard.h"

namespace titan::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// JSON parse that rejects duplicate keys in any object (the DOM would keep only the last one, so a
// weight_map listing a key twice would silently lose one mapping).
json parse_json_unique_keys(const std::string& text, const fs::path& origin) {
  std::vector<std::unordered_set<std::string>> keys;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) -> bool {
    if (ev == json::parse_event_t::object_start)
      keys.emplace_back();
    else if (ev == json::parse_event_t::object_end)
      keys.pop_back();
    else if (ev == json::parse_event_t::key) {
      std::string k = parsed.get<std::string>();
      TITAN_CHECK(keys.back().insert(k).second, origin, ": duplicate key '", k, "'");
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    TITAN_FAIL(origin, ": not valid JSON: ", e.what());
  }
}

// Shard names come from a file we do not trust: only plain names inside the directory.
bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

bool is_hf_checkpoint_dir(const fs::path& dir) {
  return fs::is_regular_file(dir / kHfSingleFile) || fs::is_regular_file(dir / kHfIndexFile);
}

HfCheckpoint HfCheckpoint::open(const fs::path& dir) {
  TITAN_CHECK(fs::is_directory(dir), "checkpoint directory ", dir, " does not exist or is not a directory");
  const fs::path single = dir / kHfSingleFile, index = dir / kHfIndexFile;
  const bool has_single = fs::exists(single), has_index = fs::exists(index);
  TITAN_CHECK(has_single || has_index, "checkpoint directory ", dir, " holds neither ", kHfSingleFile,
              " nor ", kHfIndexFile);
  // transformers would silently prefer the single file; both present usually means a stale leftover,
  // and loading the wrong one is worse than asking.
  TITAN_CHECK(!(has_single && has_index), "checkpoint directory ", dir, " holds both ", kHfSingleFile,
              " and ", kHfIndexFile, ": ambiguous, remove the stale one");

  HfCheckpoint ck;
  ck.dir_ = dir;
  if (has_single) {
    ck.files_.push_back(SafetensorsFile::open(single));
    const auto& ts = ck.files_[0].tensors();
    for (size_t i = 0; i < ts.size(); ++i) ck.entries_.emplace(ts[i].name, Entry{0, i});
    return ck;
  }

  ck.sharded_ = true;
  json j = parse_json_unique_keys(read_regular_file(index, "checkpoint index"), index);
  TITAN_CHECK(j.is_object(), index, ": must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it)
    TITAN_CHECK(it.key() == "metadata" || it.key() == "weight_map", index, ": unknown field '", it.key(),
                "' (allowed: metadata, weight_map)");
  if (j.contains("metadata")) {
    const json& m = j["metadata"];
    TITAN_CHECK(m.is_object(), index, ": 'metadata' must be an object");
    for (auto it = m.begin(); it != m.end(); ++it)
      ck.index_metadata_[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    // total_size is informational: hub files exist where it counts tied or quantized storage
    // differently, so it is checked for type only, not against the shards.
    if (m.contains("total_size"))
      TITAN_CHECK(m["total_size"].is_number_unsigned(), index,
                  ": metadata.total_size must be a non-negative integer");
  }
  TITAN_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index,
              ": missing object 'weight_map'");
  const json& wm = j["weight_map"];

  std::map<std::string, size_t> file_ids;  // shard name -> index in files_
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    TITAN_CHECK(it->is_string(), index, ": weight_map['", it.key(), "'] must be a file name string");
    const std::string& f = it->get_ref<const std::string&>();
    TITAN_CHECK(is_plain_file_name(f), index, ": weight_map['", it.key(), "'] = '", f,
                "' is not a plain file name inside the checkpoint directory");
    file_ids.emplace(f, 0);
  }
  for (auto& [name, id] : file_ids) {
    TITAN_CHECK(fs::is_regular_file(dir / name), index, ": shard '", name,
                "' listed in weight_map does not exist in ", dir);
    id = ck.files_.size();
    ck.files_.push_back(SafetensorsFile::open(dir / name));
  }
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string& f = it->get_ref<const std::string&>();
    size_t id = file_ids.at(f);
    const TensorInfo* t = ck.files_[id].find(it.key());
    TITAN_CHECK(t, index, ": maps tensor '", it.key(), "' to shard '", f, "', which has no such tensor");
    ck.entries_.emplace(it.key(), Entry{id, size_t(t - ck.files_[id].tensors().data())});
  }
  // The index is the contract: a shard tensor it does not list means index and shards disagree
  // (e.g. a shard from another save), and guessing which is right could load stale weights.
  for (auto& [name, id] : file_ids)
    for (const TensorInfo& t : ck.files_[id].tensors()) {
      auto it = wm.find(t.name);
      TITAN_CHECK(it != wm.end(), index, ": shard '", name, "' holds tensor '", t.name,
                  "', which weight_map does not list");
      TITAN_CHECK(it->get_ref<const std::string&>() == name, index, ": tensor '", t.name, "' is in shard '",
                  name, "' but weight_map maps it to '", it->get_ref<const std::string&>(), "'");
    }
  return ck;
}

const TensorInfo* HfCheckpoint::find(std::string_view key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &files_[it->second.file].tensors()[it->second.tensor];
}

const TensorInfo& HfCheckpoint::at(std::string_view key) const {
  const TensorInfo* t = find(key);
  TITAN_CHECK(t, "checkpoint ", dir_, " has no tensor '", key, "'");
  return *t;
}

const SafetensorsFile& HfCheckpoint::file_of(std::string_view key) const {
  auto it = entries_.find(key);
  TITAN_CHECK(it != entries_.end(), "checkpoint ", dir_, " has no tensor '", key, "'");
  return files_[it->second.file];
}

std::vector<std::string> HfCheckpoint::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.push_back(k);
  return out;
}

std::string tensor_checksum(const TensorInfo& t, uint64_t basis) {
  return hash_hex(fnv1a(t.data, size_t(t.nbytes()), basis));
}

std::string bytes_checksum(std::string_view bytes) {
  return hash_hex(fnv1a(bytes));
}

HfWriteResult write_hf_checkpoint(const fs::path& dir, std::span<const TensorWrite> tensors,
                                  const HfWriteOptions& opt) {
  TITAN_CHECK(opt.max_shard_bytes > 0, "write_hf_checkpoint ", dir, ": max_shard_bytes must be positive");
  std::unordered_set<std::string_view> names;
  for (const TensorWrite& t : tensors)
    TITAN_CHECK(names.insert(t.name).second, "write_hf_checkpoint ", dir, ": duplicate tensor name '", t.name,
                "'");

  // Shards in tensor order, as transformers does: close a shard before it would exceed the limit.
  std::vector<std::vector<TensorWrite>> shards;
  uint64_t current = 0, total = 0;
  for (const TensorWrite& t : tensors) {
    uint64_t bytes = tensor_write_bytes(t);
    if (shards.empty() || (current > 0 && current + bytes > opt.max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(t);
    current += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();  // no tensors: still a valid, empty model.safetensors

  std::set<std::string> reserved;
  HfWriteResult result;
  result.total_size = total;
  for (size_t i = 0; i < shards.size(); ++i)
    result.files.push_back(shards.size() == 1 ? std::string(kHfSingleFile) : shard_name(i, shards.size()));
  // Both layouts' names stay reserved, so an extra file can never make the directory ambiguous.
  reserved.insert(result.files.begin(), result.files.end());
  reserved.insert(std::string(kHfSingleFile));
  reserved.insert(std::string(kHfIndexFile));
  reserved.insert(std::string(kTensorChecksumsFile));
  auto check_extra = [&](const std::string& name) {
    TITAN_CHECK(is_plain_file_name(name), "write_hf_checkpoint ", dir, ": extra file '", name,
                "' must be a plain file name");
    TITAN_CHECK(reserved.insert(name).second, "write_hf_checkpoint ", dir, ": extra file '", name,
                "' collides with another file of the checkpoint");
  };
  for (const auto& [name, contents] : opt.extra_files) check_extra(name);
  for (const fs::path& p : opt.copy_files) check_extra(p.filename().string());

  AtomicDir out(dir, opt.overwrite);
  for (size_t i = 0; i < shards.size(); ++i)
    write_safetensors(out.temp_path() / result.files[i], shards[i], opt.metadata);
  if (shards.size() > 1) {
    json wm = json::object();
    for (size_t i = 0; i < shards.size(); ++i)
      for (const TensorWrite& t : shards[i]) wm[t.name] = result.files[i];
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    write_file_atomic(out.temp_path() / kHfIndexFile, index.dump(2) + "\n");
  }
  {
    // Read back from the written files: the checksums are of the bytes on disk.
    json sums = json::object();
    for (const std::string& f : result.files) {
      const SafetensorsFile written = SafetensorsFile::open(out.temp_path() / f);
      for (const TensorInfo& t : written.tensors())
        sums[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                        {"shape", t.shape},
                        {"checksum", tensor_checksum(t)}};
    }
    // The other files too: config.json decides what the tensors compute, the tokenizer what ids mean.
    json files = json::object();
    for (const auto& [name, contents] : opt.extra_files) {
      write_file_atomic(out.temp_path() / name, contents);
      files[name] = bytes_checksum(contents);
    }
    for (const fs::path& p : opt.copy_files) {
      const std::string contents = read_regular_file(p, "checkpoint file");
      write_file_atomic(out.temp_path() / p.filename(), contents);
      files[p.filename().string()] = bytes_checksum(contents);
    }
    write_file_atomic(out.temp_path() / kTensorChecksumsFile,
                      json{{"hash", kFnv1aName}, {"tensors", sums}, {"files", files}}.dump(1) + "\n");
  }
  out.commit();
  return result;
}

}  // namespace titan::io

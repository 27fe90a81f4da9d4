#include "titan/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/data/tokenizer.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_error.h"
#include "titan/io/path_guard.h"
#include "titan/train/metrics.h"

namespace titan::train {

namespace fs = std::filesystem;

uint64_t file_checksum(const fs::path& path, std::atomic<uint64_t>* bytes_read, uint64_t basis) {
  std::ifstream f(path, std::ios::binary);
  TITAN_CHECK(f, "checkpoint: cannot read '", path.string(), "'");
  WordChecksum h(basis);
  std::vector<char> buf(size_t(1) << 22);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    const size_t n = size_t(f.gcount());
    h.update(buf.data(), n);
    if (bytes_read) bytes_read->fetch_add(n);
  }
  return h.value();
}

namespace {

// The manifest's "format": what marks a folder as a checkpoint titan wrote (and may prune).
constexpr const char* kManifestFormat = "titan-checkpoint";

nlohmann::json read_json(const fs::path& p) {
  return io::read_json_file(p, "checkpoint");
}

// A folder titan committed itself: its manifest says so. Pruning and resuming only ever touch
// these, never another program's step-N folder.
bool written_by_titan(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "manifest.json", ec)) return false;
  std::ifstream f(dir / "manifest.json");
  nlohmann::json m = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return m.is_object() && m.value("format", "") == kManifestFormat;
}

// A folder whose COMMITTED marker is titan's ("step N"): committed by titan, whatever has happened
// to its manifest since.
bool committed_by_titan(const fs::path& dir) {
  std::ifstream f(dir / "COMMITTED");
  std::string word;
  return f && (f >> word) && word == "step";
}

}  // namespace

std::optional<int64_t> step_of_name(const fs::path& dir) {
  static const std::regex name_re("step-([0-9]+)");
  std::smatch m;
  const std::string name = dir.filename().string();
  if (!std::regex_match(name, m, name_re)) return std::nullopt;
  // A number past int64 ("step-99999999999999999999", nobody's checkpoint) is no step.
  int64_t step = 0;
  const std::string digits = m[1].str();
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::string checkpoint_folder_given(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  const std::vector<int64_t> steps = CheckpointManager(dir, 0).committed_steps();
  if (steps.empty()) {
    // A run's dump folder, whose checkpoint folder (checkpoint.folder's default) holds the steps.
    const fs::path inside = dir / "checkpoint";
    const std::string root = fs::is_directory(inside, ec) && !fs::exists(dir / "manifest.json", ec)
                                 ? checkpoint_folder_given(inside)
                                 : "";
    if (root.empty()) return "";
    return "'" + dir.string() + "' is a run's folder, not a checkpoint; " + root;
  }
  // The newest few: a folder kept whole (keep_latest_k = 0) may hold hundreds.
  constexpr size_t kNamed = 4;
  std::string named;
  for (size_t i = 0; i < steps.size() && i < kNamed; ++i)
    named += (i ? ", step-" : "step-") + std::to_string(steps[steps.size() - 1 - i]);
  if (steps.size() > kNamed) named += ", ... (" + std::to_string(steps.size()) + " in all)";
  return "'" + dir.string() +
         "' is a checkpoint folder, not a checkpoint: pass one of its step folders, e.g. '" +
         (dir / ("step-" + std::to_string(steps.back()))).string() + "' (committed, newest first: " + named +
         ")";
}

std::string shard_file_name(const std::string& kind, int64_t shard) {
  return kind + "-rank" + std::to_string(shard) + ".safetensors";
}

std::vector<CheckpointFile> write_shard_files(const fs::path& dir, int64_t shard,
                                              std::span<const io::TensorWrite> model,
                                              std::span<const io::TensorWrite> optimizer,
                                              const std::string& progress_name) {
  uint64_t tensor_bytes = 0;
  for (auto& t : model) tensor_bytes += io::tensor_write_bytes(t);
  for (auto& t : optimizer) tensor_bytes += io::tensor_write_bytes(t);
  std::atomic<uint64_t> written{0};
  std::optional<Progress> progress;
  if (!progress_name.empty())
    progress.emplace("checkpoint: saving " + progress_name, tensor_bytes, [&] { return written.load(); });
  std::vector<CheckpointFile> files;
  for (auto [kind, tensors] : {std::pair{"model", model}, {"optimizer", optimizer}}) {
    const fs::path path = dir / shard_file_name(kind, shard);
    // The checksum of the bytes as they are written: what reading the file back would give, without
    // the second pass over it. The gigabytes of a checkpoint go around the page cache: the kernel's
    // copies into fresh cache pages would otherwise take the cores the training steps use.
    WordChecksum checksum;
    io::write_safetensors(path, tensors, {{"titan", kind}, {"shard", std::to_string(shard)}},
                          {io::PageCache::Bypass, &checksum, &written});
    files.push_back({path.filename().string(), fs::file_size(path), checksum.value()});
  }
  return files;
}

CheckpointManager::CheckpointManager(fs::path folder, int64_t keep_latest_k)
    : folder_(std::move(folder)), keep_latest_k_(keep_latest_k) {}

fs::path CheckpointManager::step_dir(int64_t step) const { return folder_ / ("step-" + std::to_string(step)); }

fs::path CheckpointManager::hf_export_dir(int64_t step) const {
  return folder_ / ("step-" + std::to_string(step) + "-hf");
}

fs::path CheckpointManager::begin_save(int64_t step) {
  fs::create_directories(folder_);
  // Re-saving a step (e.g. after a resume that did no step) replaces it atomically.
  pending_.reset();
  pending_.emplace(step_dir(step), /*replace=*/true);
  return pending_->temp_path();
}

void CheckpointManager::commit_save(int64_t step, const std::vector<CheckpointFile>& shard_files,
                                    const nlohmann::json& train_state) {
  TITAN_CHECK(pending_ && pending_->path() == step_dir(step), "checkpoint: commit of step ", step,
              " without begin_save");
  const fs::path tmp = pending_->temp_path();
  nlohmann::json manifest;
  manifest["format"] = kManifestFormat;
  manifest["hash"] = kFnv1aName;
  manifest["step"] = step;
  for (const CheckpointFile& f : shard_files) {
    // Written by other processes: they must be visible here, whole, before anything is committed.
    std::error_code ec;
    const uint64_t seen = fs::file_size(tmp / f.name, ec);
    TITAN_CHECK(!ec && seen == f.bytes, "checkpoint: '", (tmp / f.name).string(), "' (", f.bytes,
                " bytes as its writer reported) is ", ec ? "not visible" : std::to_string(seen) + " bytes",
                " here: job.dump_folder must be on a file system every rank sees");
    manifest["files"][f.name] = {{"bytes", f.bytes}, {"checksum", std::to_string(f.checksum)}};
  }
  io::write_file_atomic(tmp / "train_state.json", train_state.dump(2) + "\n");
  manifest["files"]["train_state.json"] = {
      {"bytes", fs::file_size(tmp / "train_state.json")},
      {"checksum", std::to_string(file_checksum(tmp / "train_state.json"))}};
  io::write_file_atomic(tmp / "manifest.json", manifest.dump(2) + "\n");
  pending_->commit();
  pending_.reset();
  // The commit marker goes last: until it exists, the folder is not a checkpoint.
  io::write_file_atomic(step_dir(step) / "COMMITTED", "step " + std::to_string(step) + "\n");
  io::fsync_dir(step_dir(step));
  prune(step);
}

void CheckpointManager::prune(int64_t just_saved) const {
  auto remove = [&](const fs::path& dir) {
    // COMMITTED goes first: a deletion cut short leaves a folder that is ignored, never a
    // committed checkpoint with files missing. The manifest goes last: until then the folder is
    // still recognisably titan's, and the next prune finishes the job.
    std::error_code ec;
    fs::remove(dir / "COMMITTED", ec);
    for (auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename() != "manifest.json") fs::remove_all(e.path(), ec);
    fs::remove_all(dir, ec);
  };
  if (keep_latest_k_ > 0) {
    auto steps = committed_steps();
    for (size_t i = 0; i + size_t(keep_latest_k_) < steps.size(); ++i) remove(step_dir(steps[i]));
  }
  // Debris of saves that never finished: titan's step folders without COMMITTED (a crash between
  // the rename and the marker, or during a prune) and temporaries of killed processes.
  std::vector<fs::path> debris = interrupted_step_dirs();
  std::erase(debris, step_dir(just_saved));
  for (const fs::path& d : unfinished_saves()) debris.push_back(d);
  for (auto& d : debris) remove(d);
}

std::vector<fs::path> CheckpointManager::unfinished_saves() const {
  static const std::regex temp_re("\\.step-[0-9]+\\.tmp-[0-9]+-[0-9]+");
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return dirs;
  for (auto& e : fs::directory_iterator(folder_))
    if (e.is_directory() && std::regex_match(e.path().filename().string(), temp_re) &&
        io::is_stale_temporary(e.path()))
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<fs::path> CheckpointManager::step_dirs() const {
  std::vector<fs::path> dirs;
  if (!fs::is_directory(folder_)) return dirs;
  // Files named step-N too: another program's, set aside like its folders before a save of step N.
  for (auto& e : fs::directory_iterator(folder_))
    if (step_of_name(e.path())) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<int64_t> CheckpointManager::committed_steps() const {
  std::vector<int64_t> steps;
  for (const fs::path& d : step_dirs())
    if (fs::exists(d / "COMMITTED") && written_by_titan(d)) steps.push_back(*step_of_name(d));
  std::sort(steps.begin(), steps.end());  // by number (step-10 after step-9)
  return steps;
}

std::vector<fs::path> CheckpointManager::foreign_step_dirs() const {
  std::vector<fs::path> dirs = step_dirs();
  std::erase_if(dirs, [](const fs::path& d) { return written_by_titan(d) || committed_by_titan(d); });
  return dirs;
}

std::vector<fs::path> CheckpointManager::damaged_step_dirs() const {
  std::vector<fs::path> dirs = step_dirs();
  std::erase_if(dirs, [](const fs::path& d) { return written_by_titan(d) || !committed_by_titan(d); });
  return dirs;
}

std::vector<fs::path> CheckpointManager::interrupted_step_dirs() const {
  std::vector<fs::path> dirs = step_dirs();
  std::erase_if(dirs, [](const fs::path& d) { return fs::exists(d / "COMMITTED") || !written_by_titan(d); });
  return dirs;
}

std::optional<int64_t> CheckpointManager::latest_step() const {
  auto s = committed_steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}

fs::path CheckpointManager::set_aside(const fs::path& dir, const std::string& suffix) const {
  fs::path to = dir.string() + "." + suffix;
  for (int n = 2; fs::exists(to); ++n) to = dir.string() + "." + suffix + "-" + std::to_string(n);
  fs::rename(dir, to);
  io::fsync_dir(dir.parent_path());
  return to;
}

std::vector<std::pair<fs::path, fs::path>> CheckpointManager::set_aside_after(int64_t step) const {
  std::vector<std::pair<fs::path, fs::path>> moved;
  for (const int64_t s : committed_steps()) {
    if (s <= step) continue;
    for (const fs::path& from : {step_dir(s), hf_export_dir(s)})
      if (fs::exists(from)) moved.emplace_back(from, set_aside(from, "rolled-back"));
  }
  // A damaged step after it is the rolled-back trajectory too: out of the way of this run's saves.
  for (const fs::path& from : damaged_step_dirs())
    if (*step_of_name(from) > step) moved.emplace_back(from, set_aside(from, "rolled-back"));
  return moved;
}

std::string tokenizer_checksum(const fs::path& tokenizer_path) {
  return std::to_string(file_checksum(data::tokenizer_json(tokenizer_path)));
}

LoadedCheckpoint CheckpointManager::load(int64_t step, ChecksumShare share) const {
  return load_checkpoint_dir(step_dir(step), CheckpointParts::Everything, share);
}

LoadedCheckpoint load_checkpoint_dir(const fs::path& dir, CheckpointParts parts, ChecksumShare share) {
  TITAN_CHECK((share.count == 0 && share.index == 0) ||
                  (share.count >= 1 && share.index >= 0 && share.index < share.count),
              "checkpoint: checksum share ", share.index, " of ", share.count);
  auto wanted = [&](const std::string& name) {
    return parts == CheckpointParts::Everything || name.rfind("optimizer-rank", 0) != 0;
  };

  TITAN_CHECK(fs::is_directory(dir), "checkpoint: '", dir.string(), "' is not a directory");
  if (const std::string root = checkpoint_folder_given(dir); !root.empty() && !written_by_titan(dir))
    TITAN_FAIL("checkpoint: ", root);
  TITAN_CHECK(written_by_titan(dir), "checkpoint: '", dir.string(),
              "' is not a titan checkpoint (no manifest.json of titan's; a checkpoint is a step-N folder "
              "under a run's checkpoint folder)");
  TITAN_CHECK(fs::exists(dir / "COMMITTED"), "checkpoint: '", dir.string(),
              "' has no COMMITTED marker (an interrupted save); it cannot be loaded");
  nlohmann::json manifest = read_json(dir / "manifest.json");
  TITAN_CHECK(manifest.contains("files") && manifest["files"].is_object() && manifest.contains("step"),
              "checkpoint: '", (dir / "manifest.json").string(), "' lacks 'files' or 'step'");
  // The share's files: the wanted ones, largest first (by name among equals: nlohmann's objects
  // iterate in key order, the same on every rank), each to the share holding the fewest bytes.
  std::vector<std::pair<uint64_t, std::string>> by_size;
  for (auto& [name, info] : manifest["files"].items())
    if (wanted(name)) by_size.emplace_back(info.value("bytes", uint64_t(0)), name);
  std::stable_sort(by_size.begin(), by_size.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<uint64_t> load(size_t(share.count), 0);
  std::set<std::string> mine;
  uint64_t total = 0;
  for (auto& [bytes, name] : by_size) {
    if (share.count == 0) break;  // ChecksumShare::none()
    const size_t least = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    load[least] += bytes;
    if (int64_t(least) == share.index) mine.insert(name), total += bytes;
  }
  // The hash the checksums were computed with: named since 2026-12-01, the older basis before.
  const nlohmann::json hash = manifest.contains("hash") ? manifest["hash"] : nlohmann::json("");
  const std::optional<uint64_t> basis =
      hash.is_string() ? fnv1a_basis_named(hash.get<std::string>()) : std::nullopt;
  TITAN_CHECK(basis, "checkpoint: '", (dir / "manifest.json").string(), "' names the checksum hash ",
              hash.dump(), ", which this titan does not know (only \"", kFnv1aName, "\")");
  std::atomic<uint64_t> checked{0};
  Progress progress("checkpoint: verifying " + dir.filename().string(), total, [&] { return checked.load(); });
  // The manifest must account for the whole folder: a file it does not list would be loaded (or
  // shipped) unchecked, so it is an error, as is a listed file that is missing.
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    TITAN_CHECK(name == "manifest.json" || name == "COMMITTED" || manifest["files"].contains(name),
                "checkpoint: '", dir.string(), "' holds '", name,
                "' which manifest.json does not list (files are never loaded unchecked)");
  }
  TITAN_CHECK(manifest["files"].contains("train_state.json"), "checkpoint: '",
              (dir / "manifest.json").string(), "' does not list 'train_state.json'");
  std::string unresumable;
  std::vector<std::string> damage;  // each listed file that is missing, of another size or corrupted
  for (auto& [name, info] : manifest["files"].items()) {
    if (!wanted(name)) {
      // Not read, and not needed for the weights: only whether a resume could read it.
      std::error_code ec;
      const uint64_t bytes = fs::file_size(dir / name, ec);
      if (unresumable.empty() && (ec || bytes != info["bytes"].get<uint64_t>()))
        unresumable = "'" + (dir / name).string() + "' " +
                      (ec ? std::string("is missing")
                          : "has " + std::to_string(bytes) + " bytes, manifest.json says " +
                                std::to_string(info["bytes"].get<uint64_t>())) +
                      ": titan train cannot resume this checkpoint (its weights, all that is read here, are "
                      "whole)";
      continue;
    }
    const bool checksummed = mine.count(name) > 0;
    fs::path p = dir / name;
    if (!fs::exists(p)) {
      damage.push_back("'" + dir.string() + "' lacks '" + name + "' listed in manifest.json");
      continue;
    }
    // (A folder or a device in a file's place is no damage a restore from a backup repairs: said at once.)
    io::check_regular_file(p, "checkpoint");
    if (fs::file_size(p) != info["bytes"].get<uint64_t>()) {
      damage.push_back("'" + p.string() + "' has " + std::to_string(fs::file_size(p)) +
                       " bytes, manifest.json says " + std::to_string(info["bytes"].get<uint64_t>()));
      continue;
    }
    if (checksummed &&
        std::to_string(file_checksum(p, &checked, *basis)) != info["checksum"].get<std::string>())
      damage.push_back("'" + p.string() + "' fails its checksum (corrupted)");
  }
  // Every damaged file at once: a disk that damaged one often damaged others, and each round trip of
  // a restore from a backup would otherwise find only the next.
  if (!damage.empty()) {
    std::string all;
    for (const std::string& d : damage) all += (all.empty() ? "" : "; ") + d;
    TITAN_FAIL("checkpoint: ", all);
  }
  LoadedCheckpoint c{
      manifest["step"].get<int64_t>(), dir, read_json(dir / "train_state.json"), {}, {}, unresumable};
  // A copied or renamed folder: resuming "step-9" that holds step 4 would retrain steps 5.. on every
  // start and prune the real progress; the step must be the one the folder is named after.
  const nlohmann::json& saved_step = c.train_state["step"];
  TITAN_CHECK(saved_step.is_number_integer() && saved_step.get<int64_t>() == c.step, "checkpoint: '",
              dir.string(), "': manifest.json says step ", c.step, ", train_state.json says ",
              saved_step.dump());
  const std::optional<int64_t> named = step_of_name(dir);
  TITAN_CHECK(!named || *named == c.step, "checkpoint: '", dir.string(), "' holds the checkpoint of step ",
              c.step, ", not ", *named, " (a copied or renamed folder); rename it step-", c.step,
              " or move it out of the checkpoint folder");
  // The layout names the shard files; a checkpoint without one has a single pair.
  int64_t shards = 1;
  if (c.train_state.contains("layout")) {
    const nlohmann::json& layout = c.train_state["layout"];
    TITAN_CHECK(layout.is_object() && layout.contains("shards") && layout["shards"].is_number_integer() &&
                    layout["shards"].get<int64_t>() >= 1,
                "checkpoint: '", (dir / "train_state.json").string(), "': 'layout' lacks a positive 'shards'");
    shards = layout["shards"].get<int64_t>();
  }
  for (int64_t k = 0; k < shards; ++k)
    for (const char* kind : {"model", "optimizer"}) {
      const std::string name = shard_file_name(kind, k);
      TITAN_CHECK(manifest["files"].contains(name), "checkpoint: '", dir.string(), "' lacks '", name, "' (",
                  shards, " shards were written; manifest.json does not list it)");
      if (!wanted(name)) continue;
      (std::string(kind) == "model" ? c.model_files : c.optimizer_files)
          .push_back(io::SafetensorsFile::open(dir / name));
    }
  return c;
}

}  // namespace titan::train

#include "titan/data/data_identity.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/hash.h"

namespace titan::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// FNV-1a over the size, the first and the last MiB: cheap for a terabyte file, and any change of
// length or of the bytes a resume seeks near the start or end shows up.
std::string fingerprint(const fs::path& path, uint64_t size, uint64_t basis) {
  constexpr uint64_t kSample = uint64_t(1) << 20;
  std::ifstream f(path, std::ios::binary);
  TITAN_CHECK(f, "dataset: cannot read ", path, " to fingerprint it");
  uint64_t h = basis;
  auto mix = [&](const char* p, size_t n) { h = fnv1a(p, n, h); };
  mix(reinterpret_cast<const char*>(&size), sizeof size);
  std::vector<char> buf(kSample);
  auto sample = [&](uint64_t at) {
    f.clear();
    f.seekg(std::streamoff(at));
    f.read(buf.data(), std::streamsize(std::min(kSample, size - at)));
    TITAN_CHECK(f.gcount() == std::streamsize(std::min(kSample, size - at)), "dataset: short read in ", path,
                " while fingerprinting it");
    mix(buf.data(), size_t(f.gcount()));
  };
  sample(0);
  if (size > kSample) sample(std::max(kSample, size - kSample));
  return hash_hex(h);
}

}  // namespace

json dataset_identity(const std::vector<fs::path>& files) {
  json id = json::array();
  for (auto& p : files) {
    const uint64_t size = fs::file_size(p);
    id.push_back({{"path", fs::absolute(p).lexically_normal().string()},
                  {"bytes", size},
                  {"hash", kFnv1aName},
                  {"fingerprint", fingerprint(p, size, kFnv1aStart)}});
  }
  return id;
}

namespace {

// Up to three of `items`, then how many more.
std::string listed(const std::vector<std::string>& items) {
  std::string list;
  for (size_t i = 0; i < items.size() && i < 3; ++i) list += (i ? ", " : "") + items[i];
  if (items.size() > 3) list += " and " + std::to_string(items.size() - 3) + " more";
  return list;
}

// Why lines appended to `path` (its first `bytes` unchanged) could move or change the records before
// them, or "" when they cannot: a line-record format read as it lies on disk (a compressed stream's
// offsets, a table's footer, a plain-text paragraph or file document do not stay put), whose first
// `bytes` end with a newline.
std::string why_not_grown_by_lines(const fs::path& path, uint64_t bytes) {
  std::string ext = path.extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (ext != ".jsonl" && ext != ".ndjson" && ext != ".csv" && ext != ".tsv")
    return "only a .jsonl, .ndjson, .csv or .tsv file may grow, by lines appended; compressed, Parquet, "
           "Arrow and plain-text files may not";
  if (bytes == 0) return "";
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(bytes - 1));
  if (f.get() == '\n') return "";
  return "its old part ends inside a line (byte " + std::to_string(bytes) +
         " is no newline), so what was appended continues its last record";
}

}  // namespace

DatasetComparison compare_dataset_identity(const json& saved, const json& now) {
  if (!saved.is_array()) return {"the saved dataset identity is malformed", "", {}};
  const auto path_of = [](const json& f) { return f.value("path", std::string("?")); };
  const size_t common = std::min(saved.size(), now.size());
  const bool counts_differ = saved.size() != now.size();
  DatasetComparison result;
  std::vector<std::string> grown;
  for (size_t i = 0; i < common && result.mismatch.empty(); ++i) {
    const json& s = saved[i];
    const json& n = now[i];
    const std::string where =
        "file " + std::to_string(i) + " (checkpoint: '" + path_of(s) + "', now: '" + path_of(n) + "')";
    const uint64_t before = s.value("bytes", uint64_t(0)), after = n["bytes"].get<uint64_t>();
    // A checkpoint of before 2026-12-01 names no hash: its fingerprint started from the older basis.
    const std::optional<uint64_t> basis =
        fnv1a_basis_named(s.contains("hash") && s["hash"].is_string() ? s["hash"].get<std::string>()
                          : s.contains("hash")                        ? "?"
                                                                      : "");
    if (!basis) {
      result.mismatch = where + ": the checkpoint's fingerprint names a hash this titan does not know";
      break;
    }
    const fs::path path = n["path"].get<std::string>();
    // Over the checkpoint's size: the same file, or the part of a grown one the checkpoint read.
    const std::string now_print = *basis == kFnv1aStart && after == before
                                      ? n["fingerprint"].get<std::string>()
                                  : after >= before ? fingerprint(path, before, *basis)
                                                    : "";
    const bool same_start = s.value("fingerprint", "") == now_print;
    // Files of other names compared where the counts differ are out of step (one came or went
    // before them): what told them apart says nothing of either file, the lists below do.
    const bool in_step = !counts_differ || path_of(s) == path_of(n);
    if (after == before && same_start) continue;
    if (after > before && same_start) {
      const std::string why = why_not_grown_by_lines(path, before);
      if (why.empty()) {
        grown.push_back("'" + path.string() + "' from " + std::to_string(before) + " to " +
                        std::to_string(after) + " bytes");
        result.grown_files.push_back({i, before});
      } else {
        result.mismatch = where + ": size " + std::to_string(before) + " bytes in the checkpoint, " +
                          std::to_string(after) + " bytes now, its first " + std::to_string(before) +
                          " bytes unchanged, but " + why;
      }
      continue;
    }
    if (!in_step)
      result.mismatch = where + ": another file in its place";
    else if (after == before)
      result.mismatch = where + ": content fingerprint " + s.value("fingerprint", "?") +
                        " in the checkpoint, " + now_print + " now (same size, different content)";
    else
      result.mismatch =
          where + ": size " + std::to_string(before) + " bytes in the checkpoint, " + std::to_string(after) +
          " bytes now" +
          (after < before ? " (cut short)" : " (its first " + std::to_string(before) + " bytes changed too)");
  }
  if (counts_differ) {
    // Which files came or went, by path (a moved dataset names none of them alike: the counts alone).
    std::set<std::string> before, after;
    for (const json& f : saved) before.insert(path_of(f));
    for (const json& f : now) after.insert(path_of(f));
    std::vector<std::string> added, gone;
    bool added_among = false;  // a new file sorting before one of the checkpoint's moves it
    for (const json& f : now)
      if (!before.count(path_of(f))) {
        added.push_back("'" + path_of(f) + "'");
        added_among = added_among || (!saved.empty() && path_of(f) < path_of(saved.back()));
      }
    for (const json& f : saved)
      if (!after.count(path_of(f))) gone.push_back("'" + path_of(f) + "'");
    const std::string counts = "the checkpoint's dataset has " + std::to_string(saved.size()) +
                               (saved.size() == 1 ? " file" : " files") + ", this run's has " +
                               std::to_string(now.size()) + (added.empty() ? "" : "; new: " + listed(added)) +
                               (gone.empty() ? "" : "; gone: " + listed(gone));
    if (saved.size() > now.size() || !result.mismatch.empty())
      result.mismatch = (result.mismatch.empty() ? "" : result.mismatch + "; ") + counts +
                        (added_among ? ": files added to a dataset resume only when they sort after all of "
                                       "the checkpoint's"
                                     : "");
  }
  if (!result.mismatch.empty()) {
    result.grown_files.clear();
    return result;
  }
  if (!grown.empty()) result.growth = listed(grown) + " (lines appended)";
  if (now.size() > saved.size()) {
    std::vector<std::string> added;
    for (size_t i = saved.size(); i < now.size(); ++i) added.push_back("'" + path_of(now[i]) + "'");
    result.growth += (result.growth.empty() ? "" : "; ") + std::to_string(added.size()) +
                     (added.size() == 1 ? " new file" : " new files") + " after the checkpoint's " +
                     std::to_string(saved.size()) + ": " + listed(added);
  }
  return result;
}

}  // namespace titan::data

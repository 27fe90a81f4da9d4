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

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

// Whether lines appended to `path` leave the records before them as they were: a line-record format
// read as it lies on disk (a compressed stream's offsets, a table's footer, a plain-text paragraph
// or file document do not stay put), whose first `bytes` end a line.
bool grows_by_lines(const fs::path& path, uint64_t bytes) {
  std::string ext = path.extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (ext != ".jsonl" && ext != ".ndjson" && ext != ".csv" && ext != ".tsv") return false;
  if (bytes == 0) return true;
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(bytes - 1));
  return f.get() == '\n';
}

}  // namespace

DatasetComparison compare_dataset_identity(const json& saved, const json& now) {
  if (!saved.is_array()) return {"the saved dataset identity is malformed", ""};
  const size_t common = std::min(saved.size(), now.size());
  std::vector<std::string> grown;
  std::string mismatch;
  for (size_t i = 0; i < common && mismatch.empty(); ++i) {
    const json& s = saved[i];
    const json& n = now[i];
    const std::string where = "file " + std::to_string(i) + " (checkpoint: '" + s.value("path", "?") +
                              "', now: '" + n.value("path", "?") + "')";
    const uint64_t before = s.value("bytes", uint64_t(0)), after = n["bytes"].get<uint64_t>();
    // A checkpoint of before 2026-12-01 names no hash: its fingerprint started from the older basis.
    const std::optional<uint64_t> basis =
        fnv1a_basis_named(s.contains("hash") && s["hash"].is_string() ? s["hash"].get<std::string>()
                          : s.contains("hash")                        ? "?"
                                                                      : "");
    if (!basis) {
      mismatch = where + ": the checkpoint's fingerprint names a hash this titan does not know";
      break;
    }
    const fs::path path = n["path"].get<std::string>();
    // Over the checkpoint's size: the same file, or the part of a grown one the checkpoint read.
    const std::string now_print = *basis == kFnv1aStart && after == before
                                      ? n["fingerprint"].get<std::string>()
                                  : after >= before ? fingerprint(path, before, *basis)
                                                    : "";
    const bool same_start = s.value("fingerprint", "") == now_print;
    if (after == before && !same_start) {
      mismatch = where + ": content fingerprint " + s.value("fingerprint", "?") + " in the checkpoint, " +
                 now_print + " now (same size, different content)";
    } else if (after > before && same_start && grows_by_lines(path, before)) {
      grown.push_back(quoted(path.string()) + " from " + std::to_string(before) + " to " +
                      std::to_string(after) + " bytes");
    } else if (after != before) {
      mismatch =
          where + ": size " + std::to_string(before) + " bytes in the checkpoint, " + std::to_string(after) +
          " bytes now" +
          (after < before ? " (cut short)"
           : !same_start  ? " (its first " + std::to_string(before) + " bytes changed too)"
                          : " (grown: only a .jsonl, .ndjson, .csv or .tsv file whose old part ends a line "
                            "may grow, by lines appended; compressed, table and plain-text files may not)");
    }
  }
  if (mismatch.empty() && saved.size() > now.size()) {
    std::vector<std::string> gone;
    for (size_t i = now.size(); i < saved.size(); ++i) gone.push_back(quoted(saved[i].value("path", "?")));
    mismatch = "the checkpoint's dataset has " + std::to_string(saved.size()) +
               (saved.size() == 1 ? " file" : " files") + ", this run's has " + std::to_string(now.size()) +
               "; gone: " + listed(gone);
  }
  if (!mismatch.empty()) {
    // Files that came or went, by path, where the counts differ: a file added among the checkpoint's
    // (sorting before one of them) moves the later ones, whose comparison failed above.
    if (saved.size() < now.size()) {
      std::set<std::string> before;
      for (const json& f : saved) before.insert(f.value("path", "?"));
      std::vector<std::string> added;
      for (const json& f : now)
        if (!before.count(f.value("path", "?"))) added.push_back(quoted(f.value("path", "?")));
      mismatch += "; the run's dataset has " + std::to_string(now.size() - saved.size()) +
                  (now.size() - saved.size() == 1 ? " more file" : " more files") + " than the checkpoint's" +
                  (added.empty() ? "" : " (new: " + listed(added) + ")") +
                  ": files added to a dataset resume only when they sort after all of the checkpoint's";
    }
    return {mismatch, ""};
  }
  std::string growth;
  if (!grown.empty()) growth = listed(grown) + " (lines appended)";
  if (now.size() > saved.size()) {
    std::vector<std::string> added;
    for (size_t i = saved.size(); i < now.size(); ++i) added.push_back(quoted(now[i].value("path", "?")));
    growth += (growth.empty() ? "" : "; ") + std::to_string(added.size()) +
              (added.size() == 1 ? " new file" : " new files") + " after the checkpoint's " +
              std::to_string(saved.size()) + ": " + listed(added);
  }
  return {"", growth};
}

}  // namespace titan::data

#include "titan/data/data_identity.h"

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

std::string dataset_identity_mismatch(const json& saved, const json& now) {
  if (!saved.is_array()) return "the saved dataset identity is malformed";
  if (saved.size() != now.size()) {
    // Which files came or went, by path (a moved dataset names none of them alike: the counts alone).
    const auto paths = [](const json& files) {
      std::set<std::string> p;
      for (const json& f : files) p.insert(f.value("path", "?"));
      return p;
    };
    const std::set<std::string> before = paths(saved), after = paths(now);
    const auto listed = [](const std::set<std::string>& these, const std::set<std::string>& minus) {
      std::string list;
      size_t n = 0;
      for (const std::string& p : these)
        if (!minus.count(p) && n++ < 3) list += (list.empty() ? "'" : ", '") + p + "'";
      if (n > 3) list += " and " + std::to_string(n - 3) + " more";
      return list;
    };
    std::string which;
    if (const std::string added = listed(after, before); !added.empty()) which += "; new: " + added;
    if (const std::string gone = listed(before, after); !gone.empty()) which += "; gone: " + gone;
    return "the checkpoint's dataset has " + std::to_string(saved.size()) +
           (saved.size() == 1 ? " file" : " files") + ", this run's has " + std::to_string(now.size()) +
           which;
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    const json& s = saved[i];
    const json& n = now[i];
    const std::string where = "file " + std::to_string(i) + " (checkpoint: '" + s.value("path", "?") +
                              "', now: '" + n.value("path", "?") + "')";
    if (s.value("bytes", uint64_t(0)) != n["bytes"].get<uint64_t>())
      return where + ": size " + std::to_string(s.value("bytes", uint64_t(0))) +
             " bytes in the checkpoint, " + std::to_string(n["bytes"].get<uint64_t>()) + " bytes now";
    // A checkpoint of before 2026-12-01 names no hash: its fingerprint started from the older basis.
    const std::optional<uint64_t> basis =
        fnv1a_basis_named(s.contains("hash") && s["hash"].is_string() ? s["hash"].get<std::string>()
                          : s.contains("hash")                        ? "?"
                                                                      : "");
    if (!basis) return where + ": the checkpoint's fingerprint names a hash this titan does not know";
    const std::string now_print =
        *basis == kFnv1aStart ? n["fingerprint"].get<std::string>()
                              : fingerprint(n["path"].get<std::string>(), n["bytes"].get<uint64_t>(), *basis);
    if (s.value("fingerprint", "") != now_print)
      return where + ": content fingerprint " + s.value("fingerprint", "?") + " in the checkpoint, " +
             now_print + " now (same size, different content)";
  }
  return "";
}

}  // namespace titan::data

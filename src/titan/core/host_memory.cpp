#include "titan/core/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace titan {
namespace {

namespace fs = std::filesystem;

// A whole-number file (memory.max, memory.limit_in_bytes, ...); nullopt when absent, "max" or not a
// number.
std::optional<int64_t> read_bytes(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v < 0) return std::nullopt;
    return int64_t(v);
  } catch (...) {  // "max", or out of range
    return std::nullopt;
  }
}

// The tightest limit from `group` up to `root` (both inclusive), in `limit_name` files; v1 writes
// "no limit" as a number near 2^63, which counts as none.
void tightest_up_to(const fs::path& root, fs::path group, const char* limit_name, const char* used_name,
                    std::optional<CgroupMemoryLimit>& best) {
  if (!fs::is_directory(group)) group = root;  // the host's path, seen from inside a container
  constexpr int64_t kNoLimit = int64_t(1) << 62;
  for (;;) {
    const fs::path file = group / limit_name;
    if (const std::optional<int64_t> limit = read_bytes(file); limit && *limit < kNoLimit) {
      if (!best || *limit < best->limit)
        best = CgroupMemoryLimit{*limit, read_bytes(group / used_name).value_or(0), file.string()};
    }
    // Up to the hierarchy's root, never past it (a path with ".." in it stops at the root).
    if (group == root || group.parent_path() == group || !group.string().starts_with(root.string())) break;
    group = group.parent_path();
  }
}

}  // namespace

std::optional<CgroupMemoryLimit> cgroup_memory_limit(const std::string& mount,
                                                     const std::string& self_cgroup) {
  std::ifstream in(self_cgroup);
  std::optional<CgroupMemoryLimit> best;
  const fs::path root = fs::path(mount).lexically_normal();
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-id:controllers:path"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    // The group's folder under a hierarchy's mount: the path without its leading '/'.
    const fs::path relative = fs::path(path).relative_path().lexically_normal();
    auto folder = [&](const fs::path& hierarchy) {
      return relative.empty() || relative == "." ? hierarchy : hierarchy / relative;
    };
    if (id == "0" && controllers.empty()) {
      tightest_up_to(root, folder(root), "memory.max", "memory.current", best);
      continue;
    }
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory")
        tightest_up_to(root / "memory", folder(root / "memory"), "memory.limit_in_bytes",
                       "memory.usage_in_bytes", best);
  }
  return best;
}

int64_t host_memory_bytes() {
  static const int64_t bytes = [] {
    int64_t physical = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
    if (const std::optional<CgroupMemoryLimit> c = cgroup_memory_limit())
      physical = std::min(physical, c->limit);
    return physical;
  }();
  return bytes;
}

}  // namespace titan

#include "titan/core/cgroup.h"

#include <cfenv>
#include <fstream>
#include <sstream>

namespace titan {
namespace {

namespace fs = std::filesystem;

// Keeps the caller's floating-point exception flags as they were: libstdc++'s path operations raise
// "inexact" (a kernel that checks its caller's MXCSR, the first allocation inside it, would see it
// change).
struct KeepFloatingPointFlags {
  std::fexcept_t flags;
  KeepFloatingPointFlags() { std::fegetexceptflag(&flags, FE_ALL_EXCEPT); }
  ~KeepFloatingPointFlags() { std::fesetexceptflag(&flags, FE_ALL_EXCEPT); }
};

bool is_dir(const fs::path& p) {
  std::error_code ec;  // an unreadable path is not a group we can read, never an exception
  return fs::is_directory(p, ec);
}

// A group folder that is not under the mount (a container's host path, a "(deleted)" group): its
// nearest existing ancestor.
fs::path nearest_existing(const fs::path& root, fs::path group) {
  while (group != root && !is_dir(group)) {
    const fs::path up = group.parent_path();
    group = up == group ? root : up;
  }
  return group;
}

// The groups from `f.group` up to `f.root`, both inclusive.
std::vector<fs::path> groups_up(const CgroupFolder& f) {
  std::vector<fs::path> out;
  for (fs::path group = f.group;; group = group.parent_path()) {
    out.push_back(group);
    // At the mount, or (a group not under it) at the filesystem's root: nothing above.
    if (group == f.root || group.parent_path() == group) break;
  }
  return out;
}

// A number from the start of `file`'s text (a quota, a period), or nullopt ("max", absent, not a
// number).
std::optional<double> read_number(const fs::path& file, int field = 0) {
  std::ifstream in(file);
  std::string text;
  for (int i = 0; i <= field; ++i)
    if (!(in >> text)) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) return std::nullopt;
    return v;
  } catch (...) {  // "max", or out of range
    return std::nullopt;
  }
}

}  // namespace

std::vector<CgroupFolder> cgroup_folders(const std::string& controller, const std::string& mount,
                                         const std::string& self_cgroup) {
  const KeepFloatingPointFlags keep;
  std::vector<CgroupFolder> out;
  try {
    std::ifstream in(self_cgroup);
    // Without a trailing separator ("/sys/fs/cgroup/" normalises to itself): the walk up compares
    // the groups' paths with it.
    fs::path root = fs::path(mount).lexically_normal();
    if (!root.has_filename() && root.has_parent_path() && root != root.root_path()) root = root.parent_path();
    std::string line;
    while (std::getline(in, line)) {
      // "hierarchy-id:controllers:path"
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
      std::string path = line.substr(b + 1);
      if (const std::string deleted = " (deleted)"; path.ends_with(deleted))
        path.resize(path.size() - deleted.size());
      // The group's folder under a hierarchy's mount: the path without its leading '/'; one that
      // climbs out of it ("..") is read at the mount's root.
      const fs::path relative = fs::path(path).relative_path().lexically_normal();
      auto folder = [&](const fs::path& hierarchy, bool v2) {
        const bool inside = !relative.empty() && relative != "." && *relative.begin() != "..";
        return CgroupFolder{hierarchy, nearest_existing(hierarchy, inside ? hierarchy / relative : hierarchy),
                            v2};
      };
      if (id == "0" && controllers.empty()) {
        out.push_back(folder(root, true));
        continue;
      }
      // A v1 hierarchy is mounted under its controllers' names ("cpu,cpuacct"), often with a link
      // per controller ("cpu").
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');)
        if (c == controller)
          out.push_back(folder(is_dir(root / controllers) ? root / controllers : root / c, false));
    }
  } catch (...) {  // an unreadable cgroup filesystem binds nothing we can know
  }
  return out;
}

std::optional<CgroupCpuLimit> cgroup_cpu_limit(const std::string& mount, const std::string& self_cgroup) {
  const KeepFloatingPointFlags keep;
  std::optional<CgroupCpuLimit> out;
  for (const CgroupFolder& f : cgroup_folders("cpu", mount, self_cgroup))
    for (const fs::path& group : groups_up(f)) {
      const fs::path file = group / (f.v2 ? "cpu.max" : "cpu.cfs_quota_us");
      const std::optional<double> quota = read_number(file);
      const std::optional<double> period =
          f.v2 ? read_number(file, 1) : read_number(group / "cpu.cfs_period_us");
      if (!quota || !period || *quota <= 0 || *period <= 0) continue;  // none (v1 writes -1)
      const double cpus = *quota / *period;
      if (!out || cpus < out->cpus) out = CgroupCpuLimit{cpus, file.string()};
    }
  return out;
}

}  // namespace titan

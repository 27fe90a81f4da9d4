#include "titan/core/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfenv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "titan/core/cgroup.h"

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

// The keys of a memory.stat file ("file 123"), each 0 when absent.
std::map<std::string, int64_t> stat_values(const fs::path& file) {
  std::ifstream in(file);
  std::map<std::string, int64_t> out;
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) out[k] = v;
  return out;
}

struct Hierarchy {
  const char* limit;  // the limit's file
  const char* usage;  // what the group charges (page cache included)
  // memory.stat's keys: the page cache, and the parts of it the kernel cannot drop to make room
  // (dirty and under writeback until written; shared memory, without swap, never).
  const char *file, *dirty, *writeback, *shmem;
};
constexpr Hierarchy kV2{"memory.max", "memory.current", "file", "file_dirty", "file_writeback", "shmem"};
constexpr Hierarchy kV1{"memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache",
                        "total_dirty",           "total_writeback",       "total_shmem"};

// Every limited group from `group` up to `root` (both inclusive): the tightest limit, and the least
// room any of them leaves (a parent shared with other groups may leave less than the child's own
// limit). A group's use leaves out its clean page cache, which the kernel drops before it kills
// (a dataset read in an earlier epoch, a checkpoint written, the page cache of every pod under a
// Kubernetes node's kubepods group). v1 writes "no limit" as a number near 2^63, which counts as
// none.
void walk_up(const fs::path& root, fs::path group, const Hierarchy& h,
             std::optional<CgroupMemoryLimit>& out) {
  constexpr int64_t kNoLimit = int64_t(1) << 62;
  for (;;) {
    if (const std::optional<int64_t> limit = read_bytes(group / h.limit); limit && *limit < kNoLimit) {
      const int64_t charged = read_bytes(group / h.usage).value_or(0);
      std::map<std::string, int64_t> stat = stat_values(group / "memory.stat");
      const int64_t clean_cache =
          std::max<int64_t>(stat[h.file] - stat[h.dirty] - stat[h.writeback] - stat[h.shmem], 0);
      const int64_t used = std::max<int64_t>(charged - clean_cache, 0);
      const int64_t room = std::max<int64_t>(*limit - used, 0);
      if (!out) out = CgroupMemoryLimit{*limit, room, (group / h.limit).string()};
      if (*limit < out->limit) {
        out->limit = *limit;
        out->file = (group / h.limit).string();
      }
      out->available = std::min(out->available, room);
    }
    // At the mount, or (a group not under it) at the filesystem's root: nothing above.
    if (group == root || group.parent_path() == group) break;
    group = group.parent_path();
  }
}

}  // namespace

std::optional<CgroupMemoryLimit> cgroup_memory_limit(const std::string& mount,
                                                     const std::string& self_cgroup) {
  // The caller's floating-point exception flags stay as they were: libstdc++'s path operations
  // raise "inexact" (a kernel that checks its caller's MXCSR, the first allocation inside it,
  // would see it change).
  std::fexcept_t flags;
  std::fegetexceptflag(&flags, FE_ALL_EXCEPT);
  struct Restore {
    const std::fexcept_t& flags;
    ~Restore() { std::fesetexceptflag(&flags, FE_ALL_EXCEPT); }
  } restore{flags};
  try {
    std::optional<CgroupMemoryLimit> out;
    for (const CgroupFolder& f : cgroup_folders("memory", mount, self_cgroup))
      walk_up(f.root, f.group, f.v2 ? kV2 : kV1, out);
    return out;
  } catch (...) {  // an unreadable cgroup filesystem binds nothing we can know
    return std::nullopt;
  }
}

int64_t host_memory_bytes() {
  static const int64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    // Without a figure from sysconf (never on Linux), no bound but the cgroup's.
    int64_t physical = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : INT64_MAX;
    if (const std::optional<CgroupMemoryLimit> c = cgroup_memory_limit())
      physical = std::min(physical, c->limit);
    return physical;
  }();
  return bytes;
}

int64_t host_available_bytes() {
  int64_t available = INT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, rest;
  int64_t kib = 0;
  bool found = false;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, rest);
    if (key == "MemAvailable:") {
      available = kib * 1024;
      found = true;
      break;
    }
  }
  if (!found) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = int64_t(pages) * int64_t(page);
  }
  // A container's memory limit (its cgroup's, v1 or v2) binds before the machine's memory does.
  if (const std::optional<CgroupMemoryLimit> c = cgroup_memory_limit())
    available = std::min(available, c->available);
  return available;
}

std::string host_available_name() {
  std::string name = "this machine's MemAvailable";
  if (const std::optional<CgroupMemoryLimit> c = cgroup_memory_limit()) {
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.3g GiB", double(c->limit) / double(int64_t(1) << 30));
    name += " within the cgroup limit of " + c->file + " (" + gib + ")";
  }
  return name;
}

int fault_in_pages(void* p, size_t bytes, bool advice) {
  constexpr size_t kChunk = size_t(2) << 20, kPage = 4096;
  const int64_t chunks = int64_t(bytes / kChunk);
  int failed = 0;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    char* chunk = static_cast<char*>(p) + size_t(c) * kChunk;
    if (advice && madvise(chunk, kChunk, MADV_POPULATE_WRITE) == 0) continue;
    if (advice && errno == ENOMEM) {
#pragma omp atomic write
      failed = ENOMEM;
      continue;
    }
    for (size_t o = 0; o < kChunk; o += kPage) static_cast<volatile char*>(chunk)[o] = 0;
  }
  return failed;
}

}  // namespace titan

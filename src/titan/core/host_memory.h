#pragma once
// The host memory this process may use: the machine's physical memory, capped by the memory limit
// of the control group it runs in (a container's, a batch system's job). Both cgroup versions:
//   v2: memory.max (a number, or "max" for none) of the process's group and of every group above
//       it, each with its memory.current;
//   v1: memory.limit_in_bytes of the memory controller's group and every group above it (no limit
//       reads as a number near 2^63), each with its memory.usage_in_bytes.
// A group's use counts what it charges less its clean page cache, which the kernel drops before it
// kills (memory.stat's file less file_dirty, file_writeback and shmem; v1 the total_ keys of cache,
// dirty, writeback and shmem).
// The process's groups are found as core/cgroup.h finds them (the memory controller's). Anything
// unreadable binds nothing.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace titan {

struct CgroupMemoryLimit {
  int64_t limit = 0;      // bytes: the tightest limit on the path to the root
  int64_t available = 0;  // bytes: the least room any limited group on the path leaves now
  std::string file;       // the tightest limit's file, for messages
};

// The limit that binds this process, or nullopt (no limit, or no cgroup filesystem). `mount` is
// where the cgroup filesystems are mounted and `self_cgroup` the file listing this process's
// groups; tests pass folders of their own.
std::optional<CgroupMemoryLimit> cgroup_memory_limit(const std::string& mount = "/sys/fs/cgroup",
                                                     const std::string& self_cgroup = "/proc/self/cgroup");

// Physical memory, capped by cgroup_memory_limit(): read once per process. The CPU device's
// capacity (the metrics' memory percentage, and one of the two bounds past which its caching
// allocator returns cached segments and then refuses; host_available_bytes is the other).
int64_t host_memory_bytes();

// Faults in `bytes` of fresh anonymous memory at `p` (2 MiB aligned, a multiple of 2 MiB), 2 MiB
// per OpenMP thread at a time (the kernel zeroes each page it faults in: the work of a first touch,
// spread as a parallel first touch spreads it, over the threads' memory nodes too), with
// MADV_POPULATE_WRITE, or, where the kernel lacks it (before Linux 5.14) or a seccomp filter
// refuses it, or with `advice` false, a write to every 4 KiB page. 0, or ENOMEM when the kernel had
// no memory to give (the caller unmaps).
int fault_in_pages(void* p, size_t bytes, bool advice = true);

// Bytes available to a new allocation now: MemAvailable of /proc/meminfo (else
// sysconf(_SC_AVPHYS_PAGES) x page size), capped by what the process's cgroup limit leaves. Read
// afresh at each call: the start-up memory checks, and the CPU device before it maps a segment.
int64_t host_available_bytes();
// What that figure is, for messages: "this machine's MemAvailable", and where a cgroup limit caps
// it, "this machine's MemAvailable within the cgroup limit of /sys/fs/cgroup/.../memory.max
// (8 GiB)": a user in a container reads which limit, not the machine's memory, refused the job.
std::string host_available_name();

}  // namespace titan

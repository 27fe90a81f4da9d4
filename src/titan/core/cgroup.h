#pragma once
// The control groups this process runs in (a container's, a batch system's job, a Kubernetes pod's)
// and the CPU time they allow. The process's groups come from /proc/self/cgroup ("0::/path" for
// cgroup v2, "N:controllers:/path" for v1). In a container without a cgroup namespace that path is
// the host's, while the mount shows the container's own group at its root: a group folder that does
// not exist under the mount (that, or a "(deleted)" group) is read at its nearest existing ancestor;
// a path climbing out of the mount ("..") at the mount's root. Anything unreadable binds nothing.
// (The memory limit, core/host_memory.h, reads the same groups.)
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace titan {

struct CgroupFolder {
  std::filesystem::path root;   // the hierarchy's mount: the walk up the groups stops there
  std::filesystem::path group;  // the process's group under it (its nearest existing folder)
  bool v2 = false;              // the unified hierarchy (v2) or a v1 controller's
};

// The folders of this process's groups that `controller` ("memory", "cpu") is read from: v2's unified
// group, and the group of each v1 hierarchy that lists the controller. `mount` is where the cgroup
// filesystems are mounted and `self_cgroup` the file listing this process's groups; tests pass
// folders of their own. Throws nothing.
std::vector<CgroupFolder> cgroup_folders(const std::string& controller,
                                         const std::string& mount = "/sys/fs/cgroup",
                                         const std::string& self_cgroup = "/proc/self/cgroup");

struct CgroupCpuLimit {
  double cpus = 0;   // CPU time per second of wall time the tightest quota allows: quota / period
  std::string file;  // that quota's file, for messages
};

// The tightest CPU quota from the process's group up to the root (v2 cpu.max "quota period", "max"
// for none; v1 cpu.cfs_quota_us over cpu.cfs_period_us, -1 for none), or nullopt: threads past it
// share its CPU time, as a Kubernetes pod's CPU limit makes them.
std::optional<CgroupCpuLimit> cgroup_cpu_limit(const std::string& mount = "/sys/fs/cgroup",
                                               const std::string& self_cgroup = "/proc/self/cgroup");

}  // namespace titan

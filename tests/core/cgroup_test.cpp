// The CPU time a process's cgroups allow (core/cgroup.h), read from cgroup filesystems the tests
// write: the tightest quota on the way up binds, v2 and v1.
#include "titan/core/cgroup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "test_util.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

}  // namespace

// cgroup v2: cpu.max "quota period" of the group or any group above it; "max" is none.
TEST(Cgroup, AV2CpuQuotaBindsFromTheGroupOrAnyGroupAboveIt) {
  const fs::path mount = titan::testing::temp_dir("cgroup_cpu_v2");
  write(mount / "cpu.max", "max 100000");
  write(mount / "kubepods" / "cpu.max", "400000 100000");
  write(mount / "kubepods" / "pod" / "cpu.max", "max 100000");
  write(mount / "self", "0::/kubepods/pod");
  std::optional<CgroupCpuLimit> c = cgroup_cpu_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->cpus, 4.0);
  EXPECT_EQ(fs::path(c->file), mount / "kubepods" / "cpu.max");
  write(mount / "kubepods" / "pod" / "cpu.max", "150000 100000");  // a pod's limit of 1.5 CPUs
  c = cgroup_cpu_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->cpus, 1.5);
  EXPECT_EQ(fs::path(c->file), mount / "kubepods" / "pod" / "cpu.max");
  write(mount / "kubepods" / "cpu.max", "max 100000");
  write(mount / "kubepods" / "pod" / "cpu.max", "max 100000");
  EXPECT_FALSE(cgroup_cpu_limit(mount.string(), (mount / "self").string()));
  // No cgroup filesystem at all: none.
  EXPECT_FALSE(cgroup_cpu_limit((mount / "absent").string(), (mount / "absent" / "self").string()));
}

// cgroup v1: the cpu controller's hierarchy (mounted as "cpu,cpuacct"), cpu.cfs_quota_us over
// cpu.cfs_period_us, -1 for none; a container's group missing under the mount is read at its nearest
// existing folder.
TEST(Cgroup, AV1CpuQuotaBindsAndMinusOneIsNone) {
  const fs::path mount = titan::testing::temp_dir("cgroup_cpu_v1");
  write(mount / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1");
  write(mount / "cpu,cpuacct" / "cpu.cfs_period_us", "100000");
  write(mount / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "250000");
  write(mount / "cpu,cpuacct" / "job" / "cpu.cfs_period_us", "100000");
  write(mount / "self", "12:pids:/job\n4:cpu,cpuacct:/job/docker-0123.scope\n0::/\n");
  std::optional<CgroupCpuLimit> c = cgroup_cpu_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->cpus, 2.5);
  EXPECT_EQ(fs::path(c->file), mount / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us");
  const std::vector<CgroupFolder> folders = cgroup_folders("cpu", mount.string(), (mount / "self").string());
  ASSERT_EQ(folders.size(), 2u);  // v1's, and v2's root (which holds no cpu.max here)
  EXPECT_EQ(folders[0].group, mount / "cpu,cpuacct" / "job");
  EXPECT_FALSE(folders[0].v2);
  EXPECT_TRUE(folders[1].v2);
  write(mount / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "-1");
  EXPECT_FALSE(cgroup_cpu_limit(mount.string(), (mount / "self").string()));
}

#include "titan/core/host_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cfenv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

constexpr int64_t GiB = int64_t(1) << 30;

}  // namespace

// cgroup v2: the tightest memory.max from the process's group up to the root binds, and the room
// left is the least any limited group on the way leaves; "max" is no limit.
TEST(HostMemory, ACgroupV2LimitBindsFromTheGroupOrAnyGroupAboveIt) {
  const fs::path mount = titan::testing::temp_dir("cgroup_v2");
  write(mount / "memory.max", "max");
  write(mount / "job" / "memory.max", std::to_string(8 * GiB));
  write(mount / "job" / "memory.current", "1000");
  write(mount / "job" / "step" / "memory.max", "max");
  write(mount / "job" / "step" / "memory.current", "500");
  write(mount / "self", "0::/job/step");
  std::optional<CgroupMemoryLimit> c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 8 * GiB);
  EXPECT_EQ(c->available, 8 * GiB - 1000);
  EXPECT_EQ(fs::path(c->file), mount / "job" / "memory.max");
  // The mount written with a trailing separator is the same mount (the walk up used to pass it and
  // spin at "/").
  c = cgroup_memory_limit(mount.string() + "/", (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 8 * GiB);
  // A tighter limit below wins.
  write(mount / "job" / "step" / "memory.max", std::to_string(2 * GiB));
  c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 2 * GiB);
  EXPECT_EQ(c->available, 2 * GiB - 500);
  EXPECT_EQ(fs::path(c->file), mount / "job" / "step" / "memory.max");
  // A parent whose other groups use most of its limit leaves less room than the child's own limit.
  write(mount / "job" / "memory.current", std::to_string(7 * GiB));
  c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 2 * GiB);
  EXPECT_EQ(c->available, 1 * GiB);
  // Clean page cache, which the kernel drops before it kills, is room, not use; dirty pages, pages
  // under writeback and shared memory are not.
  write(mount / "job" / "memory.stat",
        "anon 100\nfile " + std::to_string(GiB / 2 + 1000) +
            "\nactive_file 7\nfile_dirty 600\nfile_writeback 300\nshmem 100\n");
  c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->available, 1 * GiB + GiB / 2);
  // No limit anywhere: none.
  write(mount / "job" / "memory.max", "max");
  write(mount / "job" / "step" / "memory.max", "max");
  EXPECT_FALSE(cgroup_memory_limit(mount.string(), (mount / "self").string()));
}

// cgroup v1 (the memory controller's own hierarchy, listed among others): memory.limit_in_bytes,
// where "no limit" is a number near 2^63; a v2 line without memory files beside it changes nothing.
TEST(HostMemory, ACgroupV1LimitBindsAndItsNoLimitNumberIsNone) {
  const fs::path mount = titan::testing::temp_dir("cgroup_v1");
  write(mount / "memory" / "memory.limit_in_bytes", "9223372036854771712");
  write(mount / "memory" / "batch" / "memory.limit_in_bytes", std::to_string(4 * GiB));
  write(mount / "memory" / "batch" / "memory.usage_in_bytes", "123456");
  write(mount / "memory" / "batch" / "memory.stat",
        "cache 5000\ntotal_cache 33456\ntotal_dirty 6000\ntotal_writeback 3000\ntotal_shmem 1000\n");
  write(mount / "self", "12:pids:/batch\n4:cpu,memory:/batch\n0::/\n");
  std::optional<CgroupMemoryLimit> c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 4 * GiB);
  EXPECT_EQ(c->available, 4 * GiB - 100000);
  write(mount / "memory" / "batch" / "memory.limit_in_bytes", "9223372036854771712");
  EXPECT_FALSE(cgroup_memory_limit(mount.string(), (mount / "self").string()));
}

// A container without a cgroup namespace lists the host's path for its group, while the mount
// shows the container's own group at its root: the limit is read at the nearest existing folder.
// So is a "(deleted)" group's; a path climbing out of the mount is read at its root.
TEST(HostMemory, AGroupPathMissingUnderTheMountIsReadAtItsNearestExistingAncestor) {
  const fs::path mount = titan::testing::temp_dir("cgroup_container");
  write(mount / "memory.max", std::to_string(3 * GiB));
  write(mount / "memory.current", "77");
  write(mount / "self", "0::/system.slice/docker-0123abcd.scope");
  std::optional<CgroupMemoryLimit> c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 3 * GiB);
  EXPECT_EQ(c->available, 3 * GiB - 77);
  write(mount / "job" / "memory.max", std::to_string(2 * GiB));
  write(mount / "self", "0::/job/gone (deleted)");
  c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->limit, 2 * GiB) << "the deleted group's parent still binds";
  write(mount / "self", "0::/../..");
  c = cgroup_memory_limit(mount.string(), (mount / "self").string());
  ASSERT_TRUE(c);
  EXPECT_EQ(fs::path(c->file), mount / "memory.max") << "nothing above the mount is read";
  // No cgroup filesystem at all (or no /proc): none.
  EXPECT_FALSE(cgroup_memory_limit((mount / "absent").string(), (mount / "absent" / "self").string()));
  // The caller's floating-point exception flags are as they were (the first CPU allocation of a
  // kernel that checks its caller's state asks for this). The arguments are built first: the
  // test's own path operations may raise "inexact" too.
  const std::string mount_name = mount.string(), self_name = (mount / "self").string();
  std::feclearexcept(FE_ALL_EXCEPT);
  c = cgroup_memory_limit(mount_name, self_name);
  EXPECT_EQ(std::fetestexcept(FE_ALL_EXCEPT), 0);
  std::feraiseexcept(FE_INEXACT);
  c = cgroup_memory_limit(mount_name, self_name);
  EXPECT_EQ(std::fetestexcept(FE_ALL_EXCEPT), FE_INEXACT) << "a flag the caller had stays raised";
}

// Both ways of faulting a fresh segment in (the CPU device does it when it maps one, so that the
// kernel's figure of available memory counts it): MADV_POPULATE_WRITE, and the write to every page
// a kernel without it (before 5.14) or a seccomp filter refusing it leaves. Every page is resident
// after either, and reads zero.
TEST(HostMemory, FreshSegmentsAreFaultedInWithOrWithoutTheKernelsAdvice) {
  constexpr size_t kBytes = size_t(8) << 20, kPage = 4096;
  for (const bool advice : {true, false}) {
    SCOPED_TRACE(advice ? "MADV_POPULATE_WRITE" : "a write to every page");
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::vector<unsigned char> resident(kBytes / kPage);
    ASSERT_EQ(mincore(p, kBytes, resident.data()), 0);
    EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }), 0)
        << "a fresh mapping holds no page";
    EXPECT_EQ(fault_in_pages(p, kBytes, advice), 0);
    ASSERT_EQ(mincore(p, kBytes, resident.data()), 0);
    EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }),
              std::ptrdiff_t(kBytes / kPage));
    const unsigned char* bytes = static_cast<const unsigned char*>(p);
    EXPECT_EQ(std::count(bytes, bytes + kBytes, 0), std::ptrdiff_t(kBytes));
    ASSERT_EQ(munmap(p, kBytes), 0);
  }
}

// This process's figure: the physical memory, or less where a cgroup limit binds; the CPU device
// reports it as its capacity.
TEST(HostMemory, TheCpuDevicesCapacityIsThePhysicalMemoryCappedByTheCgroup) {
  const int64_t physical = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  const std::optional<CgroupMemoryLimit> c = cgroup_memory_limit();
  EXPECT_EQ(host_memory_bytes(), c ? std::min(physical, c->limit) : physical);
  EXPECT_GT(host_memory_bytes(), 0);
  EXPECT_EQ(device_services(Device::CPU).capacity_bytes(), host_memory_bytes());
}

namespace {

// A memory cgroup of this machine's own, limited to `limit` bytes, removed when done; `skipped`
// says why none could be made (not root, no writable cgroup filesystem, no memory controller).
struct LimitedCgroup {
  fs::path dir, procs;
  std::string skipped;
  explicit LimitedCgroup(int64_t limit) {
    const std::string name = "titan_test_" + std::to_string(::getpid());
    std::error_code ec;
    if (fs::is_directory("/sys/fs/cgroup/memory")) {  // v1
      dir = fs::path("/sys/fs/cgroup/memory") / name;
      if (!fs::create_directory(dir, ec) || ec) {
        fail("cannot create " + dir.string());
        return;
      }
      if (!(std::ofstream(dir / "memory.limit_in_bytes") << limit)) {
        fail("cannot limit " + dir.string());
        return;
      }
    } else {  // v2: a child of the root group, where the memory controller is enabled for children
      std::ifstream subtree("/sys/fs/cgroup/cgroup.subtree_control");
      std::string controllers((std::istreambuf_iterator<char>(subtree)), std::istreambuf_iterator<char>());
      if (controllers.find("memory") == std::string::npos) {
        fail("no memory controller for child groups of /sys/fs/cgroup");
        return;
      }
      dir = fs::path("/sys/fs/cgroup") / name;
      if (!fs::create_directory(dir, ec) || ec) {
        fail("cannot create " + dir.string());
        return;
      }
      if (!(std::ofstream(dir / "memory.max") << limit)) {
        fail("cannot limit " + dir.string());
        return;
      }
    }
    // The kernel takes a limit when the file is closed: read back what it holds.
    std::ifstream back(dir /
                       (fs::is_directory("/sys/fs/cgroup/memory") ? "memory.limit_in_bytes" : "memory.max"));
    int64_t held = 0;
    if (!(back >> held) || held != limit) {
      fail("the limit did not take in " + dir.string());
      return;
    }
    procs = dir / "cgroup.procs";
  }
  void fail(const std::string& why) {
    skipped = why;
    remove();
  }
  void remove() {
    std::error_code ec;
    if (!dir.empty()) fs::remove(dir, ec);  // rmdir: the group is empty once its process ended
    dir.clear();
  }
  ~LimitedCgroup() { remove(); }
};

}  // namespace

// A process inside a memory cgroup plans against the group's limit, not the machine's memory:
// titan plan (which titan train's start-up check shares) run in a group limited to 1 GiB says a
// debugmodel job does not fit that.
TEST(HostMemory, APlanInsideALimitedCgroupIsJudgedByTheLimit) {
  LimitedCgroup group(GiB);
  if (!group.skipped.empty()) GTEST_SKIP() << "no cgroup to run in: " << group.skipped;
  std::string out;
  const int rc = titan::testing::run_command(
      "sh -c 'echo $$ > " + group.procs.string() + " && exec " + titan::testing::titan_binary().string() +
          " plan --config " + (titan::testing::source_dir() / "configs" / "debugmodel.toml").string() +
          " --gemm-tflops 1' 2>&1",
      &out);
  EXPECT_EQ(rc, 3) << "a job that does not fit exits 3\n" << out;
  EXPECT_NE(out.find("fits: NO, reserved"), std::string::npos) << out;
  // It names the limit that binds, not only the machine's memory.
  EXPECT_NE(out.find("within the cgroup limit of " + (group.dir / "memory.").string()), std::string::npos)
      << out;
  // The available memory printed: the limit less what the group already charges (under 1 GiB).
  const size_t at = out.find(" per rank (this machine's MemAvailable");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t of = out.rfind(" > ", at);
  ASSERT_NE(of, std::string::npos) << out;
  const double gib = std::stod(out.substr(of + 3, at - of - 3));
  EXPECT_GT(gib, 0.5) << out;
  EXPECT_LE(gib, 1.0) << out;
}

// The CPU device maps no segment the host cannot give now: a process in a memory cgroup that
// allocates tensors until none fits gets an error naming the request and the limit, not the
// cgroup's OOM kill. The group is limited to 256 MiB; this test binary, run again inside it,
// holds 32 MiB tensors until the device refuses one (the child below).
constexpr const char* kFillChildEnv = "TITAN_TEST_FILL_CGROUP";

TEST(HostMemory, TensorsFillingALimitedCgroupEndInAnErrorNotAKill) {
  constexpr int64_t MiB = int64_t(1) << 20;
  LimitedCgroup group(256 * MiB);
  if (!group.skipped.empty()) GTEST_SKIP() << "no cgroup to run in: " << group.skipped;
  std::string out;
  const int rc =
      titan::testing::run_command("sh -c 'echo $$ > " + group.procs.string() + " && " + kFillChildEnv +
                                      "=1 exec " + fs::read_symlink("/proc/self/exe").string() +
                                      " --gtest_filter=HostMemory.ChildFillsItsCgroupWithTensors' 2>&1",
                                  &out);
  EXPECT_EQ(rc, 0) << "the child ended by itself (an OOM kill is signal 9)\n" << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
  EXPECT_NE(out.find("out of CPU memory allocating 33554432 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find((group.dir / "memory.").string()), std::string::npos) << "the limit is named\n" << out;
}

TEST(HostMemory, ChildFillsItsCgroupWithTensors) {
  if (!std::getenv(kFillChildEnv)) GTEST_SKIP() << "runs inside a cgroup, started by the test above";
  std::vector<Tensor> held;
  const std::string e = titan::testing::error_of([&] {
    for (int i = 0; i < 64; ++i) held.push_back(Tensor::full({8 << 20}, 1.0, DType::F32));  // 32 MiB each
  });
  std::printf("held %zu tensors of 32 MiB, then: %s\n", held.size(), e.c_str());
  ASSERT_FALSE(e.empty()) << "64 x 32 MiB cannot fit 256 MiB";
  // Most of the room was used before the refusal: the check is the kernel's figure, not a guess.
  EXPECT_GE(held.size(), 4u);
  // The device still serves what fits once the tensors are gone.
  held.clear();
  device_services(Device::CPU).release_cached();
  EXPECT_EQ(Tensor::full({8 << 20}, 3.0, DType::F32).data<float>()[(8 << 20) - 1], 3.0f);
}

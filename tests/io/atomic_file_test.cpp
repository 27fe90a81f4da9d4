// Atomic file and directory writes: content appears whole or not at all, temporaries never linger.
#include "titan/io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "io_test_util.h"

namespace titan::io {
namespace {

namespace fs = std::filesystem;
using namespace titan::io::testing;

size_t entries(const fs::path& dir) {
  return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

TEST(AtomicFile, WritesAndReplaces) {
  fs::path dir = titan::testing::temp_dir("atomic_file");
  write_file_atomic(dir / "a.txt", "first");
  EXPECT_EQ(read_bytes(dir / "a.txt"), "first");
  {
    AtomicFile f(dir / "a.txt");
    f.write("sec");
    f.write("ond", 3);
    EXPECT_EQ(f.bytes_written(), 6u);
    EXPECT_EQ(read_bytes(dir / "a.txt"), "first");  // old content until commit
    EXPECT_EQ(entries(dir), 2u);                    // a.txt and the temporary
    f.commit();
    expect_error([&] { f.write("x"); }, {"write after commit"});
  }
  EXPECT_EQ(read_bytes(dir / "a.txt"), "second");
  EXPECT_EQ(entries(dir), 1u);
}

// FNV-1a over the 8-byte little-endian words, the last (size % 8) bytes one by one: the checksum
// checkpoint manifests record, written out plainly here as the reference for WordChecksum.
uint64_t word_checksum_of(const std::string& bytes) {
  uint64_t h = kFnv1aStart;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; --b) w = (w << 8) | uint8_t(bytes[i + size_t(b)]);
    h = (h ^ w) * kFnv1aPrime;
  }
  for (; i < bytes.size(); ++i) h = (h ^ uint8_t(bytes[i])) * kFnv1aPrime;
  return h;
}

// PageCache::Bypass (checkpoint files): O_DIRECT through an aligned buffer of 8 MiB. Whatever the
// pieces (a few bytes, a block, across the buffer's end, from unaligned addresses) and the total (a
// whole number of blocks or not, nothing at all), the file holds exactly the bytes written, the
// WordChecksum fed as they are written is the reference's and the progress count is the size. Also
// on /dev/shm (tmpfs) where the machine has it, which takes O_DIRECT since Linux 6.6 and refuses it
// before (then the file is written through the cache).
TEST(AtomicFile, BypassingThePageCacheWritesTheSameBytes) {
  std::string bytes(size_t(21) << 20, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : bytes) {  // xorshift64: no run of equal bytes to hide a misplaced piece
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = char(x >> 56);
  }
  const std::vector<size_t> pieces = {13, 4096, 1, (size_t(8) << 20) + 5, 3, 4093, 0, size_t(9) << 20};
  std::vector<fs::path> dirs = {titan::testing::temp_dir("atomic_direct")};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");
  for (const fs::path& dir : dirs)
    for (const size_t total : {bytes.size() - 1, size_t(3) << 20, size_t(0)}) {  // odd, whole blocks, empty
      const fs::path path = dir / ("direct-" + std::to_string(::getpid()) + ".bin");
      const char* source = bytes.data() + 1;  // an unaligned address
      WordChecksum checksum;
      std::atomic<uint64_t> progress{0};
      {
        AtomicFile f(path, {PageCache::Bypass, &checksum, &progress});
        size_t at = 0;
        for (size_t i = 0; at < total; ++i) {
          const size_t n = std::min(i < pieces.size() ? pieces[i] : size_t(1) << 20, total - at);
          f.write(source + at, n);
          at += n;
          EXPECT_EQ(f.bytes_written(), at);
        }
        f.commit();
      }
      const std::string expect = bytes.substr(1, total), got = read_bytes(path);
      EXPECT_EQ(got.size(), total) << path;
      EXPECT_TRUE(got == expect) << path << ": the file's bytes differ from those written";
      EXPECT_EQ(checksum.value(), word_checksum_of(expect)) << path;
      EXPECT_EQ(progress.load(), total) << path;
      fs::remove(path);
    }
}

// A direct write that comes back short (the file size limit cuts it, as a nearly full disk can)
// leaves O_DIRECT and goes on through the cache: the bytes up to the limit land, then the write fails
// naming the temporary, the file and the count; nothing appears at the destination.
TEST(AtomicFile, ADirectWriteCutShortGoesOnThroughTheCacheAndFailsAtTheLimit) {
  const fs::path dir = titan::testing::temp_dir("atomic_direct_short");
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  struct rlimit limit = before;
  limit.rlim_cur = (size_t(5) << 20) + 1000;              // inside the first 8 MiB buffer, not a whole block
  void (*previous)(int) = std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const std::string bytes(size_t(12) << 20, 'x');
  const std::string e = titan::testing::error_of([&] {
    AtomicFile f(dir / "big.bin", {PageCache::Bypass});
    f.write(bytes.data(), bytes.size());
    f.commit();
  });
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(e.find("big.bin\") failed after " + std::to_string(limit.rlim_cur) + " bytes: File too large"),
            std::string::npos)
      << e;
  EXPECT_EQ(entries(dir), 0u);
}

TEST(AtomicFile, UncommittedLeavesNothing) {
  fs::path dir = titan::testing::temp_dir("atomic_abort");
  write_file_atomic(dir / "keep.txt", "old");
  {
    AtomicFile f(dir / "keep.txt");
    f.write("half-written");
    AtomicFile g = std::move(f);  // ownership moves; the moved-from object cleans nothing
  }
  { AtomicFile f(dir / "new.txt"); }
  EXPECT_EQ(read_bytes(dir / "keep.txt"), "old");
  EXPECT_FALSE(fs::exists(dir / "new.txt"));
  EXPECT_EQ(entries(dir), 1u);
  expect_error([&] { AtomicFile f(dir / "no/such/dir/x"); }, {"cannot create"});
}

TEST(AtomicDir, CommitRefuseReplace) {
  fs::path parent = titan::testing::temp_dir("atomic_dir");
  {
    AtomicDir d(parent / "out");
    write_file_atomic(d.temp_path() / "f", "1");
    EXPECT_FALSE(fs::exists(parent / "out"));
    d.commit();
  }
  EXPECT_EQ(read_bytes(parent / "out/f"), "1");
  expect_error([&] { AtomicDir d(parent / "out"); }, {"already exists"});
  {
    AtomicDir d(parent / "out", /*replace=*/true);
    write_file_atomic(d.temp_path() / "g", "2");
    d.commit();
  }
  EXPECT_FALSE(fs::exists(parent / "out/f"));
  EXPECT_EQ(read_bytes(parent / "out/g"), "2");
  {
    AtomicDir d(parent / "abandoned/");  // trailing slash names the same directory
    write_file_atomic(d.temp_path() / "h", "3");
  }
  EXPECT_FALSE(fs::exists(parent / "abandoned"));
  EXPECT_EQ(entries(parent), 1u);
}

// A replace on a file system without an atomic exchange (NFS, some FUSE mounts) moves the old
// copy aside, then the new one in: a process that died between the two leaves the destination
// missing and its only copy at ".<name>.old-<pid>-<n>". The next AtomicDir for that destination
// puts the copy back instead of deleting it with the other leftovers of dead processes.
TEST(AtomicDir, AnEarlierCopySetAsideByADeadReplaceIsPutBack) {
  const fs::path parent = titan::testing::temp_dir("atomic_dir_set_aside");
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const std::string pid = std::to_string(dead);
  fs::create_directories(parent / (".out.old-" + pid + "-0"));
  std::ofstream(parent / (".out.old-" + pid + "-0") / "f") << "earlier";
  fs::create_directories(parent / (".out.tmp-" + pid + "-1"));  // the new copy, never moved in
  {
    AtomicDir d(parent / "out", /*replace=*/true);  // abandoned: nothing committed
  }
  EXPECT_EQ(read_bytes(parent / "out/f"), "earlier");
  EXPECT_EQ(entries(parent), 1u) << "the dead process' other leftover is gone";
  // With the destination in place, a copy set aside is only a leftover.
  fs::create_directories(parent / (".out.old-" + pid + "-2"));
  {
    AtomicDir d(parent / "out", /*replace=*/true);
    write_file_atomic(d.temp_path() / "g", "new");
    d.commit();
  }
  EXPECT_EQ(read_bytes(parent / "out/g"), "new");
  EXPECT_EQ(entries(parent), 1u);
  // Without replace, the copy put back is not overwritten.
  fs::rename(parent / "out", parent / (".out.old-" + pid + "-3"));
  expect_error([&] { AtomicDir d(parent / "out"); }, {"already exists"});
  EXPECT_EQ(read_bytes(parent / "out/g"), "new");
}

}  // namespace
}  // namespace titan::io

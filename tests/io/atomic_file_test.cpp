// Atomic file and directory writes: content appears whole or not at all, temporaries never linger.
#include "titan/io/atomic_file.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace titan::io

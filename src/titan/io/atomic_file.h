#pragma once
// Crash-safe file and directory writes. A reader either sees the old content or the complete new
// content, never a prefix: data goes to a temporary name in the destination's own directory (so
// the final rename stays on one file system), is fsynced, renamed over the destination, and the
// directory is fsynced so the rename itself survives a power cut.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "titan/core/hash.h"

namespace titan::io {

// PageCache::Bypass: the bytes go to the file around the kernel's page cache (O_DIRECT, through an
// aligned buffer of the writer's), so that writing gigabytes costs the kernel no copy into fresh
// cache pages: what makes a checkpoint cheap for the cores training beside it. Where the file
// system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE file systems), or a write is refused
// or comes back short, the rest is written through the cache; the file's bytes are the same.
enum class PageCache : uint8_t { Use, Bypass };

// How an AtomicFile writes, and what it reports while it does.
struct FileWriting {
  PageCache cache = PageCache::Use;
  // Receives every byte as it is written: the file's checksum without reading it back.
  WordChecksum* checksum = nullptr;
  // Advanced by the bytes handed to the file as they are written (a progress line's count).
  std::atomic<uint64_t>* progress = nullptr;
};

// One file written atomically. Nothing is visible at `path` until commit(); destroying an
// uncommitted AtomicFile (an exception on the way) removes the temporary file.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, const FileWriting& how = {});
  ~AtomicFile();
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // all n bytes (retries short writes and EINTR)
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_ + direct_fill_; }
  // fsync, close, rename over the destination, fsync the directory.
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  void write_out(const char* p, size_t n);  // to the file descriptor
  void leave_direct();                      // O_DIRECT off: the rest goes through the page cache
  uint64_t written_ = 0;
  bool committed_ = false;
  WordChecksum* checksum_ = nullptr;
  std::atomic<uint64_t>* progress_ = nullptr;
  // PageCache::Bypass: while O_DIRECT is on (direct_), bytes gather in this aligned buffer and go
  // out a full buffer at a time.
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> direct_buffer_;
  size_t direct_fill_ = 0;
  bool direct_ = false;
};

// Whole file in one call.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// fsync a directory so that entries created/renamed in it are durable.
void fsync_dir(const std::filesystem::path& dir);

// True when `path` is a temporary of AtomicFile/AtomicDir (".<name>.tmp-<pid>-<n>" or
// ".<name>.old-<pid>-<n>") whose process no longer runs on this host: the debris of a killed write.
bool is_stale_temporary(const std::filesystem::path& path);

// A directory built under a temporary sibling name (".<name>.tmp-<pid>-<n>") and moved into place
// by commit(). If `path` already exists, commit() fails unless `replace` is set, in which case the
// old directory is swapped out atomically (renameat2 RENAME_EXCHANGE) and then deleted, so no
// reader ever sees a mix of old and new files. Uncommitted temporaries are removed on destruction;
// the stale temporaries of killed processes for the same `path` are removed on construction.
class AtomicDir {
 public:
  explicit AtomicDir(std::filesystem::path path, bool replace = false);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::filesystem::path& temp_path() const { return tmp_; }  // write the contents here
  const std::filesystem::path& path() const { return path_; }
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  bool replace_;
  bool committed_ = false;
};

}  // namespace titan::io

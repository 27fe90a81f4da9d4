#include "titan/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <regex>

#include "titan/core/check.h"

namespace titan::io {
namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> g_temp_counter{0};

std::string temp_suffix() {
  return std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter.fetch_add(1));
}

// ".<name><tag><pid>-<n>": hidden, unique per process and call, beside the destination.
std::string hidden_name(const fs::path& p, std::string_view tag) {
  std::string s = ".";
  s.append(p.filename().string()).append(tag).append(temp_suffix());
  return s;
}

std::string errno_str() {
  return std::strerror(errno);
}

fs::path parent_or_dot(const fs::path& p) {
  fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// renameat2 flags are Linux-only; some file systems reject them (EINVAL), then we fall back to
// plain rename() plus an existence check, which is atomic except against a concurrent writer.
bool rename_noreplace(const fs::path& from, const fs::path& to) {
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno == EEXIST) return false;
  TITAN_CHECK(errno == EINVAL || errno == ENOSYS, "atomic rename ", from, " -> ", to, ": ", errno_str());
#endif
  if (fs::exists(fs::symlink_status(to))) return false;
  TITAN_CHECK(::rename(from.c_str(), to.c_str()) == 0, "atomic rename ", from, " -> ", to, ": ", errno_str());
  return true;
}

}  // namespace

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TITAN_CHECK(fd >= 0, "fsync_dir: cannot open directory ", dir, ": ", errno_str());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (e.g. certain FUSE mounts) do not support fsync on directories.
  TITAN_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP, "fsync_dir ", dir, ": ", std::strerror(err));
}

namespace {
// O_DIRECT wants the buffer, the file offset and the length aligned to the device's logical block
// (512 or 4096 bytes): 4096 suits both. The buffer takes 8 MiB between writes.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectBuffer = size_t(8) << 20;
}  // namespace

AtomicFile::AtomicFile(fs::path path, const FileWriting& how)
    : path_(std::move(path)), checksum_(how.checksum), progress_(how.progress) {
  TITAN_CHECK(!path_.filename().empty(), "the output ", path_, " names no file",
              path_.empty() ? " (the path is empty)" : " (it ends with '/': a folder)");
  // Checked before anything is written: the rename at the end could not put a file there.
  std::error_code ec;
  TITAN_CHECK(!fs::is_directory(path_, ec), "'", path_.string(),
              "' is a directory: a file cannot be written in its place (name a file)");
  tmp_ = parent_or_dot(path_) / hidden_name(path_, ".tmp-");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TITAN_CHECK(fd_ >= 0, "cannot create ", tmp_, " (temporary for ", path_, "): ", errno_str());
  if (how.cache == PageCache::Bypass) {
    // Turned on after the file exists: a file system without O_DIRECT (tmpfs) refuses it here.
    const int flags = ::fcntl(fd_, F_GETFL);
    direct_buffer_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlign, kDirectBuffer)));
    direct_ = flags >= 0 && direct_buffer_ && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
    if (!direct_) direct_buffer_.reset();
  }
}

void AtomicFile::leave_direct() {
  if (!direct_) return;
  const int flags = ::fcntl(fd_, F_GETFL);
  TITAN_CHECK(flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0, "write ", tmp_, " (for ", path_,
              "): cannot leave O_DIRECT: ", errno_str());
  direct_ = false;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      fd_(o.fd_),
      written_(o.written_),
      committed_(o.committed_),
      checksum_(o.checksum_),
      progress_(o.progress_),
      direct_buffer_(std::move(o.direct_buffer_)),
      direct_fill_(o.direct_fill_),
      direct_(o.direct_) {
  o.fd_ = -1;
  o.committed_ = true;  // the moved-from object owns nothing to clean up
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  TITAN_CHECK(fd_ >= 0, "AtomicFile ", path_, ": write after commit");
  const char* p = static_cast<const char*>(data);
  if (progress_) progress_->fetch_add(n);
  while (direct_ && n > 0) {  // through the aligned buffer, a full buffer at a time
    const size_t k = std::min(n, kDirectBuffer - direct_fill_);
    char* into = direct_buffer_.get() + direct_fill_;
    std::memcpy(into, p, k);
    if (checksum_) checksum_->update(into, k);  // while the bytes are in cache
    direct_fill_ += k;
    p += k;
    n -= k;
    if (direct_fill_ < kDirectBuffer) return;
    direct_fill_ = 0;
    write_out(direct_buffer_.get(), kDirectBuffer);  // all of it, directly or (having left O_DIRECT) not
  }
  if (checksum_) checksum_->update(p, n);
  write_out(p, n);
}

void AtomicFile::write_out(const char* p, size_t n) {
  while (n > 0) {
    // Linux transfers at most ~2 GiB per call; larger requests come back short and loop.
    ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (direct_ && (k < 0 ? errno == EINVAL : size_t(k) < n)) {
      // O_DIRECT refused (an alignment this file system does not take) or a short write (the next
      // offset would be unaligned): the rest goes through the page cache.
      if (k > 0) {
        p += k;
        n -= size_t(k);
        written_ += uint64_t(k);
      }
      leave_direct();
      continue;
    }
    TITAN_CHECK(k > 0, "write ", tmp_, " (for ", path_, ") failed after ", written_,
                " bytes: ", k < 0 ? errno_str() : std::string("no progress"));
    p += k;
    n -= size_t(k);
    written_ += uint64_t(k);
  }
}

void AtomicFile::commit() {
  TITAN_CHECK(fd_ >= 0 && !committed_, "AtomicFile ", path_, ": commit twice");
  if (direct_buffer_) {
    // The buffer's whole blocks go out directly, the tail (less than a block) through the cache.
    const size_t whole = direct_ ? direct_fill_ / kDirectAlign * kDirectAlign : 0;
    write_out(direct_buffer_.get(), whole);
    leave_direct();
    write_out(direct_buffer_.get() + whole, direct_fill_ - whole);
    direct_fill_ = 0;
    direct_buffer_.reset();
  }
  TITAN_CHECK(::fsync(fd_) == 0, "fsync ", tmp_, ": ", errno_str());
  int rc = ::close(fd_);
  fd_ = -1;
  TITAN_CHECK(rc == 0, "close ", tmp_, ": ", errno_str());
  TITAN_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "rename ", tmp_, " -> ", path_, ": ", errno_str());
  committed_ = true;
  fsync_dir(parent_or_dot(path_));
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

bool is_stale_temporary(const fs::path& path) {
  static const std::regex temp_re("\\..+\\.(tmp|old)-([0-9]+)-[0-9]+");
  std::smatch m;
  const std::string name = path.filename().string();
  if (!std::regex_match(name, m, temp_re)) return false;
  const long long pid = std::stoll(m[2].str());
  // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means it runs.
  return pid > 0 && pid <= INT32_MAX && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

AtomicDir::AtomicDir(fs::path path, bool replace) : path_(std::move(path)), replace_(replace) {
  if (path_.filename().empty()) path_ = path_.parent_path();  // "dir/" names "dir"
  TITAN_CHECK(!path_.filename().empty(), "AtomicDir: path ", path_, " has no directory name");
  TITAN_CHECK(replace_ || !fs::exists(fs::symlink_status(path_)), "output directory ", path_,
              " already exists (refusing to overwrite it)");
  fs::path parent = parent_or_dot(path_);
  std::error_code ec;
  fs::create_directories(parent, ec);
  TITAN_CHECK(!ec, "cannot create parent directory ", parent, ": ", ec.message());
  std::string prefix = ".";  // of this destination's temporaries: ".<name>.tmp-" / ".<name>.old-"
  prefix += path_.filename().string();
  prefix += '.';
  for (auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0 || !is_stale_temporary(e.path())) continue;
    // A replace without an atomic exchange moves the old copy aside, then the new one in (commit):
    // a process that died between the two left the destination missing and its only copy aside.
    // That copy goes back; removing it with the other leftovers would lose both.
    const bool set_aside = name.compare(prefix.size(), 4, "old-") == 0;
    if (set_aside && !fs::exists(fs::symlink_status(path_)) &&
        ::rename(e.path().c_str(), path_.c_str()) == 0) {
      std::fprintf(stderr,
                   "note: %s was missing and its earlier copy %s was set aside by a replace that "
                   "did not finish: put back\n",
                   path_.c_str(), e.path().c_str());
      continue;
    }
    fs::remove_all(e.path(), ec);
  }
  TITAN_CHECK(replace_ || !fs::exists(fs::symlink_status(path_)), "output directory ", path_,
              " already exists (refusing to overwrite it)");
  tmp_ = parent / hidden_name(path_, ".tmp-");
  TITAN_CHECK(::mkdir(tmp_.c_str(), 0755) == 0, "cannot create temporary directory ", tmp_, ": ",
              errno_str());
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // best effort: a destructor must not throw
}

void AtomicDir::commit() {
  TITAN_CHECK(!committed_, "AtomicDir ", path_, ": commit twice");
  // Files written with AtomicFile are durable already; this makes the directory entries durable.
  fsync_dir(tmp_);
  fs::path parent = parent_or_dot(path_);
  if (rename_noreplace(tmp_, path_)) {
    committed_ = true;
    fsync_dir(parent);
    return;
  }
  TITAN_CHECK(replace_, "output directory ", path_, " already exists (refusing to overwrite it)");
  TITAN_CHECK(fs::is_directory(fs::symlink_status(path_)), "cannot replace ", path_, ": not a directory");
  // Swap new and old in one step; the old content ends up under the temporary name.
  bool swapped = false;
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0)
    swapped = true;
  else
    TITAN_CHECK(errno == EINVAL || errno == ENOSYS, "swap ", tmp_, " <-> ", path_, ": ", errno_str());
#endif
  if (!swapped) {
    // No atomic exchange on this file system: move the old one aside first (a reader may briefly
    // find no directory, but never a mixed one).
    fs::path old = parent / hidden_name(path_, ".old-");
    TITAN_CHECK(::rename(path_.c_str(), old.c_str()) == 0, "rename ", path_, " -> ", old, ": ", errno_str());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = errno_str();
      const bool put_back = ::rename(old.c_str(), path_.c_str()) == 0;  // the old copy stays the one
      TITAN_FAIL("rename ", tmp_, " -> ", path_, ": ", why,
                 put_back ? std::string(" (the earlier copy is back in place)")
                          : " (the earlier copy is at " + old.string() + ")");
    }
    tmp_ = old;
  }
  committed_ = true;
  fsync_dir(parent);
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  TITAN_CHECK(!ec, "replaced ", path_, " but could not delete the old copy at ", tmp_, ": ", ec.message());
}

}  // namespace titan::io

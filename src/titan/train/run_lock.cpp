#include "titan/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <string>

#include "titan/core/check.h"

namespace titan::train {
namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string read_all(int fd) {
  std::string s;
  char buf[256];
  ssize_t n;
  ::lseek(fd, 0, SEEK_SET);
  while ((n = ::pread(fd, buf, sizeof buf, off_t(s.size()))) > 0) s.append(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string lock_file_name(int rank) {
  return ".titan-rank" + std::to_string(rank) + ".lock";
}

}  // namespace

RunLock::RunLock(const fs::path& folder, const std::string& key, int rank) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  TITAN_CHECK(!ec, key, ": cannot create '", folder.string(), "': ", ec.message());
  path_ = folder / lock_file_name(rank);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TITAN_CHECK(fd_ >= 0, key, ": cannot open the run lock '", path_.string(), "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    TITAN_CHECK(err != EWOULDBLOCK, key, ": '", folder.string(), "' is in use by another titan train (",
                holder.empty() ? std::string("holder unknown") : holder, ", lock file ", path_.string(),
                "); two runs writing one folder destroy each other's checkpoints and metrics: wait for it to "
                "finish or choose another ",
                key);
    TITAN_FAIL(key, ": cannot lock '", path_.string(), "': ", std::strerror(err));
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host_name() + "\n";
  // Only the holder writes, so the file always names the live holder.
  // Synced: the other ranks read it (check_every_rank_sees), on a network file system from other hosts.
  TITAN_CHECK(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) == ssize_t(me.size()) &&
                  ::fsync(fd_) == 0,
              key, ": cannot write the run lock '", path_.string(), "': ", std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void check_every_rank_sees(const fs::path& folder, const std::string& key, const dist::ParallelPlan& plan) {
  plan.barrier();  // every lock file is written
  bool sees_all = true;
  for (int r = 0; r < plan.world_size(); ++r) {
    std::error_code ec;
    sees_all &= fs::exists(folder / lock_file_name(r), ec);
  }
  const int64_t blind = plan.max_over_ranks(sees_all ? 0 : plan.rank() + 1);  // the last blind rank + 1
  TITAN_CHECK(blind == 0, key, ": '", folder.string(), "': rank ", blind - 1,
              " does not see every rank's lock file there: ", key,
              " must be on a file system every rank sees (on several hosts, the same shared folder)");
  // Lock files outlive their runs (and travel with a copied run folder), so seeing one is not
  // seeing the live rank's: every rank must read the same holders, each the live process.
  std::string holders;
  for (int r = 0; r < plan.world_size(); ++r) {
    std::ifstream in(folder / lock_file_name(r));
    std::string line;
    std::getline(in, line);
    holders += lock_file_name(r) + ": " + line + "\n";
  }
  plan.check_same_on_every_rank(holders, "views of " + key + " '" + folder.string() + "'",
                                key +
                                    " must be one folder every rank sees, on several hosts a shared one; "
                                    "lock files left by an earlier run do not make separate folders one");
}

}  // namespace titan::train

#pragma once
// One writer per run folder. Two `titan train` processes on the same dump folder (or the same
// checkpoint folder: checkpoint.folder may be an absolute path shared by two runs) would delete each
// other's temporaries, interleave metrics.jsonl and prune or replace each other's checkpoints; the
// second one must stop before it writes anything. The lock is flock(2) on
// <folder>/.titan-rank<r>.lock, held for the life of the RunLock: the kernel drops it when the
// process dies, so a crash never leaves a stale lock. The file records "pid <pid> host <host>" of
// the holder for the message.
#include <filesystem>
#include <string>

#include "titan/dist/parallel_plan.h"

namespace titan::train {

class RunLock {
 public:
  // Creates the folder if needed. Throws titan::Error at once (never waits) when another process
  // holds the lock, naming that process' pid and host and `key`, the config key that chose the
  // folder ("job.dump_folder", "checkpoint.folder").
  RunLock(const std::filesystem::path& folder, const std::string& key, int rank = 0);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Collective, after every rank took its RunLock on `folder`: each rank must see every rank's lock
// file there. A rank that does not writes to another file system (a per-host folder on several
// hosts), so its checkpoint shards would be missing at the first save, maybe hours in; the error
// names `key` and the first rank that cannot see them, before any step.
void check_every_rank_sees(const std::filesystem::path& folder, const std::string& key,
                           const dist::ParallelPlan& plan);

}  // namespace titan::train

#include "titan/dist/parallel_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/hash.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::dist {

namespace {

// The lines of `text`, each without its indentation (the config listing indents its keys).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line.substr(std::min(line.find_first_not_of(' '), line.size())));
  return out;
}

// Fixed-size text records, all-gathered (host names, config differences).
std::vector<std::string> gather_text(Communicator& comm, const std::string& mine, size_t width) {
  std::vector<char> send(width, '\0'), recv(width * size_t(comm.size()), '\0');
  std::memcpy(send.data(), mine.data(), std::min(mine.size(), width - 1));
  comm.all_gather(send.data(), recv.data(), int64_t(width), DType::U8, host_context());
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) out.emplace_back(recv.data() + size_t(r) * width);
  return out;
}

// The context of a tensor's device: its collectives run on that device's communicator path
// (MPI for host memory, NCCL for CUDA memory) and stream.
KernelContext context_of(const Tensor& t) { return device_services(t.device()).context(); }

}  // namespace

ParallelPlan::ParallelPlan() : own_world_(single_process_communicator()), world_(own_world_.get()) {}

ParallelPlan::ParallelPlan(Communicator& world, int64_t dp_replicate, int64_t dp_shard, int64_t ep)
    : world_(&world), dp_replicate_(dp_replicate), dp_shard_(dp_shard), ep_(ep) {
  TITAN_CHECK(dp_replicate >= 1 && dp_shard >= 1 && dp_replicate * dp_shard == world.size(),
              "parallelism: data_parallel_replicate_degree ", dp_replicate, " x data_parallel_shard_degree ",
              dp_shard, " != world size ", world.size());
  TITAN_CHECK(ep >= 1 && dp_shard % ep == 0, "parallelism: expert_parallel_degree ", ep,
              " must divide data_parallel_shard_degree ", dp_shard,
              " (expert parallelism borrows its ranks from the shard dimension)");
  // With ep = dp_shard the expert groups are the shard groups and every rank holds its run alone:
  // no communicators of their own (under NCCL each costs an initialisation and buffers).
  if (ep_ > 1 && ep_ < dp_shard_) {
    // Colors: the expert group's first rank; the shard group and the run of experts.
    expert_group_ = world.split(int(rank() - expert_index()), rank(), int(ep_));
    expert_shard_group_ =
        world.split(int(replicate_index() * ep_ + expert_index()), rank(), int(dp_shard_ / ep_));
  }
  // A group spanning the whole world is the world itself, not a split of it: under NCCL every
  // communicator costs an initialisation and its own buffers.
  if (dp_shard_ > 1 && dp_replicate_ > 1) {
    shard_group_ = world.split(int(rank() / dp_shard_), rank(), int(dp_shard_));
    replicate_group_ = world.split(int(rank() % dp_shard_), rank(), int(dp_replicate_));
  }
}

std::string ParallelPlan::describe() const {
  if (world_size() == 1) return "one process";
  const char* mode = dp_shard_ == 1 ? "DDP" : dp_replicate_ == 1 ? "FSDP" : "HSDP";
  return std::string(mode) + (ep_ > 1 ? " + EP" : "") + ", " + std::to_string(world_size()) +
         " ranks (dp_replicate " + std::to_string(dp_replicate_) + " x dp_shard " +
         std::to_string(dp_shard_) + (ep_ > 1 ? ", experts split over " + std::to_string(ep_) : "") + ")";
}

void ParallelPlan::shard_blocks(std::vector<nn::ParamBlock>& blocks) const {
  for (auto& b : blocks)
    if (!b.sharded()) b.pad_to_multiple(dp_shard_);
}

double ParallelPlan::all_reduce_grad_norm_sq(double sum_sq) const {
  // Replicas hold the same shards: the norm is summed over one shard group, which holds every slice
  // of every block once (each run of experts in slices over its dp_shard / ep ranks).
  if (dp_shard_ > 1) shard_group().all_reduce(&sum_sq, 1, DType::F64, ReduceOp::Sum, host_context());
  return sum_sq;
}

void ParallelPlan::all_reduce_sum(std::span<double> values) const {
  if (dp_size() > 1)
    world_->all_reduce(values.data(), int64_t(values.size()), DType::F64, ReduceOp::Sum, host_context());
}

void ParallelPlan::all_reduce_max(std::span<double> values) const {
  if (dp_size() > 1)
    world_->all_reduce(values.data(), int64_t(values.size()), DType::F64, ReduceOp::Max, host_context());
}

std::vector<Tensor> ParallelPlan::sum_over_ranks(const std::vector<Tensor>& counts) const {
  if (dp_size() == 1) return counts;
  std::vector<Tensor> out;
  for (const Tensor& c : counts) {
    if (!c.defined()) {
      out.push_back(c);
      continue;
    }
    TITAN_CHECK(c.dtype() == DType::I64 && c.is_contiguous(),
                "parallel plan: counts must be contiguous i64, got ", c.str());
    out.push_back(c.clone());
    world_->all_reduce(out.back().raw_data(), c.numel(), DType::I64, ReduceOp::Sum, context_of(c));
  }
  return out;
}

int64_t ParallelPlan::max_over_ranks(int64_t value) const {
  if (world_size() > 1) world_->all_reduce(&value, 1, DType::I64, ReduceOp::Max, host_context());
  return value;
}

void check_same_on_every_rank(Communicator& world, const std::string& text, const std::string& what,
                              const std::string& rule) {
  if (world.size() == 1) return;
  int64_t mine = int64_t(fnv1a(text));
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&mine, all.data(), 1, DType::I64, host_context());
  bool same = true;
  for (int64_t h : all) same = same && h == all[0];
  if (same) return;
  // Rank 0's text goes to everyone; each rank reports its first line that differs from it.
  const std::string reference = broadcast_text(world, text, 0);
  const auto ref_lines = lines_of(reference), my_lines = lines_of(text);
  std::string difference;
  for (size_t i = 0; i < std::max(ref_lines.size(), my_lines.size()) && difference.empty(); ++i) {
    const std::string a = i < ref_lines.size() ? ref_lines[i] : "(nothing)";
    const std::string b = i < my_lines.size() ? my_lines[i] : "(nothing)";
    if (a != b) difference = "'" + b + "' where rank 0 has '" + a + "'";
  }
  const auto reports = gather_text(world, difference, 512);
  for (int r = 1; r < world.size(); ++r)
    if (!reports[size_t(r)].empty())
      throw RanksAgreedError(detail::concat("the ranks have different ", what, ": rank ", r, " has ",
                                            reports[size_t(r)], " (", rule, ")"));
  throw RanksAgreedError(detail::concat("the ranks' ", what, " hash differently but read the same"));
}

std::string broadcast_text(Communicator& world, const std::string& text, int root) {
  int64_t len = int64_t(text.size());
  world.broadcast(&len, 1, DType::I64, root, host_context());
  std::string out = world.rank() == root ? text : std::string(size_t(len), '\0');
  world.broadcast(out.data(), len, DType::U8, root, host_context());
  return out;
}

void agree_on_success(Communicator& world, const std::function<void()>& work) {
  if (world.size() == 1) return work();
  std::string failure;
  try {
    work();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "failed (an error without a message)";
  }
  int64_t failed = failure.empty() ? 0 : 1;
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&failed, all.data(), 1, DType::I64, host_context());
  std::vector<int> failing;
  for (int r = 0; r < world.size(); ++r)
    if (all[size_t(r)]) failing.push_back(r);
  if (failing.empty()) return;
  // Every failing rank's message goes to every rank whole (an error names a file and a rule: cut
  // short it would lose the rule), grouped by text: the ranks of a resume checksum a share of the
  // files each, and each names the damaged ones it found; the ranks that failed alike are named after
  // the first one's reason. A few distinct reasons at most (ranks on many hosts can fail each its own
  // way): the rest are counted.
  struct Group {
    std::string reason;
    std::vector<int> ranks;
  };
  std::vector<Group> groups;
  for (const int r : failing) {
    std::string reason = broadcast_text(world, failure, r);
    const auto same =
        std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.reason == reason; });
    if (same == groups.end())
      groups.push_back({std::move(reason), {r}});
    else
      same->ranks.push_back(r);
  }
  constexpr size_t kReasonsSaid = 4;
  std::string said;
  size_t unsaid = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<int>& ranks = groups[i].ranks;
    if (i >= kReasonsSaid) {
      unsaid += ranks.size();
      continue;
    }
    std::string too;
    for (size_t k = 1; k < ranks.size(); ++k) too += (k > 1 ? ", " : "") + std::to_string(ranks[k]);
    said += (i > 0 ? "; rank " : "rank ") + std::to_string(ranks[0]) + ": " + groups[i].reason +
            (too.empty() ? "" : " (rank" + std::string(ranks.size() > 2 ? "s " : " ") + too + " failed too)");
  }
  if (unsaid > 0)
    said +=
        "; " + std::to_string(unsaid) + " more rank" + (unsaid > 1 ? "s" : "") + " failed with other errors";
  throw RanksAgreedError(said);
}

void ParallelPlan::check_same_on_every_rank(const std::string& text, const std::string& what,
                                            const std::string& rule) const {
  dist::check_same_on_every_rank(*world_, text, what, rule);
}

void ParallelPlan::agree_on_success(const std::function<void()>& work) const {
  dist::agree_on_success(*world_, work);
}

std::vector<std::string> ParallelPlan::host_names() const {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return gather_text(*world_, host, 256);
}

}  // namespace titan::dist

#pragma once
// How this process takes part in a training job: its rank, the data-parallel mesh
// dp_replicate x dp_shard (torchtitan's data_parallel_replicate_degree and
// data_parallel_shard_degree; rank = replicate_index * dp_shard + shard_index), and the points of a
// collectives of a training step outside the parameter blocks (dist/sharded_blocks.h gathers the
// blocks and reduces their gradients):
//   all_reduce_grad_norm_sq  the squared norm of this rank's gradient shard -> the global one, so
//                            every rank clips by the same coefficient;
//   all_reduce_sum           sums of this rank's share of the data -> their sums over the data-parallel
//                            ranks (the step's losses; the held-out loss of [validation]);
//   sum_over_ranks, max_over_ranks, check_same_on_every_rank, agree_on_success, host_names.
// Sharding (dp_shard > 1) cuts every flat parameter block into dp_shard equal slices (the block is
// padded with zeros to a multiple of dp_shard; a block of experts into dp_shard / ep, below); this
// rank keeps its slice (ParamBlock::shard) and the optimizer state of that slice only. With one rank every
// point is the identity.
//
// Expert parallelism (ep > 1, torchtitan's expert_parallel_degree) borrows its ranks from the shard
// dimension, innermost, as torchtitan's mesh does: ep divides dp_shard, and the ranks of a shard group
// fall into dp_shard / ep expert groups of ep consecutive ranks. Within one, the rank with
// expert_index() j holds run j of every MoE layer's experts (qwen3::ExpertSplit) in blocks of their
// own; the tokens travel to their experts (nn/expert_parallel.h). The dp_shard / ep ranks of a
// shard group holding the same run (one in each expert group: expert_shard_group()) shard its
// blocks between them as FSDP shards every block (torchtitan's dp_shard_mod_ep mesh), so a rank
// keeps 1 / dp_shard of the experts' weights, gradients and moments whatever ep is; replicas hold
// the same slices, as they do of every block.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/dist/communicator.h"
#include "titan/nn/param_block.h"

namespace titan::dist {

// Every rank of `world` passes its lines of `what` (its effective config as "key = value" lines, the
// files it reads): all equal, or an error on every rank naming the first line that differs and the
// rank it differs on, and `rule`. Callable before a plan exists (a plan's groups are collectives
// that ranks of different configs would not all join).
void check_same_on_every_rank(Communicator& world, const std::string& lines, const std::string& what,
                              const std::string& rule);

// `text` as rank `root` holds it, on every rank of `world` (whole: its length goes first).
std::string broadcast_text(Communicator& world, const std::string& text, int root);

// An error every rank of the job throws alike (check_same_on_every_rank, agree_on_success): it needs
// saying once, and every rank can end normally, none waiting for another in a collective.
class RanksAgreedError : public Error {
 public:
  using Error::Error;
};

// Runs `work` on every rank of `world` (which must contain no collective: a rank that fails part-way
// would leave the others waiting in it), then agrees on the outcome with one all-gather: when it
// threw on any rank, every rank throws a RanksAgreedError with the message of the lowest failing rank
// ("rank 1: <its error>"), each other rank failing alike named after it ("(rank 2 failed too)"), then
// the message of each failing rank whose message differs ("; rank 3: ..."; four messages at most, the
// ranks failing otherwise then counted). So a load that one rank cannot finish
// (its shard file damaged, a path missing on its host) stops the job with that rank's reason instead
// of the others running into their next collective until the launcher aborts them.
void agree_on_success(Communicator& world, const std::function<void()>& work);

class ParallelPlan {
 public:
  // The plan of a one-process job (no MPI).
  ParallelPlan();
  // The mesh over `world`: replicate x shard must equal the world size (JobConfig::validate has
  // checked the keys). `world` must outlive the plan.
  // `ep` (expert parallelism) divides dp_shard.
  ParallelPlan(Communicator& world, int64_t dp_replicate, int64_t dp_shard, int64_t ep = 1);
  ParallelPlan(const ParallelPlan&) = delete;
  ParallelPlan& operator=(const ParallelPlan&) = delete;

  Communicator& world() const { return *world_; }
  int world_size() const { return world_->size(); }
  int rank() const { return world_->rank(); }
  int64_t dp_replicate() const { return dp_replicate_; }
  int64_t dp_shard() const { return dp_shard_; }
  int64_t dp_size() const { return dp_replicate_ * dp_shard_; }  // ranks that each take a slice of the batch
  int64_t dp_rank() const { return rank(); }
  int64_t shard_index() const { return rank() % dp_shard_; }
  int64_t replicate_index() const { return rank() / dp_shard_; }
  int64_t ep() const { return ep_; }
  int64_t expert_index() const { return shard_index() % ep_; }  // the run of experts this rank holds
  // The slice of its run's blocks this rank keeps: slice shard_index / ep of dp_shard / ep (none
  // without a split: no such blocks).
  nn::BlockShard expert_shard() const {
    if (ep_ == 1) return {};
    return {shard_index() / ep_, dp_shard_ / ep_};
  }
  // Logs, metrics, TensorBoard and checkpoint files are written by this rank only.
  bool is_logging_rank() const { return rank() == 0; }
  // "FSDP 2 ranks (dp_replicate 1 x dp_shard 2)", "one process", ...
  std::string describe() const;

  // Pads each block not yet sharded to a multiple of dp_shard (before weights are loaded; blocks
  // born sharded are padded to their own slice count).
  void shard_blocks(std::vector<nn::ParamBlock>& blocks) const;

  // The squared norm of the whole gradient from this rank's part: `sum_sq` over its slices of the
  // sharded (or whole, unsharded) blocks and of its run of experts.
  double all_reduce_grad_norm_sq(double sum_sq) const;
  void all_reduce_sum(std::span<double> values) const;  // in place, over the data-parallel ranks

  // i64 tensors (MoE expert counts) summed over the data-parallel ranks into new tensors (the
  // inputs themselves with one rank).
  std::vector<Tensor> sum_over_ranks(const std::vector<Tensor>& counts) const;
  // The largest value any rank passed: a stop signal received by one rank stops all at one step.
  int64_t max_over_ranks(int64_t value) const;
  // Each element's largest value over the data-parallel ranks, in place (like all_reduce_sum).
  void all_reduce_max(std::span<double> values) const;

  // dist::check_same_on_every_rank and dist::agree_on_success over the world.
  void check_same_on_every_rank(const std::string& lines, const std::string& what,
                                const std::string& rule) const;
  void agree_on_success(const std::function<void()>& work) const;
  // The host name of every rank, by rank.
  std::vector<std::string> host_names() const;
  void barrier() const { world_->barrier(); }

  // The ranks holding the other slices of this rank's shards (the world when not sharded), and
  // the ranks holding the same slices in other replicas (null without replicas).
  Communicator& shard_group() const { return shard_group_ ? *shard_group_ : *world_; }
  Communicator* replicate_group() const {
    if (dp_replicate_ == 1) return nullptr;
    return replicate_group_ ? replicate_group_.get() : world_;
  }
  // With ep > 1: the ranks sharing the experts (ep of them; the world when they are all of it), and
  // the ranks of this shard group holding the same run of experts, between which its blocks are
  // sharded (expert_shard(); null when this rank holds it alone: ep = dp_shard, or no split).
  Communicator& expert_group() const {
    if (ep_ == dp_shard_) return shard_group();
    return expert_group_ ? *expert_group_ : *world_;
  }
  Communicator* expert_shard_group() const { return expert_shard_group_.get(); }

 private:
  std::unique_ptr<Communicator> own_world_;  // the one-process communicator of the default plan
  Communicator* world_;
  int64_t dp_replicate_ = 1, dp_shard_ = 1, ep_ = 1;
  // Split from the world only under HSDP; FSDP's shard group and DDP's replicate group are the world.
  std::unique_ptr<Communicator> shard_group_, replicate_group_;
  // Split from the world only when they are not groups the plan has already (1 < ep < dp_shard).
  std::unique_ptr<Communicator> expert_group_, expert_shard_group_;
};

}  // namespace titan::dist

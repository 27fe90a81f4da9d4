#pragma once
// How this process takes part in a training job: its rank among the world, the data-parallel mesh
// (data_parallel_replicate_degree x data_parallel_shard_degree, torchtitan's keys), and the points of
// a training step where data parallelism communicates:
//   gather_parameters       before the forward (and, when sharded, the backward) reads a block:
//                           FSDP all-gathers the block's parameter shards here;
//   reduce_gradients        after the backward of the last micro-batch: FSDP reduce-scatters each
//                           block's gradient (each rank keeps the sum of its shard), DDP all-reduces;
//   all_reduce_grad_norm_sq the squared gradient norm of this rank's part -> the global one, so
//                           every rank clips by the same coefficient;
//   all_reduce_sum          sums of this rank's share of the data -> their sums over the data-parallel
//                           ranks (the held-out loss of [validation]: cross-entropy and token count).
// The engine runs one process today (world size 1): every point is the identity, and a mesh of more
// than one rank is refused by JobConfig::validate.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "titan/nn/param_block.h"

namespace titan::dist {

class ParallelPlan {
 public:
  // The plan of a one-process job.
  ParallelPlan() = default;

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int64_t dp_replicate() const { return dp_replicate_; }
  int64_t dp_shard() const { return dp_shard_; }
  int64_t dp_size() const { return dp_replicate_ * dp_shard_; }  // ranks that each take a slice of the batch
  int64_t dp_rank() const { return rank_; }
  // Logs, metrics, TensorBoard and checkpoint metadata are written by this rank only.
  bool is_logging_rank() const { return rank_ == 0; }
  std::string describe() const;  // "1 rank (dp_replicate 1 x dp_shard 1)"

  void gather_parameters(std::vector<nn::ParamBlock>& blocks) const;
  void reduce_gradients(std::vector<nn::ParamBlock>& blocks) const;
  double all_reduce_grad_norm_sq(double local_sum_sq) const;
  void all_reduce_sum(std::span<double> values) const;

 private:
  int world_size_ = 1, rank_ = 0;
  int64_t dp_replicate_ = 1, dp_shard_ = 1;
};

}  // namespace titan::dist

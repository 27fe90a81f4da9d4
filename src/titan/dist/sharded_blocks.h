#pragma once
// The model's parameter blocks as a data-parallel rank holds them through a step, and the
// communication that keeps them right (torchtitan's FSDP2 / ZeRO-3 over flat blocks):
//
//   FSDP, HSDP (dp_shard > 1)  Between uses a rank keeps only its slice of every block's parameters
//       and gradients (ParamBlock::shard). A layer's parameters are all-gathered just before its
//       forward, the next block's gather prefetched while it computes, and released after it
//       (fsdp_reshard_after_forward "default"/"always"; "never" keeps them until the layer's backward:
//       ZeRO-2). Before a layer's backward they are gathered again (prefetching the layer below) and
//       its whole gradient buffer exists; right after its backward the gradient is reduce-scattered
//       (non-blocking, overlapping the backward of the layers below) into this rank's slice and
//       the whole buffers are released. The embedding and head blocks, used at both ends of the
//       step, stay gathered through a micro-batch and are reduce-scattered after its backward.
//       HSDP then all-reduces the slices across replicas, once, after the last micro-batch.
//       The reductions run in the reduce dtype (training.mixed_precision_reduce, FSDP2's
//       reduce_dtype): f32, or bf16, where each rank's f32 gradient is rounded to bf16 once, the
//       collective sums in f32 and rounds to bf16 at each of its steps (half the bytes travel), and
//       the result joins the f32 slice (shard_grad), which accumulates the micro-batches in f32.
//   DDP (dp_shard = 1, dp_replicate > 1)  Blocks stay whole; in the last micro-batch each layer's
//       gradient all-reduce starts as soon as its backward is over.
//   One process: nothing happens; the model gets no hooks.
//
//   Expert parallelism (ParallelPlan::ep() > 1)  The blocks of a rank's run of experts are sharded
//       over the ranks of its shard group holding the same run (ParallelPlan::expert_shard_group,
//       dp_shard / ep of them) and go with their layer: gathered, prefetched, released and
//       reduce-scattered with it, over that group. The gradient reduce-scattered there sums every
//       expert group's tokens through the run. With ep = dp_shard a rank holds its run alone: the
//       blocks stay whole and their gradients sum the micro-batches in place. HSDP sums their slices
//       across replicas as it sums every block's.
//
// Gradients end as the mean over the data-parallel ranks (the sum, scaled in f32) in ParamBlock::shard_grad,
// which the optimizer updates with ParamBlock::shard. All of this runs on the thread that calls MPI.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/dist/parallel_plan.h"
#include "titan/nn/param_block.h"

namespace titan::dist {

enum class Reshard : uint8_t { AfterForward, Never };
// "default" and "always" -> AfterForward, "never" -> Never (parallelism.fsdp_reshard_after_forward).
Reshard reshard_from_name(const std::string& name);

// What a block is to the step: the embedding or head (used at both ends of it), a layer (with
// backward points: Qwen3Model::is_layer_block), or a run of experts split over ranks
// (Qwen3Model::is_expert_block), used by the forward and backward of `layer`, the block of its layer
// (Qwen3Model::layer_block_of_experts).
enum class BlockKind : uint8_t { Ends, Layer, Experts };
struct BlockRole {
  BlockRole(BlockKind kind, size_t layer = 0, bool copy_is_free = true)  // NOLINT: a kind is a role
      : kind(kind), layer(layer), copy_is_free(copy_is_free) {}
  BlockKind kind;
  size_t layer;
  // Whether a step would hold a bf16 copy of all of the block's weights from its forward to its
  // backward anyway (Qwen3Model::holds_whole_weights_through_step). Kept whole, only such a block
  // keeps the bf16 copy AdamW writes: another one (an untied embedding table, a layer activation
  // checkpointing covers) is cast per use, and its copy would add to the run's peak.
  bool copy_is_free;
};

class ShardedBlocks final : public nn::BlockHooks {
 public:
  // `roles[b]` says what block b is. The blocks not born sharded stay whole until shard() (they
  // are padded by ParallelPlan::shard_blocks). `reduce` is the dtype
  // of the gradient reductions of sharded blocks and of HSDP's sums across replicas, runs of
  // experts included (f32 or bf16; DDP's all-reduce of whole blocks is always f32, as torchtitan's
  // reduce_dtype applies to FSDP only). `plan` and `blocks` must
  // outlive this object.
  ShardedBlocks(const ParallelPlan& plan, std::vector<nn::ParamBlock>& blocks, std::vector<BlockRole> roles,
                Reshard reshard, DType reduce = DType::F32);
  ShardedBlocks(const ShardedBlocks&) = delete;
  ShardedBlocks& operator=(const ShardedBlocks&) = delete;
  ~ShardedBlocks() override;

  // Whether the model needs these hooks (more than one data-parallel rank).
  bool active() const { return plan_.dp_size() > 1; }
  // Once the weights are in place (loaded, initialised or restored): each rank keeps its slice.
  // Under bf16 compute the blocks are gathered in bf16 (f32 otherwise), and the trained blocks keep
  // the bf16 copy of their slice that the optimizer writes (ParamBlock::keep_compute_shard): every
  // sharded one, and the whole ones whose copy is free (BlockRole::copy_is_free), with one process
  // too.
  void shard(DType compute);

  // A micro-batch of a training step: begin_micro_batch makes the gradient buffers of the
  // embedding and head blocks; end_micro_batch completes every reduction of the micro-batch and,
  // after the last one, leaves the mean gradient over the ranks in every block's shard_grad.
  void begin_micro_batch(bool last);
  void end_micro_batch();

  // Block `b` whole in f32 on this rank (the Hugging Face export reading its weights), until
  // release_whole(b); the hooks leave it alone meanwhile. A sharded block's gather is a collective
  // over the ranks holding its slices (they call it alike); a block kept whole needs none.
  void gather_whole(size_t b);
  void release_whole(size_t b);
  // After a forward with no backward (validation, titan eval): its hooks gathered each block as a
  // training forward does, one layer (and the next, prefetched) at a time, never the whole model;
  // this releases what such a forward leaves gathered (the embedding and head, and every layer
  // under fsdp_reshard_after_forward = "never").
  void end_forward_only();

  void before_forward(size_t block) override;
  void after_forward(size_t block) override;
  void before_backward(size_t block) override;
  void after_backward(size_t block) override;

  const CommStats& stats() const { return stats_; }
  // Where the step's other communication adds itself (the experts' exchanges: dist::expert_exchange).
  CommStats* stats_to_count() { return &stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Pending;  // a collective in flight and what to do when it completes
  static constexpr size_t kNone = ~size_t(0);
  bool sharded() const { return plan_.dp_shard() > 1; }  // FSDP or HSDP
  bool sharded(size_t block) const;                      // kept in slices between uses
  Communicator& group(size_t block) const;               // the ranks holding its other slices
  bool is(size_t block, BlockKind kind) const { return roles_[block].kind == kind; }
  // Block `b` and, for a layer, its block of experts (if any): what its hooks gather and reduce.
  std::vector<size_t> with_experts(size_t b) const;
  bool in_compute_dtype(size_t block) const;  // gathered into the block's compute copy
  bool gathered(size_t block) const;
  void start_gather(size_t block);
  void ensure_gathered(size_t block);
  void release(size_t block);
  void start_gradient_reduction(size_t block);
  void finish(Pending& p);
  void poll();
  void wait_all();
  void count(int64_t bytes, int ranks, bool all_reduce);

  const ParallelPlan& plan_;
  std::vector<nn::ParamBlock>& blocks_;
  std::vector<BlockRole> roles_;
  std::vector<size_t> experts_of_;  // per block: the block of its layer's experts, or kNone
  Reshard reshard_;
  DType reduce_;
  bool last_micro_batch_ = true;
  std::vector<bool> pinned_;                       // per block: held whole in f32 by gather_whole
  std::vector<std::unique_ptr<Pending>> gathers_;  // per block: its gather in flight, or null
  std::vector<std::unique_ptr<Pending>> reductions_;  // in start order
  CommStats stats_;
};

}  // namespace titan::dist

#include "titan/dist/sharded_blocks.h"

#include <chrono>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/op_timeline.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::dist {

namespace {

KernelContext context_of(const Tensor& t) { return device_services(t.device()).context(); }

// Adds the time of its scope to a counter.
class Timed {
 public:
  explicit Timed(double& seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() { seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Reshard reshard_from_name(const std::string& name) {
  if (name == "default" || name == "always") return Reshard::AfterForward;
  TITAN_CHECK(name == "never", "parallelism.fsdp_reshard_after_forward = '", name,
              "': expected \"default\", \"always\" or \"never\"");
  return Reshard::Never;
}

struct ShardedBlocks::Pending {
  enum Kind { Gather, ReduceScatter, AllReduce } kind;
  size_t block;
  Tensor sent;      // a bf16 reduction's input: this rank's gradient rounded to bf16
  Tensor received;  // a reduce-scatter's slice of the summed gradient, in the reduce dtype
  // Declared last, destroyed first: a handle dropped in flight (a job unwinding) goes before the
  // buffers its collective reads and writes.
  std::unique_ptr<CommHandle> handle;
};

ShardedBlocks::ShardedBlocks(const ParallelPlan& plan, std::vector<nn::ParamBlock>& blocks,
                             std::vector<BlockRole> roles, Reshard reshard, DType reduce)
    : plan_(plan),
      blocks_(blocks),
      roles_(std::move(roles)),
      experts_of_(blocks.size(), kNone),
      reshard_(reshard),
      reduce_(reduce),
      pinned_(blocks.size(), false),
      gathers_(blocks.size()) {
  TITAN_CHECK(roles_.size() == blocks_.size(), "sharded blocks: ", roles_.size(), " block roles for ",
              blocks_.size(), " blocks");
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (!is(b, BlockKind::Experts)) continue;
    TITAN_CHECK(plan_.ep() > 1, "sharded blocks: block '", blocks_[b].name(),
                "' holds a run of experts, but the plan does not split experts (ep 1)");
    const size_t layer = roles_[b].layer;
    TITAN_CHECK(layer < blocks_.size() && is(layer, BlockKind::Layer) && experts_of_[layer] == kNone,
                "sharded blocks: the experts of block '", blocks_[b].name(), "' belong to block ", layer,
                ", which is not a layer or has experts already");
    experts_of_[layer] = b;
  }
  TITAN_CHECK(reduce_ == DType::F32 || reduce_ == DType::BF16,
              "sharded blocks: gradients reduce in f32 or bf16, not ", dtype_name(reduce_));
}

// A job stopping on an error may leave collectives in flight: their handles are dropped without a
// wait (the job is on its way to MPI_Abort), see MpiHandle.
ShardedBlocks::~ShardedBlocks() = default;

bool ShardedBlocks::sharded(size_t b) const {
  return is(b, BlockKind::Experts) ? plan_.expert_shard_group() != nullptr : sharded();
}

Communicator& ShardedBlocks::group(size_t b) const {
  return is(b, BlockKind::Experts) ? *plan_.expert_shard_group() : plan_.shard_group();
}

std::vector<size_t> ShardedBlocks::with_experts(size_t b) const {
  if (experts_of_[b] == kNone) return {b};
  return {b, experts_of_[b]};
}

void ShardedBlocks::shard(DType compute) {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    nn::ParamBlock& B = blocks_[b];
    if (sharded() && sharded(b)) {  // (a run of experts its rank holds alone stays whole)
      const nn::BlockShard slice = is(b, BlockKind::Experts)
                                       ? plan_.expert_shard()
                                       : nn::BlockShard{plan_.shard_index(), plan_.dp_shard()};
      if (!B.sharded()) B.shard(slice.index, slice.count);
      TITAN_CHECK(
          B.shard_begin() == slice.index * B.shard().numel() && B.shard().numel() * slice.count == B.numel(),
          "sharded blocks: block '", B.name(), "' was born as another slice than slice ", slice.index, " of ",
          slice.count, " the plan gives this rank");
    }
    // A bf16 job's trained blocks keep a bf16 copy of this rank's slice that AdamW writes with every
    // update (ParamBlock::keep_compute_shard), so no step casts them: the forward and backward of a
    // whole block read it (the model reads a block's compute copy while it is resident,
    // Qwen3Model::w), and a sharded block's gathers send it (half the bytes travel; the slice costs
    // 2 / dp_shard bytes per parameter). A whole block keeps one only where the step would hold its
    // casts until its backward anyway, so the copy adds nothing to the peak. An inference model's
    // sharded blocks are gathered in bf16 all the same, from their rounded slices.
    if (compute != DType::BF16) continue;
    if (B.trainable() && !B.keeps_compute_shard() && (B.sharded() || roles_[b].copy_is_free))
      B.keep_compute_shard(compute);
    else if (!B.trainable() && B.sharded() && !B.has_compute_copy())
      B.add_compute_copy(compute);
  }
}

void ShardedBlocks::count(int64_t bytes, int ranks, bool all_reduce) {
  stats_.bytes_sent += (all_reduce ? 2 : 1) * bytes * (ranks - 1) / ranks;
  ++stats_.collectives;
  stats_.ring_steps += (all_reduce ? 2 : 1) * (ranks - 1);
}

bool ShardedBlocks::in_compute_dtype(size_t b) const {
  return !pinned_[b] && blocks_[b].has_compute_copy();
}

bool ShardedBlocks::gathered(size_t b) const {
  return in_compute_dtype(b) ? blocks_[b].compute_resident() : blocks_[b].data_resident();
}

void ShardedBlocks::start_gather(size_t b) {
  Timed timed(stats_.seconds);
  nn::ParamBlock& B = blocks_[b];
  auto p = std::make_unique<Pending>();
  p->kind = Pending::Gather;
  p->block = b;
  const Tensor* send = &B.shard();
  Tensor* into = &B.data();
  if (in_compute_dtype(b)) {
    // bf16 training: the bf16 copy of the slice travels (half the bytes); a block of an inference
    // model keeps none, and its slice is rounded here.
    B.materialize_compute();
    if (B.keeps_compute_shard()) {
      send = &B.compute_shard();
    } else {
      p->received = B.shard().to(B.compute().dtype());
      send = &p->received;
    }
    into = &B.compute();
  } else {
    B.materialize_data();
  }
  Communicator& ranks = group(b);
  p->handle = ranks.start_all_gather(send->raw_data(), into->raw_data(), send->numel(), into->dtype(),
                                     context_of(*send));
  count(int64_t(into->nbytes()), ranks.size(), false);
  gathers_[b] = std::move(p);
}

void ShardedBlocks::ensure_gathered(size_t b) {
  if (!gathers_[b] && gathered(b)) return;
  if (!gathers_[b]) start_gather(b);
  Timed timed(stats_.seconds);
  gathers_[b]->handle->wait();
  gathers_[b].reset();
}

void ShardedBlocks::release(size_t b) {
  if (pinned_[b]) return;
  TITAN_CHECK(!gathers_[b], "sharded blocks: block '", blocks_[b].name(), "' released while its gather is in flight");
  if (in_compute_dtype(b)) blocks_[b].release_compute();
  else blocks_[b].release_data();
}

void ShardedBlocks::start_gradient_reduction(size_t b) {
  Timed timed(stats_.seconds);
  nn::ParamBlock& B = blocks_[b];
  auto p = std::make_unique<Pending>();
  p->block = b;
  if (sharded(b)) {
    p->kind = Pending::ReduceScatter;
    const Tensor* send = &B.grad();
    if (reduce_ == DType::BF16) {
      // Rounded once here; the whole f32 gradient is not needed past this point.
      p->sent = B.grad().to(DType::BF16);
      send = &p->sent;
      B.release_grad();
    }
    p->received = Tensor::empty({B.shard_grad().numel()}, reduce_, send->device());
    Communicator& ranks = group(b);
    p->handle = ranks.start_reduce_scatter(send->raw_data(), p->received.raw_data(), p->received.numel(),
                                           reduce_, ReduceOp::Sum, context_of(*send));
    count(int64_t(send->nbytes()), ranks.size(), false);
  } else {
    p->kind = Pending::AllReduce;
    p->handle = plan_.world().start_all_reduce(B.grad().raw_data(), B.grad().numel(), DType::F32, ReduceOp::Sum,
                                               context_of(B.grad()));
    count(int64_t(B.grad().nbytes()), plan_.world_size(), true);
  }
  reductions_.push_back(std::move(p));
}

// A completed gradient reduction: a reduce-scatter's slice joins the micro-batches before it, and
// the whole gradient buffer is no longer needed.
void ShardedBlocks::finish(Pending& p) {
  if (p.kind != Pending::ReduceScatter) return;
  nn::ParamBlock& B = blocks_[p.block];
  ops::add_inplace(B.shard_grad(), p.received);  // a bf16 slice widens exactly into the f32 sum
  p.received = Tensor();
  p.sent = Tensor();
  B.release_grad();
}

void ShardedBlocks::poll() {
  Timed timed(stats_.seconds);
  for (auto& p : reductions_)
    if (p && p->handle->poll()) {
      p->handle->wait();
      finish(*p);
      p.reset();
    }
  for (auto& g : gathers_)
    if (g) g->handle->poll();
}

void ShardedBlocks::wait_all() {
  Timed timed(stats_.seconds);
  for (auto& p : reductions_)
    if (p) {
      p->handle->wait();
      finish(*p);
    }
  reductions_.clear();
}

void ShardedBlocks::before_forward(size_t b) {
  if (!sharded()) return;
  profiling::mark_wait("parameter gather");  // the op profiler's phase: waiting for this block's gather
  poll();
  for (size_t x : with_experts(b))
    if (!gathers_[x] && !gathered(x)) start_gather(x);
  // Prefetch: the next block's gather runs while this one computes. Started before the wait on
  // this one, so that a step's first two gathers (the embedding and the first layer) travel
  // together, and the head's gather runs during the last layer.
  if (b + 1 < blocks_.size() && !is(b + 1, BlockKind::Experts))
    for (size_t x : with_experts(b + 1))
      if (!gathers_[x] && !gathered(x)) start_gather(x);
  for (size_t x : with_experts(b)) ensure_gathered(x);
}

void ShardedBlocks::after_forward(size_t b) {
  if (!sharded() || !is(b, BlockKind::Layer) || reshard_ == Reshard::Never) return;
  for (size_t x : with_experts(b))
    if (sharded(x)) release(x);
}

void ShardedBlocks::before_backward(size_t b) {
  if (!sharded()) return;
  profiling::mark_wait("parameter gather");
  poll();
  // (A run of experts held whole accumulates its micro-batches in its gradient, as DDP does.)
  for (size_t x : with_experts(b)) {
    if (!sharded(x)) continue;
    ensure_gathered(x);
    blocks_[x].materialize_grad();
    blocks_[x].grad().fill(0.0);
  }
  // Backward runs the layers in reverse: prefetch the one below.
  if (b >= 1 && is(b - 1, BlockKind::Layer))
    for (size_t x : with_experts(b - 1))
      if (sharded(x) && !gathers_[x] && !gathered(x)) start_gather(x);
}

void ShardedBlocks::after_backward(size_t b) {
  if (sharded() || last_micro_batch_) profiling::mark_wait("gradient reduction");
  if (sharded()) {
    for (size_t x : with_experts(b))
      if (sharded(x)) {
        start_gradient_reduction(x);
        release(x);
      }
  } else if (last_micro_batch_) {
    start_gradient_reduction(b);  // DDP: this layer's all-reduce overlaps the backward below
  }
  poll();
}

void ShardedBlocks::begin_micro_batch(bool last) {
  last_micro_batch_ = last;
  if (!sharded()) return;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (is(b, BlockKind::Ends)) {
      blocks_[b].materialize_grad();
      blocks_[b].grad().fill(0.0);
    }
}

void ShardedBlocks::end_micro_batch() {
  if (!active()) return;
  if (sharded() || last_micro_batch_)
    for (size_t b = 0; b < blocks_.size(); ++b)
      if (is(b, BlockKind::Ends)) start_gradient_reduction(b);
  wait_all();
  if (!last_micro_batch_) return;
  // The optimizer rewrites the kept bf16 slices next, which a gather still in flight would be
  // sending (no prefetch reaches past a step's last backward).
  for (const auto& g : gathers_)
    TITAN_CHECK(!g, "sharded blocks: block '", blocks_[g->block].name(),
                "' is still being gathered after the step's last micro-batch");
  if (sharded()) {
    for (size_t b = 0; b < blocks_.size(); ++b)
      if (is(b, BlockKind::Ends)) release(b);
    if (Communicator* replicas = plan_.replicate_group()) {
      // HSDP: the shard groups of the replicas hold the same slices; sum them (in the reduce dtype:
      // a bf16 job rounds each slice once more and widens the sum back into it).
      std::vector<std::unique_ptr<CommHandle>> pending;
      std::vector<Tensor> rounded(blocks_.size());
      for (size_t b = 0; b < blocks_.size(); ++b) {
        Tensor& slice = blocks_[b].shard_grad();
        Tensor& buf = reduce_ == DType::BF16 ? (rounded[b] = slice.to(DType::BF16)) : slice;
        pending.push_back(
            replicas->start_all_reduce(buf.raw_data(), buf.numel(), reduce_, ReduceOp::Sum, context_of(buf)));
        count(int64_t(buf.nbytes()), int(plan_.dp_replicate()), true);
      }
      Timed timed(stats_.seconds);
      for (auto& h : pending) h->wait();
      for (size_t b = 0; b < blocks_.size(); ++b)
        if (rounded[b].defined()) blocks_[b].shard_grad().copy_from(rounded[b]);
    }
  }
  for (auto& B : blocks_) ops::scale_inplace(B.shard_grad(), 1.0 / double(plan_.dp_size()));
}

void ShardedBlocks::gather_whole(size_t b) {
  if (!sharded() || !sharded(b)) return;
  // A gather in flight would be filling the block's compute copy (a prefetch), not its f32 weights.
  TITAN_CHECK(!gathers_[b], "sharded blocks: block '", blocks_[b].name(),
              "' gathered whole while a gather of it is in flight");
  pinned_[b] = true;  // from here its gather fills the f32 parameters, never a compute copy
  ensure_gathered(b);
}

void ShardedBlocks::release_whole(size_t b) {
  if (!sharded() || !sharded(b)) return;
  pinned_[b] = false;
  blocks_[b].release_data();
}

void ShardedBlocks::end_forward_only() {
  if (!sharded()) return;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (gathers_[b]) ensure_gathered(b);  // a prefetch still in flight
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (sharded(b) && gathered(b)) release(b);
}

}  // namespace titan::dist

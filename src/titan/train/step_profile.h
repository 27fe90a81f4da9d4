#pragma once
// The memory and work of one training step, measured by running it: on the `meta` device (no data,
// milliseconds for any model size: the planner behind `titan info --config` and `titan plan`) or on
// a real device (what the meta figures are checked against). Every allocation goes through the
// device's services, so the counters see exactly what the step holds; nothing is a formula. With a
// data-parallel mesh the step is one rank's: rank 0 of a meta world (dist/meta_world.h) through the
// same ParallelPlan calls the trainer makes, so what the plan shards, gathers and frees is counted.
#include <cstdint>
#include <string_view>

#include "titan/core/device.h"
#include "titan/core/dtype.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

namespace titan::train {

struct StepShape {
  int64_t local_batch = 1;
  int64_t seq_len = 2048;
  int64_t grad_accumulation = 1;
  DType compute = DType::BF16;
  qwen3::Checkpointing checkpointing;  // none
  bool expert_bias = false;  // MoE aux-loss-free balancing (one f32 bias per MoE layer)
  // The data-parallel mesh (parallelism.data_parallel_replicate_degree x _shard_degree): the step
  // is one rank's. Other than 1 x 1 on the meta device only.
  int64_t dp_replicate = 1, dp_shard = 1;
  int64_t ep = 1;  // parallelism.expert_parallel_degree: this rank runs 1/ep of every MoE layer's experts
  dist::Reshard reshard = dist::Reshard::AfterForward;  // parallelism.fsdp_reshard_after_forward
  DType reduce = DType::F32;  // the sharded gradients' reductions (ResolvedJob::reduce_dtype)
  // Memory the fused loss may spend keeping its logits for backward (loss_logits_budget).
  int64_t keep_logits_bytes = int64_t(1) << 30;
  // The device the step runs on (job.device). Profiled on meta, the step holds that device's
  // kernel scratch (core/device_services.h, MetaStandIn) and, for CUDA, the GEMM workspace.
  Device device = Device::CPU;
  // checkpoint.async_mode: a save in the background writes from a host copy of this rank's weights
  // and moments, held beside the steps that follow it (on a CPU job, the same memory as the step's).
  bool async_checkpoint = false;
  // training.activation_grad_dtype = "bfloat16": the step runs with bf16 activation gradients.
  bool bf16_activation_grads = false;
  // [validation] (validation.enable): after the step, this rank's held-out forward without gradients
  // at validation_batch x validation_seq, its blocks gathered as the step's forward gathers them
  // (Validator::run); 0: none.
  int64_t validation_batch = 0, validation_seq = 0;
  // checkpoint.last_save_in_hf: the final Hugging Face export beside the training state
  // (Checkpointer::export_hf): rank 0 writes it with one block at a time gathered whole, and a MoE
  // layer's whole experts where they are split over ranks (train/hf_export.h).
  bool export_gather = false;
};

// What a training step lets the fused loss keep of its [tokens, vocabulary] logits from forward to
// backward instead of recomputing them (a quarter of its FLOPs): 1 GiB in host memory, 8 GiB on a
// GPU, whose loss GEMMs are a larger share of a faster step (Qwen3-0.6B at 8 x 2048 keeps 5 GB of
// bf16 logits). The memory check counts what is kept.
int64_t loss_logits_budget(Device device);

struct StepProfile {
  // Bytes held for the whole run (by this rank: its slice of each block when sharded).
  int64_t weights = 0;    // f32 master weights (the flat blocks)
  // bf16 training: the bf16 copy of each block (its slice when sharded) that AdamW writes
  // (nn::ParamBlock::keep_compute_shard).
  int64_t compute_weights = 0;
  // bf16 training: the trained blocks that keep no such copy, which the step casts at each use (a
  // whole block keeps one only where the step would hold its casts until its backward anyway,
  // dist::ShardedBlocks::shard): the layers activation checkpointing covers (with their experts),
  // the experts alone of such layers where only those are whole (expert parallelism over the whole
  // shard dimension), an untied embedding table.
  int64_t cast_layers = 0, cast_experts_only = 0;
  bool cast_embedding = false;
  int64_t grads = 0;      // f32 gradient blocks
  int64_t optimizer = 0;  // AdamW exp_avg + exp_avg_sq
  int64_t other = 0;      // expert bias and other persistent state
  // The most held at once during the step (and the validation pass and the export's gather that
  // follow it, when the shape has them), and the part of it above the persistent state: activations
  // saved for backward, gradients in flight, kernel scratch, the block the export has gathered.
  int64_t peak = 0;
  // Of that: the most held during the validation forward or the export's gather (0: neither runs).
  int64_t after_step_peak = 0;
  // The most held at once while the state was built, before the step: a rank's blocks are born as
  // its slices (train::rank_model), so a sharded rank never holds a whole block at start-up.
  int64_t startup_peak = 0;
  // On a device with a caching allocator (CUDA; meta replays its policy): the segments the step's
  // allocations left reserved, a cache that started empty (0 elsewhere). Above the peak by what
  // splitting and rounding could not reuse.
  int64_t reserved = 0;
  // StepShape::async_checkpoint on a CPU job: the copy of the weights and AdamW moments a save in the
  // background writes from, held beside the step (0 otherwise: a GPU job's copy is in host memory).
  int64_t checkpoint_copy = 0;
  int64_t activations() const { return peak - persistent(); }
  int64_t persistent() const { return weights + compute_weights + grads + optimizer + other; }
  int64_t blocks = 0;          // flat parameter blocks
  int64_t block_elements = 0;  // their elements, padded for the mesh (Psi)
  dist::CommStats comm;        // the step's collectives as the sharding counted them (bytes, ring steps)
  double flops = 0;      // floating-point operations of this rank's step (meta only; 0 on real devices)
  double seconds = 0;    // wall time of the profile run itself
};

// The step a job config describes (batch, sequence, accumulation, dtype, checkpointing, balancing).
struct JobConfig;
struct ResolvedJob;
struct ActivationCheckpointSection;
// The layers [activation_checkpoint] covers (mode none | selective | full, selective_ac_option).
qwen3::Checkpointing checkpointing_of(const ActivationCheckpointSection& section);
StepShape step_shape(const JobConfig& config, const ResolvedJob& job);

// The step of one rank of a job on the mesh dp_replicate x dp_shard with its experts split over ep
// ranks (expert parallelism: ep divides dp_shard), from the config alone (no
// dataset or weights needed): what `titan info --config` and `titan plan` profile. The config must
// have been validated for that world size (JobConfig::validate).
struct PlannedStep {
  qwen3::ModelArgs args;
  StepShape shape;
};
PlannedStep planned_step(const JobConfig& config, int64_t dp_replicate, int64_t dp_shard, int64_t ep = 1);

// The memory one rank of a job may use on `device` (the CPU: MemAvailable capped by a cgroup
// limit; a GPU: its capacity).
int64_t available_memory_per_rank(Device device);

// training.local_batch_size and training.seq_len within bounds (the model's max_seq_len, 2^31):
// an error naming the key (titan info names its options instead).
void check_step_bounds(const qwen3::ModelArgs& args, const StepShape& shape,
                       std::string_view batch_key = "training.local_batch_size",
                       std::string_view seq_key = "training.seq_len");

// Before anything is allocated for a run: check_step_bounds, a lower bound of the persistent state
// (16 bytes per parameter over the shard degree) and then the meta device's exact profile of one
// rank's step against the memory `shape.device` has available; on the CPU, `ranks_on_host` ranks share the
// host's memory and each gets its share. An error names every number when the run cannot fit.
void check_training_fits(const qwen3::ModelArgs& args, const StepShape& shape, int64_t ranks_on_host = 1);

// Builds the model on `device`, pads its blocks for the mesh, allocates the optimizer state, and
// runs forward + backward over `grad_accumulation` micro-batches, the gradient reduction, the
// global grad norm and one AdamW update of this rank's slice, as the trainer does.
StepProfile profile_training_step(const qwen3::ModelArgs& args, const StepShape& shape, Device device);

}  // namespace titan::train

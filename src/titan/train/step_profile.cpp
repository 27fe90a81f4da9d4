#include "titan/train/step_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/host_memory.h"
#include "titan/dist/expert_exchange.h"
#include "titan/dist/meta_world.h"
#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/models/qwen3/size_check.h"
#include "titan/train/hf_export.h"
#include "titan/train/job_config.h"
#include "titan/train/optimizer.h"
#include "titan/train/startup.h"
#include "titan/train/train_state.h"
#include "titan/train/train_step.h"

namespace titan::train {

StepProfile profile_training_step(const qwen3::ModelArgs& args, const StepShape& shape, Device device) {
  const autograd::Bf16ActivationGradientsScope activation_grads(shape.bf16_activation_grads);
  TITAN_CHECK(shape.local_batch >= 1 && shape.seq_len >= 1 && shape.grad_accumulation >= 1,
              "step profile: batch, seq_len and gradient accumulation must be >= 1, got ", shape.local_batch, ", ",
              shape.seq_len, ", ", shape.grad_accumulation);
  TITAN_CHECK(shape.dp_replicate >= 1 && shape.dp_shard >= 1 && shape.dp_replicate * shape.dp_shard <= (1 << 30),
              "step profile: the mesh dp_replicate ", shape.dp_replicate, " x dp_shard ", shape.dp_shard,
              " must be >= 1 each and at most 2^30 ranks");
  const int world_size = int(shape.dp_replicate * shape.dp_shard);
  // One rank of the job: on meta, rank 0 of a world whose other ranks are imagined; a real device
  // runs one process (a real step of N ranks is `mpirun -np N titan train`).
  TITAN_CHECK(device == Device::Meta || world_size == 1, "step profile: a step of ", world_size,
              " ranks is profiled on the meta device only (got ", device_name(device), ")");
  const std::unique_ptr<dist::Communicator> world =
      device == Device::Meta ? dist::meta_world_communicator(world_size) : dist::single_process_communicator();
  const dist::ParallelPlan plan(*world, shape.dp_replicate, shape.dp_shard, shape.ep);

  TITAN_CHECK(device == Device::Meta || device == shape.device, "step profile: a step for ",
              device_name(shape.device), " profiled on ", device_name(device),
              " (only meta stands in for another device)");
  const MetaStandIn stand_in(shape.device);
  const auto t0 = std::chrono::steady_clock::now();
  DeviceServices& dev = device_services(device);
  dev.release_cached();  // the cache starts as a fresh process's: what the step reserves is its own
  const int64_t base = dev.stats().current_bytes, base_reserved = dev.stats().reserved_bytes;
  dev.reset_peak();
  dev.reset_flops();
  StepProfile p;
  {
    // The step records into a tape of its own: a replay within a bound that runs out of memory
    // (MetaOutOfMemory, mid-forward or mid-backward) leaves its nodes there, holding the model it
    // tears down, and the thread's tape would hand them to the next profile's backward.
    autograd::Tape tape;
    const autograd::TapeScope record_into(&tape);
    // The state as TrainState builds it, then distributes it: the model's blocks born as this
    // rank's slices, padded for the plan, AdamW's moments for the slice, and the model reporting
    // its block uses to the sharding (ZeRO-3).
    qwen3::Qwen3Model model = rank_model(args, shape.compute, device, plan, qwen3::Purpose::Training);
    model.set_checkpointing(shape.checkpointing);
    model.set_keep_logits_bytes(shape.keep_logits_bytes);
    if (shape.expert_bias && args.is_moe()) model.enable_expert_bias();
    dist::ShardedBlocks sharding(plan, model.blocks(), block_roles(model), shape.reshard, shape.reduce);
    const std::unique_ptr<nn::ExpertExchange> exchange =
        plan.ep() > 1 ? dist::expert_exchange(plan.expert_group(), sharding.stats_to_count()) : nullptr;
    model.set_expert_exchange(exchange.get());
    sharding.shard(model.compute_dtype());
    AdamW optimizer(OptimizerSection{}, model.blocks());
    if (sharding.active()) model.set_block_hooks(&sharding);
    const std::vector<nn::ParamBlock>& blocks = model.blocks();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const nn::ParamBlock& b = blocks[i];
      p.weights += int64_t(b.shard().nbytes());
      if (b.keeps_compute_shard()) p.compute_weights += int64_t(b.compute_shard().nbytes());
      p.grads += int64_t(b.shard_grad().nbytes());
      p.block_elements += b.numel();
      if (shape.compute != DType::BF16 || !b.trainable() || b.keeps_compute_shard()) continue;
      if (i == 0)
        p.cast_embedding = true;
      else if (model.is_layer_block(i))
        ++p.cast_layers;
      else if (model.is_expert_block(i) && blocks[model.layer_block_of_experts(i)].keeps_compute_shard())
        ++p.cast_experts_only;
    }
    p.blocks = int64_t(model.blocks().size());
    for (size_t b = 0; b < model.blocks().size(); ++b)
      p.optimizer += int64_t(optimizer.exp_avg()[b].nbytes() + optimizer.exp_avg_sq()[b].nbytes());
    p.other = dev.stats().current_bytes - base - p.weights - p.compute_weights - p.grads - p.optimizer;
    p.startup_peak = dev.stats().peak_bytes - base;
    if (shape.async_checkpoint && shape.device == Device::CPU) p.checkpoint_copy = p.weights + p.optimizer;

    // Token ids: a fixed pattern on real devices (the values do not change what is allocated);
    // none on meta, where a planned batch may be larger than host memory.
    const int64_t B = shape.local_batch, S = shape.seq_len;
    Tensor x = Tensor::empty({B, S}, DType::I64, device), y = Tensor::empty({B, S}, DType::I64, device);
    if (device != Device::Meta) {
      std::vector<int64_t> ids(size_t(B * S)), targets(size_t(B * S));
      for (int64_t i = 0; i < B * S; ++i) {
        ids[size_t(i)] = (i * 7919) % args.vocab_size;
        targets[size_t(i)] = (i * 7919 + 1) % args.vocab_size;
      }
      x.copy_from(Tensor::from_vector(ids, {B, S}));
      y.copy_from(Tensor::from_vector(targets, {B, S}));
    }
    // The GEMM workspace a CUDA process allocates with its first GEMM, in this step (a real CUDA
    // step's own when it is the process' first).
    const Tensor gemm_workspace = device == Device::Meta && shape.device == Device::CUDA
                                      ? Tensor::empty({int64_t(kCudaGemmWorkspaceBytes)}, DType::U8, device)
                                      : Tensor();
    dev.reset_peak();
    sharding.reset_stats();
    // The gradients accumulate in place, so a few micro-batches hold what any more would, and the
    // ones between the first and the last all do the same work (the first and the last gather or
    // reduce what the middle ones keep): the step runs at most three and counts the others as
    // copies of the second (a global batch of thousands of micro-batches is planned in milliseconds).
    const int64_t run = std::min<int64_t>(shape.grad_accumulation, 3);
    int64_t calls = 0;
    double middle_flops = 0;
    dist::CommStats middle_comm;
    const StepGradients g = compute_gradients(model, sharding, plan, run, [&] {
      // Called as each micro-batch starts: the second's work lies between the second and third calls.
      if (calls == 1) {
        middle_flops = -dev.flops();
        middle_comm = sharding.stats();
      } else if (calls == 2) {
        middle_flops += dev.flops();
        const dist::CommStats now = sharding.stats();
        middle_comm = {
            now.bytes_sent - middle_comm.bytes_sent,   now.collectives - middle_comm.collectives,
            now.ring_steps - middle_comm.ring_steps,   now.all_to_all_bytes - middle_comm.all_to_all_bytes,
            now.all_to_alls - middle_comm.all_to_alls, now.seconds - middle_comm.seconds};
      }
      ++calls;
      return MicroBatch{x, y, 1.0 / double(run), {}};  // causal rows, no padding
    });
    apply_update(model, optimizer, OptimizerSection{}.lr, 1, 1.0, g.grad_norm,
                 plan.sum_over_ranks(g.expert_counts), TrainingSection{}.load_balance_coeff);
    // The step's own communication and FLOPs (not the gathers and the forward that follow it).
    p.comm = sharding.stats();
    const int64_t copies = shape.grad_accumulation - run;
    p.comm.bytes_sent += copies * middle_comm.bytes_sent;
    p.comm.collectives += copies * middle_comm.collectives;
    p.comm.ring_steps += copies * middle_comm.ring_steps;
    p.comm.all_to_all_bytes += copies * middle_comm.all_to_all_bytes;
    p.comm.all_to_alls += copies * middle_comm.all_to_alls;
    p.comm.seconds += double(copies) * middle_comm.seconds;
    p.flops = dev.flops() + double(copies) * middle_flops;
    // What runs after a step with the state still held: the held-out forward (Validator::run, its
    // blocks gathered by the hooks as the step's forward gathers them) and the final export, rank
    // 0's part of it (train/hf_export.h): under FSDP one block at a time gathered whole in f32 beside
    // the slices, in the writer's order, and a MoE layer's whole experts where they are split.
    const int64_t step_peak = dev.stats().peak_bytes - base;
    if (shape.validation_batch > 0 || shape.export_gather) {
      dev.reset_peak();  // the phases' own peak; the step's is kept above
      autograd::NoGradGuard no_grad;
      if (shape.validation_batch > 0) {
        Tensor held_out = Tensor::empty({shape.validation_batch, shape.validation_seq}, DType::I64, device);
        if (device != Device::Meta) held_out.fill(0.0);  // token 0 throughout: the values allocate nothing
        model.forward_loss(held_out, held_out);
        sharding.end_forward_only();
      }
      if (shape.export_gather) rehearse_export(plan, model, sharding, shape.device == Device::CPU);
      p.after_step_peak = dev.stats().peak_bytes - base;
    }
    p.peak = std::max(step_peak, p.after_step_peak);
    p.reserved = dev.stats().reserved_bytes - base_reserved;
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

qwen3::Checkpointing checkpointing_of(const ActivationCheckpointSection& ac) {
  using C = qwen3::Checkpointing;
  if (ac.mode == "full") return C::full();
  if (ac.mode != "selective") return C::none();
  return C::every_nth(selective_ac_every(ac.selective_ac_option));
}

StepShape step_shape(const JobConfig& c, const ResolvedJob& job) {
  StepShape s;
  s.local_batch = job.local_batch_size;
  s.seq_len = job.seq_len;
  s.grad_accumulation = job.accumulation_steps;
  s.compute = job.compute_dtype;
  s.checkpointing = checkpointing_of(c.activation_checkpoint);
  s.expert_bias = job.args.is_moe() && c.training.load_balance == "expert_bias";
  s.reshard = dist::reshard_from_name(c.parallelism.fsdp_reshard_after_forward);
  s.reduce = job.reduce_dtype;
  s.keep_logits_bytes = loss_logits_budget(job.device);
  s.device = job.device;
  s.async_checkpoint = c.checkpoint.enable && !c.checkpoint.load_only && c.checkpoint.async();
  s.bf16_activation_grads = job.bf16_activation_grads;
  if (c.validation.enable) {
    s.validation_batch = c.validation.local_batch_size == -1 ? s.local_batch : c.validation.local_batch_size;
    s.validation_seq = c.validation.seq_len == -1 ? s.seq_len : c.validation.seq_len;
  }
  s.export_gather = c.checkpoint.last_save_in_hf;
  return s;
}

int64_t loss_logits_budget(Device device) { return int64_t(device == Device::CUDA ? 8 : 1) << 30; }

PlannedStep planned_step(const JobConfig& c, int64_t dp_replicate, int64_t dp_shard, int64_t ep) {
  ResolvedJob job;
  job.args = resolve_model_args(c);
  job.compute_dtype = resolve_compute_dtype(c);
  // The device the job names, whether or not this machine has one (a GPU job planned anywhere).
  job.device = c.job.device == "cuda" ? Device::CUDA : Device::CPU;
  job.local_batch_size = c.training.local_batch_size;
  job.seq_len = c.training.seq_len;
  job.accumulation_steps = accumulation_steps(c, dp_replicate * dp_shard);
  job.reduce_dtype = resolve_reduce_dtype(c, dp_shard);
  job.bf16_activation_grads =
      c.training.activation_grad_dtype == "bfloat16" && job.compute_dtype == DType::BF16;
  PlannedStep planned{job.args, step_shape(c, job)};
  planned.shape.dp_replicate = dp_replicate;
  planned.shape.dp_shard = dp_shard;
  planned.shape.ep = ep;
  return planned;
}

int64_t available_memory_per_rank(Device device) {
  return device == Device::CPU ? host_available_bytes() : device_services(device).capacity_bytes();
}

void check_step_bounds(const qwen3::ModelArgs& args, const StepShape& shape, std::string_view batch_key,
                       std::string_view seq_key) {
  TITAN_CHECK(shape.local_batch <= kMaxBatchOrSeq, batch_key, " = ", shape.local_batch, " exceeds the limit ",
              kMaxBatchOrSeq);
  TITAN_CHECK(shape.seq_len <= kMaxBatchOrSeq, seq_key, " = ", shape.seq_len, " exceeds the limit ",
              kMaxBatchOrSeq);
  TITAN_CHECK(shape.seq_len <= args.max_seq_len, seq_key, " = ", shape.seq_len,
              " exceeds the model's max_seq_len = ", args.max_seq_len);
  // The validation pass planned after the step, named by its own keys.
  TITAN_CHECK(shape.validation_batch <= kMaxBatchOrSeq,
              "validation.local_batch_size = ", shape.validation_batch, " exceeds the limit ",
              kMaxBatchOrSeq);
  TITAN_CHECK(shape.validation_seq <= std::min(kMaxBatchOrSeq, args.max_seq_len),
              "validation.seq_len = ", shape.validation_seq,
              " exceeds the model's max_seq_len = ", args.max_seq_len);
}

void check_training_fits(const qwen3::ModelArgs& args, const StepShape& shape, int64_t ranks_on_host) {
  check_step_bounds(args, shape);
  const Device device = shape.device;
  const bool shared = device == Device::CPU && ranks_on_host > 1;
  const int64_t machine = available_memory_per_rank(device);
  const int64_t available = machine / (shared ? ranks_on_host : 1);
  char machine_gib[32];
  std::snprintf(machine_gib, sizeof machine_gib, "%.3g GiB", double(machine) / double(int64_t(1) << 30));
  const std::string available_what =
      device != Device::CPU ? "the " + std::string(device_name(device)) + " device's memory"
      : shared ? "this rank's share of the host's MemAvailable (" + std::string(machine_gib) + " over " +
                     std::to_string(ranks_on_host) + " ranks)"
               : host_available_name();
  // What would shrink the need: the knobs this job has not already turned.
  std::string advice = "shrink the model, training.local_batch_size or training.seq_len";
  if (shape.checkpointing.every != 1) advice += ", or set activation_checkpoint.mode = \"full\"";
  const int64_t ranks = shape.dp_replicate * shape.dp_shard;
  const std::string what =
      "training (batch " + std::to_string(shape.local_batch) + " x seq " + std::to_string(shape.seq_len) + ", " +
      std::to_string(args.num_params()) + " parameters, on " + std::string(device_name(device)) +
      (ranks > 1 ? ", per rank of " + std::to_string(ranks) : std::string()) +
      (shared ? ", the host's memory shared by its " + std::to_string(ranks_on_host) + " ranks" : std::string()) + ")";
  // f32 weights, gradients and two AdamW moments, at best spread evenly over the shard group: a
  // model too large for the machine is refused before even the meta model is built (16384 layers
  // of meta tensors take a while to trace). A lower bound whatever the plan shards.
  const int64_t param_bytes =
      qwen3::narrow_size(__int128(args.num_params()) * 4 / shape.dp_shard, "parameter bytes per rank");
  qwen3::check_memory_fits({param_bytes, param_bytes, 2 * param_bytes, 0}, available, what, available_what,
                           advice);
  // Judged by the peak (titan plan judges by what the caching allocator would reserve above it):
  // when the device refuses a segment (cudaMalloc fails; on the CPU, the host has less available
  // than the segment) the allocator returns its cached segments and retries, so a run can squeeze
  // in between the two (docs/planning.md). This check only refuses what cannot run.
  const StepProfile p = profile_training_step(args, shape, Device::Meta);
  qwen3::check_memory_fits(
      {p.weights + p.compute_weights, p.grads, p.optimizer + p.other, p.activations(), p.checkpoint_copy},
      available, what, available_what, advice);
}

}  // namespace titan::train

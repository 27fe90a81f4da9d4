#include "titan/train/torchtitan_keys.h"

namespace titan::train {

namespace {

using U = TorchtitanUse;

// Reasons shared by several keys.
constexpr std::string_view kProfiling = "titan has no PyTorch profiler or memory snapshots; training is unchanged";
constexpr std::string_view kPipelineOnly = "used only by pipeline parallelism, which titan does not have";
constexpr std::string_view kContextOnly = "used only by context parallelism, which titan does not have";
constexpr std::string_view kQuantOnly =
    "configures float8 / MX training, which only a model.converters entry turns on (titan accepts none)";
constexpr std::string_view kCompile =
    "titan has no torch.compile: its kernels are compiled ahead of time and compute the same step";
constexpr std::string_view kComm = "collective timeouts and flight-recorder traces; the math is unchanged";
constexpr std::string_view kFaultOnly = "used only by fault tolerance (TorchFT), which titan does not have";
constexpr std::string_view kSacDetail =
    "fine-tunes what activation checkpointing recomputes; recomputation never changes the step's result";
constexpr std::string_view kPerfOnly = "a performance / memory trade-off that leaves the step's result unchanged";
constexpr std::string_view kPython = "titan cannot import Python modules";
constexpr std::string_view kLoader =
    "data loader worker processes and pinned memory; titan reads data in the training process, same order";
constexpr std::string_view kGc = "Python garbage collection; titan has none";

const std::vector<TorchtitanKey> kKeys = {
    // [job]
    {"job.config_file", U::Ignored, "", "the config file is the one given to --config"},
    {"job.dump_folder", U::Native, "", ""},
    {"job.description", U::Native, "", ""},
    {"job.print_args", U::Ignored, "", "titan always prints the config in effect"},
    {"job.print_config", U::Ignored, "", "titan always prints the config in effect"},
    {"job.save_config_file", U::Ignored, "", "titan prints the config in effect at start-up instead"},
    {"job.save_config_folder", U::Ignored, "", "titan prints the config in effect at start-up instead"},
    {"job.use_for_integration_test", U::Ignored, "", "marks torchtitan's own integration tests"},
    {"job.custom_config_module", U::OffOnly, "", kPython},
    // [profiling]
    {"profiling.enable_profiling", U::Ignored, "", kProfiling},
    {"profiling.run_profiler", U::Ignored, "", kProfiling},
    {"profiling.save_traces_folder", U::Ignored, "", kProfiling},
    {"profiling.profile_freq", U::Ignored, "", kProfiling},
    {"profiling.profile_every_x_iter", U::Ignored, "", kProfiling},
    {"profiling.profiler_active", U::Ignored, "", kProfiling},
    {"profiling.profiler_warmup", U::Ignored, "", kProfiling},
    {"profiling.enable_memory_snapshot", U::Ignored, "", kProfiling},
    {"profiling.save_memory_snapshot_folder", U::Ignored, "", kProfiling},
    // [metrics]
    {"metrics.log_freq", U::Native, "", ""},
    {"metrics.enable_tensorboard", U::Native, "", ""},
    {"metrics.save_tb_folder", U::OffOnly, "tb", "titan writes TensorBoard events to <dump_folder>/tb"},
    {"metrics.disable_color_printing", U::Ignored, "", "titan's log has no colours"},
    {"metrics.enable_color_printing", U::Ignored, "", "titan's log has no colours"},
    {"metrics.rank_0_only", U::Ignored, "", "titan logs metrics from rank 0"},
    {"metrics.save_for_all_ranks", U::Ignored, "", "titan logs metrics from rank 0"},
    {"metrics.enable_wandb", U::Ignored, "",
     "titan does not log to Weights & Biases; metrics.jsonl and TensorBoard hold the same scalars"},
    {"metrics.disable_logging_from_checkpoint", U::Ignored, "", "titan logs every logged step, resumed or not"},
    // [model]
    {"model.name", U::Native, "", ""},
    {"model.flavor", U::Native, "", ""},
    {"model.hf_assets_path", U::Native, "", ""},
    {"model.tokenizer_path", U::Alias, "model.hf_assets_path",
     "the tokenizer's folder (a path to tokenizer.json or tokenizer.model stands for its folder)"},
    {"model.converters", U::OffOnly, "[]|",
     "titan has no model converters (float8 / MX quantized training changes the numerics)"},
    {"model.print_after_conversion", U::Ignored, "", "titan has no model converters"},
    {"model.norm_type", U::OffOnly, "rmsnorm|fused_rmsnorm|compiled_rmsnorm",
     "Qwen3 normalises with RMSNorm; titan has no other norm"},
    {"model.use_flex_attn", U::Ignored, "", "titan's attention kernels compute the same causal attention"},
    {"model.attn_mask_type", U::OffOnly, "causal",
     "titan's attention is causal over the packed sequence (no per-document mask)"},
    // [optimizer]
    {"optimizer.name", U::Native, "", ""},
    {"optimizer.lr", U::Native, "", ""},
    {"optimizer.beta1", U::Native, "", ""},
    {"optimizer.beta2", U::Native, "", ""},
    {"optimizer.eps", U::Native, "", ""},
    {"optimizer.weight_decay", U::Native, "", ""},
    {"optimizer.implementation", U::Ignored, "", "selects PyTorch's AdamW kernel; titan's AdamW computes the same update"},
    {"optimizer.fused", U::Ignored, "", "selects PyTorch's AdamW kernel; titan's AdamW computes the same update"},
    {"optimizer.early_step_in_backward", U::OffOnly, "false",
     "stepping inside backward skips gradient clipping and changes the result; titan steps after backward"},
    // [lr_scheduler]
    {"lr_scheduler.warmup_steps", U::Native, "", ""},
    {"lr_scheduler.total_steps", U::Native, "", ""},
    {"lr_scheduler.decay_ratio", U::Native, "", ""},
    {"lr_scheduler.decay_type", U::Native, "", ""},
    {"lr_scheduler.min_lr_factor", U::Native, "", ""},
    {"lr_scheduler.lr_min", U::Alias, "lr_scheduler.min_lr_factor", ""},
    // [training]
    {"training.dataset", U::Native, "", ""},
    {"training.dataset_path", U::Native, "", ""},
    {"training.local_batch_size", U::Native, "", ""},
    {"training.global_batch_size", U::Native, "", ""},
    {"training.seq_len", U::Native, "", ""},
    {"training.max_norm", U::Native, "", ""},
    {"training.steps", U::Native, "", ""},
    {"training.mixed_precision_param", U::Native, "", ""},
    {"training.seed", U::Native, "", ""},
    {"training.deterministic", U::Native, "", ""},
    {"training.batch_size", U::Alias, "training.local_batch_size", ""},
    {"training.warmup_steps", U::Alias, "lr_scheduler.warmup_steps", ""},
    {"training.data_parallel_degree", U::Alias, "parallelism.data_parallel_shard_degree", ""},
    {"training.data_parallel_replicate_degree", U::Alias, "parallelism.data_parallel_replicate_degree", ""},
    {"training.data_parallel_shard_degree", U::Alias, "parallelism.data_parallel_shard_degree", ""},
    {"training.tensor_parallel_degree", U::Alias, "parallelism.tensor_parallel_degree", ""},
    {"training.pipeline_parallel_degree", U::Alias, "parallelism.pipeline_parallel_degree", ""},
    {"training.fsdp_reshard_after_forward", U::Alias, "parallelism.fsdp_reshard_after_forward", ""},
    {"training.compile", U::Alias, "compile.enable", ""},
    {"training.debug_moe_force_load_balance", U::Alias, "debug.moe_force_load_balance", ""},
    {"training.data_parallel_type", U::Ignored, "",
     "DDP or FSDP: both give the same step up to reduction order; titan shards per [parallelism]"},
    {"training.enable_loss_parallel", U::Ignored, "", kPerfOnly},
    {"training.disable_loss_parallel", U::Ignored, "", kPerfOnly},
    {"training.enable_cpu_offload", U::Ignored, "", kPerfOnly},
    {"training.dtype", U::OffOnly, "float32",
     "titan keeps float32 master weights; full bfloat16 training changes the result"},
    {"training.mixed_precision_reduce", U::OffOnly, "float32", "titan reduces gradients in float32"},
    {"training.gc_freq", U::Ignored, "", kGc},
    {"training.gc_debug", U::Ignored, "", kGc},
    {"training.dataloader.num_workers", U::Ignored, "", kLoader},
    {"training.dataloader.persistent_workers", U::Ignored, "", kLoader},
    {"training.dataloader.pin_memory", U::Ignored, "", kLoader},
    {"training.dataloader.prefetch_factor", U::Ignored, "", kLoader},
    {"training.fp8_linear", U::OffOnly, "false", "titan has no float8 training (it changes the numerics)"},
    {"training.enable_fp8_linear", U::OffOnly, "false", "titan has no float8 training (it changes the numerics)"},
    {"training.enable_float8_linear", U::OffOnly, "false", "titan has no float8 training (it changes the numerics)"},
    {"training.enable_fsdp_fp8_all_gather", U::Ignored, "", kQuantOnly},
    {"training.enable_fsdp_float8_all_gather", U::Ignored, "", kQuantOnly},
    {"training.precompute_float8_dynamic_scale_for_fsdp", U::Ignored, "", kQuantOnly},
    {"training.float8_scaling_type_input", U::Ignored, "", kQuantOnly},
    {"training.float8_scaling_type_weight", U::Ignored, "", kQuantOnly},
    {"training.float8_scaling_type_grad_output", U::Ignored, "", kQuantOnly},
    // [parallelism]
    {"parallelism.data_parallel_replicate_degree", U::Native, "", ""},
    {"parallelism.data_parallel_shard_degree", U::Native, "", ""},
    {"parallelism.tensor_parallel_degree", U::Native, "", ""},
    {"parallelism.expert_parallel_degree", U::Native, "", ""},
    {"parallelism.expert_tensor_parallel_degree", U::OffOnly, "1", "titan has no expert tensor parallelism"},
    {"parallelism.expert_parallel_comm_backend", U::Ignored, "", "selects the all-to-all library; same tokens move"},
    {"parallelism.fsdp_reshard_after_forward", U::Native, "", ""},
    {"parallelism.disable_loss_parallel", U::Ignored, "", kPerfOnly},
    {"parallelism.enable_async_tensor_parallel", U::Ignored, "", kPerfOnly},
    {"parallelism.enable_compiled_autograd", U::Ignored, "", kCompile},
    {"parallelism.pipeline_parallel_degree", U::OffOnly, "1", "titan has no pipeline parallelism"},
    {"parallelism.pipeline_parallel_split_points", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_layers_per_stage", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_first_stage_less_layers", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_last_stage_less_layers", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_schedule", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_schedule_csv", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_microbatches", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_microbatch_size", U::Ignored, "", kPipelineOnly},
    {"parallelism.pipeline_parallel_expert_parallel_overlap", U::Ignored, "", kPipelineOnly},
    {"parallelism.module_fqns_per_model_part", U::Ignored, "", kPipelineOnly},
    {"parallelism.context_parallel_degree", U::OffOnly, "1", "titan has no context parallelism"},
    {"parallelism.context_parallel_rotate_method", U::Ignored, "", kContextOnly},
    {"parallelism.context_parallel_load_balancer", U::Ignored, "", kContextOnly},
    // [checkpoint]
    {"checkpoint.enable", U::Native, "", ""},
    {"checkpoint.folder", U::Native, "", ""},
    {"checkpoint.interval", U::Native, "", ""},
    {"checkpoint.keep_latest_k", U::Native, "", ""},
    {"checkpoint.initial_load_path", U::Native, "", ""},
    {"checkpoint.initial_load_in_hf", U::Native, "", ""},
    {"checkpoint.last_save_in_hf", U::Native, "", ""},
    {"checkpoint.export_dtype", U::Native, "", ""},
    {"checkpoint.enable_checkpoint", U::Alias, "checkpoint.enable", ""},
    {"checkpoint.last_save_in_safetensors_format", U::Alias, "checkpoint.last_save_in_hf", ""},
    {"checkpoint.model_weights_only", U::Alias, "checkpoint.last_save_model_only", ""},
    {"checkpoint.last_save_model_weights_only", U::Alias, "checkpoint.last_save_model_only", ""},
    {"checkpoint.initial_load_model_weights_only", U::Alias, "checkpoint.initial_load_model_only", ""},
    {"checkpoint.last_save_model_only", U::Ignored, "",
     "titan's last save is always a full, resumable checkpoint; last_save_in_hf adds a weights-only export"},
    {"checkpoint.initial_load_model_only", U::OffOnly, "true",
     "titan loads only weights from initial_load_path (a full training state resumes from checkpoint.folder)"},
    {"checkpoint.initial_load_in_hf_quantized", U::OffOnly, "false", "titan cannot load quantized HF checkpoints"},
    {"checkpoint.async_mode", U::Ignored, "", "titan saves synchronously; the checkpoint written is the same"},
    {"checkpoint.interval_type", U::OffOnly, "steps", "titan saves every `interval` steps"},
    {"checkpoint.create_seed_checkpoint", U::OffOnly, "false",
     "titan has no seed-checkpoint mode (it would save the initial weights and exit instead of training)"},
    {"checkpoint.enable_first_step_checkpoint", U::Ignored, "",
     "titan saves every `interval` steps and at the end, not after the first step; the trained model is the same"},
    {"checkpoint.enable_ft_dataloader_checkpoints", U::Ignored, "", kFaultOnly},
    {"checkpoint.exclude_from_loading", U::OffOnly, "[]|",
     "titan resumes the model, optimizer, schedule and data position together"},
    {"checkpoint.load_step", U::OffOnly, "-1", "titan resumes from the newest committed checkpoint"},
    {"checkpoint.load_only", U::OffOnly, "false", "titan always saves when checkpoint.enable is true"},
    // [activation_checkpoint]
    {"activation_checkpoint.mode", U::Native, "", ""},
    {"activation_checkpoint.selective_ac_option", U::Ignored, "",
     "titan's selective mode recomputes every second layer; recomputation never changes the step's result"},
    {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", U::Ignored, "", kSacDetail},
    {"activation_checkpoint.early_stop", U::Ignored, "", kSacDetail},
    {"activation_checkpoint.memory_budget", U::Ignored, "", kSacDetail},
    {"activation_checkpoint.visualize_memory_budget_pareto", U::Ignored, "", kSacDetail},
    {"activation_checkpoint.preserve_rng_state", U::Ignored, "", "titan's forward draws no random numbers"},
    {"activation_checkpoint.determinism_check", U::Ignored, "", kSacDetail},
    {"activation_checkpoint.debug", U::Ignored, "", kSacDetail},
    // [compile]
    {"compile.enable", U::Ignored, "", kCompile},
    {"compile.components", U::Ignored, "", kCompile},
    {"compile.backend", U::Ignored, "", kCompile},
    // [float8], [mx]: the older homes of the quantization settings
    {"float8.enable_float8_linear", U::OffOnly, "false", "titan has no float8 training (it changes the numerics)"},
    {"float8.enable_fsdp_float8_all_gather", U::Ignored, "", kQuantOnly},
    {"float8.precompute_float8_dynamic_scale_for_fsdp", U::Ignored, "", kQuantOnly},
    {"float8.force_recompute_fp8_weight_in_bwd", U::Ignored, "", kQuantOnly},
    {"float8.recipe_name", U::Ignored, "", kQuantOnly},
    {"float8.filter_fqns", U::Ignored, "", kQuantOnly},
    {"float8.emulate", U::Ignored, "", kQuantOnly},
    {"float8.moe_fqns_prototype", U::Ignored, "", kQuantOnly},
    {"float8.scaling_type_input", U::Ignored, "", kQuantOnly},
    {"float8.scaling_type_weight", U::Ignored, "", kQuantOnly},
    {"float8.scaling_type_grad_output", U::Ignored, "", kQuantOnly},
    {"mx.mxfp8_dim1_cast_kernel_choice", U::Ignored, "", kQuantOnly},
    {"mx.use_fp8_dim1_cast_triton_kernel", U::Ignored, "", kQuantOnly},
    {"mx.recipe_name", U::Ignored, "", kQuantOnly},
    {"mx.filter_fqns", U::Ignored, "", kQuantOnly},
    {"mx.moe_fqns_prototype", U::Ignored, "", kQuantOnly},
    // [quantize.*]
    {"quantize.linear.float8.enable_fsdp_float8_all_gather", U::Ignored, "", kQuantOnly},
    {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", U::Ignored, "", kQuantOnly},
    {"quantize.linear.float8.recipe_name", U::Ignored, "", kQuantOnly},
    {"quantize.linear.float8.filter_fqns", U::Ignored, "", kQuantOnly},
    {"quantize.linear.float8.emulate", U::Ignored, "", kQuantOnly},
    {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", U::Ignored, "", kQuantOnly},
    {"quantize.linear.mx.recipe_name", U::Ignored, "", kQuantOnly},
    {"quantize.linear.mx.filter_fqns", U::Ignored, "", kQuantOnly},
    {"quantize.grouped_mm.float8.fqns", U::Ignored, "", kQuantOnly},
    {"quantize.grouped_mm.mx.recipe_name", U::Ignored, "", kQuantOnly},
    {"quantize.grouped_mm.mx.fqns", U::Ignored, "", kQuantOnly},
    {"quantize.dense.float8.enable_fsdp_float8_all_gather", U::Ignored, "", kQuantOnly},
    {"quantize.dense.float8.precompute_float8_dynamic_scale_for_fsdp", U::Ignored, "", kQuantOnly},
    {"quantize.dense.float8.recipe_name", U::Ignored, "", kQuantOnly},
    {"quantize.dense.float8.filter_fqns", U::Ignored, "", kQuantOnly},
    {"quantize.dense.float8.emulate", U::Ignored, "", kQuantOnly},
    {"quantize.dense.mx.mxfp8_dim1_cast_kernel_choice", U::Ignored, "", kQuantOnly},
    {"quantize.dense.mx.recipe_name", U::Ignored, "", kQuantOnly},
    {"quantize.dense.mx.filter_fqns", U::Ignored, "", kQuantOnly},
    {"quantize.moe.float8.fqns", U::Ignored, "", kQuantOnly},
    {"quantize.moe.mx.fqns", U::Ignored, "", kQuantOnly},
    // [comm]
    {"comm.init_timeout_seconds", U::Ignored, "", kComm},
    {"comm.train_timeout_seconds", U::Ignored, "", kComm},
    {"comm.trace_buf_size", U::Ignored, "", kComm},
    {"comm.save_traces_folder", U::Ignored, "", kComm},
    {"comm.save_traces_file_prefix", U::Ignored, "", kComm},
    {"comm.mode", U::OffOnly, "default", "titan has no fake-backend dry run (it would not train)"},
    // [memory_estimation], [estimate]
    {"memory_estimation.enable", U::OffOnly, "false",
     "titan has no memory-estimation mode (it would not train); `titan info` estimates memory"},
    {"memory_estimation.enabled", U::Alias, "memory_estimation.enable", ""},
    {"memory_estimation.disable_fake_mode", U::Ignored, "", "used only by memory estimation"},
    {"estimate.memory", U::OffOnly, "false",
     "titan has no memory-estimation mode (it would not train); `titan info` estimates memory"},
    {"estimate.mode", U::Ignored, "", "used only by memory estimation"},
    // [fault_tolerance]
    {"fault_tolerance.enable", U::OffOnly, "false", "titan has no fault tolerance (TorchFT)"},
    {"fault_tolerance.process_group", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.process_group_timeout_ms", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.replica_id", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.group_size", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.min_replica_size", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.semi_sync_method", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.sync_steps", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.should_quantize", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.fragment_sync_delay", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.fragment_update_alpha", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.num_fragments", U::Ignored, "", kFaultOnly},
    {"fault_tolerance.module_fqns_per_model_fragment", U::Ignored, "", kFaultOnly},
    // [experimental]: the older home of several parallelism keys
    {"experimental.custom_import", U::OffOnly, "", kPython},
    {"experimental.custom_args_module", U::OffOnly, "", kPython},
    {"experimental.custom_model_path", U::OffOnly, "", kPython},
    {"experimental.torch_spmd", U::OffOnly, "false", "titan has no torch SPMD mode"},
    {"experimental.pipeline_parallel_degree", U::Alias, "parallelism.pipeline_parallel_degree", ""},
    {"experimental.pipeline_parallel_split_points", U::Ignored, "", kPipelineOnly},
    {"experimental.pipeline_parallel_split_mode", U::Ignored, "", kPipelineOnly},
    {"experimental.pipeline_parallel_schedule", U::Ignored, "", kPipelineOnly},
    {"experimental.pipeline_parallel_schedule_csv", U::Ignored, "", kPipelineOnly},
    {"experimental.pipeline_parallel_microbatches", U::Ignored, "", kPipelineOnly},
    {"experimental.context_parallel_degree", U::Alias, "parallelism.context_parallel_degree", ""},
    {"experimental.context_parallel_rotate_method", U::Ignored, "", kContextOnly},
    {"experimental.enable_async_tensor_parallel", U::Ignored, "", kPerfOnly},
    {"experimental.enable_compiled_autograd", U::Ignored, "", kCompile},
    // [validation]
    {"validation.enable", U::Native, "", ""},
    {"validation.enabled", U::Alias, "validation.enable", ""},
    {"validation.dataset", U::Native, "", ""},
    {"validation.dataset_path", U::Native, "", ""},
    {"validation.local_batch_size", U::Native, "", ""},
    {"validation.seq_len", U::Native, "", ""},
    {"validation.freq", U::Native, "", ""},
    {"validation.steps", U::Native, "", ""},
    {"validation.dataloader.num_workers", U::Ignored, "", kLoader},
    {"validation.dataloader.persistent_workers", U::Ignored, "", kLoader},
    {"validation.dataloader.pin_memory", U::Ignored, "", kLoader},
    {"validation.dataloader.prefetch_factor", U::Ignored, "", kLoader},
    // [debug]
    {"debug.seed", U::Alias, "training.seed", ""},
    {"debug.deterministic", U::Alias, "training.deterministic", ""},
    {"debug.deterministic_warn_only", U::Ignored, "", "titan's deterministic mode has no non-deterministic ops to warn about"},
    {"debug.moe_force_load_balance", U::OffOnly, "false", "forcing balanced MoE routing changes the result"},
};

}  // namespace

const std::vector<TorchtitanKey>& torchtitan_keys() { return kKeys; }

const TorchtitanKey* find_torchtitan_key(std::string_view key) {
  for (auto& k : kKeys)
    if (k.key == key) return &k;
  return nullptr;
}

std::vector<std::string> torchtitan_off_values(const TorchtitanKey& k) {
  std::vector<std::string> values;
  std::string_view rest = k.target;
  for (;;) {
    auto bar = rest.find('|');
    values.emplace_back(rest.substr(0, bar));
    if (bar == std::string_view::npos) return values;
    rest.remove_prefix(bar + 1);
  }
}

}  // namespace titan::train

#include "titan/train/torchtitan_keys.h"

namespace titan::train {

namespace {

using U = TorchtitanUse;

// Reasons shared by several keys.
constexpr std::string_view kMemorySnapshot =
    "titan writes no PyTorch memory snapshots (the [profiling] trace carries the allocated bytes at every "
    "op)";
constexpr std::string_view kPipelineOnly = "used only by pipeline parallelism, which titan does not have";
constexpr std::string_view kContextOnly = "used only by context parallelism, which titan does not have";
constexpr std::string_view kQuantOnly =
    "configures float8 / MX training, which only a model.converters entry turns on (titan accepts none)";
constexpr std::string_view kCompile =
    "titan has no torch.compile: its kernels are compiled ahead of time and compute the same step";
constexpr std::string_view kComm = "flight-recorder traces of the collectives; the math is unchanged";
constexpr std::string_view kFaultOnly = "used only by fault tolerance (TorchFT), which titan does not have";
constexpr std::string_view kSacDetail =
    "fine-tunes what activation checkpointing recomputes; recomputation never changes the step's result";
constexpr std::string_view kPerfOnly = "a performance / memory trade-off that leaves the step's result unchanged";
constexpr std::string_view kPython = "titan cannot import Python modules";
constexpr std::string_view kLoader =
    "data loader worker processes and pinned memory; titan reads data in the training process, same order";
constexpr std::string_view kGc = "Python garbage collection; titan has none";

// torchtitan's keys section by section; neighbouring keys with the same use (and target, reason)
// share one row: native(keys), alias(target, keys), ignored(why, keys), off_only(values, why, keys).
constexpr TorchtitanType kBool = TorchtitanType::Bool, kInt = TorchtitanType::Int,
                         kNumber = TorchtitanType::Number, kString = TorchtitanType::String,
                         kChoice = TorchtitanType::Choice, kStrings = TorchtitanType::Strings,
                         kArray = TorchtitanType::Array;

// A key with the values it takes (torchtitan's type for it).
struct TypedKey {
  std::string_view key;
  TorchtitanType type = TorchtitanType::String;
  std::string_view choices = "";  // kChoice: the values, '|'-separated
};

struct KeyGroup {
  TorchtitanUse use;
  std::string_view target, why;
  std::vector<TypedKey> keys;
};

std::vector<TypedKey> untyped(const std::vector<std::string_view>& keys) {
  std::vector<TypedKey> typed;
  for (std::string_view k : keys) typed.push_back({k});
  return typed;
}

KeyGroup native(const std::vector<std::string_view>& keys) {
  return {U::Native, "", "", untyped(keys)};
}
KeyGroup alias(std::string_view target, const std::vector<std::string_view>& keys,
               std::string_view why = "") {
  return {U::Alias, target, why, untyped(keys)};
}
// Ignored keys carry their type: torchtitan refuses compile.enable = "yes", and so does titan.
KeyGroup ignored(std::string_view why, std::vector<TypedKey> keys) {
  return {U::Ignored, "", why, std::move(keys)};
}
KeyGroup off_only(std::string_view values, std::string_view why, const std::vector<std::string_view>& keys) {
  return {U::OffOnly, values, why, untyped(keys)};
}

const std::vector<KeyGroup> kGroups = {
    // [job]
    ignored("the config file is the one given to --config", {{"job.config_file", kString}}),
    native({"job.dump_folder", "job.description"}),
    ignored("titan always prints the config in effect",
            {{"job.print_args", kBool}, {"job.print_config", kBool}}),
    ignored("titan prints the config in effect at start-up and keeps it in <dump_folder>/run_info.json "
            "(config_in_effect, one key = value line each) instead",
            {{"job.save_config_file", kString}, {"job.save_config_folder", kString}}),
    ignored("marks torchtitan's own integration tests", {{"job.use_for_integration_test", kBool}}),
    off_only("", kPython, {"job.custom_config_module"}),
    // [profiling]
    native({"profiling.enable_profiling", "profiling.save_traces_folder", "profiling.profile_freq",
            "profiling.profiler_active"}),
    alias("profiling.enable_profiling", {"profiling.run_profiler"}),
    alias("profiling.profile_freq", {"profiling.profile_every_x_iter"}),
    ignored("titan's op timeline needs no warm-up steps: it times the profiled steps as they run",
            {{"profiling.profiler_warmup", kInt}}),
    off_only("false", kMemorySnapshot, {"profiling.enable_memory_snapshot"}),
    ignored(kMemorySnapshot, {{"profiling.save_memory_snapshot_folder", kString}}),
    // [metrics]
    native({"metrics.log_freq", "metrics.enable_tensorboard", "metrics.save_tb_folder",
            "metrics.save_for_all_ranks"}),
    alias("metrics.save_for_all_ranks", {"metrics.rank_0_only"},
          "inverted: rank_0_only = false saves for all ranks"),
    ignored("titan's log has no colours",
            {{"metrics.disable_color_printing", kBool}, {"metrics.enable_color_printing", kBool}}),
    off_only("false",
             "titan does not log to Weights & Biases; metrics.jsonl and TensorBoard hold the same scalars",
             {"metrics.enable_wandb"}),
    off_only("false", "titan logs every logged step, resumed or not",
             {"metrics.disable_logging_from_checkpoint"}),
    // [model]
    native({"model.name", "model.flavor", "model.hf_assets_path", "model.attn_mask_type"}),
    alias("model.hf_assets_path", {"model.tokenizer_path"},
          "the tokenizer's folder (a path to tokenizer.json or tokenizer.model stands for its folder)"),
    off_only("[]|", "titan has no model converters (float8 / MX quantized training changes the numerics)",
             {"model.converters"}),
    ignored("titan has no model converters (titan info prints the model)",
            {{"model.print_after_conversion", kBool}}),
    off_only("rmsnorm|fused_rmsnorm|compiled_rmsnorm",
             "Qwen3 normalises with RMSNorm; titan has no other norm", {"model.norm_type"}),
    ignored(
        "titan's attention kernels compute the attention model.attn_mask_type names, causal or block-causal",
        {{"model.use_flex_attn", kBool}}),
    // [optimizer]
    native({"optimizer.name", "optimizer.lr", "optimizer.beta1", "optimizer.beta2", "optimizer.eps",
            "optimizer.weight_decay"}),
    ignored("selects PyTorch's AdamW kernel; titan's AdamW computes the same update",
            {{"optimizer.implementation", kChoice, "for-loop|foreach|fused"}, {"optimizer.fused", kBool}}),
    off_only(
        "false",
        "stepping inside backward skips gradient clipping and changes the result; titan steps after backward",
        {"optimizer.early_step_in_backward"}),
    // [lr_scheduler]
    native({"lr_scheduler.warmup_steps", "lr_scheduler.total_steps", "lr_scheduler.decay_ratio",
            "lr_scheduler.decay_type", "lr_scheduler.min_lr_factor"}),
    alias("lr_scheduler.min_lr_factor", {"lr_scheduler.lr_min"}),
    // [training]
    native({"training.dataset", "training.dataset_path", "training.local_batch_size",
            "training.global_batch_size", "training.seq_len", "training.max_norm", "training.steps",
            "training.mixed_precision_param", "training.mixed_precision_reduce", "training.seed",
            "training.deterministic"}),
    alias("training.local_batch_size", {"training.batch_size"}),
    alias("lr_scheduler.warmup_steps", {"training.warmup_steps"}),
    alias("parallelism.data_parallel_shard_degree", {"training.data_parallel_degree"}),
    alias("parallelism.data_parallel_replicate_degree", {"training.data_parallel_replicate_degree"}),
    alias("parallelism.data_parallel_shard_degree", {"training.data_parallel_shard_degree"}),
    alias("parallelism.tensor_parallel_degree", {"training.tensor_parallel_degree"}),
    alias("parallelism.pipeline_parallel_degree", {"training.pipeline_parallel_degree"}),
    alias("parallelism.fsdp_reshard_after_forward", {"training.fsdp_reshard_after_forward"}),
    alias("compile.enable", {"training.compile"}),
    alias("debug.moe_force_load_balance", {"training.debug_moe_force_load_balance"}),
    ignored("DDP or FSDP: both give the same step up to reduction order; titan shards per [parallelism]",
            {{"training.data_parallel_type", kString}}),
    ignored(kPerfOnly, {{"training.enable_loss_parallel", kBool},
                        {"training.disable_loss_parallel", kBool},
                        {"training.enable_cpu_offload", kBool}}),
    off_only(
        "float32",
        "titan's weights are float32 (training.mixed_precision_param = \"bfloat16\" computes in bf16 over "
        "float32 master weights); full bfloat16 training changes the result",
        {"training.dtype"}),
    ignored(kGc, {{"training.gc_freq", kInt}, {"training.gc_debug", kBool}}),
    ignored(kLoader, {{"training.dataloader.num_workers", kInt},
                      {"training.dataloader.persistent_workers", kBool},
                      {"training.dataloader.pin_memory", kBool},
                      {"training.dataloader.prefetch_factor", kInt}}),
    off_only("false", "titan has no float8 training (it changes the numerics)",
             {"training.fp8_linear", "training.enable_fp8_linear", "training.enable_float8_linear"}),
    ignored(kQuantOnly, {{"training.enable_fsdp_fp8_all_gather", kBool},
                         {"training.enable_fsdp_float8_all_gather", kBool},
                         {"training.precompute_float8_dynamic_scale_for_fsdp", kBool},
                         {"training.float8_scaling_type_input", kString},
                         {"training.float8_scaling_type_weight", kString},
                         {"training.float8_scaling_type_grad_output", kString}}),
    // [parallelism]
    native({"parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
            "parallelism.tensor_parallel_degree", "parallelism.expert_parallel_degree"}),
    off_only("1", "titan has no expert tensor parallelism", {"parallelism.expert_tensor_parallel_degree"}),
    ignored("selects the all-to-all library; same tokens move",
            {{"parallelism.expert_parallel_comm_backend", kChoice, "standard|deepep"}}),
    native({"parallelism.fsdp_reshard_after_forward"}),
    ignored(kPerfOnly, {{"parallelism.disable_loss_parallel", kBool},
                        {"parallelism.enable_async_tensor_parallel", kBool}}),
    ignored(kCompile, {{"parallelism.enable_compiled_autograd", kBool}}),
    off_only("1", "titan has no pipeline parallelism", {"parallelism.pipeline_parallel_degree"}),
    ignored(kPipelineOnly, {{"parallelism.pipeline_parallel_split_points", kStrings},
                            {"parallelism.pipeline_parallel_layers_per_stage", kInt},
                            {"parallelism.pipeline_parallel_first_stage_less_layers", kInt},
                            {"parallelism.pipeline_parallel_last_stage_less_layers", kInt},
                            {"parallelism.pipeline_parallel_schedule", kString},
                            {"parallelism.pipeline_parallel_schedule_csv", kString},
                            {"parallelism.pipeline_parallel_microbatches", kInt},
                            {"parallelism.pipeline_parallel_microbatch_size", kInt},
                            {"parallelism.pipeline_parallel_expert_parallel_overlap", kBool},
                            {"parallelism.module_fqns_per_model_part", kArray}}),
    off_only("1", "titan has no context parallelism", {"parallelism.context_parallel_degree"}),
    ignored(kContextOnly, {{"parallelism.context_parallel_rotate_method", kChoice, "allgather|alltoall"},
                           {"parallelism.context_parallel_load_balancer", kString}}),
    // [checkpoint]
    native({"checkpoint.enable", "checkpoint.folder", "checkpoint.interval", "checkpoint.interval_type",
            "checkpoint.keep_latest_k", "checkpoint.initial_load_path", "checkpoint.initial_load_in_hf",
            "checkpoint.last_save_in_hf", "checkpoint.export_dtype",
            "checkpoint.enable_first_step_checkpoint", "checkpoint.load_step",
            "checkpoint.exclude_from_loading", "checkpoint.create_seed_checkpoint", "checkpoint.load_only",
            "checkpoint.initial_load_model_only", "checkpoint.async_mode"}),
    alias("checkpoint.enable", {"checkpoint.enable_checkpoint"}),
    alias("checkpoint.last_save_in_hf", {"checkpoint.last_save_in_safetensors_format"}),
    alias("checkpoint.last_save_model_only",
          {"checkpoint.model_weights_only", "checkpoint.last_save_model_weights_only"}),
    alias("checkpoint.initial_load_model_only", {"checkpoint.initial_load_model_weights_only"}),
    ignored("titan's last save is always a full, resumable checkpoint; last_save_in_hf adds a weights-only "
            "export",
            {{"checkpoint.last_save_model_only", kBool}}),
    off_only("false", "titan cannot load quantized HF checkpoints",
             {"checkpoint.initial_load_in_hf_quantized"}),
    ignored(kFaultOnly, {{"checkpoint.enable_ft_dataloader_checkpoints", kBool}}),
    // [activation_checkpoint]
    native({"activation_checkpoint.mode", "activation_checkpoint.selective_ac_option"}),
    ignored(kSacDetail, {{"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", kStrings},
                         {"activation_checkpoint.early_stop", kBool},
                         {"activation_checkpoint.memory_budget", kNumber},
                         {"activation_checkpoint.visualize_memory_budget_pareto", kBool}}),
    ignored("titan's forward draws no random numbers", {{"activation_checkpoint.preserve_rng_state", kBool}}),
    ignored(kSacDetail,
            {{"activation_checkpoint.determinism_check", kString}, {"activation_checkpoint.debug", kBool}}),
    // [compile]
    ignored(kCompile,
            {{"compile.enable", kBool}, {"compile.components", kStrings}, {"compile.backend", kString}}),
    // [float8], [mx]: the older homes of the quantization settings
    off_only("false", "titan has no float8 training (it changes the numerics)",
             {"float8.enable_float8_linear"}),
    ignored(kQuantOnly, {{"float8.enable_fsdp_float8_all_gather", kBool},
                         {"float8.precompute_float8_dynamic_scale_for_fsdp", kBool},
                         {"float8.force_recompute_fp8_weight_in_bwd", kBool},
                         {"float8.recipe_name", kString},
                         {"float8.filter_fqns", kStrings},
                         {"float8.emulate", kBool},
                         {"float8.moe_fqns_prototype", kStrings},
                         {"float8.scaling_type_input", kString},
                         {"float8.scaling_type_weight", kString},
                         {"float8.scaling_type_grad_output", kString},
                         {"mx.mxfp8_dim1_cast_kernel_choice", kChoice, "triton|cuda|torch"},
                         {"mx.use_fp8_dim1_cast_triton_kernel", kBool},
                         {"mx.recipe_name", kString},
                         {"mx.filter_fqns", kStrings},
                         {"mx.moe_fqns_prototype", kStrings}}),
    // [quantize.*]
    ignored(kQuantOnly,
            {{"quantize.linear.float8.enable_fsdp_float8_all_gather", kBool},
             {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", kBool},
             {"quantize.linear.float8.recipe_name", kChoice, "tensorwise|rowwise|rowwise_with_gw_hp"},
             {"quantize.linear.float8.filter_fqns", kStrings},
             {"quantize.linear.float8.emulate", kBool},
             {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", kChoice, "triton|cuda|torch"},
             {"quantize.linear.mx.recipe_name", kString},
             {"quantize.linear.mx.filter_fqns", kStrings},
             {"quantize.grouped_mm.float8.fqns", kStrings},
             {"quantize.grouped_mm.mx.recipe_name", kChoice, "mxfp8|mxfp8_wgrad_with_hp"},
             {"quantize.grouped_mm.mx.fqns", kStrings},
             {"quantize.dense.float8.enable_fsdp_float8_all_gather", kBool},
             {"quantize.dense.float8.precompute_float8_dynamic_scale_for_fsdp", kBool},
             {"quantize.dense.float8.recipe_name", kChoice, "tensorwise|rowwise|rowwise_with_gw_hp"},
             {"quantize.dense.float8.filter_fqns", kStrings},
             {"quantize.dense.float8.emulate", kBool},
             {"quantize.dense.mx.mxfp8_dim1_cast_kernel_choice", kChoice, "triton|cuda|torch"},
             {"quantize.dense.mx.recipe_name", kString},
             {"quantize.dense.mx.filter_fqns", kStrings},
             {"quantize.moe.float8.fqns", kStrings},
             {"quantize.moe.mx.fqns", kStrings}}),
    // [comm]
    native({"comm.init_timeout_seconds", "comm.train_timeout_seconds"}),
    ignored(kComm, {{"comm.trace_buf_size", kInt},
                    {"comm.save_traces_folder", kString},
                    {"comm.save_traces_file_prefix", kString}}),
    off_only("default", "titan has no fake-backend dry run (it would not train)", {"comm.mode"}),
    // [memory_estimation], [estimate]
    off_only("false",
             "titan has no memory-estimation mode (it would not train); `titan info` estimates memory",
             {"memory_estimation.enable"}),
    alias("memory_estimation.enable", {"memory_estimation.enabled"}),
    ignored("used only by memory estimation", {{"memory_estimation.disable_fake_mode", kBool}}),
    off_only("false",
             "titan has no memory-estimation mode (it would not train); `titan info` estimates memory",
             {"estimate.memory"}),
    ignored("used only by memory estimation", {{"estimate.mode", kString}}),
    // [fault_tolerance]
    off_only("false", "titan has no fault tolerance (TorchFT)", {"fault_tolerance.enable"}),
    ignored(kFaultOnly, {{"fault_tolerance.process_group", kString},
                         {"fault_tolerance.process_group_timeout_ms", kInt},
                         {"fault_tolerance.replica_id", kInt},
                         {"fault_tolerance.group_size", kInt},
                         {"fault_tolerance.min_replica_size", kInt},
                         {"fault_tolerance.semi_sync_method", kString},
                         {"fault_tolerance.sync_steps", kInt},
                         {"fault_tolerance.should_quantize", kBool},
                         {"fault_tolerance.fragment_sync_delay", kInt},
                         {"fault_tolerance.fragment_update_alpha", kNumber},
                         {"fault_tolerance.num_fragments", kInt},
                         {"fault_tolerance.module_fqns_per_model_fragment", kArray}}),
    // [experimental]: the older home of several parallelism keys
    off_only(
        "", kPython,
        {"experimental.custom_import", "experimental.custom_args_module", "experimental.custom_model_path"}),
    off_only("false", "titan has no torch SPMD mode", {"experimental.torch_spmd"}),
    alias("parallelism.pipeline_parallel_degree", {"experimental.pipeline_parallel_degree"}),
    ignored(kPipelineOnly, {{"experimental.pipeline_parallel_split_points", kArray},
                            {"experimental.pipeline_parallel_split_mode", kString},
                            {"experimental.pipeline_parallel_schedule", kString},
                            {"experimental.pipeline_parallel_schedule_csv", kString},
                            {"experimental.pipeline_parallel_microbatches", kInt}}),
    alias("parallelism.context_parallel_degree", {"experimental.context_parallel_degree"}),
    ignored(kContextOnly, {{"experimental.context_parallel_rotate_method", kString}}),
    ignored(kPerfOnly, {{"experimental.enable_async_tensor_parallel", kBool}}),
    ignored(kCompile, {{"experimental.enable_compiled_autograd", kBool}}),
    // [validation]
    native({"validation.enable"}),
    alias("validation.enable", {"validation.enabled"}),
    native({"validation.dataset", "validation.dataset_path", "validation.local_batch_size",
            "validation.seq_len", "validation.freq", "validation.steps"}),
    ignored(kLoader, {{"validation.dataloader.num_workers", kInt},
                      {"validation.dataloader.persistent_workers", kBool},
                      {"validation.dataloader.pin_memory", kBool},
                      {"validation.dataloader.prefetch_factor", kInt}}),
    // [debug]
    alias("training.seed", {"debug.seed"}),
    alias("training.deterministic", {"debug.deterministic"}),
    ignored("titan's deterministic mode runs no non-deterministic op to warn about",
            {{"debug.deterministic_warn_only", kBool}}),
    off_only("false", "forcing balanced MoE routing changes the result", {"debug.moe_force_load_balance"}),
};

const std::vector<TorchtitanKey> kKeys = [] {
  std::vector<TorchtitanKey> keys;
  for (const KeyGroup& g : kGroups)
    for (const TypedKey& k : g.keys) keys.push_back({k.key, g.use, g.target, g.why, k.type, k.choices});
  return keys;
}();

}  // namespace

const std::vector<TorchtitanKey>& torchtitan_keys() { return kKeys; }

const TorchtitanKey* find_torchtitan_key(std::string_view key) {
  for (auto& k : kKeys)
    if (k.key == key) return &k;
  return nullptr;
}

namespace {

std::vector<std::string> split_bars(std::string_view rest) {
  std::vector<std::string> values;
  for (;;) {
    auto bar = rest.find('|');
    values.emplace_back(rest.substr(0, bar));
    if (bar == std::string_view::npos) return values;
    rest.remove_prefix(bar + 1);
  }
}

}  // namespace

std::vector<std::string> torchtitan_off_values(const TorchtitanKey& k) {
  return split_bars(k.target);
}

std::vector<std::string> torchtitan_choices(const TorchtitanKey& k) {
  return split_bars(k.choices);
}

}  // namespace titan::train

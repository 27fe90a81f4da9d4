#include "titan/train/train_state.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "titan/core/device_services.h"
#include "titan/data/data_identity.h"
#include "titan/dist/expert_exchange.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/io/json_error.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/checkpoint.h"
#include "titan/train/checkpoint_blocks.h"
#include "titan/train/log.h"
#include "titan/train/metrics.h"
#include "titan/train/native_model.h"
#include "titan/train/step_profile.h"

namespace titan::train {

namespace {

qwen3::Qwen3Model build_model(const JobConfig& c, const ResolvedJob& job, const dist::ParallelPlan& plan,
                              qwen3::Purpose purpose) {
  qwen3::Qwen3Model model = rank_model(job.args, job.compute_dtype, job.device, plan, purpose);
  model.set_checkpointing(checkpointing_of(c.activation_checkpoint));
  model.set_keep_logits_bytes(loss_logits_budget(job.device));  // as the memory check's step profile
  if (job.args.is_moe() && c.training.load_balance == "expert_bias") model.enable_expert_bias();
  return model;
}

LrSchedule build_schedule(const JobConfig& c) {
  LrScheduleConfig sc;
  sc.lr = c.optimizer.lr;
  sc.steps = std::max<int64_t>(c.lr_scheduler.total_steps == -1 ? c.training.steps : c.lr_scheduler.total_steps, 1);
  // A run of 0 steps (a resume that only exports) has no schedule to warm up in.
  sc.warmup_steps = std::min(c.lr_scheduler.warmup_steps, sc.steps);
  if (c.lr_scheduler.decay_ratio >= 0) sc.decay_ratio = c.lr_scheduler.decay_ratio;
  sc.decay_type = decay_type_from_name(c.lr_scheduler.decay_type);
  sc.min_lr_factor = c.lr_scheduler.min_lr_factor;
  LrSchedule schedule(sc);
  if (!schedule.adjustment().empty()) say("lr_scheduler: %s", schedule.adjustment().c_str());
  return schedule;
}

data::LoaderConfig loader_config(const JobConfig& c, const ResolvedJob& job, const dist::ParallelPlan& plan,
                                 const data::Tokenizer& tokenizer) {
  data::LoaderConfig lc;
  lc.paths = job.dataset;
  lc.text_field = c.training.text_field;
  lc.chat_field = c.training.chat_field;
  lc.pack_conversations = c.training.pack_conversations;
  lc.best_fit_window = best_fit_window(c.training);
  lc.text_split = c.training.text_split;
  lc.eos_id = document_separator(c.training, tokenizer);
  lc.seq_len = job.seq_len;
  // Every rank reads the global batch and trains on its rows (TrainStep): the batches, and the
  // loader's position in a checkpoint, do not depend on the number of ranks.
  lc.local_batch_size = job.local_batch_size * plan.dp_size();
  return lc;
}

}  // namespace

qwen3::Qwen3Model rank_model(const qwen3::ModelArgs& args, DType compute_dtype, Device device,
                             const dist::ParallelPlan& plan, qwen3::Purpose purpose) {
  qwen3::Qwen3Model model(args, compute_dtype, device, nn::BlockShard{plan.shard_index(), plan.dp_shard()},
                          purpose, qwen3::ExpertSplit{plan.expert_index(), plan.ep(), plan.expert_shard()});
  plan.shard_blocks(model.blocks());
  return model;
}

std::vector<dist::BlockRole> block_roles(const qwen3::Qwen3Model& model) {
  std::vector<dist::BlockRole> roles;
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    const bool copy_is_free = model.holds_whole_weights_through_step(b);
    roles.push_back(
        model.is_layer_block(b) ? dist::BlockRole(dist::BlockKind::Layer, 0, copy_is_free)
        : model.is_expert_block(b)
            ? dist::BlockRole(dist::BlockKind::Experts, model.layer_block_of_experts(b), copy_is_free)
            : dist::BlockRole(dist::BlockKind::Ends, 0, copy_is_free));
  }
  return roles;
}

TrainState::TrainState(const JobConfig& c, const ResolvedJob& job, const data::Tokenizer& tokenizer,
                       const dist::ParallelPlan& plan, qwen3::Purpose purpose)
    : purpose(purpose),
      model(build_model(c, job, plan, purpose)),
      sharding(plan, model.blocks(), block_roles(model),
               dist::reshard_from_name(c.parallelism.fsdp_reshard_after_forward), job.reduce_dtype),
      optimizer(c.optimizer, model.blocks()),
      schedule(build_schedule(c)),
      loader(loader_config(c, job, plan, tokenizer), tokenizer),
      dataset_identity(data::dataset_identity(loader.files())) {
  if (plan.ep() > 1) {
    expert_exchange = dist::expert_exchange(plan.expert_group(), sharding.stats_to_count());
    model.set_expert_exchange(expert_exchange.get());
  }
}

void TrainState::distribute() {
  sharding.shard(model.compute_dtype());
  if (sharding.active()) model.set_block_hooks(&sharding);
}

std::string memory_per_rank(const TrainState& s) {
  double params = 0, copies = 0, grads = 0, moments = 0;
  for (auto& b : s.model.blocks()) {
    params += double(b.shard().nbytes());
    if (b.keeps_compute_shard()) copies += double(b.compute_shard().nbytes());
    grads += double(b.shard_grad().nbytes());
  }
  for (auto* m : {&s.optimizer.exp_avg(), &s.optimizer.exp_avg_sq()})
    for (auto& t : *m) moments += double(t.nbytes());
  // The allocator's peak so far: a sharded rank holds its slices only (an initialisation draws
  // them, a load writes into them).
  const double start_peak = double(device_services(s.model.device()).stats().peak_bytes);
  char copy[80] = "";
  if (copies > 0)
    std::snprintf(copy, sizeof copy, ", bf16 copy of the parameters %.1f MiB", copies / 1048576);
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters %.1f MiB, gradients %.1f MiB, AdamW state %.1f MiB%s (start-up peak %.1f MiB)",
                params / 1048576, grads / 1048576, moments / 1048576, copy, start_peak / 1048576);
  return line;
}

nlohmann::json stop_tokens_generation_config(const qwen3::ModelArgs& args, const data::Tokenizer& tokenizer,
                                             int32_t document_separator) {
  const nlohmann::json config = qwen3::hf_config_from_args(args, "float32");
  std::vector<int64_t> eos;
  auto add = [&](int64_t id) {
    if (id >= 0 && id < args.vocab_size && std::find(eos.begin(), eos.end(), id) == eos.end())
      eos.push_back(id);
  };
  const nlohmann::json& config_eos = config.at("eos_token_id");  // a number or a list
  for (const nlohmann::json& id : config_eos.is_array() ? config_eos : nlohmann::json::array({config_eos}))
    if (id.is_number_integer()) add(id.get<int64_t>());
  add(tokenizer.eos_id());
  add(document_separator);
  if (eos.empty()) return nlohmann::json();
  nlohmann::json g = {{"eos_token_id", eos}};
  if (config.at("bos_token_id").is_number_integer()) g["bos_token_id"] = config["bos_token_id"];
  return g;
}

nlohmann::json read_generation_config(const std::filesystem::path& hf_dir) {
  const std::filesystem::path file = hf_dir / "generation_config.json";
  if (!std::filesystem::exists(file)) return nullptr;
  nlohmann::json g = io::read_json_file(file, "generation_config.json");
  TITAN_CHECK(g.is_object(), file.string(), ": a generation config is a JSON object, got ", g.type_name());
  return g;
}

bool names_stop_tokens(const std::filesystem::path& hf_dir) {
  if (std::filesystem::exists(hf_dir / "generation_config.json")) return true;
  const std::filesystem::path file = hf_dir / "config.json";
  if (!std::filesystem::exists(file)) return false;
  const nlohmann::json config = io::read_json_file(file, "config.json");
  return config.is_object() && config.contains("eos_token_id") && !config["eos_token_id"].is_null();
}

namespace {

// start_weights on this rank alone.
void read_start_weights(TrainState& state, const JobConfig& c, const ResolvedJob& job) {
  if (!job.initial_hf.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    std::string read;
    {
      Progress progress("loading Hugging Face weights from " + job.initial_hf.string(),
                        bytes_under(job.initial_hf));
      read = qwen3::load_hf_weights(state.model, job.initial_hf);
    }
    say("loaded Hugging Face weights from %s in %.1f s: %s", job.initial_hf.string().c_str(),
        seconds_since(t0), read.c_str());
    state.generation_config = read_generation_config(job.initial_hf);
    if (!state.generation_config.is_null() &&
        state.purpose == qwen3::Purpose::Training)  // (eval writes none)
      say("its generation_config.json (stop tokens, sampling defaults) goes into every checkpoint and "
          "export");
  } else if (!job.initial_native.empty()) {
    LoadedCheckpoint ck = load_checkpoint_dir(job.initial_native, CheckpointParts::Weights);
    const std::string untied = restore_whole_parameters(ck, state.model);
    // (A run that trains from these weights starts its optimizer fresh: whether the checkpoint could
    // be resumed is no concern of it.)
    if (state.purpose == qwen3::Purpose::Inference && !ck.unresumable.empty())
      say("note: %s", ck.unresumable.c_str());
    // The expert biases are part of how the trained model routes: they come with its weights.
    std::string biases;
    if (ck.train_state.contains("expert_bias")) {
      const auto saved = ck.train_state["expert_bias"].get<std::vector<std::vector<double>>>();
      if (!state.model.expert_bias().empty()) {
        state.model.set_expert_bias_values(saved);
        biases = " and its MoE expert biases";
      } else if (const double largest = largest_expert_bias(saved); largest > 0) {
        say("note: %s holds MoE expert biases (largest |bias| %.3g) that this run does not use: "
            "training.load_balance = \"%s\" routes without them, so tokens may go to other experts than "
            "in the run that saved it",
            ck.dir.string().c_str(), largest, c.training.load_balance.c_str());
      }
    }
    // The model's generation defaults come with its weights too.
    state.generation_config = ck.train_state.value("generation_config", nlohmann::json());
    say("loaded native weights%s from %s (step %ld)%s%s", biases.c_str(), ck.dir.string().c_str(),
        long(ck.step), state.purpose == qwen3::Purpose::Training ? "; optimizer and step start fresh" : "",
        untied.empty() ? "" : ("; " + untied).c_str());
  } else {
    auto t0 = std::chrono::steady_clock::now();
    state.model.initialize(uint64_t(c.training.seed), c.model.init == "torchtitan"
                                                          ? qwen3::InitScheme::Torchtitan
                                                          : qwen3::InitScheme::HuggingFace);
    say("initialized weights from seed %ld (%s scheme) in %.1f s", long(c.training.seed),
        c.model.init.c_str(), seconds_since(t0));
    // Training from scratch beside a folder of weights is allowed (a fresh model of that
    // architecture), but a forgotten initial_load_in_hf looks just like it: say which it is.
    if (!c.model.hf_assets_path.empty() && io::is_hf_checkpoint_dir(c.model.hf_assets_path))
      say("note: model.hf_assets_path '%s' holds Hugging Face weights this run does not load "
          "(checkpoint.initial_load_in_hf = false): it starts from the random weights above; set "
          "checkpoint.initial_load_in_hf = true to start from those",
          c.model.hf_assets_path.c_str());
  }
}

}  // namespace

void start_weights(TrainState& state, const JobConfig& config, const ResolvedJob& job,
                   const dist::ParallelPlan& plan) {
  // Each rank reads its own slice, each replica the whole model. A rank done reading waits in the
  // agreement for the slowest, and one on a slow file system may take longer than the start-up bound:
  // the wait is widened by the reads' time.
  const bool reads = !job.initial_hf.empty() || !job.initial_native.empty();
  const dist::DiskTimeAllowance allowance(
      plan.world(),
      reads ? uint64_t(job.args.num_params()) * sizeof(float) * uint64_t(plan.dp_replicate()) : 0,
      "read the starting weights");
  plan.agree_on_success([&] { read_start_weights(state, config, job); });
}

}  // namespace titan::train

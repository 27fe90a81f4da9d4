#include "titan/train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <omp.h>

#include "titan/autograd/autograd.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/allocator.h"
#include "titan/core/check.h"
#include "titan/data/assets.h"
#include "titan/data/data_identity.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/kernels/registry.h"
#include "titan/kernels/substitution.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/size_check.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/optim.h"
#include "titan/train/checkpoint.h"
#include "titan/train/lr_schedule.h"
#include "titan/train/metrics.h"
#include "titan/train/native_model.h"
#include "titan/train/resume_guard.h"
#include "titan/train/run_lock.h"

namespace titan::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_stop_signal{0};
// The first SIGINT/SIGTERM asks for a clean stop; the handler then steps aside so that a second
// one (an impatient Ctrl-C during the final save) terminates the process the default way.
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

qwen3::ModelArgs resolve_model_args(const JobConfig& c) {
  qwen3::ModelArgs args;
  if (c.model.name == "hf") {
    fs::path cfg = fs::path(c.model.hf_assets_path) / "config.json";
    TITAN_CHECK(fs::exists(cfg), "model.hf_assets_path: '", c.model.hf_assets_path, "' has no config.json");
    args = qwen3::args_from_hf_config_file(cfg.string());
  } else {
    args = qwen3::flavor(c.model.flavor);
  }
  for (auto& [k, v] : c.model.overrides) qwen3::apply_override(args, k, v);
  // Training an MoE with the aux loss means adding it, whatever the checkpoint's config says.
  if (args.is_moe()) args.output_router_logits = c.training.load_balance == "aux_loss";
  args.validate();
  return args;
}

DType resolve_compute_dtype(const JobConfig& c) {
  if (c.training.mixed_precision_param == "float32") return DType::F32;
  const auto& cpu = cpu::cpu_info();
  if (cpu.avx512_bf16 || cpu.amx_usable) return DType::BF16;
  say("mixed precision: this CPU has neither AVX512-BF16 nor AMX; computing in float32");
  return DType::F32;
}

fs::path resolve_tokenizer(const JobConfig& c) {
  if (c.model.hf_assets_path.empty()) {
    fs::path p = data::default_tokenizer_path();
    TITAN_CHECK(fs::exists(p / "tokenizer.json"), "the default tokenizer '", p.string(),
                "' is missing (run scripts/setup.sh, or set model.hf_assets_path)");
    return p;
  }
  // A folder the user named must hold the tokenizer: silently falling back to the default one
  // would train on different token ids than the user's checkpoint expects.
  fs::path dir = c.model.hf_assets_path;
  TITAN_CHECK(fs::is_directory(dir), "model.hf_assets_path: '", dir.string(), "' is not a directory");
  TITAN_CHECK(fs::exists(dir / "tokenizer.json"), "model.hf_assets_path: '", dir.string(),
              "' has no tokenizer.json");
  return dir;
}

// An HF checkpoint folder must hold weights before anything is built from it.
void check_hf_weights_present(const fs::path& dir, const char* key) {
  TITAN_CHECK(fs::is_directory(dir), key, ": '", dir.string(), "' is not a directory");
  TITAN_CHECK(fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json"), key,
              ": '", dir.string(), "' has no model.safetensors or model.safetensors.index.json");
}

// Every f32 master weight and optimizer moment is finite: a checkpoint must never hold NaN/Inf.
bool all_finite(const std::vector<io::TensorWrite>& tensors, std::string* bad) {
  for (auto& t : tensors) {
    const float* p = static_cast<const float*>(t.data);
    const int64_t n = shape_numel(t.shape);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) {
        *bad = t.name;
        return false;
      }
  }
  return true;
}

std::vector<fs::path> resolve_dataset(const JobConfig& c) {
  if (!c.training.dataset_path.empty()) {
    TITAN_CHECK(fs::exists(c.training.dataset_path), "training.dataset_path: '", c.training.dataset_path,
                "' does not exist");
    return {c.training.dataset_path};
  }
  try {
    return {data::builtin_dataset_path(c.training.dataset)};
  } catch (const Error& e) {
    TITAN_FAIL("training.dataset: ", e.what());
  }
}

// Module names the model announces through ModuleScope (for substitution globs).
std::vector<std::string> module_names(const qwen3::ModelArgs& a) {
  std::vector<std::string> names = {"tok_embeddings", "norm", "output"};
  for (int64_t i = 0; i < a.n_layers; ++i) {
    std::string l = "layers." + std::to_string(i);
    names.push_back(l);
    names.push_back(l + ".attention");
    names.push_back(l + (a.is_moe_layer(i) ? ".moe" : ".feed_forward"));
  }
  return names;
}

void install_substitutions(const JobConfig& c, const qwen3::ModelArgs& a, DType dtype) {
  if (c.kernels.empty()) return;
  // Everything is checked before anything is logged or installed.
  for (auto& line : kernels::plan_substitutions(c.kernels, module_names(a), Device::CPU, dtype))
    say("%s", line.c_str());
  kernels::set_substitutions(c.kernels);
}

struct OptimizerState {
  std::vector<Tensor> exp_avg, exp_avg_sq;  // one flat f32 buffer per parameter block
};

std::vector<Tensor> grad_buffers(qwen3::Qwen3Model& m) {
  std::vector<Tensor> g;
  for (auto& b : m.blocks()) g.push_back(b.grad());
  return g;
}

// Tensors of a native checkpoint: parameters under native names, AdamW moments alike.
void checkpoint_tensors(qwen3::Qwen3Model& m, OptimizerState& opt, std::vector<io::TensorWrite>& model_t,
                        std::vector<io::TensorWrite>& opt_t) {
  for (size_t b = 0; b < m.blocks().size(); ++b)
    for (auto& p : m.blocks()[b].params()) {
      model_t.push_back({p.name, DType::F32, p.shape, p.value.raw_data()});
      opt_t.push_back({"exp_avg." + p.name, DType::F32, p.shape, opt.exp_avg[b].data<float>() + p.offset});
      opt_t.push_back({"exp_avg_sq." + p.name, DType::F32, p.shape, opt.exp_avg_sq[b].data<float>() + p.offset});
    }
}

}  // namespace

TrainSummary run_training(const JobConfig& cfg) {
  const auto t_start = Clock::now();
  const int world_size = 1, rank = 0;
  cfg.validate(world_size);
  if (cfg.training.deterministic) omp_set_dynamic(0);

  // From here on SIGINT/SIGTERM ask for a clean stop (a checkpoint at the next step boundary).
  g_stop_signal = 0;
  auto prev_int = std::signal(SIGINT, on_stop_signal);
  auto prev_term = std::signal(SIGTERM, on_stop_signal);
  struct RestoreSignals {
    decltype(prev_int) i, t;
    ~RestoreSignals() {
      std::signal(SIGINT, i);
      std::signal(SIGTERM, t);
    }
  } restore_signals{prev_int, prev_term};

  // ---- everything that can fail on bad input, before any compute
  qwen3::ModelArgs args = resolve_model_args(cfg);
  const DType dtype = resolve_compute_dtype(cfg);
  qwen3::check_training_fits(args, cfg.training.local_batch_size, cfg.training.seq_len, dtype,
                             cfg.activation_checkpoint.mode);
  const fs::path tokenizer_path = resolve_tokenizer(cfg);
  const std::vector<fs::path> dataset = resolve_dataset(cfg);
  const fs::path dump = cfg.job.dump_folder;
  const RunLock run_lock(dump, rank);  // before anything in the folder is read or written
  const fs::path ckpt_folder = dump / cfg.checkpoint.folder;
  CheckpointManager ckpt(ckpt_folder, cfg.checkpoint.keep_latest_k, rank);
  const std::optional<int64_t> resume_step = cfg.checkpoint.enable ? ckpt.latest_step() : std::nullopt;
  for (const fs::path& d : ckpt.foreign_step_dirs())
    say("checkpoint: ignoring %s: not a checkpoint titan wrote (it is never loaded or deleted)", d.c_str());
  const int64_t resume_from = resume_step.value_or(-1);
  fs::path initial_hf;
  if (!resume_step) {
    if (!cfg.checkpoint.initial_load_path.empty()) {
      TITAN_CHECK(fs::exists(cfg.checkpoint.initial_load_path), "checkpoint.initial_load_path: '",
                  cfg.checkpoint.initial_load_path, "' does not exist");
      if (cfg.checkpoint.initial_load_in_hf) initial_hf = cfg.checkpoint.initial_load_path;
      else
        TITAN_CHECK(fs::exists(fs::path(cfg.checkpoint.initial_load_path) / "COMMITTED"),
                    "checkpoint.initial_load_path: '", cfg.checkpoint.initial_load_path,
                    "' is not a committed titan checkpoint (no COMMITTED marker; for a Hugging Face folder set "
                    "checkpoint.initial_load_in_hf = true)");
    } else if (cfg.checkpoint.initial_load_in_hf) {
      initial_hf = cfg.model.hf_assets_path;
    }
    if (!initial_hf.empty())
      check_hf_weights_present(initial_hf, cfg.checkpoint.initial_load_path.empty() ? "model.hf_assets_path"
                                                                                     : "checkpoint.initial_load_path");
  }
  data::Tokenizer tokenizer = data::Tokenizer::load(tokenizer_path);
  TITAN_CHECK(tokenizer.vocab_size() <= args.vocab_size, "tokenizer '", tokenizer_path.string(), "' has ",
              tokenizer.vocab_size(), " ids but the model's vocab_size is ", args.vocab_size);

  const int64_t B = cfg.training.local_batch_size, S = cfg.training.seq_len;
  const int64_t dp = world_size;
  const int64_t accum = cfg.training.global_batch_size == -1 ? 1 : cfg.training.global_batch_size / (B * dp);

  // ---- start-up log
  const auto& cpu = cpu::cpu_info();
  say("titan train: %s", cfg.job.description.c_str());
  say("model: route %s, %s, %s parameters (%s active per token), %s compute, vocab %ld",
      cfg.model.name == "hf" ? "hf" : "native", cfg.model.name == "hf" ? cfg.model.hf_assets_path.c_str() : cfg.model.flavor.c_str(),
      std::to_string(args.num_params()).c_str(), std::to_string(args.num_active_params()).c_str(),
      std::string(dtype_name(dtype)).c_str(), long(args.vocab_size));
  say("ranks: %d (data parallel %ld), threads per rank: %d", world_size, long(dp), omp_get_max_threads());
  say("device: %s", cpu.summary().c_str());
  say("data: %s, tokenizer %s, batch %ld x seq %ld, gradient accumulation %ld", dataset[0].string().c_str(),
      tokenizer_path.string().c_str(), long(B), long(S), long(accum));
  std::string kernel_line;
  for (const char* op : {"linear", "attention", "rms_norm", "rope", "swiglu", "embedding", "linear_cross_entropy",
                         "router_topk", "moe_experts", "adamw"})
    if (kernels::has_kernel(op, Device::CPU, op == std::string("adamw") ? DType::F32 : dtype, "reference"))
      kernel_line += std::string(kernel_line.empty() ? "" : ", ") + op + "=" +
                     kernels::select_variant(op, Device::CPU, op == std::string("adamw") ? DType::F32 : dtype);
  say("kernels: %s", kernel_line.c_str());
  install_substitutions(cfg, args, dtype);
  say("config in effect:\n%s", cfg.describe().c_str());

  // ---- model, optimizer, schedule, data
  qwen3::Qwen3Model model(args, dtype);
  const std::string& ac = cfg.activation_checkpoint.mode;
  model.set_checkpointing(ac == "full" ? qwen3::Checkpointing::Full
                          : ac == "selective" ? qwen3::Checkpointing::Selective : qwen3::Checkpointing::None);
  if (args.is_moe() && cfg.training.load_balance == "expert_bias") model.enable_expert_bias();

  OptimizerState opt;
  for (auto& b : model.blocks()) {
    opt.exp_avg.push_back(Tensor::zeros({b.numel()}, DType::F32));
    opt.exp_avg_sq.push_back(Tensor::zeros({b.numel()}, DType::F32));
  }
  LrScheduleConfig sched_cfg;
  sched_cfg.lr = cfg.optimizer.lr;
  sched_cfg.steps = std::max<int64_t>(cfg.training.steps, 1);
  sched_cfg.warmup_steps = cfg.lr_scheduler.warmup_steps;
  if (cfg.lr_scheduler.decay_ratio >= 0) sched_cfg.decay_ratio = cfg.lr_scheduler.decay_ratio;
  sched_cfg.decay_type = decay_type_from_name(cfg.lr_scheduler.decay_type);
  sched_cfg.min_lr_factor = cfg.lr_scheduler.min_lr_factor;
  LrSchedule schedule(sched_cfg);
  if (!schedule.adjustment().empty()) say("lr_scheduler: %s", schedule.adjustment().c_str());
  ops::AdamWConfig adamw{cfg.optimizer.lr, cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps,
                         cfg.optimizer.weight_decay};
  ops::validate(adamw);

  data::LoaderConfig lc;
  lc.paths = dataset;
  lc.text_field = cfg.training.text_field;
  lc.seq_len = S;
  lc.local_batch_size = B;
  lc.dp_rank = rank;
  lc.dp_size = int(dp);
  data::TokenLoader loader(lc, tokenizer);
  const nlohmann::json data_identity = data::dataset_identity(loader.files());

  int64_t step = 0, tokens_seen = 0;
  if (resume_step) {
    auto t0 = Clock::now();
    LoadedCheckpoint c = ckpt.load(resume_from);
    check_same_model_config(c.train_state.at("model_config"), args, c.dir.string());
    restore_model_tensors(c.model, model);
    for (size_t b = 0; b < model.blocks().size(); ++b)
      for (auto& p : model.blocks()[b].params()) {
        restore_tensor(c.optimizer, "exp_avg." + p.name, p.shape, opt.exp_avg[b].data<float>() + p.offset);
        restore_tensor(c.optimizer, "exp_avg_sq." + p.name, p.shape, opt.exp_avg_sq[b].data<float>() + p.offset);
      }
    const auto& ts = c.train_state;
    step = ts.at("step").get<int64_t>();
    tokens_seen = ts.at("tokens_seen").get<int64_t>();
    std::string diff = schedule.diff_state(ts.at("lr_scheduler"));
    if (!diff.empty()) say("warning: the LR schedule differs from the checkpoint's: %s", diff.c_str());
    TITAN_CHECK(ts.at("world_size").get<int>() == world_size, "checkpoint ", c.dir.string(), " was written by ",
                ts.at("world_size").get<int>(), " ranks; this run has ", world_size);
    std::string data_note =
        restore_data_position(loader, ts, data_identity, cfg.checkpoint.restart_data_stream, c.dir.string());
    if (!data_note.empty()) say("%s", data_note.c_str());
    if (ts.contains("expert_bias") && !model.expert_bias().empty())
      for (size_t i = 0; i < model.expert_bias().size(); ++i)
        if (model.expert_bias()[i].defined()) {
          auto v = ts["expert_bias"][i].get<std::vector<double>>();
          for (size_t e = 0; e < v.size(); ++e) model.expert_bias()[i].data<float>()[e] = float(v[e]);
        }
    say("resumed from %s (step %ld, %ld tokens seen) in %.1f s", c.dir.string().c_str(), long(step), long(tokens_seen),
        seconds_since(t0));
  } else if (!initial_hf.empty()) {
    auto t0 = Clock::now();
    {
      Progress progress("loading Hugging Face weights from " + initial_hf.string(), bytes_under(initial_hf));
      qwen3::load_hf_weights(model, initial_hf);
    }
    say("loaded Hugging Face weights from %s in %.1f s", initial_hf.string().c_str(), seconds_since(t0));
  } else if (!cfg.checkpoint.initial_load_path.empty()) {
    LoadedCheckpoint c = load_checkpoint_dir(cfg.checkpoint.initial_load_path, rank);
    restore_model_tensors(c.model, model);
    say("loaded native weights from %s (step %ld); optimizer and step start fresh", c.dir.string().c_str(),
        long(c.step));
  } else {
    model.initialize(uint64_t(cfg.training.seed),
                     cfg.model.init == "torchtitan" ? qwen3::InitScheme::Torchtitan : qwen3::InitScheme::HuggingFace);
    say("initialized weights from seed %ld (%s scheme)", long(cfg.training.seed), cfg.model.init.c_str());
  }

  int64_t last_saved_step = resume_from;
  auto save = [&](int64_t at_step) {
    auto t0 = Clock::now();
    std::vector<io::TensorWrite> mt, ot;
    checkpoint_tensors(model, opt, mt, ot);
    std::string bad;
    TITAN_CHECK(all_finite(mt, &bad) && all_finite(ot, &bad), "step ", at_step, ": '", bad,
                "' holds non-finite values; no checkpoint written (lower optimizer.lr?)");
    nlohmann::json ts;
    ts["step"] = at_step;
    ts["tokens_seen"] = tokens_seen;
    ts["model_config"] = qwen3::hf_config_from_args(args, "float32");
    ts["route"] = cfg.model.name;
    ts["tokenizer_path"] = fs::absolute(tokenizer_path).string();
    ts["lr_scheduler"] = schedule.state_dict();
    ts["dataloader"] = loader.state();
    ts["dataset_identity"] = data_identity;
    ts["rng"] = {{"seed", cfg.training.seed}};  // no random state is consumed after initialisation
    ts["world_size"] = world_size;
    ts["mesh"] = {{"dp_replicate", cfg.parallelism.data_parallel_replicate_degree}, {"dp_shard", dp},
                  {"tp", cfg.parallelism.tensor_parallel_degree}, {"ep", cfg.parallelism.expert_parallel_degree}};
    if (!model.expert_bias().empty()) {
      ts["expert_bias"] = nlohmann::json::array();
      for (auto& b : model.expert_bias())
        ts["expert_bias"].push_back(b.defined() ? b.to_vector() : std::vector<double>{});
    }
    ckpt.save(at_step, mt, ot, ts);
    last_saved_step = at_step;
    say("checkpoint: saved %s in %.1f s", ckpt.step_dir(at_step).string().c_str(), seconds_since(t0));
  };

  // ---- the loop
  MetricsLogger metrics(dump, cfg.metrics.enable_tensorboard, rank == 0);
  const double peak_tflops = cfg.metrics.peak_tflops > 0 ? cfg.metrics.peak_tflops : cpu.peak_flops(dtype) / 1e12;
  const double flops_per_token = args.flops_per_token(S);
  say("MFU: FLOPs/token %.4g (6 x active matmul params incl. lm_head + 12 x layers x heads x head_dim x seq), "
      "peak %.2f TFLOP/s (%s)", flops_per_token, peak_tflops,
      cfg.metrics.peak_tflops > 0 ? "metrics.peak_tflops" : "detected");
  Allocator& alloc = allocator_for(Device::CPU);
  const int64_t device_bytes = device_memory_bytes();

  TrainSummary summary;
  double sustained_time = 0;
  int64_t sustained_tokens = 0;
  bool first = true;
  while (step < cfg.training.steps) {
    if (g_stop_signal.load()) {
      // The step in hand is complete: save it (unless it is already saved, or nothing was
      // trained yet) and stop. A checkpoint is written even with checkpoint.enable = false, so
      // that no work is lost; resuming from it needs checkpoint.enable = true.
      if (step == last_saved_step || step == 0) {
        say("received signal %d at step %ld: nothing new to save; stopping", g_stop_signal.load(), long(step));
      } else {
        say("received signal %d: saving a checkpoint at step %ld and stopping", g_stop_signal.load(), long(step));
        save(step);
      }
      summary.interrupted = true;
      break;
    }
    const auto t0 = Clock::now();
    alloc.reset_peak();
    ++step;
    model.zero_grad();
    double loss_sum = 0, aux_sum = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      data::Batch batch = loader.next();
      TITAN_CHECK(!batch.empty(), "data: the dataset ran out at step ", step);
      Tensor ids = Tensor::from_vector(batch.inputs, {B, S});
      Tensor targets = Tensor::from_vector(batch.labels, {B, S});
      qwen3::LossOutput out = model.forward_loss(ids, targets);
      double l = out.loss.item();
      TITAN_CHECK(std::isfinite(l), "step ", step, ": the loss is not finite (", l,
                  "); stopping before the optimizer step (no checkpoint written)");
      loss_sum += l;
      if (out.aux_loss.defined()) aux_sum += out.aux_loss.item();
      autograd::backward(accum == 1 ? out.loss : ops::scale(out.loss, 1.0 / double(accum)));
    }
    std::vector<Tensor> grads = grad_buffers(model);
    double grad_norm = ops::global_grad_norm(grads);
    TITAN_CHECK(std::isfinite(grad_norm), "step ", step, ": the gradient norm is not finite (", grad_norm,
                "); stopping before the optimizer step (no checkpoint written)");
    // Clipping is folded into the update: AdamW reads each gradient times the clip coefficient.
    const double clip = ops::clip_coefficient(cfg.training.max_norm, grad_norm);
    const double lr = schedule.lr(step - 1);
    adamw.lr = lr;
    for (size_t b = 0; b < model.blocks().size(); ++b)
      ops::adamw_step(model.blocks()[b].data(), model.blocks()[b].grad(), opt.exp_avg[b], opt.exp_avg_sq[b], adamw,
                      step, clip);
    if (!model.expert_bias().empty()) {
      // Aux-loss-free balancing: nudge under-used experts up, over-used down (selection only).
      for (size_t i = 0; i < model.expert_bias().size(); ++i) {
        Tensor& bias = model.expert_bias()[i];
        if (!bias.defined()) continue;
        const Tensor& counts = model.last_expert_counts()[i];
        const int64_t E = counts.numel();
        double mean = 0;
        for (int64_t e = 0; e < E; ++e) mean += double(counts.data<int64_t>()[e]) / double(E);
        for (int64_t e = 0; e < E; ++e) {
          double d = mean - double(counts.data<int64_t>()[e]);
          bias.data<float>()[e] += float(cfg.training.load_balance_coeff * ((d > 0) - (d < 0)));
        }
      }
    }
    const int64_t step_tokens = B * S * accum;
    tokens_seen += step_tokens;
    const double dt = seconds_since(t0);
    if (!first) {
      sustained_time += dt;
      sustained_tokens += step_tokens;
    }
    summary.final_loss = loss_sum / double(accum);
    if (step % cfg.metrics.log_freq == 0 || first || step == cfg.training.steps) {
      StepMetrics m;
      m.step = step;
      m.loss = summary.final_loss;
      m.aux_loss = args.is_moe() ? aux_sum / double(accum) : -1;
      m.grad_norm = grad_norm;
      m.lr = lr;
      m.memory_gib = double(alloc.stats().peak_bytes) / double(1ll << 30);
      m.memory_pct = 100.0 * double(alloc.stats().peak_bytes) / double(device_bytes);
      m.tps = double(step_tokens) / dt;
      m.tflops = m.tps * flops_per_token / 1e12;
      m.mfu = 100.0 * m.tflops / peak_tflops;
      m.step_seconds = dt;
      m.warmup = first;
      metrics.log(m);
    }
    first = false;
    ++summary.steps_run;
    if (cfg.checkpoint.enable && (step % cfg.checkpoint.interval == 0 || step == cfg.training.steps)) save(step);
  }

  summary.last_step = step;
  summary.tokens = tokens_seen;
  summary.seconds = seconds_since(t_start);
  summary.sustained_tps = sustained_time > 0 ? double(sustained_tokens) / sustained_time : 0;
  summary.sustained_mfu = 100.0 * summary.sustained_tps * flops_per_token / 1e12 / peak_tflops;
  if (!summary.interrupted && cfg.checkpoint.last_save_in_hf) {
    auto t0 = Clock::now();
    fs::path out = ckpt_folder / ("step-" + std::to_string(step) + "-hf");
    std::vector<fs::path> tok_files;
    fs::path tok_dir = fs::is_directory(tokenizer_path) ? tokenizer_path : tokenizer_path.parent_path();
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (fs::exists(tok_dir / f)) tok_files.push_back(tok_dir / f);
    const DType export_dtype = cfg.checkpoint.export_dtype == "bfloat16" ? DType::BF16 : DType::F32;
    {
      uint64_t total = 0;
      for (auto& r : qwen3::hf_tensors(model)) total += uint64_t(shape_numel(r.shape)) * dtype_size(export_dtype);
      Progress progress("export: writing " + out.string(), total, [&] { return bytes_in_temporaries_of(out); });
      qwen3::export_hf_model(model, out, export_dtype, tok_files, /*overwrite=*/true);
    }
    say("export: wrote Hugging Face checkpoint %s (%s) in %.1f s", out.string().c_str(),
        cfg.checkpoint.export_dtype.c_str(), seconds_since(t0));
  }
  char sustained[160] = "no step after the warm-up step to measure";
  if (sustained_time > 0)
    std::snprintf(sustained, sizeof sustained, "sustained %.0f tokens/s, MFU %.2f%% (warm-up step excluded)",
                  summary.sustained_tps, summary.sustained_mfu);
  say("summary: %ld steps (last step %ld)%s, final loss %.4f, %s, %ld tokens, %.1f s%s", long(summary.steps_run),
      long(summary.last_step), summary.interrupted ? ", interrupted" : "", summary.final_loss, sustained,
      long(summary.tokens), summary.seconds, summary.steps_run == 0 ? " (no step taken)" : "");
  return summary;
}

}  // namespace titan::train

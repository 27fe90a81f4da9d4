#pragma once
// Training metrics: one log line per logged step, the same record as a JSON object
// in <dump_folder>/metrics.jsonl, and TensorBoard scalars when enabled (per rank with
// metrics.save_for_all_ranks: MetricsOutputs).
//
// tps      = tokens this rank processed in the step / step seconds
// tflops   = the step's FLOPs / step seconds / 1e12, FLOPs = tokens * flops_per_token(seq) with
//            flops_per_token = 6 * active matmul params (lm_head counted) + 12 * layers * heads *
//            head_dim * seq (torchtitan's formula), less the lm_head's 6 * vocab * dim for each
//            position whose target is ignored (conversations' prompts and padding): titan drops those
//            rows before the lm_head's GEMMs, so counting them would report work never done
// mfu      = tflops / peak TFLOP/s of this device for the compute dtype
// comm     = data-parallel runs: bytes this rank sent, and seconds inside communication calls
// memory   = peak bytes held by titan's allocator during the logged step (the peak is reset at
//            the start of every step), and its share of the device's memory (on the CPU: the
//            physical memory capped by the process's cgroup limit, core/host_memory.h);
//            reserved = what the device's caching allocator holds in segments
// padding  = conversations only: the share of the step's positions that are padding (tps counts
//            them: the layers compute them)
// trained_tokens = conversations only: the step's targets (labels not ignored: the answers' tokens),
//            all ranks: the loss is the mean over these
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "titan/core/device.h"

namespace titan::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double aux_loss = -1;  // MoE only (< 0: absent)
  // Several data-parallel ranks only (< 0: absent): the largest of the ranks' own losses
  // (StepGradients::global_max_loss, train_step.h).
  double global_max_loss = -1;
  // MoE only (< 0: absent): the step's expert load (train_step.h, ExpertLoad).
  double expert_load_max = -1;
  int64_t experts_idle = -1;
  double val_loss = -1, val_perplexity = -1;  // steps that ran [validation] only (< 0: absent)
  double memory_gib = 0, memory_pct = 0;
  // What the device's caching allocator holds in segments at the end of the step, which is what
  // decides whether the next allocation fits.
  double memory_reserved_gib = 0;
  double tps = 0, tflops = 0, mfu = 0;  // mfu in percent; < 0 when the device's peak is unknown
  double step_seconds = 0;
  // Data-parallel runs only (< 0: absent): MiB this rank sent in the step's collectives, and the
  // seconds it spent inside communication calls (what compute did not hide).
  double comm_mib = -1, comm_seconds = -1;
  double padding_pct = -1;  // conversations only (< 0: absent)
  int64_t trained_tokens = -1;  // conversations only (< 0: absent): the step's targets, all ranks
  // Input tokens trained on from step 1 to this one, all ranks, across resumes (torchtitan's
  // n_tokens_seen; < 0: absent).
  int64_t tokens_seen = -1;
  std::string batch_hash;  // hex FNV-1a of the step's token ids (empty: not reported)
  bool warmup = false;  // the first step of a run (includes one-time set-up costs)
};

// Minimal TensorBoard event-file writer (tfevents records with masked CRC32C, scalar summaries).
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  bool good() const { return bool(out_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::filesystem::path path_;
  std::ofstream out_;
};

uint32_t crc32c(const void* data, size_t n);

// Where one rank's metrics go. The logging rank prints each logged step and appends its record to
// <dump_folder>/metrics.jsonl; with metrics.save_for_all_ranks every other rank appends its own
// record (its memory, throughput, step time and communication, beside the job's loss and grad norm)
// to <dump_folder>/metrics-rank<r>.jsonl, with "rank": r. TensorBoard's events go to
// <dump_folder>/<save_tb_folder>, or, with save_for_all_ranks, to a folder per rank under it,
// rank_<r> (torchtitan's layout).
struct MetricsOutputs {
  bool console = false;               // prints the step lines
  std::filesystem::path jsonl;        // empty: no records
  std::filesystem::path tensorboard;  // empty: no events
  int rank = -1;                      // >= 0: written into each record (a per-rank file)
};
MetricsOutputs metrics_outputs(const std::filesystem::path& dump_folder,
                               const std::filesystem::path& tensorboard, int rank, bool logging_rank,
                               bool all_ranks);

class MetricsLogger {
 public:
  // Before anything is built: a records file that is a folder, or a TensorBoard folder that is not
  // one, is an error naming the key (the logger opens them only after the weights).
  static void check_outputs(const MetricsOutputs& outputs);
  explicit MetricsLogger(const MetricsOutputs& outputs);
  void log(const StepMetrics& m);
  // "" while every record was written; else which file stopped taking records at which step and
  // why (a full disk, say). The run goes on: its checkpoints are what must not be lost.
  const std::string& write_failure() const { return write_failure_; }

 private:
  // Says once, when a write to `path` failed at `step`.
  void check_written(bool ok, const std::filesystem::path& path, int64_t step);

  MetricsOutputs outputs_;
  std::filesystem::path jsonl_path_;
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::string write_failure_;
};

// The trainer's measurements of each step: the step time (from begin_step), the allocator's peak
// during the step, throughput and MFU; one StepMetrics record every log_freq steps and at the first
// and last step of the run; and the sustained throughput (the first step of an invocation is a
// warm-up step with one-time costs, excluded).
class StepMeter {
 public:
  // Memory figures are the peak of `device`'s allocator during each step.
  // flops_per_token: every position's FLOPs; lm_head_flops_per_token: of those, the lm_head's, done
  // for the positions whose target counts alone.
  StepMeter(MetricsLogger& logger, int64_t log_freq, int64_t last_step, double flops_per_token,
            double lm_head_flops_per_token, double peak_tflops, Device device = Device::CPU);

  void begin_step();  // starts the clock and resets the allocator's peak
  // The data-parallel communication of the step in hand (logged with it).
  void add_communication(int64_t bytes_sent, double seconds);
  // The hash of the step's token ids (StepResult::batch_hash), logged with it in metrics.jsonl.
  void set_batch_hash(uint64_t hash) { batch_hash_ = hash; }
  // The share of the step's positions that are padding, in percent (conversations' rows).
  void set_padding_pct(double pct) { padding_pct_ = pct; }
  // The step's targets over all ranks, the tokens its loss is the mean over (conversations' rows).
  void set_trained_tokens(int64_t n) { trained_tokens_ = n; }
  // The run's input tokens from step 1 to the step in hand, all ranks (TrainState::tokens_seen).
  void set_tokens_seen(int64_t n) { tokens_seen_ = n; }
  // Several data-parallel ranks: the largest of the ranks' own losses (StepResult::global_max_loss).
  void set_global_max_loss(double loss) { global_max_loss_ = loss; }
  // MoE models: how evenly the step's tokens fell on the experts (train_step.h, ExpertLoad).
  void set_expert_load(double max_over_mean, int64_t idle) {
    expert_load_max_ = max_over_mean, experts_idle_ = idle;
  }
  // Logs the step when due. loss etc. as in StepMetrics; tokens: processed in the step by this rank;
  // targets: of those, the positions whose target counts (a mean over the ranks).
  // `held_out_loss`, when given, runs after the step's time and memory are taken (so they are the
  // training step's alone); its result is logged as val_loss, and the step is logged whatever log_freq.
  void end_step(int64_t step, double loss, double aux_loss, double grad_norm, double lr, int64_t tokens,
                double targets, const std::function<double()>& held_out_loss = {});

  // Logs the last step ended if log_freq skipped it: a run that stops before training.steps (a
  // signal) still ends its log and metrics.jsonl on the step it reached.
  void log_unlogged_step();

  double sustained_tps() const { return sustained_seconds_ > 0 ? double(sustained_tokens_) / sustained_seconds_ : 0; }
  double sustained_mfu() const;  // percent; < 0 when the device's peak is unknown
  bool measured_sustained() const { return sustained_seconds_ > 0; }

 private:
  Device device_;
  MetricsLogger& logger_;
  int64_t log_freq_, last_step_;
  double flops_per_token_, lm_head_flops_per_token_, peak_tflops_;
  int64_t device_bytes_;
  std::chrono::steady_clock::time_point step_start_;
  bool first_ = true;
  int64_t comm_bytes_ = -1;  // < 0: no communication reported for the step in hand
  uint64_t batch_hash_ = 0;  // 0: none reported
  double padding_pct_ = -1;  // < 0: none reported
  int64_t trained_tokens_ = -1;          // < 0: none reported
  int64_t tokens_seen_ = -1;             // < 0: none reported
  double global_max_loss_ = -1;          // < 0: none reported
  double expert_load_max_ = -1;          // < 0: none reported
  int64_t experts_idle_ = -1;
  std::optional<StepMetrics> unlogged_;  // the last step ended, when log_freq skipped it
  double comm_seconds_ = 0;
  double sustained_seconds_ = 0;
  int64_t sustained_tokens_ = 0;
  double sustained_flops_ = 0;
};

// Progress of a long operation (loading, saving or exporting a checkpoint): on a terminal, one line
//   "<label>: 1.23 / 4.56 GiB (27%), 3.1 s"
// rewritten in place from a background thread every 0.25 s and erased when the operation ends, so
// the caller's one-line summary ("saved ... in 5.2 s") replaces it. When stdout is not a terminal
// (a log file, a pipe, a test) it prints nothing. `done` reports the bytes handled so far and is
// called from the background thread; without it only the total and the elapsed time are shown.
class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, std::function<uint64_t()> done = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // stdout is a terminal, TITAN_PROGRESS is not "0", this rank prints, and outside an MPI
  // launcher (whose ranks' terminals may be a file) unless TITAN_PROGRESS is "1".
  static bool enabled();

 private:
  void draw(double seconds);
  std::string label_;
  uint64_t total_;
  std::function<uint64_t()> done_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Bytes of the regular files under `path` (a file or a folder, recursively); 0 if it is gone.
uint64_t bytes_under(const std::filesystem::path& path) noexcept;
// Bytes written so far into the temporary sibling of `final_path` that io::AtomicDir and
// io::AtomicFile assemble (".<name>.tmp-*"), for the progress of an atomic write.
uint64_t bytes_in_temporaries_of(const std::filesystem::path& final_path) noexcept;

}  // namespace titan::train

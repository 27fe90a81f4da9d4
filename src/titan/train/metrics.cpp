#include "titan/train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/hash.h"
#include "titan/dist/communicator.h"
#include "titan/train/log.h"

namespace titan::train {

namespace fs = std::filesystem;

uint32_t crc32c(const void* data, size_t n) {
  static uint32_t table[256] = {0};
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  uint32_t crc = 0xFFFFFFFFu;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

namespace {

uint32_t masked_crc(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol-buffer encoding of the few fields an Event with a scalar Summary needs.
void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(char(v | 0x80));
    v >>= 7;
  }
  s.push_back(char(v));
}
void put_tag(std::string& s, int field, int wire) { put_varint(s, uint64_t(field << 3 | wire)); }
void put_bytes(std::string& s, int field, const std::string& b) {
  put_tag(s, field, 2);
  put_varint(s, b.size());
  s += b;
}
void put_double(std::string& s, int field, double v) {
  put_tag(s, field, 1);
  s.append(reinterpret_cast<const char*>(&v), 8);
}
void put_float(std::string& s, int field, float v) {
  put_tag(s, field, 5);
  s.append(reinterpret_cast<const char*>(&v), 4);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  fs::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir / ("events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." + host);
  out_.open(path_, std::ios::binary);
  TITAN_CHECK(out_, "tensorboard: cannot create '", path_.string(), "'");
  std::string event;  // Event { wall_time = 1; file_version = 3 }
  put_double(event, 1, now_seconds());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& data) {
  uint64_t len = data.size();
  uint32_t len_crc = masked_crc(&len, 8), data_crc = masked_crc(data.data(), data.size());
  out_.write(reinterpret_cast<const char*>(&len), 8);
  out_.write(reinterpret_cast<const char*>(&len_crc), 4);
  out_.write(data.data(), std::streamsize(data.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v, summary, event;  // Summary.Value { tag = 1; simple_value = 2 }
  put_bytes(v, 1, tag);
  put_float(v, 2, float(value));
  put_bytes(summary, 1, v);  // Summary { repeated Value value = 1 }
  put_double(event, 1, now_seconds());
  put_tag(event, 2, 0);  // Event.step
  put_varint(event, uint64_t(step));
  put_bytes(event, 5, summary);  // Event.summary
  write_record(event);
}

void TensorBoardWriter::flush() { out_.flush(); }

bool Progress::enabled() {
  const char* env = std::getenv("TITAN_PROGRESS");
  if (env && std::strcmp(env, "0") == 0) return false;
  // Only the rank that prints draws. Under an MPI launcher a rank's stdout is a terminal of the
  // launcher's (Open MPI forwards through a pty) even when the job's output goes to a file, where
  // the line's rewrites would land: there it draws only when TITAN_PROGRESS=1 asks for it.
  if (dist::started_by_launcher() && !(env && std::strcmp(env, "1") == 0)) return false;
  return console_output() && isatty(fileno(stdout)) == 1;
}

Progress::Progress(std::string label, uint64_t total_bytes, std::function<uint64_t()> done)
    : label_(std::move(label)), total_(total_bytes), done_(std::move(done)) {
  if (!enabled()) return;
  thread_ = std::thread([this] {
    const auto t0 = std::chrono::steady_clock::now();
    // Short operations finish before the first line is drawn and leave no trace.
    for (int tick = 1; !stop_.load(); ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (tick % 5 == 0) draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  });
}

void Progress::draw(double seconds) {
  const double gib = double(1ull << 30);
  char line[256];
  if (done_) {
    uint64_t d = std::min(done_(), total_);
    std::snprintf(line, sizeof line, "%s: %.2f / %.2f GiB (%.0f%%), %.1f s", label_.c_str(), double(d) / gib,
                  double(total_) / gib, total_ ? 100.0 * double(d) / double(total_) : 100.0, seconds);
  } else {
    std::snprintf(line, sizeof line, "%s (%.2f GiB)... %.1f s", label_.c_str(), double(total_) / gib, seconds);
  }
  console_write(std::string(kConsoleEraseLine) + line);
}

Progress::~Progress() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
  console_write(kConsoleEraseLine);
}

uint64_t bytes_under(const fs::path& path) noexcept {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

uint64_t bytes_in_temporaries_of(const fs::path& final_path) noexcept {
  std::error_code ec;
  fs::path parent = final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  std::string prefix = final_path.filename().string();
  prefix.insert(prefix.begin(), '.');
  prefix += ".tmp-";
  uint64_t total = 0;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) total += bytes_under(it->path());
  return total;
}

StepMeter::StepMeter(MetricsLogger& logger, int64_t log_freq, int64_t last_step, double flops_per_token,
                     double lm_head_flops_per_token, double peak_tflops, Device device)
    : device_(device),
      logger_(logger),
      log_freq_(log_freq),
      last_step_(last_step),
      flops_per_token_(flops_per_token),
      lm_head_flops_per_token_(lm_head_flops_per_token),
      peak_tflops_(peak_tflops),
      device_bytes_(device_services(device).capacity_bytes()) {}

void StepMeter::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  device_services(device_).reset_peak();
  comm_bytes_ = -1;
  comm_seconds_ = 0;
  batch_hash_ = 0;
  padding_pct_ = -1;
  trained_tokens_ = -1;
  tokens_seen_ = -1;
  global_max_loss_ = -1;
  expert_load_max_ = -1;
  experts_idle_ = -1;
}

void StepMeter::add_communication(int64_t bytes_sent, double seconds) {
  comm_bytes_ = std::max<int64_t>(comm_bytes_, 0) + bytes_sent;
  comm_seconds_ += seconds;
}

void StepMeter::end_step(int64_t step, double loss, double aux_loss, double grad_norm, double lr,
                         int64_t tokens, double targets, const std::function<double()>& held_out_loss) {
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  const double flops =
      double(tokens) * flops_per_token_ - (double(tokens) - targets) * lm_head_flops_per_token_;
  DeviceServices& services = device_services(device_);
  const MemoryStats memory = services.stats();
  const int64_t peak = memory.peak_bytes;
  if (!first_) {
    sustained_seconds_ += dt;
    sustained_tokens_ += tokens;
    sustained_flops_ += flops;
  }
  const double val_loss = held_out_loss ? held_out_loss() : -1;
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.aux_loss = aux_loss;
  m.global_max_loss = global_max_loss_;
  m.expert_load_max = expert_load_max_;
  m.experts_idle = experts_idle_;
  m.grad_norm = grad_norm;
  m.lr = lr;
  m.memory_gib = double(peak) / double(1ll << 30);
  m.memory_pct = device_bytes_ ? 100.0 * double(peak) / double(device_bytes_) : 0.0;
  m.memory_reserved_gib = double(memory.reserved_bytes) / double(1ll << 30);
  m.tps = double(tokens) / dt;
  m.tflops = flops / dt / 1e12;
  m.mfu = peak_tflops_ > 0 ? 100.0 * m.tflops / peak_tflops_ : -1;
  m.step_seconds = dt;
  m.padding_pct = padding_pct_;
  m.trained_tokens = trained_tokens_;
  m.tokens_seen = tokens_seen_;
  m.warmup = first_;
  if (val_loss >= 0) m.val_loss = val_loss, m.val_perplexity = std::exp(val_loss);
  if (batch_hash_) m.batch_hash = hash_hex(batch_hash_);
  if (comm_bytes_ >= 0) m.comm_mib = double(comm_bytes_) / 1048576.0, m.comm_seconds = comm_seconds_;
  if (step % log_freq_ == 0 || first_ || step == last_step_ || val_loss >= 0) {
    logger_.log(m);
    unlogged_.reset();
  } else {
    unlogged_ = std::move(m);
  }
  first_ = false;
}

void StepMeter::log_unlogged_step() {
  if (unlogged_) logger_.log(*unlogged_);
  unlogged_.reset();
}

double StepMeter::sustained_mfu() const {
  if (peak_tflops_ <= 0 || sustained_seconds_ <= 0) return -1;
  return 100.0 * sustained_flops_ / sustained_seconds_ / 1e12 / peak_tflops_;
}

MetricsOutputs metrics_outputs(const fs::path& dump, const fs::path& tensorboard, int rank, bool logging_rank,
                               bool all_ranks) {
  MetricsOutputs o;
  o.console = logging_rank;
  if (logging_rank) {
    o.jsonl = dump / "metrics.jsonl";
  } else if (all_ranks) {
    o.jsonl = dump / ("metrics-rank" + std::to_string(rank) + ".jsonl");
    o.rank = rank;
  }
  if (!tensorboard.empty() && (logging_rank || all_ranks))
    o.tensorboard = all_ranks ? tensorboard / ("rank_" + std::to_string(rank)) : tensorboard;
  return o;
}

void MetricsLogger::check_outputs(const MetricsOutputs& o) {
  std::error_code ec;
  const fs::file_type jsonl = fs::status(o.jsonl, ec).type();
  TITAN_CHECK(o.jsonl.empty() || jsonl != fs::file_type::directory, "job.dump_folder: '", o.jsonl.string(),
              "' is a folder: the run appends its metrics to a file of that name");
  const fs::file_type tb = fs::status(o.tensorboard, ec).type();
  TITAN_CHECK(
      o.tensorboard.empty() || tb == fs::file_type::not_found || tb == fs::file_type::directory,
      "metrics.enable_tensorboard: '", o.tensorboard.string(),
      "' is not a folder: the TensorBoard events go there (move it, set metrics.save_tb_folder, or set "
      "enable_tensorboard = false)");
}

namespace {

// The console's line of a logged step.
void print_step(const StepMetrics& m) {
  char mfu[32] = "n/a";  // no peak known for the device (start-up said so)
  if (m.mfu >= 0) std::snprintf(mfu, sizeof mfu, "%.2f%%", m.mfu);
  char line[512];
  std::snprintf(
      line, sizeof line,
      "step: %ld  loss: %.4f  grad_norm: %.4f  lr: %.3e  memory: %.2fGiB(%.2f%%)  tps: %.0f  tflops: %.3f  "
      "mfu: %s%s",
      long(m.step), m.loss, m.grad_norm, m.lr, m.memory_gib, m.memory_pct, m.tps, m.tflops, mfu,
      m.warmup ? "  (warm-up)" : "");
  char reserved[48];
  std::snprintf(reserved, sizeof reserved, "  reserved: %.2fGiB", m.memory_reserved_gib);
  char comm[96] = "";
  if (m.comm_mib >= 0) std::snprintf(comm, sizeof comm, "  comm: %.1fMiB in %.3fs", m.comm_mib, m.comm_seconds);
  char padding[32] = "";
  if (m.padding_pct >= 0) std::snprintf(padding, sizeof padding, "  padding: %.1f%%", m.padding_pct);
  char trained[48] = "";
  if (m.trained_tokens >= 0)
    std::snprintf(trained, sizeof trained, "  trained_tokens: %lld",
                  static_cast<long long>(m.trained_tokens));
  char experts[80] = "";
  if (m.expert_load_max >= 0)
    std::snprintf(experts, sizeof experts, "  expert_load: %.2f  experts_idle: %lld", m.expert_load_max,
                  static_cast<long long>(m.experts_idle));
  std::string text = std::string(line) + reserved + comm + padding + trained +
                     (m.aux_loss >= 0 ? "  aux_loss: " + std::to_string(m.aux_loss) : "") + experts + "\n";
  if (m.val_loss >= 0) {
    char validation[128];
    std::snprintf(validation, sizeof validation, "validate step: %ld  loss: %.4f  perplexity: %.2f\n",
                  long(m.step), m.val_loss, m.val_perplexity);
    text += validation;
  }
  console_write(text);
}

// Its metrics.jsonl record; `rank` >= 0 adds the rank (a per-rank file's records).
nlohmann::ordered_json step_record(const StepMetrics& m, int rank) {
  nlohmann::ordered_json j = {{"step", m.step},
                              {"loss", m.loss},
                              {"grad_norm", m.grad_norm},
                              {"lr", m.lr},
                              {"memory_gib", m.memory_gib},
                              {"memory_pct", m.memory_pct},
                              {"tps", m.tps},
                              {"tflops", m.tflops},
                              {"step_seconds", m.step_seconds},
                              {"warmup", m.warmup}};
  if (m.mfu >= 0) j["mfu"] = m.mfu;
  if (m.tokens_seen >= 0) j["tokens_seen"] = m.tokens_seen;
  if (m.global_max_loss >= 0) j["global_max_loss"] = m.global_max_loss;
  if (m.aux_loss >= 0) j["aux_loss"] = m.aux_loss;
  if (m.expert_load_max >= 0) {
    j["expert_load_max"] = m.expert_load_max;
    j["experts_idle"] = m.experts_idle;
  }
  if (m.padding_pct >= 0) j["padding_pct"] = m.padding_pct;
  if (m.trained_tokens >= 0) j["trained_tokens"] = m.trained_tokens;
  j["memory_reserved_gib"] = m.memory_reserved_gib;
  if (!m.batch_hash.empty()) j["batch_hash"] = m.batch_hash;
  if (m.comm_mib >= 0) {
    j["comm_mib"] = m.comm_mib;
    j["comm_seconds"] = m.comm_seconds;
  }
  if (m.val_loss >= 0) {
    j["val_loss"] = m.val_loss;
    j["val_perplexity"] = m.val_perplexity;
  }
  if (rank >= 0) j["rank"] = rank;
  return j;
}

}  // namespace

namespace {

// The step of a record cut short, when its text got past the whole number after "step": (titan
// writes it first; records of titans before 2026-12-07 have it after "loss", "lr", "memory_gib" ...,
// in sorted order); -1 when it did not (best effort: the text is what a crash left).
int64_t step_of_torn_record(const std::string& torn) {
  const std::string key = "\"step\":";
  const size_t at = torn.find(key);
  if (at == std::string::npos) return -1;
  size_t i = torn.find_first_not_of(" \t", at + key.size());
  const size_t digits = i;
  int64_t step = 0;
  for (; i < torn.size() && i - digits < 18 && torn[i] >= '0' && torn[i] <= '9'; ++i)
    step = step * 10 + (torn[i] - '0');
  // A number cut short ("20" torn to "2") would name the wrong step: only one that ends is read.
  if (i == digits || i == torn.size() || (torn[i] != ',' && torn[i] != '}' && torn[i] != ' ')) return -1;
  return step;
}

// A record cut short (a full disk, a power loss) leaves the file without its last newline; the
// resumed run would append its next record to the torn one, and that line, neither record, would
// stop every later reader. The torn tail goes, said: the resume logs the steps after its checkpoint
// again, but not a step at or before it (the checkpointed step's own record, torn by a crash right
// after the save), whose record is then lost.
// `rank`: whose file it is (< 0: the job's), named when that rank does not print the run's lines.
void drop_torn_record(const fs::path& path, int rank) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  // The length to keep: through the last newline, found block by block from the end.
  uintmax_t keep = 0;
  char block[4096];
  for (uintmax_t end = size; end > 0 && keep == 0;) {
    const uintmax_t begin = end > sizeof block ? end - sizeof block : 0;
    in.seekg(std::streamoff(begin));
    in.read(block, std::streamsize(end - begin));
    TITAN_CHECK(in, "metrics: cannot read '", path.string(), "'");
    for (uintmax_t i = end - begin; i-- > 0 && keep == 0;)
      if (block[i] == '\n') keep = begin + i + 1;
    end = begin;
  }
  if (keep == size) return;
  // Its step is near the start of the record; a tail without a newline in megabytes is no record.
  std::string torn(size_t(std::min<uintmax_t>(size - keep, 64 * 1024)), '\0');
  in.clear();
  in.seekg(std::streamoff(keep));
  in.read(torn.data(), std::streamsize(torn.size()));
  torn.resize(size_t(std::max<std::streamsize>(in.gcount(), 0)));
  fs::resize_file(path, keep, ec);
  TITAN_CHECK(!ec, "metrics: cannot drop the record cut short at the end of '", path.string(),
              "': ", ec.message());
  const int64_t step = step_of_torn_record(torn);
  const std::string s = std::to_string(step);
  const std::string warning = formatted(
      "warning: metrics: '%s' ended in a record cut short (%s; a run stopped while writing it): dropped. "
      "A resume logs the steps after its checkpoint again, not those at or before it: %s",
      path.string().c_str(), step >= 0 ? ("step " + s).c_str() : "its step unreadable",
      step >= 0 ? ("if the checkpoint is step " + s + " or later, step " + s + " has no record").c_str()
                : "if the torn step is one of those, it has no record");
  // The logging rank says it among the run's lines; another rank's own file
  // (metrics.save_for_all_ranks) on that rank's standard error, which its launcher passes on.
  if (rank < 0 || console_output())
    say("%s", warning.c_str());
  else
    std::fprintf(stderr, "rank %d: %s\n", rank, warning.c_str());
}

}  // namespace

MetricsLogger::MetricsLogger(const MetricsOutputs& outputs) : outputs_(outputs), jsonl_path_(outputs.jsonl) {
  if (!jsonl_path_.empty()) {
    fs::create_directories(jsonl_path_.parent_path());
    drop_torn_record(jsonl_path_, outputs_.rank);
    errno = 0;
    jsonl_.open(jsonl_path_, std::ios::app);
    TITAN_CHECK(jsonl_, "metrics: cannot open '", jsonl_path_.string(),
                "': ", errno ? std::strerror(errno) : "?");
  }
  if (!outputs_.tensorboard.empty()) tb_ = std::make_unique<TensorBoardWriter>(outputs_.tensorboard);
}

void MetricsLogger::log(const StepMetrics& m) {
  if (outputs_.console) print_step(m);
  if (jsonl_path_.empty() && !tb_) return;
  const nlohmann::ordered_json j = step_record(m, outputs_.rank);
  if (!jsonl_path_.empty()) {
    jsonl_ << j.dump() << "\n";
    jsonl_.flush();
    check_written(bool(jsonl_), jsonl_path_, m.step);
  }
  if (tb_) {
    for (auto& [k, v] : j.items())
      if (v.is_number() && k != "rank") tb_->scalar(k, v.get<double>(), m.step);
    tb_->flush();
    check_written(tb_->good(), tb_->path(), m.step);
  }
}

void MetricsLogger::check_written(bool ok, const fs::path& path, int64_t step) {
  if (ok || !write_failure_.empty()) return;
  const int error = errno;  // what the failed write left (ENOSPC on a full disk)
  write_failure_ = "writing '" + path.string() + "' failed at step " + std::to_string(step) + " (" +
                   std::strerror(error) + "): it holds no record from that step on";
  say("warning: metrics: %s; training goes on", write_failure_.c_str());
}

}  // namespace titan::train

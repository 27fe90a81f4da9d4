// The MFU peak is a figure of the machine: two probes give the same one, the clock says where it
// comes from, TITAN_CPU_GHZ and metrics.peak_tflops override it.
#include "titan/train/mfu_peak.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tiny_job.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/train/job_config.h"
#include "titan/train/metrics.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;
namespace tt = titan::testing;

namespace {

// Sets an environment variable for the scope (restoring the previous value).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace

TEST(MfuPeak, TwoProbesGiveTheIdenticalFigure) {
  ScopedEnv cache("XDG_CACHE_HOME", tt::temp_dir("mfu_peak_probe").c_str());
  ScopedEnv ghz("TITAN_CPU_GHZ", nullptr);
  const cpu::CpuInfo a = cpu::probe_cpu(), b = cpu::probe_cpu();
  EXPECT_GT(a.ghz, 0.2);
  EXPECT_LT(a.ghz, 10.0);
  EXPECT_FALSE(a.ghz_source.empty());
  for (DType dt : {DType::F32, DType::BF16}) {
    EXPECT_EQ(a.peak_flops(dt), b.peak_flops(dt)) << dtype_name(dt);  // bit-identical, not close
    EXPECT_EQ(a.peak_formula(dt), b.peak_formula(dt));
    EXPECT_NE(a.peak_formula(dt).find(a.ghz_source), std::string::npos) << a.peak_formula(dt);
  }
}

TEST(MfuPeak, AMeasuredClockIsRecordedAndReadBack) {
  fs::path cache = tt::temp_dir("mfu_peak_record");
  ScopedEnv env_cache("XDG_CACHE_HOME", cache.c_str());
  ScopedEnv ghz("TITAN_CPU_GHZ", nullptr);
  const cpu::CpuInfo first = cpu::probe_cpu();
  if (first.ghz_source.rfind("measured", 0) != 0)
    GTEST_SKIP() << "this machine has a rated clock (" << first.ghz_source << "): nothing is measured";
  // The record names its file in the source; rewrite it with another clock: the next probe must
  // take that figure instead of measuring again.
  fs::path record;
  for (auto& e : fs::directory_iterator(cache / "titan")) record = e.path();
  ASSERT_FALSE(record.empty());
  EXPECT_NE(first.ghz_source.find(record.string()), std::string::npos) << first.ghz_source;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(record));
  EXPECT_EQ(j.at("ghz").get<double>(), first.ghz);
  j["ghz"] = 1.234;
  std::ofstream(record) << j.dump();
  const cpu::CpuInfo second = cpu::probe_cpu();
  EXPECT_EQ(second.ghz, 1.234);
  EXPECT_EQ(second.peak_flops(DType::F32), second.cores * 1.234e9 * second.f32_flops_per_cycle);
  // A record of another CPU is not used.
  j["cpu"] = "GenuineIntel / some other CPU / family 0x6 model 0x8f";
  std::ofstream(record) << j.dump();
  EXPECT_NE(cpu::probe_cpu().ghz, 1.234);
}

TEST(MfuPeak, TitanCpuGhzOverridesTheClock) {
  ScopedEnv ghz("TITAN_CPU_GHZ", "2.5");
  const cpu::CpuInfo info = cpu::probe_cpu();
  EXPECT_EQ(info.ghz, 2.5);
  EXPECT_EQ(info.ghz_source, "TITAN_CPU_GHZ");
  EXPECT_EQ(info.peak_flops(DType::BF16), info.cores * 2.5e9 * info.bf16_flops_per_cycle);
}

TEST(MfuPeak, MetricsPeakTflopsWins) {
  const train::MfuPeak set = train::mfu_peak(1.25, Device::CPU, DType::BF16);
  EXPECT_EQ(set.tflops, 1.25);
  EXPECT_EQ(set.source, "metrics.peak_tflops");
  const train::MfuPeak detected = train::mfu_peak(0, Device::CPU, DType::BF16);
  EXPECT_EQ(detected.tflops, cpu::cpu_info().peak_flops(DType::BF16) / 1e12);
  EXPECT_EQ(detected.source, cpu::cpu_info().peak_formula(DType::BF16));

  // End to end: the MFU a run logs is its TFLOP/s over the configured peak.
  fs::path dump = tt::temp_dir("mfu_peak_train");
  auto cfg = train::load_job_config(tt::debugmodel_toml().string(),
                                    tt::tiny_job(dump, {{"training.steps", "2"}, {"metrics.peak_tflops", "0.002"}}));
  train::run_training(cfg);
  std::ifstream f(dump / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(f, line);) {
    auto r = nlohmann::json::parse(line);
    if (!r.contains("mfu")) continue;
    ++records;
    EXPECT_NEAR(r["mfu"].get<double>(), 100.0 * r["tflops"].get<double>() / 0.002, 1e-9 * r["mfu"].get<double>());
  }
  EXPECT_EQ(records, 2);
}

// A device whose peak is unknown (a GPU the datasheet table lacks, no metrics.peak_tflops) logs no
// MFU: the step line says n/a, the records hold no "mfu", the sustained figure is negative (the
// summary's "MFU n/a"); nothing is divided by zero.
TEST(MfuPeak, AnUnknownPeakLogsNoMfu) {
  const fs::path dump = tt::temp_dir("mfu_peak_unknown");
  train::MetricsOutputs outputs;
  outputs.console = true;
  outputs.jsonl = dump / "metrics.jsonl";
  train::MetricsLogger logger(outputs);
  train::StepMeter meter(logger, /*log_freq=*/1, /*last_step=*/2, /*flops_per_token=*/1e9,
                         /*lm_head_flops_per_token=*/1e8, /*peak_tflops=*/0);
  ::testing::internal::CaptureStdout();
  for (int64_t step = 1; step <= 2; ++step) {
    meter.begin_step();
    meter.end_step(step, 2.5, -1, 1.0, 1e-3, 1000, 1000);
  }
  const std::string console = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(console.find("tflops: "), std::string::npos) << console;
  EXPECT_NE(console.find("mfu: n/a"), std::string::npos) << console;
  EXPECT_EQ(console.find("inf"), std::string::npos) << console;
  std::ifstream f(outputs.jsonl);
  int records = 0;
  for (std::string line; std::getline(f, line); ++records) {
    const auto r = nlohmann::json::parse(line);
    EXPECT_TRUE(r.contains("tflops")) << line;
    EXPECT_FALSE(r.contains("mfu")) << line;
  }
  EXPECT_EQ(records, 2);
  EXPECT_TRUE(meter.measured_sustained());
  EXPECT_LT(meter.sustained_mfu(), 0);
}

// The FLOPs behind tflops and MFU are the work done: a position whose target is ignored (a
// conversation's prompt, padding) skips the lm_head, whose rows linear_cross_entropy drops before
// its GEMMs, so such a step's FLOPs lack 6 x vocab x dim for each of them; the sustained MFU sums
// the same FLOPs.
TEST(MfuPeak, IgnoredTargetsAreNotCountedAsLmHeadWork) {
  const fs::path dump = tt::temp_dir("mfu_ignored_targets");
  train::MetricsOutputs outputs;
  outputs.jsonl = dump / "metrics.jsonl";
  train::MetricsLogger logger(outputs);
  const double per_token = 1e9, lm_head = 6e8, peak = 1.0;
  train::StepMeter meter(logger, /*log_freq=*/1, /*last_step=*/3, per_token, lm_head, peak);
  const std::vector<double> targets = {1000, 1000, 250};  // of 1000 tokens each step
  for (int64_t step = 1; step <= 3; ++step) {
    meter.begin_step();
    meter.end_step(step, 2.5, -1, 1.0, 1e-3, 1000, targets[size_t(step - 1)]);
  }
  std::ifstream f(outputs.jsonl);
  double sustained_flops = 0, sustained_seconds = 0;
  int records = 0;
  for (std::string line; std::getline(f, line); ++records) {
    const auto r = nlohmann::json::parse(line);
    const double seconds = r["step_seconds"].get<double>(), target_count = targets[size_t(records)];
    const double want = 1000 * per_token - (1000 - target_count) * lm_head;
    EXPECT_NEAR(r["tflops"].get<double>() * 1e12 * seconds, want, want * 1e-9) << line;
    EXPECT_NEAR(r["mfu"].get<double>(), 100.0 * r["tflops"].get<double>() / peak, 1e-9) << line;
    if (records > 0) sustained_flops += want, sustained_seconds += seconds;  // the first step warms up
  }
  ASSERT_EQ(records, 3);
  EXPECT_NEAR(meter.sustained_mfu(), 100.0 * sustained_flops / sustained_seconds / 1e12 / peak,
              meter.sustained_mfu() * 1e-6);
}

#pragma once
// [profiling]: where chosen steps spend their time, op by op (core/op_timeline.h), as torchtitan's
// profiler does with PyTorch's. Every profile_freq steps the last profiler_active steps of the
// cycle are timed; at the cycle's end each rank writes a Chrome trace (chrome://tracing, Perfetto)
// to <dump_folder>/<save_traces_folder>/iteration_<step>/rank<r>_trace.json, torchtitan's layout,
// and the logging rank prints a table: per op, its calls and its forward and backward seconds.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/core/op_timeline.h"

namespace titan::train {

struct ProfilingSection;

// One row of the table: an op's spans summed over the profiled steps (backward nodes of an op and
// its forward calls share a row; phases and other nodes have rows of their own).
struct ProfileRow {
  std::string name;
  profiling::SpanKind kind = profiling::SpanKind::Forward;  // Phase for trainer phases, else Forward
  int64_t calls = 0;                                        // forward calls (phases: occurrences)
  double forward_seconds = 0, backward_seconds = 0;
  double seconds() const { return forward_seconds + backward_seconds; }
};

// The table's rows, most time first. Node names keep what precedes ':' ("recompute:layers.3" and
// "hook:layers.0.done" count as "recompute" and "hook"); the module is in the trace only.
std::vector<ProfileRow> profile_rows(const std::vector<profiling::Span>& spans);
// The table as log lines, with the total and each row's share of it.
std::vector<std::string> profile_table(const std::vector<ProfileRow>& rows, double total_seconds);
// The spans as a Chrome trace: one complete event per span on the rank's process, the device's
// allocated memory as a counter, and one event per profiled step: from its "step" phase mark to its
// "between steps" mark, numbered from first_step.
std::string chrome_trace(const std::vector<profiling::Span>& spans, int rank, const std::string& device,
                         int64_t first_step);

// The spans of a trace chrome_trace wrote (what `titan report` tables); errors name `where`.
std::vector<profiling::Span> spans_of_chrome_trace(const std::string& json_text, const std::string& where);

class StepProfiler {
 public:
  StepProfiler(const ProfilingSection& config, const std::filesystem::path& dump_folder, int rank, Device device);
  ~StepProfiler();

  bool enabled() const { return enabled_; }
  // Around each training step: begin_step starts the timeline at the first step of an active window
  // and marks the step; step_ran marks what follows the step's update (logging, validation,
  // checkpoints: the "between steps" phase); end_step, after the window's last step, writes the
  // trace and logs the table.
  void begin_step(int64_t step);
  void step_ran();
  void end_step(int64_t step);
  // After the last step: a window the run ended inside (training.steps, a signal) is dropped,
  // saying so.
  void end_run(int64_t step);
  // The trace written by the latest window ("" before the first).

 private:
  bool active(int64_t step) const;  // in a cycle's last profiler_active steps
  bool window_end(int64_t step) const { return step % freq_ == 0; }

  bool enabled_;
  int64_t freq_, active_;
  std::filesystem::path folder_;
  int rank_;
  Device device_;
  std::unique_ptr<profiling::Timeline> timeline_;
  int64_t first_step_ = 0;
  std::filesystem::path last_trace_;
};

}  // namespace titan::train

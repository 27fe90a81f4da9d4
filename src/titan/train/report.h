#pragma once
// `titan report RUN_DIR [RUN_DIR ...]`: one self-contained HTML page (inline SVG and CSS, no
// scripts, nothing fetched) with the curves of one or more runs overlaid: loss (and val_loss
// when a run logs it), grad norm, learning rate, tokens/s, MFU and memory per step, each run's
// warm-up steps marked; then per run its summary figures (from its records), the records a later
// trajectory replaced, its config in effect and versions (from run_info.json), and where its newest
// profiled steps spent their time ([profiling], rank 0's trace).
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "titan/train/profiler.h"

namespace titan::train {

struct RunRecord {
  std::filesystem::path dir;
  std::string name;                                   // the folder's name (made unique by the caller)
  std::map<std::string, std::map<long, double>> series;  // metric -> step -> value (the newest trajectory's)
  std::vector<long> warmup_steps;                     // steps logged with "warmup": true
  std::vector<long> steps;                            // every step of the newest trajectory, in order
  // metric -> steps whose value titan train logged as null (not finite: a NaN or infinite loss),
  // which no chart can draw: the page names them instead.
  std::map<std::string, std::vector<long>> not_finite;
  // Each time a step was logged again (a resume re-logging the steps after its checkpoint, a
  // roll-back to checkpoint.load_step): the records it replaced, of steps first..last, and the step
  // the new trajectory started at.
  struct Relog {
    long from, first, last;
    size_t records;
  };
  std::vector<Relog> relogs;
  std::string description, config_in_effect, device, ranks;
  std::vector<std::string> config_notes;
  std::map<std::string, std::string> versions;
  // The rows of `titan check --json RUN_DIR/check.json` when the run folder holds one.
  struct CheckRow {
    std::string check, status, value, rule;
  };
  std::vector<CheckRow> check_rows;
  // [profiling]: the newest rank-0 trace of the run (empty when it profiled nothing) and its table.
  std::filesystem::path profile_trace;
  std::vector<ProfileRow> profile;
  double profile_seconds = 0;
};

// The run folder that `given` names: itself, or, given a metrics.jsonl, the folder holding it. A
// path that does not exist, or a file of another name, is an error.
std::filesystem::path run_folder(const std::filesystem::path& given);

// Reads RUN_DIR/metrics.jsonl (required), RUN_DIR/run_info.json and RUN_DIR/check.json (when
// present), and the newest iteration_<step>/rank0_trace.json under the run's
// profiling.save_traces_folder (from run_info.json's config in effect); `dir` as run_folder reads
// it. Errors name the file (quoted: 'path') and line.
RunRecord read_run(const std::filesystem::path& dir);

// The metrics every page charts, in page order: {metrics.jsonl field, chart title}.
const std::vector<std::pair<std::string, std::string>>& report_charts();
// The MoE metrics, charted after those when some run logs them (a dense run has none).
const std::vector<std::pair<std::string, std::string>>& report_moe_charts();
// The colour of run i (#rrggbb), as drawn in the charts and the legend.
std::string run_colour(size_t i);

std::string render_report(const std::vector<RunRecord>& runs);
// Reads every run and writes the page atomically to `out`.
void write_report(const std::vector<std::filesystem::path>& run_dirs, const std::filesystem::path& out);

}  // namespace titan::train

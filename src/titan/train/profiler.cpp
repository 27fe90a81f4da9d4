#include "titan/train/profiler.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/io/atomic_file.h"
#include "titan/train/job_config.h"
#include "titan/train/log.h"

namespace titan::train {

using profiling::Span;
using profiling::SpanKind;

namespace {

std::string row_name(const Span& s) {
  if (s.kind == SpanKind::Phase) return s.name;
  return s.name.substr(0, s.name.find(':'));
}

}  // namespace

std::vector<ProfileRow> profile_rows(const std::vector<Span>& spans) {
  std::map<std::pair<std::string, bool>, ProfileRow> by_name;  // (name, is phase)
  for (const Span& s : spans) {
    const bool phase = s.kind == SpanKind::Phase;
    ProfileRow& r = by_name[{row_name(s), phase}];
    r.name = row_name(s);
    r.kind = phase ? SpanKind::Phase : SpanKind::Forward;
    if (s.kind == SpanKind::Backward) {
      r.backward_seconds += s.seconds;
    } else {
      r.forward_seconds += s.seconds;
      ++r.calls;
    }
  }
  std::vector<ProfileRow> rows;
  for (auto& [key, r] : by_name) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) { return a.seconds() > b.seconds(); });
  return rows;
}

std::vector<std::string> profile_table(const std::vector<ProfileRow>& rows, double total) {
  std::vector<std::string> lines;
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-28s %7s %11s %11s %11s %7s", "op (or phase)", "calls", "forward s", "backward s",
                "total s", "share");
  lines.push_back(buf);
  for (const ProfileRow& r : rows) {
    const std::string name = r.kind == SpanKind::Phase ? "[" + r.name + "]" : r.name;
    std::snprintf(buf, sizeof buf, "  %-28s %7lld %11.6f %11.6f %11.6f %6.2f%%", name.c_str(), (long long)r.calls,
                  r.forward_seconds, r.backward_seconds, r.seconds(), total > 0 ? 100.0 * r.seconds() / total : 0.0);
    lines.push_back(buf);
  }
  std::snprintf(buf, sizeof buf, "  %-28s %7s %11s %11s %11.6f %6.2f%%", "total", "", "", "", total, 100.0);
  lines.push_back(buf);
  return lines;
}

std::string chrome_trace(const std::vector<Span>& spans, int rank, const std::string& device, int64_t first_step) {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank) + " (" + device + ")"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "steps"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 1}, {"args", {{"name", "ops"}}}});
  auto us = [](double seconds) { return seconds * 1e6; };
  const double end = spans.empty() ? 0 : spans.back().start + spans.back().seconds;
  // The steps: each from its "step" mark to its "between steps" mark (what follows is not the step's).
  int64_t step = first_step;
  double step_start = -1;
  for (const Span& s : spans) {
    if (s.kind != SpanKind::Phase) continue;
    if (s.name == "step") step_start = s.start;
    if (s.name == "between steps" && step_start >= 0) {
      events.push_back({{"name", "step " + std::to_string(step++)}, {"cat", "step"}, {"ph", "X"}, {"pid", rank},
                        {"tid", 0}, {"ts", us(step_start)}, {"dur", us(s.start - step_start)}});
      step_start = -1;
    }
  }
  if (step_start >= 0)  // a timeline cut short inside a step
    events.push_back({{"name", "step " + std::to_string(step)}, {"cat", "step"}, {"ph", "X"}, {"pid", rank},
                      {"tid", 0}, {"ts", us(step_start)}, {"dur", us(end - step_start)}});
  for (const Span& s : spans) {
    const char* cat = s.kind == SpanKind::Forward ? "forward" : s.kind == SpanKind::Backward ? "backward" : "phase";
    json e = {{"name", s.kind == SpanKind::Backward ? s.name + " (backward)" : s.name},
              {"cat", cat},
              {"ph", "X"},
              {"pid", rank},
              {"tid", 1},
              {"ts", us(s.start)},
              {"dur", us(s.seconds)}};
    if (!s.module.empty()) e["args"] = {{"module", s.module}};
    events.push_back(std::move(e));
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"pid", rank}, {"ts", us(s.start)},
                      {"args", {{"allocated GiB", double(s.memory_bytes) / double(int64_t(1) << 30)}}}});
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

std::vector<Span> spans_of_chrome_trace(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TITAN_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), where,
              ": not a Chrome trace (no \"traceEvents\" array)");
  std::vector<Span> spans;
  for (const auto& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat != "forward" && cat != "backward" && cat != "phase") continue;  // steps are not spans
    Span s;
    s.kind = cat == "forward" ? SpanKind::Forward : cat == "backward" ? SpanKind::Backward : SpanKind::Phase;
    s.name = e.value("name", "");
    constexpr std::string_view kBackward = " (backward)";
    if (s.kind == SpanKind::Backward && s.name.size() > kBackward.size() &&
        s.name.compare(s.name.size() - kBackward.size(), kBackward.size(), kBackward) == 0)
      s.name.resize(s.name.size() - kBackward.size());
    TITAN_CHECK(e.contains("ts") && e["ts"].is_number() && e.contains("dur") && e["dur"].is_number(), where,
                ": event '", s.name, "' has no numeric ts and dur");
    s.start = e["ts"].get<double>() * 1e-6;
    s.seconds = e["dur"].get<double>() * 1e-6;
    if (e.contains("args") && e["args"].is_object()) s.module = e["args"].value("module", "");
    spans.push_back(std::move(s));
  }
  return spans;
}

StepProfiler::StepProfiler(const ProfilingSection& config, const std::filesystem::path& dump_folder, int rank,
                           Device device)
    : enabled_(config.enable_profiling),
      freq_(config.profile_freq),
      active_(config.profiler_active),
      folder_(dump_folder / config.save_traces_folder),
      rank_(rank),
      device_(device) {}

StepProfiler::~StepProfiler() = default;

void StepProfiler::end_run(int64_t step) {
  if (!timeline_) return;
  timeline_.reset();
  const int64_t window_end = ((first_step_ - 1) / freq_ + 1) * freq_;
  say("profiling: the run ended at step %ld, before the end of the profiled window (steps %ld-%ld): no trace "
      "written", long(step), long(first_step_), long(window_end));
}

bool StepProfiler::active(int64_t step) const {
  return enabled_ && step >= 1 && (step - 1) % freq_ >= freq_ - active_;
}

void StepProfiler::begin_step(int64_t step) {
  if (!active(step)) return;
  // A run resumed inside a window times the rest of it (as torchtitan's profiler does).
  if (!timeline_) {
    timeline_ = std::make_unique<profiling::Timeline>(device_services(device_));
    first_step_ = step;
  }
  profiling::mark_phase("step");
}

void StepProfiler::step_ran() {
  // Validation's forward passes run in here: they are not the training step's ops.
  if (timeline_) profiling::mark_phase("between steps", /*ops_inside=*/true);
}

void StepProfiler::end_step(int64_t step) {
  if (!timeline_ || !window_end(step)) return;
  const std::vector<Span> spans = timeline_->finish();
  timeline_.reset();
  const std::filesystem::path dir = folder_ / ("iteration_" + std::to_string(step));
  const std::filesystem::path trace = dir / ("rank" + std::to_string(rank_) + "_trace.json");
  const std::string device = device_services(device_).description();
  try {  // a trace that cannot be written costs the trace, not the training
    std::filesystem::create_directories(dir);
    io::write_file_atomic(trace, chrome_trace(spans, rank_, device, first_step_));
    last_trace_ = trace;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profiling: rank %d: the trace of step %ld was not written: %s\n", rank_, long(step), e.what());
  }
  double total = 0;
  for (const Span& s : spans) total += s.seconds;
  const std::string steps =
      first_step_ == step ? "step " + std::to_string(step) : "steps " + std::to_string(first_step_) + "-" + std::to_string(step);
  say("profile of %s on %s: %.4f s in %zu spans; trace %s", steps.c_str(), device.c_str(), total, spans.size(),
      last_trace_ == trace ? trace.c_str() : "not written");
  for (const std::string& line : profile_table(profile_rows(spans), total)) say("%s", line.c_str());
}

}  // namespace titan::train

#include "titan/core/op_timeline.h"

#include <atomic>
#include <thread>

#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::profiling {

namespace {

std::atomic<Timeline*> g_active{nullptr};
std::thread::id g_thread;    // the recording thread (set before g_active is published)
std::string g_last_module;   // written and read on the recording thread only
bool g_ops_in_phase = false;  // the latest phase mark keeps the ops after it (recording thread only)
thread_local bool t_in_backward_node = false;

// The timeline to mark, when this thread records one.
Timeline* recording_here() {
  Timeline* t = g_active.load(std::memory_order_acquire);
  return t && std::this_thread::get_id() == g_thread ? t : nullptr;
}

}  // namespace

bool recording() { return g_active.load(std::memory_order_relaxed) != nullptr; }

void mark_op(const std::string& op, const std::string& module) {
  Timeline* t = recording_here();
  if (!t || t_in_backward_node || g_ops_in_phase) return;
  g_last_module = module;
  t->add(op, module, SpanKind::Forward);
}

void mark_phase(std::string_view name, bool ops_inside) {
  Timeline* t = recording_here();
  if (!t) return;
  g_ops_in_phase = ops_inside;
  t->add(name, "", SpanKind::Phase);
}

const std::string& last_op_module() { return g_last_module; }

BackwardNode::BackwardNode(const std::string& op, const std::string& module) : prev_suppressed_(t_in_backward_node) {
  if (Timeline* t = recording_here()) t->add(op, module, SpanKind::Backward);
  t_in_backward_node = true;
}

BackwardNode::~BackwardNode() { t_in_backward_node = prev_suppressed_; }

Timeline::Timeline(DeviceServices& device) : device_(device) {
  TITAN_CHECK(g_active.load() == nullptr, "profiler: a timeline is already recording");
  device_.take_time_marks();  // forget marks left by a timeline that never finished
  g_thread = std::this_thread::get_id();
  g_last_module.clear();
  g_ops_in_phase = false;
  g_active.store(this, std::memory_order_release);
}

Timeline::~Timeline() {
  if (!finished_) g_active.store(nullptr);
}

void Timeline::add(std::string_view name, std::string_view module, SpanKind kind) {
  labels_.push_back({std::string(name), std::string(module), kind, device_.stats().current_bytes});
  device_.record_time_mark();
}

std::vector<Span> Timeline::finish() {
  TITAN_CHECK(!finished_, "profiler: the timeline was finished already");
  device_.record_time_mark();  // the end of the last span
  g_active.store(nullptr);
  finished_ = true;
  const std::vector<double> times = device_.take_time_marks();
  TITAN_CHECK(times.size() == labels_.size() + 1, "profiler: ", times.size(), " time marks for ", labels_.size(),
              " labels");
  std::vector<Span> spans;
  spans.reserve(labels_.size());
  for (size_t i = 0; i < labels_.size(); ++i) {
    Label& l = labels_[i];
    spans.push_back({std::move(l.name), std::move(l.module), l.kind, times[i] - times[0], times[i + 1] - times[i],
                     l.memory_bytes});
  }
  labels_.clear();
  return spans;
}

}  // namespace titan::profiling

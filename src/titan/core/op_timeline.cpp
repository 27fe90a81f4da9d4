#include "titan/core/op_timeline.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::profiling {

namespace {

std::atomic<Timeline*> g_active{nullptr};
std::atomic<std::thread::id> g_thread;  // the recording thread (stored before g_active is published)
std::string g_last_module;     // recording thread only
bool g_ops_in_phase = false;   // the latest phase mark keeps the ops after it (recording thread only)
// The backward nodes running on this thread, innermost last (op, module).
thread_local std::vector<std::pair<const std::string*, const std::string*>> t_nodes;

// The timeline to mark, when this thread records one.
Timeline* recording_here() {
  Timeline* t = g_active.load(std::memory_order_acquire);
  return t && std::this_thread::get_id() == g_thread.load(std::memory_order_relaxed) ? t : nullptr;
}

const std::string kNoModule;

}  // namespace

bool recording() { return g_active.load(std::memory_order_relaxed) != nullptr; }

void mark_op(const std::string& op, const std::string& module) {
  Timeline* t = recording_here();
  if (!t) return;
  g_last_module = module;  // also inside a node: a recomputed layer's nodes are recorded there
  if (!t_nodes.empty() || g_ops_in_phase) return;
  t->add(op, module, SpanKind::Forward);
}

void mark_phase(std::string_view name, bool ops_inside) {
  Timeline* t = recording_here();
  if (!t) return;
  g_ops_in_phase = ops_inside;
  t->add(name, "", SpanKind::Phase);
}

void mark_wait(std::string_view name) {
  if (recording_here() && !g_ops_in_phase) mark_phase(name);
}

const std::string& last_op_module() { return recording_here() ? g_last_module : kNoModule; }

BackwardNode::BackwardNode(const std::string& op, const std::string& module) {
  if (Timeline* t = recording_here()) t->add(op, module, SpanKind::Backward);
  t_nodes.emplace_back(&op, &module);
}

BackwardNode::~BackwardNode() { t_nodes.pop_back(); }

void resume_backward_node() {
  Timeline* t = recording_here();
  if (t && !t_nodes.empty()) t->add(*t_nodes.back().first, *t_nodes.back().second, SpanKind::Backward);
}

Timeline::Timeline(DeviceServices& device) : device_(device) {
  TITAN_CHECK(g_active.load() == nullptr, "profiler: a timeline is already recording");
  device_.take_time_marks();  // forget marks left by a timeline that never finished
  g_thread.store(std::this_thread::get_id());
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

#pragma once
// Where a training step's time goes, op by op: the profiler behind [profiling] (train/profiler.h).
//
// While a Timeline records, every op call, every backward node and a few trainer phases leave a
// mark on the device's clock (DeviceServices::record_time_mark: the wall clock on the CPU, an
// event on the stream on a GPU). A mark ends the span before it, so the spans tile the step with
// no gap and no overlap, and their sum is the step's time on the device:
//   - an op's forward span runs from its kernel lookup (kernels::kernel_for) to the next mark;
//   - a backward node's span holds everything the node does, the kernels of the ops it calls and
//     the accumulation of its input gradients included (op marks are suppressed inside it), except
//     the spans of nested backward nodes: an activation-checkpointed layer's recompute node holds
//     the forward it reruns, its layer's nodes follow as spans of their own, then a second span of
//     the recompute node holds what it does after them (resume_backward_node);
//   - an op's span starts at its kernel lookup: the input copies (contiguous(), casts inside the
//     op's wrapper) it makes before that count in the span before;
//   - trainer phases ("data", "loss read", ...) mark host-side work between ops.
// On a GPU a span is device time between two points of the stream, so a host read shows up in the
// span of the op queued before it, as the idle time it costs.
//
// Cost when not recording: one relaxed atomic load per op call. Marks are taken only on the thread
// that started the timeline (the one that issues every kernel); other threads' calls are ignored.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

class DeviceServices;

namespace profiling {

enum class SpanKind : uint8_t { Forward, Backward, Phase };

struct Span {
  std::string name;    // op ("attention"), node op ("attention", "recompute:layers.3") or phase
  std::string module;  // the module the op ran in ("layers.3.attention"); "" when none
  SpanKind kind = SpanKind::Forward;
  double start = 0;    // seconds since the timeline started
  double seconds = 0;  // duration
  int64_t memory_bytes = 0;  // the device's allocated bytes when the span began
};

// True while a timeline records (any thread may ask).
bool recording();

// The marks. No-ops unless recording, on the recording thread.
void mark_op(const std::string& op, const std::string& module);  // an op's kernel is about to run
// Trainer-level work. With `ops_inside`, the ops run until the next phase mark belong to this
// phase (the evaluation between two steps is not training work); else they mark as usual.
void mark_phase(std::string_view name, bool ops_inside = false);
// A wait for a collective (data parallelism): a phase of its own, unless the current phase holds
// its ops (the gathers of an evaluation between two steps stay in that phase).
void mark_wait(std::string_view name);

// The module of the latest op call on the recording thread ("" elsewhere or when not recording):
// autograd keeps it in each node it records, so the node's backward span names the module its
// forward ran in.
const std::string& last_op_module();

// A backward node's span, from construction to the next mark; op marks are suppressed until it is
// destroyed (nested BackwardNode scopes still mark). `op` and `module` must outlive the scope.
class BackwardNode {
 public:
  BackwardNode(const std::string& op, const std::string& module);
  ~BackwardNode();
  BackwardNode(const BackwardNode&) = delete;
  BackwardNode& operator=(const BackwardNode&) = delete;
};

// A nested backward pass (a recompute's) has run its nodes: what the enclosing node does next is
// its own again, a second span of it.
void resume_backward_node();

// Records marks on `device` from construction until finish() (one timeline at a time per process;
// constructing a second while one records is an error).
class Timeline {
 public:
  explicit Timeline(DeviceServices& device);
  ~Timeline();  // stops recording if finish() was not called
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Waits for the device to reach the last mark, closes the last span there and returns every span
  // in order; recording stops.
  std::vector<Span> finish();

  // Called by the marks (recording thread only).
  void add(std::string_view name, std::string_view module, SpanKind kind);

 private:
  DeviceServices& device_;
  struct Label {
    std::string name, module;
    SpanKind kind;
    int64_t memory_bytes;
  };
  std::vector<Label> labels_;
  bool finished_ = false;
};

}  // namespace profiling
}  // namespace titan

#pragma once
// Tape-based reverse-mode autograd over coarse ops.
//
// While grad mode is on, an op whose inputs require grad records one Node on the
// current tape: its name, the input tensors' autograd metas, weak links to its
// outputs, and a backward closure that owns whatever the op saved. backward(loss)
// walks the tape in reverse, hands each node the gradients of its outputs and
// accumulates the returned input gradients (f32, f64 for f64 tensors) into the
// inputs' metas. Leaves (parameters) keep their gradient; intermediates' gradients
// are freed as soon as their producer has run.
//
// bf16 activation gradients (set_bf16_activation_gradients, the trainer's
// training.activation_grad_dtype = "bfloat16"): the ops that support it return the gradient of a
// bf16 activation in bf16 and record that they take bf16 gradients of their outputs (Node::
// takes_bf16_grads); every other node is handed its gradients widened to f32, as without the
// setting. A bf16 tensor's gradient is then held in bf16, or in f32 once an f32 gradient is added
// to it. Parameters' gradients stay f32.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan {

namespace autograd {

// Gradients of a node's outputs (undefined where an output got none; the backward
// closure treats an undefined gradient as zero) -> gradients of its inputs
// (undefined where an input needs none).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct Node {
  std::string op;
  std::string module;  // the module the op ran in, kept only while the op profiler records
  std::vector<std::shared_ptr<AutogradMeta>> inputs;   // null where the input needs no grad
  std::vector<Shape> input_shapes;                     // checked against the returned gradients
  std::vector<DType> input_dtypes;
  std::vector<std::weak_ptr<AutogradMeta>> outputs;
  BackwardFn backward;
  bool takes_bf16_grads = false;  // else a bf16 gradient of an output reaches backward as f32
};

class Tape {
 public:
  // Appends a node. Whenever the tape has doubled since it was last pruned, the nodes no gradient
  // can reach any more are dropped first (prune_unreachable): a forward whose result was let go
  // without a backward (an evaluation outside NoGradGuard) does not hold its graph forever.
  void push(Node node);
  size_t size() const { return nodes_.size(); }
  void clear() { nodes_.clear(); }
  std::vector<Node>& nodes() { return nodes_; }
  // Drops every node whose outputs are all released (no tensor and no later node holds them): no
  // gradient can reach it. Dropping one releases its inputs, so earlier nodes may follow.
  void prune_unreachable();

 private:
  std::vector<Node> nodes_;
  size_t prune_at_ = 4096;
};

bool grad_enabled();

// Whether ops return bf16 gradients for bf16 activations (see the top of this file). Process-wide;
// set once before a job's first forward (ops read it when they record).
void set_bf16_activation_gradients(bool on);
bool bf16_activation_gradients();
// The setting for its scope (a training run's, a test's), the previous one after.
class Bf16ActivationGradientsScope {
 public:
  explicit Bf16ActivationGradientsScope(bool on) : before_(bf16_activation_gradients()) {
    set_bf16_activation_gradients(on);
  }
  ~Bf16ActivationGradientsScope() { set_bf16_activation_gradients(before_); }
  Bf16ActivationGradientsScope(const Bf16ActivationGradientsScope&) = delete;
  Bf16ActivationGradientsScope& operator=(const Bf16ActivationGradientsScope&) = delete;

 private:
  bool before_;
};

// Sets grad mode for its scope.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();

 private:
  bool prev_;
};

// Disables recording in its scope (evaluation, optimizer updates, recompute forward).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

// Records into `tape` instead of the thread's default tape for its scope.
class TapeScope {
 public:
  explicit TapeScope(Tape* tape);
  ~TapeScope();

 private:
  Tape* prev_;
};

Tape& current_tape();

// Gradient accumulation (grad += g, grad in the grad dtype) runs a kernel, and kernels live in ops,
// above autograd: ops/elementwise installs ops::add_inplace here when it loads.
using GradAccumulator = void (*)(Tensor& grad, const Tensor& g);
void set_grad_accumulator(GradAccumulator accumulate);

// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Marks outputs as requiring grad and pushes a node; call only when needs_grad() was true.
// takes_bf16_grads: the backward accepts bf16 gradients of its outputs (an op that also accepts f32
// ones: from a node that gave f32).
void record(std::string op, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn backward, bool takes_bf16_grads = false);

// Seeds d(loss)/d(loss) = 1 and runs the current tape back to the start. The nodes that ran (the
// loss's graph) leave the tape; another graph recorded beside it stays for its own backward, so
// forward A, forward B, backward(A), backward(B) accumulates both when the two graphs share only
// leaves. A second backward of the same loss, or one whose gradient reaches a part of a graph that
// an earlier backward ran (B computed from an intermediate of A's graph), is an error (that part is
// gone), as in torch without retain_graph.
void backward(const Tensor& loss);
// Runs `tape` in reverse seeded with the given gradients of `outputs`; the nodes that ran, and those
// no gradient can reach any more, leave it.
void backward(Tape& tape, const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs);

// A backward hook: returns x itself (same storage, no copy) as a new tensor whose backward node
// calls `fn` when the gradient reaches it and passes the gradient through unchanged. Placed on the
// input and the output of a layer, it marks the points where that layer's backward starts and
// ends (sharded data parallelism gathers the layer's parameters and reduce-scatters its gradients
// there). Without grad mode, or when x needs no grad, returns x and fn never runs.
Tensor on_backward(const std::string& name, const Tensor& x, std::function<void()> fn);

// Activation checkpointing: runs fn(inputs) without keeping its intermediates.
// In backward the node reruns fn on the saved inputs under a local tape and
// backpropagates through it. Parameters used inside fn receive gradients as usual.
using BlockFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> recompute(const std::string& name, const BlockFn& fn, const std::vector<Tensor>& inputs);

// Adds g into the gradient held by meta (of a tensor with this shape and dtype);
// the first gradient of an intermediate is adopted without a copy. A bf16 gradient of a bf16
// intermediate stays bf16 (sums rounded to bf16 once per add) until an f32 one joins it, which
// widens the sum to f32.
void accumulate_grad(AutogradMeta& meta, const Shape& shape, DType dtype, const Tensor& g);

// Where a backward puts an input's gradient: into `buffer`, a parameter's gradient buffer, adding to
// what it holds (`add`) or writing over it (it holds no gradient of this step yet); or, when buffer
// is undefined, into a fresh gradient the backward returns as usual.
struct GradientTarget {
  Tensor buffer;
  bool add = false;
};

// Where an op input's gradient is accumulated, kept by a backward closure in place of the input
// itself (whose data the closure must not keep alive). target() is the input's gradient buffer
// when it is a parameter's preset gradient slice (Tensor::set_grad), which autograd would add the
// op's gradient into in place anyway, followed through casts that pass gradients on unchanged
// (grad_passes_to: the bf16 copy of an f32 parameter). A backward may write its gradient there
// itself (a GEMM with beta = 1, or beta = 0 for the step's first gradient: one pass over the
// buffer instead of writing a fresh gradient and adding it) and then returns an undefined gradient
// for that input. target() counts the buffer as written from then on: the caller must write (or
// add to) every element of it. Undefined when there is no such buffer: the op returns a fresh
// gradient as usual.
class GradientSink {
 public:
  GradientSink() = default;
  explicit GradientSink(const Tensor& input);
  GradientTarget target() const;
  bool has_buffer() const { return buffer_meta() != nullptr; }  // target() would give a buffer

 private:
  const AutogradMeta* buffer_meta() const;  // the meta whose grad target() gives, or null
  std::shared_ptr<AutogradMeta> meta_;
  Shape shape_;
  DType grad_dtype_ = DType::F32;
};

}  // namespace autograd
}  // namespace titan

#include "titan/autograd/autograd.h"

#include <algorithm>

#include "titan/core/check.h"
#include "titan/core/op_timeline.h"

namespace titan::autograd {

namespace {
thread_local bool t_grad_enabled = true;
thread_local Tape t_default_tape;
thread_local Tape* t_tape = nullptr;
GradAccumulator g_accumulate = nullptr;
bool g_bf16_activation_gradients = false;

// The view ops of core/tensor record their nodes through this (core may not include autograd).
void record_view(const char* op, const Tensor& input, Tensor& out, ViewBackward backward) {
  if (!needs_grad({&input})) return;
  // Views move gradients of any dtype (their backward only reshapes, transposes or pads).
  record(
      op, {input}, {&out},
      [backward = std::move(backward)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{backward(g[0])};
      },
      /*takes_bf16_grads=*/true);
}
const bool view_recorder_installed = (set_view_grad_recorder(&record_view), true);
}  // namespace

void set_grad_accumulator(GradAccumulator accumulate) { g_accumulate = accumulate; }

bool grad_enabled() { return t_grad_enabled; }

void set_bf16_activation_gradients(bool on) {
  g_bf16_activation_gradients = on;
}
bool bf16_activation_gradients() {
  return g_bf16_activation_gradients;
}

GradModeGuard::GradModeGuard(bool enabled) : prev_(t_grad_enabled) { t_grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { t_grad_enabled = prev_; }

TapeScope::TapeScope(Tape* tape) : prev_(t_tape) { t_tape = tape; }
TapeScope::~TapeScope() { t_tape = prev_; }

Tape& current_tape() { return t_tape ? *t_tape : t_default_tape; }

void Tape::push(Node node) {
  if (nodes_.size() >= prune_at_) {
    prune_unreachable();
    prune_at_ = std::max<size_t>(4096, 2 * nodes_.size());
  }
  nodes_.push_back(std::move(node));
}

void Tape::prune_unreachable() {
  std::vector<bool> dropped(nodes_.size(), false);
  // From the end: a dropped node releases its inputs' metas, which may leave an earlier node's
  // outputs unheld in turn.
  for (size_t n = nodes_.size(); n-- > 0;) {
    Node& node = nodes_[n];
    const bool held = std::any_of(node.outputs.begin(), node.outputs.end(),
                                  [](const std::weak_ptr<AutogradMeta>& w) { return !w.expired(); });
    if (held) continue;
    node = Node{};
    dropped[n] = true;
  }
  size_t kept = 0;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (dropped[n]) continue;
    if (kept != n) nodes_[kept] = std::move(nodes_[n]);  // (a vector moved onto itself empties)
    ++kept;
  }
  nodes_.resize(kept);
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(std::string op, const std::vector<Tensor>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn backward, bool takes_bf16_grads) {
  Node node;
  node.op = std::move(op);
  node.takes_bf16_grads = takes_bf16_grads;
  if (profiling::recording()) node.module = profiling::last_op_module();
  for (const Tensor& t : inputs) {
    bool wants = t.defined() && t.requires_grad();
    node.inputs.push_back(wants ? t.autograd_meta() : nullptr);
    node.input_shapes.push_back(wants ? t.shape() : Shape{});
    node.input_dtypes.push_back(wants ? t.dtype() : DType::F32);
  }
  for (Tensor* t : outputs) {
    auto& meta = t->ensure_autograd_meta();
    meta->requires_grad = true;
    meta->is_leaf = false;
    node.outputs.push_back(meta);
  }
  node.backward = std::move(backward);
  current_tape().push(std::move(node));
}

void accumulate_grad(AutogradMeta& meta, const Shape& shape, DType dtype, const Tensor& g) {
  TITAN_CHECK(g.shape() == shape, "autograd: gradient ", g.str(), " does not match tensor shape ", shape_str(shape),
              meta.name.empty() ? "" : " (" + meta.name + ")");
  // torch refuses this too (without retain_graph): the gradient would stop here, silently.
  TITAN_CHECK(!meta.graph_released, "backward: a gradient reached a tensor ", shape_str(shape),
              " whose part of the graph was back-propagated already (a second backward through a shared "
              "part of one graph): run the forward again for another backward");
  const DType gd = grad_dtype(dtype);
  if (meta.grad_unwritten && *meta.grad_unwritten) {  // a parameter's buffer: its first gradient this step
    meta.grad.copy_from(g);
    *meta.grad_unwritten = false;
    return;
  }
  // An intermediate bf16 activation may hold a bf16 gradient (bf16 activation gradients).
  const bool bf16 = !meta.is_leaf && dtype == DType::BF16 && g.dtype() == DType::BF16;
  if (!meta.grad.defined()) {
    if (!meta.is_leaf && (g.dtype() == gd || bf16) && g.is_contiguous()) {
      meta.grad = g;  // adopt: no copy
      return;
    }
    meta.grad = Tensor::zeros(shape, bf16 ? DType::BF16 : gd, g.device());
  } else if (meta.grad.dtype() != g.dtype() && meta.grad.dtype() == DType::BF16) {
    meta.grad = meta.grad.to(gd);  // an f32 gradient joins a bf16 sum: the sum goes on in f32
  } else if (meta.grad.storage().use_count() > 1 && !meta.is_leaf) {
    // The adopted buffer is shared (an op returned one gradient for two inputs): copy before mutating.
    meta.grad = meta.grad.clone();
  }
  TITAN_CHECK(g_accumulate, "autograd: no gradient accumulator installed (ops/elementwise installs it)");
  g_accumulate(meta.grad, g);
}

GradientSink::GradientSink(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return;
  meta_ = input.autograd_meta();
  shape_ = input.shape();
  grad_dtype_ = grad_dtype(input.dtype());
}

const AutogradMeta* GradientSink::buffer_meta() const {
  const AutogradMeta* meta = meta_.get();
  while (meta && meta->grad_passes_to) meta = meta->grad_passes_to.get();
  if (!meta || !meta->grad.defined()) return nullptr;
  const Tensor& g = meta->grad;
  // Only a parameter's preset buffer: it is the same tensor whether or not its layer is
  // recomputed, so an activation-checkpointed step accumulates exactly as a plain one (an
  // intermediate's gradient is shared or not depending on who still holds it, which differs
  // between the two).
  if (!meta->is_leaf || !meta->grad_preset || g.dtype() != grad_dtype_ || g.shape() != shape_ ||
      !g.is_contiguous())
    return nullptr;
  return meta;
}

GradientTarget GradientSink::target() const {
  const AutogradMeta* meta = buffer_meta();
  if (!meta) return {};
  const bool unwritten = meta->grad_unwritten && *meta->grad_unwritten;
  if (unwritten) *meta->grad_unwritten = false;
  return {meta->grad, !unwritten};
}

void backward(Tape& tape, const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  TITAN_CHECK(outputs.size() == grad_outputs.size(), "backward: ", outputs.size(), " outputs but ",
              grad_outputs.size(), " gradients");
  for (size_t i = 0; i < outputs.size(); ++i) {
    TITAN_CHECK(outputs[i].requires_grad(), "backward: output ", i, " (", outputs[i].str(),
                ") does not require grad: nothing recorded it");
    accumulate_grad(*outputs[i].autograd_meta(), outputs[i].shape(), outputs[i].dtype(), grad_outputs[i]);
  }
  NoGradGuard no_grad;  // backward closures must not record
  auto& nodes = tape.nodes();
  std::vector<bool> ran(nodes.size(), false);
  for (size_t n = nodes.size(); n-- > 0;) {
    Node& node = nodes[n];
    std::vector<Tensor> gouts;
    gouts.reserve(node.outputs.size());
    bool any = false;
    for (auto& w : node.outputs) {
      auto meta = w.lock();
      Tensor g = meta ? meta->grad : Tensor();
      if (meta && !meta->is_leaf) meta->grad = Tensor();  // free intermediate gradients early
      if (g.defined() && g.dtype() == DType::BF16 && !node.takes_bf16_grads) g = g.to(DType::F32);
      any |= g.defined();
      gouts.push_back(std::move(g));
    }
    if (any) {
      profiling::BackwardNode profiled(node.op, node.module);  // the node's span, its accumulations included
      std::vector<Tensor> gins = node.backward(gouts);
      TITAN_CHECK(gins.size() == node.inputs.size(), "autograd: backward of '", node.op, "' returned ", gins.size(),
                  " gradients for ", node.inputs.size(), " inputs");
      for (size_t i = 0; i < gins.size(); ++i) {
        if (!node.inputs[i] || !gins[i].defined()) continue;
        accumulate_grad(*node.inputs[i], node.input_shapes[i], node.input_dtypes[i], gins[i]);
      }
      ran[n] = true;
      for (auto& w : node.outputs)
        if (auto meta = w.lock(); meta && !meta->is_leaf) meta->graph_released = true;
    }
    // Release what the closure saved as we go; the inputs' metas stay until the walk is done (an
    // earlier node reads its gradient from them).
    if (ran[n]) node.backward = nullptr;
  }
  // What no gradient reached stays only while something may still need it: another graph recorded
  // beside this one, whose loss is yet to be back-propagated.
  size_t kept = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (ran[n]) continue;
    if (kept != n) nodes[kept] = std::move(nodes[n]);
    ++kept;
  }
  nodes.resize(kept);
  tape.prune_unreachable();
  profiling::resume_backward_node();  // inside a recompute node: the rest of its span is its own
}

void backward(const Tensor& loss) {
  TITAN_CHECK(loss.numel() == 1, "backward: loss must have one element, got ", loss.str());
  // A loss whose producing node is no longer on the tape was back-propagated already (or recorded
  // on another tape): running the tape would add nothing, silently.
  if (loss.requires_grad() && !loss.autograd_meta()->is_leaf) {
    const AutogradMeta* meta = loss.autograd_meta().get();
    const auto& nodes = current_tape().nodes();
    const bool recorded = std::any_of(nodes.begin(), nodes.end(), [&](const Node& node) {
      return std::any_of(node.outputs.begin(), node.outputs.end(),
                         [&](const std::weak_ptr<AutogradMeta>& w) { return w.lock().get() == meta; });
    });
    TITAN_CHECK(recorded,
                "backward: the graph of this loss is not on this thread's tape: it was back-propagated "
                "already (run the forward again for another backward)");
  }
  Tensor one = Tensor::full(loss.shape(), 1.0, grad_dtype(loss.dtype()), loss.device());
  backward(current_tape(), {loss}, {one});
}

Tensor on_backward(const std::string& name, const Tensor& x, std::function<void()> fn) {
  if (!needs_grad({&x})) return x;
  Tensor out = x.detach();
  record(
      "hook:" + name, {x}, {&out},
      [fn = std::move(fn)](const std::vector<Tensor>& g) {
        fn();
        return std::vector<Tensor>{g[0]};
      },
      /*takes_bf16_grads=*/true);
  return out;
}

std::vector<Tensor> recompute(const std::string& name, const BlockFn& fn, const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs)) {
    // Parameters inside fn may still need grad: without recorded inputs we would lose them,
    // so only skip the machinery when grad mode is off altogether.
    if (!grad_enabled()) return fn(inputs);
  }
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  std::vector<Tensor*> out_ptrs;
  for (auto& o : outputs) out_ptrs.push_back(&o);
  std::vector<Tensor> saved_inputs;
  for (const Tensor& t : inputs) saved_inputs.push_back(t.detach());
  std::vector<bool> input_requires;
  for (const Tensor& t : inputs) input_requires.push_back(t.requires_grad());
  BlockFn block = fn;
  record(
      "recompute:" + name, inputs, out_ptrs,
      [block, saved_inputs, input_requires](const std::vector<Tensor>& gouts) {
        // Rerun the block with grad on, recording into a private tape.
        std::vector<Tensor> local_inputs;
        for (size_t i = 0; i < saved_inputs.size(); ++i) {
          Tensor t = saved_inputs[i].detach();
          t.set_requires_grad(input_requires[i]);
          // Intermediates of the whole graph, not leaves: their gradients sum as the plain
          // graph's would (in bf16 under bf16 activation gradients; a leaf's sum is f32).
          if (input_requires[i]) t.autograd_meta()->is_leaf = false;
          local_inputs.push_back(t);
        }
        Tape local;
        std::vector<Tensor> local_outputs;
        {
          TapeScope scope(&local);
          GradModeGuard on(true);
          local_outputs = block(local_inputs);
        }
        std::vector<Tensor> outs, grads;
        for (size_t i = 0; i < local_outputs.size(); ++i) {
          if (!gouts[i].defined() || !local_outputs[i].requires_grad()) continue;
          outs.push_back(local_outputs[i]);
          grads.push_back(gouts[i]);
        }
        backward(local, outs, grads);
        std::vector<Tensor> gins;
        for (auto& t : local_inputs) gins.push_back(t.requires_grad() ? t.grad() : Tensor());
        return gins;
      },
      /*takes_bf16_grads=*/true);  // handed on to the block's own nodes, which say what they take
  return outputs;
}

}  // namespace titan::autograd

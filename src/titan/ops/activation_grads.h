#pragma once
// How an op's backward treats the gradients of its bf16 activations (autograd.h: bf16 activation
// gradients, training.activation_grad_dtype). With the setting on, rms_norm, rope, swiglu, linear
// and attention take the gradient of a bf16 output in bf16 and return their bf16 activations'
// gradients in bf16 (weights' gradients stay f32). A kernel that registers a bf16-gradient backward
// reads and writes them itself; for the others the op widens the upstream gradient to f32, runs the
// f32-gradient kernel and rounds its result to bf16 once: the same values at more memory traffic,
// so every device and kernel variant rounds at the same points.
#include "titan/core/tensor.h"

namespace titan::ops {

class ActivationGrads {
 public:
  // For the activation x, under the current setting; `has_bf16_kernel`: the op's kernel has a
  // bf16-gradient backward (on the meta device: when it stands in for a device whose kernels do).
  ActivationGrads(const Tensor& x, bool has_bf16_kernel);
  bool bf16() const { return bf16_; }             // what autograd::record's takes_bf16_grads says
  bool native() const { return native_; }         // the kernel's bf16-gradient backward runs
  DType kernel_dtype() const { return kernel_; }  // what the kernel reads dy in and writes dx in
  // The upstream gradient as the kernel reads it (converted when it came in the other dtype; with
  // the setting on, an f32 one rounded to bf16 first, whichever dtype the kernel reads).
  Tensor upstream(const Tensor& g) const;
  // A gradient the kernel wrote, as the op returns it (rounded to bf16 once when not native).
  Tensor returned(const Tensor& dx) const;

 private:
  bool bf16_ = false, native_ = false;
  DType kernel_ = DType::F32;
};

}  // namespace titan::ops

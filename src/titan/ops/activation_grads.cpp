#include "titan/ops/activation_grads.h"

#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"

namespace titan::ops {

namespace {
// The meta device's kernels have bf16-gradient backwards for planning a GPU; no CPU kernel has one.
bool kernels_write_bf16_grads(Device device, bool has_bf16_kernel) {
  return has_bf16_kernel && !(device == Device::Meta && meta_stands_in_for() == Device::CPU);
}
}  // namespace

ActivationGrads::ActivationGrads(const Tensor& x, bool has_bf16_kernel)
    : bf16_(x.dtype() == DType::BF16 && autograd::bf16_activation_gradients()),
      native_(bf16_ && kernels_write_bf16_grads(x.device(), has_bf16_kernel)),
      kernel_(native_ ? DType::BF16 : grad_dtype(x.dtype())) {}

Tensor ActivationGrads::upstream(const Tensor& g) const {
  // A bf16 output's gradient is bf16 under the setting (as torch's autograd holds a bf16 tensor's
  // gradient): one that arrives in f32 (from an op that writes f32 gradients: the loss, the MoE
  // experts) is rounded first on every path, the f32-gradient kernel's included, so that a device
  // whose kernel reads bf16 and one whose kernel reads f32 start from the same values.
  const Tensor held = bf16_ && g.dtype() != DType::BF16 ? g.to(DType::BF16) : g;
  return held.dtype() == kernel_ ? held.contiguous() : held.to(kernel_);
}

Tensor ActivationGrads::returned(const Tensor& dx) const {
  if (!dx.defined() || !bf16_ || dx.dtype() == DType::BF16) return dx;
  return dx.to(DType::BF16);
}

}  // namespace titan::ops

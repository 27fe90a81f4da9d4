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
  return g.dtype() == kernel_ ? g.contiguous() : g.to(kernel_);
}

Tensor ActivationGrads::returned(const Tensor& dx) const {
  if (!dx.defined() || !bf16_ || dx.dtype() == DType::BF16) return dx;
  return dx.to(DType::BF16);
}

}  // namespace titan::ops

#include "titan/ops/activation_grads.h"

#include "titan/autograd/autograd.h"

namespace titan::ops {

ActivationGrads::ActivationGrads(DType dtype, bool has_bf16_kernel)
    : bf16_(dtype == DType::BF16 && autograd::bf16_activation_gradients()),
      native_(bf16_ && has_bf16_kernel),
      kernel_(native_ ? DType::BF16 : grad_dtype(dtype)) {}

Tensor ActivationGrads::upstream(const Tensor& g) const {
  return g.dtype() == kernel_ ? g.contiguous() : g.to(kernel_);
}

Tensor ActivationGrads::returned(const Tensor& dx) const {
  if (!dx.defined() || !bf16_ || dx.dtype() == DType::BF16) return dx;
  return dx.to(DType::BF16);
}

}  // namespace titan::ops

#include "titan/ops/swiglu/swiglu.h"

#include <cmath>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/activation_grads.h"

namespace titan::ops {

Tensor swiglu(const Tensor& gate_in, const Tensor& up_in) {
  TITAN_CHECK(gate_in.shape() == up_in.shape(), "swiglu: shapes differ: gate ", gate_in.str(), ", up ",
              up_in.str());
  TITAN_CHECK(gate_in.dtype() == up_in.dtype(), "swiglu: dtypes differ: gate ", gate_in.str(), ", up ",
              up_in.str());
  TITAN_CHECK(dtype_is_float(gate_in.dtype()), "swiglu: gate must be floating point, got ", gate_in.str());
  TITAN_CHECK(gate_in.device() == up_in.device(), "swiglu: gate ", gate_in.str(), " and up ", up_in.str(),
              " are on different devices");
  Tensor gate = gate_in.contiguous().detach(), up = up_in.contiguous().detach();
  const int64_t n = gate.numel();
  const auto& kernel = kernels::kernel_for<SwigluKernel>("swiglu", gate.device(), gate.dtype());
  const KernelContext ctx = device_services(gate.device()).context();
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  kernel.forward(ctx, n, gate.raw_data(), up.raw_data(), out.raw_data());
  if (autograd::needs_grad({&gate_in, &up_in})) {
    const bool need_dg = gate_in.requires_grad(), need_du = up_in.requires_grad();
    const DType gd = grad_dtype(gate.dtype());
    const ActivationGrads act(gate, kernel.backward_bf16_grads != nullptr);
    autograd::record(
        "swiglu", {gate_in, up_in}, {&out},
        [=, &kernel](const std::vector<Tensor>& g) {
          const Shape& shape = gate.shape();
          if (!g[0].defined())
            return std::vector<Tensor>{
                need_dg ? act.returned(Tensor::zeros(shape, gd, gate.device())) : Tensor(),
                need_du ? act.returned(Tensor::zeros(shape, gd, gate.device())) : Tensor()};
          Tensor dy = act.upstream(g[0]);
          Tensor dg = need_dg ? Tensor::empty(shape, act.kernel_dtype(), gate.device()) : Tensor();
          Tensor du = need_du ? Tensor::empty(shape, act.kernel_dtype(), gate.device()) : Tensor();
          (act.native() ? kernel.backward_bf16_grads : kernel.backward)(
              ctx, n, gate.raw_data(), up.raw_data(), dy.raw_data(), need_dg ? dg.raw_data() : nullptr,
              need_du ? du.raw_data() : nullptr);
          return std::vector<Tensor>{act.returned(dg), act.returned(du)};
        },
        act.bf16());
  }
  return out;
}

}  // namespace titan::ops

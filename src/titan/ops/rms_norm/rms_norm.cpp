#include "titan/ops/rms_norm/rms_norm.h"

#include <cmath>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/activation_grads.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

Tensor rms_norm(const Tensor& x_in, const Tensor& w_in, double eps) {
  TITAN_CHECK(x_in.dim() >= 1 && w_in.dim() == 1, "rms_norm: expected x [..., D] and w [D], got x ",
              x_in.str(), " and w ", w_in.str());
  TITAN_CHECK(x_in.size(-1) == w_in.size(0), "rms_norm: x ", x_in.str(), " has D=", x_in.size(-1), " but w ",
              w_in.str(), " has D=", w_in.size(0));
  TITAN_CHECK(x_in.dtype() == w_in.dtype(), "rms_norm: dtypes differ: x ", x_in.str(), ", w ", w_in.str());
  check_same_device("rms_norm", {{"x", &x_in}, {"w", &w_in}});
  TITAN_CHECK(dtype_is_float(x_in.dtype()), "rms_norm: x must be floating point, got ", x_in.str());
  TITAN_CHECK(eps >= 0 && std::isfinite(eps), "rms_norm: eps must be finite and >= 0, got ", eps);
  Tensor x = x_in.contiguous().detach(), w = w_in.contiguous().detach();
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  const DType gd = grad_dtype(x.dtype());
  const auto& kernel = kernels::kernel_for<RmsNormKernel>("rms_norm", x.device(), x.dtype());
  const KernelContext ctx = device_services(x.device()).context();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({R}, gd, x.device());
  kernel.forward(ctx, R, D, eps, x.raw_data(), w.raw_data(), y.raw_data(), rstd.raw_data());
  if (autograd::needs_grad({&x_in, &w_in})) {
    const bool need_dx = x_in.requires_grad(), need_dw = w_in.requires_grad();
    const ActivationGrads act(x, kernel.backward_bf16_grads != nullptr);
    autograd::record(
        "rms_norm", {x_in, w_in}, {&y},
        [=, &kernel](const std::vector<Tensor>& g) {
          if (!g[0].defined())
            return std::vector<Tensor>{
                need_dx ? act.returned(Tensor::zeros(x.shape(), gd, x.device())) : Tensor(),
                need_dw ? Tensor::zeros(w.shape(), gd, x.device()) : Tensor()};
          Tensor dy = act.upstream(g[0]);
          Tensor dx = need_dx ? Tensor::empty(x.shape(), act.kernel_dtype(), x.device()) : Tensor();
          Tensor dw = need_dw ? Tensor::empty(w.shape(), gd, x.device()) : Tensor();
          (act.native() ? kernel.backward_bf16_grads : kernel.backward)(
              ctx, R, D, x.raw_data(), w.raw_data(), rstd.raw_data(), dy.raw_data(),
              need_dx ? dx.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr);
          return std::vector<Tensor>{act.returned(dx), dw};
        },
        act.bf16());
  }
  return y;
}

}  // namespace titan::ops

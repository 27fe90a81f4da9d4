#include "titan/ops/linear/linear.h"

#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/activation_grads.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

Tensor linear(const Tensor& x_in, const Tensor& w_in) {
  TITAN_CHECK(x_in.dim() >= 1 && w_in.dim() == 2, "linear: expected x [..., K] and w [N, K], got x ", x_in.str(),
              " and w ", w_in.str());
  TITAN_CHECK(x_in.size(-1) == w_in.size(1), "linear: x ", x_in.str(), " has K=", x_in.size(-1), " but w ",
              w_in.str(), " has K=", w_in.size(1));
  TITAN_CHECK(x_in.dtype() == w_in.dtype(), "linear: dtypes differ: x ", x_in.str(), ", w ", w_in.str());
  check_same_device("linear", {{"x", &x_in}, {"w", &w_in}});
  Tensor x = x_in.contiguous().detach(), w = w_in.contiguous().detach();
  // M from the leading dimensions (not numel / K: with K = 0 the rows are still there, and y is
  // their zeros).
  const int64_t K = w.size(1), N = w.size(0), M = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Shape out_shape = x.shape();
  out_shape.back() = N;
  const auto& kernel = kernels::kernel_for<LinearKernel>("linear", x.device(), x.dtype());
  const KernelContext ctx = device_services(x.device()).context();
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  kernel.forward(ctx, M, N, K, x.raw_data(), w.raw_data(), y.raw_data());
  if (autograd::needs_grad({&x_in, &w_in})) {
    const bool need_dx = x_in.requires_grad(), need_dw = w_in.requires_grad();
    const autograd::GradientSink x_sink(x_in), w_sink(w_in);
    const ActivationGrads act(x, kernel.backward_bf16_grads != nullptr);
    autograd::record(
        "linear", {x_in, w_in}, {&y},
        [=, &kernel](const std::vector<Tensor>& g) {
          const DType gd = grad_dtype(x.dtype());
          const Tensor dy = act.upstream(g[0]);
          // Each gradient goes into the input's gradient buffer when it has one (a parameter's, always
          // f32: added to it, or written over it by the step's first gradient; returned undefined),
          // else into a fresh tensor returned to autograd (dx in the kernel's gradient dtype, dw in f32).
          auto place = [&](bool needed, const autograd::GradientSink& sink, const Tensor& like, DType fresh,
                           bool* add, bool* into_buffer) {
            if (!needed) return Tensor();
            const autograd::GradientTarget target = sink.target();
            *into_buffer = target.buffer.defined();
            *add = target.add;
            return *into_buffer ? target.buffer : Tensor::empty(like.shape(), fresh, like.device());
          };
          LinearGradients grads;
          bool dx_into_buffer = false, dw_into_buffer = false;
          Tensor dx = place(need_dx, x_sink, x, act.kernel_dtype(), &grads.add_dx, &dx_into_buffer),
                 dw = place(need_dw, w_sink, w, gd, &grads.add_dw, &dw_into_buffer);
          // The bf16-gradient kernels write dx in bf16 unless they add it to an f32 buffer: the step's
          // first gradient of a parameter taken as x is added to zeros.
          if (dx_into_buffer && !grads.add_dx && act.native()) {
            dx.fill(0.0);
            grads.add_dx = true;
          }
          grads.dx = dx.defined() ? dx.raw_data() : nullptr;
          grads.dw = dw.defined() ? dw.raw_data() : nullptr;
          (act.native() ? kernel.backward_bf16_grads : kernel.backward)(ctx, M, N, K, x.raw_data(),
                                                                        w.raw_data(), dy.raw_data(), grads);
          return std::vector<Tensor>{dx_into_buffer ? Tensor() : act.returned(dx),
                                     dw_into_buffer ? Tensor() : dw};
        },
        act.bf16());
  }
  return y;
}

}  // namespace titan::ops

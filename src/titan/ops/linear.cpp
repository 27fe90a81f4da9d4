#include "titan/ops/linear.h"

#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

namespace {

// Reference: plain triple loops in the accumulation type A (f64 for f64, f32 otherwise).
template <class T, class A>
void linear_forward_ref(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* xv, const void* wv, void* yv) {
  const T *x = static_cast<const T*>(xv), *w = static_cast<const T*>(wv);
  T* y = static_cast<T*>(yv);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      A acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += A(x[m * K + k]) * A(w[n * K + k]);
      y[m * N + n] = T(acc);
    }
}

template <class T, class A>
void linear_backward_ref(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* xv, const void* wv, const void* dyv, void* dxv,
                         void* dwv) {
  const T *x = static_cast<const T*>(xv), *w = static_cast<const T*>(wv);
  const A* dy = static_cast<const A*>(dyv);
  if (A* dx = static_cast<A*>(dxv))
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        A acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[m * N + n] * A(w[n * K + k]);
        dx[m * K + k] = acc;
      }
  if (A* dw = static_cast<A*>(dwv))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        A acc = 0;
        for (int64_t m = 0; m < M; ++m) acc += dy[m * N + n] * A(x[m * K + k]);
        dw[n * K + k] = acc;
      }
}

TITAN_REGISTER_KERNEL(linear_f64_ref, {"linear", Device::CPU, DType::F64, "reference", "triple loop, f64",
                                       LinearKernel{linear_forward_ref<double, double>,
                                                    linear_backward_ref<double, double>}, {}});
TITAN_REGISTER_KERNEL(linear_f32_ref, {"linear", Device::CPU, DType::F32, "reference", "triple loop, f32 accumulation",
                                       LinearKernel{linear_forward_ref<float, float>,
                                                    linear_backward_ref<float, float>}, {}});
TITAN_REGISTER_KERNEL(linear_bf16_ref, {"linear", Device::CPU, DType::BF16, "reference",
                                        "triple loop, bf16 inputs, f32 accumulation",
                                        LinearKernel{linear_forward_ref<Bf16, float>,
                                                     linear_backward_ref<Bf16, float>}, {}});

}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& w_in) {
  TITAN_CHECK(x_in.dim() >= 1 && w_in.dim() == 2, "linear: expected x [..., K] and w [N, K], got x ", x_in.str(),
              " and w ", w_in.str());
  TITAN_CHECK(x_in.size(-1) == w_in.size(1), "linear: x ", x_in.str(), " has K=", x_in.size(-1), " but w ",
              w_in.str(), " has K=", w_in.size(1));
  TITAN_CHECK(x_in.dtype() == w_in.dtype(), "linear: dtypes differ: x ", x_in.str(), ", w ", w_in.str());
  Tensor x = x_in.contiguous().detach(), w = w_in.contiguous().detach();
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / (K ? K : 1);
  Shape out_shape = x.shape();
  out_shape.back() = N;
  const auto& kernel = kernels::kernel_for<LinearKernel>("linear", x.device(), x.dtype());
  const KernelContext ctx = device_services(x.device()).context();
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  kernel.forward(ctx, M, N, K, x.raw_data(), w.raw_data(), y.raw_data());
  if (autograd::needs_grad({&x_in, &w_in})) {
    bool need_dx = x_in.requires_grad(), need_dw = w_in.requires_grad();
    autograd::record("linear", {x_in, w_in}, {&y}, [=, &kernel](const std::vector<Tensor>& g) {
      DType gd = grad_dtype(x.dtype());
      Tensor dy = g[0].contiguous();
      Tensor dx = need_dx ? Tensor::empty(x.shape(), gd, x.device()) : Tensor();
      Tensor dw = need_dw ? Tensor::empty(w.shape(), gd, x.device()) : Tensor();
      kernel.backward(ctx, M, N, K, x.raw_data(), w.raw_data(), dy.raw_data(), need_dx ? dx.raw_data() : nullptr,
                      need_dw ? dw.raw_data() : nullptr);
      return std::vector<Tensor>{dx, dw};
    });
  }
  return y;
}

}  // namespace titan::ops

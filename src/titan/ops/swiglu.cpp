#include "titan/ops/swiglu.h"

#include <cmath>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

namespace {

// Reference: T(...) rounds where torch rounds (after silu, after the product).
template <class T, class A>
void swiglu_forward_ref(const KernelContext& ctx, int64_t n, const void* gv, const void* uv, void* ov) {
  const T *gate = static_cast<const T*>(gv), *up = static_cast<const T*>(uv);
  T* out = static_cast<T*>(ov);
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(gate[i]);
    out[i] = T(A(T(g / (A(1) + std::exp(-g)))) * A(up[i]));
  }
}

template <class T, class A>
void swiglu_backward_ref(const KernelContext& ctx, int64_t n, const void* gv, const void* uv, const void* dyv, void* dgv, void* duv) {
  const T *gate = static_cast<const T*>(gv), *up = static_cast<const T*>(uv);
  const A* dy = static_cast<const A*>(dyv);
  A *dg = static_cast<A*>(dgv), *du = static_cast<A*>(duv);
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(gate[i]);
    const A e = std::exp(-g);
    const A s = A(1) / (A(1) + e);
    if (dg) dg[i] = dy[i] * A(up[i]) * s * (A(1) + g * (A(1) - s));
    if (du) du[i] = dy[i] * A(T(g / (A(1) + e)));
  }
}

TITAN_REGISTER_KERNEL(swiglu_f64_ref,
                      {"swiglu",
                       Device::CPU,
                       DType::F64,
                       "reference",
                       "elementwise loop, f64",
                       SwigluKernel{swiglu_forward_ref<double, double>, swiglu_backward_ref<double, double>},
                       {}});
TITAN_REGISTER_KERNEL(swiglu_f32_ref,
                      {"swiglu",
                       Device::CPU,
                       DType::F32,
                       "reference",
                       "elementwise loop, f32 expf",
                       SwigluKernel{swiglu_forward_ref<float, float>, swiglu_backward_ref<float, float>},
                       {}});
TITAN_REGISTER_KERNEL(swiglu_bf16_ref,
                      {"swiglu",
                       Device::CPU,
                       DType::BF16,
                       "reference",
                       "elementwise loop in f32, rounded after silu and after the product",
                       SwigluKernel{swiglu_forward_ref<Bf16, float>, swiglu_backward_ref<Bf16, float>},
                       {}});

}  // namespace

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
    autograd::record("swiglu", {gate_in, up_in}, {&out}, [=, &kernel](const std::vector<Tensor>& g) {
      const Shape& shape = gate.shape();
      if (!g[0].defined())
        return std::vector<Tensor>{need_dg ? Tensor::zeros(shape, gd, gate.device()) : Tensor(),
                                   need_du ? Tensor::zeros(shape, gd, gate.device()) : Tensor()};
      Tensor dy = g[0].contiguous();
      Tensor dg = need_dg ? Tensor::empty(shape, gd, gate.device()) : Tensor();
      Tensor du = need_du ? Tensor::empty(shape, gd, gate.device()) : Tensor();
      kernel.backward(ctx, n, gate.raw_data(), up.raw_data(), dy.raw_data(), need_dg ? dg.raw_data() : nullptr,
                      need_du ? du.raw_data() : nullptr);
      return std::vector<Tensor>{dg, du};
    });
  }
  return out;
}

}  // namespace titan::ops

#include "titan/ops/elementwise/elementwise.h"

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

#include <algorithm>
#include <type_traits>

namespace titan::ops {

namespace {

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TITAN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.device() == b.device(), op, ": devices differ");
}

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  check_same("add", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kernels::kernel_for<AddKernel>("add", a.device(), a.dtype())
      .forward(device_services(a.device()).context(), a.numel(), a.raw_data(), b.raw_data(), out.raw_data());
  if (autograd::needs_grad({&a_in, &b_in})) {
    // The gradient passes to both inputs unchanged, in whatever dtype it comes.
    autograd::record(
        "add", {a_in, b_in}, {&out},
        [](const std::vector<Tensor>& g) {
          return std::vector<Tensor>{g[0], g[0]};
        },
        /*takes_bf16_grads=*/true);
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  kernels::note_op_call("cast");  // a device conversion, not a registered kernel
  Tensor out = x.to(dtype);
  if (autograd::needs_grad({&x})) {
    DType gd = grad_dtype(x.dtype());
    autograd::record("cast", {x}, {&out}, [gd](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].dtype() == gd ? g[0] : g[0].to(gd)};
    });
    // f32 <-> bf16: both take f32 gradients, passed on unchanged, so an op may add its gradient of
    // `out` straight into x's (autograd::GradientSink).
    if (grad_dtype(dtype) == gd) out.autograd_meta()->grad_passes_to = x.autograd_meta();
  }
  return out;
}

Tensor scale(const Tensor& x, double s) {
  Tensor out = x.to(x.dtype());  // contiguous copy
  scale_inplace(out, s);
  if (autograd::needs_grad({&x})) {
    autograd::record("scale", {x}, {&out}, [s](const std::vector<Tensor>& g) {
      Tensor gi = g[0].clone();
      scale_inplace(gi, s);
      return std::vector<Tensor>{gi};
    });
  }
  return out;
}

namespace {
// Autograd sums the gradients of a tensor used twice: in place in the grad dtype, or, for the bf16
// gradient of a bf16 activation (autograd::bf16_activation_gradients), as a bf16 add rounded once
// per element into a new tensor that replaces the sum.
void accumulate_gradient(Tensor& grad, const Tensor& g) {
  if (grad.dtype() == DType::BF16) {
    grad = add(grad, g);
    return;
  }
  add_inplace(grad, g);
}
const bool grad_accumulator_installed = (autograd::set_grad_accumulator(&accumulate_gradient), true);
}  // namespace

void add_inplace(Tensor& dst, const Tensor& src_in) {
  TITAN_CHECK(dst.shape() == src_in.shape(), "add_inplace: shapes differ: ", dst.str(), " += ", src_in.str());
  TITAN_CHECK(dst.is_contiguous(), "add_inplace: destination ", dst.str(), " must be contiguous");
  TITAN_CHECK(dst.device() == src_in.device(), "add_inplace: devices differ: ", device_name(dst.device()),
              " += ", device_name(src_in.device()));
  TITAN_CHECK(dtype_is_float(src_in.dtype()) && dst.dtype() == grad_dtype(src_in.dtype()),
              "add_inplace: unsupported dtypes ", dst.str(), " += ", src_in.str(),
              " (the destination must be the source's grad dtype)");
  Tensor src = src_in.contiguous();
  kernels::kernel_for<AccumulateKernel>("add_inplace", dst.device(), src.dtype())
      .add_inplace(device_services(dst.device()).context(), dst.numel(), dst.raw_data(), src.raw_data());
}

void scale_inplace(Tensor& dst, double s) {
  TITAN_CHECK(dst.is_contiguous(), "scale_inplace: ", dst.str(), " must be contiguous");
  kernels::kernel_for<ScaleKernel>("scale_inplace", dst.device(), dst.dtype())
      .scale_inplace(device_services(dst.device()).context(), dst.numel(), dst.raw_data(), s);
}

double sum_all(const Tensor& x_in) {
  Tensor x = x_in.contiguous();
  device_services(x.device()).count_host_read();
  return kernels::kernel_for<SumKernel>("sum", x.device(), x.dtype())
      .sum(device_services(x.device()).context(), x.numel(), x.raw_data());
}

namespace {
const IndexKernel& index_kernel(const Tensor& ids) {
  TITAN_CHECK(ids.dtype() == DType::I64, "index check: expected an i64 tensor, got ", ids.str());
  return kernels::kernel_for<IndexKernel>("index", ids.device(), DType::I64);
}
}  // namespace

int64_t first_index_outside(const Tensor& ids_in, int64_t lo, int64_t hi, int64_t allowed) {
  Tensor ids = ids_in.contiguous();
  device_services(ids.device()).count_host_read();
  return index_kernel(ids).first_outside(device_services(ids.device()).context(), ids.numel(),
                                         ids.data<int64_t>(), lo, hi, allowed);
}

int64_t count_not_equal(const Tensor& ids_in, int64_t value) {
  Tensor ids = ids_in.contiguous();
  device_services(ids.device()).count_host_read();
  return index_kernel(ids).count_not_equal(device_services(ids.device()).context(), ids.numel(),
                                           ids.data<int64_t>(), value);
}

int64_t max_index(const Tensor& ids_in) {
  TITAN_CHECK(ids_in.numel() > 0, "max_index: empty tensor ", ids_in.str());
  Tensor ids = ids_in.contiguous();
  device_services(ids.device()).count_host_read();
  return index_kernel(ids).max(device_services(ids.device()).context(), ids.numel(), ids.data<int64_t>());
}

}  // namespace titan::ops

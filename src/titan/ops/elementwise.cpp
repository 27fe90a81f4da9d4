#include "titan/ops/elementwise.h"

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

#include <algorithm>
#include <type_traits>

namespace titan::ops {

namespace {

// Elementwise kernels are memory-bound one-liners; they are written once here,
// threaded with OpenMP, for the dtypes models use.
void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TITAN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.device() == b.device(), op, ": devices differ");
}

template <class T>
void add_forward(const KernelContext& ctx, int64_t n, const void* a, const void* b, void* out) {
  const T *x = static_cast<const T*>(a), *y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void add_forward_bf16(const KernelContext& ctx, int64_t n, const void* a, const void* b, void* out) {
  const bf16 *x = static_cast<const bf16*>(a), *y = static_cast<const bf16*>(b);
  bf16* o = static_cast<bf16*>(out);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

// dst (A) += src (S): f32 += f32 or bf16 (widened exactly), f64 += f64.
template <class A, class S>
void accumulate(const KernelContext& ctx, int64_t n, void* dv, const void* sv) {
  A* d = static_cast<A*>(dv);
  const S* s = static_cast<const S*>(sv);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] += A(s[i]);
}

template <class T>
void scale_kernel(const KernelContext& ctx, int64_t n, void* xv, double s) {
  T* x = static_cast<T*>(xv);
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;  // bf16 scales in f32
  const C f = C(s);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = T(C(x[i]) * f);
}

template <class T>
double sum_kernel(const KernelContext& ctx, int64_t n, const void* xv) {
  const T* x = static_cast<const T*>(xv);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]);
  return s;
}

int64_t first_outside(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t lo, int64_t hi,
                      int64_t allowed) {
  for (int64_t i = 0; i < n; ++i)
    if ((v[i] < lo || v[i] >= hi) && v[i] != allowed) return i;
  return -1;
}
int64_t count_not_equal_kernel(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t value) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += v[i] != value;
  return c;
}
int64_t max_kernel(const KernelContext& ctx, int64_t n, const int64_t* v) {
  int64_t m = v[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, v[i]);
  return m;
}

TITAN_REGISTER_KERNEL(add_f32, {"add", Device::CPU, DType::F32, "reference", "elementwise loop, OpenMP",
                                AddKernel{add_forward<float>}, {}});
TITAN_REGISTER_KERNEL(add_f64, {"add", Device::CPU, DType::F64, "reference", "elementwise loop",
                                AddKernel{add_forward<double>}, {}});
TITAN_REGISTER_KERNEL(add_bf16, {"add", Device::CPU, DType::BF16, "reference",
                                 "elementwise loop in f32, rounded to bf16, OpenMP", AddKernel{add_forward_bf16}, {}});
TITAN_REGISTER_KERNEL(acc_f32, {"add_inplace", Device::CPU, DType::F32, "reference", "f32 += f32, OpenMP",
                                AccumulateKernel{accumulate<float, float>}, {}});
TITAN_REGISTER_KERNEL(acc_bf16, {"add_inplace", Device::CPU, DType::BF16, "reference", "f32 += bf16, OpenMP",
                                 AccumulateKernel{accumulate<float, Bf16>}, {}});
TITAN_REGISTER_KERNEL(acc_f64, {"add_inplace", Device::CPU, DType::F64, "reference", "f64 += f64",
                                AccumulateKernel{accumulate<double, double>}, {}});
TITAN_REGISTER_KERNEL(scale_f32, {"scale_inplace", Device::CPU, DType::F32, "reference", "x *= s in f32, OpenMP",
                                  ScaleKernel{scale_kernel<float>}, {}});
TITAN_REGISTER_KERNEL(scale_bf16, {"scale_inplace", Device::CPU, DType::BF16, "reference",
                                   "x *= s in f32, rounded to bf16, OpenMP", ScaleKernel{scale_kernel<Bf16>}, {}});
TITAN_REGISTER_KERNEL(scale_f64, {"scale_inplace", Device::CPU, DType::F64, "reference", "x *= s in f64",
                                  ScaleKernel{scale_kernel<double>}, {}});
TITAN_REGISTER_KERNEL(sum_f32, {"sum", Device::CPU, DType::F32, "reference", "serial f64 sum",
                                SumKernel{sum_kernel<float>}, {}});
TITAN_REGISTER_KERNEL(sum_bf16, {"sum", Device::CPU, DType::BF16, "reference", "serial f64 sum",
                                 SumKernel{sum_kernel<Bf16>}, {}});
TITAN_REGISTER_KERNEL(sum_f64, {"sum", Device::CPU, DType::F64, "reference", "serial f64 sum",
                                SumKernel{sum_kernel<double>}, {}});
TITAN_REGISTER_KERNEL(index_i64, {"index", Device::CPU, DType::I64, "reference", "serial scans",
                                  IndexKernel{first_outside, count_not_equal_kernel, max_kernel}, {}});

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  check_same("add", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kernels::kernel_for<AddKernel>("add", a.device(), a.dtype())
      .forward(device_services(a.device()).context(), a.numel(), a.raw_data(), b.raw_data(), out.raw_data());
  if (autograd::needs_grad({&a_in, &b_in})) {
    autograd::record("add", {a_in, b_in}, {&out},
                     [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0], g[0]}; });
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = x.to(dtype);
  if (autograd::needs_grad({&x})) {
    DType gd = grad_dtype(x.dtype());
    autograd::record("cast", {x}, {&out}, [gd](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].dtype() == gd ? g[0] : g[0].to(gd)};
    });
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
  return index_kernel(ids).first_outside(device_services(ids.device()).context(), ids.numel(),
                                         ids.data<int64_t>(), lo, hi, allowed);
}

int64_t count_not_equal(const Tensor& ids_in, int64_t value) {
  Tensor ids = ids_in.contiguous();
  return index_kernel(ids).count_not_equal(device_services(ids.device()).context(), ids.numel(),
                                           ids.data<int64_t>(), value);
}

int64_t max_index(const Tensor& ids_in) {
  TITAN_CHECK(ids_in.numel() > 0, "max_index: empty tensor ", ids_in.str());
  Tensor ids = ids_in.contiguous();
  return index_kernel(ids).max(device_services(ids.device()).context(), ids.numel(), ids.data<int64_t>());
}

}  // namespace titan::ops

#include "titan/ops/elementwise.h"

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

namespace {

// Elementwise kernels are memory-bound one-liners; they are written once here,
// threaded with OpenMP, for the dtypes models use.
void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TITAN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.str(), " vs ", b.str());
  TITAN_CHECK(a.device() == b.device(), op, ": devices differ");
}

// add: out = a + b over n contiguous elements. One kernel per dtype; bf16 rounds once.
struct AddKernel {
  void (*forward)(int64_t n, const void* a, const void* b, void* out);
};

template <class T>
void add_forward(int64_t n, const void* a, const void* b, void* out) {
  const T *x = static_cast<const T*>(a), *y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void add_forward_bf16(int64_t n, const void* a, const void* b, void* out) {
  const bf16 *x = static_cast<const bf16*>(a), *y = static_cast<const bf16*>(b);
  bf16* o = static_cast<bf16*>(out);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

TITAN_REGISTER_KERNEL(add_f32, {"add", Device::CPU, DType::F32, "reference", "elementwise loop, OpenMP",
                                AddKernel{add_forward<float>}, {}});
TITAN_REGISTER_KERNEL(add_f64, {"add", Device::CPU, DType::F64, "reference", "elementwise loop",
                                AddKernel{add_forward<double>}, {}});
TITAN_REGISTER_KERNEL(add_bf16, {"add", Device::CPU, DType::BF16, "reference",
                                 "elementwise loop in f32, rounded to bf16, OpenMP", AddKernel{add_forward_bf16}, {}});

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  check_same("add", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kernels::kernel_for<AddKernel>("add", a.device(), a.dtype()).forward(a.numel(), a.raw_data(), b.raw_data(),
                                                                     out.raw_data());
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
  Tensor src = src_in.contiguous();
  int64_t n = dst.numel();
  if (dst.dtype() == DType::F32 && src.dtype() == DType::F32) {
    float* d = dst.data<float>();
    const float* s = src.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else if (dst.dtype() == DType::F32 && src.dtype() == DType::BF16) {
    float* d = dst.data<float>();
    const bf16* s = src.data<bf16>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] += bf16_to_f32(s[i]);
  } else if (dst.dtype() == DType::F64 && src.dtype() == DType::F64) {
    double* d = dst.data<double>();
    const double* s = src.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    TITAN_FAIL("add_inplace: unsupported dtypes ", dst.str(), " += ", src.str());
  }
}

void scale_inplace(Tensor& dst, double s) {
  TITAN_CHECK(dst.is_contiguous(), "scale_inplace: ", dst.str(), " must be contiguous");
  int64_t n = dst.numel();
  if (dst.dtype() == DType::F32) {
    float* d = dst.data<float>();
    float f = float(s);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] *= f;
  } else if (dst.dtype() == DType::F64) {
    double* d = dst.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] *= s;
  } else if (dst.dtype() == DType::BF16) {
    bf16* d = dst.data<bf16>();
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) * float(s));
  } else {
    TITAN_FAIL("scale_inplace: unsupported dtype ", dst.str());
  }
}

double sum_all(const Tensor& x) {
  double s = 0;
  for (double v : x.to_vector()) s += v;
  return s;
}

}  // namespace titan::ops

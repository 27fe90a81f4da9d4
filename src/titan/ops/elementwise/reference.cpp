// The reference kernels of elementwise: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <algorithm>
#include <type_traits>

#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {

namespace {
// Elementwise kernels are memory-bound one-liners; they are written once here,
// threaded with OpenMP, for the dtypes models use.
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

const bool add_kernels_registered = kernels::register_kernels(
    "add", Device::CPU,
    {{DType::F32, "reference", "elementwise loop, OpenMP", AddKernel{add_forward<float>}},
     {DType::F64, "reference", "elementwise loop", AddKernel{add_forward<double>}},
     {DType::BF16, "reference", "elementwise loop in f32, rounded to bf16, OpenMP",
      AddKernel{add_forward_bf16}}});
const bool add_inplace_kernels_registered = kernels::register_kernels(
    "add_inplace", Device::CPU,
    {{DType::F32, "reference", "f32 += f32, OpenMP", AccumulateKernel{accumulate<float, float>}},
     {DType::BF16, "reference", "f32 += bf16, OpenMP", AccumulateKernel{accumulate<float, Bf16>}},
     {DType::F64, "reference", "f64 += f64", AccumulateKernel{accumulate<double, double>}}});
const bool scale_inplace_kernels_registered = kernels::register_kernels(
    "scale_inplace", Device::CPU,
    {{DType::F32, "reference", "x *= s in f32, OpenMP", ScaleKernel{scale_kernel<float>}},
     {DType::BF16, "reference", "x *= s in f32, rounded to bf16, OpenMP", ScaleKernel{scale_kernel<Bf16>}},
     {DType::F64, "reference", "x *= s in f64", ScaleKernel{scale_kernel<double>}}});
const bool sum_kernels_registered =
    kernels::register_kernels("sum", Device::CPU,
                              {{DType::F32, "reference", "serial f64 sum", SumKernel{sum_kernel<float>}},
                               {DType::BF16, "reference", "serial f64 sum", SumKernel{sum_kernel<Bf16>}},
                               {DType::F64, "reference", "serial f64 sum", SumKernel{sum_kernel<double>}}});
const bool index_kernels_registered =
    kernels::register_kernels("index", Device::CPU,
                              {{DType::I64, "reference", "serial scans",
                                IndexKernel{first_outside, count_not_equal_kernel, max_kernel}}});

}  // namespace

}  // namespace titan::ops

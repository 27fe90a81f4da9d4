// The reference kernels of optim: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "titan/core/dtype.h"
#include "titan/kernels/registry.h"
#include "titan/ops/optim/optim.h"

namespace titan::ops {

namespace {
// Reference: the formula of optim.h one element at a time, in the element type T. std::fma rounds
// once, exactly like the vector FMA of the fast kernels and of PyTorch.
template <class T>
void adamw_step_ref(const KernelContext& ctx, int64_t n, void* pv, const void* gv, void* mv, void* vv,
                    uint16_t* copy, const AdamWScalars& s) {
  T* p = static_cast<T*>(pv);
  const T* g = static_cast<const T*>(gv);
  T *m = static_cast<T*>(mv), *v = static_cast<T*>(vv);
  const T decay = T(s.decay), b1 = T(s.beta1), omb1 = T(s.one_minus_beta1), b2 = T(s.beta2),
          omb2 = T(s.one_minus_beta2), neg_lr = T(s.neg_step_size), bc2 = T(s.bias_correction2_sqrt),
          eps = T(s.eps), scale = T(s.grad_scale), l2 = T(s.l2);
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i] * scale;
    if (l2 != 0) gi = std::fma(p[i], l2, gi);  // Adam: the L2 term, from p before the step
    T pi = p[i] * decay;
    T mi = std::fma(gi, omb1, m[i] * b1);
    T vi = std::fma(omb2 * gi, gi, v[i] * b2);
    T denom = std::sqrt(vi) / bc2 + eps;
    p[i] = pi + (neg_lr * mi) / denom;
    m[i] = mi;
    v[i] = vi;
    if constexpr (std::is_same_v<T, float>)
      if (copy) copy[i] = f32_to_bf16(p[i]).bits;
  }
}

// Reference: one f64 accumulator, in order (a square of an f32 is exact in f64).
template <class T>
void grad_norm_sq_ref(const KernelContext& ctx, int64_t n, const void* gv, double* total) {
  const T* g = static_cast<const T*>(gv);
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double(g[i]) * double(g[i]);
  *total += acc;
}

const bool adamw_kernels_registered = kernels::register_kernels(
    "adamw", Device::CPU,
    {{DType::F32, "reference", "scalar loop, f32 (torch.optim.AdamW rounding)",
      AdamWKernel{adamw_step_ref<float>}},
     {DType::F64, "reference", "scalar loop, f64", AdamWKernel{adamw_step_ref<double>}}});
const bool grad_norm_kernels_registered = kernels::register_kernels(
    "grad_norm", Device::CPU,
    {{DType::F32, "reference", "serial loop, one f64 accumulator", GradNormKernel{grad_norm_sq_ref<float>}},
     {DType::F64, "reference", "serial loop, one f64 accumulator",
      GradNormKernel{grad_norm_sq_ref<double>}}});

}  // namespace

}  // namespace titan::ops

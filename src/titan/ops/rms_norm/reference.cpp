// The reference kernels of rms_norm: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <cmath>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::ops {

namespace {
// Reference: serial sums in the accumulation type A (f64 for f64, else f32), T(...) rounds to the
// element type where transformers does.
template <class T, class A>
void rms_norm_forward_ref(const KernelContext& ctx, int64_t R, int64_t D, double eps, const void* xv, const void* wv, void* yv,
                          void* rv) {
  const T *x = static_cast<const T*>(xv), *w = static_cast<const T*>(wv);
  T* y = static_cast<T*>(yv);
  A* rstd = static_cast<A*>(rv);
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * D;
    A ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += A(xr[d]) * A(xr[d]);
    const A rs = A(1) / std::sqrt(ss / A(D) + A(eps));
    rstd[r] = rs;
    for (int64_t d = 0; d < D; ++d) y[r * D + d] = T(A(w[d]) * A(T(A(xr[d]) * rs)));
  }
}

template <class T, class A>
void rms_norm_backward_ref(const KernelContext& ctx, int64_t R, int64_t D, const void* xv, const void* wv, const void* rv,
                           const void* dyv, void* dxv, void* dwv) {
  const T *x = static_cast<const T*>(xv), *w = static_cast<const T*>(wv);
  const A *rstd = static_cast<const A*>(rv), *dy = static_cast<const A*>(dyv);
  A *dx = static_cast<A*>(dxv), *dw = static_cast<A*>(dwv);
  if (dw)
    for (int64_t d = 0; d < D; ++d) dw[d] = 0;
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * D;
    const A* g = dy + r * D;
    const A rs = rstd[r];
    if (dx) {
      A dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += g[d] * A(w[d]) * (A(xr[d]) * rs);
      const A mean = dot / A(D);
      for (int64_t d = 0; d < D; ++d) dx[r * D + d] = rs * (g[d] * A(w[d]) - A(xr[d]) * rs * mean);
    }
    if (dw)
      for (int64_t d = 0; d < D; ++d) dw[d] += g[d] * A(T(A(xr[d]) * rs));
  }
}

const bool registered = kernels::register_reference_kernels(
    "rms_norm", "row loops", "f32 statistics, bf16 rounding as transformers",
    TITAN_REFERENCE_KERNEL(RmsNormKernel, rms_norm_forward_ref<T, Acc>, rms_norm_backward_ref<T, Acc>));

}  // namespace

}  // namespace titan::ops

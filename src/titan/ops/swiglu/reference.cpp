// The reference kernels of swiglu: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <cmath>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/swiglu/swiglu.h"

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

const bool registered = kernels::register_reference_kernels(
    "swiglu", "elementwise loop", "f32 math, rounded after silu and after the product",
    TITAN_REFERENCE_KERNEL(SwigluKernel, swiglu_forward_ref<T, Acc>, swiglu_backward_ref<T, Acc>));

}  // namespace

}  // namespace titan::ops

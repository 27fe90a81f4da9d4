// The reference kernels of linear: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include "titan/ops/linear/reference.h"

#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/linear/linear.h"

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
void linear_backward_ref(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* xv,
                         const void* wv, const void* dyv, const LinearGradients& g) {
  linear_backward_loops<T, A>(M, N, K, static_cast<const T*>(xv), static_cast<const T*>(wv),
                              static_cast<const A*>(dyv), static_cast<A*>(g.dx), static_cast<A*>(g.dw), g.add_dx,
                              g.add_dw);
}

const bool registered = kernels::register_reference_kernels(
    "linear", "triple loop", "bf16 inputs, f32 accumulation",
    TITAN_REFERENCE_KERNEL(LinearKernel, linear_forward_ref<T, Acc>, linear_backward_ref<T, Acc>));

}  // namespace

}  // namespace titan::ops

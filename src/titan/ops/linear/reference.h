#pragma once
// The gradient loops of the linear reference (y = x w^T): typed, in the accumulation type A. The
// linear_cross_entropy reference runs its lm_head gradients through the same loops.
#include <cstdint>

namespace titan::ops {

// dx[M, K] = dy[M, N] w[N, K] and dw[N, K] = dy^T x[M, K], each skipped when null; sums in order.
template <class T, class A>
void linear_backward_loops(int64_t M, int64_t N, int64_t K, const T* x, const T* w, const A* dy, A* dx, A* dw) {
  if (dx)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        A acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[m * N + n] * A(w[n * K + k]);
        dx[m * K + k] = acc;
      }
  if (dw)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        A acc = 0;
        for (int64_t m = 0; m < M; ++m) acc += dy[m * N + n] * A(x[m * K + k]);
        dw[n * K + k] = acc;
      }
}

}  // namespace titan::ops

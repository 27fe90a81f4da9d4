#pragma once
// The gradient loops of the linear reference (y = x w^T): typed, in the accumulation type A. The
// linear_cross_entropy reference runs its lm_head gradients through the same loops.
#include <cstdint>

namespace titan::ops {

// out[r, k] = sum over j in order of dy(r, j) * b[j, k] for r < R, k < K, with dy(r, j) at
// dy[r * row_stride + j * col_stride] and b [J, K]; with `add`, the sum is added to out[r, k] (one
// rounding, as adding a separately computed gradient would).
template <class T, class A>
void weighted_row_sums(int64_t R, int64_t J, int64_t K, const A* dy, int64_t row_stride, int64_t col_stride,
                       const T* b, A* out, bool add = false) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      A acc = 0;
      for (int64_t j = 0; j < J; ++j) acc += dy[r * row_stride + j * col_stride] * A(b[j * K + k]);
      out[r * K + k] = add ? out[r * K + k] + acc : acc;
    }
}

// dx[M, K] = dy[M, N] w[N, K] and dw[N, K] = dy^T x[M, K], each skipped when null, each added to
// what is there with add_dx / add_dw.
template <class T, class A>
void linear_backward_loops(int64_t M, int64_t N, int64_t K, const T* x, const T* w, const A* dy, A* dx, A* dw,
                           bool add_dx = false, bool add_dw = false) {
  if (dx) weighted_row_sums(M, N, K, dy, N, 1, w, dx, add_dx);
  if (dw) weighted_row_sums(N, M, K, dy, 1, N, x, dw, add_dw);
}

}  // namespace titan::ops

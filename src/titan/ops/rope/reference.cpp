// The reference kernels of rope: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include "titan/ops/rope/rope.h"

#include <cmath>
#include <map>
#include <mutex>

#include "titan/core/check.h"
#include "titan/kernels/registry.h"

namespace titan::ops {

namespace {
// Reference: T is the element type (arithmetic results round to it, as torch does in that dtype),
// A the type cos/sin are computed in.

// Calls rotate(row, j, half, c, s) for every token, pair (j, j + D/2) and head, with `row` the
// offset of the head's D elements and c, s the pair's cos and sin rounded to T.
template <class T, class A, class Rotate>
void for_each_pair_ref(int64_t BS, int64_t H, int64_t D, const int64_t* pos, const RopeTable& table,
                       Rotate rotate) {
  const int64_t half = D / 2;
  for (int64_t bs = 0; bs < BS; ++bs)
    for (int64_t j = 0; j < half; ++j) {
      A c, s;
      rope_cos_sin(table.theta, D, pos[bs], j, &c, &s);
      const A ct = A(T(c)), st = A(T(s));
      for (int64_t h = 0; h < H; ++h) rotate((bs * H + h) * D, j, half, ct, st);
    }
}

template <class T, class A>
void rope_forward_ref(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D,
                      const int64_t* pos, const RopeTable& table, const void* xv, void* yv) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  for_each_pair_ref<T, A>(B * S, H, D, pos, table, [&](int64_t row, int64_t j, int64_t half, A ct, A st) {
    const T x1 = x[row + j], x2 = x[row + j + half];
    y[row + j] = T(A(T(A(x1) * ct)) + A(T(-A(x2) * st)));
    y[row + j + half] = T(A(T(A(x2) * ct)) + A(T(A(x1) * st)));
  });
}

// The transpose rotation, in A (gradients are f32 or f64).
template <class T, class A>
void rope_backward_ref(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D,
                       const int64_t* pos, const RopeTable& table, const void* dyv, void* dxv) {
  const A* g = static_cast<const A*>(dyv);
  A* d = static_cast<A*>(dxv);
  for_each_pair_ref<T, A>(B * S, H, D, pos, table, [&](int64_t row, int64_t j, int64_t half, A ct, A st) {
    d[row + j] = g[row + j] * ct + g[row + j + half] * st;
    d[row + j + half] = g[row + j + half] * ct - g[row + j] * st;
  });
}

const bool registered = kernels::register_reference_kernels(
    "rope", "cos/sin per element", "cos/sin in f32, bf16 arithmetic as torch",
    TITAN_REFERENCE_KERNEL(RopeKernel, rope_forward_ref<T, Acc>, rope_backward_ref<T, Acc>, false));

}  // namespace

}  // namespace titan::ops

// The reference kernels of rope: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <cmath>
#include <map>
#include <mutex>

#include "titan/kernels/registry.h"
#include "titan/ops/rope/rope.h"

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

// Each pair (x1, x2) = (x[j], x[j + D/2]) becomes (x1 c - x2 s, x2 c + x1 s), each product and sum
// rounded to E: the forward in T (as torch), the backward (kTranspose) as the transpose rotation
// (s -> -s, exact) of gradients in A.
template <class T, class A, class E, bool kTranspose>
void rope_rotate_ref(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D,
                     const int64_t* pos, const RopeTable& table, const void* xv, void* yv) {
  const E* x = static_cast<const E*>(xv);
  E* y = static_cast<E*>(yv);
  for_each_pair_ref<T, A>(B * S, H, D, pos, table, [&](int64_t row, int64_t j, int64_t half, A ct, A st) {
    if (kTranspose) st = -st;
    const E x1 = x[row + j], x2 = x[row + j + half];
    y[row + j] = E(A(E(A(x1) * ct)) + A(E(-A(x2) * st)));
    y[row + j + half] = E(A(E(A(x2) * ct)) + A(E(A(x1) * st)));
  });
}

const bool registered = kernels::register_reference_kernels(
    "rope", "cos/sin per element", "cos/sin in f32, bf16 arithmetic as torch",
    TITAN_REFERENCE_KERNEL(RopeKernel, rope_rotate_ref<T, Acc, T, false>, rope_rotate_ref<T, Acc, Acc, true>,
                           false));

}  // namespace

}  // namespace titan::ops

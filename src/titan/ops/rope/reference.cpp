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
template <class T, class A>
void rope_forward_ref(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos, const RopeTable& table,
                      const void* xv, void* yv) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const int64_t half = D / 2;
  for (int64_t bs = 0; bs < B * S; ++bs)
    for (int64_t j = 0; j < half; ++j) {
      A c, s;
      rope_cos_sin(table.theta, D, pos[bs], j, &c, &s);
      const T ct = T(c), st = T(s);
      for (int64_t h = 0; h < H; ++h) {
        const T* xr = x + (bs * H + h) * D;
        T* yr = y + (bs * H + h) * D;
        const T x1 = xr[j], x2 = xr[j + half];
        yr[j] = T(A(T(A(x1) * A(ct))) + A(T(-A(x2) * A(st))));
        yr[j + half] = T(A(T(A(x2) * A(ct))) + A(T(A(x1) * A(st))));
      }
    }
}

template <class T, class A>
void rope_backward_ref(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos, const RopeTable& table,
                       const void* dyv, void* dxv) {
  const A* dy = static_cast<const A*>(dyv);
  A* dx = static_cast<A*>(dxv);
  const int64_t half = D / 2;
  for (int64_t bs = 0; bs < B * S; ++bs)
    for (int64_t j = 0; j < half; ++j) {
      A c, s;
      rope_cos_sin(table.theta, D, pos[bs], j, &c, &s);
      const A ct = A(T(c)), st = A(T(s));
      for (int64_t h = 0; h < H; ++h) {
        const A* g = dy + (bs * H + h) * D;
        A* d = dx + (bs * H + h) * D;
        d[j] = g[j] * ct + g[j + half] * st;
        d[j + half] = g[j + half] * ct - g[j] * st;
      }
    }
}

const bool registered = kernels::register_reference_kernels(
    "rope",
    {"cos/sin per element, f64", "cos/sin per element, f32",
     "cos/sin per element in f32, bf16 arithmetic as torch"},
    []<class T, class Acc>(kernels::ReferenceTypes<T, Acc>) {
      return RopeKernel{rope_forward_ref<T, Acc>, rope_backward_ref<T, Acc>, false};
    });

}  // namespace

}  // namespace titan::ops

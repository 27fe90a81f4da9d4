// The reference kernels of cross_entropy: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include "titan/ops/linear/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan::ops {

namespace {
// Reference kernels: one row at a time, textbook formulas, accumulation type A (f64 for f64, else f32).
template <class A>
void row_stats_ref(const A* x, int64_t V, int64_t label, A* lse, A* loss) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
  A s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - m);
  *lse = m + std::log(s);
  *loss = *lse - x[label];
}

template <class T, class A>
void ce_forward_ref(const KernelContext& ctx, int64_t N, int64_t V, const void* logits_v, const int64_t* labels, int64_t ignore_index,
                    void* lse_v, void* loss_v) {
  const T* logits = static_cast<const T*>(logits_v);
  A *lse = static_cast<A*>(lse_v), *loss = static_cast<A*>(loss_v);
  std::vector<A> row(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n) {
    lse[n] = loss[n] = 0;
    if (labels[n] == ignore_index) continue;
    for (int64_t v = 0; v < V; ++v) row[size_t(v)] = A(logits[n * V + v]);
    row_stats_ref(row.data(), V, labels[n], &lse[n], &loss[n]);
  }
}

template <class T, class A>
void ce_backward_ref(const KernelContext& ctx, int64_t N, int64_t V, const void* logits_v, const int64_t* labels, int64_t ignore_index,
                     const void* lse_v, double scale, void* dlogits_v) {
  const T* logits = static_cast<const T*>(logits_v);
  const A* lse = static_cast<const A*>(lse_v);
  A* dl = static_cast<A*>(dlogits_v);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      A p = labels[n] == ignore_index ? A(0) : std::exp(A(logits[n * V + v]) - lse[n]) - A(v == labels[n]);
      dl[n * V + v] = A(scale) * p;
    }
}

// Linear + cross-entropy reference: materialises all logits (it is the reference).
template <class T, class A>
std::vector<A> lce_logits_ref(const LinearCrossEntropyArgs& a) {
  const T *h = static_cast<const T*>(a.hidden), *w = static_cast<const T*>(a.weight);
  std::vector<A> logits(static_cast<size_t>(a.N * a.V));
  for (int64_t n = 0; n < a.N; ++n)
    for (int64_t v = 0; v < a.V; ++v) {
      A acc = 0;
      for (int64_t k = 0; k < a.D; ++k) acc += A(h[n * a.D + k]) * A(w[v * a.D + k]);
      logits[size_t(n * a.V + v)] = a.round_logits ? A(T(acc)) : acc;
    }
  return logits;
}

template <class T, class A>
void lce_forward_ref(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void* lse_v, void* loss_v) {
  std::vector<A> logits = lce_logits_ref<T, A>(a);
  A *lse = static_cast<A*>(lse_v), *loss = static_cast<A*>(loss_v);
  for (int64_t n = 0; n < a.N; ++n) {
    lse[n] = loss[n] = 0;
    if (a.labels[n] != a.ignore_index)
      row_stats_ref(&logits[size_t(n * a.V)], a.V, a.labels[n], &lse[n], &loss[n]);
  }
}

// dlogits is rounded to the storage type before the products: the GEMMs of a bf16 lm_head take bf16 operands.
template <class T, class A>
void lce_backward_ref(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void* lse_v,
                      double scale, void* dh_v, void* dw_v, bool add_dw) {
  std::vector<A> dl = lce_logits_ref<T, A>(a);
  const A* lse = static_cast<const A*>(lse_v);
  for (int64_t n = 0; n < a.N; ++n)
    for (int64_t v = 0; v < a.V; ++v) {
      A& x = dl[size_t(n * a.V + v)];
      A p = a.labels[n] == a.ignore_index ? A(0) : std::exp(x - lse[n]) - A(v == a.labels[n]);
      x = A(T(A(scale) * p));
    }
  // The lm_head's gradients: dh = dlogits w, dw = dlogits^T h, linear's reference loops.
  linear_backward_loops<T, A>(a.N, a.V, a.D, static_cast<const T*>(a.hidden), static_cast<const T*>(a.weight),
                              dl.data(), static_cast<A*>(dh_v), static_cast<A*>(dw_v), /*add_dx=*/false,
                              add_dw);
}

const bool cross_entropy_kernels_registered = kernels::register_reference_kernels(
    "cross_entropy", "row loops", "logits widened to f32",
    TITAN_REFERENCE_KERNEL(CrossEntropyKernel, ce_forward_ref<T, Acc>, ce_backward_ref<T, Acc>));
const bool linear_cross_entropy_kernels_registered = kernels::register_reference_kernels(
    "linear_cross_entropy", "materialises all logits, loops", "bf16 operands, f32 math",
    TITAN_REFERENCE_KERNEL(LinearCrossEntropyKernel, lce_forward_ref<T, Acc>, lce_backward_ref<T, Acc>));

}  // namespace

}  // namespace titan::ops

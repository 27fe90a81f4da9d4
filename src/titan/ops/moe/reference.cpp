// The reference kernels of moe: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <algorithm>
#include <cmath>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/moe/moe.h"

namespace titan::ops {

void moe_routing_order(const MoeDims& d, const int64_t* indices, int64_t* order, int64_t* pos,
                       int64_t* offsets) {
  const int64_t n = d.T * d.k;
  std::fill(offsets, offsets + d.E + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++offsets[indices[i] + 1];
  for (int64_t e = 0; e < d.E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + d.E);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = next[size_t(indices[i])]++;
    order[r] = i;
    pos[i] = r;
  }
}

namespace {
// ---------------------------------------------------------------------------------------------
// Router. A = f64 for f64 logits, f32 otherwise (transformers: softmax(logits, dtype=float32)).
// Rows are independent; the loops are threaded over tokens.
template <class T, class A>
void router_forward_ref(const KernelContext& ctx, int64_t T_, int64_t E, int64_t k, bool renormalize,
                        const void* lv, const float* bias, void* wv, int64_t* indices, void* pv, int64_t* counts) {
  const T* logits = static_cast<const T*>(lv);
  A *weights = static_cast<A*>(wv), *probs = static_cast<A*>(pv);
#pragma omp parallel for schedule(static) if (T_ * E > 65536)
  for (int64_t t = 0; t < T_; ++t) {
    const T* l = logits + t * E;
    A* p = probs + t * E;
    A m = -INFINITY;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, A(l[e]));
    A sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(A(l[e]) - m);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    // k passes of "best not yet chosen": strict > keeps the lower index on ties and always yields
    // a valid, unused expert even when scores are NaN.
    std::vector<char> chosen(size_t(E), 0);
    A total = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      A best_score = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (chosen[size_t(e)]) continue;
        A s = bias ? A(p[e] + A(bias[e])) : p[e];
        if (best < 0 || s > best_score) best = e, best_score = s;
      }
      chosen[size_t(best)] = 1;
      indices[t * k + j] = best;
      total += weights[t * k + j] = p[best];
    }
    if (renormalize)
      for (int64_t j = 0; j < k; ++j) weights[t * k + j] /= total;
  }
  for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  for (int64_t i = 0; i < T_ * k; ++i) ++counts[indices[i]];
}

template <class A>
void router_backward_ref(const KernelContext& ctx, int64_t T_, int64_t E, int64_t k, bool renormalize, const void* pv,
                         const int64_t* indices, const void* dwv, const void* dpv, void* dlv) {
  const A *probs = static_cast<const A*>(pv), *dw = static_cast<const A*>(dwv),
          *dprobs = static_cast<const A*>(dpv);
  A* dlogits = static_cast<A*>(dlv);
#pragma omp parallel for schedule(static) if (T_ * E > 65536)
  for (int64_t t = 0; t < T_; ++t) {
    const A* p = probs + t * E;
    const int64_t* idx = indices + t * k;
    std::vector<A> dp(size_t(E), A(0));
    if (dprobs)
      for (int64_t e = 0; e < E; ++e) dp[size_t(e)] = dprobs[t * E + e];
    if (dw) {
      if (renormalize) {  // w_j = p_j / S: dp_j += (dw_j - sum_m dw_m w_m) / S
        A S = 0, dot = 0;
        for (int64_t j = 0; j < k; ++j) S += p[idx[j]];
        for (int64_t j = 0; j < k; ++j) dot += dw[t * k + j] * (p[idx[j]] / S);
        for (int64_t j = 0; j < k; ++j) dp[size_t(idx[j])] += (dw[t * k + j] - dot) / S;
      } else {
        for (int64_t j = 0; j < k; ++j) dp[size_t(idx[j])] += dw[t * k + j];
      }
    }
    A s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e] * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = p[e] * (dp[size_t(e)] - s);
  }
}

const bool router_topk_kernels_registered = kernels::register_reference_kernels(
    "router_topk", "softmax + k selection passes, OpenMP over tokens", "bf16 logits, f32 math",
    TITAN_REFERENCE_KERNEL(RouterKernel, router_forward_ref<T, Acc>, router_backward_ref<Acc>));

// ---------------------------------------------------------------------------------------------
// Aux loss: counts and probability column sums per expert, in layer then row order (f64).
template <class A>
void aux_accumulate_ref(const KernelContext& ctx, int64_t T_, int64_t E, int64_t k, const void* pv,
                        const int64_t* indices, int64_t* counts, double* psum) {
  const A* p = static_cast<const A*>(pv);
  for (int64_t i = 0; i < T_ * k; ++i) ++counts[indices[i]];
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t e = 0; e < E; ++e) psum[e] += double(p[t * E + e]);
}

template <class A>
void aux_finish_ref(const KernelContext& ctx, int64_t E, double scale, const int64_t* counts, const double* psum,
                    void* loss) {
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += double(counts[e]) * psum[e];
  *static_cast<A*>(loss) = A(aux * scale);
}

template <class A>
void aux_backward_ref(const KernelContext& ctx, int64_t T_, int64_t E, double scale, const int64_t* counts,
                      const void* dloss, void* dpv) {
  const double g0 = double(*static_cast<const A*>(dloss)) * scale;
  A* d = static_cast<A*>(dpv);
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t e = 0; e < E; ++e) d[t * E + e] = A(g0 * double(counts[e]));
}

const bool moe_aux_loss_kernels_registered = kernels::register_kernels(
    "moe_aux_loss", Device::CPU,
    {{DType::F64, "reference", "serial sums in f64",
      MoeAuxLossKernel{aux_accumulate_ref<double>, aux_finish_ref<double>, aux_backward_ref<double>}},
     {DType::F32, "reference", "serial sums in f64, f32 probs and gradients",
      MoeAuxLossKernel{aux_accumulate_ref<float>, aux_finish_ref<float>, aux_backward_ref<float>}}});

// Expert bias: each expert's tokens summed over the micro-batches (exact, i64), the mean load in
// f64 in expert order, every step delta = coeff x sign(mean - load) less the deltas' mean (as
// torchtitan: the biases keep their mean), one f32 add per expert.
void expert_bias_ref(const KernelContext&, int64_t M, int64_t E, const int64_t* counts, double coeff,
                     float* bias) {
  std::vector<double> delta(size_t(E), 0.0);
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t load = 0;
    for (int64_t m = 0; m < M; ++m) load += counts[m * E + e];
    delta[size_t(e)] = double(load);
    mean += double(load) / double(E);
  }
  double delta_mean = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double d = mean - delta[size_t(e)];
    delta[size_t(e)] = coeff * double((d > 0) - (d < 0));
    delta_mean += delta[size_t(e)] / double(E);
  }
  for (int64_t e = 0; e < E; ++e) bias[e] = bias[e] + float(delta[size_t(e)] - delta_mean);
}

void expert_count_ref(const KernelContext&, int64_t n, int64_t E, const int64_t* indices, int64_t* counts) {
  for (int64_t i = 0; i < n; ++i) ++counts[indices[i]];
}

const bool expert_counts_kernels_registered = kernels::register_kernels(
    "expert_counts", Device::CPU,
    {{DType::I64, "reference", "serial histogram", ExpertCountKernel{expert_count_ref}}});

const bool update_expert_bias_kernels_registered = kernels::register_kernels(
    "update_expert_bias", Device::CPU,
    {{DType::F32, "reference", "serial: i64 loads, f64 means in expert order, one f32 add per expert",
      ExpertBiasKernel{expert_bias_ref}}});

// ---------------------------------------------------------------------------------------------
// Experts, reference: one (token, slot) at a time with dot-product loops. T is the storage type
// (rounding points), A the arithmetic type.
template <class A>
A sigmoid(A v) {
  return A(1) / (A(1) + std::exp(-v));
}

template <class T, class A>
void experts_forward_ref(const KernelContext& ctx, const MoeDims& d, const void* xv, const void* wv, const int64_t* indices,
                         const void* wgv, const void* wuv, const void* wdv, void* actv, void* yv) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv);
  const A* weights = static_cast<const A*>(wv);
  T *act = static_cast<T*>(actv), *y = static_cast<T*>(yv);
  const int64_t D = d.D, F = d.F, k = d.k, n = d.T * d.k;
  std::vector<int64_t> order(n), pos(n), offsets(d.E + 1);
  moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
  std::vector<T> h(F), acc(D);
  std::vector<int64_t> rows(k);
  for (int64_t t = 0; t < d.T; ++t) {
    std::fill(acc.begin(), acc.end(), T(A(0)));
    // Routing order is expert order: visiting rows in increasing pos adds experts in ascending order.
    rows.assign(pos.begin() + t * k, pos.begin() + t * k + k);
    std::sort(rows.begin(), rows.end());
    for (int64_t r : rows) {
      const int64_t i = order[size_t(r)], e = indices[i];
      const T* xt = x + t * D;
      T* a = act + r * 2 * F;
      for (int64_t f = 0; f < F; ++f) {
        A g = 0, u = 0;
        for (int64_t c = 0; c < D; ++c) {
          g += A(xt[c]) * A(wg[(e * F + f) * D + c]);
          u += A(xt[c]) * A(wu[(e * F + f) * D + c]);
        }
        a[f] = T(g);
        a[F + f] = T(u);
        A gv = A(a[f]);
        h[size_t(f)] = T(A(T(gv * sigmoid(gv))) * A(a[F + f]));
      }
      const A w = A(T(weights[i]));
      for (int64_t c = 0; c < D; ++c) {
        A o = 0;
        for (int64_t f = 0; f < F; ++f) o += A(h[size_t(f)]) * A(wd[(e * D + c) * F + f]);
        acc[size_t(c)] = T(A(acc[size_t(c)]) + A(T(A(T(o)) * w)));
      }
    }
    for (int64_t c = 0; c < D; ++c) y[t * D + c] = acc[size_t(c)];
  }
}

template <class T, class A>
void experts_backward_ref(const KernelContext& ctx, const MoeDims& d, const void* xv, const void* wv,
                          const int64_t* indices, const void* wgv, const void* wuv, const void* wdv,
                          const void* actv, const void* dyv, void* dxv, void* dwv, void* dwgv, void* dwuv,
                          void* dwdv, bool add_dweights) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv), *act = static_cast<const T*>(actv);
  const A *weights = static_cast<const A*>(wv), *dy = static_cast<const A*>(dyv);
  A *dx = static_cast<A*>(dxv), *dw = static_cast<A*>(dwv), *dwg = static_cast<A*>(dwgv),
    *dwu = static_cast<A*>(dwuv), *dwd = static_cast<A*>(dwdv);
  const int64_t D = d.D, F = d.F, k = d.k, E = d.E, n = d.T * d.k;
  if (dx) std::fill(dx, dx + d.T * D, A(0));
  if (!add_dweights) {
    if (dwg) std::fill(dwg, dwg + E * F * D, A(0));
    if (dwu) std::fill(dwu, dwu + E * F * D, A(0));
    if (dwd) std::fill(dwd, dwd + E * D * F, A(0));
  }
  std::vector<int64_t> order(n), pos(n), offsets(E + 1);
  moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
  std::vector<A> h(F), s(F), dh(F), dg(F), du(F);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i / k, e = indices[i];
    const T* a = act + pos[size_t(i)] * 2 * F;
    const T* xt = x + t * D;
    const A* dyt = dy + t * D;
    const A w = A(T(weights[i]));
    for (int64_t f = 0; f < F; ++f) {
      A g = A(a[f]);
      s[size_t(f)] = A(T(g * sigmoid(g)));
      h[size_t(f)] = A(T(s[size_t(f)] * A(a[F + f])));
    }
    if (dw) {  // d(o . w)/dw with o the rounded down-projection output, as torch's mul backward
      A acc = 0;
      for (int64_t c = 0; c < D; ++c) {
        A o = 0;
        for (int64_t f = 0; f < F; ++f) o += h[size_t(f)] * A(wd[(e * D + c) * F + f]);
        acc += dyt[c] * A(T(o));
      }
      dw[i] = acc;
    }
    for (int64_t f = 0; f < F; ++f) {
      A acc = 0;
      for (int64_t c = 0; c < D; ++c) acc += dyt[c] * A(wd[(e * D + c) * F + f]);
      dh[size_t(f)] = w * acc;
    }
    if (dwd)
      for (int64_t c = 0; c < D; ++c)
        for (int64_t f = 0; f < F; ++f) dwd[(e * D + c) * F + f] += w * dyt[c] * h[size_t(f)];
    for (int64_t f = 0; f < F; ++f) {
      A g = A(a[f]), sg = sigmoid(g);
      dg[size_t(f)] = dh[size_t(f)] * A(a[F + f]) * sg * (A(1) + g * (A(1) - sg));
      du[size_t(f)] = dh[size_t(f)] * s[size_t(f)];
    }
    for (int64_t f = 0; f < F; ++f)
      for (int64_t c = 0; c < D; ++c) {
        if (dx)
          dx[t * D + c] +=
              dg[size_t(f)] * A(wg[(e * F + f) * D + c]) + du[size_t(f)] * A(wu[(e * F + f) * D + c]);
        if (dwg) dwg[(e * F + f) * D + c] += dg[size_t(f)] * A(xt[c]);
        if (dwu) dwu[(e * F + f) * D + c] += du[size_t(f)] * A(xt[c]);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Combine: moe_experts' weighted un-permute on rows computed elsewhere (expert parallelism), with
// its rounding points: T(A(acc) + A(T(A(row) * w))) in ascending expert order.
template <class T, class A>
void combine_forward_ref(const KernelContext&, const MoeDims& d, const void* rv, const void* wv,
                         const int64_t* indices, void* yv) {
  const T* rows = static_cast<const T*>(rv);
  const A* weights = static_cast<const A*>(wv);
  T* y = static_cast<T*>(yv);
  const int64_t D = d.D, k = d.k, n = d.T * d.k;
  std::vector<int64_t> order(n), pos(n), offsets(d.E + 1);
  moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
  // Tokens are independent: threaded over them (the layer's own path under expert parallelism).
#pragma omp parallel for schedule(static) if (n * D > 65536)
  for (int64_t t = 0; t < d.T; ++t) {
    std::vector<T> acc(D, T(A(0)));
    std::vector<int64_t> slots(pos.begin() + t * k, pos.begin() + t * k + k);
    std::sort(slots.begin(), slots.end());  // routing order is expert order
    for (int64_t r : slots) {
      const A w = A(T(weights[order[size_t(r)]]));
      const T* row = rows + r * D;
      for (int64_t c = 0; c < D; ++c) acc[size_t(c)] = T(A(acc[size_t(c)]) + A(T(A(row[c]) * w)));
    }
    for (int64_t c = 0; c < D; ++c) y[t * D + c] = acc[size_t(c)];
  }
}

template <class T, class A>
void combine_backward_ref(const KernelContext&, const MoeDims& d, const void* rv, const void* wv,
                          const int64_t* indices, const void* dyv, void* drv, void* dwv) {
  const T* rows = static_cast<const T*>(rv);
  const A *weights = static_cast<const A*>(wv), *dy = static_cast<const A*>(dyv);
  A *drows = static_cast<A*>(drv), *dweights = static_cast<A*>(dwv);
  const int64_t D = d.D, k = d.k, n = d.T * d.k;
  std::vector<int64_t> order(n), pos(n), offsets(d.E + 1);
  moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
#pragma omp parallel for schedule(static) if (n * D > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i / k, r = pos[size_t(i)];
    const A* dyt = dy + t * D;
    const T* row = rows + r * D;
    if (dweights) {  // d(row . w)/dw with the row as it is stored, as torch's mul backward
      A acc = 0;
      for (int64_t c = 0; c < D; ++c) acc += dyt[c] * A(row[c]);
      dweights[i] = acc;
    }
    if (drows) {
      const A w = A(T(weights[i]));
      for (int64_t c = 0; c < D; ++c) drows[r * D + c] = w * dyt[c];
    }
  }
}

const bool moe_combine_kernels_registered = kernels::register_reference_kernels(
    "moe_combine", "per token loops, threaded over tokens", "f32 math, transformers' bf16 rounding points",
    TITAN_REFERENCE_KERNEL(MoeCombineKernel, combine_forward_ref<T, Acc>, combine_backward_ref<T, Acc>));

const bool moe_experts_kernels_registered = kernels::register_reference_kernels(
    "moe_experts", "per (token, slot) dot-product loops", "f32 math, transformers' bf16 rounding points",
    TITAN_REFERENCE_KERNEL(MoeExpertsKernel, experts_forward_ref<T, Acc>, experts_backward_ref<T, Acc>));

}  // namespace

}  // namespace titan::ops

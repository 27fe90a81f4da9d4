#include "titan/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise.h"

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

TITAN_REGISTER_KERNEL(router_topk_f64_ref,
                      {"router_topk",
                       Device::CPU,
                       DType::F64,
                       "reference",
                       "softmax + k selection passes in f64, OpenMP over tokens",
                       RouterKernel{router_forward_ref<double, double>, router_backward_ref<double>},
                       {}});
TITAN_REGISTER_KERNEL(router_topk_f32_ref,
                      {"router_topk",
                       Device::CPU,
                       DType::F32,
                       "reference",
                       "softmax + k selection passes in f32, OpenMP over tokens",
                       RouterKernel{router_forward_ref<float, float>, router_backward_ref<float>},
                       {}});
TITAN_REGISTER_KERNEL(router_topk_bf16_ref,
                      {"router_topk",
                       Device::CPU,
                       DType::BF16,
                       "reference",
                       "bf16 logits, softmax + k selection passes in f32, OpenMP over tokens",
                       RouterKernel{router_forward_ref<Bf16, float>, router_backward_ref<float>},
                       {}});

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

TITAN_REGISTER_KERNEL(moe_aux_loss_f64_ref, {"moe_aux_loss", Device::CPU, DType::F64, "reference",
                                             "serial sums in f64",
                                             MoeAuxLossKernel{aux_accumulate_ref<double>, aux_finish_ref<double>,
                                                              aux_backward_ref<double>},
                                             {}});
TITAN_REGISTER_KERNEL(moe_aux_loss_f32_ref, {"moe_aux_loss", Device::CPU, DType::F32, "reference",
                                             "serial sums in f64, f32 probs and gradients",
                                             MoeAuxLossKernel{aux_accumulate_ref<float>, aux_finish_ref<float>,
                                                              aux_backward_ref<float>},
                                             {}});

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
void experts_backward_ref(const KernelContext& ctx, const MoeDims& d, const void* xv, const void* wv, const int64_t* indices,
                          const void* wgv, const void* wuv, const void* wdv, const void* actv,
                          const void* dyv, void* dxv, void* dwv, void* dwgv, void* dwuv, void* dwdv) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv), *act = static_cast<const T*>(actv);
  const A *weights = static_cast<const A*>(wv), *dy = static_cast<const A*>(dyv);
  A *dx = static_cast<A*>(dxv), *dw = static_cast<A*>(dwv), *dwg = static_cast<A*>(dwgv),
    *dwu = static_cast<A*>(dwuv), *dwd = static_cast<A*>(dwdv);
  const int64_t D = d.D, F = d.F, k = d.k, E = d.E, n = d.T * d.k;
  if (dx) std::fill(dx, dx + d.T * D, A(0));
  if (dwg) std::fill(dwg, dwg + E * F * D, A(0));
  if (dwu) std::fill(dwu, dwu + E * F * D, A(0));
  if (dwd) std::fill(dwd, dwd + E * D * F, A(0));
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

TITAN_REGISTER_KERNEL(moe_experts_f64_ref, {"moe_experts",
                                            Device::CPU,
                                            DType::F64,
                                            "reference",
                                            "per (token, slot) dot-product loops, f64",
                                            MoeExpertsKernel{experts_forward_ref<double, double>,
                                                             experts_backward_ref<double, double>},
                                            {}});
TITAN_REGISTER_KERNEL(moe_experts_f32_ref, {"moe_experts",
                                            Device::CPU,
                                            DType::F32,
                                            "reference",
                                            "per (token, slot) dot-product loops, f32",
                                            MoeExpertsKernel{experts_forward_ref<float, float>,
                                                             experts_backward_ref<float, float>},
                                            {}});
TITAN_REGISTER_KERNEL(moe_experts_bf16_ref,
                      {"moe_experts",
                       Device::CPU,
                       DType::BF16,
                       "reference",
                       "per (token, slot) dot-product loops, f32 math, transformers' bf16 "
                       "rounding points",
                       MoeExpertsKernel{experts_forward_ref<Bf16, float>, experts_backward_ref<Bf16, float>},
                       {}});

bool is_compute_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16;
}

void check_indices(const char* op, const Tensor& indices, int64_t E) {
  const int64_t bad = first_index_outside(indices, 0, E, /*allowed=*/0);
  if (bad >= 0)
    TITAN_FAIL(op, ": indices ", indices.str(), " element ", bad, " (token ", bad / indices.size(1), ", slot ",
               bad % indices.size(1), ") is ", int64_t(indices.reshape({-1}).narrow(0, bad, 1).item()),
               ", outside [0, ", E, ")");
}

}  // namespace

RouterOutput router_topk(const Tensor& logits_in, int64_t k, bool renormalize, const Tensor& expert_bias) {
  TITAN_CHECK(logits_in.dim() == 2, "router_topk: logits must be [T, E], got ", logits_in.str());
  TITAN_CHECK(is_compute_float(logits_in.dtype()), "router_topk: logits ", logits_in.str(),
              " must be f32, bf16 or f64");
  const int64_t T = logits_in.size(0), E = logits_in.size(1);
  TITAN_CHECK(k >= 1 && k <= E, "router_topk: k=", k, " must be in [1, E] for logits ", logits_in.str());
  Tensor bias;
  if (expert_bias.defined()) {
    TITAN_CHECK(expert_bias.dim() == 1 && expert_bias.size(0) == E && expert_bias.dtype() == DType::F32,
                "router_topk: expert_bias ", expert_bias.str(), " must be f32[", E, "] for logits ",
                logits_in.str());
    bias = expert_bias.contiguous();
  }
  Tensor logits = logits_in.contiguous().detach();
  const DType gd = grad_dtype(logits.dtype());
  const auto& kernel = kernels::kernel_for<RouterKernel>("router_topk", logits.device(), logits.dtype());
  const KernelContext ctx = device_services(logits.device()).context();
  RouterOutput out;
  out.weights = Tensor::empty({T, k}, gd, logits.device());
  out.indices = Tensor::empty({T, k}, DType::I64, logits.device());
  out.probs = Tensor::empty({T, E}, gd, logits.device());
  out.counts = Tensor::empty({E}, DType::I64, logits.device());
  kernel.forward(ctx, T, E, k, renormalize, logits.raw_data(), bias.defined() ? bias.data<float>() : nullptr,
                 out.weights.raw_data(), out.indices.data<int64_t>(), out.probs.raw_data(),
                 out.counts.data<int64_t>());
  if (autograd::needs_grad({&logits_in})) {
    Tensor probs = out.probs.detach(), indices = out.indices;
    autograd::record("router_topk", {logits_in}, {&out.weights, &out.probs},
                     [=, &kernel](const std::vector<Tensor>& g) {
                       Tensor dw = g[0].defined() ? g[0].contiguous() : Tensor();
                       Tensor dp = g[1].defined() ? g[1].contiguous() : Tensor();
                       Tensor dl = Tensor::empty({T, E}, gd, logits.device());
                       kernel.backward(ctx, T, E, k, renormalize, probs.raw_data(), indices.data<int64_t>(),
                                       dw.defined() ? dw.raw_data() : nullptr,
                                       dp.defined() ? dp.raw_data() : nullptr, dl.raw_data());
                       return std::vector<Tensor>{dl};
                     });
  }
  return out;
}

Tensor moe_aux_loss(const std::vector<Tensor>& probs_per_layer, const std::vector<Tensor>& indices_per_layer,
                    int64_t num_experts, int64_t k) {
  const int64_t E = num_experts;
  TITAN_CHECK(!probs_per_layer.empty() && probs_per_layer.size() == indices_per_layer.size(),
              "moe_aux_loss: need one probs and one indices tensor per layer, got ", probs_per_layer.size(),
              " probs and ", indices_per_layer.size(), " indices");
  TITAN_CHECK(E >= 1 && k >= 1 && k <= E, "moe_aux_loss: k=", k, " must be in [1, E] with E=", E);
  const DType dt = probs_per_layer[0].dtype();
  TITAN_CHECK(dt == DType::F32 || dt == DType::F64, "moe_aux_loss: probs ", probs_per_layer[0].str(),
              " must be f32 or f64");
  const Device device = probs_per_layer[0].device();
  const auto& kernel = kernels::kernel_for<MoeAuxLossKernel>("moe_aux_loss", device, dt);
  const KernelContext ctx = device_services(device).context();
  Tensor counts = Tensor::zeros({E}, DType::I64, device), psum = Tensor::zeros({E}, DType::F64, device);
  int64_t N = 0;
  std::vector<Tensor> probs;
  for (size_t l = 0; l < probs_per_layer.size(); ++l) {
    const Tensor &p = probs_per_layer[l], &ix = indices_per_layer[l];
    TITAN_CHECK(p.dim() == 2 && p.size(1) == E && p.dtype() == dt && p.device() == device, "moe_aux_loss: layer ",
                l, " probs ", p.str(), " must be [T, ", E, "] in ", dtype_name(dt), " on ", device_name(device));
    TITAN_CHECK(ix.dim() == 2 && ix.size(0) == p.size(0) && ix.size(1) == k && ix.dtype() == DType::I64,
                "moe_aux_loss: layer ", l, " indices ", ix.str(), " must be i64[", p.size(0), ", ", k,
                "] to match probs ", p.str());
    Tensor ixc = ix.contiguous(), pc = p.contiguous().detach();
    check_indices("moe_aux_loss", ixc, E);
    kernel.accumulate(ctx, p.size(0), E, k, pc.raw_data(), ixc.data<int64_t>(), counts.data<int64_t>(),
                      psum.data<double>());
    N += p.size(0);
    probs.push_back(p);
  }
  TITAN_CHECK(N > 0, "moe_aux_loss: no tokens");
  // aux = E / N^2 * sum_e count_e * psum_e; d aux / d p[t, e] = E * count_e / N^2.
  const double scale = double(E) / (double(N) * double(N));
  Tensor loss = Tensor::empty({1}, dt, device);
  kernel.finish(ctx, E, scale, counts.data<int64_t>(), psum.data<double>(), loss.raw_data());
  if (autograd::needs_grad(probs)) {
    autograd::record("moe_aux_loss", probs, {&loss}, [=, &kernel](const std::vector<Tensor>& g) {
      Tensor dloss = g[0].to(grad_dtype(dt));
      std::vector<Tensor> grads;
      for (const Tensor& p : probs) {
        Tensor d = Tensor::empty(p.shape(), grad_dtype(dt), device);
        kernel.backward(ctx, p.size(0), E, scale, counts.data<int64_t>(), dloss.raw_data(), d.raw_data());
        grads.push_back(d);
      }
      return grads;
    });
  }
  return loss;
}

Tensor moe_experts(const Tensor& x_in, const Tensor& weights_in, const Tensor& indices_in,
                   const Tensor& w_gate_in, const Tensor& w_up_in, const Tensor& w_down_in) {
  auto shapes = [&] {
    return detail::concat("x ", x_in.str(), ", weights ", weights_in.str(), ", indices ", indices_in.str(),
                          ", w_gate ", w_gate_in.str(), ", w_up ", w_up_in.str(), ", w_down ",
                          w_down_in.str());
  };
  TITAN_CHECK(x_in.dim() == 2 && weights_in.dim() == 2 && indices_in.dim() == 2 && w_gate_in.dim() == 3 &&
                  w_up_in.dim() == 3 && w_down_in.dim() == 3,
              "moe_experts: expected x [T, D], weights and indices [T, k], w_gate and w_up [E, F, D], w_down "
              "[E, D, F]; got ",
              shapes());
  const int64_t T = x_in.size(0), D = x_in.size(1), k = weights_in.size(1), E = w_gate_in.size(0),
                F = w_gate_in.size(1);
  TITAN_CHECK(weights_in.size(0) == T && indices_in.size(0) == T && indices_in.size(1) == k && k >= 1,
              "moe_experts: weights and indices must both be [T=", T, ", k>=1]; got ", shapes());
  TITAN_CHECK(w_gate_in.size(2) == D && w_up_in.shape() == w_gate_in.shape(),
              "moe_experts: w_gate and w_up must be [E, F, D=", D, "]; got ", shapes());
  TITAN_CHECK(w_down_in.shape() == Shape({E, D, F}), "moe_experts: w_down must be [E=", E, ", D=", D,
              ", F=", F, "]; got ", shapes());
  const DType dt = x_in.dtype();
  TITAN_CHECK(
      is_compute_float(dt) && w_gate_in.dtype() == dt && w_up_in.dtype() == dt && w_down_in.dtype() == dt,
      "moe_experts: x and expert weights must share one of f32, bf16, f64; got ", shapes());
  TITAN_CHECK(weights_in.dtype() == dt || (dt == DType::BF16 && weights_in.dtype() == DType::F32),
              "moe_experts: routing weights must have x's dtype (or f32 with bf16 x); got ", shapes());
  TITAN_CHECK(indices_in.dtype() == DType::I64, "moe_experts: indices must be i64; got ", shapes());
  Tensor indices = indices_in.contiguous();
  check_indices("moe_experts", indices, E);

  const DType gd = grad_dtype(dt);
  Tensor x = x_in.contiguous().detach(), w_gate = w_gate_in.contiguous().detach(),
         w_up = w_up_in.contiguous().detach(), w_down = w_down_in.contiguous().detach();
  Tensor weights = weights_in.detach().to(gd);  // bf16 -> f32 is exact; the kernel rounds back for bf16 x
  const MoeDims d{T, D, F, E, k};
  const auto& kernel = kernels::kernel_for<MoeExpertsKernel>("moe_experts", x.device(), dt);
  const KernelContext ctx = device_services(x.device()).context();
  Tensor act = Tensor::empty({T * k, 2 * F}, dt, x.device());
  Tensor y = Tensor::empty({T, D}, dt, x.device());
  kernel.forward(ctx, d, x.raw_data(), weights.raw_data(), indices.data<int64_t>(), w_gate.raw_data(),
                 w_up.raw_data(), w_down.raw_data(), act.raw_data(), y.raw_data());
  if (autograd::needs_grad({&x_in, &weights_in, &w_gate_in, &w_up_in, &w_down_in})) {
    const bool nx = x_in.requires_grad(), nw = weights_in.requires_grad(), ng = w_gate_in.requires_grad(),
               nu = w_up_in.requires_grad(), nd = w_down_in.requires_grad();
    autograd::record("moe_experts", {x_in, weights_in, w_gate_in, w_up_in, w_down_in}, {&y},
                     [=, &kernel](const std::vector<Tensor>& g) {
                       Tensor dy = g[0].contiguous();
                       auto grad = [&](bool need, const Tensor& like) {
                         return need ? Tensor::empty(like.shape(), gd, x.device()) : Tensor();
                       };
                       Tensor dx = grad(nx, x), dw = grad(nw, weights), dg = grad(ng, w_gate),
                              du = grad(nu, w_up), dd = grad(nd, w_down);
                       auto ptr = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
                       kernel.backward(ctx, d, x.raw_data(), weights.raw_data(), indices.data<int64_t>(),
                                       w_gate.raw_data(), w_up.raw_data(), w_down.raw_data(), act.raw_data(),
                                       dy.raw_data(), ptr(dx), ptr(dw), ptr(dg), ptr(du), ptr(dd));
                       return std::vector<Tensor>{dx, dw, dg, du, dd};
                     });
  }
  return y;
}

}  // namespace titan::ops

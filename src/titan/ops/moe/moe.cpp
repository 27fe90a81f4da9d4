#include "titan/ops/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

namespace {

bool is_compute_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16;
}

}  // namespace

ExpertIndices expert_indices(const Tensor& indices_in, int64_t num_experts, const char* op) {
  TITAN_CHECK(indices_in.dim() == 2 && indices_in.dtype() == DType::I64, op,
              ": expert indices must be i64 [T, k], got ", indices_in.str());
  TITAN_CHECK(num_experts >= 1, op, ": need at least one expert, got ", num_experts);
  // A copy of its own: the caller's tensor may change after the check (a [T, k] i64 copy, cheap).
  Tensor indices = indices_in.contiguous().detach().clone();
  const int64_t bad = first_index_outside(indices, 0, num_experts, /*allowed=*/0);
  if (bad >= 0)
    TITAN_FAIL(op, ": expert indices ", indices.str(), " element ", bad, " (token ", bad / indices.size(1),
               ", slot ", bad % indices.size(1), ") is ",
               int64_t(indices.reshape({-1}).narrow(0, bad, 1).item()), ", outside [0, ", num_experts, ")");
  return ExpertIndices(indices, num_experts);
}

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
  check_same_device("router_topk", {{"logits", &logits_in}, {"expert_bias", &expert_bias}});
  Tensor logits = logits_in.contiguous().detach();
  const DType gd = grad_dtype(logits.dtype());
  const auto& kernel = kernels::kernel_for<RouterKernel>("router_topk", logits.device(), logits.dtype());
  const KernelContext ctx = device_services(logits.device()).context();
  RouterOutput out;
  out.weights = Tensor::empty({T, k}, gd, logits.device());
  Tensor indices = Tensor::empty({T, k}, DType::I64, logits.device());
  out.probs = Tensor::empty({T, E}, gd, logits.device());
  out.counts = Tensor::empty({E}, DType::I64, logits.device());
  kernel.forward(ctx, T, E, k, renormalize, logits.raw_data(), bias.defined() ? bias.data<float>() : nullptr,
                 out.weights.raw_data(), indices.data<int64_t>(), out.probs.raw_data(),
                 out.counts.data<int64_t>());
  out.indices = ExpertIndices(indices, E);  // the kernel picks among the E columns: in range
  if (autograd::needs_grad({&logits_in})) {
    Tensor probs = out.probs.detach();
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

void update_expert_bias(Tensor& bias, const Tensor& counts_in, double coeff) {
  TITAN_CHECK(bias.dim() == 1 && bias.dtype() == DType::F32 && bias.is_contiguous(),
              "update_expert_bias: bias ", bias.str(), " must be a contiguous f32 [E]");
  TITAN_CHECK((counts_in.dim() == 1 || counts_in.dim() == 2) && counts_in.size(-1) == bias.numel() &&
                  counts_in.dtype() == DType::I64 && counts_in.device() == bias.device(),
              "update_expert_bias: counts ", counts_in.str(),
              " must be i64 [E] or [micro-batches, E] for the bias ", bias.str(), " on ",
              device_name(bias.device()));
  TITAN_CHECK(std::isfinite(coeff), "update_expert_bias: coeff ", coeff, " must be finite");
  const Tensor counts = counts_in.contiguous();
  const int64_t rows = counts.dim() == 2 ? counts.size(0) : 1;
  kernels::kernel_for<ExpertBiasKernel>("update_expert_bias", bias.device(), DType::F32)
      .update(device_services(bias.device()).context(), rows, bias.numel(), counts.data<int64_t>(), coeff,
              bias.data<float>());
}

namespace {

// `counted` as moe_aux_loss and expert_counts take it, checked against T tokens; empty: all of them.
std::vector<TokenRange> counted_ranges(const std::vector<TokenRange>& counted, int64_t T,
                                       const std::string& op) {
  std::vector<TokenRange> ranges = counted;
  if (counted.empty() && T > 0) ranges.push_back({0, T});
  int64_t previous_end = 0;
  for (const TokenRange& r : ranges) {
    TITAN_CHECK(r.begin >= previous_end && r.begin < r.end && r.end <= T, op, " counts tokens [", r.begin,
                ", ", r.end, ") of ", T,
                ": the ranges must be non-empty, ascending, disjoint and within the tokens");
    previous_end = r.end;
  }
  return ranges;
}

}  // namespace

Tensor expert_counts(const ExpertIndices& routed, const std::vector<TokenRange>& counted) {
  const Tensor& indices = routed.tensor();
  TITAN_CHECK(indices.dim() == 2, "expert_counts: indices must be [T, k], got ", indices.str());
  const int64_t k = indices.size(1), E = routed.num_experts();
  const auto& kernel = kernels::kernel_for<ExpertCountKernel>("expert_counts", indices.device(), DType::I64);
  const KernelContext ctx = device_services(indices.device()).context();
  Tensor counts = Tensor::zeros({E}, DType::I64, indices.device());
  for (const TokenRange& r : counted_ranges(counted, indices.size(0), "expert_counts:"))
    kernel.add(ctx, (r.end - r.begin) * k, E, indices.data<int64_t>() + r.begin * k, counts.data<int64_t>());
  return counts;
}

Tensor moe_aux_loss(const std::vector<Tensor>& probs_per_layer, const std::vector<Tensor>& indices_per_layer,
                    int64_t num_experts, int64_t k, const std::vector<TokenRange>& counted) {
  std::vector<ExpertIndices> checked;
  for (size_t l = 0; l < indices_per_layer.size(); ++l) {
    const std::string op = "moe_aux_loss: layer " + std::to_string(l);
    checked.push_back(expert_indices(indices_per_layer[l], num_experts, op.c_str()));
  }
  return moe_aux_loss(probs_per_layer, checked, num_experts, k, counted);
}

Tensor moe_aux_loss(const std::vector<Tensor>& probs_per_layer,
                    const std::vector<ExpertIndices>& indices_per_layer, int64_t num_experts, int64_t k,
                    const std::vector<TokenRange>& counted) {
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
    const Tensor& p = probs_per_layer[l];
    const Tensor& ix = indices_per_layer[l].tensor();
    TITAN_CHECK(p.dim() == 2 && p.size(1) == E && p.dtype() == dt && p.device() == device,
                "moe_aux_loss: layer ", l, " probs ", p.str(), " must be [T, ", E, "] in ", dtype_name(dt),
                " on ", device_name(device));
    TITAN_CHECK(ix.dim() == 2 && ix.size(0) == p.size(0) && ix.size(1) == k && ix.device() == device,
                "moe_aux_loss: layer ", l, " indices ", ix.str(), " must be i64[", p.size(0), ", ", k,
                "] on ", device_name(device), " to match probs ", p.str());
    TITAN_CHECK(indices_per_layer[l].num_experts() == E, "moe_aux_loss: layer ", l, " indices are over ",
                indices_per_layer[l].num_experts(), " experts, expected ", E);
    // Each counted range is one kernel call on its rows.
    const std::vector<TokenRange> ranges =
        counted_ranges(counted, p.size(0), "moe_aux_loss: layer " + std::to_string(l));
    Tensor pc = p.contiguous().detach();
    const size_t row_bytes = size_t(E) * dtype_size(dt);
    for (const TokenRange& r : ranges) {
      kernel.accumulate(ctx, r.end - r.begin, E, k,
                        static_cast<const char*>(pc.raw_data()) + size_t(r.begin) * row_bytes,
                        ix.data<int64_t>() + r.begin * k, counts.data<int64_t>(), psum.data<double>());
      N += r.end - r.begin;
    }
    probs.push_back(p);
  }
  TITAN_CHECK(N > 0, "moe_aux_loss: no tokens");
  // aux = E / N^2 * sum_e count_e * psum_e; d aux / d p[t, e] = E * count_e / N^2 (0 where not counted).
  const double scale = double(E) / (double(N) * double(N));
  Tensor loss = Tensor::empty({1}, dt, device);
  kernel.finish(ctx, E, scale, counts.data<int64_t>(), psum.data<double>(), loss.raw_data());
  if (autograd::needs_grad(probs)) {
    autograd::record("moe_aux_loss", probs, {&loss}, [=, &kernel](const std::vector<Tensor>& g) {
      Tensor dloss = g[0].to(grad_dtype(dt));
      const size_t grad_row_bytes = size_t(E) * dtype_size(grad_dtype(dt));
      std::vector<Tensor> grads;
      for (const Tensor& p : probs) {
        if (counted.empty()) {
          Tensor d = Tensor::empty(p.shape(), grad_dtype(dt), device);
          kernel.backward(ctx, p.size(0), E, scale, counts.data<int64_t>(), dloss.raw_data(), d.raw_data());
          grads.push_back(d);
          continue;
        }
        Tensor d = Tensor::zeros(p.shape(), grad_dtype(dt), device);
        for (const TokenRange& r : counted)
          kernel.backward(ctx, r.end - r.begin, E, scale, counts.data<int64_t>(), dloss.raw_data(),
                          static_cast<char*>(d.raw_data()) + size_t(r.begin) * grad_row_bytes);
        grads.push_back(d);
      }
      return grads;
    });
  }
  return loss;
}

Tensor moe_experts(const Tensor& x, const Tensor& weights, const Tensor& indices, const Tensor& w_gate,
                   const Tensor& w_up, const Tensor& w_down) {
  TITAN_CHECK(w_gate.dim() == 3, "moe_experts: w_gate must be [E, F, D], got ", w_gate.str());
  return moe_experts(x, weights, expert_indices(indices, w_gate.size(0), "moe_experts"), w_gate, w_up,
                     w_down);
}

Tensor moe_experts(const Tensor& x_in, const Tensor& weights_in, const ExpertIndices& routed,
                   const Tensor& w_gate_in, const Tensor& w_up_in, const Tensor& w_down_in) {
  const Tensor& indices_in = routed.tensor();
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
  check_same_device("moe_experts", {{"x", &x_in},
                                    {"weights", &weights_in},
                                    {"w_gate", &w_gate_in},
                                    {"w_up", &w_up_in},
                                    {"w_down", &w_down_in}});
  TITAN_CHECK(routed.num_experts() == E && indices_in.device() == x_in.device(), "moe_experts: indices over ",
              routed.num_experts(), " experts on ", device_name(indices_in.device()), ", expected ", E,
              " (w_gate's) on ", device_name(x_in.device()), "; got ", shapes());
  const Tensor& indices = indices_in;

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
    const autograd::GradientSink gate_sink(w_gate_in), up_sink(w_up_in), down_sink(w_down_in);
    autograd::record("moe_experts", {x_in, weights_in, w_gate_in, w_up_in, w_down_in}, {&y},
                     [=, &kernel](const std::vector<Tensor>& g) {
                       Tensor dy = g[0].contiguous();
                       auto grad = [&](bool need, const Tensor& like) {
                         return need ? Tensor::empty(like.shape(), gd, x.device()) : Tensor();
                       };
                       // The expert weights' gradients ([E, F, D] each, the largest of a MoE layer)
                       // go into their parameters' buffers when every needed one has a buffer
                       // (one ParamBlock holds all three), returned undefined then (already
                       // accumulated); else into fresh tensors. The kernel adds to all three or
                       // writes over all three: one buffer that holds this step's gradients while
                       // another holds none yet is zeroed first (it never happens within a block).
                       const bool some = ng || nu || nd;
                       const bool into_buffers = some && (!ng || gate_sink.has_buffer()) &&
                                                 (!nu || up_sink.has_buffer()) &&
                                                 (!nd || down_sink.has_buffer());
                       autograd::GradientTarget tg, tu, td;
                       if (into_buffers) {
                         if (ng) tg = gate_sink.target();
                         if (nu) tu = up_sink.target();
                         if (nd) td = down_sink.target();
                       }
                       const bool any_add = (ng && tg.add) || (nu && tu.add) || (nd && td.add);
                       for (autograd::GradientTarget* t : {&tg, &tu, &td})
                         if (any_add && t->buffer.defined() && !t->add) t->buffer.fill(0.0);
                       Tensor dx = grad(nx, x), dw = grad(nw, weights),
                              dg = into_buffers ? tg.buffer : grad(ng, w_gate),
                              du = into_buffers ? tu.buffer : grad(nu, w_up),
                              dd = into_buffers ? td.buffer : grad(nd, w_down);
                       auto ptr = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
                       kernel.backward(ctx, d, x.raw_data(), weights.raw_data(), indices.data<int64_t>(),
                                       w_gate.raw_data(), w_up.raw_data(), w_down.raw_data(), act.raw_data(),
                                       dy.raw_data(), ptr(dx), ptr(dw), ptr(dg), ptr(du), ptr(dd),
                                       into_buffers && any_add);
                       if (into_buffers) return std::vector<Tensor>{dx, dw, Tensor(), Tensor(), Tensor()};
                       return std::vector<Tensor>{dx, dw, dg, du, dd};
                     });
  }
  return y;
}

}  // namespace titan::ops

namespace titan::ops {

Tensor moe_combine(const Tensor& rows_in, const Tensor& weights_in, const ExpertIndices& routed) {
  const Tensor& indices = routed.tensor();
  auto shapes = [&] {
    return detail::concat("rows ", rows_in.str(), ", weights ", weights_in.str(), ", indices ",
                          indices.str());
  };
  TITAN_CHECK(rows_in.dim() == 2 && weights_in.dim() == 2 && indices.dim() == 2,
              "moe_combine: expected rows [T*k, D], weights and indices [T, k]; got ", shapes());
  const int64_t T = weights_in.size(0), k = weights_in.size(1), D = rows_in.size(1), E = routed.num_experts();
  TITAN_CHECK(indices.shape() == weights_in.shape() && k >= 1 && rows_in.size(0) == T * k,
              "moe_combine: weights and indices must both be [T, k>=1] with rows [T*k, D]; got ", shapes());
  const DType dt = rows_in.dtype();
  TITAN_CHECK(is_compute_float(dt), "moe_combine: rows must be f32, bf16 or f64; got ", shapes());
  TITAN_CHECK(weights_in.dtype() == dt || (dt == DType::BF16 && weights_in.dtype() == DType::F32),
              "moe_combine: routing weights must have the rows' dtype (or f32 with bf16 rows); got ",
              shapes());
  check_same_device("moe_combine", {{"rows", &rows_in}, {"weights", &weights_in}, {"indices", &indices}});

  const DType gd = grad_dtype(dt);
  Tensor rows = rows_in.contiguous().detach();
  Tensor weights = weights_in.detach().to(gd);  // bf16 -> f32 is exact; the kernel rounds back for bf16 rows
  const MoeDims d{T, D, 0, E, k};
  const auto& kernel = kernels::kernel_for<MoeCombineKernel>("moe_combine", rows.device(), dt);
  const KernelContext ctx = device_services(rows.device()).context();
  Tensor y = Tensor::empty({T, D}, dt, rows.device());
  kernel.forward(ctx, d, rows.raw_data(), weights.raw_data(), indices.data<int64_t>(), y.raw_data());
  if (autograd::needs_grad({&rows_in, &weights_in})) {
    const bool nr = rows_in.requires_grad(), nw = weights_in.requires_grad();
    autograd::record("moe_combine", {rows_in, weights_in}, {&y}, [=, &kernel](const std::vector<Tensor>& g) {
      Tensor dy = g[0].contiguous();
      Tensor drows = nr ? Tensor::empty({T * k, D}, gd, rows.device()) : Tensor();
      Tensor dweights = nw ? Tensor::empty({T, k}, gd, rows.device()) : Tensor();
      kernel.backward(ctx, d, rows.raw_data(), weights.raw_data(), indices.data<int64_t>(), dy.raw_data(),
                      nr ? drows.raw_data() : nullptr, nw ? dweights.raw_data() : nullptr);
      return std::vector<Tensor>{drows, dweights};
    });
  }
  return y;
}

}  // namespace titan::ops

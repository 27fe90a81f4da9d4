#include "titan/ops/cross_entropy/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/elementwise/elementwise.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

namespace {

void check_float(const char* op, const Tensor& t, const char* what) {
  DType d = t.dtype();
  TITAN_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F64, op, ": ", what, " ", t.str(),
              " must be f32, bf16 or f64");
}

// The targets of a loss over the N rows of `rows`: the labels (i64[N], contiguous) and how many rows
// take part (also in *num_targets when given). Labels outside [0, V) are rejected (a tokenizer/vocab
// mismatch would otherwise read out of bounds). Both scans run on the labels' device.
struct Targets {
  Tensor labels;
  int64_t count;  // rows whose label is not ignore_index
};
Targets prepare_targets(const char* op, const Tensor& labels_in, const char* rows_name, const Tensor& rows,
                        int64_t V, int64_t ignore_index, int64_t* num_targets) {
  const int64_t N = rows.size(0);
  TITAN_CHECK(labels_in.dtype() == DType::I64 && labels_in.dim() == 1 && labels_in.size(0) == N, op,
              ": expected labels i64[", N, "] (one per row of ", rows.str(), "), got ", labels_in.str());
  check_same_device(op, {{rows_name, &rows}, {"labels", &labels_in}});
  Tensor labels = labels_in.contiguous().detach();
  const int64_t bad = first_index_outside(labels, 0, V, ignore_index);
  if (bad >= 0) {
    const int64_t label = int64_t(labels.narrow(0, bad, 1).item());
    TITAN_FAIL(op, ": label ", label, " at row ", bad, " is outside [0, V) with V=", V,
               " (and is not ignore_index=", ignore_index, ")");
  }
  const int64_t count = count_not_equal(labels, ignore_index);
  if (num_targets) *num_targets = count;
  return {labels, count};
}

// Sums the per-row losses in row order in f64: the value does not depend on thread count.
Tensor reduce_loss(const Tensor& row_loss, int64_t count, Reduction reduction) {
  double total = sum_all(row_loss);
  if (reduction == Reduction::Mean) total = count ? total / double(count) : 0.0;
  return Tensor::full({}, total, row_loss.dtype(), row_loss.device());
}

// d(loss)/d(row loss) for counted rows; 0 when no row counts (the loss is the constant 0).
double grad_scale(const Tensor& g, int64_t count, Reduction reduction) {
  if (!g.defined()) return 0;
  double s = g.item();
  if (reduction == Reduction::Mean) s = count ? s / double(count) : 0.0;
  return s;
}

}  // namespace

int64_t count_targets(const Tensor& labels, int64_t ignore_index) {
  TITAN_CHECK(labels.dtype() == DType::I64 && labels.dim() == 1,
              "count_targets: expected labels i64[N], got ", labels.str());
  return count_not_equal(labels, ignore_index);
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& labels_in, int64_t ignore_index,
                     Reduction reduction, int64_t* num_targets) {
  TITAN_CHECK(logits_in.dim() == 2, "cross_entropy: expected logits [N, V], got ", logits_in.str());
  check_float("cross_entropy", logits_in, "logits");
  const int64_t N = logits_in.size(0), V = logits_in.size(1);
  TITAN_CHECK(V > 0, "cross_entropy: logits ", logits_in.str(), " has no classes");
  const Targets targets =
      prepare_targets("cross_entropy", labels_in, "logits", logits_in, V, ignore_index, num_targets);
  Tensor logits = logits_in.contiguous().detach();

  const DType ad = grad_dtype(logits.dtype());
  const auto& kernel =
      kernels::kernel_for<CrossEntropyKernel>("cross_entropy", logits.device(), logits.dtype());
  const KernelContext ctx = device_services(logits.device()).context();
  Tensor lse = Tensor::empty({N}, ad, logits.device()), row_loss = Tensor::empty({N}, ad, logits.device());
  kernel.forward(ctx, N, V, logits.raw_data(), targets.labels.data<int64_t>(), ignore_index, lse.raw_data(),
                 row_loss.raw_data());
  Tensor loss = reduce_loss(row_loss, targets.count, reduction);

  if (autograd::needs_grad({&logits_in})) {
    autograd::record("cross_entropy", {logits_in}, {&loss}, [=, &kernel](const std::vector<Tensor>& g) {
      Tensor dl = Tensor::empty(logits.shape(), ad, logits.device());
      kernel.backward(ctx, N, V, logits.raw_data(), targets.labels.data<int64_t>(), ignore_index,
                      lse.raw_data(), grad_scale(g[0], targets.count, reduction), dl.raw_data());
      return std::vector<Tensor>{dl};
    });
  }
  return loss;
}

Tensor linear_cross_entropy(const Tensor& hidden_in, const Tensor& weight_in, const Tensor& labels_in,
                            int64_t ignore_index, int64_t chunk, Reduction reduction, int64_t* num_targets,
                            bool round_logits_to_bf16, int64_t keep_logits_bytes) {
  TITAN_CHECK(hidden_in.dim() == 2 && weight_in.dim() == 2,
              "linear_cross_entropy: expected hidden [N, D] and weight [V, D], got hidden ", hidden_in.str(),
              " and weight ", weight_in.str());
  TITAN_CHECK(hidden_in.size(1) == weight_in.size(1), "linear_cross_entropy: hidden ", hidden_in.str(),
              " has D=", hidden_in.size(1), " but weight ", weight_in.str(), " has D=", weight_in.size(1));
  TITAN_CHECK(hidden_in.dtype() == weight_in.dtype(), "linear_cross_entropy: dtypes differ: hidden ",
              hidden_in.str(), ", weight ", weight_in.str());
  check_same_device("linear_cross_entropy", {{"hidden", &hidden_in}, {"weight", &weight_in}});
  check_float("linear_cross_entropy", hidden_in, "hidden");
  const int64_t N = hidden_in.size(0), V = weight_in.size(0), D = hidden_in.size(1);
  TITAN_CHECK(V > 0, "linear_cross_entropy: weight ", weight_in.str(), " has no vocabulary rows");
  TITAN_CHECK(chunk > 0, "linear_cross_entropy: chunk must be positive, got ", chunk);
  const Targets targets =
      prepare_targets("linear_cross_entropy", labels_in, "hidden", hidden_in, V, ignore_index, num_targets);
  Tensor hidden = hidden_in.contiguous().detach(), weight = weight_in.contiguous().detach();

  const DType ad = grad_dtype(hidden.dtype());
  const auto& kernel =
      kernels::kernel_for<LinearCrossEntropyKernel>("linear_cross_entropy", hidden.device(), hidden.dtype());
  const KernelContext ctx = device_services(hidden.device()).context();
  const bool round = round_logits_to_bf16 && hidden.dtype() == DType::BF16;
  // Logits the kernel keeps for backward (if any); the backward closure owns them.
  auto kept = std::make_shared<Tensor>();
  auto args = [=] {  // raw pointers into the tensors the backward closure keeps alive
    return LinearCrossEntropyArgs{N,
                                  V,
                                  D,
                                  hidden.raw_data(),
                                  weight.raw_data(),
                                  targets.labels.data<int64_t>(),
                                  ignore_index,
                                  chunk,
                                  round,
                                  kept.get(),
                                  keep_logits_bytes};
  };
  Tensor lse = Tensor::empty({N}, ad, hidden.device()), row_loss = Tensor::empty({N}, ad, hidden.device());
  const bool grad = autograd::needs_grad({&hidden_in, &weight_in});
  {
    LinearCrossEntropyArgs a = args();
    if (!grad) a.keep_bytes = 0;  // nothing would read them
    kernel.forward(ctx, a, lse.raw_data(), row_loss.raw_data());
  }
  Tensor loss = reduce_loss(row_loss, targets.count, reduction);

  if (grad) {
    const bool need_dh = hidden_in.requires_grad(), need_dw = weight_in.requires_grad();
    const autograd::GradientSink w_sink(weight_in);
    autograd::record("linear_cross_entropy", {hidden_in, weight_in}, {&loss},
                     [=, &kernel](const std::vector<Tensor>& g) {
                       Tensor dh = need_dh ? Tensor::empty(hidden.shape(), ad, hidden.device()) : Tensor();
                       // The weight's gradient goes into its parameter's buffer when there is one
                       // (the lm_head, tied or not: [V, D] f32 is the largest gradient of a step),
                       // added or, the step's first, written over it, and returned undefined
                       // (already accumulated); else into a fresh tensor.
                       const autograd::GradientTarget target =
                           need_dw ? w_sink.target() : autograd::GradientTarget{};
                       const bool into_buffer = target.buffer.defined();
                       Tensor dw = into_buffer ? target.buffer
                                   : need_dw   ? Tensor::empty(weight.shape(), ad, hidden.device())
                                               : Tensor();
                       kernel.backward(ctx, args(), lse.raw_data(),
                                       grad_scale(g[0], targets.count, reduction),
                                       need_dh ? dh.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr,
                                       into_buffer && target.add);
                       *kept = Tensor();  // backward runs once: free the logits before the next node
                       return std::vector<Tensor>{dh, into_buffer ? Tensor() : dw};
                     });
  }
  return loss;
}

}  // namespace titan::ops

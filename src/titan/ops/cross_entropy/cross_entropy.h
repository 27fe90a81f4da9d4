#pragma once
// The loss: cross-entropy over vocabulary logits, and the fused output projection + cross-entropy
// that never materialises the [N, V] logits.
//
// cross_entropy(logits [N, V], labels i64 [N]) = mean over rows with label != ignore_index of
//   logsumexp(logits[n, :]) - logits[n, labels[n]]
// (or their sum, Reduction::Sum). The softmax statistics are computed in f32 (f64 for f64 logits);
// bf16 logits are widened first, as transformers does with `logits.float()`. The loss is an f32
// scalar (f64 for f64 logits, shape []); when every row is ignored it is 0 and the gradients are 0.
// A label outside [0, V) that is not ignore_index is an error naming the value, its row and V.
//
// Gradient accumulation: sum-of-token-losses / tokens-in-the-whole-step equals the mean of the
// micro-batches' means only while every micro-batch has as many targets. The trainer's do (packed
// windows, no ignored labels), so it averages Reduction::Mean losses; a loss with ignored labels
// would use Reduction::Sum and divide by the total of count_targets() over the micro-batches (the
// count of one call is also returned through `num_targets`).
//
// linear_cross_entropy(hidden [N, D], weight [V, D], labels) has the value and gradients
// (dhidden, dweight) of cross_entropy(linear(hidden, weight), labels) but only ever holds logits for
// `chunk` vocabulary columns at a time: forward runs an online logsumexp over vocabulary chunks and
// saves one f32 lse per row; backward recomputes each chunk's logits, forms
// dlogits = (softmax - onehot) * dloss / count in f32 and accumulates dhidden += dlogits @ W_chunk,
// dweight_chunk = dlogits^T @ hidden. Extra memory is O(N x chunk) besides the gradients themselves.
// Numerics for bf16 hidden/weight: the GEMMs take bf16 operands with f32 accumulation (dlogits is
// rounded to bf16 before the backward GEMMs, like the bf16 backward of a bf16 lm_head). With
// `round_logits_to_bf16` (default true; ignored for f32/f64) each logit is rounded to bf16 before the
// f32 softmax statistics, which is exactly what transformers computes in bf16 (lm_head output in
// bf16, then `.float()`); false keeps the f32-accumulated logits (slightly more accurate).
#include <cstdint>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

enum class Reduction : uint8_t { Mean, Sum };

// Rows of labels (i64 [N]) that take part in the loss: label != ignore_index. Range errors are
// reported by the loss ops, which know V.
int64_t count_targets(const Tensor& labels, int64_t ignore_index = -100);

// Autograd: d/dlogits. labels get no gradient. num_targets (optional out) = count_targets(labels).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::Mean, int64_t* num_targets = nullptr);

// Autograd: d/dhidden and d/dweight. hidden and weight share a dtype (f32, bf16 or f64).
// keep_logits_bytes: memory the kernel may use to keep the logits from forward to backward instead
// of recomputing them there (saves 2NDV of the 8NDV FLOPs). The "default" CPU kernel keeps them
// (bf16 when they are rounded to bf16, else f32) when counted rows x V fit; 0 always recomputes.
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                            int64_t ignore_index = -100, int64_t chunk = 8192,
                            Reduction reduction = Reduction::Mean, int64_t* num_targets = nullptr,
                            bool round_logits_to_bf16 = true, int64_t keep_logits_bytes = 0);

// Kernels. Pointers are contiguous row-major; labels are already validated (each is ignore_index
// or in [0, V)). "acc" buffers (lse, row_loss, gradients) are f64 for f64 inputs, f32 otherwise.
struct CrossEntropyKernel {
  // logits [N, V] -> lse [N] and row_loss [N] (lse - logits[label]; 0 for ignored rows).
  void (*forward)(const KernelContext& ctx, int64_t N, int64_t V, const void* logits, const int64_t* labels, int64_t ignore_index,
                  void* lse, void* row_loss);
  // dlogits [N, V] (acc) = scale * (softmax - onehot) for counted rows, 0 for ignored rows.
  void (*backward)(const KernelContext& ctx, int64_t N, int64_t V, const void* logits, const int64_t* labels, int64_t ignore_index,
                   const void* lse, double scale, void* dlogits);
};

struct LinearCrossEntropyArgs {
  int64_t N, V, D;
  const void* hidden;  // [N, D]
  const void* weight;  // [V, D]
  const int64_t* labels;
  int64_t ignore_index;
  int64_t chunk;      // vocabulary columns per chunk (kernels that materialise all logits ignore it)
  bool round_logits;  // bf16 only: round logits to bf16 before the softmax statistics
  // Optional: forward may store its logits in *kept (at most keep_bytes) and its backward read them
  // back instead of recomputing; kernels that do not keep logits ignore both.
  Tensor* kept;
  int64_t keep_bytes;
};

// Row stride, in elements, of the f32 CPU kernel's backward chunk buffer (its dlogits rows) for
// chunks of C columns: C, one cache line (16 floats) longer when C floats fill whole 4 KiB pages.
// At such strides a column's elements share a few L1 sets, and the dweight GEMM reads dlogits down
// its columns (cpu.cpp). The meta kernel allocates the same buffer.
inline int64_t lce_f32_backward_row_stride(int64_t C) {
  return C * 4 % 4096 == 0 ? C + 16 : C;
}

struct LinearCrossEntropyKernel {
  // -> lse [N] and row_loss [N] (acc), as CrossEntropyKernel::forward on the logits hidden @ weight^T.
  void (*forward)(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void* lse, void* row_loss);
  // dhidden [N, D] and dweight [V, D] (acc; either may be null when not needed) for dlogits =
  // scale * (softmax - onehot), using the lse from forward. dhidden is overwritten; dweight too, or,
  // add_dweight, added to (a parameter's gradient buffer: autograd::GradientSink).
  void (*backward)(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void* lse, double scale,
                   void* dhidden, void* dweight, bool add_dweight);
};

}  // namespace titan::ops

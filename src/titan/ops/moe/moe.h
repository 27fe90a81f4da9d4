#pragma once
// Mixture-of-experts ops (Qwen3-MoE, transformers 5.17 semantics; torchtitan's expert bias):
//   router_topk  : softmax over experts in f32, top-k, optional renormalisation (norm_topk_prob);
//   moe_aux_loss : the load-balancing loss over all MoE layers;
//   moe_experts  : y_t = sum_j w[t,j] * down_e(silu(gate_e x_t) * up_e x_t), e = idx[t,j].
#include <cstdint>
#include <utility>
#include <vector>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

struct RouterOutput;

// Expert indices i64 [T, k] known to lie in [0, num_experts): router_topk makes them (in range by
// construction) and expert_indices() checks a tensor once. moe_experts and moe_aux_loss take them
// unchecked, so a routed step reads nothing back from the device (a range check on a GPU is a host
// read, a stall of its queue, twice per MoE layer before).
class ExpertIndices {
 public:
  ExpertIndices() = default;  // none (for a default-constructed RouterOutput)
  const Tensor& tensor() const { return indices_; }  // read only: writing to it voids the range guarantee
  int64_t num_experts() const { return num_experts_; }

 private:
  friend ExpertIndices expert_indices(const Tensor& indices, int64_t num_experts, const char* op);
  friend RouterOutput router_topk(const Tensor& logits, int64_t k, bool renormalize,
                                  const Tensor& expert_bias);
  ExpertIndices(Tensor indices, int64_t num_experts)
      : indices_(std::move(indices)), num_experts_(num_experts) {}
  Tensor indices_;  // contiguous
  int64_t num_experts_ = 0;
};

// indices i64 [T, k]; an index outside [0, num_experts) is an error naming `op`, the token and the slot.
ExpertIndices expert_indices(const Tensor& indices, int64_t num_experts, const char* op = "expert_indices");

struct RouterOutput {
  Tensor weights;         // [T, k] f32 (f64 for f64 logits): routing weights, differentiable w.r.t. logits
  ExpertIndices indices;  // [T, k] i64: chosen experts, best first
  Tensor probs;           // [T, E] f32 (f64 for f64 logits): softmax(logits), differentiable (aux loss)
  Tensor counts;          // [E] i64: assignments per expert (no autograd)
};

// logits [T, E] (f32, bf16 or f64). Selection ranks p + expert_bias (expert_bias optional, [E] f32,
// torchtitan's aux-loss-free balancing: it changes which experts are chosen, never the weights);
// weights are the chosen p, divided by their sum when `renormalize`. Ties rank the lower expert
// index first (a stable descending sort; torch.topk leaves ties unspecified). NaN logits give NaN
// probabilities and an unspecified (but valid and distinct) choice of experts.
// Autograd: from weights and probs to logits (f32 gradients, f64 for f64).
RouterOutput router_topk(const Tensor& logits, int64_t k, bool renormalize,
                         const Tensor& expert_bias = Tensor());

// transformers 5.17 load_balancing_loss_func over the concatenation of all layers' tokens:
//   aux = E * sum_e (assignments to e / N) * (sum_t p[t, e] / N),  N = total tokens of all layers
// (a perfectly balanced router gives k; no division by k in this version). probs_per_layer[l] is
// [T_l, E] (f32 or f64, all the same dtype), indices_per_layer[l] is [T_l, k] over E experts.
// `counted`: the tokens of every layer that count, as ascending disjoint ranges of [0, T_l) (the
// layers then route the same T tokens); empty: all of them. transformers counts the tokens its
// attention_mask keeps, which leaves padding out. Returns a scalar (shape [1]) in the probs dtype,
// summed in f64. Gradient flows to the counted probs only (the counts are constants, as in
// transformers).
struct TokenRange {
  int64_t begin = 0, end = 0;  // [begin, end)
};
Tensor moe_aux_loss(const std::vector<Tensor>& probs_per_layer,
                    const std::vector<ExpertIndices>& indices_per_layer, int64_t num_experts, int64_t k,
                    const std::vector<TokenRange>& counted = {});
// The same with i64 [T_l, k] tensors, each checked by expert_indices().
Tensor moe_aux_loss(const std::vector<Tensor>& probs_per_layer, const std::vector<Tensor>& indices_per_layer,
                    int64_t num_experts, int64_t k, const std::vector<TokenRange>& counted = {});

// x [T, D]; weights [T, k] (x's dtype, or f32 with bf16 x); indices [T, k] over E experts;
// w_gate, w_up [E, F, D]; w_down [E, D, F] (the torchtitan / transformers-v5 stacked layout).
// Returns y [T, D] in x's dtype. Gradients for x, weights, w_gate, w_up, w_down.
// Rounding points (bf16), as transformers' Qwen3MoeExperts / the peer qwen3_ref.py: gate and up
// outputs, silu(gate), silu(gate) * up, the down output, the routing weight (cast to bf16) and
// its product with the down output are each rounded to bf16, and each token's y accumulates its
// k contributions in ascending expert order (index_add_ over experts), rounding after every add.
// f32 and f64 keep the same order of the accumulation.
Tensor moe_experts(const Tensor& x, const Tensor& weights, const ExpertIndices& indices, const Tensor& w_gate,
                   const Tensor& w_up, const Tensor& w_down);
// The same with an i64 [T, k] tensor, checked by expert_indices() against w_gate's E.
Tensor moe_experts(const Tensor& x, const Tensor& weights, const Tensor& indices, const Tensor& w_gate,
                   const Tensor& w_up, const Tensor& w_down);

// torchtitan's aux-loss-free balancing, one layer, in place on the bias's device (no host read):
// with load[e] the tokens expert e received (counts
// summed over their rows), delta[e] = coeff * sign(mean(load) - load[e]) and
// bias[e] += delta[e] - mean(delta) (the biases keep their mean), means in f64 in expert order, one
// f32 add per expert. bias f32 [E]; counts i64 [E] or [M, E] (the layer's assignments, one row per
// micro-batch of the step, summed over ranks).
void update_expert_bias(Tensor& bias, const Tensor& counts, double coeff);

// The assignments per expert (i64 [E], on the indices' device, no host read) of the `counted`
// tokens of `indices` [T, k] (ascending disjoint ranges of [0, T), as moe_aux_loss takes them):
// what the expert bias balances when some tokens are padding.
Tensor expert_counts(const ExpertIndices& indices, const std::vector<TokenRange>& counted);

// The weighted sum of moe_experts done apart from the experts, for expert parallelism (the rows come
// back from the ranks holding the experts): rows [T*k, D] holds expert e's output for each (token,
// slot) pair, in routing order (moe_routing_order: sorted by expert, stably), in x's dtype (f32, bf16
// or f64); weights [T, k] as moe_experts takes them (x's dtype, or f32 for bf16 rows).
//   y_t = sum_j w[t, j] * rows[pos[t*k + j]]
// with moe_experts' rounding points and order: w rounded to the rows' dtype, each product rounded,
// the k products added in ascending expert order, rounding after every add. So
//   moe_combine(moe_experts(rows of x in routing order, 1, their experts, w_gate, w_up, w_down),
//               weights, indices)
// is moe_experts(x, weights, indices, w_gate, w_up, w_down): bit for bit in the forward against its
// reference kernels (and in bf16 against the default ones; their f32 un-permute may fuse a
// multiply-add: an ulp). So is moe_combine(moe_experts(those rows, their weights, ...), 1, indices),
// which expert parallelism runs: there moe_experts' backward scales by the weight where it does in
// one process (bf16: after rounding dy), where this op's backward hands w[t, j] * dy_t on unrounded.
// Gradients for rows (w[t, j] * dy_t) and weights (dy_t . row).
Tensor moe_combine(const Tensor& rows, const Tensor& weights, const ExpertIndices& indices);

struct MoeDims {
  int64_t T, D, F, E, k;
};

// The routing order every moe_experts kernel uses for its per-(token, slot) rows: the T*k pairs
// sorted by expert, stably (an expert's pairs in t*k+j order). order[r] = t*k + j of row r,
// pos[t*k + j] = r, rows offsets[e] .. offsets[e+1]-1 belong to expert e (offsets has E+1 entries).
void moe_routing_order(const MoeDims& d, const int64_t* indices, int64_t* order, int64_t* pos,
                       int64_t* offsets);

// Kernels; contiguous row-major buffers. Floating inputs in the op's dtype except where noted.
struct RouterKernel {
  // logits [T, E]; bias [E] f32 or null; weights [T, k] and probs [T, E] in the grad dtype.
  // counts [E] (assignments per expert) is overwritten.
  void (*forward)(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                  const void* logits, const float* bias, void* weights, int64_t* indices, void* probs,
                  int64_t* counts);
  // dweights / dprobs in the grad dtype, either may be null (zero); dlogits is overwritten.
  void (*backward)(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                   const void* probs, const int64_t* indices, const void* dweights, const void* dprobs,
                   void* dlogits);
};

// Expert counts, registered under i64 (the indices): adds the experts of n assignments to counts [E].
struct ExpertCountKernel {
  void (*add)(const KernelContext& ctx, int64_t n, int64_t E, const int64_t* indices, int64_t* counts);
};

// The aux loss, registered per probs dtype (f32, f64); A = that dtype.
struct MoeAuxLossKernel {
  // Adds one layer's assignments per expert to counts [E] and the column sums of its probs [T, E]
  // (row order, f64) to psum [E].
  void (*accumulate)(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, const void* probs,
                     const int64_t* indices, int64_t* counts, double* psum);
  // loss[0] (A) = scale * sum_e counts[e] * psum[e], summed in f64 in expert order.
  void (*finish)(const KernelContext& ctx, int64_t E, double scale, const int64_t* counts, const double* psum,
                 void* loss);
  // dprobs [T, E] (A) = dloss[0] * scale * counts[e].
  void (*backward)(const KernelContext& ctx, int64_t T, int64_t E, double scale, const int64_t* counts,
                   const void* dloss, void* dprobs);
};

struct ExpertBiasKernel {  // registered for f32 (the bias); counts [M, E]: M micro-batches' rows, summed
  void (*update)(const KernelContext& ctx, int64_t M, int64_t E, const int64_t* counts, double coeff,
                 float* bias);
};

struct MoeCombineKernel {  // MoeDims::F is unused
  // rows [T*k, D] in routing order in the dtype; weights [T, k] in the grad dtype; y [T, D] in the dtype.
  void (*forward)(const KernelContext& ctx, const MoeDims& d, const void* rows, const void* weights,
                  const int64_t* indices, void* y);
  // dy [T, D], drows [T*k, D] (routing order) and dweights [T, k] in the grad dtype; a null output
  // is not computed; the others are overwritten.
  void (*backward)(const KernelContext& ctx, const MoeDims& d, const void* rows, const void* weights,
                   const int64_t* indices, const void* dy, void* drows, void* dweights);
};

struct MoeExpertsKernel {
  // weights [T, k] in the grad dtype (f32 for bf16: the kernel rounds them to bf16 as transformers
  // does). act [T*k, 2F] in x's dtype, rows in routing order: gate output | up output (saved for
  // backward). y [T, D] in x's dtype.
  void (*forward)(const KernelContext& ctx, const MoeDims& d, const void* x, const void* weights,
                  const int64_t* indices, const void* w_gate, const void* w_up, const void* w_down, void* act,
                  void* y);
  // dy and every gradient in the grad dtype; a null gradient pointer is not computed. All outputs
  // are overwritten, except that add_dweights adds the expert weights' gradients (dw_gate, dw_up,
  // dw_down) to what they hold (the parameters' gradient buffers: autograd::GradientSink).
  void (*backward)(const KernelContext& ctx, const MoeDims& d, const void* x, const void* weights,
                   const int64_t* indices, const void* w_gate, const void* w_up, const void* w_down,
                   const void* act, const void* dy, void* dx, void* dweights, void* dw_gate, void* dw_up,
                   void* dw_down, bool add_dweights);
};

}  // namespace titan::ops

#pragma once
// Optimizer kernels over the trainer's flat per-block buffers (embedding, each layer, final norm +
// head): parameters, gradients and AdamW moments are contiguous f32 tensors of one shape, so every
// op here is one pass over a span. None of them records autograd.
//
// adamw_step follows torch.optim.AdamW (amsgrad=False, maximize=False) element by element:
//   p  = p * (1 - lr * weight_decay)                      (decoupled weight decay)
//   m  = fma(g, 1 - beta1, m * beta1)
//   v  = fma((1 - beta2) * g, g, v * beta2)
//   p  = p + (-lr / (1 - beta1^t) * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// or, with decoupled_weight_decay false, torch.optim.Adam, whose weight decay is an L2 term added to
// the gradient before the moments instead (p is not scaled):
//   g  = fma(p, weight_decay, g)                          (torch's grad.add(param, alpha=weight_decay))
// with the scalars computed in f64 and rounded to f32 once, as PyTorch does with Python floats. The
// fused multiply-adds are where PyTorch's vectorised CPU kernels fuse, so the f32 result is
// bit-identical to torch 1.13 on AVX2/AVX-512 hosts (tests/ops/optim_test.cpp checks).
//
// Weight decay applies to every element of the buffer, like torchtitan (which decays all parameters,
// norms and embeddings included). To exempt a buffer pass weight_decay = 0; to exempt part of one,
// call adamw_step on narrow() slices of the flat buffers (1-D slices stay contiguous).
//
// Gradient norm: squares summed in f64 (exact products; the default kernel adds fixed-size blocks in
// block order, so its result does not depend on the thread count). The trainer takes grad_norm_sq
// of all its blocks at once (one total on the device, one host read), passes it through
// ParallelPlan::all_reduce_grad_norm_sq (the sum over ranks; the identity in a one-process run), and
// clips by passing clip_coefficient as adamw_step's grad_scale; clip_grads_with_norm and
// clip_grad_norm are the in-place torch equivalents.
#include <cstdint>
#include <vector>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

struct AdamWConfig {
  double lr = 8e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // true: AdamW's decoupled decay; false: Adam's L2 term (torchtitan's optimizer.name = "Adam").
  bool decoupled_weight_decay = true;
};

// Throws titan::Error naming the field when lr < 0, eps < 0, weight_decay < 0, a beta outside
// [0, 1), or any value is not finite (the rules torch.optim.AdamW enforces, plus finiteness).
void validate(const AdamWConfig& config);

// One in-place AdamW step. param, grad, exp_avg, exp_avg_sq: contiguous, same shape, all f32 (or
// all f64, for tests). step is 1-based: the number of steps taken including this one.
// grad_scale multiplies each gradient element as it is read (rounded to the element type first,
// exactly as scaling the gradient in place would): the trainer passes the clip coefficient, so
// clipping costs no pass of its own. The gradient buffer is left as it was.
//
// compute_copy (f32 param only): a contiguous bf16 tensor of param's numel on its device, written
// with each updated value rounded to bf16 (to nearest even, NaN kept a NaN: exactly ops::cast). The
// trainer passes the bf16 copy of the weights its forward and backward read (ParamBlock::
// compute_shard), which costs 2 bytes per parameter here instead of a cast pass of 6 per step.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWConfig& config, int64_t step, double grad_scale = 1.0,
                Tensor* compute_copy = nullptr);

// Sum of squares of contiguous f32/f64 gradients, accumulated in f64: each tensor's sum is added to
// one f64 total on their device in the order given, and the total is read back once (one host read
// for all of them; they share a device and a dtype).
double grad_norm_sq(const std::vector<Tensor>& grads);
double grad_norm_sq(const Tensor& grad);  // grad_norm_sq({grad})
// sqrt of the summed grad_norm_sq over all tensors (the L2 norm of their concatenation).
double global_grad_norm(const std::vector<Tensor>& grads);

// torch.nn.utils.clip_grads_with_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1;
// grads are scaled by it when it is below 1 (so a norm just under max_norm is still scaled by
// ~1 - 1e-6/max_norm, as in torch). A non-finite total_norm leaves grads untouched (torch would
// turn them into NaN): the caller detects it and skips the step. max_norm must be > 0.
void clip_grads_with_norm(std::vector<Tensor>& grads, double max_norm, double total_norm);
// The factor clip_grads_with_norm scales by: max_norm / (total_norm + 1e-6) when that is below 1,
// else 1 (also 1 for a non-finite total_norm). max_norm must be > 0.
double clip_coefficient(double max_norm, double total_norm);

// torch.nn.utils.clip_grad_norm_ (L2): computes the global norm, clips, returns the norm before clipping.
double clip_grad_norm(std::vector<Tensor>& grads, double max_norm);

// The scalars of one AdamW step, computed once in f64 (kernels round them to their element type).
struct AdamWScalars {
  double decay;  // 1 - lr * weight_decay
  double beta1, one_minus_beta1;
  double beta2, one_minus_beta2;
  double neg_step_size;          // -lr / (1 - beta1^step)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  double eps;
  double grad_scale = 1.0;  // each gradient element is multiplied by this (in its type) when read
  double l2 = 0;            // Adam: then g = fma(p, l2, g) (decay is 1); 0 for AdamW
};

// Kernels over n contiguous elements of the op's dtype (f32 or f64). compute_copy: null, or (f32 only)
// n bf16 elements (their bits) that receive the updated param rounded to bf16.
struct AdamWKernel {
  void (*step)(const KernelContext& ctx, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, uint16_t* compute_copy, const AdamWScalars& s);
};
struct GradNormKernel {
  // *total += the sum of squares of grad[0..n), accumulated in f64; total is one f64 in the device's
  // memory (the device adds in queue order: no host read).
  void (*add_sum_sq)(const KernelContext& ctx, int64_t n, const void* grad, double* total);
};

}  // namespace titan::ops

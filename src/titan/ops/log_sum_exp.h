#pragma once
// The log-sum-exp of one row of f32 logits on the host, for generation's log-probabilities and beam
// scores (models/qwen3/generate.cpp), which read the last position's logits after they come back
// from the device. Not an op: no autograd, no device kernel, one row at a time.
#include <span>

namespace titan::ops {

// log sum exp(logits) over the logits that are not NaN, from the largest (no overflow); the largest
// itself when it is infinite (-inf when every logit is NaN or -inf). f32 exponentials (the CPU
// kernels' exp_poly, ~1 ulp) summed in f32 within runs of 256 and in f64 across runs: about 1e-7
// relative. The loops run on vectors (compiled per ISA): beam search takes the log-softmax of every
// row's 151936 logits at every step, and one f64 std::exp per logit was a third of a 64-row step.
double log_sum_exp_f32(std::span<const float> logits);

}  // namespace titan::ops

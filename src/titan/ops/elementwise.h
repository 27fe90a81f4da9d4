#pragma once
// Elementwise ops: residual add, dtype casts (the bf16 compute copies of fp32
// master weights), scaling, and the in-place accumulation autograd uses.
#include "titan/core/tensor.h"

namespace titan::ops {

// a + b, same shape and dtype (the residual connection). Autograd: both get g.
Tensor add(const Tensor& a, const Tensor& b);

// Converts to dtype. Autograd: the gradient flows back in the input's grad dtype.
// Used to make the bf16 compute copy of an fp32 parameter once per step.
Tensor cast(const Tensor& x, DType dtype);

// x * s. Autograd: g * s.
Tensor scale(const Tensor& x, double s);

// dst += src (no autograd). src may be any float dtype; dst is f32 or f64. Shapes must match.
void add_inplace(Tensor& dst, const Tensor& src);

// dst *= s (no autograd).
void scale_inplace(Tensor& dst, double s);

// Sum of all elements in f64 (no autograd); tests and diagnostics.
double sum_all(const Tensor& x);

}  // namespace titan::ops

#pragma once
// Elementwise ops: residual add, dtype casts (the bf16 compute copies of fp32 master weights),
// scaling, the in-place accumulation autograd uses, and the small index / sum reductions the
// other ops' argument checks need (so no op wrapper loops over tensor data itself).
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

// a + b, same shape and dtype (the residual connection). Autograd: both get g.
Tensor add(const Tensor& a, const Tensor& b);

// Converts to dtype. Autograd: the gradient flows back in the input's grad dtype.
// Used to make the bf16 compute copy of an fp32 parameter once per step.
Tensor cast(const Tensor& x, DType dtype);

// x * s. Autograd: g * s.
Tensor scale(const Tensor& x, double s);

// dst += src (no autograd). src may be any float dtype; dst is its grad dtype (f32, f64 for f64).
void add_inplace(Tensor& dst, const Tensor& src);

// dst *= s (no autograd).
void scale_inplace(Tensor& dst, double s);

// Sum of all elements in f64, in element order (no autograd): loss reductions, tests.
double sum_all(const Tensor& x);

// Index checks on i64 tensors, computed on the tensor's device (one value comes back to the host):
// the flat position of the first element outside [lo, hi) that is not `allowed`, or -1.
int64_t first_index_outside(const Tensor& ids, int64_t lo, int64_t hi, int64_t allowed);
// How many elements differ from `value` (the targets of a loss with an ignore_index).
int64_t count_not_equal(const Tensor& ids, int64_t value);
// The largest element (ids must not be empty).
int64_t max_index(const Tensor& ids);

// Kernels; contiguous buffers of n elements.
struct AddKernel {  // registered per dtype
  void (*forward)(const KernelContext& ctx, int64_t n, const void* a, const void* b, void* out);
};
struct AccumulateKernel {  // registered per src dtype; dst is grad_dtype(src dtype)
  void (*add_inplace)(const KernelContext& ctx, int64_t n, void* dst, const void* src);
};
struct ScaleKernel {  // registered per dtype
  void (*scale_inplace)(const KernelContext& ctx, int64_t n, void* x, double s);
};
struct SumKernel {  // registered per dtype; serial order, f64 accumulator
  double (*sum)(const KernelContext& ctx, int64_t n, const void* x);
};
struct IndexKernel {  // registered for i64
  int64_t (*first_outside)(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t lo, int64_t hi,
                           int64_t allowed);
  int64_t (*count_not_equal)(const KernelContext& ctx, int64_t n, const int64_t* v, int64_t value);
  int64_t (*max)(const KernelContext& ctx, int64_t n, const int64_t* v);
};

}  // namespace titan::ops

#pragma once
// A parameter's random init, drawn where the parameter lives: the CPU fills its buffer with OpenMP
// threads and a GPU with one kernel, from the same arithmetic (normal_draw.h), so a model
// initialised on a GPU holds the bits a CPU run draws, and no host copy of the weights is made.
#include <cstdint>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

// Elements [begin, begin + out.numel()) of the counter-based N(0, std^2) stream `stream`
// (normal_draw.h: element j is component j % 2 of normal pair j / 2), rounded to f32 into out
// (contiguous f32, any device). With bound > 0 a value outside +-bound as stored is drawn again
// (torch's trunc_normal_ distribution); bound = 0 draws plain normals. Any slice of a stream gets the
// same bits as that part of a whole draw, whatever the device or the thread count.
void normal_init(Tensor& out, uint64_t stream, double std, double bound, int64_t begin);

// Registered for f32 (the output); out[0, n) gets elements [begin, begin + n).
struct NormalInitKernel {
  void (*draw)(const KernelContext& ctx, uint64_t stream, double std, double bound, int64_t begin, int64_t n,
               float* out);
};

}  // namespace titan::ops

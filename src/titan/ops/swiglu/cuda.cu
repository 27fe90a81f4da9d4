// swiglu on CUDA (f32 and bf16): grid-stride elementwise loops with the reference's roundings
// (swiglu.h): silu in f32 rounded to the op dtype, then the product rounded. expf is CUDA's
// (within 2 ulp of the correctly rounded value glibc gives the CPU reference), divisions are
// IEEE; no fused multiply-add where the reference has none. The grid-stride loops are unrolled over
// restrict pointers so that several iterations' loads are in flight at once (memory-bound kernels).
#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

template <class T>
__global__ void swiglu_forward_kernel(int64_t n, const T* __restrict__ gate, const T* __restrict__ up,
                                      T* __restrict__ out) {
#pragma unroll 4
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate, i);
    const float silu = round_to<T>(g / __fadd_rn(1.f, expf(-g)));
    store_f32(out, i, __fmul_rn(silu, load_f32(up, i)));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(int64_t n, const T* __restrict__ gate, const T* __restrict__ up,
                                       const float* __restrict__ dy, float* __restrict__ dgate,
                                       float* __restrict__ dup) {
#pragma unroll 4
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate, i), e = expf(-g), one_e = __fadd_rn(1.f, e);
    if (dgate) {
      const float s = 1.f / one_e;
      // dy * up * s * (1 + g * (1 - s)), left to right as the reference.
      const float f = __fadd_rn(1.f, __fmul_rn(g, __fsub_rn(1.f, s)));
      dgate[i] = __fmul_rn(__fmul_rn(__fmul_rn(dy[i], load_f32(up, i)), s), f);
    }
    if (dup) dup[i] = __fmul_rn(dy[i], round_to<T>(g / one_e));
  }
}

template <class T>
void forward(const KernelContext& ctx, int64_t n, const void* gate, const void* up, void* out) {
  if (n == 0) return;
  launch_grid_stride(ctx, "swiglu_forward_kernel", n, swiglu_forward_kernel<T>, n, static_cast<const T*>(gate),
                     static_cast<const T*>(up), static_cast<T*>(out));
}

template <class T>
void backward(const KernelContext& ctx, int64_t n, const void* gate, const void* up, const void* dy, void* dgate,
              void* dup) {
  if (n == 0 || (!dgate && !dup)) return;
  launch_grid_stride(ctx, "swiglu_backward_kernel", n, swiglu_backward_kernel<T>, n, static_cast<const T*>(gate),
                     static_cast<const T*>(up), static_cast<const float*>(dy), static_cast<float*>(dgate),
                     static_cast<float*>(dup));
}

const bool registered =
    cuda::register_float_kernels("swiglu", "CUDA: elementwise grid-stride loop, f32 expf",
                                 "CUDA: elementwise loop in f32, rounded after silu and after the product",
                                 TITAN_FLOAT_KERNEL(SwigluKernel, forward<T>, backward<T>));

}  // namespace
}  // namespace titan::ops

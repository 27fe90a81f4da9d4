// swiglu on CUDA (f32 and bf16): grid-stride elementwise loops with the reference's roundings
// (swiglu.h): silu in f32 rounded to the op dtype, then the product rounded. expf is CUDA's
// (within 2 ulp of the correctly rounded value glibc gives the CPU reference), divisions are
// IEEE; no fused multiply-add where the reference has none. Memory-bound: each step reads and
// writes 4 elements per pointer (8- or 16-byte accesses) where the sizes allow, and the grid-stride
// loops are unrolled over restrict pointers so that several steps' loads are in flight at once.
#include "titan/backend/cuda/common.cuh"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

// Elements v * kVec .. v * kVec + kVec - 1 per step: 4 at a time (8- and 16-byte accesses) when
// the element count and every pointer allow it (vector_aligned), else one.
template <class T, int kVec>
__global__ void swiglu_forward_kernel(int64_t vectors, const T* __restrict__ gate, const T* __restrict__ up,
                                      T* __restrict__ out) {
#pragma unroll 2
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    float g[kVec], u[kVec], y[kVec];
    load_vec<kVec>(gate, v, g);
    load_vec<kVec>(up, v, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) y[e] = __fmul_rn(round_to<T>(g[e] / __fadd_rn(1.f, expf(-g[e]))), u[e]);
    store_vec<kVec>(out, v, y);
  }
}

// Gr: the gradient element type of dy, dgate and dup (float, or bf16 bits for bf16 activation
// gradients: dy widened exactly, dgate and dup rounded once as they are stored).
template <class T, class Gr, int kVec>
__global__ void swiglu_backward_kernel(int64_t vectors, const T* __restrict__ gate, const T* __restrict__ up,
                                       const Gr* __restrict__ dy, Gr* __restrict__ dgate,
                                       Gr* __restrict__ dup) {
#pragma unroll 2
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load_vec<kVec>(gate, v, g);
    load_vec<kVec>(dy, v, d);
    if (dgate) load_vec<kVec>(up, v, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float one_e = __fadd_rn(1.f, expf(-g[e]));
      if (dgate) {
        const float s = 1.f / one_e;
        // dy * up * s * (1 + g * (1 - s)), left to right as the reference.
        const float f = __fadd_rn(1.f, __fmul_rn(g[e], __fsub_rn(1.f, s)));
        dg[e] = __fmul_rn(__fmul_rn(__fmul_rn(d[e], u[e]), s), f);
      }
      du[e] = __fmul_rn(d[e], round_to<T>(g[e] / one_e));
    }
    if (dgate) store_vec<kVec>(dgate, v, dg);
    if (dup) store_vec<kVec>(dup, v, du);
  }
}

template <class T>
void forward(const KernelContext& ctx, int64_t n, const void* gate, const void* up, void* out) {
  if (n == 0) return;
  const T *g = static_cast<const T*>(gate), *u = static_cast<const T*>(up);
  if (vectors_of_4(n, {{gate, sizeof(T)}, {up, sizeof(T)}, {out, sizeof(T)}}))
    launch_grid_stride(ctx, "swiglu_forward_kernel", n / 4, swiglu_forward_kernel<T, 4>, n / 4, g, u,
                       static_cast<T*>(out));
  else
    launch_grid_stride(ctx, "swiglu_forward_kernel", n, swiglu_forward_kernel<T, 1>, n, g, u,
                       static_cast<T*>(out));
}

template <class T, class Gr>
void backward(const KernelContext& ctx, int64_t n, const void* gate, const void* up, const void* dy,
              void* dgate, void* dup) {
  if (n == 0 || (!dgate && !dup)) return;
  const T *g = static_cast<const T*>(gate), *u = static_cast<const T*>(up);
  const Gr* d = static_cast<const Gr*>(dy);
  Gr *dg = static_cast<Gr*>(dgate), *du = static_cast<Gr*>(dup);
  constexpr size_t kGr = sizeof(Gr);
  if (vectors_of_4(n, {{gate, sizeof(T)}, {up, sizeof(T)}, {dy, kGr}, {dgate, kGr}, {dup, kGr}}))
    launch_grid_stride(ctx, "swiglu_backward_kernel", n / 4, swiglu_backward_kernel<T, Gr, 4>, n / 4, g, u, d,
                       dg, du);
  else
    launch_grid_stride(ctx, "swiglu_backward_kernel", n, swiglu_backward_kernel<T, Gr, 1>, n, g, u, d, dg,
                       du);
}

// The bf16-gradient backward of the bf16 kernel (none for f32).
template <class T>
constexpr decltype(SwigluKernel::backward_bf16_grads) bf16_grads_backward() {
  if constexpr (sizeof(T) == 2)
    return &backward<T, uint16_t>;
  else
    return nullptr;
}

const bool registered = cuda::register_float_kernels(
    "swiglu", "CUDA: elementwise grid-stride loop over 4-element vectors, f32 expf",
    "CUDA: elementwise loop in f32, rounded after silu and after the product",
    TITAN_FLOAT_KERNEL(SwigluKernel, forward<T>, backward<T, float>, bf16_grads_backward<T>()));

}  // namespace
}  // namespace titan::ops

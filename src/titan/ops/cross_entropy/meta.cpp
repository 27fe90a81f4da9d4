// cross_entropy on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan::ops {
namespace {

const CrossEntropyKernel cross_entropy_meta{
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, const void*, double,
       void*) {}};

// The fused loss keeps its logits for backward when they fit in keep_bytes, as the CPU kernel
// does (bf16 when rounded to bf16, else the accumulation type): that buffer is often the largest
// activation of a step, so the meta profile allocates it too. The vocabulary-chunk buffers the
// kernels hold while they run are allocated for the call as the CPU kernels allocate them (every
// row taken as a target): [N, chunk] logits when none are kept, and in backward the chunk's
// softmax gradient (the accumulation type's logits buffer reused in place, its f32 rows padded as
// lce_f32_backward_row_stride says, with a bf16 copy for bf16 GEMMs; bf16 throughout when the
// logits are rounded to bf16). Standing in for CUDA
// (core/device_services.h, MetaStandIn), they are the CUDA kernels' buffers instead: forward, the
// chunk's logits and three f32 row statistics when none are kept (kept: one GEMM into them and one
// statistics pass, nothing more); backward, nothing when kept logits of the compute dtype become
// the softmax gradient in place, else the chunk's logits when none are kept and its softmax
// gradient in the compute dtype.
template <DType kDType>
constexpr DType kAccumulation = kDType == DType::F64 ? DType::F64 : DType::F32;

template <DType kDType>
DType chunk_logits_dtype(const LinearCrossEntropyArgs& a) {
  return kDType == DType::BF16 && a.round_logits ? DType::BF16 : kAccumulation<kDType>;
}

int64_t chunk_elements(const LinearCrossEntropyArgs& a) {
  return a.N * (a.chunk < a.V ? a.chunk : a.V);
}

template <DType kDType>
void lce_meta_forward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void*, void*) {
  ctx.services->add_flops(2.0 * double(a.N) * double(a.V) * double(a.D));
  if (a.N == 0) return;
  const DType logits = chunk_logits_dtype<kDType>(a);
  const bool keep = a.kept && a.N * a.V * int64_t(dtype_size(logits)) <= a.keep_bytes;
  if (keep) *a.kept = Tensor::empty({a.N * a.V}, logits, ctx.device);
  if (meta_stands_in_for() == Device::CUDA) {
    if (!keep) {
      const Scratch chunk(ctx, size_t(chunk_elements(a)) * dtype_size(logits)),
          stats(ctx, size_t(3 * a.N) * sizeof(float));
    }
  } else if (!keep) {
    const Tensor chunk = Tensor::empty({chunk_elements(a)}, logits, ctx.device);
  }
}

template <DType kDType>
void lce_meta_backward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void*, double,
                       void* dh, void* dw, bool) {
  ctx.services->add_flops(2.0 * double(a.N) * double(a.V) * double(a.D) * ((dh ? 1 : 0) + (dw ? 1 : 0)));
  if (a.N == 0 || (!dh && !dw)) return;
  const bool kept = a.kept && a.kept->defined();
  const int64_t n = chunk_elements(a);
  if (meta_stands_in_for() == Device::CUDA) {
    if (kept && chunk_logits_dtype<kDType>(a) == kDType) return;  // dlogits in place of the kept logits
    const Scratch logits(ctx, kept ? 0 : size_t(n) * dtype_size(chunk_logits_dtype<kDType>(a))),
        gradient(ctx, size_t(n) * dtype_size(kDType));
    return;
  }
  Tensor logits, gradient;
  if (chunk_logits_dtype<kDType>(a) == DType::BF16) {
    if (!kept) logits = Tensor::empty({n}, DType::BF16, ctx.device);
    gradient = Tensor::empty({n}, DType::BF16, ctx.device);
  } else if (kDType == DType::F32) {  // rows padded as the CPU kernel pads them
    logits = Tensor::empty({a.N * lce_f32_backward_row_stride(a.chunk < a.V ? a.chunk : a.V)}, DType::F32,
                           ctx.device);
  } else {
    logits = Tensor::empty({n}, kAccumulation<kDType>, ctx.device);
    if (kDType == DType::BF16) gradient = Tensor::empty({n}, DType::BF16, ctx.device);
  }
}

const bool cross_entropy_registered =
    kernels::register_meta_kernel("cross_entropy", {DType::F32, DType::BF16, DType::F64}, cross_entropy_meta);
template <DType kDType>
const LinearCrossEntropyKernel lce_meta{lce_meta_forward<kDType>, lce_meta_backward<kDType>};
const bool linear_cross_entropy_f32_registered =
    kernels::register_meta_kernel("linear_cross_entropy", {DType::F32}, lce_meta<DType::F32>);
const bool linear_cross_entropy_bf16_registered =
    kernels::register_meta_kernel("linear_cross_entropy", {DType::BF16}, lce_meta<DType::BF16>);
const bool linear_cross_entropy_f64_registered =
    kernels::register_meta_kernel("linear_cross_entropy", {DType::F64}, lce_meta<DType::F64>);

}  // namespace
}  // namespace titan::ops

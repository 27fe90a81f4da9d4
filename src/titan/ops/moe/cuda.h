#pragma once
// Mixture-of-experts kernels on CUDA, on raw device pointers; semantics of ops/moe/moe.h (router_topk,
// moe_aux_loss, moe_experts, incl. the bf16 rounding points). Floating tensors are f32 or bf16;
// routing weights, probabilities and every gradient are f32. Everything is queued on ctx.stream
// and nothing is read back to the host: expert counts, the routing order and the per-expert row
// offsets stay on the device and the expert GEMMs find their rows from them (grouped GEMMs with
// device-side offsets).
#include <cstdint>

#include "titan/core/device_services.h"
#include "titan/core/dtype.h"

namespace titan::cuda {

// ---- router ------------------------------------------------------------------------------------
// logits [T, E] (f32 or bf16) -> probs [T, E], weights [T, k], indices [T, k] (best first, ties to
// the lower expert), counts [E] (i64 assignments per expert; skipped when null). bias [E] f32 or
// null. E <= 1024.
void router_topk_fwd(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize, DType dtype,
                     const void* logits, const float* bias, float* weights, int64_t* indices, float* probs,
                     int64_t* counts);
// dweights [T, k] and dprobs [T, E] (either null = zero) -> dlogits [T, E] (overwritten).
void router_topk_bwd(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                     const float* probs, const int64_t* indices, const float* dweights, const float* dprobs,
                     float* dlogits);
// counts [E] (i64, overwritten) = assignments per expert among the n = T * k indices (an index
// outside [0, E), which the ops reject before, is not counted).
void moe_count_experts(const KernelContext& ctx, int64_t n, int64_t E, const int64_t* indices,
                       int64_t* counts);

// ---- aux loss ---------------------------------------------------------------------------------
// aux = scale * sum_e count_e * psum_e over all layers (the op passes scale = E / N^2, N = all
// layers' tokens). Per layer, accumulate adds the layer's assignment counts and column sums of
// probs [T, E] into counts [E] (i64) and psum [E] (f64), which the caller zeroes first; finish
// writes the f32 scalar (summed in f64 in expert order).
void moe_aux_accumulate(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, const float* probs,
                        const int64_t* indices, int64_t* counts, double* psum);
void moe_aux_finish(const KernelContext& ctx, int64_t E, double scale, const int64_t* counts,
                    const double* psum, float* loss);
// dprobs [T, E] = dloss[0] * scale * count_e (dloss is a device scalar: no host read).
void moe_aux_bwd(const KernelContext& ctx, int64_t T, int64_t E, double scale, const int64_t* counts,
                 const float* dloss, float* dprobs);

// ---- experts ----------------------------------------------------------------------------------
struct MoeExpertDims {
  int64_t T, D, F, E, k;
};

// The routing order of ops/moe/moe.h on the device: the T*k (token, slot) pairs sorted by expert,
// stably. order, pos: [T*k]; offsets: [E+1]. Indices outside [0, E) are clamped (never read out of
// bounds; moe_count_experts reports them).
void moe_routing_order_cuda(const KernelContext& ctx, const MoeExpertDims& d, const int64_t* indices,
                            int64_t* order, int64_t* pos, int64_t* offsets);

// The bf16 grouped GEMMs: WMMA 64 x 64 tiles (the "default" variant), or raw mma.sync 128 x 128
// tiles with a four-stage cp.async pipeline (the "mma_sync" variant; it uses WMMA for operands whose
// rows are not 16-byte aligned), or the same on 128 x 256 tiles of 8 warps ("mma_sync_wide"), or cuDNN's MoE
// grouped matmul for the forward's row GEMMs (gate, up and down) and the backward's dx (over transposed
// copies of the weights) with mma_sync for the backward's dh (its dy rows gathered by token) and the
// weight gradients (the "cudnn" variant: cuDNN 9.18 or later, an error naming it otherwise; shapes it does
// not take, D or F not a multiple of 8, run mma_sync). Same products, accumulation and rounding; f32 ignores
// it.
enum class MoeGemm { kWmma, kMmaSync, kMmaSyncWide, kCudnn };

// x [T, D], w_gate / w_up [E, F, D], w_down [E, D, F] in `dtype`; weights [T, k] f32.
// act [T*k, 2F] (dtype, routing order: gate | up outputs, saved for backward); y [T, D] (dtype).
void moe_experts_fwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* x,
                     const float* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                     const void* w_down, void* act, void* y, MoeGemm algo = MoeGemm::kWmma);
// dy [T, D] f32; gradients f32, null ones are skipped, all others overwritten, except that
// add_dweights adds dw_gate, dw_up and dw_down to what they hold.
void moe_experts_bwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* x,
                     const float* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                     const void* w_down, const void* act, const float* dy, float* dx, float* dweights,
                     float* dw_gate, float* dw_up, float* dw_down, MoeGemm algo = MoeGemm::kWmma,
                     bool add_dweights = false);

// moe_combine (ops/moe/moe.h): rows [T*k, D] in routing order (dtype), weights [T, k] f32, y [T, D]
// (dtype); backward: dy [T, D] f32, drows [T*k, D] and dweights [T, k] f32, null ones skipped. F unused.
void moe_combine_fwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* rows,
                     const float* weights, const int64_t* indices, void* y);
void moe_combine_bwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* rows,
                     const float* weights, const int64_t* indices, const float* dy, float* drows,
                     float* dweights);

}  // namespace titan::cuda

#pragma once
// Cross-entropy and the fused output projection + cross-entropy on CUDA, on raw device pointers;
// the semantics are those of ops/cross_entropy/cross_entropy.h. Logits, hidden and weight are f32 or bf16;
// lse, row_loss and every gradient are f32 (the grad dtype of both). Everything is queued on
// ctx.stream: no host synchronisation.
//
// The op validates the labels before calling (ops/cross_entropy/cross_entropy.cpp); should a label outside
// [0, V) still arrive, the kernels treat its row as ignored: they never read out of bounds.
#include <cstdint>

#include "titan/core/device_services.h"
#include "titan/core/dtype.h"

namespace titan::cuda {

// logits [N, V] -> lse [N], row_loss [N] (0 for ignored rows).
void cross_entropy_fwd(const KernelContext& ctx, int64_t N, int64_t V, DType dtype, const void* logits,
                       const int64_t* labels, int64_t ignore_index, float* lse, float* row_loss);
// dlogits [N, V] = scale * (softmax - onehot), 0 for ignored rows.
void cross_entropy_bwd(const KernelContext& ctx, int64_t N, int64_t V, DType dtype, const void* logits,
                       const int64_t* labels, int64_t ignore_index, const float* lse, double scale,
                       float* dlogits);

struct LinearCrossEntropyDims {
  int64_t N, V, D;
  int64_t chunk;      // vocabulary columns per GEMM
  bool round_logits;  // bf16: logits rounded to bf16 before the softmax statistics
};

// hidden [N, D], weight [V, D] -> lse [N], row_loss [N]: one GEMM per vocabulary chunk (cuBLASLt,
// f32 accumulation) and an online logsumexp over the chunks. keep_logits (optional): [N, V] of the
// logits' type (bf16 when rounded to bf16, else f32), for the backward to read instead of
// recomputing them; then one GEMM writes all of them there and one pass takes the row statistics
// (no chunks: one GEMM over the whole vocabulary keeps every SM busy where a chunk's would not).
void linear_cross_entropy_fwd(const KernelContext& ctx, const LinearCrossEntropyDims& d, DType dtype,
                              const void* hidden, const void* weight, const int64_t* labels,
                              int64_t ignore_index, float* lse, float* row_loss, void* keep_logits = nullptr);
// dhidden [N, D] and dweight [V, D] (either may be null; dhidden overwritten, dweight too unless
// add_dweight, then added to): per chunk the logits are recomputed (or read from kept_logits, the
// forward's keep_logits), dlogits = scale * (softmax - onehot) formed (rounded to bf16 for bf16
// operands) and the two GEMMs dhidden += dlogits W_chunk, dweight_chunk (+)= dlogits^T hidden run
// on it. Kept logits of the operands' type (bf16 rounded logits of a bf16 model, f32 of an f32 one)
// are turned into dlogits in place, all of them in one pass, and the two GEMMs run once over the
// whole vocabulary: kept_logits holds dlogits afterwards.
void linear_cross_entropy_bwd(const KernelContext& ctx, const LinearCrossEntropyDims& d, DType dtype,
                              const void* hidden, const void* weight, const int64_t* labels,
                              int64_t ignore_index, const float* lse, double scale, float* dhidden,
                              float* dweight, void* kept_logits = nullptr, bool add_dweight = false);

}  // namespace titan::cuda

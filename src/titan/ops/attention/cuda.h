#pragma once
// Causal grouped-query attention on CUDA, forward and backward, on raw device pointers. Same layout
// and semantics as the CPU kernels (ops/attention/cpu.h, ops/attention/attention.h):
//   q, out: [B, S, Hq, D] in `dtype`    k, v: [B, S, Hkv, D] in `dtype`    lse: [B, Hq, S] f32
//   dout, dq: [B, S, Hq, D] f32          dk, dv: [B, S, Hkv, D] f32 (the grad dtype of f32 and bf16)
// Query head h reads kv head h / (Hq / Hkv); query i attends to keys 0..i; scores are scaled by
// `scale`. The backward overwrites dq, dk and dv. All work is queued on ctx.stream (no host sync).
//
// Three algorithms in four kernel families (docs/kernels.md, "CUDA kernels: attention, losses, MoE"):
//  - f32 math (attention_*_f32_math): warp-per-row tiles with every product and sum in f32 and
//    the output rounded once; any head_dim up to 512, f32 or bf16 tensors. What the f32 model runs.
//  - tensor cores (attention_*_tensor_cores, attention_*_mma): bf16 only, head_dim 64 or 128;
//    FlashAttention-2 on bf16 WMMA tiles, or on raw mma.sync, with f32 accumulation. P, dS and dout
//    are rounded to bf16 before their products, as GPU FlashAttention and cuDNN do (the CPU
//    "bf16_probs" numerics).
//  - cuDNN (attention_*_cudnn): bf16, cuDNN 9's fused flash-attention engines through its backend
//    graph API (backend/cuda/cudnn_attention.h); dout is rounded to bf16 for cuDNN and its bf16
//    dq, dk, dv are widened to f32. Same tolerance as the tensor-core pairs.
#include <cstdint>
#include <string>

#include "titan/core/device_services.h"
#include "titan/core/dtype.h"
#include "titan/ops/attention/attention.h"

namespace titan::cuda {

using ops::AttentionShape;

// Empty when the tensor-core kernels take this shape and dtype, else why not.
std::string attention_tensor_cores_unsupported(const AttentionShape& s, DType dtype);

// f32 math, any head_dim in [1, 512]; dtype f32 or bf16.
void attention_fwd_f32_math(const KernelContext& ctx, const AttentionShape& s, DType dtype, const void* q,
                            const void* k, const void* v, void* out, float* lse);
void attention_bwd_f32_math(const KernelContext& ctx, const AttentionShape& s, DType dtype, const void* q,
                            const void* k, const void* v, const void* out, const float* lse,
                            const float* dout, float* dq, float* dk, float* dv);

// Tensor cores: bf16, head_dim 64 or 128 (an error naming the shape otherwise).
void attention_fwd_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const bf16* q,
                                const bf16* k, const bf16* v, bf16* out, float* lse);
// The same pair on raw mma.sync with the scores kept in registers (FlashAttention-2's layout);
// same numerics and head_dims as the WMMA kernels above. The "mma_sync" variant: the default of a
// block-causal bf16 job on cuda (train/startup.cpp; cuDNN would build a plan per document length),
// measured against the others in bench/cuda_attention_bench.cpp.
void attention_fwd_mma(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                       const bf16* v, bf16* out, float* lse);
void attention_bwd_mma(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                       const bf16* v, const bf16* out, const float* lse, const float* dout, float* dq,
                       float* dk, float* dv);
// cuDNN's fused attention (bf16; head_dim a multiple of 8 up to 128): an error naming the shape or
// the missing library otherwise (attention_cudnn_unsupported says which).
std::string attention_cudnn_unsupported(const AttentionShape& s);
void attention_fwd_cudnn(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                         const bf16* v, bf16* out, float* lse);
void attention_bwd_cudnn(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                         const bf16* v, const bf16* out, const float* lse, const float* dout, float* dq,
                         float* dk, float* dv);
void attention_bwd_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const bf16* q,
                                const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                const float* dout, float* dq, float* dk, float* dv);

}  // namespace titan::cuda

#pragma once
// Causal grouped-query attention kernels for the CPU, forward and backward, on raw pointers.
//
// Layout (what a Qwen3 layer has right after the q/k/v projections, no transpose):
//   q, out, dq, dout: [B, S, Hq, D]     k, v, dk, dv: [B, S, Hkv, D]     lse: [B, Hq, S]
// all contiguous row-major. Hq = Hkv * r; query head h reads kv head h / r (repeat_interleave).
// Query position i attends to keys 0..i; scores are scaled by `scale` (the model passes D^-0.5).
// lse[b, h, i] = log(sum_j exp(scale * q_i . k_j)) is saved by the forward for the backward.
//
// The backward overwrites dq, dk and dv (it does not accumulate into them).
#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/ops/attention/attention.h"

namespace titan::cpu {

using ops::AttentionShape;

// Plain loops, one query row of scores at a time (O(S) extra memory), defined in reference.cpp.
// The ground truth for tests.
void attention_fwd_reference_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 float* out, float* lse);
void attention_bwd_reference_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                 float* dv);
void attention_fwd_reference_f64(const AttentionShape& s, const double* q, const double* k, const double* v,
                                 double* out, double* lse);
void attention_bwd_reference_f64(const AttentionShape& s, const double* q, const double* k, const double* v,
                                 const double* out, const double* lse, const double* dout, double* dq,
                                 double* dk, double* dv);

// Flash-style: 64x64 query x key tiles, online softmax in f32, never an S x S matrix, fully masked
// tiles skipped. The backward recomputes P from lse (FlashAttention-2); each thread owns whole kv heads
// (or interleaved kv tiles of one), so dk/dv never race. Results have the same bits on any number of
// threads. AVX-512 when the CPU has it, else AVX2 + FMA
// when it has those, else portable loops (chosen at run time: cpu::kernel_isa, which tests cap).
void attention_fwd_flash_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                             float* out, float* lse);
void attention_bwd_flash_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* dout, float* dq, float* dk,
                             float* dv);
// bf16 tensors, f32 lse, all arithmetic in f32 (inputs are widened tile by tile, results rounded once).
// With AVX512-BF16, q.k and dout.v use vdpbf16ps (with AMX, TDPBF16PS tiles for whole 64-key tiles
// when D % 32 == 0): bf16 x bf16 products are exact in f32, sums are f32.
void attention_fwd_flash_bf16(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                              float* lse);
void attention_bwd_flash_bf16(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                              bf16* dv);

// The same with P and dS rounded to bf16 (as GPU FlashAttention and a bf16 torch autograd do), so
// that every product runs on vdpbf16ps, or on AMX tiles where the CPU has them and D % 32 == 0:
// faster, but no longer "f32 math rounded once". Needs
// AVX512-BF16 (attention_bf16_probs_available); where the CPU or the kernel-ISA cap (cpu_info.h) lacks
// it, these run the exact kernels above. Off AMX (or with D % 32 != 0) the forward's P V needs
// D % 16 == 0 and the backward's products D % 64 == 0; otherwise those products stay f32.
bool attention_bf16_probs_available();
void attention_fwd_flash_bf16_probs(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v,
                                    bf16* out, float* lse);
void attention_bwd_flash_bf16_probs(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v,
                                    const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                                    bf16* dv);

}  // namespace titan::cpu

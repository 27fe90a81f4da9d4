#pragma once
// Causal grouped-query attention:
//   out[b, i, h] = sum_{j <= i} softmax_j(scale * q[b, i, h] . k[b, j, g]) v[b, j, g],  g = h / (Hq / Hkv)
// q [B, S, Hq, D], k and v [B, S, Hkv, D] -> out [B, S, Hq, D]. Softmax statistics in f32
// (f64 in f64); the forward saves the row logsumexp for the backward. No S x S matrix is
// ever formed (flash-style tiles; the reference holds one row of scores).
#include <vector>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

// The problem every attention kernel solves (any device). Layout, all contiguous row-major:
//   q, out, dq, dout: [B, S, Hq, D]     k, v, dk, dv: [B, S, Hkv, D]     lse: [B, Hq, S]
// Hq = Hkv * r; query head h reads kv head h / r; query i attends to keys 0..i; scores are scaled
// by `scale`. lse[b, h, i] = log(sum_j exp(scale * q_i . k_j)) is saved by the forward. A kernel
// sees whole causal rows only: block-causal attention (DocumentSpans) calls it once per document.
struct AttentionShape {
  int64_t B, S, Hq, Hkv, D;
  float scale;
  size_t q_numel() const { return size_t(B * S * Hq * D); }    // q, out, dq, dout
  size_t kv_numel() const { return size_t(B * S * Hkv * D); }  // k, v, dk, dv
};

// Every dimension positive and Hq a multiple of Hkv, else an error naming `who` and the shape.
void check_attention_shape(const AttentionShape& s, const char* who);

// Where attention is cut inside packed rows (torchtitan's attn_mask_type = "block_causal"): a query
// attends causally to the keys of its own document only. `starts` holds the offset, in the
// flattened [B * S] tokens, of every document's first token, increasing from 0, with every row
// start b * S among them. Empty: each row is one document (plain causal attention).
struct DocumentSpans {
  std::vector<int64_t> starts;
  bool empty() const { return starts.empty(); }
};

// out = attention of q over k and v, causal within each document of `documents` (whole rows when
// empty). Each document is its own kernel call on a [1, length, H, D] view of the rows (rows
// holding one document go together, as [rows, S, H, D]), so every kernel and device computes
// block-causal attention exactly as it computes causal attention, with no mask and no FLOP spent
// across documents. The saved lse is laid out per call ([rows, Hq, length] at the call's first
// token x Hq); only this op reads it. A document's views start at any token, so a kernel must not
// assume its pointers aligned beyond their element type: the CUDA kernels that load 16-byte vectors
// check their pointers and take their f32-math kernels where a view is not on a 16-byte boundary.
// On a GPU each call is a launch (a few microseconds) whose grid covers one document's tiles only:
// the price of reusing the causal kernels until a variable-length kernel schedules every
// document's tiles in one launch (docs/performance.md, "Block-causal attention").
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                 const DocumentSpans& documents = {});

// dout, dq, dk, dv are in the grad dtype (f32, or f64 for f64); lse is f32 (f64 for f64).
struct AttentionKernel {
  void (*forward)(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse);
  void (*backward)(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                   const void* lse, const void* dout, void* dq, void* dk, void* dv);
  // bf16 activation gradients (ops/activation_grads.h), bf16 kernels only, null where the kernel
  // has none: the backward with dout, dq, dk and dv in bf16.
  void (*backward_bf16_grads)(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                              const void* v, const void* out, const void* lse, const void* dout, void* dq,
                              void* dk, void* dv) = nullptr;
};

// AttentionKernel entry points around kernels on typed pointers (cpu.h): T is the element type of
// q, k, v and out, G that of lse, dout and the gradients.
template <class T, class G>
using AttentionForwardOf = void (*)(const AttentionShape&, const T* q, const T* k, const T* v, T* out,
                                    G* lse);
template <class T, class G>
using AttentionBackwardOf = void (*)(const AttentionShape&, const T* q, const T* k, const T* v, const T* out,
                                     const G* lse, const G* dout, G* dq, G* dk, G* dv);

template <class T, class G, AttentionForwardOf<T, G> kForward>
void attention_forward_entry(const KernelContext&, const AttentionShape& s, const void* q, const void* k,
                             const void* v, void* out, void* lse) {
  kForward(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
           static_cast<T*>(out), static_cast<G*>(lse));
}
template <class T, class G, AttentionBackwardOf<T, G> kBackward>
void attention_backward_entry(const KernelContext&, const AttentionShape& s, const void* q, const void* k,
                              const void* v, const void* out, const void* lse, const void* dout, void* dq,
                              void* dk, void* dv) {
  kBackward(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
            static_cast<const T*>(out), static_cast<const G*>(lse), static_cast<const G*>(dout),
            static_cast<G*>(dq), static_cast<G*>(dk), static_cast<G*>(dv));
}

}  // namespace titan::ops

#pragma once
// Attention of the newest queries over a key/value cache (inference: `titan generate`):
//   out[b, i, h] = sum_{j <= p_i} softmax_j(scale * q[b, i, h] . k[b, j, g]) v[b, j, g]
//   p_i = length - Sq + i  (query i is the i-th of the last Sq positions),  g = h / (Hq / Hkv)
// q [B, Sq, Hq, D]; k and v are caches [B, capacity, Hkv, D] whose first `length` positions hold
// the keys and values of positions 0..length-1, the queries' own included; positions from `length`
// on are never read. With Sq == length it is ops::attention's causal attention. Softmax statistics
// in f32 (f64 in f64), the output rounded once to the op dtype.
//
// Rows of a batch that hold prompts of different lengths (batched generation) are left-padded: row
// b's cache begins with first_key[b] padding positions, which no query reads. Its queries attend
// over keys first_key[b] .. p_i only (negative values count as 0; a query with no key left gets a
// zero output).
//
// Forward only: generation records no gradient, so there is no backward to keep in step with
// ops::attention's; a call whose inputs would need one is an error.
#include <cstdint>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

// The problem every cached_attention kernel solves. Layout, contiguous row-major:
//   q, out: [B, Sq, Hq, D]     k, v: [B, capacity, Hkv, D], positions 0..length-1 read
struct CachedAttentionShape {
  int64_t B, Sq, length, capacity, Hq, Hkv, D;
  float scale;
};

// Every dimension positive, Sq <= length <= capacity and Hq a multiple of Hkv, else an error naming
// `who` and the shape.
void check_cached_attention_shape(const CachedAttentionShape& s, const char* who);

// first_key: i64 [B] on q's device, contiguous, or undefined (every row reads from position 0).
Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t length,
                        double scale, const Tensor& first_key = Tensor());

// first_key: B values on the kernel's device, or null for 0 in every row.
struct CachedAttentionKernel {
  void (*forward)(const KernelContext& ctx, const CachedAttentionShape& s, const void* q, const void* k,
                  const void* v, const int64_t* first_key, void* out);
};

}  // namespace titan::ops

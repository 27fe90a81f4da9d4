// Fast CPU rope: tokens (b, s) are split among OpenMP threads; for each token the cos/sin row of
// the shared table is read once and applied to all H heads with `omp simd` loops over the D/2
// frequencies, compiled twice with target_clones (AVX-512 and baseline x86-64) and picked at load
// time. The arithmetic is the reference's, in the same order, with floating-point contraction off
// (an FMA would skip the rounding of the products that torch does), so results are bit-identical
// to the reference. bf16 rounding is the branch-free form of titan::f32_to_bf16.
//   "default":     row = table[pos[b, s]]            (any positions)
//   "gather_free": row = table[p0_b + s]             (positions must be p0_b, p0_b + 1, ... per batch row)
#include "titan/ops/rope/rope.h"

#include <bit>
#include <cstring>

#include "titan/core/check.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/kernels/registry.h"

#define TITAN_CLONES_NO_CONTRACT \
  __attribute__((target_clones("arch=x86-64-v4", "default"), optimize("fp-contract=off")))

namespace titan::cpu {

namespace {

using namespace lanes;

// One token: H heads of D elements, cos/sin rows of D/2.
template <class T>
[[gnu::always_inline]] inline void forward_token_impl(int64_t H, int64_t D, const float* cr, const float* sr,
                                                      const T* x, T* y) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h) {
    const T* xr = x + h * D;
    T* yr = y + h * D;
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const float c = rnd(T{}, cr[j]), s = rnd(T{}, sr[j]);
      const float x1 = ld(xr[j]), x2 = ld(xr[j + half]);
      st(yr + j, rnd(T{}, x1 * c) + rnd(T{}, -x2 * s));
      st(yr + j + half, rnd(T{}, x2 * c) + rnd(T{}, x1 * s));
    }
  }
}

template <class T>
[[gnu::always_inline]] inline void backward_token_impl(int64_t H, int64_t D, const float* cr, const float* sr,
                                                       const float* dy, float* dx) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h) {
    const float* g = dy + h * D;
    float* d = dx + h * D;
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const float c = rnd(T{}, cr[j]), s = rnd(T{}, sr[j]);
      d[j] = g[j] * c + g[j + half] * s;
      d[j + half] = g[j + half] * c - g[j] * s;
    }
  }
}

TITAN_CLONES_NO_CONTRACT void forward_token(int64_t H, int64_t D, const float* cr, const float* sr, const float* x,
                                float* y) {
  forward_token_impl(H, D, cr, sr, x, y);
}
TITAN_CLONES_NO_CONTRACT void forward_token(int64_t H, int64_t D, const float* cr, const float* sr, const uint16_t* x,
                                uint16_t* y) {
  forward_token_impl(H, D, cr, sr, x, y);
}
TITAN_CLONES_NO_CONTRACT void backward_token_f32(int64_t H, int64_t D, const float* cr, const float* sr, const float* dy,
                                     float* dx) {
  backward_token_impl<float>(H, D, cr, sr, dy, dx);
}
TITAN_CLONES_NO_CONTRACT void backward_token_bf16(int64_t H, int64_t D, const float* cr, const float* sr, const float* dy,
                                      float* dx) {
  backward_token_impl<uint16_t>(H, D, cr, sr, dy, dx);
}

// The table row of token (b, s): pos[b, s] for the default, p0_b + s for gather_free.
template <bool kGatherFree>
inline int64_t row_of(const int64_t* pos, int64_t S, int64_t bs) {
  if constexpr (kGatherFree) return pos[bs - bs % S] + bs % S;
  return pos[bs];
}

template <bool kGatherFree>
void check_positions(int64_t B, int64_t S, const int64_t* pos, const ops::RopeTable& table) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t p = pos[b * S + s];
      if constexpr (kGatherFree)
        TITAN_CHECK(p == pos[b * S] + s,
                    "rope: variant 'gather_free' needs positions p0, p0+1, ... along S in "
                    "every batch row; positions[",
                    b, ", ", s, "] = ", p, " but positions[", b, ", 0] = ", pos[b * S],
                    " (use the default variant for arbitrary positions)");
      TITAN_CHECK(p >= 0 && p < table.positions, "rope: position ", p, " outside the cos/sin table (",
                  table.positions, " rows)");
    }
}

template <class T, bool kGatherFree>
void rope_forward(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos, const ops::RopeTable& table,
                  const void* xv, void* yv) {
  check_positions<kGatherFree>(B, S, pos, table);
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (B * S * H * D > 32768)
  for (int64_t bs = 0; bs < B * S; ++bs) {
    const int64_t r = row_of<kGatherFree>(pos, S, bs);
    forward_token(H, D, table.cos.data() + r * half, table.sin.data() + r * half, x + bs * H * D,
                  y + bs * H * D);
  }
}

template <class T, bool kGatherFree>
void rope_backward(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos,
                   const ops::RopeTable& table, const void* dyv, void* dxv) {
  check_positions<kGatherFree>(B, S, pos, table);
  const float* dy = static_cast<const float*>(dyv);
  float* dx = static_cast<float*>(dxv);
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (B * S * H * D > 32768)
  for (int64_t bs = 0; bs < B * S; ++bs) {
    const int64_t r = row_of<kGatherFree>(pos, S, bs);
    const float *cr = table.cos.data() + r * half, *sr = table.sin.data() + r * half;
    if constexpr (std::is_same_v<T, float>)
      backward_token_f32(H, D, cr, sr, dy + bs * H * D, dx + bs * H * D);
    else
      backward_token_bf16(H, D, cr, sr, dy + bs * H * D, dx + bs * H * D);
  }
}

using ops::RopeKernel;
const bool registered = kernels::register_kernels(
    "rope", Device::CPU,
    {{DType::F32, "default", "cached cos/sin table indexed by position, OpenMP tokens, SIMD",
      RopeKernel{rope_forward<float, false>, rope_backward<float, false>, true}},
     {DType::BF16, "default", "cached cos/sin table indexed by position, bf16 arithmetic, OpenMP, SIMD",
      RopeKernel{rope_forward<uint16_t, false>, rope_backward<uint16_t, false>, true}},
     {DType::F32, "gather_free",
      "table rows p0..p0+S-1 read in order; positions must be contiguous ranges per batch row (checked per "
      "call)",
      RopeKernel{rope_forward<float, true>, rope_backward<float, true>, true}},
     {DType::BF16, "gather_free",
      "table rows p0..p0+S-1 read in order, bf16 arithmetic; positions must be contiguous ranges per batch "
      "row (checked per call)",
      RopeKernel{rope_forward<uint16_t, true>, rope_backward<uint16_t, true>, true}}});

}  // namespace

}  // namespace titan::cpu

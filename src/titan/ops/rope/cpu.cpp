// Fast CPU rope: tokens (b, s) are split among OpenMP threads; for each token the cos/sin row of
// the shared table is read once and applied to all H heads with `omp simd` loops over the D/2
// frequencies, compiled three times with target_clones (AVX-512, AVX2, baseline x86-64) and picked
// at load time. The arithmetic is the reference's, in the same order, with floating-point contraction off
// (an FMA would skip the rounding of the products that torch does), so results are bit-identical
// to the reference. bf16 rounding is the branch-free form of titan::f32_to_bf16.
//   "default":     row = table[pos[b, s]]            (any positions)
//   "gather_free": row = table[p0_b + s]             (positions must be p0_b, p0_b + 1, ... per batch row)
#include "titan/ops/rope/rope.h"

#include <bit>
#include <cstring>
#include <type_traits>

#include "titan/core/check.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/kernels/registry.h"

#define TITAN_CLONES_NO_CONTRACT \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("fp-contract=off")))

namespace titan::cpu {

namespace {

using namespace lanes;

// One token: H heads of D elements, cos/sin rows of D/2. Each pair (x1, x2) = (x[j], x[j + D/2])
// becomes (x1 c - x2 s, x2 c + x1 s), with c and s rounded to T and each product rounded to Elem
// (as torch does in that dtype). The backward (kTranspose) is the transpose rotation, s -> -s, of
// f32 gradients (Elem = float: no rounding); negating s is exact, so x1 c + x2 s and x2 c - x1 s
// come out as if written directly.
template <class T, class Elem, bool kTranspose>
[[gnu::always_inline]] inline void rotate_token_impl(int64_t H, int64_t D, const float* cr, const float* sr,
                                                     const Elem* x, Elem* y) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h) {
    const Elem* xr = x + h * D;
    Elem* yr = y + h * D;
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const float c = rnd(T{}, cr[j]), s = kTranspose ? -rnd(T{}, sr[j]) : rnd(T{}, sr[j]);
      const float x1 = ld(xr[j]), x2 = ld(xr[j + half]);
      st(yr + j, rnd(Elem{}, x1 * c) + rnd(Elem{}, -x2 * s));
      st(yr + j + half, rnd(Elem{}, x2 * c) + rnd(Elem{}, x1 * s));
    }
  }
}

// target_clones takes no templates: one cloned function per instance of rotate_token_impl (the
// forward in the element type, the backward in f32 with c, s rounded to the element type).
#define TITAN_ROTATE_TOKEN(name, T, Elem, kTranspose)                                                    \
  TITAN_CLONES_NO_CONTRACT void name(int64_t H, int64_t D, const float* cr, const float* sr, const Elem* x, \
                                     Elem* y) {                                                          \
    rotate_token_impl<T, Elem, kTranspose>(H, D, cr, sr, x, y);                                          \
  }
TITAN_ROTATE_TOKEN(forward_token, float, float, false)
TITAN_ROTATE_TOKEN(forward_token, uint16_t, uint16_t, false)
TITAN_ROTATE_TOKEN(backward_token_f32, float, float, true)
TITAN_ROTATE_TOKEN(backward_token_bf16, uint16_t, float, true)
#undef TITAN_ROTATE_TOKEN

// One token of T's forward or backward.
template <class T, bool kBackward, class Elem>
inline void rotate_token(int64_t H, int64_t D, const float* cr, const float* sr, const Elem* x, Elem* y) {
  if constexpr (!kBackward)
    forward_token(H, D, cr, sr, x, y);
  else
    (std::is_same_v<T, float> ? backward_token_f32 : backward_token_bf16)(H, D, cr, sr, x, y);
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

// The forward (x, y of T) or the backward (dy, dx in f32) over all B * S tokens.
template <class T, bool kGatherFree, bool kBackward>
void rope_rotate(const KernelContext& ctx, int64_t B, int64_t S, int64_t H, int64_t D, const int64_t* pos,
                 const ops::RopeTable& table, const void* xv, void* yv) {
  using Elem = std::conditional_t<kBackward, float, T>;
  check_positions<kGatherFree>(B, S, pos, table);
  const Elem* x = static_cast<const Elem*>(xv);
  Elem* y = static_cast<Elem*>(yv);
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (B * S * H * D > 32768)
  for (int64_t bs = 0; bs < B * S; ++bs) {
    const int64_t r = row_of<kGatherFree>(pos, S, bs);
    rotate_token<T, kBackward>(H, D, table.cos.data() + r * half, table.sin.data() + r * half, x + bs * H * D,
                               y + bs * H * D);
  }
}

template <class T, bool kGatherFree>
ops::RopeKernel rope_kernel() {
  return {rope_rotate<T, kGatherFree, false>, rope_rotate<T, kGatherFree, true>, true};
}

const bool registered = kernels::register_kernels(
    "rope", Device::CPU,
    {{DType::F32, "default", "cached cos/sin table indexed by position, OpenMP tokens, SIMD",
      rope_kernel<float, false>()},
     {DType::BF16, "default", "cached cos/sin table indexed by position, bf16 arithmetic, OpenMP, SIMD",
      rope_kernel<uint16_t, false>()},
     {DType::F32, "gather_free",
      "table rows p0..p0+S-1 read in order; positions must be contiguous ranges per batch row (checked per "
      "call)",
      rope_kernel<float, true>()},
     {DType::BF16, "gather_free",
      "table rows p0..p0+S-1 read in order, bf16 arithmetic; positions must be contiguous ranges per batch "
      "row (checked per call)",
      rope_kernel<uint16_t, true>()}});

}  // namespace

}  // namespace titan::cpu

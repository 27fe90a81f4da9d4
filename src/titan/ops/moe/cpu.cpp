// moe_experts "default": expert-parallel grouped GEMMs. The T*k (token, slot) pairs are put in
// routing order (counting sort by expert, ops::moe_routing_order), so every expert's rows are
// contiguous. The experts are then spread over the OpenMP threads (largest first, dynamic
// schedule): a thread gathers its expert's rows, runs the expert's GEMMs single-threaded (gate,
// up, down; the backward's six) and the SwiGLU step on rows that are still in its cache. With
// tens of experts of ~100 rows each this keeps every core busy on one GEMM stream, where
// threading inside each small GEMM would pay a fork/join per GEMM (~500 per layer pass).
// The weighted un-permute sums a token's k rows in ascending expert order, rounding like the
// reference (transformers' index_add_ over experts), so results do not depend on the thread
// count. Experts with no rows only zero their weight gradients.
#include "titan/ops/moe/moe.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/kernels/registry.h"

namespace titan::cpu {

namespace {

using namespace lanes;
using ops::MoeDims;

// Storage types: float, or uint16_t holding bf16 bits (the lanes.h convention).
inline const bf16* as_bf16(const uint16_t* p) { return reinterpret_cast<const bf16*>(p); }
inline bf16* as_bf16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

// C = op(A) @ op(B) in the storage type (bf16 output rounded once).
void gemm_store(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
}
void gemm_store(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                const uint16_t* B, int64_t ldb, uint16_t* C, int64_t ldc) {
  gemm_bf16_out(ta, tb, M, N, K, 1.f, as_bf16(A), lda, as_bf16(B), ldb, as_bf16(C), ldc);
}
// f32 C = op(A) @ op(B) + beta * C.
void gemm_acc(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}
void gemm_acc(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, 1.f, as_bf16(A), lda, as_bf16(B), ldb, beta, C, ldc);
}

// ---- row kernels (AVX-512, AVX2 and baseline clones) ------------------------------------------

template <class S, class T>
[[gnu::always_inline]] inline void convert_row_impl(int64_t n, const S* src, T* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) st(dst + i, ld(src[i]));
}
TITAN_CLONES void convert_row(int64_t n, const float* s, float* d) { convert_row_impl(n, s, d); }
TITAN_CLONES void convert_row(int64_t n, const float* s, uint16_t* d) { convert_row_impl(n, s, d); }
TITAN_CLONES void convert_row(int64_t n, const uint16_t* s, uint16_t* d) { convert_row_impl(n, s, d); }

// h = silu(gate) * up for one row of act = [gate | up] (rounded like torch: silu, then the product).
template <class T>
[[gnu::always_inline]] inline void silu_mul_row_impl(int64_t F, const T* a, T* h) {
#pragma omp simd
  for (int64_t f = 0; f < F; ++f) {
    const float g = ld(a[f]);
    st(h + f, rnd(T{}, g * sigmoid_poly(g)) * ld(a[F + f]));
  }
}
TITAN_CLONES void silu_mul_row(int64_t F, const float* a, float* h) { silu_mul_row_impl(F, a, h); }
TITAN_CLONES void silu_mul_row(int64_t F, const uint16_t* a, uint16_t* h) { silu_mul_row_impl(F, a, h); }

// Backward of one row given dhr = dy_row @ W_down (before the routing weight w): recomputes
// h = silu(g) * u (rounded as in the forward), returns sum_f dhr[f] * h[f] (the routing weight's
// gradient), and when dgu is set writes [d gate | d up] of (w * dhr) in the storage type.
// kGrads is a template argument rather than a test of dgu in the loop: GCC does not unswitch the
// bf16 loop, and a branch in it keeps its AVX2 clone scalar ("control flow in loop").
template <bool kGrads, class T>
[[gnu::always_inline]] inline float swiglu_backward_row_impl(int64_t F, const T* a, const float* dhr, float w,
                                                             T* h, T* dgu) {
  float dot = 0.f;
#pragma omp simd reduction(+ : dot)
  for (int64_t f = 0; f < F; ++f) {
    const float g = ld(a[f]), u = ld(a[F + f]);
    const float sg = sigmoid_poly(g);
    const float s = rnd(T{}, g * sg);
    st(h + f, s * u);
    dot += dhr[f] * ld(h[f]);
    if constexpr (kGrads) {
      const float dh = w * dhr[f];
      st(dgu + f, dh * u * sg * (1.0f + g * (1.0f - sg)));
      st(dgu + F + f, dh * s);
    }
  }
  return dot;
}
TITAN_CLONES float swiglu_backward_row(int64_t F, const float* a, const float* dhr, float w, float* h,
                                       float* dgu) {
  return dgu ? swiglu_backward_row_impl<true>(F, a, dhr, w, h, dgu)
             : swiglu_backward_row_impl<false>(F, a, dhr, w, h, dgu);
}
TITAN_CLONES float swiglu_backward_row(int64_t F, const uint16_t* a, const float* dhr, float w, uint16_t* h,
                                       uint16_t* dgu) {
  return dgu ? swiglu_backward_row_impl<true>(F, a, dhr, w, h, dgu)
             : swiglu_backward_row_impl<false>(F, a, dhr, w, h, dgu);
}

// y += round(o * w) (rounded after the add), one contribution of the weighted un-permute.
template <class T>
[[gnu::always_inline]] inline void add_weighted_row_impl(int64_t D, const T* o, float w, T* y) {
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) st(y + c, ld(y[c]) + rnd(T{}, ld(o[c]) * w));
}
TITAN_CLONES void add_weighted_row(int64_t D, const float* o, float w, float* y) {
  add_weighted_row_impl(D, o, w, y);
}
TITAN_CLONES void add_weighted_row(int64_t D, const uint16_t* o, float w, uint16_t* y) {
  add_weighted_row_impl(D, o, w, y);
}

template <class T>
[[gnu::always_inline]] inline void scale_row_impl(int64_t D, float w, T* r) {
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) st(r + c, ld(r[c]) * w);
}
TITAN_CLONES void scale_row(int64_t D, float w, float* r) { scale_row_impl(D, w, r); }
TITAN_CLONES void scale_row(int64_t D, float w, uint16_t* r) { scale_row_impl(D, w, r); }

TITAN_CLONES void add_row(int64_t D, const float* s, float* d) {
#pragma omp simd
  for (int64_t c = 0; c < D; ++c) d[c] += s[c];
}

// ---- routing and scratch ------------------------------------------------------------------------

// Scratch buffers kept per thread between calls, one per slot (a kernel call uses each slot for
// one buffer; forward and backward calls do not nest). Fresh allocations of this size come back
// as untouched pages, whose faults would cost more than the elementwise work. Contents are
// garbage: every element is written before it is read.
template <class T>
T* scratch(int slot, int64_t n) {
  thread_local std::vector<std::byte> pool[6];
  auto& b = pool[slot];
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(T);
  if (b.size() < bytes) b.resize(bytes);
  return reinterpret_cast<T*>(b.data());
}

struct Routing {
  std::vector<int64_t> order, pos, offsets, by_size;
  Routing(const MoeDims& d, const int64_t* indices)
      : order(size_t(d.T * d.k)), pos(size_t(d.T * d.k)), offsets(size_t(d.E + 1)), by_size(size_t(d.E)) {
    ops::moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
    // Experts largest first: the dynamic schedule then ends on small ones (load balance).
    std::iota(by_size.begin(), by_size.end(), int64_t(0));
    std::stable_sort(by_size.begin(), by_size.end(), [&](int64_t a, int64_t b) { return rows(a) > rows(b); });
  }
  int64_t begin(int64_t e) const { return offsets[size_t(e)]; }
  int64_t rows(int64_t e) const { return offsets[size_t(e) + 1] - offsets[size_t(e)]; }
  int64_t token(int64_t r, int64_t k) const { return order[size_t(r)] / k; }
  // Token t's rows in increasing routing position, i.e. ascending expert (insertion sort: k is small).
  void token_rows(int64_t t, int64_t k, int64_t* rows) const {
    for (int64_t j = 0; j < k; ++j) {
      int64_t r = pos[size_t(t * k + j)], m = j;
      for (; m > 0 && rows[m - 1] > r; --m) rows[m] = rows[m - 1];
      rows[m] = r;
    }
  }
};

constexpr int64_t kParallelElems = 32768;

// ---- forward / backward ---------------------------------------------------------------------------

template <class T>
void forward_experts(const KernelContext& ctx, const MoeDims& d, const void* xv, const void* wv, const int64_t* indices, const void* wgv,
                     const void* wuv, const void* wdv, void* actv, void* yv) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv);
  const float* weights = static_cast<const float*>(wv);
  T *act = static_cast<T*>(actv), *y = static_cast<T*>(yv);
  const int64_t D = d.D, F = d.F, k = d.k, n = d.T * d.k;
  const Routing rt(d, indices);
  T* out = scratch<T>(0, n * D);  // down-projection outputs, routing order (shared by the threads)
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < d.E; ++i) {
    const int64_t e = rt.by_size[size_t(i)], r0 = rt.begin(e), m = rt.rows(e);
    if (!m) continue;
    T* xs = scratch<T>(1, m * D);
    T* h = scratch<T>(2, m * F);
    T* a = act + r0 * 2 * F;
    for (int64_t r = 0; r < m; ++r) convert_row(D, x + rt.token(r0 + r, k) * D, xs + r * D);
    gemm_store(Trans::N, Trans::T, m, F, D, xs, D, wg + e * F * D, D, a, 2 * F);
    gemm_store(Trans::N, Trans::T, m, F, D, xs, D, wu + e * F * D, D, a + F, 2 * F);
    {
      const FlushDenormals ftz;  // sigmoid_poly's loops (lanes.h)
      for (int64_t r = 0; r < m; ++r) silu_mul_row(F, a + r * 2 * F, h + r * F);
    }
    gemm_store(Trans::N, Trans::T, m, D, F, h, F, wd + e * D * F, F, out + r0 * D, D);
  }
#pragma omp parallel if (n * D > kParallelElems)
  {
    std::vector<int64_t> trows(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.T; ++t) {
      T* yt = y + t * D;
      std::fill(yt, yt + D, T{});
      rt.token_rows(t, k, trows.data());
      for (int64_t r : trows) add_weighted_row(D, out + r * D, rnd(T{}, weights[rt.order[size_t(r)]]), yt);
    }
  }
}

template <class T>
void backward_experts(const KernelContext& ctx, const MoeDims& d, const void* xv, const void* wv,
                      const int64_t* indices, const void* wgv, const void* wuv, const void* wdv,
                      const void* actv, const void* dyv, void* dxv, void* dwv, void* dwgv, void* dwuv,
                      void* dwdv, bool add_dweights) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv), *act = static_cast<const T*>(actv);
  const float *weights = static_cast<const float*>(wv), *dy = static_cast<const float*>(dyv);
  float *dx = static_cast<float*>(dxv), *dw = static_cast<float*>(dwv), *dwg = static_cast<float*>(dwgv),
        *dwu = static_cast<float*>(dwuv), *dwd = static_cast<float*>(dwdv);
  const int64_t D = d.D, F = d.F, k = d.k, n = d.T * d.k;
  const bool need_gu = dx || dwg || dwu, need_x = dwg || dwu;
  const Routing rt(d, indices);
  float* dxs = scratch<float>(0, dx ? n * D : 0);  // per-row input gradients (shared by the threads)
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < d.E; ++i) {
    const int64_t e = rt.by_size[size_t(i)], r0 = rt.begin(e), m = rt.rows(e);
    if (!m) {  // no rows: the expert's weights got no gradient (added: nothing to add)
      if (add_dweights) continue;
      if (dwd) std::fill(dwd + e * D * F, dwd + (e + 1) * D * F, 0.f);
      if (dwg) std::fill(dwg + e * F * D, dwg + (e + 1) * F * D, 0.f);
      if (dwu) std::fill(dwu + e * F * D, dwu + (e + 1) * F * D, 0.f);
      continue;
    }
    T* dys = scratch<T>(1, m * D);  // dy rows in the storage type, later scaled by the routing weights
    float* dh = scratch<float>(2, m * F);  // dy @ W_down, before the routing weight
    T* h = scratch<T>(3, m * F);
    T* dgu = need_gu ? scratch<T>(4, m * 2 * F) : nullptr;  // [d gate | d up] per row
    T* xs = need_x ? scratch<T>(5, m * D) : nullptr;
    const T* a = act + r0 * 2 * F;
    for (int64_t r = 0; r < m; ++r) convert_row(D, dy + rt.token(r0 + r, k) * D, dys + r * D);
    gemm_acc(Trans::N, Trans::N, m, F, D, dys, D, wd + e * D * F, F, 0.f, dh, F);
    {
      const FlushDenormals ftz;  // sigmoid_poly's loop (lanes.h), and nothing else
      for (int64_t r = 0; r < m; ++r) {
        const int64_t slot = rt.order[size_t(r0 + r)];
        // dot = dy . (h @ W_down^T), the unweighted expert output: the routing weight's gradient.
        const float dot = swiglu_backward_row(F, a + r * 2 * F, dh + r * F, rnd(T{}, weights[slot]),
                                              h + r * F, dgu ? dgu + r * 2 * F : nullptr);
        if (dw) dw[slot] = dot;
      }
    }
    if (dwd)
      for (int64_t r = 0; r < m; ++r) scale_row(D, rnd(T{}, weights[rt.order[size_t(r0 + r)]]), dys + r * D);
    if (need_x)
      for (int64_t r = 0; r < m; ++r) convert_row(D, x + rt.token(r0 + r, k) * D, xs + r * D);
    const float beta_w = add_dweights ? 1.f : 0.f;  // the weight gradients: added to, or written
    if (dwd) gemm_acc(Trans::T, Trans::N, D, F, m, dys, D, h, F, beta_w, dwd + e * D * F, F);
    if (dwg) gemm_acc(Trans::T, Trans::N, F, D, m, dgu, 2 * F, xs, D, beta_w, dwg + e * F * D, D);
    if (dwu) gemm_acc(Trans::T, Trans::N, F, D, m, dgu + F, 2 * F, xs, D, beta_w, dwu + e * F * D, D);
    if (dx) {
      gemm_acc(Trans::N, Trans::N, m, D, F, dgu, 2 * F, wg + e * F * D, D, 0.f, dxs + r0 * D, D);
      gemm_acc(Trans::N, Trans::N, m, D, F, dgu + F, 2 * F, wu + e * F * D, D, 1.f, dxs + r0 * D, D);
    }
  }
  if (!dx) return;
#pragma omp parallel if (n * D > kParallelElems)
  {
    std::vector<int64_t> trows(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.T; ++t) {
      float* dxt = dx + t * D;
      std::fill(dxt, dxt + D, 0.f);
      rt.token_rows(t, k, trows.data());
      for (int64_t r : trows) add_row(D, dxs + r * D, dxt);
    }
  }
}

const bool registered = kernels::register_kernels(
    "moe_experts", Device::CPU,
    {{DType::F32, "default",
      "routing-order permutation, experts spread over threads, per-expert f32 GEMMs (gemm_f32) with the "
      "SwiGLU step fused, SIMD row kernels",
      ops::MoeExpertsKernel{forward_experts<float>, backward_experts<float>}},
     {DType::BF16, "default",
      "routing-order permutation, experts spread over threads, per-expert bf16 GEMMs (gemm_bf16, f32 "
      "accumulation; backward rounds dy and the SwiGLU gradients to bf16 for the GEMMs), SIMD row kernels",
      ops::MoeExpertsKernel{forward_experts<uint16_t>, backward_experts<uint16_t>}}});

}  // namespace

}  // namespace titan::cpu

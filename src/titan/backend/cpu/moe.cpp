// moe_experts "default": grouped GEMMs. The T*k (token, slot) pairs are put in routing order
// (counting sort by expert, ops::moe_routing_order), so every expert's rows are contiguous; each
// expert then runs three GEMMs over its row block (gate, up, down; the backward's five), threaded
// inside the GEMM backend. Gathers, the SwiGLU elementwise step and the weighted un-permute are
// OpenMP loops over rows/tokens; the un-permute sums a token's k rows in ascending expert order,
// rounding like the reference (transformers' index_add_ over experts), so the result does not
// depend on the thread count. Experts with no rows are skipped (their weight gradients are zero).
#include "titan/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/kernels/registry.h"

namespace titan::cpu {

namespace {

using ops::MoeDims;

inline float to_f(float v) {
  return v;
}
inline float to_f(bf16 v) {
  return bf16_to_f32(v);
}
template <class T>
T from_f(float v);
template <>
inline float from_f<float>(float v) {
  return v;
}
template <>
inline bf16 from_f<bf16>(float v) {
  return f32_to_bf16(v);
}
// v rounded to the storage type's precision (identity for f32).
template <class T>
inline float round_to(float v) {
  return to_f(from_f<T>(v));
}
inline float sigmoid(float v) {
  return 1.f / (1.f + std::exp(-v));
}

// C = op(A) @ op(B) stored in the storage type (bf16 output rounded once).
void gemm_store(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                const float* B, int64_t ldb, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
}
void gemm_store(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                const bf16* B, int64_t ldb, bf16* C, int64_t ldc) {
  gemm_bf16_out(ta, tb, M, N, K, 1.f, A, lda, B, ldb, C, ldc);
}
// f32 C = op(A) @ op(B) + beta * C.
void gemm_acc(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}
void gemm_acc(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
              int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}

// Scratch buffers kept per thread between calls, one per slot (a kernel call uses each slot for
// one buffer; forward and backward calls do not nest). They are large (rows x F) and fresh
// allocations of that size come back as untouched pages, whose faults cost more than the
// elementwise work. Contents are garbage: every element is written before it is read.
template <class T>
T* scratch(int slot, int64_t n) {
  thread_local std::vector<std::byte> pool[6];
  auto& b = pool[slot];
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(T);
  if (b.size() < bytes) b.resize(bytes);
  return reinterpret_cast<T*>(b.data());
}

struct Routing {
  std::vector<int64_t> order, pos, offsets;
  Routing(const MoeDims& d, const int64_t* indices)
      : order(size_t(d.T * d.k)), pos(size_t(d.T * d.k)), offsets(size_t(d.E + 1)) {
    ops::moe_routing_order(d, indices, order.data(), pos.data(), offsets.data());
  }
  int64_t begin(int64_t e) const { return offsets[size_t(e)]; }
  int64_t rows(int64_t e) const { return offsets[size_t(e) + 1] - offsets[size_t(e)]; }
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

// dst row r = src row of the token of routing row r, converted to the storage type.
template <class S, class T>
void gather_rows(const Routing& rt, int64_t n, int64_t k, int64_t D, const S* src, T* dst) {
#pragma omp parallel for schedule(static) if (n * D > kParallelElems)
  for (int64_t r = 0; r < n; ++r) {
    const S* s = src + (rt.order[size_t(r)] / k) * D;
    T* o = dst + r * D;
    if constexpr (std::is_same_v<S, T>)
      std::memcpy(o, s, size_t(D) * sizeof(T));
    else
      for (int64_t c = 0; c < D; ++c) o[c] = from_f<T>(s[c]);
  }
}

template <class T>
void forward_grouped(const MoeDims& d, const void* xv, const void* wv, const int64_t* indices,
                     const void* wgv, const void* wuv, const void* wdv, void* actv, void* yv) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv);
  const float* weights = static_cast<const float*>(wv);
  T *act = static_cast<T*>(actv), *y = static_cast<T*>(yv);
  const int64_t D = d.D, F = d.F, k = d.k, n = d.T * d.k;
  Routing rt(d, indices);
  T* rows = scratch<T>(0, n * D);  // gathered x, then the down outputs
  T* h = scratch<T>(1, n * F);
  gather_rows(rt, n, k, D, x, rows);
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = rt.begin(e), m = rt.rows(e);
    if (!m) continue;
    gemm_store(Trans::N, Trans::T, m, F, D, rows + r0 * D, D, wg + e * F * D, D, act + r0 * 2 * F, 2 * F);
    gemm_store(Trans::N, Trans::T, m, F, D, rows + r0 * D, D, wu + e * F * D, D, act + r0 * 2 * F + F, 2 * F);
  }
#pragma omp parallel for schedule(static) if (n * F > kParallelElems)
  for (int64_t r = 0; r < n; ++r) {
    const T* a = act + r * 2 * F;
    for (int64_t f = 0; f < F; ++f) {
      float g = to_f(a[f]);
      h[size_t(r * F + f)] = from_f<T>(round_to<T>(g * sigmoid(g)) * to_f(a[F + f]));
    }
  }
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = rt.begin(e), m = rt.rows(e);
    if (!m) continue;
    gemm_store(Trans::N, Trans::T, m, D, F, h + r0 * F, F, wd + e * D * F, F, rows + r0 * D, D);
  }
#pragma omp parallel if (n * D > kParallelElems)
  {
    std::vector<int64_t> trows(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < d.T; ++t) {
      T* yt = y + t * D;
      std::fill(yt, yt + D, from_f<T>(0.f));
      rt.token_rows(t, k, trows.data());
      for (int64_t r : trows) {
        const float w = round_to<T>(weights[rt.order[size_t(r)]]);
        const T* o = rows + r * D;
        for (int64_t c = 0; c < D; ++c) yt[c] = from_f<T>(to_f(yt[c]) + round_to<T>(to_f(o[c]) * w));
      }
    }
  }
}

template <class T>
void backward_grouped(const MoeDims& d, const void* xv, const void* wv, const int64_t* indices,
                      const void* wgv, const void* wuv, const void* wdv, const void* actv, const void* dyv,
                      void* dxv, void* dwv, void* dwgv, void* dwuv, void* dwdv) {
  const T *x = static_cast<const T*>(xv), *wg = static_cast<const T*>(wgv), *wu = static_cast<const T*>(wuv),
          *wd = static_cast<const T*>(wdv), *act = static_cast<const T*>(actv);
  const float *weights = static_cast<const float*>(wv), *dy = static_cast<const float*>(dyv);
  float *dx = static_cast<float*>(dxv), *dw = static_cast<float*>(dwv), *dwg = static_cast<float*>(dwgv),
        *dwu = static_cast<float*>(dwuv), *dwd = static_cast<float*>(dwdv);
  const int64_t D = d.D, F = d.F, k = d.k, E = d.E, n = d.T * d.k;
  const bool need_gu = dx || dwg || dwu;
  Routing rt(d, indices);
  // dy rows in routing order, in the storage type (bf16 GEMM inputs); later scaled by the weights.
  T* dys = scratch<T>(0, n * D);
  T* h = scratch<T>(1, n * F);
  float* dhraw = scratch<float>(2, n * F);  // dy @ W_down, before the routing weight
  T* dgu = scratch<T>(3, need_gu ? n * 2 * F : 0);
  gather_rows(rt, n, k, D, dy, dys);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = rt.begin(e), m = rt.rows(e);
    if (!m) continue;
    gemm_acc(Trans::N, Trans::N, m, F, D, dys + r0 * D, D, wd + e * D * F, F, 0.f, dhraw + r0 * F, F);
  }
#pragma omp parallel for schedule(static) if (n * (F + D) > kParallelElems)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = rt.order[size_t(r)];
    const float w = round_to<T>(weights[i]);
    const T* a = act + r * 2 * F;
    const float* dhr = dhraw + r * F;
    T* hr = h + r * F;
    float dot = 0;
    for (int64_t f = 0; f < F; ++f) {
      const float g = to_f(a[f]), u = to_f(a[F + f]), sg = sigmoid(g), s = round_to<T>(g * sg);
      hr[f] = from_f<T>(s * u);
      dot += dhr[f] * to_f(hr[f]);
      if (need_gu) {
        const float dh = w * dhr[f];
        dgu[size_t(r * 2 * F + f)] = from_f<T>(dh * u * sg * (1.f + g * (1.f - sg)));
        dgu[size_t(r * 2 * F + F + f)] = from_f<T>(dh * s);
      }
    }
    if (dw) dw[i] = dot;  // = dy . (h @ W_down^T), the unweighted expert output
    if (dwd) {
      T* dr = dys + r * D;
      for (int64_t c = 0; c < D; ++c) dr[c] = from_f<T>(to_f(dr[c]) * w);
    }
  }
  T* xs = scratch<T>(4, dwg || dwu ? n * D : 0);
  if (dwg || dwu) gather_rows(rt, n, k, D, x, xs);
  float* dxs = scratch<float>(5, dx ? n * D : 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = rt.begin(e), m = rt.rows(e);
    if (!m) {
      if (dwd) std::fill(dwd + e * D * F, dwd + (e + 1) * D * F, 0.f);
      if (dwg) std::fill(dwg + e * F * D, dwg + (e + 1) * F * D, 0.f);
      if (dwu) std::fill(dwu + e * F * D, dwu + (e + 1) * F * D, 0.f);
      continue;
    }
    const T* dg = need_gu ? dgu + r0 * 2 * F : nullptr;
    const T* du = need_gu ? dg + F : nullptr;
    if (dwd) gemm_acc(Trans::T, Trans::N, D, F, m, dys + r0 * D, D, h + r0 * F, F, 0.f, dwd + e * D * F, F);
    if (dwg) gemm_acc(Trans::T, Trans::N, F, D, m, dg, 2 * F, xs + r0 * D, D, 0.f, dwg + e * F * D, D);
    if (dwu) gemm_acc(Trans::T, Trans::N, F, D, m, du, 2 * F, xs + r0 * D, D, 0.f, dwu + e * F * D, D);
    if (dx) {
      gemm_acc(Trans::N, Trans::N, m, D, F, dg, 2 * F, wg + e * F * D, D, 0.f, dxs + r0 * D, D);
      gemm_acc(Trans::N, Trans::N, m, D, F, du, 2 * F, wu + e * F * D, D, 1.f, dxs + r0 * D, D);
    }
  }
  if (dx) {
#pragma omp parallel if (n * D > kParallelElems)
    {
      std::vector<int64_t> trows(static_cast<size_t>(k));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < d.T; ++t) {
        float* dxt = dx + t * D;
        std::fill(dxt, dxt + D, 0.f);
        rt.token_rows(t, k, trows.data());
        for (int64_t r : trows) {
          const float* s = dxs + r * D;
          for (int64_t c = 0; c < D; ++c) dxt[c] += s[c];
        }
      }
    }
  }
}

TITAN_REGISTER_KERNEL(
    moe_experts_f32_grouped,
    {"moe_experts",
     Device::CPU,
     DType::F32,
     "default",
     "routing-order permutation + per-expert f32 GEMMs (gemm_f32), OpenMP gathers/un-permute",
     ops::MoeExpertsKernel{forward_grouped<float>, backward_grouped<float>},
     {}});
TITAN_REGISTER_KERNEL(
    moe_experts_bf16_grouped,
    {"moe_experts",
     Device::CPU,
     DType::BF16,
     "default",
     "routing-order permutation + per-expert bf16 GEMMs (gemm_bf16, f32 accumulation; backward "
     "rounds dy and the SwiGLU gradients to bf16 for the GEMMs)",
     ops::MoeExpertsKernel{forward_grouped<bf16>, backward_grouped<bf16>},
     {}});

}  // namespace

}  // namespace titan::cpu

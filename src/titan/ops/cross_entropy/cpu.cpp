// Fast CPU kernels for the loss (see ops/cross_entropy/cross_entropy.h for the definitions):
//  - cross_entropy "default": rows in parallel, AVX-512 or AVX2 exp/max/sum (portable loops on
//    CPUs with neither);
//  - linear_cross_entropy "default": vocabulary chunks through the GEMM backend with an online
//    logsumexp, never holding more than [rows, chunk] logits. Rows whose label is ignore_index are
//    dropped before the GEMMs (fine-tuning masks whole prompts, often half the rows).
//    When the caller grants the memory (keep_logits_bytes), forward keeps the rounded logits of
//    every chunk ([M, V], bf16 when rounded to bf16, else f32) and backward reads them back.
// FLOPs of the fused op: forward 2NDV, backward 6NDV (logits recomputed, then dhidden and dweight),
// or 4NDV when the logits were kept.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/core/check.h"
#include "titan/core/tensor.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan::cpu {
namespace {

using ops::CrossEntropyKernel;
using ops::LinearCrossEntropyArgs;
using ops::LinearCrossEntropyKernel;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ------------------------------------------------------------------------------------------------
// Row primitives over f32: max, sum of exp(x - m), softmax gradient, bf16 rounding in place.

// GCC 12's avx512fintrin.h seeds masked intrinsics with _mm512_undefined_*, which trips
// -Wuninitialized at every inlined intrinsic; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TITAN_AVX512 __attribute__((target("avx512f")))

TITAN_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

TITAN_AVX512 float row_max_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), tail_mask(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

TITAN_AVX512 float row_sumexp_avx512(const float* x, int64_t n, float m) {
  __m512 s = _mm512_setzero_ps();
  const __m512 vm = _mm512_set1_ps(m);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    s = _mm512_mask_add_ps(s, k, s, lanes::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm)));
  }
  return _mm512_reduce_add_ps(s);
}

// y <- scale * exp(x - lse) (y may be x).
TITAN_AVX512 void row_softmax_scaled_avx512(const float* x, float* y, int64_t n, float lse, float scale) {
  const __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(vs, lanes::exp16(_mm512_sub_ps(v, vl))));
  }
}

// x <- bf16(x) kept as f32, round to nearest even like f32_to_bf16 (NaN stays a quiet NaN).
TITAN_AVX512 void round_bf16_avx512(float* x, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u)), quiet = _mm512_set1_epi32(0x00400000);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    const __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    r = _mm512_and_si512(r, hi);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(u, hi), quiet));
    _mm512_mask_storeu_ps(x + i, k, _mm512_castsi512_ps(r));
  }
}

// bf16 rows (logits rounded to bf16 by the GEMM itself): 16 bf16 widened to f32 lanes; the tail
// is padded with `fill`.
TITAN_AVX512 inline __m512 load16_bf16(const bf16* x, int64_t left, float fill) {
  if (left >= 16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
  alignas(64) float t[16];
  for (int64_t i = 0; i < 16; ++i) t[i] = i < left ? bf16_to_f32(x[i]) : fill;
  return _mm512_load_ps(t);
}
TITAN_AVX512 float row_max_bf16_avx512(const bf16* x, int64_t n) {
  __m512 m = _mm512_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, load16_bf16(x + i, n - i, kNegInf));
  return _mm512_reduce_max_ps(m);
}
TITAN_AVX512 float row_sumexp_bf16_avx512(const bf16* x, int64_t n, float m) {
  __m512 s = _mm512_setzero_ps();
  const __m512 vm = _mm512_set1_ps(m);
  for (int64_t i = 0; i < n; i += 16)
    s = _mm512_mask_add_ps(s, tail_mask(n - i), s,
                           lanes::exp16(_mm512_sub_ps(load16_bf16(x + i, n - i, 0.f), vm)));
  return _mm512_reduce_add_ps(s);
}
// y <- bf16(scale * exp(x - lse)), then y[label] <- bf16(scale * exp(x[label] - lse) - scale) when
// 0 <= label < n: the softmax gradient of one chunk row, rounded once for the bf16 GEMMs.
TITAN_AVX512 void row_dlogits_bf16_avx512(const bf16* x, bf16* y, int64_t n, float lse, float scale, int64_t label) {
  const __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(scale);
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  alignas(64) uint16_t tail[16];
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mul_ps(vs, lanes::exp16(_mm512_sub_ps(load16_bf16(x + i, n - i, 0.f), vl)));
    // Round to nearest even (the values are finite and >= 0: no NaN case).
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
    const __m256i h = _mm512_cvtepi32_epi16(r);
    if (n - i >= 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), h);
    } else {
      _mm256_store_si256(reinterpret_cast<__m256i*>(tail), h);
      for (int64_t j = 0; j < n - i; ++j) y[i + j].bits = tail[j];
    }
  }
  if (label >= 0 && label < n) {
    alignas(64) float e[16];
    _mm512_store_ps(e, _mm512_mul_ps(vs, lanes::exp16(_mm512_set1_ps(bf16_to_f32(x[label]) - lse))));
    y[label] = f32_to_bf16(e[0] - scale);
  }
}
// The same primitives on 8 lanes of AVX2 + FMA (CPUs without AVX-512), lanes::exp8 for exp.
#define TITAN_AVX2 __attribute__((target("avx2,fma")))

TITAN_AVX2 inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
TITAN_AVX2 inline float reduce_add8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
// Lanes at or past `left` read as `fill`.
TITAN_AVX2 inline __m256 load8(const float* x, int64_t left, float fill) {
  if (left >= 8) return _mm256_loadu_ps(x);
  const __m256i k = lanes::lanes_below8(left);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(x, k), _mm256_castsi256_ps(k));
}
TITAN_AVX2 inline __m256 load8(const bf16* x, int64_t left, float fill) {
  if (left >= 8)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))), 16));
  alignas(32) float t[8];
  for (int64_t i = 0; i < 8; ++i) t[i] = i < left ? bf16_to_f32(x[i]) : fill;
  return _mm256_load_ps(t);
}
// f32 lanes -> their bf16 bits (round to nearest even) in the low 16 bits of each 32-bit lane. NaN
// becomes a quiet NaN when `keep_nan` (the values of row_dlogits are finite and >= 0: no NaN case).
TITAN_AVX2 inline __m256i bf16_bits8(__m256 v, bool keep_nan) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  if (keep_nan) {
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  return r;
}

// f32 or bf16 rows (load8 widens bf16).
template <class T>
TITAN_AVX2 float row_max_avx2(const T* x, int64_t n) {
  __m256 m = _mm256_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, load8(x + i, n - i, kNegInf));
  return reduce_max8(m);
}

template <class T>
TITAN_AVX2 float row_sumexp_avx2(const T* x, int64_t n, float m) {
  __m256 s = _mm256_setzero_ps();
  const __m256 vm = _mm256_set1_ps(m);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 e = lanes::exp8(_mm256_sub_ps(load8(x + i, n - i, 0.f), vm));
    s = _mm256_add_ps(s, _mm256_and_ps(e, _mm256_castsi256_ps(lanes::lanes_below8(n - i))));
  }
  return reduce_add8(s);
}

TITAN_AVX2 void row_softmax_scaled_avx2(const float* x, float* y, int64_t n, float lse, float scale) {
  const __m256 vl = _mm256_set1_ps(lse), vs = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_mul_ps(vs, lanes::exp8(_mm256_sub_ps(load8(x + i, n - i, 0.f), vl)));
    if (n - i >= 8)
      _mm256_storeu_ps(y + i, v);
    else
      _mm256_maskstore_ps(y + i, lanes::lanes_below8(n - i), v);
  }
}

TITAN_AVX2 void round_bf16_avx2(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 r = _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(load8(x + i, n - i, 0.f), true), 16));
    if (n - i >= 8)
      _mm256_storeu_ps(x + i, r);
    else
      _mm256_maskstore_ps(x + i, lanes::lanes_below8(n - i), r);
  }
}

// row_dlogits_bf16_avx512 on 8 lanes.
TITAN_AVX2 void row_dlogits_bf16_avx2(const bf16* x, bf16* y, int64_t n, float lse, float scale, int64_t label) {
  const __m256 vl = _mm256_set1_ps(lse), vs = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_mul_ps(vs, lanes::exp8(_mm256_sub_ps(load8(x + i, n - i, 0.f), vl)));
    const __m256i r = bf16_bits8(v, false);
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    if (n - i >= 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
    } else {
      alignas(16) uint16_t tail[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tail), h);
      for (int64_t j = 0; j < n - i; ++j) y[i + j].bits = tail[j];
    }
  }
  if (label >= 0 && label < n) {
    const __m256 e = _mm256_mul_ps(vs, lanes::exp8(_mm256_set1_ps(bf16_to_f32(x[label]) - lse)));
    y[label] = f32_to_bf16(_mm256_cvtss_f32(e) - scale);
  }
}
#undef TITAN_AVX2
#pragma GCC diagnostic pop

// The tier of the row loops: AVX-512, AVX2 or portable (cpu_info.h: kernel_isa).
bool use_avx512() { return kernel_isa() >= KernelIsa::kAvx512; }
bool use_avx2() { return kernel_isa() >= KernelIsa::kAvx2; }

// The dispatchers, with the portable loops (and the f64 ones the gradient checks run).
template <class A>
A row_max(const A* x, int64_t n) {
  if constexpr (std::is_same_v<A, float>) {
    if (use_avx512()) return row_max_avx512(x, n);
    if (use_avx2()) return row_max_avx2(x, n);
  }
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

template <class A>
A row_sumexp(const A* x, int64_t n, A m) {
  if constexpr (std::is_same_v<A, float>) {
    if (use_avx512()) return row_sumexp_avx512(x, n, m);
    if (use_avx2()) return row_sumexp_avx2(x, n, m);
  }
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return s;
}

template <class A>
void row_softmax_scaled(const A* x, A* y, int64_t n, A lse, A scale) {
  if constexpr (std::is_same_v<A, float>) {
    if (use_avx512()) return row_softmax_scaled_avx512(x, y, n, lse, scale);
    if (use_avx2()) return row_softmax_scaled_avx2(x, y, n, lse, scale);
  }
  for (int64_t i = 0; i < n; ++i) y[i] = scale * std::exp(x[i] - lse);
}

void round_bf16(float* x, int64_t n) {
  if (use_avx512()) return round_bf16_avx512(x, n);
  if (use_avx2()) return round_bf16_avx2(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}
float row_max(const bf16* x, int64_t n) {
  if (use_avx512()) return row_max_bf16_avx512(x, n);
  if (use_avx2()) return row_max_avx2(x, n);
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, bf16_to_f32(x[i]));
  return m;
}
float row_sumexp(const bf16* x, int64_t n, float m) {
  if (use_avx512()) return row_sumexp_bf16_avx512(x, n, m);
  if (use_avx2()) return row_sumexp_avx2(x, n, m);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(bf16_to_f32(x[i]) - m);
  return s;
}
void row_dlogits_bf16(const bf16* x, bf16* y, int64_t n, float lse, float scale, int64_t label) {
  if (use_avx512()) return row_dlogits_bf16_avx512(x, y, n, lse, scale, label);
  if (use_avx2()) return row_dlogits_bf16_avx2(x, y, n, lse, scale, label);
  for (int64_t i = 0; i < n; ++i)
    y[i] = f32_to_bf16(scale * std::exp(bf16_to_f32(x[i]) - lse) - (i == label ? scale : 0.f));
}

// ------------------------------------------------------------------------------------------------
// cross_entropy over materialised logits.

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Widens one bf16 row into the f32 scratch row; f32/f64 rows are used in place.
template <class T>
const Acc<T>* widen_row(const T* x, int64_t V, Acc<T>* scratch) {
  if constexpr (std::is_same_v<T, bf16>) {
    for (int64_t v = 0; v < V; ++v) scratch[v] = bf16_to_f32(x[v]);
    return scratch;
  } else {
    return x;
  }
}

template <class T>
void ce_forward(const KernelContext& ctx, int64_t N, int64_t V, const void* logits_v, const int64_t* labels, int64_t ignore_index,
                void* lse_v, void* loss_v) {
  using A = Acc<T>;
  const T* logits = static_cast<const T*>(logits_v);
  A *lse = static_cast<A*>(lse_v), *loss = static_cast<A*>(loss_v);
#pragma omp parallel
  {
    std::vector<A> scratch(std::is_same_v<T, bf16> ? size_t(V) : 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      lse[n] = loss[n] = 0;
      if (labels[n] == ignore_index) continue;
      const A* x = widen_row(logits + n * V, V, scratch.data());
      const A m = row_max(x, V);
      lse[n] = m + std::log(row_sumexp(x, V, m));
      loss[n] = lse[n] - x[labels[n]];
    }
  }
}

template <class T>
void ce_backward(const KernelContext& ctx, int64_t N, int64_t V, const void* logits_v, const int64_t* labels, int64_t ignore_index,
                 const void* lse_v, double scale, void* dlogits_v) {
  using A = Acc<T>;
  const T* logits = static_cast<const T*>(logits_v);
  const A* lse = static_cast<const A*>(lse_v);
  A* dl = static_cast<A*>(dlogits_v);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    A* d = dl + n * V;
    if (labels[n] == ignore_index) {
      std::fill(d, d + V, A(0));
      continue;
    }
    if constexpr (std::is_same_v<T, bf16>)
      for (int64_t v = 0; v < V; ++v) d[v] = bf16_to_f32(logits[n * V + v]);
    else
      std::copy(logits + n * V, logits + (n + 1) * V, d);
    row_softmax_scaled(d, d, V, lse[n], A(scale));
    d[labels[n]] -= A(scale);
  }
}

// ------------------------------------------------------------------------------------------------
// linear_cross_entropy, chunked over the vocabulary.

void mm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
        int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}
void mm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
        int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}
// f64 exists for gradient checks on tiny shapes: the plain loops are enough.
void mm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
        int64_t ldb, double beta, double* C, int64_t ldc) {
  gemm_f64_reference(ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else
    return DType::F64;
}

// The rows that take part: all of them (borrowed) or the non-ignored ones packed into a buffer.
template <class T>
struct CountedRows {
  int64_t M = 0;
  const T* hidden = nullptr;   // [M, D]
  std::vector<int64_t> row;    // packed row -> original row
  std::vector<int64_t> label;  // packed row -> label
  Tensor packed;               // owns `hidden` when rows were dropped
};

template <class T>
CountedRows<T> counted_rows(const LinearCrossEntropyArgs& a) {
  CountedRows<T> r;
  for (int64_t n = 0; n < a.N; ++n)
    if (a.labels[n] != a.ignore_index) {
      r.row.push_back(n);
      r.label.push_back(a.labels[n]);
    }
  r.M = int64_t(r.row.size());
  const T* h = static_cast<const T*>(a.hidden);
  if (r.M == a.N) {
    r.hidden = h;
    return r;
  }
  r.packed = Tensor::empty({r.M, a.D}, dtype_of<T>());
  T* p = r.packed.template data<T>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < r.M; ++m) {
    const T* src = h + r.row[size_t(m)] * a.D;
    std::copy(src, src + a.D, p + m * a.D);
  }
  r.hidden = p;
  return r;
}

// logits[:, c0:c0+cc] of the counted rows into buf [M, cc] (f32/f64; rows ld apart, ld >= cc),
// rounded to bf16 when asked.
template <class T>
void chunk_logits(const LinearCrossEntropyArgs& a, const CountedRows<T>& r, int64_t c0, int64_t cc,
                  Acc<T>* buf, int64_t ld) {
  const T* w = static_cast<const T*>(a.weight) + c0 * a.D;
  mm(Trans::N, Trans::T, r.M, cc, a.D, r.hidden, a.D, w, a.D, 0, buf, ld);
  if constexpr (std::is_same_v<T, bf16>)
    if (a.round_logits) {
#pragma omp parallel for schedule(static)
      for (int64_t m = 0; m < r.M; ++m) round_bf16(buf + m * ld, cc);
    }
}

// Kept logits: chunk c0 of the counted rows is an [M, cc] block at offset M * c0. Stored in the
// accumulation type, or in bf16 when they are rounded to bf16 anyway (exact, half the memory).
template <class T>
DType kept_dtype(const LinearCrossEntropyArgs& a) {
  return std::is_same_v<T, bf16> && a.round_logits ? DType::BF16 : dtype_of<Acc<T>>();
}

// Online logsumexp over vocabulary chunks: per counted row the running max, the sum of exp(x - max)
// and the label's logit once its chunk passes; finish() writes lse and loss to the original rows.
template <class A>
struct OnlineLse {
  static constexpr A kInf = std::numeric_limits<A>::infinity();
  std::vector<A> mx, sum, target;
  explicit OnlineLse(int64_t M) : mx(size_t(M), -kInf), sum(size_t(M), 0), target(size_t(M), 0) {}
  // Folds in one chunk of row m: cm = its max, sumexp(m') = its sum of exp(x - m').
  template <class SumExp>
  void add(int64_t m, A cm, SumExp sumexp) {
    const size_t i = size_t(m);
    const A nm = std::max(mx[i], cm);
    // exp(-inf - -inf) would be NaN: a row whose logits so far are all -inf has nothing to rescale.
    const A old = mx[i] == nm ? sum[i] : sum[i] * std::exp(mx[i] - nm);
    sum[i] = old + (cm == -kInf ? A(0) : sumexp(nm));
    mx[i] = nm;
  }
  // Folds in chunk [c0, c0 + cc) of row m, logits x (A, or bf16 widened to f32), and takes the
  // row's target logit (label y) when the chunk holds it.
  template <class X>
  void add_chunk(int64_t m, const X* x, int64_t c0, int64_t cc, int64_t y) {
    add(m, row_max(x, cc), [&](A nm) { return row_sumexp(x, cc, nm); });
    if (y < c0 || y >= c0 + cc) return;
    if constexpr (std::is_same_v<X, bf16>)
      target[size_t(m)] = bf16_to_f32(x[y - c0]);
    else
      target[size_t(m)] = x[y - c0];
  }
  template <class T>
  void finish(const CountedRows<T>& r, A* lse, A* loss) const {
    for (int64_t m = 0; m < r.M; ++m) {
      const int64_t n = r.row[size_t(m)];
      lse[n] = mx[size_t(m)] + std::log(sum[size_t(m)]);
      loss[n] = lse[n] - target[size_t(m)];
    }
  }
};

// dhidden rows computed for the counted rows only (dhp) go back to their original rows of dh.
template <class T, class A>
void scatter_counted_rows(const LinearCrossEntropyArgs& a, const CountedRows<T>& r, const Tensor& dhp_t, A* dh) {
  if (!dhp_t.defined()) return;
  const A* dhp = dhp_t.data<A>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < r.M; ++m) std::copy(dhp + m * a.D, dhp + (m + 1) * a.D, dh + r.row[size_t(m)] * a.D);
}

// bf16 with logits rounded to bf16 (the default for bf16): each chunk GEMM rounds its f32 sums to
// bf16 itself (gemm_bf16_out, round to nearest even: the values the f32-output GEMM + rounding
// gives), straight into the kept logits or a bf16 chunk buffer, and the row passes read bf16 and
// write the bf16 dlogits the backward GEMMs take: no f32 [rows, chunk] buffer is written or read.
void chunk_logits(const LinearCrossEntropyArgs& a, const CountedRows<bf16>& r, int64_t c0, int64_t cc,
                  bf16* out, int64_t ld) {
  gemm_bf16_out(Trans::N, Trans::T, r.M, cc, a.D, 1.f, r.hidden, a.D,
                static_cast<const bf16*>(a.weight) + c0 * a.D, a.D, out, ld);
}

void lce_backward_bf16_logits(const LinearCrossEntropyArgs& a, const CountedRows<bf16>& r, bool kept,
                              const std::vector<float>& row_lse, float scale, float* dhp, float* dw,
                              bool add_dw, float* dh, const Tensor& dhp_t) {
  const int64_t C = std::min(a.chunk, a.V);
  Tensor logits_t = kept ? Tensor() : Tensor::empty({r.M, C}, DType::BF16);
  Tensor dl_t = Tensor::empty({r.M, C}, DType::BF16);
  bf16* dl = dl_t.data<bf16>();
  for (int64_t c0 = 0; c0 < a.V; c0 += C) {
    const int64_t cc = std::min(C, a.V - c0);
    const bf16* x = kept ? a.kept->data<bf16>() + r.M * c0 : logits_t.data<bf16>();
    if (!kept) chunk_logits(a, r, c0, cc, logits_t.data<bf16>(), cc);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < r.M; ++m)
      row_dlogits_bf16(x + m * cc, dl + m * cc, cc, row_lse[size_t(m)], scale, r.label[size_t(m)] - c0);
    const bf16* w = static_cast<const bf16*>(a.weight) + c0 * a.D;
    if (dhp) gemm_bf16(Trans::N, Trans::N, r.M, a.D, cc, 1.f, dl, cc, w, a.D, c0 == 0 ? 0.f : 1.f, dhp, a.D);
    if (dw)
      gemm_bf16(Trans::T, Trans::N, cc, a.D, r.M, 1.f, dl, cc, r.hidden, a.D, add_dw ? 1.f : 0.f,
                dw + c0 * a.D, a.D);
  }
  scatter_counted_rows(a, r, dhp_t, dh);
}

// The forward's vocabulary chunks, logits of type L: the accumulation type, or bf16 when they are
// rounded to bf16 (the GEMM writes bf16 itself). Each chunk's GEMM writes straight into the kept
// logits when forward keeps them (they are stored as L), else into one chunk buffer, and its rows
// are folded into the online logsumexp.
template <class T, class L>
void lce_forward_chunks(const LinearCrossEntropyArgs& a, const CountedRows<T>& r, bool keep, Acc<T>* lse,
                        Acc<T>* loss) {
  const int64_t C = std::min(a.chunk, a.V);
  Tensor buf_t = keep ? Tensor() : Tensor::empty({r.M, C}, dtype_of<L>());
  OnlineLse<Acc<T>> stats(r.M);
  for (int64_t c0 = 0; c0 < a.V; c0 += C) {
    const int64_t cc = std::min(C, a.V - c0);
    L* buf = keep ? a.kept->data<L>() + r.M * c0 : buf_t.data<L>();
    chunk_logits(a, r, c0, cc, buf, cc);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < r.M; ++m) stats.add_chunk(m, buf + m * cc, c0, cc, r.label[size_t(m)]);
  }
  stats.finish(r, lse, loss);
}

template <class T>
void lce_forward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void* lse_v, void* loss_v) {
  using A = Acc<T>;
  A *lse = static_cast<A*>(lse_v), *loss = static_cast<A*>(loss_v);
  std::fill(lse, lse + a.N, A(0));
  std::fill(loss, loss + a.N, A(0));
  const CountedRows<T> r = counted_rows<T>(a);
  if (r.M == 0) return;
  const DType kd = kept_dtype<T>(a);
  const bool keep = a.kept && r.M * a.V * int64_t(dtype_size(kd)) <= a.keep_bytes;
  if (keep) *a.kept = Tensor::empty({r.M * a.V}, kd);
  if constexpr (std::is_same_v<T, bf16>)
    if (a.round_logits) return lce_forward_chunks<T, bf16>(a, r, keep, lse, loss);
  lce_forward_chunks<T, A>(a, r, keep, lse, loss);
}

template <class T>
void lce_backward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void* lse_v, double scale,
                  void* dh_v, void* dw_v, bool add_dw) {
  using A = Acc<T>;
  const A* lse = static_cast<const A*>(lse_v);
  A *dh = static_cast<A*>(dh_v), *dw = static_cast<A*>(dw_v);
  const CountedRows<T> r = counted_rows<T>(a);
  if (dh && (r.M < a.N)) std::fill(dh, dh + a.N * a.D, A(0));
  if (r.M == 0 || (!dh && !dw)) {
    if (dw && !add_dw) std::fill(dw, dw + a.V * a.D, A(0));
    return;
  }
  // From here every vocabulary chunk writes (beta = 0) or adds to (beta = 1) its rows of dw: no fill first.
  const int64_t C = std::min(a.chunk, a.V);
  // dhidden of the counted rows: the output itself unless rows were dropped.
  Tensor dhp_t = dh && r.M < a.N ? Tensor::empty({r.M, a.D}, dtype_of<A>()) : Tensor();
  A* dhp = dhp_t.defined() ? dhp_t.data<A>() : dh;
  std::vector<A> row_lse(size_t(r.M));
  for (int64_t m = 0; m < r.M; ++m) row_lse[size_t(m)] = lse[r.row[size_t(m)]];

  // Logits kept by forward (same rows, same values) replace the recomputing GEMM.
  const bool kept = a.kept && a.kept->defined();
  TITAN_CHECK(!kept || a.kept->numel() == r.M * a.V, "linear_cross_entropy: kept logits ", a.kept->str(),
              " do not match ", r.M, " rows x V=", a.V);
  if constexpr (std::is_same_v<T, bf16>)
    if (a.round_logits)
      return lce_backward_bf16_logits(a, r, kept, row_lse, float(scale), dhp, dw, add_dw, dh, dhp_t);
  // f32: the dlogits rows are ld apart, padded off a multiple of 4 KiB (lce_f32_backward_row_stride).
  // They are the A^T operand of the dweight GEMM, which reads them down their columns; at a 32 KiB
  // row stride (the default chunk, 8192 columns) oneDNN's AVX-512 sgemm ran that product at half its
  // speed (Intel Xeon model 167: 64-95 GFLOP/s against 114-129 with 16 floats of padding;
  // docs/performance.md).
  const int64_t ld = std::is_same_v<T, float> ? ops::lce_f32_backward_row_stride(C) : C;
  Tensor buf_t = Tensor::empty({r.M, ld}, dtype_of<A>());
  A* buf = buf_t.data<A>();
  // bf16 (logits not rounded): dlogits is rounded to bf16 for the GEMMs (bf16 operands, f32 accumulation).
  Tensor dlb_t = std::is_same_v<T, bf16> ? Tensor::empty({r.M, C}, DType::BF16) : Tensor();
  for (int64_t c0 = 0; c0 < a.V; c0 += C) {
    const int64_t cc = std::min(C, a.V - c0);
    if (!kept) chunk_logits(a, r, c0, cc, buf, ld);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < r.M; ++m) {
      A* x = buf + m * ld;
      const A* src = x;
      if (kept) {
        if (a.kept->dtype() == DType::BF16) {
          if constexpr (std::is_same_v<A, float>)
            convert_bf16_to_f32(a.kept->data<bf16>() + r.M * c0 + m * cc, x, size_t(cc));
        } else {
          src = a.kept->data<A>() + r.M * c0 + m * cc;
        }
      }
      row_softmax_scaled(src, x, cc, row_lse[size_t(m)], A(scale));
      const int64_t y = r.label[size_t(m)];
      if (y >= c0 && y < c0 + cc) x[y - c0] -= A(scale);
      if constexpr (std::is_same_v<T, bf16>) convert_f32_to_bf16(x, dlb_t.data<bf16>() + m * cc, size_t(cc));
    }
    const T* w = static_cast<const T*>(a.weight) + c0 * a.D;
    // The GEMMs' dlogits: the bf16 copy ([M, cc], contiguous) or the f32 / f64 rows in place.
    const T* dl;
    int64_t dl_ld;
    if constexpr (std::is_same_v<T, bf16>) {
      dl = dlb_t.data<bf16>();
      dl_ld = cc;
    } else {
      dl = buf;
      dl_ld = ld;
    }
    if (dhp) mm(Trans::N, Trans::N, r.M, a.D, cc, dl, dl_ld, w, a.D, c0 == 0 ? 0 : 1, dhp, a.D);
    if (dw)
      mm(Trans::T, Trans::N, cc, a.D, r.M, dl, dl_ld, r.hidden, a.D, add_dw ? 1 : 0, dw + c0 * a.D, a.D);
  }
  scatter_counted_rows(a, r, dhp_t, dh);
}

const bool cross_entropy_kernels_registered = kernels::register_kernels(
    "cross_entropy", Device::CPU,
    {{DType::F32, "default", "rows in parallel, AVX-512 exp when available",
      CrossEntropyKernel{ce_forward<float>, ce_backward<float>}},
     {DType::BF16, "default", "rows in parallel widened to f32, AVX-512 exp when available",
      CrossEntropyKernel{ce_forward<bf16>, ce_backward<bf16>}},
     {DType::F64, "default", "rows in parallel, f64",
      CrossEntropyKernel{ce_forward<double>, ce_backward<double>}}});
const bool linear_cross_entropy_kernels_registered = kernels::register_kernels(
    "linear_cross_entropy", Device::CPU,
    {{DType::F32, "default", "vocabulary chunks through gemm_f32, online logsumexp, O(N x chunk) memory",
      LinearCrossEntropyKernel{lce_forward<float>, lce_backward<float>}},
     {DType::BF16, "default",
      "vocabulary chunks through gemm_bf16 (f32 accumulation), online logsumexp, O(N x chunk) memory",
      LinearCrossEntropyKernel{lce_forward<bf16>, lce_backward<bf16>}},
     {DType::F64, "default", "vocabulary chunks, loop GEMMs (gradient checks of the chunked algorithm)",
      LinearCrossEntropyKernel{lce_forward<double>, lce_backward<double>}}});

}  // namespace

}  // namespace titan::cpu

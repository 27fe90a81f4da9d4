// Fast CPU attention (flash tiles) and its registration; the raw-pointer API is in cpu.h.
#include "titan/ops/attention/cpu.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"

namespace titan::cpu {
namespace {

// Below this many multiply-adds per call a parallel region costs more than it saves.
bool worth_threads(const AttentionShape& s) {
  return s.B * s.Hq * s.S * s.S * s.D > (int64_t(1) << 18);
}

// ---------------------------------------------------------------------------------------------
// Flash kernels. Score tiles are kept transposed, S^T[key j][query i], so every elementwise step of
// the softmax runs along queries (one vector = 16 queries with AVX-512, 8 with AVX2) and the three
// products of a tile all take the form of one small GEMM with a broadcast operand:
//   C[m][n] (+)= sum_k a(m, k) * B[k][n],   a(m, k) = a[m * sam + k * sak],  B rows contiguous.
// Tile primitives come in three implementations (portable loops, AVX2 + FMA intrinsics, AVX-512
// intrinsics); the drivers are templates over them, so the algorithm is written once.

constexpr int64_t kTile = 64;  // queries per tile == keys per tile; a multiple of the 16- and 8-lane vectors

// Causal mask inside a tile: key j (tile-relative) is visible to query i iff j <= i + diag, where
// diag = first query position - first key position of the tile.

struct PortableOps {
  static constexpr bool kBf16Dot = false;    // see Avx512Bf16Ops
  static constexpr bool kBf16Probs = false;  // see Avx512Bf16ProbsOps
  static constexpr bool kAmx = false;        // see AmxDotOps

  static void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t sam, int64_t sak, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    for (int64_t m = 0; m < M; ++m) {
      float* cm = c + m * ldc;
      if (!accumulate) std::fill(cm, cm + N, 0.f);
      for (int64_t kk = 0; kk < K; ++kk) {
        const float av = a[m * sam + kk * sak];
        const float* bk = b + kk * ldb;
        for (int64_t n = 0; n < N; ++n) cm[n] += av * bk[n];
      }
    }
  }

  static void widen_rows(const bf16* src, int64_t ld, int64_t n, int64_t D, float* dst) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) dst[i * D + d] = bf16_to_f32(src[i * ld + d]);
  }

  // Scales the scores s[kn][kTile], folds them into the running max m and sum l, leaves the
  // unnormalised probabilities in s and the factor that rescales earlier partial outputs in alpha.
  static void softmax_online(float* s, int64_t kn, float scale, int64_t diag, float* m, float* l,
                             float* alpha) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < kTile; ++i) {
      float mx = m[i];
      for (int64_t j = 0; j < kn; ++j) {
        float& x = s[j * kTile + i];
        x = j > i + diag ? kNegInf : x * scale;
        mx = std::max(mx, x);
      }
      float sum = 0;
      for (int64_t j = 0; j < kn; ++j) {
        float& x = s[j * kTile + i];
        x = std::exp(x - mx);
        sum += x;
      }
      alpha[i] = std::exp(m[i] - mx);
      l[i] = l[i] * alpha[i] + sum;
      m[i] = mx;
    }
  }

  // s (scores) becomes P = exp(scale s - lse); dp becomes scale * dS = scale * P (dp - di).
  static void probs_grad(float* s, float* dp, int64_t kn, float scale, int64_t diag, const float* lse,
                         const float* di) {
    for (int64_t j = 0; j < kn; ++j)
      for (int64_t i = 0; i < kTile; ++i) {
        const float p = j > i + diag ? 0.f : std::exp(s[j * kTile + i] * scale - lse[i]);
        s[j * kTile + i] = p;
        dp[j * kTile + i] = p * (dp[j * kTile + i] - di[i]) * scale;
      }
  }
};

#define TITAN_AVX2 __attribute__((target("avx2,fma")))

// Lanes (queries 8v .. 8v+7 of the tile) that may see key j, as a mask of all-ones lanes.
TITAN_AVX2 inline __m256 visible8(int64_t j, int64_t diag, int64_t v) {
  const int64_t hidden = j - diag - 8 * v;  // queries below this lane index are masked
  return _mm256_castsi256_ps(_mm256_xor_si256(lanes::lanes_below8(hidden), _mm256_set1_epi32(-1)));
}

// Register tile on 8-float vectors: MR rows x NV vectors (<= 4 x 3: 12 accumulators + 3 B vectors + 1
// broadcast, the 16 ymm registers). kTail: the last vector holds only `last` (< 8) columns, read and
// written through a lane mask (masked stores are slow on AMD, so full tiles avoid them).
template <int MR, int NV, bool kTail>
TITAN_AVX2 void micro_tile8(int64_t K, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
                            float* c, int64_t ldc, bool accumulate, int last) {
  const __m256i tail = lanes::lanes_below8(last);
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cv = c + m * ldc + 8 * v;
      acc[m][v] = !accumulate            ? _mm256_setzero_ps()
                  : kTail && v == NV - 1 ? _mm256_maskload_ps(cv, tail)
                                         : _mm256_loadu_ps(cv);
    }
  for (int64_t kk = 0; kk < K; ++kk) {
    const float* bk = b + kk * ldb;
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = kTail && v == NV - 1 ? _mm256_maskload_ps(bk + 8 * v, tail) : _mm256_loadu_ps(bk + 8 * v);
    const float* ak = a + kk * sak;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 av = _mm256_broadcast_ss(ak + m * sam);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(av, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cv = c + m * ldc + 8 * v;
      if (kTail && v == NV - 1)
        _mm256_maskstore_ps(cv, tail, acc[m][v]);
      else
        _mm256_storeu_ps(cv, acc[m][v]);
    }
}

// micro_tile8<MR, NV, kTail> by [kTail][MR - 1][NV - 1]: the tile for the rows and vectors left.
// 4 x 3 is the full tile: on Zen3 it ran this file's tile products at head_dim 128 1-10 % faster
// than 6 x 2 and 8-16 % faster than 4 x 2 or 3 x 4 (~90 % of the FMA peak).
using MicroTile8 = void (*)(int64_t K, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
                            float* c, int64_t ldc, bool accumulate, int last);
constexpr MicroTile8 kMicroTiles8[2][4][3] = {
    {{micro_tile8<1, 1, false>, micro_tile8<1, 2, false>, micro_tile8<1, 3, false>},
     {micro_tile8<2, 1, false>, micro_tile8<2, 2, false>, micro_tile8<2, 3, false>},
     {micro_tile8<3, 1, false>, micro_tile8<3, 2, false>, micro_tile8<3, 3, false>},
     {micro_tile8<4, 1, false>, micro_tile8<4, 2, false>, micro_tile8<4, 3, false>}},
    {{micro_tile8<1, 1, true>, micro_tile8<1, 2, true>, micro_tile8<1, 3, true>},
     {micro_tile8<2, 1, true>, micro_tile8<2, 2, true>, micro_tile8<2, 3, true>},
     {micro_tile8<3, 1, true>, micro_tile8<3, 2, true>, micro_tile8<3, 3, true>},
     {micro_tile8<4, 1, true>, micro_tile8<4, 2, true>, micro_tile8<4, 3, true>}}};

struct Avx2Ops {
  static constexpr bool kBf16Dot = false;
  static constexpr bool kBf16Probs = false;
  static constexpr bool kAmx = false;

  TITAN_AVX2 static void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t sam, int64_t sak,
                              const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    for (int64_t n0 = 0; n0 < N; n0 += 24) {
      const int64_t nw = std::min<int64_t>(24, N - n0);
      const int nv = int((nw + 7) / 8), last = int(nw - 8 * (nv - 1));  // columns in the last vector
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t mr = std::min<int64_t>(4, M - m0);
        kMicroTiles8[last < 8][mr - 1][nv - 1](K, a + m0 * sam, sam, sak, b + n0, ldb, c + m0 * ldc + n0, ldc,
                                               accumulate, last);
      }
    }
  }

  // bf16 -> f32 is a 16-bit left shift of the bits.
  TITAN_AVX2 static void widen_rows(const bf16* src, int64_t ld, int64_t n, int64_t D, float* dst) {
    for (int64_t i = 0; i < n; ++i) {
      const bf16* si = src + i * ld;
      float* di = dst + i * D;
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(si + d)));
        _mm256_storeu_ps(di + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
      for (; d < D; ++d) di[d] = bf16_to_f32(si[d]);
    }
  }

  TITAN_AVX2 static void softmax_online(float* s, int64_t kn, float scale, int64_t diag, float* m, float* l,
                                        float* alpha) {
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t v = 0; v < kTile / 8; ++v) {
      const __m256 mold = _mm256_loadu_ps(m + 8 * v);
      __m256 mx = mold;
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 8 * v;
        const __m256 x =
            _mm256_blendv_ps(neg_inf, _mm256_mul_ps(_mm256_loadu_ps(sj), vscale), visible8(j, diag, v));
        _mm256_storeu_ps(sj, x);
        mx = _mm256_max_ps(mx, x);
      }
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 8 * v;
        const __m256 p =
            _mm256_and_ps(visible8(j, diag, v), lanes::exp8(_mm256_sub_ps(_mm256_loadu_ps(sj), mx)));
        _mm256_storeu_ps(sj, p);
        sum = _mm256_add_ps(sum, p);
      }
      // The first tile has mold = -inf: alpha comes out 0 and multiplies l = 0 and O = 0.
      const __m256 a = lanes::exp8(_mm256_sub_ps(mold, mx));
      _mm256_storeu_ps(alpha + 8 * v, a);
      _mm256_storeu_ps(l + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * v), a, sum));
      _mm256_storeu_ps(m + 8 * v, mx);
    }
  }

  TITAN_AVX2 static void probs_grad(float* s, float* dp, int64_t kn, float scale, int64_t diag,
                                    const float* lse, const float* di) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t v = 0; v < kTile / 8; ++v) {
      const __m256 vlse = _mm256_loadu_ps(lse + 8 * v), vdi = _mm256_loadu_ps(di + 8 * v);
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 8 * v;
        float* dpj = dp + j * kTile + 8 * v;
        const __m256 p = _mm256_and_ps(visible8(j, diag, v),
                                       lanes::exp8(_mm256_fmsub_ps(_mm256_loadu_ps(sj), vscale, vlse)));
        _mm256_storeu_ps(sj, p);
        const __m256 ds = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dpj), vdi));
        _mm256_storeu_ps(dpj, _mm256_mul_ps(ds, vscale));
      }
    }
  }
};

#undef TITAN_AVX2

// GCC 12's AVX-512 headers build results from _mm512_undefined_ps() (`__m512 __Y = __Y;`), which
// trips -Wuninitialized at every inlined intrinsic; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TITAN_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2")))

// Lanes (queries 16v .. 16v+15 of the tile) that may see key j.
TITAN_AVX512 inline __mmask16 visible(int64_t j, int64_t diag, int64_t v) {
  const int64_t hidden = j - diag - 16 * v;  // queries below this lane index are masked
  if (hidden <= 0) return 0xFFFF;
  if (hidden >= 16) return 0;
  return __mmask16(0xFFFFu << hidden);
}

// Register tile: MR rows x NV vectors (<= 6 x 4: 24 accumulators + 4 B vectors + 1 broadcast).
template <int MR, int NV>
TITAN_AVX512 void micro_tile(int64_t K, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
                             float* c, int64_t ldc, bool accumulate, __mmask16 tail) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? tail : 0xFFFF, c + m * ldc + 16 * v)
                             : _mm512_setzero_ps();
  for (int64_t kk = 0; kk < K; ++kk) {
    const float* bk = b + kk * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(bk + 16 * v);
    bv[NV - 1] = _mm512_maskz_loadu_ps(tail, bk + 16 * (NV - 1));
    const float* ak = a + kk * sak;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 av = _mm512_set1_ps(ak[m * sam]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(av, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(c + m * ldc + 16 * v, v == NV - 1 ? tail : 0xFFFF, acc[m][v]);
}

// micro_tile<MR, NV> by [MR - 1][NV - 1]: the tile for the rows and 16-float vectors left.
using MicroTile = void (*)(int64_t K, const float* a, int64_t sam, int64_t sak, const float* b, int64_t ldb,
                           float* c, int64_t ldc, bool accumulate, __mmask16 tail);
constexpr MicroTile kMicroTiles[6][4] = {
    {micro_tile<1, 1>, micro_tile<1, 2>, micro_tile<1, 3>, micro_tile<1, 4>},
    {micro_tile<2, 1>, micro_tile<2, 2>, micro_tile<2, 3>, micro_tile<2, 4>},
    {micro_tile<3, 1>, micro_tile<3, 2>, micro_tile<3, 3>, micro_tile<3, 4>},
    {micro_tile<4, 1>, micro_tile<4, 2>, micro_tile<4, 3>, micro_tile<4, 4>},
    {micro_tile<5, 1>, micro_tile<5, 2>, micro_tile<5, 3>, micro_tile<5, 4>},
    {micro_tile<6, 1>, micro_tile<6, 2>, micro_tile<6, 3>, micro_tile<6, 4>}};

struct Avx512Ops {
  static constexpr bool kBf16Dot = false;
  static constexpr bool kBf16Probs = false;
  static constexpr bool kAmx = false;

  TITAN_AVX512 static void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t sam, int64_t sak,
                                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
      const int64_t nw = std::min<int64_t>(64, N - n0);
      const int nv = int((nw + 15) / 16);
      const __mmask16 tail = __mmask16(0xFFFFu >> (16 * nv - nw));
      for (int64_t m0 = 0; m0 < M; m0 += 6) {
        const int64_t mr = std::min<int64_t>(6, M - m0);
        kMicroTiles[mr - 1][nv - 1](K, a + m0 * sam, sam, sak, b + n0, ldb, c + m0 * ldc + n0, ldc,
                                    accumulate, tail);
      }
    }
  }

  // bf16 -> f32 is a 16-bit left shift of the bits.
  TITAN_AVX512 static void widen_rows(const bf16* src, int64_t ld, int64_t n, int64_t D, float* dst) {
    for (int64_t i = 0; i < n; ++i) {
      const bf16* si = src + i * ld;
      float* di = dst + i * D;
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = D - d >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (D - d)) - 1);
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, si + d));
        _mm512_mask_storeu_ps(di + d, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
    }
  }

  TITAN_AVX512 static void softmax_online(float* s, int64_t kn, float scale, int64_t diag, float* m, float* l,
                                          float* alpha) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t v = 0; v < kTile / 16; ++v) {
      const __m512 mold = _mm512_loadu_ps(m + 16 * v);
      __m512 mx = mold;
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 16 * v;
        const __m512 x = _mm512_mask_mul_ps(neg_inf, visible(j, diag, v), _mm512_loadu_ps(sj), vscale);
        _mm512_storeu_ps(sj, x);
        mx = _mm512_max_ps(mx, x);
      }
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 16 * v;
        const __m512 p =
            _mm512_maskz_mov_ps(visible(j, diag, v), lanes::exp16(_mm512_sub_ps(_mm512_loadu_ps(sj), mx)));
        _mm512_storeu_ps(sj, p);
        sum = _mm512_add_ps(sum, p);
      }
      // The first tile has mold = -inf: alpha comes out 0 and multiplies l = 0 and O = 0.
      const __m512 a = lanes::exp16(_mm512_sub_ps(mold, mx));
      _mm512_storeu_ps(alpha + 16 * v, a);
      _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v), a, sum));
      _mm512_storeu_ps(m + 16 * v, mx);
    }
  }

  TITAN_AVX512 static void probs_grad(float* s, float* dp, int64_t kn, float scale, int64_t diag,
                                      const float* lse, const float* di) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t v = 0; v < kTile / 16; ++v) {
      const __m512 vlse = _mm512_loadu_ps(lse + 16 * v), vdi = _mm512_loadu_ps(di + 16 * v);
      for (int64_t j = 0; j < kn; ++j) {
        float* sj = s + j * kTile + 16 * v;
        float* dpj = dp + j * kTile + 16 * v;
        const __m512 p = _mm512_maskz_mov_ps(
            visible(j, diag, v), lanes::exp16(_mm512_fmsub_ps(_mm512_loadu_ps(sj), vscale, vlse)));
        _mm512_storeu_ps(sj, p);
        const __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dpj), vdi));
        _mm512_storeu_ps(dpj, _mm512_mul_ps(ds, vscale));
      }
    }
  }
};

#define TITAN_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2,avx512bf16")))

// The same register tile for C[m][0..63] += sum_p a2(m, p) . b2[p][n], where a2 and b2 are pairs of
// bf16 (one 32-bit word) along the reduction dimension and vdpbf16ps multiplies a pair by a pair.
// bf16 x bf16 products are exact in f32 and the sums are f32: the result is an f32 dot product.
template <int MR>
TITAN_AVX512_BF16 void micro_tile_dot(int64_t P, const uint32_t* a, int64_t sam, int64_t sak,
                                      const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                                      bool accumulate) {
  constexpr int NV = kTile / 16;
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? _mm512_loadu_ps(c + m * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const uint32_t* bp = b + p * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(bp + 16 * v);
    const uint32_t* ap = a + p * sak;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t word;  // (the words alias bf16 tensors: read them with memcpy)
      std::memcpy(&word, ap + m * sam, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + m * ldc + 16 * v, acc[m][v]);
}

// With AVX512-BF16, the two products whose operands are both bf16 tensors (S = Q K^T, dP = dO V^T)
// run on vdpbf16ps (twice the multiply-adds per instruction). The others multiply by P or dS, which
// are f32 here and are not rounded to bf16, so they stay on the f32 kernel.
// micro_tile_dot<MR> for the rows left.
using MicroTileDot = void (*)(int64_t P, const uint32_t* a, int64_t sam, int64_t sak, const uint32_t* b,
                              int64_t ldb, float* c, int64_t ldc, bool accumulate);

struct Avx512Bf16Ops : Avx512Ops {
  static constexpr bool kBf16Dot = true;

  // C[M][kTile] (+)= sum over P pairs; a2(m, p) = a[m * sam + p * sak], b2 rows of ldb words.
  TITAN_AVX512_BF16 static void gemm_dot(int64_t M, int64_t P, const uint32_t* a, int64_t sam, int64_t sak,
                                         const uint32_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    static constexpr MicroTileDot kTiles[6] = {micro_tile_dot<1>, micro_tile_dot<2>, micro_tile_dot<3>,
                                               micro_tile_dot<4>, micro_tile_dot<5>, micro_tile_dot<6>};
    for (int64_t m0 = 0; m0 < M; m0 += 6) {
      kTiles[std::min<int64_t>(6, M - m0) - 1](P, a + m0 * sam, sam, sak, b, ldb, c + m0 * ldc, ldc,
                                               accumulate);
    }
  }
};

// The "bf16_probs" variant: P and dS are rounded to bf16 (as GPU FlashAttention and a bf16 torch
// autograd do) so that the four products that multiply by them (P V, P^T dO, dS^T Q, dS K) run on
// vdpbf16ps too. The packers below build the pair layouts those products reduce over.
struct Avx512Bf16ProbsOps : Avx512Bf16Ops {
  static constexpr bool kBf16Probs = true;

  // 16 bf16 (raw bits) widened into the low halves of 32-bit lanes.
  TITAN_AVX512_BF16 static __m512i lanes16(const bf16* x) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  }

  // Row pairs of a bf16 matrix rows[n][D] (stride ld): out[p][d] = (rows[2p][d], rows[2p+1][d]) for
  // p < npairs; rows at or past n read as zero. D is a multiple of 16.
  TITAN_AVX512_BF16 static void pack_row_pairs(const bf16* rows, int64_t ld, int64_t n, int64_t npairs, int64_t D,
                                               uint32_t* out) {
    for (int64_t p = 0; p < npairs; ++p) {
      const bf16 *r0 = 2 * p < n ? rows + 2 * p * ld : nullptr, *r1 = 2 * p + 1 < n ? rows + (2 * p + 1) * ld : nullptr;
      for (int64_t d = 0; d < D; d += 16) {
        const __m512i lo = r0 ? lanes16(r0 + d) : _mm512_setzero_si512();
        const __m512i hi = r1 ? _mm512_slli_epi32(lanes16(r1 + d), 16) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + p * D + d, _mm512_or_si512(lo, hi));
      }
    }
  }

  // f32 tile s[j][kTile] -> bf16 rows out[j][kTile] (round to nearest even) for j < kn.
  TITAN_AVX512_BF16 static void round_rows(const float* s, int64_t kn, bf16* out) {
    for (int64_t j = 0; j < kn; ++j)
      for (int64_t i = 0; i < kTile; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * kTile + i),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + j * kTile + i)));
  }

  // f32 tile s[j][kTile] -> pairs along j: out[p][i] = (bf16 s[2p][i], bf16 s[2p+1][i]), rows >= kn zero.
  TITAN_AVX512_BF16 static void pair_rows(const float* s, int64_t kn, uint32_t* out) {
    for (int64_t p = 0; p < (kn + 1) / 2; ++p)
      for (int64_t i = 0; i < kTile; i += 16) {
        const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + 2 * p * kTile + i)));
        const __m512i hi = 2 * p + 1 < kn ? _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(
                                                                  _mm512_loadu_ps(s + (2 * p + 1) * kTile + i))),
                                                              16)
                                          : _mm512_setzero_si512();
        _mm512_storeu_si512(out + p * kTile + i, _mm512_or_si512(lo, hi));
      }
  }
};

// ---------------------------------------------------------------------------------------------
// AMX (Sapphire Rapids and later Xeons). TDPBF16PS multiplies a 16 x 32 bf16 tile A by a 16 x 32 bf16
// tile B holding 16 row pairs, B[p][2n + e] = B(2p + e, n), into a 16 x 16 f32 tile C: 16 x 16 x 32
// = 8192 multiply-adds per instruction, one instruction per 16 cycles: 512 per cycle, 16 times a
// vdpbf16ps issued every cycle (32 times Intel's, issued every other cycle). Every tile here is 16 rows
// of 64 bytes.
#define TITAN_AMX \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2,avx512bf16,amx-tile,amx-bf16")))

// The tile configuration register's memory image (palette 1): tiles 0-7 of 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
// A constant in memory: GCC's _tile_loadconfig tells the compiler it reads only 8 bytes of its
// argument, so the stores that build a local copy can be dropped before ldtilecfg reads 64.
constexpr AmxTileConfig kAmxTileConfig{};

// The configuration is thread state that oneDNN's own AMX kernels also set: a thread loads ours
// before each batch of products and releases the tiles after it.
TITAN_AMX void amx_begin() {
  _tile_loadconfig(&kAmxTileConfig);
}
TITAN_AMX void amx_end() {
  _tile_release();
}

// C[M][N] (+)= A[M][K] B[K][N]: A bf16 row-major (lda elements per row), B pair-packed along K
// (b[p][n] is the word (B(2p, n), B(2p + 1, n)), ldb words per row), C f32 (ldc floats per row).
// M, N and K are multiples of 32: a 2 x 2 block of C tiles (tmm0-3) takes two A tiles (tmm4-5) and
// two B tiles (tmm6-7) per 32-deep step, four products for four loads.
TITAN_AMX void amx_gemm(int64_t M, int64_t N, int64_t K, const bf16* a, int64_t lda, const uint32_t* b,
                        int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // GCC's tileloadd asm names no memory operand: the barrier keeps the callers' stores to the
  // operands before the loads, should this function ever be inlined.
  asm volatile("" ::: "memory");
  const int64_t sa = lda * int64_t(sizeof(bf16)), sb = ldb * 4, sc = ldc * 4;
  for (int64_t m0 = 0; m0 < M; m0 += 32)
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      float* c0 = c + m0 * ldc + n0;
      float* c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, sc);
        _tile_loadd(1, c0 + 16, sc);
        _tile_loadd(2, c1, sc);
        _tile_loadd(3, c1 + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k0 = 0; k0 < K; k0 += 32) {
        const bf16* a0 = a + m0 * lda + k0;
        const uint32_t* b0 = b + k0 / 2 * ldb + n0;
        _tile_loadd(4, a0, sa);
        _tile_loadd(5, a0 + 16 * lda, sa);
        _tile_loadd(6, b0, sb);
        _tile_loadd(7, b0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, sc);
      _tile_stored(1, c0 + 16, sc);
      _tile_stored(2, c1, sc);
      _tile_stored(3, c1 + 16, sc);
    }
}

// The exact bf16 kernels (f32 P and dS) with their two bf16 x bf16 products, S^T = K Q^T and
// dP^T = V dO^T, on AMX tiles: the tile scores of a kv tile read K or V rows in place. A last kv
// tile whose key count is not a multiple of 32, a head_dim that is not a multiple of 32 or an operand
// that is not rows of pairs takes vdpbf16ps. The drivers load the tile configuration per thread (kAmx).
struct AmxDotOps : Avx512Bf16Ops {
  static constexpr bool kAmx = true;

  static void gemm_dot(int64_t M, int64_t P, const uint32_t* a, int64_t sam, int64_t sak, const uint32_t* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    if (M % 32 == 0 && P % 16 == 0 && sak == 1 && ldb == kTile)
      return amx_gemm(M, kTile, 2 * P, reinterpret_cast<const bf16*>(a), 2 * sam, b, ldb, c, ldc, accumulate);
    Avx512Bf16Ops::gemm_dot(M, P, a, sam, sak, b, ldb, c, ldc, accumulate);
  }
};

// t[D][kTile] *= alpha[i] along each row (the forward's rescale of O^T by the new running max).
TITAN_AMX void scale_columns(float* t, int64_t D, const float* alpha) {
  __m512 a[kTile / 16];
  for (int v = 0; v < kTile / 16; ++v) a[v] = _mm512_loadu_ps(alpha + 16 * v);
  for (int64_t d = 0; d < D; ++d)
    for (int v = 0; v < kTile / 16; ++v)
      _mm512_storeu_ps(t + d * kTile + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(t + d * kTile + 16 * v), a[v]));
}

#undef TITAN_AMX

#undef TITAN_AVX512_BF16
#undef TITAN_AVX512
#pragma GCC diagnostic pop

// Rows of an input tensor (stride ld) copied into contiguous f32 scratch (stride D): bf16 is widened,
// f32 is copied too, because reading rows in place means Hq*D- or Hkv*D-float strides (4-8 KiB at
// D = 128), which alias in L1 and measured ~10% slower than the copy.
template <class Ops, class T>
void load_rows(const T* src, int64_t ld, int64_t n, int64_t D, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * D, src + i * ld, size_t(D) * sizeof(float));
  } else {
    Ops::widen_rows(src, ld, n, D, dst);
  }
}
// (The core's bulk converters open an OpenMP region per call: too heavy for one row inside ours.)
void store_row(float* dst, const float* src, int64_t D) {
  std::memcpy(dst, src, size_t(D) * sizeof(float));
}
void store_row(bf16* dst, const float* src, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = f32_to_bf16(src[d]);
}

// rows[n][D] (stride ld) -> t[D][kTile], queries n..kTile-1 zero (their results are never written).
void transpose_tile(const float* rows, int64_t ld, int64_t n, int64_t D, float* t) {
  for (int64_t d = 0; d < D; ++d) {
    float* td = t + d * kTile;
    for (int64_t i = 0; i < n; ++i) td[i] = rows[i * ld + d];
    std::fill(td + n, td + kTile, 0.f);
  }
}

// bf16 rows[n][D] (stride ld, D even) -> t[D/2][kTile] words holding the pair (row i: 2p, 2p+1),
// the layout vdpbf16ps reduces over; padding queries are zero.
void pack_pairs(const bf16* rows, int64_t ld, int64_t n, int64_t D, uint32_t* t) {
  for (int64_t p = 0; p < D / 2; ++p) {
    uint32_t* tp = t + p * kTile;
    for (int64_t i = 0; i < n; ++i) std::memcpy(tp + i, rows + i * ld + 2 * p, 4);
    std::fill(tp + n, tp + kTile, 0u);
  }
}

// Whether the bf16 dot-product kernel applies: it reads q.k and dout.v operands as 32-bit pairs.
template <class Ops, class T>
bool use_dot(int64_t D, std::initializer_list<const T*> tensors) {
  if constexpr (!Ops::kBf16Dot || !std::is_same_v<T, bf16>) {
    return false;
  } else {
    if (D % 2 != 0) return false;
    for (const T* t : tensors)
      if (reinterpret_cast<uintptr_t>(t) % 4 != 0) return false;
    return true;
  }
}

// C^T[kn][kTile] = X Y^T for a kv-side tile X (kn rows of the tensor `raw`, stride ld; `rows` is its
// f32 view) and a query-side tile Y held transposed (yt, f32) or pair-packed (yp, for the dot kernel).
template <class Ops, class T>
void tile_scores(bool dot, int64_t kn, int64_t D, const T* raw, int64_t ld, const float* rows, int64_t ldr,
                 const float* yt, const uint32_t* yp, float* c) {
  if constexpr (Ops::kBf16Dot) {
    if (dot)
      return Ops::gemm_dot(kn, D / 2, reinterpret_cast<const uint32_t*>(raw), ld / 2, 1, yp, kTile, c, kTile, false);
  }
  Ops::gemm(kn, kTile, D, rows, ldr, 1, yt, kTile, c, kTile, false);
}

// The forward's last step for a query tile: rows i < qn of out (stride ldq) = O^T[.][i] / l[i] and
// lse[i] = m[i] + log(l[i]).
template <class T>
void finish_query_tile(const float* ot, const float* m, const float* l, int64_t qn, int64_t D, T* out,
                       int64_t ldq, float* lse, float* row) {
  for (int64_t i = 0; i < qn; ++i) {
    const float inv = 1.f / l[i];
    for (int64_t d = 0; d < D; ++d) row[d] = ot[d * kTile + i] * inv;
    store_row(out + i * ldq, row, D);
    lse[i] = m[i] + std::log(l[i]);
  }
}

int64_t tiles(int64_t S) {
  return (S + kTile - 1) / kTile;
}

template <class Ops, class T>
void fwd_flash(const AttentionShape& s, const T* q, const T* k, const T* v, T* out, float* lse) {
  ops::check_attention_shape(s, "attention_fwd_flash");
  const int64_t D = s.D, S = s.S, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D, nt = tiles(S);
  const int64_t ntasks = s.B * s.Hq * nt;
  const bool dot = use_dot<Ops, T>(D, {q, k});
  // bf16_probs: P V on vdpbf16ps with P rounded to bf16 (V rows packed in pairs).
  const bool probs16 = Ops::kBf16Probs && dot && use_dot<Ops, T>(D, {v}) && D % 16 == 0;
#pragma omp parallel if (worth_threads(s))
  {
    std::vector<float> qrows(kTile * D), krows(kTile * D), vrows(kTile * D), qt(dot ? 0 : D * kTile),
        ot(D * kTile), st(kTile * kTile), m(kTile), l(kTile), alpha(kTile), row(D);
    std::vector<uint32_t> qp(dot ? D / 2 * kTile : 0), vpair(probs16 ? kTile / 2 * D : 0),
        ppair(probs16 ? kTile / 2 * kTile : 0);
    if constexpr (Ops::kAmx) {
      amx_begin();
    }
    // Heaviest query tiles (the last ones, which see the most keys) first, for dynamic balance.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntasks; ++t) {
      const int64_t qtile = nt - 1 - t / (s.B * s.Hq), b = (t % (s.B * s.Hq)) / s.Hq, h = t % s.Hq;
      const int64_t q0 = qtile * kTile, qn = std::min(kTile, S - q0);
      const int64_t kvoff = b * S * ldk + (h / r) * D;
      if constexpr (std::is_same_v<T, bf16>) {
        if (dot) pack_pairs(q + (b * S + q0) * ldq + h * D, ldq, qn, D, qp.data());
      }
      if (!dot) {
        load_rows<Ops>(q + (b * S + q0) * ldq + h * D, ldq, qn, D, qrows.data());
        transpose_tile(qrows.data(), D, qn, D, qt.data());
      }
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      std::fill(ot.begin(), ot.end(), 0.f);
      for (int64_t ktile = 0; ktile <= qtile; ++ktile) {  // tiles above the diagonal are fully masked
        const int64_t k0 = ktile * kTile, kn = std::min(kTile, S - k0);
        if (!dot) load_rows<Ops>(k + kvoff + k0 * ldk, ldk, kn, D, krows.data());
        tile_scores<Ops>(dot, kn, D, k + kvoff + k0 * ldk, ldk, krows.data(), D, qt.data(), qp.data(),
                         st.data());
        Ops::softmax_online(st.data(), kn, s.scale, q0 - k0, m.data(), l.data(), alpha.data());
        for (int64_t d = 0; d < D; ++d)
          for (int64_t i = 0; i < kTile; ++i) ot[d * kTile + i] *= alpha[i];
        if constexpr (Ops::kBf16Probs) {
          if (probs16) {  // O^T += V^T P^T over key pairs
            const int64_t kp = (kn + 1) / 2;
            Ops::pack_row_pairs(v + kvoff + k0 * ldk, ldk, kn, kp, D, vpair.data());
            Ops::pair_rows(st.data(), kn, ppair.data());
            Ops::gemm_dot(D, kp, vpair.data(), 1, D, ppair.data(), kTile, ot.data(), kTile, true);
            continue;
          }
        }
        load_rows<Ops>(v + kvoff + k0 * ldk, ldk, kn, D, vrows.data());
        Ops::gemm(D, kTile, kn, vrows.data(), 1, D, st.data(), kTile, ot.data(), kTile,
                  true);  // O^T += V^T P^T
      }
      finish_query_tile(ot.data(), m.data(), l.data(), qn, D, out + (b * S + q0) * ldq + h * D, ldq,
                        lse + (b * s.Hq + h) * S + q0, row.data());
    }
    if constexpr (Ops::kAmx) amx_end();
  }
}

// dQ of the backward kernels (bwd_flash, bwd_flash_amx). A query tile's dq sums the products of the
// kv tiles at or before it. The kv tiles of each (batch, kv head) group are cut into splits, split sp
// holding the tiles ktile % count == sp (interleaved for causal balance), and dq is the splits'
// partial sums added in split order. The count depends on the shape alone, so dq has the same bits on
// any number of threads: splits enough for kSplitThreads threads with the groups (at most 4), none
// where the kernel runs on one thread or a group has one kv tile.
// The thread count picks the schedule only. Where groups are too few for the threads, a task is
// (group, split): each split writes an f32 partial of dq (an f32 copy of dq each) and a final pass
// adds them. Elsewhere a task is a whole group: it holds a dQ^T tile per split and adds them as it
// stores each query tile, the same sums with no copy and no further pass.
class DqSplits {
 public:
  static constexpr int64_t kSplitThreads = 64;

  DqSplits(const AttentionShape& s, int64_t groups, int64_t nt)
      : count_(worth_threads(s) ? std::min({nt, int64_t(4), (kSplitThreads + groups - 1) / groups}) : 1),
        tasks_(count_ > 1 && too_few_for_the_threads(groups) ? count_ : 1),
        S_(s.S),
        Hq_(s.Hq),
        qsize_(s.B * s.S * s.Hq * s.D),
        // From the allocator, so the run's memory figures include them. Split sp writes the query
        // tiles from sp on, the only rows of its partial the final pass reads.
        parts_(device_services(Device::CPU).context(),
               tasks_ > 1 ? size_t(count_ * qsize_) * sizeof(float) : 0) {}

  // Splits of each group's kv tiles: split sp's first kv tile is sp.
  int64_t count() const { return count_; }
  // Tasks per group; task t's kv tiles are t, t + stride(), ...: all of them with one task per group,
  // split t's otherwise.
  int64_t tasks_per_group() const { return tasks_; }
  int64_t stride() const { return tasks_ == 1 ? 1 : count_; }
  // The dQ^T tiles a task holds (dqt[tile][d][kTile]), and the one kv tile `ktile` adds into.
  int64_t tiles() const { return tasks_ == 1 ? count_ : 1; }
  float* tile_of(float* dqt, int64_t ktile, int64_t D) const {
    return tasks_ == 1 ? dqt + ktile % count_ * D * kTile : dqt;
  }

  // Query rows i < qn of query tile `qtile` from task t's dQ^T tiles, to rows qoff + i * ldq. A task
  // holding every split first adds the tiles of those with kv tiles at or before it, in split order.
  template <class T>
  void store_tile(float* dqt, int64_t qn, int64_t qtile, int64_t D, int64_t ldq, int64_t qoff, int64_t t,
                  T* dq, float* row) const {
    if (tasks_ == 1)
      for (int64_t sp = 1; sp < std::min(count_, qtile + 1); ++sp)
        for (int64_t j = 0; j < D * kTile; ++j) dqt[j] += dqt[sp * D * kTile + j];
    for (int64_t i = 0; i < qn; ++i) {
      for (int64_t d = 0; d < D; ++d) row[d] = dqt[d * kTile + i];
      if (tasks_ == 1)
        store_row(dq + qoff + i * ldq, row, D);
      else
        std::memcpy(parts_.as<float>() + t * qsize_ + qoff + i * ldq, row, size_t(D) * sizeof(float));
    }
  }

  // Called by every thread of the parallel region after its tasks: dq = the partials of the splits
  // that wrote each row, added in split order as store_tile adds them (a work-shared loop; nothing
  // to do with one task per group).
  template <class T>
  void sum_into(T* dq, int64_t D, float* row) const {
    if (tasks_ == 1) return;
#pragma omp for schedule(static)
    for (int64_t rw = 0; rw < qsize_ / D; ++rw) {
      const int64_t writers = std::min(count_, (rw / Hq_) % S_ / kTile + 1);  // row rw: [b, i, h]
      std::memcpy(row, parts_.as<float>() + rw * D, size_t(D) * sizeof(float));
      for (int64_t sp = 1; sp < writers; ++sp) {
        const float* part = parts_.as<float>() + sp * qsize_ + rw * D;
        for (int64_t d = 0; d < D; ++d) row[d] += part[d];
      }
      store_row(dq + rw * D, row, D);
    }
  }

 private:
  // Fewer than 4 groups a thread, unless they divide evenly among the threads.
  static bool too_few_for_the_threads(int64_t groups) {
    const int64_t threads = omp_get_max_threads();
    return groups < 4 * threads && groups % threads != 0;
  }

  int64_t count_, tasks_, S_, Hq_, qsize_;
  Scratch parts_;
};

// FlashAttention-2 backward. A task is a (batch, kv head) group or one of its splits (DqSplits): it
// owns its kv tiles for all r query heads of the group, so its dk/dv rows are private; dq goes
// through DqSplits.
template <class Ops, class T>
void bwd_flash(const AttentionShape& s, const T* q, const T* k, const T* v, const T* out, const float* lse,
               const T* dout, T* dq, T* dk, T* dv) {
  ops::check_attention_shape(s, "attention_bwd_flash");
  constexpr bool kF32 = std::is_same_v<T, float>;
  const int64_t D = s.D, S = s.S, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D, nt = tiles(S);
  const int64_t groups = s.B * s.Hkv;
  const DqSplits dq_splits(s, groups, nt);
  const int64_t per_group = dq_splits.tasks_per_group(), kstep = dq_splits.stride();
  const bool dot = use_dot<Ops, T>(D, {q, k, v, dout});
  // bf16_probs: P and dS rounded to bf16; dV, dK (64 columns at a time) and dQ on vdpbf16ps.
  const bool probs16 = Ops::kBf16Probs && dot && D % kTile == 0;
#pragma omp parallel if (worth_threads(s))
  {
    std::vector<uint32_t> kpair(probs16 ? (S + 1) / 2 * D : 0), qpair(probs16 ? kTile / 2 * D : 0),
        dopair(probs16 ? kTile / 2 * D : 0), dspair(probs16 ? kTile / 2 * kTile : 0);
    std::vector<bf16> pb(probs16 ? kTile * kTile : 0), dsb(probs16 ? kTile * kTile : 0);
    std::vector<float> qrows(kTile * D), dorows(kTile * D), qt(dot ? 0 : D * kTile),
        dot_t(dot ? 0 : D * kTile), dqt(dq_splits.tiles() * D * kTile), st(kTile * kTile), dpt(kTile * kTile),
        lse_t(kTile), di_t(kTile), row(D), orow(D);
    std::vector<uint32_t> qp(dot ? D / 2 * kTile : 0), dop(dot ? D / 2 * kTile : 0);
    // bf16 outputs accumulate dk/dv in f32 scratch; f32 outputs accumulate in place. The k (and v, off
    // the dot path) rows of the task's kv head are loaded once per task, not once per tile pair.
    std::vector<float> dk_scratch(kF32 ? 0 : S * D), dv_scratch(kF32 ? 0 : S * D), kf(probs16 ? 0 : S * D),
        vf(dot ? 0 : S * D);
    if constexpr (Ops::kAmx) amx_begin();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < groups * per_group; ++task) {
      const int64_t t = task % per_group, b = task / per_group / s.Hkv, g = task / per_group % s.Hkv;
      const int64_t kvoff = b * S * ldk + g * D;
      float *dk_acc, *dv_acc;
      int64_t ld_acc;
      if constexpr (kF32) {
        dk_acc = dk + kvoff;
        dv_acc = dv + kvoff;
        ld_acc = ldk;
      } else {
        dk_acc = dk_scratch.data();
        dv_acc = dv_scratch.data();
        ld_acc = D;
      }
      // f32 K rows feed the f32 dQ product (and the scores off the dot path); bf16_probs packs pairs.
      if (probs16) {
        if constexpr (Ops::kBf16Probs) Ops::pack_row_pairs(k + kvoff, ldk, S, (S + 1) / 2, D, kpair.data());
      } else {
        load_rows<Ops>(k + kvoff, ldk, S, D, kf.data());
      }
      if (!dot) load_rows<Ops>(v + kvoff, ldk, S, D, vf.data());
      for (int64_t ktile = t; ktile < nt; ktile += kstep)
        for (int64_t j = ktile * kTile; j < std::min(S, (ktile + 1) * kTile); ++j) {
          std::fill(dk_acc + j * ld_acc, dk_acc + j * ld_acc + D, 0.f);
          std::fill(dv_acc + j * ld_acc, dv_acc + j * ld_acc + D, 0.f);
        }
      for (int64_t h = g * r; h < (g + 1) * r; ++h)
        for (int64_t qtile = t; qtile < nt; ++qtile) {
          const int64_t q0 = qtile * kTile, qn = std::min(kTile, S - q0), qoff = (b * S + q0) * ldq + h * D;
          load_rows<Ops>(q + qoff, ldq, qn, D, qrows.data());
          load_rows<Ops>(dout + qoff, ldq, qn, D, dorows.data());
          if constexpr (std::is_same_v<T, bf16>) {
            if (dot) {
              pack_pairs(q + qoff, ldq, qn, D, qp.data());
              pack_pairs(dout + qoff, ldq, qn, D, dop.data());
            }
          }
          if constexpr (Ops::kBf16Probs) {
            if (probs16) {
              Ops::pack_row_pairs(q + qoff, ldq, qn, (qn + 1) / 2, D, qpair.data());
              Ops::pack_row_pairs(dout + qoff, ldq, qn, (qn + 1) / 2, D, dopair.data());
            }
          }
          if (!dot) {
            transpose_tile(qrows.data(), D, qn, D, qt.data());
            transpose_tile(dorows.data(), D, qn, D, dot_t.data());
          }
          for (int64_t i = 0; i < kTile; ++i) {
            lse_t[i] = 0.f;
            di_t[i] = 0.f;
            if (i >= qn) continue;  // padding queries: any finite values, their results are dropped
            lse_t[i] = lse[(b * s.Hq + h) * S + q0 + i];
            load_rows<Ops>(out + qoff + i * ldq, ldq, 1, D, orow.data());
            float acc = 0.f;
            for (int64_t d = 0; d < D; ++d) acc += dorows[i * D + d] * orow[d];
            di_t[i] = acc;
          }
          for (int64_t ktile = t; ktile <= qtile; ktile += kstep) {
            // dQ^T: a split's first kv tile (ktile < count) writes its tile, the later ones add to it.
            float* dqk = dq_splits.tile_of(dqt.data(), ktile, D);
            const bool dq_add = ktile >= dq_splits.count();
            const int64_t k0 = ktile * kTile, kn = std::min(kTile, S - k0);
            const float* kr = kf.data() + k0 * D;
            const float* vr = dot ? nullptr : vf.data() + k0 * D;
            tile_scores<Ops>(dot, kn, D, k + kvoff + k0 * ldk, ldk, kr, D, qt.data(), qp.data(), st.data());
            tile_scores<Ops>(dot, kn, D, v + kvoff + k0 * ldk, ldk, vr, D, dot_t.data(), dop.data(),
                             dpt.data());  // dP^T = V dO^T
            Ops::probs_grad(st.data(), dpt.data(), kn, s.scale, q0 - k0, lse_t.data(), di_t.data());
            if constexpr (Ops::kBf16Probs) {
              if (probs16) {
                // Pairs along queries (rows of P^T and dS^T as bf16) for dV and dK; padding queries
                // pair with the zero rows of qpair / dopair. Pairs along keys of dS for dQ.
                const int64_t qpn = (qn + 1) / 2, kpn = (kn + 1) / 2;
                Ops::round_rows(st.data(), kn, pb.data());
                Ops::round_rows(dpt.data(), kn, dsb.data());
                Ops::pair_rows(dpt.data(), kn, dspair.data());
                const auto* pw = reinterpret_cast<const uint32_t*>(pb.data());
                const auto* dsw = reinterpret_cast<const uint32_t*>(dsb.data());
                for (int64_t d0 = 0; d0 < D; d0 += kTile) {
                  Ops::gemm_dot(kn, qpn, pw, kTile / 2, 1, dopair.data() + d0, D, dv_acc + k0 * ld_acc + d0, ld_acc,
                                true);
                  Ops::gemm_dot(kn, qpn, dsw, kTile / 2, 1, qpair.data() + d0, D, dk_acc + k0 * ld_acc + d0, ld_acc,
                                true);
                }
                Ops::gemm_dot(D, kpn, kpair.data() + k0 / 2 * D, 1, D, dspair.data(), kTile, dqk, kTile,
                              dq_add);
                continue;
              }
            }
            // dV += P^T dO and dK += (scale dS)^T Q reduce over the valid queries only.
            Ops::gemm(kn, D, qn, st.data(), kTile, 1, dorows.data(), D, dv_acc + k0 * ld_acc, ld_acc, true);
            Ops::gemm(kn, D, qn, dpt.data(), kTile, 1, qrows.data(), D, dk_acc + k0 * ld_acc, ld_acc, true);
            Ops::gemm(D, kTile, kn, kr, 1, D, dpt.data(), kTile, dqk, kTile, dq_add);  // dQ^T
          }
          dq_splits.store_tile(dqt.data(), qn, qtile, D, ldq, qoff, t, dq, row.data());
        }
      if constexpr (!kF32)
        for (int64_t ktile = t; ktile < nt; ktile += kstep)
          for (int64_t j = ktile * kTile; j < std::min(S, (ktile + 1) * kTile); ++j) {
            store_row(dk + kvoff + j * ldk, dk_acc + j * D, D);
            store_row(dv + kvoff + j * ldk, dv_acc + j * D, D);
          }
    }
    if constexpr (Ops::kAmx) amx_end();
    dq_splits.sum_into(dq, D, row.data());
  }
}

// The bf16_probs algorithm (fwd_flash / bwd_flash with Avx512Bf16ProbsOps) with every product on AMX
// tiles: same orientation (score tiles S^T[key][query]), same softmax and gradient steps, same bf16
// roundings of P and dS; only the summation order of the products differs. A tile's A operand must
// be bf16 rows along the reduction, so K, V (and for dQ^T = K^T dS^T, K^T) are copied per kv head into
// zero-padded whole tiles: amx_gemm then runs every product on full 64 x 64 (or 64 x D) blocks, and
// padding keys and queries contribute zeros. Needs D % 32 == 0 (amx_attention_applies).
bool amx_attention_applies(const AttentionShape& s) {
  return s.D % 32 == 0;
}

// rows[n][D] (stride ld) -> out[np][D] with rows n.. zero; and the transpose out[D][np].
void copy_rows_padded(const bf16* rows, int64_t ld, int64_t n, int64_t np, int64_t D, bf16* out) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * D, rows + i * ld, size_t(D) * sizeof(bf16));
  std::fill(out + n * D, out + np * D, bf16{});
}
void transpose_rows_padded(const bf16* rows, int64_t ld, int64_t n, int64_t np, int64_t D, bf16* out) {
  for (int64_t d = 0; d < D; ++d) {
    bf16* od = out + d * np;
    for (int64_t i = 0; i < n; ++i) od[i] = rows[i * ld + d];
    std::fill(od + n, od + np, bf16{});
  }
}

void fwd_flash_amx(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                   float* lse) {
  using Ops = Avx512Bf16ProbsOps;
  ops::check_attention_shape(s, "attention_fwd_flash_amx");
  const int64_t D = s.D, S = s.S, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D, nt = tiles(S);
  const int64_t Sp = nt * kTile, groups = s.B * s.Hkv, ntasks = s.B * s.Hq * nt;
  // K rows and V^T of every kv head, shared by its r query heads and all their query tiles. From the
  // allocator, so the run's memory figures include them.
  const KernelContext& ctx = device_services(Device::CPU).context();
  const Scratch kc_buffer(ctx, size_t(groups * Sp * D) * sizeof(bf16)),
      vt_buffer(ctx, size_t(groups * Sp * D) * sizeof(bf16));
  bf16* kc = kc_buffer.as<bf16>();
  bf16* vt = vt_buffer.as<bf16>();
#pragma omp parallel if (worth_threads(s))
  {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t kvoff = (g / s.Hkv) * S * ldk + (g % s.Hkv) * D;
      copy_rows_padded(k + kvoff, ldk, S, Sp, D, kc + g * Sp * D);
      transpose_rows_padded(v + kvoff, ldk, S, Sp, D, vt + g * Sp * D);
    }
    std::vector<float> ot(D * kTile), st(kTile * kTile), m(kTile), l(kTile), alpha(kTile), row(D);
    std::vector<uint32_t> qp(D / 2 * kTile), ppair(kTile / 2 * kTile);
    amx_begin();
    // Heaviest query tiles first, as in fwd_flash.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntasks; ++t) {
      const int64_t qtile = nt - 1 - t / (s.B * s.Hq), b = (t % (s.B * s.Hq)) / s.Hq, h = t % s.Hq;
      const int64_t q0 = qtile * kTile, qn = std::min(kTile, S - q0), g = b * s.Hkv + h / r;
      const bf16* kg = kc + g * Sp * D;
      const bf16* vg = vt + g * Sp * D;
      pack_pairs(q + (b * S + q0) * ldq + h * D, ldq, qn, D, qp.data());
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      std::fill(ot.begin(), ot.end(), 0.f);
      for (int64_t ktile = 0; ktile <= qtile; ++ktile) {
        const int64_t k0 = ktile * kTile, kn = std::min(kTile, S - k0), kp = (kn + 1) / 2;
        amx_gemm(kTile, kTile, D, kg + k0 * D, D, qp.data(), kTile, st.data(), kTile, false);  // S^T = K Q^T
        Ops::softmax_online(st.data(), kn, s.scale, q0 - k0, m.data(), l.data(), alpha.data());
        scale_columns(ot.data(), D, alpha.data());
        Ops::pair_rows(st.data(), kn, ppair.data());  // P^T rounded to bf16, key pairs; padding keys zero
        std::fill(ppair.begin() + kp * kTile, ppair.end(), 0u);
        amx_gemm(D, kTile, kTile, vg + k0, Sp, ppair.data(), kTile, ot.data(), kTile,
                 true);  // O^T += V^T P^T
      }
      finish_query_tile(ot.data(), m.data(), l.data(), qn, D, out + (b * S + q0) * ldq + h * D, ldq,
                        lse + (b * s.Hq + h) * S + q0, row.data());
    }
    amx_end();
  }
}

// Tasks, splits and the dq partials as in bwd_flash; dK and dV accumulate in f32 scratch of whole tiles.
void bwd_flash_amx(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, const bf16* out,
                   const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  using Ops = Avx512Bf16ProbsOps;
  ops::check_attention_shape(s, "attention_bwd_flash_amx");
  const int64_t D = s.D, S = s.S, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D, nt = tiles(S);
  const int64_t Sp = nt * kTile, groups = s.B * s.Hkv;
  const DqSplits dq_splits(s, groups, nt);
  const int64_t per_group = dq_splits.tasks_per_group(), kstep = dq_splits.stride();
#pragma omp parallel if (worth_threads(s))
  {
    std::vector<bf16> kc(Sp * D), vc(Sp * D), kt(D * Sp), pb(kTile * kTile), dsb(kTile * kTile);
    std::vector<uint32_t> qp(D / 2 * kTile), dop(D / 2 * kTile), qpair(kTile / 2 * D), dopair(kTile / 2 * D),
        dspair(kTile / 2 * kTile);
    std::vector<float> dk_acc(Sp * D), dv_acc(Sp * D), dqt(dq_splits.tiles() * D * kTile), st(kTile * kTile),
        dpt(kTile * kTile), lse_t(kTile), di_t(kTile), row(D);
    amx_begin();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < groups * per_group; ++task) {
      const int64_t t = task % per_group, b = task / per_group / s.Hkv, g = task / per_group % s.Hkv;
      const int64_t kvoff = b * S * ldk + g * D;
      copy_rows_padded(k + kvoff, ldk, S, Sp, D, kc.data());
      copy_rows_padded(v + kvoff, ldk, S, Sp, D, vc.data());
      transpose_rows_padded(k + kvoff, ldk, S, Sp, D, kt.data());
      for (int64_t ktile = t; ktile < nt; ktile += kstep) {
        std::fill(dk_acc.begin() + ktile * kTile * D, dk_acc.begin() + (ktile + 1) * kTile * D, 0.f);
        std::fill(dv_acc.begin() + ktile * kTile * D, dv_acc.begin() + (ktile + 1) * kTile * D, 0.f);
      }
      for (int64_t h = g * r; h < (g + 1) * r; ++h)
        for (int64_t qtile = t; qtile < nt; ++qtile) {
          const int64_t q0 = qtile * kTile, qn = std::min(kTile, S - q0), qoff = (b * S + q0) * ldq + h * D;
          // Query-side operands: pairs along D (B of S^T and dP^T), pairs along queries (B of dK and dV);
          // padding queries are zero rows, so their P and dS meet zeros.
          pack_pairs(q + qoff, ldq, qn, D, qp.data());
          pack_pairs(dout + qoff, ldq, qn, D, dop.data());
          Ops::pack_row_pairs(q + qoff, ldq, qn, kTile / 2, D, qpair.data());
          Ops::pack_row_pairs(dout + qoff, ldq, qn, kTile / 2, D, dopair.data());
          for (int64_t i = 0; i < kTile; ++i) {
            lse_t[i] = 0.f;
            di_t[i] = 0.f;
            if (i >= qn) continue;
            lse_t[i] = lse[(b * s.Hq + h) * S + q0 + i];
            const bf16* doi = dout + qoff + i * ldq;
            const bf16* oi = out + qoff + i * ldq;
            float acc = 0.f;
            for (int64_t d = 0; d < D; ++d) acc += bf16_to_f32(doi[d]) * bf16_to_f32(oi[d]);
            di_t[i] = acc;
          }
          for (int64_t ktile = t; ktile <= qtile; ktile += kstep) {
            // dQ^T: a split's first kv tile (ktile < count) writes its tile, the later ones add to it.
            float* dqk = dq_splits.tile_of(dqt.data(), ktile, D);
            const bool dq_add = ktile >= dq_splits.count();
            const int64_t k0 = ktile * kTile, kn = std::min(kTile, S - k0), kp = (kn + 1) / 2;
            amx_gemm(kTile, kTile, D, kc.data() + k0 * D, D, qp.data(), kTile, st.data(), kTile,
                     false);  // S^T
            amx_gemm(kTile, kTile, D, vc.data() + k0 * D, D, dop.data(), kTile, dpt.data(), kTile,
                     false);  // dP^T
            Ops::probs_grad(st.data(), dpt.data(), kn, s.scale, q0 - k0, lse_t.data(), di_t.data());
            // Rows of pb / dsb past kn (padding keys) keep an earlier tile's values: they only reach dK / dV
            // rows past S, which are never stored; the dQ^T product reads dS in pairs, zeroed past kn.
            Ops::round_rows(st.data(), kn, pb.data());
            Ops::round_rows(dpt.data(), kn, dsb.data());
            Ops::pair_rows(dpt.data(), kn, dspair.data());
            std::fill(dspair.begin() + kp * kTile, dspair.end(), 0u);
            amx_gemm(kTile, D, kTile, pb.data(), kTile, dopair.data(), D, dv_acc.data() + k0 * D, D,
                     true);  // dV += P^T dO
            amx_gemm(kTile, D, kTile, dsb.data(), kTile, qpair.data(), D, dk_acc.data() + k0 * D, D,
                     true);  // dK += dS^T Q
            amx_gemm(D, kTile, kTile, kt.data() + k0, Sp, dspair.data(), kTile, dqk, kTile,
                     dq_add);  // dQ^T += K^T dS^T
          }
          dq_splits.store_tile(dqt.data(), qn, qtile, D, ldq, qoff, t, dq, row.data());
        }
      for (int64_t ktile = t; ktile < nt; ktile += kstep)
        for (int64_t j = ktile * kTile; j < std::min(S, (ktile + 1) * kTile); ++j) {
          store_row(dk + kvoff + j * ldk, dk_acc.data() + j * D, D);
          store_row(dv + kvoff + j * ldk, dv_acc.data() + j * D, D);
        }
    }
    amx_end();
    dq_splits.sum_into(dq, D, row.data());
  }
}

}  // namespace

void attention_fwd_flash_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                             float* out, float* lse) {
  switch (kernel_isa()) {
    case KernelIsa::kPortable:
      return fwd_flash<PortableOps>(s, q, k, v, out, lse);
    case KernelIsa::kAvx2:
      return fwd_flash<Avx2Ops>(s, q, k, v, out, lse);
    case KernelIsa::kAvx512:
    case KernelIsa::kAvx512Bf16:  // the bf16 dot product has nothing to do on f32 tensors
    case KernelIsa::kAmx:
      return fwd_flash<Avx512Ops>(s, q, k, v, out, lse);
  }
}
void attention_bwd_flash_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, const float* dout, float* dq, float* dk,
                             float* dv) {
  switch (kernel_isa()) {
    case KernelIsa::kPortable:
      return bwd_flash<PortableOps>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAvx2:
      return bwd_flash<Avx2Ops>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAvx512:
    case KernelIsa::kAvx512Bf16:
    case KernelIsa::kAmx:
      return bwd_flash<Avx512Ops>(s, q, k, v, out, lse, dout, dq, dk, dv);
  }
}
void attention_fwd_flash_bf16(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                              float* lse) {
  switch (kernel_isa()) {
    case KernelIsa::kPortable:
      return fwd_flash<PortableOps>(s, q, k, v, out, lse);
    case KernelIsa::kAvx2:
      return fwd_flash<Avx2Ops>(s, q, k, v, out, lse);
    case KernelIsa::kAvx512:
      return fwd_flash<Avx512Ops>(s, q, k, v, out, lse);
    case KernelIsa::kAvx512Bf16:
      return fwd_flash<Avx512Bf16Ops>(s, q, k, v, out, lse);
    case KernelIsa::kAmx:
      return fwd_flash<AmxDotOps>(s, q, k, v, out, lse);
  }
}
void attention_bwd_flash_bf16(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                              bf16* dv) {
  switch (kernel_isa()) {
    case KernelIsa::kPortable:
      return bwd_flash<PortableOps>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAvx2:
      return bwd_flash<Avx2Ops>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAvx512:
      return bwd_flash<Avx512Ops>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAvx512Bf16:
      return bwd_flash<Avx512Bf16Ops>(s, q, k, v, out, lse, dout, dq, dk, dv);
    case KernelIsa::kAmx:
      return bwd_flash<AmxDotOps>(s, q, k, v, out, lse, dout, dq, dk, dv);
  }
}

bool attention_bf16_probs_available() {
  return cpu_kernel_isa() >= KernelIsa::kAvx512Bf16;
}
void attention_fwd_flash_bf16_probs(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                                    float* lse) {
  if (kernel_isa() < KernelIsa::kAvx512Bf16) return attention_fwd_flash_bf16(s, q, k, v, out, lse);
  if (kernel_isa() == KernelIsa::kAmx && amx_attention_applies(s)) return fwd_flash_amx(s, q, k, v, out, lse);
  fwd_flash<Avx512Bf16ProbsOps>(s, q, k, v, out, lse);
}
void attention_bwd_flash_bf16_probs(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v,
                                    const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk,
                                    bf16* dv) {
  if (kernel_isa() < KernelIsa::kAvx512Bf16)
    return attention_bwd_flash_bf16(s, q, k, v, out, lse, dout, dq, dk, dv);
  if (kernel_isa() == KernelIsa::kAmx && amx_attention_applies(s))
    return bwd_flash_amx(s, q, k, v, out, lse, dout, dq, dk, dv);
  bwd_flash<Avx512Bf16ProbsOps>(s, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace titan::cpu

namespace titan::ops {
namespace {

// The bf16 backward kernels take bf16 dout and return bf16 gradients (as a bf16 autograd would): the
// f32 upstream gradient is rounded once and the results widened.
using Bf16Backward = void (*)(const AttentionShape&, const bf16*, const bf16*, const bf16*, const bf16*,
                              const float*, const bf16*, bf16*, bf16*, bf16*);
template <Bf16Backward kKernel>
void bwd_bf16_via(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                  const void* v, const void* out, const void* lse, const void* dout, void* dq, void* dk,
                  void* dv) {
  // Activation-sized: from the allocator, so the run's memory figures include them.
  const size_t nq = s.q_numel(), nkv = s.kv_numel();
  const Scratch dout16(ctx, nq * 2), dq16(ctx, nq * 2), dk16(ctx, nkv * 2), dv16(ctx, nkv * 2);
  convert_f32_to_bf16(static_cast<const float*>(dout), dout16.as<bf16>(), nq);
  kKernel(s, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
          static_cast<const bf16*>(out), static_cast<const float*>(lse), dout16.as<bf16>(), dq16.as<bf16>(),
          dk16.as<bf16>(), dv16.as<bf16>());
  convert_bf16_to_f32(dq16.as<bf16>(), static_cast<float*>(dq), nq);
  convert_bf16_to_f32(dk16.as<bf16>(), static_cast<float*>(dk), nkv);
  convert_bf16_to_f32(dv16.as<bf16>(), static_cast<float*>(dv), nkv);
}

const bool registered = kernels::register_kernels(
    "attention", Device::CPU,
    {{DType::F32, "default", "flash tiles, online softmax, AVX-512 or AVX2 when available, OpenMP",
      AttentionKernel{attention_forward_entry<float, float, cpu::attention_fwd_flash_f32>,
                      attention_backward_entry<float, float, cpu::attention_bwd_flash_f32>}},
     {DType::BF16, "default",
      "flash tiles, bf16 in/out, f32 math, AVX-512 or AVX2 when available (q.k and dout.v on AVX512-BF16 "
      "or AMX tiles), OpenMP",
      AttentionKernel{attention_forward_entry<bf16, float, cpu::attention_fwd_flash_bf16>,
                      bwd_bf16_via<cpu::attention_bwd_flash_bf16>}},
     {DType::BF16, "bf16_probs",
      "flash tiles with P and dS rounded to bf16: every product on AMX tiles (head_dim % 32 == 0) or "
      "AVX512-BF16 (backward: head_dim % 64 == 0, else f32 products there)",
      AttentionKernel{attention_forward_entry<bf16, float, cpu::attention_fwd_flash_bf16_probs>,
                      bwd_bf16_via<cpu::attention_bwd_flash_bf16_probs>},
      [] { return cpu::attention_bf16_probs_available() ? std::string() : "needs AVX512-BF16"; }}});

}  // namespace
}  // namespace titan::ops

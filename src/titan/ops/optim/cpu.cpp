// Fast optimizer kernels (see ops/optim/optim.h). Both passes are memory-bound streams over the flat
// buffers: AdamW moves 28 bytes per parameter (reads p, g, m, v; writes p, m, v; 30 with a bf16
// compute copy), the gradient norm reads 4. They are threaded over contiguous chunks with OpenMP and
// vectorised with AVX-512 or AVX2 + FMA, whichever the host has (cpu_info.h: kernel_isa), else a portable
// loop. The AdamW kernels round exactly like the reference (same operations, same fused multiply-adds), so
// every variant and tier is bit-identical to it.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/lanes.h"
#include "titan/core/dtype.h"
#include "titan/kernels/registry.h"
#include "titan/ops/optim/optim.h"

namespace titan::cpu {

namespace {

using ops::AdamWKernel;
using ops::AdamWScalars;
using ops::GradNormKernel;

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t(1) << 15;
// With a compute copy, the parameters are updated in runs of this many elements, each rounded into
// the copy right after its update, while it is in L1 (16 KiB of f32).
constexpr int64_t kCopyRun = 4096;
static_assert(size_t(kCopyRun) < kBulkConvertThreadsMin,
              "a run's conversion must not open a parallel region");
// Gradient-norm partial sums are taken over fixed blocks and added in block order, so the result is
// independent of the number of threads.
constexpr int64_t kNormBlock = int64_t(1) << 16;


// Splits [0, n) into one contiguous range per thread, boundaries on 64-byte lines (16 floats).
template <class F>
void parallel_chunks(int64_t n, F&& body) {
#pragma omp parallel if (n >= kParallelMin)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
    const int64_t begin = std::min(n, t * per), end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
  }
}

struct AdamWConsts {
  float decay, b1, omb1, b2, omb2, neg_lr, bc2, eps, scale, l2;
  explicit AdamWConsts(const AdamWScalars& s)
      : decay(float(s.decay)),
        b1(float(s.beta1)),
        omb1(float(s.one_minus_beta1)),
        b2(float(s.beta2)),
        omb2(float(s.one_minus_beta2)),
        neg_lr(float(s.neg_step_size)),
        bc2(float(s.bias_correction2_sqrt)),
        eps(float(s.eps)),
        scale(float(s.grad_scale)),
        l2(float(s.l2)) {}
};

void adamw_portable_range(int64_t begin, int64_t end, float* p, const float* g, float* m, float* v,
                          const AdamWConsts& c) {
  for (int64_t i = begin; i < end; ++i) {
    float gi = g[i] * c.scale;
    if (c.l2 != 0) gi = std::fma(p[i], c.l2, gi);  // Adam's L2 term (a uniform branch)
    float pi = p[i] * c.decay;
    float mi = std::fma(gi, c.omb1, m[i] * c.b1);
    float vi = std::fma(c.omb2 * gi, gi, v[i] * c.b2);
    float denom = std::sqrt(vi) / c.bc2 + c.eps;
    p[i] = pi + (c.neg_lr * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double norm_portable_block(const float* g, int64_t n) {
  // Eight independent accumulators let the compiler vectorise without reassociating one sum.
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(g[i + k]) * double(g[i + k]);
  for (; i < n; ++i) acc[0] += double(g[i]) * double(g[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// GCC 12's AVX-512 headers build results from _mm512_undefined_ps() (`__m512 __Y = __Y;`), which
// trips -Wuninitialized at every inlined intrinsic; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TITAN_AVX512 __attribute__((target("avx512f,avx512dq,fma,avx2")))

TITAN_AVX512 inline void adamw16(float* p, const float* g, float* m, float* v, __mmask16 k,
                                 const AdamWConsts& c) {
  // The clip factor, rounded on its own like the separate in-place scaling it replaces.
  __m512 gv = _mm512_mul_round_ps(_mm512_maskz_loadu_ps(k, g), _mm512_set1_ps(c.scale),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 pv = _mm512_maskz_loadu_ps(k, p), mv = _mm512_maskz_loadu_ps(k, m), vv = _mm512_maskz_loadu_ps(k, v);
  if (c.l2 != 0) gv = _mm512_fmadd_ps(pv, _mm512_set1_ps(c.l2), gv);  // Adam's L2 term
  // Rounded on its own, as torch's separate mul_: GCC would fuse a plain mul with the final add.
  pv = _mm512_mul_round_ps(pv, _mm512_set1_ps(c.decay), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  mv = _mm512_fmadd_ps(gv, _mm512_set1_ps(c.omb1), _mm512_mul_ps(mv, _mm512_set1_ps(c.b1)));
  vv =
      _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(c.omb2), gv), gv, _mm512_mul_ps(vv, _mm512_set1_ps(c.b2)));
  const __m512 denom =
      _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), _mm512_set1_ps(c.bc2)), _mm512_set1_ps(c.eps));
  pv = _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(c.neg_lr), mv), denom));
  _mm512_mask_storeu_ps(p, k, pv);
  _mm512_mask_storeu_ps(m, k, mv);
  _mm512_mask_storeu_ps(v, k, vv);
}

TITAN_AVX512 void adamw_avx512_range(int64_t begin, int64_t end, float* p, const float* g, float* m, float* v,
                                     const AdamWConsts& c) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) adamw16(p + i, g + i, m + i, v + i, __mmask16(0xFFFF), c);
  if (i < end) adamw16(p + i, g + i, m + i, v + i, __mmask16((1u << (end - i)) - 1), c);
}

TITAN_AVX512 inline __m512d square_add(__m256 x, __m512d acc) {
  const __m512d d = _mm512_cvtps_pd(x);
  return _mm512_fmadd_pd(d, d, acc);  // the product is exact in f64, so fusing changes nothing
}

TITAN_AVX512 double norm_avx512_block(const float* g, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 x = _mm512_loadu_ps(g + i), y = _mm512_loadu_ps(g + i + 16);
    a0 = square_add(_mm512_castps512_ps256(x), a0);
    a1 = square_add(_mm512_extractf32x8_ps(x, 1), a1);
    a2 = square_add(_mm512_castps512_ps256(y), a2);
    a3 = square_add(_mm512_extractf32x8_ps(y, 1), a3);
  }
  for (; i < n; i += 16) {
    const int64_t left = std::min<int64_t>(16, n - i);
    const __m512 x = _mm512_maskz_loadu_ps(__mmask16((1u << left) - 1), g + i);
    a0 = square_add(_mm512_castps512_ps256(x), a0);
    a1 = square_add(_mm512_extractf32x8_ps(x, 1), a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}

#undef TITAN_AVX512
#pragma GCC diagnostic pop

// The same on 8 lanes of AVX2 + FMA. Contraction is off so that GCC keeps every product rounded on
// its own (AVX2 has no mul with explicit rounding to pin it); the fused multiply-adds are explicit.
#define TITAN_AVX2 __attribute__((target("avx2,fma"), optimize("fp-contract=off")))

// kTail: only the lanes of `k` are read and written (maskload/maskstore, which are slow on AMD, so
// full vectors use plain loads and stores).
template <bool kTail>
TITAN_AVX2 inline void adamw8(float* p, const float* g, float* m, float* v, __m256i k, const AdamWConsts& c) {
  const auto load = [k](const float* x) { return kTail ? _mm256_maskload_ps(x, k) : _mm256_loadu_ps(x); };
  const auto store = [k](float* x, __m256 y) {
    if (kTail)
      _mm256_maskstore_ps(x, k, y);
    else
      _mm256_storeu_ps(x, y);
  };
  __m256 gv = _mm256_mul_ps(load(g), _mm256_set1_ps(c.scale));
  __m256 pv = load(p), mv = load(m), vv = load(v);
  if (c.l2 != 0) gv = _mm256_fmadd_ps(pv, _mm256_set1_ps(c.l2), gv);  // Adam's L2 term
  pv = _mm256_mul_ps(pv, _mm256_set1_ps(c.decay));
  mv = _mm256_fmadd_ps(gv, _mm256_set1_ps(c.omb1), _mm256_mul_ps(mv, _mm256_set1_ps(c.b1)));
  vv = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(c.omb2), gv), gv, _mm256_mul_ps(vv, _mm256_set1_ps(c.b2)));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), _mm256_set1_ps(c.bc2)), _mm256_set1_ps(c.eps));
  pv = _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c.neg_lr), mv), denom));
  store(p, pv);
  store(m, mv);
  store(v, vv);
}

TITAN_AVX2 void adamw_avx2_range(int64_t begin, int64_t end, float* p, const float* g, float* m, float* v,
                                 const AdamWConsts& c) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) adamw8<false>(p + i, g + i, m + i, v + i, __m256i{}, c);
  if (i < end) adamw8<true>(p + i, g + i, m + i, v + i, lanes::lanes_below8(end - i), c);
}

TITAN_AVX2 inline __m256d square_add(__m128 x, __m256d acc) {
  const __m256d d = _mm256_cvtps_pd(x);
  return _mm256_fmadd_pd(d, d, acc);  // the product is exact in f64, so fusing changes nothing
}

TITAN_AVX2 double norm_avx2_block(const float* g, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(g + i + 8);
    a0 = square_add(_mm256_castps256_ps128(x), a0);
    a1 = square_add(_mm256_extractf128_ps(x, 1), a1);
    a2 = square_add(_mm256_castps256_ps128(y), a2);
    a3 = square_add(_mm256_extractf128_ps(y, 1), a3);
  }
  for (; i < n; i += 8) {
    const __m256 x = _mm256_maskload_ps(g + i, lanes::lanes_below8(n - i));
    a0 = square_add(_mm256_castps256_ps128(x), a0);
    a1 = square_add(_mm256_extractf128_ps(x, 1), a1);
  }
  const __m256d sum = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(sum), _mm256_extractf128_pd(sum, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

#undef TITAN_AVX2

// The "default" variants take the best tier of kernel_isa(); "portable" always the plain loop.
template <bool Vectorised>
void adamw_f32(const KernelContext& ctx, int64_t n, void* pv, const void* gv, void* mv, void* vv,
               uint16_t* copy, const AdamWScalars& s) {
  const AdamWConsts c(s);
  float* p = static_cast<float*>(pv);
  const float* g = static_cast<const float*>(gv);
  float *m = static_cast<float*>(mv), *v = static_cast<float*>(vv);
  const KernelIsa isa = Vectorised ? kernel_isa() : KernelIsa::kPortable;
  const auto update = isa >= KernelIsa::kAvx512 ? adamw_avx512_range
                      : isa >= KernelIsa::kAvx2 ? adamw_avx2_range
                                                : adamw_portable_range;
  parallel_chunks(n, [&](int64_t begin, int64_t end) {
    if (!copy) return update(begin, end, p, g, m, v, c);
    for (int64_t run = begin; run < end; run += kCopyRun) {
      const int64_t run_end = std::min(end, run + kCopyRun);
      update(run, run_end, p, g, m, v, c);
      // The rounding of ops::cast (core/dtype.h), so the copy is what a cast would give.
      convert_f32_to_bf16(p + run, reinterpret_cast<bf16*>(copy + run), size_t(run_end - run));
    }
  });
}

template <bool Vectorised>
void grad_norm_f32(const KernelContext& ctx, int64_t n, const void* gv, double* total) {
  const float* g = static_cast<const float*>(gv);
  const KernelIsa isa = Vectorised ? kernel_isa() : KernelIsa::kPortable;
  const auto block_sum = isa >= KernelIsa::kAvx512 ? norm_avx512_block
                         : isa >= KernelIsa::kAvx2 ? norm_avx2_block
                                                   : norm_portable_block;
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNormBlock, len = std::min(kNormBlock, n - begin);
    partial[size_t(b)] = block_sum(g + begin, len);
  }
  double sum = 0;
  for (double x : partial) sum += x;
  *total += sum;
}

const bool adamw_kernels_registered = kernels::register_kernels(
    "adamw", Device::CPU,
    {{DType::F32, "default", "fused single pass, AVX-512 or AVX2 (portable loop without them), OpenMP",
      AdamWKernel{adamw_f32<true>}},
     {DType::F32, "portable", "fused single pass, scalar loop, OpenMP", AdamWKernel{adamw_f32<false>}}});
const bool grad_norm_kernels_registered = kernels::register_kernels(
    "grad_norm", Device::CPU,
    {{DType::F32, "default",
      "f64 sums over 64Ki blocks in block order, AVX-512 or AVX2 (portable loop without them), OpenMP",
      GradNormKernel{grad_norm_f32<true>}},
     {DType::F32, "portable", "f64 sums over 64Ki blocks in block order, scalar loop, OpenMP",
      GradNormKernel{grad_norm_f32<false>}}});

}  // namespace

}  // namespace titan::cpu

// Fast CPU rms_norm. Rows are split among OpenMP threads; each row is read twice while it sits in
// L1 (sum of squares, then scale), i.e. one pass over memory, so the default is already the fused
// kernel. The row loops are plain `omp simd` loops compiled three times with target_clones (AVX-512,
// AVX2 + FMA, baseline x86-64) and picked at load time. bf16 rounding is the integer round-to-nearest-even
// of titan::f32_to_bf16, written branch-free so it vectorises; it is bit-identical to it.
// Numerics vs reference: the sums are reassociated (16 lanes), so rstd and the f32 outputs differ in
// the last bits; bf16 outputs agree except for rare 1-ulp flips. dw adds its rows in chunks fixed by
// the shape, so every result has the same bits on any number of threads.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "titan/backend/cpu/lanes.h"
#include "titan/core/dtype.h"
#include "titan/kernels/registry.h"
#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::cpu {

namespace {

using namespace lanes;
// The value the element type holds after storing v (the cast transformers does before the weight).
inline float as_elem(float, float v) {
  return v;
}
inline float as_elem(uint16_t, float v) {
  return ld(round_bf16(v));
}

template <class T>
[[gnu::always_inline]] inline void forward_rows_impl(int64_t r0, int64_t r1, int64_t D, float eps, const T* x,
                                                     const T* w, T* y, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t d = 0; d < D; ++d) ss += ld(xr[d]) * ld(xr[d]);
    const float rs = 1.0f / std::sqrt(ss / float(D) + eps);
    rstd[r] = rs;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) st(yr + d, ld(w[d]) * as_elem(T{}, ld(xr[d]) * rs));
  }
}

// dx for rows [r0, r1) and their contribution added into dw_acc (either may be null).
template <class T>
[[gnu::always_inline]] inline void backward_rows_impl(int64_t r0, int64_t r1, int64_t D, const T* x,
                                                      const T* w, const float* rstd, const float* dy,
                                                      float* dx, float* dw_acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    const float* g = dy + r * D;
    const float rs = rstd[r];
    if (dx) {
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += g[d] * ld(w[d]) * (ld(xr[d]) * rs);
      const float mean = dot / float(D);
      float* dxr = dx + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dxr[d] = rs * (g[d] * ld(w[d]) - ld(xr[d]) * rs * mean);
    }
    if (dw_acc) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dw_acc[d] += g[d] * as_elem(T{}, ld(xr[d]) * rs);
    }
  }
}

TITAN_CLONES void forward_rows(int64_t r0, int64_t r1, int64_t D, float eps, const float* x, const float* w,
                               float* y, float* rstd) {
  forward_rows_impl(r0, r1, D, eps, x, w, y, rstd);
}
TITAN_CLONES void forward_rows(int64_t r0, int64_t r1, int64_t D, float eps, const uint16_t* x,
                               const uint16_t* w, uint16_t* y, float* rstd) {
  forward_rows_impl(r0, r1, D, eps, x, w, y, rstd);
}
TITAN_CLONES void backward_rows(int64_t r0, int64_t r1, int64_t D, const float* x, const float* w,
                                const float* rstd, const float* dy, float* dx, float* dw) {
  backward_rows_impl(r0, r1, D, x, w, rstd, dy, dx, dw);
}
TITAN_CLONES void backward_rows(int64_t r0, int64_t r1, int64_t D, const uint16_t* x, const uint16_t* w,
                                const float* rstd, const float* dy, float* dx, float* dw) {
  backward_rows_impl(r0, r1, D, x, w, rstd, dy, dx, dw);
}

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelElems = 16384;
// Columns of dw a thread adds up at a time (1 KiB of each partial, its sum kept in L1).
constexpr int64_t kColumns = 256;

template <class T>
void rms_norm_forward(const KernelContext& ctx, int64_t R, int64_t D, double eps, const void* x, const void* w, void* y, void* rstd) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  T* yt = static_cast<T*>(y);
  float* rs = static_cast<float*>(rstd);
#pragma omp parallel if (R * D > kParallelElems)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    forward_rows(R * t / nt, R * (t + 1) / nt, D, float(eps), xt, wt, yt, rs);
  }
}

// The chunks of rows whose dw partials the backward adds: a function of the shape alone, never of
// the thread count, so that dw's bits are not either. At most 64 (work for 64 threads), each of at
// least 16 rows and kParallelElems elements: the partials (D floats a chunk, zeroed and added up
// once) stay under 1/16 of the rows' elements.
int64_t dw_chunks(int64_t R, int64_t D) {
  const int64_t min_rows = std::max<int64_t>(16, (kParallelElems + D - 1) / D);
  return std::clamp<int64_t>(R / min_rows, 1, 64);
}

// Each chunk is a contiguous block of rows with a dw partial of its own, whichever thread runs it;
// then dw[d] = the partials added in chunk order, blocks of kColumns columns split among the threads.
template <class T>
void rms_norm_backward(const KernelContext& ctx, int64_t R, int64_t D, const void* x, const void* w, const void* rstd, const void* dy,
                       void* dx, void* dw) {
  const int64_t chunks = dw_chunks(R, D);
  std::vector<float> partial(dw ? size_t(chunks) * size_t(D) : 0, 0.0f);
  float* out = static_cast<float*>(dw);
#pragma omp parallel if (R * D > kParallelElems)
  {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      backward_rows(R * c / chunks, R * (c + 1) / chunks, D, static_cast<const T*>(x),
                    static_cast<const T*>(w), static_cast<const float*>(rstd), static_cast<const float*>(dy),
                    static_cast<float*>(dx), dw ? partial.data() + size_t(c) * size_t(D) : nullptr);
    if (out) {
#pragma omp for schedule(static) nowait
      for (int64_t d0 = 0; d0 < D; d0 += kColumns) {  // chunk by chunk: independent vector adds
        const int64_t n = std::min(kColumns, D - d0);
        std::copy_n(partial.data() + d0, n, out + d0);
        for (int64_t c = 1; c < chunks; ++c) {
          const float* p = partial.data() + size_t(c) * size_t(D) + size_t(d0);
          for (int64_t d = 0; d < n; ++d) out[d0 + d] += p[d];
        }
      }
    }
  }
}

const bool registered = kernels::register_kernels(
    "rms_norm", Device::CPU,
    {{DType::F32, "default", "fused stats+scale per row, OpenMP rows, AVX-512 or baseline SIMD",
      ops::RmsNormKernel{rms_norm_forward<float>, rms_norm_backward<float>}},
     {DType::BF16, "default", "fused stats+scale per row in f32, OpenMP rows, AVX-512 or baseline SIMD",
      ops::RmsNormKernel{rms_norm_forward<uint16_t>, rms_norm_backward<uint16_t>}}});

}  // namespace

}  // namespace titan::cpu

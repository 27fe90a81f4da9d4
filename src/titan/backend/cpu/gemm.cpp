#include "titan/backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include <dnnl.hpp>
#include <immintrin.h>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/check.h"

namespace titan::cpu {
namespace {

const char* trans_name(Trans t) { return t == Trans::N ? "N" : "T"; }

// BLAS argument rules; the message names the function, the value and what it had to be. A matrix
// with no elements (M, N or K zero) is never read: its leading dimension may be anything >= 0, so
// tight strides of empty operands (lda = K = 0) pass.
void check_args(const char* fn, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                int64_t ldc) {
  TITAN_CHECK(M >= 0 && N >= 0 && K >= 0, fn, ": sizes must be >= 0, got M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0 || K == 0) {
    TITAN_CHECK(lda >= 0 && ldb >= 0 && ldc >= 0, fn, ": leading dimensions must be >= 0, got lda=", lda,
                " ldb=", ldb, " ldc=", ldc);
    if (M == 0 || N == 0) return;  // C is empty: nothing is read or written
    // K == 0: C = beta * C, so C's rule stands.
    TITAN_CHECK(ldc >= N, fn, ": ldc=", ldc, " is less than the row length N=", N, " of C");
    return;
  }
  int64_t a_row = ta == Trans::N ? K : M, b_row = tb == Trans::N ? N : K;
  TITAN_CHECK(lda >= std::max<int64_t>(1, a_row), fn, ": lda=", lda, " is less than the row length ", a_row,
              " of A (", ta == Trans::N ? "[M,K]" : "stored [K,M] for Trans::T", ", M=", M, " K=", K, ")");
  TITAN_CHECK(ldb >= std::max<int64_t>(1, b_row), fn, ": ldb=", ldb, " is less than the row length ", b_row,
              " of B (", tb == Trans::N ? "[K,N]" : "stored [N,K] for Trans::T", ", K=", K, " N=", N, ")");
  TITAN_CHECK(ldc >= std::max<int64_t>(1, N), fn, ": ldc=", ldc, " is less than the row length N=", N, " of C");
}

// A batched call: the BLAS rules for each matrix, then the batch's.
void check_batch(const char* fn, Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t stride_a, int64_t ldb, int64_t stride_b, int64_t ldc, int64_t stride_c) {
  check_args(fn, ta, tb, M, N, K, lda, ldb, ldc);
  TITAN_CHECK(batch >= 0, fn, ": batch must be >= 0, got ", batch);
  TITAN_CHECK(stride_a >= 0 && stride_b >= 0, fn, ": stride_a=", stride_a, " stride_b=", stride_b,
              " must be >= 0");
  if (batch > 1 && M > 0 && N > 0)
    TITAN_CHECK(stride_c >= (M - 1) * ldc + N, fn, ": stride_c=", stride_c, " makes output matrices overlap (",
                "needs >= (M-1)*ldc+N = ", (M - 1) * ldc + N, ")");
}

// C = beta * C over an [M,N] block; beta == 0 writes zeros so NaN in C does not survive.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

// ---- f32 backend choice --------------------------------------------------------------------------

F32Backend backend_from_env() {
  const char* env = std::getenv("TITAN_GEMM_F32");
  if (!env || !*env) return F32Backend::OneDNN;
  std::string_view v(env);
  if (v == "onednn") return F32Backend::OneDNN;
  if (v == "openblas") return F32Backend::OpenBLAS;
  TITAN_FAIL("TITAN_GEMM_F32=", v, " is not a gemm backend (use onednn or openblas)");
}

std::atomic<F32Backend>& f32_backend_slot() {
  static std::atomic<F32Backend> slot{backend_from_env()};
  return slot;
}

// The vector ISA an OpenBLAS core's kernels need, from its name (openblas_get_corename()).
enum class OpenBlasCoreIsa { kGeneric, kAvx2Fma, kAvx512 };
OpenBlasCoreIsa openblas_core_isa(std::string_view core) {
  auto has = [&](const char* part) { return core.find(part) != std::string_view::npos; };
  if (has("kylakeX") || has("ooperlake") || has("apphire")) return OpenBlasCoreIsa::kAvx512;
  if (has("aswell") || has("Zen") || has("kylake")) return OpenBlasCoreIsa::kAvx2Fma;
  return OpenBlasCoreIsa::kGeneric;
}

}  // namespace

std::string openblas_core_unrunnable(std::string_view core, const CpuInfo& cpu) {
  const OpenBlasCoreIsa needs = openblas_core_isa(core);
  if (needs == OpenBlasCoreIsa::kAvx512 && !cpu.avx512_core())
    return "its '" + std::string(core) + "' kernels need AVX-512, which this CPU lacks";
  if (needs == OpenBlasCoreIsa::kAvx2Fma && !(cpu.avx2 && cpu.fma))
    return "its '" + std::string(core) + "' kernels need AVX2 and FMA, which this CPU lacks";
  return "";
}

namespace {

// OpenBLAS chose its kernels when it was loaded (from OPENBLAS_CORETYPE, or its own detection): what
// is left to do here is to align its thread count with OpenMP's, to stop before kernels this CPU
// cannot run (an OPENBLAS_CORETYPE naming a newer CPU: the process would die of SIGILL), and to say
// so when the choice is a slow generic core on an AVX-512 CPU.
void prepare_openblas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string_view core = openblas_get_corename();
    const std::string why = openblas_core_unrunnable(core, cpu_info());
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    TITAN_CHECK(why.empty(), "gemm_f32 (OpenBLAS): ", why,
                coretype ? " (OPENBLAS_CORETYPE=" + std::string(coretype) + ")" : std::string(),
                "; the process would stop with SIGILL: unset OPENBLAS_CORETYPE or name a core this CPU runs");
    openblas_set_num_threads(omp_get_max_threads());
    if (cpu_info().avx512f && openblas_core_isa(core) == OpenBlasCoreIsa::kGeneric)
      std::fprintf(stderr,
                   "titan: OpenBLAS runs its '%s' kernels on an AVX-512 CPU (about 7x slower); start the "
                   "process with OPENBLAS_CORETYPE=COOPERLAKE\n",
                   openblas_get_corename());
  });
}

void sgemm_openblas(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t v : {M, N, K, lda, ldb, ldc})
    TITAN_CHECK(v <= INT_MAX, "gemm_f32 (OpenBLAS): dimension ", v, " does not fit OpenBLAS's 32-bit ints");
  prepare_openblas();
  cblas_sgemm(CblasRowMajor, ta == Trans::N ? CblasNoTrans : CblasTrans, tb == Trans::N ? CblasNoTrans : CblasTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// ---- A^T products as A products on AVX2 CPUs -----------------------------------------------------
// oneDNN 2.6's AVX2 sgemm (the f32 code it runs on CPUs without AVX-512) computes C = A^T op(B) at
// half the speed it computes the same product with A stored [M, K] when C has at most 256 columns:
// on AMD Zen3, TN M=3072 K=1024 ran at 35-37 % of peak for N = 64..256 and at 70-79 % for N = 288
// and wider, and NN at 50-68 % for N <= 256. That is the weight gradient dW = dY^T X of every
// linear layer whose input has 256 features (the debug model's) and the fused loss's dW chunks.
// For those products A^T is copied into [rows, K] f32 panels (bf16 widened on the way, where the
// bf16 GEMM widens anyway) and each panel runs as an NN product; wider ones keep oneDNN's A^T code,
// which is 5-8 % faster there. Measurements: docs/performance.md, "Matrix multiply" (matmul_bench's
// f32_onednn_own_at times the other choice). AVX-512 CPUs keep oneDNN's own A^T code: on an Intel
// Xeon (model 167) it ran narrow A^T products at half speed only when A's rows were a multiple of
// 4 KiB apart, and rows 64 bytes longer beat the panels there (the fused loss pads its dlogits rows:
// ops/cross_entropy/cpu.cpp); matmul_bench's f32_onednn_panels times the panels on such a CPU.
bool transpose_a_first(int64_t N) { return N <= 256 && kernel_isa() == KernelIsa::kAvx2; }

inline __attribute__((target("avx2"))) __m256 load8_f32(const float* x) { return _mm256_loadu_ps(x); }
inline __attribute__((target("avx2"))) __m256 load8_f32(const bf16* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_f32(x); }

// dst[c * ldd + r] = src[r * ld + c] for an 8 x 8 tile, in registers.
template <class S>
__attribute__((target("avx2"))) void transpose8x8_avx2(const S* src, int64_t ld, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = load8_f32(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// dst[c * rows + r] = src[r * ld + c] (as f32) over a rows x cols block, in 32 x 32 tiles (larger ones
// lose to cache-set conflicts at power-of-two strides), the tile rows split between the threads.
// Only AVX2 CPUs call it (transpose_a_first).
template <class S>
void transpose_to_f32(int64_t rows, int64_t cols, const S* src, int64_t ld, float* dst) {
  constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      int64_t r = r0;
      for (; r + 8 <= r1; r += 8) {
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8) transpose8x8_avx2(src + r * ld + c, ld, dst + c * rows + r, rows);
        for (; c < c1; ++c)
          for (int64_t i = r; i < r + 8; ++i) dst[c * rows + i] = to_f32(src[i * ld + c]);
      }
      for (; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = to_f32(src[r * ld + c]);
    }
  }
}

// C = alpha * A^T op(B) + beta * C with A stored [K, M] (f32 or bf16): panels of at most 2M f32
// elements (8 MiB, the calling thread's buffer, reused call after call) of A^T, each an NN product
// (op(B) f32).
template <class S>
void gemm_at_by_panels(Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const S* A, int64_t lda,
                       const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  constexpr int64_t kPanelElems = int64_t(1) << 21;
  const int64_t rows = std::min(M, std::max<int64_t>(8, kPanelElems / K / 8 * 8));
  thread_local std::vector<float> panel;
  panel.resize(size_t(rows * K));
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t mp = std::min(rows, M - m0);
    transpose_to_f32(K, mp, A + m0, lda, panel.data());
    gemm_f32(Trans::N, tb, mp, N, K, alpha, panel.data(), K, B, ldb, beta, C + m0 * ldc, ldc);
  }
}

// oneDNN 2.6 treats AVX2 as AVX2 + FMA: on a CPU with AVX2 but no FMA (a VM that hides FMA) its
// AVX2 code dies of SIGILL. There its ISA is capped at AVX before its first call, unless the user
// capped it already (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA).
void prepare_onednn() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (onednn_needs_avx_cap(cpu_info()) && !std::getenv("ONEDNN_MAX_CPU_ISA") &&
        !std::getenv("DNNL_MAX_CPU_ISA"))
      dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx);
  });
}

void sgemm_onednn(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  prepare_onednn();
  if (ta == Trans::T && transpose_a_first(N))
    return gemm_at_by_panels(tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  dnnl_status_t st = dnnl_sgemm(ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T', M, N, K, alpha, A, lda, B,
                                ldb, beta, C, ldc);
  TITAN_CHECK(st == dnnl_success, "gemm_f32: dnnl_sgemm failed (status ", int(st), ") for ", trans_name(ta),
              trans_name(tb), " M=", M, " N=", N, " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

// ---- oneDNN matmul primitives, cached per shape and layout ---------------------------------------

using dnnl::memory;

struct Problem {
  memory::data_type in_dt, out_dt;
  Trans ta, tb;
  int64_t batch, M, N, K;
  int64_t lda, stride_a, ldb, stride_b, ldc, stride_c;
  float alpha, beta;
  // One primitive for every M, N, K with these layouts (oneDNN run-time dimensions); see
  // runtime_dims_here().
  bool runtime_dims = false;
};

struct Prim {
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, scratch_md;  // with run-time dimensions: built per call
  bool runtime_dims = false;
  std::string impl;
  // oneDNN has only its plain C++ code for this problem (orders of magnitude slower than JIT code)
  // or no implementation at all ("none"): the callers compute it another way.
  bool reference = false;
};

dnnl::engine& engine() {
  static dnnl::engine eng = [] {
    prepare_onednn();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return eng;
}

// op(X) as a [batch,] rows x cols matrix view of storage with row stride ld. A zero batch stride
// broadcasts: the batch dim becomes 1 and oneDNN reuses the matrix.
memory::desc view_md(memory::data_type dt, Trans t, int64_t batch, int64_t stride, int64_t rows, int64_t cols,
                     int64_t ld) {
  int64_t rs = t == Trans::N ? ld : 1, cs = t == Trans::N ? 1 : ld;
  if (batch == 1) return memory::desc({rows, cols}, dt, {rs, cs});
  int64_t b = stride == 0 ? 1 : batch;
  int64_t bs = stride == 0 ? (t == Trans::N ? rows * ld : cols * ld) : stride;
  return memory::desc({b, rows, cols}, dt, {bs, rs, cs});
}

memory::desc c_view_md(const Problem& p, int64_t M, int64_t N) {
  return p.batch == 1 ? memory::desc({M, N}, p.out_dt, {p.ldc, 1})
                      : memory::desc({p.batch, M, N}, p.out_dt, {p.stride_c, p.ldc, 1});
}

// GEMMs issued from inside an OpenMP parallel region run one per thread (moe_experts: one expert
// per thread, row counts that change with the routing every step). A primitive per exact shape would
// JIT-compile hundreds of new kernels per step (measured: ~0.25 ms each, ~10% of a debugmodel_moe
// step); there, one primitive per layout with run-time M, N, K (oneDNN's gemm:jit, as fast as the
// per-shape brgemm kernel on one thread at these sizes) serves every shape. Any enclosing parallel
// region counts, a team of one thread included (OMP_NUM_THREADS=1, as MPI ranks run): the same
// kernel then runs whatever the thread count, and so do its results.
bool runtime_dims_here(int64_t batch) {
  return batch == 1 && omp_get_level() > 0;
}

std::shared_ptr<const Prim> get_prim(const Problem& p) {
  using Key = std::array<int64_t, 17>;
  const int64_t M = p.runtime_dims ? 0 : p.M, N = p.runtime_dims ? 0 : p.N, K = p.runtime_dims ? 0 : p.K;
  Key key{int64_t(p.in_dt), int64_t(p.out_dt), int64_t(p.ta), int64_t(p.tb), p.batch, M, N, K,
          p.lda, p.stride_a, p.ldb, p.stride_b, p.ldc, p.stride_c, std::bit_cast<int32_t>(p.alpha),
          std::bit_cast<int32_t>(p.beta), int64_t(p.runtime_dims)};
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Prim>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // Shapes in training are few (layers repeat); the bound only protects against shape churn.
  if (cache.size() >= 1024) cache.clear();

  auto prim = std::make_shared<Prim>();
  prim->runtime_dims = p.runtime_dims;
  try {
    const int64_t rm = p.runtime_dims ? DNNL_RUNTIME_DIM_VAL : p.M, rn = p.runtime_dims ? DNNL_RUNTIME_DIM_VAL : p.N,
                  rk = p.runtime_dims ? DNNL_RUNTIME_DIM_VAL : p.K;
    prim->a_md = view_md(p.in_dt, p.ta, p.batch, p.stride_a, rm, rk, p.lda);
    prim->b_md = view_md(p.in_dt, p.tb, p.batch, p.stride_b, rk, rn, p.ldb);
    prim->c_md = c_view_md(p, rm, rn);
    dnnl::primitive_attr attr;
    // The caller supplies the scratchpad (per thread, see run_prim): oneDNN's own is one global
    // buffer, which two threads running primitives at once (the MoE experts do) would share.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
    if (p.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(p.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(prim->a_md, prim->b_md, prim->c_md), attr, engine());
    prim->impl = pd.impl_info_str();
    prim->scratch_md = pd.scratchpad_desc();
    prim->reference = prim->impl.rfind("ref", 0) == 0;
    prim->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    // A CPU without AVX512-BF16 or AMX (AVX2 only, e.g. AMD Zen3) may have no bf16 matmul
    // implementation at all, not even the reference one: the callers then widen to f32, as they
    // do for reference code.
    if (e.status == dnnl_unimplemented) {
      prim->impl = "none";
      prim->reference = true;
      cache.emplace(key, prim);
      return prim;
    }
    TITAN_FAIL("gemm: oneDNN cannot build a matmul for ", trans_name(p.ta), trans_name(p.tb), " batch=", p.batch,
               " M=", p.M, " N=", p.N, " K=", p.K, " lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc, ": ", e.what());
  }
  cache.emplace(key, prim);
  return prim;
}

void run_prim(const Prim& prim, const Problem& p, const void* A, const void* B, void* C) {
  // Streams are cheap; one per thread keeps concurrent callers independent.
  thread_local dnnl::stream stream(engine());
  thread_local std::vector<std::byte> scratchpad;
  if (scratchpad.size() < prim.scratch_md.get_size()) scratchpad.resize(prim.scratch_md.get_size());
  const bool rt = prim.runtime_dims;
  memory a(rt ? view_md(p.in_dt, p.ta, p.batch, p.stride_a, p.M, p.K, p.lda) : prim.a_md, engine(),
           const_cast<void*>(A));
  memory b(rt ? view_md(p.in_dt, p.tb, p.batch, p.stride_b, p.K, p.N, p.ldb) : prim.b_md, engine(),
           const_cast<void*>(B));
  memory c(rt ? c_view_md(p, p.M, p.N) : prim.c_md, engine(), C);
  memory sp(prim.scratch_md, engine(), scratchpad.data());
  prim.prim.execute(stream,
                    {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, sp}});
  stream.wait();
}

// ---- f32 fallback for bf16 where oneDNN has no fast bf16 code ------------------------------------

// Widens the stored rows x cols block of X (row stride ld) into `out`, dense, rows split between the
// threads (the GEMM that follows waits for it anyway). The buffers are the calling thread's, reused
// call after call (a training step makes thousands of these calls).
const float* widen(const bf16* X, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  out.resize(size_t(rows * cols));
  float* o = out.data();
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r) convert_bf16_to_f32(X + r * ld, o + r * cols, size_t(cols));
  return o;
}

// A thread keeps no more than 64 MiB per widening buffer between calls (a 0.6B model's output
// projection alone would keep 622 MB).
void trim(std::vector<float>& buf) {
  constexpr size_t kKeep = size_t(16) << 20;
  if (buf.capacity() > kKeep) std::vector<float>().swap(buf);
}

void gemm_bf16_via_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                       int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  thread_local std::vector<float> a_f32, b_f32;
  int64_t a_rows = ta == Trans::N ? M : K, a_cols = ta == Trans::N ? K : M;
  int64_t b_rows = tb == Trans::N ? K : N, b_cols = tb == Trans::N ? N : K;
  const float* b = widen(B, b_rows, b_cols, ldb, b_f32);
  if (ta == Trans::T && transpose_a_first(N)) {
    gemm_at_by_panels(tb, M, N, K, alpha, A, lda, b, b_cols, beta, C, ldc);  // A widened panel by panel
  } else {
    const float* a = widen(A, a_rows, a_cols, lda, a_f32);
    gemm_f32(ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc);
  }
  trim(a_f32);
  trim(b_f32);
}

}  // namespace

F32Backend gemm_f32_backend() { return f32_backend_slot().load(); }
void set_gemm_f32_backend(F32Backend backend) { f32_backend_slot().store(backend); }

namespace {
// oneDNN's bf16 matmul where the CPU's bf16 arithmetic outruns its f32 FMA (AMX; AVX512-BF16 on
// AMD Zen4, VDPBF16PS at twice the FMA rate), else the inputs widened to f32 for the f32 GEMM: on
// Intel's AVX512-BF16 without AMX VDPBF16PS runs at half the FMA rate, and oneDNN's bf16 kernels
// there (brg:avx512_core_bf16) reached 130-145 GFLOP/s on 2 cores where the widened path reached
// 200-245 (matmul_bench, Intel Xeon model 0xcf); on AVX2-only CPUs oneDNN has no bf16 code at all.
// TITAN_GEMM_BF16=onednn|widen overrides.
Bf16Backend bf16_backend_from_env() {
  const char* env = std::getenv("TITAN_GEMM_BF16");
  if (!env || !*env) return cpu_info().bf16_dot_beats_fma ? Bf16Backend::OneDNN : Bf16Backend::WidenToF32;
  std::string_view v(env);
  if (v == "onednn") return Bf16Backend::OneDNN;
  if (v == "widen") return Bf16Backend::WidenToF32;
  TITAN_FAIL("TITAN_GEMM_BF16=", v, " is not a bf16 gemm path (use onednn or widen)");
}

std::atomic<Bf16Backend>& bf16_backend_slot() {
  static std::atomic<Bf16Backend> slot{bf16_backend_from_env()};
  return slot;
}

// The oneDNN primitive for a bf16 problem, or null when the f32 widening runs instead (chosen, or
// oneDNN has no fast bf16 code for it).
std::shared_ptr<const Prim> bf16_prim(const Problem& p) {
  if (bf16_backend_slot().load() == Bf16Backend::WidenToF32) return nullptr;
  auto prim = get_prim(p);
  return prim->reference ? nullptr : prim;
}
}  // namespace

Bf16Backend gemm_bf16_backend() { return bf16_backend_slot().load(); }
void set_gemm_bf16_backend(Bf16Backend backend) { bf16_backend_slot().store(backend); }

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_args("gemm_f32", ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) return scale_c(M, N, beta, C, ldc);
  if (gemm_f32_backend() == F32Backend::OpenBLAS) {
    sgemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    sgemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

void gemm_f32_batched(Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                      float beta, float* C, int64_t ldc, int64_t stride_c) {
  check_batch("gemm_f32_batched", ta, tb, batch, M, N, K, lda, stride_a, ldb, stride_b, ldc, stride_c);
  if (batch == 0 || M == 0 || N == 0) return;
  auto one_by_one = [&] {
    for (int64_t i = 0; i < batch; ++i)
      gemm_f32(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
  };
  // One batched primitive parallelises across matrices, which matters when each one is small.
  if (batch == 1 || K == 0 || alpha == 0.0f || gemm_f32_backend() == F32Backend::OpenBLAS) return one_by_one();
  const Problem p{memory::data_type::f32, memory::data_type::f32, ta, tb, batch, M, N, K, lda, stride_a, ldb,
                  stride_b, ldc, stride_c, alpha, beta};
  auto prim = get_prim(p);
  if (prim->reference) return one_by_one();
  run_prim(*prim, p, A, B, C);
}

void gemm_bf16_batched(Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16* A, int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb, int64_t stride_b,
                       float beta, float* C, int64_t ldc, int64_t stride_c) {
  check_batch("gemm_bf16", ta, tb, batch, M, N, K, lda, stride_a, ldb, stride_b, ldc, stride_c);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    for (int64_t i = 0; i < batch; ++i) scale_c(M, N, beta, C + i * stride_c, ldc);
    return;
  }
  const Problem p{memory::data_type::bf16, memory::data_type::f32, ta, tb, batch, M, N, K, lda, stride_a, ldb,
                  stride_b, ldc, stride_c, alpha, beta, runtime_dims_here(batch)};
  if (auto prim = bf16_prim(p)) return run_prim(*prim, p, A, B, C);
  for (int64_t i = 0; i < batch; ++i)
    gemm_bf16_via_f32(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c,
                      ldc);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16_batched(ta, tb, 1, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0);
}

void gemm_bf16_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                   const bf16* B, int64_t ldb, bf16* C, int64_t ldc) {
  check_args("gemm_bf16_out", ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, bf16{0});
    return;
  }
  const Problem p{memory::data_type::bf16, memory::data_type::bf16, ta, tb, 1, M, N, K, lda, 0, ldb, 0, ldc,
                  0, alpha, 0.0f, runtime_dims_here(1)};
  if (auto prim = bf16_prim(p)) return run_prim(*prim, p, A, B, C);
  thread_local std::vector<float> c_f32;
  c_f32.resize(size_t(M * N));
  float* c = c_f32.data();
  gemm_bf16_via_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, c, N);
#pragma omp parallel for schedule(static) if (M * N >= (int64_t(1) << 16))
  for (int64_t i = 0; i < M; ++i) convert_f32_to_bf16(c + i * N, C + i * ldc, size_t(N));
  trim(c_f32);
}

namespace {
template <class T, class Acc>
void reference_loops(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                     const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      Acc acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        Acc a = ta == Trans::N ? A[i * lda + k] : A[k * lda + i];
        Acc b = tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k];
        acc += a * b;
      }
      T& c = C[i * ldc + j];
      c = beta == T(0) ? T(Acc(alpha) * acc) : T(Acc(alpha) * acc + Acc(beta) * Acc(c));
    }
  }
}
}  // namespace

void gemm_f64_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                        int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  check_args("gemm_f64_reference", ta, tb, M, N, K, lda, ldb, ldc);
  reference_loops<double, double>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_f32_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_args("gemm_f32_reference", ta, tb, M, N, K, lda, ldb, ldc);
  reference_loops<float, double>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool onednn_needs_avx_cap(const CpuInfo& cpu) {
  return cpu.avx2 && !cpu.fma;
}

std::string onednn_isa_name(int isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx512_mic:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    default:
      return isa == 0 ? "none (reference code only)" : "0x" + [&] {
        char hex[16];
        std::snprintf(hex, sizeof hex, "%x", unsigned(isa));
        return std::string(hex);
      }();
  }
}

namespace {
// oneDNN's bf16 primitive for a representative shape: what it would run here.
std::shared_ptr<const Prim> sample_bf16_prim() {
  return get_prim({memory::data_type::bf16, memory::data_type::f32, Trans::N, Trans::N, 1, 256, 256, 256, 256,
                   0, 256, 0, 256, 0, 1.0f, 0.0f});
}
}  // namespace

std::string gemm_bf16_widen_reason() {
  prepare_onednn();
  const auto bf = sample_bf16_prim();
  const std::string onednn_lacks =
      "oneDNN has " + std::string(bf->impl == "none" ? "no" : "only reference") + " bf16 code here";
  if (gemm_bf16_backend() == Bf16Backend::OneDNN) return bf->reference ? onednn_lacks : "";
  const char* env = std::getenv("TITAN_GEMM_BF16");
  if (env && *env) return "TITAN_GEMM_BF16=" + std::string(env);
  if (cpu_info().bf16_dot_beats_fma) return "chosen by set_gemm_bf16_backend";
  if (bf->reference) return onednn_lacks;
  return "this CPU's bf16 dot product is no faster than its f32 FMA; oneDNN's would run " + bf->impl;
}

std::string gemm_describe() {
  prepare_onednn();
  std::string f32 = gemm_f32_backend() == F32Backend::OpenBLAS
                        ? std::string("OpenBLAS cblas_sgemm (") + openblas_get_corename() + " kernels)"
                        : std::string("oneDNN dnnl_sgemm");
  const std::string widen = gemm_bf16_widen_reason();
  const std::string bf16 =
      widen.empty() ? "oneDNN matmul " + sample_bf16_prim()->impl : "widened to f32 (" + widen + ")";
  return "f32 " + f32 + "; bf16 " + bf16 + "; oneDNN ISA " + onednn_isa_name(dnnl_get_effective_cpu_isa());
}

}  // namespace titan::cpu

#pragma once
// CPU matrix multiply: the hot path of training. Raw pointers, row-major, BLAS-style explicit
// leading dimensions:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C
// op(A) = A (Trans::N, A stored [M,K] with row stride lda >= K) or A^T (Trans::T, A stored [K,M],
// lda >= M); likewise B ([K,N], ldb >= N, or [N,K], ldb >= K); C is [M,N] with ldc >= N.
// beta == 0 means C is write-only (NaN or garbage in it is overwritten, never multiplied).
// K == 0 or alpha == 0 leave C = beta * C without reading A or B; M == 0 or N == 0 is a no-op.
// C must not overlap A or B. Bad arguments throw titan::Error naming the rule broken.
//
// Backends, chosen at run time (see docs/performance.md "Matrix multiply" for the measurements):
//   f32 : oneDNN dnnl_sgemm (default) or OpenBLAS cblas_sgemm (TITAN_GEMM_F32=openblas). OpenBLAS
//         0.3.21 picks its kernels when the library loads, from OPENBLAS_CORETYPE or its own CPU
//         detection, which calls Sapphire Rapids "Prescott" (7x slower): set
//         OPENBLAS_CORETYPE=COOPERLAKE (or SKYLAKEX) in the environment before starting the process.
//   bf16: oneDNN matmul primitive (AMX, AVX512_BF16 or AVX-512 code picked by oneDNN), primitives
//         cached per shape/layout key, where the CPU's bf16 arithmetic outruns its f32 FMA (AMX,
//         AMD Zen4's AVX512-BF16). Elsewhere the inputs are widened to f32 and the f32 backend
//         runs: Intel's AVX512-BF16 without AMX (VDPBF16PS at half the FMA rate: 1.3-1.7x faster
//         widened), CPUs where oneDNN has only reference bf16 code or none (AVX2-only, AMD Zen3).
//         TITAN_GEMM_BF16=onednn|widen overrides.
//   A^T:  on CPUs whose best kernel tier is AVX2 (cpu::kernel_isa), a product with Trans::T on A
//         and N <= 256 runs as Trans::N products over panels of A copied transposed (and widened
//         from bf16): oneDNN's AVX2 sgemm is about 2x slower on A^T than on A there.
// Threads: the OpenMP thread count (omp_get_max_threads / OMP_NUM_THREADS). Called from inside an
// OpenMP parallel region (one GEMM per thread, as moe_experts does), a GEMM runs on the calling
// thread alone; bf16 calls there (a team of one thread included) use one oneDNN primitive per layout
// with run-time M, N, K, so shapes that change call after call never JIT-compile new kernels, and
// the results do not depend on the team's size. Concurrent calls are safe:
// every thread has its own oneDNN stream and scratchpad.
#include <cstdint>
#include <string>
#include <string_view>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/dtype.h"

namespace titan::cpu {

enum class Trans : uint8_t { N, T };

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// bf16 inputs, f32 accumulation, f32 output (beta allowed).
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// bf16 inputs, f32 accumulation, C = alpha * op(A) @ op(B) rounded to bf16 (no beta: C is write-only).
void gemm_bf16_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, bf16* C, int64_t ldc);

// Strided batches: matrix b of A starts at A + b * stride_a (likewise B, C). stride_a or stride_b
// may be 0 to use one matrix for every batch (e.g. shared weights); stride_c must separate the
// outputs. Used by attention (batch = heads) and MoE.
void gemm_f32_batched(Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                      int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);
void gemm_bf16_batched(Trans ta, Trans tb, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16* A, int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb,
                       int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);

// Plain triple loops, single-threaded, for tests and gradient checks. The f32 one accumulates each
// dot product in f64 and rounds once, so it is a tighter truth than any blocked f32 kernel.
void gemm_f64_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                        int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);
void gemm_f32_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// f32 backend selection. The default comes from TITAN_GEMM_F32 ("onednn" or "openblas"; unset
// means oneDNN, the faster one on the machines measured). Not meant to be flipped while gemms run.
enum class F32Backend : uint8_t { OneDNN, OpenBLAS };
F32Backend gemm_f32_backend();
void set_gemm_f32_backend(F32Backend backend);

// bf16 backend selection. OneDNN: oneDNN's bf16 matmul (itself widening where oneDNN has no fast
// bf16 code); WidenToF32: inputs widened to f32 for the f32 backend. The default comes from
// TITAN_GEMM_BF16 ("onednn" or "widen"), else from the CPU: OneDNN where its bf16 arithmetic is
// faster than its f32 FMA (cpu_info().bf16_dot_beats_fma: AMX, AMD's AVX512-BF16), WidenToF32
// elsewhere (Intel's AVX512-BF16 without AMX, AVX2). Tests set either on any CPU. Not meant to be
// flipped while gemms run.
enum class Bf16Backend : uint8_t { OneDNN, WidenToF32 };
Bf16Backend gemm_bf16_backend();
void set_gemm_bf16_backend(Bf16Backend backend);

// One line naming the code that runs for each dtype (oneDNN implementation, OpenBLAS core type,
// oneDNN's ISA), for the start-up log and benchmark context.
std::string gemm_describe();
// Why bf16 GEMMs run as f32 GEMMs on widened inputs here (TITAN_GEMM_BF16, the CPU's bf16
// arithmetic, oneDNN lacking bf16 code), or "" when oneDNN's bf16 matmul runs.
std::string gemm_bf16_widen_reason();

// Why OpenBLAS's kernels for `core` (openblas_get_corename()) cannot run on `cpu`, or "" when they
// can: OPENBLAS_CORETYPE=SKYLAKEX on a CPU without AVX-512 would die of SIGILL in the first sgemm.
std::string openblas_core_unrunnable(std::string_view core, const CpuInfo& cpu);
// oneDNN 2.6's AVX2 code also uses FMA: on a CPU with AVX2 and no FMA it must be capped at AVX.
bool onednn_needs_avx_cap(const CpuInfo& cpu);
// oneDNN's name of a dnnl_cpu_isa_t value ("avx2", "avx512_core_amx").
std::string onednn_isa_name(int isa);

}  // namespace titan::cpu

#pragma once
// GEMMs on the GPU through cuBLASLt, row-major like backend/cpu/gemm.h:
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]     for b < batch
// op(A) is [M, K] (A stored [M, K], or [K, M] when trans_a), op(B) is [K, N] (B stored [K, N], or
// [N, K] when trans_b); lda/ldb/ldc are row strides in elements; stride_a/b/c the element offsets
// between batch entries. Accumulation is always f32:
//   - F32 operands: exact f32 (CUBLAS_COMPUTE_32F, TF32 off), so results match the CPU GEMMs to
//     f32 summation-order differences;
//   - BF16 operands: bf16 tensor cores, f32 accumulate; C is F32 or BF16 (rounded once at the end).
// Everything runs on the compute stream (cuda_services.h); a plan (descriptors + the heuristic's
// algorithm) is cached per shape, strides, dtypes and operand alignment, so a training step asks
// the heuristic once per distinct GEMM. Workspace comes from cuda::workspace().
#include <cstdint>

#include "titan/core/dtype.h"

namespace titan::cuda {

struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// ab: the dtype of A and B (F32 or BF16); c: the dtype of C (F32, or BF16 with BF16 operands).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, DType ab, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, DType c, void* C, int64_t ldc,
          const GemmBatch& batch = {}, void* stream = nullptr);

}  // namespace titan::cuda

// cuBLASLt GEMMs (see gemm.h). cuBLAS is column-major: a row-major [r, c] matrix with row stride ld
// is the column-major [c, r] matrix with the same ld, so the row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T: B becomes cuBLAS's first operand and A its second.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/backend/cuda/gemm.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::cuda {
namespace {

// Hopper's cuBLASLt kernels want up to 32 MiB of workspace for split-K and stream-K plans (the
// meta device's plan of a CUDA step counts the same constant).
constexpr size_t kWorkspaceBytes = kCudaGemmWorkspaceBytes;

void check_cublas(cublasStatus_t st, const char* what) {
  TITAN_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed: ", cublasLtGetStatusName(st), " (",
              cublasLtGetStatusString(st), ")");
}

cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t created;
    check_cublas(cublasLtCreate(&created), "cublasLtCreate");
    return created;
  }();
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: TITAN_FAIL("cuda gemm: unsupported dtype ", dtype_name(t), " (f32 and bf16 only)");
  }
}

// The largest power of two (up to 256) dividing the address: cuBLASLt's kernels need aligned
// operands, and a plan picked for aligned pointers must not be reused for a misaligned view.
int alignment(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % al) al >>= 1;
  return al;
}

struct Key {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc, count, sa, sb, sc;
  DType ab, c;
  bool beta_zero;
  int al_a, al_b, al_c;
  auto tie() const { return std::tie(ta, tb, M, N, K, lda, ldb, ldc, count, sa, sb, sc, ab, c, beta_zero, al_a, al_b, al_c); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS operands (a = our B)
  cublasLtMatmulAlgo_t algo{};
};

cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
  cublasLtMatrixLayout_t l;
  check_cublas(cublasLtMatrixLayoutCreate(&l, cuda_type(t), uint64_t(rows), uint64_t(cols), ld), "layout");
  if (count > 1) {
    int32_t n = int32_t(count);
    check_cublas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n), "batch");
    check_cublas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof stride),
                 "batch stride");
  }
  return l;
}

Plan make_plan(const Key& k) {
  Plan p;
  // Column-major problem: m = N, n = M; first operand = our B, second = our A.
  const int64_t m = k.N, n = k.M, kk = k.K;
  check_cublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t op_first = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first), "transa");
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second), "transb");
  // Stored shapes (column-major rows x cols): first operand m x k (or k x m when transposed).
  p.a = k.tb ? layout(k.ab, kk, m, k.ldb, k.count, k.sb) : layout(k.ab, m, kk, k.ldb, k.count, k.sb);
  p.b = k.ta ? layout(k.ab, n, kk, k.lda, k.count, k.sa) : layout(k.ab, kk, n, k.lda, k.count, k.sa);
  p.c = layout(k.c, m, n, k.ldc, k.count, k.sc);

  cublasLtMatmulPreference_t pref;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "preference");
  uint64_t ws = kWorkspaceBytes;
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "ws");
  uint32_t al_first = uint32_t(k.al_b), al_second = uint32_t(k.al_a), al_c = uint32_t(k.al_c);
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, 4), "al");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, 4), "al");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, 4), "al");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, 4), "al");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  auto ask = [&] { return cublasLtMatmulAlgoGetHeuristic(handle(), p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found); };
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (k.c == DType::BF16) {
    // A split-K algorithm reducing in place or in the output type would round the bf16 output once
    // per partial sum; the op's contract (and its reference) rounds the f32 sum once. Only the
    // schemes reducing in f32 are allowed, unless no algorithm is left then.
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                      sizeof schemes),
                 "reduction schemes");
    st = ask();
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      schemes = CUBLASLT_REDUCTION_SCHEME_MASK;
      check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                        sizeof schemes),
                   "reduction schemes");
      st = ask();
    }
  } else {
    st = ask();
  }
  cublasLtMatmulPreferenceDestroy(pref);
  TITAN_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS, "cuda gemm: cuBLASLt has no algorithm for M=", k.M, " N=", k.N,
              " K=", k.K, " (", dtype_name(k.ab), " -> ", dtype_name(k.c), ", trans_a=", k.ta, ", trans_b=", k.tb,
              ", batch ", k.count, "): ", cublasLtGetStatusName(st));
  p.algo = result.algo;
  return p;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, DType ab, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, DType c, void* C, int64_t ldc, const GemmBatch& batch,
          void* stream) {
  TITAN_CHECK(ab == DType::F32 || ab == DType::BF16, "cuda gemm: operands must be f32 or bf16, got ", dtype_name(ab));
  TITAN_CHECK(c == DType::F32 || (c == DType::BF16 && ab == DType::BF16), "cuda gemm: output ", dtype_name(c),
              " with ", dtype_name(ab), " operands is not supported");
  TITAN_CHECK(M >= 0 && N >= 0 && K >= 0 && batch.count >= 1, "cuda gemm: bad sizes M=", M, " N=", N, " K=", K,
              " batch=", batch.count);
  if (M == 0 || N == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream ? stream : compute_stream());
  if (K == 0) {  // C = beta * C: cuBLASLt rejects k = 0
    TITAN_CHECK(beta == 0.f, "cuda gemm: K = 0 with beta != 0 is not supported");
    const size_t es = dtype_size(c);
    for (int64_t b = 0; b < batch.count; ++b)
      TITAN_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(C) + b * batch.stride_c * es, ldc * es, 0, N * es, M, s));
    return;
  }
  // Every matrix of a batch must have the alignment the plan is picked for, not only the first.
  auto aligned = [&](const void* p, int64_t stride, DType t) {
    const int al = alignment(p);
    if (batch.count == 1 || stride == 0) return al;
    return std::min(al, alignment(reinterpret_cast<const void*>(uintptr_t(stride) * dtype_size(t))));
  };
  const Key key{trans_a, trans_b, M, N, K, lda, ldb, ldc, batch.count, batch.stride_a, batch.stride_b, batch.stride_c,
                ab, c, beta == 0.f, aligned(A, batch.stride_a, ab), aligned(B, batch.stride_b, ab),
                aligned(C, batch.stride_c, c)};
  static std::mutex mutex;
  static std::map<Key, Plan> plans;
  Plan plan;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(key)).first;
    plan = it->second;
  }
  void* ws = workspace(kWorkspaceBytes);
  check_cublas(cublasLtMatmul(handle(), plan.desc, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c,
                              &plan.algo, ws, kWorkspaceBytes, s),
               "matmul");
}

}  // namespace titan::cuda

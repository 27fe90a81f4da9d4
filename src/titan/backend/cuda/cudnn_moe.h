#pragma once
// Grouped expert GEMMs through cuDNN's MoE grouped matmul (cuDNN 9.18 and later, built as a backend
// graph with cudnn_graph.h): each expert's rows times that expert's weight,
//   out[r, :] = tokens[r, :] @ W[e]^T      for first[e] <= r < first[e + 1]   (first[E] = rows)
// tokens [rows, K] bf16 (row-major); weights [E, N, K] bf16 (each expert's [N, K] row-major: the
// nn.Linear layout, the one cuDNN's engines take); first int32 [E] on the device (read there: no
// host synchronisation); out [rows, N] with row stride ldc, bf16 (rounded once) or f32, f32
// accumulation. Queued on `stream`. Plans are built once per shape and kept for the process.
#include <cstdint>
#include <string>

#include "titan/core/dtype.h"

namespace titan::cuda {

struct GroupedMatmulShape {
  int64_t rows, K, N, E, ldc;
  DType out;  // BF16 or F32
};

// Empty when cuDNN 9.18 or later is loaded, else why not. (cudnn_frontend emits the operation from
// 9.15, its samples need 9.18: the later one is asked for.)
std::string cudnn_grouped_matmul_unavailable();
// Empty when the grouped matmul takes this shape (K, N and ldc multiples of 8, so every row starts
// 16-byte aligned; rows below 2^31; bf16 or f32 out), else why not. Reads no library.
std::string cudnn_grouped_matmul_unsupported(const GroupedMatmulShape& s);

void cudnn_grouped_matmul(void* stream, const GroupedMatmulShape& s, const void* tokens, const void* weights,
                          const int32_t* first, void* out);

// Builds (and keeps) the plan of this shape: empty when one builds, else cuDNN's reason. For the
// callers that have another kernel to run when cuDNN has no engine for a shape (and say so).
std::string cudnn_grouped_matmul_plan_error(const GroupedMatmulShape& s);

// How many grouped matmuls this process has run through cuDNN (tests check the variant used it).
int64_t cudnn_grouped_matmul_calls();

// How many of cuDNN's engine configurations take this grouped matmul on the GPU `device_json`
// describes (cudnn::deviceless_engine_count): the check of the graph on machines without a GPU.
int64_t cudnn_grouped_matmul_engine_count(const GroupedMatmulShape& s, const std::string& device_json);

}  // namespace titan::cuda

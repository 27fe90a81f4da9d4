#pragma once
// Causal grouped-query flash attention through cuDNN 9's fused attention engines ("SDPA"), built
// as a cuDNN backend graph (cudnn_graph.h) with no cudnn_frontend: the "cudnn" variant of the
// attention op on CUDA (ops/attention/cuda.cu), measured against our own kernels by
// bench/cuda_attention_bench.cpp and bench/gpu_models.sh.
//
// Layout as the op's (ops/attention/attention.h), described to cuDNN by strides, so nothing is
// transposed or copied:
//   q, out, dout, dq: [B, S, Hq, D] bf16      k, v, dk, dv: [B, S, Hkv, D] bf16
//   lse: [B, Hq, S] f32, the natural-log logsumexp of each query row's scaled scores (cuDNN's
//   softmax "stats"; the same quantity the CPU and our CUDA kernels keep).
// Query head h reads kv head h / (Hq / Hkv); query i attends to keys 0..i; scores are scaled by
// `scale`. Everything is queued on `stream`; no host synchronisation.
//
// cuDNN is loaded on first use (backend/cuda/cudnn_graph.h). Each distinct shape builds its
// execution plans once (cuDNN's heuristics, possibly a runtime compile) and keeps them for the
// process.
#include <cstdint>
#include <string>

namespace titan::cuda {

struct SdpaShape {
  int64_t B, S, Hq, Hkv, D;
  float scale;
};

// Empty when cuDNN's fused attention engines take this shape (head_dim a multiple of 8 up to 128,
// Hq a multiple of Hkv), else why not. Whether cuDNN itself loads is the calls' business: they
// throw naming the missing library, never fall back silently.
std::string cudnn_attention_unsupported(const SdpaShape& s);
// Empty when cuDNN loads and is not a release its fused attention is known to be broken in (9.10.0,
// 9.10.1, which cudnn_frontend refuses), else why not: what a job that would take the "cudnn"
// attention by default checks first.
std::string cudnn_attention_unavailable();

// Writes out and lse.
void cudnn_attention_forward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                             void* out, float* lse);
// Overwrites dq, dk and dv (bf16; for fewer kv heads than query heads cuDNN sums each group).
void cudnn_attention_backward(void* stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, const void* dout, void* dq, void* dk,
                              void* dv);

// How many of cuDNN's engine configurations pass their support checks for the forward or backward
// graph of this shape (the graphs the calls above run) on the GPU that `device_json` describes:
// cuDNN's serialized device properties (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, cuDNN 9.8 and
// later). Asks cuDNN's heuristics without a GPU, so machines without one can check the graphs;
// cuDNN's runtime-compiled engines still want a loadable libcuda.so.1 (tests give them a stand-in).
int64_t cudnn_attention_engine_count(const SdpaShape& s, bool backward, const std::string& device_json);

}  // namespace titan::cuda

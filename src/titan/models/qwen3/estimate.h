#pragma once
// Analytic training memory estimate for `titan info --flavor/--model-path` (no job config); a
// job's own figure comes from the meta-device step profile (train/step_profile.h).
#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/checkpointing.h"

namespace titan::qwen3 {

struct MemoryEstimate {
  int64_t weights = 0;      // f32 master weights
  int64_t grads = 0;        // f32 gradients
  int64_t optimizer = 0;    // AdamW exp_avg + exp_avg_sq, f32
  int64_t activations = 0;  // tensors saved for backward at (batch, seq)
  int64_t total() const { return weights + grads + optimizer + activations; }
};

// Activations per layer per token (elements of the compute dtype), as the decoder saves them:
//   attention: normed input D, q/k/v projections (Hq + 2 Hkv) hd, normed and rotated q/k (Hq + Hkv) hd,
//              attention output Hq hd (+ f32 logsumexp per head), residual D
//   MLP:       normed input D, gate and up F each, their SwiGLU F            (dense)
//   MoE:       normed input D, router logits E (+ f32 probs E), top_k copies of (3 F + D)   (sparse)
// plus the fused loss' hidden D per token. A layer that activation checkpointing covers keeps only
// its input; then one covered layer's worth is live again while its backward recomputes it.
MemoryEstimate estimate_training_memory(const ModelArgs& args, int64_t batch, int64_t seq, DType compute,
                                        Checkpointing checkpointing);

}  // namespace titan::qwen3

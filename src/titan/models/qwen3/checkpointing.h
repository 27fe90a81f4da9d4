#pragma once
// Activation checkpointing: which layers keep only their input in forward and recompute the rest
// in backward (less memory, one more forward of those layers; the step's result is unchanged).

#include <cstdint>
#include <string>

#include "titan/core/check.h"

namespace titan::qwen3 {

struct Checkpointing {
  // 0: no layer; 1: every layer ("full"); n: every n-th layer ("selective", torchtitan's
  // selective_ac_option). Layer i (from 0) is covered when (i + 1) % every == 0, torchtitan's count.
  int64_t every = 0;

  static Checkpointing none() { return {0}; }
  static Checkpointing full() { return {1}; }
  static Checkpointing every_nth(int64_t n) {
    TITAN_CHECK(n >= 1, "activation checkpointing: one layer in ", n, " (n must be at least 1)");
    return {n};
  }

  bool covers(int64_t layer) const { return every > 0 && (layer + 1) % every == 0; }
  bool any() const { return every > 0; }
  bool operator==(const Checkpointing&) const = default;
  // For logs: "none", "full (every layer)", "selective (1 layer in 3)".
  std::string describe() const {
    return every == 0   ? "none"
           : every == 1 ? "full (every layer)"
                        : "selective (1 layer in " + std::to_string(every) + ")";
  }
};

}  // namespace titan::qwen3

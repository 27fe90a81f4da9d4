#pragma once
// Sizes are checked before anything is allocated: a config.json with 100,000,000 layers, an
// intermediate_size of 2^63-1 or a seq_len of 99,999,999,999 must be an error naming the field
// in milliseconds, not an overflow, a bad_alloc or a kernel OOM kill minutes later.
//  1. Every size field of ModelArgs has an upper bound (far above any published model), checked
//     by ModelArgs::validate() before anything loops over layers or multiplies sizes.
//  2. Within the bounds, parameter counts are computed in 128-bit integers (they cannot overflow
//     there) and narrowed to int64 with a check; a step's bytes are counted by the meta device, which
//     refuses a total past 2^63.
//  3. The memory a run needs is compared with what the machine has before the model is built
//     (train::check_training_fits, from the meta device's profile of the step): a run that
//     cannot fit stops with both numbers.
#include <cstdint>
#include <string>

#include "titan/models/qwen3/args.h"

namespace titan::qwen3 {

// Upper bounds of the size fields: "model args: n_layers = 100000000 exceeds the limit 16384".
void check_size_bounds(const ModelArgs& args);

// `value` narrowed to int64, or an error naming `what` when it does not fit.
int64_t narrow_size(__int128 value, const char* what);

// The memory a run holds, by category (bytes).
struct MemoryNeed {
  int64_t weights = 0;      // f32 master weights (and a bf16 job's bf16 copy of them)
  int64_t grads = 0;        // f32 gradients
  int64_t optimizer = 0;    // AdamW exp_avg + exp_avg_sq (+ other persistent state)
  int64_t activations = 0;  // what the step holds above the persistent state
  int64_t checkpoint_copy = 0;  // checkpoint.async_mode: the state a save in the background writes from
};

// A memory need against `available` bytes: an error naming every number (weights, gradients,
// optimizer, activations, available) when it does not fit. `what` says what the memory is for
// ("training ...", "loading <dir>"), `available_what` where the available figure comes from ("this
// machine's MemAvailable"), `advice` what would shrink the need.
void check_memory_fits(const MemoryNeed& need, int64_t available, const std::string& what,
                       const std::string& available_what, const std::string& advice);

}  // namespace titan::qwen3

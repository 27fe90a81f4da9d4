#pragma once
// The memory and work of one training step, measured by running it: on the `meta` device (no data,
// milliseconds for any model size: the planner behind `titan info --config`) or on a real device
// (what the meta figures are checked against). Every allocation goes through the device's
// services, so the counters see exactly what the step holds; nothing is a formula.
#include <cstdint>

#include "titan/core/device.h"
#include "titan/core/dtype.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

namespace titan::train {

struct StepShape {
  int64_t local_batch = 1;
  int64_t seq_len = 2048;
  int64_t grad_accumulation = 1;
  DType compute = DType::BF16;
  qwen3::Checkpointing checkpointing = qwen3::Checkpointing::None;
  bool expert_bias = false;  // MoE aux-loss-free balancing (one f32 bias per MoE layer)
};

struct StepProfile {
  // Bytes held for the whole run.
  int64_t weights = 0;    // f32 master weights (the flat blocks)
  int64_t grads = 0;      // f32 gradient blocks
  int64_t optimizer = 0;  // AdamW exp_avg + exp_avg_sq
  int64_t other = 0;      // expert bias and other persistent state
  // The most held at once during the step, and the part of it above the persistent state:
  // activations saved for backward, gradients in flight, kernel scratch.
  int64_t peak = 0;
  int64_t activations() const { return peak - persistent(); }
  int64_t persistent() const { return weights + grads + optimizer + other; }
  double flops = 0;      // floating-point operations of the step (meta only; 0 on real devices)
  double seconds = 0;    // wall time of the profile run itself
};

// Builds the model on `device`, allocates the optimizer state, and runs forward + backward over
// `grad_accumulation` micro-batches, the global grad norm and one AdamW update, as the trainer
// does. Token ids are a fixed pattern (the values do not change what is allocated).
StepProfile profile_training_step(const qwen3::ModelArgs& args, const StepShape& shape, Device device);

}  // namespace titan::train

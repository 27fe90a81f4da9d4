#pragma once
// How a Qwen3 model lays its state out in a native checkpoint: every parameter is one f32 tensor
// under its native name ("layers.3.attention.wq.weight"), and any buffer laid out like a block's
// parameters (the AdamW moments) is stored as the same tensors under "<prefix><native name>"
// ("exp_avg.layers.3.attention.wq.weight"). The trainer's single-process checkpoints
// (Checkpointer's save) are written through this function; train/checkpoint_blocks reads them by
// those names.
#include <string>
#include <vector>

#include "titan/io/safetensors.h"
#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

// The tensors of `block_buffers` (one flat f32 buffer per model block, each the size of the
// block) under "<prefix><parameter name>"; views, valid while the buffers live.
std::vector<io::TensorWrite> layout_tensors(const Qwen3Model& model, const std::vector<Tensor>& block_buffers,
                                            const std::string& prefix);

}  // namespace titan::qwen3

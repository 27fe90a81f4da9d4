#pragma once
// A checkpoint's model and optimizer state in block coordinates. Every flat parameter block (the
// embedding, each layer, the head) is cut into `shards` equal slices of its padded buffer;
// model-rank{k} holds slice k of every block ("<block name>", f32 [slice length]) and
// optimizer-rank{k} the moments' slices ("exp_avg.<block name>", "exp_avg_sq.<block name>").
// train_state.json's "layout" records what the files hold:
//   "format": "block-slices" (shards > 1) or "named-parameters" (one file pair holding whole
//             parameters under their native names, as single-process checkpoints always did)
//   "shards": the number of file pairs
//   "blocks": per block its name, "numel" (elements up to the end of its last parameter),
//             "padded" (its buffer's size), "ranges" (element range [begin, end) of each shard file)
//             and "params" (name, shape, offset of every parameter inside the block)
// Any slice [begin, end) of any block can be read back whatever number of shards wrote it, which
// is how a checkpoint of N ranks resumes on M ranks and how `titan export` reads it.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/tensor.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/checkpoint.h"

namespace titan::train {

// The layout of `model`'s blocks cut into `shards` slices, for train_state.json.
nlohmann::json checkpoint_layout(const qwen3::Qwen3Model& model, int64_t shards);

// The tensors of shard `shard` of the layout: `slices[b]` is that shard's slice of block b's
// buffer (values or a moment), written as "<prefix><block name>"; views, valid while they live.
std::vector<io::TensorWrite> block_slice_tensors(const qwen3::Qwen3Model& model, const std::vector<Tensor>& slices,
                                                 const std::string& prefix);

class CheckpointBlocks {
 public:
  // Checks that the checkpoint lays out `model`'s blocks as the model does (names, parameter
  // shapes and offsets), with errors naming the checkpoint and the block. `checkpoint` and `model`
  // must outlive this object.
  CheckpointBlocks(const LoadedCheckpoint& checkpoint, const qwen3::Qwen3Model& model);

  // Fills `out` (contiguous f32) with elements [begin, begin + out.numel()) of block `b`'s buffer:
  // the parameters (prefix "") or a moment ("exp_avg.", "exp_avg_sq."). Elements past the block's
  // parameters (padding) are zero.
  // A non-finite value read is an error naming the parameter (or moment).
  void read(size_t b, const std::string& prefix, int64_t begin, Tensor& out) const;

 private:
  // read() into host memory, unchecked.
  void fill_from_files(size_t b, const std::string& prefix, int64_t begin, int64_t n, float* dst) const;
  const LoadedCheckpoint& checkpoint_;
  const qwen3::Qwen3Model& model_;
  bool named_;  // one file of whole named parameters
  // Named layout: whole block buffers by prefix, assembled on first use.
  mutable std::map<std::string, std::vector<Tensor>> whole_;
};

// Every block of `model` (whole) from the checkpoint's parameters: titan export, initial weights.
void restore_whole_parameters(const LoadedCheckpoint& checkpoint, qwen3::Qwen3Model& model);

}  // namespace titan::train

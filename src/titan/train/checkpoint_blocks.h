#pragma once
// A checkpoint's model and optimizer state, written in block coordinates and read by parameter.
// Every flat parameter block (the embedding, each layer, the head) is cut into `shards` equal
// slices of its padded buffer; model-rank{k} holds slice k of every block ("<block name>", f32
// [slice length]) and optimizer-rank{k} the moments' slices ("exp_avg.<block name>",
// "exp_avg_sq.<block name>"). A model whose experts are split over ranks (qwen3::ExpertSplit, P
// runs) has a block per MoE layer holding its run ("layers.{i}.experts"), cut into shards / P
// slices: shard file k holds slice k / P of run k % P, the slice the rank of shard index k keeps.
// train_state.json's "layout" records what the files hold:
//   "format": "block-slices" (shards > 1) or "named-parameters" (one file pair holding whole
//             parameters under their native names, as single-process checkpoints always did)
//   "shards": the number of file pairs
//   "blocks": per sliced block its name, "numel" (elements up to the end of its last parameter),
//             "padded" (its buffer's size), "ranges" (element range [begin, end) of each shard file)
//             and "params" (name, shape, offset of every parameter inside the block)
//   "expert_blocks" (split models only): per block of experts its name, "padded" (the length of
//             each run's buffer), "runs" (per run, in run order, its slices: the shard "file"
//             holding each and its "range" [begin, end) of the run's buffer) and "params": name,
//             WHOLE shape (every expert), offset inside a run's buffer, and "elements": per run,
//             the range [begin, end) of the whole parameter that run holds from that offset on.
//             (Checkpoints of 2026-12-05 and before give "files" instead of "runs": one shard file
//             per run, holding it whole.)
// The reader goes by parameter: for each parameter of the reading model it finds the elements it
// needs ([first_element, first_element + numel) of the whole parameter) wherever the checkpoint
// holds them (a slice of a block, a run, or a named tensor), so any layout loads into any model
// of the same parameters, split or not, sharded or not: a checkpoint of N ranks resumes on M ranks
// with another expert split, and `titan export` reads it in one process.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/tensor.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/checkpoint.h"

namespace titan::train {

// The layout of `model`'s blocks cut into `shards` slices, for train_state.json (a split model's
// runs of experts as "expert_blocks": each run in shards / runs slices).
nlohmann::json checkpoint_layout(const qwen3::Qwen3Model& model, int64_t shards);

// The tensors of shard file `shard`: `slices[b]` is the writing rank's slice of block b's buffer
// (values or a moment; for a block of experts, its slice of its run), written as
// "<prefix><block name>"; views, valid while they live.
std::vector<io::TensorWrite> block_slice_tensors(const qwen3::Qwen3Model& model, int64_t shard,
                                                 const std::vector<Tensor>& slices,
                                                 const std::string& prefix);

class CheckpointBlocks {
 public:
  // Checks, by parameter, that the checkpoint holds `model`'s state: every parameter of the model
  // is there with its whole shape (an expert parameter's dim 0 times the split count), the
  // checkpoint holds no parameter the model lacks, its files no tensor the layout does not
  // describe, and the files together hold every element of every parameter. Errors name the
  // checkpoint, the parameter (or tensor) and the rule. `checkpoint` and `model` must outlive this
  // object.
  CheckpointBlocks(const LoadedCheckpoint& checkpoint, const qwen3::Qwen3Model& model);

  // Fills `out` (contiguous f32) with elements [begin, begin + out.numel()) of `model`'s block `b`
  // buffer: the parameters (prefix "") or a moment ("exp_avg.", "exp_avg_sq."). Elements past the
  // block's parameters (alignment gaps, padding) are zero.
  // A non-finite value read is an error naming the parameter (or moment).
  void read(size_t b, const std::string& prefix, int64_t begin, Tensor& out) const;
  // An untied model read from a tied checkpoint: its head is read as a copy of the embedding. The
  // weights only: a resume or fork into an untied model is refused before (check_same_model_config,
  // which says how to untie), and reading the head's moments here would be an error too.
  bool head_from_embedding() const { return head_from_embedding_; }

 private:
  // Where the checkpoint holds elements [begin, end) of a parameter: in shard file `file`, tensor
  // "<prefix><tensor>" of shape `tensor_shape`, from its element `at` on.
  struct Piece {
    size_t file = 0;
    std::string tensor;
    Shape tensor_shape;
    int64_t begin = 0, end = 0, at = 0;
  };
  struct SavedParam {
    Shape shape;  // the whole parameter's
    std::vector<Piece> pieces;
  };
  // Elements [begin, begin + n) of the whole parameter `name` (or its moment) into `dst`.
  void read_param(const std::string& name, const std::string& prefix, int64_t begin, int64_t n,
                  float* dst) const;
  const LoadedCheckpoint& checkpoint_;
  const qwen3::Qwen3Model& model_;
  std::map<std::string, SavedParam> saved_;
  bool head_from_embedding_ = false;
};

// Every block of `model` (as this rank keeps it) from the checkpoint's parameters: titan export,
// initial weights.
// Returns what the load did beyond reading each parameter ("lm_head untied: ..."), "" when nothing.
std::string restore_whole_parameters(const LoadedCheckpoint& checkpoint, qwen3::Qwen3Model& model);

}  // namespace titan::train

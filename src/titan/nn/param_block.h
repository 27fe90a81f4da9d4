#pragma once
// Parameters live in flat f32 buffers, one per block (the embedding, each layer,
// the final norm + head). Each parameter is a view into its block's `data`, and
// its gradient a view into the block's `grad`, so FSDP shards, reduce-scatters,
// optimizer updates and checkpoint shards are all slices of one buffer.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/tensor.h"

namespace titan::nn {

enum class Init : uint8_t { Normal, Ones };

struct ParamSpec {
  std::string name;  // fully-qualified native name, e.g. "layers.3.attention.wq.weight"
  Shape shape;
  Init init = Init::Normal;
  double std = 0.02;  // for Init::Normal
  // Element 0 of this parameter is element `first_element` of the whole parameter it is a part of
  // (a rank's share of experts split over ranks): initialisation draws the whole one's values there.
  int64_t first_element = 0;
};

struct Param {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in elements, into the block's buffers
  Init init = Init::Normal;
  double std = 0.02;
  Tensor value;        // view into the block's data; requires grad
  // View into the block's compute copy when it has one (else undefined); requires grad, and its
  // gradient goes to the same f32 slice of the block's grad as value's.
  Tensor compute_value;
  double truncate_at = 0;  // Init::Normal: values beyond +-truncate_at x std are drawn again (0: never)
  // Init::Normal: this row of the [rows, columns] parameter starts at zero (an embedding's
  // padding_idx); -1: none.
  int64_t zero_row = -1;
  int64_t first_element = 0;  // ParamSpec::first_element
  // Set while the gradient slice holds no gradient of this step (AutogradMeta::grad_unwritten,
  // shared with value's and compute_value's autograd state): ParamBlock::zero_grad leaves the slice
  // to the step's first gradient instead of writing zeros over it.
  std::shared_ptr<bool> grad_unwritten;
  // The gradient (value's slice of the block's grad): zeros when none was written since zero_grad.
  Tensor grad() const;
  void settle_grad() const;  // writes those zeros into the slice
};

// The points where a model uses a block's parameters, for a data-parallel plan that keeps blocks
// sharded between uses (ZeRO-3). Blocks are numbered as the model's blocks(). The model calls
// before_forward for every block it is about to compute with, after_forward when a block's forward
// is over, and, through autograd hooks, before_backward / after_backward around the backward of
// each block it reports as a layer (a layer's block of split experts has no points of its own: the
// hooks handle it with its layer's; the embedding and head blocks are used at both ends of the
// step and have no such points: their gradients are complete when the whole backward is).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_forward(size_t block) = 0;
  virtual void after_forward(size_t block) = 0;
  virtual void before_backward(size_t block) = 0;
  virtual void after_backward(size_t block) = 0;
};

// Slice `index` of `count` equal slices of every block: what a sharded data-parallel rank keeps.
struct BlockShard {
  int64_t index = 0, count = 1;
};

class ParamBlock {
 public:
  // With shard.count > 1 the block is born sharded: padded to a multiple of count, holding only its
  // zeroed slice (shard(), shard_grad()); the whole buffers never exist until materialized, so a
  // rank of a large model never holds the whole model, not even at start-up.
  //
  // An untrainable block (inference: generation, evaluation, export) holds no gradient: its
  // parameters do not require one, so autograd records nothing against them, and its gradient
  // buffers never take memory (they stay released).
  ParamBlock(std::string name, const std::vector<ParamSpec>& specs, Device device = Device::CPU,
             BlockShard shard = {}, bool trainable = true);

  const std::string& name() const { return name_; }
  bool trainable() const { return trainable_; }
  Tensor& data() { return data_; }
  // The gradient buffer, every parameter's slice settled (Param::grad).
  Tensor& grad() {
    settle_grads();
    return grad_;
  }
  const Tensor& data() const { return data_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  bool holds(const Param* p) const { return p >= params_.data() && p < params_.data() + params_.size(); }
  // Elements of the buffers: the parameters, their alignment gaps and the padding.
  int64_t numel() const { return data_.numel(); }

  // Grows the buffers (zero-filled) to a multiple of `multiple` elements so that data-parallel
  // shards of the block are equal slices; the parameters keep their offsets. Values and gradients
  // are kept.
  void pad_to_multiple(int64_t multiple);

  // Zeroes the gradient this process accumulates into: shard_grad(), and grad() while resident
  // (nothing for an untrainable block). An unsharded block's grad() is not written: each parameter's
  // slice is marked unwritten (Param::grad_unwritten), its first gradient of the step writes it
  // (a GEMM with beta = 0 instead of a pass of zeros and a beta = 1 read of them), and what no
  // gradient reached is zeroed when read (grad(), shard_grad(), Param::grad()).
  void zero_grad();
  void settle_grads() const;  // zeroes the slices still unwritten

  // Sharded data parallelism. shard(index, count) keeps slice `index` of `count` equal slices
  // (numel() must be a multiple of count) in shard() and shard_grad(), persistent buffers of
  // numel() / count elements, and releases the whole buffers: from then on data() and grad()
  // (which the parameters view) hold bytes only between materialize_*() and release_*(), and
  // what they hold is whatever the caller put there (an all-gather of the shards). Unsharded,
  // shard() is data() and shard_grad() is grad().
  void shard(int64_t index, int64_t count);
  bool sharded() const { return sharded_; }
  int64_t shard_begin() const { return sharded_ ? shard_index_ * shard_.numel() : 0; }  // element of data()
  Tensor& shard() { return sharded_ ? shard_ : data_; }
  Tensor& shard_grad() {
    if (sharded_) return shard_grad_;
    settle_grads();
    return grad_;
  }
  const Tensor& shard() const { return sharded_ ? shard_ : data_; }
  const Tensor& shard_grad() const {
    if (sharded_) return shard_grad_;
    settle_grads();
    return grad_;
  }
  bool data_resident() const { return data_.storage()->resident(); }
  bool grad_resident() const { return grad_.storage()->resident(); }
  void materialize_data() { data_.storage()->materialize(); }
  void release_data() { data_.storage()->release(); }
  void materialize_grad() { grad_.storage()->materialize(); }  // contents undefined
  void release_grad() { grad_.storage()->release(); }

  // Draws every parameter from its init (Param::init, std, truncate_at). Value j of a parameter is
  // a pure function of (seed, parameter name, j) (a counter-based generator: splitmix64 bits,
  // polar-method normals; ops::normal_init), so the values depend neither on block order, threads
  // nor device: they are drawn where the block lives (no host copy for a GPU's block), and a sharded
  // block draws only its own slice, the same bits as that slice of an unsharded block, with no whole
  // buffer made. On meta: nothing.
  void initialize(uint64_t seed);
  // Writes `values` (any float dtype, any device; read as a flat run of elements) into elements
  // [begin, begin + values.numel()) of the block's parameters. Sharded, only the part inside this
  // rank's slice is written (no whole buffer is made): how a Hugging Face load fills a rank.
  void write_elements(int64_t begin, const Tensor& values);

  // A whole-block copy of the parameters in the compute dtype, filled by whoever materializes it
  // (sharded bf16 training all-gathers the layers in bf16 straight into it): the forward and
  // backward read Param::compute_value while it is resident, and its gradients land in grad()
  // in f32. Not resident until materialize_compute().
  void add_compute_copy(DType dtype);
  void remove_compute_copy();  // undoes add_compute_copy: no copy, no compute_value
  bool has_compute_copy() const { return compute_.defined(); }
  Tensor& compute() { return compute_; }
  bool compute_resident() const { return compute_.defined() && compute_.storage()->resident(); }
  void materialize_compute() { compute_.storage()->materialize(); }
  void release_compute() {
    TITAN_CHECK(sharded_ || !keeps_compute_shard_, "ParamBlock '", name_,
                "': its compute copy is kept for the whole run (keep_compute_shard)");
    compute_.storage()->release();
  }

  // Keeps compute_shard(), this rank's slice (shard()) in `dtype`, equal to it for the rest of the
  // block's life, so that no step casts the weights: filled now, rewritten by initialize() and
  // write_elements(), and by the optimizer with every update (ops::adamw_step's compute_copy). An
  // unsharded block's is its compute copy (compute(), resident from now on: the forward and
  // backward read it); a sharded block's is a slice of its own, which the all-gathers send as it
  // is. Whoever writes shard() otherwise calls refresh_compute_shard() (the trainer keeps them
  // once the weights are in place: loaded, initialised or restored).
  void keep_compute_shard(DType dtype);
  bool keeps_compute_shard() const { return keeps_compute_shard_; }
  Tensor& compute_shard() { return sharded_ ? compute_shard_ : compute_; }
  const Tensor& compute_shard() const { return sharded_ ? compute_shard_ : compute_; }
  void refresh_compute_shard();  // compute_shard() = shard(), rounded

 private:
  void bind_views();  // points every parameter's value and gradient into the buffers
  std::string name_;
  Tensor data_, grad_;
  bool trainable_ = true;
  bool sharded_ = false;
  bool keeps_compute_shard_ = false;
  int64_t shard_index_ = 0;
  Tensor shard_, shard_grad_, compute_;
  Tensor compute_shard_;  // sharded and keep_compute_shard: this rank's slice in the compute dtype
  std::vector<Param> params_;
};

}  // namespace titan::nn

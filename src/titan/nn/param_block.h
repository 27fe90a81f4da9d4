#pragma once
// Parameters live in flat f32 buffers, one per block (the embedding, each layer,
// the final norm + head). Each parameter is a view into its block's `data`, and
// its gradient a view into the block's `grad`, so FSDP shards, reduce-scatters,
// optimizer updates and checkpoint shards are all slices of one buffer.
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::nn {

enum class Init : uint8_t { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;  // fully-qualified native name, e.g. "layers.3.attention.wq.weight"
  Shape shape;
  Init init = Init::Normal;
  double std = 0.02;  // for Init::Normal
};

struct Param {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in elements, into the block's buffers
  Init init = Init::Normal;
  double std = 0.02;
  Tensor value;        // view into the block's data; requires grad
};

class ParamBlock {
 public:
  ParamBlock(std::string name, const std::vector<ParamSpec>& specs, Device device = Device::CPU);

  const std::string& name() const { return name_; }
  Tensor& data() { return data_; }
  Tensor& grad() { return grad_; }
  const Tensor& data() const { return data_; }
  const Tensor& grad() const { return grad_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  // Elements of the buffers: the parameters, their alignment gaps and the padding.
  int64_t numel() const { return data_.numel(); }

  // Grows the buffers (zero-filled) to a multiple of `multiple` elements so that data-parallel
  // shards of the block are equal slices; the parameters keep their offsets. Values and gradients
  // are kept.
  void pad_to_multiple(int64_t multiple);

  void zero_grad();

 private:
  void bind_views();  // points every parameter's value and gradient into the buffers
  std::string name_;
  Tensor data_, grad_;
  std::vector<Param> params_;
};

// Draws each parameter from its init. A parameter's stream is seeded from (seed, parameter name),
// so the values do not depend on block order or threads; parameters are drawn in parallel.
void initialize_params(const std::vector<Param*>& params, uint64_t seed);

}  // namespace titan::nn

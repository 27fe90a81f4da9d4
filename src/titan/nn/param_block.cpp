#include "titan/nn/param_block.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan::nn {

ParamBlock::ParamBlock(std::string name, const std::vector<ParamSpec>& specs, Device device, BlockShard shard,
                       bool trainable)
    : name_(std::move(name)), trainable_(trainable) {
  int64_t total = 0;
  for (auto& s : specs) {
    // Keep every parameter 64-byte aligned inside the buffer (vector loads, shard boundaries).
    total = (total + 15) / 16 * 16;
    Param& p = params_.emplace_back();
    p.name = s.name, p.shape = s.shape, p.offset = total, p.init = s.init, p.std = s.std;
    p.first_element = s.first_element;
    total += shape_numel(s.shape);
  }
  TITAN_CHECK(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, "ParamBlock '", name_,
              "': slice ", shard.index, " of ", shard.count, " does not exist");
  if (shard.count == 1) {
    data_ = Tensor::zeros({total}, DType::F32, device);
    grad_ = trainable ? Tensor::zeros({total}, DType::F32, device)
                      : Tensor::released({total}, DType::F32, device);
    bind_views();
    return;
  }
  const int64_t padded = (total + shard.count - 1) / shard.count * shard.count;
  data_ = Tensor::released({padded}, DType::F32, device);
  grad_ = Tensor::released({padded}, DType::F32, device);
  bind_views();
  shard_ = Tensor::zeros({padded / shard.count}, DType::F32, device);
  shard_grad_ = trainable ? Tensor::zeros({padded / shard.count}, DType::F32, device)
                          : Tensor::released({padded / shard.count}, DType::F32, device);
  shard_index_ = shard.index;
  sharded_ = true;
}

void ParamBlock::write_elements(int64_t begin, const Tensor& values) {
  const int64_t n = values.numel();
  TITAN_CHECK(begin >= 0 && begin + n <= numel(), "ParamBlock '", name_, "': elements [", begin, ", ", begin + n,
              ") are outside its ", numel());
  const Tensor flat = values.reshape({n});
  const int64_t lo = std::max(begin, shard_begin()),
                hi = std::min(begin + n, shard_begin() + shard().numel());
  if (lo >= hi) return;
  shard().narrow(0, lo - shard_begin(), hi - lo).copy_from(flat.narrow(0, lo - begin, hi - lo));
  if (keeps_compute_shard_)
    compute_shard()
        .narrow(0, lo - shard_begin(), hi - lo)
        .copy_from(shard().narrow(0, lo - shard_begin(), hi - lo));
}

void ParamBlock::bind_views() {
  for (auto& p : params_) {
    int64_t n = shape_numel(p.shape);
    p.value = data_.narrow(0, p.offset, n).reshape(p.shape);
    if (!trainable_) continue;
    p.value.set_requires_grad(true);
    p.value.autograd_meta()->name = p.name;
    p.value.set_grad(grad_.narrow(0, p.offset, n).reshape(p.shape));
    if (!p.grad_unwritten) p.grad_unwritten = std::make_shared<bool>(false);
    p.value.autograd_meta()->grad_unwritten = p.grad_unwritten;
  }
}

void ParamBlock::pad_to_multiple(int64_t multiple) {
  TITAN_CHECK(multiple >= 1, "ParamBlock '", name_, "': padding multiple must be >= 1, got ", multiple);
  const int64_t n = data_.numel(), padded = (n + multiple - 1) / multiple * multiple;
  if (padded == n) return;  // e.g. a block born sharded over `multiple` ranks
  // A compute copy's views (and the gradients they hand on) would stay on the old buffers.
  TITAN_CHECK(!sharded_ && !keeps_compute_shard_ && !has_compute_copy(), "ParamBlock '", name_,
              "': cannot pad a sharded block or one with a compute copy");
  Tensor data = Tensor::zeros({padded}, DType::F32, data_.device());
  Tensor grad = trainable_ ? Tensor::zeros({padded}, DType::F32, grad_.device())
                           : Tensor::released({padded}, DType::F32, grad_.device());
  data.narrow(0, 0, n).copy_from(data_);
  if (trainable_) grad.narrow(0, 0, n).copy_from(grad_);
  data_ = data;
  grad_ = grad;
  bind_views();
}

void ParamBlock::zero_grad() {
  if (!trainable_) return;
  if (sharded_) {
    shard_grad_.fill(0.0);
    if (grad_resident()) grad_.fill(0.0);
    return;
  }
  // The gaps between parameters and the padding are zero from the start, and nothing writes them.
  for (Param& p : params_) *p.grad_unwritten = true;
}

void ParamBlock::settle_grads() const {
  for (const Param& p : params_) p.settle_grad();
}

void Param::settle_grad() const {
  value.grad();
}  // Tensor::grad() zeroes an unwritten buffer

Tensor Param::grad() const {
  return value.grad();
}

void ParamBlock::add_compute_copy(DType dtype) {
  TITAN_CHECK(!compute_.defined(), "ParamBlock '", name_, "' already has a compute copy");
  compute_ = Tensor::empty({numel()}, dtype, data_.device());
  for (auto& p : params_) {
    const int64_t n = shape_numel(p.shape);
    p.compute_value = compute_.narrow(0, p.offset, n).reshape(p.shape);
    if (!trainable_) continue;
    p.compute_value.set_requires_grad(true);
    p.compute_value.autograd_meta()->name = p.name;
    p.compute_value.set_grad(grad_.narrow(0, p.offset, n).reshape(p.shape));
    p.compute_value.autograd_meta()->grad_unwritten = p.grad_unwritten;
  }
  release_compute();
}

void ParamBlock::remove_compute_copy() {
  TITAN_CHECK(!keeps_compute_shard_, "ParamBlock '", name_,
              "': its compute copy is kept for the whole run (keep_compute_shard)");
  compute_ = Tensor();
  for (auto& p : params_) p.compute_value = Tensor();
}

void ParamBlock::keep_compute_shard(DType dtype) {
  TITAN_CHECK(!keeps_compute_shard_, "ParamBlock '", name_, "' keeps a compute copy already");
  TITAN_CHECK(dtype != data_.dtype(), "ParamBlock '", name_, "': a compute copy in ", dtype_name(dtype),
              ", the dtype of the weights themselves, would copy them for nothing");
  if (!has_compute_copy()) add_compute_copy(dtype);
  TITAN_CHECK(compute_.dtype() == dtype, "ParamBlock '", name_, "' has a compute copy in ",
              dtype_name(compute_.dtype()), ", not ", dtype_name(dtype));
  if (sharded_)
    compute_shard_ = Tensor::empty({shard_.numel()}, dtype, shard_.device());
  else
    materialize_compute();
  keeps_compute_shard_ = true;
  refresh_compute_shard();
}

void ParamBlock::refresh_compute_shard() {
  TITAN_CHECK(keeps_compute_shard_, "ParamBlock '", name_, "' keeps no compute copy (keep_compute_shard)");
  compute_shard().copy_from(shard());
}

void ParamBlock::shard(int64_t index, int64_t count) {
  TITAN_CHECK(!sharded_, "ParamBlock '", name_, "' is already sharded");
  TITAN_CHECK(!keeps_compute_shard_, "ParamBlock '", name_,
              "' keeps a compute copy of its whole buffer: shard it before keep_compute_shard");
  TITAN_CHECK(count >= 1 && index >= 0 && index < count && numel() % count == 0, "ParamBlock '", name_, "' of ",
              numel(), " elements cannot be cut into ", count, " equal slices (slice ", index, ")");
  const int64_t n = numel() / count;
  settle_grads();  // a sharded block's gradients are never left unwritten (zero_grad fills them)
  shard_ = data_.narrow(0, index * n, n).clone();
  shard_grad_ =
      trainable_ ? grad_.narrow(0, index * n, n).clone() : Tensor::released({n}, DType::F32, grad_.device());
  shard_index_ = index;
  sharded_ = true;
  release_data();
  release_grad();
}

void ParamBlock::initialize(uint64_t seed) {
  Tensor& target = shard();  // the whole buffer, or this rank's slice of it
  if (target.device() == Device::Meta) return;

  // Drawn where the block lives (ops::normal_init): no host copy of a GPU's weights.
  const int64_t lo = shard_begin(), hi = lo + target.numel();
  auto fill = [&](int64_t begin, int64_t end, double value) {
    if (end > begin) target.narrow(0, begin - lo, end - begin).fill(value);
  };
  // Parameters in offset order; the alignment gaps and the padding between them are zero.
  int64_t done = lo;
  for (const Param& p : params_) {
    const int64_t begin = std::max(lo, p.offset), end = std::min(hi, p.offset + shape_numel(p.shape));
    if (begin >= end) continue;
    fill(done, begin, 0.0);
    done = end;
    if (p.init == Init::Ones) {
      fill(begin, end, 1.0);
      continue;
    }
    TITAN_CHECK(p.truncate_at == 0 || p.truncate_at >= 1, "ParamBlock::initialize: '", p.name,
                "' is truncated at ", p.truncate_at,
                " std; a truncation must be at least 1 std (or 0: none)");
    // Each parameter its own stream, from the seed and an FNV-1a of its name (stable across standard
    // libraries, unlike std::hash).
    const uint64_t stream = ops::init_draw::mix64(seed ^ ops::init_draw::mix64(fnv1a(p.name)));
    Tensor slice = target.narrow(0, begin - lo, end - begin);
    ops::normal_init(slice, stream, p.std, p.truncate_at * p.std, begin - p.offset + p.first_element);
    if (p.zero_row >= 0) {
      TITAN_CHECK(p.shape.size() == 2 && p.zero_row < p.shape[0] && p.first_element == 0,
                  "ParamBlock::initialize: '", p.name, "' has no row ", p.zero_row, " to zero (shape ",
                  shape_str(p.shape), ")");
      const int64_t row_begin = p.offset + p.zero_row * p.shape[1];
      fill(std::max(begin, row_begin), std::min(end, row_begin + p.shape[1]), 0.0);
    }
  }
  fill(done, hi, 0.0);
  if (keeps_compute_shard_) refresh_compute_shard();
}

}  // namespace titan::nn

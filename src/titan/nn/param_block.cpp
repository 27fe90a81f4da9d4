#include "titan/nn/param_block.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"

namespace titan::nn {

ParamBlock::ParamBlock(std::string name, const std::vector<ParamSpec>& specs, Device device, BlockShard shard)
    : name_(std::move(name)) {
  int64_t total = 0;
  for (auto& s : specs) {
    // Keep every parameter 64-byte aligned inside the buffer (vector loads, shard boundaries).
    total = (total + 15) / 16 * 16;
    Param& p = params_.emplace_back();
    p.name = s.name, p.shape = s.shape, p.offset = total, p.init = s.init, p.std = s.std;
    total += shape_numel(s.shape);
  }
  if (shard.count <= 1) {
    data_ = Tensor::zeros({total}, DType::F32, device);
    grad_ = Tensor::zeros({total}, DType::F32, device);
    bind_views();
    return;
  }
  TITAN_CHECK(shard.index >= 0 && shard.index < shard.count, "ParamBlock '", name_, "': slice ", shard.index,
              " of ", shard.count, " does not exist");
  const int64_t padded = (total + shard.count - 1) / shard.count * shard.count;
  data_ = Tensor::released({padded}, DType::F32, device);
  grad_ = Tensor::released({padded}, DType::F32, device);
  bind_views();
  shard_ = Tensor::zeros({padded / shard.count}, DType::F32, device);
  shard_grad_ = Tensor::zeros({padded / shard.count}, DType::F32, device);
  shard_index_ = shard.index;
  sharded_ = true;
}

void ParamBlock::fill_whole(const std::function<void()>& fill) {
  if (!sharded_) return fill();
  materialize_data();
  data_.fill(0.0);  // the alignment gaps and the padding stay zero
  fill();
  shard_.copy_from(data_.narrow(0, shard_begin(), shard_.numel()));
  release_data();
}

void ParamBlock::write_elements(int64_t begin, const Tensor& values) {
  const int64_t n = values.numel();
  TITAN_CHECK(begin >= 0 && begin + n <= numel(), "ParamBlock '", name_, "': elements [", begin, ", ", begin + n,
              ") are outside its ", numel());
  const Tensor flat = values.reshape({n});
  if (!sharded_) return data_.narrow(0, begin, n).copy_from(flat);
  const int64_t lo = std::max(begin, shard_begin()), hi = std::min(begin + n, shard_begin() + shard_.numel());
  if (lo < hi) shard_.narrow(0, lo - shard_begin(), hi - lo).copy_from(flat.narrow(0, lo - begin, hi - lo));
}

void ParamBlock::bind_views() {
  for (auto& p : params_) {
    int64_t n = shape_numel(p.shape);
    p.value = data_.narrow(0, p.offset, n).reshape(p.shape);
    p.value.set_requires_grad(true);
    p.value.autograd_meta()->name = p.name;
    p.value.set_grad(grad_.narrow(0, p.offset, n).reshape(p.shape));
  }
}

void ParamBlock::pad_to_multiple(int64_t multiple) {
  TITAN_CHECK(multiple >= 1, "ParamBlock '", name_, "': padding multiple must be >= 1, got ", multiple);
  const int64_t n = data_.numel(), padded = (n + multiple - 1) / multiple * multiple;
  if (padded == n) return;  // e.g. a block born sharded over `multiple` ranks
  TITAN_CHECK(!sharded_, "ParamBlock '", name_, "': cannot pad a sharded block");
  Tensor data = Tensor::zeros({padded}, DType::F32, data_.device());
  Tensor grad = Tensor::zeros({padded}, DType::F32, grad_.device());
  data.narrow(0, 0, n).copy_from(data_);
  grad.narrow(0, 0, n).copy_from(grad_);
  data_ = data;
  grad_ = grad;
  bind_views();
}

void ParamBlock::zero_grad() {
  if (sharded_) shard_grad_.fill(0.0);
  if (grad_resident()) grad_.fill(0.0);
}

void ParamBlock::add_compute_copy(DType dtype) {
  TITAN_CHECK(!compute_.defined(), "ParamBlock '", name_, "' already has a compute copy");
  compute_ = Tensor::empty({numel()}, dtype, data_.device());
  for (auto& p : params_) {
    const int64_t n = shape_numel(p.shape);
    p.compute_value = compute_.narrow(0, p.offset, n).reshape(p.shape);
    p.compute_value.set_requires_grad(true);
    p.compute_value.autograd_meta()->name = p.name;
    p.compute_value.set_grad(grad_.narrow(0, p.offset, n).reshape(p.shape));
  }
  release_compute();
}

void ParamBlock::shard(int64_t index, int64_t count) {
  TITAN_CHECK(!sharded_, "ParamBlock '", name_, "' is already sharded");
  TITAN_CHECK(count >= 1 && index >= 0 && index < count && numel() % count == 0, "ParamBlock '", name_, "' of ",
              numel(), " elements cannot be cut into ", count, " equal slices (slice ", index, ")");
  const int64_t n = numel() / count;
  shard_ = data_.narrow(0, index * n, n).clone();
  shard_grad_ = grad_.narrow(0, index * n, n).clone();
  shard_index_ = index;
  sharded_ = true;
  release_data();
  release_grad();
}

void initialize_params(const std::vector<Param*>& params, uint64_t seed) {
  // Largest first: one normal stream per parameter is sequential, so the big ones set the pace.
  std::vector<Param*> order(params);
  std::stable_sort(order.begin(), order.end(),
                   [](const Param* a, const Param* b) { return a->value.numel() > b->value.numel(); });
  // Values are drawn on the host; parameters on another device get a copy (none on meta: there
  // is nothing to hold them).
  if (!order.empty() && order[0]->value.device() == Device::Meta) return;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < order.size(); ++i) {
    Param& p = *order[i];
    const bool on_host = p.value.device() == Device::CPU;
    Tensor host = on_host ? p.value : Tensor::empty(p.value.shape(), DType::F32);
    float* v = host.data<float>();
    const int64_t n = p.value.numel();
    if (p.init == Init::Ones) {
      std::fill(v, v + n, 1.0f);
    } else {
      // FNV-1a of the name: stable across standard libraries, unlike std::hash.
      const uint64_t h = fnv1a(p.name);
      std::seed_seq seq{seed, h};
      std::mt19937_64 rng(seq);
      std::normal_distribution<double> normal(0.0, p.std);
      const double bound =
          p.truncate_at * p.std;  // a truncated normal by rejection (torch's trunc_normal_ distribution)
      for (int64_t j = 0; j < n; ++j) {
        double x = normal(rng);
        while (bound > 0 && std::abs(double(float(x))) > bound) x = normal(rng);  // as stored
        v[j] = float(x);
      }
    }
    if (!on_host) p.value.copy_from(host);
  }
}

}  // namespace titan::nn

#include "titan/nn/param_block.h"

#include <algorithm>
#include <cstring>
#include <cmath>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/core/hash.h"

namespace titan::nn {

ParamBlock::ParamBlock(std::string name, const std::vector<ParamSpec>& specs, Device device)
    : name_(std::move(name)) {
  int64_t total = 0;
  for (auto& s : specs) {
    // Keep every parameter 64-byte aligned inside the buffer (vector loads, shard boundaries).
    total = (total + 15) / 16 * 16;
    params_.push_back({s.name, s.shape, total, s.init, s.std, Tensor()});
    total += shape_numel(s.shape);
  }
  data_ = Tensor::zeros({total}, DType::F32, device);
  grad_ = Tensor::zeros({total}, DType::F32, device);
  bind_views();
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
  TITAN_CHECK(!sharded_, "ParamBlock '", name_, "': cannot pad a sharded block");
  const int64_t n = data_.numel(), padded = (n + multiple - 1) / multiple * multiple;
  if (padded == n) return;
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
  sharded_ = true;
  release_data();
  release_grad();
}

namespace {

// SplitMix64's output function: a bijective mix of 64 bits whose outputs over a counter pass
// BigCrush (Steele et al., "Fast splittable pseudorandom number generators", 2014).
inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Elements [begin, end) of a parameter drawn from N(0, std): element pair p (elements 2p, 2p + 1)
// is Box-Muller in f32 on two 24-bit uniforms from mix64(key + (p + 1) * golden), so every element
// is computed on its own: the values depend on neither the thread count nor how the work is cut.
// (u1 >= 2^-25 bounds the draws at 5.9 std: a tail of probability 3e-8 is cut, irrelevant to an
// initialisation.)
void fill_normal(float* out, int64_t begin, int64_t end, uint64_t key, double std) {
  constexpr float kTwoPi = 6.2831853f, k2m24 = 1.0f / 16777216.0f;
  const float sd = float(std);
  for (int64_t pair = begin / 2; 2 * pair < end; ++pair) {
    const uint64_t r = mix64(key + uint64_t(pair + 1) * 0x9e3779b97f4a7c15ull);
    const float u1 = (float(r >> 40) + 0.5f) * k2m24, u2 = float((r >> 8) & 0xffffffu) * k2m24;
    const float radius = sd * std::sqrt(-2.0f * std::log(u1));
    float s, c;
    sincosf(kTwoPi * u2, &s, &c);
    if (2 * pair >= begin) out[2 * pair - begin] = radius * c;
    if (2 * pair + 1 < end) out[2 * pair + 1 - begin] = radius * s;
  }
}

}  // namespace

void initialize_params(const std::vector<Param*>& params, uint64_t seed) {
  // Values are drawn on the host; parameters on another device get a copy (none on meta: there
  // is nothing to hold them).
  if (params.empty() || params[0]->value.device() == Device::Meta) return;
  // The work cut in chunks of every parameter, drawn in parallel.
  constexpr int64_t kChunk = int64_t(1) << 16;
  struct Chunk {
    size_t param;  // index into params
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  std::vector<Tensor> host(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = *params[i];
    host[i] = p.value.device() == Device::CPU ? p.value : Tensor::empty(p.value.shape(), DType::F32);
    const int64_t n = p.value.numel();
    for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({i, b, std::min(n, b + kChunk)});
  }
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& k = chunks[c];
    const Param& p = *params[k.param];
    float* v = host[k.param].data<float>() + k.begin;
    const int64_t n = k.end - k.begin;
    if (p.init == Init::Ones) std::fill(v, v + n, 1.0f);
    else if (p.init == Init::Zeros) std::memset(v, 0, size_t(n) * 4);
    // The key: FNV-1a of the name (stable across standard libraries, unlike std::hash) and the seed.
    else fill_normal(v, k.begin, k.end, mix64(fnv1a(p.name) ^ mix64(seed)), p.std);
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i]->value.device() != Device::CPU) params[i]->value.copy_from(host[i]);
}

}  // namespace titan::nn

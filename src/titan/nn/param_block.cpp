#include "titan/nn/param_block.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

namespace {

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush for consecutive
// inputs (it is SplittableRandom's generator); here it turns a counter into random bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform in (-1, 1): 53 random bits as a signed fraction.
double signed_unit(uint64_t bits) {
  return double(int64_t(bits) >> 10) * 0x1.0p-53;
}

// Random bits number `counter` of a stream (SplittableRandom's sequence: mix64 of a Weyl sequence).
uint64_t stream_bits(uint64_t stream, uint64_t counter) {
  return mix64(stream + counter * 0x9e3779b97f4a7c15ull);
}

// Normal pair number `pair` of a parameter's stream, from its first usable attempt at or after
// `attempt` (advanced to it): Marsaglia's polar method on two uniforms that are each a pure
// function of (stream, pair, attempt), so any element can be drawn without drawing the ones
// before it. No trigonometry: 15 ns a value on one thread where Box-Muller took 25. A point
// outside the unit disc (21 %) moves on to the next attempt; 8 bits of attempts are more than
// any draw needs (0.21^256 of them all outside), and would give 0.
std::pair<double, double> normal_pair(uint64_t stream, uint64_t pair, uint64_t& attempt) {
  for (; attempt < 256; ++attempt) {
    const uint64_t counter = (pair << 8 | attempt) * 2;
    const double x = signed_unit(stream_bits(stream, counter)),
                 y = signed_unit(stream_bits(stream, counter + 1));
    const double s = x * x + y * y;
    if (s < 1 && s > 0) {
      const double f = std::sqrt(-2.0 * std::log(s) / s);
      return {x * f, y * f};
    }
  }
  return {0.0, 0.0};
}

// Elements [begin, end) of a parameter drawn from N(0, std) into out[0, end - begin). Element j is
// the (j % 2)-th normal of pair j / 2. Truncated at +-bound as stored when bound > 0 (torch's
// trunc_normal_ distribution): an element outside is redrawn from its pair's next attempt, its
// partner keeping its own draw (the two normals of a pair are independent).
void draw_normal(uint64_t stream, double std, double bound, int64_t begin, int64_t end, float* out) {
  auto accept = [&](double z) { return bound <= 0 || std::abs(double(float(z * std))) <= bound; };
  for (int64_t j = begin; j < end;) {
    const uint64_t pair = uint64_t(j) / 2;
    uint64_t first = 0;
    const auto [z0, z1] = normal_pair(stream, pair, first);
    for (int k = int(j % 2); k < 2 && j < end; ++k, ++j) {
      double z = k ? z1 : z0;
      for (uint64_t attempt = first + 1; !accept(z) && attempt < 256; ++attempt) {
        const auto redraw = normal_pair(stream, pair, attempt);
        z = k ? redraw.second : redraw.first;
      }
      out[j - begin] = accept(z) ? float(z * std) : 0.0f;
    }
  }
}

// Elements [begin, end) of parameter p's init into out[0, end - begin), in parallel chunks.
void draw_param(const Param& p, uint64_t seed, int64_t begin, int64_t end, float* out) {
  if (p.init == Init::Ones) return std::fill(out, out + (end - begin), 1.0f);
  // A bound of at least 1 std keeps the redraws few (32 % outside at 1 std).
  TITAN_CHECK(p.truncate_at == 0 || p.truncate_at >= 1, "ParamBlock::initialize: '", p.name,
              "' is truncated at ", p.truncate_at, " std; a truncation must be at least 1 std (or 0: none)");
  // FNV-1a of the name: stable across standard libraries, unlike std::hash.
  const uint64_t stream = mix64(seed ^ mix64(fnv1a(p.name)));
  const double bound = p.truncate_at * p.std;
  // Chunks of 64 Ki elements over every thread: the largest parameter (a 0.6B model's
  // 155M-element embedding) no longer sets the pace alone.
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t first = begin / kChunk, last = (end - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (last > first)
  for (int64_t c = first; c <= last; ++c) {
    const int64_t b = std::max(begin, c * kChunk), e = std::min(end, (c + 1) * kChunk);
    draw_normal(stream, p.std, bound, b, e, out + (b - begin));
  }
}

}  // namespace

void ParamBlock::initialize(uint64_t seed) {
  Tensor& target = shard();  // the whole buffer, or this rank's slice of it
  if (target.device() == Device::Meta) return;
  // Values are drawn on the host; a buffer on another device gets one copy.
  const bool on_host = target.device() == Device::CPU;
  Tensor host = on_host ? target : Tensor::empty({target.numel()}, DType::F32);
  float* out = host.data<float>();
  const int64_t lo = shard_begin(), hi = lo + target.numel();
  // Parameters in offset order; the alignment gaps and the padding between them are zero.
  int64_t done = lo;
  for (const Param& p : params_) {
    const int64_t begin = std::max(lo, p.offset), end = std::min(hi, p.offset + shape_numel(p.shape));
    if (begin >= end) continue;
    std::fill(out + (done - lo), out + (begin - lo), 0.0f);
    draw_param(p, seed, begin - p.offset, end - p.offset, out + (begin - lo));
    done = end;
  }
  std::fill(out + (done - lo), out + (hi - lo), 0.0f);
  if (!on_host) target.copy_from(host);
}

}  // namespace titan::nn

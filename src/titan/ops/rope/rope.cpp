#include "titan/ops/rope/rope.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/activation_grads.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan::ops {

namespace {

// Largest position a table is built for: bounds the table (2^21 rows * D/2 * 8 bytes) so that a
// garbage position is an error instead of a huge allocation. The reference has no such limit.
constexpr int64_t kMaxTablePositions = int64_t(1) << 21;

}  // namespace

// cos/sin of position p, frequency j, as transformers computes them in f32 (and in f64 for f64).
void rope_cos_sin(double theta, int64_t D, int64_t p, int64_t j, float* c, float* s) {
  const float inv_freq = 1.0f / std::pow(float(theta), float(2 * j) / float(D));
  const float angle = float(p) * inv_freq;
  *c = std::cos(angle);
  *s = std::sin(angle);
}
void rope_cos_sin(double theta, int64_t D, int64_t p, int64_t j, double* c, double* s) {
  const double angle = double(p) / std::pow(theta, double(2 * j) / double(D));
  *c = std::cos(angle);
  *s = std::sin(angle);
}

std::shared_ptr<const RopeTable> rope_table(double theta, int64_t D, int64_t positions) {
  TITAN_CHECK(D > 0 && D % 2 == 0, "rope_table: head dim ", D, " must be positive and even");
  TITAN_CHECK(theta > 0 && std::isfinite(theta), "rope_table: theta ", theta, " must be finite and > 0");
  TITAN_CHECK(positions >= 0 && positions <= kMaxTablePositions, "rope_table: ", positions,
              " positions requested; tables cover at most ", kMaxTablePositions);
  static std::mutex mu;
  static std::map<std::pair<double, int64_t>, std::shared_ptr<const RopeTable>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{theta, D}];
  if (slot && slot->positions >= positions) return slot;
  // Grow geometrically (at least 4096 rows) so that increasing lengths rebuild rarely; rows
  // already computed are copied, they do not depend on the table length.
  const int64_t old = slot ? slot->positions : 0;
  const int64_t rows = std::min(kMaxTablePositions, std::max({positions, 2 * old, int64_t(4096)}));
  const int64_t half = D / 2;
  auto t = std::make_shared<RopeTable>();
  t->theta = theta;
  t->D = D;
  t->positions = rows;
  t->cos.resize(size_t(rows * half));
  t->sin.resize(size_t(rows * half));
  if (slot) {
    std::copy(slot->cos.begin(), slot->cos.end(), t->cos.begin());
    std::copy(slot->sin.begin(), slot->sin.end(), t->sin.begin());
  }
#pragma omp parallel for schedule(static) if ((rows - old) * half > 65536)
  for (int64_t p = old; p < rows; ++p)
    for (int64_t j = 0; j < half; ++j)
      rope_cos_sin(theta, D, p, j, &t->cos[size_t(p * half + j)], &t->sin[size_t(p * half + j)]);
  slot = t;
  return slot;
}

RopePositions RopePositions::checked(const Tensor& positions, int64_t B, int64_t S, const std::string& what) {
  TITAN_CHECK(positions.dtype() == DType::I64, "rope: positions must be i64, got ", positions.str());
  TITAN_CHECK((positions.dim() == 1 && positions.size(0) == S) ||
                  (positions.dim() == 2 && positions.size(0) == B && positions.size(1) == S),
              "rope: positions ", positions.str(), " must be [S] or [B, S] for ", what);
  // A copy of its own either way: the caller's tensor may change after the check.
  Tensor pos = positions.dim() == 1 ? positions.contiguous().reshape({1, S}).expand({B, S}).contiguous()
                                    : positions.contiguous().clone();
  if (pos.numel() == 0) return RopePositions(pos, 0);
  const int64_t bad = first_index_outside(pos, 0, INT64_MAX, /*allowed=*/0);
  if (bad >= 0)
    TITAN_FAIL("rope: positions ", positions.str(), " hold ",
               int64_t(pos.reshape({-1}).narrow(0, bad, 1).item()), " at flat index ", bad,
               "; positions must be >= 0");
  const int64_t max = max_index(pos);
  return RopePositions(pos, max);
}

RopePositions rope_positions(const Tensor& positions, int64_t B, int64_t S) {
  return RopePositions::checked(positions, B, S, "B=" + std::to_string(B) + ", S=" + std::to_string(S));
}

RopePositions sequential_positions(int64_t B, int64_t S, Device device, int64_t first,
                                   std::span<const int64_t> left_padding) {
  TITAN_CHECK(B >= 0 && S >= 0 && first >= 0,
              "rope: sequential positions need B >= 0, S >= 0 and first >= 0, got B=", B, ", S=", S,
              ", first=", first);
  TITAN_CHECK(left_padding.empty() || int64_t(left_padding.size()) == B, "rope: ", left_padding.size(),
              " left-padding counts for ", B, " rows");
  auto pad = [&](int64_t b) { return left_padding.empty() ? 0 : left_padding[size_t(b)]; };
  int64_t max = 0;
  for (int64_t b = 0; b < B && S > 0; ++b) {
    TITAN_CHECK(pad(b) >= 0, "rope: row ", b, "'s left padding ", pad(b), " is negative");
    max = std::max(max, first + S - 1 - pad(b));
  }
  Tensor pos = Tensor::empty({B, S}, DType::I64, device);
  if (device != Device::Meta && B * S > 0) {
    Tensor host = device == Device::CPU ? pos : Tensor::empty({B, S}, DType::I64);
    int64_t* p = host.data<int64_t>();
    for (int64_t i = 0; i < B * S; ++i) p[i] = std::max<int64_t>(first + i % S - pad(i / S), 0);
    if (device != Device::CPU) pos.copy_from(host);
  }
  return RopePositions(pos, max);
}

Tensor rope(const Tensor& x_in, const Tensor& positions, double theta) {
  TITAN_CHECK(x_in.dim() == 4, "rope: expected x [B, S, H, D], got ", x_in.str());
  return rope(x_in, RopePositions::checked(positions, x_in.size(0), x_in.size(1), "x " + x_in.str()), theta);
}

Tensor rope(const Tensor& x_in, const RopePositions& positions, double theta) {
  TITAN_CHECK(x_in.dim() == 4, "rope: expected x [B, S, H, D], got ", x_in.str());
  const int64_t B = x_in.size(0), S = x_in.size(1), H = x_in.size(2), D = x_in.size(3);
  TITAN_CHECK(D % 2 == 0, "rope: head dim D=", D, " of x ", x_in.str(), " must be even");
  TITAN_CHECK(dtype_is_float(x_in.dtype()), "rope: x must be floating point, got ", x_in.str());
  const Tensor& pos = positions.tensor();
  TITAN_CHECK(pos.dim() == 2 && pos.size(0) == B && pos.size(1) == S, "rope: positions ", pos.str(),
              " were made for another shape than x ", x_in.str());
  TITAN_CHECK(theta > 0 && std::isfinite(theta), "rope: theta ", theta, " must be finite and > 0");
  Tensor x = x_in.contiguous().detach();
  const auto& kernel = kernels::kernel_for<RopeKernel>("rope", x.device(), x.dtype());
  const KernelContext ctx = device_services(x.device()).context();
  std::shared_ptr<const RopeTable> table;
  if (kernel.needs_table) {
    table = rope_table(theta, D, positions.max() + 1);  // host cos/sin rows the CPU kernels gather
  } else {
    auto t = std::make_shared<RopeTable>();
    t->theta = theta;
    t->D = D;
    table = t;
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernel.forward(ctx, B, S, H, D, pos.data<int64_t>(), *table, x.raw_data(), y.raw_data());
  if (autograd::needs_grad({&x_in})) {
    const DType gd = grad_dtype(x.dtype());
    const Shape shape = x.shape();
    const ActivationGrads act(x, kernel.backward_bf16_grads != nullptr);
    autograd::record(
        "rope", {x_in}, {&y},
        [=, &kernel](const std::vector<Tensor>& g) {
          if (!g[0].defined()) return std::vector<Tensor>{act.returned(Tensor::zeros(shape, gd, x.device()))};
          Tensor dy = act.upstream(g[0]);
          Tensor dx = Tensor::empty(shape, act.kernel_dtype(), x.device());
          (act.native() ? kernel.backward_bf16_grads : kernel.backward)(ctx, B, S, H, D, pos.data<int64_t>(),
                                                                        *table, dy.raw_data(), dx.raw_data());
          return std::vector<Tensor>{act.returned(dx)};
        },
        act.bf16());
  }
  return y;
}

}  // namespace titan::ops
